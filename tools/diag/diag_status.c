/*
 * diag_status.c - `kvcoord-diag status`: the header, capacities, what the
 * segment holds (ranks, rooms by state, failures, processes, locks) and a
 * one-line verdict from the invariant check.
 */
#include <string.h>

#include "diag.h"

static const char status_help[] =
    "DESCRIPTION\n"
    "  One screen about the segment: its header (magic, layout version, file and\n"
    "  structure sizes, creator pid and whether it is alive, created and updated\n"
    "  times), its capacities, what it holds (ranks registered and withdrawn, rooms by\n"
    "  KVPoll state, failure records, attached processes alive and dead, each lock's\n"
    "  state and recoveries), and a one-line verdict - healthy, degraded or broken -\n"
    "  from the same invariant check as `check`, naming the worst finding.\n"
    "\n"
    "  status changes nothing: it takes each lock whose owner is alive (bounded by\n"
    "  --lock-timeout) to read a consistent state, and leaves a dead owner's lock to\n"
    "  `repair`.  A segment that cannot be attached to (another layout version, a\n"
    "  truncated file) is described from its raw header: both layout versions, the\n"
    "  file size against the size in the header, the creator and whether it runs.\n"
    "\n"
    "OPTIONS\n"
    "  The global options only.\n"
    "\n"
    "OUTPUT\n"
    "  --json: {\"schema\", \"command\": \"status\", \"segment\", \"path\", \"readable\": true,\n"
    "  \"header\": {file_bytes, file_mode, file_uid, magic, magic_text, magic_ok,\n"
    "  layout_version, build_layout_version, header_size, creator_pid, creator_start,\n"
    "  creator_alive, creator_stopped, total_bytes, rank_entry_size, proc_size, lock_size, "
    "room_size,\n"
    "  block_size, created_ns/_utc, updated_ns/_utc, ...},\n"
    "  \"capacities\": {max_ranks, world_size, max_info_bytes, arena_bytes,\n"
    "  arena_used_bytes, max_rooms, room_slots, room_ttl_ms, max_procs},\n"
    "  \"counts\": {ranks_registered, ranks_withdrawn, rooms_counted (false: the rooms\n"
    "  lock was busy; rooms_live is then the header's count and rooms_by_state zeros),\n"
    "  rooms_live, rooms_by_state:\n"
    "  {Failed, Bootstrapping, WaitingForInput, Transferring, Success}, failures_total,\n"
    "  failures_kept, procs_attached, procs_alive, procs_stopped, procs_dead,\n"
    "  lock_recoveries},\n"
    "  \"locks\": [{name, state, owner_pid, owner_alive, owner_stopped, waiters,\n"
    "  recoveries}],\n"
    "  \"verdict\", \"verdict_exit_code\", \"findings\": [{check, severity, message}, ...\n"
    "  the findings that are not ok]}.\n"
    "  The exit status of status is 0 whenever the segment could be read, whatever\n"
    "  the verdict (use check for a verdict as exit status).\n";

static json_t *capacities_json(kvc_segment *seg)
{
    kvc_segment_info si;
    kvc_raw_header h;
    kvc_segment_stat(seg, &si);
    kvc__header_of(seg, &h);
    json_t *o = json_object();
    json_object_set_new(o, "max_ranks", diag_jint(si.max_ranks));
    json_object_set_new(o, "world_size", diag_jint(si.world_size));
    json_object_set_new(o, "max_info_bytes", diag_jint((int64_t)si.max_info_bytes));
    json_object_set_new(o, "arena_bytes", diag_jint((int64_t)si.arena_bytes));
    json_object_set_new(o, "arena_used_bytes", diag_jint((int64_t)si.arena_used));
    json_object_set_new(o, "max_rooms", diag_jint(si.max_rooms));
    json_object_set_new(o, "room_slots", diag_jint(h.room_slots));
    json_object_set_new(o, "room_ttl_ms", diag_jint(si.room_ttl_ms));
    json_object_set_new(o, "max_procs", diag_jint(si.max_procs));
    return o;
}

static json_t *counts_json(kvc_segment *seg, const kvc_check_stats *st)
{
    kvc_segment_info si;
    kvc_segment_stat(seg, &si);
    json_t *o = json_object(), *by = json_object();
    json_object_set_new(o, "ranks_registered", diag_jint(st->ranks_registered));
    json_object_set_new(o, "ranks_withdrawn", diag_jint(st->ranks_withdrawn));
    json_object_set_new(o, "rooms_counted", json_boolean(st->rooms_counted));
    json_object_set_new(o, "rooms_live",
                        diag_jint(st->rooms_counted ? st->rooms_live : si.rooms_live));
    for (int s = 0; s < 5; s++)
        json_object_set_new(by, kvc_poll_name((kvc_poll)s), diag_jint(st->rooms_by_state[s]));
    json_object_set_new(o, "rooms_by_state", by);
    json_object_set_new(o, "failures_total", diag_jint((int64_t)st->failures_total));
    json_object_set_new(o, "failures_kept",
                        diag_jint(st->failures_total < KVC_FAILURE_RING
                                      ? (int64_t)st->failures_total
                                      : KVC_FAILURE_RING));
    json_object_set_new(o, "procs_attached", diag_jint(st->procs_attached));
    json_object_set_new(o, "procs_alive", diag_jint(st->procs_alive));
    json_object_set_new(o, "procs_stopped", diag_jint(st->procs_stopped));
    json_object_set_new(o, "procs_dead", diag_jint(st->procs_dead));
    json_object_set_new(o, "lock_recoveries", diag_jint((int64_t)si.lock_recoveries));
    return o;
}

