"""The kvcoord Python binding, call by call: every Segment method and each
of its errors, bad arguments (the segment is unchanged after each), the
exception mapping, threads and the GIL, closing, and the fork rule.

Run: PYTHONPATH=build/python /usr/bin/python3 -m unittest discover -s tests/python -p test_binding.py
"""

import json
import os
import subprocess
import sys
import threading
import time
import unittest

import kvcoord
from kvctest import DEADLINE, SMALL, SegmentCase, collect, discard, fork_children, new_name

WID = {"model.embed_tokens.weight": [139637976727552, 16032768, 2],
       "lm_head.weight": [139637976727808, 16032768, 2]}


class ModuleFunctions(unittest.TestCase):
    def test_names(self):
        self.assertEqual(kvcoord.name_for_port(6789), "kvcoord-6789")
        self.assertIsNone(kvcoord.name_check("kvcoord-6789"))
        for bad in ("", "a/b", ".", "..", "-x", "x" * 201, "sp ace"):
            with self.assertRaises(ValueError, msg=bad) as cm:
                kvcoord.name_check(bad)
            self.assertIsInstance(cm.exception, kvcoord.InvalidArgumentError)
            self.assertEqual(cm.exception.code, 1)
        with self.assertRaises(TypeError):
            kvcoord.name_check(b"kvcoord-1")
        with self.assertRaises(ValueError):
            kvcoord.name_for_port(65536)
        with self.assertRaises(ValueError):
            kvcoord.name_for_port(-1)
        with self.assertRaises(TypeError):
            kvcoord.name_for_port("6789")

    def test_unlink_missing(self):
        with self.assertRaises(FileNotFoundError) as cm:
            kvcoord.unlink(new_name("nosuch"))
        self.assertIsInstance(cm.exception, kvcoord.SegmentNotFoundError)
        self.assertEqual(cm.exception.code, 2)

    def test_texts_and_constants(self):
        self.assertEqual(kvcoord.strerror(10), "timed out")
        self.assertEqual(kvcoord.wait_status_text(9), "killed by signal 9 (Killed)")
        self.assertEqual(kvcoord.wait_status_text(3 << 8), "exited with status 3")
        self.assertEqual(kvcoord.DEFAULT_PORT, 6789)
        self.assertGreaterEqual(kvcoord.LAYOUT_VERSION, 2)
        self.assertEqual([int(s) for s in kvcoord.KVPoll], [0, 1, 2, 3, 4])
        self.assertEqual(kvcoord.KVPoll.Failed, 0)
        self.assertEqual(kvcoord.KVPoll.Success, 4)

    def test_exception_hierarchy(self):
        self.assertTrue(issubclass(kvcoord.NotFoundError, KeyError))
        self.assertTrue(issubclass(kvcoord.WithdrawnError, kvcoord.NotFoundError))
        self.assertTrue(issubclass(kvcoord.WaitTimeoutError, TimeoutError))
        self.assertTrue(issubclass(kvcoord.InvalidArgumentError, ValueError))
        self.assertTrue(issubclass(kvcoord.SegmentNotFoundError, FileNotFoundError))
        for cls in (kvcoord.NotFoundError, kvcoord.WaitTimeoutError, kvcoord.InvalidArgumentError,
                    kvcoord.SegmentNotFoundError, kvcoord.ForkedSegmentError):
            self.assertTrue(issubclass(cls, kvcoord.Error))


class KVTransferErrorShape(unittest.TestCase):
    """sglang's constructor, attributes and string form."""

    def test_constructor_and_str(self):
        e = kvcoord.KVTransferError(42, "boom")
        self.assertEqual(str(e), "KVTransferError(bootstrap_room=42): boom")
        self.assertEqual(e.args, ("boom",))
        self.assertEqual((e.bootstrap_room, e.failure_reason, e.is_from_another_rank),
                         (42, "boom", False))
        e = kvcoord.KVTransferError(bootstrap_room=7, failure_reason="x", is_from_another_rank=True)
        self.assertTrue(getattr(e, "is_from_another_rank", False))
        self.assertIsInstance(e, Exception)


class KVTransferErrorFromRecord(SegmentCase):
    """check_room and transfer_error build KVTransferError in C: the object
    must be what the Python constructor and the three record fields give."""

    def test_same_as_constructor(self):
        self.seg.room_open(9, 1, 2)
        self.seg.room_fail(9, 0, "ibv_post_send: transport retry counter exceeded \u00e9", 12)
        rec = self.seg.room_get(9, 1).failure
        want = kvcoord.KVTransferError(9, rec.reason, True)
        want.origin_rank, want.code, want.time_ns = 0, 12, rec.time_ns
        with self.assertRaises(kvcoord.KVTransferError) as cm:
            self.seg.check_room(9, 1)
        for got in (cm.exception, kvcoord.transfer_error(rec)):
            self.assertIs(type(got), kvcoord.KVTransferError)
            self.assertEqual(got.args, want.args)
            self.assertEqual(str(got), str(want))
            self.assertEqual(vars(got), vars(want))
        with self.assertRaises(kvcoord.KVTransferError) as cm:
            self.seg.check_room(9, 0)  # the origin rank
        self.assertFalse(cm.exception.is_from_another_rank)
        with self.assertRaises(TypeError):
            kvcoord._kvcoord._transfer_error(("not", "a", "record"))

    def test_room_wait_check_raises(self):
        self.seg.room_open(12, 1, 2)
        info = self.seg.room_wait(12, kvcoord.KVPoll.Failed, 1, timeout=DEADLINE, check=True)
        self.assertEqual(info.state, kvcoord.KVPoll.Bootstrapping)  # no failure: a RoomInfo
        err = []

        def waiter():
            try:
                self.seg.room_wait(12, kvcoord.KVPoll.Bootstrapping, 1, timeout=DEADLINE,
                                   check=True)
            except kvcoord.KVTransferError as e:
                err.append(e)

        t = threading.Thread(target=waiter)
        t.start()
        self.seg.room_fail(12, 0, "qp error", 5)
        t.join(DEADLINE)
        self.assertEqual(len(err), 1)
        e = err[0]
        self.assertEqual((e.bootstrap_room, e.failure_reason, e.is_from_another_rank,
                          e.origin_rank, e.code), (12, "qp error", True, 0, 5))
        # without check the failed room is returned
        self.assertEqual(self.seg.room_wait(12, 1, 1, timeout=DEADLINE).failure.reason,
                         "qp error")

    def test_not_failed_returns_roominfo(self):
        self.seg.room_open(10, 0, 1)
        self.assertEqual(self.seg.check_room(10, 0).state, kvcoord.KVPoll.Bootstrapping)
        with self.assertRaises(KeyError):
            self.seg.check_room(11)


