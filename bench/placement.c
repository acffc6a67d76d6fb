/* Battle mixed's loop with no allocator: its blocks at fixed addresses,
 * placed at the page offsets given, so that what the placement alone costs
 * on a machine can be measured apart from any allocator's code (at
 * 7981201: hakmem's large blocks, all two lines into
 * their first page, ran mixed 7.7% slower than glibc's scattered ones).
 * Each of mixed's sizes (64 KiB, 256 KiB, 2 MiB, 8 KiB, 100 KiB) has two
 * blocks that take turns, as the live set of 8 makes them under every
 * allocator; the 2 MiB blocks each start a 2 MiB chunk of their own
 * mapping, the others lie in one region, as an arena's. One iteration
 * writes a byte in each page of a block at its start and its last byte;
 * a sample times 16. Prints the median ns an iteration.
 * Usage: placement SAMPLES glibc|fixed|colours
 *        placement SAMPLES OFFSET x 10 (64 KiB a, b, 256 KiB a, b, 2 MiB a, b, 8 KiB a, b, 100 KiB a, b) */
#include "common.h"

#include <sys/mman.h>

enum { SIZES = 5 };
static const size_t sizes[SIZES] = {64 << 10, 256 << 10, 2 << 20, 8 << 10, 100 << 10};

/* Page offsets of the two blocks of each size. */
static const struct preset {
    const char *name;
    size_t offset[SIZES][2];
} presets[] = {
    /* glibc 2.36's, read off a run of mixed: 16-byte headers scatter them */
    {"glibc", {{0x2a0, 0x2d0}, {0x310, 0x320}, {0x330, 0x340}, {0x2b0, 0x2e0}, {0x2c0, 0x2f0}}},
    /* hakmem before 7981201: page-aligned arena and slab blocks, every large block at 128 */
    {"fixed", {{0, 0}, {0, 0}, {0x80, 0x80}, {0, 0}, {0, 0}}},
    /* hakmem since: the first two large mappings' colours, lines 2 and 9 */
    {"colours", {{0, 0}, {0, 0}, {0x80, 0x240}, {0, 0}, {0, 0}}},
};

/* size bytes at an address aligned to align, never unmapped. */
static char *map_aligned(size_t size, size_t align)
{
    char *p = mmap(NULL, size + align, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        perror("placement: mmap");
        exit(1);
    }
    return (char *)(((uintptr_t)p + align - 1) & ~(uintptr_t)(align - 1));
}

static int compare_doubles(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
    size_t offset[SIZES][2];
    const struct preset *preset = NULL;
    for (size_t i = 0; argc == 3 && i < sizeof presets / sizeof presets[0]; i++)
        if (!strcmp(argv[2], presets[i].name))
            preset = &presets[i];
    if (preset) {
        memcpy(offset, preset->offset, sizeof offset);
    } else if (argc == 2 + 2 * SIZES) {
        for (int i = 0; i < 2 * SIZES; i++)
            offset[i / 2][i % 2] = strtoul(argv[2 + i], NULL, 0) & 4095;
    } else {
        return fprintf(stderr, "usage: placement SAMPLES glibc|fixed|colours | placement SAMPLES OFFSET x 10\n"), 2;
    }
    long samples = atol(argv[1]);
    if (samples < 1)
        return fprintf(stderr, "placement: SAMPLES must be positive\n"), 2;
    /* The page each block below 2 MiB starts on in its region (the 8 KiB
     * blocks' in the slabs', the others' in the arena's), where hakmem put
     * them in a run of mixed. */
    static const size_t region_page[SIZES][2] = {{0x21, 0x8b}, {0x31, 0x9b}, {0, 0}, {0x10, 0x12}, {0x71, 0xdb}};
    char *arena = map_aligned(2 << 20, 2 << 20), *slabs = map_aligned(2 << 20, 2 << 20);
    char *block[SIZES][2];
    for (int s = 0; s < SIZES; s++)
        for (int k = 0; k < 2; k++)
            block[s][k] = s == 2   ? map_aligned(6 << 20, 2 << 20) + (2 << 20) + offset[s][k]
                          : s == 3 ? slabs + region_page[s][k] * 4096 + offset[s][k]
                                   : arena + region_page[s][k] * 4096 + offset[s][k];
    double *ns = malloc(sizeof(double) * (size_t)samples);
    if (!ns)
        return perror("placement"), 1;
    for (long s = 0, i = 0; s < samples; s++) {
        double t0 = now_ns();
        for (long end = i + 16; i < end; i++) {
            size_t size = sizes[i % SIZES];
            char *p = block[i % SIZES][(i / SIZES) & 1];
            for (size_t j = 0; j < size; j += 4096)
                p[j] = (char)i;
            p[size - 1] = (char)i;
        }
        ns[s] = (now_ns() - t0) / 16;
    }
    qsort(ns, (size_t)samples, sizeof ns[0], compare_doubles);
    report("median_ns", ns[samples / 2]);
    return 0;
}
