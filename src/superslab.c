/* SuperSlabs: 2 MiB-aligned regions carved into slabs of 64 KiB pages,
 * and the policy that gives free pages and empty SuperSlabs back to the
 * OS.
 *
 * Each SuperSlab belongs to one heap, which alone carves slabs out of it
 * and gives them back: taking a slab needs no shared lock, and the slab
 * descriptors of one thread never share a cache line with another's. Only
 * SuperSlabs without an owner (empty ones, kept in a pool up to the
 * reserve) and the registry of all of them are shared, under ss_lock. The
 * purger (purger.c) reaches every SuperSlab through the registry; a small
 * lock per SuperSlab keeps its purges apart from the owner's page changes. */
#include "superslab.h"
#include "heap.h"
#include "mesh.h"
#include "purger.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>

slab_t hak_no_slab; /* owner 0 matches no heap; in_use 0 */

static pthread_mutex_t ss_lock = PTHREAD_MUTEX_INITIALIZER;
static superslab_t *ss_registry; /* every mapped SuperSlab, through next/prev */
static superslab_t *ss_pool;     /* empty SuperSlabs without an owner, through hnext */
static size_t ss_count, ss_pool_count;

#define DATA_PAGES_MASK (~(uint32_t)0 << SS_FIRST_DATA_PAGE)

#define SS_EMPTY_BIN (SS_PAGES - SS_FIRST_DATA_PAGE) /* the longest run of an empty SuperSlab */

static uint32_t run_mask(unsigned first, unsigned span)
{
    return (uint32_t)((((uint64_t)1 << span) - 1) << first);
}

/* ---- the page lock: owner against purger ---------------------------------- */

static void pages_lock(superslab_t *ss)
{
    while (atomic_exchange_explicit(&ss->pages_lock, 1, memory_order_acquire))
        while (atomic_load_explicit(&ss->pages_lock, memory_order_relaxed))
            sched_yield(); /* the purger is in madvise: microseconds */
}

static bool pages_trylock(superslab_t *ss)
{
    return !atomic_exchange_explicit(&ss->pages_lock, 1, memory_order_acquire);
}

static void pages_unlock(superslab_t *ss) { atomic_store_explicit(&ss->pages_lock, 0, memory_order_release); }

/* ---- mapping and the shared pool (under ss_lock) ------------------------------ */

/* Where the system backs every mapping with transparent huge pages
 * (enabled=always, RHEL's default), a SuperSlab's first touch makes all
 * its 2 MiB resident, for a first slab of 64 KiB: a program with a heap
 * of 200 KiB held 5.8 MiB (2.0 with 4 KiB pages; mimalloc 3.8, jemalloc
 * 9.7). The first SuperSlabs of a heap take 4 KiB pages; a heap beyond
 * them, which fills its SuperSlabs, gets huge pages where the system
 * gives them (fewer faults and TLB misses). Elsewhere the advice changes
 * nothing. */
#define SS_SMALL_HEAP 4

