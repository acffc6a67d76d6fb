/* The allocation paths behind the inline fast paths: mid and large sizes,
 * irregular frees (remote, flagged slabs, bad pointers), aligned
 * allocation, usable size and realloc. */
#include "alloc.h"
#include "init.h"
#include "mesh.h"

#include <errno.h>
#include <stdint.h>
#include <string.h>

/* Requests beyond PTRDIFF_MAX cannot be honoured (pointer differences
 * would overflow), as in glibc. */
static void *fail_enomem(void)
{
    errno = ENOMEM;
    return NULL;
}

/* The first block of class c's stash, which is not empty, handed out. */
static inline void *heap_stash_pop(heap_t *heap, unsigned c)
{
    uintptr_t *stash = heap_stash(heap, c);
    void *b;
    if (HAK_SECURE) {
        b = front_first(*stash);
        *stash = (uintptr_t)block_next(b);
    } else {
        b = front_unlink(stash, 0);
    }
    block_handed_out(b);
    return b;
}

/* A block of mid class c, inside the owner's mark (heap_mid_enter): the
 * purger flushes the mid caches under a claim. Everything but a pop from
 * the stash or the cache takes the call, so that the pop needs no stack
 * frame. A sample is timed on a pop from the stash if it holds a block,
 * not on a refill, which would switch slabs while the stash holds blocks
 * (HAKMEM_PROFILE_SAMPLE=16: one malloc in 20 did). */
static HAK_NOINLINE void *hak_alloc_mid_slow(unsigned c, size_t size, uintptr_t site)
{
    heap_t *heap = heap_get();
    if (unlikely(heap == &hak_empty_heap) && !(heap = heap_thread_init()))
        return NULL;
    while (unlikely(!heap_mid_enter(heap)))
        heap_mid_wait(heap);
    void *b;
    if (!*heap_stash(heap, c)) {
        b = hak_alloc_from(heap, c, size, site);
    } else if ((heap->sample_left -= (long)size) > 0) {
        b = heap_stash_pop(heap, c);
    } else {
        float weight = sample_interval_end(heap, size);
        uint64_t start = hak_ticks();
        b = sample_take(heap, c, heap_stash_pop(heap, c), size, site, weight, start);
    }
    heap_mid_leave(heap);
    purger_start_if_wanted();
    return b;
}

/* The stash first, the blocks the thread freed last (the next malloc
 * takes the one just freed, still in L1), then the cache, the blocks a
 * refill took from the current slab. */
static inline void *hak_alloc_mid(unsigned c, size_t size, uintptr_t site)
{
    heap_t *heap = heap_get();
    if (likely(heap_mid_enter(heap))) { /* hak_empty_heap: a NULL cache and stash */
        void *b;
        if (likely(*heap_stash(heap, c) != 0 && heap->sample_left > (long)size)) {
            b = heap_stash_pop(heap, c);
            heap->sample_left -= (long)size;
            heap_mid_leave(heap);
            return b;
        }
        b = heap->cache[c];
        if (likely(b != NULL && heap->sample_left > (long)size)) {
            heap->cache[c] = cache_next(heap, c, b);
            block_handed_out(b);
            heap->sample_left -= (long)size;
            heap_mid_leave(heap);
            return b;
        }
        heap_mid_leave(heap);
    }
    return hak_alloc_mid_slow(c, size, site);
}

/* A block of the page arenas from the thread's lane, cleared if asked.
 * The allocation that ends a sampling interval is the sample, as in the
 * slabs. Where no arena can be mapped (a limit of address space reached),
 * the block gets a mapping of its own. */
