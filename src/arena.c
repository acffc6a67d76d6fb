/* Page arenas: the blocks above the slab classes (16 KiB) up to the large
 * threshold, as runs of 4 KiB pages ("extents") in 64 MiB arenas.
 *
 * Why not slabs: blocks of 64 KiB to 2 MiB, of many sizes, in page
 * bundles inside 2 MiB SuperSlabs left RSS a third above the live bytes on
 * a producer/consumer of 1 KiB..1 MiB blocks (bench rss-time: 74 MiB for
 * 43 live, glibc 50): a bundle needs its pages contiguous inside one
 * SuperSlab, whose free pages were too short or too few for the next
 * block, so new ones were touched while 20 MiB of free pages waited for a
 * purge. An arena places a block in the free run that fits it best (any
 * run of pages: a freed block merges with free neighbours at once), and
 * above the highest block is the wilderness, used only when no free run
 * fits: space freed at the top joins it, and is given back to the OS past
 * HAKMEM_ARENA_TRIM (glibc's trim) or once no block reached it for a
 * purge delay (measured at 3b66a85).
 *
 * Layout: the arena header (its state and a map with one 8-byte entry per
 * page) fills the first pages; no metadata lives in the blocks, so a
 * purged free run costs nothing to keep track of. The head and tail pages
 * of each extent, used or free, carry its length and state in the map;
 * free ones are linked into bins by length through their head entries.
 * The segment map marks every chunk of an arena SEG_ARENA; masking a
 * pointer with the arena size finds the header.
 *
 * Threads: arenas are shared, in lanes (as many as CPUs); a heap
 * allocates from its lane, and a block goes back to its arena's lane from
 * whichever thread frees it. One spin lock per lane covers its arenas:
 * there is no owner to hand blocks back to, so an exited thread leaves
 * nothing behind, and remote frees coalesce at once. */
#define _GNU_SOURCE
#include "arena.h"
#include "block.h"
#include "hooks.h"
#include "os.h"
#include "purger.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <string.h>

/* ---- map entries ------------------------------------------------------------- */

_Static_assert(ARENA_PAGES - 1 <= E_LINK_MASK && ARENA_PAGES <= E_PAGES_MASK, "page indexes fit the links");
_Static_assert(E_IN_FRONT < (uint64_t)1 << E_RECORD_SHIFT, "a sample's record leaves the in-front bit clear");

static inline unsigned e_state(uint64_t e) { return (unsigned)((e & E_STATE_MASK) >> E_STATE_SHIFT); }
static inline uint32_t e_next(uint64_t e) { return (uint32_t)((e >> E_NEXT_SHIFT) & E_LINK_MASK); }
static inline uint32_t e_prev(uint64_t e) { return (uint32_t)((e >> E_PREV_SHIFT) & E_LINK_MASK); }
static inline uint32_t e_record(uint64_t e) { return (uint32_t)(e >> E_RECORD_SHIFT); }

static inline uint64_t e_make(uint32_t pages, unsigned state, uint64_t flags)
{
    return pages | ((uint64_t)state << E_STATE_SHIFT) | flags;
}

static inline uint64_t e_with_links(uint64_t e, uint32_t next, uint32_t prev)
{
    e &= ~((E_LINK_MASK << E_NEXT_SHIFT) | (E_LINK_MASK << E_PREV_SHIFT));
    return e | ((uint64_t)next << E_NEXT_SHIFT) | ((uint64_t)prev << E_PREV_SHIFT);
}

/* Bins: one per length up to ARENA_EXACT_BINS pages, then four per
 * doubling up to the arena's size. */
#define ARENA_EXACT_BINS 512
#define ARENA_BINS (ARENA_EXACT_BINS + 4 * (ARENA_SHIFT - ARENA_PAGE_SHIFT - 9))
#define ARENA_BIN_WORDS ((ARENA_BINS + 63) / 64)

_Static_assert(ARENA_EXACT_BINS == 1 << 9, "the log bins start at 2^9 pages");
_Static_assert(ARENA_BIN_WORDS <= 64, "a bit of bin_words for each word of bin_mask");

static unsigned bin_of(uint32_t pages)
{
    if (pages <= ARENA_EXACT_BINS)
        return pages - 1;
    unsigned b = 31u - (unsigned)__builtin_clz(pages - 1);
    return ARENA_EXACT_BINS + (b - 9) * 4 + (((pages - 1) >> (b - 2)) & 3);
}

/* ---- arenas and lanes ------------------------------------------------------- */

struct lane;

typedef struct arena {
    /* The first line of a page: nothing the allocation paths read (see
     * superslab_t). */
    uint32_t magic;
    struct arena *next;       /* in its lane, oldest first */
    struct lane *lane;
    _Alignas(64) uint32_t top; /* first page of the wilderness: everything above is free */
    uint32_t dirty_end;       /* the wilderness's pages below this may be resident */
    uint32_t commit_end;      /* pages below are mapped (in ARENA_COMMIT_PAGES steps) */
    uint32_t end;             /* the arena grows no further: ARENA_PAGES, or where it met another mapping */
    bool reserved;            /* its whole window is reserved; else only pages below commit_end are mapped */
    uint32_t open_end;        /* pages below are accessible; in the hardened build those above are not (arena_open) */
    uint32_t used_pages;      /* in blocks handed out */
    uint32_t free_pages;      /* in free extents below top */
    uint32_t dirty_free_pages; /* of which flagged dirty */
    uint32_t top_high;        /* the highest top since the purger's last look */
    uint32_t purging_from;    /* the wilderness from here to dirty_end is being purged: not handed out; 0 for none */
    uint64_t looked_ms;       /* the purger's last look (arena_purge) */
    uint64_t bin_words;       /* bit w: bin_mask[w] is not zero */
    uint64_t bin_mask[ARENA_BIN_WORDS];
    uint16_t bin[ARENA_BINS]; /* head page of the first free extent, 0 for none */
    _Alignas(64) _Atomic uint64_t map[ARENA_PAGES];
} arena_t;

_Static_assert(offsetof(arena_t, map) == ARENA_MAP_OFFSET, "arena_head_entry finds the map");

#define ARENA_MAGIC 0x48414b41u /* "HAKA" */
#define ARENA_HEADER_PAGES ((sizeof(arena_t) + ARENA_PAGE - 1) / ARENA_PAGE)
#define ARENA_FIRST_PAGE ((uint32_t)ARENA_HEADER_PAGES)
#define ARENA_COMMIT_PAGES ((uint32_t)(((size_t)2 << 20) / ARENA_PAGE)) /* commit 2 MiB at a time */
#define ARENA_OPEN_PAGES ((uint32_t)(((size_t)64 << 10) / ARENA_PAGE))
_Static_assert(((size_t)ARENA_COMMIT_PAGES << ARENA_PAGE_SHIFT) % SS_SIZE == 0,
               "an arena maps whole chunks of the segment map");
/* A free that leaves more than HAKMEM_ARENA_TRIM of dirty wilderness
 * trims it to half that at once; the rest waits for the purger. mallopt's
 * M_TRIM_THRESHOLD may set it while other threads read it. */
static inline uint32_t trim_pages(void)
{
    return (uint32_t)(__atomic_load_n(&hak_config.arena_trim, __ATOMIC_RELAXED) >> ARENA_PAGE_SHIFT);
}

/* A lane's pool of one front bin's blocks (see "the lanes' pools"), on
 * lines of its own: threads of the lane taking and giving blocks of
 * other sizes take other locks, on other lines. */
