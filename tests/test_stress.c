/* Stress, fork and soak, through hakmem's own names (hak_malloc ...) so
 * that the same program runs in the ThreadSanitizer build, where the
 * sanitizer owns malloc.
 *
 *   test_stress stress [SECONDS] [THREADS]  random calls of the whole family,
 *       sizes 1 B to 4 MiB, random alignments, realloc, cross-thread frees,
 *       threads that exit while others still hold their blocks; every block
 *       carries a pattern checked on realloc and free.
 *   test_stress fork [FORKS]   a child forked while threads allocate frees
 *       and reuses blocks allocated before the fork, by every thread.
 *   test_stress soak [SECONDS] [THREADS]  the stress workload with a bounded
 *       working set; RSS (smaps_rollup) must stay flat after warm-up. */
#define _GNU_SOURCE
#include "check.h"
#include "hakmem.h"
#include "rss.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* ---- blocks with a checkable pattern --------------------------------------- */

typedef struct block {
    unsigned char *p;
    size_t size;
    uint32_t tag;
} block_t;

static uint64_t rng_next(uint64_t *s)
{
    uint64_t x = *s;
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    return *s = x;
}

/* Mostly small, as in real programs, with every tier reached often. */
static size_t random_size(uint64_t *rng)
{
    uint64_t r = rng_next(rng);
    unsigned kind = (unsigned)(r % 1000);
    r >>= 10;
    if (kind < 600)
        return 1 + r % 128;
    if (kind < 850)
        return 129 + r % 896;               /* up to 1 KiB: tiny */
    if (kind < 970)
        return 1025 + r % (64 << 10);       /* mid */
    if (kind < 995)
        return (64 << 10) + r % (1 << 20);  /* mid and large, around the threshold */
    return (1 << 20) + r % (3 << 20);       /* large, up to 4 MiB */
}

static unsigned char pattern_byte(uint32_t tag, size_t off)
{
    return (unsigned char)(tag ^ (off * 0x9e) ^ (off >> 9));
}

/* The offsets a pattern covers: all of a small block; the two ends and one
 * byte per page of a big one (filling megabytes would test memset). */
static size_t pattern_next(size_t off, size_t size)
{
    if (size <= 512 || off < 255 || off + 256 >= size)
        return off + 1;
    return off + 4093 < size - 256 ? off + 4093 : size - 256;
}

static void pattern_fill(unsigned char *p, size_t size, uint32_t tag)
{
    for (size_t off = 0; off < size; off = pattern_next(off, size))
        p[off] = pattern_byte(tag, off);
}

/* The first offset below limit whose byte is wrong, or limit. */
static size_t pattern_check(const unsigned char *p, size_t size, uint32_t tag, size_t limit)
{
    for (size_t off = 0; off < size && off < limit; off = pattern_next(off, size))
        if (p[off] != pattern_byte(tag, off))
            return off;
    return limit;
}

static _Atomic uint64_t bad_blocks, ops_done, foreign_blocks;

static void block_verify(const block_t *b, size_t limit, const char *when)
{
    size_t bad = pattern_check(b->p, b->size, b->tag, limit);
    if (bad != limit) {
        if (atomic_fetch_add(&bad_blocks, 1) < 5)
            fprintf(stderr, "test_stress: %s: block %p of %zu bytes corrupt at offset %zu\n", when,
                    (void *)b->p, b->size, bad);
    }
}

/* Allocate with a random call of the family; checks what the contract says. */
static int block_alloc(block_t *b, uint64_t *rng)
{
    size_t size = random_size(rng);
    unsigned how = (unsigned)(rng_next(rng) % 16);
    size_t align = 0;
    unsigned char *p;
    if (how < 2) {
        p = hak_calloc(1 + size / 16, 16);
        size = (1 + size / 16) * 16;
        if (p)
            for (size_t off = 0; off < size; off += 1 + off / 2)
                if (p[off] != 0) {
                    atomic_fetch_add(&bad_blocks, 1);
                    fprintf(stderr, "test_stress: calloc(%zu) not zero at %zu\n", size, off);
                    break;
                }
    } else if (how < 4) {
        align = (size_t)8 << (rng_next(rng) % 14); /* 8 B to 64 KiB */
        p = hak_aligned_alloc(align, size);
    } else {
        p = hak_malloc(size);
    }
    if (!p) {
        atomic_fetch_add(&bad_blocks, 1);
        fprintf(stderr, "test_stress: allocation of %zu bytes failed\n", size);
        return 0;
    }
    if ((align && (uintptr_t)p % align) || hak_usable_size(p) < size || !hak_owns(p) ||
        !hak_owns(p + size - 1)) {
        atomic_fetch_add(&foreign_blocks, 1);
        fprintf(stderr, "test_stress: %p (%zu bytes, align %zu): misaligned, short or not hakmem's\n",
                (void *)p, size, align);
    }
    b->p = p;
    b->size = size;
    b->tag = (uint32_t)rng_next(rng);
    pattern_fill(p, size, b->tag);
    return 1;
}

