#!/usr/bin/env python3
"""test_pd_cluster.py - the PD bootstrap tables across nodes: kvcoordd
--etcd nodes over a real 3-member etcd cluster (Debian's etcd-server,
tools/etcd-cluster.sh), each with its own segment and port.

- A TP=2 x DP=2 prefill registers on node A (PUT /route; one rank from a
  process of its own); node B, which has no table, answers sglang's GET
  /route with A's topology and A's rank_ip/rank_port, byte for byte A's
  answers (plus X-Kvcoord-Origin: A).
- The registering process SIGKILLed on A: withdrawn on B too (B answers
  what A answers: 503 not fully registered, never the dead address).
- Node A's kvcoordd SIGKILLed: B's mirror goes when A's lease ends; A
  restarted on its segment: back on B.
- etcd frozen (SIGSTOP, every member): B drops the mirror once it has gone
  unconfirmed past the lease TTL, as it drops ranks; A serves its own table
  throughout; SIGCONT: back on B.  B restarted while etcd is frozen serves no
  table of A's until etcd is back (the mirror lives in kvcoordd's memory).
- Two prefill nodes: B (no table) answers 409 naming both unless node= names
  one; a prefill node answers from its own table as before; a malformed
  pd/ record is skipped and logged.
- kvcoord-diag pd --etcd shows every node's table with its node.

No wall-clock limit is asserted: waits are bounded generously and the
measured times are printed.

Usage: test_pd_cluster.py --daemon KVCOORDD --diag KVCOORD-DIAG"""

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

import requests

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import clusterlib as cl  # noqa: E402

ARGS = None
ETCD = None
TTL = 2
SLACK = 60  # seconds past the TTL a wait may take before the test gives up (a hang guard:
#            a passing wait returns as soon as its condition holds; 20 ran out in an
#            ASan run at load 7.8, as test_cluster.py's did before)
TOPOLOGY = "/route?prefill_dp_rank=-1&prefill_cp_rank=-1&target_tp_rank=-1&target_pp_rank=-1"


def lookup(dp, tp, cp=0, pp=0):
    return "/route?prefill_dp_rank=%d&prefill_cp_rank=%d&target_tp_rank=%d&target_pp_rank=%d" % (
        dp, cp, tp, pp)


def registration(tp, dp, tp_size=2, dp_size=2, ip=None, port=None):
    return {"attn_tp_size": tp_size, "attn_tp_rank": tp, "attn_cp_size": 1, "attn_cp_rank": 0,
            "attn_dp_size": dp_size, "attn_dp_rank": dp, "pp_size": 1, "pp_rank": 0,
            "system_dp_size": 1, "system_dp_rank": 0,
            "rank_ip": ip or "10.0.%d.%d" % (dp, tp + 1),
            "rank_port": port or 17000 + tp + 10 * dp, "page_size": 64,
            "kv_cache_dtype": "auto", "load_balance_method": "follow_bootstrap_room",
            "prefill_http_port": 30000}


def setUpModule():
    global ETCD
    ETCD = cl.Etcd().start()


def tearDownModule():
    if ETCD:
        ETCD.close()


def get(node, path):
    """(status, content type, body, origin header) of a GET on node."""
    r = requests.get(node.url + path, timeout=30)
    return r.status_code, r.headers.get("Content-Type"), r.text, r.headers.get("X-Kvcoord-Origin")


