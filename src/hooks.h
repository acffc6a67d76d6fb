/* Layer 3, the profiler's hooks (hooks.c): the one way the tiers reach
 * the profiler and the tuner above them. */
#ifndef HAKMEM_HOOKS_H
#define HAKMEM_HOOKS_H

#include "layout.h"

/* The profiler's hooks: all that the tiers (heap.c, large.c, arena.c)
 * call of the profiler and the tuner above them (sample.c, site.c,
 * kpi.c, learn.c), as init.c sets them before anything is allocated. The
 * tiers never name those files: a sample, a large call and a tuner tick
 * are rare enough for a call through a pointer. */
typedef struct profile_hooks {
    /* slab allocations (heap.c) */
    void (*heap_init)(heap_t *heap);                /* sample_heap_init */
    float (*interval_end)(heap_t *heap, size_t size); /* sample_interval_end */
    void *(*sample)(heap_t *heap, unsigned c, void *b, size_t size, uintptr_t site, float weight,
                    uint64_t start);                /* sample_take */
    void (*tuner_tick)(void);                       /* learn_tick */
    /* large blocks (large.c): every call counts for the site's rules, one
     * in KPI_LARGE_TIMING is timed, and the countdown picks the samples */
    unsigned (*large_alloc)(uintptr_t site, bool bigcache_hit, uint32_t *rules);
    uint32_t (*large_sample)(size_t size, uintptr_t site); /* the sample's record, or 0 (and a page-arena
                                                              block resized in place, arena.c) */
    void (*lifetime)(unsigned index, uint64_t born);
    bool (*wants_touch)(unsigned index);
    void (*touched)(unsigned index, size_t resident, size_t size);
    bool (*large_call)(void);                       /* kpi_large_call */
    void (*latency)(uint64_t ticks, float weight);
    /* samples in the page arenas (arena.c) and the large tier */
    void (*sample_freed)(uint32_t record);
    void (*sample_resized)(uint32_t record, size_t size);
} profile_hooks_t;

extern profile_hooks_t hak_profile_hooks;

/* One large call in this many is timed (large_call), its latency the
 * weight of as many (a power of two). */
#define KPI_LARGE_TIMING 8

#endif
