/* SuperSlabs: 2 MiB-aligned regions carved into slabs of 64 KiB pages, the
 * segment map that tells hakmem's pointers from foreign ones, and the
 * policy that gives free pages and empty SuperSlabs back to the OS.
 * Slab acquisition is a slow path (once per slab), so one lock guards the
 * pool. */
#include "internal.h"

#include <pthread.h>

_Atomic(uint8_t) hak_segmap[SEGMAP_ENTRIES];

slab_t hak_no_slab; /* owner 0 matches no heap; in_use 0 */

static pthread_mutex_t ss_lock = PTHREAD_MUTEX_INITIALIZER;
static superslab_t *ss_list;   /* every mapped SuperSlab */
static size_t ss_count;
static size_t ss_empty_count;  /* SuperSlabs with every data page free */
static uint64_t ss_next_purge_check_ms;

#define DATA_PAGES_MASK (~(uint32_t)0 << SS_FIRST_DATA_PAGE)

void segmap_set(void *chunk, size_t size, unsigned head_kind)
{
    size_t first = (uintptr_t)chunk >> SS_SHIFT;
    size_t chunks = (size + SS_SIZE - 1) >> SS_SHIFT;
    for (size_t i = 1; i < chunks; i++)
        atomic_store_explicit(&hak_segmap[first + i], SEG_LARGE_INTERIOR, memory_order_relaxed);
    atomic_store_explicit(&hak_segmap[first], (uint8_t)head_kind, memory_order_release);
}

void segmap_clear(void *chunk, size_t size)
{
    size_t first = (uintptr_t)chunk >> SS_SHIFT;
    size_t chunks = (size + SS_SIZE - 1) >> SS_SHIFT;
    for (size_t i = 0; i < chunks; i++)
        atomic_store_explicit(&hak_segmap[first + i], SEG_NONE, memory_order_relaxed);
}

static void list_link(superslab_t *ss)
{
    ss->prev = NULL;
    ss->next = ss_list;
    if (ss_list)
        ss_list->prev = ss;
    ss_list = ss;
}

static void list_unlink(superslab_t *ss)
{
    if (ss->prev)
        ss->prev->next = ss->next;
    else
        ss_list = ss->next;
    if (ss->next)
        ss->next->prev = ss->prev;
}

static superslab_t *superslab_map(void)
{
    superslab_t *ss = os_map_aligned(SS_SIZE, SS_SIZE);
    if (!ss)
        return NULL;
    ss->magic = SS_MAGIC;
    ss->free_pages = DATA_PAGES_MASK;
    for (unsigned i = 0; i < SS_PAGES; i++)
        ss->page_slab[i] = &hak_no_slab;
    segmap_set(ss, SS_SIZE, SEG_SUPERSLAB);
    list_link(ss);
    ss_count++;
    ss_empty_count++;
    if (hak_config.verbose)
        hak_warn("mapped a SuperSlab", NULL);
    return ss;
}

static void superslab_unmap(superslab_t *ss)
{
    list_unlink(ss);
    ss_count--;
    ss_empty_count--;
    segmap_clear(ss, SS_SIZE);
    os_unmap(ss, SS_SIZE);
    if (hak_config.verbose)
        hak_warn("unmapped an empty SuperSlab", NULL);
}

/* Purge every run of dirty free pages of ss. */
static void superslab_purge_dirty(superslab_t *ss)
{
    uint32_t dirty = ss->dirty_pages;
    while (dirty) {
        unsigned first = (unsigned)__builtin_ctz(dirty);
        unsigned last = first;
        while (last + 1 < SS_PAGES && (dirty >> (last + 1)) & 1)
            last++;
        os_purge((char *)ss + (size_t)first * SLAB_PAGE_SIZE,
                 (size_t)(last - first + 1) * SLAB_PAGE_SIZE);
        dirty &= ~(uint32_t)(((uint64_t)1 << (last + 1)) - ((uint64_t)1 << first));
    }
    ss->dirty_pages = 0;
}

/* Purge the pages that have been free for the purge delay; with force, all
 * of them, and unmap every empty SuperSlab beyond the reserve. Under ss_lock. */
static void purge_locked(bool force, uint64_t now)
{
    uint64_t delay = (uint64_t)hak_config.purge_delay_ms;
    for (superslab_t *ss = ss_list, *next; ss; ss = next) {
        next = ss->next;
        if (force && ss->free_pages == DATA_PAGES_MASK &&
            ss_empty_count > (size_t)hak_config.superslab_reserve) {
            superslab_unmap(ss);
            continue;
        }
        if (ss->dirty_pages && (force || now - ss->dirty_since_ms >= delay))
            superslab_purge_dirty(ss);
    }
    ss_next_purge_check_ms = now + (delay / 4 ? delay / 4 : 1);
}

void superslab_purge(bool force)
{
    pthread_mutex_lock(&ss_lock);
    purge_locked(force, os_now_ms());
    pthread_mutex_unlock(&ss_lock);
}

/* First data page of a run of span free pages, or 0: bit i of `starts`
 * stays set while pages i..i+k are all free. */
