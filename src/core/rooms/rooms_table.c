/*
 * rooms_table.c - the room table: KVC_ROOM_STRIPES stripes, each an
 * open-addressing index of its own (linear probing that wraps inside the
 * stripe, kvc__stripe_find in rooms_internal.h) naming the room slot of
 * each room, room creation and the reservations that hold the table to max
 * rooms.
 *
 * A new room takes a free slot of its creator's part of the stripe first
 * (free_slot): two processes creating rooms in turn then each write their
 * own slots' lines, not lines the other wrote last (issue 30; the index
 * entry, 8 bytes, is all they share of a room they do not both join).
 * Deletion leaves a tombstone in the index, and every tombstone followed
 * by a free entry is turned back into a free entry (a probe reaching it
 * would stop at the next entry anyway), so tombstones do not pile up.  A room is reserved
 * against max rooms before it is created: from the handle's credit, else
 * from the header's rooms_reserved in batches (layout.h), the exact count
 * deciding at max rooms.
 *
 * Lock rule: a function given a stripe s runs with that stripe's lock held
 * (kvc__with_stripe, rooms_internal.h, takes and releases it); kvc__room_find and
 * kvc__room_state take none (the caller holds the lock, or reads a copy);
 * the reservations are atomics of the header and of the handle.  Called by
 * rooms.c, rooms_read.c and rooms_liveness.c; kvc__room_state and
 * kvc__room_find also by src/inspect/ and white-box tests,
 * kvc__rooms_return_credit by kvc_close (session.c).
 */
#include <string.h>

#include "rooms_internal.h"

kvc_room *kvc__room_find(kvc_segment *seg, uint64_t id)
{
    uint64_t h = kvc__room_hash(id);
    return kvc__stripe_find(seg, kvc__room_stripe(h), h, id);
}

/* First reusable index entry on id's probe path in stripe s (after find
 * failed): its position, or UINT32_MAX. */
static uint32_t find_free_entry(kvc_segment *seg, uint32_t s, uint64_t h)
{
    uint32_t n = seg->hdr->stripe_slots, i = kvc__room_home(h, n);
    _Atomic uint64_t *ix = kvc__stripe_index(seg, s);
    for (uint32_t k = 0; k < n; k++, i = kvc__slot_next(i, n)) {
        uint64_t e = atomic_load_explicit(&ix[i], memory_order_relaxed);
        if (e == KVC_IX_FREE || e == KVC_IX_TOMB)
            return i;
    }
    return UINT32_MAX;
}

/* A free room slot of stripe s for a room this process creates: the first
 * free one of its own part (KVC_ROOM_PARTS parts of the stripe's slots, by
 * process table slot), so that it reuses the lines it wrote itself and not
 * another process's; else the first free one after that part, wrapping
 * (any free slot: a creation never fails that a free slot allows). */
static kvc_room *free_slot(kvc_segment *seg, uint32_t s)
{
    uint32_t n = seg->hdr->stripe_slots;
    uint32_t who = seg->proc_slot >= 0 ? (uint32_t)seg->proc_slot : (uint32_t)seg->pid;
    uint32_t i = (uint32_t)((uint64_t)(who % KVC_ROOM_PARTS) * n / KVC_ROOM_PARTS);
    kvc_room *t = kvc__stripe_table(seg, s);
    for (uint32_t k = 0; k < n; k++, i = kvc__slot_next(i, n))
        if (t[i].slot != KVC_SLOT_USED)
            return &t[i];
    return NULL;
}

/* A deleted room's entry e a tombstone, then the tombstones before a free
 * entry turned back into free entries, each step a single store that
 * leaves every probe's result unchanged (a probe stops at the free entry
 * that follows anyway). */
