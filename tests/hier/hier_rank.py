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
  "installed"  kvcoord.sglang.install() on the sglang-shaped fixture, then
          sglang's poll_and_all_reduce as installed against its original
          (gloo) over cfg["steps"] steps; reports the path the group took
          and the log lines about it.
Lines on stdout: "ready {json}" after the handshake (not "installed"), then
per mode.
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


class Poller:
    def __init__(self, room):
        self.bootstrap_room = room
        self.state = 1

    def poll(self):
        return self.state


class Req:
    """A decode request as the staging variant sees it."""

    def __init__(self, poller):
        self.kv_receiver = poller
        poller.require_staging = False


class Staging:
    def is_done(self, dr):
        return True

    def advance_scatter(self, dr):
        pass


def installed():
    """kvcoord.sglang.install() on the fixture; sglang's poll_and_all_reduce
    as installed against its original (gloo) over cfg["steps"] steps."""
    import logging

    sys.path.insert(0, os.path.join(cfg["root"], "tests", "python", "fake_sglang"))
    import importlib

    import kvcoord.sglang as ksg
    from sglang.srt.disaggregation import utils

    try:  # the module (kvcoord.sglang.install is also the function's name)
        inst = importlib.import_module("kvcoord.sglang.install")
    except ImportError:
        inst = importlib.import_module("kvcoord._sgl_install")

    lines = []

    class Keep(logging.Handler):
        def emit(self, rec):
            lines.append(rec.getMessage())

    logging.getLogger("kvcoord.sglang").addHandler(Keep())
    logging.getLogger("kvcoord.sglang").setLevel(logging.INFO)
    ksg.install(cfg["segment"], RANK, size=SIZE, timeout=TIMEOUT)
    group = dist.new_group(backend="gloo")
    orig = utils.poll_and_all_reduce.__kvcoord_original__
    pollers = [Poller(r) for r in range(1, 65)]
    differ, mixed = 0, []
    for step in range(cfg["steps"]):
        n = 1 + random.Random(SEED * 31 + step).randrange(64)
        for p, v in zip(pollers, polls(step, RANK, n)):
            p.state = v
        if step == cfg.get("mixed_step"):  # this rank calls the staging variant
            try:
                if cfg.get("staging"):
                    utils.poll_and_all_reduce_with_staging([Req(p) for p in pollers[:n]],
                                                           Staging(), group)
                else:
                    utils.poll_and_all_reduce(pollers[:n], group)
                mixed.append("no error")
            except kvcoord.InvalidArgumentError as e:
                mixed.append(str(e))
            continue
        got = utils.poll_and_all_reduce(pollers[:n], group)
        want = orig(pollers[:n], group)
        differ += got != want or bytes(got) != expected(step, n)
    g = inst.active_bridge().groups[id(group)][1]
    say("done " + json.dumps({"steps": cfg["steps"], "differ": differ,
                              "path": type(g).__name__ if g is not None else None,
                              "log": [m for m in lines if "poll all-reduce" in m],
                              "mixed": mixed}))
    return 0


def main():
    dist.init_process_group("gloo", init_method="file://" + cfg["store"], rank=RANK,
                            world_size=SIZE, timeout=datetime.timedelta(seconds=300))
    if cfg["mode"] == "installed":
        return installed()
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
            time.sleep(odd.get("late", 0))  # arrives this late (alive, not calling)
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
