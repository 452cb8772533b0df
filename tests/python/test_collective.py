"""Segment.allreduce_min: the segment's MIN all-reduce from Python, against
torch.distributed.all_reduce(uint8 tensor, op=MIN) over gloo on CPU for the
same inputs at 2, 4 and 8 forked ranks; a rank SIGKILLed mid-collective; a
rank that does not arrive; bad arguments."""

import os
import random
import signal
import tempfile
import time
import unittest

import kvcoord
from kvctest import (SMALL, SegmentCase, collect, discard, exit_code, fork_children, free_port,
                     new_name)

try:
    import torch  # imported before forking: the children inherit it
    import torch.distributed as dist
except ImportError:  # pragma: no cover - Debian's python3-torch is a test dependency
    torch = None

STEPS = 300
ROOMS = 64
LONG = 60.0  # hang guard, never expected to run out


def polls(seed, step, rank, n):
    """Rank `rank`'s poll vector of step `step`: every child derives every
    rank's vector from the shared seed."""
    rng = random.Random((seed * 7919 + step) * 131 + rank)
    if step % 3 == 0:
        return [rng.randrange(256) for _ in range(n)]
    return [rng.choice((0, 1, 2, 3, 3, 4, 4, 4)) for _ in range(n)]


def min_of(seed, step, size, n):
    return [min(v) for v in zip(*(polls(seed, step, r, n) for r in range(size)))]


