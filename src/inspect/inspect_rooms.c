/*
 * inspect_rooms.c - the check of the rooms (kvc__check_rooms): in every
 * stripe, the slots' states and sequence counters, each room found by the
 * core's probe (kvc__room_find) and each index entry naming its room, its
 * fields and participants, dead participants and TTLs, the undo record
 * and the live count; then the failure ring's records.
 *
 * Lock rule: each stripe under its own lock, one at a time (kvc__ck_take_q,
 * quiet: the stripes' locks are summed up in one finding), or as its dead
 * owner left it; a stripe whose live owner keeps its lock is skipped.  The
 * failure ring is read without a lock (entries being written are counted,
 * not read).  Called by kvc__check (inspect_check.c).
 */
#include <string.h>

#include "inspect_internal.h"

/* ---- the check: rooms ---------------------------------------------------- */

/* Slot gi (global index) is the one its room's probe finds (the core's). */
static bool reachable(kvc_segment *seg, uint32_t gi)
{
    return kvc__room_find(seg, seg->rooms[gi].id) == &seg->rooms[gi];
}

typedef struct room_scan {
    kvc__tally slot, probe, fields, ranks, live, ttl, seq, undo, count, locks;
    uint32_t used, expired_done, stripes_checked, stripes_busy, stripe_used, lock_findings;
    uint64_t now; /* CLOCK_MONOTONIC: the TTL's clock */
} room_scan;

static const char *room_fields_problem(const kvc_room *r)
{
    if (r->terminal != -1 && r->terminal != KVC_POLL_FAILED && r->terminal != KVC_POLL_SUCCESS)
        return "terminal state is not -1, Failed or Success";
    if (r->has_failure > 1)
        return "has_failure is neither 0 nor 1";
    if (r->has_failure && r->terminal != KVC_POLL_FAILED)
        return "has a failure record but is not Failed";
    if (r->terminal == KVC_POLL_FAILED && !r->has_failure)
        return "is Failed without a failure record";
    for (uint32_t i = 0; i < r->participants && i < KVC_ROOM_MAX_PARTICIPANTS; i++)
        if (r->part[i].state < -1 || r->part[i].state > KVC_POLL_SUCCESS)
            return "a participant's KVPoll state is out of range";
    return NULL;
}

static void scan_live(kvc__ck *ck, room_scan *rs, const kvc_room *r)
{
    uint64_t ttl_ns = (uint64_t)ck->seg->hdr->room_ttl_ms * 1000000ull;
    if (r->terminal >= 0) {
        if (rs->now > r->updated_mono + ttl_ns)
            rs->expired_done++;
        return;
    }
    for (uint32_t i = 0; i < r->participants; i++) {
        const kvc_room_part *p = &r->part[i];
        bool dead = p->proc_slot >= 0 ? kvc__proc_slot_state(ck->seg, p->proc_slot, p->proc_gen) !=
                                            KVC__SLOT_ALIVE
                                      : !kvc__proc_alive(p->pid, p->start);
        if (p->pid && !p->released && dead) {
            kvc__ck_problem(
                ck, &rs->live, KVC_SEV_DEGRADED,
                "room %llu: rank %u (pid %d) is not running "
                "but the room is not failed yet (its next reader fails it; so does `repair`)",
                (unsigned long long)r->id, i, (int)p->pid);
            return;
        }
    }
    if (rs->now > r->updated_mono + ttl_ns)
        kvc__ck_problem(ck, &rs->ttl, KVC_SEV_DEGRADED,
                        "room %llu (%s) is idle past its TTL of %u ms; "
                        "the next sweep fails and reclaims it",
                        (unsigned long long)r->id, kvc_poll_name(kvc__room_state(r)),
                        ck->seg->hdr->room_ttl_ms);
}

