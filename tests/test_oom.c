/* Out of memory: under a small RLIMIT_AS every tier fails with NULL and
 * ENOMEM (posix_memalign with its result), realloc leaves the old block
 * whole, blocks allocated before are intact, and the program goes on
 * freeing and allocating; with the limit lifted everything works again. */
#define _GNU_SOURCE
#include "check.h"
#include "hakmem.h"
#include "rss.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

static size_t vm_size_bytes(void) { return proc_kib_field_bytes("/proc/self/status", "VmSize: %zu kB"); }

#define KEPT 300
static unsigned char *kept[KEPT];

static size_t kept_size(int i) { return i % 3 == 0 ? 48 : i % 3 == 1 ? 9000 : (size_t)(1 + i % 4) << 20; }

static int kept_intact(void)
{
    int ok = 1;
    for (int i = 0; i < KEPT; i++) {
        size_t n = kept_size(i);
        ok &= hak_owns(kept[i]) && kept[i][0] == (unsigned char)i && kept[i][n / 2] == (unsigned char)i &&
              kept[i][n - 1] == (unsigned char)i;
    }
    return ok;
}

/* Allocate blocks of `size` with `alloc` until it fails; returns how many
 * it got (into blocks, up to max) and checks the failure. */
static size_t fill_until_failure(void **blocks, size_t max, size_t size, void *(*alloc)(size_t))
{
    size_t n = 0;
    errno = 0;
    while (n < max) {
        void *p = alloc(size);
        if (!p)
            break;
        ((char *)p)[0] = 1;
        blocks[n++] = p;
    }
    CHECK(n < max);           /* the limit was reached */
    if (errno != ENOMEM)
        fprintf(stderr, "test_oom: %zu-byte allocation %zu failed with errno %d\n", size, n, errno);
    CHECK(errno == ENOMEM);
    return n;
}

static void *plain_malloc(size_t n) { return malloc(n); }
static void *zeroed(size_t n) { return calloc(1, n); }
static void *aligned(size_t n) { return aligned_alloc(4096, n); }

int main(void)
{
    setvbuf(stdout, NULL, _IONBF, 0); /* stdio must not need memory to report */
    for (int i = 0; i < KEPT; i++) {
        kept[i] = malloc(kept_size(i));
        memset(kept[i], i, kept_size(i));
    }
    struct rlimit old;
    getrlimit(RLIMIT_AS, &old);
    struct rlimit tight = {vm_size_bytes() + (64 << 20), old.rlim_max};
    CHECK(setrlimit(RLIMIT_AS, &tight) == 0);

    /* Each tier in turn fills the room, then gives it back: the next tier
     * can only get memory if what the last one freed (cached blocks, empty
     * SuperSlabs) goes back to the OS when a mapping fails. */
    static const struct tier {
        const char *name;
        size_t size;
        void *(*alloc)(size_t);
    } tiers[] = {{"large", 8 << 20, plain_malloc},   {"mid, calloc", 200000, zeroed}, {"mid", 3000, plain_malloc},
                 {"tiny", 100, plain_malloc},        {"aligned", 100000, aligned},    {"large again", 8 << 20, plain_malloc}};
    enum { MAX = 1 << 20 };
    static void *blocks[MAX];
    for (size_t t = 0; t < sizeof tiers / sizeof tiers[0]; t++) {
        size_t n = fill_until_failure(blocks, MAX, tiers[t].size, tiers[t].alloc);
        printf("test_oom: %s: %zu blocks of %zu bytes before ENOMEM\n", tiers[t].name, n, tiers[t].size);
        CHECK(n * tiers[t].size > (24 << 20)); /* a good part of the 64 MiB of room */
        if (t == 0) {
            /* Every entry point fails cleanly at the limit. */
            errno = 0;
            CHECK(malloc((size_t)1 << 30) == NULL && errno == ENOMEM);
            errno = 0;
            CHECK(calloc(1, (size_t)1 << 30) == NULL && errno == ENOMEM);
            void *out = NULL;
            CHECK(posix_memalign(&out, 1 << 16, (size_t)1 << 30) == ENOMEM && out == NULL);
            errno = 0;
            CHECK(aligned_alloc(1 << 21, (size_t)1 << 30) == NULL && errno == ENOMEM);
            errno = 0;
            unsigned char *grown = realloc(kept[2], (size_t)1 << 30);
            CHECK(grown == NULL && errno == ENOMEM);
            errno = 0;
            grown = realloc(kept[1], (size_t)1 << 30); /* mid to large */
            CHECK(grown == NULL && errno == ENOMEM);
        }
        CHECK(kept_intact()); /* kept[1] and kept[2] among them: realloc left them whole */
        for (size_t i = 0; i < n; i++)
            free(blocks[i]);
    }

    /* With the limit lifted, a gigabyte is no problem. */
    CHECK(setrlimit(RLIMIT_AS, &old) == 0);
    char *huge = malloc((size_t)1 << 30);
    CHECK(huge && hak_owns(huge));
    free(huge);
    for (int i = 0; i < KEPT; i++)
        free(kept[i]);
    return check_summary("test_oom");
}
