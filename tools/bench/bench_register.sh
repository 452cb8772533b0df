#!/usr/bin/env bash
# bench_register.sh - PUT /register_transfer_engine_info against kvcoordd and
# against a FastAPI + uvicorn server with sglang's bootstrap routes
# (tools/bench/fastapi_baseline.py), in the same run, alternating:
#
#   1. kvcoordd on a free loopback port, scratch segment (--fresh);
#   2. tools/bench/fastapi_baseline.py (uvicorn, uvloop + httptools when
#      installed) on another port;
#   3. tools/bench/register_client.py: Python `requests`, a new connection
#      for every PUT (as sglang's workers register), of the Llama-3.1-8B TP=8
#      rank 0 (13.6 KB, tools/gen_model_info.py) and of the 4 MB stress rank
#      (50,000 entries); each PUT new content; medians per round, median of
#      the rounds, ratio FastAPI/kvcoordd (> 1: kvcoordd faster); then the
#      same with a minimal socket client (one sendall, Connection: close),
#      which leaves out the ~0.6 ms requests itself spends per call;
#   4. the floor, timed in the same rounds with the same client: nginx
#      (nginx-light, 1 worker) answering every PUT with `return 200 "OK"`,
#      a server that does nothing; each server's own share is its time minus
#      the floor's, and the shares' ratio is printed too (--no-floor: skip).
#
# Figures are printed, never judged.  Everything started here is stopped and
# every temporary file removed on exit.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
PY=/usr/bin/python3
BUILD=${KVCOORD_BUILD:-$ROOT/build}
ROUNDS=5
REPS=50
BIG_REPS=8
FLOOR=1

usage() {
    cat <<EOF
Usage: tools/bench/bench_register.sh [--build DIR] [--rounds N] [--reps N] [--big-reps N]
                               [--no-floor]

Times PUT /register_transfer_engine_info with Python requests (new connection
each) against kvcoordd and a FastAPI + uvicorn server with the same routes,
same run: the Llama-3.1-8B rank (13.6 KB) and the 4 MB stress rank; and, in
the same rounds, a server that does nothing (nginx: return 200 "OK"), so each
server's own share (its time minus that floor) is printed with its ratio.

Options:
  --build DIR     build directory with kvcoordd (default: \$KVCOORD_BUILD or build/)
  --rounds N      rounds, alternating the servers (default $ROUNDS)
  --reps N        PUTs per round and server of the 13.6 KB rank (default $REPS)
  --big-reps N    PUTs per round and server of the 4 MB rank (default $BIG_REPS)
  --no-floor      do not time the do-nothing nginx (the floor)
  -h, --help      print this help

Needs: kvcoordd built, python3-requests, python3-fastapi, python3-uvicorn (with python3-uvloop
and python3-httptools, as sglang runs it), curl, nginx (nginx-light) for the floor.
Exit status: 0 measured, 1 a run failed (a build, the daemon, a client), 2 usage
error (an unknown option: a message on stderr).
EOF
}

while (($#)); do
    case $1 in
        --build | --rounds | --reps | --big-reps)
            (($# >= 2)) || { echo "bench_register.sh: $1 needs a value" >&2; exit 2; } ;;&
        --build) BUILD=$2; shift 2 ;;
        --rounds) ROUNDS=$2; shift 2 ;;
        --reps) REPS=$2; shift 2 ;;
        --big-reps) BIG_REPS=$2; shift 2 ;;
        --no-floor) FLOOR=0; shift ;;
        -h|--help) usage; exit 0 ;;
        *) echo "bench_register.sh: unknown option '$1'" >&2; usage >&2; exit 2 ;;
    esac
done

die() { printf 'bench_register.sh: %s\n' "$*" >&2; exit 1; }
log() { printf '==> %s\n' "$*"; }

KVCOORDD=$BUILD/kvcoordd
[[ -x $KVCOORDD ]] || die "$KVCOORDD not found: build first (cmake -B build && cmake --build build)"
$PY -c 'import fastapi, uvicorn, requests' 2>/dev/null ||
    die "needs Debian's python3-fastapi, python3-uvicorn and python3-requests"

