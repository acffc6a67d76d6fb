/* The UCB1 tuner. "rule": its decision rule fed synthetic rewards in which
 * one arm is clearly best: it converges there from either end, one step at
 * a time, within a bounded number of windows, identically for one seed,
 * and keeps its cooldown. "evolving": a real run (HAKMEM_MODE=evolving,
 * threshold starting at 64K) of a workload whose large-tier blocks cost
 * page faults: the tuner raises the threshold until they come from slabs.
 * "windows": windows of 1 ms, samples rarer than the run's allocations: while only tiny blocks
 * are allocated nothing is timed and no window is judged; once large
 * calls are, windows are, and no malloc sleeps to close one.
 * Usage: test_tuner rule|evolving|windows */
#include "../src/profile.h"
#include "check.h"
#include "hakmem.h"

#include <malloc.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

/* Reward of arm a: best at 512K (arm 3), 15% less per step away, with
 * +-3% noise from a fixed generator. */
static double synthetic_reward(int arm, uint64_t *noise)
{
    *noise = *noise * 6364136223846793005ull + 1442695040888963407ull;
    double jitter = ((double)(*noise >> 11) / (double)(1ull << 53) - 0.5) * 0.06;
    int distance = arm > 3 ? arm - 3 : 3 - arm;
    return (1.0 - 0.15 * distance) * (1 + jitter);
}

/* Runs `windows` windows 100 ms apart; returns the arm in force at the end
 * and records the window at which arm 3 was first in force. */
static int run_rule(int start, uint64_t seed, int windows, uint64_t cooldown_ms, int *arms, int *reached_at)
{
    tuner_t t;
    tuner_start(&t, start, cooldown_ms, seed);
    uint64_t noise = seed;
    int arm = start;
    *reached_at = -1;
    for (int w = 0; w < windows; w++) {
        int before = t.current;
        arm = tuner_decide(&t, arm, synthetic_reward(arm, &noise), (uint64_t)w * 100);
        CHECK(arm >= t.current - 1 && arm <= t.current + 1); /* only neighbours are tried */
        CHECK(t.current == before || t.current == before - 1 || t.current == before + 1); /* one step */
        if (arms)
            arms[w] = arm;
        if (t.current == 3 && *reached_at < 0)
            *reached_at = w;
    }
    return t.current;
}

static void test_rule(void)
{
    enum { WINDOWS = 400 };
    int a[WINDOWS], b[WINDOWS], reached;
    for (int start = 0; start < TUNER_ARMS; start++) {
        CHECK(run_rule(start, 42, WINDOWS, 0, NULL, &reached) == 3);
        CHECK(reached >= 0 && reached <= 60); /* bounded: a handful of windows per step */
    }
    /* deterministic: the same seed gives the same decisions */
    run_rule(0, 7, WINDOWS, 0, a, &reached);
    run_rule(0, 7, WINDOWS, 0, b, &reached);
    CHECK(memcmp(a, b, sizeof a) == 0);
    /* cooldown: after a move, 10 windows (1 s) under the new arm */
    tuner_t t;
    tuner_start(&t, 0, 1000, 3);
    uint64_t noise = 3;
    int arm = 0, moved_at = -1;
    for (int w = 0; w < 200 && moved_at < 0; w++) {
        arm = tuner_decide(&t, arm, synthetic_reward(arm, &noise), (uint64_t)w * 100);
        if (t.moves)
            moved_at = w;
    }
    CHECK(moved_at >= 0);
    for (int w = moved_at + 1; w < moved_at + 10; w++) {
        arm = tuner_decide(&t, arm, synthetic_reward(arm, &noise), (uint64_t)w * 100);
        CHECK(arm == t.current && t.moves == 1);
    }
    /* hysteresis: a neighbour only 5% better never takes over */
    tuner_start(&t, 2, 0, 9);
    arm = 2;
    for (int w = 0; w < WINDOWS; w++)
        arm = tuner_decide(&t, arm, arm == 3 ? 1.05 : arm == 2 ? 1.0 : 0.5, (uint64_t)w * 100);
    CHECK(t.current == 2 && t.moves == 0);
    /* a neighbour 50 times worse (bench rss-time's 512K, whose blocks of
     * 512K-1M each took a new mapping, 13-16 us a malloc against 0.3) is
     * tried a handful of times, not every third window; one 10% worse
     * a little more often */
    int under[TUNER_ARMS] = {0};
    tuner_start(&t, 2, 0, 5);
    arm = 2;
    for (int w = 0; w < WINDOWS; w++) {
        under[arm]++;
        arm = tuner_decide(&t, arm, arm == 1 ? 0.02 : arm == 2 ? 1.0 : 0.9, (uint64_t)w * 100);
    }
    printf("tuner: %d windows under a neighbour 50 times worse, %d under one 10%% worse, of %d\n", under[1],
           under[3], WINDOWS);
    CHECK(t.current == 2);
    CHECK(under[1] <= 5);
    CHECK(under[3] <= 12);
}

/* Each round holds blocks of 96K, 192K, 384K and 768K (the same bytes per
 * size), touches every page, and frees them: under a low threshold each
 * large block is a new mapping (BigCache is off in this run), faulting
 * every page in; from slabs, the pages stay. */
