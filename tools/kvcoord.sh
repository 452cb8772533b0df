#!/usr/bin/env bash
# kvcoord.sh - the README's two commands: `run` (build and start a node's
# coordinator with 8 stand-in TP workers of a real model, then query it as a
# remote instance would) and `test` (build and run the whole test suite, then
# again under AddressSanitizer + UndefinedBehaviorSanitizer, then the libFuzzer
# targets for a bounded time).  Plus `stop`.
#
# Meant for a fresh Debian 12 machine, as root: missing Debian packages are
# installed first (nothing is installed when all are present).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PY=/usr/bin/python3
JOBS=${KVCOORD_JOBS:-2}
TEST_JOBS=${KVCOORD_TEST_JOBS:-$((JOBS * 2))}
RUN_DIR=$ROOT/build/run
TP=8
PACKAGES=(build-essential cmake pkg-config file mmdebstrap liburing-dev libjansson-dev libhttp-parser-dev
          libcmocka-dev libibverbs-dev libcurl4-openssl-dev libssl-dev openssl etcd-server etcd-client
          rdma-core python3 python3-dev python3-requests python3-fastapi python3-uvicorn python3-uvloop
          python3-httptools python3-torch python3-venv python3-pip python3-setuptools
          python3-wheel curl wrk
          nginx-light clang libclang-rt-14-dev clang-format iproute2 iperf3 prometheus systemd
          gcc-aarch64-linux-gnu qemu-user-static libc6:arm64 libc6-dev:arm64 libcmocka-dev:arm64 libjansson-dev:arm64)

usage() {
    cat <<EOF
Usage: tools/kvcoord.sh COMMAND [OPTIONS]

Commands:
  run [--model M] [--port P] [--python]
        Install missing Debian packages, build (build/, RelWithDebInfo), write the
        transfer-engine info of model M's $TP TP ranks to build/run/M/, start
        kvcoordd on 127.0.0.1:P with a fresh segment (kvcoord-P), start $TP
        kvcoord-worker processes that register those ranks and stay attached,
        then query every rank over HTTP as a remote instance would and print a
        summary.  Everything keeps running until 'tools/kvcoord.sh stop'.  One
        run at a time per checkout: a previous run's processes are stopped first
        (it says so), whatever port they used.
          --model M   llama-3.1-8b (default), qwen2.5-72b or stress
          --port P    HTTP port (default 6789)
          --python    then run examples/sglang_tp_group.py against it: 8 Python
                      processes (import kvcoord) acting as one TP group, one
                      rank failing a transfer, every rank raising the same
                      KVTransferError (a table is printed)
        Logs and pid files: build/run/kvcoordd.log, build/run/worker-N.log,
        build/run/kvcoordd.pid, build/run/workers.pid.
  stop  Stop what 'run' started: SIGTERM the workers, then kvcoordd (SIGKILL
        after 5 s).  Says which processes were already gone, and leaves alone a
        pid that now belongs to another program.  Exits 0 whenever nothing of
        the run is left running, so also when nothing was (no pid files, or
        every process had already exited: it says so); exits 1, naming the
        pid, when the run's port still answers (a kvcoordd started by hand).
        The segment is kept; stop names any worker's rank it still holds (a
        worker killed while kvcoordd could not reap it) and the kvcoord-diag
        repair command that withdraws it.
  test [--sanitize | --arm64]
        Install missing Debian packages, check the formatting (clang-format)
        and the commit messages since 4bbcd88 (a subject of at most 72
        characters, then a blank line),
        build build/ (warnings are errors) and run its ctest suite; meanwhile,
        niced, build the libraries and programs with gcc Release (-O3) and
        with clang (build-matrix/), libkvcoord and its tests
        for arm64 (build-arm64/), the whole tree with ASan + UBSan
        (build-asan/, -DKVCOORD_SANITIZE=ON) and the fuzz targets with clang
        (build-fuzz/, -DKVCOORD_FUZZ=ON), their output in build-logs/.  Once
        that suite is done, make the .debs from build/ (cpack -G DEB) and, as
        root, apt-install them in a fresh bookworm root (mmdebstrap).  Then
        run the whole suite again under ASan + UBSan (but python_pip),
        each fuzz target for KVCOORD_FUZZ_SECONDS (default 20; ctest -L
        fuzz) and the arm64 tests under qemu-user-static.  Each step's
        seconds are printed, and a summary line at the end.  At most one of:
        --sanitize: the sanitizer build and suite only.
        --arm64: the arm64 cross build and its qemu-user run only.
        Exits non-zero if any build or test fails.
  help  Print this help (also -h, --help).

