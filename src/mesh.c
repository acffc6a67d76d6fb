/* Meshing (mesh.h): compaction without moving a pointer.
 *
 * Two slabs X and Y of one class of one slab page (tiny, or mid up to 8
 * KiB) have their blocks at the same offsets. Where, on the 4 KiB page at
 * offset k of both, no block live in X overlaps one live in Y, the two
 * pages can be one physical page: the live bytes of both are copied into
 * a page of a memfd, which is then mapped over both virtual pages
 * (MAP_SHARED | MAP_FIXED); the two anonymous pages go. Pointers never
 * change.
 *
 * Each block slot overlapping a meshed page is then used through one of
 * the two slabs at most; the other reserves it. A reserved slot counts as
 * used in its slab (so the slab never looks empty while it has one) and
 * is on no list. At the mesh, X keeps its live slots and its free ones
 * (Y reserves them), Y keeps its live ones (X reserves them), and a slot
 * free in Y and reserved in X stays Y's. A meshed slab carries
 * SLAB_MESHED in its owner word: every free of its blocks takes the
 * irregular path, which refuses a reserved slot as a double free and
 * dissolves the slab once it holds no live block of its own. Dissolving
 * maps anonymous memory over its meshed pages and gives each partner back
 * the slots it reserved there (those no other meshed page of the partner
 * still reserves). A page whose partner went stays the memfd's until its
 * own slab dissolves; the memfd page is punched out then.
 *
 * Writes during the copy: both pages are write-protected with a
 * userfaultfd first (scripts/mesh_probe.c measured what it gives); a
 * thread storing into either waits in the kernel until the pages are
 * remapped and woken, and its store lands in the meshed page. Readers
 * read either copy, which hold the same bytes.
 *
 * A page of a slab with no live block at all goes back on its own
 * (vacant): its slots are reserved and the page purged, until a refill of
 * the class that would take a new slab takes them back (mesh_unvacate).
 *
 * Fork: a child must not share the parent's meshed pages. The prepare
 * handler, which runs after every other (its locks held), write-protects
 * every view of the memfd and copies them aside; the child maps private
 * pages over its views and fills them from the copies (its pages are
 * unmeshed, not shared, the slot bookkeeping unchanged); the parent lifts
 * the protection, which wakes its waiting writers.
 *
 * Everything here runs under mesh_lock, by the owner of the slabs (at a
 * collect, or a refill: heap.c decides when) or the thread that took an
 * orphan's; by the purger, under its claim of a live heap, on slabs
 * their owner loosened (heap.c: its frees into them take the remote
 * list, and a pass among loose slabs changes no other slab); or, to
 * dissolve a slab an orphan's drain emptied, by the purger under the
 * drain lock, which fork's prepare takes before this one. */
#define _GNU_SOURCE
#include "mesh.h"
#include "os.h"

#include <linux/userfaultfd.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#ifndef UFFD_FEATURE_WP_HUGETLBFS_SHMEM
#define UFFD_FEATURE_WP_HUGETLBFS_SHMEM (1 << 12)
#endif
#ifndef UFFD_FEATURE_WP_UNPOPULATED
#define UFFD_FEATURE_WP_UNPOPULATED (1 << 13)
#endif

/* The memfd is sized once, sparse: pages are handed out from its start. */
#define MESH_FILE_PAGES ((uint32_t)1 << 24) /* 64 GiB */
/* Partners a page tries before it gives up (a pass is n times this at
 * most a page offset). */
#define MESH_PROBES 64

typedef struct mesh_page {
    slab_t *partner;    /* the slab whose page at this offset shares the physical page; NULL: none now */
    uint32_t file_page; /* the memfd page mapped here, plus one; 0: an anonymous page */
    bool vacant;        /* held no live block: purged, its slots reserved until a refill wants them */
} mesh_page_t;

typedef struct mesh_rec {
    struct mesh_rec *next, *prev; /* every record (mesh_lock); next: the free list */
    slab_t *slab;
    uint32_t reserved_count;
    uint64_t reserved[MESH_MAX_SLOTS / 64]; /* read by other threads' frees (atomic accesses) */
    mesh_page_t page[MESH_PAGES];
} mesh_rec_t;

/* A slab in a pass: its free slots (on its local list). */
typedef struct mesh_scan {
    slab_t *s;
    bool changed;
    uint64_t free[MESH_MAX_SLOTS / 64];
} mesh_scan_t;

static pthread_mutex_t mesh_lock = PTHREAD_MUTEX_INITIALIZER;
static bool mesh_on;               /* read without the lock (atomic accesses) */
static const char *off_reason;
static int memfd = -1, uffd = -1;
static os_file_id_t memfd_id, uffd_id;
static bool uffd_full;             /* not limited to faults in user mode */
static mesh_rec_t *recs, *free_recs;
static uint32_t file_pages_used;   /* bump pointer into the memfd */
static uint32_t *free_file_pages;  /* a stack of punched pages */
static size_t free_file_count;
static size_t pairs_now, max_pairs;
static _Atomic size_t stat_pages_now, vacant_pages;
static _Atomic uint64_t stat_pages_ever;
static mesh_scan_t *scans;         /* MESH_PASS_SLABS of them, mapped once */
static char page_buf[MESH_PAGE];