#define POOL_SLOTS 14
typedef struct pool {
    _Atomic int lock;
    _Atomic uint32_t count; /* read unlocked by a take that finds none */
    uint64_t since_ms;      /* when its first block came into it, empty */
    void *blocks[POOL_SLOTS];
} __attribute__((aligned(64))) pool_t;

typedef struct lane {
    _Atomic int lock;
    arena_t *arenas;
    pthread_mutex_t purge_lock; /* one purge pass at a time, taken before the lock (lane_purge) */
    pool_t pools[ARENA_FRONT_BINS];
} __attribute__((aligned(64))) lane_t;

#define ARENA_LANES_MAX 64
static lane_t lanes[ARENA_LANES_MAX] = {[0 ... ARENA_LANES_MAX - 1] = {.purge_lock = PTHREAD_MUTEX_INITIALIZER}};
static unsigned lane_count = 1;
static _Atomic unsigned next_lane;

static void spin_lock(_Atomic int *lock)
{
    while (atomic_exchange_explicit(lock, 1, memory_order_acquire))
        while (atomic_load_explicit(lock, memory_order_relaxed))
            sched_yield(); /* a lane's holder in madvise: microseconds */
}

static void spin_unlock(_Atomic int *lock) { atomic_store_explicit(lock, 0, memory_order_release); }
static void lane_lock(lane_t *l) { spin_lock(&l->lock); }
static void lane_unlock(lane_t *l) { spin_unlock(&l->lock); }

static uint64_t canary_secret; /* the hardened build's (canary_value) */

/* One lane per CPU the process may run on. */
void arena_init(void)
{
    if (HAK_SECURE)
        canary_secret = canary_secret_of(os_random());
    unsigned count = os_cpu_count();
    lane_count = count > ARENA_LANES_MAX ? ARENA_LANES_MAX : count;
}

unsigned arena_lane_next(void) { return atomic_fetch_add_explicit(&next_lane, 1, memory_order_relaxed) % lane_count; }

static inline arena_t *arena_of(const void *p) { return (arena_t *)((uintptr_t)p & ~(uintptr_t)ARENA_MASK); }

static inline uint32_t page_index(const arena_t *a, const void *p)
{
    return (uint32_t)(((uintptr_t)p - (uintptr_t)a) >> ARENA_PAGE_SHIFT);
}

static inline char *page_address(arena_t *a, uint32_t page) { return (char *)a + ((size_t)page << ARENA_PAGE_SHIFT); }

static inline uint64_t entry(arena_t *a, uint32_t page)
{
    return atomic_load_explicit(&a->map[page], memory_order_relaxed);
}

static inline void entry_set(arena_t *a, uint32_t page, uint64_t e)
{
    atomic_store_explicit(&a->map[page], e, memory_order_relaxed);
}

/* The head and tail entries of the extent [start, start + pages). */
static void extent_mark(arena_t *a, uint32_t start, uint32_t pages, unsigned state, uint64_t flags)
{
    uint64_t e = e_make(pages, state, flags);
    if (pages > 1)
        entry_set(a, start + pages - 1, e);
    entry_set(a, start, e | E_HEAD);
}

/* The extent's pages become the inside of a larger one (or wilderness). */
static void extent_unmark(arena_t *a, uint32_t start, uint32_t pages)
{
    entry_set(a, start, 0);
    if (pages > 1)
        entry_set(a, start + pages - 1, 0);
}

/* ---- bins ----------------------------------------------------------------------- */

/* The free extent at start joins its bin: at the front if dirty (taken
 * first: resident already), else at the back. Each bin is a circular list. */
static void bin_insert(arena_t *a, uint32_t start, uint64_t e)
{
    unsigned b = bin_of(e_pages(e));
    uint32_t first = a->bin[b];
    if (!first) {
        entry_set(a, start, e_with_links(e, start, start));
        a->bin[b] = (uint16_t)start;
        a->bin_mask[b / 64] |= (uint64_t)1 << (b % 64);
        a->bin_words |= (uint64_t)1 << (b / 64);
        return;
    }
    uint64_t fe = entry(a, first);
    uint32_t last = e_prev(fe);
    entry_set(a, start, e_with_links(e, first, last));
    if (last == first) {
        entry_set(a, first, e_with_links(fe, start, start));
    } else {
        entry_set(a, first, e_with_links(fe, e_next(fe), start));
        uint64_t le = entry(a, last);
        entry_set(a, last, e_with_links(le, start, e_prev(le)));
    }
    if (e & E_DIRTY)
        a->bin[b] = (uint16_t)start;
}

static void bin_remove(arena_t *a, uint32_t start, uint64_t e)
{
    unsigned b = bin_of(e_pages(e));
    uint32_t next = e_next(e), prev = e_prev(e);
    if (next == start) {
        a->bin[b] = 0;
        if (!(a->bin_mask[b / 64] &= ~((uint64_t)1 << (b % 64))))
            a->bin_words &= ~((uint64_t)1 << (b / 64));
        return;
    }
    uint64_t ne = entry(a, next);
    entry_set(a, next, e_with_links(ne, e_next(ne), prev));
    uint64_t pe = entry(a, prev); /* read after: prev may be next */
    entry_set(a, prev, e_with_links(pe, next, e_prev(pe)));
    if (a->bin[b] == start)
        a->bin[b] = (uint16_t)next;
}

/* The first non-empty bin from b on, or ARENA_BINS: the rest of b's word,
 * else the first non-empty word after it (bin_words). Scanning the words
 * one by one cost a block taken from the wilderness 53 instructions of
 * 472 (malloc(256 KiB) and free, callgrind). */
static unsigned bin_next_nonempty(const arena_t *a, unsigned b)
{
    unsigned w = b / 64;
    uint64_t bits = a->bin_mask[w] & (~(uint64_t)0 << (b % 64));
    if (!bits) {
        uint64_t words = a->bin_words & (~(uint64_t)1 << w);
        if (!words)
            return ARENA_BINS;
        w = (unsigned)__builtin_ctzll(words);
        bits = a->bin_mask[w];
    }
    return w * 64 + (unsigned)__builtin_ctzll(bits);
}

/* The free extent that holds `pages` pages best (the shortest; among
 * equals the first of its bin, dirty ones first), or 0. */
static uint32_t bin_best_fit(arena_t *a, uint32_t pages)
{
    for (unsigned b = bin_next_nonempty(a, bin_of(pages)); b < ARENA_BINS; b = bin_next_nonempty(a, b + 1)) {
        uint32_t first = a->bin[b];
        if (b < ARENA_EXACT_BINS)
            return first; /* every extent of an exact bin from bin_of(pages) on fits */
        uint32_t best = 0, best_pages = UINT32_MAX, s = first;
        do { /* a log bin: lengths vary, and in the first one some may not fit */
            uint64_t e = entry(a, s);
            if (e_pages(e) >= pages && e_pages(e) < best_pages)
                best = s, best_pages = e_pages(e);
            s = e_next(e);
        } while (s != first);
        if (best)
            return best;
    }
    return 0;
}

/* ---- the arena's address space ---------------------------------------------------- */

/* An arena's bottom takes 4 KiB pages, as a heap's first SuperSlabs do
 * (superslab.c): where the system gives every mapping huge pages, the
 * first 2 MiB of a program's 200 KiB of blocks of 16-64 KiB were one huge
 * page (3.7 MiB resident against 1.9). The rest, filled only by a larger
 * heap, gets huge pages where the system gives them. */
