/* The segment map: one word per 64 KiB of the address space, telling
 * hakmem's memory, and its kind, from foreign memory; in a SuperSlab the
 * word is the slab descriptor of its 64 KiB page, so that a free finds its
 * slab with one load (a byte per 2 MiB chunk left the slab to the
 * SuperSlab header's table of its pages' slabs: a mask, a shift and a load
 * more, bench_pair lifo 75.85 against 72.87 instructions). Two levels: a
 * table in .bss of one word per 4 GiB of address space (32,768 of them,
 * 256 KiB; 65,536 on aarch64's 48 bits) pointing to a leaf of 512 KiB,
 * mapped the first time a mapping of hakmem's lands in its 4 GiB. Larger
 * leaves take less table but more memory where a program locks its pages
 * (mlockall makes every leaf resident: test_release mlockall, 16 MiB at
 * most, took 16.2 with leaves of 1 MiB under UBSan). The table's 0 says
 * "no leaf", which the fast path tests: a leaf of zeros to read instead
 * would take as much .bss as a leaf and a table of its biased addresses
 * in relocated data. A flat map would spare a pair the leaf's load and
 * its test but take 256 MiB of address space: the loader refused to
 * preload a library with a flat map of 64 MiB under `ulimit -v 60000`.
 *
 * Every word of the table is biased by its leaf's first entry number, so
 * that the entry number indexes it without a mask: the fast path reads
 * hak_segmap[p >> 32] + 8 * (p >> 16). Leaves are never given back: a
 * program's mappings fall in a few 4 GiB regions, so a process has a few
 * leaves, of which it touches a page or two; the pages a freed mapping's
 * entries leave all zero go back (entries_purge). */
#define _GNU_SOURCE
#include "layout.h"
#include "error.h"
#include "os.h"

#include <errno.h>
#include <pthread.h>

#define LEAF_BYTES (SEGMAP_LEAF_ENTRIES * sizeof(uintptr_t))

_Atomic uintptr_t hak_segmap[SEGMAP_LEAVES];

/* Beside the map, the other table every free of a slab block reads
 * (block.h); drawn with the first SuperSlab (superslab.c). */
struct mark_key hak_mark_key;

static pthread_mutex_t leaf_lock = PTHREAD_MUTEX_INITIALIZER;

/* The bias of leaf number `leaf`: its first entry's number, in bytes. */
static uintptr_t leaf_bias(size_t leaf) { return (uintptr_t)leaf * LEAF_BYTES; }

/* A leaf for number `leaf`, whose biased address is not 0 (which says "no
 * leaf"): the kernel would have to map it at exactly its bias; a second
 * mapping is elsewhere. NULL (errno ENOMEM) where the kernel refuses. */
static uintptr_t *leaf_map(size_t leaf)
{
    uintptr_t *bytes = os_map(LEAF_BYTES);
    if (bytes && (uintptr_t)bytes == leaf_bias(leaf)) {
        uintptr_t *other = os_map(LEAF_BYTES);
        os_unmap(bytes, LEAF_BYTES);
        bytes = other;
    }
    if (bytes)
        os_advise_small_pages(bytes, LEAF_BYTES); /* a huge page would make the leaf resident for a few entries */
    return bytes;
}

bool segmap_cover(const void *start, size_t size)
{
    size_t first = (uintptr_t)start >> SEGMAP_LEAF_SHIFT, last = ((uintptr_t)start + size - 1) >> SEGMAP_LEAF_SHIFT;
    if (last >= SEGMAP_LEAVES)
        hak_fatal("the kernel mapped memory above the address space its segment map covers");
    for (size_t leaf = first; leaf <= last; leaf++) {
        if (atomic_load_explicit(&hak_segmap[leaf], memory_order_acquire))
            continue;
        pthread_mutex_lock(&leaf_lock);
        bool mapped = atomic_load_explicit(&hak_segmap[leaf], memory_order_relaxed) != 0;
        if (!mapped) {
            uintptr_t *entries = leaf_map(leaf);
            if (entries) {
                atomic_store_explicit(&hak_segmap[leaf], (uintptr_t)entries - leaf_bias(leaf), memory_order_release);
                mapped = true;
            }
        }
        pthread_mutex_unlock(&leaf_lock);
        if (!mapped)
            return false; /* errno ENOMEM from os_map */
    }
    return true;
}

/* The entry of the 64 KiB at p, in a leaf segmap_cover mapped. */
static _Atomic uintptr_t *entry(uintptr_t p)
{
    size_t leaf = p >> SEGMAP_LEAF_SHIFT;
    uintptr_t entries = leaf < SEGMAP_LEAVES ? atomic_load_explicit(&hak_segmap[leaf], memory_order_relaxed) : 0;
    if (!entries)
        hak_fatal("wrote its segment map where no leaf was mapped");
    return (_Atomic uintptr_t *)(entries + (p >> SEGMAP_ENTRY_SHIFT) * sizeof(uintptr_t));
}