static void header_text(const diag *d, kvc_segment *seg, FILE *out)
{
    kvc_raw_header h;
    char m[9], b1[32], b2[32], t1[40];
    kvc__header_of(seg, &h);
    kvc__magic_text(h.magic, m);
    fprintf(out, "segment %s  (/dev/shm/%s)\n\nheader\n", d->segment, d->segment);
    diag_table *t = diag_table_new(2, NULL, "ll");
    diag_table_addf(t, "magic\t%s (%s)", m, h.magic_ok ? "valid" : "invalid");
    diag_table_addf(t, "layout version\t%u (this build reads %u)", h.layout_version,
                    KVC_LAYOUT_VERSION);
    diag_table_addf(t, "file\t%s (%llu bytes), mode %04o, uid %u",
                    diag_bytes(h.file_bytes, b1, sizeof b1), (unsigned long long)h.file_bytes,
                    h.file_mode, h.file_uid);
    diag_table_addf(t,
                    "structure sizes\theader %u, rank entry %u, proc %u, lock %u, room %u, "
                    "block %u bytes",
                    h.header_size, h.rank_entry_size, h.proc_size, h.lock_size, h.room_size,
                    h.block_size);
    int32_t adopter = h.creator_alive ? 0 : kvc__adopter(seg, h.creator_pid);
    char ended[64];
    snprintf(ended, sizeof ended, "ended; adopted by kvcoordd pid %d, running", (int)adopter);
    diag_table_addf(t, "creator\tpid %d (%s)", (int)h.creator_pid,
                    h.creator_stopped ? "stopped: state T, SIGSTOP or a debugger"
                    : adopter         ? ended
                                      : diag_alive(h.creator_alive));
    diag_table_addf(t, "created\t%s  (%s ago)", diag_time(h.created_ns, t1, sizeof t1),
                    diag_age(h.created_ns, b2, sizeof b2));
    diag_table_addf(t, "updated\t%s  (%s ago)", diag_time(h.updated_ns, t1, sizeof t1),
                    diag_age(h.updated_ns, b2, sizeof b2));
    diag_table_print(t, out, 2);
}

static void capacities_text(kvc_segment *seg, FILE *out)
{
    kvc_segment_info si;
    kvc_raw_header h;
    char b1[32], b2[32], b3[32];
    kvc_segment_stat(seg, &si);
    kvc__header_of(seg, &h);
    fprintf(out, "\ncapacities\n");
    diag_table *t = diag_table_new(2, NULL, "ll");
    diag_table_addf(t, "max ranks\t%u (world size %u)", si.max_ranks, si.world_size);
    diag_table_addf(t, "info arena\t%s, %s used (%.1f%%); at most %s per rank",
                    diag_bytes(si.arena_bytes, b1, sizeof b1),
                    diag_bytes(si.arena_used, b2, sizeof b2),
                    si.arena_bytes ? 100.0 * (double)si.arena_used / (double)si.arena_bytes : 0.0,
                    diag_bytes(si.max_info_bytes, b3, sizeof b3));
    diag_table_addf(t, "max rooms\t%u (%u slots), room TTL %u ms", si.max_rooms, h.room_slots,
                    si.room_ttl_ms);
    diag_table_addf(t, "max processes\t%u", si.max_procs);
    diag_table_print(t, out, 2);
}

