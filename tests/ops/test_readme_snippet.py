#!/usr/bin/env python3
"""The README's examples work as printed, in the order a reader runs them.

- The C program of docs/library.md (the README's "C" pointer) is extracted, compiled
  exactly as printed (-std=c11 -Wall -Wextra -Werror) against this build's
  libkvcoord, and run against a real kvcoordd: it registers rank 9, reads it
  back, fails a room and prints the failure text; its kvc_close withdraws the
  rank (a worker's session ends with it).
- Then, on the same kvcoordd and segment (as a reader following the README
  would), the README's first Python example ("## Using it directly") runs
  as printed, with the Quick start's rank 0 registered first: what the C
  program left behind (its failed room) must not trip it.
- docs/mooncake.md's "Using it" example (two kvcoord.mooncake engines on
  127.0.0.1) runs as printed and prints what its comments say (--mooncake,
  with --pythonpath).
- The curl block of "## HTTP API" runs against that kvcoordd with PORT set to
  its port: the registration answers OK and the lookup returns what it sent.

Usage: test_readme_snippet.py --readme README.md --library docs/library.md
       --include DIR --libdir DIR --daemon kvcoordd --cc CC [--pythonpath DIR [--mooncake docs/mooncake.md]]
       [--sanitize]
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request


def fail(msg):
    print("FAIL: " + msg)
    sys.exit(1)


def block_after(text, heading, lang, marker=None):
    """The first ```lang block after heading (and after marker, if given)."""
    at = text.find(heading)
    if at < 0:
        fail("README has no %r" % heading)
    if marker:
        at = text.find(marker, at)
        if at < 0:
            fail("README has no %r after %r" % (marker, heading))
    m = re.compile(r"^```%s\n(.*?)^```$" % lang, re.S | re.M).search(text, at)
    if not m:
        fail("no ```%s block after %r" % (lang, heading))
    return m.group(1)


