"""One truth per segment, seen from Python (issue 20, item 8).

- The Python extension and libkvcoord.so (loaded with ctypes) are two copies
  of the library in one process: one process-table entry, one handle count,
  so closing the .so's handle does not withdraw the extension's worker rank.
- mode="fresh" refuses while another process is attached, naming it;
  mode="force_fresh" discards the segment under it, and that process's next
  call raises kvcoord.Error (code KVC_E_STALE) instead of writing into a
  segment nobody serves; an unlinked segment does the same.
"""

import ctypes
import os
import subprocess
import sys
import time
import unittest

import kvcoord
from kvctest import DEADLINE, SMALL, discard, new_name

STALE = "segment discarded, unlinked or replaced"  # kvc_strerror(KVC_E_STALE)

# A worker in another process: reads one command per line, answers one line.
PEER = r"""
import sys, kvcoord
s = kvcoord.Segment(sys.argv[1], role="worker", rank=4)
print("ready", flush=True)
for line in sys.stdin:
    try:
        if line.startswith("register"):
            s.register(4, "h:4", {"a": 1})
        elif line.startswith("lookup"):
            s.lookup(4)
        elif line.startswith("check"):
            s.check_room(99)
        print("ok", flush=True)
    except kvcoord.Error as e:
        print("error|%s|%s" % (e.code_name, e), flush=True)
"""


class Peer:
    def __init__(self, name):
        self.p = subprocess.Popen([sys.executable, "-c", PEER, name], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True)
        line = self.p.stdout.readline()
        assert line.startswith("ready"), line

    def call(self, what):
        self.p.stdin.write(what + "\n")
        self.p.stdin.flush()
        return self.p.stdout.readline().strip()

    def stop(self):
        self.p.stdin.close()
        self.p.wait(DEADLINE)


class OneTruth(unittest.TestCase):
    def setUp(self):
        self.name = new_name("truth")

    def tearDown(self):
        discard(self.name)

    def test_fresh_refused_then_forced(self):
        creator = kvcoord.Segment(self.name, mode="fresh", role="client", **SMALL)
        creator.close()  # only the worker below is in the way now
        peer = Peer(self.name)
        try:
            self.assertEqual(peer.call("register"), "ok")
            with self.assertRaises(kvcoord.Error) as cm:
                kvcoord.Segment(self.name, mode="fresh", **SMALL)
            self.assertIn("1 other attached process: pid %d (worker, rank 4)" % peer.p.pid,
                          str(cm.exception))
            self.assertIn("force-fresh", str(cm.exception))
            self.assertEqual(peer.call("lookup"), "ok")  # refused: nothing changed
            with kvcoord.Segment(self.name, mode="force_fresh", **SMALL) as new:
                for call in ("register", "lookup", "check"):
                    out = peer.call(call)
                    self.assertTrue(out.startswith("error|%s|" % STALE), (call, out))
                    self.assertIn("was discarded", out)
                with self.assertRaises(kvcoord.NotFoundError):
                    new.lookup(4)  # nothing it did reached the new segment
        finally:
            peer.stop()

    def test_unlinked_segment_fails_next_write(self):
        with kvcoord.Segment(self.name, mode="fresh", role="worker", rank=1, **SMALL) as s:
            s.register(1, "h:1", {"a": 1})
            os.unlink("/dev/shm/" + self.name)  # by hand: no discarded flag
            with self.assertRaises(kvcoord.Error) as cm:
                s.register(2, "h:2", {"a": 2})
            self.assertEqual(cm.exception.code_name, STALE)
            self.assertIn("removed from /dev/shm", str(cm.exception))
            time.sleep(0.15)  # reads look at the file at most every 100 ms
            with self.assertRaises(kvcoord.Error) as cm:
                s.check_room(5)
            self.assertEqual(cm.exception.code_name, STALE)

    def test_two_library_copies_one_count(self):
        build = os.environ.get("KVCOORD_BUILD_DIR")
        path = os.path.join(build or "", "libkvcoord.so")
        if not build or not os.path.exists(path):
            raise unittest.SkipTest("no libkvcoord.so in KVCOORD_BUILD_DIR")
        lib = ctypes.CDLL(path)
        lib.kvc_options_init.argtypes = [ctypes.c_void_p]
        lib.kvc_open.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p)]
        lib.kvc_open.restype = ctypes.c_int
        lib.kvc_close.argtypes = [ctypes.c_void_p]
        lib.kvc_close.restype = ctypes.c_int
        opts = ctypes.create_string_buffer(256)  # kvc_options is smaller
        lib.kvc_options_init(opts)
        cname = ctypes.c_char_p(self.name.encode())
        # kvc_options: const char *name at 0, mode at 8, role at 12 (KVC_ROLE_CLIENT 3)
        ctypes.c_void_p.from_buffer(opts, 0).value = ctypes.cast(cname, ctypes.c_void_p).value
        ctypes.c_int.from_buffer(opts, 12).value = 3
        with kvcoord.Segment(self.name, mode="fresh", role="worker", rank=3, **SMALL) as s:
            s.register(3, "h:3", {"w": [1, 2, 3]})
            h = ctypes.c_void_p()
            self.assertEqual(lib.kvc_open(opts, ctypes.byref(h)), 0)
            mine = [p for p in s.procs() if p.pid == os.getpid()]
            self.assertEqual(len(mine), 1)  # one entry for this process
            self.assertEqual(lib.kvc_close(h), 0)
            # Not the last close: the extension's worker rank is still served.
            self.assertEqual(s.lookup(3).session_id, "h:3")
            self.assertEqual(len([p for p in s.procs() if p.pid == os.getpid()]), 1)
        with kvcoord.Segment(self.name, role="none") as r:
            with self.assertRaises(kvcoord.WithdrawnError):
                r.lookup(3)  # the last close withdrew it


if __name__ == "__main__":
    unittest.main()
