/* Memory overhead: N live blocks of 16 B (or of sizes uniform in
 * 8..1024 B), RSS from /proc/self/smaps_rollup before and after. The
 * benchmark's own pointer array is mapped and touched before the first
 * reading, so it is not counted. overhead = (RSS delta - requested) /
 * requested. Usage: memory 16|uniform N */
#include "common.h"

#include <sys/mman.h>

int main(int argc, char **argv)
{
    if (argc != 3)
        return fprintf(stderr, "usage: memory 16|uniform N\n"), 2;
    int uniform = !strcmp(argv[1], "uniform");
    long n = atol(argv[2]);
    void **blocks = mmap(NULL, sizeof(void *) * (size_t)n, PROT_READ | PROT_WRITE,
                         MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    free(malloc(16)); /* let the allocator initialise before the first reading */
    uint64_t seed = 2463534242ull;
    /* The first reading faults in the code that reads and parses the proc
     * file (about 60 KiB of libc): only the second one is the baseline. */
    rss_bytes();
    size_t before = rss_bytes();
    double requested = 0;
    for (long i = 0; i < n; i++) {
        size_t size = uniform ? 8 + rng_next(&seed) % 1017 : 16;
        blocks[i] = malloc(size);
        memset(blocks[i], 1, size); /* the block is used: its pages are resident */
        requested += (double)size;
    }
    size_t after = rss_bytes();
    report("requested_mib", requested / 1048576.0);
    report("rss_delta_mib", (double)(after - before) / 1048576.0);
    report("overhead_pct", ((double)(after - before) - requested) / requested * 100.0);
    for (long i = 0; i < n; i++)
        free(blocks[i]);
    return 0;
}
