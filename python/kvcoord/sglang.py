"""kvcoord.sglang: drop-ins for the pieces of sglang a TP group's ranks use to
find each other and agree on KV transfers, backed by the node's kvcoord
segment, so that adopting kvcoord is an import change.

- EngineInfoBootstrapServer(host, port): sglang's constructor, close() and
  in-process get_transfer_engine_info(rank) / get_parallelism_config_info(rank),
  served over HTTP by a kvcoordd it starts (or adopts, when one already serves
  that port) and read in-process straight from the segment.
- KVStatusBook(segment, rank): the per-rank request_status / failure_records
  bookkeeping of sglang's KV managers (update_status, check_status, `in`,
  clear, record_failure, pop-style failure_exception) with the same
  semantics, shared by every rank of the node through the segment's rooms:
  the reason rank 5 records is what rank 0 raises.
- poll_and_all_reduce(pollers, book): the node-local replacement of sglang's
  gloo all-reduce (MIN) of every polled room's KVPoll, without a collective.

Units: seconds for timeouts.  Thread safety: EngineInfoBootstrapServer is safe
from several threads; a KVStatusBook belongs to one rank and takes a lock
around its local dict, so its methods may be called from that rank's threads.
"""

import os
import shutil
import signal
import subprocess
import threading
import time
import urllib.request

from . import (
    UNKNOWN_REASON,
    KVPoll,
    KVTransferError,
    NotFoundError,
    Segment,
    SegmentNotFoundError,
    name_for_port,
    transfer_error,
)
from . import unlink as unlink_segment

__all__ = ["EngineInfoBootstrapServer", "KVStatusBook", "poll_and_all_reduce", "KVPoll",
           "KVTransferError"]


def _find_kvcoordd():
    """kvcoordd: $KVCOORD_DAEMON, the build tree this package sits in, or $PATH."""
    path = os.environ.get("KVCOORD_DAEMON")
    if path:
        return path
    here = os.path.dirname(os.path.abspath(__file__))  # build/python/kvcoord
    candidate = os.path.join(here, "..", "..", "kvcoordd")
    if os.access(candidate, os.X_OK):
        return os.path.normpath(candidate)
    found = shutil.which("kvcoordd")
    if not found:
        raise FileNotFoundError("kvcoordd not found: set KVCOORD_DAEMON, or install kvcoord "
                                "(cmake --install) so that kvcoordd is on $PATH")
    return found


def _health(host, port, timeout):
    """True when an HTTP server on host:port answers GET /health with OK."""
    h = "[%s]" % host if ":" in host else host
    try:
        with urllib.request.urlopen("http://%s:%d/health" % (h, port), timeout=timeout) as r:
            return r.status == 200 and r.read() == b"OK"
    except OSError:
        return False


class _InfoView:
    """Read-only mapping rank -> (session_id, weights_info_dict), read from the segment
    (the shape of sglang's server's transfer_engine_info dict)."""

    def __init__(self, server):
        self._server = server

    def get(self, rank, default=None):
        info = self._server.get_transfer_engine_info(rank)
        return default if info is None else info

    def __getitem__(self, rank):
        info = self._server.get_transfer_engine_info(rank)
        if info is None:
            raise KeyError(rank)
        return info

    def __contains__(self, rank):
        return self._server.get_transfer_engine_info(rank) is not None

    def keys(self):
        return [r.rank for r in self._server.segment.ranks()]

    def __iter__(self):
        return iter(self.keys())

    def __len__(self):
        return len(self.keys())


