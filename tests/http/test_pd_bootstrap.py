#!/usr/bin/python3
"""kvcoordd as sglang's PD bootstrap server (PUT/GET /route, POST
/register_dp_rank, POST /query_dp_ranks), against a real kvcoordd.

- sglang's answers: a 40-request sequence (readiness, a TP=2 x DP=2 prefill
  registering out of order, lookups, 404, 400, every 405, the room map) gives
  exactly the status, content type and body that sglang's own
  CommonKVBootstrapServer gave for the same sequence, recorded in
  pd_sglang_answers.txt (public python/sglang/srt/disaggregation/common/
  conn.py at 0094505, run under Debian's python3-aiohttp 3.8).
- Beyond sglang: a rank registered twice counts once; a registering
  process SIGKILLed is withdrawn (readiness drops, its lookup stops
  answering its address); the table survives a kvcoordd restart; room
  entries expire by sglang's interval rule (--pd-room-interval).
- Malformed requests: 400 {"detail": ...} naming the field, nothing stored.
- With a token, the mutating PD routes need it (401), lookups do not.

Waits poll with generous deadlines that only keep a broken daemon from
hanging the test.

Usage: test_pd_bootstrap.py --daemon PATH --diag PATH [unittest args]
"""

import argparse
import http.client
import json
import os
import subprocess
import sys
import tempfile
import time
import unittest
import warnings

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
from kvctest import Daemon as KvcDaemon, wait_for  # noqa: E402  (the tests' one helper module)

ARGS = None
DEADLINE = 30.0  # hang guard for waits, not an assertion
HERE = os.path.dirname(os.path.abspath(__file__))
TOPOLOGY = "/route?prefill_dp_rank=-1&prefill_cp_rank=-1&target_tp_rank=-1&target_pp_rank=-1"


def Daemon(segment, fresh=True, extra=()):
    """kvctest's kvcoordd on segment `segment` (256 rooms, debug log)."""
    return KvcDaemon(segment, extra, exe=ARGS.daemon, fresh=fresh)


def segment_name(tag):
    return "kvctest-pd-%d-%s" % (os.getpid(), tag)


class Client:
    """One keep-alive connection: its process (this one) owns what it registers."""

    def __init__(self, port, token=None):
        self.port = port
        self.token = token
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=DEADLINE)

    def request(self, method, path, body=None, raw=None):
        headers = {}
        if body is not None:
            raw = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        if self.token:
            headers["Authorization"] = "Bearer " + self.token
        self.conn.request(method, path, body=raw, headers=headers)
        r = self.conn.getresponse()
        data = r.read().decode(errors="replace")
        kept = sorted((k, v) for k, v in r.getheaders() if k.lower() in ("content-type", "allow"))
        if r.getheader("Connection", "").lower() == "close":
            self.conn.close()
        return r.status, kept, data

    def line(self, method, path, body=None, raw=None):
        """The answer as pd_sglang_answers.txt records it."""
        status, kept, data = self.request(method, path, body, raw)
        return "%s %s %d %s %s" % (method, path, status, kept, data)


def registration(tp, dp, **kw):
    body = {"attn_tp_size": 2, "attn_tp_rank": tp, "attn_cp_size": 1, "attn_cp_rank": 0,
            "attn_dp_size": 2, "attn_dp_rank": dp, "pp_size": 1, "pp_rank": 0,
            "system_dp_size": 1, "system_dp_rank": 0, "rank_ip": "10.0.0.%d" % (tp + 1),
            "rank_port": 17000 + tp + 10 * dp, "page_size": 64, "kv_cache_dtype": "auto"}
    body.update(kw)
    return body


def lookup(dp, tp):
    return "/route?prefill_dp_rank=%d&prefill_cp_rank=0&target_tp_rank=%d&target_pp_rank=0" % (
        dp, tp)


