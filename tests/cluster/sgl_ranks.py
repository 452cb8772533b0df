#!/usr/bin/env python3
"""sgl_ranks.py - sglang-shaped TP ranks on one node, for the cross-node
room tests and benchmark (one process per rank, as sglang runs them).

  sgl_ranks.py prefill SEGMENT RANK SIZE
      opens rooms as a prefill participant; commands on stdin, one a line:
        open ROOM...            open the rooms; answers "opened"
        fail ROOM CODE REASON   sglang's record_failure + update_status(Failed):
                                the room's failure record, then Failed; answers
                                "failed ROOM T_NS" (T_NS: CLOCK_REALTIME before the call)
        exit
  sgl_ranks.py decode SEGMENT RANK SIZE
      opens rooms as a decode participant and polls them every 5 ms (sglang's
      poll_and_all_reduce interval in the issue's setup); commands:
        open ROOM...            open and follow the rooms; answers "opened"
        exit
      prints one JSON line per room the poll finds Failed: {"room", "t_ns",
      "failure": FailureInfo fields, "raised": what sglang's
      failure_exception() raises through kvcoord's bridge ("reason",
      "is_from_another_rank")}.

Every answer is one line on stdout, flushed."""

import json
import os
import select
import sys
import time

import kvcoord

try:
    from kvcoord.sglang.bridge import Bridge  # after the package's split
except ImportError:
    from kvcoord._sgl_bridge import Bridge

UNKNOWN = kvcoord.UNKNOWN_REASON


class KVTransferError(Exception):
    """sglang's KVTransferError shape (common/conn.py)."""

    def __init__(self, bootstrap_room, failure_reason, is_from_another_rank=False):
        super().__init__(failure_reason)
        self.bootstrap_room = bootstrap_room
        self.failure_reason = failure_reason
        self.is_from_another_rank = is_from_another_rank


def say(*parts):
    sys.stdout.write(" ".join(str(p) for p in parts) + "\n")
    sys.stdout.flush()


def main():
    mode, seg_name, rank, size = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    seg = kvcoord.Segment(seg_name)
    role = "prefill" if mode == "prefill" else "decode"
    bridge = Bridge(seg, rank, size, 30.0, False)
    followed, failed = set(), set()
    poll_s = 0.005
    while True:
        timeout = poll_s if (role == "decode" and followed - failed) else None
        r, _, _ = select.select([sys.stdin], [], [], timeout)
        if r:
            line = sys.stdin.readline()
            if not line:
                return 0
            cmd = line.split(None, 3)
            if cmd[0] == "exit":
                return 0
            if cmd[0] == "open":
                for room in map(int, line.split()[1:]):
                    seg.room_open(room, rank, size, role)
                    followed.add(room)
                say("opened")
            elif cmd[0] == "fail":
                room, code, reason = int(cmd[1]), int(cmd[2]), cmd[3].rstrip("\n")
                t = time.time_ns()
                seg.room_fail(room, rank, reason, code)  # record_failure (the bridge's publish)
                seg.room_set_state(room, rank, kvcoord.KVPoll.Failed)  # update_status(Failed)
                say("failed", room, t)
            continue
        # The decode's poll: each followed room's state, as poll_and_all_reduce's MIN.
        for room in sorted(followed - failed):
            try:
                st = seg.room_state(room, rank)
            except kvcoord.Error:
                continue
            if st != kvcoord.KVPoll.Failed:
                continue
            t = time.time_ns()
            failed.add(room)
            f = seg.room_failure(room, rank)
            exc = bridge.substitute(object(), room, False, f, KVTransferError(room, UNKNOWN))
            print(json.dumps({
                "room": room, "t_ns": t, "rank": rank, "pid": os.getpid(),
                "failure": None if f is None else {
                    "origin_rank": f.origin_rank, "origin_pid": f.origin_pid, "code": f.code,
                    "reason": f.reason, "origin_node": f.origin_node,
                    "from_another_node": f.from_another_node,
                    "is_from_another_rank": f.is_from_another_rank},
                "raised": None if exc is None else {
                    "reason": exc.failure_reason,
                    "is_from_another_rank": exc.is_from_another_rank}}), flush=True)


if __name__ == "__main__":
    sys.exit(main())
