#!/usr/bin/python3
"""test_segment_watch.py - kvcoordd watches its segment file; bad options refused.

Under a live daemon (lookups running against it all along):
  - chmod 0644 /dev/shm/S: put back to 0600, logged at error, still serving;
  - extended by 4 KiB: cut back to its size, logged at error, still serving;
  - truncated to 10 MiB, unlinked, replaced by another file (rename over it):
    the daemon logs an error naming the change and exits with status 1 -
    never killed by SIGBUS, never serving a file nobody else sees.
At start:
  - an invalid file under the segment's name (text) is moved aside as
    S.invalid-<time>, logged at error naming it, and a new segment is made;
  - a segment of another layout version (byte 8 overwritten) is neither moved
    aside nor replaced while a kvcoordd serves it - its creator, or one that
    reused it (found by its mapping) - : the second daemon exits 1 naming
    that pid, the first keeps serving; once nobody serves it, it is moved aside;
  - capacities given that differ from a reused segment's: one warning each;
  - options that cannot work (--max-header-bytes 10, --world-size 64,
    --max-buffered-bytes below --max-body-bytes) exit 2 with the reason.
Prints how long each change took to be noticed (not asserted).
"""
import glob
import os
import subprocess
import sys
import threading
import time
import argparse

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "load"))
import loadlib  # noqa: E402

ARGS = None
RESULTS = []


def shm(seg):
    return "/dev/shm/" + seg


def wait_log(d, pattern, deadline_s=30):
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if pattern in d.log_tail(100000):
            return True
        time.sleep(0.02)
    raise AssertionError("no %r in the log:\n%s" % (pattern, d.log_tail()))


class Prober:
    """Lookups against the daemon all along (a truncated mapping must not be
    hit unnoticed)."""

    def __init__(self, port, target=loadlib.LOOKUP + "?rank=0"):
        self.port, self.stop, self.ok, self.target = port, threading.Event(), 0, target
        self.t = threading.Thread(target=self.run, daemon=True)
        self.t.start()

    def run(self):
        while not self.stop.is_set():
            try:
                if loadlib.get(self.port, self.target, timeout=5)[0] == 200:
                    self.ok += 1
            except OSError:
                pass
            time.sleep(0.005)

    def end(self):
        self.stop.set()
        self.t.join(10)


def daemon(seg, extra=(), fresh=True):
    d = loadlib.Daemon(ARGS.daemon, seg, ["--max-rooms", "64"] + list(extra))  # log level: info
    d.start(fresh=fresh)
    st = loadlib.get(d.port, loadlib.REGISTER, method="PUT",
                     body=loadlib.reg_body(0, "10.4.0.1:16000", loadlib.weights(64, 0)))[0]
    assert st == 200, st
    return d


def undone(name, change, check):
    seg = "kvctest-watch-%s-%d" % (name.split()[0], os.getpid())
    d = daemon(seg)
    p = Prober(d.port)
    try:
        size = os.stat(shm(seg)).st_size
        t0 = time.monotonic()
        change(shm(seg))
        wait_log(d, "segment_file_changed")
        noticed = time.monotonic() - t0
        st = os.stat(shm(seg))
        assert st.st_size == size and (st.st_mode & 0o777) == 0o600, (st.st_size, oct(st.st_mode))
        check(d.log_tail(100000))
        assert loadlib.get(d.port, "/health")[0] == 200
        assert d.alive()
        RESULTS.append("%s: undone and logged at error after %.2f s, still serving (%d lookups "
                       "answered meanwhile)" % (name, noticed, p.ok))
    finally:
        p.end()
        assert d.stop() == 0, d.log_tail()
        d.unlink_segment()


def fatal(name, change, words, target=loadlib.LOOKUP + "?rank=0"):
    seg = "kvctest-watch-%s-%d" % (name.split()[0], os.getpid())
    d = daemon(seg)
    p = Prober(d.port, target)
    try:
        t0 = time.monotonic()
        change(shm(seg))
        rc = d.proc.wait(30)
        noticed = time.monotonic() - t0
        log = d.log_tail(100000)
        assert rc == 1, "exit %r (-7 would be SIGBUS)\n%s" % (rc, log)
        lines = [l for l in log.splitlines()
                 if " error segment_file_changed " in l or " error segment_sigbus " in l]
        assert lines, log
        assert any(w in lines[0] for w in words), lines[0]
        RESULTS.append("%s: exit 1 after %.2f s, logged: %s" % (name, noticed, lines[0][25:200]))
    finally:
        p.end()
        if d.alive():
            d.proc.kill()
            d.proc.wait()
        for f in glob.glob(shm(seg) + "*"):
            os.unlink(f)


def replace(path):
    tmp = path + ".new"
    with open(tmp, "wb") as f:
        f.write(b"x" * 4096)
    os.rename(tmp, path)