static HAK_NOINLINE void *hak_alloc_arena_slow(size_t size, size_t align, uintptr_t site, bool zero)
{
    heap_t *heap = heap_get();
    if (unlikely(heap == &hak_empty_heap) && !(heap = heap_thread_init()))
        return NULL;
    /* The purger (or a collect) is emptying the front: once it is done,
     * the blocks the front held are back in their arenas for the lane to
     * find (taking another block meanwhile failed test_threads' reuse
     * check, rarely, under load). */
    heap_mid_wait(heap);
    if (unlikely((heap->sample_left -= (long)size) <= 0)) {
        void *p = sample_take_arena(heap, size, align, site, zero);
        purger_start_if_wanted(); /* a dump the sample asked for (HAKMEM_PROFILE_PEAK) */
        return p;
    }
    uint32_t pages = arena_pages_for(size);
    if (hak_config.arena_pool && !align && pages >= ARENA_FRONT_MIN_PAGES && pages <= ARENA_FRONT_MAX_PAGES) {
        void *b = arena_pool_take(heap->arena_lane, pages);
        if (b)
            return zero ? memset(b, 0, size) : b;
    }
    void *p = arena_alloc(size, align, heap->arena_lane, zero);
    if (unlikely(!p))
        return zero ? large_alloc_zeroed(size, site) : large_alloc(size, align, site);
    return p;
}

/* A block of the page arenas, from the thread's front if it holds one of
 * that many pages (not the sample, not in hak_empty_heap, whose
 * sample_left is 0 and whose front must stay empty): as for the mid
 * caches, the rest is out of line so that the pop needs no stack frame. */
static inline void *hak_alloc_arena_run(size_t size, size_t align, uintptr_t site, bool zero)
{
    heap_t *heap = heap_get();
    if (!align && likely(heap->sample_left > (long)size)) {
        void *b = arena_front_take(heap, size);
        if (likely(b != NULL)) {
            heap->sample_left -= (long)size;
            return zero ? memset(b, 0, size) : b;
        }
    }
    return hak_alloc_arena_slow(size, align, site, zero);
}

/* The same, where the hardened build records the request in the block's
 * canary (arena.c); the slow path may have served a large block. */
static inline void *hak_alloc_arena(size_t size, size_t align, uintptr_t site, bool zero)
{
    void *b = hak_alloc_arena_run(size, align, site, zero);
    if (HAK_SECURE && b && segmap_kind(b) == SEG_ARENA)
        arena_block_sized(b, size);
    return b;
}

/* A mid block of class c for a request of size bytes; the hardened build
 * records the request in its canary (block_slack_set), or in a page
 * arena's block's where the block is a sample served there. */
static inline void *hak_alloc_mid_sized(unsigned c, size_t size, uintptr_t site)
{
    void *b = hak_alloc_mid(c, size, site);
    if (HAK_SECURE && b) {
        unsigned kind = segmap_kind(b);
        if (kind == SEG_SUPERSLAB)
            block_slack_set(b, hak_class_size[c], size);
        else if (kind == SEG_ARENA)
            arena_block_sized(b, size);
    }
    return b;
}

/* A size above the tiny ones and up to LARGE_THRESHOLD_MIN, by its tier's
 * own path. */
static inline void *hak_alloc_by_tier(size_t size, uintptr_t site)
{
    if (size_in_slabs(size))
        return hak_alloc_mid_sized(mid_class_of(size + BLOCK_CANARY), size, site);
    return hak_alloc_arena(size, 0, site, false);
}

/* Out of line, so that hak_alloc_front's pop needs no stack frame. */
static HAK_NOINLINE void *hak_alloc_front_missed(size_t size, uintptr_t site)
{
    return hak_alloc_by_tier(size, site);
}

/* Above the tiny sizes and up to LARGE_THRESHOLD_MIN: the block freed
 * last of the size's mid front, with the same instructions whichever
 * tier the list holds, so that no branch follows the tier. Where a
 * program mixes the tiers at random (bench mid: 1..64 KiB), a branch on
 * the tier went the other way at one malloc in four (measured at
 * ed112a5). Anything else takes the tier's own path: an empty list,
 * the sample, the purger at the fronts, and the hardened build, which
 * reads each tier's links its own way (heap_stash_pop, arena_front_pop). */
