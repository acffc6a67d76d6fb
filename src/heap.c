/* Per-thread heaps: the slow path behind the allocation fast path (refill,
 * remote-free draining, new slabs), thread exit and reuse of what exited
 * threads left, and fork. */
#include "heap.h"
#include "hooks.h"
#include "init.h"
#include "mesh.h"
#include "purger.h"
#include "superslab.h"

#include <pthread.h>
#include <sched.h>
#include <string.h>

heap_t hak_empty_heap;
HAK_TLS heap_t *hak_tl_heap = &hak_empty_heap;

static pthread_mutex_t heaps_lock = PTHREAD_MUTEX_INITIALIZER;
/* Held while the purger drains an orphan and while hak_collect takes the
 * orphans over, so that hak_collect finds every orphan back in the queue,
 * drained or not; taken before heaps_lock. */
static pthread_mutex_t orphans_drain_lock = PTHREAD_MUTEX_INITIALIZER;
static heap_t *_Atomic all_heaps;     /* every heap ever made; never freed (read without the lock: heaps_all) */
static heap_t *orphans;               /* heaps of exited threads, not yet reused: oldest first */
static heap_t **orphans_tail = &orphans; /* where the next one goes */
static _Atomic size_t orphan_count;
static uint64_t last_adoption_ms;     /* when a new thread last took an orphan (heaps_lock) */
static pthread_key_t heap_key;
static _Atomic bool heap_key_ready;
static char *meta_next, *meta_end;    /* bump arena for heap structs */

#define META_CHUNK ((size_t)256 << 10)
#define HEAP_PAGE_OFFSET 64 /* where a heap starts in its page */
#define CARVE_BYTES 4096 /* carve a page's worth of blocks at a time: touch memory only as used */
#define CARVE_MIN_TINY 16 /* but at least this many tiny blocks after a slab's first carve */

/* ---- slab lists ---------------------------------------------------------- */

/* The owned slabs of a class form a circular list, so that a search can
 * resume where the last one stopped and a slab can go to the back. */
static void list_push_back(slab_t **head, slab_t *s)
{
    if (!*head) {
        s->next = s->prev = s;
        *head = s;
        return;
    }
    s->next = *head;
    s->prev = (*head)->prev;
    s->prev->next = s;
    (*head)->prev = s;
}

static void list_remove(slab_t **head, slab_t *s)
{
    if (s->next == s) {
        *head = NULL;
    } else {
        s->prev->next = s->next;
        s->next->prev = s->prev;
        if (*head == s)
            *head = s->next;
    }
    s->next = s->prev = NULL;
}

/* A heap's lists are being changed: a fork now must not hand this heap to
 * the child (see heaps_fork_child). The signal fences keep the compiler
 * from moving list stores across the flag. */
static void heap_enter_lists(heap_t *heap)
{
    atomic_store_explicit(&heap->in_slow, 1, memory_order_relaxed);
    atomic_signal_fence(memory_order_seq_cst);
    /* The flag is also the owner's mark against the purger's claims of the
     * mid caches (heap_mid_enter: a list update may reach them) and of the
     * loose slabs (heap_claim_lists). */
    while (unlikely(atomic_load_explicit(&heap->mid_claimed, memory_order_acquire) ||
                    atomic_load_explicit(&heap->lists_claimed, memory_order_acquire))) {
        atomic_store_explicit(&heap->in_slow, 0, memory_order_release);
        while (atomic_load_explicit(&heap->lists_claimed, memory_order_acquire))
            sched_yield();
        heap_mid_wait(heap);
        atomic_store_explicit(&heap->in_slow, 1, memory_order_relaxed);
        atomic_signal_fence(memory_order_seq_cst);
    }
}

static void heap_leave_lists(heap_t *heap)
{
    atomic_signal_fence(memory_order_seq_cst);
    atomic_store_explicit(&heap->in_slow, 0, memory_order_release);
    purger_start_if_wanted();
}

/* ---- slab operations (owner only) ----------------------------------------- */

/* A new owner for s (taking over an orphan's slabs); the flags stay. */
static void slab_set_owner(slab_t *s, heap_t *heap)
{
    uintptr_t owner = atomic_load_explicit(&s->owner, memory_order_relaxed);
    while (!atomic_compare_exchange_weak_explicit(&s->owner, &owner, (owner & SLAB_FLAGS) | (uintptr_t)heap,
                                                  memory_order_release, memory_order_relaxed))
        ; /* another thread set SLAB_ALIGNED (slab_flags_set) */
}

/* Blocks on a list, counted up to max + 1: a block freed twice makes a
 * cycle, which must not hang the walk. */
static uint32_t list_length(void *list, void **tail, uint32_t max)
{
    uint32_t n = 0;
    for (void *b = list; b && n <= max; b = block_next(b), n++)
        *tail = b;
    return n;
}

/* Move blocks other threads freed onto the local list. */
static void slab_drain_remote(slab_t *s)
{
    void *list = atomic_exchange_explicit(&s->remote, NULL, memory_order_acquire);
    if (!list)
        return;
    void *tail;
    uint32_t n = list_length(list, &tail, s->used);
    if (unlikely(n > s->used)) {
        hak_report_bad_pointer("free", list, "more blocks freed than allocated in this slab (double free from another thread)");
        return; /* leak the list rather than hand a block out twice */
    }
    block_link(tail, s->free);
    s->free = list;
    s->used -= n;
}

/* The hardened build hands out new blocks in an order that cannot be
 * foreseen: the n blocks from first are threaded as index r, r + k, r + 2k
 * ... modulo n, with a random start r and a random step k prime to n (a
 * full shuffle cost a quarter of the time of a refill-heavy loop). So
 * does a build with meshing on, whose pages must not all keep the same
 * slots live when a program frees in a pattern (of every 32 blocks of 64
 * B taken in a row, the first 8 kept: 0 pages meshed in order, 723 so;
 * bench_tiny longlived 16 B 1.025 of the rate, lifo 256 B 1.003). */
static uint32_t gcd(uint32_t a, uint32_t b)
{
    while (b) {
        uint32_t t = a % b;
        a = b, b = t;
    }
    return a;
}

static void *thread_shuffled(char *first, uint32_t n, uint32_t block_size, void **tail)
{
    static HAK_TLS uint64_t rng;
    if (!rng)
        rng = os_random() | 1;
    uint64_t draw = xorshift64(&rng);
    uint32_t index = (uint32_t)(draw % n), step = 1;
    if (n > 2)
        for (int tries = 0; tries < 8; tries++) {
            uint32_t k = 1 + (uint32_t)((draw >> 32) % (n - 1));
            draw = xorshift64(&rng);
            if (gcd(k, n) == 1) {
                step = k;
                break;
            }
        }
    block_keys_t keys = block_keys(first);
    size_t stride = (size_t)step * block_size, span = (size_t)n * block_size;
    size_t offset = (size_t)index * block_size;
    char *head = first + offset, *b = head;
    for (uint32_t i = 1; i < n; i++) {
        offset += stride;
        if (offset >= span)
            offset -= span;
        block_link_with(b, first + offset, keys);
        b = first + offset;
    }
    block_link_with(b, NULL, keys);
    *tail = b;
    return head;
}

/* Thread the next never-used blocks into a list, or return NULL when every
 * block has been carved: those that start in the page where the next one
 * starts (linking writes each one's first word), and after a slab's first
 * carve at least CARVE_MIN_TINY tiny ones, so that refills stay rare once
 * a class is in use (a carve per page cost a program growing in 1000-byte
 * blocks 25 instructions per malloc). The first carve stays in its page:
 * 16 blocks of 304 bytes faulted two pages for the one that glibc takes
 * at pthread_create. */
static void *slab_carve(slab_t *s, void **tail)
{
    uint32_t left = s->capacity - s->carved;
    if (!left)
        return NULL;
    char *first = s->start + (size_t)s->carved * s->block_size;
    if (HAK_SECURE && !s->carved && ((uintptr_t)s->start & SLAB_LEAD_MASK)) /* the lead's canary (slab_lead) */
        block_canaries_set(s->start - s->block_size, 1, s->block_size);
    size_t to_page_end = CARVE_BYTES - ((uintptr_t)first & (CARVE_BYTES - 1));
    uint32_t n = (uint32_t)((to_page_end + s->block_size - 1) / s->block_size);
    if (s->carved && s->block_size <= TINY_MAX && n < CARVE_MIN_TINY)
        n = CARVE_MIN_TINY;
    if (n > left)
        n = left;
    __atomic_store_n(&s->carved, s->carved + n, __ATOMIC_RELAXED); /* read by other threads' frees */
    s->used += n;
    s->carved_end = first + (size_t)n * s->block_size;
    if (HAK_SECURE)
        block_canaries_set(first, n, s->block_size);
    if (HAK_SECURE || mesh_enabled())
        return thread_shuffled(first, n, s->block_size, tail);
    block_keys_t keys = block_keys(first);
    char *b = first;
    for (uint32_t i = 1; i < n; i++, b += s->block_size)
        block_link_with(b, b + s->block_size, keys);
    block_link_with(b, NULL, keys);
    *tail = b;
    return first;
}

/* Bytes an empty slab keeps resident: the blocks it ever carved. */
static size_t slab_touched_bytes(const slab_t *s) { return (size_t)s->carved * s->block_size; }

/* An empty slab the heap kept (current or spare) is in use again, or leaves. */
static void heap_unkeep(heap_t *heap, slab_t *s)
{
    if (s->used == 0) {
        hak_assert(heap->kept_empty_bytes >= slab_touched_bytes(s));
        heap->kept_empty_bytes -= slab_touched_bytes(s);
    }
}

/* n free blocks of s are too few to refill the cache with. */
static bool slab_list_is_short(const slab_t *s, uint32_t n)
{
    return (size_t)n * s->block_size < CARVE_BYTES / 2;
}

/* s's local list can go to the cache whole, as it is: no kept slab to
 * count again, no parked block, and blocks enough not to lengthen it. */
