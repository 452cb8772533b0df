/*
 * rooms.c - bootstrap rooms: per-request KVPoll state and failure records
 * shared by every rank of the node.  This file holds the public writers
 * (kvc_room_open, kvc_room_set_state, kvc_room_sync, kvc_room_fail,
 * kvc_room_fail_adopt, kvc_room_release) and the room epoch; each writer
 * checks its arguments and runs one operation under the room's stripe lock
 * (kvc__with_stripe), which changes the room in one update (rooms_update.c).
 * The other room files and what each holds are listed in rooms_internal.h.
 *
 * Lock rule: the public calls take no lock themselves; every *_op below
 * runs with its stripe's lock held, and takes no other.  Callers: the
 * public API (include/kvcoord/kvcoord.h): workers, kvcoordd, the Python
 * binding.
 */
#include <stdio.h>
#include <string.h>

#include "rooms_internal.h"

KVC_API const char *kvc_poll_name(kvc_poll s)
{
    switch (s) {
    case KVC_POLL_FAILED: return "Failed";
    case KVC_POLL_BOOTSTRAPPING: return "Bootstrapping";
    case KVC_POLL_WAITING_FOR_INPUT: return "WaitingForInput";
    case KVC_POLL_TRANSFERRING: return "Transferring";
    case KVC_POLL_SUCCESS: return "Success";
    }
    return "Unknown";
}

/* ---- public API --------------------------------------------------------- */

static kvc_err check_participants(const kvc_segment *seg, uint32_t *participants)
{
    if (*participants == 0)
        *participants = seg->hdr->world_size;
    if (*participants > KVC_ROOM_MAX_PARTICIPANTS)
        return kvc__fail(KVC_E_INVAL, "a room has at most %d participants, not %u",
                         KVC_ROOM_MAX_PARTICIPANTS, *participants);
    return KVC_OK;
}

/* "rank R out of range for room ID: it has N participants (ranks 0..N-1)";
 * world (the caller passed participants 0 and the count is the segment's
 * world size) says so, so 0..N-1 does not read as the count given. */
static kvc_err rank_range(uint64_t room, uint32_t rank, uint32_t participants, bool world)
{
    char ranks[32] = "no ranks", why[64] = "";
    if (participants == 1)
        snprintf(ranks, sizeof ranks, "rank 0");
    else if (participants > 1)
        snprintf(ranks, sizeof ranks, "ranks 0..%u", participants - 1);
    if (world)
        snprintf(why, sizeof why, "; participants 0 means the segment's world size, %u",
                 participants);
    return kvc__fail(
        KVC_E_INVAL, "rank %u out of range for room %llu: it has %u participant%s (%s%s)", rank,
        (unsigned long long)room, participants, participants == 1 ? "" : "s", ranks, why);
}

static kvc_err open_locked(kvc_segment *seg, uint32_t s, uint64_t h, uint64_t room, uint32_t asked,
                           uint32_t participants, uint32_t rank, kvc_room_role role)
{
    kvc_room *r = kvc__stripe_find(seg, s, h, room);
    kvc_err e = KVC_OK;
    if (!r && rank >= participants)
        return rank_range(room, rank, participants, asked == 0);
    if (!r) {
        if ((e = kvc__room_create(seg, s, h, room, participants, &r)))
            return e;
    }
    if (asked != 0 && asked != r->participants)
        return kvc__fail(KVC_E_INVAL, "room %llu has %u participant%s, not %u",
                         (unsigned long long)room, r->participants, r->participants == 1 ? "" : "s",
                         participants);
    if (rank >= r->participants)
        return rank_range(room, rank, r->participants,
                          asked == 0 && r->participants == seg->hdr->world_size);
    seg->rooms_opened = true;
    kvc_room_part *p = &r->part[rank];
    int32_t slot = seg->proc_slot;
    uint32_t gen = slot >= 0 ? atomic_load(&seg->procs[slot].gen) : 0;
    if (p->pid == seg->pid && p->start == seg->start && p->proc_slot == slot && p->proc_gen == gen)
        return KVC_OK;
    kvc__upd u;
    uint64_t now = kvc__now_coarse_ns(), mono = kvc__seg_mono_coarse_ns();
    kvc_room *w = kvc__upd_begin(&u, seg, s, r, kvc__room_len(r), 0);
    p = &w->part[rank];
    p->pid = seg->pid;
    p->start = seg->start;
    p->role = (uint8_t)role;
    p->released = 0;
    p->proc_slot = slot;
    p->proc_gen = gen;
    w->updated_ns = now;
    w->updated_mono = mono;
    kvc__upd_commit(&u, now);
    /* Alive now, by definition: no /proc look for a while. */
    atomic_store_explicit(&r->checked_ms[rank], (uint32_t)(mono / 1000000), memory_order_relaxed);
    return KVC_OK;
}

