/* Meshing (HAKMEM_MESH=on, src/mesh.c): after a random 70% of many tiny
 * blocks are freed, malloc_trim(0) shares pages between slabs and the
 * process's proportional set (Pss) drops, every live block keeps its
 * bytes, the blocks freed reuse, a free through a slot that meshing gave
 * the other slab is refused as a double free, threads writing their
 * blocks while the pages move lose no write, a fork child shares nothing
 * with its parent, freeing everything unmeshes every page, a thread's
 * exit meshes only where that gives back enough, the purger meshes
 * the pages of a thread that freed most of its tiny or mid blocks and
 * sleeps, and a process that locked its memory, or whose slabs lie on
 * huge pages, meshes as any other. Mid blocks of up to 8 KiB (slabs of
 * one slab page) mesh at the trim as tiny ones do, through a fork and
 * frees by another thread; blocks freed in a pattern mesh (the carve's
 * random order).
 * Run with HAKMEM_MESH=on and HAKMEM_ON_ERROR=warn (ctest sets both);
 * exits 77 (skipped) where the system refuses what meshing needs.
 *
 * `test_mesh auto`, with HAKMEM_MESH unset: by default meshing opens its
 * files at the first slabs to mesh and not before, out of the way of the
 * program's descriptor numbers; turns off where only a user-mode
 * userfaultfd is granted; makes none of its system calls under a
 * seccomp filter; and stops, touching nothing, once the program closed
 * its memfd and put a file of its own at that number. */
#define _GNU_SOURCE
#include "check.h"
#include "rss.h"
#include "seccomp_filter.h"

#include <fcntl.h>
#include <malloc.h>
#include <pthread.h>
#include <stdatomic.h>
#include <dirent.h>
#include <errno.h>
#include <linux/capability.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>

#define BLOCKS 60000
static const size_t sizes[] = {64, 112, 240, 496, 1000};
#define SIZES (sizeof sizes / sizeof sizes[0])

typedef struct block {
    unsigned char *p;
    size_t size;
    unsigned char fill;
} block_t;

static block_t blocks[BLOCKS];

static void block_fill(block_t *b, unsigned char fill)
{
    b->fill = fill;
    memset(b->p, fill, b->size);
}

static bool block_intact(const block_t *b)
{
    for (size_t i = 0; i < b->size; i++)
        if (b->p[i] != b->fill)
            return false;
    return true;
}

static size_t blocks_broken(block_t *set, size_t n)
{
    size_t broken = 0;
    for (size_t i = 0; i < n; i++)
        broken += set[i].p && !block_intact(&set[i]);
    return broken;
}

static hak_stats_t stats(void)
{
    hak_stats_t s;
    hak_stats_get(&s);
    return s;
}

/* Waits for the child pid and checks that it exited 0; false, with
 * `skipped` printed, where it exited 77 (what it checks is not possible
 * here). */
static bool child_passed(pid_t pid, const char *skipped)
{
    int status = 0;
    CHECK(pid > 0 && waitpid(pid, &status, 0) == pid);
    if (skipped && WIFEXITED(status) && WEXITSTATUS(status) == 77) {
        printf("%s\n", skipped);
        return false;
    }
    if (WIFSIGNALED(status))
        printf("the child was killed by signal %d\n", WTERMSIG(status));
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    return true;
}

/* Blocks of every size in turn, each filled with its own byte. */
static void fill_all(block_t *set, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        set[i].size = sizes[i % SIZES];
        set[i].p = malloc(set[i].size);
        CHECK(set[i].p && hak_owns(set[i].p));
        block_fill(&set[i], (unsigned char)(1 + i % 251));
    }
}

/* A random 70% of the blocks freed; their pointers kept in freed. */
static size_t free_most(block_t *set, size_t n, void **freed, unsigned seed)
{
    size_t count = 0;
    for (size_t i = 0; i < n; i++)
        if (rand_r(&seed) % 10 < 7) {
            free(set[i].p);
            freed[count++] = set[i].p;
            set[i].p = NULL;
        }
    return count;
}

static void *freed[BLOCKS];
static size_t freed_count;

static void test_mesh_returns_pages(void)
{
    fill_all(blocks, BLOCKS);
    freed_count = free_most(blocks, BLOCKS, freed, 1);
    size_t before = pss_bytes();
    uint64_t ever = stats().mesh_pages_ever;
    malloc_trim(0);
    hak_stats_t s = stats();
    printf("meshed %zu pages (%llu in all); Pss %zu -> %zu KiB\n", s.mesh_pages,
           (unsigned long long)s.mesh_pages_ever, before >> 10, pss_bytes() >> 10);
    CHECK(s.mesh_pages > 1000 && s.mesh_pages_ever - ever == s.mesh_pages);
    CHECK(blocks_broken(blocks, BLOCKS) == 0);
    /* Each pair gives back a page; the memfd page both map counts once. */
    size_t after = pss_bytes();
    CHECK(after + s.mesh_pages * 4096 / 2 <= before);
}

