/* The large tier and BigCache: a freed large block is reused by
 * the next fitting allocation from the same call site and only from it,
 * the ring per site is bounded, cached pages are purged after the delay,
 * hak_collect(true) unmaps everything cached, and a buffer that realloc
 * grew is reused by the next one of its site, which grows in place. */
#define _GNU_SOURCE
#include "check.h"
#include "hakmem.h"
#include "rss.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <malloc.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

static const size_t MiB = 1024 * 1024;

/* Two distinct call sites: noipa keeps the compiler from folding the two
 * identical functions into one, and the barrier keeps the calls from
 * becoming tail calls (which would make the test's caller the site). */
static __attribute__((noipa)) void *alloc_site_a(size_t n)
{
    void *p = malloc(n);
    __asm__ volatile("" : : "g"(p) : "memory");
    return p;
}

static __attribute__((noipa)) void *alloc_site_b(size_t n)
{
    void *p = malloc(n);
    __asm__ volatile("" : : "g"(p) : "memory");
    return p;
}

static hak_stats_t stats(void)
{
    hak_stats_t s;
    hak_stats_get(&s);
    return s;
}

static void test_reuse_by_site(void)
{
    hak_collect(true);
    hak_stats_t s0 = stats();
    char *p = alloc_site_a(2 * MiB);
    CHECK(p && hak_owns(p));
    memset(p, 1, 2 * MiB);
    free(p);
    CHECK(!hak_owns(p)); /* cached, not handed out */
    CHECK(stats().bigcache_bytes >= 2 * MiB);
    char *other = alloc_site_b(2 * MiB); /* another site: not a's block */
    CHECK(other && other != p);
    char *q = alloc_site_a(2 * MiB);
    CHECK(q == p);
    CHECK(hak_owns(q));
    memset(q, 2, 2 * MiB);
    hak_stats_t s1 = stats();
    CHECK(s1.bigcache_hits == s0.bigcache_hits + 1);
    CHECK(s1.bigcache_misses == s0.bigcache_misses + 2);
    free(q);
    free(other);
}

static void test_fit(void)
{
    hak_collect(true);
    char *big = alloc_site_a(8 * MiB);
    CHECK(big != NULL);
    free(big);
    char *small = alloc_site_a(2 * MiB); /* would waste more than half */
    CHECK(small && small != big);
    char *fits = alloc_site_a(6 * MiB);
    CHECK(fits == big);
    free(small);
    free(fits);
}

/* Large blocks live together start on different cache lines of their
 * first page, none on the lines of a page-aligned block's start and last
 * byte (0 and 63, and their twins 2 KiB away): a program that touches them
 * page by page would otherwise send all their lines to the same cache
 * sets. Alignments are kept: a block aligned to 256 B starts on a
 * multiple of it. */
static void test_colours(void)
{
    hak_collect(true); /* every block below is a new mapping */
    enum { N = 16 };
    char *blocks[N];
    bool line_taken[32] = {false};
    int distinct = 0;
    for (int i = 0; i < N; i++) {
        blocks[i] = alloc_site_a(2 * MiB);
        CHECK(blocks[i] && hak_owns(blocks[i]));
        unsigned line = (unsigned)((uintptr_t)blocks[i] % 2048 / 64);
        CHECK(line >= 2 && line <= 30);
        distinct += !line_taken[line];
        line_taken[line] = true;
    }
    CHECK(distinct == N);
    for (int i = 0; i < N; i++) {
        void *aligned = aligned_alloc(256, 3 * MiB);
        CHECK(aligned && hak_owns(aligned));
        CHECK(((uintptr_t)aligned & 255) == 0 && ((uintptr_t)aligned & (2 * MiB - 1)) < hakmem_page());
        free(aligned);
        hak_collect(true);
    }
    for (int i = 0; i < N; i++)
        free(blocks[i]);
}

