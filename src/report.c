/* The report: memory per tier, RSS and page faults, latency percentiles,
 * the tuner's arms, the heap profile's top call sites by bytes and by
 * count (profile_report.c) and the site rules; as text (hak_stats_print,
 * HAKMEM_STATS=1) or as one JSON object (hak_stats_print_json,
 * HAKMEM_STATS=json); the heap profile alone for pprof or as folded
 * stacks; and the memory alone as glibc's malloc_info document. */
#define _GNU_SOURCE
#include "report.h"
#include "init.h"
#include "mesh.h"
#include "hakmem.h"

#include <dlfcn.h>
#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAX_SITES 1025 /* the site table and its overflow bucket */

static double mib(size_t bytes) { return (double)bytes / (1024.0 * 1024.0); }

typedef struct report {
    hak_stats_t stats;
    hak_kpi_t kpi;
    tuner_t tuner;
    hak_site_t *sites; /* the site table (its rules, lifetimes), NULL if it could not be copied */
    size_t site_count;
    profile_view_t profile; /* its stacks NULL if they could not be copied */
} report_t;

static void report_gather(report_t *r)
{
    hak_stats_get(&r->stats);
    hak_get_kpi(&r->kpi);
    learn_snapshot(&r->tuner);
    r->sites = hak_alloc(MAX_SITES * sizeof(hak_site_t), 0); /* site 0: not tracked */
    r->site_count = r->sites ? hak_sites_get(r->sites, MAX_SITES) : 0;
    profile_view_open(&r->profile);
}

static void report_release(report_t *r)
{
    if (r->sites)
        hak_free_checked(r->sites, "free");
    profile_view_close(&r->profile);
}

/* "symbol+0x1f (module)", or "module+0x1234" when the symbol is not
 * exported (addr2line -e module 0x1234 finds the line). */
static void site_name(const void *address, char *out, size_t size)
{
    Dl_info info;
    if (!address) {
        snprintf(out, size, "(other sites: the table was full)");
        return;
    }
    if (!dladdr(address, &info) || !info.dli_fname) {
        snprintf(out, size, "%p", address);
        return;
    }
    const char *module = strrchr(info.dli_fname, '/');
    module = module ? module + 1 : info.dli_fname;
    if (info.dli_sname && info.dli_saddr)
        snprintf(out, size, "%s+0x%zx (%s)", info.dli_sname, (size_t)((const char *)address - (const char *)info.dli_saddr),
                 module);
    else
        snprintf(out, size, "%s+0x%zx", module, (size_t)((const char *)address - (const char *)info.dli_fbase));
}

/* ---- text ----------------------------------------------------------------- */

static void print_counters(FILE *out)
{
#ifdef HAKMEM_COUNTERS
    static const char *const what[] = {
#define HAK_COUNTER_TEXT(name, text) text,
        HAK_COUNTER_LIST(HAK_COUNTER_TEXT)
#undef HAK_COUNTER_TEXT
    };
    size_t live = 0, orphaned = 0;
    uint64_t refills = 0, counters[HAK_COUNTER_COUNT] = {0};
    heaps_totals(&live, &orphaned, &refills, counters);
    fprintf(out, "  debug counters (HAKMEM_COUNTERS build)\n");
    for (unsigned i = 0; i < HAK_COUNTER_COUNT; i++)
        fprintf(out, "    %14llu  %s\n", (unsigned long long)counters[i], what[i]);
#else
    (void)out;
#endif
}

/* What the mesh line adds: why nothing meshed yet, or a limit. A thread
 * under a seccomp filter makes none of meshing's system calls (Docker's
 * default profile filters every process), so a filtered process that
 * never started meshing is told so, not that it had nothing to mesh. */
static const char *mesh_state_note(void)
{
    if (!mesh_started())
        return os_thread_filtered() ? "; not started (this thread runs under a seccomp filter, where meshing "
                                      "makes none of its system calls)"
                                    : "; not started (nothing to mesh yet)";
    return mesh_kernel_writes_wait() ? ""
                                     : "; userfaultfd for user-mode faults only: a system call writing into a "
                                       "block while it is meshed fails with EFAULT";
}