static bool slab_list_is_batch(const slab_t *s)
{
    return s->free && s->used && !s->parked && !slab_list_is_short(s, s->carved - s->used);
}

/* s's local list, whole, for the cache: its blocks count as used. A fork
 * between the stores loses the list to the child (a leak), never hands a
 * block out twice; the signal fences keep the compiler from reordering
 * them, for heap_alloc_slow, which takes it outside the list flag. */
static void *slab_take_list(slab_t *s)
{
    void *list = s->free;
    s->free = NULL;
    atomic_signal_fence(memory_order_seq_cst);
    s->used = s->carved;
    atomic_signal_fence(memory_order_seq_cst);
    return list;
}

/* Blocks for the cache from s, which becomes (or is) the current slab:
 * its local list, what other threads freed, or new blocks, in that order:
 * carving before taking the remote frees had a producer whose blocks a
 * consumer frees touch each class's whole slab (bench prodcons: 5.9 MiB
 * resident at the end against 3.2, measured at dcf154b).
 * A short local list means another refill soon (a small ring of live
 * blocks keeps it short for good): the remote frees go first, and the
 * list waits to grow, else it is lengthened once with new blocks. (It
 * was lengthened with new blocks while remote frees waited: larson's
 * owners, which free some of their blocks themselves, carved every slab
 * of the small classes whole, 64 KiB for a few KiB in use, measured at 6c20372.)
 * Every block handed to the cache counts as used. */
static void *slab_take_blocks(heap_t *heap, slab_t *s)
{
    heap_unkeep(heap, s);
    uint32_t local = s->carved - s->used; /* the remote list counts as used */
    if (s->free && !slab_list_is_short(s, local)) {
        HAK_COUNT(heap, refill_local);
        return slab_take_list(s);
    }
    /* Remote blocks count as used: no need to walk the list. */
    if (atomic_load_explicit(&s->remote, memory_order_relaxed)) {
        HAK_COUNT(heap, refill_remote);
        return atomic_exchange_explicit(&s->remote, NULL, memory_order_acquire);
    }
    void *tail, *fresh = slab_carve(s, &tail);
    if (!s->free) {
        if (fresh)
            HAK_COUNT(heap, refill_carve);
        return fresh;
    }
    HAK_COUNT(heap, refill_local);
    void *list = slab_take_list(s);
    if (!fresh)
        return list;
    block_link(tail, list);
    return fresh;
}

/* p, a block of s that another thread frees (or a block of another heap's
 * slab left in the cache: heap_return_cache), onto s's remote list, for
 * its owner to take back. */
void heap_remote_free(slab_t *s, void *p)
{
    /* Read what we need before the push: once the block is on the list the
     * owner may drain it and release the slab. */
    heap_t *owner = slab_owner_heap(atomic_load_explicit(&s->owner, memory_order_relaxed));
    unsigned c = s->class_idx;
    void *head = atomic_load_explicit(&s->remote, memory_order_relaxed);
    do
        block_link(p, head);
    while (!atomic_compare_exchange_weak_explicit(&s->remote, &head, p, memory_order_release,
                                                  memory_order_relaxed));
    _Atomic uint64_t *hint = &owner->remote_hint[c / 64];
    uint64_t bit = (uint64_t)1 << (c % 64);
    if (!(atomic_load_explicit(hint, memory_order_relaxed) & bit)) {
        atomic_fetch_or_explicit(hint, bit, memory_order_release);
        if (atomic_load_explicit(&owner->state, memory_order_relaxed) == HEAP_ORPHAN)
            heaps_notice_orphan_frees(); /* no owner to drain it: the purger will */
    }
}

/* Put the class's cached blocks back where they count as free: the current
 * slab's on its local list, so that its used count is exact again, another
 * heap's (heap_take_freed_into) on their slab's remote list. */
static void heap_return_cache(heap_t *heap, unsigned c)
{
    void *list = heap->cache[c];
    if (!list)
        return;
    heap->cache[c] = NULL;
    slab_t *cur = heap->cur[c];
    for (void *b = list, *next; b; b = next) {
        next = block_next(b);
        slab_t *s = slab_of(b);
        if (s != cur) {
            heap_remote_free(s, b);
            continue;
        }
        hak_assert(s->used);
        block_link(b, s->free);
        s->free = b;
        s->used--;
    }
}

/* Where the owner's frees of s go, as its owner word's mid flag (0: to
 * the slab's list). Only the owner changes it; other threads just read
 * the word. */
static void slab_set_mid_flag(slab_t *s, uintptr_t flag)
{
    if (flag)
        slab_flags_set(s, SLAB_STASHES_FREES);
    else
        slab_flags_clear(s, SLAB_STASHES_FREES);
}

/* s becomes class c's current slab (NULL: none). For a mid class, the
 * owner's frees of it, as of the slab it replaces, which stays owned, go
 * to the class's stash (SLAB_STASHES_FREES), since the purger can claim
 * it. Without claims the flag is cleared: a fork child where membarrier
 * is refused may take over slabs flagged in the parent. A loose slab
 * (heap_loosen_if_due) is the owner's alone again: the blocks freed onto
 * its remote list meanwhile come back as other threads' do. */
static void heap_set_cur(heap_t *heap, unsigned c, slab_t *s)
{
    slab_t *old = heap->cur[c];
    if (old == s)
        return;
    uintptr_t owner = s ? atomic_load_explicit(&s->owner, memory_order_relaxed) : 0;
    if (owner & SLAB_LOOSE)
        slab_flags_clear(s, SLAB_LOOSE);
    if (class_stashes_frees(c)) {
        uintptr_t flag = hak_claims_on ? SLAB_STASHES_FREES : 0;
        if (old)
            slab_set_mid_flag(old, flag);
        if (s)
            slab_set_mid_flag(s, flag);
    }
    heap->cur[c] = s;
}

/* Class c's stashed blocks go back to their slabs' local lists, the
 * current slab's included; true if one of those slabs is empty now. */
static bool heap_return_stash(heap_t *heap, unsigned c)
{
    uintptr_t *stash = heap_stash(heap, c);
    bool emptied = false;
    for (uintptr_t head = *stash; head;) {
        void *b = front_first(head);
        head = (uintptr_t)block_next(b);
        slab_t *s = slab_of(b);
        hak_assert(s->class_idx == c && s->used > 0);
        block_link(b, s->free);
        s->free = b;
        emptied |= --s->used == 0;
    }
    *stash = 0;
    return emptied;
}

static void heap_unlink_slab(heap_t *heap, slab_t *s)
{
    unsigned c = s->class_idx;
    if (heap->cur[c] == s)
        heap_set_cur(heap, c, NULL);
    else
        list_remove(&heap->owned[c], s);
}

/* An empty slab leaves its class: kept as a spare if it is one page and
 * the heap's kept empty slabs stay within their budget (a batch that fills
 * and empties a few slabs would otherwise give them back, take them again
 * and thread their blocks anew each time), else back to its SuperSlab. */
static void heap_release_slab(heap_t *heap, slab_t *s)
{
    hak_assert(!s->parked);
    mesh_dissolve(s); /* a spare's pages may take another class */
    heap_unlink_slab(heap, s);
    size_t touched = slab_touched_bytes(s);
    if (s->span == 1 && heap->kept_empty_bytes + touched <= HEAP_KEPT_EMPTY_BYTES) {
        heap->kept_empty_bytes += touched;
        s->next = heap->spares;
        heap->spares = s;
    } else {
        superslab_slab_release(heap, s);
    }
}

static slab_t *heap_unlink_spare(slab_t **link)
{
    slab_t *s = *link;
    *link = s->next;
    s->next = NULL;
    return s;
}

/* A spare leaves the kept slabs, to be formatted or given back. */
static slab_t *heap_drop_spare(heap_t *heap)
{
    slab_t *s = heap_unlink_spare(&heap->spares);
    heap_unkeep(heap, s);
    return s;
}

/* from's spares go back to their SuperSlabs, which heap owns (heap is from
 * itself, or the heap that adopted an orphan's SuperSlabs). */
static void heap_release_spares(heap_t *heap, heap_t *from)
{
    while (from->spares)
        superslab_slab_release(heap, heap_drop_spare(from));
}

/* ---- fast-path support ----------------------------------------------------- */

/* The owner frees the last block of s. The current slab of its class is
 * kept while the heap's kept empty slabs stay within their budget (the
 * next allocation would take a slab again at once); others go back to the
 * SuperSlab so any class can use the pages, and the purger reach them.
 * A kept slab whose one block is a refill on its own (blocks of 2 KiB and
 * up; smaller ones make a short list, which the refill lengthens) is
 * parked: the block goes to the class's cache (empty, since cached blocks
 * count as used), so that the next malloc takes it on the fast path. A
 * loop that takes and frees one mid block at a time (battle json and mir)
 * went through the refill each time: 84 instructions. All inside the list
 * flag: a fork between the used count reaching zero and the kept bytes
 * counting the slab left the child a heap whose accounts disagreed (an
 * assertion in the debug build, found by test_threads' fork test). */
static HAK_NOINLINE void heap_keep_or_release_last(heap_t *heap, slab_t *s, void *block)
{
    unsigned c = s->class_idx;
    size_t touched = slab_touched_bytes(s);
    heap_enter_lists(heap);
    bool kept = heap->cur[c] == s && heap->kept_empty_bytes + touched <= HEAP_KEPT_EMPTY_BYTES;
    if (kept && !heap->cache[c] && !slab_list_is_short(s, 1)) { /* the cache may hold another slab's blocks */
        heap->kept_empty_bytes += touched;
        s->parked = 1;
        block_link(block, NULL);
        heap->cache[c] = block;
    } else {
        block_link(block, s->free);
        s->free = block;
        s->used = 0;
        if (kept)
            heap->kept_empty_bytes += touched;
        else
            heap_release_slab(heap, s);
    }
    heap_leave_lists(heap);
}

