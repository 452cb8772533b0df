"""kvcoord.sglang.install()'s poll all-reduces across forked TP ranks (gloo
worlds on CPU, the sglang-shaped fixture): poll_and_all_reduce over 400
steps of random polls at 2, 4 and 8 ranks equals, on every rank and step,
sglang's original (the gloo MIN) of the same inputs, and so do the
metadata-gate and staging variants in the same steps and the attention
CP x TP one; a room kvcoord failed itself (the TTL) polls Failed on every
rank in the same step.  Needs Segment.allreduce_min.

Issue 30's rows, with real processes:
- errors reaching sglang: with 32 groups in use in the segment, a new
  group's poll is sglang's own (gloo), logged once, never FullError;
  uninstall() while a poll waits returns at once, and that poll ends on
  sglang's own path with the right answer;
- rooms after a rank dies: rank 1 SIGKILLed after joining 1,500 of rank
  0's 3,000 rooms: every one of the 3,000 is Failed when rank 0's poll
  tells it, the 1,500 it never joined naming it.

The polls made by the C call (Segment.poll_allreduce with polls None, the
installed poll's way while sglang's failure injection is off), in one
process: each poller's poll() called once, in order, taken as int() takes
it; what poll() raises propagates; a value outside 0..4 is named; a call
that fails after polling hands its polls on (.polls), so that sglang's own
reduction runs on them without polling again.
"""

import enum
import logging
import os
import random
import signal
import threading
import time
import unittest

import kvcoord
from kvctest import DEADLINE, SMALL, collect, fork_children
from sgltest import has_collective
from test_sglang_ranks import ADDR, Segmented, path_of, start


class Poller:
    """A KV sender or receiver as the poll all-reduce sees it."""

    def __init__(self, room):
        self.bootstrap_room = room
        self.state = 1
        self.require_staging = False

    def poll(self):
        return self.state


class DecodeReq:
    def __init__(self, room, index):
        self.kv_receiver = Poller(room)
        self.metadata_buffer_index = index
        self.req = None


class Staging:
    """sglang's staging handler: is_done / advance_scatter per request."""

    def __init__(self):
        self.done = set()
        self.advanced = 0

    def is_done(self, dr):
        return dr.kv_receiver.bootstrap_room in self.done

    def advance_scatter(self, dr):
        self.advanced += 1


class Buffers:
    def __init__(self, n):
        self.bootstrap_room = [0] * n


def random_steps(i, name, store, n, steps):
    dist, utils, decode, common, mooncake = start(i, n, name, store)
    group = dist.new_group(backend="gloo")
    orig = utils.poll_and_all_reduce.__kvcoord_original__
    orig_stg = utils.poll_and_all_reduce_with_staging.__kvcoord_original__
    pollers = [Poller(r) for r in range(1, 65)]
    reqs = [DecodeReq(r, r) for r in range(1, 65)]
    bufs, staging = Buffers(65), Staging()
    mine = random.Random(1000 + i)
    shared = random.Random(7)  # the same on every rank: list lengths and kinds
    differ, results = 0, []
    for step in range(steps):
        k = shared.randrange(1, 65)
        kind = shared.randrange(3)
        if kind == 0:  # plain
            for p in pollers[:k]:
                p.state = mine.randrange(5)
            got = utils.poll_and_all_reduce(pollers[:k], group)
            want = orig(pollers[:k], group)
        elif kind == 1:  # with the metadata gate
            for dr in reqs[:k]:
                dr.kv_receiver.state = mine.randrange(5)
                bufs.bootstrap_room[dr.metadata_buffer_index] = mine.randrange(2)
            args = (reqs[:k], bufs, object())
            got = decode.poll_and_all_reduce([d.kv_receiver for d in reqs[:k]], group, *args)
            want = orig([d.kv_receiver for d in reqs[:k]], group, *args)
        else:  # staging, then the gate
            for dr in reqs[:k]:
                dr.kv_receiver.state = mine.randrange(5)
                dr.kv_receiver.require_staging = mine.random() < 0.5
                (staging.done.add if mine.random() < 0.5 else staging.done.discard)(
                    dr.kv_receiver.bootstrap_room)
            got = decode.poll_and_all_reduce_with_staging(reqs[:k], staging, group, bufs,
                                                          object())
            want = orig_stg(reqs[:k], staging, group, bufs, object())
        differ += got != want
        results.append(got)
    return {"differ": differ, "results": results, "path": path_of(utils, group),
            "advanced": staging.advanced}


