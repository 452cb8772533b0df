/*
 * diag_check.c - `kvcoord-diag check`: every invariant of the segment, one
 * finding per invariant (or per problem), and the verdict as exit status.
 */
#include <string.h>

#include "diag.h"

static const char check_help[] =
    "DESCRIPTION\n"
    "  Verifies every invariant of the segment and exits 0 (healthy), 1 (degraded)\n"
    "  or 2 (broken or unreadable).  Each invariant gives one finding, or one per\n"
    "  problem (the first 20, then a count).  CHECK names the invariant:\n"
    "    header.magic header.version header.sizes  magic, layout version and structure\n"
    "                     sizes are this build's, region offsets match the capacities\n"
    "    header.file      the file is as long as the header says\n"
    "    header.creator   whether the creator (kvcoordd) still runs (info when not);\n"
    "                     stopped (state T: SIGSTOP, a debugger) is degraded\n"
    "    locks.ranks locks.procs locks.rooms  free or taken within --lock-timeout\n"
    "                     (ok); held past it by a live process, or by a stopped one\n"
    "                     (state T: SIGSTOP, a debugger), at once (degraded: stuck);\n"
    "                     owner died holding it, not recoverable, or held by a dead\n"
    "                     process (broken)\n"
    "    ranks.seq        every rank entry's sequence counter is even (odd: a writer\n"
    "                     died inside the publish window - broken)\n"
    "    ranks.slot       published descriptors are valid (state, session_id length,\n"
    "                     blob inside the arena and long enough)\n"
    "    ranks.owner      no registered rank belongs to a worker that is not running\n"
    "                     (degraded: lookups hand out a dead session)\n"
    "    ranks.overlap    published blobs occupy disjoint arena blocks\n"
    "    ranks.count      the registered count in the header matches the entries\n"
    "    arena.bitmap     the arena bitmap marks exactly the published blobs (blocks\n"
    "                     in use but unmarked: broken; leaked blocks: degraded)\n"
    "    arena.used       the used-block count matches the bitmap (degraded)\n"
    "    procs.entry      process entries are well-formed\n"
    "    procs.alive      every attached process runs (dead ones still listed, or\n"
    "                     live ones stopped - state T: SIGSTOP, a debugger:\n"
    "                     degraded)\n"
    "    rooms.undo       no interrupted room update (a valid undo record: broken)\n"
    "    rooms.count      the live-room count matches the slots in use\n"
    "    rooms.slot rooms.probe  slot states are valid; every room is found by its\n"
    "                     probe sequence, no id is duplicated\n"
    "    rooms.ranks      no room references ranks beyond the table (participants\n"
    "                     within 1..32 and the max ranks)\n"
    "    rooms.fields     states and failure records are consistent\n"
    "    rooms.liveness   no active room waits on a participant that is not running\n"
    "                     (degraded)\n"
    "    rooms.ttl        no active room is idle past the room TTL (degraded)\n"
    "    failures.ring    failure records are well-formed\n"
    "    locks.pd         the PD lock, as the others (a stopped owner: degraded at once)\n"
    "    pd.seq pd.undo   the PD sequences are even and no PD change was interrupted\n"
    "                     (a dead writer's: broken until the next writer rolls it back)\n"
    "    pd.owner         every live prefill rank's known registrant runs (degraded)\n"
    "    pd.rooms.slot pd.rooms.probe  room map slots valid, every room found by its\n"
    "                     probe, one slot free; a room twice (an interrupted move) is\n"
    "                     degraded\n"
    "    pd.count         PD counters and /metrics gauges match the tables\n"
    "    pd.table         the prefill rank table passes the library's validator\n"
    "                     (kvc_pd_table_check: ranges, no key twice, every live entry\n"
    "                     inside the topology, readiness); read without the lock\n"
    "\n"
    "  Each table is read under its lock when the lock's owner is alive (taken for\n"
    "  at most --lock-timeout, then released).  When the owner died holding it, the\n"
    "  table is read as the dead owner left it and the lock is left for `repair`:\n"
    "  check changes nothing.  (If an owner dies during the check, taking its lock\n"
    "  recovers it, as every lock path does; check says so.)\n"
    "\n"
    "OPTIONS\n"
    "  -q, --quiet   print only findings that are not ok (text output)\n"
    "\n"
    "OUTPUT\n"
    "  Text: a table SEVERITY CHECK FINDING, then `verdict: healthy|degraded|broken`.\n"
    "  --json: {\"schema\", \"command\": \"check\", \"segment\", \"readable\": true,\n"
    "  \"verdict\", \"exit_code\", \"counts\": {\"ok\", \"info\", \"degraded\", \"broken\"},\n"
    "  \"stats\": {ranks_registered, ranks_withdrawn, ranks_odd, rooms_live, procs_attached,\n"
    "  procs_alive, procs_stopped, procs_dead, arena_marked_blocks, arena_published_blocks,\n"
    "  failures_total}, \"locks\": [...as in locks...], \"findings\": [{\"check\",\n"
    "  \"severity\" (ok|info|degraded|broken), \"message\"}]}.\n";

