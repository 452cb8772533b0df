#!/usr/bin/python3
"""burst_client.py - latency of an established keep-alive connection while
other connections are opened at once (a burst) or keep opening and trickle
(slow peers), against several servers in one run, alternating.

Usage: burst_client.py --name NAME=HOST:PORT [--name ...] [--path P]
                       [--burst N] [--rounds R] [--trickle N] [--json]
       burst_client.py --first --name NAME=HOST:PORT [--name ...] [--burst N]
       burst_client.py --summary FILE

Per round and server, on one established connection (GET PATH, keep-alive):
  idle     for about 1 s, nothing else happening, a request every ms (as
           in trickle, so that both phases are paced alike): p50 and p99;
  burst    N sockets connect at once (non-blocking, as fast as the client
           can), then at once the next request on the established connection:
           its latency ("next"), and the worst of the 20 requests after it;
           the N sockets stay open and idle until the round ends;
  trickle  for about 1 s, another process keeps opening connections (up to
           --trickle of them) and feeds each a request header one byte every
           50 ms (slow peers: other clients, so they never hold this
           process's GIL), while the established connection is timed as in
           idle: p50 and p99.
A first round per server is run and not counted (warm-up).  The trickle
p99 is also printed against the same server's idle p99.

--first: the first burst of a server just started (the caller starts each
server afresh before the call): N sockets connect at once, then a new
connection sends GET PATH; its latency (connect to answer) is printed as a
JSON line {NAME: us, ...}.  --summary FILE: medians of such lines (one per
round) and each server's ratio to the last one named.
Printed: medians over rounds per server, and each server's figures against
the last one named (the baseline).  Figures are printed, never judged.
"""
import argparse
import json
import multiprocessing
import resource
import socket
import statistics
import time


def pct(v, p):
    v = sorted(v)
    return v[min(len(v) - 1, int(round(p / 100.0 * (len(v) - 1))))]


class Conn:
    def __init__(self, addr, path):
        self.s = socket.create_connection(addr)
        self.s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.req = ("GET %s HTTP/1.1\r\nHost: bench\r\n\r\n" % path).encode()
        self.buf = b""

    def one(self):
        """One request; returns its latency in microseconds."""
        t0 = time.perf_counter()
        self.s.sendall(self.req)
        while True:
            end = self.buf.find(b"\r\n\r\n")
            if end >= 0:
                head = self.buf[:end].decode("latin-1").lower()
                n = 0
                for line in head.split("\r\n"):
                    if line.startswith("content-length:"):
                        n = int(line.split(":", 1)[1])
                if len(self.buf) >= end + 4 + n:
                    if not head.startswith("http/1.1 200"):
                        raise SystemExit("burst_client.py: answer %r" % head[:80])
                    self.buf = self.buf[end + 4 + n:]
                    return (time.perf_counter() - t0) * 1e6
            chunk = self.s.recv(1 << 20)
            if not chunk:
                raise SystemExit("burst_client.py: the server closed the established connection")
            self.buf += chunk

    def close(self):
        self.s.close()


def burst(addr, n):
    socks = []
    for _ in range(n):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setblocking(False)
        s.connect_ex(addr)
        socks.append(s)
    return socks


def trickler(addr, limit, stop):
    """Open connections one after another (up to limit), each fed a header
    byte every 50 ms by this process, until stop is set; then close them."""
    head = b"GET /health HTTP/1.1\r\nHost: slow\r\nX-Pad: " + b"x" * 200
    socks, pos = [], []
    next_tick = time.perf_counter()
    while not stop.is_set():
        now = time.perf_counter()
        if len(socks) < limit:
            for _ in range(10):  # about 200 new connections a second
                s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                s.setblocking(False)
                s.connect_ex(addr)
                socks.append(s)
                pos.append(0)
        if now >= next_tick:
            for i, s in enumerate(socks):
                if pos[i] < len(head):
                    try:
                        s.send(head[pos[i]:pos[i] + 1])
                        pos[i] += 1
                    except OSError:
                        pass
            next_tick = now + 0.05
        time.sleep(0.05)
    for s in socks:
        s.close()


def first_burst(addr, path, n_burst):
    """Latency (us) of GET path on a new connection opened right after a
    burst of n_burst connections."""
    socks = burst(addr, n_burst)
    t0 = time.perf_counter()
    c = Conn(addr, path)
    c.one()
    us = (time.perf_counter() - t0) * 1e6
    c.close()
    for s in socks:
        s.close()
    return us


