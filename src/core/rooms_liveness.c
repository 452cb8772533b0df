/*
 * rooms_liveness.c - what must change in a room before it is answered: a
 * participant that died without releasing it, or its TTL passed; the TTL
 * sweep that reclaims idle rooms; and failing every room of a process that
 * died (kvc__rooms_fail_proc, called when it is reaped).
 *
 * A reader judges the copy it read without a lock (kvc__room_judge): the
 * liveness of participants comes from the process table (slot generation
 * and the dead mark kvc_proc_reap() sets) while a watcher beats, else from
 * the participant's liveness lock (liveness.c) or /proc, at most every
 * KVC__LIVENESS_RECHECK_MS per participant; either way outside the lock.
 * Only a room that must change sends the reader to the stripe lock, where
 * kvc__room_apply_verdict checks that the verdict still holds and records
 * the failure.
 *
 * Lock rule: kvc__room_judge takes no lock (called by rooms_read.c);
 * kvc__room_apply_verdict runs with the stripe lock held (rooms_read.c,
 * and the sweep here); kvc_room_sweep and kvc__rooms_fail_proc take each
 * stripe's lock in turn, never two at once (kvc_room_sweep is public and
 * also called by kvc__with_stripe on a full table; kvc__rooms_fail_proc by
 * session.c).
 */
#include <errno.h>
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
        snprintf(reason, sizeof reason, "rank %u (pid %d) %s", v->rank, (int)v->shown_pid, v->how);
        kvc__record_failure(seg, s, r, v->rank, ESRCH, reason, 0);
    } else if (v->what == 2) {
        uint64_t ttl_ns = (uint64_t)seg->hdr->room_ttl_ms * 1000000ull;
        if (kvc__seg_mono_coarse_ns() <= r->updated_mono + ttl_ns)
            return;
        snprintf(reason, sizeof reason, "room %llu timed out: no update for %u ms (room TTL)",
                 (unsigned long long)r->id, seg->hdr->room_ttl_ms);
        kvc__record_failure(seg, s, r, KVC_ORIGIN_RANK_NONE, ETIMEDOUT, reason, 0); /* no rank's */
    }
}

/* Liveness of participant i of room copy r (slot in the segment: where)
 * judged outside any lock: 1 alive, 0 dead (v filled).  A participant with
 * a process entry: the watcher's dead mark, else (no watcher beating) its
 * liveness lock (liveness.c), namespace-proof; one without (a handle of
 * role none): /proc.  Either system call at most every
 * KVC__LIVENESS_RECHECK_MS per participant. */
static int participant_alive(kvc_segment *seg, kvc_room *where, const kvc_room *r, uint32_t i,
                             bool watched, uint64_t now_mono, kvc__verdict *v)
{
    const kvc_room_part *p = &r->part[i];
    bool entry = p->proc_slot >= 0 && (uint32_t)p->proc_slot < seg->max_procs;
    if (entry) {
        kvc_proc *ps = &seg->procs[p->proc_slot];
        if (atomic_load_explicit(&ps->gen, memory_order_acquire) == p->proc_gen &&
            atomic_load_explicit(&ps->pid, memory_order_acquire) == p->pid) {
            if (atomic_load_explicit(&ps->dead, memory_order_acquire)) {
                snprintf(v->how, sizeof v->how, "%s", ps->how);
                if (atomic_load(&ps->gen) != p->proc_gen)
                    kvc_exit_unknown_text(p->start, v->how, sizeof v->how);
                return 0;
            }
            if (watched)
                return 1;
        }
    }
    _Atomic uint32_t *c = &where->checked_ms[i];
    uint32_t now_ms = (uint32_t)(now_mono / 1000000), last = atomic_load(c);
    if ((uint32_t)(now_ms - last) < KVC__LIVENESS_RECHECK_MS ||
        !atomic_compare_exchange_strong(c, &last, now_ms))
        return 1;
    if (entry) {
        switch (kvc__proc_slot_state(seg, p->proc_slot, p->proc_gen)) {
        case KVC__SLOT_ALIVE: return 1;
        case KVC__SLOT_DEAD:
            /* Its pid means something here only in the same PID namespace
             * (then its zombie, if still there, says how it ended). */
            if (seg->procs[p->proc_slot].pid_ns == seg->pid_ns && seg->pid_ns)
                kvc__proc_how(p->pid, p->start, v->how, sizeof v->how);
            else
                kvc_exit_unknown_text(p->start, v->how, sizeof v->how);
            return 0;
        case KVC__SLOT_GONE:
            /* Its session ended (last handle closed, or reaped) without
             * releasing the room. */
            snprintf(v->how, sizeof v->how,
                     "left the process table (closed its last segment handle, or was reaped)");
            return 0;
        }
    }
    if (kvc__proc_alive(p->pid, p->start))
        return 1;
    kvc__proc_how(p->pid, p->start, v->how, sizeof v->how);
    return 0;
}

