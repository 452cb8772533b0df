#!/usr/bin/python3
"""sglang_tp_group.py - 8 Python processes acting as one sglang TP group on a
node's kvcoord segment, through `import kvcoord` (no HTTP between them).

Each rank:
  1. attaches as a worker and registers its Llama-3.1-8B TP=8 transfer-engine
     info (tools/gen_model_info.py's rank-N.json; skipped when that exact info
     is already registered, e.g. by `tools/kvcoord.sh run`'s workers) and its
     parallelism config;
  2. reads every other rank's info from the segment;
  3. follows bootstrap rooms through Bootstrapping -> WaitingForInput ->
     Transferring -> Success with sglang's bookkeeping rules
     (kvcoord.sglang.KVStatusBook) and agrees on every step's polls with the
     segment's all-reduce (poll_and_all_reduce: the MIN over the 8 ranks, as
     sglang's gloo all-reduce, in shared memory);
  4. in the last room, rank 5 (--fail-rank) fails its transfer with a real-looking
     reason; every rank then raises KVTransferError with that reason, and
     is_from_another_rank set on the other seven.
The parent prints one table and checks it (exit 0 when everything matches).

Usage (segment kvcoord-<port>, created by kvcoordd --listen 127.0.0.1:<port> or
`tools/kvcoord.sh run`):
  PYTHONPATH=build/python examples/sglang_tp_group.py [--port 6789 | --segment NAME]
      [--model-dir build/run/llama-3.1-8b] [--rooms 4] [--fail-rank 5]
`tools/kvcoord.sh run --python` runs it against the Quick start's kvcoordd.
"""

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time

import kvcoord
from kvcoord.sglang import KVStatusBook, poll_and_all_reduce

TP = 8
P = kvcoord.KVPoll
REASON = "ibv_post_send: transport retry counter exceeded"
CODE = 12  # IBV_WC_RETRY_EXC_ERR
STEPS = [P.Bootstrapping, P.WaitingForInput, P.Transferring, P.Success]
WAIT = 60.0  # seconds; a hang guard


def parallelism_config(rank):
    return {"tp_size": TP, "tp_rank": rank, "pp_size": 1, "pp_rank": 0, "ep_size": 1,
            "ep_rank": 0, "moe_tp_size": TP, "moe_tp_rank": rank, "attn_tp_size": TP,
            "attn_tp_rank": rank, "attn_dp_size": 1, "attn_dp_rank": 0, "world_size": TP,
            "global_rank": rank, "local_rank": rank}


class Poller:
    """Stands in for sglang's KVSender/KVReceiver: poll() is this rank's state."""

    def __init__(self, room):
        self.bootstrap_room = room
        self.state = P.Bootstrapping

    def poll(self):
        return self.state


def register(seg, rank, info):
    """Register rank's info unless exactly that is already there; returns a note."""
    sid, wid = info["session_id"], info["weights_info_dict"]
    try:
        cur = seg.lookup(rank)
        if cur.session_id == sid and cur.weights_info_dict == wid:
            return "existing (pid %d)" % cur.pid
    except KeyError:
        pass
    seg.register(rank, sid, wid)
    return "registered"


def rank_main(rank, a, infos, rooms):
    out = {"rank": rank, "pid": os.getpid(), "rooms": []}
    with kvcoord.Segment(a.segment, rank=rank) as seg:
        t0 = time.perf_counter()
        out["registration"] = register(seg, rank, infos[rank])
        seg.parallelism_register(rank, parallelism_config(rank))
        peers = [seg.wait(r, timeout=WAIT) for r in range(TP)]
        out["peers"] = sum(1 for p, i in zip(peers, infos) if p.session_id == i["session_id"])
        out["lookup_us"] = (time.perf_counter() - t0) * 1e6
        book = KVStatusBook(seg, rank, participants=TP, group=a.group, timeout=WAIT)
        pollers = [Poller(r) for r in rooms]
        failing = rooms[-1]
        for step in STEPS:
            for p in pollers:
                if p.bootstrap_room == failing and step == P.Transferring and rank == a.fail_rank:
                    book.record_failure(failing, REASON, CODE)  # the RDMA WRITE failed
                    p.state = P.Failed
                elif p.state != P.Failed:
                    p.state = step
                book.update_status(p.bootstrap_room, p.state)
            # every rank gets the same answer for the same step, as with gloo
            agreed = poll_and_all_reduce(pollers, book)
        for p, state in zip(pollers, agreed):
            entry = {"room": p.bootstrap_room, "state": P(state).name}
            if state == P.Failed:  # what sglang's scheduler does with an agreed Failed
                try:
                    book.failure_exception(p.bootstrap_room)  # clears the room
                except kvcoord.KVTransferError as e:
                    entry.update(error=str(e), reason=e.failure_reason,
                                 other=e.is_from_another_rank, origin=e.origin_rank, code=e.code)
            else:
                book.clear(p.bootstrap_room)
            out["rooms"].append(entry)
    return out


