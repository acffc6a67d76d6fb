/* Process initialisation: lazy, run by the first allocation, and
 * recursion-safe: nothing before the ready state can allocate, and what
 * runs after it (thread-exit key, fork handlers) may call malloc freely. */
#include "internal.h"

#include <pthread.h>
#include <sched.h>

_Atomic int hak_init_state;

void hak_init_slow(void)
{
    int expected = 0;
    if (atomic_compare_exchange_strong(&hak_init_state, &expected, 1)) {
        segmap_init();
        sizeclass_init();
        options_init();
        kpi_init();
        purger_init();
        os_membarrier_init();
        arena_init();
        atomic_store_explicit(&hak_init_state, 2, memory_order_release);
        /* Prepare handlers run last registered first: the lanes are locked
         * after heaps_lock, the order of the purger's flush of the fronts
         * (heaps_flush_mid, then arena_free). */
        pthread_atfork(arena_fork_prepare, arena_fork_parent, arena_fork_child);
        heaps_process_init();
        pthread_atfork(bigcache_fork_prepare, bigcache_fork_parent, bigcache_fork_child);
        pthread_atfork(NULL, NULL, purger_fork_child);
        pthread_atfork(NULL, NULL, os_membarrier_init); /* a new process registers anew */
        pthread_atfork(sample_fork_prepare, sample_fork_parent, sample_fork_child);
        pthread_atfork(NULL, NULL, learn_fork_child);
        stats_init();
        return;
    }
    while (atomic_load_explicit(&hak_init_state, memory_order_acquire) != 2)
        sched_yield();
}