class EngineInfoBootstrapServer:
    """sglang's engine-info bootstrap server, served by kvcoordd.

    EngineInfoBootstrapServer(host, port): when a kvcoordd already serves
    host:port (GET /health answers and its segment kvcoord-<port> exists) it is
    adopted; otherwise one is started (`kvcoordd --listen host:port --segment
    kvcoord-<port>`, found as _find_kvcoordd() says) and waited for, up to
    `start_timeout` seconds.  Workers register over HTTP exactly as with
    sglang's server, or through the segment directly.  close() stops a
    kvcoordd this object started (SIGTERM; the segment and its registrations
    stay for the next start) and detaches; an adopted one keeps running.

    Errors: FileNotFoundError (no kvcoordd binary), OSError (the port answers
    but is not kvcoordd, or kvcoordd exited: the message has its log),
    TimeoutError (it did not come up in time).
    """

    def __init__(self, host: str, port: int, *, kvcoordd=None, daemon_args=(),
                 start_timeout=30.0, log_path=None):
        self.host = host
        self.port = port
        self.segment_name = name_for_port(port)
        self._proc = None
        self._log = None
        self.lock = threading.Lock()
        if not self._adopt():
            self._start(kvcoordd or _find_kvcoordd(), list(daemon_args), start_timeout, log_path)
        self.transfer_engine_info = _InfoView(self)

    def _adopt(self):
        if not _health(self.host, self.port, 2.0):
            return False
        try:
            self.segment = Segment(self.segment_name, role="client")
        except SegmentNotFoundError:
            raise OSError("%s:%d answers HTTP but no segment %s exists: it is not a kvcoordd "
                          "serving that port" % (self.host, self.port, self.segment_name))
        self.adopted = True
        return True

    def _start(self, path, extra, timeout, log_path):
        self._log = open(log_path or os.devnull, "ab")
        cmd = [path, "--listen", "%s:%d" % (self.host, self.port), "--segment",
               self.segment_name, *extra]
        self._proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=self._log,
                                      stderr=subprocess.STDOUT)
        end = time.monotonic() + timeout
        while True:
            if self._proc.poll() is not None:
                self._log.close()
                raise OSError("kvcoordd exited with status %d before serving %s:%d (%s)"
                              % (self._proc.returncode, self.host, self.port,
                                 log_path or "pass log_path= to keep its log"))
            if _health(self.host, self.port, 0.5):
                try:
                    self.segment = Segment(self.segment_name, role="client")
                    break
                except SegmentNotFoundError:
                    pass
            if time.monotonic() > end:
                self.close()
                raise TimeoutError("kvcoordd did not serve %s:%d within %g s"
                                   % (self.host, self.port, timeout))
            time.sleep(0.02)
        self.adopted = False

    @property
    def pid(self):
        """pid of the kvcoordd this object started, or None (adopted)."""
        return self._proc.pid if self._proc else None

    def close(self, *, unlink=False):
        """Stop the kvcoordd this object started (SIGTERM, then SIGKILL after 10 s)
        and detach.  Idempotent.  The segment stays in /dev/shm for the next
        start (its registrations survive); unlink=True removes it once the
        kvcoordd this object started has exited (never an adopted one's)."""
        seg = getattr(self, "segment", None)
        if seg is not None:
            seg.close()
        if self._proc is not None and self._proc.poll() is None:
            self._proc.send_signal(signal.SIGTERM)
            try:
                self._proc.wait(10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        if unlink and self._proc is not None and self._proc.poll() is not None:
            try:
                unlink_segment(self.segment_name)
            except FileNotFoundError:
                pass
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def get_transfer_engine_info(self, rank: int, role=None):
        """(session_id, weights_info_dict) of rank (under role), read from the segment
        without HTTP; None when it is not registered (or withdrawn), as sglang's."""
        try:
            return self.segment.role_lookup(rank, role).info
        except NotFoundError:
            return None

    def get_parallelism_config_info(self, rank: int, role=None):
        """rank's parallelism config (dict) from the segment, or None."""
        try:
            return self.segment.parallelism_config(rank, role)
        except NotFoundError:
            return None


class KVStatusBook:
    """One rank's request_status / failure_records, shared through the rooms.

    KVStatusBook(segment, rank, participants=0): participants is the TP group's
    size (0: the segment's world size); every rank of the group opens the same
    rooms with the same count.  Semantics are sglang's KV managers':

    - update_status(room, status): the first status of a room is taken as is;
      later ones only raise it, except Failed, which is sticky.  The room is
      opened in the segment for this rank on first use and this rank's state
      written there.
    - check_status(room) -> KVPoll: KeyError if this rank never updated the
      room (or cleared it); Failed when any rank of the node failed the room
      (a failure record, a dead participant); else this rank's own status.
    - `room in book`: this rank follows the room.
    - clear(room): forget the room (and release this rank's part of it).
    - record_failure(room, failure_reason, code=0): record the reason in the
      room's failure record (the first record of a room wins, node-wide).
    - failure_exception(room): raise KVTransferError for the room with the
      origin rank's reason, is_from_another_rank set unless this rank recorded
      it; pop-style as sglang's: a second call for the same room raises with
      "Failed due to an unknown reason from another rank".
    - sync(rooms, polls): this rank's polls written, the node's minimum read
      (what poll_and_all_reduce returns).
    """

    def __init__(self, segment, rank, participants=0):
        self.segment = segment
        self.rank = rank
        self.participants = participants
        self.request_status = {}
        self._popped = set()
        self.lock = threading.Lock()

    def _open(self, room):
        self.segment.room_open(room, self.rank, self.participants)

    def update_status(self, bootstrap_room: int, status):
        with self.lock:
            old = self.request_status.get(bootstrap_room)
            if old is None:
                new = KVPoll(status)
                self._open(bootstrap_room)
            elif status == KVPoll.Failed:
                new = KVPoll.Failed
            else:
                new = KVPoll(max(old, status))
            self.request_status[bootstrap_room] = new
        self.segment.room_set_state(bootstrap_room, self.rank, new)

    def check_status(self, bootstrap_room: int):
        with self.lock:
            local = self.request_status[bootstrap_room]  # KeyError, as sglang's
        try:
            info = self.segment.room_get(bootstrap_room, self.rank)
        except NotFoundError:
            return local
        if info.failure is not None or info.state == KVPoll.Failed:
            return KVPoll.Failed
        return local

    def __contains__(self, bootstrap_room):
        with self.lock:
            return bootstrap_room in self.request_status

    def clear(self, bootstrap_room: int):
        with self.lock:
            followed = self.request_status.pop(bootstrap_room, None) is not None
            self._popped.discard(bootstrap_room)
        if followed:
            try:
                self.segment.room_release(bootstrap_room, self.rank)
            except NotFoundError:
                pass

    def record_failure(self, bootstrap_room: int, failure_reason: str, code: int = 0):
        self.segment.room_fail(bootstrap_room, self.rank, failure_reason, code)

    def failure(self, bootstrap_room: int):
        """The room's FailureInfo as this rank sees it, or None (not popped)."""
        try:
            return self.segment.room_failure(bootstrap_room, self.rank)
        except NotFoundError:
            return None

    def failure_exception(self, bootstrap_room: int):
        with self.lock:
            first = bootstrap_room not in self._popped
            self._popped.add(bootstrap_room)
        rec = self.failure(bootstrap_room) if first else None
        if rec is None:
            raise KVTransferError(bootstrap_room, UNKNOWN_REASON, is_from_another_rank=True)
        raise transfer_error(rec)

    def sync(self, rooms, polls):
        """Write this rank's polls (KVPoll per room) and read each room's minimum over
        the node's participating ranks (a list of KVPoll, in order)."""
        with self.lock:
            new = [r for r in rooms if r not in self.request_status]
        for r in new:
            self._open(r)
        return self.segment.room_sync(self.rank, rooms, polls)


def poll_and_all_reduce(pollers, book, gloo_group=None):
    """Node-local replacement of sglang's poll_and_all_reduce(pollers, gloo_group):
    each poller's poll() (a KVPoll) for its bootstrap_room, and the minimum over the
    node's ranks read from the segment instead of an all-reduce (MIN) over gloo.
    gloo_group is accepted and ignored.  Returns a list of ints, as sglang's."""
    polls = [int(p.poll()) for p in pollers]
    rooms = [p.bootstrap_room for p in pollers]
    return [int(s) for s in book.sync(rooms, polls)]
