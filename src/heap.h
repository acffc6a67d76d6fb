/* Layer 6, the threads' heaps (heap.c): each thread's caches of slab
 * blocks, the mid fronts (the mid classes' stashes and the bins of the
 * front to the page arenas) with their inline pops, the claim that lets
 * the purger empty them, and the heaps' life: thread start and exit,
 * orphans, fork. */
#ifndef HAKMEM_HEAP_H
#define HAKMEM_HEAP_H

#include "block.h"
#include "arena.h"
#include "os.h"

/* ---- Thread heaps ------------------------------------------------------ */

enum heap_state { HEAP_LIVE, HEAP_ORPHAN, HEAP_FREE, HEAP_DEAD };

/* The slabs of other heaps a heap remembers per tiny class, by address,
 * as its thread frees blocks into them (heap_note_freed_into). */
#define FREED_INTO_SLOTS 4

/* Debug counters (build option HAKMEM_COUNTERS): the refill stages and the
 * free pipeline, counted per heap without atomics. Without the option
 * HAK_COUNT compiles to nothing. */
#define HAK_COUNTER_LIST(X)                                                                     \
    X(refill_local, "refill: took the current slab's local free list")                        \
    X(refill_carve, "refill: carved never-used blocks")                                       \
    X(refill_remote, "refill: took the current slab's remote frees")                          \
    X(refill_drain, "refill: drained the remote frees of the class's other slabs")          \
    X(refill_switch, "refill: switched to another owned slab with room")                      \
    X(refill_orphan, "refill: absorbed an exited thread's heap")                              \
    X(refill_new_slab, "refill: took a new slab from the SuperSlab pool")                     \
    X(refill_freed_into, "refill: took another heap's remote frees instead of new blocks")    \
    X(free_local, "free: same thread, fast path")                                             \
    X(free_local_slow, "free: same thread, slow path (last block, aligned blocks)")           \
    X(free_stashed, "free: same thread, mid slab, to the class's stash")                      \
    X(free_remote, "free: another thread's slab, pushed onto its remote list")                \
    X(free_large, "free: large block")
#define HAK_COUNTER_ENUM(name, what) HAK_CNT_##name,
enum { HAK_COUNTER_LIST(HAK_COUNTER_ENUM) HAK_COUNTER_COUNT };
#ifdef HAKMEM_COUNTERS
#define HAK_COUNT(heap, name) ((heap)->counters[HAK_CNT_##name]++)
#else
#define HAK_COUNT(heap, name) ((void)(heap))
#endif

/* Empty slabs a heap keeps, current ones (the next allocation of the
 * class would take a slab again at once) and one-page spares for its next
 * refills, as long as their touched pages add up to no more than this;
 * beyond it an emptied slab goes back to its SuperSlab, where the purger
 * can reach its pages. This bounds what a sleeping thread holds dirty. */
#define HEAP_KEPT_EMPTY_BYTES ((size_t)1 << 20)

/* A mid class's stash holds up to this many bytes of blocks; the owner's
 * further frees go to their slabs' lists, where they
 * can empty a slab for any class to reuse before the purger's flush. A
 * random replacement needs a block or two (the next malloc takes the one
 * just freed); a program that frees thousands at once keeps its slabs'
 * pages reusable by the other classes. */
#define HEAP_STASH_BYTES ((size_t)64 << 10)

/* BigCache's front in a heap (bigcache.c): the large block its thread
 * freed last, which the owner takes and puts with relaxed (plain) accesses
 * only, and which the purger or a collect claims from it. */
typedef struct bigcache_front {
    struct large_hdr *_Atomic block;
    _Atomic uint64_t since_ms; /* when block was freed (its cached_at_ms, readable by the claimer) */
    _Atomic size_t bytes;      /* block's mapping size, 0 without one (bigcache_held) */
    _Atomic uint64_t hits;     /* allocations it served */
    _Atomic bool busy;         /* the owner is inside a take or a put */
    _Atomic bool claimed;      /* a claimer is taking the block: the owner keeps off */
} bigcache_front_t;
/* A mid front's head word is its first block's address (a multiple of
 * 128) with the list's block count in the low bits, and each block's link
 * is the head word it was pushed onto: a pop restores the count with the
 * link, and neither a push nor a pop stores a count. A store less counts:
 * json's pair (malloc of 64 KiB, a store to each page, free) took 40 ns at
 * 12 stores of the allocator's and 35 at 9, the stores behind the touches'
 * cache misses (measured at 6aef694). */
