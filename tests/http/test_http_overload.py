#!/usr/bin/python3
"""kvcoordd under overload: answers have a ceiling, the connection cap
degrades gracefully.

- Answer budget (--max-answer-bytes): 300 connections each pipeline two
  lookups of a 4 MB rank and never read.  Before the budget the daemon's
  RSS grew by about 2.4 GiB and /health took seconds; now the unsent
  answers stay within the budget, a large answer past it is answered 503,
  and /health and small lookups on fresh connections are answered at once.
- Connection cap: 4096 connections (the default --max-conns) that each send
  one byte and reconnect whenever closed.  Before, nearly every fresh
  /health got 503; now connections that waited long for a request are
  closed to make room, and fresh requests are served.

The figures (RSS, latencies, statuses) are printed; the assertions use
generous bounds and wait for conditions, never for a time.

Usage: test_http_overload.py [--daemon PATH] [unittest args]
"""

import argparse
import os
import resource
import selectors
import signal
import socket
import statistics
import sys
import threading
import time
import unittest

import test_http_raw as raw
from test_http_raw import Conn, Daemon, build, registration

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
from kvctest import scrape  # noqa: E402  (the tests' one helper module)

MIB = 1 << 20


def sanitized(path):
    """True when the daemon was built with AddressSanitizer."""
    with open(path, "rb") as f:
        return b"__asan_init" in f.read()


def fresh_request(port, target):
    """(status, seconds) of one request on a new connection."""
    t0 = time.monotonic()
    c = Conn(port)
    try:
        status, _, _ = c.request("GET", target)
    finally:
        c.close()
    return status, time.monotonic() - t0


def _raise_exit(*_):
    raise SystemExit


class HealthProbe:
    """GET /health on a fresh connection every 10 ms, from a process of
    its own (a thread would measure this process's GIL too); .ms: the
    latencies in ms once stopped."""

    def __init__(self, port):
        self.port, self.ms = port, []
        self.r, w = os.pipe()
        self.pid = os.fork()
        if self.pid == 0:
            os.close(self.r)
            out = []
            signal.signal(signal.SIGTERM, _raise_exit)
            try:
                while True:
                    try:
                        st, t = fresh_request(port, "/health")
                    except OSError:
                        continue
                    if st == 200:
                        out.append("%.3f" % (t * 1000))
                    time.sleep(0.01)  # until SIGTERM (SystemExit)
            finally:
                os.write(w, " ".join(out).encode())
                os._exit(0)
        os.close(w)

    def finish(self):
        os.kill(self.pid, signal.SIGTERM)
        data = b""
        while True:
            chunk = os.read(self.r, 65536)
            if not chunk:
                break
            data += chunk
        os.close(self.r)
        os.waitpid(self.pid, 0)
        self.ms = [float(v) for v in data.split()]


