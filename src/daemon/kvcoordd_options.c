/*
 * kvcoordd_options.c - kvcoordd's command line from the rows of
 * options_table.c: the defaults, the getopt_long array, the parsing with
 * each row's range, and --help.  Every wrong value gets one message naming
 * the option and the range accepted (and where a range comes from), and
 * options that cannot work together are refused with the reason, rather
 * than failing every request later.
 */
#include "kvcoordd_options.h"

#include <getopt.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "options_table.h"
#include "query.h"

#define HELP_COLUMN 25 /* where an option's text starts in --help */
#define HELP_WIDTH 79  /* --help's lines end before this column */

static int usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Print "kvcoordd: <message>" and the hint; returns exit status 2. */
static int usage_error(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "kvcoordd: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\nTry 'kvcoordd --help' for more information.\n");
    va_end(ap);
    return 2;
}

/* Bytes with an optional K/M/G (KiB/MiB/GiB) suffix. */
static int parse_size(const char *s, uint64_t *out)
{
    char digits[32];
    size_t n = strspn(s, "0123456789");
    if (n == 0 || n >= sizeof digits)
        return -1;
    memcpy(digits, s, n);
    digits[n] = '\0';
    uint64_t v, mult = 1;
    const char *suf = s + n;
    if (*suf) {
        switch (*suf) {
        case 'k':
        case 'K': mult = 1ull << 10; break;
        case 'm':
        case 'M': mult = 1ull << 20; break;
        case 'g':
        case 'G': mult = 1ull << 30; break;
        default: return -1;
        }
        suf++;
        if (*suf && strcasecmp(suf, "iB") != 0 && strcasecmp(suf, "B") != 0)
            return -1;
    }
    if (parse_uint(digits, UINT64_MAX / mult, &v))
        return -1;
    *out = v * mult;
    return 0;
}

/* A size as the help writes it: "80K", "1024G" when it is a whole number of
 * KiB/MiB/GiB, else its bytes. */
static const char *size_text(uint64_t v, char *buf, size_t cap)
{
    static const char suffix[] = "GMK";
    for (int i = 0; i < 3; i++) {
        unsigned shift = 30 - 10 * (unsigned)i;
        if (v && v % (1ull << shift) == 0) {
            snprintf(buf, cap, "%llu%c", (unsigned long long)(v >> shift), suffix[i]);
            return buf;
        }
    }
    snprintf(buf, cap, "%llu", (unsigned long long)v);
    return buf;
}

static void *field_of(struct options *o, const struct opt_row *r) { return (char *)o + r->off; }

/* Row r's value v into *o; returns 0 or 2 (the usage error printed). */
static int take_value(struct options *o, const struct opt_row *r, const char *v)
{
    void *f = field_of(o, r);
    const char *why = r->why ? r->why : "";
    char msg[256], lo[32], hi[32];
    uint64_t n;
    switch (r->kind) {
    case OPT_FLAG: *(int *)f = (int)r->min; return 0;
    case OPT_COUNT:
        if (parse_uint(v, r->max, &n) || n < r->min)
            return usage_error("invalid --%s '%s' (expected %s%s%llu..%llu%s)", r->name, v,
                               r->noun ? r->noun : "an integer", r->noun && !*r->noun ? "" : " in ",
                               (unsigned long long)r->min, (unsigned long long)r->max, why);
        *(uint32_t *)f = (uint32_t)n;
        return 0;
    case OPT_SIZE:
        if (parse_size(v, &n) || n < r->min || n > r->max)
            return usage_error("invalid --%s '%s' (expected a SIZE in %s..%s%s)", r->name, v,
                               size_text(r->min, lo, sizeof lo), size_text(r->max, hi, sizeof hi),
                               why);
        *(uint64_t *)f = n;
        return 0;
    case OPT_TEXT:
    case OPT_SET:
        if (r->fn && r->fn(f, v, msg, sizeof msg))
            return usage_error("invalid --%s '%s'%s", r->name, v, msg);
        if (r->kind == OPT_TEXT)
            *(const char **)f = v;
        return 0;
    default: return 0;
    }
}