/* The pages of [p, p + len) that are resident. */
static size_t resident_pages(const char *p, size_t len)
{
    uintptr_t start = (uintptr_t)p & ~(uintptr_t)4095, end = ((uintptr_t)p + len + 4095) & ~(uintptr_t)4095;
    static unsigned char vec[(16 << 20) / 4096];
    size_t pages = (end - start) / 4096, resident = 0;
    CHECK(pages <= sizeof vec);
    if (pages > sizeof vec || mincore((void *)start, end - start, vec) != 0)
        return 0; /* not mapped */
    for (size_t i = 0; i < pages; i++)
        resident += vec[i] & 1;
    return resident;
}

/* A buffer taken at 1.5 MiB and grown by realloc to 4 and then 8 MiB,
 * freed, and taken again from the same site: BigCache hands back the
 * block the last one grew, and both growths are in place, into pages
 * still resident (each round mapped and faulted 8 MiB anew before, and
 * growing to 4 MiB within the block must not trim it). A block so handed
 * out and freed without growing is judged by its whole size again. */
static void test_grown_buffer_reused(void)
{
    hak_collect(true);
    const size_t start = 3 * MiB / 2, grown = 8 * MiB;
    char *first = NULL;
    for (int round = 0; round < 3; round++) {
        hak_stats_t s0 = stats();
        char *p = alloc_site_a(start);
        CHECK(p != NULL);
        memset(p, round + 1, start);
        char *q = realloc(p, 4 * MiB);
        CHECK(q != NULL);
        q = realloc(q, grown);
        CHECK(q && q[0] == round + 1 && q[start - 1] == round + 1);
        size_t tail_resident = resident_pages(q + start, grown - start);
        memset(q + start, 0, grown - start);
        if (!round) {
            first = q;
        } else {
            CHECK(p == first && q == p);
            CHECK(stats().bigcache_hits == s0.bigcache_hits + 1);
            CHECK(tail_resident >= (grown - start) / 4096); /* its colour spills into one more */
        }
        free(q);
    }
    char *p = alloc_site_a(start);
    CHECK(p == first);
    free(p); /* not grown this time */
    char *fresh = alloc_site_a(start);
    CHECK(fresh && fresh != first && malloc_usable_size(fresh) < 2 * MiB);
    free(fresh);
    hak_collect(true);
}

/* BigCache holds n blocks of `bytes` in all: each block's mapping adds a
 * header page, the page its colour (its start 2 to 30 lines into its
 * first page) pushes its end into, and in the hardened build a guard page
 * at each end. */
static bool cache_holds(size_t n, size_t bytes)
{
    size_t page = hakmem_page(), held = stats().bigcache_bytes, guard = stats().hardened ? 2 * page : 0;
    return held >= bytes && held <= bytes + n * (2 * page + guard);
}

/* n blocks of size from site a, all live at once, then all freed. */
static void alloc_free_batch(int n, size_t size)
{
    char *blocks[32];
    CHECK(n <= 32);
    for (int i = 0; i < n; i++) {
        blocks[i] = alloc_site_a(size);
        CHECK(blocks[i] != NULL);
    }
    for (int i = 0; i < n; i++)
        free(blocks[i]);
}

/* A ring of 4 slots that overflows with blocks freed within the purge
 * delay grows, up to 16: all 7 of a batch stay cached, and the next batch
 * reuses every one. The block freed last waits in the thread's front,
 * before the ring. */
static void test_ring_grows_while_warm(void)
{
    hak_collect(true);
    CHECK(stats().bigcache_bytes == 0);
    alloc_free_batch(7, 3 * MiB);
    CHECK(cache_holds(7, 7 * 3 * MiB));
    uint64_t misses = stats().bigcache_misses;
    alloc_free_batch(7, 3 * MiB);
    CHECK(stats().bigcache_misses == misses);
    alloc_free_batch(20, 3 * MiB); /* 7 hits, 13 new; 16 slots at most, and the front */
    CHECK(cache_holds(17, 17 * 3 * MiB));
    hak_collect(true);
    CHECK(stats().bigcache_bytes == 0);
}

