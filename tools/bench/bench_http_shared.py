#!/usr/bin/python3
"""Heavy answers under load: wrk against GET /metrics, GET /failures
(300 records, ~180 KB) and GET /route (PD) on two kvcoordd binaries side
by side in the same run (--old: the baseline, --new: the candidate),
alternating old/new for each route and run.  Prints requests/s of each and
the new/old ratio per route, with `uptime` before and after.

Usage: bench_http_shared.py --old PATH --new PATH [--runs 3] [--seconds 5]
       [--conns 64]
"""

import argparse
import json
import os
import re
import socket
import subprocess
import tempfile
import time

REG = {"attn_tp_size": 1, "attn_tp_rank": 0, "attn_cp_size": 1, "attn_cp_rank": 0,
       "attn_dp_size": 1, "attn_dp_rank": 0, "pp_size": 1, "pp_rank": 0, "system_dp_size": 1,
       "system_dp_rank": 0, "rank_ip": "10.0.0.1", "rank_port": 17000, "page_size": 64,
       "kv_cache_dtype": "auto"}

ROUTES = ["/metrics", "/failures?limit=1024",
          "/route?prefill_dp_rank=0&prefill_cp_rank=0&target_tp_rank=0&target_pp_rank=0"]


def start(daemon, segment):
    log = tempfile.NamedTemporaryFile(prefix="kvcoordd-bench-", delete=False)
    p = subprocess.Popen([daemon, "--listen", "127.0.0.1:0", "--segment", segment, "--fresh"], stdout=log, stderr=subprocess.STDOUT)
    end = time.monotonic() + 30
    while time.monotonic() < end:
        with open(log.name) as f:
            m = re.search(r"listening addr=127\.0\.0\.1:(\d+)", f.read())
        if m:
            return p, int(m.group(1)), log.name
        time.sleep(0.05)
    raise SystemExit("kvcoordd did not start")


def request(port, method, path, body=b""):
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(b"%s %s HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s"
              % (method, path, len(body), body))
    data = b""
    while True:
        c = s.recv(65536)
        if not c:
            break
        data += c
    s.close()
    return int(data.split()[1])


def seed(port):
    assert request(port, b"PUT", b"/route", json.dumps(REG).encode()) == 200
    for room in range(1, 301):
        body = ('{"rank":0,"reason":"%s","code":5}' % ("r%d " % room * 40)[:250]).encode()
        assert request(port, b"PUT", b"/rooms/%d/failure" % room, body) == 200


def wrk(port, path, seconds, conns):
    out = subprocess.run(["wrk", "-t2", "-c%d" % conns, "-d%ds" % seconds,
                          "http://127.0.0.1:%d%s" % (port, path)],
                         capture_output=True, text=True).stdout
    m = re.search(r"Requests/sec:\s+([\d.]+)", out)
    bad = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    if bad:
        raise SystemExit("non-2xx answers on %s:\n%s" % (path, out))
    return float(m.group(1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--old", required=True)
    ap.add_argument("--new", required=True)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--seconds", type=int, default=5)
    ap.add_argument("--conns", type=int, default=64)
    a = ap.parse_args()
    print("uptime before:", subprocess.run(["uptime"], capture_output=True, text=True).stdout
          .strip())
    daemons = {}
    for name, path in (("old", a.old), ("new", a.new)):
        p, port, log = start(path, "kvc-bench-shared-%s-%d" % (name, os.getpid()))
        seed(port)
        daemons[name] = (p, port, log)
    try:
        for route in ROUTES:
            res = {"old": [], "new": []}
            for _ in range(a.runs):
                for name in ("old", "new"):
                    res[name].append(wrk(daemons[name][1], route, a.seconds, a.conns))
            o, n = max(res["old"]), max(res["new"])
            print("%-24s old %s  new %s  req/s; best new/old %.2fx" % (
                route.split("&")[0], " ".join("%.0f" % x for x in res["old"]),
                " ".join("%.0f" % x for x in res["new"]), n / o))
    finally:
        for name, (p, port, log) in daemons.items():
            p.terminate()
            p.wait()
            os.unlink(log)
            try:
                os.unlink("/dev/shm/kvc-bench-shared-%s-%d" % (name, os.getpid()))
            except FileNotFoundError:
                pass
    print("uptime after:", subprocess.run(["uptime"], capture_output=True, text=True).stdout
          .strip())


if __name__ == "__main__":
    main()
