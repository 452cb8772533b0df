#!/usr/bin/python3
"""register_client.py - times PUT /register_transfer_engine_info as sglang's
workers send it (Python `requests`, a new connection for every request)
against several servers, alternating, in one run.

Usage: register_client.py --body FILE --name NAME=URL [--name NAME=URL ...]
                          [--floor NAME=URL] [--rounds R] [--reps N]
                          [--client requests|raw] [--json]

Each repetition registers new content (the session_id's port changes, so no
server can answer from an identical earlier registration) and checks the
answer is 200 "OK".  Per round and server: the median of N PUTs; printed:
each round's medians, the median over rounds, and the ratio of every other
server's median to the first server's (a ratio > 1: the first is faster).

--floor names a server that does nothing (bench_register.sh: nginx's
`return 200 "OK"`), timed with the same client in the same rounds: what is
left of a server's time once the floor is taken off (its median minus the
floor's, and per round its round median minus that round's floor) is the
server's own share; the shares' ratio is printed too.
Figures are printed, never judged.
"""
import argparse
import json
import re
import socket
import statistics
import sys
import time
from urllib.parse import urlsplit

import requests


def bodies(path, reps):
    raw = open(path, "rb").read()
    m = re.search(rb'"session_id":\s*"([^"]*):(\d+)"', raw)
    if not m:
        sys.exit("register_client.py: no session_id \"host:port\" in %s" % path)
    out = []
    for i in range(reps):
        port = b"%d" % (20000 + i)
        out.append(raw[:m.start(2)] + port + raw[m.end(2):])
    return out


def put_requests(url, body):
    r = requests.put(url + "/register_transfer_engine_info", data=body,
                     headers={"Content-Type": "application/json"})
    return r.status_code, r.content


def put_raw(url, body):
    """The same request from a minimal client: one connect, one sendall of
    head and body, read to the end (Connection: close): what is left is
    the server's own time (and the kernel's)."""
    u = urlsplit(url)
    s = socket.create_connection((u.hostname, u.port))
    try:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        s.sendall(b"PUT /register_transfer_engine_info HTTP/1.1\r\nHost: %s\r\n"
                  b"Content-Type: application/json\r\nContent-Length: %d\r\n"
                  b"Connection: close\r\n\r\n" % (u.netloc.encode(), len(body)) + body)
        data = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    finally:
        s.close()
    head, _, answer = data.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1]) if head.startswith(b"HTTP/1.") else 0
    return status, answer


def one_round(url, payloads, put):
    times = []
    for body in payloads:
        t0 = time.perf_counter()
        status, answer = put(url, body)
        t1 = time.perf_counter()
        if status != 200 or answer != b"OK":
            sys.exit("register_client.py: %s answered %d: %.200r" % (url, status, answer))
        times.append((t1 - t0) * 1e3)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--body", required=True)
    ap.add_argument("--name", action="append", required=True, help="NAME=URL")
    ap.add_argument("--floor", metavar="NAME=URL",
                    help="a server that answers 200 OK doing nothing: the client's own floor")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--client", choices=("requests", "raw"), default="requests",
                    help="requests (default), or raw: a minimal socket client, to see the"
                         " servers' own time without the ~0.6 ms requests spends per call")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    put = put_requests if a.client == "requests" else put_raw
    servers = [n.split("=", 1) for n in a.name]
    floor = a.floor.split("=", 1) if a.floor else None
    timed = servers + ([floor] if floor else [])
    payloads = bodies(a.body, a.reps)
    for _, url in timed:  # warm-up (first connection, imports, page faults)
        one_round(url, payloads[:2], put)
    per = {n: [] for n, _ in timed}
    for r in range(a.rounds):
        order = timed if r % 2 == 0 else timed[::-1]
        for name, url in order:
            per[name].append(one_round(url, payloads, put))
    med = {n: statistics.median(v) for n, v in per.items()}
    first = servers[0][0]
    share, share_rounds = {}, {}
    if floor:
        fname = floor[0]
        for name, _ in servers:
            share[name] = med[name] - med[fname]
            share_rounds[name] = [v - f for v, f in zip(per[name], per[fname])]
    if a.json:
        out = {"bytes": len(payloads[0]), "client": a.client, "reps": a.reps,
               "rounds": per, "median_ms": med,
               "ratio": {n: med[n] / med[first] for n, _ in servers if n != first}}
        if floor:
            out["floor"] = floor[0]
            out["share_ms"] = share
            out["share_rounds_ms"] = share_rounds
            out["share_ratio"] = {n: share[n] / share[first] for n, _ in servers
                                  if n != first and share[first] > 0}
        print(json.dumps(out))
        return
    print("PUT of %d bytes, %s client, new connection each; %d rounds of %d PUTs"
          " (ms, median per round)" % (len(payloads[0]), a.client, a.rounds, a.reps))
    for name, _ in timed:
        print("  %-10s %s  median %.3f ms%s" % (name, " ".join("%.3f" % v for v in per[name]),
                                               med[name],
                                               " (floor: does nothing)" if floor and
                                               name == floor[0] else ""))
    for name, _ in servers[1:]:
        print("  ratio %s/%s: %.2fx (%s %s)" % (name, first, med[name] / med[first], first,
                                               "faster" if med[name] > med[first] else "slower"))
    if not floor:
        return
    print("  server's own share (its time minus the floor's %.3f ms; per round: that round's"
          " floor):" % med[floor[0]])
    for name, _ in servers:
        print("  %-10s %s  median-of-medians share %.3f ms (median of rounds %.3f ms)" % (
            name, " ".join("%.3f" % v for v in share_rounds[name]), share[name],
            statistics.median(share_rounds[name])))
    for name, _ in servers[1:]:
        if share[first] > 0:
            print("  share ratio %s/%s: %.2fx (per-round shares: %.2fx)" % (
                name, first, share[name] / share[first],
                statistics.median(share_rounds[name]) / statistics.median(share_rounds[first])
                if statistics.median(share_rounds[first]) > 0 else float("nan")))
        else:
            print("  share ratio %s/%s: n/a (%s's share is not above the floor)" % (
                name, first, first))


if __name__ == "__main__":
    main()
