/* Large blocks: each in its own mapping, a header page and then the block,
 * which starts in the first page of a 2 MiB chunk (aligned further for a
 * larger alignment), so that masking the user pointer and stepping back a
 * page finds the header, and huge pages can back every whole chunk of the
 * block: the header shares none of them, and purging the block never
 * splits one. The segment map marks the block's first chunk and every
 * chunk after it, which lets free tell an interior pointer from a foreign
 * one. */
#define _GNU_SOURCE
#include "large.h"
#include "block.h"
#include "error.h"
#include "os.h"
#include "hooks.h"
#include "init.h"
#include "purger.h"

#include <errno.h>
#include <string.h>

_Atomic uint64_t hak_large_allocs;
_Atomic uint64_t hak_large_huge;
_Atomic size_t hak_large_mapped;   /* bytes of the large mappings, cached ones too */
_Atomic size_t hak_large_mappings; /* and their number */

static size_t page_round(size_t n)
{
    size_t page = os_page_size();
    return (n + page - 1) & ~(page - 1);
}

/* The hardened build starts and ends each mapping with a page that
 * faults on access: an overflow past the block's last page stops at the
 * one after it, an underflow that runs through the header page at the one
 * before. At the process's limit of mappings the kernel may refuse the
 * split that a guard makes; the block then has none (and a guarded one
 * that realloc must grow fails to move, as the guards split its mapping).
 * The 8 bytes before the block hold a canary (its address xor a secret),
 * checked by every free, realloc and usable size: a write just before
 * the block overwrites it. The first bytes after the request hold
 * CANARY_BYTE (block.h, slack_fill), checked as well, and the usable
 * size is the request: a write past it is caught (the slack of the slab
 * and arena blocks, block.h). And a freed block that BigCache keeps has
 * its first page inaccessible until it is handed out again: a read or
 * write after free at the block's start, where a stale pointer's fields
 * most likely lie, faults as at an unmapped block. (All its pages cost an
 * mprotect that rewrites every resident page's entry, at each free and
 * each reuse.) */
static size_t guard_size(void) { return HAK_SECURE ? os_page_size() : 0; }

static void guard_set(large_hdr_t *h, bool on)
{
    if (HAK_SECURE) {
        os_protect(h->map_base, guard_size(), !on);
        os_protect(h->map_base + h->map_size - guard_size(), guard_size(), !on);
    }
}

static uint64_t canary_secret;

static uintptr_t *canary_of(const large_hdr_t *h) { return (uintptr_t *)(h->user - sizeof(uintptr_t)); }

/* Drawn once per process, by the first large block's thread. Two threads
 * drawing at once must end with one secret: a store each, the first
 * thread wrote its canary under the secret the second then replaced, and
 * its block's free was reported as an underflow (test_unload under qemu,
 * its two threads' first large blocks: 3 runs in 20). */
static uint64_t large_canary_secret(void)
{
    uint64_t secret = __atomic_load_n(&canary_secret, __ATOMIC_ACQUIRE);
    if (!secret) {
        uint64_t drawn = canary_secret_of(os_random()); /* never 0 */
        secret = __atomic_compare_exchange_n(&canary_secret, &secret, drawn, false, __ATOMIC_ACQ_REL,
                                             __ATOMIC_ACQUIRE)
                     ? drawn
                     : secret;
    }
    return secret;
}

static uintptr_t canary_value(const large_hdr_t *h) { return canary_keyed(large_canary_secret(), canary_of(h)); }

static void canary_set(large_hdr_t *h)
{
    if (HAK_SECURE)
        *canary_of(h) = canary_value(h);
}

/* The usable size of the hardened build: the request (a request of 0 is
 * given 1 byte, as a usable size of 0 would read as a bad pointer's). */
static size_t request_bytes(const large_hdr_t *h) { return h->size + !h->size; }

/* h->size set: its slack filled. */
static void slack_set(large_hdr_t *h)
{
    if (HAK_SECURE)
        slack_fill(h->user + request_bytes(h), h->usable - request_bytes(h));
}

static bool block_slack_intact(const large_hdr_t *h)
{
    return slack_intact(h->user + request_bytes(h), h->usable - request_bytes(h));
}

/* The block's pages, from the first after the header. */
static char *block_pages(const large_hdr_t *h) { return (char *)h + os_page_size(); }

/* Hardened: a freed block's first page made inaccessible while BigCache
 * keeps it, and accessible again when it is handed out. false where the
 * kernel refused (the limit of mappings). */
