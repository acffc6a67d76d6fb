/* What the machine charges for pages, which every figure with page faults
 * carries: ns per 4 KiB page to fault a page in by touching it, to fault
 * it in with MADV_POPULATE_WRITE (HAKMEM_PREWARM's call; Linux 5.14+), and
 * to give it back with MADV_DONTNEED, over a 64 MiB mapping, median of 5
 * rounds. Not an allocator benchmark: it runs without one, to read
 * fault-heavy figures by (measured at 373bbb5).
 * Usage: pagecost */
#include "common.h"

#include <stdbool.h>
#include <sys/mman.h>

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

enum { ROUNDS = 5 };

int main(void)
{
    const size_t size = (size_t)64 << 20, pages = size / 4096;
    char *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return perror("pagecost: mmap"), 1;
    double touch[ROUNDS], populate[ROUNDS], dontneed[ROUNDS];
    for (int r = 0; r < ROUNDS; r++) {
        double t0 = now_ns();
        for (size_t i = 0; i < size; i += 4096)
            p[i] = 1;
        double t1 = now_ns();
        madvise(p, size, MADV_DONTNEED);
        double t2 = now_ns();
        bool populated = madvise(p, size, MADV_POPULATE_WRITE) == 0; /* Linux 5.14+ */
        double t3 = now_ns();
        madvise(p, size, MADV_DONTNEED);
        touch[r] = (t1 - t0) / (double)pages;
        dontneed[r] = (t2 - t1) / (double)pages;
        populate[r] = populated ? (t3 - t2) / (double)pages : -1;
    }
    qsort(touch, ROUNDS, sizeof *touch, cmp_double);
    qsort(populate, ROUNDS, sizeof *populate, cmp_double);
    qsort(dontneed, ROUNDS, sizeof *dontneed, cmp_double);
    report("touch_ns_per_page", touch[ROUNDS / 2]);
    if (populate[0] >= 0)
        report("populate_ns_per_page", populate[ROUNDS / 2]);
    report("dontneed_ns_per_page", dontneed[ROUNDS / 2]);
    return 0;
}
