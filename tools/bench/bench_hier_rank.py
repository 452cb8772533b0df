"""One rank of bench_hier.py, inside a host's network namespace (started by
tests/hier/hiertest.Ranks): `ip netns exec NS python3 bench_hier_rank.py JSON`.

cfg["path"]:
  "installed"  kvcoord.sglang.install() on the sglang-shaped fixture
               (tests/python/fake_sglang); what is timed is sglang's
               poll_and_all_reduce(pollers, gloo_group) as installed: the
               polls of 64 pollers, then the hierarchical MIN (the group
               spans the hosts).
  "hier"       kvcoord.HierGroup.allreduce_min of the polls alone (list of
               ints to list of ints).
against gloo's all_reduce(uint8 tensor, MIN) of the same polls (list to
tensor to list), in alternating blocks of 50 steps.  Prints "ready" after
setup and "done {json}" with every timed sample (µs) and the disagreements.
"""

import json
import os
import random
import sys
import time

cfg = json.loads(sys.argv[1])
os.environ["GLOO_SOCKET_IFNAME"] = cfg.get("ifname", "hv0")
sys.path.insert(0, cfg["pythonpath"])
ROOT = cfg["root"]

import datetime  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import kvcoord  # noqa: E402

torch.set_num_threads(1)
RANK, SIZE, SEED, ROOMS = cfg["rank"], cfg["size"], cfg.get("seed", 1), cfg.get("rooms", 64)
WARMUP, BLOCK = 20, 50


class Poller:
    def __init__(self, room):
        self.bootstrap_room = room
        self.state = 1

    def poll(self):
        return self.state


def polls_of(step, rank):
    rng = random.Random((SEED * 1000003 + step) * 1009 + rank)
    return [rng.choice((0, 1, 2, 3, 3, 3, 4, 4, 4, 4)) for _ in range(ROOMS)]


def main():
    dist.init_process_group("gloo", init_method="file://" + cfg["store"], rank=RANK,
                            world_size=SIZE, timeout=datetime.timedelta(seconds=300))
    steps = cfg["steps"]
    inputs = [polls_of(s, RANK) for s in range(steps + WARMUP)]
    wants = [[min(v) for v in zip(*(polls_of(s, r) for r in range(SIZE)))]
             for s in range(steps + WARMUP)]
    pollers = [Poller(r) for r in range(1, ROOMS + 1)]
    if cfg["path"] == "installed":
        sys.path.insert(0, os.path.join(ROOT, "tests", "python", "fake_sglang"))
        import kvcoord.sglang as ksg
        from sglang.srt.disaggregation import utils

        ksg.install(cfg["segment"], RANK, size=SIZE, timeout=60.0)
        group = dist.new_group(backend="gloo")

        def ours(polls):
            for p, v in zip(pollers, polls):
                p.state = v
            return utils.poll_and_all_reduce(pollers, group)

        ours(inputs[0])  # the handshake (not timed)
    else:
        from kvcoord._hier import handshake

        seg = kvcoord.Segment(cfg["segment"], role="client")
        g, why = handshake(seg, None, timeout=60)
        if g is None:
            raise SystemExit("no hierarchical group: " + why)

        def ours(polls):
            return list(g.allreduce_min(bytes(polls), timeout=60))

    print("ready", flush=True)
    kv, gl, disagree = [], [], 0
    for first in range(0, steps + WARMUP, BLOCK):
        block = range(first, min(first + BLOCK, steps + WARMUP))
        answers = {}
        for which in ((0, 1) if first // BLOCK % 2 == 0 else (1, 0)):
            for step in block:
                mine = inputs[step]
                t0 = time.perf_counter_ns()
                if which == 0:
                    got = ours(mine)
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
    print("done " + json.dumps({"kv": kv, "gloo": gl, "disagree": disagree}), flush=True)
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    os._exit(code)  # no torch teardown: its threads' exit is noise on stderr
