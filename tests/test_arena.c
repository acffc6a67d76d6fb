/* The page arenas (blocks above 16 KiB up to the large threshold):
 * blocks are runs of pages that the stats count, a freed block merges
 * with its free neighbours and the merged run serves the next fitting
 * request at the same address (the best fit, however far its length from
 * the request's), the top of an arena is trimmed at once,
 * free runs inside go back to the OS after the purge delay, realloc grows
 * and shrinks in place (past the large threshold too, up to 16 MiB, unless
 * its call site's buffers outgrew that before), aligned requests are served from the arenas, calloc
 * of reused pages reads zeros, threads free each other's blocks, and
 * hak_collect(true) unmaps every empty arena, also while threads allocate
 * (purges run with the lane unlocked). A thread's front keeps the
 * blocks of up to 256 KiB it freed for its next mallocs, as many as those
 * asked for and 8 MiB at most, until a collect or the purge delay, and
 * stops the program at a link a write after free changed; each size up to
 * 64 KiB has its list, the slab classes' and the arenas' alike, and above
 * that blocks are size classes, eight per doubling. Past a full bin, a
 * freed block waits in its lane's pool for the next malloc of its size,
 * until a collect or the purger (with no call) gives it back. */
#define _GNU_SOURCE
#include "check.h"
#include "hakmem.h"
#include "other_lane.h"
#include "rss.h"

#include <malloc.h>
#include <pthread.h>
#include <semaphore.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static const size_t KiB = 1024, MiB = 1024 * 1024;

static hak_stats_t stats(void)
{
    hak_stats_t s;
    hak_stats_get(&s);
    return s;
}

/* The hardened build ends every block with a canary of 8 bytes and gives
 * the request as its usable size (docs/reliability.md): a block spans the
 * pages of its request and canary, and its run is not seen through
 * malloc_usable_size. The sizes below that must fill a run whole ask for
 * the run less the canary. */
static size_t canary(void) { return stats().hardened ? 8 : 0; }
static size_t pages_of(size_t size) { return (size + canary() + 4095) & ~(size_t)4095; }
static size_t usable_of(size_t size) { return canary() ? size : pages_of(size); }

/* The compiler may drop stores to a block that is freed next: they
 * count as read here. */
static void keep_stores(void *p) { __asm__ volatile("" : : "r"(p) : "memory"); }

static void fill(char *p, size_t size, int value)
{
    for (size_t i = 0; i < size; i += 4096)
        p[i] = (char)value;
    p[size - 1] = (char)value;
    keep_stores(p);
}

/* The page starts fill wrote, up to size. */
static int intact(const char *p, size_t size, int value)
{
    for (size_t i = 0; i < size; i += 4096)
        if (p[i] != (char)value)
            return 0;
    return 1;
}

/* A block is an arena's: counted in its bytes, whole pages. (A size
 * above the thread's front, which may keep the block at its free, and
 * above the size classes.) */
static void test_served(void)
{
    size_t before = stats().arena_bytes;
    char *p = heap_malloc(300000);
    hak_stats_t s = stats();
    CHECK(p && hak_owns(p) && hak_owns(p + 299999));
    CHECK(s.arenas >= 1);
    CHECK(s.arena_bytes == before + pages_of(300000));
    CHECK(malloc_usable_size(p) == usable_of(300000));
    CHECK((uintptr_t)p % 4096 == 0);
    free(p);
    CHECK(stats().arena_bytes == before);
    /* The slab classes end at 16 KiB, the arenas at the large threshold. */
    size_t slab_max = 16 * KiB - canary();
    char *slab = heap_malloc(slab_max);
    CHECK(stats().arena_bytes == before);
    free(slab);
    char *arena = heap_malloc(slab_max + 1);
    CHECK(stats().arena_bytes == before + 20 * KiB && malloc_usable_size(arena) == usable_of(slab_max + 1));
    free(arena);
    hak_collect(false); /* its thread's front */
    CHECK(stats().arena_bytes == before);
}

/* The thread's front: a freed block of 16-64 KiB waits for the thread's
 * next malloc of as many pages, if a malloc of that many found none
 * before; a collect, or the purge delay, gives it back to its arena. */
