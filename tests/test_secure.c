/* The hardened build (libhakmem-secure.so, preloaded): free-list links are
 * encoded, a link overwritten after free stops the program, new blocks come
 * in random order; every block's usable size is its request, and a write
 * one byte past it or before its start is reported at its free (canaries
 * and checked slack, in every tier), with HAKMEM_ON_ERROR=warn the block
 * stays allocated; a write after free over a page arena block waiting in
 * the thread's front stops the malloc that takes it; a large block has a
 * guard page at each end and its pages are inaccessible while BigCache
 * keeps it; never-used pages of SuperSlabs and page arenas fault; the
 * process's first large blocks, taken by threads at once, free cleanly
 * (their canaries under one secret). The faulting cases run in child
 * processes. */
#define _GNU_SOURCE
#include "check.h"
#include "hakmem.h"

#include <malloc.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

/* Reading freed blocks is the point here. */
#pragma GCC diagnostic ignored "-Wuse-after-free"

/* Run fn in a child with stderr captured; returns its wait status. */
static int in_child(void (*fn)(void), char *message, size_t size)
{
    int err[2];
    pipe(err);
    pid_t pid = fork();
    if (pid == 0) {
        dup2(err[1], STDERR_FILENO);
        fn();
        _exit(0);
    }
    close(err[1]);
    size_t got = 0;
    ssize_t n;
    while (got + 1 < size && (n = read(err[0], message + got, size - 1 - got)) > 0)
        got += (size_t)n;
    message[got] = 0;
    close(err[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    return status;
}

/* A freed block's first word is no plain pointer to its neighbour, yet
 * both come back (the links decode). */
static void test_links_encoded(void)
{
    enum { N = 5000 };
    static void *p[N];
    void *a = heap_malloc(80), *b = heap_malloc(80);
    free(a);
    free(b); /* b's link now leads to a */
    uintptr_t link = *(volatile uintptr_t *)b;
    CHECK(link != (uintptr_t)a && link != 0);
    int found = 0;
    for (int i = 0; i < N; i++) {
        p[i] = malloc(80);
        found += p[i] == a || p[i] == b;
    }
    CHECK(found == 2);
    for (int i = 0; i < N; i++)
        free(p[i]);
}

static void overwrite_link(void)
{
    char *a = heap_malloc(80), *b = heap_malloc(80);
    free(a);
    free(b);
    *(volatile uintptr_t *)b = 0x4141414141414141u; /* a write after free */
    for (int i = 0; i < 100000; i++) { /* until the refill follows the link */
        void *p = malloc(80);
        __asm__ volatile("" : : "g"(p) : "memory");
    }
}

/* fn, run in a child, stops it with hakmem's report of a corrupt list. */
static void check_list_corruption_reported(void (*fn)(void))
{
    char message[512];
    int status = in_child(fn, message, sizeof message);
    CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT);
    CHECK(strstr(message, "hakmem: malloc: free list corrupted") != NULL);
    if (!WIFSIGNALED(status))
        fprintf(stderr, "%s", message);
}

static void test_corrupt_link_stops(void) { check_list_corruption_reported(overwrite_link); }

/* A corrupt link met by malloc's fast path (a block already in the
 * thread's cache) stops the program at the next allocation of the class:
 * the fast path ends the list there and the refill reports it. 336 B is a
 * class no other test here uses: its first carve is 16 blocks, of which
 * the 10 freed come back, newest first, once the 6 others are taken. */
static void overwrite_cached_link(void)
{
    enum { N = 10 };
    char *p[N];
    for (int i = 0; i < N; i++)
        p[i] = heap_malloc(336);
    for (int i = 0; i < N; i++)
        free(p[i]);
    for (int tries = 0; tries < 64; tries++) {
        char *q = malloc(336);
        for (int k = 1; k < N; k++)
            if (q == p[k]) { /* p[k - 1] is next in the cache */
                *(volatile uintptr_t *)p[k - 1] = 0x4141414141414141u;
                void *next = malloc(336);   /* p[k - 1], its link found corrupt */
                void *after = malloc(336); /* must not return */
                fprintf(stderr, "not stopped: %p %p\n", next, after);
                return;
            }
    }
    fprintf(stderr, "no freed block came back\n");
}

static void test_corrupt_cached_link_stops(void) { check_list_corruption_reported(overwrite_cached_link); }

/* New blocks of a fresh slab are not handed out in address order. */
static void test_random_order(void)
{
    enum { N = 200 };
    char *p[N];
    unsigned rising = 0;
    for (int i = 0; i < N; i++) {
        p[i] = malloc(720); /* a class the test has not used yet */
        rising += i && p[i] > p[i - 1];
    }
    printf("test_secure: %u of %d consecutive blocks at rising addresses\n", rising, N - 1);
    CHECK(rising > 20 && rising < 170); /* in address order all but a few would rise */
    for (int i = 0; i < N; i++)
        free(p[i]);
}

/* The first byte of the page after the one that holds p + size. */
static char *next_page(char *p, size_t size)
{
    uintptr_t page = (uintptr_t)hakmem_page();
    return (char *)(((uintptr_t)(p + size) + page - 1) & ~(page - 1));
}

static void write_past_large_block(void)
{
    size_t size = 3 << 20;
    char *p = malloc(size);
    p[size - 1] = 1; /* the last usable byte is fine */
    *(volatile char *)next_page(p, size) = 1; /* the guard page */
}

/* Below the block: its first page (its colour), the header page, the guard. */
static void write_before_large_block(void)
{
    uintptr_t page = (uintptr_t)hakmem_page();
    char *p = malloc(3 << 20), *first_page = (char *)((uintptr_t)p & ~(page - 1));
    *(volatile char *)(first_page - page - 1) = 1;
}

static void read_after_large_free(void)
{
    char *p = malloc(3 << 20);
    memset(p, 1, 3 << 20);
    free(p); /* BigCache keeps it, inaccessible */
    fprintf(stderr, "read %d\n", *(volatile char *)p);
}

static void test_large_guard_page(void)
{
    char message[512];
    int status = in_child(write_past_large_block, message, sizeof message);
    CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGSEGV);
    status = in_child(write_before_large_block, message, sizeof message);
    CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGSEGV);
    status = in_child(read_after_large_free, message, sizeof message);
    CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGSEGV && !strstr(message, "read"));
    /* realloc moves the guard with the block */
    char *p = malloc(3 << 20);
    p = realloc(p, 9 << 20);
    memset(p, 1, malloc_usable_size(p));
    p = realloc(p, 4 << 20);
    memset(p, 2, malloc_usable_size(p));
    CHECK(hak_owns(p));
    free(p);
}

