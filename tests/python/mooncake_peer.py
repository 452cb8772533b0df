"""A peer process for the kvcoord.mooncake tests: one TransferEngine and one
buffer, driven by JSON lines on stdin, answering JSON lines on stdout.

    {"op": "init", "size": N, "seed": S, "port": P, "guard": ADDR, "register": [off, len]}
        -> {"sid", "addr", "desc"}: a buffer of N bytes (random bytes from seed
           S, zeros without), registered whole or [off, +len) only; port P
           (0: any) is bound with MC_LEGACY_RPC_PORT_BINDING, as Mooncake;
           guard ADDR: also map N bytes at ADDR (a former peer's addresses),
           filled with 0xEE and NOT registered.
    {"op": "hash", "ranges": [[off, len], ...], "guard": false}
        -> {"sha": sha256 of those ranges of the buffer (or of the guard)}
    {"op": "weights", "shapes": [[name, numel, element_size], ...], "seed": S}
        -> {"info": {name: [ptr, numel, element_size]}, "sha": {name: sha256}}:
           every tensor in its own registered buffer (the seeds' flow)
    {"op": "put_info", "url": U, "rank": R, "info": {...}}
        -> {"status": HTTP status of PUT /register_transfer_engine_info}
    {"op": "exit"}
"""

import ctypes
import hashlib
import json
import mmap
import os
import random
import sys
import urllib.request

from kvcoord.mooncake import TransferEngine

libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                      ctypes.c_long]
MAP_FIXED_NOREPLACE = 0x100000


def buffer(size):
    m = mmap.mmap(-1, size)
    return m, ctypes.addressof(ctypes.c_char.from_buffer(m))


def fill(m, size, seed):
    rnd = random.Random(seed)
    m[:size] = rnd.randbytes(size)


def main():
    engine = TransferEngine()
    keep = []
    buf = addr = guard = None
    for line in sys.stdin:
        cmd = json.loads(line)
        op = cmd["op"]
        out = {}
        if op == "init":
            size = cmd["size"]
            if cmd.get("guard"):
                g = libc.mmap(cmd["guard"], size, 3, 0x22 | MAP_FIXED_NOREPLACE, -1, 0)
                if g != cmd["guard"]:
                    raise SystemExit("guard mapping at %#x failed: %s" % (cmd["guard"], g))
                ctypes.memset(g, 0xEE, size)
                guard = (ctypes.c_char * size).from_address(g)
            buf, addr = buffer(size)
            if cmd.get("seed") is not None:
                fill(buf, size, cmd["seed"])
            host = "127.0.0.1"
            if cmd.get("port"):
                os.environ["MC_LEGACY_RPC_PORT_BINDING"] = "1"
                host = "127.0.0.1:%d" % cmd["port"]
            assert engine.initialize(host, "P2PHANDSHAKE", "tcp", "") == 0, engine.last_error()
            off, n = cmd.get("register") or (0, size)
            assert engine.register_memory(addr + off, n) == 0, engine.last_error()
            out = {"sid": engine.get_session_id(), "addr": addr, "desc": engine.descriptor()}
        elif op == "hash":
            h = hashlib.sha256()
            src = guard if cmd.get("guard") else buf
            for off, n in cmd["ranges"]:
                h.update(bytes(src[off:off + n]))
            out = {"sha": h.hexdigest()}
        elif op == "weights":
            rnd = random.Random(cmd["seed"])
            info, sha = {}, {}
            for name, numel, esize in cmd["shapes"]:
                n = numel * esize
                m, a = buffer(n)
                m[:n] = rnd.randbytes(n)
                assert engine.register_memory(a, n) == 0, engine.last_error()
                keep.append(m)
                info[name] = [a, numel, esize]
                sha[name] = hashlib.sha256(m[:n]).hexdigest()
            out = {"info": info, "sha": sha}
        elif op == "put_info":
            body = json.dumps({"tp_rank": cmd["rank"], "transfer_engine_info": {
                "session_id": engine.get_session_id(), "weights_info_dict": cmd["info"]}})
            req = urllib.request.Request(cmd["url"] + "/register_transfer_engine_info",
                                         data=body.encode(), method="PUT",
                                         headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=30) as r:
                out = {"status": r.status}
        elif op == "exit":
            engine.close()
            print(json.dumps({}), flush=True)
            return
        print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
