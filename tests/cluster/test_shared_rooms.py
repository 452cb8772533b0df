#!/usr/bin/env python3
"""test_shared_rooms.py - what the decode side sees, and when, across
nodes (issue 28): two kvcoordd with --etcd on a real 3-member etcd, a
prefill TP group of 2 on node A and a decode TP group of 2 on node B
(sglang-shaped rank processes, sgl_ranks.py) following the same rooms.

Each case prints its figure; no time is asserted.  The contract for a
node that leaves (its shared rooms fail within the lease TTL + 1 s of its
death) is a figure of tools/bench/bench_cross_node_failures.py, measured
on a quiet machine; here the failure's reason names the lease, so a room
failed by another path (its own TTL, a timeout) fails the test, and the
waits are hang guards.

Usage: test_shared_rooms.py --daemon KVCOORDD --pythonpath DIR [unittest args]"""

import argparse
import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import unittest

import requests

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import clusterlib as cl  # noqa: E402

ARGS = None
ETCD = None
TTL = 3
RANKS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sgl_ranks.py")


def setUpModule():
    global ETCD
    ETCD = cl.Etcd().start()


def tearDownModule():
    if ETCD:
        ETCD.close()


class Ranks:
    """One sglang-shaped rank process (sgl_ranks.py) on a node's segment."""

    def __init__(self, mode, node, rank, size=2):
        env = dict(os.environ, PYTHONPATH=ARGS.pythonpath)
        self.proc = subprocess.Popen([sys.executable, RANKS, mode, node.segment, str(rank),
                                      str(size)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True, env=env, bufsize=1)
        self.lines = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))

    def send(self, text):
        self.proc.stdin.write(text + "\n")
        self.proc.stdin.flush()

    def expect(self, prefix, timeout=30):
        end = time.monotonic() + timeout
        while True:
            line = self.lines.get(timeout=max(0.01, end - time.monotonic()))
            if line.startswith(prefix):
                return line

    def open(self, *rooms):
        self.send("open " + " ".join(map(str, rooms)))
        self.expect("opened")

    def fail(self, room, code, reason):
        self.send("fail %d %d %s" % (room, code, reason))
        return int(self.expect("failed").split()[2])

    def failed(self, timeout):
        """The next room this decode rank's poll found Failed (dict), or None."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            try:
                line = self.lines.get(timeout=max(0.01, end - time.monotonic()))
            except queue.Empty:
                return None
            if line.startswith("{"):
                return json.loads(line)
        return None

    def kill(self, sig=signal.SIGKILL):
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait()

    def close(self):
        if self.proc.poll() is None:
            try:
                self.send("exit")
                self.proc.wait(10)
            except Exception:
                self.proc.kill()
                self.proc.wait()
        for f in (self.proc.stdin, self.proc.stdout):
            try:
                f.close()
            except Exception:
                pass


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100.0 * (len(xs) - 1))))]


class Base(unittest.TestCase):
    def setUp(self):
        self.nodes, self.ranks = [], []
        self.cluster = "s%d-%s" % (os.getpid(), self._testMethodName[5:30].replace("_", "-"))
        self.tmp = tempfile.mkdtemp(prefix="kvc-sr-")

    def tearDown(self):
        cl.logs_if_failed(self, self.nodes)
        for r in self.ranks:
            r.close()
        for n in self.nodes:
            try:
                n.stop()
            except Exception:
                pass
            n.unlink()
        if not os.environ.get("KVCOORD_KEEP_LOGS"):
            shutil.rmtree(self.tmp, ignore_errors=True)

    def node(self, name, ttl=TTL, token=None):
        extra = []
        if token:  # the node's HTTP token (--auth-token-file, mode 0600)
            path = os.path.join(self.tmp, "token-%s" % name)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            os.write(fd, token.encode())
            os.close(fd)
            extra = ["--auth-token-file", path]
        n = cl.Node(ARGS.daemon, ETCD.endpoints, self.cluster, name, ttl=ttl, logdir=self.tmp,
                    extra=extra)
        self.nodes.append(n)
        return n.start()

    def group(self, mode, node):
        rs = [Ranks(mode, node, r) for r in range(2)]
        self.ranks += rs
        return rs

    def pd(self, tokens=(None, None)):
        a, b = self.node("A", token=tokens[0]), self.node("B", token=tokens[1])
        return a, b, self.group("prefill", a), self.group("decode", b)

    def open_shared(self, a, b, prefill, decode, rooms):
        for r in prefill + decode:
            r.open(*rooms)
        # Each node knows the other follows them (published under its lease).
        ok, took = cl.wait_for(lambda: b.cluster_view()["counts"]["rooms_shared"] >= len(rooms)
                               and a.cluster_view()["counts"]["rooms_shared"] >= len(rooms), 20)
        self.assertTrue(ok, "rooms not known as shared: A %r, B %r" % (
            a.cluster_view()["counts"], b.cluster_view()["counts"]))
        return took

    def all_failed(self, decode, rooms, timeout):
        """{(rank, room): record} once every decode rank's poll saw every room Failed."""
        seen = {}
        end = time.monotonic() + timeout
        for d in decode:
            for _ in rooms:
                rec = d.failed(max(0.1, end - time.monotonic()))
                self.assertIsNotNone(rec, "decode rank never saw a room Failed; seen %r" % seen)
                seen[(rec["rank"], rec["room"])] = rec
        return seen


