#!/usr/bin/python3
"""kvcoord-diag against segments in known states.

diag_fixture (tests/diag/fixture.c) puts each segment in its state through
libkvcoord: empty; 8 ranks; rooms in every KVPoll state; a failure record; a
worker SIGKILLed while holding the ranks lock (inside the publish window) or
the rooms lock (undo record saved); a live process stuck holding a lock; a
stale process entry; a segment of another layout version; truncated files.
Every command is run against them; --json output is parsed and checked field
by field; the exit status of check in each state; repair brings a broken
segment back to check = 0 without losing committed registrations; rdma on a
host without RDMA devices says so with the reason.  No wall-clock time is
asserted (timeouts below only guard against a hang).

Usage: test_diag.py --diag PATH --fixture PATH [unittest args]
"""

import argparse
import json
import os
import re
import pty
import resource
import signal
import subprocess
import sys
import termios
import time
import unittest

ARGS = None
# The layout version this build reads and writes (kvcoord.h), not a copy.
with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "include",
                       "kvcoord", "kvcoord.h"), encoding="utf-8") as _h:
    LAYOUT = int(next(line.split()[2].rstrip("u") for line in _h
                      if line.startswith("#define KVC_LAYOUT_VERSION ")))
EXIT_OK, EXIT_DEGRADED, EXIT_BROKEN, EXIT_NO_RDMA, EXIT_USAGE = 0, 1, 2, 3, 2
COMMANDS = ["status", "ranks", "rooms", "failures", "procs", "locks", "check", "repair",
            "unlink", "rdma", "watch"]
CHECK_IDS = {"header.magic", "header.version", "header.sizes", "header.file", "header.creator",
             "locks.ranks", "locks.procs", "locks.rooms", "ranks.seq", "ranks.slot",
             "ranks.owner", "ranks.overlap", "ranks.count", "arena.bitmap", "arena.used",
             "procs.entry", "procs.alive", "rooms.undo", "rooms.count", "rooms.seq", "rooms.slot",
             "rooms.probe", "rooms.ranks", "rooms.fields", "rooms.liveness", "rooms.ttl",
             "failures.ring", "locks.pd", "pd.seq", "pd.undo", "pd.owner", "pd.rooms.slot",
             "pd.rooms.probe", "pd.count", "pd.table"}
_counter = [0]


def unique_name():
    _counter[0] += 1
    return "kvcdiag-%d-%d" % (os.getpid(), _counter[0])


def info_json(n, tag):
    """The weights_info_dict diag_fixture registers for rank `tag`, byte for byte."""
    items = ['"model.layers.%d.w%d":[%d,%d,2]' % (i, tag, 0x7f0000000000 + i * 256, 4096 + tag)
             for i in range(n)]
    return "{" + ",".join(items) + "}"


def diag(name, *args, json_out=False, timeout=60, stdin=subprocess.DEVNULL):
    """Run kvcoord-diag on segment name; (rc, stdout or parsed JSON, stderr)."""
    cmd = [ARGS.diag, "--segment", name] + (["--json"] if json_out else []) + list(args)
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, stdin=stdin,
                       check=False)
    out = p.stdout
    if json_out:
        try:
            out = json.loads(p.stdout)
        except ValueError as e:
            raise AssertionError("%s: not JSON (%s): %r / %r" % (cmd, e, p.stdout, p.stderr))
    return p.returncode, out, p.stderr


def proc_state(pid):
    try:
        with open("/proc/%d/stat" % pid, encoding="ascii") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None


class Fixture:
    """diag_fixture NAME SCENARIO [--hold]; the segment is removed on exit."""

    def __init__(self, scenario, hold=False):
        self.name = unique_name()
        self.scenario = scenario
        self.hold = hold
        self.proc = None
        self.holder = None

    def __enter__(self):
        try:
            return self._start()
        except BaseException:
            self.__exit__(None, None, None)
            raise

    def _start(self):
        cmd = [ARGS.fixture, self.name, self.scenario] + (["--hold"] if self.hold else [])
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True)
        self.pid = self.proc.pid
        for line in self.proc.stdout:
            if line.startswith("holder "):
                self.holder = int(line.split()[1])
            if line.strip() == "ready":
                break
        else:
            raise AssertionError("diag_fixture %s failed: %s" % (self.scenario, self.proc.wait()))
        if not self.hold:
            assert self.proc.wait(30) == 0
        return self

    def kill(self):
        """Make a held fixture SIGKILL itself; returns once it is a zombie or gone."""
        self.proc.stdin.write("kill\n")
        self.proc.stdin.flush()
        for _ in range(3000):
            if proc_state(self.pid) in (None, "Z"):
                return
            time.sleep(0.01)
        raise AssertionError("fixture did not die")

    def __exit__(self, *exc):
        if self.proc is None:
            self._unlink()
            return
        try:
            self.proc.stdin.close()
        except BrokenPipeError:
            pass
        if self.proc.poll() is None:
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc.stdout.close()
        self._unlink()

    def _unlink(self):
        try:
            os.unlink("/dev/shm/" + self.name)
        except FileNotFoundError:
            pass


def findings(doc, severity=None):
    return [f for f in doc["findings"] if severity is None or f["severity"] == severity]


def problem_ids(doc):
    return {f["check"] for f in doc["findings"] if f["severity"] in ("degraded", "broken")}


class Base(unittest.TestCase):
    def assert_doc(self, doc, command, name):
        self.assertEqual(doc["schema"], 1)
        self.assertEqual(doc["command"], command)
        self.assertEqual(doc["segment"], name)

    def assert_check(self, name, rc_want, broken=(), degraded=()):
        rc, doc, err = diag(name, "check", json_out=True)
        self.assertEqual(rc, rc_want, (doc, err))
        self.assert_doc(doc, "check", name)
        self.assertEqual(doc["exit_code"], rc_want)
        self.assertEqual(doc["verdict"], ["healthy", "degraded", "broken"][rc_want])
        got_broken = {f["check"] for f in findings(doc, "broken")}
        got_degraded = {f["check"] for f in findings(doc, "degraded")}
        self.assertEqual(got_broken, set(broken), doc["findings"])
        self.assertEqual(got_degraded, set(degraded), doc["findings"])
        for f in doc["findings"]:
            self.assertIn(f["check"], CHECK_IDS)
            self.assertIn(f["severity"], ("ok", "info", "degraded", "broken"))
            self.assertTrue(f["message"])
        self.assertEqual(doc["counts"]["broken"], len(findings(doc, "broken")))
        self.assertEqual(doc["counts"]["degraded"], len(findings(doc, "degraded")))
        return doc

    def locks(self, name):
        rc, doc, _ = diag(name, "locks", json_out=True)
        self.assertEqual(rc, 0)
        self.assert_doc(doc, "locks", name)
        stripes = ["rooms.%d" % i for i in range(64)]
        self.assertEqual([l["name"] for l in doc["locks"]], ["ranks", "procs"] + stripes + ["pd"])
        out = {l["name"]: l for l in doc["locks"]}
        # "rooms": the one room stripe lock that is not free (the fixtures
        # touch one room), else stripe 0.
        busy = [out[n] for n in stripes if out[n]["state"] != "free"]
        self.assertLessEqual(len(busy), 1)
        out["rooms"] = busy[0] if busy else out["rooms.0"]
        return out

    def ranks(self, name, *args):
        rc, doc, err = diag(name, "ranks", *args, json_out=True)
        self.assertEqual(rc, 0, err)
        self.assert_doc(doc, "ranks", name)
        self.assertEqual(doc["count"], len(doc["ranks"]))
        return {r["rank"]: r for r in doc["ranks"]}


