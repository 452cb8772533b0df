"""kvcoord as an sglang plugin: the entry point `kvcoord` of the group
`sglang.srt.plugins` (python/setup.py), which sglang's plugin framework
(sglang.srt.plugins.load_plugins, sglang 0298b5b4) calls with no argument,
early, in every sglang process; `SGLANG_PLUGINS` filters plugins by name.

Configured by environment, so that `pip install` plus these variables adopt
kvcoord with no line of sglang or of its launcher changed:

    KVCOORD_TRANSFER_ENGINE  "1" (default): `from mooncake.engine import
                             TransferEngine` gives kvcoord.mooncake's engine
                             in this process; "0": Mooncake's
    KVCOORD_SEGMENT          the node's segment name: kvcoord.sglang.install()
                             runs when the process's first sglang KV manager is
                             constructed, with sglang's own TP rank and size
                             (its parallel state; else the manager's
                             engine_rank and the segment's world size)
    KVCOORD_PD_BOOTSTRAP     "1": sglang's PD bootstrap server is kvcoordd (as
                             install(..., pd_bootstrap=True), in every process,
                             also those that construct no KV manager)

Failures of the deferred install are logged (logger "kvcoord.sglang_plugin") and
leave sglang as it is.  docs/mooncake.md, "sglang on it, unchanged".
"""

import functools
import importlib
import logging
import os
import threading

log = logging.getLogger(__name__)

MANAGER = "sglang.srt.disaggregation.common.conn"
_lock = threading.Lock()
_state = {"loaded": False, "installed": False, "patched": None}


def _on(name, default):
    return os.environ.get(name, default).strip().lower() not in ("0", "", "false", "no", "off")


def _rank_size(manager_args):
    """sglang's TP rank and size: its parallel state when set up, else the KV
    manager's engine_rank (KVArgs.engine_rank, or an int) and no size."""
    try:
        ps = importlib.import_module("sglang.srt.distributed.parallel_state")
        return ps.get_tensor_model_parallel_rank(), ps.get_tensor_model_parallel_world_size()
    except Exception:  # not initialised (or not this sglang): the manager says
        pass
    first = manager_args[0] if manager_args else 0
    rank = first if isinstance(first, int) else getattr(first, "engine_rank", 0)
    return int(rank), None


def _install_once(manager_args):
    with _lock:
        if _state["installed"]:
            return
        _state["installed"] = True
    segment = os.environ.get("KVCOORD_SEGMENT")
    rank, size = _rank_size(manager_args)
    try:
        from . import sglang as ksg

        ksg.install(segment, rank, size=size,  # the PD server: patched by load()
                    transfer_engine=_on("KVCOORD_TRANSFER_ENGINE", "1"))
        log.info("kvcoord sglang plugin: installed (segment %s, rank %d)", segment, rank)
    except Exception as e:  # sglang runs on, without kvcoord's sharing
        log.error("kvcoord sglang plugin: install(%r, %d) failed: %s", segment, rank, e)


def _pd_module():
    from .sglang import pd

    return pd


def load():
    """The entry point: see the module docstring.  Idempotent."""
    with _lock:
        if _state["loaded"]:
            return
        _state["loaded"] = True
    if _on("KVCOORD_TRANSFER_ENGINE", "1"):
        from . import mooncake

        mooncake.install_mooncake_module()
    pd_on = _on("KVCOORD_PD_BOOTSTRAP", "0")
    if not os.environ.get("KVCOORD_SEGMENT") and not pd_on:
        return
    try:
        conn = importlib.import_module(MANAGER)
    except Exception as e:
        log.error("kvcoord sglang plugin: %s not importable, not installed: %s", MANAGER, e)
        return
    if pd_on:  # the process constructing the PD bootstrap server has no KV manager
        for owner, name, new in _pd_module().patches({MANAGER: conn}, True):
            setattr(owner, name, new)
    if not os.environ.get("KVCOORD_SEGMENT"):
        return
    cls = conn.CommonKVManager
    orig = cls.__init__

    @functools.wraps(orig)
    def __init__(self, *args, **kwargs):
        _install_once(args)
        return orig(self, *args, **kwargs)

    cls.__init__ = __init__
    _state["patched"] = (cls, orig)
