/* Threads that make a process's first allocations together: they exit,
 * and none of their heaps may stay live without its thread. A heap made
 * before init's thread-exit key existed had no destructor and stayed
 * live for good, with its blocks (musl's pthread_atfork, which
 * allocates, held init's window open while the other threads went on).
 * Each round is a child process whose first malloc is its threads'
 * (nothing allocates before the fork: no stdio until the end). */
#include "check.h"

#include <pthread.h>
#include <sys/wait.h>
#include <unistd.h>

enum { THREADS = 4, ROUNDS = 20, BLOCKS = 2000 };
static pthread_barrier_t together;
static void *blocks[THREADS][BLOCKS];

static void *allocate(void *arg)
{
    uintptr_t t = (uintptr_t)arg;
    pthread_barrier_wait(&together);
    for (int i = 0; i < BLOCKS; i++)
        blocks[t][i] = malloc(32);
    return NULL;
}

static void *release(void *arg)
{
    uintptr_t t = (uintptr_t)arg;
    for (int i = 0; i < BLOCKS; i++)
        free(blocks[t][i]);
    return NULL;
}

/* 0 if every heap but the main thread's went with its thread. */
static int round_in_child(void)
{
    pthread_t threads[THREADS];
    pthread_barrier_init(&together, NULL, THREADS);
    for (uintptr_t t = 0; t < THREADS; t++)
        pthread_create(&threads[t], NULL, allocate, (void *)t);
    for (int t = 0; t < THREADS; t++)
        pthread_join(threads[t], NULL);
    for (uintptr_t t = 0; t < THREADS; t++) /* each frees another's blocks */
        pthread_create(&threads[t], NULL, release, (void *)((t + 1) % THREADS));
    for (int t = 0; t < THREADS; t++)
        pthread_join(threads[t], NULL);
    hak_collect(true);
    hak_stats_t s;
    hak_stats_get(&s);
    return s.heaps_live <= 1 && s.tiny_bytes < (64u << 10) ? 0 : 1;
}

int main(void)
{
    int bad = 0;
    for (int r = 0; r < ROUNDS; r++) {
        pid_t pid = fork();
        if (pid == 0)
            _exit(round_in_child());
        int status = 0;
        waitpid(pid, &status, 0);
        bad += !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    }
    printf("first threads: %d of %d processes left a heap live without its thread\n", bad, ROUNDS);
    CHECK(bad == 0);
    return check_summary("first_threads");
}
