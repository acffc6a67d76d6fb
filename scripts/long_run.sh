#!/usr/bin/env bash
# The long run that docs/reliability.md reports ("Last long run"): for
# SECONDS, side by side, the soak (4 threads with churn, RSS flat) on the
# default and on the hardened library, the fuzzer, short lives (a real
# program on hakmem run again and again), and the fault tests in a loop,
# one round a minute: out of memory
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

# Short lives: redis-benchmark on hakmem, run after run against a plain
# redis-server. Each run is a new process: start-up, a young program's
# paths, the purger thread's start and exit. Each soak is one process and
# goes through these once. A sample recorded as free was only seen this
# way, in about 1 run in 100 under load (docs/reliability.md, profiling).
short_lives() {
  local port=$((20000 + $$ % 12000)) runs=0 failed=0
  redis-server --port $port --bind 127.0.0.1 --save '' --appendonly no >"$log/redis_server.txt" 2>&1 &
  local server=$!
  for _ in $(seq 1 100); do redis-cli -p $port ping >/dev/null 2>&1 && break; sleep 0.05; done
  while [ $SECONDS -lt $end ]; do
    if ! LD_PRELOAD="$build/libhakmem.so" timeout 300 redis-benchmark -p $port -q -n 20000 -P 16 \
      -t set,get,lpush,lpop,incr,hset >/dev/null 2>"$log/short_life.txt" ||
      grep -q '^hakmem: [a-z]' "$log/short_life.txt"; then
      failed=$((failed + 1)); cp "$log/short_life.txt" "$log/short_life.failed.$runs.txt"
    fi
    runs=$((runs + 1))
  done
  kill $server; wait $server 2>/dev/null
  echo "short lives: $runs redis-benchmark runs on hakmem, $failed failed"
  [ $runs -gt 0 ] && [ $failed -eq 0 ]
}
short_lives >"$log/short_lives.txt" 2>&1 &
short=$!
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
wait $short; short_status=$?
echo "long run: $seconds s"
echo "soak (exit $soak_status): $(grep '^test_stress soak' "$log/soak.txt")"
echo "soak, hardened (exit $soak_hardened_status): $(grep '^test_stress soak' "$log/soak_hardened.txt")"
echo "fuzz (exit $fuzz_status): $(grep -E 'stat::number_of_executed_units|Done [0-9]+ runs' "$log/fuzz.txt" | tr '\n' ' ')"
echo "short lives (exit $short_status): $(tail -1 "$log/short_lives.txt")"
echo "fault rounds: $rounds, failed: $failures; tiers driven to ENOMEM: $injected; misuse calls diagnosed: $misuses"
[ $soak_status -eq 0 ] && [ $soak_hardened_status -eq 0 ] && [ $fuzz_status -eq 0 ] && [ $short_status -eq 0 ] && [ $failures -eq 0 ]