struct open_arg {
    uint64_t room;
    uint32_t asked, participants, rank;
    kvc_room_role role;
};

static kvc_err open_op(kvc_segment *seg, uint32_t s, uint64_t h, void *arg)
{
    struct open_arg *a = arg;
    return open_locked(seg, s, h, a->room, a->asked, a->participants, a->rank, a->role);
}

KVC_API kvc_err kvc_room_open(kvc_segment *seg, uint64_t room, uint32_t participants, uint32_t rank,
                              kvc_room_role role)
{
    KVC_ARG(seg);
    KVC_ROOM_ARG(room);
    if ((unsigned)role > KVC_ROOM_ROLE_DECODE)
        return kvc__fail(KVC_E_INVAL, "kvc_room_open: role %d out of range 0..2 (kvc_room_role)",
                         (int)role);
    struct open_arg a = {room, participants, participants, rank, role};
    kvc_err e = check_participants(seg, &a.participants);
    return e ? e : kvc__with_stripe(seg, room, open_op, &a);
}

/* Find room and check rank is one of its participants (lock held). */
static kvc_err find_participant(kvc_segment *seg, uint32_t s, uint64_t h, uint64_t room,
                                uint32_t rank, kvc_room **out)
{
    kvc_err e = kvc__room_find_or_create(seg, s, h, room, 0, out);
    if (!e && rank >= (*out)->participants)
        e = rank_range(room, rank, (*out)->participants, false);
    return e;
}

struct state_arg {
    uint64_t room;
    uint32_t rank;
    kvc_poll state;
};

static kvc_err state_op(kvc_segment *seg, uint32_t s, uint64_t h, void *arg)
{
    struct state_arg *a = arg;
    kvc_room *r = NULL;
    kvc_err e = find_participant(seg, s, h, a->room, a->rank, &r);
    if (e || r->terminal >= 0)
        return e;
    /* Failed from a rank records the failure in the same window: no reader
     * ever sees a Failed room without its record. */
    int fails = a->state == KVC_POLL_FAILED && !r->has_failure;
    kvc__upd u;
    uint64_t now = kvc__now_coarse_ns();
    kvc_room *w =
        kvc__upd_begin(&u, seg, s, r, fails ? kvc__room_len_failure() : kvc__room_len(r), fails);
    w->part[a->rank].state = (int8_t)a->state;
    w->updated_ns = now;
    w->updated_mono = kvc__seg_mono_coarse_ns();
    KVC_INJECT("room.state_written");
    if (kvc__room_state(w) == KVC_POLL_SUCCESS)
        w->terminal = KVC_POLL_SUCCESS;
    if (fails) {
        char reason[64];
        snprintf(reason, sizeof reason, "rank %u reported Failed", a->rank);
        char node[KVC_NODE_NAME_MAX + 1];
        kvc__node_name(seg, node);
        kvc__put_failure(&u, a->rank, 0, reason, seg->pid, kvc__now_ns(), node, 0);
    }
    kvc__upd_commit(&u, now);
    return KVC_OK;
}

KVC_API kvc_err kvc_room_set_state(kvc_segment *seg, uint64_t room, uint32_t rank, kvc_poll state)
{
    KVC_ARG(seg);
    KVC_ROOM_ARG(room);
    if ((unsigned)state > KVC_POLL_SUCCESS)
        return kvc__fail(KVC_E_INVAL, "kvc_room_set_state: KVPoll state %d out of range 0..4",
                         (int)state);
    struct state_arg a = {room, rank, state};
    return kvc__with_stripe(seg, room, state_op, &a);
}

