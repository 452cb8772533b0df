/*
 * diag_repair.c - `kvcoord-diag repair`: bring a segment back to healthy
 * as kvcoordd would - recover every lock whose owner died, reap dead
 * processes (failing their rooms, withdrawing their worker ranks), fail
 * rooms waiting on dead participants, reclaim expired rooms - then check
 * again and report what changed.  Committed registrations are kept: only
 * ranks of dead workers are withdrawn, which is what a lookup must see.
 */
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "diag.h"

static const char repair_help[] =
    "DESCRIPTION\n"
    "  Repairs the segment the way kvcoordd and the library would, without them,\n"
    "  then checks it again.  In order:\n"
    "    1. takes and releases each lock (ranks, procs, rooms) within --lock-timeout:\n"
    "       a lock whose owner died is recovered - the state under it repaired (a\n"
    "       half-published rank entry settled on its old or new value, the arena\n"
    "       bitmap rebuilt, an interrupted room update rolled back) and the mutex\n"
    "       marked consistent.  A lock held by a live process past the timeout is\n"
    "       left alone and reported;\n"
    "    2. if derived state is still wrong (counts, arena bitmap, undo record),\n"
    "       rebuilds it under the lock from the published entries;\n"
    "    3. reaps every attached process that is not running: its active rooms fail\n"
    "       with a reason naming the rank, pid and how it ended, the ranks it\n"
    "       registered as a worker are withdrawn, its entry is removed;\n"
    "    4. does the same for any rank registered by a worker that is no longer\n"
    "       running but no longer listed either;\n"
    "    5. fails active rooms whose participants are not running;\n"
    "    6. reclaims rooms idle past the room TTL.\n"
    "  Ranks registered by processes that are not workers (clients, kvcoordd) are\n"
    "  never withdrawn: repair loses no committed registration.  Running repair on a\n"
    "  healthy segment changes nothing.\n"
    "\n"
    "OPTIONS\n"
    "  The global options only.\n"
    "\n"
    "OUTPUT\n"
    "  Text: the verdict before, one line per action (ACTION TARGET DETAIL), the\n"
    "  verdict after and any findings left.\n"
    "  --json: {\"schema\", \"command\": \"repair\", \"segment\", \"readable\": true,\n"
    "  \"before\": {\"verdict\", \"exit_code\", \"counts\"}, \"actions\": [{\"action\"\n"
    "  (recover_lock|lock_busy|lock_failed|rebuild|reap_process|reap_rank_owner|\n"
    "  fail_room|sweep_rooms), \"target\", \"detail\", \"ok\"}], \"after\": {\"verdict\",\n"
    "  \"exit_code\", \"counts\", \"findings\": [the findings that are not ok]},\n"
    "  \"exit_code\"}.\n"
    "\n"
    "  The exit status is that of check after the repair: 0 healthy, 1 degraded,\n"
    "  2 broken (or a step failed, or the segment cannot be read: a segment of another\n"
    "  layout version or a truncated file cannot be repaired - unlink it).\n";

typedef struct repair {
    const diag *d;
    kvc_segment *seg;
    json_t *actions;
    diag_table *tab;
    int failed;
} repair;