/* The owner frees a block of s, meshed (mesh.c): once s holds no live
 * block of its own (its used count is its partners' slots), it dissolves
 * and goes back to its SuperSlab, never kept: its pages were purged. */
void heap_free_meshed(slab_t *s, void *block)
{
    heap_t *heap = heap_get();
    heap_enter_lists(heap);
    block_link(block, s->free);
    s->free = block;
    s->used--;
    if (s->used == mesh_reserved(s)) { /* the release dissolves it */
        heap_unlink_slab(heap, s);
        superslab_slab_release(heap, s);
    }
    heap_leave_lists(heap);
}

/* A parked block taken on the fast path and freed again goes back to the
 * cache, counted and flagged already, with the fewest stores and no stack
 * frame (see heap_alloc_slow: each store waits behind the program's):
 * battle mir went from 328 to 261 ns an iteration (with the list flag, a
 * frame and the flag stored again), though json from 52 to 58, for no
 * reason we could find (docs/benchmarks.md). A fork before the cache
 * holds the block leaks it to the child; the signal fence keeps the cache
 * from holding it before its link is set. */
void heap_free_last_block(slab_t *s, void *block)
{
    heap_t *heap = heap_get(); /* not passed in: the free fast path keeps it out of a register */
    if (!s->parked) {
        heap_keep_or_release_last(heap, s, block);
        return;
    }
    void **slot = &heap->cache[s->class_idx];
    hak_assert(heap->cur[s->class_idx] == s && !*slot);
    block_link(block, NULL);
    atomic_signal_fence(memory_order_seq_cst);
    *slot = block;
}

/* s, parked, stops counting as kept: its block is in use, or goes back to
 * the slab's list, or the slab stops being the current one. A parked slab
 * counts while its block is in the cache and also once a malloc took it on
 * the fast path (which cannot tell): until the class's next refill or a
 * collection, it counts too much, never too little. */
static void heap_unpark(heap_t *heap, slab_t *s)
{
    s->parked = 0;
    hak_assert(heap->kept_empty_bytes >= slab_touched_bytes(s));
    heap->kept_empty_bytes -= slab_touched_bytes(s);
}

/* By the thread that hands out an aligned block of s: its owner, or one
 * that took some of its blocks (slab_flags_set). */
void heap_slab_mark_aligned(slab_t *s)
{
    if (!(atomic_load_explicit(&s->owner, memory_order_relaxed) & SLAB_ALIGNED))
        slab_flags_set(s, SLAB_ALIGNED);
}

/* Remote frees are announced by a hint bit per class. */
static bool heap_take_hint(heap_t *heap, unsigned c)
{
    _Atomic uint64_t *word = &heap->remote_hint[c / 64];
    uint64_t bit = (uint64_t)1 << (c % 64);
    if (!(atomic_load_explicit(word, memory_order_relaxed) & bit))
        return false;
    atomic_fetch_and_explicit(word, ~bit, memory_order_acquire);
    return true;
}

/* Some class of the heap got a remote free since its hints were last taken. */
static bool heap_has_remote_frees(heap_t *heap)
{
    for (unsigned w = 0; w < (CLASS_COUNT + 63) / 64; w++)
        if (atomic_load_explicit(&heap->remote_hint[w], memory_order_relaxed))
            return true;
    return false;
}

static void heap_keep_slab(heap_t *heap, slab_t *s);

/* Detach the class's circular list of owned slabs as a NULL-ended one. */
static slab_t *heap_detach_owned(heap_t *heap, unsigned c)
{
    slab_t *list = heap->owned[c];
    heap->owned[c] = NULL;
    if (list)
        list->prev->next = NULL;
    return list;
}

/* Blocks other threads freed into the class's slabs come back: the slabs
 * left empty go back to the pool. */
static void heap_drain_class(heap_t *heap, unsigned c)
{
    HAK_COUNT(heap, refill_drain);
    for (slab_t *s = heap_detach_owned(heap, c), *next; s; s = next) {
        next = s->next;
        heap_keep_slab(heap, s);
    }
}

/* Blocks other threads freed into the mid classes come back to their
 * slabs, the current ones included, and the slabs they empty to their
 * SuperSlabs, before the heap takes new pages: a class allocated seldom
 * would otherwise pin them until its next refill while other classes grow
 * RSS. Class c, being refilled, has just been drained. Tiny classes wait
 * for their refills: their slabs are one page, often many, and a walk of
 * them at every new slab would cost more than the pages. */
static void heap_reclaim_remote(heap_t *heap, unsigned c)
{
    for (unsigned w = TINY_CLASSES / 64; w < (CLASS_COUNT + 63) / 64; w++) {
        uint64_t bits = atomic_load_explicit(&heap->remote_hint[w], memory_order_relaxed);
        for (; bits; bits &= bits - 1) {
            unsigned k = w * 64 + (unsigned)__builtin_ctzll(bits);
            if (k == c || class_is_tiny(k) || !heap_take_hint(heap, k))
                continue;
            heap_drain_class(heap, k);
            slab_t *s = heap->cur[k];
            if (s && !heap->cache[k] && s->used && atomic_load_explicit(&s->remote, memory_order_relaxed)) {
                if (s->parked) /* its block went out, and came back from another thread */
                    heap_unpark(heap, s);
                slab_drain_remote(s);
                if (s->used == 0)
                    heap_release_slab(heap, s);
            }
        }
    }
}

/* A new slab for class c: a spare if the class fits one page (one of the
 * class as it is, with its blocks threaded already, else any, formatted),
 * else pages from the heap's SuperSlabs. */
static slab_t *heap_new_slab(heap_t *heap, unsigned c)
{
    if (hak_class_span[c] == 1 && heap->spares) {
        for (slab_t **link = &heap->spares; *link; link = &(*link)->next)
            if ((*link)->class_idx == c) {
                /* An empty current slab now: still kept until it hands out
                 * blocks (heap_unkeep). */
                slab_t *s = heap_unlink_spare(link);
                atomic_store_explicit(&s->owner, (uintptr_t)heap, memory_order_relaxed); /* no flag */
                return s;
            }
        slab_t *s = heap_drop_spare(heap);
        slab_format(s, heap, c);
        return s;
    }
    heap_reclaim_remote(heap, c);
    return superslab_slab_acquire(heap, c);
}

/* Blocks a slab could hand out now: its local list and what was never carved. */
static uint32_t slab_room(const slab_t *s)
{
    return s->capacity - s->used;
}

#define SCARCE_BLOCKS 4 /* fewer free blocks than this are not worth a refill */

/* s, of a tiny class, has fewer than SCARCE_BLOCKS free blocks, none left
 * to carve and none freed by other threads: a refill from it would soon
 * come back. (The mid classes' slabs hold a few blocks, and their stash
 * answers the same need.) */
static bool slab_is_scarce(const slab_t *s)
{
    return class_is_tiny(s->class_idx) && s->carved == s->capacity && slab_room(s) < SCARCE_BLOCKS &&
           !atomic_load_explicit(&s->remote, memory_order_relaxed);
}

#define SEARCH_SLABS 8        /* owned slabs looked at per refill */
#define GOOD_BATCH_DIVISOR 64 /* a slab with 1/64 of its capacity free is taken at once */

/* Another owned slab for the cache: the first of the next few in turn with
 * a good batch of blocks (1/64 of its capacity, and not scarce), else the
 * one with most room among them; the list moves on past the ones looked
 * at, so that frees spread over many slabs (long-lived data) are found in
 * batches. */
static slab_t *heap_pick_slab(heap_t *heap, unsigned c)
{
    slab_t *first = heap->owned[c], *s = first, *best = NULL;
    uint32_t best_room = 0;
    for (unsigned i = 0; s && i < SEARCH_SLABS; i++) {
        uint32_t room = slab_room(s);
        if (room * GOOD_BATCH_DIVISOR >= s->capacity && !slab_is_scarce(s)) {
            best = s;
            break;
        }
        if (room > best_room)
            best = s, best_room = room;
        s = s->next;
        if (s == first)
            break;
    }
    heap->owned[c] = s; /* the next search starts after the slabs seen */
    if (best)
        list_remove(&heap->owned[c], best);
    return best;
}

static bool heap_absorb_orphan(heap_t *heap, uint64_t orphaned_before_ms);

/* A heap that needs a new slab takes over an exited thread's heap first,
 * once that has waited out the purge delay for a new thread to adopt it
 * whole: taken at once, a program that starts threads in rounds had each
 * round's early threads absorb the heaps its later ones would have
 * adopted, and the later ones take new SuperSlabs (bench_threads churn 4:
 * 26 SuperSlabs and 22 MiB resident against 7 and 9). */
static bool heap_absorb_waiting_orphan(heap_t *heap)
{
    if (!atomic_load_explicit(&orphan_count, memory_order_relaxed))
        return false;
    uint64_t delay = (uint64_t)hak_config.purge_delay_ms, now = os_now_ms();
    return heap_absorb_orphan(heap, now > delay ? now - delay : 0);
}

/* s has no freed block to hand out, only never-used ones (and, having
 * carved some, blocks in use: it may sit on the owned list). */
static bool slab_would_carve(slab_t *s)
{
    return !s->free && s->carved != 0 && s->carved < s->capacity &&
           !atomic_load_explicit(&s->remote, memory_order_relaxed);
}

static void heap_take_class(heap_t *heap, heap_t *from, unsigned c);

/* Meshing (mesh.c) over a class's slabs on the owned list (all of
 * them after a collect; the current one, whose blocks are in the cache,
 * is not there), until deadline_ns (0: none): a meshed slab left with no
 * live block of its own goes back first. */