#define ARENA_SMALL_PAGES_BYTES ((size_t)4 << 20)

/* An arena maps only the pages it uses, 2 MiB at a time, from the start
 * of a free window of 64 MiB (os_map_window), and grows by mapping the
 * next pages of the window (os_map_more); where another mapping took
 * them, the arena ends there (a->end) and the lane makes another. The
 * windows lie far below where the kernel maps, so that little else is
 * ever mapped into them. Reserving the whole window at once, no access,
 * keeps other mappings out but counts as 64 MiB of the process's address
 * space: under a limit of it (ulimit -v 200000) a program of 48 KiB
 * blocks got a third of the bytes glibc served it, and python3 started at
 * a VmSize of 92 MiB against glibc's 13.7. An arena is reserved so only
 * where there is no far window (the kernel maps from the bottom up, as
 * under valgrind, or the address space is small), and where that is
 * refused too, windowed next to the kernel's mappings. Its segment map
 * entries are set for the chunks it maps, no more. */
static arena_t *arena_new(lane_t *l)
{
    uint32_t commit = (ARENA_FIRST_PAGE + ARENA_COMMIT_PAGES - 1) / ARENA_COMMIT_PAGES * ARENA_COMMIT_PAGES;
    size_t bytes = (size_t)commit << ARENA_PAGE_SHIFT;
    bool reserved = false;
    arena_t *a = os_map_window(bytes, ARENA_SIZE, true);
    if (!a && (a = os_reserve_aligned(ARENA_SIZE, ARENA_SIZE)) != NULL) {
        reserved = true;
        if (!os_commit(a, bytes)) {
            os_release(a, ARENA_SIZE, 0);
            return NULL;
        }
    }
    if (!a && !(a = os_map_window(bytes, ARENA_SIZE, false)))
        return NULL;
    if (!segmap_cover(a, ARENA_SIZE)) { /* the whole window's: growing cannot fail on it */
        os_release(a, reserved ? ARENA_SIZE : bytes, bytes);
        return NULL;
    }
    os_advise_small_pages(a, reserved ? ARENA_SMALL_PAGES_BYTES : bytes);
    a->magic = ARENA_MAGIC;
    a->lane = l;
    a->top = a->dirty_end = a->top_high = ARENA_FIRST_PAGE;
    a->commit_end = commit;
    a->end = ARENA_PAGES;
    a->reserved = reserved;
    a->open_end = commit;
    /* closed from a boundary of kernel pages up to 64 KiB */
    uint32_t first_open = (ARENA_FIRST_PAGE + ARENA_OPEN_PAGES - 1) / ARENA_OPEN_PAGES * ARENA_OPEN_PAGES;
    if (HAK_SECURE && os_protect(page_address(a, first_open), (size_t)(commit - first_open) << ARENA_PAGE_SHIFT, false))
        a->open_end = first_open;
    segmap_set_all(a, reserved ? ARENA_SIZE : bytes, SEG_ARENA);
    arena_t **link = &l->arenas;
    while (*link)
        link = &(*link)->next;
    *link = a;
    return a;
}

static void arena_unmap(lane_t *l, arena_t *a)
{
    for (arena_t **link = &l->arenas; *link; link = &(*link)->next)
        if (*link == a) {
            *link = a->next;
            break;
        }
    size_t mapped = (size_t)a->commit_end << ARENA_PAGE_SHIFT;
    segmap_clear(a, a->reserved ? ARENA_SIZE : mapped);
    os_release(a, a->reserved ? ARENA_SIZE : mapped, mapped);
}

/* Make a's pages below `end` usable, in steps of ARENA_COMMIT_PAGES:
 * committed in its reservation, or mapped in its window. */
static bool arena_commit(arena_t *a, uint32_t end)
{
    uint32_t commit = (end + ARENA_COMMIT_PAGES - 1) / ARENA_COMMIT_PAGES * ARENA_COMMIT_PAGES;
    if (commit > a->end)
        commit = a->end;
    char *from = page_address(a, a->commit_end);
    size_t bytes = (size_t)(commit - a->commit_end) << ARENA_PAGE_SHIFT;
    if (a->reserved) {
        if (!os_commit(from, bytes))
            return false;
    } else {
        if (!os_map_more(from, bytes)) {
            a->end = a->commit_end; /* another mapping is there, or a limit was met: no retry each malloc */
            return false;
        }
        if (((size_t)a->commit_end << ARENA_PAGE_SHIFT) < ARENA_SMALL_PAGES_BYTES)
            os_advise_small_pages(from, bytes);
        segmap_set_all(from, bytes, SEG_ARENA);
    }
    if (HAK_SECURE) /* closed until arena_open (where refused, left open) */
        os_protect(from, bytes, false);
    else
        a->open_end = commit;
    a->commit_end = commit;
    return true;
}

/* Make a's pages below `end` usable: committed (arena_commit), and in the
 * hardened build opened. Its wilderness stays inaccessible past the 64
 * KiB after its last block, so that a stray write past the blocks faults
 * (in 2 MiB steps, a block's first 1 MiB past its end were writable),
 * for an mprotect per 64 KiB the arena grows. */

static bool arena_open(arena_t *a, uint32_t end)
{
    if (end > a->commit_end && !arena_commit(a, end))
        return false;
    if (!HAK_SECURE || end <= a->open_end)
        return true;
    uint32_t open = (end + ARENA_OPEN_PAGES - 1) / ARENA_OPEN_PAGES * ARENA_OPEN_PAGES;
    if (open > a->commit_end)
        open = a->commit_end;
    if (!os_protect(page_address(a, a->open_end), (size_t)(open - a->open_end) << ARENA_PAGE_SHIFT, true))
        return false;
    a->open_end = open;
    return true;
}

/* A windowed arena's mapped pages above its wilderness's first step go
 * back to the OS, address space and all, when a mapping was refused
 * (arena_release; a collect or malloc_trim only purges them, so that the
 * arena's next blocks need no mapping again): under a limit of address
 * space, the other tiers can then map what the program freed in the
 * arenas (test_oom's tiers after its arena blocks). The window may grow
 * there again. */
static void arena_unmap_wilderness(arena_t *a)
{
    uint32_t keep = (a->top + ARENA_COMMIT_PAGES - 1) / ARENA_COMMIT_PAGES * ARENA_COMMIT_PAGES;
    if (a->reserved || a->purging_from || keep >= a->commit_end)
        return;
    char *from = page_address(a, keep);
    size_t bytes = (size_t)(a->commit_end - keep) << ARENA_PAGE_SHIFT;
    segmap_clear(from, bytes);
    if (!os_unmap(from, bytes)) { /* refused at the limit of mappings, and purged instead */
        segmap_set_all(from, bytes, SEG_ARENA);
        return;
    }
    a->commit_end = keep;
    if (a->open_end > keep)
        a->open_end = keep;
    if (a->dirty_end > keep)
        a->dirty_end = keep;
    if (a->top_high > keep)
        a->top_high = keep;
}

/* The wilderness's pages from `from` up, marked being purged (no one
 * hands them out), are back to the OS: dirty no more, unless they were
 * handed out and given back since, which only a trim below does. */
static void wilderness_purged(arena_t *a, uint32_t from)
{
    if (a->dirty_end > from)
        a->dirty_end = from;
    a->purging_from = 0;
}

