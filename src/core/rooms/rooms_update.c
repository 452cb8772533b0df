/*
 * rooms_update.c - one update of a room: the stripe's undo record, the
 * room's seqlock window, and the stripe's recovery.
 *
 * Every change of a room (rooms.c's writers, rooms_table.c's creation,
 * rooms_ring.c's failure records, rooms_liveness.c's sweep) runs as
 *   save the bytes about to change (the room, and the failure ring entry
 *   it appends to, claimed first) -> undo valid -> (a creation: save its
 *   index entry) -> compute the new bytes in a private copy -> room seq
 *   odd -> copy them in -> (a creation: the index entry) -> undo clear ->
 *   room seq even (-> a deletion: its index entry a tombstone).
 * A writer that dies before the undo is cleared is rolled back by the
 * stripe's recovery (stripe_recover, run by the next locker under
 * EOWNERDEAD); one that dies after it left complete new bytes, and recovery
 * only evens the seq.  Either way a reader sees the old room or the new
 * one, never a mix.
 *
 * Lock rule: the room's stripe lock is held throughout (kvc__upd_begin to
 * kvc__upd_commit; stripe_recover runs inside kvc__lock).  Called by the
 * other rooms_*.c files through rooms_internal.h; kvc__rooms_register by
 * kvc_open (session.c).
 */
#include <string.h>

#include "rooms_internal.h"

/* Save what the update changes (len bytes of r; the ring entry when
 * with_ring) and mark the undo valid.  Returns the private copy of those
 * bytes the update then changes; kvc__upd_commit() copies them into r. */
kvc_room *kvc__upd_begin(kvc__upd *u, kvc_segment *seg, uint32_t s, kvc_room *r, size_t len,
                         int with_ring)
{
    kvc__assert(kvc__lock_held(seg, KVC_LOCK_ROOMS + (int)s));
    u->seg = seg;
    u->s = s;
    u->st = &seg->stripes[s];
    u->r = r;
    u->len = len;
    u->ring = with_ring ? kvc__ring_claim(u) : NULL;
    u->failure = false;
    u->ix = NULL;
    kvc_undo *un = &u->st->undo;
    atomic_store_explicit(&un->ix_off, 0, memory_order_relaxed);
    un->room_off = (uint64_t)((unsigned char *)r - seg->base);
    un->room_len = len;
    /* Word copies (seqlock.h's; under the lock plain copies would do, but
     * gcc makes a variable-length memcpy of these aligned rooms a string
     * instruction that takes longer to start than a room's few words). */
    kvc_seq_load(&u->w, r, len);
    kvc_seq_store(&un->room, &u->w, len);
    if (u->ring)
        memcpy(&un->ring, u->ring, sizeof *u->ring);
    un->rooms_live = u->st->rooms_live;
    atomic_store_explicit(&un->valid, 1, memory_order_release);
    KVC_INJECT("room.undo_saved");
    return &u->w;
}

void kvc__upd_index(kvc__upd *u, _Atomic uint64_t *e, uint64_t v)
{
    kvc_undo *un = &u->st->undo;
    un->ix_old = atomic_load_explicit(e, memory_order_relaxed);
    /* The offset last: recovery restores an entry only once its old value
     * is saved (the entry itself changes only in kvc__upd_commit). */
    atomic_store_explicit(&un->ix_off, (uint64_t)((unsigned char *)e - u->seg->base),
                          memory_order_release);
    u->ix = e;
    u->ix_new = v;
}

/* Write the new bytes inside r's seqlock window: seq odd, the bytes (in
 * two halves, so that a crash test can stop a writer between them), the
 * index entry, the undo cleared (the new bytes are whole), seq even, the ring entry
 * released. */
void kvc__upd_commit(kvc__upd *u, uint64_t now_real)
{
    kvc_room *r = u->r;
    unsigned char *dst = (unsigned char *)r + sizeof r->seq;
    const unsigned char *src = (const unsigned char *)&u->w + sizeof r->seq;
    size_t n = u->len - sizeof r->seq;
    size_t half = ((n / 2) & ~(size_t)7) + sizeof r->seq; /* dst + half: word-aligned */
    if (half > n)
        half = n;
    kvc_seq_write_begin(&r->seq);
    KVC_INJECT("room.seq_odd");
    kvc_seq_store(dst, src, half);
    KVC_INJECT("room.half_written");
    kvc_seq_store(dst + half, src + half, n - half);
    /* The index entry after the room's bytes: a reader that finds the room
     * through it finds them written (or the seq still odd). */
    if (u->ix) {
        atomic_store_explicit(u->ix, u->ix_new, memory_order_release);
        KVC_INJECT("room.index_written");
    }
    KVC_INJECT("room.before_commit");
    atomic_store_explicit(&u->st->undo.valid, 0, memory_order_release);
    KVC_INJECT("room.committed");
    kvc_seq_write_end(&r->seq);
    if (u->ring) {
        kvc__ring_release(u->ring);
        u->st->undo.ring_off = 0;
    }
    if (u->ring || u->failure) {
        /* A failure record (with its ring entry, or without: the ring's
         * entry was held, or the record came back from the ring) moves the
         * failure epoch: kvc_room_wait_change()ers wake (kvcoordd's cluster
         * view publishes it at once: one system call per failure), and
         * kvc_poll_allreduce's folds stop trusting the rooms they found
         * clean. */
        atomic_fetch_add(&u->seg->hdr->room_epoch, 1);
        kvc__futex_wake_all(&u->seg->hdr->room_epoch);
    }
    atomic_fetch_add(&u->st->epoch, 1);
    /* The header's "updated" is for people: at most one store per ms, so
     * the writers of all stripes do not fight over its cache line. */
    if (now_real > atomic_load_explicit(&u->seg->hdr->updated_ns, memory_order_relaxed) + 1000000)
        atomic_store_explicit(&u->seg->hdr->updated_ns, now_real, memory_order_relaxed);
}

