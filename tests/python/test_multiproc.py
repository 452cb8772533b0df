"""Real processes on one segment, as sglang's TP workers are: 8 forked Python
processes registering and reading each other's ranks; a room failed by one
raising the same KVTransferError in all; a participant killed with SIGKILL
making the others raise naming its rank and how it died (detected by the
library's own liveness check, and by kvcoordd's process watch).

Every child reports over a pipe; waits have generous hang guards only.
"""

import os
import signal
import time
import unittest

import kvcoord
from kvctest import DEADLINE, SMALL, Daemon, collect, discard, fork_children, new_name

TP = 8
REASON = "ibv_post_send: transport retry counter exceeded"


def wid_for(rank):
    return {"model.layers.0.self_attn.qkv_proj.weight": [0x7F0000000000 + rank * 4096, 786432, 2],
            "lm_head.weight": [0x7F1000000000 + rank * 4096, 16032768, 2]}


class EightProcesses(unittest.TestCase):
    def setUp(self):
        self.name = new_name("mp")
        self.seg = kvcoord.Segment(self.name, mode="fresh", role="client", **SMALL)

    def tearDown(self):
        self.seg.close()
        discard(self.name)

    def test_register_and_read_each_other(self):
        def child(i, name):
            with kvcoord.Segment(name, rank=i) as seg:
                gen = seg.register(i, "10.0.0.1:%d" % (16000 + i), wid_for(i))
                seen = {}
                for r in range(TP):
                    ri = seg.wait(r, timeout=DEADLINE)
                    assert ri.weights_info_dict == wid_for(r), r
                    seen[r] = [ri.session_id, ri.pid]
                # stay attached until everyone has read everything
                seg.room_open(1, i, TP)
                seg.room_set_state(1, i, kvcoord.KVPoll.Success)
                seg.room_wait(1, kvcoord.KVPoll.Bootstrapping, i, timeout=DEADLINE)
                while seg.room_state(1, i) != kvcoord.KVPoll.Success:
                    seg.room_wait(1, seg.room_state(1, i), i, timeout=DEADLINE)
                seg.room_release(1, i)
                return {"gen": gen, "seen": seen, "pid": os.getpid()}

        reports = collect(fork_children(TP, child, self.name))
        pids = {i: rep["result"]["pid"] for i, rep in reports.items() if "result" in rep}
        for i, rep in reports.items():
            self.assertNotIn("error", rep, rep.get("error"))
            res = rep["result"]
            self.assertEqual(res["gen"], 1)
            for r in range(TP):
                self.assertEqual(res["seen"][str(r)], ["10.0.0.1:%d" % (16000 + r), pids[r]])
        # the workers exited cleanly: their ranks were withdrawn with a note
        for r in range(TP):
            with self.assertRaises(kvcoord.WithdrawnError) as cm:
                self.seg.lookup(r)
            self.assertIn("exited", str(cm.exception))

    def test_room_failed_by_one_raises_in_all(self):
        room = 0x5EED0000_0000_0042
        origin = 5

        def child(i, name):
            with kvcoord.Segment(name, rank=i) as seg:
                seg.room_open(room, i, TP, "decode")
                seg.room_set_state(room, i, kvcoord.KVPoll.Transferring)
                if i == origin:
                    # wait for every rank to join, then fail with the real reason
                    while seg.room_get(room, i).joined < TP:
                        time.sleep(0.001)
                    seg.room_fail(room, i, REASON, 12)
                info = seg.room_wait(room, kvcoord.KVPoll.Transferring, i, timeout=DEADLINE)
                while info.failure is None:
                    info = seg.room_wait(room, info.state, i, timeout=DEADLINE)
                try:
                    seg.check_room(room, i)
                    return {"raised": None}
                except kvcoord.KVTransferError as e:
                    return {"raised": type(e).__name__, "str": str(e), "args": list(e.args),
                            "room": e.bootstrap_room, "reason": e.failure_reason,
                            "other": e.is_from_another_rank, "origin": e.origin_rank,
                            "code": e.code}
                finally:
                    seg.room_release(room, i)

        reports = collect(fork_children(TP, child, self.name))
        for i, rep in reports.items():
            self.assertNotIn("error", rep, rep.get("error"))
            res = rep["result"]
            self.assertEqual(res["raised"], "KVTransferError")
            self.assertEqual(res["str"], "KVTransferError(bootstrap_room=%d): %s" % (room, REASON))
            self.assertEqual(res["args"], [REASON])
            self.assertEqual((res["room"], res["reason"], res["origin"], res["code"]),
                             (room, REASON, origin, 12))
            self.assertEqual(res["other"], i != origin, i)