class Open(unittest.TestCase):
    def test_attach_missing(self):
        with self.assertRaises(FileNotFoundError) as cm:
            kvcoord.Segment(new_name("missing"))
        self.assertIn("kvctest-py-missing", str(cm.exception))

    def test_bad_arguments(self):
        with self.assertRaises(ValueError):
            kvcoord.Segment("bad/name")
        with self.assertRaises(TypeError):
            kvcoord.Segment(42)
        with self.assertRaises(ValueError):
            kvcoord.Segment(new_name("x"), role="boss")
        with self.assertRaises(ValueError):
            kvcoord.Segment(new_name("x"), mode="sometimes")
        with self.assertRaises(ValueError):
            kvcoord.Segment(new_name("x"), mode="create", max_ranks=0)
        with self.assertRaises(ValueError):
            kvcoord.Segment(new_name("x"), mode="create", world_size=33)
        with self.assertRaisesRegex(ValueError, r"rank must be in 0\.\.2147483647 or None, not -1"):
            kvcoord.Segment(new_name("x"), rank=-1)
        with self.assertRaisesRegex(ValueError, r"rank must be in 0\.\.2147483647 or None, not 2147483648"):
            kvcoord.Segment(new_name("x"), rank=2 ** 31)
        with self.assertRaises(TypeError):
            kvcoord.Segment(new_name("x"), mode="create", max_rooms="many")
        with self.assertRaises(ValueError):
            kvcoord.Segment(port=70000)
        with self.assertRaises(TypeError):
            kvcoord.Segment("a", "b")  # everything after name is keyword-only

    def test_not_a_segment(self):
        name = new_name("dir")
        os.mkdir("/dev/shm/" + name)
        try:
            with self.assertRaises(kvcoord.Error) as cm:
                kvcoord.Segment(name)
            self.assertIn("is a directory, not a segment", str(cm.exception))
        finally:
            os.rmdir("/dev/shm/" + name)

    def test_full_process_table(self):
        name = new_name("procs")
        try:
            with kvcoord.Segment(name, mode="fresh", role="client", **dict(SMALL, max_procs=1)):
                # This process's next handle shares its entry (one per process).
                kvcoord.Segment(name).close()
                # Another process finds the one entry taken.
                code = ("import sys, kvcoord\n"
                        "try:\n"
                        "    kvcoord.Segment(sys.argv[1])\n"
                        "except kvcoord.FullError as e:\n"
                        "    print(isinstance(e, kvcoord.Error), e.code_name, str(e), sep='|')\n")
                out = subprocess.run([sys.executable, "-c", code, name], capture_output=True,
                                     text=True, timeout=60).stdout
                self.assertTrue(out.startswith("True|%s|" % kvcoord.strerror(6)), out)
                self.assertIn("process table of segment %s is full (1 live processes" % name, out)
                self.assertIn("kvcoordd --max-procs", out)
        finally:
            discard(name)

    def test_context_manager_and_close(self):
        name = new_name("ctx")
        try:
            with kvcoord.Segment(name, mode="create", rank=2, **SMALL) as seg:
                self.assertEqual(seg.name, name)
                self.assertEqual(seg.rank, 2)
                self.assertEqual(seg.role, "worker")  # the default when a rank is given
                self.assertFalse(seg.closed)
                self.assertIn(name, repr(seg))
            self.assertTrue(seg.closed)
            self.assertIsNone(seg.name)
            seg.close()  # idempotent
            for call in (lambda: seg.lookup(0), lambda: seg.ranks(), lambda: seg.stat(),
                         lambda: seg.room_get(1), lambda: seg.register(0, "h:1", {})):
                with self.assertRaises(ValueError) as cm:
                    call()
                self.assertIn("closed", str(cm.exception))
            with self.assertRaises(ValueError):
                with seg:
                    pass
            with kvcoord.Segment(name) as c:
                self.assertEqual(c.role, "client")
                self.assertIsNone(c.rank)
        finally:
            discard(name)

    def test_default_name_from_port(self):
        # a port whose default segment nobody on this machine has made
        port = next(p for p in range(1, 65536) if not os.path.exists("/dev/shm/kvcoord-%d" % p))
        with self.assertRaises(FileNotFoundError) as cm:
            kvcoord.Segment(port=port)
        self.assertIn("kvcoord-%d" % port, str(cm.exception))