/* ---- canaries and checked slack ------------------------------------------------ */

/* A block the compiler must take as used (it drops free(malloc(n))). */
static char *kept(char *p)
{
    __asm__ volatile("" : : "r"(p) : "memory");
    return p;
}

/* A size of each tier, a request that leaves slack in its block. */
static const size_t tier_sizes[] = {40, 3000, 100000, 3000000};
enum { TIERS = sizeof tier_sizes / sizeof tier_sizes[0] };
static size_t misuse_size;
static int misuse_before;

/* Three blocks of misuse_size; one byte past the middle one's request,
 * or before its start (the end of the block before it: reported at
 * either's free, as a write past the one's end or before the other's
 * start), then the frees. */
static void write_out_of_block(void)
{
    hak_collect(true); /* the page arena's blocks below the wilderness: a, b and c in a row */
    char *a = kept(heap_malloc(misuse_size)), *b = kept(heap_malloc(misuse_size)), *c = kept(heap_malloc(misuse_size));
    if (misuse_before)
        ((volatile char *)b)[-1] = 'x';
    else
        ((volatile char *)b)[misuse_size] = 'x';
    free(b);
    free(a);
    free(c);
}

static void test_canaries(void)
{
    for (size_t t = 0; t < TIERS; t++) {
        size_t size = tier_sizes[t];
        char *p = heap_malloc(size);
        CHECK(malloc_usable_size(p) >= size && malloc_usable_size(p) <= size + 15); /* the request, or a tiny class's */
        memset(p, 1, malloc_usable_size(p)); /* every usable byte may be written */
        free(p);
        for (misuse_before = 0; misuse_before < 2; misuse_before++) {
            misuse_size = size;
            char message[512];
            int status = in_child(write_out_of_block, message, sizeof message);
            bool named = strstr(message, "a write past the end of this block") ||
                         (misuse_before && strstr(message, "a write before the start of this block"));
            CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT && named);
            if (!named)
                fprintf(stderr, "test_secure: %zu bytes, a write %s: %s\n", size, misuse_before ? "before" : "past",
                        message);
        }
    }
}

/* With HAKMEM_ON_ERROR=warn: one report, the block stays allocated (no
 * later malloc gets it), its neighbours free without a report. */
static void overflow_warned(void)
{
    setenv("HAKMEM_ON_ERROR", "warn", 1);
    exec_self((char *[]){"test_secure", "overflow-warned", NULL});
}

