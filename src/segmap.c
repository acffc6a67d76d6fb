/* The segment map: one byte per 2 MiB chunk of the address space, telling
 * hakmem's chunks, and their kind, from foreign ones. It is a flat array
 * in .bss, so that the free fast path indexes it without loading a base
 * pointer, before init as after, and its 64 MiB (x86-64) cost no memory
 * while untouched. As writable .bss they cost in two other ways: the
 * kernel charges them to the system's commit (143 MiB a process under
 * hakmem with the 128 MiB map of 48 bits, 8 under glibc: a system with
 * strict overcommit runs out soon), and a program that locks its memory
 * (mlockall(MCL_CURRENT), as chronyd, cryptsetup and real-time audio
 * servers do) has the kernel fault in every writable page: 134 MiB of
 * locked RSS, glibc's whole process 2.4. So at init the map is mapped
 * anew in place, read-only and uncharged (locking maps the kernel's shared
 * zero page there, which costs no memory), and a granule of it is made
 * writable before its first entry is written: a granule covers 128 GiB of
 * address space, so a program writes one or a few. */
#define _GNU_SOURCE
#include "layout.h"
#include "error.h"
#include "os.h"

#include <pthread.h>

#define GRANULE ((size_t)64 << 10) /* a multiple of every page size Linux uses */
#define GRANULES (SEGMAP_ENTRIES / GRANULE)

_Alignas(GRANULE) _Atomic(uint8_t) hak_segmap[SEGMAP_ENTRIES];

static _Atomic uint64_t writable[GRANULES / 64]; /* a bit per granule */
static bool read_only;                           /* the map was made read-only at init */
static pthread_mutex_t writable_lock = PTHREAD_MUTEX_INITIALIZER;

_Static_assert(GRANULES % 64 == 0, "the bitmap has whole words");

/* At init, before anything is mapped, so the map is all zeros. Where the
 * kernel refuses (a seccomp filter), the map stays as it was; a failure
 * that left the range unmapped, which nothing at init causes, is mended
 * by mapping it writable again. */
void segmap_init(void)
{
    read_only = os_map_fixed(hak_segmap, sizeof hak_segmap, false);
    if (!read_only && !os_protect(hak_segmap, sizeof hak_segmap, true) &&
        !os_map_fixed(hak_segmap, sizeof hak_segmap, true))
        hak_fatal("lost its segment map");
}

/* Make the granules of entries [first, first + count) writable. Where the
 * kernel refuses one granule (the process's limit of mappings, each
 * granule splitting the map's), the whole map is made writable at once,
 * which splits nothing. */
static void make_writable(size_t first, size_t count)
{
    if (first + count > SEGMAP_ENTRIES)
        hak_fatal("the kernel mapped memory above the address space its segment map covers");
    if (!read_only)
        return;
    for (size_t g = first / GRANULE; g <= (first + count - 1) / GRANULE; g++) {
        uint64_t bit = (uint64_t)1 << (g % 64);
        if (atomic_load_explicit(&writable[g / 64], memory_order_acquire) & bit)
            continue;
        pthread_mutex_lock(&writable_lock);
        if (!(atomic_load_explicit(&writable[g / 64], memory_order_relaxed) & bit)) {
            if (!os_protect(&hak_segmap[g * GRANULE], GRANULE, true)) {
                if (!os_protect(hak_segmap, sizeof hak_segmap, true))
                    hak_fatal("cannot make its segment map writable");
                for (size_t w = 0; w < GRANULES / 64; w++)
                    atomic_store_explicit(&writable[w], ~(uint64_t)0, memory_order_release);
            }
            atomic_fetch_or_explicit(&writable[g / 64], bit, memory_order_release);
        }
        pthread_mutex_unlock(&writable_lock);
    }
}

void segmap_set(void *chunk, size_t size, unsigned head_kind)
{
    size_t first = (uintptr_t)chunk >> SS_SHIFT;
    size_t chunks = (size + SS_SIZE - 1) >> SS_SHIFT;
    make_writable(first, chunks);
    for (size_t i = 1; i < chunks; i++)
        atomic_store_explicit(&hak_segmap[first + i], SEG_LARGE_INTERIOR, memory_order_relaxed);
    atomic_store_explicit(&hak_segmap[first], (uint8_t)head_kind, memory_order_release);
}

void segmap_set_all(void *chunk, size_t size, unsigned kind)
{
    size_t first = (uintptr_t)chunk >> SS_SHIFT;
    make_writable(first, size >> SS_SHIFT);
    for (size_t i = 0; i < size >> SS_SHIFT; i++)
        atomic_store_explicit(&hak_segmap[first + i], (uint8_t)kind, memory_order_release);
}

void segmap_clear(void *chunk, size_t size)
{
    size_t first = (uintptr_t)chunk >> SS_SHIFT;
    size_t chunks = (size + SS_SIZE - 1) >> SS_SHIFT;
    make_writable(first, chunks);
    for (size_t i = 0; i < chunks; i++)
        atomic_store_explicit(&hak_segmap[first + i], SEG_NONE, memory_order_relaxed);
}