class Ranks(SegmentCase):
    def test_register_lookup(self):
        gen = self.seg.register(3, "10.0.0.5:16003", WID)
        self.assertEqual(gen, 1)
        ri = self.seg.lookup(3)
        self.assertEqual((ri.rank, ri.state, ri.session_id, ri.generation, ri.entries),
                         (3, "registered", "10.0.0.5:16003", 1, 2))
        self.assertEqual(ri.pid, os.getpid())
        self.assertGreater(ri.registered_ns, 0)
        self.assertEqual(ri.note, "")
        # the compact JSON kvcoordd stores for the same dict over HTTP
        self.assertEqual(ri.raw, json.dumps(WID, separators=(",", ":")).encode())
        self.assertEqual(ri.weights_info_dict, WID)
        self.assertIs(ri.weights_info_dict, ri.weights_info_dict)  # decoded once
        self.assertEqual(ri.info, ("10.0.0.5:16003", WID))
        self.assertEqual(self.seg.lookup_raw(3), ri.raw)
        self.assertIn("rank=3", repr(ri))
        # identical re-registration: no new generation; a change bumps it
        self.assertEqual(self.seg.register(3, "10.0.0.5:16003", WID), 1)
        self.assertEqual(self.seg.register(3, "10.0.0.5:16003", {"x": [1, 2, 2]}), 2)
        self.assertEqual(self.seg.lookup(3).weights_info_dict, {"x": [1, 2, 2]})

    def test_register_over_a_live_process_warns(self):
        # Another process registers rank 4 and stays; ours replaces it.
        code = ("import sys, time, kvcoord\n"
                "s = kvcoord.Segment(sys.argv[1], role='worker', rank=4)\n"
                "s.register(4, 'other:1', {'w': [1, 1, 1]})\n"
                "print('ready', flush=True)\n"
                "sys.stdin.read()\n")
        other = subprocess.Popen([sys.executable, "-c", code, self.name], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, text=True)
        try:
            self.assertEqual(other.stdout.readline().strip(), "ready")
            with self.assertLogs("kvcoord", "WARNING") as logs:
                self.seg.register(4, "mine:1", WID)
            self.assertEqual(len(logs.output), 1, logs.output)
            self.assertIn("rank 4 was registered by process %d, which still runs: this "
                          "registration replaces it" % other.pid, logs.output[0])
            self.assertEqual(self.seg.lookup(4).session_id, "mine:1")
            # ours again, or a rank nobody else holds: no warning
            with self.assertNoLogs("kvcoord", "WARNING"):
                self.seg.register(4, "mine:2", WID)
                self.seg.register(5, "mine:1", WID)
        finally:
            other.stdin.close()
            other.wait()

    def test_register_bytes_and_unicode(self):
        raw = b'{"a":  [1, 2, 3]}'
        self.seg.register(0, "[::1]:16000", raw)
        self.assertEqual(self.seg.lookup_raw(0), raw)  # stored byte for byte
        self.seg.register(1, "h\u00e9:1", bytearray(b'{"b":[1]}'))
        self.assertEqual(self.seg.lookup(1).session_id, "h\u00e9:1")
        self.seg.register(2, "h:2", memoryview(b'{"\u00e9":[1]}'.decode().encode()))
        self.assertEqual(self.seg.lookup(2).weights_info_dict, {"\u00e9": [1]})
        self.seg.register(4, "h:4", {"\u00e9": [1]})
        self.assertEqual(self.seg.lookup_raw(4), '{"\u00e9":[1]}'.encode())  # not \\u escaped

    def test_lookup_errors(self):
        with self.assertRaises(KeyError) as cm:
            self.seg.lookup(5)
        e = cm.exception
        self.assertIsInstance(e, kvcoord.NotFoundError)
        self.assertEqual((e.code, e.code_name), (2, "not found"))
        self.assertIn("rank 5", str(e))
        with self.assertRaises(ValueError) as cm:
            self.seg.lookup(64)  # max ranks of the small segment
        self.assertIn("max ranks", str(cm.exception))
        self.assertIsInstance(cm.exception, kvcoord.InvalidArgumentError)
        with self.assertRaises(KeyError):
            self.seg.lookup_raw(5)

    def test_withdraw(self):
        self.seg.register(1, "h:1", WID)
        self.seg.withdraw(1, "drained for maintenance")
        with self.assertRaises(KeyError) as cm:
            self.seg.lookup(1)
        self.assertIsInstance(cm.exception, kvcoord.WithdrawnError)
        self.assertIn("drained for maintenance", str(cm.exception))
        with self.assertRaises(KeyError):
            self.seg.withdraw(1)
        with self.assertRaises(KeyError):
            self.seg.withdraw(9)
        # without a note, the record says who withdrew it
        self.seg.register(2, "h:2", WID)
        self.seg.withdraw(2)
        with self.assertRaises(kvcoord.WithdrawnError) as cm:
            self.seg.lookup(2)
        self.assertIn("Segment.withdraw()", str(cm.exception))
        self.seg.register(2, "h:2", WID)
        self.seg.withdraw(2)  # and again: still named
        listed = self.seg.ranks(include_withdrawn=True)
        self.assertEqual([(r.rank, r.state, r.note) for r in listed],
                         [(1, "withdrawn", "drained for maintenance"),
                          (2, "withdrawn", "withdrawn by Segment.withdraw()")])
        self.assertEqual(self.seg.ranks(), [])

    def test_ranks_listing(self):
        for r in (5, 0, 9):
            self.seg.register(r, "h:%d" % r, WID)
        listed = self.seg.ranks()
        self.assertEqual([r.rank for r in listed], [0, 5, 9])
        self.assertIsNone(listed[0].raw)
        self.assertIsNone(listed[0].weights_info_dict)
        self.assertNotIn("bytes=", repr(listed[0]))  # unknown in a listing, not 0
        self.assertIn("bytes=%d" % len(self.seg.lookup_raw(0)), repr(self.seg.lookup(0)))
        self.assertEqual(listed[1].session_id, "h:5")

    def test_wait(self):
        with self.assertRaises(TimeoutError) as cm:
            self.seg.wait(7, timeout=0.05)
        self.assertIsInstance(cm.exception, kvcoord.WaitTimeoutError)
        self.assertEqual(cm.exception.code, 10)
        self.assertIn("0.05 s", str(cm.exception))
        with self.assertRaises(TimeoutError):
            self.seg.wait(7, 0)
        t = threading.Timer(0.05, lambda: self.seg.register(7, "h:7", WID))
        t.start()
        ri = self.seg.wait(7, timeout=DEADLINE)
        t.join()
        self.assertEqual(ri.session_id, "h:7")
        self.assertEqual(self.seg.wait(7).generation, 1)  # registered: returns at once
        for bad in (-1, float("nan")):
            with self.assertRaises(ValueError):
                self.seg.wait(7, bad)
        with self.assertRaises(TypeError):
            self.seg.wait(7, "1")

    def test_epoch(self):
        ep = self.seg.epoch()
        self.assertFalse(self.seg.wait_change(ep, 0.01))
        self.seg.register(0, "h:0", WID)
        self.assertTrue(self.seg.wait_change(ep, 0))
        self.assertNotEqual(self.seg.epoch(), ep)

    def test_stat(self):
        st = self.seg.stat()
        self.assertEqual(st["max_ranks"], 64)
        self.assertEqual(st["max_rooms"], 256)
        self.assertEqual(st["world_size"], 8)
        self.assertEqual(st["layout_version"], kvcoord.LAYOUT_VERSION)
        self.assertEqual(st["creator_pid"], os.getpid())


