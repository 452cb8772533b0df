"""10^6 lookups of a Llama-3.1-8B rank (tools/gen_model_info.py, 195 entries,
about 14 KB) from Python with a stable RSS: no reference or buffer leaks per
call.  Prints the figures; the bound is generous (no leak of even 16 bytes per
call could stay under it) and nothing about speed is asserted.
"""

import json
import os
import subprocess
import sys
import tempfile
import time
import unittest

import kvcoord
from kvctest import SMALL, discard, new_name, rss_kib

N = 1_000_000


def llama_rank0():
    src = os.environ.get("KVCOORD_SOURCE_DIR",
                         os.path.join(os.path.dirname(__file__), "..", ".."))
    with tempfile.TemporaryDirectory() as d:
        subprocess.run([sys.executable, os.path.join(src, "tools", "gen_model_info.py"),
                        "--model", "llama-3.1-8b", "--tp", "8", "--out", d],
                       check=True, stdout=subprocess.DEVNULL)
        with open(os.path.join(d, "rank-0.json"), "rb") as f:
            return json.load(f)["transfer_engine_info"]


class LookupRss(unittest.TestCase):
    def test_million_lookups(self):
        info = llama_rank0()
        name = new_name("rss")
        try:
            with kvcoord.Segment(name, mode="fresh", rank=0, **SMALL) as seg:
                seg.register(0, info["session_id"], info["weights_info_dict"])
                for _ in range(20000):  # warm up allocator pools
                    seg.lookup(0)
                before = rss_kib()
                t0 = time.perf_counter()
                for i in range(N):
                    ri = seg.lookup(0)
                    if i % 1000 == 0:  # and the lazy decode path, now and then
                        assert len(ri.weights_info_dict) == 195
                elapsed = time.perf_counter() - t0
                after = rss_kib()
                with self.assertRaises(KeyError):  # the error path must not leak either
                    seg.lookup(1)
                for _ in range(100000):
                    try:
                        seg.lookup(1)
                    except KeyError:
                        pass
                final = rss_kib()
            print("\n%d lookups of a %d-byte rank: %.2f us each; RSS %d KiB before, %d KiB "
                  "after (%+d KiB), %d KiB after 100000 failed lookups"
                  % (N, len(ri.raw), elapsed / N * 1e6, before, after, after - before, final),
                  file=sys.stderr)
            self.assertLess(after - before, 16 * 1024)
            self.assertLess(final - after, 4 * 1024)
        finally:
            discard(name)


if __name__ == "__main__":
    unittest.main()