/* A program that frees in a pattern (of every 32 blocks taken in a row,
 * the first 8 kept) leaves the same live slots on every page where the
 * blocks lie in the order taken, and no two pages mesh (0 pages with
 * the slabs carved in order); with meshing on, a carve threads its page's
 * blocks in a random order, and they do. */
#define PATTERN_BLOCKS 100000
static void test_pattern_meshes(void)
{
    static char *p[PATTERN_BLOCKS];
    for (size_t i = 0; i < PATTERN_BLOCKS; i++) {
        p[i] = malloc(64);
        CHECK(p[i] != NULL);
        memset(p[i], (int)(i % 251), 64);
    }
    for (size_t i = 0; i < PATTERN_BLOCKS; i++)
        if ((i / 8) % 4) {
            free(p[i]);
            p[i] = NULL;
        }
    uint64_t ever = stats().mesh_pages_ever;
    malloc_trim(0);
    uint64_t meshed = stats().mesh_pages_ever - ever;
    size_t broken = 0;
    for (size_t i = 0; i < PATTERN_BLOCKS; i++)
        for (size_t j = 0; p[i] && j < 64; j++)
            broken += p[i][j] != (char)(i % 251);
    printf("a pattern of frees: %llu pages meshed\n", (unsigned long long)meshed);
    CHECK(meshed > 300 && broken == 0);
    for (size_t i = 0; i < PATTERN_BLOCKS; i++)
        free(p[i]);
    malloc_trim(0);
}

/* Mid blocks (1-8 KiB, slabs of one slab page) mesh as tiny ones do: a
 * page of 1.1-3 KiB blocks holds parts of two to four, and a random 30%
 * of them live leaves pages whose live parts miss each other. */
#define MID_BLOCKS 12000
static void *free_every_other_mid(void *arg)
{
    block_t *set = arg;
    for (size_t i = 0; i < MID_BLOCKS; i += 2) {
        free(set[i].p);
        set[i].p = NULL;
    }
    return NULL;
}

static block_t mid_set[MID_BLOCKS];

static void fill_mid(block_t *set, size_t n)
{
    static const size_t mid_sizes[] = {1100, 1600, 2200, 3000};
    for (size_t i = 0; i < n; i++) {
        set[i].size = mid_sizes[i % 4];
        set[i].p = malloc(set[i].size);
        CHECK(set[i].p && hak_owns(set[i].p));
        block_fill(&set[i], (unsigned char)(3 + i % 249));
    }
}

static void test_mid_meshes(void)
{
    block_t *mid = mid_set;
    static void *mid_freed[MID_BLOCKS];
    fill_mid(mid, MID_BLOCKS);
    size_t n_freed = free_most(mid, MID_BLOCKS, mid_freed, 5);
    uint64_t ever = stats().mesh_pages_ever;
    size_t before = pss_bytes();
    malloc_trim(0);
    uint64_t meshed = stats().mesh_pages_ever - ever;
    printf("mid: meshed %llu pages; Pss %zu -> %zu KiB\n", (unsigned long long)meshed, before >> 10,
           pss_bytes() >> 10);
    CHECK(meshed > 500 && blocks_broken(mid, MID_BLOCKS) == 0);
    CHECK(pss_bytes() + meshed * 4096 / 2 <= before);
    int saved = dup(2), null = open("/dev/null", O_WRONLY);
    dup2(null, 2); /* each a report (HAKMEM_ON_ERROR=warn), none on a list */
    for (size_t i = 0; i < n_freed; i++)
        free(mid_freed[i]);
    dup2(saved, 2);
    close(saved);
    close(null);
    for (size_t i = 0; i < MID_BLOCKS; i++) /* the holes refilled: no live block handed out again */
        if (!mid[i].p) {
            mid[i].p = malloc(mid[i].size);
            block_fill(&mid[i], 0xa5);
        }
    CHECK(blocks_broken(mid, MID_BLOCKS) == 0);
    fflush(stdout);
    pid_t pid = fork(); /* the child reads them as they were, its writes its own */
    if (pid == 0) {
        size_t broken = blocks_broken(mid, MID_BLOCKS);
        for (size_t i = 0; i < MID_BLOCKS; i++)
            block_fill(&mid[i], 0x3c);
        _exit(broken == 0 && blocks_broken(mid, MID_BLOCKS) == 0 ? 0 : 1);
    }
    child_passed(pid, NULL);
    CHECK(blocks_broken(mid, MID_BLOCKS) == 0);
    pthread_t t; /* half of them freed by another thread, onto the meshed slabs' remote lists */
    CHECK(pthread_create(&t, NULL, free_every_other_mid, mid) == 0 && pthread_join(t, NULL) == 0);
    CHECK(blocks_broken(mid, MID_BLOCKS) == 0);
    for (size_t i = 0; i < MID_BLOCKS; i++)
        free(mid[i].p);
    malloc_trim(0);
    CHECK(stats().mesh_pages == 0);
}