static void heap_mesh_class(heap_t *heap, unsigned c, uint64_t deadline_ns)
{
    slab_t *batch[MESH_PASS_SLABS];
    size_t n = 0, kept = 0;
    slab_t *first = heap->owned[c];
    for (slab_t *s = first; s && n < MESH_PASS_SLABS; s = s->next == first ? NULL : s->next)
        batch[n++] = s;
    for (size_t i = 0; i < n; i++) {
        slab_t *s = batch[i];
        if (s->mesh && s->used == mesh_reserved(s) && !atomic_load_explicit(&s->remote, memory_order_acquire)) {
            heap_unlink_slab(heap, s); /* the release dissolves it */
            superslab_slab_release(heap, s);
        } else {
            batch[kept++] = s;
        }
    }
    mesh_slabs(batch, kept, deadline_ns);
}

#define MESH_REFILL_INTERVAL_MS 100
/* The time a paced meshing (a refill's, a thread exit's) may take. */
#define MESH_PACED_BUDGET_NS 5000000

/* Below this size a class's pages hold more than 64 blocks, and two of
 * them a third full overlap nearly always: the refills' meshing leaves
 * them to a collect. */
#define MESH_REFILL_MIN_BLOCK 64

/* HAKMEM_MESH=on: a refill about to take a new slab (the heap would
 * grow) meshes the heap's slabs first where the last such pass is 100 ms
 * old, for 5 ms at most, class after class from where the last pass
 * stopped, paced (mesh_slabs): a thread spends at most a twentieth of its
 * time so, and a program that never calls malloc_trim gets its memory
 * back as it grows again. stress (`every_refill`): at every refill, the
 * refill's class and one other in turn, their current slabs and cached
 * blocks included, without a bound (every class at every refill took test_threads 27 s
 * instead of 4). Inside the list flag. */
static void heap_mesh_if_due(heap_t *heap, bool every_refill, unsigned refill_class)
{
    if (likely(hak_config.mesh == MESH_OFF) || !mesh_enabled() || every_refill != (hak_config.mesh == MESH_STRESS))
        return;
    if (every_refill) { /* the class's cache back to its slab first, as a collect does */
        unsigned c = heap->mesh_class;
        heap->mesh_class = (uint8_t)((c + 1) % TINY_CLASSES);
        for (unsigned k = 0; k < 2; k++, c = refill_class) {
            if (!class_is_tiny(c))
                continue;
            heap_take_class(heap, heap, c);
            heap_mesh_class(heap, c, 0);
        }
        return;
    }
    uint64_t now = os_now_ms();
    if (now - heap->meshed_ms < MESH_REFILL_INTERVAL_MS)
        return;
    heap->meshed_ms = now;
    uint64_t deadline_ns = os_now_ns() + MESH_PACED_BUDGET_NS;
    for (unsigned i = 0; i < TINY_CLASSES && os_now_ns() <= deadline_ns; i++) {
        unsigned c = heap->mesh_class;
        heap->mesh_class = (uint8_t)((c + 1) % TINY_CLASSES);
        if (hak_class_size[c] >= MESH_REFILL_MIN_BLOCK)
            heap_mesh_class(heap, c, deadline_ns);
    }
}

/* The owned slabs of the classes [from_class, to_class) of one slab page
 * that meshing could use (an eighth free) become loose: the owner's frees
 * of their blocks take their remote lists (hak_free_irregular), and the
 * purger, under its claim of the lists, may mesh them (heaps_mesh_loose).
 * A slab is loose until it is current again (heap_set_cur). Inside the
 * list flag or under the purger's mid claim, which keeps it off. */
#define MESH_LOOSEN_SHARE 8
static void heap_loosen(heap_t *heap, unsigned from_class, unsigned to_class)
{
    bool loosened = false;
    for (unsigned c = from_class; c < to_class; c++) {
        slab_t *first = class_meshes(c) ? heap->owned[c] : NULL;
        for (slab_t *s = first; s; s = s->next == first ? NULL : s->next) {
            uintptr_t owner = atomic_load_explicit(&s->owner, memory_order_relaxed);
            if (!(owner & SLAB_LOOSE) && mesh_candidate(s, MESH_LOOSEN_SHARE)) {
                if (!loosened && !mesh_ready())
                    return;
                slab_flags_set(s, SLAB_LOOSE);
                loosened = true;
            }
        }
    }
    if (loosened)
        heap_loose_changed(heap);
}

/* HAKMEM_MESH: a refill or a sample (heap_sampled), where the last look
 * is 100 ms old (at every one with stress), loosens the owned tiny slabs
 * for the purger to mesh while the thread runs or sleeps. A thread that
 * frees much and then waits, as a server between requests, never grows,
 * and its memory followed its live data only at a malloc_trim:
 * redis-server after a 70% deletion held 3.24 times its data, as without
 * meshing. A pass meshes the slabs a quarter free; loosened at a quarter
 * too, the slabs of one run of redis-server's deletion in five were still
 * below it at the last look, and kept every page. The mid classes' slabs
 * are loosened where the purger flushes the stashes (heap_loosen_mid), not
 * here: a stashed block of a loose slab would go back to it after a mesh
 * (heap_return_stash), which does not free as a meshed slab must. Not
 * without claims (no membarrier): the purger could not keep the owner
 * off. Inside the list flag. */
static void heap_loosen_if_due(heap_t *heap)
{
    if (likely(hak_config.mesh == MESH_OFF) || !mesh_enabled() || !hak_claims_on)
        return;
    uint64_t now = os_now_ms();
    if (hak_config.mesh != MESH_STRESS && now - heap->loosened_ms < MESH_REFILL_INTERVAL_MS)
        return;
    heap->loosened_ms = now;
    heap_loosen(heap, 0, TINY_CLASSES);
}

/* Under the mid claim, the stashes just flushed back to their slabs: the
 * mid classes' slabs of one slab page (up to 8 KiB) that meshing could
 * use become loose, for the purger's next pass to mesh. A thread that
 * frees most of its mid blocks and then waits gets their pages back
 * without a malloc_trim. No stashed block is of a loose slab: the owner's
 * frees of its blocks go to its remote list (but one that read the owner
 * word before the claim and entered its mid section after it, whose
 * block the stash hands back later as an unmeshed slab's: a meshed slab
 * left so with no block of its own is released at a later pass, not at
 * once). */
static void heap_loosen_mid(heap_t *heap)
{
    if (likely(hak_config.mesh == MESH_OFF) || !mesh_enabled())
        return;
    heap_loosen(heap, TINY_CLASSES, CLASS_COUNT);
}

/* The owner loosened slabs, or freed a block of a loose one
 * (hak_free_irregular): counted, for the purger to see that its loose
 * slabs changed since its last pass; the first change since that pass
 * wakes the purger, whose thread may have left meanwhile (one run of
 * redis-server's deletion in ten kept every page when only a loosening
 * woke it). */
void heap_loose_changed(heap_t *heap)
{
    uint64_t changes = atomic_load_explicit(&heap->loose_changes, memory_order_relaxed) + 1;
    atomic_store_explicit(&heap->loose_changes, changes, memory_order_relaxed);
    if (changes == atomic_load_explicit(&heap->loose_changes_meshed, memory_order_relaxed) + 1)
        purger_notify();
}

/* A sample of the owner's mallocs that took no refill (sample.c): one
 * every 2 MiB the thread allocates by default. A server that answers
 * from its caches refills seldom (redis-server deleting keys: none in
 * 140,000 commands), but its samples come. */
void heap_sampled(heap_t *heap)
{
    if (likely(hak_config.mesh == MESH_OFF))
        return;
    heap_enter_lists(heap);
    heap_loosen_if_due(heap);
    heap_leave_lists(heap);
}

/* Before a new slab: an owned slab of class c whose pages meshing gave
 * back for holding no live block takes them again (mesh_unvacate). */
static slab_t *heap_unvacate(heap_t *heap, unsigned c)
{
    if (!class_meshes(c) || !mesh_has_vacant())
        return NULL;
    slab_t *first = heap->owned[c];
    for (slab_t *s = first; s; s = s->next == first ? NULL : s->next)
        if (s->mesh && mesh_unvacate(s)) {
            list_remove(&heap->owned[c], s);
            return s;
        }
    return NULL;
}

/* Before a new slab for a tiny class: the blocks other threads freed into
 * the slabs of other heaps that this thread freed blocks of the class into
 * lately (freed_into), if their owners have not taken them back, go to the
 * cache instead, counted as used in their slabs all the while
 * (heap_return_cache hands back what is left). A block goes back to its
 * owner's slab, and an owner that is not running takes nothing back: with
 * more threads than cores, larson's threads (8 on 2 cores) each owned most
 * of the table in turn, and every heap grew its classes' slabs for all of
 * it, 45 MiB carved for 8.3 MiB live, 21-35 MiB of it on the remote lists
 * of owners that were not running (measured at 23c1dc6). Only where the
 * heap would grow: taken also where it would carve new blocks into its
 * current slab, the blocks went round between mstress's threads (one free
 * in eight of another thread's block), each free of a taken block a remote
 * one: 0.85-0.92 of the rate at 8 threads (0.97 as it is). */
static bool heap_take_freed_into(heap_t *heap, unsigned c)
{
    if (!class_is_tiny(c))
        return false;
    void *list = superslab_take_remote(heap->freed_into[c], FREED_INTO_SLOTS, c);
    if (!list)
        return false;
    HAK_COUNT(heap, refill_freed_into);
    heap->cache[c] = list;
    return true;
}

/* Another slab for class c's cache: an owned one, else an exited thread's
 * heap taken over (its slabs join the owned ones), else (NULL, the cache
 * filled) another heap's remote frees (heap_take_freed_into), else an
 * owned slab whose vacant pages meshing gave back, else a new slab, after
 * a meshing pass where one is due (HAKMEM_MESH); NULL if none could be
 * had. With plenty, an owned slab must not be scarce:
 * the current one is, and a program whose live blocks of one size filled
 * their slab, freeing and taking them back at random, found one block at
 * a time there (1 KiB blocks, 64 live: a refill at every malloc, 268
 * instructions an iteration against tcmalloc's 145, 147 now:
 * measured at 8dadaa7). So a class grows until the slabs a
 * refill looks at hold SCARCE_BLOCKS free blocks; tiny slabs hold 64 at
 * least. */