class AnswerBudgetTest(unittest.TestCase):
    CONNS = 300

    def test_unread_large_answers_stay_within_the_budget(self):
        budget = 256 * MIB  # the default of --max-answer-bytes
        env = os.environ.get("ASAN_OPTIONS")
        if sanitized(raw.ARGS.daemon):
            # ASan keeps freed blocks in quarantine (256 MiB by default), which
            # is RSS the daemon gave back: keep it small for this measurement.
            os.environ["ASAN_OPTIONS"] = "quarantine_size_mb=8:" + (env or "")
        try:
            # (a long idle timeout: the unread connections are read at the end)
            d = Daemon("--max-body-bytes", "32M", "--idle-timeout", "600")
        finally:
            if env is None:
                os.environ.pop("ASAN_OPTIONS", None)
            else:
                os.environ["ASAN_OPTIONS"] = env
        conns = []
        try:
            c = Conn(d.port)
            entries = 75000  # a weights_info_dict of about 4 MB
            status, _, _ = c.request("PUT", "/register_transfer_engine_info",
                                     registration(1, "10.0.0.1:1", entries=entries))
            self.assertEqual(status, 200)
            self.assertEqual(c.request("PUT", "/register_transfer_engine_info",
                                       registration(2, "10.0.0.2:1"))[0], 200)
            status, _, body = c.request("GET", "/get_transfer_engine_info?rank=1")
            self.assertEqual(status, 200)
            answer = len(body)
            self.assertGreater(answer, 3500 * 1000)
            c.close()
            rss0 = d.rss_kib()
            probe = HealthProbe(d.port)
            time.sleep(0.2)
            req = build("GET", "/get_transfer_engine_info?rank=1") * 2
            for _ in range(self.CONNS):
                s = socket.socket()
                s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
                s.settimeout(raw.TIMEOUT)
                s.connect(("127.0.0.1", d.port))
                s.sendall(req)
                conns.append(s)
            # Settle: the RSS stops moving once every request was handled.
            prev, deadline = -1, time.monotonic() + 60
            while time.monotonic() < deadline:
                time.sleep(0.5)
                rss = d.rss_kib()
                if abs(rss - prev) < 1024:
                    break
                prev = rss
            grown = (d.rss_kib() - rss0) / 1024.0
            probe.finish()
            p_ms = sorted(probe.ms)
            # The bound is 200 ms (before: 0.9-1.4 s, every request
            # rendering its own 4 MB copy on the loop); printed, not asserted
            # (a loaded machine's scheduling is in it).
            print("\n/health while the %d connections sent their GETs: %d probes, median "
                  "%.2f ms, max %.2f ms (bound 200 ms); load %s" %
                  (self.CONNS, len(p_ms), statistics.median(p_ms) if p_ms else 0,
                   p_ms[-1] if p_ms else 0, os.getloadavg()[0]))
            self.assertTrue(p_ms)
            health = [fresh_request(d.port, "/health") for _ in range(20)]
            small = [fresh_request(d.port, "/get_transfer_engine_info?rank=2")
                     for _ in range(20)]
            large = fresh_request(d.port, "/get_transfer_engine_info?rank=1")
            h_ms = sorted(t * 1000 for _, t in health)
            s_ms = sorted(t * 1000 for _, t in small)
            print("\n%d connections x 2 unread GET of a %.1f MB answer, budget %d MiB: "
                  "RSS +%.0f MiB (%d MiB asked for)" %
                  (self.CONNS, answer / 1e6, budget // MIB, grown,
                   2 * self.CONNS * answer // MIB))
            print("fresh /health: median %.2f ms, max %.2f ms; small lookup: median %.2f ms, "
                  "max %.2f ms; large lookup meanwhile: %d" %
                  (statistics.median(h_ms), h_ms[-1], statistics.median(s_ms), s_ms[-1],
                   large[0]))
            self.assertEqual([st for st, _ in health], [200] * 20)
            self.assertEqual([st for st, _ in small], [200] * 20)
            # One rendering of the rank's answer, shared by every connection:
            # it costs its bytes once, so the budget is not reached and the
            # large lookup is answered too (before: a copy per request, the
            # budget ran out and it was 503).
            self.assertEqual(large[0], 200)
            # Generous: the budget, plus one answer and allocator slack.
            self.assertLess(grown, (budget + 64 * MIB) / MIB)
            self.assertLess(statistics.median(h_ms), 1000)  # a hang guard; printed above
            m = scrape(d.port)
            renders = m.get("kvcoord_http_answer_renders_total", -1)
            shared = m.get("kvcoord_http_answer_shared_sends_total", -1)
            print("large answers rendered %d times, queued from the shared buffer %d times; "
                  "answer bytes held %.1f MiB" %
                  (renders, shared, m["kvcoord_http_answer_bytes"] / MIB))
            self.assertGreaterEqual(shared, self.CONNS)
            self.assertLessEqual(renders, 3)  # once per generation (+ a race at most)
            self.assertLess(grown, 64)  # one copy of the answer, not one per request
            # Every first answer is the rank (or a 503 naming the budget).
            # (the status of each; the whole body of a few: 1.3 GB through
            # 4 KiB receive buffers would take minutes)
            statuses = {}
            for i, s in enumerate(conns):
                c = Conn.__new__(Conn)
                c.sock, c.buf = s, b""
                st, hdr, body = c.response(head_only=i >= 10)
                statuses[st] = statuses.get(st, 0) + 1
                if i >= 10:
                    continue
                if st == 200:
                    self.assertEqual(len(body), answer)
                else:
                    self.assertIn(b"answer budget", body)
            print("first answers: %s" % statuses)
            self.assertEqual(set(statuses), {200})
            metrics = scrape(d.port)
            self.assertEqual(metrics["kvcoord_http_answer_bytes_max"], budget)
            self.assertLessEqual(metrics["kvcoord_http_answer_bytes"], budget + answer + MIB)
        finally:
            for s in conns:
                s.close()
            self.assertEqual(d.stop(), 0, d.output()[-3000:])


class Flood(threading.Thread):
    """n connections that each send one byte and reconnect when closed."""

    def __init__(self, port, n):
        super().__init__(daemon=True)
        self.port, self.n = port, n
        self.stop = threading.Event()
        self.connected = self.closed = self.errors = 0
        self.sel = selectors.DefaultSelector()

    def _open(self):
        s = socket.socket()
        s.setblocking(False)
        try:
            s.connect(("127.0.0.1", self.port))
        except BlockingIOError:
            pass
        except OSError:
            s.close()
            self.errors += 1
            return
        self.sel.register(s, selectors.EVENT_WRITE, "connecting")

    def _drop(self, s):
        self.sel.unregister(s)
        s.close()

    def run(self):
        for _ in range(self.n):
            self._open()
        while not self.stop.is_set():
            for key, _ in self.sel.select(0.1):
                s = key.fileobj
                if key.data == "connecting":
                    if s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
                        self._drop(s)
                        self.errors += 1
                        self._open()
                        continue
                    try:
                        s.send(b"G")
                    except OSError:
                        self._drop(s)
                        self._open()
                        continue
                    self.sel.modify(s, selectors.EVENT_READ, "sent")
                    self.connected += 1
                    continue
                try:
                    data = s.recv(4096)
                except OSError:
                    data = b""
                if not data:  # closed by the server: come back at once
                    self._drop(s)
                    self.closed += 1
                    self._open()
        for key in list(self.sel.get_map().values()):
            key.fileobj.close()


class ConnectionCapTest(unittest.TestCase):
    FLOOD = 4096  # the default --max-conns
    FRESH = 101

    def test_reconnecting_one_byte_flood(self):
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        want = self.FLOOD + 512
        if hard != resource.RLIM_INFINITY and hard < want:
            self.skipTest("RLIMIT_NOFILE hard limit %d is below %d" % (hard, want))
        resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, want), hard))
        d = Daemon()
        flood = Flood(d.port, self.FLOOD)
        try:
            parked = Conn(d.port)  # a long-poll in progress is never evicted
            parked.send(build("GET", "/get_transfer_engine_info?rank=7&wait_ms=60000"))
            time.sleep(0.2)
            flood.start()
            deadline = time.monotonic() + 60
            while flood.connected < self.FLOOD and time.monotonic() < deadline:
                time.sleep(0.05)
            self.assertGreaterEqual(flood.connected, self.FLOOD)
            results = []
            for _ in range(self.FRESH):
                try:
                    results.append(fresh_request(d.port, "/health"))
                except (OSError, EOFError) as e:
                    results.append((repr(e), 0.0))
                time.sleep(0.05)
            ok = [t * 1000 for st, t in results if st == 200]
            st, _ = fresh_request(d.port, "/health")  # the server still answers
            c = Conn(d.port)
            reg = c.request("PUT", "/register_transfer_engine_info",
                            registration(7, "10.0.0.7:1"))[0]
            c.close()
            flood.stop.set()
            flood.join(30)
            print("\n%d-connection one-byte flood (reconnecting): %d of %d fresh /health "
                  "answered 200 (median %.1f ms, max %.1f ms); flood connections closed by "
                  "the server %d" % (self.FLOOD, len(ok), len(results),
                                     statistics.median(ok) if ok else 0,
                                     max(ok) if ok else 0, flood.closed))
            others = [st for st, _ in results if st != 200]
            self.assertGreaterEqual(len(ok), 0.95 * len(results), others[:10])
            self.assertEqual(reg, 200)
            self.assertEqual(parked.response()[0], 200)  # survived the flood, answered
            parked.close()
            self.assertIn("connection_cap_evict", d.output())
            self.assertGreater(scrape(d.port)["kvcoord_http_connections_evicted_total"], 0)
        finally:
            flood.stop.set()
            self.assertEqual(d.stop(), 0, d.output()[-3000:])