__attribute__((format(printf, 5, 6))) static void act(repair *rp, int ok, const char *action,
                                                      const char *target, const char *fmt, ...)
{
    char detail[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(detail, sizeof detail, fmt, ap);
    va_end(ap);
    if (!ok)
        rp->failed = 1;
    json_t *o = json_object();
    json_object_set_new(o, "action", json_string(action));
    json_object_set_new(o, "target", diag_jstr(target));
    json_object_set_new(o, "detail", diag_jstr(detail));
    json_object_set_new(o, "ok", json_boolean(ok));
    json_array_append_new(rp->actions, o);
    const char *cells[3] = {action, target, detail};
    diag_table_add(rp->tab, cells);
}

/* ---- 1, 2: locks and derived state --------------------------------------- */

static void recover_locks(repair *rp)
{
    for (int id = 0; id < KVC__LOCKS; id++) {
        kvc_lock_probe p;
        char target[32], text[160];
        kvc__lock_probe(rp->seg, id, &p);
        kvc__lock_text(&p, text, sizeof text);
        snprintf(target, sizeof target, "%s lock", p.name);
        char who[32] = "pid unknown";
        if (p.owner_pid)
            snprintf(who, sizeof who, "pid %d", (int)p.owner_pid);
        int recovered = 0;
        kvc_err e = kvc__lock_cycle(rp->seg, id, &recovered);
        if (e == KVC_E_BUSY)
            act(rp, 0, "lock_busy", target,
                "%s for over %u ms: left alone (stop or kill that "
                "process, then repair again)",
                text, rp->d->lock_timeout_ms);
        else if (e)
            act(rp, 0, "lock_failed", target, "%s", kvc_last_error());
        else if (recovered)
            act(rp, 1, "recover_lock", target,
                "its owner (%s) had died holding it: the state "
                "under it was repaired and the mutex marked consistent",
                who);
    }
}

/* Which areas still have problems after the locks were recovered. */
struct areas {
    int ranks, rooms;
};

static void area_cb(void *ctx, kvc_severity sev, const char *id, const char *msg)
{
    (void)msg;
    struct areas *a = ctx;
    if (sev < KVC_SEV_DEGRADED)
        return;
    if (!strcmp(id, "ranks.seq") || !strcmp(id, "ranks.count") || !strncmp(id, "arena.", 6))
        a->ranks = 1;
    if (!strcmp(id, "rooms.undo") || !strcmp(id, "rooms.count"))
        a->rooms = 1;
}

static void rebuild_derived(repair *rp)
{
    struct areas a = {0, 0};
    kvc__check(rp->seg, area_cb, &a, NULL);
    if (a.ranks) {
        if (kvc__rebuild(rp->seg, KVC__LOCK_ID_RANKS, NULL) == KVC_OK)
            act(rp, 1, "rebuild", "ranks",
                "rebuilt the arena bitmap, used-block and registered "
                "counts from the published rank entries");
        else
            act(rp, 0, "rebuild", "ranks", "%s", kvc_last_error());
    }
    if (a.rooms) {
        if (kvc__rebuild(rp->seg, KVC__LOCK_ID_ROOMS, NULL) == KVC_OK)
            act(rp, 1, "rebuild", "rooms", "rolled back the undo record and recounted live rooms");
        else
            act(rp, 0, "rebuild", "rooms", "%s", kvc_last_error());
    }
}

/* ---- 3, 4: dead processes ------------------------------------------------- */

static void reap_one(repair *rp, const char *action, int32_t pid, uint64_t start, const char *what)
{
    size_t rooms = 0, ranks = 0;
    char target[32];
    snprintf(target, sizeof target, "pid %d", (int)pid);
    if (kvc_proc_reap(rp->seg, pid, start, NULL, &rooms, &ranks) != KVC_OK)
        act(rp, 0, action, target, "%s: %s", what, kvc_last_error());
    else
        act(rp, 1, action, target, "%s is not running: %zu %s failed, %zu %s withdrawn", what,
            rooms, diag_noun(rooms, "room", "rooms"), ranks, diag_noun(ranks, "rank", "ranks"));
}

static void reap_procs(repair *rp)
{
    size_t n = 0;
    kvc_proc_info *p = diag_procs_fetch(rp->seg, &n);
    for (size_t i = 0; p && i < n; i++) {
        if (p[i].alive)
            continue;
        char what[96];
        snprintf(what, sizeof what, "%s, rank %d", kvc_role_name(p[i].role), (int)p[i].rank);
        reap_one(rp, "reap_process", p[i].pid, p[i].start, what);
    }
    free(p);
}

static void reap_rank_owners(repair *rp)
{
    kvc_segment_info si;
    kvc_segment_stat(rp->seg, &si);
    for (uint32_t r = 0; r < si.max_ranks; r++) {
        kvc_rank_peek pk;
        if (kvc__rank_peek(rp->seg, r, &pk) != KVC_OK || pk.state != KVC_RANK_REGISTERED ||
            !pk.owned || kvc__pid_alive(pk.pid, pk.pid_start))
            continue;
        char what[96];
        snprintf(what, sizeof what, "the worker that registered rank %u (no longer attached)", r);
        reap_one(rp, "reap_rank_owner", pk.pid, pk.pid_start, what);
    }
}

/* ---- 5, 6: rooms ---------------------------------------------------------- */

static void fail_dead_rooms(repair *rp)
{
    kvc_segment_info si;
    kvc_segment_stat(rp->seg, &si);
    size_t cap = si.rooms_live + 64, n = 0;
    kvc_room_info *rooms = calloc(cap, sizeof *rooms);
    if (!rooms || kvc_room_list(rp->seg, -1, rooms, cap, &n) != KVC_OK) {
        free(rooms);
        return;
    }
    for (size_t i = 0; i < n && i < cap; i++) {
        if (rooms[i].state == KVC_POLL_FAILED || rooms[i].state == KVC_POLL_SUCCESS)
            continue;
        kvc_room_info now;
        char target[48];
        snprintf(target, sizeof target, "room %llu", (unsigned long long)rooms[i].room);
        /* Reading a room checks its participants' liveness and fails it when one died. */
        if (kvc_room_get(rp->seg, rooms[i].room, -1, &now) == KVC_OK && now.has_failure &&
            !rooms[i].has_failure)
            act(rp, 1, "fail_room", target, "%s: %s", kvc_poll_name(rooms[i].state),
                now.failure.reason);
    }
    free(rooms);
}

static void sweep_rooms(repair *rp)
{
    size_t reclaimed = 0;
    if (kvc_room_sweep(rp->seg, &reclaimed) != KVC_OK)
        act(rp, 0, "sweep_rooms", "rooms", "%s", kvc_last_error());
    else if (reclaimed)
        act(rp, 1, "sweep_rooms", "rooms", "reclaimed %zu %s idle past the room TTL", reclaimed,
            diag_noun(reclaimed, "room", "rooms"));
}

/* ---- output ---------------------------------------------------------------- */

static json_t *verdict_json(kvc_severity v, const diag_findings *f, int with_findings)
{
    json_t *o = json_object(), *counts = json_object();
    json_object_set_new(o, "verdict", json_string(diag_verdict_name(v)));
    json_object_set_new(o, "exit_code", json_integer(diag_verdict_exit(v)));
    for (int s = 0; s < 4; s++)
        json_object_set_new(counts, kvc__severity_name((kvc_severity)s), diag_jint(f->count[s]));
    json_object_set_new(o, "counts", counts);
    if (!with_findings)
        return o;
    json_t *left = json_array(), *v2;
    size_t i;
    json_array_foreach(f->arr, i, v2) if (strcmp(json_string_value(json_object_get(v2, "severity")),
                                                 "ok")) json_array_append(left, v2);
    json_object_set_new(o, "findings", left);
    return o;
}

static void report(repair *rp, kvc_severity v0, diag_findings *f0, kvc_severity v1,
                   diag_findings *f1, int rc)
{
    char sum[128];
    if (rp->d->json) {
        json_t *doc = diag_jdoc(rp->d, "repair");
        json_object_set_new(doc, "readable", json_true());
        json_object_set_new(doc, "before", verdict_json(v0, f0, 0));
        json_object_set_new(doc, "actions", json_incref(rp->actions));
        json_object_set_new(doc, "after", verdict_json(v1, f1, 1));
        json_object_set_new(doc, "exit_code", json_integer(rc));
        diag_jprint(doc);
        diag_table_free(rp->tab);
        return;
    }
    printf("repair of segment %s\n\nbefore: %s (%s)\n\n", rp->d->segment, diag_verdict_name(v0),
           diag_findings_summary(f0, sum, sizeof sum));
    if (json_array_size(rp->actions))
        diag_table_print(rp->tab, stdout, 2);
    else
        printf("  nothing to repair\n");
    if (f1->count[KVC_SEV_DEGRADED] + f1->count[KVC_SEV_BROKEN]) {
        printf("\nleft after repair:\n");
        diag_table_print(f1->tab, stdout, 2);
    } else {
        diag_table_free(f1->tab);
    }
    printf("\nafter: %s (%s)\n", diag_verdict_name(v1), diag_findings_summary(f1, sum, sizeof sum));
}

static int run_repair(diag *d, int argc, char **argv)
{
    int rc = diag_parse_exit(diag_parse(d, &diag_cmd_repair, argc, argv, "", NULL, NULL, NULL));
    if (rc >= 0)
        return rc;
    if (optind < argc) {
        diag_usage_error(d, &diag_cmd_repair, "unexpected argument '%s'", argv[optind]);
        return DIAG_EXIT_USAGE;
    }
    kvc_segment *seg = diag_open(d, "repair", &rc);
    if (!seg)
        return rc;
    static const char *const head[] = {"ACTION", "TARGET", "DETAIL"};
    repair rp = {d, seg, json_array(), diag_table_new(3, head, "lll"), 0};
    diag_findings f0, f1;
    diag_findings_init(&f0, 1, 0, 0);
    kvc_severity v0 = kvc__check(seg, diag_findings_cb, &f0, NULL);
    recover_locks(&rp);
    rebuild_derived(&rp);
    reap_procs(&rp);
    reap_rank_owners(&rp);
    fail_dead_rooms(&rp);
    sweep_rooms(&rp);
    diag_findings_init(&f1, 1, !d->json, 1);
    kvc_severity v1 = kvc__check(seg, diag_findings_cb, &f1, NULL);
    rc = diag_verdict_exit(v1);
    if (rp.failed)
        rc = DIAG_EXIT_BROKEN;
    report(&rp, v0, &f0, v1, &f1, rc);
    json_decref(rp.actions);
    json_decref(f0.arr);
    json_decref(f1.arr);
    kvc__close_reader(seg);
    return rc;
}

const diag_cmd diag_cmd_repair = {
    "repair",   "recover dead owners' locks, reap dead processes, then check again",
    "repair",   repair_help,
    run_repair,
};
