#!/usr/bin/python3
"""test_crash_load.py - SIGKILL kvcoordd under load; nothing acknowledged is lost.

kvcoordd runs on a fresh segment.  --writers threads register (each its own
stream of new ranks, and each overwrites one rank of its own with a new
version every time) and --readers threads look up ranks already
acknowledged, checking each answer equals what was acknowledged.  At a
random moment (--min/--max seconds into a round) kvcoordd is SIGKILLed;
clients see their connections fail and retry the same request, as real
clients do.  kvcoordd restarts on the same segment (no --fresh) and, before
the clients resume, every registration acknowledged before the kill is
looked up: a new rank equal to its acknowledged value, an overwritten rank
holding its last acknowledged version or the one in flight at the kill.
--kills rounds, then SIGTERM (exit 0).  /dev/shm holds one segment of that
name throughout.  Prints kills, registrations acknowledged, lookups checked,
lost (always 0, or the test fails).  Asserts no wall-clock time.

Usage: test_crash_load.py --daemon build/kvcoordd [--kills 3] [--writers 4] [--readers 4]
"""
import argparse
import http.client
import json
import os
import random
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import loadlib  # noqa: E402

ARGS = None
FIRST_NEW_RANK = 64


class Shared:
    def __init__(self, daemon):
        self.daemon = daemon
        self.lock = threading.Lock()
        self.acked = {}       # new rank -> (session_id, wid)
        self.over_acked = {}  # overwritten rank -> last acknowledged value
        self.inflight = {}    # rank -> value sent, not yet acknowledged
        self.running = threading.Event()   # clear: clients hold their next request
        self.stop = threading.Event()
        self.errors = []
        self.retries = 0
        self.lookups = 0
        self.registrations = 0


class Client:
    """One keep-alive connection that follows the daemon across restarts."""

    def __init__(self, sh):
        self.sh = sh
        self.conn = None

    def request(self, method, target, body=None):
        """Returns (status, body); retries the same request on connection
        errors (the daemon is being killed or restarted)."""
        while not self.sh.stop.is_set():
            self.sh.running.wait()
            try:
                if self.conn is None:
                    self.conn = http.client.HTTPConnection("127.0.0.1", self.sh.daemon.port,
                                                           timeout=30)
                self.conn.request(method, target, body=body,
                                  headers={"Content-Type": "application/json"} if body else {})
                r = self.conn.getresponse()
                return r.status, r.read()
            except (OSError, http.client.HTTPException):
                if self.conn:
                    self.conn.close()
                self.conn = None
                with self.sh.lock:
                    self.sh.retries += 1
                time.sleep(0.02)
        return None, b""