static void print_memory(FILE *out, const hak_stats_t *s)
{
    fprintf(out, "  mapped        %10.2f MiB now, %10.2f MiB peak\n", mib(s->mapped_bytes), mib(s->mapped_peak));
    if (os_memory_limit())
        fprintf(out, "  memory limit  %10.2f MiB, from %s\n", mib(os_memory_limit()), os_memory_limit_source());
    fprintf(out, "  superslabs    %10zu (%zu empty, in reserve)\n", s->superslabs, s->superslabs_empty);
    fprintf(out, "  tiny          %10zu slabs, %10.2f MiB in blocks\n", s->tiny_slabs, mib(s->tiny_bytes));
    fprintf(out, "  mid           %10zu slabs, %10.2f MiB in blocks\n", s->mid_slabs, mib(s->mid_bytes));
    fprintf(out, "  page arenas   %10zu, %10.2f MiB in blocks (%.2f MiB of them in the lanes' pools), %.2f MiB free (%.2f MiB awaiting a purge)\n",
            s->arenas, mib(s->arena_bytes), mib(s->arena_pooled_bytes), mib(s->arena_free_bytes), mib(s->arena_dirty_bytes));
    fprintf(out, "  large         %10zu blocks in use, %10.2f MiB mapped; %llu ever mapped, %llu with huge pages\n",
            s->large_blocks, mib(s->large_bytes), (unsigned long long)s->large_allocs, (unsigned long long)s->large_huge);
    uint64_t lookups = s->bigcache_hits + s->bigcache_misses;
    fprintf(out, "  bigcache      %10llu hits, %llu misses (%.1f%% hit rate; %llu resized a cached block), %.2f MiB held\n",
            (unsigned long long)s->bigcache_hits, (unsigned long long)s->bigcache_misses,
            lookups ? 100.0 * (double)s->bigcache_hits / (double)lookups : 0.0,
            (unsigned long long)s->bigcache_reshaped, mib(s->bigcache_bytes));
    fprintf(out, "  slab refills  %10llu\n", (unsigned long long)s->slab_refills);
    fprintf(out, "  heaps         %10zu live, %zu orphaned\n", s->heaps_live, s->heaps_orphaned);
    if (hak_config.mesh && mesh_off_reason())
        fprintf(out, "  mesh          off: %s\n", mesh_off_reason());
    else if (hak_config.mesh)
        fprintf(out, "  mesh          %10zu pages given back now (%.2f MiB), %llu meshed in all%s\n", s->mesh_pages,
                mib(s->mesh_pages * MESH_PAGE), (unsigned long long)s->mesh_pages_ever, mesh_state_note());
}

static void print_kpi(FILE *out, const hak_kpi_t *k)
{
    fprintf(out, "  rss           %10.2f MiB now, %10.2f MiB peak\n", mib(k->rss_bytes), mib(k->rss_peak_bytes));
    fprintf(out, "  page faults   %10llu soft, %llu hard\n", (unsigned long long)k->page_faults_minor,
            (unsigned long long)k->page_faults_major);
    if (k->latency_samples)
        fprintf(out, "  latency       p50 %.0f ns, p95 %.0f ns, p99 %.0f ns, mean %.0f ns (%llu timed samples for %llu allocations%s)\n",
                k->latency_p50_ns, k->latency_p95_ns, k->latency_p99_ns, k->latency_mean_ns,
                (unsigned long long)k->latency_samples, (unsigned long long)k->latency_allocations,
                k->latency_samples < 100 ? ": too few for percentiles to mean much" : "");
    else
        fprintf(out, "  latency       no samples (HAKMEM_PROFILE=0 or too few allocations)\n");
}

static void print_tuner(FILE *out, const tuner_t *t)
{
    fprintf(out, "  policy        %s, large threshold %zu KiB\n",
            hak_evolving() ? "evolving" : "baseline", tuner_arm_threshold[t->current] >> 10);
    if (!hak_evolving())
        return;
    fprintf(out, "  tuner         %llu windows, %llu moves; arms (threshold: windows, mean reward):\n",
            (unsigned long long)t->windows, (unsigned long long)t->moves);
    for (int a = 0; a < TUNER_ARMS; a++)
        fprintf(out, "    %6zuK: %6llu  %.3f%s\n", tuner_arm_threshold[a] >> 10, (unsigned long long)t->trials[a],
                tuner_mean_reward(t, a), a == t->current ? "  <- chosen" : "");
}