KVC_API kvc_err kvc_room_sync(kvc_segment *seg, uint32_t rank, size_t n, const uint64_t *rooms,
                              const kvc_poll *states, kvc_poll *out, size_t *failed_at)
{
    KVC_ARG(seg);
    if (n && (!rooms || !out))
        return kvc__fail(KVC_E_INVAL, "kvc_room_sync: argument %s is NULL",
                         !rooms ? "rooms" : "out");
    for (size_t i = 0; i < n; i++) {
        if (failed_at)
            *failed_at = i;
        KVC_ROOM_ARG(rooms[i]);
        if (states && (unsigned)states[i] > KVC_POLL_SUCCESS)
            return kvc__fail(KVC_E_INVAL, "kvc_room_sync: KVPoll state %d out of range 0..4",
                             (int)states[i]);
    }
    /* Each update under its room's stripe lock; each read without a lock
     * (liveness from the watcher's marks, or /proc rate-limited per
     * participant, as kvc_room_get()). */
    for (size_t i = 0; i < n; i++) {
        if (failed_at)
            *failed_at = i;
        kvc_err e;
        if (states) {
            struct state_arg a = {rooms[i], rank, states[i]};
            if ((e = kvc__with_stripe(seg, rooms[i], state_op, &a)))
                return e;
        }
        kvc_room_info ri;
        if ((e = kvc_room_get(seg, rooms[i], (int32_t)rank, &ri)))
            return e;
        if (rank >= ri.participants)
            return rank_range(rooms[i], rank, ri.participants, false);
        out[i] = ri.state;
    }
    return KVC_OK;
}

struct fail_arg {
    uint64_t room;
    uint32_t origin;
    int32_t code;
    const char *reason;
    uint64_t time_ns; /* adopt: the record's time (0: now) */
    int adopt;
    int result;       /* kept / changed */
    int32_t pid;      /* adopt: the origin's pid (0: none) */
    const char *node; /* adopt: the origin node (NULL: none) */
    uint32_t flags;   /* adopt: KVC__FAIL_* */
    int keep;         /* adopt: a record the room has already is kept */
};

static kvc_err fail_op(kvc_segment *seg, uint32_t s, uint64_t h, void *arg)
{
    struct fail_arg *a = arg;
    kvc_room *r = NULL;
    if (!a->adopt) {
        /* A failure comes from one of the room's participants (the world
         * size of a room this call would create), as a state does.  An
         * adopted record may name a rank of another node: not checked. */
        kvc_room *have = kvc__stripe_find(seg, s, h, a->room);
        uint32_t n = have ? have->participants : seg->hdr->world_size;
        if (a->origin >= n)
            return rank_range(a->room, a->origin, n, false);
    }
    kvc_err e = kvc__room_find_or_create(seg, s, h, a->room, seg->hdr->world_size, &r);
    if (e)
        return e;
    if (!a->adopt) {
        a->result = kvc__record_failure(seg, s, r, a->origin, a->code, a->reason,
                                        seg->role == KVC_ROLE_DAEMON ? 0 : seg->pid);
        return KVC_OK;
    }
    char want[KVC_REASON_MAX + 1];
    kvc__copy_reason(want, a->reason && *a->reason ? a->reason : "no reason given");
    const char *node = a->node ? a->node : "";
    if (a->keep && r->has_failure)
        return KVC_OK;
    if (r->has_failure && r->failure.origin_rank == (int32_t)a->origin &&
        r->failure.code == a->code && !strcmp(r->failure.reason, want) &&
        r->failure.origin_pid == a->pid && !strncmp(r->failure.node, node, KVC_NODE_NAME_MAX) &&
        r->failure.flags == a->flags)
        return KVC_OK;
    kvc__upd u;
    uint64_t now = kvc__now_coarse_ns();
    (void)kvc__upd_begin(&u, seg, s, r, kvc__room_len_failure(), 1);
    kvc__put_failure(&u, a->origin, a->code, want, a->pid, a->time_ns ? a->time_ns : kvc__now_ns(),
                     node, a->flags);
    kvc__upd_commit(&u, now);
    a->result = 1;
    return KVC_OK;
}

