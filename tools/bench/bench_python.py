#!/usr/bin/python3
"""bench_python.py - kvcoord from Python against what sglang does today, each
figure with its baseline measured in the same run (medians and p99, µs):

  lookup   the Llama-3.1-8B TP=8 rank 0 (13.6 KB): Segment.lookup() vs
           requests.get to kvcoordd vs requests.get to a FastAPI + uvicorn
           server with sglang's routes (tests/python/fastapi_bootstrap.py);
           one requests.Session per server (keep-alive), answers decoded.
  poll     node-local poll agreement, 8 processes, 64 rooms: Segment.room_sync
           (write this rank's polls, read every room's minimum) vs
           torch.distributed.all_reduce(uint8 tensor, op=ReduceOp.MIN) over gloo,
           what sglang's poll_and_all_reduce does each scheduler step.
  failure  Python to Python: room_fail in one process -> KVTransferError raised
           in another (waiting in room_wait(..., check=True)) vs a bare pipe wake-up between the
           same two processes, the two interleaved sample by sample (neither gets
           the warmer half), in --rounds rounds of fresh segment and processes,
           each round's cold start (its first samples) shown apart.

Usage: PYTHONPATH=build/python tools/bench/bench_python.py [lookup|poll|failure|all]
           [--daemon build/kvcoordd] [--quick] [--rounds N]
Needs Debian's python3-requests, python3-fastapi, python3-uvicorn, python3-torch
(a benchmark missing one says so and is skipped).  Nothing is asserted.
"""

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

import kvcoord
from benchlib import free_port, pct, read_all, run_ranks  # tools/bench/benchlib.py

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
TP = 8


def fmt(name, us):
    return "%-44s median %9.2f us   p99 %9.2f us   (n=%d)" % (name, statistics.median(us),
                                                               pct(us, 0.99), len(us))


def llama_rank0():
    with tempfile.TemporaryDirectory() as d:
        subprocess.run([sys.executable, os.path.join(ROOT, "tools", "gen_model_info.py"),
                        "--model", "llama-3.1-8b", "--tp", str(TP), "--out", d], check=True,
                       stdout=subprocess.DEVNULL)
        with open(os.path.join(d, "rank-0.json")) as f:
            return json.load(f)


def wait_http(url, proc=None):
    import requests
    end = time.monotonic() + 30
    while True:
        try:
            if requests.get(url + "/health", timeout=1).status_code == 200:
                return
        except requests.ConnectionError:
            pass
        if (proc and proc.poll() is not None) or time.monotonic() > end:
            raise SystemExit("server at %s did not start" % url)
        time.sleep(0.05)


# ---- lookup -----------------------------------------------------------------

