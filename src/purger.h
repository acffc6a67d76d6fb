/* Layer 4, the purger (purger.c): when free pages go back to the
 * kernel. The tiers tell it that pages wait; it calls them back only
 * through the purge clients init.c hands it. */
#ifndef HAKMEM_PURGER_H
#define HAKMEM_PURGER_H

#include "base.h"

/* A tier the purger serves, as init.c hands them to it: purge gives back
 * what has waited a purge delay (everything with force) and says when its
 * next purge falls due (0: nothing waits); release, where not NULL, gives
 * back what it holds unused when a mapping fails. */
typedef struct purge_client {
    uint64_t (*purge)(bool force);
    void (*release)(void);
    bool when_refused; /* purge(true) runs in the thread whose mapping the memory limit refused */
} purge_client_t;

extern _Atomic bool hak_purger_start_wanted;
/* clients: the tiers in the order of a pass; busy: whether the calling
 * thread is inside a list update or a mid section of its heap, where
 * starting a thread (which allocates) must wait; job: what
 * purger_request_job asks for (the profile's dumps), run where a thread
 * may allocate. */
void purger_init(const purge_client_t *clients, unsigned count, bool (*busy)(void), void (*job)(void));
void purger_request_job(void); /* async-signal-safe */
bool purger_release_caches(void);
void purger_notify(void);
bool purger_young_untold(size_t bytes, uint64_t now_ms);
bool purger_young_untold_again(uint64_t now_ms);
void purger_young_retaken(size_t bytes);
void purger_notify_freed(size_t bytes);
void purger_notify_cached(void);
void purger_poll(void);
/* The calling thread collects (hak_collect) from now on, or no longer:
 * its frees meanwhile start no inline purge pass (purge_inline). */
void purger_collecting(bool on);
void purger_heap_settled(void);

/* The calling thread has left a list update or a mid section, inside
 * which a start of the purger thread waits (purger_notify): start it now
 * if one waits. */
static inline void purger_start_if_wanted(void)
{
    if (unlikely(atomic_load_explicit(&hak_purger_start_wanted, memory_order_relaxed)))
        purger_heap_settled();
}

void purger_fork_child(void);

#endif