class PrefillFailure(Base):
    def test_record_failure_reaches_every_decode_rank_with_its_reason(self):
        a, b, prefill, decode = self.pd()
        rooms = list(range(1000, 1020))
        self.open_shared(a, b, prefill, decode, rooms)
        lat = []
        for room in rooms:
            reason = "KVTransferError: transfer of room %d to 10.0.0.7:17003 failed: " \
                     "ibv_post_send WC status 12 (retry exceeded)" % room
            t0 = prefill[1].fail(room, 110, reason)
            for d in decode:
                rec = d.failed(20)
                self.assertIsNotNone(rec)
                self.assertEqual(rec["room"], room)
                f = rec["failure"]
                self.assertEqual((f["origin_rank"], f["code"], f["reason"], f["origin_node"]),
                                 (1, 110, reason, "A"))
                self.assertEqual(f["origin_pid"], prefill[1].proc.pid)
                self.assertTrue(f["from_another_node"])
                self.assertTrue(f["is_from_another_rank"])  # rank 1 on B too: another node's
                # sglang's failure_exception() through the bridge: the origin's words.
                self.assertEqual(rec["raised"], {"reason": reason, "is_from_another_rank": True})
                lat.append((rec["t_ns"] - t0) / 1e6)
        st, room = b.room(rooms[0])
        self.assertEqual(room["failure"]["origin_node"], "A")
        self.assertTrue(room["failure"]["from_another_node"])
        print("record_failure on A -> poll Failed on each of B's 2 decode ranks (5 ms poll), "
              "%d rooms: median %.1f ms, p100 %.1f ms; load %s" % (
                  len(rooms), pct(lat, 50), max(lat), os.getloadavg()[0]))

    def test_prefill_processes_killed_named_with_their_node(self):
        a, b, prefill, decode = self.pd()
        rooms = [2000, 2001]
        self.open_shared(a, b, prefill, decode, rooms)
        pid = prefill[1].proc.pid
        t0 = time.time_ns()
        for p in prefill:
            p.kill()
        seen = self.all_failed(decode, rooms, 30)
        reasons = {r["failure"]["reason"] for r in seen.values()}
        for rec in seen.values():
            self.assertEqual(rec["failure"]["origin_node"], "A")
            self.assertIn("on node A) killed by signal 9", rec["failure"]["reason"])
            self.assertTrue(rec["raised"]["is_from_another_rank"])
            self.assertTrue(rec["raised"]["reason"].startswith("kvcoord failed room"))
        took = max(r["t_ns"] for r in seen.values()) - t0
        print("prefill ranks SIGKILLed (A's kvcoordd alive): every decode rank Failed after "
              "%.1f ms: %s (pid %d)" % (took / 1e6, sorted(reasons), pid))