static void scan_room(kvc__ck *ck, room_scan *rs, uint32_t i, bool dead_owner)
{
    const kvc_room *r = &ck->seg->rooms[i];
    uint32_t q = atomic_load(&r->seq);
    if (q & 1)
        kvc__ck_problem(ck, &rs->seq, dead_owner ? KVC_SEV_BROKEN : KVC_SEV_DEGRADED,
                        "room slot %u: its sequence counter is odd (%u) with no writer inside: %s",
                        i, q,
                        dead_owner ? "its writer died; the stripe's recovery evens it"
                                   : "readers take the stripe lock for it");
    if (r->slot > KVC_SLOT_USED) {
        kvc__ck_problem(ck, &rs->slot, KVC_SEV_BROKEN,
                        "room slot %u has state %u (not free or used)", i, r->slot);
        return;
    }
    if (r->slot != KVC_SLOT_USED)
        return;
    rs->used++;
    rs->stripe_used++;
    if (!reachable(ck->seg, i))
        kvc__ck_problem(ck, &rs->probe, KVC_SEV_BROKEN,
                        "room %llu in slot %u is not found by its probe "
                        "sequence (or its id is duplicated)",
                        (unsigned long long)r->id, i);
    if (r->participants < 1 || r->participants > KVC_ROOM_MAX_PARTICIPANTS ||
        r->participants > ck->seg->hdr->max_ranks) {
        kvc__ck_problem(ck, &rs->ranks, KVC_SEV_BROKEN,
                        "room %llu has %u participants: it references "
                        "ranks outside 0..%u",
                        (unsigned long long)r->id, r->participants,
                        (ck->seg->hdr->max_ranks < KVC_ROOM_MAX_PARTICIPANTS
                             ? ck->seg->hdr->max_ranks
                             : KVC_ROOM_MAX_PARTICIPANTS) -
                            1);
        return;
    }
    const char *why = room_fields_problem(r);
    if (why) {
        kvc__ck_problem(ck, &rs->fields, KVC_SEV_BROKEN, "room %llu: %s", (unsigned long long)r->id,
                        why);
        return;
    }
    ck->st->rooms_by_state[kvc__room_state(r)]++;
    scan_live(ck, rs, r);
}

static void check_failure_ring(kvc__ck *ck)
{
    const kvc_header *h = ck->seg->hdr;
    uint64_t total = atomic_load(&h->failures_total),
             kept = total < KVC_FAILURE_RING ? total : KVC_FAILURE_RING, claimed = 0;
    kvc__tally t = {"failures.ring", 0, 0};
    ck->st->failures_total = total;
    for (uint64_t k = 0; k < kept; k++) {
        const kvc_failure_slot *f = &ck->seg->failures[k];
        uint64_t c = atomic_load(&f->claim);
        if ((c >> 32) & 1) {
            claimed++;
            continue; /* being written (or its writer died: its stripe recovers it) */
        }
        if (!memchr(f->rec.reason, '\0', sizeof f->rec.reason))
            kvc__ck_problem(ck, &t, KVC_SEV_BROKEN, "failure record %llu: reason not terminated",
                            (unsigned long long)k);
    }
    kvc__ck_settle(ck, &t, "%llu failure records ever, the last %llu kept",
                   (unsigned long long)total, (unsigned long long)kept);
    if (claimed)
        kvc__ck_say(ck, KVC_SEV_INFO, "failures.ring",
                    "%llu ring entries are being written (or await their stripe's recovery)",
                    (unsigned long long)claimed);
}

/* Stripe s under its lock (or as its dead owner left it): slots, undo
 * record, count. */
static void check_stripe(kvc__ck *ck, room_scan *rs, uint32_t s)
{
    const kvc_room_stripe *st = &ck->seg->stripes[s];
    int recovered_before = ck->st->recovered_while_checking;
    enum kvc__access a = kvc__ck_take_q(ck, KVC_LOCK_ROOMS + (int)s, 1);
    if (a != KVC__LOCKED || ck->st->recovered_while_checking != recovered_before)
        rs->lock_findings++; /* take_q said so */
    if (a == KVC__UNLOCKED_BUSY) {
        rs->stripes_busy++;
        return;
    }
    rs->stripes_checked++;
    rs->stripe_used = 0;
    uint32_t n = ck->seg->hdr->stripe_slots;
    for (uint32_t i = 0; i < n; i++)
        scan_room(ck, rs, s * n + i, a == KVC__UNLOCKED_DEAD);
    /* Each used index entry names a used slot of the stripe that names it
     * back (its ix) and whose id has the entry's tag (layout.h). */
    const _Atomic uint64_t *ix = ck->seg->room_index + (size_t)s * n;
    const kvc_room *t = ck->seg->rooms + (size_t)s * n;
    for (uint32_t i = 0; i < n; i++) {
        uint64_t e = atomic_load(&ix[i]);
        uint32_t b = (uint32_t)e - 2u;
        if (e == KVC_IX_FREE || e == KVC_IX_TOMB)
            continue;
        if ((uint32_t)e < 2 || b >= n || t[b].slot != KVC_SLOT_USED || t[b].ix != i ||
            (uint32_t)(e >> 32) != kvc__ix_tag(kvc__room_hash(t[b].id)))
            kvc__ck_problem(ck, &rs->probe, KVC_SEV_BROKEN,
                            "room stripe %u: index entry %u (0x%llx) names no room slot of its own "
                            "(recovery makes it a tombstone)",
                            s, i, (unsigned long long)e);
    }
    if (atomic_load(&st->undo.valid))
        kvc__ck_problem(ck, &rs->undo, KVC_SEV_BROKEN,
                        "room stripe %u: the undo record is valid: a room update was "
                        "interrupted by its writer's death; recovery rolls it back",
                        s);
    if (st->rooms_live != rs->stripe_used)
        kvc__ck_problem(
            ck, &rs->count, KVC_SEV_BROKEN,
            "room stripe %u: rooms_live is %u but %u slots are in use (recovery recounts it)", s,
            st->rooms_live, rs->stripe_used);
    kvc__ck_give(ck, KVC_LOCK_ROOMS + (int)s, a);
}