static void block_free(block_t *b, const char *when)
{
    block_verify(b, b->size, when);
    hak_free(b->p);
    b->p = NULL;
}

/* realloc keeps the common prefix; the block then gets a new pattern. */
static void block_realloc(block_t *b, uint64_t *rng)
{
    size_t size = random_size(rng);
    unsigned char *q = hak_realloc(b->p, size);
    if (!q) {
        atomic_fetch_add(&bad_blocks, 1);
        return;
    }
    block_t moved = {q, b->size, b->tag};
    block_verify(&moved, size < b->size ? size : b->size, "realloc");
    b->p = q;
    b->size = size;
    b->tag = (uint32_t)rng_next(rng);
    pattern_fill(q, size, b->tag);
}

/* ---- the exchange: blocks handed to whichever thread comes next ---------- */

#define EXCHANGE 512
static _Atomic(block_t *) exchange[EXCHANGE];

/* Swap b into a random exchange slot; whatever was there (another thread's
 * block, perhaps of a thread that has exited) is checked and freed here. */
static void hand_off(block_t *b, uint64_t *rng)
{
    block_t *box = hak_malloc(sizeof *box); /* the box crosses threads too */
    *box = *b;
    b->p = NULL;
    block_t *old = atomic_exchange(&exchange[rng_next(rng) % EXCHANGE], box);
    if (old) {
        block_free(old, "cross-thread free");
        hak_free(old);
    }
}

static void exchange_drain(void)
{
    for (unsigned i = 0; i < EXCHANGE; i++) {
        block_t *old = atomic_exchange(&exchange[i], NULL);
        if (old) {
            block_free(old, "drain");
            hak_free(old);
        }
    }
}

/* ---- workers ------------------------------------------------------------------ */

typedef struct worker {
    pthread_t thread;
    uint64_t seed;
    unsigned slots;      /* working set */
    uint64_t ops;        /* in this thread's life */
    _Atomic int done;
} worker_t;

