/* Sampled allocations. Each thread counts the bytes it allocates down
 * from an interval drawn from the exponential distribution of mean
 * HAKMEM_PROFILE_SAMPLE: the allocation that takes the count to zero or
 * below is sampled. The sample points so fall as a Poisson process on the
 * bytes allocated, and an allocation of s bytes is sampled with chance
 * 1 - exp(-s / mean) whatever came before it: each sample stands for
 * 1 / that chance allocations like it (its weight), the unbiased
 * estimate tcmalloc and jemalloc use; an allocation as large as the mean
 * is sampled 63% of the time, one of five times the mean 99.3%. With
 * HAKMEM_PROFILE_SAMPLE=1 every allocation is sampled, with weight 1.
 *
 * A sample is timed for the latency KPIs, charged to its call stack
 * (stack.c) and, but for large blocks, served from a place whose free is
 * seen without any check on the free fast path:
 *
 *  - tiny sizes from the sample arena: 2 MiB chunks marked SEG_SAMPLED in
 *    the segment map, so that free takes its slow path, each of slots of
 *    one size, 64, 256 or 1024 bytes: a sample takes the smallest that
 *    holds its class (with 1 KiB slots for all, the samples of a million
 *    16 B blocks added 1.6% to their RSS); each slot records its stack,
 *    size, weight and birth (for lifetimes);
 *  - larger sizes, up to the large threshold, from the page arenas: the
 *    block's head entry in its arena's map is flagged (the thread fronts
 *    never take it) and points to the sample's record in a table here.
 *    Served by the large tier, as they were, each sample cost a mapping's
 *    faults and an munmap (bench mid at two threads: 158 M ops/s against
 *    250 without profiling, measured at 3f67a08);
 *  - large blocks stay where they are, their header holding the record's
 *    index.
 *
 * The block a slab-sized allocation took goes back to the cache. */
#include "profile.h"
#include "hakmem.h"

#include <limits.h>
#include <pthread.h>
#include <string.h>

#define ARENA_MIN_SLOT_SHIFT 6 /* slots of 1 << 6, 8 or 10 bytes */
#define ARENA_SLOT_KINDS 3
#define ARENA_MAGIC 0x48414b50u /* "HAKP" */

_Static_assert(TINY_MAX == 1 << (ARENA_MIN_SLOT_SHIFT + 2 * (ARENA_SLOT_KINDS - 1)), "the largest slot holds a tiny block");

/* A sample's record: a slot's in the sample arena, or a page-arena
 * block's in the record table. */
typedef struct sample_record {
    uint64_t born;   /* hak_ticks() at allocation, 0: no lifetime to record */
    size_t size;     /* asked for (0 is a size too) */
    float weight;    /* allocations the sample stands for (at least 1); 0 while free */
    union {
        uint32_t stack; /* its stack table entry, while live */
        uint32_t next;  /* the next free record, 0 for none, while free */
    };
} sample_record_t;

/* The header takes the first slots. Descriptors are for the slots after
 * those, from the first (slot[i - first_slot]), so that a chunk with a few
 * samples touches the header's first page only (the array's pages are
 * touched as slots are handed out, in order). */
typedef struct arena_chunk {
    uint32_t magic;
    uint32_t slot_shift;
    uint32_t first_slot; /* the ones below hold the header */
    uint32_t free_head;  /* a free slot, 0 for none */
    uint32_t carved;     /* slots below were handed out at least once (the header's included) */
    uint32_t live;
    struct arena_chunk *next;
    sample_record_t slot[]; /* (SS_SIZE >> slot_shift) - first_slot */
} arena_chunk_t;

static pthread_mutex_t sample_lock = PTHREAD_MUTEX_INITIALIZER; /* the sample arena's and the record table's */
static arena_chunk_t *arena_chunks[ARENA_SLOT_KINDS]; /* by slot size */

/* ---- sampling intervals ---------------------------------------------------- */

#define LN2 0.69314718055994530942
#define BUDGET_WINDOW 16              /* samples between two looks at the budget */
#define BUDGET_BURST_NS 500000.0      /* credit a thread starts with, and keeps at most */
#define MEAN_MAX ((size_t)1 << 40)    /* HAKMEM_PROFILE_SAMPLE's bound */


