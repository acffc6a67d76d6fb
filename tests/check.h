/* A minimal check harness: CHECK counts, reports the failing expression,
 * and check_summary() prints "N passed, N failed" and gives the exit code. */
#ifndef HAKMEM_TEST_CHECK_H
#define HAKMEM_TEST_CHECK_H

#include "hakmem.h"

#ifdef HAKMEM_TEST_HAK_NAMES
#include "hak_names.h"
#endif

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#if !defined(__GLIBC__) && !defined(HAKMEM_TEST_HAK_NAMES)
/* glibc's malloc_trim and pvalloc, which hakmem exports on any C library
 * and musl's headers do not declare. */
int malloc_trim(size_t pad);
void *pvalloc(size_t size);
#endif

static int checks_passed, checks_failed;

/* The page hakmem lays out by: the kernel's, or a test build's larger
 * HAKMEM_PAGE_SIZE (os_page_size). */
static inline size_t hakmem_page(void)
{
#ifdef HAKMEM_PAGE_SIZE
    return HAKMEM_PAGE_SIZE;
#else
    return (size_t)sysconf(_SC_PAGESIZE);
#endif
}

/* Where the tests of another CPU run under an emulator, TEST_EMULATOR
 * names it ("qemu-aarch64 -L /usr/aarch64-linux-gnu"). */
static inline const char *test_emulator(void)
{
    const char *emulator = getenv("TEST_EMULATOR");
    return emulator && *emulator ? emulator : NULL;
}

/* This program again in a fresh image, with args (NULL-terminated, args[0]
 * its name), as a forked child's last act; returns only if that fails.
 * Under an emulator, through it: the kernel cannot run the program's file
 * itself there. */
static inline void exec_self(char *const args[])
{
    const char *emulator = test_emulator();
    if (!emulator) {
        execv("/proc/self/exe", args);
        return;
    }
    static char self[4096], words[512];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1); /* the emulator names the program's file */
    if (n <= 0)
        return;
    self[n] = 0;
    snprintf(words, sizeof words, "%s", emulator);
    char *argv[64];
    int k = 0;
    for (char *w = strtok(words, " "); w && k < 32; w = strtok(NULL, " "))
        argv[k++] = w;
    argv[k++] = self;
    for (int i = 1; args[i] && k < 63; i++)
        argv[k++] = args[i];
    argv[k] = NULL;
    execvp(argv[0], argv);
}

/* Whether a forked child of a process of several threads may start
 * threads: not under Debian 12's qemu-user (7.2), which aborts there
 * ("qemu_plugin_vcpu_init_hook: assertion failed"), with or without
 * hakmem. Where it may not, the child runs the thread's function itself. */
static inline bool threads_after_fork(void) { return test_emulator() == NULL; }

/* What a child writes on a pipe, up to size - 1 bytes, NUL-terminated; the
 * descriptor is closed. */
static inline void read_to_end(int fd, char *buf, size_t size)
{
    size_t got = 0;
    ssize_t n;
    while (got + 1 < size && (n = read(fd, buf + got, size - 1 - got)) > 0)
        got += (size_t)n;
    buf[got] = 0;
    close(fd);
    /* qemu-user's own line on a signal that ends the program is not the
     * program's */
    static const char qemu[] = "qemu: uncaught target signal";
    char *line = test_emulator() ? strstr(buf, qemu) : NULL;
    if (line) {
        char *next = strchr(line, '\n');
        next = next ? next + 1 : line + strlen(line);
        memmove(line, next, strlen(next) + 1);
    }
}

#define CHECK(cond)                                                                    \
    do {                                                                               \
        if (cond) {                                                                    \
            checks_passed++;                                                           \
        } else {                                                                       \
            checks_failed++;                                                           \
            if (checks_failed <= 20)                                                   \
                fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
        }                                                                              \
    } while (0)

/* The clock of timed checks, which skip themselves where a loaded machine
 * took longer than their premise allows. */
static inline double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* The secure_ tests preload the hardened library and say EXPECT_HARDENED:
 * it must be the one serving (hak_stats_get resolves to it). */
static inline void check_expected_build(void)
{
    if (getenv("EXPECT_HARDENED")) {
        hak_stats_t s;
        hak_stats_get(&s);
        CHECK(s.hardened);
    }
}

static inline uint64_t samples_taken(void)
{
    hak_kpi_t kpi;
    hak_get_kpi(&kpi);
    return kpi.latency_samples;
}

/* malloc(size) served by the thread's heap. Profiling samples about one
 * allocation per HAKMEM_PROFILE_SAMPLE bytes allocated, at random, and
 * serves it from elsewhere while the block it took goes back to the
 * cache: a test that expects a certain block frees a sampled one and takes
 * again (CI once drew a sample inside test_batch_refill's loop, and
 * test_secure's overwritten link was a sample's, in no list, once in a
 * hundred runs or so). */
static inline char *heap_malloc(size_t size)
{
    for (;;) {
        uint64_t samples = samples_taken();
        char *p = malloc(size);
        if (samples_taken() == samples)
            return p;
        free(p);
    }
}

/* The purger thread runs (HAKMEM_PURGE_THREAD, on by default; off as
 * options.c reads a boolean): without it, pages go back inside allocator
 * calls only. */
static inline bool purge_thread_on(void)
{
    static const char *const off[] = {"0", "false", "no", "off"};
    const char *v = getenv("HAKMEM_PURGE_THREAD");
    for (unsigned i = 0; v && i < sizeof off / sizeof off[0]; i++)
        if (strcasecmp(v, off[i]) == 0)
            return false;
    return true;
}

/* For a check that memory goes back with no call: true (and says so)
 * where there is no purger thread to give it back. */
static inline bool skipped_without_purge_thread(const char *check)
{
    if (purge_thread_on())
        return false;
    printf("%s: skipped, HAKMEM_PURGE_THREAD=0\n", check);
    return true;
}

/* The lanes' pools are on (HAKMEM_ARENA_POOL, off by default; the ctests
 * that turn them on set 1M, which the tests' counts assume). */
static inline bool arena_pools_on(void)
{
    const char *v = getenv("HAKMEM_ARENA_POOL");
    return v && strtoull(v, NULL, 10) > 0; /* "0K" is off as "0" is */
}

/* Under HAKMEM_MESH=stress (ctest's mesh_* runs of the thread, fork and
 * soak tests) the run must have meshed, where the system lets hakmem
 * mesh at all (not under qemu, which has no userfaultfd). */
static inline void check_meshed_under_stress(void)
{
    const char *mode = getenv("HAKMEM_MESH");
    if (!mode || strcmp(mode, "stress") != 0)
        return;
    hak_stats_t s;
    hak_stats_get(&s);
    CHECK(!s.meshing || s.mesh_pages_ever > 0);
}

static inline int check_summary(const char *name)
{
    printf("%s: %d passed, %d failed\n", name, checks_passed, checks_failed);
    return checks_failed ? 1 : 0;
}

#endif
