#!/usr/bin/env bash
# bench_http.sh - HTTP throughput of kvcoordd against nginx serving the same
# bytes, plus kvcoord-bench's library-vs-HTTP lookup and registration figures,
# all in one run so the figures are comparable (same machine, same moment).
#
#   1. kvcoordd on a free loopback port with a scratch segment; the
#      Llama-3.1-8B rank 0 (tools/gen_model_info.py) registered over HTTP.
#   2. nginx (nginx-light, ONE worker, access_log off) on another port,
#      serving the exact response bytes of GET
#      /get_transfer_engine_info?rank=0 (fetched from kvcoordd with curl) as a
#      static file with default_type application/json.
#   3. wrk against both, one after the other, same settings: Requests/sec,
#      latency, and the ratio kvcoordd/nginx.
#   4. kvcoord-bench lookup (Llama rank 0, and the 4 MB stress rank) and
#      kvcoord-bench register (the 4 MB stress rank), library and HTTP.
#
# Figures are printed, never judged.  Everything started here is stopped and
# every temporary file removed on exit (trap).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
PY=/usr/bin/python3
BUILD=${KVCOORD_BUILD:-$ROOT/build}
THREADS=2
CONNS=64
DURATION=10s
ROUNDS=1
MODEL=llama-3.1-8b
SKIP_LIB=0
RATE_FRACTION=0.5
RATE_SECONDS=10

usage() {
    cat <<EOF
Usage: tools/bench/bench_http.sh [--build DIR] [-t THREADS] [-c CONNECTIONS] [-d DURATION]
                           [--rounds N] [--model M] [--no-lib]
                           [--rate-fraction F] [--rate-seconds S]

wrk against kvcoordd's GET /get_transfer_engine_info?rank=0 (a $MODEL rank) and,
side by side, against nginx with one worker serving the same response bytes as a
static file; prints Requests/sec, latency and the ratio kvcoordd/nginx.  Then
the same two servers at one fixed, open-loop request rate (kvcoord-bench rate:
the same offered load for both, F times nginx's median wrk req/s), latency
counted from when each request was due, percentiles side by side.  Then kvcoord-bench
lookup and register (library vs HTTP) with the 4 MB stress rank.

Why both: wrk is closed-loop (each connection sends its next request when the
answer arrives), so a faster server makes wrk ask more and, on a machine with
few CPUs, starves wrk's own threads, whose run-queue waits then show up as the
server's tail latency.  At a fixed rate both servers get the same work.

Options:
  --build DIR        build directory with kvcoordd and kvcoord-bench
                     (default: \$KVCOORD_BUILD or build/)
  -t THREADS         wrk threads (default $THREADS)
  -c CONNECTIONS     wrk connections (default $CONNS)
  -d DURATION        wrk duration per run (default $DURATION)
  --rounds N         alternate kvcoordd/nginx runs N times each (default $ROUNDS)
  --model M          model of the rank served: llama-3.1-8b (default), qwen2.5-72b
  --no-lib           skip the kvcoord-bench part
  --rate-fraction F  fixed-rate load as a fraction of nginx's median wrk req/s,
                     0 < F <= 1 (default $RATE_FRACTION); 0 skips the fixed-rate part
  --rate-seconds S   duration of each fixed-rate run, whole seconds 1..3600
                     (default $RATE_SECONDS)
  -h, --help         print this help

Needs: kvcoordd and kvcoord-bench built, wrk, nginx (nginx-light), curl, python3.
Exit status: 0 measured, 1 a run failed (a build, the daemon, a client), 2 usage
error (an unknown option: a message on stderr).
EOF
}

while (($#)); do
    case $1 in
        --build | -t | -c | -d | --rounds | --model | --rate-fraction | --rate-seconds)
            (($# >= 2)) || { echo "bench_http.sh: $1 needs a value" >&2; exit 2; } ;;&
        --build) BUILD=$2; shift 2 ;;
        -t) THREADS=$2; shift 2 ;;
        -c) CONNS=$2; shift 2 ;;
        -d) DURATION=$2; shift 2 ;;
        --rounds) ROUNDS=$2; shift 2 ;;
        --model) MODEL=$2; shift 2 ;;
        --no-lib) SKIP_LIB=1; shift ;;
        --rate-fraction) RATE_FRACTION=$2; shift 2 ;;
        --rate-seconds) RATE_SECONDS=$2; shift 2 ;;
        -h|--help) usage; exit 0 ;;
        *) echo "bench_http.sh: unknown option '$1'" >&2; usage >&2; exit 2 ;;
    esac
