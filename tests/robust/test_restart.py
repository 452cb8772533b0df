#!/usr/bin/python3
"""test_restart.py - kvcoordd restarts at once after SIGKILL and loses no request.

--case loop: SIGKILL and restart at once, over and over, without socket
  activation: every start binds its port (while the killed daemon's
  listening socket lingers, the new one retries, logging listen_retry).
--case activate: under a steady client load (threads registering new ranks
  and looking them up, one new connection per request), kvcoordd runs under
  systemd-socket-activate, which holds the listening socket, through a small
  supervisor (supervise.sh) that starts it again each time it dies, as
  systemd does with kvcoordd@.socket.  It is SIGKILLed several times: no
  connection is refused (they wait in the socket's backlog), and every
  registration acknowledged with 200 is served afterwards.

--case taken: a second kvcoordd on a port a live one holds fails at once
  (exit 1, no retry) with an error naming the address and the holder's pid;
  --bind-retry 0 likewise; with --bind-retry SECS it waits, and binds once
  the first one is stopped.

Prints the figures (restarts, retries, refused, resets, requests); asserts
no wall-clock time (deadlines only keep a broken daemon from hanging).
"""
import argparse
import http.client
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "load"))
import loadlib  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
from kvctest import wait_for  # noqa: E402  (the tests' one helper module)

REGISTER = "/register_transfer_engine_info"
LOOKUP = "/get_transfer_engine_info"


def read_log(path):
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def case_loop(args, work):
    port = loadlib.free_port()
    seg = "kvctest-restart-loop-%d" % os.getpid()
    restarts, retried = args.restarts, 0
    try:
        for i in range(restarts + 1):
            log = os.path.join(work, "d-%d.log" % i)
            with open(log, "w") as f:
                p = subprocess.Popen([args.daemon, "--listen", "127.0.0.1:%d" % port, "--segment",
                                      seg, "--max-rooms", "64"], stdout=f, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL)
            try:
                wait_for(lambda: " listening addr=" in read_log(log) or p.poll() is not None,
                         "start %d" % i, timeout=30, step=0.01)
                text = read_log(log)
                if " listening addr=" not in text:
                    raise AssertionError("start %d did not listen (exit %s):\n%s"
                                         % (i, p.poll(), text))
                if "listen_retry" in text:
                    # waited for the killed daemon's socket, and said so: its socket
                    # is either still listed with no process holding it, or already
                    # gone from /proc/net/tcp by the time kvcoordd looked
                    assert ("no process holds any more" in text
                            or "no socket this network namespace lists" in text), text
                    retried += 1
                status, _, _ = loadlib.get(port, "/health", timeout=10)
                assert status == 200, status
            finally:
                p.kill()  # SIGKILL, then restart at once
                p.wait()
    finally:
        try:
            os.unlink("/dev/shm/" + seg)
        except FileNotFoundError:
            pass
    print("restart loop: %d SIGKILL + immediate restarts, %d bound every time, %d of them "
          "after waiting for the old socket (listen_retry)" % (restarts, restarts, retried))


