#!/usr/bin/python3
"""test_load.py - kvcoordd under load and slow clients (label "load").

  --case wrk        wrk at --connections (1000) connections for --seconds on
                    the lookup route, after a short warm-up round: the daemon
                    keeps answering (a monitor's /health on fresh connections
                    is 200 throughout and after), wrk reports no read, write or
                    timeout errors and no non-2xx answers (connect errors are
                    wrk's own limits and are only printed); fds return to
                    their baseline; RSS after the load stays within a generous
                    bound of RSS after the warm-up (allocators keep memory).
  --case slowloris  --slow (500) connections trickle a request head byte by
                    byte (reconnecting when closed, as an attacker does) while
                    normal clients (wrk, 16 keep-alive connections) are served;
                    every slow connection is closed by the daemon's header
                    timeout (--header-timeout 2 here) before its head ends;
                    prints the normal clients' p50/p99 without and with the
                    slow clients; no errors; fds back to baseline.
  --case conncap    --max-conns 32: 32 clients each sending a body (busy, so
                    never closed to make room), 40 more are answered 503 and
                    closed, the 32 are then answered on the same connections;
                    fds back to baseline.

Prints figures (requests, p50/p99, fds and RSS before/after); asserts no
wall-clock time.  Usage: test_load.py --daemon build/kvcoordd --case CASE
"""
import argparse
import errno
import os
import selectors
import socket
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import loadlib  # noqa: E402

ARGS = None


def setup_daemon(extra_args=()):
    seg = "kvctest-load-%s-%d" % (ARGS.case, os.getpid())
    d = loadlib.Daemon(ARGS.daemon, seg, extra_args).start(fresh=True)
    st, body, _ = loadlib.get(d.port, loadlib.REGISTER, method="PUT",
                              body=loadlib.reg_body(0, "10.0.0.1:16051", loadlib.weights(64)))
    assert st == 200, body
    st, _, _ = loadlib.get(d.port, loadlib.LOOKUP + "?rank=0")
    assert st == 200
    time.sleep(0.3)  # the connections above close asynchronously
    return d


def lookup_url(d):
    return "http://127.0.0.1:%d%s?rank=0" % (d.port, loadlib.LOOKUP)


def print_wrk(tag, r):
    print("%-28s requests=%d rps=%.0f p50=%.2fms p99=%.2fms non2xx=%d errors: connect=%d "
          "read=%d write=%d timeout=%d" % (tag, r["requests"], r["rps"], r["p50_ms"], r["p99_ms"],
                                           r["non2xx"], r["connect"], r["read"], r["write"],
                                           r["timeout"]))


def check_wrk(tag, r):
    assert r["requests"] > 0, "%s: no request answered\n%s" % (tag, r["raw"])
    for k in ("non2xx", "read", "write", "timeout"):
        assert r[k] == 0, "%s: wrk reports %s=%d\n%s" % (tag, k, r[k], r["raw"])


class HealthMonitor(threading.Thread):
    """GET /health on a fresh connection every 100 ms; records failures."""

    def __init__(self, port):
        super().__init__(daemon=True)
        self.port = port
        self.stop = threading.Event()
        self.ok = 0
        self.failures = []

    def run(self):
        while not self.stop.is_set():
            try:
                st, _, _ = loadlib.get(self.port, "/health", timeout=10)
                if st == 200:
                    self.ok += 1
                else:
                    self.failures.append("status %d" % st)
            except OSError as e:
                self.failures.append(repr(e))
            self.stop.wait(0.1)


def report_mem(tag, d):
    fds, rss = d.fds(), d.rss_kb()
    print("%-28s fds=%d rss=%d KiB" % (tag, fds, rss))
    return fds, rss


# ---- wrk at 1000 connections ------------------------------------------------

