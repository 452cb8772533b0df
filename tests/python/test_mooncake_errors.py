"""kvcoord.mooncake.TransferEngine's failures outside a working engine: a
failed initialize() and every call made before initialize() (or after
close()) return Mooncake's failure value (-1; 0 for a batch id) with
last_error() set, on the engine and on the module, as sglang's callers
(which test the return value) expect.  No peer, no daemon."""

import ctypes
import socket
import threading
import unittest

import kvcoord.mooncake as km
from kvcoord.mooncake import TransferEngine, TransferOpcode

NOT_INIT = "not initialized"


class BeforeInitialize(unittest.TestCase):
    def setUp(self):
        self.e = TransferEngine()

    def check(self, got, want, name):
        self.assertEqual(got, want, name)
        self.assertIn(NOT_INIT, self.e.last_error(), name)
        # the call named (a batch_ call names the call of one entry it made)
        self.assertIn(name.replace("batch_", "", 1) if name.startswith("batch_r")
                      or name.startswith("batch_u") else name, self.e.last_error())
        self.assertEqual(km.last_error(), self.e.last_error(), name)

    def test_every_call_returns_its_failure_value(self):
        sid, a = "127.0.0.1:1", 0x10000
        cases = [
            ("get_rpc_port", (), -1),
            ("get_session_id", (), ""),
            ("backend", (), ""),
            ("register_memory", (a, 4096), -1),
            ("unregister_memory", (a,), -1),
            ("batch_register_memory", ([a], [4096]), -1),
            ("batch_unregister_memory", ([a],), -1),
            ("transfer_sync_write", (sid, a, a, 8), -1),
            ("transfer_sync_read", (sid, a, a, 8), -1),
            ("batch_transfer_sync_write", (sid, [a], [a], [8]), -1),
            ("batch_transfer_sync_read", (sid, [a], [a], [8]), -1),
            ("transfer_sync", (sid, a, a, 8, TransferOpcode.Write), -1),
            ("batch_transfer_sync", (sid, [a], [a], [8], TransferOpcode.Read), -1),
            ("batch_transfer_async_write", (sid, [a], [a], [8]), 0),
            ("batch_transfer_async_read", (sid, [a], [a], [8]), 0),
            ("batch_transfer_async", (sid, [a], [a], [8], TransferOpcode.Write), 0),
            ("transfer_submit_write", (sid, a, a, 8), 0),
            ("get_batch_transfer_status", ([1],), -1),
            ("transfer_check_status", (1,), -1),
            ("send_probe", (sid,), -1),
            ("stats", (), {}),
            ("peer_add", ("{}",), -1),
            ("descriptor", (), ""),
        ]
        for name, args, want in cases:
            with self.subTest(call=name):
                self.check(getattr(self.e, name)(*args), want, name)

    def test_after_close(self):
        self.assertEqual(self.e.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", ""), 0,
                         self.e.last_error())
        self.assertGreater(self.e.get_rpc_port(), 0)
        self.e.close()
        self.check(self.e.get_rpc_port(), -1, "get_rpc_port")
        self.check(self.e.register_memory(0x10000, 4096), -1, "register_memory")


