/* Layer 5, SuperSlabs (superslab.c): the 2 MiB regions a heap carves
 * slabs from, the pool of empty ones, their pages' purges. */
#ifndef HAKMEM_SUPERSLAB_H
#define HAKMEM_SUPERSLAB_H

#include "layout.h"

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
void *superslab_take_remote(slab_t **slabs, unsigned n, unsigned c);

#endif