def writer(sh, idx):
    c = Client(sh)
    over_rank = idx  # ranks 0..writers-1 are overwritten again and again
    i = 0
    while not sh.stop.is_set():
        rank = FIRST_NEW_RANK + idx + ARGS.writers * i
        val = ("10.%d.%d.%d:%d" % (idx, i // 250 % 250, i % 250, 20000 + i % 40000),
               loadlib.weights(12, 1000 * idx + i))
        for r, v, table in ((rank, val, sh.acked),
                            (over_rank, ("10.200.%d.1:%d" % (idx, 30000 + i % 30000),
                                         loadlib.weights(6, 7000 + i)), sh.over_acked)):
            with sh.lock:
                sh.inflight[r] = v
            st, body = c.request("PUT", loadlib.REGISTER, loadlib.reg_body(r, v[0], v[1]))
            if st is None:
                return
            if st != 200:
                sh.errors.append("registration of rank %d answered %d %r" % (r, st, body[:200]))
                return
            with sh.lock:
                table[r] = v
                sh.inflight.pop(r, None)
                sh.registrations += 1
        i += 1


def same(answer, rank, value):
    try:
        j = json.loads(answer)
    except ValueError:
        return False
    return j.get("rank") == rank and j.get("remote_instance_transfer_engine_info") == [value[0], value[1]]


def reader(sh, idx):
    c = Client(sh)
    rnd = random.Random(idx)
    while not sh.stop.is_set():
        with sh.lock:
            if not sh.acked:
                pick = None
            else:
                # a recent rank now and then: the likeliest to be lost
                keys = list(sh.acked)
                rank = keys[-1] if rnd.random() < 0.3 else rnd.choice(keys)
                pick = (rank, sh.acked[rank])
        if pick is None:
            time.sleep(0.01)
            continue
        st, body = c.request("GET", "%s?rank=%d" % (loadlib.LOOKUP, pick[0]))
        if st is None:
            return
        if st != 200 or not same(body, pick[0], pick[1]):
            sh.errors.append("lookup of acknowledged rank %d answered %d %r"
                             % (pick[0], st, body[:200]))
            return
        with sh.lock:
            sh.lookups += 1


def verify(sh, inflight_at_kill):
    """Every acknowledged registration is served as acknowledged."""
    port = sh.daemon.port
    lost = []
    for rank, val in sh.acked.items():
        st, body, _ = loadlib.get(port, "%s?rank=%d" % (loadlib.LOOKUP, rank))
        if st != 200 or not same(body, rank, val):
            lost.append((rank, st, body[:120]))
    for rank, val in sh.over_acked.items():
        st, body, _ = loadlib.get(port, "%s?rank=%d" % (loadlib.LOOKUP, rank))
        ok = st == 200 and (same(body, rank, val) or
                            (rank in inflight_at_kill and same(body, rank, inflight_at_kill[rank])))
        if not ok:
            lost.append((rank, st, body[:120]))
    # an unacknowledged new rank is absent or complete, never a mix
    for rank, val in inflight_at_kill.items():
        if rank >= FIRST_NEW_RANK:
            st, body, _ = loadlib.get(port, "%s?rank=%d" % (loadlib.LOOKUP, rank))
            if not (st == 404 or (st == 200 and same(body, rank, val))):
                lost.append((rank, st, body[:120]))
    return len(sh.acked) + len(sh.over_acked), lost


def segments(name):
    return sorted(f for f in os.listdir("/dev/shm") if f == name)


def main():
    global ARGS
    p = argparse.ArgumentParser()
    p.add_argument("--daemon", required=True)
    p.add_argument("--kills", type=int, default=3)
    p.add_argument("--writers", type=int, default=4)
    p.add_argument("--readers", type=int, default=4)
    p.add_argument("--min", type=float, default=1.0, help="seconds of load before a kill, at least")
    p.add_argument("--max", type=float, default=3.0, help="... at most")
    p.add_argument("--seed", type=int, default=None)
    ARGS = p.parse_args()
    loadlib.raise_nofile()
    seed = ARGS.seed if ARGS.seed is not None else int(time.time())
    rnd = random.Random(seed)
    print("seed %d (reproduce the kill moments with --seed %d)" % (seed, seed))
    seg = "kvctest-crashload-%d" % os.getpid()
    d = loadlib.Daemon(ARGS.daemon, seg, ["--max-ranks", "65536"]).start(fresh=True)
    sh = Shared(d)
    sh.running.set()
    threads = [threading.Thread(target=writer, args=(sh, i), daemon=True) for i in range(ARGS.writers)]
    threads += [threading.Thread(target=reader, args=(sh, i), daemon=True) for i in range(ARGS.readers)]
    checked_total = 0
    lost_total = 0
    try:
        for t in threads:
            t.start()
        for k in range(ARGS.kills):
            time.sleep(rnd.uniform(ARGS.min, ARGS.max))
            assert not sh.errors, sh.errors[:3]
            d.sigkill()
            sh.running.clear()  # clients in a retry hold there until verified
            time.sleep(0.1)     # requests in flight at the kill finish failing
            with sh.lock:
                inflight = dict(sh.inflight)
                acked_now = sh.registrations
            assert segments(seg) == [seg], "segments in /dev/shm: %s" % segments(seg)
            d.start(fresh=False)
            checked, lost = verify(sh, inflight)
            checked_total += checked
            lost_total += len(lost)
            print("kill %d: %d registrations acknowledged so far, %d ranks checked after "
                  "restart, %d in flight at the kill, lost=%d, lookups verified so far %d"
                  % (k + 1, acked_now, checked, len(inflight), len(lost), sh.lookups))
            assert not lost, "lost after kill %d: %s" % (k + 1, lost[:5])
            sh.running.set()
        time.sleep(0.5)
        sh.stop.set()
        sh.running.set()
        for t in threads:
            t.join(timeout=60)
        assert not sh.errors, sh.errors[:3]
        assert segments(seg) == [seg]
        status = d.stop()
        assert status == 0, "kvcoordd exit status %s after SIGTERM" % status
        print("crash under load: kills=%d registrations_acked=%d lookups_verified=%d "
              "client_retries=%d ranks_checked_after_restarts=%d lost=%d"
              % (ARGS.kills, sh.registrations, sh.lookups, sh.retries, checked_total, lost_total))
        assert sh.registrations > 0 and sh.lookups > 0
        print("PASS")
        return 0
    finally:
        sh.stop.set()
        sh.running.set()
        if d.alive():
            d.sigkill()
        d.unlink_segment()


if __name__ == "__main__":
    sys.exit(main())
