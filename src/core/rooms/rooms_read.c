/*
 * rooms_read.c - reading rooms without a lock: kvc_room_get,
 * kvc_room_wait and kvc_room_list, and judging what was read.
 *
 * Readers take no lock and make no system call: they probe the stripe's
 * index and copy each room slot an entry names (its tag matching) under
 * its seq (seqlock.h), re-check, retry.  A
 * reader that keeps seeing an odd seq (a writer stopped or dead inside)
 * takes the stripe lock, which recovers a dead writer, and reads under it.
 * The copy is then judged (judge): the liveness of participants comes from
 * the process table (slot generation and the dead mark kvc_proc_reap()
 * sets) while a watcher beats, else from the participant's liveness lock
 * (liveness.c) or /proc, at most every KVC__LIVENESS_RECHECK_MS per
 * participant; either way outside the lock.  Only a room that must change
 * (a dead participant, a TTL passed) sends the reader to the stripe lock,
 * where rooms_liveness.c applies the verdict.  kvc_room_wait sleeps on the
 * stripe's epoch futex between reads.  (judge is here, not in
 * rooms_liveness.c, so that kvc_room_get's fast path stays one function, as
 * it was when the rooms were one file.)
 *
 * Lock rule: no lock on the fast path; the stripe lock only through
 * kvc__with_stripe (get_op) or, for a slot that stays odd, read_slot, one
 * stripe at a time.  Public API (include/kvcoord/kvcoord.h); kvc_room_get
 * is also called by kvc_room_sync (rooms.c).
 */
#include <sched.h>
#include <stdio.h>
#include <string.h>

#include "rooms_internal.h"

/* While waiting on a room, participant liveness is re-checked this often,
 * so a dead participant is noticed even with no kvcoordd to report it. */
#define LIVENESS_SLICE_MS 200
/* Reads of an odd seq before a reader takes the stripe lock (the first few
 * spin, the rest yield the CPU to the writer). */
#define ODD_SPINS 2000
#define ODD_PAUSES 64

static void fill_info(const kvc_room *r, int32_t asking, kvc_room_info *out)
{
    memset(out, 0, sizeof *out);
    out->room = r->id;
    out->state = kvc__room_state(r);
    out->participants = r->participants;
    out->opened_ns = r->opened_ns;
    out->updated_ns = r->updated_ns;
    for (uint32_t i = 0; i < KVC_ROOM_MAX_PARTICIPANTS; i++) {
        out->local[i] = i < r->participants ? r->part[i].state : -1;
        out->joined += i < r->participants && r->part[i].pid != 0;
        out->released += i < r->participants && r->part[i].released;
    }
    out->has_failure = (int)r->has_failure;
    if (r->has_failure) {
        const kvc_failure_rec *f = &r->failure;
        out->failure.room = f->room;
        out->failure.origin_rank = (uint32_t)f->origin_rank;
        out->failure.origin_pid = f->origin_pid;
        out->failure.code = f->code;
        out->failure.time_ns = f->time_ns;
        out->failure.is_from_another_rank =
            f->origin_rank < 0 || asking != f->origin_rank || (f->flags & KVC__FAIL_OTHER_NODE);
        memcpy(out->failure.reason, f->reason, sizeof out->failure.reason);
        out->failure.reason[KVC_REASON_MAX] = '\0';
        memcpy(out->failure.origin_node, f->node, sizeof out->failure.origin_node);
        out->failure.origin_node[KVC_NODE_NAME_MAX] = '\0';
        out->failure.from_another_node = (f->flags & KVC__FAIL_OTHER_NODE) != 0;
    }
}

/* ---- lock-free reading -------------------------------------------------- */

static void cpu_relax(void) { __asm__ __volatile__("" ::: "memory"); }

/* Wait out an odd seq: spin, then yield; false once a reader should take
 * the lock instead. */
