/*
 * diag_failures.c - `kvcoord-diag failures`: the most recent failure
 * records, newest first, kept in a ring even after their rooms are gone.
 */
#include <stdlib.h>
#include <string.h>

#include "diag.h"

#define DEFAULT_LIMIT 20

static const char failures_help[] =
    "DESCRIPTION\n"
    "  Lists the most recent failure records, newest first: when, the bootstrap\n"
    "  room, the origin rank (the rank that recorded the failure first: every rank\n"
    "  of the room reads this same record), the pid that recorded it (0 when it came\n"
    "  over HTTP or from liveness detection), the status code (an errno or an RDMA\n"
    "  work-completion status; 0 when none) and the reason.  The segment keeps the\n"
    "  last 1024 records, also after their rooms were reclaimed.\n"
    "\n"
    "  failures reads through kvc_failures_recent(), which takes the rooms lock for\n"
    "  at most --lock-timeout (a dead owner's lock is recovered on the way).\n"
    "\n"
    "OPTIONS\n"
    "  -n, --limit N   show at most N records (default 20; at most 1024; 0: all kept)\n"
    "\n"
    "OUTPUT\n"
    "  --json: {\"schema\", \"command\": \"failures\", \"segment\", \"failures_total\" (ever\n"
    "  recorded), \"count\", \"failures\": [{\"room\", \"origin_rank\", \"origin_pid\",\n"
    "  \"code\", \"time_ns\", \"time_utc\", \"reason\"}]}.\n";

struct failures_opts {
    uint64_t limit;
    const diag *d;
};

static int failures_opt(void *ctx, int opt, const char *arg)
{
    struct failures_opts *o = ctx;
    if (opt != 'n')
        return -1;
    return diag_parse_u64(o->d, &diag_cmd_failures, "--limit", arg, KVC_FAILURE_RING, &o->limit);
}

static json_t *failure_json(const kvc_failure_info *f)
{
    json_t *o = json_object();
    json_object_set_new(o, "room", diag_jroom(f->room));
    json_object_set_new(o, "origin_rank", diag_jint(f->origin_rank));
    json_object_set_new(o, "origin_pid", diag_jint(f->origin_pid));
    json_object_set_new(o, "code", diag_jint(f->code));
    diag_jtime(o, "time", f->time_ns);
    json_object_set_new(o, "reason", diag_jstr(f->reason));
    return o;
}

static void failures_text(const diag *d, const kvc_failure_info *f, size_t n, uint64_t total)
{
    if (n == 0) {
        printf("no failure recorded in segment %s\n", d->segment);
        return;
    }
    static const char *const head[] = {"TIME", "ROOM", "ORIGIN_RANK", "PID", "CODE", "REASON"};
    diag_table *t = diag_table_new(6, head, "lrrrrl");
    char when[40];
    char origin[16];
    for (size_t i = 0; i < n; i++) {
        if (f[i].origin_rank == KVC_ORIGIN_RANK_NONE)
            snprintf(origin, sizeof origin, "-"); /* timed out: no rank recorded it */
        else
            snprintf(origin, sizeof origin, "%u", f[i].origin_rank);
        diag_table_addf(t, "%s\t%llu\t%s\t%d\t%d\t%s", diag_time(f[i].time_ns, when, sizeof when),
                        (unsigned long long)f[i].room, origin, (int)f[i].origin_pid, (int)f[i].code,
                        f[i].reason);
    }
    diag_table_print(t, stdout, 0);
    if (total > n)
        printf("(%zu of %llu %s ever recorded shown)\n", n, (unsigned long long)total,
               diag_noun(total, "failure", "failures"));
}

static int run_failures(diag *d, int argc, char **argv)
{
    static const struct option longopts[] = {{"limit", required_argument, NULL, 'n'}, {0}};
    struct failures_opts o = {.limit = DEFAULT_LIMIT, .d = d};
    int rc = diag_parse_exit(
        diag_parse(d, &diag_cmd_failures, argc, argv, "n:", longopts, failures_opt, &o));
    if (rc >= 0)
        return rc;
    if (optind < argc) {
        diag_usage_error(d, &diag_cmd_failures, "unexpected argument '%s'", argv[optind]);
        return DIAG_EXIT_USAGE;
    }
    kvc_segment *seg = diag_open(d, "failures", &rc);
    if (!seg)
        return rc;
    size_t cap = o.limit ? o.limit : KVC_FAILURE_RING, n = 0;
    kvc_failure_info *f = calloc(cap, sizeof *f);
    kvc_segment_info si;
    rc = DIAG_EXIT_OK;
    if (!f || kvc_failures_recent(seg, f, cap, &n) != KVC_OK) {
        fprintf(stderr, "%s failures: %s\n", d->prog, f ? kvc_last_error() : "out of memory");
        rc = DIAG_EXIT_BROKEN;
    } else if (kvc_segment_stat(seg, &si), d->json) {
        json_t *doc = diag_jdoc(d, "failures"), *arr = json_array();
        for (size_t i = 0; i < n; i++)
            json_array_append_new(arr, failure_json(&f[i]));
        json_object_set_new(doc, "failures_total", diag_jint((int64_t)si.failures_total));
        json_object_set_new(doc, "count", diag_jint((int64_t)n));
        json_object_set_new(doc, "failures", arr);
        diag_jprint(doc);
    } else {
        failures_text(d, f, n, si.failures_total);
    }
    free(f);
    kvc__close_reader(seg);
    return rc;
}

const diag_cmd diag_cmd_failures = {
    "failures",
    "recent failure records, newest first: room, origin rank, code, reason",
    "failures [--limit N]",
    failures_help,
    run_failures,
};
