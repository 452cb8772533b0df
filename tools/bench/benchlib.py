"""What the Python benchmarks in tools/bench share (the tests have
tests/python/kvctest.py; a benchmark does not import the tests' module).

A benchmark run as a script (python3 tools/bench/bench_x.py) finds this
module beside it: `from benchlib import free_port, pct, read_all`.
"""

import os
import socket
import sys


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


def run_ranks(n, target):
    """Fork n processes, ranks 0..n-1, each calling target(rank, w), w the
    write end of a pipe of its own, then leaving with os._exit: 0, or 1
    when target raised (the exception on stderr, "rank R: ...").  Once all
    are started, read each pipe to its end and reap its process, rank by
    rank.  Returns [(status, data)] in rank order: os.waitpid's status and
    the bytes the rank wrote."""
    kids = []
    for rank in range(n):
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            code = 0
            try:
                target(rank, w)
            except BaseException as e:
                sys.stderr.write("rank %d: %r\n" % (rank, e))
                code = 1
            os._exit(code)
        os.close(w)
        kids.append((pid, r))
    results = []
    for pid, r in kids:
        data = read_all(r)
        results.append((os.waitpid(pid, 0)[1], data))
    return results


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
