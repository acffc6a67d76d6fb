/* hakmem: a general-purpose malloc replacement.
 *
 * Preload it (LD_PRELOAD=libhakmem.so) or link it (-lhakmem) and the whole
 * malloc family, C++ new and delete included, is served by hakmem. This
 * header adds what the standard interface lacks: ownership queries,
 * statistics, and an explicit return of memory to the OS. Every function
 * here is safe to call from any thread. */
#ifndef HAKMEM_H
#define HAKMEM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

#define HAKMEM_VERSION "0.1.0"

/* The library's version string (HAKMEM_VERSION of the build). */
const char *hak_version(void);

/* The malloc family under hakmem's own names: the same allocator as the
 * standard names, for a program that keeps another malloc beside hakmem,
 * and the only names in a build with HAKMEM_OVERRIDE=OFF. */
void *hak_malloc(size_t size);
void *hak_calloc(size_t n, size_t size);
void *hak_realloc(void *p, size_t size);
void *hak_aligned_alloc(size_t align, size_t size);
void hak_free(void *p);
size_t hak_usable_size(const void *p);

/* True if p points into a block hakmem handed out: lets a program (or a
 * test) prove that its memory really comes from hakmem. */
bool hak_owns(const void *p);

/* Return memory to the OS now: the calling thread's empty slabs and the
 * blocks its caches and its lane's pools hold, the slabs of exited
 * threads, and free pages. With force, pages are purged at once
 * whatever HAKMEM_PURGE_DELAY_MS says and every empty SuperSlab beyond
 * the reserve is unmapped; without, only pages past the delay. malloc_trim
 * calls hak_collect(true). */
void hak_collect(bool force);

/* Tiny size classes (blocks up to 1 KiB): how many there are, and the one
 * that serves a request of `size` bytes (-1 above 1 KiB). */
int hak_tiny_class_count(void);
int hak_tiny_size_class(size_t size);

/* Hand the blocks the calling thread caches for a tiny class back to their
 * slab, so that slabs left empty are seen and their pages go back to the
 * pool for any class (and to the OS after HAKMEM_PURGE_DELAY_MS). Returns
 * 0, or -1 with errno EINVAL when class_index is out of range. */
int hak_thread_cache_flush(int class_index);

/* The same for every size class the calling thread caches, tiny and mid. */
void hak_thread_cache_flush_all(void);

/* The names of hakmem 0.1.0, kept for a release: hakmem has no magazines. */
__attribute__((deprecated("use hak_thread_cache_flush"))) int hak_tiny_magazine_flush(int class_index);
__attribute__((deprecated("use hak_thread_cache_flush_all"))) void hak_tiny_magazine_flush_all(void);

/* Bytes in blocks of a tiny class that are not back on their slab's free
 * list (handed out, in a thread's cache, or freed by another thread and not
 * yet taken back), over all threads: 0 for a class once every block was
 * freed and the caches flushed. Profiling samples are served outside the
 * slabs and do not count. Returns (size_t)-1 with errno EINVAL when
 * class_index is out of range. */
size_t hak_tiny_class_bytes(int class_index);

typedef struct hak_stats {
    size_t mapped_bytes;       /* address space hakmem has mapped now */
    size_t mapped_peak;        /* and at most */
    size_t superslabs;         /* 2 MiB SuperSlabs mapped */
    size_t superslabs_empty;   /* of which hold no slab (the reserve) */
    size_t tiny_slabs;         /* slabs of blocks up to 1 KiB */
    size_t mid_slabs;          /* slabs of larger blocks */
    size_t tiny_bytes;         /* bytes in tiny blocks handed out */
    size_t mid_bytes;          /* bytes in mid blocks handed out */
    uint64_t large_allocs;     /* large blocks (own mapping) ever mapped */
    uint64_t bigcache_hits;    /* large allocations served from BigCache */
    uint64_t bigcache_misses;  /* large allocations BigCache could not serve */
    size_t bigcache_bytes;     /* mapped bytes of freed large blocks BigCache holds */
    uint64_t slab_refills;     /* times a thread took another slab */
    size_t heaps_live;         /* threads with a heap */
    size_t heaps_orphaned;     /* heaps of exited threads awaiting reuse */
    size_t rss_bytes;          /* resident set size of the process */
    uint64_t page_faults_minor;
    uint64_t page_faults_major;
    size_t large_threshold;    /* blocks above get their own mapping now (a tuner probe included) */
    size_t tuner_threshold;    /* HAKMEM_MODE=evolving: the threshold the tuner chose */
    uint64_t tuner_windows;    /* windows judged so far */
    uint64_t tuner_moves;      /* threshold moves made */
    bool hardened;             /* the hardened build (libhakmem-secure, HAKMEM_SECURE) */
    size_t arenas;             /* 64 MiB page arenas (blocks above 16 KiB up to the large threshold) */
    size_t arena_bytes;        /* bytes in arena blocks handed out (whole pages) */
    size_t arena_free_bytes;   /* free pages between them */
    size_t arena_dirty_bytes;  /* free pages, or freed wilderness, that may be resident: awaiting a purge */
    uint64_t large_huge;       /* large blocks whose mapping asked for transparent huge pages (HAKMEM_HUGEPAGES) */
    uint64_t bigcache_reshaped; /* of the misses, those served by resizing a cached block the site's full ring would evict */
    size_t large_blocks;       /* large blocks handed out and not yet freed */
    size_t large_bytes;        /* their mappings' bytes (BigCache's not counted) */
    size_t arena_pooled_bytes; /* of arena_bytes, freed blocks waiting in the lanes' pools for reuse */
    size_t mesh_pages;         /* HAKMEM_MESH: 4 KiB pages given back now by meshing (two slabs' pages on one) */
    uint64_t mesh_pages_ever;  /* pages meshed since the start */
    bool meshing;              /* HAKMEM_MESH=on and the system allows it (else the report says why not) */
} hak_stats_t;

