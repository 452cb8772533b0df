"""kvcoord: the node's shared-memory coordinator, from Python.

Co-located sglang TP workers attach to the node's kvcoord segment (the one
kvcoordd serves over HTTP) and read and write the rank table and the
bootstrap rooms directly, without HTTP:

    import kvcoord
    with kvcoord.Segment(port=6789, rank=3) as seg:          # role "worker"
        seg.register(3, "10.0.0.5:16003", weights_info_dict)
        info = seg.wait(0, timeout=5.0)                        # seconds
        info.session_id, info.weights_info_dict
        with seg.room(room_id) as room:                        # this rank's part
            room.set_state(kvcoord.KVPoll.Transferring)
            room.check()          # raises KVTransferError with the origin's reason

Units: timeouts are seconds (int or float; None waits without limit), times
are nanoseconds since the Unix epoch (``*_ns``), sizes are bytes.

Errors: KeyError (NotFoundError, WithdrawnError) for an unknown rank or
room, TimeoutError (WaitTimeoutError) for waits, ValueError
(InvalidArgumentError) or TypeError for bad arguments, with the library's
message, FileNotFoundError (SegmentNotFoundError) when no segment exists,
FullError when a table of the segment is full (process table, rooms, arena),
kvcoord.Error (``.code`` = the kvc_err code) for the rest.  All of them but
TypeError and plain ValueError derive from kvcoord.Error.  Segment.allreduce_min
(the node's shared-memory MIN all-reduce) raises CollectiveError when a rank of
the group died, left or did not arrive in time (.ranks, .dead).

Threads: a Segment may be used by several threads at once; every call that
can block runs with the GIL released.  Once close() starts, new calls raise
SegmentClosedError (a kvcoord.Error and a ValueError); close() waits only for
the calls already in progress (at most a lock timeout or one 0.2 s wait slice).

Fork: a Segment does not cross fork().  In the child, every call on an
inherited Segment raises ForkedSegmentError (the handle's process entry and
room participation are the parent's); open a new Segment in the child.
Closing (or dropping) the inherited one in the child only unmaps it and
leaves the parent's registrations and rooms alone.
"""

import enum as _enum
from typing import Any, Dict, Literal, Optional, cast

# The annotations below are the package's types for its pure-Python parts;
# the C extensions' are in their stubs, _kvcoord.pyi and _engine.pyi.

from . import _kvcoord
from ._kvcoord import (
    DEFAULT_PORT,
    DEFAULT_ROLE,
    FAILURE_RING,
    LAYOUT_VERSION,
    NAME_MAX,
    ORIGIN_RANK_NONE,
    RANK_ROLES,
    REASON_MAX,
    ROOM_MAX_PARTICIPANTS,
    SESSION_ID_MAX,
    VERSION,
    COLL_GROUPS,
    COLL_MAX_SIZE,
    CollectiveError,
    Error,
    FailureInfo,
    ForkedSegmentError,
    FullError,
    HierGroup,
    InvalidArgumentError,
    NotFoundError,
    ProcInfo,
    RankInfo,
    RoomInfo,
    SegmentClosedError,
    SegmentNotFoundError,
    WaitTimeoutError,
    WithdrawnError,
    name_check,
    name_for_port,
    strerror,
    unlink,
    wait_status_text,
)

__version__ = VERSION

__all__ = [
    "KVPoll", "KVTransferError", "Segment", "Room", "RankInfo", "RoomInfo", "FailureInfo",
    "ProcInfo", "transfer_error",
    "Error", "NotFoundError", "WithdrawnError", "InvalidArgumentError", "WaitTimeoutError",
    "SegmentNotFoundError", "SegmentClosedError", "ForkedSegmentError", "FullError",
    "CollectiveError", "HierGroup", "COLL_GROUPS", "COLL_MAX_SIZE", "name_for_port", "name_check", "unlink",
    "strerror", "wait_status_text", "UNKNOWN_REASON", "VERSION", "LAYOUT_VERSION",
    "DEFAULT_PORT", "DEFAULT_ROLE", "RANK_ROLES",
]


class KVPoll(_enum.IntEnum):
    """A KV transfer's state, with sglang's values (compares equal to its int)."""

    Failed = 0
    Bootstrapping = 1
    WaitingForInput = 2
    Transferring = 3
    Success = 4


_kvcoord._register_kvpoll(KVPoll)

#: The reason sglang gives when a rank has no record of another rank's failure.
UNKNOWN_REASON = "Failed due to an unknown reason from another rank"


class KVTransferError(Exception):
    """A KV transfer of a bootstrap room failed.

    Same constructor, attributes and string form as sglang's exception:
    ``KVTransferError(bootstrap_room, failure_reason, is_from_another_rank=False)``,
    ``str(e) == "KVTransferError(bootstrap_room=<room>): <reason>"``.  Raised
    by kvcoord with the origin rank's own reason on every rank of the room;
    ``is_from_another_rank`` is False only on the rank that recorded it.  When
    raised from a failure record, ``origin_rank``, ``code`` (errno or RDMA
    status) and ``time_ns`` are set too (else None).
    """

    # Segment.check_room and transfer_error() build it in C with these same
    # attributes and args (python/ext/_rooms.c, transfer_error_new): keep
    # the two in step.
    def __init__(self, bootstrap_room: int, failure_reason: str, is_from_another_rank: bool = False):
        super().__init__(failure_reason)
        self.bootstrap_room = bootstrap_room
        self.failure_reason = failure_reason
        self.is_from_another_rank = is_from_another_rank
        self.origin_rank: Optional[int] = None
        self.code: Optional[int] = None
        self.time_ns: Optional[int] = None

    def __str__(self) -> str:
        return f"KVTransferError(bootstrap_room={self.bootstrap_room}): {self.failure_reason}"


