#!/usr/bin/python3
"""`tools/kvcoord.sh stop` on a copy of the script in a scratch checkout
(DIR/tools/kvcoord.sh, so its build/run/ is DIR/build/run/ and the real
checkout's run is never touched): a real kvcoordd started as
DIR/build/kvcoordd, and stand-in workers (sleep started as
DIR/build/kvcoord-worker: the script recognises its processes by that path).

Checked: what stop says and its exit status when everything runs, when the
processes had already exited (it says so, exit 0), when some had, when a pid
file's pid now belongs to another program (left alone), with no pid files,
and for a bad argument (usage, exit 2).

With a real kvcoord-worker and kvcoord-diag: what stop says of the kept
segment is what it holds (a worker's rank left registered by a dead pid is
named, with the command that withdraws it).

Usage: test_kvcoord_sh.py --script tools/kvcoord.sh --daemon KVCOORDD
                          --worker KVCOORD_WORKER --diag KVCOORD_DIAG --work DIR
"""

import argparse
import os
import shutil
import signal
import subprocess
import sys
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
from kvctest import wait_log  # noqa: E402  (the tests' one helper module)

ARGS = None


def wait_gone(pid, timeout=10):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


class Stop(unittest.TestCase):
    def setUp(self):
        self.root = os.path.realpath(os.path.join(ARGS.work, self._testMethodName))
        shutil.rmtree(self.root, ignore_errors=True)
        os.makedirs(os.path.join(self.root, "tools"))
        self.run_dir = os.path.join(self.root, "build", "run")
        os.makedirs(self.run_dir)
        self.script = os.path.join(self.root, "tools", "kvcoord.sh")
        shutil.copy(ARGS.script, self.script)
        os.symlink(os.path.realpath(ARGS.daemon), os.path.join(self.root, "build", "kvcoordd"))
        os.symlink(shutil.which("sleep"), os.path.join(self.root, "build", "kvcoord-worker"))
        self.procs = []
        self.segment = "kvctest-sh-%d-%s" % (os.getpid(), self._testMethodName[5:40])

    def tearDown(self):
        for p in self.procs:
            if p.poll() is None:
                p.kill()
            p.wait()
        try:
            os.unlink("/dev/shm/" + self.segment)
        except FileNotFoundError:
            pass

    def start(self, argv, out=subprocess.DEVNULL, **kw):
        p = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, **kw)
        self.procs.append(p)
        return p

    def start_run(self, workers=2):
        """A daemon and workers as 'run' leaves them, with their pid files."""
        log = os.path.join(self.root, "kvcoordd.log")
        with open(log, "w") as out:
            d = self.start([os.path.join(self.root, "build", "kvcoordd"), "--listen",
                            "127.0.0.1:0", "--segment", self.segment, "--fresh"], out)
        ws = [self.start([os.path.join(self.root, "build", "kvcoord-worker"), "600"])
              for _ in range(workers)]
        self.write_pids(d.pid, [w.pid for w in ws])
        # listening: it has its signal mask (SIGTERM is a clean stop)
        wait_log(log, r"listening addr=", "kvcoordd to listen", proc=d)
        return d, ws

    def write_pids(self, daemon, workers):
        with open(os.path.join(self.run_dir, "kvcoordd.pid"), "w") as f:
            f.write("%d\n" % daemon)
        with open(os.path.join(self.run_dir, "workers.pid"), "w") as f:
            f.write("".join("%d\n" % w for w in workers))

    def stop(self, *args):
        # a hang guard: stop waits up to 5 s per group of processes, and at
        # load 20 its bash loops alone took past 60 s
        r = subprocess.run(["bash", self.script, "stop"] + list(args), capture_output=True,
                           text=True, timeout=240)
        return r.returncode, r.stdout, r.stderr

    def assertNoPidFiles(self):
        self.assertEqual(sorted(os.listdir(self.run_dir)), [])

    def test_stop_running_processes(self):
        d, ws = self.start_run()
        rc, out, err = self.stop()
        self.assertEqual(rc, 0, out + err)
        self.assertIn("stopping workers (pid %d %d)" % (ws[0].pid, ws[1].pid), out)
        self.assertIn("stopping kvcoordd (pid %d)" % d.pid, out)
        self.assertIn("==> stopped\n", out)
        self.assertNotIn("already gone", out)
        # exited at SIGTERM: a zombie until this test reaps it, which is not
        # running (no 5 s wait and SIGKILL)
        self.assertNotIn("SIGKILL", out)
        self.assertEqual(d.wait(10), 0)  # SIGTERM: a clean stop
        self.assertNoPidFiles()

    def test_segment_note_tells_what_is_left(self):
        # A real worker registers rank 0; it and kvcoordd are stopped
        # (SIGSTOP), so stop SIGKILLs them and no one withdraws the rank.
        os.unlink(os.path.join(self.root, "build", "kvcoord-worker"))
        os.symlink(os.path.realpath(ARGS.worker), os.path.join(self.root, "build", "kvcoord-worker"))
        os.symlink(os.path.realpath(ARGS.diag), os.path.join(self.root, "build", "kvcoord-diag"))
        with open(os.path.join(self.run_dir, "segment"), "w") as f:
            f.write(self.segment + "\n")
        info = os.path.join(self.root, "rank-0.json")
        with open(info, "w") as f:
            f.write('{"rank":0,"transfer_engine_info":{"session_id":"127.0.0.1:16000",'
                    '"weights_info_dict":{"w":[4096,64,2]}}}')
        d, _ = self.start_run(workers=0)
        wlog = os.path.join(self.root, "worker.log")
        with open(wlog, "w") as out:
            w = self.start([os.path.join(self.root, "build", "kvcoord-worker"), "--segment",
                            self.segment, "--info", info, "--linger"], out)
        wait_log(wlog, r"kvcoord-worker: rank=0 ", "the worker to register", proc=w)
        self.write_pids(d.pid, [w.pid])
        for p in (w, d):
            os.kill(p.pid, signal.SIGSTOP)
        rc, out, err = self.stop()
        self.assertEqual(rc, 0, out + err)
        self.assertIn("SIGKILL %d" % w.pid, out)
        self.assertNotIn("withdrawn as they exited", out)
        self.assertIn("still registered: rank 0 (pid %d)" % w.pid, out)
        self.assertIn("'build/kvcoord-diag --segment %s repair'" % self.segment, out)
        # the command named clears it; then stop says the ranks are gone
        subprocess.run([ARGS.diag, "--segment", self.segment, "repair"], check=True,
                       stdout=subprocess.DEVNULL)
        self.write_pids(d.pid, [])
        rc, out, err = self.stop()
        self.assertEqual(rc, 0, out + err)
        self.assertIn("the workers' ranks were withdrawn as they exited", out)

    def test_stop_when_everything_had_already_exited(self):
        d, ws = self.start_run()
        for p in [d] + ws:
            p.kill()
            p.wait()
        rc, out, err = self.stop()
        self.assertEqual(rc, 0, out + err)  # nothing left running: what stop is for
        self.assertIn("kvcoordd: pid %d already gone (not running)" % d.pid, out)
        self.assertIn("workers: pid %d %d already gone" % (ws[0].pid, ws[1].pid), out)
        self.assertIn("nothing to stop: the last run's processes had already exited", out)
        self.assertNotIn("==> stopped\n", out)
        self.assertNotIn("stopping", out)
        self.assertNoPidFiles()

    def test_stop_when_the_daemon_alone_had_exited(self):
        d, ws = self.start_run()
        d.kill()
        d.wait()
        rc, out, err = self.stop()
        self.assertEqual(rc, 0, out + err)
        self.assertIn("kvcoordd: pid %d already gone (not running)" % d.pid, out)
        self.assertIn("stopping workers", out)
        self.assertIn("==> stopped\n", out)
        for w in ws:
            self.assertEqual(w.wait(10), -15)

    def test_pid_reused_by_another_program_is_left_alone(self):
        other = self.start(["sleep", "600"])  # not started from the scratch checkout
        self.write_pids(other.pid, [])
        rc, out, err = self.stop()
        self.assertEqual(rc, 0, out + err)
        self.assertIn("kvcoordd: pid %d now belongs to another program (pid reused): left alone"
                      % other.pid, out)
        self.assertIn("nothing to stop: the last run's processes had already exited", out)
        time.sleep(0.2)
        self.assertIsNone(other.poll(), "stop signalled a process that is not the run's")

    def test_no_pid_files(self):
        rc, out, err = self.stop()
        self.assertEqual((rc, out, err), (0, "==> nothing to stop (no pid files in build/run/)\n",
                                          ""))

    def test_a_daemon_restarted_by_hand_on_the_port_is_named(self):
        import socket
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        with open(os.path.join(self.run_dir, "segment"), "w") as f:
            f.write("kvcoord-%d\n" % port)
        d, ws = self.start_run()
        # The run's kvcoordd exits; one started by hand serves the run's port.
        d.kill()
        d.wait()
        hand = self.start([ARGS.daemon, "--listen", "127.0.0.1:%d" % port, "--segment",
                           self.segment + "-hand", "--fresh"])
        while True:  # until it listens
            try:
                socket.create_connection(("127.0.0.1", port)).close()
                break
            except OSError:
                self.assertIsNone(hand.poll(), "kvcoordd by hand exited at start")
                time.sleep(0.05)
        try:
            for _ in range(2):  # with the pid files, then without them
                rc, out, err = self.stop()
                self.assertEqual(rc, 1, out + err)
                self.assertIn("NOT stopped: 127.0.0.1:%d still answers (pid %d" % (port, hand.pid),
                              err)
                self.assertNotIn("==> stopped", out)
                self.assertNotIn("nothing to stop", out)
                self.assertIsNone(hand.poll())
        finally:
            hand.terminate()
            hand.wait()
            try:
                os.unlink("/dev/shm/" + self.segment + "-hand")
            except FileNotFoundError:
                pass
        rc, out, err = self.stop()
        self.assertEqual(rc, 0, out + err)

    def test_previous_run_note(self):
        # what 'run' says when it stops the previous run: one true thing
        # (it said "segment kvcoord-7850 is kept; this run starts kvcoord-7850 fresh")
        def note(prev, new):
            return subprocess.run(
                ["bash", "-c", 'source <(sed -n "/^previous_run_note()/,/^}/p" "$0"); '
                 'previous_run_note "$1" "$2"', self.script, prev, new],
                capture_output=True, text=True, check=True).stdout.strip()
        head = "a previous 'run' of this checkout is still up: stopping it first"
        self.assertEqual(note("kvcoord-7850", "kvcoord-7850"),
                         head + "; this run starts its segment kvcoord-7850 afresh (what was "
                         "registered in it is discarded)")
        self.assertEqual(note("kvcoord-6789", "kvcoord-7850"),
                         head + " (its segment kvcoord-6789 stays in /dev/shm, no longer "
                         "served; this run starts kvcoord-7850 fresh)")
        self.assertEqual(note("", "kvcoord-7850"), head + "; this run starts kvcoord-7850 fresh")

    def test_usage(self):
        rc, out, err = self.stop("--now")
        self.assertEqual(rc, 2)
        self.assertIn("kvcoord.sh: stop: unknown argument '--now'", err)
        self.assertIn("tools/kvcoord.sh --help", err)
        self.assertEqual(out, "")
        rc, out, err = self.stop("--help")
        self.assertEqual(rc, 0)
        self.assertIn("already gone", out)  # --help describes it

    def test_test_options_conflicting_or_unknown(self):
        # Checked before anything runs (no package, no build): each part
        # option runs one part alone, so two of them would run only one.
        for args, msg in ((["--sanitize", "--arm64"], "give at most one"),
                          (["--arm64", "--sanitize"], "give at most one"),
                          (["--fast"], "test: unknown option '--fast'"),
                          (["--arm64", "extra"], "test: unknown option 'extra'")):
            r = subprocess.run(["bash", self.script, "test"] + args, capture_output=True,
                               text=True, timeout=60)
            self.assertEqual(r.returncode, 2, (args, r.stderr))
            self.assertIn(msg, r.stderr)
            self.assertIn("Try 'tools/kvcoord.sh --help'", r.stderr)
            self.assertEqual(r.stdout, "", args)


def main():
    global ARGS
    p = argparse.ArgumentParser()
    p.add_argument("--script", required=True)
    p.add_argument("--daemon", required=True)
    p.add_argument("--worker", required=True)
    p.add_argument("--diag", required=True)
    p.add_argument("--work", required=True)
    ARGS, rest = p.parse_known_args()
    os.makedirs(ARGS.work, exist_ok=True)
    prog = unittest.main(argv=[sys.argv[0]] + rest, exit=False, verbosity=2)
    return 0 if prog.result.wasSuccessful() else 1


if __name__ == "__main__":
    sys.exit(main())
