/* Statistics: the snapshot behind hak_stats_get (report.c prints it). */
#include "alloc.h"
#include "init.h"
#include "mesh.h"
#include "superslab.h"
#include "hakmem.h"

#include <stddef.h>
#include <string.h>

static void stats_fill(hak_stats_t *out)
{
    hak_ensure_init();
    memset(out, 0, sizeof *out);
    out->mapped_bytes = atomic_load(&hak_mapped_bytes);
    out->mapped_peak = atomic_load(&hak_mapped_peak);
    size_t slabs[2] = {0, 0}, bytes[2] = {0, 0};
    superslab_stats(&out->superslabs, &out->superslabs_empty, slabs, bytes);
    out->tiny_slabs = slabs[0];
    out->mid_slabs = slabs[1];
    out->tiny_bytes = bytes[0];
    out->mid_bytes = bytes[1];
    uint64_t counters[HAK_COUNTER_COUNT] = {0};
    heaps_totals(&out->heaps_live, &out->heaps_orphaned, &out->slab_refills, counters);
    out->large_allocs = atomic_load(&hak_large_allocs);
    out->large_huge = atomic_load(&hak_large_huge);
    bigcache_counts(&out->bigcache_hits, &out->bigcache_misses, &out->bigcache_reshaped);
    size_t cached_blocks;
    bigcache_held(&cached_blocks, &out->bigcache_bytes);
    /* Each counter is read on its own while other threads map and free:
     * a difference that came out below zero is taken as none. */
    size_t mappings = atomic_load(&hak_large_mappings), mapped = atomic_load(&hak_large_mapped);
    out->large_blocks = mappings > cached_blocks ? mappings - cached_blocks : 0;
    out->large_bytes = mapped > out->bigcache_bytes ? mapped - out->bigcache_bytes : 0;
    out->rss_bytes = os_rss_bytes();
    os_page_faults(&out->page_faults_minor, &out->page_faults_major);
    out->large_threshold = hak_large_threshold();
    tuner_t t;
    learn_snapshot(&t);
    out->tuner_threshold = tuner_arm_threshold[t.current];
    out->tuner_windows = t.windows;
    out->tuner_moves = t.moves;
    out->hardened = HAK_SECURE;
    mesh_stats(&out->mesh_pages, &out->mesh_pages_ever);
    out->meshing = mesh_enabled();
    arena_stats(&out->arenas, &out->arena_bytes, &out->arena_free_bytes, &out->arena_dirty_bytes,
                &out->arena_pooled_bytes);
}

HAK_EXPORT void hak_stats_get_sized(hak_stats_t *out, size_t size)
{
    hak_stats_t full;
    stats_fill(&full);
    hak_copy_sized(out, size, &full, sizeof full);
}

/* hakmem 0.1.0's struct ended with large_huge. */
HAK_EXPORT void(hak_stats_get)(hak_stats_t *out)
{
    hak_stats_get_sized(out, offsetof(hak_stats_t, large_huge) + sizeof out->large_huge);
}
