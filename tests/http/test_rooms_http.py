#!/usr/bin/python3
"""kvcoordd's room routes and dead-process detection, with Python `requests`.

A real kvcoordd serves a fresh segment; stand-in TP workers (kvcoord-worker)
attach to it through libkvcoord, register a rank, open a bootstrap room and
set their KVPoll state (or record a failure) in it, as co-located ranks do.

- GET /rooms/{room}, PUT /rooms/{room}/failure, GET /failures: every status
  code, first failure wins across two PUTs, a failure recorded by the
  library is read back over HTTP with the same reason and origin.
- A worker killed with SIGKILL: its rank's lookup becomes 404 naming the
  signal, its room fails with a reason naming its rank and signal 9.
- A worker that detaches cleanly (SIGTERM) keeps its registration.
- A worker that died while the daemon was down is reaped when it starts.
- Failures PUT for rooms nobody opened never fill the table: past its
  --max-rooms the oldest of them are evicted and counted, and a worker's
  new room still opens.

Waits poll HTTP with generous deadlines that only keep a broken daemon from
hanging the test; nothing asserts how fast anything happens.

Usage: test_rooms_http.py --daemon PATH --worker PATH [unittest args]
"""

import argparse
import json
import os
import re
import signal
import sys
import unittest

import requests

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
from kvctest import Daemon as KvcDaemon, Worker, discard, scrape, wait_for  # noqa: E402  (the tests' one helper module)

ARGS = None
DEADLINE = 30.0  # hang guard for waits, not an assertion
INT63_MAX = (1 << 63) - 1


def Daemon(segment, fresh=True):
    """kvctest's kvcoordd on segment `segment`, the daemon's own room cap."""
    return KvcDaemon(segment, exe=ARGS.daemon, fresh=fresh, max_rooms=None)


