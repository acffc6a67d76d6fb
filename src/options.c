/* Every HAKMEM_* option in one table: name, type, default, meaning and
 * bounds. This table is the one source of the options' meanings:
 * docs/options.md's table is printed from it (`make options-doc`), and
 * the ctest `options` fails when the two differ.
 * Parsing runs once at init, reads the environment with getenv and never
 * allocates; a malformed value gets a warning and the default. */
#define _GNU_SOURCE
#include "error.h"
#include "layout.h"
#include "hakmem.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>


enum option_type { OPT_BOOL, OPT_INT, OPT_SIZE, OPT_CHOICE, OPT_STRING, OPT_BYTES };

typedef struct option {
    const char *name;
    enum option_type type;
    const char *default_text;
    const char *meaning;
    void *target;         /* bool for BOOL, int for CHOICE, long for INT, size_t for SIZE and BYTES, char[max] for STRING */
    long min, max;        /* INT, SIZE and BYTES bounds; STRING: max, the buffer's size */
    const char *choices[6]; /* CHOICE: value i is choices[i] */
} option_t;

static option_t options[] = {
    {"HAKMEM_ON_ERROR", OPT_CHOICE, "abort",
     "What to do after reporting bad input (free of a foreign or interior pointer, double free): abort or warn (log and ignore).",
     &hak_config.on_error, 0, 0, {"abort", "warn", NULL}},
    {"HAKMEM_FAULT_MESSAGE", OPT_BOOL, "1",
     "On a segmentation fault or bus error inside hakmem's code (a free list or block header overwritten by the program), write a line naming the likely cause and the hardened library before the process dies as it would have. Installed where the signals are still at their default, in the shared library only.",
     &hak_config.fault_message, 0, 1, {0}},
    {"HAKMEM_MEMORY_LIMIT", OPT_BYTES, "0",
     "The most resident memory the process may use: where a new mapping would pass it, hakmem first gives back at once the pages waiting for the purge delay and what its caches hold, and only then fails the allocation with ENOMEM. 0: the limit of the cgroup the process runs in (cgroup v2 memory.max, or v1 memory.limit_in_bytes: the nearest of its cgroup and their parents that sets one, against that cgroup's use), none outside a limited cgroup.",
     &hak_config.memory_limit, 0, 1L << 50, {0}},
    {"HAKMEM_SUPERSLAB_RESERVE", OPT_INT, "1",
     "Empty 2 MiB SuperSlabs kept mapped for reuse instead of being unmapped.",
     &hak_config.superslab_reserve, 0, 1024, {0}},
    {"HAKMEM_LARGE_THRESHOLD", OPT_SIZE, "1M",
     "Blocks above this size get their own mapping; those above 16 KiB up to it are runs of pages in the page arenas.",
     &hak_config.large_threshold, LARGE_THRESHOLD_MIN, 2 << 20, {0}},
    {"HAKMEM_PURGE_DELAY_MS", OPT_INT, "100",
     "Free slab pages, the pages of large blocks held by BigCache and the free pages of the page arenas are returned to the OS (MADV_DONTNEED) once they have been free this long; 0 purges at once. Also how long an exited thread's heap waits for a new thread before a live one absorbs it or the purger drains what others freed into it.",
     &hak_config.purge_delay_ms, 0, 3600000, {0}},
    {"HAKMEM_PURGE_THREAD", OPT_BOOL, "1",
     "Purge from a background thread (started when pages wait for a purge, gone once none do), so that memory goes back while the program sleeps; 0 purges inside allocator calls only.",
     &hak_config.purge_thread, 0, 1, {0}},
    {"HAKMEM_PURGE_ADVICE", OPT_CHOICE, "dontneed",
     "How pages are purged: dontneed (MADV_DONTNEED, RSS drops at once) or free (MADV_FREE, the kernel takes them only under memory pressure: cheaper to reuse, but RSS stays high).",
     &hak_config.purge_advice, 0, 0, {"dontneed", "free", NULL}},
    {"HAKMEM_PREWARM", OPT_BOOL, "0",
     "Fault in the pages of a large block in one call when it is mapped, reused after a purge or grown by realloc (the new pages), and those of a page-arena block that are not resident when it is handed out or that its realloc adds (MADV_POPULATE_WRITE), instead of one fault per page on first touch.",
     &hak_config.prewarm, 0, 1, {0}},
    {"HAKMEM_HUGEPAGES", OPT_CHOICE, "prewarmed",
     "Transparent huge pages for the whole 2 MiB chunks of large blocks (where the system allows them on madvise): prewarmed (blocks that are pre-warmed: all with HAKMEM_PREWARM=1, or with HAKMEM_SITE_RULES=1 those of a call site that touched nearly all of its first new blocks), always (every large block of 2 MiB or more, at birth or once realloc grows it there: one fault per 2 MiB, but a chunk the program touches at all is resident whole) or never.",
     &hak_config.hugepages, 0, 0, {"never", "prewarmed", "always", NULL}},
    {"HAKMEM_BIGCACHE_SITES", OPT_INT, "64",
     "Call sites BigCache keeps freed large blocks for (hashed into this many entries); 0 turns BigCache off.",
     &hak_config.bigcache_sites, 0, 256, {0}},
    {"HAKMEM_BIGCACHE_SLOTS", OPT_INT, "4",
     "Freed large blocks BigCache keeps per call site at first; a site whose ring overflows with a block freed within the purge delay gets one more slot, up to 16; otherwise the oldest is unmapped when one more comes. In front of the rings each thread keeps the one block it freed last.",
     &hak_config.bigcache_slots, 1, 16, {0}},
    {"HAKMEM_BIGCACHE_MAX_BLOCK", OPT_SIZE, "64M",
     "Largest mapping BigCache keeps; bigger blocks are unmapped when freed.",
     &hak_config.bigcache_max_block, 1 << 20, (long)1 << 40, {0}},
    {"HAKMEM_ARENA_TRIM", OPT_SIZE, "32M",
     "Freed pages at the top of a page arena kept resident: beyond this many, the top is given back at once, down to half; the purger gives back the rest once the top has not reached it for a purge delay. Less keeps RSS lower on churn at the cost of page faults, which HAKMEM_PREWARM makes cheaper. Half of it bounds how far realloc grows a page-arena block in place past the large threshold.",
     &hak_config.arena_trim, 0, 64 << 20, {0}},
    {"HAKMEM_ARENA_POOL", OPT_SIZE, "0",
     "Bytes of freed page-arena blocks of one size (16-256 KiB) that each CPU's lane keeps in a pool, 14 blocks at most: a block freed by a thread of another lane, whose own cache of the size is full, waits there for the next malloc of the block's lane that finds its cache empty (threads that hand buffers to each other reuse them at once); given back after a purge delay. 0 (the default): no pools; 1M, say, for programs whose threads trade buffers of these sizes.",
     &hak_config.arena_pool, 0, 16 << 20, {0}},
    {"HAKMEM_MESH", OPT_CHOICE, "auto",
     "Meshing: pages of two slabs of a class whose live blocks do not overlap share one physical page, and pages with no live block go back, so that RSS follows live data after many frees: the slabs of blocks up to 8 KiB at hak_collect(true), malloc_trim(0) and a thread's exit; the tiny ones (blocks up to 1 KiB) from a thread's refills at most every 100 ms too, and from the purger over the slabs a thread's refills and sampled mallocs handed it (sleeping threads included), and over the mid ones (up to 8 KiB) where it flushes a thread's mid caches, 5 ms at a time and only where that gives back an eighth of the pages looked at. auto (the default): where the system grants a full userfaultfd (root, CAP_SYS_PTRACE or vm.unprivileged_userfaultfd=1), with which a system call writing into a block being meshed waits; on: with a userfaultfd for user-mode faults only too, where such a call fails with EFAULT for the microseconds of the copy; stress: at every refill, without a bound (for tests); off. Its memfd and userfaultfd open at the first slabs there are to mesh. Not in the hardened library; the report says why it is off. docs/architecture.md, Meshing.",
     &hak_config.mesh, 0, 0, {"off", "auto", "on", "stress", NULL}},
    {"HAKMEM_PROFILE", OPT_BOOL, "1",
     "The heap profile (sampled allocations charged to their call stacks) and the latency KPIs; 0 turns them off.",
     &hak_config.profile, 0, 1, {0}},
    {"HAKMEM_PROFILE_SAMPLE", OPT_SIZE, "2M",
     "Mean bytes a thread allocates between two samples (each interval drawn from the exponential distribution, so that an allocation of s bytes is sampled with chance 1 - exp(-s / this) and stands for the inverse of that chance in the estimates); 1 samples every allocation, for exact profiles of small programs and tests.",
     &hak_config.profile_sample, 1, (long)1 << 40, {0}},
    {"HAKMEM_PROFILE_BUDGET", OPT_INT, "1",
     "Percent of a thread's time its samples may take (the stack walk, the records, their frees): where allocations come so fast that HAKMEM_PROFILE_SAMPLE's interval would take more, that thread's mean interval doubles until they fit, and halves back once they take less than a quarter of it; the weights follow, so that the estimates stay unbiased, with fewer samples behind them. 100: no limit. The exact mode (HAKMEM_PROFILE_SAMPLE=1) has none.",
     &hak_config.profile_budget, 1, 100, {0}},
    {"HAKMEM_PROFILE_DEPTH", OPT_INT, "32",
     "Frames of a sample's call stack kept, the call site first; 1 keeps the call site alone and never unwinds.",
     &hak_config.profile_depth, 1, 64, {0}},
    {"HAKMEM_PROFILE_SIGNAL", OPT_INT, "0",
     "A signal (its number: 12 is SIGUSR2 on Linux) at which the report is written into a new file, HAKMEM_PROFILE_FILE's path (hakmem.%e.%p without one) with .1, .2, ... appended, in HAKMEM_STATS's format (text without one). The handler only asks; the report is written at the next allocation of any thread that reaches a slow path. 0: no handler.",
     &hak_config.profile_signal, 0, 64, {0}},
    {"HAKMEM_PROFILE_PEAK", OPT_SIZE, "0",
     "Write the report into a new file, as HAKMEM_PROFILE_SIGNAL does, each time the estimated live bytes of the profile exceed the peak of the last such dump by this much (gperftools' HEAP_PROFILE_INUSE_INTERVAL). 0: never.",
     &hak_config.profile_peak, 0, (long)1 << 40, {0}},
    {"HAKMEM_PROFILE_SKIP", OPT_STRING, "",
     "Allocation wrappers the report's call sites look through, comma-separated, beside the default list (xmalloc and its kin, g_malloc, PyMem_*, operator new, ...; docs/profiling.md): a function name, or a prefix ending in *.",
     hak_config.profile_skip, 0, sizeof hak_config.profile_skip, {0}},
    {"HAKMEM_SITE_RULES", OPT_BOOL, "0",
     "Per-site rules drawn from the profile: BigCache off for a site whose first 16 large blocks got no hit, pre-warm for a site whose first 8 new blocks were at least 90% touched.",
     &hak_config.site_rules, 0, 1, {0}},
    {"HAKMEM_MODE", OPT_CHOICE, "baseline",
     "Policy: baseline keeps HAKMEM_LARGE_THRESHOLD; evolving lets the UCB1 tuner move it (64K..2M) from measured KPIs (the profiling's timings: with HAKMEM_PROFILE=0 it warns and never moves), starting there.",
     &hak_config.mode, 0, 0, {"baseline", "evolving", NULL}},
    {"HAKMEM_TUNE_WINDOW_MS", OPT_INT, "1000",
     "Length of one tuner window: the KPIs of each window are one reward for the arm it ran (a window in which nothing was allocated or timed gives none).",
     &hak_config.tune_window_ms, 1, 3600000, {0}},
    {"HAKMEM_TUNE_COOLDOWN_S", OPT_INT, "180",
     "After the tuner moves the threshold, seconds before it may probe or move again.",
     &hak_config.tune_cooldown_s, 0, 86400, {0}},
    {"HAKMEM_TUNE_SEED", OPT_INT, "0",
     "Seed of the tuner's and the sampler's random choices, for reproducible runs; 0 seeds the tuner from the clock.",
     &hak_config.tune_seed, 0, (long)1 << 40, {0}},
    {"HAKMEM_STATS", OPT_CHOICE, "0",
     "Print the report on stderr at exit: 1 as text, json as one JSON object, pprof as a heap profile in the text format google-pprof reads, folded as folded stacks for flame graphs (one line per stack: frames from the outermost, separated by ';', then the bytes allocated). The report goes to a copy of stderr taken at start-up, so that a program that closes stderr still gets it, and never into a file the program opened on that descriptor.",
     &hak_config.stats, 0, 0, {"0", "1", "json", "pprof", "folded", NULL}},
    {"HAKMEM_PROFILE_FILE", OPT_STRING, "",
     "Write the report at exit to this file instead of stderr (in the format HAKMEM_STATS names, text if it names none), which also asks for it: %p in the path becomes the process's id and %e its program's name, so that every process of a command (children, programs it runs) writes its own; %% is a %.",
     hak_config.profile_file, 0, sizeof hak_config.profile_file, {0}},
    {"HAKMEM_VERBOSE", OPT_BOOL, "0",
     "Log decisions (SuperSlab maps and unmaps, purges, orphaned heaps) on stderr.",
     &hak_config.verbose, 0, 1, {0}},
};

