/* Layer 5, the page arenas (arena.c): blocks above 16 KiB up to the
 * large threshold as runs of 4 KiB pages, the lanes' pools, and the
 * arena map's entries, which the threads' fronts to the arenas (front.c,
 * in the heaps' layer; their geometry is in layout.h) read and mark. */
#ifndef HAKMEM_ARENA_H
#define HAKMEM_ARENA_H

#include "layout.h"

void arena_init(void);
unsigned arena_lane_next(void);
void *arena_alloc(size_t size, size_t align, unsigned lane, bool zero);
void arena_free(void *p, const char *op);
size_t arena_usable_size(const void *p, const char *op);
size_t arena_realloc_in_place(void *p, size_t size, bool resize, bool *resized, uintptr_t site, const char *op);
bool arena_owns(const void *p);
void arena_mark_sampled(void *p, uint32_t record);
uint64_t arena_purge(bool force);
void arena_purge_lane(unsigned lane);
void arena_release(void);
void arena_stats(size_t *arenas, size_t *used_bytes, size_t *free_bytes, size_t *dirty_bytes, size_t *pooled_bytes);
void arena_fork_prepare(void);
void arena_fork_parent(void);
void arena_fork_child(void);

void *arena_pool_take(unsigned lane, uint32_t pages);
bool arena_pool_put(void *p, uint64_t e, unsigned bin);
bool arena_in_lane(const void *p, unsigned lane);
/* The hardened build's canaries (arena.c): p, a block handed out, holds a
 * request of request bytes; whether its canary and slack hold; a block
 * put in a front marked, and checked when taken from it. */
void arena_block_sized(void *p, size_t request);
bool arena_block_intact(const void *p);
void arena_freed_mark(void *p);
void arena_freed_check(const void *p);
void arena_pools_flush(unsigned lane);

/* The arena's map: an 8-byte entry a page, ARENA_MAP_OFFSET bytes into
 * the arena. A block waiting in a thread's front or a lane's pool is
 * marked in its head entry (E_IN_FRONT), which only the thread holding
 * the block writes: neither the free nor the malloc reads a line of the
 * block for it. Its second word, as the mark of a free slab block, was
 * read by the free after the program's page-strided writes had flushed
 * the block's first line from L1: json 100.8 ns against 64.5 without that
 * read on the AMD host of f467080. */
#define ARENA_MAP_OFFSET ((size_t)0x500)

enum extent_state { EXTENT_NONE, EXTENT_USED, EXTENT_FREE, EXTENT_PURGING /* free, its pages being purged */ };

/* An entry: the extent's length in pages, its state, whether it is the
 * head (the tail of a one-page extent is its head), for free extents
 * whether their pages may be resident (dirty), whether the purger saw
 * them free at its last look (seen), and in the head the bin links (page
 * indexes, 0 for none: page 0 is the header's). The head of a used extent
 * has no links: where the block is a profiling sample (sampled), its
 * upper half holds the index of the sample's record (sample.c), and where
 * it waits in a thread's front, the first link bit says so (in front). */
#define E_PAGES_MASK ((uint64_t)0x7fff)
#define E_STATE_SHIFT 15
#define E_STATE_MASK ((uint64_t)3 << E_STATE_SHIFT)
#define E_HEAD ((uint64_t)1 << 17)
#define E_DIRTY ((uint64_t)1 << 18)
#define E_SEEN ((uint64_t)1 << 19)
#define E_SAMPLED ((uint64_t)1 << 20)
#define E_IN_FRONT ((uint64_t)1 << 21) /* a used head's: the block waits in a thread's front or a pool */
#define E_NEXT_SHIFT 21
#define E_PREV_SHIFT 35
#define E_LINK_MASK ((uint64_t)0x3fff)
#define E_RECORD_SHIFT 32
#define E_SAMPLE_BITS (E_SAMPLED | ~(uint64_t)0 << E_RECORD_SHIFT)
#define E_USED_HEAD (E_HEAD | ((uint64_t)EXTENT_USED << E_STATE_SHIFT))

static inline uint32_t e_pages(uint64_t e) { return (uint32_t)(e & E_PAGES_MASK); }

/* The head entry's fields the fronts test: a block handed out, not a
 * sample, not in a front, has (e & E_FRONT_TEST) == E_USED_HEAD. */
#define E_FRONT_TEST (E_HEAD | E_STATE_MASK | E_SAMPLED | E_IN_FRONT)

/* The head entry of b, an arena block (its first page's). */
static inline _Atomic uint64_t *arena_head_entry(const void *b)
{
    uintptr_t arena = (uintptr_t)b & ~(uintptr_t)ARENA_MASK;
    return (_Atomic uint64_t *)(arena + ARENA_MAP_OFFSET) + (((uintptr_t)b - arena) >> ARENA_PAGE_SHIFT);
}

/* The front's mark at *word goes. */
static inline void front_unmark(_Atomic uint64_t *word)
{
    atomic_store_explicit(word, atomic_load_explicit(word, memory_order_relaxed) & ~E_IN_FRONT, memory_order_relaxed);
}

#endif
