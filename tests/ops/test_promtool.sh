#!/bin/sh
# test_promtool.sh TEST_METRICS WORKDIR: render /metrics' exposition for a
# segment in a known state (test_metrics --dump) and check it with
# `promtool check metrics` (format and Prometheus naming lints).
# Exit 77 (skipped) when promtool is missing: apt-get install prometheus.
set -eu
bin=$1 work=$2
if ! command -v promtool >/dev/null 2>&1; then
    echo "SKIP: promtool not found (Debian package 'prometheus' provides /usr/bin/promtool)"
    exit 77
fi
mkdir -p "$work"
out=$work/metrics.txt
"$bin" --dump "$out"
echo "rendered $(wc -l <"$out") lines into $out"
# promtool prints lint problems and exits non-zero on any of them.
if ! promtool check metrics <"$out"; then
    echo "FAIL: promtool check metrics found problems in $out"
    exit 1
fi
"$bin" --dump-bare "$work/bare.txt"
if ! promtool check metrics <"$work/bare.txt"; then
    echo "FAIL: promtool check metrics found problems in $work/bare.txt"
    exit 1
fi
grep -q '^kvcoord_rooms{state="Failed"} 3$' "$out"
grep -q '^kvcoord_ranks_registered 3$' "$out"
echo "PASS: promtool check metrics accepts the exposition"
