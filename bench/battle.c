/* The battle scenarios: json (64 KiB blocks), mir (256 KiB), vm (2 MiB),
 * mixed (the three interleaved with a small live set). One iteration
 * allocates, touches every page and frees; we report its median, P95 and
 * P99 in ns, soft page faults per iteration and RSS at the end.
 * Usage: battle json|mir|vm|mixed ITERATIONS */
#include "common.h"

#include <unistd.h>

static void touch(char *p, size_t size, int value)
{
    for (size_t i = 0; i < size; i += 4096)
        p[i] = (char)value;
    p[size - 1] = (char)value;
}

int main(int argc, char **argv)
{
    if (argc != 3)
        return fprintf(stderr, "usage: battle json|mir|vm|mixed ITERATIONS\n"), 2;
    const char *name = argv[1];
    long iterations = atol(argv[2]);
    static const size_t mixed_sizes[] = {64 << 10, 256 << 10, 2 << 20, 8 << 10, 100 << 10};
    size_t fixed = !strcmp(name, "json") ? 64 << 10 : !strcmp(name, "mir") ? 256 << 10
                 : !strcmp(name, "vm") ? 2 << 20 : 0;
    if (!fixed && strcmp(name, "mixed"))
        return fprintf(stderr, "battle: unknown scenario %s\n", name), 2;
    double *ns = malloc(sizeof(double) * (size_t)iterations);
    enum { LIVE = 8 };
    char *live[LIVE] = {0};
    long faults_before = soft_faults();
    for (long i = 0; i < iterations; i++) {
        size_t size = fixed ? fixed : mixed_sizes[i % 5];
        double t0 = now_ns();
        char *p = malloc(size);
        touch(p, size, (int)i);
        if (fixed) {
            free(p);
        } else { /* mixed keeps a rotating live set */
            free(live[i % LIVE]);
            live[i % LIVE] = p;
        }
        ns[i] = now_ns() - t0;
    }
    long faults = soft_faults() - faults_before;
    size_t rss = rss_bytes();
    for (int i = 0; i < LIVE; i++)
        free(live[i]);
    report("faults_per_iter", (double)faults / (double)iterations);
    report("rss_mib", (double)rss / 1048576.0);
    report("p95_ns", percentile(ns, (size_t)iterations, 0.95));
    report("p99_ns", percentile(ns, (size_t)iterations, 0.99));
    report("median_ns", percentile(ns, (size_t)iterations, 0.50));
    return 0;
}
