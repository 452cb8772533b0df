# CMake toolchain file: cross-build libkvcoord and its tests for arm64 with
# Debian's gcc-aarch64-linux-gnu and multiarch :arm64 packages, run by ctest
# under qemu-user-static (tools/kvcoord.sh test, "arm64" step):
#   cmake -S . -B build-arm64 -DCMAKE_TOOLCHAIN_FILE=tools/aarch64-linux-gnu.cmake \
#         -DKVCOORD_CORE_ONLY=ON
# -march=armv8-a without outline atomics: every atomic is an LL/SC loop
# (ldaxr/stlxr), no LSE, the case the seqlock's release fence is for.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_LIBRARY_ARCHITECTURE aarch64-linux-gnu)
set(CMAKE_C_FLAGS_INIT "-march=armv8-a -mno-outline-atomics")
set(CMAKE_FIND_ROOT_PATH /usr/aarch64-linux-gnu)
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY BOTH)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE BOTH)
# The tests run on Debian's multiarch libc6:arm64 (its loader is
# /lib/ld-linux-aarch64.so.1, found without -L).  Not on the cross
# toolchain's copy in /usr/aarch64-linux-gnu: under qemu-aarch64-static 7.2,
# with that ld-linux-aarch64.so.1 (libc6-arm64-cross 2.36-8cross1) as the
# program's interpreter ("-L /usr/aarch64-linux-gnu", or a --dynamic-linker
# pointing at it) the child of every fork() spins before fork() returns in it.
set(CMAKE_CROSSCOMPILING_EMULATOR qemu-aarch64-static)
set(ENV{PKG_CONFIG_LIBDIR} /usr/lib/aarch64-linux-gnu/pkgconfig:/usr/share/pkgconfig)
