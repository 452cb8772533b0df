/*
 * collective_poll.c - kvc_poll_allreduce(): sglang's poll agreement in one
 * call - fold the failures kvcoord itself made into this rank's polls, then
 * the MIN all-reduce over the group (collective.c).
 *
 * Callers: the public API (the Python binding's Segment.poll_allreduce,
 * which kvcoord.sglang's installed poll_and_all_reduce* call).  Lock rule:
 * none taken here (room reads are lock-free; kvc_room_get takes a room's
 * stripe lock only to fail a room whose participant died).
 */
#include <string.h>

#include "internal.h"

/* Rooms checked per batch: their index entries, then their slots,
 * prefetched together (the misses overlap: a poll step's rooms are mostly
 * out of cache), the reclaimed ones looked up in the failure ring in one
 * pass. */
#define BATCH 64

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
 * liveness check stamps), if it names one. */
static void prefetch_slot(kvc_segment *seg, uint64_t room)
{
    uint64_t h = kvc__room_hash(room);
    uint32_t n = seg->hdr->stripe_slots;
    size_t base = (size_t)kvc__room_stripe(h) * n;
    uint64_t e =
        atomic_load_explicit(&seg->room_index[base + kvc__room_home(h, n)], memory_order_relaxed);
    uint32_t b = (uint32_t)e - 2u;
    if ((uint32_t)e < 2 || b >= n)
        return;
    const kvc_room *r = seg->rooms + base + b;
    __builtin_prefetch(r);
    __builtin_prefetch((const char *)r + 64);
    __builtin_prefetch(&r->checked_ms[0]);
}

/* Fail polls[at[j]] (room rooms[at[j]]), j < k, whose room kvcoord itself
 * failed (a record no rank process made: a participant died, the TTL
 * passed), reading each as kvc_room_get does; a room already reclaimed by
 * its newest record in the ring of recent failures. */
static void fold_batch(kvc_segment *seg, uint8_t *polls, const uint64_t *rooms, const size_t *at,
                       size_t k)
{
    uint64_t gone[BATCH];
    size_t gone_at[BATCH];
    size_t ng = 0;
    for (size_t j = 0; j < k; j++)
        prefetch_room(seg, rooms[at[j]]);
    for (size_t j = 0; j < k; j++)
        prefetch_slot(seg, rooms[at[j]]);
    for (size_t j = 0; j < k; j++) {
        bool ours = false;
        kvc_err e = kvc__room_failed_by_kvcoord(seg, rooms[at[j]], &ours);
        if (e == KVC_OK && ours)
            polls[at[j]] = KVC_POLL_FAILED;
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
    size_t k = 0;
    for (size_t i = 0; rooms && i < n; i++) {
        if (rooms[i] == KVC_ROOM_NONE || polls[i] == KVC_POLL_FAILED)
            continue;
        at[k++] = i;
        if (k == BATCH) {
            fold_batch(seg, polls, rooms, at, k);
            k = 0;
        }
    }
    if (k)
        fold_batch(seg, polls, rooms, at, k);
    return kvc_allreduce_min_opt(seg, group, size, rank, polls, n, opts, why);
}
