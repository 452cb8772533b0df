"""One rank of the hierarchical collective's tests and benchmark, run inside
a host's network namespace: `ip netns exec NS python3 hier_rank.py JSON`.

It joins a gloo world (file:// rendezvous, GLOO_SOCKET_IFNAME=hv0), attaches
its host's segment, makes a kvcoord.HierGroup with kvcoord._hier.handshake,
then runs cfg["mode"]:
  "gloo"  cfg["steps"] steps; each: a vector of KVPoll-like values of a
          length every rank draws the same, this rank's values its own; the
          HierGroup's MIN, then gloo's all_reduce(MIN) of the same vector;
          counts the steps where they differ (and where either differs from
          the MIN computed from every rank's inputs).
  "loop"  hier steps only, cfg["until"] of them (None: until killed), expected MIN computed from every rank's inputs;
          prints "ok N" every 50 steps and one JSON line per failure.  A rank
          in cfg["odd"] = {"step": s, "tag": t, "extra": n} calls step s with
          tag t and n more bytes.
Lines on stdout: "ready {json}" after the handshake, then per mode.
"""

import json
import os
import random
import sys
import time

cfg = json.loads(sys.argv[1])
os.environ["GLOO_SOCKET_IFNAME"] = cfg.get("ifname", "hv0")
sys.path.insert(0, cfg["pythonpath"])

import datetime  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import kvcoord  # noqa: E402
from kvcoord._hier import handshake  # noqa: E402

torch.set_num_threads(1)
RANK, SIZE, SEED = cfg["rank"], cfg["size"], cfg.get("seed", 1)
TIMEOUT = cfg.get("timeout", 10.0)


def say(*a):
    print(*a, flush=True)


def length(step):
    return random.Random(SEED * 7919 + step).choice((0, 1, 7, 64, 64, 64, 128, 200))


def polls(step, rank, n):
    rng = random.Random((SEED * 1000003 + step) * 1009 + rank)
    return bytes(rng.choice((0, 1, 2, 3, 3, 3, 4, 4, 4, 4)) for _ in range(n))


def expected(step, n):
    out = bytearray(b"\xff" * n)
    for r in range(SIZE):
        for i, v in enumerate(polls(step, r, n)):
            out[i] = min(out[i], v)
    return bytes(out)


def fail_json(step, e, t0):
    return json.dumps({"step": step, "text": str(e), "ranks": getattr(e, "ranks", None),
                       "node": getattr(e, "node", None), "dead": getattr(e, "dead", None),
                       "mismatch": getattr(e, "mismatch", None),
                       "code": getattr(e, "code_name", type(e).__name__),
                       "after_s": round(time.monotonic() - t0, 3)})


def main():
    dist.init_process_group("gloo", init_method="file://" + cfg["store"], rank=RANK,
                            world_size=SIZE, timeout=datetime.timedelta(seconds=300))
    seg = kvcoord.Segment(cfg["segment"], role="client")
    g, why = handshake(seg, None, timeout=60)
    if g is None:
        say("ready " + json.dumps({"group": None, "why": why}))
        return 2
    say("ready " + json.dumps({"node": g.node, "leader": g.leader, "nodes": g.nodes,
                               "pid": os.getpid()}))
    mode = cfg["mode"]
    if mode == "gloo":
        differ = wrong = 0
        for step in range(cfg["steps"]):
            n = length(step)
            mine = polls(step, RANK, n)
            got = g.allreduce_min(mine, timeout=TIMEOUT)
            t = torch.tensor(list(mine), dtype=torch.uint8)
            dist.all_reduce(t, op=dist.ReduceOp.MIN)
            ref = bytes(t.tolist())
            differ += got != ref
            if step % 10 == 0:  # the full check now and then (it costs SIZE draws)
                wrong += got != expected(step, n)
        say("done " + json.dumps({"steps": cfg["steps"], "differ": differ, "wrong": wrong}))
        return 0
    # "loop"
    odd = cfg.get("odd") or {}
    until = cfg.get("until")
    step = ok = 0
    while until is None or step < until:
        n = length(step)
        tag = 0
        mine = polls(step, RANK, n)
        if odd.get("step") == step:
            tag = odd.get("tag", 0)
            mine += b"\x00" * odd.get("extra", 0)
        t0 = time.monotonic()
        try:
            got = g.allreduce_min(mine, tag=tag, timeout=TIMEOUT)
            if got != expected(step, n):
                say("wrong " + json.dumps({"step": step}))
            ok += 1
            if ok % 50 == 0:
                say("ok %d %d" % (ok, step))
        except kvcoord.CollectiveError as e:
            say("fail " + fail_json(step, e, t0))
            if cfg.get("exit_on_fail"):
                return 1
        step += 1
        if cfg.get("pace"):
            time.sleep(cfg["pace"])
    say("stopped " + json.dumps({"ok": ok, "steps": step}))
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    os._exit(code)  # no torch teardown: its threads' exit is noise on stderr
