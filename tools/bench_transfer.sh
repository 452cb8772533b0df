#!/usr/bin/env bash
# bench_transfer.sh - the transfer engine's TCP backend over loopback, side
# by side in one run with iperf3 (single stream) at 64 KiB, 1 MiB and 4 MiB
# blocks: prints both and the ratio; then the kv mode (a realistic request).
#   tools/bench_transfer.sh [BUILD_DIR] [DURATION_S]
# Figures, not assertions.  Installs iperf3 with apt-get when missing (root).
set -euo pipefail
build=${1:-build}
dur=${2:-4}
bench="$build/kvcoord-bench-transfer"
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
printf '%-8s %14s %18s %18s %8s\n' block "iperf3 GB/s" "kvcoord c=1 GB/s" "kvcoord c=2 GB/s" "ratio"
for blk in 64K 1M 4M; do
  ilen=$blk; [ "$blk" = 4M ] && ilen=1M  # iperf3 caps -l at 1 MiB
  ip=$(iperf3 -c 127.0.0.1 -p "$port" -t "$dur" -l "$ilen" -J | json_num "d['end']['sum_received']['bits_per_second']/8e9")
  k1=$("$bench" transfer --backend tcp --block "$blk" --batch 16 --conns 1 --duration "$dur" --json | json_num "d['gb_per_s']")
  k2=$("$bench" transfer --backend tcp --block "$blk" --batch 16 --conns 2 --duration "$dur" --json | json_num "d['gb_per_s']")
  ratio=$(python3 -c "print('%.2f' % ($k1/$ip))")
  printf '%-8s %14.2f %18.2f %18.2f %8s\n' "$blk" "$ip" "$k1" "$k2" "${ratio}x"
done
echo "(ratio = kvcoord single connection / iperf3 single stream)"
"$bench" kv --backend tcp --conns 2 --duration "$dur"