static inline void *hak_alloc_front(size_t size, uintptr_t site)
{
    if (HAK_SECURE)
        return hak_alloc_by_tier(size, site);
    heap_t *heap = heap_get();
    if (likely(heap_mid_enter(heap))) {
        unsigned f = front_of(size);
        uintptr_t *list = &heap->front[f];
        if (likely(*list != 0 && heap->sample_left > (long)size)) {
            void *b = mid_front_pop(list, f);
            heap->sample_left -= (long)size;
            heap_mid_leave(heap);
            return b;
        }
        heap_mid_leave(heap);
    }
    return hak_alloc_front_missed(size, site);
}

/* Above the threshold's least value: out of line, so that the pop of
 * hak_alloc_front needs no stack frame (the call to a class's stack in
 * the arenas' front gave json's 64 KiB malloc five pushes and pops). */
static HAK_NOINLINE void *hak_alloc_above_front(size_t size, uintptr_t site)
{
    hak_ensure_init(); /* the threshold is an option */
    if (size <= hak_large_threshold())
        return hak_alloc_arena(size, 0, site, false);
    if (unlikely(size > PTRDIFF_MAX))
        return fail_enomem();
    return large_alloc(size, 0, site);
}

/* Up to the threshold's least value the tier depends neither on the
 * threshold nor on init: before its first slow path, which inits, a
 * thread has hak_empty_heap, whose lists are empty and whose sample_left
 * keeps it off them. */
void *hak_alloc_slow_size(size_t size, uintptr_t site)
{
    if (size <= TINY_MAX - BLOCK_CANARY) /* 0, which hak_alloc sends here */
        return hak_alloc_class(slab_class_for(size), size, site);
    if (size <= LARGE_THRESHOLD_MIN)
        return hak_alloc_front(size, site);
    return hak_alloc_above_front(size, site);
}

/* Zeroed memory above the tiny sizes: arena and large blocks clear only
 * what needs it (new or purged pages are zero already); slab blocks are
 * cleared here. */
void *hak_calloc_slow(size_t size, uintptr_t site)
{
    hak_ensure_init();
    if (size_in_arenas(size))
        return hak_alloc_arena(size, 0, site, true);
    if (!size_in_slabs(size) && size <= PTRDIFF_MAX)
        return large_alloc_zeroed(size, site);
    void *p = hak_alloc_slow_size(size, site); /* a slab block, or NULL and ENOMEM */
    if (likely(p))
        memset(p, 0, size);
    return p;
}

/* ---- free ---------------------------------------------------------------- */

void hak_free_slow(void *p, const char *op)
{
    if (!p)
        return;
    unsigned kind = segmap_kind(p);
    if (kind == SEG_LARGE_HEAD || kind == SEG_LARGE_INTERIOR) {
        HAK_COUNT(heap_get(), free_large);
        large_free(p, op);
    } else if (kind == SEG_SUPERSLAB)
        hak_free_irregular(slab_of(p), p, op);
    else if (kind == SEG_SAMPLED)
        sample_free(p, op);
    else
        hak_report_bad_pointer(op, p, "pointer not allocated by hakmem (foreign, stack or global memory, or already freed)");
}

/* The block that p addresses, checked; NULL (after a report) if p is not
 * the start of a carved block, or inside one of a slab with aligned blocks. */
static void *slab_block_checked(slab_t *s, void *p, const char *op)
{
    if (unlikely(!s->in_use)) {
        hak_report_bad_pointer(op, p, "pointer into hakmem memory that holds no block (freed slab or metadata)");
        return NULL;
    }
    uint32_t index = slab_block_index(s, p);
    char *block = s->start + (size_t)index * s->block_size;
    if (unlikely(index >= slab_carved(s))) {
        hak_report_bad_pointer(op, p, "pointer into hakmem memory that was never handed out");
        return NULL;
    }
    uintptr_t owner = atomic_load_explicit(&s->owner, memory_order_relaxed);
    if (unlikely(block != (char *)p) && !(owner & SLAB_ALIGNED)) {
        hak_report_bad_pointer(op, p, "interior pointer: not the start of a block");
        return NULL;
    }
    return block;
}