static int overflow_warned_run(void)
{
    enum { N = 200 };
    for (size_t t = 0; t < TIERS; t++) {
        size_t size = tier_sizes[t];
        char *a = kept(heap_malloc(size)), *b = kept(heap_malloc(size)), *c = kept(heap_malloc(size));
        ((volatile char *)b)[size] = 'x';
        free(b);
        free(a);
        free(c);
        int reused = 0;
        for (int i = 0; i < N; i++) {
            char *q = kept(heap_malloc(size));
            reused += q == b;
            free(q);
        }
        if (reused)
            return 1;
    }
    return 0;
}

static void test_overflow_warned(void)
{
    char message[2048];
    int status = in_child(overflow_warned, message, sizeof message);
    int reports = 0;
    for (const char *m = message; (m = strstr(m, "hakmem: free(")) != NULL; m++)
        reports++;
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    CHECK(reports == TIERS && strstr(message, "ignored (HAKMEM_ON_ERROR=warn)"));
    if (reports != TIERS)
        fprintf(stderr, "%s", message);
}

/* A write after free over a page arena block in the thread's front
 * (past the program's first purge delay, in which a free into a front
 * starts no purger thread: test_arena's test_front). */
static void write_after_front_free(void)
{
    usleep(150 * 1000);
    hak_collect(false);
    free(kept(heap_malloc(100000))); /* the bin found empty once: it keeps one block now */
    char *a = kept(heap_malloc(100000));
    free(a);
    memset(*(char *volatile *)&a, 0, 64);
    kept(heap_malloc(100000)); /* takes a */
}

static void test_front_write_after_free(void) { check_list_corruption_reported(write_after_front_free); }

/* A stray write 1 MiB past a young program's first blocks lands in pages
 * no block ever used: closed, it faults (a SuperSlab's, a page arena's). */
static void write_far_past(void)
{
    char *p = heap_malloc(misuse_size);
    *(volatile char *)(p + (1 << 20)) = 1;
}

static void test_closed_pages(void)
{
    size_t sizes[] = {64, 100000};
    for (int i = 0; i < 2; i++) {
        misuse_size = sizes[i];
        char message[512];
        int status = in_child(write_far_past, message, sizeof message);
        CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGSEGV);
    }
}

/* The large tier draws its canaries' secret at its first block: threads
 * taking their first large blocks at once, each drawing, wrote canaries
 * under secrets that the last draw replaced, and their frees were
 * reported as writes before the block (an abort). Run first, before any
 * large block of the process. */
enum { FIRST_LARGE_THREADS = 8 };
static pthread_barrier_t first_large_start;

static void *first_large_block(void *arg)
{
    pthread_barrier_wait(&first_large_start);
    char *p = malloc((size_t)4 << 20);
    CHECK(p != NULL);
    if (p)
        p[0] = 1;
    free(p); /* aborts on a canary drawn under another secret */
    return arg;
}

static void first_large_blocks_at_once(void)
{
    pthread_t threads[FIRST_LARGE_THREADS];
    pthread_barrier_init(&first_large_start, NULL, FIRST_LARGE_THREADS);
    for (int i = 0; i < FIRST_LARGE_THREADS; i++)
        CHECK(pthread_create(&threads[i], NULL, first_large_block, NULL) == 0);
    for (int i = 0; i < FIRST_LARGE_THREADS; i++)
        pthread_join(threads[i], NULL);
    _exit(checks_failed ? 1 : 0);
}

/* In fresh children, each its process's first large blocks: the race
 * is narrow (one thread's draw between another's draw and its canary). */
static void test_first_large_blocks_at_once(void)
{
    enum { RUNS = 200 };
    int clean = 0;
    char message[512];
    for (int run = 0; run < RUNS; run++) {
        int status = in_child(first_large_blocks_at_once, message, sizeof message);
        clean += WIFEXITED(status) && WEXITSTATUS(status) == 0;
        if (!(WIFEXITED(status) && WEXITSTATUS(status) == 0) && clean == run)
            fprintf(stderr, "test_secure: first large blocks: %s", message);
    }
    CHECK(clean == RUNS);
}

int main(int argc, char **argv)
{
    if (argc == 2 && !strcmp(argv[1], "overflow-warned"))
        return overflow_warned_run();
    hak_stats_t s;
    hak_stats_get(&s);
    CHECK(s.hardened);
    if (!s.hardened) {
        fprintf(stderr, "test_secure: run with LD_PRELOAD=libhakmem-secure.so\n");
        return check_summary("test_secure");
    }
    test_first_large_blocks_at_once();
    test_links_encoded();
    test_corrupt_link_stops();
    test_corrupt_cached_link_stops();
    test_random_order();
    test_large_guard_page();
    test_canaries();
    test_overflow_warned();
    test_front_write_after_free();
    test_closed_pages();
    return check_summary("test_secure");
}
