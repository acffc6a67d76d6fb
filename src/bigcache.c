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
 * evicted or collected.
 *
 * In front of the rings, each thread's heap keeps the block it freed last
 * (its front), which the thread's next allocation from the same site takes
 * back without a lock or a locked instruction: on x86 each of those waits
 * for the stores before it to drain, and after a loop that touched the
 * block's pages (vm: 513 stores that miss L1) the seven of the rings'
 * malloc/free pair kept the allocator's work from overlapping the drain.
 * The purger (and hak_collect) still has to take the block of a thread
 * that sleeps. It claims the front Dekker-style, with the whole barrier on
 * its side: the owner marks itself busy and reads the claim with only a
 * compiler barrier between; the claimer sets the claim, runs
 * os_membarrier (membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED)), which
 * executes a full barrier on every CPU that runs one of our threads, and
 * then reads busy.
 * Either the claimer sees the owner busy and backs off, or the owner sees
 * the claim and uses the rings. Where membarrier is refused (old kernels,
 * seccomp filters) there is no front. */
#define _GNU_SOURCE
#include "large.h"
#include "heap.h"
#include "purger.h"

#include <pthread.h>
#include <string.h>

#define BIGCACHE_MAX_SITES 256 /* bounds of the options */
#define BIGCACHE_MAX_SLOTS 16

typedef struct bigcache_site {
    _Alignas(64) pthread_mutex_t lock;
    uintptr_t site;
    unsigned slots;                         /* the blocks the ring may hold now */
    unsigned count;                         /* and holds, slot[0] the oldest */
    large_hdr_t *slot[BIGCACHE_MAX_SLOTS];
} bigcache_site_t;

/* Initialised statically: the locks' initialiser is zeros, so the table
 * stays in .bss and a program touches only the entries of its sites (a
 * pthread_mutex_init of each at start faulted in the whole table: 13 of
 * the 46 faults `ls` took more than under glibc, measured at 6cce8c7). */
static bigcache_site_t sites[BIGCACHE_MAX_SITES] = {[0 ... BIGCACHE_MAX_SITES - 1] = {.lock = PTHREAD_MUTEX_INITIALIZER}};
static _Atomic size_t cached_bytes; /* mapped bytes held in the rings */
static _Atomic uint64_t ring_hits, ring_misses, ring_reshaped;
static pthread_mutex_t claim_lock = PTHREAD_MUTEX_INITIALIZER; /* one claimer at a time */

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
    char *block = (char *)h + os_page_size(); /* to the mapping's end: a guard page purges as well */
    os_purge(block, (size_t)(h->map_base + h->map_size - block));
    h->purged = 1;
    return 0;
}

/* Whether a cached block serves an allocation of size aligned to
 * misaligned + 1 without wasting more than half of it, or of what its
 * last owner asked for at first where realloc then grew it: a buffer that
 * grows from the same site takes the block its predecessor grew, and grows
 * in place into pages that are still resident, where a new mapping would
 * fault every page in again (64 KiB doubled to 16 MiB: 4,100 faults an
 * iteration, measured at 78eabf9). A block handed out so and
 * not grown is judged by its whole size again when it comes back. */
static bool block_fits(const large_hdr_t *h, size_t size, uintptr_t misaligned)
{
    size_t judged = h->size > h->born_size ? h->born_size : h->usable;
    return h->usable >= size && judged / 2 < size && !((uintptr_t)h->user & misaligned);
}

/* ---- The front: the owner's side ---- */

/* The calling thread's front, marked busy, or NULL if it has none or a
 * claimer is at it. The signal fence only keeps the compiler from moving
 * the read of the claim before the store of busy; the claimer's
 * membarrier does the rest. */
static bigcache_front_t *front_enter(void)
{
    heap_t *heap = heap_get();
    if (!hak_claims_on || heap == &hak_empty_heap)
        return NULL;
    bigcache_front_t *f = &heap->bigcache_front;
    atomic_store_explicit(&f->busy, true, memory_order_relaxed);
    atomic_signal_fence(memory_order_seq_cst);
    if (!atomic_load_explicit(&f->claimed, memory_order_acquire))
        return f;
    atomic_store_explicit(&f->busy, false, memory_order_release);
    return NULL;
}

