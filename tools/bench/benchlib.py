"""What the Python benchmarks in tools/bench share (the tests have
tests/python/kvctest.py; a benchmark does not import the tests' module).

A benchmark run as a script (python3 tools/bench/bench_x.py) finds this
module beside it: `from benchlib import free_port, pct, read_all`.
"""

import os
import socket


def free_port():
    """A TCP port on 127.0.0.1 that was free a moment ago (the kernel's
    choice; another process may take it before the caller binds it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pct(v, q):
    """The q-quantile (0 <= q <= 1) of the samples v: the sorted sample at
    index int(q * len(v)), the last one for q = 1 (nearest rank, no
    interpolation; v must not be empty)."""
    v = sorted(v)
    return v[min(len(v) - 1, int(q * len(v)))]


def read_all(fd):
    """Every byte from file descriptor fd (a child's pipe) until its end of
    file; closes fd."""
    data = b""
    while True:
        c = os.read(fd, 1 << 20)
        if not c:
            break
        data += c
    os.close(fd)
    return data
