/* The purger: gives free pages back to the OS once they have been free for
 * HAKMEM_PURGE_DELAY_MS, without waiting for the program to call into
 * hakmem. By default a background thread does it, so that a program that
 * frees memory and then sleeps still shrinks; it starts the first time
 * pages wait for a purge, sleeps on a condition variable while nothing
 * waits, and never allocates. With HAKMEM_PURGE_THREAD=0 the purges run
 * inside the allocator's own calls instead (refills, large blocks, frees
 * that leave pages to purge), a few times per delay. */
#define _GNU_SOURCE
#include "internal.h"

#include <pthread.h>
#include <signal.h>
#include <time.h>

static pthread_mutex_t purger_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t purger_wake = PTHREAD_COND_INITIALIZER;
static _Atomic bool purger_pending;  /* pages wait for a purge (set under purger_lock) */
static _Atomic bool purger_started;
static _Atomic uint64_t next_inline_check_ms;
_Atomic bool hak_purger_start_wanted; /* deferred until the heap's lists are consistent */

/* One pass over orphaned heaps, threads' mid caches, SuperSlabs, page
 * arenas and BigCache: when the next purge falls due, or 0 if nothing waits. The
 * orphans first: what they give back joins the SuperSlabs' purges. */
static uint64_t purge_pass(void)
{
    uint64_t heaps_due = due_earlier(heaps_drain_orphans(), heaps_flush_mid(false));
    uint64_t pages_due = due_earlier(superslab_purge(false), arena_purge(false));
    return due_earlier(heaps_due, due_earlier(pages_due, bigcache_collect(false)));
}

static void sleep_ms(uint64_t ms)
{
    struct timespec ts = {.tv_sec = (time_t)(ms / 1000), .tv_nsec = (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0)
        ;
}

static void *purger_main(void *arg)
{
    (void)arg;
    /* Named from inside: naming another thread formats a /proc path, and
     * that first use of stdio's code cost three page faults. */
    pthread_setname_np(pthread_self(), "hakmem-purge");
    pthread_mutex_lock(&purger_lock);
    for (;;) {
        while (!atomic_load_explicit(&purger_pending, memory_order_relaxed))
            pthread_cond_wait(&purger_wake, &purger_lock);
        atomic_store_explicit(&purger_pending, false, memory_order_relaxed);
        pthread_mutex_unlock(&purger_lock);
        for (uint64_t due; (due = purge_pass()) != 0;) {
            uint64_t now = os_now_ms();
            /* the coarse clock runs up to a tick behind: sleep a little past */
            sleep_ms((due > now ? due - now : 0) + 5);
        }
        pthread_mutex_lock(&purger_lock);
    }
    return NULL;
}

/* Start the thread with every signal blocked: signals go to the program's
 * own threads. A failure (thread limit) falls back to inline purges. */
static void purger_start(void)
{
    bool expected = false;
    if (!atomic_compare_exchange_strong(&purger_started, &expected, true))
        return;
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    pthread_t thread;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_attr_setstacksize(&attr, 64 << 10);
    int rc = pthread_create(&thread, &attr, purger_main, NULL);
    pthread_attr_destroy(&attr);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc != 0) {
        hak_warn("could not start the purger thread; purging inline", NULL);
        hak_config.purge_thread = false;
        return;
    }
    if (hak_config.verbose)
        hak_warn("purger thread started", NULL);
}

static void purge_inline(void)
{
    uint64_t now = os_now_ms(), due = atomic_load_explicit(&next_inline_check_ms, memory_order_relaxed);
    uint64_t step = (uint64_t)hak_config.purge_delay_ms / 4 + 1;
    if (now >= due && atomic_compare_exchange_strong(&next_inline_check_ms, &due, now + step))
        purge_pass();
}

/* Pages now wait for a purge. Called with no hakmem lock held; a heap may
 * be in the middle of a list update, and since starting a thread
 * allocates, the start then waits for purger_heap_settled. */
void purger_notify(void)
{
    if (!hak_config.purge_thread) {
        purge_inline();
        return;
    }
    if (unlikely(!atomic_load_explicit(&purger_started, memory_order_relaxed))) {
        if (atomic_load_explicit(&heap_get()->in_slow, memory_order_relaxed)) {
            atomic_store_explicit(&hak_purger_start_wanted, true, memory_order_relaxed);
            return;
        }
        purger_start();
    }
    if (atomic_load_explicit(&purger_pending, memory_order_relaxed))
        return;
    pthread_mutex_lock(&purger_lock);
    atomic_store_explicit(&purger_pending, true, memory_order_relaxed);
    pthread_cond_signal(&purger_wake);
    pthread_mutex_unlock(&purger_lock);
}

/* An allocation on a slow path (a refill, a large block): without the
 * thread, the purges that fell due run here, so that a program that
 * allocates again gets its memory back even when none of its calls
 * leaves pages to purge (they were the only trigger: a loop of large
 * allocations held 115 MiB of empty slabs for ever). */
void purger_poll(void)
{
    if (unlikely(!hak_config.purge_thread))
        purge_inline();
}

/* The calling thread's heap has finished a list update. */
void purger_heap_settled(void)
{
    bool expected = true;
    if (atomic_compare_exchange_strong(&hak_purger_start_wanted, &expected, false))
        purger_notify();
}

/* The child has no purger thread: it starts one when it needs one. The
 * lock may have been held by the parent's purger. */
void purger_fork_child(void)
{
    pthread_mutex_init(&purger_lock, NULL);
    pthread_cond_init(&purger_wake, NULL);
    atomic_store(&purger_started, false);
    atomic_store(&hak_purger_start_wanted, atomic_load(&purger_pending));
    atomic_store(&purger_pending, false);
}
