#!/usr/bin/python3
"""test_daemon_restart.py - registrations survive SIGKILL of kvcoordd.

1. kvcoordd starts on a fresh segment (kvctest-restart-<pid>); the 8 TP ranks
   of Llama-3.1-8B (tools/gen_model_info.py) register over HTTP, and, when
   kvcoord-worker is given, 2 more ranks register through libkvcoord from
   workers that stay attached (--linger).
2. A client thread keeps registering new ranks (and overwriting one rank with
   a new version each time) while the daemon is SIGKILLed; it records which
   requests were acknowledged (200) and which one was in flight.
3. kvcoordd restarts on the same segment WITHOUT --fresh; every acknowledged
   registration is served equal, the overwritten rank holds its last
   acknowledged version (or the one in flight), an unacknowledged new rank
   is either absent or complete - never a mix.
4. Once more: SIGKILL with no load, restart, everything still served; then
   SIGTERM -> exit status 0.
Throughout, /dev/shm holds exactly one segment of that name (the count of
segments never grows).

Usage: test_daemon_restart.py --daemon build/kvcoordd [--worker build/kvcoord-worker]
                              [--source SRCDIR]
Never asserts wall-clock times; timeouts only keep a broken daemon from
hanging the test.
"""

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import unittest

import requests

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
from kvctest import Daemon  # noqa: E402  (the tests' one helper module)

ARGS = None
TIMEOUT = 30
START_DEADLINE = 30
REGISTER = "/register_transfer_engine_info"
LOOKUP = "/get_transfer_engine_info"
OVERWRITTEN_RANK = 9
FIRST_NEW_RANK = 100
WORKER_RANKS = (10, 11)


def weights(n, seed):
    base = 0x7F2A00000000 + (seed % 4096) * (1 << 36)
    return {"model.layers.%d.mlp.gate_up_proj.weight.v%d" % (i, seed): [base + i * 4096, 4096 + seed, 2]
            for i in range(n)}


def body(rank, session_id, wid):
    return {"rank": rank, "transfer_engine_info": {"session_id": session_id,
                                                   "weights_info_dict": wid}}