class RolesAndParallelism(SegmentCase):
    """Transfer-engine info keyed by (rank, role), and parallelism configs."""

    CFG = {"tp_size": 8, "tp_rank": 3, "pp_size": 1, "pp_rank": 0, "ep_size": 1, "ep_rank": 0,
           "moe_tp_size": 8, "moe_tp_rank": 3, "attn_tp_size": 8, "attn_tp_rank": 3,
           "attn_dp_size": 1, "attn_dp_rank": 0, "world_size": 8, "global_rank": 3,
           "local_rank": 3}

    def test_draft_does_not_overwrite_target(self):
        s = self.seg
        self.assertEqual(s.roles(), ["target"])
        s.register(0, "target-session", {"target.weight": [1, 4, 2]})
        self.assertEqual(s.register(0, "draft-session", {"draft.weight": [1, 4, 2]}, role="draft"),
                         1)
        self.assertEqual(s.roles(), ["target", "draft"])
        self.assertEqual(s.lookup(0).info, ("target-session", {"target.weight": [1, 4, 2]}))
        self.assertEqual(s.role_lookup(0).session_id, "target-session")
        self.assertEqual(s.role_lookup(0, "target").session_id, "target-session")
        self.assertEqual(s.role_lookup(0, "draft").info, ("draft-session", {"draft.weight": [1, 4, 2]}))
        self.assertEqual(s.register(0, "target-session", {"target.weight": [1, 4, 2]},
                                    role=kvcoord.DEFAULT_ROLE), 1)  # the same entry
        self.assertEqual([r.rank for r in s.ranks()], [0])  # the rank table: the default role
        s.withdraw(0, "draft gone", role="draft")
        with self.assertRaises(kvcoord.WithdrawnError):
            s.role_lookup(0, "draft")
        self.assertEqual(s.lookup(0).session_id, "target-session")

    def test_role_errors(self):
        s = self.seg
        with self.assertRaises(KeyError) as cm:
            s.role_lookup(0, "draft")
        self.assertIn("role 'draft'", str(cm.exception))
        for bad in ("no space", "x" * 32, "a/b"):
            with self.assertRaises(ValueError, msg=bad):
                s.register(0, "h:0", WID, role=bad)
        with self.assertRaises(TypeError):
            s.register(0, "h:0", WID, role=5)
        for i in range(kvcoord.RANK_ROLES - 1):
            s.register(0, "h:0", WID, role="r%d" % i)
        with self.assertRaises(kvcoord.Error) as cm:
            s.register(0, "h:0", WID, role="one-too-many")
        self.assertIn("keeps %d roles" % kvcoord.RANK_ROLES, str(cm.exception))
        self.assertEqual(len(s.roles()), kvcoord.RANK_ROLES)

    def test_parallelism_config(self):
        s = self.seg
        with self.assertRaises(KeyError) as cm:
            s.parallelism_config(3)
        self.assertIn("parallelism config of rank 3", str(cm.exception))
        self.assertEqual(s.parallelism_register(3, self.CFG), 1)
        self.assertEqual(s.parallelism_register(3, self.CFG), 1)  # identical: unchanged
        self.assertEqual(s.parallelism_config(3), self.CFG)
        self.assertEqual(s.parallelism_config(3, "target"), self.CFG)
        ri = s.parallelism_lookup(3)
        self.assertEqual((ri.session_id, ri.entries, ri.generation), ("", 15, 1))
        s.parallelism_register(3, {"tp_size": 1}, "draft")
        self.assertEqual(s.parallelism_config(3, "draft"), {"tp_size": 1})
        self.assertEqual(s.parallelism_config(3), self.CFG)
        with self.assertRaises(ValueError):
            s.parallelism_register(3, b"[1]")
        with self.assertRaises(TypeError):
            s.parallelism_register(3, [1])
        with self.assertRaises(ValueError):
            s.parallelism_register(64, self.CFG)
        with self.assertRaises(KeyError):
            s.lookup(3)  # a config is not transfer-engine info

    def test_worker_exit_withdraws_every_table(self):
        def child(i, name, cfg):
            with kvcoord.Segment(name, rank=5) as seg:
                seg.register(5, "h:5", WID)
                seg.register(5, "d:5", WID, role="draft")
                seg.parallelism_register(5, cfg)
            return True

        rep = collect(fork_children(1, child, self.name, self.CFG))[0]
        self.assertNotIn("error", rep, rep.get("error"))
        for call in (lambda: self.seg.lookup(5), lambda: self.seg.role_lookup(5, "draft"),
                     lambda: self.seg.parallelism_lookup(5)):
            with self.assertRaises(kvcoord.WithdrawnError) as cm:
                call()
            self.assertIn("exited", str(cm.exception))

    def test_diag_check_counts_every_table(self):
        """kvcoord-diag check sees the role tables' arena blocks as published, not leaked."""
        import subprocess
        diag = os.path.join(os.environ.get("KVCOORD_BUILD_DIR", "build"), "kvcoord-diag")
        if not os.path.exists(diag):
            self.skipTest("kvcoord-diag not built")
        self.seg.register(0, "h:0", WID)
        self.seg.register(0, "d:0", WID, role="draft")
        self.seg.parallelism_register(0, self.CFG)
        self.seg.parallelism_register(1, self.CFG, role="draft")
        out = subprocess.run([diag, "--segment", self.name, "check"], capture_output=True,
                             text=True)
        self.assertEqual(out.returncode, 0, out.stdout + out.stderr)
        self.assertIn("verdict: healthy", out.stdout)


