/* One heap misuse, by name, for tests/misuse.sh: an overflow or underflow
 * of 1 byte, 32 bytes or 1 MiB past a block, by a single store or by a
 * copy through to it; a write, zeroing or read after free; a double,
 * interior or foreign free, a realloc of a freed block. Then what gives an
 * allocator its chances to notice: the block freed, the blocks either side
 * freed, and allocations, writes and frees of the size. The program exits
 * 0 when it got through: the misuse went unnoticed. Caught is any other
 * end (an abort with a message, a fault on a guard page).
 *
 * misuse_probe list          every probe's name, one a line
 * misuse_probe TIER KIND     one probe: TIER small (40 B), mid (3000 B),
 *                            page (100 000 B), large (4 MB)
 * misuse_probe served        how many of a block of each tier hakmem
 *                            serves (hak_owns, where a hakmem is loaded) */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <malloc.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The misuses are the point. */
#pragma GCC diagnostic ignored "-Wpragmas"
#pragma GCC diagnostic ignored "-Wuse-after-free"
#pragma GCC diagnostic ignored "-Wfree-nonheap-object"

#define MiB (1024 * 1024)

static const struct tier {
    const char *name;
    size_t size;
} tiers[] = {{"small", 40}, {"mid", 3000}, {"page", 100000}, {"large", 4000000}};

static const char *const kinds[] = {
    "overflow_store_1",  "overflow_store_32",  "overflow_store_1M",  "overflow_copy_1",
    "overflow_copy_32",  "overflow_copy_1M",   "underflow_store_1",  "underflow_store_32",
    "underflow_store_1M", "underflow_copy_1",  "underflow_copy_32",  "underflow_copy_1M",
    "write_after_free",  "zero_after_free",    "read_after_free",    "double_free",
    "double_free_later", "free_interior",      "free_stack",         "free_static",
    "realloc_after_free",
};

#define COUNT(a) (sizeof(a) / sizeof((a)[0]))

/* The compiler must not reason about the pointers: every misuse goes
 * through these. */
static char *volatile launder_slot;
static char *launder(char *p)
{
    launder_slot = p;
    return launder_slot;
}

static void fill(char *p, int byte, size_t n) { memset(launder(p), byte, n); }

static char source[5 * MiB];
static char static_block[64];

/* Allocations, writes and frees of the size, which meet what the misuse
 * left: corrupted links, headers, canaries. */
static void churn(size_t size)
{
    enum { N = 16 };
    char *blocks[N];
    for (int round = 0; round < 4; round++) {
        for (int i = 0; i < N; i++) {
            blocks[i] = malloc(size);
            if (blocks[i])
                fill(blocks[i], 'c', size);
        }
        for (int i = N - 1; i >= 0; i--)
            free(blocks[i]);
    }
}

static int probe(const struct tier *t, const char *kind)
{
    size_t n = t->size;
    char *before = malloc(n), *p = malloc(n), *after = malloc(n);
    if (!before || !p || !after) {
        fprintf(stderr, "misuse_probe: malloc(%zu) failed\n", n);
        return 2;
    }
    fill(before, 'b', n);
    fill(p, 'p', n);
    fill(after, 'a', n);
    p = launder(p);
    size_t distance = 0;
    bool freed = false;
    if (sscanf(kind, "%*[a-z]_%*[a-z]_%zu", &distance) == 1 && strchr(kind, 'M'))
        distance *= MiB;
    if (!strncmp(kind, "overflow_store", 14)) {
        p[n + distance - 1] = 'X';
    } else if (!strncmp(kind, "overflow_copy", 13)) {
        memcpy(p, source, n + distance);
    } else if (!strncmp(kind, "underflow_store", 15)) {
        p[-(ptrdiff_t)distance] = 'X';
    } else if (!strncmp(kind, "underflow_copy", 14)) {
        memcpy(p - distance, source, distance);
    } else if (!strcmp(kind, "write_after_free")) {
        free(p);
        memcpy(p, "XXXXXXXXXXXXXXXX", 16);
        freed = true;
    } else if (!strcmp(kind, "zero_after_free")) {
        free(p);
        memset(p, 0, n);
        freed = true;
    } else if (!strcmp(kind, "read_after_free")) {
        free(p);
        volatile char sink = p[0];
        sink = p[n / 2];
        (void)sink;
        freed = true;
    } else if (!strcmp(kind, "double_free")) {
        free(p);
        free(p);
        freed = true;
    } else if (!strcmp(kind, "double_free_later")) {
        free(p);
        free(before);
        free(p);
        before = malloc(n);
        freed = true;
    } else if (!strcmp(kind, "free_interior")) {
        free(p + 16);
    } else if (!strcmp(kind, "free_stack")) {
        char local[64];
        free(launder(local));
    } else if (!strcmp(kind, "free_static")) {
        free(launder(static_block));
    } else if (!strcmp(kind, "realloc_after_free")) {
        free(p);
        p = realloc(p, 2 * n);
        if (!p)
            return 0;
    } else {
        fprintf(stderr, "misuse_probe: no probe %s\n", kind);
        return 2;
    }
    if (!freed)
        free(p);
    free(before);
    free(after);
    churn(n);
    malloc_trim(0);
    churn(n);
    return 0;
}

static int served(void)
{
    bool (*owns)(const void *) = (bool (*)(const void *))dlsym(RTLD_DEFAULT, "hak_owns");
    int count = 0;
    for (size_t t = 0; t < COUNT(tiers); t++) {
        void *p = malloc(tiers[t].size);
        count += owns && owns(p);
        free(p);
    }
    printf("%d\n", count);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc == 2 && !strcmp(argv[1], "served"))
        return served();
    if (argc == 2 && !strcmp(argv[1], "list")) {
        for (size_t t = 0; t < COUNT(tiers); t++)
            for (size_t k = 0; k < COUNT(kinds); k++)
                if (t == 0 || strncmp(kinds[k], "free_s", 6)) /* foreign pointers: once */
                    printf("%s %s\n", tiers[t].name, kinds[k]);
        return 0;
    }
    if (argc == 3)
        for (size_t t = 0; t < COUNT(tiers); t++)
            if (!strcmp(argv[1], tiers[t].name))
                return probe(&tiers[t], argv[2]);
    fprintf(stderr, "usage: misuse_probe list | misuse_probe small|mid|page|large KIND\n");
    return 2;
}