static superslab_t *superslab_map_locked(void)
{
    superslab_t *ss = os_map_aligned(SS_SIZE, SS_SIZE);
    if (!ss)
        return NULL;
    if (!segmap_cover(ss, SS_SIZE)) {
        os_unmap(ss, SS_SIZE);
        return NULL;
    }
    if (ss_count < SS_SMALL_HEAP)
        os_advise_small_pages(ss, SS_SIZE);
    ss->magic = SS_MAGIC;
    if (!hak_mark_key.secret)
        hak_mark_key.secret = os_random() | 1;
    ss->link_secret = os_random();
    ss->canary_secret = HAK_SECURE ? canary_secret_of(os_random()) : 0;
    size_t page = os_page_size();
    /* The header's last page guards it from the first slab; no SuperSlab
     * without it (the kernel refuses at the limit of mappings). */
    if (HAK_SECURE && page < SLAB_PAGE_SIZE && !os_protect((char *)ss + SLAB_PAGE_SIZE - page, page, false)) {
        os_unmap(ss, SS_SIZE);
        errno = ENOMEM;
        return NULL;
    }
    ss->free_pages = DATA_PAGES_MASK;
    /* The hardened build's data pages stay inaccessible until a slab
     * first takes them: a stray write past the slabs in use faults. */
    bool closed = HAK_SECURE && os_protect((char *)ss + SLAB_PAGE_SIZE, SS_SIZE - SLAB_PAGE_SIZE, false);
    ss->open_pages = closed ? 0 : DATA_PAGES_MASK;
    segmap_set_superslab(ss, &hak_no_slab);
    ss->prev = NULL;
    ss->next = ss_registry;
    if (ss_registry)
        ss_registry->prev = ss;
    ss_registry = ss;
    ss_count++;
    if (hak_config.verbose)
        hak_warn("mapped a SuperSlab", NULL);
    return ss;
}

static void superslab_unmap_locked(superslab_t *ss)
{
    if (ss->prev)
        ss->prev->next = ss->next;
    else
        ss_registry = ss->next;
    if (ss->next)
        ss->next->prev = ss->prev;
    ss_count--;
    segmap_clear(ss, SS_SIZE);
    os_unmap(ss, SS_SIZE);
    if (hak_config.verbose)
        hak_warn("unmapped an empty SuperSlab", NULL);
}

/* The lowest run of set bits in *left (not 0): its first bit and length;
 * the run is cleared from *left. */
static unsigned next_run(uint32_t *left, unsigned *start)
{
    *start = (unsigned)__builtin_ctz(*left);
    unsigned len = (unsigned)__builtin_ctzll(~((uint64_t)*left >> *start));
    *left &= ~run_mask(*start, len);
    return len;
}

/* The longest run of free data pages. */
static unsigned longest_free_run(uint32_t free_pages)
{
    unsigned longest = 0, start;
    for (uint32_t left = free_pages & DATA_PAGES_MASK; left;) {
        unsigned len = next_run(&left, &start);
        longest = len > longest ? len : longest;
    }
    return longest;
}

/* ss goes to the front of its bin in heap (most recently changed first:
 * its free pages are the likeliest to be resident). */
static void heap_link_superslab(heap_t *heap, superslab_t *ss)
{
    unsigned bin = longest_free_run(ss->free_pages);
    ss->heap = heap;
    ss->bin = (uint8_t)bin;
    ss->hprev = NULL;
    ss->hnext = heap->ss_bins[bin];
    if (ss->hnext)
        ss->hnext->hprev = ss;
    heap->ss_bins[bin] = ss;
    heap->ss_bin_mask |= 1u << bin;
    heap->superslab_count++;
}

static void heap_unlink_superslab(heap_t *heap, superslab_t *ss)
{
    if (ss->hprev)
        ss->hprev->hnext = ss->hnext;
    else if (!(heap->ss_bins[ss->bin] = ss->hnext))
        heap->ss_bin_mask &= ~(1u << ss->bin);
    if (ss->hnext)
        ss->hnext->hprev = ss->hprev;
    ss->heap = NULL;
    heap->superslab_count--;
}

/* Its free pages changed: to the front of the bin it now belongs in. */
static void heap_rebin_superslab(heap_t *heap, superslab_t *ss)
{
    heap_unlink_superslab(heap, ss);
    heap_link_superslab(heap, ss);
}

/* Unmap the pooled SuperSlabs beyond the first `keep` (the pool is newest
 * first, and the newest stay): all of them with force, else those empty
 * for the purge delay. Returns when the next one falls due, or 0. */
