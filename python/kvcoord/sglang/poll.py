"""The poll all-reduces kvcoord.sglang.install() puts in place of sglang's
poll_and_all_reduce, poll_and_all_reduce_attn_cp_tp_group and
poll_and_all_reduce_with_staging.

Each does sglang's steps before the reduction through sglang's own helpers
(the polls, with sglang's failure injection; the staging scatter and its
Success -> Transferring demotion; the metadata gate) and then one C call,
Segment.poll_allreduce: a room kvcoord itself failed (a participant died,
the room TTL passed) polls Failed on the rank that sees it, and the
element-wise MIN over the process group's ranks runs in the node's segment
(futex-woken, failing fast naming a dead rank).  The per-step Python work
is sglang's own plus one dict lookup; nothing is allocated but the list
returned (up to 256 rooms).  Each poller's room is looked up in the
bridge's followed rooms kept in C (a RoomSet beside its dict) and the
fold's rooms are loaded while the polls run (kvc_poll_prefetch).  In the plain variant (sglang's prefill and
decode steps) with sglang's failure injection off (its _get_failure_prob,
read every step), the C call makes the polls itself: each poller's own
poll(), as int() takes it, in order - sglang's list comprehension without
its frames - and a call failing after them hands them to the gloo
fallback (.polls) rather than polling twice.  That plain call (two
positional arguments, a group in this segment, the injection off) is taken
in C too: the installed poll_and_all_reduce is a kvcoord._kvcoord.PollCall
(python/ext/_pollcall.c) making the wrapper's decisions and handing every
other call to it (its __wrapped__); a Python frame with *args and **kwargs
cost 1.5-4 us cold.

Which path a group takes is decided once per process group by a handshake
(gloo all_gather_object: every rank's node and segment identity, pid and
room rank; then whether each could join the segment's group), so every
rank of the group decides the same: the segment when every rank is on this
node's segment and could join, else sglang's original (gloo), said once in
the log.  The group id is derived from the members' pids (the same on
every member, different for different groups; two groups of the same
members get their order of first use).

Errors at run time (kvcoord.sglang's rule, docs: "Errors reaching sglang"):
- a CollectiveError naming a dead rank is raised into sglang (no path can
  complete the step without it: gloo would hang), after the rooms that rank
  was expected in were failed (below);
- an InvalidArgumentError from the round (ranks calling different variants
  or lengths in the same step: a bug, told on every rank) is raised;
- any other kvcoord.Error (the segment closed by uninstall(), full, a round
  given up or timed out: every rank of that round gets one) is logged once
  and the step runs sglang's own reduction (gloo) on the same polls; the
  group stays on gloo from then on.  Every rank of a failed round takes
  that path in the same step, so the ranks stay in step.

Rooms after a rank dies: the handshake is where the TP group's membership
is known (each member's pid and the room rank it writes).  When the poll
collective reports a member dead, every room this process follows that the
dead rank had not joined is failed at once ("rank R (pid P) ... died before
it joined room N"), and so is every room followed later; rooms it had
joined are failed by the library's liveness check.
"""

import functools
import inspect
import logging
import os
import zlib

from .. import CollectiveError, Error, InvalidArgumentError, _kvcoord
from . import hier as _hier_poll

log = logging.getLogger(__name__)
FAILED = 0  # sglang's KVPoll.Failed
TRANSFERRING = 3
SUCCESS = 4
_GATE_ARGS = ("decode_reqs", "metadata_buffers", "server_args")
# kind of each collective (every rank of a round must make the same)
KIND_PLAIN, KIND_GATED, KIND_CP, KIND_STAGING = 1, 2, 3, 4
KIND_NAMES = {1: "poll_and_all_reduce", 2: "poll_and_all_reduce with the metadata gate",
              3: "poll_and_all_reduce_attn_cp_tp_group (its CP stage)",
              4: "poll_and_all_reduce_with_staging"}


class Group:
    """A process group whose every rank is on this segment: the collective's
    (group id, size, this rank), and each member's pid and room rank."""

    __slots__ = ("gid", "size", "rank", "pids", "room_ranks")

    def __init__(self, gid, size, rank, pids, room_ranks):
        self.gid, self.size, self.rank = gid, size, rank
        self.pids, self.room_ranks = pids, room_ranks


def _fallback(bridge, size, why):
    bridge.warn_once(("fallback", why),
                     "kvcoord.sglang: the poll all-reduce of a %d-rank process group runs "
                     "sglang's own (gloo): %s (logged once)", size, why, logger=log)
    return None