/* The owner's free of p onto its slab's own list (p is a live block of s);
 * the last block goes to heap_free_last_block. */
static inline void slab_free_owned(slab_t *s, void *p)
{
    if (s->used == 1) {
        heap_free_last_block(s, p);
        return;
    }
    block_link(p, s->free);
    s->free = p;
    s->used--;
}

/* p, freed by the owner of s (a mid class), goes to the class's stash,
 * or where the stash has no room for it (heap_stash_take), to its slab's
 * own list; false if p is not a live block's start. Inside the owner's
 * mark (heap_mid_enter). */
static inline bool heap_mid_push(heap_t *heap, slab_t *s, void *p)
{
    if (unlikely(!slab_block_in_use(s, p)))
        return false;
    if (!heap_stash_take(heap, s, p, false)) { /* its canaries checked (hak_free_irregular) */
        HAK_COUNT(heap, free_local_slow);
        slab_free_owned(s, p);
    }
    return true;
}

/* Everything the free fast path (hak_free_checked) does not take:
 * checked, diagnosed, pushed where it belongs. The owner's free of a
 * mid block comes here while the purger claims the stashes, where the
 * stash has no room for it, or for an aligned block's interior pointer,
 * and its free of a block of a slab it loosened for the purger to mesh.
 * A thread without a heap that frees an exited thread's block takes that
 * thread's heap first (heap_thread_adopt). */
void hak_free_irregular(slab_t *s, void *p, const char *op)
{
    prefetch_for_write(p);
    void *block = slab_block_checked(s, p, op);
    if (!block)
        return;
    if (block_is_free(block) || (unlikely(atomic_load_explicit(&s->owner, memory_order_relaxed) & SLAB_MESHED) &&
                                 mesh_slot_reserved(s, block))) { /* the slot is a meshed partner's */
        hak_report_bad_pointer(op, p, "double free");
        return;
    }
    int broken = HAK_SECURE ? block_canary_broken(s, block) : 0;
    if (unlikely(broken)) { /* in warn mode the block stays allocated, its canaries mended */
        hak_report_bad_pointer(op, p, broken > 0 ? "a write past the end of this block overwrote its canary"
                                                 : "a write before the start of this block overwrote the canary "
                                                   "of the block before it");
        block_canaries_repair(s, block);
        return;
    }
    heap_t *heap = heap_get();
    uintptr_t owner = atomic_load_explicit(&s->owner, memory_order_relaxed);
    if (unlikely(heap == &hak_empty_heap) && heap_thread_adopt(slab_owner_heap(owner))) {
        heap = heap_get();
        owner = atomic_load_explicit(&s->owner, memory_order_relaxed);
    }
    if (slab_owner_heap(owner) != heap) {
        HAK_COUNT(heap, free_remote);
        heap_note_freed_into(heap, s);
        heap_remote_free(s, block);
        return;
    }
    if (owner & SLAB_LOOSE) { /* the purger may be meshing it: its lists are not ours now */
        heap_loose_changed(heap);
        heap_remote_free(s, block);
        return;
    }
    if ((owner & (SLAB_STASHES_FREES | SLAB_MESHED)) == SLAB_STASHES_FREES) { /* a meshed one's: below */
        while (unlikely(!heap_mid_enter(heap)))
            heap_mid_wait(heap);
        bool pushed = heap_mid_push(heap, s, block);
        heap_mid_leave(heap);
        purger_start_if_wanted();
        if (!pushed)
            hak_report_bad_pointer(op, p, "double free");
        else
            heap_mid_cached(heap);
        return;
    }
    HAK_COUNT(heap, free_local_slow);
    if (unlikely(s->used == 0)) {
        hak_report_bad_pointer(op, p, "double free");
        return;
    }
    if (owner & SLAB_MESHED) {
        heap_free_meshed(s, block);
        return;
    }
    slab_free_owned(s, block);
}

