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

# util-linux's unshare: the kernel refuses a new user namespace to a
# process of two threads, and hakmem's purger thread must not make one.
if unshare -U -r true 2>/dev/null; then
  run unshare unshare -U -r sh -c 'id -u; sort -n lines.txt | md5sum'
else
  echo "skip unshare: this system refuses user namespaces"
fi

# A daemon's habit: close every descriptor above stderr, then open files.
# One gets the number of hakmem's copy of stderr (100), and the exit report
# must not go into it, but to stderr, which still names the same file.
cat >fds.py <<'PY'
import os
os.closerange(3, 4096)
print(len([os.open("out%d" % i, os.O_WRONLY | os.O_CREAT | os.O_TRUNC) for i in range(200)]))
PY
run closed_fds /usr/bin/python3 fds.py
if grep -q hakmem out*; then
  echo "FAIL closed_fds: the report went into $(grep -l hakmem out* | head -1)"; failed=$((failed + 1))
fi

# Under a limit of 64 descriptors, where hakmem's copy of stderr cannot
# take a number from 100 up (prlimit execs sort, whose report counts).
run low_fd_limit prlimit --nofile=64 sort -n lines.txt

# python3's own test modules (timings cut from the summary line); none that
# checks a child's stderr, where HAKMEM_STATS puts the child's report.
run python3_stdlib_tests sh -c '/usr/bin/python3 -m unittest test.test_re test.test_collections test.test_heapq \
  test.test_bisect test.test_dict test.test_set test.test_list test.test_deque test.test_ordered_dict 2>&1 |
  grep -E "^(OK|FAILED|Ran)" | sed "s/ in .*s$//"'

if command -v sqlite3 >/dev/null; then
  cat >rows.sql <<'SQL'
CREATE TABLE t(id INTEGER PRIMARY KEY, k INTEGER, name TEXT, v REAL);
WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 1000000)
INSERT INTO t SELECT i, (i * 7919) % 1000, 'name' || (i % 5003), i * 0.5 FROM n;
CREATE INDEX t_k ON t(k);
SELECT count(*), sum(k), round(sum(v), 1) FROM t;
SELECT k, count(*), min(name), max(id) FROM t WHERE k < 5 GROUP BY k;
SELECT name, count(*) FROM t GROUP BY name ORDER BY count(*) DESC, name LIMIT 3;
DELETE FROM t WHERE id % 3 = 0;
SELECT count(*), total(v) FROM t;
SQL
  run sqlite3 sh -c 'sqlite3 :memory: <rows.sql'
else
  echo "FAIL sqlite3: not installed (scripts/install-deps.sh test)"; failed=$((failed + 1))
fi

cat >prog.c <<'C'
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
struct node { struct node *next; char name[24]; };
static int cmp(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }
int main(void) {
    struct node *list = NULL; char *names[5000];
    for (int i = 0; i < 5000; i++) {
        struct node *n = malloc(sizeof *n); snprintf(n->name, sizeof n->name, "n%d", (i * 7919) % 5000);
        n->next = list; list = n; names[i] = n->name;
    }
    qsort(names, 5000, sizeof names[0], cmp);
    printf("%s %s %s\n", names[0], names[2500], names[4999]);
    while (list) { struct node *n = list->next; free(list); list = n; }
    return 0;
}
C
run gcc sh -c 'gcc -O2 -Wall -o prog prog.c && ./prog && gcc -O0 -g -c prog.c -o prog.o && echo compiled'

cat >script.pl <<'PL'
my %h; my @a;
for my $i (1 .. 200000) { $h{"k" . ($i % 7001)} .= chr(97 + $i % 26); push @a, sprintf("%07d", ($i * 7919) % 1000003); }
my @s = sort @a; my $n = grep { /^00[0-4]/ } @s;
my $joined = join ",", map { length $h{$_} } sort keys %h;
print scalar(keys %h), " $n $s[0] $s[-1] ", length($joined), "\n";
(my $t = "abc" x 100000) =~ s/b/BB/g; print length($t), "\n";
PL
run perl perl script.pl

# redis: a server on hakmem serves redis-benchmark (timings are not compared)
# and a scripted session whose replies are.
if command -v redis-server >/dev/null && command -v redis-benchmark >/dev/null; then
  cat >redis.sh <<'SH'
# Below Linux's ephemeral range (32768..60999), where a client socket of a
# test running beside this one once held the port: the server could not
# bind, and redis-benchmark spun forever against nothing.
port=$((20000 + $$ % 12000))
redis-server --port $port --bind 127.0.0.1 --save '' --appendonly no >server.log 2>&1 &
server=$!
for i in $(seq 1 100); do redis-cli -p $port ping >/dev/null 2>&1 && break; sleep 0.05; done
if ! kill -0 $server 2>/dev/null; then echo "redis-server did not start"; cat server.log >&2; exit 1; fi
timeout 300 redis-benchmark -p $port -q -n 20000 -P 16 -t set,get,lpush,lpop,incr,hset >/dev/null || echo "benchmark failed"
for i in $(seq 1 3000); do echo "SET key:$i $(printf 'v%0*d' $((i % 300)) $i)"; echo "RPUSH list $i"; done | redis-cli -p $port >/dev/null
redis-cli -p $port DBSIZE; redis-cli -p $port LLEN list; redis-cli -p $port GET key:2999 | md5sum
redis-cli -p $port STRLEN key:299; redis-cli -p $port INFO keyspace | grep -c db0
redis-cli -p $port SHUTDOWN NOSAVE >/dev/null 2>&1; wait $server
cat server.log >&2
SH
  run redis bash redis.sh
else
  echo "FAIL redis: redis-server or redis-benchmark missing (scripts/install-deps.sh test)"; failed=$((failed + 1))
fi

echo "real_programs: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