#define CHUNK_ENTRIES (SS_SIZE >> SEGMAP_ENTRY_SHIFT)

/* Every entry of the 2 MiB chunk at `chunk` says kind. Under leaf_lock. */
static void chunk_set(uintptr_t chunk, uintptr_t kind, memory_order order)
{
    _Atomic uintptr_t *e = entry(chunk);
    for (size_t i = 0; i < CHUNK_ENTRIES; i++)
        atomic_store_explicit(&e[i], kind, order);
}

void segmap_set(void *chunk, size_t size, unsigned head_kind)
{
    uintptr_t first = (uintptr_t)chunk & ~(uintptr_t)SS_MASK;
    size_t chunks = (size + SS_SIZE - 1) >> SS_SHIFT;
    pthread_mutex_lock(&leaf_lock);
    for (size_t i = 1; i < chunks; i++)
        chunk_set(first + i * SS_SIZE, SEG_LARGE_INTERIOR, memory_order_relaxed);
    chunk_set(first, head_kind, memory_order_release);
    pthread_mutex_unlock(&leaf_lock);
}

void segmap_set_all(void *chunk, size_t size, unsigned kind)
{
    pthread_mutex_lock(&leaf_lock);
    for (size_t i = 0; i < size >> SS_SHIFT; i++)
        chunk_set((uintptr_t)chunk + i * SS_SIZE, kind, memory_order_release);
    pthread_mutex_unlock(&leaf_lock);
}

void segmap_set_superslab(superslab_t *ss, slab_t *no_slab)
{
    pthread_mutex_lock(&leaf_lock);
    chunk_set((uintptr_t)ss, (uintptr_t)no_slab, memory_order_release);
    pthread_mutex_unlock(&leaf_lock);
}

void segmap_set_slab(superslab_t *ss, unsigned page, unsigned span, slab_t *s)
{
    _Atomic uintptr_t *e = entry((uintptr_t)ss);
    for (unsigned i = page; i < page + span; i++)
        atomic_store_explicit(&e[i], (uintptr_t)s, memory_order_release);
}

/* The leaf's pages that the entries of [from, to), chunks just cleared,
 * left all zero go back to the kernel: 128 KiB of entries a GiB of
 * SuperSlabs or large blocks, which would otherwise stay resident
 * (test_release trim: up to 0.54 MiB above its start, against 0.2-0.4,
 * after a GiB freed and trimmed). Under leaf_lock, which every write of a
 * chunk's entries takes: a page found all zero covers no mapping (a
 * SuperSlab's slab entries, written without the lock, are never zero
 * while it is mapped), and none can be marked in it before the purge. */
static void entries_purge(uintptr_t from, uintptr_t to)
{
    size_t page = os_page_size();
    while (from < to) {
        uintptr_t leaf_end = (from | (((uintptr_t)1 << SEGMAP_LEAF_SHIFT) - 1)) + 1;
        uintptr_t end = to < leaf_end ? to : leaf_end;
        /* The leaf's bytes, which a test build's page (HAKMEM_PAGE_SIZE,
         * above the kernel's) need not align: nothing outside is read. */
        uintptr_t lo = (uintptr_t)entry(from >> SEGMAP_LEAF_SHIFT << SEGMAP_LEAF_SHIFT), hi = lo + LEAF_BYTES;
        uintptr_t first = (uintptr_t)entry(from) & ~(page - 1);
        uintptr_t last = (uintptr_t)entry(end - SS_SIZE) + CHUNK_ENTRIES * sizeof(uintptr_t);
        for (uintptr_t at = first; at < last; at += page) {
            uintptr_t a = at < lo ? lo : at, b = at + page > hi ? hi : at + page;
            bool zero = true;
            for (uintptr_t w = a; zero && w < b; w += sizeof(uintptr_t))
                zero = atomic_load_explicit((const _Atomic uintptr_t *)w, memory_order_relaxed) == 0;
            if (zero)
                os_purge((void *)a, b - a); /* its whole pages */
        }
        from = end;
    }
}

void segmap_clear(void *chunk, size_t size)
{
    uintptr_t first = (uintptr_t)chunk & ~(uintptr_t)SS_MASK;
    size_t chunks = (size + SS_SIZE - 1) >> SS_SHIFT;
    pthread_mutex_lock(&leaf_lock);
    for (size_t i = 0; i < chunks; i++)
        chunk_set(first + i * SS_SIZE, SEG_NONE, memory_order_relaxed);
    entries_purge(first, first + chunks * SS_SIZE);
    pthread_mutex_unlock(&leaf_lock);
}

/* A fork while another thread holds leaf_lock would leave the child's
 * locked: taken last, before every fork (init.c). */
void segmap_fork_prepare(void) { pthread_mutex_lock(&leaf_lock); }
void segmap_fork_parent(void) { pthread_mutex_unlock(&leaf_lock); }
void segmap_fork_child(void) { pthread_mutex_init(&leaf_lock, NULL); }
