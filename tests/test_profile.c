/* The heap profile: a program with known allocation sites finds them at
 * the top of the report with exact figures where every allocation is
 * recorded (HAKMEM_PROFILE_SAMPLE=1), and with unbiased estimates within
 * their statistical error at the default interval (two_sites); its stacks
 * reach main and look through allocation wrappers; pprof's and the folded
 * format name them; sampled blocks are hakmem's and behave like any
 * other; KPIs are filled; site rules fire on the evidence they name;
 * HAKMEM_PROFILE=0 records nothing.
 * Usage: test_profile [on|two_sites|dumps|sampled|budget|off|rules|sample_starting_purger] */
#define _GNU_SOURCE
#include "check.h"
#include "hakmem.h"
#include "rss.h"

#include <dlfcn.h>
#include <errno.h>
#include <signal.h>
#include <malloc.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MANY 400000 /* small allocations per site */

/* Each function is one call site: the return address of its malloc call
 * (noipa: never inlined, cloned or merged with its twins; the barrier
 * keeps the call from becoming a jump, which would make the site the
 * function's caller). */
#define SITE(name)                                                                                                     \
    __attribute__((noipa)) void *name(size_t size)                                                                       \
    {                                                                                                                  \
        void *p = malloc(size);                                                                                        \
        __asm__ volatile("" : "+r"(p));                                                                                \
        return p;                                                                                                      \
    }
SITE(site_small)
SITE(site_kept)
SITE(site_large)
SITE(site_varied)
SITE(site_touched)
SITE(site_thread)
SITE(site_thread_next)
SITE(site_timed)
SITE(site_mid)
SITE(site_arena)
SITE(site_starting_purger)

/* A realloc call site. */
__attribute__((noipa)) void *site_realloc(void *p, size_t size)
{
    void *q = realloc(p, size);
    __asm__ volatile("" : "+r"(q));
    return q;
}

static hak_site_t sites[2048];
static size_t site_count;

static void refresh(void) { site_count = hak_sites_get(sites, 2048); }

/* The site whose address lies in function fn (by dladdr), or NULL. */
static const hak_site_t *find_site(const char *fn)
{
    for (size_t i = 0; i < site_count; i++) {
        Dl_info info;
        if (sites[i].address && dladdr(sites[i].address, &info) && info.dli_sname &&
            strcmp(info.dli_sname, fn) == 0)
            return &sites[i];
    }
    return NULL;
}

static bool near(double value, double expected, double tolerance)
{
    return value >= expected * (1 - tolerance) && value <= expected * (1 + tolerance);
}

static void sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static char *report_text(void (*print)(FILE *))
{
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    print(f);
    fclose(f);
    return text;
}

/* A realloc is an allocation of its new size at its own site, whether
 * the block stays or moves: in the exact mode every one is counted, the
 * page arenas' blocks grown in place, slab blocks kept in place and large
 * blocks grown by mremap alike; the first site keeps its one allocation
 * and the live bytes are the last size's. */
static void test_realloc_counted(void)
{
    static const size_t first[] = {3000, 100000, (size_t)4 << 20}; /* slab, page arena, large */
    static const size_t step[] = {0, 4096, 64 << 10};              /* 0: the same size, in place */
    enum { STEPS = 32 };
    for (int k = 0; k < 3; k++) {
        refresh();
        const hak_site_t *r = find_site("site_realloc"), *v = find_site("site_varied");
        uint64_t r_allocs = r ? r->allocs : 0, r_bytes = r ? r->bytes : 0, v_allocs = v ? v->allocs : 0;
        char *p = site_varied(first[k]);
        uint64_t bytes = 0;
        for (int i = 1; i <= STEPS; i++) {
            size_t size = first[k] + (size_t)i * step[k];
            char *q = site_realloc(p, size);
            CHECK(q != NULL);
            if (!q)
                break;
            p = q;
            bytes += size;
        }
        refresh();
        r = find_site("site_realloc"), v = find_site("site_varied");
        CHECK(r && v && r->allocs - r_allocs == STEPS && r->bytes - r_bytes == bytes && v->allocs - v_allocs == 1);
        free(p);
    }
}