/* The natural logarithm of x in (0, 1], to a few parts in 10^8 (no libm:
 * hakmem links nothing but libc): x = m 2^e with m in [0.7, 1.4],
 * ln m = 2 atanh(t), t = (m - 1) / (m + 1), |t| < 0.18, by five terms of
 * its series. */
static double log_of(double x)
{
    uint64_t bits;
    memcpy(&bits, &x, sizeof bits);
    int e = (int)((bits >> 52) & 0x7ff) - 1023;
    bits = (bits & 0xfffffffffffffull) | 0x3ff0000000000000ull;
    double m;
    memcpy(&m, &bits, sizeof m);
    if (m > 1.4142135623730951)
        m /= 2, e++;
    double t = (m - 1) / (m + 1), t2 = t * t;
    return 2 * t * (1 + t2 * (1.0 / 3 + t2 * (1.0 / 5 + t2 * (1.0 / 7 + t2 / 9)))) + e * LN2;
}

/* 1 - exp(-x) for x >= 0, without the cancellation of 1 - exp(-x) for
 * small x: exp(-x) = 2^-k exp(-r), r in [0, ln 2), by Horner's form of
 * its series (10 terms: within 10^-8, and a weight is a float), with the
 * reciprocals of the factors written out: a division each took more
 * time than the sample's stack walk. */
static double one_minus_exp_neg(double x)
{
    static const double inverse[] = {0, 1, 1.0 / 2, 1.0 / 3, 1.0 / 4, 1.0 / 5, 1.0 / 6, 1.0 / 7, 1.0 / 8, 1.0 / 9, 1.0 / 10};
    if (x < 1e-3) /* x - x^2/2 + x^3/6: within 10^-13 */
        return x * (1 - x / 2 * (1 - x / 3));
    if (x > 40)
        return 1;
    int k = (int)(x * (1 / LN2));
    double r = -(x - k * LN2), e = 1;
    for (int n = 10; n > 0; n--)
        e = 1 + r * e * inverse[n];
    return 1 - e / (double)((uint64_t)1 << k);
}

/* Bytes to the next sample point, a draw from the exponential
 * distribution of the given mean (rounded up: an allocation of s bytes is
 * then sampled when the draw is at most s); 0 samples every allocation. */
static long next_interval(uint64_t *rng, size_t mean)
{
    if (!hak_config.profile)
        return LONG_MAX;
    if (hak_config.profile_sample <= 1)
        return 0;
    double u = (double)((xorshift64(rng) >> 11) + 1) * 0x1p-53; /* (0, 1] */
    double bytes = -log_of(u) * (double)mean;
    return bytes < 0x1p62 ? (long)bytes + 1 : LONG_MAX;
}

/* A heap taken by a thread (new, or one an exited thread left). */
void sample_heap_init(heap_t *heap)
{
    if (!heap->sample_rng)
        heap->sample_rng = (((uint64_t)(uintptr_t)heap * 0x9e3779b97f4a7c15ull) ^ (uint64_t)hak_config.tune_seed) | 1;
    heap->sample_mean = hak_config.profile_sample;
    heap->sample_spent = heap->sample_window = 0;
    heap->sample_credit_ns = BUDGET_BURST_NS;
    heap->sample_looked = hak_ticks();
    heap->sample_left = next_interval(&heap->sample_rng, heap->sample_mean);
}

/* The weight of a sample of size bytes drawn at the given mean interval:
 * 1 / the chance of its sampling. */
static float sample_weight(size_t size, size_t mean)
{
    if (hak_config.profile_sample <= 1)
        return 1;
    double chance = one_minus_exp_neg((double)size / (double)mean);
    return chance > 1e-12 ? (float)(1 / chance) : (float)mean;
}

/* ---- the time budget ---------------------------------------------------------- */

static _Atomic size_t mean_peak; /* the largest mean interval any thread took */