void kvc__check_rooms(kvc__ck *ck)
{
    const kvc_header *h = ck->seg->hdr;
    room_scan rs = {.slot = {"rooms.slot", 0, 0},
                    .probe = {"rooms.probe", 0, 0},
                    .fields = {"rooms.fields", 0, 0},
                    .ranks = {"rooms.ranks", 0, 0},
                    .live = {"rooms.liveness", 0, 0},
                    .ttl = {"rooms.ttl", 0, 0},
                    .seq = {"rooms.seq", 0, 0},
                    .undo = {"rooms.undo", 0, 0},
                    .count = {"rooms.count", 0, 0},
                    .now = kvc__seg_mono_ns()};
    for (uint32_t s = 0; s < KVC_ROOM_STRIPES; s++)
        check_stripe(ck, &rs, s);
    if (rs.stripes_busy == KVC_ROOM_STRIPES) {
        kvc__ck_say(ck, KVC_SEV_INFO, "rooms.slot", "rooms not checked: the rooms locks are busy");
        return;
    }
    ck->st->rooms_counted = rs.stripes_busy == 0;
    ck->st->rooms_live = rs.used;
    uint64_t recov = 0;
    for (uint32_t s = 0; s < KVC_ROOM_STRIPES; s++)
        recov += atomic_load(&ck->seg->stripes[s].lock.recoveries);
    if (!rs.lock_findings)
        kvc__ck_say(ck, KVC_SEV_OK, "locks.rooms",
                    "%u room stripe locks: free, or taken and released (%llu recoveries since "
                    "creation)",
                    KVC_ROOM_STRIPES, (unsigned long long)recov);
    if (rs.stripes_busy)
        kvc__ck_say(ck, KVC_SEV_INFO, "rooms.slot",
                    "%u of %u room stripes not checked: their locks are busy", rs.stripes_busy,
                    KVC_ROOM_STRIPES);
    kvc__ck_settle(ck, &rs.undo, "no interrupted room update (every stripe's undo record clear)");
    kvc__ck_settle(ck, &rs.count, "every stripe's rooms_live matches its slots in use (%u in all)",
                   rs.used);
    kvc__ck_settle(ck, &rs.seq, "every room's sequence counter is even (no writer inside)");
    kvc__ck_settle(ck, &rs.slot, "all %u room slots hold a valid slot state", h->room_slots);
    kvc__ck_settle(ck, &rs.probe,
                   "every room in use is found by its probe sequence, every index entry names "
                   "its room");
    kvc__ck_settle(ck, &rs.ranks, "every room's participants are ranks within the table");
    kvc__ck_settle(ck, &rs.fields, "room states and failure records are consistent");
    kvc__ck_settle(ck, &rs.live, "no active room waits on a dead participant");
    kvc__ck_settle(ck, &rs.ttl, "no active room is idle past its TTL");
    if (rs.expired_done)
        kvc__ck_say(ck, KVC_SEV_INFO, "rooms.ttl",
                    "%u finished rooms are past their TTL (reclaimed by "
                    "the next sweep)",
                    rs.expired_done);
    check_failure_ring(ck);
}