static uint64_t unmap_pool_beyond_locked(size_t keep, bool force, uint64_t now)
{
    superslab_t **link = &ss_pool;
    uint64_t next_due = 0;
    for (size_t i = 0; *link; i++) {
        superslab_t *ss = *link;
        uint64_t due = ss->empty_since_ms + (uint64_t)hak_config.purge_delay_ms;
        if (i < keep || (!force && now < due)) {
            if (i >= keep)
                next_due = due_earlier(next_due, due);
            link = &ss->hnext;
            continue;
        }
        *link = ss->hnext;
        ss_pool_count--;
        superslab_unmap_locked(ss);
    }
    return next_due;
}

/* An empty SuperSlab for heap: from the pool, else newly mapped; if the
 * mapping fails, once more after the caches gave their mappings back. */
static superslab_t *superslab_take(heap_t *heap)
{
    superslab_t *ss = NULL;
    for (int attempt = 0; !ss && attempt < 2; attempt++) {
        if (attempt && !purger_release_caches())
            break;
        pthread_mutex_lock(&ss_lock);
        ss = ss_pool;
        if (ss) {
            ss_pool = ss->hnext;
            ss_pool_count--;
        } else {
            ss = superslab_map_locked();
        }
        pthread_mutex_unlock(&ss_lock);
    }
    if (ss)
        heap_link_superslab(heap, ss);
    return ss;
}

/* heap gives back an empty SuperSlab. The pool keeps it (warm, for the
 * next heap that needs one); the purger unmaps what exceeds the reserve
 * once it has been empty for the purge delay. */
static void superslab_give_back(heap_t *heap, superslab_t *ss)
{
    heap_unlink_superslab(heap, ss);
    ss->empty_since_ms = os_now_ms();
    pthread_mutex_lock(&ss_lock);
    ss->hnext = ss_pool;
    ss_pool = ss;
    bool beyond_reserve = ++ss_pool_count > (size_t)hak_config.superslab_reserve;
    if (beyond_reserve && hak_config.purge_delay_ms == 0)
        unmap_pool_beyond_locked((size_t)hak_config.superslab_reserve, true, 0);
    pthread_mutex_unlock(&ss_lock);
    if (beyond_reserve && hak_config.purge_delay_ms != 0)
        purger_notify();
}

/* ---- purging ---------------------------------------------------------------------- */

/* Purge every run of dirty free pages of ss. Under its page lock. */
static void superslab_purge_dirty(superslab_t *ss)
{
    uint32_t dirty = ss->dirty_pages;
    while (dirty) {
        unsigned first = (unsigned)__builtin_ctz(dirty);
        unsigned last = first;
        while (last + 1 < SS_PAGES && (dirty >> (last + 1)) & 1)
            last++;
        os_purge((char *)ss + (size_t)first * SLAB_PAGE_SIZE,
                 (size_t)(last - first + 1) * SLAB_PAGE_SIZE);
        dirty &= ~(uint32_t)(((uint64_t)1 << (last + 1)) - ((uint64_t)1 << first));
    }
    ss->dirty_pages = 0;
}

/* Purge the free pages that have waited out the delay (all of them with
 * force, which also unmaps the pooled SuperSlabs beyond the reserve).
 * Returns when the next purge falls due, or 0 if nothing waits. */
uint64_t superslab_purge(bool force)
{
    uint64_t now = os_now_ms(), delay = (uint64_t)hak_config.purge_delay_ms, next_due = 0;
    pthread_mutex_lock(&ss_lock);
    for (superslab_t *ss = ss_registry; ss; ss = ss->next) {
        if (force)
            pages_lock(ss);
        else if (!pages_trylock(ss)) {
            next_due = now + 1;
            continue;
        }
        if (ss->dirty_pages) {
            uint64_t due = ss->dirty_since_ms + delay;
            if (force || now >= due)
                superslab_purge_dirty(ss);
            else
                next_due = due_earlier(next_due, due);
        }
        pages_unlock(ss);
    }
    next_due = due_earlier(next_due, unmap_pool_beyond_locked((size_t)hak_config.superslab_reserve, force, now));
    pthread_mutex_unlock(&ss_lock);
    return next_due;
}