static bool cached_protect(large_hdr_t *h, bool accessible)
{
    return !HAK_SECURE || os_protect(block_pages(h), os_page_size(), accessible);
}

/* A block whose pages from `from` on are not resident, about to be handed
 * out (from its start: a new or purged block; from its old end: one that
 * realloc grew): huge pages where HAKMEM_HUGEPAGES asks for them, and
 * pre-warmed where the option or the site's rule asks. The advice covers
 * the whole mapping, which stays one kernel VMA, acts where a whole chunk
 * of block is, and stays with the mapping through purges and moves; a
 * block too small for a chunk at birth gets it when it grows to one. */
static void large_back(large_hdr_t *h, char *from)
{
    bool prewarm = hak_config.prewarm || (h->site_rules & RULE_PREWARM);
    bool huge = hak_config.hugepages == HUGEPAGES_ALWAYS || (prewarm && hak_config.hugepages == HUGEPAGES_PREWARMED);
    if (huge && !h->huge && h->usable >= SS_SIZE) {
        os_advise_huge(h->map_base, h->map_size);
        h->huge = 1;
        atomic_fetch_add_explicit(&hak_large_huge, 1, memory_order_relaxed);
    }
    if (prewarm)
        os_prefault(from, (size_t)(h->user + h->usable - from));
}

/* A block handed out: counted for its site's rules, sampled as the
 * countdown says, given the site's rules, and backed as they say where its
 * pages are not resident: from unbacked on (h->user for a new or purged
 * block, NULL where all are). start: the clock when the call began if it
 * is timed (large_call_start), else 0. */
static void *large_born(large_hdr_t *h, size_t size, uintptr_t site, char *unbacked, bool cache_hit, uint64_t start)
{
    h->size = size;
    h->born_size = size;
    slack_set(h);
    h->fresh = unbacked == h->user;
    h->site_rules = 0;
    h->sample = 0;
    if (hak_config.profile) {
        h->site_index = hak_profile_hooks.large_alloc(site, cache_hit, &h->site_rules);
        h->sample = hak_profile_hooks.large_sample(size, site);
    }
    if (unbacked)
        large_back(h, unbacked);
    h->born = start ? hak_ticks() : 0;
    if (start) {
        hak_profile_hooks.latency(h->born - start, KPI_LARGE_TIMING);
        hak_profile_hooks.tuner_tick();
    }
    return h->user;
}

/* The clock at the start of a call that is timed (kpi_large_call), for
 * its latency and its block's lifetime, else 0. */
static uint64_t large_call_start(void)
{
    if (!hak_config.profile || !hak_profile_hooks.large_call())
        return 0;
    return hak_ticks();
}

static large_hdr_t *large_resize(large_hdr_t *h, size_t size);

/* The size a block BigCache hands over for reshaping takes: one of twice
 * size or more is cut to just under that (the most a cached block may
 * hold for a request, block_fits), keeping the resident pages below the
 * cut for the site's next larger request (cut to size, battle varied
 * faulted 30.0 times an iteration against 22.1, measured at
 * 7981201); a smaller one grows to size. (None in between: such a
 * block fits, block_fits, and is never reshaped.) */
static size_t reshaped_size(const large_hdr_t *h, size_t size)
{
    return h->usable / 2 >= size ? 2 * size - os_page_size() : size;
}

/* A block BigCache kept for site, aligned to align (0 for none), or NULL.
 * *stale tells whether it may hold old contents: not if its pages were
 * purged with MADV_DONTNEED (they read back as zero). A block BigCache
 * hands over for reshaping is resized first (reshaped_size); where that
 * fails, it is unmapped and the caller maps a new one. */
static void *large_reuse(size_t size, size_t align, uintptr_t site, bool *stale, uint64_t start)
{
    bool reshape;
    large_hdr_t *h = bigcache_take(site, size, align, &reshape);
    if (!h)
        return NULL;
    if (!cached_protect(h, true)) {
        large_unmap(h);
        return NULL;
    }
    size_t old_usable = h->usable;
    if (reshape) {
        large_hdr_t *resized = large_resize(h, reshaped_size(h, size));
        if (!resized) {
            large_unmap(h);
            return NULL;
        }
        h = resized;
    }
    h->magic = LARGE_MAGIC;
    canary_set(h);
    *stale = !(h->purged && os_purged_pages_read_zero());
    char *unbacked = h->purged ? h->user : h->usable > old_usable ? h->user + old_usable : NULL;
    return large_born(h, size, site, unbacked, true, start);
}

