/*
 * diag_out.c - kvcoord-diag's output: aligned text tables, times, sizes,
 * and the JSON helpers every --json document is built with.
 *
 * Text that comes from the segment (session_id, reasons, notes) is stored
 * verbatim by the library and may hold any byte; it is escaped before it
 * reaches a terminal, and made valid UTF-8 before it reaches JSON.
 */
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "diag.h"

struct diag_table {
    int ncols;
    char **head; /* NULL: no header row */
    char align[16];
    char ***rows;
    size_t nrows, cap;
};

/* Length of the valid UTF-8 sequence at s (1..4), or 0 if invalid. */
static size_t utf8_len(const unsigned char *s)
{
    size_t n = s[0] < 0x80             ? 1
               : (s[0] & 0xE0) == 0xC0 ? 2
               : (s[0] & 0xF0) == 0xE0 ? 3
               : (s[0] & 0xF8) == 0xF0 ? 4
                                       : 0;
    if (n == 2 && s[0] < 0xC2)
        return 0; /* overlong */
    for (size_t i = 1; i < n; i++)
        if ((s[i] & 0xC0) != 0x80)
            return 0;
    return n;
}

char *diag_sanitize(const char *s, char *buf, size_t cap)
{
    size_t o = 0;
    const unsigned char *p = (const unsigned char *)(s ? s : "");
    while (*p && o + 5 < cap) {
        size_t n = utf8_len(p);
        if (n == 1 && *p >= 0x20 && *p != 0x7f) {
            buf[o++] = (char)*p++;
        } else if (n > 1) {
            memcpy(buf + o, p, n);
            o += n;
            p += n;
        } else {
            o += (size_t)snprintf(buf + o, cap - o, "\\x%02x", *p++);
        }
    }
    buf[o] = '\0';
    return buf;
}

/* Display columns of a sanitized (valid UTF-8) string. */
static size_t width(const char *s)
{
    size_t w = 0;
    for (; *s; s++)
        w += ((unsigned char)*s & 0xC0) != 0x80;
    return w;
}

static char *dup_clean(const char *s)
{
    size_t cap = strlen(s ? s : "") * 4 + 8;
    char *b = malloc(cap);
    if (!b)
        abort();
    return diag_sanitize(s, b, cap);
}

diag_table *diag_table_new(int ncols, const char *const *head, const char *align)
{
    diag_table *t = calloc(1, sizeof *t);
    if (!t || ncols < 1 || ncols > 15)
        abort();
    t->ncols = ncols;
    snprintf(t->align, sizeof t->align, "%s", align ? align : "");
    if (head) {
        t->head = calloc((size_t)ncols, sizeof *t->head);
        for (int i = 0; i < ncols; i++)
            t->head[i] = dup_clean(head[i]);
    }
    return t;
}

void diag_table_add(diag_table *t, const char *const *cells)
{
    if (t->nrows == t->cap) {
        t->cap = t->cap ? t->cap * 2 : 16;
        t->rows = realloc(t->rows, t->cap * sizeof *t->rows);
        if (!t->rows)
            abort();
    }
    char **row = calloc((size_t)t->ncols, sizeof *row);
    if (!row)
        abort();
    for (int i = 0; i < t->ncols; i++)
        row[i] = dup_clean(cells[i] ? cells[i] : "");
    t->rows[t->nrows++] = row;
}

void diag_table_addf(diag_table *t, const char *fmt, ...)
{
    char *line = NULL;
    va_list ap;
    va_start(ap, fmt);
    if (vasprintf(&line, fmt, ap) < 0)
        abort();
    va_end(ap);
    const char *cells[16] = {0};
    char *p = line;
    for (int i = 0; i < t->ncols; i++) {
        cells[i] = p ? p : "";
        char *tab = p ? strchr(p, '\t') : NULL;
        if (tab && i < t->ncols - 1)
            *tab = '\0';
        p = tab && i < t->ncols - 1 ? tab + 1 : NULL;
    }
    diag_table_add(t, cells);
    free(line);
}