/* Stripe recovery, with the stripe lock held after EOWNERDEAD (or on
 * demand by repair): roll back an interrupted update, finish a ring entry
 * the dead writer claimed, even every seq it left odd, make an index entry
 * that names no room of its own a tombstone, recount the rooms. */
static void stripe_recover(kvc_segment *seg, int id)
{
    if (id < KVC_LOCK_ROOMS || id >= KVC_LOCK_COUNT)
        return;
    uint32_t s = (uint32_t)(id - KVC_LOCK_ROOMS), n = seg->hdr->stripe_slots;
    kvc_room_stripe *st = &seg->stripes[s];
    kvc_undo *u = &st->undo;
    kvc_room *t = kvc__stripe_table(seg, s);
    _Atomic uint64_t *ix = kvc__stripe_index(seg, s);
    uint64_t lo = (uint64_t)((unsigned char *)t - seg->base), hi = lo + (uint64_t)n * sizeof *t;
    if (atomic_load(&u->valid)) {
        if (u->room_off >= lo && u->room_off < hi && (u->room_off - lo) % sizeof *t == 0 &&
            u->room_len >= sizeof u->room.seq && u->room_len <= sizeof u->room) {
            kvc_room *r = (kvc_room *)(seg->base + u->room_off);
            uint32_t saved = atomic_load(&u->room.seq);
            /* Everything but the seq, which stays odd until the bytes are
             * back (a window of this process's: seqlock.h). */
            atomic_store_explicit(&r->seq, saved | 1, memory_order_relaxed);
            kvc_seq_write_prepare();
            kvc_seq_store((unsigned char *)r + sizeof r->seq,
                          (unsigned char *)&u->room + sizeof r->seq, u->room_len - sizeof r->seq);
            atomic_store_explicit(&r->seq, (saved | 1) + 1, memory_order_release);
        }
        uint64_t xo = atomic_load(&u->ix_off), xlo = (uint64_t)((unsigned char *)ix - seg->base);
        if (xo >= xlo && xo < xlo + (uint64_t)n * sizeof *ix && (xo - xlo) % sizeof *ix == 0)
            atomic_store_explicit((_Atomic uint64_t *)(seg->base + xo), u->ix_old,
                                  memory_order_release);
        if (u->ring_off) {
            kvc_failure_slot *f = (kvc_failure_slot *)(seg->base + u->ring_off);
            uint64_t c = atomic_load(&f->claim);
            if (((c >> 32) & 1) && (uint32_t)c == s + 1 &&
                atomic_load(&u->ring.claim) == c) { /* saved after our claim */
                kvc_seq_write_prepare();            /* after the (odd) claim, as its writer */
                kvc_seq_store(&f->n, &u->ring.n, sizeof f->n);
                kvc_seq_store(&f->rec, &u->ring.rec, sizeof f->rec);
                kvc__ring_give_back(seg->hdr, u);
            }
        }
        atomic_store(&u->valid, 0);
    }
    if (u->ring_off && u->ring_off >= seg->hdr->failures_off &&
        u->ring_off < seg->hdr->failures_off + KVC_FAILURE_RING * sizeof(kvc_failure_slot)) {
        kvc_failure_slot *f = (kvc_failure_slot *)(seg->base + u->ring_off);
        uint64_t c = atomic_load(&f->claim);
        if (((c >> 32) & 1) && (uint32_t)c == s + 1) {
            /* Claimed, and either written and committed (it holds its
             * index) or never written (died before its undo was saved). */
            if (f->n != u->ring_n)
                kvc__ring_give_back(seg->hdr, u);
            kvc__ring_release(f);
        }
    }
    u->ring_off = 0;
    uint32_t live = 0;
    for (uint32_t i = 0; i < n; i++) {
        uint32_t q = atomic_load(&t[i].seq);
        if (q & 1) /* the writer died after its undo was cleared: bytes complete */
            atomic_store(&t[i].seq, q + 1);
        live += t[i].slot == KVC_SLOT_USED;
    }
    /* An entry that does not name a used slot holding it (a deletion whose
     * writer died before the entry was made a tombstone; or damage) becomes
     * a tombstone: the probe paths stay, and the entry can be reused. */
    for (uint32_t i = 0; i < n; i++) {
        uint64_t e = atomic_load(&ix[i]);
        if (e == KVC_IX_FREE || e == KVC_IX_TOMB)
            continue;
        uint32_t b = (uint32_t)e - 2u;
        if ((uint32_t)e < 2 || b >= n || t[b].slot != KVC_SLOT_USED || t[b].ix != i ||
            kvc__ix_slot(e, kvc__room_hash(t[b].id), n) != b)
            atomic_store(&ix[i], KVC_IX_TOMB);
    }
    __atomic_store_n(&st->rooms_live, live, __ATOMIC_RELAXED);
    atomic_fetch_add(&st->epoch, 1);
    kvc__futex_wake_all(&st->epoch);
    atomic_fetch_add(&seg->hdr->room_epoch, 1);
    kvc__futex_wake_all(&seg->hdr->room_epoch);
}

void kvc__rooms_register(kvc_segment *seg)
{
    for (int i = 0; i < (int)KVC_ROOM_STRIPES; i++)
        kvc__lock_register(seg, KVC_LOCK_ROOMS + i, stripe_recover);
}