/* A free left a's wilderness with more dirty pages than
 * HAKMEM_ARENA_TRIM: those above half of it go back to the OS now. The
 * madvise (16 MiB and more) runs with the lane unlocked, the pages marked
 * being purged as the purger does (a malloc of the lane waited up to 2.4
 * ms for it on bench rss-time), unless the purger is at the lane. Called
 * with the lane locked, returns with it unlocked. */
static void wilderness_trim_unlock(lane_t *l, arena_t *a)
{
    uint32_t from = a->top + trim_pages() / 2;
    size_t bytes = (size_t)(a->dirty_end - from) << ARENA_PAGE_SHIFT;
    if (pthread_mutex_trylock(&l->purge_lock) != 0) { /* the purger's pass: under the lock */
        os_purge(page_address(a, from), bytes);
        a->dirty_end = from;
        lane_unlock(l);
        return;
    }
    a->purging_from = from; /* none was: purges set it under the purge lock */
    lane_unlock(l);
    os_purge(page_address(a, from), bytes);
    lane_lock(l);
    wilderness_purged(a, from);
    lane_unlock(l);
    pthread_mutex_unlock(&l->purge_lock);
}

/* ---- canaries (hardened build) ---------------------------------------------------- */

/* The hardened build ends every block with a canary of BLOCK_CANARY bytes,
 * never part of its usable size, as the slab blocks' (block.h): a secret
 * keyed with its address, with the slack between the request's end and it
 * in its upper half, the slack's first bytes filled (slack_fill). The
 * canary is written with no slack
 * under the lane lock whenever the run is handed out or resized, and the
 * holder then records the request (arena_block_sized): a free that
 * checks, under the lane lock, the canary just before its block (a used
 * extent's end) never reads one not yet written. A block waiting in a
 * thread's front holds a second one in its first word (arena_freed_mark),
 * which a write or clear after free changes and the malloc that takes it
 * checks (arena_freed_check). */
static uintptr_t canary_value(const void *at, size_t slack)
{
    return canary_keyed(canary_secret, at) ^ ((uintptr_t)slack << CANARY_SLACK_SHIFT);
}

static uintptr_t *canary_before(const char *end) { return (uintptr_t *)(end - BLOCK_CANARY); }

/* The slack recorded by the canary that ends a run of `bytes` at end, or
 * -1 where it was overwritten (canary_slack_decoded). */
static long canary_slack(const char *end, size_t bytes)
{
    return canary_slack_decoded(*canary_before(end) ^ canary_value(canary_before(end), 0), bytes);
}

static void canary_set(arena_t *a, uint32_t start, uint32_t pages, size_t slack)
{
    if (!HAK_SECURE)
        return;
    char *end = page_address(a, start + pages);
    slack_fill(end - BLOCK_CANARY - slack, slack);
    *canary_before(end) = canary_value(canary_before(end), slack);
}

/* The end of p's run, p a block handed out (its holder reads its head entry). */
static char *block_end(const void *p)
{
    uint64_t e = atomic_load_explicit(arena_head_entry(p), memory_order_relaxed);
    return (char *)p + ((size_t)e_pages(e) << ARENA_PAGE_SHIFT);
}

static long run_slack(const void *p)
{
    const char *end = block_end(p);
    return canary_slack(end, (size_t)(end - (const char *)p));
}

void arena_block_sized(void *p, size_t request)
{
    request += !request; /* as block_slack_set */
    char *end = block_end(p);
    arena_t *a = arena_of(p);
    canary_set(a, page_index(a, p), (uint32_t)((size_t)(end - (char *)p) >> ARENA_PAGE_SHIFT),
               (size_t)(end - BLOCK_CANARY - (char *)p) - request);
}

/* The request p (a block handed out) holds, from its canary; its run's
 * bytes but the canary where that was overwritten. */
static size_t block_request(const void *p)
{
    long slack = run_slack(p);
    return (size_t)(block_end(p) - BLOCK_CANARY - (const char *)p) - (slack > 0 ? (size_t)slack : 0);
}

bool arena_block_intact(const void *p)
{
    const char *end = block_end(p);
    long slack = run_slack(p);
    if (slack < 0)
        return false;
    return slack_intact(end - BLOCK_CANARY - slack, (size_t)slack);
}

/* Under the lane lock: 0 when the canaries of the block at start hold,
 * 1 for its own (a write past its end), -1 for the one before it (the
 * used extent there, written past its end or before this block's start). */
static int block_canary_fault(arena_t *a, uint32_t start)
{
    char *p = page_address(a, start);
    if (!arena_block_intact(p))
        return 1;
    uint64_t before = start > ARENA_FIRST_PAGE ? entry(a, start - 1) : 0; /* a tail entry, or a one-page head */
    return before && e_state(before) == EXTENT_USED && canary_slack(p, (size_t)e_pages(before) << ARENA_PAGE_SHIFT) < 0
               ? -1
               : 0;
}

/* Mended after a report in HAKMEM_ON_ERROR=warn mode, with no slack. */
static void block_canary_mend(arena_t *a, uint32_t start)
{
    canary_set(a, start, e_pages(entry(a, start)), 0);
    uint64_t before = start > ARENA_FIRST_PAGE ? entry(a, start - 1) : 0;
    if (before && e_state(before) == EXTENT_USED)
        canary_set(a, start - e_pages(before), e_pages(before), 0);
}

void arena_freed_mark(void *p) { *(uintptr_t *)p = canary_value(p, 0) ^ 1; }

void arena_freed_check(const void *p)
{
    if (*(const uintptr_t *)p != (canary_value(p, 0) ^ 1))
        hak_free_list_corrupt(p);
}

/* ---- taking and giving back extents (under the lane lock) ------------------------- */

/* The extent [start, start + pages) is handed out. */
static uint32_t arena_hand_out(arena_t *a, uint32_t start, uint32_t pages)
{
    extent_mark(a, start, pages, EXTENT_USED, 0);
    a->used_pages += pages;
    return start;
}

/* The first `pages` pages of the free extent at start, handed out; the
 * rest stays free, as dirty as it was. *stale: how many of the bytes
 * handed out may hold old contents (calloc clears those; the rest reads
 * as zeros where purges clear pages, os_purged_pages_read_zero). */
static uint32_t arena_take_from(arena_t *a, uint32_t start, uint32_t pages, size_t *stale)
{
    uint64_t e = entry(a, start), dirty = e & E_DIRTY;
    uint32_t have = e_pages(e);
    bin_remove(a, start, e);
    if (have > pages) { /* the rest has been free as long as the whole: it stays seen */
        extent_mark(a, start + pages, have - pages, EXTENT_FREE, e & (E_DIRTY | E_SEEN));
        bin_insert(a, start + pages, entry(a, start + pages));
    }
    a->free_pages -= pages;
    if (dirty)
        a->dirty_free_pages -= pages;
    *stale = dirty ? (size_t)pages << ARENA_PAGE_SHIFT : 0;
    return arena_hand_out(a, start, pages);
}

/* A run of `pages` pages from a's free extents (best fit), or 0. */
static uint32_t arena_take_free(arena_t *a, uint32_t pages, size_t *stale)
{
    uint32_t start = bin_best_fit(a, pages);
    return start ? arena_take_from(a, start, pages, stale) : 0;
}

/* A run of `pages` pages from the bottom of a's wilderness, or 0 (also
 * where it would reach the pages the purger is giving back: arena_alloc
 * then waits for it). */
