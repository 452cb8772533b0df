#!/usr/bin/python3
"""bench_sglang_poll.py - sglang's poll_and_all_reduce as kvcoord.sglang.install()
patches it, against sglang's original (gloo) on the same pollers, on
sglang's real call path (issue 29 item 1).

For each process count (default 2, 4, 8) the ranks are forked, each with a
torch.distributed gloo world on CPU, the sglang-shaped fixture
(tests/python/fake_sglang: its Mooncake senders, KV manager and
update_status rules) and kvcoord.sglang.install().  Each step runs a random
script of rooms (a seed every rank shares): new senders are created (their
rooms opened in the segment by the patched update_status), every live
room's status moves through sglang's update_status (each rank its own
values, now and then a Failed), then the step's poll is timed three ways on
the same pollers: sglang's original poll_and_all_reduce (gloo), the
installed one, and the bare Segment.allreduce_min of the same polls (the
collective alone, for reference); rooms that ended (Success or Failed
agreed) are cleared.  About --rooms rooms are live at a time.
Printed per process count: median and p99 in µs over every rank's samples,
the ratio gloo / installed, the installed call's cost above the bare
collective, and the disagreements (steps where the installed answer
differs from gloo's on a rank).

Usage: PYTHONPATH=build/python tools/bench/bench_sglang_poll.py
           [--procs 2,4,8] [--steps 240] [--rooms 64] [--seed 1]
Needs Debian's python3-torch.  Nothing is asserted.
"""

import argparse
import json
import mmap
import os
import random
import statistics
import sys
import time

import kvcoord
from benchlib import free_port, pct, run_ranks  # tools/bench/benchlib.py

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURE = os.path.join(HERE, "..", "..", "tests", "python", "fake_sglang")
WARMUP = 20
ADDR = "10.0.0.9:8998"


def child(rank, size, name, port, steps, rooms, seed, out_w, clock):
    sys.path.insert(0, os.path.abspath(FIXTURE))
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % port, rank=rank,
                            world_size=size)
    import kvcoord.sglang as ksg
    from sglang.srt.disaggregation import utils
    from sglang.srt.disaggregation.mooncake import conn as mooncake

    ksg.install(name, rank, size=size, timeout=60.0)
    group = dist.new_group(backend="gloo")
    installed = utils.poll_and_all_reduce
    original = installed.__kvcoord_original__
    seg = kvcoord.Segment(name, role="client")
    mgr = mooncake.MooncakeKVManager(rank)
    shared = random.Random(seed)  # the script: the same on every rank
    mine = random.Random(seed * 7919 + rank)  # this rank's statuses
    live, next_room = {}, 1 + (seed << 32)

    def sync():
        """Start the next timed call at the same instant on every rank: the
        previous call's exit skew (gloo's is hundreds of µs) and a barrier's
        own wake-up would otherwise be charged to whichever call comes next.
        A barrier of its own in shared memory (not kvcoord's collective, whose
        spin-or-sleep choice it would sway), then rank 0 sets a start 1 ms
        ahead and every rank spins until it."""
        sync.n += 1
        clock[1 + rank] = sync.n
        while any(clock[1 + r] < sync.n for r in range(size)):
            os.sched_yield()
        if rank == 0:
            clock[0] = time.monotonic_ns() + 1000000
            clock[1 + size] = sync.n
        while clock[1 + size] < sync.n:
            os.sched_yield()
        while time.monotonic_ns() < clock[0]:
            pass

    sync.n = 0

    gl, kv, bare, disagree = [], [], [], 0
    for step in range(steps + WARMUP):
        for _ in range(max(0, rooms - len(live)) if step == 0 else shared.randrange(0, 9)):
            if len(live) < rooms * 5 // 4:
                live[next_room] = mooncake.MooncakeKVSender(mgr, ADDR, next_room)
                next_room += 1
        for room in live:
            if mine.random() < 0.002:
                mgr.record_failure(room, "bench: injected")
                mgr.update_status(room, 0)
            elif mine.random() < 0.25:
                mgr.update_status(room, min(4, int(mgr.request_status.get(room, 1)) + 1))
        pollers = list(live.values())
        sync()
        t0 = time.perf_counter_ns()
        want = original(pollers, group)
        t1 = time.perf_counter_ns()
        sync()
        t2 = time.perf_counter_ns()
        got = installed(pollers, group)
        t3 = time.perf_counter_ns()
        polls = [int(p.poll()) for p in pollers]
        sync()
        t4 = time.perf_counter_ns()
        seg.allreduce_min(0xbe7c4 + size, size, rank, polls, timeout=60.0)
        t5 = time.perf_counter_ns()
        if step >= WARMUP:
            gl.append((t1 - t0) / 1e3)
            kv.append((t3 - t2) / 1e3)
            bare.append((t5 - t4) / 1e3)
            disagree += got != want
        for p, agreed in zip(pollers, got):
            if agreed in (0, 4):
                p.clear()
                del live[p.bootstrap_room]
    ksg.uninstall()
    seg.close()
    dist.destroy_process_group()
    os.write(out_w, json.dumps([gl, kv, bare, disagree]).encode())


