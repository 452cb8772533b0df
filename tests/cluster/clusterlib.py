"""clusterlib.py - helpers of the cluster tests and benchmarks: a real
3-member etcd cluster (tools/etcd-cluster.sh, Debian's etcd-server) in a
directory of its own, and kvcoordd nodes started with --etcd."""

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import requests

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import kvctest  # noqa: E402  (the tests' one helper module)
from kvctest import free_port  # noqa: E402,F401  (cl.free_port: the callers' name)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "tools", "etcd-cluster.sh")
GEN = os.path.join(ROOT, "tools", "gen_model_info.py")


def have_etcd():
    return os.access("/usr/bin/etcd", os.X_OK)


def logs_if_failed(test, nodes, lines=60):
    """From a tearDown: when test failed, print to stderr the last lines of
    each node's log, so that a failure in CI, where the logs are removed,
    shows what the daemons saw."""
    result = getattr(getattr(test, "_outcome", None), "result", None)
    bad = getattr(result, "failures", []) + getattr(result, "errors", [])
    if not any(t is test for t, _ in bad):
        return
    for n in nodes:
        try:
            with open(n.log, encoding="utf-8", errors="replace") as f:
                kept = f.read().splitlines()
        except OSError as e:
            kept = ["(log unreadable: %s)" % e]
        sys.stderr.write("---- node %s's log, last %d lines of %d ----\n"
                         % (n.name, min(lines, len(kept)), len(kept)))
        sys.stderr.write("\n".join(kept[-lines:]) + "\n")


def wait_for(pred, timeout, step=0.02):
    """kvctest.wait_for's loop with this library's answer: (pred's last
    value, seconds waited), the value false when timeout seconds passed (the
    callers assert it with their own message, and some bound the seconds)."""
    last = [None]

    def probe():
        last[0] = pred()
        return last[0]

    t0 = time.monotonic()
    try:
        kvctest.wait_for(probe, what="pred", timeout=timeout, step=step)
    except AssertionError as e:  # timed out: last[0] is pred's last, false, value
        if str(e) != "timed out waiting for pred":
            raise  # pred's own
    return last[0], time.monotonic() - t0


def all_threads_stopped(pid):
    """Whether every thread of process pid is stopped (state T; a thread's
    id reads in /proc as a process's; one that ended meanwhile counts)."""
    for t in os.listdir("/proc/%d/task" % pid):
        try:
            if kvctest.proc_state(int(t)) != "T":
                return False
        except FileNotFoundError:
            pass
    return True


class Etcd:
    """Three etcd members on loopback ports with their own data dirs."""

    def __init__(self, base_port=None, parent=None):
        """parent: the directory the members' data dirs go under (default
        the system's temporary directory; e.g. /dev/shm for tmpfs)."""
        self.dir = tempfile.mkdtemp(prefix="kvc-etcd-", dir=parent)
        # Below the ephemeral range (32768..): no outgoing connection holds them.
        self.port = base_port or 20000 + (os.getpid() % 1500) * 8
        self.endpoints = ",".join("http://127.0.0.1:%d" % (self.port + 2 * i) for i in range(3))

    def run(self, *args):
        subprocess.run([SCRIPT, *args, "--dir", self.dir, "--port", str(self.port)], check=True,
                       stdout=subprocess.DEVNULL)

    def start(self):
        self.run("start", "--wipe")
        return self

    def stop(self):
        self.run("stop")

    def restart(self):
        self.run("start")

    def kill_member(self, i):
        self.run("kill-member", str(i))

    def start_member(self, i):
        self.run("start-member", str(i))

    def member_pid(self, i):
        with open(os.path.join(self.dir, "m%d.pid" % i)) as f:
            return int(f.read())

    def member_of(self, url):
        """The member number (0..2) of a client URL."""
        port = int(url.rstrip("/").rsplit(":", 1)[1])
        return (port - self.port) // 2

    def freeze(self, *members):
        """SIGSTOP members: their sockets stay open and the kernel still
        accepts connections and answers TCP keep-alives; nothing answers.
        Returns once every thread of each member has stopped: kill() only
        starts the stop, and until one of a member's threads runs to carry
        it out the others go on answering (a put answered 40-150 ms after
        every member was sent SIGSTOP, on a loaded host)."""
        pids = [self.member_pid(i) for i in members or range(3)]
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
        for pid in pids:
            kvctest.wait_for(lambda p=pid: all_threads_stopped(p),
                             "every thread of etcd member pid %d stopped" % pid, step=0.001)

    def thaw(self, *members):
        for i in members or range(3):
            os.kill(self.member_pid(i), signal.SIGCONT)

    def ctl(self, *args, user=None):
        cmd = ["etcdctl", "--endpoints=" + self.endpoints]
        if user:
            cmd.append("--user=" + user)
        return subprocess.run(cmd + list(args), env=dict(os.environ, ETCDCTL_API="3"),
                              capture_output=True, text=True, timeout=30)

    def close(self):
        try:
            self.stop()
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)


