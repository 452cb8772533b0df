"""Helpers shared by the Python tests: unique segment names, small segments,
forked children that report back over a pipe, and a real kvcoordd.

The tests run from ctest as `/usr/bin/python3 -m unittest` with PYTHONPATH
set to the build tree's python/ directory and KVCOORD_DAEMON,
KVCOORD_BUILD_DIR and KVCOORD_SOURCE_DIR in the environment
(tests/python/tests.cmake).
"""

import itertools
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import traceback
import unittest

import kvcoord

# Capacities small enough for many test segments in /dev/shm at once.
SMALL = dict(max_ranks=64, max_rooms=256, arena_bytes=64 << 20, max_info_bytes=4 << 20,
             max_procs=256, world_size=8)
DEADLINE = 60.0  # hang guard for waits, never an assertion about speed
_names = itertools.count()


def new_name(tag):
    """A segment name no other test (or run) uses."""
    return "kvctest-py-%s-%d-%d" % (tag, os.getpid(), next(_names))


def discard(name):
    try:
        kvcoord.unlink(name)
    except kvcoord.SegmentNotFoundError:
        pass


class SegmentCase(unittest.TestCase):
    """A fresh small segment per test (self.name, self.seg: a client handle)."""

    def setUp(self):
        self.name = new_name(type(self).__name__.lower()[:12])
        self.seg = kvcoord.Segment(self.name, mode="fresh", role="client", **SMALL)

    def tearDown(self):
        self.seg.close()
        discard(self.name)


def fork_children(n, fn, *args):
    """Fork n children running fn(i, *args) -> JSON-able result; returns
    [(pid, read_fd)].  A child's exception is reported as {"error": text}."""
    kids = []
    for i in range(n):
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            code = 0
            try:
                out = {"result": fn(i, *args)}
            except BaseException:  # reported to the parent, which fails the test
                out = {"error": traceback.format_exc()}
                code = 1
            try:
                os.write(w, json.dumps(out).encode())
            finally:
                os._exit(code)
        os.close(w)
        kids.append((pid, r))
    return kids


def collect(kids, skip=()):
    """Read every child's report and reap it; returns {index: report}."""
    out = {}
    for i, (pid, r) in enumerate(kids):
        if pid in skip:
            os.close(r)
            continue
        data = b""
        while True:
            chunk = os.read(r, 65536)
            if not chunk:
                break
            data += chunk
        os.close(r)
        os.waitpid(pid, 0)
        out[i] = json.loads(data) if data else {"error": "child %d wrote nothing" % pid}
    return out


def wait_for(pred, what, deadline=DEADLINE):
    """Poll pred() until true; AssertionError naming `what` after deadline."""
    end = time.monotonic() + deadline
    while not pred():
        if time.monotonic() > end:
            raise AssertionError("timed out waiting for " + what)
        time.sleep(0.005)


def rss_kib():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024


class Daemon:
    """kvcoordd on a free loopback port serving a fresh segment."""

    def __init__(self, segment, extra=()):
        path = os.environ.get("KVCOORD_DAEMON")
        if not path:
            raise unittest.SkipTest("KVCOORD_DAEMON not set (run the tests through ctest)")
        self.segment = segment
        self.log = tempfile.NamedTemporaryFile(prefix="kvcoordd-py-", suffix=".log",
                                               delete=False)
        cmd = [path, "--listen", "127.0.0.1:0", "--segment", segment, "--fresh",
               "--max-rooms", "256", "--log-level", "debug", *extra]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=self.log,
                                     stderr=subprocess.STDOUT)
        end = time.monotonic() + DEADLINE
        while True:
            m = re.search(r"listening addr=127\.0\.0\.1:(\d+)", self.output())
            if m:
                self.port = int(m.group(1))
                self.url = "http://127.0.0.1:%d" % self.port
                return
            if self.proc.poll() is not None or time.monotonic() > end:
                raise AssertionError("kvcoordd did not start: " + self.output())
            time.sleep(0.02)

    def output(self):
        with open(self.log.name, encoding="utf-8", errors="replace") as f:
            return f.read()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if os.environ.get("KVC_KEEP_LOGS"):
            sys.stderr.write(self.output())
        os.unlink(self.log.name)
        discard(self.segment)
