#!/bin/sh
# The heap-misuse probe suite (docs/reliability.md, "Heap misuse"): each
# probe of misuse_probe runs once on the C library's malloc and once with
# LIB preloaded, each in a fresh process. A probe is caught when the
# program does not get through (an abort after a message, a fault on a
# guard page or a closed page). Prints the table by kind and tier, the
# counts, and fails where LIB misses a probe it must catch:
#  hardened: every probe the C library catches, and every one below
#            (the hardened library's canaries, guard pages and closed
#            pages: docs/reliability.md);
#  default:  every bad free (double, interior, foreign, a freed block's
#            realloc).
# Usage: misuse.sh LIB PROBE hardened|default
set -u
lib=$(readlink -f "$1")
probe=$2
mode=$3
failed=0
name=$(basename "$lib")

fail()
{
    echo "misuse: FAIL: $*"
    failed=1
}

bad_free="double_free double_free_later free_interior free_stack free_static realloc_after_free"
# tier:kind, a tier of * for every tier
hardened_must="*:overflow_store_1 *:overflow_copy_1 *:overflow_copy_32 *:overflow_copy_1M *:underflow_store_1 *:underflow_copy_1
 *:underflow_copy_32 mid:write_after_free
 mid:zero_after_free page:write_after_free page:zero_after_free large:write_after_free large:zero_after_free
 large:read_after_free small:overflow_store_1M mid:overflow_store_1M page:overflow_store_1M"

must_catch()
{
    tier=$1 kind=$2
    for k in $bad_free; do
        [ "$kind" = "$k" ] && return 0
    done
    [ "$mode" = hardened ] || return 1
    for rule in $hardened_must; do
        case "$rule" in "*:$kind" | "$tier:$kind") return 0 ;; esac
    done
    return 1
}

owned=$(LD_PRELOAD=$lib "$probe" served)
[ "$owned" = 4 ] || fail "$name served $owned of 4 tiers' blocks"

# One run of a probe: 1 when it was caught, else 0 (also when it hangs:
# jemalloc spins for ever on a large block's double free).
caught()
{
    if [ -n "$1" ]; then
        LD_PRELOAD=$1 timeout 30 "$probe" "$2" "$3" >/dev/null 2>&1
    else
        timeout 30 "$probe" "$2" "$3" >/dev/null 2>&1
    fi
    status=$?
    [ $status -ne 0 ] && [ $status -ne 124 ] && echo 1 || echo 0
}

results=$("$probe" list | while read -r tier kind; do
    echo "$tier $kind $(caught "" "$tier" "$kind") $(caught "$lib" "$tier" "$kind")"
done)

echo "misuse: caught by the C library's malloc / by $name (x caught, . missed)"
printf 'misuse: %-20s %-8s %-8s %-8s %-8s\n' kind small mid page large
for kind in $("$probe" list | awk '{ print $2 }' | awk '!seen[$0]++'); do
    row=$(printf '%-20s' "$kind")
    for tier in small mid page large; do
        cell=$(echo "$results" | awk -v t="$tier" -v k="$kind" '$1 == t && $2 == k { print ($3 ? "x" : ".") "/" ($4 ? "x" : ".") }')
        row="$row $(printf '%-8s' "${cell:--}")"
    done
    echo "misuse: $row"
done
total=$(echo "$results" | wc -l)
c_count=$(echo "$results" | awk '$3 { n++ } END { print n + 0 }')
h_count=$(echo "$results" | awk '$4 { n++ } END { print n + 0 }')
echo "misuse: caught: the C library's malloc $c_count of $total, $name $h_count of $total"

echo "$results" | while read -r tier kind c h; do
    [ "$h" = 1 ] && continue
    if [ "$mode" = hardened ] && [ "$c" = 1 ]; then
        echo "misuse: FAIL: $tier $kind: caught by the C library's malloc, not by $name"
    elif must_catch "$tier" "$kind"; then
        echo "misuse: FAIL: $tier $kind: not caught by $name"
    fi
done | grep FAIL && failed=1
[ $failed -eq 0 ] && echo "misuse: all checks passed"
exit $failed