KVC_API kvc_err kvc_room_fail(kvc_segment *seg, uint64_t room, uint32_t origin_rank, int32_t code,
                              const char *reason, int *kept)
{
    if (kept)
        *kept = 0;
    KVC_ARG(seg);
    KVC_ROOM_ARG(room);
    if (origin_rank >= seg->hdr->max_ranks)
        return kvc__fail(KVC_E_INVAL, "origin rank %u exceeds the segment's max ranks (%u)",
                         origin_rank, seg->hdr->max_ranks);
    struct fail_arg a = {room, origin_rank, code, reason, 0, 0, 0, 0, NULL, 0, 0};
    kvc_err e = kvc__with_stripe(seg, room, fail_op, &a);
    if (!e && kept)
        *kept = a.result;
    return e;
}

KVC_API kvc_err kvc_room_fail_adopt(kvc_segment *seg, uint64_t room, uint32_t origin_rank,
                                    int32_t code, const char *reason, uint64_t time_ns,
                                    int *changed)
{
    if (changed)
        *changed = 0;
    KVC_ARG(seg);
    KVC_ROOM_ARG(room);
    if (origin_rank >= seg->hdr->max_ranks && origin_rank != KVC_ORIGIN_RANK_NONE)
        return kvc__fail(KVC_E_INVAL, "origin rank %u exceeds the segment's max ranks (%u)",
                         origin_rank, seg->hdr->max_ranks);
    struct fail_arg a = {room, origin_rank, code, reason, time_ns, 1, 0, 0, NULL, 0, 0};
    kvc_err e = kvc__with_stripe(seg, room, fail_op, &a);
    if (!e && changed)
        *changed = a.result;
    return e;
}

/* 1..KVC_NODE_NAME_MAX bytes of [A-Za-z0-9._-] (empty_ok: or none). */
static int node_name_ok(const char *s, int empty_ok)
{
    size_t n = strlen(s);
    if (n > KVC_NODE_NAME_MAX || (!n && !empty_ok))
        return 0;
    for (size_t i = 0; i < n; i++) {
        char ch = s[i];
        if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
              ch == '.' || ch == '_' || ch == '-'))
            return 0;
    }
    return 1;
}

static kvc_err fail_mirror(kvc_segment *seg, const kvc_failure_info *f, int keep, int *changed)
{
    if (changed)
        *changed = 0;
    KVC_ARG(seg);
    KVC_ARG(f);
    KVC_ROOM_ARG(f->room);
    if (f->origin_rank >= seg->hdr->max_ranks && f->origin_rank != KVC_ORIGIN_RANK_NONE)
        return kvc__fail(KVC_E_INVAL, "origin rank %u exceeds the segment's max ranks (%u)",
                         f->origin_rank, seg->hdr->max_ranks);
    if (!memchr(f->origin_node, 0, sizeof f->origin_node) || !node_name_ok(f->origin_node, 0))
        return kvc__fail(KVC_E_INVAL,
                         "kvc_room_fail_mirror: origin node must be 1..%d bytes of "
                         "[A-Za-z0-9._-]",
                         KVC_NODE_NAME_MAX);
    char reason[KVC_REASON_MAX + 1];
    memcpy(reason, f->reason, sizeof reason);
    reason[KVC_REASON_MAX] = '\0';
    struct fail_arg a = {
        f->room,        f->origin_rank,       f->code, reason, f->time_ns, 1, 0, f->origin_pid,
        f->origin_node, KVC__FAIL_OTHER_NODE, keep};
    kvc_err e = kvc__with_stripe(seg, f->room, fail_op, &a);
    if (!e && changed)
        *changed = a.result;
    return e;
}

KVC_API kvc_err kvc_room_fail_mirror(kvc_segment *seg, const kvc_failure_info *f, int *changed)
{
    return fail_mirror(seg, f, 0, changed);
}

KVC_API kvc_err kvc_room_fail_mirror_first(kvc_segment *seg, const kvc_failure_info *f,
                                           int *changed)
{
    return fail_mirror(seg, f, 1, changed);
}