class Node:
    """One kvcoordd with --etcd, on a free loopback port and its own
    segment."""

    def __init__(self, daemon, etcd_endpoints, cluster, name, ttl=2, extra=(), segment=None,
                 fresh=True, logdir=None):
        self.daemon, self.endpoints, self.cluster, self.name, self.ttl = (
            daemon, etcd_endpoints, cluster, name, ttl)
        self.extra = list(extra)
        self.port = free_port()
        self.segment = segment or "kvctest-cl-%d-%s-%s" % (os.getpid(), cluster, name)
        self.fresh = fresh
        self.url = "http://127.0.0.1:%d" % self.port
        self.logdir = logdir or tempfile.gettempdir()
        self.log = os.path.join(self.logdir, "%s.log" % self.segment)
        self.proc = None

    def start(self, wait=True):
        args = [self.daemon, "--listen", "127.0.0.1:%d" % self.port, "--segment", self.segment]
        # these defaults unless extra gives its own (kvcoordd refuses an option twice)
        for opt, value in (("--max-rooms", "1024"), ("--arena-bytes", "256M")):
            if opt not in self.extra:
                args += [opt, value]
        args += ["--etcd-ttl", str(self.ttl), "--cluster", self.cluster, "--node", self.name]
        if self.endpoints:
            args += ["--etcd", self.endpoints]
        if self.fresh:
            args.append("--fresh")
            self.fresh = False  # a restart keeps the segment
        self.logf = open(self.log, "a")
        self.proc = subprocess.Popen(args + self.extra, stdout=self.logf, stderr=self.logf)
        if wait:
            wait_for(self.healthy, 10)
        return self

    def healthy(self):
        try:
            return requests.get(self.url + "/health", timeout=1).status_code == 200
        except requests.RequestException:
            return False

    def stop(self, sig=signal.SIGTERM):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.logf.close()

    def kill(self):
        self.proc.kill()
        self.proc.wait()
        self.logf.close()

    def register(self, rank, sid, info):
        body = {"rank": rank, "transfer_engine_info": {"session_id": sid,
                                                       "weights_info_dict": info}}
        r = requests.put(self.url + "/register_transfer_engine_info", json=body, timeout=30)
        r.raise_for_status()

    def register_raw(self, body_bytes):
        r = requests.put(self.url + "/register_transfer_engine_info", data=body_bytes, timeout=60)
        r.raise_for_status()

    def withdraw(self, rank):
        r = requests.delete(self.url + "/transfer_engine_info?rank=%d" % rank, timeout=5)
        r.raise_for_status()

    def lookup(self, rank):
        """(status, body bytes, headers) of GET /get_transfer_engine_info."""
        r = requests.get(self.url + "/get_transfer_engine_info?rank=%d" % rank, timeout=30)
        return r.status_code, r.content, r.headers

    def cluster_view(self):
        return requests.get(self.url + "/cluster", timeout=5).json()

    def metrics(self):
        text = requests.get(self.url + "/metrics", timeout=5).text
        out = {}
        for line in text.splitlines():
            if line.startswith("kvcoord_cluster_"):
                k, v = line.rsplit(" ", 1)
                out[k] = float(v)
        return out

    def room(self, room):
        r = requests.get(self.url + "/rooms/%d" % room, timeout=5)
        return r.status_code, (r.json() if r.status_code == 200 else None)

    def fail_room(self, room, rank, reason, code):
        r = requests.put(self.url + "/rooms/%d/failure" % room,
                         json={"rank": rank, "reason": reason, "code": code}, timeout=10)
        r.raise_for_status()
        return r.json()

    def logtext(self):
        with open(self.log) as f:
            return f.read()

    def unlink(self):
        try:
            os.unlink("/dev/shm/" + self.segment)
        except FileNotFoundError:
            pass


