#!/usr/bin/python3
"""test_soak.py - kvcoordd under a mixed load for --seconds (CI 60, documented
3600), its RSS and open fds sampled every second.

The load, all at once:
  - writers re-register ranks of a 512-rank ring (new versions: the arena
    keeps allocating and freeing), readers look them up, on keep-alive
    connections and on a fresh connection per request;
  - long-polls (wait_ms) on ranks that are withdrawn (DELETE) and registered
    again while the poll is parked, and on ranks that never come (the wait
    ends with 404); GET /ranks now and then;
  - stand-in TP workers (kvcoord-worker --linger) that attach, register and
    are SIGKILLed; their rank must then be withdrawn by kvcoordd's death
    watch (asserted: none still served once the reap deadline passed);
  - rooms through the library (soak_rooms: success, recorded failures, and a
    participant that dies holding its room), as TP workers drive them (the
    daemon's room routes only read rooms and record failures).
Printed: requests by kind, the first/last/max of RSS and fds, and the drift.
Asserted: no error answer; fds once the load stops equal the baseline taken
before it; RSS at the end within a generous bound (64 MiB) of RSS after the
warm-up (the first 10 %, at least 5 s: allocators keep what a peak took).
Asserts no wall-clock time.

Under an AddressSanitizer build of kvcoordd (detected from the binary) the
daemon runs with quarantine_size_mb=8 appended to ASAN_OPTIONS: ASan keeps
freed memory in a 256 MiB quarantine by default, which alone would exceed
the bound; the bound itself is the same for every build.

Usage: test_soak.py --daemon build/kvcoordd --worker build/kvcoord-worker
                    --rooms build/tests/soak_rooms [--seconds 60]
"""
import argparse
import http.client
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import loadlib  # noqa: E402

ARGS = None
RING = 512
WORKER_RANKS = range(900, 908)
REAP_DEADLINE_S = 30  # a dead worker's rank must be withdrawn by then
POLL_RANKS = range(1000, 1008)


def asan_build(exe):
    """Whether exe is built with AddressSanitizer: it then names the ASan
    runtime's entry point (dynamic libasan, or a static runtime)."""
    try:
        with open(exe, "rb") as f:
            return b"__asan_init" in f.read()
    except OSError:
        return False


class State:
    def __init__(self, d):
        self.d = d
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.counts = {}
        self.errors = []

    def count(self, kind, n=1):
        with self.lock:
            self.counts[kind] = self.counts.get(kind, 0) + n

    def error(self, msg):
        with self.lock:
            self.errors.append(msg)
        self.stop.set()


