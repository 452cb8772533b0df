#!/usr/bin/python3
"""Raw-socket tests of kvcoordd's HTTP/1.1 handling.

Each test speaks HTTP by hand over a TCP socket, so it controls exactly what
the server receives: pipelined requests, chunked bodies, Expect:
100-continue, conflicting framing headers, a megabyte of head without a line
end, oversized bodies, raw non-HTTP bytes, HTTP/1.0, long-polls, signals.

The daemon is started here (on a port it picks itself: --listen
127.0.0.1:0, read back from its "listening" line), with a unique --segment
and --fresh; it is stopped and its segment unlinked at the end.  Socket
timeouts are generous and only keep a broken server from hanging the test;
no test asserts how fast anything is.

Usage: test_http_raw.py [--daemon PATH] [unittest args]
"""

import argparse
import json
import os
import re
import resource
import signal
import socket
import subprocess
import sys
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
from kvctest import Daemon as KvcDaemon  # noqa: E402  (the tests' one helper module)

ARGS = None
TIMEOUT = 30.0  # socket timeout: a hang guard, not an assertion
MAX_BODY = 1 << 20  # --max-body-bytes of the main daemon


class Daemon(KvcDaemon):
    """kvctest's kvcoordd on a fresh segment of its own: extra, its options;
    host, the loopback address it listens on; the daemon's own log level
    and room cap."""

    count = 0

    def __init__(self, *extra, host="127.0.0.1"):
        Daemon.count += 1
        super().__init__("kvctest-http-raw-%d-%d" % (os.getpid(), Daemon.count), extra,
                         exe=ARGS.daemon, host=host, max_rooms=None, log_level=None)

    def stop(self, sig=signal.SIGTERM):
        """Signal (SIGKILL after a long grace), reap, unlink; the status."""
        return super().stop(sig=sig)


class Conn:
    """One client connection with a read buffer (responses may arrive together)."""

    def __init__(self, port):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT)
        self.buf = b""

    def close(self):
        self.sock.close()

    def send(self, data):
        if isinstance(data, str):
            data = data.encode()
        self.sock.sendall(data)

    def _fill(self):
        chunk = self.sock.recv(65536)
        if not chunk:
            raise EOFError("connection closed by the server")
        self.buf += chunk

    def read_until(self, marker):
        while marker not in self.buf:
            self._fill()
        i = self.buf.index(marker) + len(marker)
        out, self.buf = self.buf[:i], self.buf[i:]
        return out

    def read_exact(self, n):
        while len(self.buf) < n:
            self._fill()
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def response(self, head_only=False):
        """(status, headers with lower-case names, body bytes)."""
        head = self.read_until(b"\r\n\r\n").decode("latin-1")
        lines = head.split("\r\n")
        status = int(lines[0].split(" ")[1])
        headers = {}
        for line in lines[1:]:
            if line:
                name, value = line.split(":", 1)
                headers[name.strip().lower()] = value.strip()
        body = b""
        if not head_only and status >= 200:
            body = self.read_exact(int(headers.get("content-length", "0")))
        return status, headers, body

    def at_eof(self):
        """True when the server closed its side (all sent data read first)."""
        try:
            while True:
                chunk = self.sock.recv(65536)
                if not chunk:
                    return True
                self.buf += chunk
        except ConnectionResetError:
            return True

    def request(self, method, target, body=None, headers=()):
        self.send(build(method, target, body, headers))
        return self.response()


def build(method, target, body=None, headers=(), version="HTTP/1.1"):
    lines = ["%s %s %s" % (method, target, version), "Host: test"]
    lines += list(headers)
    data = b""
    if body is not None:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        lines.append("Content-Length: %d" % len(data))
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + data


def registration(rank, session_id, entries=2, key="rank"):
    wid = {"model.layers.%d.weight" % i: [140000000000 + i * 4096, 4096, 2] for i in range(entries)}
    return {key: rank, "transfer_engine_info": {"session_id": session_id, "weights_info_dict": wid}}


NUL_DETAIL = "Invalid query string: NUL byte (%00) in a parameter"


def detail(body):
    return json.loads(body)["detail"]


class RawHttpTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.d = Daemon("--max-body-bytes", str(MAX_BODY))

    @classmethod
    def tearDownClass(cls):
        status = cls.d.stop()
        if status != 0:  # a crash or a sanitizer report
            raise AssertionError("kvcoordd exited %s: %s" % (status, cls.d.output()[-4000:]))

    def setUp(self):
        self.conns = []

    def tearDown(self):
        for c in self.conns:
            c.close()

    def conn(self):
        c = Conn(self.d.port)
        self.conns.append(c)
        return c

    def register(self, rank, session_id, **kw):
        status, _, body = self.conn().request("PUT", "/register_transfer_engine_info",
                                              registration(rank, session_id, **kw))
        self.assertEqual((status, body), (200, b"OK"))

    def lookup(self, rank):
        status, headers, body = self.conn().request("GET", "/get_transfer_engine_info?rank=%d"
                                                    % rank)
        return status, headers, json.loads(body)

    def assert_health(self):
        status, headers, body = self.conn().request("GET", "/health")
        self.assertEqual((status, body), (200, b"OK"))
        self.assertTrue(headers["content-type"].startswith("text/plain"))

    def assert_error_then_close(self, c, status):
        got, headers, body = c.response()
        self.assertEqual(got, status, body)
        self.assertEqual(headers.get("connection"), "close")
        self.assertEqual(headers["content-type"], "application/json")
        self.assertTrue(detail(body))
        self.assertTrue(c.at_eof())
        return detail(body)

    # ---- basics -------------------------------------------------------------

    def test_health_and_keep_alive(self):
        c = self.conn()
        for _ in range(5):
            status, headers, body = c.request("GET", "/health")
            self.assertEqual((status, body), (200, b"OK"))
            self.assertNotIn("connection", headers)

    def test_unknown_path_404(self):
        status, headers, body = self.conn().request("GET", "/no/such/path")
        self.assertEqual(status, 404)
        self.assertEqual(headers["content-type"], "application/json")
        self.assertEqual(json.loads(body), {"detail": "Not Found"})

    def test_wrong_method_405(self):
        for method, path, allow in (("POST", "/health", "GET, HEAD"),
                                    ("DELETE", "/get_transfer_engine_info?rank=0", "GET, HEAD"),
                                    ("GET", "/register_transfer_engine_info", "PUT, POST"),
                                    ("PUT", "/ranks", "GET, HEAD"),
                                    ("GET", "/transfer_engine_info?rank=0", "DELETE")):
            status, headers, body = self.conn().request(method, path)
            self.assertEqual(status, 405, (method, path))
            self.assertEqual(json.loads(body), {"detail": "Method Not Allowed"})
            self.assertEqual(headers["allow"], allow)

    def test_head_has_no_body(self):
        c = self.conn()
        c.send(build("HEAD", "/health") + build("GET", "/health"))
        status, headers, _ = c.response(head_only=True)
        self.assertEqual((status, headers["content-length"]), (200, "2"))
        self.assertEqual(c.response()[2], b"OK")  # the next answer follows directly

    def test_lookup_and_query_parameters(self):
        self.register(40, "10.0.0.1:16040")
        status, headers, data = self.lookup(40)
        self.assertEqual(status, 200)
        self.assertEqual(headers["content-type"], "application/json")
        self.assertEqual(data["rank"], 40)
        self.assertEqual(data["remote_instance_transfer_engine_info"][0], "10.0.0.1:16040")
        self.assertGreaterEqual(int(headers["x-kvcoord-generation"]), 1)
        c = self.conn()
        cases = (("?rank=%340", 200, None), ("?wait_ms=0&rank=40", 200, None),
                 ("?rank=41", 404, "No transfer engine info for rank 41"),
                 ("", 400, "Missing rank parameter"), ("?rank=", 400, "Invalid rank parameter"),
                 ("?rank=-1", 400, "Invalid rank parameter"),
                 ("?rank=1.5", 400, "Invalid rank parameter"),
                 ("?rank=abc", 400, "Invalid rank parameter"),
                 ("?rank=99999999999999999999999", 400, "Invalid rank parameter"),
                 ("?rank=%zz", 400, "Invalid percent-encoding in query string"),
                 ("?rank=4%", 400, "Invalid percent-encoding in query string"),
                 ("?rank=40%00", 400, NUL_DETAIL), ("?rank=40%00junk", 400, NUL_DETAIL),
                 ("?rank=40&wait_ms=1%000", 400, NUL_DETAIL),
                 ("?rank=40&x%00=1", 400, NUL_DETAIL),
                 ("?rank=0&wait_ms=x", 400, "Invalid wait_ms parameter"),
                 ("?rank=1000000", 404, "No transfer engine info for rank 1000000"))
        for query, want_status, want_detail in cases:
            status, _, body = c.request("GET", "/get_transfer_engine_info" + query)
            self.assertEqual(status, want_status, (query, body))
            if want_detail:
                self.assertEqual(detail(body), want_detail, query)

    def test_register_validation(self):
        c = self.conn()
        good = registration(50, "h:1")
        cases = ((b'{"rank": 50, "transfer', "Invalid JSON at line 1, column"),
                 (b"[1, 2]", "Request body must be a JSON object"),
                 (b"", "Invalid JSON at line"),
                 ({"transfer_engine_info": good["transfer_engine_info"]},
                  "Missing field 'rank' (or 'tp_rank')"),
                 (dict(good, rank=-1), "Invalid field 'rank': must be a non-negative integer"),
                 (dict(good, rank=1.0), "Invalid field 'rank': must be a non-negative integer"),
                 (dict(good, rank="1"), "Invalid field 'rank': must be a non-negative integer"),
                 (dict(good, rank=True), "Invalid field 'rank': must be a non-negative integer"),
                 ({"tp_rank": None, "transfer_engine_info": {}},
                  "Invalid field 'tp_rank': must be a non-negative integer"),
                 ({"rank": 50}, "Missing field 'transfer_engine_info'"),
                 ({"rank": 50, "transfer_engine_info": []},
                  "Invalid field 'transfer_engine_info': must be an object"),
                 ({"rank": 50, "transfer_engine_info": {"weights_info_dict": {}}},
                  "Missing field 'transfer_engine_info.session_id'"),
                 ({"rank": 50, "transfer_engine_info": {"session_id": "", "weights_info_dict": {}}},
                  "Invalid field 'transfer_engine_info.session_id': must be a non-empty string"),
                 ({"rank": 50, "transfer_engine_info": {"session_id": "h:1"}},
                  "Missing field 'transfer_engine_info.weights_info_dict'"),
                 ({"rank": 50, "transfer_engine_info": {"session_id": "h:1",
                                                        "weights_info_dict": [1]}},
                  "Invalid field 'transfer_engine_info.weights_info_dict': must be an object"))
        for body, want in cases:
            status, headers, answer = c.request("PUT", "/register_transfer_engine_info", body)
            self.assertEqual(status, 400, body)
            self.assertEqual(headers["content-type"], "application/json")
            self.assertTrue(detail(answer).startswith(want), (body, answer))
        self.assertEqual(self.lookup(50)[0], 404)  # nothing stored by a rejected request
        # One wording for the rank limit, whether the library or the daemon refuses.
        for rank in (5000, 2**32 - 1, 2**64 - 1):
            status, _, body = c.request("PUT", "/register_transfer_engine_info",
                                        registration(rank, "h:1"))
            self.assertEqual(status, 400)
            self.assertEqual(detail(body),
                             "Failed to register rank %d: rank %d exceeds the segment's max "
                             "ranks (1024; ranks are 0..1023)" % (rank, rank))

    def test_large_registration_on_helper_thread(self):
        """Bodies over 64 KiB are handled off the loop: answers stay in order,
        errors are the same, other connections keep being served."""
        big = registration(91, "10.0.0.91:1", entries=5000)  # about 300 KB
        c = self.conn()
        c.send(build("PUT", "/register_transfer_engine_info", big)
               + build("GET", "/get_transfer_engine_info?rank=91")
               + build("PUT", "/register_transfer_engine_info",
                       b'{"rank": 92, "x": "' + b"y" * 100000 + b'"')  # cut short
               + build("GET", "/health"))
        self.assert_health()
        self.assertEqual(c.response()[:3:2], (200, b"OK"))
        status, _, body = c.response()
        self.assertEqual(status, 200)
        self.assertEqual(json.loads(body)["remote_instance_transfer_engine_info"][1],
                         big["transfer_engine_info"]["weights_info_dict"])
        status, _, body = c.response()
        self.assertEqual(status, 400)
        self.assertTrue(detail(body).startswith("Invalid JSON at line 1, column"), body)
        self.assertEqual(c.response()[2], b"OK")

    def test_numbers_and_bytes_returned_as_sent(self):
        """weights_info_dict is stored as the bytes sent (validated, never
        re-encoded): numbers keep their spelling, integers up to 2^64-1 are
        accepted, whitespace and key order stay."""
        wid = (b'{ "w.0": [0.1, 1E5, 18446744073709551615, 2],\n  "w.1" :[-0, 1.50, '
               b'-9223372036854775808, 1e400],"caf\\u00e9":{}, "w.0": [3, 4, 5] }')
        body = (b'{"rank": 61, "transfer_engine_info": {"session_id": "h\\u003a61", '
                b'"weights_info_dict": ' + wid + b'}}')
        c = self.conn()
        self.assertEqual(c.request("PUT", "/register_transfer_engine_info", body)[:3:2],
                         (200, b"OK"))
        status, headers, answer = c.request("GET", "/get_transfer_engine_info?rank=61")
        self.assertEqual(status, 200)
        self.assertEqual(answer, b'{"rank":61,"remote_instance_transfer_engine_info":["h:61",'
                         + wid + b']}')
        _, _, ranks = c.request("GET", "/ranks")
        entry = [r for r in json.loads(ranks)["ranks"] if r["rank"] == 61][0]
        self.assertEqual(entry["entries"], 4)  # keys as written (w.0 twice)
        self.assertEqual(entry["info_bytes"], len(wid))
        for bad, why in ((b'{"rank": 62, "transfer_engine_info": {"session_id": "h:1", '
                          b'"weights_info_dict": {"x": 18446744073709551616}}}',
                          "Invalid JSON at line 1, column 87: integer out of range"),
                         (b'{"rank": 62, "transfer_engine_info": {"session_id": "h:1", '
                          b'"weights_info_dict": {"x": 01}}}',
                          "Invalid JSON at line 1, column 87: invalid number"),
                         (b'{"rank": 62,\n "transfer_engine_info": {"session_id": "\xff"}}',
                          "Invalid JSON at line 2, column 42: invalid UTF-8"),
                         (b'{"rank": 62, "transfer_engine_info": {"session_id": "a\\u0000b", '
                          b'"weights_info_dict": {}}}',
                          "Invalid field 'transfer_engine_info.session_id': must not contain NUL"),
                         (b'{"rank": 62, "transfer_engine_info": {"session_id": "h:1", '
                          b'"weights_info_dict": ' + b"[" * 3000 + b"]" * 3000 + b'}}',
                          "Invalid JSON at line 1, column 2127: nesting too deep")):
            status, _, answer = c.request("PUT", "/register_transfer_engine_info", bad)
            self.assertEqual(status, 400, bad[:100])
            self.assertTrue(detail(answer).startswith(why), (why, answer))
        self.assertEqual(self.lookup(62)[0], 404)

    def test_rank_wins_over_tp_rank(self):
        body = registration(0, "10.0.0.2:1")
        body["tp_rank"] = 7
        status, _, answer = self.conn().request("POST", "/register_transfer_engine_info", body)
        self.assertEqual((status, answer), (200, b"OK"))
        self.assertEqual(self.lookup(0)[2]["remote_instance_transfer_engine_info"][0], "10.0.0.2:1")
        self.assertEqual(self.lookup(7)[0], 404)

    def test_same_registration_again_changes_nothing(self):
        self.register(90, "10.0.0.90:1")
        gen = int(self.lookup(90)[1]["x-kvcoord-generation"])
        self.register(90, "10.0.0.90:1")  # a client retry after its timeout
        self.assertEqual(int(self.lookup(90)[1]["x-kvcoord-generation"]), gen)
        self.register(90, "10.0.0.91:1")  # the process replaced behind the rank
        _, headers, data = self.lookup(90)
        self.assertGreater(int(headers["x-kvcoord-generation"]), gen)
        self.assertEqual(data["remote_instance_transfer_engine_info"][0], "10.0.0.91:1")

    def test_ranks_and_withdraw(self):
        self.register(60, "[2001:db8::1]:16060", key="tp_rank")
        status, _, body = self.conn().request("GET", "/ranks")
        self.assertEqual(status, 200)
        listing = json.loads(body)
        row = [r for r in listing["ranks"] if r["rank"] == 60][0]
        self.assertEqual(row["session_id"], "[2001:db8::1]:16060")
        self.assertEqual(row["entries"], 2)
        self.assertGreater(row["info_bytes"], 0)
        self.assertIn("world_size", listing)
        c = self.conn()
        self.assertEqual(c.request("DELETE", "/transfer_engine_info?rank=60")[:3:2], (200, b"OK"))
        status, _, data = self.lookup(60)
        self.assertEqual(status, 404)
        self.assertEqual(data["detail"], "No transfer engine info for rank 60 "
                         "(withdrawn over HTTP (DELETE /transfer_engine_info))")  # "withdrawn" once
        self.assertEqual(c.request("DELETE", "/transfer_engine_info?rank=60")[0], 404)

    def wait_log(self, pattern):
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            lines = [l for l in self.d.output().splitlines() if re.search(pattern, l)]
            if lines:
                return lines
            time.sleep(0.02)
        raise AssertionError("no log line matching %r in:\n%s" % (pattern, self.d.output()))

    def test_log_values_are_escaped(self):
        # A value can neither end its field, add fields, nor add a line.
        sid = 'x" level=error evil="1\ttab\u0001ctl\\'
        self.register(63, sid)
        line, = self.wait_log(r" info register rank=63 ")
        self.assertIn(r'session_id="x\" level=error evil=\"1\ttab\x01ctl\\" pid=', line)
        self.assertEqual(line.count('"'), 2 + 2)  # the field's quotes + two escaped ones
        reason = 'bad" code=0 x="1\nnext line \u00e9'
        status, _, _ = self.conn().request("PUT", "/rooms/6363/failure",
                                           {"rank": 1, "reason": reason, "code": 5})
        self.assertEqual(status, 200)
        line, = self.wait_log(r" warn failure room=6363 ")
        self.assertTrue(line.endswith('reason="bad\\" code=0 x=\\"1\\nnext line \u00e9"'), line)
        self.assertFalse([l for l in self.d.output().splitlines() if l.startswith("next line")])

    def test_nul_in_a_decoded_parameter_is_refused(self):
        # rank=1%00junk once read as rank 1: now 400 on every route, and
        # nothing is withdrawn.
        self.register(61, "10.0.0.1:16061")
        c = self.conn()
        for method, target in (("DELETE", "/transfer_engine_info?rank=61%00junk"),
                               ("DELETE", "/transfer_engine_info?rank=61%00"),
                               ("GET", "/get_transfer_engine_info?rank=61%00"),
                               ("GET", "/rooms/5?rank=0%00"),
                               ("GET", "/failures?limit=1%00")):
            status, _, body = c.request(method, target)
            self.assertEqual((status, detail(body)), (400, NUL_DETAIL), target)
        self.assertEqual(self.lookup(61)[0], 200)
        # A NUL in the path is refused too.
        status, _, _ = c.request("GET", "/rooms/5%00")
        self.assertEqual(status, 400)

    # ---- framing ------------------------------------------------------------

    def test_pipelined_requests_answered_in_order(self):
        self.register(10, "10.0.0.10:1")
        c = self.conn()
        c.send(build("GET", "/health")
               + build("GET", "/get_transfer_engine_info?rank=10")
               + build("GET", "/nope")
               + build("PUT", "/register_transfer_engine_info", registration(11, "10.0.0.11:1"))
               + build("GET", "/get_transfer_engine_info?rank=11")
               + build("GET", "/get_transfer_engine_info?rank=12")
               + build("GET", "/health"))
        answers = [c.response() for _ in range(7)]
        self.assertEqual([a[0] for a in answers], [200, 200, 404, 200, 200, 404, 200])
        self.assertEqual(json.loads(answers[1][2])["rank"], 10)
        self.assertEqual(json.loads(answers[4][2])["remote_instance_transfer_engine_info"][0],
                         "10.0.0.11:1")
        self.assertEqual(answers[6][2], b"OK")

    def test_pipelined_byte_by_byte(self):
        c = self.conn()
        data = build("GET", "/health") * 3
        for i in range(len(data)):
            c.send(data[i:i + 1])
        self.assertEqual([c.response()[2] for _ in range(3)], [b"OK"] * 3)

    def test_chunked_body(self):
        payload = json.dumps(registration(20, "10.0.0.20:1", entries=50)).encode()
        c = self.conn()
        c.send("PUT /register_transfer_engine_info HTTP/1.1\r\nHost: t\r\n"
               "Transfer-Encoding: chunked\r\n\r\n")
        for i in range(0, len(payload), 97):
            piece = payload[i:i + 97]
            c.send(b"%x;ext=1\r\n" % len(piece))  # chunk extensions are allowed
            c.send(piece + b"\r\n")
        c.send(b"0\r\nX-Trailer: t\r\n\r\n")
        self.assertEqual(c.response()[:3:2], (200, b"OK"))
        data = self.lookup(20)[2]
        self.assertEqual(data["remote_instance_transfer_engine_info"][1],
                         registration(20, "x", entries=50)["transfer_engine_info"]["weights_info_dict"])
        self.assertEqual(c.request("GET", "/health")[2], b"OK")  # still usable

    def test_chunked_framing_rfc9112(self):
        # RFC 9112 7.1: CRLF after a chunk's data and after a chunk-size line, no
        # control byte in an extension.  http-parser alone took "XX" for the CRLF
        # (a strict proxy in front would split the stream elsewhere): a 400 naming
        # the fault, the connection closed, nothing stored.
        head = (b"PUT /register_transfer_engine_info HTTP/1.1\r\nHost: t\r\n"
                b"Transfer-Encoding: chunked\r\n\r\n")
        for rank, (size_line, after, want) in enumerate((
                (b"%x\r\n", b"XX", "chunk data not followed by CRLF"),
                (b"%x\r\n", b"\n", "chunk data not followed by CRLF"),
                (b"%x\rZ", b"\r\n", "chunk size line not ended by CRLF"),
                (b"%x;a=b\nc\r\n", b"\r\n", "chunk size line not ended by CRLF"),
                (b"%x;a=\x7f\r\n", b"\r\n", "control byte in a chunk extension")), 30):
            body = json.dumps(registration(rank, "cx:%d" % rank)).encode()
            raw = head + size_line % len(body) + body + after + b"0\r\n\r\n"
            for pieces in (1, len(raw)):  # whole, then byte by byte
                c = self.conn()
                c.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                step = -(-len(raw) // pieces)
                try:
                    for i in range(0, len(raw), step):
                        c.send(raw[i:i + step])
                except (BrokenPipeError, ConnectionResetError):
                    pass  # refused before the last byte: the answer is read below
                got = self.assert_error_then_close(c, 400)
                self.assertEqual(got, "Malformed HTTP request: " + want, raw)
                self.assertEqual(self.lookup(rank)[0], 404, raw)
        # well-framed, byte by byte: extensions (BWS too), trailers, then the
        # connection still serves the next request
        body = json.dumps(registration(39, "cx:39")).encode()
        raw = (head + b"%x ;a=b;c=\"d e\"\r\n" % 5 + body[:5] + b"\r\n"
               + b"%X\r\n" % (len(body) - 5) + body[5:] + b"\r\n00;z\r\nX-T: 1\r\n\r\n")
        c = self.conn()
        c.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for i in range(len(raw)):
            c.send(raw[i:i + 1])
        self.assertEqual(c.response()[:3:2], (200, b"OK"))
        self.assertEqual(self.lookup(39)[0], 200)
        self.assertEqual(c.request("GET", "/health")[2], b"OK")

    def test_expect_100_continue(self):
        payload = json.dumps(registration(21, "10.0.0.21:1")).encode()
        c = self.conn()
        c.send("PUT /register_transfer_engine_info HTTP/1.1\r\nHost: t\r\n"
               "Expect: 100-continue\r\nContent-Length: %d\r\n\r\n" % len(payload))
        self.assertEqual(c.read_until(b"\r\n\r\n"), b"HTTP/1.1 100 Continue\r\n\r\n")
        c.send(payload)
        self.assertEqual(c.response()[:3:2], (200, b"OK"))
        self.assertEqual(self.lookup(21)[0], 200)

    def test_expect_100_continue_too_large_gets_413_without_100(self):
        c = self.conn()
        c.send("PUT /register_transfer_engine_info HTTP/1.1\r\nHost: t\r\n"
               "Expect: 100-continue\r\nContent-Length: %d\r\n\r\n" % (MAX_BODY + 1))
        self.assertIn("too large", self.assert_error_then_close(c, 413))

    def test_oversized_framing_numbers_named(self):
        # all digits but above 2^64-1: the detail names Content-Length
        c = self.conn()
        c.send("PUT /register_transfer_engine_info HTTP/1.1\r\nHost: t\r\n"
               "Content-Length: 99999999999999999999999\r\n\r\n")
        self.assertIn("invalid Content-Length", self.assert_error_then_close(c, 400))
        # a chunk size above 2^64-1: the detail names the chunk size, not Content-Length
        c = self.conn()
        c.send("PUT /register_transfer_engine_info HTTP/1.1\r\nHost: t\r\n"
               "Transfer-Encoding: chunked\r\n\r\nFFFFFFFFFFFFFFFFFFFF\r\n")
        self.assertIn("invalid chunk size", self.assert_error_then_close(c, 400))
        self.assertEqual(self.conn().request("GET", "/health")[2], b"OK")

    def test_conflicting_framing_rejected_and_closed(self):
        both = "both Content-Length and Transfer-Encoding"
        two_cl = "more than one Content-Length header"
        cases = (
            ("POST /register_transfer_engine_info HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\n"
             "Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n", both),
            ("POST /register_transfer_engine_info HTTP/1.1\r\nHost: t\r\n"
             "Transfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n0\r\n\r\n", both),
            ("POST /register_transfer_engine_info HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\n"
             "Content-Length: 6\r\n\r\nabcdef", two_cl),
            ("POST /register_transfer_engine_info HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\n"
             "Content-Length: 5\r\n\r\nabcde", two_cl),
            ("POST /register_transfer_engine_info HTTP/1.1\r\nHost: t\r\n"
             "Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
             "duplicate Transfer-Encoding header"),
            ("POST /register_transfer_engine_info HTTP/1.1\r\nHost: t\r\n"
             "Content-Length : 5\r\n\r\nabcde", "whitespace in a header field name"),
            ("POST /register_transfer_engine_info HTTP/1.1\r\nHost: t\r\n"
             "Content-Length: -1\r\n\r\n", "invalid Content-Length"),
            # RFC 9112 3.2: more than one Host header field is a 400
            ("GET /health HTTP/1.1\r\nHost: t\r\nHost: u\r\n\r\n",
             "more than one Host header"),
            ("GET /health HTTP/1.1\r\nHost: t\r\nhost: t\r\n\r\n",
             "more than one Host header"),
        )
        for raw, want in cases:
            c = self.conn()
            c.send(raw + "GET /health HTTP/1.1\r\nHost: t\r\n\r\n")  # never answered
            got = self.assert_error_then_close(c, 400)
            self.assertIn(want, got, raw)
            self.assertNotIn("unexpected content-length", got, raw)
            self.assertEqual(c.buf, b"", raw)
        self.assert_health()

    def test_rfc9112_host_and_obs_fold(self):
        # RFC 9112 3.2: an HTTP/1.1 request without Host is a 400 (1.0 needs none)
        c = self.conn()
        c.send("GET /health HTTP/1.1\r\n\r\n")
        self.assertIn("no Host header", self.assert_error_then_close(c, 400))
        c = self.conn()
        c.send("GET /health HTTP/1.0\r\n\r\n")
        self.assertEqual(c.response()[0], 200)
        # RFC 9112 5.2: obs-fold (a header line continued on the next) is a 400
        for raw in ("GET /health HTTP/1.1\r\nHost: t\r\nX-A: 1\r\n 2\r\n\r\n",
                    "GET /health HTTP/1.1\r\nHost: t\r\nX-A: 1\r\n\t2\r\n\r\n",
                    "PUT /register_transfer_engine_info HTTP/1.1\r\nHost: t\r\n"
                    "Content-Length: 2\r\n 0\r\n\r\n{}"):
            c = self.conn()
            c.send(raw)
            self.assertIn("obs-fold", self.assert_error_then_close(c, 400), raw)
        self.assert_health()

    def test_percent_decoding_after_segmentation(self):
        # RFC 3986 2.2: %2F is data inside a segment, not a separator
        c = self.conn()
        status, _, body = c.request("GET", "/rooms/5%2Ffailure")
        self.assertEqual((status, detail(body).split(":")[0]), (400, "Invalid room id"))
        status, _, _ = c.request("PUT", "/rooms/5%2Ffailure", {"rank": 0, "reason": "x"})
        self.assertEqual(status, 405)  # the room route's methods, not the failure route's
        self.assertEqual(c.request("GET", "/rooms%2F5")[0], 404)
        self.assertEqual(c.request("GET", "/h%65alth")[0], 200)  # an escaped letter is a letter
        self.assertEqual(c.request("GET", "/rooms/5")[0], 404)  # unknown room, still routed

    def test_unsupported_transfer_coding_501(self):
        c = self.conn()
        c.send("POST /register_transfer_engine_info HTTP/1.1\r\nHost: t\r\n"
               "Transfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n")
        self.assert_error_then_close(c, 501)

    def test_megabyte_head_without_line_end_414_431(self):
        rss_before = self.d.rss_kib()
        for head, status, says in (
                (b"GET /" + b"a" * (1 << 20), 414, "URI too long"),
                (b"GET /health HTTP/1.1\r\nX-Big: " + b"b" * (1 << 20), 431, "too large"),
                (b"GET /health HTTP/1.1\r\n" + b"X-Many: 1\r\n" * 100000, 431, "too large")):
            c = self.conn()
            c.send(head)
            c.sock.shutdown(socket.SHUT_WR)
            self.assertIn(says, self.assert_error_then_close(c, status))
        # A whole 100 KB URL, request line ended: 414 URI Too Long (RFC 9110 15.5.15).
        c = self.conn()
        c.send(b"GET /get_transfer_engine_info?rank=0&x=" + b"y" * 100000 +
               b" HTTP/1.1\r\nHost: t\r\n\r\n")
        self.assertIn("URI too long", self.assert_error_then_close(c, 414))
        self.assert_health()
        # Nothing of the megabyte was kept (generous bound: allocator noise).
        self.assertLess(self.d.rss_kib() - rss_before, 32 * 1024)

    def test_oversized_body_413(self):
        c = self.conn()  # declared too large
        c.send("PUT /register_transfer_engine_info HTTP/1.1\r\nHost: t\r\n"
               "Content-Length: %d\r\n\r\n" % (MAX_BODY + 1))
        c.send(b"x" * 65536)
        self.assertIn("too large", self.assert_error_then_close(c, 413))
        c = self.conn()  # chunked, growing past the cap
        c.send("PUT /register_transfer_engine_info HTTP/1.1\r\nHost: t\r\n"
               "Transfer-Encoding: chunked\r\n\r\n")
        try:
            for _ in range(MAX_BODY // 65536 + 2):
                c.send(b"10000\r\n" + b"y" * 65536 + b"\r\n")
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server may stop reading once it has answered
        c.sock.shutdown(socket.SHUT_WR)
        self.assertIn("too large", self.assert_error_then_close(c, 413))
        self.assert_health()

    def test_garbage_bytes_400_server_keeps_serving(self):
        for junk in (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + bytes(range(256)),
                     b"hello world\r\n\r\n",
                     b"GET / HTTP/9.9\r\n\r\n",
                     b"\x00" * 100,
                     b"GET /health HTTP/1.1\r\nBad Header Line\r\n\r\n"):
            c = self.conn()
            c.send(junk)
            self.assert_error_then_close(c, 400)
            self.assert_health()

    def test_http10_and_connection_close(self):
        c = self.conn()  # HTTP/1.0: answered, then closed
        c.send(build("GET", "/health", version="HTTP/1.0"))
        status, headers, body = c.response()
        self.assertEqual((status, body, headers.get("connection")), (200, b"OK", "close"))
        self.assertTrue(c.at_eof())
        c = self.conn()  # HTTP/1.0 keep-alive: stays open
        for _ in range(2):
            c.send(build("GET", "/health", headers=["Connection: keep-alive"], version="HTTP/1.0"))
            status, headers, body = c.response()
            self.assertEqual((status, body, headers.get("connection")), (200, b"OK", "keep-alive"))
        c = self.conn()  # HTTP/1.1 Connection: close, with more pipelined behind it
        c.send(build("GET", "/health", headers=["Connection: close"]) + build("GET", "/health"))
        status, headers, _ = c.response()
        self.assertEqual((status, headers.get("connection")), (200, "close"))
        self.assertTrue(c.at_eof())
        self.assertEqual(c.buf, b"")

    def test_client_half_close_still_answered(self):
        c = self.conn()
        c.send(build("GET", "/health") + build("GET", "/health"))
        c.sock.shutdown(socket.SHUT_WR)
        self.assertEqual([c.response()[2] for _ in range(2)], [b"OK", b"OK"])
        self.assertTrue(c.at_eof())

    def test_thousands_of_connections(self):
        """More ready connections than SQ entries (1024): every one answered."""
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        n = min(3000, hard - 200)
        if soft < n + 100:
            resource.setrlimit(resource.RLIMIT_NOFILE, (n + 100, hard))
        self.register(80, "10.0.0.80:1")
        conns = []
        try:
            for _ in range(n):
                conns.append(Conn(self.d.port))
            request = build("GET", "/get_transfer_engine_info?rank=80") + build("GET", "/health")
            for c in conns:  # all of them become ready at about the same time
                c.send(request)
            for c in conns:
                self.assertEqual(c.response()[0], 200)
                self.assertEqual(c.response()[2], b"OK")
        finally:
            for c in conns:
                c.close()
        self.assert_health()

    # ---- long-poll --------------------------------------------------------------

    def test_wait_ms_woken_by_registration(self):
        c = self.conn()
        c.send(build("GET", "/get_transfer_engine_info?rank=70&wait_ms=60000")
               + build("GET", "/health"))  # pipelined behind the parked lookup
        c.sock.settimeout(0.3)
        with self.assertRaises(socket.timeout):  # parked: nothing answered yet
            c.response()
        c.sock.settimeout(TIMEOUT)
        self.assert_health()  # the loop serves others meanwhile
        self.register(70, "10.0.0.70:1")
        status, _, body = c.response()
        self.assertEqual(status, 200)
        self.assertEqual(json.loads(body)["remote_instance_transfer_engine_info"][0],
                         "10.0.0.70:1")
        self.assertEqual(c.response()[2], b"OK")

    def test_wait_ms_many_parked_then_expiry(self):
        waiting = []
        for _ in range(20):
            c = self.conn()
            c.send(build("GET", "/get_transfer_engine_info?rank=71&wait_ms=60000"))
            waiting.append(c)
        self.register(72, "10.0.0.72:1")  # another rank: they keep waiting
        self.register(71, "10.0.0.71:1")
        for c in waiting:
            self.assertEqual(c.response()[0], 200)
        c = self.conn()  # a short wait for a rank that never comes: 404
        status, _, body = c.request("GET", "/get_transfer_engine_info?rank=73&wait_ms=200")
        self.assertEqual((status, detail(body)), (404, "No transfer engine info for rank 73"))


class LimitsTest(unittest.TestCase):
    """Daemons with small limits of their own."""

    def test_connection_cap(self):
        """At the cap, connections busy with a request are never closed to
        make room: a new one waits (a second at most), then gets 503."""
        d = Daemon("--max-conns", "4")
        try:
            held = [Conn(d.port) for _ in range(4)]  # each with a body on its way
            for c in held:
                c.send("PUT /register_transfer_engine_info HTTP/1.1\r\nHost: t\r\n"
                       "Content-Length: 1000\r\n\r\n{")
            time.sleep(0.5)  # older than the eviction deadline, yet busy
            extra = Conn(d.port)
            status, headers, body = extra.response()
            self.assertEqual((status, headers.get("connection")), (503, "close"))
            self.assertEqual(detail(body), "Too many connections")
            held[0].close()
            deadline = time.monotonic() + TIMEOUT
            while time.monotonic() < deadline:  # the freed slot is reused
                c = Conn(d.port)
                try:
                    if c.request("GET", "/health")[0] == 200:
                        break
                except (EOFError, ConnectionResetError):
                    pass
                finally:
                    c.close()
                time.sleep(0.05)
            else:
                self.fail("a freed connection slot was not reused")
            for c in held[1:] + [extra]:
                c.close()
        finally:
            self.assertEqual(d.stop(), 0, d.output())

    def test_connection_cap_closes_idle_first(self):
        """At the cap, an idle keep-alive connection (its last answer long
        made) is closed to serve a new one; the busy ones stay."""
        d = Daemon("--max-conns", "4")
        try:
            busy = [Conn(d.port) for _ in range(3)]
            for i, c in enumerate(busy):
                c.send(build("GET", "/get_transfer_engine_info?rank=%d&wait_ms=60000" % (90 + i)))
            idle = Conn(d.port)
            self.assertEqual(idle.request("GET", "/health")[2], b"OK")
            time.sleep(0.5)  # older than the eviction deadline (250 ms)
            fresh = Conn(d.port)
            self.assertEqual(fresh.request("GET", "/health")[2], b"OK")
            self.assertTrue(idle.at_eof())  # the idle one made room
            c = Conn(d.port)  # the parked ones are still there and answered
            self.assertEqual(c.request("PUT", "/register_transfer_engine_info",
                                       registration(90, "10.0.0.9:1"))[0], 200)
            self.assertEqual(busy[0].response()[0], 200)
            for c2 in busy + [fresh, c]:
                c2.close()
            self.assertIn("connection_cap_evict", d.output())
        finally:
            self.assertEqual(d.stop(), 0, d.output())

    def test_large_answer_to_slow_reader(self):
        """An answer larger than the socket buffers (about 7 MB) leaves in many
        short sends, intact, and the pipelined request behind it follows."""
        d = Daemon("--max-body-bytes", "32M")
        c = Conn(d.port)
        try:
            entries = 140000
            status, _, body = c.request("PUT", "/register_transfer_engine_info",
                                        registration(1, "10.0.0.1:1", entries=entries))
            self.assertEqual((status, body), (200, b"OK"))
            c.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
            c.send(build("GET", "/get_transfer_engine_info?rank=1") + build("GET", "/health"))
            time.sleep(0.2)  # let the server fill the socket buffers first
            status, _, body = c.response()
            self.assertEqual(status, 200)
            self.assertGreater(len(body), 4 << 20)
            data = json.loads(body)
            self.assertEqual(data["remote_instance_transfer_engine_info"][1],
                             registration(1, "x", entries=entries)
                             ["transfer_engine_info"]["weights_info_dict"])
            self.assertEqual(c.response()[2], b"OK")
        finally:
            c.close()
            self.assertEqual(d.stop(), 0, d.output())

    def test_header_timeout_closes_slow_head(self):
        d = Daemon("--header-timeout", "1")
        try:
            c = Conn(d.port)
            c.send("GET /health HTTP/1.1\r\nHost: t\r\n")  # and never the blank line
            self.assertTrue(c.at_eof())
            c.close()
            idle = Conn(d.port)  # a connection that never sends is closed too
            self.assertTrue(idle.at_eof())
            idle.close()
        finally:
            self.assertEqual(d.stop(), 0, d.output())

    def test_sigterm_exits_0_with_clients_connected(self):
        d = Daemon()
        clients = []
        try:
            for i in range(3):
                c = Conn(d.port)
                self.assertEqual(c.request("GET", "/health")[2], b"OK")
                clients.append(c)
            parked = Conn(d.port)
            parked.send(build("GET", "/get_transfer_engine_info?rank=3&wait_ms=60000"))
            clients.append(parked)
            busy = Conn(d.port)  # a large registration, maybe still being stored
            busy.send(build("PUT", "/register_transfer_engine_info",
                            registration(4, "10.0.0.4:1", entries=20000)))
            clients.append(busy)
            time.sleep(0.2)
        finally:
            status = d.stop(signal.SIGTERM)
            for c in clients:
                c.close()
        self.assertEqual(status, 0, d.output())
        self.assertIn("signal name=Terminated", d.output())

    def test_sigterm_answers_parked_lookups_503(self):
        d = Daemon()
        parked = []
        try:
            for rank in (5, 6):
                c = Conn(d.port)
                c.send(build("GET", "/get_transfer_engine_info?rank=%d&wait_ms=60000" % rank))
                parked.append(c)
            parked[0].sock.settimeout(0.3)
            with self.assertRaises(socket.timeout):  # parked: nothing answered yet
                parked[0].response()
            parked[0].sock.settimeout(TIMEOUT)
            d.proc.send_signal(signal.SIGTERM)
            for c in parked:  # each answered, not dropped
                status, headers, body = c.response()
                self.assertEqual((status, detail(body)), (503, "kvcoordd is stopping"),
                                 d.output())
                self.assertEqual(headers.get("connection", "").lower(), "close")
                self.assertTrue(c.at_eof())
        finally:
            status = d.stop(signal.SIGTERM)
            for c in parked:
                c.close()
        self.assertEqual(status, 0, d.output())

    def test_ipv6_listen(self):
        try:
            with socket.socket(socket.AF_INET6) as probe:
                probe.bind(("::1", 0))
        except OSError:
            self.skipTest("no IPv6 loopback here")
        d = Daemon(host="::1")
        try:
            with socket.create_connection(("::1", d.port), timeout=TIMEOUT) as sock:
                sock.sendall(build("GET", "/health"))
                self.assertTrue(sock.recv(4096).startswith(b"HTTP/1.1 200 OK\r\n"))
        finally:
            self.assertEqual(d.stop(), 0, d.output())

    def test_sigint_exits_0(self):
        d = Daemon()
        self.assertEqual(d.stop(signal.SIGINT), 0, d.output())


class CliTest(unittest.TestCase):
    def run_daemon(self, *args):
        return subprocess.run([ARGS.daemon] + list(args), capture_output=True, text=True,
                              timeout=60, check=False)

    def test_help_and_version(self):
        p = self.run_daemon("--help")
        self.assertEqual(p.returncode, 0)
        for word in ("--listen", "--segment", "--fresh", "--world-size", "--max-ranks",
                     "--max-info-bytes", "--max-body-bytes", "--max-conns", "--log-level",
                     "Exit status", "Examples"):
            self.assertIn(word, p.stdout)
        p = self.run_daemon("--version")
        self.assertEqual(p.returncode, 0)
        self.assertRegex(p.stdout, r"kvcoordd \d+\.\d+\.\d+ \(segment layout version \d+\)")

    def test_usage_errors_exit_2(self):
        for args in (["--bogus"], ["--listen"], ["--listen", "nocolon"],
                     ["--listen", "::1:80"], ["--listen", "127.0.0.1:70000"],
                     ["--segment", "../x"], ["--max-conns", "0"], ["--max-info-bytes", "12X"],
                     ["--max-body-bytes", "-5"], ["--log-level", "loud"], ["extra"]):
            p = self.run_daemon(*args)
            self.assertEqual(p.returncode, 2, (args, p.stderr))
            self.assertIn("kvcoordd:", p.stderr)
        # an option where a value belongs is not taken as the value (it was:
        # "invalid --listen '--segment'"), for every option with a value;
        # "--opt=--x" still passes a value starting with "--"
        for opt in ("--listen", "--segment", "--max-conns", "--log-level", "--etcd"):
            p = self.run_daemon(opt, "--segment", "x")
            self.assertEqual(p.returncode, 2, (opt, p.stderr))
            self.assertIn("kvcoordd: option '%s' needs a value ('--segment' follows it)" % opt,
                          p.stderr)
        p = self.run_daemon("--log-level=--x")
        self.assertEqual(p.returncode, 2, p.stderr)
        self.assertIn("--log-level", p.stderr)
        self.assertIn("'--x'", p.stderr)
        self.assertNotIn("needs a value", p.stderr)

    def test_each_option_states_one_range(self):
        # Every wrong value of an option (0, past the top, not a number) gets
        # one message naming the one range accepted: nothing inside it is
        # refused later (a number past 32 for --world-size, past the
        # segment's limits for the capacities).
        cases = [("--world-size", ["0", "33", "x"], "expected an integer in 1..32: "),
                 ("--max-ranks", ["0", "1048577", "x"], "expected an integer in 1..1048576)"),
                 ("--max-procs", ["0", "1048577"], "expected an integer in 1..1048576)"),
                 ("--max-rooms", ["0", "4194305"], "expected an integer in 1..4194304)"),
                 ("--arena-bytes", ["0", "1000", "1025G", "x"], "expected a SIZE in 1K..1024G)"),
                 ("--max-info-bytes", ["0", "63", "513G"], "expected a SIZE in 64..512G, "),
                 ("--max-header-bytes", ["0", "1023", "81K", "x"], "expected a SIZE in 1K..80K: ")]
        for opt, values, text in cases:
            for v in values:
                p = self.run_daemon(opt, v)
                self.assertEqual(p.returncode, 2, (opt, v, p.stderr))
                self.assertIn("kvcoordd: invalid %s '%s' (%s" % (opt, v, text), p.stderr)
        # inside their own ranges, refused for another option's value (exit 2
        # before anything is created, naming both)
        p = self.run_daemon("--max-info-bytes", "600M")  # the arena is 1G
        self.assertEqual(p.returncode, 2, p.stderr)
        self.assertIn("--max-info-bytes 629145600 is above half of --arena-bytes 1073741824",
                      p.stderr)
        p = self.run_daemon("--world-size", "16", "--max-ranks", "8")
        self.assertEqual(p.returncode, 2, p.stderr)
        self.assertIn("--world-size 16 is above --max-ranks 8", p.stderr)
        help_text = self.run_daemon("--help").stdout
        for word in ("1..32", "1..1048576", "1K..1024G", "1K..80K", "1..4194304"):
            self.assertIn(word, help_text)

    def test_listen_failure_exits_1(self):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            s.listen()
            port = s.getsockname()[1]
            p = self.run_daemon("--listen", "127.0.0.1:%d" % port, "--segment",
                                "kvctest-http-raw-busy-%d" % os.getpid())
        self.assertEqual(p.returncode, 1, p.stderr)
        self.assertIn("listen_failed", p.stderr)


class SecondDaemonTest(unittest.TestCase):
    def test_second_daemon_on_a_served_segment_refused(self):
        d = Daemon()
        try:
            for extra in ([], ["--fresh"]):  # reuse, or discard: both refused
                p = subprocess.run([ARGS.daemon, "--listen", "127.0.0.1:0", "--segment",
                                    d.segment] + extra, capture_output=True, text=True,
                                   timeout=60, check=False)
                self.assertEqual(p.returncode, 1, (extra, p.stderr))
                self.assertTrue("another kvcoordd" in p.stderr or "is in use" in p.stderr,
                                p.stderr)
            # The first one still serves its segment.
            c = Conn(d.port)
            c.send(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            self.assertEqual(c.response()[0], 200)
            c.close()
        finally:
            self.assertEqual(d.stop(), 0)


def main():
    global ARGS
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser()
    ap.add_argument("--daemon", default=os.path.join(here, "..", "..", "build", "kvcoordd"))
    ARGS, rest = ap.parse_known_args()
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)


if __name__ == "__main__":
    main()
