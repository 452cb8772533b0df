/*
 * rooms_liveness.c - failing rooms for what liveness and time say: a
 * reader's verdict applied under the stripe lock (a participant that died
 * without releasing the room, or its TTL passed), the TTL sweep that
 * reclaims idle rooms, and failing every room of a process that died
 * (kvc__rooms_fail_proc, called when it is reaped).
 *
 * The verdict itself is reached without a lock by the reader
 * (rooms_read.c, judge(): the process table's marks while a watcher beats,
 * else the participant's liveness lock or /proc, rate-limited); only a room
 * that must change sends the reader to the stripe lock, where
 * kvc__room_apply_verdict checks that the verdict still holds and records
 * the failure.
 *
 * Lock rule: kvc__room_apply_verdict runs with the stripe lock held
 * (rooms_read.c, and the sweep here); kvc_room_sweep and
 * kvc__rooms_fail_proc take each stripe's lock in turn, never two at once
 * (kvc_room_sweep is public and also called by kvc__with_stripe on a full
 * table; kvc__rooms_fail_proc by session.c).
 */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>

#include "rooms_internal.h"

/* Fail r (stripe s, lock held) for what v says, if it still holds: the same
 * participant not released, the room not terminal, the TTL still passed. */
void kvc__room_apply_verdict(kvc_segment *seg, uint32_t s, kvc_room *r, const kvc__verdict *v)
{
    if (r->terminal >= 0)
        return;
    char reason[KVC_REASON_MAX + 1];
    if (v->what == 1) {
        const kvc_room_part *p = &r->part[v->rank];
        if (v->rank >= r->participants || p->pid != v->pid || p->start != v->start || p->released)
            return;
        char who[KVC_NODE_NAME_MAX + 40];
        kvc__pid_text(seg, v->shown_pid, who, sizeof who);
        snprintf(reason, sizeof reason, "rank %u (%s) %s", v->rank, who, v->how);
        kvc__record_failure(seg, s, r, v->rank, ESRCH, reason, 0);
    } else if (v->what == 2) {
        if (kvc__seg_mono_coarse_ns() <= kvc__room_ttl_at(seg, r))
            return;
        snprintf(reason, sizeof reason, "room %llu timed out: no update for %u ms (room TTL)",
                 (unsigned long long)r->id, seg->hdr->room_ttl_ms);
        kvc__record_failure(seg, s, r, KVC_ORIGIN_RANK_NONE, ETIMEDOUT, reason, 0); /* no rank's */
    }
}

/* Sweep stripe s (lock held): fail and reclaim rooms idle past the TTL. */
static void sweep_stripe(kvc_segment *seg, uint32_t s, size_t *reclaimed)
{
    kvc_room *t = kvc__stripe_table(seg, s);
    for (uint32_t i = 0; i < seg->hdr->stripe_slots; i++) {
        kvc_room *r = &t[i];
        if (r->slot != KVC_SLOT_USED || kvc__seg_mono_coarse_ns() <= kvc__room_ttl_at(seg, r))
            continue;
        kvc__verdict v = {.what = 2};
        kvc__room_apply_verdict(seg, s, r, &v); /* records the timeout if not terminal */
        kvc__upd u;
        uint64_t now = kvc__now_coarse_ns();
        _Atomic uint64_t *entry = kvc__room_entry(seg, s, r);
        kvc__upd_begin(&u, seg, s, r, offsetof(kvc_room, part), 0)->slot = KVC_SLOT_FREE;
        kvc__stripe_uncount(seg, s);
        kvc__upd_commit(&u, now);
        kvc__entry_delete(seg, s, entry);
        kvc__room_unreserve(seg);
        if (reclaimed)
            (*reclaimed)++;
    }
}

KVC_API kvc_err kvc_room_sweep(kvc_segment *seg, size_t *reclaimed)
{
    if (reclaimed)
        *reclaimed = 0;
    KVC_ARG(seg);
    for (uint32_t s = 0; s < KVC_ROOM_STRIPES; s++) {
        kvc_err e = kvc__stripe_lock(seg, s);
        if (e)
            return e;
        uint32_t ep = atomic_load(&seg->stripes[s].epoch);
        sweep_stripe(seg, s, reclaimed);
        kvc__stripe_unlock(seg, s, ep);
    }
    return KVC_OK;
}

/* Whether r (lock held) may be evicted for a new room: Failed, and no
 * participant ever joined it (a failure reported before anyone opened it). */
static bool evictable(const kvc_room *r)
{
    if (r->slot != KVC_SLOT_USED || r->terminal != KVC_POLL_FAILED)
        return false;
    for (uint32_t p = 0; p < r->participants && p < KVC_ROOM_MAX_PARTICIPANTS; p++)
        if (r->part[p].pid)
            return false;
    return true;
}

