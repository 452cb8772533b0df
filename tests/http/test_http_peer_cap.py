#!/usr/bin/python3
"""kvcoordd's per-peer connection cap (--max-conns-per-peer): one client
address cannot take the whole connection table.

Loopback addresses other than 127.0.0.1 stand for other hosts: Linux
routes all of 127.0.0.0/8 to lo, so a client socket bound to 127.0.0.2
reaches a daemon listening on 127.0.0.1 from a peer address of its own.

- Given explicitly, the cap applies to every address: past N connections
  from 127.0.0.1, the next ones are answered 503 "Too many connections
  from this address" and closed, a line names the peer in the log, while
  127.0.0.2 is served; once 127.0.0.1's connections close, it is served
  again (the count goes down with each close).
- By default loopback is exempt (every rank of the node shares it): more
  connections than a quarter of --max-conns from 127.0.0.1 are all served.

Before the cap (the code before this test), the connections past N were
served: the test fails there.

Usage: test_http_peer_cap.py [--daemon PATH] [unittest args]
"""

import argparse
import os
import re
import socket
import sys
import time
import unittest

import test_http_raw as raw
from test_http_raw import Daemon

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
from kvctest import connect, read_answer  # noqa: E402  (the tests' one helper module)

TIMEOUT = 30


def request(s, path="/health"):
    """(status, body) of one GET on s; (None, b"") when closed unanswered."""
    s.sendall(("GET %s HTTP/1.1\r\nHost: x\r\n\r\n" % path).encode())
    try:
        status, body, _ = read_answer(s)
        return status, body
    except (EOFError, ConnectionResetError, BrokenPipeError):
        return None, b""


def served(port, source, path="/health"):
    s = connect(port, source)
    try:
        return request(s, path)
    finally:
        s.close()


class PeerCap(unittest.TestCase):
    def test_one_address_cannot_take_the_table(self):
        d = Daemon("--max-conns", "64", "--max-conns-per-peer", "8")
        held = []
        try:
            for _ in range(8):  # each answered: open and counted
                s = connect(d.port)
                self.assertEqual(request(s)[0], 200)
                held.append(s)
            for _ in range(4):
                status, body = served(d.port, "127.0.0.1")
                self.assertEqual(status, 503, body)
                self.assertIn(b"Too many connections from this address", body)
            self.assertEqual(served(d.port, "127.0.0.2")[0], 200)
            self.assertIn("peer_connection_cap peer=127.0.0.1", d.output())
            self.assertIn("max_conns_per_peer=8", d.output())
            # the start line says the cap, and /metrics' help counts these refusals
            self.assertRegex(d.output(), r"listening addr=\S+ segment=\S+ max_conns=64 "
                             r"max_conns_per_peer=8 peer_cap=every_address")
            status, body = served(d.port, "127.0.0.2", "/metrics")
            self.assertEqual(status, 200)
            m = re.search(rb"# HELP kvcoord_http_connections_refused_total (.*)", body)
            self.assertIsNotNone(m, body[:2000])
            self.assertIn(b"max-conns-per-peer", m.group(1))
            self.assertRegex(body.decode(), r"\nkvcoord_http_connections_refused_total [1-9]")
            self.assertNotIn("peer=127.0.0.2", d.output())
            for s in held:
                s.close()
            held = []
            # The closes reach the daemon soon; wait for the condition.
            deadline = time.monotonic() + TIMEOUT
            while served(d.port, "127.0.0.1")[0] != 200:
                self.assertLess(time.monotonic(), deadline, "127.0.0.1 never served again")
                time.sleep(0.05)
        finally:
            for s in held:
                s.close()
            self.assertEqual(d.stop(), 0)

    def test_one_address_cannot_take_the_body_budget(self):
        # A quarter of --max-buffered-bytes per address: 256 KiB of 1 MiB.
        d = Daemon("--max-conns-per-peer", "8", "--max-buffered-bytes", "1M",
                   "--max-body-bytes", "1M")
        head = ("PUT /register_transfer_engine_info HTTP/1.1\r\nHost: x\r\n"
                "Content-Type: application/json\r\nContent-Length: 200000\r\n"
                "Expect: 100-continue\r\n\r\n").encode()
        held = []
        try:
            a = connect(d.port)
            a.sendall(head)
            self.assertIn(b" 100 ", a.recv(4096))  # reserved: 200 KB of its 256 KiB
            held.append(a)
            b = connect(d.port)
            b.sendall(head)
            answer = b.recv(4096)
            self.assertIn(b" 503 ", answer)
            self.assertIn(b"from this address exceed its share", answer)
            b.close()
            c = connect(d.port, "127.0.0.2")
            c.sendall(head)
            self.assertIn(b" 100 ", c.recv(4096))  # another address: its own share
            held.append(c)
            a.close()  # its reservation goes back with it
            held.remove(a)
            deadline = time.monotonic() + TIMEOUT
            while True:
                e = connect(d.port)
                e.sendall(head)
                got = e.recv(4096)
                e.close()
                if b" 100 " in got:
                    break
                self.assertLess(time.monotonic(), deadline, got)
                time.sleep(0.05)
        finally:
            for s in held:
                s.close()
            self.assertEqual(d.stop(), 0)

    def test_loopback_is_exempt_by_default(self):
        d = Daemon("--max-conns", "16")  # a quarter: 4 per remote address
        held = []
        try:
            for _ in range(10):
                s = connect(d.port)
                self.assertEqual(request(s)[0], 200)
                held.append(s)
            self.assertNotIn("peer_connection_cap", d.output())
            self.assertIn("max_conns_per_peer=4 peer_cap=remote_addresses", d.output())
        finally:
            for s in held:
                s.close()
            self.assertEqual(d.stop(), 0)

    def test_cap_above_max_conns_refused(self):
        with self.assertRaises(AssertionError) as cm:
            Daemon("--max-conns", "10", "--max-conns-per-peer", "20").stop()
        self.assertIn("--max-conns-per-peer 20 is above --max-conns 10", str(cm.exception))

    def test_ipv6_wildcard_is_ipv6_only(self):
        # documented: [::]:P listens for IPv6 only (IPV6_V6ONLY)
        try:
            probe = socket.socket(socket.AF_INET6)
            probe.bind(("::1", 0))
            probe.close()
        except OSError:
            self.skipTest("no IPv6 on this host")
        d = Daemon(host="::")
        try:
            s6 = socket.create_connection(("::1", d.port), TIMEOUT)
            self.assertEqual(request(s6)[0], 200)
            s6.close()
            with self.assertRaises(ConnectionRefusedError):
                socket.create_connection(("127.0.0.1", d.port), TIMEOUT).close()
        finally:
            self.assertEqual(d.stop(), 0)

    def test_option_checked(self):
        for bad in ("-1", "65537", "x", ""):
            d = None
            try:
                d = Daemon("--max-conns-per-peer", bad)
            except AssertionError as e:
                self.assertIn("--max-conns-per-peer", str(e))
            else:
                d.stop()
                self.fail("--max-conns-per-peer %r accepted" % bad)


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser()
    ap.add_argument("--daemon", default=os.path.join(here, "..", "..", "build", "kvcoordd"))
    args, rest = ap.parse_known_args()
    raw.ARGS = args
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)


if __name__ == "__main__":
    main()
