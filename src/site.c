/* The call-site table: per return address of a malloc-family call, the
 * sampled lifetimes of its blocks, its large calls and BigCache hits, and
 * the per-site rules drawn from them (HAKMEM_SITE_RULES). What a site
 * allocated is its stacks' (stack.c), added up by hak_sites_get.
 *
 * Lock-free and bounded: an entry is claimed by a CAS on its address field
 * within SITE_PROBES slots of the hash; when they are all taken the site
 * is charged to one shared overflow bucket. Counters are relaxed atomics:
 * they move at samples and large-block calls only, and the most frequent
 * ones wait in the recording thread's heap (heap_profile_t) until it
 * records another site; readers add them in. */
#include "profile.h"
#include "init.h"
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
    _Atomic uint64_t counts[SITE_COUNTS]; /* enum site_count, beside those threads still hold */
    _Atomic uint64_t touch_frees, touch_resident, touch_size;
    _Atomic size_t outgrew_arena;     /* realloc moved a block this big out of a page arena, 0: never */
    _Atomic uint32_t rules;           /* enum site_rule */
    _Atomic uint64_t rule_evidence[2]; /* the figures each rule was drawn from */
    _Atomic uint32_t lifetime_hist[LIFETIME_BUCKETS];
} site_entry_t;

/* Mapped at init rather than kept in .bss, where its 850 KiB were most
 * of the library's load segments; where init cannot map it, one spare
 * entry takes every site (the overflow bucket's, in effect). */
static site_entry_t *sites;
static site_entry_t spare;

void site_table_init(void)
{
    sites = os_map((SITE_TABLE + 1) * sizeof(site_entry_t));
    if (!sites)
        hak_warn("cannot map its call-site table", "every site is counted as one");
}

static site_entry_t *at(unsigned i) { return sites ? &sites[i] : &spare; }

/* 10 bits: SITE_TABLE's index. */
static unsigned site_hash(uintptr_t site) { return (unsigned)(((uint64_t)site * 0x9e3779b97f4a7c15ull) >> 54); }

unsigned site_index_of(uintptr_t site)
{
    if (!sites)
        return SITE_OVERFLOW;
    unsigned h = site_hash(site);
    for (unsigned k = 0; k < SITE_PROBES; k++) {
        unsigned i = (h + k) & (SITE_TABLE - 1);
        /* Claim first, compare after: a read of a page never written
         * maps the zero page, and the write that follows faults again.
         * The entry's line is written by every record anyway. */
        uintptr_t seen = 0;
        if (atomic_compare_exchange_strong_explicit(&at(i)->addr, &seen, site, memory_order_acq_rel,
                                                    memory_order_acquire) ||
            seen == site)
            return i;
    }
    atomic_store_explicit(&at(SITE_OVERFLOW)->addr, SITE_OVERFLOW_ADDR, memory_order_relaxed);
    return SITE_OVERFLOW;
}

/* ---- The recording thread's counts ---- */

/* The calling thread's counts, now those of entry i (the counts of the
 * entry before moved into the table), or NULL for a thread without a heap. */
static heap_profile_t *profile_of(unsigned i, uintptr_t site)
{
    heap_t *heap = heap_get();
    if (heap == &hak_empty_heap)
        return NULL;
    heap_profile_t *p = &heap->profile;
    unsigned held = atomic_load_explicit(&p->index, memory_order_relaxed);
    if (held != i) {
        for (unsigned c = 0; c < SITE_COUNTS; c++) {
            uint64_t n = atomic_load_explicit(&p->site_counts[c], memory_order_relaxed);
            if (n) {
                atomic_fetch_add_explicit(&at(held)->counts[c], n, memory_order_relaxed);
                atomic_store_explicit(&p->site_counts[c], 0, memory_order_relaxed);
            }
        }
        atomic_store_explicit(&p->index, i, memory_order_relaxed);
    }
    atomic_store_explicit(&p->site, site, memory_order_relaxed);
    return p;
}

/* Add n to count c of entry i: the thread's (from profile_of), or the table's. */
static void count(heap_profile_t *p, unsigned i, enum site_count c, uint64_t n)
{
    if (p)
        ADD_UNLOCKED(&p->site_counts[c], n);
    else
        atomic_fetch_add_explicit(&at(i)->counts[c], n, memory_order_relaxed);
}

/* Count c of entry i as this thread sees it: the table's and its own. */
static uint64_t count_seen(const heap_profile_t *p, unsigned i, enum site_count c)
{
    return atomic_load_explicit(&at(i)->counts[c], memory_order_relaxed) +
           (p ? atomic_load_explicit(&p->site_counts[c], memory_order_relaxed) : 0);
}

