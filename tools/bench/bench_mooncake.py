#!/usr/bin/python3
"""bench_mooncake.py - sglang's transfer-engine call pattern through
kvcoord.mooncake.TransferEngine and Mooncake's own TransferEngine, side by
side with iperf3 in one run.

    bench_mooncake.py pages [--engines kvcoord,kvcoord-socket,mooncake,mooncake-pool]
                            [--pages 4096,65536,1048576] [--threads 1,4]
                            [--per-call 256] [--secs 5] [--rounds 1] [--warmup 0]
    bench_mooncake.py weights [--engines ...] [--model llama-3.1-8b --tp 8]

pages: one initiator process, one target process (loopback, P2PHANDSHAKE,
TCP), batch_transfer_sync_write of PER_CALL scattered pages (shuffled, no two
adjacent on either side, so no engine can merge them) per call, from 1 or 4
caller threads for SECS (each thread first makes WARMUP untimed calls of its
own pages: the first transfer of a page costs far more here, see
docs/transfer.md "The first transfer of a page"); then every page of every
thread's last call is
hashed on both sides (verify=True when equal).  GB/s counts calls that
returned 0.
weights: the target registers the weights of one TP rank of the model
(tools/gen_model_info.py's shapes, host memory, each tensor in its own
registered buffer, random bytes) and the initiator reads every parameter with
one batch_transfer_sync_read, as sglang's remote-instance weight loader does;
GB/s of the whole pull, hashes compared.
Each row prints iperf3 (one stream, -l 1M, same round) and the ratio.

Mooncake's engine comes from a build of ../shared/anchors/mooncake-te
(MOONCAKE_OUT, default /work/anchors-out/mooncake): its py/ on PYTHONPATH and
build-mc/mooncake-common on LD_LIBRARY_PATH; mooncake-pool is Mooncake with
MC_TCP_ENABLE_CONNECTION_POOL=1.  kvcoord's comes from PYTHONPATH (e.g.
build/python): kvcoord is its default (both processes on this host: the
bytes are copied by process_vm_readv, docs/transfer.md "Same-host copy"),
kvcoord-socket the same with KVCOORD_FORCE_SOCKET=1 (the bytes through the
socket: the figure that holds across nodes).  Each kvcoord row says how many
bytes the target copied (copied_GB); each (page, threads) group ends with a
line of kvcoord's and kvcoord-socket's ratios to the best Mooncake row.  Figures, not assertions; run it on a quiet machine and say
the load (printed with each round).
"""

import argparse
import ctypes
import hashlib
import json
import mmap
import os
import random
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
MOONCAKE_OUT = os.environ.get("MOONCAKE_OUT", "/work/anchors-out/mooncake")


# ---- both sides ---------------------------------------------------------------

def engine_class(kind):
    if kind == "kvcoord":
        from kvcoord.mooncake import TransferEngine
    else:
        from mooncake.engine import TransferEngine
    return TransferEngine


def new_engine(kind):
    e = engine_class(kind)()
    if e.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") != 0:
        raise SystemExit("%s: initialize failed" % kind)
    return e


def buffer(size, seed=None):
    m = mmap.mmap(-1, size)
    if seed is not None:
        rnd = random.Random(seed)
        for off in range(0, size, 64 << 20):  # randbytes is limited to < 256 MiB
            n = min(64 << 20, size - off)
            m[off:off + n] = rnd.randbytes(n)
    return m, ctypes.addressof(ctypes.c_char.from_buffer(m))


def scattered(n, total, seed):
    idx = list(range(0, total, 2))
    random.Random(seed).shuffle(idx)
    return idx[:n]


def sha(m, ranges):
    h = hashlib.sha256()
    for off, n in ranges:
        h.update(m[off:off + n])
    return h.hexdigest()


def session_of(e):
    return "127.0.0.1:%d" % e.get_rpc_port()


def descriptor_of(e):
    return e.descriptor() if hasattr(e, "descriptor") else ""


# ---- the target process -----------------------------------------------------------

def target_main(kind):
    """JSON lines on stdin: {"size"} -> buffer; {"weights": [[name, numel, esz]]};
    {"hash": [[off, len]]}; {"exit"}."""
    e = new_engine(kind)
    bufs = []
    for line in sys.stdin:
        c = json.loads(line)
        if "size" in c:
            m, a = buffer(c["size"], seed=0)  # touched: no first-touch faults in the figures
            bufs.append(m)
            assert e.register_memory(a, c["size"]) == 0
            out = {"sid": session_of(e), "addr": a, "desc": descriptor_of(e)}
        elif "weights" in c:
            rnd = random.Random(c["seed"])
            info, sums = {}, {}
            for name, numel, esz in c["weights"]:
                n = numel * esz
                m, a = buffer(n, seed=rnd.random())
                bufs.append(m)
                assert e.register_memory(a, n) == 0
                info[name] = [a, numel, esz]
                sums[name] = hashlib.sha256(m[:]).hexdigest()
            out = {"sid": session_of(e), "info": info, "sha": sums, "desc": descriptor_of(e)}
        elif "hash" in c:
            out = {"sha": sha(bufs[0], c["hash"])}
        elif "stats" in c:
            out = e.stats() if hasattr(e, "stats") else {}
        else:
            break
        print(json.dumps(out), flush=True)


