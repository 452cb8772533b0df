#!/usr/bin/python3
"""--body-timeout counts from each request's own head: a keep-alive
connection's second request, pipelined behind a first one with a body,
is closed no earlier than --body-timeout after its own head was sent.

(Before the fix its deadline was the first request's body start plus the
timeout: the start was kept when the first request was deferred to the
helper thread or ended in the same pass, so a slow body was cut early -
the trial's 61 of 200 slow bodies closed at ~45 s of 60.)  No wall-clock
upper bound: only "not earlier than".

Usage: test_http_body_timeout.py --daemon KVCOORDD [unittest args]
"""

import argparse
import json
import os
import socket
import sys
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))
from kvctest import Daemon, new_name  # noqa: E402

ARGS = None
BODY_TIMEOUT = 2  # seconds, --body-timeout


def put_head(length):
    return ("PUT /register_transfer_engine_info HTTP/1.1\r\nHost: t\r\n"
            "Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % length).encode()


class BodyTimeout(unittest.TestCase):
    def setUp(self):
        self.d = Daemon(new_name("bodyto"), ["--body-timeout", str(BODY_TIMEOUT)],
                        exe=ARGS.daemon)

    def tearDown(self):
        self.d.stop()

    def test_second_request_gets_its_own_body_deadline(self):
        body1 = json.dumps({"tp_rank": 0, "transfer_engine_info": {
            "session_id": "s0", "weights_info_dict": {"w": [1, 2, 3]}}}).encode()
        s = socket.create_connection(("127.0.0.1", self.d.port))
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        # Request 1: its head and half its body, the rest most of the body
        # timeout later, together with request 2's head and 1 byte of its
        # 100-byte body (which never comes).
        s.sendall(put_head(len(body1)) + body1[:10])
        time.sleep(BODY_TIMEOUT * 0.75)
        s.sendall(body1[10:] + put_head(100) + b"{")
        sent = time.monotonic()
        got = b""
        while True:
            b = s.recv(65536)
            if not b:
                break
            got += b
        closed = time.monotonic() - sent
        s.close()
        self.assertTrue(got.startswith(b"HTTP/1.1 200 "), got[:200])
        self.assertGreaterEqual(closed, BODY_TIMEOUT - 0.05,  # the loop's ms clock
                                "request 2 cut %.2f s after its head, --body-timeout %d: %r"
                                % (closed, BODY_TIMEOUT, got[-300:]))
        self.assertIn("body_timeout", self.d.output())


def main():
    global ARGS
    p = argparse.ArgumentParser()
    p.add_argument("--daemon", required=True)
    ARGS, rest = p.parse_known_args()
    prog = unittest.main(argv=[sys.argv[0]] + rest, exit=False, verbosity=2)
    return 0 if prog.result.wasSuccessful() else 1


if __name__ == "__main__":
    sys.exit(main())