class NodeLeaves(Base):
    def check_node_left(self, dead, rooms, seen, t_death):
        for rec in seen.values():
            f = rec["failure"]
            self.assertEqual(f["reason"], "node %s left the cluster (its lease ended)" % dead)
            self.assertEqual(f["origin_node"], dead)
            self.assertEqual(rec["raised"]["reason"], "kvcoord failed room %d: node %s left the "
                             "cluster (its lease ended)" % (rec["room"], dead))
        return (max(r["t_ns"] for r in seen.values()) - t_death) / 1e9

    def test_prefill_node_killed_fails_shared_rooms_only(self):
        a, b, prefill, decode = self.pd()
        rooms = [3000, 3001, 3002]
        self.open_shared(a, b, prefill, decode, rooms)
        for d in decode:
            d.open(3999)  # followed on B only
        t0 = time.time_ns()
        a.kill()
        for p in prefill:
            p.kill()
        seen = self.all_failed(decode, rooms, TTL + 10)
        took = self.check_node_left("A", rooms, seen, t0)
        self.assertIsNone(decode[0].failed(1.0))  # room 3999 untouched
        self.assertEqual(b.room(3999)[1]["state"], "Bootstrapping")
        print("node A SIGKILLed (kvcoordd and prefill ranks): B's %d shared rooms Failed on "
              "every decode rank after %.3f s (lease TTL %d s); B's own room untouched"
              % (len(rooms), took, TTL))

    def test_decode_node_killed_fails_the_prefills_rooms(self):
        a, b, prefill, decode = self.pd()
        rooms = [3100, 3101]
        self.open_shared(a, b, prefill, decode, rooms)
        t0 = time.time_ns()
        b.kill()
        for d in decode:
            d.kill()

        def failed_on_a():
            return all(a.room(r)[1]["state"] == "Failed" for r in rooms)
        ok, _ = cl.wait_for(failed_on_a, TTL + 10)
        took = (time.time_ns() - t0) / 1e9
        self.assertTrue(ok)
        f = a.room(rooms[0])[1]["failure"]
        self.assertEqual(f["reason"], "node B left the cluster (its lease ended)")
        print("node B SIGKILLed: A's prefill rooms Failed after %.3f s (lease TTL %d s)"
              % (took, TTL))

    def test_decode_node_frozen_past_its_ttl_learns_its_rooms_failed(self):
        """B (decode) frozen past its TTL: A fails the shared rooms (B left),
        and a prefill failure recorded meanwhile is not recorded over that.
        B, resumed, must learn that A gave them up; before, nothing told
        it, and its decode ranks waited out the room TTL (300 s)."""
        a, b, prefill, decode = self.pd(tokens=("token-of-A", "token-of-B"))
        rooms = [3300, 3301]
        self.open_shared(a, b, prefill, decode, rooms)
        os.kill(b.proc.pid, signal.SIGSTOP)
        try:
            ok, _ = cl.wait_for(lambda: a.room(3301)[1]["state"] == "Failed", TTL + 10)
            self.assertTrue(ok, "A did not fail the rooms of B, frozen past its TTL")
            prefill[0].fail(3301, 9, "recorded after B left")
        finally:
            os.kill(b.proc.pid, signal.SIGCONT)
        t0 = time.time_ns()
        seen = self.all_failed(decode, rooms, 30)
        for rec in seen.values():
            f = rec["failure"]
            self.assertEqual((f["reason"], f["origin_node"]),
                             ("node B left the cluster (its lease ended)", "A"))
        print("node B (decode) frozen past its TTL, resumed: its decode ranks saw the shared "
              "rooms Failed (A gave them up) %.3f s after SIGCONT"
              % ((max(r["t_ns"] for r in seen.values()) - t0) / 1e9))

    def test_prefill_node_frozen_past_its_ttl_then_resumed(self):
        a, b, prefill, decode = self.pd()
        rooms = [3200, 3201]
        self.open_shared(a, b, prefill, decode, rooms)
        t0 = time.time_ns()
        os.kill(a.proc.pid, signal.SIGSTOP)
        try:
            seen = self.all_failed(decode, rooms, TTL + 10)
            took = self.check_node_left("A", rooms, seen, t0)
        finally:
            os.kill(a.proc.pid, signal.SIGCONT)
        ok, _ = cl.wait_for(lambda: "lease_lost" in a.logtext(), 20)
        self.assertTrue(ok)
        # A is back: a new room shared again, and a failure on it crosses.
        self.open_shared(a, b, prefill, decode, [3202])
        prefill[0].fail(3202, 5, "after the freeze")
        rec = decode[0].failed(20)
        self.assertEqual(rec["failure"]["reason"], "after the freeze")
        print("node A frozen (SIGSTOP) past its TTL: shared rooms Failed on B after %.3f s; "
              "resumed, A republished and its next failure crossed" % took)


