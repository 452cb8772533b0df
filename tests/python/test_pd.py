"""Segment's PD bootstrap methods (the tables kvcoordd serves as sglang's PD
bootstrap server), without HTTP: sglang's registration body, readiness,
errors, a SIGKILLed registering process withdrawn by kvcoordd, the room map."""

import os
import signal
import time
import unittest

import kvcoord
from kvctest import SMALL, Daemon, SegmentCase, new_name, wait_for


def body(tp, dp=0, **kw):
    b = {"attn_tp_size": 2, "attn_tp_rank": tp, "attn_cp_size": 1, "attn_cp_rank": 0,
         "attn_dp_size": 1, "attn_dp_rank": dp, "pp_size": 1, "pp_rank": 0,
         "system_dp_size": 1, "system_dp_rank": 0, "rank_ip": "10.1.0.%d" % tp,
         "rank_port": 18000 + tp, "page_size": 32, "kv_cache_dtype": "auto"}
    b.update(kw)
    return b


class Tables(SegmentCase):
    def test_register_status_lookup(self):
        st = self.seg.pd_status()
        self.assertIsNone(st["attn_tp_size"])
        self.assertFalse(st["ready"])
        self.seg.pd_register(body(1, load_balance_method="round_robin"))
        self.seg.pd_register(body(1))  # again: counted once
        st = self.seg.pd_status()
        self.assertEqual((st["registered"], st["expected"], st["ready"]), (1, 2, False))
        self.assertFalse(st["follow_bootstrap_room"])
        self.seg.pd_register(body(0))
        st = self.seg.pd_status()
        self.assertTrue(st["ready"])
        self.assertEqual((st["page_size"], st["kv_cache_dtype"], st["prefill_http_port"]),
                         (32, "auto", None))
        e = self.seg.pd_lookup(0, 0, 1, 0)
        self.assertEqual((e["rank_ip"], e["rank_port"], e["pid"]), ("10.1.0.1", 18001,
                                                                    os.getpid()))
        self.assertEqual([(r["dp_group"], r["tp_rank"]) for r in self.seg.pd_ranks()],
                         [(0, 0), (0, 1)])
        with self.assertRaises(kvcoord.NotFoundError):
            self.seg.pd_lookup(0, 0, 7, 0)
        self.seg.pd_withdraw(0, 0, 1, 0, note="drained")
        with self.assertRaisesRegex(kvcoord.WithdrawnError, "drained"):
            self.seg.pd_lookup(0, 0, 1, 0)
        with self.assertRaises(kvcoord.NotFoundError):
            self.seg.pd_withdraw(0, 0, 1, 0)

    def test_bad_registrations_store_nothing(self):
        b = body(0)
        del b["page_size"]
        with self.assertRaises(KeyError):
            self.seg.pd_register(b)
        with self.assertRaisesRegex(kvcoord.InvalidArgumentError, "attn_tp_rank 2 out of range"):
            self.seg.pd_register(body(2))
        with self.assertRaises(TypeError):
            self.seg.pd_register(body(0, rank_ip=7))
        with self.assertRaises(TypeError):
            self.seg.pd_register([1, 2])
        with self.assertRaises(ValueError):
            self.seg.pd_register(body(0, rank_port=0))
        with self.assertRaisesRegex(kvcoord.InvalidArgumentError, "rank_ip must not contain a NUL"):
            self.seg.pd_register(body(0, rank_ip="1.2\x003"))
        with self.assertRaisesRegex(TypeError, "rank_ip must be a str, not NoneType"):
            self.seg.pd_register(body(0, rank_ip=None))
        with self.assertRaisesRegex(ValueError, "attn_tp_size must be in 1..4096, not 0"):
            self.seg.pd_register(body(0, attn_tp_size=0))
        self.assertEqual(self.seg.pd_status()["registered"], 0)

    def test_room_map(self):
        self.assertIsNone(self.seg.pd_room_get(3))
        self.seg.pd_room_set(3, 1)
        self.seg.pd_room_set(-4, 2)
        self.assertEqual((self.seg.pd_room_get(3), self.seg.pd_room_get(-4)), (1, 2))
        self.assertEqual(self.seg.pd_room_sweep(3600), 0)
        time.sleep(0.01)
        self.assertEqual(self.seg.pd_room_sweep(0.001), 2)
        self.assertIsNone(self.seg.pd_room_get(3))
        with self.assertRaises(ValueError):
            self.seg.pd_room_set(3, -1)


class Liveness(unittest.TestCase):
    def test_sigkilled_registrant_is_withdrawn(self):
        name = new_name("pdlive")
        d = Daemon(name)
        try:
            seg = kvcoord.Segment(name)
            r, w = os.pipe()
            pid = os.fork()
            if pid == 0:
                try:
                    child = kvcoord.Segment(name, role="worker", rank=1)
                    child.pd_register(body(1))
                    os.write(w, b"y")
                    time.sleep(600)
                finally:
                    os._exit(1)
            self.assertEqual(os.read(r, 1), b"y")
            self.assertEqual(seg.pd_lookup(0, 0, 1, 0)["pid"], pid)
            os.kill(pid, signal.SIGKILL)
            t0 = time.monotonic()
            os.waitpid(pid, 0)

            def withdrawn():
                try:
                    seg.pd_lookup(0, 0, 1, 0)
                    return False
                except kvcoord.WithdrawnError:
                    return True
            wait_for(withdrawn, "the killed registrant's withdrawal")
            print("withdrawn %.3f s after SIGKILL" % (time.monotonic() - t0))
            self.assertFalse(seg.pd_status()["ready"])
            seg.close()
        finally:
            d.stop()


if __name__ == "__main__":
    unittest.main()