/* Blocks older than the purge delay are evicted, the ring stays at 4 (the
 * front holds the block freed last, and first passes on the one it held). */
static void test_ring_evicts_cold(void)
{
    hak_collect(true);
    alloc_free_batch(4, 3 * MiB);
    usleep(250 * 1000); /* past the 100 ms delay */
    alloc_free_batch(3, 8 * MiB); /* no 3 MiB block fits 8 MiB: 3 new ones */
    CHECK(cache_holds(5, 3 * 8 * MiB + 2 * 3 * MiB)); /* two 3 MiB blocks evicted */
    hak_collect(true);
    CHECK(stats().bigcache_bytes == 0);
}

/* Sizes whose blocks do not fit each other's: 1.1, 2.4, 5.3, 11.7 and
 * 25.8 MiB (each more than twice the one before). */
static size_t unfit_size(int i)
{
    double mib = 1.1;
    while (i-- > 0)
        mib *= 2.2;
    return (size_t)(mib * (double)MiB);
}

/* A ring keeps every block it has room for. It was a circular buffer
 * that put each block at its next position and evicted what was there,
 * while the slots that takes had emptied stayed empty: a site of varied
 * sizes kept 4 to 9 of its 16 slots filled and mapped a new block at one
 * allocation in nine (measured at cbf8d7a). Here 4 cold blocks
 * fill the ring, two are taken and one comes back: the oldest must stay. */
static void test_ring_keeps_blocks(void)
{
    hak_collect(true);
    char *block[4];
    for (int i = 0; i < 4; i++)
        block[i] = alloc_site_a(unfit_size(i));
    for (int i = 0; i < 4; i++)
        free(block[i]); /* the ring holds 0..2, the front 3 */
    usleep(250 * 1000); /* past the 100 ms delay: the ring cannot grow */
    hak_collect(false); /* the front's block, due, joins the ring */
    hak_stats_t s0 = stats();
    CHECK(alloc_site_a(unfit_size(3)) == block[3]);
    CHECK(alloc_site_a(unfit_size(1)) == block[1]);
    free(block[1]);
    free(block[3]); /* 1 goes back to the ring, which holds 0 and 2 */
    CHECK(alloc_site_a(unfit_size(0)) == block[0]);
    CHECK(alloc_site_a(unfit_size(1)) == block[1]);
    CHECK(alloc_site_a(unfit_size(2)) == block[2]);
    CHECK(alloc_site_a(unfit_size(3)) == block[3]);
    hak_stats_t s1 = stats();
    CHECK(s1.large_allocs == s0.large_allocs);
    CHECK(s1.bigcache_hits == s0.bigcache_hits + 6);
    for (int i = 0; i < 4; i++)
        free(block[i]);
    hak_collect(true);
}

/* Where no cached block fits and the site's ring is full and cannot grow,
 * the block closest to the request is resized for the allocation: the
 * smallest of those larger, its tail unmapped down to just under twice the
 * request (what a fit may hold), else the largest, grown by mremap with
 * its pages (resident ones stay so); no new mapping either way. The
 * oldest block, resized before, is the wrong one in both cases below. */
