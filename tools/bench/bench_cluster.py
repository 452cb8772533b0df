#!/usr/bin/env python3
"""bench_cluster.py - figures of kvcoordd's cluster view (--etcd), each with
a baseline measured in the same run on the same etcd cluster:

  propagation   registration on node A -> visible on node B's mirror (B's
                long-poll lookup returns), median and p99, vs etcd's own
                put -> watch event latency (gateway put, gateway watch);
  lookup        a rank of A looked up on B: through libkvcoord and over
                HTTP (kvcoord-bench lookup), and over HTTP from Python, vs
                asking etcd per request (a gateway range of the rank's key,
                same Python client, same keep-alive);
  scale         8 kvcoordd nodes with 128 Llama-3.1-8B ranks each (1,024 in
                all): time until every node has all 1,024, each node's
                arena bytes and kvcoordd RSS, and the catch-up time of a node
                restarted with an empty segment.

Usage: tools/bench/bench_cluster.py [--build build] [--rounds 200] [--nodes 8]
       [--ranks-per-node 128] [--json]
Starts and stops its own etcd cluster and nodes (tools/etcd-cluster.sh)."""

import argparse
import base64
import json
import os
import statistics
import subprocess
import sys
import threading
import time

import requests

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "cluster"))
import clusterlib as cl  # noqa: E402


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def b64(s):
    return base64.b64encode(s.encode()).decode()


def rank_info(rank, tag):
    return {"model.layers.%d.self_attn.qkv_proj.weight" % i: [0x7F0000000000 + i * 256, 4096 + tag,
                                                              2] for i in range(16)}


def propagation(a, b, rounds):
    """Registration on A (HTTP PUT) -> B's parked lookup answers."""
    lat = []
    sa, sb = requests.Session(), requests.Session()
    for i in range(rounds):
        rank = 500 + i % 100
        done = {}

        def wait():
            r = sb.get(b.url + "/get_transfer_engine_info?rank=%d&wait_ms=10000" % rank, timeout=20)
            done["t"] = time.perf_counter()
            done["st"] = r.status_code
        # Make the rank absent on B first, so the lookup parks.
        if i >= 100:
            sa.delete(a.url + "/transfer_engine_info?rank=%d" % rank, timeout=5)
            cl.wait_for(lambda: sb.get(b.url + "/get_transfer_engine_info?rank=%d" % rank,
                                       timeout=5).status_code == 404, 5, step=0.002)
        t = threading.Thread(target=wait)
        t.start()
        time.sleep(0.01)  # parked
        t0 = time.perf_counter()
        body = {"rank": rank, "transfer_engine_info": {"session_id": "h:%d" % i,
                                                       "weights_info_dict": rank_info(rank, i)}}
        sa.put(a.url + "/register_transfer_engine_info", json=body, timeout=10).raise_for_status()
        t.join()
        if done.get("st") == 200:
            lat.append(done["t"] - t0)
    return lat


def etcd_put_watch(endpoint, rounds):
    """etcd's own: gateway put -> the event on a gateway watch stream."""
    key = "/bench/putwatch"
    lat = []
    events = []
    cv = threading.Condition()
    stop = threading.Event()

    def watch():
        r = requests.post(endpoint + "/v3/watch", stream=True, timeout=None,
                          json={"create_request": {"key": b64(key)}})
        for line in r.iter_lines():
            if stop.is_set():
                break
            msg = json.loads(line)
            if msg.get("result", {}).get("events"):
                with cv:
                    events.append(time.perf_counter())
                    cv.notify()
        r.close()
    t = threading.Thread(target=watch, daemon=True)
    t.start()
    time.sleep(0.5)
    s = requests.Session()
    for i in range(rounds):
        with cv:
            n = len(events)
        t0 = time.perf_counter()
        s.post(endpoint + "/v3/kv/put", json={"key": b64(key), "value": b64("v%d" % i)},
               timeout=5).raise_for_status()
        with cv:
            cv.wait_for(lambda: len(events) > n, 5)
            if len(events) > n:
                lat.append(events[n] - t0)
        time.sleep(0.01)
    stop.set()
    return lat


