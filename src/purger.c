/* The purger: gives free pages back to the OS once they have been free for
 * HAKMEM_PURGE_DELAY_MS, without waiting for the program to call into
 * hakmem. By default a background thread does it, so that a program that
 * frees memory and then sleeps still shrinks. With HAKMEM_PURGE_THREAD=0
 * the purges run inside the allocator's own calls instead (refills, large
 * blocks, frees that leave pages to purge), a few times per delay.
 *
 * The thread is hakmem's, not the program's, and a program that started
 * none of its own may rightly believe it has one: the kernel refuses
 * unshare(CLONE_NEWUSER) and setns with EINVAL in a process of two
 * threads (util-linux's `unshare -U` failed under the preload, as would a
 * sandbox helper), and a child of clone without CLONE_VM keeps a copy of
 * any lock the thread held, held for ever. So the thread lives only while
 * pages wait: it starts the first time they do (a young program's first
 * few excepted: purger_young_untold), sleeps until the next
 * purge falls due and exits once nothing waits (a notify starts it
 * again), and hakmem's unshare, setns and clone stop it, and wait until
 * the kernel has let it go, before they call the kernel. It never
 * allocates and blocks every signal.
 *
 * The purger sits below the tiers: they tell it when pages wait
 * (purger_notify), and it calls them back only through the purge clients
 * that init.c hands it (purger_init), never by name. */
#define _GNU_SOURCE
#include "purger.h"
#include "error.h"
#include "os.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <time.h>

static pthread_mutex_t purger_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t purger_wake; /* a stop asked; on CLOCK_MONOTONIC (wake_init) */
static pthread_cond_t purger_gone = PTHREAD_COND_INITIALIZER; /* the thread left */
/* Under purger_lock, read without it on notify's fast path: */
static _Atomic bool purger_pending; /* pages wait that the thread has not seen */
static _Atomic bool purger_running; /* a thread runs, or is being started */
static bool purger_stop;            /* the thread is to exit now (purger_retire) */
static pid_t purger_last_tid;       /* the kernel's id of the thread that last exited */
static _Atomic uint64_t next_inline_check_ms;
static HAK_TLS bool purger_self;      /* this thread is the purger */
static HAK_TLS bool collecting;       /* this thread runs a purge pass or a collect (purger_collecting) */
static uint64_t started_ms;           /* when hakmem started in this program */
static _Atomic bool untold;           /* a young program's frees started no thread */
_Atomic bool hak_purger_start_wanted; /* a start or a job waits until the heap's lists are consistent */
static _Atomic bool start_deferred;   /* the start waiting */
static _Atomic bool job_wanted;       /* the settled job waiting (purger_request_job) */
static void (*settled_job)(void);
static const purge_client_t *clients; /* the tiers, in the order of a pass */
static unsigned client_count;
static bool (*caller_busy)(void);     /* the caller's heap is inside a list update or a mid section */

/* One pass over the clients, in their order: when the next purge falls
 * due, or 0 if nothing waits. */
static uint64_t purge_pass(void)
{
    uint64_t due = 0;
    for (unsigned i = 0; i < client_count; i++)
        due = due_earlier(due, clients[i].purge(false));
    return due;
}

/* The out-of-memory retry: a mapping failed, so every client gives back
 * what it holds that no one uses, last registered first (BigCache's
 * blocks before the SuperSlab pool). Under a memory limit (limit.c) the
 * pages waiting for the purge delay go back first, from the clients that
 * may purge in the caller's thread. True if the caller should map again:
 * that unmapped anything, or a limit may have refused the mapping. */
bool purger_release_caches(void)
{
    size_t before = atomic_load_explicit(&hak_mapped_bytes, memory_order_relaxed);
    bool limited = os_memory_limit() != 0;
    if (limited) {
        bool was = collecting;
        collecting = true;
        for (unsigned i = 0; i < client_count; i++)
            if (clients[i].when_refused)
                clients[i].purge(true);
        collecting = was;
    }
    for (unsigned i = client_count; i-- > 0;)
        if (clients[i].release)
            clients[i].release();
    return limited || atomic_load_explicit(&hak_mapped_bytes, memory_order_relaxed) < before;
}