static void test_front(void)
{
    /* Past the program's first purge delay (100 ms), in which a free
     * into a thread's front starts no purger thread (release_young). */
    usleep(150 * 1000);
    hak_collect(false);
    size_t before = stats().arena_bytes, block = pages_of(40 * KiB);
    char *a = heap_malloc(40 * KiB); /* its bin was empty: it keeps one block now */
    free(a);
    CHECK(stats().arena_bytes == before + block && !hak_owns(a));
    char *b = heap_malloc(block - canary() - 3 * KiB); /* as many pages */
    CHECK(b == a && hak_owns(b) && malloc_usable_size(b) == usable_of(block - canary() - 3 * KiB));
    char *c = heap_malloc(40 * KiB); /* empty again: two from now on */
    char *d = heap_malloc(40 * KiB); /* three */
    free(b);
    free(c);
    free(d);
    CHECK(stats().arena_bytes == before + 3 * block);
    CHECK(heap_malloc(40 * KiB) == d && heap_malloc(40 * KiB) == c);
    free(c);
    free(d);
    hak_collect(false);
    CHECK(stats().arena_bytes == before);
    /* Without a call: the purger empties it a purge delay after the first
     * free into it (three delays allowed). */
    if (skipped_without_purge_thread("front emptied by the purger"))
        return;
    free(heap_malloc(40 * KiB));
    CHECK(stats().arena_bytes == before + block);
    for (int i = 0; i < 100 && stats().arena_bytes != before; i++)
        usleep(3000);
    CHECK(stats().arena_bytes == before);
}

/* A collect empties the front, and the next free into it starts a new
 * purge delay: a pass that comes right after keeps the block. The delay
 * used to start at the free before the collect, which left the heap's
 * flag set: without the purger thread, the next pass flushed the new
 * front, and its limits, at once (measured at 222c163; a thread that reused a
 * collected heap lost its front the same way). */
static void test_front_delay_after_collect(void)
{
    free(heap_malloc(40 * KiB)); /* a delay starts */
    hak_collect(false);          /* the front emptied, within that delay */
    usleep(150 * 1000);          /* the delay over, no call made */
    size_t before = stats().arena_bytes;
    double start = now_ms();
    free(heap_malloc(40 * KiB)); /* a new delay */
    free(heap_malloc(512 * KiB)); /* pages to purge: a pass now, without the thread */
    if (now_ms() - start > 50) {
        printf("front delay after a collect: skipped, the machine too slow to tell\n");
    } else {
        CHECK(stats().arena_bytes == before + pages_of(40 * KiB));
    }
    hak_collect(false);
}

/* Every size above the tiny ones up to 64 KiB has its list among the
 * thread's mid fronts, a mid class's stash or a page count's bin of the
 * front to the arenas (hak_front_of, one per 128 B of sizes): the block
 * freed last comes back for the next malloc in the same 128 B, and
 * holds it; a malloc of the next 128 B gets a block that holds that. A
 * sample, or the purger at the fronts, may hand out another block now
 * and then: the reuse is counted, the sizes are checked every time. */
static void test_front_every_size(void)
{
    int sizes = 0, reused = 0, held = 0;
    /* Each list's sizes, less the hardened build's canary; there a block
     * holds its request, which is all malloc_usable_size shows. */
    size_t c8 = canary();
    for (size_t top = 1024 + 128; top <= 64 * KiB; top += 128, sizes++) {
        free(heap_malloc(top - c8)); /* a bin found empty keeps a block from now on */
        char *a = heap_malloc(top - c8);
        free(a);
        char *b = heap_malloc(top - 127 - c8);
        reused += b == a;
        held += malloc_usable_size(b) >= (c8 ? top - 127 - c8 : top);
        free(b);
        char *c = heap_malloc(top + 1 - c8);
        held += malloc_usable_size(c) >= top + 1 - c8;
        free(c);
    }
    printf("front every size: %d of %d sizes took the block freed last\n", reused, sizes);
    CHECK(held == 2 * sizes);
    CHECK(reused >= sizes * 9 / 10);
    hak_collect(true); /* no purge left pending: test_trim's figures under MADV_FREE would count one */
}

/* The bytes of the run that a malloc of size gets: its usable size, or
 * in the hardened build what it adds to the arenas' bytes (after a
 * collect, so that it comes from an arena, not the thread's front). */
static size_t class_bytes(size_t size)
{
    if (canary())
        hak_collect(false);
    size_t before = stats().arena_bytes;
    char *p = heap_malloc(size);
    size_t bytes = canary() ? stats().arena_bytes - before : malloc_usable_size(p);
    free(p);
    return bytes;
}

/* Above 64 KiB up to 256 KiB, blocks are size classes: whole pages, at
 * most 12.5% above the size asked for, 2 pages apart up to 128 KiB and 4
 * up to 256. Each class has its bin in the thread's front: the block freed
 * last waits there (hak_owns denies it) and comes back for the next malloc
 * of its class's least size, as the page counts' below
 * (test_front_every_size); a block of 65 pages goes back to its arena. */