class HelpAndUsage(Base):
    SECTIONS = ("NAME", "SYNOPSIS", "DESCRIPTION", "OPTIONS", "EXIT STATUS")

    def test_tool_help(self):
        for args in (["--help"], ["help"], ["-h"]):
            p = subprocess.run([ARGS.diag] + args, capture_output=True, text=True, check=False)
            self.assertEqual(p.returncode, 0)
            for section in ("NAME", "SYNOPSIS", "DESCRIPTION", "COMMANDS", "GLOBAL OPTIONS",
                            "EXIT STATUS", "EXAMPLES"):
                self.assertIn("\n" + section if section != "NAME" else section, p.stdout)
            for c in COMMANDS:
                self.assertIn("\n  %s " % c, p.stdout)
            self.assertIn("or a usage error", p.stdout)
            self.assertNotIn("  64 ", p.stdout)

    def test_version_as_kvcoordd_prints_it(self):
        want = subprocess.run([ARGS.daemon, "--version"], capture_output=True, text=True,
                              check=True).stdout
        self.assertTrue(want.startswith("kvcoordd "), want)
        for opt in ("--version", "-V"):
            p = subprocess.run([ARGS.diag, opt], capture_output=True, text=True, check=False)
            self.assertEqual((p.returncode, p.stdout, p.stderr),
                             (0, "kvcoord-diag" + want[len("kvcoordd"):], ""))

    def test_each_command_help(self):
        for c in COMMANDS:
            a = subprocess.run([ARGS.diag, "help", c], capture_output=True, text=True, check=False)
            b = subprocess.run([ARGS.diag, c, "--help"], capture_output=True, text=True,
                               check=False)
            self.assertEqual((a.returncode, b.returncode), (0, 0), c)
            self.assertEqual(a.stdout, b.stdout, c)
            for section in self.SECTIONS:
                self.assertIn(section, a.stdout, c)
            self.assertIn("kvcoord-diag %s - " % c, a.stdout)
            if c not in ("watch", "rdma", "unlink"):
                self.assertIn("--json", a.stdout, c)

    def test_usage_errors_exit_2(self):
        name = unique_name()
        cases = [["bogus"], [], ["--bogus", "status"], ["status", "--bogus"], ["check", "extra"],
                 ["ranks", "--rank", "-1"], ["ranks", "--rank", "x"], ["ranks", "--full"],
                 ["rooms", "--state", "Nope"], ["rooms", "--limit", "many"],
                 ["watch", "--interval", "0"], ["--lock-timeout", "0", "status"], ["--port", "0", "status"],
                 ["help", "bogus"]]
        for args in cases:
            p = subprocess.run([ARGS.diag, "--segment", name] + args, capture_output=True,
                               text=True, check=False)
            self.assertEqual(p.returncode, EXIT_USAGE, (args, p.stderr))
            self.assertIn("kvcoord-diag", p.stderr)
            # what tells it from a broken segment (also 2): nothing on stdout
            self.assertEqual(p.stdout, "", args)
        p = subprocess.run([ARGS.diag, "--segment", "bad/name", "status"], capture_output=True,
                           text=True, check=False)
        self.assertEqual(p.returncode, EXIT_USAGE)
        rc, _, err = diag(name, "--json", "watch")
        self.assertEqual(rc, EXIT_USAGE)

    def test_each_option_states_one_range(self):
        # whatever is wrong with the value (a number outside, a non-number),
        # the message states the same range, the one really accepted
        name = unique_name()
        cases = [("--port", ["0", "65536", "x", "-1"], "--port must be an integer in 1..65535"),
                 ("--lock-timeout", ["0", "3600001", "x"],
                  "--lock-timeout must be an integer in 1..3600000")]
        for opt, values, text in cases:
            for v in values:
                seg = [] if opt == "--port" else ["--segment", name]  # alternatives
                p = subprocess.run([ARGS.diag] + seg + [opt, v, "status"],
                                   capture_output=True, text=True, check=False)
                self.assertEqual(p.returncode, EXIT_USAGE, (opt, v, p.stderr))
                self.assertIn("%s, not '%s'" % (text, v), p.stderr)
        p = subprocess.run([ARGS.diag, "--help"], capture_output=True, text=True, check=False)
        self.assertIn("1..65535", p.stdout)
        self.assertIn("1..3600000", p.stdout)
        for v in ("4294967295", "-1", "x"):  # one rank range, the library's (KVC_RANK_MAX)
            p = subprocess.run([ARGS.diag, "--segment", name, "ranks", "--rank", v],
                               capture_output=True, text=True, check=False)
            self.assertEqual(p.returncode, EXIT_USAGE, (v, p.stderr))
            self.assertIn("--rank must be an integer in 0..4294967294, not '%s'" % v, p.stderr)

    def test_global_options_after_the_command(self):
        with Fixture("empty") as fx:
            p = subprocess.run([ARGS.diag, "status", "--segment", fx.name, "--json"],
                               capture_output=True, text=True, check=False)
            self.assertEqual(p.returncode, 0, p.stderr)
            self.assertEqual(json.loads(p.stdout)["segment"], fx.name)


class Missing(Base):
    def test_no_segment(self):
        name = unique_name()
        for c in ("status", "check", "ranks", "rooms", "failures", "procs", "locks", "repair"):
            rc, doc, _ = diag(name, c, json_out=True)
            self.assertEqual(rc, EXIT_BROKEN, c)
            self.assert_doc(doc, c, name)
            self.assertFalse(doc["readable"])
            self.assertFalse(doc["exists"])
            self.assertEqual(doc["error"]["code"], "KVC_E_NOENT")
            self.assertEqual(doc["verdict"], "broken")
            self.assertEqual(doc["exit_code"], 2)
        rc, out, err = diag(name, "status")
        self.assertEqual(rc, EXIT_BROKEN)
        self.assertIn("no segment %s" % name, err)
        self.assertIn("verdict: broken", out)
        rc, _, _ = diag(name, "unlink", "--yes")
        self.assertEqual(rc, EXIT_BROKEN)