/* Sleep ms, unless a stop is asked. Called and returns with purger_lock
 * held. */
static void wait_for(uint64_t ms)
{
    uint64_t deadline = os_now_ns() + ms * 1000000u; /* CLOCK_MONOTONIC */
    struct timespec at = {(time_t)(deadline / 1000000000u), (long)(deadline % 1000000000u)};
    while (!purger_stop && pthread_cond_timedwait(&purger_wake, &purger_lock, &at) != ETIMEDOUT)
        ;
}

/* Sleep until `due`, on os_now_ms's coarse clock, which runs up to a tick
 * behind: a little past it. */
static void wait_until(uint64_t due)
{
    uint64_t now = os_now_ms();
    wait_for((due > now ? due - now : 0) + 5);
}

/* No thread runs any more (called with purger_lock held): a retire that
 * waits for it goes on, and the next notify starts one. */
static void purger_gone_now(void)
{
    atomic_store_explicit(&purger_running, false, memory_order_relaxed);
    pthread_cond_broadcast(&purger_gone);
}

static void *purger_main(void *arg)
{
    (void)arg;
    purger_self = true;
    /* Named from inside: naming another thread formats a /proc path, and
     * that first use of stdio's code cost three page faults. */
    pthread_setname_np(pthread_self(), "hakmem-purge");
    pthread_mutex_lock(&purger_lock);
    while (!purger_stop && atomic_load_explicit(&purger_pending, memory_order_relaxed)) {
        atomic_store_explicit(&purger_pending, false, memory_order_relaxed);
        /* The pages that woke us have just begun to wait: nothing falls
         * due for a delay, and a pass now would only take the locks the
         * program needs (in a short program, at its busiest). */
        if (hak_config.purge_delay_ms)
            wait_for((uint64_t)hak_config.purge_delay_ms);
        for (uint64_t due; !purger_stop;) {
            pthread_mutex_unlock(&purger_lock);
            due = purge_pass();
            pthread_mutex_lock(&purger_lock);
            if (!due)
                break;
            wait_until(due);
        }
    }
    /* Nothing waits, or a stop: gone until the next notify. */
    purger_last_tid = os_thread_id();
    purger_gone_now();
    pthread_mutex_unlock(&purger_lock);
    return NULL;
}

/* Start the thread with every signal blocked: signals go to the program's
 * own threads. Where it cannot be started (a thread limit), or starting
 * it may be what kills the program (a seccomp filter: os_thread_filtered),
 * purges run inline for good, said only with HAKMEM_VERBOSE: a program
 * that may start no thread (RLIMIT_NPROC 0, as privilege-separated
 * servers set) has done nothing wrong, and its stderr is its own. */
static void purger_start(void)
{
    hak_assert(!caller_busy());
    bool filtered = os_thread_filtered();
    int rc = EAGAIN;
    if (!filtered) {
        sigset_t all, old;
        sigfillset(&all);
        pthread_sigmask(SIG_SETMASK, &all, &old);
        pthread_t thread;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        pthread_attr_setstacksize(&attr, 64 << 10);
        rc = pthread_create(&thread, &attr, purger_main, NULL);
        pthread_attr_destroy(&attr);
        pthread_sigmask(SIG_SETMASK, &old, NULL);
    }
    if (rc == 0) {
        if (hak_config.verbose)
            hak_warn("purger thread started", NULL);
        return;
    }
    if (hak_config.verbose)
        hak_warn("could not start the purger thread; purging inline", filtered ? "a seccomp filter" : NULL);
    hak_config.purge_thread = false;
    pthread_mutex_lock(&purger_lock);
    purger_gone_now();
    pthread_mutex_unlock(&purger_lock);
}

