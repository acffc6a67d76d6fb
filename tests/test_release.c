/* Memory back to the OS, run once per mode (CMake sets the environment):
 *   trim     1 GiB in blocks of 1 KiB..4 MiB, freed, then malloc_trim(0):
 *            RSS back within 0.5 MiB of the start; aligned blocks up to
 *            64 MiB cost no more address space than their alignment and
 *            commit nothing;
 *   sleep    (HAKMEM_PURGE_DELAY_MS=200) the same, freed, and no call at
 *            all: RSS stays up until the delay, then the purger thread
 *            brings it back within 2.5 MiB while the program sleeps;
 *   inline   (and HAKMEM_PURGE_THREAD=0) no thread: RSS stays up while the
 *            program sleeps, and comes back once it allocates again;
 *   lazyfree (and HAKMEM_PURGE_ADVICE=free) purged pages are MADV_FREE'd:
 *            they show as LazyFree, and RSS less LazyFree is back;
 *   prewarm  (HAKMEM_PREWARM=1) a large block, new or reused after a
 *            purge, is touched without page faults, and its whole 2 MiB
 *            chunks are huge pages (HAKMEM_HUGEPAGES=prewarmed, the
 *            default) or not (prewarm_small: HAKMEM_HUGEPAGES=never);
 *   hugepages (HAKMEM_HUGEPAGES=always) a large block, new or reused
 *            after a purge, takes a fault per 2 MiB, not per page: the
 *            purge does not split its huge pages;
 *   mlockall a program pays for the pages hakmem uses, not for its
 *            address space: its writable anonymous mappings (what the
 *            kernel charges to the system's commit) stay small, and once
 *            it locks its memory (mlockall(MCL_CURRENT | MCL_FUTURE)) so
 *            does its RSS (the writable segment map was 128 MiB of both),
 *            and malloc_trim(0) still gives back what it freed (checked
 *            where the kernel lets the test lock its memory);
 *   nproc    (HAKMEM_PURGE_DELAY_MS=200) in a child that may start no
 *            thread (another user's, RLIMIT_NPROC 0): the purges run
 *            inline, as in inline mode, and hakmem says nothing on its
 *            stderr (checked where the test runs as root);
 *   clone    (HAKMEM_PURGE_DELAY_MS=1: the purger busy) 100 times,
 *            blocks freed and a child cloned without CLONE_VM, which
 *            allocates: none hangs on a lock the purger held when its
 *            memory was copied (one in four did), and the purger is gone
 *            when clone returns;
 *   seccomp  (HAKMEM_PURGE_DELAY_MS=200) in a child under a seccomp
 *            filter that kills for any call outside a list of the usual
 *            ones (as OpenSSH's sandbox does; clone and membarrier are not
 *            on it), once with open refused (EACCES, as OpenSSH) and once
 *            let through: frees that leave pages to purge do not kill it,
 *            and its memory comes back inline once it allocates again;
 *   unshare  (HAKMEM_PURGE_DELAY_MS=200) in a child, with the purger
 *            thread started by its frees, setns and unshare(CLONE_NEWUSER)
 *            succeed, which the kernel refuses in a process of two threads
 *            (checked where the system lets a program of one do them);
 *   cancel   (HAKMEM_PURGE_DELAY_MS=200) in a child, threads with a
 *            pthread_cancel pending free blocks (which starts the purger)
 *            and take their first blocks: neither malloc, free nor the
 *            hand-back at their exit is a cancellation point, as under
 *            glibc (a thread cancelled inside free left the purger marked
 *            running with no thread, and unshare then waited for ever);
 *            nor is unshare, which waits for the purger to stop;
 *   young    (HAKMEM_PURGE_DELAY_MS=1000) blocks freed in the program's
 *            first purge delay, into a thread's caches or leaving at most
 *            2.25 MiB of pages to purge (a 2 MiB buffer freed again and
 *            again counts once), start no purger thread, and a program
 *            that then sleeps keeps at most 2.5 MiB; an allocation after
 *            the delay starts it;
 *   young_bound (the same) frees that leave more than 2.25 MiB in all
 *            start it at once;
 *   young_mid (HAKMEM_PURGE_DELAY_MS=100) the first mid-size malloc
 *            after the delay starts the thread the young frees left
 *            waiting, once its mid section is over (the debug build
 *            asserts that no start runs inside one);
 *   smallpages (and smallpages_sampled, HAKMEM_PROFILE_SAMPLE=2) a
 *            program's first blocks, sampled ones and a page arena's
 *            too, lie in mappings
 *            advised to take 4 KiB pages (where the system gives huge
 *            pages to every mapping, their SuperSlab was all resident);
 *            a heap of 24 MiB of small blocks gets huge pages again;
 *   maplimit in a child that has used all but a few of the mappings the
 *            kernel allows a process (vm.max_map_count), rounds of blocks
 *            of every tier taken, touched and freed: the kernel refuses
 *            the munmaps that split a mapping, and hakmem goes on (it
 *            aborted) with its memory purged instead; an allocation may
 *            fail, with ENOMEM, and malloc_trim(0) brings RSS back.
 * In the last three, a block grown by realloc gets the same for its new
 * pages; in the prewarm modes a block of the page arenas, new, purged or
 * grown by realloc, is touched without page faults too (in hugepages
 * mode, where pre-warming is off, with one a page).
 * Huge pages are checked where the system lets a program ask for them. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <malloc.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "hakmem.h"
#include "rss.h"
#include "seccomp_filter.h"

#define MiB ((size_t)1 << 20)

static uint64_t rng(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static void **blocks;
static size_t block_count;

/* total bytes in blocks of 1 KiB..4 MiB, log-uniform (every tier and
 * most classes), each touched; hakmem must own them all. */
