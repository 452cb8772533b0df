#!/usr/bin/env bash
# bench_burst.sh - connection bursts and slow peers: the latency of an
# established keep-alive connection to kvcoordd while 1000 connections are
# opened at once, and while hundreds of slow peers keep connecting and
# trickle their headers, against nginx (nginx-light, ONE worker) serving
# /health as a static file, in the same run, alternating
# (tools/bench/burst_client.py does the timing).
#
# Figures are printed, never judged.  Everything started here is stopped and
# every temporary file removed on exit.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
PY=/usr/bin/python3
BUILD=${KVCOORD_BUILD:-$ROOT/build}
ROUNDS=5
BURST=1000
TRICKLE=300
FRESH=8

usage() {
    cat <<USAGE
Usage: tools/bench/bench_burst.sh [--build DIR] [--rounds N] [--burst N] [--trickle N]
                                  [--fresh N]

GET /health on one established connection to kvcoordd and to nginx (1 worker):
idle, right after N connections opened at once, and while slow peers connect
and trickle.  Medians over rounds, and the ratio kvcoordd/nginx.

Options:
  --build DIR    build directory with kvcoordd (default: \$KVCOORD_BUILD or build/)
  --rounds N     rounds, alternating the servers (default $ROUNDS)
  --burst N      connections opened at once (default $BURST)
  --trickle N    slow peers at most (default $TRICKLE)
  --fresh N      then N rounds of the first burst on servers just started: each
                 round starts kvcoordd and nginx afresh, opens N connections at
                 once and times GET /health on a new connection (default $FRESH;
                 0: skip)
  -h, --help     print this help

Needs: kvcoordd built, nginx (nginx-light), curl, python3.
Exit status: 0 measured, 1 a run failed (a build, the daemon, a client), 2 usage
error (an unknown option: a message on stderr).
USAGE
}

while (($#)); do
    case $1 in
        --build | --rounds | --burst | --trickle | --fresh)
            (($# >= 2)) || { echo "bench_burst.sh: $1 needs a value" >&2; exit 2; } ;;&
        --build) BUILD=$2; shift 2 ;;
        --rounds) ROUNDS=$2; shift 2 ;;
        --burst) BURST=$2; shift 2 ;;
        --trickle) TRICKLE=$2; shift 2 ;;
        --fresh) FRESH=$2; shift 2 ;;
        -h|--help) usage; exit 0 ;;
        *) echo "bench_burst.sh: unknown option '$1'" >&2; usage >&2; exit 2 ;;
    esac
done

die() { printf 'bench_burst.sh: %s\n' "$*" >&2; exit 1; }
log() { printf '==> %s\n' "$*"; }

KVCOORDD=$BUILD/kvcoordd
NGINX=$(command -v nginx || echo /usr/sbin/nginx)
[[ -x $KVCOORDD ]] || die "$KVCOORDD not found: build first (cmake -B build && cmake --build build)"
[[ -x $NGINX ]] || die "nginx not found (Debian package nginx-light)"

TMP=$(mktemp -d /tmp/kvcbench-burst.XXXXXX)
SEGMENT=kvcbench-burst-$$
DAEMON_PID=
BASELINE_PID=

# shellcheck source=bench_lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/bench_lib.sh"

ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
KPORT=$(free_port)
"$KVCOORDD" --listen "127.0.0.1:$KPORT" --segment "$SEGMENT" --fresh \
    >"$TMP/kvcoordd.log" 2>&1 &
DAEMON_PID=$!
wait_http "http://127.0.0.1:$KPORT/health" ||
    die "kvcoordd did not answer /health: $(tail -20 "$TMP/kvcoordd.log")"

mkdir -p "$TMP/www" "$TMP/nginx"
printf OK >"$TMP/www/health"
chmod 755 "$TMP" "$TMP/www"
chmod 644 "$TMP/www/health"
NPORT=$(free_port)
nginx_start "$NPORT" '    types { }
    default_type text/plain;
    keepalive_requests 1000000000;' "        location = /health { alias $TMP/www/health; }" \
    "worker_rlimit_nofile 8192;"
BASELINE_PID=$NGINX_PID
wait_http "http://127.0.0.1:$NPORT/health" || die "nginx did not serve: $(nginx_log)"

log "machine: $(nproc) CPUs, $(uname -r), load $(cut -d' ' -f1-3 /proc/loadavg); client, kvcoordd and nginx share them"
"$PY" "$ROOT/tools/bench/burst_client.py" --name "kvcoordd=127.0.0.1:$KPORT" \
    --name "nginx=127.0.0.1:$NPORT" --rounds "$ROUNDS" --burst "$BURST" --trickle "$TRICKLE"

kill -0 "$DAEMON_PID" 2>/dev/null || die "kvcoordd died during the benchmark: $(tail -20 "$TMP/kvcoordd.log")"

# The first burst on servers just started, alternating which goes first.
kill "$DAEMON_PID" "$BASELINE_PID" 2>/dev/null || true
wait "$DAEMON_PID" "$BASELINE_PID" 2>/dev/null || true
DAEMON_PID= BASELINE_PID=
rm -f "/dev/shm/$SEGMENT"
for ((r = 0; r < FRESH; r++)); do
    KPORT=$(free_port)
    "$KVCOORDD" --listen "127.0.0.1:$KPORT" --segment "$SEGMENT" --fresh \
        >"$TMP/kvcoordd.log" 2>&1 &
    DAEMON_PID=$!
    NPORT=$(free_port)
    nginx_start "$NPORT" '    types { }
    default_type text/plain;
    keepalive_requests 1000000000;' "        location = /health { alias $TMP/www/health; }" \
        "worker_rlimit_nofile 8192;"
    BASELINE_PID=$NGINX_PID
    wait_http "http://127.0.0.1:$KPORT/health" || die "kvcoordd did not answer: $(tail -20 "$TMP/kvcoordd.log")"
    wait_http "http://127.0.0.1:$NPORT/health" || die "nginx did not serve: $(nginx_log)"
    sleep 0.2
    if ((r % 2 == 0)); then
        names=(--name "kvcoordd=127.0.0.1:$KPORT" --name "nginx=127.0.0.1:$NPORT")
    else
        names=(--name "nginx=127.0.0.1:$NPORT" --name "kvcoordd=127.0.0.1:$KPORT")
    fi
    "$PY" "$ROOT/tools/bench/burst_client.py" --first "${names[@]}" --burst "$BURST" \
        >>"$TMP/fresh.jsonl"
    kill "$DAEMON_PID" "$BASELINE_PID" 2>/dev/null || true
    wait "$DAEMON_PID" "$BASELINE_PID" 2>/dev/null || true
    DAEMON_PID= BASELINE_PID=
    rm -f "/dev/shm/$SEGMENT"
done
if ((FRESH > 0)); then
    "$PY" - "$TMP/fresh.jsonl" <<'PYEOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
with open(sys.argv[1], "w") as f:  # kvcoordd first, nginx (the baseline) last
    for r in rows:
        f.write(json.dumps({"kvcoordd": r["kvcoordd"], "nginx": r["nginx"],
                            "_first": r["_first"]}) + "\n")
PYEOF
    "$PY" "$ROOT/tools/bench/burst_client.py" --summary "$TMP/fresh.jsonl"
fi
