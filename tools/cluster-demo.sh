#!/usr/bin/env bash
# cluster-demo.sh - the README's two-node demo of the cluster view on one
# machine: a real 3-member etcd cluster (tools/etcd-cluster.sh), two
# kvcoordd "nodes" A and B (--etcd, each with its own segment and port),
# Llama-3.1-8B's 8 TP ranks registered on A by 8 kvcoord-worker processes
# through libkvcoord, then every rank looked up on B over HTTP (checked
# byte for byte against what the workers registered) and through the
# library, the 4 MB stress rank too, A's workers stopped (their ranks vanish
# from B), and kvcoord-diag cluster.  Stops everything it started at the end
# (--keep leaves it running; `tools/cluster-demo.sh stop` stops it then).
#
#   tools/cluster-demo.sh [--keep] [--ttl SECS] | stop
#
# Exit status: 0 the demo ran (or stop: nothing of it is left); 1 a step
# failed; 2 usage error (an unknown argument, a bad --ttl).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PY=/usr/bin/python3
B=$ROOT/build
DIR=$B/cluster-demo
ETCD_DIR=$DIR/etcd
ETCD_PORT=${KVCOORD_DEMO_ETCD_PORT:-24790}
PORT_A=${KVCOORD_DEMO_PORT_A:-6791}
PORT_B=${KVCOORD_DEMO_PORT_B:-6792}
TTL=5
KEEP=0

log() { printf '==> %s\n' "$*"; }
die() { printf 'cluster-demo.sh: %s\n' "$*" >&2; exit 1; }
# A usage error: the message, a hint, exit 2 (as every kvcoord program).
usage_error() {
    printf 'cluster-demo.sh: %s\nTry '"'"'tools/cluster-demo.sh --help'"'"' for more information.\n' "$*" >&2
    exit 2
}

stop_all() {
    local f pid n pids=()
    for f in "$DIR"/workers.pid "$DIR"/kvcoordd-*.pid; do
        [[ -f $f ]] || continue
        while read -r pid; do
            kill "$pid" 2>/dev/null && pids+=("$pid")
        done <"$f"
        rm -f "$f"
    done
    STOPPED=${#pids[@]}
    # Wait (up to 10 s) for them to exit: a kvcoordd still running when its
    # segment is removed below would log the unlink and exit 1.
    for ((n = 0; n < 100; n++)); do
        local left=0
        for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && left=1; done
        ((left)) || break
        sleep 0.1
    done
    "$ROOT/tools/etcd-cluster.sh" stop --dir "$ETCD_DIR" 2>/dev/null || true
    rm -f /dev/shm/kvcoord-demo-A /dev/shm/kvcoord-demo-B # the demo's segments
}

while [[ $# -gt 0 ]]; do
    case $1 in
        --keep) KEEP=1; shift ;;
        --ttl)
            [[ ${2:-} =~ ^[1-9][0-9]{0,3}$ ]] && (($2 <= 3600)) ||
                usage_error "--ttl needs a number of seconds (1..3600, as kvcoordd --etcd-ttl), not '${2:-}'"
            TTL=$2; shift 2 ;;
        stop)
            stop_all
            if ((STOPPED)); then
                log "stopped $STOPPED process(es) of the demo, and its etcd"
            else
                log "no kvcoordd or worker of the demo was running (its etcd is stopped too)"
            fi
            exit 0 ;;
        -h | --help) sed -n '2,15p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) usage_error "unknown argument '$1'" ;;
    esac
done

for p in /usr/bin/etcd /usr/bin/etcdctl; do
    [[ -x $p ]] || die "$p missing: apt-get install etcd-server etcd-client"
done
log "build ($B)"
cmake -S "$ROOT" -B "$B" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$B" -j"${KVCOORD_JOBS:-2}" --target kvcoordd kvcoord-worker kvcoord-diag cluster_probe >/dev/null

stop_all
mkdir -p "$DIR"
((KEEP)) || trap stop_all EXIT

log "etcd: 3 members on 127.0.0.1:$ETCD_PORT,$((ETCD_PORT + 2)),$((ETCD_PORT + 4)) (data in $ETCD_DIR)"
ENDPOINTS=$("$ROOT/tools/etcd-cluster.sh" start --dir "$ETCD_DIR" --port "$ETCD_PORT" --wipe)

