#!/bin/sh
# test_symbols.sh LIBKVCOORD.so LIBKVCOORD-TRANSFER.so: the shared libraries
# export their public API and nothing else (kvc_* from libkvcoord, kvt_*
# from libkvcoord-transfer; no kvc__ internals, no test hook), and
# libkvcoord needs neither liburing nor libibverbs at run time.
set -eu
core=$1 xfer=$2
fail=0
exported() { nm -D --defined-only "$1" | awk '$2 ~ /^[TDBRVW]$/ {print $3}' | sed 's/@.*//' | sort -u; }

bad=$(exported "$core" | grep -v '^kvc_[a-z]' || true)
[ -z "$bad" ] || { echo "FAIL: $core exports non-API symbols:"; echo "$bad"; fail=1; }
bad=$(exported "$core" | grep -E '^kvc_test_|^kvc__' || true)
[ -z "$bad" ] || { echo "FAIL: $core exports internal or test-only symbols: $bad"; fail=1; }
n=$(exported "$core" | grep -c '^kvc_' || true)
[ "$n" -ge 30 ] || { echo "FAIL: $core exports only $n kvc_ symbols"; fail=1; }

bad=$(exported "$xfer" | grep -v '^kvt_[a-z]' || true)
[ -z "$bad" ] || { echo "FAIL: $xfer exports non-API symbols:"; echo "$bad"; fail=1; }
n=$(exported "$xfer" | grep -c '^kvt_' || true)
[ "$n" -ge 10 ] || { echo "FAIL: $xfer exports only $n kvt_ symbols"; fail=1; }

needed=$(readelf -d "$core" | awk '/NEEDED/ {print $5}')
case $needed in
*uring* | *ibverbs*) echo "FAIL: $core needs $needed"; fail=1 ;;
esac
[ $fail = 0 ] && echo "PASS: $(exported "$core" | wc -l) kvc_ symbols, $(exported "$xfer" | wc -l) kvt_ symbols; libkvcoord needs: $(echo $needed)"
exit $fail
