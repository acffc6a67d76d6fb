/* The call-site table: per return address of a malloc-family call, what it
 * allocated (estimated from samples for slab sizes, exact for large
 * blocks), what is still live, the size range and sampled lifetimes; and
 * the per-site rules drawn from it (HAKMEM_SITE_RULES).
 *
 * Lock-free and bounded: an entry is claimed by a CAS on its address field
 * within SITE_PROBES slots of the hash; when they are all taken the site
 * is charged to one shared overflow bucket. Counters are relaxed atomics:
 * they move at samples and large-block calls only. */
#include "internal.h"
#include "hakmem.h"

#define SITE_TABLE 1024 /* a power of two */
#define SITE_PROBES 16
#define SITE_OVERFLOW SITE_TABLE
#define SITE_OVERFLOW_ADDR ((uintptr_t)1)
#define LIFETIME_BUCKETS 192 /* kpi.c buckets: up to 2^49 ticks, about a day */

/* Rules are decided from the first blocks a site frees or allocates. */
#define RULE_BIGCACHE_TRIAL 16 /* large allocations without a BigCache hit */
#define RULE_TOUCH_TRIAL 8     /* frees of new blocks measured with mincore */
#define RULE_TOUCH_PERCENT 90  /* resident share that makes a site pre-warmed */

typedef struct site_entry {
    _Atomic uintptr_t addr; /* 0 while free */
    _Atomic uint64_t allocs, bytes, samples, frees;
    _Atomic int64_t live_bytes;
    _Atomic size_t min_size, max_size;
    _Atomic uint64_t large_allocs, bigcache_hits;
    _Atomic uint64_t touch_frees, touch_resident, touch_size;
    _Atomic uint32_t rules;           /* enum site_rule */
    _Atomic uint64_t rule_evidence[2]; /* the figures each rule was drawn from */
    _Atomic uint32_t lifetime_hist[LIFETIME_BUCKETS];
} site_entry_t;

static site_entry_t sites[SITE_TABLE + 1];

unsigned site_index_of(uintptr_t site)
{
    unsigned h = (unsigned)(((uint64_t)site * 0x9e3779b97f4a7c15ull) >> 54); /* 10 bits */
    for (unsigned k = 0; k < SITE_PROBES; k++) {
        unsigned i = (h + k) & (SITE_TABLE - 1);
        /* Claim first, compare after: a read of a page never written
         * maps the zero page, and the write that follows faults again.
         * The entry's line is written by every record anyway. */
        uintptr_t seen = 0;
        if (atomic_compare_exchange_strong_explicit(&sites[i].addr, &seen, site, memory_order_acq_rel,
                                                    memory_order_acquire) ||
            seen == site)
            return i;
    }
    atomic_store_explicit(&sites[SITE_OVERFLOW].addr, SITE_OVERFLOW_ADDR, memory_order_relaxed);
    return SITE_OVERFLOW;
}

/* min_size 0: none recorded yet. */
static void atomic_min_size(_Atomic size_t *v, size_t x)
{
    size_t cur = atomic_load_explicit(v, memory_order_relaxed);
    while ((x < cur || cur == 0) && !atomic_compare_exchange_weak_explicit(v, &cur, x, memory_order_relaxed,
                                                                             memory_order_relaxed))
        ;
}

static void atomic_max_size(_Atomic size_t *v, size_t x)
{
    size_t cur = atomic_load_explicit(v, memory_order_relaxed);
    while (x > cur && !atomic_compare_exchange_weak_explicit(v, &cur, x, memory_order_relaxed, memory_order_relaxed))
        ;
}

unsigned site_record_alloc(uintptr_t site, size_t size, uint32_t weight, bool tracked)
{
    unsigned i = site_index_of(site);
    site_entry_t *e = &sites[i];
    atomic_fetch_add_explicit(&e->allocs, weight, memory_order_relaxed);
    atomic_fetch_add_explicit(&e->bytes, (uint64_t)size * weight, memory_order_relaxed);
    atomic_fetch_add_explicit(&e->samples, 1, memory_order_relaxed);
    if (tracked)
        atomic_fetch_add_explicit(&e->live_bytes, (int64_t)(size * weight), memory_order_relaxed);
    atomic_min_size(&e->min_size, size);
    atomic_max_size(&e->max_size, size);
    return i;
}

void site_record_free(unsigned index, size_t size, uint32_t weight, uint64_t lifetime_ticks)
{
    site_entry_t *e = &sites[index];
    atomic_fetch_sub_explicit(&e->live_bytes, (int64_t)(size * weight), memory_order_relaxed);
    atomic_fetch_add_explicit(&e->frees, 1, memory_order_relaxed);
    unsigned b = kpi_bucket_of(lifetime_ticks);
    atomic_fetch_add_explicit(&e->lifetime_hist[b < LIFETIME_BUCKETS ? b : LIFETIME_BUCKETS - 1], 1,
                              memory_order_relaxed);
}

/* A large block grown or shrunk in place (realloc). */
void site_record_resize(unsigned index, size_t old_size, size_t new_size, uint32_t weight)
{
    atomic_fetch_add_explicit(&sites[index].live_bytes, ((int64_t)new_size - (int64_t)old_size) * weight,
                              memory_order_relaxed);
}