static void allocate_mix(size_t total, uint64_t seed)
{
    size_t done = 0;
    block_count = 0;
    while (done < total) {
        size_t size = (size_t)1024 << (rng(&seed) % 12); /* 1 KiB .. 2 MiB */
        size += rng(&seed) % size;                        /* .. 4 MiB */
        void *p = malloc(size);
        CHECK(p && hak_owns(p));
        if (!p)
            break;
        memset(p, 0xa5, size);
        blocks[block_count++] = p;
        done += size;
    }
}

static void free_mix_shuffled(uint64_t seed)
{
    for (size_t i = block_count - 1; i > 0; i--) {
        size_t j = rng(&seed) % (i + 1);
        void *t = blocks[i];
        blocks[i] = blocks[j];
        blocks[j] = t;
    }
    for (size_t i = 0; i < block_count; i++)
        free(blocks[i]);
}

/* RSS after waiting up to ms for it to fall to goal. */
static size_t rss_after_wait(size_t goal, int ms)
{
    size_t rss = rss_bytes();
    for (int waited = 0; rss > goal && waited < ms; waited += 50) {
        usleep(50 * 1000);
        rss = rss_bytes();
    }
    return rss;
}

static void test_aligned_cost(void)
{
    for (size_t align = MiB; align <= 64 * MiB; align *= 2) {
        hak_stats_t before, after;
        hak_stats_get(&before);
        size_t rss = rss_bytes();
        void *p = aligned_alloc(align, align);
        hak_stats_get(&after);
        CHECK(p && ((uintptr_t)p & (align - 1)) == 0 && hak_owns(p));
        CHECK(after.mapped_bytes - before.mapped_bytes <= align + align); /* size + at most align */
        CHECK(rss_bytes() <= rss + 256 * 1024);                          /* nothing committed */
        free(p);
    }
}

static void mode_trim(size_t start)
{
    allocate_mix(1024 * MiB, 1);
    size_t peak = rss_bytes();
    CHECK(peak > start + 900 * MiB);
    free_mix_shuffled(2);
    malloc_trim(0);
    size_t end = rss_bytes();
    printf("trim: start %.2f MiB, peak %.1f MiB, after free and malloc_trim %.2f MiB\n",
           start / 1048576.0, peak / 1048576.0, end / 1048576.0);
    CHECK(end <= start + MiB / 2);
    test_aligned_cost();
}

/* Allocating again runs the purges that fell due, where no thread does. */
static void allocate_again(void)
{
    for (int i = 0; i < 20; i++) {
        /* Through a volatile pointer: the compiler drops free(malloc(n)) */
        void *volatile block = malloc(3 * MiB);
        free(block);
        usleep(20 * 1000);
    }
}

/* total bytes allocated and freed, a sleep past the delay (200 ms), and
 * allocations again. */
static void free_sleep_allocate(size_t total, uint64_t seed)
{
    allocate_mix(total, seed);
    free_mix_shuffled(seed + 1);
    usleep(400 * 1000);
    allocate_again();
}

static void mode_sleep(size_t start, bool thread)
{
    allocate_mix(512 * MiB, 3);
    free_mix_shuffled(4);
    double freed = now_ms();
    size_t right_after = rss_bytes();
    if (!thread || now_ms() - freed < 100) /* the delay is 200 ms: not so on a loaded machine */
        CHECK(right_after > start + 8 * MiB); /* the delay holds pages a while */
    else
        fprintf(stderr, "sleep: RSS read %.0f ms after the frees, not checked\n", now_ms() - freed);
    CHECK(thread_count() == (thread ? 2 : 1));
    size_t slept = rss_after_wait(start + 5 * MiB / 2, thread ? 3000 : 600);
    printf("sleep: start %.2f MiB, right after free %.1f MiB, after sleeping %.2f MiB\n",
           start / 1048576.0, right_after / 1048576.0, slept / 1048576.0);
    if (thread) {
        CHECK(slept <= start + 5 * MiB / 2);
        /* With nothing left to purge, the thread is gone. */
        for (int waited = 0; thread_count() > 1 && waited < 3000; waited += 50)
            usleep(50 * 1000);
        CHECK(thread_count() == 1);
        return;
    }
    CHECK(slept > start + 8 * MiB); /* nothing purges a sleeping program without the thread */
    allocate_again();
    size_t again = rss_bytes();
    printf("inline: after allocating again %.2f MiB\n", again / 1048576.0);
    CHECK(again <= start + 5 * MiB / 2);
}

