#!/usr/bin/env bash
# redis-server's throughput on an allocator: Debian's redis-server on
# 127.0.0.1 serves redis-benchmark (set, get, lpush, lpop, incr, hset,
# REQUESTS requests each, 50 clients, pipelines of 16). The server runs
# on the library in LD_PRELOAD (or HAKMEM_BENCH_PRELOAD, as bench/run.py
# passes it), with every other variable of the environment; this driver
# and redis-benchmark run on the system allocator. Output: "metric value"
# lines, as the benchmark programs print: requests a second for each test
# and their geometric mean, for scripts/ab.sh, e.g. meshing's cost:
#   BIN=bench/redis_throughput.sh LIBS="off=build/release/libhakmem.so \
#     on=build/release/libhakmem.so|HAKMEM_MESH=on" scripts/ab.sh 5 200000 rps_geomean
# Usage: redis_throughput.sh [REQUESTS]
set -euo pipefail
requests=${1:-200000}
preload=${HAKMEM_BENCH_PRELOAD:-${LD_PRELOAD:-}}
unset LD_PRELOAD HAKMEM_BENCH_PRELOAD
command -v redis-server >/dev/null && command -v redis-benchmark >/dev/null ||
    { echo "redis_throughput: redis-server and redis-benchmark are needed (apt-get install redis-server redis-tools)" >&2; exit 2; }

dir=$(mktemp -d)
server=
cleanup() {
    [[ -n $server ]] && kill "$server" 2>/dev/null && wait "$server" 2>/dev/null
    rm -rf "$dir"
}
trap cleanup EXIT
# A random port may be taken (the last run's clients leave theirs in
# TIME_WAIT, in the same range): another one then.
for _ in 1 2 3 4 5; do
    port=$((20000 + RANDOM % 20000))
    LD_PRELOAD=$preload redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no \
        --dir "$dir" --daemonize no >"$dir/log" 2>&1 &
    server=$!
    for _ in $(seq 100); do
        redis-cli -p "$port" ping >/dev/null 2>&1 && break 2
        kill -0 "$server" 2>/dev/null || break
        sleep 0.05
    done
    kill "$server" 2>/dev/null || true
    wait "$server" 2>/dev/null || true
    server=
done
[[ -n $server ]] || { echo "redis_throughput: the server did not start" >&2; cat "$dir/log" >&2; exit 1; }

redis-benchmark -p "$port" -q -n "$requests" -c 50 -P 16 -t set,get,lpush,lpop,incr,hset --csv |
    awk -F, 'NR > 1 { gsub(/"/, ""); name = tolower($1); sub(/:.*/, "", name)
                      print name "_rps", $2; logs += log($2); n++ }
             END { if (n) print "rps_geomean", exp(logs / n) }'