class BadArguments(SegmentCase):
    """Wrong types, negative or huge numbers, unencodable dicts: the documented
    exception with a clear message, and the segment unchanged."""

    def setUp(self):
        super().setUp()
        self.seg.register(0, "h:0", WID)
        self.before = self.snapshot()

    def snapshot(self):
        return [(r.rank, r.generation, r.session_id, self.seg.lookup_raw(r.rank))
                for r in self.seg.ranks()] + [self.seg.stat()["failures_total"],
                                              self.seg.stat()["rooms_live"]]

    def check(self, exc, call, text):
        with self.assertRaises(exc) as cm:
            call()
        self.assertIn(text, str(cm.exception))
        self.assertEqual(self.snapshot(), self.before)

    def test_ranks(self):
        s = self.seg
        self.check(ValueError, lambda: s.register(-1, "h:0", WID), "rank must be in 0..")
        self.check(ValueError, lambda: s.register(2 ** 64, "h:0", WID), "rank must be in 0..")
        self.check(ValueError, lambda: s.register(2 ** 32 - 1, "h:0", WID), "rank must be")
        self.check(ValueError, lambda: s.register(64, "h:0", WID), "max ranks")
        self.check(TypeError, lambda: s.register("0", "h:0", WID), "rank must be an int")
        self.check(TypeError, lambda: s.register(1.0, "h:0", WID), "rank must be an int")
        self.check(TypeError, lambda: s.register(True, "h:0", WID), "rank must be an int")
        self.check(TypeError, lambda: s.lookup(None), "rank must be an int")
        self.check(ValueError, lambda: s.lookup(-5), "rank must be in 0..")
        self.check(ValueError, lambda: s.lookup(10 ** 30), "rank must be in 0..")

    def test_session_id(self):
        s = self.seg
        self.check(TypeError, lambda: s.register(0, b"h:0", WID), "session_id must be a str")
        self.check(TypeError, lambda: s.register(0, None, WID), "session_id must be a str")
        self.check(ValueError, lambda: s.register(0, "", WID), "session_id")
        self.check(ValueError, lambda: s.register(0, "h\0:0", WID), "NUL")
        self.check(ValueError, lambda: s.register(0, "h" * 256, WID), "session_id")

    def test_weights_info_dict(self):
        s = self.seg
        self.check(TypeError, lambda: s.register(0, "h:0", {"a": object()}),
                   "not JSON serializable")
        self.check(TypeError, lambda: s.register(0, "h:0", {"a": {1, 2}}), "not JSON serializable")
        self.check(ValueError, lambda: s.register(0, "h:0", {"a": [float("nan")]}),
                   "Out of range float")
        self.check(TypeError, lambda: s.register(0, "h:0", [1, 2]), "must be a dict or bytes")
        self.check(TypeError, lambda: s.register(0, "h:0", '{"a":1}'), "must be a dict or bytes")
        self.check(TypeError, lambda: s.register(0, "h:0", None), "must be a dict or bytes")
        self.check(ValueError, lambda: s.register(0, "h:0", b"[1, 2]"), "JSON object")
        self.check(ValueError, lambda: s.register(0, "h:0", b'{"a": '), "")
        self.check(ValueError, lambda: s.register(0, "h:0", b"\xff\xfe"), "")
        big = {"k%d" % i: [i, i, 2] for i in range(200000)}  # > 4 MiB per rank
        self.check(ValueError, lambda: s.register(0, "h:0", big), "max info bytes")

    def test_rooms(self):
        s = self.seg
        self.check(ValueError, lambda: s.room_open(-1, 0), "bootstrap room must be in 0..")
        self.check(ValueError, lambda: s.room_open(2 ** 63, 0), "bootstrap room must be in 0..")
        self.check(TypeError, lambda: s.room_open("1", 0), "bootstrap room must be an int")
        self.check(ValueError, lambda: s.room_open(1, 8), "out of range")
        # each integer argument is named with its own range (not "rank" for participants)
        self.check(ValueError, lambda: s.room_open(1, 0, 33), "participants must be in 0..32, not 33")
        self.check(ValueError, lambda: s.room_open(3, 0, participants=-1),
                   "participants must be in 0..32, not -1")
        self.check(TypeError, lambda: s.room_open(3, 0, participants="2"),
                   "participants must be an int, not str")
        self.check(ValueError, lambda: s.room_get(1, -1),
                   "rank must be in 0..2147483647 or None, not -1")
        self.check(ValueError, lambda: s.room_wait(1, 1, rank=2 ** 31),
                   "rank must be in 0..2147483647 or None, not 2147483648")
        self.check(ValueError, lambda: s.room_open(1, 0, role="observer"), "room role")
        self.check(TypeError, lambda: s.room_open(1, 0, role=1), "room role must be a str")
        self.check(KeyError, lambda: s.room_set_state(1, 0, 3), "no room 1")
        self.check(ValueError, lambda: s.room_set_state(1, 0, 5), "KVPoll state must be in 0..4")
        self.check(ValueError, lambda: s.room_set_state(1, 0, -1), "KVPoll state must be")
        self.check(ValueError, lambda: s.room_fail(1, 64, "x"), "max ranks")
        self.check(ValueError, lambda: s.room_fail(1, s.stat()["world_size"], "x"),
                   "out of range for room 1: it has %d participants (ranks 0.."
                   % s.stat()["world_size"])
        ws = s.stat()["world_size"]
        self.check(ValueError, lambda: s.room_open(3, ws + 3, participants=0),
                   "rank %d out of range for room 3: it has %d participants (ranks 0..%d; "
                   "participants 0 means the segment's world size, %d)" % (ws + 3, ws, ws - 1, ws))
        self.check(TypeError, lambda: s.room_fail(1, 0, 42), "reason must be str, bytes or None, not int")
        self.check(ValueError, lambda: s.room_fail(1, 0, "a\0b"), "NUL")
        self.check(ValueError, lambda: s.room_fail(1, 0, "x", 2 ** 40), "failure code must be in")
        self.check(TypeError, lambda: s.room_fail(1, 0, "x", "5"), "failure code must be an int")
        self.check(KeyError, lambda: s.room_get(1), "no room 1")
        self.check(KeyError, lambda: s.room_release(1, 0), "no room 1")
        self.check(ValueError, lambda: s.room_wait(1, 1, timeout=-1), "timeout")
        self.check(ValueError, lambda: s.room_sync(0, [1], [1, 2]), "1 rooms but 2 states")
        self.check(TypeError, lambda: s.room_sync(0, 5), "sequence")
        self.check(ValueError, lambda: s.failures(2000), "limit")
        self.check(ValueError, lambda: s.rooms(state=7), "KVPoll state")