/* A bucket of credit: a thread's time earns it HAKMEM_PROFILE_BUDGET
 * percent of itself, its samples spend it (their stack walks, records
 * and frees, timed), and it holds BUDGET_BURST_NS at most, where a thread
 * starts. Where the credit runs out, the thread's mean interval doubles
 * (at most once every BUDGET_WINDOW samples, the evidence of a few); once
 * the samples take less than half of what the time earned, it halves
 * back at each sample, down to HAKMEM_PROFILE_SAMPLE (and the samples then
 * take less than all of it). The burst lets a
 * short program, or a short phase of one, keep the configured interval:
 * the two-site program of test_profile, 35 ms, takes 540 samples of its
 * 300 KB blocks at 2M, at 350 ns each against 76 ns a block (the large
 * site's count within 8.8% in 20 runs of 20); with a credit of 0.2 ms it
 * kept 420 (13.9%, and its small site 29 samples instead of 44); with
 * none, 83, and runs lost the small site. A long run of
 * fast allocations pays one percent: without the budget, 1-64 KiB blocks
 * at 160 M a second on two threads met a sample every 64 or so and kept
 * 0.63 of their throughput (bench_threads mid at 2M).
 * A mean changes only where an interval ends, so that each allocation is
 * counted down at a mean known before it came, and the intervals are
 * memoryless: the chance of a sample, and its weight, are those of the
 * mean in force, and the estimates stay unbiased. */
static void budget_check(heap_t *heap)
{
    if (hak_config.profile_sample <= 1)
        return;
    bool raised = heap->sample_mean > hak_config.profile_sample;
    if (++heap->sample_window < BUDGET_WINDOW && !raised)
        return;
    uint64_t now = hak_ticks(); /* read at a look only: 12 ns a read on the development machine */
    double ns_per_tick = kpi_ns_per_tick(false), spent = (double)heap->sample_spent * ns_per_tick;
    double earned = (double)(now - heap->sample_looked) * ns_per_tick * (double)hak_config.profile_budget / 100;
    double credit = heap->sample_credit_ns - spent + earned;
    heap->sample_spent = 0;
    heap->sample_looked = now;
    if (credit < 0 && heap->sample_window >= BUDGET_WINDOW && heap->sample_mean < MEAN_MAX) {
        heap->sample_mean *= 2;
        heap->sample_window = 0;
        credit = 0; /* the debt is paid in fewer samples from here on */
        size_t peak = atomic_load_explicit(&mean_peak, memory_order_relaxed);
        while (heap->sample_mean > peak &&
               !atomic_compare_exchange_weak_explicit(&mean_peak, &peak, heap->sample_mean, memory_order_relaxed,
                                                      memory_order_relaxed)) {
        }
    } else if (raised && credit >= 0 && spent < earned / 2) {
        heap->sample_mean = heap->sample_mean / 2 > hak_config.profile_sample ? heap->sample_mean / 2
                                                                              : hak_config.profile_sample;
        heap->sample_window = 0;
    } else if (!raised) {
        heap->sample_window = 0;
    }
    heap->sample_credit_ns = credit < BUDGET_BURST_NS ? credit : BUDGET_BURST_NS;
}

/* The largest mean interval the budget gave any thread, 0 if none was
 * raised (the report says so beside the estimates). */
size_t sample_mean_peak(void)
{
    return atomic_load_explicit(&mean_peak, memory_order_relaxed);
}

/* A sample's work on the calling thread, begun at start (after the
 * allocation it stands for: the budget is the profile's own time), ends:
 * charged to the thread's budget. */
static void budget_charge(heap_t *heap, uint64_t start)
{
    if (heap != &hak_empty_heap)
        heap->sample_spent += hak_ticks() - start;
}

/* The countdown reached zero at an allocation of size bytes: its weight
 * is returned, and the next interval starts, at the mean the budget sets. */
float sample_interval_end(heap_t *heap, size_t size)
{
    float weight = sample_weight(size, heap->sample_mean);
    budget_check(heap);
    heap->sample_left = next_interval(&heap->sample_rng, heap->sample_mean);
    return weight;
}

/* ---- the arena ---------------------------------------------------------------- */

static char *slot_address(arena_chunk_t *a, uint32_t i) { return (char *)a + ((size_t)i << a->slot_shift); }

static uint32_t arena_slots(const arena_chunk_t *a) { return (uint32_t)(SS_SIZE >> a->slot_shift); }