class SglangAnswers(unittest.TestCase):
    def test_same_answers_as_sglang(self):
        d = Daemon(segment_name("answers"))
        try:
            c = Client(d.port)
            got = []
            L = got.append
            L(c.line("GET", "/health"))
            L(c.line("HEAD", "/health"))
            L(c.line("GET", TOPOLOGY))
            L(c.line("GET", "/route?prefill_dp_rank=0"))
            L(c.line("GET", "/route?prefill_dp_rank=&prefill_cp_rank=0&target_tp_rank=0"
                     "&target_pp_rank=0"))
            L(c.line("GET", lookup(0, 0)))
            for m in ("POST", "DELETE", "PATCH", "HEAD", "OPTIONS"):
                L(c.line(m, "/route"))
            L(c.line("PUT", "/route", registration(1, 1, load_balance_method="round_robin",
                                                   prefill_http_port=30000,
                                                   enable_dsa_cache_layer_split=1)))
            L(c.line("GET", TOPOLOGY))
            L(c.line("PUT", "/route", registration(0, 0)))
            L(c.line("PUT", "/route", registration(0, 1)))
            L(c.line("GET", TOPOLOGY))
            L(c.line("PUT", "/route", registration(1, 0, kv_cache_dtype=None)))
            L(c.line("GET", TOPOLOGY))
            for q in ("0&prefill_cp_rank=0&target_tp_rank=1&target_pp_rank=0",
                      "1&prefill_cp_rank=0&target_tp_rank=1&target_pp_rank=0",
                      "0&prefill_cp_rank=0&target_tp_rank=5&target_pp_rank=0",
                      "-1&prefill_cp_rank=0&target_tp_rank=0&target_pp_rank=0",
                      "00&prefill_cp_rank=+0&target_tp_rank=0&target_pp_rank=0"):
                L(c.line("GET", "/route?prefill_dp_rank=" + q))
            L(c.line("POST", "/register_dp_rank", {"bootstrap_room": 42, "dp_rank": 1}))
            L(c.line("POST", "/register_dp_rank", {"bootstrap_room": "7", "dp_rank": "0"}))
            L(c.line("POST", "/query_dp_ranks", {"bootstrap_rooms": [42, 43, "7", 42]}))
            L(c.line("POST", "/query_dp_ranks", {"bootstrap_rooms": []}))
            for m in ("GET", "PUT", "HEAD"):
                L(c.line(m, "/register_dp_rank"))
                L(c.line(m, "/query_dp_ranks"))
            with open(os.path.join(HERE, "pd_sglang_answers.txt"), encoding="utf-8") as f:
                want = f.read().splitlines()
            self.assertEqual(len(got), len(want))
            for g, w in zip(got, want):
                self.assertEqual(g, w)
        finally:
            d.stop()


