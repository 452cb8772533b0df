/*
 * rooms_internal.h - what the room files share, and nothing else uses.
 *
 * The rooms (per-request KVPoll state and failure records shared by every
 * rank of the node) are written in six files, one concern each:
 *   rooms.c           the public writers (open, state, sync, fail, release,
 *                     epoch) as operations run under a stripe lock
 *   rooms_table.c     the stripe table: probing, tombstones, room creation,
 *                     the reservations counted against max rooms
 *   rooms_update.c    one update: the stripe's undo record, the room's
 *                     seqlock window, and the stripe's recovery
 *   rooms_ring.c      failure records: the room's own and the node's
 *                     failure ring (claim, write, read, text)
 *   rooms_liveness.c  failing a room for what a reader found (a dead
 *                     participant, a TTL passed), the TTL sweep, and
 *                     failing a dead process's rooms
 *   rooms_read.c      lock-free reading (kvc_room_get, kvc_room_wait,
 *                     kvc_room_list) and judging what was read
 * and this header's kvc__with_stripe() runs an operation under a room's
 * stripe lock.
 *
 * The room table is split into KVC_ROOM_STRIPES stripes by the top bits of
 * the room id's hash; each stripe has an open-addressing index of its own
 * (linear probing that wraps inside the stripe) naming the room slot each
 * room sits in, its room slots (a creator takes one from its process's
 * part first), and its own robust mutex, count, change epoch and undo
 * record (kvc_room_stripe, layout.h).
 *
 * The lock rule, for every file: writers hold their room's stripe lock
 * (kvc__stripe_lock; one stripe at a time, never with another lock of the
 * segment taken inside it); every change of a room runs inside one
 * kvc__upd (kvc__upd_begin .. kvc__upd_commit).  Readers take no lock and
 * make no system call on the fast path; a reader that keeps seeing an odd
 * seq takes the stripe lock, which recovers a dead writer.  Functions
 * marked "(lock held)" must be called with stripe s locked.
 *
 * The small helpers below are static inline so that the hot paths (every
 * update probes a stripe and releases its lock) stay as they were when the
 * rooms were one file: no call out of line.
 */
#ifndef KVC_ROOMS_INTERNAL_H
#define KVC_ROOMS_INTERNAL_H

#include "internal.h"
#include "seqlock.h"

/* Tries at claiming a failure ring entry another writer holds, and at
 * reading one being written, before giving up on it (rooms_ring.c). */
#define KVC__RING_SPINS 2000

/* ---- addressing ---------------------------------------------------------- */

static inline kvc_room *kvc__stripe_table(kvc_segment *seg, uint32_t s)
{
    return seg->rooms + (size_t)s * seg->hdr->stripe_slots;
}

/* Stripe s's index entries (layout.h). */
static inline _Atomic uint64_t *kvc__stripe_index(kvc_segment *seg, uint32_t s)
{
    return seg->room_index + (size_t)s * seg->hdr->stripe_slots;
}

static inline uint64_t kvc__ix_used(uint64_t h, uint32_t slot)
{
    return (uint64_t)kvc__ix_tag(h) << 32 | (slot + 2u);
}

/* The room slot index entry e names when it may hold the room of hash h
 * (used, the tag matches, the slot within the stripe's n); else UINT32_MAX. */
static inline uint32_t kvc__ix_slot(uint64_t e, uint64_t h, uint32_t n)
{
    uint32_t b = (uint32_t)e - 2u;
    return (uint32_t)(e >> 32) == kvc__ix_tag(h) && (uint32_t)e >= 2 && b < n ? b : UINT32_MAX;
}

static inline uint32_t kvc__slot_next(uint32_t i, uint32_t n) { return i + 1 == n ? 0 : i + 1; }

static inline uint32_t kvc__slot_prev(uint32_t i, uint32_t n) { return i == 0 ? n - 1 : i - 1; }

/* Bytes of r an update saves: the head and the participants it has; with
 * its failure record too when the update writes one. */
static inline size_t kvc__room_len_of(uint32_t participants)
{
    uint32_t n = participants <= KVC_ROOM_MAX_PARTICIPANTS ? participants : 0;
    return offsetof(kvc_room, part) + n * sizeof(kvc_room_part);
}