static void mode_lazyfree(size_t start)
{
    allocate_mix(256 * MiB, 5);
    free_mix_shuffled(6);
    size_t goal = start + 5 * MiB / 2, rss = 0, lazy = 0;
    for (int waited = 0; waited < 3000; waited += 50) {
        usleep(50 * 1000);
        rss = rss_bytes();
        lazy = proc_kib_field_bytes("/proc/self/smaps_rollup", "LazyFree: %zu kB");
        if (rss - lazy <= goal)
            break;
    }
    printf("lazyfree: RSS %.1f MiB of which LazyFree %.1f MiB\n", rss / 1048576.0, lazy / 1048576.0);
    CHECK(lazy > 16 * MiB);
    CHECK(rss - lazy <= goal);
}

static long faults_touching(char *p, size_t size)
{
    struct rusage a, b;
    getrusage(RUSAGE_SELF, &a);
    for (size_t i = 0; i < size; i += 4096)
        p[i] = 1;
    getrusage(RUSAGE_SELF, &b);
    return b.ru_minflt - a.ru_minflt;
}

/* Whether madvise(MADV_HUGEPAGE) can get transparent huge pages here. */
/* Whether the system's transparent huge pages are set to setting. */
static bool huge_pages_set(const char *setting)
{
    FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
    char line[128] = "", chosen[32];
    if (f) {
        if (!fgets(line, sizeof line, f))
            line[0] = 0;
        fclose(f);
    }
    snprintf(chosen, sizeof chosen, "[%s]", setting);
    return strstr(line, chosen) != NULL;
}

static bool huge_pages_available(void) { return huge_pages_set("always") || huge_pages_set("madvise"); }

/* The line that starts with field ("Rss:", "VmFlags:") in the smaps entry
 * of the mapping that holds p, into line; false where there is none. */
static bool smaps_line_at(const void *p, const char *field, char *line, int size)
{
    FILE *f = fopen("/proc/self/smaps", "r");
    bool inside = false, found = false;
    while (!found && f && fgets(line, size, f)) {
        uintptr_t lo, hi;
        if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2)
            inside = lo <= (uintptr_t)p && (uintptr_t)p < hi;
        else
            found = inside && !strncmp(line, field, strlen(field));
    }
    if (f)
        fclose(f);
    return found;
}

/* A field of the mapping that holds p, in bytes. */
static size_t smaps_bytes_at(const void *p, const char *field)
{
    char line[512];
    size_t kib = 0;
    if (smaps_line_at(p, field, line, sizeof line))
        sscanf(line + strlen(field), " %zu kB", &kib);
    return kib * 1024;
}

static size_t huge_bytes_at(const void *p) { return smaps_bytes_at(p, "AnonHugePages:"); }

/* Whether the mapping that holds p was advised MADV_NOHUGEPAGE. */
static bool small_pages_at(const void *p)
{
    char line[512];
    return smaps_line_at(p, "VmFlags:", line, sizeof line) && strstr(line, " nh");
}

/* A program's first blocks, sampled ones too (sampled, run with
 * HAKMEM_PROFILE_SAMPLE=2), lie in mappings advised to take 4 KiB pages:
 * where the system gives every mapping huge pages, their SuperSlab is not
 * all resident (checked there); a heap of 24 MiB of small blocks, beyond
 * the first SuperSlabs, gets huge pages again. */
static void mode_smallpages(bool sampled)
{
    enum { FIRST = 64 };
    char *first[FIRST];
    for (int i = 0; i < FIRST; i++) {
        first[i] = malloc(64);
        memset(first[i], i, 64);
        CHECK(hak_owns(first[i]) && small_pages_at(first[i]));
    }
    char *mid = malloc(32 << 10); /* a page arena's block: its bottom too */
    CHECK(mid && hak_owns(mid) && small_pages_at(mid));
    free(mid);
    size_t rss = smaps_bytes_at(first[0], "Rss:");
    printf("smallpages: the first blocks' mapping holds %zu KiB%s\n", rss >> 10,
           huge_pages_set("always") ? " (transparent huge pages: always)" : "");
    if (huge_pages_set("always"))
        CHECK(rss < MiB);
    if (sampled)
        CHECK(samples_taken() > 0);
    else {
        size_t count = (24 * MiB) / 256;
        char **heap = malloc(count * sizeof *heap);
        for (size_t i = 0; i < count; i++)
            memset(heap[i] = malloc(256), 1, 256);
        CHECK(!small_pages_at(heap[count - 1]));
        for (size_t i = 0; i < count; i++)
            free(heap[i]);
        free(heap);
    }
    for (int i = 0; i < FIRST; i++)
        free(first[i]);
}

