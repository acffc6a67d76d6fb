/* The UCB1 tuner. "rule": its decision rule fed synthetic rewards in which
 * one arm is clearly best: it converges there from either end, one step at
 * a time, within a bounded number of windows, identically for one seed,
 * and keeps its cooldown. "evolving": a real run (HAKMEM_MODE=evolving,
 * threshold starting at 64K) of a workload whose large-tier blocks cost
 * page faults: the tuner raises the threshold until they come from slabs.
 * Usage: test_tuner rule|evolving */
#include "../src/internal.h"
#include "check.h"
#include "hakmem.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "rule";
    if (!strcmp(mode, "rule"))
        test_rule();
    else if (!strcmp(mode, "evolving"))
        test_evolving();
    return check_summary("test_tuner");
}