void kvc__entry_delete(kvc_segment *seg, uint32_t s, _Atomic uint64_t *e)
{
    if (!e)
        return;
    atomic_store_explicit(e, KVC_IX_TOMB, memory_order_release);
    KVC_INJECT("room.entry_tombed");
    _Atomic uint64_t *ix = kvc__stripe_index(seg, s);
    uint32_t n = seg->hdr->stripe_slots, i = (uint32_t)(e - ix);
    if (atomic_load_explicit(&ix[kvc__slot_next(i, n)], memory_order_relaxed) != KVC_IX_FREE)
        return;
    for (uint32_t k = 0; k < n && atomic_load_explicit(&ix[i], memory_order_relaxed) == KVC_IX_TOMB;
         k++) {
        atomic_store_explicit(&ix[i], KVC_IX_FREE, memory_order_release);
        KVC_INJECT("room.tomb_freed");
        i = kvc__slot_prev(i, n);
    }
}

/* ---- room state --------------------------------------------------------- */

kvc_poll kvc__room_state(const kvc_room *r)
{
    if (r->terminal >= 0)
        return (kvc_poll)r->terminal;
    int min = KVC_POLL_SUCCESS;
    for (uint32_t i = 0; i < r->participants && i < KVC_ROOM_MAX_PARTICIPANTS; i++) {
        int s = r->part[i].state < 0 ? KVC_POLL_BOOTSTRAPPING : r->part[i].state;
        if (s < min)
            min = s;
    }
    return (kvc_poll)min;
}

kvc_err kvc__no_room(uint64_t room)
{
    return kvc__fail(KVC_E_NOENT,
                     "no room %llu (never opened, released by all, or "
                     "reclaimed after its TTL)",
                     (unsigned long long)room);
}

/* ---- creation ----------------------------------------------------------- */

/* The rooms in use: the sum of the stripes' counts (each read unlocked). */
static uint32_t rooms_in_use(kvc_segment *seg)
{
    uint32_t n = 0;
    for (uint32_t s = 0; s < KVC_ROOM_STRIPES; s++)
        n += __atomic_load_n(&seg->stripes[s].rooms_live, __ATOMIC_RELAXED);
    return n;
}

/* Reservations a handle takes from the header at a time: 1 (every room
 * writes rooms_reserved, as before) for small tables, up to 32 for large
 * ones, where a process that dies holding some leaves the count at most
 * 2 x 32 high (high is the safe side: at max rooms the exact count
 * decides). */
static uint32_t credit_batch(const kvc_header *hd)
{
    uint32_t b = hd->max_rooms / 1024;
    return b < 1 ? 1 : b > 32 ? 32 : b;
}

/* Reserve a room for a creation: from seg's credit while the header's
 * count is within max rooms (then the credit is a room the count already
 * holds), else from the header, a batch at a time while that stays within
 * max rooms, else one, with the exact count deciding at max rooms.  False
 * when the table is full. */
static bool reserve_room(kvc_segment *seg)
{
    kvc_header *hd = seg->hdr;
    uint32_t batch = credit_batch(hd);
    uint32_t c = atomic_load_explicit(&seg->room_credit, memory_order_relaxed);
    if (c && atomic_load_explicit(&hd->rooms_reserved, memory_order_relaxed) <= hd->max_rooms)
        while (c)
            if (atomic_compare_exchange_weak_explicit(&seg->room_credit, &c, c - 1,
                                                      memory_order_relaxed, memory_order_relaxed))
                return true;
    if (batch > 1 &&
        atomic_load_explicit(&hd->rooms_reserved, memory_order_relaxed) + batch <= hd->max_rooms) {
        if (atomic_fetch_add(&hd->rooms_reserved, batch) + batch <= hd->max_rooms) {
            atomic_fetch_add_explicit(&seg->room_credit, batch - 1, memory_order_relaxed);
            return true;
        }
        atomic_fetch_sub(&hd->rooms_reserved, batch);
    }
    if (atomic_fetch_add(&hd->rooms_reserved, 1) >= hd->max_rooms &&
        rooms_in_use(seg) >= hd->max_rooms) {
        atomic_fetch_sub(&hd->rooms_reserved, 1);
        return false;
    }
    return true;
}

/* A room reclaimed (or a reservation not used): into seg's credit; past two
 * batches, one batch goes back to the header. */
