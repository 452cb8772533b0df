#!/usr/bin/env python3
"""bench_cross_node_failures.py - how fast the decode side learns of a
prefill's failure across nodes (issue 28), with etcd's own put -> watch
latency measured in the same run as the floor, beside sglang's own anchors.

Two kvcoordd with --etcd on a 3-member etcd (started here), a prefill TP
group of 2 on node A and a decode TP group of 2 on node B (the
sglang-shaped rank processes of tests/cluster/sgl_ranks.py), all four
following the same N rooms.  One room at a time, prefill rank 1 records a
failure (sglang's record_failure + update_status(Failed)); measured from
just before that call:

  segment   the record in B's segment (a room_wait on B's segment wakes);
  poll      every decode rank's poll (every 5 ms, as sglang's decode loop
            calls poll_and_all_reduce) says Failed: the later of the two.

Then again with --busy processes spinning on the CPU (the machine loaded).
sglang's own anchors (python/sglang/srt/environ.py): the decode learns of a
dead prefill after the heartbeat's 2 x 5 s, or of a silent one after the
waiting timeout of 300 s; a prefill's recorded failure never reaches the
decode (no reason travels prefill -> decode).

A's kvcoordd pushes each failure to B's beside its etcd put (docs/cluster.md);
--etcd-only makes B refuse the pushes (the nodes' HTTP tokens differ), so the
failures cross through etcd alone, as before the push.  etcd's members keep
their data under the system's temporary directory (on disk: each put pays a
quorum's fsyncs) unless --etcd-dir says where (/dev/shm: tmpfs).

Usage: tools/bench/bench_cross_node_failures.py [--build build] [--rooms 1000]
       [--busy 2] [--etcd-dir DIR] [--etcd-only] [--json]"""

import argparse
import json
import multiprocessing
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "cluster"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import clusterlib as cl  # noqa: E402
from bench_cluster import etcd_put_watch, pct  # noqa: E402


def spin(stop):
    while not stop.is_set():
        pass


def fs_type(path):
    """The file system type of path (from /proc/mounts: the longest mount
    point that is a prefix of it)."""
    best, kind = "", "?"
    path = os.path.realpath(path)
    with open("/proc/mounts") as f:
        for line in f:
            dev, mnt, fstype = line.split()[:3]
            if (path == mnt or path.startswith(mnt.rstrip("/") + "/")) and len(mnt) >= len(best):
                best, kind = mnt, fstype
    return kind


def load():
    return "%.1f %.1f %.1f" % os.getloadavg()


def one_pass(a, b, prefill, decode, rooms, kvcoord):
    seg_b = kvcoord.Segment(b.segment)
    seg_lat, poll_lat = [], []
    for room in rooms:
        woke = {}

        def wait():
            seg_b.room_wait(room, kvcoord.KVPoll.Bootstrapping, timeout=30)
            woke["t"] = time.time_ns()
        t = threading.Thread(target=wait)
        t.start()
        time.sleep(0.002)  # the waiter parked
        t0 = prefill[1].fail(room, 110, "bench: transfer of room %d failed" % room)
        last = 0
        for d in decode:
            rec = d.failed(30)
            if rec is None or rec["room"] != room:
                raise SystemExit("room %d: a decode rank did not see it Failed: %r" % (room, rec))
            last = max(last, rec["t_ns"])
        t.join()
        seg_lat.append((woke["t"] - t0) / 1e6)
        poll_lat.append((last - t0) / 1e6)
    seg_b.close()
    return seg_lat, poll_lat


