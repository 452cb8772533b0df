#!/bin/sh
# test_install.sh BUILD_DIR WORKDIR PROGRAM.c CC: `cmake --install` the
# build into a temporary prefix, check the tree, then build PROGRAM.c
# against the installed library with the two lines docs/operations.md and
# the README document - shared (`pkg-config --cflags --libs kvcoord`, whose
# rpath must find the prefix's libkvcoord.so.0 with nothing else set), then
# static (-Wl,-Bstatic -lkvcoord, the shared library left in place) - and
# run both.  Exit 77 (skipped) without pkg-config.
set -eu
build=$1 work=$2 prog=$3 cc=$4
if ! command -v pkg-config >/dev/null 2>&1; then
    echo "SKIP: pkg-config not found (Debian package 'pkg-config')"
    exit 77
fi
rm -rf "$work"
mkdir -p "$work"
prefix=$work/prefix
cmake --install "$build" --prefix "$prefix" >"$work/install.log" 2>&1 ||
    { cat "$work/install.log"; echo "FAIL: cmake --install"; exit 1; }
echo "installed into $prefix:"
(cd "$prefix" && find . -type f -o -type l | sort)

pc=$(find "$prefix" -name kvcoord.pc | head -n 1)
[ -n "$pc" ] || { echo "FAIL: no kvcoord.pc installed"; exit 1; }
libdir=$(dirname "$(dirname "$pc")")
for f in include/kvcoord/kvcoord.h include/kvcoord/transfer.h \
         lib/systemd/system/kvcoordd@.service lib/systemd/system/kvcoordd@.socket share/doc/kvcoord/README.md \
         share/doc/kvcoord/operations.md bin/kvcoordd bin/kvcoord-diag bin/kvcoord-bench bin/kvcoord-worker; do
    [ -f "$prefix/$f" ] || { echo "FAIL: $f not installed"; exit 1; }
done
for f in libkvcoord.a libkvcoord.so libkvcoord.so.0 libkvcoord-transfer.a libkvcoord-transfer.so \
         libkvcoord-transfer.so.0 pkgconfig/kvcoord-transfer.pc; do
    [ -e "$libdir/$f" ] || { echo "FAIL: $libdir/$f not installed"; exit 1; }
done
[ ! -e "$prefix/bin/kvcoord-torture" ] || { echo "FAIL: kvcoord-torture is a test tool"; exit 1; }
grep -q "^ExecStart=$prefix/bin/kvcoordd " "$prefix/lib/systemd/system/kvcoordd@.service" ||
    { echo "FAIL: the installed unit does not run $prefix/bin/kvcoordd"; exit 1; }

PKG_CONFIG_PATH=$(dirname "$pc")
export PKG_CONFIG_PATH
pkg-config --validate kvcoord 2>/dev/null || pkg-config --exists --print-errors kvcoord
[ "$(pkg-config --modversion kvcoord)" != "" ]
cflags=$(pkg-config --cflags kvcoord)
# A KVCOORD_SANITIZE build installs an ASan-instrumented library: a program
# using it must link the sanitizer runtimes itself (ASan wants to come
# first), as any program built against such a library would.
if grep -q __asan_init "$libdir"/libkvcoord.a 2>/dev/null; then
    cflags="$cflags -fsanitize=address,undefined"
fi
seg=kvctest-install-$$

# The Python package, when the build has it: installed beside the library's
# prefix, importable by /usr/bin/python3 from there alone (its extension
# links libkvcoord statically and exports only PyInit__kvcoord).
if [ -d "$build/python/kvcoord" ]; then
    pkg=$(find "$prefix" -type d -path '*/dist-packages/kvcoord' | head -n 1)
    [ -n "$pkg" ] || { echo "FAIL: the Python package kvcoord was not installed"; exit 1; }
    if grep -q __asan_init "$libdir"/libkvcoord.a 2>/dev/null; then
        echo "python: installed at $pkg (not imported: a sanitizer build needs LD_PRELOAD)"
    else
        (cd / && PYTHONPATH=$(dirname "$pkg") /usr/bin/python3 -c \
            'import kvcoord, kvcoord.sglang, sys; assert kvcoord.__file__.startswith(sys.argv[1]), kvcoord.__file__; print("python: import kvcoord", kvcoord.VERSION, "from", kvcoord.__file__)' \
            "$pkg") || { echo "FAIL: the installed Python package does not import"; exit 1; }
    fi
fi

# The documented shared line, nothing added: the rpath comes from kvcoord.pc.
unset LD_LIBRARY_PATH
echo "shared: $cc -std=c11 $cflags ... $(pkg-config --libs kvcoord)"
# shellcheck disable=SC2046
"$cc" -std=c11 -Wall -Wextra -Werror -pedantic $cflags -o "$work/prog_shared" "$prog" \
    $(pkg-config --libs kvcoord)
"$work/prog_shared" "$seg-a" ||
    { ldd "$work/prog_shared"; echo "FAIL: prog_shared (documented pkg-config line) does not run"; exit 1; }
ldd "$work/prog_shared" | grep -q "$libdir/libkvcoord.so.0" ||
    { ldd "$work/prog_shared"; echo "FAIL: prog_shared does not use the installed libkvcoord.so"; exit 1; }

# The documented static line, with libkvcoord.so still installed beside the .a.
[ -e "$libdir/libkvcoord.so" ] || { echo "FAIL: libkvcoord.so gone before the static link"; exit 1; }
static_libs="-L$(pkg-config --variable=libdir kvcoord) -Wl,-Bstatic -lkvcoord -Wl,-Bdynamic $(pkg-config --libs jansson) -lpthread"
echo "static: $cc -std=c11 $cflags ... $static_libs"
# shellcheck disable=SC2086
"$cc" -std=c11 -Wall -Wextra -Werror -pedantic $cflags -o "$work/prog_static" "$prog" $static_libs
"$work/prog_static" "$seg-b"
if ldd "$work/prog_static" | grep -q libkvcoord; then
    ldd "$work/prog_static"
    echo "FAIL: prog_static still needs a shared libkvcoord"; exit 1
fi
echo "PASS: installed library, headers, pkg-config file (shared and static), unit, docs"