static inline size_t kvc__room_len(const kvc_room *r) { return kvc__room_len_of(r->participants); }

static inline size_t kvc__room_len_failure(void) { return offsetof(kvc_room, checked_ms); }

/* When room r (a copy or the slot) times out: its last update plus the
 * segment's room TTL, in kvc__seg_mono_coarse_ns()'s clock (CLOCK_MONOTONIC
 * ns).  A room idle past it fails with the TTL's reason. */
static inline uint64_t kvc__room_ttl_at(const kvc_segment *seg, const kvc_room *r)
{
    return r->updated_mono + (uint64_t)seg->hdr->room_ttl_ms * 1000000ull;
}

/* ---- locked access ------------------------------------------------------- */

/* One room fewer in stripe s (lock held; read unlocked by rooms_in_use). */
static inline void kvc__stripe_uncount(kvc_segment *seg, uint32_t s)
{
    kvc_room_stripe *st = &seg->stripes[s];
    __atomic_store_n(&st->rooms_live, st->rooms_live - 1, __ATOMIC_RELAXED);
}

/* Pauses a writer spends on a held stripe before it sleeps on the mutex
 * (kvc__lock_spin; some 10-60 us in all, by CPU). */
#define KVC__STRIPE_SPINS 1000

/* Take stripe s's lock.  A stripe is held for an update's fraction of a
 * microsecond, while sleeping on a held robust mutex costs the waiter a
 * futex wait and the holder a futex wake, each a system call, the first a
 * reschedule: two processes cycling rooms on one segment meet in a stripe
 * every few dozen cycles (issue 30), so a writer that finds it held
 * watches it a bounded while first. */
static inline kvc_err kvc__stripe_lock(kvc_segment *seg, uint32_t s)
{
    return kvc__lock_spin(seg, KVC_LOCK_ROOMS + (int)s, KVC__STRIPE_SPINS);
}

/* Release stripe s, waking its room waiters when its epoch moved. */
static inline void kvc__stripe_unlock(kvc_segment *seg, uint32_t s, uint32_t epoch_before)
{
    kvc_room_stripe *st = &seg->stripes[s];
    bool changed = atomic_load(&st->epoch) != epoch_before;
    kvc__unlock(seg, KVC_LOCK_ROOMS + (int)s);
    if (changed && atomic_load(&st->waiters))
        kvc__futex_wake_all(&st->epoch);
}

/* Slot of room id in stripe s (lock held), or NULL: the index probed from
 * the id's home. */
static inline kvc_room *kvc__stripe_find(kvc_segment *seg, uint32_t s, uint64_t h, uint64_t id)
{
    uint32_t n = seg->hdr->stripe_slots, i = kvc__room_home(h, n);
    kvc_room *t = kvc__stripe_table(seg, s);
    _Atomic uint64_t *ix = kvc__stripe_index(seg, s);
    for (uint32_t k = 0; k < n; k++, i = kvc__slot_next(i, n)) {
        uint64_t e = atomic_load_explicit(&ix[i], memory_order_relaxed);
        if (e == KVC_IX_FREE)
            return NULL;
        uint32_t b = kvc__ix_slot(e, h, n);
        if (b != UINT32_MAX && t[b].slot == KVC_SLOT_USED && t[b].id == id)
            return &t[b];
    }
    return NULL;
}

/* The index entry of room r (stripe s, used; lock held): the one its ix
 * names when that names r, else found by probing for its id; NULL when
 * none does (a damaged index). */
static inline _Atomic uint64_t *kvc__room_entry(kvc_segment *seg, uint32_t s, const kvc_room *r)
{
    uint32_t n = seg->hdr->stripe_slots, b = (uint32_t)(r - kvc__stripe_table(seg, s));
    _Atomic uint64_t *ix = kvc__stripe_index(seg, s);
    uint64_t h = kvc__room_hash(r->id);
    if (r->ix < n && kvc__ix_slot(atomic_load(&ix[r->ix]), h, n) == b)
        return &ix[r->ix];
    uint32_t i = kvc__room_home(h, n);
    for (uint32_t k = 0; k < n; k++, i = kvc__slot_next(i, n)) {
        uint64_t e = atomic_load(&ix[i]);
        if (e == KVC_IX_FREE)
            return NULL;
        if (kvc__ix_slot(e, h, n) == b)
            return &ix[i];
    }
    return NULL;
}