class FailedInitialize(unittest.TestCase):
    def test_module_last_error_is_set(self):
        e = TransferEngine()
        self.assertEqual(e.initialize("127.0.0.1", "etcd://127.0.0.1:2379", "tcp", ""), -1)
        self.assertIn("P2PHANDSHAKE", e.last_error())
        self.assertEqual(km.last_error(), e.last_error())
        self.assertEqual(e.initialize("127.0.0.1", "P2PHANDSHAKE", "nvlink", ""), -1)
        self.assertIn("nvlink", km.last_error())
        self.assertEqual(e.initialize("", "P2PHANDSHAKE", "tcp", ""), -1)
        self.assertIn("empty", km.last_error())

    def refused(self, hostname, *want):
        e = TransferEngine()
        self.assertEqual(e.initialize(hostname, "P2PHANDSHAKE", "tcp", ""), -1, hostname)
        for w in want:
            self.assertIn(w, e.last_error())
        self.assertEqual(km.last_error(), e.last_error())
        self.assertEqual(e.get_rpc_port(), -1)  # no engine was made
        self.assertIn(NOT_INIT, e.last_error())

    def test_unresolvable_name(self):
        # .invalid never resolves (RFC 2606)
        self.refused("no-such-host.invalid", "'no-such-host.invalid' does not resolve")

    def test_address_not_on_this_host(self):
        # TEST-NET-1 (RFC 5737) and the IPv6 documentation prefix: on no host
        self.refused("192.0.2.1", "'192.0.2.1' (192.0.2.1) is not an address of this host",
                     "127.0.0.1")
        self.refused("[2001:db8::1]:0", "is not an address of this host")

    def test_port_out_of_range(self):
        self.refused("127.0.0.1:99999", "port '99999' is out of range (0..65535)")
        self.refused("127.0.0.1:http", "port 'http' is out of range")

    def test_what_works_still_works(self):
        hosts = ["127.0.0.1", "127.0.0.1:65535", "0.0.0.0"]
        try:  # a bare root (a fresh chroot) may have no /etc/hosts to resolve it
            socket.getaddrinfo("localhost", None)
            hosts.append("localhost")
        except socket.gaierror:
            pass
        for h in hosts:
            e = TransferEngine()
            self.assertEqual(e.initialize(h, "P2PHANDSHAKE", "tcp", ""), 0,
                             "%s: %s" % (h, e.last_error()))
            e.close()
        import kvcoord._engine as ke
        mine = [a for _, a, lo in ke.local_addresses() if not lo and ":" not in a]
        if mine:  # a non-loopback address of this host
            e = TransferEngine()
            self.assertEqual(e.initialize(mine[0], "P2PHANDSHAKE", "tcp", ""), 0, e.last_error())
            e.close()