@unittest.skipUnless(has_collective(), "this build has no Segment.allreduce_min")
class PollAgreement(Segmented):
    # 400 steps: each of the three kinds of step about 130 times, every
    # request count 1..64 and poll state drawn many times over; 1,000 (the
    # count before) drew the same kinds of input for 2.5x the CI time
    def check(self, n, steps=400):
        res = self.run_ranks(n, random_steps, steps)
        for i, r in enumerate(res):
            self.assertEqual(r["path"], "kvcoord", i)
            self.assertEqual(r["differ"], 0, "rank %d: %d steps differ from gloo" % (i, r["differ"]))
            self.assertEqual(r["results"], res[0]["results"], "rank %d disagrees" % i)
            self.assertGreater(r["advanced"], 0)  # the staging steps ran (twice per step)
        self.assertEqual(len(res[0]["results"]), steps)

    def test_2_ranks(self):
        self.check(2)

    def test_4_ranks(self):
        self.check(4)

    def test_8_ranks(self):
        self.check(8)


def cp_tp(i, name, store, n):
    dist, utils, decode, common, mooncake = start(i, n, name, store)
    tp = [dist.new_group([0, 1], backend="gloo"), dist.new_group([2, 3], backend="gloo")]
    cp = [dist.new_group([0, 2], backend="gloo"), dist.new_group([1, 3], backend="gloo")]
    tpg, cpg = tp[i // 2], cp[i % 2]
    from sglang.srt.disaggregation import prefill

    orig = prefill.poll_and_all_reduce_attn_cp_tp_group.__kvcoord_original__
    pollers = [Poller(r) for r in range(1, 17)]
    mine = random.Random(50 + i)
    differ, results = 0, []
    for _ in range(200):
        for p in pollers:
            p.state = mine.randrange(5)
        got = prefill.poll_and_all_reduce_attn_cp_tp_group(pollers, cpg, tpg)
        differ += got != orig(pollers, cpg, tpg)
        results.append(got)
    return {"differ": differ, "results": results,
            "paths": [path_of(utils, tpg), path_of(utils, cpg)]}


def ttl_fold(i, name, store, n):
    import time

    dist, utils, decode, common, mooncake = start(i, n, name, store)
    group = dist.new_group(backend="gloo")
    decode.poll_and_all_reduce([], group)  # the handshake first: slow on a loaded machine
    m = mooncake.MooncakeKVManager(i)
    rcv = mooncake.MooncakeKVReceiver(m, ADDR, 2001)
    fresh = mooncake.MooncakeKVReceiver(m, ADDR, 2002)
    polls = decode.poll_and_all_reduce([rcv, fresh], group)
    assert polls == [1, 1], polls
    end = time.monotonic() + DEADLINE  # a hang guard, not a speed limit
    while time.monotonic() < end:  # rank 0 keeps room 2002 updated; 2001 is left to the TTL
        if i == 0:
            m.update_status(2002, 2)
        polls = decode.poll_and_all_reduce([rcv, fresh], group)
        if polls[0] == 0:
            break
        time.sleep(0.01)
    else:
        return [polls, None, "room 2001 never polled Failed", None]
    try:
        rcv.failure_exception()
    except Exception as e:
        return [polls, type(e).__name__, e.failure_reason, e.is_from_another_rank]


def injection_at_run_time(i, name, store, n):
    """sglang's failure injection turned on and off between steps (its
    probability is read every step): on, the plain poll is sglang's helper's
    (every room Failed, no poll() made); off, the C call's polls again."""
    dist, utils, decode, common, mooncake = start(i, n, name, store)
    group = dist.new_group(backend="gloo")
    order = []
    pollers = [Counted(300 + k, 1 + (k + i) % 4, order) for k in range(8)]
    out = [utils.poll_and_all_reduce(pollers, group)]
    os.environ["DISAGGREGATION_TEST_FAILURE_PROB"] = "1"
    out.append(utils.poll_and_all_reduce(pollers, group))
    calls_on = [p.calls for p in pollers]
    del os.environ["DISAGGREGATION_TEST_FAILURE_PROB"]
    out.append(utils.poll_and_all_reduce(pollers, group))
    return {"out": out, "calls_on": calls_on, "calls": [p.calls for p in pollers],
            "path": path_of(utils, group)}


def installed_call(i, name, store, n):
    """The installed poll_and_all_reduce is a PollCall (its plain path in C)
    dressed as the wrapper: the plain call, a call with sglang's keyword
    arguments (the wrapper's way) and a gate of Nones give the same answer,
    polling each poller once per call; read from a class it is itself, and
    bound on an instance as a function is."""
    dist, utils, decode, common, mooncake = start(i, n, name, store)
    group = dist.new_group(backend="gloo")
    f = utils.poll_and_all_reduce
    order = []
    pollers = [Counted(400 + k, 1 + (k + i) % 4, order) for k in range(8)]
    out = [f(pollers, group), f(pollers, group, decode_reqs=None),
           f(pollers, group, None, None, None)]

    class Holder:
        call = f

    return {"type": type(f).__name__, "name": f.__name__, "wrapped": callable(f.__wrapped__),
            "original": f.__kvcoord_original__.__module__, "out": out,
            "calls": [p.calls for p in pollers], "class_get": Holder.call is f,
            "bound": Holder().call.__self__.__class__.__name__,
            "path": path_of(utils, group)}


@unittest.skipUnless(has_collective(), "this build has no Segment.allreduce_min")
class Variants(Segmented):
    def capacities(self):
        return dict(SMALL, room_ttl=0.3) if "ttl" in self.id() else SMALL

    def test_failure_injection_read_every_step(self):
        want = [min(1 + (k + i) % 4 for i in range(2)) for k in range(8)]
        for r in self.run_ranks(2, injection_at_run_time):
            self.assertEqual(r["path"], "kvcoord")
            self.assertEqual(r["out"], [want, [0] * 8, want])
            self.assertEqual(r["calls_on"], [1] * 8)  # injected: no poll() made
            self.assertEqual(r["calls"], [2] * 8)

    def test_the_installed_call_in_c(self):
        want = [min(1 + (k + i) % 4 for i in range(2)) for k in range(8)]
        for r in self.run_ranks(2, installed_call):
            self.assertEqual(r["type"], "PollCall")
            self.assertEqual(r["name"], "poll_and_all_reduce")
            self.assertTrue(r["wrapped"])
            self.assertEqual(r["original"], "sglang.srt.disaggregation.utils")
            self.assertEqual(r["path"], "kvcoord")
            self.assertEqual(r["out"], [want] * 3)
            self.assertEqual(r["calls"], [3] * 8)
            self.assertTrue(r["class_get"])
            self.assertEqual(r["bound"], "Holder")

    def test_attn_cp_tp_group(self):
        res = self.run_ranks(4, cp_tp)
        for i, r in enumerate(res):
            self.assertEqual(r["paths"], ["kvcoord", "kvcoord"])
            self.assertEqual(r["differ"], 0, i)
            self.assertEqual(r["results"], res[0]["results"])

    def test_ttl_fails_the_room_on_every_rank(self):
        res = self.run_ranks(3, ttl_fold)
        for r in res:
            polls, cls, reason, other = r
            self.assertEqual(polls[0], 0)
            self.assertEqual(cls, "KVTransferError")
            self.assertIn("timed out after 0.3 s", reason)
            self.assertTrue(other)
        self.assertEqual(len({tuple(r[0]) for r in res}), 1)  # the same step's answer


class Logged(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.lines = []

    def emit(self, record):
        self.lines.append(record.getMessage())


def full_segment(i, name, store, n):
    dist, utils, decode, common, mooncake = start(i, n, name, store)
    logged = Logged()
    logging.getLogger("kvcoord.sglang").addHandler(logged)
    group = dist.new_group(backend="gloo")
    orig = utils.poll_and_all_reduce.__kvcoord_original__
    pollers = [Poller(r) for r in range(1, 17)]
    mine = random.Random(70 + i)
    differ, errors = 0, []
    for _ in range(20):
        for p in pollers:
            p.state = mine.randrange(5)
        try:
            got = decode.poll_and_all_reduce(pollers, group)
        except Exception as e:  # must not happen: sglang's own path instead
            errors.append("%s: %s" % (type(e).__name__, e))
            continue
        differ += got != orig(pollers, group)
    return {"differ": differ, "errors": errors, "path": path_of(utils, group),
            "warnings": [w for w in logged.lines if "FullError" in w]}


def uninstalled_mid_poll(i, name, store, n):
    dist, utils, decode, common, mooncake = start(i, n, name, store, timeout=DEADLINE)
    import kvcoord.sglang as ksg

    group = dist.new_group(backend="gloo")
    orig = utils.poll_and_all_reduce.__kvcoord_original__
    decode.poll_and_all_reduce([], group)  # the handshake: the group runs in the segment
    pollers = [Poller(r) for r in range(1, 5)]
    for k, p in enumerate(pollers):
        p.state = (k + i) % 5
    if i == 1:  # waits for rank 0 to have uninstalled, then sglang's own poll
        dist.barrier()
        return {"got": orig(pollers, group)}
    out = {}

    def poll():
        try:
            out["got"] = decode.poll_and_all_reduce(pollers, group)
        except Exception as e:
            out["got"] = "%s: %s" % (type(e).__name__, e)

    t = threading.Thread(target=poll)
    t.start()
    time.sleep(0.3)  # inside the poll's wait for rank 1
    out["uninstalled"] = ksg.uninstall()
    out["poll_still_waits"] = t.is_alive()  # rank 1 has not polled yet: gloo waits for it
    dist.barrier()  # now rank 1 runs sglang's own poll
    t.join(DEADLINE)
    out["joined"] = not t.is_alive()
    return out


@unittest.skipUnless(has_collective(), "this build has no Segment.allreduce_min")
class ErrorsReachingSglang(Segmented):
    def test_33rd_group_falls_back_to_gloo(self):
        holder = kvcoord.Segment(self.name, role="client")
        try:
            for gid in range(32):  # 32 groups with a live member: the segment is full
                holder.allreduce_min(0x7700 + gid, 1, 0, b"")
            with self.assertRaises(kvcoord.FullError):
                holder.allreduce_min(0x7799, 1, 0, b"")
            res = self.run_ranks(2, full_segment)
        finally:
            holder.close()
        for i, r in enumerate(res):
            self.assertEqual(r["errors"], [], i)
            self.assertEqual(r["differ"], 0, i)
            self.assertEqual(r["path"], "gloo", i)
            self.assertEqual(len(r["warnings"]), 1, r["warnings"])  # logged once

    def test_uninstall_does_not_wait_out_a_poll(self):
        res = self.run_ranks(2, uninstalled_mid_poll)
        want = [min(k % 5, (k + 1) % 5) for k in range(4)]
        self.assertEqual(res[1]["got"], want)
        self.assertEqual(res[0]["got"], want)  # ended on sglang's own path
        self.assertTrue(res[0]["uninstalled"])
        self.assertTrue(res[0]["poll_still_waits"])
        self.assertTrue(res[0]["joined"])


ROOMS = 3000


def rank_dies(i, name, store, n):
    dist, utils, decode, common, mooncake = start(i, n, name, store, timeout=DEADLINE)
    group = dist.new_group(backend="gloo")
    decode.poll_and_all_reduce([], group)  # the handshake
    m = mooncake.MooncakeKVManager(i)
    rooms = range(10000, 10000 + ROOMS)
    if i == 1:  # joins the first half of rank 0's rooms, then is SIGKILLed
        for room in rooms[:ROOMS // 2]:
            mooncake.MooncakeKVSender(m, ADDR, room)
        os.kill(os.getpid(), signal.SIGKILL)
    senders = [mooncake.MooncakeKVSender(m, ADDR, room) for room in rooms]
    try:
        decode.poll_and_all_reduce(senders[:64], group)
        return {"error": "the poll completed without rank 1"}
    except kvcoord.CollectiveError as e:
        told = [str(e), e.ranks, e.dead]
    import importlib

    seg = importlib.import_module("kvcoord.sglang.install").active_bridge().segment
    states, reasons = {}, {}
    for room in rooms:  # read at once: nothing waits for the TTL
        info = seg.room_get(room, 0)
        states[int(info.state)] = states.get(int(info.state), 0) + 1
        if room in (rooms[0], rooms[-1]):
            reasons[room] = info.failure.reason if info.failure else None
    return {"told": told, "states": states, "joined": reasons[rooms[0]],
            "never_joined": reasons[rooms[-1]], "pid_check": os.getpid()}


@unittest.skipUnless(has_collective(), "this build has no Segment.allreduce_min")
class RoomsAfterARankDies(Segmented):
    def capacities(self):
        return dict(SMALL, max_rooms=8192)

    def test_rooms_it_never_joined_fail_at_once(self):
        kids = fork_children(2, rank_dies, self.name, self.store, 2)
        reports = collect(kids)
        self.assertNotIn("result", reports[1])  # SIGKILLed: no report
        self.assertNotIn("error", reports[0], reports[0].get("error"))
        r = reports[0]["result"]
        self.assertNotIn("error", r, r.get("error"))
        self.assertEqual(r["told"][1:], [[1], True], r["told"][0])
        self.assertEqual(r["states"], {"0": ROOMS})  # every room Failed (JSON keys)
        self.assertIn("rank 1", r["joined"])
        self.assertIn("rank 1 (pid %d) of this room's TP group died before it joined room %d"
                      % (kids[1][0], 10000 + ROOMS - 1), r["never_joined"])


class Counted:
    """A poller whose poll() is counted and answers what int() takes."""

    class State(enum.IntEnum):
        BOOTSTRAPPING = 1
        SUCCESS = 4

    class AsInt:
        def __init__(self, v):
            self.v = v

        def __int__(self):
            return self.v

    def __init__(self, room, answer, order):
        self.bootstrap_room = room
        self.answer = answer
        self.order = order
        self.calls = 0

    def poll(self):
        self.calls += 1
        self.order.append(self.bootstrap_room)
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


@unittest.skipUnless(has_collective(), "this build has no Segment.allreduce_min")
class PollsInC(Segmented):
    def setUp(self):
        super().setUp()
        self.seg = kvcoord.Segment(self.name, role="client")
        self.order = []

    def tearDown(self):
        self.seg.close()
        super().tearDown()

    def pollers(self, answers):
        return [Counted(100 + k, a, self.order) for k, a in enumerate(answers)]

    def test_each_poller_polled_once_in_order_as_int(self):
        ps = self.pollers([Counted.State.SUCCESS, 3, Counted.AsInt(2), Counted.State.BOOTSTRAPPING,
                           True, 0])
        got = self.seg.poll_allreduce(0x5e11, 1, 0, None, ps, None, 5.0, 1)
        self.assertEqual(got, [4, 3, 2, 1, 1, 0])
        self.assertEqual([type(v) for v in got], [int] * 6)
        self.assertEqual([p.calls for p in ps], [1] * 6)
        self.assertEqual(self.order, list(range(100, 106)))

    def test_what_poll_raises_propagates(self):
        ps = self.pollers([1, KeyError(101), 1])
        with self.assertRaises(KeyError):
            self.seg.poll_allreduce(0x5e12, 1, 0, None, ps)
        self.assertEqual([p.calls for p in ps], [1, 1, 0])  # as sglang's loop: stops there

    def test_a_poll_outside_the_states_is_named(self):
        for bad in (5, -1, 1 << 70):
            with self.assertRaisesRegex(kvcoord.InvalidArgumentError,
                                        r"pollers\[1\]\.poll\(\) returned"):
                self.seg.poll_allreduce(0x5e13, 1, 0, None, self.pollers([2, bad]))
        with self.assertRaises(ValueError):  # int() refuses them, as in sglang's loop
            self.seg.poll_allreduce(0x5e13, 1, 0, None, self.pollers([2, "x"]))
        with self.assertRaises(TypeError):
            self.seg.poll_allreduce(0x5e13, 1, 0, None, self.pollers([2, None]))
        with self.assertRaises(TypeError):
            self.seg.poll_allreduce(0x5e13, 1, 0, None, None)

    def test_a_call_failing_after_the_polls_hands_them_on(self):
        ps = self.pollers([3, 4, 2])
        self.seg.close()
        with self.assertRaises(kvcoord.Error) as cm:
            self.seg.poll_allreduce(0x5e14, 1, 0, None, ps)
        self.assertEqual(cm.exception.polls, [3, 4, 2])
        self.assertEqual([p.calls for p in ps], [1, 1, 1])
        with self.assertRaises(kvcoord.Error) as cm:  # polls given: nothing to hand on
            self.seg.poll_allreduce(0x5e14, 1, 0, [3, 4, 2])
        self.assertFalse(hasattr(cm.exception, "polls"))

    def test_a_poll_that_closes_the_segment(self):
        # the rooms followed (the fold would read them): a poll() closing
        # the segment unmaps it; the polls go on, the call fails closed
        # handing them on
        for k in range(6):
            self.seg.room_open(200 + k, 0)
        seg = self.seg

        class Closer(Counted):
            def poll(self):
                seg.close()
                return super().poll()

        ps = self.pollers([3, 4, 2, 1, 3, 2])
        ps[2] = Closer(202, 2, self.order)
        follows = {200 + k: 1 for k in range(6)}
        with self.assertRaises(kvcoord.Error) as cm:
            self.seg.poll_allreduce(0x5e16, 1, 0, None, ps, follows)
        self.assertEqual(cm.exception.polls, [3, 4, 2, 1, 3, 2])
        self.assertEqual([p.calls for p in ps], [1] * 6)

    def test_followed_rooms_polled_in_c(self):
        for k in range(6):
            self.seg.room_open(210 + k, 0)
        self.seg.room_fail(213, 0, "by a rank")  # a rank's own failure: not folded
        ps = [Counted(210 + k, a, self.order) for k, a in enumerate([3, 4, 2, 1, 3, 2])]
        follows = {210 + k: 1 for k in range(6)}
        got = self.seg.poll_allreduce(0x5e17, 1, 0, None, ps, follows)
        self.assertEqual(got, [3, 4, 2, 1, 3, 2])
        self.assertEqual([p.calls for p in ps], [1] * 6)

    def test_a_room_set_folds_what_changed_between_calls(self):
        """The followed rooms as a RoomSet (the bridge's, looked up in C): a room
        whose other participant is SIGKILLed between two calls polls Failed in
        the second (kvcoord failed it), a room the set stopped holding does
        not, and the hints the first call left (kvc_poll_prefetch) change
        nothing."""
        rooms = (230, 231, 232)
        rs = kvcoord._kvcoord.RoomSet()
        for room in rooms:
            self.seg.room_open(room, 0, 2)
            self.assertTrue(rs.add(room))
        self.assertFalse(rs.add(231))
        self.assertFalse(rs.add(-1))  # never a room id: never held
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # rank 1 of rooms 230 and 232, then killed
            try:
                seg = kvcoord.Segment(self.name, role="client")
                seg.room_open(230, 1, 2)
                seg.room_open(232, 1, 2)
                os.write(w, b"j")
                time.sleep(3600)
            finally:
                os._exit(1)
        os.close(w)
        try:
            self.assertEqual(os.read(r, 1), b"j")
            ps = [Counted(room, 3, self.order) for room in rooms]
            self.assertEqual(self.seg.poll_allreduce(0x5e18, 1, 0, None, ps, rs), [3, 3, 3])
        finally:
            os.close(r)
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        self.assertTrue(rs.discard(232))
        self.assertFalse(rs.discard(232))
        self.assertEqual((len(rs), 230 in rs, 232 in rs), (2, True, False))
        time.sleep(0.25)  # past the 100 ms a participant's liveness is trusted without a test
        # 232 (its participant dead too) is no longer followed: left as polled
        self.assertEqual(self.seg.poll_allreduce(0x5e18, 1, 0, None, ps, rs), [0, 3, 3])
        self.assertEqual(self.seg.room_get(230, 0).failure.origin_pid, 0)  # kvcoord's
        rs.clear()
        self.assertEqual(len(rs), 0)

    def test_keywords_as_positionals(self):
        ps = self.pollers([2, 3])
        got = self.seg.poll_allreduce(group=0x5e15, size=1, rank=0, polls=None, pollers=ps,
                                      kind=1, timeout=5.0)
        self.assertEqual(got, [2, 3])
        self.assertEqual(self.seg.poll_allreduce(0x5e15, 1, 0, [4, 0], kind=1), [4, 0])


if __name__ == "__main__":
    unittest.main()