static sample_record_t *slot_of(arena_chunk_t *a, uint32_t i) { return &a->slot[i - a->first_slot]; }

/* The smallest slot kind whose slots hold a block of class c (a power of
 * two at least as large: aligned as the block would be, which an aligned
 * request of fewer bytes relies on). */
static unsigned slot_kind_of(unsigned c)
{
    uint32_t block = hak_class_size[c];
    unsigned kind = 0;
    while ((uint32_t)1 << (ARENA_MIN_SLOT_SHIFT + 2 * kind) < block)
        kind++;
    return kind;
}

static arena_chunk_t *arena_chunk_new(unsigned kind)
{
    arena_chunk_t *a = os_map_aligned(SS_SIZE, SS_SIZE);
    if (!a)
        return NULL;
    if (!segmap_cover(a, SS_SIZE)) {
        os_unmap(a, SS_SIZE);
        return NULL;
    }
    os_advise_small_pages(a, SS_SIZE); /* a few samples: never a whole huge page (superslab.c) */
    a->magic = ARENA_MAGIC;
    a->slot_shift = ARENA_MIN_SLOT_SHIFT + 2 * kind;
    size_t header = sizeof(arena_chunk_t) + arena_slots(a) * sizeof(sample_record_t);
    a->first_slot = a->carved = (uint32_t)((header + ((size_t)1 << a->slot_shift) - 1) >> a->slot_shift);
    a->next = arena_chunks[kind];
    arena_chunks[kind] = a;
    segmap_set(a, SS_SIZE, SEG_SAMPLED);
    return a;
}

/* The hardened build fills the start of a sample's slot past the request
 * (block.h, slack_fill), checks it at the free, and gives the request as
 * its usable size: as a slab block's canary and slack, a write past the
 * request's end is caught. */
static size_t slot_slack(size_t size) { return hak_class_size[slab_class_for(size)] - size; }

static void *slot_alloc(unsigned c, size_t size, float weight, uint32_t stack, uint64_t born)
{
    unsigned kind = slot_kind_of(c);
    pthread_mutex_lock(&sample_lock);
    arena_chunk_t *a = arena_chunks[kind];
    while (a && !a->free_head && a->carved == arena_slots(a))
        a = a->next;
    if (!a && !(a = arena_chunk_new(kind))) {
        pthread_mutex_unlock(&sample_lock);
        return NULL;
    }
    uint32_t i = a->free_head;
    if (i)
        a->free_head = slot_of(a, i)->next;
    else
        i = a->carved++;
    *slot_of(a, i) = (sample_record_t){.born = born, .size = size, .weight = weight, .stack = stack};
    a->live++;
    pthread_mutex_unlock(&sample_lock);
    char *p = slot_address(a, i);
    if (HAK_SECURE)
        slack_fill(p + size, slot_slack(size));
    return p;
}

/* The slot p starts, or NULL with *fault saying why (under sample_lock).
 * The caller saw p's chunk in the segment map before taking the lock; a
 * collect on another thread may have unmapped it since (only a stale
 * pointer's chunk can have no live slot), and its header must not be
 * read then. */
static sample_record_t *slot_checked(const void *p, const char **fault)
{
    if (segmap_kind(p) != SEG_SAMPLED) {
        *fault = "pointer not allocated by hakmem (foreign, stack or global memory, or already freed)";
        return NULL;
    }
    arena_chunk_t *a = (arena_chunk_t *)superslab_of(p);
    uintptr_t off = (uintptr_t)p - (uintptr_t)a;
    uint32_t i = (uint32_t)(off >> a->slot_shift);
    if (a->magic != ARENA_MAGIC || i < a->first_slot || i >= a->carved) {
        *fault = "pointer into hakmem's sample arena that was never handed out";
        return NULL;
    }
    if (off & (((uintptr_t)1 << a->slot_shift) - 1)) {
        *fault = "interior pointer: not the start of a block";
        return NULL;
    }
    if (!slot_of(a, i)->weight) {
        *fault = "double free";
        return NULL;
    }
    return slot_of(a, i);
}

/* A sample's record, as it was when its block was freed. A large block's
 * (born 0) is the large tier's to record at the site. */
