/* Test programs written against the standard names, built where hakmem
 * leaves those names alone (HAKMEM_OVERRIDE=OFF: the ThreadSanitizer build,
 * where TSan owns malloc): the names reach hakmem through its own entry
 * points, so that TSan sees hakmem's code and atomics. */
#ifndef HAKMEM_TEST_HAK_NAMES_H
#define HAKMEM_TEST_HAK_NAMES_H

#include "hakmem.h"

#include <malloc.h>
#include <stdlib.h>

#define malloc hak_malloc
#define calloc hak_calloc
#define realloc hak_realloc
#define aligned_alloc hak_aligned_alloc
#define free hak_free
#define malloc_usable_size hak_usable_size
#define malloc_trim(pad) ((void)(pad), hak_collect(true), 1)

#endif