class KilledParticipant(unittest.TestCase):
    """A SIGKILLed rank: the others raise naming its rank and how it died."""

    victim = 3

    def run_group(self, name):
        room = 4242

        def child(i, name):
            with kvcoord.Segment(name, rank=i) as seg:
                seg.room_open(room, i, TP, "prefill")
                seg.room_set_state(room, i, kvcoord.KVPoll.Transferring)
                if i == self.victim:
                    while True:  # killed here by the parent
                        time.sleep(1)
                info = seg.room_get(room, i)
                while info.failure is None:
                    info = seg.room_wait(room, info.state, i, timeout=DEADLINE)
                try:
                    seg.check_room(room, i)
                    return {"raised": None}
                except kvcoord.KVTransferError as e:
                    return {"raised": type(e).__name__, "reason": e.failure_reason,
                            "other": e.is_from_another_rank, "origin": e.origin_rank,
                            "str": str(e)}
                finally:
                    seg.room_release(room, i)

        with kvcoord.Segment(name) as seg:
            kids = fork_children(TP, child, name)
            victim_pid = kids[self.victim][0]
            end = time.monotonic() + DEADLINE
            while True:  # everyone joined: then kill the victim mid-transfer
                try:
                    if seg.room_get(room).joined == TP:
                        break
                except KeyError:
                    pass
                self.assertLess(time.monotonic(), end, "the group never joined")
                time.sleep(0.005)
            os.kill(victim_pid, signal.SIGKILL)
            # not reaped yet: a zombie, whose /proc entry tells how it died
            reports = collect(kids, skip=(victim_pid,))
            os.waitpid(victim_pid, 0)
        return victim_pid, reports

    def check(self, victim_pid, reports):
        self.assertEqual(len(reports), TP - 1)
        for i, rep in reports.items():
            self.assertNotIn("error", rep, rep.get("error"))
            res = rep["result"]
            self.assertEqual(res["raised"], "KVTransferError")
            self.assertEqual(res["origin"], self.victim)
            self.assertTrue(res["other"])
            self.assertIn("rank %d" % self.victim, res["reason"])
            self.assertIn(str(victim_pid), res["reason"])
            self.assertIn("killed by signal 9", res["reason"])
            self.assertTrue(res["str"].startswith("KVTransferError(bootstrap_room=4242): "))
        # every survivor raised the very same reason
        self.assertEqual(len({r["result"]["reason"] for r in reports.values()}), 1)

    def test_room_sync_sees_the_death(self):
        """room_sync (liveness from /proc, rate-limited, with no watcher) fails a room whose
        participant was SIGKILLed, like room_get."""
        name = new_name("killsync")
        with kvcoord.Segment(name, mode="fresh", rank=0, **SMALL) as seg:
            rooms = [900, 901, 902]
            r, w = os.pipe()
            pid = os.fork()
            if pid == 0:
                os.close(r)
                with kvcoord.Segment(name, rank=1) as c:
                    for room in rooms:
                        c.room_open(room, 1, 2)
                    os.write(w, b"x")
                    while True:
                        time.sleep(1)
            os.close(w)
            for room in rooms:
                seg.room_open(room, 0, 2)
            self.assertEqual(os.read(r, 1), b"x")
            os.close(r)
            P = kvcoord.KVPoll
            self.assertEqual(seg.room_sync(0, rooms, [P.Transferring] * 3), [P.Bootstrapping] * 3)
            os.kill(pid, signal.SIGKILL)
            end = time.monotonic() + DEADLINE
            while True:  # a zombie until reaped: the library reads how it died
                with open("/proc/%d/stat" % pid) as f:
                    if f.read().split(") ")[1][0] == "Z":
                        break
                self.assertLess(time.monotonic(), end)
                time.sleep(0.005)
            # With no watcher a participant is looked up in /proc at most every
            # 100 ms: the next room_syncs see the death (no time limit asserted).
            while seg.room_sync(0, rooms, [P.Transferring] * 3) != [P.Failed] * 3:
                self.assertLess(time.monotonic(), end)
                time.sleep(0.01)
            os.waitpid(pid, 0)
            for room in rooms:
                f = seg.room_failure(room, 0)
                self.assertEqual(f.origin_rank, 1)
                self.assertIn("rank 1 (pid %d) killed by signal 9" % pid, f.reason)
                seg.room_release(room, 0)
        discard(name)

    def test_library_liveness_check(self):
        name = new_name("kill")
        with kvcoord.Segment(name, mode="fresh", role="none", **SMALL):
            pass
        try:
            self.check(*self.run_group(name))
        finally:
            discard(name)

    def test_with_kvcoordd_watching(self):
        name = new_name("killd")
        daemon = Daemon(name)
        try:
            victim_pid, reports = self.run_group(name)
            self.check(victim_pid, reports)
        finally:
            daemon.stop()


if __name__ == "__main__":
    unittest.main()
