/* Tiny-tier throughput: M ops/s (one op = a malloc or a free) for the
 * patterns lifo, fifo, random, interleaved, longlived at one size.
 * Usage: tiny PATTERN SIZE OPS */
#include "common.h"

enum { BATCH = 1000 };

int main(int argc, char **argv)
{
    if (argc != 4)
        return fprintf(stderr, "usage: tiny lifo|fifo|random|interleaved|longlived SIZE OPS\n"), 2;
    const char *pattern = argv[1];
    size_t size = strtoul(argv[2], NULL, 10);
    long ops = atol(argv[3]);
    void **slots = malloc(sizeof(void *) * 100000);
    uint64_t seed = 88172645463325252ull;
    long done = 0;
    double start = now_ns();
    if (!strcmp(pattern, "lifo")) { /* a batch, freed newest first */
        while (done < ops) {
            for (int i = 0; i < BATCH; i++)
                slots[i] = malloc(size);
            for (int i = BATCH; i-- > 0;)
                free(slots[i]);
            done += 2 * BATCH;
        }
    } else if (!strcmp(pattern, "fifo")) { /* a batch, freed oldest first */
        while (done < ops) {
            for (int i = 0; i < BATCH; i++)
                slots[i] = malloc(size);
            for (int i = 0; i < BATCH; i++)
                free(slots[i]);
            done += 2 * BATCH;
        }
    } else if (!strcmp(pattern, "random")) { /* a batch, freed in random order */
        while (done < ops) {
            for (int i = 0; i < BATCH; i++)
                slots[i] = malloc(size);
            for (int i = BATCH; i > 1; i--) {
                int j = (int)(rng_next(&seed) % (uint64_t)i);
                void *t = slots[i - 1];
                slots[i - 1] = slots[j];
                slots[j] = t;
            }
            for (int i = 0; i < BATCH; i++)
                free(slots[i]);
            done += 2 * BATCH;
        }
    } else if (!strcmp(pattern, "interleaved")) { /* malloc, free, malloc, free */
        while (done < ops) {
            void *p = malloc(size);
            escape(p);
            free(p);
            done += 2;
        }
    } else if (!strcmp(pattern, "longlived")) { /* 100k live blocks, one replaced per step */
        for (int i = 0; i < 100000; i++)
            slots[i] = malloc(size);
        start = now_ns();
        while (done < ops) {
            size_t i = rng_next(&seed) % 100000;
            free(slots[i]);
            slots[i] = malloc(size);
            done += 2;
        }
    } else {
        return fprintf(stderr, "tiny: unknown pattern %s\n", pattern), 2;
    }
    double elapsed = now_ns() - start;
    report("mops", (double)done / elapsed * 1e3);
    return 0;
}