/* ---- rooms_table.c: the stripe table (lock held unless said) ------------- */

/* After a room's deletion committed (its slot free): its index entry e
 * (NULL: none) made a tombstone, and tombstones before a free entry turned
 * back into free entries.  Until then the entry names a free slot, which
 * readers pass over as any other room's; a writer that dies in between
 * leaves it to the stripe's recovery, which makes such entries tombstones
 * (rooms_update.c). */
void kvc__entry_delete(kvc_segment *seg, uint32_t s, _Atomic uint64_t *e);
/* Create room id in stripe s with participants (their states Bootstrapping,
 * nobody joined), reserving it against max rooms; KVC_E_FULL (message set)
 * when the table or the stripe is full.  A room of an id the stripe evicted
 * is created Failed with its failure from the ring, while it is there. */
kvc_err kvc__room_create(kvc_segment *seg, uint32_t s, uint64_t h, uint64_t id,
                         uint32_t participants, kvc_room **out);
/* Find room (stripe s), creating it with participants when participants != 0
 * and it does not exist; KVC_E_NOENT (kvc__no_room's message) otherwise. */
kvc_err kvc__room_find_or_create(kvc_segment *seg, uint32_t s, uint64_t h, uint64_t room,
                                 uint32_t participants, kvc_room **out);
/* A room reclaimed: its reservation given back (into seg's credit). */
void kvc__room_unreserve(kvc_segment *seg);
/* KVC_E_NOENT with the message that room does not exist (no lock). */
kvc_err kvc__no_room(uint64_t room);

/* Evict the oldest Failed room no participant ever joined (its failure
 * stays in the ring), to make room for a new room in stripe s: from stripe
 * s when it is full, else (the table is full) from any stripe.  Takes each
 * stripe's lock in turn, never two at once; called without a lock.
 * *evicted: whether one was.  Errors: those of kvc__stripe_lock. */
kvc_err kvc__room_evict(kvc_segment *seg, uint32_t s, bool *evicted);

/* rooms_ring.c: the newest failure record of room in the ring (no lock;
 * copied under its claim word), false when none is left. */
bool kvc__ring_find(kvc_segment *seg, uint64_t room, kvc_failure_rec *out);
/* Give room r of stripe s (lock held, just created) failure record f, read
 * from the ring, in one update (no new ring entry): a late joiner of an
 * evicted room sees its failure. */
void kvc__room_refail(kvc_segment *seg, uint32_t s, kvc_room *r, const kvc_failure_rec *f);

/* An operation run under room's stripe lock: s its stripe, h its hash. */
typedef kvc_err (*kvc__locked_op)(kvc_segment *seg, uint32_t s, uint64_t h, void *arg);
/* Take room's stripe lock, run op, release it (waking the stripe's waiters
 * when it changed); a full table is swept (kvc_room_sweep, every stripe,
 * one lock at a time) and op tried once more; still full, the oldest
 * Failed room nobody joined is evicted (kvc__room_evict) and op tried
 * again.  Called without a lock.
 * Inline: each public call's op is then a direct call, as when the rooms
 * were one file. */
static inline kvc_err kvc__with_stripe(kvc_segment *seg, uint64_t room, kvc__locked_op op,
                                       void *arg)
{
    uint64_t h = kvc__room_hash(room);
    uint32_t s = kvc__room_stripe(h);
    for (int attempt = 0;; attempt++) {
        kvc_err e = kvc__stripe_lock(seg, s);
        if (e)
            return e;
        uint32_t ep = atomic_load(&seg->stripes[s].epoch);
        e = op(seg, s, h, arg);
        kvc__stripe_unlock(seg, s, ep);
        if (e != KVC_E_FULL || attempt > 2)
            return e;
        size_t reclaimed = 0;
        bool evicted = false;
        if (attempt == 0 && !kvc_room_sweep(seg, &reclaimed) && reclaimed)
            continue;
        kvc_err ev = kvc__room_evict(seg, s, &evicted);
        if (ev || !evicted)
            return ev ? ev : e;
    }
}

