/* BigCache: recently freed large blocks kept per call site, so that the
 * next allocation of a fitting size from the same site reuses the mapping
 * (and, until the purge delay passes, its resident pages) instead of
 * paying mmap, munmap and a page fault per page. Sites hash into a table
 * of HAKMEM_BIGCACHE_SITES entries, each a ring of HAKMEM_BIGCACHE_SLOTS
 * blocks under its own lock (padded to a cache line); a site that takes
 * over an entry evicts the previous site's blocks. A ring that overflows
 * with a block freed within the purge delay grows by a slot, up to
 * BIGCACHE_MAX_SLOTS: a site that frees 8 buffers at a time and takes them
 * again would otherwise miss half of them every round, for ever (a mapping,
 * an unmapping and a fault per page each). Cached pages are purged
 * after HAKMEM_PURGE_DELAY_MS (by the purger); the mapping stays until
 * evicted or collected. */
#include "internal.h"

#include <pthread.h>
#include <string.h>

#define BIGCACHE_MAX_SITES 256 /* bounds of the options */
#define BIGCACHE_MAX_SLOTS 16

typedef struct bigcache_site {
    _Alignas(64) pthread_mutex_t lock;
    uintptr_t site;
    unsigned slots;                         /* the ring's size now */
    unsigned next;                          /* ring position of the oldest slot */
    large_hdr_t *slot[BIGCACHE_MAX_SLOTS];
} bigcache_site_t;

static bigcache_site_t sites[BIGCACHE_MAX_SITES];
static _Atomic size_t cached_bytes; /* mapped bytes held in the cache */
_Atomic uint64_t hak_bigcache_hits, hak_bigcache_misses;

void bigcache_init(void)
{
    for (unsigned i = 0; i < BIGCACHE_MAX_SITES; i++)
        pthread_mutex_init(&sites[i].lock, NULL);
}

static unsigned site_count(void) { return (unsigned)hak_config.bigcache_sites; }

static bigcache_site_t *site_entry(uintptr_t site)
{
    uint64_t h = (uint64_t)site * 0x9e3779b97f4a7c15ull;
    return &sites[(h >> 40) % site_count()];
}

static void unmap_block(large_hdr_t *h)
{
    atomic_fetch_sub_explicit(&cached_bytes, h->map_size, memory_order_relaxed);
    large_unmap(h);
}

/* A block cached for a while gives its pages back; the mapping stays.
 * Returns when it falls due, or 0 once purged. */
static uint64_t purge_if_due(large_hdr_t *h, uint64_t now)
{
    if (h->purged)
        return 0;
    uint64_t due = h->cached_at_ms + (uint64_t)hak_config.purge_delay_ms;
    if (now < due)
        return due;
    os_purge((char *)h + os_page_size(), h->map_size - os_page_size());
    h->purged = 1;
    return 0;
}

/* Purge the blocks cached past the delay; with unmap, give every cached
 * block back to the OS (hak_collect(true), malloc_trim) and shrink the
 * rings to their first size. Returns when the
 * next purge falls due, or 0 if none waits. */
uint64_t bigcache_collect(bool unmap)
{
    uint64_t now = os_now_ms(), next_due = 0;
    for (unsigned s = 0; s < site_count(); s++) {
        bigcache_site_t *e = &sites[s];
        large_hdr_t *evicted[BIGCACHE_MAX_SLOTS];
        unsigned n_evicted = 0;
        pthread_mutex_lock(&e->lock);
        for (unsigned i = 0; i < BIGCACHE_MAX_SLOTS; i++) {
            if (!e->slot[i])
                continue;
            if (unmap) {
                evicted[n_evicted++] = e->slot[i], e->slot[i] = NULL;
                continue;
            }
            next_due = due_earlier(next_due, purge_if_due(e->slot[i], now));
        }
        if (unmap) /* a grown ring starts over */
            e->slots = (unsigned)hak_config.bigcache_slots, e->next = 0;
        pthread_mutex_unlock(&e->lock);
        for (unsigned i = 0; i < n_evicted; i++)
            unmap_block(evicted[i]);
    }
    return next_due;
}