class Base(unittest.TestCase):
    T = TTL

    def setUp(self):
        self.nodes = []
        self.children = []
        self.cluster = "pd%d-%s" % (os.getpid(), self._testMethodName[5:28].replace("_", "-"))
        self.tmp = tempfile.mkdtemp(prefix="kvc-pdcl-")

    def tearDown(self):
        cl.logs_if_failed(self, self.nodes)
        for p in self.children:
            if p.poll() is None:
                p.kill()
                p.wait()
        for n in self.nodes:
            try:
                n.stop()
            except Exception:
                pass
            n.unlink()
        if not os.environ.get("KVCOORD_KEEP_LOGS"):
            shutil.rmtree(self.tmp, ignore_errors=True)

    def node(self, name, **kw):
        n = cl.Node(ARGS.daemon, ETCD.endpoints, self.cluster, name, ttl=self.T,
                    logdir=self.tmp, **kw)
        self.nodes.append(n)
        return n.start()

    def until(self, pred, what, limit=None):
        limit = limit or self.T + SLACK
        v, took = cl.wait_for(pred, limit)
        self.assertTrue(v, "%s: not within %.0f s" % (what, limit))
        return took

    def register(self, node, body):
        r = requests.put(node.url + "/route", json=body, timeout=30)
        self.assertEqual((r.status_code, r.text), (200, "OK"))

    def register_in_child(self, node, body):
        """PUT /route from a process of its own (which then owns the entry);
        returns the process, alive until killed."""
        p = subprocess.Popen([sys.executable, "-c", (
            "import http.client, json, time\n"
            "c = http.client.HTTPConnection('127.0.0.1', %d)\n"
            "c.request('PUT', '/route', body=json.dumps(%r))\n"
            "r = c.getresponse(); r.read(); print(r.status, flush=True)\n"
            "time.sleep(600)\n") % (node.port, body)], stdout=subprocess.PIPE, text=True)
        self.children.append(p)
        self.assertEqual(p.stdout.readline().strip(), "200")
        return p

    def mirrored(self, node, origin, path=TOPOLOGY, status=200):
        """Wait until node answers path from origin's table with status;
        returns the answer."""
        last = []

        def check():
            a = get(node, path)
            last[:] = [a]
            return a if a[0] == status and a[3] == origin else None
        took = self.until(check, "%s answering %s from %s's table with %d (last %r)"
                          % (node.name, path, origin, status, last))
        return last[0], took

    def full_table(self, node):
        for tp, dp in ((1, 1), (0, 0), (1, 0), (0, 1)):
            self.register(node, registration(tp, dp))


