"""loadlib.py - shared by the load, slow-client, crash-under-load and soak
tests: start and watch kvcoordd, read its fds and RSS from /proc, run wrk
and parse its report, plain HTTP over raw sockets.

Nothing here asserts a wall-clock time: deadlines only keep a broken daemon
from hanging a test.
"""
import http.client
import json
import os
import re
import resource
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import kvctest  # noqa: E402  (the tests' one helper module)
from kvctest import free_port  # noqa: E402,F401  (loadlib.free_port, for tests/robust)

REGISTER = "/register_transfer_engine_info"
LOOKUP = "/get_transfer_engine_info"


def raise_nofile(want=65536):
    """Raise RLIMIT_NOFILE (soft up to the hard limit); children inherit it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = min(want, hard) if hard != resource.RLIM_INFINITY else want
    if soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def weights(n, seed=0):
    """A weights_info_dict shaped like sglang's (parameter -> [ptr, numel, elsize])."""
    base = 0x7F2A00000000 + (seed % 4096) * (1 << 36)
    names = ("self_attn.qkv_proj.weight", "self_attn.o_proj.weight",
             "mlp.gate_up_proj.weight", "mlp.down_proj.weight")
    return {"model.layers.%d.%s.s%d" % (i // 4, names[i % 4], seed): [base + i * 0x200000, 4096 * 1024 + seed, 2]
            for i in range(n)}


def reg_body(rank, session_id, wid):
    return json.dumps({"rank": rank, "transfer_engine_info": {
        "session_id": session_id, "weights_info_dict": wid}}).encode()


class Daemon(kvctest.Daemon):
    """kvctest's kvcoordd (info-level log, which has the listening line; the
    daemon's room cap), started by start(fresh) (which returns it), with
    the load tests' fd and RSS probes; stop() keeps the segment
    (unlink_segment() removes it)."""

    def __init__(self, exe, segment, args=()):
        super().__init__(segment, args, exe=exe, log_level="info", max_rooms=None, run=False)

    def start(self, fresh=True):
        return super().start(fresh)

    def stop(self):
        """SIGTERM (SIGKILL after 30 s); returns the exit status."""
        return super().stop(discard=False)

    def unlink_segment(self):
        kvctest.discard(self.segment)

    def fds(self):
        return len(os.listdir("/proc/%d/fd" % self.pid))

    def rss_kb(self):
        return self.rss_kib()

    def wait_fds(self, baseline, deadline_s=60):
        """Wait until the daemon's fd count is back to baseline (connections
        close asynchronously); returns the last count seen."""
        end = time.monotonic() + deadline_s
        n = self.fds()
        while n > baseline and time.monotonic() < end:
            time.sleep(0.2)
            n = self.fds()
        return n


def get(port, target, timeout=10, method="GET", body=None, headers=None):
    """One request on a new connection: (status, body bytes, headers dict)."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        c.request(method, target, body=body, headers=headers or {})
        r = c.getresponse()
        return r.status, r.read(), dict(r.getheaders())
    finally:
        c.close()


def percentile(values, p):
    if not values:
        return float("nan")
    v = sorted(values)
    k = min(len(v) - 1, max(0, int(round(p / 100.0 * (len(v) - 1)))))
    return v[k]


_UNIT = {"us": 1e-3, "ms": 1.0, "s": 1000.0, "m": 60000.0}


def _ms(text):
    m = re.match(r"([\d.]+)(us|ms|s|m)$", text)
    return float(m.group(1)) * _UNIT[m.group(2)] if m else float("nan")


def wrk(url, connections, duration_s, threads=2, timeout_s=10, script=None):
    """Run wrk --latency; returns a dict: requests, non2xx, connect, read,
    write, timeout (socket errors), p50_ms, p99_ms, rps, and the raw text."""
    cmd = ["wrk", "-t%d" % threads, "-c%d" % connections, "-d%ds" % duration_s,
           "--timeout", "%ds" % timeout_s, "--latency"]
    if script:
        cmd += ["-s", script]
    cmd.append(url)
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=duration_s + 120)
    text = out.stdout + out.stderr
    if out.returncode != 0:
        raise AssertionError("wrk failed (%d):\n%s" % (out.returncode, text))
    res = {"raw": text, "non2xx": 0, "connect": 0, "read": 0, "write": 0, "timeout": 0}
    m = re.search(r"(\d+) requests in", text)
    res["requests"] = int(m.group(1)) if m else 0
    m = re.search(r"Non-2xx or 3xx responses: (\d+)", text)
    if m:
        res["non2xx"] = int(m.group(1))
    m = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", text)
    if m:
        res["connect"], res["read"], res["write"], res["timeout"] = map(int, m.groups())
    for p in ("50", "99"):
        m = re.search(r"^\s+%s%%\s+(\S+)" % p, text, re.M)
        res["p%s_ms" % p] = _ms(m.group(1)) if m else float("nan")
    m = re.search(r"Requests/sec:\s+([\d.]+)", text)
    res["rps"] = float(m.group(1)) if m else 0.0
    return res
