/* The threads' fronts to the page arenas, their free side: a block of
 * 16-256 KiB a thread frees waits in its heap for the thread's next
 * malloc of its size. In the heaps' layer: the bins are the heap's, and
 * the page arenas below are reached through arena.h alone (the block's
 * head entry in its arena's map, arena_free, the lanes' pools). */
#define _GNU_SOURCE
#include "heap.h"

/* The head entry of p, a block of a page arena. */
static inline uint64_t head_of(const void *p) { return atomic_load_explicit(arena_head_entry(p), memory_order_relaxed); }

/* Each thread's front to the page arenas: the arena blocks of up to
 * 256 KiB it freed, by page count or class (arena_class_pages), which its
 * next mallocs of that many pages take back without the lane lock and
 * while their lines are still in the cache (bench mid, blocks of 1..64
 * KiB: 31 Mops/s with every block of 16-64 KiB through the lane,
 * measured at f3e89a1). The malloc side is arena_front_take
 * (heap.h), inline in the allocation path.
 *
 * A bin keeps as many blocks as its thread's mallocs asked for: its limit
 * grows by one each time a malloc finds it empty, up to
 * ARENA_FRONT_BIN_BYTES and while the heap's limits together stay within
 * ARENA_FRONT_BYTES, so a thread that only frees (a consumer of
 * another's blocks) keeps nothing. The purger empties a front a purge
 * delay after the first free into it, with the mid caches and under the
 * same claim (heap_mid_enter), and its limits start over; a collect or the
 * thread's exit empties it at once. Blocks in a front stay handed out in
 * their arena, marked in their head entry (E_IN_FRONT): a second free of
 * one is a double free, and hak_owns denies it. A block of a page count's
 * bin carries its list's link in word ARENA_FRONT_LINK, on its second
 * line; nothing is written into a block of a class's bin. */

/* Hardened: b, met on a front's list of blocks of `pages` pages with
 * `count` blocks from it on, must be such a block, and its link must
 * count one block less: a link that a write after free changed stops the
 * program before it is followed. */
void arena_front_check(const uintptr_t *b, uint32_t pages, unsigned count)
{
    if (segmap_kind(b) != SEG_ARENA || front_count(b[ARENA_FRONT_LINK]) != count - 1)
        hak_free_list_corrupt(b);
    arena_freed_check(b);
    uint64_t e = head_of(b);
    if ((e & E_FRONT_TEST) != (E_USED_HEAD | E_IN_FRONT) || e_pages(e) != pages)
        hak_free_list_corrupt(b);
}

/* front_overflow's block of another lane than the thread's: if it starts
 * a block handed out of a front's size whose bin's limit is not 0, to its
 * lane's pool, else to arena_free. */
static HAK_NOINLINE void pool_overflow(void *p, const char *op)
{
    uint64_t e = head_of(p);
    uint32_t pages = e_pages(e);
    heap_t *heap = heap_get();
    if ((e & E_FRONT_TEST) == E_USED_HEAD && pages >= ARENA_FRONT_MIN_PAGES &&
        pages <= ARENA_FRONT_MAX_PAGES && hak_arena_bin_pages[hak_arena_bin_of[pages]] == pages &&
        heap_mid_enter(heap)) {
        unsigned bin = hak_arena_bin_of[pages];
        bool pooled = heap->arena_front_limit[bin] && arena_pool_put(p, e, bin);
        heap_mid_leave(heap);
        if (pooled)
            return;
    }
    arena_free(p, op);
}

/* p, page-aligned inside a page arena, which the calling thread's front
 * did not keep: without pools, or a block of the thread's own lane, to
 * arena_free; another lane's to pool_overflow. Out of line, so that the
 * fronts' pushes keep their registers (a choice made in arena_front_free
 * took battle json's pair 12 instructions more, in class_free three
 * pushes and pops), and with no frame of its own: the lane's test and a
 * jump. */
static HAK_NOINLINE void front_overflow(void *p, const char *op)
{
    if (!hak_config.arena_pool || arena_in_lane(p, heap_get()->arena_lane))
        arena_free(p, op);
    else
        pool_overflow(p, op);
}

