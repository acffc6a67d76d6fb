/* hakmem internal definitions: layout constants, data structures and the
 * small inline helpers shared by the tiers. Nothing here is exported. */
#ifndef HAKMEM_INTERNAL_H
#define HAKMEM_INTERNAL_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define likely(x) __builtin_expect(!!(x), 1)
#define unlikely(x) __builtin_expect(!!(x), 0)
#define HAK_EXPORT __attribute__((visibility("default")))
#define HAK_NOINLINE __attribute__((noinline))
/* The statistics read other threads' slab fields without those threads'
 * order (figures a moment old, as hak_stats_get says): ThreadSanitizer is
 * told, since the purger now changes slabs (of exited threads' heaps)
 * while a program reads its statistics. */
#define HAK_RACY_READS __attribute__((no_sanitize("thread")))
/* The entry points of the fast paths start a cache line: placed wherever
 * the code before them ended, malloc+free ran 8% slower or faster (tiny
 * lifo 290 or 315 Mops/s, the same instructions) as unrelated functions
 * grew. */
#define HAK_HOT __attribute__((aligned(64)))
#define HAK_TLS __attribute__((tls_model("initial-exec"))) __thread

void hak_assert_fail(const char *cond, const char *file, int line) __attribute__((noreturn));
#ifdef HAKMEM_DEBUG
#define hak_assert(c) ((c) ? (void)0 : hak_assert_fail(#c, __FILE__, __LINE__))
#else
#define hak_assert(c) ((void)0)
#endif

/* ---- Layout ------------------------------------------------------------ */

/* A SuperSlab is a 2 MiB-aligned region: the owner of any pointer is found
 * by masking. Page 0 holds the header and the slab descriptors; pages 1..31
 * are carved into slabs of one or more 64 KiB pages. */
#define SS_SHIFT 21
#define SS_SIZE ((size_t)1 << SS_SHIFT)
#define SS_MASK (SS_SIZE - 1)
#define SLAB_PAGE_SHIFT 16
#define SLAB_PAGE_SIZE ((size_t)1 << SLAB_PAGE_SHIFT)
#define SS_PAGES (SS_SIZE / SLAB_PAGE_SIZE) /* 32 */
#define SS_FIRST_DATA_PAGE 1
#define SS_MAX_SPAN (SS_PAGES - SS_FIRST_DATA_PAGE) /* 31 pages */
#define SS_MAGIC 0x48414b53u                        /* "HAKS" */

/* The address space hakmem can map: x86-64's user space has 47 bits (the
 * kernel maps above only where a program asks, even with 5-level tables),
 * aarch64's 48 with 4-level tables. The segment map has one byte per
 * 2 MiB chunk of it: 64 MiB of address space on x86-64. */
#ifdef __x86_64__
#define ADDRESS_BITS 47
#else
#define ADDRESS_BITS 48
#endif
#define SEGMAP_ENTRIES ((size_t)1 << (ADDRESS_BITS - SS_SHIFT))

enum seg_kind {
    SEG_NONE = 0,           /* not hakmem's */
    SEG_SUPERSLAB = 1,      /* a SuperSlab header is at the chunk start */
    SEG_LARGE_HEAD = 2,     /* a large block starts the chunk; its header is in the page before */
    SEG_LARGE_INTERIOR = 3, /* inside a large mapping; header in an earlier chunk */
    SEG_SAMPLED = 4,        /* a chunk of the sample arena (sample.c) */
    SEG_ARENA = 5,          /* a chunk of a page arena (arena.c): the header is at the arena's start */
};

/* ---- Size classes ------------------------------------------------------ */

/* Tiny: 16 B steps to 1 KiB (64 classes; 16 B granularity keeps rounding
 * waste near glibc's, and 16 B blocks leave room for the free mark). Mid:
 * 8 classes per doubling above 1 KiB (at most 12.5% rounding waste) up to
 * 16 KiB. Larger blocks up to the large threshold are runs of 4 KiB pages
 * in the page arenas (arena.c): less than a page of slack, which is
 * jemalloc's 4 classes per doubling from 16 KiB and 8 from 32 KiB; a
 * class of its own per size left about 3 free blocks per class in slabs
 * on bench rss-time (measured at f3e89a1). */
#define TINY_MAX 1024
#define TINY_CLASSES 64
#define MID_CLASSES_PER_DOUBLING 8
#define MID_MIN_SHIFT 10 /* 1 KiB */
#define MID_MAX_SHIFT 14 /* 16 KiB */
#define SLAB_CLASS_MAX ((size_t)1 << MID_MAX_SHIFT)
#define CLASS_COUNT (TINY_CLASSES + (MID_MAX_SHIFT - MID_MIN_SHIFT) * MID_CLASSES_PER_DOUBLING)

#define MID_CLASSES (CLASS_COUNT - TINY_CLASSES)

/* HAKMEM_LARGE_THRESHOLD's least value: sizes up to it are never large. */
#define LARGE_THRESHOLD_MIN ((size_t)64 << 10)
_Static_assert(SLAB_CLASS_MAX < LARGE_THRESHOLD_MIN, "the slab classes are below any threshold");

/* Each thread's mid fronts (heap_t's front): the blocks above TINY_MAX and
 * up to LARGE_THRESHOLD_MIN it freed, for its next mallocs of their size,
 * a list per mid class (the class's stash) and then one per page count of
 * the page arenas' blocks (the front to the arenas). hak_front_of[(size -
 * 1) / FRONT_GRANULE] names a size's list: every mid class and every page
 * count ends on a multiple of 128 B. */