/* Every block freed before the mesh is freed again: each one a report
 * (HAKMEM_ON_ERROR=warn), and none reaches a list, which would hand a
 * meshed partner's live slot out again and the fill below overwrite it. */
static void test_double_frees_refused(void)
{
    char path[] = "/tmp/hakmem-test-mesh-XXXXXX";
    int fd = mkstemp(path), saved = dup(2);
    CHECK(fd >= 0 && saved >= 0);
    unlink(path);
    dup2(fd, 2);
    for (size_t i = 0; i < freed_count; i++)
        free(freed[i]);
    dup2(saved, 2);
    close(saved);
    char text[4096];
    size_t lines = 0;
    ssize_t n;
    lseek(fd, 0, SEEK_SET);
    while ((n = read(fd, text, sizeof text)) > 0)
        for (ssize_t i = 0; i < n; i++)
            lines += text[i] == '\n';
    close(fd);
    printf("%zu double frees, %zu reports\n", freed_count, lines);
    CHECK(lines == freed_count);
    static block_t extra[BLOCKS];
    fill_all(extra, BLOCKS);
    CHECK(blocks_broken(blocks, BLOCKS) == 0 && blocks_broken(extra, BLOCKS) == 0);
    for (size_t i = 0; i < BLOCKS; i++)
        free(extra[i].p);
}

/* A child sees the blocks as they were at the fork and writes its own;
 * the parent's stay as they were. */
static void test_fork(void)
{
    pid_t pid = fork();
    if (pid == 0) {
        size_t broken = blocks_broken(blocks, BLOCKS);
        for (size_t i = 0; i < BLOCKS; i++)
            if (blocks[i].p)
                block_fill(&blocks[i], 0x5a);
        _exit(broken == 0 && blocks_broken(blocks, BLOCKS) == 0 ? 0 : 1);
    }
    child_passed(pid, NULL);
    CHECK(blocks_broken(blocks, BLOCKS) == 0);
}

static void test_refill(void)
{
    for (size_t i = 0; i < BLOCKS; i++)
        if (!blocks[i].p) {
            blocks[i].p = malloc(blocks[i].size);
            CHECK(blocks[i].p != NULL);
            block_fill(&blocks[i], (unsigned char)(7 + i % 241));
        }
    CHECK(blocks_broken(blocks, BLOCKS) == 0);
}

static void test_all_freed_unmeshes(void)
{
    for (size_t i = 0; i < BLOCKS; i++)
        free(blocks[i].p);
    malloc_trim(0);
    CHECK(stats().mesh_pages == 0);
}

/* ---- threads writing while their pages are meshed -------------------------- */

#define WRITERS 2
#define WRITER_BLOCKS 6000
static block_t writer_blocks[WRITERS][WRITER_BLOCKS];
static atomic_bool writers_stop;
static atomic_size_t writer_errors;

/* Each round writes a new byte over every block and checks them all; the
 * blocks go back (to the main thread's slabs: remote frees) at the end. */
static void *writer(void *arg)
{
    block_t *set = arg;
    for (unsigned round = 1; !atomic_load(&writers_stop) || round < 20; round++) {
        for (size_t i = 0; i < WRITER_BLOCKS; i++)
            block_fill(&set[i], (unsigned char)round);
        atomic_fetch_add(&writer_errors, blocks_broken(set, WRITER_BLOCKS));
    }
    for (size_t i = 0; i < WRITER_BLOCKS; i++)
        free(set[i].p);
    return NULL;
}