static void test_front_classes(void)
{
    int classes = 0, reused = 0, denied = 0, held = 0;
    size_t least = 64 * KiB + 1, c8 = canary(); /* size: the bytes a request takes, its canary's too */
    for (size_t size = least; size <= 256 * KiB; size += KiB) {
        size_t usable = class_bytes(size - c8);
        held += usable >= size && usable - size <= size / 8 && usable % (4 * KiB) == 0 &&
                usable % ((size <= 128 * KiB ? 8 : 16) * KiB) == 0;
        if (size + KiB <= usable)
            continue;
        free(heap_malloc(usable - c8)); /* the class's bin found empty keeps a block from now on */
        char *a = heap_malloc(usable - c8);
        free(a);
        denied += !hak_owns(a); /* waiting in the front, not the program's */
        char *b = heap_malloc(least - c8);
        reused += b == a;
        free(b);
        least = usable + 1;
        classes++;
    }
    printf("front classes: %d of %d classes took the block freed last\n", reused, classes);
    CHECK(classes == 16 && held == 192);
    CHECK(reused >= classes * 9 / 10 && denied >= classes * 9 / 10);
    hak_collect(false);
    size_t before = stats().arena_bytes;
    free(heap_malloc(256 * KiB + 1)); /* 65 pages: no bin */
    free(heap_malloc(256 * KiB + 1));
    CHECK(stats().arena_bytes == before);
}

/* A heap's bins keep 8 MiB together at most (ARENA_FRONT_BYTES), where
 * each may keep 512 KiB: with every bin's limit grown to its 512 KiB,
 * the largest first, they stop within a block of 5 pages of 8 MiB. The
 * purger may empty the front meanwhile (its limits start over): three
 * tries. */
static size_t front_filled_bytes(void)
{
    hak_collect(false);
    size_t before = stats().arena_bytes;
    for (size_t size = 256 * KiB; size >= 20 * KiB; size -= 4 * KiB) {
        size_t pages = size / (4 * KiB); /* a class's whole run (test_front_classes) */
        if (pages > 16 && pages % (pages <= 32 ? 2 : 4))
            continue;
        char *block[512 / 20];
        size_t n = 512 * KiB / size;
        for (size_t i = 0; i < n; i++) /* each finds the bin empty: its limit grows */
            block[i] = heap_malloc(size - canary());
        for (size_t i = 0; i < n; i++)
            free(block[i]);
    }
    hak_stats_t s = stats();
    size_t held = s.arena_bytes - s.arena_pooled_bytes - before; /* the rest waits in the lane's pools */
    hak_collect(false);
    CHECK(stats().arena_bytes == before);
    return held;
}

static void test_front_budget(void)
{
    size_t held = 0;
    for (int try = 0; try < 3 && held <= 8 * MiB - 20 * KiB; try++) {
        held = front_filled_bytes();
        CHECK(held <= 8 * MiB);
    }
    printf("front budget: %.2f MiB kept\n", (double)held / (double)MiB);
    CHECK(held > 8 * MiB - 20 * KiB);
}

/* Behind the fronts, the lanes' pools: n blocks of size freed by a thread
 * of another lane (other_lane.h), past its full bin, wait in the pool of
 * their own lane (1 MiB: 9 of 104 KiB, 14 blocks at most), counted in
 * arena_pooled_bytes and denied by hak_owns, for the next malloc of their
 * size on their lane that finds its bin empty: ours, which takes them
 * back (the same blocks); a collect empties the pools. Without pools (or
 * on one CPU, one lane) none is pooled. A sample, or the purger, may
 * change the counts now and then: three tries. */
enum { POOL_TEST_MAX = 16 };
static bool pool_served(size_t size, int n)
{
    hak_collect(true);
    size_t before = stats().arena_bytes;
    char *block[POOL_TEST_MAX], *again[POOL_TEST_MAX];
    for (int i = 0; i < n; i++)
        block[i] = heap_malloc(size);
    int pooled = other_lane_free(block, n, size);
    bool ok = true;
    if (!other_lane_pools()) {
        CHECK(pooled == 0 && stats().arena_pooled_bytes == 0);
    } else {
        ok = pooled >= n - 1 && stats().arena_pooled_bytes == (size_t)pooled * pages_of(size);
        CHECK(!hak_owns(block[n - 1]));
        int same = 0;
        for (int i = 0; i < pooled; i++) {
            again[i] = heap_malloc(size);
            for (int k = n - pooled; k < n; k++)
                same += again[i] == block[k];
        }
        ok = ok && same == pooled && stats().arena_pooled_bytes == 0;
        for (int i = 0; i < pooled; i++)
            free(again[i]);
    }
    other_lane_release();
    hak_collect(true);
    hak_stats_t s = stats();
    CHECK(s.arena_pooled_bytes == 0 && s.arena_bytes == before);
    return ok;
}

/* With no call into hakmem, the purger gives a pool's blocks back to
 * their arenas a delay or two after the first came. (Past the program's
 * first delay, when a free that leaves pages to purge starts it.) */
