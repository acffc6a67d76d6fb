/* A program that knows nothing of hakmem, run by test_address_space under
 * a limit of address space with the C library's malloc and with hakmem
 * preloaded:
 *
 *   address_space_probe start        VmSize after a first small malloc
 *   address_space_probe fill SPEC    allocates until malloc fails
 *
 * SPEC is a block size in bytes, or "mixed": sizes drawn from 16 B to
 * 1 MiB, as many of each doubling (a fixed seed, so both runs ask for the
 * same blocks), never freed. fill touches a byte a page of each block, and prints the
 * bytes it got and how many of its blocks hakmem says are its own
 * (hak_owns, looked up at run time: 0 where hakmem is not loaded). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static size_t vm_size_kib(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    size_t kib = 0;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "VmSize: %zu kB", &kib) == 1)
            break;
    if (f)
        fclose(f);
    return kib;
}

static uint64_t rng = 0x9e3779b97f4a7c15ull;

static uint64_t next_random(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

/* 16 B << k, k uniform over 0..16, then a uniform fraction more. */
static size_t mixed_size(void)
{
    unsigned k = (unsigned)(next_random() % 17);
    size_t base = (size_t)16 << k;
    return base + next_random() % base;
}

int main(int argc, char **argv)
{
    if (argc == 2 && !strcmp(argv[1], "start")) {
        void *volatile p = malloc(1);
        printf("%zu\n", vm_size_kib());
        free(p);
        return 0;
    }
    if (argc != 3 || strcmp(argv[1], "fill")) {
        fprintf(stderr, "usage: address_space_probe start | fill SIZE|mixed\n");
        return 2;
    }
    bool mixed = !strcmp(argv[2], "mixed");
    size_t fixed = mixed ? 0 : strtoull(argv[2], NULL, 0);
    bool (*owns)(const void *) = (bool (*)(const void *))dlsym(RTLD_DEFAULT, "hak_owns");
    size_t n = 0, bytes = 0, owned = 0;
    errno = 0;
    for (;;) {
        size_t size = mixed ? mixed_size() : fixed;
        char *p = malloc(size);
        if (!p)
            break;
        for (size_t at = 0; at < size; at += 4096)
            p[at] = 1;
        p[size - 1] = 1;
        n++;
        bytes += size;
        owned += owns && owns(p);
    }
    int failure = errno;
    printf("%zu %zu %zu %d\n", bytes, n, owned, failure);
    return 0; /* the blocks go with the process */
}
