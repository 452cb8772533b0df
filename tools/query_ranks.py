#!/usr/bin/python3
"""query_ranks.py - look up every rank's transfer-engine info over HTTP.

Does what a remote sglang instance does before pulling weights from this
node: GET /get_transfer_engine_info?rank=N for each rank, with Python
`requests`, and reads `remote_instance_transfer_engine_info`
([session_id, weights_info_dict]).  Prints a table (rank, session_id,
entries, answer bytes: the HTTP body, generation, time) and the total time taken.  The
generation comes from kvcoordd's X-Kvcoord-Generation header, else from the
workers' logs (--worker-logs), else "-".

With --expect-dir DIR, each rank's answer is compared with DIR/rank-<N>.json
(as written by tools/gen_model_info.py): session_id equal and
weights_info_dict equal as JSON.

Exit status: 0 every rank answered 200 (and matched), 1 otherwise, 2 usage.
"""

import argparse
import json
import os
import re
import sys
import time

try:
    import requests
except ImportError:  # pragma: no cover - depends on the machine
    print("query_ranks.py: Python 'requests' is missing (Debian: apt-get install "
          "python3-requests)", file=sys.stderr)
    sys.exit(1)

WORKER_LINE = re.compile(r"rank=(\d+) generation=(\d+)")


def parse_args(argv):
    ap = argparse.ArgumentParser(
        prog="query_ranks.py",
        description="Query every rank's transfer-engine info from kvcoordd over HTTP, "
        "as a remote instance would, and print a summary table.",
        epilog="Exit status: 0 every rank answered (and matched --expect-dir), 1 a rank "
        "was missing, wrong or unreachable (or requests is not installed), 2 usage error.")
    ap.add_argument("--url", default="http://127.0.0.1:6789",
                    help="kvcoordd base URL (default: %(default)s)")
    ap.add_argument("--ranks", type=int, default=8,
                    help="query ranks 0..N-1 (default: %(default)s)")
    ap.add_argument("--expect-dir", metavar="DIR",
                    help="compare each answer with DIR/rank-<N>.json")
    ap.add_argument("--worker-logs", metavar="DIR",
                    help="read generations from DIR/worker-<N>.log (kvcoord-worker's "
                    "line) when the HTTP answer carries none")
    ap.add_argument("--timeout", type=float, default=10.0,
                    help="per-request timeout in seconds (default: %(default)s)")
    args = ap.parse_args(argv)
    if args.ranks < 1:
        ap.error("--ranks must be positive")
    return args


def worker_generation(log_dir, rank):
    if not log_dir:
        return None
    try:
        with open(os.path.join(log_dir, "worker-%d.log" % rank), encoding="utf-8",
                  errors="replace") as f:
            for line in f:
                m = WORKER_LINE.search(line)
                if m and int(m.group(1)) == rank:
                    return int(m.group(2))
    except OSError:
        pass
    return None


def compare(expect_dir, rank, session_id, weights):
    """Return "yes", or a short reason why the answer differs from the file."""
    path = os.path.join(expect_dir, "rank-%d.json" % rank)
    try:
        with open(path, encoding="utf-8") as f:
            want = json.load(f)["transfer_engine_info"]
    except (OSError, ValueError, KeyError) as e:
        return "no: cannot read %s: %s" % (path, e)
    if want["session_id"] != session_id:
        return "no: session_id %r != %r" % (session_id, want["session_id"])
    if want["weights_info_dict"] != weights:
        return "no: weights_info_dict differs"
    return "yes"


def query_rank(url, rank, timeout):
    """GET one rank as sglang does.  Returns (row dict, error or None)."""
    t0 = time.perf_counter()
    try:
        r = requests.get(url + "/get_transfer_engine_info", params={"rank": rank},
                         timeout=timeout)
    except requests.RequestException as e:
        return None, "rank %d: request failed: %s" % (rank, e)
    ms = (time.perf_counter() - t0) * 1000.0
    if r.status_code != 200:
        return None, "rank %d: HTTP %d %s" % (rank, r.status_code, r.text.strip()[:200])
    try:
        data = r.json()
        session_id, weights = data["remote_instance_transfer_engine_info"]
    except (ValueError, KeyError, TypeError) as e:
        return None, "rank %d: unexpected answer (%s): %s" % (rank, e, r.text[:200])
    # kvcoordd sends the rank's generation in a header (sglang's JSON shape
    # stays unchanged); other servers may have none.
    gen = r.headers.get("X-Kvcoord-Generation", data.get("generation"))
    row = {"rank": rank, "session_id": session_id, "weights": weights,
           "bytes": len(r.content), "ms": ms,
           "generation": int(gen) if str(gen).isdigit() else None}
    return row, None


def main(argv):
    args = parse_args(argv)
    url = args.url.rstrip("/")
    rows, errors = [], []
    t0 = time.perf_counter()
    for rank in range(args.ranks):
        row, err = query_rank(url, rank, args.timeout)
        if err:
            errors.append(err)
            continue
        if row["generation"] is None:
            row["generation"] = worker_generation(args.worker_logs, rank)
        if args.expect_dir:
            row["match"] = compare(args.expect_dir, rank, row["session_id"], row["weights"])
            if row["match"] != "yes":
                errors.append("rank %d: %s" % (rank, row["match"]))
        rows.append(row)
    total_ms = (time.perf_counter() - t0) * 1000.0

    # answer bytes: the HTTP answer's body (not the registered dict alone)
    head = "%4s  %-22s  %8s  %12s  %10s  %8s" % ("rank", "session_id", "entries", "answer bytes",
                                                  "generation", "ms")
    if args.expect_dir:
        head += "  match"
    print(head)
    for row in rows:
        gen = "-" if row["generation"] is None else str(row["generation"])
        line = "%4d  %-22s  %8d  %12d  %10s  %8.2f" % (
            row["rank"], row["session_id"], len(row["weights"]), row["bytes"], gen, row["ms"])
        if args.expect_dir:
            line += "  " + row["match"].split(":")[0]
        print(line)
    total_bytes = sum(r["bytes"] for r in rows)
    print("%d of %d ranks answered, %d answer bytes, %.1f ms in all (requests, JSON decoding, checks; "
          "GET %s/get_transfer_engine_info)"
          % (len(rows), args.ranks, total_bytes, total_ms, url))
    for err in errors:
        print("query_ranks.py: " + err, file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
