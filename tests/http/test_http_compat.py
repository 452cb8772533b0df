#!/usr/bin/python3
"""test_http_compat.py - kvcoordd speaks sglang's engine-info bootstrap API.

Starts build/kvcoordd on a free loopback port with its own fresh segment
(kvctest-compat-<pid>) and checks, with two real clients - Python `requests`
(Debian's python3-requests) and the `curl` binary - the status codes, paths,
parameters, JSON shapes and fixed detail strings of sglang's
EngineInfoBootstrapServer, plus what kvcoordd adds (POST accepted, chunked and
100-continue request bodies, megabyte weights dicts, 413 over the body cap).
After every rejected request the stored values are checked to be unchanged.

Usage:
  test_http_compat.py --daemon build/kvcoordd [--source SRCDIR] [unittest args]
  (or KVCOORDD=build/kvcoordd KVCOORD_SOURCE_DIR=. test_http_compat.py)

Never asserts wall-clock times; timeouts only keep a broken daemon from
hanging the test.
"""

import argparse
import glob
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import unittest

import requests

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
from kvctest import Daemon  # noqa: E402  (the tests' one helper module)

ARGS = None
TIMEOUT = 30          # seconds per HTTP request: a guard against hangs only

REGISTER = "/register_transfer_engine_info"
LOOKUP = "/get_transfer_engine_info"


def shm_path(segment):
    return os.path.join("/dev/shm", segment)


def weights(n, seed=0, prefix="model.layers"):
    """A small weights_info_dict: name -> [data_ptr, numel, element_size]."""
    base = 0x7F2A00000000 + seed * (1 << 36)
    return {"%s.%d.self_attn.qkv_proj.weight" % (prefix, i): [base + i * 4096, 1024 + i + seed, 2]
            for i in range(n)}


def body(rank, session_id, wid, key="rank", **extra):
    b = {key: rank, "transfer_engine_info": {"session_id": session_id,
                                             "weights_info_dict": wid}}
    b.update(extra)
    return b


def curl(*args, data_file=None):
    """Run curl; returns (status, content_type, body bytes)."""
    with tempfile.NamedTemporaryFile(prefix="kvc-curl-", delete=False) as out:
        out_path = out.name
    try:
        cmd = ["curl", "-sS", "--max-time", str(TIMEOUT), "-o", out_path,
               "-w", "%{http_code} %{content_type}"] + list(args)
        p = subprocess.run(cmd, capture_output=True, timeout=TIMEOUT + 10)
        if p.returncode != 0:
            raise AssertionError("curl failed (%d): %s %s" % (p.returncode, cmd,
                                                             p.stderr.decode(errors="replace")))
        status, _, ctype = p.stdout.decode().partition(" ")
        with open(out_path, "rb") as f:
            return int(status), ctype, f.read()
    finally:
        os.unlink(out_path)