/* ---- slabs ------------------------------------------------------------------------- */

/* The first page of the tightest run of free pages that holds span of
 * them, dirty pages preferred (resident already: taking clean ones grows
 * RSS while the dirty ones wait for the purger); 0 if none does. */
static unsigned place_run(uint32_t free_pages, uint32_t dirty, unsigned span)
{
    unsigned best = 0, page = 0, start;
    for (uint32_t left = free_pages & DATA_PAGES_MASK; left;) {
        unsigned len = next_run(&left, &start);
        if (len < span)
            continue;
        unsigned dirty_count = (unsigned)__builtin_popcount(dirty & run_mask(start, span));
        unsigned score = dirty_count * SS_PAGES + (SS_PAGES - (len - span));
        if (score > best)
            best = score, page = start;
    }
    return page;
}

/* Pages for a slab of class c: in the heap's SuperSlab with the shortest
 * longest run that holds them (best fit: long runs stay whole for the page
 * bundles of large blocks, and a SuperSlab with room left is filled before
 * an empty one), else in one from the pool. */
slab_t *superslab_slab_acquire(heap_t *heap, unsigned c)
{
    unsigned span = hak_class_span[c];
    uint32_t fitting = heap->ss_bin_mask & ~((1u << span) - 1);
    superslab_t *ss = fitting ? heap->ss_bins[__builtin_ctz(fitting)] : superslab_take(heap);
    if (!ss)
        return NULL;
    pages_lock(ss);
    unsigned page = place_run(ss->free_pages, ss->dirty_pages, span);
    hak_assert(page != 0); /* the bin promised a run that long */
    uint32_t mask = run_mask(page, span);
    char *run = (char *)ss + (size_t)page * SLAB_PAGE_SIZE;
    if (HAK_SECURE && (mask & ~ss->open_pages) && !os_protect(run, (size_t)span * SLAB_PAGE_SIZE, true)) {
        pages_unlock(ss); /* refused at the limit of mappings */
        errno = ENOMEM;
        return NULL;
    }
    ss->open_pages |= mask;
    ss->free_pages &= ~mask;
    ss->dirty_pages &= ~mask;
    pages_unlock(ss);
    heap_rebin_superslab(heap, ss);
    slab_t *s = &ss->slabs[page - SS_FIRST_DATA_PAGE];
    s->span = (uint8_t)span;
    s->start = run;
    slab_format(s, heap, c);
    segmap_set_slab(ss, page, span, s);
    return s;
}

/* (Re)format the pages of s, a slab of the calling thread, for class c. */
void slab_format(slab_t *s, heap_t *heap, unsigned c)
{
    uint32_t block_size = hak_class_size[c];
    s->free = NULL;
    s->used = 0;
    s->class_idx = (uint8_t)c;
    s->in_use = 1;
    s->parked = 0;
    s->block_size = block_size;
    s->recip = (((uint64_t)1 << RECIP_SHIFT) + block_size - 1) / block_size;
    size_t bytes = (size_t)s->span * SLAB_PAGE_SIZE, lead = slab_lead(c, block_size, bytes);
    s->start = (char *)((uintptr_t)s->start & ~SLAB_LEAD_MASK) + lead;
    s->capacity = (uint32_t)((bytes - lead) / block_size);
    s->carved = 0;
    s->carved_end = s->start;
    s->next = s->prev = NULL;
    hak_assert(!s->mesh); /* dissolved when it was released */
    atomic_store_explicit(&s->remote, NULL, memory_order_relaxed);
    atomic_store_explicit(&s->owner, (uintptr_t)heap, memory_order_release);
}

/* heap gives an empty slab's pages back to their SuperSlab. The pages stay
 * resident until the purge delay passes, so a slab freed and soon taken
 * again costs no page faults. A SuperSlab left empty goes back to the pool
 * unless it is the heap's last, which saves the next refill a trip through
 * ss_lock (collect gives that one back too: superslab_give_back_empty). */
