/* Blocks freed on another lane, for the tests of the lanes' pools: a pool
 * takes a block freed past a full front bin only from a thread whose lane
 * is not the block's. other_lane_free(blocks, n, size) frees the
 * caller's n blocks of size from a helper thread whose own front bin for
 * that size is full already, one at a time while each joins a pool, and
 * returns how many did: the last ones, blocks[n - count .. n). A helper
 * that shares the blocks' lane sends its first one to its arena and
 * stops; a second helper, on the next lane, frees the rest. Helpers stay
 * alive, so that the second does not take over the first's heap and lane,
 * until other_lane_release. On a machine of one CPU (one lane) none
 * joins. */
#ifndef HAKMEM_TEST_OTHER_LANE_H
#define HAKMEM_TEST_OTHER_LANE_H

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>

#include "check.h"

typedef struct other_lane_job {
    char **blocks;
    int from, n, done, pooled;
    size_t size;
    _Atomic int finished;
} other_lane_job_t;

static other_lane_job_t other_lane_jobs[2];
static pthread_t other_lane_helpers[2];
static int other_lane_count;
static _Atomic int other_lane_go;

/* The CPUs the process may run on: hakmem's lanes, one per CPU. */
static inline int other_lane_cpus(void)
{
    cpu_set_t cpus;
    return sched_getaffinity(0, sizeof cpus, &cpus) == 0 ? CPU_COUNT(&cpus) : 1;
}

/* Blocks freed on another lane join a pool here. */
static inline bool other_lane_pools(void) { return arena_pools_on() && other_lane_cpus() > 1; }

static inline size_t other_lane_pooled(void)
{
    hak_stats_t s;
    hak_stats_get(&s);
    return s.arena_pooled_bytes;
}

static inline void *other_lane_main(void *arg)
{
    other_lane_job_t *job = arg;
    char *own[64];
    int kept = 0;
    for (size_t bytes = job->size; bytes <= 512 * 1024 && kept < 64; bytes += job->size)
        own[kept++] = malloc(job->size); /* each finds the bin empty: its limit grows */
    for (int i = 0; i < kept; i++)
        free(own[i]); /* the bin full */
    for (int i = job->from; i < job->n; i++) {
        size_t before = other_lane_pooled();
        free(job->blocks[i]);
        job->done++;
        if (other_lane_pooled() <= before)
            break; /* to its arena: this helper shares the block's lane */
        job->pooled++;
    }
    atomic_store(&job->finished, 1);
    while (!atomic_load(&other_lane_go))
        sched_yield();
    return NULL;
}

static inline int other_lane_free(char **blocks, int n, size_t size)
{
    int from = 0, pooled = 0;
    while (from < n && !pooled && other_lane_count < 2) {
        other_lane_job_t *job = &other_lane_jobs[other_lane_count];
        job->blocks = blocks, job->from = from, job->n = n, job->size = size;
        job->done = job->pooled = 0;
        atomic_store(&job->finished, 0);
        pthread_create(&other_lane_helpers[other_lane_count++], NULL, other_lane_main, job);
        while (!atomic_load(&job->finished))
            sched_yield();
        from += job->done;
        pooled = job->pooled;
    }
    for (; from < n; from++) /* none pooled them (one lane): freed here */
        free(blocks[from]);
    return pooled;
}

static inline void other_lane_release(void)
{
    atomic_store(&other_lane_go, 1);
    for (int i = 0; i < other_lane_count; i++)
        pthread_join(other_lane_helpers[i], NULL);
    other_lane_count = 0;
    atomic_store(&other_lane_go, 0);
}

#endif