static void test_profile_on(void)
{
    /* site_small: many short-lived 48 B blocks, every one checked */
    int foreign = 0;
    for (int i = 0; i < MANY; i++) {
        unsigned char *p = site_small(48);
        memset(p, 0xab, 48);
        foreign += !hak_owns(p) || !hak_owns(p + 47) || malloc_usable_size(p) < 48;
        free(p);
    }
    CHECK(foreign == 0);
    /* site_kept: 100k blocks of 200 B live for 50 ms */
    enum { KEPT = 100000 };
    static void *kept[KEPT];
    double kept_start = now_ms();
    for (int i = 0; i < KEPT; i++)
        kept[i] = site_kept(200);
    /* site_large: 8 blocks of 8 MiB, counted exactly */
    for (int i = 0; i < 8; i++) {
        char *p = site_large((size_t)8 << 20);
        p[0] = 1;
        free(p);
    }
    refresh();
    const hak_site_t *small = find_site("site_small"), *k = find_site("site_kept"), *large = find_site("site_large");
    CHECK(small && k && large);
    if (!small || !k || !large)
        return;
    /* every allocation recorded, each with weight 1 */
    CHECK(small->allocs == MANY && small->samples == MANY && small->bytes == 48ull * MANY);
    CHECK(small->min_size == 48 && small->max_size == 48 && small->live_bytes == 0);
    CHECK(k->allocs == KEPT && k->live_bytes == 200ull * KEPT);
    CHECK(large->allocs == 8 && large->bytes == (uint64_t)64 << 20 && large->live_bytes == 0);
    CHECK(large->large_allocs == 8 && large->lifetimes == 8);
    sleep_ms(50);
    for (int i = 0; i < KEPT; i++)
        free(kept[i]);
    double kept_ms = now_ms() - kept_start; /* 50 ms and more on a loaded machine */
    refresh();
    k = find_site("site_kept");
    CHECK(k && k->live_bytes == 0);
    /* at least the 50 ms slept, at most the time from the first
     * allocation to the last free; a tick count read as nanoseconds would
     * give 2-3x that */
    CHECK(k && k->lifetimes > 0 && k->lifetime_median_ns >= 40e6 && k->lifetime_median_ns < kept_ms * 1.2e6 + 5e6);
    small = find_site("site_small");
    CHECK(small && small->lifetimes > 0 && small->lifetime_median_ns < 1e6);

    /* the report names the sites, top by bytes and by count */
    char *text = report_text(hak_stats_print);
    const char *by_bytes = strstr(text, "top call sites by bytes"), *by_count = strstr(text, "top call sites by count");
    CHECK(by_bytes && by_count);
    if (by_bytes && by_count) {
        const char *first_bytes = strstr(by_bytes, "site_");
        const char *first_count = strstr(by_count, "site_");
        CHECK(first_bytes && strncmp(first_bytes, "site_large+", 11) == 0);
        CHECK(first_count && strncmp(first_count, "site_small+", 11) == 0);
    }
    CHECK(strstr(text, "latency       p50") != NULL);
    free(text);
    char *json = report_text(hak_stats_print_json);
    CHECK(json[0] == '{' && strstr(json, "\"sites\":[{") && strstr(json, "\"name\":\"site_large+"));
    CHECK(strstr(json, "\"latency_p99_ns\":") && strstr(json, "\"mode\":\"baseline\""));
    free(json);

    hak_kpi_t kpi;
    CHECK(hak_get_kpi(&kpi) == 0);
    CHECK(kpi.latency_samples >= MANY);
    CHECK(kpi.latency_p50_ns > 0 && kpi.latency_p50_ns <= kpi.latency_p95_ns &&
          kpi.latency_p95_ns <= kpi.latency_p99_ns);
    CHECK(kpi.rss_bytes > 0 && kpi.rss_peak_bytes >= kpi.rss_bytes);
    CHECK(kpi.page_faults_minor > 0);
    /* The mean is that of the allocations the samples stand for, as the
     * percentiles are: each sample stands for one allocation here, a
     * timed large call for KPI_LARGE_TIMING (8). */
    hak_kpi_t full;
    CHECK(hak_get_kpi_sized(&full, sizeof full) == 0);
    CHECK(full.latency_allocations >= full.latency_samples &&
          full.latency_allocations <= full.latency_samples + 7 * 8);
    CHECK(full.latency_mean_ns > 0);
    char *line = report_text(hak_stats_print);
    CHECK(strstr(line, "timed samples for ") != NULL && strstr(line, "  process       pid ") != NULL);
    free(line);
}