#define FRONT_COUNT_MASK (FRONT_GRANULE - 1)
_Static_assert(ARENA_FRONT_BIN_BYTES / (ARENA_FRONT_MIN_PAGES * ARENA_PAGE) < FRONT_COUNT_MASK &&
                   HEAP_STASH_BYTES / TINY_MAX < FRONT_COUNT_MASK,
               "a list's count fits below its first block's address");

static inline uintptr_t *front_first(uintptr_t head) { return (uintptr_t *)(head & ~FRONT_COUNT_MASK); }
static inline unsigned front_count(uintptr_t head) { return (unsigned)(head & FRONT_COUNT_MASK); }

/* The word of an arena front's block that holds its link: the first of
 * its second line. The first line of a page-aligned block is where a
 * program's page-strided writes land, all in one L1 set, which they
 * flush: the free's store of the link there queued behind those writes'
 * misses, and so did the malloc's clearing of the block's second word
 * (battle json 65.8 ns against tcmalloc's 59.4; 52.6 with the link here
 * and the malloc's fetch of the first line, mid_front_pop;
 * measured at 48044f5). A stash block's link stays in its first
 * word, as on its slab's lists. */
#define ARENA_FRONT_LINK 8

/* The first block of a mid front leaves it, the list moving on to the
 * head word in the block's word `link`; the caller clears the block's
 * mark after (a fork between the two loses the block in the child, never
 * leaves an unmarked one in a list). The link is read plain: the hardened
 * build decodes a stash's (block_next) and checks an arena block first
 * (arena_front_check), since a write after free may have changed the link
 * that led to it. */
static inline uintptr_t *front_unlink(uintptr_t *list, unsigned link)
{
    uintptr_t *b = front_first(*list);
    *list = b[link];
    atomic_signal_fence(memory_order_seq_cst);
    return b;
}
/* The counts of a site table entry (site.c): lifetimes recorded, large
 * allocations, BigCache hits. */
enum site_count { SITE_FREES, SITE_LARGE_ALLOCS, SITE_BIGCACHE_HITS, SITE_COUNTS };

/* The KPI totals (kpi.c). */
enum kpi_total { KPI_LATENCY_SAMPLES, KPI_LATENCY_WEIGHT, KPI_LATENCY_TICKS, KPI_LARGE_CALLS, KPI_TOTALS };

/* A heap's profiling counts, kept by its owner with ADD_UNLOCKED and
 * added to the shared ones by whoever reads them: an allocation and a
 * free of a large block took 13 locked instructions otherwise. The site
 * counts are those of one site table entry at a time, moved into the
 * table when the thread records another; the KPI totals stay. */
typedef struct heap_profile {
    _Atomic uintptr_t site;  /* the call site of entry index, 0 if not known */
    _Atomic unsigned index;  /* the site table entry the counts belong to */
    _Atomic uint64_t site_counts[SITE_COUNTS];
    _Atomic uint64_t kpi_totals[KPI_TOTALS];
} heap_profile_t;

/* Per-thread state. The allocation fast path pops cache[c]: a list of free
 * blocks of cur[c], the slab it is filled from, or of a slab of another
 * heap whose remote list a refill took instead of new blocks (counted as
 * used in their slab all the while). Heaps are never unmapped (a remote
 * free may still read one).
 *
 * The owner's frees of a mid class go to the class's stash (its slabs
 * carry a flag in their owner words), whichever slab they belong to, and
 * its mallocs take from the stash before the cache: returned to their own
 * slabs, a program that keeps a few dozen blocks of 4 KiB and replaces
 * them at random spread its frees over 5 slabs, and three mallocs in four
 * took a slab switch to find one (28 ns a pair, 12 with the stash,
 * tcmalloc 6: measured at 885e37e); with the current slab's
 * frees to the cache and the others' to the stash, which list a free
 * went to and which a malloc found a block in were a coin toss, 0.6
 * mispredicted branches a pair (measured at
 * 5d058bb). Stashed blocks count as used
 * in their slabs until the purger, a collect or the thread's exit hands
 * them back. */