class Mirror(Base):
    def test_decode_node_answers_from_the_prefill_nodes_table(self):
        a, b = self.node("A"), self.node("B")
        # Nothing anywhere: B answers as sglang's fresh server.
        self.assertEqual(get(b, TOPOLOGY)[:3], (503, "text/plain; charset=utf-8",
                                                "Prefill server not fully registered yet "
                                                "(0 workers registered)."))
        for tp, dp in ((1, 0), (0, 1), (0, 0)):  # out of order
            self.register(a, registration(tp, dp))
        three = "Prefill server not fully registered yet (3 workers registered)."
        t0 = time.monotonic()
        self.until(lambda: get(b, TOPOLOGY) == (503, "text/plain; charset=utf-8", three, "A"),
                   "B answering A's 503 for 3 of 4 ranks")
        print("3 of 4 ranks registered on A: on B after %.3f s" % (time.monotonic() - t0))
        child = self.register_in_child(a, registration(1, 1, ip="10.9.9.9", port=17999))
        (st, ct, body, _), took = self.mirrored(b, "A")
        print("4th rank (its own process) registered on A: B ready after %.3f s" % took)
        topo = json.loads(body)
        self.assertEqual((topo["attn_tp_size"], topo["dp_size"], topo["attn_cp_size"],
                          topo["pp_size"], topo["page_size"], topo["kv_cache_dtype"],
                          topo["prefill_http_port"], topo["follow_bootstrap_room"]),
                         (2, 2, 1, 1, 64, "auto", 30000, True))
        # Every answer B gives is A's own, byte for byte.
        paths = [TOPOLOGY] + [lookup(dp, tp) for dp in (0, 1) for tp in (0, 1)] + [
            lookup(0, 5), lookup(2, 0), lookup(0, 0, cp=1), lookup(-1, 0)]
        for path in paths:
            on_a, on_b = get(a, path), get(b, path)
            self.assertEqual(on_a[:3], on_b[:3], path)
            self.assertIsNone(on_a[3], "A answers from its own table")
            self.assertEqual(on_b[3], "A", path)
        st, _, body, _ = get(b, lookup(1, 1))
        self.assertEqual((st, json.loads(body)), (200, {"rank_ip": "10.9.9.9",
                                                        "rank_port": 17999}))
        self.assertEqual(get(b, lookup(0, 5))[0], 404)
        # The extension parameter naming A, or B itself.
        self.assertEqual(get(b, lookup(1, 1) + "&node=A")[:3], get(a, lookup(1, 1))[:3])
        self.assertEqual(get(b, TOPOLOGY + "&node=B")[:3],
                         (503, "text/plain; charset=utf-8",
                          "Prefill server not fully registered yet (0 workers registered)."))
        st, _, body, _ = get(b, TOPOLOGY + "&node=Q")
        self.assertEqual(st, 404)
        self.assertIn("No prefill table of node Q in the cluster view (tables mirrored: A)", body)
        self.assertEqual(get(b, TOPOLOGY + "&node=a/b")[0], 400)
        # What B shows of it.
        view = b.cluster_view()
        self.assertEqual([(t["node"], t["ready"], t["registered"], t["expected"])
                          for t in view["pd"]["mirrored"]], [("A", True, 4, 4)])
        self.assertFalse(view["pd"]["published"])
        self.assertTrue(a.cluster_view()["pd"]["published"])
        metrics = requests.get(b.url + "/metrics", timeout=5).text
        self.assertIn("kvcoord_cluster_pd_mirrored_tables 1\n", metrics)
        self.assertIn("kvcoord_cluster_pd_mirrored_ranks 4\n", metrics)
        # The registering process SIGKILLed: withdrawn on A, then on B.
        t0 = time.monotonic()
        child.kill()
        child.wait()
        self.until(lambda: get(b, lookup(1, 1))[0] == 503, "B's answer for the killed rank")
        print("registering process SIGKILLed on A: withdrawn on B after %.3f s"
              % (time.monotonic() - t0))
        for path in (TOPOLOGY, lookup(1, 1), lookup(0, 0)):
            self.assertEqual(get(b, path)[:3], get(a, path)[:3], path)
        # sglang's text, then why (A's note, as A itself says it)
        self.assertTrue(get(b, lookup(1, 1))[2].startswith(
            "Prefill server not fully registered yet (3 workers registered). 1 entry "
            "withdrawn: its process %d " % child.pid), get(b, lookup(1, 1))[2])
        # Registered again (the prefill rank restarted): served on B.
        self.register(a, registration(1, 1, ip="10.8.8.8"))
        self.until(lambda: get(b, lookup(1, 1))[:1] == (200,) and
                   json.loads(get(b, lookup(1, 1))[2])["rank_ip"] == "10.8.8.8",
                   "the re-registered rank on B")
        # kvcoord-diag pd --etcd: every node's table, with its node.
        out = subprocess.run([ARGS.diag, "--segment", b.segment, "--json", "pd", "--etcd",
                              ETCD.endpoints, "--cluster", self.cluster],
                             capture_output=True, text=True, timeout=60)
        self.assertEqual(out.returncode, 0, out.stderr)
        doc = json.loads(out.stdout)
        self.assertIsNone(doc["topology"])  # B's own
        nodes = {t["node"]: t for t in doc["cluster"]}
        self.assertEqual(sorted(nodes), ["A"])
        self.assertEqual((nodes["A"]["registered"], nodes["A"]["expected"],
                          nodes["A"]["ready"]), (4, 4, True))
        self.assertIn(("10.8.8.8", 17011), [(r["rank_ip"], r["rank_port"])
                                            for r in nodes["A"]["ranks"]])
        text = subprocess.run([ARGS.diag, "--segment", b.segment, "pd", "--etcd",
                               ETCD.endpoints, "--cluster", self.cluster],
                              capture_output=True, text=True, timeout=60).stdout
        self.assertIn("PD bootstrap table of node A", text)
        self.assertIn("10.8.8.8:17011", text)

    def test_prefill_nodes_kvcoordd_killed_mirror_expires_restart_brings_it_back(self):
        a, b = self.node("A"), self.node("B")
        self.full_table(a)
        self.mirrored(b, "A")
        t0 = time.monotonic()
        a.kill()  # SIGKILL: its lease ends TTL seconds later
        self.until(lambda: get(b, TOPOLOGY)[3] is None, "A's table gone from B")
        print("A's kvcoordd SIGKILLed: its table gone from B after %.3f s (TTL %d s)"
              % (time.monotonic() - t0, self.T))
        self.assertEqual(get(b, TOPOLOGY)[:3], (503, "text/plain; charset=utf-8",
                                                "Prefill server not fully registered yet "
                                                "(0 workers registered)."))
        self.assertIn("pd_mirror_withdrawn", b.logtext())
        # A restarted on its segment (the table survived: its registrant,
        # this process, is alive): published again.
        a.start()
        (st, _, body, _), took = self.mirrored(b, "A", lookup(1, 0))
        print("A restarted: its table on B again after %.3f s" % took)
        self.assertEqual(json.loads(body), {"rank_ip": "10.0.1.1", "rank_port": 17010})

    def test_two_prefill_nodes_decode_names_one(self):
        a, c, b = self.node("A"), self.node("C"), self.node("B")
        self.full_table(a)
        for tp in (0, 1):
            self.register(c, registration(tp, 0, tp_size=2, dp_size=1, ip="10.7.7.%d" % tp))
        self.mirrored(b, "A", TOPOLOGY + "&node=A")
        self.mirrored(b, "C", TOPOLOGY + "&node=C")
        st, ct, body, origin = get(b, TOPOLOGY)
        self.assertEqual((st, ct, origin), (409, "text/plain; charset=utf-8", None))
        self.assertIn("several nodes of the cluster have one (", body)
        self.assertIn("A", body)
        self.assertIn("C", body)
        self.assertIn("&node=<name>", body)
        self.assertEqual(json.loads(get(b, lookup(0, 1) + "&node=C")[2]),
                         {"rank_ip": "10.7.7.1", "rank_port": 17001})
        self.assertEqual(json.loads(get(b, lookup(0, 1) + "&node=A")[2]),
                         {"rank_ip": "10.0.0.2", "rank_port": 17001})
        # A prefill node answers from its own table, as sglang's server
        # would, whatever else the cluster has; node= reaches the others.
        st, _, body, origin = get(a, TOPOLOGY)
        self.assertEqual((st, origin, json.loads(body)["dp_size"]), (200, None, 2))
        st, _, body, origin = get(a, TOPOLOGY + "&node=C")
        self.assertEqual((st, origin, json.loads(body)["dp_size"]), (200, "C", 1))
        # A malformed record of a node: skipped, logged, the rest served.
        out = ETCD.ctl("put", "/kvcoord/%s/pd/Z" % self.cluster, '{"node": "Z", "ranks": 7}')
        self.assertEqual(out.returncode, 0, out.stderr)
        self.until(lambda: "pd/Z" in b.logtext() and "cluster_record_skipped" in b.logtext(),
                   "the malformed record logged on B")
        self.assertEqual(get(b, TOPOLOGY + "&node=Z")[0], 404)
        self.assertEqual(get(b, TOPOLOGY)[0], 409)
        ETCD.ctl("del", "/kvcoord/%s/pd/Z" % self.cluster)
        # C's prefill stops (its table emptied: clean stop of its kvcoordd):
        # one table is left, and B answers from it again.
        c.stop()
        self.mirrored(b, "A")