/* A thread keeps the counts of the site it records last in its heap:
 * hak_sites_get sees them while the thread sleeps, and they stay right
 * once the thread records another site (they move into the table). */
static atomic_int thread_step;

static void wait_thread_step(int step)
{
    while (atomic_load(&thread_step) < step)
        sleep_ms(1);
}

static void *large_blocks_then_wait(void *arg)
{
    (void)arg;
    void *small = malloc(16); /* a heap, where the counts wait */
    __asm__ volatile("" : "+r"(small));
    free(small);
    for (int i = 0; i < 5; i++) {
        char *p = site_thread((size_t)4 << 20);
        if (p)
            p[0] = 1;
        free(p);
    }
    atomic_store(&thread_step, 1);
    wait_thread_step(2);
    free(site_thread_next((size_t)4 << 20));
    atomic_store(&thread_step, 3);
    wait_thread_step(4);
    return NULL;
}

static bool thread_site_counted(void)
{
    const hak_site_t *s = find_site("site_thread");
    return s && s->allocs == 5 && s->large_allocs == 5 && s->bytes == (uint64_t)20 << 20 && s->lifetimes == 5 &&
           s->live_bytes == 0 && s->bigcache_hits == 4;
}

static void test_thread_counts(void)
{
    pthread_t t;
    CHECK(pthread_create(&t, NULL, large_blocks_then_wait, NULL) == 0);
    wait_thread_step(1);
    refresh();
    CHECK(thread_site_counted());
    atomic_store(&thread_step, 2);
    wait_thread_step(3);
    refresh();
    CHECK(thread_site_counted());
    const hak_site_t *next = find_site("site_thread_next");
    CHECK(next && next->large_allocs == 1 && next->live_bytes == 0);
    atomic_store(&thread_step, 4);
    pthread_join(t, NULL);
}

/* A thread times one large call in 8, each standing for 8 in the latency
 * KPIs, and records the lifetimes of those blocks; every call and every
 * free is still counted. (The heap may be one an exited thread left, with
 * its count of calls: any 16 calls in a row hold two timed ones.) */
static uint64_t timed_samples;

static void *large_calls_timed(void *arg)
{
    (void)arg;
    void *small = malloc(16); /* a heap, where the thread counts its large calls */
    __asm__ volatile("" : "+r"(small));
    free(small);
    hak_kpi_t before, after;
    hak_get_kpi(&before);
    for (int i = 0; i < 16; i++)
        free(site_timed((size_t)4 << 20));
    hak_get_kpi(&after);
    timed_samples = after.latency_samples - before.latency_samples;
    return NULL;
}

static void test_large_calls_timed(void)
{
    pthread_t t;
    CHECK(pthread_create(&t, NULL, large_calls_timed, NULL) == 0);
    pthread_join(t, NULL);
    CHECK(timed_samples == 2);
    refresh();
    const hak_site_t *s = find_site("site_timed");
    CHECK(s && s->large_allocs == 16 && s->lifetimes == 16 && s->lifetime_median_ns > 0);
}

/* Sampled blocks behave like others: realloc, calloc, aligned, double free
 * detection is left to test_bad_input. Many allocations, so that many are
 * samples (HAKMEM_PROFILE_SAMPLE=16 in this run). */
