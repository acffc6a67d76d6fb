#!/usr/bin/env bash
# Real programs under LD_PRELOAD=libhakmem.so give the same output as a
# plain run, and hakmem's exit report (HAKMEM_STATS=1) proves it served
# their memory. Usage: real_programs.sh LIBHAKMEM CXX_CHURN
set -u
lib=$(realpath "$1") cxx_churn=$(realpath "$2")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work" || exit 1
failed=0 passed=0

# run NAME COMMAND...: compare stdout plain vs preloaded; check the report.
run() {
  local name=$1; shift
  "$@" >"$name.plain" 2>"$name.plain.err"; local plain_rc=$?
  LD_PRELOAD=$lib HAKMEM_STATS=1 "$@" >"$name.hakmem" 2>"$name.hakmem.err"; local rc=$?
  local why=""
  [ "$rc" -eq "$plain_rc" ] || why="exit status $rc, plain $plain_rc"
  cmp -s "$name.plain" "$name.hakmem" || why="$why; stdout differs"
  [ -s "$name.plain" ] || why="$why; no output"
  grep -q '^hakmem .* report$' "$name.hakmem.err" || why="$why; no hakmem report"
  local refills
  refills=$(awk '/slab refills/ {s += $3} END {print s + 0}' "$name.hakmem.err")
  [ "$refills" -gt 0 ] || why="$why; hakmem served no slab"
  if grep -q '^hakmem: [a-z]' "$name.hakmem.err"; then why="$why; hakmem complained: $(grep -m1 '^hakmem: [a-z]' "$name.hakmem.err")"; fi
  if [ -z "$why" ]; then
    passed=$((passed + 1)); echo "ok   $name"
  else
    failed=$((failed + 1)); echo "FAIL $name: ${why#; }"
    diff "$name.plain" "$name.hakmem" | head -5
  fi
}

cat >workload.py <<'PY'
import hashlib, json, random
random.seed(7)
d = {f"key{i}": [random.random() for _ in range(i % 17)] for i in range(60000)}
lst = [str(i) * (i % 13) for i in range(150000)]
s = "".join(lst[::7])
big = {"users": [{"id": i, "name": f"user{i}", "tags": ["t%d" % (i % 50)] * (i % 5),
                  "nested": {"a": list(range(i % 30)), "b": {"c": str(i)}}} for i in range(40000)]}
text = json.dumps(big, sort_keys=True)
back = json.loads(text)
sets = [set(range(i, i + 50)) for i in range(0, 20000, 3)]
print(len(d), sum(len(v) for v in d.values()), len(lst), len(s))
print(hashlib.sha256(text.encode()).hexdigest(), back == big, sum(len(x) for x in sets))
PY
run python3 /usr/bin/python3 workload.py

cat >git.sh <<'SH'
set -e
export GIT_AUTHOR_NAME=t GIT_AUTHOR_EMAIL=t@example.com GIT_COMMITTER_NAME=t GIT_COMMITTER_EMAIL=t@example.com
export GIT_AUTHOR_DATE='2026-01-01T00:00:00Z' GIT_COMMITTER_DATE='2026-01-01T00:00:00Z' HOME=$PWD
rm -rf repo && git init -q -b main repo && cd repo
for i in $(seq 1 300); do printf 'file %s\n%s\n' "$i" "$(seq 1 $((i % 40)))" >"f$i.txt"; done
git add . && git commit -q -m first
for i in $(seq 1 5); do echo "change $i" >>f$i.txt; git commit -q -am "change $i"; done
git log --format='%H %s'
git gc -q
git count-objects -v | grep -E '^(count|in-pack|packs)'
git fsck --no-progress && git rev-parse HEAD
SH
run git bash git.sh

awk 'BEGIN { srand(11); for (i = 0; i < 300000; i++) printf "%d %s\n", int(rand() * 1e9), substr("abcdefghijklmnopqrstuvwxyz", 1 + i % 26) }' >lines.txt
run sort sh -c 'sort lines.txt | md5sum; sort -n -r lines.txt | md5sum; sort -k2 -s lines.txt | md5sum'

cat >script.sh <<'SH'
declare -A seen
total=0
for i in $(seq 1 20000); do
  key="k$((i % 997))"
  seen[$key]=$(( ${seen[$key]:-0} + i ))
  s="${s:-}x"; [ ${#s} -gt 500 ] && s=""
  total=$((total + ${#key}))
done
echo "$total ${#seen[@]} ${seen[k5]}"
echo "$(for i in $(seq 1 50); do echo -n "$(printf '%03d' $i)"; done)" | md5sum
SH
run bash bash script.sh

run cxx "$cxx_churn"

echo "real_programs: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