/* A cached block of the site's own entry that fits size without wasting
 * more than half of it, aligned to align (0 for none), or NULL. */
large_hdr_t *bigcache_take(uintptr_t site, size_t size, size_t align)
{
    uintptr_t misaligned = align ? align - 1 : 0;
    if (!site_count())
        return NULL;
    bigcache_site_t *e = site_entry(site);
    large_hdr_t *found = NULL;
    pthread_mutex_lock(&e->lock);
    if (e->site == site) {
        unsigned slots = e->slots;
        /* newest first: the block most likely still resident */
        for (unsigned k = 1; k <= slots && !found; k++) {
            unsigned i = (e->next + slots - k) % slots;
            large_hdr_t *h = e->slot[i];
            if (h && h->usable >= size && h->usable / 2 < size && !((uintptr_t)h->user & misaligned)) {
                found = h;
                e->slot[i] = NULL;
            }
        }
    }
    pthread_mutex_unlock(&e->lock);
    if (!found) {
        atomic_fetch_add_explicit(&hak_bigcache_misses, 1, memory_order_relaxed);
        return NULL;
    }
    atomic_fetch_add_explicit(&hak_bigcache_hits, 1, memory_order_relaxed);
    atomic_fetch_sub_explicit(&cached_bytes, found->map_size, memory_order_relaxed);
    return found;
}

/* Keep a freed block for its site; false if it is not cacheable (the
 * caller unmaps it). The oldest block of a full ring is evicted. */
bool bigcache_put(large_hdr_t *h)
{
    if (!site_count() || h->map_size > hak_config.bigcache_max_block)
        return false;
    bigcache_site_t *e = site_entry(h->site);
    large_hdr_t *evicted[BIGCACHE_MAX_SLOTS + 1];
    unsigned n_evicted = 0;
    uint64_t now = os_now_ms();
    h->cached_at_ms = now;
    h->purged = 0;
    atomic_fetch_add_explicit(&cached_bytes, h->map_size, memory_order_relaxed);
    pthread_mutex_lock(&e->lock);
    if (e->site != h->site || !e->slots) { /* the entry changes hands (or is new) */
        for (unsigned i = 0; i < BIGCACHE_MAX_SLOTS; i++)
            if (e->slot[i])
                evicted[n_evicted++] = e->slot[i], e->slot[i] = NULL;
        e->site = h->site;
        e->slots = (unsigned)hak_config.bigcache_slots;
        e->next = 0;
    }
    large_hdr_t *oldest = e->slot[e->next];
    if (oldest && now < oldest->cached_at_ms + (uint64_t)hak_config.purge_delay_ms && e->slots < BIGCACHE_MAX_SLOTS) {
        /* Still warm: the ring is too small for the site. One more slot,
         * at the newest position (just before the oldest). */
        memmove(&e->slot[e->next + 1], &e->slot[e->next], (e->slots - e->next) * sizeof e->slot[0]);
        e->slots++;
        e->slot[e->next] = h;
        e->next++;
    } else {
        if (oldest)
            evicted[n_evicted++] = oldest;
        e->slot[e->next] = h;
        e->next = (e->next + 1) % e->slots;
    }
    pthread_mutex_unlock(&e->lock);
    for (unsigned i = 0; i < n_evicted; i++)
        unmap_block(evicted[i]);
    purger_notify();
    return true;
}

size_t bigcache_bytes(void) { return atomic_load_explicit(&cached_bytes, memory_order_relaxed); }

/* fork: no lock may be held across it, and the child's cache stays valid. */
void bigcache_fork_prepare(void)
{
    for (unsigned i = 0; i < site_count(); i++)
        pthread_mutex_lock(&sites[i].lock);
}

void bigcache_fork_parent(void)
{
    for (unsigned i = site_count(); i-- > 0;)
        pthread_mutex_unlock(&sites[i].lock);
}

void bigcache_fork_child(void) { bigcache_fork_parent(); }