def gloo_child(rank, size, name, port, seed):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % port, rank=rank,
                            world_size=size)
    kv_vs_gloo = kv_vs_min = 0
    with kvcoord.Segment(name, role="worker", rank=rank) as seg:
        for step in range(STEPS):
            n = ROOMS if step % 5 else (0, 1, 7, 600, 2000)[step // 5 % 5]
            mine = polls(seed, step, rank, n)
            got = list(seg.allreduce_min(0x9100 + size, size, rank, mine, timeout=LONG))
            t = torch.tensor(mine, dtype=torch.uint8)
            dist.all_reduce(t, op=dist.ReduceOp.MIN)
            kv_vs_gloo += got != t.tolist()
            kv_vs_min += got != min_of(seed, step, size, n)
    dist.destroy_process_group()
    return [kv_vs_gloo, kv_vs_min]


@unittest.skipIf(torch is None, "needs torch (Debian's python3-torch)")
class AgreesWithGloo(SegmentCase):
    def agree(self, size):
        port = free_port()
        res = collect(fork_children(size, gloo_child, size, self.name, port, size * 11))
        for i in range(size):
            self.assertNotIn("error", res[i], res[i].get("error"))
            self.assertEqual(res[i]["result"], [0, 0],
                             "rank %d: [disagreements with gloo, with the MIN] over %d steps"
                             % (i, STEPS))

    def test_2_ranks(self):
        self.agree(2)

    def test_4_ranks(self):
        self.agree(4)

    def test_8_ranks(self):
        self.agree(8)


def killed_child(rank, name, victim_steps):
    with kvcoord.Segment(name, role="worker", rank=rank) as seg:
        for step in range(victim_steps):
            seg.allreduce_min(0x4b1, 4, rank, polls(3, step, rank, ROOMS), timeout=LONG)
        if rank == 3:
            os.kill(os.getpid(), signal.SIGKILL)
        try:
            seg.allreduce_min(0x4b1, 4, rank, polls(3, victim_steps, rank, ROOMS), timeout=LONG)
        except kvcoord.CollectiveError as e:
            # The next call fails the same way: nobody took rank 3 over.
            try:
                seg.allreduce_min(0x4b1, 4, rank, b"\x01" * ROOMS, timeout=LONG)
                again = None
            except kvcoord.CollectiveError as e2:
                again = [e2.ranks, e2.dead]
            return {"msg": str(e), "ranks": e.ranks, "dead": e.dead, "code": e.code,
                    "is_error": isinstance(e, kvcoord.Error), "again": again}
        return {"msg": None}


def reaped_child(rank, name, go):
    """Three ranks take one round; rank 2 then SIGKILLs itself, and ranks 0
    and 1 call again only once the parent has reaped it (go exists)."""
    with kvcoord.Segment(name, role="worker", rank=rank) as seg:
        seg.allreduce_min(0x309, 3, rank, [rank] * 8, timeout=LONG)
        if rank == 2:
            os.kill(os.getpid(), signal.SIGKILL)
        while not os.path.exists(go):
            time.sleep(0.01)
        try:
            seg.allreduce_min(0x309, 3, rank, [rank] * 8, timeout=LONG)
        except kvcoord.CollectiveError as e:
            return {"msg": str(e), "ranks": e.ranks, "dead": e.dead}
        return {"msg": None}


def late_child(rank, name):
    with kvcoord.Segment(name, role="worker", rank=rank) as seg:
        # Both enter the timed call together (a barrier of their own), so
        # that only rank 2 is missing when the first one's time runs out.
        seg.allreduce_min(0xba77, 2, rank, b"", timeout=LONG)
        try:
            seg.allreduce_min(0x1a7, 3, rank, [5] * 8, timeout=1.0)
        except kvcoord.CollectiveError as e:
            return {"msg": str(e), "ranks": e.ranks, "dead": e.dead}
        return {"msg": None}


class PeerFailures(SegmentCase):
    def test_sigkilled_rank_is_named(self):
        kids = fork_children(4, killed_child, self.name, 20)
        victim = kids[3][0]
        res = collect(kids, skip=(victim,))
        _, status = os.waitpid(victim, 0)
        self.assertEqual(exit_code(status), -signal.SIGKILL)
        for i in range(3):
            self.assertNotIn("error", res[i], res[i].get("error"))
            r = res[i]["result"]
            self.assertIsNotNone(r["msg"], "rank %d's call succeeded without rank 3" % i)
            self.assertIn("rank 3 of group 0x4b1 died (pid %d" % victim, r["msg"])
            self.assertEqual(r["ranks"], [3])
            self.assertTrue(r["dead"])
            self.assertTrue(r["is_error"])
            self.assertEqual(r["again"], [[3], True])

    def test_reaped_rank_says_how_it_ended(self):
        # The trial's case: kvcoordd reaped the SIGKILLed rank (its process
        # entry freed, its pid cleared) before the others looked: they say it
        # died and how, as its rooms do, not that it "left".
        go = os.path.join(tempfile.mkdtemp(prefix="kvc-coll-"), "go")
        kids = fork_children(3, reaped_child, self.name, go)
        victim = kids[2][0]
        os.waitid(os.P_PID, victim, os.WEXITED | os.WNOWAIT)  # dead, still a zombie
        self.assertEqual(self.seg.reap_dead(), 1)
        open(go, "w").close()
        res = collect(kids, skip=(victim,))
        _, status = os.waitpid(victim, 0)
        self.assertEqual(exit_code(status), -signal.SIGKILL)
        os.unlink(go)
        os.rmdir(os.path.dirname(go))
        for i in range(2):
            self.assertNotIn("error", res[i], res[i].get("error"))
            r = res[i]["result"]
            self.assertIn("rank 2 of group 0x309 died (pid %d, killed by signal 9 (Killed))"
                          % victim, r["msg"], "rank %d" % i)
            self.assertEqual((r["ranks"], r["dead"]), ([2], True))

    def test_rank_that_does_not_arrive(self):
        # Rank 2 never calls: ranks 0 and 1 time out naming it.
        res = collect(fork_children(2, late_child, self.name))
        for i in range(2):
            self.assertNotIn("error", res[i], res[i].get("error"))
            r = res[i]["result"]
            self.assertIn("rank 2 of group 0x1a7 did not arrive within 1000 ms", r["msg"])
            self.assertEqual(r["ranks"], [2])
            self.assertFalse(r["dead"])


def epoch_child(rank, name, size, seed, steps, stay):
    """steps verified steps of group 0xe90 as rank; with stay (a pipe), rank
    0 then waits for its EOF before leaving and rank 1 SIGKILLs itself."""
    if stay is not None:
        os.close(stay[1])
    with kvcoord.Segment(name, role="worker", rank=rank) as seg:
        wrong = 0
        for step in range(steps):
            got = list(seg.allreduce_min(0xe90, size, rank, polls(seed, step, rank, ROOMS),
                                         timeout=LONG))
            wrong += got != min_of(seed, step, size, ROOMS)
        if stay is not None:
            if rank == 1:
                os.kill(os.getpid(), signal.SIGKILL)
            os.read(stay[0], 1)
        return wrong


class Epochs(SegmentCase):
    def test_new_processes_reform_a_group(self):
        # Old ranks 0 and 1; rank 1 is SIGKILLed while rank 0 lives: a new
        # process (this one) cannot take rank 1, CollectiveError names it.
        stay_r, stay_w = os.pipe()
        kids = fork_children(2, epoch_child, self.name, 2, 5, 40, (stay_r, stay_w))
        os.close(stay_r)
        _, status = os.waitpid(kids[1][0], 0)
        self.assertEqual(exit_code(status), -signal.SIGKILL)
        with kvcoord.Segment(self.name, role="worker", rank=9) as seg:
            with self.assertRaises(kvcoord.CollectiveError) as cm:
                seg.allreduce_min(0xe90, 2, 1, b"\x01" * 8, timeout=LONG)
        self.assertIn("rank 1 of group 0xe90 cannot be joined", str(cm.exception))
        self.assertIn("rank 0 still live", str(cm.exception))
        self.assertEqual(cm.exception.ranks, [1])
        self.assertTrue(cm.exception.dead)
        os.close(stay_w)  # the old rank 0 leaves
        res = collect(kids, skip=(kids[1][0],))
        self.assertEqual(res[0], {"result": 0})
        # None of the old epoch lives: 3 new processes re-form the group
        # (another size) and get the MIN from their first call on.
        res = collect(fork_children(3, epoch_child, self.name, 3, 6, STEPS, None))
        for i in range(3):
            self.assertEqual(res[i], {"result": 0}, "rank %d: wrong MINs" % i)


def mismatch_child(rank, name):
    with kvcoord.Segment(name, role="client") as seg:
        try:
            seg.allreduce_min(0x3, 2, rank, bytes(10 + 10 * rank), timeout=LONG)
            first = None
        except kvcoord.InvalidArgumentError as e:
            first = str(e)
        return [first, list(seg.allreduce_min(0x3, 2, rank, [rank + 1, 9], timeout=LONG))]


class Arguments(SegmentCase):
    def test_kinds_of_data(self):
        self.assertTrue(issubclass(kvcoord.CollectiveError, kvcoord.Error))
        self.assertIn("CollectiveError", kvcoord.__all__)
        want = bytes([3, 0, 255, 7])
        for data in (want, bytearray(want), memoryview(want), list(want), tuple(want)):
            got = self.seg.allreduce_min(1, 1, 0, data)
            self.assertIsInstance(got, bytes)
            self.assertEqual(got, want)
        self.assertEqual(self.seg.allreduce_min(1, 1, 0, b""), b"")
        big = bytes(random.randrange(256) for _ in range(5000))
        self.assertEqual(self.seg.allreduce_min(1, 1, 0, big), big)

    def test_bad_arguments(self):
        s = self.seg
        with self.assertRaises(TypeError):
            s.allreduce_min("1", 1, 0, b"x")
        with self.assertRaises(TypeError):
            s.allreduce_min(1, 1, 0, "text")
        with self.assertRaises(TypeError):
            s.allreduce_min(1, 1, 0, [1.5])
        with self.assertRaises(TypeError):
            s.allreduce_min(1, 1, 0, memoryview(b"abcd").cast("i"))
        with self.assertRaises(ValueError):
            s.allreduce_min(-1, 1, 0, b"x")
        with self.assertRaises(ValueError):
            s.allreduce_min(1 << 64, 1, 0, b"x")
        with self.assertRaises(ValueError):
            s.allreduce_min(1, 1, 0, b"x", timeout=-1)
        with self.assertRaisesRegex(kvcoord.InvalidArgumentError, r"data\[1\] is 256"):
            s.allreduce_min(1, 1, 0, [1, 256])
        with self.assertRaisesRegex(kvcoord.InvalidArgumentError, "size 0 out of range 1..64"):
            s.allreduce_min(1, 0, 0, b"x")
        with self.assertRaisesRegex(kvcoord.InvalidArgumentError, "size 65 out of range"):
            s.allreduce_min(1, 65, 0, b"x")
        with self.assertRaisesRegex(kvcoord.InvalidArgumentError, "rank 3 out of range 0..2"):
            s.allreduce_min(1, 3, 3, b"x")
        s.allreduce_min((1 << 64) - 1, 1, 0, b"x")  # the largest group id
        s.allreduce_min(1, 1, 0, b"x")  # creates group 1, of size 1
        with self.assertRaisesRegex(kvcoord.InvalidArgumentError, "size 2, the group.s ranks with size 1: a size mismatch"):
            s.allreduce_min(1, 2, 0, b"x")
        with kvcoord.Segment(self.name, role="none") as none:
            with self.assertRaisesRegex(kvcoord.InvalidArgumentError, "no process table entry"):
                none.allreduce_min(9, 1, 0, b"x")

    def test_mismatched_lengths(self):
        res = collect(fork_children(2, mismatch_child, self.name))
        for i in range(2):
            self.assertNotIn("error", res[i], res[i].get("error"))
            first, second = res[i]["result"]
            self.assertIn("rank 1 of group 0x3 called with len 20, rank 0 with len 10", first)
            self.assertEqual(second, [1, 9])  # the group works again


if __name__ == "__main__":
    unittest.main()
