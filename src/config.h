/* Layer 0, settings: hak_config, the settings in force (config.c holds
 * it with every option's default; options.c fills it from the
 * environment at init, and mallopt changes two of them while a program
 * runs). Data only: every layer reads it. */
#ifndef HAKMEM_CONFIG_H
#define HAKMEM_CONFIG_H

#include "base.h"

enum on_error { ON_ERROR_ABORT, ON_ERROR_WARN };
enum purge_advice { PURGE_DONTNEED, PURGE_FREE };
enum hugepages { HUGEPAGES_NEVER, HUGEPAGES_PREWARMED, HUGEPAGES_ALWAYS };
enum stats_format { STATS_OFF, STATS_TEXT, STATS_JSON, STATS_PPROF, STATS_FOLDED };
enum tune_mode { MODE_BASELINE, MODE_EVOLVING };
enum mesh_mode { MESH_OFF, MESH_AUTO, MESH_ON, MESH_STRESS };

/* The options read at setup and exit only come first, so that the ones
 * the allocation paths read start the second line: with the struct
 * 128-aligned, never the first line of a page (see superslab_t; in the
 * first line, the threshold read by every mid-size malloc cost battle
 * json an L1 miss per iteration). */
typedef struct hak_config {
    int on_error;             /* enum on_error */
    int stats;                /* enum stats_format */
    char profile_file[256];   /* the report's path at exit (%p, %e expanded), "" for stderr */
    char profile_skip[256];   /* more allocation wrappers, comma-separated (report.c) */
    long profile_depth;       /* frames of a sample's stack kept, at most */
    long profile_budget;      /* percent of a thread's time its samples may take */
    long profile_signal;      /* a dump at this signal, 0: none */
    size_t profile_peak;      /* a dump each time the live bytes' peak grows by this, 0: none */
    long superslab_reserve;
    long tune_window_ms;
    long tune_cooldown_s;
    long tune_seed;           /* 0: seeded from the clock */
    int purge_advice;         /* enum purge_advice */
    int hugepages;            /* enum hugepages: large blocks, read when one is new or purged */
    bool purge_thread;
    bool verbose;
    bool fault_message;
    int mesh;                 /* enum mesh_mode */
    size_t memory_limit;      /* bytes, 0: the cgroup's */
    _Alignas(64) size_t large_threshold;
    int mode;                 /* enum tune_mode */
    bool profile;
    bool site_rules;
    bool prewarm;
    size_t profile_sample;    /* mean bytes between samples; 1: every allocation */
    long purge_delay_ms;
    long bigcache_sites;      /* 0: no BigCache */
    long bigcache_slots;
    size_t bigcache_max_block;
    size_t arena_trim;        /* bytes */
    size_t arena_pool;        /* bytes a lane's pool of a front bin holds; 0: no pools */
} hak_config_t;

#define HAK_CONFIG_ALIGN 128
extern _Alignas(HAK_CONFIG_ALIGN) hak_config_t hak_config;
void options_init(void);
size_t option_size_fit(const void *target, size_t value);

/* mallopt may end evolving mode while other threads read it. */
static inline bool hak_evolving(void) { return __atomic_load_n(&hak_config.mode, __ATOMIC_RELAXED) == MODE_EVOLVING; }

/* The tuner moves the threshold while other threads read it. */
static inline size_t hak_large_threshold(void)
{
    return __atomic_load_n(&hak_config.large_threshold, __ATOMIC_RELAXED);
}

/* options.c: reads every HAKMEM_* variable into hak_config, once, at init. */
void options_init(void);
size_t option_size_fit(const void *target, size_t value);

#endif
