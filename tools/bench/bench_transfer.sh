#!/usr/bin/env bash
# bench_transfer.sh - the transfer engine's TCP backend over loopback, side
# by side in one run with iperf3 (single stream) at 64 KiB, 1 MiB and 4 MiB
# blocks: prints both and the ratios; then the kv mode (a realistic request).
#   tools/bench/bench_transfer.sh [BUILD_DIR] [DURATION_S] [ROUNDS]
# Columns: iperf3 -P1 (one buffer of the block size, reused: cache-hot);
# kvcoord-bench transfer with 1 and 2 connections, rooms of 16 distinct
# blocks (a 16-block working set on each side, as a KV pool is); and with
# one block per room (the same 1-block working set as iperf3).  Ratios are
# kvcoord single connection / iperf3 single stream.  ROUNDS repeats the
# table (this kind of figure is noisy on a shared machine).
# Figures, not assertions.  Installs iperf3 with apt-get when missing (root).
set -euo pipefail
build=${1:-build}
dur=${2:-4}
rounds=${3:-1}
bench="$build/kvcoord-bench"
[ -x "$bench" ] || { echo "bench_transfer.sh: $bench not built (cmake --build $build)" >&2; exit 2; }
if ! command -v iperf3 >/dev/null; then
  if [ "$(id -u)" = 0 ]; then apt-get install -y iperf3 >/dev/null 2>&1 || true; fi
  command -v iperf3 >/dev/null || { echo "bench_transfer.sh: iperf3 missing (apt-get install iperf3)" >&2; exit 2; }
fi
port=$((20000 + RANDOM % 20000))
iperf3 -s -p "$port" >/dev/null 2>&1 &
srv=$!
trap 'kill $srv 2>/dev/null || true' EXIT
sleep 0.5
json_num() { python3 -c "import json,sys; d=json.load(sys.stdin); print($1)"; }
kvt() { "$bench" transfer --backend tcp --block "$1" --batch "$2" --conns "$3" --duration "$dur" --json |
          json_num "d['gb_per_s']"; }
for r in $(seq 1 "$rounds"); do
  [ "$rounds" -gt 1 ] && echo "round $r"
  printf '%-6s %8s %12s %12s %12s %10s %10s\n' block iperf3 "c=1 b=16" "c=2 b=16" "c=1 b=1" "ratio b16" "ratio b1"
  for blk in 64K 1M 4M; do
    ilen=$blk; [ "$blk" = 4M ] && ilen=1M  # iperf3 caps -l at 1 MiB
    ip=$(iperf3 -c 127.0.0.1 -p "$port" -t "$dur" -l "$ilen" -J | json_num "d['end']['sum_received']['bits_per_second']/8e9")
    k1=$(kvt "$blk" 16 1)
    k2=$(kvt "$blk" 16 2)
    kb=$(kvt "$blk" 1 1)
    r16=$(python3 -c "print('%.2fx' % ($k1/$ip))")
    rb1=$(python3 -c "print('%.2fx' % ($kb/$ip))")
    printf '%-6s %8.2f %12.2f %12.2f %12.2f %10s %10s\n' "$blk" "$ip" "$k1" "$k2" "$kb" "$r16" "$rb1"
  done
done
echo "(GB/s; ratio = kvcoord single connection / iperf3 single stream)"
"$bench" kv --backend tcp --conns 2 --duration "$dur"