class Trickle(threading.Thread):
    """n connections without the token that each send a POST head
    announcing a body, then 1 byte of it every 4 s; reconnecting when
    closed.  The first `big` announce `clen_big` bytes (to hold the
    daemon's body budget), the others 1000."""

    def __init__(self, port, n, big=8, clen_big=64 * MIB):
        super().__init__(daemon=True)
        self.port, self.n, self.big, self.clen_big = port, n, big, clen_big
        self.stop = threading.Event()
        self.opened = self.closed = self.errors = 0
        self.sel = selectors.DefaultSelector()
        self.socks = {}

    def _open(self, i):
        s = socket.socket()
        s.setblocking(False)
        try:
            s.connect(("127.0.0.1", self.port))
        except BlockingIOError:
            pass
        except OSError:
            s.close()
            self.errors += 1
            return
        self.sel.register(s, selectors.EVENT_WRITE, i)

    def _head(self, i):
        clen = self.clen_big if i < self.big else 1000
        return ("POST /query_dp_ranks HTTP/1.1\r\nHost: x\r\nContent-Type: "
                "application/json\r\nContent-Length: %d\r\n\r\n" % clen).encode()

    def _drop(self, s, i):
        self.sel.unregister(s)
        self.socks.pop(i, None)
        s.close()
        self.closed += 1
        if not self.stop.is_set():
            self._open(i)

    def run(self):
        for i in range(self.n):
            self._open(i)
        next_drip = time.monotonic() + 4
        while not self.stop.is_set():
            for key, _ in self.sel.select(0.1):
                s, i = key.fileobj, key.data
                if s.fileno() < 0:
                    continue
                if i not in self.socks:  # connected (or failed)
                    try:
                        if s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
                            raise OSError
                        s.send(self._head(i))
                    except OSError:
                        self._drop(s, i)
                        continue
                    self.socks[i] = s
                    self.opened += 1
                    self.sel.modify(s, selectors.EVENT_READ, i)
                    continue
                try:
                    data = s.recv(4096)
                except OSError:
                    data = b""
                if not data:
                    self._drop(s, i)
            if time.monotonic() >= next_drip:
                next_drip += 4
                for i, s in list(self.socks.items()):
                    try:
                        s.send(b"[")
                    except OSError:
                        pass
        for key in list(self.sel.get_map().values()):
            key.fileobj.close()


