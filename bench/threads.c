/* Multi-threaded workloads, at T threads:
 *  larson:   each thread fills its share of a shared table, then replaces
 *            random slots of the whole table, so most frees hit blocks
 *            another thread allocated (sizes 8..1024 B); as the reference
 *            larson, it writes the first two bytes of each new block and
 *            times only the replacements;
 *  prodcons: T/2 producers hand blocks to T/2 consumers that free them
 *            (one producer and one consumer at T = 1);
 *  churn:    threads that allocate, exit, and whose blocks others free;
 *  batch:    each thread on its own: allocate 1000 blocks of 8..1024 B,
 *            free them all, again (the threadtest pattern);
 *  mid:      each thread on its own keeps 64 live blocks of 1..64 KiB and
 *            replaces a random one at each step (xmalloc-like, mid tier);
 *  mid4k:    the same with blocks of 4 KiB only (one size of buffer);
 *  spread:   the same with blocks of 16 B..64 KiB, each doubling as likely;
 *  big:      the same with blocks of 64..256 KiB (buffers of varied sizes,
 *            the size classes of the threads' fronts to the page arenas);
 *  xmalloc:  T/2 threads allocate batches of 256 blocks of 48..80 B and
 *            hand each batch whole to the other T/2, which free it (the
 *            xmalloc test's producer/consumer: every free a remote one);
 *  rptest:   each thread keeps 512 blocks of 16 B..16 KiB (each doubling
 *            as likely) and replaces one at random; one block in four it
 *            replaces goes to the next thread's inbox instead of being
 *            freed, and each thread frees what its inbox holds every 64
 *            steps (rpmalloc's test: random sizes, frees across threads);
 *  mstress:  each thread keeps 256 blocks of 8 B..4 KiB (each doubling as
 *            likely) and replaces one at random; one new block in eight
 *            goes into a table of 4096 slots that all threads share, and
 *            the block it displaces, another thread's, is freed there;
 *  large:    each thread keeps 4 blocks of 5..25 MB, replaces one at
 *            random, and writes a byte every 64 KiB of the new one.
 * Reports M ops/s (a malloc or a free is one op), RSS at the end (from
 * smaps_rollup) and its peak (VmHWM).
 * Usage: threads larson|prodcons|churn|batch|mid|mid4k|spread|big|xmalloc|rptest|mstress|large THREADS OPS_PER_THREAD */
#include "common.h"

#include <pthread.h>
#include <stdatomic.h>

static long ops_per_thread;
static int nthreads;

enum { TABLE = 1 << 14 };
static _Atomic(void *) table[TABLE];

/* The clock starts once every thread has filled its share of the table:
 * at a million operations a thread, the first touch of the table's 8 MiB
 * took most of the run (a page fault costs 10 us on our VMs). */
static pthread_barrier_t larson_filled;
static double clock_start_ns; /* where a workload starts the clock itself */

/* A new block of larson's, its first two bytes written as the reference
 * larson writes them. Without the writes, an allocator whose free lists
 * live outside the blocks (jemalloc's cache is an array of pointers) ran
 * five times as fast as the others: it never touched a block, so no block
 * missed the cache and no page faulted (RSS 4 MiB for 8 MiB live). */
static void *larson_block(uint64_t r)
{
    volatile char *fresh = malloc(8 + (r >> 20) % 1017);
    fresh[0] = 'a';
    fresh[1] = 'b';
    return (void *)fresh;
}

