"""clusterlib.py - helpers of the cluster tests and benchmarks: a real
3-member etcd cluster (tools/etcd-cluster.sh, Debian's etcd-server) in a
directory of its own, and kvcoordd nodes started with --etcd."""

import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time

import requests

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "tools", "etcd-cluster.sh")
GEN = os.path.join(ROOT, "tools", "gen_model_info.py")


def have_etcd():
    return os.access("/usr/bin/etcd", os.X_OK)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(pred, timeout, step=0.02):
    """Poll pred() until it returns a true value or timeout seconds pass;
    returns (value, seconds waited)."""
    t0 = time.monotonic()
    while True:
        v = pred()
        if v:
            return v, time.monotonic() - t0
        if time.monotonic() - t0 > timeout:
            return v, time.monotonic() - t0
        time.sleep(step)


class Etcd:
    """Three etcd members on loopback ports with their own data dirs."""

    def __init__(self, base_port=None):
        self.dir = tempfile.mkdtemp(prefix="kvc-etcd-")
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
        args = [self.daemon, "--listen", "127.0.0.1:%d" % self.port, "--segment", self.segment,
                "--max-rooms", "1024", "--arena-bytes", "256M", "--etcd-ttl", str(self.ttl),
                "--cluster", self.cluster, "--node", self.name]
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