class EtcdTrouble(Base):
    def test_frozen_member_no_false_failure(self):
        a, b, prefill, decode = self.pd()
        rooms = [4000, 4001]
        self.open_shared(a, b, prefill, decode, rooms)
        member = ETCD.member_of(b.cluster_view()["watch"]["endpoint"])
        ETCD.freeze(member)
        try:
            time.sleep(2 * TTL + 1)
            for d in decode:
                self.assertIsNone(d.failed(0.2), "a frozen etcd member failed a room")
        finally:
            ETCD.thaw(member)
        self.assertEqual(b.room(4000)[1]["state"], "Bootstrapping")
        t0 = prefill[0].fail(4001, 7, "after the member's freeze")
        rec = decode[0].failed(20)
        self.assertEqual(rec["failure"]["reason"], "after the member's freeze")
        print("etcd member %d (B's watch) frozen %d s: no room failed; a failure afterwards "
              "reached B in %.1f ms" % (member, 2 * TTL + 1, (rec["t_ns"] - t0) / 1e6))

    def test_etcd_down_no_false_failure_and_the_push_alone_delivers(self):
        """Every etcd member frozen 10 s: no room fails but the one a prefill
        rank fails meanwhile, which reaches B through A's push alone; when
        etcd is back, its record of the same failure changes nothing."""
        a, b, prefill, decode = self.pd()
        rooms = [4100, 4101]
        self.open_shared(a, b, prefill, decode, rooms)
        ETCD.freeze(0, 1, 2)
        try:
            time.sleep(2)
            t0 = prefill[0].fail(4101, 9, "recorded while etcd was down")
            rec = decode[0].failed(8)
            self.assertIsNotNone(rec, "the push did not deliver while etcd was down")
            took = (rec["t_ns"] - t0) / 1e6
            self.assertEqual(rec["room"], 4101)
            f = rec["failure"]
            self.assertEqual((f["reason"], f["origin_node"], f["origin_rank"], f["code"],
                              f["origin_pid"]),
                             ("recorded while etcd was down", "A", 0, 9, prefill[0].proc.pid))
            self.assertTrue(f["from_another_node"])
            self.assertEqual(rec["raised"], {"reason": "recorded while etcd was down",
                                             "is_from_another_rank": True})
            self.assertIsNotNone(decode[1].failed(8))
            time.sleep(6)
            for d in decode:
                self.assertIsNone(d.failed(0.2), "a room failed while etcd was down")
        finally:
            ETCD.thaw(0, 1, 2)
        self.assertEqual(b.cluster_view()["counts"]["room_pushes_taken"], 1)
        # etcd back: A publishes the record, B's watch brings it; nothing changes.
        ok, _ = cl.wait_for(lambda: ETCD.ctl("get", "--prefix", "/kvcoord/%s/rooms/4101"
                                             % self.cluster).stdout.strip(), 30)
        self.assertTrue(ok, "A never published the failure to etcd")
        time.sleep(2 * TTL)
        for d in decode:
            self.assertIsNone(d.failed(0.2), "a room failed (again) after etcd came back")
        st, room = b.room(4101)
        self.assertEqual((room["failure"]["reason"], room["failure"]["origin_node"]),
                         ("recorded while etcd was down", "A"))
        self.assertNotIn("room_failure_mirrored room=4101", b.logtext())
        self.assertEqual(b.room(4100)[1]["state"], "Bootstrapping")
        print("etcd down (every member frozen) 10 s: no room failed; the failure recorded "
              "meanwhile reached B's decode ranks through A's push in %.1f ms; etcd's record "
              "of it, after, changed nothing" % took)

    def test_etcd_down_push_refused_failure_arrives_after(self):
        """The nodes' HTTP tokens differ (B refuses A's push, 401): the
        failure recorded while etcd is down arrives once etcd is back."""
        a, b, prefill, decode = self.pd(tokens=("token-of-A", "token-of-B"))
        rooms = [4200, 4201]
        self.open_shared(a, b, prefill, decode, rooms)
        ETCD.freeze(0, 1, 2)
        try:
            time.sleep(2)
            prefill[0].fail(4201, 9, "recorded while etcd was down")
            time.sleep(8)
            self.assertIsNone(decode[0].failed(0.2), "a room failed while etcd was down")
            t_back = time.time_ns()
        finally:
            ETCD.thaw(0, 1, 2)
        rec = decode[0].failed(30)
        self.assertIsNotNone(rec, "the failure recorded while etcd was down never arrived")
        self.assertEqual(rec["room"], 4201)
        self.assertEqual(rec["failure"]["reason"], "recorded while etcd was down")
        self.assertIsNone(decode[0].failed(2 * TTL), "a shared room failed after etcd came back")
        self.assertEqual(b.room(4200)[1]["state"], "Bootstrapping")
        counts = a.cluster_view()["counts"]
        self.assertEqual((counts["room_pushes_sent"], counts["room_pushes_failed"]), (0, 1))
        self.assertIn("room_push_failed", a.logtext())
        self.assertIn("401", a.logtext())
        print("etcd down 10 s, A's push refused (the nodes' tokens differ): no room failed; "
              "the failure recorded meanwhile reached B %.3f s after etcd was back"
              % ((rec["t_ns"] - t_back) / 1e9))

    def test_etcd_frozen_one_lease_lapses_no_false_failure(self):
        """Every member frozen 2.5 s, three times: A's lease (TTL 2 s)
        lapses each time, B's (TTL 20 s) survives and all of B's requests
        are answered (its keep-alive waits out the freeze within its
        bound).  B must still take A's departure as etcd's doing (its watch,
        probing at a quarter of A's TTL, went blind or slow meanwhile): A
        comes back under a new lease and no shared room fails.  Before, B
        failed them at once ("node A left the cluster"); with TTLs alike the
        same happens to whichever node kept its lease when the keep-alives
        fell on each side of a freeze, on the prefill side too, where the
        decode then waits out the room TTL."""
        a, b = self.node("A", ttl=2), self.node("B", ttl=20)
        prefill, decode = self.group("prefill", a), self.group("decode", b)
        rooms = [4400, 4401]
        self.open_shared(a, b, prefill, decode, rooms)
        rounds = 3
        for i in range(rounds):
            lost = a.cluster_view()["lease"]["lost"]
            ETCD.freeze(0, 1, 2)
            try:
                time.sleep(2.5)
            finally:
                ETCD.thaw(0, 1, 2)
            ok, _ = cl.wait_for(lambda: a.cluster_view()["lease"]["lost"] > lost, 30)
            self.assertTrue(ok, "round %d: A's lease did not lapse" % i)
            # A is back (node_back below): nothing may fail.
            for d in decode:
                self.assertIsNone(d.failed(4 if d is decode[0] else 0.2),
                                  "round %d: a shared room failed on B" % i)
            for room in rooms:
                st = a.room(room)[1]
                self.assertEqual(st["state"], "Bootstrapping",
                                 "round %d: a shared room failed on A: %r" % (i, st["failure"]))
            self.assertEqual(b.cluster_view()["lease"]["lost"], 0)
        for d in decode:
            self.assertIsNone(d.failed(0.2), "a shared room failed on B")
        self.assertIn("node_back node=A", b.logtext())
        self.assertNotIn("room_failed_node_left", b.logtext())
        # The rooms still cross: a failure afterwards reaches B with its reason.
        prefill[0].fail(4401, 5, "after the freezes")
        rec = decode[0].failed(20)
        self.assertEqual((rec["room"], rec["failure"]["reason"]), (4401, "after the freezes"))
        print("etcd frozen 2.5 s %d times: A's lease (TTL 2 s) lapsed each time, B's (TTL 20 s) "
              "did not; no room failed on either node" % rounds)

    def test_lease_lost_in_an_outage_keeps_the_room_records(self):
        """A failure published before etcd hangs past the lease TTL: A's
        lease is lost and replaced, and the room's record is put again
        under the new lease.  Before, it went with the old lease, and a
        node whose watch was down while it lived never learned of it."""
        a, b, prefill, decode = self.pd()
        rooms = [4300, 4301]
        self.open_shared(a, b, prefill, decode, rooms)
        prefill[0].fail(4301, 5, "before the outage")
        for d in decode:
            rec = d.failed(20)
            self.assertIsNotNone(rec, "the failure did not cross")
            self.assertEqual(rec["room"], 4301)
        key = "/kvcoord/%s/rooms/4301" % self.cluster

        def holder():  # the lease the key lives under, or None without the key
            out = ETCD.ctl("get", key, "-w", "json")
            kvs = json.loads(out.stdout).get("kvs") if out.returncode == 0 else None
            return int(kvs[0].get("lease", 0)) if kvs else None

        ok, _ = cl.wait_for(lambda: holder() is not None, 30)
        self.assertTrue(ok, "A never published the failure to etcd")
        old = a.cluster_view()["lease"]
        self.assertEqual(holder(), old["id"])
        ETCD.freeze(0, 1, 2)
        try:
            time.sleep(10)
        finally:
            ETCD.thaw(0, 1, 2)
        ok, _ = cl.wait_for(lambda: a.cluster_view()["lease"]["lost"] > old["lost"]
                            and a.cluster_view()["lease"]["id"] not in (0, old["id"]), 60)
        self.assertTrue(ok, "A's lease was not replaced after etcd hung 10 s (TTL %d s): %r"
                        % (TTL, a.cluster_view()["lease"]))
        ok, _ = cl.wait_for(lambda: holder() == a.cluster_view()["lease"]["id"], 60)
        self.assertTrue(ok, "the room's record is not under A's new lease: key's lease %r, "
                        "A's %r" % (holder(), a.cluster_view()["lease"]))
        self.assertIn("room_failures_republished rooms=1", a.logtext())
        for d in decode:
            self.assertIsNone(d.failed(0.5), "a room failed (again) after etcd came back")
        print("etcd down 10 s, A's lease lost and replaced: the room's record is under the "
              "new lease")