static void *fork_copies;          /* the views' bytes across a fork */
static bool fork_protected;        /* their writers held off meanwhile */
static size_t fork_views;

/* ---- bits ------------------------------------------------------------------ */

static inline bool bit_get(const uint64_t *m, uint32_t i) { return __atomic_load_n(&m[i >> 6], __ATOMIC_RELAXED) >> (i & 63) & 1; }

/* With release: a free that reads the bit with acquire (mesh_slot_reserved)
 * sees the record's slab as it was set before. */
static inline void bit_put(uint64_t *m, uint32_t i, bool on)
{
    uint64_t w = __atomic_load_n(&m[i >> 6], __ATOMIC_RELAXED), b = (uint64_t)1 << (i & 63);
    __atomic_store_n(&m[i >> 6], on ? w | b : w & ~b, __ATOMIC_RELEASE);
}

/* The slots of s that overlap its page k: [*lo, *hi). */
static void page_slots(const slab_t *s, unsigned k, uint32_t *lo, uint32_t *hi)
{
    uint32_t bs = s->block_size;
    uint32_t first = (uint32_t)(k * MESH_PAGE / bs), end = (uint32_t)(((k + 1) * MESH_PAGE + bs - 1) / bs);
    *lo = first < s->capacity ? first : s->capacity;
    *hi = end < s->capacity ? end : s->capacity;
}

static char *slot_at(const slab_t *s, uint32_t i) { return s->start + (size_t)i * s->block_size; }

static bool reserved(const mesh_rec_t *r, uint32_t i) { return r && bit_get(r->reserved, i); }

static void set_owner_flag(slab_t *s, bool on)
{
    if (on)
        slab_flags_set(s, SLAB_MESHED);
    else
        slab_flags_clear(s, SLAB_MESHED);
}

/* ---- the kernel's side ------------------------------------------------------- */

/* Whether the calling thread may make meshing's system calls (memfd_create,
 * userfaultfd and its ioctls, pwrite, fallocate): not under a seccomp
 * filter, which may kill the process for any of them (OpenSSH's sandbox
 * would, and a default that meshes must not end a login). Asked at each
 * pass with slabs to mesh and each dissolve, not kept: the thread may
 * install a filter between two (a read of /proc, 14 us). */
static bool thread_may_mesh(void) { return !os_thread_filtered(); }

/* fd moved out of the way of the program's numbers (os_dup_aside), or
 * left where it is if it cannot be. */
static int fd_aside(int fd)
{
    int aside = fd >= 0 ? os_dup_aside(fd) : -1;
    if (aside < 0)
        return fd;
    os_close(fd);
    return aside;
}

/* The memfd and the userfaultfd; false with off_reason set. By default
 * (auto) only a full userfaultfd will do: with one limited to user-mode
 * faults, a system call writing into a block while its page is meshed
 * fails with EFAULT, which the program would see. */
static bool mesh_open(void)
{
    memfd = fd_aside(os_memfd("hakmem-mesh", (uint64_t)MESH_FILE_PAGES * MESH_PAGE));
    if (memfd < 0 || !os_file_id(memfd, &memfd_id)) {
        off_reason = "no memfd (memfd_create or ftruncate refused)";
        return false;
    }
    uint64_t needed = UFFD_FEATURE_PAGEFAULT_FLAG_WP | UFFD_FEATURE_WP_HUGETLBFS_SHMEM, supported = 0;
    bool user_mode_only = false;
    int probe = os_userfaultfd(false, 0, &supported);
    if (probe < 0 && hak_config.mesh == MESH_AUTO) {
        off_reason = "only a userfaultfd for user-mode faults is granted (a system call writing into a block "
                     "being meshed would fail with EFAULT; HAKMEM_MESH=on meshes all the same)";
        return false;
    }
    if (probe < 0) {
        user_mode_only = true;
        probe = os_userfaultfd(true, 0, &supported);
    }
    if (probe < 0) {
        off_reason = "no userfaultfd (the system refuses it)";
        return false;
    }
    os_close(probe);
    if ((supported & needed) != needed) {
        off_reason = "the kernel's userfaultfd has no write protection for shared memory";
        return false;
    }
    uffd = fd_aside(os_userfaultfd(user_mode_only, needed | (supported & UFFD_FEATURE_WP_UNPOPULATED), NULL));
    if (uffd < 0 || !os_file_id(uffd, &uffd_id)) {
        off_reason = "no userfaultfd (the system refuses it)";
        return false;
    }
    uffd_full = !user_mode_only;
    return true;
}

/* Whether memfd and uffd still name meshing's files. They are the
 * process's descriptors, which a program may close without knowing them
 * (a daemon's start closing every descriptor, closefrom) and open its own
 * files under: a mapping or a punched hole through such a number would
 * reach the program's file. */
static bool files_ours(void) { return os_file_is(memfd, &memfd_id) && os_file_is(uffd, &uffd_id); }