def _handshake(bridge, pg, dist):
    size = dist.get_world_size(pg)
    rank = dist.get_rank(pg)
    usable = bridge.node_key is not None and hasattr(bridge.segment, "poll_allreduce")
    mine = (bridge.node_key if usable else None, os.getpid(), bridge.rank)
    got = [None] * size
    dist.all_gather_object(got, mine, group=pg)
    keys = {k for k, _, _ in got}
    if mine[0] is not None and None not in keys and len(keys) > 1:  # spans nodes
        g, why = _hier_poll.resolve(bridge, pg, size, tuple(p for _, p, _ in got),
                                   tuple(r for _, _, r in got))
        return g if g is not None else _fallback(bridge, size, why)
    if mine[0] is None or len(keys) != 1:
        if bridge.segment is None:
            why = "no kvcoord segment is attached (install(segment=None))"
        elif not usable:
            why = "this kvcoord build has no collective (Segment.poll_allreduce)"
        elif None in keys:
            why = "a rank of the group attached no kvcoord segment"
        else:
            why = "the group spans nodes or segments (not every rank is on segment %s of " \
                  "this node)" % bridge.segment.name
        return _fallback(bridge, size, why)
    members = tuple(p for _, p, _ in got)
    with bridge.lock:
        n = bridge.seen_members.get(members, 0)
        bridge.seen_members[members] = n + 1
    gid = zlib.crc32(repr((members, n)).encode()) & 0x7FFFFFFF
    try:  # every rank joins, then all agree: one that cannot makes all use gloo
        bridge.segment.allreduce_join(gid, size, rank)
        mine = None
    except Error as e:
        mine = "%s: %s" % (type(e).__name__, e)
    oks = [None] * size
    dist.all_gather_object(oks, mine, group=pg)
    bad = [(r, o) for r, o in enumerate(oks) if o is not None]
    if bad:
        return _fallback(bridge, size, "rank %d could not join the segment's group %d (%s)"
                         % (bad[0][0], gid, bad[0][1]))
    log.info("kvcoord.sglang: the poll all-reduce of a %d-rank process group runs in segment "
             "%s (group %d)", size, bridge.segment.name, gid)
    return Group(gid, size, rank, members, tuple(r for _, _, r in got))


def resolve(bridge, pg):
    """The Group of torch process group pg, or None (use sglang's original).
    The first call for a group is collective (every rank of pg calls it where
    it calls the all-reduce it replaces)."""
    hit = bridge.groups.get(id(pg))
    if hit is not None:
        return hit[1]
    import torch.distributed as dist

    g = _handshake(bridge, pg if pg is not None else dist.group.WORLD, dist)
    with bridge.lock:
        bridge.groups[id(pg)] = (pg, g)  # pg kept: its id is not reused while cached
    return g


def _torch_min(polls, pg):
    """sglang's own reduction of polls: a uint8 MIN all-reduce over gloo."""
    import torch
    import torch.distributed as dist

    t = torch.tensor(polls, dtype=torch.uint8, device="cpu")
    dist.all_reduce(t, op=dist.ReduceOp.MIN, group=pg)
    return t.tolist()


def reduce(bridge, g, pg, pollers, polls, kind):
    """The MIN of polls over g (pg's group in the segment), with the rooms
    kvcoord failed folded in; the run-time error rule of the module's top.
    polls None: each pollers[i].poll() as int, polled by the C call (what
    sglang's helper gives with its failure injection off: polls_or_none)."""
    if type(g) is _hier_poll.HierPoll:  # the group spans nodes
        if polls is None:
            polls = [int(p.poll()) for p in pollers]
        return _hier_poll.reduce(bridge, g, pollers, polls, kind)
    try:
        return bridge.segment.poll_allreduce(g.gid, g.size, g.rank, polls, pollers,
                                             _follows(bridge), bridge.timeout, kind)
    except Error as e:
        return failed(bridge, g, pg, pollers, polls, e)


def _follows(bridge):
    """The followed rooms for Segment.poll_allreduce: the bridge's RoomSet (the
    same rooms as its dict, looked up in C) for the extension's Segment."""
    return bridge.followed if isinstance(bridge.segment, _kvcoord.Segment) else bridge.counts