/* What must change in room copy r before it is answered (v->what 0: none). */
void kvc__room_judge(kvc_segment *seg, kvc_room *where, const kvc_room *r, kvc__verdict *v)
{
    v->what = 0;
    if (r->terminal >= 0)
        return;
    const kvc_header *h = seg->hdr;
    uint64_t now = kvc__seg_mono_coarse_ns();
    if (now > r->updated_mono + (uint64_t)h->room_ttl_ms * 1000000ull) {
        v->what = 2;
        return;
    }
    uint64_t beat = atomic_load_explicit(&h->watch_beat_mono, memory_order_acquire);
    bool watched = beat && atomic_load_explicit(&h->watch_pid, memory_order_relaxed) &&
                   now < beat + (uint64_t)KVC__WATCH_STALE_MS * 1000000ull;
    for (uint32_t i = 0; i < r->participants && i < KVC_ROOM_MAX_PARTICIPANTS; i++) {
        const kvc_room_part *p = &r->part[i];
        if (!p->pid || p->released)
            continue;
        if (!participant_alive(seg, where, r, i, watched, now, v)) {
            v->what = 1;
            v->rank = i;
            v->pid = p->pid;
            v->start = p->start;
            v->shown_pid = kvc__shown_pid(seg, p->pid, p->start);
            return;
        }
    }
}

/* Sweep stripe s (lock held): fail and reclaim rooms idle past the TTL. */
static void sweep_stripe(kvc_segment *seg, uint32_t s, size_t *reclaimed)
{
    uint64_t ttl_ns = (uint64_t)seg->hdr->room_ttl_ms * 1000000ull;
    kvc_room *t = kvc__stripe_table(seg, s);
    for (uint32_t i = 0; i < seg->hdr->stripe_slots; i++) {
        kvc_room *r = &t[i];
        if (r->slot != KVC_SLOT_USED || kvc__seg_mono_coarse_ns() <= r->updated_mono + ttl_ns)
            continue;
        kvc__verdict v = {.what = 2};
        kvc__room_apply_verdict(seg, s, r, &v); /* records the timeout if not terminal */
        kvc__upd u;
        uint64_t now = kvc__now_coarse_ns();
        kvc__upd_begin(&u, seg, s, r, offsetof(kvc_room, part), 0)->slot = KVC_SLOT_TOMB;
        kvc__stripe_uncount(seg, s);
        kvc__upd_commit(&u, now);
        kvc__tombs_to_free(seg, s, r);
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
                char reason[KVC_REASON_MAX + 1];
                snprintf(reason, sizeof reason, "rank %u (pid %d) %s", p, (int)shown, how);
                if (kvc__record_failure(seg, s, r, p, ESRCH, reason, 0) && failed)
                    (*failed)++;
                break;
            }
        }
        kvc__stripe_unlock(seg, s, ep);
    }
    return KVC_OK;
}
