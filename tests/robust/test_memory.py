#!/usr/bin/python3
"""test_memory.py - kvcoordd's memory has a ceiling under body floods.

30 connections each announce a 60 MiB registration body (Content-Length:
62914560) and send it as fast as they can, all but its last 100 bytes, then
trickle those a byte every 0.5 s.  Without a ceiling the daemon would buffer
30 x 60 MiB.  With the daemon-wide budget (--max-buffered-bytes, default
256 MiB) only the bodies that fit are received; the others are answered 503
(Retry-After) from their headers, before a byte of the body is kept; the
trickled ones are closed by --body-timeout.  Meanwhile a normal client keeps
registering small ranks and looking them up: every request is answered 200.

--auth: the same flood without an Authorization header against a daemon with
--auth-token-file: every flood connection is answered 401 from its headers
and its body is never buffered; the normal client (with the token) is served.

The daemon's heap (RssAnon; VmRSS also counts the shared segment pages) is
sampled throughout: the peak is printed and must stay within the budget plus
a margin (a memory bound, not a time).  Deadlines only bound the test.
Under an ASan build the daemon runs with quarantine_size_mb=8 appended to
ASAN_OPTIONS (the default 256 MiB quarantine of freed memory alone would
exceed the bound; the bound is unchanged), as test_soak.py does.
"""
import argparse
import os
import select
import socket
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "load"))
import loadlib  # noqa: E402

BODY = 62914560
CONNS = 30
TAIL = 100
CHUNK = b" " * (1 << 20)
MIB = 1 << 20


def rss(pid):
    out = {}
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in ("VmRSS", "RssAnon"):
                out[k] = int(v.split()[0]) * 1024
    return out


class Flood:
    def __init__(self, port, auth_header):
        self.port = port
        self.auth = auth_header
        self.status = {}  # connection -> first status seen (None: closed without one)
        self.closed_after = {}  # trickling connection -> seconds until the daemon closed it
        self.lock = threading.Lock()

    @staticmethod
    def answer(sock):
        try:
            data = sock.recv(4096)
        except OSError:
            return None
        if data.startswith(b"HTTP/1.1 "):
            return int(data[9:12])
        return None

    def one(self, i):
        s = socket.create_connection(("127.0.0.1", self.port), timeout=30)
        head = ("PUT /register_transfer_engine_info HTTP/1.1\r\nHost: x\r\n%s"
                "Content-Type: application/json\r\nContent-Length: %d\r\n\r\n"
                % (self.auth, BODY)).encode()
        status = None
        try:
            s.sendall(head)
            sent = 0
            while sent < BODY - TAIL:
                r, _, _ = select.select([s], [], [], 0)
                if r:  # answered early: 503 or 401
                    status = self.answer(s)
                    break
                n = min(len(CHUNK), BODY - TAIL - sent)
                s.sendall(CHUNK[:n])
                sent += n
            if status is None and sent >= BODY - TAIL:
                # Admitted: trickle the tail until the daemon gives up on us.
                t0 = time.monotonic()
                for _ in range(TAIL - 1):  # never the last byte
                    r, _, _ = select.select([s], [], [], 0.5)
                    if r:
                        status = self.answer(s) or "closed"
                        break
                    s.send(b" ")
                with self.lock:
                    self.closed_after[i] = time.monotonic() - t0
        except OSError:
            status = status or self.answer(s) or "closed"
        finally:
            s.close()
        with self.lock:
            self.status[i] = status


def normal_client(port, token, stop, results):
    rank = 0
    hdr = {"Authorization": "Bearer " + token} if token else {}
    while not stop.is_set():
        body = loadlib.reg_body(rank % 64, "10.3.0.1:%d" % (16000 + rank), loadlib.weights(8, rank))
        for method, target, b in (("PUT", loadlib.REGISTER, body),
                                  ("GET", loadlib.LOOKUP + "?rank=%d" % (rank % 64), None),
                                  ("GET", "/health", None)):
            t0 = time.monotonic()
            try:
                st = loadlib.get(port, target, timeout=30, method=method, body=b, headers=hdr)[0]
            except OSError as e:
                st = repr(e)
            results.append((st, (time.monotonic() - t0) * 1000))
        rank += 1
        time.sleep(0.05)


