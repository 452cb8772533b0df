#!/usr/bin/env bash
# bench_transfer.sh - the transfer engine's TCP backend over loopback, side
# by side in one run with iperf3 (single stream) at 64 KiB, 1 MiB and 4 MiB
# blocks: prints both and the ratios, round by round, then the medians of
# the ratios over the rounds; then the kv mode (a realistic request).
#   tools/bench/bench_transfer.sh [BUILD_DIR] [DURATION_S] [ROUNDS]
#   BLOCKS="1M 4M" tools/bench/bench_transfer.sh ...   (a subset of the sizes)
# Columns, each a separate run of DURATION_S seconds, in this order:
#   iperf3   iperf3 -c -P1 -l BLOCK: one buffer of the block size, reused on
#            each side (cache-hot); default socket buffers (autotuned).
#            iperf3 caps -l at 1 MiB, so the 4 MiB row's iperf3 writes 1 MiB.
#   ws=1     kvcoord-bench transfer, 1 connection, rooms of 16 writes of
#            BLOCK, all from the same source block into the same
#            destination block: iperf3's working set, so this is the fair
#            comparison (ratio ws1).
#   ws=16    the same with 16 distinct blocks on each side (16 MiB / 64 MiB
#            at 1 / 4 MiB, more than the L2 and, at 4 MiB, the L3 cache), as
#            a KV pool's pages would be (ratio ws16).
#   c=2      ws=16 over 2 connections per peer (the engine's default).
# Ratios are kvcoord / iperf3 of the same round.  Both tools run one
# sending and one receiving process, unpinned, on the same host.
# Figures, not assertions.  Installs iperf3 with apt-get when missing (root).
# Exit status: 0 measured, 1 a run failed (not built, no iperf3, a run's
# error), 2 usage error (a bad DURATION_S or ROUNDS).
set -euo pipefail
case ${1:-} in -h | --help) sed -n '2,24p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;; esac
build=${1:-build}
dur=${2:-4}
rounds=${3:-1}
blocks=${BLOCKS:-64K 1M 4M}
# iperf3 -t takes whole seconds (and -t 0 would run forever)
[[ "$dur" =~ ^[1-9][0-9]*$ ]] || { echo "bench_transfer.sh: DURATION_S must be a whole number of seconds >= 1" >&2; exit 2; }
[[ "$rounds" =~ ^[1-9][0-9]*$ ]] || { echo "bench_transfer.sh: ROUNDS must be a whole number >= 1" >&2; exit 2; }
bench="$build/kvcoord-bench"
[ -x "$bench" ] || { echo "bench_transfer.sh: $bench not built (cmake --build $build)" >&2; exit 1; }
if ! command -v iperf3 >/dev/null; then
  if [ "$(id -u)" = 0 ]; then apt-get install -y iperf3 >/dev/null 2>&1 || true; fi
  command -v iperf3 >/dev/null || { echo "bench_transfer.sh: iperf3 missing (apt-get install iperf3)" >&2; exit 1; }
fi
port=$((20000 + RANDOM % 20000))
iperf3 -s -p "$port" >/dev/null 2>&1 &
srv=$!
trap 'kill $srv 2>/dev/null || true' EXIT
sleep 0.5
json_num() { python3 -c "import json,sys; d=json.load(sys.stdin); print($1)"; }
kvt() { # block working-set conns -> "GB/s cpu_s_per_gb"
  "$bench" transfer --backend tcp --block "$1" --batch 16 --working-set "$2" --conns "$3" \
    --duration "$dur" --json | json_num "'%s %s' % (d['gb_per_s'], d['cpu_s_per_gb'])"
}
echo "load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
ratios=$(mktemp)
trap 'kill $srv 2>/dev/null || true; rm -f "$ratios"' EXIT
for r in $(seq 1 "$rounds"); do
  [ "$rounds" -gt 1 ] && echo "round $r"
  printf '%-6s %8s %10s %10s %10s %10s %10s %10s %10s\n' block iperf3 "ws=1" "ws=16" "ws=16 c=2" \
    "ratio ws1" "ratio ws16" "cpu iperf3" "cpu ws=1"
  for blk in $blocks; do
    ilen=$blk; [ "$blk" = 4M ] && ilen=1M  # iperf3 caps -l at 1 MiB
    # GB/s and CPU seconds (both processes) per GB, as kvcoord-bench reports them
    read -r ip ipc < <(iperf3 -c 127.0.0.1 -p "$port" -t "$dur" -l "$ilen" -J | json_num \
      "'%s %s' % (d['end']['sum_received']['bits_per_second'] / 8e9, (d['end']['cpu_utilization_percent']['host_total'] + d['end']['cpu_utilization_percent']['remote_total']) / 100 * d['end']['sum_received']['seconds'] / (d['end']['sum_received']['bytes'] / 1e9))")
    read -r k1 k1c < <(kvt "$blk" 1 1)
    read -r k16 _ < <(kvt "$blk" 16 1)
    read -r k2 _ < <(kvt "$blk" 16 2)
    r1=$(python3 -c "print('%.2f' % ($k1/$ip))")
    r16=$(python3 -c "print('%.2f' % ($k16/$ip))")
    echo "$blk $r1 $r16 $ipc $k1c" >>"$ratios"
    printf '%-6s %8.2f %10.2f %10.2f %10.2f %9sx %9sx %10.3f %10.3f\n' "$blk" "$ip" "$k1" "$k16" "$k2" \
      "$r1" "$r16" "$ipc" "$k1c"
  done
done
echo "(GB/s; ratio = kvcoord single connection / iperf3 single stream, same round;"
echo " cpu = CPU seconds of sender + receiver per GB moved)"
echo "load average at end: $(cut -d' ' -f1-3 /proc/loadavg)"
python3 - "$ratios" <<'EOF'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    rows.setdefault(line.split()[0], []).append([float(x) for x in line.split()[1:]])
for b, v in rows.items():
    med = [statistics.median(x[i] for x in v) for i in range(4)]
    print("%-4s ws=1: %s  median %.2fx | ws=16: %s  median %.2fx | cpu s/GB median iperf3 %.3f,"
          " ws=1 %.3f (%d rounds)" % (b, " ".join("%.2f" % x[0] for x in v), med[0],
                                      " ".join("%.2f" % x[1] for x in v), med[1], med[2], med[3],
                                      len(v)))
EOF
[ -n "${BLOCKS:-}" ] || "$bench" kv --backend tcp --conns 2 --duration "$dur"
