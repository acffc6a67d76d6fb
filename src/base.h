/* What every file of hakmem uses: the C headers, compiler attributes,
 * debug assertions, and a few helpers of no layer (a prefetch, a random
 * step, counters without locked instructions). Nothing here is exported:
 * the library's public API is include/hakmem.h. */
#ifndef HAKMEM_BASE_H
#define HAKMEM_BASE_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define likely(x) __builtin_expect(!!(x), 1)
#define unlikely(x) __builtin_expect(!!(x), 0)
#define HAK_EXPORT __attribute__((visibility("default")))
/* On the declaration of a global the fast paths read: the compiler then
 * reads it where it lies, not through the global offset table (which the
 * linker turns into a lea and a load, an instruction more). */
#define HAK_INTERNAL __attribute__((visibility("hidden")))
#define HAK_NOINLINE __attribute__((noinline))
/* The statistics read other threads' slab fields without those threads'
 * order (figures a moment old, as hak_stats_get says): ThreadSanitizer is
 * told, since the purger now changes slabs (of exited threads' heaps)
 * while a program reads its statistics. */
#define HAK_RACY_READS __attribute__((no_sanitize("thread")))
/* The entry points of the fast paths start a cache line: placed wherever
 * the code before them ended, malloc+free ran 8% slower or faster (tiny
 * lifo 290 or 315 Mops/s, the same instructions) as unrelated functions
 * grew. */
#define HAK_HOT __attribute__((aligned(64)))
#define HAK_TLS __attribute__((tls_model("initial-exec"))) __thread

void hak_assert_fail(const char *cond, const char *file, int line) __attribute__((noreturn));
#ifdef HAKMEM_DEBUG
#define hak_assert(c) ((c) ? (void)0 : hak_assert_fail(#c, __FILE__, __LINE__))
#else
#define hak_assert(c) ((void)0)
#endif
/* Fetch p's cache line for writing. A free reads the block's mark and
 * then writes its link: a line another core wrote (a block freed by
 * another thread than its allocator's) would come over shared for the
 * read, then need a second transfer to be written. PREFETCHW, which
 * x86-64's baseline does not name (GCC emits it only with -mprfchw); CPUs
 * without it take the encoding as a NOP. */
static inline void prefetch_for_write(const void *p)
{
#if defined(__x86_64__)
    __asm__ volatile("prefetchw %0" : : "m"(*(const char *)p));
#else
    __builtin_prefetch(p, 1);
#endif
}

/* xorshift64: the sampler's intervals and the tuner's tie breaks. */
static inline uint64_t xorshift64(uint64_t *state)
{
    uint64_t x = *state;
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    return *state = x;
}

/* The earlier of two due times, 0 meaning none (the purge passes). */
static inline uint64_t due_earlier(uint64_t a, uint64_t b) { return !a ? b : !b ? a : a < b ? a : b; }
/* The hardened build (libhakmem-secure.so, the same sources with
 * HAKMEM_SECURE): a constant, so that the default build compiles its
 * checks away. */
#ifdef HAKMEM_SECURE
#define HAK_SECURE 1
#else
#define HAK_SECURE 0
#endif
/* *counter += n with a relaxed load and store, no locked instruction: on
 * x86 each of those waits for the stores before it to drain. Exact where
 * one thread writes the counter (a heap's own counts); where several may
 * (histogram buckets), two at the same instant may lose one count, which
 * no percentile notices. */
#define ADD_UNLOCKED(counter, n)                                                                              \
    atomic_store_explicit((counter), atomic_load_explicit((counter), memory_order_relaxed) + (n),             \
                          memory_order_relaxed)

/* A public struct (hakmem.h) of full_size bytes into a caller's copy of
 * size bytes: the fields both know, and zeros for those only the caller
 * has. The structs only grow at their end (stats.c). */
static inline void hak_copy_sized(void *out, size_t size, const void *full, size_t full_size)
{
    size_t known = size < full_size ? size : full_size;
    __builtin_memcpy(out, full, known);
    __builtin_memset((char *)out + known, 0, size - known);
}

#endif