static void test_reshape_when_full(void)
{
    hak_collect(true);
    alloc_free_batch(5, 3 * MiB); /* the ring holds 4, the front 1 */
    usleep(250 * 1000);
    hak_collect(false); /* the front's block joins the ring, its oldest goes */
    hak_stats_t s0 = stats();
    char *grown = alloc_site_a(8 * MiB); /* none larger: a 3 MiB block grows */
    CHECK(grown != NULL && malloc_usable_size(grown) >= 8 * MiB);
    memset(grown, 7, 8 * MiB);
    hak_stats_t s1 = stats();
    CHECK(s1.large_allocs == s0.large_allocs);
    CHECK(s1.bigcache_reshaped == s0.bigcache_reshaped + 1);
    CHECK(s1.bigcache_misses == s0.bigcache_misses + 1);
    CHECK(s1.mapped_bytes >= s0.mapped_bytes + 5 * MiB);
    free(grown);
    usleep(250 * 1000);
    hak_collect(false); /* and fills the ring again: 3, 3, 3 and 8 MiB, oldest first */
    size_t small = MiB + hakmem_page();
    char *cut = alloc_site_a(small); /* a 3 MiB block is cut, not the 8 MiB one */
    if (stats().hardened) /* whose usable size is the request: the mapped bytes below tell */
        CHECK(cut != NULL && malloc_usable_size(cut) == small);
    else
        CHECK(cut != NULL && malloc_usable_size(cut) >= 2 * MiB && malloc_usable_size(cut) < 2 * small);
    memset(cut, 8, small);
    hak_stats_t s2 = stats();
    CHECK(s2.large_allocs == s0.large_allocs);
    CHECK(s2.bigcache_reshaped == s0.bigcache_reshaped + 2);
    CHECK(s2.mapped_bytes + MiB - hakmem_page() == s1.mapped_bytes); /* its top MiB but a page went */
    free(cut);
    usleep(250 * 1000);
    hak_collect(false); /* 3, 3, 8 and the cut block */
    char *larger = alloc_site_a(12 * MiB); /* the 8 MiB block grows by 4, not a 3 MiB one by 9 */
    CHECK(larger != NULL && malloc_usable_size(larger) >= 12 * MiB);
    hak_stats_t s3 = stats();
    CHECK(s3.large_allocs == s0.large_allocs);
    CHECK(s3.bigcache_reshaped == s0.bigcache_reshaped + 3);
    CHECK(s3.mapped_bytes >= s2.mapped_bytes + 4 * MiB && s3.mapped_bytes < s2.mapped_bytes + 5 * MiB);
    free(larger);
    hak_collect(true);
    CHECK(stats().bigcache_bytes == 0);
}

/* The rings grow only while they hold no more than the program's recent
 * peak of live large blocks (or 32 MiB): one live buffer at a time, of
 * sizes from 1 to 64 MiB, used to fill a ring of 16 with up to 1 GiB of
 * blocks (401 MiB of RSS on battle varied's loop with one live buffer). */
static void test_ring_budget(void)
{
    hak_collect(true);
    uint64_t rng = 1;
    size_t most = 0;
    for (int i = 0; i < 200; i++) {
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        size_t size = MiB + (size_t)(rng >> 33) % (63 * MiB);
        char *p = alloc_site_a(size);
        CHECK(p != NULL);
        p[0] = 1;
        free(p);
        size_t held = stats().bigcache_bytes;
        most = held > most ? held : most;
    }
    printf("ring budget: at most %.1f MiB cached\n", most / (double)MiB);
    /* the budget (64 MiB), one block past it, the front's block */
    CHECK(most <= 64 * MiB + 64 * MiB + 64 * MiB + 16 * 3 * hakmem_page());
    hak_collect(true);
}

/* Four threads replace buffers of 1 to 16 MiB from one site in a shared
 * set of 24, and free, or shrink by realloc, what another thread took:
 * reshaped blocks keep their contents' bounds and their usable size. */
static _Atomic(unsigned char *) shared_buffers[24];
static atomic_long buffers_bad;

