#!/usr/bin/python3
"""A full /dev/shm gives errors, never SIGBUS.

In a private mount namespace with a 16 MiB tmpfs on /dev/shm (as in a small
container): kvcoordd with default capacities refuses to create its segment
with a message naming /dev/shm; with small tables it starts, registrations
fill the space until one is answered 507 naming /dev/shm, and the daemon
keeps serving (earlier ranks intact, /health 200).  Skips (77) unless root
and unshare(1) can make the namespace.

Usage: test_small_shm.py KVCOORDD
"""
import json
import os
import subprocess
import sys
import time
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
from kvctest import free_port  # noqa: E402  (the tests' one helper module)

SKIP = 77


def put(port, rank, nbytes):
    wid = {"model.layers.%d.w" % i: [0x7F0000000000 + i * 256, 4096, 2]
           for i in range(nbytes // 48)}
    body = json.dumps({"rank": rank, "transfer_engine_info": {
        "session_id": "127.0.0.1:%d" % (16000 + rank), "weights_info_dict": wid}}).encode()
    req = urllib.request.Request("http://127.0.0.1:%d/register_transfer_engine_info" % port,
                                 data=body, method="PUT")
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def get(port, path):
    try:
        with urllib.request.urlopen("http://127.0.0.1:%d%s" % (port, path), timeout=30) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def wait_health(port, proc):
    for _ in range(300):
        if proc.poll() is not None:
            return False
        try:
            if get(port, "/health") == 200:
                return True
        except OSError:
            pass
        time.sleep(0.05)
    return False


def inside(daemon):
    # 1. default capacities need ~56 MiB of tables: refused, cleanly.
    p = subprocess.run([daemon, "--listen", "127.0.0.1:%d" % free_port(), "--segment",
                        "kvc-small", "--fresh"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 1, "exit %d, stderr %s" % (p.returncode, p.stderr)
    assert "no room in /dev/shm" in p.stderr, p.stderr
    assert not os.path.exists("/dev/shm/kvc-small"), "a half-made segment was left"
    # 2. small tables: starts; registrations fill /dev/shm until a 507.
    port = free_port()
    d = subprocess.Popen([daemon, "--listen", "127.0.0.1:%d" % port, "--segment", "kvc-small",
                          "--fresh", "--max-ranks", "64", "--max-rooms", "64",
                          "--arena-bytes", "64M", "--max-info-bytes", "8M"],
                         stderr=subprocess.PIPE, text=True)
    try:
        assert wait_health(port, d), "kvcoordd did not start: %s" % d.stderr.read()
        statuses = []
        for rank in range(8):
            st, body = put(port, rank, 3 << 20)
            statuses.append(st)
            if st != 200:
                assert st == 507, (st, body)
                assert "no room in /dev/shm" in body, body
                break
        assert statuses[0] == 200 and statuses[-1] == 507, statuses
        assert d.poll() is None, "kvcoordd died: %s" % d.stderr.read()
        assert get(port, "/health") == 200
        assert get(port, "/get_transfer_engine_info?rank=0") == 200
        print("registrations until /dev/shm was full:", statuses)
    finally:
        d.terminate()
        d.wait(timeout=30)
    assert d.returncode == 0, d.returncode


def main():
    if len(sys.argv) == 3 and sys.argv[2] == "--inside":
        inside(sys.argv[1])
        print("ok")
        return 0
    if os.geteuid() != 0:
        print("SKIP: needs root (a private mount namespace with a small /dev/shm)")
        return SKIP
    probe = subprocess.run(["unshare", "-m", "--propagation", "private", "true"],
                           capture_output=True)
    if probe.returncode != 0:
        print("SKIP: unshare -m is not available here")
        return SKIP
    return subprocess.call(["unshare", "-m", "--propagation", "private", "sh", "-c",
                            "mount -t tmpfs -o size=16M tmpfs /dev/shm && exec \"$0\" \"$@\"",
                            sys.executable, os.path.abspath(__file__), sys.argv[1], "--inside"])


if __name__ == "__main__":
    sys.exit(main())