def probe(binary, segment, rank, wait_ms=0):
    """What libkvcoord returns on this node: (meta dict, info bytes)."""
    p = subprocess.run([binary, segment, str(rank), str(wait_ms)], capture_output=True,
                       timeout=60)
    head, _, rest = p.stdout.partition(b"\n")
    return json.loads(head), rest


def gen_model(model, out, tp=8, base_port=16000, entries=None):
    args = ["/usr/bin/python3", GEN, "--model", model, "--tp", str(tp), "--base-port",
            str(base_port), "--out", out]
    if entries:
        args += ["--entries", str(entries)]
    subprocess.run(args, check=True, stdout=subprocess.DEVNULL)


def make_certs(d):
    """A throw-away CA, a server certificate for 127.0.0.1 (also allowed
    clientAuth: etcd 3.4's JSON gateway presents it to its own gRPC server),
    one allowed serverAuth only, and a client certificate, made with
    openssl; a second CA that signed none.  Returns a dict of PEM paths."""
    p = {k: os.path.join(d, k + ".pem") for k in (
        "ca", "ca_key", "server", "server_key", "server_only", "server_only_key", "client",
        "client_key", "other_ca", "other_ca_key")}

    def ossl(*args):
        subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)

    for ca, key, cn in (("ca", "ca_key", "kvcoord test CA"),
                        ("other_ca", "other_ca_key", "another CA")):
        ossl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj",
             "/CN=" + cn, "-keyout", p[key], "-out", p[ca])
    san = "subjectAltName=IP:127.0.0.1\n"
    for who, ext in (("server", san + "extendedKeyUsage=serverAuth,clientAuth"),
                     ("server_only", san + "extendedKeyUsage=serverAuth"),
                     ("client", "extendedKeyUsage=clientAuth")):
        csr, extf = os.path.join(d, who + ".csr"), os.path.join(d, who + ".ext")
        with open(extf, "w") as f:
            f.write(ext + "\n")
        ossl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=" + who, "-keyout",
             p[who + "_key"], "-out", csr)
        ossl("x509", "-req", "-in", csr, "-CA", p["ca"], "-CAkey", p["ca_key"],
             "-CAcreateserial", "-days", "2", "-extfile", extf, "-out", p[who])
    return p


class TlsEtcd:
    """One etcd member whose client URL is https with client-certificate
    authentication (peer traffic stays on loopback http)."""

    def __init__(self, certs, server="server"):
        self.server = server
        self.dir = tempfile.mkdtemp(prefix="kvc-etcd-tls-")
        self.port, self.peer_port = free_port(), free_port()
        self.endpoints = "https://127.0.0.1:%d" % self.port
        self.certs = certs
        self.proc = None

    def start(self):
        peer = "http://127.0.0.1:%d" % self.peer_port
        c = self.certs
        self.log = open(os.path.join(self.dir, "etcd.log"), "w")
        self.proc = subprocess.Popen(
            ["etcd", "--name", "tls0", "--data-dir", os.path.join(self.dir, "data"),
             "--listen-client-urls", self.endpoints, "--advertise-client-urls", self.endpoints,
             "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
             "--initial-cluster", "tls0=" + peer, "--cert-file", c[self.server], "--key-file",
             c[self.server + "_key"], "--trusted-ca-file", c["ca"], "--client-cert-auth"],
            stdout=self.log, stderr=subprocess.STDOUT)
        ok, _ = wait_for(lambda: self.ctl("endpoint", "health").returncode == 0, 30, 0.2)
        if not ok:
            raise RuntimeError("TLS etcd did not start: %s" % self.logtext()[-2000:])
        return self

    def ctl(self, *args):
        c = self.certs
        return subprocess.run(
            ["etcdctl", "--endpoints=" + self.endpoints, "--cacert", c["ca"], "--cert",
             c["client"], "--key", c["client_key"], *args],
            env=dict(os.environ, ETCDCTL_API="3"), capture_output=True, text=True, timeout=30)

    def logtext(self):
        with open(os.path.join(self.dir, "etcd.log"), errors="replace") as f:
            return f.read()

    def close(self):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc:
            self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)
