/* Fragmentation of a long-running server: a key-value store, built the
 * way redis builds one (an entry, a key string and a value, three blocks a
 * key), is filled with KEYS values of 100..1000 bytes, loses a random 70%
 * of them, and is filled again up to the same live bytes with values of
 * 1..4 KiB. After each phase the program idles SETTLE_MS (a server between
 * bursts: the allocators' purgers run) and reads its RSS; the figure is RSS
 * over the live bytes the program asked for (requests, not the allocator's
 * rounded sizes), from which the program's own few pages are subtracted as
 * the reading before the first allocation. Every value is written whole,
 * as a server writes what it receives.
 *
 * After the deletion every page of values keeps a few live ones, so no
 * allocator that never moves a block can give pages back, and values of
 * the refill's other sizes cannot use the holes: the ratios measure what
 * compaction (meshing) could return. The proportional set (Pss) is read
 * too: a page mapped at two addresses (meshing's) counts once there and
 * twice in RSS. With "trim" the program calls malloc_trim(0) before each
 * reading, as a server may when its data shrank (hakmem meshes there,
 * HAKMEM_MESH=on). Usage: frag KEYS [SETTLE_MS [trim]] */
#include "common.h"

#include <malloc.h>
#include <stdbool.h>
#include <unistd.h>

struct entry {
    struct entry *next; /* the bucket's chain */
    char *key;
    char *value;
    size_t value_size;
};

static struct entry **buckets;
static size_t bucket_count;
static double live; /* bytes requested and not freed */

static size_t hash(const char *s)
{
    size_t h = 1469598103934665603ull;
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

static void *take(size_t size)
{
    void *p = malloc(size);
    if (!p)
        fprintf(stderr, "frag: out of memory at %zu bytes\n", size), exit(1);
    live += (double)size;
    return p;
}

static void give(void *p, size_t size)
{
    free(p);
    live -= (double)size;
}

static void insert(long id, size_t value_size, uint64_t *seed)
{
    char name[32];
    size_t len = (size_t)snprintf(name, sizeof name, "key:%ld", id) + 1;
    struct entry *e = take(sizeof *e);
    e->key = take(len);
    memcpy(e->key, name, len);
    e->value = take(value_size);
    e->value_size = value_size;
    memset(e->value, (int)(rng_next(seed) & 0xff), value_size);
    struct entry **b = &buckets[hash(name) % bucket_count];
    e->next = *b;
    *b = e;
}

static void erase(struct entry **link)
{
    struct entry *e = *link;
    *link = e->next;
    give(e->value, e->value_size);
    give(e->key, strlen(e->key) + 1);
    give(e, sizeof *e);
}

static bool trim;

static void settle_and_report(const char *phase, long settle_ms, size_t baseline, size_t pss_baseline)
{
    char metric[64];
    if (trim) {
        double start = now_ns();
        malloc_trim(0);
        snprintf(metric, sizeof metric, "trim_ms_%s", phase);
        report(metric, (now_ns() - start) / 1e6);
    }
    usleep((useconds_t)settle_ms * 1000);
    size_t rss = rss_bytes(), pss = pss_bytes();
    rss = rss > baseline ? rss - baseline : 0;
    pss = pss > pss_baseline ? pss - pss_baseline : 0;
    snprintf(metric, sizeof metric, "live_mib_%s", phase);
    report(metric, live / 1048576.0);
    snprintf(metric, sizeof metric, "rss_mib_%s", phase);
    report(metric, (double)rss / 1048576.0);
    snprintf(metric, sizeof metric, "rss_per_live_%s", phase);
    report(metric, (double)rss / live);
    snprintf(metric, sizeof metric, "pss_per_live_%s", phase);
    report(metric, (double)pss / live);
}

int main(int argc, char **argv)
{
    if (argc < 2 || argc > 4 || atol(argv[1]) <= 0 || (argc > 3 && strcmp(argv[3], "trim") != 0))
        return fprintf(stderr, "usage: frag KEYS [SETTLE_MS [trim]]\n"), 2;
    long keys = atol(argv[1]), settle_ms = argc > 2 ? atol(argv[2]) : 1000;
    trim = argc > 3;
    /* The table is the program's, not the store's: taken and written
     * before the baseline (calloc's fresh pages would fault in during the
     * fill otherwise), and never resized (a rehash would free and take a
     * block as large as the table in the middle of the phases). */
    bucket_count = (size_t)keys;
    buckets = calloc(bucket_count, sizeof *buckets);
    memset(buckets, 0, bucket_count * sizeof *buckets);
    rss_bytes(); /* faults in the reading's own code and stack */
    pss_bytes();
    size_t baseline = rss_bytes(), pss_baseline = pss_bytes();
    uint64_t seed = 0x9e3779b97f4a7c15ull;
    double start = now_ns(), busy = 0;
    long id = 0;

    for (; id < keys; id++)
        insert(id, 100 + rng_next(&seed) % 901, &seed);
    double filled = live;
    busy += now_ns() - start;
    settle_and_report("filled", settle_ms, baseline, pss_baseline);

    start = now_ns();
    long operations = keys;
    for (size_t b = 0; b < bucket_count; b++)
        for (struct entry **link = &buckets[b]; *link;) {
            if (rng_next(&seed) % 10 < 7) {
                erase(link);
                operations++;
            } else {
                link = &(*link)->next;
            }
        }
    busy += now_ns() - start;
    settle_and_report("deleted", settle_ms, baseline, pss_baseline);

    start = now_ns();
    for (; live < filled; id++, operations++)
        insert(id, 1024 + rng_next(&seed) % 3073, &seed);
    busy += now_ns() - start;
    settle_and_report("refilled", settle_ms, baseline, pss_baseline);
    report("kops", (double)operations / busy * 1e6);

    for (size_t b = 0; b < bucket_count; b++)
        while (buckets[b])
            erase(&buckets[b]);
    free(buckets);
    return 0;
}
