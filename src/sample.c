/* Sampled allocations. Each thread counts its allocations up to the large
 * threshold down from a random interval (mean HAKMEM_PROFILE_SAMPLE); the
 * allocation that reaches zero is timed for the latency KPIs, charged to
 * its call site with the weight of the interval (the allocations it stands
 * for), and served from a place whose free is seen without any check on
 * the free fast path:
 *
 *  - tiny sizes from the sample arena: 2 MiB chunks marked SEG_SAMPLED in
 *    the segment map, so that free takes its slow path, each of slots of
 *    one size, 64, 256 or 1024 bytes: a sample takes the smallest that
 *    holds its class (with 1 KiB slots for all, the samples of a million
 *    16 B blocks added 1.6% to their RSS); each slot records its site,
 *    size and birth (for lifetimes);
 *  - larger sizes, up to the large threshold, from the page arenas: the
 *    block's head entry in its arena's map is flagged (the thread fronts
 *    never take it) and points to the sample's record in a table here.
 *    Served by the large tier, as they were, each sample cost a mapping's
 *    faults and an munmap (bench mid at two threads: 158 M ops/s against
 *    250 without profiling, measured at 3f67a08).
 *
 * The block a slab-sized allocation took goes back to the cache. */
#include "profile.h"
#include "hakmem.h"

#include <limits.h>
#include <pthread.h>
#include <string.h>

#define ARENA_MIN_SLOT_SHIFT 6 /* slots of 1 << 6, 8 or 10 bytes */
#define ARENA_SLOT_KINDS 3
#define ARENA_MAGIC 0x48414b50u /* "HAKP" */

_Static_assert(TINY_MAX == 1 << (ARENA_MIN_SLOT_SHIFT + 2 * (ARENA_SLOT_KINDS - 1)), "the largest slot holds a tiny block");

/* A sample's record: a slot's in the sample arena, or a page-arena
 * block's in the record table. */
typedef struct sample_record {
    uint64_t born;   /* hak_ticks() at allocation */
    uint32_t size;   /* asked for (0 is a size too) */
    uint32_t weight; /* allocations the sample stands for (at least 1); 0 while free */
    uint32_t site;   /* site table index */
    uint32_t next;   /* next free one, 0 for none */
} sample_record_t;

/* The header takes the first slots. Descriptors are for the slots after
 * those, from the first (slot[i - first_slot]), so that a chunk with a few
 * samples touches the header's first page only (the array's pages are
 * touched as slots are handed out, in order). */
typedef struct arena_chunk {
    uint32_t magic;
    uint32_t slot_shift;
    uint32_t first_slot; /* the ones below hold the header */
    uint32_t free_head;  /* a free slot, 0 for none */
    uint32_t carved;     /* slots below were handed out at least once (the header's included) */
    uint32_t live;
    struct arena_chunk *next;
    sample_record_t slot[]; /* (SS_SIZE >> slot_shift) - first_slot */
} arena_chunk_t;

static pthread_mutex_t sample_lock = PTHREAD_MUTEX_INITIALIZER; /* the sample arena's and the record table's */
static arena_chunk_t *arena_chunks[ARENA_SLOT_KINDS]; /* by slot size */

/* ---- sampling intervals ---------------------------------------------------- */

static long next_interval(heap_t *heap)
{
    if (!hak_config.profile)
        return LONG_MAX;
    long mean = hak_config.profile_sample;
    return mean / 2 + 1 + (long)(xorshift64(&heap->sample_rng) % (uint64_t)mean);
}

/* A heap taken by a thread (new, or one an exited thread left). */
void sample_heap_init(heap_t *heap)
{
    heap->sampled_allocs += (uint64_t)(heap->sample_interval - heap->sample_left);
    if (!heap->sample_rng)
        heap->sample_rng = (((uint64_t)(uintptr_t)heap * 0x9e3779b97f4a7c15ull) ^ (uint64_t)hak_config.tune_seed) | 1;
    heap->sample_left = heap->sample_interval = next_interval(heap);
}

/* ---- the arena ---------------------------------------------------------------- */

static char *slot_address(arena_chunk_t *a, uint32_t i) { return (char *)a + ((size_t)i << a->slot_shift); }

static uint32_t arena_slots(const arena_chunk_t *a) { return (uint32_t)(SS_SIZE >> a->slot_shift); }

static sample_record_t *slot_of(arena_chunk_t *a, uint32_t i) { return &a->slot[i - a->first_slot]; }