static void test_evolving(void)
{
    static const size_t sizes[] = {96 << 10, 192 << 10, 384 << 10, 768 << 10};
    static const int counts[] = {8, 4, 2, 1};
    void *held[15];
    hak_stats_t s;
    hak_stats_get(&s);
    CHECK(s.large_threshold == (size_t)64 << 10);
    for (int round = 0; round < 200000; round++) {
        int n = 0;
        for (int k = 0; k < 4; k++)
            for (int i = 0; i < counts[k]; i++) {
                held[n] = malloc(sizes[k]);
                memset(held[n], n, sizes[k]);
                __asm__ volatile("" : : "r"(held[n]) : "memory"); /* the pages are touched */
                n++;
            }
        for (int i = 0; i < n; i++)
            free(held[i]);
        hak_stats_get(&s);
        if (s.tuner_threshold >= (size_t)1 << 20 || s.tuner_windows > 300)
            break;
    }
    printf("tuner: chose %zuK after %llu windows, %llu moves\n", s.tuner_threshold >> 10,
           (unsigned long long)s.tuner_windows, (unsigned long long)s.tuner_moves);
    CHECK(s.tuner_threshold == (size_t)1 << 20);
    CHECK(s.tuner_moves == 4); /* one step at a time */
    CHECK(s.tuner_windows <= 60);
}

/* The library's calls to nanosleep land here (it is linked statically):
 * those of the main thread, the one that allocates, are counted. */
static pthread_t main_thread;
static int main_thread_sleeps;
int nanosleep(const struct timespec *wait, struct timespec *left)
{
    if (pthread_equal(pthread_self(), main_thread))
        main_thread_sleeps++;
    return (int)syscall(SYS_nanosleep, wait, left); /* -1 and errno, as nanosleep */
}

static double elapsed_ms(const struct timespec *since)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (double)(now.tv_sec - since->tv_sec) * 1e3 + (double)(now.tv_nsec - since->tv_nsec) / 1e6;
}

static void test_windows(void)
{
    main_thread = pthread_self();
    struct timespec start;
    clock_gettime(CLOCK_MONOTONIC, &start);
    enum { BLOCKS = 4096 };
    static void *held[BLOCKS];
    hak_stats_t s;
    /* Tiny blocks only, for 5 windows and more: one slab refill in 64 or
     * so calls the tuner (each round refills each of the 64 classes),
     * allocations are counted, nothing is timed. */
    for (int round = 0; elapsed_ms(&start) < 5 || round < 8; round++) {
        for (int i = 0; i < BLOCKS; i++) {
            held[i] = malloc((size_t)(i % 64) * 16 + 16);
            __asm__ volatile("" : : "r"(held[i]) : "memory");
        }
        for (int i = 0; i < BLOCKS; i++)
            free(held[i]);
        hak_collect(true); /* the next round refills again */
    }
    hak_stats_get(&s);
    CHECK(s.tuner_windows == 0);
    /* Large calls, timed one in 8: the first windows are judged here, in
     * the release build within 20 ms of the library's start, where the
     * tick rate's calibration used to sleep out the rest inside a malloc. */
    for (int i = 0; s.tuner_windows < 3 && elapsed_ms(&start) < 2000; i++) {
        char *p = malloc((size_t)4 << 20);
        __asm__ volatile("" : : "r"(p) : "memory"); /* not elided */
        free(p);
        if (i % 64 == 0)
            hak_stats_get(&s);
    }
    printf("tuner: %llu windows judged by %.1f ms; %d sleeps in the main thread\n",
           (unsigned long long)s.tuner_windows, elapsed_ms(&start), main_thread_sleeps);
    CHECK(s.tuner_windows >= 3);
    CHECK(main_thread_sleeps == 0);
}

#ifdef __GLIBC__ /* mallopt: glibc's */
/* mallopt(M_MMAP_THRESHOLD) pins the threshold: the tuner, which has been
 * judging windows, judges no more and the threshold stays where it was
 * set, as glibc stops moving its own. */
static void test_pinned(void)
{
    hak_stats_t s;
    struct timespec start;
    clock_gettime(CLOCK_MONOTONIC, &start);
    do {
        void *p = malloc((size_t)96 << 10);
        __asm__ volatile("" : : "r"(p) : "memory");
        free(p);
        hak_stats_get(&s);
    } while (s.tuner_windows < 3 && elapsed_ms(&start) < 5000);
    CHECK(s.tuner_windows >= 3);
    CHECK(mallopt(M_MMAP_THRESHOLD, 100000) == 1);
    hak_stats_get(&s);
    uint64_t windows = s.tuner_windows;
    CHECK(s.large_threshold == (size_t)128 << 10 && s.tuner_threshold == (size_t)128 << 10);
    clock_gettime(CLOCK_MONOTONIC, &start);
    while (elapsed_ms(&start) < 300) { /* ten windows */
        void *p = malloc((size_t)96 << 10);
        __asm__ volatile("" : : "r"(p) : "memory");
        free(p);
    }
    hak_stats_get(&s);
    printf("tuner: pinned at %zuK after %llu windows, %llu after 300 ms more\n", s.large_threshold >> 10,
           (unsigned long long)windows, (unsigned long long)s.tuner_windows);
    CHECK(s.large_threshold == (size_t)128 << 10 && s.tuner_windows == windows);
}
#endif

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "rule";
    if (!strcmp(mode, "rule"))
        test_rule();
    else if (!strcmp(mode, "evolving"))
        test_evolving();
    else if (!strcmp(mode, "windows"))
        test_windows();
#ifdef __GLIBC__
    else if (!strcmp(mode, "pinned"))
        test_pinned();
#endif
    return check_summary("test_tuner");
}