#define OPTION_COUNT (sizeof options / sizeof options[0])

static bool parse_bool(const char *s, int *out)
{
    static const char *const yes[] = {"1", "true", "yes", "on"};
    static const char *const no[] = {"0", "false", "no", "off"};
    for (size_t i = 0; i < 4; i++) {
        if (strcasecmp(s, yes[i]) == 0)
            return *out = 1, true;
        if (strcasecmp(s, no[i]) == 0)
            return *out = 0, true;
    }
    return false;
}

/* Decimal with an optional K, M or G suffix (KiB, MiB, GiB accepted too). */
static bool parse_number(const char *s, bool suffixes, long *out)
{
    if (*s < '0' || *s > '9')
        return false;
    unsigned long long v = 0;
    while (*s >= '0' && *s <= '9') {
        v = v * 10 + (unsigned)(*s++ - '0');
        if (v > (1ull << 50))
            return false;
    }
    if (suffixes && *s) {
        unsigned shift = *s == 'K' || *s == 'k' ? 10 : *s == 'M' || *s == 'm' ? 20 : *s == 'G' || *s == 'g' ? 30
                   : *s == 'T' || *s == 't' ? 40 : 0;
        if (!shift)
            return false;
        s++;
        if (strcasecmp(s, "iB") == 0 || strcasecmp(s, "B") == 0)
            s += strlen(s);
        v <<= shift;
    }
    if (*s)
        return false;
    *out = (long)v;
    return true;
}