done

die() { printf 'bench_http.sh: %s\n' "$*" >&2; exit 1; }
log() { printf '==> %s\n' "$*"; }

KVCOORDD=$BUILD/kvcoordd
BENCH=$BUILD/kvcoord-bench
NGINX=$(command -v nginx || echo /usr/sbin/nginx)
[[ -x $KVCOORDD ]] || die "$KVCOORDD not found: build first (cmake -B build && cmake --build build)"
[[ -x $NGINX ]] || die "nginx not found (Debian package nginx-light)"
command -v wrk >/dev/null || die "wrk not found (Debian package wrk)"
command -v curl >/dev/null || die "curl not found"
((SKIP_LIB)) || [[ -x $BENCH ]] || die "$BENCH not found (or pass --no-lib)"
[[ $RATE_FRACTION =~ ^(0(\.[0-9]+)?|1(\.0*)?)$ ]] ||
    die "--rate-fraction must be a number from 0 to 1, not '$RATE_FRACTION'"
[[ $RATE_SECONDS =~ ^[1-9][0-9]{0,3}$ ]] && ((RATE_SECONDS <= 3600)) ||
    die "--rate-seconds must be whole seconds 1..3600, not '$RATE_SECONDS'"
RATE_ON=$($PY -c "print(1 if float('$RATE_FRACTION') > 0 else 0)")
((RATE_ON == 0)) || [[ -x $BENCH ]] ||
    die "$BENCH not found (the fixed-rate part needs it), or pass --rate-fraction 0"

TMP=$(mktemp -d /tmp/kvcbench.XXXXXX)
SEGMENT=kvcbench-$$
DAEMON_PID=
BASELINE_PID=

# shellcheck source=bench_lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/bench_lib.sh"

# ---- kvcoordd ----------------------------------------------------------------
KPORT=$(free_port)
"$KVCOORDD" --listen "127.0.0.1:$KPORT" --segment "$SEGMENT" --fresh \
    --max-body-bytes $((64 << 20)) >"$TMP/kvcoordd.log" 2>&1 &
DAEMON_PID=$!
wait_http "http://127.0.0.1:$KPORT/health" ||
    die "kvcoordd did not answer /health: $(tail -20 "$TMP/kvcoordd.log")"
KURL=http://127.0.0.1:$KPORT

$PY "$ROOT/tools/gen_model_info.py" --model "$MODEL" --tp 8 --out "$TMP/$MODEL" --quiet
$PY "$ROOT/tools/gen_model_info.py" --model stress --tp 1 --out "$TMP/stress" --quiet
reg=$(curl -sS -X PUT -H 'Content-Type: application/json' \
    --data-binary "@$TMP/$MODEL/rank-0.json" "$KURL/register_transfer_engine_info")
[[ $reg == OK ]] || die "registering $MODEL rank 0 answered: $reg"

# ---- nginx with the same bytes ---------------------------------------------
mkdir -p "$TMP/www" "$TMP/nginx"
curl -sS -f -o "$TMP/www/rank0.json" -D "$TMP/kvcoordd.headers" \
    "$KURL/get_transfer_engine_info?rank=0"
chmod 755 "$TMP" "$TMP/www"
chmod 644 "$TMP/www/rank0.json"
NPORT=$(free_port)
nginx_start "$NPORT" '    types { }
    default_type application/json;
    keepalive_requests 1000000000;
    keepalive_timeout 75s;' "        location = /get_transfer_engine_info { alias $TMP/www/rank0.json; }"