static void test_threads_write_while_meshed(void)
{
    /* The main thread's blocks, a third of them the writers': the
     * writers' blocks lie in the main thread's slabs among the others. */
    static block_t own[BLOCKS];
    static void *own_freed[BLOCKS];
    size_t counts[WRITERS] = {0}, n = 0;
    for (size_t i = 0; i < BLOCKS; i++) {
        block_t b = {malloc(sizes[i % SIZES]), sizes[i % SIZES], 0};
        CHECK(b.p != NULL);
        size_t w = (i / 3) % WRITERS;
        if (i % 3 == 0 && counts[w] < WRITER_BLOCKS)
            writer_blocks[w][counts[w]++] = b;
        else
            own[n++] = b;
    }
    for (size_t i = 0; i < n; i++)
        block_fill(&own[i], (unsigned char)(3 + i % 200));
    free_most(own, n, own_freed, 2);
    uint64_t ever = stats().mesh_pages_ever;
    pthread_t t[WRITERS];
    for (int w = 0; w < WRITERS; w++) {
        for (size_t i = 0; i < counts[w]; i++)
            block_fill(&writer_blocks[w][i], 1);
        CHECK(counts[w] == WRITER_BLOCKS);
        pthread_create(&t[w], NULL, writer, writer_blocks[w]);
    }
    for (int i = 0; i < 20; i++) {
        malloc_trim(0);
        usleep(2000);
    }
    atomic_store(&writers_stop, true);
    for (int w = 0; w < WRITERS; w++)
        pthread_join(t[w], NULL);
    malloc_trim(0);
    printf("threads: %llu pages meshed while the writers ran\n",
           (unsigned long long)(stats().mesh_pages_ever - ever));
    CHECK(stats().mesh_pages_ever - ever > 100);
    CHECK(atomic_load(&writer_errors) == 0);
    CHECK(blocks_broken(own, n) == 0);
    for (size_t i = 0; i < n; i++)
        free(own[i].p);
    malloc_trim(0);
    CHECK(stats().mesh_pages == 0);
}

/* A thread's exit meshes paced (mesh.c): nothing where it would give
 * back fewer than 16 pages, what it can where it would give back many.
 * The exits are the threads' own: each sleeps past the purge delay, so
 * that taking over an orphan at its first malloc does not make its exit
 * a recycled one, which collects nothing. */
enum { EXIT_SLABS = 16, EXIT_PER_SLAB = 64, EXIT_VACANT = 2 };
static void *dense[EXIT_SLABS * EXIT_PER_SLAB];

/* Blocks of 1 KiB, four a 4 KiB page: the first two of every page freed,
 * so that every page of every slab keeps the same slots live and no two
 * pages mesh, and the first page of EXIT_VACANT slabs freed whole: two
 * pages to give back, too few for a paced pass. */
static void *dense_thread(void *arg)
{
    uintptr_t vacant_slabs[EXIT_VACANT] = {0};
    unsigned seen = 0;
    for (size_t i = 0; i < sizeof dense / sizeof *dense; i++) {
        dense[i] = malloc(1024);
        CHECK(dense[i] && hak_owns(dense[i]));
        memset(dense[i], 0x5a, 1024);
        uintptr_t slab = (uintptr_t)dense[i] >> 16;
        if (seen < EXIT_VACANT && (!seen || vacant_slabs[seen - 1] != slab))
            vacant_slabs[seen++] = slab;
    }
    for (size_t i = 0; i < sizeof dense / sizeof *dense; i++) {
        uintptr_t a = (uintptr_t)dense[i];
        bool vacant = ((a >> 12) & 15) == 0 && (a >> 16 == vacant_slabs[0] || a >> 16 == vacant_slabs[1]);
        if (((a >> 10) & 3) < 2 || vacant) {
            free(dense[i]);
            dense[i] = NULL;
        }
    }
    usleep(300000);
    return arg;
}

static void *sparse_thread(void *arg)
{
    block_t *set = arg;
    fill_all(set, BLOCKS);
    free_most(set, BLOCKS, freed, 3);
    usleep(300000);
    return NULL;
}

static void test_thread_exit_paced(void)
{
    malloc_trim(0); /* no orphan left for the threads to take over */
    uint64_t ever = stats().mesh_pages_ever;
    pthread_t t;
    pthread_create(&t, NULL, dense_thread, NULL);
    pthread_join(t, NULL);
    uint64_t at_exit = stats().mesh_pages_ever - ever;
    malloc_trim(0); /* takes the orphan over and meshes it whole */
    uint64_t at_trim = stats().mesh_pages_ever - ever - at_exit;
    printf("thread exit, dense slabs: %llu pages meshed at the exit, %llu at the trim after\n",
           (unsigned long long)at_exit, (unsigned long long)at_trim);
    CHECK(at_exit == 0);
    CHECK(at_trim >= EXIT_VACANT);
    for (size_t i = 0; i < sizeof dense / sizeof *dense; i++)
        if (dense[i]) {
            CHECK(((unsigned char *)dense[i])[0] == 0x5a && ((unsigned char *)dense[i])[1023] == 0x5a);
            free(dense[i]);
        }

    ever = stats().mesh_pages_ever;
    pthread_create(&t, NULL, sparse_thread, blocks);
    pthread_join(t, NULL);
    at_exit = stats().mesh_pages_ever - ever;
    printf("thread exit, 70%% of the blocks freed: %llu pages meshed at the exit\n", (unsigned long long)at_exit);
    /* Timed (5 ms): 200 pages or so on an idle machine, 6 once under a
     * parallel ctest. */
    CHECK(at_exit > 0);
    CHECK(blocks_broken(blocks, BLOCKS) == 0);
    for (size_t i = 0; i < BLOCKS; i++)
        free(blocks[i].p);
    malloc_trim(0);
    CHECK(stats().mesh_pages == 0);
}

