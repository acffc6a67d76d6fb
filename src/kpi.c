/* KPIs: allocation latency from sampled timings (a log-scale histogram of
 * clock ticks, each sample weighted by the allocations it stands for, so
 * that the percentiles are those of all allocations), page faults and RSS;
 * hak_get_kpi. They change only at samples and large-block calls (one in
 * KPI_LARGE_TIMING of those timed): the histogram in global atomics, the
 * totals in the calling thread's heap (heap_profile_t), summed over heaps
 * when read. */
#include "profile.h"
#include "init.h"
#include "hakmem.h"

#include <time.h>

/* Buckets: values below 8 exactly, then 4 per doubling (at most 19% wide). */
#define LATENCY_BUCKETS 256

static _Atomic uint64_t latency_hist[LATENCY_BUCKETS];
/* enum kpi_total: samples timed; the allocations they stand for (the sum
 * of their weights); the sum of ticks x weight, the estimated time of
 * those allocations; large-tier allocations (all counted, one in
 * KPI_LARGE_TIMING timed). These are the totals of threads without a heap,
 * the others' are in their heaps. */
static _Atomic uint64_t heapless_totals[KPI_TOTALS];

/* Tick rate: from two readings of ticks and nanoseconds far enough apart. */
static uint64_t calib_ticks, calib_ns;

void kpi_init(void)
{
    calib_ticks = hak_ticks();
    calib_ns = os_now_ns();
}

unsigned kpi_bucket_of(uint64_t v)
{
    if (v < 8)
        return (unsigned)v;
    unsigned b = 63u - (unsigned)__builtin_clzll(v);
    return 8 + (b - 3) * 4 + (unsigned)((v >> (b - 2)) & 3);
}

/* The middle of a bucket's range. */
static double bucket_value(unsigned i)
{
    if (i < 8)
        return i;
    unsigned b = (i - 8) / 4 + 3, sub = (i - 8) % 4;
    double low = (double)((4 + (uint64_t)sub) << (b - 2));
    return low + (double)((uint64_t)1 << (b - 2)) / 2;
}

/* Add n to a total: the calling thread's, or the heapless one. Returns
 * the total before. */
static uint64_t total_add(enum kpi_total t, uint64_t n)
{
    heap_t *heap = heap_get();
    if (heap == &hak_empty_heap)
        return atomic_fetch_add_explicit(&heapless_totals[t], n, memory_order_relaxed);
    _Atomic uint64_t *total = &heap->profile.kpi_totals[t];
    uint64_t before = atomic_load_explicit(total, memory_order_relaxed);
    atomic_store_explicit(total, before + n, memory_order_relaxed); /* no lock prefix: only this thread writes it */
    return before;
}

/* A total over all threads, a moment old. */
static uint64_t total_of(enum kpi_total t)
{
    uint64_t total = atomic_load_explicit(&heapless_totals[t], memory_order_relaxed);
    for (heap_t *heap = heaps_all(); heap; heap = heap->next_all)
        total += atomic_load_explicit(&heap->profile.kpi_totals[t], memory_order_relaxed);
    return total;
}

/* weight: the allocations the timing stands for, rounded to a whole
 * number for the histogram and the totals alike. */
void kpi_record_latency(uint64_t ticks, float weight_estimate)
{
    uint64_t weight = (uint64_t)(weight_estimate + 0.5f);
    ADD_UNLOCKED(&latency_hist[kpi_bucket_of(ticks)], weight);
    total_add(KPI_LATENCY_SAMPLES, 1);
    total_add(KPI_LATENCY_WEIGHT, weight);
    total_add(KPI_LATENCY_TICKS, ticks * weight);
}

/* Large calls are timed one in KPI_LARGE_TIMING per thread (threads
 * without a heap share one count), the first included, and each timed one
 * stands for as many: three clock reads per malloc/free pair (the call's
 * start and end, and the free for the lifetime) were 30 ns of vm's 2.3 us
 * iteration. */
bool kpi_large_call(void) { return total_add(KPI_LARGE_CALLS, 1) % KPI_LARGE_TIMING == 0; }

