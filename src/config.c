/* The settings in force: hak_config, with every option's default. Data
 * only, at the bottom of the layers, so that the OS layer and the
 * diagnostics read their settings without depending on the parser above
 * them (options.c, which fills it from the environment at init; its
 * table names the same defaults, and the debug build checks that the two
 * agree). */
#include "config.h"

_Alignas(HAK_CONFIG_ALIGN) hak_config_t hak_config = {
    .on_error = ON_ERROR_ABORT,
    .superslab_reserve = 1,
    .large_threshold = (size_t)1 << 20,
    .purge_delay_ms = 100,
    .purge_thread = true,
    .purge_advice = PURGE_DONTNEED,
    .hugepages = HUGEPAGES_PREWARMED,
    .bigcache_sites = 64,
    .bigcache_slots = 4,
    .bigcache_max_block = (size_t)64 << 20,
    .arena_trim = (size_t)32 << 20,
    .mesh = MESH_AUTO,
    .fault_message = true,
    .profile = true,
    .profile_sample = 2 << 20,
    .profile_depth = 32,
    .profile_budget = 1,
    .mode = MODE_BASELINE,
    .tune_window_ms = 1000,
    .tune_cooldown_s = 180,
};