class Rooms(SegmentCase):
    def test_lifecycle(self):
        s, P = self.seg, kvcoord.KVPoll
        s.room_open(42, 0, 2, "prefill")
        s.room_open(42, 0, 2, "prefill")  # again: a no-op
        info = s.room_get(42, 0)
        self.assertEqual((info.room, info.state, info.participants, info.joined, info.released),
                         (42, P.Bootstrapping, 2, 1, 0))
        self.assertIs(info.state, P.Bootstrapping)
        self.assertEqual(info.local, (None, None))
        self.assertIsNone(info.failure)
        s.room_open(42, 1, 0 if s.stat()["world_size"] == 2 else 2, "decode")
        with self.assertRaises(ValueError):
            s.room_open(42, 1, 3)  # a count differing from the room's
        s.room_set_state(42, 0, P.Transferring)
        self.assertEqual(s.room_get(42).local, (P.Transferring, None))
        self.assertEqual(s.room_state(42), P.Bootstrapping)  # rank 1 has not written
        self.assertEqual(s.room_sync(1, [42], [P.Transferring]), [P.Transferring])
        self.assertEqual(s.room_sync(0, [42]), [P.Transferring])
        with self.assertRaises(KeyError) as cm:  # stops at the unknown room, names it
            s.room_sync(0, [42, 999], [P.Transferring, P.Transferring])
        self.assertIn("999", str(cm.exception))
        self.assertEqual(s.room_sync(0, []), [])
        s.room_set_state(42, 0, P.Success)
        self.assertEqual(s.room_state(42), P.Transferring)
        s.room_set_state(42, 1, P.Success)
        self.assertEqual(s.room_state(42), P.Success)  # all: terminal
        s.room_set_state(42, 1, P.Failed)  # ignored once terminal
        self.assertEqual(s.room_state(42), P.Success)
        self.assertEqual(s.check_room(42, 0).state, P.Success)
        self.assertEqual([r.room for r in s.rooms()], [42])
        self.assertEqual(s.rooms(state=P.Failed), [])
        s.room_release(42, 0)
        s.room_release(42, 1)
        with self.assertRaises(KeyError):
            s.room_get(42)

    def test_reported_failures_do_not_fill_the_table(self):
        # Failures reported for rooms nobody opened fill an 8-room table; a
        # worker's new room evicts the oldest (FullError before), which a
        # late joiner still finds Failed (from the ring).
        name = new_name("evict")
        try:
            with kvcoord.Segment(name, mode="fresh", rank=0, **dict(SMALL, max_rooms=8)) as s:
                for i in range(8):
                    self.assertTrue(s.room_fail(100 + i, 0, "reported, never opened"))
                    time.sleep(0.005)  # distinct coarse stamps: 100 is the oldest
                s.room_open(200, 0, 2, "prefill")
                self.assertEqual(s.stat()["rooms_evicted"], 1)
                with self.assertRaises(KeyError):
                    s.room_get(100)
                s.room_open(100, 0, 2, "prefill")  # evicts 101
                self.assertIs(s.room_state(100), kvcoord.KVPoll.Failed)
                self.assertEqual(s.room_failure(100, 0).reason, "reported, never opened")
                self.assertEqual(s.stat()["rooms_evicted"], 2)
                # a later report of an evicted room is not the first: the
                # ring's failure wins (101 was evicted just above)
                self.assertFalse(s.room_fail(101, 1, "reported again"))
                self.assertEqual(s.room_failure(101, 0).reason, "reported, never opened")
                self.assertEqual(s.room_failure(101, 0).origin_rank, 0)
        finally:
            discard(name)

    def test_timed_out_room_names_no_rank(self):
        name = new_name("ttl")
        try:
            with kvcoord.Segment(name, mode="fresh", role="client", **dict(SMALL, room_ttl=0.05)) as s:
                s.room_open(9, 0, 2)
                time.sleep(0.15)
                for rank in (0, 1, None):  # every rank (and an outside observer): not its own
                    f = s.room_failure(9, rank)
                    self.assertEqual((f.origin_rank, f.code), (kvcoord.ORIGIN_RANK_NONE, 110))
                    self.assertTrue(f.is_from_another_rank)
                    self.assertIn("timed out, no rank recorded it", f.text)
                    self.assertNotIn("on rank", f.text)
        finally:
            discard(name)

    def test_failure_record(self):
        s = self.seg
        s.room_open(7, 0, 2)
        s.room_open(7, 1, 2)
        self.assertTrue(s.room_fail(7, 1, "ibv_post_send: transport retry counter exceeded", 12))
        self.assertFalse(s.room_fail(7, 0, "later reason", 5))  # first record wins
        f = s.room_failure(7, 0)
        self.assertEqual((f.room, f.origin_rank, f.origin_pid, f.code, f.reason),
                         (7, 1, os.getpid(), 12, "ibv_post_send: transport retry counter exceeded"))
        self.assertTrue(f.is_from_another_rank)
        self.assertFalse(s.room_failure(7, 1).is_from_another_rank)
        self.assertTrue(s.room_failure(7).is_from_another_rank)  # outside observer
        self.assertIn("failed on rank 1", f.text)
        self.assertGreater(f.time_ns, 0)
        self.assertEqual(s.room_state(7), kvcoord.KVPoll.Failed)
        for rank, other in ((0, True), (1, False)):
            with self.assertRaises(kvcoord.KVTransferError) as cm:
                s.check_room(7, rank)
            e = cm.exception
            self.assertEqual(str(e), "KVTransferError(bootstrap_room=7): "
                             "ibv_post_send: transport retry counter exceeded")
            self.assertEqual((e.bootstrap_room, e.is_from_another_rank, e.origin_rank, e.code),
                             (7, other, 1, 12))
        recent = s.failures(10)
        self.assertEqual([(r.room, r.code) for r in recent], [(7, 12)])
        self.assertEqual(s.failures(0), [])
        # set_state(Failed) without a record records one
        s.room_open(8, 0, 2)
        s.room_set_state(8, 0, kvcoord.KVPoll.Failed)
        self.assertEqual(s.room_failure(8).reason, "rank 0 reported Failed")
        # a failure for a room nobody opened creates it (not lost)
        self.assertTrue(s.room_fail(9, 3, None))
        self.assertEqual(s.room_failure(9).reason, "no reason given")

    def test_reason_truncated_on_character(self):
        s = self.seg
        s.room_fail(11, 0, "\u00e9" * 200)  # 400 bytes
        reason = s.room_failure(11).reason
        self.assertLessEqual(len(reason.encode()), kvcoord.REASON_MAX)
        self.assertEqual(set(reason), {"\u00e9"})

    def test_wait(self):
        s, P = self.seg, kvcoord.KVPoll
        s.room_open(5, 0, 2)
        with self.assertRaises(TimeoutError) as cm:
            s.room_wait(5, P.Bootstrapping, 0, timeout=0.05)
        self.assertIn("still Bootstrapping", str(cm.exception))
        t = threading.Timer(0.05, lambda: s.room_fail(5, 1, "peer gone", 104))
        t.start()
        info = s.room_wait(5, P.Bootstrapping, 0, timeout=DEADLINE)
        t.join()
        self.assertEqual(info.state, P.Failed)
        self.assertEqual(info.failure.reason, "peer gone")
        with self.assertRaises(KeyError):
            s.room_wait(6, P.Bootstrapping, timeout=1)

    def test_room_object(self):
        P = kvcoord.KVPoll
        with self.assertRaises(ValueError):
            self.seg.room(3)  # no rank anywhere
        with self.seg.room(3, rank=0, participants=1) as room:
            room.set_state(P.Transferring)
            self.assertEqual(room.state(), P.Transferring)
            self.assertEqual(room.check(), P.Transferring)
            self.assertEqual(room.info().joined, 1)
            self.assertIsNone(room.failure())
            self.assertTrue(room.fail("disk on fire", 5))
            with self.assertRaises(kvcoord.KVTransferError) as cm:
                room.check()
            self.assertFalse(cm.exception.is_from_another_rank)
            self.assertEqual(room.wait(P.Transferring, 1).state, P.Failed)
        with self.assertRaises(KeyError):
            self.seg.room_get(3)  # released by its only participant: reclaimed
        room.release()  # idempotent

    def test_procs_and_reap(self):
        procs = self.seg.procs()
        me = [p for p in procs if p.pid == os.getpid()]
        self.assertEqual(len(me), 1)
        self.assertEqual((me[0].role, me[0].rank, me[0].alive), ("client", None, True))
        self.assertEqual(self.seg.reap_dead(), 0)
        self.assertEqual(self.seg.room_sweep(), 0)


