/*
 * diag.c - kvcoord-diag: the node-level diagnostics tool.
 *
 * Reads a kvcoord segment directly (not through kvcoordd), so it works with
 * the daemon dead and with a lock whose owner was killed.  This file holds
 * main(), the global options and the help; each command is a diag_cmd in
 * its own diag_<command>.c.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "diag.h"

#define DIAG_STR(x) #x
#define DIAG_XSTR(x) DIAG_STR(x) /* a number macro as its digits */
#define LOCK_TIMEOUT_RANGE "1.." DIAG_XSTR(KVC_LIMIT_LOCK_TIMEOUT_MS)

static const diag_cmd *const commands[] = {
    &diag_cmd_status, &diag_cmd_ranks,   &diag_cmd_rooms,  &diag_cmd_failures, &diag_cmd_procs,
    &diag_cmd_locks,  &diag_cmd_check,   &diag_cmd_repair, &diag_cmd_unlink,   &diag_cmd_rdma,
    &diag_cmd_watch,  &diag_cmd_cluster, &diag_cmd_pd,
};
#define NCOMMANDS (sizeof commands / sizeof *commands)

static const char global_options[] =
    "GLOBAL OPTIONS (before or after the command)\n"
    "  -s, --segment NAME     segment to read: /dev/shm/NAME (default kvcoord-6789, the\n"
    "                         segment of a kvcoordd on port 6789)\n"
    "  -p, --port PORT        the segment of the kvcoordd on PORT (kvcoord-PORT;\n"
    "                         1..65535)\n"
    "  -j, --json             print one JSON document instead of text (see OUTPUT)\n"
    "  -T, --lock-timeout MS  longest wait for any lock of the segment, in milliseconds\n"
    "                         (" LOCK_TIMEOUT_RANGE ", default 300); a lock held longer is\n"
    "                         reported with its owner, never waited on\n"
    "  -h, --help             print the help of the tool, or of the command\n";

static const char exit_status[] =
    "EXIT STATUS\n"
    "  0   success; for check and repair: the segment is healthy\n"
    "  1   check/repair: degraded (works, but holds stale state: dead processes\n"
    "      still attached, ranks of dead workers, a stuck lock);\n"
    "      ranks --rank N: rank N is not registered (never, or withdrawn)\n"
    "  2   the segment is broken (an invariant is violated, or a lock's owner died\n"
    "      and the state under it awaits recovery), or cannot be read (missing,\n"
    "      another layout version, truncated, no permission), or an operation\n"
    "      failed; or a usage error (unknown command or option, bad value: a\n"
    "      message and a hint on stderr, nothing on stdout), as for every\n"
    "      kvcoord program\n"
    "  3   rdma --require: no usable RDMA device\n";

