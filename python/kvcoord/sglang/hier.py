"""The poll all-reduce of a process group that spans nodes, for
kvcoord.sglang's installed polls: kvcoord's hierarchical collective
(kvcoord.HierGroup: each node's segment, one exchange between the nodes'
leaders, the result spread through each segment) when every rank of the
group runs kvcoord on its node.

Which path a group takes is decided by the poll handshake's first
all_gather_object (every rank's node identity) and then by
kvcoord._hier.handshake (three more: the node layout, the leaders'
addresses, whether every connection was made), so every rank decides the
same: the hierarchical collective, said once in the log, or sglang's own
(gloo) with the reason, said once.

Errors at run time: a CollectiveError (a rank or a node's leader died: the
group is broken, every later step raises the same at once; a node did not
answer within the timeout) is raised into sglang, as gloo would have hung;
ranks calling different variants or lengths in the same step raise
InvalidArgumentError on every rank, naming the first rank that differs.
"""

import logging

from .. import CollectiveError, Error, InvalidArgumentError, NotFoundError
from .._hier import handshake

log = logging.getLogger(__name__)

FAILED = 0  # sglang's KVPoll.Failed


class HierPoll:
    """A process group spanning nodes: its kvcoord.HierGroup, and each
    member's pid and room rank (bridge.members_died reads them)."""

    __slots__ = ("hg", "pids", "room_ranks")

    def __init__(self, hg, pids, room_ranks):
        self.hg, self.pids, self.room_ranks = hg, pids, room_ranks


def resolve(bridge, pg, size, pids, room_ranks):
    """(HierPoll, None) or (None, why): collective over pg, the same on every
    rank.  Called only when every rank attached a segment and they are not
    all on this node's."""
    hg, why = handshake(bridge.segment, pg, node_key=bridge.node_key, timeout=bridge.timeout)
    if hg is None:
        return None, why
    log.info("kvcoord.sglang: the poll all-reduce of a %d-rank process group runs across %d "
             "nodes: each node's segment, then one exchange between the nodes' leaders "
             "(group %#x; this rank on node %d%s)", size, hg.nodes, hg.group, hg.node,
             ", its leader" if hg.leader else "")
    return HierPoll(hg, pids, room_ranks), None


def fold(bridge, pollers, polls):
    """Failed for each followed room kvcoord itself failed (in place), as the
    single-node path's C call does: one room_sync read of the followed rooms'
    states, then who failed a room read Failed."""
    idx, rooms = [], []
    follows = bridge.counts  # room -> managers of this process following it
    for i, p in enumerate(pollers):
        room = getattr(p, "bootstrap_room", None)
        if room is not None and polls[i] != FAILED and room in follows:
            idx.append(i)
            rooms.append(room)
    if not rooms:
        return
    try:
        states = bridge.segment.room_sync(bridge.rank, rooms)
    except NotFoundError:  # one was reclaimed (the TTL)
        states = [FAILED] * len(rooms)
    except Error as e:
        bridge.warn_once(("segment", "room_sync", type(e).__name__),
                         "kvcoord.sglang: reading the polled rooms failed (%s); the poll "
                         "all-reduce goes on without kvcoord's own failures (logged once)", e,
                         logger=log)
        return
    for i, room, state in zip(idx, rooms, states):
        if state == FAILED and bridge.kvcoord_failure(room) is not None:
            polls[i] = FAILED


def reduce(bridge, g, pollers, polls, kind):
    """The MIN of polls over every rank of g on every node (a new list)."""
    polls = list(polls)
    fold(bridge, pollers, polls)
    try:
        return list(g.hg.allreduce_min(bytes(polls), tag=kind, timeout=bridge.timeout))
    except CollectiveError as e:
        if e.mismatch:  # the tags are the wrappers' kinds
            from .poll import KIND_NAMES

            raise InvalidArgumentError("%s [kvcoord.sglang kinds: %s]" % (e, "; ".join(
                "%d %s" % kv for kv in sorted(KIND_NAMES.items())))) from None
        if e.dead and e.node == g.hg.node:  # rooms of this node it had not joined
            bridge.members_died(g, e)
        raise