class MemoryArguments(unittest.TestCase):
    """register_memory / unregister_memory say what is wrong with the
    arguments, not only what they were."""

    def setUp(self):
        self.e = TransferEngine()
        self.assertEqual(self.e.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", ""), 0)
        self.buf = ctypes.create_string_buffer(1 << 16)
        self.addr = ctypes.addressof(self.buf)

    def tearDown(self):
        self.e.close()

    def check(self, rc, want_rc, *want):
        self.assertEqual(rc, want_rc)
        for w in want:
            self.assertIn(w, self.e.last_error())

    def test_register(self):
        self.check(self.e.register_memory(0, 100), -1, "register_memory(0, 100)",
                   "address 0 is NULL")
        self.check(self.e.register_memory(4096, 0), -1, "register_memory(0x1000, 0)",
                   "length 0: nothing to register")
        self.check(self.e.register_memory(0, 0), -1, "address 0 is NULL",
                   "length 0 registers nothing")

    def test_unregister(self):
        self.check(self.e.unregister_memory(0), -3, "unregister_memory(0x0)", "address 0 is NULL")
        self.check(self.e.unregister_memory(self.addr), -3,
                   "0x%x is not registered (0 regions registered)" % self.addr)
        self.assertEqual(self.e.register_memory(self.addr, 1 << 16), 0)
        self.check(self.e.unregister_memory(self.addr + 4096), -3,
                   "0x%x is inside the region registered at 0x%x (+65536), not its start: "
                   "pass 0x%x" % (self.addr + 4096, self.addr, self.addr))
        self.assertEqual(self.e.unregister_memory(self.addr), 0)


class IntegerRanges(unittest.TestCase):
    """Every integer argument is taken only in 0..2**64-1: 2**64 + a is
    refused with the call's failure value and a last_error() naming the
    argument, never wrapped to a (nor a negative number to 2**64 - n)."""

    RANGE = "0..2**64-1"

    def setUp(self):
        self.e = TransferEngine()
        self.assertEqual(self.e.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", ""), 0)
        self.buf = ctypes.create_string_buffer(1 << 16)
        self.a = ctypes.addressof(self.buf)

    def tearDown(self):
        self.e.close()

    def refused(self, rc, want_rc, name, *want):
        self.assertEqual(rc, want_rc, name)
        for w in (name, self.RANGE) + want:
            self.assertIn(w, self.e.last_error(), name)

    def test_memory(self):
        a, big = self.a, 1 << 64
        self.refused(self.e.register_memory(a + big, 4096), -1, "buffer_addr", str(a + big))
        self.refused(self.e.register_memory(a + 4096, big + 4096), -1, "capacity")
        self.refused(self.e.register_memory(big, 1), -1, "buffer_addr")
        self.refused(self.e.register_memory(-a, 4096), -1, "buffer_addr")
        self.refused(self.e.register_memory(a, -4096), -1, "capacity")
        self.refused(self.e.register_memory(a, "4096"), -1, "capacity")
        self.refused(self.e.batch_register_memory([a, a + big], [4096, 4096]), -1,
                     "buffer_addr")
        self.assertEqual(self.e.stats()["calls_failed"], 0)  # none reached the engine
        # nothing was registered by any of these: a registers now, once
        self.assertEqual(self.e.register_memory(a, 4096), 0, self.e.last_error())
        self.refused(self.e.unregister_memory(a + big), -1, "buffer_addr")
        self.refused(self.e.unregister_memory(-1), -1, "buffer_addr")
        self.assertEqual(self.e.unregister_memory(a), 0)  # still registered until now

    def test_transfers(self):
        a, big, sid = self.a, 1 << 64, "127.0.0.1:1"
        e = self.e
        self.refused(e.transfer_sync_write(sid, a + big, a, 8), -1, "buffer",
                     "write to " + sid)  # the operation named, as the engine does
        self.refused(e.transfer_sync_read(sid, a, a - big, 8), -1, "peer_buffer_address")
        self.refused(e.transfer_sync(sid, a, a, big + 8, TransferOpcode.Write), -1, "length")
        self.refused(e.batch_transfer_sync_write(sid, [a, a], [a, a + big], [8, 8]), -1,
                     "peer_buffer_addresses[1]")
        self.refused(e.batch_transfer_sync_read(sid, [a], [a], [-8]), -1, "lengths[0]",
                     "read from " + sid)
        self.refused(e.batch_transfer_async_write(sid, [big], [a], [8]), 0, "buffers[0]",
                     "write to " + sid)
        self.refused(e.transfer_submit_write(sid, a, a, big), 0, "lengths[0]")
        self.refused(e.transfer_check_status(big + 1), -1, "batch_id")
        self.refused(e.transfer_check_status(-1), -1, "batch_id")
        self.refused(e.get_batch_transfer_status([1, big]), -1, "batch_ids[1]")

    def test_opcode_other_than_read_or_write_raises(self):
        # the caller's mistake, not a failed transfer (docs/mooncake.md)
        a, sid = self.a, "127.0.0.1:1"
        for bad in (7, -1, "write", 1.0, None):
            with self.assertRaises(ValueError) as cm:
                self.e.transfer_sync(sid, a, a, 8, bad)
            self.assertIn("opcode must be TransferOpcode.Read or .Write, not %r" % (bad,),
                          str(cm.exception))
            with self.assertRaises(ValueError):
                self.e.batch_transfer_sync(sid, [a], [a], [8], bad)


class EmptyBatches(unittest.TestCase):
    """An empty batch is a failed call (-1; 0 for a batch id) with
    last_error() saying so, never an exception: also as a thread's first
    batch (each call below runs on a new thread, whose run buffer is not
    allocated yet; it raised SystemError there)."""

    def setUp(self):
        self.e = TransferEngine()
        self.assertEqual(self.e.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", ""), 0)
        self.peer = TransferEngine()
        self.assertEqual(self.peer.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", ""), 0)
        self.sid = self.peer.get_session_id()

    def tearDown(self):
        self.e.close()
        self.peer.close()

    def on_new_thread(self, call):
        out = []

        def run():
            try:
                out.append(("rc", call(), self.e.last_error()))
            except BaseException as exc:  # the defect: an exception escaped
                out.append(("raised", exc, None))
        t = threading.Thread(target=run)
        t.start()
        t.join()
        return out[0]

    def test_empty_batches_fail_with_their_value(self):
        e, sid = self.e, self.sid
        for name, call, want in (
                ("sync write", lambda: e.batch_transfer_sync_write(sid, [], [], []), -1),
                ("sync read", lambda: e.batch_transfer_sync_read(sid, [], [], []), -1),
                ("sync", lambda: e.batch_transfer_sync(sid, [], [], [], TransferOpcode.Write), -1),
                ("async write", lambda: e.batch_transfer_async_write(sid, [], [], []), 0),
                ("async read", lambda: e.batch_transfer_async_read(sid, [], [], []), 0)):
            how, rc, err = self.on_new_thread(call)
            self.assertEqual((how, rc), ("rc", want), name)
            self.assertIn("no entries", err, name)


if __name__ == "__main__":
    unittest.main()
