/* Layer 3, the layout of memory: SuperSlabs and their slabs, the size
 * classes (sizeclass.c) and the segment map (segmap.c) that tells the
 * owner of any address. */
#ifndef HAKMEM_LAYOUT_H
#define HAKMEM_LAYOUT_H

#include "config.h"

typedef struct heap heap_t; /* heap.h */

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
 * aarch64's 48 with 4-level tables. The segment map (segmap.c) has one
 * word per 64 KiB of it, in leaves of 512 KiB (4 GiB of address space
 * each) that a table of one word per leaf points to. */
#ifdef __x86_64__
#define ADDRESS_BITS 47
#else
#define ADDRESS_BITS 48
#endif
#define SEGMAP_ENTRY_SHIFT 16 /* a word per slab page */
#define SEGMAP_LEAF_SHIFT 32  /* the address space a leaf covers */
#define SEGMAP_LEAF_ENTRIES ((size_t)1 << (SEGMAP_LEAF_SHIFT - SEGMAP_ENTRY_SHIFT))
#define SEGMAP_LEAVES ((size_t)1 << (ADDRESS_BITS - SEGMAP_LEAF_SHIFT))

/* What the segment map says of a 2 MiB chunk. A SuperSlab's entries are
 * its pages' slab descriptors (slab_of), never SEG_SUPERSLAB itself;
 * every other kind is the entry of each 64 KiB of its chunks. */
