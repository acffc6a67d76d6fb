#!/usr/bin/env bash
# Build the libFuzzer harness with clang and run it for SECONDS (default 20).
# hakmem is compiled without the standard names (libFuzzer keeps glibc's
# malloc) and with UBSan; the corpus persists under build/fuzz/corpus.
# Usage: tests/fuzz.sh [SECONDS] [BUILD_DIR]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
seconds=${1:-20}
out=${2:-$root/build/fuzz}
command -v clang >/dev/null || { echo "fuzz.sh: clang is missing (apt-get install clang)" >&2; exit 1; }
mkdir -p "$out/corpus"
flags="-O1 -g -std=gnu11 -fsanitize=fuzzer-no-link,undefined -fno-sanitize-recover=all -I$root/include -pthread"
objects=()
for src in "$root"/src/*.c; do
  obj="$out/$(basename "${src%.c}").o"
  [ "$obj" -nt "$src" ] && [ "$obj" -nt "$root/src/internal.h" ] && [ "$obj" -nt "$root/src/alloc.h" ] ||
    clang $flags -ftls-model=initial-exec -fno-math-errno -c "$src" -o "$obj"
  objects+=("$obj")
done
clang $flags -fsanitize=fuzzer "$root/tests/fuzz_alloc.c" "${objects[@]}" -o "$out/fuzz_alloc"
"$out/fuzz_alloc" -max_total_time="$seconds" -rss_limit_mb=4096 -max_len=4096 -print_final_stats=1 \
  -artifact_prefix="$out/" \
  "$out/corpus" 2>&1 | grep -v "^\"\\|^###|^  " | tail -n 12