static void test_sampled_blocks(void)
{
    int bad = 0;
    for (int i = 0; i < 20000; i++) {
        size_t size = 1 + (size_t)(i * 7919) % 70000;
        unsigned char *p = malloc(size);
        memset(p, (unsigned char)i, size);
        p = realloc(p, size + 100);
        for (size_t j = 0; j < size; j += 97)
            bad += p[j] != (unsigned char)i;
        bad += !hak_owns(p);
        free(p);
        unsigned char *z = calloc(1, size);
        for (size_t j = 0; j < size; j += 61)
            bad += z[j] != 0;
        free(z);
        void *a = aligned_alloc(64, 64 * (1 + (size_t)i % 40));
        bad += ((uintptr_t)a & 63) != 0 || !hak_owns(a);
        free(a);
        void *empty = malloc(0); /* a sampled block of size 0 is live too */
        bad += !empty || !hak_owns(empty);
        free(empty);
    }
    CHECK(bad == 0);
}

/* A sampled block above the tiny sizes is a block of the page arenas,
 * its record (site, size, weight, birth) in a table beside them: blocks
 * of a mid class and of the arenas' sizes kept live from one site each
 * show their live bytes from the samples' weights, and their lifetimes
 * once freed, without a single large block mapped (served by the large
 * tier, each sample cost a mapping: bench mid at two threads lost 37%).
 * A sample of a class whose blocks are aligned by their size (aligned_alloc
 * asks for that) is as aligned. About 256 samples a size here. */
static void test_sampled_blocks_in_arenas(void)
{
    enum { N = 4096 };
    static char *kept[N];
    struct {
        void *(*site)(size_t);
        const char *name;
        size_t size, shrunk; /* shrunk by realloc, 0 for not */
    } kinds[] = {{site_mid, "site_mid", 3000, 0}, {site_arena, "site_arena", 40000, 20000}};
    hak_stats_t before, after;
    hak_stats_get(&before);
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
        for (int i = 0; i < N; i++) {
            kept[i] = kinds[k].site(kinds[k].size);
            memset(kept[i], i, kinds[k].size);
        }
        refresh();
        const hak_site_t *s = find_site(kinds[k].name);
        CHECK(s && s->samples > N / 32 && near((double)s->live_bytes, (double)kinds[k].size * N, 0.25));
        size_t size = kinds[k].size;
        if (kinds[k].shrunk) {
            /* A realloc is an allocation at its own site: the blocks it
             * keeps in place stay the first site's, resized; those the
             * countdown picks move to a sample of the realloc's site. */
            for (int i = 0; i < N; i++) {
                char *q = site_realloc(kept[i], kinds[k].shrunk);
                CHECK(q != NULL);
                if (q)
                    kept[i] = q;
            }
            size = kinds[k].shrunk;
            refresh();
            s = find_site(kinds[k].name);
            const hak_site_t *r = find_site("site_realloc");
            CHECK(s && r && r->allocs > 0 &&
                  near((double)s->live_bytes + (double)r->live_bytes, (double)size * N, 0.25));
        }
        int bad = 0;
        for (int i = 0; i < N; i++) {
            bad += !hak_owns(kept[i]) || kept[i][size - 1] != (char)i;
            free(kept[i]);
        }
        CHECK(bad == 0);
        refresh();
        s = find_site(kinds[k].name);
        CHECK(s && s->live_bytes < size * 64 && s->lifetimes >= s->samples - 1);
    }
    int misaligned = 0;
    for (int i = 0; i < N; i++) {
        char *p = aligned_alloc(8192, 8192);
        misaligned += p == NULL || ((uintptr_t)p & 8191) != 0;
        free(p);
    }
    CHECK(misaligned == 0);
    hak_stats_get(&after);
    CHECK(after.large_allocs == before.large_allocs);
}

/* A sampled tiny block takes a slot of the sample arena no larger than
 * its class needs: 1 in 16 of 200,000 16 B blocks here (12,500 samples),
 * which in 1 KiB slots took 12 MiB, four times the blocks themselves. */