class UnauthenticatedSlotsTest(unittest.TestCase):
    """With --auth-token-file, peers without the token cannot take what
    authenticated ones need: 4,100 connections trickling a POST body at 1
    byte / 4 s (8 of them announcing 64 MiB bodies, the whole body budget
    between them) do not lock an authenticated PUT /route or /health out.
    Before: every slot held by a body nobody could evict, the budget
    reserved by the 8, so 503 for up to 60 s (the body timeout)."""

    FLOOD = 4100

    def test_trickled_bodies_do_not_lock_out_authenticated_clients(self):
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        want = self.FLOOD + 512
        if hard != resource.RLIM_INFINITY and hard < want:
            self.skipTest("RLIMIT_NOFILE hard limit %d is below %d" % (hard, want))
        resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, want), hard))
        import json
        import tempfile
        token = "s3cret-token-for-the-trickle-test"
        tf = tempfile.NamedTemporaryFile("w", prefix="kvc-token-", delete=False)
        tf.write(token)
        tf.close()
        os.chmod(tf.name, 0o600)
        d = Daemon("--auth-token-file", tf.name)
        flood = Trickle(d.port, self.FLOOD)
        auth = ["Authorization: Bearer " + token]
        try:
            flood.start()
            deadline = time.monotonic() + 60
            while flood.opened < self.FLOOD and time.monotonic() < deadline:
                time.sleep(0.05)
            time.sleep(1)  # every slot taken, the budget reserved
            health, puts = [], []
            for i in range(20):
                try:
                    health.append(fresh_request(d.port, "/health"))
                except (OSError, EOFError) as e:
                    health.append((repr(e), 0.0))
                body = json.dumps({
                    "attn_tp_size": 1, "attn_tp_rank": 0, "attn_cp_size": 1,
                    "attn_cp_rank": 0, "attn_dp_size": 1, "attn_dp_rank": 0, "pp_size": 1,
                    "pp_rank": 0, "system_dp_size": 1, "system_dp_rank": 0,
                    "rank_ip": "10.0.0.1", "rank_port": 17000 + i, "page_size": 64,
                    "kv_cache_dtype": "auto"}).encode()
                t0 = time.monotonic()
                try:
                    c = Conn(d.port)
                    st = c.request("PUT", "/route", body, headers=auth)[0]
                    c.close()
                except (OSError, EOFError) as e:
                    st = repr(e)
                puts.append((st, time.monotonic() - t0))
            flood.stop.set()
            flood.join(30)
            h_ok = [t * 1000 for st, t in health if st == 200]
            p_ok = [t * 1000 for st, t in puts if st == 200]
            print("\n%d trickling unauthenticated bodies: /health %d of %d answered 200 "
                  "(max %.1f ms), authenticated PUT /route %d of %d (max %.1f ms); "
                  "trickle connections closed by the server %d; load %.1f" %
                  (self.FLOOD, len(h_ok), len(health), max(h_ok) if h_ok else 0, len(p_ok),
                   len(puts), max(p_ok) if p_ok else 0, flood.closed, os.getloadavg()[0]))
            self.assertEqual([st for st, _ in health], [200] * len(health))
            self.assertEqual([st for st, _ in puts], [200] * len(puts))
            # One client without the token cannot fill the PD room map: its
            # writes are refused from their headers, nothing is stored.
            sts = set()
            for r in range(200):  # (a 401 closes its connection)
                c = Conn(d.port)
                sts.add(c.request("POST", "/register_dp_rank",
                                  {"bootstrap_room": r, "dp_rank": 0})[0])
                c.close()
            c = Conn(d.port)
            st, _, body = c.request("POST", "/query_dp_ranks", {"bootstrap_rooms": [0, 199]})
            c.close()
            self.assertEqual(sts, {401})
            self.assertEqual((st, json.loads(body)), (200, {}))
        finally:
            flood.stop.set()
            self.assertEqual(d.stop(), 0, d.output()[-3000:])
            os.unlink(tf.name)


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser()
    ap.add_argument("--daemon", default=os.path.join(here, "..", "..", "build", "kvcoordd"))
    raw.ARGS, rest = ap.parse_known_args()
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)


if __name__ == "__main__":
    main()
