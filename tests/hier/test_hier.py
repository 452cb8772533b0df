"""The hierarchical collective (kvcoord.HierGroup, include/kvcoord/hier.h)
across "hosts": network namespaces on one machine joined by a bridge
(hiernet.py), each host with its own segment, every rank a real process
(`ip netns exec`, hier_rank.py) in a gloo world across the hosts; the group
made by kvcoord._hier.handshake through that world.

 - 2x2, 2x4, 2x8 and 3x2 ranks: 1,000 random steps (lengths 0..200, KVPoll
   values; 200 steps in an ASan build, where a step costs 5-10 times more),
   the HierGroup's answer equal to gloo's all_reduce(MIN) of the same step
   on every rank and step (and, every 10th step, to the MIN computed from
   every rank's inputs).
 - a rank SIGKILLed (a non-leader; a node's leader): every other rank, on
   both hosts, fails with CollectiveError naming that rank and its host,
   dead, by death detection (before the 30 s timeout); every later call
   fails at once the same way.
 - a host's ranks all SIGSTOPped: the other host's ranks fail the step with
   the timeout naming the stopped host's ranks; after SIGCONT the group
   completes steps again on every rank, with the right MIN.
 - a rank 3 s late to a step (timeout 1 s): that step fails on every rank
   naming it and its host, the late rank's too; the next steps complete.
 - a host's kvcoordd SIGKILLed mid-run: the collective does not depend on
   it; every step goes on completing.
 - mismatched calls: a rank on the other host with another tag, a rank with
   a longer vector: that step fails on every rank naming it, before any
   timeout; the next step works.
 - the whole group restarted on the same segments: a new handshake, a new
   group that works.
 - kvcoord.sglang.install() on the sglang-shaped fixture: sglang's
   poll_and_all_reduce of a group spanning the hosts runs hierarchically
   when every rank runs kvcoord, said once in the log, through gloo when a
   rank does not; every answer equal to sglang's original (300 steps, 150
   in an ASan build).
Deadlines only guard against hangs; measured times are printed, not judged
(beyond "before the 30 s timeout" where a death or a mismatch must be seen
without waiting for it).  Needs root and ip(8); skipped otherwise.
"""