class Empty(Base):
    def test_status(self):
        with Fixture("empty") as fx:
            rc, doc, err = diag(fx.name, "status", json_out=True)
            self.assertEqual(rc, 0, err)
            self.assert_doc(doc, "status", fx.name)
            self.assertTrue(doc["readable"])
            self.assertEqual(doc["path"], "/dev/shm/" + fx.name)
            h = doc["header"]
            self.assertEqual(h["magic_text"], "COKVCRD1")
            self.assertTrue(h["magic_ok"])
            self.assertEqual(h["magic"], "0x31445243564b4f43")
            self.assertEqual(h["layout_version"], LAYOUT)
            self.assertEqual(h["build_layout_version"], LAYOUT)
            self.assertEqual(h["total_bytes"], h["file_bytes"])
            self.assertEqual(h["file_bytes"], os.stat("/dev/shm/" + fx.name).st_size)
            self.assertEqual(h["file_mode"], "0600")
            self.assertEqual(h["creator_pid"], fx.pid)
            self.assertFalse(h["creator_alive"])
            self.assertGreater(h["created_ns"], 0)
            self.assertGreaterEqual(h["updated_ns"], h["created_ns"])
            self.assertTrue(h["created_utc"].endswith("Z"))
            for k in ("header_size", "rank_entry_size", "proc_size", "lock_size", "room_size"):
                self.assertGreater(h[k], 0)
            self.assertEqual(h["block_size"], 1024)
            cap = doc["capacities"]
            self.assertEqual((cap["max_ranks"], cap["max_procs"], cap["max_rooms"],
                              cap["world_size"]), (64, 64, 256, 8))
            # 64 stripes, each with its share of the rooms and room to spare.
            self.assertEqual(cap["room_slots"] % 64, 0)
            self.assertGreaterEqual(cap["room_slots"], 256 * 5 // 4)
            self.assertEqual(cap["arena_bytes"], 64 << 20)
            self.assertEqual(cap["max_info_bytes"], 8 << 20)
            self.assertEqual(cap["arena_used_bytes"], 0)
            self.assertEqual(cap["room_ttl_ms"], 300000)  # the default: sglang's waiting timeout, 300 s
            c = doc["counts"]
            for k in ("ranks_registered", "ranks_withdrawn", "rooms_live", "failures_total",
                      "failures_kept", "procs_attached", "procs_alive", "procs_dead",
                      "lock_recoveries"):
                self.assertEqual(c[k], 0, k)
            self.assertEqual(c["rooms_by_state"], {"Failed": 0, "Bootstrapping": 0,
                                                   "WaitingForInput": 0, "Transferring": 0,
                                                   "Success": 0})
            for l in doc["locks"]:
                self.assertEqual((l["state"], l["owner_pid"], l["recoveries"]), ("free", 0, 0))
            self.assertEqual(doc["verdict"], "healthy")
            self.assertEqual(doc["verdict_exit_code"], 0)
            self.assertEqual([f["check"] for f in doc["findings"]], ["header.creator"])
            rc, out, _ = diag(fx.name, "status")
            self.assertEqual(rc, 0)
            self.assertIn("verdict: healthy", out)
            self.assertIn("layout version   %d (this build reads %d)" % (LAYOUT, LAYOUT), out)

    def test_check_and_lists(self):
        with Fixture("empty") as fx:
            doc = self.assert_check(fx.name, 0)
            self.assertEqual({f["check"] for f in doc["findings"]}, CHECK_IDS)
            self.assertEqual(doc["stats"]["ranks_registered"], 0)
            self.assertEqual(self.ranks(fx.name), {})
            for c, key in (("rooms", "rooms"), ("failures", "failures"), ("procs", "procs")):
                rc, d, _ = diag(fx.name, c, json_out=True)
                self.assertEqual(rc, 0, c)
                self.assert_doc(d, c, fx.name)
                self.assertEqual((d["count"], d[key]), (0, []), c)
            rc, out, _ = diag(fx.name, "check")
            self.assertEqual(rc, 0)
            self.assertTrue(out.startswith("SEVERITY  CHECK"))
            self.assertIn("verdict: healthy", out)
            rc, out, _ = diag(fx.name, "check", "--quiet")
            self.assertEqual(out.strip().splitlines()[-1][:16], "verdict: healthy")


class EightRanks(Base):
    def test_ranks(self):
        with Fixture("ranks8") as fx:
            ranks = self.ranks(fx.name)
            self.assertEqual(sorted(ranks), list(range(8)))
            for r, e in ranks.items():
                sid = "[2001:db8::7]:16007" if r == 7 else "10.0.0.%d:%d" % (r + 1, 16000 + r)
                self.assertEqual(e["session_id"], sid)
                self.assertEqual(e["state"], "registered")
                self.assertEqual(e["entries"], 10 + r)
                self.assertEqual(e["info_bytes"], len(info_json(10 + r, r)))
                self.assertEqual(e["generation"], 1)
                self.assertEqual(e["pid"], fx.pid)
                self.assertFalse(e["pid_alive"])
                self.assertGreater(e["pid_start"], 0)
                self.assertFalse(e["owned_by_worker"])
                self.assertEqual(e["note"], "")
                self.assertGreater(e["registered_ns"], 0)
                self.assertTrue(e["registered_utc"].endswith("Z"))

    def test_overlap_counts_what_it_counts(self):
        # ranks.overlap names the ranks' info and the parallelism configs
        # apart (it said "9 registered ranks" beside ranks.count's 8)
        for scenario, want in (
                ("ranks8", "the info of the 8 registered ranks occupies disjoint arena blocks"),
                ("ranks8pcfg", "the info of the 8 registered ranks and 1 parallelism config "
                 "occupies disjoint arena blocks")):
            with Fixture(scenario) as fx:
                doc = self.assert_check(fx.name, 0)
                msg = {f["check"]: f["message"] for f in doc["findings"]}
                self.assertEqual(msg["ranks.overlap"], want, scenario)
                self.assertEqual(msg["ranks.count"], "ranks_registered (8) matches the entries")

    def test_cluster_without_etcd_is_healthy(self):
        """`cluster` with no --etcd reads the segment only: exit 0 when it can."""
        with Fixture("ranks8") as fx:
            rc, doc, err = diag(fx.name, "cluster", json_out=True)
            self.assertEqual(rc, 0, err)
            rc, out, err = diag(fx.name, "cluster")
            self.assertEqual(rc, 0, err)
            self.assertIn("8 local ranks", out)

    def test_one_rank_full_numbers_as_registered(self):
        """--json --full prints the stored dict's bytes: integers past 2^63 and reals
        past a double come out as registered (they were null through a jansson tree)."""
        raw = '{"w": [18446744073709551615, -9223372036854775808, 1E400, 0.10]}'
        with Fixture("bignum") as fx:
            rc, out, _ = diag(fx.name, "--json", "ranks", "--rank", "0", "--full")
            self.assertEqual(rc, 0)
            self.assertIn(raw, out)
            doc = json.loads(out)
            self.assertEqual(doc["rank"]["weights_info_dict"]["w"][:2],
                             [2**64 - 1, -2**63])
            self.assertEqual(doc["rank"]["session_id"], "10.0.0.1:16000")
            rc, out, _ = diag(fx.name, "ranks", "--rank", "0", "--full")
            self.assertEqual(rc, 0)
            self.assertIn(raw, out)

    def test_one_rank_full(self):
        with Fixture("ranks8") as fx:
            rc, doc, _ = diag(fx.name, "ranks", "--rank", "3", "--full", json_out=True)
            self.assertEqual(rc, 0)
            self.assertEqual(doc["rank"]["rank"], 3)
            self.assertEqual(doc["rank"]["weights_info_dict"], json.loads(info_json(13, 3)))
            rc, out, _ = diag(fx.name, "ranks", "--rank", "3", "--full")
            self.assertEqual(rc, 0)
            self.assertIn(info_json(13, 3), out)
            self.assertIn("13 entries, %d bytes" % len(info_json(13, 3)), out)
            rc, doc, _ = diag(fx.name, "ranks", "--rank", "7", json_out=True)
            self.assertEqual(rc, 0)
            self.assertEqual(doc["rank"]["session_id"], "[2001:db8::7]:16007")
            self.assertNotIn("weights_info_dict", doc["rank"])
            for missing in ("9", "64", "100000"):
                rc, doc, _ = diag(fx.name, "ranks", "--rank", missing, json_out=True)
                self.assertEqual(rc, EXIT_DEGRADED, missing)
                self.assertIsNone(doc["rank"])
                self.assertTrue(doc["error"])

    def test_text_tables_are_aligned(self):
        with Fixture("ranks8") as fx:
            rc, out, _ = diag(fx.name, "ranks")
            self.assertEqual(rc, 0)
            lines = out.splitlines()
            self.assertEqual(len(lines), 9)
            col = lines[0].index("SESSION_ID")
            gen = lines[0].index("GEN") + len("GEN")
            for line in lines[1:]:
                self.assertEqual(line[col - 2:col], "  ")
                self.assertNotEqual(line[col], " ")
                self.assertEqual(line[gen - 1], "1")  # right-aligned numbers
            self.assertEqual(out, out.rstrip(" "))
            self.assertIn("[2001:db8::7]:16007", out)

    def test_status_check(self):
        with Fixture("ranks8") as fx:
            rc, doc, _ = diag(fx.name, "status", json_out=True)
            self.assertEqual(doc["counts"]["ranks_registered"], 8)
            self.assertEqual(doc["capacities"]["arena_used_bytes"], 8 * 1024)
            chk = self.assert_check(fx.name, 0)
            self.assertEqual(chk["stats"]["ranks_registered"], 8)
            self.assertEqual(chk["stats"]["arena_published_blocks"], 8)
            self.assertEqual(chk["stats"]["arena_marked_blocks"], 8)
            self.assertEqual(self.locks(fx.name)["ranks"]["state"], "free")


class Rooms(Base):
    WANT = {1001: ("Bootstrapping", [-1, -1]), 1002: ("WaitingForInput", [2, 2]),
            1003: ("Transferring", [3, 4]), 1004: ("Success", [4, 4]), 1005: ("Failed", [-1, -1])}

    def rooms(self, name, *args):
        rc, doc, err = diag(name, "rooms", *args, json_out=True)
        self.assertEqual(rc, 0, err)
        self.assert_doc(doc, "rooms", name)
        return doc

    def test_every_state(self):
        with Fixture("rooms", hold=True) as fx:
            doc = self.rooms(fx.name)
            self.assertEqual((doc["count"], doc["shown"], doc["limit"]), (5, 5, 50))
            self.assertIsNone(doc["state_filter"])
            opened = [r["opened_ns"] for r in doc["rooms"]]
            self.assertEqual(opened, sorted(opened, reverse=True))
            for r in doc["rooms"]:
                state, local = self.WANT[r["room"]]
                self.assertEqual(r["state"], state)
                self.assertEqual(r["state_value"], ["Failed", "Bootstrapping", "WaitingForInput",
                                                    "Transferring", "Success"].index(state))
                self.assertEqual(r["state_code"], r["state_value"])  # the older name, schema 1
                self.assertEqual((r["participants"], r["joined"], r["released"]), (2, 2, 0))
                self.assertEqual(r["local"], local)
                self.assertGreaterEqual(r["updated_ns"], r["opened_ns"])
                if r["room"] == 1005:
                    f = r["failure"]
                    self.assertEqual((f["origin_rank"], f["code"], f["origin_pid"]),
                                     (1, 110, fx.pid))
                    self.assertTrue(f["reason"].startswith("RDMA WRITE to 10.0.0.2 timed out"))
                else:
                    self.assertIsNone(r["failure"])
            self.assert_check(fx.name, 0)
            rc, st, _ = diag(fx.name, "status", json_out=True)
            self.assertEqual(st["counts"]["rooms_live"], 5)
            self.assertEqual(set(st["counts"]["rooms_by_state"].values()), {1})
            self.assertEqual(st["counts"]["procs_alive"], 1)

    def test_filters(self):
        with Fixture("rooms", hold=True) as fx:
            doc = self.rooms(fx.name, "--state", "failed")
            self.assertEqual([r["room"] for r in doc["rooms"]], [1005])
            self.assertEqual(doc["state_filter"], "Failed")
            self.assertEqual([r["room"] for r in self.rooms(fx.name, "--state", "3")["rooms"]],
                             [1003])
            doc = self.rooms(fx.name, "--limit", "2")
            self.assertEqual((doc["count"], doc["shown"], len(doc["rooms"])), (5, 2, 2))
            rc, out, _ = diag(fx.name, "rooms", "--limit", "2")
            self.assertIn("(3 more not shown", out)
            rc, out, _ = diag(fx.name, "rooms", "--state", "Success")
            self.assertEqual(len(out.splitlines()), 2)
            self.assertIn("1004", out)

    def test_dead_participant_then_repair(self):
        with Fixture("rooms", hold=True) as fx:
            fx.kill()  # a zombie until we reap it: liveness must still say dead
            self.assert_check(fx.name, 1, degraded={"rooms.liveness", "procs.alive"})
            rc, doc, _ = diag(fx.name, "repair", json_out=True)
            self.assertEqual(rc, 0, doc)
            self.assert_doc(doc, "repair", fx.name)
            self.assertEqual(doc["before"]["verdict"], "degraded")
            self.assertEqual(doc["after"]["verdict"], "healthy")
            self.assertEqual(doc["after"]["findings"], [{"check": "header.creator",
                             "severity": "info", "message": doc["after"]["findings"][0]["message"]}])
            reaped = [a for a in doc["actions"] if a["action"] == "reap_process"]
            self.assertEqual(len(reaped), 1)
            self.assertEqual(reaped[0]["target"], "pid %d" % fx.pid)
            self.assertIn("3 rooms failed", reaped[0]["detail"])
            self.assertTrue(all(a["ok"] for a in doc["actions"]))
            self.assert_check(fx.name, 0)
            rooms = {r["room"]: r for r in self.rooms(fx.name)["rooms"]}
            for room in (1001, 1002, 1003):
                self.assertEqual(rooms[room]["state"], "Failed")
                self.assertIn("pid %d" % fx.pid, rooms[room]["failure"]["reason"])
                self.assertIn("killed by signal 9", rooms[room]["failure"]["reason"])
            self.assertEqual(rooms[1004]["state"], "Success")
            # A second repair has nothing to do.
            rc, doc, _ = diag(fx.name, "repair", json_out=True)
            self.assertEqual((rc, doc["actions"]), (0, []))


class Failures(Base):
    def test_failure_record(self):
        with Fixture("failure") as fx:
            rc, doc, _ = diag(fx.name, "failures", json_out=True)
            self.assertEqual(rc, 0)
            self.assert_doc(doc, "failures", fx.name)
            self.assertEqual((doc["count"], doc["failures_total"]), (1, 1))
            f = doc["failures"][0]
            self.assertEqual((f["room"], f["origin_rank"], f["code"], f["origin_pid"]),
                             (42, 5, 110, fx.pid))
            self.assertEqual(f["reason"], "transfer to decode rank 5 timed out")
            self.assertGreater(f["time_ns"], 0)
            rc, out, _ = diag(fx.name, "failures")
            self.assertIn("transfer to decode rank 5 timed out", out)
            self.assertTrue(out.startswith("TIME"))
            rc, doc, _ = diag(fx.name, "rooms", json_out=True)
            self.assertEqual(doc["rooms"][0]["room"], 42)
            self.assertEqual(doc["rooms"][0]["participants"], 8)
            self.assertEqual(doc["rooms"][0]["joined"], 0)
            rc, st, _ = diag(fx.name, "status", json_out=True)
            self.assertEqual(st["counts"]["failures_total"], 1)
            self.assertEqual(st["counts"]["rooms_by_state"]["Failed"], 1)
            self.assert_check(fx.name, 0)


    def test_room_ids_are_never_negative(self):
        # Room ids are 0..2^63-1 everywhere; an id beyond (a tampered record)
        # is printed as its decimal value, never as a negative number.
        top, tampered = 2 ** 63 - 1, 2 ** 64 - 1
        with Fixture("bigroom") as fx:
            rc, doc, _ = diag(fx.name, "rooms", json_out=True)
            self.assertEqual(rc, 0)
            self.assertIn(top, [r["room"] for r in doc["rooms"]])
            rc, doc, _ = diag(fx.name, "failures", json_out=True)
            rooms = [f["room"] for f in doc["failures"]]
            self.assertEqual(rooms, [str(tampered), top])
            for c in ("rooms", "failures"):
                rc, out, _ = diag(fx.name, c)
                self.assertEqual(rc, 0)
                self.assertIn(str(top), out)
                self.assertNotIn("-9223372036854775808", out)
                self.assertNotIn(" -1 ", out)
            rc, out, _ = diag(fx.name, "failures")
            self.assertIn(str(tampered), out)


class LockOwnerKilled(Base):
    def test_ranks_lock(self):
        with Fixture("lockdead-ranks") as fx:
            locks = self.locks(fx.name)
            dead = locks["ranks"]
            self.assertEqual(dead["state"], "owner_died")
            self.assertGreater(dead["owner_pid"], 0)
            self.assertFalse(dead["owner_alive"])
            self.assertEqual(dead["recoveries"], 0)
            self.assertEqual((locks["procs"]["state"], locks["rooms"]["state"]), ("free", "free"))
            doc = self.assert_check(fx.name, 2, broken={"locks.ranks", "ranks.seq"},
                                    degraded={"procs.alive", "arena.bitmap"})
            self.assertEqual(doc["stats"]["ranks_odd"], 1)
            seq = [f for f in doc["findings"] if f["check"] == "ranks.seq"][0]
            self.assertIn("rank 1:", seq["message"])
            lk = [f for f in doc["findings"] if f["check"] == "locks.ranks"][0]
            self.assertIn("pid %d" % dead["owner_pid"], lk["message"])
            rc, st, _ = diag(fx.name, "status", json_out=True)
            self.assertEqual((rc, st["verdict"], st["verdict_exit_code"]), (0, "broken", 2))
            rc, out, _ = diag(fx.name, "status")
            self.assertIn("verdict: broken", out)
            diag(fx.name, "procs", json_out=True)
            # Nothing so far changed the segment: the lock still awaits recovery.
            self.assertEqual(self.locks(fx.name)["ranks"]["state"], "owner_died")
            self.assert_check(fx.name, 2, broken={"locks.ranks", "ranks.seq"},
                              degraded={"procs.alive", "arena.bitmap"})

            rc, doc, _ = diag(fx.name, "repair", json_out=True)
            self.assertEqual(rc, 0, doc)
            self.assertEqual((doc["before"]["exit_code"], doc["after"]["exit_code"]), (2, 0))
            acts = {(a["action"], a["target"]) for a in doc["actions"]}
            self.assertIn(("recover_lock", "ranks lock"), acts)
            self.assertIn(("reap_process", "pid %d" % dead["owner_pid"]), acts)
            self.assert_check(fx.name, 0)
            after = self.locks(fx.name)["ranks"]
            self.assertEqual((after["state"], after["recoveries"]), ("free", 1))
            # Committed registrations survive; the interrupted one left no trace.
            ranks = self.ranks(fx.name)
            self.assertEqual(sorted(ranks), [0, 1, 2, 3])
            for r, e in ranks.items():
                self.assertEqual(e["session_id"], "10.0.0.%d:%d" % (r + 1, 16000 + r))
                self.assertEqual(e["generation"], 1)
                self.assertEqual(e["info_bytes"], len(info_json(10 + r, r)))

    def test_reading_ranks_recovers_like_any_reader(self):
        with Fixture("lockdead-ranks") as fx:
            rc, doc, err = diag(fx.name, "ranks", json_out=True)
            self.assertEqual(rc, 0, err)
            self.assertTrue(doc["recovered_lock"])
            self.assertEqual(doc["ranks"][1]["session_id"], "10.0.0.2:16001")
            self.assertEqual(self.locks(fx.name)["ranks"]["state"], "free")
            # The dead worker's entry is still there until reaped.
            self.assert_check(fx.name, 1, degraded={"procs.alive"})

    def test_rooms_lock(self):
        with Fixture("lockdead-rooms") as fx:
            self.assertEqual(self.locks(fx.name)["rooms"]["state"], "owner_died")
            self.assert_check(fx.name, 2, broken={"locks.rooms", "rooms.undo"},
                              degraded={"procs.alive"})
            rc, doc, _ = diag(fx.name, "repair", json_out=True)
            self.assertEqual(rc, 0, doc)
            self.assertIn(("recover_lock", True),
                          {(a["action"], bool(re.fullmatch(r"rooms\.\d+ lock", a["target"])))
                           for a in doc["actions"]})
            self.assert_check(fx.name, 0)
            rc, rooms, _ = diag(fx.name, "rooms", json_out=True)
            self.assertEqual(rooms["count"], 0)  # the interrupted room creation was rolled back
            self.assertEqual(sorted(self.ranks(fx.name)), [0, 1, 2, 3])

    def test_text_output(self):
        with Fixture("lockdead-ranks") as fx:
            rc, out, _ = diag(fx.name, "locks")
            self.assertEqual(rc, 0)
            self.assertIn("owner_died", out)
            rc, out, _ = diag(fx.name, "check", "--quiet")
            self.assertEqual(rc, 2)
            self.assertIn("BROKEN", out)
            self.assertNotIn("\nok ", out)
            rc, out, _ = diag(fx.name, "repair")
            self.assertEqual(rc, 0)
            self.assertIn("recover_lock", out)
            self.assertIn("after: healthy", out)


class StuckLock(Base):
    def test_live_holder_is_reported_not_waited_on(self):
        with Fixture("lockheld", hold=True) as fx:
            self.assertIsNotNone(fx.holder)
            ranks = self.locks(fx.name)["ranks"]
            self.assertEqual((ranks["state"], ranks["owner_pid"], ranks["owner_alive"]),
                             ("held", fx.holder, True))
            rc, doc, _ = diag(fx.name, "--lock-timeout", "100", "check", json_out=True)
            self.assertEqual(rc, 1)
            stuck = [f for f in doc["findings"] if f["check"] == "locks.ranks"][0]
            self.assertEqual(stuck["severity"], "degraded")
            self.assertIn("pid %d (alive)" % fx.holder, stuck["message"])
            rc, st, _ = diag(fx.name, "--lock-timeout", "100", "status", json_out=True)
            self.assertEqual((rc, st["verdict"]), (0, "degraded"))
            # Lock-free readers are not blocked.
            self.assertEqual(sorted(self.ranks(fx.name)), [0, 1])
            rc, doc, _ = diag(fx.name, "--lock-timeout", "100", "repair", json_out=True)
            self.assertEqual(rc, 2)
            busy = [a for a in doc["actions"] if a["action"] == "lock_busy"]
            self.assertEqual(len(busy), 1)
            self.assertFalse(busy[0]["ok"])
            self.assertIn("pid %d" % fx.holder, busy[0]["detail"])
            # Still held by the live holder: repair did not steal it.
            self.assertEqual(self.locks(fx.name)["ranks"]["owner_pid"], fx.holder)
            self.assertTrue(st["counts"]["rooms_counted"])

    def test_stuck_rooms_lock(self):
        with Fixture("lockheld-rooms", hold=True) as fx:
            rooms = self.locks(fx.name)["rooms"]
            self.assertEqual((rooms["state"], rooms["owner_pid"], rooms["owner_alive"]),
                             ("held", fx.holder, True))
            rc, doc, _ = diag(fx.name, "--lock-timeout", "100", "check", json_out=True)
            self.assertEqual(rc, 1)
            self.assertEqual(problem_ids(doc), {"locks.rooms"})
            rc, st, _ = diag(fx.name, "--lock-timeout", "100", "status", json_out=True)
            self.assertEqual((rc, st["verdict"]), (0, "degraded"))
            self.assertFalse(st["counts"]["rooms_counted"])
            # Rooms and failure records are read without the lock: a holder
            # outside its seqlock window blocks no reader.
            for c in ("rooms", "failures"):
                rc, _, err = diag(fx.name, "--lock-timeout", "100", c)
                self.assertEqual(rc, 0, (c, err))
            rc, out, _ = diag(fx.name, "--lock-timeout", "100", "status")
            self.assertIn("not counted (a rooms lock is busy)", out)


class StaleProcess(Base):
    def test_stale_entry_and_repair(self):
        with Fixture("stale") as fx:
            rc, doc, _ = diag(fx.name, "procs", json_out=True)
            self.assertEqual(rc, 0)
            self.assert_doc(doc, "procs", fx.name)
            self.assertEqual((doc["count"], doc["alive"], doc["dead"]), (1, 0, 1))
            p = doc["procs"][0]
            self.assertEqual((p["role"], p["rank"], p["alive"]), ("worker", 5, False))
            self.assertGreater(p["start_ticks"], 0)
            self.assertGreater(p["attached_ns"], 0)
            self.assertGreater(p["started_ns"], 0)
            worker = p["pid"]
            ranks = self.ranks(fx.name)
            self.assertTrue(ranks[5]["owned_by_worker"])
            self.assertEqual(ranks[5]["pid"], worker)
            self.assert_check(fx.name, 1, degraded={"procs.alive", "ranks.owner"})
            rc, out, _ = diag(fx.name, "procs")
            self.assertIn("worker", out)
            self.assertIn("dead", out)

            rc, doc, _ = diag(fx.name, "repair", json_out=True)
            self.assertEqual(rc, 0)
            reaped = [a for a in doc["actions"] if a["action"] == "reap_process"]
            self.assertEqual(reaped[0]["target"], "pid %d" % worker)
            self.assertIn("1 rank withdrawn", reaped[0]["detail"])
            self.assert_check(fx.name, 0)
            ranks = self.ranks(fx.name)
            self.assertEqual((ranks[0]["state"], ranks[1]["state"]), ("registered", "registered"))
            self.assertEqual(ranks[5]["state"], "withdrawn")
            self.assertIn("process %d" % worker, ranks[5]["note"])
            self.assertEqual(self.ranks(fx.name, "--state", "registered").keys(), {0, 1})
            rc, doc, _ = diag(fx.name, "procs", json_out=True)
            self.assertEqual(doc["count"], 0)


class Unreadable(Base):
    def test_other_layout_version(self):
        with Fixture("version") as fx:
            for c in ("status", "check", "ranks", "repair", "locks"):
                rc, doc, _ = diag(fx.name, c, json_out=True)
                self.assertEqual(rc, EXIT_BROKEN, c)
                self.assertFalse(doc["readable"])
                self.assertTrue(doc["exists"])
                self.assertEqual(doc["error"]["code"], "KVC_E_VERSION")
                self.assertIn("layout version 1", doc["error"]["message"])
                self.assertIn("layout version %d" % LAYOUT, doc["error"]["message"])
                h = doc["header"]
                self.assertEqual((h["layout_version"], h["build_layout_version"]), (1, LAYOUT))
                self.assertTrue(h["magic_ok"])
                self.assertEqual(h["creator_pid"], fx.pid)
                self.assertFalse(h["creator_alive"])
                self.assertFalse(h["full"])
                self.assertIn("unlink", doc["error"]["advice"])
                # what kvcoordd does with it: moved aside, not silently recreated
                self.assertIn("moves it aside to /dev/shm/%s.invalid-<time>" % fx.name,
                              doc["error"]["advice"])
                self.assertNotIn("recreates", doc["error"]["advice"])
            rc, out, err = diag(fx.name, "status")
            self.assertEqual(rc, 2)
            self.assertIn("layout version  1 (this build reads %d)" % LAYOUT, out)
            self.assertIn("creator         pid %d (dead)" % fx.pid, out)
            rc, _, _ = diag(fx.name, "unlink", "--yes")
            self.assertEqual(rc, 0)
            self.assertFalse(os.path.exists("/dev/shm/" + fx.name))

    def test_truncated(self):
        with Fixture("truncated") as fx:
            size = os.stat("/dev/shm/" + fx.name).st_size
            rc, doc, _ = diag(fx.name, "check", json_out=True)
            self.assertEqual(rc, EXIT_BROKEN)
            self.assertEqual(doc["error"]["code"], "KVC_E_CORRUPT")
            self.assertIn("truncated", doc["error"]["message"])
            self.assertTrue(doc["error"]["advice"].startswith(
                "kvcoordd, on start, moves it aside to /dev/shm/%s.invalid-<time>" % fx.name),
                doc["error"]["advice"])
            h = doc["header"]
            self.assertEqual(h["file_bytes"], size)
            self.assertTrue(h["full"])
            self.assertEqual(h["total_bytes"], 2 * size)
            rc, out, _ = diag(fx.name, "status")
            self.assertEqual(rc, 2)
            self.assertIn("size in header", out)

    def test_tiny(self):
        with Fixture("tiny") as fx:
            rc, doc, _ = diag(fx.name, "status", json_out=True)
            self.assertEqual(rc, EXIT_BROKEN)
            self.assertEqual(doc["error"]["code"], "KVC_E_CORRUPT")
            self.assertEqual(doc["header"]["file_bytes"], 16)
            self.assertFalse(doc["header"]["has_prefix"])
            rc, doc, _ = diag(fx.name, "unlink", "--yes", json_out=True)
            self.assertEqual((rc, doc["removed"]), (0, True))
            self.assertIsNone(doc["ranks_registered"])


class NotASegment(Base):
    """What sits in /dev/shm under the name is not a segment."""

    def setUp(self):
        self.name = unique_name()
        self.path = "/dev/shm/" + self.name

    def tearDown(self):
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass

    def test_fifo_does_not_block(self):
        os.mkfifo(self.path, 0o600)
        for c in ("status", "check", "ranks", "rooms", "locks"):
            rc, doc, _ = diag(self.name, c, json_out=True, timeout=20)
            self.assertEqual(rc, EXIT_BROKEN, c)
            self.assertFalse(doc["readable"])
            self.assertIn("is a FIFO, not a segment", doc["error"]["message"])
            self.assertEqual(doc["header"]["file_type"], "FIFO")
            self.assertNotIn("magic", doc["header"])
        rc, out, err = diag(self.name, "status", timeout=20)
        self.assertEqual(rc, EXIT_BROKEN)
        self.assertIn("FIFO", out)
        self.assertNotIn("too short", out)
        rc, _, _ = diag(self.name, "unlink", "--yes", timeout=20)
        self.assertEqual(rc, EXIT_OK)
        self.assertFalse(os.path.lexists(self.path))

    def test_symlink_is_not_followed(self):
        with Fixture("ranks8") as fx:
            os.symlink("/dev/shm/" + fx.name, self.path)
            rc, doc, _ = diag(self.name, "status", json_out=True)
            self.assertEqual(rc, EXIT_BROKEN)
            self.assertIn("is a symlink (to /dev/shm/%s)" % fx.name, doc["error"]["message"])
            self.assertEqual(doc["header"]["file_type"], "symlink")
            self.assertNotIn("magic", doc["header"])
            rc, out, err = diag(self.name, "check")
            self.assertEqual(rc, EXIT_BROKEN)
            self.assertIn("symlink", err)
            self.assertNotIn("too short", out)

    def test_permission_denied_said_as_such(self):
        if os.geteuid() != 0:
            self.skipTest("needs root to create a file another uid cannot read")
        with Fixture("ranks8") as fx:
            p = subprocess.run([ARGS.diag, "--segment", fx.name, "--json", "status"],
                               capture_output=True, text=True, timeout=60,
                               preexec_fn=lambda: (os.setgid(65534), os.setuid(65534)))
            if "Permission denied" in p.stderr and "kvcoord-diag" not in p.stdout:
                self.skipTest("kvcoord-diag not executable as nobody here")
            doc = json.loads(p.stdout)
            self.assertEqual(p.returncode, EXIT_BROKEN)
            self.assertIn("permission denied opening /dev/shm/%s (mode 0600, owner uid 0"
                          % fx.name, doc["error"]["message"])
            self.assertEqual(doc["header"]["file_mode"], "0600")
            self.assertEqual(doc["header"]["file_uid"], 0)
            self.assertNotIn("magic", doc["header"])

    def test_no_field_without_the_magic(self):
        with open(self.path, "wb") as f:
            f.write(b"GARBAGE!" + bytes(range(256)) * 64)
        os.chmod(self.path, 0o600)
        rc, doc, _ = diag(self.name, "status", json_out=True)
        self.assertEqual(rc, EXIT_BROKEN)
        h = doc["header"]
        self.assertEqual((h["magic_ok"], h["magic_text"]), (False, "GARBAGE!"))
        for field in ("layout_version", "header_size", "creator_pid", "creator_alive",
                      "total_bytes"):
            self.assertNotIn(field, h)
        rc, out, _ = diag(self.name, "status")
        self.assertEqual(rc, EXIT_BROKEN)
        self.assertIn("NOT a kvcoord magic; no other field is shown", out)
        for field in ("creator", "layout version", "header size"):
            self.assertNotRegex(out, r"(?m)^\s+%s\s" % field)
        rc, out, _ = diag(self.name, "unlink", "--yes")
        self.assertEqual(rc, EXIT_OK)
        self.assertIn("not a kvcoord segment", out)
        self.assertNotIn("creator pid", out)


class Unlink(Base):
    def test_confirmation(self):
        with Fixture("ranks8") as fx:
            path = "/dev/shm/" + fx.name
            rc, _, err = diag(fx.name, "unlink")  # stdin is not a terminal: not confirmed
            self.assertEqual(rc, EXIT_DEGRADED)
            self.assertIn("not confirmed", err)
            self.assertIn("--yes", err)
            self.assertTrue(os.path.exists(path))
            rc, doc, _ = diag(fx.name, "unlink", json_out=True)  # --json cannot ask
            self.assertEqual((rc, doc["removed"]), (EXIT_DEGRADED, False))
            self.assertIn("not confirmed", doc["error"])
            self.assertTrue(os.path.exists(path))
            rc, doc, _ = diag(fx.name, "unlink", "--yes", json_out=True)
            self.assertEqual(rc, 0)
            self.assert_doc(doc, "unlink", fx.name)
            self.assertTrue(doc["removed"])
            self.assertEqual((doc["ranks_registered"], doc["procs_alive"]), (8, 0))
            self.assertFalse(os.path.exists(path))
            rc, _, _ = diag(fx.name, "unlink", "--yes")
            self.assertEqual(rc, EXIT_BROKEN)

    def test_live_creator_needs_force(self):
        # The fixture created the segment and stays attached: its creator runs.
        with Fixture("ranks8", hold=True) as fx:
            path = "/dev/shm/" + fx.name
            rc, out, err = diag(fx.name, "unlink", "--yes")
            self.assertEqual(rc, EXIT_DEGRADED)
            self.assertIn("creator pid %d (alive)" % fx.pid, out)
            self.assertIn("its creator, pid %d, is running" % fx.pid, err)
            # what --force does to a running kvcoordd: it exits 1 (seg_watch)
            self.assertIn("a kvcoordd whose segment is removed exits with status 1", err)
            self.assertNotIn("go on serving", err)
            self.assertIn("--force", err)
            self.assertTrue(os.path.exists(path))
            rc, doc, _ = diag(fx.name, "unlink", "--yes", json_out=True)
            self.assertEqual((rc, doc["removed"]), (EXIT_DEGRADED, False))
            self.assertTrue(doc["header"]["creator_alive"])
            rc, _, _ = diag(fx.name, "unlink", "--yes", "--force")
            self.assertEqual(rc, EXIT_OK)
            self.assertFalse(os.path.exists(path))

    def test_prompt_on_a_terminal(self):
        with Fixture("empty") as fx:
            for answer, rc_want, exists in ((b"n\n", 1, True), (b"yes\n", 0, False)):
                master, slave = pty.openpty()
                p = subprocess.Popen([ARGS.diag, "--segment", fx.name, "unlink"], stdin=slave,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE)
                os.close(slave)
                os.write(master, answer)
                out, _ = p.communicate(timeout=30)
                os.close(master)
                self.assertEqual(p.returncode, rc_want, out)
                self.assertIn(b"[y/N]", out)
                self.assertEqual(os.path.exists("/dev/shm/" + fx.name), exists)


class Rdma(Base):
    @unittest.skipIf(os.path.exists("/sys/class/infiniband_verbs"),
                     "this host has RDMA verbs support; the device-less report is not testable")
    def test_no_devices(self):
        rc, doc, _ = diag(unique_name(), "rdma", json_out=True)
        self.assertEqual(rc, 0)
        self.assertEqual(doc["command"], "rdma")
        self.assertEqual((doc["devices"], doc["skipped"], doc["usable"]), ([], [], 0))
        self.assertTrue(doc["reason"].startswith("no RDMA devices found (libibverbs: "))
        self.assertIn("/sys/class/infiniband_verbs does not exist", doc["reason"])
        soft, hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
        inf = resource.RLIM_INFINITY
        self.assertEqual(doc["memlock"]["soft"], None if soft == inf else soft)
        self.assertEqual(doc["memlock"]["hard"], None if hard == inf else hard)
        self.assertEqual(doc["memlock"]["low"], soft != inf and soft < 64 << 20)
        rc, out, _ = diag(unique_name(), "rdma")
        self.assertEqual(rc, 0)
        self.assertIn("no RDMA devices found", out)
        self.assertIn("RLIMIT_MEMLOCK", out)
        rc, _, _ = diag(unique_name(), "rdma", "--require")
        self.assertEqual(rc, EXIT_NO_RDMA)


class Watch(Base):
    def test_frames_without_a_terminal(self):
        with Fixture("ranks8") as fx:
            rc, out, _ = diag(fx.name, "watch", "--count", "2", "--interval", "0.1")
            self.assertEqual(rc, 0)
            self.assertEqual(out.count("kvcoord-diag watch - "), 2)
            self.assertEqual(out.count("-" * 70), 1)
            self.assertIn("verdict: healthy", out)
            self.assertIn("[2001:db8::7]:16007", out)
            self.assertIn("no live room", out)
            self.assertNotIn("\033[2J", out)

    def watch_on_pty(self, name, stop):
        master, slave = pty.openpty()
        before = termios.tcgetattr(slave)
        p = subprocess.Popen([ARGS.diag, "--segment", name, "watch", "--interval", "0.2"],
                             stdin=slave, stdout=slave, stderr=slave, start_new_session=True)
        seen = b""
        while b"q quits" not in seen:
            seen += os.read(master, 65536)
        stop(p, master)
        rc = p.wait(30)
        after = termios.tcgetattr(slave)
        os.close(slave)
        os.close(master)
        return rc, before, after, seen

    def test_quit_keys_and_signals_restore_the_terminal(self):
        stops = {
            "q": lambda p, m: os.write(m, b"q"),
            "SIGINT": lambda p, m: p.send_signal(signal.SIGINT),
            "SIGTERM": lambda p, m: p.send_signal(signal.SIGTERM),
        }
        with Fixture("ranks8") as fx:
            for how, stop in stops.items():
                rc, before, after, seen = self.watch_on_pty(fx.name, stop)
                self.assertEqual(rc, 0, how)
                self.assertEqual(before, after, how)
                self.assertIn(b"\033[H\033[2J", seen, how)


def main():
    global ARGS
    ap = argparse.ArgumentParser()
    ap.add_argument("--diag", required=True)
    ap.add_argument("--fixture", required=True)
    ap.add_argument("--daemon", required=True)
    ARGS, rest = ap.parse_known_args()
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)


if __name__ == "__main__":
    main()