static void front_leave(bigcache_front_t *f) { atomic_store_explicit(&f->busy, false, memory_order_release); }

static large_hdr_t *front_take(uintptr_t site, size_t size, uintptr_t misaligned)
{
    bigcache_front_t *f = front_enter();
    if (!f)
        return NULL;
    large_hdr_t *h = atomic_load_explicit(&f->block, memory_order_relaxed);
    if (h && h->site == site && block_fits(h, size, misaligned)) {
        atomic_store_explicit(&f->block, NULL, memory_order_relaxed);
        atomic_store_explicit(&f->bytes, 0, memory_order_relaxed);
        ADD_UNLOCKED(&f->hits, 1);
    } else {
        h = NULL;
    }
    front_leave(f);
    return h;
}

/* h becomes the front; returns the block it displaces (for the rings), or
 * h itself if there is no front to put it in. */
static large_hdr_t *front_put(large_hdr_t *h)
{
    bigcache_front_t *f = front_enter();
    if (!f)
        return h;
    large_hdr_t *displaced = atomic_load_explicit(&f->block, memory_order_relaxed);
    atomic_store_explicit(&f->block, h, memory_order_relaxed);
    atomic_store_explicit(&f->since_ms, h ? h->cached_at_ms : 0, memory_order_relaxed);
    atomic_store_explicit(&f->bytes, h ? h->map_size : 0, memory_order_relaxed);
    front_leave(f);
    return displaced;
}

/* ---- The rings ---- */

/* The rings grow while they hold less than the program's peak of live
 * large blocks over the last second, or less than the floor. Their
 * blocks stay resident until the purge delay, and a ring may grow to 16
 * blocks of up to 64 MiB: without the budget, one live buffer at a time
 * of 1 to 64 MiB held 401 MiB of RSS, 127 with it (mimalloc 53, glibc 68,
 * both at 16 times the time; measured at cbf8d7a). The peak,
 * not the live bytes now: a site that frees a batch of 20 buffers and
 * takes them again has none live when it frees the last. */
#define BIGCACHE_GROWTH_FLOOR ((size_t)32 << 20)
#define LIVE_PEAK_WINDOW_MS 1000

static _Atomic size_t live_peak;        /* bytes of live large blocks, the most seen */
static _Atomic uint64_t live_peak_ms;   /* since then */

/* Note the bytes of the live large blocks at a free, the freed one
 * included: the mappings BigCache does not hold but for the block the
 * free displaced from the thread's front (the other threads' fronts count
 * as live). */
static void live_peak_note(const large_hdr_t *displaced, uint64_t now)
{
    size_t held = atomic_load_explicit(&cached_bytes, memory_order_relaxed) + (displaced ? displaced->map_size : 0);
    size_t mapped = atomic_load_explicit(&hak_large_mapped, memory_order_relaxed);
    size_t live = mapped > held ? mapped - held : 0;
    if (live >= atomic_load_explicit(&live_peak, memory_order_relaxed) ||
        now >= atomic_load_explicit(&live_peak_ms, memory_order_relaxed) + LIVE_PEAK_WINDOW_MS) {
        atomic_store_explicit(&live_peak, live, memory_order_relaxed);
        atomic_store_explicit(&live_peak_ms, now, memory_order_relaxed);
    }
}

/* Whether a full ring takes one more block by growing rather than by
 * evicting its oldest: that block is still warm (the ring is too small
 * for the site), the ring may grow, and the rings are within their
 * budget. */
static bool ring_grows(const bigcache_site_t *e, uint64_t now)
{
    if (e->slots == BIGCACHE_MAX_SLOTS || now >= e->slot[0]->cached_at_ms + (uint64_t)hak_config.purge_delay_ms)
        return false;
    size_t peak = atomic_load_explicit(&live_peak, memory_order_relaxed);
    return atomic_load_explicit(&cached_bytes, memory_order_relaxed) <=
           (peak > BIGCACHE_GROWTH_FLOOR ? peak : BIGCACHE_GROWTH_FLOOR);
}