class Target:
    def __init__(self, kind, env):
        self.p = subprocess.Popen([sys.executable, __file__, "_target", kind],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                  env=env)

    def cmd(self, **c):
        self.p.stdin.write(json.dumps(c) + "\n")
        self.p.stdin.flush()
        line = self.p.stdout.readline()
        if not line:
            raise SystemExit("target died (exit %s)" % self.p.poll())
        return json.loads(line)

    def close(self):
        try:
            self.p.stdin.write(json.dumps({"exit": 1}) + "\n")
            self.p.stdin.close()
        except OSError:
            pass
        self.p.wait(60)


def env_for(kind):
    env = dict(os.environ)
    env.pop("MC_TCP_ENABLE_CONNECTION_POOL", None)
    env.pop("KVCOORD_FORCE_SOCKET", None)
    if kind == "kvcoord-socket":
        env["KVCOORD_FORCE_SOCKET"] = "1"
    if kind.startswith("mooncake"):
        env["PYTHONPATH"] = os.path.join(MOONCAKE_OUT, "py")
        env["LD_LIBRARY_PATH"] = os.path.join(MOONCAKE_OUT, "build-mc", "mooncake-common")
        env["GLOG_minloglevel"] = "2"
        if kind == "mooncake-pool":
            env["MC_TCP_ENABLE_CONNECTION_POOL"] = "1"
    return env


# ---- the initiator (a child of the driver, in the engine's environment) ----------

