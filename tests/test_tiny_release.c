/* The Tiny tier gives memory back: hak_thread_cache_flush hands a
 * class's cached blocks back so its empty slabs are released, and after a
 * program frees everything and flushes, RSS is back within 2.5 MiB of where
 * it started. In a HAKMEM_COUNTERS build the report shows the
 * debug counters. */
#define _GNU_SOURCE
#include "check.h"
#include "hakmem.h"
#include "rss.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static uint64_t rng(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static void test_class_api(void)
{
    CHECK(hak_tiny_class_count() > 0);
    CHECK(hak_tiny_size_class(1) == hak_tiny_size_class(8));
    CHECK(hak_tiny_size_class(16) != hak_tiny_size_class(17));
    CHECK(hak_tiny_size_class(1024) == hak_tiny_class_count() - 1);
    CHECK(hak_tiny_size_class(1025) == -1);
    errno = 0;
    CHECK(hak_thread_cache_flush(-1) == -1 && errno == EINVAL);
    errno = 0;
    CHECK(hak_thread_cache_flush(hak_tiny_class_count()) == -1 && errno == EINVAL);
    /* The deprecated names still serve. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
    errno = 0;
    CHECK(hak_tiny_magazine_flush(-1) == -1 && errno == EINVAL);
    CHECK(hak_tiny_magazine_flush(0) == 0);
    hak_tiny_magazine_flush_all();
#pragma GCC diagnostic pop
}

/* Blocks of one class, all freed: the current slab stays with the thread
 * (with its cache) until the class is flushed, and then nothing of the
 * class is left out but what the profiling samples took (they may be
 * served by the sample arena, outside the slabs). */
static void test_flush_class(void)
{
    enum { N = 20000 };
    const size_t size = 720; /* a class nothing else in this test uses */
    const int cls = hak_tiny_size_class(size);
    static void *blocks[N];
    CHECK(hak_tiny_class_bytes(cls) == 0);
    hak_kpi_t kpi_before, kpi_after;
    hak_get_kpi(&kpi_before);
    for (int i = 0; i < N; i++) {
        blocks[i] = malloc(size);
        CHECK(blocks[i] && hak_owns(blocks[i]));
    }
    hak_get_kpi(&kpi_after);
    uint64_t samples = kpi_after.latency_samples - kpi_before.latency_samples; /* each one timed */
    CHECK(samples <= N / 8); /* a small minority, whatever HAKMEM_PROFILE_SAMPLE says */
    size_t out = hak_tiny_class_bytes(cls); /* the blocks, and those the cache holds (at most a slab's) */
    CHECK(out >= (N - samples) * size && out <= N * size + ((size_t)64 << 10));
    hak_stats_t before, freed, after;
    hak_stats_get(&before);
    for (int i = 0; i < N; i++)
        free(blocks[i]);
    hak_stats_get(&freed);
    CHECK(freed.tiny_slabs < before.tiny_slabs); /* slabs other than the current one went at once */
    /* The blocks the thread's cache still holds, all of the current slab,
     * which then stays until the flush. Where the cache held none at the
     * end (which depends on how many blocks the profile sampled, and so on
     * the machine's load), the slab's last free emptied it, and it went at
     * once: the kept empty slabs' budget is full of the slabs emptied
     * before it. */
    size_t held = hak_tiny_class_bytes(cls);
    CHECK(held <= ((size_t)64 << 10));
    CHECK(hak_thread_cache_flush(cls) == 0);
    hak_stats_get(&after);
    CHECK(after.tiny_slabs == freed.tiny_slabs - (held > 0)); /* the current one on flush */
    CHECK(hak_tiny_class_bytes(cls) == 0);
    errno = 0;
    CHECK(hak_tiny_class_bytes(-1) == (size_t)-1 && errno == EINVAL);
    errno = 0;
    CHECK(hak_tiny_class_bytes(hak_tiny_class_count()) == (size_t)-1 && errno == EINVAL);
}

/* A debug counter's value in the report of a HAKMEM_COUNTERS build. */
static uint64_t report_counter(const char *label)
{
    static char text[1 << 16]; /* not open_memstream: its buffer would not be hakmem's */
    FILE *out = fmemopen(text, sizeof text - 1, "w");
    if (!out)
        return 0;
    hak_stats_print(out);
    fclose(out);
    const char *at = strstr(text, label);
    if (!at)
        return 0;
    while (at > text && at[-1] != '\n')
        at--;
    return strtoull(at, NULL, 10);
}

/* 64 live blocks of 1 KiB fill one slab; freed and taken back at random,
 * they found one block at a time there, and every malloc took a refill.
 * The class takes a second slab instead (two at most), and the refills
 * come in batches. The blocks keep their bytes, and a flush gives both
 * slabs back. */
static void test_random_replacement(void)
{
    enum { LIVE = 64, ROUNDS = 20000 };
    const size_t size = 1024;
    const int cls = hak_tiny_size_class(size);
    static const char refill_label[] = "refill: took the current slab's local free list";
    char *live[LIVE];
    for (int i = 0; i < LIVE; i++) {
        live[i] = malloc(size);
        CHECK(live[i] && hak_owns(live[i]));
        memset(live[i], i, size);
    }
    hak_stats_t filled, churned, flushed;
    /* The stats are read after each report: the report's own blocks
     * (names, line tables) come and go in the slabs counted. */
    uint64_t refills_before = report_counter(refill_label), seed = 2463534242u;
    hak_stats_get(&filled);
    int bad = 0;
    for (int i = 0; i < ROUNDS; i++) {
        int k = (int)(rng(&seed) % LIVE);
        bad += live[k][0] != (char)k || live[k][size - 1] != (char)k;
        free(live[k]);
        live[k] = malloc(size);
        memset(live[k], k, size);
    }
    uint64_t refills = report_counter(refill_label) - refills_before;
    hak_stats_get(&churned);
    for (int i = 0; i < LIVE; i++)
        free(live[i]);
    CHECK(hak_thread_cache_flush(cls) == 0);
    hak_stats_get(&flushed);
    printf("random replacement: %d of %d blocks of %zu B: tiny slabs %zu -> %zu, %llu refills from "
           "the current slab (counted in HAKMEM_COUNTERS builds)\n",
           ROUNDS, LIVE, size, filled.tiny_slabs, churned.tiny_slabs, (unsigned long long)refills);
    CHECK(bad == 0);
    CHECK(churned.tiny_slabs <= filled.tiny_slabs + 2); /* other classes may give slabs back meanwhile */
#ifdef HAKMEM_COUNTERS
    CHECK(refills < ROUNDS / 4); /* 19,975 before */
#endif
    CHECK(flushed.tiny_slabs < churned.tiny_slabs);
    CHECK(hak_tiny_class_bytes(cls) == 0);
}

/* 64 MiB in tiny blocks of every size, freed in random order: after a
 * flush RSS is back within 2.5 MiB of the start once the purge delay has
 * passed (the purger gives the emptied slabs' pages back; measured from a
 * start with no purge pending, which used to hide that the check came
 * before the delay). */
static void test_rss_back(void)
{
    if (skipped_without_purge_thread("rss back"))
        return;
    enum { N = 200000 };
    void **blocks = calloc(N, sizeof *blocks);
    CHECK(blocks != NULL);
    rss_bytes(); /* fault in the reading code */
    hak_collect(true); /* the earlier tests' pages, whose purge would otherwise fall inside the count */
    size_t start = rss_bytes();
    uint64_t seed = 12345;
    size_t total = 0;
    for (int i = 0; i < N; i++) {
        size_t size = 1 + rng(&seed) % 1024;
        blocks[i] = malloc(size);
        CHECK(blocks[i] && hak_owns(blocks[i]));
        memset(blocks[i], 0x5a, size);
        total += size;
    }
    size_t peak = rss_bytes();
    CHECK(peak > start + total / 2);
    for (int i = N - 1; i > 0; i--) {
        int j = (int)(rng(&seed) % (uint64_t)(i + 1));
        void *t = blocks[i];
        blocks[i] = blocks[j];
        blocks[j] = t;
    }
    for (int i = 0; i < N; i++)
        free(blocks[i]);
    hak_thread_cache_flush_all();
    /* Under valgrind RSS holds the tool's own memory too, which grows with
     * the code run (translations) and the memory touched (shadow). */
    size_t allowed = getenv("RSS_COUNTS_VALGRIND") ? (size_t)4 << 20 : (size_t)5 << 19;
    size_t flushed = rss_bytes(), end = flushed;
    for (int waited = 0; end > start + allowed && waited < 3000; waited += 50) {
        usleep(50 * 1000);
        end = rss_bytes();
    }
    printf("rss: start %.2f MiB, peak %.2f MiB, after free and flush %.2f MiB, after the purge delay %.2f MiB\n",
           start / 1048576.0, peak / 1048576.0, flushed / 1048576.0, end / 1048576.0);
    CHECK(end <= start + allowed);
    free(blocks);
}

static void test_counters_in_report(void)
{
    static char text[1 << 16]; /* not open_memstream: its buffer would not be hakmem's */
    FILE *out = fmemopen(text, sizeof text - 1, "w");
    CHECK(out != NULL);
    if (!out)
        return;
    hak_stats_print(out);
    fclose(out);
#ifdef HAKMEM_COUNTERS
    CHECK(strstr(text, "debug counters") != NULL);
    CHECK(strstr(text, "free: same thread, fast path") != NULL);
    CHECK(strstr(text, "refill: carved never-used blocks") != NULL);
#else
    CHECK(strstr(text, "debug counters") == NULL);
#endif
}

int main(void)
{
    test_class_api();
    test_flush_class();
    test_random_replacement();
#ifndef __SANITIZE_THREAD__ /* TSan's shadow memory swamps RSS */
    test_rss_back();
#endif
    test_counters_in_report();
    return check_summary("test_tiny_release");
}
