"""KVStatusBook and poll_and_all_reduce(pollers, book): sglang's per-rank
bookkeeping without sglang, for programs that follow rooms themselves
(examples/sglang_tp_group.py).  Thin wrappers over what install() uses."""

import threading
import zlib
from typing import Any, Dict, List, Optional, Sequence

from .. import KVPoll, KVTransferError, UNKNOWN_REASON, FailureInfo, Segment
from .bridge import Bridge


class KVStatusBook:
    """One rank's request_status / failure_records, with sglang's KV manager
    semantics, shared with the node's other ranks through the segment.

    KVStatusBook(segment, rank, participants=0, *, group=None, timeout=30.0):
    participants is the TP group's size (0: the segment's world size), the
    same on every rank; group: the collective's group id, the same on every
    rank (default: derived from the segment's name and participants; a later
    set of processes on the same segment passes a new one, e.g. a random id
    its parent picks: a group remembers the members that left, and a new
    process's first call fails naming them until all have come back);
    timeout: seconds poll_and_all_reduce waits for the group.

    - update_status(room, status): sglang's rule: Failed on a room not
      followed (or cleared) is a no-op; the first status is taken as is;
      later ones raise it (max), except Failed, which replaces it (a later
      higher status raises it again).  The rank joins the room on its first
      status and writes its state there.
    - check_status(room) -> KVPoll: this rank's own status; KeyError when it
      does not follow the room.  `room in book`: it follows it.
    - record_failure(room, failure_reason, code=0): this rank's record
      (a later one overwrites it); the node's first record is what the other
      ranks raise.
    - clear(room): forget the room (pop) and release this rank's part: a
      room id reused after clear() is a fresh room once every rank cleared it.
    - failure_exception(room): clears the room and raises KVTransferError:
      this rank's own record (popped; is_from_another_rank False), else the
      node's record (the origin rank's reason; what kvcoord saw when it
      failed the room itself: a dead participant, the room TTL) with
      is_from_another_rank True, else "Failed due to an unknown reason from
      another rank".

    Thread safety: the methods may be called from this rank's threads.
    """

    def __init__(self, segment: Segment, rank: int, participants: int = 0, *,
                 group: Optional[int] = None, timeout: float = 30.0) -> None:
        participants = participants or segment.stat()["world_size"]
        if not 0 <= rank < participants:
            raise ValueError("rank %d out of range 0..%d" % (rank, participants - 1))
        self.segment = segment
        self.rank = rank
        self.participants = participants
        if group is None:
            group = zlib.crc32(repr(("KVStatusBook", segment.name, participants)).encode())
            group &= 0x7FFFFFFF
        self.group = group
        self.request_status: Dict[int, KVPoll] = {}
        self.failure_records: Dict[int, str] = {}
        self.failure_lock = threading.Lock()
        self._codes: Dict[int, int] = {}
        self._bridge = Bridge(segment, rank, participants, float(timeout), owned=False)

    def update_status(self, bootstrap_room: int, status: int) -> None:
        """sglang's rule: a room not followed (or cleared) ignores Failed; Failed
        sticks; otherwise the state only moves up.  The room is then followed in
        the segment (this rank's part of it).  Thread-safe (failure_lock)."""
        with self.failure_lock:
            old = self.request_status.get(bootstrap_room)
            if old is None:
                if status == KVPoll.Failed:
                    return
                new = KVPoll(status)
            elif status == KVPoll.Failed:
                new = KVPoll.Failed
            else:
                new = KVPoll(max(old, status))
            self.request_status[bootstrap_room] = new
        self._bridge.follow(self, bootstrap_room, new)

    def check_status(self, bootstrap_room: int) -> KVPoll:
        """This rank's KVPoll for the room; KeyError for a room not followed."""
        return self.request_status[bootstrap_room]

    def __contains__(self, bootstrap_room: object) -> bool:
        return bootstrap_room in self.request_status

    def record_failure(self, bootstrap_room: int, failure_reason: str, code: int = 0) -> None:
        """Keep the reason locally (the last one wins, as sglang's) and record
        it in the segment's room (the first record there wins), so every rank
        reads it.  code: an errno or status, 0 when none.  Thread-safe."""
        with self.failure_lock:
            self.failure_records[bootstrap_room] = failure_reason
            self._codes[bootstrap_room] = code
        if self._bridge.follows_room(self, bootstrap_room):
            self.segment.room_fail(bootstrap_room, self.rank, failure_reason, code)

    def clear(self, bootstrap_room: int) -> None:
        """Forget the room here and release this rank's part of the segment's
        room.  Clearing a room not followed does nothing."""
        with self.failure_lock:
            self.request_status.pop(bootstrap_room, None)
        self._bridge.leave(self, bootstrap_room)

    def failure(self, bootstrap_room: int) -> Optional[FailureInfo]:
        """The node's FailureInfo for the room as this rank sees it, or None."""
        return self._bridge.node_failure(bootstrap_room)

    def failure_exception(self, bootstrap_room: int) -> None:
        """Pop the room (as sglang's) and raise its KVTransferError: this rank's
        own reason with is_from_another_rank False, or the origin rank's reason
        from the segment with is_from_another_rank True (UNKNOWN_REASON only when
        no rank recorded one).  Always raises."""
        node = self._bridge.node_failure(bootstrap_room)
        with self.failure_lock:
            reason = self.failure_records.pop(bootstrap_room, None)
            code = self._codes.pop(bootstrap_room, None)
        self.clear(bootstrap_room)
        if reason is not None:
            e = KVTransferError(bootstrap_room, reason, is_from_another_rank=False)
            e.origin_rank, e.code = self.rank, code
            if node is not None and node.origin_rank == self.rank:
                e.time_ns = node.time_ns
            raise e
        e = self._bridge.substitute(self, bootstrap_room, False, node,
                                    KVTransferError(bootstrap_room, UNKNOWN_REASON, True))
        raise e or KVTransferError(bootstrap_room, UNKNOWN_REASON, is_from_another_rank=True)


def poll_and_all_reduce(pollers: Sequence[Any], book: KVStatusBook) -> List[int]:
    """sglang's poll_and_all_reduce for a KVStatusBook's group: each poller's
    poll() (an int KVPoll) for its bootstrap_room, then the element-wise MIN
    over the book's `participants` ranks, a real all-reduce in the segment:
    every rank gets the same list for the same call (waiting up to the
    book's timeout for the others; kvcoord.CollectiveError names a rank that
    died or did not come).  A room kvcoord failed itself polls Failed.
    Returns a list of ints, as sglang's."""
    polls = [int(p.poll()) for p in pollers]
    b = book._bridge
    return book.segment.poll_allreduce(book.group, book.participants, book.rank, polls, pollers,
                                       b.counts, b.timeout)