/* The calling thread's counts for entry i, whose site is known. */
static heap_profile_t *profile_of_entry(unsigned i)
{
    heap_t *heap = heap_get();
    if (heap != &hak_empty_heap && atomic_load_explicit(&heap->profile.index, memory_order_relaxed) == i)
        return &heap->profile;
    return profile_of(i, atomic_load_explicit(&at(i)->addr, memory_order_relaxed));
}

/* The calling thread's counts made those of site's entry, and the entry
 * in *index: one lookup of the heap when the thread recorded site last.
 * hak_empty_heap's site stays 0, so a match is a real heap's. */
static heap_profile_t *profile_of_site(uintptr_t site, unsigned *index)
{
    heap_profile_t *p = &heap_get()->profile;
    if (site && atomic_load_explicit(&p->site, memory_order_relaxed) == site) {
        *index = atomic_load_explicit(&p->index, memory_order_relaxed);
        return p;
    }
    *index = site_index_of(site);
    return profile_of(*index, site);
}

/* A sample's free, or a large block's: counted, and where the block's
 * birth was timed (born), its lifetime learnt. */
void site_record_lifetime(unsigned index, uint64_t born)
{
    count(profile_of_entry(index), index, SITE_FREES, 1);
    if (!born)
        return;
    unsigned b = kpi_bucket_of(hak_ticks() - born);
    ADD_UNLOCKED(&at(index)->lifetime_hist[b < LIFETIME_BUCKETS ? b : LIFETIME_BUCKETS - 1], 1);
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

static uint32_t site_rules_of(unsigned index) { return atomic_load_explicit(&at(index)->rules, memory_order_relaxed); }

/* A large allocation and its BigCache outcome; returns the entry, and
 * the site's rules in *rules. A
 * site whose blocks BigCache never serves gets no cache: its freed blocks
 * would only hold memory and push out other sites' blocks. */
unsigned site_record_large(uintptr_t site, bool bigcache_hit, uint32_t *rules)
{
    unsigned i;
    heap_profile_t *p = profile_of_site(site, &i);
    count(p, i, SITE_LARGE_ALLOCS, 1);
    if (bigcache_hit)
        count(p, i, SITE_BIGCACHE_HITS, 1);
    *rules = site_rules_of(i);
    if (!hak_config.site_rules || i == SITE_OVERFLOW || (*rules & RULE_NO_BIGCACHE))
        return i;
    /* Other threads' counts may lag, so the trial's end is passed, not met
     * exactly, in this thread's view. Hits only grow: none after the trial
     * means none during it. */
    uint64_t n = count_seen(p, i, SITE_LARGE_ALLOCS);
    if (n >= RULE_BIGCACHE_TRIAL && count_seen(p, i, SITE_BIGCACHE_HITS) == 0)
        rule_set(at(i), RULE_NO_BIGCACHE, n);
    return i;
}

/* realloc at site moved a page-arena block of size bytes, past the large
 * threshold, out of its arena (alloc.c, arena_grows_past_threshold): a copy of more
 * than the threshold, which the site's later buffers avoid by leaving at
 * the threshold. Kept whether or not HAKMEM_SITE_RULES is set: it is
 * where a block goes, not a policy drawn from the profile. */
void site_note_outgrew_arena(uintptr_t site, size_t size)
{
    if (site)
        atomic_store_explicit(&at(site_index_of(site))->outgrew_arena, size, memory_order_relaxed);
}

/* Looked up without claiming an entry: a site that was never noted has
 * none to read (and the lookup runs no locked instruction). */
bool site_outgrew_arena(uintptr_t site)
{
    unsigned h = site_hash(site);
    for (unsigned k = 0; site && sites && k < SITE_PROBES; k++) {
        const site_entry_t *e = at((h + k) & (SITE_TABLE - 1));
        uintptr_t seen = atomic_load_explicit(&e->addr, memory_order_acquire);
        if (seen == site)
            return atomic_load_explicit(&e->outgrew_arena, memory_order_relaxed) != 0;
        if (!seen)
            return false;
    }
    return site && atomic_load_explicit(&at(SITE_OVERFLOW)->outgrew_arena, memory_order_relaxed) != 0;
}

/* Whether the site still wants its new blocks measured at free. */
bool site_wants_touch(unsigned index)
{
    return hak_config.site_rules && index != SITE_OVERFLOW &&
           atomic_load_explicit(&at(index)->touch_frees, memory_order_relaxed) < RULE_TOUCH_TRIAL;
}

/* A freed block that was new (or purged) when handed out: how much of it
 * the program touched. A site that touches nearly all of its blocks gets
 * them faulted in with one call instead of one fault per page. */
void site_record_touched(unsigned index, size_t resident, size_t size)
{
    site_entry_t *e = at(index);
    uint64_t r = atomic_fetch_add_explicit(&e->touch_resident, resident, memory_order_relaxed) + resident;
    uint64_t s = atomic_fetch_add_explicit(&e->touch_size, size, memory_order_relaxed) + size;
    uint64_t n = atomic_fetch_add_explicit(&e->touch_frees, 1, memory_order_relaxed) + 1;
    if (n == RULE_TOUCH_TRIAL && r * 100 >= s * RULE_TOUCH_PERCENT)
        rule_set(e, RULE_PREWARM, s ? r * 100 / s : 0);
}

static double lifetime_median_ns(const site_entry_t *e, double ns_per_tick)
{
    uint64_t hist[LIFETIME_BUCKETS];
    for (unsigned i = 0; i < LIFETIME_BUCKETS; i++)
        hist[i] = atomic_load_explicit(&e->lifetime_hist[i], memory_order_relaxed);
    return kpi_hist_percentile(hist, LIFETIME_BUCKETS, 0.5) * ns_per_tick;
}

/* Entry i's counts: the table's and those threads still hold (a moment
 * old; a count being moved may show twice). */
static void counts_of(unsigned i, uint64_t counts[SITE_COUNTS])
{
    for (unsigned c = 0; c < SITE_COUNTS; c++)
        counts[c] = atomic_load_explicit(&at(i)->counts[c], memory_order_relaxed);
    for (heap_t *heap = heaps_all(); heap; heap = heap->next_all) {
        const heap_profile_t *p = &heap->profile;
        if (atomic_load_explicit(&p->index, memory_order_relaxed) != i)
            continue;
        for (unsigned c = 0; c < SITE_COUNTS; c++)
            counts[c] += atomic_load_explicit(&p->site_counts[c], memory_order_relaxed);
    }
}

/* size: the caller's sizeof(hak_site_t), the stride of out. */
HAK_EXPORT size_t hak_sites_get_sized(hak_site_t *out, size_t max, size_t size)
{
    hak_ensure_init();
    double ns_per_tick = kpi_ns_per_tick(true);
    size_t totals_size = (SITE_TABLE + 1) * sizeof(stack_totals_t);
    stack_totals_t *totals = os_map(totals_size);
    if (!totals)
        return 0;
    stack_sum_by_site(totals, SITE_TABLE + 1, site_index_of);
    size_t n = 0;
    for (unsigned i = sites ? 0 : SITE_OVERFLOW; i <= SITE_TABLE && n < max; i++) {
        const site_entry_t *e = at(i);
        uintptr_t addr = atomic_load_explicit(&e->addr, memory_order_acquire);
        if (!addr)
            continue;
        uint64_t counts[SITE_COUNTS];
        counts_of(i, counts);
        const stack_totals_t *t = &totals[i];
        size_t outgrew = atomic_load_explicit(&e->outgrew_arena, memory_order_relaxed);
        if (!t->samples && !counts[SITE_LARGE_ALLOCS] && !outgrew) /* claimed by a lookup, never recorded */
            continue;
        hak_site_t full = {0}, *s = &full;
        s->address = i == SITE_OVERFLOW ? NULL : (void *)addr;
        s->allocs = (uint64_t)(t->allocs + 0.5);
        s->bytes = (uint64_t)(t->bytes + 0.5);
        s->samples = t->samples;
        s->live_bytes = t->live_bytes > 0 ? (uint64_t)(t->live_bytes + 0.5) : 0;
        s->lifetimes = counts[SITE_FREES];
        s->large_allocs = counts[SITE_LARGE_ALLOCS];
        s->bigcache_hits = counts[SITE_BIGCACHE_HITS];
        s->min_size = t->min_size;
        s->max_size = t->max_size;
        s->lifetime_median_ns = lifetime_median_ns(e, ns_per_tick);
        uint32_t rules = atomic_load_explicit(&e->rules, memory_order_relaxed);
        s->no_bigcache = (rules & RULE_NO_BIGCACHE) != 0;
        s->prewarm = (rules & RULE_PREWARM) != 0;
        s->no_bigcache_evidence = atomic_load_explicit(&e->rule_evidence[0], memory_order_relaxed);
        s->prewarm_evidence = atomic_load_explicit(&e->rule_evidence[1], memory_order_relaxed);
        s->outgrew_arena = outgrew;
        hak_copy_sized((char *)out + n++ * size, size, &full, sizeof full);
    }
    os_unmap(totals, totals_size);
    return n;
}

/* hakmem 0.1.0's struct ended with prewarm_evidence. */
HAK_EXPORT size_t(hak_sites_get)(hak_site_t *out, size_t max)
{
    return hak_sites_get_sized(out, max, offsetof(hak_site_t, prewarm_evidence) + sizeof out->prewarm_evidence);
}
