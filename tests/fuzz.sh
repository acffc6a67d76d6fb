#!/usr/bin/env bash
# Build the libFuzzer harness with clang and run it for SECONDS (default 20),
# then half as long with profiling sampling often.
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
newest_header=$(ls -t "$root"/src/*.h | head -1)
for src in "$root"/src/*.c; do
  obj="$out/$(basename "${src%.c}").o"
  [ "$obj" -nt "$src" ] && [ "$obj" -nt "$newest_header" ] ||
    clang $flags -ftls-model=initial-exec -fno-math-errno -c "$src" -o "$obj"
  objects+=("$obj")
done
clang $flags -fsanitize=fuzzer "$root/tests/fuzz_alloc.c" "${objects[@]}" -o "$out/fuzz_alloc"
fuzz() {
  "$out/fuzz_alloc" -max_total_time="$1" -rss_limit_mb=4096 -max_len=4096 -print_final_stats=1 \
    -artifact_prefix="$out/" \
    "$out/corpus" 2>&1 | grep -v "^\"\\|^###|^  " | tail -n 12
}
fuzz "$seconds"
# Then with a profiling sample every 16 allocations or so: sampled blocks
# come from the sample arena and the large tier (a size-0 bug hid there).
HAKMEM_PROFILE_SAMPLE=4K HAKMEM_PROFILE_BUDGET=100 fuzz $(((seconds + 1) / 2))
