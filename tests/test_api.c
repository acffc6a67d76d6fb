/* Conformance of the whole malloc family on hakmem: sizes, alignment,
 * errno, usable size, realloc across tiers, calloc, and proof that every
 * block came from hakmem (hak_owns). */
#define _GNU_SOURCE
#include "check.h"
#include "hakmem.h"

#include <errno.h>
#include <stddef.h>
#include <malloc.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The hardened library (libhakmem-secure) is preloaded. */
static bool hardened(void)
{
    hak_stats_t s;
    hak_stats_get(&s);
    return s.hardened;
}

static const size_t KiB = 1024, MiB = 1024 * 1024;

static void fill(unsigned char *p, size_t n, unsigned seed)
{
    for (size_t i = 0; i < n; i++)
        p[i] = (unsigned char)(seed + i * 7);
}

static int intact(const unsigned char *p, size_t n, unsigned seed)
{
    for (size_t i = 0; i < n; i++)
        if (p[i] != (unsigned char)(seed + i * 7))
            return 0;
    return 1;
}

static void test_sizes(void)
{
    static const size_t sizes[] = {0, 1, 7, 8, 9, 15, 16, 17, 24, 100, 1000, 1024, 1025, 1500, 4096,
                                   10000, 65536, 100000, 262144, 262145, 600000, 1048576, 1048577,
                                   3000000, 16 * 1048576, 100 * 1048576};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        size_t n = sizes[i];
        unsigned char *p = malloc(n);
        CHECK(p != NULL);
        if (!p)
            continue;
        CHECK(hak_owns(p));
        CHECK(n < 16 || (uintptr_t)p % 16 == 0);
        CHECK((uintptr_t)p % 8 == 0);
        size_t usable = malloc_usable_size(p);
        CHECK(usable >= n);
        CHECK(usable >= 8);
        fill(p, usable, (unsigned)i);
        CHECK(intact(p, usable, (unsigned)i));
        CHECK(hak_owns(p + usable - 1));
        free(p);
    }
}

/* Every byte of malloc_usable_size is the caller's: neighbours survive
 * writes to all of it. */
static void test_usable_exact(void)
{
    for (size_t n = 1; n <= 5000; n += 37) {
        enum { COUNT = 16 };
        unsigned char *blocks[COUNT];
        size_t usable[COUNT];
        for (int i = 0; i < COUNT; i++) {
            blocks[i] = malloc(n);
            usable[i] = malloc_usable_size(blocks[i]);
            fill(blocks[i], usable[i], (unsigned)(i + n));
        }
        int ok = 1;
        for (int i = 0; i < COUNT; i++)
            ok &= intact(blocks[i], usable[i], (unsigned)(i + n));
        CHECK(ok);
        /* Rounding waste is bounded; a profiling sample (one per 2 MiB
         * allocated on average: two of these in a row almost never) may be
         * served with more. The hardened build's least block is 32 bytes,
         * 24 of them usable (its canary takes the rest). */
        size_t least = usable[0] < usable[1] ? usable[0] : usable[1];
        CHECK(least < n + n / 8 + 16 || (n <= 8 && least == 24 && hardened()));
        for (int i = 0; i < COUNT; i++)
            free(blocks[i]);
    }
}

/* Sizes through a volatile, so the compiler cannot reason about the calls. */
static size_t opaque(size_t n)
{
    volatile size_t v = n;
    return v;
}

static void test_calloc(void)
{
    for (size_t n = 1; n < 300000; n = n * 3 + 1) {
        unsigned char *dirty = malloc(n);
        memset(dirty, 0xAB, n);
        free(dirty);
        unsigned char *p = calloc(1, n);
        CHECK(p && hak_owns(p));
        size_t nonzero = 0;
        for (size_t i = 0; i < n; i++)
            nonzero += p[i] != 0;
        CHECK(nonzero == 0);
        free(p);
    }
    unsigned char *big = calloc(5, 3 * MiB);
    CHECK(big && big[0] == 0 && big[15 * MiB - 1] == 0);
    free(big);
    errno = 0;
    CHECK(calloc(opaque(SIZE_MAX / 2), 3) == NULL && errno == ENOMEM);
    errno = 0;
    CHECK(calloc(opaque((size_t)1 << 33), (size_t)1 << 33) == NULL && errno == ENOMEM);
    void *zero = calloc(0, 0);
    CHECK(zero != NULL && hak_owns(zero));
    free(zero);
}