static void print_sites(FILE *out, report_t *r)
{
    if (r->profile.stacks)
        profile_print_sites(out, &r->profile);
    bool any_rule = false;
    for (size_t i = 0; r->sites && i < r->site_count; i++) {
        const hak_site_t *s = &r->sites[i];
        if (!s->no_bigcache && !s->prewarm && !s->outgrew_arena)
            continue;
        if (!any_rule)
            fprintf(out, "  site rules (HAKMEM_SITE_RULES=1) and realloc sites\n");
        any_rule = true;
        char name[256];
        site_name(s->address, name, sizeof name);
        if (s->no_bigcache)
            fprintf(out, "    %s: BigCache off: no hit in its first %llu large blocks\n", name,
                    (unsigned long long)s->no_bigcache_evidence);
        if (s->prewarm)
            fprintf(out, "    %s: pre-warm on: its first new blocks were %llu%% touched\n", name,
                    (unsigned long long)s->prewarm_evidence);
        if (s->outgrew_arena)
            fprintf(out, "    %s: buffers leave the page arenas at the large threshold (one grown to %zu bytes "
                         "had to move out)\n",
                    name, s->outgrew_arena);
    }
}

HAK_EXPORT void hak_stats_print(FILE *out)
{
    report_t r;
    report_gather(&r);
    fprintf(out, "hakmem %s report\n", HAKMEM_VERSION);
    char parent[64] = "not asked under a seccomp filter";
    int ppid = os_parent_pid();
    if (ppid >= 0)
        snprintf(parent, sizeof parent, "%d", ppid);
    fprintf(out, "  process       pid %d, %s (parent %s)\n", os_pid(), os_program_name(), parent);
    if (r.stats.hardened)
        fprintf(out, "  hardened      encoded free lists, guard pages, random order\n");
    print_memory(out, &r.stats);
    print_kpi(out, &r.kpi);
    print_tuner(out, &r.tuner);
    print_sites(out, &r);
    print_counters(out);
    report_release(&r);
}

/* ---- JSON ------------------------------------------------------------------ */

static void json_site(FILE *out, const hak_site_t *s)
{
    char name[256];
    site_name(s->address, name, sizeof name);
    fprintf(out, "{\"address\":\"%p\",\"name\":", s->address);
    json_string(out, name);
    fprintf(out,
            ",\"allocs\":%llu,\"bytes\":%llu,\"live_bytes\":%llu,\"samples\":%llu,\"min_size\":%zu,"
            "\"max_size\":%zu,\"lifetimes\":%llu,\"lifetime_median_ns\":%.0f,\"large_allocs\":%llu,"
            "\"bigcache_hits\":%llu,\"rules\":{\"no_bigcache\":%s,\"prewarm\":%s},\"outgrew_arena\":%zu}",
            (unsigned long long)s->allocs, (unsigned long long)s->bytes, (unsigned long long)s->live_bytes,
            (unsigned long long)s->samples, s->min_size, s->max_size, (unsigned long long)s->lifetimes,
            s->lifetime_median_ns, (unsigned long long)s->large_allocs, (unsigned long long)s->bigcache_hits,
            s->no_bigcache ? "true" : "false", s->prewarm ? "true" : "false", s->outgrew_arena);
}