static uint32_t arena_take_wild(arena_t *a, uint32_t pages, size_t *stale)
{
    if (a->end - a->top < pages || (a->purging_from && a->top + pages > a->purging_from))
        return 0;
    uint32_t start = a->top, end = start + pages;
    if (end > a->open_end && !arena_open(a, end))
        return 0;
    uint32_t dirty = a->dirty_end > start ? (a->dirty_end < end ? a->dirty_end : end) - start : 0;
    a->top = end;
    if (a->top_high < end)
        a->top_high = end;
    if (a->dirty_end < end)
        a->dirty_end = end;
    *stale = (size_t)dirty << ARENA_PAGE_SHIFT;
    return arena_hand_out(a, start, pages);
}

/* The free extent at start leaves its bin to merge with a block being
 * freed next to it. */
static void extent_absorb(arena_t *a, uint32_t start)
{
    uint64_t head = entry(a, start);
    uint32_t pages = e_pages(head);
    bin_remove(a, start, head);
    extent_unmark(a, start, pages);
    a->free_pages -= pages;
    if (head & E_DIRTY)
        a->dirty_free_pages -= pages;
}

/* The extent at start (pages long, counted neither used nor free) is
 * free: it merges with free neighbours, and into the wilderness if it
 * reaches it. The merged extent is dirty if any part is, a purged
 * neighbour included, which the purger's next madvise covers again.
 * Returns true when the wilderness has more dirty pages than it keeps
 * (the caller trims). */
static bool extent_free(arena_t *a, uint32_t start, uint32_t pages, bool dirty)
{
    extent_unmark(a, start, pages);
    if (start > ARENA_FIRST_PAGE) {
        uint64_t before = entry(a, start - 1);
        if (e_state(before) == EXTENT_FREE) {
            start -= e_pages(before);
            pages += e_pages(before);
            dirty |= (before & E_DIRTY) != 0;
            extent_absorb(a, start);
        }
    }
    uint32_t end = start + pages;
    if (end == a->top) { /* into the wilderness, counted dirty up to dirty_end (>= the old top) */
        a->top = start;
        return a->dirty_end - a->top > trim_pages();
    }
    uint64_t after = entry(a, end);
    if (e_state(after) == EXTENT_FREE) {
        pages += e_pages(after);
        dirty |= (after & E_DIRTY) != 0;
        extent_absorb(a, end);
    }
    extent_mark(a, start, pages, EXTENT_FREE, dirty ? E_DIRTY : 0);
    bin_insert(a, start, entry(a, start));
    a->free_pages += pages;
    if (dirty)
        a->dirty_free_pages += pages;
    return false;
}

/* The used extent at start is free, its pages dirty (handed out:
 * resident, maybe). */
static bool arena_give_back(arena_t *a, uint32_t start, uint32_t pages)
{
    a->used_pages -= pages;
    return extent_free(a, start, pages, true);
}

/* The aligned start inside a run taken with align_pages - 1 pages to
 * spare: the pages before and after it go back. Page indexes are aligned
 * as addresses are, the arena being aligned to its size. */
static uint32_t arena_align_run(arena_t *a, uint32_t start, uint32_t pages, uint32_t align_pages)
{
    uint32_t total = pages + align_pages - 1;
    uint32_t aligned = (start + align_pages - 1) & ~(align_pages - 1);
    uint32_t lead = aligned - start, trail = total - lead - pages;
    extent_mark(a, aligned, pages, EXTENT_USED, 0);
    if (trail) {
        extent_mark(a, aligned + pages, trail, EXTENT_USED, 0);
        arena_give_back(a, aligned + pages, trail);
    }
    if (lead) {
        extent_mark(a, start, lead, EXTENT_USED, 0);
        arena_give_back(a, start, lead);
    }
    return aligned;
}

/* Dirty memory waits in some arena for the purger (set by frees, cleared
 * by the purger before it looks, so that a free after its look tells it
 * again). Pages a young program's frees leave untold set nothing: the
 * next free counts its own against the bound too. */
static _Atomic bool arena_purge_wanted;

static void arena_dirtied(uint32_t pages)
{
    if (atomic_load_explicit(&arena_purge_wanted, memory_order_relaxed) ||
        purger_young_untold((size_t)pages << ARENA_PAGE_SHIFT, os_now_ms()))
        return;
    atomic_store_explicit(&arena_purge_wanted, true, memory_order_relaxed);
    purger_notify();
}

/* A block of `size` bytes aligned to align (a power of two), zeroed if
 * asked: only the bytes that may hold old contents are cleared (pages new
 * to the arena, or purged with MADV_DONTNEED, read as zeros). With
 * HAKMEM_PREWARM the others, which are not resident, fault in with one
 * call (0.5 us a page against 10 for a fault on our VMs: bench rss-time
 * 685 -> 967 k blocks/s, with HAKMEM_ARENA_TRIM=4M 62 -> 227,
 * measured at 373bbb5). */
void *arena_alloc(size_t size, size_t align, unsigned lane_index, bool zero)
{
    uint32_t pages = size ? arena_class_pages(arena_pages_for(size)) : 1;
    uint32_t align_pages = align > ARENA_PAGE ? (uint32_t)(align >> ARENA_PAGE_SHIFT) : 1;
    uint32_t want = pages + align_pages - 1;
    lane_t *l = &lanes[lane_index];
    size_t stale = 0;
    for (int attempt = 0; attempt < 2; attempt++) {
        lane_lock(l);
        /* Free runs of every arena before any wilderness, a new arena last. */
        arena_t *a;
        uint32_t start = 0;
        for (a = l->arenas; a && !(start = arena_take_free(a, want, &stale)); a = a->next)
            ;
        bool purging = false;
        if (!start)
            for (a = l->arenas; a && !(start = arena_take_wild(a, want, &stale)); a = a->next)
                purging |= a->purging_from != 0;
        if (!start && purging) { /* the purger gives back the wilderness that would do: wait, not map */
            lane_unlock(l);
            pthread_mutex_lock(&l->purge_lock);
            pthread_mutex_unlock(&l->purge_lock);
            attempt--;
            continue;
        }
        if (!start && (a = arena_new(l)) != NULL)
            start = arena_take_wild(a, want, &stale);
        if (start && align_pages > 1)
            start = arena_align_run(a, start, pages, align_pages);
        if (start)
            canary_set(a, start, pages, 0);
        lane_unlock(l);
        if (start) {
            char *p = page_address(a, start);
            size_t bytes = (size_t)pages << ARENA_PAGE_SHIFT;
            /* purged pages taken again fault in anew, past any mapping's
             * check of the memory limit */
            if (stale < bytes && os_memory_pressed(bytes - stale))
                purger_release_caches();
            if (hak_config.prewarm && stale < bytes) /* first: a clear of them then faults none */
                os_prefault(p + stale, bytes - stale);
            if (zero)
                memset(p, 0, stale < size && os_purged_pages_read_zero() ? stale : size);
            return p;
        }
        if (attempt || !purger_release_caches())
            break;
    }
    errno = ENOMEM;
    return NULL;
}

/* ---- blocks: checks, free, size -------------------------------------------------- */

/* The start page of the extent holding page, or 0 when page lies in the
 * header or the wilderness. Inside an extent the map is zero but for its
 * head and tail: walking back from page finds one of them. */
static uint32_t extent_containing(arena_t *a, uint32_t page)
{
    if (page < ARENA_FIRST_PAGE || page >= a->top)
        return 0;
    uint32_t i = page;
    uint64_t e;
    while (!(e = entry(a, i)))
        i--;
    return e & E_HEAD ? i : i + 1 - e_pages(e);
}

/* NULL if p starts a block handed out, else what is wrong with it. Under
 * the lane lock. */