static inline slab_t *heap_another_slab(heap_t *heap, unsigned c, bool plenty)
{
    for (;;) {
        if (heap_take_hint(heap, c))
            heap_drain_class(heap, c);
        slab_t *s = heap_pick_slab(heap, c);
        if (s && plenty && slab_is_scarce(s)) {
            list_push_back(&heap->owned[c], s);
            s = NULL;
        }
        if (s) {
            HAK_COUNT(heap, refill_switch);
            return s;
        }
        if (!heap_absorb_waiting_orphan(heap))
            break;
        HAK_COUNT(heap, refill_orphan);
    }
    if (heap_take_freed_into(heap, c))
        return NULL; /* the cache holds blocks now */
    slab_t *s = heap_unvacate(heap, c);
    if (s)
        return s;
    heap_mesh_if_due(heap, false, c);
    HAK_COUNT(heap, refill_new_slab);
    return heap_new_slab(heap, c);
}

/* Fill heap->cache[c], which is empty. A scarce current slab gives way to
 * another if one can be had, else its few blocks do. */
static bool heap_refill(heap_t *heap, unsigned c)
{
    for (;;) {
        slab_t *s = heap->cur[c], *other;
        if (s && slab_is_scarce(s) && (other = heap_another_slab(heap, c, true))) {
            list_push_back(&heap->owned[c], s);
            heap_set_cur(heap, c, s = other);
            heap->slab_refills++;
        }
        if (heap->cache[c])
            return true; /* another heap's blocks (heap_take_freed_into) */
        if (s && slab_would_carve(s) && heap_take_hint(heap, c)) {
            /* Blocks other threads gave back come before new ones: they
             * are warm, and carving would grow RSS while they wait. */
            heap_drain_class(heap, c);
            other = heap_pick_slab(heap, c);
            if (other) {
                HAK_COUNT(heap, refill_switch);
                list_push_back(&heap->owned[c], s);
                heap_set_cur(heap, c, other);
                s = other;
            }
        }
        if (s) {
            void *list = slab_take_blocks(heap, s);
            if (list) {
                heap->cache[c] = list;
                return true;
            }
            list_push_back(&heap->owned[c], s); /* exhausted: looked at last */
            heap_set_cur(heap, c, NULL);
        }
        if (!(s = heap_another_slab(heap, c, false)))
            return heap->cache[c] != NULL;
        heap_set_cur(heap, c, s);
        heap->slab_refills++;
    }
}

/* The tuner's clock ticks at samples, timed large calls and one refill in
 * 64 (reading the time at every refill cost json 15 ns per iteration). */
static inline void heap_tick_tuner(heap_t *heap)
{
    if (unlikely(hak_evolving()) && !(++heap->tuner_refills & 63))
        hak_profile_hooks.tuner_tick();
}

/* The cache is empty: refill it, or take the first thread's heap, or
 * sample the allocation. */
static HAK_NOINLINE void *heap_alloc_refill(heap_t *heap, unsigned c, size_t size, uintptr_t site)
{
    if (unlikely(heap == &hak_empty_heap)) {
        heap = heap_thread_init();
        if (!heap)
            return NULL;
        /* An exited thread's heap, taken over as that thread left it, or
         * the one init's own allocations made for this thread (musl's
         * pthread_atfork allocates): the cache may hold blocks already,
         * which a refill would drop. The block is counted down as any
         * other (with HAKMEM_PROFILE_SAMPLE=1 it is a sample too). */
        void *b = heap->cache[c];
        if (b) {
            heap->cache[c] = block_next(b);
            block_handed_out(b);
            if ((heap->sample_left -= (long)size) > 0)
                return b;
            return hak_profile_hooks.sample(heap, c, b, size, site, hak_profile_hooks.interval_end(heap, size), 0);
        }
    }
    if (HAK_SECURE && unlikely(heap->corrupt_link))
        hak_free_list_corrupt(heap->corrupt_link);
    /* A sample's interval ends here, not at sample_take: the purger
     * thread that heap_leave_lists or purger_poll may start allocates on
     * this heap (pthread_create's calloc), and a sample there would start
     * a new interval, leaving this sample a weight of 0, the mark of a
     * free record (redis-benchmark: "double free" at its free, 1 run in
     * 100 or so under load). */
    float weight = (heap->sample_left -= (long)size) <= 0 ? hak_profile_hooks.interval_end(heap, size) : 0;
    uint64_t start = weight ? hak_ticks() : 0;
    heap_enter_lists(heap);
    heap_mesh_if_due(heap, true, c);
    heap_loosen_if_due(heap);
    slab_t *cur = heap->cur[c];
    if (cur && cur->parked) /* the cache is empty: its block was handed out */
        heap_unpark(heap, cur);
    void *b = NULL;
    if (heap_refill(heap, c)) {
        b = heap->cache[c];
        heap->cache[c] = block_next(b);
        block_handed_out(b);
    }
    heap_leave_lists(heap);
    purger_poll();
    if (unlikely(weight) && b)
        return hak_profile_hooks.sample(heap, c, b, size, site, weight, start);
    heap_tick_tuner(heap);
    return b;
}

/* The common refill first, in a function without a stack frame: the
 * current slab's own list taken whole, which a program that frees and
 * takes one block of a class whose slab holds others meets at every
 * malloc. Right after a program wrote a buffer page by page, its stores
 * still wait for their cache lines, and every store here queues behind
 * them: with the registers heap_alloc_refill saves and spills, a loop of
 * 64 KiB blocks (battle json with another block of the slab live) took
 * 54 ns an iteration, 37 this way. */
void *heap_alloc_slow(heap_t *heap, unsigned c, size_t size, uintptr_t site)
{
    slab_t *cur = heap->cur[c]; /* NULL in hak_empty_heap */
    if (unlikely(!cur || !slab_list_is_batch(cur) || heap->sample_left <= (long)size ||
                 (HAK_SECURE && heap->corrupt_link)))
        return heap_alloc_refill(heap, c, size, site);
    HAK_COUNT(heap, refill_local);
    heap->sample_left -= (long)size;
    void *b = slab_take_list(cur);
    heap->cache[c] = block_next(b);
    block_handed_out(b);
    heap_tick_tuner(heap);
    return b;
}

/* ---- collection -------------------------------------------------------------- */

/* A slab the heap keeps (or takes over): drained, released if empty. */
static void heap_keep_slab(heap_t *heap, slab_t *s)
{
    slab_drain_remote(s);
    if (s->used == 0)
        superslab_slab_release(heap, s);
    else
        list_push_back(&heap->owned[s->class_idx], s);
}

/* Take every slab of class c out of `from` (the heap itself, or an orphan)
 * and keep it in heap, after handing the class's cached blocks back. */
static void heap_take_class(heap_t *heap, heap_t *from, unsigned c)
{
    if (from->cur[c] && from->cur[c]->parked)
        heap_unpark(from, from->cur[c]);
    if (from->cur[c]) /* an empty one (its cache is empty, or another slab's) */
        heap_unkeep(from, from->cur[c]);
    heap_return_cache(from, c);
    if (!class_is_tiny(c))
        heap_return_stash(from, c);
    slab_t *list = heap_detach_owned(from, c), *cur = from->cur[c];
    heap_set_cur(from, c, NULL);
    if (cur) {
        cur->next = list;
        list = cur;
    }
    for (slab_t *s = list, *next; s; s = next) {
        next = s->next;
        if (from != heap)
            slab_set_owner(s, heap);
        heap_keep_slab(heap, s);
    }
}

void heap_flush_class(heap_t *heap, unsigned c)
{
    if (heap == &hak_empty_heap)
        return;
    heap_enter_lists(heap);
    heap_take_class(heap, heap, c);
    heap_leave_lists(heap);
}

/* The pages inside the free blocks of a slab still in use go back to the
 * OS; each block's first page stays, since it holds the free-list link,
 * and its last one where it holds the hardened build's canary. */
static void slab_purge_free_blocks(slab_t *s)
{
    uintptr_t page = os_page_size();
    if (s->block_size < 2 * page)
        return;
    for (char *b = s->free; b; b = block_next(b)) {
        uintptr_t from = ((uintptr_t)b + page) & ~(page - 1);
        uintptr_t to = ((uintptr_t)b + s->block_size - BLOCK_CANARY) & ~(page - 1);
        if (to > from)
            os_purge((void *)from, to - from);
    }
}

/* heap's mid caches and front were emptied, by the purger under its
 * claim (heaps_flush_mid) or under the heap's list mark, which keeps the
 * claim off (a collect, an orphan taken over): the next free into them
 * starts a new purge delay and tells the purger (heap_mid_cached). Once
 * only the purger cleared the flag: after a collect it kept the start of
 * a delay from before, and the next pass flushed the new front and reset
 * its limits at once; without the purger thread that pass could come at
 * any call (CI's arena_no_purge_thread failed so before 222c163). */
static void heap_mid_caches_emptied(heap_t *heap)
{
    atomic_store_explicit(&heap->mid_cached, false, memory_order_relaxed);
}

/* Everything the heap holds and does not use goes back: cached blocks to
 * their slabs or arenas, empty slabs to their SuperSlabs, empty
 * SuperSlabs to the pool (unmapped beyond the reserve now with unmap_now,
 * else after the purge delay), and the pages inside free mid blocks to
 * the OS; with HAKMEM_MESH, the pages meshing gives back, all of them
 * (mesh_deadline_ns 0: hak_collect, malloc_trim, an orphan's collect) or
 * paced until that time (a thread's exit, timed by programs that join
 * their threads). */