class BeyondSglang(unittest.TestCase):
    def setUp(self):
        self.d = Daemon(segment_name(self._testMethodName), extra=("--pd-room-interval", "1"))
        self.c = Client(self.d.port)

    def tearDown(self):
        self.c.conn.close()
        self.d.stop()

    def test_registered_twice_counts_once(self):
        for _ in range(3):
            self.assertEqual(self.c.request("PUT", "/route", registration(0, 0))[0], 200)
        status, _, body = self.c.request("GET", TOPOLOGY)
        self.assertEqual(status, 503)
        self.assertEqual(body, "Prefill server not fully registered yet (1 workers registered).")
        for tp, dp in ((1, 0), (0, 1)):
            self.c.request("PUT", "/route", registration(tp, dp))
        self.assertEqual(self.c.request("GET", TOPOLOGY)[0], 503)  # 3 of 4, however often
        self.c.request("PUT", "/route", registration(1, 1))
        self.assertEqual(self.c.request("GET", TOPOLOGY)[0], 200)
        metrics = self.c.request("GET", "/metrics")[2]
        for line in ('kvcoord_pd_prefill_ranks{state="live"} 4',
                     "kvcoord_pd_prefill_ranks_expected 4", "kvcoord_pd_ready 1"):
            self.assertIn(line + "\n", metrics)

    def test_sigkilled_registrant_is_withdrawn(self):
        for tp, dp in ((0, 0), (1, 0), (0, 1)):
            self.c.request("PUT", "/route", registration(tp, dp))
        # The fourth rank registers from its own process, then is SIGKILLed.
        child = subprocess.Popen([sys.executable, "-c", (
            "import http.client, json, sys, time\n"
            "c = http.client.HTTPConnection('127.0.0.1', %d)\n"
            "c.request('PUT', '/route', body=json.dumps(%r))\n"
            "r = c.getresponse(); r.read(); print(r.status, flush=True)\n"
            "time.sleep(600)\n") % (self.d.port, registration(1, 1, rank_ip="10.9.9.9"))],
            stdout=subprocess.PIPE, text=True)
        try:
            self.assertEqual(child.stdout.readline().strip(), "200")
            status, _, body = self.c.request("GET", lookup(1, 1))
            self.assertEqual((status, json.loads(body)["rank_ip"]), (200, "10.9.9.9"))
            t0 = time.monotonic()
            child.kill()
            child.wait()
            wait_for(lambda: self.c.request("GET", TOPOLOGY)[0] == 503, "the rank's withdrawal")
            print("withdrawn %.3f s after SIGKILL" % (time.monotonic() - t0), file=sys.stderr)
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()
        status, _, body = self.c.request("GET", lookup(1, 1))
        self.assertEqual(status, 503)
        # sglang's text, then why the table holds a withdrawn entry (its note)
        self.assertRegex(body, r"^Prefill server not fully registered yet \(3 workers "
                         r"registered\)\. 1 entry withdrawn: its process %d (killed by signal 9 "
                         r"\(Killed\)|is gone .*)\.$" % child.pid)
        self.assertRegex(self.d.output(), r"pd_withdraw entries=1")
        diag = json.loads(subprocess.run(
            [ARGS.diag, "--segment", self.d.segment, "--json", "pd"], check=True,
            capture_output=True, text=True).stdout)
        self.assertEqual((diag["registered"], diag["withdrawn"], diag["ready"]), (3, 1, False))
        gone = [r for r in diag["ranks"] if r["state"] == "withdrawn"]
        self.assertEqual([(r["dp_group"], r["tp_rank"], r["pid"]) for r in gone],
                         [(1, 1, child.pid)])
        # Reaped by this test before kvcoordd looked: how it ended is not
        # known, and the note says what is (or the daemon's pidfd saw it).
        self.assertRegex(gone[0]["note"], r"its process %d (killed by signal 9|is gone "
                         r"\(started [0-9T:.Z-]+\); not our child, so its exit status is not "
                         r"known)" % child.pid)
        text = subprocess.run([ARGS.diag, "--segment", self.d.segment, "pd"], check=True,
                              capture_output=True, text=True).stdout
        self.assertIn("NOT READY, 3 of 4 ranks registered", text)
        self.assertRegex(text, r"1 +0 +1 +0 +10\.9\.9\.9:17011 +%d +withdrawn: its process" %
                         child.pid)
        # The one time an entry keeps is its last change: said as such.
        self.assertRegex(text, r"STATE +CHANGED\n")
        self.assertRegex(text, r"withdrawn: its process %d .* withdrawn 20[0-9-]+ [0-9:.]+\n" %
                         child.pid)
        self.assertRegex(text, r" live +registered 20[0-9-]+ [0-9:.]+\n")
        # Registered again (a restarted prefill rank): served at once.
        self.c.request("PUT", "/route", registration(1, 1, rank_ip="10.8.8.8"))
        status, _, body = self.c.request("GET", lookup(1, 1))
        self.assertEqual((status, json.loads(body)["rank_ip"]), (200, "10.8.8.8"))

    def test_int_strings_as_python_takes_them(self):
        for room in (" 12 ", "+13", "-14"):
            self.assertEqual(self.c.request("POST", "/register_dp_rank",
                                            {"bootstrap_room": room, "dp_rank": "1"})[0], 200)
        self.assertEqual(json.loads(self.c.request("POST", "/query_dp_ranks", {
            "bootstrap_rooms": [12, "13", -14]})[2]), {"12": 1, "13": 1, "-14": 1})
        for bad in ("1 2", "", "0x10", "1.5", "\u00001"):
            status, _, text = self.c.request("POST", "/register_dp_rank",
                                             {"bootstrap_room": bad, "dp_rank": 1})
            self.assertEqual(status, 400, bad)

    def test_room_map_expires_by_interval(self):
        self.assertEqual(self.c.request("POST", "/register_dp_rank",
                                        {"bootstrap_room": 9, "dp_rank": 3})[0], 200)
        t0 = time.monotonic()
        q = lambda: json.loads(self.c.request("POST", "/query_dp_ranks",
                                              {"bootstrap_rooms": [9]})[2])
        self.assertEqual(q(), {"9": 3})
        wait_for(lambda: q() == {}, "room 9 to expire")
        elapsed = time.monotonic() - t0
        print("room entry gone after %.2f s (interval 1 s)" % elapsed, file=sys.stderr)
        self.assertGreater(elapsed, 1.0)  # never before one interval (sglang's rule)

    def test_bad_input_is_400_and_stores_nothing(self):
        good = registration(0, 0)
        cases = []
        for field in ("attn_tp_size", "attn_tp_rank", "system_dp_rank", "rank_ip", "rank_port",
                      "page_size", "kv_cache_dtype"):
            body = dict(good)
            del body[field]
            cases.append((body, "Missing field '%s'" % field))
        cases += [
            (dict(good, attn_tp_size="2"), "Invalid field 'attn_tp_size': must be an integer"),
            (dict(good, attn_tp_rank=2), "Invalid registration: attn_tp_rank 2 out of range"),
            (dict(good, pp_size=10 ** 12), "Invalid field 'pp_size': 1000000000000 out of range"),
            (dict(good, rank_port=70000), "Invalid field 'rank_port': 70000 out of range"),
            (dict(good, rank_port="x"), "Invalid field 'rank_port': \"x\" is not an integer"),
            (dict(good, rank_ip=5), "Invalid field 'rank_ip': must be a string"),
            (dict(good, rank_ip="h" * 200), "Invalid registration: rank_ip of 200 bytes"),
            (dict(good, kv_cache_dtype=3), "Invalid field 'kv_cache_dtype': must be a string"),
            (dict(good, prefill_http_port=0), "Invalid field 'prefill_http_port': 0 out of"),
            ([1, 2], "Request body must be a JSON object"),
        ]
        for body, detail in cases:
            status, kept, text = self.c.request("PUT", "/route", body)
            self.assertEqual(status, 400, (body, text))
            self.assertTrue(json.loads(text)["detail"].startswith(detail), (detail, text))
        for raw in (b"", b"{", b"\xff"):
            status, _, text = self.c.request("PUT", "/route", raw=raw)
            self.assertEqual(status, 400)
            self.assertIn("Invalid JSON", json.loads(text)["detail"])
        status, _, text = self.c.request("GET", TOPOLOGY)
        self.assertEqual(text, "Prefill server not fully registered yet (0 workers registered).")
        for path in ("/route?prefill_dp_rank=x&prefill_cp_rank=0&target_tp_rank=0"
                     "&target_pp_rank=0", "/route?prefill_dp_rank=1__0&prefill_cp_rank=0"
                     "&target_tp_rank=0&target_pp_rank=0"):
            status, _, text = self.c.request("GET", path)
            self.assertEqual(status, 400)
            self.assertIn("Invalid parameter 'prefill_dp_rank'", json.loads(text)["detail"])
        # An integer to int(), however large: no such rank (503 until ready).
        self.assertEqual(self.c.request("GET", "/route?prefill_dp_rank=99999999999999999999"
                                        "&prefill_cp_rank=0&target_tp_rank=0"
                                        "&target_pp_rank=0")[0], 503)
        for body, detail in (({"dp_rank": 1}, "Missing field 'bootstrap_room'"),
                             ({"bootstrap_room": 1, "dp_rank": -1}, "Invalid field 'dp_rank'"),
                             ({"bootstrap_room": 2 ** 70, "dp_rank": 1},
                              "Invalid JSON at line 1, column 41: too big integer")):
            status, _, text = self.c.request("POST", "/register_dp_rank", body)
            self.assertEqual(status, 400)
            self.assertTrue(json.loads(text)["detail"].startswith(detail), text)
        for body, detail in (({}, "Missing field 'bootstrap_rooms'"),
                             ({"bootstrap_rooms": 5}, "Invalid field 'bootstrap_rooms'"),
                             ({"bootstrap_rooms": [1, None]},
                              "Invalid field 'bootstrap_rooms[1]'")):
            status, _, text = self.c.request("POST", "/query_dp_ranks", body)
            self.assertEqual(status, 400)
            self.assertTrue(json.loads(text)["detail"].startswith(detail), text)
        self.assertEqual(self.c.request("POST", "/query_dp_ranks",
                                        {"bootstrap_rooms": [1, 2]})[2], "{}")


