"""The poll all-reduces kvcoord.sglang.install() puts in place of sglang's
poll_and_all_reduce, poll_and_all_reduce_attn_cp_tp_group and
poll_and_all_reduce_with_staging.

Each does sglang's steps before the reduction (the polls, with sglang's
failure injection; the staging scatter and its Success -> Transferring
demotion; the metadata gate, through sglang's own helpers) and then one
element-wise MIN over the process group's ranks: in the node's segment
(Segment.allreduce_min, futex-woken, failing fast naming a dead rank) when
every rank of the group attached this node's segment, else through sglang's
original function (gloo), said once in the log.  Before the reduction a
room that kvcoord itself failed (a participant died, the room TTL passed)
polls Failed on the rank that sees it, so every rank of the step agrees.

Which path a group takes is decided once per process group by a handshake
(one gloo all_gather_object of every rank's node and segment identity), so
every rank of the group decides the same; the group id of the collective
is derived from the members' pids, the same on every member and different
for different groups (two groups of the same members get their order of
first use).
"""

import inspect
import os
import zlib

from . import Error, NotFoundError
from ._sgl_bridge import log

FAILED = 0  # sglang's KVPoll.Failed
TRANSFERRING = 3
SUCCESS = 4
_GATE_ARGS = {"decode_reqs", "metadata_buffers", "server_args"}


class Group:
    """A process group whose every rank is on this segment: the collective's
    (group id, size, this rank)."""

    __slots__ = ("gid", "size", "rank")

    def __init__(self, gid, size, rank):
        self.gid, self.size, self.rank = gid, size, rank


def _handshake(bridge, pg, dist):
    size = dist.get_world_size(pg)
    rank = dist.get_rank(pg)
    usable = bridge.node_key is not None and hasattr(bridge.segment, "allreduce_min")
    mine = (bridge.node_key if usable else None, os.getpid())
    got = [None] * size
    dist.all_gather_object(got, mine, group=pg)
    keys = {k for k, _ in got}
    if mine[0] is None or len(keys) != 1:
        if bridge.segment is None:
            why = "no kvcoord segment is attached (install(segment=None))"
        elif not usable:
            why = "this kvcoord build has no collective (Segment.allreduce_min)"
        elif None in keys:
            why = "a rank of the group attached no kvcoord segment"
        else:
            why = "the group spans nodes or segments (not every rank is on segment %s of " \
                  "this node)" % bridge.segment.name
        bridge.warn_once(("fallback", why),
                         "kvcoord.sglang: the poll all-reduce of a %d-rank process group runs "
                         "sglang's own (gloo): %s (logged once)", size, why)
        return None
    members = tuple(p for _, p in got)
    with bridge.lock:
        n = bridge.seen_members.get(members, 0)
        bridge.seen_members[members] = n + 1
    gid = zlib.crc32(repr((members, n)).encode()) & 0x7FFFFFFF
    log.info("kvcoord.sglang: the poll all-reduce of a %d-rank process group runs in segment "
             "%s (group %d)", size, bridge.segment.name, gid)
    return Group(gid, size, rank)


def resolve(bridge, pg):
    """The Group of torch process group pg, or None (use sglang's original).
    The first call for a group is collective (every rank of pg calls it where
    it calls the all-reduce it replaces)."""
    key = id(pg)
    with bridge.lock:
        hit = bridge.groups.get(key)
    if hit is not None:
        return hit[1]
    import torch.distributed as dist

    g = _handshake(bridge, pg if pg is not None else dist.group.WORLD, dist)
    with bridge.lock:
        bridge.groups[key] = (pg, g)  # pg kept: its id is not reused while cached
    return g


def allreduce(bridge, g, polls):
    """The element-wise MIN of polls (ints 0..255) over g's ranks (list of int).
    Raises kvcoord.CollectiveError naming a rank that died or did not arrive
    within the install()'s timeout."""
    out = bridge.segment.allreduce_min(g.gid, g.size, g.rank, bytes(polls), bridge.timeout)
    return list(out)


def _torch_min(polls, pg):
    import torch
    import torch.distributed as dist

    t = torch.tensor(polls, dtype=torch.uint8, device="cpu")
    dist.all_reduce(t, op=dist.ReduceOp.MIN, group=pg)
    return t.tolist()


def raw_polls(utils, pollers):
    """Each poller's poll() as an int, with sglang's failure injection (its
    helper when it has one; the module's FAILURE_PROB in older versions)."""
    inject = getattr(utils, "_poll_with_failure_injection", None)
    if inject is not None:
        return [int(p) for p in inject(pollers)]
    prob = float(getattr(utils, "FAILURE_PROB", 0) or 0)
    if prob > 0:
        import random

        return [FAILED if random.random() < prob else int(p.poll()) for p in pollers]
    return [int(p.poll()) for p in pollers]


def fold(bridge, pollers, polls):
    """Failed for each followed room kvcoord itself failed (in place).  One
    room_sync read of the followed rooms' states (the library judges their
    participants' liveness and the TTL there); only a room read Failed is
    looked at again, for who recorded it."""
    idx, rooms = [], []
    with bridge.lock:
        follows = bridge.follows
        for i, p in enumerate(pollers):
            room = getattr(p, "bootstrap_room", None)
            if room is not None and polls[i] != FAILED and \
                    (id(getattr(p, "kv_mgr", None)), room) in follows:
                idx.append(i)
                rooms.append(room)
    if not rooms:
        return
    try:
        states = bridge.segment.room_sync(bridge.rank, rooms)
    except NotFoundError:  # one was reclaimed (the TTL): room by room
        states = [FAILED] * len(rooms)
    except Error as e:
        bridge.warn_once(("segment", "room_sync", type(e).__name__),
                         "kvcoord.sglang: reading the polled rooms failed (%s); the poll "
                         "all-reduce goes on without kvcoord's own failures (logged once)", e)
        return
    for i, room, state in zip(idx, rooms, states):
        if state == FAILED and bridge.kvcoord_failure(room) is not None:
            polls[i] = FAILED


