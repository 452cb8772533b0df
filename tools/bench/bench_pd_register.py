#!/usr/bin/python3
"""PUT /route against POST /register_dp_rank on one kvcoordd, with and
without the registrant cache (peer_recent.c), with and without N extra idle
processes on the host, in the same run: req/s of each, and the ratios.

Each request is one new loopback connection (as sglang's requests.put /
requests.post send them), one sendall, read to the close.  PUT /route costs
what register_dp_rank costs plus finding the registering process (the
/proc owner scan); the cache makes that independent of the process count.

Usage: bench_pd_register.py --daemon build/kvcoordd [--procs 1000] [--secs 3]
                            [--rounds 3]
Figures are printed with `uptime`'s load, never judged.
"""

import argparse
import json
import os
import re
import signal
import socket
import subprocess
import tempfile
import time

REG = {"attn_tp_size": 1, "attn_tp_rank": 0, "attn_cp_size": 1, "attn_cp_rank": 0,
       "attn_dp_size": 1, "attn_dp_rank": 0, "pp_size": 1, "pp_rank": 0, "system_dp_size": 1,
       "system_dp_rank": 0, "rank_ip": "10.0.0.1", "rank_port": 17000, "page_size": 64,
       "kv_cache_dtype": "auto"}


def start(daemon, segment, cache):
    env = dict(os.environ)
    if not cache:
        env["KVCOORD_BENCH_NO_PEER_RECENT"] = "1"
    log = tempfile.NamedTemporaryFile(prefix="kvcoordd-bench-", delete=False)
    p = subprocess.Popen([daemon, "--listen", "127.0.0.1:0", "--segment", segment, "--fresh",
                          "--log-level", "warn"], stdout=log, stderr=subprocess.STDOUT, env=env)
    end = time.monotonic() + 30
    while time.monotonic() < end:
        # the listening line is logged at info: find the port from /proc instead
        try:
            out = subprocess.run(["ss", "-Hltnp"], capture_output=True, text=True).stdout
        except FileNotFoundError:
            out = ""
        m = re.search(r"127\.0\.0\.1:(\d+)\s.*pid=%d," % p.pid, out)
        if m:
            return p, int(m.group(1)), log.name
        time.sleep(0.05)
    raise SystemExit("kvcoordd did not start")


def one(port, raw):
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(raw)
    while s.recv(65536):
        pass
    s.close()


def rate(port, method, path, body, secs):
    b = json.dumps(body).encode()
    raw = ("%s %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
           "Content-Length: %d\r\nConnection: close\r\n\r\n" % (method, path, len(b))).encode() + b
    n, t0 = 0, time.monotonic()
    while time.monotonic() - t0 < secs:
        one(port, raw)
        n += 1
    return n / (time.monotonic() - t0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--daemon", required=True)
    ap.add_argument("--procs", type=int, default=1000)
    ap.add_argument("--secs", type=float, default=3.0)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    print("load before: %s" % open("/proc/loadavg").read().strip())
    idle = []
    results = {}
    try:
        for extra in (0, a.procs):
            if extra and not idle:
                # Idle processes that are not this client's descendants (a
                # registrant's own children are looked at): started by a
                # detached shell, their pids written to a file.
                pidfile = tempfile.NamedTemporaryFile(prefix="bench-idle-", delete=False).name
                subprocess.run(["setsid", "-f", "sh", "-c",
                                "for i in $(seq %d); do sleep 3600 & echo $! >> %s; done"
                                % (extra, pidfile)], check=True)
                end = time.monotonic() + 60
                while time.monotonic() < end:
                    with open(pidfile) as f:
                        idle = [int(x) for x in f.read().split()]
                    if len(idle) >= extra:
                        break
                    time.sleep(0.1)
                os.unlink(pidfile)
            nproc = len([d for d in os.listdir("/proc") if d.isdigit()])
            for cache in (False, True):
                seg = "kvcbench-pdreg-%d" % os.getpid()
                p, port, logname = start(a.daemon, seg, cache)
                try:
                    put, dp = [], []
                    for _ in range(a.rounds):
                        put.append(rate(port, "PUT", "/route", REG, a.secs))
                        dp.append(rate(port, "POST", "/register_dp_rank",
                                       {"bootstrap_room": 1, "dp_rank": 0}, a.secs))
                    put.sort()
                    dp.sort()
                    pm, dm = put[len(put) // 2], dp[len(dp) // 2]
                    results[(extra, cache)] = pm
                    print("%5d processes on the host, cache %-3s: PUT /route %7.0f req/s, "
                          "register_dp_rank %7.0f req/s, ratio %.2f (medians of %d x %.0f s)"
                          % (nproc, "on" if cache else "off", pm, dm, dm / pm, a.rounds,
                             a.secs))
                finally:
                    p.send_signal(signal.SIGTERM)
                    p.wait(30)
                    os.unlink(logname)
                    try:
                        os.unlink("/dev/shm/" + seg)
                    except FileNotFoundError:
                        pass
    finally:
        for q in idle:
            try:
                os.kill(q, signal.SIGKILL)
            except ProcessLookupError:
                pass
    for extra in (0, a.procs):
        print("+%d processes: PUT /route with the cache / without: %.2fx" % (
            extra, results[(extra, True)] / results[(extra, False)]))
    print("load after: %s" % open("/proc/loadavg").read().strip())


if __name__ == "__main__":
    main()