static const char *block_fault(arena_t *a, const void *p, uint32_t *start)
{
    uint32_t page = page_index(a, p);
    uint64_t e = ((uintptr_t)p & (ARENA_PAGE - 1)) || page >= a->top ? 0 : entry(a, page);
    *start = page;
    if ((e & E_HEAD) && e_state(e) == EXTENT_USED)
        return e & E_IN_FRONT ? "double free (the block waits in a thread's front or its lane's pool)" : NULL;
    if ((e & E_HEAD) && e_state(e) == EXTENT_FREE)
        return "double free";
    uint32_t head = extent_containing(a, page);
    if (!head)
        return page < ARENA_FIRST_PAGE ? "pointer into hakmem metadata (a page arena's header)"
                                       : "pointer into hakmem's free pages (double free, or never handed out)";
    return e_state(entry(a, head)) == EXTENT_USED ? "interior pointer: not the start of a block"
                                                  : "pointer into a freed block (double free, or use after free)";
}

/* p, a block just handed out, is a profiling sample whose record has
 * index `record` (sample.c), which its free and its resizes update. Its
 * holder alone writes a used extent's head entry; a neighbour's merge and
 * the purger, under the lane lock, read the length and state in it, which
 * this leaves as they are. */
void arena_mark_sampled(void *p, uint32_t record)
{
    arena_t *a = arena_of(p);
    uint32_t page = page_index(a, p);
    entry_set(a, page, entry(a, page) | E_SAMPLED | (uint64_t)record << E_RECORD_SHIFT);
}

void arena_free(void *p, const char *op)
{
    arena_t *a = arena_of(p);
    lane_t *l = a->lane;
    uint32_t start;
    uint64_t head = 0;
    bool trim = false;
    lane_lock(l);
    const char *fault = block_fault(a, p, &start);
    if (!fault && HAK_SECURE) {
        int broken = block_canary_fault(a, start);
        if (broken) { /* in warn mode the block stays allocated, its canaries mended */
            fault = broken > 0 ? "a write past the end of this block overwrote its canary"
                               : "a write before the start of this block (or past the end of the block before it) "
                                 "overwrote the canary between them";
            block_canary_mend(a, start);
        }
    }
    if (!fault) {
        head = entry(a, start);
        trim = arena_give_back(a, start, e_pages(head));
    }
    if (trim)
        wilderness_trim_unlock(l, a);
    else
        lane_unlock(l);
    if (fault) {
        hak_report_bad_pointer(op, p, fault);
        return;
    }
    if (head & E_SAMPLED)
        hak_profile_hooks.sample_freed(e_record(head));
    arena_dirtied(e_pages(head));
}

size_t arena_usable_size(const void *p, const char *op)
{
    arena_t *a = arena_of(p);
    uint32_t start;
    lane_lock(a->lane);
    const char *fault = block_fault(a, p, &start);
    size_t size = fault ? 0 : HAK_SECURE ? block_request(p) : (size_t)e_pages(entry(a, start)) << ARENA_PAGE_SHIFT;
    lane_unlock(a->lane);
    if (fault)
        hak_report_bad_pointer(op, p, fault);
    return size;
}

/* p inside a block handed out (interior pointers included). */
bool arena_owns(const void *p)
{
    arena_t *a = arena_of(p);
    lane_lock(a->lane);
    uint32_t head = extent_containing(a, page_index(a, p));
    uint64_t e = head ? entry(a, head) : 0;
    bool owned = head && e_state(e) == EXTENT_USED && !(e & E_IN_FRONT);
    lane_unlock(a->lane);
    return owned;
}

/* realloc of the block at p: checked (a bad pointer is reported as op's,
 * and 0 returned), then, where `resize` says, made to hold size bytes if
 * its run can grow or shrink in place, into free pages or the wilderness
 * right after it (*resized; else the caller moves it). Returns its usable
 * size before. The check and the resize share one lane lock, a locked
 * instruction. A resize is, for the profile, an allocation of size bytes
 * at site, counted down as a new block's are (the large tier's countdown,
 * sample_large): where it is a sample the block takes a new record in
 * place, the old one dying; else an old record takes the new size.
 * Moving the block instead, a copy of up to the large threshold at each
 * such sample, made bench_realloc's cycle 18 times as slow. */
size_t arena_realloc_in_place(void *p, size_t size, bool resize, bool *resized, uintptr_t site, const char *op)
{
    arena_t *a = arena_of(p);
    uint32_t start, want = arena_class_pages(arena_pages_for(size));
    bool done = false, trim = false;
    size_t stale = 0; /* of the pages it grows into, the bytes at their start that may be resident */
    lane_lock(a->lane);
    const char *fault = block_fault(a, p, &start);
    uint64_t head = fault ? 0 : entry(a, start), sampled = head & E_SAMPLE_BITS;
    uint32_t have = e_pages(head), end = start + have;
    size_t usable = fault ? 0 : HAK_SECURE ? block_request(p) : (size_t)have << ARENA_PAGE_SHIFT;
    if (!fault && resize) {
        done = true;
        if (want < have) { /* the tail goes back */
            extent_unmark(a, start, have);
            extent_mark(a, start, want, EXTENT_USED, 0);
            extent_mark(a, end - (have - want), have - want, EXTENT_USED, 0);
            trim = arena_give_back(a, end - (have - want), have - want);
        } else if (want > have) { /* the pages after it, taken as a run of their own, join it */
            uint32_t more = want - have;
            uint64_t after = end < a->top ? entry(a, end) : 0;
            if (end == a->top)
                done = arena_take_wild(a, more, &stale) != 0;
            else
                done = e_state(after) == EXTENT_FREE && e_pages(after) >= more && arena_take_from(a, end, more, &stale);
            if (done) {
                extent_unmark(a, start, have);
                extent_unmark(a, end, more);
                extent_mark(a, start, want, EXTENT_USED, 0);
            }
        }
        if (sampled) /* the record stays with the block */
            entry_set(a, start, entry(a, start) | sampled);
    }
    if (done)
        canary_set(a, start, want, 0);
    if (trim)
        wilderness_trim_unlock(a->lane, a);
    else
        lane_unlock(a->lane);
    *resized = done;
    if (fault) {
        hak_report_bad_pointer(op, p, fault);
        return 0;
    }
    if (done && want < have)
        arena_dirtied(have - want);
    size_t grown = done && want > have ? (size_t)(want - have) << ARENA_PAGE_SHIFT : 0;
    if (hak_config.prewarm && stale < grown) /* as a new block's (arena_alloc) */
        os_prefault(page_address(a, end) + stale, grown - stale);
    uint32_t record = done && hak_config.profile ? hak_profile_hooks.large_sample(size, site) : 0;
    if (record) {
        if (sampled)
            hak_profile_hooks.sample_freed(e_record(head));
        entry_set(a, start, (entry(a, start) & ~E_SAMPLE_BITS) | E_SAMPLED | (uint64_t)record << E_RECORD_SHIFT);
    } else if (done && sampled) {
        hak_profile_hooks.sample_resized(e_record(head), size);
    }
    if (HAK_SECURE && done)
        arena_block_sized(p, size);
    return usable;
}

/* ---- the lanes' pools ----------------------------------------------------------- */

