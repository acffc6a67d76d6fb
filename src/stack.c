/* The stack table: the call stack of every sampled allocation, kept once
 * however many samples share it, with what the samples taken there stand
 * for: allocations and bytes allocated, and those still live, estimated
 * from the samples' weights (sample.c). The stacks are unwound by
 * unwind.c, at samples only: an allocation that is not sampled never
 * reaches this file. A stack starts at the program's call into hakmem
 * (the call site the entry point saw); where the walk does not meet that
 * frame, it is the call site alone.
 *
 * The table is mapped at the first sample, for STACKS_FIRST entries and
 * their frames in one pool, and doubles as it fills, up to STACKS_MAX;
 * entry 0 collects the samples of stacks that found no room. Samples are rare (one per
 * HAKMEM_PROFILE_SAMPLE bytes and thread), so one lock guards it. */
#include "profile.h"
#include "init.h"
#include "purger.h"

#include <pthread.h>
#include <string.h>

#define STACKS_FIRST 512   /* entries at the first sample; doubled when full */
#define STACKS_MAX 16384   /* a power of two */
#define FRAMES_PER_STACK 16 /* the frame pool's room, per entry */

static pthread_mutex_t stack_lock = PTHREAD_MUTEX_INITIALIZER;
static stack_entry_t *stacks;  /* NULL until the first sample */
static uint32_t *stack_slots;  /* entry index by hash, 0 for an empty slot */
static uintptr_t *stack_frames;
static uint32_t stacks_used = 1, stacks_capacity; /* slots: twice the capacity (at most half full) */
static size_t frames_used;
static double live_bytes, peak_dumped; /* the profile's live bytes, and their value at the last peak dump */
static HAK_TLS bool unwinding; /* the unwinder's own allocations (it makes none) are not unwound */
static HAK_TLS bool paused;    /* the thread writes a report: its own allocations are not the program's */

/* ---- unwinding ------------------------------------------------------------- */

/* The calling thread's stack from site, the return address of its call
 * into hakmem, on: up to HAKMEM_PROFILE_DEPTH frames into frames (room
 * for STACK_DEPTH_MAX); returns how many. Before init has finished (the
 * loader's and libc's first allocations) and inside a walk (which
 * allocates nothing, but a signal handler's malloc may interrupt it), or
 * where the walk did not meet site, the call site alone. */
static unsigned stack_unwind(uintptr_t site, uintptr_t *frames)
{
    frames[0] = site;
    unsigned max = (unsigned)hak_config.profile_depth;
    if (max <= 1 || unwinding || atomic_load_explicit(&hak_init_state, memory_order_acquire) != 2)
        return 1;
    unwinding = true;
    unsigned depth = unwind_from(site, frames, max);
    unwinding = false;
    if (!depth) {
        frames[0] = site;
        return 1;
    }
    return depth;
}

/* ---- the table ----------------------------------------------------------------- */

/* Under stack_lock: the profile's live bytes changed by delta. Past the
 * last peak dump's by HAKMEM_PROFILE_PEAK, a dump is asked for (written
 * where the thread may allocate: purger_request_job). */
static void live_grew(double delta)
{
    live_bytes += delta;
    if (hak_config.profile_peak && live_bytes > peak_dumped + (double)hak_config.profile_peak) {
        peak_dumped = live_bytes;
        purger_request_job();
    }
}

static uint64_t stack_hash(const uintptr_t *frames, unsigned depth)
{
    uint64_t h = depth;
    for (unsigned i = 0; i < depth; i++)
        h = (h ^ frames[i]) * 0x9e3779b97f4a7c15ull, h ^= h >> 31;
    return h;
}

static size_t entries_bytes(uint32_t capacity) { return capacity * sizeof(stack_entry_t); }
static size_t slots_bytes(uint32_t capacity) { return 2 * capacity * sizeof(uint32_t); }
static size_t frames_bytes(uint32_t capacity) { return (size_t)capacity * FRAMES_PER_STACK * sizeof(uintptr_t); }

static void unmap_table(stack_entry_t *entries, uint32_t *slots, uintptr_t *frames, uint32_t capacity)
{
    if (entries)
        os_unmap(entries, entries_bytes(capacity));
    if (slots)
        os_unmap(slots, slots_bytes(capacity));
    if (frames)
        os_unmap(frames, frames_bytes(capacity));
}

