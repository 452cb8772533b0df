#!/usr/bin/python3
"""bench_collective.py - the segment's MIN all-reduce (Segment.allreduce_min,
kvc_allreduce_min) against torch.distributed.all_reduce(uint8 tensor,
op=ReduceOp.MIN) over gloo on CPU - what sglang's poll_and_all_reduce does each
scheduler step - in the same run, on the same inputs.

For each process count (default 2, 4, 8) the ranks run `--steps` scheduler
steps; in every step each rank has a vector of `--rooms` KVPoll values
(0..4, from a seed all ranks share, so each rank's vector differs), and both
all-reduces reduce it: in blocks of 50 steps, kvcoord's then gloo's for the
same 50 steps (the order alternates block by block), so that each call waits
only for its own kind's previous call, and both see the same machine.  Each call is timed from a list of ints to
a list of ints, as sglang's code has them: kvcoord `list(seg.allreduce_min(...))`,
gloo `torch.tensor(polls, dtype=torch.uint8)` + `all_reduce` + `tolist()`.
Printed per process count: median and p99 in µs over every rank's samples,
the ratio gloo / kvcoord, and the disagreements: steps where a rank's two
answers differ, or differ from the MIN computed from every rank's inputs.

Usage: PYTHONPATH=build/python tools/bench/bench_collective.py
           [--procs 2,4,8] [--steps 2000] [--rooms 64] [--quick]
Needs Debian's python3-torch.  Nothing is asserted.
"""

import argparse
import json
import os
import random
import statistics
import sys
import time

import kvcoord
from benchlib import free_port, pct, run_ranks  # tools/bench/benchlib.py

WARMUP = 20
BLOCK = 50  # steps of one kind in a row; the kinds alternate, block by block


def polls_of(seed, step, rank, rooms):
    rng = random.Random((seed * 1000003 + step) * 1009 + rank)
    # Mostly Transferring / Success, now and then a Failed or Bootstrapping.
    return [rng.choice((0, 1, 2, 3, 3, 3, 4, 4, 4, 4)) for _ in range(rooms)]


def child(rank, size, name, port, steps, rooms, seed, out_w):
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % port, rank=rank,
                            world_size=size)
    group = 0xC0117 + size
    kv, gl, disagree = [], [], 0
    # Inputs and the expected MIN made before timing: between two calls a
    # rank only does the other all-reduce.
    inputs = [polls_of(seed, step, rank, rooms) for step in range(steps + WARMUP)]
    wants = [[min(v) for v in zip(*(polls_of(seed, step, r, rooms) for r in range(size)))]
             for step in range(steps + WARMUP)]
    with kvcoord.Segment(name, role="client", rank=rank) as seg:
        for first in range(0, steps + WARMUP, BLOCK):
            block = range(first, min(first + BLOCK, steps + WARMUP))
            answers = {}
            for which in ((0, 1) if first // BLOCK % 2 == 0 else (1, 0)):
                for step in block:
                    mine = inputs[step]
                    t0 = time.perf_counter_ns()
                    if which == 0:
                        got = list(seg.allreduce_min(group, size, rank, mine, timeout=60))
                    else:
                        t = torch.tensor(mine, dtype=torch.uint8, device="cpu")
                        dist.all_reduce(t, op=dist.ReduceOp.MIN)
                        got = t.tolist()
                    dt = (time.perf_counter_ns() - t0) / 1000
                    if step >= WARMUP:
                        (kv if which == 0 else gl).append(dt)
                    answers[which, step] = got
            for step in block:
                a, b = answers[0, step], answers[1, step]
                disagree += a != b or a != wants[step]
    dist.destroy_process_group()
    os.write(out_w, json.dumps([kv, gl, disagree]).encode())


def run(size, steps, rooms, seed):
    import torch  # noqa: F401  (imported before forking: the children inherit it)
    name = "kvcbench-coll-%d-%d" % (os.getpid(), size)
    keeper = kvcoord.Segment(name, mode="fresh", role="none", max_rooms=1024, world_size=size)
    port = free_port()
    try:
        kv, gl, disagree, failed = [], [], 0, 0
        for status, data in run_ranks(
                size, lambda rank, w: child(rank, size, name, port, steps, rooms, seed, w)):
            if status or not data:
                failed += 1
                continue
            k, g, d = json.loads(data)
            kv += k
            gl += g
            disagree += d
    finally:
        keeper.close()
        kvcoord.unlink(name)
    return kv, gl, disagree, failed


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--procs", default="2,4,8", help="process counts, comma-separated")
    ap.add_argument("--steps", type=int, default=2000, help="scheduler steps per count")
    ap.add_argument("--rooms", type=int, default=64, help="vector length (rooms polled)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--quick", action="store_true", help="200 steps")
    a = ap.parse_args()
    try:
        import torch  # noqa: F401
    except ImportError as e:
        print("bench_collective: needs torch (%s; apt-get install python3-torch)" % e)
        return 2
    steps = 200 if a.quick else a.steps
    m = statistics.median
    print("MIN all-reduce of %d uint8 (KVPoll) values per scheduler step, %d steps, "
          "load %.1f, %d CPUs; µs per call, every rank's samples:"
          % (a.rooms, steps, os.getloadavg()[0], os.cpu_count()))
    print("%5s  %26s  %26s  %8s  %8s  %s" % ("procs", "kvcoord median / p99",
                                              "gloo median / p99", "median", "p99",
                                              "disagreements"))
    for size in [int(x) for x in a.procs.split(",")]:
        kv, gl, disagree, failed = run(size, steps, a.rooms, a.seed)
        if failed or not kv or not gl:
            print("%5d  %d rank(s) failed (see stderr)" % (size, failed))
            continue
        print("%5d  %12.1f / %11.1f  %12.1f / %11.1f  %7.0fx  %7.1fx  %d of %d"
              % (size, m(kv), pct(kv, .99), m(gl), pct(gl, .99), m(gl) / m(kv),
                 pct(gl, .99) / pct(kv, .99), disagree, size * steps))
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