static void main_help(const diag *d, FILE *out)
{
    fprintf(out,
            "NAME\n"
            "  %s - inspect and repair a node's kvcoord segment\n"
            "\n"
            "SYNOPSIS\n"
            "  %s [--segment NAME | --port PORT] [--json] [--lock-timeout MS] COMMAND [ARGS]\n"
            "  %s help [COMMAND]\n"
            "  %s --version   its version and the segment layout version it reads, as\n"
            "                           kvcoordd --version prints them\n"
            "\n"
            "DESCRIPTION\n"
            "  kvcoord keeps a node's rank table (each TP rank's transfer-engine info),\n"
            "  bootstrap rooms (KVPoll state, failure records) and attached processes in one\n"
            "  shared-memory segment, /dev/shm/NAME.  %s reads that segment directly,\n"
            "  not through kvcoordd, so it works when the daemon is dead or a lock owner was\n"
            "  killed.  It never waits on a lock for longer than the lock timeout, never\n"
            "  leaves a lock held, and repairs (then marks consistent) any lock whose owner\n"
            "  died that it has to take.  Rank entries are read through their seqlock.\n"
            "\n"
            "  Read-only commands (status, procs, locks, check) change nothing unless a lock\n"
            "  owner dies while they look; ranks, rooms, failures and watch read through the\n"
            "  library like any reader, which recovers a dead owner's lock when it meets one\n"
            "  (and they say so).  repair and unlink change the segment.\n"
            "\n"
            "COMMANDS\n",
            d->prog, d->prog, d->prog, d->prog, d->prog);
    for (size_t i = 0; i < NCOMMANDS; i++)
        fprintf(out, "  %-9s %s\n", commands[i]->name, commands[i]->summary);
    fprintf(out, "\n  `%s help COMMAND` or `%s COMMAND --help` describes each.\n\n%s\n", d->prog,
            d->prog, global_options);
    fprintf(out,
            "OUTPUT\n"
            "  Text: aligned tables for people; times are local.  Text read from the segment\n"
            "  (session_id, reasons) is printed with control bytes escaped as \\xNN.\n"
            "  --json: one JSON document on stdout, with \"schema\": %d, \"command\" and\n"
            "  \"segment\" first; fields are only added, never renamed or removed, within a\n"
            "  schema version; times are *_ns (Unix epoch ns) with *_utc (RFC 3339) beside\n"
            "  them.  A segment that cannot be read gives, for every command,\n"
            "  {\"readable\": false, \"error\": {\"code\", \"message\"}, \"header\": {...},\n"
            "  \"verdict\": \"broken\", \"exit_code\": 2}; any other failure (etcd, a lock, a\n"
            "  read) still gives one document, {..., \"error\": {\"message\"}, \"exit_code\"}.\n"
            "  Only a usage error (stdout empty) or --help prints none.  docs/diag.md\n"
            "  documents every field.\n"
            "\n%s\n"
            "FILES\n"
            "  /dev/shm/NAME  the segment\n"
            "\n"
            "EXAMPLES\n"
            "  %s status                    what the coordinator on port 6789 holds\n"
            "  %s --port 7000 check         exit 0/1/2: healthy/degraded/broken\n"
            "  %s ranks --rank 3 --full     rank 3's whole weights_info_dict\n"
            "  %s --json rooms --state Failed | jq '.rooms[].failure.reason'\n"
            "  %s repair                    recover locks, reap dead processes\n"
            "\n"
            "SEE ALSO\n"
            "  kvcoordd --help, docs/diag.md\n",
            DIAG_JSON_SCHEMA, exit_status, d->prog, d->prog, d->prog, d->prog, d->prog);
}

void diag_cmd_help(const diag *d, const diag_cmd *c, FILE *out)
{
    diag_json_none = 1;
    fprintf(out, "NAME\n  %s %s - %s\n\nSYNOPSIS\n", d->prog, c->name, c->summary);
    /* One synopsis line per form of the command. */
    for (const char *s = c->synopsis; *s;) {
        size_t n = strcspn(s, "\n");
        fprintf(out, "  %s [GLOBAL OPTIONS] %.*s\n", d->prog, (int)n, s);
        s += n + (s[n] == '\n');
    }
    fprintf(out, "\n%s\n%s\n%s", c->help, global_options, exit_status);
}

int diag_usage_error(const diag *d, const diag_cmd *c, const char *fmt, ...)
{
    diag_json_none = 1;
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "%s%s%s: ", d->prog, c ? " " : "", c ? c->name : "");
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\nTry '%s help%s%s' for more information.\n", d->prog, c ? " " : "",
            c ? c->name : "");
    return -1;
}

int diag_parse_range(const diag *d, const diag_cmd *c, const char *name, const char *s,
                     uint64_t min, uint64_t max, uint64_t *out)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (!*s || *end || errno || *s == '-' || v < min || v > max)
        return diag_usage_error(d, c, "%s must be an integer in %llu..%llu, not '%s'", name,
                                (unsigned long long)min, (unsigned long long)max, s);
    *out = v;
    return 0;
}

int diag_parse_u64(const diag *d, const diag_cmd *c, const char *name, const char *s, uint64_t max,
                   uint64_t *out)
{
    return diag_parse_range(d, c, name, s, 0, max, out);
}