class Threads(SegmentCase):
    def test_gil_released_while_waiting(self):
        """A thread keeps running Python code while another sleeps in a wait."""
        inside = threading.Event()
        result = {}

        def waiter():
            inside.set()
            result["info"] = self.seg.wait(3, timeout=DEADLINE)

        t = threading.Thread(target=waiter)
        t.start()
        inside.wait()
        count = 0
        end = time.monotonic() + 0.3
        while time.monotonic() < end:  # pure Python: needs the GIL
            count += 1
        self.assertTrue(t.is_alive())  # still waiting, yet this thread ran
        self.assertGreater(count, 1000)
        self.seg.register(3, "h:3", WID)
        t.join(DEADLINE)
        self.assertEqual(result["info"].session_id, "h:3")

    def test_gil_released_in_room_wait(self):
        self.seg.room_open(1, 0, 2)
        done = threading.Event()

        def waiter():
            try:
                self.seg.room_wait(1, kvcoord.KVPoll.Bootstrapping, 0, timeout=DEADLINE)
            finally:
                done.set()

        t = threading.Thread(target=waiter)
        t.start()
        count = sum(1 for _ in range(200000))  # runs while the waiter sleeps
        self.assertEqual(count, 200000)
        self.assertFalse(done.is_set())
        self.seg.room_fail(1, 1, "stop")
        t.join(DEADLINE)
        self.assertTrue(done.is_set())

    def test_many_threads(self):
        errors = []

        def work(i):
            try:
                for n in range(300):
                    self.seg.register(i, "h:%d" % i, {"n": [n, 1, 2]})
                    self.assertEqual(self.seg.lookup(i).weights_info_dict, {"n": [n, 1, 2]})
                    self.seg.room_open(1000 + i, 0, 1)
                    self.seg.room_set_state(1000 + i, 0, kvcoord.KVPoll.Success)
                    self.seg.room_release(1000 + i, 0)
            except Exception as e:  # reported below
                errors.append(repr(e))

        threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.assertEqual(errors, [])
        self.assertEqual([r.generation for r in self.seg.ranks()], [300] * 8)

    def test_close_while_another_thread_waits(self):
        self.seg.room_open(2, 0, 2)
        seen = []

        def waiter():
            try:
                self.seg.room_wait(2, kvcoord.KVPoll.Bootstrapping, 0, timeout=DEADLINE)
            except Exception as e:  # the closed handle ends the wait
                seen.append(e)

        t = threading.Thread(target=waiter)
        t.start()
        time.sleep(0.05)
        self.seg.close()  # waits for the waiter's current slice, never frees under it
        t.join(DEADLINE)
        self.assertFalse(t.is_alive())
        self.assertEqual(len(seen), 1)
        self.assertIsInstance(seen[0], ValueError)
        self.assertIn("closed", str(seen[0]))


