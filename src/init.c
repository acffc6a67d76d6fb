/* Process initialisation: lazy, run by the first allocation, and
 * recursion-safe: nothing before the fork handlers' registration can
 * allocate, and from there on the initialising thread may call malloc
 * freely while the others wait for the ready state. */
#include "alloc.h"
#include "init.h"
#include "mesh.h"
#include "superslab.h"

#include <pthread.h>
#include <sched.h>
#include <stdlib.h>

_Atomic int hak_init_state;

#ifdef HAKMEM_OVERRIDE
/* Linked from libhakmem.a, a program gets hakmem's malloc family with
 * whatever part of hakmem it uses (C++ new alone, say): every path runs
 * init.c, which names malloc, so the archive's override.o comes along and
 * the program's blocks and its libraries' all come from one allocator. */
__attribute__((used)) static void *(*const link_the_malloc_family)(size_t) = malloc;
#endif

/* The tiers, in the order of a purge pass: the orphaned heaps first, so
 * that what they give back joins the SuperSlabs' purges in the same pass;
 * the out-of-memory retry releases them the other way round, BigCache's
 * blocks before the SuperSlab pool. */
static const profile_hooks_t profile_hooks = {
    .heap_init = sample_heap_init,
    .interval_end = sample_interval_end,
    .sample = sample_take,
    .tuner_tick = learn_tick,
    .large_alloc = site_record_large,
    .large_sample = sample_large,
    .lifetime = site_record_lifetime,
    .wants_touch = site_wants_touch,
    .touched = site_record_touched,
    .large_call = kpi_large_call,
    .latency = kpi_record_latency,
    .sample_freed = sample_freed,
    .sample_resized = sample_resized,
};

/* A thread whose mapping the memory limit refused may be inside its own
 * heap's update: the other threads' fronts (heaps_purge) wait for the
 * purger; the tiers' pages go at once. */
static const purge_client_t purge_clients[] = {
    {heaps_purge, NULL, false},
    {superslab_purge, superslab_unmap_pool, true},
    {arena_purge, arena_release, true},
    {bigcache_collect, bigcache_release, true},
};

/* The thread running the init: its own allocations while it registers
 * the fork handlers (musl's pthread_atfork allocates) go through. */
static HAK_TLS bool initializing;

void hak_init_slow(void)
{
    int expected = 0;
    if (atomic_compare_exchange_strong(&hak_init_state, &expected, 1)) {
        initializing = true;
        hak_profile_hooks = profile_hooks;
        sizeclass_init();
        options_init();
        if (hak_config.fault_message)
            fault_message_init();
        os_memory_limit_init(hak_config.memory_limit);
        kpi_init();
        site_table_init();
        purger_init(purge_clients, sizeof purge_clients / sizeof purge_clients[0], heap_caller_busy, report_dump_job);
        os_membarrier_init();
        arena_init();
        mesh_init();
        heaps_key_init(bigcache_thread_exit);
        /* The fork handlers before the ready state: another thread that
         * found the state ready and forked while the init still registered
         * them forked without them, its child holding what a third thread
         * had locked (musl's test_stress fork, whose threads start before
         * its main thread's first malloc: a child blocked on ss_lock, once
         * in 15 runs or so).
         *
         * Prepare handlers run last registered first: the lanes are locked
         * after heaps_lock, the order of the purger's flush of the fronts
         * (heaps_flush_mid, then arena_free). Meshing's prepare runs
         * last, every other lock held: it write-protects the meshed pages,
         * and a thread that waits on one must hold none of them; but for
         * the segment map's, which no thread holds while it writes a
         * block, and which every other lock may be held to take. */
        pthread_atfork(segmap_fork_prepare, segmap_fork_parent, segmap_fork_child);
        pthread_atfork(mesh_fork_prepare, mesh_fork_parent, mesh_fork_child);
        pthread_atfork(arena_fork_prepare, arena_fork_parent, arena_fork_child);
        heaps_fork_init();
        pthread_atfork(bigcache_fork_prepare, bigcache_fork_parent, bigcache_fork_child);
        pthread_atfork(NULL, NULL, purger_fork_child);
        pthread_atfork(NULL, NULL, os_membarrier_init); /* a new process registers anew */
        pthread_atfork(sample_fork_prepare, sample_fork_parent, sample_fork_child);
        pthread_atfork(NULL, NULL, learn_fork_child);
        atomic_store_explicit(&hak_init_state, 2, memory_order_release);
        initializing = false;
        stats_init();
        report_dumps_init();
        return;
    }
    if (initializing)
        return;
    while (atomic_load_explicit(&hak_init_state, memory_order_acquire) != 2)
        sched_yield();
}
