#!/usr/bin/env bash
# docs/options.md's table is the one src/options.c prints, and bad option
# values or names get a warning, never a crash.
set -u
print_options=$1 doc=$2
failed=0 passed=0
check() { if eval "$2"; then passed=$((passed + 1)); else echo "options: FAILED: $1" >&2; failed=$((failed + 1)); fi; }

# docs/options.md's table is the one the library prints, meanings included.
begin='<!-- options table: printed by the library, `make options-doc` writes it -->'
end='<!-- end of the options table -->'
documented=$(sed -n "\|$begin|,\|$end|p" "$doc" | sed '1d;$d')
printed=$("$print_options" markdown)
check "the library prints a table of options" "[ \$(grep -c '^| \`HAKMEM_' <<<\"\$printed\") -ge 5 ]"
check "docs/options.md's table is the library's (make options-doc rewrites it)" \
  "diff <(echo \"\$documented\") <(echo \"\$printed\") >&2"

warn_of() { # env assignments..., expected warning text
  local expected=${!#} err
  local assignments=("${@:1:$#-1}")
  err=$(env "${assignments[@]}" "$print_options" alloc 2>&1 >/dev/null); local rc=$?
  check "${assignments[*]}: runs (rc $rc)" "[ $rc -eq 0 ]"
  check "${assignments[*]}: warns '$expected'" "grep -qF -- '$expected' <<<\"\$err\""
}
warn_of HAKMEM_ON_ERROR=maybe "hakmem: warning: bad option value: HAKMEM_ON_ERROR=maybe is not one of abort, warn"
warn_of HAKMEM_LARGE_THRESHOLD=300K "HAKMEM_LARGE_THRESHOLD=300K is not a power of two"
warn_of HAKMEM_PURGE_DELAY_MS=soon "HAKMEM_PURGE_DELAY_MS=soon is not a number"
warn_of HAKMEM_STATS=perhaps "HAKMEM_STATS=perhaps is not one of 0, 1, json"
warn_of HAKMEM_PROFILE=perhaps "HAKMEM_PROFILE=perhaps is not a boolean"
warn_of HAKMEM_MODE=learning "HAKMEM_MODE=learning is not one of baseline, evolving"
warn_of HAKMEM_BOGUS_OPTION=1 "unknown option (see docs/options.md): HAKMEM_BOGUS_OPTION"
warn_of HAKMEM_MODE=evolving HAKMEM_PROFILE=0 "hakmem: warning: HAKMEM_MODE=evolving with HAKMEM_PROFILE=0: nothing is timed, the tuner keeps HAKMEM_LARGE_THRESHOLD"
quiet=$(env HAKMEM_LARGE_THRESHOLD=256K HAKMEM_ON_ERROR=WARN HAKMEM_PURGE_DELAY_MS=0 HAKMEM_MODE=evolving "$print_options" alloc 2>&1)
check "well-formed values are accepted silently" "[ -z '$quiet' ]"

echo "options: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