def pages_main(kind, page, per_call, threads, secs, warmup=0):
    env = env_for(kind)
    npages = per_call * threads
    size = 2 * npages * page
    side = "kvcoord" if kind.startswith("kvcoord") else "mooncake"
    t = Target(side, env)
    r = t.cmd(size=size)
    e = new_engine(side)
    m, a = buffer(size, seed=1)
    assert e.register_memory(a, size) == 0
    if side == "kvcoord":
        from kvcoord import _engine
        if not _engine.HAVE_FETCH:
            e.peer_add(r["desc"])
    src = scattered(npages, size // page, 2)
    dst = scattered(npages, size // page, 3)
    done = [0] * threads
    fails = [0] * threads
    lat = []
    stop = [False]

    def work(k):
        s = [a + i * page for i in src[k * per_call:(k + 1) * per_call]]
        d = [r["addr"] + i * page for i in dst[k * per_call:(k + 1) * per_call]]
        lens = [page] * per_call
        for _ in range(warmup):
            e.batch_transfer_sync_write(r["sid"], s, d, lens)
        ready.wait()
        while not stop[0]:
            t1 = time.monotonic()
            if e.batch_transfer_sync_write(r["sid"], s, d, lens) == 0:
                done[k] += 1
                lat.append(time.monotonic() - t1)
            else:
                fails[k] += 1

    ready = threading.Barrier(threads + 1)
    ths = [threading.Thread(target=work, args=(k,)) for k in range(threads)]
    [x.start() for x in ths]
    ready.wait()  # every thread's warm-up calls are done
    t0 = time.monotonic()
    time.sleep(secs)
    stop[0] = True
    [x.join() for x in ths]
    dt = time.monotonic() - t0
    ok = t.cmd(hash=[[i * page, page] for i in dst])["sha"] == sha(m, [[i * page, page]
                                                                       for i in src])
    copied = t.cmd(stats=1).get("same_host_bytes") if side == "kvcoord" else None
    t.close()
    lat.sort()
    print(json.dumps({"gbps": round(sum(done) * per_call * page / dt / 1e9, 3),
                      "calls": sum(done), "failed": sum(fails), "verify": ok,
                      "call_ms_median": round(1e3 * lat[len(lat) // 2], 1) if lat else None,
                      "call_ms_max": round(1e3 * lat[-1], 1) if lat else None,
                      **({"copied_GB": round(copied / 1e9, 2)} if copied is not None else {})}))


def weights_main(kind, model, tp):
    import tempfile

    env = env_for(kind)
    with tempfile.TemporaryDirectory() as d:
        subprocess.run([sys.executable, os.path.join(ROOT, "tools", "gen_model_info.py"),
                        "--model", model, "--tp", str(tp), "--out", d, "--quiet"], check=True)
        with open(os.path.join(d, "rank-0.json")) as f:
            info = json.load(f)["transfer_engine_info"]["weights_info_dict"]
    shapes = [[k, v[1], v[2]] for k, v in info.items()]
    side = "kvcoord" if kind.startswith("kvcoord") else "mooncake"
    t = Target(side, env)
    r = t.cmd(weights=shapes, seed=5)
    e = new_engine(side)
    if side == "kvcoord":
        from kvcoord import _engine
        if not _engine.HAVE_FETCH:
            e.peer_add(r["desc"])
    names = list(r["info"])
    sizes = [r["info"][k][1] * r["info"][k][2] for k in names]
    total = sum(sizes)
    m, a = buffer(total)
    assert e.register_memory(a, total) == 0
    offs, o = [], 0
    for n in sizes:
        offs.append(o)
        o += n
    t0 = time.monotonic()
    rc = e.batch_transfer_sync_read(r["sid"], [a + x for x in offs],
                                    [r["info"][k][0] for k in names], sizes)
    dt = time.monotonic() - t0
    ok = rc == 0 and all(hashlib.sha256(m[x:x + n]).hexdigest() == r["sha"][k]
                         for k, x, n in zip(names, offs, sizes))
    t.close()
    print(json.dumps({"gbps": total / dt / 1e9, "bytes": total, "entries": len(names),
                      "rc": rc, "verify": ok, "secs": dt}))


# ---- the driver ----------------------------------------------------------------------

def iperf3(secs):
    """GB/s of one iperf3 stream (-l 1M) over loopback, secs long (3 tries)."""
    for _ in range(3):
        port = random.randint(20000, 40000)
        srv = subprocess.Popen(["iperf3", "-s", "-1", "-p", str(port)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(0.5)
        try:
            out = subprocess.run(["iperf3", "-c", "127.0.0.1", "-p", str(port), "-P", "1", "-l",
                                  "1M", "-t", str(max(1, int(secs))), "-J"],
                                 capture_output=True, text=True, timeout=60 + secs)
            end = json.loads(out.stdout).get("end", {})
            if "sum_received" in end:
                return end["sum_received"]["bits_per_second"] / 8e9
        except (ValueError, subprocess.TimeoutExpired):
            pass
        finally:
            if srv.poll() is None:
                srv.kill()
            srv.wait(30)
    raise SystemExit("iperf3 failed three times")


def child(args, kind):
    r = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True,
                       env=env_for(kind), timeout=600)
    lines = [x for x in r.stdout.splitlines() if x.startswith("{")]
    if r.returncode or not lines:
        return {"error": (r.stderr or r.stdout)[-400:]}
    return json.loads(lines[-1])


def load():
    return os.getloadavg()[0]


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "_target":
        return target_main(sys.argv[2])
    if len(sys.argv) > 1 and sys.argv[1] == "_pages":
        k, p, n, th, s, w = sys.argv[2:8]
        return pages_main(k, int(p), int(n), int(th), float(s), int(w))
    if len(sys.argv) > 1 and sys.argv[1] == "_weights":
        return weights_main(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("mode", choices=["pages", "weights"])
    ap.add_argument("--engines", default="kvcoord,kvcoord-socket,mooncake,mooncake-pool")
    ap.add_argument("--pages", default="4096,65536,1048576")
    ap.add_argument("--threads", default="1,4")
    ap.add_argument("--per-call", type=int, default=256)
    ap.add_argument("--secs", type=float, default=5)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--warmup", type=int, default=0,
                    help="untimed calls per thread before the timed window (default 0: "
                         "the figures include each page's first transfer)")
    ap.add_argument("--model", default="llama-3.1-8b")
    ap.add_argument("--tp", type=int, default=8)
    a = ap.parse_args()
    engines = a.engines.split(",")
    for rnd in range(a.rounds):
        if a.mode == "pages":
            for page in map(int, a.pages.split(",")):
                for th in map(int, a.threads.split(",")):
                    ip = iperf3(a.secs)
                    got = {}
                    for kind in engines:
                        r = child(["_pages", kind, str(page), str(a.per_call), str(th),
                                   str(a.secs), str(a.warmup)], kind)
                        got[kind] = r.get("gbps") if r.get("verify") and not r.get("failed") \
                            else None
                        print("round=%d page=%d per_call=%d threads=%d warmup=%d engine=%s %s "
                              "iperf3_GBps=%.3f ratio=%s load=%.1f" % (
                                  rnd, page, a.per_call, th, a.warmup, kind,
                                  " ".join("%s=%s" % kv for kv in r.items()), ip,
                                  "%.2f" % (r["gbps"] / ip) if "gbps" in r else "-", load()),
                              flush=True)
                    mc = max([got[k] or 0 for k in got if k.startswith("mooncake")] or [0])
                    if mc:
                        print("round=%d page=%d threads=%d vs_mooncake_best=%.3f %s load=%.1f" % (
                            rnd, page, th, mc, " ".join(
                                "%s=%s" % (k, "%.2fx" % (got[k] / mc) if got[k] else "-")
                                for k in got if k.startswith("kvcoord")), load()), flush=True)
        else:
            ip = iperf3(a.secs)
            for kind in engines:
                r = child(["_weights", kind, a.model, str(a.tp)], kind)
                print("round=%d weights=%s tp=%d engine=%s %s iperf3_GBps=%.3f ratio=%s "
                      "load=%.1f" % (rnd, a.model, a.tp, kind,
                                     " ".join("%s=%s" % kv for kv in r.items()), ip,
                                     "%.2f" % (r["gbps"] / ip) if "gbps" in r else "-", load()),
                      flush=True)


if __name__ == "__main__":
    main()