static void sample_died(const sample_record_t *was)
{
    uintptr_t site = stack_freed(was->stack, was->size, was->weight);
    if (site && was->born)
        site_record_lifetime(site_index_of(site), was->born);
}

void sample_free(void *p, const char *op)
{
    uint64_t start = hak_ticks();
    const char *fault = NULL;
    pthread_mutex_lock(&sample_lock);
    sample_record_t *s = slot_checked(p, &fault);
    /* in warn mode the block stays allocated */
    if (HAK_SECURE && s && !slack_intact((const char *)p + s->size, slot_slack(s->size))) {
        fault = "a write past the end of this block overwrote its slack";
        slack_fill((char *)p + s->size, slot_slack(s->size));
        s = NULL;
    }
    sample_record_t was;
    if (s) {
        arena_chunk_t *a = (arena_chunk_t *)superslab_of(p);
        was = *s;
        s->weight = 0;
        s->next = a->free_head;
        a->free_head = (uint32_t)(s - a->slot) + a->first_slot;
        a->live--;
    }
    pthread_mutex_unlock(&sample_lock);
    if (!s) {
        hak_report_bad_pointer(op, p, fault);
        return;
    }
    sample_died(&was);
    budget_charge(heap_get(), start);
}

/* The usable size a slab block of the same request would have. */
size_t sample_usable_size(const void *p, const char *op)
{
    const char *fault = NULL;
    pthread_mutex_lock(&sample_lock);
    sample_record_t *s = slot_checked(p, &fault);
    size_t size = s ? s->size : 0;
    pthread_mutex_unlock(&sample_lock);
    if (!s) {
        hak_report_bad_pointer(op, p, fault);
        return 0;
    }
    return HAK_SECURE ? size : hak_class_size[class_of(size)];
}

/* p inside a live slot's block (interior pointers included). */
bool sample_owns(const void *p)
{
    const char *fault;
    pthread_mutex_lock(&sample_lock);
    if (segmap_kind(p) != SEG_SAMPLED) { /* unmapped since the caller looked (slot_checked) */
        pthread_mutex_unlock(&sample_lock);
        return false;
    }
    const arena_chunk_t *a = (const arena_chunk_t *)superslab_of(p);
    uintptr_t start = (uintptr_t)p & ~(((uintptr_t)1 << a->slot_shift) - 1);
    sample_record_t *s = slot_checked((const void *)start, &fault);
    bool live = s && (uintptr_t)p - start < hak_class_size[class_of(s->size)];
    pthread_mutex_unlock(&sample_lock);
    return live;
}

/* ---- the records of samples in the page arenas -------------------------------- */

/* Indexed from 1 (0 in a head entry would be no record), handed out from
 * a free list, then from the end; the table doubles when full (a new
 * mapping: every reader holds the lock) and goes back to the OS when no
 * record is live (sample_collect). */
#define RECORDS_FIRST_CAPACITY 4096 /* 96 KiB */
#define RECORDS_MAX_CAPACITY ((uint32_t)1 << 24)
static sample_record_t *records;
static uint32_t records_capacity, records_carved = 1, records_free, records_live;

static bool records_grow(void)
{
    uint32_t capacity = records_capacity ? records_capacity * 2 : RECORDS_FIRST_CAPACITY;
    if (capacity > RECORDS_MAX_CAPACITY)
        return false;
    sample_record_t *table = os_map((size_t)capacity * sizeof *table);
    if (!table)
        return false;
    if (records) {
        memcpy(table, records, (size_t)records_carved * sizeof *table);
        os_unmap(records, (size_t)records_capacity * sizeof *table);
    }
    records = table;
    records_capacity = capacity;
    return true;
}

/* A new record's index, or 0 if the table cannot grow. */
static uint32_t record_new(uint32_t stack, size_t size, float weight, uint64_t born)
{
    pthread_mutex_lock(&sample_lock);
    uint32_t i = records_free;
    if (i)
        records_free = records[i].next;
    else if (records_carved < records_capacity || records_grow())
        i = records_carved++;
    if (i) {
        records[i] = (sample_record_t){.born = born, .size = size, .weight = weight, .stack = stack};
        records_live++;
    }
    pthread_mutex_unlock(&sample_lock);
    return i;
}