/* A thread that frees most of its blocks and then waits, as a server
 * between requests, gets their pages meshed by the purger while it waits
 * on a condition variable, without a call of its own. Tiny blocks: its
 * next refill (a size it had not asked for) past the 100 ms since its
 * last look loosens its sparse slabs for the purger; the refill's own
 * pass (it takes a new slab) meshes for 5 ms at most, and is not counted.
 * Mid blocks: the purger meshes their slabs where it flushes the
 * thread's mid caches, a purge delay after the frees (counted from the
 * start: that may come before the thread says it waits, and no pass of
 * the thread's own meshes mid slabs). Awake, the thread frees half its
 * blocks itself and fills the holes, every block intact after. */
static pthread_mutex_t sleeper_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t sleeper_cond = PTHREAD_COND_INITIALIZER;
static int sleeper_state; /* 1: freed and waiting; 2: told to go on */

typedef struct sleeper {
    block_t *set;
    size_t n;
    void (*fill)(block_t *set, size_t n);
    bool count_from_start;
} sleeper_t;

static void *sleeper_thread(void *arg)
{
    const sleeper_t *sl = arg;
    sl->fill(sl->set, sl->n);
    free_most(sl->set, sl->n, freed, 5);
    usleep(150000);
    void *other = malloc(32);
    CHECK(other && hak_owns(other));
    pthread_mutex_lock(&sleeper_lock);
    sleeper_state = 1;
    pthread_cond_broadcast(&sleeper_cond);
    while (sleeper_state != 2)
        pthread_cond_wait(&sleeper_cond, &sleeper_lock);
    pthread_mutex_unlock(&sleeper_lock);
    free(other);
    /* Awake again: its own frees of blocks on loose and meshed slabs,
     * then mallocs that take those slabs back as current ones. */
    for (size_t i = 0; i < sl->n; i += 2) {
        free(sl->set[i].p);
        sl->set[i].p = NULL;
    }
    for (size_t i = 0; i < sl->n; i++)
        if (!sl->set[i].p) {
            sl->set[i].p = malloc(sl->set[i].size);
            CHECK(sl->set[i].p != NULL);
            block_fill(&sl->set[i], (unsigned char)(11 + i % 239));
        }
    return NULL;
}

static void test_purger_meshes_sleeper(const char *what, sleeper_t sl, uint64_t at_least)
{
    const char *thread = getenv("HAKMEM_PURGE_THREAD");
    if (thread && !strcmp(thread, "0")) {
        printf("a sleeping thread's %s: not checked without the purger thread (HAKMEM_PURGE_THREAD=0)\n", what);
        return;
    }
    pthread_t t;
    sleeper_state = 0;
    uint64_t ever = stats().mesh_pages_ever, meshed = 0;
    pthread_create(&t, NULL, sleeper_thread, &sl);
    pthread_mutex_lock(&sleeper_lock);
    while (sleeper_state != 1)
        pthread_cond_wait(&sleeper_cond, &sleeper_lock);
    pthread_mutex_unlock(&sleeper_lock);
    if (!sl.count_from_start)
        ever = stats().mesh_pages_ever;
    for (int waited = 0; waited < 5000 && meshed < at_least; waited += 10) {
        usleep(10000);
        meshed = stats().mesh_pages_ever - ever;
    }
    printf("a sleeping thread's %s: %llu pages meshed by the purger\n", what, (unsigned long long)meshed);
    CHECK(meshed >= at_least);
    CHECK(blocks_broken(sl.set, sl.n) == 0);
    pthread_mutex_lock(&sleeper_lock);
    sleeper_state = 2;
    pthread_cond_broadcast(&sleeper_cond);
    pthread_mutex_unlock(&sleeper_lock);
    pthread_join(t, NULL);
    CHECK(blocks_broken(sl.set, sl.n) == 0);
    for (size_t i = 0; i < sl.n; i++)
        free(sl.set[i].p);
    malloc_trim(0);
    CHECK(stats().mesh_pages == 0);
}

