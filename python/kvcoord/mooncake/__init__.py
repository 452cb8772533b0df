"""kvcoord.mooncake: a Mooncake-compatible transfer engine over kvcoord's
own (TCP on io_uring; RDMA WRITE/READ over verbs where a device exists).

    from kvcoord.mooncake import TransferEngine
    e = TransferEngine()
    e.initialize("10.0.0.7", "P2PHANDSHAKE", "rdma", "")
    e.register_memory(ptr, nbytes)
    session = "10.0.0.7:%d" % e.get_rpc_port()
    rc = e.batch_transfer_sync_write(peer_session, srcs, dsts, lengths)  # 0 or -1
    if rc:
        print(e.last_error())        # the peer, the operation, the cause

sglang adopts it without a change to its code through
kvcoord.sglang.install(..., transfer_engine=True) or kvcoord's sglang
plugin entry point; install_mooncake_module() is the piece both use.
docs/mooncake.md says what differs from Mooncake.
"""

import importlib
import sys
import types

from .engine import P2PHANDSHAKE, TransferEngine, TransferOpcode, last_error

__all__ = ["TransferEngine", "TransferOpcode", "P2PHANDSHAKE", "last_error",
           "install_mooncake_module", "uninstall_mooncake_module"]

_installed = None  # (previous sys.modules entries) while the shim is in place


def install_mooncake_module():
    """Make `from mooncake.engine import TransferEngine` give kvcoord's engine
    in this process (what sglang's Mooncake wrappers and weight transporter
    import).  Anything else of a real Mooncake installation (its store, its
    other names) stays reachable: the shim forwards unknown attributes of
    `mooncake.engine` to the real module when one is installed.  Idempotent;
    returns True when it changed sys.modules."""
    global _installed
    cur = sys.modules.get("mooncake.engine")
    if getattr(cur, "__kvcoord__", False):
        return False
    prev = {k: sys.modules.get(k) for k in ("mooncake", "mooncake.engine")}
    real = None
    try:
        real = importlib.import_module("mooncake.engine")
    except Exception:  # no Mooncake installed: nothing to forward to
        real = None
    from . import engine as ours

    shim = types.ModuleType("mooncake.engine", "kvcoord's engine in place of Mooncake's")
    shim.__kvcoord__ = True
    shim.TransferEngine = ours.TransferEngine
    shim.TransferOpcode = ours.TransferOpcode
    if real is not None:
        shim.__getattr__ = lambda name: getattr(real, name)
    pkg = sys.modules.get("mooncake")
    if pkg is None:
        pkg = types.ModuleType("mooncake", "kvcoord's stand-in for Mooncake's package")
        pkg.__path__ = []
        pkg.__kvcoord__ = True
        sys.modules["mooncake"] = pkg
    setattr(pkg, "engine", shim)
    sys.modules["mooncake.engine"] = shim
    _installed = (prev, real)
    return True


def uninstall_mooncake_module():
    """Undo install_mooncake_module(); False when it was not installed."""
    global _installed
    if _installed is None:
        return False
    prev, real = _installed
    _installed = None
    for name, mod in prev.items():
        if mod is None:
            sys.modules.pop(name, None)
        else:
            sys.modules[name] = mod
    pkg = sys.modules.get("mooncake")
    if pkg is not None and real is not None:
        pkg.engine = real
    return True