def case_wrk():
    d = setup_daemon()
    try:
        fds0, rss0 = report_mem("before load", d)
        r = loadlib.wrk(lookup_url(d), ARGS.connections, max(2, ARGS.seconds // 3))
        print_wrk("warm-up (%d conns)" % ARGS.connections, r)
        check_wrk("warm-up", r)
        d.wait_fds(fds0)
        fds1, rss1 = report_mem("after warm-up", d)
        mon = HealthMonitor(d.port)
        mon.start()
        r = loadlib.wrk(lookup_url(d), ARGS.connections, ARGS.seconds)
        mon.stop.set()
        mon.join()
        print_wrk("load (%d conns)" % ARGS.connections, r)
        print("health monitor during load: %d x 200, %d failures %s"
              % (mon.ok, len(mon.failures), mon.failures[:3]))
        check_wrk("load", r)
        assert not mon.failures, "/health failed during load: %s" % mon.failures[:5]
        assert mon.ok > 0
        st, _, _ = loadlib.get(d.port, "/health")
        assert st == 200, "/health after load: %d" % st
        fds2 = d.wait_fds(fds0)
        _, rss2 = report_mem("after load", d)
        print("drift: fds %+d, rss %+d KiB vs before, %+d KiB vs after warm-up"
              % (fds2 - fds0, rss2 - rss0, rss2 - rss1))
        assert fds2 == fds0, "fds after load %d, baseline %d" % (fds2, fds0)
        assert rss2 - rss1 < 128 * 1024, "RSS grew %d KiB after the warm-up round" % (rss2 - rss1)
        assert d.stop() == 0
    finally:
        if d.alive():
            d.sigkill()
        d.unlink_segment()


# ---- slowloris ----------------------------------------------------------------

SLOW_HEAD = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: "


def slow_child(port, n, seconds):
    """Keep n connections trickling a head (one byte per socket per tick),
    reopening each one the server closes; prints its tallies as key=value."""
    sel = selectors.DefaultSelector()
    conns = {}  # sock -> [bytes sent, opened at]
    opened = closed_by_server = connect_fail = 0
    lifetimes = []
    end = time.monotonic() + seconds

    def open_one():
        nonlocal opened, connect_fail
        s = socket.socket()
        s.setblocking(False)
        try:
            s.connect(("127.0.0.1", port))
        except BlockingIOError:
            pass
        except OSError:
            connect_fail += 1
            s.close()
            return
        conns[s] = [0, time.monotonic()]
        sel.register(s, selectors.EVENT_READ)
        opened += 1

    def drop(s, by_server):
        nonlocal closed_by_server
        st = conns.pop(s)
        sel.unregister(s)
        s.close()
        if by_server:
            closed_by_server += 1
            lifetimes.append(time.monotonic() - st[1])

    for _ in range(n):
        open_one()
    print("connected %d" % len(conns), flush=True)
    while time.monotonic() < end:
        for key, _ in sel.select(timeout=0.05):
            s = key.fileobj
            try:
                data = s.recv(4096)
            except OSError:
                data = b""
            if not data:
                drop(s, True)
        for s, st in list(conns.items()):
            b = SLOW_HEAD[st[0]:st[0] + 1] if st[0] < len(SLOW_HEAD) else b"a"
            try:
                s.send(b)
                st[0] += 1
            except BlockingIOError:
                pass
            except OSError as e:
                if e.errno in (errno.ENOTCONN,):  # still connecting
                    continue
                drop(s, True)
        while len(conns) < n and time.monotonic() < end:
            open_one()
        time.sleep(0.1)
    still = len(conns)
    for s in list(conns):
        drop(s, False)
    lifetimes.sort()
    print("opened=%d closed_by_server=%d still_open_at_end=%d connect_fail=%d "
          "lifetime_median_s=%.2f lifetime_max_s=%.2f"
          % (opened, closed_by_server, still, connect_fail,
             lifetimes[len(lifetimes) // 2] if lifetimes else -1,
             lifetimes[-1] if lifetimes else -1), flush=True)


def case_slowloris():
    timeout = 2
    d = setup_daemon(["--header-timeout", str(timeout)])
    child = None
    try:
        fds0, _ = report_mem("before load", d)
        normal = max(3, ARGS.seconds // 2)
        a = loadlib.wrk(lookup_url(d), 16, normal, threads=1)
        print_wrk("normal clients alone", a)
        check_wrk("alone", a)
        slow_for = normal + 3 * timeout + 4
        child = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--slow-child",
                                  "--port", str(d.port), "--slow", str(ARGS.slow),
                                  "--seconds", str(slow_for)],
                                 stdout=subprocess.PIPE, text=True)
        line = child.stdout.readline()
        assert line.startswith("connected"), line
        print("slow clients: %s" % line.strip())
        time.sleep(1)  # every slow connection has sent bytes of its head
        fds_mid = d.fds()
        b = loadlib.wrk(lookup_url(d), 16, normal, threads=1)
        print_wrk("normal clients + %d slow" % ARGS.slow, b)
        st, _, _ = loadlib.get(d.port, "/health")
        out, _ = child.communicate(timeout=slow_for + 60)
        print("slow clients: %s" % out.strip())
        print("daemon fds while %d slow clients trickled: %d" % (ARGS.slow, fds_mid))
        print("p99 of normal clients: %.2f ms alone, %.2f ms with %d slow clients "
              "(p50 %.2f / %.2f ms)" % (a["p99_ms"], b["p99_ms"], ARGS.slow, a["p50_ms"],
                                        b["p50_ms"]))
        check_wrk("with slow clients", b)
        assert st == 200, "/health during slowloris: %d" % st
        tallies = dict(kv.split("=") for kv in out.split())
        assert child.returncode == 0
        assert int(tallies["closed_by_server"]) >= ARGS.slow, \
            "only %s of the first %d slow connections were closed by the daemon" \
            % (tallies["closed_by_server"], ARGS.slow)
        fds1 = d.wait_fds(fds0)
        report_mem("after load", d)
        assert fds1 == fds0, "fds after %d, baseline %d" % (fds1, fds0)
        assert d.stop() == 0
    finally:
        if child and child.poll() is None:
            child.kill()
        if d.alive():
            d.sigkill()
        d.unlink_segment()


# ---- connection cap ----------------------------------------------------------

def read_response(s):
    """Read one response from a blocking socket: (status, body), or (None, b'')
    at EOF before any byte."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = s.recv(65536)
        if not chunk:
            if not data:
                return None, b""
            raise AssertionError("EOF inside a response head: %r" % data[:200])
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    clen = 0
    for line in head.split(b"\r\n")[1:]:
        k, _, v = line.partition(b":")
        if k.strip().lower() == b"content-length":
            clen = int(v.strip())
    while len(rest) < clen:
        chunk = s.recv(65536)
        if not chunk:
            raise AssertionError("EOF inside a body")
        rest += chunk
    return status, rest[:clen]


def case_conncap():
    cap, extra = 32, 40
    d = setup_daemon(["--max-conns", str(cap)])
    socks = []
    try:
        fds0, _ = report_mem("before load", d)
        # The 32 are busy (each with a registration body on its way): at the
        # cap only connections that waited long for a request are closed to
        # make room (idle keep-alives, heads never finished), never these.
        body = loadlib.reg_body(1, "10.0.0.2:1", loadlib.weights(2))
        head = ("PUT %s HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n"
                % (loadlib.REGISTER, len(body))).encode()
        for _ in range(cap):
            s = socket.create_connection(("127.0.0.1", d.port), timeout=10)
            s.sendall(head + body[:10])
            socks.append(s)
        time.sleep(0.5)  # every one of them is past the eviction deadline, yet busy
        extras = []  # at once: each waits (a second at most) for a slot, then 503
        for _ in range(extra):
            s = socket.create_connection(("127.0.0.1", d.port), timeout=10)
            try:
                s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            except OSError:
                pass
            extras.append(s)
        refused = 0
        for s in extras:
            try:
                st, rbody = read_response(s)
            except ConnectionResetError:
                st, rbody = None, b""
            assert st == 503 and b"Too many connections" in rbody, (st, rbody)
            try:
                assert s.recv(1) == b"", "connection over the cap left open"
            except ConnectionResetError:
                pass
            refused += 1
            s.close()
        req = body[10:]
        served_again = 0
        for s in socks:
            s.sendall(req)
            assert read_response(s)[0] == 200, "an existing connection was harmed"
            served_again += 1
        print("connection cap %d: %d served, %d extra answered 503 and closed, "
              "%d served again on their connections" % (cap, cap, refused, served_again))
        for s in socks:
            s.close()
        socks = []
        st, _, _ = loadlib.get(d.port, "/health")
        assert st == 200
        fds1 = d.wait_fds(fds0)
        report_mem("after load", d)
        assert fds1 == fds0, "fds after %d, baseline %d" % (fds1, fds0)
        assert d.stop() == 0
    finally:
        for s in socks:
            s.close()
        if d.alive():
            d.sigkill()
        d.unlink_segment()


def main():
    global ARGS
    p = argparse.ArgumentParser()
    p.add_argument("--daemon")
    p.add_argument("--case", choices=("wrk", "slowloris", "conncap"))
    p.add_argument("--seconds", type=int, default=10)
    p.add_argument("--connections", type=int, default=1000)
    p.add_argument("--slow", type=int, default=500)
    p.add_argument("--slow-child", action="store_true")
    p.add_argument("--port", type=int)
    ARGS = p.parse_args()
    loadlib.raise_nofile()
    if ARGS.slow_child:
        slow_child(ARGS.port, ARGS.slow, ARGS.seconds)
        return 0
    {"wrk": case_wrk, "slowloris": case_slowloris, "conncap": case_conncap}[ARGS.case]()
    print("PASS %s" % ARGS.case)
    return 0


if __name__ == "__main__":
    sys.exit(main())