void heap_collect(heap_t *heap, bool unmap_now, uint64_t mesh_deadline_ns)
{
    if (heap == &hak_empty_heap)
        return;
    heap_enter_lists(heap);
    arena_front_flush(heap);
    for (unsigned c = 0; c < CLASS_COUNT; c++) {
        heap_take_class(heap, heap, c);
        slab_t *first = heap->owned[c], *s = first;
        if (!class_is_tiny(c))
            for (; s; s = s->next == first ? NULL : s->next)
                slab_purge_free_blocks(s);
    }
    heap_mid_caches_emptied(heap);
    if (mesh_enabled())
        for (unsigned c = 0; c < CLASS_COUNT && (!mesh_deadline_ns || os_now_ns() <= mesh_deadline_ns); c++)
            if (class_meshes(c))
                heap_mesh_class(heap, c, mesh_deadline_ns);
    heap_release_spares(heap, heap);
    hak_assert(heap->kept_empty_bytes == 0); /* no slab is kept: the accounts agree */
    superslab_give_back_empty(heap, unmap_now);
    heap_leave_lists(heap);
}

/* ---- the mid caches, flushed by the purger ------------------------------------- */

/* The owner waits while the purger flushes its mid caches (a few system
 * calls at most). */
void heap_mid_wait(heap_t *heap)
{
    while (atomic_load_explicit(&heap->mid_claimed, memory_order_acquire))
        sched_yield();
}

/* The first free to a mid cache since the purger last flushed the heap's:
 * the purger flushes them a purge delay later. Timed here, not when the
 * purger first looks: without the thread the next look may come much
 * later, and the blocks then wait out a second delay in their arena. */
void heap_mid_cached_first(heap_t *heap)
{
    atomic_store_explicit(&heap->mid_cached_ms, os_now_ms(), memory_order_relaxed);
    atomic_store_explicit(&heap->mid_cached, true, memory_order_release);
    purger_notify_cached();
}

/* s, a current slab, is empty: its blocks are forgotten and their pages
 * purged; the next refill carves them anew. Its pages stay the slab's:
 * giving them back to the SuperSlab would change the owner's bins, which
 * the owner's tiny refills use without the claim. */
static void slab_forget_blocks(slab_t *s)
{
    size_t lead = (uintptr_t)s->start & SLAB_LEAD_MASK, page = os_page_size();
    size_t touched = (lead + slab_touched_bytes(s) + page - 1) & ~(page - 1);
    bool carved = s->carved != 0;
    s->free = NULL;
    __atomic_store_n(&s->carved, 0, __ATOMIC_RELAXED); /* read by other threads' frees */
    s->carved_end = s->start;
    if (carved)
        os_purge(s->start - lead, touched);
}

/* Under the claim: the class's other slabs that the stash's return
 * emptied forget their blocks as the current one does; they stay on the
 * owned list (see slab_forget_blocks) for a refill to take or a collect to
 * give back. */
static void heap_forget_empty_owned(heap_t *heap, unsigned c)
{
    slab_t *first = heap->owned[c];
    for (slab_t *s = first; s; s = s->next == first ? NULL : s->next)
        if (s->used == 0 && s->carved)
            slab_forget_blocks(s);
}

/* Under the claim: the mid caches and stashes go back to their slabs,
 * with what other threads freed into them; an emptied slab forgets its
 * blocks, and the pages inside the free blocks of the others go back to
 * the OS. The front to the page arenas empties too. The current slab is
 * left alone where nothing came back to it: empty, it may be counted as
 * kept with its blocks (heap_keep_or_release_last). */
static void heap_flush_mid_caches(heap_t *heap)
{
    arena_front_flush(heap);
    for (unsigned c = TINY_CLASSES; c < CLASS_COUNT; c++) {
        slab_t *s = heap->cur[c];
        uint32_t cur_used = s ? s->used : 0;
        if (*heap_stash(heap, c) && heap_return_stash(heap, c))
            heap_forget_empty_owned(heap, c);
        if (!s || (s->used == cur_used && !heap->cache[c] && !atomic_load_explicit(&s->remote, memory_order_relaxed)))
            continue;
        if (s->parked) /* its block was handed out and came back to the stash, or waits in the cache */
            heap_unpark(heap, s);
        heap_return_cache(heap, c);
        slab_drain_remote(s);
        if (s->used == 0)
            slab_forget_blocks(s);
        else
            slab_purge_free_blocks(s);
    }
}

/* The purger claims heap's mid caches: false if the owner is at them (or
 * at its lists), and then it must look again soon. The owner's own
 * inline purge needs no barrier to see its marks: a thread under a
 * seccomp filter, which membarrier would kill, still empties its own
 * caches (its front to the arenas alone may hold 8 MiB). */
static bool heap_claim_mid(heap_t *heap)
{
    atomic_store_explicit(&heap->mid_claimed, true, memory_order_relaxed);
    if ((heap == heap_get() || os_membarrier()) && !atomic_load_explicit(&heap->mid_busy, memory_order_acquire) &&
        !atomic_load_explicit(&heap->in_slow, memory_order_acquire))
        return true;
    atomic_store_explicit(&heap->mid_claimed, false, memory_order_release);
    return false;
}

/* A thread's mid caches hold its freed blocks and pin their slabs (up to
 * one slab per class, about 2.5 MiB if every class of 1-16 KiB is in use):
 * they are flushed a purge delay after the first free into them, whether
 * the thread sleeps or runs (a running one refills from its slabs at
 * once, ten times a second at most), every thread's at once with all.
 * Under heaps_lock, so that heaps keep their state and fork waits.
 * Returns when the next heap falls due, or 0 if none waits. */
uint64_t heaps_flush_mid(bool all)
{
    if (!hak_claims_on)
        return 0;
    uint64_t now = os_now_ms(), delay = (uint64_t)hak_config.purge_delay_ms, due = 0;
    pthread_mutex_lock(&heaps_lock);
    for (heap_t *h = all_heaps; h; h = h->next_all) {
        if (h->state != HEAP_LIVE || !atomic_load_explicit(&h->mid_cached, memory_order_acquire))
            continue;
        uint64_t since = atomic_load_explicit(&h->mid_cached_ms, memory_order_relaxed);
        if (!all && now < since + delay) {
            due = due_earlier(due, since + delay);
            continue;
        }
        if (!heap_claim_mid(h)) {
            due = due_earlier(due, now + 1);
            continue;
        }
        heap_flush_mid_caches(h);
        heap_mid_caches_emptied(h);
        heap_loosen_mid(h);
        atomic_store_explicit(&h->mid_claimed, false, memory_order_release);
    }
    pthread_mutex_unlock(&heaps_lock);
    return due;
}

/* Under the lists' claim: the purger meshes heap's loose slabs (heap_loosen),
 * class after class from where its last pass stopped, until deadline_ns;
 * true if it stopped there. Each slab's remote list, where the owner's
 * frees went, comes back to its list first. Nothing here changes a slab
 * that is not loose, whose list the owner's frees still push onto: a
 * slab left with no block of its own is not meshed, and its release (to
 * dissolve it would give slots back to partners that may be tight) waits
 * for the owner's drain, which the remote frees' hint asks for. */
static bool heap_mesh_loose(heap_t *heap, uint64_t deadline_ns)
{
    static slab_t *batch[MESH_PASS_SLABS]; /* heaps_lock */
    for (unsigned i = 0; i < CLASS_COUNT; i++) {
        if (os_now_ns() > deadline_ns)
            return true;
        unsigned c = heap->loose_class;
        heap->loose_class = (uint8_t)((c + 1) % CLASS_COUNT);
        size_t n = 0;
        slab_t *first = class_meshes(c) ? heap->owned[c] : NULL;
        for (slab_t *s = first; s && n < MESH_PASS_SLABS; s = s->next == first ? NULL : s->next) {
            if (!(atomic_load_explicit(&s->owner, memory_order_relaxed) & SLAB_LOOSE))
                continue;
            slab_drain_remote(s);
            if (s->used > mesh_reserved(s))
                batch[n++] = s;
        }
        mesh_slabs(batch, n, deadline_ns);
    }
    return false;
}

/* The purger claims heap's loose slabs: false if the owner is at its
 * lists, and then it must look again soon. As the mid caches' claim
 * (heap_claim_mid), but only the owner's list updates keep off: its mid
 * fronts, which a mesh pass never touches, go on (under the mid claim a
 * malloc of a size it had just freed took another block). */
static bool heap_claim_lists(heap_t *heap)
{
    atomic_store_explicit(&heap->lists_claimed, true, memory_order_relaxed);
    if ((heap == heap_get() || os_membarrier()) && !atomic_load_explicit(&heap->in_slow, memory_order_acquire))
        return true;
    atomic_store_explicit(&heap->lists_claimed, false, memory_order_release);
    return false;
}

/* The purger's meshing of the live threads' loose slabs: a heap's when
 * its owner loosened more or freed into them since the last pass, at
 * most once a purge delay, or 1 ms after a pass that ran out of time;
 * for up to MESH_PACED_BUDGET_NS a heap, paced as a refill's (mesh_slabs:
 * only where it gives back enough). The claim holds the owner's slow
 * paths for that long at most. Under heaps_lock. Returns when the next
 * pass falls due, or 0: nothing changed since the last ones. */
static uint64_t heaps_mesh_loose(void)
{
    if (likely(hak_config.mesh == MESH_OFF) || !mesh_enabled() || !hak_claims_on)
        return 0;
    uint64_t due = 0, delay = (uint64_t)hak_config.purge_delay_ms;
    pthread_mutex_lock(&heaps_lock);
    for (heap_t *h = all_heaps; h; h = h->next_all) {
        uint64_t changes = atomic_load_explicit(&h->loose_changes, memory_order_relaxed), now = os_now_ms();
        if (h->state != HEAP_LIVE ||
            (changes == atomic_load_explicit(&h->loose_changes_meshed, memory_order_relaxed) && !h->loose_unfinished))
            continue;
        uint64_t next = h->loose_unfinished ? h->loose_meshed_ms + 1 : h->loose_meshed_ms + delay;
        if (now < next || !heap_claim_lists(h)) {
            due = due_earlier(due, now < next ? next : now + 1);
            continue;
        }
        atomic_store_explicit(&h->loose_changes_meshed, changes, memory_order_relaxed);
        h->loose_unfinished = heap_mesh_loose(h, os_now_ns() + MESH_PACED_BUDGET_NS);
        h->loose_meshed_ms = os_now_ms();
        atomic_store_explicit(&h->lists_claimed, false, memory_order_release);
        due = due_earlier(due, h->loose_meshed_ms + (h->loose_unfinished ? 1 : delay));
    }
    pthread_mutex_unlock(&heaps_lock);
    return due;
}