void superslab_slab_release(heap_t *heap, slab_t *s)
{
    mesh_dissolve(s); /* before its pages can take another class */
    superslab_t *ss = superslab_of(s);
    unsigned page = slab_head_page(s);
    uint32_t mask = run_mask(page, s->span);
    size_t bytes = (size_t)s->span * SLAB_PAGE_SIZE; /* once its pages are free, s is another's */
    hak_assert(s->used == 0 && atomic_load(&s->remote) == NULL && ss->heap == heap);
    atomic_store_explicit(&s->owner, 0, memory_order_relaxed);
    s->in_use = 0;
    segmap_set_slab(ss, page, s->span, &hak_no_slab);
    bool dirtied = s->carved != 0;
    pages_lock(ss);
    if (dirtied) {
        if (!ss->dirty_pages)
            ss->dirty_since_ms = os_now_ms();
        ss->dirty_pages |= mask;
        if (hak_config.purge_delay_ms == 0)
            superslab_purge_dirty(ss);
    }
    ss->free_pages |= mask;
    pages_unlock(ss);
    if (ss->free_pages == DATA_PAGES_MASK && heap->superslab_count > 1)
        superslab_give_back(heap, ss);
    else
        heap_rebin_superslab(heap, ss);
    if (dirtied && hak_config.purge_delay_ms != 0)
        purger_notify_freed(bytes);
}

/* An orphan's SuperSlabs go to the heap taking over its slabs. */
void superslab_adopt_all(heap_t *heap, heap_t *from)
{
    while (from->ss_bin_mask) {
        superslab_t *ss = from->ss_bins[__builtin_ctz(from->ss_bin_mask)];
        heap_unlink_superslab(from, ss);
        heap_link_superslab(heap, ss);
    }
}

/* A heap's empty SuperSlabs go back to the pool (collect, thread exit).
 * With unmap_now the pool keeps the reserve and the rest is unmapped at
 * once; without, they stay pooled until the purge delay has passed (the
 * exit of a thread that another will replace: heap_thread_exit). */
void superslab_give_back_empty(heap_t *heap, bool unmap_now)
{
    while (heap->ss_bins[SS_EMPTY_BIN])
        superslab_give_back(heap, heap->ss_bins[SS_EMPTY_BIN]);
    if (!unmap_now)
        return;
    pthread_mutex_lock(&ss_lock);
    unmap_pool_beyond_locked((size_t)hak_config.superslab_reserve, true, 0);
    pthread_mutex_unlock(&ss_lock);
}

/* Out of memory: every pooled SuperSlab goes, the reserve too. */
void superslab_unmap_pool(void)
{
    pthread_mutex_lock(&ss_lock);
    unmap_pool_beyond_locked(0, true, 0);
    pthread_mutex_unlock(&ss_lock);
}

/* The blocks of s off its lists but its meshed partners' slots, which it
 * counts as used and never hands out (read racily: a meshing record is
 * never unmapped). */
static HAK_RACY_READS uint32_t slab_handed_out(const slab_t *s)
{
    uint32_t used = s->used, reserved = mesh_reserved(s);
    return used > reserved ? used - reserved : 0;
}

HAK_RACY_READS void superslab_stats(size_t *superslabs, size_t *empty, size_t slabs[2], size_t bytes[2])
{
    pthread_mutex_lock(&ss_lock);
    *superslabs = ss_count;
    *empty = 0;
    for (superslab_t *ss = ss_registry; ss; ss = ss->next) {
        *empty += ss->free_pages == DATA_PAGES_MASK;
        for (unsigned i = 0; i < SS_MAX_SPAN; i++) {
            slab_t *s = &ss->slabs[i];
            if (!s->in_use)
                continue;
            unsigned tier = class_is_tiny(s->class_idx) ? 0 : 1;
            slabs[tier]++;
            bytes[tier] += (size_t)slab_handed_out(s) * s->block_size;
        }
    }
    pthread_mutex_unlock(&ss_lock);
}