class CompatBase(unittest.TestCase):
    daemon = None
    workdir = None
    segment = None

    @classmethod
    def tearDownClass(cls):
        try:
            rc = cls.daemon.stop(discard=False)
            tail = cls.daemon.log_tail()
        finally:
            for p in [shm_path(cls.segment)] + glob.glob(shm_path(cls.segment) + ".*"):
                if os.path.exists(p):
                    os.unlink(p)
            shutil.rmtree(cls.workdir, ignore_errors=True)
        if rc != 0:
            raise AssertionError("kvcoordd exited with %r after SIGTERM (want 0):\n%s" % (rc, tail))

    # -- requests-side helpers --
    def put(self, payload, method="PUT", url=None, **kw):
        data = payload if isinstance(payload, (bytes, str)) else json.dumps(payload)
        headers = kw.pop("headers", {"Content-Type": "application/json"})
        return requests.request(method, (url or self.daemon.url) + REGISTER, data=data,
                                headers=headers, timeout=TIMEOUT, **kw)

    def get(self, rank=None, raw_query=None, url=None):
        u = (url or self.daemon.url) + LOOKUP
        if raw_query is not None:
            return requests.get(u + raw_query, timeout=TIMEOUT)
        return requests.get(u, params={"rank": rank}, timeout=TIMEOUT)

    def snapshot(self, ranks, url=None):
        """(status, parsed body) of each rank's lookup."""
        out = {}
        for r in ranks:
            resp = self.get(r, url=url)
            out[r] = (resp.status_code, resp.json())
        return out

    # -- assertions --
    def assert_ok_text(self, resp, what=""):
        self.assertEqual(resp.status_code, 200, "%s: %s %r" % (what, resp.status_code, resp.text))
        self.assertTrue(resp.headers.get("Content-Type", "").startswith("text/plain"),
                        "%s: Content-Type %r" % (what, resp.headers.get("Content-Type")))
        self.assertEqual(resp.text, "OK", what)

    def assert_info(self, resp, rank, session_id, wid):
        self.assertEqual(resp.status_code, 200, resp.text[:500])
        self.assertTrue(resp.headers.get("Content-Type", "").startswith("application/json"),
                        resp.headers.get("Content-Type"))
        self.assert_info_json(resp.json(), rank, session_id, wid)

    def assert_info_json(self, doc, rank, session_id, wid):
        self.assertIsInstance(doc, dict)
        self.assertEqual(sorted(doc), ["rank", "remote_instance_transfer_engine_info"])
        self.assertIs(type(doc["rank"]), int)
        self.assertEqual(doc["rank"], rank)
        info = doc["remote_instance_transfer_engine_info"]
        self.assertIsInstance(info, list)
        self.assertEqual(len(info), 2)
        self.assertEqual(info[0], session_id)
        self.assertEqual(info[1], wid)

    def assert_detail(self, resp, status, detail=None, contains=None, what=""):
        ctx = "%s: %s %r" % (what, resp.status_code, resp.text[:300])
        self.assertEqual(resp.status_code, status, ctx)
        self.assertTrue(resp.headers.get("Content-Type", "").startswith("application/json"),
                        "%s: Content-Type %r" % (ctx, resp.headers.get("Content-Type")))
        doc = resp.json()
        self.assertIsInstance(doc, dict, ctx)
        self.assertEqual(list(doc), ["detail"], ctx)
        self.assertIsInstance(doc["detail"], str, ctx)
        if detail is not None:
            self.assertEqual(doc["detail"], detail, ctx)
        for word in contains or ():
            self.assertIn(word, doc["detail"], ctx)
        return doc["detail"]

    def assert_404(self, rank, url=None):
        self.assert_detail(self.get(rank, url=url), 404,
                           "No transfer engine info for rank %d" % rank, what="rank %d" % rank)