class ForkRule(unittest.TestCase):
    """A Segment does not cross fork(): the child must open its own."""

    def setUp(self):
        self.name = new_name("fork")
        self.seg = kvcoord.Segment(self.name, mode="fresh", rank=0, **SMALL)
        self.seg.register(0, "h:0", WID)
        self.seg.room_open(77, 0, 2)

    def tearDown(self):
        self.seg.close()
        discard(self.name)

    def test_child_must_open_its_own(self):
        def child(i, seg, name):
            out = {"forked": seg.forked}
            try:
                seg.lookup(0)
                out["inherited"] = "no error"
            except kvcoord.ForkedSegmentError as e:
                out["inherited"] = str(e)
            seg.close()  # only unmaps the parent's handle here
            with kvcoord.Segment(name, rank=1) as own:
                own.register(1, "h:1", WID)
                own.room_open(77, 1, 2)
                own.room_release(77, 1)
                out["parent_rank"] = own.lookup(0).session_id
            return out

        [(pid, r)] = fork_children(1, child, self.seg, self.name)
        rep = collect([(pid, r)])[0]
        self.assertNotIn("error", rep, rep.get("error"))
        res = rep["result"]
        self.assertTrue(res["forked"])
        self.assertIn("before fork()", res["inherited"])
        self.assertEqual(res["parent_rank"], "h:0")
        self.assertFalse(self.seg.forked)
        # the parent is untouched: its rank, its process entry, its room
        self.assertEqual(self.seg.lookup(0).session_id, "h:0")
        self.assertIn(os.getpid(), [p.pid for p in self.seg.procs()])
        self.assertEqual(self.seg.room_state(77), kvcoord.KVPoll.Bootstrapping)
        # the child was a worker and exited cleanly: its rank was withdrawn
        with self.assertRaises(kvcoord.WithdrawnError):
            self.seg.lookup(1)


if __name__ == "__main__":
    unittest.main()