#define FRONT_GRANULE_SHIFT 7
#define FRONT_GRANULE ((size_t)1 << FRONT_GRANULE_SHIFT)
extern const uint8_t hak_front_of[LARGE_THRESHOLD_MIN / FRONT_GRANULE];
extern const uint8_t hak_tiny_class_of[TINY_MAX / 16 + 1];
extern uint32_t hak_class_size[CLASS_COUNT];
extern uint8_t hak_class_span[CLASS_COUNT];
void sizeclass_init(void);

/* TINY_MAX < size <= LARGE_THRESHOLD_MIN. */
static inline unsigned front_of(size_t size) { return hak_front_of[(size - 1) >> FRONT_GRANULE_SHIFT]; }

/* TINY_MAX < size <= SLAB_CLASS_MAX: a mid class's list is its stash. */
static inline unsigned mid_class_of(size_t size) { return TINY_CLASSES + front_of(size); }

/* Valid for 0 <= size <= SLAB_CLASS_MAX. */
static inline unsigned class_of(size_t size)
{
    if (likely(size <= TINY_MAX))
        return hak_tiny_class_of[(size + 15) >> 4];
    return mid_class_of(size);
}

static inline bool class_is_tiny(unsigned c) { return c < TINY_CLASSES; }

/* The mid classes: the owner's frees go to the class's stash
 * (hak_free_irregular), and their mallocs mark the heap against the
 * purger's claim (heap_mid_enter). Not the tiny classes: every class
 * through the stash made a pair of a tiny and a mid block 14.2 -> 7.7 ns
 * but bench_tiny lifo 16 B 294 -> 218 M ops/s and interleaved 457 -> 396
 * (75 -> 106 instructions a pair), a third of it the claim's stores
 * (measured at 4290b54). */
static inline bool class_stashes_frees(unsigned c) { return !class_is_tiny(c); }

/* Fetch p's cache line for writing. A free reads the block's mark and
 * then writes its link: a line another core wrote (a block freed by
 * another thread than its allocator's) would come over shared for the
 * read, then need a second transfer to be written. PREFETCHW, which
 * x86-64's baseline does not name (GCC emits it only with -mprfchw); CPUs
 * without it take the encoding as a NOP. */
static inline void prefetch_for_write(const void *p)
{
#if defined(__x86_64__)
    __asm__ volatile("prefetchw %0" : : "m"(*(const char *)p));
#else
    __builtin_prefetch(p, 1);
#endif
}

/* xorshift64: the sampler's intervals and the tuner's tie breaks. */
static inline uint64_t xorshift64(uint64_t *state)
{
    uint64_t x = *state;
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    return *state = x;
}

/* The earlier of two due times, 0 meaning none (the purge passes). */
static inline uint64_t due_earlier(uint64_t a, uint64_t b) { return !a ? b : !b ? a : a < b ? a : b; }

/* Whether a block of this size comes from a slab, or from a page arena
 * (else its own mapping). */
#define size_in_slabs(size) ((size) <= SLAB_CLASS_MAX)
#define size_in_arenas(size) ((size) > SLAB_CLASS_MAX && (size) <= hak_large_threshold())

/* ---- Slabs and SuperSlabs ---------------------------------------------- */

struct heap;

/* Flags live in the low bits of a slab's owner word, so that the free fast
 * path tests "owned by the caller and nothing special" with one compare. */
enum slab_flag {
    SLAB_ALIGNED = 1, /* holds over-allocated aligned blocks: interior frees allowed */
    SLAB_STASHES_FREES = 2, /* its owner's slab of a mid class: frees go to the class's stash */
    SLAB_FLAGS = 3,
};

/* One slab: a run of 64 KiB pages holding blocks of one size class. Local
 * frees push onto `free` without atomics; other threads push onto
 * `remote` with one CAS. The owner allocates from its heap's cache, which
 * takes the current slab's lists whole when it runs dry.
 * `used` counts the blocks not on `free`: handed out, in the owner's cache
 * or on `remote`. It reaches 0 exactly when a local free empties the slab. */
typedef struct slab {
    void *free;                /* owner-local free list, linked through the blocks */
    uint32_t used;
    uint32_t block_size;
    _Atomic uintptr_t owner;   /* owning heap | enum slab_flag; 0 when free */
    char *start;               /* first block (page aligned) */
    char *carved_end;          /* blocks below were threaded at least once */
    uint64_t recip;            /* ceil(2^43 / block_size): exact division for offsets < 2 MiB */
    uint32_t capacity;         /* blocks that fit in the slab */
    uint32_t carved;           /* blocks carved so far; the rest were never touched (slab_carved) */
    uint8_t class_idx;
    uint8_t span;              /* pages */
    uint8_t in_use;            /* owned by a heap (else the pages are free) */
    uint8_t parked;            /* current slab whose one used block waits in the cache (heap_free_last_block) */
    struct slab *next, *prev;  /* the owner heap's list for this class */
    _Atomic(void *) remote;    /* MPSC list of blocks freed by other threads */
} slab_t;

/* Other threads check a pointer they free against `carved` while the owner
 * carves: an atomic read (a plain load on x86-64 and aarch64) keeps the
 * race defined. The blocks they free were carved before they got them. */
static inline uint32_t slab_carved(const slab_t *s) { return __atomic_load_n(&s->carved, __ATOMIC_RELAXED); }

#define RECIP_SHIFT 43
/* off * recip has zero bits RECIP_SHIFT-1..SS_SHIFT exactly when off (below
 * 2 MiB) is a multiple of a block size below 2 MiB: with recip =
 * (2^43 + e) / bs, e < bs, and off = k bs + r, the low 43 bits hold
 * k e + r recip, which is below off < 2^21 when r = 0 and at least
 * recip > 2^22 (yet below 2^43) when it is not. */
