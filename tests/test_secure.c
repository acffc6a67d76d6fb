/* The hardened build (libhakmem-secure.so, preloaded): free-list links are
 * encoded, a link overwritten after free stops the program, new blocks come
 * in random order, and a write past a large block's last page faults. The
 * faulting cases run in child processes. */
#define _GNU_SOURCE
#include "check.h"
#include "hakmem.h"

#include <malloc.h>
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

static void test_corrupt_link_stops(void)
{
    char message[512];
    int status = in_child(overwrite_link, message, sizeof message);
    CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT);
    CHECK(strstr(message, "hakmem: malloc: free list corrupted") != NULL);
}

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

static void test_corrupt_cached_link_stops(void)
{
    char message[512];
    int status = in_child(overwrite_cached_link, message, sizeof message);
    CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT);
    CHECK(strstr(message, "hakmem: malloc: free list corrupted") != NULL);
    if (!WIFSIGNALED(status))
        fprintf(stderr, "%s", message);
}

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

static void write_past_large_block(void)
{
    size_t size = 3 << 20;
    char *p = malloc(size);
    size_t usable = malloc_usable_size(p);
    p[usable - 1] = 1; /* the last usable byte is fine */
    ((volatile char *)p)[usable] = 1; /* the guard page */
}

static void test_large_guard_page(void)
{
    char message[512];
    int status = in_child(write_past_large_block, message, sizeof message);
    CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGSEGV);
    /* realloc moves the guard with the block */
    char *p = malloc(3 << 20);
    p = realloc(p, 9 << 20);
    memset(p, 1, malloc_usable_size(p));
    p = realloc(p, 4 << 20);
    memset(p, 2, malloc_usable_size(p));
    CHECK(hak_owns(p));
    free(p);
}

int main(void)
{
    hak_stats_t s;
    hak_stats_get(&s);
    CHECK(s.hardened);
    if (!s.hardened) {
        fprintf(stderr, "test_secure: run with LD_PRELOAD=libhakmem-secure.so\n");
        return check_summary("test_secure");
    }
    test_links_encoded();
    test_corrupt_link_stops();
    test_corrupt_cached_link_stops();
    test_random_order();
    test_large_guard_page();
    return check_summary("test_secure");
}