/* The sample whose record this is was freed (arena_free, large_free). */
void sample_freed(uint32_t record)
{
    uint64_t start = hak_ticks();
    pthread_mutex_lock(&sample_lock);
    sample_record_t was = records[record];
    records[record] = (sample_record_t){.next = records_free};
    records_free = record;
    records_live--;
    pthread_mutex_unlock(&sample_lock);
    sample_died(&was);
    budget_charge(heap_get(), start);
}

/* The sample whose record this is holds `size` bytes now (arena_realloc_in_place,
 * a large block's realloc in place). */
void sample_resized(uint32_t record, size_t size)
{
    pthread_mutex_lock(&sample_lock);
    sample_record_t was = records[record];
    records[record].size = size;
    pthread_mutex_unlock(&sample_lock);
    stack_resized(was.stack, was.size, size, was.weight);
}

/* p (NULL where the arenas had no block) becomes a sample, charged to
 * site's stack: its record is filled and its index put in the block's
 * head entry. False if it could not be (the record table full). */
static bool sample_in_arena(void *p, size_t size, uintptr_t site, float weight, uint64_t born)
{
    uint32_t stack = stack_sample(site, size, weight);
    uint32_t record = p ? record_new(stack, size, weight, born) : 0;
    if (!record)
        stack_untracked(stack, size, weight);
    if (record)
        arena_mark_sampled(p, record);
    return record != 0;
}

/* A large block of size bytes about to be handed out: counted down as
 * the slab sizes are; if it is a sample, its record's index, else 0. Its
 * lifetime is the large tier's to record (timed calls only). A thread
 * without a heap (it allocated nothing smaller yet) counts down on a
 * countdown of its own, with no lock: a program of large blocks only
 * would otherwise lock at every call (locked_instructions). */
uint32_t sample_large(size_t size, uintptr_t site)
{
    static HAK_TLS long heapless_left;
    static HAK_TLS uint64_t heapless_rng;
    if (!site) /* hakmem's own (site 0: never tracked) */
        return 0;
    heap_t *heap = heap_get();
    float weight = 0;
    if (heap != &hak_empty_heap) {
        if ((heap->sample_left -= (long)size) <= 0)
            weight = sample_interval_end(heap, size);
    } else {
        if (!heapless_rng) {
            heapless_rng = ((uint64_t)(uintptr_t)&heapless_rng * 0x9e3779b97f4a7c15ull ^ (uint64_t)hak_config.tune_seed) | 1;
            heapless_left = next_interval(&heapless_rng, hak_config.profile_sample);
        }
        if ((heapless_left -= (long)size) <= 0) {
            heapless_left = next_interval(&heapless_rng, hak_config.profile_sample);
            weight = sample_weight(size, hak_config.profile_sample);
        }
    }
    if (!weight)
        return 0;
    uint64_t start = hak_ticks();
    uint32_t stack = stack_sample(site, size, weight);
    uint32_t record = record_new(stack, size, weight, 0);
    if (!record)
        stack_untracked(stack, size, weight);
    budget_charge(heap, start);
    return record;
}

/* Chunks with no live slot go back to the OS, and the record table if no
 * record is live (hak_collect). */
void sample_collect(void)
{
    pthread_mutex_lock(&sample_lock);
    if (records && !records_live) {
        os_unmap(records, (size_t)records_capacity * sizeof *records);
        records = NULL;
        records_capacity = records_free = 0;
        records_carved = 1;
    }
    for (unsigned kind = 0; kind < ARENA_SLOT_KINDS; kind++)
        for (arena_chunk_t **link = &arena_chunks[kind]; *link;) {
            arena_chunk_t *a = *link;
            if (a->live) {
                link = &a->next;
                continue;
            }
            *link = a->next;
            segmap_clear(a, SS_SIZE);
            os_unmap(a, SS_SIZE);
        }
    pthread_mutex_unlock(&sample_lock);
}

void sample_fork_prepare(void)
{
    pthread_mutex_lock(&sample_lock);
    stack_fork_prepare();
}

