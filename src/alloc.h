/* The allocation and free fast paths, inlined into the exported entry
 * points (override.c). Everything not on the common path is out of line. */
#ifndef HAKMEM_ALLOC_H
#define HAKMEM_ALLOC_H

#include "internal.h"

/* Pop a block of class c from the calling thread's current slab. */
static inline void *hak_alloc_class(unsigned c)
{
    heap_t *heap = heap_get();
    slab_t *s = heap->cur[c];
    void *b = s->free;
    if (likely(b != NULL)) {
        s->free = *(void **)b;
        s->used++;
        return b;
    }
    return heap_alloc_slow(heap, c);
}

static inline void *hak_alloc(size_t size)
{
    if (likely(size <= TINY_MAX))
        return hak_alloc_class(hak_tiny_class_of[(size + 7) >> 3]);
    return hak_alloc_slow_size(size);
}

/* Free: mask to the SuperSlab, index the slab, and if the caller owns it
 * push the block onto the slab's free list. Anything unusual (another
 * thread's slab, a flagged slab, a pointer that is not a block start, an
 * immediate double free) goes to hak_free_irregular, which also reports. */
static inline void hak_free(void *p, const char *op)
{
    if (unlikely(segmap_kind(p) != SEG_SUPERSLAB)) {
        hak_free_slow(p, op);
        return;
    }
    slab_t *s = slab_of(superslab_of(p), p);
    heap_t *heap = heap_get();
    if (likely(s && atomic_load_explicit(&s->heap, memory_order_relaxed) == heap && s->flags == 0)) {
        uint32_t index = slab_block_index(s, p);
        if (likely((char *)p == s->start + (size_t)index * s->block_size && index < s->carved &&
                   p != s->free && s->used != 0)) {
            *(void **)p = s->free;
            s->free = p;
            if (unlikely(--s->used == 0))
                heap_slab_emptied(heap, s);
            return;
        }
    }
    hak_free_irregular(s, p, op);
}

#endif