/* The smallest slot kind whose slots hold a block of class c (a power of
 * two at least as large: aligned as the block would be, which an aligned
 * request of fewer bytes relies on). */
static unsigned slot_kind_of(unsigned c)
{
    uint32_t block = hak_class_size[c];
    unsigned kind = 0;
    while ((uint32_t)1 << (ARENA_MIN_SLOT_SHIFT + 2 * kind) < block)
        kind++;
    return kind;
}

static arena_chunk_t *arena_chunk_new(unsigned kind)
{
    arena_chunk_t *a = os_map_aligned(SS_SIZE, SS_SIZE);
    if (!a)
        return NULL;
    os_advise_small_pages(a, SS_SIZE); /* a few samples: never a whole huge page (superslab.c) */
    a->magic = ARENA_MAGIC;
    a->slot_shift = ARENA_MIN_SLOT_SHIFT + 2 * kind;
    size_t header = sizeof(arena_chunk_t) + arena_slots(a) * sizeof(sample_record_t);
    a->first_slot = a->carved = (uint32_t)((header + ((size_t)1 << a->slot_shift) - 1) >> a->slot_shift);
    a->next = arena_chunks[kind];
    arena_chunks[kind] = a;
    segmap_set(a, SS_SIZE, SEG_SAMPLED);
    return a;
}

static void *slot_alloc(unsigned c, size_t size, uint32_t weight, unsigned site, uint64_t born)
{
    unsigned kind = slot_kind_of(c);
    pthread_mutex_lock(&sample_lock);
    arena_chunk_t *a = arena_chunks[kind];
    while (a && !a->free_head && a->carved == arena_slots(a))
        a = a->next;
    if (!a && !(a = arena_chunk_new(kind))) {
        pthread_mutex_unlock(&sample_lock);
        return NULL;
    }
    uint32_t i = a->free_head;
    if (i)
        a->free_head = slot_of(a, i)->next;
    else
        i = a->carved++;
    *slot_of(a, i) = (sample_record_t){.born = born, .size = (uint32_t)size, .weight = weight, .site = site};
    a->live++;
    pthread_mutex_unlock(&sample_lock);
    return slot_address(a, i);
}

/* The slot p starts, or NULL with *fault saying why (under sample_lock).
 * The caller saw p's chunk in the segment map before taking the lock; a
 * collect on another thread may have unmapped it since (only a stale
 * pointer's chunk can have no live slot), and its header must not be
 * read then. */
static sample_record_t *slot_checked(const void *p, const char **fault)
{
    if (segmap_kind(p) != SEG_SAMPLED) {
        *fault = "pointer not allocated by hakmem (foreign, stack or global memory, or already freed)";
        return NULL;
    }
    arena_chunk_t *a = (arena_chunk_t *)superslab_of(p);
    uintptr_t off = (uintptr_t)p - (uintptr_t)a;
    uint32_t i = (uint32_t)(off >> a->slot_shift);
    if (a->magic != ARENA_MAGIC || i < a->first_slot || i >= a->carved) {
        *fault = "pointer into hakmem's sample arena that was never handed out";
        return NULL;
    }
    if (off & (((uintptr_t)1 << a->slot_shift) - 1)) {
        *fault = "interior pointer: not the start of a block";
        return NULL;
    }
    if (!slot_of(a, i)->weight) {
        *fault = "double free";
        return NULL;
    }
    return slot_of(a, i);
}

void sample_free(void *p, const char *op)
{
    const char *fault = NULL;
    pthread_mutex_lock(&sample_lock);
    sample_record_t *s = slot_checked(p, &fault);
    sample_record_t was;
    if (s) {
        arena_chunk_t *a = (arena_chunk_t *)superslab_of(p);
        was = *s;
        s->weight = 0;
        s->next = a->free_head;
        a->free_head = (uint32_t)(s - a->slot) + a->first_slot;
        a->live--;
    }
    pthread_mutex_unlock(&sample_lock);
    if (!s) {
        hak_report_bad_pointer(op, p, fault);
        return;
    }
    site_record_free(was.site, was.size, was.weight, was.born);
}

/* The usable size a slab block of the same request would have. */
size_t sample_usable_size(const void *p, const char *op)
{
    const char *fault = NULL;
    pthread_mutex_lock(&sample_lock);
    sample_record_t *s = slot_checked(p, &fault);
    size_t size = s ? s->size : 0;
    pthread_mutex_unlock(&sample_lock);
    if (!s) {
        hak_report_bad_pointer(op, p, fault);
        return 0;
    }
    return hak_class_size[class_of(size)];
}