static void mesh_close(void)
{
    if (memfd >= 0 && os_file_is(memfd, &memfd_id))
        os_close(memfd);
    if (uffd >= 0 && os_file_is(uffd, &uffd_id))
        os_close(uffd);
    memfd = uffd = -1;
}

/* ThreadSanitizer sees a page's copy and remap race with the program's
 * accesses to its live blocks, which the write protection orders out of
 * its sight (a writer waits in the kernel): it does not look at them.
 * With these, HAKMEM_MESH=stress runs the thread tests under it. */
#if defined(__SANITIZE_THREAD__)
void __tsan_ignore_thread_begin(void);
void __tsan_ignore_thread_end(void);
#define UNSEEN_BEGIN() __tsan_ignore_thread_begin()
#define UNSEEN_END() __tsan_ignore_thread_end()
#else
#define UNSEEN_BEGIN() ((void)0)
#define UNSEEN_END() ((void)0)
#endif

/* Writes into the page at v wait from now on. */
static bool page_protect(char *v) { return os_uffd_write_protect(uffd, v, MESH_PAGE); }

/* The protection lifted, the waiting writers woken (their page unchanged). */
static void page_unprotect(char *v) { os_uffd_write_unprotect(uffd, v, MESH_PAGE); }

/* The writers waiting on v go on, into whatever is mapped there now. */
static void page_wake(char *v) { os_uffd_wake(uffd, v, MESH_PAGE); }

static bool map_file_page(char *v, uint32_t file_page)
{
    UNSEEN_BEGIN();
    bool mapped = os_map_file_fixed(v, MESH_PAGE, memfd, (uint64_t)file_page * MESH_PAGE);
    UNSEEN_END();
    return mapped;
}

/* A fresh anonymous page at v in one step (the mapping there replaced). */
static void map_own_page(char *v)
{
    UNSEEN_BEGIN();
    bool mapped = os_map_anon_fixed(v, MESH_PAGE);
    UNSEEN_END();
    if (!mapped)
        hak_fatal("hakmem: meshing could not map a page back to its slab (out of mappings?)");
}

static bool file_page_get(uint32_t *page)
{
    if (free_file_count) {
        *page = free_file_pages[--free_file_count];
        return true;
    }
    if (file_pages_used == MESH_FILE_PAGES)
        return false;
    *page = file_pages_used++;
    return true;
}

/* The memfd page goes back to the stack for reuse, and to the system
 * where `punch` (the thread may punch a hole: thread_may_mesh). */
static void file_page_put(uint32_t page, bool punch)
{
    if (punch && memfd >= 0 && os_file_is(memfd, &memfd_id))
        os_punch_hole(memfd, (uint64_t)page * MESH_PAGE, MESH_PAGE);
    free_file_pages[free_file_count++] = page;
}

/* ---- records ------------------------------------------------------------------ */

static mesh_rec_t *rec_new(slab_t *s)
{
    if (!free_recs) {
        size_t bytes = (size_t)64 << 10, n = bytes / sizeof(mesh_rec_t);
        mesh_rec_t *chunk = os_map(bytes);
        if (!chunk)
            return NULL;
        for (size_t i = 0; i < n; i++) {
            chunk[i].next = free_recs;
            free_recs = &chunk[i];
        }
    }
    mesh_rec_t *r = free_recs;
    free_recs = r->next;
    memset(r, 0, sizeof *r);
    __atomic_store_n(&r->slab, s, __ATOMIC_RELAXED); /* read by other threads' frees (mesh_slot_reserved) */
    r->next = recs;
    if (recs)
        recs->prev = r;
    recs = r;
    __atomic_store_n(&s->mesh, r, __ATOMIC_RELEASE); /* its zeroed bits before it (rec_of) */
    return r;
}

static void rec_free(mesh_rec_t *r)
{
    if (r->prev)
        r->prev->next = r->next;
    else
        recs = r->next;
    if (r->next)
        r->next->prev = r->prev;
    __atomic_store_n(&r->slab->mesh, NULL, __ATOMIC_RELAXED);
    __atomic_store_n(&r->slab, NULL, __ATOMIC_RELAXED);
    r->prev = NULL;
    r->next = free_recs;
    free_recs = r;
}

static void reserve(mesh_scan_t *sc, uint32_t i)
{
    mesh_rec_t *r = sc->s->mesh;
    bit_put(r->reserved, i, true);
    r->reserved_count++;
    sc->free[i >> 6] &= ~((uint64_t)1 << (i & 63));
    sc->changed = true;
}

/* ---- setup -------------------------------------------------------------------- */

static size_t max_map_count(void)
{
    char buf[32] = {0};
    int fd = os_open_read("/proc/sys/vm/max_map_count");
    long n = fd >= 0 ? os_read(fd, buf, sizeof buf - 1) : -1;
    if (fd >= 0)
        os_close(fd);
    long v = n > 0 ? strtol(buf, NULL, 10) : 0;
    return v > 0 ? (size_t)v : 65530;
}

/* The checks that cost nothing; the files wait for the first need
 * (mesh_start). */