static void *replace_buffers(void *arg)
{
    uint64_t rng = (uintptr_t)arg * 0x9e3779b97f4a7c15ull + 1;
    for (int i = 0; i < 1000; i++) {
        rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
        size_t size = MiB + (size_t)(rng >> 8) % (15 * MiB);
        unsigned char *p = alloc_site_a(size);
        if (!p || malloc_usable_size(p) < size) {
            atomic_fetch_add(&buffers_bad, 1);
            continue;
        }
        memcpy(p, &size, sizeof size);
        memcpy(p + size - sizeof size, &size, sizeof size);
        unsigned char *old = atomic_exchange(&shared_buffers[(rng >> 4) % 24], p);
        if (!old)
            continue;
        size_t head, tail;
        memcpy(&head, old, sizeof head);
        memcpy(&tail, old + head - sizeof tail, sizeof tail);
        if (head != tail)
            atomic_fetch_add(&buffers_bad, 1);
        if (!(rng & 7)) {
            old = realloc(old, head / 2 + 1);
            if (!old || memcmp(old, &head, sizeof head))
                atomic_fetch_add(&buffers_bad, 1);
        }
        free(old);
    }
    return NULL;
}

static void test_reshape_under_threads(void)
{
    hak_collect(true);
    uint64_t reshaped = stats().bigcache_reshaped;
    pthread_t t[4];
    for (uintptr_t i = 0; i < 4; i++)
        CHECK(pthread_create(&t[i], NULL, replace_buffers, (void *)(i + 1)) == 0);
    for (int i = 0; i < 4; i++)
        pthread_join(t[i], NULL);
    for (int i = 0; i < 24; i++)
        free(atomic_exchange(&shared_buffers[i], NULL));
    CHECK(atomic_load(&buffers_bad) == 0);
    CHECK(stats().bigcache_reshaped > reshaped);
    hak_collect(true);
    CHECK(stats().bigcache_bytes == 0);
}

/* Pages of a cached block go back to the OS once the purge delay (100 ms
 * by default) has passed, by the purger, with no call; the mapping stays. */
static void test_purge_after_delay(void)
{
    if (skipped_without_purge_thread("purge after delay"))
        return;
    hak_collect(true);
    char *p = alloc_site_a(32 * MiB);
    CHECK(p != NULL);
    memset(p, 3, 32 * MiB);
    size_t touched = rss_bytes();
    free(p);
    CHECK(rss_bytes() + 16 * MiB > touched); /* still resident: reuse is cheap */
    usleep(600 * 1000);
    size_t after = rss_bytes();
    printf("rss: touched %.1f MiB, after the delay %.1f MiB\n", touched / (double)MiB, after / (double)MiB);
    CHECK(after + 24 * MiB < touched);
    CHECK(stats().bigcache_bytes >= 32 * MiB);
    char *again = alloc_site_a(32 * MiB); /* a purged block is still reused, zero-filled */
    CHECK(again == p);
    CHECK(again && again[12345] == 0);
    free(again);
    hak_collect(true);
}

/* calloc from the same call site as a freed, dirty block: BigCache hands
 * the block back, and calloc must clear it; in the last round the block
 * was purged first, which spares the header's page, where the block starts. */
static __attribute__((noipa)) void *zeroed_site(size_t n)
{
    void *p = calloc(1, n);
    __asm__ volatile("" : : "g"(p) : "memory");
    return p;
}

static void test_calloc_reuses_cleared(void)
{
    hak_collect(true);
    for (int round = 0; round < 3; round++) {
        if (round == 2)
            usleep(600 * 1000); /* past the purge delay: the cached block is purged */
        hak_stats_t before = stats();
        unsigned char *p = zeroed_site(3 * MiB);
        CHECK(p && hak_owns(p));
        CHECK(stats().bigcache_hits == before.bigcache_hits + (round > 0));
        size_t nonzero = 0;
        volatile unsigned char *v = p; /* GCC knows calloc's memory is zero */
        for (size_t i = 0; i < 3 * MiB; i += 512)
            nonzero += v[i] != 0;
        CHECK(nonzero == 0);
        memset(p, 0xff, 3 * MiB);
        __asm__ volatile("" : : "g"(p) : "memory"); /* not a dead store before free */
        free(p);
    }
}

/* Shrinking a large block keeps it in place, below the threshold too,
 * down to 64 KiB; smaller, it moves to a slab block. */