static void contents_text(kvc_segment *seg, const kvc_check_stats *st, FILE *out)
{
    kvc_segment_info si;
    char rooms[256], locks[256], lt[160];
    size_t n = 0;
    kvc_segment_stat(seg, &si);
    if (!st->rooms_counted)
        snprintf(rooms, sizeof rooms,
                 "not counted (a rooms lock is busy); %u live by the "
                 "stripes' counts",
                 si.rooms_live);
    else
        n += (size_t)snprintf(rooms, sizeof rooms, "%u live", st->rooms_live);
    for (int s = 0; s < 5 && st->rooms_counted && n < sizeof rooms; s++)
        n += (size_t)snprintf(rooms + n, sizeof rooms - n, "%s %s %u", s ? "," : ":",
                              kvc_poll_name((kvc_poll)s), st->rooms_by_state[s]);
    n = 0;
    /* The header locks one by one; the room stripes summed up, naming any
     * that is not free. */
    int stripes_free = 0;
    for (int i = 0; i < KVC__LOCKS && n < sizeof locks; i++) {
        if (i >= KVC__LOCK_ID_ROOMS && i < KVC__LOCK_ID_ROOMS + KVC__ROOM_STRIPES &&
            st->locks[i].state == KVC_LOCKST_FREE) {
            stripes_free++;
            continue;
        }
        n += (size_t)snprintf(locks + n, sizeof locks - n, "%s%s %s", n ? "; " : "",
                              st->locks[i].name, kvc__lock_text(&st->locks[i], lt, sizeof lt));
    }
    if (n < sizeof locks)
        n += (size_t)snprintf(locks + n, sizeof locks - n, "; rooms: %d of %d stripes free",
                              stripes_free, KVC__ROOM_STRIPES);
    fprintf(out, "\ncontents\n");
    diag_table *t = diag_table_new(2, NULL, "ll");
    diag_table_addf(t, "ranks\t%u registered, %u withdrawn", st->ranks_registered,
                    st->ranks_withdrawn);
    diag_table_addf(t, "rooms\t%s", rooms);
    diag_table_addf(t, "failures\t%llu recorded (the last %d are kept)",
                    (unsigned long long)st->failures_total, KVC_FAILURE_RING);
    char stopped[32] = "";
    if (st->procs_stopped)
        snprintf(stopped, sizeof stopped, " (%u stopped)", st->procs_stopped);
    diag_table_addf(t, "processes\t%u attached: %u alive%s, %u dead", st->procs_attached,
                    st->procs_alive, stopped, st->procs_dead);
    diag_table_addf(t, "locks\t%s", locks);
    diag_table_addf(t, "lock recoveries\t%llu since creation",
                    (unsigned long long)si.lock_recoveries);
    diag_table_print(t, out, 2);
}

void diag_status_text(const diag *d, kvc_segment *seg, const kvc_check_stats *st,
                      kvc_severity verdict, const diag_findings *f, FILE *out)
{
    header_text(d, seg, out);
    capacities_text(seg, out);
    contents_text(seg, st, out);
    char sum[128];
    fprintf(out, "\nverdict: %s", diag_verdict_name(verdict));
    if (verdict >= KVC_SEV_DEGRADED)
        fprintf(out, " (%s) - %s: %s", diag_findings_summary(f, sum, sizeof sum), f->worst_id,
                f->worst_msg);
    fputc('\n', out);
}

static void status_json(const diag *d, kvc_segment *seg, const kvc_check_stats *st,
                        kvc_severity verdict, diag_findings *f)
{
    json_t *doc = diag_jdoc(d, "status"), *locks = json_array();
    kvc_raw_header h;
    char path[KVC_NAME_MAX + 16];
    snprintf(path, sizeof path, "/dev/shm/%s", d->segment);
    kvc__header_of(seg, &h);
    json_object_set_new(doc, "path", diag_jstr(path));
    json_object_set_new(doc, "readable", json_true());
    json_object_set_new(doc, "header", diag_raw_header_json(&h));
    json_object_set_new(doc, "capacities", capacities_json(seg));
    json_object_set_new(doc, "counts", counts_json(seg, st));
    for (int i = 0; i < KVC__LOCKS; i++)
        json_array_append_new(locks, diag_lock_json(&st->locks[i]));
    json_object_set_new(doc, "locks", locks);
    json_object_set_new(doc, "verdict", json_string(diag_verdict_name(verdict)));
    json_object_set_new(doc, "verdict_exit_code", json_integer(diag_verdict_exit(verdict)));
    json_t *problems = json_array();
    size_t i;
    json_t *v;
    json_array_foreach(f->arr, i, v) if (strcmp(json_string_value(json_object_get(v, "severity")),
                                                "ok")) json_array_append(problems, v);
    json_object_set_new(doc, "findings", problems);
    diag_jprint(doc);
}

static int run_status(diag *d, int argc, char **argv)
{
    int rc = diag_parse_exit(diag_parse(d, &diag_cmd_status, argc, argv, "", NULL, NULL, NULL));
    if (rc >= 0)
        return rc;
    if (optind < argc) {
        diag_usage_error(d, &diag_cmd_status, "unexpected argument '%s'", argv[optind]);
        return DIAG_EXIT_USAGE;
    }
    kvc_segment *seg = diag_open(d, "status", &rc);
    if (!seg)
        return rc;
    diag_findings f;
    kvc_check_stats st;
    diag_findings_init(&f, 1, 0, 0);
    kvc_severity v = kvc__check(seg, diag_findings_cb, &f, &st);
    if (d->json)
        status_json(d, seg, &st, v, &f);
    else
        diag_status_text(d, seg, &st, v, &f, stdout);
    json_decref(f.arr);
    kvc__close_reader(seg);
    return DIAG_EXIT_OK;
}

const diag_cmd diag_cmd_status = {
    "status",   "header, capacities, contents and a one-line verdict", "status", status_help,
    run_status,
};
