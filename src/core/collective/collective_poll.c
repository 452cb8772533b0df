/*
 * collective_poll.c - kvc_poll_allreduce(): sglang's poll agreement in one
 * call - fold the failures kvcoord itself made into this rank's polls, then
 * the MIN all-reduce over the group (collective.c).
 *
 * Callers: the public API (the Python binding's Segment.poll_allreduce,
 * which kvcoord.sglang's installed poll_and_all_reduce* call).  Lock rule:
 * none taken here (room reads are lock-free; kvc_room_get takes a room's
 * stripe lock only to fail a room whose participant died).
 *
 * Hints (kvc_poll_prefetch): each thread keeps where the rooms of its last
 * fold lie (their index entries and slots, as addresses) so that its next
 * call's caller can start loading them while it makes its polls: a poll
 * step's rooms are mostly the last step's, in the same order, and the
 * fold's reads otherwise wait for their misses (the rooms were written by
 * other ranks since).  Addresses only: a hint is prefetched, never read,
 * so one of a closed segment or a reclaimed room costs nothing.
 *
 * Trust (struct clean): each thread also keeps the rooms its last folds
 * found not failed by kvcoord, and does not read them again while nothing
 * that could fail one has been seen: no failure record was written in the
 * segment (room_epoch: every record moves it, whoever writes it: kvcoordd
 * reaping a dead process fails its rooms at once, a reader that finds a
 * participant dead fails the room), no process attached or left
 * (proc_epoch: a participant that left without releasing fails on its next
 * read), no trusted room's TTL can have passed, and at most
 * KVC__LIVENESS_RECHECK_MS went by: a reader's own liveness checks of a
 * participant (without kvcoordd, or for one without a process entry) come
 * at most that often anyway, so a death nobody reaps is still found by the
 * next full read, at most twice that period after it.  The epochs are read
 * before the rooms: a failure written after a room was read moves them, and
 * the next call reads every room again.  Reading a poll step's rooms (lines
 * the other ranks wrote since) cost about half of sglang's installed poll
 * at 2 ranks (docs/benchmarks.md).
 */
#include <stdint.h>
#include <string.h>

#include "internal.h"

/* Rooms checked per batch: their index entries, then their slots,
 * prefetched together (the misses overlap: a poll step's rooms are mostly
 * out of cache), the reclaimed ones looked up in the failure ring in one
 * pass. */
#define BATCH 64

#define HINTS 256 /* rooms hinted per thread: the Python binding's POLL_STACK */

/* Start loading what the fold reads of room slot r: its head (seq, id,
 * state, failure flag), its first participants and its liveness check
 * stamps.  Addresses only: nothing is read. */
static void prefetch_lines(const kvc_room *r)
{
    __builtin_prefetch(r);
    __builtin_prefetch((const char *)r + 64);
    __builtin_prefetch(&r->checked_ms[0]);
}

/* Rooms trusted per thread: a power of two, at most half of it used (the
 * probes stay short). */
#define CLEAN_CAP 1024

/* The calling thread's trusted rooms (see the top) on one segment: ids + 1
 * (0: an empty place) in an open-addressing set, valid while the epochs
 * are as they were and before `until`. */
static _Thread_local struct {
    uintptr_t seg;       /* the handle, */
    uint64_t created_ns; /* and its segment's creation time */
    uint32_t room_epoch, proc_epoch;
    uint64_t until; /* monotonic ns (kvc__seg_mono_coarse_ns): trusted before */
    uint32_t n;
    uint64_t id[CLEAN_CAP];
} clean;

/* Start the call: keep the trusted rooms if nothing could have failed one
 * since, else forget them; whether they are kept. */
static bool clean_begin(kvc_segment *seg)
{
    const kvc_header *h = seg->hdr;
    uint32_t re = atomic_load_explicit(&h->room_epoch, memory_order_acquire);
    uint32_t pe = atomic_load_explicit(&h->proc_epoch, memory_order_acquire);
    uint64_t now = kvc__seg_mono_coarse_ns();
    if (clean.seg == (uintptr_t)seg && clean.created_ns == h->created_ns &&
        clean.room_epoch == re && clean.proc_epoch == pe && now < clean.until)
        return true;
    if (clean.n)
        memset(clean.id, 0, sizeof clean.id);
    clean.n = 0;
    clean.seg = (uintptr_t)seg;
    clean.created_ns = h->created_ns;
    clean.room_epoch = re;
    clean.proc_epoch = pe;
    clean.until = now + (uint64_t)KVC__LIVENESS_RECHECK_MS * 1000000ull;
    return false;
}

/* Room's place in the set: where it is, or the empty place it would take. */
static size_t clean_slot(uint64_t room)
{
    size_t i = (size_t)kvc__room_hash(room) & (CLEAN_CAP - 1);
    while (clean.id[i] && clean.id[i] != room + 1)
        i = (i + 1) & (CLEAN_CAP - 1);
    return i;
}

static bool clean_has(uint64_t room) { return clean.n && clean.id[clean_slot(room)] == room + 1; }

/* Trust room (found not failed by kvcoord) until its TTL could fail it. */
static void clean_add(uint64_t room, uint64_t ttl_at)
{
    if (clean.n >= CLEAN_CAP / 2)
        return;
    size_t i = clean_slot(room);
    if (!clean.id[i]) {
        clean.id[i] = room + 1;
        clean.n++;
    }
    if (ttl_at < clean.until)
        clean.until = ttl_at;
}

