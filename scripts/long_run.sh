#!/usr/bin/env bash
# The long run that docs/reliability.md reports ("Last long run"): for
# SECONDS, side by side, the soak (4 threads with churn, RSS flat) on the
# default and on the hardened library, the fuzzer, and the fault tests in a
# loop, one round a minute: out of memory
# (every tier driven to ENOMEM under RLIMIT_AS) and bad input (every misuse
# case, aborting and in warn mode). Logs go to BUILD_DIR/long_run.
# Usage: scripts/long_run.sh SECONDS [BUILD_DIR]
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
seconds=${1:?usage: long_run.sh SECONDS [BUILD_DIR]}
build=${2:-$root/build/release}
log=$build/long_run
mkdir -p "$log"
"$build/tests/test_stress" soak "$seconds" 4 >"$log/soak.txt" 2>&1 &
soak=$!
LD_PRELOAD="$build/libhakmem-secure.so" EXPECT_HARDENED=1 \
  "$build/tests/test_stress" soak "$seconds" 4 >"$log/soak_hardened.txt" 2>&1 &
soak_hardened=$!
"$root/tests/fuzz.sh" "$seconds" >"$log/fuzz.txt" 2>&1 &
fuzz=$!
end=$((SECONDS + seconds))
rounds=0 failures=0 injected=0 misuses=0
while [ $SECONDS -lt $end ]; do
  if "$build/tests/test_oom" >"$log/oom.txt" 2>&1; then
    injected=$((injected + $(grep -c "before ENOMEM" "$log/oom.txt")))
  else
    failures=$((failures + 1)); cp "$log/oom.txt" "$log/oom.failed.$rounds.txt"
  fi
  if "$build/tests/test_bad_input" >"$log/bad_input.txt" 2>&1; then
    cases=$(sed -n 's/^test_bad_input: \([0-9]*\) cases.*/\1/p' "$log/bad_input.txt")
    misuses=$((misuses + 2 * cases))
  else
    failures=$((failures + 1)); cp "$log/bad_input.txt" "$log/bad_input.failed.$rounds.txt"
  fi
  rounds=$((rounds + 1))
  sleep 60
done
wait $soak; soak_status=$?
wait $soak_hardened; soak_hardened_status=$?
wait $fuzz; fuzz_status=$?
echo "long run: $seconds s"
echo "soak (exit $soak_status): $(grep '^test_stress soak' "$log/soak.txt")"
echo "soak, hardened (exit $soak_hardened_status): $(grep '^test_stress soak' "$log/soak_hardened.txt")"
echo "fuzz (exit $fuzz_status): $(grep -E 'stat::number_of_executed_units|Done [0-9]+ runs' "$log/fuzz.txt" | tr '\n' ' ')"
echo "fault rounds: $rounds, failed: $failures; tiers driven to ENOMEM: $injected; misuse calls diagnosed: $misuses"
[ $soak_status -eq 0 ] && [ $soak_hardened_status -eq 0 ] && [ $fuzz_status -eq 0 ] && [ $failures -eq 0 ]
