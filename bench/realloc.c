/* realloc workloads:
 *  strings: string builders of 8..64 B grown a byte-chunk at a time by
 *           realloc, many alive at once;
 *  cycle:   one block reallocated up and down across 16 B .. 1 MiB.
 * Reports M realloc calls/s. Usage: realloc strings|cycle CALLS */
#include "common.h"

int main(int argc, char **argv)
{
    if (argc != 3)
        return fprintf(stderr, "usage: realloc strings|cycle CALLS\n"), 2;
    long calls = atol(argv[2]), done = 0;
    uint64_t seed = 77;
    double start = now_ns();
    if (!strcmp(argv[1], "strings")) {
        enum { LIVE = 4096 };
        static char *s[LIVE];
        static size_t len[LIVE];
        while (done < calls) {
            size_t i = rng_next(&seed) % LIVE;
            size_t grow = 1 + rng_next(&seed) % 8;
            if (len[i] + grow > 64) {
                free(s[i]);
                s[i] = NULL;
                len[i] = 0;
            }
            s[i] = realloc(s[i], len[i] + grow);
            memset(s[i] + len[i], 'a', grow);
            len[i] += grow;
            done++;
        }
        for (int i = 0; i < LIVE; i++)
            free(s[i]);
    } else if (!strcmp(argv[1], "cycle")) {
        char *p = NULL;
        size_t size = 16;
        int up = 1;
        while (done < calls) {
            p = realloc(p, size);
            p[size - 1] = 1;
            size = up ? size * 2 : size / 2;
            if (size >= (1 << 20))
                up = 0;
            if (size <= 16)
                up = 1;
            done++;
        }
        free(p);
    } else {
        return 2;
    }
    report("mops", (double)done / (now_ns() - start) * 1e3);
    return 0;
}
