#!/usr/bin/python3
"""kvcoord-diag on the processes behind a segment kvcoordd serves:

- a worker (kvcoord-worker, attached through the library) SIGSTOPped is a
  finding: `check` degraded (procs.alive names it "stopped"), `procs` shows
  it stopped, `status` counts it - as a stopped kvcoordd is reported; once
  continued, `check` is healthy again;
- after kvcoordd was SIGKILLed and another one adopted the segment, `check`
  and `status` name the adopter instead of only "creator pid N is not
  running", and `unlink` refuses to remove it while that adopter runs.

Usage: test_diag_procs.py --daemon PATH --diag PATH --worker PATH
"""

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
from kvctest import (Daemon, Worker, discard, new_name, proc_state, wait_for,  # noqa: E402
                     wait_log, wait_state)

ARGS = None
DEADLINE = 30.0  # hang guard for waits, not an assertion


def diag(segment, *args, json_out=True):
    cmd = [ARGS.diag, "--segment", segment] + (["--json"] if json_out else []) + list(args)
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)
    return p.returncode, json.loads(p.stdout) if json_out else p.stdout


def findings(doc, check):
    return [f for f in doc["findings"] if f["check"] == check]


class DiagProcs(unittest.TestCase):
    def test_stopped_worker_is_a_finding(self):
        d = Daemon(new_name("diagprocs"), exe=ARGS.daemon)
        w = None
        try:
            w = Worker(ARGS.worker, d.segment)
            rc, doc = diag(d.segment, "check")
            self.assertEqual((rc, doc["verdict"]), (0, "healthy"), doc)
            os.kill(w.pid, signal.SIGSTOP)
            wait_state(w.pid, "T")
            rc, doc = diag(d.segment, "check")
            self.assertEqual((rc, doc["verdict"]), (1, "degraded"), doc)
            f = findings(doc, "procs.alive")
            self.assertEqual(len(f), 1, doc["findings"])
            self.assertEqual(f[0]["severity"], "degraded")
            self.assertIn("pid %d (worker, rank 0) is stopped (state T" % w.pid, f[0]["message"])
            self.assertEqual(doc["stats"]["procs_stopped"], 1)
            rc, doc = diag(d.segment, "procs")
            mine = [p for p in doc["procs"] if p["pid"] == w.pid]
            self.assertEqual(len(mine), 1, doc)
            self.assertIs(mine[0]["stopped"], True)
            self.assertIs(mine[0]["alive"], True)
            rc, text = diag(d.segment, "procs", json_out=False)
            self.assertRegex(text, r"(?m)^\s*%d\s+worker\s.*\bstopped\s*$" % w.pid)
            rc, text = diag(d.segment, "status", json_out=False)
            self.assertIn("(1 stopped)", text)
            self.assertIn("verdict: degraded", text)
            # the rank table names the registrant stopped too, not "alive"
            rc, doc = diag(d.segment, "ranks", "--rank", "0")
            self.assertEqual(rc, 0, doc)
            self.assertIs(doc["rank"]["pid_stopped"], True, doc)
            self.assertIs(doc["rank"]["pid_alive"], True, doc)
            rc, text = diag(d.segment, "ranks", json_out=False)
            self.assertRegex(text, r"(?m)^\s*0\s+registered\s.*\b%d\s+stopped\s" % w.pid)
            rc, text = diag(d.segment, "ranks", "--rank", "0", json_out=False)
            self.assertIn("pid %d (stopped)" % w.pid, text)
            os.kill(w.pid, signal.SIGCONT)
            wait_for(lambda: proc_state(w.pid) != "T", "the worker continued")
            rc, doc = diag(d.segment, "check")
            self.assertEqual((rc, doc["verdict"]), (0, "healthy"), doc)
        finally:
            if w:
                w.stop()
            d.stop()

    def test_adopted_segment_names_its_daemon(self):
        d = Daemon(new_name("diagadopt"), exe=ARGS.daemon)
        first = d.proc.pid
        d.proc.send_signal(signal.SIGKILL)
        d.proc.wait()
        log = tempfile.NamedTemporaryFile(prefix="kvcoordd-", suffix=".log", delete=False)
        second = subprocess.Popen([ARGS.daemon, "--listen", "127.0.0.1:0", "--segment",
                                   d.segment], stdin=subprocess.DEVNULL, stdout=log,
                                  stderr=subprocess.STDOUT)
        try:
            wait_log(log.name, r"listening addr=", "the second kvcoordd listening", proc=second)
            rc, doc = diag(d.segment, "check")
            f = findings(doc, "header.creator")
            self.assertEqual(len(f), 1, doc["findings"])
            self.assertEqual(f[0]["severity"], "ok", f)
            self.assertEqual(f[0]["message"], "creator pid %d has ended; kvcoordd pid %d adopted "
                             "the segment and runs" % (first, second.pid))
            rc, text = diag(d.segment, "status", json_out=False)
            self.assertIn("pid %d (ended; adopted by kvcoordd pid %d, running)"
                          % (first, second.pid), text)
            # unlink refuses while the adopter runs, as it does for a running creator
            rc, doc = diag(d.segment, "unlink", "--yes")
            self.assertEqual(rc, 1, doc)
            self.assertFalse(doc["removed"], doc)
            self.assertIn("adopted it after its creator ended, pid %d, is running" % second.pid,
                          doc["error"])
            self.assertTrue(os.path.exists("/dev/shm/" + d.segment))
            self.assertIsNone(second.poll(), "the adopting kvcoordd exited")
        finally:
            second.send_signal(signal.SIGTERM)
            second.wait(DEADLINE)
            os.unlink(log.name)
            d.stop()
            discard(d.segment)


def main():
    global ARGS
    ap = argparse.ArgumentParser()
    ap.add_argument("--daemon", required=True)
    ap.add_argument("--diag", required=True)
    ap.add_argument("--worker", required=True)
    ARGS, rest = ap.parse_known_args()
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)


if __name__ == "__main__":
    main()
