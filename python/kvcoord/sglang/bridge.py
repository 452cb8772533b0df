"""The per-process state behind kvcoord.sglang.install(): this TP rank's
segment, the rooms its KV managers follow, and the node-wide failure
records it publishes and reads.

Nothing here changes what sglang's own bookkeeping answers: sglang's dicts
stay the truth for this rank.  The bridge only mirrors them into the
segment's rooms (join on the first status, this rank's state on each
update, its reasons on record_failure, release on clear) and reads back
what other ranks, or kvcoord itself, recorded.

Thread safety: every method may be called from any of sglang's threads
(its transfer and decode threads update statuses concurrently); one lock
guards the follow tables, never held across a segment call that waits.
Segment errors at run time are logged once per kind and never reach sglang.
"""

import errno
import logging
import os
import re
import threading

from .. import FAILURE_RING, ORIGIN_RANK_NONE, UNKNOWN_REASON, Error, NotFoundError, _kvcoord

# This module's logger (kvcoord.sglang.bridge), as each module of the package
# has its own: docs/python.md, "Logging".
log = logging.getLogger(__name__)


def _boot_id():
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            return f.read().strip()
    except OSError:
        return ""


def _clean_reason(reason):
    """A reason the segment accepts: str, no NUL (kept to REASON_MAX bytes by the library)."""
    text = reason if isinstance(reason, str) else str(reason)
    return text.replace("\0", " ") or "no reason given"