KVC_API kvc_err kvc_segment_set_node(kvc_segment *seg, const char *node)
{
    KVC_ARG(seg);
    if (!node)
        node = "";
    if (!node_name_ok(node, 1))
        return kvc__fail(KVC_E_INVAL, "node name '%.80s' is not 0..%d bytes of [A-Za-z0-9._-]",
                         node, KVC_NODE_NAME_MAX);
    kvc_header *h = seg->hdr;
    char name[KVC_NODE_NAME_MAX + 1] = {0};
    snprintf(name, sizeof name, "%s", node);
    /* One writer at a time (kvcoordd); the seq lets readers take a whole
     * name. */
    kvc_seq_write_begin(&h->node_seq);
    kvc_seq_store(h->node_name, name, sizeof name);
    kvc_seq_write_end(&h->node_seq);
    return KVC_OK;
}

void kvc__node_name(kvc_segment *seg, char out[KVC_NODE_NAME_MAX + 1])
{
    const kvc_header *h = seg->hdr;
    for (int spins = 0; spins < 1000; spins++) {
        uint32_t q = kvc_seq_read_begin(&h->node_seq);
        if (q & 1)
            continue;
        kvc_seq_load(out, h->node_name, KVC_NODE_NAME_MAX + 1);
        if (!kvc_seq_read_retry(&h->node_seq, q)) {
            out[KVC_NODE_NAME_MAX] = '\0';
            return;
        }
    }
    out[0] = '\0';
}

void kvc__pid_text(kvc_segment *seg, int32_t pid, char *buf, size_t cap)
{
    char node[KVC_NODE_NAME_MAX + 1];
    kvc__node_name(seg, node);
    if (node[0])
        snprintf(buf, cap, "pid %d on node %s", (int)pid, node);
    else
        snprintf(buf, cap, "pid %d", (int)pid);
}

KVC_API uint32_t kvc_room_epoch(kvc_segment *seg)
{
    if (!seg) {
        kvc__fail(KVC_E_INVAL, "kvc_room_epoch: argument seg is NULL");
        return 0;
    }
    return atomic_load_explicit(&seg->hdr->room_epoch, memory_order_acquire);
}

KVC_API kvc_err kvc_room_wait_change(kvc_segment *seg, uint32_t seen, uint32_t timeout_ms)
{
    KVC_ARG(seg);
    return kvc__epoch_wait(&seg->hdr->room_epoch, seen, timeout_ms, "rooms");
}

struct release_arg {
    uint64_t room;
    uint32_t rank;
    int deleted;
};

static kvc_err release_op(kvc_segment *seg, uint32_t s, uint64_t h, void *arg)
{
    struct release_arg *a = arg;
    kvc_room *r = NULL;
    kvc_err e = find_participant(seg, s, h, a->room, a->rank, &r);
    if (e)
        return e;
    uint32_t released = 0;
    for (uint32_t i = 0; i < r->participants; i++)
        released += r->part[i].released || i == a->rank;
    kvc__upd u;
    uint64_t now = kvc__now_coarse_ns();
    _Atomic uint64_t *entry = released == r->participants ? kvc__room_entry(seg, s, r) : NULL;
    kvc_room *w = kvc__upd_begin(&u, seg, s, r, kvc__room_len(r), 0);
    w->part[a->rank].released = 1;
    w->updated_ns = now;
    w->updated_mono = kvc__seg_mono_coarse_ns();
    if (released == r->participants) { /* the last one out reclaims it */
        w->slot = KVC_SLOT_FREE;
        kvc__stripe_uncount(seg, s);
        a->deleted = 1;
    }
    kvc__upd_commit(&u, now);
    if (a->deleted) {
        kvc__entry_delete(seg, s, entry);
        kvc__room_unreserve(seg);
    }
    return KVC_OK;
}

KVC_API kvc_err kvc_room_release(kvc_segment *seg, uint64_t room, uint32_t rank)
{
    KVC_ARG(seg);
    KVC_ROOM_ARG(room);
    struct release_arg a = {room, rank, 0};
    return kvc__with_stripe(seg, room, release_op, &a);
}
