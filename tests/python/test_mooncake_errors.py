"""kvcoord.mooncake.TransferEngine's failures outside a working engine: a
failed initialize() and every call made before initialize() (or after
close()) return Mooncake's failure value (-1; 0 for a batch id) with
last_error() set, on the engine and on the module, as sglang's callers
(which test the return value) expect.  No peer, no daemon."""

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


if __name__ == "__main__":
    unittest.main()