def stats(xs):
    return {"n": len(xs), "median_ms": statistics.median(xs), "p99_ms": pct(xs, 99),
            "p100_ms": max(xs)}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--build", default=os.path.join(ROOT, "build"))
    p.add_argument("--rooms", type=int, default=1000)
    p.add_argument("--busy", type=int, default=2, help="CPU spinners in the loaded pass")
    p.add_argument("--etcd-dir", default=None,
                   help="where etcd's members keep their data (default: the system's temporary "
                   "directory, on disk here; /dev/shm puts it on tmpfs, without fsync cost)")
    p.add_argument("--etcd-only", action="store_true",
                   help="the nodes get different HTTP tokens, so B refuses A's pushes (401): "
                   "the failures cross through etcd alone, as before the push")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    pypath = os.path.join(args.build, "python")
    sys.path.insert(0, pypath)
    os.environ["PYTHONPATH"] = pypath
    import kvcoord
    import test_shared_rooms as tsr
    tsr.ARGS = argparse.Namespace(pythonpath=pypath)
    daemon = os.path.join(args.build, "kvcoordd")
    etcd = cl.Etcd(parent=args.etcd_dir).start()
    out = {"load_start": load(), "etcd_data_dir": etcd.dir,
           "etcd_data_fs": fs_type(etcd.dir)}
    out["path"] = "etcd only (pushes refused)" if args.etcd_only else "push and etcd"
    nodes, ranks = [], []
    tokdir = tempfile.mkdtemp(prefix="kvc-bench-tok-")
    try:
        def extra(name):
            x = ["--max-rooms", str(4 * args.rooms + 64)]
            if args.etcd_only:
                path = os.path.join(tokdir, name)
                fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
                os.write(fd, b"token-of-" + name.encode())
                os.close(fd)
                x += ["--auth-token-file", path]
            return x
        a = cl.Node(daemon, etcd.endpoints, "benchx", "A", ttl=10, extra=extra("A")).start()
        b = cl.Node(daemon, etcd.endpoints, "benchx", "B", ttl=10, extra=extra("B")).start()
        nodes += [a, b]
        prefill = [tsr.Ranks("prefill", a, r) for r in range(2)]
        decode = [tsr.Ranks("decode", b, r) for r in range(2)]
        ranks += prefill + decode
        out["passes"] = {}
        for name, busy, base in (("idle", 0, 10000), ("busy", args.busy, 20000)):
            rooms = list(range(base, base + args.rooms))
            for r in prefill + decode:
                r.open(*rooms)
            cl.wait_for(lambda: b.cluster_view()["counts"]["rooms_shared"] >= len(rooms), 60)
            stop = multiprocessing.Event()
            spinners = [multiprocessing.Process(target=spin, args=(stop,)) for _ in range(busy)]
            for s in spinners:
                s.start()
            try:
                l0 = load()
                seg, poll = one_pass(a, b, prefill, decode, rooms, kvcoord)
                put_watch = etcd_put_watch(etcd.endpoints.split(",")[0], len(rooms))
                l1 = load()
            finally:
                stop.set()
                for s in spinners:
                    s.join()
            counts_a, counts_b = a.cluster_view()["counts"], b.cluster_view()["counts"]
            out["passes"][name] = {
                "pushes_sent_by_A": counts_a.get("room_pushes_sent"),
                "pushes_taken_by_B": counts_b.get("room_pushes_taken"),
                "busy_processes": busy, "load_before": l0, "load_after": l1,
                "record_to_segment_on_B": stats(seg), "record_to_every_decode_poll": stats(poll),
                "etcd_put_to_watch": stats([x * 1e3 for x in put_watch])}
        out["sglang_anchors_s"] = {"heartbeat": "2 x 5 s = 10 s (a dead prefill)",
                                   "waiting_timeout": 300,
                                   "a recorded prefill failure": "never reaches the decode"}
        out["load_end"] = load()
    finally:
        for r in ranks:
            r.close()
        for n in nodes:
            n.stop()
            n.unlink()
        etcd.close()
        shutil.rmtree(tokdir, ignore_errors=True)
    if args.json:
        print(json.dumps(out, indent=1))
        return 0
    print("path: %s; etcd's data: %s (%s)" % (out["path"], out["etcd_data_dir"],
                                               out["etcd_data_fs"]))
    for name, ps in out["passes"].items():
        s, q, e = (ps["record_to_segment_on_B"], ps["record_to_every_decode_poll"],
                   ps["etcd_put_to_watch"])
        print("%s (%d busy, load %s -> %s), %d rooms:" % (name, ps["busy_processes"],
                                                          ps["load_before"], ps["load_after"],
                                                          s["n"]))
        print("  record_failure on A -> record in B's segment: median %.1f ms, p99 %.1f ms, "
              "p100 %.1f ms" % (s["median_ms"], s["p99_ms"], s["p100_ms"]))
        print("  record_failure on A -> every decode rank's poll Failed (5 ms poll): median "
              "%.1f ms, p99 %.1f ms, p100 %.1f ms" % (q["median_ms"], q["p99_ms"], q["p100_ms"]))
        print("  etcd's own put -> watch (same run, as many puts): median %.1f ms, p99 %.1f ms, "
              "p100 %.1f ms; poll/put-watch median ratio %.1fx"
              % (e["median_ms"], e["p99_ms"], e["p100_ms"], q["median_ms"] / e["median_ms"]))
        print("  A's pushes answered 200 so far: %s; rooms B took from a push (before etcd's "
              "event): %s" % (ps["pushes_sent_by_A"], ps["pushes_taken_by_B"]))
    print("sglang's own anchors: a dead prefill seen after the heartbeat's 2 x 5 s = 10 s, a "
          "silent one after the 300 s waiting timeout; a recorded failure's reason never")
    print("reaches the decode.  Load at start %s, at end %s." % (out["load_start"],
                                                                 out["load_end"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
