/* Layer 8, dispatch: the allocation and free fast paths, inlined into the
 * exported entry points (override.c, override_cxx.c), and the entry
 * points of alloc.c behind them. Everything not on the common path is
 * out of line. The call tree, inline functions marked *:
 *
 * malloc(size)                                  override.c
 *   hak_alloc*                  size <= 1 KiB: a tiny class
 *     hak_alloc_class* -> hak_alloc_from*       pop heap->cache[c]
 *       cache_next*                             the next block, prefetched
 *       sample_fast_hit                         the countdown hit 0: a sample
 *       heap_alloc_slow                         heap.c: the cache is empty
 *         slab_take_list / heap_alloc_refill    the current slab's list; else
 *                                               carve, remote frees, another
 *                                               slab, an orphan, a new slab
 *   hak_alloc_slow_size                         alloc.c: above 1 KiB, or 0
 *     hak_alloc_front                           up to 64 KiB: mid_front_pop*
 *                                               (a stash or an arena bin),
 *                                               else the slab path or
 *                                               arena_alloc
 *     hak_alloc_above_front                     arena_front_take* (classes
 *                                               to 256 KiB), arena_alloc,
 *                                               large_alloc (BigCache first)
 *
 * free(p)                                       override.c
 *   hak_free_checked*           segmap_entry*: the slab, or which tier,
 *                                               or not hakmem's
 *     push onto the slab's list                 the owner's block, not the
 *                                               last one in use
 *     heap_free_last_block                      heap.c: the slab empties
 *     hak_free_stashed* -> heap_stash_take*     a mid block to its stash
 *     hak_free_irregular                        alloc.c: another thread's
 *                                               block (heap_remote_free),
 *                                               aligned blocks, bad pointers
 *     arena_front_free                          arena.c: to the thread's front
 *     hak_free_slow                             alloc.c: large blocks,
 *                                               samples, foreign pointers */
#ifndef HAKMEM_ALLOC_H
#define HAKMEM_ALLOC_H

#include "heap.h"
#include "large.h"
#include "profile.h"
#include "purger.h"

/* alloc.c: everything behind the fast paths. */
void *hak_alloc_slow_size(size_t size, uintptr_t site);
void *hak_calloc_slow(size_t size, uintptr_t site);
void hak_free_slow(void *p, const char *op);
void *hak_alloc_aligned(size_t align, size_t size, uintptr_t site);
size_t hak_usable_size_checked(const void *p, const char *op);
void *hak_realloc_impl(void *p, size_t size, uintptr_t site);
void hak_free_irregular(slab_t *s, void *p, const char *op);

/* The block after b in the cache, its line fetched for writing. The next
 * malloc of the class reads that block's link, and where the block was
 * freed long before (a batch of 1 KiB blocks is 1 MiB) it waited on L2 or
 * beyond, each pop on the one before: bench_tiny lifo 1 KiB 1.08 and 1.11
 * times as fast in two runs, random 512 B 1.09 and 1.09, for one
 * instruction a malloc (70.85 -> 71.85); 16 B sizes, larson, mid, spread
 * and json unchanged (measured at 8e3e24a). The hardened
 * build, whose shuffled order defeats the hardware prefetcher, had it
 * first (lifo at 1 KiB 189 -> 223); it checks the link as block_next
 * does, but a link that leaves the SuperSlab (the end of the list, or a
 * write after free) ends the list here instead of calling out, which
 * would give this path a stack frame: a corrupt link is reported by the
 * refill that follows, before anything else is handed out. The prefetch
 * of the NULL that ends a list faults nothing. Class 0, the 16 B blocks,
 * fetches b itself, already in L1: on an Intel Xeon host their loops ran
 * faster without the fetch of the next block, bench_tiny lifo, fifo and
 * random 16 B 1.19, 1.30 and 1.24 times (32 B and 1 KiB unchanged,
 * measured at fd20e5b; on an AMD EPYC host the fetch of the next block
 * won instead, 1.02 to 1.05, at e39833f). The choice is a select, not a
 * branch: a program of random sizes mispredicted the branch on one
 * malloc in eight (cachegrind, bench_threads mstress), and the select
 * won mstress at 1 thread 1.05 and 1.08, bench_tiny random 16 B 1.02 and
 * 1.07, for two instructions more on class 0's malloc and one on the
 * others' (bench_pair 65.86 -> 67.86; AMD EPYC, at e39833f). c is the
 * class of the cache. */