/* Under stack_lock: the table mapped with room for one more entry of
 * depth frames, twice as large as before if it was full (a copy: every
 * reader holds the lock); false if it cannot be. Mapped small and grown,
 * its pages are those it uses: a program that locks its memory
 * (mlockall) makes every mapped page resident. */
static bool stacks_room(unsigned depth)
{
    if (stacks && stacks_used < stacks_capacity &&
        frames_used + depth <= (size_t)stacks_capacity * FRAMES_PER_STACK)
        return true;
    uint32_t capacity = stacks ? 2 * stacks_capacity : STACKS_FIRST;
    if (capacity > STACKS_MAX)
        return false;
    stack_entry_t *entries = os_map(entries_bytes(capacity));
    uint32_t *slots = os_map(slots_bytes(capacity));
    uintptr_t *frames = os_map(frames_bytes(capacity));
    if (!entries || !slots || !frames) {
        unmap_table(entries, slots, frames, capacity);
        return false;
    }
    if (stacks) {
        memcpy(entries, stacks, stacks_used * sizeof *entries);
        memcpy(frames, stack_frames, frames_used * sizeof *frames);
        for (uint32_t i = 1; i < stacks_used; i++) {
            uint32_t slot = (uint32_t)entries[i].hash & (2 * capacity - 1);
            while (slots[slot])
                slot = (slot + 1) & (2 * capacity - 1);
            slots[slot] = i;
        }
        unmap_table(stacks, stack_slots, stack_frames, stacks_capacity);
    }
    stacks = entries;
    stack_slots = slots;
    stack_frames = frames;
    stacks_capacity = capacity;
    return true;
}

/* Under stack_lock: the entry of this stack, added if new; 0 (the bucket
 * of stacks without room) when the table or the pool is full. */
static uint32_t stack_intern(const uintptr_t *frames, unsigned depth)
{
    uint64_t h = stack_hash(frames, depth);
    uint32_t mask = 2 * stacks_capacity - 1;
    for (uint32_t slot = (uint32_t)h & mask;; slot = (slot + 1) & mask) {
        uint32_t i = stack_slots[slot];
        if (!i)
            break;
        const stack_entry_t *e = &stacks[i];
        if (e->hash == h && e->depth == depth && !memcmp(&stack_frames[e->frames], frames, depth * sizeof *frames))
            return i;
    }
    if (!stacks_room(depth))
        return 0;
    mask = 2 * stacks_capacity - 1;
    uint32_t i = stacks_used++;
    stack_entry_t *e = &stacks[i];
    e->hash = h;
    e->depth = depth;
    e->frames = (uint32_t)frames_used;
    memcpy(&stack_frames[frames_used], frames, depth * sizeof *frames);
    frames_used += depth;
    uint32_t slot = (uint32_t)h & mask;
    while (stack_slots[slot])
        slot = (slot + 1) & mask;
    stack_slots[slot] = i;
    return i;
}

/* A sampled allocation of size bytes from site (the return address of
 * the thread's call into hakmem), standing for weight allocations like
 * it: charged to the calling thread's stack, live until stack_freed.
 * Returns the stack's entry, STACK_NONE where the table cannot be mapped. */
uint32_t stack_sample(uintptr_t site, size_t size, float weight)
{
    if (paused)
        return STACK_NONE;
    uintptr_t frames[STACK_DEPTH_MAX];
    unsigned depth = stack_unwind(site, frames);
    pthread_mutex_lock(&stack_lock);
    if (!stacks && !stacks_room(0)) {
        pthread_mutex_unlock(&stack_lock);
        return STACK_NONE;
    }
    uint32_t i = stack_intern(frames, depth);
    stack_entry_t *e = &stacks[i];
    e->allocs += weight;
    e->bytes += (double)size * weight;
    e->live_objects += weight;
    e->live_bytes += (double)size * weight;
    live_grew((double)size * weight);
    if (!e->samples++ || size < e->min_size)
        e->min_size = size;
    if (size > e->max_size)
        e->max_size = size;
    pthread_mutex_unlock(&stack_lock);
    return i;
}

/* A sample of stack i resized from old_size bytes to size, or gone: freed
 * (counted), or untracked (its free will not be seen: a sample whose
 * record could not be kept). Returns the stack's call site, 0 for the
 * bucket of stacks without room. */