class Readiness(unittest.TestCase):
    """Ready only when every rank of the one topology is registered."""

    def setUp(self):
        self.d = Daemon(segment_name(self._testMethodName))
        self.c = Client(self.d.port)

    def tearDown(self):
        self.c.conn.close()
        self.d.stop()

    def put(self, tp, **kw):
        kw.setdefault("attn_dp_size", 1)
        status, _, text = self.c.request("PUT", "/route", registration(tp, 0, **kw))
        return status, text

    def test_conflicting_topology_is_refused(self):
        self.assertEqual(self.put(0, attn_tp_size=2)[0], 200)
        # The sequence: tp 3 of attn_tp_size 4 after tp 0 of 2.
        status, text = self.put(3, attn_tp_size=4)
        self.assertEqual(status, 409, text)
        self.assertIn("differs from the registered prefill's (2 x 1 x 1 x 1)",
                      json.loads(text)["detail"])
        status, _, body = self.c.request("GET", TOPOLOGY)
        self.assertEqual((status, body), (503, "Prefill server not fully registered yet "
                                               "(1 workers registered)."))
        for tp in range(4):  # never 200 then 404
            self.assertEqual(self.c.request("GET", lookup(0, tp))[0], 503)
        self.assertEqual(self.put(1, attn_tp_size=2)[0], 200)
        status, _, body = self.c.request("GET", TOPOLOGY)
        self.assertEqual((status, json.loads(body)["attn_tp_size"]), (200, 2))
        self.assertEqual(self.c.request("GET", lookup(0, 1))[0], 200)
        self.assertEqual(self.c.request("GET", lookup(0, 3))[0], 404)
        doc = json.loads(subprocess.run([ARGS.diag, "--segment", self.d.segment, "--json", "pd"],
                                        check=True, capture_output=True, text=True).stdout)
        self.assertEqual((doc["registered"], doc["expected"], doc["ready"]), (2, 2, True))

    def test_topology_of_an_ended_prefill_is_replaced(self):
        # A prefill rank registers from its own process, which then ends.
        out = subprocess.run([sys.executable, "-c", (
            "import http.client, json\n"
            "c = http.client.HTTPConnection('127.0.0.1', %d)\n"
            "c.request('PUT', '/route', body=json.dumps(%r))\n"
            "print(c.getresponse().status)\n") % (
                self.d.port, registration(0, 0, attn_tp_size=2, attn_dp_size=1))],
            check=True, capture_output=True, text=True).stdout
        self.assertEqual(out.strip(), "200")
        # Its successor, another layout: taken at once (the old entry withdrawn).
        self.assertEqual(self.put(3, attn_tp_size=4)[0], 200)
        status, _, body = self.c.request("GET", TOPOLOGY)
        self.assertEqual(status, 503)
        self.assertTrue(body.startswith("Prefill server not fully registered yet (1 workers "
                                        "registered). 1 entry withdrawn: "), body)
        for tp in range(3):
            self.assertEqual(self.put(tp, attn_tp_size=4)[0], 200)
        status, _, body = self.c.request("GET", TOPOLOGY)
        self.assertEqual((status, json.loads(body)["attn_tp_size"]), (200, 4))

    def test_503_says_why_entries_were_withdrawn(self):
        # A prefill rank registers from its own process, which exits 0.
        child = subprocess.Popen([sys.executable, "-c", (
            "import http.client, json\n"
            "c = http.client.HTTPConnection('127.0.0.1', %d)\n"
            "c.request('PUT', '/route', body=json.dumps(%r))\n"
            "assert c.getresponse().status == 200\n") % (
                self.d.port, registration(0, 0, attn_tp_size=2, attn_dp_size=1))])
        self.assertEqual(child.wait(), 0)
        end = time.monotonic() + DEADLINE
        while True:  # until kvcoordd notices the exit (about a second)
            status, _, body = self.c.request("GET", TOPOLOGY)
            if "(1 workers registered)" not in body or time.monotonic() > end:
                break
            time.sleep(0.05)
        self.assertEqual(status, 503)
        # the exit status, unless the test reaped the child before kvcoordd looked
        self.assertRegex(body, r"^Prefill server not fully registered yet \(0 workers "
                         r"registered\)\. 1 entry withdrawn: its process %d (exited with "
                         r"status 0|is gone .*)\.$" % child.pid)

    def test_a_topology_beyond_the_table_is_refused(self):
        for kw in ({"attn_tp_size": 2048}, {"attn_tp_size": 32, "attn_cp_size": 32,
                                             "attn_dp_size": 2}):
            status, text = self.put(0, **kw)
            self.assertEqual(status, 400, text)
            self.assertIn("a topology of 2048 prefill ranks", text)
            self.assertIn("exceeds the PD table's 1024 ranks", text)
        self.assertEqual(self.put(0, attn_tp_size=1024)[0], 200)
        status, _, body = self.c.request("GET", TOPOLOGY)
        self.assertEqual((status, body), (503, "Prefill server not fully registered yet "
                                               "(1 workers registered)."))