void mesh_init(void)
{
    if (!hak_config.mesh)
        return;
    if (HAK_SECURE) {
        off_reason = "the hardened library keys its canaries by address";
        return;
    }
#if defined(__SANITIZE_THREAD__)
    if (hak_config.mesh == MESH_AUTO) { /* it would report the copy and the writers it orders as a race */
        off_reason = "ThreadSanitizer cannot see the write protection that orders a page's copy and its writers";
        return;
    }
#endif
    if (os_page_size() != MESH_PAGE) {
        off_reason = "the system's pages are not 4 KiB";
        return;
    }
    __atomic_store_n(&mesh_on, true, __ATOMIC_RELAXED);
}

/* Meshing stops for good (what it meshed dissolves as before). */
static void mesh_stop(const char *reason)
{
    mesh_close();
    off_reason = reason;
    __atomic_store_n(&mesh_on, false, __ATOMIC_RELAXED);
}

/* Under mesh_lock, before meshing anything: the files open, at the first
 * need (a short program that never frees much never opens them: opened
 * at the start, they cost `ls /` 1.06 of its time) and after a fork, in
 * the child; and still meshing's. False if meshing is off now. */
static bool mesh_start(void)
{
    if (!mesh_enabled())
        return false;
    if (memfd >= 0) {
        if (files_ours())
            return true;
        mesh_stop("the program closed meshing's memfd or userfaultfd"); /* closes what is still ours */
        return false;
    }
    if (!mesh_open()) {
        mesh_stop(off_reason);
        return false;
    }
    if (!scans) {
        /* A meshed pair splits up to four mappings off the SuperSlabs': a
         * fifth of the kernel's limit for them, the rest left to the program. */
        max_pairs = max_map_count() / 5;
        free_file_pages = os_map(max_pairs * sizeof *free_file_pages);
        scans = os_map(MESH_PASS_SLABS * sizeof *scans);
        if (!free_file_pages || !scans) {
            mesh_stop("no memory for its tables");
            return false;
        }
    }
    return true;
}

bool mesh_ready(void)
{
    if (!mesh_enabled() || !thread_may_mesh())
        return false;
    pthread_mutex_lock(&mesh_lock);
    bool ready = mesh_start();
    pthread_mutex_unlock(&mesh_lock);
    return ready;
}

bool mesh_enabled(void) { return __atomic_load_n(&mesh_on, __ATOMIC_RELAXED); }
const char *mesh_off_reason(void) { return off_reason; }
bool mesh_started(void) { return memfd >= 0; }
bool mesh_kernel_writes_wait(void) { return uffd_full; }

void mesh_stats(size_t *pages_now, uint64_t *pages_ever)
{
    *pages_now = atomic_load_explicit(&stat_pages_now, memory_order_relaxed);
    *pages_ever = atomic_load_explicit(&stat_pages_ever, memory_order_relaxed);
}

/* Read once: the report's statistics and other threads' frees read it
 * while the owner dissolves the slab (a record is never unmapped); with
 * acquire, so that a new record's bits are seen zeroed (rec_new). */
static const mesh_rec_t *rec_of(const slab_t *s) { return __atomic_load_n(&s->mesh, __ATOMIC_ACQUIRE); }

/* A record is dropped only with nothing reserved in it, but another
 * slab's meshing may take it at once: a bit read there is s's only where
 * the record is still s's after the read. */
bool mesh_slot_reserved(const slab_t *s, const void *b)
{
    const mesh_rec_t *r = rec_of(s);
    uint32_t i = slab_block_index(s, b);
    if (!r || !(__atomic_load_n(&r->reserved[i >> 6], __ATOMIC_ACQUIRE) >> (i & 63) & 1))
        return false;
    return __atomic_load_n(&r->slab, __ATOMIC_RELAXED) == s;
}

uint32_t mesh_reserved(const slab_t *s)
{
    const mesh_rec_t *r = rec_of(s);
    return r ? __atomic_load_n(&r->reserved_count, __ATOMIC_RELAXED) : 0;
}

/* ---- a pass ------------------------------------------------------------------- */

/* A slab meshing may take: of one slab page, in use, and 1 / free_share
 * of its carved blocks free at least, but with HAKMEM_MESH=stress. A
 * pass scans those a quarter free (MESH_SCAN_SHARE: a fuller one has few
 * pages sparse enough to mesh, and the scans of a growing program's full
 * slabs took 3.7 ms a pass). Only its pages below what it carved mesh: a
 * carve hands blocks out without a look at the reserved ones. */
bool mesh_candidate(const slab_t *s, uint32_t free_share)
{
    uintptr_t owner = atomic_load_explicit(&s->owner, memory_order_relaxed);
    return s->in_use && s->span == 1 && s->carved && s->used &&
           (hak_config.mesh == MESH_STRESS || s->carved - s->used >= s->carved / free_share) && !s->parked &&
           !(owner & SLAB_ALIGNED) && !((uintptr_t)s->start & (MESH_PAGE - 1)) && s->capacity <= MESH_MAX_SLOTS;
}

/* sc's free slots from its local list; false if the list does not add up
 * (the program corrupted it: the slab is left alone). */
