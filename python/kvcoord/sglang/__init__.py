"""kvcoord.sglang: sglang's own code, unchanged, on the node's kvcoord segment.

- install(segment, rank, *, size=None, timeout=30.0) / uninstall(): called
  once in each TP rank process before sglang's disaggregation code is used.
  It patches the importable `sglang` package in place, and nothing else:
  the KV managers' record_failure and update_status, every class's
  failure_exception, the senders' and receivers' clear(), and
  poll_and_all_reduce, poll_and_all_reduce_attn_cp_tp_group and
  poll_and_all_reduce_with_staging in sglang.srt.disaggregation.utils and in
  every sglang module that imported them by name.  After it:
    * sglang's local bookkeeping answers exactly as sglang's (its own code
      still runs: update_status, check_status, record_failure, clear and
      failure_exception keep sglang's rules, check_status is not patched);
    * failure_exception() on a rank with no record of its own raises
      sglang's own exception class with the reason the origin rank recorded
      (is_from_another_rank=True) instead of "unknown reason from another
      rank"; a room kvcoord failed itself says so (which rank died and how;
      "timed out after N s" for the room TTL);
    * each followed room is a segment room, released when sglang clears it;
    * the poll all-reduces are one C call (Segment.poll_allreduce: the
      rooms kvcoord failed fold to Failed, then one MIN over the group in
      the segment) when every rank of the group is on this node's segment
      and could join its group, else sglang's original (gloo), said once in
      the log; a dead rank's CollectiveError and a mismatch between the
      ranks' calls are raised, any other kvcoord error makes that step and
      the group's later ones sglang's own (logged once);
    * when the poll reports a TP rank dead, the followed rooms it never
      joined fail at once (kvcoord.sglang.poll's docstring).
- KVStatusBook(segment, rank, participants) and poll_and_all_reduce(pollers,
  book): the same bookkeeping for programs without sglang (thin wrappers
  with sglang's semantics).
- EngineInfoBootstrapServer(host, port): sglang's constructor, close() and
  in-process get_transfer_engine_info(rank) / get_parallelism_config_info(rank),
  served over HTTP by a kvcoordd it starts (or adopts, when one already serves
  that port) and read in-process straight from the segment.

Units: seconds for timeouts.  Thread safety: install()/uninstall() take a
process-wide lock; the patched methods may run on any of sglang's threads.
Errors at run time in the segment are logged once (on the loggers under
"kvcoord.sglang": each module logs on its own, logging.getLogger(__name__))
and never reach sglang: its own bookkeeping goes on.
"""

import os
import shutil
import signal
import socket
import subprocess
import threading
import time
import urllib.request
from typing import Any, Dict, List, Literal, Optional, Sequence, Tuple, Union

from .. import (
    KVPoll,
    KVTransferError,
    NotFoundError,
    Segment,
    SegmentNotFoundError,
    name_for_port,
)
from .. import unlink as unlink_segment
from . import install as _sgl_install  # the submodule; install() below is the function
from .book import KVStatusBook, poll_and_all_reduce

__all__ = ["install", "uninstall", "EngineInfoBootstrapServer", "KVStatusBook",
           "poll_and_all_reduce", "KVPoll", "KVTransferError"]


def install(segment: Union[str, Segment, None], rank: int, *, size: Optional[int] = None,
            timeout: float = 30.0, pd_bootstrap: Union[None, bool, Dict[str, Any]] = None,
            transfer_engine: bool = False) -> List[Tuple[str, str]]:
    """Patch the importable `sglang` package so that its disaggregation code
    shares failure reasons through the node's kvcoord segment and agrees on
    polls with a shared-memory all-reduce (see the module docstring).

    segment: a segment name (e.g. "kvcoord-6789": attached as a client), a
    kvcoord.Segment (kept open by the caller), or None (nothing is shared:
    every poll all-reduce falls back to sglang's own, logged once).
    rank: this process's rank in its TP group, the room participant it is.
    size: the rooms' participant count, the TP group's size (default: the
    segment's world size); every rank of the group passes the same.  Rooms
    are node-local: for a group spanning nodes, pass the count of its ranks
    on this node as size and this rank's index among them as rank.
    timeout: seconds a poll all-reduce waits for the group's other ranks
    before kvcoord.CollectiveError names the missing one.
    pd_bootstrap: off by default (None or False).  True, or a dict of
    EngineInfoBootstrapServer options (kvcoordd, daemon_args, start_timeout,
    log_path): sglang's PD bootstrap server (CommonKVBootstrapServer, which a
    prefill starts at its bootstrap port) is replaced by kvcoordd on the same
    host:port, adopted when one serves there, else started; its prefill
    workers register there and its decode workers look them up unchanged,
    and the table gains kvcoord's liveness and restart survival.  Only the
    process that constructs the server (sglang's tokenizer manager) needs it.
    transfer_engine: True makes `from mooncake.engine import TransferEngine`
    give kvcoord.mooncake.TransferEngine in this process (sglang's Mooncake
    wrappers and its remote-instance weight transporter then construct
    kvcoord's engine), and a room failure sglang records after a failed
    transfer carries the engine's reason (docs/mooncake.md).

    Call it once per process, in every rank of the group (the first poll
    all-reduce of a process group is a handshake every rank takes part in),
    before sglang's KV managers are created.  It imports
    sglang.srt.disaggregation.utils and the backends' conn modules that
    import.  Returns the (owner, name) pairs it patched.
    Errors: ImportError (ModuleNotFoundError when sglang or its module is
    missing; the message says "sglang is not installed for this Python
    (...)" with the import's own error), SegmentNotFoundError and
    the other Segment() errors, ValueError (rank, size or timeout out of
    range; a size, or the segment's world size taken for it, above
    kvcoord.ROOM_MAX_PARTICIPANTS (32), the participants a room holds), TypeError (segment of another type), RuntimeError (already
    installed).  Not thread-safe against sglang running meanwhile: call it
    before."""
    return _sgl_install.install(segment, rank, size=size, timeout=timeout,
                                pd_bootstrap=pd_bootstrap, transfer_engine=transfer_engine)


