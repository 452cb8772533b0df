#!/usr/bin/python3
"""Tests of `kvcoord-bench rate` (tools/bench/bench_rate.c), the open-loop HTTP
load generator: it must send exactly the requests due in the measured window,
count every answer once, and count non-2xx answers, connections closed
without an answer and late answers as failed.  No timing is asserted: only
counts, which do not depend on how fast the machine is.

Usage: test_bench_rate.py --bench PATH/kvcoord-bench [unittest args]
"""

import argparse
import http.server
import json
import subprocess
import sys
import threading
import unittest

ARGS = None


class Handler(http.server.BaseHTTPRequestHandler):
    """/ok 200 with a body; /fail 500; /close 200 then close; /chunked a
    chunked 200; /drop closes without answering."""

    protocol_version = "HTTP/1.1"
    counts = {}
    lock = threading.Lock()

    def log_message(self, *args):
        pass

    def do_GET(self):
        path = self.path
        with Handler.lock:
            Handler.counts[path] = Handler.counts.get(path, 0) + 1
        body = b'{"session_id":"x"}' * 50
        if path == "/drop":
            self.close_connection = True
            return
        if path == "/chunked":
            self.send_response(200)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for part in (body[:100], body[100:]):
                self.wfile.write(b"%x\r\n%s\r\n" % (len(part), part))
            self.wfile.write(b"0\r\n\r\n")
            return
        self.send_response(500 if path == "/fail" else 200)
        self.send_header("Content-Length", str(len(body)))
        if path == "/close":
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        self.wfile.write(body)


class RateTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        cls.server.daemon_threads = True
        cls.url = "http://127.0.0.1:%d" % cls.server.server_address[1]
        cls.thread = threading.Thread(target=cls.server.serve_forever, daemon=True)
        cls.thread.start()

    @classmethod
    def tearDownClass(cls):
        cls.server.shutdown()
        cls.server.server_close()

    def run_rate(self, *args, check=True):
        proc = subprocess.run([ARGS.bench, "rate"] + list(args), capture_output=True,
                              text=True, timeout=120, check=False)
        if check and proc.returncode != 0:
            raise AssertionError("rate exited %d: %s" % (proc.returncode, proc.stderr))
        return proc

    def measure(self, path, rate=100, seconds=1, conns=4):
        """--warmup 0: the requests due are exactly rate * seconds."""
        with Handler.lock:
            Handler.counts.pop(path, None)
        proc = self.run_rate("--url", self.url, "--path", path, "--rate", str(rate),
                             "--duration", str(seconds), "--warmup", "0",
                             "--connections", str(conns), "--json")
        out = json.loads(proc.stdout)
        with Handler.lock:
            served = Handler.counts.get(path, 0)
        return out, served

    def accounted(self, out, due):
        """Every request due in the counted window is counted once: answered,
        failed or dropped (a connection's queue full: this Python server can
        stall for seconds on a loaded machine, and the tool then drops rather
        than send late).  Returns how many were answered."""
        done = round(out["completed_per_s"] * out["seconds"])
        self.assertEqual(done + out["failed"] + out["dropped"], due, out)
        return done

    def test_every_due_request_answered_once(self):
        out, served = self.measure("/ok", rate=200, seconds=1)
        done = self.accounted(out, 200)
        if out["dropped"] or out["failed"]:  # the server stalled (a loaded machine)
            self.assertGreaterEqual(served, done, out)
        else:
            self.assertEqual(served, 200, out)
            self.assertEqual(out["reconnects"], 0, out)
        lat, svc = out["latency_us"], out["service_us"]
        self.assertTrue(0 < lat["p50"] <= lat["p90"] <= lat["p99"] <= lat["p99_9"] <= lat["max"])
        # Latency counts from when a request was due, service from when it was
        # written (never earlier), so latency is never the smaller.
        self.assertGreaterEqual(lat["max"], svc["max"])

    def test_warmup_requests_sent_not_counted(self):
        with Handler.lock:
            Handler.counts.pop("/ok", None)
        proc = self.run_rate("--url", self.url, "--path", "/ok", "--rate", "100",
                             "--duration", "1", "--warmup", "1", "--connections", "8", "--json")
        out = json.loads(proc.stdout)
        done = self.accounted(out, 100)
        with Handler.lock:
            served = Handler.counts.get("/ok", 0)
        if out["dropped"] or out["failed"]:  # the server stalled (a loaded machine)
            self.assertGreater(served, done, out)  # the warmup's were sent too
        else:
            self.assertEqual(served, 200, out)

    def test_non_2xx_is_failed(self):
        out, served = self.measure("/fail")
        self.assertEqual(out["failed"], 100)
        self.assertEqual((out["non_2xx"], out["last_non_2xx_status"]), (100, 500))
        self.assertEqual(out["completed_per_s"], 0)
        self.assertIsNone(out["latency_us"]["p50"])
        self.assertEqual(served, 100)
        # The table says why they failed.
        proc = self.run_rate("--url", self.url, "--path", "/fail", "--rate", "20",
                             "--duration", "1", "--warmup", "0", "--connections", "1")
        self.assertIn("20 answered with a status outside 2xx (the last: 500)", proc.stdout)

    def test_connection_close_reopens(self):
        out, served = self.measure("/close")
        self.assertEqual(round(out["completed_per_s"]), 100)
        self.assertEqual(out["reconnects"], 100)
        self.assertEqual(out["failed"], 0)
        self.assertEqual(served, 100)

    def test_chunked_answers_framed(self):
        out, served = self.measure("/chunked")
        self.assertEqual(round(out["completed_per_s"]), 100)
        self.assertEqual((out["failed"], served), (0, 100))

    def test_closed_without_answer_is_failed(self):
        out, served = self.measure("/drop", conns=2)
        self.assertEqual(out["failed"], 100)
        self.assertEqual(out["non_2xx"], 0)
        self.assertEqual(out["completed_per_s"], 0)
        self.assertEqual(served, 100)

    def test_table_output(self):
        proc = self.run_rate("--url", self.url, "--path", "/ok", "--rate", "50",
                             "--duration", "1", "--warmup", "0", "--connections", "1")
        self.assertIn("50 req/s offered on 1 connections", proc.stdout)
        self.assertRegex(proc.stdout, r"(?m)^latency\s+[\d.]+")
        self.assertRegex(proc.stdout, r"(?m)^service\s+[\d.]+")

    def test_usage_errors(self):
        bad = [
            [],
            ["--rate", "10"],
            ["--url", self.url],
            ["--url", "https://127.0.0.1:1", "--rate", "10"],
            ["--url", "http://127.0.0.1", "--rate", "10"],
            ["--url", "http://127.0.0.1:70000", "--rate", "10"],
            ["--url", self.url + "/x", "--rate", "10"],
            ["--url", self.url, "--rate", "0"],
            ["--url", self.url, "--rate", "nan"],
            ["--url", self.url, "--rate", "10", "--connections", "0"],
            ["--url", self.url, "--rate", "10", "--connections", "1.5"],
            ["--url", self.url, "--rate", "10", "--duration", "0"],
            ["--url", self.url, "--rate", "10", "--path", "no-slash"],
            ["--url", self.url, "--rate", "10", "--path", "/a b"],
            ["--url", self.url, "--rate", "10", "--bogus"],
            ["--url", self.url, "--rate", "10", "extra"],
            ["--rate"],
        ]
        for args in bad:
            with self.subTest(args=args):
                proc = self.run_rate(*args, check=False)
                self.assertEqual(proc.returncode, 2, proc.stderr)
                self.assertIn("kvcoord-bench rate:", proc.stderr)
                self.assertEqual(proc.stdout, "")

    def test_refused_is_runtime_error(self):
        # Bind a port and close it again: nobody listens there.
        import socket
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()
        proc = self.run_rate("--url", "http://127.0.0.1:%d" % port, "--rate", "10",
                             "--duration", "1", check=False)
        self.assertEqual(proc.returncode, 1)
        self.assertIn("cannot connect", proc.stderr)

    def test_help(self):
        proc = self.run_rate("--help")
        self.assertIn("open-loop", proc.stdout)
        self.assertIn("Exit status", proc.stdout)


def main():
    global ARGS
    parser = argparse.ArgumentParser()
    parser.add_argument("--bench", required=True)
    ARGS, rest = parser.parse_known_args()
    unittest.main(argv=[sys.argv[0]] + rest)


if __name__ == "__main__":
    main()