/* p, a block of a class's bin (above 64 KiB) whose head entry e is at
 * *entry, joins the calling thread's front if its bin has room, or else
 * front_overflow takes it. Every arena block of these sizes has its class's
 * pages (arena_class_pages); one that has not (a map entry a stray write
 * changed) goes to arena_free, never to a bin that would hand it out for
 * a larger request. Out of line, as the take: inline, its registers gave
 * the free of every front's block a stack frame (a class_push returning
 * to it, flatter, cost 3 instructions more a pair). */
static HAK_NOINLINE void class_free(void *p, const char *op, _Atomic uint64_t *entry, uint64_t e)
{
    uint32_t pages = e_pages(e);
    if (pages <= ARENA_FRONT_MAX_PAGES && hak_arena_bin_pages[hak_arena_bin_of[pages]] == pages /* on its class */) {
        unsigned bin = hak_arena_bin_of[pages], k = bin - ARENA_FRONT_EXACT_BINS;
        heap_t *heap = heap_get(); /* hak_empty_heap: no limit above 0 */
        if (heap_mid_enter(heap)) {
            unsigned n = heap->arena_class_count[k];
            bool kept = n < heap->arena_front_limit[bin];
            if (kept) {
                atomic_store_explicit(entry, e | E_IN_FRONT, memory_order_relaxed); /* first, as for a list: a fork may lose it, never unmark it */
                atomic_signal_fence(memory_order_seq_cst);
                if (HAK_SECURE)
                    arena_freed_mark(p);
                heap->arena_class_stack[k][n] = p;
                heap->arena_class_count[k] = (uint8_t)(n + 1);
            }
            heap_mid_leave(heap);
            if (kept) {
                heap_mid_cached(heap);
                return;
            }
        }
    }
    front_overflow(p, op);
}

/* p, inside a page arena, goes to the calling thread's front if it starts
 * a block handed out (not in a front, not a sample) of a front's size and
 * its bin has room, or else arena_free takes it or says what is wrong
 * with it. A block's head entry changes only when the block does (handed
 * out, sampled, freed, resized, in a class's bin), so the thread freeing
 * it reads it without the lane lock. */
void arena_front_free(void *p, const char *op)
{
    if ((uintptr_t)p & (ARENA_PAGE - 1)) {
        arena_free(p, op);
        return;
    }
    _Atomic uint64_t *entry = arena_head_entry(p);
    uint64_t e = atomic_load_explicit(entry, memory_order_relaxed);
    if (HAK_SECURE && (e & E_FRONT_TEST) == E_USED_HEAD && !arena_block_intact(p)) {
        arena_free(p, op); /* which reports it */
        return;
    }
    unsigned bin = e_pages(e) - ARENA_FRONT_MIN_PAGES; /* a bin per page count up to 64 KiB (fewer wrap around) */
    if ((e & E_FRONT_TEST) == E_USED_HEAD && bin >= ARENA_FRONT_EXACT_BINS) {
        class_free(p, op, entry, e);
        return;
    }
    heap_t *heap = heap_get(); /* hak_empty_heap: no limit above 0 */
    bool kept = false;
    if ((e & E_FRONT_TEST) == E_USED_HEAD && heap_mid_enter(heap)) {
        uintptr_t *list = heap_arena_bin(heap, bin), head = *list;
        kept = front_count(head) < heap->arena_front_limit[bin];
        if (kept) {
            /* The mark first (a fork before the head is stored loses the block in
             * the child, never leaves an unmarked one in a bin). */
            atomic_store_explicit(entry, e | E_IN_FRONT, memory_order_relaxed);
            atomic_signal_fence(memory_order_seq_cst);
            if (HAK_SECURE)
                arena_freed_mark(p);
            ((uintptr_t *)p)[ARENA_FRONT_LINK] = head;
            *list = (uintptr_t)p | (front_count(head) + 1);
        }
        heap_mid_leave(heap);
    }
    if (kept)
        heap_mid_cached(heap);
    else
        front_overflow(p, op);
}
