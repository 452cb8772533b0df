"""The Python tests' one helper module: unique segment names, small
segments, forked children that report back over a pipe, a free loopback
port (free_port), waiting for a condition (wait_for), a child's exit status
decoded (exit_code), a child ended (stop_process), a line awaited in a process's log (wait_log), a
process's state (proc_state, wait_state), a real kvcoordd (Daemon), a real
kvcoord-worker registered in it (Worker), raw HTTP on a socket
(connect, read_answer, answer_complete, scrape: the /metrics samples) and
whether a binary is an ASan build (sanitized).  One
of each: a test that needs one imports it from here rather than writing its
own.

The tests of tests/python run from ctest as `/usr/bin/python3 -m unittest`
with PYTHONPATH set to the build tree's python/ directory and
KVCOORD_DAEMON, KVCOORD_BUILD_DIR and KVCOORD_SOURCE_DIR in the environment
(tests/python/tests.cmake).  Tests in other folders put this folder on
sys.path (`sys.path.insert(0, <tests>/python)`); without the package on the
path, everything here but SegmentCase and the kvcoord-based discard() still
works (discard() then removes /dev/shm/<name>).
"""

import http.client
import itertools
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback
import unittest

try:
    import kvcoord
except ImportError:  # a test outside tests/python that only starts kvcoordd
    kvcoord = None

# Capacities small enough for many test segments in /dev/shm at once.
SMALL = dict(max_ranks=64, max_rooms=256, arena_bytes=64 << 20, max_info_bytes=4 << 20,
             max_procs=256, world_size=8)
DEADLINE = 60.0  # hang guard for waits, never an assertion about speed
_names = itertools.count()


def new_name(tag):
    """A segment name no other test (or run) uses."""
    return "kvctest-py-%s-%d-%d" % (tag, os.getpid(), next(_names))


def discard(name):
    """Remove segment `name` if it exists."""
    if kvcoord is None:
        try:
            os.unlink("/dev/shm/" + name)
        except FileNotFoundError:
            pass
        return
    try:
        kvcoord.unlink(name)
    except kvcoord.SegmentNotFoundError:
        pass


_discard = discard  # for Daemon.stop, whose argument has its name


class SegmentCase(unittest.TestCase):
    """A fresh small segment per test (self.name, self.seg: a client handle)."""

    def setUp(self):
        self.name = new_name(type(self).__name__.lower()[:12])
        self.seg = kvcoord.Segment(self.name, mode="fresh", role="client", **SMALL)

    def tearDown(self):
        self.seg.close()
        discard(self.name)


def fork_children(n, fn, *args):
    """Fork n children running fn(i, *args) -> JSON-able result; returns
    [(pid, read_fd)].  A child's exception is reported as {"error": text}."""
    kids = []
    for i in range(n):
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            code = 0
            try:
                out = {"result": fn(i, *args)}
            except BaseException:  # reported to the parent, which fails the test
                out = {"error": traceback.format_exc()}
                code = 1
            try:
                os.write(w, json.dumps(out).encode())
            finally:
                os._exit(code)
        os.close(w)
        kids.append((pid, r))
    return kids


def collect(kids, skip=()):
    """Read every child's report and reap it; returns {index: report}."""
    out = {}
    for i, (pid, r) in enumerate(kids):
        if pid in skip:
            os.close(r)
            continue
        data = b""
        while True:
            chunk = os.read(r, 65536)
            if not chunk:
                break
            data += chunk
        os.close(r)
        os.waitpid(pid, 0)
        out[i] = json.loads(data) if data else {"error": "child %d wrote nothing" % pid}
    return out


def wait_for(cond, what="the condition", timeout=DEADLINE, step=0.005):
    """Call cond() every `step` seconds until it returns a true value, and
    return that value; AssertionError("timed out waiting for <what>") after
    `timeout` seconds (a hang guard, never an assertion about speed)."""
    end = time.monotonic() + timeout
    while True:
        v = cond()
        if v:
            return v
        if time.monotonic() > end:
            raise AssertionError("timed out waiting for " + what)
        time.sleep(step)