BASELINE_PID=$NGINX_PID
NURL=http://127.0.0.1:$NPORT
wait_http "$NURL/get_transfer_engine_info?rank=0" || die "nginx did not serve: $(nginx_log)"
curl -sS -f -o "$TMP/nginx.body" -D "$TMP/nginx.headers" "$NURL/get_transfer_engine_info?rank=0"
cmp -s "$TMP/nginx.body" "$TMP/www/rank0.json" || die "nginx does not serve the same bytes"
ctype_k=$(grep -i '^content-type:' "$TMP/kvcoordd.headers" | tr -d '\r')
ctype_n=$(grep -i '^content-type:' "$TMP/nginx.headers" | tr -d '\r')

# ---- wrk -------------------------------------------------------------------
PATHQ=/get_transfer_engine_info?rank=0
log "machine: $(nproc) CPUs ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')), $(uname -r)"
log "response: $(stat -c %s "$TMP/www/rank0.json") bytes of JSON ($MODEL rank 0); $ctype_k (kvcoordd), $ctype_n (nginx)"
log "wrk -t$THREADS -c$CONNS -d$DURATION --latency, $ROUNDS round(s); wrk, server and nginx share the CPUs above"

# wrk_run NAME URL -> prints wrk's output, appends "NAME rps p50 p99 avg errors" to $TMP/results
wrk_run() {
    local name=$1 url=$2 out="$TMP/wrk-$1-$RANDOM.txt"
    wrk -t"$THREADS" -c"$CONNS" -d"$DURATION" --latency "$url" >"$out" 2>&1 ||
        die "wrk against $name failed: $(cat "$out")"
    sed 's/^/    /' "$out"
    $PY - "$name" "$out" >>"$TMP/results" <<'PYEOF'
import re, sys
name, path = sys.argv[1], sys.argv[2]
text = open(path).read()
def us(v):
    m = re.match(r"([\d.]+)(us|ms|s|m|h)$", v)
    if not m:
        sys.stderr.write("bench_http.sh: cannot read wrk latency %r in %s\n" % (v, path))
        return float("nan")
    return float(m.group(1)) * {"us": 1, "ms": 1e3, "s": 1e6, "m": 6e7, "h": 3.6e9}[m.group(2)]
rps = float(re.search(r"Requests/sec:\s+([\d.]+)", text).group(1))
avg = us(re.search(r"^\s*Latency[ \t]+(\S+)", text, re.M).group(1))
p50 = us(re.search(r"^\s*50%[ \t]+(\S+)", text, re.M).group(1))
p99 = us(re.search(r"^\s*99%[ \t]+(\S+)", text, re.M).group(1))
m = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", text)
errs = int(m.group(1)) if m else 0
m = re.search(r"Socket errors:(.*)", text)
sock = m.group(1).strip() if m else "none"
print(name, rps, avg, p50, p99, errs, sock.replace(" ", "_"))
PYEOF
}

: >"$TMP/results"
for ((r = 1; r <= ROUNDS; r++)); do
    log "round $r: kvcoordd $KURL$PATHQ"
    wrk_run kvcoordd "$KURL$PATHQ"
    log "round $r: nginx (1 worker) $NURL$PATHQ"
    wrk_run nginx "$NURL$PATHQ"
done

$PY - "$TMP/results" <<'PYEOF'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1])]
by = {}
for name, rps, avg, p50, p99, errs, sock in rows:
    by.setdefault(name, []).append((float(rps), float(avg), float(p50), float(p99), int(errs), sock))
print()
print("%-10s %12s %12s %12s %12s  %s" % ("server", "req/s", "lat avg", "lat p50", "lat p99", "non-2xx / socket errors"))
med = {}
for name in ("kvcoordd", "nginx"):
    runs = by.get(name, [])
    if not runs:
        continue
    rps = statistics.median(r[0] for r in runs)
    avg = statistics.median(r[1] for r in runs)
    p50 = statistics.median(r[2] for r in runs)
    p99 = statistics.median(r[3] for r in runs)
    med[name] = rps
    print("%-10s %12.0f %10.0fus %10.0fus %10.0fus  %s / %s" % (
        name, rps, avg, p50, p99, sum(r[4] for r in runs), ",".join(r[5] for r in runs)))
if len(med) == 2:
    print("ratio kvcoordd/nginx requests/sec: %.2f" % (med["kvcoordd"] / med["nginx"]))
if "nginx" in med:
    open(sys.argv[1] + ".nginx_rps", "w").write("%d\n" % med["nginx"])