static void *larson(void *arg)
{
    uintptr_t me = (uintptr_t)arg;
    uint64_t seed = 0x9E3779B97F4A7C15ull * (me + 1);
    for (size_t i = me * TABLE / (size_t)nthreads; i < (me + 1) * TABLE / (size_t)nthreads; i++)
        atomic_store(&table[i], larson_block(rng_next(&seed)));
    pthread_barrier_wait(&larson_filled);
    for (long i = 0; i < ops_per_thread; i += 2) {
        uint64_t r = rng_next(&seed);
        free(atomic_exchange(&table[r % TABLE], larson_block(r)));
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

enum { BATCH = 1000 };
static void *batch(void *arg)
{
    uint64_t seed = 0x2545F4914F6CDD1Dull * ((uintptr_t)arg + 1);
    void *blocks[BATCH];
    for (long done = 0; done < ops_per_thread; done += 2 * BATCH) {
        for (int i = 0; i < BATCH; i++)
            blocks[i] = malloc(8 + rng_next(&seed) % 1017);
        for (int i = 0; i < BATCH; i++)
            free(blocks[i]);
    }
    return NULL;
}

enum { MID_LIVE = 64 };
enum mid_sizes { MID_1K_64K, MID_4K, MID_SPREAD, MID_64K_256K };
static enum mid_sizes mid_sizes;

/* The size of the block that replaces one. spread: 16 B..64 KiB, each
 * doubling as likely: most blocks small, as in most programs, and the
 * tiny, mid and arena tiers side by side. Inline, and the first bytes
 * written with constant sizes: a call to a size function and to memset
 * of a variable length cost mid4k's loop 49 instructions a pair more
 * (callgrind), these tests 3. */
static inline size_t mid_size(uint64_t r)
{
    if (mid_sizes == MID_4K)
        return 4096;
    if (mid_sizes == MID_1K_64K)
        return 1024 + (r >> 16) % (63 * 1024);
    if (mid_sizes == MID_64K_256K)
        return 65536 + (r >> 16) % (192 * 1024);
    size_t base = (size_t)16 << (r >> 16) % 12;
    return base + ((r >> 24) & (base - 1));
}

static void *mid(void *arg)
{
    uint64_t seed = 0x9E3779B97F4A7C15ull ^ ((uintptr_t)arg + 7);
    void *live[MID_LIVE] = {0};
    for (long i = 0; i < ops_per_thread; i += 2) {
        uint64_t r = rng_next(&seed);
        void **slot = &live[r % MID_LIVE];
        free(*slot);
        size_t size = mid_size(r);
        *slot = malloc(size);
        if (size >= 64)
            memset(*slot, 1, 64);
        else
            memset(*slot, 1, 16);
    }
    for (int i = 0; i < MID_LIVE; i++)
        free(live[i]);
    return NULL;
}

/* xmalloc: batches of blocks through a bounded queue, producer to
 * consumer. */
enum { XBATCH = 256, XQUEUE = 64 };
typedef struct xbatch {
    void *blocks[XBATCH];
} xbatch_t;
static struct {
    pthread_mutex_t lock;
    pthread_cond_t changed;
    xbatch_t *slots[XQUEUE];
    unsigned head, count, producers_left;
} xqueue = {.lock = PTHREAD_MUTEX_INITIALIZER, .changed = PTHREAD_COND_INITIALIZER};

static void *xmalloc_producer(void *arg)
{
    uint64_t seed = 0x51ED2701ull * ((uintptr_t)arg + 3);
    for (long done = 0; done < ops_per_thread; done += 2 * XBATCH) {
        xbatch_t *batch = malloc(sizeof *batch);
        for (int i = 0; i < XBATCH; i++) {
            char *b = malloc(48 + rng_next(&seed) % 33);
            b[0] = 1;
            batch->blocks[i] = b;
        }
        pthread_mutex_lock(&xqueue.lock);
        while (xqueue.count == XQUEUE)
            pthread_cond_wait(&xqueue.changed, &xqueue.lock);
        xqueue.slots[(xqueue.head + xqueue.count++) % XQUEUE] = batch;
        pthread_cond_broadcast(&xqueue.changed);
        pthread_mutex_unlock(&xqueue.lock);
    }
    pthread_mutex_lock(&xqueue.lock);
    xqueue.producers_left--;
    pthread_cond_broadcast(&xqueue.changed);
    pthread_mutex_unlock(&xqueue.lock);
    return NULL;
}

static void *xmalloc_consumer(void *arg)
{
    (void)arg;
    for (;;) {
        pthread_mutex_lock(&xqueue.lock);
        while (!xqueue.count && xqueue.producers_left)
            pthread_cond_wait(&xqueue.changed, &xqueue.lock);
        if (!xqueue.count) {
            pthread_mutex_unlock(&xqueue.lock);
            return NULL;
        }
        xbatch_t *batch = xqueue.slots[xqueue.head];
        xqueue.head = (xqueue.head + 1) % XQUEUE;
        xqueue.count--;
        pthread_cond_broadcast(&xqueue.changed);
        pthread_mutex_unlock(&xqueue.lock);
        for (int i = 0; i < XBATCH; i++)
            free(batch->blocks[i]);
        free(batch);
    }
}

/* A size of 2^lo..2^hi bytes, each doubling as likely. */
static inline size_t doubling_size(uint64_t r, unsigned lo, unsigned hi)
{
    size_t base = (size_t)1 << (lo + (r >> 16) % (hi - lo));
    return base + ((r >> 24) & (base - 1));
}

/* rptest: each thread's inbox, a stack that other threads push onto and
 * its owner takes whole. A block in an inbox holds the link. */
typedef struct inbox {
    _Atomic(void *) head;
    char pad[56];
} inbox_t;
static inbox_t *inboxes;

static void inbox_drain(inbox_t *box)
{
    for (void *b = atomic_exchange(&box->head, NULL); b;) {
        void *next = *(void **)b;
        free(b);
        b = next;
    }
}

enum { RP_LIVE = 512 };
static void *rptest(void *arg)
{
    uintptr_t me = (uintptr_t)arg;
    inbox_t *next_box = &inboxes[(me + 1) % (uintptr_t)nthreads];
    uint64_t seed = 0xC2B2AE3D27D4EB4Full * (me + 5);
    void *live[RP_LIVE] = {0};
    for (long i = 0; i < ops_per_thread; i += 2) {
        uint64_t r = rng_next(&seed);
        void **slot = &live[r % RP_LIVE];
        if (*slot && (r >> 40) % 4 == 0) {
            void *head = atomic_load(&next_box->head);
            do
                *(void **)*slot = head;
            while (!atomic_compare_exchange_weak(&next_box->head, &head, *slot));
        } else {
            free(*slot);
        }
        size_t size = doubling_size(r, 4, 14);
        *slot = malloc(size);
        memset(*slot, 1, 16);
        if (i % 128 == 0)
            inbox_drain(&inboxes[me]);
    }
    for (int i = 0; i < RP_LIVE; i++)
        free(live[i]);
    return NULL;
}

/* mstress: blocks shared through one table of all threads. */
enum { MS_LIVE = 256, MS_SHARED = 4096 };
static _Atomic(void *) shared_slots[MS_SHARED];

static void *mstress(void *arg)
{
    uint64_t seed = 0x165667B19E3779F9ull * ((uintptr_t)arg + 11);
    void *live[MS_LIVE] = {0};
    for (long i = 0; i < ops_per_thread; i += 2) {
        uint64_t r = rng_next(&seed);
        void *b = malloc(doubling_size(r, 3, 12));
        memset(b, 2, 8);
        if ((r >> 44) % 8 == 0)
            free(atomic_exchange(&shared_slots[(r >> 20) % MS_SHARED], b));
        else {
            void **slot = &live[r % MS_LIVE];
            free(*slot);
            *slot = b;
        }
    }
    for (int i = 0; i < MS_LIVE; i++)
        free(live[i]);
    return NULL;
}

/* large: blocks of 5..25 MB. */
enum { LARGE_LIVE = 4 };
static void *large(void *arg)
{
    uint64_t seed = 0x27D4EB2F165667C5ull * ((uintptr_t)arg + 13);
    void *live[LARGE_LIVE] = {0};
    for (long i = 0; i < ops_per_thread; i += 2) {
        uint64_t r = rng_next(&seed);
        void **slot = &live[r % LARGE_LIVE];
        free(*slot);
        size_t size = 5000000 + (r >> 20) % 20000001;
        char *b = malloc(size);
        for (size_t at = 0; at < size; at += 65536)
            b[at] = 1;
        *slot = b;
    }
    for (int i = 0; i < LARGE_LIVE; i++)
        free(live[i]);
    return NULL;
}

static long run_each(void *(*worker)(void *))
{
    pthread_t t[64];
    for (int i = 0; i < nthreads; i++)
        pthread_create(&t[i], NULL, worker, (void *)(uintptr_t)i);
    for (int i = 0; i < nthreads; i++)
        pthread_join(t[i], NULL);
    return ops_per_thread * nthreads;
}

static long run(const char *workload)
{
    pthread_t t[64];
    if (!strcmp(workload, "larson")) {
        pthread_barrier_init(&larson_filled, NULL, (unsigned)nthreads + 1);
        for (int i = 0; i < nthreads; i++)
            pthread_create(&t[i], NULL, larson, (void *)(uintptr_t)i);
        pthread_barrier_wait(&larson_filled);
        clock_start_ns = now_ns();
        for (int i = 0; i < nthreads; i++)
            pthread_join(t[i], NULL);
        return ops_per_thread * nthreads;
    }
    if (!strcmp(workload, "batch"))
        return run_each(batch);
    if (!strcmp(workload, "mid"))
        return run_each(mid);
    if (!strcmp(workload, "mid4k")) {
        mid_sizes = MID_4K;
        return run_each(mid);
    }
    if (!strcmp(workload, "spread")) {
        mid_sizes = MID_SPREAD;
        return run_each(mid);
    }
    if (!strcmp(workload, "big")) {
        mid_sizes = MID_64K_256K;
        return run_each(mid);
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
    if (!strcmp(workload, "xmalloc")) {
        int producers = nthreads > 1 ? nthreads / 2 : 1, consumers = nthreads > 1 ? nthreads - producers : 1;
        xqueue.producers_left = (unsigned)producers;
        for (int i = 0; i < producers; i++)
            pthread_create(&t[i], NULL, xmalloc_producer, (void *)(uintptr_t)i);
        for (int i = 0; i < consumers; i++)
            pthread_create(&t[producers + i], NULL, xmalloc_consumer, NULL);
        for (int i = 0; i < producers + consumers; i++)
            pthread_join(t[i], NULL);
        return (ops_per_thread + 2 * XBATCH - 1) / (2 * XBATCH) * 2 * XBATCH * producers;
    }
    if (!strcmp(workload, "rptest")) {
        inboxes = calloc((size_t)nthreads, sizeof *inboxes);
        long ops = run_each(rptest);
        for (int i = 0; i < nthreads; i++)
            inbox_drain(&inboxes[i]);
        return ops;
    }
    if (!strcmp(workload, "mstress")) {
        long ops = run_each(mstress);
        for (int i = 0; i < MS_SHARED; i++)
            free(atomic_exchange(&shared_slots[i], NULL));
        return ops;
    }
    if (!strcmp(workload, "large"))
        return run_each(large);
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
        return fprintf(stderr, "usage: threads larson|prodcons|churn|batch|mid|mid4k|spread|big|xmalloc|rptest|mstress|large "
                               "THREADS OPS_PER_THREAD\n"),
               2;
    nthreads = atoi(argv[2]);
    if (nthreads < 1 || nthreads > 64)
        return 2;
    ops_per_thread = atol(argv[3]);
    double start = now_ns();
    long ops = run(argv[1]);
    double elapsed = now_ns() - (clock_start_ns ? clock_start_ns : start);
    report("mops", (double)ops / elapsed * 1e3);
    report("rss_mib", (double)rss_bytes() / 1048576.0);
    /* VmHWM, the peak of this program's own memory: ru_maxrss would carry
     * the peak of the process from before its exec (the runner's fork). */
    report("rss_peak_mib", (double)proc_kib_field_bytes("/proc/self/status", "VmHWM: %zu kB") / 1048576.0);
    return 0;
}
