/* RSS over time of a steady producer/consumer: one thread allocates blocks
 * of 1 KiB..1 MiB (log-uniform), touches them and hands them over a ring
 * of IN_FLIGHT slots to another thread, which keeps the last LIVE it
 * received and frees the one each new block replaces. The live set is
 * steady (LIVE blocks, about 40 MiB, plus at most IN_FLIGHT in the ring),
 * so RSS should stay flat after warm-up. The ring is short on purpose: with
 * one as long as the kept set, a fast producer filled it and held twice
 * the live memory of a slow one, so RSS measured the allocator's speed. RSS is sampled every
 * 1/40 of the run; we report it after warm-up (a quarter of the run), at
 * the end, its peak, and the growth from warm-up to the end, plus the
 * throughput and the soft page faults per block over the whole run: an
 * allocator that gives freed pages back at once keeps RSS near the live
 * set but faults them in again (glibc's trim: 0.6-1.3 faults a block
 * against 0.05 without it, measured at 41ea6a9). Usage: rsstime
 * OPERATIONS */
#include "common.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

enum { LIVE = 256, IN_FLIGHT = 8, SAMPLES = 40 };
static _Atomic(char *) ring[IN_FLIGHT];
static long operations;
/* Set once the consumer has read RSS for the last time. The producer
 * waits for it: a thread that exits hands its memory back (hakmem's does),
 * and the last reading, taken as the producer left, measured that instead
 * of the steady state (hakmem's end 46.5 MiB after 61.0 the reading before,
 * a growth of -10.9). */
static atomic_bool sampled;

static void *producer(void *arg)
{
    (void)arg;
    uint64_t seed = 0x1234567;
    for (long i = 0; i < operations; i++) {
        size_t size = (size_t)1024 << (rng_next(&seed) % 10); /* 1 KiB .. 512 KiB */
        size += rng_next(&seed) % size;                         /* .. 1 MiB */
        char *p = malloc(size);
        for (size_t j = 0; j < size; j += 4096)
            p[j] = (char)i;
        _Atomic(char *) *slot = &ring[i % IN_FLIGHT];
        while (atomic_load_explicit(slot, memory_order_acquire))
            ;
        atomic_store_explicit(slot, p, memory_order_release);
    }
    while (!atomic_load_explicit(&sampled, memory_order_acquire))
        ;
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc != 2)
        return fprintf(stderr, "usage: rsstime OPERATIONS\n"), 2;
    operations = atol(argv[1]);
    size_t rss[SAMPLES + 1] = {0};
    static char *kept[LIVE];
    pthread_t t;
    double start = now_ns();
    long faults_before = soft_faults();
    pthread_create(&t, NULL, producer, NULL);
    for (long i = 0; i < operations; i++) { /* the consumer */
        _Atomic(char *) *slot = &ring[i % IN_FLIGHT];
        char *p;
        while (!(p = atomic_load_explicit(slot, memory_order_acquire)))
            ;
        atomic_store_explicit(slot, NULL, memory_order_release);
        free(kept[i % LIVE]);
        kept[i % LIVE] = p;
        if ((i + 1) % (operations / SAMPLES) == 0 && (i + 1) / (operations / SAMPLES) <= SAMPLES)
            rss[(i + 1) / (operations / SAMPLES)] = rss_bytes();
    }
    double elapsed = now_ns() - start;
    atomic_store_explicit(&sampled, true, memory_order_release);
    pthread_join(t, NULL);
    long faults = soft_faults() - faults_before;
    for (int i = 0; i < LIVE; i++)
        free(kept[i]);
    size_t peak = 0;
    for (int s = 1; s <= SAMPLES; s++)
        peak = rss[s] > peak ? rss[s] : peak;
    double warm = (double)rss[SAMPLES / 4], end = (double)rss[SAMPLES];
    report("kops", (double)operations / elapsed * 1e6);
    report("rss_warm_mib", warm / 1048576.0);
    report("rss_end_mib", end / 1048576.0);
    report("rss_peak_mib", (double)peak / 1048576.0);
    report("rss_growth_mib", (end - warm) / 1048576.0);
    report("faults_per_block", (double)faults / (double)operations);
    return 0;
}