int diag_poll_state(const char *s)
{
    for (int i = KVC_POLL_FAILED; i <= KVC_POLL_SUCCESS; i++)
        if (!strcasecmp(s, kvc_poll_name((kvc_poll)i)) || (s[0] == '0' + i && !s[1]))
            return i;
    return -1;
}

/* An option with a value given twice (before or after the command):
 * refused, never the last one taken silently.  Returns -1. */
static int given_twice(diag *d, const diag_cmd *c, const char *name, const char *arg)
{
    return diag_usage_error(d, c,
                            "option '--%s' is given more than once (again as '%s'): give it "
                            "once",
                            name, arg);
}

/* Handle one global option; 1 if it was one, -1 on a bad value. */
static int global_opt(diag *d, const diag_cmd *c, int opt, const char *arg)
{
    uint64_t v = 0;
    if ((opt == 's' || opt == 'p') && d->seg_opt) {
        if (d->seg_opt == opt)
            return given_twice(d, c, opt == 's' ? "segment" : "port", arg);
        return diag_usage_error(d, c,
                                "--segment and --port both name the segment: give one of them, "
                                "once");
    }
    if (opt == 'T' && d->lock_timeout_given)
        return given_twice(d, c, "lock-timeout", arg);
    if (opt == 's' || opt == 'p')
        d->seg_opt = (char)opt;
    if (opt == 'T')
        d->lock_timeout_given = 1;
    switch (opt) {
    case 's':
        if (kvc_name_check(arg) != KVC_OK)
            return diag_usage_error(d, c, "--segment: %s", kvc_last_error());
        snprintf(d->segment, sizeof d->segment, "%s", arg);
        return 1;
    case 'p':
        /* not 0: kvcoordd never serves port 0 (it would be an ephemeral one) */
        if (diag_parse_range(d, c, "--port", arg, 1, 65535, &v) < 0)
            return -1;
        kvc_name_for_port((uint16_t)v, d->segment, sizeof d->segment);
        return 1;
    case 'j': d->json = 1; return 1;
    case 'T':
        if (diag_parse_range(d, c, "--lock-timeout", arg, 1, KVC_LIMIT_LOCK_TIMEOUT_MS, &v) < 0)
            return -1;
        d->lock_timeout_ms = (uint32_t)v;
        return 1;
    }
    return 0;
}

static const struct option global_long[] = {
    {"segment", required_argument, NULL, 's'}, {"port", required_argument, NULL, 'p'},
    {"json", no_argument, NULL, 'j'},          {"lock-timeout", required_argument, NULL, 'T'},
    {"help", no_argument, NULL, 'h'},
};
#define NGLOBAL (sizeof global_long / sizeof *global_long)

/* The options before the command: the global ones and --version. */
static const struct option main_long[] = {
    {"segment", required_argument, NULL, 's'},
    {"port", required_argument, NULL, 'p'},
    {"json", no_argument, NULL, 'j'},
    {"lock-timeout", required_argument, NULL, 'T'},
    {"help", no_argument, NULL, 'h'},
    {"version", no_argument, NULL, 'V'},
    {NULL, 0, NULL, 0},
};

int diag_parse(diag *d, const diag_cmd *c, int argc, char **argv, const char *shortopts,
               const struct option *longopts, diag_opt_fn on, void *ctx)
{
    struct option all[32];
    size_t n = 0;
    for (; longopts && longopts[n].name && n < 32 - NGLOBAL - 1; n++)
        all[n] = longopts[n];
    memcpy(all + n, global_long, sizeof global_long);
    memset(&all[n + NGLOBAL], 0, sizeof all[0]);
    char shorts[64];
    snprintf(shorts, sizeof shorts, ":s:p:jT:h%s", shortopts ? shortopts : "");
    optind = 0; /* glibc: full re-initialisation for this argv */
    opterr = 0;
    int opt, seen[32] = {0};
    while ((opt = getopt_long(argc, argv, shorts, all, NULL)) != -1) {
        if (opt == 'h') {
            diag_cmd_help(d, c, stdout);
            return DIAG_PARSED_HELP;
        }
        if (opt == '?')
            return diag_usage_error(d, c, "unknown option '%s'", argv[optind - 1]);
        if (opt == ':')
            return diag_usage_error(d, c, "option '%s' needs a value", argv[optind - 1]);
        int g = global_opt(d, c, opt, optarg);
        if (g < 0)
            return -1;
        for (size_t k = 0; g == 0 && k < n; k++)
            if (all[k].val == opt && all[k].has_arg == required_argument && seen[k]++)
                return given_twice(d, c, all[k].name, optarg);
        if (g == 0 && (!on || on(ctx, opt, optarg) < 0))
            return -1;
    }
    return optind;
}