class RoomsHttpTest(unittest.TestCase):
    n = 0

    def setUp(self):
        RoomsHttpTest.n += 1
        self.segment = "kvctest-rooms-%d-%d" % (os.getpid(), RoomsHttpTest.n)
        self.daemon = Daemon(self.segment)
        self.url = self.daemon.url
        self.http = requests.Session()
        self.workers = []

    def tearDown(self):
        try:
            for w in self.workers:
                w.stop(signal.SIGKILL)
            self.http.close()
            self.assertEqual(self.daemon.stop(), 0)
        finally:
            try:
                os.unlink("/dev/shm/" + self.segment)
            except FileNotFoundError:
                pass

    def worker(self, rank, *extra):
        w = Worker(ARGS.worker, self.segment, rank, session_id="127.0.0.1:%d" % (17000 + rank),
                   weights={"layer.%d.weight" % rank: [4096 * rank, 1024, 2]}, extra=extra)
        self.workers.append(w)
        return w

    def get(self, path, **kw):
        return self.http.get(self.url + path, timeout=DEADLINE, **kw)

    def put_failure(self, room, body, params=None):
        return self.http.put("%s/rooms/%s/failure" % (self.url, room), timeout=DEADLINE,
                             params=params,
                             data=body if isinstance(body, (str, bytes)) else json.dumps(body))

    def lookup(self, rank):
        return self.get("/get_transfer_engine_info", params={"rank": rank})

    # ---- room routes -------------------------------------------------------

    def test_unknown_room_404_and_bad_ids_400(self):
        r = self.get("/rooms/12345")
        self.assertEqual(r.status_code, 404)
        self.assertEqual(r.json(), {"detail": "No room 12345"})
        r = self.get("/rooms/%d" % INT63_MAX)
        self.assertEqual(r.status_code, 404, r.text)
        for bad in ("abc", "-1", "%d" % (INT63_MAX + 1), "1e3", "+5", "0x10",
                    "99999999999999999999999"):
            for r in (self.get("/rooms/" + bad),
                      self.put_failure(bad, {"rank": 0, "reason": "x"})):
                self.assertEqual(r.status_code, 400, (bad, r.text))
                self.assertIn("room id", r.json()["detail"])
        r = self.get("/rooms/5/other")
        self.assertEqual(r.status_code, 404)

    def test_empty_room_id_is_an_unknown_path(self):
        # No room segment at all: an unknown path (404 "Not Found", as any
        # other), not a bad room id (400), and no redirect to a path that
        # is not a route either.
        not_found = {"detail": "Not Found"}
        for r in (self.get("/rooms/"), self.get("/rooms//"), self.get("/rooms//failure"),
                  self.put_failure("", {"rank": 0, "reason": "x"}),
                  self.http.put(self.url + "/rooms//failure/", data="{}", timeout=DEADLINE,
                                allow_redirects=False),
                  self.get("/rooms/5/other/", allow_redirects=False),
                  self.get("/rooms/5//failure", allow_redirects=False)):
            self.assertEqual((r.status_code, r.json()), (404, not_found), r.request.url)
            self.assertEqual(r.headers["Content-Type"], "application/json")
        # trailing slashes after a room path: one 307 to the path without them
        for path, where in (("/rooms/42/", "/rooms/42"), ("/rooms/42//", "/rooms/42"),
                            ("/rooms/42/failure//", "/rooms/42/failure"),
                            ("/rooms/abc/", "/rooms/abc")):
            r = self.get(path, params={"rank": 0}, allow_redirects=False)
            self.assertEqual((r.status_code, r.headers.get("Location")), (307, where + "?rank=0"))
        self.assertEqual(self.get("/rooms/12345//").status_code, 404)  # followed: No room
        r = self.get("/rooms/5", params={"rank": "-1"})
        self.assertEqual(r.status_code, 400)
        self.assertEqual(r.json()["detail"], "Invalid rank parameter")

    def test_methods_405(self):
        r = self.http.delete(self.url + "/rooms/5", timeout=DEADLINE)
        self.assertEqual(r.status_code, 405)
        self.assertEqual(r.headers["Allow"], "GET, HEAD")
        r = self.get("/rooms/5/failure")
        self.assertEqual(r.status_code, 405)
        self.assertEqual(r.headers["Allow"], "PUT, POST")
        r = self.http.put(self.url + "/failures", timeout=DEADLINE)
        self.assertEqual(r.status_code, 405)

    def test_failure_body_400_names_the_field(self):
        cases = [
            ("[]", "Request body must be a JSON object"),
            ("{", "Invalid JSON"),
            ({"reason": "x"}, "Missing field 'rank'"),
            ({"rank": -1, "reason": "x"}, "Invalid field 'rank'"),
            ({"rank": "1", "reason": "x"}, "Invalid field 'rank'"),
            ({"rank": 1 << 31, "reason": "x"}, "Invalid field 'rank'"),
            ({"rank": 1}, "Missing field 'reason'"),
            ({"rank": 1, "reason": 5}, "Invalid field 'reason'"),
            ('{"rank": 1, "reason": "a\\u0000b"}', "Invalid field 'reason': must not contain NUL"),
            ({"rank": 1, "reason": "x", "code": "110"}, "Invalid field 'code'"),
            ({"rank": 1, "reason": "x", "code": 1 << 31}, "Invalid field 'code'"),
            # a repeated key: parsers disagree on which occurrence counts
            # (registration's words: one wording on every route)
            ('{"rank": 5, "rank": 6, "reason": "x"}',
             "Duplicate field 'rank': it occurs 2 times; send each field once"),
            ('{"rank": 5, "reason": "x", "reason": "y", "reason": "z"}',
             "Duplicate field 'reason': it occurs 3 times; send each field once"),
            ('{"rank": 5, "reason": "x", "code": 1, "code": 2}',
             "Duplicate field 'code': it occurs 2 times; send each field once"),
        ]
        for body, detail in cases:
            r = self.put_failure(9, body)
            self.assertEqual(r.status_code, 400, (body, r.text))
            self.assertTrue(r.json()["detail"].startswith(detail), (body, r.text))
        self.assertEqual(self.get("/rooms/9").status_code, 404, "a refused body created a room")
        # rank must be a participant: below the world size (8) for a room
        # not created yet, nothing created; below the room's count for one
        for rank in (8, 1000, 1023):
            r = self.put_failure(9, {"rank": rank, "reason": "x"})
            self.assertEqual(r.status_code, 400, r.text)
            self.assertEqual(r.json()["detail"], "Invalid field 'rank': rank %d out of range "
                             "for room 9: it has 8 participants (ranks 0..7)" % rank)
        r = self.put_failure(9, {"rank": 1024, "reason": "x"})
        self.assertEqual(r.status_code, 400, r.text)
        self.assertIn("Invalid field 'rank': origin rank 1024 exceeds", r.json()["detail"])
        self.assertEqual(self.get("/rooms/9").status_code, 404, "a refused rank created a room")
        r = self.put_failure(9, {"rank": 7, "reason": "x"})
        self.assertEqual(r.status_code, 200, r.text)
        self.assertEqual(r.json()["failure"]["origin_rank"], 7)

    def test_failure_first_wins_across_two_puts(self):
        room = INT63_MAX - 7
        r = self.put_failure(room, {"rank": 5, "reason": "RDMA WRITE failed: retry exceeded",
                                    "code": 12}, params={"rank": 5})
        self.assertEqual(r.status_code, 200, r.text)
        first = r.json()
        self.assertIs(first["kept"], True)
        f = first["failure"]
        self.assertEqual(f["room"], room)
        self.assertEqual(f["origin_rank"], 5)
        self.assertEqual(f["code"], 12)
        self.assertEqual(f["reason"], "RDMA WRITE failed: retry exceeded")
        self.assertIs(f["is_from_another_rank"], False)
        r = self.put_failure(room, {"rank": 2, "reason": "later", "code": 110},
                             params={"rank": 2})
        self.assertEqual(r.status_code, 200, r.text)
        second = r.json()
        self.assertIs(second["kept"], False)
        g = second["failure"]
        for k in ("room", "origin_rank", "code", "reason", "time_ns"):
            self.assertEqual(g[k], f[k], k)
        self.assertIs(g["is_from_another_rank"], True)  # as rank 2 sees it
        self.assertIn("room %d" % room, g["text"])
        room_view = self.get("/rooms/%d" % room, params={"rank": 5}).json()
        self.assertEqual(room_view["state"], "Failed")
        self.assertEqual(room_view["state_value"], 0)
        self.assertIs(room_view["failure"]["is_from_another_rank"], False)
        self.assertEqual(room_view["failure"]["reason"], f["reason"])
        outside = self.get("/rooms/%d" % room).json()
        self.assertIs(outside["failure"]["is_from_another_rank"], True)
        head = self.http.head("%s/rooms/%d" % (self.url, room), timeout=DEADLINE)
        self.assertEqual(head.status_code, 200)
        self.assertEqual(head.content, b"")

    def test_failure_answer_to_a_caller_without_rank(self):
        # The body's rank is the failure's origin; the HTTP caller is no rank
        # unless it says so (?rank=R): its answer's text names the origin and
        # never calls it "this rank".
        room = 4242
        r = self.put_failure(room, {"rank": 3, "reason": "ibv_reg_mr: Cannot allocate memory",
                                    "code": 12})
        self.assertEqual(r.status_code, 200, r.text)
        f = r.json()["failure"]
        self.assertEqual(f["origin_rank"], 3)
        self.assertIs(f["is_from_another_rank"], True)  # an outside observer
        self.assertEqual(f["text"], "KV transfer of room 4242 failed on rank 3 (code 12): "
                                    "ibv_reg_mr: Cannot allocate memory")
        r = self.put_failure(room, {"rank": 1, "reason": "later"})
        self.assertEqual(r.json()["failure"]["text"], f["text"])  # the first one kept
        outside = self.get("/rooms/%d" % room).json()["failure"]
        self.assertEqual(outside["text"], f["text"])
        self.assertNotIn("this rank", self.get("/failures").text)
        mine = self.get("/rooms/%d" % room, params={"rank": 3}).json()["failure"]
        self.assertIn("failed on rank 3 (this rank; code 12)", mine["text"])
        self.assertEqual(self.put_failure(room, {"rank": 1, "reason": "x"},
                                          params={"rank": "x"}).status_code, 400)
        r = self.put_failure(room + 1, {"rank": 0, "reason": "no code"})
        self.assertEqual(r.json()["failure"]["text"],
                         "KV transfer of room 4243 failed on rank 0: no code")

    def test_failures_list(self):
        self.assertEqual(self.get("/failures").json(), {"failures": [], "count": 0})
        for i in range(5):
            self.assertEqual(self.put_failure(100 + i, {"rank": i, "reason": "r%d" % i})
                             .status_code, 200)
        got = self.get("/failures").json()
        self.assertEqual(got["count"], 5)
        self.assertEqual([f["room"] for f in got["failures"]], [104, 103, 102, 101, 100])
        got = self.get("/failures", params={"limit": 2, "rank": 4}).json()
        self.assertEqual([f["room"] for f in got["failures"]], [104, 103])
        self.assertEqual([f["is_from_another_rank"] for f in got["failures"]], [False, True])
        self.assertEqual(self.get("/failures", params={"limit": 0}).json()["count"], 0)
        self.assertEqual(self.get("/failures", params={"limit": 1 << 40}).json()["count"], 5)
        for bad in ("-1", "x", ""):
            r = self.get("/failures", params={"limit": bad})
            self.assertEqual(r.status_code, 400, bad)
            self.assertEqual(r.json()["detail"], "Invalid limit parameter")

    def test_reported_failures_never_fill_the_table(self):
        seg = self.segment + "-small"
        small = KvcDaemon(seg, exe=ARGS.daemon, max_rooms=8)
        w = None
        try:
            for room in range(500, 520):  # 20 ids nobody opened, 8 slots
                r = self.http.put("%s/rooms/%d/failure" % (small.url, room), timeout=DEADLINE,
                                  data=json.dumps({"rank": 0, "reason": "reported %d" % room}))
                self.assertEqual(r.status_code, 200, r.text)
                self.assertIs(r.json()["kept"], True)
            self.assertEqual(scrape(small.port)["kvcoord_rooms_evicted_total"], 12)
            v = self.http.get("%s/rooms/519" % small.url, timeout=DEADLINE).json()
            self.assertEqual((v["state"], v["failure"]["reason"]), ("Failed", "reported 519"))
            # a worker's room opens in the full table: one more unjoined room goes
            w = Worker(ARGS.worker, seg, 0, extra=("--room", "7100", "--room-participants", "2",
                                                   "--room-state", "transferring"))
            w.wait_output(r"room=7100\b")
            v = self.http.get("%s/rooms/7100" % small.url, timeout=DEADLINE).json()
            self.assertEqual(v["local"][0]["state"], "Transferring")
            self.assertIsNone(v["failure"])
            self.assertEqual(scrape(small.port)["kvcoord_rooms_evicted_total"], 13)
        finally:
            if w:
                w.stop(signal.SIGKILL)
            small.stop()
            discard(seg)

    def test_library_failure_read_over_http(self):
        room = 4242
        w = self.worker(2, "--room", str(room), "--room-participants", "4",
                        "--fail", "transfer to 10.0.0.7:17000 timed out", "--fail-code", "110")
        w.wait_output("failure=kept")
        for asking, other in ((None, True), (0, True), (2, False)):
            params = {} if asking is None else {"rank": asking}
            r = self.get("/rooms/%d" % room, params=params)
            self.assertEqual(r.status_code, 200, r.text)
            v = r.json()
            self.assertEqual(v["state"], "Failed")
            self.assertEqual(v["participants"], 4)
            self.assertEqual(v["joined"], 1)
            self.assertEqual(len(v["local"]), 4)
            self.assertEqual(v["local"][2]["state"], "Transferring")
            self.assertIsNone(v["local"][0]["state"])
            f = v["failure"]
            self.assertEqual(f["origin_rank"], 2)
            self.assertEqual(f["origin_pid"], w.proc.pid)
            self.assertEqual(f["code"], 110)
            self.assertEqual(f["reason"], "transfer to 10.0.0.7:17000 timed out")
            self.assertIs(f["is_from_another_rank"], other)
        # First wins against HTTP too.
        r = self.put_failure(room, {"rank": 0, "reason": "late"})
        self.assertIs(r.json()["kept"], False)
        self.assertEqual(r.json()["failure"]["origin_rank"], 2)
        self.assertEqual(self.get("/failures", params={"limit": 1}).json()["failures"][0]["room"],
                         room)

    # ---- dead-process detection -------------------------------------------

    def test_killed_worker_rank_withdrawn_and_room_failed(self):
        room = 7001
        w = self.worker(1, "--room", str(room), "--room-participants", "2",
                        "--room-state", "transferring")
        w.wait_output(r"room=%d\b" % room)
        self.assertEqual(self.lookup(1).status_code, 200)
        v = self.get("/rooms/%d" % room).json()
        self.assertEqual(v["local"][1]["state"], "Transferring")
        self.assertIsNone(v["failure"])
        os.kill(w.proc.pid, signal.SIGKILL)  # not reaped yet: the daemon sees it exit
        wait_for(lambda: self.lookup(1).status_code == 404, "rank 1 to be withdrawn")
        r = self.lookup(1)
        self.assertEqual(
            r.json()["detail"],
            "No transfer engine info for rank 1 (withdrawn: rank 1's process %d killed by "
            "signal 9 (Killed))" % w.proc.pid)
        v = self.get("/rooms/%d" % room, params={"rank": 0}).json()
        self.assertEqual(v["state"], "Failed")
        f = v["failure"]
        self.assertEqual(f["origin_rank"], 1)
        self.assertIn("rank 1", f["reason"])
        self.assertIn("pid %d" % w.proc.pid, f["reason"])
        self.assertIn("signal 9", f["reason"])
        self.assertIs(f["is_from_another_rank"], True)
        self.assertEqual(w.stop(signal.SIGKILL), -signal.SIGKILL)
        self.workers.remove(w)
        # The log line is written after the room failed and the rank went
        # (what the lookups above saw): wait for it rather than read at once.
        pat = re.compile(r"proc_dead rank=1 pid=%d how=\"killed by signal 9 \(Killed\)\" "
                         r"rooms_failed=1 ranks_withdrawn=1" % w.proc.pid)
        wait_for(lambda: pat.search(self.daemon.output()), "the proc_dead log line")

    def test_killed_and_reaped_worker_rank_withdrawn(self):
        w = self.worker(3)
        self.assertEqual(self.lookup(3).status_code, 200)
        w.proc.kill()
        w.proc.wait()  # reaped at once: the daemon may only see it gone
        wait_for(lambda: self.lookup(3).status_code == 404, "rank 3 to be withdrawn")
        r = self.lookup(3)
        self.assertIn("rank 3's process %d" % w.proc.pid, r.json()["detail"])

    def test_cleanly_exited_worker_rank_withdrawn(self):
        # A worker's session ends with it, however it exits: a clean exit
        # withdraws its rank at once (the library does it on the last close);
        # it is not a dead process for the daemon to reap.
        w = self.worker(4)
        self.assertEqual(self.lookup(4).status_code, 200)
        w.proc.send_signal(signal.SIGTERM)
        self.assertEqual(w.proc.wait(DEADLINE), 0)
        r = self.lookup(4)
        self.assertEqual(r.status_code, 404)
        self.assertIn("rank 4's process %d exited (closed its segment handle)" % w.proc.pid,
                      r.json()["detail"])
        self.assertNotRegex(self.daemon.output(), r"proc_dead .*\bpid=%d\b" % w.proc.pid)

    def test_worker_dead_while_daemon_down_is_reaped_at_start(self):
        self.assertEqual(self.daemon.stop(discard=False), 0)
        room = 9009
        w = self.worker(6, "--room", str(room), "--room-participants", "8")
        w.wait_output(r"room=%d\b" % room)
        w.proc.kill()
        w.proc.wait()
        self.daemon = Daemon(self.segment, fresh=False)
        self.url = self.daemon.url
        r = self.lookup(6)  # reaped before the first request is served
        self.assertEqual(r.status_code, 404, r.text)
        self.assertIn("withdrawn: rank 6's process %d" % w.proc.pid, r.json()["detail"])
        v = self.get("/rooms/%d" % room).json()
        self.assertEqual(v["state"], "Failed")
        self.assertIn("rank 6", v["failure"]["reason"])
        self.assertIn("pid %d" % w.proc.pid, v["failure"]["reason"])

    def test_daemon_does_not_watch_itself(self):
        self.assertNotIn("proc_watch pid=%d " % self.daemon.proc.pid, self.daemon.output())
        w = self.worker(7)
        wait_for(lambda: "proc_watch pid=%d " % w.proc.pid in self.daemon.output(),
                   "the worker to be watched")
        self.assertNotIn("proc_watch pid=%d " % self.daemon.proc.pid, self.daemon.output())


def main():
    global ARGS
    ap = argparse.ArgumentParser()
    ap.add_argument("--daemon", required=True)
    ap.add_argument("--worker", required=True)
    ARGS, rest = ap.parse_known_args()
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)


if __name__ == "__main__":
    main()