static void rule_set(site_entry_t *e, enum site_rule rule, uint64_t evidence)
{
    atomic_store_explicit(&e->rule_evidence[rule == RULE_PREWARM], evidence, memory_order_relaxed);
    uint32_t before = atomic_fetch_or_explicit(&e->rules, rule, memory_order_relaxed);
    if (hak_config.verbose && !(before & rule)) {
        msgbuf_t m = {.len = 0};
        msg_str(&m, rule == RULE_NO_BIGCACHE ? "BigCache off for site " : "pre-warm on for site ");
        msg_ptr(&m, (void *)atomic_load_explicit(&e->addr, memory_order_relaxed));
        m.buf[m.len] = 0;
        hak_warn("site rule", m.buf);
    }
}

/* A large allocation. A site whose blocks BigCache never serves gets no
 * cache: its freed blocks would only hold memory and push out other
 * sites' blocks. */
void site_record_large(unsigned index, bool bigcache_hit)
{
    site_entry_t *e = &sites[index];
    uint64_t n = atomic_fetch_add_explicit(&e->large_allocs, 1, memory_order_relaxed) + 1;
    uint64_t hits = bigcache_hit ? atomic_fetch_add_explicit(&e->bigcache_hits, 1, memory_order_relaxed) + 1
                                 : atomic_load_explicit(&e->bigcache_hits, memory_order_relaxed);
    if (hak_config.site_rules && index != SITE_OVERFLOW && n == RULE_BIGCACHE_TRIAL && hits == 0)
        rule_set(e, RULE_NO_BIGCACHE, n);
}

/* Whether the site still wants its new blocks measured at free. */
bool site_wants_touch(unsigned index)
{
    return hak_config.site_rules && index != SITE_OVERFLOW &&
           atomic_load_explicit(&sites[index].touch_frees, memory_order_relaxed) < RULE_TOUCH_TRIAL;
}

/* A freed block that was new (or purged) when handed out: how much of it
 * the program touched. A site that touches nearly all of its blocks gets
 * them faulted in with one call instead of one fault per page. */
void site_record_touched(unsigned index, size_t resident, size_t size)
{
    site_entry_t *e = &sites[index];
    uint64_t r = atomic_fetch_add_explicit(&e->touch_resident, resident, memory_order_relaxed) + resident;
    uint64_t s = atomic_fetch_add_explicit(&e->touch_size, size, memory_order_relaxed) + size;
    uint64_t n = atomic_fetch_add_explicit(&e->touch_frees, 1, memory_order_relaxed) + 1;
    if (n == RULE_TOUCH_TRIAL && r * 100 >= s * RULE_TOUCH_PERCENT)
        rule_set(e, RULE_PREWARM, s ? r * 100 / s : 0);
}

uint32_t site_rules_of(unsigned index) { return atomic_load_explicit(&sites[index].rules, memory_order_relaxed); }

static double lifetime_median_ns(const site_entry_t *e, double ns_per_tick)
{
    uint64_t hist[LIFETIME_BUCKETS];
    for (unsigned i = 0; i < LIFETIME_BUCKETS; i++)
        hist[i] = atomic_load_explicit(&e->lifetime_hist[i], memory_order_relaxed);
    return kpi_hist_percentile(hist, LIFETIME_BUCKETS, 0.5) * ns_per_tick;
}

HAK_EXPORT size_t hak_sites_get(hak_site_t *out, size_t max)
{
    hak_ensure_init();
    double ns_per_tick = kpi_ns_per_tick();
    size_t n = 0;
    for (unsigned i = 0; i <= SITE_TABLE && n < max; i++) {
        const site_entry_t *e = &sites[i];
        uintptr_t addr = atomic_load_explicit(&e->addr, memory_order_acquire);
        if (!addr || !atomic_load_explicit(&e->samples, memory_order_relaxed))
            continue;
        hak_site_t *s = &out[n++];
        s->address = i == SITE_OVERFLOW ? NULL : (void *)addr;
        s->allocs = atomic_load_explicit(&e->allocs, memory_order_relaxed);
        s->bytes = atomic_load_explicit(&e->bytes, memory_order_relaxed);
        s->samples = atomic_load_explicit(&e->samples, memory_order_relaxed);
        int64_t live = atomic_load_explicit(&e->live_bytes, memory_order_relaxed);
        s->live_bytes = live > 0 ? (uint64_t)live : 0;
        s->min_size = atomic_load_explicit(&e->min_size, memory_order_relaxed);
        s->max_size = atomic_load_explicit(&e->max_size, memory_order_relaxed);
        s->lifetimes = atomic_load_explicit(&e->frees, memory_order_relaxed);
        s->lifetime_median_ns = lifetime_median_ns(e, ns_per_tick);
        s->large_allocs = atomic_load_explicit(&e->large_allocs, memory_order_relaxed);
        s->bigcache_hits = atomic_load_explicit(&e->bigcache_hits, memory_order_relaxed);
        uint32_t rules = atomic_load_explicit(&e->rules, memory_order_relaxed);
        s->no_bigcache = (rules & RULE_NO_BIGCACHE) != 0;
        s->prewarm = (rules & RULE_PREWARM) != 0;
        s->no_bigcache_evidence = atomic_load_explicit(&e->rule_evidence[0], memory_order_relaxed);
        s->prewarm_evidence = atomic_load_explicit(&e->rule_evidence[1], memory_order_relaxed);
    }
    return n;
}
