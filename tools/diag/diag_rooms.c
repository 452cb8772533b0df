/*
 * diag_rooms.c - `kvcoord-diag rooms`: live bootstrap rooms, newest first,
 * with their KVPoll state, participants and failure record.
 */
#include <stdlib.h>
#include <string.h>

#include "diag.h"

#define DEFAULT_LIMIT 50

static const char rooms_help[] =
    "DESCRIPTION\n"
    "  Lists the live bootstrap rooms, most recently opened first: the room id, its\n"
    "  KVPoll state (the minimum over participants: Failed=0, Bootstrapping=1,\n"
    "  WaitingForInput=2, Transferring=3, Success=4; terminal states are sticky), the\n"
    "  participant count, how many opened and released it, each participant's own\n"
    "  state (LOCAL, by rank: a digit, or - when not written yet), when it was opened\n"
    "  and last updated, and its failure record (origin rank, code, reason).\n"
    "\n"
    "  rooms reads through kvc_room_list(), which takes no lock: each room is copied\n"
    "  under its sequence counter; only a room whose writer stays inside (for at\n"
    "  most --lock-timeout) is read under its stripe's lock, and a lock whose owner\n"
    "  died is then recovered on the way (the interrupted update is rolled back),\n"
    "  which the tool says on stderr.\n"
    "  Liveness of participants is not checked here (see check).\n"
    "\n"
    "OPTIONS\n"
    "  -S, --state STATE   only rooms in STATE: a KVPoll name (case-insensitive) or\n"
    "                      number\n"
    "  -n, --limit N       show at most N rooms (default 50; 0: all)\n"
    "\n"
    "OUTPUT\n"
    "  --json: {\"schema\", \"command\": \"rooms\", \"segment\", \"state_filter\" (name or\n"
    "  null), \"limit\", \"count\" (rooms matching), \"shown\", \"rooms\": [{\"room\",\n"
    "  \"state\", \"state_value\" (as GET /rooms/R), \"state_code\" (the same, older\n"
    "  name), \"participants\", \"joined\", \"released\", \"local\": [state\n"
    "  or -1 per rank], \"opened_ns\", \"opened_utc\", \"updated_ns\", \"updated_utc\",\n"
    "  \"failure\": null or {\"origin_rank\", \"origin_pid\", \"origin_node\",\n"
    "  \"from_another_node\", \"code\", \"time_ns\",\n"
    "  \"time_utc\", \"reason\"}}], \"recovered_lock\"}.\n";

struct rooms_opts {
    int state;
    uint64_t limit;
    const diag *d;
};

static int rooms_opt(void *ctx, int opt, const char *arg)
{
    struct rooms_opts *o = ctx;
    switch (opt) {
    case 'S':
        o->state = diag_poll_state(arg);
        if (o->state < 0)
            return diag_usage_error(o->d, &diag_cmd_rooms,
                                    "--state must be a KVPoll state "
                                    "(Failed, Bootstrapping, WaitingForInput, Transferring, "
                                    "Success, or 0..4), not '%s'",
                                    arg);
        return 0;
    case 'n': return diag_parse_u64(o->d, &diag_cmd_rooms, "--limit", arg, 1u << 30, &o->limit);
    }
    return -1;
}

static int newest_first(const void *a, const void *b)
{
    const kvc_room_info *x = a, *y = b;
    if (x->opened_ns != y->opened_ns)
        return x->opened_ns > y->opened_ns ? -1 : 1;
    return x->room < y->room ? -1 : x->room > y->room;
}

/* Every room in state (-1: all), newest first.  NULL with a message on error. */
static kvc_room_info *fetch(kvc_segment *seg, int state, size_t *n)
{
    kvc_segment_info si;
    kvc_segment_stat(seg, &si);
    size_t cap = si.rooms_live + 64, count = 0;
    for (int tries = 0; tries < 5; tries++) {
        kvc_room_info *rooms = calloc(cap, sizeof *rooms);
        if (!rooms)
            return NULL;
        if (kvc_room_list(seg, state, rooms, cap, &count) != KVC_OK) {
            free(rooms);
            return NULL;
        }
        if (count <= cap) {
            qsort(rooms, count, sizeof *rooms, newest_first);
            *n = count;
            return rooms;
        }
        free(rooms);
        cap = count + 64;
    }
    return NULL;
}

