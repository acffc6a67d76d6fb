/* The exported malloc family (and hakmem's own API entry points). Each
 * entry point is a thin wrapper over the inline fast paths in alloc.h.
 * The standard names are defined unless the build says HAKMEM_OVERRIDE=OFF
 * (the ThreadSanitizer build, where the sanitizer owns malloc); the hak_
 * names always are. */
#define _GNU_SOURCE
#include "alloc.h"
#include "init.h"
#include "superslab.h"
#include "hakmem.h"

#include <errno.h>
#include <limits.h>
#include <malloc.h>
#include <string.h>

static inline void *calloc_impl(size_t n, size_t size, uintptr_t site)
{
    size_t total;
    if (unlikely(__builtin_mul_overflow(n, size, &total))) {
        errno = ENOMEM;
        return NULL;
    }
    if (likely(total <= TINY_MAX)) {
        void *p = hak_alloc(total, site);
        if (likely(p))
            memset(p, 0, total);
        return p;
    }
    return hak_calloc_slow(total, site);
}

static inline void *aligned_alloc_impl(size_t align, size_t size, uintptr_t site)
{
    if (!is_power_of_two(align)) {
        errno = EINVAL;
        return NULL;
    }
    return hak_alloc_aligned(align, size, site);
}

/* ---- hakmem's own names ------------------------------------------------------- */

HAK_EXPORT HAK_HOT void *hak_malloc(size_t size) { return hak_alloc(size, HAK_CALLER); }

HAK_EXPORT HAK_HOT void hak_free(void *p) { hak_free_checked(p, "free"); }

HAK_EXPORT void *hak_calloc(size_t n, size_t size) { return calloc_impl(n, size, HAK_CALLER); }

HAK_EXPORT void *hak_realloc(void *p, size_t size) { return hak_realloc_impl(p, size, HAK_CALLER); }

HAK_EXPORT void *hak_aligned_alloc(size_t align, size_t size)
{
    return aligned_alloc_impl(align, size, HAK_CALLER);
}

HAK_EXPORT size_t hak_usable_size(const void *p)
{
    return p ? hak_usable_size_checked(p, "malloc_usable_size") : 0;
}

/* ---- the standard names ------------------------------------------------------- */

#ifdef HAKMEM_OVERRIDE
HAK_EXPORT HAK_HOT void *malloc(size_t size) { return hak_alloc(size, HAK_CALLER); }

HAK_EXPORT HAK_HOT void free(void *p) { hak_free_checked(p, "free"); }

HAK_EXPORT void *calloc(size_t n, size_t size) { return calloc_impl(n, size, HAK_CALLER); }

HAK_EXPORT void *realloc(void *p, size_t size) { return hak_realloc_impl(p, size, HAK_CALLER); }

HAK_EXPORT void *reallocarray(void *p, size_t n, size_t size)
{
    size_t total;
    if (unlikely(__builtin_mul_overflow(n, size, &total))) {
        errno = ENOMEM;
        return NULL;
    }
    return hak_realloc_impl(p, total, HAK_CALLER);
}

HAK_EXPORT int posix_memalign(void **out, size_t align, size_t size)
{
    if (!is_power_of_two(align) || align % sizeof(void *) != 0)
        return EINVAL;
    int saved = errno;
    void *p = hak_alloc_aligned(align, size, HAK_CALLER);
    errno = saved; /* posix_memalign reports through its result only */
    if (!p)
        return ENOMEM;
    *out = p;
    return 0;
}

HAK_EXPORT void *aligned_alloc(size_t align, size_t size) { return aligned_alloc_impl(align, size, HAK_CALLER); }

/* memalign rounds an alignment that is not a power of two up to the next
 * one, as glibc's does (memalign(24, 100) is aligned to 32); only one
 * above the largest power of two is refused. */
HAK_EXPORT void *memalign(size_t align, size_t size)
{
    if (align > ((size_t)1 << (sizeof(size_t) * 8 - 1))) {
        errno = EINVAL;
        return NULL;
    }
    size_t rounded = align < 2 ? 1 : (size_t)1 << (sizeof(size_t) * 8 - __builtin_clzl(align - 1));
    return hak_alloc_aligned(rounded, size, HAK_CALLER);
}

HAK_EXPORT void *valloc(size_t size) { return hak_alloc_aligned(os_page_size(), size, HAK_CALLER); }

HAK_EXPORT void *pvalloc(size_t size)
{
    size_t page = os_page_size();
    size_t rounded = (size + page - 1) & ~(page - 1);
    if (rounded < size) {
        errno = ENOMEM;
        return NULL;
    }
    return hak_alloc_aligned(page, rounded ? rounded : page, HAK_CALLER);
}