/* Every row's default into *o. */
static void set_defaults(struct options *o)
{
    *o = (struct options){0};
    for (size_t i = 0; i < opt_nrows; i++) {
        const struct opt_row *r = &opt_rows[i];
        uint64_t d = r->def_fn ? r->def_fn() : r->def;
        if (r->kind == OPT_COUNT)
            *(uint32_t *)field_of(o, r) = (uint32_t)d;
        else if (r->kind == OPT_SIZE)
            *(uint64_t *)field_of(o, r) = d;
        else if (r->def_str && take_value(o, r, r->def_str))
            abort(); /* a row's own default refused: the table is wrong */
    }
}

/* Print text from column col on (col < HELP_COLUMN: pad to it first),
 * words wrapped at HELP_WIDTH, continuation lines at HELP_COLUMN. */
static void help_text(FILE *f, int col, const char *text)
{
    const char *p = text;
    while (*p) {
        while (*p == ' ')
            p++;
        if (!*p)
            break;
        size_t w = strcspn(p, " ");
        int sep = col > HELP_COLUMN ? 1 : 0;
        if (col > HELP_COLUMN && col + 1 + (int)w >= HELP_WIDTH) {
            fprintf(f, "\n%*s", HELP_COLUMN, "");
            col = HELP_COLUMN;
            sep = 0;
        } else if (col < HELP_COLUMN) {
            fprintf(f, "%*s", HELP_COLUMN - col, "");
            col = HELP_COLUMN;
        }
        /* two spaces after a sentence's full stop, as the prose writes them */
        if (sep && p - text >= 2 && p[-1] == ' ' && p[-2] == ' ')
            sep = 2;
        fprintf(f, "%*s%.*s", sep, "", (int)w, p);
        col += sep + (int)w;
        p += w;
    }
    fputc('\n', f);
}

/* " (default D; LO..HI)" for row r, from its fields and the defaults d. */
static void help_tail(const struct opt_row *r, struct options *d, char *buf, size_t cap)
{
    char def[160] = "", range[2 * 32 + 8] = "", lo[32], hi[32];
    if (r->def_text)
        snprintf(def, sizeof def, "%s", r->def_text);
    else if (r->kind == OPT_COUNT)
        snprintf(def, sizeof def, "%u", *(uint32_t *)field_of(d, r));
    else if (r->kind == OPT_SIZE)
        size_text(*(uint64_t *)field_of(d, r), def, sizeof def);
    else if (r->def_str)
        snprintf(def, sizeof def, "%s", r->def_str);
    if (r->kind == OPT_COUNT)
        snprintf(range, sizeof range, "%llu..%llu", (unsigned long long)r->min,
                 (unsigned long long)r->max);
    else if (r->kind == OPT_SIZE && (r->min > 1 || r->max < SIZE_MAX / 2))
        snprintf(range, sizeof range, "%s..%s", size_text(r->min, lo, sizeof lo),
                 r->max < SIZE_MAX / 2 ? size_text(r->max, hi, sizeof hi) : "");
    /* "default: prose", "default 64K" */
    const char *colon = r->def_text ? ": " : " ";
    if (*def && *range)
        snprintf(buf, cap, " (default%s%s; %s)", colon, def, range);
    else if (*def || *range)
        snprintf(buf, cap, " (%s%s%s)", *def ? "default" : "", *def ? colon : "",
                 *def ? def : range);
    else
        *buf = '\0';
}

static void usage(FILE *f)
{
    struct options d;
    set_defaults(&d);
    fputs(opt_usage_head, f);
    for (size_t i = 0; i < opt_nrows; i++) {
        const struct opt_row *r = &opt_rows[i];
        char head[64], tail[256], text[1024];
        int n = r->letter ? snprintf(head, sizeof head, "  -%c, --%s", r->letter, r->name)
                          : snprintf(head, sizeof head, "  --%s", r->name);
        if (r->arg)
            n += snprintf(head + n, sizeof head - (size_t)n, " %s", r->arg);
        fputs(head, f);
        if (n + 1 > HELP_COLUMN) {
            fputc('\n', f);
            n = 0;
        }
        help_tail(r, &d, tail, sizeof tail);
        snprintf(text, sizeof text, "%s%s", r->help, tail);
        help_text(f, n, text);
    }
    fputs(opt_usage_tail, f);
}

