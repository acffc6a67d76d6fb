/* Bad input: each case runs in a child process. By default hakmem prints
 * one line naming itself, the call, the pointer and the fault, then aborts;
 * with HAKMEM_ON_ERROR=warn it prints the line and carries on, and nothing
 * is freed twice or handed out twice. */
#define _GNU_SOURCE
#include "check.h"
#include "hakmem.h"
#include "other_lane.h"

#include <dlfcn.h>
#include <malloc.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

/* The bad calls below are the point of this test. */
#pragma GCC diagnostic ignored "-Wfree-nonheap-object"

static int global_object[4];

typedef struct bad_case {
    const char *name;
    const char *call;  /* expected in the message: "free(" or "realloc(" */
    const char *fault; /* expected words of the diagnosis */
    size_t size;       /* block size for the cases that need one */
    void *(*run)(size_t size); /* does the bad thing; returns the bad pointer */
} bad_case_t;

static void announce(void *p)
{
    /* The parent learns the pointer to look for in the message. */
    char line[64];
    int n = snprintf(line, sizeof line, "%p\n", p);
    write(STDOUT_FILENO, line, (size_t)n);
}

static void *free_stack(size_t size)
{
    (void)size;
    int local[4];
    void *volatile p = local;
    announce(p);
    free(p);
    return p;
}

static void *free_global(size_t size)
{
    (void)size;
    void *p = global_object;
    announce(p);
    free(p);
    return p;
}

