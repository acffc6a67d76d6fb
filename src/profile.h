/* Layer 7, the profiler and the tuner: sampled allocations (sample.c),
 * their call stacks (stack.c), the call-site table (site.c), latency and lifetime histograms
 * (kpi.c), the UCB1 tuner of the large threshold (learn.c). The tiers
 * reach them only through hooks.h. */
#ifndef HAKMEM_PROFILE_H
#define HAKMEM_PROFILE_H

#include "heap.h"
#include "hooks.h"
#include "large.h"

/* sample.c: the sampled allocation path, the sample arena and the records
 * of samples in the page arenas and the large tier. Weights: the
 * allocations a sample stands for (1 / the chance it had to be sampled). */
void sample_heap_init(heap_t *heap);
float sample_interval_end(heap_t *heap, size_t size);
size_t sample_mean_peak(void); /* the largest mean interval the budget set, 0: none raised */
void *sample_take(heap_t *heap, unsigned c, void *b, size_t size, uintptr_t site, float weight, uint64_t start);
void *sample_fast_hit(heap_t *heap, unsigned c, void *b, size_t size, uintptr_t site);
void *sample_take_arena(heap_t *heap, size_t size, size_t align, uintptr_t site, bool zero);
uint32_t sample_large(size_t size, uintptr_t site);
void sample_free(void *p, const char *op);
void sample_freed(uint32_t record);
void sample_resized(uint32_t record, size_t size);
size_t sample_usable_size(const void *p, const char *op);
bool sample_owns(const void *p);
void sample_collect(void);
void sample_fork_prepare(void);
void sample_fork_parent(void);
void sample_fork_child(void);

/* stack.c: the stack table. An entry's counts are estimates: sums of
 * the weights of its samples (times their sizes for bytes). */
#define STACK_DEPTH_MAX 64     /* HAKMEM_PROFILE_DEPTH's bound */
#define STACK_NONE UINT32_MAX  /* no entry: the table could not be mapped */

typedef struct stack_entry {
    uint64_t hash;
    uint32_t frames;   /* its first frame in the frame pool (or a copy's) */
    uint32_t depth;    /* frames: the call site first, then its callers */
    double allocs, bytes, live_objects, live_bytes;
    uint64_t samples, frees;
    size_t min_size, max_size; /* of its samples */
} stack_entry_t;

typedef struct stack_totals {
    double allocs, bytes, live_bytes;
    uint64_t samples;
    size_t min_size, max_size;
} stack_totals_t;

uint32_t stack_sample(uintptr_t site, size_t size, float weight);
void stack_untracked(uint32_t i, size_t size, float weight); /* a sample whose free will not be seen */
void stack_pause(bool pause);
uintptr_t stack_freed(uint32_t i, size_t size, float weight); /* returns the stack's call site, or 0 */
void stack_resized(uint32_t i, size_t old_size, size_t size, float weight);
void stack_table_size(size_t *entries, size_t *frames);
size_t stack_table_copy(stack_entry_t *entries, size_t max_entries, uintptr_t *frames, size_t max_frames);
void stack_sum_by_site(stack_totals_t *totals, size_t sites, unsigned (*index_of)(uintptr_t site));
void stack_fork_prepare(void);
void stack_fork_parent(void);
void stack_fork_child(void);

/* unwind.c: the calling thread's return addresses from site on. */
unsigned unwind_from(uintptr_t site, uintptr_t *frames, unsigned max);
void unwind_fork_prepare(void);
void unwind_fork_parent(void);
void unwind_fork_child(void);

/* site.c: the call-site table: the per-site rules and lifetimes. Returns
 * the site's index (or the shared overflow bucket's). The table is mapped
 * by site_table_init, at init. */
void site_table_init(void);
void site_record_lifetime(unsigned index, uint64_t born); /* born 0: none */
unsigned site_record_large(uintptr_t site, bool bigcache_hit, uint32_t *rules);
void site_record_touched(unsigned index, size_t resident, size_t size);
bool site_wants_touch(unsigned index);
unsigned site_index_of(uintptr_t site);
void site_note_outgrew_arena(uintptr_t site, size_t size);
bool site_outgrew_arena(uintptr_t site);

/* kpi.c */
void kpi_init(void);
void kpi_record_latency(uint64_t ticks, float weight);
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
