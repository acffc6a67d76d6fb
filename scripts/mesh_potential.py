#!/usr/bin/env python3
"""What meshing could give back on bench/frag.c's store, by simulation.

The store's blocks (an entry of 32 B, a key string, a value of 100..1000 B
a key) are laid out as hakmem lays out its tiny classes: classes 16 B
apart, 64 KiB slabs carved from their start in allocation order (or, with
--shuffle, at random offsets in their slab, as a randomised carve would).
A random 70% of the keys die. Then the kernel pages (4 KiB) of each class
that hold a live byte are meshed: pages at the same offset in two slabs of
the class, whose live blocks overlap in no byte, can share one physical
page, since their blocks lie at the same places; each page joins the first
physical page it fits (first fit, any number of pages a physical one).
Prints the live bytes and the resident pages before and after, as ratios,
and what the refill of frag.c (values of 1..4 KiB up to the same live
bytes, in pages of their own) would leave if it took no hole.
Usage: mesh_potential.py [KEYS] [--shuffle]
"""
import random
import sys

SLAB, PAGE = 65536, 4096


def class_size(n):
    return (n + 15) // 16 * 16


def simulate(keys, shuffle, rng):
    blocks = {}  # class size -> keys, in allocation order
    values = []
    for k in range(keys):
        value = 100 + rng.randrange(901)
        name = len(f"key:{k}") + 1
        for size in (32, name, value):
            blocks.setdefault(class_size(size), []).append(k)
        values.append(32 + name + value)
    alive = [rng.random() >= 0.7 for _ in range(keys)]
    live = sum(v for v, a in zip(values, alive) if a)
    filled = sum(values)
    before = after = 0
    for size, owners in blocks.items():
        per_slab = SLAB // size
        order = list(range(per_slab))
        slots = []
        for i in range(len(owners)):
            if i % per_slab == 0 and shuffle:
                rng.shuffle(order)
            slots.append((i // per_slab, order[i % per_slab]))
        pages = {}  # (slab, page in slab) -> live block indices touching it
        for (slab, index), owner in zip(slots, owners):
            if alive[owner]:
                first, last = index * size, index * size + size - 1
                for page in range(first // PAGE, last // PAGE + 1):
                    pages.setdefault((slab, page), set()).add(index)
        at_offset = {}
        for (slab, page), live_blocks in pages.items():
            at_offset.setdefault(page, []).append(live_blocks)
        for page, sets in at_offset.items():
            before += len(sets)
            physical = []
            for live_blocks in sets:
                for p in physical:
                    if not p & live_blocks:
                        p |= live_blocks
                        break
                else:
                    physical.append(set(live_blocks))
            after += len(physical)
    return filled, live, before * PAGE, after * PAGE


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    keys = int(args[0]) if args else 200_000
    shuffle = "--shuffle" in sys.argv
    filled, live, before, after = simulate(keys, shuffle, random.Random(1))
    mib = 1 << 20
    refill = filled - live  # the refill's live bytes, in pages of their own
    print(f"{keys} keys, blocks {'at random offsets' if shuffle else 'in allocation order'}")
    print(f"after the deletion: live {live / mib:.1f} MiB, pages with a live byte {before / mib:.1f} MiB "
          f"({before / live:.2f} of live), meshed {after / mib:.1f} MiB ({after / live:.2f})")
    print(f"after the refill: live {filled / mib:.1f} MiB, with the meshed pages "
          f"{(after + refill) / mib:.1f} MiB ({(after + refill) / filled:.2f}), "
          f"without meshing {(before + refill) / mib:.1f} MiB ({(before + refill) / filled:.2f})")


if __name__ == "__main__":
    main()
