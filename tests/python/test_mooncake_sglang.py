"""sglang, unchanged, on kvcoord's transfer engine: after
kvcoord.sglang.install(..., transfer_engine=True) the fixture's copies of
sglang's Mooncake wrappers (distributed/device_communicators/
mooncake_transfer_engine.py, the older disaggregation/mooncake/
transfer_engine.py) and its remote-instance weight transporter construct
kvcoord.mooncake.TransferEngine; pages move to a peer process; when the
engine fails a room's pages, the room's failure record carries the engine's
reason (naming the peer) with this rank as origin, and another rank's
failure_exception() raises it.  uninstall() puts Mooncake's module back.
"""

import ctypes
import hashlib
import mmap
import os
import sys
import time
import unittest

import kvcoord
import kvcoord.mooncake
import kvcoord.sglang as ksg
from kvctest import DEADLINE, SMALL, discard, new_name, wait_for
from sgltest import use_fixture
from test_mooncake import Peer

from kvcoord import _engine

sglang = use_fixture()
from sglang.srt.disaggregation.base.conn import KVPoll as P  # noqa: E402
from sglang.srt.disaggregation.common import conn as common  # noqa: E402
from sglang.srt.disaggregation.mooncake import conn as mooncake  # noqa: E402
from sglang.srt.distributed.device_communicators import (  # noqa: E402
    mooncake_transfer_engine as shared,
)
from sglang.srt.model_loader import remote_instance_weight_transporter as rit  # noqa: E402


class Adoption(unittest.TestCase):
    def setUp(self):
        self.name = new_name("mcsgl")
        self.seg = kvcoord.Segment(self.name, mode="fresh", role="client", **SMALL)
        self.peers = []

    def tearDown(self):
        ksg.uninstall()
        shared._mooncake_transfer_engine = None
        for p in self.peers:
            p.close()
        self.seg.close()
        discard(self.name)

    def test_wrappers_construct_kvcoords_engine(self):
        ksg.install(self.seg, 0, size=2, transfer_engine=True)
        te = shared.init_mooncake_transfer_engine("127.0.0.1")
        self.assertIsInstance(te.engine, kvcoord.mooncake.TransferEngine)
        self.assertEqual(te.get_session_id(), te.engine.get_session_id())
        from sglang.srt.disaggregation.mooncake import transfer_engine as older

        old = older.MooncakeTransferEngine("127.0.0.1", 0)
        self.assertIsInstance(old.engine, kvcoord.mooncake.TransferEngine)
        seedside = rit.RemoteInstanceWeightTransporter(0)
        seedside.init_engine()
        self.assertIsInstance(seedside.engine, kvcoord.mooncake.TransferEngine)
        for e in (old.engine, seedside.engine):
            e.close()
        # pages to a peer process through sglang's wrapper
        peer = Peer(size=1 << 20)
        self.peers.append(peer)
        m = mmap.mmap(-1, 1 << 20)
        m[:] = os.urandom(1 << 20)
        a = ctypes.addressof(ctypes.c_char.from_buffer(m))
        te.register(a, 1 << 20)
        if not _engine.HAVE_FETCH:
            te.engine.peer_add(peer.desc)
        pages = [0, 2, 5, 9]
        self.assertEqual(te.batch_transfer_sync(
            peer.sid, [a + 4096 * p for p in pages], [peer.addr + 4096 * (p + 20) for p in pages],
            [4096] * 4), 0, te.engine.last_error())
        self.assertEqual(peer.hash([[4096 * (p + 20), 4096] for p in pages]),
                         hashlib.sha256(b"".join(m[4096 * p:4096 * (p + 1)]
                                                 for p in pages)).hexdigest())
        te.engine.close()
        ksg.uninstall()
        self.assertNotIn("mooncake.engine", sys.modules)

    def test_failed_pages_carry_the_engines_reason(self):
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # rank 1 of the room: raises what rank 0 recorded
            os.close(r)
            code = 1
            try:
                ksg.install(self.name, 1, size=2)
                m1 = mooncake.MooncakeKVManager(1)
                rcv = mooncake.MooncakeKVReceiver(m1, "10.0.0.9:8998", 51)
                os.write(w, b"joined\n")
                bridge = ksg._sgl_install.active_bridge()
                # a hang guard only: rank 0 first starts a peer process and an
                # engine, which under ASan on a loaded machine takes minutes
                wait_for(lambda: bridge.node_failure(51) is not None, "rank 0's record",
                         timeout=5 * DEADLINE)
                try:
                    rcv.failure_exception()
                    os.write(w, b"failure_exception() raised nothing\n")
                except common.KVTransferError as e:
                    os.write(w, ("%s|%s|%s\n" % (e.origin_rank, e.is_from_another_rank,
                                                 e.failure_reason)).encode())
                    code = 0
            except BaseException as e:  # the parent's assertion shows it
                os.write(w, ("rank 1: %r\n" % (e,)).encode())
            finally:
                os._exit(code)
        os.close(w)
        rf = os.fdopen(r)
        try:
            self.assertEqual(rf.readline(), "joined\n")
            ksg.install(self.seg, 0, size=2, transfer_engine=True)
            te = shared.init_mooncake_transfer_engine("127.0.0.1")
            peer = Peer(size=1 << 20)
            self.peers.append(peer)
            buf = mmap.mmap(-1, 1 << 20)
            a = ctypes.addressof(ctypes.c_char.from_buffer(buf))
            te.register(a, 1 << 20)
            if not _engine.HAVE_FETCH:
                te.engine.peer_add(peer.desc)
            mgr = mooncake.MooncakeKVManager(0)
            snd = mooncake.MooncakeKVSender(mgr, "10.0.0.9:8998", 51)
            peer.kill()
            ret = mooncake.send_kvcache_chunk(mgr, te, 51, peer.sid, [a], [peer.addr], [65536],
                                              "10.0.0.9:8998")
            self.assertEqual(ret, -1)
            why = te.engine.last_error()
            self.assertIn(peer.sid, why)
            failure = self.seg.room_get(51).failure
            self.assertIsNotNone(failure)
            self.assertEqual(failure.origin_rank, 0)
            self.assertIn("Failed to send kv chunk of 51", failure.reason)
            self.assertIn(why, failure.reason)
            with self.assertRaises(common.KVTransferError) as cm:
                snd.failure_exception()
            self.assertIn(why, cm.exception.failure_reason)
            line = rf.readline().rstrip("\n")
            _, status = os.waitpid(pid, 0)
            self.assertEqual(os.waitstatus_to_exitcode(status), 0, line)
            origin, other, reason = line.split("|", 2)
            self.assertEqual((origin, other), ("0", "True"))
            self.assertIn(why, reason)
            te.engine.close()
        finally:
            rf.close()


