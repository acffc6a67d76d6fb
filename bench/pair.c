/* The loops whose instructions callgrind counts: malloc(16)+free, and a
 * ring of 1000 live 16 B blocks with the oldest freed. The runner takes the
 * difference between two iteration counts, which cancels start-up.
 * Usage: pair lifo|ring ITERATIONS */
#include "common.h"

int main(int argc, char **argv)
{
    if (argc != 3)
        return 2;
    long n = atol(argv[2]);
    if (!strcmp(argv[1], "lifo")) {
        for (long i = 0; i < n; i++) {
            void *p = malloc(16);
            escape(p);
            free(p);
        }
    } else {
        enum { RING = 1000 };
        static void *ring[RING];
        for (int i = 0; i < RING; i++)
            ring[i] = malloc(16);
        for (long i = 0; i < n; i++) {
            free(ring[i % RING]);
            ring[i % RING] = malloc(16);
        }
    }
    return 0;
}