/* p inside a live slot's block (interior pointers included). */
bool sample_owns(const void *p)
{
    const char *fault;
    pthread_mutex_lock(&sample_lock);
    if (segmap_kind(p) != SEG_SAMPLED) { /* unmapped since the caller looked (slot_checked) */
        pthread_mutex_unlock(&sample_lock);
        return false;
    }
    const arena_chunk_t *a = (const arena_chunk_t *)superslab_of(p);
    uintptr_t start = (uintptr_t)p & ~(((uintptr_t)1 << a->slot_shift) - 1);
    sample_record_t *s = slot_checked((const void *)start, &fault);
    bool live = s && (uintptr_t)p - start < hak_class_size[class_of(s->size)];
    pthread_mutex_unlock(&sample_lock);
    return live;
}

/* ---- the records of samples in the page arenas -------------------------------- */

/* Indexed from 1 (0 in a head entry would be no record), handed out from
 * a free list, then from the end; the table doubles when full (a new
 * mapping: every reader holds the lock) and goes back to the OS when no
 * record is live (sample_collect). */
#define RECORDS_FIRST_CAPACITY 4096 /* 96 KiB */
#define RECORDS_MAX_CAPACITY ((uint32_t)1 << 24)
static sample_record_t *records;
static uint32_t records_capacity, records_carved = 1, records_free, records_live;

static bool records_grow(void)
{
    uint32_t capacity = records_capacity ? records_capacity * 2 : RECORDS_FIRST_CAPACITY;
    if (capacity > RECORDS_MAX_CAPACITY)
        return false;
    sample_record_t *table = os_map((size_t)capacity * sizeof *table);
    if (!table)
        return false;
    if (records) {
        memcpy(table, records, (size_t)records_carved * sizeof *table);
        os_unmap(records, (size_t)records_capacity * sizeof *table);
    }
    records = table;
    records_capacity = capacity;
    return true;
}

/* A new record's index, or 0 if the table cannot grow. */
static uint32_t record_new(unsigned site, size_t size, uint32_t weight, uint64_t born)
{
    pthread_mutex_lock(&sample_lock);
    uint32_t i = records_free;
    if (i)
        records_free = records[i].next;
    else if (records_carved < records_capacity || records_grow())
        i = records_carved++;
    if (i) {
        records[i] = (sample_record_t){.born = born, .size = (uint32_t)size, .weight = weight, .site = site};
        records_live++;
    }
    pthread_mutex_unlock(&sample_lock);
    return i;
}

/* The sample whose record this is was freed (arena_free). */
void sample_arena_freed(uint32_t record)
{
    pthread_mutex_lock(&sample_lock);
    sample_record_t was = records[record];
    records[record] = (sample_record_t){.next = records_free};
    records_free = record;
    records_live--;
    pthread_mutex_unlock(&sample_lock);
    site_record_free(was.site, was.size, was.weight, was.born);
}

/* The sample whose record this is holds `size` bytes now (arena_realloc_in_place). */
void sample_arena_resized(uint32_t record, size_t size)
{
    pthread_mutex_lock(&sample_lock);
    sample_record_t was = records[record];
    records[record].size = (uint32_t)size;
    pthread_mutex_unlock(&sample_lock);
    site_record_resize(was.site, was.size, size, was.weight);
}

/* p (NULL where the arenas had no block) becomes a sample, charged to
 * site: its record is filled and its index put in the block's head entry.
 * False if it could not be (the record table full). */
static bool sample_in_arena(void *p, size_t size, uintptr_t site, uint32_t weight)
{
    uint32_t record = p ? record_new(site_index_of(site), size, weight, hak_ticks()) : 0;
    site_record_alloc(site, size, weight, record != 0);
    if (record)
        arena_mark_sampled(p, record);
    return record != 0;
}

/* Chunks with no live slot go back to the OS, and the record table if no
 * record is live (hak_collect). */
void sample_collect(void)
{
    pthread_mutex_lock(&sample_lock);
    if (records && !records_live) {
        os_unmap(records, (size_t)records_capacity * sizeof *records);
        records = NULL;
        records_capacity = records_free = 0;
        records_carved = 1;
    }
    for (unsigned kind = 0; kind < ARENA_SLOT_KINDS; kind++)
        for (arena_chunk_t **link = &arena_chunks[kind]; *link;) {
            arena_chunk_t *a = *link;
            if (a->live) {
                link = &a->next;
                continue;
            }
            *link = a->next;
            segmap_clear(a, SS_SIZE);
            os_unmap(a, SS_SIZE);
        }
    pthread_mutex_unlock(&sample_lock);
}