static void *large_map(size_t size, size_t align, uintptr_t site, uint64_t start);

/* A new mapping, after the purger's poll (purger_poll). A block that
 * BigCache hands back needs no poll: the free that cached it told the
 * purger (bigcache_put) or, in the program's youth, left its pages for
 * the next free or refill past the youth to tell. The poll read the
 * clock at every pair of a young program (battle vm: 3,492 -> 3,430
 * instructions an iteration, callgrind). */
static void *large_map_polled(size_t size, size_t align, uintptr_t site, uint64_t start)
{
    purger_poll();
    return large_map(size, align, site, start);
}

/* align is 0 or a power of two. */
void *large_alloc(size_t size, size_t align, uintptr_t site)
{
    hak_ensure_init();
    uint64_t start = large_call_start();
    bool stale;
    void *p = large_reuse(size, align, site, &stale, start);
    if (!p)
        p = large_map_polled(size, align, site, start);
    purger_start_if_wanted(); /* a dump asked meanwhile (purger_request_job) runs here too */
    return p;
}

/* calloc: a reused block is cleared where it may hold old contents; a new
 * mapping is zero already. */
void *large_alloc_zeroed(size_t size, uintptr_t site)
{
    uint64_t start = large_call_start();
    bool stale;
    void *p = large_reuse(size, 0, site, &stale, start);
    if (!p)
        return large_map_polled(size, 0, site, start);
    if (stale)
        memset(p, 0, size);
    return p;
}

/* The segment map entries of h's block, from its first chunk to the
 * mapping's end. */
static void large_mark(const large_hdr_t *h)
{
    segmap_set(h->user, (size_t)(h->map_base + h->map_size - h->user), SEG_LARGE_HEAD);
}

static void large_unmark(const large_hdr_t *h) { segmap_clear(h->user, (size_t)(h->map_base + h->map_size - h->user)); }

/* The block starts a few cache lines into its first page (its colour),
 * unless a larger alignment was asked for, and each new mapping on
 * another line than the one before: a program that touches its blocks
 * page by page, at their start, then sends the lines of two blocks live
 * together, and those of the page-aligned blocks of the slabs and arenas
 * (line 0, and line 63 for the last byte), to different cache sets.
 * Without a colour, battle mixed (two 2 MiB blocks alternating with arena
 * blocks) took 1,054 ns an iteration against 1,002 with 128 bytes for
 * every block; with those, 7.7% longer than glibc, whose 16-byte headers
 * scatter its blocks' starts over the lines, and 4.6% less with a colour
 * per mapping (measured at 7981201). The line is 2 to 30,
 * stepping by 7 (prime to the 29 lines), so that consecutive mappings lie
 * far apart: lines 32-63 are left out because the cache sets of a Zen 3's
 * page-strided lines repeat every 2 KiB (a colour 2 KiB from another was
 * as slow as the same one), 0 and 31 for the slab and arena blocks, and 1
 * because a block's last byte falls on the line before its colour. */
static size_t large_colour(size_t align)
{
    static _Atomic unsigned mappings;
    unsigned n = atomic_fetch_add_explicit(&mappings, 1, memory_order_relaxed);
    size_t colour = (size_t)(2 + n * 7 % 29) * 64;
    return align <= 64 ? colour : colour & ~(align - 1); /* 0 for alignments above it */
}

/* The mapping's geometry: the guard page before the header in the
 * hardened build, the header page, the block colour bytes after it,
 * running to the end but for the guard page there. Returns the header. */
static large_hdr_t *large_place(char *base, size_t map_size, size_t colour)
{
    large_hdr_t *h = (large_hdr_t *)(base + guard_size());
    h->map_base = base;
    h->map_size = map_size;
    h->user = (char *)h + os_page_size() + colour;
    h->usable = map_size - 2 * guard_size() - os_page_size() - colour;
    return h;
}

/* A new mapping: a header page, then the block's first chunk, at an
 * address aligned to 2 MiB or to align if larger. */