def load_infos(model_dir):
    if model_dir is None:
        tmp = tempfile.mkdtemp(prefix="kvcoord-example-")
        gen = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools",
                           "gen_model_info.py")
        subprocess.run([sys.executable, gen, "--model", "llama-3.1-8b", "--tp", str(TP),
                        "--out", tmp], check=True, stdout=subprocess.DEVNULL)
        model_dir = tmp
    infos = []
    for r in range(TP):
        with open(os.path.join(model_dir, "rank-%d.json" % r), encoding="utf-8") as f:
            infos.append(json.load(f)["transfer_engine_info"])
    return infos


def run_children(a, infos, rooms):
    kids = []
    for rank in range(TP):
        rd, wr = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child opens its own Segment (the fork rule)
            os.close(rd)
            try:
                data, code = json.dumps(rank_main(rank, a, infos, rooms)), 0
            except BaseException as e:  # reported by the parent
                data, code = json.dumps({"rank": rank, "error": repr(e)}), 1
            os.write(wr, data.encode())
            os._exit(code)
        os.close(wr)
        kids.append((pid, rd))
    results = []
    for pid, rd in kids:
        chunks = []
        while True:
            c = os.read(rd, 65536)
            if not c:
                break
            chunks.append(c)
        os.close(rd)
        os.waitpid(pid, 0)
        results.append(json.loads(b"".join(chunks) or b'{"error": "no report"}'))
    return results


def report(a, results, rooms):
    failing, ok = rooms[-1], True
    # RANKS_SEEN: ranks whose info this rank read back as registered;
    # ROOMS_SUCCESS: the other rooms it saw end in Success; the last room's
    # KVTransferError: its is_from_another_rank, then its message.
    print("%-4s %-7s %-20s %-10s %-13s %-20s %s" % (
        "RANK", "PID", "REGISTRATION", "RANKS_SEEN", "ROOMS_SUCCESS", "IS_FROM_ANOTHER_RANK",
        "KVTransferError"))
    for res in results:
        if "error" in res:
            print("%-4s %s" % (res.get("rank"), res["error"]))
            ok = False
            continue
        good = [e for e in res["rooms"] if e["room"] != failing and e["state"] == "Success"]
        bad = [e for e in res["rooms"] if e["room"] == failing]
        err = bad[0] if bad else {}
        print("%-4d %-7d %-20s %-10s %-13s %-20s %s" % (
            res["rank"], res["pid"], res["registration"][:20], "%d/%d" % (res["peers"], TP),
            "%d/%d" % (len(good), len(rooms) - 1), err.get("other"), err.get("error")))
        ok &= res["peers"] == TP and len(good) == len(rooms) - 1
        ok &= err.get("reason") == REASON and err.get("origin") == a.fail_rank
        ok &= err.get("code") == CODE and err.get("other") == (res["rank"] != a.fail_rank)
    print("\nrooms %s; room %d failed on rank %d, every rank raised:\n  KVTransferError("
          "bootstrap_room=%d): %s" % (", ".join(str(r) for r in rooms[:-1]), failing,
                                       a.fail_rank, failing, REASON))
    print("result: %s" % ("OK: all %d ranks agree" % TP if ok else "MISMATCH (see the table)"))
    return ok


def main():
    # the docstring's first paragraph, whole (its first line alone stops mid-sentence)
    ap = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    ap.add_argument("--port", type=int, default=kvcoord.DEFAULT_PORT,
                    help="kvcoordd's HTTP port: segment kvcoord-PORT (default 6789)")
    ap.add_argument("--segment", help="segment name (overrides --port)")
    ap.add_argument("--model-dir", help="directory of rank-N.json (default: generate Llama-3.1-8B)")
    ap.add_argument("--rooms", type=int, default=4, help="bootstrap rooms (the last one fails)")
    ap.add_argument("--fail-rank", type=int, default=5, help="rank whose transfer fails")
    a = ap.parse_args()
    if a.rooms < 2 or not 0 <= a.fail_rank < TP:
        ap.error("--rooms must be >= 2 and --fail-rank in 0..7")
    a.segment = a.segment or kvcoord.name_for_port(a.port)
    try:
        kvcoord.Segment(a.segment, role="none").close()
    except kvcoord.SegmentNotFoundError as e:
        sys.exit("sglang_tp_group.py: %s (start kvcoordd, e.g. tools/kvcoord.sh run)" % e)
    infos = load_infos(a.model_dir)
    rng = random.Random()
    rooms = [rng.randrange(1 << 63) for _ in range(a.rooms)]  # sglang's 63-bit room ids
    a.group = rng.randrange(1 << 63)  # this run's collective group (a new one per run)
    results = run_children(a, infos, rooms)
    sys.exit(0 if report(a, results, rooms) else 1)


if __name__ == "__main__":
    main()
