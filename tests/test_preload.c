/* Run under LD_PRELOAD=libhakmem.so, not linked with it: every allocation
 * the program makes, through libc too, must come from hakmem. If the
 * preload silently fell back to glibc, hak_owns would be missing or false. */
#define _GNU_SOURCE
#include "check.h"

#include <dlfcn.h>
#include <malloc.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
    return check_summary("test_preload");
}
