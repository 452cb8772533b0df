"""Segment's PD bootstrap methods (the tables kvcoordd serves as sglang's PD
bootstrap server), without HTTP: sglang's registration body, readiness,
errors, a SIGKILLed registering process withdrawn by kvcoordd, the room map."""

import http.client
import json
import os
import signal
import time
import unittest
import urllib.parse

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
        with self.assertRaisesRegex(kvcoord.InvalidArgumentError, "^Missing field 'page_size'$"):
            self.seg.pd_register(b)
        # A missing field is bad input named as kvcoordd's 400 names it, not a bare KeyError.
        for given, missing in (({"attn_tp_size": 1}, "attn_tp_rank"),
                               ({k: v for k, v in body(0).items() if k != "rank_ip"}, "rank_ip"),
                               ({k: v for k, v in body(0).items() if k != "kv_cache_dtype"},
                                "kv_cache_dtype")):
            with self.assertRaises(ValueError) as cm:
                self.seg.pd_register(given)
            self.assertNotIsInstance(cm.exception, KeyError)
            self.assertEqual(str(cm.exception), "Missing field '%s'" % missing)
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


# int()'s edge cases: whitespace of any kind, signs, underscores, digits of
# other scripts, leading zeros, int64's ends and beyond, and what int() refuses.
INT_CASES = [" 12 ", "+13", "-14", "1_000", "\u0661\u0662", "\uff11\uff12", "007", "0_0",
             "\u3000 5 \u2029", "\x1c6\x1f", "-9223372036854775808", "9223372036854775807",
             "9223372036854775808", "-9223372036854775809", "1" * 30, "1__0", "_1", "1_", "- 1",
             "0x10", "1.5", "", " ", "1 2", "+-1", "\u0663_\u0663", "\u00b2", "\u2167", "1e3",
             "\ud800", "12\x00"]


def py_int(s):
    try:
        return int(s)
    except ValueError:
        return None


class OneIntegerRule(unittest.TestCase):
    """The room and rank integers of the PD routes and of the Python API are
    int()'s, as sglang's server applies it: one rule, one range (int64)."""

    def setUp(self):
        self.d = Daemon(new_name("pdint"))
        self.seg = kvcoord.Segment(self.d.segment)
        self.conn = http.client.HTTPConnection("127.0.0.1", self.d.port, timeout=30)

    def tearDown(self):
        self.conn.close()
        self.seg.close()
        self.d.stop()

    def http(self, method, path, body=None):
        self.conn.request(method, path, body=None if body is None else json.dumps(body))
        r = self.conn.getresponse()
        return r.status, r.read().decode()

    def test_rooms_and_ranks_as_int_takes_them(self):
        for s in INT_CASES:
            want = py_int(s)
            fits = want is not None and -2 ** 63 <= want < 2 ** 63
            # The Python API
            if fits:
                self.seg.pd_room_set(s, 1)
                self.assertEqual((self.seg.pd_room_get(want), self.seg.pd_room_get(s)), (1, 1), s)
            else:
                with self.assertRaises(ValueError, msg=repr(s)):
                    self.seg.pd_room_set(s, 1)
            # POST /register_dp_rank and /query_dp_ranks
            status, text = self.http("POST", "/register_dp_rank", {"bootstrap_room": s,
                                                                   "dp_rank": 2})
            self.assertEqual(status, 200 if fits else 400, (s, text))
            status, text = self.http("POST", "/query_dp_ranks", {"bootstrap_rooms": [s]})
            if want is None:
                self.assertEqual(status, 400, (s, text))
            else:  # stored by both when it fits; beyond int64 never stored
                self.assertEqual((status, json.loads(text)), (200, {str(want): 2} if fits else {}),
                                 s)
            # GET /route's parameters: 400 when int() refuses them, else
            # not ready yet (nothing registered), whatever the size.
            if s == "\ud800":
                continue  # a lone surrogate: no URL can carry it
            path = ("/route?prefill_dp_rank=%s&prefill_cp_rank=0&target_tp_rank=0"
                    "&target_pp_rank=0" % urllib.parse.quote(s, safe=""))
            status, _ = self.http("GET", path)
            self.assertEqual(status, 503 if want is not None else 400, s)

    def test_a_room_stored_through_python_is_queryable_over_http(self):
        for room in (-2 ** 63, 2 ** 63 - 1, 0):
            self.seg.pd_room_set(room, 3)
            status, text = self.http("POST", "/query_dp_ranks", {"bootstrap_rooms": [room]})
            self.assertEqual((status, json.loads(text)), (200, {str(room): 3}))
        # int(7.9) is 7, int(True) is 1: over HTTP and in Python alike
        self.assertEqual(self.http("POST", "/register_dp_rank",
                                   {"bootstrap_room": 7.9, "dp_rank": True})[0], 200)
        self.assertEqual(self.seg.pd_room_get(7), 1)
        self.seg.pd_room_set(-8.9, True)
        self.assertEqual(json.loads(self.http("POST", "/query_dp_ranks",
                                              {"bootstrap_rooms": [-8]})[1]), {"-8": 1})
        for bad in (float("nan"), float("inf"), None, [1]):
            with self.assertRaises((ValueError, TypeError)):
                self.seg.pd_room_set(bad, 0)

    def test_a_repeated_query_parameter_takes_the_first(self):
        self.seg.pd_register(body(0, attn_tp_size=1))
        status, text = self.http("GET", "/route?prefill_dp_rank=-1&prefill_dp_rank=0"
                                 "&prefill_cp_rank=-1&target_tp_rank=-1&target_pp_rank=-1")
        self.assertEqual((status, json.loads(text)["attn_tp_size"]), (200, 1))  # aiohttp: first
        status, text = self.http("GET", "/route?prefill_dp_rank=0&prefill_dp_rank=-1"
                                 "&prefill_cp_rank=0&target_tp_rank=0&target_pp_rank=0")
        self.assertEqual((status, json.loads(text)["rank_ip"]), (200, "10.1.0.0"))


class Topology(SegmentCase):
    def test_one_topology_at_a_time(self):
        self.seg.pd_register(body(0))
        with self.assertRaisesRegex(kvcoord.Error, r"differs from the registered prefill's "
                                                   r"\(2 x 1 x 1 x 1\)"):
            self.seg.pd_register(body(3, attn_tp_size=4))
        st = self.seg.pd_status()
        self.assertEqual((st["attn_tp_size"], st["registered"], st["expected"], st["ready"]),
                         (2, 1, 2, False))
        with self.assertRaisesRegex(kvcoord.InvalidArgumentError,
                                    "a topology of 2048 prefill ranks .* exceeds the PD "
                                    "table's 1024 ranks"):
            self.seg.pd_register(body(0, attn_tp_size=2048))


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
