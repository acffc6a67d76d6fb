/* Multi-threaded workloads, at T threads:
 *  larson:   each thread replaces random slots of a shared table, so most
 *            frees hit blocks another thread allocated (sizes 8..1024 B);
 *  prodcons: T/2 producers hand blocks to T/2 consumers that free them
 *            (one producer and one consumer at T = 1);
 *  churn:    threads that allocate, exit, and whose blocks others free.
 * Reports M ops/s (a malloc or a free is one op) and RSS at the end.
 * Usage: threads larson|prodcons|churn THREADS OPS_PER_THREAD */
#include "common.h"

#include <pthread.h>
#include <stdatomic.h>

static long ops_per_thread;
static int nthreads;

enum { TABLE = 1 << 14 };
static _Atomic(void *) table[TABLE];

static void *larson(void *arg)
{
    uint64_t seed = 0x9E3779B97F4A7C15ull * ((uintptr_t)arg + 1);
    for (long i = 0; i < ops_per_thread; i += 2) {
        uint64_t r = rng_next(&seed);
        void *fresh = malloc(8 + (r >> 20) % 1017);
        escape(fresh);
        free(atomic_exchange(&table[r % TABLE], fresh));
    }
    return NULL;
}

enum { RING = 1024 };
typedef struct channel {
    _Atomic(void *) slots[RING];
    char pad[64];
} channel_t;
static channel_t *channels;

static void *producer(void *arg)
{
    channel_t *ch = &channels[(uintptr_t)arg];
    uint64_t seed = 1234567 + (uintptr_t)arg;
    for (long i = 0; i < ops_per_thread / 2; i++) {
        void *b = malloc(8 + rng_next(&seed) % 1017);
        _Atomic(void *) *slot = &ch->slots[i % RING];
        while (atomic_load_explicit(slot, memory_order_acquire))
            ;
        atomic_store_explicit(slot, b, memory_order_release);
    }
    return NULL;
}

static void *consumer(void *arg)
{
    channel_t *ch = &channels[(uintptr_t)arg];
    for (long i = 0; i < ops_per_thread / 2; i++) {
        _Atomic(void *) *slot = &ch->slots[i % RING];
        void *b;
        while (!(b = atomic_load_explicit(slot, memory_order_acquire)))
            ;
        atomic_store_explicit(slot, NULL, memory_order_release);
        free(b);
    }
    return NULL;
}

enum { CHURN_BLOCKS = 2000 };
static void *churn_worker(void *arg)
{
    void **mine = arg;
    for (int i = 0; i < CHURN_BLOCKS; i++) {
        free(mine[i]); /* blocks of a thread that has exited */
        mine[i] = malloc(16 + (size_t)(i % 500));
    }
    return NULL;
}

static long run(const char *workload)
{
    pthread_t t[64];
    if (!strcmp(workload, "larson")) {
        for (int i = 0; i < nthreads; i++)
            pthread_create(&t[i], NULL, larson, (void *)(uintptr_t)i);
        for (int i = 0; i < nthreads; i++)
            pthread_join(t[i], NULL);
        return ops_per_thread * nthreads;
    }
    if (!strcmp(workload, "prodcons")) {
        int pairs = nthreads > 1 ? nthreads / 2 : 1;
        channels = calloc((size_t)pairs, sizeof *channels);
        for (int i = 0; i < pairs; i++) {
            pthread_create(&t[2 * i], NULL, producer, (void *)(uintptr_t)i);
            pthread_create(&t[2 * i + 1], NULL, consumer, (void *)(uintptr_t)i);
        }
        for (int i = 0; i < 2 * pairs; i++)
            pthread_join(t[i], NULL);
        return ops_per_thread * pairs;
    }
    if (!strcmp(workload, "churn")) {
        static void *blocks[64][CHURN_BLOCKS];
        long rounds = ops_per_thread / (2 * CHURN_BLOCKS);
        for (long r = 0; r < rounds; r++) {
            for (int i = 0; i < nthreads; i++) /* each takes over a neighbour's blocks */
                pthread_create(&t[i], NULL, churn_worker, blocks[(i + r) % nthreads]);
            for (int i = 0; i < nthreads; i++)
                pthread_join(t[i], NULL);
        }
        return rounds * nthreads * 2 * CHURN_BLOCKS;
    }
    fprintf(stderr, "threads: unknown workload %s\n", workload);
    exit(2);
}

int main(int argc, char **argv)
{
    if (argc != 4)
        return fprintf(stderr, "usage: threads larson|prodcons|churn THREADS OPS_PER_THREAD\n"), 2;
    nthreads = atoi(argv[2]);
    if (nthreads < 1 || nthreads > 64)
        return 2;
    ops_per_thread = atol(argv[3]);
    double start = now_ns();
    long ops = run(argv[1]);
    double elapsed = now_ns() - start;
    report("mops", (double)ops / elapsed * 1e3);
    report("rss_mib", (double)rss_bytes() / 1048576.0);
    return 0;
}
