"""kvcoord.sglang.install() / uninstall(): patch the importable `sglang`
package in place (see kvcoord.sglang's docstring for what and why)."""

import functools
import importlib
import logging
import sys
import threading

from .. import ROOM_MAX_PARTICIPANTS, Segment
from . import pd as _sgl_pd, poll as _sgl_poll
from .bridge import Bridge

log = logging.getLogger(__name__)

UTILS = "sglang.srt.disaggregation.utils"
# Imported by install() when they import (a backend whose own dependencies
# are missing is skipped), so that their classes are patched before use.
BACKENDS = (
    "sglang.srt.disaggregation.base.conn",
    "sglang.srt.disaggregation.common.conn",
    "sglang.srt.disaggregation.mooncake.conn",
    "sglang.srt.disaggregation.nixl.conn",
    "sglang.srt.disaggregation.ascend.conn",
    "sglang.srt.disaggregation.mori.conn",
    "sglang.srt.disaggregation.fake.conn",
)
POLL_NAMES = ("poll_and_all_reduce", "poll_and_all_reduce_attn_cp_tp_group",
              "poll_and_all_reduce_with_staging")
MANAGER_METHODS = ("record_failure", "update_status")

_lock = threading.Lock()
_active = None  # (Bridge, [(owner, name, original)]) while installed
_reason = [None]  # transfer_engine=True: adds the engine's reason to a room's failure


def _locked(lock):
    return lock if hasattr(lock, "__enter__") else threading.Lock()


def _wrap_update_status(bridge, orig):
    @functools.wraps(orig)
    def update_status(self, bootstrap_room, status, *args, **kwargs):
        result = orig(self, bootstrap_room, status, *args, **kwargs)
        table = getattr(self, "request_status", None)
        if isinstance(table, dict):
            now = table.get(bootstrap_room)
            if now is not None:  # sglang kept (or created) the room: follow it
                bridge.follow(self, bootstrap_room, now)
        return result

    return update_status


def _wrap_record_failure(bridge, orig):
    @functools.wraps(orig)
    def record_failure(self, bootstrap_room, failure_reason, *args, **kwargs):
        if _reason[0] is not None:
            failure_reason = _reason[0](failure_reason)
        result = orig(self, bootstrap_room, failure_reason, *args, **kwargs)
        bridge.publish(self, bootstrap_room, failure_reason)
        return result

    return record_failure


def _wrap_failure_exception(bridge, orig):
    @functools.wraps(orig)
    def failure_exception(self, *args, **kwargs):
        mgr = getattr(self, "kv_mgr", None)
        room = getattr(self, "bootstrap_room", None)
        if bridge.segment is None or mgr is None or room is None:
            return orig(self, *args, **kwargs)
        records = getattr(mgr, "failure_records", None)
        with _locked(getattr(mgr, "failure_lock", None)):
            had = isinstance(records, dict) and room in records
        node = None if had else bridge.node_failure(room)  # read before sglang clears
        try:
            return orig(self, *args, **kwargs)
        except Exception as e:
            new = bridge.substitute(mgr, room, had, node, e)
            if new is None:
                raise
            raise new from None

    return failure_exception


def _wrap_clear(bridge, orig):
    @functools.wraps(orig)
    def clear(self, *args, **kwargs):
        result = orig(self, *args, **kwargs)
        mgr = getattr(self, "kv_mgr", None)
        room = getattr(self, "bootstrap_room", None)
        if mgr is not None and room is not None:
            table = getattr(mgr, "request_status", None)
            if not (isinstance(table, dict) and room in table):
                bridge.leave(mgr, room)
        return result

    return clear


def _class_patches(bridge, mod):
    """(class, name, wrapper) for the methods of the classes mod defines."""
    out = []
    for cls in list(vars(mod).values()):
        if not isinstance(cls, type) or cls.__module__ != mod.__name__:
            continue
        own = vars(cls)
        if "update_status" in own:
            out.append((cls, "update_status", _wrap_update_status(bridge, own["update_status"])))
        if "record_failure" in own:
            out.append((cls, "record_failure",
                        _wrap_record_failure(bridge, own["record_failure"])))
        if "failure_exception" in own:
            out.append((cls, "failure_exception",
                        _wrap_failure_exception(bridge, own["failure_exception"])))
        if "clear" in own and hasattr(cls, "failure_exception"):
            out.append((cls, "clear", _wrap_clear(bridge, own["clear"])))
    return out


def _import_utils():
    """sglang's disaggregation utils module, or an ImportError (of the same
    class: ModuleNotFoundError stays one) that says what is missing and for
    which Python, instead of a bare "No module named 'sglang'"."""
    try:
        return importlib.import_module(UTILS)
    except ImportError as e:
        where = "for this Python (%s)" % sys.executable
        if e.name == "sglang":
            msg = ("sglang is not installed %s (import sglang failed: %s): install sglang "
                   "in this environment, then call kvcoord.sglang.install() in each of its "
                   "rank processes" % (where, e))
        elif e.name and (e.name == UTILS or UTILS.startswith(e.name + ".")):
            msg = ("the sglang installed %s has no %s (import failed: %s): kvcoord.sglang "
                   "needs an sglang with PD disaggregation" % (where, UTILS, e))
        else:
            msg = ("sglang is installed %s but %s could not be imported (import failed: %s)"
                   % (where, UTILS, e))
        raise type(e)(msg, name=e.name, path=e.path) from e