static bool odd_wait(int *spins)
{
    if (++*spins >= ODD_SPINS)
        return false;
    if (*spins < ODD_PAUSES)
        cpu_relax();
    else
        sched_yield();
    return true;
}

/* Copy slot r into *out if it holds room id (seqlock read; parts and the
 * failure record only when it matches).  Returns 1 copied, 0 not this room,
 * -1 a writer is inside. */
static int snap(const kvc_room *r, uint64_t id, kvc_room *out)
{
    uint32_t s1 = kvc_seq_read_begin(&r->seq);
    if (s1 & 1)
        return -1;
    kvc_seq_load(out, r, offsetof(kvc_room, part)); /* the head, one cache line */
    bool match = out->slot == KVC_SLOT_USED && out->id == id;
    if (match) {
        uint32_t n = out->participants <= KVC_ROOM_MAX_PARTICIPANTS ? out->participants : 0;
        if (out->has_failure)
            kvc_seq_load(&out->failure, &r->failure, sizeof out->failure);
        kvc_seq_load(out->part, r->part, n * sizeof *r->part);
    }
    if (kvc_seq_read_retry(&r->seq, s1))
        return -1;
    return match;
}

/* Read room id (hash h, stripe s) without a lock into *out; *where gets its
 * slot.  KVC_E_BUSY (no message) when a writer stayed inside a slot on the
 * way: the caller reads under the lock. */
static kvc_err read_unlocked(kvc_segment *seg, uint32_t s, uint64_t h, uint64_t id, kvc_room *out,
                             kvc_room **where)
{
    uint32_t n = seg->hdr->stripe_slots, i = kvc__room_home(h, n);
    kvc_room *t = kvc__stripe_table(seg, s);
    _Atomic uint64_t *ix = kvc__stripe_index(seg, s);
    int spins = 0;
    for (uint32_t k = 0; k < n; k++, i = kvc__slot_next(i, n)) {
        /* Acquire: the room's bytes were written before its entry. */
        uint64_t e = atomic_load_explicit(&ix[i], memory_order_acquire);
        if (e == KVC_IX_FREE)
            break;
        uint32_t b = kvc__ix_slot(e, h, n);
        if (b == UINT32_MAX)
            continue;
        int got;
        while ((got = snap(&t[b], id, out)) < 0)
            if (!odd_wait(&spins))
                return KVC_E_BUSY;
        if (got) {
            *where = &t[b];
            return KVC_OK;
        }
    }
    return KVC_E_NOENT;
}

