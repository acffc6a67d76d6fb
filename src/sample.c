/* Sampled allocations. Each thread counts its slab-sized allocations down
 * from a random interval (mean HAKMEM_PROFILE_SAMPLE); the allocation that
 * reaches zero is timed for the latency KPIs, charged to its call site
 * with the weight of the interval (the allocations it stands for), and
 * served from a place whose free is
 * seen without any check on the free fast path:
 *
 *  - tiny sizes from the sample arena: 2 MiB chunks of 1 KiB slots marked
 *    SEG_SAMPLED in the segment map, so that free takes its slow path;
 *    each slot records its site, size and birth (for lifetimes);
 *  - larger sizes from the large tier, whose header records the same.
 *
 * The block the thread's cache had ready goes back to the cache. */
#include "alloc.h"
#include "hakmem.h"

#include <limits.h>
#include <pthread.h>

#define ARENA_SLOT_SIZE TINY_MAX
#define ARENA_SLOTS (SS_SIZE / ARENA_SLOT_SIZE)
#define ARENA_HEADER_BYTES ((size_t)64 << 10)
#define ARENA_FIRST_SLOT (ARENA_HEADER_BYTES / ARENA_SLOT_SIZE)
#define ARENA_MAGIC 0x48414b50u /* "HAKP" */

typedef struct arena_slot {
    uint64_t born;   /* hak_ticks() at allocation */
    uint32_t size;   /* asked for (0 is a size too) */
    uint32_t weight; /* allocations the sample stands for (at least 1); 0 while the slot is free */
    uint32_t site;   /* site table index */
    uint32_t next;   /* next free slot, 0 for none */
} arena_slot_t;

typedef struct arena_chunk {
    uint32_t magic;
    uint32_t free_head; /* a free slot, 0 for none */
    uint32_t carved;    /* slots below were handed out at least once */
    uint32_t live;
    struct arena_chunk *next;
    arena_slot_t slot[ARENA_SLOTS];
} arena_chunk_t;

_Static_assert(sizeof(arena_chunk_t) <= ARENA_HEADER_BYTES, "sample arena header overflows its slots");

static pthread_mutex_t arena_lock = PTHREAD_MUTEX_INITIALIZER;
static arena_chunk_t *arena_chunks;

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

static char *slot_address(arena_chunk_t *a, uint32_t i) { return (char *)a + (size_t)i * ARENA_SLOT_SIZE; }

static void *arena_alloc(size_t size, uint32_t weight, unsigned site, uint64_t born)
{
    pthread_mutex_lock(&arena_lock);
    arena_chunk_t *a = arena_chunks;
    while (a && !a->free_head && a->carved == ARENA_SLOTS)
        a = a->next;
    if (!a) {
        a = os_map_aligned(SS_SIZE, SS_SIZE);
        if (!a) {
            pthread_mutex_unlock(&arena_lock);
            return NULL;
        }
        a->magic = ARENA_MAGIC;
        a->carved = ARENA_FIRST_SLOT;
        a->next = arena_chunks;
        arena_chunks = a;
        segmap_set(a, SS_SIZE, SEG_SAMPLED);
    }
    uint32_t i = a->free_head;
    if (i)
        a->free_head = a->slot[i].next;
    else
        i = a->carved++;
    a->slot[i] = (arena_slot_t){.born = born, .size = (uint32_t)size, .weight = weight, .site = site};
    a->live++;
    pthread_mutex_unlock(&arena_lock);
    return slot_address(a, i);
}

/* The slot p starts, or NULL with *fault saying why (under arena_lock). */
static arena_slot_t *slot_checked(const void *p, const char **fault)
{
    arena_chunk_t *a = (arena_chunk_t *)superslab_of(p);
    uintptr_t off = (uintptr_t)p - (uintptr_t)a;
    uint32_t i = (uint32_t)(off / ARENA_SLOT_SIZE);
    if (a->magic != ARENA_MAGIC || i < ARENA_FIRST_SLOT || i >= a->carved) {
        *fault = "pointer into hakmem's sample arena that was never handed out";
        return NULL;
    }
    if (off % ARENA_SLOT_SIZE) {
        *fault = "interior pointer: not the start of a block";
        return NULL;
    }
    if (!a->slot[i].weight) {
        *fault = "double free";
        return NULL;
    }
    return &a->slot[i];
}