static void test_impossible_sizes(void)
{
    errno = 0;
    CHECK(malloc(opaque(SIZE_MAX)) == NULL && errno == ENOMEM);
    errno = 0;
    CHECK(malloc(opaque(PTRDIFF_MAX)) == NULL && errno == ENOMEM);
    errno = 0;
    CHECK(malloc(opaque((size_t)1 << 50)) == NULL && errno == ENOMEM); /* 1 PiB: no mapping fits */
    unsigned char *p = malloc(100);
    fill(p, 100, 3);
    errno = 0;
    CHECK(realloc(p, opaque(SIZE_MAX - 4096)) == NULL && errno == ENOMEM);
    CHECK(intact(p, 100, 3)); /* a failed realloc leaves the block alone */
    errno = 0;
    CHECK(reallocarray(p, opaque(SIZE_MAX / 2), 4) == NULL && errno == ENOMEM);
    CHECK(intact(p, 100, 3));
    free(p);
    void *q = NULL;
    CHECK(posix_memalign(&q, 64, opaque(SIZE_MAX - 8)) == ENOMEM && q == NULL);
}

static void test_realloc(void)
{
    static const size_t steps[] = {1, 8, 16, 100, 1024, 1025, 4096, 65536, 262144, 262145,
                                   1048576, 1048577, 4 * 1048576, 64 * 1048576};
    size_t count = sizeof steps / sizeof steps[0];
    unsigned char *p = realloc(NULL, 1);
    CHECK(p && hak_owns(p));
    fill(p, 1, 9);
    size_t have = 1;
    for (size_t i = 1; i < count; i++) { /* grow through every tier */
        p = realloc(p, steps[i]);
        CHECK(p && hak_owns(p));
        CHECK(intact(p, have, 9));
        fill(p, steps[i], 9);
        have = steps[i];
    }
    for (size_t i = count - 1; i-- > 0;) { /* and shrink back */
        p = realloc(p, steps[i]);
        CHECK(p && hak_owns(p));
        CHECK(intact(p, steps[i], 9));
        CHECK(malloc_usable_size(p) >= steps[i]);
    }
    errno = 0;
    CHECK(realloc(p, 0) == NULL); /* frees, as glibc does */
    void *a = reallocarray(NULL, 10, 10);
    CHECK(a && malloc_usable_size(a) >= 100);
    free(a);
}

static void check_aligned(void *p, size_t align, size_t size)
{
    CHECK(p != NULL);
    if (!p)
        return;
    CHECK((uintptr_t)p % align == 0);
    CHECK(hak_owns(p));
    CHECK(malloc_usable_size(p) >= size);
    memset(p, 0x5A, size ? size : 1);
}