static void print_row(const diag_table *t, char *const *row, const size_t *w, FILE *out, int indent)
{
    size_t cap = (size_t)indent + 1, len = 0;
    for (int i = 0; i < t->ncols; i++)
        cap += strlen(row[i]) + w[i] + 2;
    char *line = malloc(cap);
    if (!line)
        abort();
    len += (size_t)snprintf(line, cap, "%*s", indent, "");
    for (int i = 0; i < t->ncols; i++) {
        int pad = (int)(w[i] - width(row[i]));
        if (t->align[i] == 'r')
            len += (size_t)snprintf(line + len, cap - len, "%*s%s", pad, "", row[i]);
        else
            len += (size_t)snprintf(line + len, cap - len, "%s%*s", row[i], pad, "");
        if (i < t->ncols - 1)
            len += (size_t)snprintf(line + len, cap - len, "  ");
    }
    while (len > 0 && line[len - 1] == ' ')
        len--; /* no trailing blanks after an empty or short last column */
    line[len] = '\0';
    fprintf(out, "%s\n", line);
    free(line);
}

void diag_table_free(diag_table *t)
{
    if (!t)
        return;
    for (size_t r = 0; r < t->nrows; r++) {
        for (int i = 0; i < t->ncols; i++)
            free(t->rows[r][i]);
        free(t->rows[r]);
    }
    if (t->head)
        for (int i = 0; i < t->ncols; i++)
            free(t->head[i]);
    free(t->head);
    free(t->rows);
    free(t);
}

void diag_table_print(diag_table *t, FILE *out, int indent)
{
    size_t w[16] = {0};
    for (int i = 0; i < t->ncols; i++) {
        if (t->head)
            w[i] = width(t->head[i]);
        for (size_t r = 0; r < t->nrows; r++)
            if (width(t->rows[r][i]) > w[i])
                w[i] = width(t->rows[r][i]);
    }
    if (t->head)
        print_row(t, t->head, w, out, indent);
    for (size_t r = 0; r < t->nrows; r++)
        print_row(t, t->rows[r], w, out, indent);
    diag_table_free(t);
}

/* ---- times and sizes ---------------------------------------------------- */

uint64_t diag_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

char *diag_time(uint64_t ns, char *buf, size_t cap)
{
    if (!ns) {
        snprintf(buf, cap, "-");
        return buf;
    }
    time_t s = (time_t)(ns / 1000000000ull);
    struct tm tm;
    char day[32];
    localtime_r(&s, &tm);
    strftime(day, sizeof day, "%Y-%m-%d %H:%M:%S", &tm);
    snprintf(buf, cap, "%s.%03u", day, (unsigned)(ns / 1000000ull % 1000));
    return buf;
}

