/* Resident set size of the test process, from /proc/self/smaps_rollup. */
#ifndef HAKMEM_TEST_RSS_H
#define HAKMEM_TEST_RSS_H

#include <stdio.h>

static inline size_t rss_bytes(void)
{
    FILE *f = fopen("/proc/self/smaps_rollup", "r");
    char line[256];
    size_t kib = 0;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "Rss: %zu kB", &kib) == 1)
            break;
    if (f)
        fclose(f);
    return kib * 1024;
}

#endif
