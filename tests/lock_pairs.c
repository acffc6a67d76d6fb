/* malloc/free pairs of one size, for locked_instructions.py: each pair
 * writes a byte a page of its block, as a program fills a buffer (the
 * loop that leaves stores draining when the free runs). It first prints
 * where the malloc it calls was loaded (dladdr), so that the script can
 * tell that library's instructions apart.
 * Usage: lock_pairs SIZE PAIRS */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv)
{
    if (argc != 3)
        return fprintf(stderr, "usage: lock_pairs SIZE PAIRS\n"), 2;
    size_t size = strtoul(argv[1], NULL, 0);
    long pairs = atol(argv[2]);
    Dl_info info;
    if (!dladdr((void *)&malloc, &info))
        return fprintf(stderr, "lock_pairs: dladdr found no object for malloc\n"), 1;
    printf("malloc from %s at %p\n", info.dli_fname, info.dli_fbase);
    fflush(stdout);
    for (long i = 0; i < pairs; i++) {
        char *volatile p = malloc(size);
        if (!p)
            return fprintf(stderr, "lock_pairs: malloc(%zu) failed\n", size), 1;
        for (size_t at = 0; at < size; at += 4096)
            p[at] = (char)i;
        free(p);
    }
    return 0;
}