/* Options each valid alone that cannot work: refused with the reason
 * (exit 2) rather than accepted and failing every request later. */
static int check_options(const struct options *o)
{
    if (o->world_size > o->max_ranks)
        return usage_error("--world-size %u is above --max-ranks %u", o->world_size, o->max_ranks);
    if (OPTION_GIVEN(o, max_conns_per_peer) && o->max_conns_per_peer > o->max_conns)
        return usage_error("--max-conns-per-peer %u is above --max-conns %u: a cap on one "
                           "address above the whole table's caps nothing (give at most %u, "
                           "or raise --max-conns)",
                           o->max_conns_per_peer, o->max_conns, o->max_conns);
    if (o->max_buffered < o->max_body)
        return usage_error("--max-buffered-bytes %llu is below --max-body-bytes %llu: a body "
                           "of the largest size allowed could never be received",
                           (unsigned long long)o->max_buffered, (unsigned long long)o->max_body);
    if (o->max_info_bytes > o->arena_bytes / 2)
        return usage_error("--max-info-bytes %llu is above half of --arena-bytes %llu: a "
                           "re-registration holds a rank's old and new info at once",
                           (unsigned long long)o->max_info_bytes,
                           (unsigned long long)o->arena_bytes);
    return 0;
}

int options_given(const struct options *o, size_t off)
{
    for (size_t i = 0; i < opt_nrows; i++)
        if (opt_rows[i].kind != OPT_HELP && opt_rows[i].kind != OPT_VERSION &&
            opt_rows[i].off == off && (o->given >> i & 1))
            return 1;
    return 0;
}

/* getopt_long's value for row i: its letter, else 256 + i. */
static int opt_val(size_t i) { return opt_rows[i].letter ? opt_rows[i].letter : 256 + (int)i; }

int options_parse(int argc, char **argv, struct options *o)
{
    struct option longs[64 + 1];
    char shorts[2 * 64 + 2] = ":";
    size_t ns = 1;
    for (size_t i = 0; i < opt_nrows; i++) {
        const struct opt_row *r = &opt_rows[i];
        longs[i] =
            (struct option){r->name, r->arg ? required_argument : no_argument, NULL, opt_val(i)};
        if (r->letter) {
            shorts[ns++] = r->letter;
            if (r->arg)
                shorts[ns++] = ':';
        }
    }
    longs[opt_nrows] = (struct option){0};
    shorts[ns] = '\0';
    set_defaults(o);
    opterr = 0; /* our own messages */
    int c, li = -1;
    while ((c = getopt_long(argc, argv, shorts, longs, &li)) != -1) {
        if (c == ':')
            return usage_error("option '%s' needs a value", argv[optind - 1]);
        if (c == '?')
            return usage_error("unknown option '%s'", argv[optind - 1]);
        /* "--listen --segment x": getopt takes the next option as the value;
           a value starting with "--" in a separate argument is a missing value
           ("--listen=--x" still passes it) */
        if (optarg && optarg == argv[optind - 1] && !strncmp(optarg, "--", 2) && li >= 0)
            return usage_error("option '--%s' needs a value ('%s' follows it)", longs[li].name,
                               optarg);
        li = -1;
        size_t i = 0;
        while (i < opt_nrows && opt_val(i) != c)
            i++;
        if (i == opt_nrows)
            return usage_error("unknown option");
        if (opt_rows[i].kind == OPT_HELP) {
            usage(stdout);
            return -1;
        }
        if (opt_rows[i].kind == OPT_VERSION) {
            opt_print_version(stdout);
            return -1;
        }
        /* A value given twice is refused, not the last one taken: a
           unit's --listen repeated in its KVCOORD_OPTS would otherwise
           override it unseen. */
        if (opt_rows[i].arg && (o->given >> i & 1))
            return usage_error("option '--%s' is given more than once (again as '%s'): give "
                               "it once",
                               opt_rows[i].name, optarg);
        int rc = take_value(o, &opt_rows[i], optarg);
        if (rc)
            return rc;
        o->given |= 1ull << i;
    }
    if (optind < argc)
        return usage_error("unexpected argument '%s'", argv[optind]);
    return check_options(o);
}
