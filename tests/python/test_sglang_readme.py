"""The README's install() snippet (## Adopting it in sglang) runs as
docs/python.md says to try it without sglang (its PYTHONPATH, the
sglang-shaped test fixture), on a fresh segment in place of the Quick
start's kvcoord-6789 (the one change: the segment's name)."""

import os
import re
import subprocess
import sys
import unittest

import kvcoord
from kvctest import SMALL, discard, new_name
from sgltest import FAKE

SRC = os.environ.get("KVCOORD_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))


def snippet():
    text = open(os.path.join(SRC, "README.md"), encoding="utf-8").read()
    at = text.index("## Adopting it in sglang")
    return re.compile(r"^```python\n(.*?)^```$", re.S | re.M).search(text, at).group(1)


def documented_pythonpath():
    """docs/python.md's command for the snippet without sglang, its
    PYTHONPATH resolved: build/python in this build, the fixture in the
    checkout."""
    text = open(os.path.join(SRC, "docs", "python.md"), encoding="utf-8").read()
    at = text.index("## Trying the sglang snippet without sglang")
    m = re.compile(r"^PYTHONPATH=(\S+) /usr/bin/python3 snippet.py$", re.M).search(text, at)
    assert m, "docs/python.md does not show the snippet's command"
    build = os.environ.get("KVCOORD_BUILD_DIR", os.path.join(SRC, "build"))
    paths = []
    for p in m.group(1).split(":"):
        assert p in ("build/python", "tests/python/fake_sglang"), p
        paths.append(os.path.join(build, "python") if p == "build/python"
                     else os.path.join(SRC, p))
    assert os.path.samefile(paths[-1], FAKE), paths
    return os.pathsep.join(paths)


class ReadmeSnippet(unittest.TestCase):
    def test_runs_as_printed(self):
        code = snippet()
        self.assertIn("kvcoord.sglang.install(", code)
        name = new_name("readme")
        with kvcoord.Segment(name, mode="fresh", role="none", **dict(SMALL, world_size=16)):
            pass
        try:
            ours = code.replace('"kvcoord-6789"', repr(name))
            self.assertNotEqual(ours, code, "the snippet does not name kvcoord-6789")
            env = dict(os.environ)
            env["PYTHONPATH"] = documented_pythonpath()
            r = subprocess.run([sys.executable, "-c", ours], env=env, capture_output=True,
                               text=True, timeout=120)
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            self.assertRegex(r.stdout, r"^\d+ sglang functions and methods patched, e.g. \w+\n$")
            with kvcoord.Segment(name, role="none") as seg:
                self.assertEqual(seg.ranks(include_withdrawn=True), [])  # it registers nothing
        finally:
            discard(name)


def basic_snippet():
    text = open(os.path.join(SRC, "README.md"), encoding="utf-8").read()
    at = text.index("## Using it directly")
    for m in re.compile(r"^```python\n(.*?)^```$", re.S | re.M).finditer(text, at):
        if "kvcoord.Segment(port=6789" in m.group(1):
            return m.group(1)
    raise AssertionError("no Segment(port=6789 ...) snippet under the README's Using it directly")


class ReadmeBasicSnippet(unittest.TestCase):
    def test_runs_as_printed(self):
        """The first Python snippet, against a kvcoordd of this test's and its
        segment (the one change: the segment named instead of port 6789), with
        rank 0 registered as the Quick start's is."""
        from kvctest import Daemon

        code = basic_snippet()
        name = new_name("readme-basic")
        d = Daemon(name)
        try:
            ours = code.replace("port=6789", repr(name))
            self.assertNotEqual(ours, code)
            with kvcoord.Segment(name, role="client") as seg:
                seg.register(0, "127.0.0.1:16000", {"w": [1, 2, 2]})
                r = subprocess.run([sys.executable, "-c", ours], capture_output=True, text=True,
                                   timeout=120)
                self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
                self.assertEqual(r.stdout, "127.0.0.1:16000 1 1\n")
                self.assertEqual(seg.lookup(0).session_id, "127.0.0.1:16000")  # left alone
                with self.assertRaises(kvcoord.WithdrawnError):  # its own, withdrawn on exit
                    seg.lookup(10)
        finally:
            d.stop()


if __name__ == "__main__":
    unittest.main()