static void test_realloc_shrink_in_place(void)
{
    unsigned char *p = malloc(8 * MiB);
    CHECK(p != NULL);
    for (size_t i = 0; i < 8 * MiB; i += 4096)
        p[i] = (unsigned char)(i >> 12);
    hak_stats_t before = stats();
    unsigned char *q = realloc(p, 200 << 10);
    CHECK(q == p && malloc_usable_size(q) >= (200 << 10));
    CHECK(stats().mapped_bytes + 7 * MiB <= before.mapped_bytes); /* the tail went back */
    size_t wrong = 0;
    for (size_t i = 0; i < (200 << 10); i += 4096)
        wrong += q[i] != (unsigned char)(i >> 12);
    CHECK(wrong == 0);
    unsigned char *r = realloc(q, 1000);
    CHECK(r && r != q && hak_owns(r) && r[0] == 0 && malloc_usable_size(r) < 4096);
    free(r);
}

/* realloc growing a block, in place or moved by mremap (other blocks
 * mapped between the steps take the pages after it): the block keeps its
 * bytes and starts in the first page of a 2 MiB chunk, so that huge pages
 * can back its chunks. */
static void test_realloc_grow_keeps_chunk_start(void)
{
    char *p = malloc(3 * MiB), *held[8];
    CHECK(p && ((uintptr_t)p & (2 * MiB - 1)) < 4096);
    memset(p, 0x5a, 3 * MiB);
    size_t filled = 3 * MiB;
    for (int step = 0; step < 8; step++) {
        held[step] = malloc(2 * MiB);
        size_t size = (size_t)(4 + 4 * step) * MiB;
        char *q = realloc(p, size);
        CHECK(q && hak_owns(q) && ((uintptr_t)q & (2 * MiB - 1)) < 4096 && malloc_usable_size(q) >= size);
        if (!q)
            break;
        CHECK(q[0] == 0x5a && q[filled - 1] == 0x5a && q[filled / 2] == 0x5a);
        memset(q, 0x5a, size);
        filled = size;
        p = q;
    }
    free(p);
    for (int step = 0; step < 8; step++)
        free(held[step]);
}

/* realloc that moves a block (mremap) while other threads map and free
 * large blocks: the old range, given back by the move, may be mapped by
 * another thread at once, and the mover must not clear that thread's
 * segment-map entries (it did: the other block's free was then reported as
 * a foreign pointer; found by a 12-minute soak). */
static atomic_int movers_stop;
static atomic_long blocks_lost;

static void *mover(void *arg)
{
    (void)arg;
    while (!movers_stop) {
        char *p = malloc(3 * MiB);
        for (size_t grow = 4; grow < 12 && p; grow++)
            p = realloc(p, grow * MiB);
        free(p);
    }
    return NULL;
}

static void *mapper(void *arg)
{
    unsigned r = (unsigned)(uintptr_t)arg;
    void *held[8] = {0};
    while (!movers_stop) {
        r = r * 1103515245u + 12345u;
        unsigned slot = (r >> 8) % 8;
        if (held[slot] && !hak_owns(held[slot])) {
            blocks_lost++;
            held[slot] = NULL; /* not freed: hakmem would call it foreign */
        }
        free(held[slot]);
        held[slot] = malloc((2 + (r >> 12) % 3) * MiB);
    }
    for (unsigned i = 0; i < 8; i++)
        if (held[i] && hak_owns(held[i]))
            free(held[i]);
    return NULL;
}

static void test_realloc_moves_under_threads(void)
{
    pthread_t threads[4];
    for (uintptr_t i = 0; i < 4; i++)
        pthread_create(&threads[i], NULL, i < 2 ? mover : mapper, (void *)(i + 1));
    usleep(1500 * 1000);
    movers_stop = 1;
    for (int i = 0; i < 4; i++)
        pthread_join(threads[i], NULL);
    CHECK(blocks_lost == 0);
}

/* A thread's last freed block waits in its front, which the purger and
 * hak_collect reach while the thread is alive but asleep. */