_kvcoord._register_transfer_error(KVTransferError)  # raised by Segment.check_room (C)


def transfer_error(failure: FailureInfo) -> KVTransferError:
    """The KVTransferError for a FailureInfo (not raised)."""
    if isinstance(failure, FailureInfo):
        return _kvcoord._transfer_error(failure)  # the same object, built in C
    e = KVTransferError(failure.room, failure.reason, bool(failure.is_from_another_rank))
    e.origin_rank = failure.origin_rank
    e.code = failure.code
    e.time_ns = failure.time_ns
    return e


class Segment(_kvcoord.Segment):
    """An attached kvcoord segment (context manager; see the module docstring).

    Segment(name=None, *, port=6789, role=None, rank=None, mode="attach", ...)

    name: the segment's name ([A-Za-z0-9._-], 1..200 bytes, not starting with
    '-'); None: "kvcoord-<port>", the segment kvcoordd --listen HOST:<port>
    serves.
    role: "worker" (the default when rank is given: the ranks it registers
    are withdrawn when the process exits or dies), "client" (the default
    otherwise) or "none" (not recorded).  rank: the rank this process serves.
    mode: "attach" (default: SegmentNotFoundError when there is none),
    "create" (reuse or create), "fresh" (remove and create; refused while
    its creator runs or other processes are attached, Error naming them) or
    "force_fresh" (fresh even with processes attached: each of their later
    calls on the discarded segment raises Error, code_name "segment
    discarded, unlinked or replaced", as any call does on a segment that was
    unlinked or replaced under the handle).  Capacities, used only when a segment is created:
    max_ranks, max_info_bytes, arena_bytes (bytes), max_procs, world_size,
    max_rooms, lock_timeout and room_ttl (seconds).

    Errors: SegmentNotFoundError, InvalidArgumentError (bad name or
    capacities), FullError (process table full), Error (another layout
    version, corrupt segment, system call failed), TypeError/ValueError.  Opening releases
    the GIL.
    """

    def __repr__(self) -> str:
        if self.closed:
            return "<kvcoord.Segment closed>"
        return f"<kvcoord.Segment {self.name!r} role={self.role} rank={self.rank}>"

    def parallelism_config(self, rank: int, role: Optional[str] = None) -> Dict[str, Any]:
        """rank's parallelism config under role, as a dict.  Errors as parallelism_lookup()."""
        return cast(Dict[str, Any], self.parallelism_lookup(rank, role).weights_info_dict)

    def room_state(self, room: int, rank: Optional[int] = None) -> KVPoll:
        """The room's KVPoll (minimum over participants).  Errors as room_get()."""
        return self.room_get(room, rank).state

    def room_failure(self, room: int, rank: Optional[int] = None) -> Optional[FailureInfo]:
        """The room's FailureInfo as `rank` sees it, or None.  Errors as room_get()."""
        return self.room_get(room, rank).failure

    def room(self, room: int, rank: Optional[int] = None, participants: int = 0,
             role: str = "unspecified") -> "Room":
        """A Room: this process's part in bootstrap room `room` as `rank` (default: the
        rank given at open).  Opened here; released by release() or on leaving a
        `with` block."""
        return Room(self, room, rank, participants, role)


class Room:
    """One rank's part in a bootstrap room (context manager: release on exit).

    Every method is a Segment call for this (room, rank); states are KVPoll.
    """

    def __init__(self, segment: Segment, room: int, rank: Optional[int] = None,
                 participants: int = 0, role: str = "unspecified") -> None:
        if rank is None:
            rank = segment.rank
        if rank is None:
            raise ValueError("Room needs a rank (none was given, nor to the Segment)")
        self.segment: Segment = segment  # None once released
        self.room = room
        self.rank: int = rank
        segment.room_open(room, rank, participants, role)

    def __repr__(self) -> str:
        return f"<kvcoord.Room {self.room} rank={self.rank}>"

    def __enter__(self) -> "Room":
        return self

    def __exit__(self, *exc: Any) -> Literal[False]:
        self.release()
        return False

    def set_state(self, state: int) -> None:
        """Set this rank's own KVPoll state."""
        self.segment.room_set_state(self.room, self.rank, state)

    def fail(self, reason: Optional[str], code: int = 0) -> bool:
        """Record a failure from this rank (first record wins; True if kept)."""
        return self.segment.room_fail(self.room, self.rank, reason, code)

    def state(self) -> KVPoll:
        """The room's KVPoll (minimum over participants)."""
        return self.segment.room_get(self.room, self.rank).state

    def info(self) -> RoomInfo:
        """The RoomInfo as this rank sees it."""
        return self.segment.room_get(self.room, self.rank)

    def failure(self) -> Optional[FailureInfo]:
        """The FailureInfo as this rank sees it, or None."""
        return self.segment.room_get(self.room, self.rank).failure

    def wait(self, known: int, timeout: Optional[float] = None, check: bool = False) -> RoomInfo:
        """Wait (seconds) until the room's state differs from `known`; RoomInfo.
        check=True: raise KVTransferError if it failed (Segment.room_wait)."""
        return self.segment.room_wait(self.room, known, self.rank, timeout, check=check)

    def check(self) -> KVPoll:
        """Raise KVTransferError if the room failed; else its KVPoll."""
        return self.segment.check_room(self.room, self.rank).state

    def release(self) -> None:
        """Release this rank's part (idempotent; a room already reclaimed is fine)."""
        seg = self.segment
        if seg is None:
            return
        self.segment = None  # type: ignore[assignment]
        if seg.closed or seg.forked:
            return
        try:
            seg.room_release(self.room, self.rank)
        except NotFoundError:
            pass