typedef struct heap {
    void *cache[CLASS_COUNT];   /* free blocks ready to hand out: cur[c]'s, or another slab's (heap_take_freed_into) */
    slab_t *cur[CLASS_COUNT];   /* the slab the cache is filled from, or NULL */
    slab_t *owned[CLASS_COUNT]; /* the class's other slabs: a circular list, searched in turn */
    /* The mid fronts (front_of): each mid class's stash, its freed blocks
     * of any of its slabs, up to HEAP_STASH_BYTES; then the front to the
     * page arenas, a bin per page count up to 64 KiB (its class bins
     * follow the limits). */
    uintptr_t front[FRONT_LISTS];
    uint8_t arena_front_limit[ARENA_FRONT_BINS]; /* grows by one each time a malloc finds the bin empty */
    uint32_t arena_front_limits_bytes;           /* the limits' bytes together, up to ARENA_FRONT_BYTES */
    uint8_t arena_class_count[ARENA_FRONT_CLASS_BINS]; /* the front's class bins: stacks of blocks */
    void *arena_class_stack[ARENA_FRONT_CLASS_BINS][ARENA_CLASS_STACK];
    /* The SuperSlabs this heap carves slabs from, binned by their longest
     * run of free pages (bin 31: empty), so that a slab of k pages is
     * placed in the SuperSlab with the shortest run that holds it. */
    struct superslab *ss_bins[SS_PAGES];
    uint32_t ss_bin_mask;       /* bit i: ss_bins[i] is not empty */
    uint32_t superslab_count;   /* in all bins */
    size_t kept_empty_bytes;   /* touched bytes of the empty slabs kept: current ones, spares */
    slab_t *spares;            /* empty one-page slabs, linked through next, ready for any class */
    slab_t *freed_into[TINY_CLASSES][FREED_INTO_SLOTS]; /* slabs of other heaps its thread freed blocks into */
    /* Set by other threads' frees: a cache line of its own (with cold
     * fields), away from the fields every malloc writes (sharing one with
     * sample_left cost larson at 2 threads 35% of its speed). */
    _Alignas(64) _Atomic uint64_t remote_hint[(CLASS_COUNT + 63) / 64]; /* class got a remote free */
    struct heap *next_all;     /* registry of every heap ever made */
    struct heap *next_orphan;
    uint64_t orphaned_ms;      /* when its thread exited (os_now_ms) */
    uint64_t drained_ms;       /* when the purger last drained it as an orphan */
    bool uncollected;          /* orphaned as its thread left it (threads were being recycled) */
    bool draining;             /* an orphan the purger took out of the queue to drain (heaps_lock) */
    _Atomic int state;         /* enum heap_state: changed under heaps_lock, read by remote frees */
    _Alignas(64) long sample_left; /* bytes to allocate before the next sample (sample.c) */
    uint64_t sample_rng;       /* xorshift state drawing the sampling intervals */
    size_t sample_mean;        /* the mean interval in force: HAKMEM_PROFILE_SAMPLE, or more (the budget) */
    uint64_t sample_spent;     /* ticks samples took since the budget's last look */
    uint64_t sample_looked;    /* hak_ticks() then */
    double sample_credit_ns;   /* time samples may take before the mean interval grows */
    uint32_t sample_window;    /* samples since the last look */
    uint32_t tuner_refills;    /* refills, for the tuner's clock (heap_tick_tuner) */
    uint64_t meshed_ms;        /* when its refills last meshed */
    uint8_t mesh_class;        /* the tiny class its refills' next meshing starts at */
    /* Slabs loosened for the purger to mesh (heap_loosen_if_due): */
    uint64_t loosened_ms;      /* when a refill last looked for slabs to loosen */
    _Atomic uint64_t loose_changes; /* the owner loosened slabs or freed into one: counted */
    _Atomic uint64_t loose_changes_meshed; /* the purger's: loose_changes at its last pass */
    uint64_t loose_meshed_ms;     /* when the purger's last pass ended */
    bool loose_unfinished;        /* the purger's last pass ran out of time */
    uint8_t loose_class;          /* the class the purger's next pass starts at */
    unsigned arena_lane;       /* the page arenas' lane its thread allocates from (arena.c) */
    _Atomic int in_slow;       /* inside a list update (fork safety; the purger's claims keep off) */
    /* The mid classes' frees to the stash, which the purger claims and
     * flushes a purge delay after the first (heap_mid_enter, heaps_flush_mid). */
    _Atomic bool mid_busy;     /* the owner is in a mid malloc or a free to the stash */
    _Atomic bool mid_claimed;  /* the purger flushes the mid caches: the owner keeps off */
    _Atomic bool mid_cached;   /* a free went to a mid cache since the purger last flushed them */
    _Atomic bool lists_claimed; /* the purger meshes the loose slabs: the owner's list updates keep off */
    _Atomic uint64_t mid_cached_ms; /* when mid_cached was last set */
    uint64_t slab_refills;     /* read racily by the report */
    bigcache_front_t bigcache_front;
    heap_profile_t profile;
    const void *corrupt_link;  /* hardened: a cached block whose link was corrupt (cache_next) */
#ifdef HAKMEM_COUNTERS
    uint64_t counters[HAK_COUNTER_COUNT];
#endif
} heap_t;