void sample_fork_parent(void)
{
    stack_fork_parent();
    pthread_mutex_unlock(&sample_lock);
}

void sample_fork_child(void)
{
    stack_fork_child();
    pthread_mutex_unlock(&sample_lock);
}

/* ---- the sampled allocation ------------------------------------------------- */

/* The alignment a slab block of class c has by construction (blocks of a
 * size divisible by a power of two up to a page are aligned to it). */
static size_t class_alignment(unsigned c)
{
    size_t size = hak_class_size[c], align = size & -size;
    return align > SLAB_PAGE_SIZE ? SLAB_PAGE_SIZE : align;
}

/* The sample's own place, a slot of the sample arena or a page-arena
 * block, or b where it cannot have one. */
static void *sample_place(heap_t *heap, unsigned c, void *b, size_t size, uintptr_t site, float weight, uint64_t now)
{
    void *tracked;
    if (class_is_tiny(c)) {
        uint32_t stack = stack_sample(site, size, weight);
        tracked = slot_alloc(c, size, weight, stack, now);
        if (!tracked)
            stack_untracked(stack, size, weight);
    } else {
        tracked = arena_alloc(size, class_alignment(c), heap->arena_lane, false);
        if (!sample_in_arena(tracked, size, site, weight, now) && tracked) {
            arena_free(tracked, "sample");
            tracked = NULL;
        }
    }
    if (!tracked)
        return b;
    if (!class_is_tiny(c) && slab_of(b) != heap->cur[c]) { /* b goes back where it came from */
        heap_stash_push(heap, c, b);
    } else {
        block_link(b, heap->cache[c]);
        heap->cache[c] = b;
    }
    return tracked;
}

/* b: the block the allocation took from the cache (of cur[c]); weight:
 * what sample_interval_end returned when the countdown reached 0; start:
 * hak_ticks() when taking it began, 0 if it was not timed. Site 0 asks
 * for no tracking (aligned requests that will be offset inside the
 * block). */
void *sample_take(heap_t *heap, unsigned c, void *b, size_t size, uintptr_t site, float weight, uint64_t start)
{
    hak_assert(weight > 0); /* 0 marks a free record */
    if (!hak_config.profile)
        return b;
    uint64_t now = hak_ticks();
    kpi_record_latency(start ? now - start : 0, weight);
    learn_tick();
    if (site)
        b = sample_place(heap, c, b, size, site, weight, now);
    budget_charge(heap, now);
    return b;
}

/* A sample taken on the fast path: the pop is repeated under the clock.
 * In the hardened build, a corrupt link that the pop met stops the program
 * here, as the refill would: linking b again would mend it unreported
 * (test_secure's cached link, once in a hundred runs or so). */
void *sample_fast_hit(heap_t *heap, unsigned c, void *b, size_t size, uintptr_t site)
{
    if (HAK_SECURE && unlikely(heap->corrupt_link))
        hak_free_list_corrupt(heap->corrupt_link);
    float weight = sample_interval_end(heap, size);
    uint64_t start = hak_ticks();
    block_link(b, heap->cache[c]);
    heap->cache[c] = b;
    __asm__ volatile("" ::: "memory");
    b = heap->cache[c];
    heap->cache[c] = block_next(b);
    block_handed_out(b);
    heap_sampled(heap);
    return sample_take(heap, c, b, size, site, weight, start);
}

/* A sample among the page arenas' sizes: the arena allocation (from the
 * thread's front first, as any other) is timed, and its block is the
 * sample. */
void *sample_take_arena(heap_t *heap, size_t size, size_t align, uintptr_t site, bool zero)
{
    heap_sampled(heap);
    float weight = sample_interval_end(heap, size);
    uint64_t start = hak_ticks();
    void *p = align ? NULL : arena_front_take(heap, size);
    if (p && zero)
        memset(p, 0, size);
    else if (!p)
        p = arena_alloc(size, align, heap->arena_lane, zero);
    uint64_t now = hak_ticks();
    if (!hak_config.profile || !p)
        return p;
    kpi_record_latency(now - start, weight);
    learn_tick();
    if (site)
        sample_in_arena(p, size, site, weight, now);
    budget_charge(heap, now);
    return p;
}