/* Liveness of participant i of room copy r (slot in the segment: where)
 * judged outside any lock: 1 alive, 0 dead (v filled).  A participant with
 * a process entry: the watcher's dead mark, else (no watcher beating) its
 * liveness lock (liveness.c), namespace-proof; one without (a handle of
 * role none): /proc.  Either system call at most every
 * KVC__LIVENESS_RECHECK_MS per participant, and a lock this handle found
 * held within that period is not tested again (one test per process for
 * all its rooms: kvc__proc_seen_alive); a lock found free publishes
 * the dead mark (as the collective does on finding a member dead), so the
 * rate limit never hides a death some process has already seen. */
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
        (entry && kvc__proc_seen_alive(seg, p->proc_slot, p->proc_gen, now_ms)) ||
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
            /* Published: its other rooms fail on their next read, not
             * after their own rate-limited checks. */
            kvc__proc_mark_dead(seg, p->pid, p->start, v->how);
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
static void judge(kvc_segment *seg, kvc_room *where, const kvc_room *r, kvc__verdict *v)
{
    v->what = 0;
    if (r->terminal >= 0)
        return;
    const kvc_header *h = seg->hdr;
    uint64_t now = kvc__seg_mono_coarse_ns();
    if (now > kvc__room_ttl_at(seg, r)) {
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

struct get_arg {
    uint64_t room;
    int32_t asking;
    const kvc__verdict *v;
    kvc_room_info *out;
};

/* The reader's slow path: under the stripe lock, apply what it found (a
 * dead participant, a TTL passed) and read the room. */
static kvc_err get_op(kvc_segment *seg, uint32_t s, uint64_t h, void *arg)
{
    struct get_arg *a = arg;
    kvc_room *r = NULL;
    kvc_err e = kvc__room_find_or_create(seg, s, h, a->room, 0, &r);
    if (e)
        return e;
    if (a->v)
        kvc__room_apply_verdict(seg, s, r, a->v);
    fill_info(r, a->asking, a->out);
    return KVC_OK;
}

KVC_API kvc_err kvc_room_get(kvc_segment *seg, uint64_t room, int32_t asking_rank,
                             kvc_room_info *out)
{
    KVC_ARG(seg);
    KVC_ARG(out);
    KVC_ROOM_ARG(room);
    uint64_t h = kvc__room_hash(room);
    uint32_t s = kvc__room_stripe(h);
    kvc_room copy, *where = NULL;
    struct get_arg a = {room, asking_rank, NULL, out};
    kvc_err e = kvc__seg_current(seg, KVC__FILE_CHECK_READ_MS);
    if (e)
        return e;
    e = read_unlocked(seg, s, h, room, &copy, &where);
    if (e == KVC_E_NOENT)
        return kvc__no_room(room);
    if (e) /* a writer stayed inside: the lock waits for it, or recovers it */
        return kvc__with_stripe(seg, room, get_op, &a);
    kvc__verdict v;
    judge(seg, where, &copy, &v);
    if (v.what) {
        a.v = &v;
        return kvc__with_stripe(seg, room, get_op, &a);
    }
    fill_info(&copy, asking_rank, out);
    return KVC_OK;
}

KVC_API kvc_err kvc_room_wait(kvc_segment *seg, uint64_t room, int32_t asking_rank, kvc_poll known,
                              uint32_t timeout_ms, kvc_room_info *out)
{
    KVC_ARG(seg);
    KVC_ARG(out);
    KVC_ROOM_ARG(room);
    if ((unsigned)known > KVC_POLL_SUCCESS)
        return kvc__fail(KVC_E_INVAL, "kvc_room_wait: known state %d out of range 0..4",
                         (int)known);
    kvc_room_stripe *st = &seg->stripes[kvc__room_stripe(kvc__room_hash(room))];
    uint64_t deadline = kvc__mono_ns() + (uint64_t)timeout_ms * 1000000ull;
    for (;;) {
        uint32_t ep = atomic_load(&st->epoch);
        kvc_err e = kvc_room_get(seg, room, asking_rank, out);
        if (e || out->state != known || out->has_failure)
            return e;
        uint64_t now = kvc__mono_ns();
        if (now >= deadline)
            return kvc__fail(KVC_E_TIMEDOUT, "room %llu still %s after %u ms",
                             (unsigned long long)room, kvc_poll_name(known), timeout_ms);
        uint64_t left = (deadline - now + 999999) / 1000000;
        /* Counted as a waiter before the epoch is looked at again: a writer
         * either sees the count and wakes, or moved the epoch first. */
        atomic_fetch_add(&st->waiters, 1);
        if (atomic_load(&st->epoch) == ep)
            kvc__futex_wait(&st->epoch, ep,
                            (uint32_t)(left < LIVENESS_SLICE_MS ? left : LIVENESS_SLICE_MS));
        atomic_fetch_sub(&st->waiters, 1);
    }
}

/* Copy global slot i whole under its seqlock, or under its stripe's lock
 * when a writer stays inside.  Returns 1 when it holds a room. */
static int read_slot(kvc_segment *seg, uint32_t i, kvc_room *out, kvc_err *err)
{
    const kvc_room *r = &seg->rooms[i];
    int spins = 0;
    for (;;) {
        uint32_t s1 = kvc_seq_read_begin(&r->seq);
        if (!(s1 & 1)) {
            kvc_seq_load(out, r, offsetof(kvc_room, part));
            if (out->slot == KVC_SLOT_USED) {
                uint32_t n = out->participants <= KVC_ROOM_MAX_PARTICIPANTS ? out->participants : 0;
                kvc_seq_load(out->part, r->part, n * sizeof *r->part);
                if (out->has_failure)
                    kvc_seq_load(&out->failure, &r->failure, sizeof out->failure);
            }
            if (!kvc_seq_read_retry(&r->seq, s1))
                return out->slot == KVC_SLOT_USED;
            continue;
        }
        if (odd_wait(&spins))
            continue;
        uint32_t s = i / seg->hdr->stripe_slots;
        if ((*err = kvc__stripe_lock(seg, s)))
            return 0;
        /* No writer now: plain reads (checked_ms, outside the seqlock and
         * written by lock-free readers, is not copied). */
        memcpy(out, r, offsetof(kvc_room, checked_ms));
        kvc__unlock(seg, KVC_LOCK_ROOMS + (int)s);
        return out->slot == KVC_SLOT_USED;
    }
}

KVC_API kvc_err kvc_room_list(kvc_segment *seg, int state_filter, kvc_room_info *out, size_t cap,
                              size_t *count)
{
    KVC_ARG(seg);
    KVC_ARG(count);
    if (cap)
        KVC_ARG(out);
    if (state_filter < -1 || state_filter > KVC_POLL_SUCCESS)
        return kvc__fail(KVC_E_INVAL, "kvc_room_list: state_filter %d out of range -1..4",
                         state_filter);
    size_t n = 0;
    kvc_room r;
    for (uint32_t i = 0; i < seg->hdr->room_slots; i++) {
        /* Most slots are free: look at the slot word before copying. */
        if (__atomic_load_n(&seg->rooms[i].slot, __ATOMIC_RELAXED) != KVC_SLOT_USED &&
            !(atomic_load_explicit(&seg->rooms[i].seq, memory_order_relaxed) & 1))
            continue;
        kvc_err e = KVC_OK;
        int used = read_slot(seg, i, &r, &e);
        if (e)
            return e;
        if (!used || (state_filter >= 0 && (int)kvc__room_state(&r) != state_filter))
            continue;
        if (n < cap)
            fill_info(&r, -1, &out[n]);
        n++;
    }
    *count = n;
    return KVC_OK;
}

/* kvc_poll_allreduce's read (collective_poll.c): whether kvcoord itself
 * failed room - Failed with a record no rank process made - judging it as
 * kvc_room_get() does (a dead participant or a TTL passed is applied under
 * the lock first), copying only what that needs.  Errors: kvc_room_get's. */
kvc_err kvc__room_failed_by_kvcoord(kvc_segment *seg, uint64_t room, bool *ours, uint64_t *ttl_at)
{
    *ours = false;
    *ttl_at = 0;
    KVC_ROOM_ARG(room);
    uint64_t h = kvc__room_hash(room);
    uint32_t s = kvc__room_stripe(h);
    kvc_room copy, *where = NULL;
    kvc_err e = read_unlocked(seg, s, h, room, &copy, &where);
    if (e == KVC_E_NOENT)
        return kvc__no_room(room);
    kvc__verdict v;
    if (!e)
        judge(seg, where, &copy, &v);
    if (e || v.what) { /* a writer inside, or something to apply: kvc_room_get's way */
        kvc_room_info ri;
        if ((e = kvc_room_get(seg, room, -1, &ri)))
            return e;
        *ours = ri.state == KVC_POLL_FAILED && ri.has_failure && ri.failure.origin_pid == 0;
        return KVC_OK;
    }
    *ours = kvc__room_state(&copy) == KVC_POLL_FAILED && copy.has_failure &&
            copy.failure.origin_pid == 0;
    if (!*ours)
        *ttl_at = copy.terminal >= 0 ? UINT64_MAX : kvc__room_ttl_at(seg, &copy);
    return KVC_OK;
}
