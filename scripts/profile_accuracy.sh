#!/bin/sh
# The heap profile's estimates against the truth on the two-site program
# of tests/test_profile.c (4,000 blocks of 300 KB, 4 M of 24 B, known
# exactly): RUNS runs at each sampling interval, each estimate's error,
# and the worst. The figures in docs/profiling.md come from here.
#
#   scripts/profile_accuracy.sh [RUNS [INTERVAL...]]   (default 20 runs, 2M and 512K)
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
test_profile=$root/build/release/tests/test_profile
[ -x "$test_profile" ] || { echo "profile_accuracy: build first (make release)" >&2; exit 1; }
runs=${1:-20}
[ $# -gt 0 ] && shift
intervals=${*:-2M 512K}
for interval in $intervals; do
    i=0
    while [ "$i" -lt "$runs" ]; do
        HAKMEM_PROFILE_SAMPLE=$interval "$test_profile" two_sites | grep '^two sites:'
        i=$((i + 1))
    done | awk -v interval="$interval" -v runs="$runs" '
        function abs(x) { return x < 0 ? -x : x }
        {
            gsub(/[(),%;+]/, " ")
            # two sites: large N allocs E E bytes small N allocs E E bytes S1 and S2 samples
            big_n = $6; big_b = $7; small_n = $12; small_b = $13; s1 += $15; s2 += $17
            if (abs(big_n) > w1) w1 = abs(big_n)
            if (abs(big_b) > w2) w2 = abs(big_b)
            if (abs(small_n) > w3) w3 = abs(small_n)
            if (abs(small_b) > w4) w4 = abs(small_b)
            if (abs(big_b) <= 10) in1++
            if (abs(small_b) <= 10) in2++
        }
        END {
            printf "interval %s, %d runs: worst error, large site %.1f%% of its count, %.1f%% of its bytes (within 10%%: %d runs); small site %.1f%% and %.1f%% (within 10%%: %d runs); samples a run %.0f and %.0f\n",
                interval, NR, w1, w2, in1, w3, w4, in2, s1 / NR, s2 / NR
        }'
done
