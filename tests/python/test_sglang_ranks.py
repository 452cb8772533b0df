"""kvcoord.sglang.install() across forked TP ranks, each with its own
torch.distributed gloo world on CPU and the sglang-shaped fixture:

- 8 ranks, rank 5 fails a room: sglang's poll all-reduce agrees on Failed,
  the origin raises its own reason (is_from_another_rank False), the other
  seven the same reason (True), all of the fixture's own KVTransferError.
- (test_sglang_poll.py: the poll agreement against gloo, its variants)
- a rank SIGKILLed before a collective: the others raise CollectiveError
  naming it, within the timeout.
The collective tests need Segment.allreduce_min (skipped in a build
without it); the failure-reason test runs either way (the fallback: gloo).
"""

import os
import signal
import unittest

import kvcoord
from kvctest import SMALL, collect, discard, fork_children, new_name
from sgltest import has_collective, store_path

REASON = "ibv_post_send: transport retry counter exceeded"
ADDR = "10.0.0.9:8998"


def start(i, n, name, store, **kw):
    """In a forked rank: the fixture, gloo world n, install(); (dist, modules)."""
    from sgltest import gloo, use_fixture

    use_fixture()
    dist = gloo(i, n, store)
    import kvcoord.sglang as ksg
    from sglang.srt.disaggregation import decode, utils
    from sglang.srt.disaggregation.common import conn as common
    from sglang.srt.disaggregation.mooncake import conn as mooncake

    ksg.install(name, i, size=n, **kw)
    return dist, utils, decode, common, mooncake


def path_of(utils, group):
    """'kvcoord' when this group's all-reduce runs in the segment, else 'gloo'."""
    import sys

    bridge = sys.modules["kvcoord.sglang.install"].active_bridge()
    return "kvcoord" if bridge.groups[id(group)][1] is not None else "gloo"


class Segmented(unittest.TestCase):
    def setUp(self):
        self.name = new_name("sglranks")
        self.store = store_path()
        with kvcoord.Segment(self.name, mode="fresh", role="none", **self.capacities()):
            pass

    def capacities(self):
        return SMALL

    def tearDown(self):
        discard(self.name)
        for p in (self.store,):
            try:
                os.unlink(p)
            except FileNotFoundError:
                pass

    def run_ranks(self, n, fn, *args):
        reports = collect(fork_children(n, fn, self.name, self.store, n, *args))
        for i, rep in sorted(reports.items()):
            self.assertNotIn("error", rep, "rank %d: %s" % (i, rep.get("error")))
        return [reports[i]["result"] for i in range(n)]


def fail_one_room(i, name, store, n):
    dist, utils, decode, common, mooncake = start(i, n, name, store)
    group = dist.new_group(backend="gloo")
    m = mooncake.MooncakeKVManager(i)
    rooms = [1001, 1002, 1003]
    senders = [mooncake.MooncakeKVSender(m, ADDR, r) for r in rooms]
    seen = []
    for step in (2, 3, 4):  # WaitingForInput, Transferring, Success
        for r in rooms:
            if r == 1002 and step == 3 and i == 5:
                m.update_status(r, 0)  # rank 5's RDMA WRITE failed: Failed, then the
                m.record_failure(r, REASON)  # reason (the order sglang's threads may take)
            else:
                m.update_status(r, step)
        seen.append(decode.poll_and_all_reduce(senders, group))
    out = {"polls": seen, "path": path_of(utils, group)}
    for s, agreed in zip(senders, seen[-1]):
        if agreed == 0:
            try:
                s.failure_exception()
            except Exception as e:
                out["error"] = [type(e).__name__, str(e), e.is_from_another_rank,
                                isinstance(e, common.KVTransferError),
                                type(e) is common.KVTransferError]
        else:
            s.clear()
    return out


class FailureReason(Segmented):
    def test_rank_5_fails_a_room(self):
        res = self.run_ranks(8, fail_one_room)
        want_path = "kvcoord" if has_collective() else "gloo"
        for i, r in enumerate(res):
            self.assertEqual(r["path"], want_path)
            self.assertEqual(r["polls"], [[2, 2, 2], [3, 0, 3], [4, 0, 4]], i)
            self.assertEqual(r["error"], ["KVTransferError",
                                          "KVTransferError(bootstrap_room=1002): " + REASON,
                                          i != 5, True, True], i)
        with kvcoord.Segment(self.name, role="none") as seg:
            self.assertEqual(seg.rooms(), [])  # every rank cleared every room: released


class Poller:
    """A KV sender or receiver as the poll all-reduce sees it."""

    def __init__(self, room):
        self.bootstrap_room = room
        self.state = 1
        self.require_staging = False

    def poll(self):
        return self.state


def killed(i, name, store, n):
    dist, utils, decode, common, mooncake = start(i, n, name, store, timeout=30.0)
    group = dist.new_group(backend="gloo")
    pollers = [Poller(r) for r in range(1, 9)]
    for step in range(100):
        if step == 50 and i == 2:
            os.kill(os.getpid(), signal.SIGKILL)
        try:
            utils.poll_and_all_reduce(pollers, group)
        except kvcoord.Error as e:
            return [step, type(e).__name__, str(e), list(e.ranks), e.dead]
    return [step, None, None, None, None]


@unittest.skipUnless(has_collective(), "this build has no Segment.allreduce_min")
class KilledMidCollective(Segmented):
    def test_others_raise_naming_it(self):
        kids = fork_children(4, killed, self.name, self.store, 4)
        reports = collect(kids)
        self.assertNotIn("result", reports[2])  # SIGKILLed: no report
        for i in (0, 1, 3):
            self.assertNotIn("error", reports[i], reports[i].get("error"))
            step, cls, text, ranks, dead = reports[i]["result"]
            self.assertEqual((step, cls, ranks, dead), (50, "CollectiveError", [2], True), text)
            self.assertIn("rank 2", text)


if __name__ == "__main__":
    unittest.main()