static void local_text(const kvc_room_info *r, char *buf, size_t cap)
{
    size_t o = 0;
    for (uint32_t i = 0; i < r->participants && i < KVC_ROOM_MAX_PARTICIPANTS && o + 3 < cap; i++) {
        buf[o++] = r->local[i] < 0 ? '-' : (char)('0' + r->local[i]);
        if (i + 1 < r->participants)
            buf[o++] = ' ';
    }
    buf[o] = '\0';
}

static json_t *room_json(const kvc_room_info *r)
{
    json_t *o = json_object(), *local = json_array();
    json_object_set_new(o, "room", diag_jroom(r->room));
    json_object_set_new(o, "state", json_string(kvc_poll_name(r->state)));
    /* HTTP's name (GET /rooms/R); state_code, the same number, stays
     * within schema 1 (docs/diag.md: fields are never renamed). */
    json_object_set_new(o, "state_value", diag_jint(r->state));
    json_object_set_new(o, "state_code", diag_jint(r->state));
    json_object_set_new(o, "participants", diag_jint(r->participants));
    json_object_set_new(o, "joined", diag_jint(r->joined));
    json_object_set_new(o, "released", diag_jint(r->released));
    for (uint32_t i = 0; i < r->participants && i < KVC_ROOM_MAX_PARTICIPANTS; i++)
        json_array_append_new(local, diag_jint(r->local[i]));
    json_object_set_new(o, "local", local);
    diag_jtime(o, "opened", r->opened_ns);
    diag_jtime(o, "updated", r->updated_ns);
    if (!r->has_failure) {
        json_object_set_new(o, "failure", json_null());
        return o;
    }
    json_t *f = json_object();
    json_object_set_new(f, "origin_rank", diag_jint(r->failure.origin_rank));
    json_object_set_new(f, "origin_pid", diag_jint(r->failure.origin_pid));
    json_object_set_new(f, "code", diag_jint(r->failure.code));
    diag_jtime(f, "time", r->failure.time_ns);
    json_object_set_new(f, "reason", diag_jstr(r->failure.reason));
    json_object_set_new(f, "origin_node", diag_jstr(r->failure.origin_node));
    json_object_set_new(f, "from_another_node", json_boolean(r->failure.from_another_node));
    json_object_set_new(o, "failure", f);
    return o;
}

static void rooms_print(const kvc_room_info *rooms, size_t n, size_t limit, FILE *out)
{
    static const char *const head[] = {"ROOM",  "STATE",  "PARTS",   "JOINED", "RELEASED",
                                       "LOCAL", "OPENED", "UPDATED", "FAILURE"};
    diag_table *t = diag_table_new(9, head, "rlrrrlll");
    char local[80], opened[40], updated[40], fail[KVC_REASON_MAX + 160],
        node[KVC_NODE_NAME_MAX + 16];
    for (size_t i = 0; i < n && (!limit || i < limit); i++) {
        const kvc_room_info *r = &rooms[i];
        local_text(r, local, sizeof local);
        node[0] = '\0';
        if (r->has_failure && r->failure.origin_node[0]) /* the node it was recorded on */
            snprintf(node, sizeof node, " on node %s", r->failure.origin_node);
        if (r->has_failure && r->failure.origin_rank == KVC_ORIGIN_RANK_NONE)
            snprintf(fail, sizeof fail, "no rank%s, code %d: %s", node, (int)r->failure.code,
                     r->failure.reason); /* timed out, or its node left */
        else if (r->has_failure)
            snprintf(fail, sizeof fail, "rank %u%s, code %d: %s", r->failure.origin_rank, node,
                     (int)r->failure.code, r->failure.reason);
        else
            snprintf(fail, sizeof fail, "-");
        diag_table_addf(t, "%llu\t%s\t%u\t%u\t%u\t%s\t%s\t%s\t%s", (unsigned long long)r->room,
                        kvc_poll_name(r->state), r->participants, r->joined, r->released, local,
                        diag_time(r->opened_ns, opened, sizeof opened),
                        diag_time(r->updated_ns, updated, sizeof updated), fail);
    }
    diag_table_print(t, out, 0);
    if (limit && n > limit)
        fprintf(out, "(%zu more not shown; --limit 0 shows all)\n", n - limit);
}