def start_daemon(daemon, segment, log):
    p = subprocess.Popen([daemon, "--listen", "127.0.0.1:0", "--segment", segment, "--fresh"],
                         stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        with open(log.name, encoding="utf-8", errors="replace") as f:
            m = re.search(r"listening addr=127\.0\.0\.1:(\d+)", f.read())
        if m:
            return p, int(m.group(1))
        if p.poll() is not None:
            break
        time.sleep(0.02)
    p.kill()
    p.wait()
    fail("kvcoordd did not start")
    return None, 0


def run_python_example(code, segment, pythonpath):
    """The README's Python example as printed (port 6789's segment named
    instead), after the C program, with rank 0 registered as the Quick
    start's workers do."""
    ours = code.replace("port=6789", repr(segment), 1)
    if ours == code:
        fail("the README's Python example does not use port=6789")
    env = dict(os.environ, PYTHONPATH=pythonpath)
    setup = ("import kvcoord, time\n"
             "seg = kvcoord.Segment(%r, role='worker', rank=0)\n"
             "seg.register(0, '127.0.0.1:16000', {'w': [1, 2, 2]})\n"
             "print('ready', flush=True)\n"
             "import sys; sys.stdin.read()\n" % segment)
    holder = subprocess.Popen([sys.executable, "-c", setup], env=env, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        if holder.stdout.readline().strip() != "ready":
            fail("could not register the stand-in rank 0")
        r = subprocess.run([sys.executable, "-c", ours], env=env, capture_output=True,
                           text=True, timeout=120, check=False)
        print(r.stdout + r.stderr)
        if r.returncode != 0:
            fail("the README's Python example failed after the C program (exit %d)"
                 % r.returncode)
        if r.stdout != "127.0.0.1:16000 1 1\n":
            fail("the README's Python example printed %r" % r.stdout)
    finally:
        holder.stdin.close()
        holder.wait(30)


def printed_comments(code):
    """What a documented example says it prints, in order: the comment after
    each print(...) on its line, or on the comment line right below it."""
    lines, want = code.split("\n"), []
    for i, line in enumerate(lines):
        if not line.lstrip().startswith("print("):
            continue
        m = re.search(r"\)\s+#\s?(.*)$", line)
        if m:
            want.append(m.group(1).strip())
        elif i + 1 < len(lines) and lines[i + 1].lstrip().startswith("#"):
            want.append(lines[i + 1].lstrip()[1:].strip())
    return want


def run_mooncake_example(path, pythonpath):
    """docs/mooncake.md's "Using it" block, as printed: it must exit 0 and
    print what its comments say, line for line."""
    code = block_after(open(path, encoding="utf-8").read(), "## Using it", "python")
    want = printed_comments(code)
    if len(want) < 2:
        fail("mooncake.md's example does not say what it prints")
    work = tempfile.mkdtemp(prefix="kvc-mooncake-doc-")
    with open(os.path.join(work, "example.py"), "w", encoding="utf-8") as f:
        f.write(code)
    env = dict(os.environ, PYTHONPATH=pythonpath)
    r = subprocess.run([sys.executable, "example.py"], cwd=work, env=env, capture_output=True,
                       text=True, timeout=120, check=False)
    shutil.rmtree(work, ignore_errors=True)
    print("mooncake.md's example:\n" + r.stdout + r.stderr)
    if r.returncode != 0:
        fail("mooncake.md's example exited %d" % r.returncode)
    got = r.stdout.rstrip("\n").split("\n")
    if got != want:
        fail("mooncake.md's example printed %r; its comments say %r" % (got, want))


def main():
    ap = argparse.ArgumentParser()
    for a in ("--readme", "--library", "--include", "--libdir", "--daemon", "--cc"):
        ap.add_argument(a, required=True)
    ap.add_argument("--pythonpath", help="the build's python/ (runs the Python example too)")
    ap.add_argument("--mooncake", help="docs/mooncake.md (its example runs with --pythonpath)")
    ap.add_argument("--sanitize", action="store_true")
    args = ap.parse_args()
    text = open(args.readme, encoding="utf-8").read()
    program = block_after(open(args.library, encoding="utf-8").read(), "# The C library", "c")
    curl = block_after(text, "## Using it directly", "sh", "With the Quick start running")
    python = block_after(text, "## Using it directly", "python")

    work = tempfile.mkdtemp(prefix="kvc-readme-")
    src, exe = os.path.join(work, "app.c"), os.path.join(work, "app")
    with open(src, "w", encoding="utf-8") as f:
        f.write(program)
    cmd = [args.cc, "-std=c11", "-Wall", "-Wextra", "-Werror", "-I" + args.include, "-o", exe,
           src, "-L" + args.libdir, "-Wl,-rpath," + args.libdir, "-lkvcoord"]
    if args.sanitize:
        cmd[1:1] = ["-fsanitize=address,undefined"]
    print("$ " + " ".join(cmd))
    r = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if r.returncode != 0:
        fail("the README's C program does not compile as printed:\n" + r.stderr)

    segment = "kvctest-readme-%d" % os.getpid()
    log = tempfile.NamedTemporaryFile(prefix="kvcoordd-", suffix=".log", delete=False)
    daemon, port = start_daemon(args.daemon, segment, log)
    try:
        r = subprocess.run([exe, segment], capture_output=True, text=True, timeout=60,
                           check=False)
        print(r.stdout + r.stderr)
        if r.returncode != 0:
            fail("the README's C program exited %d" % r.returncode)
        want = ("rank 9 (generation 1): 10.0.0.5:16009 "
                '{"lm_head.weight": [139637976727552, 65667072, 2]}')
        if want not in r.stdout:
            fail("the program did not read rank 9 back: want %r" % want)
        want = ("KV transfer of room 4242 failed on rank 3 (this rank; code 12): "
                "ibv_reg_mr: Cannot allocate memory")
        if want not in r.stdout:
            fail("the program did not print the failure text: want %r" % want)
        url = "http://127.0.0.1:%d/get_transfer_engine_info?rank=9" % port
        try:
            urllib.request.urlopen(url, timeout=10)
            fail("rank 9 still served after the worker's kvc_close")
        except urllib.error.HTTPError as e:
            body = json.loads(e.read())
            if e.code != 404 or "withdrawn" not in body["detail"]:
                fail("rank 9 after kvc_close: %d %s" % (e.code, body))

        if args.pythonpath:
            run_python_example(python, segment, args.pythonpath)
            if args.mooncake:
                run_mooncake_example(args.mooncake, args.pythonpath)

        script = curl.replace("PORT=6789", "PORT=%d" % port, 1)
        if script == curl:
            fail("the curl block does not set PORT=6789 first")
        r = subprocess.run(["bash", "-euo", "pipefail", "-c", script], capture_output=True,
                           text=True, timeout=60, check=False)
        print(r.stdout + r.stderr)
        if r.returncode != 0:
            fail("the README's curl block failed (exit %d)" % r.returncode)
        if not r.stdout.startswith("OK"):
            fail("the curl block's registration did not answer OK")
        if '"remote_instance_transfer_engine_info":["10.0.0.5:16008"' not in r.stdout.replace(
                " ", ""):
            fail("the curl block's lookup of rank 8 did not return what it registered")
        if '"reason":"RDMA WRITE failed"' not in r.stdout:
            fail("the curl block's room 42 does not show its failure")
    finally:
        daemon.terminate()
        daemon.wait(30)
        try:
            os.unlink("/dev/shm/" + segment)
        except FileNotFoundError:
            pass
        log.close()
        os.unlink(log.name)
        shutil.rmtree(work, ignore_errors=True)
    print("PASS: the C program compiled as printed and ran; the Python and curl examples ran")


if __name__ == "__main__":
    main()