class Restart(unittest.TestCase):
    def test_table_survives_a_restart(self):
        name = segment_name("restart")
        d = Daemon(name)
        c = Client(d.port)
        for tp, dp in ((0, 0), (1, 0), (0, 1), (1, 1)):
            c.request("PUT", "/route", registration(tp, dp))
        c.request("POST", "/register_dp_rank", {"bootstrap_room": 5, "dp_rank": 1})
        before = c.request("GET", TOPOLOGY)
        d.stop(discard=False)
        d = Daemon(name, fresh=False)
        try:
            c = Client(d.port)  # this process, the registrant, still runs
            self.assertEqual(c.request("GET", TOPOLOGY), before)
            status, _, body = c.request("GET", lookup(1, 1))
            self.assertEqual((status, json.loads(body)), (200, {"rank_ip": "10.0.0.2",
                                                                "rank_port": 17011}))
            self.assertEqual(c.request("POST", "/query_dp_ranks",
                                       {"bootstrap_rooms": [5]})[2], '{"5": 1}')
        finally:
            d.stop()


class Auth(unittest.TestCase):
    def test_token_guards_the_mutating_routes(self):
        tok = tempfile.NamedTemporaryFile("w", delete=False)
        tok.write("s3cret\n")
        tok.close()
        os.chmod(tok.name, 0o600)
        d = Daemon(segment_name("auth"), extra=("--auth-token-file", tok.name))
        try:
            anon, ok = Client(d.port), Client(d.port, token="s3cret")
            self.assertEqual(anon.request("PUT", "/route", registration(0, 0))[0], 401)
            self.assertEqual(anon.request("POST", "/register_dp_rank",
                                          {"bootstrap_room": 1, "dp_rank": 0})[0], 401)
            self.assertEqual(ok.request("PUT", "/route", registration(0, 0))[0], 200)
            self.assertEqual(anon.request("GET", TOPOLOGY)[0], 503)
            self.assertEqual(anon.request("POST", "/query_dp_ranks",
                                          {"bootstrap_rooms": [1]})[0], 200)
        finally:
            d.stop()
            os.unlink(tok.name)


def main():
    global ARGS
    p = argparse.ArgumentParser()
    p.add_argument("--daemon", required=True)
    p.add_argument("--diag", required=True)
    ARGS, rest = p.parse_known_args()
    warnings.simplefilter("ignore", ResourceWarning)  # clients left to the daemon's stop
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)


if __name__ == "__main__":
    main()