def case_taken(args, work):
    port = loadlib.free_port()
    addr = "127.0.0.1:%d" % port
    seg = "kvctest-restart-taken-%d" % os.getpid()
    procs = []

    def start(name, *extra):
        log = os.path.join(work, name + ".log")
        with open(log, "w") as f:
            p = subprocess.Popen([args.daemon, "--listen", addr, "--segment", seg + name,
                                  "--max-rooms", "64"] + list(extra), stdout=f,
                                 stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        procs.append(p)
        return p, log

    try:
        a, alog = start("a")
        wait_for(lambda: " listening addr=" in read_log(alog) or a.poll() is not None, "first",
                 timeout=30, step=0.01)
        assert a.poll() is None, read_log(alog)
        holder = "held by pid %d (kvcoordd), which listens on it" % a.pid
        for name, extra in (("b", ()), ("b0", ("--bind-retry", "0"))):
            b, blog = start(name, *extra)
            rc = b.wait(timeout=120)
            text = read_log(blog)
            assert rc == 1, (name, rc, text)
            assert "listen_failed addr=%s" % addr in text, text
            assert "cannot listen on %s: Address already in use; %s" % (addr, holder) in text, text
            assert "listen_retry" not in text, text  # at once: not retried
            print("second daemon %s: exit 1 at once, names the holder: %s"
                  % (" ".join(extra) or "(no --bind-retry)",
                     [ln for ln in text.splitlines() if "listen_failed" in ln][0]))
        c, clog = start("c", "--bind-retry", "120")
        wait_for(lambda: "listen_retry" in read_log(clog) or c.poll() is not None,
                 "--bind-retry to wait", timeout=60, step=0.01)
        text = read_log(clog)
        assert c.poll() is None and holder in text and "--bind-retry" in text, text
        a.send_signal(signal.SIGTERM)
        a.wait(timeout=60)
        wait_for(lambda: " listening addr=" in read_log(clog) or c.poll() is not None,
                 "--bind-retry to bind once the holder stopped", timeout=60, step=0.01)
        text = read_log(clog)
        assert c.poll() is None and "listen_bound addr=%s" % addr in text, text
        status, _, _ = loadlib.get(port, "/health", timeout=10)
        assert status == 200, status
        print("--bind-retry 120: waited for pid %d, bound once it stopped" % a.pid)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
        for name in ("a", "b", "b0", "c"):
            try:
                os.unlink("/dev/shm/" + seg + name)
            except FileNotFoundError:
                pass


class Load:
    """Client threads: each registers new ranks (one new connection per
    request) and looks up ranks already acknowledged."""

    def __init__(self, port, threads, max_rank):
        self.port = port
        self.lock = threading.Lock()
        self.next_rank = 0
        self.max_rank = max_rank
        self.acked = {}
        self.refused = self.resets = self.requests = self.lookups = 0
        self.bad = []
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self.run, daemon=True) for _ in range(threads)]

    def request(self, method, target, body=None):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            c.request(method, target, body=body)
            r = c.getresponse()
            return r.status, r.read()
        finally:
            c.close()

    def one(self, method, target, body=None):
        """(status, body), or None after a connection error (counted)."""
        with self.lock:
            self.requests += 1
        try:
            return self.request(method, target, body)
        except ConnectionRefusedError:
            with self.lock:
                self.refused += 1
        except (ConnectionError, http.client.HTTPException, OSError):
            with self.lock:  # a request in flight when the daemon was killed
                self.resets += 1
        return None

    def run(self):
        while not self.stop.is_set():
            with self.lock:
                if self.next_rank >= self.max_rank:
                    break
                rank = self.next_rank
                self.next_rank += 1
            sid = "10.1.%d.%d:%d" % (rank // 250, rank % 250, 16000 + rank)
            body = loadlib.reg_body(rank, sid, loadlib.weights(8, rank))
            while not self.stop.is_set():  # identical re-registration is a no-op
                r = self.one("PUT", REGISTER, body)
                if r is None:
                    continue
                if r[0] == 200:
                    with self.lock:
                        self.acked[rank] = sid
                else:
                    self.bad.append((rank, r))
                break
            with self.lock:
                ranks = list(self.acked)
            if ranks:
                look = ranks[rank % len(ranks)]
                r = self.one("GET", "%s?rank=%d" % (LOOKUP, look))
                with self.lock:
                    self.lookups += 1
                if r is not None and r[0] != 200:
                    self.bad.append((look, r))

    def acks(self):
        with self.lock:
            return len(self.acked)


def case_activate(args, work):
    if not shutil.which("systemd-socket-activate"):
        print("SKIP: systemd-socket-activate not found (Debian package 'systemd')")
        return 77
    port = loadlib.free_port()
    seg = "kvctest-restart-sa-%d" % os.getpid()
    pidfile, stopfile = os.path.join(work, "daemon.pid"), os.path.join(work, "stop")
    logpath = os.path.join(work, "daemons.log")
    sup = os.path.join(os.path.dirname(os.path.abspath(__file__)), "supervise.sh")
    cmd = ["systemd-socket-activate", "-l", "127.0.0.1:%d" % port, "/bin/sh", sup, pidfile,
           stopfile, args.daemon, "--listen", "127.0.0.1:%d" % port, "--segment", seg,
           "--max-ranks", "4096", "--max-rooms", "64"]
    with open(logpath, "w") as log:
        sup_proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL)
    load = Load(port, args.threads, args.ranks)
    kills = []
    try:
        # The socket listens before anything runs: the first request starts the daemon.
        wait_for(lambda: "Listening on" in read_log(logpath), "systemd-socket-activate",
                 timeout=30, step=0.01)
        for t in load.threads:
            t.start()
        wait_for(lambda: load.acks() >= 20, "first registrations", timeout=60, step=0.01)
        for k in range(args.kills):
            before = load.acks()
            wait_for(lambda: load.acks() >= before + 15, "registrations before kill %d" % k,
                     timeout=60, step=0.01)
            pid = int(open(pidfile).read())
            os.kill(pid, signal.SIGKILL)
            kills.append(pid)
            wait_for(lambda: os.path.exists(pidfile) and int(open(pidfile).read() or 0) != pid,
                     "restart %d" % k, timeout=30, step=0.01)
        for t in load.threads:  # the load goes on until every rank is registered
            t.join(120)
        load.stop.set()
        # Every acknowledged registration is served, equal to what was sent.
        missing = []
        for rank, sid in sorted(load.acked.items()):
            status, data = load.request("GET", "%s?rank=%d" % (LOOKUP, rank))
            if status != 200:
                missing.append((rank, status, data[:200]))
                continue
            got = json.loads(data)["remote_instance_transfer_engine_info"]
            if got[0] != sid or got[1] != loadlib.weights(8, rank):
                missing.append((rank, "differs", got[0]))
        daemon_log = read_log(logpath)
        starts = daemon_log.count("socket_activation")
        print("socket activation: %d SIGKILLs under load (%d client threads), %d daemon starts; "
              "%d requests (%d lookups), %d registrations acknowledged, %d connections "
              "refused, %d requests cut by a kill (retried), %d acknowledged registrations "
              "missing after the restarts" % (len(kills), args.threads, starts, load.requests,
                                               load.lookups, len(load.acked), load.refused,
                                               load.resets, len(missing)))
        assert load.refused == 0, "%d connections refused" % load.refused
        assert not missing, missing[:10]
        assert not load.bad, load.bad[:10]
        assert starts == len(kills) + 1, daemon_log[-3000:]
        return 0
    finally:
        load.stop.set()
        open(stopfile, "w").close()
        try:
            os.kill(int(open(pidfile).read()), signal.SIGTERM)
        except (OSError, ValueError):
            pass
        try:
            sup_proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            sup_proc.kill()
            sup_proc.wait()
        try:
            os.unlink("/dev/shm/" + seg)
        except FileNotFoundError:
            pass


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--daemon", required=True)
    ap.add_argument("--case", choices=("loop", "activate", "taken"), required=True)
    ap.add_argument("--restarts", type=int, default=30)
    ap.add_argument("--kills", type=int, default=5)
    ap.add_argument("--threads", type=int, default=4)
    ap.add_argument("--ranks", type=int, default=2000)
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="kvc-restart-")
    try:
        rc = {"loop": case_loop, "activate": case_activate, "taken": case_taken}[args.case](
            args, work)
        if rc == 77:
            return 77
        print("1 passed, 0 failed")
        return 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