def asan_build(exe):
    """Whether exe is built with AddressSanitizer (names the ASan entry point)."""
    with open(exe, "rb") as f:
        return b"__asan_init" in f.read()


def run(args):
    if asan_build(args.daemon):
        opts = os.environ.get("ASAN_OPTIONS", "")
        os.environ["ASAN_OPTIONS"] = (opts + ":" if opts else "") + "quarantine_size_mb=8"
        print("ASan build: ASAN_OPTIONS=%s" % os.environ["ASAN_OPTIONS"])
    work = tempfile.mkdtemp(prefix="kvc-mem-")
    extra = ["--body-timeout", "5", "--max-rooms", "64"]
    token = None
    if args.auth:
        token = "flood-test-token"
        path = os.path.join(work, "token")
        with open(path, "w") as f:
            f.write(token + "\n")
        os.chmod(path, 0o600)
        extra += ["--auth-token-file", path]
    d = loadlib.Daemon(args.daemon, "kvctest-mem-%d" % os.getpid(), extra)
    d.start()
    try:
        base = rss(d.pid)
        peak = dict(base)
        flood = Flood(d.port, "")
        stop = threading.Event()
        normal = []
        nc = threading.Thread(target=normal_client, args=(d.port, token, stop, normal))
        nc.start()
        threads = [threading.Thread(target=flood.one, args=(i,)) for i in range(CONNS)]
        for t in threads:
            t.start()
        while any(t.is_alive() for t in threads):
            r = rss(d.pid)
            for k in r:
                peak[k] = max(peak[k], r[k])
            time.sleep(0.05)
        stop.set()
        nc.join(60)
        after = rss(d.pid)
        counts = {}
        for st in flood.status.values():
            counts[st] = counts.get(st, 0) + 1
        bad = [x for x in normal if x[0] != 200]
        lat = [x[1] for x in normal]
        mode = "with --auth-token-file, no Authorization" if args.auth else "no auth"
        print("memory ceiling (%s): %d connections x %d MiB announced; answers %s; "
              "trickled bodies closed by --body-timeout 5 after %s s; daemon heap (RssAnon) "
              "%.1f MiB before, peak %.1f MiB, %.1f MiB after (VmRSS peak %.1f MiB, budget "
              "256 MiB); normal client %d requests, %d not 200, p50 %.1f ms, max %.1f ms"
              % (mode, CONNS, BODY // MIB, dict(sorted(counts.items(), key=str)),
                 ",".join("%.1f" % v for v in sorted(flood.closed_after.values())) or "-",
                 base["RssAnon"] / MIB, peak["RssAnon"] / MIB, after["RssAnon"] / MIB,
                 peak["VmRSS"] / MIB, len(normal), len(bad), loadlib.percentile(lat, 50),
                 max(lat) if lat else 0))
        assert not bad, bad[:5]
        assert normal, "the normal client made no request"
        if args.auth:
            assert counts == {401: CONNS}, counts
            assert peak["RssAnon"] - base["RssAnon"] < 64 * MIB, peak
        else:
            assert counts.get(503, 0) >= CONNS - 256 * MIB // BODY, counts
            assert peak["RssAnon"] - base["RssAnon"] < (256 + 64) * MIB, peak
            # Admitted: not refused with 503.  Whether an admitted body got to
            # its trickled tail or was closed by --body-timeout on the way (ASan
            # at load 25: 60 MiB not sent within 5 s) depends on the machine.
            assert any(st != 503 for st in flood.status.values()), "no body was admitted"
        assert d.alive(), d.log_tail()
    finally:
        rc = d.stop()
        d.unlink_segment()
    assert rc == 0, (rc, d.log_tail())
    print("1 passed, 0 failed")
    return 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--daemon", required=True)
    ap.add_argument("--auth", action="store_true")
    return run(ap.parse_args())


if __name__ == "__main__":
    sys.exit(main())