/* Without the thread, a pass a few times per delay, in whichever call
 * comes. Never inside a pass or a collect of the same thread: the frees
 * those make (a front flushed under heaps_lock, a pool under its lane's
 * purge lock) come here, and a pass would take those locks again. */
static void purge_inline(void)
{
    if (collecting)
        return;
    uint64_t now = os_now_ms(), due = atomic_load_explicit(&next_inline_check_ms, memory_order_relaxed);
    uint64_t step = (uint64_t)hak_config.purge_delay_ms / 4 + 1;
    if (now >= due && atomic_compare_exchange_strong(&next_inline_check_ms, &due, now + step)) {
        collecting = true;
        purge_pass();
        collecting = false;
    }
}

void purger_collecting(bool on) { collecting = on; }

/* Pages now wait for a purge. Called with no hakmem lock held; the
 * caller's heap may be in the middle of a list update or of a mid section
 * (heap_mid_enter), and since starting a thread allocates, the start then
 * waits for purger_heap_settled (as it does on the purger itself, whose
 * exit frees its thread's records): inside a mid section,
 * pthread_create's allocation of a mid size (its TLS vector, with 48
 * modules or more) would end the section's mark while the outer pop still
 * ran, and the thread started could claim the caches under it. */
static void defer_start(void)
{
    atomic_store_explicit(&start_deferred, true, memory_order_relaxed);
    atomic_store_explicit(&hak_purger_start_wanted, true, memory_order_release);
}

void purger_notify(void)
{
    if (!hak_config.purge_thread) {
        purge_inline();
        return;
    }
    /* The running thread sees these pages at its next pass. */
    if (atomic_load_explicit(&purger_pending, memory_order_relaxed) &&
        atomic_load_explicit(&purger_running, memory_order_relaxed))
        return;
    bool may_start = !purger_self && !caller_busy();
    pthread_mutex_lock(&purger_lock);
    atomic_store_explicit(&purger_pending, true, memory_order_relaxed);
    bool start = !atomic_load_explicit(&purger_running, memory_order_relaxed);
    if (start && may_start)
        atomic_store_explicit(&purger_running, true, memory_order_relaxed);
    pthread_mutex_unlock(&purger_lock);
    if (start && may_start)
        purger_start();
    else if (start)
        defer_start();
}

/* A young program's frees start no thread. A short program (ls, grep, git
 * --version: a stdio buffer freed into a thread's cache; a JSON parser
 * whose first 64 KiB block goes back to its arena) paid the thread's
 * start and its end, 80 to 215 us of a 1.2 ms run, for pages that die
 * with it. So in the program's first purge delay, the pages freed wait
 * untold while they are at most YOUNG_UNTOLD_MAX bytes in all (blocks in
 * a thread's caches count none: their caches bound them); past that, or
 * once the delay has passed, the next notify starts the thread, whose
 * first pass takes them too, and so does the first allocation on a slow
 * path after the delay (purger_poll). A program that frees more than the
 * bound starts the thread at once, and one that frees less and then
 * sleeps keeps at most the bound: within the 2.5 MiB that a sleeping
 * program may keep above its start. 2.25 MiB: a large block of 2 MiB
 * (513 pages with its colour) fits, as a program's one big buffer. */
#define YOUNG_UNTOLD_MAX ((size_t)9 << 18)
static _Atomic size_t young_untold_bytes;

static bool program_young_at(uint64_t now_ms) { return now_ms < started_ms + (uint64_t)hak_config.purge_delay_ms; }
static bool program_young(void) { return program_young_at(os_now_ms()); }

/* Pages freed at now_ms may wait untold, within the bound: the program is
 * young and no thread runs. */
static bool untold_allowed(uint64_t now_ms)
{
    return hak_config.purge_thread && !atomic_load_explicit(&purger_running, memory_order_relaxed) &&
           program_young_at(now_ms);
}

