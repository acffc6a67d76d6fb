#!/usr/bin/env python3
"""No locked instruction on the common malloc/free pairs: a locked
instruction (or a fence) right after a loop
that wrote the block waits for those stores to drain, and the allocator's
work then runs after the drain instead of during it (battle vm: taking
out the 20 of its pair saved 3% at f0ae10d; two that came back with a
young program's accounting cost a Xeon 4% at 6cce8c7).

Runs lock_pairs under callgrind with the per-instruction counts, twice for
each size (LOW and HIGH pairs), and fails if an instruction of the library
with a lock prefix, an xchg with memory or a fence ran at least once in two
pairs more in the longer run, or if a pair called a lock function of the C
library (pthread_mutex_lock and the like). The program is young (a purge
delay of a minute), as a benchmark's is: that path carries the accounting
an older program skips.

Usage: locked_instructions.py LIBHAKMEM LOCK_PAIRS"""
import os
import re
import subprocess
import sys
import tempfile

SIZES = [16, 4096, 65536, 262144, 2 << 20]  # tiny, mid slab, arena front, arena class bin, large
LOW, HIGH = 100, 500
LIBC_LOCKS = re.compile(r"pthread_(mutex|spin|rwlock|cond)_|__lll_lock|sem_(wait|post)|__libc_lock")


def locked_instructions(lib):
    """{offset: (function, instruction)} of the library's locked instructions."""
    out = subprocess.run(["objdump", "-d", "--no-show-raw-insn", lib], capture_output=True, text=True, check=True).stdout
    found, function = {}, "?"
    for line in out.splitlines():
        m = re.match(r"([0-9a-f]+) <(.+)>:$", line)
        if m:
            function = m.group(2)
            continue
        m = re.match(r"\s*([0-9a-f]+):\s+(.*)", line)
        if not m:
            continue
        text = m.group(2).strip()
        if text.startswith("lock ") or (text.startswith("xchg") and "(" in text) or text.startswith(("mfence", "sfence")):
            found[int(m.group(1), 16)] = (function, text)
    return found


def profile(lib, prog, size, pairs):
    """({offset in the library: count}, {libc lock function: Ir}) of a run."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "callgrind.out")
        # The common path only: a profiling sample takes locks (the stack
        # table's, the records'), one interval of HAKMEM_PROFILE_SAMPLE
        # bytes in, which a run of 2 MiB blocks meets at every other pair.
        env = dict(os.environ, LD_PRELOAD=lib, HAKMEM_PURGE_DELAY_MS="60000", HAKMEM_PROFILE_SAMPLE="1T")
        run = subprocess.run(["valgrind", "--tool=callgrind", "--dump-instr=yes", f"--callgrind-out-file={out}",
                              prog, str(size), str(pairs)], env=env, capture_output=True, text=True)
        m = re.search(r"malloc from (\S+) at (0x[0-9a-f]+)", run.stdout)
        if run.returncode != 0 or not m:
            sys.exit(f"locked_instructions: {prog} {size} {pairs} failed:\n{run.stdout}{run.stderr}")
        if os.path.realpath(m.group(1)) != lib:
            sys.exit(f"locked_instructions: malloc came from {m.group(1)}, not {lib}")
        base, end = int(m.group(2), 16), int(m.group(2), 16) + os.path.getsize(lib)
        # callgrind cannot name the library (its 64 KiB-aligned .bss puts
        # valgrind's reader off), so its instructions go by address
        names = {"ob": {}, "fn": {}}
        obj = fn = ""
        counts, libc, address, skip = {}, {}, 0, False
        cost = re.compile(r"^(0x[0-9a-f]+|[+-]\d+|\*)\s+\S+\s+(\d+)$")
        for line in open(out):
            line = line.rstrip("\n")
            m = re.match(r"^(c?)(ob|fn)=\((\d+)\)(?: (.*))?$", line)
            if m:  # names are defined once, where an id first appears (called ones too)
                called, kind, ident, name = m.groups()
                if name is not None:
                    names[kind][ident] = name
                if not called and kind == "ob":
                    obj = names["ob"].get(ident, "")
                elif not called:
                    fn = names["fn"].get(ident, "")
                continue
            if line.startswith("calls="):
                skip = True  # the next line is the call's inclusive cost
                continue
            m = cost.match(line)
            if not m:
                continue
            pos = m.group(1)
            address = int(pos, 16) if pos.startswith("0x") else address + int(pos) if pos != "*" else address
            if skip:
                skip = False
                continue
            n = int(m.group(2))
            if base <= address < end:
                counts[address - base] = counts.get(address - base, 0) + n
            elif "libc.so" in obj and LIBC_LOCKS.search(fn):
                libc[fn] = libc.get(fn, 0) + n
        return counts, libc


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    lib, prog = os.path.realpath(sys.argv[1]), sys.argv[2]
    locked = locked_instructions(lib)
    failed = False
    for size in SIZES:
        (lo, lo_libc), (hi, hi_libc) = (profile(lib, prog, size, n) for n in (LOW, HIGH))
        rates = [((count - lo.get(offset, 0)) / (HIGH - LOW), f"runs of {locked[offset][0]}: {locked[offset][1]}")
                 for offset, count in hi.items() if offset in locked]
        rates += [((ir - lo_libc.get(fn, 0)) / (HIGH - LOW), f"instructions of libc's {fn}")
                  for fn, ir in hi_libc.items()]
        bad = [(rate, what) for rate, what in rates if rate >= 0.5]
        for rate, what in bad:
            print(f"size {size}: {rate:.2f} a pair: {what}")
        ran = sum(1 for offset in hi if offset in locked)
        print(f"size {size}: {len(bad)} locked instructions or lock calls a pair "
              f"({ran} of the library's locked instructions ran at all, {len(hi)} instructions)")
        failed |= bool(bad)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