/* Behind the threads' fronts, each lane keeps a pool per front bin: the
 * blocks of its arenas that threads of other lanes freed past their bin's
 * limit, for the next malloc of the lane's threads that finds its own bin
 * empty. A block goes to and comes from a pool under the pool's own lock,
 * with a push or a pop, where the lane would take its lock, a best fit and
 * a split, and at the free a merge with the block's neighbours: threads
 * that hand buffers to each other reuse them at once (two threads trading
 * buffers of 64..256 KiB, written on every page: 0.90-0.92 of the time
 * without pools; measured at 463d85b). A thread's own blocks
 * past its bin go back to their arena: pooled too, they made bench_threads
 * big (64 live blocks of 64..256 KiB replaced at random, written only at
 * their start) 1.26 times as fast, but with its blocks written on every
 * page, as a program uses its buffers, it ran level and held 41% more RSS
 * (30.5 MiB against 21.5 for 10 MiB live): what a pool holds is what it
 * gains, and a thread's own surplus is the front's to bound. Only a
 * thread whose bin has a limit (its mallocs asked for the size) gives a
 * block to a pool: a thread that only frees, as a consumer, gives its
 * blocks back to their arenas, to merge. A pooled block is marked as in a
 * front (E_IN_FRONT: a free of one is a double free). A pool holds
 * POOL_SLOTS blocks and HAKMEM_ARENA_POOL bytes at most (none by
 * default: the stress test's soak gains nothing from 1 MiB pools, 0.95-1.11
 * of the operations in ten pairs of runs, measured at 1e33727; at 1 MiB, 4 blocks
 * of 256 KiB, 14 of 64 KiB). (A byte budget for the
 * whole lane cost its atomic adds at each push and pop.) The purger gives
 * a pool's blocks back to their arenas a purge delay after its first one
 * came (lane_purge), a collect those of its thread's lane at once (every
 * lane's with force). */

/* p, a block handed out and freed by a thread whose front bin `bin` is
 * full, its head entry e: true if it joined its lane's pool. */
bool arena_pool_put(void *p, uint64_t e, unsigned bin)
{
    arena_t *a = arena_of(p);
    uint32_t page = page_index(a, p);
    uint32_t room = (uint32_t)(hak_config.arena_pool >> ARENA_PAGE_SHIFT) / e_pages(e);
    if (!room)
        return false;
    pool_t *pool = &a->lane->pools[bin];
    spin_lock(&pool->lock);
    uint32_t n = atomic_load_explicit(&pool->count, memory_order_relaxed);
    bool kept = n < room && n < POOL_SLOTS;
    if (kept) {
        entry_set(a, page, e | E_IN_FRONT);
        if (!n)
            pool->since_ms = os_now_ms();
        pool->blocks[n] = p;
        atomic_store_explicit(&pool->count, n + 1, memory_order_relaxed);
    }
    spin_unlock(&pool->lock);
    if (kept && !n)
        arena_dirtied(e_pages(e));
    return kept;
}

/* The block on top of pool, a pool of bin `bin`, or NULL if it has none
 * now. Out of line: arena_pool_take's look at an empty pool needs no
 * frame. */
static HAK_NOINLINE void *pool_pop(pool_t *pool, unsigned bin)
{
    spin_lock(&pool->lock);
    uint32_t n = atomic_load_explicit(&pool->count, memory_order_relaxed);
    void *b = n ? pool->blocks[n - 1] : NULL;
    if (n)
        atomic_store_explicit(&pool->count, n - 1, memory_order_relaxed);
    spin_unlock(&pool->lock);
    if (!b)
        return NULL;
    if (HAK_SECURE) {
        uint64_t e = atomic_load_explicit(arena_head_entry(b), memory_order_relaxed);
        if ((e & E_FRONT_TEST) != (E_USED_HEAD | E_IN_FRONT) ||
            e_pages(e) != hak_arena_bin_pages[bin])
            hak_free_list_corrupt(b);
    }
    front_unmark(arena_head_entry(b));
    return b;
}

/* A block for a malloc of `pages` pages (a front's size) from the pool
 * of lane, or NULL. */
void *arena_pool_take(unsigned lane, uint32_t pages)
{
    unsigned bin = hak_arena_bin_of[pages];
    pool_t *pool = &lanes[lane].pools[bin];
    if (likely(!atomic_load_explicit(&pool->count, memory_order_relaxed)))
        return NULL;
    return pool_pop(pool, bin);
}

/* The purger's pass over lane l's pools (lane_purge): those whose first
 * block came a delay ago or more, all of them with `all`, give their
 * blocks back to their arenas. Returns when the next falls due, or 0. */
static uint64_t pools_flush(lane_t *l, bool all, uint64_t now, uint64_t delay)
{
    uint64_t next_due = 0;
    for (unsigned bin = 0; bin < ARENA_FRONT_BINS; bin++) {
        pool_t *pool = &l->pools[bin];
        if (!atomic_load_explicit(&pool->count, memory_order_relaxed))
            continue;
        void *blocks[POOL_SLOTS];
        uint32_t n = 0;
        spin_lock(&pool->lock);
        if (all || now >= pool->since_ms + delay) {
            n = atomic_load_explicit(&pool->count, memory_order_relaxed);
            memcpy(blocks, pool->blocks, n * sizeof *blocks);
            atomic_store_explicit(&pool->count, 0, memory_order_relaxed);
        } else if (atomic_load_explicit(&pool->count, memory_order_relaxed)) {
            next_due = due_earlier(next_due, pool->since_ms + delay);
        }
        spin_unlock(&pool->lock);
        for (uint32_t i = 0; i < n; i++) {
            front_unmark(arena_head_entry(blocks[i]));
            arena_free(blocks[i], "free");
        }
    }
    return next_due;
}

/* Every pool of lane gives its blocks back now (a collect). */
void arena_pools_flush(unsigned lane) { pools_flush(&lanes[lane], true, 0, 0); }

/* p, inside a page arena, belongs to an arena of lane. */
bool arena_in_lane(const void *p, unsigned lane) { return arena_of(p)->lane == &lanes[lane]; }


/* ---- giving pages back ---------------------------------------------------------- */

/* The purger's look at an arena, every purge delay while it holds dirty
 * pages: free extents it saw dirty at its last look, and still free since
 * (any merge clears its seen flag), have waited at least a delay and go
 * back to the OS; the others are marked seen. So do the wilderness's
 * pages above the highest top since the last look (none of them was
 * handed out for a delay: on a steady churn the top moves up and down by
 * several MiB, and trimming all of it cost a page fault per block,
 * measured at 3b66a85). With force, every dirty page goes.
 *
 * The madvise calls run with the lane unlocked: one look on bench
 * rss-time held the lock 2.4 ms (1.5 in free extents, 0.9 in the
 * wilderness), as long as a malloc of the lane could wait. Under the lock
 * a look takes a batch of extents out of their bins, marked purging (no
 * one takes them or merges with them), and marks the wilderness's part
 * being purged (arena_take_wild keeps below it); unlocked, it purges
 * them; locked again, the extents come back clean, merging with their
 * free neighbours, and the wilderness's dirty end comes down. */
#define PURGE_BATCH 64

typedef struct purge_round {
    arena_t *arena;
    uint32_t page;  /* where the look goes on */
    uint32_t count; /* extents taken */
    uint32_t start[PURGE_BATCH], pages[PURGE_BATCH];
    uint32_t wild_from, wild_end; /* the wilderness's pages being purged, none if equal */
} purge_round_t;

/* Under the lane lock: r's arena from r->page on. True if the batch
 * filled first (r->page then says where to go on). */