void kvc__room_unreserve(kvc_segment *seg)
{
    kvc_header *hd = seg->hdr;
    uint32_t batch = credit_batch(hd);
    if (batch == 1) {
        atomic_fetch_sub(&hd->rooms_reserved, 1);
        return;
    }
    uint32_t c = atomic_fetch_add_explicit(&seg->room_credit, 1, memory_order_relaxed) + 1;
    if (c > 2 * batch &&
        atomic_compare_exchange_strong_explicit(&seg->room_credit, &c, c - batch,
                                                memory_order_relaxed, memory_order_relaxed))
        atomic_fetch_sub(&hd->rooms_reserved, batch);
}

void kvc__rooms_return_credit(kvc_segment *seg)
{
    uint32_t c = atomic_exchange(&seg->room_credit, 0);
    if (c)
        atomic_fetch_sub(&seg->hdr->rooms_reserved, c);
}

/* Create room id in stripe s (lock held).  KVC_E_FULL when the table or
 * the stripe is full (kvc__with_stripe then sweeps once and tries again). */
kvc_err kvc__room_create(kvc_segment *seg, uint32_t s, uint64_t h, uint64_t id,
                         uint32_t participants, kvc_room **out)
{
    kvc_header *hd = seg->hdr;
    kvc_room_stripe *st = &seg->stripes[s];
    /* Reserve first (a writer dying after this leaves the reservation
     * high, never low); at max rooms the exact count decides. */
    if (!reserve_room(seg))
        return kvc__fail(KVC_E_FULL,
                         "room table of segment %s is full: %u active rooms (max "
                         "rooms %u); no active room is evicted",
                         seg->name, rooms_in_use(seg), hd->max_rooms);
    uint32_t at = st->rooms_live + 1 < hd->stripe_slots ? find_free_entry(seg, s, h) : UINT32_MAX;
    kvc_room *r = at != UINT32_MAX ? free_slot(seg, s) : NULL;
    if (!r) {
        kvc__room_unreserve(seg);
        return kvc__fail(KVC_E_FULL,
                         "room table stripe %u of segment %s is full (%u rooms hash to it, of "
                         "%u active)",
                         s, seg->name, st->rooms_live, rooms_in_use(seg));
    }
    kvc__upd u;
    uint64_t now = kvc__now_coarse_ns();
    /* The head and the participants it will have (rolled back, the slot is
     * free, or a tombstone, again and nobody reads its participants).  Only
     * those participants are initialised (none reads beyond), and the
     * failure record is written when there is one. */
    kvc_room *w = kvc__upd_begin(&u, seg, s, r, kvc__room_len_of(participants), 0);
    w->id = id;
    w->participants = participants;
    w->terminal = -1;
    w->has_failure = 0;
    w->ix = at;
    w->opened_ns = w->updated_ns = now;
    w->updated_mono = kvc__seg_mono_coarse_ns();
    memset(w->part, 0, participants * sizeof *w->part);
    for (uint32_t p = 0; p < participants; p++) {
        w->part[p].state = -1;
        w->part[p].proc_slot = -1;
    }
    KVC_INJECT("room.creating");
    w->slot = KVC_SLOT_USED;
    kvc__upd_index(&u, &kvc__stripe_index(seg, s)[at],
                   kvc__ix_used(h, (uint32_t)(r - kvc__stripe_table(seg, s))));
    __atomic_store_n(&st->rooms_live, st->rooms_live + 1, __ATOMIC_RELAXED);
    kvc__upd_commit(&u, now);
    /* A stripe that evicted Failed rooms nobody joined: a room created again
     * takes its failure from the ring while it is there, so a late joiner
     * sees it and a later report is not the first (first wins). */
    kvc_failure_rec f;
    if (atomic_load_explicit(&st->evicted, memory_order_relaxed) && kvc__ring_find(seg, id, &f))
        kvc__room_refail(seg, s, r, &f);
    *out = r;
    return KVC_OK;
}

/* Find room (stripe s, lock held), creating it with participants when
 * participants != 0 and it does not exist. */
kvc_err kvc__room_find_or_create(kvc_segment *seg, uint32_t s, uint64_t h, uint64_t room,
                                 uint32_t participants, kvc_room **out)
{
    *out = kvc__stripe_find(seg, s, h, room);
    if (*out || !participants)
        return *out ? KVC_OK : kvc__no_room(room);
    return kvc__room_create(seg, s, h, room, participants, out);
}
