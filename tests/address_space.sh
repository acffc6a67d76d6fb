#!/bin/sh
# The address space hakmem takes (docs/reliability.md, "Address space"):
#  - the library's load segments total under 1 MiB (readelf);
#  - a program that has made one small malloc has a VmSize within 6 MiB
#    of the same program's under the C library's malloc;
#  - under a limit of address space (ulimit -v: the C library's VmSize at
#    start and 192 MiB), a program that allocates blocks of one size, or of
#    mixed sizes, until malloc fails gets at least 90% of the bytes the C
#    library's malloc gives it, every block hakmem's (hak_owns), and the
#    failure is ENOMEM.
# Usage: address_space.sh LIBHAKMEM PROBE
set -u
lib=$1
probe=$2
failed=0

fail()
{
    echo "address_space: FAIL: $*"
    failed=1
}

load=0
for size in $(readelf -lW "$lib" | awk '$1 == "LOAD" { print $6 }'); do
    load=$((load + size))
done
echo "address_space: load segments of $(basename "$lib"): $load bytes"
[ "$load" -gt 0 ] && [ "$load" -lt 1048576 ] || fail "load segments of $load bytes, not under 1 MiB"

glibc_start=$("$probe" start)
hakmem_start=$(LD_PRELOAD=$lib "$probe" start)
echo "address_space: VmSize after a first malloc: $glibc_start KiB with the C library's malloc, $hakmem_start KiB with hakmem"
[ "$hakmem_start" -le $((glibc_start + 6144)) ] || fail "VmSize at start $hakmem_start KiB against $glibc_start KiB"

limit=$((glibc_start + 196608))
echo "address_space: ulimit -v $limit: bytes served until malloc failed"
for spec in 64 1000 4000 20000 48000 100000 200000 300000 1048576 4194304 16777216 mixed; do
    set -- $(ulimit -v $limit && "$probe" fill $spec)
    glibc_bytes=${1:-0}
    set -- $(ulimit -v $limit && LD_PRELOAD=$lib "$probe" fill $spec)
    bytes=${1:-0} blocks=${2:-0} owned=${3:-0} error=${4:-0}
    percent=$((glibc_bytes ? bytes * 100 / glibc_bytes : 0))
    echo "  $spec: C library $glibc_bytes, hakmem $bytes ($percent%) in $blocks blocks, $owned of them hakmem's, errno $error"
    [ "$glibc_bytes" -gt 100000000 ] || fail "$spec: the C library's malloc served only $glibc_bytes bytes"
    [ "$percent" -ge 90 ] || fail "$spec: hakmem served $percent% of the C library's bytes"
    [ "$blocks" -gt 0 ] && [ "$owned" -eq "$blocks" ] || fail "$spec: $owned of $blocks blocks were hakmem's"
    [ "$error" -eq 12 ] || fail "$spec: the failing malloc set errno $error, not ENOMEM"
done
[ $failed -eq 0 ] && echo "address_space: all checks passed"
exit $failed