/* An 8 MiB block from one call site, new and then reused by BigCache after
 * its purge: the faults touching it, and its huge pages, each time. */
static void new_and_purged(const char *mode, long faults[2], size_t huge[2])
{
    if (!huge_pages_available())
        printf("%s: transparent huge pages are off here: not checked\n", mode);
    for (int round = 0; round < 2; round++) {
        hak_stats_t before, after;
        hak_stats_get(&before);
        char *p = malloc(8 * MiB);
        hak_stats_get(&after);
        CHECK(p && hak_owns(p) && ((uintptr_t)p & (2 * MiB - 1)) < 4096); /* in a chunk's first page */
        CHECK(after.bigcache_hits == before.bigcache_hits + (uint64_t)round);
        faults[round] = faults_touching(p, 8 * MiB);
        huge[round] = huge_bytes_at(p);
        free(p);
        usleep(400 * 1000); /* past the delay: BigCache purges the block */
    }
    printf("%s: touching 8 MiB, new: %ld faults, %zu MiB in huge pages; reused after purge: %ld, %zu MiB\n", mode,
           faults[0], huge[0] >> 20, faults[1], huge[1] >> 20);
}

/* A 512 KiB block of the page arenas, new to its arena and then again
 * once hak_collect purged its pages: the faults touching it each time. */
static void arena_new_and_purged(const char *mode, long faults[3])
{
    for (int round = 0; round < 2; round++) {
        hak_stats_t before, after;
        hak_stats_get(&before);
        char *p = malloc(512 << 10);
        hak_stats_get(&after);
        CHECK(p && hak_owns(p) && after.arena_bytes >= before.arena_bytes + (512 << 10));
        faults[round] = faults_touching(p, 512 << 10);
        free(p);
        hak_collect(true);
    }
    /* Grown by realloc into the wilderness: the pages it took. */
    char *p = malloc(512 << 10);
    memset(p, 1, 512 << 10);
    char *q = realloc(p, 1 << 20);
    CHECK(q == p && q[(512 << 10) - 1] == 1);
    faults[2] = faults_touching(q + (512 << 10), 512 << 10);
    free(q);
    hak_collect(true);
    printf("%s: touching a 512 KiB arena block, new: %ld faults; after a purge: %ld; the 512 KiB realloc added: %ld\n",
           mode, faults[0], faults[1], faults[2]);
}

static uint64_t large_huge_blocks(void)
{
    hak_stats_t s;
    hak_stats_get(&s);
    return s.large_huge;
}

/* A large block too small for a whole 2 MiB chunk, touched, then grown by
 * realloc to 8 MiB: whether its mapping asked for huge pages only then,
 * the faults touching the grown block, and its huge pages. */
static void grown_by_realloc(const char *mode, bool *advised_on_growth, long *faults, size_t *huge)
{
    uint64_t before = large_huge_blocks();
    char *p = malloc(3 * MiB / 2);
    CHECK(p && hak_owns(p) && large_huge_blocks() == before);
    memset(p, 1, 3 * MiB / 2);
    char *q = realloc(p, 8 * MiB);
    CHECK(q && hak_owns(q) && q[0] == 1 && q[3 * MiB / 2 - 1] == 1);
    *advised_on_growth = large_huge_blocks() == before + 1;
    *faults = faults_touching(q, 8 * MiB);
    *huge = huge_bytes_at(q);
    free(q);
    printf("%s: 1.5 MiB grown to 8 MiB: %s, %ld faults touching it, %zu MiB in huge pages\n", mode,
           *advised_on_growth ? "huge pages asked for" : "no huge pages asked for", *faults, *huge >> 20);
}

static void mode_prewarm(bool huge_expected)
{
    long faults[2];
    size_t huge[2];
    new_and_purged(huge_expected ? "prewarm" : "prewarm_small", faults, huge);
    CHECK(faults[0] <= 8 && faults[1] <= 8);
    CHECK(large_huge_blocks() == (huge_expected ? 1 : 0));
    if (!huge_expected || huge_pages_available())
        CHECK((huge[0] >= 2 * MiB && huge[1] >= 2 * MiB) == huge_expected);
    /* realloc's new pages are pre-warmed too, and on huge pages. */
    bool advised;
    long grown_faults;
    size_t grown_huge;
    grown_by_realloc(huge_expected ? "prewarm" : "prewarm_small", &advised, &grown_faults, &grown_huge);
    CHECK(grown_faults <= 8 && advised == huge_expected);
    if (!huge_expected || huge_pages_available())
        CHECK((grown_huge >= 2 * MiB) == huge_expected);
    /* An arena block's pages that are not resident fault in at once. */
    long arena_faults[3];
    arena_new_and_purged(huge_expected ? "prewarm" : "prewarm_small", arena_faults);
    CHECK(arena_faults[0] <= 4 && arena_faults[1] <= 4 && arena_faults[2] <= 4);
}