void hak_free_stashed_or_irregular(slab_t *s, void *p, const char *op)
{
    if (!hak_free_stashed(s, p))
        hak_free_irregular(s, p, op);
}

/* ---- usable size and realloc ------------------------------------------------- */

#define LARGE_SHRINK_COPY_MAX ((size_t)64 << 10)

/* A page-arena block that realloc grows may pass the large threshold in
 * place, into the free pages after it: a buffer doubled from 64 KiB to 4
 * MiB and freed, again and again, was copied each time it left the arena
 * at 1 MiB (battle grow: 38.3 us a round against glibc's 5.5, which grows
 * it at its heap's top; 6.2 with the growth in place,
 * measured at 2e056b0). Up to half of HAKMEM_ARENA_TRIM (16 MiB by default), so
 * that its free leaves the wilderness it joins below the trim, whose
 * pages the next buffer grows into. A block that has to leave past the
 * threshold after all (no free pages after it, or above the bound) is
 * copied whole, more than at the threshold: its site is noted, and its
 * later buffers leave at the threshold as before. Not where a large block
 * would get huge pages (HAKMEM_HUGEPAGES), nor in the hardened build,
 * whose large blocks end at a guard page. */
static bool arena_grows_past_threshold(size_t size, uintptr_t site)
{
    bool huge = hak_config.hugepages == HUGEPAGES_ALWAYS ||
                (hak_config.prewarm && hak_config.hugepages == HUGEPAGES_PREWARMED);
    return !HAK_SECURE && size <= __atomic_load_n(&hak_config.arena_trim, __ATOMIC_RELAXED) / 2 &&
           !(huge && size >= SS_SIZE) && !site_outgrew_arena(site);
}

size_t hak_usable_size_checked(const void *p, const char *op)
{
    unsigned kind = segmap_kind(p);
    if (kind == SEG_SUPERSLAB) {
        slab_t *s = slab_of(p);
        char *block = slab_block_checked(s, (void *)p, op);
        if (!block)
            return 0;
        long slack = HAK_SECURE ? block_slack(block, s->block_size) : 0;
        return (size_t)(block + s->block_size - BLOCK_CANARY - (slack > 0 ? slack : 0) - (const char *)p);
    }
    if (kind == SEG_LARGE_HEAD || kind == SEG_LARGE_INTERIOR)
        return large_usable_size(p, op);
    if (kind == SEG_ARENA)
        return arena_usable_size(p, op);
    if (kind == SEG_SAMPLED)
        return sample_usable_size(p, op);
    hak_report_bad_pointer(op, p, "pointer not allocated by hakmem (foreign, stack or global memory, or already freed)");
    return 0;
}

/* A realloc that kept its slab block in place is, for the profile, an
 * allocation of size bytes at site, as heaptrack and pprof count it: its
 * bytes are counted down, and where they end the interval the block moves
 * to a new one, which the allocation path makes the sample (a copy of at
 * most 64 KiB, at a sample only; page-arena and large blocks take a new
 * record in place, arena_realloc_in_place and large_realloc). Uncounted, a buffer grown by realloc
 * showed as its first size alone: CPython's list growth, 47% of the bytes
 * of a json workload under heaptrack, came out at 2.5%, redis's listpack
 * inserts at 3% of their 68%. */
