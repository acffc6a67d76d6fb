/* Shared helpers of the benchmark programs: clock, RSS from
 * /proc/self/smaps_rollup, soft page faults, a fast RNG, and the one output
 * format the runner reads: "metric value" lines. */
#ifndef HAKMEM_BENCH_COMMON_H
#define HAKMEM_BENCH_COMMON_H

#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "../tests/rss.h" /* rss_bytes(): the Rss: line of smaps_rollup */

static inline double now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static inline long soft_faults(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_minflt;
}

static inline uint64_t rng_next(uint64_t *s)
{
    uint64_t x = *s;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return *s = x;
}

static inline void report(const char *metric, double value) { printf("%s %.6g\n", metric, value); }

/* Keep the compiler from eliding allocations whose result is unused. */
static inline void escape(void *p) { __asm__ volatile("" : : "g"(p) : "memory"); }

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static inline double percentile(double *v, size_t n, double q)
{
    qsort(v, n, sizeof *v, cmp_double);
    size_t i = (size_t)(q * (double)(n - 1) + 0.5);
    return v[i];
}

#endif