static void test_alignment(void)
{
    for (size_t align = 1; align <= 64 * MiB; align *= 2) {
        /* size 0 too: a large block of size 0 was once placed at its
         * mapping's end, where no one owned it */
        size_t sizes[] = {0, 1, align / 2 + 1, align, align + 1, 3 * align + 5};
        for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
            size_t size = sizes[i];
            if (size > 200 * MiB)
                continue;
            void *p = aligned_alloc(align, size);
            check_aligned(p, align, size);
            free(p);
            p = memalign(align, size);
            check_aligned(p, align, size);
            free(p);
            if (align >= sizeof(void *)) {
                p = NULL;
                CHECK(posix_memalign(&p, align, size) == 0);
                check_aligned(p, align, size);
                p = realloc(p, size + 100); /* realloc of an aligned block */
                CHECK(p && hak_owns(p));
                free(p);
            }
        }
    }
    /* Many aligned blocks live at once share slabs with plain ones. */
    void *blocks[200];
    for (int i = 0; i < 200; i++) {
        blocks[i] = i % 2 ? malloc(48) : aligned_alloc(64 << (i % 6), 40 + i);
        CHECK(blocks[i] && hak_owns(blocks[i]));
    }
    for (int i = 0; i < 200; i++)
        free(blocks[i]);

    void *p = (void *)1;
    CHECK(posix_memalign(&p, 24, 10) == EINVAL && p == (void *)1);
    CHECK(posix_memalign(&p, 4, 10) == EINVAL); /* below sizeof(void *) */
    errno = 0;
    CHECK(aligned_alloc(24, 10) == NULL && errno == EINVAL);
    /* memalign rounds the alignment up to a power of two, as glibc does. */
    void *m = memalign(3, 10);
    check_aligned(m, 4, 10);
    free(m);
    m = memalign(24, 100);
    check_aligned(m, 32, 100);
    free(m);
    m = memalign(96 << 10, 1000);
    check_aligned(m, 128 << 10, 1000);
    free(m);
    errno = 0;
    CHECK(memalign(((size_t)1 << 63) + 1, 10) == NULL && errno == EINVAL);

    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    void *v = valloc(10);
    check_aligned(v, page, 10);
    free(v);
    void *pv = pvalloc(10);
    check_aligned(pv, page, page);
    free(pv);
}

static void test_many_blocks(void)
{
    enum { N = 200000 };
    unsigned char **blocks = malloc(N * sizeof *blocks);
    size_t *sizes = malloc(N * sizeof *sizes);
    unsigned rng = 12345;
    for (int i = 0; i < N; i++) {
        rng = rng * 1103515245u + 12345u;
        sizes[i] = (rng >> 8) % (i % 100 == 0 ? 70000 : 1100);
        blocks[i] = malloc(sizes[i]);
        fill(blocks[i], sizes[i] < 64 ? sizes[i] : 64, (unsigned)i);
    }
    int ok = 1, owned = 1;
    for (int i = 0; i < N; i++) {
        ok &= intact(blocks[i], sizes[i] < 64 ? sizes[i] : 64, (unsigned)i);
        owned &= hak_owns(blocks[i]);
    }
    CHECK(ok);
    CHECK(owned);
    for (int i = 0; i < N; i++) { /* free in a scrambled order */
        int j = (int)(((unsigned)i * 7919u) % N);
        free(blocks[j]);
        blocks[j] = NULL;
    }
    for (int i = 0; i < N; i++)
        free(blocks[i]);
    free(blocks);
    free(sizes);
}

static int global_object;

static void test_ownership_and_trim(void)
{
    int local = 0;
    CHECK(!hak_owns(&local));
    CHECK(!hak_owns(&global_object));
    CHECK(!hak_owns(NULL));
    free(NULL);

    char *s = strdup("inside libc"); /* libc's own allocations come to hakmem too */
    CHECK(s && hak_owns(s));
    free(s);

    void *blocks[1000];
    for (int i = 0; i < 1000; i++)
        blocks[i] = malloc(4000);
    for (int i = 0; i < 1000; i++)
        free(blocks[i]);
    malloc_trim(0);
    hak_stats_t st;
    hak_stats_get(&st);
    CHECK(st.superslabs >= 1);
    CHECK(st.mapped_peak >= st.mapped_bytes);
#ifdef __GLIBC__
    struct mallinfo2 mi = mallinfo2();
    CHECK(mi.arena == st.mapped_bytes || mi.arena > 0);
#endif
    void *after = malloc(4000);
    CHECK(after && hak_owns(after));
    free(after);
    CHECK(strcmp(hak_version(), HAKMEM_VERSION) == 0);
}