static void pool_purged(void)
{
    if (!other_lane_pools() || !purge_thread_on())
        return;
    usleep(200 * 1000);
    char *block[8];
    for (int i = 0; i < 8; i++)
        block[i] = heap_malloc(40 * KiB);
    int pooled = other_lane_free(block, 8, 40 * KiB);
    CHECK(pooled > 0 && stats().arena_pooled_bytes > 0);
    double start = now_ms();
    while (stats().arena_pooled_bytes > 0 && now_ms() - start < 10000)
        usleep(20000);
    printf("pool purged: %.0f ms after the frees\n", now_ms() - start);
    CHECK(stats().arena_pooled_bytes == 0);
    other_lane_release();
}

static void test_pool(void)
{
    bool ok = false;
    for (int try = 0; try < 3 && !ok; try++)
        ok = pool_served(40 * KiB - canary(), 10);
    CHECK(ok);
    ok = false;
    for (int try = 0; try < 3 && !ok; try++)
        ok = pool_served(104 * KiB - canary(), 8); /* a class's bin */
    CHECK(ok);
    pool_purged();
}

/* A thread that only frees keeps nothing in its front. */
static char *consumed[8];
static void *consumer_main(void *arg)
{
    (void)arg;
    free(heap_malloc(64)); /* a heap of its own */
    for (int i = 0; i < 8; i++)
        free(consumed[i]);
    return NULL;
}

static void test_front_consumer(void)
{
    hak_collect(false);
    size_t before = stats().arena_bytes;
    for (int i = 0; i < 8; i++)
        consumed[i] = heap_malloc(20 * KiB + (size_t)i * 5 * KiB);
    pthread_t t;
    pthread_create(&t, NULL, consumer_main, NULL);
    pthread_join(t, NULL);
    CHECK(stats().arena_bytes == before);
}

/* Hardened: a write after free over a block in the front stops the
 * program at the malloc that would take it, naming hakmem, before the
 * link is followed: over its first two lines, or over its link alone
 * (the first word of its second line, ARENA_FRONT_LINK): the count the
 * link carries is wrong. The default build follows the fronts' links
 * unchecked, as the slab caches'. */