/* Slabs on transparent huge pages, where the system gives them (a heap's
 * SuperSlabs after its first four, with THP `enabled` at `always`): here
 * the test asks for them itself (MADV_COLLAPSE, Linux 6.1, whatever the
 * system's setting). A meshed page splits its huge page, and every block
 * on the rest of it keeps its bytes. */
#ifndef MADV_COLLAPSE
#define MADV_COLLAPSE 25
#endif
static void test_huge_pages(void)
{
    fill_all(blocks, BLOCKS);
    static uintptr_t chunks[256];
    size_t n_chunks = 0, collapsed = 0;
    for (size_t i = 0; i < BLOCKS; i++) {
        uintptr_t chunk = (uintptr_t)blocks[i].p & ~(uintptr_t)((2 << 20) - 1);
        size_t k = 0;
        while (k < n_chunks && chunks[k] != chunk)
            k++;
        if (k < n_chunks || n_chunks == 256)
            continue;
        chunks[n_chunks++] = chunk;
        collapsed += madvise((void *)chunk, 2 << 20, MADV_COLLAPSE) == 0;
    }
    size_t huge = proc_kib_field_bytes("/proc/self/smaps_rollup", "AnonHugePages: %zu kB");
    if (!collapsed || !huge) {
        printf("huge pages: not checked (MADV_COLLAPSE refused: %s)\n", strerror(errno));
    } else {
        CHECK(blocks_broken(blocks, BLOCKS) == 0);
        free_most(blocks, BLOCKS, freed, 7);
        uint64_t ever = stats().mesh_pages_ever;
        malloc_trim(0);
        uint64_t meshed = stats().mesh_pages_ever - ever;
        size_t huge_after = proc_kib_field_bytes("/proc/self/smaps_rollup", "AnonHugePages: %zu kB");
        printf("huge pages: %zu of %zu slab chunks made huge pages (%zu KiB); %llu pages meshed at the trim, "
               "%zu KiB on huge pages after\n",
               collapsed, n_chunks, huge >> 10, (unsigned long long)meshed, huge_after >> 10);
        CHECK(meshed > 1000 && huge_after < huge);
        CHECK(blocks_broken(blocks, BLOCKS) == 0);
        for (size_t i = 0; i < BLOCKS; i++) /* the holes refilled, every block rewritten */
            if (!blocks[i].p)
                blocks[i].p = malloc(blocks[i].size);
        for (size_t i = 0; i < BLOCKS; i++)
            block_fill(&blocks[i], (unsigned char)(7 + i % 241));
        CHECK(blocks_broken(blocks, BLOCKS) == 0);
    }
    for (size_t i = 0; i < BLOCKS; i++) {
        free(blocks[i].p);
        blocks[i].p = NULL;
    }
    malloc_trim(0);
    CHECK(stats().mesh_pages == 0);
}

/* A process that locked its memory (mlockall, current and future)
 * meshes as any other: the memfd page mapped over a locked page is
 * locked in turn, and the anonymous pages it replaces go with their
 * mapping. In a child, whose lock leaves the other tests alone; not
 * where the child could lock less than its 60 MiB (RLIMIT_MEMLOCK, which
 * CAP_IPC_LOCK lifts) or the lock is refused. */
static bool may_lock_much(void)
{
    struct rlimit lim = {RLIM_INFINITY, RLIM_INFINITY};
    if (setrlimit(RLIMIT_MEMLOCK, &lim) == 0 ||
        (getrlimit(RLIMIT_MEMLOCK, &lim) == 0 && (lim.rlim_cur == RLIM_INFINITY || lim.rlim_cur >= ((rlim_t)256 << 20))))
        return true;
    char line[256];
    unsigned long long caps = 0;
    FILE *f = fopen("/proc/self/status", "r");
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "CapEff:", 7))
            caps = strtoull(line + 7, NULL, 16);
    if (f)
        fclose(f);
    return caps >> 14 & 1; /* CAP_IPC_LOCK */
}

static void test_mlocked(void)
{
    fflush(stdout); /* the child flushes its own lines, not the parent's again */
    pid_t pid = fork();
    if (pid == 0) {
        if (!may_lock_much() || mlockall(MCL_CURRENT | MCL_FUTURE) != 0)
            _exit(77);
        fill_all(blocks, BLOCKS);
        free_most(blocks, BLOCKS, freed, 7);
        uint64_t ever = stats().mesh_pages_ever;
        malloc_trim(0);
        uint64_t meshed = stats().mesh_pages_ever - ever;
        bool ok = meshed > 1000 && blocks_broken(blocks, BLOCKS) == 0;
        printf("mlockall: %llu pages meshed, the live blocks %s\n", (unsigned long long)meshed,
               blocks_broken(blocks, BLOCKS) ? "broken" : "intact");
        for (size_t i = 0; i < BLOCKS; i++)
            free(blocks[i].p);
        malloc_trim(0);
        fflush(stdout);
        _exit(ok && stats().mesh_pages == 0 ? 0 : 1);
    }
    child_passed(pid, "mlockall: not checked (RLIMIT_MEMLOCK below 256 MiB, or the lock refused)");
}