extern heap_t hak_empty_heap;
extern HAK_TLS heap_t *hak_tl_heap;

static inline heap_t *heap_get(void) { return hak_tl_heap; }

/* heap's thread frees a block of s, another heap's slab, onto its remote
 * list: remembered for the refill of its class (heap_take_freed_into). */
static inline void heap_note_freed_into(heap_t *heap, slab_t *s)
{
    unsigned c = s->class_idx;
    if (c < TINY_CLASSES && heap != &hak_empty_heap)
        heap->freed_into[c][((uintptr_t)s / sizeof(slab_t)) % FREED_INTO_SLOTS] = s;
}


/* The owner's side of the mid caches' claim, Dekker-style as BigCache's
 * front: the owner marks itself busy and reads the claim with only a
 * compiler barrier between; the purger sets the claim, runs os_membarrier
 * and reads busy. False: the purger is at the caches, keep off. */
static inline bool heap_mid_enter(heap_t *heap)
{
    atomic_store_explicit(&heap->mid_busy, true, memory_order_relaxed);
    atomic_signal_fence(memory_order_seq_cst);
    if (likely(!atomic_load_explicit(&heap->mid_claimed, memory_order_acquire)))
        return true;
    atomic_store_explicit(&heap->mid_busy, false, memory_order_release);
    return false;
}

static inline void heap_mid_leave(heap_t *heap)
{
    atomic_store_explicit(&heap->mid_busy, false, memory_order_release);
}

_Static_assert(_Alignof(heap_t) > SLAB_FLAGS, "a heap's address leaves the owner word's flag bits clear");

/* Class c's stash (a mid class), and the arenas' front's bin `bin`, one of
 * a page count (below ARENA_FRONT_EXACT_BINS). */
static inline uintptr_t *heap_stash(heap_t *heap, unsigned c) { return &heap->front[c - TINY_CLASSES]; }
static inline uintptr_t *heap_arena_bin(heap_t *heap, unsigned bin) { return &heap->front[MID_CLASSES + bin]; }

/* b, a block of mid class c that its slab counts as used, joins the
 * class's stash (the caller saw to its room). */
static inline void heap_stash_push(heap_t *heap, unsigned c, void *b)
{
    uintptr_t *stash = heap_stash(heap, c), head = *stash;
    block_link(b, (void *)head);
    *stash = (uintptr_t)b | (front_count(head) + 1);
}

void heap_mid_wait(heap_t *heap); /* until the purger's claim is over */
void heap_mid_cached_first(heap_t *heap);

/* A free went to a mid cache (a stash or the arenas' front): the first
 * since the purger last flushed them starts its delay. */
static inline void heap_mid_cached(heap_t *heap)
{
    if (unlikely(!atomic_load_explicit(&heap->mid_cached, memory_order_relaxed)))
        heap_mid_cached_first(heap);
}