HAK_EXPORT void hak_stats_print_json(FILE *out)
{
    report_t r;
    report_gather(&r);
    const hak_stats_t *s = &r.stats;
    const hak_kpi_t *k = &r.kpi;
    char parent[16] = "null"; /* not asked under a seccomp filter (os_parent_pid) */
    int ppid = os_parent_pid();
    if (ppid >= 0)
        snprintf(parent, sizeof parent, "%d", ppid);
    fprintf(out, "{\"version\":\"%s\",\"pid\":%d,\"ppid\":%s,\"program\":", HAKMEM_VERSION, os_pid(), parent);
    json_string(out, os_program_name());
    fprintf(out, ",\"hardened\":%s,\"memory\":{\"mapped_bytes\":%zu,\"mapped_peak\":%zu,\"superslabs\":%zu,"
                 "\"superslabs_empty\":%zu,\"tiny_slabs\":%zu,\"mid_slabs\":%zu,\"tiny_bytes\":%zu,\"mid_bytes\":%zu,"
                 "\"arenas\":%zu,\"arena_bytes\":%zu,\"arena_pooled_bytes\":%zu,\"arena_free_bytes\":%zu,\"arena_dirty_bytes\":%zu,"
                 "\"large_blocks\":%zu,\"large_bytes\":%zu,\"large_allocs\":%llu,\"large_huge\":%llu,\"bigcache_hits\":%llu,\"bigcache_misses\":%llu,"
                 "\"bigcache_reshaped\":%llu,\"bigcache_bytes\":%zu,\"slab_refills\":%llu,\"heaps_live\":%zu,\"heaps_orphaned\":%zu,"
                 "\"mesh_pages\":%zu,\"mesh_pages_ever\":%llu,\"memory_limit\":%zu},",
            s->hardened ? "true" : "false", s->mapped_bytes, s->mapped_peak, s->superslabs, s->superslabs_empty, s->tiny_slabs,
            s->mid_slabs, s->tiny_bytes, s->mid_bytes, s->arenas, s->arena_bytes, s->arena_pooled_bytes, s->arena_free_bytes,
            s->arena_dirty_bytes, s->large_blocks, s->large_bytes, (unsigned long long)s->large_allocs, (unsigned long long)s->large_huge,
            (unsigned long long)s->bigcache_hits, (unsigned long long)s->bigcache_misses,
            (unsigned long long)s->bigcache_reshaped, s->bigcache_bytes, (unsigned long long)s->slab_refills, s->heaps_live, s->heaps_orphaned,
            s->mesh_pages, (unsigned long long)s->mesh_pages_ever, os_memory_limit());
    fprintf(out, "\"kpi\":{\"rss_bytes\":%zu,\"rss_peak_bytes\":%zu,\"page_faults_minor\":%llu,"
                 "\"page_faults_major\":%llu,\"latency_samples\":%llu,\"latency_mean_ns\":%.1f,\"latency_p50_ns\":%.1f,"
                 "\"latency_p95_ns\":%.1f,\"latency_p99_ns\":%.1f,\"latency_allocations\":%llu},",
            k->rss_bytes, k->rss_peak_bytes, (unsigned long long)k->page_faults_minor,
            (unsigned long long)k->page_faults_major, (unsigned long long)k->latency_samples, k->latency_mean_ns,
            k->latency_p50_ns, k->latency_p95_ns, k->latency_p99_ns, (unsigned long long)k->latency_allocations);
    const tuner_t *t = &r.tuner;
    fprintf(out, "\"policy\":{\"mode\":\"%s\",\"large_threshold\":%zu,\"windows\":%llu,\"moves\":%llu,\"arms\":[",
            hak_evolving() ? "evolving" : "baseline", tuner_arm_threshold[t->current],
            (unsigned long long)t->windows, (unsigned long long)t->moves);
    for (int a = 0; a < TUNER_ARMS; a++)
        fprintf(out, "%s{\"threshold\":%zu,\"windows\":%llu,\"mean_reward\":%.4f}", a ? "," : "",
                tuner_arm_threshold[a], (unsigned long long)t->trials[a], tuner_mean_reward(t, a));
    fprintf(out, "]},\"sites\":[");
    for (size_t i = 0; r.sites && i < r.site_count; i++) {
        if (i)
            fputc(',', out);
        json_site(out, &r.sites[i]);
    }
    fprintf(out, "],");
    profile_print_json_stacks(out, &r.profile);
    fprintf(out, "}\n");
    report_release(&r);
}

/* The heap profile alone, in pprof's or the folded format. */
static void print_profile(FILE *out, int format)
{
    profile_view_t v;
    if (!profile_view_open(&v))
        return;
    if (format == STATS_PPROF)
        profile_print_pprof(out, &v);
    else
        profile_print_folded(out, &v);
    profile_view_close(&v);
}