def failed(bridge, g, pg, pollers, polls, err):
    """After Segment.poll_allreduce raised err (a kvcoord.Error) for reduce():
    raise (a rank died, a mismatched call) or sglang's own reduction of the
    polls (the group runs gloo from then on)."""
    if isinstance(err, CollectiveError) and err.dead:
        bridge.members_died(g, err)
        raise err
    if isinstance(err, InvalidArgumentError):
        if " of kind " in str(err):
            raise InvalidArgumentError("%s [kvcoord.sglang kinds: %s]" % (err, "; ".join(
                "%d %s" % kv for kv in sorted(KIND_NAMES.items())))) from None
        raise err
    if polls is None:  # polled by the C call before it failed: those polls, not new ones
        polls = getattr(err, "polls", None)
        if polls is None:  # it failed before polling (the segment closed)
            polls = [int(p.poll()) for p in pollers]
    bridge.warn_once(("poll", type(err).__name__),
                     "kvcoord.sglang: the poll all-reduce in the segment failed (%s: %s); this "
                     "group runs sglang's own (gloo) from now on (logged once)",
                     type(err).__name__, err, logger=log)
    with bridge.lock:
        bridge.groups[id(pg)] = (pg, None)
    return _torch_min(polls, pg)


def raw_polls(utils, pollers):
    """Each poller's poll() as an int, with sglang's failure injection (its
    helper when it has one; the module's FAILURE_PROB in older versions)."""
    inject = getattr(utils, "_poll_with_failure_injection", None)
    if inject is not None:
        return inject(pollers)
    prob = float(getattr(utils, "FAILURE_PROB", 0) or 0)
    if prob > 0:
        import random

        return [FAILED if random.random() < prob else int(p.poll()) for p in pollers]
    return [int(p.poll()) for p in pollers]


def _binder(fn, skip):
    """A fast bind of fn's arguments after the first `skip`: (args, kwargs) ->
    {name: value}, or None when they do not fit plainly (then inspect's)."""
    sig = inspect.signature(fn)
    names = list(sig.parameters)[skip:]
    known = frozenset(names)

    def bind(args, kwargs):
        if len(args) <= len(names) and not (set(kwargs) - known):
            out = dict(zip(names, args))
            if not (out.keys() & kwargs.keys()):
                out.update(kwargs)
                return out
        return {k: v for k, v in sig.bind(*([None] * skip), *args, **kwargs).arguments.items()
                if k not in list(sig.parameters)[:skip]}

    return bind


