/* libFuzzer harness: the input is a program of malloc-family calls through
 * hakmem's own names, run against a shadow model that knows each live
 * block's size, alignment and contents. Any difference traps. Built by
 * tests/fuzz.sh with clang (-fsanitize=fuzzer,undefined), hakmem compiled
 * without the standard names so libFuzzer keeps glibc's malloc. */
#include "hakmem.h"

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define SLOTS 64

typedef struct shadow {
    unsigned char *p;
    size_t size;
    size_t align;
    unsigned char seed;
} shadow_t;

static shadow_t live[SLOTS];

#define REQUIRE(c)              \
    do {                        \
        if (!(c))               \
            __builtin_trap();   \
    } while (0)

/* Whole blocks up to 8 KiB; the ends and one byte per 4 KiB beyond. */
static size_t next_offset(size_t off, size_t size)
{
    if (size <= 8192 || off < 64 || off + 64 >= size)
        return off + 1;
    return off + 4096 < size - 64 ? off + 4096 : size - 64;
}

static unsigned char byte_at(unsigned char seed, size_t off) { return (unsigned char)(seed + off * 7 + (off >> 8)); }

static void fill(shadow_t *s)
{
    for (size_t off = 0; off < s->size; off = next_offset(off, s->size))
        s->p[off] = byte_at(s->seed, off);
}

static void verify(const shadow_t *s, size_t limit)
{
    for (size_t off = 0; off < s->size && off < limit; off = next_offset(off, s->size))
        REQUIRE(s->p[off] == byte_at(s->seed, off));
}

static void verify_block(const shadow_t *s)
{
    REQUIRE(hak_owns(s->p) && hak_usable_size(s->p) >= s->size);
    if (s->align)
        REQUIRE((uintptr_t)s->p % s->align == 0);
    verify(s, s->size);
}

typedef struct reader {
    const uint8_t *data;
    size_t left;
} reader_t;

static unsigned take(reader_t *r)
{
    if (!r->left)
        return 0;
    r->left--;
    return *r->data++;
}

/* Mostly tiny sizes, often mid, now and then large (up to 4 MiB). */
static size_t take_size(reader_t *r)
{
    unsigned tier = take(r), a = take(r), b = take(r);
    size_t v = (size_t)a << 8 | b;
    if (tier < 160)
        return v % 1025;
    if (tier < 240)
        return 1025 + v * 4;
    return ((size_t)take(r) << 16 | v) % (4u << 20);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    reader_t r = {data, size};
    while (r.left) {
        unsigned op = take(&r);
        shadow_t *s = &live[take(&r) % SLOTS];
        if (s->p && op % 8 < 3) { /* free */
            verify_block(s);
            hak_free(s->p);
            s->p = NULL;
            continue;
        }
        if (s->p && op % 8 < 5) { /* realloc keeps the common prefix */
            size_t n = take_size(&r);
            unsigned char *q = hak_realloc(s->p, n);
            if (n == 0) { /* freed, as in glibc */
                REQUIRE(q == NULL);
                s->p = NULL;
                continue;
            }
            REQUIRE(q != NULL);
            shadow_t moved = {q, s->size, 0, s->seed};
            verify(&moved, n);
            *s = (shadow_t){q, n, 0, (unsigned char)op};
            fill(s);
            continue;
        }
        if (s->p) {
            verify_block(s);
            hak_free(s->p);
        }
        size_t n = take_size(&r);
        size_t align = 0;
        unsigned char *p;
        if (op % 8 == 5) {
            p = hak_calloc(1, n);
            REQUIRE(p != NULL);
            for (size_t off = 0; off < n; off = next_offset(off, n))
                REQUIRE(p[off] == 0);
        } else if (op % 8 == 6) {
            align = (size_t)1 << (take(&r) % 17); /* 1 B to 64 KiB */
            p = hak_aligned_alloc(align, n);
        } else {
            p = hak_malloc(n);
        }
        REQUIRE(p != NULL);
        *s = (shadow_t){p, n, align, (unsigned char)(op ^ size)};
        fill(s);
        verify_block(s);
    }
    for (unsigned i = 0; i < SLOTS; i++)
        if (live[i].p) {
            verify_block(&live[i]);
            hak_free(live[i].p);
            live[i].p = NULL;
        }
    return 0;
}
