#!/usr/bin/python3
"""bench_hier.py - the poll all-reduce of a TP group spanning two hosts:
kvcoord's hierarchical collective against gloo's all_reduce(uint8 tensor,
op=MIN), on the same ranks, in the same two network namespaces, in the same
run.

Each host is a network namespace joined to the other by a bridge (the
setup of tests/hier/hiernet.py), with its own segment; `--ranks` per host
(default 4,8: 2x4 and 2x8).  Every rank (bench_hier_rank.py) runs `--steps`
scheduler steps of `--rooms` KVPoll values (0..4, each rank its own, from a
seed all share), in blocks of 50 steps: kvcoord's then gloo's for the same
50 (the order alternates block by block).  `--path installed` (default)
times sglang's poll_and_all_reduce(pollers, gloo_group) after
kvcoord.sglang.install() on the sglang-shaped fixture (the polls, then the
hierarchical MIN); `--path hier` times HierGroup.allreduce_min alone (list
of ints to list of ints).  gloo is timed list -> tensor -> all_reduce ->
list.  Printed per layout: median and p99 in µs over every rank's samples,
the ratio gloo / kvcoord, and the disagreements (steps where a rank's two
answers differ, or differ from the MIN of every rank's inputs), with the
load average before and after.  `--runs N` repeats each layout.

Usage (root, ip(8), python3-torch):
  PYTHONPATH=build/python tools/bench/bench_hier.py [--ranks 4,8] [--steps 1000]
      [--rooms 64] [--path installed|hier] [--runs 1]
Nothing is asserted.
"""

import argparse
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "hier"))

import hiernet  # noqa: E402
import hiertest  # noqa: E402
from benchlib import pct  # noqa: E402  (tools/bench/benchlib.py)

RANK_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bench_hier_rank.py")


def run(net, per, steps, rooms, path):
    segs = ["kvcbench-hier-%d-%d-%d" % (os.getpid(), per, h) for h in range(2)]
    for s in segs:
        hiertest.make_segment(s)
    ranks = None
    try:
        lay = [h for h in range(2) for _ in range(per)]
        ranks = hiertest.Ranks(net, lay, segs, None, script=RANK_SCRIPT, steps=steps,
                               rooms=rooms, path=path, root=ROOT)
        for r in range(len(lay)):
            ranks.expect(r, "ready", deadline=600)
        kv, gl, disagree = [], [], 0
        for r in range(len(lay)):
            d = ranks.expect(r, "done", deadline=3600)
            kv += d["kv"]
            gl += d["gloo"]
            disagree += d["disagree"]
        return kv, gl, disagree
    finally:
        if ranks:
            ranks.close()
        for s in segs:
            hiertest.discard(s)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", default="4,8", help="ranks per host, comma-separated")
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--rooms", type=int, default=64)
    ap.add_argument("--path", choices=("installed", "hier"), default="installed")
    ap.add_argument("--runs", type=int, default=1)
    a = ap.parse_args()
    hiernet.require_root()
    net = hiernet.Net(2, "b")
    m = statistics.median
    try:
        print("MIN of %d KVPoll values per scheduler step across 2 hosts (network namespaces), "
              "%d steps, path %s, %d CPUs; µs per call, every rank's samples:"
              % (a.rooms, a.steps, a.path, os.cpu_count()))
        print("%6s  %24s  %24s  %7s  %7s  %13s  %s" % ("ranks", "kvcoord median / p99",
                                                       "gloo median / p99", "median", "p99",
                                                       "disagreements", "load before/after"))
        for per in [int(x) for x in a.ranks.split(",")]:
            for _ in range(a.runs):
                load0 = os.getloadavg()[0]
                t0 = time.monotonic()
                kv, gl, dis = run(net, per, a.steps, a.rooms, a.path)
                load1 = os.getloadavg()[0]
                print("%2dx%-3d  %11.1f / %10.1f  %11.1f / %10.1f  %6.1fx  %6.1fx  %6d of %-5d"
                      "  %.1f / %.1f (%.0f s)"
                      % (2, per, m(kv), pct(kv, .99), m(gl), pct(gl, .99), m(gl) / m(kv),
                         pct(gl, .99) / pct(kv, .99), dis, 2 * per * a.steps, load0, load1,
                         time.monotonic() - t0), flush=True)
    finally:
        net.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