def wait_log(path, pattern, what=None, proc=None, timeout=DEADLINE):
    """Wait until the file at `path` (a process's log) holds a match of the
    regular expression `pattern` (re.search, multi-line text) and return
    that match (its groups are the caller's).  proc: the subprocess.Popen
    writing it - its exit before the match is an AssertionError at once.
    AssertionError("timed out waiting for <what>"), with the log's last
    lines, after `timeout` seconds (a hang guard, never an assertion about
    speed)."""
    what = what or repr(pattern)
    end = time.monotonic() + timeout
    while True:
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
        m = re.search(pattern, text, re.M)
        if m:
            return m
        if proc is not None and proc.poll() is not None:
            raise AssertionError("%s: the process exited (%s) first; its log:\n%s"
                                 % (what, proc.returncode, text[-3000:]))
        if time.monotonic() > end:
            raise AssertionError("timed out waiting for %s; the log:\n%s" % (what, text[-3000:]))
        time.sleep(0.02)


def proc_state(pid):
    """Process pid's state letter from /proc/PID/stat ("S", "R", "T" when
    stopped, "Z"...)."""
    with open("/proc/%d/stat" % pid) as f:
        return f.read().rsplit(")", 1)[1].split()[0]


def wait_state(pid, want, timeout=DEADLINE):
    """Wait until process pid is in state `want` (proc_state)."""
    wait_for(lambda: proc_state(pid) == want, "pid %d in state %s" % (pid, want), timeout,
             step=0.01)


def handles(pid, sig):
    """Whether process pid has taken signal `sig` from its default action: a
    handler installed (SigCgt of /proc/PID/status) or the signal blocked, to
    be taken by sigwait or a signalfd (SigBlk)."""
    masks = {}
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("SigCgt", "SigBlk"):
                masks[key] = int(value, 16)
    return bool((masks["SigCgt"] | masks["SigBlk"]) >> (int(sig) - 1) & 1)


def wait_handles(pid, sig, timeout=DEADLINE):
    """Wait until process pid handles signal `sig` (handles): before that, a
    signal sent to a just-started program takes its default action."""
    wait_for(lambda: handles(pid, sig), "pid %d handling signal %d" % (pid, int(sig)), timeout,
             step=0.01)


def free_port():
    """A TCP port on 127.0.0.1 that was free a moment ago (another process
    can take it before the caller binds: retry on EADDRINUSE where it matters)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def connect(port, source=None, timeout=DEADLINE):
    """A blocking TCP connection to 127.0.0.1:port, its timeout `timeout`
    seconds (a hang guard); from address `source` when given (another
    loopback address such as "127.0.0.2" stands for another host)."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.settimeout(timeout)
        if source:
            s.bind((source, 0))
        s.connect(("127.0.0.1", port))
    except BaseException:
        s.close()
        raise
    return s


def _head_length(head):
    """The Content-Length of a raw header block (bytes), 0 without one."""
    for line in head.split(b"\r\n")[1:]:
        k, _, v = line.partition(b":")
        if k.strip().lower() == b"content-length":
            return int(v)
    return 0


def answer_complete(data):
    """True when the bytes `data` hold a whole HTTP answer: its head and as
    much body as its Content-Length says (for a reader that collects the
    bytes itself, e.g. from a selector)."""
    if b"\r\n\r\n" not in data:
        return False
    head, body = data.split(b"\r\n\r\n", 1)
    return len(body) >= _head_length(head)


def read_answer(sock, buf=b""):
    """Read one HTTP answer from socket `sock`, `buf` holding bytes already
    read from it: (status, body bytes, the bytes after the answer: pass them
    as buf to read the next pipelined one).  EOFError when the server closes
    before the answer is whole."""
    while b"\r\n\r\n" not in buf:
        chunk = sock.recv(1 << 20)
        if not chunk:
            raise EOFError("closed before the answer's head was whole")
        buf += chunk
    head, rest = buf.split(b"\r\n\r\n", 1)
    clen = _head_length(head)
    while len(rest) < clen:
        chunk = sock.recv(1 << 20)
        if not chunk:
            raise EOFError("closed after %d of %d body bytes" % (len(rest), clen))
        rest += chunk
    return int(head.split()[1]), rest[:clen], rest[clen:]