PYEOF

# ---- the same offered load for both: kvcoord-bench rate -------------------------
# rate_run NAME URL RATE -> prints its table, appends "NAME <json>" to $TMP/rate_runs
rate_run() {
    local name=$1 url=$2 rate=$3 out="$TMP/rate-$1-$RANDOM.json"
    "$BENCH" rate --url "$url" --path "$PATHQ" --rate "$rate" --connections "$CONNS" \
        --duration "$RATE_SECONDS" --json >"$out" 2>&1 ||
        die "kvcoord-bench rate against $name failed: $(cat "$out")"
    echo "$name $(cat "$out")" >>"$TMP/rate_runs"
}

if ((RATE_ON)); then
    nginx_rps=$(cat "$TMP/results.nginx_rps")
    offered=$($PY -c "print(max(1, round($nginx_rps * $RATE_FRACTION)))")
    log "fixed rate (open loop): $offered req/s on $CONNS connections for both servers" \
        "($RATE_FRACTION of nginx's median $nginx_rps req/s above), ${RATE_SECONDS}s, $ROUNDS round(s)"
    : >"$TMP/rate_runs"
    for ((r = 1; r <= ROUNDS; r++)); do
        log "round $r: kvcoordd, then nginx, at $offered req/s"
        rate_run kvcoordd "$KURL" "$offered"
        rate_run nginx "$NURL" "$offered"
    done
    $PY - "$TMP/rate_runs" <<'PYEOF'
import json, statistics, sys
rows = {}
for line in open(sys.argv[1]):
    name, js = line.split(" ", 1)
    rows.setdefault(name, []).append(json.loads(js))
keys = ("p50", "p90", "p99", "p99_9", "max")
print()
print("fixed rate: latency = answer complete - request due (us); medians over rounds")
print("%-10s %9s %9s %9s %9s %9s %9s  %s" % ("server", "done/s", *keys, "failed/dropped"))
med = {}
for name in ("kvcoordd", "nginx"):
    runs = rows.get(name, [])
    if not runs:
        continue
    m = [statistics.median(r["completed_per_s"] for r in runs)]
    m += [statistics.median(r["latency_us"][k] for r in runs) for k in keys]
    med[name] = m
    print("%-10s %9.0f %9.0f %9.0f %9.0f %9.0f %9.0f  %d/%d" % (
        name, *m, sum(r["failed"] for r in runs), sum(r["dropped"] for r in runs)))
    for i, r in enumerate(runs, 1):
        print("  round %-2d %9.0f %9.0f %9.0f %9.0f %9.0f %9.0f" % (
            i, r["completed_per_s"], *(r["latency_us"][k] for k in keys)))
if len(med) == 2:
    print("ratio kvcoordd/nginx latency at the same rate: p50 %.2f, p99 %.2f, p99.9 %.2f"
          % tuple(med["kvcoordd"][i] / med["nginx"][i] for i in (1, 3, 4)))
PYEOF
fi

# ---- kvcoord-bench -----------------------------------------------------------
if ((SKIP_LIB == 0)); then
    log "kvcoord-bench lookup: $MODEL rank 0 (library from this process vs HTTP GET)"
    "$BENCH" lookup --segment "$SEGMENT" --rank 0 --url "$KURL"
    log "kvcoord-bench lookup: the same client's HTTP round trip against nginx (baseline)"
    "$BENCH" lookup --segment "$SEGMENT" --rank 0 --iters 1000 --url "$NURL"
    log "kvcoord-bench register: 4 MB stress rank as rank 1 (library vs HTTP PUT)"
    "$BENCH" register --segment "$SEGMENT" --info "$TMP/stress/rank-0.json" --rank 1 \
        --url "$KURL" --reps 7
    log "kvcoord-bench lookup: 4 MB stress rank (rank 1)"
    "$BENCH" lookup --segment "$SEGMENT" --rank 1 --iters 2000 --http-iters 200 --url "$KURL"
fi

if ! kill -0 "$DAEMON_PID" 2>/dev/null; then
    die "kvcoordd died during the benchmark: $(tail -20 "$TMP/kvcoordd.log")"
fi
