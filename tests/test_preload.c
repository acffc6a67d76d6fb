/* Run under LD_PRELOAD=libhakmem.so, not linked with it: every allocation
 * the program makes, through libc too, must come from hakmem. If the
 * preload silently fell back to glibc, hak_owns would be missing or false. */
#define _GNU_SOURCE
#include "check.h"

#include <dlfcn.h>
#include <errno.h>
#include <malloc.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "hakmem.h" /* hak_stats_t only: the library is found with dlsym */

#ifdef __GLIBC__ /* glibc's own interface to its allocator; musl has none of it */
/* glibc's other names for the family: no header declares them. */
void *__libc_malloc(size_t size);
void __libc_free(void *p);
void *__libc_calloc(size_t n, size_t size);
void *__libc_realloc(void *p, size_t size);
void *__libc_memalign(size_t align, size_t size);
void *__libc_valloc(size_t size);
void *__libc_pvalloc(size_t size);

/* Called directly, glibc's names are the preload's too, and so is cfree
 * (a compatibility symbol that only old binaries link to, hence dlsym):
 * a block goes between them and the standard names either way. */
static void check_glibc_names(bool (*owns)(const void *))
{
    void *blocks[] = {__libc_malloc(100), __libc_calloc(10, 100), __libc_realloc(NULL, 3000),
                      __libc_memalign(256, 100), __libc_valloc(10), __libc_pvalloc(10)};
    size_t count = sizeof blocks / sizeof blocks[0];
    for (size_t i = 0; i < count; i++)
        CHECK(blocks[i] && owns(blocks[i]));
    CHECK(blocks[1] && ((char *)blocks[1])[999] == 0);
    CHECK(((uintptr_t)blocks[3] & 255) == 0 && ((uintptr_t)blocks[4] & 4095) == 0);
    CHECK(malloc_usable_size(blocks[5]) >= 4096);
    blocks[2] = __libc_realloc(blocks[2], 100000);
    CHECK(blocks[2] && owns(blocks[2]));
    for (size_t i = 0; i < count; i++)
        i % 2 ? free(blocks[i]) : __libc_free(blocks[i]);
    void (*cfree_fn)(void *) = (void (*)(void *))dlsym(RTLD_DEFAULT, "cfree");
    bool hakmems = cfree_fn && (void *)cfree_fn == dlsym(RTLD_DEFAULT, "free"); /* hakmem's free, aliased */
    CHECK(hakmems);
    void *p = malloc(48);
    CHECK(p);
    if (hakmems && p) /* glibc's would take a block it never handed out */
        cfree_fn(p);
}

/* mallinfo (deprecated, still called) and malloc_stats report hakmem's
 * memory, not glibc's empty arenas. */
static void check_glibc_reports(void)
{
    void *blocks[256];
    for (int i = 0; i < 256; i++)
        blocks[i] = malloc(4000);
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
    struct mallinfo mi = mallinfo();
#pragma GCC diagnostic pop
    CHECK(mi.uordblks >= 256 * 4000 && mi.arena >= mi.uordblks);
    for (int i = 0; i < 256; i++)
        free(blocks[i]);

    char text[256] = "";
    FILE *captured = tmpfile();
    int saved = dup(STDERR_FILENO);
    CHECK(captured && saved >= 0);
    if (!captured || saved < 0)
        return;
    fflush(stderr);
    dup2(fileno(captured), STDERR_FILENO);
    malloc_stats();
    fflush(stderr);
    dup2(saved, STDERR_FILENO);
    close(saved);
    rewind(captured);
    size_t got = fread(text, 1, sizeof text - 1, captured);
    text[got] = 0;
    fclose(captured);
    CHECK(strncmp(text, "hakmem ", 7) == 0);
}

/* mallinfo2 counts large blocks (each in its own mapping) as glibc counts
 * its mmapped chunks: in hblks and hblkhd, not as free space. */
static void check_mallinfo_large(void)
{
    struct mallinfo2 before = mallinfo2();
    char *volatile big = malloc(8 << 20);
    CHECK(big);
    struct mallinfo2 during = mallinfo2();
    CHECK(during.hblks == before.hblks + 1 && during.hblkhd >= before.hblkhd + (8 << 20));
    CHECK(during.fordblks < before.fordblks + (8 << 20));
    CHECK(during.uordblks + during.fordblks == during.arena);
    free(big);
    CHECK(mallinfo2().hblks == before.hblks);
}

/* Whether a block of size is in a mapping of its own (mallinfo2's hblks). */
static bool is_mapped_alone(size_t size)
{
    size_t before = mallinfo2().hblks;
    char *volatile p = malloc(size);
    bool alone = p && mallinfo2().hblks == before + 1;
    free(p);
    return alone;
}

/* mallopt sets hakmem's options where glibc's parameters mean them:
 * M_MMAP_THRESHOLD the large threshold, M_TRIM_THRESHOLD the arenas' trim
 * (hak_stats_t's arena_dirty_bytes: freed pages left resident). */