def scrape(port):
    """GET /metrics of the daemon on 127.0.0.1:port as {name: value}, its
    unlabelled samples only; AssertionError unless answered 200."""
    s = connect(port)
    try:
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        status, body, _ = read_answer(s)
    finally:
        s.close()
    assert status == 200, status
    out = {}
    for line in body.decode().splitlines():
        if line and not line.startswith("#") and "{" not in line:
            name, value = line.split()[:2]
            out[name] = float(value)
    return out


def sanitized(path=None):
    """Whether the binary at `path` (default: the kvcoord extension this
    interpreter imports) is built with AddressSanitizer (KVCOORD_SANITIZE):
    it then names the ASan runtime's entry point.  A test may run fewer
    repetitions of the same cases there (every case still runs); False when
    the file cannot be read."""
    if path is None:
        if kvcoord is None:
            return False
        path = kvcoord._kvcoord.__file__
    try:
        with open(path, "rb") as f:
            return b"__asan_init" in f.read()
    except OSError:
        return False


def exit_code(status):
    """A waitpid() status as subprocess reports it: the exit code, or -N for
    a child killed by signal N (so exit_code(st) == -signal.SIGKILL)."""
    return os.waitstatus_to_exitcode(status)


def rss_kib():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024


def stop_process(proc, timeout=30, sig=signal.SIGTERM):
    """End subprocess proc: SIGCONT (it may have been stopped), then `sig`
    (SIGTERM), and wait; SIGKILL if it has not exited `timeout` seconds
    later.  Returns its exit code (exit_code's way: -N for signal N)."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGCONT)
        proc.send_signal(sig)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode


class Daemon:
    """kvcoordd serving segment `segment` on `host` (127.0.0.1; "::1" for
    IPv6): on a port the kernel picks (port=0, read back from its
    "listening" log line) or on `port`.
    exe: the daemon (default $KVCOORD_DAEMON; the test is skipped without
    one); extra: more options; env: the daemon's environment; fresh: pass
    --fresh (a new segment) or adopt the existing one; max_rooms and
    log_level: those options (None: the daemon's default); run=False: not
    started until start() is called.  start() runs it
    again on the same segment after sigkill() or stop(discard=False) (a
    restart: a new process, a new port when port=0).  Attributes: proc (its
    Popen), port, url, log (its stdout+stderr file, one per start)."""

    def __init__(self, segment, extra=(), *, exe=None, port=0, log_level="debug", env=None,
                 fresh=True, max_rooms=256, host="127.0.0.1", run=True):
        self.exe = exe or os.environ.get("KVCOORD_DAEMON")
        if not self.exe:
            raise unittest.SkipTest("KVCOORD_DAEMON not set (run the tests through ctest)")
        self.segment, self.extra, self.env = segment, list(extra), env
        self.want_port, self.log_level, self.max_rooms = port, log_level, max_rooms
        self.host = ("[%s]" if ":" in host else "%s") % host
        self.log, self.final_output, self.proc, self.port = None, "", None, None
        if run:
            self.start(fresh)

    def start(self, fresh=False):
        """Start kvcoordd (fresh: on a new segment); returns once it listens."""
        self._close_log()
        self.log = tempfile.NamedTemporaryFile(prefix="kvcoordd-py-", suffix=".log",
                                               delete=False)
        cmd = [self.exe, "--listen", "%s:%d" % (self.host, self.want_port), "--segment",
               self.segment]
        cmd += ["--fresh"] if fresh else []
        cmd += ["--max-rooms", str(self.max_rooms)] if self.max_rooms is not None else []
        cmd += ["--log-level", self.log_level] if self.log_level is not None else []
        self.proc = subprocess.Popen(cmd + self.extra, stdin=subprocess.DEVNULL, stdout=self.log,
                                     stderr=subprocess.STDOUT, env=self.env)
        try:
            m = wait_log(self.log.name, r"listening addr=%s:(\d+)" % re.escape(self.host),
                         "kvcoordd to listen", proc=self.proc)
        except BaseException:  # never leave a daemon behind a failed start
            self.proc.kill()
            self.proc.wait()
            raise
        self.port = int(m.group(1))
        self.url = "http://%s:%d" % (self.host, self.port)
        return self

    def output(self):
        """The current start's log, all of it (after stop(): as it ended)."""
        if self.log is None:
            return self.final_output
        with open(self.log.name, encoding="utf-8", errors="replace") as f:
            return f.read()

    def log_tail(self, n=4000):
        """The last n characters of the current start's log."""
        return self.output()[-n:]

    @property
    def pid(self):
        return self.proc.pid

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def request(self, method, path, body=None, headers=None):
        """One HTTP request on a new connection: (status, body text).  A
        dict or list body is sent as JSON."""
        c = http.client.HTTPConnection(self.host.strip("[]"), self.port, timeout=DEADLINE)
        try:
            if isinstance(body, (dict, list)):
                body = json.dumps(body)
            c.request(method, path, body=body, headers=headers or {})
            r = c.getresponse()
            return r.status, r.read().decode()
        finally:
            c.close()

    def rss_kib(self):
        """Its resident set now, KiB (VmRSS)."""
        with open("/proc/%d/status" % self.proc.pid, encoding="ascii") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        return 0

    def sigkill(self):
        """SIGKILL it and reap it (the segment stays)."""
        if self.proc.poll() is None:
            self.proc.kill()
        return self.proc.wait()

    def stop(self, discard=True, sig=signal.SIGTERM):
        """stop_process() it (SIGCONT, `sig`, SIGKILL after 30 s) and remove
        its log; with discard, its segment too.  Returns its exit code; a
        second call only returns it (None when it never started)."""
        if self.proc is None:
            return None
        rc = stop_process(self.proc, sig=sig)
        if self.log is not None:
            if os.environ.get("KVC_KEEP_LOGS"):
                sys.stderr.write(self.output())
            self._close_log()
            if discard:
                _discard(self.segment)
        return rc

    def _close_log(self):
        if self.log is not None:
            self.final_output = self.output()
            self.log.close()
            os.unlink(self.log.name)
            self.log = None


class Worker:
    """kvcoord-worker (`exe`) attached to `segment` as rank `rank`, its
    transfer_engine_info {session_id, weights_info_dict: weights} written
    to a file it registers (--info, --linger: it stays until stopped), its
    output in a log; returns once the worker logged its registration.
    prefix: words run before it (e.g. ["unshare", "--pid", "--fork"]: proc
    is then that program).  Attributes: proc (its Popen), pid, out (the
    log's path).  extra: more options after --linger (e.g. ["--room", "7",
    "--room-participants", "2"]: a room it opens and sets)."""

    def __init__(self, exe, segment, rank=0, *, session_id="127.0.0.1:17000",
                 weights=None, prefix=(), extra=()):
        self.info = tempfile.NamedTemporaryFile("w", prefix="worker-", suffix=".json",
                                                delete=False)
        json.dump({"rank": rank, "transfer_engine_info": {
            "session_id": session_id,
            "weights_info_dict": {"w": [1, 2, 3]} if weights is None else weights}}, self.info)
        self.info.close()
        log = tempfile.NamedTemporaryFile(prefix="worker-", suffix=".log", delete=False)
        self.out = log.name
        self.proc = subprocess.Popen(
            [*prefix, exe, "--segment", segment, "--info", self.info.name, "--linger", *extra],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        self.pid = self.proc.pid
        try:
            wait_log(self.out, r"kvcoord-worker: rank=%d\b" % rank, "the worker's registration",
                     proc=self.proc)
        except BaseException:
            self.stop()
            raise

    def output(self):
        with open(self.out, encoding="utf-8", errors="replace") as f:
            return f.read()

    def wait_output(self, pattern, what=None):
        """wait_log on its log: the match of regular expression `pattern`
        (its exit first: AssertionError)."""
        return wait_log(self.out, pattern, what, proc=self.proc)

    def stop(self, sig=signal.SIGTERM):
        """SIGCONT (it may have been stopped), then `sig` (SIGTERM), and wait
        (SIGKILL after 30 s); removes its files.  Its exit code (exit_code's
        way).  Once it has exited: only its files are removed."""
        stop_process(self.proc, sig=sig)
        for p in (self.info.name, self.out):
            try:
                os.unlink(p)
            except FileNotFoundError:
                pass
        return self.proc.returncode