/* Take the ring's block at position i; the newer ones move down. */
static large_hdr_t *ring_remove(bigcache_site_t *e, unsigned i)
{
    large_hdr_t *h = e->slot[i];
    memmove(&e->slot[i], &e->slot[i + 1], (e->count - i - 1) * sizeof e->slot[0]);
    e->slot[--e->count] = NULL;
    return h;
}

/* The ring starts over at its first size, empty: its blocks go to out
 * (room for BIGCACHE_MAX_SLOTS), for the caller to unmap once unlocked.
 * Returns how many. */
static unsigned ring_clear(bigcache_site_t *e, large_hdr_t **out)
{
    unsigned n = 0;
    while (e->count)
        out[n++] = ring_remove(e, e->count - 1);
    e->slots = (unsigned)hak_config.bigcache_slots;
    return n;
}

/* The ring's block of index best or i that is cheaper to reshape for
 * size (the caller cuts a larger one to just under twice size, and grows
 * a smaller one): the smallest of those at least size, which lose pages
 * but fault none, else the largest, which faults the fewest. */
static unsigned closer_to(const bigcache_site_t *e, unsigned best, unsigned i, size_t size)
{
    size_t have = e->slot[i]->usable, had = e->slot[best]->usable;
    if ((have >= size) != (had >= size))
        return have >= size ? i : best;
    return (have >= size ? have < had : have > had) ? i : best;
}

/* A cached block of the site's own entry that fits size (see block_fits),
 * or NULL. Where none fits and the ring is full, the block closest to
 * size (closer_to) is taken with *reshape set, for the caller to resize: a
 * site whose sizes vary more than twofold (buffers of 1 to 8 MiB)
 * otherwise maps a new block at each miss, every page of it faulting, and
 * unmaps a cached one with its resident pages at the next put
 * (measured at cbf8d7a). The oldest block, taken before, grew
 * where a larger one was there to cut (battle varied 25.7 faults an
 * iteration, 22.1 now; python3 keeping 16 buffers of 1-8 MiB, 88-90k
 * faults a run, 72-76k now, glibc 70k; measured at 7981201). A ring that is not
 * full keeps its blocks: a site that takes 8 MiB and 1 MiB by turns finds
 * both. */
static large_hdr_t *ring_take(uintptr_t site, size_t size, uintptr_t misaligned, bool *reshape)
{
    bigcache_site_t *e = site_entry(site);
    large_hdr_t *found = NULL;
    *reshape = false;
    pthread_mutex_lock(&e->lock);
    if (e->site == site && e->count) {
        /* newest first: the block most likely still resident */
        for (unsigned i = e->count; i-- > 0 && !found;)
            if (block_fits(e->slot[i], size, misaligned))
                found = ring_remove(e, i);
        /* A move by mremap keeps the 2 MiB alignment, no larger one. */
        if (!found && e->count == e->slots && misaligned < SS_SIZE && !ring_grows(e, os_now_ms())) {
            unsigned best = e->count;
            for (unsigned i = 0; i < e->count; i++)
                if (!((uintptr_t)e->slot[i]->user & misaligned))
                    best = best == e->count ? i : closer_to(e, best, i, size);
            if (best < e->count) {
                found = ring_remove(e, best);
                *reshape = true;
            }
        }
    }
    pthread_mutex_unlock(&e->lock);
    if (!found || *reshape)
        atomic_fetch_add_explicit(&ring_misses, 1, memory_order_relaxed);
    if (!found)
        return NULL;
    atomic_fetch_add_explicit(*reshape ? &ring_reshaped : &ring_hits, 1, memory_order_relaxed);
    atomic_fetch_sub_explicit(&cached_bytes, found->map_size, memory_order_relaxed);
    return found;
}

/* A block freed at h->cached_at_ms joins its site's ring as the newest;
 * a full ring grows by a slot while its oldest block is warm (the ring is
 * too small for the site), else evicts that block. */