def bench_lookup(a):
    try:
        import requests
        sys.path.insert(0, os.path.join(ROOT, "tests", "python"))
        import fastapi_bootstrap
    except ImportError as e:
        print("lookup: skipped (%s; apt-get install python3-requests python3-fastapi "
              "python3-uvicorn)" % e)
        return
    body = llama_rank0()
    port = free_port()
    seg_name = "kvcbench-py-%d" % os.getpid()
    daemon = subprocess.Popen([a.daemon, "--listen", "127.0.0.1:%d" % port, "--segment",
                               seg_name, "--fresh", "--max-rooms", "256"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    fport = free_port()
    fserver, fthread = fastapi_bootstrap.serve(fport)
    try:
        kurl, furl = "http://127.0.0.1:%d" % port, "http://127.0.0.1:%d" % fport
        wait_http(kurl, daemon)
        wait_http(furl)
        for url in (kurl, furl):
            r = requests.put(url + "/register_transfer_engine_info", json=body, timeout=30)
            assert r.status_code == 200, r.text
        n_http = 300 if a.quick else 3000
        n_lib = 20000 if a.quick else 200000
        with kvcoord.Segment(seg_name) as seg:
            expect = body["transfer_engine_info"]["session_id"]
            for _ in range(1000):
                seg.lookup(0)
            lib = []
            for _ in range(n_lib):
                t0 = time.perf_counter_ns()
                ri = seg.lookup(0)
                sid = ri.session_id
                lib.append((time.perf_counter_ns() - t0) / 1000)
            assert sid == expect
            lib_dict = []
            for _ in range(n_lib // 20):
                t0 = time.perf_counter_ns()
                d = seg.lookup(0).weights_info_dict
                lib_dict.append((time.perf_counter_ns() - t0) / 1000)
            assert len(d) == 195

        def http(url):
            s = requests.Session()
            out = []
            for _ in range(50):
                s.get(url + "/get_transfer_engine_info", params={"rank": 0})
            for _ in range(n_http):
                t0 = time.perf_counter_ns()
                r = s.get(url + "/get_transfer_engine_info", params={"rank": 0})
                info = r.json()["remote_instance_transfer_engine_info"]
                out.append((time.perf_counter_ns() - t0) / 1000)
            assert info[0] == expect
            return out

        kv = http(kurl)
        fa = http(furl)
    finally:
        fserver.should_exit = True
        fthread.join(10)
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(30)
        try:
            kvcoord.unlink(seg_name)
        except kvcoord.Error:
            pass
    m = statistics.median
    print("lookup of the Llama-3.1-8B rank 0 (%d-byte weights_info_dict) from Python:" %
          len(json.dumps(body["transfer_engine_info"]["weights_info_dict"],
                         separators=(",", ":"))))
    print("  " + fmt("Segment.lookup() (session_id; raw bytes)", lib))
    print("  " + fmt("Segment.lookup().weights_info_dict (decoded)", lib_dict))
    print("  " + fmt("requests.get -> kvcoordd (decoded)", kv))
    print("  " + fmt("requests.get -> FastAPI + uvicorn (decoded)", fa))
    print("  ratios (median): kvcoordd / binding %.0fx, FastAPI / binding %.0fx, "
          "FastAPI / binding with decode %.1fx, FastAPI / kvcoordd %.2fx"
          % (m(kv) / m(lib), m(fa) / m(lib), m(fa) / m(lib_dict), m(fa) / m(kv)))


# ---- poll agreement -----------------------------------------------------------

ROOMS = 64


def poll_child_kvcoord(rank, name, rooms, iters, out_w):
    with kvcoord.Segment(name, rank=rank) as seg:
        for r in rooms:
            seg.room_open(r, rank, TP)
        polls = [int(kvcoord.KVPoll.Transferring)] * ROOMS
        times = []
        for i in range(iters + 20):
            t0 = time.perf_counter_ns()
            agreed = [int(s) for s in seg.room_sync(rank, rooms, polls)]
            times.append((time.perf_counter_ns() - t0) / 1000)
        assert len(agreed) == ROOMS
        for r in rooms:
            seg.room_release(r, rank)
    os.write(out_w, json.dumps(times[20:]).encode())


def poll_child_torch(rank, port, iters, out_w):
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % port, rank=rank,
                            world_size=TP)
    polls = [int(kvcoord.KVPoll.Transferring)] * ROOMS
    times = []
    for i in range(iters + 20):
        t0 = time.perf_counter_ns()
        t = torch.tensor(polls, dtype=torch.uint8, device="cpu")
        dist.all_reduce(t, op=dist.ReduceOp.MIN)
        agreed = t.tolist()
        times.append((time.perf_counter_ns() - t0) / 1000)
    assert len(agreed) == ROOMS
    dist.destroy_process_group()
    os.write(out_w, json.dumps(times[20:]).encode())


def run_group(target, *args):
    samples = []
    for _, data in run_ranks(TP, lambda rank, w: target(rank, *args, w)):
        if data:
            samples += json.loads(data)
    return samples


def bench_poll(a):
    iters = 200 if a.quick else 2000
    name = "kvcbench-poll-%d" % os.getpid()
    with kvcoord.Segment(name, mode="fresh", role="none", max_rooms=1024, world_size=TP):
        pass
    try:
        import random
        rooms = [random.randrange(1 << 63) for _ in range(ROOMS)]
        kv = run_group(poll_child_kvcoord, name, rooms, iters)
    finally:
        kvcoord.unlink(name)
    try:
        import torch  # noqa: F401  (imported before forking: children inherit it)
    except ImportError as e:
        print("poll: torch baseline skipped (%s; apt-get install python3-torch)" % e)
        print("  " + fmt("Segment.room_sync (64 rooms)", kv))
        return
    gl = run_group(poll_child_torch, free_port(), iters)
    m = statistics.median
    print("poll agreement, %d processes, %d rooms, per scheduler step (all ranks' samples):"
          % (TP, ROOMS))
    print("  " + fmt("Segment.room_sync (set own, read minimum)", kv))
    print("  " + fmt("torch all_reduce(uint8, MIN) over gloo", gl))
    print("  ratio (median): gloo / kvcoord %.0fx; p99: %.0fx" % (m(gl) / m(kv),
                                                                   pct(gl, .99) / pct(kv, .99)))


# ---- failure propagation ---------------------------------------------------------

COLD = 50  # the first samples of a round: a fresh segment and fresh processes


def order(i):
    """Alternate which of the two is measured first, so neither gets the warmer slot."""
    return ("kv", "pipe") if i % 2 == 0 else ("pipe", "kv")


def failure_round(n):
    """One round: a fresh segment and a fresh waiter process; n samples of each
    kind, interleaved.  Returns (kvcoord µs, pipe µs) in the order taken."""
    name = "kvcbench-fail-%d" % os.getpid()
    with kvcoord.Segment(name, mode="fresh", role="none", max_rooms=4096, world_size=2):
        pass
    ready_r, ready_w = os.pipe()  # waiter -> failer: "I am about to wait"
    go_r, go_w = os.pipe()        # failer -> waiter: the pipe baseline
    res_r, res_w = os.pipe()
    base = 1 << 40
    pid = os.fork()
    if pid == 0:  # the waiter: rank 1
        code = 0
        for fd in (ready_r, go_w, res_r):
            os.close(fd)
        try:
            with kvcoord.Segment(name, rank=1) as seg:
                kv, pipe_lat = [], []
                for i in range(n):
                    for kind in order(i):
                        if kind == "kv":
                            room = base + i
                            seg.room_open(room, 1, 2)
                            os.write(ready_w, b"r")
                            try:
                                info = seg.check_room(room, 1)
                                while True:  # returns on a state change, raises on a failure
                                    info = seg.room_wait(room, info.state, 1, timeout=30,
                                                         check=True)
                            except kvcoord.KVTransferError:
                                kv.append(time.monotonic_ns())
                            seg.room_release(room, 1)
                        else:
                            os.write(ready_w, b"r")
                            t0 = int(os.read(go_r, 32))
                            pipe_lat.append((time.monotonic_ns() - t0) / 1000)
                os.write(res_w, json.dumps([kv, pipe_lat]).encode())
        except BaseException as e:
            sys.stderr.write("waiter: %r\n" % (e,))
            code = 1
        os._exit(code)
    for fd in (ready_w, go_r, res_w):
        os.close(fd)

    def ready():  # the waiter's "about to wait"; EOF when it died
        if not os.read(ready_r, 1):
            kvcoord.unlink(name)
            os.waitpid(pid, 0)
            raise SystemExit("failure: the waiter ended early (see its message above)")

    sent = []
    with kvcoord.Segment(name, rank=0) as seg:
        done = None  # the room failed last, released once the waiter is ready again
        for i in range(n):
            for kind in order(i):
                # After its signal the failer goes straight back to ready() for
                # both kinds: its own bookkeeping (this rank's room_release, the
                # next room_open) runs while the waiter is known to be waiting,
                # never between the signal and the waiter's wake-up (with both
                # processes on one CPU it would delay the waiter by its length).
                ready()
                if done is not None:
                    seg.room_release(done, 0)
                    done = None
                if kind == "kv":
                    room = base + i
                    seg.room_open(room, 0, 2)
                    time.sleep(0.0005)  # let the waiter reach its futex wait
                    t0 = time.monotonic_ns()
                    seg.room_fail(room, 0, "ibv_post_send: transport retry counter exceeded", 12)
                    sent.append(t0)  # after: a list growing is not the failure's cost
                    done = room
                else:
                    time.sleep(0.0005)  # let the waiter reach its read
                    os.write(go_w, str(time.monotonic_ns()).encode())
        data = read_all(res_r)
        if done is not None:
            seg.room_release(done, 0)
    _, status = os.waitpid(pid, 0)
    for fd in (ready_r, go_w):
        os.close(fd)
    kvcoord.unlink(name)
    if status or not data:
        raise SystemExit("failure: the waiter failed (status %d)" % status)
    kv_t1, pipe_lat = json.loads(data)
    return [(t1 - t0) / 1000 for t0, t1 in zip(sent, kv_t1)], pipe_lat


def bench_failure(a):
    n = 300 if a.quick else 2000
    m = statistics.median
    print("failure propagation, Python to Python (2 processes), %d rounds of %d interleaved "
          "samples each (a fresh segment and processes per round; cold = its first %d):"
          % (a.rounds, n, COLD))
    print("  %-7s %-30s %-30s %s" % ("round", "room_fail -> KVTransferError",
                                     "bare pipe wake-up", "ratio all / cold"))
    ratios, cold_ratios, kvs, pipes = [], [], [], []
    for r in range(a.rounds):
        kv, pipe = failure_round(n)
        ratio, cold = m(kv) / m(pipe), m(kv[:COLD]) / m(pipe[:COLD])
        ratios.append(ratio)
        cold_ratios.append(cold)
        kvs.append(m(kv))
        pipes.append(m(pipe))
        print("  %-7d %7.2f us (cold %7.2f us)   %7.2f us (cold %7.2f us)   %.2fx / %.2fx"
              % (r + 1, m(kv), m(kv[:COLD]), m(pipe), m(pipe[:COLD]), ratio, cold))
    print("  medians over rounds: room_fail -> KVTransferError raised %.2f us, pipe %.2f us; "
          "ratio %.2fx (worst round %.2fx, worst cold %.2fx)"
          % (m(kvs), m(pipes), m(ratios), max(ratios), max(cold_ratios)))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("what", nargs="?", default="all", choices=["lookup", "poll", "failure", "all"])
    ap.add_argument("--daemon", default=os.path.join(ROOT, "build", "kvcoordd"))
    ap.add_argument("--quick", action="store_true", help="fewer samples (a smoke run)")
    ap.add_argument("--rounds", type=int, default=5, help="failure: rounds (default 5)")
    a = ap.parse_args()
    print("bench_python.py on %d CPUs, %s" % (os.cpu_count(), time.strftime("%Y-%m-%d %H:%M")))
    if a.what in ("lookup", "all"):
        bench_lookup(a)
    if a.what in ("poll", "all"):
        bench_poll(a)
    if a.what in ("failure", "all"):
        bench_failure(a)


if __name__ == "__main__":
    main()
