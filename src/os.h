/* Layer 1, the OS contract (os.c): every system call of the library, and
 * the tick clock of sampled timings. */
#ifndef HAKMEM_OS_H
#define HAKMEM_OS_H

#include "config.h"

/* ---- Clock for sampled timings and lifetimes (kpi.c) ------------------ */

/* A cheap monotonic tick: the TSC on x86-64, the virtual counter on
 * aarch64, nanoseconds elsewhere. kpi.c converts ticks to nanoseconds. */
static inline uint64_t hak_ticks(void)
{
#if defined(__x86_64__)
    uint32_t lo, hi;
    __asm__ volatile("rdtsc" : "=a"(lo), "=d"(hi));
    return ((uint64_t)hi << 32) | lo;
#elif defined(__aarch64__)
    uint64_t v;
    __asm__ volatile("mrs %0, cntvct_el0" : "=r"(v));
    return v;
#else
    uint64_t os_now_ns(void);
    return os_now_ns();
#endif
}
/* ---- OS layer (os.c): the contract with the kernel ----------------------- */

/* Every system call of the library goes through these, but for libc's
 * locks, condition waits and sched_yield, and the report's stdio at exit
 * (report.c, on a descriptor os_dup made). Each call:
 * - is no cancellation point (a pending pthread_cancel never stops a
 *   thread inside hakmem) and leaves errno as it found it, but for
 *   os_unshare and os_setns, the program's own calls, which set it as
 *   the kernel says, and a failed os_create, whose caller says why;
 * - never allocates, so it may run inside malloc, before init and in a
 *   fork child;
 * - reports failure by its result, never by ending the program: the
 *   caller decides (an allocation returns NULL with ENOMEM).
 * Sizes and addresses are multiples of the page size unless said.
 * hak_mapped_bytes counts what os_map* mapped and os_unmap gave back. */

/* Mappings: NULL with errno ENOMEM when the kernel refuses (the one
 * change to errno: the allocation entry points pass it on). os_map_aligned* return an
 * address aligned to align (a power of two, at least a page), offset
 * bytes before an aligned one for _at; os_remap_aligned moves or grows
 * a mapping (mremap), its contents kept, to a range that `accept`
 * (the caller's, which may refuse) is told of first. os_map_window
 * maps the start of a free aligned window, and os_map_more the next pages
 * of it, where they are still free. os_reserve_aligned takes address
 * space only (no access, no commit charge); os_commit makes a part of it
 * usable, os_release gives it back. */
void *os_map(size_t size);
void *os_map_window(size_t size, size_t align, bool far);
bool os_map_more(void *p, size_t size);
void *os_reserve_aligned(size_t size, size_t align);
bool os_commit(void *p, size_t size);
void os_release(void *p, size_t size, size_t committed);
void *os_map_aligned(size_t size, size_t align);
void *os_map_aligned_at(size_t size, size_t align, size_t offset);
void *os_remap_aligned(void *p, size_t old_size, size_t new_size, size_t align, size_t offset,
                       bool (*accept)(const void *range, size_t size));
/* limit.c: the memory limit (bytes, 0 for the cgroup's own, if any) is
 * read at init; a mapping of `adding` bytes is refused where the memory
 * in use and it would pass the limit. */
void os_memory_limit_init(size_t bytes);
size_t os_memory_limit(void); /* 0: none */
const char *os_memory_limit_source(void); /* "HAKMEM_MEMORY_LIMIT" or "the cgroup DIR" */
bool os_memory_refuses(size_t adding);
/* Pages already mapped are about to fault in anew: true, every so many
 * bytes, where the memory in use has come near the limit (the caller
 * purges what waits). */
bool os_memory_pressed(size_t bytes);
/* False when the kernel refused (vm.max_map_count): the range is then
 * purged instead, still mapped and counted. */
bool os_unmap(void *p, size_t size);
/* The pages' memory goes back; the range stays mapped and reads as zeros
 * (MADV_DONTNEED) or as zeros or its old contents (HAKMEM_PURGE_ADVICE=
 * free: os_purged_pages_read_zero says which). Locked pages too. */
void os_purge(void *p, size_t size);
bool os_purged_pages_read_zero(void);
void os_prefault(void *p, size_t size);
void os_advise_huge(void *p, size_t size);
void os_advise_small_pages(void *p, size_t size);
bool os_protect(void *p, size_t size, bool accessible);

/* Meshing's kernel side (mesh.c): a memfd of size bytes, sparse (-1 if
 * refused); a userfaultfd with the features asked for (-1 if refused or
 * unknown; *supported: the kernel's), limited to faults in user mode or
 * not; a range's writes made to wait (registered and protected) and let
 * go (the waiters woken, the range unregistered), or its waiters woken;
 * a mapping put over p in one step, shared from the file or a fresh
 * private one; a write of the file, and its pages given back. */
int os_memfd(const char *name, uint64_t size);
int os_userfaultfd(bool user_mode_only, uint64_t features, uint64_t *supported);
bool os_uffd_write_protect(int uffd, void *p, size_t size);
void os_uffd_write_unprotect(int uffd, void *p, size_t size);
void os_uffd_wake(int uffd, void *p, size_t size);
bool os_map_file_fixed(void *p, size_t size, int fd, uint64_t offset);
bool os_map_anon_fixed(void *p, size_t size);
bool os_pwrite(int fd, const void *buf, size_t size, uint64_t offset);
void os_punch_hole(int fd, uint64_t offset, uint64_t size);
bool os_thread_filtered(void);
int os_thread_id(void);
bool os_thread_alive(int tid);
int os_unshare(int flags);
int os_setns(int fd, int nstype);
unsigned os_cpu_count(void);
int os_pid(void);
int os_parent_pid(void);
const char *os_program_name(void); /* the program's file name, without its directory */
void os_keep_program_name(void);   /* before main: the name as started (a process title may overwrite it) */

/* Descriptors, for the report's copy of stderr (report.c), the files
 * whose symbols it reads (symtab.c) and meshing's files (mesh.c). */
typedef struct os_file_id {
    uint64_t dev, ino;
} os_file_id_t;
int os_dup(int fd, int min_fd);
int os_dup_aside(int fd);
int os_create(const char *path); /* a new or emptied file to write, closed on exec; -1 and errno if not */
int os_open_read(const char *path); /* -1 if it cannot be opened */
long os_read(int fd, void *buf, size_t size);
long os_pread(int fd, void *buf, size_t size, uint64_t offset);
void os_close(int fd);
long os_files_limit(void);
bool os_file_id(int fd, os_file_id_t *id);
bool os_file_is(int fd, const os_file_id_t *id);
void os_membarrier_init(void);
bool os_membarrier(void);
uint64_t os_random(void);
/* The page hakmem lays out by (a build may take a larger one than the
 * kernel's, HAKMEM_PAGE_SIZE), and the kernel's own, which mincore and
 * /proc count in. */
size_t os_page_size(void);
size_t os_kernel_page_size(void);
uint64_t os_now_ms(void);
uint64_t os_now_ns(void);
size_t os_resident_bytes(const void *p, size_t size);
size_t os_rss_peak_bytes(void);
void os_write_stderr(const char *s, size_t n);
size_t os_rss_bytes(void);
void os_page_faults(uint64_t *minor, uint64_t *major);

/* Bytes mapped by hakmem right now, and its peak (os.c). */
extern _Atomic size_t hak_mapped_bytes;
extern _Atomic size_t hak_mapped_peak;
/* os.c: os_membarrier works: caches of other threads can be claimed */
extern bool hak_claims_on;

#endif