TMP=$(mktemp -d /tmp/kvcbench-reg.XXXXXX)
SEGMENT=kvcbench-reg-$$
DAEMON_PID=
BASELINE_PID=
FLOOR_PID=

# shellcheck source=bench_lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/bench_lib.sh"

KPORT=$(free_port)
"$KVCOORDD" --listen "127.0.0.1:$KPORT" --segment "$SEGMENT" --fresh \
    --max-body-bytes $((64 << 20)) >"$TMP/kvcoordd.log" 2>&1 &
DAEMON_PID=$!
wait_http "http://127.0.0.1:$KPORT/health" ||
    die "kvcoordd did not answer /health: $(tail -20 "$TMP/kvcoordd.log")"

APORT=$(free_port)
$PY "$ROOT/tools/bench/fastapi_baseline.py" --port "$APORT" >"$TMP/fastapi.log" 2>&1 &
BASELINE_PID=$!
wait_http "http://127.0.0.1:$APORT/health" ||
    die "the FastAPI server did not answer /health: $(tail -20 "$TMP/fastapi.log")"

FLOOR_ARG=()
if ((FLOOR)); then
    NGINX=$(command -v nginx || echo /usr/sbin/nginx)
    [[ -x $NGINX ]] || die "nginx not found for the floor (Debian package nginx-light; or --no-floor)"
    FPORT=$(free_port)
    nginx_start "$FPORT" "    client_max_body_size 64m;" \
        '        default_type text/plain;
        location / { return 200 "OK"; }'
    FLOOR_PID=$NGINX_PID
    wait_http "http://127.0.0.1:$FPORT/health" || die "nginx (the floor) did not answer: $(nginx_log)"
    FLOOR_ARG=(--floor "floor=http://127.0.0.1:$FPORT")
fi

$PY "$ROOT/tools/gen_model_info.py" --model llama-3.1-8b --tp 8 --out "$TMP/llama" --quiet
$PY "$ROOT/tools/gen_model_info.py" --model stress --tp 1 --out "$TMP/stress" --quiet

stack=$($PY -c 'import fastapi, uvicorn, importlib.util as u
print("fastapi %s, uvicorn %s, loop %s, http %s" % (fastapi.__version__, uvicorn.__version__,
      "uvloop" if u.find_spec("uvloop") else "asyncio",
      "httptools" if u.find_spec("httptools") else "h11"))')
log "machine: $(nproc) CPUs ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')), $(uname -r), load $(cut -d' ' -f1-3 /proc/loadavg)"
log "baseline: $stack; client: python3 requests $($PY -c 'import requests; print(requests.__version__)')"

CLIENT=("$PY" "$ROOT/tools/bench/register_client.py"
        --name "kvcoordd=http://127.0.0.1:$KPORT" --name "fastapi=http://127.0.0.1:$APORT"
        "${FLOOR_ARG[@]}")
for client in requests raw; do
    log "Llama-3.1-8B TP=8 rank 0, $client client"
    "${CLIENT[@]}" --client $client --body "$TMP/llama/rank-0.json" --rounds "$ROUNDS" --reps "$REPS"
    log "4 MB stress rank (50,000 entries), $client client"
    "${CLIENT[@]}" --client $client --body "$TMP/stress/rank-0.json" --rounds "$ROUNDS" \
        --reps "$BIG_REPS"
done

kill -0 "$DAEMON_PID" 2>/dev/null || die "kvcoordd died during the benchmark: $(tail -20 "$TMP/kvcoordd.log")"
kill -0 "$BASELINE_PID" 2>/dev/null || die "the FastAPI server died: $(tail -20 "$TMP/fastapi.log")"
[[ -z $FLOOR_PID ]] || kill -0 "$FLOOR_PID" 2>/dev/null || die "nginx (the floor) died: $(tail -20 "$TMP/nginx/error.log")"