/* The report in one of HAKMEM_STATS's formats (STATS_OFF: text). */
static void print_report(FILE *out, int format)
{
    if (format == STATS_JSON)
        hak_stats_print_json(out);
    else if (format == STATS_PPROF || format == STATS_FOLDED)
        print_profile(out, format);
    else
        hak_stats_print(out);
}

/* malloc_info's document: glibc's root and the elements glibc has, with
 * hakmem's figures (<total type="mmap">: the large blocks in use, each in
 * its own mapping; <system>: what hakmem has mapped now and at most;
 * <aspace>: the same address space), then a <total> for each of hakmem's
 * tiers and BigCache, and the resident set. A reader of glibc's document
 * finds what it looks for; no <heap> elements, as hakmem has no arenas
 * shared by threads. */
void report_xml(FILE *out)
{
    hak_stats_t s;
    hak_stats_get(&s);
    fprintf(out, "<malloc version=\"1\">\n<allocator name=\"hakmem\" version=\"%s\" hardened=\"%d\"/>\n",
            HAKMEM_VERSION, s.hardened);
    fprintf(out, "<total type=\"mmap\" count=\"%zu\" size=\"%zu\"/>\n", s.large_blocks, s.large_bytes);
    fprintf(out, "<total type=\"tiny\" slabs=\"%zu\" size=\"%zu\"/>\n", s.tiny_slabs, s.tiny_bytes);
    fprintf(out, "<total type=\"mid\" slabs=\"%zu\" size=\"%zu\"/>\n", s.mid_slabs, s.mid_bytes);
    fprintf(out, "<total type=\"arena\" arenas=\"%zu\" size=\"%zu\" pooled=\"%zu\" free=\"%zu\" dirty=\"%zu\"/>\n",
            s.arenas, s.arena_bytes, s.arena_pooled_bytes, s.arena_free_bytes, s.arena_dirty_bytes);
    fprintf(out, "<total type=\"bigcache\" size=\"%zu\"/>\n", s.bigcache_bytes);
    fprintf(out, "<system type=\"current\" size=\"%zu\"/>\n<system type=\"max\" size=\"%zu\"/>\n", s.mapped_bytes,
            s.mapped_peak);
    fprintf(out, "<aspace type=\"total\" size=\"%zu\"/>\n<rss size=\"%zu\"/>\n</malloc>\n", s.mapped_bytes, s.rss_bytes);
}

/* ---- at exit ----------------------------------------------------------------- */

/* Programs may close stderr before exit (coreutils does), so the exit
 * report goes to a copy of it taken at init. A program may close that
 * copy too (daemons close every descriptor above stderr) and open a file
 * that gets its number: the report goes to the copy only while it names
 * the file it named at init, else to stderr if that still does, else
 * nowhere, never into the program's file. */
static int report_fd = -1;
static os_file_id_t report_file;

static bool names_report_file(int fd) { return os_file_is(fd, &report_file); }

/* The copy takes a number out of the way of the program's (os_dup_aside). */
void stats_init(void)
{
    if (hak_config.stats == STATS_OFF || hak_config.profile_file[0])
        return;
    report_fd = os_dup_aside(STDERR_FILENO);
    if (report_fd >= 0 && !os_file_id(report_fd, &report_file))
        report_fd = -1;
}

/* A program that never allocates (true) still gets its report: hakmem
 * starts before main where one is asked for, not at the first malloc. */
__attribute__((constructor)) static void report_asked(void)
{
    os_keep_program_name();
    if (getenv("HAKMEM_STATS") || getenv("HAKMEM_PROFILE_FILE") || getenv("HAKMEM_PROFILE_SIGNAL"))
        hak_ensure_init();
}

/* A path template with %p (the process's id), %e (its program's name)
 * and %% expanded into path; false if it does not fit. */
static bool report_path(const char *template, char *path, size_t size)
{
    size_t n = 0;
    for (const char *s = template; *s; s++) {
        char number[24];
        const char *piece = NULL;
        if (s[0] == '%' && s[1] == 'p')
            snprintf(number, sizeof number, "%d", os_pid()), piece = number, s++;
        else if (s[0] == '%' && s[1] == 'e')
            piece = os_program_name(), s++;
        else if (s[0] == '%' && s[1] == '%')
            piece = "%", s++;
        size_t len = piece ? strlen(piece) : 1;
        if (n + len >= size)
            return false;
        memcpy(path + n, piece ? piece : s, len);
        n += len;
    }
    path[n] = 0;
    return true;
}