static void *worker_main(void *arg)
{
    worker_t *w = arg;
    uint64_t rng = w->seed | 1;
    block_t *live = hak_calloc(w->slots, sizeof *live);
    for (uint64_t i = 0; i < w->ops; i++) {
        block_t *b = &live[rng_next(&rng) % w->slots];
        unsigned op = (unsigned)(rng_next(&rng) % 100);
        if (!b->p)
            block_alloc(b, &rng);
        else if (op < 55)
            block_free(b, "free");
        else if (op < 75)
            block_realloc(b, &rng);
        else
            hand_off(b, &rng);
    }
    /* Exit holding blocks: half freed here, half left to other threads. */
    for (unsigned i = 0; i < w->slots; i++)
        if (live[i].p) {
            if (i % 2)
                block_free(&live[i], "exit");
            else
                hand_off(&live[i], &rng);
        }
    hak_free(live);
    atomic_fetch_add(&ops_done, w->ops);
    atomic_store(&w->done, 1);
    return NULL;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Keep `threads` workers running until `seconds` have passed, replacing
 * each as it exits, and at least until one has been replaced (a loaded
 * machine, or valgrind, may take longer than `seconds` for one life);
 * on_tick runs about every 100 ms. Returns lives run. */
static unsigned run_workers(double seconds, unsigned threads, unsigned slots, uint64_t ops,
                            void (*on_tick)(double elapsed))
{
    worker_t *w = calloc(threads, sizeof *w);
    unsigned lives = 0;
    uint64_t seed = 0x9e3779b97f4a7c15u;
    double start = now_s(), last_tick = start;
    for (unsigned i = 0; i < threads; i++) {
        w[i] = (worker_t){.seed = rng_next(&seed), .slots = slots, .ops = ops};
        pthread_create(&w[i].thread, NULL, worker_main, &w[i]);
        lives++;
    }
    for (;;) {
        double t = now_s();
        bool more = t - start < seconds || lives == threads;
        for (unsigned i = 0; i < threads; i++)
            if (atomic_load(&w[i].done) && w[i].ops) {
                pthread_join(w[i].thread, NULL);
                w[i].ops = 0;
                if (more) {
                    w[i] = (worker_t){.seed = rng_next(&seed), .slots = slots, .ops = ops};
                    pthread_create(&w[i].thread, NULL, worker_main, &w[i]);
                    lives++;
                }
            }
        unsigned running = 0;
        for (unsigned i = 0; i < threads; i++)
            running += w[i].ops != 0;
        if (!more && !running)
            break;
        if (on_tick && t - last_tick >= 0.1) {
            on_tick(t - start);
            last_tick = t;
        }
        usleep(2000);
    }
    free(w);
    return lives;
}

static int stress(double seconds, unsigned threads)
{
    double start = now_s();
    unsigned lives = run_workers(seconds, threads, 256, 20000, NULL);
    exchange_drain();
    printf("test_stress: %llu operations, %u thread lives (%u at a time), %.1f s\n",
           (unsigned long long)atomic_load(&ops_done), lives, threads, now_s() - start);
    CHECK(atomic_load(&bad_blocks) == 0);
    CHECK(atomic_load(&foreign_blocks) == 0);
    check_meshed_under_stress();
    return check_summary("test_stress stress");
}

/* ---- soak ----------------------------------------------------------------------- */

#define RSS_SAMPLES 4096
static size_t rss_sample[RSS_SAMPLES];
static unsigned rss_count;

static void soak_tick(double elapsed)
{
    (void)elapsed;
    if (rss_count < RSS_SAMPLES)
        rss_sample[rss_count++] = rss_bytes();
}

/* The rise of RSS over samples v[0..n), as a fraction of their mean: the
 * least-squares line's climb from the first sample to the last. */
static double fitted_rise(const size_t *v, unsigned n)
{
    double mean_x = (n - 1) / 2.0, mean_y = 0, covariance = 0, variance = 0;
    for (unsigned i = 0; i < n; i++)
        mean_y += (double)v[i] / n;
    for (unsigned i = 0; i < n; i++) {
        covariance += (i - mean_x) * ((double)v[i] - mean_y);
        variance += (i - mean_x) * (i - mean_x);
    }
    return covariance / variance * (n - 1) / mean_y;
}

/* RSS is flat when the line fitted to it after warm-up (the first quarter)
 * rises by at most a quarter. RSS swings by a fifth or more with the
 * workers' lives (a few blocks of 1-4 MiB are most of it), so two
 * quarters' floors or medians compared failed now and then under a loaded
 * ctest (measured at 6aef694: floors 124 against 152 MiB). The fit over
 * the short soak's 45 samples, three soaks at once on two cores, rose by
 * -5% to +12% in twenty runs, and by 36-67% in nine with one free in 300
 * skipped (17-31% with one in 1,000); one loaded CI run rose by 26% with
 * nothing skipped. A fit above a quarter therefore runs the soak as long
 * again and fits all its samples after the same warm-up: a swing weighs
 * half as much over twice the samples, a leak rises further. */
static double soak_rise(unsigned warm_up, size_t *low, size_t *high)
{
    *low = SIZE_MAX;
    *high = 0;
    for (unsigned i = warm_up; i < rss_count; i++) {
        *low = rss_sample[i] < *low ? rss_sample[i] : *low;
        *high = rss_sample[i] > *high ? rss_sample[i] : *high;
    }
    return fitted_rise(rss_sample + warm_up, rss_count - warm_up);
}

static int soak(double seconds, unsigned threads)
{
    double start = now_s();
    unsigned lives = run_workers(seconds, threads, 512, 50000, soak_tick);
    unsigned warm_up = rss_count / 4;
    CHECK(rss_count - warm_up >= 8);
    if (rss_count - warm_up < 8) {
        exchange_drain();
        return check_summary("test_stress soak");
    }
    size_t low, high;
    double rise = soak_rise(warm_up, &low, &high);
    if (rise > 0.25) {
        printf("test_stress soak: fitted rise %+.0f%% over %u samples (%zu-%zu MiB); soaking as long again\n",
               rise * 100, rss_count - warm_up, low >> 20, high >> 20);
        lives += run_workers(seconds, threads, 512, 50000, soak_tick);
        rise = soak_rise(warm_up, &low, &high);
    }
    exchange_drain();
    printf("test_stress soak: %llu operations, %u thread lives, %.0f s; RSS after warm-up %zu-%zu MiB "
           "in %u samples, fitted rise %+.0f%%\n",
           (unsigned long long)atomic_load(&ops_done), lives, now_s() - start, low >> 20, high >> 20,
           rss_count - warm_up, rise * 100);
    CHECK(rise <= 0.25);
    CHECK(atomic_load(&bad_blocks) == 0);
    CHECK(atomic_load(&foreign_blocks) == 0);
    check_meshed_under_stress();
    return check_summary("test_stress soak");
}

/* ---- fork while allocating -------------------------------------------------------- */

static _Atomic int stop_churn;

/* Allocates, frees and hands off without pause while the main thread forks. */
static void *churn_main(void *arg)
{
    uint64_t rng = (uintptr_t)arg * 0x9e3779b97f4a7c15u | 1;
    block_t live[64] = {0};
    while (!atomic_load(&stop_churn)) {
        block_t *b = &live[rng_next(&rng) % 64];
        if (!b->p)
            block_alloc(b, &rng);
        else if (rng_next(&rng) % 4)
            block_free(b, "churn");
        else
            hand_off(b, &rng);
    }
    for (unsigned i = 0; i < 64; i++)
        if (live[i].p)
            block_free(&live[i], "churn exit");
    return NULL;
}

/* In the child: free every block the parent's main thread held and every
 * block in the exchange (allocated by threads that do not exist here),
 * reuse the memory from a new thread too, then exit 0 if all was intact. */
static void *child_thread(void *arg)
{
    uint64_t rng = 77;
    block_t b[200];
    for (int i = 0; i < 200; i++)
        block_alloc(&b[i], &rng);
    for (int i = 0; i < 200; i++)
        block_free(&b[i], "child thread");
    return arg;
}

static int fork_child(block_t *held, unsigned count)
{
    uint64_t rng = 5;
    for (unsigned i = 0; i < count; i += 2)
        block_free(&held[i], "child: parent's block");
    exchange_drain();
    block_t fresh[300];
    for (int i = 0; i < 300; i++)
        block_alloc(&fresh[i], &rng);
    for (unsigned i = 1; i < count; i += 2)
        block_realloc(&held[i], &rng);
    pthread_t t;
    if (threads_after_fork()) {
        pthread_create(&t, NULL, child_thread, NULL);
        pthread_join(t, NULL);
    } else {
        child_thread(NULL);
    }
    for (int i = 0; i < 300; i++)
        block_free(&fresh[i], "child: new block");
    for (unsigned i = 1; i < count; i += 2)
        block_free(&held[i], "child: reallocated block");
    return atomic_load(&bad_blocks) || atomic_load(&foreign_blocks) ? 1 : 0;
}

static int fork_test(unsigned forks)
{
    enum { HELD = 64, CHURNERS = 3 };
    pthread_t churner[CHURNERS];
    for (uintptr_t i = 0; i < CHURNERS; i++)
        pthread_create(&churner[i], NULL, churn_main, (void *)(i + 1));
    uint64_t rng = 3;
    unsigned failed = 0;
    for (unsigned f = 0; f < forks; f++) {
        block_t held[HELD];
        for (unsigned i = 0; i < HELD; i++)
            block_alloc(&held[i], &rng);
        pid_t pid = fork();
        if (pid == 0)
            _exit(fork_child(held, HELD));
        int status = 0;
        waitpid(pid, &status, 0);
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
            if (failed++ < 3)
                fprintf(stderr, "test_stress fork: child %u ended with status %#x\n", f, status);
        }
        for (unsigned i = 0; i < HELD; i++)
            block_free(&held[i], "parent");
    }
    atomic_store(&stop_churn, 1);
    for (unsigned i = 0; i < CHURNERS; i++)
        pthread_join(churner[i], NULL);
    exchange_drain();
    printf("test_stress fork: %u forks while %d threads allocated\n", forks, CHURNERS);
    CHECK(failed == 0);
    CHECK(atomic_load(&bad_blocks) == 0);
    CHECK(atomic_load(&foreign_blocks) == 0);
    check_meshed_under_stress();
    return check_summary("test_stress fork");
}

int main(int argc, char **argv)
{
    check_expected_build();
    const char *mode = argc > 1 ? argv[1] : "stress";
    double seconds = argc > 2 ? atof(argv[2]) : 3;
    unsigned threads = argc > 3 ? (unsigned)atoi(argv[3]) : 4;
    if (strcmp(mode, "stress") == 0)
        return stress(seconds, threads);
    if (strcmp(mode, "soak") == 0)
        return soak(seconds, threads);
    if (strcmp(mode, "fork") == 0)
        return fork_test(argc > 2 ? (unsigned)atoi(argv[2]) : 40);
    fprintf(stderr, "usage: test_stress stress|soak [SECONDS] [THREADS] | fork [FORKS]\n");
    return 2;
}