def uninstall() -> bool:
    """Put every patched function and method back (the originals, by identity),
    release the rooms this process still follows and close the segment
    install() opened by name.  True if something was installed."""
    return _sgl_install.uninstall()


def _find_kvcoordd():
    """kvcoordd: $KVCOORD_DAEMON, the build tree this package sits in, or $PATH."""
    path = os.environ.get("KVCOORD_DAEMON")
    if path:
        return path
    here = os.path.dirname(os.path.abspath(__file__))  # build/python/kvcoord/sglang
    candidate = os.path.join(here, "..", "..", "..", "kvcoordd")
    if os.access(candidate, os.X_OK):
        return os.path.normpath(candidate)
    found = shutil.which("kvcoordd")
    if not found:
        raise FileNotFoundError("kvcoordd not found: set KVCOORD_DAEMON, or install kvcoord "
                                "(cmake --install) so that kvcoordd is on $PATH")
    return found


def _listening(host, port):
    """True when something accepts TCP connections on host:port (a refused
    or failed connect within 2 s is False)."""
    try:
        socket.create_connection((host.strip("[]"), port), timeout=2.0).close()
        return True
    except OSError:
        return False


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

    EngineInfoBootstrapServer(host, port): when something listens on
    host:port it must be a kvcoordd (GET /health answers OK within
    `start_timeout` seconds, however busy it is, and its segment
    kvcoord-<port> exists), and it is adopted; when nothing listens there one
    is started (`kvcoordd --listen host:port --segment kvcoord-<port>`, found
    as _find_kvcoordd() says) and waited for, up to `start_timeout` seconds,
    until that very process is attached to the segment.  Workers register over HTTP exactly as with
    sglang's server, or through the segment directly.  close() stops a
    kvcoordd this object started (SIGTERM; the segment and its registrations
    stay for the next start) and detaches; an adopted one keeps running.
    Without close() a started kvcoordd outlives this Python process (it is
    a process of its own, unlike sglang's server thread): the next server
    on that port adopts it, and SIGTERM stops it.

    Errors: FileNotFoundError (no kvcoordd binary), OSError (the port is
    taken by something that is not a kvcoordd, or kvcoordd exited: the
    message has its log),
    TimeoutError (it did not come up in time).
    """

    def __init__(self, host: str, port: int, *, kvcoordd: Optional[str] = None,
                 daemon_args: Sequence[str] = (), start_timeout: float = 30.0,
                 log_path: Optional[str] = None) -> None:
        self.host = host
        self.port = port
        self.segment_name = name_for_port(port)
        self._proc: Optional[subprocess.Popen] = None
        self._log = None
        self.lock = threading.Lock()
        if not self._adopt(start_timeout):
            self._start(kvcoordd or _find_kvcoordd(), list(daemon_args), start_timeout, log_path)
        self.transfer_engine_info = _InfoView(self)

    def _adopt(self, timeout):
        # Something listening is waited for (a busy kvcoordd may answer
        # /health late); only a port nobody listens on starts one.
        if not _listening(self.host, self.port):
            return False
        end = time.monotonic() + timeout
        # each look waits at most what is left of the timeout (2 s at most)
        while not _health(self.host, self.port, min(2.0, max(0.05, end - time.monotonic()))):
            if time.monotonic() > end:
                raise OSError("%s:%d accepts connections but did not answer GET /health with OK "
                              "within %g s: it is not a kvcoordd serving that port"
                              % (self.host, self.port, timeout))
            time.sleep(0.05)
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
                    seg = Segment(self.segment_name, role="client")
                except SegmentNotFoundError:
                    seg = None
                # the kvcoordd started here, not one that took the port meanwhile
                if seg and any(p.pid == self._proc.pid for p in seg.procs()):
                    self.segment = seg
                    break
                if seg:
                    seg.close()
            if time.monotonic() > end:
                self.close()
                raise TimeoutError("kvcoordd did not serve %s:%d within %g s"
                                   % (self.host, self.port, timeout))
            time.sleep(0.02)
        self.adopted = False

    @property
    def pid(self) -> Optional[int]:
        """pid of the kvcoordd this object started, or None (adopted)."""
        return self._proc.pid if self._proc else None

    def close(self, *, unlink: bool = False) -> None:
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

    def __enter__(self) -> "EngineInfoBootstrapServer":
        return self

    def __exit__(self, *exc: Any) -> Literal[False]:
        self.close()
        return False

    def get_transfer_engine_info(self, rank: int,
                                 role: Optional[str] = None) -> Optional[Tuple[str, Dict[str, Any]]]:
        """(session_id, weights_info_dict) of rank (under role), read from the segment
        without HTTP; None when it is not registered (or withdrawn), as sglang's."""
        try:
            return self.segment.role_lookup(rank, role).info
        except NotFoundError:
            return None

    def get_parallelism_config_info(self, rank: int,
                                    role: Optional[str] = None) -> Optional[Dict[str, Any]]:
        """rank's parallelism config (dict) from the segment, or None."""
        try:
            return self.segment.parallelism_config(rank, role)
        except NotFoundError:
            return None