#define RECIP_REMAINDER_BITS ((((uint64_t)1 << RECIP_SHIFT) - 1) & ~(((uint64_t)1 << SS_SHIFT) - 1))

static inline struct heap *slab_owner_heap(uintptr_t owner)
{
    return (struct heap *)(owner & ~(uintptr_t)SLAB_FLAGS);
}

/* The header page: descriptors for the 31 data pages of a SuperSlab
 * (indexed by head page - 1) and, per page, the slab that covers it. A
 * page outside any slab maps to hak_no_slab, whose owner matches no heap.
 * The owning heap alone changes free_pages and the slabs; the purger only
 * purges dirty pages; the page lock orders the two. */
typedef struct superslab {
    /* The first line of a page is where a program's page-strided writes
     * land (one byte per page of a page-aligned buffer: all in one L1
     * set, which they flush): only fields the fast paths never read live
     * in it. Reading mark_secret from it cost battle json an L1 miss per
     * free. */
    uint32_t magic;
    uint8_t bin;              /* the owner's bin it is in: its longest run of free pages */
    uint64_t dirty_since_ms;  /* when the oldest unpurged page was freed (page lock) */
    uint64_t empty_since_ms;  /* when it went to the pool */
    struct superslab *next, *prev;   /* registry of every SuperSlab, under ss_lock */
    struct superslab *hnext, *hprev; /* the owner's bin of SuperSlabs, or the pool */
    _Alignas(64) uint64_t mark_secret; /* random: keys the free mark of its blocks */
    uint64_t link_secret;     /* random: keys the block links of HAKMEM_SECURE */
    uint32_t free_pages;      /* bit i: data page i belongs to no slab (owner writes) */
    uint32_t dirty_pages;     /* free pages touched since they were last purged (page lock) */
    _Atomic int pages_lock;
    struct heap *heap;        /* owner, or NULL in the pool */
    slab_t *page_slab[SS_PAGES];     /* the slab covering page i */
    slab_t slabs[SS_MAX_SPAN];       /* slabs[i - 1]: the slab whose head is page i */
} superslab_t;

_Static_assert(sizeof(superslab_t) <= SLAB_PAGE_SIZE / 2, "the header page holds the descriptors (and a guard page)");

extern slab_t hak_no_slab;

static inline superslab_t *superslab_of(const void *p)
{
    return (superslab_t *)((uintptr_t)p & ~(uintptr_t)SS_MASK);
}

/* The slab descriptor covering p: hak_no_slab when p lies in the header
 * page or in free pages. */
static inline slab_t *slab_of(superslab_t *ss, const void *p)
{
    return ss->page_slab[((uintptr_t)p & SS_MASK) >> SLAB_PAGE_SHIFT];
}

static inline unsigned slab_head_page(const slab_t *s)
{
    return (unsigned)(s - superslab_of(s)->slabs) + SS_FIRST_DATA_PAGE;
}

/* Index of the block that contains p (p inside the slab). */
static inline uint32_t slab_block_index(const slab_t *s, const void *p)
{
    uint64_t off = (uint64_t)((const char *)p - s->start);
    return (uint32_t)((off * s->recip) >> RECIP_SHIFT);
}

/* ---- Block links and the free mark ------------------------------------ */

/* A block not handed out holds the link to the next one in its first word
 * and a mark in its second (blocks are 16 B at least): its SuperSlab's
 * random mark secret xor its own address. Handing a block out clears the
 * mark, so that every free tells a free block from a live one: a double
 * free is caught however late it comes and from whichever thread (a live
 * block holds its mark by chance once in 2^64, and a copy of a freed
 * block's bytes elsewhere is not a mark there). The hardened build
 * (HAKMEM_SECURE) also stores the link xor a second secret and the
 * address, so that a write after free cannot plant a pointer the allocator
 * would follow (and reading a mark tells nothing of that key). */
#ifdef HAKMEM_SECURE
#define HAK_SECURE 1
#else
#define HAK_SECURE 0
#endif

void hak_free_list_corrupt(const void *b) __attribute__((noreturn, cold));

/* The secrets of a SuperSlab, read once for a run of links into it. */
typedef struct block_keys {
    uintptr_t link, mark;
} block_keys_t;

static inline block_keys_t block_keys(const void *b)
{
    const superslab_t *ss = superslab_of(b);
    return (block_keys_t){HAK_SECURE ? ss->link_secret : 0, ss->mark_secret};
}

/* Hardened: the stored link of b xor its SuperSlab's secret, which is the
 * next block's address xor b's. Its bits above the SuperSlab's are zero
 * for every link: a list never leaves its slab, let alone its SuperSlab;
 * only the NULL that ends a list (giving b itself) and corruption are
 * above. Checked before b is mixed back in: two instructions fewer than
 * decoding first. */
static inline uintptr_t block_next_xor_b(const void *b) { return *(const uintptr_t *)b ^ block_keys(b).link; }

static inline void *block_next(const void *b)
{
    if (!HAK_SECURE)
        return *(void *const *)b;
    uintptr_t next_xor_b = block_next_xor_b(b);
    if (unlikely(next_xor_b >= SS_SIZE) && next_xor_b != (uintptr_t)b)
        hak_free_list_corrupt(b);
    return (void *)(next_xor_b ^ (uintptr_t)b);
}

/* b joins a list, in front of next. */
static inline void block_link_with(void *b, void *next, block_keys_t keys)
{
    ((uintptr_t *)b)[0] = (uintptr_t)next ^ (HAK_SECURE ? keys.link ^ (uintptr_t)b : 0);
    ((uintptr_t *)b)[1] = keys.mark ^ (uintptr_t)b;
}

