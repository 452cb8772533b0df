#!/usr/bin/python3
"""PD reads never wait for the PD lock (issue 30, "PD reads under a stopped
lock holder"), with a real stopped process: diag_fixture's child takes the PD
lock of the segment kvcoordd serves and stops at a point of its change (undo
saved; inside the change's window, sequence odd; inside a room write), and the
test SIGSTOPs it there (state T).  GET /route, the topology and POST
/query_dp_ranks then answer at once, with the table as it was before the
stopped change; kvcoord-diag reports the stuck lock and the stopped process
as for the rank lock, and a SIGSTOPped kvcoordd as stopped.

Usage: test_pd_stopped.py --daemon PATH --diag PATH --fixture PATH [unittest args]
"""

import argparse
import json
import os
import signal
import subprocess
import sys
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
from kvctest import Daemon, wait_state  # noqa: E402  (the tests' one helper module)

ARGS = None
DEADLINE = 30.0  # hang guard for waits, not an assertion
TOPOLOGY = "/route?prefill_dp_rank=-1&prefill_cp_rank=-1&target_tp_rank=-1&target_pp_rank=-1"
LOOKUP = "/route?prefill_dp_rank=0&prefill_cp_rank=0&target_tp_rank=0&target_pp_rank=0"
REG = {"attn_tp_size": 1, "attn_tp_rank": 0, "attn_cp_size": 1, "attn_cp_rank": 0,
       "attn_dp_size": 1, "attn_dp_rank": 0, "pp_size": 1, "pp_rank": 0, "system_dp_size": 1,
       "system_dp_rank": 0, "rank_ip": "10.0.0.1", "rank_port": 17000, "page_size": 64,
       "kv_cache_dtype": "auto"}


def diag(segment, *args, json_out=True):
    cmd = [ARGS.diag, "--segment", segment] + (["--json"] if json_out else []) + list(args)
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    return p.returncode, json.loads(p.stdout) if json_out else p.stdout, p.stderr