static bool scan_slab(mesh_scan_t *sc, slab_t *s)
{
    memset(sc, 0, sizeof *sc);
    sc->s = s;
    uint32_t n = 0, listed = s->carved - s->used;
    for (char *b = s->free; b; b = block_next(b)) {
        if (b < s->start || (uint32_t)((b - s->start) / s->block_size) >= s->carved || ++n > listed)
            return false;
        uint32_t i = slab_block_index(s, b);
        if (slot_at(s, i) != b || sc->free[i >> 6] >> (i & 63) & 1)
            return false;
        sc->free[i >> 6] |= (uint64_t)1 << (i & 63);
    }
    return n == listed;
}

/* Whether page k of a slab is meshed, or was (a fork child's). */
static bool page_taken(const slab_t *s, unsigned k)
{
    const mesh_rec_t *r = s->mesh;
    return r && (r->page[k].partner || r->page[k].file_page || r->page[k].vacant);
}

/* Page k of s can mesh: not meshed yet, and carved whole. */
static bool page_open(const slab_t *s, unsigned k, uint32_t hi)
{
    return hi <= s->carved && !page_taken(s, k);
}

/* A slot of sc live: its own, and not on its list. */
static uint64_t live_word(const mesh_scan_t *sc, unsigned w)
{
    const mesh_rec_t *r = sc->s->mesh;
    return ~(sc->free[w] | (r ? r->reserved[w] : 0));
}

static bool pages_disjoint(const mesh_scan_t *x, const mesh_scan_t *y, uint32_t lo, uint32_t hi)
{
    for (uint32_t w = lo >> 6; w <= (hi - 1) >> 6; w++) {
        uint64_t mask = ~(uint64_t)0;
        if (w == lo >> 6)
            mask &= ~(uint64_t)0 << (lo & 63);
        if (w == (hi - 1) >> 6 && (hi & 63))
            mask &= ~(uint64_t)0 >> (64 - (hi & 63));
        if (live_word(x, w) & live_word(y, w) & mask)
            return false;
    }
    return true;
}

/* The bookkeeping of both slabs over a page's slots, kept to be put back
 * where the mesh fails. */
typedef struct mesh_undo {
    uint64_t free[2][6], reserved[2][6];
    uint32_t counts[2];
} mesh_undo_t;

static void undo_save(mesh_undo_t *u, mesh_scan_t *const sc[2], uint32_t lo, uint32_t hi)
{
    for (int j = 0; j < 2; j++) {
        u->counts[j] = sc[j]->s->mesh->reserved_count;
        for (uint32_t w = lo >> 6, n = 0; w <= (hi - 1) >> 6; w++, n++) {
            u->free[j][n] = sc[j]->free[w];
            u->reserved[j][n] = sc[j]->s->mesh->reserved[w];
        }
    }
}

static void undo_apply(const mesh_undo_t *u, mesh_scan_t *const sc[2], uint32_t lo, uint32_t hi)
{
    for (int j = 0; j < 2; j++) {
        sc[j]->s->mesh->reserved_count = u->counts[j];
        for (uint32_t w = lo >> 6, n = 0; w <= (hi - 1) >> 6; w++, n++) {
            sc[j]->free[w] = u->free[j][n];
            __atomic_store_n(&sc[j]->s->mesh->reserved[w], u->reserved[j][n], __ATOMIC_RELEASE);
        }
    }
}

/* Drop a record made for a mesh that did not happen. */
static void rec_drop_unused(slab_t *s)
{
    mesh_rec_t *r = s->mesh;
    if (!r || r->reserved_count)
        return;
    for (unsigned k = 0; k < MESH_PAGES; k++)
        if (r->page[k].partner || r->page[k].file_page || r->page[k].vacant)
            return;
    rec_free(r);
}

static void mesh_record(slab_t *s, unsigned k, slab_t *partner, uint32_t file_page)
{
    s->mesh->page[k] = (mesh_page_t){partner, file_page + 1, false};
    set_owner_flag(s, true);
}

/* Page k of x and of y become one: false if the kernel refused a step
 * (the pass stops), with everything as it was but, where y's page could
 * not be mapped after x's was, x's page the memfd's alone. */