/* ---- heap lifetime ------------------------------------------------------------ */

static heap_t *heap_new_locked(void)
{
    for (heap_t *h = all_heaps; h; h = h->next_all)
        if (h->state == HEAP_FREE)
            return h;
    /* A page each, from its second line on: the first line of a page is
     * the one a program's page-strided writes flush from L1 (superslab_t),
     * and cache[], which every malloc reads, starts the heap. */
    size_t page = os_page_size(), size = (HEAP_PAGE_OFFSET + sizeof(heap_t) + page - 1) & ~(page - 1);
    if ((size_t)(meta_end - meta_next) < size) { /* not meta_next + size: NULL at first */
        meta_next = os_map(META_CHUNK);
        if (!meta_next)
            return NULL;
        meta_end = meta_next + META_CHUNK;
    }
    heap_t *h = (heap_t *)(meta_next + HEAP_PAGE_OFFSET);
    meta_next += size;
    h->next_all = all_heaps;
    atomic_store_explicit(&all_heaps, h, memory_order_release);
    return h;
}

/* h into the orphans' queue at link. */
static void heap_link_orphan_locked(heap_t *h, heap_t **link)
{
    h->state = HEAP_ORPHAN;
    h->next_orphan = *link;
    *link = h;
    if (!h->next_orphan)
        orphans_tail = &h->next_orphan;
    atomic_fetch_add_explicit(&orphan_count, 1, memory_order_relaxed);
}

/* A thread's heap, orphaned now: the newest, last. */
static void heap_push_orphan_locked(heap_t *h)
{
    h->orphaned_ms = os_now_ms();
    heap_link_orphan_locked(h, orphans_tail);
}

/* An orphan back in the queue, before the first that exited after it. */
static void heap_requeue_orphan_locked(heap_t *h)
{
    heap_t **link = &orphans;
    while (*link && (*link)->orphaned_ms <= h->orphaned_ms)
        link = &(*link)->next_orphan;
    heap_link_orphan_locked(h, link);
}

/* The orphan *link points to, out of the queue. */
static heap_t *heap_unlink_orphan_locked(heap_t **link)
{
    heap_t *h = *link;
    *link = h->next_orphan;
    if (!*link)
        orphans_tail = link;
    atomic_fetch_sub_explicit(&orphan_count, 1, memory_order_relaxed);
    return h;
}

/* The oldest orphan, out of the queue, if its thread exited before the
 * given time; else NULL. Oldest first: its blocks have had the longest to
 * come back from other threads, and no orphan waits behind newer ones.
 * Newest first, a thread that started while another of its round still
 * ran took the heap that one had just left, its blocks still in use, and
 * older heaps full of freed blocks waited: test_threads' churn, four
 * copies at once on two cores, mapped 113 to 203 MiB after its rounds
 * (CI once 240 on average over ten), against 117 to 138 oldest first. */
static heap_t *heap_pop_orphan_locked(uint64_t orphaned_before_ms)
{
    if (!orphans || orphans->orphaned_ms > orphaned_before_ms)
        return NULL;
    return heap_unlink_orphan_locked(&orphans);
}

/* h, out of the orphans' queue or new, becomes the calling thread's. */
static heap_t *heap_thread_take(heap_t *h)
{
    hak_profile_hooks.heap_init(h);
    h->arena_lane = arena_lane_next();
    hak_tl_heap = h;
    if (atomic_load_explicit(&heap_key_ready, memory_order_acquire))
        pthread_setspecific(heap_key, h);
    return h;
}

/* Give the calling thread a heap: an exited thread's, with all its slabs,
 * if one is waiting, else a fresh one. */
heap_t *heap_thread_init(void)
{
    hak_ensure_init();
    /* The process's init may have allocated on this thread, and so given
     * it a heap already: musl's pthread_atfork mallocs its handler's
     * record, and a second heap here would be left live and ownerless. */
    if (hak_tl_heap != &hak_empty_heap)
        return hak_tl_heap;
    pthread_mutex_lock(&heaps_lock);
    heap_t *h = heap_pop_orphan_locked(UINT64_MAX);
    if (h) {
        last_adoption_ms = os_now_ms();
    } else {
        h = heap_new_locked();
    }
    if (h)
        h->state = HEAP_LIVE;
    pthread_mutex_unlock(&heaps_lock);
    return h ? heap_thread_take(h) : NULL;
}

/* The calling thread, which has no heap yet, frees a block of `owner`, an
 * exited thread's heap: if it still waits in the orphans' queue, the
 * thread takes it over rather than the oldest at its first malloc, so that
 * this free and those after it are its own, not remote (a worker that
 * finishes what the one before it left: bench_threads churn 2, where the
 * oldest orphan was the other worker's, made 89% of its frees remote).
 * True if it did. */
bool heap_thread_adopt(heap_t *owner)
{
    if (!owner || atomic_load_explicit(&owner->state, memory_order_relaxed) != HEAP_ORPHAN)
        return false;
    pthread_mutex_lock(&heaps_lock);
    heap_t **link = &orphans;
    while (*link && *link != owner)
        link = &(*link)->next_orphan;
    heap_t *h = *link ? heap_unlink_orphan_locked(link) : NULL;
    if (h) {
        last_adoption_ms = os_now_ms();
        h->state = HEAP_LIVE;
    }
    pthread_mutex_unlock(&heaps_lock);
    return h && heap_thread_take(h);
}

/* Threads come and go: a new one adopted an exited one's heap within the
 * purge delay. */
static bool threads_recycled(void)
{
    pthread_mutex_lock(&heaps_lock);
    uint64_t adopted = last_adoption_ms;
    pthread_mutex_unlock(&heaps_lock);
    return adopted && os_now_ms() - adopted < (uint64_t)hak_config.purge_delay_ms;
}

/* Thread exit: the heap waits for the next thread (or an allocating
 * thread) to take it over. Blocks freed later by other threads land on
 * the slabs' remote lists meanwhile. Where threads come and go, it is
 * left as it is, caches and current slabs included, since the next thread
 * will use them: the collect at each exit, and the refills that rebuilt
 * what it took apart, cost bench_threads churn 2 a fifth of its time
 * (measured at c96b74d); the purger collects it once it has
 * waited the purge delay unadopted. Otherwise it is collected now, the
 * empty SuperSlabs beyond the reserve unmapped and the dirty pages of the
 * thread's arena lane purged: threads that do not come back (a pool that
 * finished its work) leave nothing behind. */
/* What a thread's exit hands back before its heap is orphaned, above the
 * heaps (BigCache's front): init.c says (heaps_key_init). */
static void (*thread_exit_first)(void);

static void heap_thread_exit(void *arg)
{
    heap_t *h = arg;
    if (h != hak_tl_heap)
        return;
    thread_exit_first();
    bool recycled = threads_recycled();
    if (!recycled) {
        heap_collect(h, true, os_now_ns() + MESH_PACED_BUDGET_NS);
        arena_purge_lane(h->arena_lane);
    }
    hak_tl_heap = &hak_empty_heap;
    pthread_mutex_lock(&heaps_lock);
    h->uncollected = recycled;
    heap_push_orphan_locked(h);
    pthread_mutex_unlock(&heaps_lock);
    /* The purger comes for it a delay from now; after a collect, for the
     * blocks freed meanwhile: no free after will say so. */
    if (recycled || heap_has_remote_frees(h))
        heaps_notice_orphan_frees();
    if (hak_config.verbose)
        hak_warn("thread exited; its heap waits for reuse", NULL);
}

/* Take over every slab of one heap orphaned before the given time. Remote
 * frees may race with the change of owner; they only ever push onto a
 * slab's remote list, which the new owner drains. */
static bool heap_absorb_orphan(heap_t *heap, uint64_t orphaned_before_ms)
{
    pthread_mutex_lock(&heaps_lock);
    heap_t *o = heap_pop_orphan_locked(orphaned_before_ms);
    if (o) {
        /* Reserved while its slabs move; a fork meanwhile leaves it alone. */
        o->state = HEAP_LIVE;
        atomic_store_explicit(&o->in_slow, 1, memory_order_relaxed);
    }
    pthread_mutex_unlock(&heaps_lock);
    if (!o)
        return false;
    superslab_adopt_all(heap, o); /* first: slabs are released into their owner's SuperSlabs */
    for (unsigned c = 0; c < CLASS_COUNT; c++)
        heap_take_class(heap, o, c); /* a heap orphaned by fork may hold a cache */
    arena_front_flush(o);            /* and a front */
    heap_mid_caches_emptied(o);
    heap_release_spares(heap, o);
    pthread_mutex_lock(&heaps_lock);
    atomic_store_explicit(&o->in_slow, 0, memory_order_relaxed);
    o->state = HEAP_FREE;
    pthread_mutex_unlock(&heaps_lock);
    return true;
}

void heaps_collect_orphans(void)
{
    heap_t *heap = hak_tl_heap;
    if (heap == &hak_empty_heap)
        heap = heap_thread_init();
    if (!heap)
        return;
    pthread_mutex_lock(&orphans_drain_lock);
    heap_enter_lists(heap);
    while (atomic_load_explicit(&orphan_count, memory_order_relaxed) && heap_absorb_orphan(heap, UINT64_MAX))
        ;
    heap_leave_lists(heap);
    pthread_mutex_unlock(&orphans_drain_lock);
}

/* Set by the first free into an orphan since the purger last looked
 * (heaps_notice_orphan_frees), cleared by its look. */
static _Atomic bool orphan_frees_noticed;

