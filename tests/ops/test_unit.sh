#!/bin/sh
# test_unit.sh UNIT WORKDIR [KVCOORDD]: check tools/kvcoordd@.service and,
# beside it, tools/kvcoordd@.socket with `systemd-analyze verify` on an
# instance (kvcoordd@6789), the ExecStart binary pointed at the built
# kvcoordd (or /bin/true when there is none): any complaint about a unit
# fails the test.  Also checks the settings the operations doc promises.
# Exit 77 (skipped) without systemd-analyze.
set -eu
unit=$1 work=$2 daemon=${3:-/bin/true}
if ! command -v systemd-analyze >/dev/null 2>&1; then
    echo "SKIP: systemd-analyze not found (Debian package 'systemd')"
    exit 77
fi
for key in 'Type=notify' 'NotifyAccess=main' 'ExecReload=/bin/kill -HUP $MAINPID' \
           'NoNewPrivileges=yes' 'ProtectSystem=strict' 'ReadWritePaths=/dev/shm' \
           'PrivateTmp=yes' 'LimitMEMLOCK=infinity' 'LimitNOFILE=65600'; do
    grep -qxF "$key" "$unit" || { echo "FAIL: $unit lacks '$key'"; exit 1; }
done
grep -q '^ExecStart=/usr/bin/kvcoordd --listen ${KVCOORD_HOST}:%i --segment kvcoord-%i' "$unit" ||
    { echo "FAIL: ExecStart does not take the port and segment from the instance"; exit 1; }
rm -rf "$work"
mkdir -p "$work"
sed "s#/usr/bin/kvcoordd#$daemon#" "$unit" >"$work/kvcoordd@.service"
socket=${unit%.service}.socket
[ -f "$socket" ] || { echo "FAIL: no $socket beside $unit"; exit 1; }
grep -qxF 'ListenStream=127.0.0.1:%i' "$socket" ||
    { echo "FAIL: $socket does not listen on the instance's loopback port"; exit 1; }
cp "$socket" "$work/kvcoordd@.socket"
out=$work/verify.txt
for u in kvcoordd@6789.service kvcoordd@6789.socket; do
    rc=0
    systemd-analyze verify --man=no "$work/$u" >"$out" 2>&1 || rc=$?
    cat "$out"
    if [ "$rc" -ne 0 ] || grep -q 'kvcoordd@' "$out"; then
        echo "FAIL: systemd-analyze verify complained about $u (exit $rc)"
        exit 1
    fi
done
# The exposure score, for information (not asserted: it moves with systemd).
systemd-analyze security --offline=yes "$work/kvcoordd@.service" 2>/dev/null | tail -1 || true
echo "PASS: systemd-analyze verify accepts kvcoordd@6789.service and kvcoordd@6789.socket"