class Registrar(threading.Thread):
    """Registers new ranks (and overwrites one rank) until told to stop or the
    daemon goes away; records what was acknowledged."""

    def __init__(self, url, shm_check):
        super().__init__(daemon=True)
        self.url = url
        self.shm_check = shm_check
        self.acked = {}              # rank -> (session_id, wid), new ranks acknowledged
        self.inflight_new = None     # (rank, value) sent but not acknowledged
        self.overwrite_acked = None  # last acknowledged value of OVERWRITTEN_RANK
        self.overwrite_inflight = None
        self.stop_flag = threading.Event()
        self.error = None
        self.shm_problem = None
        self.count = 0

    def send(self, session, rank, value):
        r = session.put(self.url + REGISTER, json=body(rank, value[0], value[1]),
                        timeout=TIMEOUT)
        if r.status_code != 200:
            raise AssertionError("registration of rank %d answered %d %r"
                                 % (rank, r.status_code, r.text[:200]))

    def run(self):
        i = 0
        with requests.Session() as s:
            while not self.stop_flag.is_set():
                rank = FIRST_NEW_RANK + i
                value = ("10.1.%d.%d:%d" % (i // 250, i % 250, 20000 + i), weights(8, 1000 + i))
                self.inflight_new = (rank, value)
                try:
                    self.send(s, rank, value)
                except requests.RequestException as e:
                    self.error = e
                    return
                except AssertionError as e:
                    self.error = e
                    return
                self.acked[rank] = value
                self.inflight_new = None
                over = ("10.2.0.9:%d" % (30000 + i), weights(4, 5000 + i))
                self.overwrite_inflight = over
                try:
                    self.send(s, OVERWRITTEN_RANK, over)
                except (requests.RequestException, AssertionError) as e:
                    self.error = e
                    return
                self.overwrite_acked = over
                self.overwrite_inflight = None
                self.count += 1
                problem = self.shm_check()
                if problem and not self.shm_problem:
                    self.shm_problem = problem
                i += 1


class DaemonRestart(unittest.TestCase):

    def setUp(self):
        self.workdir = tempfile.mkdtemp(prefix="kvctest-restart-")
        self.segment = "kvctest-restart-%d" % os.getpid()
        self.daemon = None
        self.workers = []
        self.expected = {}   # rank -> (session_id, wid)

    def tearDown(self):
        for w in self.workers:
            if w.poll() is None:
                w.send_signal(signal.SIGTERM)
                try:
                    w.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    w.kill()
                    w.wait()
        if self.daemon is not None:
            self.daemon.sigkill()
            self.daemon.stop(discard=False)
        for name in self.shm_names():
            os.unlink(os.path.join("/dev/shm", name))
        shutil.rmtree(self.workdir, ignore_errors=True)

    # /dev/shm entries belonging to this test's segment (the name, or the
    # name with anything appended: a temporary or a second copy).
    def shm_names(self):
        return sorted(n for n in os.listdir("/dev/shm") if n.startswith(self.segment))

    def shm_problem(self):
        names = self.shm_names()
        if names != [self.segment]:
            return "/dev/shm holds %r, want exactly [%r]" % (names, self.segment)
        return None

    def assert_one_segment(self, when):
        problem = self.shm_problem()
        self.assertIsNone(problem, when + ": " + (problem or ""))

    def get(self, rank):
        return requests.get(self.daemon.url + LOOKUP, params={"rank": rank}, timeout=TIMEOUT)

    def lookup(self, rank):
        """(session_id, wid) served for rank, or None on 404."""
        r = self.get(rank)
        if r.status_code == 404:
            self.assertEqual(r.json(), {"detail": "No transfer engine info for rank %d" % rank})
            return None
        self.assertEqual(r.status_code, 200, "rank %d: %d %r" % (rank, r.status_code, r.text[:300]))
        doc = r.json()
        self.assertEqual(sorted(doc), ["rank", "remote_instance_transfer_engine_info"])
        self.assertEqual(doc["rank"], rank)
        info = doc["remote_instance_transfer_engine_info"]
        self.assertEqual(len(info), 2)
        return (info[0], info[1])

    def assert_all_served(self, when):
        for rank, value in sorted(self.expected.items()):
            got = self.lookup(rank)
            self.assertIsNotNone(got, "%s: acknowledged rank %d is 404\n%s"
                                 % (when, rank, self.daemon.log_tail()))
            self.assertEqual(got[0], value[0], "%s: rank %d session_id" % (when, rank))
            self.assertTrue(got[1] == value[1], "%s: rank %d weights_info_dict differs"
                            % (when, rank))

    def initial_ranks(self):
        """The 8 Llama-3.1-8B TP ranks' bodies (generator), or equivalents."""
        gen = os.path.join(ARGS.source or "", "tools", "gen_model_info.py")
        if ARGS.source and os.path.exists(gen):
            out = os.path.join(self.workdir, "llama")
            p = subprocess.run([sys.executable, gen, "--model", "llama-3.1-8b", "--tp", "8",
                                "--out", out, "--quiet"], capture_output=True, timeout=300)
            self.assertEqual(p.returncode, 0, p.stderr)
            files = [os.path.join(out, "rank-%d.json" % r) for r in range(8)]
        else:
            files = []
            for r in range(8):
                path = os.path.join(self.workdir, "rank-%d.json" % r)
                with open(path, "w") as f:
                    json.dump(body(r, "127.0.0.1:%d" % (16000 + r), weights(300, r)), f)
                files.append(path)
        return files

    def start_worker(self, rank, info_path):
        log = open(os.path.join(self.workdir, "worker-%d.log" % rank), "w")
        w = subprocess.Popen([ARGS.worker, "--segment", self.segment, "--rank", str(rank),
                              "--info", info_path, "--linger"],
                             stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        log.close()
        self.workers.append(w)
        deadline = time.monotonic() + START_DEADLINE
        while time.monotonic() < deadline:
            if w.poll() is not None:
                self.fail("kvcoord-worker for rank %d exited with %d" % (rank, w.returncode))
            if self.get(rank).status_code == 200:
                return
            time.sleep(0.05)
        self.fail("rank %d registered by kvcoord-worker never became visible" % rank)

    def test_sigkill_and_restart_keeps_acknowledged_registrations(self):
        self.daemon = Daemon(self.segment, exe=ARGS.daemon, max_rooms=None, log_level=None)
        self.assert_one_segment("after the first start")

        # 1. Eight TP ranks over HTTP, two through the library.
        files = self.initial_ranks()
        with requests.Session() as s:
            for path in files:
                with open(path, "rb") as f:
                    raw = f.read()
                doc = json.loads(raw)
                rank = doc.get("rank", doc.get("tp_rank"))
                r = s.put(self.daemon.url + REGISTER, data=raw,
                          headers={"Content-Type": "application/json"}, timeout=TIMEOUT)
                self.assertEqual((r.status_code, r.text), (200, "OK"), path)
                tei = doc["transfer_engine_info"]
                self.expected[rank] = (tei["session_id"], tei["weights_info_dict"])
        if ARGS.worker:
            for rank, path in zip(WORKER_RANKS, files):
                self.start_worker(rank, path)
                with open(path) as f:
                    tei = json.load(f)["transfer_engine_info"]
                self.expected[rank] = (tei["session_id"], tei["weights_info_dict"])
        self.assert_all_served("before the kill")

        # 2. SIGKILL while a client keeps registering.
        reg = Registrar(self.daemon.url, self.shm_problem)
        reg.start()
        deadline = time.monotonic() + 120
        while reg.count < 25 and reg.is_alive() and time.monotonic() < deadline:
            time.sleep(0.01)
        self.assertTrue(reg.is_alive(), "the registering client stopped before the kill: %r"
                        % reg.error)
        self.assertGreaterEqual(reg.count, 25, "too few registrations acknowledged")
        self.daemon.sigkill()
        reg.join(timeout=TIMEOUT * 2)
        self.assertFalse(reg.is_alive(), "the client did not notice the daemon's death")
        self.assertIsInstance(reg.error, requests.RequestException,
                              "the client stopped for another reason: %r" % reg.error)
        self.assertIsNone(reg.shm_problem, reg.shm_problem)
        self.assert_one_segment("after SIGKILL")
        self.expected.update(reg.acked)
        sys.stderr.write("\n  SIGKILL after %d acknowledged registrations; in flight: new rank %s, "
                         "overwrite %s\n" % (len(reg.acked),
                                               reg.inflight_new[0] if reg.inflight_new else "none",
                                               "yes" if reg.overwrite_inflight else "none"))

        # 3. Restart on the same segment, without --fresh.
        self.daemon.start(fresh=False)
        self.assert_one_segment("after the restart")
        self.assert_all_served("after SIGKILL under load and restart")
        got = self.lookup(OVERWRITTEN_RANK)
        allowed = [v for v in (reg.overwrite_acked, reg.overwrite_inflight) if v is not None]
        self.assertIn(got, allowed, "rank %d holds neither its last acknowledged version nor "
                                    "the one in flight" % OVERWRITTEN_RANK)
        if reg.inflight_new is not None:
            rank, value = reg.inflight_new
            got = self.lookup(rank)
            self.assertIn(got, (None, value), "unacknowledged rank %d is neither absent nor "
                                              "complete" % rank)
        # Never-registered ranks are still 404.
        self.assertIsNone(self.lookup(FIRST_NEW_RANK + reg.count + 50))

        # The restarted daemon takes registrations.
        self.expected[OVERWRITTEN_RANK] = ("10.3.0.9:1", weights(5, 9999))
        r = requests.put(self.daemon.url + REGISTER,
                         json=body(OVERWRITTEN_RANK, *self.expected[OVERWRITTEN_RANK]),
                         timeout=TIMEOUT)
        self.assertEqual((r.status_code, r.text), (200, "OK"))
        self.assert_all_served("after a registration on the restarted daemon")

        # 4. Again: SIGKILL with no load, restart, still there.
        self.daemon.sigkill()
        self.assert_one_segment("after the second SIGKILL")
        self.daemon.start(fresh=False)
        self.assert_one_segment("after the second restart")
        self.assert_all_served("after the second restart")

        rc = self.daemon.stop(discard=False)
        self.assertEqual(rc, 0, "kvcoordd exited with %r after SIGTERM\n%s"
                         % (rc, self.daemon.log_tail()))
        # SIGTERM may keep the segment (for the next start) or remove it;
        # either way there is never a second one.
        self.assertIn(self.shm_names(), ([], [self.segment]), "after SIGTERM")


def main():
    global ARGS
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--daemon", default=os.environ.get("KVCOORDD"))
    ap.add_argument("--worker", default=os.environ.get("KVCOORD_WORKER"),
                    help="kvcoord-worker: also register 2 ranks through the library")
    ap.add_argument("--source", default=os.environ.get("KVCOORD_SOURCE_DIR"))
    ARGS, rest = ap.parse_known_args()
    if not ARGS.daemon:
        ap.error("--daemon (or KVCOORDD) is required")
    ARGS.daemon = os.path.abspath(ARGS.daemon)
    if ARGS.worker and not os.access(ARGS.worker, os.X_OK):
        ARGS.worker = None
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)


if __name__ == "__main__":
    main()