/* ---- rooms_update.c: one update (lock held) ------------------------------ */

typedef struct kvc__upd {
    kvc_segment *seg;
    uint32_t s;
    kvc_room_stripe *st;
    kvc_room *r;            /* the slot, in the segment */
    size_t len;             /* bytes of it the update saves and rewrites */
    _Atomic uint64_t *ix;   /* the index entry it rewrites, or NULL */
    uint64_t ix_new;        /* what it writes there */
    kvc_failure_slot *ring; /* claimed ring entry, or NULL */
    uint64_t ring_n;        /* 1 + its index */
    bool failure;           /* it writes a failure record (ring entry or not) */
    kvc_room w;             /* the new bytes, made here (private) first */
} kvc__upd;

/* Save what the update changes (len bytes of r; a claimed failure ring
 * entry when with_ring) in stripe s's undo record and mark it valid.
 * Returns the private copy of those bytes the caller changes. */
kvc_room *kvc__upd_begin(kvc__upd *u, kvc_segment *seg, uint32_t s, kvc_room *r, size_t len,
                         int with_ring);
/* After kvc__upd_begin: the update also stores v into index entry e (its
 * old value saved in the undo record first). */
void kvc__upd_index(kvc__upd *u, _Atomic uint64_t *e, uint64_t v);
/* Write the private copy into the room inside its seqlock window, clear
 * the undo, release the ring entry, move the epochs.  now_real: the
 * header's "updated" time (CLOCK_REALTIME ns). */
void kvc__upd_commit(kvc__upd *u, uint64_t now_real);

/* ---- rooms_ring.c: failure records (lock held) --------------------------- */

/* Claim the next failure ring entry for u's stripe (its offset in the
 * undo record first); NULL when another writer still holds it. */
kvc_failure_slot *kvc__ring_claim(kvc__upd *u);
/* Release a claimed entry (its claim word even again). */
void kvc__ring_release(kvc_failure_slot *f);
/* An append that will not be made: uncount it if it is still the last. */
void kvc__ring_give_back(kvc_header *h, kvc_undo *un);
/* Copy at most KVC_REASON_MAX bytes of src (NULL: ""), never cutting a
 * UTF-8 sequence (no lock). */
void kvc__copy_reason(char *dst, const char *src);
/* Inside an update with a ring entry: write the room's failure record
 * (replacing any it had), make it Failed, and copy the record into the
 * ring entry when one was claimed. */
void kvc__put_failure(kvc__upd *u, uint32_t origin, int32_t code, const char *reason, int32_t pid,
                      uint64_t time_ns, const char *node, uint32_t flags);
/* This segment's node name (kvc_segment_set_node) into out ("" outside a
 * cluster); no lock. */
void kvc__node_name(kvc_segment *seg, char out[KVC_NODE_NAME_MAX + 1]);
/* What a reason kvcoord writes says of a participant's process: "pid 42"
 * or "pid 42 on node A" (no lock). */
void kvc__pid_text(kvc_segment *seg, int32_t pid, char *buf, size_t cap);
/* Record the first failure of room r in stripe s in an update of its own;
 * 1 if kept, 0 when r already failed or succeeded. */
int kvc__record_failure(kvc_segment *seg, uint32_t s, kvc_room *r, uint32_t origin, int32_t code,
                        const char *reason, int32_t pid);

/* ---- rooms_liveness.c: failing a room for what a reader found ------------ */

/* What a reader found wrong with a room it read without the lock. */
typedef struct kvc__verdict {
    int what; /* 0 nothing, 1 a participant is dead, 2 the TTL passed */
    uint32_t rank;
    int32_t pid;
    uint64_t start;
    int32_t shown_pid; /* pid as people know it (kvc__shown_pid) */
    char how[KVC_HOW_MAX + 1];
} kvc__verdict;

/* Fail r (stripe s, lock held) for what v says, if it still holds. */
void kvc__room_apply_verdict(kvc_segment *seg, uint32_t s, kvc_room *r, const kvc__verdict *v);

#endif