/* Whether n bytes at p all hold byte. */
static bool all_bytes(const void *p, size_t n, unsigned char byte)
{
    for (size_t i = 0; i < n; i++)
        if (((const unsigned char *)p)[i] != byte)
            return false;
    return true;
}

/* The getters of the public structs write what the caller's struct holds:
 * a program built against an older, shorter struct gets its fields and
 * nothing past them, a newer, longer one zeros where the library has no
 * field, and hak_sites_get's array keeps the caller's stride. */
static void test_struct_sizes(void)
{
    enum { PAD = 64 };
    unsigned char buf[sizeof(hak_stats_t) + PAD];
    hak_stats_t full;
    hak_stats_get(&full);
    size_t older = offsetof(hak_stats_t, arenas);
    memset(buf, 0xab, sizeof buf);
    hak_stats_get_sized((hak_stats_t *)buf, older);
    hak_stats_t *got = (hak_stats_t *)buf;
    CHECK(got->superslabs >= 1 && got->large_threshold == full.large_threshold && got->hardened == full.hardened);
    CHECK(all_bytes(buf + older, sizeof buf - older, 0xab));
    memset(buf, 0xab, sizeof buf);
    hak_stats_get_sized((hak_stats_t *)buf, sizeof buf);
    CHECK(got->superslabs >= 1 && all_bytes(buf + sizeof(hak_stats_t), PAD, 0));
    memset(buf, 0xab, sizeof buf); /* the plain symbol, as dlsym or an older program finds it: 0.1.0's struct */
    void (*plain)(hak_stats_t *) = hak_stats_get;
    plain((hak_stats_t *)buf);
    size_t v010 = offsetof(hak_stats_t, large_huge) + sizeof(uint64_t);
    CHECK(got->superslabs >= 1 && all_bytes(buf + v010, sizeof buf - v010, 0xab));

    unsigned char kbuf[sizeof(hak_kpi_t) + PAD];
    memset(kbuf, 0xab, sizeof kbuf);
    CHECK(hak_get_kpi_sized((hak_kpi_t *)kbuf, offsetof(hak_kpi_t, rss_bytes)) == 0);
    CHECK(((hak_kpi_t *)kbuf)->page_faults_minor > 0);
    CHECK(all_bytes(kbuf + offsetof(hak_kpi_t, rss_bytes), sizeof kbuf - offsetof(hak_kpi_t, rss_bytes), 0xab));

    free(malloc(4 * MiB)); /* a large call is always recorded: at least one site */
    static hak_site_t sites[64];
    size_t n = hak_sites_get(sites, 64);
    CHECK(n >= 1);
    size_t stride = sizeof(hak_site_t) + 16, shorter = offsetof(hak_site_t, no_bigcache);
    static unsigned char wide[64 * (sizeof(hak_site_t) + 16)], narrow[64 * sizeof(hak_site_t)];
    memset(wide, 0xab, sizeof wide);
    memset(narrow, 0xab, sizeof narrow);
    CHECK(hak_sites_get_sized((hak_site_t *)wide, 64, stride) == n);
    CHECK(hak_sites_get_sized((hak_site_t *)narrow, 64, shorter) == n);
    for (size_t i = 0; i < n; i++) {
        const hak_site_t *w = (const hak_site_t *)(wide + i * stride), *s = (const hak_site_t *)(narrow + i * shorter);
        CHECK(w->address == sites[i].address && s->address == sites[i].address);
        CHECK(all_bytes(wide + i * stride + sizeof(hak_site_t), 16, 0));
    }
    CHECK(all_bytes(narrow + n * shorter, sizeof narrow - n * shorter, 0xab));
}

int main(void)
{
    check_expected_build();
    test_sizes();
    test_usable_exact();
    test_calloc();
    test_impossible_sizes();
    test_realloc();
    test_alignment();
    test_many_blocks();
    test_ownership_and_trim();
    test_struct_sizes();
    return check_summary("test_api");
}
