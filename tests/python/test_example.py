"""examples/sglang_tp_group.py runs as documented: 8 processes on a fresh
segment, exit 0 and the table's verdict; and once more on the same segment
(the ranks it registered were withdrawn when its workers exited: registered
again)."""

import os
import subprocess
import sys
import unittest

import kvcoord
from kvctest import SMALL, discard, new_name


class Example(unittest.TestCase):
    def test_help(self):
        src = os.environ.get("KVCOORD_SOURCE_DIR",
                             os.path.join(os.path.dirname(__file__), "..", ".."))
        out = subprocess.run([sys.executable, os.path.join(src, "examples", "sglang_tp_group.py"),
                              "--help"], capture_output=True, text=True, timeout=60)
        self.assertEqual(out.returncode, 0, out.stderr)
        # the whole first paragraph of the docstring, not its first line cut at "on a"
        self.assertIn("8 Python processes acting as one sglang TP group on a node's kvcoord "
                      "segment, through `import kvcoord` (no HTTP between them).",
                      " ".join(out.stdout.split()))

    def test_runs(self):
        src = os.environ.get("KVCOORD_SOURCE_DIR",
                             os.path.join(os.path.dirname(__file__), "..", ".."))
        name = new_name("example")
        with kvcoord.Segment(name, mode="fresh", role="none", **SMALL):
            pass
        try:
            for _ in range(2):
                out = subprocess.run([sys.executable, os.path.join(src, "examples",
                                                                   "sglang_tp_group.py"),
                                      "--segment", name, "--rooms", "3"],
                                     capture_output=True, text=True, timeout=300)
                self.assertEqual(out.returncode, 0, out.stdout + out.stderr)
                self.assertIn("result: OK: all 8 ranks agree", out.stdout)
                self.assertEqual(out.stdout.count("transport retry counter exceeded"), 9)
            missing = subprocess.run([sys.executable, os.path.join(src, "examples",
                                                                   "sglang_tp_group.py"),
                                      "--segment", new_name("none")], capture_output=True,
                                     text=True, timeout=60)
            self.assertNotEqual(missing.returncode, 0)
            self.assertIn("start kvcoordd", missing.stderr)
        finally:
            discard(name)


if __name__ == "__main__":
    unittest.main()