static atomic_int worker_step;

static void wait_step(int step)
{
    while (atomic_load(&worker_step) < step)
        usleep(1000);
}

/* A small block gives the thread its heap, where the front lives. */
static void take_heap(void)
{
    void *p = malloc(16);
    __asm__ volatile("" : : "g"(p) : "memory"); /* kept: not folded away with the free */
    free(p);
}

static void *free_then_sleep(void *arg)
{
    take_heap();
    char *p = alloc_site_a(16 * MiB); /* main checks it: CHECK counts in main's thread only */
    if (p) {
        memset(p, 5, 16 * MiB);
        __asm__ volatile("" : : "g"(p) : "memory"); /* not a dead store before free */
        free(p);
    }
    *(char **)arg = p;
    atomic_store(&worker_step, 1);
    wait_step(2); /* asleep, not exited, until main is done */
    return NULL;
}

static void test_front_of_sleeping_thread(void)
{
    if (skipped_without_purge_thread("front of a sleeping thread"))
        return;
    hak_collect(true);
    atomic_store(&worker_step, 0);
    size_t start = rss_bytes();
    char *block = NULL;
    pthread_t t;
    CHECK(pthread_create(&t, NULL, free_then_sleep, &block) == 0);
    wait_step(1);
    CHECK(block != NULL);
    size_t freed = rss_bytes();
    CHECK(freed > start + 12 * MiB); /* cached, still resident */
    CHECK(stats().bigcache_bytes >= 16 * MiB);
    usleep(600 * 1000); /* past the purge delay */
    size_t purged = rss_bytes();
    printf("rss: front of a sleeping thread %.1f MiB, after the delay %.1f MiB\n", freed / (double)MiB,
           purged / (double)MiB);
    CHECK(purged + 12 * MiB < freed);
    CHECK(stats().bigcache_bytes >= 16 * MiB); /* purged, still cached */
    char *again = alloc_site_a(16 * MiB); /* from the ring now: same site, another thread */
    CHECK(again == block);
    free(again);
    hak_collect(true);
    CHECK(stats().bigcache_bytes == 0);
    atomic_store(&worker_step, 2);
    pthread_join(t, NULL);
}

/* A thread that exits passes its front to the ring: the next allocation
 * from the same site, in any thread, gets the block back. */
static void *free_then_exit(void *arg)
{
    take_heap();
    char *p = alloc_site_a(4 * MiB); /* main checks it */
    if (p) {
        memset(p, 6, 4 * MiB);
        __asm__ volatile("" : : "g"(p) : "memory"); /* not a dead store before free */
        free(p);
    }
    *(char **)arg = p;
    return NULL;
}

static void test_front_passed_on_at_exit(void)
{
    hak_collect(true);
    char *block = NULL;
    pthread_t t;
    CHECK(pthread_create(&t, NULL, free_then_exit, &block) == 0);
    pthread_join(t, NULL);
    CHECK(block != NULL);
    uint64_t hits = stats().bigcache_hits;
    char *again = alloc_site_a(4 * MiB);
    CHECK(again == block);
    CHECK(stats().bigcache_hits == hits + 1);
    free(again);
    hak_collect(true);
    CHECK(stats().bigcache_bytes == 0);
}

int main(void)
{
    check_expected_build();
    test_realloc_grow_keeps_chunk_start();
    test_realloc_moves_under_threads();
    test_realloc_shrink_in_place();
    test_calloc_reuses_cleared();
    test_reuse_by_site();
    test_fit();
    test_colours();
    test_grown_buffer_reused();
    test_ring_grows_while_warm();
    test_ring_evicts_cold();
    test_ring_keeps_blocks();
    test_reshape_when_full();
    test_ring_budget();
    test_reshape_under_threads();
    test_purge_after_delay();
    test_front_of_sleeping_thread();
    test_front_passed_on_at_exit();
    return check_summary("test_large");
}