Exit status: 0 done (run: serving; stop: nothing of the run left running;
test: every build and test passed); 1 a step failed (a build, a test, a
package install, the daemon or a worker did not come up); 2 usage error (no
or an unknown command, an unknown option, a bad value: a message on stderr).

Environment: KVCOORD_JOBS (parallel build jobs, default 2), KVCOORD_TEST_JOBS
(ctest slots, default twice KVCOORD_JOBS; a heavy test takes two), KVCOORD_FUZZ_SECONDS
(seconds per fuzz target in 'test', default 20; 0 skips the fuzz pass).
Installing packages needs root; as another user the commands work when the
packages are already there.
EOF
}

# In 'test', each line also says the seconds since the command started
# ([+ 123s]): where a fresh machine's time goes is read off these (and the
# "step ...: N s" lines).
LOG_CLOCK=0
log() {
    if ((LOG_CLOCK)); then
        printf '==> [+%4ds] %s\n' "$SECONDS" "$*"
    else
        printf '==> %s\n' "$*"
    fi
}
die() { printf 'kvcoord.sh: %s\n' "$*" >&2; exit 1; }
# A usage error: the message, a hint, exit 2 (as every kvcoord program).
usage_error() {
    printf 'kvcoord.sh: %s\nTry '"'"'tools/kvcoord.sh --help'"'"' for more information.\n' "$*" >&2
    exit 2
}

# ---- packages --------------------------------------------------------------

# A name without an architecture means the native package: once its :arm64
# twin is installed too (the multiarch ones of the arm64 step), dpkg-query
# answers for both, one line each.
missing_packages() {
    local p native status
    native=$(dpkg --print-architecture)
    for p in "${PACKAGES[@]}"; do
        status=$(dpkg-query -W -f='${binary:Package} ${db:Status-Status}\n' "$p" 2>/dev/null || true)
        grep -qxE "${p//./\\.}(:$native)? installed" <<<"$status" || printf '%s\n' "$p"
    done
}

