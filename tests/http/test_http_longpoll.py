#!/usr/bin/python3
"""kvcoordd's long-poll lookup, GET /get_transfer_engine_info?rank=N&wait_ms=M,
with many waiters parked at once.

- 150 connections park on one absent rank with a wait far longer than the
  test (wait_ms=600000); a registration of the rank must answer every one
  of them 200 with the registered info.  The daemon caps a wait at 60 s
  (ROUTES_MAX_WAIT_MS), when it answers 200 too, the rank being there:
  each client gives up at 40 s, so an answer that only the wait's expiry
  would give fails the test instead of passing late.
- The same with the waiters on several ranks, registered one at a time:
  each registration answers its own waiters, the others stay parked.

Written for a report that a crowd of 100-200 waiters was answered only at
each one's expiry (some 404).  That came from the reproduction, not the
daemon: 200 shell-spawned curls on a loaded 2-core machine started over
13-20 s, more than their wait_ms, so curl's time_total (from each curl's
own start) spread, and the earliest expired, rightly 404, before the
registration.  Here every waiter is connected and parked first; the daemon
answered 200 and 500 waiters 8-13 ms after the registration (load 25).

Usage: test_http_longpoll.py [--daemon PATH] [unittest args]
"""

import argparse
import json
import os
import selectors
import sys
import time
import unittest

import test_http_raw as raw
from test_http_raw import Daemon

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
from kvctest import answer_complete, connect, read_answer  # noqa: E402  (tests/python)

WAITERS = 150
WAIT_MS = 600000
CLIENT_TIMEOUT = 40  # below the daemon's 60 s cap on a wait: only a wake answers in time


def open_waiter(port, rank):
    s = connect(port, timeout=CLIENT_TIMEOUT)
    s.sendall(("GET /get_transfer_engine_info?rank=%d&wait_ms=%d HTTP/1.1\r\n"
               "Host: x\r\n\r\n" % (rank, WAIT_MS)).encode())
    return s


def collect(socks):
    """{sock: bytes of its answer}; raises on a socket silent CLIENT_TIMEOUT s."""
    sel = selectors.DefaultSelector()
    got = {}
    for s in socks:
        s.setblocking(False)
        sel.register(s, selectors.EVENT_READ)
        got[s] = b""
    deadline = time.monotonic() + CLIENT_TIMEOUT
    left = set(socks)
    while left:
        wait = deadline - time.monotonic()
        if wait <= 0:
            raise AssertionError("%d of %d waiters unanswered %d s after the registration"
                                 % (len(left), len(socks), CLIENT_TIMEOUT))
        for key, _ in sel.select(wait):
            s = key.fileobj
            chunk = s.recv(65536)
            got[s] += chunk
            if not chunk or answer_complete(got[s]):
                sel.unregister(s)
                left.discard(s)
    sel.close()
    return got


def silent(socks, seconds):
    """True if none of socks has anything to read within seconds."""
    sel = selectors.DefaultSelector()
    for s in socks:
        sel.register(s, selectors.EVENT_READ)
    ready = sel.select(seconds)
    sel.close()
    return not ready


def register(d, rank):
    """(status, body) of rank's registration on a connection of its own."""
    body = json.dumps({"rank": rank, "transfer_engine_info": {
        "session_id": "127.0.0.1:%d" % (20000 + rank), "weights_info_dict": {}}}).encode()
    s = connect(d.port, timeout=CLIENT_TIMEOUT)
    try:
        s.sendall(b"PUT /register_transfer_engine_info HTTP/1.1\r\nHost: x\r\n"
                  b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n"
                  % len(body) + body)
        status, answer, _ = read_answer(s)
        return status, answer
    finally:
        s.close()


class LongPollCrowd(unittest.TestCase):
    def setUp(self):
        self.d = Daemon("--max-conns", "1024")
        self.socks = []

    def tearDown(self):
        for s in self.socks:
            s.close()
        self.assertEqual(self.d.stop(), 0)

    def park(self, ranks):
        by_rank = {}
        for i in range(WAITERS):
            rank = ranks[i % len(ranks)]
            s = open_waiter(self.d.port, rank)
            self.socks.append(s)
            by_rank.setdefault(rank, []).append(s)
        # Parked, not answered: nothing comes back while the rank is absent.
        self.assertTrue(silent(self.socks, 1.0), "a waiter was answered before the registration")
        return by_rank

    def check_answers(self, got, rank):
        for s, data in got.items():
            self.assertTrue(data.startswith(b"HTTP/1.1 200 "), data[:200])
            body = json.loads(data.split(b"\r\n\r\n", 1)[1])
            self.assertEqual(body["rank"], rank)
            self.assertEqual(body["remote_instance_transfer_engine_info"][0],
                             "127.0.0.1:%d" % (20000 + rank))

    def test_registration_answers_every_waiter(self):
        by_rank = self.park([703])
        self.assertEqual(register(self.d, 703)[0], 200)
        self.check_answers(collect(by_rank[703]), 703)

    def test_each_registration_answers_its_own_waiters(self):
        ranks = [11, 12, 13]
        by_rank = self.park(ranks)
        for i, rank in enumerate(ranks):
            self.assertEqual(register(self.d, rank)[0], 200)
            self.check_answers(collect(by_rank[rank]), rank)
            rest = [s for r in ranks[i + 1:] for s in by_rank[r]]
            if rest:
                self.assertTrue(silent(rest, 0.5), "a waiter of another rank was answered")


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser()
    ap.add_argument("--daemon", default=os.path.join(here, "..", "..", "build", "kvcoordd"))
    args, rest = ap.parse_known_args()
    raw.ARGS = args
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)


if __name__ == "__main__":
    main()