class Push(Base):
    def post(self, node, record, token=None):
        h = {"Authorization": "Bearer " + token} if token else {}
        return requests.post(node.url + "/cluster/room_failure", data=json.dumps(record),
                             headers=h, timeout=10)

    def test_duplicates_and_late_pushes_are_harmless(self):
        a, b, prefill, decode = self.pd(tokens=("tok", "tok"))
        rooms = [5000, 5001]
        self.open_shared(a, b, prefill, decode, rooms)
        rec = {"room": 5000, "origin_rank": 1, "code": 110, "reason": "the first",
               "time_ns": time.time_ns(), "node": "A", "pid": 4242}
        self.assertEqual(self.post(b, rec).status_code, 401)  # the token, as any mutation
        self.assertEqual(b.room(5000)[1]["state"], "Bootstrapping")
        r = self.post(b, rec, "tok")
        self.assertEqual((r.status_code, r.json()), (200, {"room": 5000, "taken": True}))
        seen = [d.failed(20) for d in decode]
        for x in seen:
            self.assertEqual((x["room"], x["failure"]["reason"], x["failure"]["origin_node"],
                              x["failure"]["origin_pid"]), (5000, "the first", "A", 4242))
        # The same record again, and a late one of another node: kept as it was.
        r = self.post(b, rec, "tok")
        self.assertEqual((r.status_code, r.json()), (200, {"room": 5000, "taken": False}))
        late = dict(rec, reason="a late one", node="C", origin_rank=0)
        self.assertEqual(self.post(b, late, "tok").json(), {"room": 5000, "taken": False})
        f = b.room(5000)[1]["failure"]
        self.assertEqual((f["reason"], f["origin_node"], f["origin_rank"]), ("the first", "A", 1))
        for d in decode:
            self.assertIsNone(d.failed(0.5), "a duplicate push was seen as a new failure")
        # What a peer sends is checked.
        self.assertEqual(self.post(b, dict(rec, room=5001, node="B"), "tok").status_code, 409)
        for bad in ({"room": 5001}, dict(rec, room=-1), dict(rec, room=5001, node="a/b"),
                    dict(rec, room=5001, reason=7), dict(rec, room=5001, code="x")):
            r = self.post(b, bad, "tok")
            self.assertEqual(r.status_code, 400, (bad, r.text))
        r = requests.post(b.url + "/cluster/room_failure", data=b"{not json",
                          headers={"Authorization": "Bearer tok"}, timeout=10)
        self.assertEqual(r.status_code, 400)
        self.assertEqual(b.room(5001)[1]["state"], "Bootstrapping")
        # A real failure on A crosses by push (same token) and etcd, once.
        t0 = prefill[1].fail(5001, 5, "a real one")
        got = [d.failed(20) for d in decode]
        self.assertEqual({(x["room"], x["failure"]["reason"]) for x in got},
                         {(5001, "a real one")})
        time.sleep(1)
        for d in decode:
            self.assertIsNone(d.failed(0.5))
        cb = b.cluster_view()["counts"]
        self.assertEqual(a.cluster_view()["counts"]["room_pushes_sent"], 1)
        self.assertEqual(cb["room_pushes_received"], 4)  # 2 by hand taken, 2 kept out
        self.assertGreaterEqual(cb["room_pushes_taken"], 1)
        print("pushes: a record taken once, its duplicate and a late one of another node kept "
              "out, malformed ones refused; a real failure crossed in %.1f ms"
              % ((max(x["t_ns"] for x in got) - t0) / 1e6))


def main():
    global ARGS
    p = argparse.ArgumentParser()
    p.add_argument("--daemon", required=True)
    p.add_argument("--pythonpath", default=os.environ.get("KVCOORD_PYTHONPATH", ""))
    ARGS, rest = p.parse_known_args()
    if not cl.have_etcd():
        print("SKIP: /usr/bin/etcd not installed (apt-get install etcd-server etcd-client)")
        return 77
    if not ARGS.pythonpath:
        print("SKIP: the Python package is not built")
        return 77
    prog = unittest.main(argv=[sys.argv[0]] + rest, exit=False, verbosity=2)
    return 0 if prog.result.wasSuccessful() else 1


if __name__ == "__main__":
    sys.exit(main())
