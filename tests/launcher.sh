#!/usr/bin/env bash
# The launcher: `hakmem run` preloads hakmem (the report proves it served
# the program), keeps the program's output and exit status; `hakmem report`
# prints the report of every process of the command, labelled, as text or
# JSON, on stderr or into a file, or their heap profiles as a flame graph,
# folded stacks or pprof files; HAKMEM_PROFILE_FILE names a file per
# process.
# Usage: launcher.sh PATH_TO_HAKMEM_LAUNCHER
set -u
hakmem=$1
failed=0 passed=0
check() { if eval "$2"; then passed=$((passed + 1)); else echo "launcher: FAILED: $1" >&2; failed=$((failed + 1)); fi; }
py=/usr/bin/python3
[ -x "$py" ] || py=python3

out=$("$hakmem" run -- echo hello 2>&1)
check "run keeps the output" "[ \"\$out\" = hello ]"
"$hakmem" run -- sh -c 'exit 3'
check "run keeps the exit status" "[ $? -eq 3 ]"
served=$(HAKMEM_STATS=1 "$hakmem" run -- "$py" -c 'print(sum(len(str(i)) for i in range(100000)))' 2>&1)
check "run: the program is served by hakmem" "grep -q '^hakmem .* report' <<<\"\$served\" && grep -q '^488890' <<<\"\$served\""
report=$("$hakmem" report -- "$py" -c 'x = [bytearray(3000000) for i in range(5)]' 2>&1 >/dev/null)
check "report prints the text report" "grep -q '^hakmem .* report' <<<\"\$report\" && grep -q 'top call sites by bytes' <<<\"\$report\""
json=$("$hakmem" report --json -- "$py" -c 'x = [bytearray(3000000) for i in range(5)]' 2>&1 >/dev/null)
check "report --json prints one JSON object with sites" \
  "$py -c 'import json,sys; d = json.loads(sys.argv[1]); assert d[\"sites\"] and d[\"kpi\"][\"rss_bytes\"] > 0' \"\$json\""
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
# Every process of the command reports, labelled, into the file -o names;
# the program's own stderr stays out of it.
"$hakmem" report -o "$dir/text" -- "$py" -c 'import subprocess, sys; print("noise", file=sys.stderr); subprocess.run(["/bin/true"]); x = [bytearray(3000000) for i in range(5)]' 2>"$dir/stderr"
check "report -o: both processes listed" "grep -q '^hakmem: 2 processes reported:' '$dir/text' && grep -q '^  pid [0-9]*, python3 (parent' '$dir/text' && grep -q '^  pid [0-9]*, true (parent' '$dir/text'"
check "report -o: each report names its process" "[ \$(grep -c '^  process       pid [0-9]*, ' '$dir/text') -eq 2 ]"
check "report -o: the program's stderr is its own" "[ \"\$(cat '$dir/stderr')\" = noise ] && ! grep -q noise '$dir/text'"
"$hakmem" report --json -o "$dir/json" -- "$py" -c 'import subprocess, sys; print("{noise", file=sys.stderr); subprocess.run(["/bin/true"]); x = [bytearray(3000000) for i in range(5)]' 2>/dev/null
check "report --json -o: one valid object, the children inside it" \
  "$py -c 'import json,sys; d = json.load(open(sys.argv[1])); assert d[\"program\"] == \"python3\" and d[\"sites\"] and [c[\"program\"] for c in d[\"children\"]] == [\"true\"] and d[\"children\"][0][\"ppid\"] == d[\"pid\"]' '$dir/json'"
lib=$(dirname "$hakmem")/libhakmem.so
HAKMEM_PROFILE_FILE="$dir/r.%e.%p" LD_PRELOAD="$lib" "$py" -c 'import os; print(os.getpid())' >"$dir/pid"
check "HAKMEM_PROFILE_FILE: %e and %p name the file, the report names the process" \
  "grep -q \"^  process       pid \$(cat '$dir/pid'), python3 \" '$dir/r.python3.'\$(cat '$dir/pid')"
err=$(HAKMEM_PROFILE_FILE="$dir/no/such/dir/%p" LD_PRELOAD="$lib" "$py" -c 'pass' 2>&1)
check "HAKMEM_PROFILE_FILE in a missing directory: a warning naming it" "grep -q 'hakmem: warning: cannot write the report to HAKMEM_PROFILE_FILE' <<<\"\$err\""
# The heap profile: a flame graph, folded stacks, a pprof file per process.
alloc3='x = [bytearray(3000000) for i in range(5)]'
HAKMEM_PROFILE_SAMPLE=1 "$hakmem" report --flamegraph "$dir/heap.svg" -- "$py" -c "import subprocess; subprocess.run(['bash', '-c', 'x=\$(printf %0200000d 0)']); $alloc3"
check "report --flamegraph: an SVG with a tower per program" \
  "head -n 2 '$dir/heap.svg' | grep -q '^<svg ' && grep -q '<title>python3 (' '$dir/heap.svg' && grep -q '<title>bash (' '$dir/heap.svg' && tail -n 1 '$dir/heap.svg' | grep -q '^</svg>'"
HAKMEM_PROFILE_SAMPLE=1 "$hakmem" report --folded "$dir/folded" -- "$py" -c "$alloc3"
check "report --folded: the program's stacks, its 15 MB among them" \
  "grep -q '^python3;_start;' '$dir/folded' && awk '{ s += \$NF } END { exit !(s >= 15000000) }' '$dir/folded'"
"$hakmem" report --pprof "$dir/pprof" -- "$py" -c "$alloc3"
check "report --pprof: a heap profile per process" "head -n 1 '$dir'/pprof/python3.*.heap | grep -q '^heap profile: .* @ heapprofile'"
if command -v google-pprof >/dev/null; then
  check "google-pprof reads it" "google-pprof --text --alloc_space \"\$(command -v $py)\" '$dir'/pprof/python3.*.heap 2>/dev/null | grep -q '^Total: '"
fi
"$hakmem" report -o "$dir/status" -- sh -c 'exit 5'
check "report keeps the exit status" "[ $? -eq 5 ]"
"$hakmem" bogus true 2>/dev/null
check "an unknown command is refused" "[ $? -eq 2 ]"
check "--version names the library" "\"$hakmem\" --version | grep -q 'libhakmem.so'"
echo "launcher: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