int diag_rooms_table(kvc_segment *seg, int state, size_t limit, FILE *out)
{
    size_t n = 0;
    kvc_room_info *rooms = fetch(seg, state, &n);
    if (!rooms) {
        fprintf(out, "rooms not read: %s\n", kvc_last_error());
        return -1;
    }
    if (n == 0)
        fprintf(out, "no live room\n");
    else
        rooms_print(rooms, n, limit, out);
    free(rooms);
    return (int)n;
}

static void rooms_json(const diag *d, const struct rooms_opts *o, const kvc_room_info *rooms,
                       size_t n, int recovered)
{
    json_t *doc = diag_jdoc(d, "rooms"), *arr = json_array();
    size_t shown = o->limit && n > o->limit ? o->limit : n;
    json_object_set_new(doc, "state_filter",
                        o->state >= 0 ? json_string(kvc_poll_name((kvc_poll)o->state))
                                      : json_null());
    json_object_set_new(doc, "limit", diag_jint((int64_t)o->limit));
    json_object_set_new(doc, "count", diag_jint((int64_t)n));
    json_object_set_new(doc, "shown", diag_jint((int64_t)shown));
    for (size_t i = 0; i < shown; i++)
        json_array_append_new(arr, room_json(&rooms[i]));
    json_object_set_new(doc, "rooms", arr);
    json_object_set_new(doc, "recovered_lock", json_boolean(recovered));
    diag_jprint(doc);
}

static int run_rooms(diag *d, int argc, char **argv)
{
    static const struct option longopts[] = {
        {"state", required_argument, NULL, 'S'}, {"limit", required_argument, NULL, 'n'}, {0}};
    struct rooms_opts o = {.state = -1, .limit = DEFAULT_LIMIT, .d = d};
    int rc = diag_parse_exit(
        diag_parse(d, &diag_cmd_rooms, argc, argv, "S:n:", longopts, rooms_opt, &o));
    if (rc >= 0)
        return rc;
    if (optind < argc) {
        diag_usage_error(d, &diag_cmd_rooms, "unexpected argument '%s'", argv[optind]);
        return DIAG_EXIT_USAGE;
    }
    kvc_segment *seg = diag_open(d, "rooms", &rc);
    if (!seg)
        return rc;
    rc = DIAG_EXIT_OK;
    kvc_segment_info before, after;
    kvc_segment_stat(seg, &before);
    size_t n = 0;
    kvc_room_info *rooms = fetch(seg, o.state, &n);
    kvc_segment_stat(seg, &after);
    int recovered = after.lock_recoveries != before.lock_recoveries;
    if (!rooms) {
        fprintf(stderr, "%s rooms: %s\n", d->prog, kvc_last_error());
        rc = DIAG_EXIT_BROKEN;
    } else if (d->json) {
        rooms_json(d, &o, rooms, n, recovered);
    } else {
        if (recovered)
            fprintf(stderr,
                    "%s rooms: note: a writer had died inside a rooms lock; reading "
                    "recovered it (its update was rolled back)\n",
                    d->prog);
        if (n == 0)
            printf("no live room%s%s\n", o.state >= 0 ? " in state " : "",
                   o.state >= 0 ? kvc_poll_name((kvc_poll)o.state) : "");
        else
            rooms_print(rooms, n, o.limit, stdout);
    }
    free(rooms);
    kvc__close_reader(seg);
    return rc;
}

const diag_cmd diag_cmd_rooms = {
    "rooms",
    "live bootstrap rooms: KVPoll state, participants, failure record",
    "rooms [--state STATE] [--limit N]",
    rooms_help,
    run_rooms,
};
