"""RankInfo: one dict per object whatever the threads do, cycles through it
collected by the GC, and memory flat over many lookups (tracemalloc and RSS).
"""

import gc
import os
import sys
import threading
import tracemalloc
import unittest
import weakref

import kvcoord
from kvctest import DEADLINE, SMALL, discard, new_name, rss_kib

# Big enough that json.loads runs long enough for a thread switch inside it.
BIG = {"k%04d" % i: {"ptr": i, "len": 4096, "names": ["a", "b", "c"]} for i in range(2000)}
TRIES = 400


class RankInfoCase(unittest.TestCase):
    def setUp(self):
        self.name = new_name("ri")
        self.seg = kvcoord.Segment(self.name, mode="fresh", rank=0, **SMALL)
        self.seg.register(0, "h:1", BIG)

    def tearDown(self):
        self.seg.close()
        discard(self.name)

    def test_racing_threads_get_one_dict(self):
        """Two threads reading weights_info_dict of the same new RankInfo at
        once get the same object, every time."""
        old = sys.getswitchinterval()
        sys.setswitchinterval(1e-6)  # switch threads as often as the interpreter can
        try:
            differ = 0
            for _ in range(TRIES):
                ri = self.seg.lookup(0)
                start = threading.Barrier(2)
                got = [None, None]

                def reader(i):
                    start.wait()
                    got[i] = ri.weights_info_dict

                ts = [threading.Thread(target=reader, args=(i,)) for i in range(2)]
                for t in ts:
                    t.start()
                for t in ts:
                    t.join(DEADLINE)
                self.assertIsNotNone(got[0])
                self.assertEqual(len(got[0]), len(BIG))
                differ += got[0] is not got[1]
                self.assertTrue(ri.weights_info_dict is got[0], "a later access decoded again")
                self.assertTrue(ri.info[1] is got[0], "info decoded again")
        finally:
            sys.setswitchinterval(old)
        print("\n%d racing pairs: %d got two different dicts" % (TRIES, differ),
              file=sys.stderr)
        self.assertEqual(differ, 0)

    def test_cycle_through_the_dict_is_collected(self):
        class Canary:
            pass

        gc.collect()
        canary = Canary()
        alive = weakref.ref(canary)
        ri = self.seg.lookup(0)
        d = ri.weights_info_dict
        d["me"] = ri  # ri -> d -> ri
        d["canary"] = canary
        self.assertTrue(gc.is_tracked(ri))
        del ri, d, canary
        self.assertIsNotNone(alive())  # only the cycle holds it now
        gc.collect()
        self.assertIsNone(alive())

    def test_deeper_than_python_decodes_is_a_value_error(self):
        # kvcoordd and the library take 2048 levels; Python's json stops at
        # its recursion limit: a ValueError saying so, the bytes kept.
        deep = b'{"w": ' + b"[" * 2000 + b"]" * 2000 + b"}"
        self.seg.register(1, "h:2", deep)
        info = self.seg.lookup(1)
        with self.assertRaises(ValueError) as cm:
            info.weights_info_dict
        self.assertIn("nests deeper than Python's json decoder allows", str(cm.exception))
        self.assertIn("sys.getrecursionlimit() = %d" % sys.getrecursionlimit(), str(cm.exception))
        self.assertEqual(info.raw, deep)
        with self.assertRaises(ValueError):  # again: the same, not a half-decoded dict
            info.weights_info_dict

    def test_undecoded_rankinfo_is_not_tracked(self):
        """Before its first decode a RankInfo holds only str and bytes."""
        ri = self.seg.lookup(0)
        self.assertFalse(gc.is_tracked(ri))
        ri.weights_info_dict
        self.assertTrue(gc.is_tracked(ri))
        self.assertFalse(gc.is_tracked(self.seg.ranks()[0]))

    def test_memory_flat_over_many_lookups(self):
        """Lookups, decodes and cycles through the dict: tracemalloc and RSS
        stay flat (cycles collected, nothing leaked per call)."""
        self.seg.register(1, "h:2", {"a": [1, 2, 3], "b": {"c": "d"}})

        def burst(n):
            for i in range(n):
                ri = self.seg.lookup(1)
                d = ri.weights_info_dict
                if i % 2:
                    d["me"] = ri  # a cycle every other lookup
                ri.info
                self.seg.lookup_raw(1)

        burst(20000)  # warm up pools and caches
        gc.collect()
        tracemalloc.start()
        try:
            base = tracemalloc.get_traced_memory()[0]
            rss0 = rss_kib()
            for _ in range(5):
                burst(20000)
            gc.collect()
            grown = tracemalloc.get_traced_memory()[0] - base
        finally:
            tracemalloc.stop()
        rss1 = rss_kib()
        print("\n100000 lookups+decodes (half in cycles): tracemalloc %+d bytes, RSS %+d KiB"
              % (grown, rss1 - rss0), file=sys.stderr)
        self.assertLess(grown, 64 * 1024)  # 100000 leaked objects would be megabytes
        if "libasan" in os.environ.get("LD_PRELOAD", ""):
            # ASan's quarantine of freed memory (256 MiB by default) grows the
            # RSS by design; tracemalloc above still sees every leak.
            return
        self.assertLess(rss1 - rss0, 8 * 1024)


if __name__ == "__main__":
    unittest.main()
