"""Network namespaces standing for hosts, for the hierarchical collective's
tests: a hub namespace with a bridge, and one namespace per "host" joined to
it by a veth pair (the host's end is named hv0 in every host namespace, its
address 10.213.S.(i+1)/24).  /dev/shm and the file system are shared, so
each host gets its own segment name.  Processes run in a host with
`ip netns exec`.  Everything is removed by close() (and the namespaces die
with their last process anyway: none is left behind by a crashed test once
the namespaces are deleted)."""

import os
import shutil
import subprocess
import unittest

IFNAME = "hv0"


def sh(*cmd):
    subprocess.run(cmd, check=True, capture_output=True, text=True)


def require_root():
    if os.geteuid() != 0:
        raise unittest.SkipTest("needs root (ip netns)")
    if not shutil.which("ip"):
        raise unittest.SkipTest("no ip(8) (iproute2)")
    probe = subprocess.run(["ip", "netns", "add", "kvhprobe%d" % os.getpid()],
                           capture_output=True, text=True)
    if probe.returncode != 0:
        raise unittest.SkipTest("ip netns add refused here: " + probe.stderr.strip())
    sh("ip", "netns", "del", "kvhprobe%d" % os.getpid())


class Net:
    """hosts network namespaces joined by a bridge."""

    def __init__(self, hosts, tag):
        self.prefix = "kvh%d%s" % (os.getpid() % 100000, tag)
        self.hub = self.prefix + "hub"
        self.hosts = [self.prefix + "n%d" % i for i in range(hosts)]
        subnet = 20 + os.getpid() % 200
        self.addrs = ["10.213.%d.%d" % (subnet, i + 1) for i in range(hosts)]
        self.made = []
        try:
            self._make()
        except subprocess.CalledProcessError as e:
            # Where the network cannot be built (seen in a chroot made by
            # mmdebstrap: `ip link add ... type bridge` exits 255), the tests
            # cannot run: skip, naming the command and what it said.
            self.close()
            raise unittest.SkipTest("cannot build the test network here: %s: %s"
                                    % (" ".join(e.cmd), (e.stderr or "").strip()))
        except Exception:
            self.close()
            raise

    def _make(self):
        sh("ip", "netns", "add", self.hub)
        self.made.append(self.hub)
        sh("ip", "-n", self.hub, "link", "add", "br0", "type", "bridge")
        sh("ip", "-n", self.hub, "link", "set", "br0", "up")
        sh("ip", "-n", self.hub, "link", "set", "lo", "up")
        for i, ns in enumerate(self.hosts):
            sh("ip", "netns", "add", ns)
            self.made.append(ns)
            peer = "p%d" % i
            sh("ip", "-n", ns, "link", "add", IFNAME, "type", "veth", "peer", "name", peer,
               "netns", self.hub)
            sh("ip", "-n", self.hub, "link", "set", peer, "master", "br0")
            sh("ip", "-n", self.hub, "link", "set", peer, "up")
            sh("ip", "-n", ns, "addr", "add", self.addrs[i] + "/24", "dev", IFNAME)
            sh("ip", "-n", ns, "link", "set", IFNAME, "up")
            sh("ip", "-n", ns, "link", "set", "lo", "up")

    def run(self, host, argv, **kw):
        """Popen of argv inside host (an index)."""
        return subprocess.Popen(["ip", "netns", "exec", self.hosts[host], *argv], **kw)

    def close(self):
        for ns in reversed(self.made):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        self.made = []
