"""pip packaging (python/setup.py, python/pyproject.toml), offline with
Debian's setuptools, as the README's Python section says: `pip install
--no-build-isolation ./python` into a fresh venv builds the extension from
the project's C sources; the venv's kvcoord (not the build tree's) then
imports, opens a segment and does a room round trip; `pip wheel` makes a
wheel holding the extension and the sglang modules.
"""

import glob
import os
import shutil
import subprocess
import sys
import tempfile
import unittest
import zipfile

from kvctest import discard, new_name

SRC = os.environ.get("KVCOORD_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))
ROUND_TRIP = r"""
import sys, kvcoord, kvcoord.sglang
assert kvcoord.__file__.startswith(sys.prefix), kvcoord.__file__
name = sys.argv[1]
with kvcoord.Segment(name, mode="fresh", role="client", max_rooms=64, arena_bytes=1 << 20,
                     max_info_bytes=1 << 16, max_ranks=16, max_procs=16, world_size=2) as seg:
    with seg.room(7, rank=0, participants=2) as room:
        seg.room_open(7, 1, 2)
        room.set_state(kvcoord.KVPoll.Transferring)
        seg.room_fail(7, 1, "RDMA WRITE failed", 5)
        try:
            room.check()
        except kvcoord.KVTransferError as e:
            print(kvcoord.VERSION, e, e.is_from_another_rank, e.origin_rank)
import ctypes, kvcoord.mooncake
assert kvcoord.mooncake.__file__.startswith(sys.prefix), kvcoord.mooncake.__file__
a, b = kvcoord.mooncake.TransferEngine(), kvcoord.mooncake.TransferEngine()
assert a.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0, a.last_error()
assert b.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0, b.last_error()
src, dst = ctypes.create_string_buffer(b"weights!" * 512), ctypes.create_string_buffer(4096)
assert a.register_memory(ctypes.addressof(src), 4096) == 0, a.last_error()
assert b.register_memory(ctypes.addressof(dst), 4096) == 0, b.last_error()
a.peer_add(b.descriptor())
from importlib.metadata import entry_points
print("plugin", [e.value for e in entry_points(group="sglang.srt.plugins") if e.name == "kvcoord"])
print("mooncake", a.transfer_sync_write(b.get_session_id(), ctypes.addressof(src),
                                        ctypes.addressof(dst), 4096), dst.raw[:8])
"""


class Pip(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.work = tempfile.mkdtemp(prefix="kvctest-pip-")
        # An out-of-tree copy: the checkout gets no build/ or egg-info from
        # the test.  One copy for both tests: pip builds in the tree, so the
        # first test compiles the extension from clean and the second
        # (pip wheel) reuses that CMake build rather than compiling it all
        # again (the suite's longest compile otherwise, on 2 cores).
        cls.src = os.path.join(cls.work, "src")
        shutil.copytree(SRC, cls.src, ignore=shutil.ignore_patterns(
            "build", "build-*", ".git", "__pycache__", "*.egg-info"))
        cls.env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.work, ignore_errors=True)

    def run_ok(self, *cmd, cwd=None):
        r = subprocess.run(cmd, cwd=cwd or self.src, env=self.env, capture_output=True,
                           text=True, timeout=900)
        self.assertEqual(r.returncode, 0, "%s\n%s%s" % (" ".join(cmd), r.stdout, r.stderr))
        return r.stdout

    def test_install_into_a_fresh_venv(self):
        venv = os.path.join(self.work, "venv")
        self.run_ok(sys.executable, "-m", "venv", "--system-site-packages", venv)
        py = os.path.join(venv, "bin", "python")
        self.run_ok(py, "-m", "pip", "install", "--no-build-isolation", "--no-index", "./python")
        name = new_name("pip")
        try:
            out = self.run_ok(py, "-c", ROUND_TRIP, name, cwd=self.work)
        finally:
            discard(name)
        self.assertIn("KVTransferError(bootstrap_room=7): RDMA WRITE failed True 1", out)
        self.assertIn("mooncake 0 b'weights!'", out)
        self.assertIn("plugin ['kvcoord.sglang_plugin:load']", out)
        files = self.run_ok(py, "-m", "pip", "show", "-f", "kvcoord")
        for f in ("kvcoord/_kvcoord.cpython", "kvcoord/_engine.cpython",
                  "kvcoord/mooncake/__init__.py", "kvcoord/sglang/__init__.py",
                  "kvcoord/sglang/install.py", "kvcoord/_kvcoord.pyi", "kvcoord/_engine.pyi",
                  "kvcoord/py.typed"):
            self.assertIn(f, files)

    def test_wheel(self):
        out = os.path.join(self.work, "wheels")
        self.run_ok(sys.executable, "-m", "pip", "wheel", "--no-build-isolation", "--no-index",
                    "--no-deps", "-w", out, "./python")
        wheels = glob.glob(os.path.join(out, "kvcoord-*.whl"))
        self.assertEqual(len(wheels), 1, os.listdir(out))
        names = zipfile.ZipFile(wheels[0]).namelist()
        self.assertTrue(any(n.startswith("kvcoord/_kvcoord.cpython") for n in names), names)
        self.assertIn("kvcoord/sglang/poll.py", names)


if __name__ == "__main__":
    unittest.main()