static void ring_put(large_hdr_t *h)
{
    bigcache_site_t *e = site_entry(h->site);
    large_hdr_t *evicted[BIGCACHE_MAX_SLOTS];
    unsigned n_evicted = 0;
    uint64_t now = os_now_ms();
    atomic_fetch_add_explicit(&cached_bytes, h->map_size, memory_order_relaxed);
    pthread_mutex_lock(&e->lock);
    if (e->site != h->site || !e->slots) { /* the entry changes hands (or is new) */
        n_evicted = ring_clear(e, evicted);
        e->site = h->site;
    }
    if (e->count == e->slots) {
        if (ring_grows(e, now))
            e->slots++;
        else
            evicted[n_evicted++] = ring_remove(e, 0);
    }
    e->slot[e->count++] = h;
    pthread_mutex_unlock(&e->lock);
    for (unsigned i = 0; i < n_evicted; i++)
        unmap_block(evicted[i]);
}

/* ---- BigCache's entry points ---- */

/* A cached block for site that fits size, aligned to align (0 for none),
 * or NULL: the thread's front first, then the site's ring. With *reshape
 * set, the block is the site's to resize to size (ring_take). */
large_hdr_t *bigcache_take(uintptr_t site, size_t size, size_t align, bool *reshape)
{
    uintptr_t misaligned = align ? align - 1 : 0;
    *reshape = false;
    if (!site_count())
        return NULL;
    large_hdr_t *h = front_take(site, size, misaligned);
    return h ? h : ring_take(site, size, misaligned, reshape);
}

/* Keep a freed block for its site; false if it is not cacheable (the
 * caller unmaps it). It becomes the thread's front, and the block there
 * before goes to its own site's ring. */
bool bigcache_put(large_hdr_t *h)
{
    if (!site_count() || h->map_size > hak_config.bigcache_max_block)
        return false;
    uint64_t now = os_now_ms();
    h->cached_at_ms = now;
    h->purged = 0;
    /* A block whose bytes are counted already (taken back from BigCache
     * in the program's youth) is not counted twice. */
    bool untold = h->untold ? purger_young_untold_again(now) : purger_young_untold(h->usable, now);
    h->untold = untold; /* once in the front, h is the purger's to unmap */
    large_hdr_t *displaced = front_put(h);
    live_peak_note(displaced, now);
    if (displaced)
        ring_put(displaced);
    if (!untold)
        purger_notify();
    return true;
}

/* A thread that exits leaves no block in its front: its heap may wait
 * long for another thread, and the rings are where others find blocks. */
void bigcache_thread_exit(void)
{
    large_hdr_t *h = front_put(NULL);
    if (h)
        ring_put(h);
}

/* ---- The front: the claimer's side ---- */

/* Claim every front whose block is due for a purge (every one with all)
 * and move their blocks into the rings, where bigcache_collect purges or
 * unmaps them. Returns when the next front falls due, or 0 if none
 * waits. */
static uint64_t fronts_collect(bool all, uint64_t now)
{
    if (!hak_claims_on)
        return 0;
    uint64_t delay = (uint64_t)hak_config.purge_delay_ms, next_due = 0;
    bool claimed = false;
    pthread_mutex_lock(&claim_lock);
    for (heap_t *heap = heaps_all(); heap; heap = heap->next_all) {
        bigcache_front_t *f = &heap->bigcache_front;
        if (!atomic_load_explicit(&f->block, memory_order_relaxed))
            continue;
        uint64_t due = atomic_load_explicit(&f->since_ms, memory_order_relaxed) + delay;
        if (!all && now < due) {
            next_due = due_earlier(next_due, due);
            continue;
        }
        atomic_store_explicit(&f->claimed, true, memory_order_relaxed);
        claimed = true;
    }
    if (claimed && !os_membarrier())
        claimed = false, next_due = now + 1; /* cannot happen once registered; never take a block unsure */
    for (heap_t *heap = heaps_all(); heap; heap = heap->next_all) {
        bigcache_front_t *f = &heap->bigcache_front;
        if (!atomic_load_explicit(&f->claimed, memory_order_relaxed))
            continue;
        large_hdr_t *h = NULL;
        if (claimed && !atomic_load_explicit(&f->busy, memory_order_acquire)) {
            h = atomic_load_explicit(&f->block, memory_order_relaxed);
            atomic_store_explicit(&f->block, NULL, memory_order_relaxed);
            atomic_store_explicit(&f->bytes, 0, memory_order_relaxed);
        } else {
            next_due = due_earlier(next_due, now + 1); /* the owner was at it: soon again */
        }
        atomic_store_explicit(&f->claimed, false, memory_order_release);
        if (h)
            ring_put(h);
    }
    pthread_mutex_unlock(&claim_lock);
    return next_due;
}