enum stack_change { STACK_RESIZED, STACK_FREED, STACK_UNTRACKED };

static uintptr_t stack_change(uint32_t i, size_t old_size, size_t size, float weight, enum stack_change change)
{
    if (i == STACK_NONE)
        return 0;
    pthread_mutex_lock(&stack_lock);
    stack_entry_t *e = &stacks[i];
    e->live_bytes += ((double)size - (double)old_size) * weight;
    live_grew(((double)size - (double)old_size) * weight);
    if (change != STACK_RESIZED)
        e->live_objects -= weight;
    if (change == STACK_FREED)
        e->frees++;
    uintptr_t site = e->depth ? stack_frames[e->frames] : 0;
    pthread_mutex_unlock(&stack_lock);
    return site;
}

uintptr_t stack_freed(uint32_t i, size_t size, float weight) { return stack_change(i, size, 0, weight, STACK_FREED); }

void stack_untracked(uint32_t i, size_t size, float weight) { stack_change(i, size, 0, weight, STACK_UNTRACKED); }

void stack_resized(uint32_t i, size_t old_size, size_t size, float weight)
{
    stack_change(i, old_size, size, weight, STACK_RESIZED);
}

/* While a thread writes a report, its allocations (stdio's buffers, the
 * copies of the tables) are left out of the profile. */
void stack_pause(bool pause) { paused = pause; }

/* How many entries and frames the table holds now (the sizes a copy
 * needs, which may have grown by the time it is taken). */
void stack_table_size(size_t *entries, size_t *frames)
{
    pthread_mutex_lock(&stack_lock);
    *entries = stacks ? stacks_used : 0;
    *frames = stacks ? frames_used : 0;
    pthread_mutex_unlock(&stack_lock);
}

/* Copy up to max_entries entries, whose frames fit in max_frames, into
 * entries and frames (each entry's frames field then indexes the copy's
 * frames); returns how many entries. Entry 0, the bucket of stacks
 * without room, is copied with no frames. */
size_t stack_table_copy(stack_entry_t *entries, size_t max_entries, uintptr_t *frames, size_t max_frames)
{
    pthread_mutex_lock(&stack_lock);
    size_t n = 0, f = 0;
    for (uint32_t i = 0; stacks && i < stacks_used && n < max_entries; i++) {
        const stack_entry_t *e = &stacks[i];
        if (f + e->depth > max_frames)
            break;
        entries[n] = *e;
        entries[n].frames = (uint32_t)f;
        if (!i)
            entries[n].depth = 0;
        memcpy(&frames[f], &stack_frames[e->frames], entries[n].depth * sizeof *frames);
        f += entries[n].depth;
        n++;
    }
    pthread_mutex_unlock(&stack_lock);
    return n;
}

/* What the stacks of each call site add up to, into totals[index_of(the
 * call site)] (sites entries, zeroed by the caller; an index out of
 * range is left out, as is the bucket of stacks without room). */
void stack_sum_by_site(stack_totals_t *totals, size_t sites, unsigned (*index_of)(uintptr_t site))
{
    pthread_mutex_lock(&stack_lock);
    for (uint32_t i = 1; stacks && i < stacks_used; i++) {
        const stack_entry_t *e = &stacks[i];
        unsigned index = index_of(stack_frames[e->frames]);
        if (index >= sites || !e->samples)
            continue;
        stack_totals_t *t = &totals[index];
        t->allocs += e->allocs;
        t->bytes += e->bytes;
        t->live_bytes += e->live_bytes;
        if (!t->samples || e->min_size < t->min_size)
            t->min_size = e->min_size;
        if (e->max_size > t->max_size)
            t->max_size = e->max_size;
        t->samples += e->samples;
        if (!t->max_size || e->min_size < t->min_size)
            t->min_size = e->min_size;
        if (e->max_size > t->max_size)
            t->max_size = e->max_size;
    }
    pthread_mutex_unlock(&stack_lock);
}

void stack_fork_prepare(void)
{
    unwind_fork_prepare();
    pthread_mutex_lock(&stack_lock);
}

void stack_fork_parent(void)
{
    pthread_mutex_unlock(&stack_lock);
    unwind_fork_parent();
}

void stack_fork_child(void)
{
    pthread_mutex_unlock(&stack_lock);
    unwind_fork_child();
}