/* ---- the default (auto) ---------------------------------------------------- */

/* The descriptor of meshing's memfd, by its name; -1 if none is open. */
static int mesh_memfd(void)
{
    int found = -1;
    DIR *d = opendir("/proc/self/fd");
    for (struct dirent *e; d && (e = readdir(d));) {
        char path[64], target[256];
        snprintf(path, sizeof path, "/proc/self/fd/%s", e->d_name);
        ssize_t n = readlink(path, target, sizeof target - 1);
        if (n > 0 && (target[n] = 0, strstr(target, "memfd:hakmem-mesh")))
            found = atoi(e->d_name);
    }
    if (d)
        closedir(d);
    return found;
}

/* Whether this process may open a userfaultfd for every fault, as
 * meshing's default wants. */
static bool full_userfaultfd(void)
{
    int fd = (int)syscall(SYS_userfaultfd, O_CLOEXEC);
    if (fd >= 0)
        close(fd);
    return fd >= 0;
}

/* A round: fill, free a random 70%, malloc_trim; the pages meshed. */
static uint64_t round_meshed(unsigned seed)
{
    fill_all(blocks, BLOCKS);
    free_most(blocks, BLOCKS, freed, seed);
    uint64_t ever = stats().mesh_pages_ever;
    malloc_trim(0);
    return stats().mesh_pages_ever - ever;
}

static void free_all(void)
{
    for (size_t i = 0; i < BLOCKS; i++) {
        free(blocks[i].p);
        blocks[i].p = NULL;
    }
}

/* The test's first check: the C library's start and the test's own
 * allocations so far freed nothing much, so no file is open yet. */
static void test_auto_starts_at_need(bool full)
{
    CHECK(mesh_memfd() < 0);
    uint64_t meshed = round_meshed(11);
    printf("auto, %s userfaultfd: %llu pages meshed, memfd at descriptor %d\n", full ? "a full" : "no full",
           (unsigned long long)meshed, mesh_memfd());
    CHECK(blocks_broken(blocks, BLOCKS) == 0);
    if (full) {
        CHECK(meshed > 1000 && stats().meshing);
        CHECK(mesh_memfd() >= 100 || mesh_memfd() >= getdtablesize() / 2);
    } else {
        CHECK(meshed == 0 && !stats().meshing && mesh_memfd() < 0);
    }
    free_all();
    malloc_trim(0);
    CHECK(stats().mesh_pages == 0);
}

/* Without CAP_SYS_PTRACE (and vm.unprivileged_userfaultfd=0), only a
 * user-mode userfaultfd is granted: a child of a process that meshed
 * opens its own files at its first pass, and the default turns off. */
static void test_auto_refuses_user_mode(void)
{
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        struct __user_cap_header_struct head = {_LINUX_CAPABILITY_VERSION_3, 0};
        struct __user_cap_data_struct caps[2];
        if (syscall(SYS_capget, &head, caps) != 0)
            _exit(77);
        caps[0].effective &= ~(1u << CAP_SYS_PTRACE);
        caps[0].permitted &= ~(1u << CAP_SYS_PTRACE);
        if (syscall(SYS_capset, &head, caps) != 0 || full_userfaultfd())
            _exit(77); /* vm.unprivileged_userfaultfd=1: every process gets the full one */
        uint64_t meshed = round_meshed(13);
        bool ok = meshed == 0 && !stats().meshing && blocks_broken(blocks, BLOCKS) == 0;
        printf("auto, the child without CAP_SYS_PTRACE: %llu pages meshed, meshing %s\n",
               (unsigned long long)meshed, stats().meshing ? "on" : "off");
        free_all();
        fflush(stdout);
        _exit(ok ? 0 : 1);
    }
    child_passed(pid, "auto without a full userfaultfd: not checked (every process gets one here)");
}

/* Under a seccomp filter that kills for memfd_create, userfaultfd, ioctl,
 * pwrite or fallocate (as a sandbox's may), the default meshes nothing
 * and the process lives: in a child filtered before meshing's first
 * need, and in one filtered once it had meshed pages, whose frees then
 * dissolve the meshed slabs without punching the memfd. */
