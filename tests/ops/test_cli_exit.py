#!/usr/bin/python3
"""One exit-status convention for every program of the project: a usage
error (no or an unknown command, an unknown option, a missing or bad value)
exits 2 with a message on stderr and nothing on stdout; --help exits 0 and
documents the exit status, 2 for a usage error among them.

Checked for kvcoordd, kvcoord-diag, kvcoord-bench (and its subcommands),
kvcoord-bench-etcd, kvcoord-worker, kvcoord-torture, tools/kvcoord.sh,
tools/etcd-cluster.sh, tools/cluster-demo.sh, tools/bench/bench_*.sh,
tools/gen_model_info.py and tools/query_ranks.py.  Only bad command lines are run: each is refused
before the program does anything (kvcoord.sh run checks its arguments before
installing packages or building).

Usage: test_cli_exit.py --bin BUILD_DIR --tools TOOLS_DIR
"""

import argparse
import os
import re
import subprocess
import sys
import unittest

ARGS = None


def run(argv):
    p = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False,
                       stdin=subprocess.DEVNULL)
    return p.returncode, p.stdout, p.stderr


class ExitStatus(unittest.TestCase):
    def bins(self):
        b = lambda n: os.path.join(ARGS.bin, n)
        t = lambda n: os.path.join(ARGS.tools, n)
        py = sys.executable
        # program -> (help argv, [bad argvs])
        return {
            "kvcoordd": ([b("kvcoordd"), "--help"],
                         [[b("kvcoordd"), "--bogus"], [b("kvcoordd"), "extra"],
                          [b("kvcoordd"), "--listen", "nowhere"],
                          [b("kvcoordd"), "--max-ranks", "x"], [b("kvcoordd"), "--bind-retry"]]),
            "kvcoord-diag": ([b("kvcoord-diag"), "--help"],
                             [[b("kvcoord-diag")], [b("kvcoord-diag"), "bogus"],
                              [b("kvcoord-diag"), "--bogus", "status"],
                              [b("kvcoord-diag"), "status", "--bogus"],
                              [b("kvcoord-diag"), "--port", "0", "status"],
                              [b("kvcoord-diag"), "help", "bogus"]]),
            "kvcoord-bench": ([b("kvcoord-bench"), "--help"],
                              [[b("kvcoord-bench")], [b("kvcoord-bench"), "--bogus"],
                               [b("kvcoord-bench"), "--bogus-opt"],
                               [b("kvcoord-bench"), "bogus"],
                               [b("kvcoord-bench"), "lookup"],
                               [b("kvcoord-bench"), "lookup", "--bogus"],
                               [b("kvcoord-bench"), "rate", "--bogus"],
                               [b("kvcoord-bench"), "rooms", "--bogus"],
                               [b("kvcoord-bench"), "transfer", "--bogus"]]),
            "kvcoord-bench-etcd": ([b("kvcoord-bench-etcd"), "--help"],
                                   [[b("kvcoord-bench-etcd")],
                                    [b("kvcoord-bench-etcd"), "--bogus", "x"],
                                    [b("kvcoord-bench-etcd"), "--etcd"]]),
            "kvcoord-worker": ([b("kvcoord-worker"), "--help"],
                               [[b("kvcoord-worker")], [b("kvcoord-worker"), "--bogus"]]),
            "kvcoord-torture": ([b("kvcoord-torture"), "--help"],
                                [[b("kvcoord-torture"), "--bogus"]]),
            "kvcoord.sh": (["bash", t("kvcoord.sh"), "--help"],
                           [["bash", t("kvcoord.sh")], ["bash", t("kvcoord.sh"), "bogus"],
                            ["bash", t("kvcoord.sh"), "run", "--bogus"],
                            ["bash", t("kvcoord.sh"), "run", "--model"],
                            ["bash", t("kvcoord.sh"), "run", "--model", "gpt-9"],
                            ["bash", t("kvcoord.sh"), "run", "--port", "0"],
                            ["bash", t("kvcoord.sh"), "stop", "--now"],
                            ["bash", t("kvcoord.sh"), "test", "--bogus"]]),
            "etcd-cluster.sh": (["bash", t("etcd-cluster.sh"), "help"],
                                [["bash", t("etcd-cluster.sh")],
                                 ["bash", t("etcd-cluster.sh"), "bogus"],
                                 ["bash", t("etcd-cluster.sh"), "kill-member"],
                                 ["bash", t("etcd-cluster.sh"), "kill-member", "7"],
                                 ["bash", t("etcd-cluster.sh"), "status", "--bogus"],
                                 ["bash", t("etcd-cluster.sh"), "status", "--dir"]]),
            "cluster-demo.sh": (["bash", t("cluster-demo.sh"), "--help"],
                                [["bash", t("cluster-demo.sh"), "--bogus"],
                                 ["bash", t("cluster-demo.sh"), "--ttl"],
                                 ["bash", t("cluster-demo.sh"), "--ttl", "soon"]]),
            "bench_burst.sh": (["bash", t("bench/bench_burst.sh"), "--help"],
                               [["bash", t("bench/bench_burst.sh"), "--bogus"],
                                ["bash", t("bench/bench_burst.sh"), "--rounds"]]),
            "bench_http.sh": (["bash", t("bench/bench_http.sh"), "--help"],
                              [["bash", t("bench/bench_http.sh"), "--bogus"],
                               ["bash", t("bench/bench_http.sh"), "-d"]]),
            "bench_register.sh": (["bash", t("bench/bench_register.sh"), "--help"],
                                  [["bash", t("bench/bench_register.sh"), "--bogus"],
                                   ["bash", t("bench/bench_register.sh"), "--reps"]]),
            "bench_transfer.sh": (["bash", t("bench/bench_transfer.sh"), "--help"],
                                  [["bash", t("bench/bench_transfer.sh"), ARGS.bin, "0"],
                                   ["bash", t("bench/bench_transfer.sh"), ARGS.bin, "1", "x"]]),
            "gen_model_info.py": ([py, t("gen_model_info.py"), "--help"],
                                  [[py, t("gen_model_info.py"), "--bogus"]]),
            "query_ranks.py": ([py, t("query_ranks.py"), "--help"],
                               [[py, t("query_ranks.py"), "--bogus"]]),
        }

    def test_usage_errors_exit_2(self):
        for name, (_, bad) in self.bins().items():
            for argv in bad:
                with self.subTest(argv=argv[1:]):
                    rc, out, err = run(argv)
                    self.assertEqual(rc, 2, (name, argv[1:], out, err))
                    self.assertEqual(out, "", (name, argv[1:]))
                    self.assertTrue(err.strip(), (name, argv[1:], "no message on stderr"))
                    # an unknown option of a compiled program is named as such
                    bogus = [a for a in argv if a.startswith("--bogus")]
                    if bogus and not name.endswith((".sh", ".py")):
                        self.assertRegex(err, r"^\S*%s(?: [a-z]+)?: (unrecognized|unknown) option '%s'"
                                         % (re.escape(name), bogus[0]), (name, argv[1:]))

    def test_worker_usage_errors_end_with_the_hint(self):
        # as kvcoordd's and kvcoord-bench's: the reason, then one hint line
        w = os.path.join(ARGS.bin, "kvcoord-worker")
        for argv in ([w], [w, "--bogus"], [w, "--rank", "x"], [w, "--info", "f", "extra"],
                     [w, "--info", "f", "--fail", "x"], [w, "--room", "-1"]):
            with self.subTest(argv=argv[1:]):
                rc, out, err = run(argv)
                self.assertEqual((rc, out), (2, ""), err)
                lines = err.splitlines()
                self.assertEqual(lines[-1],
                                 "Try 'kvcoord-worker --help' for more information.", err)
                self.assertRegex(lines[0], r"^kvcoord-worker: \S", err)
        rc, _, err = run([w])
        self.assertIn("no arguments: --info FILE is required", err)

    def test_repeated_option_with_a_value_is_refused(self):
        # Not the last one taken silently: exit 2 naming the option (and
        # the second value), before anything runs.
        b = lambda n: os.path.join(ARGS.bin, n)
        cases = [
            ([b("kvcoordd"), "--listen", "127.0.0.1:0", "--listen", "127.0.0.1:1",
              "--auth-token-file", "/nonexistent/kvcoord-test-token"],  # accepted: exit 1
             "kvcoordd: option '--listen' is given more than once (again as '127.0.0.1:1')"),
            ([b("kvcoord-diag"), "--segment", "a", "status", "--segment", "b"],
             "kvcoord-diag status: option '--segment' is given more than once (again as 'b')"),
            ([b("kvcoord-diag"), "--segment", "a", "--segment", "b", "status"],
             "kvcoord-diag: option '--segment' is given more than once (again as 'b')"),
            ([b("kvcoord-diag"), "--port", "6789", "status", "--segment", "b"],
             "--segment and --port both name the segment"),
            ([b("kvcoord-diag"), "rooms", "--limit", "1", "--limit", "2"],
             "option '--limit' is given more than once (again as '2')"),
            ([b("kvcoord-worker"), "--info", "f", "--rank", "1", "-r", "2"],
             "kvcoord-worker: option '--rank' is given more than once (again as '2')"),
        ]
        for argv, want in cases:
            with self.subTest(argv=argv[1:]):
                rc, out, err = run(argv)
                self.assertEqual((rc, out), (2, ""), err)
                self.assertIn(want, err)
                self.assertIn("give it once" if "both" not in want else "give one", err)

    def test_one_range_per_value(self):
        # --lock-timeout: kvcoordd, kvcoord-diag and Python's lock_timeout
        # take 1..3600000 ms (KVC_LIMIT_LOCK_TIMEOUT_MS); a rank: diag's
        # --rank and Python's 0..4294967294 (KVC_RANK_MAX)
        b = lambda n: os.path.join(ARGS.bin, n)
        rc, _, err = run([b("kvcoordd"), "--lock-timeout", "3600001"])
        self.assertEqual(rc, 2)
        self.assertIn("1..3600000", err)
        rc, _, err = run([b("kvcoord-diag"), "--lock-timeout", "3600001", "status"])
        self.assertEqual(rc, 2)
        self.assertIn("1..3600000", err)
        rc, _, err = run([b("kvcoord-diag"), "ranks", "--rank", "4294967295"])
        self.assertEqual(rc, 2)
        self.assertIn("0..4294967294", err)
        if ARGS.sanitized:  # Python's ranges: checked by the plain suite's run
            return
        code = ("import kvcoord, sys\n"
                "s = kvcoord.Segment(sys.argv[1], mode='create', max_ranks=8)\n"
                "for f in (lambda: kvcoord.Segment(sys.argv[1], lock_timeout=3600.001),\n"
                "          lambda: s.lookup(4294967295)):\n"
                "    try:\n"
                "        f()\n"
                "    except ValueError as e:\n"
                "        print(e)\n"
                "s.close(); kvcoord.unlink(sys.argv[1])\n")
        name = "kvctest-ranges-%d" % os.getpid()
        p = subprocess.run([sys.executable, "-c", code, name], capture_output=True, text=True,
                           timeout=120, check=False,
                           env=dict(os.environ, PYTHONPATH=os.path.join(ARGS.bin, "python")))
        self.assertEqual(p.returncode, 0, p.stderr)
        lines = p.stdout.splitlines()
        self.assertEqual(len(lines), 2, p.stdout)
        self.assertIn("between 0.001 and 3600 seconds", lines[0])
        self.assertIn("0..4294967294", lines[1])

    def test_kvcoord_sh_unknown_command_is_one_line(self):
        # the error and a hint, not the whole help before it
        rc, out, err = run(["bash", os.path.join(ARGS.tools, "kvcoord.sh"), "bogus"])
        self.assertEqual((rc, out), (2, ""))
        self.assertEqual(err.splitlines(), [
            "kvcoord.sh: unknown command 'bogus' (run, stop, test or help)",
            "Try 'tools/kvcoord.sh --help' for more information."])

    def test_help_exits_0_and_documents_the_exit_status(self):
        for name, (helpv, _) in self.bins().items():
            with self.subTest(name=name):
                rc, out, err = run(helpv)
                self.assertEqual(rc, 0, (name, err))
                low = out.lower()
                self.assertIn("exit status", low, name)
                part = low[low.index("exit status"):]
                # "2 ... usage", the 2 an entry of the list (kvcoord-diag's
                # entry for 2 names a broken segment first, on other lines)
                self.assertRegex(part, r"(?s)\b2\b[^0-9]{0,400}usage", name)
                self.assertNotRegex(part, r"\b64\b", name)

    def test_daemon_help_names_its_routes(self):
        # every route family of docs/http-api.md, the PD bootstrap's included
        rc, out, _ = run([os.path.join(ARGS.bin, "kvcoordd"), "--help"])
        self.assertEqual(rc, 0)
        for route in ("PUT /register_transfer_engine_info", "GET /get_transfer_engine_info",
                      "PUT /register_parallelism_config", "GET /health", "GET /ranks",
                      "GET /rooms/ROOM", "PUT /rooms/ROOM/failure", "GET /failures",
                      "GET /metrics", "PUT /route", "GET /route?", "POST /register_dp_rank",
                      "POST /query_dp_ranks"):
            self.assertIn(route, out)


def main():
    global ARGS
    p = argparse.ArgumentParser()
    p.add_argument("--bin", required=True)
    p.add_argument("--tools", required=True)
    p.add_argument("--sanitized", action="store_true",
                   help="a sanitizer build: its Python extension cannot be imported "
                        "without the runtimes preloaded")
    ARGS, rest = p.parse_known_args()
    prog = unittest.main(argv=[sys.argv[0]] + rest, exit=False, verbosity=2)
    return 0 if prog.result.wasSuccessful() else 1


if __name__ == "__main__":
    sys.exit(main())