/* An orphan got a remote free (its hint bit was just set), or a thread
 * left its heap uncollected (heap_thread_exit): the purger is told once
 * per look, and the look keeps it coming back while such frees
 * go on (heaps_drain_orphans). Told at every such free, it was woken once
 * per thread where threads come one after another and each frees a block
 * of the one before before its first malloc (which then adopts that heap,
 * so the purger found nothing to drain and went back to sleep):
 * bench_threads churn 1 made 4 futex calls per thread instead of 1 and
 * fell from about 75 to 45 Mops/s. The fences pair with the look's:
 * either it sees the hint, or this sees the flag cleared and tells it
 * again. */
void heaps_notice_orphan_frees(void)
{
    atomic_thread_fence(memory_order_seq_cst);
    if (atomic_load_explicit(&orphan_frees_noticed, memory_order_relaxed))
        return;
    atomic_store_explicit(&orphan_frees_noticed, true, memory_order_relaxed);
    purger_notify();
}

/* Blocks freed into an orphan's slabs wait on their remote lists for the
 * heap's next owner, and an orphan left uncollected keeps its caches; a
 * program that starts no thread and allocates nothing new (asleep, or
 * done with its pool of workers) has no next owner, and kept them for
 * good (a worker's 113 MiB, freed by the main thread, held through a
 * sleep). The purger collects an orphan that has remote frees announced
 * or was left uncollected once it has waited the purge delay since its
 * exit or its last drain: cached blocks go back to their slabs, the slabs
 * left empty to their SuperSlabs, empty SuperSlabs to the pool, and the
 * heap to its place in the queue (by its exit, so that adoption stays
 * oldest first). Returns when the next such orphan falls due; else, if
 * frees into orphans (or uncollected exits) were announced since the last
 * look (their heaps adopted since), a delay from now, so that more of them
 * do not wake the purger each time; else 0. */
uint64_t heaps_drain_orphans(void)
{
    uint64_t delay = (uint64_t)hak_config.purge_delay_ms;
    bool noticed = atomic_exchange_explicit(&orphan_frees_noticed, false, memory_order_relaxed);
    atomic_thread_fence(memory_order_seq_cst);
    for (;;) {
        uint64_t now = os_now_ms(), due = 0;
        heap_t *o = NULL;
        /* Busy: hak_collect is taking them over, or this very drain purges
         * inline (HAKMEM_PURGE_THREAD=0) from inside itself. Look again soon. */
        if (pthread_mutex_trylock(&orphans_drain_lock) != 0)
            return now + delay / 4 + 1;
        pthread_mutex_lock(&heaps_lock);
        for (heap_t **link = &orphans; *link; link = &(*link)->next_orphan) {
            heap_t *h = *link;
            uint64_t since = h->drained_ms > h->orphaned_ms ? h->drained_ms : h->orphaned_ms;
            if (!h->uncollected && !heap_has_remote_frees(h))
                continue;
            if (since + delay > now) {
                due = due_earlier(due, since + delay);
                continue;
            }
            o = heap_unlink_orphan_locked(link);
            o->state = HEAP_LIVE; /* out of the queue while it drains (a fork waits for the drain lock) */
            o->draining = true;   /* still an orphan in the stats */
            break;
        }
        pthread_mutex_unlock(&heaps_lock);
        if (o) {
            for (unsigned w = 0; w < (CLASS_COUNT + 63) / 64; w++) /* frees from now on announce themselves */
                atomic_exchange_explicit(&o->remote_hint[w], 0, memory_order_acquire);
            heap_collect(o, false, 0);
            o->uncollected = false;
            o->drained_ms = now;
            pthread_mutex_lock(&heaps_lock);
            o->draining = false;
            heap_requeue_orphan_locked(o);
            pthread_mutex_unlock(&heaps_lock);
        }
        pthread_mutex_unlock(&orphans_drain_lock);
        if (!o)
            return due || !noticed ? due : now + delay;
    }
}

void heaps_totals(size_t *live, size_t *orphaned, uint64_t *slab_refills, uint64_t *counters)
{
    pthread_mutex_lock(&heaps_lock);
    for (heap_t *h = all_heaps; h; h = h->next_all) {
        /* An orphan being drained counts as one: test_threads read one
         * orphan less, now and then, in the middle of a drain. */
        *live += h->state == HEAP_LIVE && !h->draining;
        *orphaned += h->state == HEAP_ORPHAN || h->draining;
        *slab_refills += h->slab_refills;
#ifdef HAKMEM_COUNTERS
        for (unsigned i = 0; i < HAK_COUNTER_COUNT; i++)
            counters[i] += h->counters[i];
#else
        (void)counters;
#endif
    }
    pthread_mutex_unlock(&heaps_lock);
}

/* Every heap ever made, without the lock: heaps are only ever added at the
 * head, each with its next_all set before, and never freed. */
heap_t *heaps_all(void) { return atomic_load_explicit(&all_heaps, memory_order_acquire); }

/* ---- fork ------------------------------------------------------------------------ */

void heaps_fork_prepare(void)
{
    pthread_mutex_lock(&orphans_drain_lock);
    pthread_mutex_lock(&heaps_lock);
    superslab_fork_prepare();
}

void heaps_fork_parent(void)
{
    superslab_fork_parent();
    pthread_mutex_unlock(&heaps_lock);
    pthread_mutex_unlock(&orphans_drain_lock);
}

/* A heap whose thread the fork left behind may have been caught inside a
 * free's fast path, between the drop of a slab's used count to zero and
 * the slow path that takes it from there (slab_used_drop): a slab at 0
 * that the heap does not count as kept, its block on no list. The child
 * then found the kept bytes short when the slab went back into use (an
 * assertion in the debug build: test_threads' fork test, 1 run in 20 with
 * other tests beside it). Its accounts are made whole: a current slab at
 * 0 counts as kept, as the slow path would have kept it, and another slab
 * at 0 holds that block for good (lost to the child, as any block a fork
 * catches in flight). */
static void heap_fork_repair(heap_t *h)
{
    size_t kept = 0;
    for (slab_t *s = h->spares; s; s = s->next)
        kept += slab_touched_bytes(s);
    for (unsigned c = 0; c < CLASS_COUNT; c++) {
        slab_t *cur = h->cur[c], *first = h->owned[c];
        if (cur && (cur->used == 0 || cur->parked))
            kept += slab_touched_bytes(cur);
        for (slab_t *s = first; s; s = s->next == first ? NULL : s->next)
            if (s->used == 0)
                s->used = 1;
    }
    h->kept_empty_bytes = kept;
}

/* In the child only the forking thread survives. The other threads' heaps
 * become orphans that the child can take over, unless the fork caught one
 * in the middle of a list update: that one is left alone (its memory is
 * lost to the child, never corrupted). */
void heaps_fork_child(void)
{
    superslab_fork_child();
    for (heap_t *h = all_heaps; h; h = h->next_all) {
        if (h->state != HEAP_LIVE || h == hak_tl_heap)
            continue;
        if (atomic_load_explicit(&h->in_slow, memory_order_relaxed)) {
            h->state = HEAP_DEAD;
        } else {
            /* A mid malloc or free caught by the fork leaves the cache as
             * a tiny one would (a block lost at worst); its mark would
             * keep the child's purger off the heap for good. */
            atomic_store_explicit(&h->mid_busy, false, memory_order_relaxed);
            heap_fork_repair(h);
            heap_push_orphan_locked(h);
        }
    }
    pthread_mutex_unlock(&heaps_lock);
    pthread_mutex_unlock(&orphans_drain_lock);
}

/* The key whose destructor orphans an exiting thread's heap. Made before
 * init says it is ready: a thread that made its heap before the key
 * existed would have none set, and its heap would stay live with no
 * thread for good (musl, whose pthread_atfork allocates, left init's
 * window open long enough for threads starting together). */
void heaps_key_init(void (*before_orphaning)(void))
{
    thread_exit_first = before_orphaning;
    if (pthread_key_create(&heap_key, heap_thread_exit) == 0)
        atomic_store_explicit(&heap_key_ready, true, memory_order_release);
    if (hak_tl_heap != &hak_empty_heap)
        pthread_setspecific(heap_key, hak_tl_heap);
}

void heaps_fork_init(void) { pthread_atfork(heaps_fork_prepare, heaps_fork_parent, heaps_fork_child); }

/* The heaps' part of a purge pass: the orphans first (what they give back
 * joins the SuperSlabs' purges in the same pass), then the threads' mid
 * caches, every one of them with force. */
uint64_t heaps_purge(bool force)
{
    uint64_t orphans_due = heaps_drain_orphans();
    uint64_t mid_due = heaps_flush_mid(force);
    return due_earlier(due_earlier(orphans_due, mid_due), heaps_mesh_loose());
}

/* The calling thread is inside a list update or a mid section of its
 * heap (heap_mid_enter), where starting the purger thread, which
 * allocates, must wait (purger_notify). Threads without a heap of their
 * own mark the shared hak_empty_heap on their way to one, which says
 * nothing of the caller. */
bool heap_caller_busy(void)
{
    heap_t *heap = heap_get();
    return atomic_load_explicit(&heap->in_slow, memory_order_relaxed) ||
           (heap != &hak_empty_heap && atomic_load_explicit(&heap->mid_busy, memory_order_relaxed));
}

/* Every block of heap's front goes back to its arena, and the limits
 * start over. By the owner, or by the purger under its claim. */
void arena_front_flush(heap_t *heap)
{
    for (unsigned bin = 0; bin < ARENA_FRONT_EXACT_BINS; bin++)
        while (*heap_arena_bin(heap, bin))
            arena_free(arena_front_pop(heap, bin), "free");
    for (unsigned k = 0; k < ARENA_FRONT_CLASS_BINS; k++)
        while (heap->arena_class_count[k])
            arena_free(arena_class_pop(heap, k), "free");
    memset(heap->arena_front_limit, 0, sizeof heap->arena_front_limit);
    heap->arena_front_limits_bytes = 0;
}