class Frozen(Base):
    """etcd frozen (SIGSTOP on every member, 4 s TTL): B's PD mirror is
    dropped like its mirrored ranks once unconfirmed past the leases."""

    T = 4

    def test_etcd_frozen_mirror_dropped_local_table_served_then_back(self):
        a, b = self.node("A"), self.node("B")
        self.full_table(a)
        self.mirrored(b, "A")
        ETCD.freeze()
        try:
            t0 = time.monotonic()
            self.until(lambda: get(b, TOPOLOGY)[3] is None, "A's table dropped on B",
                       2 * self.T + SLACK)
            print("etcd SIGSTOPped: A's table dropped on B after %.3f s (TTL %d s)"
                  % (time.monotonic() - t0, self.T))
            self.assertEqual(get(b, TOPOLOGY)[0], 503)
            # the log line follows the drop (under ASan, not always at once)
            self.until(lambda: "pd_mirror_dropped" in b.logtext(), "the drop logged", SLACK)
            self.assertEqual(get(a, TOPOLOGY)[0], 200)  # A's own table is served throughout
            self.assertEqual(get(a, lookup(1, 1))[0], 200)
        finally:
            ETCD.thaw()
        (st, _, body, _), took = self.mirrored(b, "A", lookup(1, 1))
        print("etcd SIGCONTed: A's table back on B after %.3f s" % took)
        self.assertEqual(json.loads(body), {"rank_ip": "10.0.1.2", "rank_port": 17011})

    def test_decode_node_restarted_while_etcd_frozen_serves_no_old_table(self):
        a, b = self.node("A"), self.node("B")
        self.full_table(a)
        self.mirrored(b, "A")
        b.kill()
        ETCD.freeze()
        try:
            b.start()
            # Nothing etcd has not confirmed since: B's own (empty) table.
            for _ in range(3):
                self.assertEqual(get(b, TOPOLOGY)[:3], (503, "text/plain; charset=utf-8",
                                                        "Prefill server not fully registered "
                                                        "yet (0 workers registered)."))
                self.assertEqual(get(b, lookup(0, 0))[0], 503)
                time.sleep(0.3)
        finally:
            ETCD.thaw()
        _, took = self.mirrored(b, "A")
        print("B restarted while etcd was frozen: no table of A served, then A's %.3f s after "
              "SIGCONT" % took)


def main():
    global ARGS
    p = argparse.ArgumentParser()
    p.add_argument("--daemon", required=True)
    p.add_argument("--diag", required=True)
    ARGS, rest = p.parse_known_args()
    if not cl.have_etcd():
        print("SKIP: /usr/bin/etcd not installed (apt-get install etcd-server etcd-client)")
        return 77
    prog = unittest.main(argv=[sys.argv[0]] + rest, exit=False, verbosity=2)
    return 0 if prog.result.wasSuccessful() else 1


if __name__ == "__main__":
    sys.exit(main())