static void warn_value(const option_t *o, const char *value, const char *expected)
{
    msgbuf_t m = {.len = 0};
    msg_str(&m, o->name);
    msg_str(&m, "=");
    msg_str(&m, value);
    msg_str(&m, " is not ");
    msg_str(&m, expected);
    msg_str(&m, "; using the default ");
    msg_str(&m, o->default_text);
    m.buf[m.len] = 0;
    hak_warn("bad option value", m.buf);
}

static void warn_choice(const option_t *o, const char *value)
{
    msgbuf_t expected = {.len = 0};
    msg_str(&expected, "one of");
    for (int i = 0; o->choices[i]; i++) {
        msg_str(&expected, i ? ", " : " ");
        msg_str(&expected, o->choices[i]);
    }
    expected.buf[expected.len] = 0;
    warn_value(o, value, expected.buf);
}

static void option_parse(const option_t *o, const char *value)
{
    int choice;
    long number;
    switch (o->type) {
    case OPT_BOOL:
        if (parse_bool(value, &choice))
            *(bool *)o->target = choice;
        else
            warn_value(o, value, "a boolean (1/0, true/false, yes/no, on/off)");
        return;
    case OPT_CHOICE:
        for (int i = 0; o->choices[i]; i++)
            if (strcasecmp(value, o->choices[i]) == 0) {
                *(int *)o->target = i;
                return;
            }
        warn_choice(o, value);
        return;
    case OPT_STRING:
        if (strlen(value) >= (size_t)o->max) {
            warn_value(o, value, "shorter than 256 characters");
            return;
        }
        strcpy((char *)o->target, value);
        return;
    case OPT_BYTES:
        if (!parse_number(value, true, &number) || number < o->min || number > o->max)
            warn_value(o, value, "a number of bytes (e.g. 512M)");
        else
            *(size_t *)o->target = (size_t)number;
        return;
    case OPT_INT:
    case OPT_SIZE: {
        bool is_size = o->type == OPT_SIZE;
        if (!parse_number(value, is_size, &number) || number < o->min || number > o->max ||
            (is_size && (number & (number - 1)))) {
            warn_value(o, value, is_size ? "a power of two in range (e.g. 256K)" : "a number in range");
            return;
        }
        if (is_size)
            *(size_t *)o->target = (size_t)number;
        else
            *(long *)o->target = number;
        return;
    }
    }
}