static void *large_map(size_t size, size_t align, uintptr_t site, uint64_t start)
{
    size_t page = os_page_size();
    size_t chunk_align = align > SS_SIZE ? align : SS_SIZE;
    size_t colour = large_colour(align);
    if (size > SIZE_MAX - page - SS_SIZE - chunk_align) {
        errno = ENOMEM;
        return NULL;
    }
    /* A block of size 0 gets a page too: at the mapping's end, its
     * address would belong to no one (aligned_alloc(1 MiB, 0) did). */
    size_t map_size = page + page_round(colour + (size ? size : 1)) + 2 * guard_size();
    char *base = NULL;
    for (int attempt = 0; !base && attempt < 2; attempt++) {
        if (attempt && !purger_release_caches())
            break;
        base = os_map_aligned_at(map_size, chunk_align, guard_size() + page);
        if (base && !segmap_cover(base, map_size)) {
            os_unmap(base, map_size);
            base = NULL;
        }
    }
    if (!base)
        return NULL; /* errno ENOMEM from the mapping or a leaf of the segment map */
    large_hdr_t *h = large_place(base, map_size, colour);
    h->magic = LARGE_MAGIC;
    h->site = site;
    guard_set(h, true);
    canary_set(h);
    large_mark(h);
    atomic_fetch_add_explicit(&hak_large_allocs, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&hak_large_mapped, map_size, memory_order_relaxed);
    atomic_fetch_add_explicit(&hak_large_mappings, 1, memory_order_relaxed);
    return large_born(h, size, site, h->user, false, start);
}

/* The header of the large mapping that contains p, or NULL. */
large_hdr_t *large_header_of(const void *p)
{
    uintptr_t chunk = (uintptr_t)p & ~(uintptr_t)SS_MASK;
    unsigned kind = segmap_kind((void *)chunk);
    while (kind == SEG_LARGE_INTERIOR) {
        chunk -= SS_SIZE;
        kind = segmap_kind((void *)chunk);
    }
    if (kind != SEG_LARGE_HEAD)
        return NULL;
    large_hdr_t *h = (large_hdr_t *)(chunk - os_page_size());
    return h->magic == LARGE_MAGIC || h->magic == LARGE_MAGIC_CACHED ? h : NULL;
}

static large_hdr_t *large_header_checked(const void *p, const char *op)
{
    large_hdr_t *h = large_header_of(p);
    if (!h) {
        hak_report_bad_pointer(op, p, "pointer into hakmem memory that holds no block");
        return NULL;
    }
    if (h->magic == LARGE_MAGIC_CACHED) {
        hak_report_bad_pointer(op, p, h->user == (const char *)p ? "double free (large block already freed)"
                                                               : "pointer into a freed large block");
        return NULL;
    }
    if (h->user != (const char *)p) {
        hak_report_bad_pointer(op, p, "interior pointer: not the start of a block");
        return NULL;
    }
    if (HAK_SECURE && *canary_of(h) != canary_value(h)) { /* in warn mode the block stays allocated */
        hak_report_bad_pointer(op, p, "a write before the start of this block overwrote its canary");
        canary_set(h);
        return NULL;
    }
    if (HAK_SECURE && !block_slack_intact(h)) {
        hak_report_bad_pointer(op, p, "a write past the end of this block overwrote its slack");
        slack_set(h);
        return NULL;
    }
    return h;
}

void large_unmap(large_hdr_t *h)
{
    char *base = h->map_base;
    size_t size = h->map_size;
    h->magic = 0;
    large_unmark(h);
    os_unmap(base, size);
    atomic_fetch_sub_explicit(&hak_large_mapped, size, memory_order_relaxed);
    atomic_fetch_sub_explicit(&hak_large_mappings, 1, memory_order_relaxed);
}

/* The site learns the block's lifetime and, while its rules are being
 * drawn, how much of a new block the program touched. */
static void large_died(large_hdr_t *h)
{
    if (!hak_config.profile)
        return;
    if (h->sample)
        hak_profile_hooks.sample_freed(h->sample);
    hak_profile_hooks.lifetime(h->site_index, h->born);
    /* Huge pages are resident whole: they tell nothing of the touches. */
    if (h->fresh && !h->huge && h->size && hak_profile_hooks.wants_touch(h->site_index)) {
        char *first_page = block_pages(h);
        size_t span = (size_t)(h->user + h->size - first_page);
        hak_profile_hooks.touched(h->site_index, os_resident_bytes(first_page, span), span);
    }
}

/* Freed blocks go to BigCache when it takes them (unless a site rule says
 * the site's blocks are never reused), aligned ones too: a cached block
 * serves any request its address is aligned for. */
void large_free(void *p, const char *op)
{
    large_hdr_t *h = large_header_checked(p, op);
    if (!h)
        return;
    large_died(h);
    if (!(h->site_rules & RULE_NO_BIGCACHE) && cached_protect(h, false)) {
        h->magic = LARGE_MAGIC_CACHED;
        if (bigcache_put(h))
            return;
    }
    large_unmap(h);
}