int diag_parse_exit(int parsed)
{
    if (parsed == DIAG_PARSED_HELP)
        return DIAG_EXIT_OK;
    if (parsed < 0)
        return DIAG_EXIT_USAGE;
    return -1;
}

static const diag_cmd *find_cmd(const char *name)
{
    for (size_t i = 0; i < NCOMMANDS; i++)
        if (!strcmp(commands[i]->name, name))
            return commands[i];
    return NULL;
}

static int help_cmd(diag *d, int argc, char **argv)
{
    if (argc < 1) {
        main_help(d, stdout);
        return DIAG_EXIT_OK;
    }
    const diag_cmd *c = find_cmd(argv[0]);
    if (!c) {
        diag_usage_error(d, NULL, "no command '%s'", argv[0]);
        return DIAG_EXIT_USAGE;
    }
    diag_cmd_help(d, c, stdout);
    return DIAG_EXIT_OK;
}

int main(int argc, char **argv)
{
    diag d = {.prog = "kvcoord-diag", .lock_timeout_ms = DIAG_DEFAULT_LOCK_TIMEOUT_MS};
    kvc_name_for_port(KVC_DEFAULT_PORT, d.segment, sizeof d.segment);
    int opt;
    opterr = 0;
    /* '+': stop at the command; its own options are parsed by the command. */
    while ((opt = getopt_long(argc, argv, "+:s:p:jT:hV", main_long, NULL)) != -1) {
        if (opt == 'h') {
            main_help(&d, stdout);
            return DIAG_EXIT_OK;
        }
        if (opt == 'V') { /* kvcoordd --version's line, from the same macros */
            printf("%s %s (segment layout version %u)\n", d.prog, KVC_VERSION, KVC_LAYOUT_VERSION);
            return DIAG_EXIT_OK;
        }
        if (opt == '?' || opt == ':') {
            diag_usage_error(&d, NULL, "%s '%s'",
                             opt == ':' ? "option needs a value:" : "unknown option",
                             argv[optind - 1]);
            return DIAG_EXIT_USAGE;
        }
        if (global_opt(&d, NULL, opt, optarg) < 0)
            return DIAG_EXIT_USAGE;
    }
    if (optind >= argc) {
        diag_usage_error(&d, NULL, "no command given");
        return DIAG_EXIT_USAGE;
    }
    const char *name = argv[optind];
    if (!strcmp(name, "help"))
        return help_cmd(&d, argc - optind - 1, argv + optind + 1);
    const diag_cmd *c = find_cmd(name);
    if (!c) {
        diag_usage_error(&d, NULL, "no command '%s'", name);
        return DIAG_EXIT_USAGE;
    }
    int rc = c->run(&d, argc - optind, argv + optind);
    if (d.json && !diag_json_printed && !diag_json_none) {
        /* The command failed after its arguments and said why on stderr
         * only: still one document. */
        json_t *doc = diag_jdoc(&d, c->name), *err = json_object();
        const char *why = kvc_last_error();
        json_object_set_new(err, "message", diag_jstr(why && *why ? why : "failed (see stderr)"));
        json_object_set_new(doc, "error", err);
        json_object_set_new(doc, "exit_code", json_integer(rc));
        diag_jprint(doc);
    }
    return rc;
}
