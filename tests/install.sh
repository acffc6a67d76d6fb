#!/usr/bin/env bash
# cmake --install puts the library, header, pkg-config file and CMake
# package in place, and a program builds against each and runs on hakmem.
# Usage: install.sh BUILD_DIR [SANITIZER]  (a sanitized build's consumers
# link the sanitizer's runtime too)
set -eu
build=$(realpath "$1")
cc="cc${2:+ -fsanitize=$2}"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cmake --install "$build" --prefix "$work/prefix" >/dev/null
prefix=$work/prefix
libdir=$(dirname "$(find "$prefix" -name libhakmem.so | head -1)")
for f in "$prefix/include/hakmem.h" "$libdir/libhakmem.a" "$libdir/pkgconfig/hakmem.pc" \
         "$libdir/cmake/hakmem/hakmemConfig.cmake" "$prefix/bin/hakmem"; do
  [ -e "$f" ] || { echo "install: missing $f"; exit 1; }
done
cat >"$work/app.c" <<'C'
#include <hakmem.h>
#include <stdio.h>
#include <stdlib.h>
int main(void)
{
    char *p = malloc(100);
    int ok = hak_owns(p);
    free(p);
    printf("%s %s\n", ok ? "served-by-hakmem" : "NOT-HAKMEM", hak_version());
    return ok ? 0 : 1;
}
C
# pkg-config, shared
export PKG_CONFIG_PATH=$libdir/pkgconfig
if command -v pkg-config >/dev/null; then
  $cc "$work/app.c" -o "$work/app_pc" $(pkg-config --cflags --libs hakmem)
  LD_LIBRARY_PATH=$libdir "$work/app_pc" | grep -q served-by-hakmem
else
  $cc "$work/app.c" -o "$work/app_pc" -I"$prefix/include" -L"$libdir" -lhakmem
  LD_LIBRARY_PATH=$libdir "$work/app_pc" | grep -q served-by-hakmem
fi
# static archive
$cc "$work/app.c" -o "$work/app_static" -I"$prefix/include" "$libdir/libhakmem.a" -lpthread
"$work/app_static" | grep -q served-by-hakmem
# CMake package
mkdir "$work/proj"
cp "$work/app.c" "$work/proj/"
cat >"$work/proj/CMakeLists.txt" <<'CM'
cmake_minimum_required(VERSION 3.16)
project(consumer C CXX)
find_package(hakmem REQUIRED)
add_executable(app app.c)
target_link_libraries(app PRIVATE hakmem::hakmem)
CM
cmake -S "$work/proj" -B "$work/proj/build" -DCMAKE_PREFIX_PATH="$prefix" \
  -DCMAKE_C_FLAGS="${2:+-fsanitize=$2}" -DCMAKE_EXE_LINKER_FLAGS="${2:+-fsanitize=$2}" >/dev/null
cmake --build "$work/proj/build" >/dev/null
LD_LIBRARY_PATH=$libdir "$work/proj/build/app" | grep -q served-by-hakmem
# the installed launcher finds the installed library
"$prefix/bin/hakmem" report -- true 2>&1 | grep -q '^hakmem .* report'
echo "install: 5 passed, 0 failed"