struct check_opts {
    int quiet;
};

static int check_opt(void *ctx, int opt, const char *arg)
{
    (void)arg;
    struct check_opts *o = ctx;
    if (opt != 'q')
        return -1;
    o->quiet = 1;
    return 0;
}

static json_t *stats_json(const kvc_check_stats *st)
{
    json_t *o = json_object();
    json_object_set_new(o, "ranks_registered", diag_jint(st->ranks_registered));
    json_object_set_new(o, "ranks_withdrawn", diag_jint(st->ranks_withdrawn));
    json_object_set_new(o, "ranks_odd", diag_jint(st->ranks_odd));
    json_object_set_new(o, "rooms_live", diag_jint(st->rooms_live));
    json_object_set_new(o, "procs_attached", diag_jint(st->procs_attached));
    json_object_set_new(o, "procs_alive", diag_jint(st->procs_alive));
    json_object_set_new(o, "procs_stopped", diag_jint(st->procs_stopped));
    json_object_set_new(o, "procs_dead", diag_jint(st->procs_dead));
    json_object_set_new(o, "arena_marked_blocks", diag_jint((int64_t)st->arena_marked_blocks));
    json_object_set_new(o, "arena_published_blocks",
                        diag_jint((int64_t)st->arena_published_blocks));
    json_object_set_new(o, "failures_total", diag_jint((int64_t)st->failures_total));
    return o;
}

static void check_json(const diag *d, kvc_severity v, diag_findings *f, const kvc_check_stats *st)
{
    json_t *doc = diag_jdoc(d, "check"), *counts = json_object(), *locks = json_array();
    json_object_set_new(doc, "readable", json_true());
    json_object_set_new(doc, "verdict", json_string(diag_verdict_name(v)));
    json_object_set_new(doc, "exit_code", json_integer(diag_verdict_exit(v)));
    for (int s = 0; s < 4; s++)
        json_object_set_new(counts, kvc__severity_name((kvc_severity)s), diag_jint(f->count[s]));
    json_object_set_new(doc, "counts", counts);
    json_object_set_new(doc, "stats", stats_json(st));
    for (int i = 0; i < KVC__LOCKS; i++)
        json_array_append_new(locks, diag_lock_json(&st->locks[i]));
    json_object_set_new(doc, "locks", locks);
    json_object_set_new(doc, "findings", json_incref(f->arr));
    diag_jprint(doc);
}

static int run_check(diag *d, int argc, char **argv)
{
    static const struct option longopts[] = {{"quiet", no_argument, NULL, 'q'}, {0}};
    struct check_opts o = {0};
    int rc =
        diag_parse_exit(diag_parse(d, &diag_cmd_check, argc, argv, "q", longopts, check_opt, &o));
    if (rc >= 0)
        return rc;
    if (optind < argc) {
        diag_usage_error(d, &diag_cmd_check, "unexpected argument '%s'", argv[optind]);
        return DIAG_EXIT_USAGE;
    }
    kvc_segment *seg = diag_open(d, "check", &rc);
    if (!seg)
        return rc;
    diag_findings f;
    kvc_check_stats st;
    diag_findings_init(&f, d->json, !d->json, o.quiet);
    kvc_severity v = kvc__check(seg, diag_findings_cb, &f, &st);
    char sum[128];
    if (d->json) {
        check_json(d, v, &f, &st);
    } else {
        if (o.quiet && !f.count[KVC_SEV_DEGRADED] && !f.count[KVC_SEV_BROKEN])
            diag_table_free(f.tab); /* nothing to list */
        else
            diag_table_print(f.tab, stdout, 0);
        printf("verdict: %s (%s)\n", diag_verdict_name(v),
               diag_findings_summary(&f, sum, sizeof sum));
    }
    json_decref(f.arr);
    kvc__close_reader(seg);
    return diag_verdict_exit(v);
}

const diag_cmd diag_cmd_check = {
    "check",           "verify every invariant; exit 0 healthy, 1 degraded, 2 broken",
    "check [--quiet]", check_help,
    run_check,
};