static void mode_hugepages(void)
{
    long faults[2];
    size_t huge[2];
    new_and_purged("hugepages", faults, huge);
    CHECK(large_huge_blocks() == 1);
    /* Without HAKMEM_PREWARM an arena block's pages fault one by one. */
    long arena_faults[3];
    arena_new_and_purged("hugepages", arena_faults);
    CHECK(arena_faults[0] >= 64 && arena_faults[1] >= 64 && arena_faults[2] >= 64);
    if (!huge_pages_available())
        return;
    /* The kernel may fall back to small pages where memory is fragmented:
     * at least one chunk of four, a fault per page only in the others, and
     * the purge must not split the reused block's huge pages (the first
     * chunk's, when it spared the header's page inside it). */
    CHECK(huge[0] >= 2 * MiB && huge[1] >= huge[0]);
    CHECK(faults[0] <= 8 + (long)((8 * MiB - huge[0]) >> 12) && faults[1] <= 8 + (long)((8 * MiB - huge[1]) >> 12));
    /* A block born under a chunk asks for them when realloc grows it past
     * one: the chunks the growth added are huge pages. */
    bool advised;
    long grown_faults;
    size_t grown_huge;
    grown_by_realloc("hugepages", &advised, &grown_faults, &grown_huge);
    CHECK(advised && grown_huge >= 2 * MiB);
}

/* The size of the writable private anonymous mappings, which the kernel
 * charges to the system's commit (the unreserved ones at least). */
static size_t writable_anonymous_bytes(void)
{
    FILE *f = fopen("/proc/self/maps", "r");
    char line[512];
    size_t total = 0;
    while (f && fgets(line, sizeof line, f)) {
        unsigned long start, end, inode;
        char perms[8], name[256] = "";
        if (sscanf(line, "%lx-%lx %7s %*s %*s %lu %255s", &start, &end, perms, &inode, name) >= 4 &&
            !strcmp(perms, "rw-p") && inode == 0 && name[0] != '[')
            total += end - start;
    }
    if (f)
        fclose(f);
    return total;
}

/* A block of size bytes from hakmem, touched and freed (through a
 * volatile pointer: the compiler drops a memset before a free). */
static void touch_and_free(size_t size)
{
    char *volatile p = malloc(size);
    CHECK(p && hak_owns(p));
    if (p)
        memset(p, 1, size);
    free(p);
}

/* (HAKMEM_PURGE_DELAY_MS=1000, a margin for a loaded machine) Blocks
 * freed in the program's first purge delay start no purger thread (a
 * short program paid its start and end, 80-215 us of a 1.2 ms `ls`):
 * into a thread's caches, or leaving at most 2.25 MiB of pages to purge,
 * a buffer of 2 MiB taken back from BigCache and freed again counted
 * once; a program that then sleeps keeps no more than that. A slow-path
 * allocation after that delay starts it, and it flushes the caches and
 * purges the pages. */
static void mode_young(size_t start)
{
    CHECK(thread_count() == 1);
    touch_and_free(4096);      /* a thread's cache */
    touch_and_free(128 << 10); /* a page arena's pages */
    for (int i = 0; i < 8; i++)
        touch_and_free(2 << 20); /* a large block into BigCache, and back */
    CHECK(thread_count() == 1);
    usleep(1100 * 1000);
    CHECK(thread_count() == 1); /* nothing told it */
    size_t slept = rss_bytes();
    printf("young: start %.2f MiB, after the frees and a sleep %.2f MiB\n", start / 1048576.0, slept / 1048576.0);
    CHECK(slept <= start + 5 * MiB / 2);
    enum { KEPT = 4000 };
    static void *kept[KEPT];
    for (int i = 0; i < KEPT; i++) /* refills */
        kept[i] = malloc((size_t)16 + (size_t)(i % 64) * 8);
    int threads = thread_count();
    for (int i = 0; i < KEPT; i++)
        free(kept[i]);
    printf("young: one thread after the first frees, %d after allocating past the delay\n", threads);
    CHECK(threads == 2);
}

/* (HAKMEM_PURGE_DELAY_MS=1000) A young program's frees that leave more
 * than 2.25 MiB of pages in all start the thread at once. */
static void mode_young_bound(void)
{
    touch_and_free(2 << 20);
    CHECK(thread_count() == 1);
    touch_and_free(512 << 10);
    CHECK(thread_count() == 2);
}

/* (HAKMEM_PURGE_DELAY_MS=100) A young program's 2 MiB block, freed into
 * BigCache, leaves the purger thread to start at the next slow path after
 * the delay: here the refill of a mid class, inside the heap's mid
 * section (heap_mid_enter). pthread_create allocates, and there an
 * allocation of a mid size (the new thread's TLS vector, with 48 modules
 * or more) ended the section's mark while the refill still ran, so that
 * the thread could claim the caches under it. The start waits until the
 * section is over (the debug build asserts it in purger_start) and comes
 * before the malloc returns. */
