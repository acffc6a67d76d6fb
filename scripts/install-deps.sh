#!/usr/bin/env bash
# Install what the project needs from Debian's packages, when missing.
# Usage: install-deps.sh test|bench|profile. As root it installs; otherwise it
# names what is missing and carries on (the bench skips what it lacks).
set -u
# google-perftools: google-pprof, which reads hakmem's heap profiles (tests/launcher.sh)
test_packages="cmake make gcc g++ binutils pkg-config python3 git coreutils valgrind clang sqlite3 perl redis-server redis-tools musl-tools linux-libc-dev google-perftools"
# the aarch64 cross build and the emulator its tests run under
test_packages="$test_packages gcc-aarch64-linux-gnu g++-aarch64-linux-gnu qemu-user-static"
# python3's own test modules, for the real-program tests
pyver=$(/usr/bin/python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null || echo 3.11)
test_packages="$test_packages libpython$pyver-testsuite"
bench_packages="$test_packages libmimalloc2.0 libjemalloc2 libgoogle-perftools4 python3-matplotlib valgrind"
# heaptrack, the exact profile scripts/heaptrack_compare.py checks hakmem's against
profile_packages="$test_packages heaptrack zstd"
case "${1:-test}" in
  test) wanted=$test_packages ;;
  bench) wanted=$bench_packages ;;
  profile) wanted=$profile_packages ;;
  *) echo "usage: $0 test|bench|profile" >&2; exit 2 ;;
esac
missing=()
for p in $wanted; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -ne 0 ]; then
  echo "install-deps: not root; missing Debian packages: ${missing[*]}" >&2
  exit 0
fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get install -y -q "${missing[@]}" >/dev/null 2>&1 ||
  { apt-get update -q >/dev/null && apt-get install -y -q "${missing[@]}" >/dev/null; } ||
  { echo "install-deps: could not install ${missing[*]}" >&2; [ "${1:-test}" = bench ] || exit 1; }
exit 0
