#!/usr/bin/env bash
# The launcher: `hakmem run` preloads hakmem (the report proves it served
# the program), keeps the program's output and exit status; `hakmem report`
# prints the report, as text or JSON.
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
"$hakmem" bogus true 2>/dev/null
check "an unknown command is refused" "[ $? -eq 2 ]"
check "--version names the library" "\"$hakmem\" --version | grep -q 'libhakmem.so'"
echo "launcher: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
