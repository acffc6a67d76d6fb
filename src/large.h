/* Layer 5, large blocks (large.c): blocks above the large threshold in
 * mappings of their own, and BigCache (bigcache.c), which keeps freed
 * ones per call site. */
#ifndef HAKMEM_LARGE_H
#define HAKMEM_LARGE_H

#include "layout.h"

/* ---- Large blocks ------------------------------------------------------ */

#define LARGE_MAGIC 0x4841424cu        /* "HABL" */
#define LARGE_MAGIC_CACHED 0x48414243u /* "HABC": freed, held by BigCache */

typedef struct large_hdr {
    uint32_t magic;
    uint32_t purged;       /* cached and its pages given back */
    uint32_t site_rules;   /* the site's rules when it was allocated (enum site_rule) */
    uint32_t site_index;   /* in the site table */
    uint32_t fresh;        /* its pages were new or purged when handed out */
    uint32_t huge;         /* its mapping asked for transparent huge pages */
    uint32_t untold;       /* its bytes counted untold in a young program (purger_young_untold), reused or not */
    uint32_t sample;       /* its profiling sample's record (sample.c), 0 if it is none */
    size_t size;           /* the size asked for (realloc's last) */
    size_t born_size;      /* the size asked for when it was handed out */
    uint64_t born;         /* hak_ticks() at a timed allocation, else 0: lifetimes */
    char *map_base;        /* the whole mapping */
    size_t map_size;
    char *user;            /* the pointer handed out */
    size_t usable;         /* bytes usable from user */
    uintptr_t site;        /* call site that allocated it (BigCache key) */
    uint64_t cached_at_ms; /* when BigCache took it */
} large_hdr_t;

extern _Atomic uint64_t hak_large_allocs;
extern _Atomic uint64_t hak_large_huge;
extern _Atomic size_t hak_large_mapped;
extern _Atomic size_t hak_large_mappings;

void *large_alloc(size_t size, size_t align, uintptr_t site);
void *large_alloc_zeroed(size_t size, uintptr_t site);
void large_unmap(large_hdr_t *h);
void large_free(void *p, const char *op);
size_t large_usable_size(const void *p, const char *op);
void *large_realloc(void *p, size_t size, uintptr_t site);
void large_born_at_threshold(void *p);
large_hdr_t *large_header_of(const void *p);

/* ---- BigCache (bigcache.c) --------------------------------------------- */

large_hdr_t *bigcache_take(uintptr_t site, size_t size, size_t align, bool *reshape);
bool bigcache_put(large_hdr_t *h);
void bigcache_thread_exit(void); /* before the thread's heap is orphaned */
uint64_t bigcache_collect(bool unmap);
void bigcache_release(void);
void bigcache_held(size_t *blocks, size_t *bytes);
void bigcache_counts(uint64_t *hits, uint64_t *misses, uint64_t *reshaped);
void bigcache_fork_prepare(void);
void bigcache_fork_parent(void);
void bigcache_fork_child(void);
/* Per-site decisions (HAKMEM_SITE_RULES), carried by each large block. */
enum site_rule {
    RULE_NO_BIGCACHE = 1, /* freed blocks are unmapped, not cached */
    RULE_PREWARM = 2,     /* new or purged blocks are faulted in at once */
};

#endif
