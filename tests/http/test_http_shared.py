#!/usr/bin/python3
"""Heavy answers rendered once and shared (issue 30, "answers under load").

- GET /metrics, answered on the event loop: the requests the loop answers
  from one batch of completions share one rendering, queued by reference
  (kvcoord_http_answer_shared_sends_total grows by one per answer).  The
  code before rendered and copied the text per request: no shared send.
- GET /failures, /metrics when stale, GET /route (PD) run on a helper
  thread: a request identical to one whose job no thread has begun yet
  joins it and is sent the same bytes; 40 clients asking at once cost
  fewer renderings than requests, every answer equal.  The code before
  rendered each (40 renderings of a large answer).

Usage: test_http_shared.py [--daemon PATH] [unittest args]
"""

import argparse
import os
import sys
import unittest

import test_http_raw as raw
from test_http_raw import Daemon

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
from kvctest import connect, read_answer, scrape  # noqa: E402  (the tests' one helper module)


class Shared(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.d = Daemon()
        # 300 failure records with long reasons: /failures is ~100 KB.
        s = connect(cls.d.port)
        reqs = []
        for room in range(1, 301):
            body = ('{"rank":0,"reason":"%s","code":5}' % ("r%d " % room * 40)[:250]).encode()
            reqs.append(b"PUT /rooms/%d/failure HTTP/1.1\r\nHost: x\r\nContent-Type: "
                        b"application/json\r\nContent-Length: %d\r\n\r\n%s"
                        % (room, len(body), body))
        s.sendall(b"".join(reqs))
        buf = b""
        for _ in reqs:
            status, body, buf = read_answer(s, buf)
            assert status == 200, (status, body)
        s.close()

    @classmethod
    def tearDownClass(cls):
        rc = cls.d.stop()
        assert rc == 0 and "Sanitizer" not in cls.d.output(), cls.d.output()[-4000:]

    def test_metrics_pipelined_share_renderings(self):
        n = 64
        before = scrape(self.d.port)
        s = connect(self.d.port)
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n" * n)
        buf = b""
        for _ in range(n):
            status, body, buf = read_answer(s, buf)
            self.assertEqual(status, 200)
            self.assertIn(b"kvcoord_http_requests_total", body)
        s.close()
        after = scrape(self.d.port)
        renders = after["kvcoord_http_answer_renders_total"] - before[
            "kvcoord_http_answer_renders_total"]
        shared = after["kvcoord_http_answer_shared_sends_total"] - before[
            "kvcoord_http_answer_shared_sends_total"]
        print("\n/metrics x%d pipelined: %d renderings, %d shared sends" % (n, renders, shared))
        self.assertGreaterEqual(shared, n)  # every answer sent by reference
        self.assertLessEqual(renders, n // 4 + 1)  # and rendered far fewer times

    def test_failures_at_once_share_renderings(self):
        n = 40
        req = b"GET /failures?limit=1024 HTTP/1.1\r\nHost: x\r\n\r\n"
        want = None
        socks = [connect(self.d.port) for _ in range(n)]
        before = scrape(self.d.port)
        for s in socks:
            s.sendall(req)
        bodies = []
        for s in socks:
            status, body, _ = read_answer(s, b"")
            self.assertEqual(status, 200)
            bodies.append(body)
            s.close()
        after = scrape(self.d.port)
        s = connect(self.d.port)
        s.sendall(req)
        _, want, _ = read_answer(s, b"")
        s.close()
        renders = after["kvcoord_http_answer_renders_total"] - before[
            "kvcoord_http_answer_renders_total"]
        print("\n/failures x%d at once (%d bytes): %d renderings" % (n, len(want), renders))
        self.assertGreater(len(want), 4096)
        for b in bodies:  # the same answer, and the state's
            self.assertEqual(b, want)
        # The scrapes' own renderings (one each) included.
        self.assertLessEqual(renders, n // 2)


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser()
    ap.add_argument("--daemon", default=os.path.join(here, "..", "..", "build", "kvcoordd"))
    args, rest = ap.parse_known_args()
    raw.ARGS = args
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)


if __name__ == "__main__":
    main()
