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
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* Whether kvcoord itself failed room (a record no rank process made: a
 * participant died, the TTL passed), reading it as kvc_room_get does; once
 * the room was reclaimed, its record in the ring of recent failures. */
static bool failed_by_kvcoord(kvc_segment *seg, uint64_t room)
{
    bool ours;
    kvc_err e = kvc__room_failed_by_kvcoord(seg, room, &ours);
    if (e == KVC_OK)
        return ours;
    if (e != KVC_E_NOENT)
        return false; /* unreadable now: left as polled */
    kvc_failure_info *ring = malloc(KVC_FAILURE_RING * sizeof *ring);
    size_t n = 0;
    ours = false;
    if (ring && kvc_failures_recent(seg, ring, KVC_FAILURE_RING, &n) == KVC_OK) {
        for (size_t i = 0; i < n && i < KVC_FAILURE_RING; i++)
            if (ring[i].room == room) { /* newest first */
                ours = ring[i].origin_pid == 0;
                break;
            }
    }
    free(ring);
    return ours;
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
    for (size_t i = 0; rooms && i < n; i++)
        if (rooms[i] != KVC_ROOM_NONE && polls[i] != KVC_POLL_FAILED &&
            failed_by_kvcoord(seg, rooms[i]))
            polls[i] = KVC_POLL_FAILED;
    return kvc_allreduce_min_opt(seg, group, size, rank, polls, n, opts, why);
}