def _open(segment):
    if segment is None or isinstance(segment, Segment):
        return segment, False
    if isinstance(segment, str):
        return Segment(segment, role="client"), True
    raise TypeError("segment must be a name (str), a kvcoord.Segment or None, not %s"
                    % type(segment).__name__)


def _check_room_size(size, what):
    """ValueError when size is more participants than a room holds."""
    if size is not None and size > ROOM_MAX_PARTICIPANTS:
        raise ValueError("%s %d exceeds the %d participants a bootstrap room holds "
                         "(kvcoord.ROOM_MAX_PARTICIPANTS): pass the TP group's ranks on "
                         "this node, at most %d" % (what, size, ROOM_MAX_PARTICIPANTS,
                                                   ROOM_MAX_PARTICIPANTS))


def install(segment, rank, *, size=None, timeout=30.0, pd_bootstrap=None,
            transfer_engine=False):
    """See kvcoord.sglang.install."""
    global _active
    if not isinstance(rank, int) or isinstance(rank, bool) or rank < 0:
        raise ValueError("rank must be an int >= 0, not %r" % (rank,))
    if size is not None and (not isinstance(size, int) or not rank < size):
        raise ValueError("size must be an int > rank (%d), not %r" % (rank, size))
    _check_room_size(size, "size")
    if not timeout > 0:
        raise ValueError("timeout must be > 0 seconds, not %r" % (timeout,))
    _sgl_pd.options(pd_bootstrap)  # TypeError before anything changes
    with _lock:
        if _active is not None:
            raise RuntimeError("kvcoord.sglang is already installed in this process "
                               "(uninstall() first)")
        utils = _import_utils()  # ImportError naming what is missing
        for name in BACKENDS:
            try:
                importlib.import_module(name)
            except Exception as e:  # its own dependencies (nixl, CUDA...) missing
                log.debug("kvcoord.sglang: %s not imported, not patched: %s", name, e)
        seg, owned = _open(segment)
        if seg is not None and size is None:
            size = seg.stat()["world_size"]
            try:
                _check_room_size(size, "the segment's world size (size's default)")
            except ValueError:
                if owned:
                    seg.close()
                raise
        if seg is not None and not rank < size:
            if owned:
                seg.close()
            raise ValueError("rank %d is not below the group size %d" % (rank, size))
        bridge = Bridge(seg, rank, size, float(timeout), owned)
        originals = {n: getattr(utils, n) for n in POLL_NAMES if hasattr(utils, n)}
        wrappers = _sgl_poll.make(bridge, utils, originals)
        for name, new in wrappers.items():
            new.__kvcoord_original__ = originals[name]
        patches = []
        for modname, mod in sorted(sys.modules.items()):
            if mod is None or not (modname == "sglang" or modname.startswith("sglang.")):
                continue
            for name, orig in originals.items():
                if vars(mod).get(name) is orig:
                    patches.append((mod, name, wrappers[name]))
            if modname.startswith("sglang.srt.disaggregation."):
                patches.extend(_class_patches(bridge, mod))
        patches.extend(_sgl_pd.patches(sys.modules, pd_bootstrap))
        done = []
        for owner, name, new in patches:
            done.append((owner, name, vars(owner)[name]))
            new.__kvcoord_original__ = vars(owner)[name]
            setattr(owner, name, new)
        if transfer_engine:
            from .. import mooncake
            mooncake.install_mooncake_module()
            _reason[0] = mooncake.engine.annotate
        _active = (bridge, done, wrappers)
        log.info("kvcoord.sglang: installed (rank %d of %s, segment %s): %d functions and "
                 "methods patched", rank, size, seg.name if seg is not None else None,
                 len(done))
        return [(_owner_name(o), n) for o, n, _ in done]


def _owner_name(owner):
    if isinstance(owner, type):
        return "%s.%s" % (owner.__module__, owner.__qualname__)
    return owner.__name__


def uninstall():
    """See kvcoord.sglang.uninstall."""
    global _active
    with _lock:
        if _active is None:
            return False
        bridge, done, wrappers = _active
        _active = None
        if _reason[0] is not None:
            from .. import mooncake
            mooncake.uninstall_mooncake_module()
            _reason[0] = None
        for owner, name, orig in reversed(done):
            setattr(owner, name, orig)
        # modules imported after install() took the wrappers by name: the originals too
        for modname, mod in sorted(sys.modules.items()):
            if mod is None or not modname.startswith("sglang."):
                continue
            for name, new in wrappers.items():
                if vars(mod).get(name) is new:
                    setattr(mod, name, new.__kvcoord_original__)
        bridge.close()
        return True


def active_bridge():
    """The Bridge while installed, else None (for the package's own tests)."""
    return _active[0] if _active else None
