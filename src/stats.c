/* Statistics: the snapshot behind hak_stats_get, the report printed by
 * hak_stats_print and at exit with HAKMEM_STATS=1. */
#include "internal.h"
#include "hakmem.h"

#include <fcntl.h>
#include <string.h>
#include <unistd.h>

HAK_EXPORT void hak_stats_get(hak_stats_t *out)
{
    hak_ensure_init();
    memset(out, 0, sizeof *out);
    out->mapped_bytes = atomic_load(&hak_mapped_bytes);
    out->mapped_peak = atomic_load(&hak_mapped_peak);
    size_t slabs[2] = {0, 0}, bytes[2] = {0, 0};
    superslab_stats(&out->superslabs, &out->superslabs_empty, slabs, bytes);
    out->tiny_slabs = slabs[0];
    out->mid_slabs = slabs[1];
    out->tiny_bytes = bytes[0];
    out->mid_bytes = bytes[1];
    uint64_t counters[HAK_COUNTER_COUNT] = {0};
    heaps_totals(&out->heaps_live, &out->heaps_orphaned, &out->slab_refills, counters);
    out->large_allocs = atomic_load(&hak_large_allocs);
    out->bigcache_hits = atomic_load(&hak_bigcache_hits);
    out->bigcache_misses = atomic_load(&hak_bigcache_misses);
    out->bigcache_bytes = bigcache_bytes();
    out->rss_bytes = os_rss_bytes();
    os_page_faults(&out->page_faults_minor, &out->page_faults_major);
}

static double mib(size_t bytes) { return (double)bytes / (1024.0 * 1024.0); }

/* The debug counters of every heap, when the build has them. */
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

HAK_EXPORT void hak_stats_print(FILE *out)
{
    hak_stats_t s;
    hak_stats_get(&s);
    fprintf(out, "hakmem %s report\n", HAKMEM_VERSION);
    fprintf(out, "  mapped        %10.2f MiB now, %10.2f MiB peak\n", mib(s.mapped_bytes), mib(s.mapped_peak));
    fprintf(out, "  rss           %10.2f MiB\n", mib(s.rss_bytes));
    fprintf(out, "  superslabs    %10zu (%zu empty, in reserve)\n", s.superslabs, s.superslabs_empty);
    fprintf(out, "  tiny          %10zu slabs, %10.2f MiB in blocks\n", s.tiny_slabs, mib(s.tiny_bytes));
    fprintf(out, "  mid           %10zu slabs, %10.2f MiB in blocks\n", s.mid_slabs, mib(s.mid_bytes));
    fprintf(out, "  large         %10llu blocks mapped\n", (unsigned long long)s.large_allocs);
    uint64_t lookups = s.bigcache_hits + s.bigcache_misses;
    fprintf(out, "  bigcache      %10llu hits, %llu misses (%.1f%% hit rate), %.2f MiB held\n",
            (unsigned long long)s.bigcache_hits, (unsigned long long)s.bigcache_misses,
            lookups ? 100.0 * (double)s.bigcache_hits / (double)lookups : 0.0, mib(s.bigcache_bytes));
    fprintf(out, "  slab refills  %10llu\n", (unsigned long long)s.slab_refills);
    fprintf(out, "  heaps         %10zu live, %zu orphaned\n", s.heaps_live, s.heaps_orphaned);
    fprintf(out, "  page faults   %10llu minor, %llu major\n", (unsigned long long)s.page_faults_minor,
            (unsigned long long)s.page_faults_major);
    print_counters(out);
}

/* Programs may close stderr before exit (coreutils does), so the exit
 * report goes to a copy of it taken at init. */
static int report_fd = -1;

void stats_init(void)
{
    if (hak_config.stats)
        report_fd = fcntl(STDERR_FILENO, F_DUPFD_CLOEXEC, 100);
}

__attribute__((destructor)) static void stats_at_exit(void)
{
    if (report_fd < 0 || atomic_load(&hak_init_state) != 2)
        return;
    FILE *out = fdopen(report_fd, "w");
    if (out) {
        hak_stats_print(out);
        fclose(out);
    }
}
