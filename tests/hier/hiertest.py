"""Starting the ranks of a hierarchical group in host namespaces (hiernet)
and reading what they print (hier_rank.py), for test_hier.py and
tools/bench/bench_hier.py."""

import json
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time

import kvcoord

HERE = os.path.dirname(os.path.abspath(__file__))
RANK = os.path.join(HERE, "hier_rank.py")
DEADLINE = 120.0  # hang guard for waits, never an assertion about speed


def pythonpath():
    return os.environ.get("PYTHONPATH", "").split(":")[0] or os.path.dirname(
        os.path.dirname(kvcoord.__file__))


class Ranks:
    """size ranks over net's hosts: rank r on host layout[r]; every host's
    segment named segs[h] (made by the caller).  lines: a queue per rank."""

    def __init__(self, net, layout, segs, mode, script=RANK, **extra):
        self.net, self.layout, self.size = net, layout, len(layout)
        fd, self.store = tempfile.mkstemp(prefix="kvctest-hier-gloo-")
        os.close(fd)
        os.unlink(self.store)
        self.procs, self.lines, self.threads = [], [], []
        self.wrong = []  # (rank, line) of every step that answered a wrong MIN
        for r, h in enumerate(layout):
            cfg = {"rank": r, "size": self.size, "store": self.store, "segment": segs[h],
                   "mode": mode, "pythonpath": pythonpath()}
            cfg.update(extra.get("per_rank", {}).get(r, {}))
            cfg.update({k: v for k, v in extra.items() if k != "per_rank"})
            p = net.run(h, [sys.executable, script, json.dumps(cfg)], stdout=subprocess.PIPE,
                        stdin=subprocess.DEVNULL, text=True, start_new_session=True)
            q = queue.Queue()
            t = threading.Thread(target=self._pump, args=(r, p, q), daemon=True)
            t.start()
            self.procs.append(p)
            self.lines.append(q)
            self.threads.append(t)

    def _pump(self, r, p, q):
        for line in p.stdout:
            if line.startswith("wrong"):
                self.wrong.append((r, line.strip()))
            q.put(line.rstrip("\n"))
        q.put(None)

    def expect(self, r, prefix, deadline=DEADLINE):
        """The next line of rank r that starts with prefix (others skipped);
        its JSON part, or the rest of the line."""
        end = time.monotonic() + deadline
        while True:
            try:
                line = self.lines[r].get(timeout=max(0.01, end - time.monotonic()))
            except queue.Empty:
                raise AssertionError("rank %d printed no %r in %.0f s" % (r, prefix, deadline))
            if line is None:
                raise AssertionError("rank %d ended (status %s) before %r" %
                                     (r, self.procs[r].wait(), prefix))
            if line.startswith(prefix):
                rest = line[len(prefix):].strip()
                try:
                    return json.loads(rest)
                except ValueError:
                    return rest

    def pid(self, r):
        """The rank's python (ip netns exec execs it: the same pid)."""
        return self.procs[r].pid

    def signal(self, r, sig):
        os.kill(self.pid(r), sig)

    def wait(self, r, deadline=DEADLINE):
        return self.procs[r].wait(deadline)

    def close(self):
        for p in self.procs:
            if p.poll() is None:
                try:
                    os.kill(p.pid, signal.SIGCONT)
                    p.kill()
                except ProcessLookupError:
                    pass
        for p in self.procs:
            p.wait()
            p.stdout.close()
        try:
            os.unlink(self.store)
        except OSError:
            pass


def make_segment(name):
    with kvcoord.Segment(name, mode="fresh", role="client"):
        pass


def discard(name):
    try:
        kvcoord.unlink(name)
    except kvcoord.SegmentNotFoundError:
        pass