static bool mesh_pair(mesh_scan_t *x, mesh_scan_t *y, unsigned k)
{
    if ((!x->s->mesh && !rec_new(x->s)) || (!y->s->mesh && !rec_new(y->s))) {
        rec_drop_unused(x->s);
        return false;
    }
    mesh_scan_t *const both[2] = {x, y};
    uint32_t lo, hi;
    page_slots(x->s, k, &lo, &hi);
    mesh_undo_t undo;
    undo_save(&undo, both, lo, hi);
    mesh_rec_t *rx = x->s->mesh, *ry = y->s->mesh;
    for (uint32_t i = lo; i < hi; i++) {
        bool own_x = !bit_get(rx->reserved, i), own_y = !bit_get(ry->reserved, i);
        bool live_x = own_x && !(x->free[i >> 6] >> (i & 63) & 1);
        bool live_y = own_y && !(y->free[i >> 6] >> (i & 63) & 1);
        if (live_x || (own_x && !live_y)) {
            if (own_y)
                reserve(y, i);
        } else if (own_y && own_x) {
            reserve(x, i);
        }
    }
    char *vx = x->s->start + k * MESH_PAGE, *vy = y->s->start + k * MESH_PAGE;
    uint32_t fp;
    bool got = file_page_get(&fp), ok = false;
    bool protected_x = got && page_protect(vx), protected_y = protected_x && page_protect(vy);
    if (protected_y) {
        UNSEEN_BEGIN();
        memcpy(page_buf, vx, MESH_PAGE);
        for (uint32_t i = lo; i < hi; i++) {
            if (bit_get(ry->reserved, i))
                continue;
            size_t from = (size_t)i * y->s->block_size, to = from + y->s->block_size;
            size_t page_from = k * MESH_PAGE, page_to = page_from + MESH_PAGE;
            from = from > page_from ? from : page_from;
            to = to < page_to ? to : page_to;
            memcpy(page_buf + (from - page_from), y->s->start + from, to - from);
        }
        UNSEEN_END();
        ok = os_pwrite(memfd, page_buf, MESH_PAGE, (uint64_t)fp * MESH_PAGE) && map_file_page(vx, fp);
    }
    if (!protected_y || !ok) {
        if (protected_x)
            page_unprotect(vx);
        if (protected_y)
            page_unprotect(vy);
        undo_apply(&undo, both, lo, hi);
        if (got)
            file_page_put(fp, true); /* in a pass: thread_may_mesh */
        rec_drop_unused(x->s);
        rec_drop_unused(y->s);
        return false;
    }
    if (!map_file_page(vy, fp)) {
        /* x's page is the memfd's now, alone; every slot there is x's again. */
        page_wake(vx);
        page_unprotect(vy);
        undo_apply(&undo, both, lo, hi);
        mesh_record(x->s, k, NULL, fp);
        rec_drop_unused(y->s);
        x->changed = true;
        return false;
    }
    page_wake(vx);
    page_wake(vy);
    mesh_record(x->s, k, y->s, fp);
    mesh_record(y->s, k, x->s, fp);
    pairs_now++;
    atomic_fetch_add_explicit(&stat_pages_now, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&stat_pages_ever, 1, memory_order_relaxed);
    return true;
}

/* sc's page k holds no live block: its slots are reserved (off the list
 * rebuilt after the pass) and the page purged, until a refill of the
 * class wants them back (mesh_unvacate). */
static bool vacate(mesh_scan_t *sc, unsigned k)
{
    slab_t *s = sc->s;
    if (!s->mesh && !rec_new(s))
        return false;
    uint32_t lo, hi;
    page_slots(s, k, &lo, &hi);
    for (uint32_t i = lo; i < hi; i++)
        if (!bit_get(s->mesh->reserved, i))
            reserve(sc, i);
    s->mesh->page[k].vacant = true;
    set_owner_flag(s, true);
    os_purge(s->start + k * MESH_PAGE, MESH_PAGE);
    atomic_fetch_add_explicit(&vacant_pages, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&stat_pages_now, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&stat_pages_ever, 1, memory_order_relaxed);
    return true;
}

static bool page_has_live(const mesh_scan_t *sc, uint32_t lo, uint32_t hi)
{
    return !pages_disjoint(sc, sc, lo, hi);
}

/* s's local list rebuilt from the scan, in address order; the slots it
 * reserved now count as used. */
static void rebuild_list(const mesh_scan_t *sc)
{
    slab_t *s = sc->s;
    block_keys_t keys = block_keys(s->start);
    void *head = NULL;
    uint32_t n = 0;
    for (uint32_t i = s->carved; i-- > 0;) {
        if (!(sc->free[i >> 6] >> (i & 63) & 1))
            continue;
        block_link_with(slot_at(s, i), head, keys);
        head = slot_at(s, i);
        n++;
    }
    s->free = head;
    s->used = s->carved - n;
}

/* A paced pass (one with a deadline: a refill's, a thread exit's) meshes
 * only where it gives back an eighth of the pages it looks at, and 16 at
 * least: a pair costs some 25 us, and each free into a meshed slab
 * leaves the fast path for as long as the slab stays meshed. At the exit
 * of bench_threads larson's thread, 64 passes over 1,800 pages would have
 * given back 106 (6%), in 16 classes of a few pages each: 0.935 of the
 * rate without meshing at 1 thread (the exit is timed). After bench
 * frag's deletion, a malloc_trim's passes give back 13,069 of 36,072
 * pages, 13,048 of them in classes that meet the bound. */
#define MESH_PACED_MIN_SHARE 8
#define MESH_PACED_MIN_PAGES 16

/* A pass over the m scanned slabs, page offset by page offset: each page
 * with no live block given back alone (vacate), then each open page
 * paired with the first of the next MESH_PROBES open ones whose live
 * blocks miss its own (mesh_pair). Returns the pages given back. With
 * apply false nothing changes: the pass is planned, without the bound on
 * pairs, the pages it would give back returned and those it would look
 * at counted in *open. Applied, it stops at the first failure, or past
 * deadline_ns (0: none) after a pair. */