static void test_sampled_tiny_slots(void)
{
    enum { COUNT = 200000 };
    static void *blocks[COUNT];
    memset(blocks, 0, sizeof blocks); /* resident before the count starts */
    hak_collect(true); /* the earlier tests' pages, whose purge would otherwise fall inside the count */
    size_t before = rss_bytes();
    for (int i = 0; i < COUNT; i++) {
        blocks[i] = malloc(16);
        memset(blocks[i], 1, 16);
    }
    size_t grown = rss_bytes() - before;
    for (int i = 0; i < COUNT; i++)
        free(blocks[i]);
    printf("sampled tiny blocks: %zu KiB resident for %zu KiB asked\n", grown >> 10, (size_t)COUNT * 16 >> 10);
    CHECK(grown < 2 * COUNT * 16);
}

/* The child of test_sample_starting_purger, a young program in a fresh
 * image: a large block freed leaves pages to purge, which wait untold
 * while the program is young (a purge delay); past that, the next refill
 * starts the purger thread, and pthread_create allocates on the same
 * heap (the new thread's DTV, from a class never used: a refill too).
 * `warmup` allocations first move the sampling countdown. Exit 0 if the
 * malloc at site_starting_purger was a sample and the thread started
 * inside it, 1 if not; a sample recorded as free aborts at its free. */
static int sample_starting_purger_child(int warmup)
{
    char *volatile large = malloc((size_t)2 << 20);
    memset(large, 1, (size_t)2 << 20);
    free(large);
    for (int i = 0; i < warmup; i++)
        free(site_small(16));
    sleep_ms(40); /* HAKMEM_PURGE_DELAY_MS=20: no longer young */
    int threads = thread_count();
    void *p = site_starting_purger(100);
    bool started = thread_count() > threads;
    refresh();
    const hak_site_t *s = find_site("site_starting_purger");
    free(p);
    return started && s && s->samples == 1 ? 0 : 1;
}

/* A sample's interval ends where the countdown reaches 0. A refill that
 * was a sample and then started the purger thread ended it only later,
 * when it recorded the sample, after pthread_create's allocation had
 * been a sample of its own and started a new interval: the first sample
 * got a weight of 0, which marks a free record, and its free aborted as a
 * double free (redis-benchmark under load, 1 run in 100 or so). At
 * HAKMEM_PROFILE_SAMPLE=2 (intervals of 2 or 3), one warm-up count in
 * three or so makes the refill a sample. */
static void test_sample_starting_purger(void)
{
    enum { RUNS = 36 };
    int crashed = 0, hits = 0;
    for (int i = 0; i < RUNS; i++) {
        pid_t pid = fork();
        if (pid == 0) {
            setenv("HAKMEM_PROFILE_SAMPLE", "2", 1);
            setenv("HAKMEM_PURGE_DELAY_MS", "20", 1);
            char warmup[16];
            snprintf(warmup, sizeof warmup, "%d", i % 3);
            exec_self((char *[]){"test_profile", "sample_starting_purger_child", warmup, NULL});
            _exit(99);
        }
        int status = 0;
        waitpid(pid, &status, 0);
        crashed += !WIFEXITED(status) || WEXITSTATUS(status) > 1;
        hits += WIFEXITED(status) && WEXITSTATUS(status) == 0;
    }
    printf("sample starting the purger: %d of %d runs, %d crashed\n", hits, RUNS, crashed);
    CHECK(crashed == 0);
    CHECK(hits >= RUNS / 12); /* else the test no longer sets up what it checks (12 a run here) */
}

/* The two sites of a program that the report must never confuse: one
 * allocating few large blocks (4,000 of 300 KB: 1.1 GiB), one very many
 * small ones (4 M of 24 B: 92 MiB), at the default interval. The site
 * that matters for memory is found and comes first by bytes, and every
 * estimate lies within 5 standard deviations of the truth (a chance of
 * 6 in 10^7 to fail by bad luck): an allocation of s bytes is sampled
 * with chance p = 1 - exp(-s / interval), so that the relative error of
 * n allocations' estimate has deviation sqrt((1 - p) / (p n)). Sampling
 * one allocation in 4096 whatever its size, the report left the large
 * site out in 8 runs of 20. Its stacks reach main through a wrapper that
 * the report looks through (xmalloc), and pprof's and the folded
 * profile name them. */