static bool purge_round_take(purge_round_t *r, bool force)
{
    arena_t *a = r->arena;
    uint32_t page = r->page;
    if (page != ARENA_FIRST_PAGE && page < a->top) /* the extents may have merged since the last round */
        page = extent_containing(a, page);
    for (; page && page < a->top; page += e_pages(entry(a, page))) {
        uint64_t e = entry(a, page);
        uint32_t pages = e_pages(e);
        hak_assert(e & E_HEAD);
        if (e_state(e) != EXTENT_FREE || !(e & E_DIRTY))
            continue;
        if (!force && !(e & E_SEEN)) {
            entry_set(a, page, e | E_SEEN);
            continue;
        }
        if (r->count == PURGE_BATCH) {
            r->page = page;
            return true;
        }
        bin_remove(a, page, e);
        extent_mark(a, page, pages, EXTENT_PURGING, 0);
        a->free_pages -= pages;
        a->dirty_free_pages -= pages;
        r->start[r->count] = page;
        r->pages[r->count++] = pages;
    }
    uint32_t unused = force || a->top_high < a->top ? a->top : a->top_high;
    if (a->dirty_end > unused) { /* purging_from is 0: the purge lock is ours */
        a->purging_from = r->wild_from = unused;
        r->wild_end = a->dirty_end;
    }
    a->top_high = a->top;
    return false;
}

/* Unlocked: the pages go back to the OS. */
static void purge_round_run(const purge_round_t *r)
{
    for (uint32_t i = 0; i < r->count; i++)
        os_purge(page_address(r->arena, r->start[i]), (size_t)r->pages[i] << ARENA_PAGE_SHIFT);
    if (r->wild_end > r->wild_from)
        os_purge(page_address(r->arena, r->wild_from), (size_t)(r->wild_end - r->wild_from) << ARENA_PAGE_SHIFT);
}

/* Under the lane lock again: the extents are free and clean, and so is
 * the wilderness from where its purge began. */
static void purge_round_end(purge_round_t *r)
{
    arena_t *a = r->arena;
    for (uint32_t i = 0; i < r->count; i++)
        extent_free(a, r->start[i], r->pages[i], false);
    if (r->wild_end > r->wild_from)
        wilderness_purged(a, r->wild_from);
    r->count = 0;
    r->wild_from = r->wild_end = 0;
}

/* A look at a, the lane locked on entry and on return. True if dirty
 * pages remain (seen ones, or freed meanwhile). */
static bool arena_look(lane_t *l, arena_t *a, bool force)
{
    purge_round_t r = {.arena = a, .page = ARENA_FIRST_PAGE};
    bool more;
    do {
        more = purge_round_take(&r, force);
        lane_unlock(l);
        purge_round_run(&r);
        lane_lock(l);
        purge_round_end(&r);
    } while (more);
    return a->dirty_free_pages || a->dirty_end > a->top;
}

/* The purger's pass over one lane (see arena_purge); all: every dirty
 * page goes, unmap_all: every empty arena, release: the windows'
 * wildernesses too (arena_release). Arenas leave a lane only here, under
 * its purge lock, so a->next holds across the unlocked rounds. */
static uint64_t lane_purge(lane_t *l, bool all, bool unmap_all, bool release)
{
    uint64_t now = os_now_ms(), delay = (uint64_t)hak_config.purge_delay_ms;
    pthread_mutex_lock(&l->purge_lock);
    uint64_t next_due = pools_flush(l, all, now, delay);
    lane_lock(l);
    for (arena_t *a = l->arenas, *next; a; a = next) {
        bool dirty = a->dirty_free_pages || a->dirty_end > a->top;
        if (dirty && !all && now < a->looked_ms + delay) {
            next_due = due_earlier(next_due, a->looked_ms + delay);
            next = a->next;
            continue;
        }
        if (dirty) {
            a->looked_ms = now;
            if (arena_look(l, a, all))
                next_due = due_earlier(next_due, now + delay);
        }
        next = a->next;
        if (!a->used_pages && a->dirty_end == a->top && (unmap_all || a != l->arenas))
            arena_unmap(l, a);
        else if (release)
            arena_unmap_wilderness(a);
    }
    lane_unlock(l);
    pthread_mutex_unlock(&l->purge_lock);
    return next_due;
}

/* Purge what has waited out the delay (everything with force, which also
 * unmaps every empty arena; without it an empty arena goes once purged,
 * but for its lane's first). Returns when the next look falls due, or 0
 * if nothing waits. */
static uint64_t lanes_purge(bool force, bool release)
{
    atomic_store_explicit(&arena_purge_wanted, false, memory_order_relaxed);
    uint64_t next_due = 0;
    for (unsigned i = 0; i < lane_count; i++)
        next_due = due_earlier(next_due, lane_purge(&lanes[i], force, force, release));
    return next_due;
}

uint64_t arena_purge(bool force) { return lanes_purge(force, false); }

/* A thread exits, and no new one is taking exited ones' heaps: the dirty
 * pages of its lane go back now, as its slabs' free pages do (the blocks
 * it freed last are there; a thread that comes back will fault its pages
 * in again, so not where threads come and go). */
void arena_purge_lane(unsigned lane) { lane_purge(&lanes[lane], true, false, false); }

/* A mapping was refused: every dirty page goes, and with them the address
 * space of the wildernesses and of the empty arenas, for the mapping's
 * retry (under a limit of address space, what the program freed in the
 * arenas is then the other tiers' to map). */
void arena_release(void) { lanes_purge(true, true); }

void arena_stats(size_t *arenas, size_t *used_bytes, size_t *free_bytes, size_t *dirty_bytes, size_t *pooled_bytes)
{
    size_t count = 0, used = 0, free = 0, dirty = 0, pooled = 0;
    for (unsigned i = 0; i < lane_count; i++) {
        for (unsigned bin = 0; bin < ARENA_FRONT_BINS; bin++)
            pooled += atomic_load_explicit(&lanes[i].pools[bin].count, memory_order_relaxed) * hak_arena_bin_pages[bin];
        lane_lock(&lanes[i]);
        for (arena_t *a = lanes[i].arenas; a; a = a->next) {
            count++;
            used += a->used_pages;
            free += a->free_pages;
            dirty += a->dirty_free_pages + (a->dirty_end - a->top);
        }
        lane_unlock(&lanes[i]);
    }
    *arenas = count;
    *used_bytes = used << ARENA_PAGE_SHIFT;
    *free_bytes = free << ARENA_PAGE_SHIFT;
    *dirty_bytes = dirty << ARENA_PAGE_SHIFT;
    *pooled_bytes = pooled << ARENA_PAGE_SHIFT;
}

/* fork: no lane or pool changes hands halfway, and no purge is between its
 * rounds (the child would keep extents marked purging). */
void arena_fork_prepare(void)
{
    for (unsigned i = 0; i < lane_count; i++)
        pthread_mutex_lock(&lanes[i].purge_lock);
    for (unsigned i = 0; i < lane_count; i++) {
        lane_lock(&lanes[i]);
        for (unsigned bin = 0; bin < ARENA_FRONT_BINS; bin++)
            spin_lock(&lanes[i].pools[bin].lock);
    }
}

void arena_fork_parent(void)
{
    for (unsigned i = 0; i < lane_count; i++) {
        for (unsigned bin = 0; bin < ARENA_FRONT_BINS; bin++)
            spin_unlock(&lanes[i].pools[bin].lock);
        lane_unlock(&lanes[i]);
        pthread_mutex_unlock(&lanes[i].purge_lock);
    }
}

void arena_fork_child(void) { arena_fork_parent(); }