HAK_EXPORT size_t malloc_usable_size(void *p) { return hak_usable_size(p); }

HAK_EXPORT int malloc_trim(size_t pad)
{
    (void)pad;
    size_t before = os_rss_bytes();
    hak_collect(true);
    return os_rss_bytes() < before; /* 1 if memory went back to the OS */
}

#ifdef __GLIBC__
/* glibc's own interface to its allocator: mallinfo, malloc_stats,
 * malloc_info, mallopt and the __libc_ names. musl has none of it (its
 * programs cannot call them), so a musl build leaves them out. */

/* glibc's fields as they map onto hakmem: its own mappings (hblks,
 * hblkhd) are the large blocks in use; arena is the rest of what hakmem
 * has mapped, the slabs', the page arenas' and BigCache's, of which
 * uordblks is handed out and fordblks free or held; usmblks is the peak
 * of all that was mapped. */
HAK_EXPORT struct mallinfo2 mallinfo2(void)
{
    hak_stats_t s;
    hak_stats_get(&s);
    struct mallinfo2 mi;
    memset(&mi, 0, sizeof mi);
    mi.hblks = s.large_blocks;
    mi.hblkhd = s.large_bytes;
    mi.arena = s.mapped_bytes > s.large_bytes ? s.mapped_bytes - s.large_bytes : 0;
    mi.uordblks = s.tiny_bytes + s.mid_bytes + s.arena_bytes;
    mi.fordblks = mi.arena > mi.uordblks ? mi.arena - mi.uordblks : 0;
    mi.usmblks = s.mapped_peak;
    return mi;
}

/* mallinfo2's figures for programs that still call the deprecated
 * mallinfo, clamped to its int fields (glibc's wrap around past 2 GiB). */
static int clamped_to_int(size_t n) { return n > INT_MAX ? INT_MAX : (int)n; }

HAK_EXPORT struct mallinfo mallinfo(void)
{
    struct mallinfo2 wide = mallinfo2();
    struct mallinfo mi;
    memset(&mi, 0, sizeof mi);
    mi.arena = clamped_to_int(wide.arena);
    mi.hblks = clamped_to_int(wide.hblks);
    mi.hblkhd = clamped_to_int(wide.hblkhd);
    mi.uordblks = clamped_to_int(wide.uordblks);
    mi.fordblks = clamped_to_int(wide.fordblks);
    mi.usmblks = clamped_to_int(wide.usmblks);
    return mi;
}

/* glibc prints its arenas' figures to stderr; this is hakmem's report. */
HAK_EXPORT void malloc_stats(void) { hak_stats_print(stderr); }

/* glibc's XML, with hakmem's figures where glibc has the element (the
 * mappings in <total type="mmap">, <system>, <aspace>) and hakmem's tiers
 * beside them (report.c). */
HAK_EXPORT int malloc_info(int options, FILE *out)
{
    if (options != 0 || !out) {
        errno = EINVAL;
        return -1;
    }
    report_xml(out);
    return 0;
}

/* glibc's tuning parameters, as far as hakmem has them. M_TRIM_THRESHOLD
 * is HAKMEM_ARENA_TRIM's and M_MMAP_THRESHOLD HAKMEM_LARGE_THRESHOLD's,
 * each taken as the nearest value its variable accepts; a threshold set
 * so also stops the tuner (HAKMEM_MODE=evolving), as it stops glibc's own
 * moving threshold. glibc's other parameters tune what hakmem has not
 * (arenas shared by threads, fastbins, a heap top, M_PERTURB's fill) and
 * are accepted without effect, as glibc accepts them; an unknown one is
 * refused with 0, as glibc refuses it. docs/options.md. */
HAK_EXPORT int mallopt(int param, int value)
{
    hak_ensure_init(); /* or the environment's options would overwrite it */
    switch (param) {
    case M_TRIM_THRESHOLD: {
        size_t trim = value < 0 ? SIZE_MAX : (size_t)value; /* glibc's cast: negative keeps all */
        __atomic_store_n(&hak_config.arena_trim, option_size_fit(&hak_config.arena_trim, trim), __ATOMIC_RELAXED);
        return 1;
    }
    case M_MMAP_THRESHOLD:
        if (value < 0)
            return 0; /* glibc refuses what exceeds its maximum */
        learn_pin_threshold(option_size_fit(&hak_config.large_threshold, (size_t)value));
        return 1;
    case M_MXFAST:
    case M_TOP_PAD:
    case M_MMAP_MAX:
    case M_CHECK_ACTION:
    case M_PERTURB:
    case M_ARENA_TEST:
    case M_ARENA_MAX:
        return 1;
    default:
        return 0;
    }
}