/* Bytes of class c's blocks off their slabs' free lists, in every SuperSlab. */
HAK_RACY_READS size_t superslab_class_bytes(unsigned c)
{
    size_t bytes = 0;
    pthread_mutex_lock(&ss_lock);
    for (superslab_t *ss = ss_registry; ss; ss = ss->next)
        for (unsigned i = 0; i < SS_MAX_SPAN; i++)
            if (ss->slabs[i].in_use && ss->slabs[i].class_idx == c)
                bytes += (size_t)slab_handed_out(&ss->slabs[i]) * ss->slabs[i].block_size;
    pthread_mutex_unlock(&ss_lock);
    return bytes;
}

/* s, a slab descriptor in a mapped SuperSlab, is in use for class c: read
 * while its owner may release it, racily (the fields are bytes and
 * words; what matters is checked again after the list is taken). */
static HAK_RACY_READS bool slab_holds_class(const slab_t *s, unsigned c)
{
    return s->in_use && s->class_idx == c && atomic_load_explicit(&s->owner, memory_order_relaxed);
}

/* The blocks other threads freed into one of slabs[n] (of tiny class c:
 * slabs of other heaps the calling heap's thread freed blocks into), the
 * first with any, taken off its remote list: NULL if none has any. A slab
 * no longer one of class c is passed over. The blocks stay counted as
 * used in their slab, as they were on the list: the slab is not released
 * while the caller holds them, and meshing (of loose and meshed slabs
 * too) takes them for live ones. Each slab looked at is cleared from
 * slabs[]: the next call needs new frees into it. ss_lock keeps each
 * slab's SuperSlab mapped while it is looked at. */
void *superslab_take_remote(slab_t **slabs, unsigned n, unsigned c)
{
    unsigned first = 0;
    while (first < n && !slabs[first])
        first++;
    if (first == n)
        return NULL;
    pthread_mutex_lock(&ss_lock);
    void *list = NULL;
    for (unsigned i = first; i < n && !list; i++) {
        slab_t *s = slabs[i];
        slabs[i] = NULL; /* looked at: taken again only after another free into it */
        if (!s || segmap_kind(superslab_of(s)) != SEG_SUPERSLAB) /* unmapped: s cannot be read */
            continue;
        if (!slab_holds_class(s, c) || !atomic_load_explicit(&s->remote, memory_order_relaxed))
            continue;
        list = atomic_exchange_explicit(&s->remote, NULL, memory_order_acquire);
        if (list && !slab_holds_class(s, c)) {
            /* Released and formatted for another class after the look: the
             * list holds that class's blocks (it could not be released
             * again since: they count as used), which go back. */
            void *tail = list;
            for (void *b = block_next(list); b; b = block_next(b))
                tail = b;
            void *head = atomic_load_explicit(&s->remote, memory_order_relaxed);
            do
                block_link(tail, head);
            while (!atomic_compare_exchange_weak_explicit(&s->remote, &head, list, memory_order_release,
                                                          memory_order_relaxed));
            list = NULL;
        }
    }
    pthread_mutex_unlock(&ss_lock);
    return list;
}

void superslab_fork_prepare(void) { pthread_mutex_lock(&ss_lock); }
void superslab_fork_parent(void) { pthread_mutex_unlock(&ss_lock); }

/* In the child no purger runs, and a page lock held by a thread that did
 * not survive belongs to a heap the child never uses (heaps_fork_child);
 * clearing it lets the child's purges proceed. */
void superslab_fork_child(void)
{
    for (superslab_t *ss = ss_registry; ss; ss = ss->next)
        atomic_store_explicit(&ss->pages_lock, 0, memory_order_relaxed);
    pthread_mutex_unlock(&ss_lock);
}