/* The oldest evictable room of stripe s (lock held), or NULL. */
static kvc_room *oldest_evictable(kvc_segment *seg, uint32_t s)
{
    kvc_room *t = kvc__stripe_table(seg, s), *best = NULL;
    for (uint32_t i = 0; i < seg->hdr->stripe_slots; i++)
        if (evictable(&t[i]) && (!best || t[i].updated_mono < best->updated_mono))
            best = &t[i];
    return best;
}

/* Remove room r of stripe s (lock held) in one update, as the sweep does;
 * its failure stays in the ring. */
static void evict(kvc_segment *seg, uint32_t s, kvc_room *r)
{
    kvc__upd u;
    uint64_t now = kvc__now_coarse_ns();
    _Atomic uint64_t *entry = kvc__room_entry(seg, s, r);
    kvc__upd_begin(&u, seg, s, r, offsetof(kvc_room, part), 0)->slot = KVC_SLOT_FREE;
    kvc__stripe_uncount(seg, s);
    KVC_INJECT("room.evicting");
    kvc__upd_commit(&u, now);
    kvc__entry_delete(seg, s, entry);
    kvc__room_unreserve(seg);
    atomic_fetch_add_explicit(&seg->stripes[s].evicted, 1, memory_order_relaxed);
}

kvc_err kvc__room_evict(kvc_segment *seg, uint32_t s, bool *evicted)
{
    *evicted = false;
    uint32_t first = s, last = s; /* a full stripe: only its own rooms help */
    if (__atomic_load_n(&seg->stripes[s].rooms_live, __ATOMIC_RELAXED) + 1 < seg->hdr->stripe_slots)
        first = 0, last = KVC_ROOM_STRIPES - 1; /* the table is full: any stripe's */
    /* Find the oldest, one stripe lock at a time, then evict it if it is
     * still the same evictable room. */
    uint32_t at_s = UINT32_MAX;
    uint64_t id = 0, mono = UINT64_MAX;
    for (uint32_t i = first; i <= last; i++) {
        kvc_err e = kvc__stripe_lock(seg, i);
        if (e)
            return e;
        uint32_t ep = atomic_load(&seg->stripes[i].epoch);
        kvc_room *r = oldest_evictable(seg, i);
        if (r && r->updated_mono < mono)
            at_s = i, id = r->id, mono = r->updated_mono;
        kvc__stripe_unlock(seg, i, ep);
    }
    if (at_s == UINT32_MAX)
        return KVC_OK;
    kvc_err e = kvc__stripe_lock(seg, at_s);
    if (e)
        return e;
    uint32_t ep = atomic_load(&seg->stripes[at_s].epoch);
    uint64_t h = kvc__room_hash(id);
    kvc_room *r = kvc__stripe_find(seg, at_s, h, id);
    if (r && evictable(r)) {
        evict(seg, at_s, r);
        *evicted = true;
    }
    kvc__stripe_unlock(seg, at_s, ep);
    return KVC_OK;
}

kvc_err kvc__rooms_fail_proc(kvc_segment *seg, int32_t pid, uint64_t start, const char *how,
                             size_t *failed)
{
    uint32_t n = seg->hdr->stripe_slots;
    int32_t shown = kvc__shown_pid(seg, pid, start);
    for (uint32_t s = 0; s < KVC_ROOM_STRIPES; s++) {
        kvc_err e = kvc__stripe_lock(seg, s);
        if (e)
            return e;
        uint32_t ep = atomic_load(&seg->stripes[s].epoch);
        kvc_room *t = kvc__stripe_table(seg, s);
        for (uint32_t i = 0; i < n; i++) {
            kvc_room *r = &t[i];
            if (r->slot != KVC_SLOT_USED || r->terminal >= 0)
                continue;
            for (uint32_t p = 0; p < r->participants && p < KVC_ROOM_MAX_PARTICIPANTS; p++) {
                if (r->part[p].pid != pid || (start && r->part[p].start != start) ||
                    r->part[p].released)
                    continue;
                char reason[KVC_REASON_MAX + 1], who[KVC_NODE_NAME_MAX + 40];
                kvc__pid_text(seg, shown, who, sizeof who);
                snprintf(reason, sizeof reason, "rank %u (%s) %s", p, who, how);
                if (kvc__record_failure(seg, s, r, p, ESRCH, reason, 0) && failed)
                    (*failed)++;
                break;
            }
        }
        kvc__stripe_unlock(seg, s, ep);
    }
    return KVC_OK;
}