static inline void block_link(void *b, void *next) { block_link_with(b, next, block_keys(b)); }

/* b is on a list or in a cache. */
static inline bool block_is_free(const void *b)
{
    return ((const uintptr_t *)b)[1] == (block_keys(b).mark ^ (uintptr_t)b);
}

static inline void block_handed_out(void *b) { ((uintptr_t *)b)[1] = 0; }

/* ---- Segment map ------------------------------------------------------- */

/* In .bss (segmap.c): its pages cost nothing until a SuperSlab or large
 * mapping in their 8 GiB of address space is marked, and the fast path
 * indexes it without loading a base pointer, before init as after. */
extern _Atomic(uint8_t) hak_segmap[SEGMAP_ENTRIES];

static inline unsigned segmap_kind(const void *p)
{
    uintptr_t chunk = (uintptr_t)p >> SS_SHIFT;
    if (unlikely(chunk >= SEGMAP_ENTRIES))
        return SEG_NONE;
    return atomic_load_explicit(&hak_segmap[chunk], memory_order_relaxed);
}

void segmap_init(void);
void segmap_set(void *chunk, size_t size, unsigned head_kind);
void segmap_set_all(void *chunk, size_t size, unsigned kind);
void segmap_clear(void *chunk, size_t size);

/* ---- Thread heaps ------------------------------------------------------ */

enum heap_state { HEAP_LIVE, HEAP_ORPHAN, HEAP_FREE, HEAP_DEAD };

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

/* The page arenas (arena.c): 64 MiB arenas, aligned to their size, of
 * 4 KiB pages (whatever the system's page size, which must divide it). */
#define ARENA_SHIFT 26
#define ARENA_SIZE ((size_t)1 << ARENA_SHIFT)
#define ARENA_MASK (ARENA_SIZE - 1)
#define ARENA_PAGE_SHIFT 12
#define ARENA_PAGE ((size_t)1 << ARENA_PAGE_SHIFT)
#define ARENA_PAGES ((uint32_t)(ARENA_SIZE >> ARENA_PAGE_SHIFT))

/* A heap's front to the page arenas (arena.c, "the threads' fronts"): the
 * arena blocks of up to 256 KiB its thread freed, for its next mallocs of
 * their size; the owner's under its mid mark (heap_mid_enter). Up to 64
 * KiB a bin holds blocks of one page count, a list linked through them,
 * and its bins are the mid fronts after the stashes (front_of). Above,
 * blocks are size classes, eight per doubling as the mid classes (at most
 * 12.5% more than asked): with a bin per page count, a thread taking
 * blocks of random sizes between 64 and 256 KiB found its bin empty
 * nearly always (48 of them) and ran 1.5 to 3.4 times slower
 * (measured at 7f1a757). A class's bin is a stack of pointers
 * in the heap, which touches no line of its blocks: a list's link and
 * mark, written into a 256 KiB block at its free and read at its malloc,
 * missed the cache there, most of a touch loop later (battle mixed 876.9
 * ns through the lane, 889.4 with lists, 878.2 with stacks; mir 379.9,
 * 381.2, 366.8; measured at 9ce3d4d). A bin holds up to
 * ARENA_FRONT_BIN_BYTES, a heap's bins together ARENA_FRONT_BYTES; past
 * them a freed block goes to its lane's pool of its bin (arena.c). */
#define ARENA_FRONT_MIN_PAGES ((uint32_t)(SLAB_CLASS_MAX >> ARENA_PAGE_SHIFT) + 1)
#define ARENA_EXACT_MAX_PAGES ((uint32_t)(LARGE_THRESHOLD_MIN >> ARENA_PAGE_SHIFT)) /* never large */
#define ARENA_FRONT_MAX_PAGES ((uint32_t)((256u << 10) >> ARENA_PAGE_SHIFT))
#define ARENA_CLASSES_PER_DOUBLING 8u
#define ARENA_FRONT_EXACT_BINS (ARENA_EXACT_MAX_PAGES - ARENA_FRONT_MIN_PAGES + 1)
#define ARENA_FRONT_CLASS_BINS (2 * ARENA_CLASSES_PER_DOUBLING)
#define ARENA_FRONT_BINS (ARENA_FRONT_EXACT_BINS + ARENA_FRONT_CLASS_BINS)
#define ARENA_FRONT_BIN_BYTES ((size_t)512 << 10)
#define ARENA_FRONT_BYTES ((size_t)8 << 20)
#define ARENA_CLASS_STACK 8 /* blocks a class's bin holds at most: 7 of the least class, 72 KiB */
_Static_assert(ARENA_EXACT_MAX_PAGES == 2 * ARENA_CLASSES_PER_DOUBLING &&
                   ARENA_FRONT_MAX_PAGES == 4 * ARENA_EXACT_MAX_PAGES,
               "two doublings of classes above the exact page counts");
_Static_assert(ARENA_FRONT_BIN_BYTES / ((ARENA_EXACT_MAX_PAGES + 2) * ARENA_PAGE) <= ARENA_CLASS_STACK,
               "a class's stack holds its bin's bytes");

/* hak_arena_bin_of[pages] for ARENA_FRONT_MIN_PAGES <= pages <=
 * ARENA_FRONT_MAX_PAGES: the front's bin of the smallest class that holds
 * that many pages; hak_arena_bin_pages[bin]: its class's pages. Tables, as
 * the others: computed, the classes took a pair of big (random sizes of
 * 64-256 KiB) 46 instructions of 290. */