void sample_fork_prepare(void) { pthread_mutex_lock(&sample_lock); }
void sample_fork_parent(void) { pthread_mutex_unlock(&sample_lock); }
void sample_fork_child(void) { pthread_mutex_unlock(&sample_lock); }

/* ---- the sampled allocation ------------------------------------------------- */

/* The alignment a slab block of class c has by construction (blocks of a
 * size divisible by a power of two up to a page are aligned to it). */
static size_t class_alignment(unsigned c)
{
    size_t size = hak_class_size[c], align = size & -size;
    return align > SLAB_PAGE_SIZE ? SLAB_PAGE_SIZE : align;
}

/* The sampling interval ends: the allocations the sample stands for (at
 * least 1, since the countdown reached 0). */
uint32_t sample_interval_end(heap_t *heap)
{
    uint32_t weight = (uint32_t)(heap->sample_interval - heap->sample_left);
    heap->sampled_allocs += weight;
    heap->sample_left = heap->sample_interval = next_interval(heap);
    return weight;
}

/* b: the block the allocation took from the cache (of cur[c]); weight:
 * what sample_interval_end returned when the countdown reached 0; ticks:
 * what taking it cost. Site 0 asks for no tracking (aligned requests that
 * will be offset inside the block). */
void *sample_take(heap_t *heap, unsigned c, void *b, size_t size, uintptr_t site, uint32_t weight, uint64_t ticks)
{
    hak_assert(weight > 0); /* 0 marks a free record */
    if (!hak_config.profile)
        return b;
    kpi_record_latency(ticks, weight);
    learn_tick();
    if (!site)
        return b;
    void *tracked;
    if (class_is_tiny(c)) {
        tracked = slot_alloc(c, size, weight, site_index_of(site), hak_ticks());
        site_record_alloc(site, size, weight, tracked != NULL);
    } else {
        tracked = arena_alloc(size, class_alignment(c), heap->arena_lane, false);
        if (!sample_in_arena(tracked, size, site, weight) && tracked) {
            arena_free(tracked, "sample");
            tracked = NULL;
        }
    }
    if (!tracked)
        return b;
    if (!class_is_tiny(c) && slab_of(superslab_of(b), b) != heap->cur[c]) { /* b goes back where it came from */
        heap_stash_push(heap, c, b);
    } else {
        block_link(b, heap->cache[c]);
        heap->cache[c] = b;
    }
    return tracked;
}

/* A sample taken on the fast path: the pop is repeated under the clock.
 * In the hardened build, a corrupt link that the pop met stops the program
 * here, as the refill would: linking b again would mend it unreported
 * (test_secure's cached link, once in a hundred runs or so). */
void *sample_fast_hit(heap_t *heap, unsigned c, void *b, size_t size, uintptr_t site)
{
    if (HAK_SECURE && unlikely(heap->corrupt_link))
        hak_free_list_corrupt(heap->corrupt_link);
    uint32_t weight = sample_interval_end(heap);
    uint64_t start = hak_ticks();
    block_link(b, heap->cache[c]);
    heap->cache[c] = b;
    __asm__ volatile("" ::: "memory");
    b = heap->cache[c];
    heap->cache[c] = block_next(b);
    block_handed_out(b);
    return sample_take(heap, c, b, size, site, weight, hak_ticks() - start);
}

/* A sample among the page arenas' sizes: the arena allocation (from the
 * thread's front first, as any other) is timed, and its block is the
 * sample. */
void *sample_take_arena(heap_t *heap, size_t size, size_t align, uintptr_t site, bool zero)
{
    uint32_t weight = sample_interval_end(heap);
    uint64_t start = hak_ticks();
    void *p = align ? NULL : arena_front_take(heap, size);
    if (p && zero)
        memset(p, 0, size);
    else if (!p)
        p = arena_alloc(size, align, heap->arena_lane, zero);
    uint64_t ticks = hak_ticks() - start;
    if (!hak_config.profile || !p)
        return p;
    kpi_record_latency(ticks, weight);
    learn_tick();
    if (site)
        sample_in_arena(p, size, site, weight);
    return p;
}