/* Totals so far, estimated from the timed samples: the ticks spent
 * allocating, and the allocations they stand for. */
void kpi_window_counters(uint64_t *latency_ticks, uint64_t *allocations)
{
    *latency_ticks = total_of(KPI_LATENCY_TICKS);
    *allocations = total_of(KPI_LATENCY_WEIGHT);
}

/* Nanoseconds per tick, from the clock and the tick counter read at init
 * and now. A caller that may wait (the API's figures) and comes less than
 * 20 ms after init sleeps the rest, so that the rate is within 0.1%; the
 * tuner does not, since its window closes inside some malloc (a sleep of
 * up to 20 ms there, at a window of under 20 ms): its windows last 1 ms
 * at least, a rate within a few parts in a thousand, where its margin is
 * 8%. */
double kpi_ns_per_tick(bool may_wait)
{
    hak_ensure_init();
    uint64_t ns = os_now_ns();
    if (may_wait && ns - calib_ns < 20000000u) {
        struct timespec wait = {0, (long)(20000000u - (ns - calib_ns))};
        nanosleep(&wait, NULL);
        ns = os_now_ns();
    }
    uint64_t ticks = hak_ticks();
    return ticks > calib_ticks ? (double)(ns - calib_ns) / (double)(ticks - calib_ticks) : 1.0;
}

/* The value (in ticks) below which a fraction q of a histogram of
 * kpi_bucket_of buckets lies; 0 when it is empty. */
double kpi_hist_percentile(const uint64_t *hist, unsigned buckets, double q)
{
    uint64_t total = 0;
    for (unsigned i = 0; i < buckets; i++)
        total += hist[i];
    if (!total)
        return 0;
    uint64_t rank = (uint64_t)(q * (double)total), seen = 0;
    for (unsigned i = 0; i < buckets; i++) {
        seen += hist[i];
        if (seen > rank)
            return bucket_value(i);
    }
    return bucket_value(buckets - 1);
}


static void kpi_fill(hak_kpi_t *out)
{
    hak_ensure_init();
    double ns_per_tick = kpi_ns_per_tick(true);
    uint64_t hist[LATENCY_BUCKETS];
    for (unsigned i = 0; i < LATENCY_BUCKETS; i++)
        hist[i] = atomic_load_explicit(&latency_hist[i], memory_order_relaxed);
    out->latency_samples = total_of(KPI_LATENCY_SAMPLES);
    out->latency_p50_ns = kpi_hist_percentile(hist, LATENCY_BUCKETS, 0.50) * ns_per_tick;
    out->latency_p95_ns = kpi_hist_percentile(hist, LATENCY_BUCKETS, 0.95) * ns_per_tick;
    out->latency_p99_ns = kpi_hist_percentile(hist, LATENCY_BUCKETS, 0.99) * ns_per_tick;
    /* The mean of the same weighted samples as the percentiles: over the
     * allocations they stand for, not over every allocation made (those
     * since a thread's last sample have none yet). */
    out->latency_allocations = total_of(KPI_LATENCY_WEIGHT);
    out->latency_mean_ns = out->latency_allocations
                               ? (double)total_of(KPI_LATENCY_TICKS) * ns_per_tick / (double)out->latency_allocations
                               : 0;
    os_page_faults(&out->page_faults_minor, &out->page_faults_major);
    out->rss_bytes = os_rss_bytes();
    out->rss_peak_bytes = os_rss_peak_bytes();
}

HAK_EXPORT int hak_get_kpi_sized(hak_kpi_t *out, size_t size)
{
    hak_kpi_t full;
    kpi_fill(&full);
    hak_copy_sized(out, size, &full, sizeof full);
    return 0;
}

/* hakmem 0.1.0's struct ended with rss_peak_bytes. */
HAK_EXPORT int(hak_get_kpi)(hak_kpi_t *out)
{
    return hak_get_kpi_sized(out, offsetof(hak_kpi_t, rss_peak_bytes) + sizeof out->rss_peak_bytes);
}