extern const uint8_t hak_arena_bin_of[ARENA_FRONT_MAX_PAGES + 1];
extern const uint8_t hak_arena_bin_pages[ARENA_FRONT_BINS];

/* The pages an arena block of `pages` pages asked for takes: up to 64 KiB
 * as many, then up to 256 KiB its class's (the next multiple of 2 pages
 * below 128 KiB, of 4 below 256), above that as many again. */
static inline uint32_t arena_class_pages(uint32_t pages)
{
    if (pages <= ARENA_EXACT_MAX_PAGES || pages > ARENA_FRONT_MAX_PAGES)
        return pages;
    return hak_arena_bin_pages[hak_arena_bin_of[pages]];
}

#define FRONT_LISTS (MID_CLASSES + ARENA_FRONT_EXACT_BINS)

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

/* *counter += n with a relaxed load and store, no locked instruction: on
 * x86 each of those waits for the stores before it to drain. Exact where
 * one thread writes the counter (a heap's own counts); where several may
 * (histogram buckets), two at the same instant may lose one count, which
 * no percentile notices. */
#define ADD_UNLOCKED(counter, n)                                                                              \
    atomic_store_explicit((counter), atomic_load_explicit((counter), memory_order_relaxed) + (n),             \
                          memory_order_relaxed)

/* The counts of a site table entry (site.c); live bytes are signed, in
 * two's complement. */
enum site_count {
    SITE_ALLOCS, SITE_BYTES, SITE_SAMPLES, SITE_FREES, SITE_LARGE_ALLOCS, SITE_BIGCACHE_HITS, SITE_LIVE_BYTES,
    SITE_COUNTS
};

/* The KPI totals (kpi.c). */
enum kpi_total { KPI_LATENCY_SAMPLES, KPI_LATENCY_TICKS, KPI_LARGE_CALLS, KPI_TOTALS };

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
 * blocks of cur[c], the slab it is filled from. Heaps are never unmapped
 * (a remote free may still read one).
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
    void *cache[CLASS_COUNT];   /* free blocks of cur[c], ready to hand out */
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
    _Alignas(64) long sample_left; /* allocations until the next sample (sample.c) */
    long sample_interval;      /* the interval sample_left counts down from */
    uint64_t sampled_allocs;   /* allocations of the intervals completed */
    uint64_t sample_rng;       /* xorshift state drawing the sampling intervals */
    unsigned arena_lane;       /* the page arenas' lane its thread allocates from (arena.c) */
    _Atomic int in_slow;       /* inside a list update (fork safety; the purger's mid claim keeps off) */
    /* The mid classes' frees to the stash, which the purger claims and
     * flushes a purge delay after the first (heap_mid_enter, heaps_flush_mid). */
    _Atomic bool mid_busy;     /* the owner is in a mid malloc or a free to the stash */
    _Atomic bool mid_claimed;  /* the purger flushes the mid caches: the owner keeps off */
    _Atomic bool mid_cached;   /* a free went to a mid cache since the purger last flushed them */
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

/* os.c: os_membarrier works: caches of other threads can be claimed */
extern bool hak_claims_on;

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
void heap_slab_mark_aligned(slab_t *s);
void heap_collect(heap_t *heap, bool unmap_now);
void heap_flush_class(heap_t *heap, unsigned c);
void heaps_collect_orphans(void);
uint64_t heaps_drain_orphans(void);
uint64_t heaps_flush_mid(bool all);
uint64_t heaps_purge(bool force);
bool heap_caller_busy(void);
void heaps_notice_orphan_frees(void);
void heaps_fork_prepare(void);
void heaps_fork_parent(void);
void heaps_fork_child(void);
void heaps_process_init(void);
void heaps_totals(size_t *live, size_t *orphaned, uint64_t *slab_refills, uint64_t *counters);
heap_t *heaps_all(void);
uint64_t heaps_allocations(void);

/* ---- SuperSlab pool ---------------------------------------------------- */

slab_t *superslab_slab_acquire(heap_t *heap, unsigned c);
void superslab_slab_release(heap_t *heap, slab_t *s);
void slab_format(slab_t *s, heap_t *heap, unsigned c);
void superslab_adopt_all(heap_t *heap, heap_t *from);
void superslab_give_back_empty(heap_t *heap, bool unmap_now);
uint64_t superslab_purge(bool force);
void superslab_fork_prepare(void);
void superslab_fork_parent(void);
void superslab_fork_child(void);
void superslab_unmap_pool(void);
void superslab_stats(size_t *superslabs, size_t *empty, size_t slabs[2], size_t bytes[2]);
size_t superslab_class_bytes(unsigned c);

/* ---- Purger thread (purger.c) ------------------------------------------ */

/* A tier the purger serves, as init.c hands them to it: purge gives back
 * what has waited a purge delay (everything with force) and says when its
 * next purge falls due (0: nothing waits); release, where not NULL, gives
 * back what it holds unused when a mapping fails. */
typedef struct purge_client {
    uint64_t (*purge)(bool force);
    void (*release)(void);
} purge_client_t;

extern _Atomic bool hak_purger_start_wanted;
/* clients: the tiers in the order of a pass; busy: whether the calling
 * thread is inside a list update or a mid section of its heap, where
 * starting a thread (which allocates) must wait. */
void purger_init(const purge_client_t *clients, unsigned count, bool (*busy)(void));
bool purger_release_caches(void);
void purger_notify(void);
bool purger_young_untold(size_t bytes, uint64_t now_ms);
bool purger_young_untold_again(uint64_t now_ms);
void purger_young_retaken(size_t bytes);
void purger_notify_freed(size_t bytes);
void purger_notify_cached(void);
void purger_poll(void);
/* The calling thread collects (hak_collect) from now on, or no longer:
 * its frees meanwhile start no inline purge pass (purge_inline). */