def py_lookups(b, endpoint, cluster, rank, iters):
    sb, se = requests.Session(), requests.Session()
    key = "/kvcoord/%s/ranks/A/%d" % (cluster, rank)
    http, etcd = [], []
    for _ in range(iters):
        t0 = time.perf_counter()
        r = sb.get(b.url + "/get_transfer_engine_info?rank=%d" % rank, timeout=5)
        t1 = time.perf_counter()
        assert r.status_code == 200
        http.append(t1 - t0)
        t0 = time.perf_counter()
        r = se.post(endpoint + "/v3/kv/range", json={"key": b64(key)}, timeout=5)
        rec = json.loads(base64.b64decode(r.json()["kvs"][0]["value"]))
        json.loads(rec["info"])  # what a caller would then do with it
        etcd.append(time.perf_counter() - t0)
    return http, etcd


def rss_kb(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def scale(args, etcd, daemon):
    nodes = [cl.Node(daemon, etcd.endpoints, "scale", "n%d" % i, ttl=10) for i in range(args.nodes)]
    for n in nodes:
        n.start(wait=False)
    for n in nodes:
        cl.wait_for(n.healthy, 20)
    cl.gen_model("llama-3.1-8b", "/tmp/kvc-bench-llama", tp=8)
    infos = []
    for r in range(8):
        with open("/tmp/kvc-bench-llama/rank-%d.json" % r) as f:
            infos.append(json.load(f)["transfer_engine_info"])
    total = args.nodes * args.ranks_per_node
    t0 = time.perf_counter()
    for i, n in enumerate(nodes):
        s = requests.Session()
        for k in range(args.ranks_per_node):
            rank = i * args.ranks_per_node + k
            ti = infos[rank % 8]
            body = {"rank": rank, "transfer_engine_info": {
                "session_id": "10.0.%d.%d:%d" % (i, k, 16000 + rank % 8),
                "weights_info_dict": ti["weights_info_dict"]}}
            s.put(n.url + "/register_transfer_engine_info", json=body, timeout=30)
    t_reg = time.perf_counter() - t0

    def registered(n):
        txt = requests.get(n.url + "/metrics", timeout=10).text
        for line in txt.splitlines():
            if line.startswith("kvcoord_ranks_registered "):
                return int(float(line.split()[1]))
        return 0
    for n in nodes:
        cl.wait_for(lambda: registered(n) == total, 120, step=0.05)
    t_all = time.perf_counter() - t0
    used = []
    for n in nodes:
        txt = requests.get(n.url + "/metrics", timeout=10).text
        for line in txt.splitlines():
            if line.startswith("kvcoord_arena_used_bytes "):
                used.append(int(float(line.split()[1])))
    rss = [rss_kb(n.proc.pid) for n in nodes]
    # Catch-up: the last node restarts with an empty segment.
    last = nodes[-1]
    last.stop()
    last.fresh = True
    t1 = time.perf_counter()
    last.start(wait=False)
    cl.wait_for(last.healthy, 20, step=0.005)
    remote = total - args.ranks_per_node
    cl.wait_for(lambda: registered(last) >= remote, 120, step=0.01)
    t_catch = time.perf_counter() - t1
    for n in nodes:
        n.stop()
        n.unlink()
    return {"nodes": args.nodes, "ranks": total, "register_s": t_reg, "converged_s": t_all,
            "arena_used_bytes": statistics.median(used), "rss_kb_median": statistics.median(rss),
            "rss_kb_max": max(rss), "catchup_s": t_catch, "catchup_ranks": remote}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--build", default=os.path.join(ROOT, "build"))
    p.add_argument("--rounds", type=int, default=200)
    p.add_argument("--iters", type=int, default=2000)
    p.add_argument("--nodes", type=int, default=8)
    p.add_argument("--ranks-per-node", type=int, default=128)
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    daemon = os.path.join(args.build, "kvcoordd")
    bench = os.path.join(args.build, "kvcoord-bench")
    etcd = cl.Etcd().start()
    out = {}
    try:
        a = cl.Node(daemon, etcd.endpoints, "bench", "A", ttl=10).start()
        b = cl.Node(daemon, etcd.endpoints, "bench", "B", ttl=10).start()
        ep = etcd.endpoints.split(",")[0]
        prop = propagation(a, b, args.rounds)
        base = etcd_put_watch(ep, args.rounds)
        out["propagation"] = {"n": len(prop), "median_ms": statistics.median(prop) * 1e3,
                              "p99_ms": pct(prop, 99) * 1e3}
        out["etcd_put_watch"] = {"n": len(base), "median_ms": statistics.median(base) * 1e3,
                                 "p99_ms": pct(base, 99) * 1e3}
        # A Llama-3.1-8B rank registered on A, looked up on B.
        cl.gen_model("llama-3.1-8b", "/tmp/kvc-bench-llama", tp=8)
        with open("/tmp/kvc-bench-llama/rank-0.json", "rb") as f:
            a.register_raw(f.read())
        cl.wait_for(lambda: b.lookup(0)[0] == 200, 10)
        kb = subprocess.run([bench, "lookup", "--segment", b.segment, "--rank", "0", "--url",
                             b.url, "--json"], capture_output=True, text=True, timeout=300)
        try:
            out["kvcoord_bench_lookup"] = json.loads(kb.stdout)
        except ValueError:
            out["kvcoord_bench_lookup"] = {"raw": kb.stdout + kb.stderr}
        be = subprocess.run([os.path.join(args.build, "kvcoord-bench-etcd"), "--etcd", ep,
                             "--key", "/kvcoord/bench/ranks/A/0", "--url", b.url, "--rank", "0",
                             "--iters", str(args.iters)], capture_output=True, text=True,
                            timeout=600)
        try:
            out["lookup_libcurl"] = json.loads(be.stdout)
        except ValueError:
            out["lookup_libcurl"] = {"raw": be.stdout + be.stderr}
        http, per_req = py_lookups(b, ep, "bench", 0, args.iters)
        out["lookup_python"] = {"b_http_median_us": statistics.median(http) * 1e6,
                                "b_http_p99_us": pct(http, 99) * 1e6,
                                "etcd_range_median_us": statistics.median(per_req) * 1e6,
                                "etcd_range_p99_us": pct(per_req, 99) * 1e6}
        a.stop(), b.stop(), a.unlink(), b.unlink()
        out["scale"] = scale(args, etcd, daemon)
    finally:
        etcd.close()
    if args.json:
        print(json.dumps(out, indent=2))
        return
    pr, bw = out["propagation"], out["etcd_put_watch"]
    print("propagation A->B mirror: median %.2f ms, p99 %.2f ms (n=%d) | etcd put->watch: "
          "median %.2f ms, p99 %.2f ms (n=%d) | ratio %.2fx" % (
              pr["median_ms"], pr["p99_ms"], pr["n"], bw["median_ms"], bw["p99_ms"], bw["n"],
              pr["median_ms"] / bw["median_ms"]))
    lp = out["lookup_python"]
    print("remote rank on B, Python requests keep-alive: B HTTP median %.0f us (p99 %.0f) | "
          "etcd range per request median %.0f us (p99 %.0f) | %.1fx" % (
              lp["b_http_median_us"], lp["b_http_p99_us"], lp["etcd_range_median_us"],
              lp["etcd_range_p99_us"], lp["etcd_range_median_us"] / lp["b_http_median_us"]))
    lc = out["lookup_libcurl"]
    if "etcd_range_us" in lc:
        print("remote rank on B, libcurl keep-alive: B HTTP median %.0f us (p99 %.0f) | etcd range "
              "per request median %.0f us (p99 %.0f) | %.1fx" % (
                  lc["kvcoordd_http_us"]["median"], lc["kvcoordd_http_us"]["p99"],
                  lc["etcd_range_us"]["median"], lc["etcd_range_us"]["p99"],
                  lc["ratio_etcd_over_mirror_median"]))
    kb = out["kvcoord_bench_lookup"]
    if "library_ns" in kb:
        print("remote rank on B through libkvcoord: median %.0f ns (p99 %.0f); kvcoord-bench HTTP "
              "median %.1f us" % (kb["library_ns"]["median"], kb["library_ns"]["p99"],
                                  kb["http_us"]["median"]))
    else:
        print("kvcoord-bench lookup on B: %s" % json.dumps(kb))
    s = out["scale"]
    print("scale: %d nodes x %d ranks = %d: registered in %.2f s, every node has all %d after "
          "%.2f s; arena %.1f MiB per node; kvcoordd RSS median %.1f MiB (max %.1f); a node "
          "restarted empty has the other %d back after %.2f s" % (
              s["nodes"], s["ranks"] // s["nodes"], s["ranks"], s["register_s"], s["ranks"],
              s["converged_s"], s["arena_used_bytes"] / 2**20, s["rss_kb_median"] / 1024,
              s["rss_kb_max"] / 1024, s["catchup_ranks"], s["catchup_s"]))


if __name__ == "__main__":
    main()