/* Whether bytes of pages just freed at now_ms (os_now_ms: BigCache's free
 * reads it anyway, and a young program's large pair read the clock three
 * times, 86 of its 620 instructions: measured at 61a7430)
 * may wait untold (then the caller tells the purger nothing). */
bool purger_young_untold(size_t bytes, uint64_t now_ms)
{
    if (!untold_allowed(now_ms) || bytes > YOUNG_UNTOLD_MAX ||
        atomic_fetch_add_explicit(&young_untold_bytes, bytes, memory_order_relaxed) + bytes > YOUNG_UNTOLD_MAX)
        return false;
    atomic_store_explicit(&untold, true, memory_order_relaxed);
    return true;
}

/* Whether pages that purger_young_untold counted before may wait untold
 * again, freed at now_ms: a large block BigCache handed back keeps its
 * bytes counted while the program uses it, so that a young program that
 * takes and frees one buffer of 2 MiB (battle vm) counts it once and its
 * pair runs no locked instruction. Such an instruction, right after a
 * loop that touched the block's pages, waits for their stores to drain:
 * a locked add at the free and a locked subtract at the malloc cost
 * battle vm 4% on a Xeon (measured at 6cce8c7). */
bool purger_young_untold_again(uint64_t now_ms)
{
    if (!untold_allowed(now_ms))
        return false;
    atomic_store_explicit(&untold, true, memory_order_relaxed); /* for purger_poll past the youth, as above */
    return true;
}

/* Bytes that purger_young_untold counted are no longer a block's: its
 * mapping is resized (the block counts again at its next free). */
void purger_young_retaken(size_t bytes) { atomic_fetch_sub_explicit(&young_untold_bytes, bytes, memory_order_relaxed); }

void purger_notify_freed(size_t bytes)
{
    if (!purger_young_untold(bytes, os_now_ms()))
        purger_notify();
}

void purger_notify_cached(void) { purger_notify_freed(0); }

/* The wake-up's waits time out on CLOCK_MONOTONIC, which a change of the
 * system's time does not move (pthread_cond_clockwait is glibc's alone). */
static void wake_init(void)
{
    pthread_condattr_t monotonic;
    pthread_condattr_init(&monotonic);
    pthread_condattr_setclock(&monotonic, CLOCK_MONOTONIC);
    pthread_cond_init(&purger_wake, &monotonic);
    pthread_condattr_destroy(&monotonic);
}

void purger_init(const purge_client_t *purge_clients, unsigned count, bool (*busy)(void), void (*job)(void))
{
    wake_init();
    clients = purge_clients;
    client_count = count;
    caller_busy = busy;
    settled_job = job;
    started_ms = os_now_ms();
}

/* An allocation on a slow path (a refill, a new large mapping): without the
 * thread, the purges that fell due run here, so that a program that
 * allocates again gets its memory back even when none of its calls
 * leaves pages to purge (they were the only trigger: a loop of large
 * allocations held 115 MiB of empty slabs for ever). */
void purger_poll(void)
{
    if (unlikely(!hak_config.purge_thread))
        purge_inline();
    else if (unlikely(atomic_load_explicit(&untold, memory_order_relaxed)) && !program_young() &&
             atomic_exchange_explicit(&untold, false, memory_order_relaxed))
        purger_notify();
}

/* The job runs at the next allocation whose thread is settled: asked
 * from a signal handler (it only stores), run where allocating is safe. */
void purger_request_job(void)
{
    atomic_store_explicit(&job_wanted, true, memory_order_relaxed);
    atomic_store_explicit(&hak_purger_start_wanted, true, memory_order_release);
}

/* The calling thread's heap has finished a list update: the job and the
 * thread's start that waited for it run (the job only outside a mid
 * section too, since it allocates; else it waits for the next). */