static unsigned find_free_run(uint32_t free_pages, unsigned span)
{
    uint64_t starts = free_pages & DATA_PAGES_MASK;
    for (unsigned k = 1; k < span && starts; k++)
        starts &= (uint64_t)free_pages >> k;
    return starts ? (unsigned)__builtin_ctzll(starts) : 0;
}

static uint32_t run_mask(unsigned first, unsigned span)
{
    return (uint32_t)((((uint64_t)1 << span) - 1) << first);
}

/* Take pages for a slab of class c. Partly used SuperSlabs are preferred so
 * that empty ones stay empty and can be unmapped. */
slab_t *superslab_slab_acquire(heap_t *heap, unsigned c)
{
    unsigned span = hak_class_span[c];
    pthread_mutex_lock(&ss_lock);
    uint64_t now = os_now_ms();
    if (now >= ss_next_purge_check_ms)
        purge_locked(false, now);
    superslab_t *ss = NULL, *empty = NULL;
    unsigned page = 0;
    for (superslab_t *it = ss_list; it; it = it->next) {
        unsigned at = find_free_run(it->free_pages, span);
        if (!at)
            continue;
        if (it->free_pages != DATA_PAGES_MASK) {
            ss = it, page = at;
            break;
        }
        if (!empty)
            empty = it, page = at;
    }
    if (!ss && !empty) {
        empty = superslab_map();
        page = SS_FIRST_DATA_PAGE;
    }
    if (!ss) {
        ss = empty;
        if (!ss) {
            pthread_mutex_unlock(&ss_lock);
            return NULL;
        }
        ss_empty_count--;
    }
    uint32_t mask = run_mask(page, span);
    ss->free_pages &= ~mask;
    ss->dirty_pages &= ~mask;
    slab_t *s = &ss->slabs[page - SS_FIRST_DATA_PAGE];
    for (unsigned i = 0; i < span; i++)
        ss->page_slab[page + i] = s;
    pthread_mutex_unlock(&ss_lock);

    s->span = (uint8_t)span;
    s->start = (char *)ss + (size_t)page * SLAB_PAGE_SIZE;
    slab_format(s, heap, c);
    return s;
}

/* (Re)format the pages of s, a slab of the calling thread, for class c. */
void slab_format(slab_t *s, heap_t *heap, unsigned c)
{
    uint32_t block_size = hak_class_size[c];
    s->free = NULL;
    s->used = 0;
    s->class_idx = (uint8_t)c;
    s->in_use = 1;
    s->block_size = block_size;
    s->recip = (((uint64_t)1 << RECIP_SHIFT) + block_size - 1) / block_size;
    s->capacity = (uint32_t)((size_t)s->span * SLAB_PAGE_SIZE / block_size);
    s->carved = 0;
    s->carved_end = s->start;
    s->next = s->prev = NULL;
    atomic_store_explicit(&s->remote, NULL, memory_order_relaxed);
    atomic_store_explicit(&s->owner, (uintptr_t)heap, memory_order_release);
}

/* Give an empty slab's pages back to its SuperSlab. The pages stay
 * resident until the purge delay passes, so a slab freed and soon taken
 * again costs no page faults. */
void superslab_slab_release(slab_t *s)
{
    superslab_t *ss = superslab_of(s);
    unsigned page = slab_head_page(s);
    uint32_t mask = run_mask(page, s->span);
    hak_assert(s->used == 0 && atomic_load(&s->remote) == NULL);
    pthread_mutex_lock(&ss_lock);
    atomic_store_explicit(&s->owner, 0, memory_order_relaxed);
    s->in_use = 0;
    for (unsigned i = 0; i < s->span; i++)
        ss->page_slab[page + i] = &hak_no_slab;
    if (!ss->dirty_pages)
        ss->dirty_since_ms = os_now_ms();
    if (s->carved)
        ss->dirty_pages |= mask;
    ss->free_pages |= mask;
    if (hak_config.purge_delay_ms == 0)
        superslab_purge_dirty(ss);
    if (ss->free_pages == DATA_PAGES_MASK) {
        ss_empty_count++;
        if (ss_empty_count > (size_t)hak_config.superslab_reserve)
            superslab_unmap(ss);
    }
    pthread_mutex_unlock(&ss_lock);
}

void superslab_stats(size_t *superslabs, size_t *empty, size_t slabs[2], size_t bytes[2])
{
    pthread_mutex_lock(&ss_lock);
    *superslabs = ss_count;
    *empty = ss_empty_count;
    for (superslab_t *ss = ss_list; ss; ss = ss->next)
        for (unsigned i = 0; i < SS_MAX_SPAN; i++) {
            slab_t *s = &ss->slabs[i];
            if (!s->in_use)
                continue;
            unsigned tier = class_is_tiny(s->class_idx) ? 0 : 1;
            slabs[tier]++;
            bytes[tier] += (size_t)s->used * s->block_size;
        }
    pthread_mutex_unlock(&ss_lock);
}

void superslab_fork_prepare(void) { pthread_mutex_lock(&ss_lock); }
void superslab_fork_parent(void) { pthread_mutex_unlock(&ss_lock); }
void superslab_fork_child(void) { pthread_mutex_unlock(&ss_lock); }