static size_t mesh_walk(size_t m, bool apply, uint64_t deadline_ns, size_t *open)
{
    static uint32_t taken[MESH_PASS_SLABS]; /* page k of scans[i] given back: bit k of taken[i] (mesh_lock) */
    _Static_assert(MESH_PAGES <= 32, "a slab's pages fit a word of taken");
    size_t given = 0;
    bool stop = false;
    *open = 0;
    memset(taken, 0, m * sizeof *taken);
    for (unsigned k = 0; k < MESH_PAGES && !stop; k++) {
        for (size_t i = 0; i < m && !stop; i++) {
            uint32_t lo, hi;
            page_slots(scans[i].s, k, &lo, &hi);
            if (lo >= hi || !page_open(scans[i].s, k, hi))
                continue;
            ++*open;
            if (page_has_live(&scans[i], lo, hi))
                continue;
            stop = apply && !vacate(&scans[i], k);
            if (!stop) {
                taken[i] |= 1u << k;
                given++;
            }
        }
        for (size_t i = 0; i < m && !stop; i++) {
            uint32_t lo, hi;
            page_slots(scans[i].s, k, &lo, &hi);
            if (lo >= hi)
                break;
            if (!page_open(scans[i].s, k, hi) || taken[i] >> k & 1)
                continue;
            for (size_t j = i + 1, probes = 0; j < m && probes < MESH_PROBES; j++) {
                if (!page_open(scans[j].s, k, hi) || taken[j] >> k & 1)
                    continue;
                probes++;
                if (!pages_disjoint(&scans[i], &scans[j], lo, hi))
                    continue;
                bool done = !apply || (pairs_now < max_pairs && mesh_pair(&scans[i], &scans[j], k));
                if (done) {
                    taken[i] |= 1u << k;
                    taken[j] |= 1u << k;
                    given++;
                }
                stop = apply && (!done || (deadline_ns && os_now_ns() > deadline_ns));
                break;
            }
        }
    }
    return given;
}

void mesh_slabs(slab_t *const *slabs, size_t n, uint64_t deadline_ns)
{
    if (!mesh_enabled() || !n)
        return;
    bool candidates = false;
    for (size_t i = 0; i < n && !candidates; i++)
        candidates = mesh_candidate(slabs[i], MESH_SCAN_SHARE);
    if (!candidates || !thread_may_mesh())
        return;
    pthread_mutex_lock(&mesh_lock);
    if (!mesh_start()) {
        pthread_mutex_unlock(&mesh_lock);
        return;
    }
    size_t m = 0;
    bool stop = false;
    for (size_t i = 0; i < n && m < MESH_PASS_SLABS && !stop; i++) {
        if (mesh_candidate(slabs[i], MESH_SCAN_SHARE) && scan_slab(&scans[m], slabs[i]))
            m++;
        stop = deadline_ns && os_now_ns() > deadline_ns;
    }
    size_t open;
    if (deadline_ns && !stop) { /* paced: only where it gives back enough */
        size_t given = mesh_walk(m, false, 0, &open);
        stop = given < MESH_PACED_MIN_PAGES || given * MESH_PACED_MIN_SHARE < open;
    }
    if (!stop)
        mesh_walk(m, true, deadline_ns, &open);
    for (size_t i = 0; i < m; i++)
        if (scans[i].changed)
            rebuild_list(&scans[i]);
    os_purge(scans, m * sizeof *scans);
    pthread_mutex_unlock(&mesh_lock);
}

/* ---- dissolving ------------------------------------------------------------------ */

/* p's slots on its page k, reserved while its partner there lived, are
 * p's again where no other meshed page of p overlapping the slot has a
 * partner that owns it: onto p's local list. */
static void give_back_slots(slab_t *p, unsigned k)
{
    mesh_rec_t *r = p->mesh;
    uint32_t lo, hi, bs = p->block_size;
    page_slots(p, k, &lo, &hi);
    for (uint32_t i = lo; i < hi; i++) {
        if (!bit_get(r->reserved, i))
            continue;
        bool still = false;
        unsigned first = (unsigned)((size_t)i * bs / MESH_PAGE), last = (unsigned)(((size_t)i * bs + bs - 1) / MESH_PAGE);
        for (unsigned j = first; j <= last && j < MESH_PAGES; j++) {
            slab_t *q = j == k ? NULL : r->page[j].partner;
            if ((q && !reserved(q->mesh, i)) || (j != k && r->page[j].vacant))
                still = true;
        }
        if (still)
            continue;
        bit_put(r->reserved, i, false);
        r->reserved_count--;
        block_link(slot_at(p, i), p->free);
        p->free = slot_at(p, i);
        p->used--;
    }
}