class StoppedHolder:
    """diag_fixture attached to the daemon's segment, its child stopped (SIGSTOP)
    inside the PD lock at the scenario's point."""

    def __init__(self, segment, scenario):
        env = dict(os.environ, DIAG_FIXTURE_ATTACH="1")
        self.proc = subprocess.Popen([ARGS.fixture, segment, scenario, "--hold"], env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.holder = None
        for line in self.proc.stdout:
            if line.startswith("holder "):
                self.holder = int(line.split()[1])
            if line.strip() == "ready":
                break
        if not self.holder:
            raise AssertionError("diag_fixture %s: no holder" % scenario)
        os.kill(self.holder, signal.SIGSTOP)
        wait_state(self.holder, "T")

    def end(self):
        """The fixture SIGKILLs its holder (stopped or not) and detaches."""
        self.proc.stdin.close()
        self.proc.wait(DEADLINE)


class PdReadsNeverLock(unittest.TestCase):
    def setUp(self):
        self.d = Daemon("kvctest-pdstop-%d-%s" % (os.getpid(), self._testMethodName[-12:]),
                        exe=ARGS.daemon)
        self.assertEqual(self.d.request("PUT", "/route", REG)[0], 200)
        self.assertEqual(self.d.request("POST", "/register_dp_rank",
                                        {"bootstrap_room": 77, "dp_rank": 1})[0], 200)

    def tearDown(self):
        self.d.stop()

    def reads_answer_as_before(self):
        status, body = self.d.request("GET", LOOKUP)
        self.assertEqual((status, json.loads(body)), (200, {"rank_ip": "10.0.0.1",
                                                            "rank_port": 17000}))
        status, body = self.d.request("GET", TOPOLOGY)
        self.assertEqual((status, json.loads(body)["attn_tp_size"]), (200, 1))
        status, body = self.d.request("POST", "/query_dp_ranks", {"bootstrap_rooms": [77, 78]})
        self.assertEqual((status, json.loads(body)), (200, {"77": 1}))

    def stopped_inside(self, scenario):
        h = StoppedHolder(self.d.segment, scenario)
        try:
            t0 = time.monotonic()
            self.reads_answer_as_before()
            print("%s: 3 reads in %.3f s with pid %d stopped in the PD lock" % (
                scenario, time.monotonic() - t0, h.holder), file=sys.stderr)
            # kvcoord-diag: one document each; the lock stuck on a stopped pid
            rc, doc, _ = diag(self.d.segment, "pd")
            self.assertEqual((rc, doc["ready"], doc["ranks"][0]["rank_ip"]), (0, True,
                                                                               "10.0.0.1"))
            rc, doc, _ = diag(self.d.segment, "locks")
            pd = [lk for lk in doc["locks"] if lk["name"] == "pd"][0]
            self.assertEqual((pd["state"], pd["owner_pid"], pd["owner_alive"],
                              pd["owner_stopped"]), ("held", h.holder, True, True))
            rc, doc, _ = diag(self.d.segment, "check")
            self.assertEqual(rc, 1)
            lk = [f for f in doc["findings"] if f["check"] == "locks.pd"][0]
            self.assertEqual(lk["severity"], "degraded")
            self.assertIn("pid %d (stopped" % h.holder, lk["message"])
            self.assertIn("pd.table", {f["check"] for f in doc["findings"]})
            rc, doc, _ = diag(self.d.segment, "status")
            self.assertEqual((rc, doc["verdict"]), (0, "degraded"))
            rc, out, _ = diag(self.d.segment, "locks", json_out=False)
            self.assertRegex(out, r"pd +held +%d +stopped" % h.holder)
            # a write waits for the lock: refused after the lock timeout
            status, body = self.d.request("PUT", "/route", REG)
            self.assertEqual(status, 503, body)
        finally:
            h.end()
        # The holder is gone: the next writer recovers the lock and rolls its
        # change back; the table is as it was.
        self.assertEqual(self.d.request("PUT", "/route", REG)[0], 200)
        self.reads_answer_as_before()

    def test_check_covers_the_pd_region(self):
        rc, doc, _ = diag(self.d.segment, "check")
        self.assertEqual(rc, 0, [f for f in doc["findings"] if f["severity"] != "ok"])
        ids = {f["check"] for f in doc["findings"]}
        for want in ("locks.pd", "pd.seq", "pd.undo", "pd.owner", "pd.rooms.slot",
                     "pd.rooms.probe", "pd.count", "pd.table"):
            self.assertIn(want, ids)
        self.assertNotIn("locks.rooms", {f["check"] for f in doc["findings"]
                                          if "pd lock" in f["message"]})

    def test_a_stopped_kvcoordd_is_said_stopped(self):
        os.kill(self.d.proc.pid, signal.SIGSTOP)
        try:
            wait_state(self.d.proc.pid, "T")
            rc, doc, _ = diag(self.d.segment, "status")
            self.assertEqual((rc, doc["verdict"]), (0, "degraded"))
            self.assertTrue(doc["header"]["creator_stopped"])
            rc, doc, _ = diag(self.d.segment, "check")
            self.assertEqual(rc, 1)
            cr = [f for f in doc["findings"] if f["check"] == "header.creator"][0]
            self.assertEqual(cr["severity"], "degraded")
            self.assertIn("pid %d (kvcoordd) is stopped" % self.d.proc.pid, cr["message"])
            # its process entry's finding says what waits for a daemon, not a worker's rooms
            pa = [f for f in doc["findings"] if f["check"] == "procs.alive"
                  and "pid %d (" % self.d.proc.pid in f["message"]]
            self.assertEqual(len(pa), 1, doc["findings"])
            self.assertIn("HTTP clients wait for it, dead workers' ranks and PD entries stay "
                          "registered", pa[0]["message"])
            self.assertNotIn("collectives", pa[0]["message"])
            rc, out, _ = diag(self.d.segment, "status", json_out=False)
            self.assertIn("pid %d (stopped" % self.d.proc.pid, out)
        finally:
            os.kill(self.d.proc.pid, signal.SIGCONT)

    def test_json_is_one_document_when_a_command_fails(self):
        # pd --etcd with no etcd answering: an error, and still one document.
        rc, doc, err = diag(self.d.segment, "pd", "--etcd", "http://127.0.0.1:9")
        self.assertEqual(rc, 2)
        self.assertEqual((doc["command"], doc["exit_code"]), ("pd", 2))
        self.assertTrue(doc["error"]["message"])

    def test_stopped_after_saving_its_undo_record(self):
        self.stopped_inside("pdheld")

    def test_stopped_inside_the_rank_window(self):
        self.stopped_inside("pdheld-odd")

    def test_stopped_inside_a_room_write(self):
        self.stopped_inside("pdheld-room")


def main():
    global ARGS
    p = argparse.ArgumentParser()
    p.add_argument("--daemon", required=True)
    p.add_argument("--diag", required=True)
    p.add_argument("--fixture", required=True)
    ARGS, rest = p.parse_known_args()
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)


if __name__ == "__main__":
    main()
