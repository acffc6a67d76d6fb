/* What the kernel reports for the test process: the resident set from
 * /proc/self/smaps_rollup in bytes (all of it, or less the pages MADV_FREE
 * gave back, or the program's own under an emulator), any "Name: N kB"
 * line of a /proc file, and the threads. */
#ifndef HAKMEM_TEST_RSS_H
#define HAKMEM_TEST_RSS_H

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Read with open and read, not stdio: fopen allocates, and an allocation
 * can run hakmem's due purges (HAKMEM_PURGE_THREAD=0), so a reading would
 * change what it measures. */
static inline size_t proc_field(const char *path, const char *format)
{
    char text[8192];
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    ssize_t len = fd >= 0 ? read(fd, text, sizeof text - 1) : -1;
    if (fd >= 0)
        close(fd);
    if (len <= 0)
        return 0;
    text[len] = '\0';
    size_t value = 0;
    for (char *line = text; line; line = strchr(line, '\n') ? strchr(line, '\n') + 1 : NULL)
        if (sscanf(line, format, &value) == 1)
            return value;
    return 0;
}

static inline size_t proc_kib_field_bytes(const char *path, const char *format)
{
    return proc_field(path, format) * 1024;
}

static inline size_t rss_bytes(void) { return proc_kib_field_bytes("/proc/self/smaps_rollup", "Rss: %zu kB"); }

/* The proportional set: a page mapped twice in the process (meshing's
 * shared pages, src/mesh.c) counts once, where Rss counts it twice. */
static inline size_t pss_bytes(void) { return proc_kib_field_bytes("/proc/self/smaps_rollup", "Pss: %zu kB"); }

/* The resident set less the pages given back with MADV_FREE
 * (HAKMEM_PURGE_ADVICE=free), which stay in it, as LazyFree, until the
 * kernel needs them. */
static inline size_t rss_held_bytes(void)
{
    size_t rss = rss_bytes(), lazy = proc_kib_field_bytes("/proc/self/smaps_rollup", "LazyFree: %zu kB");
    return rss > lazy ? rss - lazy : 0;
}

/* The resident set of the program's own mappings. Under an emulator
 * (TEST_EMULATOR: qemu-user) smaps_rollup describes the emulator's
 * process, which keeps memory after each thread the program ran exits
 * (10-16 MiB a thread under Debian 12's qemu 7.2), while
 * /proc/self/smaps lists the program's mappings alone: their Rss summed,
 * read in pieces into a static buffer (no allocation, as above). */
static inline size_t program_rss_bytes(void)
{
    const char *emulator = getenv("TEST_EMULATOR");
    if (!emulator || !*emulator)
        return rss_bytes();
    static char text[16384];
    int fd = open("/proc/self/smaps", O_RDONLY | O_CLOEXEC);
    size_t kib = 0, held = 0;
    for (ssize_t len; fd >= 0 && (len = read(fd, text + held, sizeof text - 1 - held)) > 0;) {
        held += (size_t)len;
        text[held] = '\0';
        char *line = text;
        for (char *end; (end = strchr(line, '\n')); line = end + 1) {
            size_t value;
            if (sscanf(line, "Rss: %zu kB", &value) == 1)
                kib += value;
        }
        held = strlen(line); /* the part of a line the next read completes */
        memmove(text, line, held);
    }
    if (fd >= 0)
        close(fd);
    return kib * 1024;
}

/* The threads of the process (0 if unread): the purger thread's start
 * and exit show here. */
static inline int thread_count(void) { return (int)proc_field("/proc/self/status", "Threads: %zu"); }

#endif
