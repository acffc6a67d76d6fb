#!/usr/bin/env bash
# A quick interleaved comparison of libraries (or of one library under
# different options) on one benchmark program, for a change's A/B before
# the whole `make bench`: each round runs every entry once, in an order
# that rotates from round to round, and the summary gives each entry's
# median and the median of its per-round ratio to the first entry (a ratio
# taken within a round is steadier on a noisy machine than a ratio of
# medians: on the development VMs a library's medians moved 6% from run
# to run, measured at 7981201).
#
# Usage: scripts/ab.sh ROUNDS "BENCH ARGS..." [METRIC]
#   LIBS   entries "name=LIBRARY[|VAR=VALUE...]" separated by spaces; LIBRARY
#          is preloaded, "-" for none (glibc)
#   BIN    the benchmark program (default build/release/bench/bench_battle)
#   METRIC the "metric value" line to read (default median_ns)
# Example:
#   LIBS="new=build/release/libhakmem.so old=/tmp/old.so glibc=-" \
#     scripts/ab.sh 15 "mixed 1000"
#   BIN=build/release/bench/bench_threads LIBS="a=x.so a16=x.so|HAKMEM_X=16" \
#     scripts/ab.sh 7 "big 1 4000000" mops
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
rounds=${1:?usage: ab.sh ROUNDS "BENCH ARGS..." [METRIC]}
args=${2:?usage: ab.sh ROUNDS "BENCH ARGS..." [METRIC]}
metric=${3:-median_ns}
bin=${BIN:-$root/build/release/bench/bench_battle}
: "${LIBS:?set LIBS to \"name=LIBRARY[|VAR=VALUE...] ...\"}"
read -r -a entries <<<"$LIBS"
results=$(mktemp)
trap 'rm -f "$results"' EXIT

for ((round = 1; round <= rounds; round++)); do
    for ((k = 0; k < ${#entries[@]}; k++)); do
        entry=${entries[$(((k + round) % ${#entries[@]}))]}
        name=${entry%%=*} rest=${entry#*=}
        lib=${rest%%|*} vars=()
        [[ $rest == *"|"* ]] && IFS='|' read -r -a vars <<<"${rest#*|}"
        [[ $lib != - ]] && vars+=("LD_PRELOAD=$lib")
        # shellcheck disable=SC2086 # the benchmark's arguments split on purpose
        value=$(env "${vars[@]}" "$bin" $args | awk -v m="$metric" '$1 == m { print $2 }')
        if [[ -z $value ]]; then
            echo "ab.sh: $name printed no $metric" >&2
            exit 1
        fi
        echo "$round $name $value" >>"$results"
    done
done

python3 - "$results" "${entries[@]}" <<'PY'
import collections
import statistics
import sys

values = collections.defaultdict(dict)
for line in open(sys.argv[1]):
    round_, name, value = line.split()
    values[name][round_] = float(value)
names = [entry.split("=", 1)[0] for entry in sys.argv[2:]]
first = names[0]
for name in names:
    ratios = [v / values[first][r] for r, v in values[name].items()]
    print(f"{name:12s} median {statistics.median(values[name].values()):11.2f}"
          f"  ratio to {first} {statistics.median(ratios):.3f}"
          f"  all {' '.join(f'{v:.4g}' for v in values[name].values())}")
PY