void purger_collecting(bool on);
void purger_heap_settled(void);

/* The calling thread has left a list update or a mid section, inside
 * which a start of the purger thread waits (purger_notify): start it now
 * if one waits. */
static inline void purger_start_if_wanted(void)
{
    if (unlikely(atomic_load_explicit(&hak_purger_start_wanted, memory_order_relaxed)))
        purger_heap_settled();
}

void purger_fork_child(void);

/* ---- Page arenas (arena.c) ---------------------------------------------- */

/* The arenas' geometry is with the heap's front to them (above). */

void arena_init(void);
unsigned arena_lane_next(void);
void *arena_alloc(size_t size, size_t align, unsigned lane, bool zero);
void arena_free(void *p, const char *op);
size_t arena_usable_size(const void *p, const char *op);
size_t arena_realloc_in_place(void *p, size_t size, bool resize, bool *resized, const char *op);
bool arena_owns(const void *p);
void arena_mark_sampled(void *p, uint32_t record);
uint64_t arena_purge(bool force);
void arena_purge_lane(unsigned lane);
void arena_stats(size_t *arenas, size_t *used_bytes, size_t *free_bytes, size_t *dirty_bytes, size_t *pooled_bytes);
void arena_fork_prepare(void);
void arena_fork_parent(void);
void arena_fork_child(void);

void arena_front_free(void *p, const char *op);
void arena_front_flush(heap_t *heap);
void arena_front_check(const uintptr_t *b, uint32_t pages, unsigned count);
void *arena_pool_take(unsigned lane, uint32_t pages);
void arena_pools_flush(unsigned lane);

/* A block waiting in a thread's front is marked in its head entry in its
 * arena's map (arena.c keeps the map ARENA_MAP_OFFSET bytes into the
 * arena, an entry a page), which only the thread holding the block
 * writes: neither the free nor the malloc reads a line of the block for
 * it. Its second word, as the mark of a free slab block, was read by the
 * free after the program's page-strided writes had flushed the block's
 * first line from L1: json 100.8 ns against 64.5 without that read on the
 * AMD host of f467080. */
#define ARENA_MAP_OFFSET ((size_t)0x500)
#define E_IN_FRONT ((uint64_t)1 << 21)

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
    uint32_t pages = (uint32_t)((size + ARENA_PAGE - 1) >> ARENA_PAGE_SHIFT);
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
void *large_realloc(void *p, size_t size);
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

/* ---- Allocation entry points (alloc.c) --------------------------------- */

void *hak_alloc_slow_size(size_t size, uintptr_t site);
void *hak_calloc_slow(size_t size, uintptr_t site);
void hak_free_slow(void *p, const char *op);
void *hak_alloc_aligned(size_t align, size_t size, uintptr_t site);
size_t hak_usable_size_checked(const void *p, const char *op);
void *hak_realloc_impl(void *p, size_t size, uintptr_t site);
void hak_remote_free(slab_t *s, void *p);
void hak_free_irregular(slab_t *s, void *p, const char *op);

/* ---- Options (options.c) ----------------------------------------------- */

enum on_error { ON_ERROR_ABORT, ON_ERROR_WARN };
enum purge_advice { PURGE_DONTNEED, PURGE_FREE };
enum hugepages { HUGEPAGES_NEVER, HUGEPAGES_PREWARMED, HUGEPAGES_ALWAYS };
enum stats_format { STATS_OFF, STATS_TEXT, STATS_JSON };
enum tune_mode { MODE_BASELINE, MODE_EVOLVING };

/* The options read at setup and exit only come first, so that the ones
 * the allocation paths read start the second line: with the struct
 * 128-aligned, never the first line of a page (see superslab_t; in the
 * first line, the threshold read by every mid-size malloc cost battle
 * json an L1 miss per iteration). */
typedef struct hak_config {
    int on_error;             /* enum on_error */
    int stats;                /* enum stats_format */
    long superslab_reserve;
    long tune_window_ms;
    long tune_cooldown_s;
    long tune_seed;           /* 0: seeded from the clock */
    int purge_advice;         /* enum purge_advice */
    int hugepages;            /* enum hugepages: large blocks, read when one is new or purged */
    bool purge_thread;
    bool verbose;
    _Alignas(64) size_t large_threshold;
    int mode;                 /* enum tune_mode */
    bool profile;
    bool site_rules;
    bool prewarm;
    long profile_sample;      /* mean allocations between samples */
    long purge_delay_ms;
    long bigcache_sites;      /* 0: no BigCache */
    long bigcache_slots;
    size_t bigcache_max_block;
    size_t arena_trim;        /* bytes */
    size_t arena_pool;        /* bytes a lane's pool of a front bin holds; 0: no pools */
} hak_config_t;

#define HAK_CONFIG_ALIGN 128
extern _Alignas(HAK_CONFIG_ALIGN) hak_config_t hak_config;
void options_init(void);
size_t option_size_fit(const void *target, size_t value);

/* mallopt may end evolving mode while other threads read it. */
static inline bool hak_evolving(void) { return __atomic_load_n(&hak_config.mode, __ATOMIC_RELAXED) == MODE_EVOLVING; }

/* The tuner moves the threshold while other threads read it. */
static inline size_t hak_large_threshold(void)
{
    return __atomic_load_n(&hak_config.large_threshold, __ATOMIC_RELAXED);
}

/* ---- Clock for sampled timings and lifetimes (kpi.c) ------------------ */