/* The calling thread's last fold on handle seg: its n rooms' index entries
 * and slots, in fold order. */
static _Thread_local struct {
    uintptr_t seg;
    uint32_t n;
    uintptr_t ix[HINTS], slot[HINTS];
} hints;

KVC_API void kvc_poll_prefetch(const kvc_segment *seg, size_t i)
{
    if ((uintptr_t)seg != hints.seg || i >= hints.n)
        return;
    __builtin_prefetch((const void *)hints.ix[i]);
    if (hints.slot[i])
        prefetch_lines((const kvc_room *)hints.slot[i]);
}

/* Start loading room's home index entry (layout.h), where most rooms'
 * probes end; the room slot it names is read once the entry is in. */
static void prefetch_room(kvc_segment *seg, uint64_t room)
{
    uint64_t h = kvc__room_hash(room);
    uint32_t n = seg->hdr->stripe_slots;
    __builtin_prefetch(
        (const void *)&seg->room_index[(size_t)kvc__room_stripe(h) * n + kvc__room_home(h, n)]);
}

/* Then the room slot that entry names (its head, first participants and
 * liveness check stamps), if it names one; noted as hint `at` (fold order). */
static void prefetch_slot(kvc_segment *seg, uint64_t room, size_t at)
{
    uint64_t h = kvc__room_hash(room);
    uint32_t n = seg->hdr->stripe_slots;
    size_t base = (size_t)kvc__room_stripe(h) * n;
    const _Atomic uint64_t *ix = &seg->room_index[base + kvc__room_home(h, n)];
    uint64_t e = atomic_load_explicit(ix, memory_order_relaxed);
    uint32_t b = (uint32_t)e - 2u;
    const kvc_room *r = (uint32_t)e < 2 || b >= n ? NULL : seg->rooms + base + b;
    if (at < HINTS) {
        hints.ix[at] = (uintptr_t)ix;
        hints.slot[at] = (uintptr_t)r;
        hints.n = (uint32_t)at + 1;
    }
    if (r)
        prefetch_lines(r);
}

/* Fail polls[at[j]] (room rooms[at[j]]), j < k, whose room kvcoord itself
 * failed (a record no rank process made: a participant died, the TTL
 * passed), reading each as kvc_room_get does; a room already reclaimed by
 * its newest record in the ring of recent failures. */
static void fold_batch(kvc_segment *seg, uint8_t *polls, const uint64_t *rooms, const size_t *at,
                       size_t k, size_t done)
{
    uint64_t gone[BATCH];
    size_t gone_at[BATCH];
    size_t ng = 0;
    for (size_t j = 0; j < k; j++)
        prefetch_room(seg, rooms[at[j]]);
    for (size_t j = 0; j < k; j++)
        prefetch_slot(seg, rooms[at[j]], done + j);
    for (size_t j = 0; j < k; j++) {
        bool ours = false;
        uint64_t ttl_at = 0;
        kvc_err e = kvc__room_failed_by_kvcoord(seg, rooms[at[j]], &ours, &ttl_at);
        if (e == KVC_OK && ours)
            polls[at[j]] = KVC_POLL_FAILED;
        else if (e == KVC_OK && ttl_at)
            clean_add(rooms[at[j]], ttl_at);
        else if (e == KVC_E_NOENT) {
            gone[ng] = rooms[at[j]];
            gone_at[ng++] = at[j];
        } /* any other error: unreadable now, left as polled */
    }
    if (!ng)
        return;
    int32_t origin[BATCH];
    kvc__ring_origins(seg, gone, origin, ng);
    for (size_t j = 0; j < ng; j++)
        if (origin[j] == 0)
            polls[gone_at[j]] = KVC_POLL_FAILED;
}

KVC_API kvc_err kvc_poll_allreduce(kvc_segment *seg, uint64_t group, uint32_t size, uint32_t rank,
                                   uint8_t *polls, const uint64_t *rooms, size_t n,
                                   const kvc_coll_opts *opts, kvc_coll_failure *why)
{
    if (why)
        memset(why, 0, sizeof *why);
    KVC_ARG(seg);
    if (n)
        KVC_ARG(polls);
    for (size_t i = 0; i < n; i++)
        if (polls[i] > KVC_POLL_SUCCESS)
            return kvc__fail(KVC_E_INVAL,
                             "kvc_poll_allreduce: polls[%zu] is %u, not a KVPoll "
                             "state 0..4",
                             i, (unsigned)polls[i]);
    size_t at[BATCH];
    size_t k = 0, done = 0;
    hints.seg = (uintptr_t)seg;
    hints.n = 0;
    bool trusted = rooms && n && clean_begin(seg);
    for (size_t i = 0; rooms && i < n; i++) {
        if (rooms[i] == KVC_ROOM_NONE || polls[i] == KVC_POLL_FAILED ||
            (trusted && clean_has(rooms[i])))
            continue;
        at[k++] = i;
        if (k == BATCH) {
            fold_batch(seg, polls, rooms, at, k, done);
            done += k;
            k = 0;
        }
    }
    if (k)
        fold_batch(seg, polls, rooms, at, k, done);
    return kvc_allreduce_min_opt(seg, group, size, rank, polls, n, opts, why);
}