static void check_mallopt(void)
{
    void (*stats)(hak_stats_t *, size_t) = (void (*)(hak_stats_t *, size_t))dlsym(RTLD_DEFAULT, "hak_stats_get_sized");
    CHECK(stats != NULL);
    if (!stats)
        return;
    CHECK(!is_mapped_alone(300000)); /* the page arenas' by default (1 MiB) */
    CHECK(mallopt(M_MMAP_THRESHOLD, 200000) == 1);
    hak_stats_t s;
    stats(&s, sizeof s);
    CHECK(s.large_threshold == 256 << 10); /* the power of two above */
    CHECK(is_mapped_alone(300000));
    CHECK(mallopt(M_MMAP_THRESHOLD, 64 << 20) == 1); /* the most hakmem has: 2 MiB */
    stats(&s, sizeof s);
    CHECK(s.large_threshold == 2 << 20 && !is_mapped_alone(2 << 20) && is_mapped_alone((2 << 20) + 1));
    CHECK(mallopt(M_MMAP_THRESHOLD, -1) == 0 && mallopt(M_MMAP_THRESHOLD, 1 << 20) == 1);

    void *blocks[16];
    for (int trim = 0; trim < 2; trim++) {
        /* Pages freed before (the report of malloc_stats above reads the
         * modules' symbol tables) wait for the purger whatever the setting. */
        stats(&s, sizeof s);
        size_t dirty_before = s.arena_dirty_bytes;
        CHECK(mallopt(M_TRIM_THRESHOLD, trim ? 32 << 20 : 0) == 1);
        for (int i = 0; i < 16; i++) { /* above the thread's front (256 KiB), which would keep some */
            blocks[i] = malloc(300 << 10);
            if (blocks[i])
                memset(blocks[i], 1, 300 << 10);
        }
        for (int i = 16; i-- > 0;)
            free(blocks[i]);
        stats(&s, sizeof s);
        CHECK(trim ? s.arena_dirty_bytes >= (4 << 20) : s.arena_dirty_bytes <= dirty_before);
    }
    /* glibc's parameters for what hakmem has not are accepted; an unknown
     * one is refused (glibc's returns 1). */
    CHECK(mallopt(M_ARENA_MAX, 1) == 1 && mallopt(M_MXFAST, 0) == 1);
    CHECK(mallopt(12345, 1) == 0);
}

/* malloc_info writes hakmem's figures in glibc's document. */
static void check_malloc_info(void)
{
    char text[2048] = "";
    FILE *f = tmpfile();
    CHECK(f);
    if (!f)
        return;
    char *volatile big = malloc(8 << 20);
    CHECK(malloc_info(0, f) == 0);
    free(big);
    rewind(f);
    text[fread(text, 1, sizeof text - 1, f)] = 0;
    fclose(f);
    static const char start[] = "<malloc version=\"1\">\n<allocator name=\"hakmem\"";
    CHECK(strncmp(text, start, sizeof start - 1) == 0);
    CHECK(strstr(text, "<total type=\"mmap\" count=\"1\" size=\"") != NULL);
    CHECK(strstr(text, "<system type=\"current\" size=\"") != NULL && strstr(text, "</malloc>\n") != NULL);
    errno = 0;
    CHECK(malloc_info(1, stdout) == -1 && errno == EINVAL);
}
#endif

int main(void)
{
    bool (*owns)(const void *) = (bool (*)(const void *))dlsym(RTLD_DEFAULT, "hak_owns");
    CHECK(owns != NULL);
    if (!owns)
        return check_summary("test_preload");
    void *blocks[] = {malloc(1), malloc(100), malloc(5000), malloc(300000), malloc(8 << 20),
                      calloc(10, 10), realloc(NULL, 77), strdup("libc's strdup"),
                      aligned_alloc(4096, 4096), memalign(128, 1000), valloc(100)};
    size_t count = sizeof blocks / sizeof blocks[0];
    for (size_t i = 0; i < count; i++)
        CHECK(blocks[i] && owns(blocks[i]));
    void *p = NULL;
    CHECK(posix_memalign(&p, 64, 64) == 0 && owns(p));
    free(p);
    char *line = NULL; /* allocated inside libc by getline */
    size_t cap = 0;
    FILE *f = fopen("/proc/self/status", "r");
    CHECK(f && getline(&line, &cap, f) > 0 && owns(line));
    free(line);
    if (f)
        fclose(f);
    int local;
    CHECK(!owns(&local));
    for (size_t i = 0; i < count; i++)
        free(blocks[i]);
#ifdef __GLIBC__
    check_glibc_names(owns);
    check_glibc_reports();
    check_mallinfo_large();
    check_mallopt();
    check_malloc_info();
#endif
    return check_summary("test_preload");
}