static void *realloc_stayed(void *p, size_t size, uintptr_t site)
{
    heap_t *heap = heap_get();
    if (!site || heap == &hak_empty_heap)
        return p;
    if (likely(heap->sample_left > (long)size)) {
        heap->sample_left -= (long)size;
        return p;
    }
    void *q = hak_alloc(size, site);
    if (!q)
        return p;
    memcpy(q, p, size);
    hak_free_checked(p, "realloc");
    return q;
}

void *hak_realloc_impl(void *p, size_t size, uintptr_t site)
{
    if (!p)
        return hak_alloc(size, site);
    if (size == 0) { /* glibc: free and return NULL */
        hak_free_checked(p, "realloc");
        return NULL;
    }
    unsigned kind = segmap_kind(p);
    /* A large block stays large, trimmed or grown in place, unless it
     * shrinks to a size cheaper to copy than the page of slack it keeps. */
    if ((kind == SEG_LARGE_HEAD || kind == SEG_LARGE_INTERIOR) && size >= LARGE_SHRINK_COPY_MAX)
        return large_realloc(p, size, site);
    /* An arena block shrinks in place, or grows into the free pages after
     * it, past the threshold too (arena_grows_past_threshold). */
    size_t usable;
    bool outgrew = false;
    if (kind == SEG_ARENA && size > SLAB_CLASS_MAX) {
        size_t threshold = hak_large_threshold();
        bool resize = size <= threshold || arena_grows_past_threshold(size, site), resized;
        usable = arena_realloc_in_place(p, size, resize, &resized, site, "realloc"); /* counted there */
        if (resized)
            return p;
        outgrew = size > usable && usable > threshold;
        if (outgrew)
            site_note_outgrew_arena(site, usable);
    } else {
        usable = hak_usable_size_checked(p, "realloc");
    }
    if (!usable) {
        errno = EINVAL;
        return NULL;
    }
    /* Stay in place unless the block would be more than half empty. */
    if (size <= usable && size > usable / 2)
        return realloc_stayed(p, size, site);
    void *q = hak_alloc(size, site);
    if (!q)
        return NULL;
    memcpy(q, p, size < usable ? size : usable);
    hak_free_checked(p, "realloc");
    if (outgrew)
        large_born_at_threshold(q);
    return q;
}

/* ---- aligned allocation ------------------------------------------------------- */

/* align is a power of two. Slab blocks of a size that is a multiple of
 * align are naturally aligned (slabs start on 64 KiB); otherwise the block
 * is over-allocated and its slab marked so that free finds the block
 * start. Above, or where the padding would leave the slab classes, the
 * page arenas align a run of pages (the pages before and after it stay
 * free), up to the large threshold; the large tier aligns the rest. */
void *hak_alloc_aligned(size_t align, size_t size, uintptr_t site)
{
    hak_ensure_init(); /* the class tables below must be filled */
    if (align <= 16) /* every block is 16-aligned */
        return hak_alloc(size, site);
    if (unlikely(size > PTRDIFF_MAX - align))
        return fail_enomem();
    size_t natural = size < align ? align : size;
    if (align <= SLAB_PAGE_SIZE && size_in_slabs(natural)) {
        unsigned c = slab_class_for(natural);
        if (!HAK_SECURE && hak_class_size[c] % align == 0) /* blocks from a page's start (not past a lead) */
            return class_stashes_frees(c) ? hak_alloc_mid_sized(c, size, site) : hak_alloc_class(c, size, site);
        size_t padded = size + align - 16;
        if (size_in_slabs(padded)) {
            char *b = hak_alloc(padded, 0); /* not tracked: the block would be freed from inside */
            if (!b)
                return NULL;
            char *aligned = (char *)(((uintptr_t)b + align - 1) & ~(uintptr_t)(align - 1));
            if (aligned != b)
                heap_slab_mark_aligned(slab_of(b));
            return aligned;
        }
    }
    if (natural <= hak_large_threshold()) /* the arenas', or a slab block too small to pad */
        return hak_alloc_arena(size, align, site, false);
    return large_alloc(size, align, site);
}