def run(size, steps, rooms, seed):
    import torch  # noqa: F401  (imported before forking: the children inherit it)
    name = "kvcbench-sglpoll-%d-%d" % (os.getpid(), size)
    keeper = kvcoord.Segment(name, mode="fresh", role="none", max_rooms=4096, world_size=size)
    port = free_port()
    # sync() in child: the start time, each rank's barrier count, rank 0's go
    clock = memoryview(mmap.mmap(-1, 8 * (size + 2))).cast("Q")
    try:
        gl, kv, bare, disagree, failed = [], [], [], 0, 0
        for status, data in run_ranks(
                size, lambda rank, w: child(rank, size, name, port, steps, rooms, seed, w, clock)):
            if status or not data:
                failed += 1
                continue
            g, k, b, d = json.loads(data)
            gl += g
            kv += k
            bare += b
            disagree += d
    finally:
        keeper.close()
        kvcoord.unlink(name)
    return gl, kv, bare, disagree, failed


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--procs", default="2,4,8", help="process counts, comma-separated")
    ap.add_argument("--steps", type=int, default=240, help="timed steps per count")
    ap.add_argument("--rooms", type=int, default=64, help="live rooms (pollers) per step")
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    try:
        import torch  # noqa: F401
    except ImportError as e:
        print("bench_sglang_poll: needs torch (%s; apt-get install python3-torch)" % e)
        return 2
    m = statistics.median
    print("sglang's poll_and_all_reduce, ~%d rooms, %d steps, load %.1f / %.1f / %.1f, %d CPUs;"
          " µs per call, every rank's samples:"
          % (a.rooms, a.steps, *os.getloadavg(), os.cpu_count()))
    print("%5s  %22s  %22s  %22s  %7s  %7s  %s" % (
        "procs", "gloo original med/p99", "installed med/p99", "bare collective med/p99",
        "median", "p99", "disagreements"))
    for size in [int(x) for x in a.procs.split(",")]:
        gl, kv, bare, disagree, failed = run(size, a.steps, a.rooms, a.seed)
        if failed or not kv:
            print("%5d  %d rank(s) failed (see stderr)" % (size, failed))
            continue
        print("%5d  %10.1f / %9.1f  %10.1f / %9.1f  %10.1f / %9.1f  %6.1fx  %6.1fx  %d of %d"
              % (size, m(gl), pct(gl, .99), m(kv), pct(kv, .99), m(bare), pct(bare, .99),
                 m(gl) / m(kv), pct(gl, .99) / pct(kv, .99), disagree, len(kv)))
        sys.stdout.flush()
    print("load after: %.1f / %.1f / %.1f" % os.getloadavg())
    return 0


if __name__ == "__main__":
    sys.exit(main())