class Bridge:
    """This process's part: Bridge(segment, rank, size, timeout, owned).

    segment: an attached kvcoord.Segment or None (no segment: everything
    falls back to sglang's own code); rank: this process's rank in its TP
    group (the room participant it writes); size: the room's participant
    count (the TP size); timeout: seconds a collective waits for the group;
    owned: close the segment on close()."""

    def __init__(self, segment, rank, size, timeout, owned):
        self.segment = segment
        self.rank = rank
        self.size = size
        self.timeout = timeout
        self.owned = owned
        self.pid = os.getpid()
        self.lock = threading.Lock()
        self.follows = {}  # (id(manager), room) -> True: the manager follows the room
        self.counts = {}  # room -> managers of this process following it
        self.followed = _kvcoord.RoomSet()  # counts' rooms, in C: the poll's lookups
        self.kv_failures = {}  # room -> FailureInfo kvcoord itself recorded (seen in a poll)
        self.raised = set()  # (id(manager), room) whose node-wide reason was raised (popped)
        self.groups = {}  # id(process group) -> (group, Group or None)
        self.seen_members = {}  # members tuple -> groups handshaken with those members
        self.dead = {}  # room rank -> why, for members of a poll group seen dead
        self._warned = set()
        self.node_key = None
        self.ttl_s = None
        if segment is not None:
            st = segment.stat()
            self.node_key = (_boot_id(), segment.name, st["created_ns"], st["creator_pid"])
            self.ttl_s = st["room_ttl_ms"] / 1000.0

    # ---- logging ---------------------------------------------------------

    def warn_once(self, key, msg, *args, logger=None):
        """Log msg at WARNING on `logger` (the calling module's; default this
        module's) the first time key is seen (the fallbacks, runtime errors)."""
        with self.lock:
            if key in self._warned:
                return
            self._warned.add(key)
        (logger or log).warning(msg, *args)

    def _failed_call(self, what, e):
        self.warn_once(("segment", what, type(e).__name__),
                       "kvcoord.sglang: %s failed (%s); sglang's own bookkeeping goes on "
                       "(logged once)", what, e)

    # ---- following rooms -------------------------------------------------

    def follow(self, manager, room, status):
        """manager's request_status has `room` at `status`: join the room (first
        time) and write this rank's state there (not Failed: the failure is
        what record_failure publishes)."""
        seg = self.segment
        if seg is None:
            return
        key = (id(manager), room)
        with self.lock:
            first = key not in self.follows
            if first:
                self.follows[key] = True
                self.raised.discard(key)
                n = self.counts.get(room, 0)
                self.counts[room] = n + 1
                opening = n == 0
                if opening:
                    self.followed.add(room)
            else:
                opening = False
        try:
            if opening:
                self.kv_failures.pop(room, None)
                seg.room_open(room, self.rank, self.size)
                if self.dead:  # a member of the group died: it will never join
                    self._fail_unjoined(room)
            if int(status) != 0:  # Failed is not written: the library would record
                seg.room_set_state(room, self.rank, int(status))  # "rank N reported Failed"
            # as the room's first record, ahead of the reason sglang records (publish())
        except NotFoundError:
            pass  # reclaimed by the room TTL meanwhile: sglang's dict still decides
        except (Error, ValueError) as e:
            self._failed_call("following room %d" % room, e)

    # ---- rooms after a rank dies ------------------------------------------

    def members_died(self, group, exc):
        """The poll collective of `group` (a poll.Group) reported ranks
        dead (CollectiveError exc): every followed room those ranks had not
        joined fails at once, and so does every room followed from now on
        (the rooms they had joined are failed by the library's liveness check
        when read).  The group's handshake told each member's room rank."""
        new = {}
        for r in exc.ranks:
            if r < len(group.room_ranks):
                rr = group.room_ranks[r]
                new[rr] = (group.pids[r], str(exc))
        with self.lock:
            fresh = {k: v for k, v in new.items() if k not in self.dead}
            self.dead.update(fresh)
            rooms = list(self.counts) if fresh else []
        for room in rooms:
            self._fail_unjoined(room)

    def _fail_unjoined(self, room):
        """Fail room for the first dead member that has not joined it."""
        seg = self.segment
        try:
            info = seg.room_get(room, self.rank)
        except NotFoundError:
            return
        except Error as e:
            self._failed_call("reading room %d" % room, e)
            return
        if info.failure is not None:
            return
        for rr, (pid, what) in sorted(self.dead.items()):
            if rr < len(info.local) and info.local[rr] is None and rr != self.rank:
                why = "kvcoord: rank %d (pid %d) of this room's TP group died before it " \
                      "joined room %d (%s)" % (rr, pid, room, what)
                try:
                    seg.room_fail(room, rr, _clean_reason(why)[:255], 0)
                except NotFoundError:
                    pass
                except (Error, ValueError) as e:
                    self._failed_call("failing room %d" % room, e)
                return

    def leave(self, manager, room):
        """manager no longer follows room (sglang cleared it): release this
        rank's part once no manager of this process follows it."""
        key = (id(manager), room)
        with self.lock:
            if self.follows.pop(key, None) is None:
                return
            n = self.counts.get(room, 1) - 1
            if n > 0:
                self.counts[room] = n
                return
            self.counts.pop(room, None)
            self.followed.discard(room)
        self.kv_failures.pop(room, None)
        try:
            self.segment.room_release(room, self.rank)
        except NotFoundError:
            pass
        except Error as e:
            self._failed_call("releasing room %d" % room, e)

    def follows_room(self, manager, room):
        with self.lock:
            return (id(manager), room) in self.follows

    def publish(self, manager, room, reason):
        """sglang recorded `reason` for room on this rank: the node's record (the
        first record of a room is the one other ranks read)."""
        if self.segment is None or not self.follows_room(manager, room):
            return
        try:
            self.segment.room_fail(room, self.rank, _clean_reason(reason), 0)
        except NotFoundError:
            pass
        except (Error, ValueError) as e:
            self._failed_call("recording the failure of room %d" % room, e)

    def release_all(self):
        with self.lock:
            rooms = list(self.counts)
            self.follows.clear()
            self.counts.clear()
            self.followed.clear()
        for room in rooms:
            try:
                self.segment.room_release(room, self.rank)
            except Error:
                pass

    # ---- reading what others recorded ------------------------------------

    def node_failure(self, room):
        """The room's failure record as this rank sees it (FailureInfo), or None:
        what another rank recorded, or kvcoord itself (a dead participant, the
        room TTL; also found once the room was reclaimed)."""
        if self.segment is None:
            return None
        f = self.kv_failures.get(room)
        if f is not None:
            return f
        try:
            return self.segment.room_get(room, self.rank).failure
        except NotFoundError:
            pass
        except Error as e:
            self._failed_call("reading room %d" % room, e)
            return None
        return self._recent_failure(room)  # reclaimed (TTL, or all released)

    def _recent_failure(self, room):
        """The room's record in the segment's ring of recent failures, or None."""
        try:
            for f in self.segment.failures(FAILURE_RING):
                if f.room == room:
                    return f
        except Error as e:
            self._failed_call("reading the recent failures", e)
        return None

    def kvcoord_failure(self, room):
        """The room's failure record if kvcoord itself made it (no rank process
        recorded it: a participant died, the room TTL passed), else None."""
        f = self.kv_failures.get(room)
        if f is not None:
            return f
        try:
            f = self.segment.room_get(room, self.rank).failure
        except NotFoundError:  # followed, yet gone: reclaimed by the TTL sweep
            f = self._recent_failure(room)
        except Error as e:
            self._failed_call("reading room %d" % room, e)
            return None
        if f is None or f.origin_pid != 0:
            return None
        self.kv_failures[room] = f
        return f

    def reason_of(self, f):
        """The reason a rank raises for failure record f: the origin rank's own
        words, or what kvcoord saw (which rank died and how; the timeout)."""
        if f.origin_pid != 0:
            return f.reason
        if f.origin_rank == ORIGIN_RANK_NONE and f.code == errno.ETIMEDOUT:
            m = re.search(r"no update for (\d+) ms", f.reason)  # the TTL of the node that
            ttl = int(m.group(1)) / 1000.0 if m else self.ttl_s  # failed it (mirrored too)
            return "kvcoord failed room %d: timed out after %g s with no update (room TTL)" % (
                f.room, ttl)
        return "kvcoord failed room %d: %s" % (f.room, f.reason)

    def substitute(self, manager, room, had_local, f, exc):
        """The exception failure_exception() raises instead of sglang's `exc`
        ("unknown reason from another rank"), or None to keep exc: when this
        rank had no record of its own and the node has one (not this rank's
        own, already popped), sglang's exception class with that reason and
        is_from_another_rank=True.  Pop-style: once per follow of the room."""
        if had_local or f is None or getattr(exc, "failure_reason", None) != UNKNOWN_REASON:
            return None
        if (f.origin_pid == self.pid and f.origin_rank == self.rank
                and not getattr(f, "from_another_node", False)):
            return None  # this rank's own record, popped by sglang already
        key = (id(manager), room)
        with self.lock:
            if key in self.raised:
                return None
            self.raised.add(key)
        reason = self.reason_of(f)
        cls = type(exc)
        try:
            new = cls(room, reason, is_from_another_rank=True)
        except TypeError:
            new = cls(room, reason)
            new.is_from_another_rank = True
        new.origin_rank = None if f.origin_rank == ORIGIN_RANK_NONE else f.origin_rank
        new.code = f.code
        new.time_ns = f.time_ns
        return new

    def close(self):
        if self.segment is not None:
            self.release_all()
            if self.owned:
                self.segment.close()

