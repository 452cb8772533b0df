"""kvcoord.sglang.install(pd_bootstrap=...): sglang's PD bootstrap server
(CommonKVBootstrapServer, the aiohttp server a prefill starts at its
bootstrap port) replaced by kvcoordd, which serves the same routes from the
node's segment (docs/http-api.md, "PD bootstrap").

The patched class keeps sglang's constructor signature (host, port) and its
close(); instead of starting aiohttp in a thread it adopts the kvcoordd
already serving host:port, or starts one there (kvcoord.sglang's
EngineInfoBootstrapServer does both).  sglang's prefill workers then PUT
/route to kvcoordd and its decode workers GET /route from it, unchanged.
"""

import functools
import logging

log = logging.getLogger(__name__)

CONN = "sglang.srt.disaggregation.common.conn"
SERVER = "CommonKVBootstrapServer"


def options(pd_bootstrap):
    """install()'s pd_bootstrap as EngineInfoBootstrapServer keyword
    arguments, or None when off.  Raises TypeError for another type."""
    if pd_bootstrap is None or pd_bootstrap is False:
        return None
    if pd_bootstrap is True:
        return {}
    if isinstance(pd_bootstrap, dict):
        allowed = {"kvcoordd", "daemon_args", "start_timeout", "log_path"}
        bad = sorted(set(pd_bootstrap) - allowed)
        if bad:
            raise TypeError("pd_bootstrap: unknown option(s) %s (allowed: %s)"
                            % (", ".join(bad), ", ".join(sorted(allowed))))
        return dict(pd_bootstrap)
    raise TypeError("pd_bootstrap must be None, a bool or a dict of kvcoordd options, not %s"
                    % type(pd_bootstrap).__name__)


def _wrap_init(orig, opts):
    @functools.wraps(orig)
    def __init__(self, host, port, *args, **kwargs):
        from . import EngineInfoBootstrapServer

        self.host = host
        self.port = port
        self._kvcoord_server = EngineInfoBootstrapServer(host, int(port), **opts)
        log.info("kvcoord.sglang: sglang's PD bootstrap server on %s:%s is kvcoordd (pid %s)",
                 host, port, self._kvcoord_server.pid)

    return __init__


def _run(self):
    """kvcoordd already serves (see __init__)."""


def _close(self):
    server = getattr(self, "_kvcoord_server", None)
    if server is not None:
        server.close()


def patches(modules, pd_bootstrap):
    """(owner, name, replacement) for sglang's PD bootstrap server class in
    modules ({name: module}), or [] when pd_bootstrap is off."""
    opts = options(pd_bootstrap)
    mod = modules.get(CONN)
    cls = getattr(mod, SERVER, None) if mod is not None else None
    if opts is None or not isinstance(cls, type):
        if opts is not None:
            log.warning("kvcoord.sglang: pd_bootstrap asked, but %s.%s was not found: "
                        "sglang's own PD bootstrap server stays", CONN, SERVER)
        return []
    own = vars(cls)
    out = [(cls, "__init__", _wrap_init(own["__init__"], opts))]
    for name, new in (("run", _run), ("close", _close)):
        if name in own:
            out.append((cls, name, functools.wraps(own[name])(
                lambda self, _f=new: _f(self))))
    return out
