/* The battle scenarios: json (64 KiB blocks), mir (256 KiB), vm (2 MiB),
 * mixed (the three interleaved with a small live set): one iteration
 * allocates, touches every page and frees. buffers: one iteration takes a
 * set of 8 buffers of 1.25..1.75 MiB from one call site, touches them and
 * frees them all, as a decoder with its frames; it runs for a second
 * (SAMPLES at most, 16 at least), long enough for a self-tuning policy to
 * learn, where the others end within milliseconds: a count of samples
 * gave 43 ms to the fast allocators, a window and a half of the tuner's,
 * and 51 s to glibc. grow: one iteration takes a 64 KiB buffer and
 * doubles it by realloc up to 4 MiB, touching each new page, then frees
 * it, as a program reading a file of unknown size. varied: 16 live buffers
 * of 1 to 8 MiB from one call site; one iteration frees one at random and
 * takes one of a random size, as an image or archive tool with inputs of
 * every size. Each sample times a batch of
 * iterations (16, or 1 for vm, buffers, grow and varied) so that the clock's own cost and its
 * resolution (10 ns on some VMs) do not swamp the figure; we report the
 * median, P95 and P99 of the samples in ns per iteration, their mean (where
 * the rare slow iteration weighs: varied's misses), soft page faults
 * per iteration and RSS at the end.
 * Usage: battle json|mir|vm|mixed|buffers|grow|varied SAMPLES */
#include "common.h"

#include <dlfcn.h>
#include <unistd.h>

#include "hakmem.h" /* for hak_stats_t only: the library is found with dlsym */

/* Every page of the block, and its last byte (size > 0). */
static void touch(char *p, size_t size, int value)
{
    for (size_t i = 0; i < size; i += 4096)
        p[i] = (char)value;
    p[size - 1 + !size] = (char)value;
}

int main(int argc, char **argv)
{
    if (argc != 3)
        return fprintf(stderr, "usage: battle json|mir|vm|mixed|buffers|grow|varied SAMPLES\n"), 2;
    const char *name = argv[1];
    long samples = atol(argv[2]);
    static const size_t mixed_sizes[] = {64 << 10, 256 << 10, 2 << 20, 8 << 10, 100 << 10};
    size_t fixed = !strcmp(name, "json") ? 64 << 10 : !strcmp(name, "mir") ? 256 << 10
                 : !strcmp(name, "vm") ? 2 << 20 : 0;
    bool buffers = !strcmp(name, "buffers"), grow = !strcmp(name, "grow"), varied = !strcmp(name, "varied");
    if (!fixed && strcmp(name, "mixed") && !buffers && !grow && !varied)
        return fprintf(stderr, "battle: unknown scenario %s\n", name), 2;
    long batch = !strcmp(name, "vm") || buffers || grow || varied ? 1 : 16, iterations = samples * batch;
    double *ns = malloc(sizeof(double) * (size_t)samples);
    enum { LIVE = 8, VARIED_LIVE = 16 };
    char *live[VARIED_LIVE] = {0};
    uint64_t rng = 88172645463325252ull;
    long faults_before = soft_faults();
    double deadline = now_ns() + 1e9; /* buffers' second */
    for (long s = 0, i = 0; s < samples; s++) {
        if (buffers && s >= 16 && now_ns() >= deadline) {
            samples = s;
            iterations = s * batch;
            break;
        }
        double t0 = now_ns();
        for (long end = i + batch; i < end; i++) {
            if (buffers) {
                char *frame[LIVE];
                for (int k = 0; k < LIVE; k++) {
                    size_t size = ((size_t)5 << 18) + (size_t)k * (64 << 10);
                    frame[k] = malloc(size);
                    touch(frame[k], size, (int)i);
                }
                for (int k = 0; k < LIVE; k++)
                    free(frame[k]);
                continue;
            }
            if (varied) {
                rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
                size_t size = ((size_t)1 << 20) + (size_t)(rng >> 8) % ((size_t)7 << 20);
                char **slot = &live[(rng >> 4) % VARIED_LIVE];
                free(*slot);
                *slot = malloc(size);
                touch(*slot, size, (int)i);
                continue;
            }
            if (grow) {
                size_t size = 64 << 10;
                char *p = malloc(size);
                touch(p, size, (int)i);
                for (; size < (4 << 20); size *= 2) {
                    p = realloc(p, size * 2);
                    touch(p + size, size, (int)i);
                }
                free(p);
                continue;
            }
            size_t size = fixed ? fixed : mixed_sizes[i % 5];
            char *p = malloc(size);
            touch(p, size, (int)i);
            if (fixed) {
                free(p);
            } else { /* mixed keeps a rotating live set */
                free(live[i % LIVE]);
                live[i % LIVE] = p;
            }
        }
        ns[s] = (now_ns() - t0) / (double)batch;
    }
    long faults = soft_faults() - faults_before;
    size_t rss = rss_bytes();
    for (int i = 0; i < VARIED_LIVE; i++)
        free(live[i]);
    /* Under hakmem, BigCache's hit rate (the large blocks it reused). */
    void (*stats_get)(hak_stats_t *) = (void (*)(hak_stats_t *))dlsym(RTLD_DEFAULT, "hak_stats_get");
    if (stats_get) {
        hak_stats_t st;
        stats_get(&st);
        if (st.bigcache_hits + st.bigcache_misses)
            report("bigcache_hit_pct", 100.0 * (double)st.bigcache_hits /
                                           (double)(st.bigcache_hits + st.bigcache_misses));
    }
    report("faults_per_iter", (double)faults / (double)iterations);
    report("rss_mib", (double)rss / 1048576.0);
    report("p95_ns", percentile(ns, (size_t)samples, 0.95));
    report("p99_ns", percentile(ns, (size_t)samples, 0.99));
    report("median_ns", percentile(ns, (size_t)samples, 0.50));
    double total = 0;
    for (long s = 0; s < samples; s++)
        total += ns[s];
    report("mean_ns", total / (double)samples);
    return 0;
}
