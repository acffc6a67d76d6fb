/* The profiler's hooks (profile_hooks_t in hooks.h): the one way the
 * tiers reach the profiler and the tuner above them. Set by init.c. */
#include "hooks.h"

profile_hooks_t hak_profile_hooks;