void sample_free(void *p, const char *op)
{
    const char *fault = NULL;
    pthread_mutex_lock(&arena_lock);
    arena_slot_t *s = slot_checked(p, &fault);
    arena_slot_t was;
    if (s) {
        arena_chunk_t *a = (arena_chunk_t *)superslab_of(p);
        was = *s;
        s->weight = 0;
        s->next = a->free_head;
        a->free_head = (uint32_t)(s - a->slot);
        a->live--;
    }
    pthread_mutex_unlock(&arena_lock);
    if (!s) {
        hak_report_bad_pointer(op, p, fault);
        return;
    }
    site_record_free(was.site, was.size, was.weight, hak_ticks() - was.born);
}

/* The usable size a slab block of the same request would have. */
size_t sample_usable_size(const void *p, const char *op)
{
    const char *fault = NULL;
    pthread_mutex_lock(&arena_lock);
    arena_slot_t *s = slot_checked(p, &fault);
    size_t size = s ? s->size : 0;
    pthread_mutex_unlock(&arena_lock);
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
    uintptr_t start = (uintptr_t)p & ~(uintptr_t)(ARENA_SLOT_SIZE - 1);
    pthread_mutex_lock(&arena_lock);
    arena_slot_t *s = slot_checked((const void *)start, &fault);
    bool live = s && (uintptr_t)p - start < hak_class_size[class_of(s->size)];
    pthread_mutex_unlock(&arena_lock);
    return live;
}

/* Chunks with no live slot go back to the OS (hak_collect). */
void sample_collect(void)
{
    pthread_mutex_lock(&arena_lock);
    for (arena_chunk_t **link = &arena_chunks; *link;) {
        arena_chunk_t *a = *link;
        if (a->live) {
            link = &a->next;
            continue;
        }
        *link = a->next;
        segmap_clear(a, SS_SIZE);
        os_unmap(a, SS_SIZE);
    }
    pthread_mutex_unlock(&arena_lock);
}

void sample_fork_prepare(void) { pthread_mutex_lock(&arena_lock); }
void sample_fork_parent(void) { pthread_mutex_unlock(&arena_lock); }
void sample_fork_child(void) { pthread_mutex_unlock(&arena_lock); }

/* ---- the sampled allocation ------------------------------------------------- */

/* The alignment a slab block of class c has by construction (blocks of a
 * size divisible by a power of two up to a page are aligned to it). */
static size_t class_alignment(unsigned c)
{
    size_t size = hak_class_size[c], align = size & -size;
    return align > SLAB_PAGE_SIZE ? SLAB_PAGE_SIZE : align;
}

/* b: the block the allocation took from the cache (of cur[c]); ticks: what
 * taking it cost. Site 0 asks for no tracking (aligned requests that will
 * be offset inside the block). */
void *sample_take(heap_t *heap, unsigned c, void *b, size_t size, uintptr_t site, uint64_t ticks)
{
    uint32_t weight = (uint32_t)(heap->sample_interval - heap->sample_left); /* allocations it stands for */
    heap->sampled_allocs += weight;
    heap->sample_left = heap->sample_interval = next_interval(heap);
    if (!hak_config.profile)
        return b;
    kpi_record_latency(ticks, weight);
    learn_tick();
    if (!site)
        return b;
    void *tracked;
    if (class_is_tiny(c)) {
        tracked = arena_alloc(size, weight, site_index_of(site), hak_ticks());
        site_record_alloc(site, size, weight, tracked != NULL);
    } else { /* the large tier records the site itself */
        tracked = large_alloc(size, class_alignment(c), site, weight);
        if (!tracked)
            site_record_alloc(site, size, weight, false);
    }
    if (!tracked)
        return b;
    block_link(b, heap->cache[c]);
    heap->cache[c] = b;
    return tracked;
}

/* A sample taken on the fast path: the pop is repeated under the clock. */
void *sample_fast_hit(heap_t *heap, unsigned c, void *b, size_t size, uintptr_t site)
{
    uint64_t start = hak_ticks();
    block_link(b, heap->cache[c]);
    heap->cache[c] = b;
    __asm__ volatile("" ::: "memory");
    b = heap->cache[c];
    heap->cache[c] = block_next(b);
    block_handed_out(b);
    return sample_take(heap, c, b, size, site, hak_ticks() - start);
}
