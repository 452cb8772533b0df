"""kvcoord.mooncake.engine: TransferEngine, the surface of Mooncake's
`mooncake.engine.TransferEngine` (the methods sglang calls) over kvcoord's
transfer engine (include/kvcoord/transfer.h), module kvcoord._engine.

Conventions follow Mooncake's Python binding as of Mooncake 3b5a5941
(mooncake-integration/transfer_engine/transfer_engine_py.cpp) and its
engine (mooncake-transfer-engine/src/transfer_engine_impl.cpp):

- initialize(local_hostname, metadata_server, protocol, device_name): the
  session id is "host:rpc_port", the port picked at random; only
  "P2PHANDSHAKE" is served (a peer's memory description is fetched from
  its rpc port on first use).  The backend is RDMA (kvcoord's verbs) where
  a device exists and MC_FORCE_TCP is not set, else TCP, whatever
  `protocol` says among "rdma" and "tcp", as Mooncake's auto-discovery
  does.
- Every call returns 0 on success and a negative number on failure; a
  transfer returns 0 only when every byte has landed (write: acknowledged
  by the peer after it applied every byte; read: in local memory).
- A blocking call releases the GIL and may be made from many threads at
  once.  Its deadline is MC_TRANSFER_TIMEOUT seconds (at least 5, default
  30) plus one nanosecond per byte, Mooncake's rule.

Extensions: last_error() (this thread's last failure, in words: the peer,
the operation, the errno or work-completion status) and one log line
(logger "kvcoord.mooncake") per failed call.  See docs/mooncake.md.
"""

import collections
import ctypes
import functools
import ipaddress
import logging
import operator
import os
import socket
import threading
import time

from .. import _engine

log = logging.getLogger("kvcoord.mooncake")

P2PHANDSHAKE = "P2PHANDSHAKE"
_KVT_LEVELS = {0: logging.ERROR, 1: logging.WARNING}
REASON_FRESH_S = 10.0  # how long a failed call's reason explains a room failure
_thread = threading.local()  # (monotonic s, reason) of this thread's last failure
_latest = [0.0, ""]  # the same for the process: any thread, any engine


def _remember(why):
    now = time.monotonic()
    _thread.last = (now, why)
    _latest[:] = [now, why]


def recent_reason(max_age=REASON_FRESH_S):
    """The reason of the latest failed call of any kvcoord.mooncake engine in
    this process, preferring the calling thread's: "" when none failed in the
    last max_age seconds.  What kvcoord.sglang adds to a room's failure."""
    now = time.monotonic()
    mine = getattr(_thread, "last", (0.0, ""))
    for t, why in (mine, tuple(_latest)):
        if why and now - t <= max_age:
            return why
    return ""


def annotate(reason):
    """reason plus the engine's (recent_reason()), as "REASON: engine: WHY"."""
    why = recent_reason()
    if not why or why in str(reason):
        return reason
    return "%s: %s" % (reason, why)


def _transfer_timeout_s():
    """MC_TRANSFER_TIMEOUT as Mooncake reads it: atoi, at least 5 s, default 30 s."""
    raw = os.environ.get("MC_TRANSFER_TIMEOUT")
    if raw is None:
        return 30.0
    digits = raw.strip()
    sign = -1 if digits.startswith("-") else 1
    digits = digits.lstrip("+-")
    n = 0
    for ch in digits:  # atoi: leading digits, 0 if none
        if not ch.isdigit():
            break
        n = n * 10 + int(ch)
    return float(max(5, sign * n))