SITE(site_big)
SITE(xmalloc)
__attribute__((noipa)) void *via_wrapper(size_t size)
{
    void *p = xmalloc(size);
    __asm__ volatile("" : "+r"(p));
    return p;
}

/* An estimate from n allocations of size bytes, sampled at a mean
 * interval of at most `interval` bytes, within 5 standard deviations of
 * the truth. */
static bool estimate_holds_at(double estimate, double truth, size_t size, double n, double interval)
{
    double p = -expm1(-(double)size / interval), deviation = sqrt((1 - p) / (p * n));
    bool holds = fabs(estimate / truth - 1) <= 5 * deviation;
    if (!holds)
        printf("estimate %.0f against %.0f: off by %.1f%%, 5 deviations are %.1f%%\n", estimate, truth,
               100 * fabs(estimate / truth - 1), 500 * deviation);
    return holds;
}

/* The same at HAKMEM_PROFILE_SAMPLE's interval. */
static bool estimate_holds(double estimate, double truth, size_t size, double n)
{
    const char *env = getenv("HAKMEM_PROFILE_SAMPLE");
    double interval = env ? atof(env) * (strchr(env, 'K') ? 1024 : strchr(env, 'M') ? 1048576 : 1) : 2097152;
    return estimate_holds_at(estimate, truth, size, n, interval);
}

static char *file_text(const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return NULL;
    static char text[1 << 20];
    size_t n = fread(text, 1, sizeof text - 1, f);
    text[n] = 0;
    fclose(f);
    return text;
}

static void test_two_sites(void)
{
    enum { BIG = 4000, SMALL = 4000000, WRAPPED = 100000 };
    static void *keep[64];
    for (int i = 0; i < BIG; i++) {
        char *p = site_big(300000);
        p[0] = 1;
        free(keep[i % 64]);
        keep[i % 64] = p;
    }
    for (int i = 0; i < SMALL; i++)
        free(site_small(24));
    for (int i = 0; i < WRAPPED; i++)
        free(via_wrapper(1000));
    refresh();
    const hak_site_t *big = find_site("site_big"), *small = find_site("site_small");
    CHECK(big && small);
    if (!big || !small)
        return;
    CHECK(estimate_holds((double)big->allocs, BIG, 300000, BIG));
    CHECK(estimate_holds((double)big->bytes, 300000.0 * BIG, 300000, BIG));
    CHECK(estimate_holds((double)big->live_bytes, 300000.0 * 64, 300000, 64));
    CHECK(estimate_holds((double)small->allocs, SMALL, 24, SMALL));
    CHECK(estimate_holds((double)small->bytes, 24.0 * SMALL, 24, SMALL));
    CHECK(big->min_size == 300000 && big->max_size == 300000 && small->max_size == 24);
    printf("two sites: large %llu allocs (%+.1f%%), %+.1f%% bytes; small %llu allocs (%+.1f%%), %+.1f%% bytes; "
           "%llu and %llu samples\n",
           (unsigned long long)big->allocs, 100.0 * ((double)big->allocs / BIG - 1),
           100.0 * ((double)big->bytes / (300000.0 * BIG) - 1), (unsigned long long)small->allocs,
           100.0 * ((double)small->allocs / SMALL - 1), 100.0 * ((double)small->bytes / (24.0 * SMALL) - 1),
           (unsigned long long)big->samples, (unsigned long long)small->samples);

    char *text = report_text(hak_stats_print);
    const char *by_bytes = strstr(text, "top call sites by bytes");
    const char *first = by_bytes ? strstr(by_bytes, "site_") : NULL;
    CHECK(first && strncmp(first, "site_big+", 9) == 0);
    const char *wrapped = strstr(text, "via xmalloc");
    CHECK(wrapped != NULL); /* the site is via_wrapper's call, xmalloc looked through */
    CHECK(by_bytes && strstr(by_bytes, "via_wrapper+") && strstr(by_bytes, "from main+"));
    /* the leak view: the 64 blocks kept, and nothing else */
    const char *live = strstr(text, "top call sites by live bytes");
    const char *live_first = live ? strstr(live, "site_") : NULL;
    CHECK(live_first && strncmp(live_first, "site_big+", 9) == 0 && !strstr(live_first + 1, "site_small+"));
    free(text);

    char path[64];
    snprintf(path, sizeof path, "/tmp/hakmem_profile_%d", (int)getpid());
    CHECK(hak_profile_dump(path, "pprof") == 0);
    const char *heap = file_text(path);
    CHECK(heap && strncmp(heap, "heap profile: ", 14) == 0 && strstr(heap, "] @ heapprofile\n") &&
          strstr(heap, "\nMAPPED_LIBRARIES:\n") && strstr(heap, "test_profile"));
    CHECK(hak_profile_dump(path, "folded") == 0);
    const char *folded = file_text(path);
    CHECK(folded && strstr(folded, ";main;") && strstr(folded, ";site_big ") && strstr(folded, ";via_wrapper;xmalloc "));
    CHECK(hak_profile_dump(path, "svg") == -1 && errno == EINVAL);
    unlink(path);
    for (int i = 0; i < 64; i++)
        free(keep[i]);
}