def make(bridge, utils, originals):
    """The wrappers, by name, for the originals found in utils."""
    out = {}
    o_par = originals.get("poll_and_all_reduce")
    o_cp = originals.get("poll_and_all_reduce_attn_cp_tp_group")
    o_stg = originals.get("poll_and_all_reduce_with_staging")

    def gate_of(args, what):
        """(decode_reqs, metadata_buffers, server_args) to gate with, or False when
        this call has arguments the wrapper does not know (then sglang's own runs)."""
        extra = set(args) - _GATE_ARGS
        if extra:
            bridge.warn_once(("args", what, tuple(sorted(extra))),
                             "kvcoord.sglang: %s called with %s, unknown to kvcoord: sglang's "
                             "own runs (logged once)", what, ", ".join(sorted(extra)))
            return False
        return args.get("decode_reqs"), args.get("metadata_buffers"), args.get("server_args")

    def metadata_gate(polls, reqs, bufs, sargs):
        """sglang's own gate: a Success whose metadata has not landed is Transferring."""
        utils._apply_metadata_gate(polls, reqs, bufs, sargs)

    if o_par is not None:
        sig = inspect.signature(o_par)

        def poll_and_all_reduce(pollers, gloo_group, *args, **kwargs):
            g = resolve(bridge, gloo_group)
            if g is None:
                return o_par(pollers, gloo_group, *args, **kwargs)
            if args or kwargs:
                bound = sig.bind(pollers, gloo_group, *args, **kwargs).arguments
                names = list(sig.parameters)
                gate = gate_of({k: v for k, v in bound.items() if k not in names[:2]},
                               "poll_and_all_reduce")
            else:  # sglang's prefill and decode steps: no gate (inspect's bind is slow)
                gate = (None, None, None)
            if gate is False:
                return o_par(pollers, gloo_group, *args, **kwargs)
            reqs, bufs, sargs = gate
            if reqs is not None and bufs is not None and sargs is not None and \
                    getattr(utils, "_apply_metadata_gate", None) is None:
                return o_par(pollers, gloo_group, *args, **kwargs)
            polls = raw_polls(utils, pollers)
            if reqs is not None and bufs is not None and sargs is not None:
                metadata_gate(polls, reqs, bufs, sargs)
            fold(bridge, pollers, polls)
            return allreduce(bridge, g, polls)

        out["poll_and_all_reduce"] = poll_and_all_reduce

    if o_cp is not None:

        def poll_and_all_reduce_attn_cp_tp_group(pollers, attn_cp_cpu_group, attn_tp_cpu_group):
            gt = resolve(bridge, attn_tp_cpu_group)
            gc = resolve(bridge, attn_cp_cpu_group)
            if (gt is None and gc is None) or o_par is None:
                return o_cp(pollers, attn_cp_cpu_group, attn_tp_cpu_group)
            polls = out["poll_and_all_reduce"](pollers, attn_tp_cpu_group)
            if gc is None:
                return _torch_min(polls, attn_cp_cpu_group)
            return allreduce(bridge, gc, polls)

        out["poll_and_all_reduce_attn_cp_tp_group"] = poll_and_all_reduce_attn_cp_tp_group

    if o_stg is not None:
        sig_stg = inspect.signature(o_stg)

        def poll_and_all_reduce_with_staging(decode_reqs, staging_handler, gloo_group, *args,
                                             **kwargs):
            g = resolve(bridge, gloo_group)
            if g is None:
                return o_stg(decode_reqs, staging_handler, gloo_group, *args, **kwargs)
            bound = sig_stg.bind(decode_reqs, staging_handler, gloo_group, *args,
                                 **kwargs).arguments
            names = list(sig_stg.parameters)
            gate = gate_of({k: v for k, v in bound.items() if k not in names[:3]},
                           "poll_and_all_reduce_with_staging")
            if gate is False:
                return o_stg(decode_reqs, staging_handler, gloo_group, *args, **kwargs)
            _, bufs, sargs = gate
            gated = bufs is not None and sargs is not None
            if gated and getattr(utils, "_apply_metadata_gate", None) is None:
                return o_stg(decode_reqs, staging_handler, gloo_group, *args, **kwargs)

            def staging_pending(dr):
                return dr.kv_receiver.require_staging and not staging_handler.is_done(dr)

            for dr in decode_reqs:  # advance the scatter of transfers still staging
                if staging_pending(dr):
                    staging_handler.advance_scatter(dr)
            receivers = [dr.kv_receiver for dr in decode_reqs]
            polls = raw_polls(utils, receivers)
            for i, dr in enumerate(decode_reqs):  # received, not scattered yet: not done
                if polls[i] == SUCCESS and staging_pending(dr):
                    polls[i] = TRANSFERRING
            if gated:
                metadata_gate(polls, decode_reqs, bufs, sargs)
            fold(bridge, receivers, polls)
            return allreduce(bridge, g, polls)

        out["poll_and_all_reduce_with_staging"] = poll_and_all_reduce_with_staging
    return out
