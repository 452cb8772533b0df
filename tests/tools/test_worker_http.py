#!/usr/bin/python3
"""End-to-end test of kvcoord-worker: eight stand-in TP workers of
Llama-3.1-8B register through libkvcoord in a segment served by a real
kvcoordd, and a remote client reads every rank back over HTTP with Python
`requests`, equal to what the workers were given.

Usage: test_worker_http.py --daemon PATH --worker PATH --gen PATH --query PATH
                           --work DIR [unittest args]
"""

import argparse
import json
import os
import signal
import subprocess
import sys
import time
import unittest

import requests

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
from kvctest import Daemon, stop_process, wait_handles  # noqa: E402  (the tests' one helper module)

ARGS = None
TP = 8
STRESS_RANK = 100


def read_body(path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def run_worker(*args, timeout=60):
    return subprocess.run([ARGS.worker] + list(args), capture_output=True, text=True,
                          timeout=timeout, check=False)


class Worker:
    """A lingering kvcoord-worker with its output in a file."""

    def __init__(self, name, segment, rank, info, *extra):
        self.log = os.path.join(ARGS.work, "%s.log" % name)
        with open(self.log, "w", encoding="utf-8") as out:
            self.proc = subprocess.Popen(
                [ARGS.worker, "--segment", segment, "--rank", str(rank), "--info", info,
                 "--linger"] + list(extra),
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    def output(self):
        with open(self.log, encoding="utf-8", errors="replace") as f:
            return f.read()

    def wait_registered(self, timeout=60):
        """Wait for the worker's one line; return its key=value fields."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = self.output()
            if "generation=" in text:
                line = [l for l in text.splitlines() if "generation=" in l][0]
                return dict(f.split("=", 1) for f in line.split()[1:])
            if self.proc.poll() is not None:
                raise AssertionError("worker exited %d before registering: %s"
                                     % (self.proc.returncode, text))
            time.sleep(0.02)
        raise AssertionError("worker did not register in %ds: %s" % (timeout, self.output()))


class WorkerCliTest(unittest.TestCase):
    """Exit codes and messages, no daemon needed."""

    def test_help(self):
        p = run_worker("--help")
        self.assertEqual(p.returncode, 0)
        for word in ("--segment", "--rank", "--info", "--linger", "--timeout-ms", "Exit status"):
            self.assertIn(word, p.stdout)
        # a killed worker's rank: only kvcoordd or `repair` withdraws it, not a reader
        text = " ".join(p.stdout.split())
        self.assertIn("killed: by kvcoordd, or by `kvcoord-diag repair` when no kvcoordd runs; "
                      "until then a library lookup still answers with the dead worker's info",
                      text)
        self.assertNotIn("next reader", text)

    def test_usage_errors_exit_2(self):
        info = os.path.join(ARGS.work, "llama", "rank-0.json")
        for args in ([], ["--rank", "-1", "--info", info], ["--rank", "x", "--info", info],
                     ["--info", info, "--timeout-ms", "soon"], ["--info", info, "extra"],
                     ["--info", info, "--segment", "../etc"], ["--bogus"]):
            p = run_worker(*args)
            self.assertEqual(p.returncode, 2, (args, p.stderr))
            self.assertTrue(p.stderr.strip(), args)
        # a rank past the room's participants: refused before anything is done
        p = run_worker("--info", info, "--rank", "9", "--room", "777", "--room-participants", "2",
                       "--segment", "kvctest-none")
        self.assertEqual(p.returncode, 2, p.stderr)
        self.assertIn("rank 9 cannot join room 777 of --room-participants 2", p.stderr)
        self.assertEqual(p.stdout, "")
        # a room option without --room: the message names only the options given
        for given, text in ((["--fail", "x"], "--fail needs --room ID"),
                            (["--room-participants", "2"], "--room-participants needs --room ID"),
                            (["--fail", "x", "--room-participants", "2"],
                             "--fail and --room-participants need --room ID")):
            p = run_worker("--info", info, "--segment", "kvctest-none", *given)
            self.assertEqual(p.returncode, 2, (given, p.stderr))
            self.assertEqual(p.stderr, "kvcoord-worker: %s\nTry 'kvcoord-worker --help' for "
                             "more information.\n" % text, given)

    def test_each_option_states_one_range(self):
        # every wrong value of an option gets the same message, naming the one
        # range accepted (a number past it is not "not a non-negative integer")
        info = os.path.join(ARGS.work, "llama", "rank-0.json")
        cases = [("--rank", ["-1", "x", "2147483648"], "is not an integer in 0..2147483647"),
                 ("--timeout-ms", ["soon", "-1", "4294967296"],
                  "is not a number of milliseconds in 0..4294967295"),
                 ("--room-state", ["done", "5"], "is not a KVPoll state (failed, bootstrapping, "
                  "waitingforinput, transferring, success or 0..4)"),
                 ("--room-participants", ["0", "33"], "is not in 1..32")]
        for opt, values, text in cases:
            for v in values:
                p = run_worker("--info", info, opt, v, "--room", "1", "--segment", "kvctest-none")
                self.assertEqual(p.returncode, 2, (opt, v, p.stderr))
                self.assertIn("%s: '%s' %s" % (opt, v, text), p.stderr)

    def test_runtime_errors_exit_1(self):
        missing = os.path.join(ARGS.work, "no-such-file.json")
        p = run_worker("--info", missing, "--segment", "kvctest-none")
        self.assertEqual(p.returncode, 1)
        self.assertIn("no-such-file.json", p.stderr)

        bad = os.path.join(ARGS.work, "not-info.json")
        with open(bad, "w", encoding="utf-8") as f:
            f.write('{"rank": 0, "transfer_engine_info": {"session_id": "h:1"}}')
        p = run_worker("--info", bad, "--segment", "kvctest-none")
        self.assertEqual(p.returncode, 1)
        self.assertIn("weights_info_dict", p.stderr)

        # a directory is named as one (jansson alone says "'[' or '{' expected")
        p = run_worker("--info", ARGS.work, "--segment", "kvctest-none")
        self.assertEqual(p.returncode, 1)
        self.assertIn("%s: is a directory, not a rank info file" % ARGS.work, p.stderr)
        # a top level that is not an object is said to be so
        with open(bad, "w", encoding="utf-8") as f:
            f.write("[]")
        p = run_worker("--info", bad, "--segment", "kvctest-none")
        self.assertEqual(p.returncode, 1)
        self.assertIn("%s: the top level is not a JSON object" % bad, p.stderr)
        self.assertNotIn("transfer_engine_info\" object", p.stderr)

        info = os.path.join(ARGS.work, "llama", "rank-0.json")
        segment = "kvctest-tools-absent-%d" % os.getpid()
        t0 = time.monotonic()
        p = run_worker("--info", info, "--segment", segment, "--timeout-ms", "300")
        self.assertEqual(p.returncode, 1)
        self.assertIn(segment, p.stderr)
        self.assertGreaterEqual(time.monotonic() - t0, 0.25)  # it retried until the deadline

    def test_signal_while_waiting_for_segment(self):
        info = os.path.join(ARGS.work, "llama", "rank-0.json")
        w = Worker("wait-signal", "kvctest-tools-never-%d" % os.getpid(), 0, info,
                   "--timeout-ms", "60000")
        # its handler installed, not a fixed 0.2 s (under ASan at load 20 the
        # SIGINT came first and killed it)
        wait_handles(w.proc.pid, signal.SIGINT)
        self.assertEqual(stop_process(w.proc, sig=signal.SIGINT), 1)
        self.assertIn("stopped by", w.output())


class WorkerHttpTest(unittest.TestCase):
    """Workers register through libkvcoord; a remote client reads over HTTP."""

    @classmethod
    def setUpClass(cls):
        cls.segment = "kvctest-tools-%d" % os.getpid()
        cls.daemon = None
        cls.workers = []
        cls.info_dir = os.path.join(ARGS.work, "llama")
        # Rank 0 starts before kvcoordd exists, as a worker may: it must wait.
        cls.workers.append(Worker("worker-0", cls.segment, 0,
                                  os.path.join(cls.info_dir, "rank-0.json"),
                                  "--timeout-ms", "60000"))
        try:
            # kvcoordd with its own defaults (no --max-rooms, no --log-level)
            cls.daemon = Daemon(cls.segment, exe=ARGS.daemon, log_level=None, max_rooms=None)
            cls.url = cls.daemon.url
            for r in range(1, TP):
                cls.workers.append(Worker("worker-%d" % r, cls.segment, r,
                                          os.path.join(cls.info_dir, "rank-%d.json" % r)))
            cls.lines = [w.wait_registered() for w in cls.workers]
        except BaseException:
            cls.tearDownClass()
            raise

    @classmethod
    def tearDownClass(cls):
        for w in cls.workers:
            stop_process(w.proc)
        if cls.daemon is not None:
            cls.daemon.stop()
        try:
            os.unlink("/dev/shm/" + cls.segment)
        except FileNotFoundError:
            pass

    def get(self, rank):
        return requests.get(self.url + "/get_transfer_engine_info", params={"rank": rank},
                            timeout=30)

    def lookup(self, rank):
        r = self.get(rank)
        self.assertEqual(r.status_code, 200, r.text[:300])
        return r.json()

    def test_1_worker_lines(self):
        for r, line in enumerate(self.lines):
            body = read_body(os.path.join(self.info_dir, "rank-%d.json" % r))
            tei = body["transfer_engine_info"]
            self.assertEqual(int(line["rank"]), r)
            self.assertGreaterEqual(int(line["generation"]), 1)
            self.assertEqual(int(line["entries"]), 195)
            self.assertEqual(int(line["dict_bytes"]),
                             len(json.dumps(tei["weights_info_dict"], separators=(",", ":"))))
            self.assertEqual(line["segment"], self.segment)
            self.assertEqual(line["session_id"], tei["session_id"])
        for w in self.workers:  # --rank N given with rank-N.json: nothing to note
            self.assertNotIn("note:", w.output())

    def test_2_every_rank_over_http_equals_the_file(self):
        for r in range(TP):
            body = read_body(os.path.join(self.info_dir, "rank-%d.json" % r))
            tei = body["transfer_engine_info"]
            resp = self.get(r)
            self.assertEqual(resp.status_code, 200, resp.text[:300])
            data = resp.json()
            self.assertEqual(data["rank"], r)
            self.assertEqual(data["remote_instance_transfer_engine_info"],
                             [tei["session_id"], tei["weights_info_dict"]])
            # kvcoordd's extension: the generation the worker was told.
            self.assertEqual(resp.headers.get("X-Kvcoord-Generation"),
                             self.lines[r]["generation"])

    def test_3_unregistered_rank_is_404(self):
        r = self.get(TP)
        self.assertEqual(r.status_code, 404)
        self.assertEqual(r.json(), {"detail": "No transfer engine info for rank %d" % TP})

    def test_4_query_ranks_tool(self):
        p = subprocess.run([sys.executable, ARGS.query, "--url", self.url, "--ranks", str(TP),
                            "--expect-dir", self.info_dir, "--worker-logs", ARGS.work],
                           capture_output=True, text=True, timeout=120, check=False)
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        rows = [l for l in p.stdout.splitlines() if l.strip().endswith("yes")]
        self.assertEqual(len(rows), TP, p.stdout)
        self.assertIn("127.0.0.1:16007", p.stdout)
        self.assertIn("8 of 8 ranks answered", p.stdout)
        # each byte count says what it counts: here the HTTP answer's body
        self.assertIn("answer bytes", p.stdout.splitlines()[0])

    def test_5_stress_rank_with_rank_override(self):
        """A 50,000-entry (about 4 MB) weights_info_dict round-trips intact,
        registered under --rank rather than the file's rank."""
        info = os.path.join(ARGS.work, "stress", "rank-0.json")
        w = Worker("worker-stress", self.segment, STRESS_RANK, info)
        try:
            line = w.wait_registered()
            self.assertEqual(int(line["rank"]), STRESS_RANK)
            self.assertEqual(int(line["entries"]), 50_000)
            self.assertIn("note: registering as rank %d (--rank), not the rank 0 of %s"
                          % (STRESS_RANK, info), w.output())
            tei = read_body(info)["transfer_engine_info"]
            data = self.lookup(STRESS_RANK)
            self.assertEqual(data["rank"], STRESS_RANK)
            self.assertEqual(data["remote_instance_transfer_engine_info"],
                             [tei["session_id"], tei["weights_info_dict"]])
        finally:
            self.assertEqual(stop_process(w.proc), 0)

    def test_6_same_registration_again_is_accepted(self):
        """A worker restarted with the same info registers again (exit 0)."""
        info = os.path.join(self.info_dir, "rank-3.json")
        p = run_worker("--segment", self.segment, "--info", info)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("rank=3 ", p.stdout)
        # worker-3 still lingers holding rank 3: the one-shot says it replaces it
        holder = [w for w in self.workers if "worker-3." in w.log][0]
        self.assertIn("note: rank 3 was registered by pid %d, which still runs" % holder.proc.pid,
                      p.stderr)
        tei = read_body(info)["transfer_engine_info"]
        self.assertEqual(self.lookup(3)["remote_instance_transfer_engine_info"],
                         [tei["session_id"], tei["weights_info_dict"]])

    def test_7_killed_worker_rank_is_withdrawn(self):
        info = os.path.join(self.info_dir, "rank-1.json")
        w = Worker("worker-killed", self.segment, TP + 1, info)
        w.wait_registered()
        self.assertEqual(self.get(TP + 1).status_code, 200)
        stop_process(w.proc, sig=signal.SIGKILL)
        deadline = time.monotonic() + 10
        while self.get(TP + 1).status_code == 200 and time.monotonic() < deadline:
            time.sleep(0.05)
        r = self.get(TP + 1)
        self.assertEqual(r.status_code, 404, r.text[:200])
        self.assertIn("rank %d" % (TP + 1), r.json()["detail"])

    def test_9_lingering_workers_exit_0_on_sigterm(self):
        for w in self.workers:
            self.assertIsNone(w.proc.poll(), "a lingering worker exited early")
        for w in self.workers:
            self.assertEqual(stop_process(w.proc), 0, w.output())


def generate(model, out, *extra):
    subprocess.run([sys.executable, ARGS.gen, "--model", model, "--out", out, "--quiet"]
                   + list(extra), check=True, timeout=300)


def main():
    global ARGS
    ap = argparse.ArgumentParser()
    for opt in ("--daemon", "--worker", "--gen", "--query", "--work"):
        ap.add_argument(opt, required=True)
    ARGS, rest = ap.parse_known_args()
    os.makedirs(ARGS.work, exist_ok=True)
    generate("llama-3.1-8b", os.path.join(ARGS.work, "llama"))
    generate("stress", os.path.join(ARGS.work, "stress"), "--tp", "1")
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)


if __name__ == "__main__":
    main()
