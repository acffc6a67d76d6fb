/* Sizes the kernel reports for the test process, in bytes: the resident set
 * from /proc/self/smaps_rollup, and any "Name: N kB" line of a /proc file. */
#ifndef HAKMEM_TEST_RSS_H
#define HAKMEM_TEST_RSS_H

#include <stdio.h>

static inline size_t proc_kib_field_bytes(const char *path, const char *format)
{
    FILE *f = fopen(path, "r");
    char line[256];
    size_t kib = 0;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, format, &kib) == 1)
            break;
    if (f)
        fclose(f);
    return kib * 1024;
}

static inline size_t rss_bytes(void) { return proc_kib_field_bytes("/proc/self/smaps_rollup", "Rss: %zu kB"); }

#endif