/* A size set while the program runs (mallopt) for the option whose
 * target is target: rounded up to a power of two and brought into the
 * option's range, the nearest value its variable would have accepted. */
size_t option_size_fit(const void *target, size_t value)
{
    for (size_t i = 0; i < OPTION_COUNT; i++) {
        const option_t *o = &options[i];
        if (o->target != target || o->type != OPT_SIZE)
            continue;
        if (value <= (size_t)o->min)
            return (size_t)o->min;
        if (value >= (size_t)o->max)
            return (size_t)o->max;
        size_t fit = 1;
        while (fit < value)
            fit <<= 1;
        return fit;
    }
    hak_assert_fail("option_size_fit: not a size option", __FILE__, __LINE__);
}

#ifdef HAKMEM_DEBUG
/* The value hak_config starts with is the one the table documents (two
 * places to write a default: nothing else compares them). */
static bool option_default_holds(const option_t *o)
{
    if (o->type == OPT_STRING)
        return strcmp((const char *)o->target, o->default_text) == 0;
    static const size_t target_sizes[] = {sizeof(bool), sizeof(long), sizeof(size_t), sizeof(int), 0, sizeof(size_t)};
    _Static_assert(OPT_BOOL == 0 && OPT_INT == 1 && OPT_SIZE == 2 && OPT_CHOICE == 3 && OPT_BYTES == 5,
                   "target_sizes' order");
    union {
        bool b;
        int i;
        long l;
        size_t z;
    } parsed = {.z = 0};
    option_t scratch = *o;
    scratch.target = &parsed;
    option_parse(&scratch, o->default_text);
    return memcmp(&parsed, o->target, target_sizes[o->type]) == 0;
}
#endif