/* A cheap monotonic tick: the TSC on x86-64, the virtual counter on
 * aarch64, nanoseconds elsewhere. kpi.c converts ticks to nanoseconds. */
static inline uint64_t hak_ticks(void)
{
#if defined(__x86_64__)
    uint32_t lo, hi;
    __asm__ volatile("rdtsc" : "=a"(lo), "=d"(hi));
    return ((uint64_t)hi << 32) | lo;
#elif defined(__aarch64__)
    uint64_t v;
    __asm__ volatile("mrs %0, cntvct_el0" : "=r"(v));
    return v;
#else
    uint64_t os_now_ns(void);
    return os_now_ns();
#endif
}

/* ---- Sampling, call sites, KPIs, tuner ----------------------------------- */

/* Per-site decisions (HAKMEM_SITE_RULES), carried by each large block. */
enum site_rule {
    RULE_NO_BIGCACHE = 1, /* freed blocks are unmapped, not cached */
    RULE_PREWARM = 2,     /* new or purged blocks are faulted in at once */
};

/* The profiler's hooks: all that the tiers (heap.c, large.c, arena.c)
 * call of the profiler and the tuner above them (sample.c, site.c,
 * kpi.c, learn.c), as init.c sets them before anything is allocated. The
 * tiers never name those files: a sample, a large call and a tuner tick
 * are rare enough for a call through a pointer. */
typedef struct profile_hooks {
    /* slab allocations (heap.c) */
    void (*heap_init)(heap_t *heap);                /* sample_heap_init */
    uint32_t (*interval_end)(heap_t *heap);         /* sample_interval_end */
    void *(*sample)(heap_t *heap, unsigned c, void *b, size_t size, uintptr_t site, uint32_t weight,
                    uint64_t ticks);                /* sample_take */
    void (*tuner_tick)(void);                       /* learn_tick */
    /* large blocks (large.c): every call is recorded, one in KPI_LARGE_TIMING timed */
    unsigned (*large_alloc)(uintptr_t site, size_t size, bool bigcache_hit, uint32_t *rules);
    void (*large_free)(unsigned index, size_t size, uint32_t weight, uint64_t born);
    void (*large_resize)(unsigned index, size_t old_size, size_t new_size, uint32_t weight);
    bool (*wants_touch)(unsigned index);
    void (*touched)(unsigned index, size_t resident, size_t size);
    bool (*large_call)(void);                       /* kpi_large_call */
    void (*latency)(uint64_t ticks, uint64_t weight);
    /* samples served by the page arenas (arena.c) */
    void (*arena_freed)(uint32_t record);
    void (*arena_resized)(uint32_t record, size_t size);
} profile_hooks_t;

extern profile_hooks_t hak_profile_hooks;

/* sample.c: the sampled allocation path, the sample arena and the records
 * of samples in the page arenas. */
void sample_heap_init(heap_t *heap);
uint32_t sample_interval_end(heap_t *heap);
void *sample_take(heap_t *heap, unsigned c, void *b, size_t size, uintptr_t site, uint32_t weight, uint64_t ticks);
void *sample_fast_hit(heap_t *heap, unsigned c, void *b, size_t size, uintptr_t site);
void *sample_take_arena(heap_t *heap, size_t size, size_t align, uintptr_t site, bool zero);
void sample_free(void *p, const char *op);
void sample_arena_freed(uint32_t record);
void sample_arena_resized(uint32_t record, size_t size);
size_t sample_usable_size(const void *p, const char *op);
bool sample_owns(const void *p);
void sample_collect(void);
void sample_fork_prepare(void);
void sample_fork_parent(void);
void sample_fork_child(void);

/* site.c: the call-site table. Returns the site's index (or the shared
 * overflow bucket's). */
unsigned site_record_alloc(uintptr_t site, size_t size, uint32_t weight, bool tracked);
void site_record_free(unsigned index, size_t size, uint32_t weight, uint64_t born); /* born 0: no lifetime */
void site_record_resize(unsigned index, size_t old_size, size_t new_size, uint32_t weight);
unsigned site_record_large(uintptr_t site, size_t size, bool bigcache_hit, uint32_t *rules);
void site_record_touched(unsigned index, size_t resident, size_t size);
bool site_wants_touch(unsigned index);
unsigned site_index_of(uintptr_t site);
void site_note_outgrew_arena(uintptr_t site, size_t size);
bool site_outgrew_arena(uintptr_t site);

/* kpi.c */
void kpi_init(void);
#define KPI_LARGE_TIMING 8 /* a power of two */
void kpi_record_latency(uint64_t ticks, uint64_t weight);
double kpi_ns_per_tick(bool may_wait); /* may_wait: sleep until 20 ms after init */
void kpi_window_counters(uint64_t *latency_ticks, uint64_t *allocations);
bool kpi_large_call(void); /* counts it; true for the one in KPI_LARGE_TIMING that is timed */
unsigned kpi_bucket_of(uint64_t ticks); /* log-scale histogram bucket: latencies, lifetimes */
double kpi_hist_percentile(const uint64_t *hist, unsigned buckets, double q);

/* learn.c: the UCB1 tuner of the large threshold (HAKMEM_MODE=evolving).
 * The decision rule works on a tuner_t alone, so that a test can feed it
 * rewards and check where it goes. */
#define TUNER_ARMS 6
#define TUNER_WIN_MARGIN 1.08 /* a probed arm must beat the current one by 8% ... */
#define TUNER_WIN_STREAK 3    /* ... in this many windows in a row */
#define TUNER_REST_MAX 64     /* windows a losing probe rests at most, times 1 / its reward's share */