static void mode_young_mid(void)
{
    touch_and_free(2 << 20);
    CHECK(thread_count() == 1);
    usleep(300 * 1000);
    void *p = malloc(4096); /* the class's first: a refill */
    CHECK(p && hak_owns(p));
    int threads = thread_count();
    free(p);
    printf("young_mid: %d threads after the first mid malloc past the delay\n", threads);
    CHECK(threads == 2);
}

/* Waits for the child pid: whether it exited with 0. */
static bool exited_cleanly(pid_t pid)
{
    int status;
    return pid > 0 && waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

static void mode_mlockall(void)
{
    size_t writable = writable_anonymous_bytes();
    printf("mlockall: writable anonymous mappings %.1f MiB\n", writable / 1048576.0);
    CHECK(writable <= 32 * MiB);
    struct rlimit unlimited = {RLIM_INFINITY, RLIM_INFINITY};
    setrlimit(RLIMIT_MEMLOCK, &unlimited); /* where the test may raise it */
    size_t before = rss_bytes();
    if (mlockall(MCL_CURRENT | MCL_FUTURE) != 0) {
        printf("mlockall: the kernel does not let this process lock its memory, not checked\n");
        return;
    }
    size_t locked = rss_bytes();
    allocate_mix(64 * MiB, 13);
    free_mix_shuffled(14);
    size_t freed = rss_bytes();
    malloc_trim(0);
    size_t trimmed = rss_bytes();
    munlockall();
    printf("mlockall: RSS %.1f MiB before, %.1f once locked, %.1f with 64 MiB allocated and freed, %.1f after malloc_trim\n",
           before / 1048576.0, locked / 1048576.0, freed / 1048576.0, trimmed / 1048576.0);
    CHECK(locked <= before + 16 * MiB);
    CHECK(trimmed <= locked + 2 * MiB); /* locked pages are purged too */
}

static void mode_nproc(void)
{
    if (geteuid() != 0) {
        printf("nproc: not root, not checked\n");
        return;
    }
    int err[2];
    CHECK(pipe(err) == 0);
    pid_t pid = fork();
    if (pid == 0) {
        dup2(err[1], 2);
        struct rlimit none = {0, 0};
        if (setgid(65534) != 0 || setuid(65534) != 0 || setrlimit(RLIMIT_NPROC, &none) != 0)
            _exit(3);
        prctl(PR_SET_DUMPABLE, 1); /* /proc/self stays ours to read */
        mode_sleep(rss_bytes(), false);
        fflush(stdout);
        _exit(checks_failed != 0);
    }
    close(err[1]);
    char said[2048];
    ssize_t len = 0;
    for (ssize_t n; len < (ssize_t)sizeof said - 1 && (n = read(err[0], said + len, sizeof said - 1 - (size_t)len)) > 0;)
        len += n;
    said[len] = 0;
    close(err[0]);
    CHECK(exited_cleanly(pid));
    CHECK(len == 0); /* no word from hakmem (nor a failed check) */
    if (len)
        fprintf(stderr, "nproc: the child said:\n%s", said);
}

static int allocating_child(void *arg)
{
    (void)arg;
    for (size_t i = 0; i < 200; i++) {
        void *volatile block = malloc(1000 + i * 5000);
        memset(block, 1, 100);
        free(block);
    }
    void *volatile large = malloc(3 * MiB);
    free(large);
    return 0;
}

static void mode_clone(void)
{
    static char stack[256 << 10];
    int hung = 0, purger_left = 0;
    for (uint64_t round = 0; round < 100; round++) {
        allocate_mix(16 * MiB, 20 + round);
        free_mix_shuffled(21 + round);
        usleep((useconds_t)(round % 10) * 100);
        pid_t pid = clone(allocating_child, stack + sizeof stack, SIGCHLD, NULL);
        purger_left += thread_count() != 1;
        int status = 0;
        double deadline = now_ms() + 2000;
        while (pid > 0 && waitpid(pid, &status, WNOHANG) == 0) {
            if (now_ms() > deadline) { /* waiting on a lock for ever */
                hung++;
                kill(pid, SIGKILL);
                waitpid(pid, &status, 0);
                break;
            }
            usleep(1000);
        }
        CHECK(pid > 0);
    }
    printf("clone: %d of 100 children hung, the purger running after %d clones\n", hung, purger_left);
    CHECK(hung == 0);
    CHECK(purger_left == 0);
}

/* Every bin of the thread's front to the arenas (blocks of 5 to 16 pages)
 * filled to its 512 KiB, touched: 6 MiB that only a purge of the front
 * gives back. */
static void fill_arena_front(void)
{
    for (size_t pages = 5; pages <= 16; pages++) {
        void *block[512 / 20];
        size_t n = 512 * 1024 / (pages * 4096);
        for (size_t i = 0; i < n; i++) { /* each finds the bin empty: its limit grows */
            block[i] = malloc(pages * 4096);
            memset(block[i], 1, pages * 4096);
        }
        for (size_t i = 0; i < n; i++)
            free(block[i]);
    }
}

static void mode_seccomp(void)
{
    for (int open_allowed = 0; open_allowed < 2; open_allowed++) {
        pid_t pid = fork();
        if (pid == 0) {
            if (!install_filter(open_allowed))
                _exit(2);
            /* A first round faults in the code (a fork child's RSS starts
             * without its parent's file pages); the second is measured. */
            free_sleep_allocate(8 * MiB, 30);
            size_t start = rss_bytes();
            /* The thread's own inline purges empty its front: the purger's
             * claim, which takes a membarrier, is not theirs to make. */
            fill_arena_front();
            free_sleep_allocate(64 * MiB, 32);
            if (open_allowed) { /* RSS can be read */
                size_t end = rss_bytes();
                printf("seccomp: RSS %.2f MiB before, %.2f MiB once allocated again\n", start / 1048576.0,
                       end / 1048576.0);
                CHECK(end <= start + 5 * MiB / 2);
            }
            fflush(stdout);
            _exit(checks_failed != 0);
        }
        int status;
        CHECK(pid > 0 && waitpid(pid, &status, 0) == pid);
        if (WIFEXITED(status) && WEXITSTATUS(status) == 2) {
            printf("seccomp: the kernel refuses a filter here, not checked\n");
            continue;
        }
        if (WIFSIGNALED(status))
            fprintf(stderr, "seccomp: the child (open %s) was killed by signal %d\n",
                    open_allowed ? "allowed" : "refused", WTERMSIG(status));
        CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    }
}

/* Whether a process of one thread, with no purger, may make this call. */
static bool allowed_single(int (*call)(int), int arg)
{
    pid_t pid = fork();
    if (pid == 0)
        _exit(call(arg) == 0 ? 0 : 1);
    return exited_cleanly(pid);
}

static int setns_own_mount(int fd) { return setns(fd, CLONE_NEWNS); }

static int unshare_user(int flags) { return (int)syscall(SYS_unshare, flags); }

/* Frees that leave pages to purge: the purger thread starts. */
static void start_purger(uint64_t seed)
{
    allocate_mix(64 * MiB, seed);
    free_mix_shuffled(seed + 1);
    CHECK(thread_count() == 2);
}

static void mode_unshare(void)
{
    int mount_ns = open("/proc/self/ns/mnt", O_RDONLY);
    bool can_setns = mount_ns >= 0 && allowed_single(setns_own_mount, mount_ns);
    bool can_unshare = allowed_single(unshare_user, CLONE_NEWUSER);
    printf("unshare: a process of one thread may%s rejoin its mount namespace and may%s unshare its user namespace\n",
           can_setns ? "" : " not", can_unshare ? "" : " not");
    pid_t pid = fork();
    if (pid == 0) {
        start_purger(7);
        if (can_setns) {
            CHECK(setns(mount_ns, CLONE_NEWNS) == 0);
            CHECK(thread_count() == 1);
            start_purger(9);
        }
        if (can_unshare) {
            CHECK(unshare(CLONE_NEWUSER) == 0);
            CHECK(thread_count() == 1);
        }
        /* hakmem goes on serving, and the purger starts again. */
        start_purger(11);
        _exit(checks_failed != 0);
    }
    CHECK(exited_cleanly(pid));
    if (mount_ns >= 0)
        close(mount_ns);
}

/* A thread that asks to be cancelled at its next cancellation point,
 * then frees the blocks it took before (start_purger's frees) or takes
 * its first blocks: it returns from its calls and exits with its own
 * value, not PTHREAD_CANCELED. */
static void *free_cancel_pending(void *seed)
{
    allocate_mix(64 * MiB, (uint64_t)(uintptr_t)seed);
    pthread_cancel(pthread_self());
    free_mix_shuffled((uint64_t)(uintptr_t)seed + 1);
    return seed;
}

static void *first_blocks_cancel_pending(void *seed)
{
    pthread_cancel(pthread_self());
    allocate_mix(MiB, (uint64_t)(uintptr_t)seed);
    free_mix_shuffled((uint64_t)(uintptr_t)seed + 1);
    return seed;
}

/* unshare, with the purger running (it stops it first), is none either. */
static void *unshare_cancel_pending(void *seed)
{
    allocate_mix(64 * MiB, (uint64_t)(uintptr_t)seed);
    free_mix_shuffled((uint64_t)(uintptr_t)seed + 1);
    pthread_cancel(pthread_self());
    return unshare(0) == 0 ? seed : NULL;
}

static bool returned_itself(void *(*body)(void *), uintptr_t seed)
{
    pthread_t thread;
    void *result = NULL;
    return pthread_create(&thread, NULL, body, (void *)seed) == 0 && pthread_join(thread, &result) == 0 &&
           result == (void *)seed;
}

static void mode_cancel(void)
{
    pid_t pid = fork();
    if (pid == 0) {
        alarm(20); /* a wait for a purger that never runs ends here */
        CHECK(returned_itself(free_cancel_pending, 13));
        CHECK(returned_itself(first_blocks_cancel_pending, 15));
        CHECK(returned_itself(unshare_cancel_pending, 17));
        CHECK(unshare(0) == 0); /* waits for the purger to be gone */
        CHECK(thread_count() == 1);
        start_purger(19); /* and it starts again */
        _exit(checks_failed != 0);
    }
    CHECK(exited_cleanly(pid));
}

static long max_map_count(void)
{
    char text[32] = "";
    int fd = open("/proc/sys/vm/max_map_count", O_RDONLY);
    if (fd >= 0 && read(fd, text, sizeof text - 1) < 0)
        text[0] = 0;
    if (fd >= 0)
        close(fd);
    return atol(text);
}

/* Split a reservation of no access into mappings (every other page made
 * readable) until the kernel refuses one more, then merge back `spare`
 * pairs: the process has 2 * spare mappings left. */
static void use_mappings_but(long limit, long spare)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    char *base = mmap(NULL, (size_t)limit * 2 * page, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    CHECK(base != MAP_FAILED);
    long made = 0;
    while (made < limit && mprotect(base + (size_t)made * 2 * page, page, PROT_READ) == 0)
        made++;
    CHECK(made < limit && errno == ENOMEM);
    for (long i = 1; i <= spare && i <= made; i++)
        mprotect(base + (size_t)(made - i) * 2 * page, page, PROT_NONE);
}

static void mode_maplimit(void)
{
    long limit = max_map_count();
    if (limit <= 0 || limit > (4l << 20)) {
        printf("maplimit: vm.max_map_count %ld, skipped\n", limit);
        return;
    }
    pid_t pid = fork();
    if (pid == 0) {
        use_mappings_but(limit, 10);
        size_t start = rss_bytes();
        uint64_t seed = 21;
        long served = 0, refused = 0;
        for (int round = 0; round < 8; round++) {
            block_count = 0;
            for (int i = 0; i < 2000; i++) {
                size_t size = (size_t)16 << (rng(&seed) % 19); /* 16 B .. 4 MiB */
                size += rng(&seed) % size;                      /* .. 8 MiB */
                errno = 0;
                void *p = malloc(size);
                if (!p) {
                    CHECK(errno == ENOMEM);
                    refused++;
                    continue;
                }
                CHECK(hak_owns(p));
                memset(p, 0x5a, size < 65536 ? size : 65536);
                blocks[block_count++] = p;
                served++;
            }
            free_mix_shuffled(seed);
        }
        malloc_trim(0);
        size_t end = rss_bytes();
        printf("maplimit: %ld mappings allowed; %ld blocks served, %ld refused; RSS %.1f MiB at the start, "
               "%.1f after malloc_trim(0)\n", limit, served, refused, start / 1048576.0, end / 1048576.0);
        CHECK(served > 4000); /* of 16,000: every peer serves them all here */
        CHECK(end <= start + 4 * MiB);
        fflush(stdout);
        _exit(checks_failed != 0);
    }
    CHECK(exited_cleanly(pid));
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "trim";
    blocks = calloc(1 << 16, sizeof *blocks);
    CHECK(blocks != NULL);
    rss_bytes(); /* fault in the reading code */
    size_t start = rss_bytes();
    if (!strcmp(mode, "trim"))
        mode_trim(start);
    else if (!strcmp(mode, "sleep"))
        mode_sleep(start, true);
    else if (!strcmp(mode, "inline"))
        mode_sleep(start, false);
    else if (!strcmp(mode, "lazyfree"))
        mode_lazyfree(start);
    else if (!strcmp(mode, "prewarm"))
        mode_prewarm(true);
    else if (!strcmp(mode, "prewarm_small"))
        mode_prewarm(false);
    else if (!strcmp(mode, "hugepages"))
        mode_hugepages();
    else if (!strcmp(mode, "mlockall"))
        mode_mlockall();
    else if (!strcmp(mode, "nproc"))
        mode_nproc();
    else if (!strcmp(mode, "clone"))
        mode_clone();
    else if (!strcmp(mode, "seccomp"))
        mode_seccomp();
    else if (!strcmp(mode, "unshare"))
        mode_unshare();
    else if (!strcmp(mode, "cancel"))
        mode_cancel();
    else if (!strcmp(mode, "maplimit"))
        mode_maplimit();
    else if (!strcmp(mode, "young"))
        mode_young(start);
    else if (!strcmp(mode, "young_bound"))
        mode_young_bound();
    else if (!strcmp(mode, "young_mid"))
        mode_young_mid();
    else if (!strcmp(mode, "smallpages"))
        mode_smallpages(false);
    else if (!strcmp(mode, "smallpages_sampled"))
        mode_smallpages(true);
    else
        CHECK(!"unknown mode");
    free(blocks);
    return check_summary(mode);
}