extern char **environ;

void options_init(void)
{
    for (size_t i = 0; i < OPTION_COUNT; i++) {
#ifdef HAKMEM_DEBUG
        if (!option_default_holds(&options[i])) /* hak_config's initial value differs from the table's */
            hak_assert_fail(options[i].name, __FILE__, __LINE__);
#endif
        const char *value = getenv(options[i].name);
        if (value)
            option_parse(&options[i], value);
    }
    /* A misspelt option would otherwise be silently ignored. */
    for (char **env = environ; env && *env; env++) {
        if (strncmp(*env, "HAKMEM_", 7) != 0)
            continue;
        size_t len = strcspn(*env, "=");
        bool known = false;
        for (size_t i = 0; i < OPTION_COUNT && !known; i++)
            known = strlen(options[i].name) == len && strncmp(options[i].name, *env, len) == 0;
        if (!known) {
            char name[96];
            size_t n = len < sizeof name - 1 ? len : sizeof name - 1;
            memcpy(name, *env, n);
            name[n] = 0;
            hak_warn("unknown option (see docs/options.md)", name);
        }
    }
    /* The tuner's rewards are the profiling's timings. */
    if (hak_config.mode == MODE_EVOLVING && !hak_config.profile)
        hak_warn("HAKMEM_MODE=evolving with HAKMEM_PROFILE=0", "nothing is timed, the tuner keeps HAKMEM_LARGE_THRESHOLD");
}

/* A size bound as the options are written: 64K, 2M, 1T. */
static void print_size(FILE *out, long v)
{
    static const char units[] = "KMGT";
    int unit = -1;
    while (v >= 1024 && v % 1024 == 0 && unit < 3)
        v /= 1024, unit++;
    if (unit < 0)
        fprintf(out, "%ld", v);
    else
        fprintf(out, "%ld%c", v, units[unit]);
}

HAK_EXPORT void hak_options_print(FILE *out)
{
    static const char *const type_names[] = {"bool", "int", "size", "choice", "string", "bytes"};
    for (size_t i = 0; i < OPTION_COUNT; i++) {
        const option_t *o = &options[i];
        fprintf(out, "%s\t%s\t%s\t%s", o->name, type_names[o->type], o->default_text, o->meaning);
        if (o->type == OPT_INT)
            fprintf(out, " From %ld to %ld.", o->min, o->max);
        if (o->type == OPT_SIZE) {
            fputs(o->min ? " A power of two from " : " 0 or a power of two up to ", out);
            if (o->min) {
                print_size(out, o->min);
                fputs(" to ", out);
            }
            print_size(out, o->max);
            fputc('.', out);
        }
        fputc('\n', out);
    }
}