/* Dumps while the program runs, in this test's environment: at
 * HAKMEM_PROFILE_SIGNAL (SIGUSR2; the handler only asks, the next
 * allocation that reaches a slow path writes it) and each time the live
 * bytes grow past the last such dump's by HAKMEM_PROFILE_PEAK (1 MiB),
 * into HAKMEM_PROFILE_FILE's path (dumps.%p) with .1, .2, ... appended.
 * Ends with _exit: the report at exit would go to the same path. */
static void test_dumps(void)
{
    char base[256], path[300];
    snprintf(base, sizeof base, "dumps.%d", (int)getpid());
    raise(SIGUSR2);
    for (int round = 0; round < 20; round++) { /* tiny refills: slow paths */
        void *p[2000];
        for (int i = 0; i < 2000; i++)
            p[i] = malloc(64 + (size_t)round);
        for (int i = 0; i < 2000; i++)
            free(p[i]);
    }
    snprintf(path, sizeof path, "%s.1", base);
    const char *first = file_text(path);
    CHECK(first && strncmp(first, "hakmem ", 7) == 0 && strstr(first, "top call sites by live bytes"));
    enum { KEPT = 100 };
    static void *kept[KEPT]; /* 4 MB live: past 1, 2 and 3 MiB, a dump each */
    for (int i = 0; i < KEPT; i++)
        kept[i] = site_kept(40000);
    snprintf(path, sizeof path, "%s.4", base);
    const char *fourth = file_text(path);
    const char *live = fourth ? strstr(fourth, "top call sites by live bytes") : NULL;
    CHECK(live && strstr(live, "site_kept+"));
    for (int i = 0; i < KEPT; i++)
        free(kept[i]);
    for (int n = 1; n <= 8; n++) {
        snprintf(path, sizeof path, "%s.%d", base, n);
        unlink(path);
    }
    fflush(stdout);
    _exit(check_summary("test_profile"));
}

/* HAKMEM_PROFILE_SAMPLE=4K and 24 B blocks: a sample every 170 or so,
 * which would take far more than HAKMEM_PROFILE_BUDGET's 1% of the time.
 * The thread's mean interval grows, the report says to what, and the
 * estimates, weighted at the mean in force, hold within the error of the
 * largest mean (a bound: each allocation was sampled at one no larger).
 * With HAKMEM_PROFILE_BUDGET=100 (unlimited) the mean stays. */
