#!/usr/bin/env python3
"""The README's examples work as printed.

- The C program under "## Library API" is extracted from README.md, compiled
  exactly as printed (-std=c11 -Wall -Wextra -Werror) against this build's
  libkvcoord, and run against a real kvcoordd: it registers rank 9, reads it
  back, fails a room and prints the failure text; its kvc_close withdraws the
  rank (a worker's session ends with it).
- The curl block of "## HTTP API" runs against that kvcoordd with PORT set to
  its port: the registration answers OK and the lookup returns what it sent.

Usage: test_readme_snippet.py --readme README.md --include DIR --libdir DIR
       --daemon kvcoordd --cc CC [--sanitize]
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


def main():
    ap = argparse.ArgumentParser()
    for a in ("--readme", "--include", "--libdir", "--daemon", "--cc"):
        ap.add_argument(a, required=True)
    ap.add_argument("--sanitize", action="store_true")
    args = ap.parse_args()
    text = open(args.readme, encoding="utf-8").read()
    program = block_after(text, "## Library API", "c")
    curl = block_after(text, "## HTTP API", "sh", "With the Quick start running")

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
    print("PASS: README's C program compiled as printed and ran; curl examples ran")


if __name__ == "__main__":
    main()
