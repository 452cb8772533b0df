"""kvcoord.sglang.install() where sglang cannot be imported: the README's
adoption snippet run without sglang says so plainly (which Python, the
import's own error) instead of a bare "No module named 'sglang'"; an sglang
without PD disaggregation and one whose module fails on its own dependency
are told apart.  Each case in a fresh interpreter whose sys.path has the
build's kvcoord and, at most, a made-up sglang."""

import os
import subprocess
import sys
import tempfile
import unittest

SNIPPET = ("import kvcoord.sglang\n"
           "try:\n"
           "    kvcoord.sglang.install(segment=None, rank=0, size=1)\n"
           "except ImportError as e:\n"
           "    print(type(e).__name__, e.name, e, sep='|')\n"
           "else:\n"
           "    print('installed')\n")


def run(extra_path=None):
    env = dict(os.environ)
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep)
             if p and "fake_sglang" not in p]
    if extra_path:
        paths.insert(0, extra_path)
    env["PYTHONPATH"] = os.pathsep.join(paths)
    p = subprocess.run([sys.executable, "-c", SNIPPET], env=env, capture_output=True,
                       text=True, timeout=120, check=False)
    return p.stdout.strip(), p.stderr


def tree(root, files):
    for rel, text in files.items():
        path = os.path.join(root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)


class SglangMissing(unittest.TestCase):
    def test_not_installed(self):
        out, err = run()
        if out == "installed":
            self.skipTest("an sglang is importable here")
        kind, name, msg = out.split("|", 2)
        self.assertEqual((kind, name), ("ModuleNotFoundError", "sglang"), err)
        self.assertIn("sglang is not installed for this Python (%s)" % sys.executable, msg)
        self.assertIn("(import sglang failed: No module named 'sglang')", msg)

    def test_without_disaggregation(self):
        with tempfile.TemporaryDirectory() as d:
            tree(d, {"sglang/__init__.py": "", "sglang/srt/__init__.py": ""})
            out, err = run(d)
        kind, name, msg = out.split("|", 2)
        self.assertEqual(kind, "ModuleNotFoundError", err)
        self.assertIn("has no sglang.srt.disaggregation.utils", msg)
        self.assertIn("needs an sglang with PD disaggregation", msg)

    def test_its_own_dependency_missing(self):
        with tempfile.TemporaryDirectory() as d:
            tree(d, {"sglang/__init__.py": "", "sglang/srt/__init__.py": "",
                     "sglang/srt/disaggregation/__init__.py": "",
                     "sglang/srt/disaggregation/utils.py": "import kvctest_no_such_dep\n"})
            out, err = run(d)
        kind, name, msg = out.split("|", 2)
        self.assertEqual((kind, name), ("ModuleNotFoundError", "kvctest_no_such_dep"), err)
        self.assertIn("sglang is installed for this Python", msg)
        self.assertIn("No module named 'kvctest_no_such_dep'", msg)


if __name__ == "__main__":
    unittest.main()
