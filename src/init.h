/* Layer 10, process initialisation (init.c) and the report's hooks into
 * it (report.c). hak_ensure_init is the one call any layer may make up:
 * whichever entry point comes first runs the lazy initialisation. */
#ifndef HAKMEM_INIT_H
#define HAKMEM_INIT_H

#include "base.h"

void report_xml(FILE *out); /* malloc_info's document (report.c) */
void report_dump_job(void);   /* the profile's dumps (report.c), run by the purger's settled job */
void report_dumps_init(void); /* HAKMEM_PROFILE_SIGNAL's handler */

/* ---- Process init (init.c) --------------------------------------------- */

extern _Atomic int hak_init_state; /* 0 none, 1 running, 2 ready */
void hak_init_slow(void);
void stats_init(void);
static inline void hak_ensure_init(void)
{
    if (unlikely(atomic_load_explicit(&hak_init_state, memory_order_acquire) != 2))
        hak_init_slow();
}

#endif