typedef struct tuner {
    int current;              /* the arm in force */
    int probe;                /* the neighbour being tried, or -1 */
    int streak;               /* windows in a row the probe has won */
    uint64_t trials[TUNER_ARMS];
    double reward_sum[TUNER_ARMS];
    uint64_t rest[TUNER_ARMS];       /* windows a losing probe of the arm now waits (doubles each loss) */
    uint64_t rest_until[TUNER_ARMS]; /* the window count before which it is not probed again */
    uint64_t windows, moves;
    uint64_t cooldown_ms, cooldown_until_ms;
    uint64_t rng;
} tuner_t;

extern const size_t tuner_arm_threshold[TUNER_ARMS];
void tuner_start(tuner_t *t, int arm, uint64_t cooldown_ms, uint64_t seed);
double tuner_mean_reward(const tuner_t *t, int arm);
int tuner_decide(tuner_t *t, int arm_ran, double reward, uint64_t now_ms);
void learn_tick(void);
void learn_snapshot(tuner_t *out);
void learn_fork_child(void);
void learn_pin_threshold(size_t threshold);

/* A public struct (hakmem.h) of full_size bytes into a caller's copy of
 * size bytes: the fields both know, and zeros for those only the caller
 * has. The structs only grow at their end (stats.c). */
static inline void hak_copy_sized(void *out, size_t size, const void *full, size_t full_size)
{
    size_t known = size < full_size ? size : full_size;
    __builtin_memcpy(out, full, known);
    __builtin_memset((char *)out + known, 0, size - known);
}
void report_xml(FILE *out); /* malloc_info's document (report.c) */

/* ---- Process init (init.c) --------------------------------------------- */

extern _Atomic int hak_init_state; /* 0 none, 1 running, 2 ready */
void hak_init_slow(void);
void stats_init(void);
static inline void hak_ensure_init(void)
{
    if (unlikely(atomic_load_explicit(&hak_init_state, memory_order_acquire) != 2))
        hak_init_slow();
}

/* ---- OS layer (os.c): the contract with the kernel ----------------------- */

/* Every system call of the library goes through these, but for the
 * report's descriptor (report.c) and libc's locks and clocks. Each call:
 * - is no cancellation point (a pending pthread_cancel never stops a
 *   thread inside hakmem) and leaves errno as it found it, but for
 *   os_unshare and os_setns, the program's own calls, which set it as
 *   the kernel says;
 * - never allocates, so it may run inside malloc, before init and in a
 *   fork child;
 * - reports failure by its result, never by ending the program: the
 *   caller decides (an allocation returns NULL with ENOMEM).
 * Sizes and addresses are multiples of the page size unless said.
 * hak_mapped_bytes counts what os_map* mapped and os_unmap gave back. */

/* Mappings: NULL with errno ENOMEM when the kernel refuses (the one
 * change to errno: the allocation entry points pass it on). os_map_aligned* return an
 * address aligned to align (a power of two, at least a page), offset
 * bytes before an aligned one for _at; os_remap_aligned moves or grows
 * a mapping (mremap), its contents kept. os_reserve_aligned takes
 * address space only (no access, no commit charge); os_commit makes a
 * part of it usable, os_release gives it back. */
void *os_map(size_t size);
void *os_reserve_aligned(size_t size, size_t align);
bool os_commit(void *p, size_t size);
void os_release(void *p, size_t size, size_t committed);
void *os_map_aligned(size_t size, size_t align);
void *os_map_aligned_at(size_t size, size_t align, size_t offset);
void *os_remap_aligned(void *p, size_t old_size, size_t new_size, size_t align, size_t offset);
/* False when the kernel refused (vm.max_map_count): the range is then
 * purged instead, still mapped and counted. */
bool os_unmap(void *p, size_t size);
/* The pages' memory goes back; the range stays mapped and reads as zeros
 * (MADV_DONTNEED) or as zeros or its old contents (HAKMEM_PURGE_ADVICE=
 * free: os_purged_pages_read_zero says which). Locked pages too. */
void os_purge(void *p, size_t size);
bool os_purged_pages_read_zero(void);
void os_prefault(void *p, size_t size);
void os_advise_huge(void *p, size_t size);
void os_advise_small_pages(void *p, size_t size);
bool os_protect(void *p, size_t size, bool accessible);
bool os_thread_filtered(void);
int os_thread_id(void);
bool os_thread_alive(int tid);
int os_unshare(int flags);
int os_setns(int fd, int nstype);
bool os_map_fixed(void *p, size_t size, bool writable);
void os_membarrier_init(void);
bool os_membarrier(void);
uint64_t os_random(void);
size_t os_page_size(void);
uint64_t os_now_ms(void);
uint64_t os_now_ns(void);
size_t os_resident_bytes(const void *p, size_t size);
size_t os_rss_peak_bytes(void);
void os_write_stderr(const char *s, size_t n);
size_t os_rss_bytes(void);
void os_page_faults(uint64_t *minor, uint64_t *major);

/* Bytes mapped by hakmem right now, and its peak (os.c). */
extern _Atomic size_t hak_mapped_bytes;
extern _Atomic size_t hak_mapped_peak;

/* ---- Diagnostics (error.c) --------------------------------------------- */

/* A growing message line without malloc or stdio. */
typedef struct msgbuf {
    char buf[256];
    size_t len;
} msgbuf_t;

void msg_str(msgbuf_t *m, const char *s);
void msg_ptr(msgbuf_t *m, const void *p);
void msg_uint(msgbuf_t *m, uint64_t v);

void hak_report_bad_pointer(const char *op, const void *p, const char *fault);
void hak_warn(const char *what, const char *detail);
void hak_fatal(const char *what) __attribute__((noreturn));

#endif