def keepalive(st, kind, rnd):
    conn = http.client.HTTPConnection("127.0.0.1", st.d.port, timeout=90)
    try:
        while not st.stop.is_set():
            if kind == "register":
                rank = rnd.randrange(RING)
                v = rnd.randrange(1 << 30)
                body = loadlib.reg_body(rank, "10.9.%d.%d:%d" % (rank // 250, rank % 250, 20000 + v % 9999),
                                        loadlib.weights(rnd.choice((4, 16, 64)), v))
                conn.request("PUT", loadlib.REGISTER, body=body,
                             headers={"Content-Type": "application/json"})
                ok = (200,)
            else:
                conn.request("GET", "%s?rank=%d" % (loadlib.LOOKUP, rnd.randrange(RING)))
                ok = (200, 404)
            r = conn.getresponse()
            body = r.read()
            if r.status not in ok:
                st.error("%s answered %d %r" % (kind, r.status, body[:200]))
            st.count(kind)
    finally:
        conn.close()


def fresh_conns(st, rnd):
    """One request per connection: accept, close, slot reuse."""
    while not st.stop.is_set():
        target = rnd.choice(("/health", "/ranks", "%s?rank=%d" % (loadlib.LOOKUP, rnd.randrange(RING))))
        code, body, _ = loadlib.get(st.d.port, target, timeout=30)
        if code not in (200, 404):
            st.error("%s answered %d" % (target, code))
        st.count("fresh_connection")


def long_polls(st, rnd):
    """A parked lookup woken by a registration, and one that times out."""
    while not st.stop.is_set():
        rank = rnd.choice(POLL_RANKS)
        code, _, _ = loadlib.get(st.d.port, "/transfer_engine_info?rank=%d" % rank, method="DELETE")
        if code not in (200, 404):
            st.error("DELETE answered %d" % code)
        result = {}

        def poll():
            result["code"] = loadlib.get(st.d.port, "%s?rank=%d&wait_ms=5000" % (loadlib.LOOKUP, rank),
                                         timeout=30)[0]
        t = threading.Thread(target=poll)
        t.start()
        time.sleep(0.05)
        code, _, _ = loadlib.get(st.d.port, loadlib.REGISTER, method="PUT",
                                 body=loadlib.reg_body(rank, "10.8.0.1:%d" % (40000 + rank),
                                                       loadlib.weights(4, rnd.randrange(1000))))
        t.join()
        if code != 200 or result.get("code") != 200:
            st.error("long-poll woken by a registration: register %s, poll %s" % (code, result))
        code = loadlib.get(st.d.port, "%s?rank=%d&wait_ms=100" % (loadlib.LOOKUP, 5000 + rank), timeout=30)[0]
        if code != 404:
            st.error("long-poll on an absent rank answered %d" % code)
        st.count("long_poll", 2)


def workers(st, rnd, infodir):
    while not st.stop.is_set():
        rank = rnd.choice(WORKER_RANKS)
        path = os.path.join(infodir, "rank-%d.json" % rank)
        with open(path, "wb") as f:
            f.write(loadlib.reg_body(rank, "10.7.0.1:%d" % (50000 + rank), loadlib.weights(8, rank)))
        p = subprocess.Popen([ARGS.worker, "--segment", st.d.segment, "--rank", str(rank), "--info", path,
                              "--linger", "--timeout-ms", "10000"],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        line = p.stdout.readline()
        if "generation=" not in line:
            p.kill()
            p.wait()
            st.error("kvcoord-worker did not register: %r" % line)
            return
        time.sleep(rnd.uniform(0.05, 0.3))
        p.send_signal(signal.SIGKILL)
        p.wait()
        p.stdout.close()
        st.count("worker_killed")
        # kvcoordd's pidfd death watch (src/daemon/proc/proc_watch.c) withdraws the rank of a
        # dead worker (only this thread uses WORKER_RANKS, so nothing
        # registers it again meanwhile).  The deadline only bounds the wait.
        deadline = time.monotonic() + REAP_DEADLINE_S
        while True:
            code, _, _ = loadlib.get(st.d.port, "%s?rank=%d" % (loadlib.LOOKUP, rank), timeout=30)
            if code != 200 or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        if code not in (200, 404):
            st.error("lookup of a killed worker's rank answered %d" % code)
        st.count("dead_worker_rank_%s" % ("withdrawn" if code == 404 else "still_served"))
        if code == 200:
            st.error("rank %d of a SIGKILLed worker still served %ds after its death"
                     % (rank, REAP_DEADLINE_S))


def sampler(st, samples):
    t0 = time.monotonic()
    while not st.stop.wait(1.0):
        try:
            samples.append((time.monotonic() - t0, st.d.fds(), st.d.rss_kb()))
        except OSError:
            st.error("kvcoordd is gone")


def summary(samples, key, unit):
    vals = [s[key] for s in samples]
    return "%s first=%d last=%d max=%d drift=%+d%s" % (
        ("rss" if key == 2 else "fds"), vals[0], vals[-1], max(vals), vals[-1] - vals[0], unit)


def main():
    global ARGS
    p = argparse.ArgumentParser()
    p.add_argument("--daemon", required=True)
    p.add_argument("--worker", required=True)
    p.add_argument("--rooms", required=True)
    p.add_argument("--seconds", type=int, default=60)
    p.add_argument("--seed", type=int, default=1)
    ARGS = p.parse_args()
    loadlib.raise_nofile()
    if asan_build(ARGS.daemon):
        opts = os.environ.get("ASAN_OPTIONS", "")
        os.environ["ASAN_OPTIONS"] = (opts + ":" if opts else "") + "quarantine_size_mb=8"
        print("ASan build: ASAN_OPTIONS=%s" % os.environ["ASAN_OPTIONS"])
    seg = "kvctest-soak-%d" % os.getpid()
    d = loadlib.Daemon(ARGS.daemon, seg, ["--max-ranks", "8192"]).start(fresh=True)
    st = State(d)
    infodir = tempfile.mkdtemp(prefix="kvcsoak-")
    rooms = None
    try:
        time.sleep(0.3)
        fds0, rss0 = d.fds(), d.rss_kb()
        print("before load: fds=%d rss=%d KiB" % (fds0, rss0))
        rooms = subprocess.Popen([ARGS.rooms, seg, str(ARGS.seconds)], stdout=subprocess.PIPE, text=True)
        samples = []
        rnd = random.Random(ARGS.seed)
        ths = [threading.Thread(target=sampler, args=(st, samples))]
        for i, kind in enumerate(("register", "register", "lookup", "lookup")):
            ths.append(threading.Thread(target=keepalive, args=(st, kind, random.Random(rnd.random()))))
        ths.append(threading.Thread(target=fresh_conns, args=(st, random.Random(rnd.random()))))
        ths.append(threading.Thread(target=long_polls, args=(st, random.Random(rnd.random()))))
        ths.append(threading.Thread(target=workers, args=(st, random.Random(rnd.random()), infodir)))

        def guarded(fn):
            def run(*a):
                try:
                    fn(*a)
                except Exception as e:  # noqa: BLE001 - any failure ends the soak
                    st.error("%s: %r" % (fn.__name__, e))
            return run
        for t in ths:
            t._target = guarded(t._target)
            t.daemon = True
            t.start()
        st.stop.wait(ARGS.seconds)
        st.stop.set()
        for t in ths:
            t.join(timeout=60)
        out, _ = rooms.communicate(timeout=120)
        assert not st.errors, st.errors[:5]
        assert rooms.returncode == 0, "soak_rooms failed: %s" % out
        print(out.strip())
        print("requests: %s" % ", ".join("%s=%d" % kv for kv in sorted(st.counts.items())))
        assert len(samples) >= 2, "too few samples"
        warm = max(5, ARGS.seconds // 10)
        warm_sample = next((s for s in samples if s[0] >= warm), samples[0])
        print("samples: %d (one a second); %s; %s" % (len(samples), summary(samples, 1, ""),
                                                       summary(samples, 2, " KiB")))
        fds1 = d.wait_fds(fds0)
        rss1 = d.rss_kb()
        print("after load: fds=%d (baseline %d) rss=%d KiB; rss drift since warm-up (t=%ds): %+d KiB"
              % (fds1, fds0, rss1, int(warm_sample[0]), rss1 - warm_sample[2]))
        assert fds1 == fds0, "fds after the soak %d, before %d" % (fds1, fds0)
        assert rss1 - warm_sample[2] < 64 * 1024, "RSS grew %d KiB after the warm-up" % (rss1 - warm_sample[2])
        code = d.stop()
        assert code == 0, "kvcoordd exit status %s" % code
        print("PASS")
        return 0
    finally:
        st.stop.set()
        if rooms and rooms.poll() is None:
            rooms.kill()
        if d.alive():
            d.sigkill()
        d.unlink_segment()


if __name__ == "__main__":
    sys.exit(main())