/* Fill *out with a snapshot (figures of other threads may be a moment old).
 *
 * hak_stats_t, hak_kpi_t and hak_site_t only ever grow at their end. Their
 * getters are called through macros that pass the size of the struct in
 * the hakmem.h the program was compiled with, so that a newer library writes only the
 * fields the program knows of (nothing past its struct, nor a wrong stride
 * in hak_sites_get's array), and an older one zeroes the fields it lacks.
 * The plain names are also functions, for programs built before the sizes
 * were passed and for dlsym: they write the structs as hakmem 0.1.0 had
 * them. */
void hak_stats_get_sized(hak_stats_t *out, size_t size);
void(hak_stats_get)(hak_stats_t *out);
#define hak_stats_get(out) hak_stats_get_sized((out), sizeof(hak_stats_t))

/* Print the statistics report (what HAKMEM_STATS=1 prints at exit). */
void hak_stats_print(FILE *out);

/* The same report as one JSON object, for tools. */
void hak_stats_print_json(FILE *out);

/* Key performance indicators. Latencies come from sampled allocations
 * (one in HAKMEM_PROFILE_SAMPLE per thread, timed with the CPU's tick
 * counter, the timer's own cost included), each weighted by the
 * allocations it stands for: the percentiles and the mean are those of
 * latency_allocations allocations, estimated from latency_samples
 * timings. None without profiling. */
typedef struct hak_kpi {
    uint64_t latency_samples;
    double latency_mean_ns;
    double latency_p50_ns;
    double latency_p95_ns;
    double latency_p99_ns;
    uint64_t page_faults_minor; /* soft faults of the process */
    uint64_t page_faults_major; /* hard faults */
    size_t rss_bytes;           /* resident set now */
    size_t rss_peak_bytes;      /* and at most */
    uint64_t latency_allocations; /* the allocations the timed samples stand for */
} hak_kpi_t;

/* Fill *out; returns 0. */
int hak_get_kpi_sized(hak_kpi_t *out, size_t size);
int(hak_get_kpi)(hak_kpi_t *out);
#define hak_get_kpi(out) hak_get_kpi_sized((out), sizeof(hak_kpi_t))

/* One call site: a return address of a malloc-family call. Counts and
 * bytes of allocations up to the large threshold are estimated from
 * samples (each stands for the allocations since the previous one); large
 * blocks are counted exactly. */
typedef struct hak_site {
    void *address;              /* NULL: the shared bucket of sites the table had no room for */
    uint64_t allocs;
    uint64_t bytes;             /* asked for */
    uint64_t live_bytes;        /* allocated and not yet freed */
    uint64_t samples;           /* recorded allocations */
    size_t min_size, max_size;  /* of the recorded ones */
    uint64_t lifetimes;         /* recorded frees */
    double lifetime_median_ns;
    uint64_t large_allocs;      /* blocks above the large threshold */
    uint64_t bigcache_hits;     /* of which BigCache served */
    bool no_bigcache;           /* site rule: BigCache off (after no_bigcache_evidence allocations without a hit) */
    bool prewarm;               /* site rule: pages faulted in at once (blocks prewarm_evidence % touched) */
    uint64_t no_bigcache_evidence, prewarm_evidence;
    size_t outgrew_arena;       /* realloc here moved a block of this size, grown in a page arena past the large
                                   threshold, out of it: the site's buffers now leave at the threshold (0: none) */
} hak_site_t;

/* Copy up to max sites into out (in table order); returns how many. */
size_t hak_sites_get_sized(hak_site_t *out, size_t max, size_t size);
size_t(hak_sites_get)(hak_site_t *out, size_t max);
#define hak_sites_get(out, max) hak_sites_get_sized((out), (max), sizeof(hak_site_t))

/* Write the report now into the file at path: format "text", "json",
 * "pprof" (google-pprof's heap profile) or "folded" (folded stacks for
 * flame graphs); NULL for HAKMEM_STATS's format, text if it names none.
 * Returns 0, or -1 with errno set (EINVAL: an unknown format). */
int hak_profile_dump(const char *path, const char *format);

/* Print the option table: name, type, default, meaning; tab-separated. */
void hak_options_print(FILE *out);

#ifdef __cplusplus
}
#endif

#endif