static void test_auto_under_seccomp(void)
{
    for (int meshed_first = 0; meshed_first < 2; meshed_first++) {
        fflush(stdout);
        pid_t pid = fork();
        if (pid == 0) {
            uint64_t before = meshed_first ? round_meshed(23) : 0;
            if (!install_filter(false))
                _exit(77);
            free_all(); /* meshed slabs dissolve here */
            malloc_trim(0);
            uint64_t meshed = round_meshed(29);
            bool ok = (!meshed_first || before > 1000) && meshed == 0 && blocks_broken(blocks, BLOCKS) == 0;
            if (!meshed_first) { /* never started here: the report says why */
                static char text[16384];
                FILE *report = fmemopen(text, sizeof text - 1, "w");
                if (report) {
                    hak_stats_print(report);
                    fclose(report);
                }
                bool said = strstr(text, "not started (this thread runs under a seccomp filter") != NULL;
                if (!said)
                    printf("auto under a seccomp filter: the report does not say why meshing did not start\n");
                ok = ok && said;
            }
            free_all();
            malloc_trim(0);
            printf("auto under a seccomp filter (%s): %llu pages meshed before it, %llu under it\n",
                   meshed_first ? "after meshing" : "from the start", (unsigned long long)before,
                   (unsigned long long)meshed);
            fflush(stdout);
            _exit(ok ? 0 : 1);
        }
        if (!child_passed(pid, "auto under a seccomp filter: the kernel refuses a filter here, not checked"))
            return;
    }
}

/* The program closes meshing's memfd and opens a file of its own at its
 * number (as a daemon closing every descriptor might): freeing meshed
 * slabs punches no hole into that file, and the next pass stops meshing
 * instead of mapping the file into slabs. */
static void test_auto_files_closed(void)
{
    CHECK(round_meshed(17) > 1000);
    int fd = mesh_memfd();
    char path[] = "/tmp/hakmem-mesh-XXXXXX";
    int file = mkstemp(path);
    CHECK(fd >= 0 && file >= 0);
    unlink(path);
    static char pattern[64 << 10], back[64 << 10];
    memset(pattern, 0x5a, sizeof pattern);
    CHECK(write(file, pattern, sizeof pattern) == (ssize_t)sizeof pattern);
    CHECK(dup2(file, fd) == fd); /* meshing's file closed, the program's at its number */
    close(file);
    free_all();
    malloc_trim(0); /* every meshed slab dissolved: its memfd pages would be punched */
    uint64_t meshed = round_meshed(19);
    CHECK(meshed == 0 && !stats().meshing && blocks_broken(blocks, BLOCKS) == 0);
    bool intact = pread(fd, back, sizeof back, 0) == (ssize_t)sizeof back && !memcmp(back, pattern, sizeof back) &&
                  lseek(fd, 0, SEEK_END) == (off_t)sizeof pattern;
    CHECK(intact);
    printf("auto, its memfd closed under it: %llu pages meshed after, the program's file %s\n",
           (unsigned long long)meshed, intact ? "intact" : "changed");
    free_all();
    close(fd);
}

static int test_auto(void)
{
    if (getenv("HAKMEM_MESH")) {
        printf("test_mesh auto checks the default: run it with HAKMEM_MESH unset\n");
        return 1;
    }
    bool full = full_userfaultfd();
    test_auto_starts_at_need(full);
    if (!stats().meshing) {
        printf("meshing is off here (HAKMEM_STATS=1 says why): the rest not checked\n");
        return check_summary("mesh auto");
    }
    test_auto_refuses_user_mode();
    test_auto_under_seccomp();
    test_auto_files_closed();
    return check_summary("mesh auto");
}

int main(int argc, char **argv)
{
    if (argc > 1 && !strcmp(argv[1], "auto"))
        return test_auto();
    hak_stats_t s = stats();
    if (!s.meshing) {
        printf("meshing is off here (HAKMEM_MESH unset, or the system refuses it: HAKMEM_STATS=1 says why)\n");
        return 77;
    }
    test_pattern_meshes();
    test_mid_meshes();
    test_mesh_returns_pages();
    test_double_frees_refused();
    test_fork();
    test_refill();
    test_all_freed_unmeshes();
    test_threads_write_while_meshed();
    test_thread_exit_paced();
    test_purger_meshes_sleeper("tiny blocks", (sleeper_t){blocks, BLOCKS, fill_all, false}, 16);
    test_purger_meshes_sleeper("mid blocks", (sleeper_t){mid_set, MID_BLOCKS, fill_mid, true}, 500);
    test_huge_pages();
    test_mlocked();
    return check_summary("mesh");
}