PLUGIN = r"""
import sys
sys.path.insert(0, sys.argv[1])
from importlib.metadata import entry_points
import kvcoord.mooncake, kvcoord.sglang
# what sglang's load_plugins() does: the group's entry points, loaded and called
# (found in the build tree's kvcoord-VERSION.dist-info, as in the .deb's)
(ep,) = [e for e in entry_points(group="sglang.srt.plugins") if e.name == "kvcoord"]
ep.load()()
from mooncake.engine import TransferEngine
assert TransferEngine is kvcoord.mooncake.TransferEngine, TransferEngine
import importlib
_sgl_install = importlib.import_module("kvcoord.sglang.install")
assert _sgl_install.active_bridge() is None   # not before sglang's rank is known
from sglang.srt.disaggregation.mooncake import conn
conn.MooncakeKVManager(1)
b = _sgl_install.active_bridge()
print("installed", b.rank, b.size, b.segment.name)
"""


class Plugin(unittest.TestCase):
    def test_entry_point_adopts_by_environment(self):
        import subprocess
        from sgltest import FAKE

        name = new_name("mcplug")
        seg = kvcoord.Segment(name, mode="fresh", role="client", **SMALL)
        try:
            env = dict(os.environ, KVCOORD_SEGMENT=name)
            r = subprocess.run([sys.executable, "-c", PLUGIN, FAKE], env=env,
                               capture_output=True, text=True, timeout=DEADLINE)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertIn("installed 1 8 %s" % name, r.stdout)
        finally:
            seg.close()
            discard(name)
        # the PD bootstrap server alone (the process that starts it has no KV manager)
        script = ("import sys; sys.path.insert(0, sys.argv[1])\n"
                  "from kvcoord import sglang_plugin; sglang_plugin.load()\n"
                  "from sglang.srt.disaggregation.common import conn\n"
                  "print(hasattr(conn.CommonKVBootstrapServer.__init__, '__wrapped__'))\n")
        env = {k: v for k, v in os.environ.items() if k != "KVCOORD_SEGMENT"}
        env["KVCOORD_PD_BOOTSTRAP"] = "1"
        r = subprocess.run([sys.executable, "-c", script, FAKE], env=env, capture_output=True,
                           text=True, timeout=DEADLINE)
        self.assertEqual((r.returncode, r.stdout), (0, "True\n"), r.stderr)


if __name__ == "__main__":
    unittest.main()