static void *free_foreign_mapping(size_t size)
{
    (void)size;
    void *p = mmap(NULL, 1 << 16, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    announce(p);
    free(p);
    return p;
}

/* Another allocator's heap: glibc's own malloc, looked up in libc itself. */
static void *glibc_block(size_t size)
{
    void *libc = dlopen("libc.so.6", RTLD_LAZY | RTLD_NOLOAD);
    void *(*glibc_malloc)(size_t) = libc ? (void *(*)(size_t))dlsym(libc, "malloc") : NULL;
    return glibc_malloc ? glibc_malloc(size) : NULL;
}

static void *free_glibc_block(size_t size)
{
    void *p = glibc_block(size);
    announce(p);
    free(p);
    return NULL;
}

static void *realloc_glibc_block(size_t size)
{
    void *p = glibc_block(size);
    announce(p);
    void *q = realloc(p, size * 2);
    return q ? NULL : p; /* realloc must refuse */
}

static void *realloc_global(size_t size)
{
    void *p = global_object;
    announce(p);
    void *q = realloc(p, size);
    return q ? NULL : p;
}

static void *realloc_foreign_mapping(size_t size)
{
    void *p = mmap(NULL, 1 << 16, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    announce(p);
    void *q = realloc(p, size);
    return q ? NULL : p;
}

static void *realloc_stack(size_t size)
{
    char local[32];
    void *volatile p = local;
    announce(p);
    void *q = realloc(p, size);
    return q ? NULL : p; /* realloc must refuse */
}

static void *double_free(size_t size)
{
    char *p = malloc(size);
    announce(p);
    free(p);
    free(p);
    return NULL; /* the block is legitimately free once: it may be reused */
}

/* Other blocks of the class are freed in between: the block is no longer
 * the head of its free list. */
static void *delayed_double_free(size_t size)
{
    char *p = malloc(size), *q = malloc(size), *r = malloc(size);
    announce(p);
    free(p);
    free(q);
    free(r);
    free(p);
    return NULL;
}

static void *free_in_thread(void *p)
{
    free(p);
    return NULL;
}

static void free_from_another_thread(void *p)
{
    pthread_t t;
    pthread_create(&t, NULL, free_in_thread, p);
    pthread_join(t, NULL);
}

/* Freed by its owner, then again by another thread. */
static void *cross_thread_double_free(size_t size)
{
    char *p = malloc(size), *q = malloc(size);
    announce(p);
    free(p);
    free(q);
    free_from_another_thread(p);
    return NULL;
}

/* Freed twice by another thread, the owner's blocks in between. */
static void *remote_double_free(size_t size)
{
    char *p = malloc(size), *q = malloc(size);
    announce(p);
    free_from_another_thread(p);
    free(q);
    free_from_another_thread(p);
    return NULL;
}

/* The thread's front to the arenas keeps a block of size once a malloc
 * of it found the bin empty: the cases above, after that, meet the block
 * waiting there. */
static void front_primed(size_t size)
{
    for (int i = 0; i < 3; i++) {
        void *volatile p = malloc(size); /* a malloc the compiler would drop with its free */
        free(p);
    }
}

static void *front_double_free(size_t size)
{
    front_primed(size);
    return double_free(size);
}

static void *front_delayed_double_free(size_t size)
{
    front_primed(size);
    return delayed_double_free(size);
}

static void *front_cross_thread_double_free(size_t size)
{
    front_primed(size);
    return cross_thread_double_free(size);
}

/* The program writes into the block it freed, where a front once kept
 * its mark (the second word), and frees it again: the mark is in the
 * arena's map, out of the program's reach. */
static void *front_double_free_after_write(size_t size)
{
    front_primed(size);
    char *p = malloc(size);
    announce(p);
    free(p);
    ((volatile uintptr_t *)p)[1] = 0;
    free(p);
    return NULL;
}

/* A block freed by a thread of another lane past that thread's full
 * front bin waits in its own lane's pool (other_lane.h), marked as in a
 * front: a second free of it is a double free. */
static void *pool_double_free(size_t size)
{
    enum { N = 8 };
    char *block[N];
    for (int i = 0; i < N; i++)
        block[i] = malloc(size);
    if (!other_lane_free(block, N, size))
        return NULL; /* no pool took them: the parent finds no message */
    announce(block[N - 1]);
    free(block[N - 1]);
    return NULL;
}

static void *interior_free(size_t size)
{
    char *p = malloc(size);
    char *inner = p + 16;
    announce(inner);
    free(inner);
    return p; /* the block itself must still be whole */
}

static void *interior_realloc(size_t size)
{
    char *p = malloc(size);
    char *inner = p + 32;
    announce(inner);
    void *q = realloc(inner, size * 2);
    return q ? NULL : p; /* realloc must refuse, leaving the block whole */
}

static const bad_case_t cases[] = {
    {"free of a stack pointer", "free(", "not allocated by hakmem", 0, free_stack},
    {"free of a global", "free(", "not allocated by hakmem", 0, free_global},
    {"free of another allocator's mapping", "free(", "not allocated by hakmem", 0, free_foreign_mapping},
    {"free of glibc's heap", "free(", "not allocated by hakmem", 100, free_glibc_block},
    {"realloc of a stack pointer", "realloc(", "not allocated by hakmem", 64, realloc_stack},
    {"realloc of a global", "realloc(", "not allocated by hakmem", 64, realloc_global},
    {"realloc of another allocator's mapping", "realloc(", "not allocated by hakmem", 64, realloc_foreign_mapping},
    {"realloc of glibc's heap", "realloc(", "not allocated by hakmem", 100, realloc_glibc_block},
    {"double free, tiny", "free(", "double free", 32, double_free},
    {"double free, 8 B", "free(", "double free", 8, double_free},
    {"double free, mid", "free(", "double free", 10000, double_free},
    {"double free, large", "free(", "freed", 5 << 20, double_free},
    {"delayed double free, tiny", "free(", "double free", 48, delayed_double_free},
    {"delayed double free, 8 B", "free(", "double free", 8, delayed_double_free},
    {"delayed double free, mid", "free(", "double free", 9000, delayed_double_free},
    {"delayed double free, large", "free(", "freed", 3 << 20, delayed_double_free},
    {"cross-thread double free, tiny", "free(", "double free", 64, cross_thread_double_free},
    {"cross-thread double free, mid", "free(", "double free", 14000, cross_thread_double_free},
    {"cross-thread double free, large", "free(", "freed", 4 << 20, cross_thread_double_free},
    {"remote double free, tiny", "free(", "double free", 96, remote_double_free},
    {"remote double free, mid", "free(", "double free", 12000, remote_double_free},
    {"interior pointer, tiny", "free(", "interior pointer", 64, interior_free},
    {"interior pointer, mid", "free(", "interior pointer", 5000, interior_free},
    {"interior pointer, large", "free(", "interior pointer", 3 << 20, interior_free},
    {"double free, arena", "free(", "double free", 400000, double_free},
    {"delayed double free, arena", "free(", "double free", 300000, delayed_double_free},
    {"cross-thread double free, arena", "free(", "double free", 350000, cross_thread_double_free},
    {"remote double free, arena", "free(", "double free", 100000, remote_double_free},
    {"interior pointer, arena", "free(", "interior pointer", 500000, interior_free},
    {"realloc of an arena block's interior", "realloc(", "interior pointer", 90000, interior_realloc},
    {"double free, arena front", "free(", "waits in a thread's front", 20000, front_double_free},
    {"delayed double free, arena front", "free(", "waits in a thread's front", 40000, front_delayed_double_free},
    {"cross-thread double free, arena front", "free(", "waits in a thread's front", 30000,
     front_cross_thread_double_free},
    {"double free after a write, arena front", "free(", "waits in a thread's front", 24000,
     front_double_free_after_write},
    {"interior pointer, arena front", "free(", "interior pointer", 50000, interior_free},
    {"double free, lane pool", "free(", "waits in a thread's front or its lane's pool", 20000, pool_double_free},
    {"double free, lane pool class", "free(", "waits in a thread's front or its lane's pool", 100000, pool_double_free},
    {"double free, arena front class", "free(", "waits in a thread's front", 200000, front_double_free},
    {"delayed double free, arena front class", "free(", "waits in a thread's front", 150000,
     front_delayed_double_free},
    {"cross-thread double free, arena front class", "free(", "waits in a thread's front", 100000,
     front_cross_thread_double_free},
    {"double free after a write, arena front class", "free(", "waits in a thread's front", 120000,
     front_double_free_after_write},
    {"realloc of an interior pointer", "realloc(", "interior pointer", 100, interior_realloc},
};

static int compare_pointers(const void *a, const void *b)
{
    uintptr_t x = *(const uintptr_t *)a, y = *(const uintptr_t *)b;
    return (x > y) - (x < y);
}

/* In warn mode the child goes on: the allocator must still be sound. The
 * next blocks of the size are all distinct (nothing handed out twice, the
 * block freed twice included), and a block that survived the bad call is
 * not handed out. */
static int after_warning_ok(void *bad, size_t size)
{
    enum { N = 300 };
    if (size == 0)
        size = 64;
    if (size > (1 << 20))
        size = 1 << 20;
    static void *blocks[N];
    int ok = 1;
    for (int i = 0; i < N; i++) {
        blocks[i] = malloc(size);
        ok &= blocks[i] && hak_owns(blocks[i]) && blocks[i] != bad;
    }
    qsort(blocks, N, sizeof blocks[0], compare_pointers);
    for (int i = 1; i < N; i++)
        ok &= (char *)blocks[i - 1] + size <= (char *)blocks[i];
    for (int i = 0; i < N; i++)
        free(blocks[i]);
    return ok;
}

static void run_case(const bad_case_t *c, int warn)
{
    int out[2], err[2];
    pipe(out);
    pipe(err);
    pid_t pid = fork();
    if (pid == 0) {
        dup2(out[1], STDOUT_FILENO);
        dup2(err[1], STDERR_FILENO);
        if (warn)
            setenv("HAKMEM_ON_ERROR", "warn", 1);
        /* Options are read at init: run the case in a fresh image. */
        exec_self((char *[]){"test_bad_input", "--case", (char *)c->name, NULL});
        _exit(99);
    }
    close(out[1]);
    close(err[1]);
    char pointer[64], message[1024];
    read_to_end(out[0], pointer, sizeof pointer);
    read_to_end(err[0], message, sizeof message);
    int status = 0;
    waitpid(pid, &status, 0);
    char *newline = strchr(pointer, '\n');
    if (newline)
        *newline = 0;
    char expected[128];
    snprintf(expected, sizeof expected, "hakmem: %s%s)", c->call, pointer);
    int named = strstr(message, expected) != NULL;
    int diagnosed = strstr(message, c->fault) != NULL;
    int one_line = strchr(message, '\n') == message + strlen(message) - 1;
    int outcome = warn ? WIFEXITED(status) && WEXITSTATUS(status) == 0
                       : WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT;
    if (!(named && diagnosed && one_line && outcome))
        fprintf(stderr, "case '%s' (%s): expected '%s' and '%s', got status %#x and: %s\n", c->name,
                warn ? "warn" : "abort", expected, c->fault, status, message);
    CHECK(named);
    CHECK(diagnosed);
    CHECK(one_line);
    CHECK(outcome);
}

int main(int argc, char **argv)
{
    size_t count = sizeof cases / sizeof cases[0];
    hak_stats_t stats;
    hak_stats_get(&stats);
    check_expected_build();
    if (argc == 3 && strcmp(argv[1], "--case") == 0) {
        for (size_t i = 0; i < count; i++)
            if (strcmp(cases[i].name, argv[2]) == 0) {
                void *bad = cases[i].run(cases[i].size);
                return after_warning_ok(bad, cases[i].size) ? 0 : 3;
            }
        return 98;
    }
    for (size_t i = 0; i < count; i++) {
        if (strstr(cases[i].name, "lane pool") && !other_lane_pools())
            continue; /* no pools (or one lane), no block waits in one */
        run_case(&cases[i], 0);
        run_case(&cases[i], 1);
    }
    printf("test_bad_input: %zu cases (%s build)\n", count, stats.hardened ? "hardened" : "default");
    return check_summary("test_bad_input");
}