/* glibc's other names for the family, which some programs and preloaded
 * tools call directly (__libc_malloc...), and cfree, which binaries built
 * against glibc before 2.26 still call: without them, such a call hands
 * glibc a block of hakmem's (its free may then corrupt its own lists) or
 * hakmem one of glibc's (reported as foreign, and the program aborts by
 * default). Aliases: the same code, so the call site is the caller's, and
 * (GCC) the same attributes as libc's declarations give their targets. */
#if defined(__clang__)
#define HAK_ALIAS_OF(target) __attribute__((alias(#target)))
#else
#define HAK_ALIAS_OF(target) __attribute__((alias(#target), copy(target)))
#endif
HAK_EXPORT void *__libc_malloc(size_t size) HAK_ALIAS_OF(malloc);
HAK_EXPORT void __libc_free(void *p) HAK_ALIAS_OF(free);
HAK_EXPORT void cfree(void *p) HAK_ALIAS_OF(free);
HAK_EXPORT void *__libc_calloc(size_t n, size_t size) HAK_ALIAS_OF(calloc);
HAK_EXPORT void *__libc_realloc(void *p, size_t size) HAK_ALIAS_OF(realloc);
HAK_EXPORT void *__libc_memalign(size_t align, size_t size) HAK_ALIAS_OF(memalign);
HAK_EXPORT void *__libc_valloc(size_t size) HAK_ALIAS_OF(valloc);
HAK_EXPORT void *__libc_pvalloc(size_t size) HAK_ALIAS_OF(pvalloc);
#endif /* __GLIBC__ */
#endif /* HAKMEM_OVERRIDE */
/* ---- hakmem's own API -------------------------------------------------------- */

HAK_EXPORT const char *hak_version(void) { return HAKMEM_VERSION; }

HAK_EXPORT bool hak_owns(const void *p)
{
    unsigned kind = segmap_kind(p);
    if (kind == SEG_SUPERSLAB) {
        slab_t *s = slab_of(p);
        return s->in_use && slab_block_index(s, p) < slab_carved(s);
    }
    if (kind == SEG_LARGE_HEAD || kind == SEG_LARGE_INTERIOR) {
        large_hdr_t *h = large_header_of(p);
        return h && h->magic == LARGE_MAGIC && (const char *)p >= h->user && (const char *)p < h->user + h->usable;
    }
    if (kind == SEG_ARENA)
        return arena_owns(p);
    return kind == SEG_SAMPLED && sample_owns(p);
}

HAK_EXPORT void hak_collect(bool force)
{
    hak_ensure_init();
    purger_collecting(true);
    /* Orphans first: a thread without a heap is given one of them, whose
     * remote frees its own collect must then drain (the other order left
     * that heap's blocks undrained). */
    heaps_collect_orphans();
    heap_t *heap = heap_get();
    heap_collect(heap, true, 0);
    if (heap != &hak_empty_heap)
        arena_pools_flush(heap->arena_lane); /* what its front's full bins left there */
    heaps_flush_mid(force); /* the other threads' */
    superslab_purge(force);
    arena_purge(force);
    bigcache_collect(force);
    sample_collect();
    purger_collecting(false);
}

HAK_EXPORT int hak_tiny_class_count(void) { return TINY_CLASSES; }

HAK_EXPORT int hak_tiny_size_class(size_t size)
{
    return size <= TINY_MAX - BLOCK_CANARY ? (int)slab_class_for(size) : -1;
}

HAK_EXPORT int hak_thread_cache_flush(int class_index)
{
    if (class_index < 0 || class_index >= TINY_CLASSES) {
        errno = EINVAL;
        return -1;
    }
    heap_flush_class(heap_get(), (unsigned)class_index);
    return 0;
}

HAK_EXPORT void hak_thread_cache_flush_all(void) { heap_collect(heap_get(), true, 0); }

/* The deprecated names (hakmem.h). */
HAK_EXPORT int hak_tiny_magazine_flush(int class_index) { return hak_thread_cache_flush(class_index); }
HAK_EXPORT void hak_tiny_magazine_flush_all(void) { hak_thread_cache_flush_all(); }

HAK_EXPORT size_t hak_tiny_class_bytes(int class_index)
{
    if (class_index < 0 || class_index >= TINY_CLASSES) {
        errno = EINVAL;
        return (size_t)-1;
    }
    return superslab_class_bytes((unsigned)class_index);
}