enum seg_kind {
    SEG_NONE = 0,           /* not hakmem's */
    SEG_SUPERSLAB = 1,      /* a SuperSlab header is at the chunk start */
    SEG_LARGE_HEAD = 2,     /* a large block starts the chunk; its header is in the page before */
    SEG_LARGE_INTERIOR = 3, /* inside a large mapping; header in an earlier chunk */
    SEG_SAMPLED = 4,        /* a chunk of the sample arena (sample.c) */
    SEG_ARENA = 5,          /* a chunk of a page arena (arena.c): the header is at the arena's start */
    SEG_KIND_MAX = SEG_ARENA,
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
_Static_assert(TINY_MAX == 16 * TINY_CLASSES, "a tiny class every 16 B (hak_alloc)");
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
/* The hardened build ends every slab block with a canary of 8 bytes
 * (block.h) that the program is never given: a request takes the class
 * that holds it and the canary. */
#define BLOCK_CANARY (HAK_SECURE ? 8u : 0u)

/* The hardened build starts a slab's blocks this far into its first page,
 * with a canary just before the first (block.h), where the slab's
 * leftover bytes (its pages less its blocks) leave room: 16 bytes for a
 * tiny class, a front granule (128 B) for a mid one, which keeps a mid
 * block's address clear of the count its front list keeps in the low bits
 * (heap.h, front_count). A class that divides its slab exactly (a power
 * of two) has no room: its first block has no canary before it, where a
 * lead would cost a block of every slab (a 16th of the 4 KiB class's). */
static inline size_t slab_lead(unsigned c, size_t block_size, size_t bytes)
{
    size_t lead = c < TINY_CLASSES ? 16 : FRONT_GRANULE;
    return HAK_SECURE && bytes % block_size >= lead ? lead : 0;
}

/* A slab's first block lies (start & SLAB_LEAD_MASK) bytes, its lead, into
 * its first page. */
#define SLAB_LEAD_MASK ((uintptr_t)SLAB_PAGE_SIZE - 1)

/* The slab class that serves a request of size bytes (size_in_slabs). */
static inline unsigned slab_class_for(size_t size) { return class_of(size + BLOCK_CANARY); }

/* Whether a block of this size comes from a slab, or from a page arena
 * (else its own mapping). */
#define size_in_slabs(size) ((size) <= SLAB_CLASS_MAX - BLOCK_CANARY)
#define size_in_arenas(size) ((size) > SLAB_CLASS_MAX - BLOCK_CANARY && (size) <= hak_large_threshold())
/* ---- Slabs and SuperSlabs ---------------------------------------------- */

struct heap;

/* Flags live in the low bits of a slab's owner word, so that the free fast
 * path tests "owned by the caller and nothing special" with one compare. */
enum slab_flag {
    SLAB_ALIGNED = 1, /* holds over-allocated aligned blocks: interior frees allowed */
    SLAB_STASHES_FREES = 2, /* its owner's slab of a mid class: frees go to the class's stash */
    SLAB_MESHED = 4,  /* a page of it shares a physical page with another slab's (mesh.c) */
    SLAB_LOOSE = 8,   /* its owner's frees go to its remote list: the purger may mesh it (heap.c) */
    SLAB_FLAGS = 15,
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
    struct mesh_rec *mesh;     /* its meshed pages and reserved slots (mesh.c), NULL if none */
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

/* The owner word's flags change by atomic operations: the owner sets and
 * clears its own, and a thread holding blocks it took from another heap's
 * slab (heap_take_freed_into) sets SLAB_ALIGNED on that slab when it hands
 * one out for an aligned request (hak_aligned_alloc), which a load and a
 * store of the word by the owner would lose (an aligned block's free
 * refused as an interior pointer: test_stress under HAKMEM_MESH=stress,
 * whose owners loosened their slabs meanwhile). */
static inline void slab_flags_set(slab_t *s, uintptr_t flags)
{
    atomic_fetch_or_explicit(&s->owner, flags, memory_order_relaxed);
}

static inline void slab_flags_clear(slab_t *s, uintptr_t flags)
{
    atomic_fetch_and_explicit(&s->owner, ~flags, memory_order_relaxed);
}

/* The header page: descriptors for the 31 data pages of a SuperSlab
 * (indexed by head page - 1). The segment map names the slab that covers
 * each page (slab_of); a page outside any slab maps to hak_no_slab, whose
 * owner matches no heap.
 * The owning heap alone changes free_pages and the slabs; the purger only
 * purges dirty pages; the page lock orders the two. */
typedef struct superslab {
    /* The first line of a page is where a program's page-strided writes
     * land (one byte per page of a page-aligned buffer: all in one L1
     * set, which they flush): only fields the fast paths never read live
     * in it. Reading the free mark's secret from it cost battle json an L1
     * miss per free. */
    uint32_t magic;
    uint8_t bin;              /* the owner's bin it is in: its longest run of free pages */
    uint64_t dirty_since_ms;  /* when the oldest unpurged page was freed (page lock) */
    uint64_t empty_since_ms;  /* when it went to the pool */
    struct superslab *next, *prev;   /* registry of every SuperSlab, under ss_lock */
    struct superslab *hnext, *hprev; /* the owner's bin of SuperSlabs, or the pool */
    _Alignas(64) uint64_t link_secret; /* random: keys the block links of HAKMEM_SECURE */
    uint64_t canary_secret;   /* random: keys the block canaries of HAKMEM_SECURE */
    uint32_t free_pages;      /* bit i: data page i belongs to no slab (owner writes) */
    uint32_t dirty_pages;     /* free pages touched since they were last purged (page lock) */
    uint32_t open_pages;      /* data pages accessible: all but in the hardened build, where a page
                                 opens when a slab first takes it (page lock) */
    _Atomic int pages_lock;
    struct heap *heap;        /* owner, or NULL in the pool */
    slab_t slabs[SS_MAX_SPAN];       /* slabs[i - 1]: the slab whose head is page i */
} superslab_t;

_Static_assert(sizeof(superslab_t) <= SLAB_PAGE_SIZE / 2, "the header page holds the descriptors (and a guard page)");

extern slab_t hak_no_slab;

/* The key of the free mark (block.h), random, drawn when the first
 * SuperSlab is mapped: one for every block, so that the free fast path
 * reads it without finding the SuperSlab. Every free reads it: alone in
 * its line, which nothing writes. */
extern HAK_INTERNAL struct mark_key {
    _Alignas(64) uint64_t secret;
} hak_mark_key;

static inline superslab_t *superslab_of(const void *p)
{
    return (superslab_t *)((uintptr_t)p & ~(uintptr_t)SS_MASK);
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

/* ---- Segment map ------------------------------------------------------- */

/* Word i is the address of the leaf for the 4 GiB from i <<
 * SEGMAP_LEAF_SHIFT, less that range's first entry number, so that the
 * entry number p >> SEGMAP_ENTRY_SHIFT indexes it; 0 where hakmem has
 * mapped nothing in the range (no leaf). In .bss: read before init as
 * after. */
extern _Atomic uintptr_t hak_segmap[SEGMAP_LEAVES];

/* The entry of p's 64 KiB: a kind of enum seg_kind up to SEG_KIND_MAX, or
 * in a SuperSlab, the slab descriptor of the page (slab_of). */
static inline uintptr_t segmap_entry(const void *p)
{
    uintptr_t leaf = (uintptr_t)p >> SEGMAP_LEAF_SHIFT;
    if (unlikely(leaf >= SEGMAP_LEAVES))
        return SEG_NONE;
    uintptr_t entries = atomic_load_explicit(&hak_segmap[leaf], memory_order_relaxed);
    if (unlikely(!entries))
        return SEG_NONE;
    uintptr_t at = entries + ((uintptr_t)p >> SEGMAP_ENTRY_SHIFT) * sizeof(uintptr_t);
    return atomic_load_explicit((_Atomic uintptr_t *)at, memory_order_relaxed);
}

static inline unsigned segmap_kind(const void *p)
{
    uintptr_t e = segmap_entry(p);
    return e > SEG_KIND_MAX ? SEG_SUPERSLAB : (unsigned)e;
}

/* The slab descriptor covering p, inside a SuperSlab: hak_no_slab when p
 * lies in the header page or in free pages. */
static inline slab_t *slab_of(const void *p) { return (slab_t *)segmap_entry(p); }

/* Map the leaves for [start, start + size): false, errno ENOMEM, where
 * the kernel refuses a leaf. Every mapping hakmem marks is covered first;
 * the setters below then cannot fail. */
bool segmap_cover(const void *start, size_t size);
/* Mark the 2 MiB chunks from chunk: segmap_set the first head_kind and the
 * others SEG_LARGE_INTERIOR, segmap_set_all each kind, segmap_clear each
 * SEG_NONE. */
void segmap_set(void *chunk, size_t size, unsigned head_kind);
void segmap_set_all(void *chunk, size_t size, unsigned kind);
void segmap_clear(void *chunk, size_t size);
/* A new SuperSlab: its pages are covered by no_slab (&hak_no_slab). */
void segmap_set_superslab(superslab_t *ss, slab_t *no_slab);
/* Pages [page, page + span) of ss, a mapped SuperSlab, are covered by s
 * (&hak_no_slab: by no slab). */
void segmap_set_slab(superslab_t *ss, unsigned page, unsigned span, slab_t *s);
void segmap_fork_prepare(void);
void segmap_fork_parent(void);
void segmap_fork_child(void);

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

/* The pages an arena block for a request of size bytes spans, with the
 * hardened build's canary (BLOCK_CANARY). */
static inline uint32_t arena_pages_for(size_t size)
{
    return (uint32_t)((size + BLOCK_CANARY + ARENA_PAGE - 1) >> ARENA_PAGE_SHIFT);
}

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

#endif