size_t large_usable_size(const void *p, const char *op)
{
    large_hdr_t *h = large_header_checked(p, op);
    return h ? HAK_SECURE ? request_bytes(h) : h->usable : 0;
}

/* h holds size bytes now, after a realloc at site: for the profile an
 * allocation of size bytes, counted down as a new block's are; where it
 * is a sample, the block's record is a new one (the old one dies), else
 * an old record takes the new size. */
static void large_resized(large_hdr_t *h, size_t size, uintptr_t site)
{
    uint32_t sample = hak_config.profile ? hak_profile_hooks.large_sample(size, site) : 0;
    if (sample) {
        if (h->sample)
            hak_profile_hooks.sample_freed(h->sample);
        h->sample = sample;
    } else if (h->sample) {
        hak_profile_hooks.sample_resized(h->sample, size);
    }
    h->size = size;
    slack_set(h);
}

/* The mapping of h resized for a block of size: the tail unmapped, or
 * the mapping grown in place or moved with mremap, its pages (resident
 * ones too) going with it: the contents are never copied. Returns the
 * header, where the mapping now starts, or NULL with errno ENOMEM and h
 * unchanged. */
static large_hdr_t *large_resize(large_hdr_t *h, size_t size)
{
    size_t page = os_page_size(), colour = (size_t)(h->user - h->map_base) - guard_size() - page;
    if (size > SIZE_MAX - page - SS_SIZE) {
        errno = ENOMEM;
        return NULL;
    }
    size_t new_map = page + page_round(colour + size) + 2 * guard_size();
    if (new_map == h->map_size)
        return h;
    if (h->untold) { /* its bytes change: it counts again at its next free */
        purger_young_retaken(h->usable);
        h->untold = 0;
    }
    char *base = h->map_base;
    size_t old_map = h->map_size;
    guard_set(h, false); /* the mapping is one range again for mremap */
    /* Cleared before a move: once mremap has moved the pages, another
     * thread may map the old range, and its entries must not be cleared. */
    large_unmark(h);
    if (new_map < old_map) {
        if (!os_unmap(base + new_map, old_map - new_map))
            new_map = old_map; /* the tail stays the block's, purged */
    } else {
        /* The block's first chunk must stay 2 MiB-aligned (alignments
         * above that are not kept by realloc, as in glibc). */
        char *moved = os_remap_aligned(base, old_map, new_map, SS_SIZE, guard_size() + page, segmap_cover);
        if (!moved) {
            large_mark(h);
            guard_set(h, true);
            return NULL; /* errno ENOMEM */
        }
        base = moved;
    }
    atomic_fetch_add_explicit(&hak_large_mapped, new_map - old_map, memory_order_relaxed); /* modulo 2^64 */
    h = large_place(base, new_map, colour);
    guard_set(h, true);
    canary_set(h);
    large_mark(h);
    return h;
}

/* p, the block realloc just moved out of a page arena past the
 * threshold, whose site's buffers leave the arenas at the threshold from
 * now on (site_outgrew_arena): if it is a large block (the tuner may have
 * moved the threshold meanwhile), judged by BigCache as born there
 * (block_fits), it serves the site's next buffer, which asks for a little
 * more than the threshold and grows, where a block judged by its size
 * would not fit and the next buffer would map and fault in a new one. */
void large_born_at_threshold(void *p)
{
    large_hdr_t *h = large_header_of(p);
    if (h)
        h->born_size = hak_large_threshold() + 1;
}

/* Grow or shrink in place when the mapping allows, else move the pages
 * (large_resize). site: realloc's caller. */
void *large_realloc(void *p, size_t size, uintptr_t site)
{
    large_hdr_t *h = large_header_checked(p, "realloc");
    if (!h) {
        errno = EINVAL;
        return NULL;
    }
    /* In place where the block grows into its own slack: BigCache hands
     * a buffer that grew the block before it to the next buffer of its
     * site (bigcache.c). */
    if (size >= h->size && size <= h->usable) {
        large_resized(h, size, site);
        return p;
    }
    size_t old_usable = h->usable;
    h = large_resize(h, size);
    if (!h)
        return NULL;
    large_resized(h, size, site);
    if (h->usable > old_usable)
        large_back(h, h->user + old_usable);
    return h->user;
}