def _split_host(local_hostname):
    """Mooncake's parseHostNameWithPort: "host", "host:port", "[v6]:port" or
    a bare IPv6 address -> (host, port or 0, the port as written or "")."""
    h = local_hostname.strip()
    host, port = h, ""
    if h.startswith("["):
        host, _, rest = h[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else ""
    elif h.count(":") == 1:
        host, port = h.split(":")
    return host, int(port) if port.isdigit() and int(port) < 65536 else 0, port


def _check_local_host(host):
    """None when host can be this engine's address, else why not: it does not
    resolve, or none of its addresses is on this host (getifaddrs; the whole
    loopback network counts, and the unspecified address, every address)."""
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        return "local_hostname %r does not resolve (%s): peers could not reach this engine" % (
            host, getattr(exc, "strerror", None) or exc)
    addrs = []
    for family, _, _, _, sa in infos:
        ip = ipaddress.ip_address(sa[0].split("%")[0])
        if ip.is_unspecified or ip.is_loopback:
            return None
        addrs.append(ip)
    try:
        local = {ipaddress.ip_address(a.split("%")[0]) for _, a, _ in _engine.local_addresses()}
    except OSError:
        return None  # no list to check against: the bind decides
    if any(a in local for a in addrs):
        return None
    return ("local_hostname %r (%s) is not an address of this host (its interfaces have %s): "
            "peers would connect elsewhere" % (
                host, ", ".join(sorted({str(a) for a in addrs})),
                ", ".join(sorted(str(a) for a in local)) or "none"))


class _Cuda:
    """cuPointerGetAttribute through libcuda, loaded with dlopen only when present."""

    _lib = None
    _tried = False
    _lock = threading.Lock()
    CU_POINTER_ATTRIBUTE_MEMORY_TYPE = 2
    CU_MEMORYTYPE_DEVICE = 2

    @classmethod
    def is_device(cls, addr):
        with cls._lock:
            if not cls._tried:
                cls._tried = True
                try:
                    cls._lib = ctypes.CDLL("libcuda.so.1")
                except OSError:
                    cls._lib = None
        if cls._lib is None:
            return False
        kind = ctypes.c_uint(0)
        rc = cls._lib.cuPointerGetAttribute(ctypes.byref(kind),
                                            cls.CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                                            ctypes.c_uint64(addr))
        return rc == 0 and kind.value == cls.CU_MEMORYTYPE_DEVICE


class _NotInitialized(RuntimeError):
    """Raised by TransferEngine._engine() before initialize() (or after
    close()); the public methods turn it into their failure value."""


def _or_fail(value):
    """A TransferEngine method that, called before initialize() succeeded
    (or after close()), returns `value` (Mooncake's failure value for it: -1,
    0 for a batch id, "" or {} for the extensions) with last_error() set,
    instead of raising.  Mooncake's own binding has no guard there (its
    engine pointer is null; only sendProbe checks and returns -1), and
    sglang's callers test the return value."""
    def wrap(fn):
        @functools.wraps(fn)
        def guarded(self, *args, **kwargs):
            try:
                return fn(self, *args, **kwargs)
            except _NotInitialized as exc:
                self._fail(-1, "%s: %s" % (fn.__name__, exc))
                return value() if callable(value) else value
        return guarded
    return wrap


class TransferEngine:
    """Mooncake's TransferEngine, on kvcoord's engine.  Thread-safe.  Every
    call before a successful initialize() (or after close()) returns its
    failure value (-1; 0 for a batch id; "" or {} for the extensions) and
    sets last_error(), as a failed call does."""

    def __init__(self):
        self._e = None
        self._lock = threading.Lock()
        self._errors = threading.local()
        # batch id -> (call, status) of its collection (ids are never
        # reused): only to say why a collected batch is unknown now
        self._collected = collections.OrderedDict()

    # ---- set-up -----------------------------------------------------------------

    def initialize(self, local_hostname, metadata_server, protocol, device_name):
        """Start the engine: listen on local_hostname (port chosen at random;
        the session id is "host:port").  metadata_server must be
        "P2PHANDSHAKE".  0 on success, -1 on failure (last_error() says why):
        among others a local_hostname that does not resolve, none of whose
        addresses is on this host, or whose port is not 0..65535 (Mooncake
        accepts these and every peer fails later)."""
        return self.initialize_ext(local_hostname, metadata_server, protocol, device_name, "")

    def initialize_ext(self, local_hostname, metadata_server, protocol, device_name,
                       metadata_type=""):
        """initialize() with Mooncake's separate metadata type (only P2P is served)."""
        if self._e is not None:
            return self._fail(-1, "initialize: already initialized (session %s)"
                              % self._e.session_id())
        if metadata_server != P2PHANDSHAKE:
            return self._fail(-1, "initialize: metadata server %r is not served by kvcoord's "
                              "engine: pass \"P2PHANDSHAKE\"" % (metadata_server,))
        proto = (protocol or "").lower()
        if proto not in ("", "rdma", "tcp"):
            return self._fail(-1, "initialize: protocol %r is not served by kvcoord's engine "
                              "(\"rdma\" or \"tcp\")" % (protocol,))
        backend = "tcp" if os.environ.get("MC_FORCE_TCP") else "auto"
        host, port, written = _split_host(local_hostname or "")
        if written and not (written.isdigit() and int(written) < 65536):
            # Mooncake logs a warning and uses its default port; kvcoord
            # refuses what cannot be meant.
            return self._fail(-1, "initialize: local_hostname %r: port %r is out of range "
                              "(0..65535)" % (local_hostname, written))
        # Mooncake picks a free rpc port under P2PHANDSHAKE and binds the one
        # in local_hostname only with MC_LEGACY_RPC_PORT_BINDING set: the same
        if not os.environ.get("MC_LEGACY_RPC_PORT_BINDING"):
            port = 0
        if not host:
            return self._fail(-1, "initialize: local_hostname is empty")
        why = _check_local_host(host)
        if why:
            return self._fail(-1, "initialize: " + why)
        device = (device_name or "").split(",")[0].strip() or None
        io_ms = os.environ.get("KVCOORD_TRANSFER_IO_TIMEOUT_MS", "").strip()
        if io_ms and not (io_ms.isdigit() and 0 < int(io_ms) < 1 << 32):
            return self._fail(-1, "initialize: KVCOORD_TRANSFER_IO_TIMEOUT_MS %r is not a "
                              "number of milliseconds in 1..2**32-1" % (io_ms,))
        try:
            e = _engine.Engine(host, backend, device, _transfer_timeout_s(),
                               os.environ.get("KVCOORD_TRANSFER_TOKEN") or None, port=port,
                               io_timeout_ms=int(io_ms or 0))
        except (OSError, ValueError) as exc:
            return self._fail(-1, "initialize on %s: %s" % (host, exc))
        with self._lock:
            self._e = e
        self._drain()
        log.info("kvcoord.mooncake: engine %s (%s backend)", e.session_id(), e.backend())
        return 0

    @_or_fail(-1)
    def get_rpc_port(self):
        """The port of this engine's session id."""
        return self._engine().rpc_port()

    @_or_fail("")
    def get_session_id(self):
        """This engine's session id, "host:port" (an extension: sglang builds
        it from the host and get_rpc_port())."""
        return self._engine().session_id()

    def get_engine(self):
        """Mooncake returns its inner engine; here, this object."""
        return self

    @_or_fail("")
    def backend(self):
        """"tcp" or "verbs" (extension)."""
        return self._engine().backend()

    def close(self):
        """Stop the engine (extension; also on garbage collection).  Calls in
        progress in other threads return first."""
        with self._lock:
            e, self._e = self._e, None
        if e is not None:
            e.close()

    # ---- memory --------------------------------------------------------------------

    @_or_fail(-1)
    def register_memory(self, buffer_addr, capacity, location="*"):
        """Register [buffer_addr, +capacity) as a source and target of transfers.
        0, or negative (-1 invalid, -7 overlaps a registered region)."""
        del location  # NUMA/device placement: the engine has no use for it
        e = self._engine()
        if _is_u64(buffer_addr) and _Cuda.is_device(buffer_addr) and e.backend() != "verbs":
            return self._fail(-1, "register_memory 0x%x: CUDA device memory cannot be moved by "
                              "the TCP backend (kvcoord stages nothing through host memory): "
                              "use an RDMA device (verbs registers it, as Mooncake does) or "
                              "host memory" % buffer_addr)
        try:
            rc = e.register(buffer_addr, capacity)
        except (TypeError, ValueError) as exc:
            return self._fail(-1, "register_memory: %s" % exc)
        return self._rc(rc)

    @_or_fail(-1)
    def unregister_memory(self, buffer_addr):
        """Deregister the region that starts at buffer_addr, once no call in
        flight uses it.  0, or -3 (not registered)."""
        try:
            rc = self._engine().unregister(buffer_addr)
        except (TypeError, ValueError) as exc:
            return self._fail(-1, "unregister_memory: %s" % exc)
        return self._rc(rc)

    @_or_fail(-1)
    def batch_register_memory(self, buffer_addresses, capacities, location="*"):
        """register_memory of each; on the first failure the ones registered by
        this call are deregistered again and that failure is returned."""
        if len(buffer_addresses) != len(capacities):
            return self._fail(-1, "batch_register_memory: %d addresses, %d capacities"
                              % (len(buffer_addresses), len(capacities)))
        done = []
        for addr, cap in zip(buffer_addresses, capacities):
            rc = self.register_memory(addr, cap, location)
            if rc != 0:
                for a in done:
                    self._engine().unregister(a)
                return rc
            done.append(addr)
        return 0

    @_or_fail(-1)
    def batch_unregister_memory(self, buffer_addresses):
        """unregister_memory of each; the first failure is returned (the others
        are still deregistered)."""
        rc = 0
        for addr in buffer_addresses:
            r = self.unregister_memory(addr)
            rc = rc or r
        return rc

    # ---- transfers -------------------------------------------------------------------

    @_or_fail(-1)
    def transfer_sync_write(self, target_hostname, buffer, peer_buffer_address, length,
                            transport_hint=""):
        """Write length bytes at buffer into the peer's peer_buffer_address.
        0 once the peer acknowledged every byte, -1 otherwise."""
        return self._call(self._engine().transfer_one, target_hostname, _engine.WRITE, buffer,
                          peer_buffer_address, length)

    @_or_fail(-1)
    def transfer_sync_read(self, target_hostname, buffer, peer_buffer_address, length,
                           transport_hint=""):
        """Read length bytes of the peer's peer_buffer_address into buffer.
        0 once every byte is in local memory, -1 otherwise."""
        return self._call(self._engine().transfer_one, target_hostname, _engine.READ, buffer,
                          peer_buffer_address, length)

    @_or_fail(-1)
    def batch_transfer_sync_write(self, target_hostname, buffers, peer_buffer_addresses,
                                  lengths, transport_hint=""):
        """Write every buffers[i] (lengths[i] bytes) to peer_buffer_addresses[i].
        0 only when every byte of every entry was acknowledged, else -1."""
        return self._call(self._engine().transfer, target_hostname, _engine.WRITE, buffers,
                          peer_buffer_addresses, lengths)

    @_or_fail(-1)
    def batch_transfer_sync_read(self, target_hostname, buffers, peer_buffer_addresses,
                                 lengths, transport_hint=""):
        """Read every peer_buffer_addresses[i] into buffers[i].  0 only when every
        byte is in local memory, else -1."""
        return self._call(self._engine().transfer, target_hostname, _engine.READ, buffers,
                          peer_buffer_addresses, lengths)

    @_or_fail(-1)
    def transfer_sync(self, target_hostname, buffer, peer_buffer_address, length, opcode,
                      notify=None, transport_hint=""):
        """transfer_sync_read / _write by opcode (TransferOpcode.Read / Write)."""
        if notify is not None:
            return self._fail(-1, "transfer_sync: notifications are not served")
        return self._call(self._engine().transfer_one, target_hostname, _op(opcode), buffer,
                          peer_buffer_address, length)

    @_or_fail(-1)
    def batch_transfer_sync(self, target_hostname, buffers, peer_buffer_addresses, lengths,
                            opcode, notify=None, transport_hint=""):
        """batch_transfer_sync_read / _write by opcode."""
        if notify is not None:
            return self._fail(-1, "batch_transfer_sync: notifications are not served")
        return self._call(self._engine().transfer, target_hostname, _op(opcode), buffers,
                          peer_buffer_addresses, lengths)

    @_or_fail(0)
    def batch_transfer_async_write(self, target_hostname, buffers, peer_buffer_addresses,
                                   lengths, transport_hint=""):
        """Start a batch of writes: its batch id, or 0 on failure."""
        return self._submit(target_hostname, _engine.WRITE, buffers, peer_buffer_addresses,
                            lengths)

    @_or_fail(0)
    def batch_transfer_async_read(self, target_hostname, buffers, peer_buffer_addresses,
                                  lengths, transport_hint=""):
        """Start a batch of reads: its batch id, or 0 on failure."""
        return self._submit(target_hostname, _engine.READ, buffers, peer_buffer_addresses,
                            lengths)

    @_or_fail(0)
    def batch_transfer_async(self, target_hostname, buffers, peer_buffer_addresses, lengths,
                             opcode, transport_hint=""):
        """batch_transfer_async_read / _write by opcode."""
        return self._submit(target_hostname, _op(opcode), buffers, peer_buffer_addresses,
                            lengths)

    @_or_fail(0)
    def transfer_submit_write(self, target_hostname, buffer, peer_buffer_address, length,
                              transport_hint=""):
        """Start one write: its batch id, or 0 on failure."""
        return self._submit(target_hostname, _engine.WRITE, [buffer], [peer_buffer_address],
                            [length])

    @_or_fail(-1)
    def get_batch_transfer_status(self, batch_ids):
        """Wait for every batch of batch_ids: 0 when all succeeded, -1 as soon as
        one failed or passed its deadline (the others are then released)."""
        e = self._engine()
        try:
            ids = list(batch_ids)
        except TypeError as exc:
            return self._fail(-1, "get_batch_transfer_status: %s" % exc)
        for i, bid in enumerate(ids):
            if not _is_u64(bid):
                return self._fail(-1, "get_batch_transfer_status: batch_ids[%d] must be an int "
                                  "in 0..2**64-1, not %r" % (i, bid))
        for i, bid in enumerate(ids):
            rc = self._wait(e, bid, True, "get_batch_transfer_status")
            if rc != 1:
                for rest in ids[i + 1:]:
                    self._wait(e, rest, False, "get_batch_transfer_status (released)", quiet=True)
                return self._rc(-1) if rc != _UNKNOWN else -1
        return 0

    @_or_fail(-1)
    def transfer_check_status(self, batch_id):
        """1 done, -1 failed, -2 deadline passed, 0 still in flight.  A
        batch is forgotten once this returned 1, -1 or -2 for it (or
        get_batch_transfer_status returned for it), as Mooncake frees it
        then: asked again it is -1, last_error() saying what it reported."""
        e = self._engine()
        try:
            rc = self._wait(e, batch_id, False, "transfer_check_status")
        except (TypeError, ValueError) as exc:
            return self._fail(-1, "transfer_check_status: %s" % exc)
        if rc == _UNKNOWN:
            return -1
        if rc < 0:
            self._note()
        return rc

    @_or_fail(-1)
    def send_probe(self, peer_server_name):
        """Handshake with the peer now (fetch its descriptor): 0 when it answers."""
        return self._rc(self._engine().probe(peer_server_name))

    # ---- reasons -----------------------------------------------------------------------

    def last_error(self):
        """This thread's last failure of this engine, in words ("" if none):
        the peer, the operation, the errno or work-completion status."""
        return getattr(self._errors, "text", "")

    def engine_last_error(self):
        """(monotonic seconds, reason) of the engine's latest failed call in any
        thread; (0.0, "") if none."""
        if self._e is None:
            return 0.0, ""
        t, why = self._e.engine_last_error()
        return t / 1e9, why

    @_or_fail(dict)
    def stats(self):
        """Counters of the engine (dict; extension): calls_ok, calls_failed,
        writes_sent, bytes_sent, writes_recv, bytes_recv, frames_refused,
        conns_failed, peers, peers_unhealthy, and the same-host copy's
        same_host_copies, same_host_bytes (copies this process made with
        process_vm_readv: peers' writes into it, its own reads) and
        same_host_fallbacks (connections on this host left on the socket);
        senders: sending engines connected here now (at most 1024; one
        that restarts replaces its entry, one that disconnects is dropped).
        KVCOORD_FORCE_SOCKET=1 in the environment turns the copy off
        (docs/mooncake.md)."""
        return self._engine().stats()

    @_or_fail(-1)
    def peer_add(self, descriptor_json):
        """Import a peer's descriptor directly (extension, for engines whose
        descriptor travels another way).  0 or -1."""
        return self._rc(self._engine().peer_add(descriptor_json))

    @_or_fail("")
    def descriptor(self):
        """This engine's descriptor, JSON text (extension)."""
        return self._engine().descriptor()

    # ---- internals ------------------------------------------------------------------------

    def _engine(self):
        e = self._e
        if e is None:
            raise _NotInitialized("the engine is not initialized (call initialize() first)")
        return e

    def _call(self, fn, *args):
        try:
            rc = fn(*args)
        except (TypeError, ValueError) as exc:
            return self._fail(-1, "%s: %s" % (_what(args[1], args[0]), exc))
        return self._rc(rc)

    def _submit(self, sid, op, bufs, peers, lens):
        try:
            bid = self._engine().submit(sid, op, bufs, peers, lens)
        except (TypeError, ValueError) as exc:
            self._fail(-1, "%s: %s" % (_what(op, sid), exc))
            return 0
        if bid == 0:
            self._note()
        return bid

    def _wait(self, e, bid, block, call, quiet=False):
        """e.batch_wait(bid, block) -> 1, -1, -2, 0, or _UNKNOWN (an id never
        submitted or already collected; last_error() says which, unless
        quiet).  A batch whose end is reported here is recorded as collected."""
        rc = e.batch_wait(bid, block)
        with self._lock:
            if rc in (1, -1, -2):
                self._collected[bid] = (call, rc)
                while len(self._collected) > _COLLECTED_MAX:
                    self._collected.popitem(last=False)
                return rc
            was = self._collected.get(bid) if rc == _UNKNOWN else None
        if rc == _UNKNOWN and not quiet:
            if was:
                self._fail(-1, "%s: batch %d was already collected: %s reported %d (%s) for it; "
                           "a batch is forgotten once its end is reported, as Mooncake frees "
                           "it then" % (call, bid, was[0], was[1], _STATUS[was[1]]))
            else:
                self._fail(-1, "%s: batch %d is unknown (not a batch id of this engine, or "
                           "collected long ago)" % (call, bid))
        return rc

    def _rc(self, rc):
        if rc != 0:
            self._note()
        self._drain()
        return rc

    def _note(self):
        """Log this thread's failure once and keep it for last_error()."""
        _, why = _engine.last_error()
        self._errors.text = why
        _remember(why)
        log.warning("kvcoord.mooncake: %s", why)

    def _fail(self, rc, why):
        self._errors.text = why
        _remember(why)
        log.warning("kvcoord.mooncake: %s", why)
        return rc

    def _drain(self):
        e = self._e
        if e is None:
            return
        for level, line in e.log_take():
            log.log(_KVT_LEVELS.get(level, logging.INFO), "kvcoord transfer engine: %s", line)

    def __del__(self):
        try:
            self.close()
        except Exception:  # interpreter shutdown
            pass


class TransferOpcode:
    """Mooncake's TransferEngine.TransferOpcode."""

    Read = _engine.READ
    Write = _engine.WRITE


TransferEngine.TransferOpcode = TransferOpcode


_UNKNOWN = -3  # batch_wait: no such batch in flight
_COLLECTED_MAX = 4096  # collected batch ids remembered, for last_error()
_STATUS = {1: "done", -1: "failed", -2: "deadline passed"}


def _what(op, sid):
    """"write to SID" / "read from SID", as the engine names an operation."""
    return ("read from %s" if op == _engine.READ else "write to %s") % sid


def _is_u64(v):
    """v is an int (or has __index__) in 0..2**64-1, what the engine takes."""
    try:
        return 0 <= operator.index(v) < 1 << 64
    except TypeError:
        return False


def _op(opcode):
    """opcode's value (TransferOpcode.Read or .Write, or their ints);
    ValueError naming it for anything else (a str, a float, another int)."""
    try:
        v = operator.index(opcode)
    except TypeError:
        v = None
    if v not in (_engine.READ, _engine.WRITE):
        raise ValueError("opcode must be TransferOpcode.Read or .Write, not %r" % (opcode,))
    return v


def last_error():
    """The calling thread's last failure of any kvcoord.mooncake engine ("" if
    none): what that engine's last_error() said, including a failed
    initialize() and a call before it."""
    return getattr(_thread, "last", (0.0, ""))[1]