void purger_heap_settled(void)
{
    bool expected = true;
    if (!atomic_compare_exchange_strong(&hak_purger_start_wanted, &expected, false))
        return;
    if (atomic_load_explicit(&job_wanted, memory_order_relaxed)) {
        if (caller_busy())
            atomic_store_explicit(&hak_purger_start_wanted, true, memory_order_relaxed);
        else if (atomic_exchange_explicit(&job_wanted, false, memory_order_relaxed) && settled_job)
            settled_job();
    }
    if (atomic_exchange_explicit(&start_deferred, false, memory_order_relaxed))
        purger_notify();
}

/* The child has no purger thread: it starts one when it needs one. The
 * lock may have been held by the parent's purger. */
void purger_fork_child(void)
{
    pthread_mutex_init(&purger_lock, NULL);
    wake_init();
    pthread_cond_init(&purger_gone, NULL);
    atomic_store(&purger_running, false);
    purger_stop = false;
    atomic_store(&start_deferred, atomic_load(&purger_pending));
    atomic_store(&hak_purger_start_wanted, atomic_load(&purger_pending) || atomic_load(&job_wanted));
    atomic_store(&purger_pending, false);
}

/* Stop the thread and wait until the kernel has let it go: the dying
 * thread stays in the process's thread group for a moment after its last
 * instruction, and until then the kernel still counts two threads (the
 * thread's id answers a signal 0 until it is gone). The pages still
 * waiting start a new thread at the program's next slow path. */
static void purger_retire(void)
{
    int cancel_state; /* pthread_cond_wait is a cancellation point (see os.c) */
    pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &cancel_state);
    pthread_mutex_lock(&purger_lock);
    if (!atomic_load_explicit(&purger_running, memory_order_relaxed)) {
        pthread_mutex_unlock(&purger_lock);
        pthread_setcancelstate(cancel_state, NULL);
        return;
    }
    purger_stop = true;
    pthread_cond_signal(&purger_wake);
    while (atomic_load_explicit(&purger_running, memory_order_relaxed))
        pthread_cond_wait(&purger_gone, &purger_lock);
    purger_stop = false;
    pid_t tid = purger_last_tid;
    bool waiting = atomic_exchange(&purger_pending, false);
    pthread_mutex_unlock(&purger_lock);
    if (waiting)
        defer_start();
    for (int i = 0; i < 100000 && os_thread_alive(tid); i++)
        sched_yield();
    pthread_setcancelstate(cancel_state, NULL);
}

/* ---- the calls that need the program's threads alone --------------------------- */

HAK_EXPORT int unshare(int flags)
{
    purger_retire();
    return os_unshare(flags);
}

HAK_EXPORT int setns(int fd, int nstype)
{
    purger_retire();
    return os_setns(fd, nstype);
}

#ifdef __GLIBC__
/* glibc's own entry point of clone, which hakmem's clone calls on. musl
 * has none to call on: a musl build leaves clone to the C library, and a
 * child cloned without CLONE_VM while the purger held a lock would wait
 * on that lock. */
extern int __clone(int (*fn)(void *), void *stack, int flags, void *arg, ...);

/* A clone without CLONE_VM gives the child a copy of memory in which a
 * lock the purger held stays held for ever: glibc's fork runs hakmem's
 * fork handlers, its clone none, and a program of one thread may rightly
 * allocate in the child (86 of 300 children hung on their first
 * allocations in a loop that freed and cloned, HAKMEM_PURGE_DELAY_MS=1).
 * The arguments after arg are passed on as they came: glibc reads them
 * only where the flags ask for them. */
HAK_EXPORT int clone(int (*fn)(void *), void *stack, int flags, void *arg, ...)
{
    va_list more;
    va_start(more, arg);
    void *parent_tid = va_arg(more, void *), *tls = va_arg(more, void *), *child_tid = va_arg(more, void *);
    va_end(more);
    if (!(flags & CLONE_VM))
        purger_retire();
    return __clone(fn, stack, flags, arg, parent_tid, tls, child_tid);
}
#endif