static void test_budget(bool unlimited)
{
    enum { N = 4000000 };
    for (int i = 0; i < N; i++)
        free(site_small(24));
    refresh();
    const hak_site_t *small = find_site("site_small");
    char *json = report_text(hak_stats_print_json);
    const char *field = strstr(json, "\"sample_bytes_max\":");
    double peak = field ? strtod(field + strlen("\"sample_bytes_max\":"), NULL) : 0;
    CHECK(small && field);
    CHECK(unlimited ? peak == 4096 : peak > 4096);
    CHECK(small && estimate_holds_at((double)small->allocs, N, 24, N, peak));
    free(json);
    char *text = report_text(hak_stats_print);
    CHECK(unlimited ? !strstr(text, "would have taken more than") : strstr(text, "would have taken more than 1% of their time") != NULL);
    free(text);
    printf("budget: mean interval up to %.0f bytes, %llu samples, %+.1f%% allocs\n", peak,
           small ? (unsigned long long)small->samples : 0ull, small ? 100.0 * ((double)small->allocs / N - 1) : 0.0);
}

static void test_profile_off(void)
{
    for (int i = 0; i < MANY; i++)
        free(site_small(48));
    free(site_large((size_t)4 << 20));
    refresh();
    CHECK(site_count == 0);
    hak_kpi_t kpi;
    hak_get_kpi(&kpi);
    CHECK(kpi.latency_samples == 0);
}

/* HAKMEM_SITE_RULES=1: a site whose large blocks never fit BigCache loses
 * it; a site that touches all of its new blocks gets them pre-warmed. */
static void test_rules(void)
{
    enum { N = 16 };
    void *held[N];
    for (int i = 0; i < N; i++) /* all live at once: BigCache can serve none */
        held[i] = site_varied((size_t)(2 + i) << 20);
    for (int i = 0; i < N; i++)
        free(held[i]);
    hak_stats_t before, after;
    hak_stats_get(&before);
    /* Larger than any block cached above (a hit would hand one of them
     * back), small enough to be cached were the site not ruled out. */
    free(site_varied((size_t)40 << 20));
    hak_stats_get(&after);
    CHECK(after.bigcache_bytes == before.bigcache_bytes); /* unmapped, not cached */

    for (int i = 0; i < 8; i++)
        held[i] = site_touched((size_t)2 << 20);
    for (int i = 0; i < 8; i++) {
        memset(held[i], 1, (size_t)2 << 20);
        __asm__ volatile("" : : "r"(held[i]) : "memory"); /* the stores must happen before free */
        free(held[i]);
    }
    refresh();
    const hak_site_t *varied = find_site("site_varied"), *touched = find_site("site_touched");
    CHECK(varied && varied->no_bigcache && varied->no_bigcache_evidence == N && !varied->prewarm);
    CHECK(touched && touched->prewarm && touched->prewarm_evidence >= 90 && !touched->no_bigcache);
    char *text = report_text(hak_stats_print);
    CHECK(strstr(text, "BigCache off: no hit in its first 16 large blocks") != NULL);
    CHECK(strstr(text, "pre-warm on: its first new blocks were") != NULL);
    free(text);
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "on";
    if (!strcmp(mode, "on"))
        test_profile_on(), test_thread_counts(), test_large_calls_timed(), test_realloc_counted();
    else if (!strcmp(mode, "two_sites"))
        test_two_sites();
    else if (!strcmp(mode, "dumps"))
        test_dumps();
    else if (!strcmp(mode, "sampled"))
        test_sampled_blocks(), test_sampled_blocks_in_arenas(), test_sampled_tiny_slots();
    else if (!strcmp(mode, "budget"))
        test_budget(getenv("HAKMEM_PROFILE_BUDGET") && !strcmp(getenv("HAKMEM_PROFILE_BUDGET"), "100"));
    else if (!strcmp(mode, "off"))
        test_profile_off();
    else if (!strcmp(mode, "rules"))
        test_rules();
    else if (!strcmp(mode, "sample_starting_purger"))
        test_sample_starting_purger();
    else if (!strcmp(mode, "sample_starting_purger_child"))
        return sample_starting_purger_child(argc > 2 ? atoi(argv[2]) : 0);
    return check_summary("test_profile");
}
