#!/usr/bin/env bash
# etcd-cluster.sh - start, stop, kill and inspect a real 3-member etcd cluster
# (Debian's etcd-server) on loopback ports, each member with its own data
# directory, for kvcoordd's cluster view (--etcd), its tests and the README
# demo.  Nothing here is kvcoord-specific: it is the cluster an operator
# would run, made small.
#
#   tools/etcd-cluster.sh start [--dir D] [--port P] [--wipe]
#   tools/etcd-cluster.sh stop  [--dir D]
#   tools/etcd-cluster.sh kill-member N | stop-member N | start-member N [--dir D]
#   tools/etcd-cluster.sh endpoints [--dir D]
#   tools/etcd-cluster.sh status [--dir D]
#
# Member i (0..2) listens for clients on 127.0.0.1:P+2i and for peers on
# 127.0.0.1:P+2i+1 (default P=23790), keeps its data in D/m<i>/ (default
# D=build/etcd-cluster), logs to D/m<i>.log and its pid is in D/m<i>.pid.
# `start` returns once every member answers /health; the cluster's client
# URLs are printed (and kept in D/endpoints) as kvcoordd's --etcd wants them.
#
# Exit status: 0 done; 1 a step failed (etcd missing, a member did not
# become healthy); 2 usage error (no or an unknown command, a bad option).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DIR=$ROOT/build/etcd-cluster
PORT=23790
WIPE=0
ETCD=${ETCD:-/usr/bin/etcd}
MEMBERS=3

die() { printf 'etcd-cluster.sh: %s\n' "$*" >&2; exit 1; }

usage() {
    sed -n '2,21p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
}
# A usage error: the message, a hint, exit 2 (as every kvcoord program).
usage_error() {
    printf 'etcd-cluster.sh: %s\nTry '"'"'tools/etcd-cluster.sh help'"'"' for more information.\n' "$*" >&2
    exit 2
}

client_url() { echo "http://127.0.0.1:$((PORT + 2 * $1))"; }
peer_url() { echo "http://127.0.0.1:$((PORT + 2 * $1 + 1))"; }

initial_cluster() {
    local i s=""
    for ((i = 0; i < MEMBERS; i++)); do
        s+="${s:+,}m$i=$(peer_url "$i")"
    done
    echo "$s"
}

endpoints() {
    local i s=""
    for ((i = 0; i < MEMBERS; i++)); do
        s+="${s:+,}$(client_url "$i")"
    done
    echo "$s"
}

member_pid() {
    local f=$DIR/m$1.pid
    [[ -f $f ]] || return 1
    local pid
    pid=$(cat "$f")
    kill -0 "$pid" 2>/dev/null || return 1
    echo "$pid"
}

start_member() {
    local i=$1 state=new
    member_pid "$i" >/dev/null && return 0
    [[ -d $DIR/m$i/member ]] && state=existing
    # Short heartbeat/election: loopback members, and tests that kill
    # members should see a new leader quickly.
    "$ETCD" --name "m$i" --data-dir "$DIR/m$i" \
        --listen-client-urls "$(client_url "$i")" --advertise-client-urls "$(client_url "$i")" \
        --listen-peer-urls "$(peer_url "$i")" --initial-advertise-peer-urls "$(peer_url "$i")" \
        --initial-cluster "$(initial_cluster)" --initial-cluster-token "kvcoord-$PORT" \
        --initial-cluster-state "$state" --heartbeat-interval 50 --election-timeout 500 \
        --logger zap --log-outputs stderr \
        >"$DIR/m$i.log" 2>&1 &
    echo $! >"$DIR/m$i.pid"
}

wait_healthy() {
    local i deadline=$((SECONDS + ${1:-30}))
    for ((i = 0; i < MEMBERS; i++)); do
        member_pid "$i" >/dev/null || continue
        until curl -fsS -m 2 "$(client_url "$i")/health" 2>/dev/null | grep -q '"health":"true"'; do
            if ((SECONDS >= deadline)); then
                printf 'etcd-cluster.sh: member m%d not healthy within %d s (see %s)\n' "$i" \
                    "${1:-30}" "$DIR/m$i.log" >&2
                return 1
            fi
            if ! member_pid "$i" >/dev/null; then
                printf 'etcd-cluster.sh: member m%d exited (see %s)\n' "$i" "$DIR/m$i.log" >&2
                return 1
            fi
            sleep 0.2
        done
    done
}

stop_member() {
    local i=$1 sig=${2:-TERM} pid
    pid=$(member_pid "$i") || return 0
    kill -"$sig" "$pid" 2>/dev/null || true
    local n
    for ((n = 0; n < 100; n++)); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    kill -0 "$pid" 2>/dev/null && kill -KILL "$pid" 2>/dev/null
    rm -f "$DIR/m$i.pid"
}

(($#)) || { usage >&2; usage_error "no command given"; }
cmd=$1
shift
member=""
case $cmd in
    kill-member | stop-member | start-member)
        [[ $# -ge 1 ]] || usage_error "$cmd needs a member number (0..$((MEMBERS - 1)))"
        member=$1
        shift
        [[ $member =~ ^[0-2]$ ]] || usage_error "member must be 0, 1 or 2, not '$member'"
        ;;
esac
while [[ $# -gt 0 ]]; do
    case $1 in
        --dir | --port) [[ $# -ge 2 ]] || usage_error "$1 needs a value" ;;&
        --dir) DIR=$2; shift 2 ;;
        --port)
            [[ $2 =~ ^[1-9][0-9]{0,4}$ ]] && (($2 <= 65531)) || usage_error "bad --port '$2' (1..65531)"
            PORT=$2; shift 2 ;;
        --wipe) WIPE=1; shift ;;
        *) usage_error "unknown option '$1'" ;;
    esac
done
[[ -f $DIR/port ]] && [[ $cmd != start ]] && PORT=$(cat "$DIR/port")

case $cmd in
    start)
        [[ -x $ETCD ]] || die "$ETCD not found: apt-get install etcd-server etcd-client"
        mkdir -p "$DIR"
        if ((WIPE)); then
            for ((i = 0; i < MEMBERS; i++)); do stop_member "$i"; rm -rf "${DIR:?}/m$i"; done
        fi
        echo "$PORT" >"$DIR/port"
        for ((i = 0; i < MEMBERS; i++)); do start_member "$i"; done
        if ! wait_healthy 30; then
            # Leave nothing running behind a failed start (a port taken, say).
            for ((i = 0; i < MEMBERS; i++)); do stop_member "$i"; done
            exit 1
        fi
        endpoints | tee "$DIR/endpoints"
        ;;
    stop)
        for ((i = 0; i < MEMBERS; i++)); do stop_member "$i"; done
        ;;
    kill-member) stop_member "$member" KILL ;;
    stop-member) stop_member "$member" TERM ;;
    start-member)
        start_member "$member"
        ;;
    endpoints) endpoints ;;
    status)
        for ((i = 0; i < MEMBERS; i++)); do
            if pid=$(member_pid "$i"); then
                printf 'm%d pid %s %s %s\n' "$i" "$pid" "$(client_url "$i")" \
                    "$(curl -sS -m 2 "$(client_url "$i")/health" 2>&1 || true)"
            else
                printf 'm%d stopped %s\n' "$i" "$(client_url "$i")"
            fi
        done
        ;;
    help | -h | --help) usage ;;
    *) usage_error "unknown command '$cmd'" ;;
esac
