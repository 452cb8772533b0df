"""kvcoord.sglang.install()'s poll all-reduces across forked TP ranks (gloo
worlds on CPU, the sglang-shaped fixture): poll_and_all_reduce over 400
steps of random polls at 2, 4 and 8 ranks equals, on every rank and step,
sglang's original (the gloo MIN) of the same inputs, and so do the
metadata-gate and staging variants in the same steps and the attention
CP x TP one; a room kvcoord failed itself (the TTL) polls Failed on every
rank in the same step.  Needs Segment.allreduce_min.
"""

import random
import unittest

from kvctest import DEADLINE, SMALL
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


@unittest.skipUnless(has_collective(), "this build has no Segment.allreduce_min")
class Variants(Segmented):
    def capacities(self):
        return dict(SMALL, room_ttl=0.3) if "ttl" in self.id() else SMALL

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


if __name__ == "__main__":
    unittest.main()