def summary(path):
    rows = [json.loads(line) for line in open(path) if line.strip()]
    names = [n for n in rows[0] if not n.startswith("_")]
    med = {n: statistics.median(r[n] for r in rows) for n in names}
    print("first burst on a fresh server: new connection's GET after the burst, %d rounds "
          "(us; median, then per round, * = measured first in its round)" % len(rows))
    for n in names:
        print("  %-10s %9.0f   %s" % (n, med[n], " ".join(
            "%.0f%s" % (r[n], "*" if r.get("_first") == n else "") for r in rows)))
    base = names[-1]
    for n in names[:-1]:
        print("  ratio %s/%s: %.2fx (median of the rounds' ratios %.2fx)" % (
            n, base, med[n] / med[base], statistics.median(r[n] / r[base] for r in rows)))
        # The server measured first in a round pays a cost of the client's
        # (about 2 ms here, whichever server it is): compare like with like.
        for first in (True, False):
            a = [r[n] for r in rows if (r.get("_first") == n) == first]
            b = [r[base] for r in rows if (r.get("_first") == base) == first]
            if a and b:
                print("    measured %s in the round: %s %.0f, %s %.0f: %.2fx" % (
                    "first" if first else "second", n, statistics.median(a), base,
                    statistics.median(b), statistics.median(a) / statistics.median(b)))


def paced(c, seconds):
    """Requests on c, one every ms or so, for about seconds: their latencies."""
    out = []
    t_end = time.perf_counter() + seconds
    while time.perf_counter() < t_end:
        out.append(c.one())
        time.sleep(0.001)
    return out


def one_round(addr, path, n_burst, n_trickle):
    c = Conn(addr, path)
    for _ in range(50):
        c.one()
    idle = paced(c, 1.0)
    socks = burst(addr, n_burst)
    nxt = c.one()
    after = [c.one() for _ in range(20)]
    for s in socks:
        s.close()
    time.sleep(0.3)
    stop = multiprocessing.Event()
    t = multiprocessing.Process(target=trickler, args=(addr, n_trickle, stop))
    t.start()
    trick = paced(c, 1.0)
    stop.set()
    t.join()
    c.close()
    time.sleep(0.3)
    return {"idle_p50": pct(idle, 50), "idle_p99": pct(idle, 99), "next": nxt,
            "after_max": max(after), "trickle_p50": pct(trick, 50),
            "trickle_p99": pct(trick, 99), "trickle_n": len(trick)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--name", action="append", default=[], help="NAME=HOST:PORT")
    ap.add_argument("--path", default="/health")
    ap.add_argument("--burst", type=int, default=1000)
    ap.add_argument("--trickle", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--first", action="store_true")
    ap.add_argument("--summary")
    a = ap.parse_args()
    if a.summary:
        summary(a.summary)
        return
    if not a.name:
        ap.error("at least one --name NAME=HOST:PORT is needed")
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = a.burst + a.trickle + 64
    if soft < need:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(need, soft)), hard))
    servers = []
    for n in a.name:
        name, hp = n.split("=", 1)
        host, port = hp.rsplit(":", 1)
        servers.append((name, (host, int(port))))
    if a.first:
        # The client's own first burst (its descriptor table, its sockets)
        # goes to a listener of its own, so neither server pays for it.
        own = socket.socket()
        own.bind(("127.0.0.1", 0))
        own.listen(a.burst + 64)
        for s in burst(own.getsockname(), a.burst):
            s.close()
        own.close()
        row = {name: first_burst(addr, a.path, a.burst) for name, addr in servers}
        row["_first"] = servers[0][0]
        print(json.dumps(row))
        return
    for _, addr in servers:  # warm-up round, not counted (first sockets, caches)
        one_round(addr, a.path, a.burst, a.trickle)
    per = {n: [] for n, _ in servers}
    for r in range(a.rounds):
        for name, addr in (servers if r % 2 == 0 else servers[::-1]):
            per[name].append(one_round(addr, a.path, a.burst, a.trickle))
    keys = ("idle_p50", "idle_p99", "next", "after_max", "trickle_p50", "trickle_p99")
    med = {n: {k: statistics.median(x[k] for x in v) for k in keys} for n, v in per.items()}
    if a.json:
        print(json.dumps({"rounds": per, "median": med}))
        return
    print("GET %s on one established connection; burst of %d connections; trickle of up to %d"
          " slow peers; %d rounds (us, medians over rounds)" % (a.path, a.burst, a.trickle,
                                                                 a.rounds))
    print("  %-10s %9s %9s %11s %11s %12s %12s" % ("server", "idle p50", "idle p99",
                                                   "next after", "worst of 20", "trickle p50",
                                                   "trickle p99"))
    for name, _ in servers:
        m = med[name]
        print("  %-10s %9.0f %9.0f %11.0f %11.0f %12.0f %12.0f" % ((name,) + tuple(m[k]
                                                                    for k in keys)))
        print("  %-10s %s" % ("", "next per round: " + " ".join("%.0f" % x["next"]
                                                             for x in per[name])))
    base = servers[-1][0]
    for name, _ in servers[:-1]:
        print("  ratio %s/%s: next after burst %.2fx, trickle p99 %.2fx (below 1: %s better)" % (
            name, base, med[name]["next"] / med[base]["next"],
            med[name]["trickle_p99"] / med[base]["trickle_p99"], name))
    for name, _ in servers:
        rr = [x["trickle_p99"] / x["idle_p99"] for x in per[name]]
        print("  %s: trickle p99 / idle p99 %.2fx (the rounds' ratios: median %.2fx, worst %.2fx)"
              % (name, med[name]["trickle_p99"] / med[name]["idle_p99"], statistics.median(rr),
                 max(rr)))


if __name__ == "__main__":
    main()