void *heap_alloc_slow(heap_t *heap, unsigned c, size_t size, uintptr_t site);
heap_t *heap_thread_init(void);
bool heap_thread_adopt(heap_t *owner);
void heap_free_last_block(slab_t *s, void *block); /* s's owner is the caller */
void heap_free_meshed(slab_t *s, void *block);    /* the same, for a slab with SLAB_MESHED */
void heap_sampled(heap_t *heap);                  /* a malloc of the owner's was sampled */
void heap_loose_changed(heap_t *heap);            /* the owner loosened slabs or freed into one */
void heap_slab_mark_aligned(slab_t *s);
void heap_collect(heap_t *heap, bool unmap_now, uint64_t mesh_deadline_ns);
void heap_flush_class(heap_t *heap, unsigned c);
void heaps_collect_orphans(void);
uint64_t heaps_drain_orphans(void);
uint64_t heaps_flush_mid(bool all);
uint64_t heaps_purge(bool force);
bool heap_caller_busy(void);
void heaps_notice_orphan_frees(void);
void heap_remote_free(slab_t *s, void *p);
void heaps_fork_prepare(void);
void heaps_fork_parent(void);
void heaps_fork_child(void);
void heaps_key_init(void (*before_orphaning)(void));
void heaps_fork_init(void);
void heaps_totals(size_t *live, size_t *orphaned, uint64_t *slab_refills, uint64_t *counters);
heap_t *heaps_all(void);

void arena_front_flush(heap_t *heap); /* every block of the heap's front back to its arena */

/* front.c: the threads' fronts to the page arenas, the free side (the
 * malloc side is inline below: arena_front_take, mid_front_pop). */
void arena_front_free(void *p, const char *op);
void arena_front_check(const uintptr_t *b, uint32_t pages, unsigned count);
/* The first block of an arena front's bin, checked first in the
 * hardened build: the list moves on, then the block's mark in the map
 * goes. */
static inline void *arena_front_pop(heap_t *heap, unsigned bin)
{
    uintptr_t *list = heap_arena_bin(heap, bin);
    if (HAK_SECURE)
        arena_front_check(front_first(*list), hak_arena_bin_pages[bin], front_count(*list));
    void *b = front_unlink(list, ARENA_FRONT_LINK);
    front_unmark(arena_head_entry(b));
    return b;
}

/* The first block of mid front f, a stash (f below MID_CLASSES) or an
 * arena front's bin, with the same instructions for either: a stash's
 * block is linked by its first word and marked by its second, an arena
 * block linked by word ARENA_FRONT_LINK and marked by E_IN_FRONT in its
 * map entry. Where a program mixes the tiers at random, a branch on the
 * tier mispredicts: bench mid (1..64 KiB) ran 17% slower with one, 8.5%
 * with a mask select and 3.9% with a cmov (measured at
 * f467080); one compare and a cmov for each word here.
 *
 * The mark goes by flipping E_IN_FRONT: an arena block's, set while it
 * waits, clears; a stash block's second word then differs from its mark
 * in that bit, and block_is_free compares all 64 (clearing the word
 * whole cost the stash's pop 3 instructions, bench mid4k 2%).
 *
 * The block's first line is fetched for writing: the program writes
 * there next, and the fetch starts while the malloc returns (the link's
 * read from the second line left it to the program's first store, behind
 * the stores before it). Which way of fetching it wins depends on the
 * core: on a 1 MiB-L2 AMD host battle json took 58.3 ns with nothing,
 * 52.6 with a load of the line, 56.4 with a prefetch; on a Zen 3 the
 * load was the slowest (58.9-61.4 against 57.6-60.8 with nothing) and
 * PREFETCHW the fastest (53.3-55.1), 41 rounds twice; on a Xeon the
 * load took 3% off json and added 6% to battle mixed, the others level
 * (measured at 48044f5, 61a7430 and 6cce8c7): a prefetch is never
 * the worst of the ways, and PREFETCHW the best of them on the Zen 3. */