def case_runtime():
    undone("chmod", lambda p: os.chmod(p, 0o644),
           lambda log: "change=mode from=0600 to=0644 action=restored_mode" in log or
           (_ for _ in ()).throw(AssertionError(log)))
    undone("extend", lambda p: os.truncate(p, os.stat(p).st_size + 4096),
           lambda log: "change=extended" in log and "action=restored_size" in log or
           (_ for _ in ()).throw(AssertionError(log)))
    fatal("truncate", lambda p: os.truncate(p, 10 << 20), ("truncated", "shorter than its mapping"))
    # to one page, with /ranks read all along (the rank table is past it): the
    # access faults before the watch looks, and the SIGBUS guard reports it
    fatal("truncate to 4 KiB under /ranks", lambda p: os.truncate(p, 4096),
          ("truncated", "shorter than its mapping"), "/ranks")
    fatal("unlink", os.unlink, ("unlinked",))
    fatal("replace", replace, ("replaced",))


def set_version(seg, v):
    """Overwrite the segment's layout version; returns the one it had."""
    with open(shm(seg), "r+b") as f:
        f.seek(8)  # kvc_header.layout_version, in the prefix every layout version shares
        old = int.from_bytes(f.read(4), "little")
        f.seek(8)
        f.write(v.to_bytes(4, "little"))
    return old


def second_daemon(seg):
    return subprocess.run([ARGS.daemon, "--listen", "127.0.0.1:0", "--segment", seg],
                          capture_output=True, text=True, timeout=60, check=False)


def refused_while_served(seg, d, how):
    own = set_version(seg, 5)
    p = second_daemon(seg)
    assert p.returncode == 1, (p.returncode, p.stderr)
    words = "another kvcoordd (pid %d) serves this segment" % d.pid
    line = [l for l in p.stderr.splitlines() if " error segment_in_use " in l]
    assert line and words in line[0] and "layout_version=5" in line[0], p.stderr
    assert not glob.glob(shm(seg) + ".invalid-*"), glob.glob(shm(seg) + "*")
    assert d.alive() and loadlib.get(d.port, "/health")[0] == 200, d.log_tail()
    RESULTS.append("other layout version, served by %s: refused, logged: %s" %
                   (how, line[0][25:200]))
    set_version(seg, own)  # back to this build's, so that it can be reused


def case_other_version():
    seg = "kvctest-watch-version-%d" % os.getpid()
    try:
        d = daemon(seg)  # its creator
        refused_while_served(seg, d, "its creator")
        assert d.stop() == 0
        # A daemon that reused the segment (not its creator) serves it.
        d = loadlib.Daemon(ARGS.daemon, seg)  # log level: info
        d.start(fresh=False)
        refused_while_served(seg, d, "a kvcoordd that reused it")
        set_version(seg, 5)
        d.proc.kill()  # nobody serves it any more: now it is moved aside
        d.proc.wait()
        d = loadlib.Daemon(ARGS.daemon, seg)  # log level: info
        d.start(fresh=False)
        aside = glob.glob(shm(seg) + ".invalid-*")
        assert len(aside) == 1, glob.glob(shm(seg) + "*")
        assert " error segment_moved_aside " in d.log_tail(100000), d.log_tail()
        assert d.stop() == 0
        RESULTS.append("other layout version, served by nobody: moved aside")
    finally:
        for f in glob.glob(shm(seg) + "*"):
            os.unlink(f)


def case_start():
    case_other_version()
    seg = "kvctest-watch-start-%d" % os.getpid()
    with open(shm(seg), "w") as f:
        f.write("not a segment\n")
    try:
        d = daemon(seg, fresh=False)
        log = d.log_tail(100000)
        aside = glob.glob(shm(seg) + ".invalid-*")
        assert len(aside) == 1, aside
        assert open(aside[0]).read() == "not a segment\n"
        line = [l for l in log.splitlines() if " error segment_moved_aside " in l]
        assert line and os.path.basename(aside[0]) in line[0], log
        assert d.stop() == 0
        RESULTS.append("invalid file at start: moved aside, logged: %s" % line[0][25:220])
        # capacities that differ from the reused segment's: warned about
        d = loadlib.Daemon(ARGS.daemon, seg, ["--max-rooms", "128", "--room-ttl", "30"])
        d.start(fresh=False)
        log = d.log_tail(100000)
        assert "warn capacity_ignored option=--max-rooms given=128 segment=64" in log, log
        assert "option=--room-ttl given=30000ms segment=300000ms" in log, log
        assert d.stop() == 0
        RESULTS.append("capacities differing from the reused segment's: one warning each")
    finally:
        for f in glob.glob(shm(seg) + "*"):
            os.unlink(f)
    for opts, words in ((["--max-header-bytes", "10"], "too small for any request"),
                        (["--world-size", "64"], "32 participants"),
                        (["--max-body-bytes", "512M"], "below --max-body-bytes")):
        r = subprocess.run([ARGS.daemon] + opts, capture_output=True, text=True, timeout=30)
        assert r.returncode == 2 and words in r.stderr, (opts, r.returncode, r.stderr)
        RESULTS.append("%s refused (exit 2): %s" % (" ".join(opts), r.stderr.splitlines()[0]))


def main():
    global ARGS
    ap = argparse.ArgumentParser()
    ap.add_argument("--daemon", required=True)
    ap.add_argument("--case", choices=("runtime", "start"), required=True)
    ARGS = ap.parse_args()
    case_runtime() if ARGS.case == "runtime" else case_start()
    for r in RESULTS:
        print(r)
    print("%d passed, 0 failed" % len(RESULTS))
    return 0


if __name__ == "__main__":
    sys.exit(main())