/* The report's file: HAKMEM_PROFILE_FILE's, else the copy of stderr while
 * it names the file it named at init, else stderr if that still does;
 * -1 for none. */
static int report_open(void)
{
    if (hak_config.profile_file[0]) {
        char path[512];
        if (!report_path(hak_config.profile_file, path, sizeof path)) {
            hak_warn("cannot write the report: the path of HAKMEM_PROFILE_FILE is too long", hak_config.profile_file);
            return -1;
        }
        int fd = os_create(path);
        if (fd < 0)
            hak_warn("cannot write the report to HAKMEM_PROFILE_FILE", strerror(errno));
        return fd;
    }
    if (report_fd < 0)
        return -1;
    return names_report_file(report_fd) ? report_fd : names_report_file(STDERR_FILENO) ? os_dup(STDERR_FILENO, 0) : -1;
}

__attribute__((destructor)) static void report_at_exit(void)
{
    if ((hak_config.stats == STATS_OFF && !hak_config.profile_file[0]) || atomic_load(&hak_init_state) != 2)
        return;
    stack_pause(true);
    int fd = report_open();
    FILE *out = fd >= 0 ? fdopen(fd, "w") : NULL;
    if (out) {
        print_report(out, hak_config.stats);
        fclose(out);
    }
    stack_pause(false);
}

/* The report now, into a file: format "text", "json", "pprof" or
 * "folded", NULL for HAKMEM_STATS's (text if it names none). */
HAK_EXPORT int hak_profile_dump(const char *path, const char *format)
{
    static const char *const formats[] = {"text", "text", "json", "pprof", "folded"};
    int f = hak_config.stats;
    if (format) {
        for (f = STATS_FOLDED; f > STATS_OFF && strcmp(format, formats[f]) != 0; f--)
            ;
        if (f == STATS_OFF) {
            errno = EINVAL;
            return -1;
        }
    }
    hak_ensure_init();
    int fd = os_create(path);
    if (fd < 0)
        return -1;
    stack_pause(true);
    FILE *out = fdopen(fd, "w");
    if (out)
        print_report(out, f);
    int closed = out ? fclose(out) : (os_close(fd), -1);
    stack_pause(false);
    return closed == 0 ? 0 : -1;
}

/* ---- dumps while the program runs ------------------------------------------ */

/* A dump asked for by HAKMEM_PROFILE_SIGNAL or HAKMEM_PROFILE_PEAK (the
 * purger's settled job, run where the thread may allocate): the report
 * into HAKMEM_PROFILE_FILE's path, or hakmem.%e.%p, with .1, .2, ...
 * appended. */
void report_dump_job(void)
{
    static _Atomic unsigned dumps;
    char path[512];
    const char *template = hak_config.profile_file[0] ? hak_config.profile_file : "hakmem.%e.%p";
    if (!report_path(template, path, sizeof path - 16)) {
        hak_warn("cannot write a profile dump: the path of HAKMEM_PROFILE_FILE is too long", template);
        return;
    }
    size_t n = strlen(path);
    snprintf(path + n, sizeof path - n, ".%u", atomic_fetch_add(&dumps, 1) + 1);
    if (hak_profile_dump(path, NULL) != 0)
        hak_warn("cannot write a profile dump", path);
}

static void dump_asked(int signal)
{
    (void)signal;
    purger_request_job();
}

/* HAKMEM_PROFILE_SIGNAL's handler, which only asks for the dump. */
void report_dumps_init(void)
{
    if (!hak_config.profile_signal)
        return;
    struct sigaction action;
    memset(&action, 0, sizeof action);
    action.sa_handler = dump_asked;
    action.sa_flags = SA_RESTART;
    sigemptyset(&action.sa_mask);
    if (sigaction((int)hak_config.profile_signal, &action, NULL) != 0)
        hak_warn("cannot install the handler of HAKMEM_PROFILE_SIGNAL", strerror(errno));
}