static inline void *mid_front_pop(uintptr_t *list, unsigned f)
{
    uintptr_t *b = front_first(*list), *link = b;
    _Atomic uint64_t *mark = (_Atomic uint64_t *)&b[1];
#if defined(__x86_64__)
    __asm__("cmp %[limit], %[f]\n\t"
            "cmovae %[arena_link], %[link]\n\t"
            "cmovae %[arena_mark], %[mark]"
            : [link] "+r"(link), [mark] "+r"(mark)
            : [arena_link] "r"(&b[ARENA_FRONT_LINK]), [arena_mark] "r"(arena_head_entry(b)), [limit] "i"(MID_CLASSES),
              [f] "r"(f)
            : "cc");
#else
    if (f >= MID_CLASSES)
        link = &b[ARENA_FRONT_LINK], mark = arena_head_entry(b);
#endif
    prefetch_for_write(b);
    *list = *link;
    atomic_signal_fence(memory_order_seq_cst);
    atomic_store_explicit(mark, atomic_load_explicit(mark, memory_order_relaxed) ^ E_IN_FRONT, memory_order_relaxed);
    return b;
}

/* A malloc found heap's front bin empty: the bin's limit grows by one,
 * within ARENA_FRONT_BIN_BYTES and the heap's ARENA_FRONT_BYTES. Without
 * claims (no membarrier) the purger could not empty the front: no limit. */
static inline void arena_front_limit_grow(heap_t *heap, unsigned bin)
{
    uint8_t *limit = &heap->arena_front_limit[bin];
    size_t bytes = (size_t)hak_arena_bin_pages[bin] << ARENA_PAGE_SHIFT;
    if ((*limit + 1) * bytes <= ARENA_FRONT_BIN_BYTES && heap->arena_front_limits_bytes + bytes <= ARENA_FRONT_BYTES &&
        hak_claims_on) {
        ++*limit;
        heap->arena_front_limits_bytes += bytes;
    }
}

/* The block on top of class bin k's stack leaves it (a fork between the
 * two steps loses it in the child). By the owner in its mid mark, or by
 * the purger under its claim. */
static inline void *arena_class_pop(heap_t *heap, unsigned k)
{
    void *b = heap->arena_class_stack[k][--heap->arena_class_count[k]];
    if (HAK_SECURE)
        arena_freed_check(b);
    atomic_signal_fence(memory_order_seq_cst);
    front_unmark(arena_head_entry(b));
    return b;
}

/* arena_front_take of a class's size, above 64 KiB: `pages` pages. */
static inline void *arena_class_take(heap_t *heap, uint32_t pages)
{
    if (!heap_mid_enter(heap))
        return NULL;
    unsigned bin = hak_arena_bin_of[pages], k = bin - ARENA_FRONT_EXACT_BINS;
    void *b = NULL;
    if (likely(heap->arena_class_count[k] != 0))
        b = arena_class_pop(heap, k);
    else
        arena_front_limit_grow(heap, bin);
    heap_mid_leave(heap);
    return b;
}

/* A block of size bytes (above the slab classes) from heap's front, or
 * NULL: not a front's size, the bin is empty (its limit then grows by
 * one), or the purger is at the front. Inline in the arenas' allocation
 * path: a call and the checks of the first, out-of-line version cost a
 * 64 KiB malloc/free pair 70 instructions more than a slab block's. A
 * class's bin, above 64 KiB, too (arena_class_take): its call, out of
 * line, took a pair of bench_threads big (64..256 KiB) 13 instructions
 * more, and battle mir's 12 (measured at 463d85b). */
static inline void *arena_front_take(heap_t *heap, size_t size)
{
    uint32_t pages = arena_pages_for(size);
    hak_assert(pages >= ARENA_FRONT_MIN_PAGES);
    if (pages > ARENA_EXACT_MAX_PAGES)
        return pages <= ARENA_FRONT_MAX_PAGES ? arena_class_take(heap, pages) : NULL;
    if (!heap_mid_enter(heap))
        return NULL;
    unsigned bin = pages - ARENA_FRONT_MIN_PAGES;
    void *b = NULL;
    if (likely(*heap_arena_bin(heap, bin) != 0))
        b = arena_front_pop(heap, bin);
    else
        arena_front_limit_grow(heap, bin);
    heap_mid_leave(heap);
    return b;
}

#endif