def make(bridge, utils, originals):
    """The wrappers, by name, for the originals found in utils."""
    out = {}
    o_par = originals.get("poll_and_all_reduce")
    o_cp = originals.get("poll_and_all_reduce_attn_cp_tp_group")
    o_stg = originals.get("poll_and_all_reduce_with_staging")
    groups = bridge.groups
    inject = getattr(utils, "_poll_with_failure_injection", None)
    polls_of = inject if inject is not None else (lambda ps: raw_polls(utils, ps))
    gate_fn = getattr(utils, "_apply_metadata_gate", None)
    prob_fn = getattr(utils, "_get_failure_prob", None)

    def polls_or_none(pollers):
        """None when sglang's polls would be [int(p.poll()) for p in pollers]
        (its failure injection is off: the C call polls, cheaper), else
        sglang's polls.  sglang's probability is read every step, as its
        helper does (a test may turn it on at run time)."""
        if inject is not None:
            if prob_fn is None:  # a helper of unknown shape: its polls
                return inject(pollers)
            return inject(pollers) if prob_fn() > 0 else None
        return None if not float(getattr(utils, "FAILURE_PROB", 0) or 0) > 0 \
            else raw_polls(utils, pollers)

    def group_of(pg):
        hit = groups.get(id(pg))
        return hit[1] if hit is not None else resolve(bridge, pg)

    def gate_of(bound, what):
        """(decode_reqs, metadata_buffers, server_args) to gate with, or False when
        this call has arguments the wrapper does not know (then sglang's own runs)."""
        extra = set(bound) - set(_GATE_ARGS)
        if extra:
            bridge.warn_once(("args", what, tuple(sorted(extra))),
                             "kvcoord.sglang: %s called with %s, unknown to kvcoord: sglang's "
                             "own runs (logged once)", what, ", ".join(sorted(extra)),
                             logger=log)
            return False
        return tuple(bound.get(k) for k in _GATE_ARGS)

    # The plain call's fast path, flattened into poll_and_all_reduce (each
    # Python frame and lookup costs µs when cold, as it is every step):
    # sglang's prefill and decode steps, a group in this segment, failure
    # injection off (its probability read every step), the C call polling.
    groups_get = groups.get
    seg = bridge.segment
    poll_c = getattr(seg, "poll_allreduce", None)
    counts, timeout = _follows(bridge), bridge.timeout
    fast_prob = prob_fn if inject is not None and poll_c is not None else None

    if o_par is not None:
        bind_par = _binder(o_par, 2)

        def poll_and_all_reduce(pollers, gloo_group, *args, **kwargs):
            hit = groups_get(id(gloo_group))
            g = hit[1] if hit is not None else resolve(bridge, gloo_group)
            if g is None:
                return o_par(pollers, gloo_group, *args, **kwargs)
            if not (args or kwargs):  # sglang's prefill and decode steps: no gate
                if type(g) is Group and fast_prob is not None:
                    if fast_prob() > 0:
                        return reduce(bridge, g, gloo_group, pollers, inject(pollers),
                                      KIND_PLAIN)
                    try:
                        return poll_c(g.gid, g.size, g.rank, None, pollers, counts, timeout,
                                      KIND_PLAIN)
                    except Error as e:
                        return failed(bridge, g, gloo_group, pollers, None, e)
                return reduce(bridge, g, gloo_group, pollers, polls_or_none(pollers),
                              KIND_PLAIN)
            gate = gate_of(bind_par(args, kwargs), "poll_and_all_reduce")
            if gate is False:
                return o_par(pollers, gloo_group, *args, **kwargs)
            reqs, bufs, sargs = gate
            gated = reqs is not None and bufs is not None and sargs is not None
            if gated and gate_fn is None:
                return o_par(pollers, gloo_group, *args, **kwargs)
            polls = polls_of(pollers)
            if gated:  # sglang's gate: a Success whose metadata has not landed
                gate_fn(polls, reqs, bufs, sargs)
            return reduce(bridge, g, gloo_group, pollers, polls,
                          KIND_GATED if gated else KIND_PLAIN)

        out["poll_and_all_reduce"] = poll_and_all_reduce
        if fast_prob is not None and isinstance(seg, _kvcoord.Segment):
            # the plain path above in C (python/ext/_pollcall.c), the same
            # decisions; every other call goes to the wrapper above
            def injected(pollers, gloo_group, g):
                return reduce(bridge, g, gloo_group, pollers, inject(pollers), KIND_PLAIN)

            def failed_plain(g, gloo_group, pollers, err):
                return failed(bridge, g, gloo_group, pollers, None, err)

            fast = _kvcoord.PollCall(seg, poll_and_all_reduce, groups, Group, fast_prob,
                                     injected, failed_plain, counts, timeout)
            functools.update_wrapper(fast, poll_and_all_reduce)
            out["poll_and_all_reduce"] = fast

    if o_cp is not None:

        def poll_and_all_reduce_attn_cp_tp_group(pollers, attn_cp_cpu_group, attn_tp_cpu_group):
            gt = group_of(attn_tp_cpu_group)
            gc = group_of(attn_cp_cpu_group)
            if (gt is None and gc is None) or o_par is None:
                return o_cp(pollers, attn_cp_cpu_group, attn_tp_cpu_group)
            polls = out["poll_and_all_reduce"](pollers, attn_tp_cpu_group)
            gc = group_of(attn_cp_cpu_group)  # may have fallen back meanwhile
            if gc is None:
                return _torch_min(polls, attn_cp_cpu_group)
            return reduce(bridge, gc, attn_cp_cpu_group, None, polls, KIND_CP)

        out["poll_and_all_reduce_attn_cp_tp_group"] = poll_and_all_reduce_attn_cp_tp_group

    if o_stg is not None:
        bind_stg = _binder(o_stg, 3)

        def poll_and_all_reduce_with_staging(decode_reqs, staging_handler, gloo_group, *args,
                                             **kwargs):
            g = group_of(gloo_group)
            if g is None:
                return o_stg(decode_reqs, staging_handler, gloo_group, *args, **kwargs)
            gate = gate_of(bind_stg(args, kwargs), "poll_and_all_reduce_with_staging")
            if gate is False:
                return o_stg(decode_reqs, staging_handler, gloo_group, *args, **kwargs)
            _, bufs, sargs = gate
            gated = bufs is not None and sargs is not None
            if gated and gate_fn is None:
                return o_stg(decode_reqs, staging_handler, gloo_group, *args, **kwargs)

            def staging_pending(dr):
                return dr.kv_receiver.require_staging and not staging_handler.is_done(dr)

            for dr in decode_reqs:  # advance the scatter of transfers still staging
                if staging_pending(dr):
                    staging_handler.advance_scatter(dr)
            receivers = [dr.kv_receiver for dr in decode_reqs]
            polls = polls_of(receivers)
            for i, dr in enumerate(decode_reqs):  # received, not scattered yet: not done
                if polls[i] == SUCCESS and staging_pending(dr):
                    polls[i] = TRANSFERRING
            if gated:
                gate_fn(polls, decode_reqs, bufs, sargs)
            return reduce(bridge, g, gloo_group, receivers, polls, KIND_STAGING)

        out["poll_and_all_reduce_with_staging"] = poll_and_all_reduce_with_staging
    return out