char *diag_time_utc(uint64_t ns, char *buf, size_t cap)
{
    if (!ns) {
        snprintf(buf, cap, "%s", "");
        return buf;
    }
    time_t s = (time_t)(ns / 1000000000ull);
    struct tm tm;
    char day[32];
    gmtime_r(&s, &tm);
    strftime(day, sizeof day, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(buf, cap, "%s.%03uZ", day, (unsigned)(ns / 1000000ull % 1000));
    return buf;
}

char *diag_bytes(uint64_t n, char *buf, size_t cap)
{
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = (double)n;
    int u = 0;
    while (v >= 1024 && u < 4) {
        v /= 1024;
        u++;
    }
    if (u == 0)
        snprintf(buf, cap, "%llu B", (unsigned long long)n);
    else
        snprintf(buf, cap, "%.1f %s", v, units[u]);
    return buf;
}

char *diag_age(uint64_t ns, char *buf, size_t cap)
{
    uint64_t now = diag_now_ns();
    if (!ns) {
        snprintf(buf, cap, "-");
        return buf;
    }
    uint64_t d = now > ns ? now - ns : 0, s = d / 1000000000ull;
    if (s < 60)
        snprintf(buf, cap, "%.1fs", (double)d / 1e9);
    else if (s < 3600)
        snprintf(buf, cap, "%llum%02llus", (unsigned long long)(s / 60),
                 (unsigned long long)(s % 60));
    else if (s < 86400)
        snprintf(buf, cap, "%lluh%02llum", (unsigned long long)(s / 3600),
                 (unsigned long long)(s / 60 % 60));
    else
        snprintf(buf, cap, "%llud%02lluh", (unsigned long long)(s / 86400),
                 (unsigned long long)(s / 3600 % 24));
    return buf;
}

/* Start times are clock ticks since boot: the library's one conversion. */
uint64_t diag_ticks_to_ns(uint64_t ticks) { return kvc_proc_start_realtime_ns(ticks); }

/* ---- JSON --------------------------------------------------------------- */

json_t *diag_jstr(const char *s)
{
    json_t *j = json_string(s ? s : "");
    if (j)
        return j;
    /* Not valid UTF-8: replace each invalid byte by U+FFFD. */
    size_t len = strlen(s), o = 0;
    char *buf = malloc(len * 3 + 1);
    if (!buf)
        abort();
    for (const unsigned char *p = (const unsigned char *)s; *p;) {
        size_t n = utf8_len(p);
        if (n) {
            memcpy(buf + o, p, n);
            o += n;
            p += n;
        } else {
            memcpy(buf + o, "\xEF\xBF\xBD", 3);
            o += 3;
            p++;
        }
    }
    buf[o] = '\0';
    j = json_string(buf);
    free(buf);
    return j ? j : json_string("");
}

json_t *diag_jint(int64_t v) { return json_integer((json_int_t)v); }

json_t *diag_jroom(uint64_t room)
{
    if (room <= KVC_ROOM_ID_MAX)
        return json_integer((json_int_t)room);
    char text[24];
    snprintf(text, sizeof text, "%llu", (unsigned long long)room);
    return json_string(text);
}

void diag_jtime(json_t *obj, const char *key, uint64_t ns)
{
    char k[64], utc[40];
    snprintf(k, sizeof k, "%s_ns", key);
    json_object_set_new(obj, k, diag_jint((int64_t)ns));
    snprintf(k, sizeof k, "%s_utc", key);
    json_object_set_new(obj, k, json_string(diag_time_utc(ns, utc, sizeof utc)));
}

json_t *diag_jdoc(const diag *d, const char *command)
{
    json_t *doc = json_object();
    json_object_set_new(doc, "schema", json_integer(DIAG_JSON_SCHEMA));
    json_object_set_new(doc, "command", json_string(command));
    json_object_set_new(doc, "segment", diag_jstr(d->segment));
    return doc;
}

int diag_json_printed, diag_json_none;

void diag_jprint(json_t *doc) { diag_jprint_raw(doc, NULL, NULL, 0); }

void diag_jprint_raw(json_t *doc, const char *placeholder, const char *raw, size_t len)
{
    diag_json_printed = 1;
    char *text = placeholder ? json_dumps(doc, JSON_INDENT(2) | JSON_PRESERVE_ORDER) : NULL;
    if (!text) {
        json_dumpf(doc, stdout, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    } else {
        /* The placeholder as jansson wrote it: a string of plain ASCII,
         * so its encoding is itself in quotes. */
        size_t plen = strlen(placeholder);
        char *at = NULL;
        for (char *p = strstr(text, placeholder); p; p = strstr(p + 1, placeholder))
            if (p > text && p[-1] == '"' && p[plen] == '"')
                at = p - 1;
        if (at) {
            fwrite(text, 1, (size_t)(at - text), stdout);
            fwrite(raw, 1, len, stdout);
            fputs(at + plen + 2, stdout);
        } else {
            fputs(text, stdout);
        }
        free(text);
    }
    fputc('\n', stdout);
    json_decref(doc);
}