start_node() { # NAME PORT
    "$B/kvcoordd" --listen "127.0.0.1:$2" --segment "kvcoord-demo-$1" --fresh --max-rooms 4096 \
        --etcd "$ENDPOINTS" --cluster demo --node "$1" --etcd-ttl "$TTL" \
        >"$DIR/kvcoordd-$1.log" 2>&1 &
    echo $! >"$DIR/kvcoordd-$1.pid"
    for _ in $(seq 100); do
        curl -fsS "http://127.0.0.1:$2/health" >/dev/null 2>&1 && return 0
        sleep 0.1
    done
    die "kvcoordd $1 did not start (see $DIR/kvcoordd-$1.log)"
}
log "kvcoordd A on 127.0.0.1:$PORT_A, B on 127.0.0.1:$PORT_B (cluster 'demo', lease TTL $TTL s)"
start_node A "$PORT_A"
start_node B "$PORT_B"

log "8 TP workers of Llama-3.1-8B register on A through libkvcoord"
"$PY" "$ROOT/tools/gen_model_info.py" --model llama-3.1-8b --tp 8 --out "$DIR/llama" >/dev/null
: >"$DIR/workers.pid"
for r in $(seq 0 7); do
    "$B/kvcoord-worker" --segment kvcoord-demo-A --rank "$r" --info "$DIR/llama/rank-$r.json" \
        --linger >"$DIR/worker-$r.log" 2>&1 &
    echo $! >>"$DIR/workers.pid"
done
for r in $(seq 0 7); do
    for _ in $(seq 100); do grep -q generation= "$DIR/worker-$r.log" && break; sleep 0.05; done
done

log "B answers every rank of A (HTTP, checked against the workers' files)"
sleep 0.3
"$PY" "$ROOT/tools/query_ranks.py" --url "http://127.0.0.1:$PORT_B" --ranks 8 \
    --expect-dir "$DIR/llama"
log "B through libkvcoord: rank 3"
probe=$("$B/tests/cluster_probe" kvcoord-demo-B 3) # line 1: the entry; then its info
printf '%s\n' "${probe%%$'\n'*}"

log "the 4 MB stress rank as rank 8 on A (over HTTP), read on B"
"$PY" "$ROOT/tools/gen_model_info.py" --model stress --tp 1 --out "$DIR/stress" >/dev/null
"$PY" - "$DIR/stress/rank-0.json" "$PORT_A" "$PORT_B" <<'EOF'
import json, sys, time, urllib.request
path, pa, pb = sys.argv[1], sys.argv[2], sys.argv[3]
doc = json.load(open(path)); doc["rank"] = 8
body = json.dumps(doc).encode()
req = urllib.request.Request("http://127.0.0.1:%s/register_transfer_engine_info" % pa, body,
                             method="PUT")
urllib.request.urlopen(req).read()
a = urllib.request.urlopen("http://127.0.0.1:%s/get_transfer_engine_info?rank=8" % pa).read()
t0 = time.time()
while True:
    try:
        b = urllib.request.urlopen("http://127.0.0.1:%s/get_transfer_engine_info?rank=8" % pb).read()
        if b == a:
            break
    except Exception:
        pass
    time.sleep(0.01)
print("rank 8: %d bytes, identical on A and B (on B after %.3f s)" % (len(a), time.time() - t0))
EOF

log "kvcoord-diag cluster (B's segment and etcd)"
"$B/kvcoord-diag" cluster --segment kvcoord-demo-B --etcd "$ENDPOINTS" --cluster demo || true

if ((KEEP)); then
    log "left running: A http://127.0.0.1:$PORT_A, B http://127.0.0.1:$PORT_B, etcd $ENDPOINTS"
    log "stop with: tools/cluster-demo.sh stop"
    exit 0
fi
log "A's workers exit: their ranks are withdrawn on A, and vanish from B"
while read -r pid; do kill "$pid" 2>/dev/null || true; done <"$DIR/workers.pid"
rm -f "$DIR/workers.pid"
sleep 0.5
curl -s "http://127.0.0.1:$PORT_B/get_transfer_engine_info?rank=0"
echo
log "done (logs in $DIR)"