static inline void *cache_next(heap_t *heap, size_t c, const void *b)
{
    void *next;
    if (!HAK_SECURE) {
        next = block_next(b);
    } else {
        uintptr_t next_xor_b = block_next_xor_b(b);
        if (unlikely(next_xor_b >= SS_SIZE)) {
            if (next_xor_b != (uintptr_t)b)
                heap->corrupt_link = b;
            return NULL;
        }
        next = (void *)(next_xor_b ^ (uintptr_t)b);
    }
    prefetch_for_write(HAK_SECURE || c ? next : b); /* the hardened build has no class 0 */
    return next;
}

/* Take size bytes off the sampling countdown; true while it stays above
 * zero (the allocation is no sample). One subtraction from memory and one
 * branch on its flags: written as C, GCC loads, subtracts, stores and
 * tests (two instructions more a malloc, bench_pair 71.9 -> 74.8). */
static inline bool sample_countdown(heap_t *heap, size_t size)
{
#if defined(__x86_64__)
    bool above_zero;
    __asm__("subq %2, %0" : "+m"(heap->sample_left), "=@ccg"(above_zero) : "r"((long)size));
    return above_zero;
#else
    return (heap->sample_left -= (long)size) > 0;
#endif
}

/* Pop a block of class c from heap's cache (the calling thread's); the
 * allocation that takes the thread's countdown of bytes to zero or below
 * is a sample (sample.c). size and site are what
 * the program asked for and where from (site 0: never tracked). */
static inline void *hak_alloc_from(heap_t *heap, size_t c, size_t size, uintptr_t site)
{
    void *b = heap->cache[c];
    if (likely(b != NULL)) {
        heap->cache[c] = cache_next(heap, c, b);
        block_handed_out(b);
        if (likely(sample_countdown(heap, size)))
            return b;
        return sample_fast_hit(heap, c, b, size, site);
    }
    return heap_alloc_slow(heap, c, size, site);
}

static inline void *hak_alloc_class(size_t c, size_t size, uintptr_t site)
{
    return hak_alloc_from(heap_get(), c, size, site);
}

/* The caller of the exported entry point: the call site, which profiling
 * charges and the large tier keys BigCache on. */
#define HAK_CALLER ((uintptr_t)__builtin_return_address(0))

/* The alignments aligned_alloc, posix_memalign and aligned new accept. */
static inline bool is_power_of_two(size_t x) { return x && !(x & (x - 1)); }

/* A tiny class is 16 B more than the one before it: the default build's
 * request of 1..TINY_MAX bytes takes class (size - 1) / 16, and one compare
 * sends 0 with the larger sizes to hak_alloc_slow_size (the table's
 * address and load, and a class as unsigned, widened for the index, cost
 * 3 instructions a malloc: bench_pair 71.87 -> 68.87). The hardened
 * build's canary moves its requests up a class but never into the 16-byte
 * one (hak_tiny_class_of). */
static inline void *hak_alloc(size_t size, uintptr_t site)
{
    if (HAK_SECURE) {
        if (likely(size <= TINY_MAX - BLOCK_CANARY))
            return hak_alloc_class(hak_tiny_class_of[(size + BLOCK_CANARY + 15) >> 4], size, site);
    } else if (likely(size - 1 < TINY_MAX)) {
        return hak_alloc_class((size - 1) >> 4, size, site);
    }
    return hak_alloc_slow_size(size, site);
}

/* p starts a block of s that was handed out and is not marked free: on a
 * block boundary and carved. The owner's frees check this much on the
 * fast path. */
static inline bool slab_block_unfreed_with(const slab_t *s, const void *p, block_keys_t keys)
{
    uint64_t offset_times_recip = (uint64_t)((const char *)p - s->start) * s->recip;
    return !(offset_times_recip & RECIP_REMAINDER_BITS) && (const char *)p < s->carved_end &&
           !block_is_free_with(p, keys);
}

static inline bool slab_block_unfreed(const slab_t *s, const void *p)
{
    return slab_block_unfreed_with(s, p, block_keys(p));
}

/* One block fewer in use in s, true if some are left; else (the count was
 * 1, or 0 and a double free) false, with the count one below what it
 * was. One subtraction from memory and a branch on its flags: as C, GCC
 * loads, compares, subtracts and stores (bench_pair 68.87 -> 65.89, with
 * the free's keys read once before it). */
static inline bool slab_used_drop(slab_t *s)
{
#if defined(__x86_64__)
    bool above_zero;
    __asm__("subl $1, %0" : "+m"(s->used), "=@cca"(above_zero));
    return above_zero;
#else
    return s->used-- > 1;
#endif
}

/* The same, and the slab counts blocks in use (a stashed block stays
 * counted). */
static inline bool slab_block_in_use(const slab_t *s, const void *p) { return s->used && slab_block_unfreed(s, p); }

