/* Layer 7, the profiler and the tuner: sampled allocations (sample.c),
 * the call-site table (site.c), latency and lifetime histograms
 * (kpi.c), the UCB1 tuner of the large threshold (learn.c). The tiers
 * reach them only through hooks.h. */
#ifndef HAKMEM_PROFILE_H
#define HAKMEM_PROFILE_H

#include "heap.h"
#include "hooks.h"
#include "large.h"

/* sample.c: the sampled allocation path, the sample arena and the records
 * of samples in the page arenas. */
void sample_heap_init(heap_t *heap);
uint32_t sample_interval_end(heap_t *heap);
void *sample_take(heap_t *heap, unsigned c, void *b, size_t size, uintptr_t site, uint32_t weight, uint64_t ticks);
void *sample_fast_hit(heap_t *heap, unsigned c, void *b, size_t size, uintptr_t site);
void *sample_take_arena(heap_t *heap, size_t size, size_t align, uintptr_t site, bool zero);
void sample_free(void *p, const char *op);
void sample_arena_freed(uint32_t record);
void sample_arena_resized(uint32_t record, size_t size);
size_t sample_usable_size(const void *p, const char *op);
bool sample_owns(const void *p);
void sample_collect(void);
void sample_fork_prepare(void);
void sample_fork_parent(void);
void sample_fork_child(void);

/* site.c: the call-site table. Returns the site's index (or the shared
 * overflow bucket's). */
unsigned site_record_alloc(uintptr_t site, size_t size, uint32_t weight, bool tracked);
void site_record_free(unsigned index, size_t size, uint32_t weight, uint64_t born); /* born 0: no lifetime */
void site_record_resize(unsigned index, size_t old_size, size_t new_size, uint32_t weight);
unsigned site_record_large(uintptr_t site, size_t size, bool bigcache_hit, uint32_t *rules);
void site_record_touched(unsigned index, size_t resident, size_t size);
bool site_wants_touch(unsigned index);
unsigned site_index_of(uintptr_t site);
void site_note_outgrew_arena(uintptr_t site, size_t size);
bool site_outgrew_arena(uintptr_t site);

/* kpi.c */
void kpi_init(void);
void kpi_record_latency(uint64_t ticks, uint64_t weight);
double kpi_ns_per_tick(bool may_wait); /* may_wait: sleep until 20 ms after init */
void kpi_window_counters(uint64_t *latency_ticks, uint64_t *allocations);
bool kpi_large_call(void); /* counts it; true for the one in KPI_LARGE_TIMING that is timed */
unsigned kpi_bucket_of(uint64_t ticks); /* log-scale histogram bucket: latencies, lifetimes */
double kpi_hist_percentile(const uint64_t *hist, unsigned buckets, double q);

/* learn.c: the UCB1 tuner of the large threshold (HAKMEM_MODE=evolving).
 * The decision rule works on a tuner_t alone, so that a test can feed it
 * rewards and check where it goes. */
#define TUNER_ARMS 6
#define TUNER_WIN_MARGIN 1.08 /* a probed arm must beat the current one by 8% ... */
#define TUNER_WIN_STREAK 3    /* ... in this many windows in a row */
#define TUNER_REST_MAX 64     /* windows a losing probe rests at most, times 1 / its reward's share */

typedef struct tuner {
    int current;              /* the arm in force */
    int probe;                /* the neighbour being tried, or -1 */
    int streak;               /* windows in a row the probe has won */
    uint64_t trials[TUNER_ARMS];
    double reward_sum[TUNER_ARMS];
    uint64_t rest[TUNER_ARMS];       /* windows a losing probe of the arm now waits (doubles each loss) */
    uint64_t rest_until[TUNER_ARMS]; /* the window count before which it is not probed again */
    uint64_t windows, moves;
    uint64_t cooldown_ms, cooldown_until_ms;
    uint64_t rng;
} tuner_t;

extern const size_t tuner_arm_threshold[TUNER_ARMS];
void tuner_start(tuner_t *t, int arm, uint64_t cooldown_ms, uint64_t seed);
double tuner_mean_reward(const tuner_t *t, int arm);
int tuner_decide(tuner_t *t, int arm_ran, double reward, uint64_t now_ms);
void learn_tick(void);
void learn_snapshot(tuner_t *out);
void learn_fork_child(void);
void learn_pin_threshold(size_t threshold);

#endif
