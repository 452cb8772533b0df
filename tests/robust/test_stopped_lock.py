#!/usr/bin/python3
"""test_stopped_lock.py - a stopped lock holder never stalls kvcoordd's event loop.

For each of the segment's locks (ranks, rooms, procs), a process
(lock_holder) attaches and stops itself with SIGSTOP while it holds the
lock, as a process under a debugger or a cgroup freezer would.  kvcoordd
runs with --lock-timeout longer than the read clients' timeout, so a read
that waited for the lock would fail at the client.  Meanwhile:
  - GET /health, lookups, GET /ranks and GET /metrics are answered (within
    the client's timeout), also while mutating requests are waiting;
  - a mutating request that needs the held lock is answered 503 with
    Retry-After, its detail naming the lock and the holder's pid; one that
    does not need it (registration while procs is held) is answered 200.
Then the holder is SIGKILLed: the lock is recovered and mutating requests
succeed again.  Latencies are measured and printed, never asserted.
"""
import argparse
import http.client
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "load"))
import loadlib  # noqa: E402

LOCK_TIMEOUT_MS = 3000
READ_TIMEOUT_S = 1.5  # shorter than the lock timeout: a read waiting for it would fail
WRITE_TIMEOUT_S = 30


def request(port, method, target, body=None, timeout=READ_TIMEOUT_S):
    """(status, body, headers, seconds)"""
    t0 = time.monotonic()
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        c.request(method, target, body=body)
        r = c.getresponse()
        data = r.read()
        return r.status, data, {k.lower(): v for k, v in r.getheaders()}, time.monotonic() - t0
    finally:
        c.close()


def state_of(pid):
    with open("/proc/%d/stat" % pid) as f:
        return f.read().rsplit(")", 1)[1].split()[0]


def start_holder(exe, segment, lock):
    p = subprocess.Popen([exe, segment, lock], stdout=subprocess.PIPE, text=True)
    line = p.stdout.readline().split()
    assert line[:1] == ["stopping"], line
    end = time.monotonic() + 10
    while state_of(p.pid) != "T":
        assert time.monotonic() < end, "lock_holder did not stop"
        time.sleep(0.01)
    return p


def mutation(lock, rank):
    """A mutating request that needs lock (None: a registration, which does not)."""
    if lock == "rooms":
        return "PUT", "/rooms/4242/failure", json.dumps({"rank": 0, "reason": "probe", "code": 1})
    return "PUT", loadlib.REGISTER, loadlib.reg_body(rank, "10.2.0.1:%d" % (17000 + rank),
                                                     loadlib.weights(4, rank))


def run_lock(d, holder_exe, lock, results):
    port = d.port
    holder = start_holder(holder_exe, d.segment, lock)
    needs = lock in ("ranks", "rooms")
    answers, errors = [], []

    def mutate(i):
        try:
            m, path, body = mutation(lock, 100 + i)
            answers.append(request(port, m, path, body, timeout=WRITE_TIMEOUT_S))
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(repr(e))

    try:
        writers = [threading.Thread(target=mutate, args=(i,)) for i in range(2)]
        for t in writers:
            t.start()
        time.sleep(0.05)  # the writers are waiting for the lock now (when they need it)
        lat = {"/health": [], "lookup": [], "/ranks": [], "/metrics": []}
        targets = {"/health": "/health", "lookup": loadlib.LOOKUP + "?rank=0", "/ranks": "/ranks",
                   "/metrics": "/metrics"}
        end = time.monotonic() + LOCK_TIMEOUT_MS / 1000.0 * 0.8
        while time.monotonic() < end:
            for name, target in targets.items():
                status, data, _, secs = request(port, "GET", target)
                assert status == 200, (lock, name, status, data[:300])
                lat[name].append(secs * 1000)
        for t in writers:
            t.join(WRITE_TIMEOUT_S + 5)
        assert not errors, errors
        for status, data, hdr, secs in answers:
            if needs:
                detail = json.loads(data).get("detail", "")
                assert status == 503, (lock, status, data[:300])
                assert hdr.get("retry-after") == "1", hdr
                # "rooms" is the lock of room 4242's stripe: "rooms.N lock".
                named = re.search(r"\b%s(\.\d+)? lock" % lock, detail)
                assert named and ("pid %d" % holder.pid) in detail, detail
            else:
                assert status == 200, (lock, status, data[:300])
        summary = ", ".join("%s %d answers p50 %.2f ms max %.2f ms" % (
            k, len(v), loadlib.percentile(v, 50), max(v)) for k, v in lat.items())
        mut = ", ".join("%d in %.0f ms" % (a[0], a[3] * 1000) for a in answers)
        detail = json.loads(answers[0][1]).get("detail", "") if needs else ""
        results.append("%s lock held by stopped pid %d: %s; 2 concurrent mutating requests: %s%s"
                       % (lock, holder.pid, summary, mut,
                          (" (detail: \"%s\")" % detail) if detail else ""))
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    # The holder is dead: its lock is recovered by the next locker.
    m, path, body = mutation(lock, 200)
    deadline = time.monotonic() + 30
    while True:
        status, data, _, _ = request(port, m, path, body, timeout=WRITE_TIMEOUT_S)
        if status in (200, 404) or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    # PUT /rooms/4242/failure: 200 (a failure may be recorded before the room is
    # opened) or 404; registrations: 200.
    assert status in ((200, 404) if lock == "rooms" else (200,)), (lock, status, data[:300])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--daemon", required=True)
    ap.add_argument("--holder", required=True)
    ap.add_argument("--locks", default="ranks,rooms,procs")
    args = ap.parse_args()
    seg = "kvctest-stopped-%d" % os.getpid()
    d = loadlib.Daemon(args.daemon, seg, ["--lock-timeout", str(LOCK_TIMEOUT_MS),
                                          "--max-rooms", "1024"])
    d.start()
    results = []
    try:
        status, data, _, _ = request(d.port, "PUT", loadlib.REGISTER,
                                     loadlib.reg_body(0, "10.2.0.1:16000", loadlib.weights(8, 0)))
        assert status == 200, data
        for lock in args.locks.split(","):
            run_lock(d, args.holder, lock, results)
        assert d.alive(), d.log_tail()
    finally:
        rc = d.stop()
        d.unlink_segment()
    for line in results:
        print(line)
    assert rc == 0, (rc, d.log_tail())
    print("%d passed, 0 failed" % len(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