install_packages() {
    command -v dpkg-query >/dev/null || die "dpkg-query not found: this script expects Debian 12"
    local missing
    mapfile -t missing < <(missing_packages)
    if ((${#missing[@]} == 0)); then
        log "Debian packages: all ${#PACKAGES[@]} present"
        return
    fi
    log "Debian packages missing: ${missing[*]}"
    ((EUID == 0)) || die "installing packages needs root: run as root, or install: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    # the arm64 cross build's libraries are Debian's multiarch :arm64 packages
    if printf '%s\n' "${missing[@]}" | grep -q ':arm64$' &&
        ! dpkg --print-foreign-architectures | grep -qx arm64; then
        dpkg --add-architecture arm64
    fi
    apt-get update || die "apt-get update failed"
    apt-get install -y --no-install-recommends "${missing[@]}"
}

# ---- build -----------------------------------------------------------------

build() { # build DIR [cmake options...]
    local dir=$1
    shift
    log "configure and build $dir/"
    cmake -S "$ROOT" -B "$ROOT/$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKVCOORD_WERROR=ON "$@" || return 1
    cmake --build "$ROOT/$dir" -j"$JOBS"
}

# ---- run / stop ------------------------------------------------------------

# True if pid runs: exists and is not a zombie (an exited process nobody has
# reaped yet, e.g. under a PID 1 that does not reap orphans).
alive() {
    [[ -n ${1:-} ]] && kill -0 "$1" 2>/dev/null || return 1
    local st
    st=$(<"/proc/$1/stat") 2>/dev/null || return 1
    st=${st##*) }
    [[ ${st%% *} != Z ]]
}

# True if pid is alive and was started from this checkout's build as
# kvcoordd or kvcoord-worker (pids are reused: never signal a pid from a
# stale file that now belongs to something else).
ours() {
    local pid=$1 cmd
    alive "$pid" || return 1
    cmd=$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null) || return 1
    [[ $cmd == *"$ROOT"/build/kvcoordd\ * || $cmd == *"$ROOT"/build/kvcoord-worker\ * ]]
}

stop_pids() { # stop_pids WHAT PID... : SIGTERM, wait up to 5 s, then SIGKILL
    # Says which of the pids were already gone (or now belong to another
    # program, left alone); returns 1 when none was ours and running.
    local what=$1 pid n
    shift
    local live=() gone=() other=()
    for pid in "$@"; do
        if ours "$pid"; then
            live+=("$pid")
        elif alive "$pid"; then
            other+=("$pid")
        else
            gone+=("$pid")
        fi
    done
    ((${#gone[@]})) && log "$what: pid ${gone[*]} already gone (not running)"
    ((${#other[@]})) &&
        log "$what: pid ${other[*]} now belongs to another program (pid reused): left alone"
    ((${#live[@]})) || return 1
    log "stopping $what (pid ${live[*]})"
    kill -TERM "${live[@]}" 2>/dev/null || true
    for ((n = 0; n < 50; n++)); do
        local left=()
        for pid in "${live[@]}"; do alive "$pid" && left+=("$pid"); done
        ((${#left[@]})) || return 0
        sleep 0.1
    done
    log "$what still alive after 5 s: SIGKILL ${left[*]}"
    kill -KILL "${left[@]}" 2>/dev/null || true
}

still_serving() { # says what answers on the last run's port (kvcoord-PORT); 0 if any
    local port holders
    port=$(cat "$RUN_DIR/segment" 2>/dev/null) && port=${port#kvcoord-} || return 1
    [[ $port =~ ^[0-9]+$ ]] && (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null || return 1
    holders=$(ss -Hltnp "sport = :$port" 2>/dev/null | grep -o 'pid=[0-9]*' | sort -u |
        sed 's/pid=//' | paste -sd' ') || true
    log "NOT stopped: 127.0.0.1:$port still answers (pid ${holders:-unknown, another user}; not a pid of the run files, e.g. a kvcoordd restarted by hand): stop it with kill PID" >&2
}

cmd_stop() {
    case ${1:-} in
    "") ;;
    -h | --help) usage; return 0 ;;
    *) usage_error "stop: unknown argument '$1'" ;;
    esac
    local workers=() daemon="" stopped=0
    [[ -f $RUN_DIR/workers.pid ]] && mapfile -t workers <"$RUN_DIR/workers.pid"
    [[ -f $RUN_DIR/kvcoordd.pid ]] && daemon=$(<"$RUN_DIR/kvcoordd.pid")
    if ((${#workers[@]} == 0)) && [[ -z $daemon ]]; then
        still_serving && return 1
        log "nothing to stop (no pid files in build/run/)"
        return 0
    fi
    ((${#workers[@]})) && stop_pids "workers" "${workers[@]}" && stopped=1
    [[ -n $daemon ]] && stop_pids "kvcoordd" "$daemon" && stopped=1
    rm -f "$RUN_DIR/workers.pid" "$RUN_DIR/kvcoordd.pid"
    if still_serving; then
        return 1
    elif ((stopped)); then
        log "stopped"
    else
        log "nothing to stop: the last run's processes had already exited (log: build/run/kvcoordd.log)"
    fi
    if [[ -f $RUN_DIR/segment ]]; then
        local segment
        segment=$(<"$RUN_DIR/segment")
        [[ -e /dev/shm/$segment ]] && segment_note "$segment"
    fi
    return 0
}

segment_note() { # segment_note SEGMENT: what the kept segment still serves
    # A worker withdraws its rank as it exits, or kvcoordd reaps it; one
    # killed (SIGKILL after a SIGSTOP, say) while kvcoordd was not running
    # to reap it leaves its rank registered: ask the segment, never assume.
    local segment=$1 diag=$ROOT/build/kvcoord-diag left
    local kept="segment /dev/shm/$segment kept (rm it to discard): HTTP registrations survive a restart"
    if [[ ! -x $diag ]]; then
        log "$kept"
        return 0
    fi
    # "rank R (pid P)" of every worker's rank still registered by a dead pid
    if ! left=$("$diag" --segment "$segment" --json ranks 2>/dev/null | "$PY" -c '
import json, sys
d = json.load(sys.stdin)
print(", ".join("rank %d (pid %d)" % (r["rank"], r["pid"]) for r in d["ranks"]
                if r["state"] == "registered" and r["owned_by_worker"] and not r["pid_alive"]))
'); then
        log "$kept; the workers' ranks could not be read (see: build/kvcoord-diag --segment $segment ranks)"
    elif [[ -z $left ]]; then
        log "$kept; the workers' ranks were withdrawn as they exited"
    else
        log "$kept; but these workers' ranks are still registered: $left (killed before they withdrew them, with no kvcoordd running to reap them): lookups hand out their dead sessions until 'build/kvcoord-diag --segment $segment repair' withdraws them (HTTP registrations stay)"
    fi
}

wait_health() { # wait_health URL DAEMON_PID
    # Ours must be the one answering: the daemon we started is alive and says
    # it listens (another one on the port would answer /health too).
    local n
    for ((n = 0; n < 100; n++)); do
        alive "$2" || break
        if grep -q ' listening ' "$RUN_DIR/kvcoordd.log" 2>/dev/null &&
            curl -fsS --max-time 1 "$1/health" >/dev/null 2>&1; then
            alive "$2" && return 0
            break
        fi
        sleep 0.1
    done
    tail -n 20 "$RUN_DIR/kvcoordd.log" >&2 || true
    die "kvcoordd did not answer $1/health (log: build/run/kvcoordd.log)"
}

start_daemon() { # start_daemon PORT SEGMENT
    log "starting kvcoordd on 127.0.0.1:$1 (segment $2, fresh)"
    setsid "$ROOT/build/kvcoordd" --listen "127.0.0.1:$1" --segment "$2" --fresh \
        </dev/null >"$RUN_DIR/kvcoordd.log" 2>&1 &
    echo $! >"$RUN_DIR/kvcoordd.pid"
    wait_health "http://127.0.0.1:$1" "$!"
}

start_workers() { # start_workers SEGMENT INFO_DIR
    local rank
    : >"$RUN_DIR/workers.pid"
    for ((rank = 0; rank < TP; rank++)); do
        setsid "$ROOT/build/kvcoord-worker" --segment "$1" --rank "$rank" \
            --info "$2/rank-$rank.json" --linger --timeout-ms 10000 \
            </dev/null >"$RUN_DIR/worker-$rank.log" 2>&1 &
        echo $! >>"$RUN_DIR/workers.pid"
    done
    log "started $TP kvcoord-worker processes (pids in build/run/workers.pid)"
}

wait_workers() { # every worker prints its line once registered
    local pids rank n
    mapfile -t pids <"$RUN_DIR/workers.pid"
    for ((n = 0; n < 300; n++)); do
        local done_count=0
        for ((rank = 0; rank < TP; rank++)); do
            if grep -q "rank=$rank generation=" "$RUN_DIR/worker-$rank.log" 2>/dev/null; then
                ((++done_count))
            elif ! alive "${pids[$rank]}"; then
                cat "$RUN_DIR/worker-$rank.log" >&2 || true
                die "worker for rank $rank exited before registering (build/run/worker-$rank.log)"
            fi
        done
        if ((done_count == TP)); then
            cat "$RUN_DIR"/worker-*.log
            return 0
        fi
        sleep 0.1
    done
    die "workers did not all register within 30 s (build/run/worker-*.log)"
}

cmd_run() {
    local model=llama-3.1-8b port=6789 python=0
    while (($#)); do
        case $1 in
        --python) python=1; shift ;;
        --model) (($# >= 2)) || usage_error "run: --model needs a value"; model=$2; shift 2 ;;
        --port) (($# >= 2)) || usage_error "run: --port needs a value"; port=$2; shift 2 ;;
        --model=*) model=${1#*=}; shift ;;
        --port=*) port=${1#*=}; shift ;;
        -h | --help) usage; return 0 ;;
        *) usage_error "run: unknown option '$1'" ;;
        esac
    done
    case $model in
    llama-3.1-8b | qwen2.5-72b | stress) ;;
    *) usage_error "run: unknown model '$model' (llama-3.1-8b, qwen2.5-72b or stress)" ;;
    esac
    if ! [[ $port =~ ^[1-9][0-9]{0,4}$ ]] || ((port > 65535)); then
        usage_error "run: bad port '$port' (1..65535)"
    fi

    install_packages
    build build
    mkdir -p "$RUN_DIR"
    # One run at a time per checkout (its pid files live in build/run/): a
    # previous run's processes are stopped first, and the user is told.
    if [[ -s $RUN_DIR/kvcoordd.pid || -s $RUN_DIR/workers.pid ]]; then
        log "$(previous_run_note "$(cat "$RUN_DIR/segment" 2>/dev/null)" "kvcoord-$port")"
        cmd_stop >/dev/null
    fi
    local segment=kvcoord-$port info_dir=$RUN_DIR/$model t0 t1
    echo "$segment" >"$RUN_DIR/segment"
    log "writing $model transfer-engine info for $TP TP ranks to build/run/$model/"
    "$PY" "$ROOT/tools/gen_model_info.py" --model "$model" --tp "$TP" --out "$info_dir"
    t0=$(date +%s%N)
    start_daemon "$port" "$segment"
    start_workers "$segment" "$info_dir"
    wait_workers
    t1=$(date +%s%N)
    log "kvcoordd up and $TP ranks registered in $(((t1 - t0) / 1000000)) ms"
    log "querying every rank over HTTP as a remote instance would"
    "$PY" "$ROOT/tools/query_ranks.py" --url "http://127.0.0.1:$port" --ranks "$TP" \
        --expect-dir "$info_dir" --worker-logs "$RUN_DIR"
    if ((python)); then
        [[ -d $ROOT/build/python/kvcoord ]] ||
            die "the Python package was not built (needs python3-dev; see the cmake output)"
        log "8 Python processes as one TP group (examples/sglang_tp_group.py, import kvcoord)"
        PYTHONPATH=$ROOT/build/python "$PY" "$ROOT/examples/sglang_tp_group.py" --port "$port" \
            --model-dir "$info_dir"
    fi
    cat <<EOF

kvcoordd is serving http://127.0.0.1:$port (log: build/run/kvcoordd.log), with $TP
workers attached to segment /dev/shm/$segment. Try:
  curl -s 'http://127.0.0.1:$port/get_transfer_engine_info?rank=0' | head -c 300
Stop everything with:
  tools/kvcoord.sh stop
EOF
}

# ---- test ------------------------------------------------------------------

run_suite() { # run_suite DIR : ctest; returns its status
    # $TEST_JOBS (twice the build jobs) tests at a time: most of them wait
    # (on etcd leases, timeouts, children) more than they compute.  Those
    # that keep two cores busy take two slots (PROCESSORS 2, tests/CMakeLists.txt);
    # those that measure time, memory or throughput, or take a port through
    # a gap, are RUN_SERIAL in their tests.cmake and run alone.
    log "ctest --test-dir $1 -j$TEST_JOBS"
    ctest_in "$1" --output-on-failure -j"$TEST_JOBS"
}

# ctest_in DIR ARGS... : ctest in $ROOT/DIR; a DIR whose run failed is kept
# for failure_summary.
FAILED_DIRS=()
ctest_in() {
    local dir=$1 st=0
    shift
    ctest --test-dir "$ROOT/$dir" "$@" || st=$?
    ((st == 0)) || FAILED_DIRS+=("$dir")
    return "$st"
}

# What failed, again at the very end of the output (where a CI page that
# keeps only the end of a long log still shows it): the failed steps, each
# failed test's name and the end of its output from ctest's LastTest.log.
failure_summary() {
    ((${#FAILED_STEPS[@]})) && log "failed steps: ${FAILED_STEPS[*]}"
    local dir list name
    for dir in "${FAILED_DIRS[@]}"; do
        list=$ROOT/$dir/Testing/Temporary/LastTestsFailed.log
        [[ -f $list ]] || continue
        log "$dir: failed tests: $(cut -d: -f2- "$list" | tr '\n' ' ')"
        while IFS=: read -r _ name; do
            log "$dir: the end of $name's output ($dir/Testing/Temporary/LastTest.log has all of it)"
            awk -v n="$name" '
                { line = $0 }
                sub(/^[0-9]+\/[0-9]+ Testing: /, "", line) && line == n { p = 1; next }
                p && /^<end of output>/ { exit }
                p' "$ROOT/$dir/Testing/Temporary/LastTest.log" | tail -n 60
        done <"$list"
    done
}

# The libFuzzer targets (tests/fuzz), each for a bounded time.  Only they
# are built in build-fuzz/ (clang, -fsanitize=fuzzer,address,undefined).
FUZZ_SECONDS=${KVCOORD_FUZZ_SECONDS:-20}
fuzz_build() {
    ((FUZZ_SECONDS > 0)) || return 0
    log "configure and build build-fuzz/ (clang, libFuzzer targets only)"
    CC=clang cmake -S "$ROOT" -B "$ROOT/build-fuzz" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
        -DKVCOORD_FUZZ=ON -DKVCOORD_FUZZ_SECONDS="$FUZZ_SECONDS" || return 1
    cmake --build "$ROOT/build-fuzz" -j"$JOBS" --target fuzz-targets
}
fuzz_run() {
    local secs=$FUZZ_SECONDS
    ((secs > 0)) || { log "fuzz pass skipped (KVCOORD_FUZZ_SECONDS=0)"; return 0; }
    log "ctest --test-dir build-fuzz -L fuzz (${secs} s per target)"
    ctest_in build-fuzz -L fuzz --output-on-failure -j"$JOBS"
}

# Every C source and header formatted as .clang-format says (one style for
# the tree; `clang-format -i FILE` fixes a file).
format_check() {
    log "clang-format --dry-run --Werror (src include tools tests python examples)"
    local files
    mapfile -t files < <(cd "$ROOT" && git ls-files -- '*.c' '*.h' 2>/dev/null ||
                         find src include tools tests python examples -name '*.[ch]' 2>/dev/null)
    ((${#files[@]})) || return 0
    (cd "$ROOT" && clang-format --dry-run --Werror "${files[@]}")
}

# Commit messages after SUBJECTS_FROM (older history stays as it was: main's
# history is never rewritten): a subject of at most 72 characters, then a
# blank line before any body.  SUBJECTS_FROM is 4bbcd88: it and three
# commits before it (52fd659, 86f137c, 583b29a) have subjects of 73-75
# characters.  A checkout without that commit (a tarball, a shallow clone)
# is not checked.
SUBJECTS_FROM=4bbcd88819f97abf32eacb5218f62aa3fc915f50
subject_check() {
    if ! git -C "$ROOT" cat-file -e "$SUBJECTS_FROM^{commit}" 2>/dev/null; then
        log "commit messages: $SUBJECTS_FROM is not in this checkout; not checked"
        return 0
    fi
    log "commit messages since $SUBJECTS_FROM: subject <= 72 characters, then a blank line"
    local bad
    bad=$(git -C "$ROOT" log --format='%h%x1f%B%x1e' "$SUBJECTS_FROM..HEAD" | python3 -c '
import sys
for c in sys.stdin.buffer.read().decode("utf-8", "replace").split("\x1e"):
    if "\x1f" not in c:
        continue
    h, msg = c.lstrip("\n").split("\x1f", 1)
    lines = msg.split("\n")
    if len(lines[0]) > 72:
        print("%s: a subject of %d characters: %s" % (h, len(lines[0]), lines[0]))
    elif len(lines) > 1 and lines[1].strip():
        print("%s: no blank line after the subject: %s" % (h, lines[0]))
')
    [[ -z $bad ]] && return 0
    printf '%s\n' "$bad" >&2
    return 1
}

# The build types and the other compiler a user may pick: each must build
# with zero warnings (-Werror here; users do not get -Werror).  Libraries and
# programs only: the tests are built (gcc: build/, build-asan/; clang: the
# fuzz targets) and run by the other passes.
build_matrix() {
    local one cc t
    # gcc -O2 (build/), -O2 with the asserts (build-asan/, KVC_ASSERTS) and
    # clang's fuzz targets are built elsewhere; here what they miss: gcc
    # -O3's warnings (more inlining) and clang's on everything.  gcc Debug
    # and MinSizeRel were dropped (2026-12-06): this matrix was the end of
    # the fresh machine's critical path (a gcc build here: 50 CPU seconds),
    # and the asserts Debug compiled now compile in build-asan/.
    for one in gcc:Release clang:RelWithDebInfo; do
        cc=${one%%:*} t=${one#*:}
        log "configure and build build-matrix/$cc-$t/ (warnings are errors)"
        CC=$cc cmake -S "$ROOT" -B "$ROOT/build-matrix/$cc-$t" -DCMAKE_BUILD_TYPE="$t" \
            -DKVCOORD_WERROR=ON -DKVCOORD_TESTS=OFF >/dev/null || return 1
        cmake --build "$ROOT/build-matrix/$cc-$t" -j"$JOBS" >/dev/null || {
            cmake --build "$ROOT/build-matrix/$cc-$t" -j1 2>&1 | grep -E 'error|warning' | head -40
            return 1
        }
    done
}

# libkvcoord and its own tests (tests/lib/tests.cmake, first part) cross-built
# for arm64 (-march=armv8-a, no LSE: atomics are LL/SC loops), warnings as
# errors, and every one of those tests (test_collective included) run under
# qemu-aarch64-static, each with a 120 s ctest timeout, so
# a hang fails the step instead of stalling it (the whole step: 21 s from
# scratch on 2 cores at load 5, under a minute loaded).  qemu-user keeps no
# robust futex lists: the crash tests mark a killed process's locks
# FUTEX_OWNER_DIED themselves there, as the kernel would (tests/lib/tu_robust.h).
# The checks that need a forked process's own /proc/self/stat start time
# (qemu answers it with its parent's) skip, saying why (tests/lib/tu_probe.h).
# See README, arm64.
ARM64_TIMEOUT=120
arm64_build() {
    log "configure and build build-arm64/ (aarch64-linux-gnu-gcc, library and its tests only)"
    cmake -S "$ROOT" -B "$ROOT/build-arm64" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKVCOORD_WERROR=ON \
        -DCMAKE_TOOLCHAIN_FILE="$ROOT/tools/aarch64-linux-gnu.cmake" -DKVCOORD_CORE_ONLY=ON \
        >/dev/null || return 1
    cmake --build "$ROOT/build-arm64" -j"$JOBS" >/dev/null || {
        cmake --build "$ROOT/build-arm64" -j1 2>&1 | grep -E 'error|warning' | head -40
        return 1
    }
}
arm64_run() {
    log "ctest --test-dir build-arm64 (qemu-aarch64-static, ${ARM64_TIMEOUT} s per test)"
    local status=0 log=$ROOT/build-arm64/Testing/Temporary/LastTest.log
    ctest_in build-arm64 --timeout "$ARM64_TIMEOUT" --output-on-failure -j"$JOBS" || status=1
    if [[ -f $log ]] && grep -q '^# .*qemu-user' "$log"; then
        log "arm64: what qemu-user lacks, and the cases skipped for it (tests/lib/tu_probe.h):"
        grep -E '^# .*qemu-user' "$log" | sort -u
        grep -E '^\[  SKIPPED \] test_' "$log" | sort -u
    fi
    return "$status"
}

# The Debian packages (tools/cpack.cmake: kvcoord, libkvcoord-dev) made from
# build/ with cpack, then installed by apt in a fresh Debian 12 root that
# mmdebstrap makes and throws away: apt resolves the dependencies
# dpkg-shlibdeps found from Debian's archive alone, kvcoordd and
# kvcoord-diag start, the Python package imports, the headers and
# kvcoord.pc are in place.  Mostly downloads (about 6 minutes, one of CPU):
# run in the background while the ASan suite runs.  Needs root
# (mmdebstrap's root mode); skipped, saying so, otherwise.
deb_pass() {
    if ((EUID != 0)); then
        log "Debian packages: install check skipped (mmdebstrap needs root here)"
        return 0
    fi
    log "cpack -G DEB in build/"
    rm -f "$ROOT"/build/kvcoord_*.deb "$ROOT"/build/libkvcoord-dev_*.deb
    (cd "$ROOT/build" && cpack -G DEB) || return 1
    local debs=("$ROOT"/build/kvcoord_*.deb "$ROOT"/build/libkvcoord-dev_*.deb) deb inc=()
    for deb in "${debs[@]}"; do inc+=(--include="$deb"); done # a path: its own --include
    log "apt install ${debs[*]##*/} in a fresh bookworm root (mmdebstrap)"
    # the hook makes the .debs visible at the same paths inside the root,
    # where dpkg opens them
    mmdebstrap --variant=apt "${inc[@]}" \
        --hook-dir=/usr/share/mmdebstrap/hooks/file-mirror-automount \
        --customize-hook='chroot "$1" kvcoordd --version' \
        --customize-hook='chroot "$1" kvcoord-diag --help >/dev/null' \
        --customize-hook='chroot "$1" python3 -c "import kvcoord, kvcoord.sglang"' \
        --customize-hook='chroot "$1" python3 -c "from importlib.metadata import entry_points as e; assert [p.value for p in e(group=\"sglang.srt.plugins\")] == [\"kvcoord.sglang_plugin:load\"]"' \
        --customize-hook='test -f "$1/usr/include/kvcoord/kvcoord.h"' \
        --customize-hook='find "$1/usr/lib" -name kvcoord.pc | grep -q .' \
        bookworm /dev/null
}

# The builds the plain suite does not need, run while the suites run: they
# mostly wait (on etcd leases, timeouts, children) and leave a core idle
# much of the time.  Niced, so the tests get the CPU first; each build's
# output goes to build-logs/NAME.log, shown when it fails.  Runs the steps
# named, in order; prints a "NAME STATUS" line on stdout as each ends.
background_builds() {
    local step
    renice -n 10 "$BASHPID" >/dev/null 2>&1 || true
    mkdir -p "$ROOT/build-logs"
    for step in "$@"; do
        local st=0 t0=$SECONDS
        case $step in
        matrix) build_matrix ;;
        arm64) arm64_build ;;
        asan) build build-asan -DKVCOORD_SANITIZE=ON ;;
        fuzz) fuzz_build ;;
        deb) deb_pass ;;
        esac >"$ROOT/build-logs/$step.log" 2>&1 || st=$?
        echo "$step $st $((SECONDS - t0))"
    done
}

# Wait until background_builds (pid $2, its stdout in file $3) has done
# step $1 (or has stopped).
wait_step() {
    while ! grep -q "^$1 " "$3" && kill -0 "$2" 2>/dev/null; do sleep 2; done
}

# Wait for background_builds (pid $1, its stdout in file $2); say how each
# step went (a failed one: the end of its log); returns 1 if any failed.
# Run "$@" as step NAME: its seconds are logged and kept for the summary.
STEP_TIMES=()
FAILED_STEPS=()
timed() { # timed NAME COMMAND...
    local name=$1 t0=$SECONDS st=0
    shift
    "$@" || st=$?
    STEP_TIMES+=("$name $((SECONDS - t0))s")
    ((st == 0)) || FAILED_STEPS+=("$name (exit $st)")
    log "step $name: $((SECONDS - t0)) s (exit $st; load $(cut -d' ' -f1-3 /proc/loadavg))"
    return "$st"
}

wait_builds() {
    local pid=$1 out=$2 step st secs status=0
    wait "$pid" || true
    while read -r step st secs; do
        if ((st == 0)); then
            log "background build $step: done in ${secs} s (build-logs/$step.log)"
        else
            log "background build $step: FAILED after ${secs} s (build-logs/$step.log, its end:)"
            tail -n 40 "$ROOT/build-logs/$step.log"
            status=1
        fi
    done <"$out"
    return "$status"
}

cmd_test() {
    local sanitize=0 arm64=0 status=0
    while (($#)); do
        case $1 in
        --sanitize) sanitize=1; shift ;;
        --arm64) arm64=1; shift ;;
        -h | --help) usage; return 0 ;;
        *) usage_error "test: unknown option '$1' (--sanitize or --arm64)" ;;
        esac
    done
    # Each option runs one part instead of the whole: two of them would
    # silently run only one.
    ((sanitize && arm64)) &&
        usage_error "test: --sanitize and --arm64 each run one part alone: give at most one"
    LOG_CLOCK=1
    if ((arm64)); then
        timed apt install_packages
        timed build-arm64 arm64_build && timed arm64-qemu arm64_run
        return
    fi
    timed apt install_packages
    if ((sanitize)); then
        timed build-asan build build-asan -DKVCOORD_SANITIZE=ON
        timed suite-asan run_suite build-asan || status=1
    else
        timed format format_check || status=1
        timed subjects subject_check || status=1
        timed build build build
        # The other builds in the background while the suites run: ASan's
        # first (its suite starts once the plain one is done), the build
        # matrix last (nothing runs it).
        local out=$ROOT/build-logs/background.status pid
        mkdir -p "$ROOT/build-logs"
        : >"$out"
        background_builds asan fuzz arm64 matrix >"$out" &
        pid=$!
        log "building build-asan/, build-fuzz/, build-arm64/, build-matrix/ in the background (niced; build-logs/)"
        timed suite run_suite build || status=1
        # the .debs from build/ (its suite done), installed in a fresh root
        local dout=$ROOT/build-logs/deb.status dpid
        background_builds deb >"$dout" &
        dpid=$!
        log "cpack -G DEB and its install in a fresh root in the background (build-logs/deb.log)"
        log "waiting for the background build of build-asan/"
        timed wait-asan wait_step asan "$pid" "$out"
        if grep -q '^asan 0 ' "$out"; then
            timed suite-asan run_suite build-asan || status=1
        fi
        # The fuzz and arm64 builds come before the matrix: their runs start
        # as soon as they are built, while the matrix still builds.
        timed wait-fuzz wait_step fuzz "$pid" "$out"
        if grep -q '^fuzz 0 ' "$out"; then
            timed fuzz-run fuzz_run || status=1
        fi
        timed wait-arm64 wait_step arm64 "$pid" "$out"
        if grep -q '^arm64 0 ' "$out"; then
            timed arm64-qemu arm64_run || status=1
        fi
        log "waiting for the background builds"
        timed wait-builds wait_builds "$pid" "$out" || status=1
        timed wait-deb wait_builds "$dpid" "$dout" || status=1
        local step st secs
        while read -r step st secs; do STEP_TIMES+=("bg-$step ${secs}s"); done < <(cat "$out" "$dout")
    fi
    log "step times (bg- = in the background, niced): ${STEP_TIMES[*]}; total ${SECONDS}s; load $(cut -d' ' -f1-3 /proc/loadavg)"
    if ((status)); then
        failure_summary
        log "FAILED: see the output above"
    else
        log "all test suites passed"
    fi
    return "$status"
}

# What 'run' says when it stops the previous run: PREV is that run's segment
# (empty if unknown), NEW this run's.  Only a different segment is kept.
previous_run_note() {
    local prev=$1 new=$2 head="a previous 'run' of this checkout is still up: stopping it first"
    if [[ $prev == "$new" ]]; then
        echo "$head; this run starts its segment $new afresh (what was registered in it is discarded)"
    elif [[ -n $prev ]]; then
        echo "$head (its segment $prev stays in /dev/shm, no longer served; this run starts $new fresh)"
    else
        echo "$head; this run starts $new fresh"
    fi
}

main() {
    # No command is a usage error (the help on stderr, exit 2), not a success.
    (($#)) || { usage >&2; usage_error "no command given (run, stop, test or help)"; }
    local cmd=$1
    shift
    case $cmd in
    run) cmd_run "$@" ;;
    stop) cmd_stop "$@" ;;
    test) cmd_test "$@" ;;
    help | -h | --help) usage ;;
    *) usage_error "unknown command '$cmd' (run, stop, test or help)" ;;
    esac
}

main "$@"
