"""kvcoord.mooncake.TransferEngine between real processes (mooncake_peer.py):
Mooncake's surface and return values, bytes checked by sha256 on both sides,
scattered pages (no two adjacent on either side: nothing an engine could
merge), many caller threads, a peer SIGKILLed mid-call, a peer restarted at
the same session id with new addresses, out-of-region addresses,
unregistering while a call is in flight, and the seeds' flow through a real
kvcoordd (PUT /register_transfer_engine_info, GET, batch_transfer_sync_read).
"""

import ctypes
import hashlib
import json
import mmap
import os
import random
import select
import signal
import subprocess
import sys
import threading
import time
import unittest
import urllib.request

from kvctest import DEADLINE, Daemon, new_name, proc_state, wait_for

from kvcoord import _engine
from kvcoord.mooncake import TransferEngine

HERE = os.path.dirname(os.path.abspath(__file__))
MiB = 1 << 20


def all_threads_stopped(pid):
    """Whether every thread of process pid is stopped (state T; a thread's
    id reads in /proc as a process's)."""
    return all(proc_state(int(t)) == "T" for t in os.listdir("/proc/%d/task" % pid))


class Peer:
    """mooncake_peer.py in its own process."""

    def __init__(self, **init):
        self.proc = subprocess.Popen([sys.executable, os.path.join(HERE, "mooncake_peer.py")],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        r = self.cmd(op="init", **init)
        self.sid, self.addr, self.desc = r["sid"], r["addr"], r["desc"]

    def cmd(self, **c):
        self.proc.stdin.write(json.dumps(c) + "\n")
        self.proc.stdin.flush()
        ready, _, _ = select.select([self.proc.stdout], [], [], DEADLINE)
        line = self.proc.stdout.readline() if ready else ""
        if not line:
            raise AssertionError("peer process gave no answer to %s (exit %s)"
                                 % (c["op"], self.proc.poll()))
        return json.loads(line)

    def hash(self, ranges, guard=False):
        return self.cmd(op="hash", ranges=ranges, guard=guard)["sha"]

    def kill(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()
        self.proc.stdin.close()
        self.proc.stdout.close()

    def close(self):
        if self.proc.poll() is None:
            try:
                self.cmd(op="exit")
            except (AssertionError, OSError):
                pass
        self.kill()


def buffer(size, seed=None):
    m = mmap.mmap(-1, size)
    if seed is not None:
        m[:] = random.Random(seed).randbytes(size)
    return m, ctypes.addressof(ctypes.c_char.from_buffer(m))


def scattered(npages, total_pages, seed):
    """npages page indices out of total_pages, shuffled, no two adjacent."""
    idx = list(range(0, total_pages, 2))
    random.Random(seed).shuffle(idx)
    assert len(idx) >= npages
    return idx[:npages]


def sha_of(m, ranges):
    h = hashlib.sha256()
    for off, n in ranges:
        h.update(m[off:off + n])
    return h.hexdigest()


class EngineCase(unittest.TestCase):
    def setUp(self):
        self.peers = []
        self.engine = TransferEngine()
        self.assertEqual(self.engine.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", ""), 0,
                         self.engine.last_error())

    def tearDown(self):
        self.engine.close()
        for p in self.peers:
            p.close()

    def peer(self, **init):
        p = Peer(**init)
        self.peers.append(p)
        self.connect(p)
        return p

    def connect(self, p):
        """Before the transfer engine could fetch descriptors, they were handed over."""
        if not _engine.HAVE_FETCH:
            self.assertEqual(self.engine.peer_add(p.desc), 0, self.engine.last_error())

    def local(self, size, seed):
        m, a = buffer(size, seed)
        self.assertEqual(self.engine.register_memory(a, size), 0, self.engine.last_error())
        return m, a


class Transfers(EngineCase):
    def writes(self, page, per_call, threads, calls):
        """threads callers, each `calls` calls of per_call scattered pages."""
        npages = per_call * threads
        size = 2 * npages * page
        peer = self.peer(size=size)
        m, a = self.local(size, seed=1)
        src = scattered(npages, size // page, seed=2)
        dst = scattered(npages, size // page, seed=3)
        rcs, errs = [], []

        def work(t):
            s = src[t * per_call:(t + 1) * per_call]
            d = dst[t * per_call:(t + 1) * per_call]
            for _ in range(calls):
                rc = self.engine.batch_transfer_sync_write(
                    peer.sid, [a + i * page for i in s], [peer.addr + i * page for i in d],
                    [page] * per_call)
                rcs.append(rc)
                if rc:
                    errs.append(self.engine.last_error())

        ths = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
        [t.start() for t in ths]
        [t.join() for t in ths]
        self.assertEqual(rcs, [0] * threads * calls, errs[:3])
        self.assertEqual(peer.hash([[i * page, page] for i in dst]),
                         sha_of(m, [[i * page, page] for i in src]))

    def test_4k_pages_1024_per_call_from_4_threads(self):
        self.writes(4096, 1024, 4, 5)

    def test_64k_pages_256_per_call(self):
        self.writes(64 << 10, 256, 1, 3)

    def test_single_write_and_mooncake_surface(self):
        peer = self.peer(size=MiB)
        m, a = self.local(MiB, seed=4)
        e = self.engine
        self.assertEqual(e.transfer_sync_write(peer.sid, a + 4096, peer.addr + 8192, 1000), 0)
        self.assertEqual(peer.hash([[8192, 1000]]), sha_of(m, [[4096, 1000]]))
        self.assertEqual(e.get_session_id(), "127.0.0.1:%d" % e.get_rpc_port())
        # asynchronous batches, Mooncake's ids and status
        ids = [e.batch_transfer_async_write(peer.sid, [a + k * 65536], [peer.addr + k * 65536],
                                            [65536]) for k in range(4)]
        self.assertTrue(all(ids), e.last_error())
        self.assertEqual(e.get_batch_transfer_status(ids), 0)
        self.assertEqual(peer.hash([[0, 4 * 65536]]), sha_of(m, [[0, 4 * 65536]]))
        bid = e.transfer_submit_write(peer.sid, a, peer.addr, 4096)
        self.assertGreater(bid, 0)
        end = time.monotonic() + DEADLINE
        while (st := e.transfer_check_status(bid)) == 0 and time.monotonic() < end:
            time.sleep(0.001)
        self.assertEqual(st, 1)
        # consumed, as Mooncake frees it: -1, and last_error() says so
        self.assertEqual(e.transfer_check_status(bid), -1)
        self.assertIn("transfer_check_status: batch %d was already collected: "
                      "transfer_check_status reported 1 (done) for it" % bid, e.last_error())
        self.assertEqual(e.get_batch_transfer_status([bid]), -1)
        self.assertIn("get_batch_transfer_status: batch %d was already collected" % bid,
                      e.last_error())
        self.assertEqual(e.transfer_check_status(ids[0]), -1)
        self.assertIn("get_batch_transfer_status reported 1 (done)", e.last_error())
        self.assertEqual(e.transfer_check_status(bid + 1000), -1)
        self.assertIn("batch %d is unknown" % (bid + 1000), e.last_error())
        # failures: negative, with a reason, logged once
        with self.assertLogs("kvcoord.mooncake", "WARNING") as logs:
            self.assertEqual(e.batch_transfer_sync_write(peer.sid, [a], [peer.addr], []), -1)
        self.assertIn("differ in length", e.last_error())
        self.assertEqual(len(logs.output), 1)
        self.assertEqual(e.register_memory(a + 100, 10), -7)  # overlaps: ERR_ADDRESS_OVERLAPPED
        self.assertEqual(e.unregister_memory(a + 1), -3)  # ERR_ADDRESS_NOT_REGISTERED
        self.assertEqual(e.send_probe(peer.sid) if _engine.HAVE_FETCH else 0, 0)
        other = TransferEngine()
        self.assertEqual(other.initialize("127.0.0.1", "etcd://127.0.0.1:2379", "tcp", ""), -1)
        self.assertIn("P2PHANDSHAKE", other.last_error())

    def test_out_of_region_fails_and_writes_nothing(self):
        # the peer registers only the second half of its buffer
        peer = self.peer(size=2 * MiB, seed=5, register=[MiB, MiB])
        before = peer.hash([[0, MiB]])
        m, a = self.local(MiB, seed=6)
        rc = self.engine.batch_transfer_sync_write(
            peer.sid, [a, a + 8192], [peer.addr + MiB, peer.addr + MiB - 4096], [4096, 8192])
        self.assertEqual(rc, -1)
        why = self.engine.last_error()
        self.assertIn(peer.sid, why)
        self.assertIn("not inside a region", why)
        self.assertEqual(peer.hash([[0, MiB]]), before)
        # unregistered local memory: refused the same way
        n, b = buffer(4096)
        self.assertEqual(self.engine.transfer_sync_write(peer.sid, b, peer.addr + MiB, 4096), -1)
        self.assertIn("local range", self.engine.last_error())
        self.assertEqual(self.engine.transfer_sync_write(peer.sid, a, peer.addr + MiB, 4096), 0)

    @unittest.skipUnless(_engine.HAVE_READ, "this build's transfer engine has no READ")
    def test_whole_buffer_read(self):
        size = 32 * MiB
        peer = self.peer(size=size, seed=7)
        m, a = self.local(size, seed=None)
        self.assertEqual(self.engine.transfer_sync_read(peer.sid, a, peer.addr, size), 0,
                         self.engine.last_error())
        self.assertEqual(sha_of(m, [[0, size]]), peer.hash([[0, size]]))
        # scattered reads, 64 KiB pages
        page = 65536
        src = scattered(128, size // page, 8)
        dst = scattered(128, size // page, 9)
        m[:] = bytes(size)
        self.assertEqual(self.engine.batch_transfer_sync_read(
            peer.sid, [a + i * page for i in dst], [peer.addr + i * page for i in src],
            [page] * 128), 0, self.engine.last_error())
        self.assertEqual(sha_of(m, [[i * page, page] for i in dst]),
                         peer.hash([[i * page, page] for i in src]))

    def test_unregister_waits_for_the_call_in_flight(self):
        size = 256 * MiB
        peer = self.peer(size=size)
        m, a = self.local(size, seed=None)
        page = MiB
        order = []
        # handshake done: the big write below is in flight at once
        self.assertEqual(self.engine.transfer_sync_write(peer.sid, a, peer.addr, 4096), 0)

        def write():
            rc = self.engine.batch_transfer_sync_write(
                peer.sid, [a + i * page for i in range(256)],
                [peer.addr + i * page for i in range(256)], [page] * 256)
            order.append(("write", rc))

        t = threading.Thread(target=write)
        sent = self.engine.stats()["bytes_sent"]
        t.start()
        wait_for(lambda: self.engine.stats()["bytes_sent"] > sent or order, "the write to start")
        rc = self.engine.unregister_memory(a)
        # when it returns, every byte of the call was acknowledged (none in flight)
        acked = self.engine.stats()["bytes_sent"] - sent
        t.join()
        self.assertEqual(rc, 0)
        self.assertEqual(order, [("write", 0)])
        self.assertGreaterEqual(acked, 256 * page)
        self.assertEqual(self.engine.transfer_sync_write(peer.sid, a, peer.addr, 4096), -1)
        self.assertIn("local range", self.engine.last_error())


class PeerFailures(EngineCase):
    def test_peer_killed_mid_call(self):
        size = 128 * MiB
        doomed = self.peer(size=size)
        alive = self.peer(size=size)
        m, a = self.local(size, seed=None)
        page = 64 << 10
        n = 256
        src = [a + i * page for i in scattered(n, size // page, 10)]
        dst = scattered(n, size // page, 11)
        result = {}

        def hammer(peer, key):
            outcome = []
            end = time.monotonic() + DEADLINE
            result[key] = outcome
            while not result.get("stop") and time.monotonic() < end:
                t0 = time.monotonic()
                rc = self.engine.batch_transfer_sync_write(
                    peer.sid, src, [peer.addr + i * page for i in dst], [page] * n)
                outcome.append((rc, t0, time.monotonic(), self.engine.last_error()))
                if rc:
                    break

        th = [threading.Thread(target=hammer, args=(doomed, "doomed")),
              threading.Thread(target=hammer, args=(alive, "alive"))]
        [t.start() for t in th]
        time.sleep(0.5)
        killed_at = time.monotonic()
        doomed.kill()
        th[0].join()
        # the other peer goes on: calls started after the kill complete
        wait_for(lambda: sum(r[1] > killed_at for r in result["alive"]) >= 3,
                 "three calls to the other peer after the kill")
        result["stop"] = True
        th[1].join()
        rc, t0, t1, why = result["doomed"][-1]
        self.assertEqual(rc, -1)
        # seen dead, not waited out: the io timeout is 10 s (docs/mooncake.md)
        self.assertLess(t1 - killed_at, 9.0, why)
        self.assertIn(doomed.sid, why)
        self.assertTrue(all(r[0] == 0 for r in result["doomed"][:-1]))
        alive_rcs = [r[0] for r in result["alive"]]
        self.assertEqual(alive_rcs, [0] * len(alive_rcs), result["alive"][-1][3])
        # later calls to the dead peer fail fast, with the reason
        t0 = time.monotonic()
        self.assertEqual(self.engine.transfer_sync_write(doomed.sid, a, doomed.addr, 4096), -1)
        self.assertLess(time.monotonic() - t0, 9.0)  # not the 10 s io timeout
        self.assertIn(doomed.sid, self.engine.last_error())

    def test_peer_restarted_at_the_same_session_id(self):
        first = self.peer(size=8 * MiB, port=0)
        port = int(first.sid.rsplit(":", 1)[1])
        m, a = self.local(8 * MiB, seed=12)
        self.assertEqual(self.engine.transfer_sync_write(first.sid, a, first.addr, 65536), 0)
        old = first.addr
        first.kill()
        self.peers.remove(first)
        # the new process maps the old addresses too (not registered, 0xEE)
        second = None
        end = time.monotonic() + DEADLINE
        while second is None:
            try:
                second = Peer(size=8 * MiB, port=port, guard=old)
            except AssertionError:  # the port is not free yet
                if time.monotonic() > end:
                    raise
                time.sleep(0.1)
        self.peers.append(second)
        self.assertEqual(second.sid, first.sid)
        self.assertNotEqual(second.addr, old)
        guard = second.hash([[0, 8 * MiB]], guard=True)
        if not _engine.HAVE_FETCH:
            self.connect(second)  # handed over by hand: the generation changed
        rc = self.engine.batch_transfer_sync_write(second.sid, [a], [old], [65536])
        self.assertEqual(rc, -1)
        self.assertIn(second.sid, self.engine.last_error())
        self.assertEqual(second.hash([[0, 8 * MiB]], guard=True), guard)
        self.assertEqual(guard, hashlib.sha256(b"\xee" * 8 * MiB).hexdigest())
        # at its new addresses it is written
        self.assertEqual(self.engine.transfer_sync_write(second.sid, a, second.addr, 65536), 0,
                         self.engine.last_error())
        self.assertEqual(second.hash([[0, 65536]]), sha_of(m, [[0, 65536]]))

    def test_peer_paused_then_resumed(self):
        """A peer stopped (SIGSTOP) past the io timeout is marked unhealthy;
        once it runs again (SIGCONT) the next call, a second or two later,
        fetches its descriptor again and succeeds (the mark is not kept for
        its 30 s TTL)."""
        if not _engine.HAVE_FETCH:
            self.skipTest("this build's transfer engine cannot fetch descriptors")
        os.environ["KVCOORD_TRANSFER_IO_TIMEOUT_MS"] = "500"
        try:
            e = TransferEngine()
            self.assertEqual(e.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", ""), 0,
                             e.last_error())
        finally:
            del os.environ["KVCOORD_TRANSFER_IO_TIMEOUT_MS"]
        try:
            p = Peer(size=MiB, seed=None)
            self.peers.append(p)
            m, a = buffer(MiB, seed=21)
            self.assertEqual(e.register_memory(a, MiB), 0, e.last_error())
            self.assertEqual(e.transfer_sync_write(p.sid, a, p.addr, 65536), 0, e.last_error())
            p.proc.send_signal(signal.SIGSTOP)
            try:
                # kill() returns before every thread of the peer has stopped
                wait_for(lambda: all_threads_stopped(p.proc.pid), "the peer's threads to stop")
                self.assertEqual(e.transfer_sync_write(p.sid, a, p.addr, 65536), -1)
                self.assertIn(p.sid, e.last_error())
                wait_for(lambda: e.stats()["peers_unhealthy"] == 1, "the peer marked unhealthy")
            finally:
                p.proc.send_signal(signal.SIGCONT)
            time.sleep(1.5)
            self.assertEqual(e.transfer_sync_write(p.sid, a, p.addr, MiB), 0, e.last_error())
            self.assertEqual(p.hash([[0, MiB]]), sha_of(m, [[0, MiB]]))
            self.assertEqual(e.stats()["peers_unhealthy"], 0)
        finally:
            e.close()


@unittest.skipUnless(_engine.HAVE_READ and _engine.HAVE_FETCH,
                     "this build's transfer engine has no READ or no descriptor fetch")
class SeedsFlow(EngineCase):
    """sglang's remote-instance weight loading: the seed publishes its weights'
    addresses through the engine-info bootstrap routes (here kvcoordd's), the
    new instance reads every parameter with batch_transfer_sync_read."""

    SHAPES = [["model.embed_tokens.weight", 32000 * 64, 2], ["lm_head.weight", 32000 * 64, 2],
              ["model.layers.0.self_attn.q_proj.weight", 512 * 512, 2],
              ["model.layers.0.mlp.down_proj.weight", 1376 * 512, 2],
              ["model.norm.weight", 512, 4]]

    def test_read_every_parameter(self):
        daemon = Daemon(new_name("mcseed"))
        self.addCleanup(daemon.stop)
        seed = self.peer(size=4096)
        w = seed.cmd(op="weights", shapes=self.SHAPES, seed=13)
        self.assertEqual(seed.cmd(op="put_info", url=daemon.url, rank=0, info=w["info"]),
                         {"status": 200})
        with urllib.request.urlopen(daemon.url + "/get_transfer_engine_info?rank=0",
                                    timeout=30) as r:
            got = json.loads(r.read())
        sid, info = got["remote_instance_transfer_engine_info"]
        self.assertEqual(sid, seed.sid)
        names = sorted(info)
        sizes = [info[k][1] * info[k][2] for k in names]
        local, a = self.local(sum(sizes), seed=None)
        offs = [sum(sizes[:i]) for i in range(len(sizes))]
        rc = self.engine.batch_transfer_sync_read(sid, [a + o for o in offs],
                                                  [info[k][0] for k in names], sizes)
        self.assertEqual(rc, 0, self.engine.last_error())
        for k, o, n in zip(names, offs, sizes):
            self.assertEqual(hashlib.sha256(local[o:o + n]).hexdigest(), w["sha"][k], k)


if __name__ == "__main__":
    unittest.main()