/* p, a live block of s (a mid slab the caller owns), joins its class's
 * stash if the stash has room: up to HEAP_STASH_BYTES, and in the
 * hardened build, which links a list only inside one SuperSlab
 * (block_next), only onto blocks of p's SuperSlab; there, where `check`
 * says, only with its canaries whole (else hak_free_irregular, which
 * reports; it checks them once, where the stash has no room). The purger
 * changes the stashes under its claim: called inside the owner's mark
 * (heap_mid_enter). */
static inline bool heap_stash_take(heap_t *heap, slab_t *s, void *p, bool check)
{
    uintptr_t head = *heap_stash(heap, s->class_idx);
    if ((size_t)front_count(head) * s->block_size >= HEAP_STASH_BYTES ||
        (HAK_SECURE && head && superslab_of(front_first(head)) != superslab_of(p)) ||
        (HAK_SECURE && check && block_canary_broken(s, p)))
        return false;
    HAK_COUNT(heap, free_stashed);
    heap_stash_push(heap, s->class_idx, p);
    return true;
}

/* The owner's free of p, a block of s, a mid slab (its owner word flagged
 * SLAB_STASHES_FREES), onto its class's stash, where the next malloc of the
 * class takes it; false if it cannot go there now (the purger's claim, a
 * full stash, p not a live block's start: hak_free_irregular sees to it).
 * The heap and the owner word are read again, behind a compiler barrier:
 * kept in registers from the tiny path's compare, they cost every tiny
 * pair an instruction (bench_pair 71.86 -> 72.86). */
static inline bool hak_free_stashed(slab_t *s, void *p)
{
    atomic_signal_fence(memory_order_seq_cst);
    heap_t *heap = heap_get();
    if (atomic_load_explicit(&s->owner, memory_order_relaxed) != ((uintptr_t)heap | SLAB_STASHES_FREES) ||
        unlikely(!heap_mid_enter(heap)))
        return false;
    bool stashed = slab_block_in_use(s, p) && heap_stash_take(heap, s, p, true);
    heap_mid_leave(heap);
    if (likely(stashed))
        heap_mid_cached(heap);
    return stashed;
}

/* hak_free_stashed out of line, else hak_free_irregular: for the
 * hardened build, whose check of the stash's SuperSlab inline took the
 * registers that keep the free fast path without a stack frame (a push
 * and a pop on every free: 79.9 -> 80.9 instructions a tiny pair). */
void hak_free_stashed_or_irregular(slab_t *s, void *p, const char *op);

/* Free: a block of the page arenas goes to the thread's front
 * (arena_front_free; through hak_free_slow's dispatch, json's 64 KiB
 * pair took 17 instructions more), anything else outside the SuperSlabs
 * to hak_free_slow. Else the map's entry is the slab, and if the caller
 * owns it with no flag set, push the block onto the slab's
 * free list; the slab's last block goes to heap_free_last_block, checked
 * as the others (a loop that takes and frees one mid block, battle json,
 * went through hak_free_irregular's checks a second time: 42
 * instructions of 130 an iteration). A mid slab's block goes to its
 * class's stash (hak_free_stashed; through hak_free_irregular, bench
 * mid4k took 11 instructions more a pair, 135.2 against 124.2).
 * Anything unusual (another thread's slab, a slab with other flags, a
 * pointer that is not a block start, a block that carries the free mark,
 * a slab with no block in use, the purger at the stashes, a broken canary
 * in the hardened build) goes to hak_free_irregular, which also reports. */
static inline void hak_free_checked(void *p, const char *op)
{
    uintptr_t entry = segmap_entry(p);
    if (unlikely(entry <= SEG_KIND_MAX)) {
        if (entry == SEG_ARENA)
            arena_front_free(p, op);
        else
            hak_free_slow(p, op);
        return;
    }
    slab_t *s = (slab_t *)entry;
    heap_t *heap = heap_get();
    if (likely(atomic_load_explicit(&s->owner, memory_order_relaxed) == (uintptr_t)heap)) {
        block_keys_t keys = block_keys(p); /* read once: slab_used_drop's store may alias them */
        if (likely(slab_block_unfreed_with(s, p, keys)) && (!HAK_SECURE || likely(block_canaries_plain(s, p)))) {
            if (likely(slab_used_drop(s))) {
                HAK_COUNT(heap, free_local);
                block_link_with(p, s->free, keys);
                s->free = p;
                return;
            }
            if (++s->used == 1) { /* the slab empties */
                HAK_COUNT(heap, free_local_slow);
                heap_free_last_block(s, p);
                return;
            }
        }
    } else if (HAK_SECURE) {
        hak_free_stashed_or_irregular(s, p, op);
        return;
    } else if (hak_free_stashed(s, p)) {
        return;
    }
    hak_free_irregular(s, p, op);
}

#endif