/* Purge the blocks cached past the delay; with unmap, give every cached
 * block back to the OS (hak_collect(true), malloc_trim) and shrink the
 * rings to their first size. Returns when the
 * next purge falls due, or 0 if none waits. */
uint64_t bigcache_collect(bool unmap)
{
    uint64_t now = os_now_ms(), next_due = fronts_collect(unmap, now);
    for (unsigned s = 0; s < site_count(); s++) {
        bigcache_site_t *e = &sites[s];
        large_hdr_t *evicted[BIGCACHE_MAX_SLOTS];
        unsigned n_evicted = 0;
        pthread_mutex_lock(&e->lock);
        if (unmap) /* a grown ring starts over */
            n_evicted = ring_clear(e, evicted);
        for (unsigned i = 0; i < e->count; i++)
            next_due = due_earlier(next_due, purge_if_due(e->slot[i], now));
        pthread_mutex_unlock(&e->lock);
        for (unsigned i = 0; i < n_evicted; i++)
            unmap_block(evicted[i]);
    }
    return next_due;
}

/* The out-of-memory retry's part (purger_release_caches): every cached
 * block goes back to the OS. */
void bigcache_release(void) { bigcache_collect(true); }

/* The blocks BigCache holds and their mappings' bytes (the statistics:
 * the rings' counts under their locks, no counter on their paths). */
void bigcache_held(size_t *blocks, size_t *bytes)
{
    *blocks = 0;
    *bytes = atomic_load_explicit(&cached_bytes, memory_order_relaxed);
    for (unsigned i = 0; i < site_count(); i++) {
        pthread_mutex_lock(&sites[i].lock);
        *blocks += sites[i].count;
        pthread_mutex_unlock(&sites[i].lock);
    }
    for (heap_t *heap = heaps_all(); heap; heap = heap->next_all) {
        size_t front = atomic_load_explicit(&heap->bigcache_front.bytes, memory_order_relaxed);
        *blocks += front != 0;
        *bytes += front;
    }
}

void bigcache_counts(uint64_t *hits, uint64_t *misses, uint64_t *reshaped)
{
    *hits = atomic_load_explicit(&ring_hits, memory_order_relaxed);
    for (heap_t *heap = heaps_all(); heap; heap = heap->next_all)
        *hits += atomic_load_explicit(&heap->bigcache_front.hits, memory_order_relaxed);
    *misses = atomic_load_explicit(&ring_misses, memory_order_relaxed);
    *reshaped = atomic_load_explicit(&ring_reshaped, memory_order_relaxed);
}

/* fork: no lock may be held across it, and the child's cache stays valid.
 * No claim is under way then (claim_lock); the child registers for
 * membarrier again (a new process), and the fronts of the threads that
 * do not survive may have been busy: their blocks are the child's to
 * claim. */
void bigcache_fork_prepare(void)
{
    pthread_mutex_lock(&claim_lock);
    for (unsigned i = 0; i < site_count(); i++)
        pthread_mutex_lock(&sites[i].lock);
}

void bigcache_fork_parent(void)
{
    for (unsigned i = site_count(); i-- > 0;)
        pthread_mutex_unlock(&sites[i].lock);
    pthread_mutex_unlock(&claim_lock);
}

void bigcache_fork_child(void)
{
    for (heap_t *heap = heaps_all(); heap; heap = heap->next_all)
        if (heap != heap_get())
            atomic_store_explicit(&heap->bigcache_front.busy, false, memory_order_relaxed);
    bigcache_fork_parent();
}
