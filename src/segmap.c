/* The segment map: one byte per 2 MiB chunk of the address space, telling
 * hakmem's chunks, and their kind, from foreign ones. Two levels: a table
 * of 1,024 words in .data (2,048 on aarch64's 48 bits), one per 128 GiB of
 * address space, pointing to a leaf of 64 KiB, a byte per chunk, mapped
 * the first time a mapping of hakmem's lands in its 128 GiB. A flat map
 * would spare a malloc/free pair three instructions (the leaf's load, a
 * copy and a shift: bench_pair lifo 74.85 -> 71.85) but takes 64 MiB of
 * address space (128 on aarch64) in .bss: the
 * loader refuses to preload a library that large under `ulimit -v 60000`,
 * and under a higher limit those 64 MiB were a third of what a program
 * could allocate.
 *
 * Every word of the table is biased by its leaf's first chunk, so that the
 * chunk number indexes it without a mask: the fast path reads
 * hak_segmap[p >> 37] + (p >> 21). The table is initialised statically to
 * one shared leaf of zeros in .bss (SEG_NONE everywhere, never written),
 * so that a free before init, or of a pointer in a region hakmem never
 * mapped, reads SEG_NONE without a test. Leaves are never given back: a
 * program's mappings fall in a few 128 GiB regions, so a process has a few
 * leaves, of which it touches a page or two. */
#define _GNU_SOURCE
#include "layout.h"
#include "error.h"
#include "os.h"

#include <errno.h>
#include <pthread.h>

#define LEAF_BYTES SEGMAP_LEAF_ENTRIES

static _Alignas(4096) uint8_t zero_leaf[LEAF_BYTES];

#define ZERO(i) ((uintptr_t)zero_leaf - ((uintptr_t)(i) << SEGMAP_LEAF_SHIFT))
#define ZERO4(i) ZERO(i), ZERO((i) + 1), ZERO((i) + 2), ZERO((i) + 3)
#define ZERO16(i) ZERO4(i), ZERO4((i) + 4), ZERO4((i) + 8), ZERO4((i) + 12)
#define ZERO64(i) ZERO16(i), ZERO16((i) + 16), ZERO16((i) + 32), ZERO16((i) + 48)
#define ZERO256(i) ZERO64(i), ZERO64((i) + 64), ZERO64((i) + 128), ZERO64((i) + 192)
#define ZERO1024(i) ZERO256(i), ZERO256((i) + 256), ZERO256((i) + 512), ZERO256((i) + 768)

#if ADDRESS_BITS == 47
_Static_assert(SEGMAP_LEAVES == 1024, "the initialiser covers the table");
_Atomic uintptr_t hak_segmap[SEGMAP_LEAVES] = {ZERO1024(0)};
#elif ADDRESS_BITS == 48
_Static_assert(SEGMAP_LEAVES == 2048, "the initialiser covers the table");
_Atomic uintptr_t hak_segmap[SEGMAP_LEAVES] = {ZERO1024(0), ZERO1024(1024)};
#else
#error "a segment map initialiser for this address width"
#endif

static pthread_mutex_t leaf_lock = PTHREAD_MUTEX_INITIALIZER;

static bool leaf_mapped(size_t leaf)
{
    return atomic_load_explicit(&hak_segmap[leaf], memory_order_acquire) != ZERO(leaf);
}

bool segmap_cover(const void *start, size_t size)
{
    size_t first = (uintptr_t)start >> SS_SHIFT, last = ((uintptr_t)start + size - 1) >> SS_SHIFT;
    if (last >> SEGMAP_LEAF_SHIFT >= SEGMAP_LEAVES)
        hak_fatal("the kernel mapped memory above the address space its segment map covers");
    for (size_t leaf = first >> SEGMAP_LEAF_SHIFT; leaf <= last >> SEGMAP_LEAF_SHIFT; leaf++) {
        if (leaf_mapped(leaf))
            continue;
        pthread_mutex_lock(&leaf_lock);
        bool mapped = leaf_mapped(leaf);
        if (!mapped) {
            uint8_t *bytes = os_map(LEAF_BYTES);
            if (bytes) {
                atomic_store_explicit(&hak_segmap[leaf], (uintptr_t)bytes - (leaf << SEGMAP_LEAF_SHIFT),
                                      memory_order_release);
                mapped = true;
            }
        }
        pthread_mutex_unlock(&leaf_lock);
        if (!mapped)
            return false; /* errno ENOMEM from os_map */
    }
    return true;
}

/* The entry of chunk number `chunk`, in a leaf segmap_cover mapped. */
static _Atomic(uint8_t) *entry(size_t chunk)
{
    size_t leaf = chunk >> SEGMAP_LEAF_SHIFT;
    if (leaf >= SEGMAP_LEAVES || !leaf_mapped(leaf))
        hak_fatal("wrote its segment map where no leaf was mapped");
    return (_Atomic(uint8_t) *)(atomic_load_explicit(&hak_segmap[leaf], memory_order_relaxed) + chunk);
}

void segmap_set(void *chunk, size_t size, unsigned head_kind)
{
    size_t first = (uintptr_t)chunk >> SS_SHIFT;
    size_t chunks = (size + SS_SIZE - 1) >> SS_SHIFT;
    for (size_t i = 1; i < chunks; i++)
        atomic_store_explicit(entry(first + i), SEG_LARGE_INTERIOR, memory_order_relaxed);
    atomic_store_explicit(entry(first), (uint8_t)head_kind, memory_order_release);
}

void segmap_set_all(void *chunk, size_t size, unsigned kind)
{
    size_t first = (uintptr_t)chunk >> SS_SHIFT;
    for (size_t i = 0; i < size >> SS_SHIFT; i++)
        atomic_store_explicit(entry(first + i), (uint8_t)kind, memory_order_release);
}

void segmap_clear(void *chunk, size_t size)
{
    size_t first = (uintptr_t)chunk >> SS_SHIFT;
    size_t chunks = (size + SS_SIZE - 1) >> SS_SHIFT;
    for (size_t i = 0; i < chunks; i++)
        atomic_store_explicit(entry(first + i), SEG_NONE, memory_order_relaxed);
}