class HttpCompat(CompatBase):
    """One kvcoordd with default limits, shared by the tests (distinct ranks each)."""

    @classmethod
    def setUpClass(cls):
        cls.workdir = tempfile.mkdtemp(prefix="kvctest-compat-")
        cls.segment = "kvctest-compat-%d" % os.getpid()
        cls.daemon = Daemon(cls.segment, exe=ARGS.daemon, max_rooms=None, log_level=None)

    # ---- health ----

    def test_health_requests(self):
        self.assert_ok_text(requests.get(self.daemon.url + "/health", timeout=TIMEOUT), "health")

    def test_health_curl(self):
        status, ctype, data = curl(self.daemon.url + "/health")
        self.assertEqual(status, 200)
        self.assertTrue(ctype.startswith("text/plain"), ctype)
        self.assertEqual(data, b"OK")

    def test_keep_alive_session(self):
        """Several requests over one requests.Session (HTTP/1.1 keep-alive)."""
        wid = weights(3, seed=60)
        with requests.Session() as s:
            for _ in range(3):
                r = s.get(self.daemon.url + "/health", timeout=TIMEOUT)
                self.assert_ok_text(r, "health on a kept-alive connection")
            r = s.put(self.daemon.url + REGISTER, json=body(60, "10.0.0.60:16060", wid),
                      timeout=TIMEOUT)
            self.assert_ok_text(r, "register on a kept-alive connection")
            for _ in range(3):
                r = s.get(self.daemon.url + LOOKUP, params={"rank": 60}, timeout=TIMEOUT)
                self.assert_info(r, 60, "10.0.0.60:16060", wid)
            r = s.get(self.daemon.url + LOOKUP, params={"rank": 61}, timeout=TIMEOUT)
            self.assert_detail(r, 404, "No transfer engine info for rank 61")
            self.assert_ok_text(s.get(self.daemon.url + "/health", timeout=TIMEOUT),
                                "health after a 404 on the same connection")

    def test_curl_keep_alive_several_urls(self):
        """One curl invocation, several URLs: curl reuses the connection."""
        p = subprocess.run(["curl", "-sS", "--max-time", str(TIMEOUT), "-w", "|%{http_code}\n",
                            self.daemon.url + "/health", self.daemon.url + "/health",
                            self.daemon.url + LOOKUP + "?rank=62"],
                           capture_output=True, timeout=TIMEOUT + 10)
        self.assertEqual(p.returncode, 0, p.stderr)
        lines = p.stdout.decode().splitlines()
        self.assertEqual(lines[0], "OK|200")
        self.assertEqual(lines[1], "OK|200")
        self.assertEqual(json.loads(lines[2].rpartition("|")[0]),
                         {"detail": "No transfer engine info for rank 62"})
        self.assertEqual(lines[2].rpartition("|")[2], "404")

    # ---- registration ----

    def test_register_with_rank(self):
        wid = weights(4, seed=1)
        self.assert_ok_text(self.put(body(1, "10.0.0.1:16001", wid)), "PUT rank 1")
        self.assert_info(self.get(1), 1, "10.0.0.1:16001", wid)

    def test_register_with_tp_rank_only(self):
        wid = weights(4, seed=2)
        self.assert_ok_text(self.put(body(2, "10.0.0.2:16002", wid, key="tp_rank")),
                            "PUT tp_rank 2")
        self.assert_info(self.get(2), 2, "10.0.0.2:16002", wid)

    def test_rank_wins_over_tp_rank(self):
        """{"rank":0,"tp_rank":7}: stored under 0 (rank 0 is valid); 7 stays 404."""
        wid = weights(2, seed=0)
        b = body(0, "10.0.0.0:16000", wid)
        b["tp_rank"] = 7
        self.assert_ok_text(self.put(b), "PUT rank 0 + tp_rank 7")
        self.assert_info(self.get(0), 0, "10.0.0.0:16000", wid)
        self.assert_404(7)

    def test_post_accepted(self):
        wid = weights(3, seed=3)
        self.assert_ok_text(self.put(body(3, "10.0.0.3:16003", wid), method="POST"), "POST")
        self.assert_info(self.get(3), 3, "10.0.0.3:16003", wid)

    def test_curl_put_post_and_get(self):
        for rank, method in ((4, "PUT"), (5, "POST")):
            wid = weights(5, seed=rank)
            sid = "10.0.0.%d:160%02d" % (rank, rank)
            path = os.path.join(self.workdir, "curl-%d.json" % rank)
            with open(path, "w") as f:
                json.dump(body(rank, sid, wid), f)
            status, ctype, data = curl("-X", method, "-H", "Content-Type: application/json",
                                       "--data-binary", "@" + path,
                                       self.daemon.url + REGISTER)
            self.assertEqual((status, data), (200, b"OK"), method)
            self.assertTrue(ctype.startswith("text/plain"), ctype)
            status, ctype, data = curl(self.daemon.url + LOOKUP + "?rank=%d" % rank)
            self.assertEqual(status, 200, data)
            self.assertTrue(ctype.startswith("application/json"), ctype)
            self.assert_info_json(json.loads(data), rank, sid, wid)

    def test_chunked_request_body(self):
        """requests sends a generator body with Transfer-Encoding: chunked."""
        wid = weights(40, seed=6)
        raw = json.dumps(body(6, "10.0.0.6:16006", wid)).encode()
        chunks = [raw[i:i + 97] for i in range(0, len(raw), 97)]
        r = requests.put(self.daemon.url + REGISTER, data=iter(chunks),
                         headers={"Content-Type": "application/json"}, timeout=TIMEOUT)
        self.assertEqual(r.request.headers.get("Transfer-Encoding"), "chunked")
        self.assert_ok_text(r, "chunked PUT")
        self.assert_info(self.get(6), 6, "10.0.0.6:16006", wid)

    def test_overwrite(self):
        a, b = weights(3, seed=30), weights(4, seed=31)
        self.assert_ok_text(self.put(body(30, "10.0.0.30:16030", a)), "first")
        self.assert_info(self.get(30), 30, "10.0.0.30:16030", a)
        self.assert_ok_text(self.put(body(30, "10.0.1.30:17030", b)), "second")
        self.assert_info(self.get(30), 30, "10.0.1.30:17030", b)

    def list_entry(self, rank):
        """The rank's entry in GET /ranks (an extension) if the daemon serves it."""
        try:
            r = requests.get(self.daemon.url + "/ranks", timeout=TIMEOUT)
            doc = r.json() if r.status_code == 200 else None
        except (requests.RequestException, ValueError):
            return None
        items = doc.get("ranks", doc) if isinstance(doc, dict) else doc
        if isinstance(items, dict):
            items = [dict(v, rank=int(k)) if isinstance(v, dict) else {"rank": int(k)}
                     for k, v in items.items() if str(k).isdigit()]
        for it in items or ():
            if isinstance(it, dict) and it.get("rank") == rank:
                return it
        return None

    def test_identical_reregistration(self):
        """The same registration again (a client retry) -> 200, nothing changes."""
        wid = weights(6, seed=32)
        b = body(32, "10.0.0.32:16032", wid)
        self.assert_ok_text(self.put(b), "first")
        before = self.get(32)
        entry_before = self.list_entry(32)
        for method in ("PUT", "POST"):
            self.assert_ok_text(self.put(b, method=method), "identical " + method)
        after = self.get(32)
        self.assert_info(after, 32, "10.0.0.32:16032", wid)
        self.assertEqual(before.content, after.content)
        entry_after = self.list_entry(32)
        if entry_before is not None and "generation" in entry_before:
            self.assertEqual(entry_before["generation"], entry_after.get("generation"),
                             "an identical re-registration changed the generation")

    def test_unknown_fields_ignored(self):
        wid = weights(2, seed=33)
        b = body(33, "10.0.0.33:16033", wid, extra_top={"nested": [1, 2, {"x": None}]},
                 model="llama")
        b["transfer_engine_info"]["protocol"] = "rdma"
        self.assert_ok_text(self.put(b), "unknown fields")
        self.assert_info(self.get(33), 33, "10.0.0.33:16033", wid)

    def test_ipv6_session_ids_verbatim(self):
        for rank, sid in ((34, "[2001:db8::1]:16051"), (35, "2001:db8::1"),
                          (36, "[fe80::1%eth0]:16052")):
            wid = weights(2, seed=rank)
            self.assert_ok_text(self.put(body(rank, sid, wid)), sid)
            self.assert_info(self.get(rank), rank, sid, wid)
            status, _, data = curl(self.daemon.url + LOOKUP + "?rank=%d" % rank)
            self.assertEqual(status, 200)
            self.assert_info_json(json.loads(data), rank, sid, wid)

    def test_unicode_and_escapes_round_trip(self):
        wid = {"weight \"quoted\" \\ back/slash": [1, 2, 2], "ünïcödé.名前": [3, 4, 2],
               "nested": {"a": [1.5, -2, True, None]}, "": []}
        self.assert_ok_text(self.put(body(37, "host-37:1", wid)), "escapes")
        self.assert_info(self.get(37), 37, "host-37:1", wid)

    def test_empty_weights_dict(self):
        self.assert_ok_text(self.put(body(38, "10.0.0.38:16038", {})), "empty dict")
        self.assert_info(self.get(38), 38, "10.0.0.38:16038", {})

    def test_stress_rank_4mb(self):
        """The generator's 50,000-entry (about 4 MB) rank, over requests and curl."""
        out = os.path.join(self.workdir, "stress")
        gen = os.path.join(ARGS.source, "tools", "gen_model_info.py") if ARGS.source else None
        if gen and os.path.exists(gen):
            p = subprocess.run([sys.executable, gen, "--model", "stress", "--tp", "1",
                                "--out", out, "--quiet"], capture_output=True, timeout=300)
            self.assertEqual(p.returncode, 0, p.stderr)
            with open(os.path.join(out, "rank-0.json"), encoding="utf-8") as f:
                doc = json.load(f)
        else:   # an equivalent rank built here
            doc = body(0, "127.0.0.1:16000",
                       {"model.layers.%d.mlp.experts.%d.gate_up_proj.weight" % (i // 512, i % 512):
                        [0x7F2A00000000 + i * 65536, 7168 * 512, 2] for i in range(50_000)})
        sid = doc["transfer_engine_info"]["session_id"]
        wid = doc["transfer_engine_info"]["weights_info_dict"]
        self.assertGreaterEqual(len(wid), 50_000)
        doc.pop("tp_rank", None)
        doc["rank"] = 40
        raw = json.dumps(doc).encode()
        self.assertGreater(len(raw), 3_000_000)
        self.assert_ok_text(self.put(raw), "stress PUT")
        self.assert_info(self.get(40), 40, sid, wid)
        # curl sends Expect: 100-continue for a body this large.
        doc["rank"] = 41
        path = os.path.join(self.workdir, "stress-41.json")
        with open(path, "wb") as f:
            f.write(json.dumps(doc).encode())
        status, _, data = curl("-X", "PUT", "-H", "Content-Type: application/json",
                               "--data-binary", "@" + path, self.daemon.url + REGISTER)
        self.assertEqual((status, data), (200, b"OK"))
        status, _, data = curl(self.daemon.url + LOOKUP + "?rank=41")
        self.assertEqual(status, 200)
        self.assert_info_json(json.loads(data), 41, sid, wid)
        self.assert_info(self.get(40), 40, sid, wid)

    # ---- lookups that fail ----

    def test_unknown_rank_404(self):
        for rank in (999, 1023, 5000):
            self.assert_404(rank)
        status, ctype, data = curl(self.daemon.url + LOOKUP + "?rank=998")
        self.assertEqual(status, 404)
        self.assertTrue(ctype.startswith("application/json"), ctype)
        self.assertEqual(json.loads(data), {"detail": "No transfer engine info for rank 998"})

    def test_invalid_rank_parameter(self):
        for value in ("-1", "-5", "abc", "1.5", "1e3", "0x10", "1abc", "--1"):
            self.assert_detail(self.get(value), 400, "Invalid rank parameter",
                               what="rank=%r" % value)
        status, ctype, data = curl(self.daemon.url + LOOKUP + "?rank=-1")
        self.assertEqual(status, 400)
        self.assertTrue(ctype.startswith("application/json"), ctype)
        self.assertEqual(json.loads(data), {"detail": "Invalid rank parameter"})

    def test_missing_rank_parameter(self):
        for query in ("", "?", "?other=1", "?ranks=1"):
            self.assert_detail(self.get(raw_query=query), 400, "Missing rank parameter",
                               what="query %r" % query)
        status, _, data = curl(self.daemon.url + LOOKUP)
        self.assertEqual(status, 400)
        self.assertEqual(json.loads(data), {"detail": "Missing rank parameter"})

    def test_empty_rank_parameter(self):
        """rank= (empty): sglang's servers disagree; either fixed 400 detail is fine."""
        d = self.assert_detail(self.get(raw_query="?rank="), 400, what="rank=")
        self.assertIn(d, ("Invalid rank parameter", "Missing rank parameter"))

    def test_unknown_path(self):
        for path in ("/nope", "/get_transfer_engine_info/1", "/health/x"):
            r = requests.get(self.daemon.url + path, timeout=TIMEOUT)
            self.assert_detail(r, 404, "Not Found", what=path)
        status, ctype, data = curl(self.daemon.url + "/nope")
        self.assertEqual(status, 404)
        self.assertTrue(ctype.startswith("application/json"), ctype)
        self.assertEqual(json.loads(data), {"detail": "Not Found"})
        self.assert_ok_text(requests.get(self.daemon.url + "/health", timeout=TIMEOUT))

    # ---- registrations that fail: 400, field named, nothing changes ----

    def setup_probe(self):
        """Rank 20 registered with a known value; ranks 21, 22 never registered."""
        self.probe_wid = weights(3, seed=20)
        self.assert_ok_text(self.put(body(20, "10.0.0.20:16020", self.probe_wid)), "probe")
        self.probe_ranks = (20, 21, 22)
        return self.snapshot(self.probe_ranks)

    def assert_unchanged(self, before, what):
        after = self.snapshot(self.probe_ranks)
        self.assertEqual(before, after, "stored values changed after a rejected request: "
                                        + what)
        self.assertEqual(after[20][0], 200)
        self.assertEqual(after[21][0], 404)

    def test_register_bad_fields(self):
        before = self.setup_probe()
        wid = weights(2, seed=21)
        good_tei = {"session_id": "10.0.0.21:16021", "weights_info_dict": wid}
        cases = [
            # (body, words the detail must contain)
            ({"transfer_engine_info": good_tei}, ["rank"]),
            ({"rank": -1, "transfer_engine_info": good_tei}, ["rank"]),
            ({"rank": "21", "transfer_engine_info": good_tei}, ["rank"]),
            ({"rank": 21.5, "transfer_engine_info": good_tei}, ["rank"]),
            ({"rank": True, "transfer_engine_info": good_tei}, ["rank"]),
            ({"rank": None, "transfer_engine_info": good_tei}, ["rank"]),
            ({"rank": [21], "transfer_engine_info": good_tei}, ["rank"]),
            ({"tp_rank": -3, "transfer_engine_info": good_tei}, ["tp_rank"]),
            ({"tp_rank": "x", "transfer_engine_info": good_tei}, ["tp_rank"]),
            ({"rank": 20}, ["transfer_engine_info"]),
            ({"rank": 20, "transfer_engine_info": "10.0.0.20:1"}, ["transfer_engine_info"]),
            ({"rank": 20, "transfer_engine_info": None}, ["transfer_engine_info"]),
            ({"rank": 20, "transfer_engine_info": {"weights_info_dict": wid}}, ["session_id"]),
            ({"rank": 20, "transfer_engine_info": {"session_id": 16021,
                                                    "weights_info_dict": wid}}, ["session_id"]),
            ({"rank": 20, "transfer_engine_info": {"session_id": "",
                                                    "weights_info_dict": wid}}, ["session_id"]),
            ({"rank": 20, "transfer_engine_info": {"session_id": "h:1"}}, ["weights_info_dict"]),
            ({"rank": 20, "transfer_engine_info": {"session_id": "h:1",
                                                    "weights_info_dict": [1, 2]}},
             ["weights_info_dict"]),
            ({"rank": 20, "transfer_engine_info": {"session_id": "h:1",
                                                    "weights_info_dict": "{}"}},
             ["weights_info_dict"]),
        ]
        for b, words in cases:
            for method in ("PUT", "POST"):
                what = "%s %s" % (method, json.dumps(b)[:120])
                self.assert_detail(self.put(b, method=method), 400, contains=words, what=what)
                self.assert_unchanged(before, what)

    def test_register_bad_fields_curl(self):
        before = self.setup_probe()
        status, ctype, data = curl("-X", "PUT", "-H", "Content-Type: application/json",
                                   "--data-binary",
                                   '{"rank": 20, "transfer_engine_info": {"session_id": "h:1"}}',
                                   self.daemon.url + REGISTER)
        self.assertEqual(status, 400, data)
        self.assertTrue(ctype.startswith("application/json"), ctype)
        self.assertIn("weights_info_dict", json.loads(data)["detail"])
        self.assert_unchanged(before, "curl missing weights_info_dict")

    def test_malformed_json(self):
        before = self.setup_probe()
        for raw in ('{"rank": 20, "transfer_engine_info": {"session_id": "h:1",',
                    'not json at all',
                    '{"rank": 20 "transfer_engine_info": {}}',
                    '{"rank": 20, "transfer_engine_info": {"session_id": "h:1", '
                    '"weights_info_dict": {"a": [1,2,2],}}}',
                    '{"rank": 20}}',
                    "{'rank': 20}"):
            for method in ("PUT", "POST"):
                what = "%s %r" % (method, raw)
                d = self.assert_detail(self.put(raw, method=method), 400, what=what)
                self.assertRegex(d, re.compile(r"(line|column|col|position|pos|offset|byte|"
                                               r"char(acter)?)\s*[:=]?\s*\d+", re.I), what)
                self.assert_unchanged(before, what)
        # An empty body: 400 with a detail (where is trivially "the start").
        self.assert_detail(self.put(b""), 400, what="empty body")
        self.assert_unchanged(before, "empty body")

    def test_body_not_an_object(self):
        before = self.setup_probe()
        for raw in ("[1, 2]", '"rank"', "42", "null", "true", '[{"rank": 20}]'):
            what = "body %s" % raw
            self.assert_detail(self.put(raw), 400, what=what)
            self.assert_unchanged(before, what)

    def test_non_http_bytes_then_still_serves(self):
        """Raw non-HTTP bytes -> 400 (or a close); the daemon keeps serving."""
        s = socket.create_connection(("127.0.0.1", self.daemon.port), timeout=TIMEOUT)
        try:
            s.sendall(b"\x16\x03\x01\x02\x00garbage that is not HTTP\r\n\r\n")
            s.settimeout(TIMEOUT)
            data = b""
            try:
                while True:
                    chunk = s.recv(4096)
                    if not chunk:
                        break
                    data += chunk
            except (ConnectionResetError, socket.timeout):
                pass
            if data:
                self.assertRegex(data[:12], rb"^HTTP/1\.[01] 400", data[:200])
        finally:
            s.close()
        self.assert_ok_text(requests.get(self.daemon.url + "/health", timeout=TIMEOUT))
        self.assert_404(23)


class HttpBodyCap(CompatBase):
    """A second kvcoordd with a small --max-body-bytes: an oversized body is 413."""

    CAP = 4096

    @classmethod
    def setUpClass(cls):
        cls.workdir = tempfile.mkdtemp(prefix="kvctest-compat-cap-")
        cls.segment = "kvctest-compat-cap-%d" % os.getpid()
        cls.daemon = Daemon(cls.segment, ["--max-body-bytes", str(cls.CAP)], exe=ARGS.daemon,
                            max_rooms=None, log_level=None)

    def big_body(self, rank, size):
        b = body(rank, "10.0.0.%d:1" % rank, {})
        filler = size - len(json.dumps(b))
        n = max(1, filler // 40 + 1)
        b["transfer_engine_info"]["weights_info_dict"] = {
            "model.layers.%05d.mlp.down_proj.w" % i: [i, 1, 2] for i in range(n)}
        raw = json.dumps(b).encode()
        self.assertGreater(len(raw), size)
        return raw

    def test_oversized_body_413(self):
        small = weights(2, seed=50)
        self.assert_ok_text(self.put(body(50, "10.0.0.50:1", small)), "small body under the cap")
        self.probe_ranks = (50, 51)
        before = self.snapshot(self.probe_ranks)
        for rank, size in ((50, self.CAP * 2), (51, self.CAP * 2), (50, self.CAP * 64)):
            raw = self.big_body(rank, size)
            try:
                r = self.put(raw)
                self.assertEqual(r.status_code, 413, r.text[:200])
            except requests.ConnectionError as e:
                # The server may answer 413 and close before reading the body;
                # the client then fails while still sending.  Confirm with curl,
                # which reads the early response.
                path = os.path.join(self.workdir, "big.json")
                with open(path, "wb") as f:
                    f.write(raw)
                status, _, data = curl("-X", "PUT", "-H", "Content-Type: application/json",
                                       "--data-binary", "@" + path, self.daemon.url + REGISTER)
                self.assertEqual(status, 413, "%s / curl: %r" % (e, data[:200]))
            self.assertEqual(before, self.snapshot(self.probe_ranks),
                             "stored values changed after a 413")
        # curl too (Expect: 100-continue is not sent for small bodies; force it).
        path = os.path.join(self.workdir, "big-curl.json")
        with open(path, "wb") as f:
            f.write(self.big_body(51, self.CAP * 4))
        status, _, _ = curl("-X", "PUT", "-H", "Content-Type: application/json",
                            "-H", "Expect: 100-continue", "--data-binary", "@" + path,
                            self.daemon.url + REGISTER)
        self.assertEqual(status, 413)
        self.assertEqual(before, self.snapshot(self.probe_ranks))
        # The daemon still serves, and a body under the cap still registers.
        self.assert_ok_text(requests.get(self.daemon.url + "/health", timeout=TIMEOUT))
        small2 = weights(3, seed=51)
        self.assert_ok_text(self.put(body(51, "10.0.0.51:1", small2)), "small after 413")
        self.assert_info(self.get(51), 51, "10.0.0.51:1", small2)
        self.assert_info(self.get(50), 50, "10.0.0.50:1", small)


def main():
    global ARGS
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--daemon", default=os.environ.get("KVCOORDD"),
                    help="path of kvcoordd (or $KVCOORDD)")
    ap.add_argument("--source", default=os.environ.get("KVCOORD_SOURCE_DIR"),
                    help="source tree, for tools/gen_model_info.py (or $KVCOORD_SOURCE_DIR)")
    ARGS, rest = ap.parse_known_args()
    if not ARGS.daemon:
        ap.error("--daemon (or KVCOORDD) is required")
    ARGS.daemon = os.path.abspath(ARGS.daemon)
    if not os.access(ARGS.daemon, os.X_OK):
        ap.error("kvcoordd not executable: %s" % ARGS.daemon)
    if shutil.which("curl") is None:
        ap.error("curl not found (Debian package curl)")
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)


if __name__ == "__main__":
    main()