import os
import signal
import subprocess
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(1, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import hiernet  # noqa: E402
import hiertest  # noqa: E402
import kvctest  # noqa: E402  (the tests' one helper module)
from hiertest import Ranks  # noqa: E402

# Steps per Agreement case, and per Installed case (its mixed step is step
# 100).  Each of the 8 lengths and the value mixes come up many times in 200
# steps: an ASan build (a step there costs 5-10 times more) runs every case
# with the fewer steps.
SANITIZED = kvctest.sanitized()
STEPS = 200 if SANITIZED else 1000
INSTALLED_STEPS = 150 if SANITIZED else 300
if SANITIZED:
    # Every rank is an interpreter with torch under the preloaded ASan
    # runtime: its default 256 MiB quarantine of freed blocks made each rank
    # 520 MB (16 ranks: 8 GB) and its start a quarter slower.  8 MiB, as
    # test_soak.py gives its daemon; the ranks inherit it.
    os.environ["ASAN_OPTIONS"] = ":".join(
        [o for o in os.environ.get("ASAN_OPTIONS", "").split(":") if o] + ["quarantine_size_mb=8"])


def layout(hosts, per):
    return [h for h in range(hosts) for _ in range(per)]


class HierBase(unittest.TestCase):
    hosts = 2

    @classmethod
    def setUpClass(cls):
        hiernet.require_root()
        # The network first: where it cannot be built (a chroot), the skip
        # then costs no torch import (seconds; under ASan 6-9 s of CPU).
        cls.net = hiernet.Net(cls.hosts, cls.__name__[:3].lower())
        try:
            import torch  # noqa: F401
        except ImportError:
            cls.net.close()
            raise unittest.SkipTest("no torch (Debian's python3-torch) for the gloo world")

    @classmethod
    def tearDownClass(cls):
        cls.net.close()

    def setUp(self):
        self.segs = ["kvctest-hier-%d-%s-%d" % (os.getpid(), self.id().rsplit(".", 1)[-1][:20], h)
                     for h in range(self.hosts)]
        for s in self.segs:
            hiertest.make_segment(s)
        self.ranks = None
        self.daemons = []

    def tearDown(self):
        wrong = []
        if self.ranks:
            self.ranks.close()
            wrong = self.ranks.wrong
        for d in self.daemons:
            if d.poll() is None:
                d.kill()
            d.wait()
        for s in self.segs:
            hiertest.discard(s)
        self.assertEqual(wrong, [], "a step answered a wrong MIN")

    def start(self, lay, mode, **kw):
        self.ranks = Ranks(self.net, lay, self.segs, mode, **kw)
        ready = [self.ranks.expect(r, "ready") for r in range(len(lay))]
        for r, info in enumerate(ready):
            self.assertEqual(info.get("node"), lay[r], info)
        return ready


class Agreement(HierBase):
    def agree(self, per, steps=STEPS):
        lay = layout(self.hosts, per)
        t0 = time.monotonic()
        self.start(lay, "gloo", steps=steps)
        for r in range(len(lay)):
            done = self.ranks.expect(r, "done", deadline=600)
            self.assertEqual(done["steps"], steps)
            self.assertEqual(done["differ"], 0, "rank %d: %s" % (r, done))
            self.assertEqual(done["wrong"], 0, "rank %d: %s" % (r, done))
        print("\n%dx%d: %d steps equal to gloo's MIN on every rank (%.1f s)"
              % (self.hosts, per, steps, time.monotonic() - t0), flush=True)

    def test_2x2(self):
        self.agree(2)

    def test_2x4(self):
        self.agree(4)

    def test_2x8(self):
        self.agree(8)


class ThreeHosts(HierBase):
    hosts = 3

    def test_3x2(self):
        Agreement.agree(self, 2)


class Failures(HierBase):
    TIMEOUT = 30.0

    def loop(self, per=4, **kw):
        lay = layout(self.hosts, per)
        kw.setdefault("timeout", self.TIMEOUT)
        kw.setdefault("pace", 0.002)
        self.start(lay, "loop", **kw)
        return lay

    def killed(self, victim):
        lay = self.loop(exit_on_fail=True)
        self.ranks.expect(0, "ok 100")
        self.ranks.signal(victim, signal.SIGKILL)
        t0 = time.monotonic()
        for r in range(len(lay)):
            if r == victim:
                continue
            f = self.ranks.expect(r, "fail")
            self.assertIn(victim, f["ranks"], f)
            self.assertEqual(f["node"], lay[victim], f)
            self.assertTrue(f["dead"], f)
            self.assertLess(f["after_s"], self.TIMEOUT, f)  # seen dead, not timed out
            self.assertIn("rank %d" % victim, f["text"])
            self.assertIn(self.net.addrs[lay[victim]], f["text"])  # its host, by address
            print("\nrank %d (host %d) killed: rank %d failed after %.3f s in its call: %s"
                  % (victim, lay[victim], r, f["after_s"], f["text"]), flush=True)
        print("every survivor told within %.3f s of the kill" % (time.monotonic() - t0))

    def test_rank_killed(self):
        self.killed(5)  # host 1, not its leader

    def test_leader_killed(self):
        self.killed(4)  # host 1's leader: host 0 sees its connection close

    def test_host_stopped(self):
        lay = self.loop(timeout=1.0)
        self.ranks.expect(0, "ok 100")
        stopped = [r for r in range(len(lay)) if lay[r] == 1]
        for r in stopped:
            self.ranks.signal(r, signal.SIGSTOP)
        t0 = time.monotonic()
        for r in range(len(lay)):
            if r in stopped:
                continue
            f = self.ranks.expect(r, "fail")
            self.assertFalse(f["dead"], f)
            self.assertEqual(f["node"], 1, f)
            self.assertTrue(set(f["ranks"]) <= set(stopped), f)
            print("\nhost 1 stopped: rank %d failed after %.3f s in its call: %s"
                  % (r, f["after_s"], f["text"]), flush=True)
        print("every rank of host 0 told within %.3f s of the stop" % (time.monotonic() - t0))
        for r in stopped:
            self.ranks.signal(r, signal.SIGCONT)
        # Every rank, stopped or not, completes steps again (the late ones
        # fail the steps their peers gave up first, then catch up).
        for r in range(len(lay)):
            self.ranks.expect(r, "ok")  # the next 50 steps, right (else "wrong")
        for r in range(len(lay)):
            line = self.ranks.expect(r, "ok")
            self.assertTrue(line)

    def test_rank_late(self):
        """Rank 6 (host 1, not its leader) comes 3 s late to step 60, timeout
        1 s: every other rank fails that step by timeout naming rank 6 on
        host 1; rank 6 fails it too when it comes; later steps complete on
        every rank."""
        lay = self.loop(timeout=1.0, until=120, per_rank={6: {"odd": {"step": 60, "late": 3}}})
        for r in range(len(lay)):
            f = self.ranks.expect(r, "fail")
            st = self.ranks.expect(r, "stopped", deadline=300)
            self.assertEqual(f["step"], 60, f)
            self.assertFalse(f["dead"], f)
            self.assertIn(6, f["ranks"], f)
            self.assertEqual(f["node"], 1, f)
            self.assertGreaterEqual(st["ok"], 110, st)  # the steps around it complete again
            if r in (0, 6):
                print("\nrank %d: %s (%.3f s)" % (r, f["text"], f["after_s"]), flush=True)

    def test_kvcoordd_killed(self):
        daemon = os.environ.get("KVCOORD_DAEMON")
        if not daemon:
            raise unittest.SkipTest("KVCOORD_DAEMON not set (run through ctest)")
        for h, s in enumerate(self.segs):
            d = self.net.run(h, [daemon, "--listen", self.net.addrs[h] + ":0", "--segment", s,
                                 "--fresh"], stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
            self.daemons.append(d)
        time.sleep(0.5)  # let them create their segments
        for s in self.segs:
            end = time.monotonic() + hiertest.DEADLINE
            while True:
                try:
                    with hiertest.kvcoord.Segment(s, role="none"):
                        break
                except hiertest.kvcoord.Error:
                    self.assertLess(time.monotonic(), end, "kvcoordd made no segment " + s)
                    time.sleep(0.05)
        lay = self.loop(until=600)
        self.ranks.expect(0, "ok 100")
        self.daemons[1].kill()
        self.daemons[1].wait()
        for r in range(len(lay)):
            st = self.ranks.expect(r, "stopped", deadline=300)
            self.assertEqual(st["ok"], 600, st)  # every step, before and after the kill
        print("\nhost 1's kvcoordd killed after step ~100: 600/600 steps on every rank")

    def test_mismatch(self):
        lay = self.loop(until=100, per_rank={5: {"odd": {"step": 30, "tag": 1}},
                                             2: {"odd": {"step": 60, "extra": 3}}})
        for r in range(len(lay)):
            f1 = self.ranks.expect(r, "fail")
            f2 = self.ranks.expect(r, "fail")
            st = self.ranks.expect(r, "stopped")
            self.assertEqual((f1["step"], f1["ranks"], f1["node"], f1["mismatch"]),
                             (30, [5], 1, True), f1)
            self.assertIn("rank 5 on node %s called with tag 1" % self.net.addrs[1], f1["text"])
            self.assertEqual((f2["step"], f2["ranks"], f2["node"], f2["mismatch"]),
                             (60, [2], 0, True), f2)
            self.assertRegex(f2["text"], r"rank 2 on node \S+ called with tag 0 and \d+ bytes")
            for f in (f1, f2):
                self.assertLess(f["after_s"], self.TIMEOUT, f)  # at once, not by timeout
            self.assertEqual(st["ok"], 98, st)
            if r in (0, 2, 5):
                print("\nrank %d: %s (%.3f s)\n        %s (%.3f s)" % (
                    r, f1["text"], f1["after_s"], f2["text"], f2["after_s"]), flush=True)

    def test_group_restarted(self):
        lay = self.loop(per=2)
        self.ranks.expect(0, "ok 50")
        for r in range(len(lay)):
            self.ranks.signal(r, signal.SIGKILL)
        self.ranks.close()
        self.ranks = None
        # New processes on the same segments: a new handshake and a new group.
        self.loop(per=2, until=200)
        for r in range(len(lay)):
            st = self.ranks.expect(r, "stopped")
            self.assertEqual(st["ok"], 200, st)


class Installed(HierBase):
    """kvcoord.sglang.install() on the sglang-shaped fixture, ranks on two
    hosts: the poll all-reduce of the group takes the hierarchical path when
    every rank runs kvcoord (said once in the log), gloo otherwise; either
    way every answer equals sglang's original (gloo) of the same step."""

    def run_installed(self, per_rank=None):
        lay = layout(self.hosts, 2)
        self.ranks = Ranks(self.net, lay, self.segs, "installed", steps=INSTALLED_STEPS,
                           root=os.path.dirname(os.path.dirname(hiertest.HERE)),
                           per_rank=per_rank or {})
        return [self.ranks.expect(r, "done", deadline=600) for r in range(len(lay))]

    def test_every_rank_runs_kvcoord(self):
        for r, d in enumerate(self.run_installed()):
            self.assertEqual(d["differ"], 0, d)
            self.assertEqual(d["path"], "HierPoll", d)
            said = [m for m in d["log"] if "across 2 nodes" in m]
            self.assertEqual(len(said), 1, d["log"])
            if r == 0:
                print("\nrank 0's log: %s" % said[0])

    def test_mixed_variants(self):
        """sglang #36928: one rank calls another variant in a step (here the
        staging one, rank 3 on host 1): every rank raises at once naming it,
        and the next steps work (the answers above stay equal to gloo's)."""
        done = self.run_installed({r: {"mixed_step": 100, "staging": r == 3}
                                   for r in range(4)})
        for r, d in enumerate(done):
            self.assertEqual(d["differ"], 0, d)
            self.assertEqual(len(d["mixed"]), 1, d)
            self.assertRegex(d["mixed"][0], r"rank 3 on node \S+ called with tag 4 .*rank 0 on "
                             r"node \S+ with tag 1 .*step 100 .*4 poll_and_all_reduce_with_staging")
        print("\nevery rank: %s" % done[0]["mixed"][0])

    def test_a_rank_without_kvcoord(self):
        done = self.run_installed({3: {"segment": None}})
        for r, d in enumerate(done):
            self.assertEqual(d["differ"], 0, d)
            self.assertIsNone(d["path"], d)
            said = [m for m in d["log"] if "gloo" in m]
            self.assertEqual(len(said), 1, d["log"])
            self.assertIn("no kvcoord segment is attached" if r == 3 else
                          "a rank of the group attached no kvcoord segment", said[0])


if __name__ == "__main__":
    unittest.main()