static void front_corrupt_link(size_t offset, size_t bytes)
{
    int err[2];
    CHECK(pipe(err) == 0);
    pid_t pid = fork();
    if (pid == 0) {
        dup2(err[1], STDERR_FILENO);
        char *a = heap_malloc(24 * KiB), *b = heap_malloc(24 * KiB);
        free(a);
        free(b);
        memset(b + offset, 0x5a, bytes); /* b is the front's first */
        heap_malloc(24 * KiB);
        _exit(0);
    }
    close(err[1]);
    char message[512] = {0};
    ssize_t got = read(err[0], message, sizeof message - 1);
    close(err[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    CHECK(got > 0 && strstr(message, "hakmem: malloc: free list corrupted at 0x"));
    CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT);
}

static void test_front_corrupt_link(void)
{
    hak_stats_t s;
    hak_stats_get(&s);
    if (!s.hardened)
        return;
    front_corrupt_link(0, 128);
    front_corrupt_link(64, 8);
}

/* Two neighbours freed merge; the merged run is the best fit for a block
 * of both their sizes, and is handed out at the same address. (Blocks
 * above the thread's front, which would keep them.) */
static void test_coalescing(void)
{
    size_t c8 = canary();
    char *a = heap_malloc(300 * KiB - c8), *b = heap_malloc(300 * KiB - c8), *c = heap_malloc(300 * KiB - c8);
    CHECK(b == a + 300 * KiB && c == b + 300 * KiB); /* consecutive pages of the wilderness */
    free(a);
    free(b);
    char *ab = heap_malloc(600 * KiB - c8);
    CHECK(ab == a);
    fill(ab, 600 * KiB - c8, 3);
    fill(c, 300 * KiB - c8, 4);
    CHECK(intact(ab, 600 * KiB - c8, 3) && intact(c, 300 * KiB - c8, 4));
    free(ab);
    free(c);
}

/* The only free run that fits, far longer than the request (1,020 pages,
 * in the last word of the bins' bitmap, six words above the request's
 * 150), is the best fit: the block comes from it, not from the wilderness
 * above. */
static void test_best_fit_far_bin(void)
{
    enum { N = 4 };
    size_t size = MiB - 4096;
    char *run[N];
    for (int i = 0; i < N; i++) {
        run[i] = heap_malloc(size - canary());
        CHECK(run[i] == run[0] + (size_t)i * size);
    }
    char *guard = heap_malloc(100 * KiB); /* keeps the run off the wilderness */
    CHECK(guard == run[0] + N * size);
    for (int i = 0; i < N; i++)
        free(run[i]);
    char *p = heap_malloc(600 * KiB);
    CHECK(p == run[0]);
    fill(p, 600 * KiB, 5);
    free(p);
    free(guard);
}

/* Blocks freed at the top of an arena give their pages back at once,
 * past the HAKMEM_ARENA_TRIM (32 MiB) the wilderness keeps: lazily with
 * HAKMEM_PURGE_ADVICE=free (test arena_lazyfree), where Rss keeps them
 * as LazyFree (its check compared unsigned sizes, and passed there only
 * while Rss happened to grow a page between the readings). */
static void test_trim(void)
{
    enum { N = 56 };
    char *blocks[N];
    for (int i = 0; i < N; i++) {
        blocks[i] = heap_malloc(MiB - 4096);
        fill(blocks[i], MiB - 4096, i);
    }
    size_t full = rss_held_bytes();
    for (int i = N; i-- > 0;)
        free(blocks[i]);
    size_t after = rss_held_bytes();
    CHECK(full >= after + 32 * MiB);
    CHECK(stats().arena_dirty_bytes <= 32 * MiB);
}

/* Free runs between live blocks wait for the purger, which gives them
 * back a delay or two after they were freed, with no call into hakmem. */
static void test_purge_after_delay(void)
{
    if (skipped_without_purge_thread("purge after delay"))
        return;
    enum { N = 16 };
    char *blocks[N];
    for (int i = 0; i < N; i++) {
        blocks[i] = heap_malloc(512 * KiB);
        fill(blocks[i], 512 * KiB, i);
    }
    for (int i = 0; i < N; i += 2)
        free(blocks[i]);
    CHECK(stats().arena_dirty_bytes >= N / 2 * 512 * KiB);
    double start = now_ms();
    while (stats().arena_dirty_bytes > 0 && now_ms() - start < 10000)
        usleep(20000);
    CHECK(stats().arena_dirty_bytes == 0);
    for (int i = 1; i < N; i += 2) {
        CHECK(intact(blocks[i], 512 * KiB, i));
        free(blocks[i]);
    }
}

/* Without the purger thread, purges run inside allocator calls, and a
 * collect's own frees must not start one: a collect that flushed another
 * thread's front under heaps_lock, whose free was the first to leave
 * pages for a purge once the inline check fell due, ran a pass that took
 * heaps_lock again and hung for ever (measured at 1e33727; under a pool's flush,
 * the lane's purge lock likewise). The other thread's front holds blocks
 * a delay old, nothing else is dirty, and the collect must return. */
static sem_t front_filled, front_may_exit;

static void *fill_front_and_wait(void *arg)
{
    (void)arg;
    char *b[3] = {heap_malloc(40 * KiB), heap_malloc(40 * KiB), heap_malloc(40 * KiB)};
    for (int i = 0; i < 3; i++) /* its bin's limit grows with each miss */
        fill(b[i], 40 * KiB, i);
    for (int i = 0; i < 3; i++)
        free(b[i]);
    sem_post(&front_filled);
    sem_wait(&front_may_exit);
    return NULL;
}

static void collect_hung(int sig)
{
    (void)sig;
    static const char msg[] = "test_arena: hak_collect hung inside an inline purge\n";
    (void)!write(2, msg, sizeof msg - 1);
    _exit(1);
}

static void test_collect_with_inline_purges(void)
{
    if (purge_thread_on())
        return; /* the thread purges: no pass runs inside a call */
    hak_collect(true); /* nothing dirty, and the arenas' flag that wakes a purge cleared */
    sem_init(&front_filled, 0, 0);
    sem_init(&front_may_exit, 0, 0);
    pthread_t t;
    pthread_create(&t, NULL, fill_front_and_wait, NULL);
    sem_wait(&front_filled);
    CHECK(stats().arena_bytes >= 40 * KiB); /* blocks wait in its front */
    usleep(150 * 1000); /* its front a purge delay old, the inline check due */
    signal(SIGALRM, collect_hung);
    alarm(20);
    hak_collect(false);
    alarm(0);
    signal(SIGALRM, SIG_DFL);
    printf("collect with inline purges: returned\n");
    sem_post(&front_may_exit);
    pthread_join(t, NULL);
    hak_collect(true);
}

/* realloc: a block at the top grows into the wilderness, one before a
 * free run into it, and a shrink gives its tail back (all but its size
 * class), all in place. */
static void test_realloc_in_place(void)
{
    hak_collect(true); /* no free run left by the tests before, purged or not */
    size_t c8 = canary(); /* each size fills its run whole (pages_of) */
    char *p = heap_malloc(200 * KiB - c8);
    fill(p, 200 * KiB - c8, 7);
    char *q = realloc(p, 400 * KiB - c8);
    CHECK(q == p && intact(q, 200 * KiB - c8, 7));
    fill(q, 400 * KiB - c8, 8);
    char *guard = heap_malloc(100 * KiB); /* right after it */
    CHECK(guard == p + 400 * KiB);
    q = realloc(q, 100 * KiB - c8); /* 104 KiB, its size class */
    CHECK(q == p && intact(q, 100 * KiB - c8, 8) && malloc_usable_size(q) == (c8 ? 100 * KiB - c8 : 104 * KiB));
    char *tail = heap_malloc(296 * KiB - c8); /* the tail given back: the best fit */
    CHECK(tail == p + 104 * KiB);
    free(tail);
    q = realloc(q, 350 * KiB - c8); /* into the free run after it */
    CHECK(q == p && intact(q, 100 * KiB - c8, 8) && malloc_usable_size(q) == (c8 ? 350 * KiB - c8 : 352 * KiB));
    char *large = realloc(q, 4 * MiB); /* above the threshold: moves to a mapping of its own */
    CHECK(large && intact(large, 100 * KiB, 8));
    free(large);
    free(guard);
}

/* One realloc call site for the buffers below. */
static __attribute__((noinline)) char *grow_step(char *p, size_t size)
{
    char *q = realloc(p, size);
    __asm__ volatile(""); /* a call, not a tail jump: the return address is here */
    return q;
}

/* p, grown by doubling from its size to final through grow_step, each
 * size filled; checks the contents kept at each step. */
static char *grow_buffer(char *p, size_t size, size_t final, int value)
{
    for (fill(p, size, value); size < final && p; size *= 2) {
        p = grow_step(p, size * 2);
        CHECK(p && intact(p, size, value));
        if (p)
            fill(p, size * 2, value);
    }
    return p;
}

/* realloc grows an arena block past the large threshold in place, into
 * the wilderness, up to half of HAKMEM_ARENA_TRIM (16 MiB): no large block
 * is mapped, the pointer stays. One that must leave above the threshold
 * (32 MiB asked) is copied whole and its call site noted (hak_sites_get):
 * the site's next buffer leaves at the threshold, as a copy of 1 MiB,
 * into the block BigCache kept. The hardened build (guard pages after
 * large blocks) and HAKMEM_HUGEPAGES=always (huge pages from 2 MiB on)
 * keep leaving at the threshold. */
static void test_realloc_past_threshold(void)
{
    hak_collect(true); /* an empty arena: the buffer starts at the wilderness */
    const char *huge = getenv("HAKMEM_HUGEPAGES");
    bool hardened = stats().hardened, leaves_at_2m = huge && !strcmp(huge, "always");
    hak_stats_t before = stats();
    char *start = heap_malloc(64 * KiB);
    char *p = grow_buffer(start, 64 * KiB, MiB, 1);
    CHECK(p == start && stats().large_blocks == before.large_blocks); /* within the threshold, as before */
    p = grow_buffer(p, MiB, 16 * MiB, 2);
    hak_stats_t s = stats();
    if (hardened || leaves_at_2m) {
        CHECK(p != start && s.large_blocks == before.large_blocks + 1);
    } else {
        CHECK(p == start && malloc_usable_size(p) == 16 * MiB && hak_owns(p + 16 * MiB - 1));
        CHECK(s.large_blocks == before.large_blocks && s.arena_bytes == before.arena_bytes + 16 * MiB);
        p = grow_buffer(p, 16 * MiB, 32 * MiB, 3); /* past the bound: moved */
        CHECK(p != start && stats().large_blocks == before.large_blocks + 1);
    }
    free(p);
    hak_site_t sites[256];
    size_t n = hak_sites_get(sites, 256), noted = 0;
    for (size_t i = 0; i < n; i++)
        noted += sites[i].outgrew_arena != 0;
    CHECK(noted == (hardened || leaves_at_2m ? 0 : 1));
    for (size_t i = 0; i < n && noted; i++)
        if (sites[i].outgrew_arena)
            CHECK(sites[i].outgrew_arena == 16 * MiB);
    char *text = NULL, *json = NULL;
    size_t text_size = 0, json_size = 0;
    FILE *out = open_memstream(&text, &text_size), *json_out = open_memstream(&json, &json_size);
    hak_stats_print(out);
    hak_stats_print_json(json_out);
    fclose(out);
    fclose(json_out);
    bool reported = strstr(text, "leave the page arenas at the large threshold (one grown to 16777216 bytes") &&
                    strstr(json, "\"outgrew_arena\":16777216");
    CHECK(reported == (noted == 1));
    free(text);
    free(json);
    /* The noted site's next buffer leaves at the threshold, into the
     * block the first one left in BigCache (judged as born there). */
    before = stats();
    start = heap_malloc(64 * KiB);
    p = grow_buffer(start, 64 * KiB, 2 * MiB, 4);
    s = stats();
    CHECK(p != start && s.large_blocks == before.large_blocks + 1 && s.bigcache_hits == before.bigcache_hits + 1);
    free(p);
    hak_collect(false); /* the report's blocks, in the thread's front */
}

/* Aligned blocks of the arenas' sizes come from the arenas, aligned, with
 * the pages around them left free. */
static void test_aligned(void)
{
    size_t before = stats().arena_bytes;
    for (size_t align = 8 * KiB; align <= MiB; align *= 2) {
        void *p = NULL;
        CHECK(posix_memalign(&p, align, 300000) == 0);
        CHECK(p && (uintptr_t)p % align == 0 && hak_owns(p) && malloc_usable_size(p) >= 300000);
        if (p) {
            fill(p, 300000, 9);
            free(p);
        }
    }
    void *small = aligned_alloc(256 * KiB, 100); /* a small size of large alignment */
    CHECK(small && (uintptr_t)small % (256 * KiB) == 0 && hak_owns(small));
    CHECK(stats().arena_bytes == before + 4096);
    free(small);
    CHECK(stats().arena_bytes == before);
    /* A slab size whose padding would leave the slab classes: the arenas,
     * not a mapping of its own. */
    hak_stats_t s0 = stats();
    void *mid = aligned_alloc(8 * KiB, 12000);
    hak_stats_t s1 = stats();
    CHECK(mid && (uintptr_t)mid % (8 * KiB) == 0 && hak_owns(mid));
    CHECK(s1.arena_bytes == before + pages_of(12000) && s1.large_allocs == s0.large_allocs);
    free(mid);
    CHECK(stats().arena_bytes == before);
}

static int all_zero(const unsigned char *p, size_t size)
{
    int zero = 1;
    for (size_t i = 0; p && i < size; i++)
        zero &= p[i] == 0;
    return zero;
}

/* calloc of pages another block dirtied reads zeros, and so does calloc of
 * pages purged since: with HAKMEM_PURGE_ADVICE=free (test arena_lazyfree)
 * they may keep their old contents. */
static void test_calloc(void)
{
    for (int purged = 0; purged < 2; purged++) {
        char *p = heap_malloc(500 * KiB);
        memset(p, 0xAB, 500 * KiB);
        keep_stores(p);
        char *guard = heap_malloc(100 * KiB); /* keeps p's pages off the top: not trimmed */
        keep_stores(guard); /* else GCC drops the guard's malloc and free */
        free(p);
        if (purged)
            hak_collect(true);
        unsigned char *z = calloc(1, 500 * KiB);
        CHECK(z == (unsigned char *)p);
        CHECK(all_zero(z, 500 * KiB));
        free(z);
        free(guard);
    }
    /* the top of the arena, purged likewise */
    char *top = heap_malloc(300 * KiB);
    memset(top, 0xCD, 300 * KiB);
    keep_stores(top);
    free(top);
    hak_collect(true);
    unsigned char *z = calloc(1, 300 * KiB);
    CHECK(all_zero(z, 300 * KiB));
    free(z);
}

/* Threads allocate from their lanes and free each other's blocks. */
enum { THREADS = 4, PER_THREAD = 100 };
static char *handed[THREADS][PER_THREAD];
static pthread_barrier_t barrier;

static size_t thread_size(int t, int i) { return 65 * KiB + (size_t)((t * 7919 + i * 104729) % 300) * KiB; }

/* Returns how many blocks it found damaged (CHECK's counts are not atomic). */
static void *thread_main(void *arg)
{
    int t = (int)(intptr_t)arg;
    intptr_t damaged = 0;
    for (int round = 0; round < 5; round++) {
        for (int i = 0; i < PER_THREAD; i++) {
            size_t size = thread_size(t, i);
            handed[t][i] = malloc(size);
            fill(handed[t][i], size, t + i);
        }
        pthread_barrier_wait(&barrier);
        int other = (t + 1) % THREADS; /* free the next thread's blocks */
        for (int i = 0; i < PER_THREAD; i++) {
            size_t size = thread_size(other, i);
            damaged += !intact(handed[other][i], size, other + i);
            free(handed[other][i]);
        }
        pthread_barrier_wait(&barrier);
    }
    return (void *)damaged;
}

static void test_threads(void)
{
    size_t before = stats().arena_bytes;
    pthread_t threads[THREADS];
    pthread_barrier_init(&barrier, NULL, THREADS);
    for (int t = 0; t < THREADS; t++)
        pthread_create(&threads[t], NULL, thread_main, (void *)(intptr_t)t);
    for (int t = 0; t < THREADS; t++) {
        void *damaged;
        pthread_join(threads[t], &damaged);
        CHECK(damaged == NULL);
    }
    pthread_barrier_destroy(&barrier);
    CHECK(stats().arena_bytes == before);
}

/* Purges run with the lane unlocked: while collects purge every dirty
 * page again and again, threads take and free blocks of 17 KiB to 1 MiB
 * (their top going up and down through the wilderness being purged, and
 * now and then by 40 MiB, which a free trims) and find every page they
 * wrote intact when they free it: an extent or a wilderness page handed
 * out while its madvise was running would read back as zeros. */
enum { PURGE_WORKERS = 4, PURGE_LIVE = 24, PURGE_STEPS = 600, PURGE_COLLECTS = 10 };
static _Atomic int purge_workers_left;
static _Atomic int purge_collects; /* the main thread's so far, -1 without */

static void *purge_worker(void *arg)
{
    uint64_t seed = 0x9E3779B97F4A7C15ull * ((uintptr_t)arg + 1);
    char *live[PURGE_LIVE] = {0};
    size_t sizes[PURGE_LIVE] = {0};
    int values[PURGE_LIVE] = {0};
    intptr_t damaged = 0;
    /* Past its steps, until the main thread has collected a few times
     * alongside (on a loaded machine it did 5 in the workers' 600 steps). */
    for (int step = 0; step < PURGE_STEPS || (unsigned)atomic_load(&purge_collects) < PURGE_COLLECTS; step++) {
        seed ^= seed << 13, seed ^= seed >> 7, seed ^= seed << 17;
        int i = (int)(seed % PURGE_LIVE);
        if (live[i]) {
            damaged += !intact(live[i], sizes[i], values[i]) || !hak_owns(live[i]);
            free(live[i]);
        }
        sizes[i] = 17 * KiB + (size_t)(seed >> 20) % (1007 * KiB);
        values[i] = 1 + step % 251;
        live[i] = malloc(sizes[i]);
        fill(live[i], sizes[i], values[i]);
        if (step % 200 == 0) { /* the top up by 40 MiB and down: a free trims the wilderness */
            char *tower[40];
            for (int k = 0; k < 40; k++) {
                tower[k] = malloc(MiB);
                fill(tower[k], MiB, k + 1);
            }
            for (int k = 39; k >= 0; k--) {
                damaged += !intact(tower[k], MiB, k + 1);
                free(tower[k]);
            }
        }
    }
    for (int i = 0; i < PURGE_LIVE; i++) {
        damaged += !intact(live[i], sizes[i], values[i]);
        free(live[i]);
    }
    atomic_fetch_sub(&purge_workers_left, 1);
    return (void *)damaged;
}

/* With collect, the main thread purges all the while; without, frees
 * trim the towers' wilderness while other threads of the lane take
 * from it. */
static void purges_while_allocating(bool collect)
{
    pthread_t threads[PURGE_WORKERS];
    atomic_store(&purge_workers_left, PURGE_WORKERS);
    atomic_store(&purge_collects, collect ? 0 : -1);
    for (int t = 0; t < PURGE_WORKERS; t++)
        pthread_create(&threads[t], NULL, purge_worker, (void *)(intptr_t)t);
    int collects = 0;
    while (collect && atomic_load(&purge_workers_left) > 0) {
        hak_collect(true);
        atomic_store(&purge_collects, ++collects);
    }
    intptr_t damaged = 0;
    for (int t = 0; t < PURGE_WORKERS; t++) {
        void *d;
        pthread_join(threads[t], &d);
        damaged += (intptr_t)d;
    }
    printf("purges while allocating: %d collects, %ld damaged blocks\n", collects, (long)damaged);
    CHECK(damaged == 0);
}

static void test_purge_while_allocating(void)
{
    size_t before = stats().arena_bytes;
    purges_while_allocating(true);
    purges_while_allocating(false);
    hak_collect(true);
    CHECK(stats().arena_bytes == before && stats().arena_dirty_bytes == 0);
}

/* A forced collect gives back every free page and unmaps every empty
 * arena: all but the one holding what was live at start (libstdc++'s
 * emergency exception pool is 72 KiB). */
static void test_collect(size_t live_at_start)
{
    char *p = heap_malloc(700 * KiB);
    fill(p, 700 * KiB, 1);
    free(p);
    hak_collect(true);
    hak_stats_t s = stats();
    bool ok = s.arenas == (live_at_start ? 1 : 0) && s.arena_bytes == live_at_start && s.arena_dirty_bytes == 0;
    CHECK(ok);
    if (!ok)
        fprintf(stderr, "test_arena: %zu arenas, %zu bytes, %zu dirty after collect\n", s.arenas, s.arena_bytes, s.arena_dirty_bytes);
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IONBF, 0);
    check_expected_build();
    if (argc > 1 && !strcmp(argv[1], "purges")) { /* alone, under a small HAKMEM_ARENA_TRIM: a trim at most frees */
        test_purge_while_allocating();
        return check_summary("test_arena purges");
    }
    size_t live_at_start = stats().arena_bytes;
    test_served();
    test_front();
    test_front_delay_after_collect();
    test_front_every_size();
    test_front_classes();
    test_front_budget();
    test_front_consumer();
    test_pool();
    test_front_corrupt_link();
    test_coalescing();
    test_best_fit_far_bin();
    test_trim();
    test_purge_after_delay();
    test_collect_with_inline_purges();
    test_realloc_in_place();
    test_aligned();
    test_calloc();
    test_realloc_past_threshold(); /* after the tests of placement: its report leaves free runs */
    test_threads();
    test_purge_while_allocating();
    test_collect(live_at_start);
    return check_summary("test_arena");
}