void mesh_dissolve(slab_t *s)
{
    mesh_rec_t *r = s->mesh;
    if (!r)
        return;
    int punch = -1; /* asked at the first page to punch */
    pthread_mutex_lock(&mesh_lock);
    for (unsigned k = 0; k < MESH_PAGES; k++) {
        mesh_page_t *pg = &r->page[k];
        slab_t *p = pg->partner;
        if (pg->file_page)
            map_own_page(s->start + k * MESH_PAGE);
        if (p) {
            p->mesh->page[k].partner = NULL;
            give_back_slots(p, k);
            pairs_now--;
            if (pg->file_page)
                atomic_fetch_sub_explicit(&stat_pages_now, 1, memory_order_relaxed);
        } else if (pg->file_page) {
            if (punch < 0)
                punch = thread_may_mesh();
            file_page_put(pg->file_page - 1, punch);
        }
        if (pg->vacant) {
            atomic_fetch_sub_explicit(&vacant_pages, 1, memory_order_relaxed);
            atomic_fetch_sub_explicit(&stat_pages_now, 1, memory_order_relaxed);
        }
        *pg = (mesh_page_t){NULL, 0, false};
    }
    rec_free(r);
    set_owner_flag(s, false);
    s->free = NULL;
    s->used = 0;
    __atomic_store_n(&s->carved, 0, __ATOMIC_RELAXED); /* read by other threads' frees */
    s->carved_end = s->start;
    os_purge(s->start, (size_t)s->span * SLAB_PAGE_SIZE);
    pthread_mutex_unlock(&mesh_lock);
}

bool mesh_has_vacant(void) { return atomic_load_explicit(&vacant_pages, memory_order_relaxed) != 0; }

uint32_t mesh_unvacate(slab_t *s)
{
    mesh_rec_t *r = s->mesh;
    if (!r)
        return 0;
    pthread_mutex_lock(&mesh_lock);
    uint32_t used = s->used;
    for (unsigned k = 0; k < MESH_PAGES; k++)
        if (r->page[k].vacant) {
            r->page[k].vacant = false;
            give_back_slots(s, k);
            atomic_fetch_sub_explicit(&vacant_pages, 1, memory_order_relaxed);
            atomic_fetch_sub_explicit(&stat_pages_now, 1, memory_order_relaxed);
        }
    uint32_t given = used - s->used;
    rec_drop_unused(s);
    if (!s->mesh)
        set_owner_flag(s, false);
    pthread_mutex_unlock(&mesh_lock);
    return given;
}

/* ---- fork ----------------------------------------------------------------------- */

#define FOR_EACH_VIEW(r, k)                                                                                       \
    for (mesh_rec_t *r = recs; r; r = r->next)                                                                   \
        for (unsigned k = 0; k < MESH_PAGES; k++)                                                                \
            if (r->page[k].file_page)

void mesh_fork_prepare(void)
{
    pthread_mutex_lock(&mesh_lock);
    fork_views = 0;
    fork_copies = NULL;
    FOR_EACH_VIEW(r, k) /* views outlive the files where meshing stopped (mesh_start) */
    fork_views++;
    if (!fork_views || !(fork_copies = os_map(fork_views * MESH_PAGE)))
        return;
    /* Under a seccomp filter the ioctls could kill, and without its
     * userfaultfd there are none to make: the copy is taken without them,
     * and a write racing with the fork may miss the child, as it may under
     * any fork. */
    fork_protected = uffd >= 0 && os_file_is(uffd, &uffd_id) && thread_may_mesh();
    size_t n = 0;
    FOR_EACH_VIEW(r, k)
    {
        char *v = r->slab->start + k * MESH_PAGE;
        if (fork_protected)
            page_protect(v);
        memcpy((char *)fork_copies + n++ * MESH_PAGE, v, MESH_PAGE);
    }
}

void mesh_fork_parent(void)
{
    if (fork_copies) {
        if (fork_protected)
            FOR_EACH_VIEW(r, k)
            page_unprotect(r->slab->start + k * MESH_PAGE);
        os_unmap(fork_copies, fork_views * MESH_PAGE);
        fork_copies = NULL;
    }
    pthread_mutex_unlock(&mesh_lock);
}

/* The child's views become private pages holding what the parent's held
 * at the fork; nothing of the memfd stays mapped, and the child meshes
 * with a memfd of its own. */
void mesh_fork_child(void)
{
    size_t n = 0;
    FOR_EACH_VIEW(r, k)
    {
        char *v = r->slab->start + k * MESH_PAGE;
        /* Without the copies (no memory for them), the page's bytes now,
         * which the parent's writers may have changed since the fork. */
        const char *from = fork_copies ? (char *)fork_copies + n++ * MESH_PAGE : page_buf;
        if (!fork_copies)
            memcpy(page_buf, v, MESH_PAGE);
        map_own_page(v);
        memcpy(v, from, MESH_PAGE);
        r->page[k].file_page = 0;
    }
    if (fork_copies)
        os_unmap(fork_copies, fork_views * MESH_PAGE);
    fork_copies = NULL;
    mesh_close();
    file_pages_used = 0;
    free_file_count = 0;
    /* What the child gives back now: its vacant pages, none shared. */
    atomic_store_explicit(&stat_pages_now, atomic_load_explicit(&vacant_pages, memory_order_relaxed),
                          memory_order_relaxed);
    pthread_mutex_unlock(&mesh_lock);
}
