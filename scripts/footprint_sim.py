#!/usr/bin/env python3
"""Footprint of bench/rsstime's workload under simple placement policies.

The producer/consumer of bench/rsstime (blocks of 1 KiB..1 MiB, the same
xorshift sizes, the last 256 kept plus 8 in flight), replayed on one thread
against an address space where blocks are placed best fit, free neighbours
coalesce, and new space is taken at the top (one arena) or in 2 MiB regions
(each starting with a header, free space never coalescing across their
boundaries, as SuperSlabs are), sizes optionally rounded to hakmem's
classes (8 per doubling above 1 KiB).
Resident = pages ever written (the benchmark writes one byte per page of
each block), less free pages purged once they stayed free for PURGE
allocations; each write to a page not resident is a page fault, the cost
a purge setting pays for its footprint. It says what a placement could
reach before one is built (docs/design-notes.md, the mid tier).

Usage: scripts/footprint_sim.py [OPERATIONS] [PURGE...]
"""
import bisect
import heapq
import sys

LIVE, IN_FLIGHT, SAMPLES = 256, 8, 40
PAGE = 4096


def sizes(n, seed=0x1234567):
    """bench/common.h's rng_next, as bench/rsstime.c draws its sizes."""
    mask, x = (1 << 64) - 1, seed

    def draw():
        nonlocal x
        x ^= (x << 13) & mask
        x ^= x >> 7
        x ^= (x << 17) & mask
        return x

    for _ in range(n):
        size = 1024 << (draw() % 10)
        yield size + draw() % size


def class_size(size):
    """hakmem's size class above 1 KiB: 8 steps per doubling."""
    if size <= 1024:
        return size
    b = (size - 1).bit_length() - 1
    return (1 << b) + (((size - 1 - (1 << b)) >> (b - 3)) + 1) * (1 << (b - 3))


class BestFit:
    """Free extents by (length, start), coalesced through their ends, never
    across a region boundary."""

    def __init__(self, granule, region=None, header=0, classes=False):
        self.granule, self.region, self.header, self.classes = granule, region, header, classes
        self.by_length, self.starts, self.by_start, self.by_end, self.top = [], [], {}, {}, 0

    def _joins(self, address):
        return not self.region or address % self.region != 0

    def _unlink(self, start, length):
        i = bisect.bisect_left(self.by_length, (length, start))
        del self.by_length[i]
        del self.starts[bisect.bisect_left(self.starts, start)]
        del self.by_start[start], self.by_end[start + length]

    def release(self, start, length):
        if start in self.by_end and self._joins(start):
            before = self.by_end[start]
            self._unlink(before, start - before)
            start, length = before, length + start - before
        if start + length in self.by_start and self._joins(start + length):
            after = self.by_start[start + length]
            self._unlink(start + length, after)
            length += after
        bisect.insort(self.by_length, (length, start))
        bisect.insort(self.starts, start)
        self.by_start[start], self.by_end[start + length] = length, start

    def take(self, size):
        size = class_size(size) if self.classes else size
        length = -(-size // self.granule) * self.granule
        i = bisect.bisect_left(self.by_length, (length, -1))
        if i < len(self.by_length):
            free_length, start = self.by_length[i]
            self._unlink(start, free_length)
        elif self.region:
            start, free_length = self.top + self.header, self.region - self.header
            self.top += self.region
        else:
            start, free_length = self.top, length
            self.top += length
        if free_length > length:
            self.release(start + length, free_length - length)
        return start, length

    def is_free(self, address):
        i = bisect.bisect_right(self.starts, address) - 1
        return i >= 0 and address < self.starts[i] + self.by_start[self.starts[i]]


def run(policy, operations, purge=None):
    """RSS at each sample (MiB) and the page faults of the whole run."""
    written, live, freed, rss, faults = set(), {}, [], [], 0
    taken = {}  # page -> the last allocation that covered it
    for i, size in enumerate(sizes(operations)):
        start, length = policy.take(size)
        for page in range(start // PAGE, -(-(start + length) // PAGE)):
            taken[page] = i
        pages = {(start + j) // PAGE for j in range(0, size, PAGE)} | {(start + size - 1) // PAGE}
        faults += len(pages - written)
        written |= pages
        live[i] = (start, length)
        if i >= LIVE + IN_FLIGHT:
            start, length = live.pop(i - LIVE - IN_FLIGHT)
            policy.release(start, length)
            if purge is not None:
                heapq.heappush(freed, (i, start, length))
        while purge is not None and freed and freed[0][0] <= i - purge:
            freed_at, start, length = heapq.heappop(freed)
            for page in range(-(-start // PAGE), (start + length) // PAGE):
                if page in written and taken[page] < freed_at and policy.is_free(page * PAGE):
                    written.discard(page)  # free since freed_at: no block took it again
        if (i + 1) % (operations // SAMPLES) == 0:
            rss.append(len(written) * PAGE / 2**20)
    return rss, faults


def main():
    operations = int(sys.argv[1]) if len(sys.argv) > 1 else 300000
    purges = [int(a) for a in sys.argv[2:]] or [None]
    policies = {
        "16 B granules, one arena (glibc-like)": lambda: BestFit(16),
        "4 KiB pages, one arena": lambda: BestFit(PAGE),
        "4 KiB pages, 2 MiB regions, 4 KiB header": lambda: BestFit(PAGE, 2 << 20, PAGE),
        "4 KiB pages, 2 MiB regions, 4 KiB header, hakmem's classes":
            lambda: BestFit(PAGE, 2 << 20, PAGE, True),
        "64 KiB pages, 2 MiB regions, 64 KiB header, hakmem's classes (hakmem's page)":
            lambda: BestFit(64 << 10, 2 << 20, 64 << 10, True),
    }
    for purge in purges:
        for name, make in policies.items():
            rss, faults = run(make(), operations, purge)
            after = "never" if purge is None else f"after {purge} allocations"
            print(f"{name}, purged {after}: warm {rss[SAMPLES // 4 - 1]:.1f} MiB, "
                  f"end {rss[-1]:.1f}, peak {max(rss):.1f}, "
                  f"{faults / operations:.2f} faults per block", flush=True)


if __name__ == "__main__":
    main()
