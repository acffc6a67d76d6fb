/* The OS layer: the only file that maps, unmaps and purges memory, reads
 * /proc or runs membarrier. Everything here is raw syscalls or libc
 * wrappers that never call malloc. None is a cancellation point: glibc's
 * open, read, close, write and getrandom act on a pending
 * pthread_cancel, and a thread cancelled inside malloc, free or its exit's
 * hand-back would leave hakmem's state half changed (the purger marked
 * running with no thread, which unshare then waited for for ever); glibc's
 * own malloc avoids them too. So those calls go through syscall(). */
#define _GNU_SOURCE
#include "os.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <sched.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/auxv.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

/* Linux 5.18's advice for the pages of a program that locked its memory
 * (older C library headers, musl's, lack it; older kernels refuse it). */
/* Linux 5.11's userfaultfd limited to faults in user mode, the one an
 * unprivileged process gets under the default sysctl. */
#ifndef UFFD_USER_MODE_ONLY
#define UFFD_USER_MODE_ONLY 1
#endif

#ifndef MADV_DONTNEED_LOCKED
#define MADV_DONTNEED_LOCKED 24
#endif

/* membarrier's commands (linux/membarrier.h, which musl's headers lack). */
#ifndef MEMBARRIER_CMD_PRIVATE_EXPEDITED
#define MEMBARRIER_CMD_PRIVATE_EXPEDITED (1 << 3)
#define MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED (1 << 4)
#endif

/* Valgrind's memcheck (3.19, Debian 12's) takes only the first old_size bytes of
 * a mapping that mremap moved and grew with MREMAP_FIXED as addressable:
 * a program's writes into the grown part were reported as invalid
 * (memcheck_large, a block reshaped by BigCache). The request tells it
 * the truth; natively it is a few instructions that do nothing. */
#if __has_include(<valgrind/memcheck.h>)
#include <valgrind/memcheck.h>
#define OS_TELL_VALGRIND_MAPPED(p, n) VALGRIND_MAKE_MEM_DEFINED(p, n)
#else
#define OS_TELL_VALGRIND_MAPPED(p, n) ((void)0)
#endif

_Atomic size_t hak_mapped_bytes;
_Atomic size_t hak_mapped_peak;

static void account_mapped(size_t size)
{
    size_t now = atomic_fetch_add_explicit(&hak_mapped_bytes, size, memory_order_relaxed) + size;
    size_t peak = atomic_load_explicit(&hak_mapped_peak, memory_order_relaxed);
    while (now > peak &&
           !atomic_compare_exchange_weak_explicit(&hak_mapped_peak, &peak, now,
                                                  memory_order_relaxed, memory_order_relaxed))
        ;
}

/* The kernel's page, read once: what mincore and statm count in. */
size_t os_kernel_page_size(void)
{
    static _Atomic size_t page; /* threads may race to fill it, with the same value */
    size_t size = atomic_load_explicit(&page, memory_order_relaxed);
    if (!size) {
        size = (size_t)sysconf(_SC_PAGESIZE);
        atomic_store_explicit(&page, size, memory_order_relaxed);
    }
    return size;
}

/* The page hakmem lays out by: the kernel's, or, in a build made to test
 * larger pages on a kernel of 4 KiB ones (HAKMEM_PAGE_SIZE, a multiple of
 * the kernel's: the aarch64 test build takes 64 KiB, as RHEL's and
 * Ampere's kernels run), that one. */
size_t os_page_size(void)
{
#ifdef HAKMEM_PAGE_SIZE
    return HAKMEM_PAGE_SIZE;
#else
    return os_kernel_page_size();
#endif
}

/* The mapping calls keep errno on success and return NULL with errno
 * ENOMEM on failure, which the allocation entry points pass on. */
static void *map_failed(void)
{
    errno = ENOMEM;
    return NULL;
}

void *os_map(size_t size)
{
    if (os_memory_refuses(size))
        return map_failed();
    int saved = errno;
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    errno = saved;
    if (p == MAP_FAILED)
        return map_failed();
    account_mapped(size);
    return p;
}

/* size bytes at `want` exactly, where nothing is mapped yet; NULL else
 * (kernels before 4.17 take MAP_FIXED_NOREPLACE for a hint, so the
 * address is checked). */
static void *map_at(void *want, size_t size, int prot, int flags)
{
    char *p = mmap(want, size, prot, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE | flags, -1, 0);
    if (p == MAP_FAILED)
        return NULL;
    if (p != want) {
        munmap(p, size);
        return NULL;
    }
    return p;
}

/* size bytes at p with p + offset aligned to align, taking no more address
 * space than size on the way, at the start of `window` bytes (at least
 * size) that are free where it can: where the kernel would put size bytes
 * if that is aligned, else at the aligned address whose window ends where
 * the kernel's choice ends, or one of the next few below. The kernel
 * fills the address space from the top down, so what lies below its
 * choice is mostly free. Used where mapping size + align at once was
 * refused: under a limit of address space (ulimit -v). */
#define WINDOW_TRIES 16
static void *map_aligned_within(size_t size, size_t align, size_t offset, size_t window, int prot, int flags)
{
    char *raw = mmap(NULL, size, prot, MAP_PRIVATE | MAP_ANONYMOUS | flags, -1, 0);
    if (raw == MAP_FAILED)
        return NULL;
    if (window == size && (((uintptr_t)raw + offset) & (align - 1)) == 0)
        return raw;
    munmap(raw, size);
    uintptr_t end = (uintptr_t)raw + size, step = align;
    for (int i = 0; i < WINDOW_TRIES && end >= window + offset + step; i++, end -= step) {
        char *want = (char *)(((end - window + offset) & ~(uintptr_t)(align - 1)) - offset);
        char *p = map_at(want, size, prot, flags);
        if (p)
            return p;
    }
    return NULL;
}

/* size bytes at an address p with p + offset aligned to align (a power
 * of two, at least a page): over-map by align and give the ends back, or
 * where that much address space is refused, map_aligned_within. */
static void *map_aligned_at(size_t size, size_t align, size_t offset, int prot, int flags)
{
    if (size + align < size)
        return map_failed();
    int saved = errno;
    char *raw = mmap(NULL, size + align, prot, MAP_PRIVATE | MAP_ANONYMOUS | flags, -1, 0);
    if (raw == MAP_FAILED) {
        char *p = map_aligned_within(size, align, offset, size, prot, flags);
        errno = saved;
        return p ? p : map_failed();
    }
    errno = saved;
    char *p = (char *)((((uintptr_t)raw + offset + align - 1) & ~(uintptr_t)(align - 1)) - offset);
    size_t before = (size_t)(p - raw);
    size_t after = align - before;
    /* An end the kernel does not give back stays address space, untouched. */
    if (before)
        munmap(raw, before);
    if (after)
        munmap(p + size, after);
    return p;
}

void *os_map_aligned_at(size_t size, size_t align, size_t offset)
{
    if (os_memory_refuses(size))
        return map_failed();
    void *p = map_aligned_at(size, align, offset, PROT_READ | PROT_WRITE, 0);
    if (p)
        account_mapped(size);
    return p;
}

/* The page arenas' windows: the first WINDOW_SLOTS windows of their size
 * from WINDOW_DISTANCE below where the kernel mapped when the first was
 * asked for, downward. The kernel maps from the top of the address space
 * down, into the highest gap that fits, so a window there stays free of
 * other mappings until a process has mapped that much more; its address
 * is as random as the kernel's own placement. */
#define WINDOW_DISTANCE ((uintptr_t)64 << 30)
#define WINDOW_SLOTS 128
static _Atomic uintptr_t windows_top;

static void *map_in_far_window(size_t size, size_t align, uintptr_t near)
{
    uintptr_t top = atomic_load_explicit(&windows_top, memory_order_relaxed);
    if (!top) {
        if (near < WINDOW_DISTANCE + (uintptr_t)WINDOW_SLOTS * align)
            return NULL; /* a small address space (aarch64 with 39 bits, say): near windows only */
        top = (near - WINDOW_DISTANCE) & ~(uintptr_t)(align - 1);
        uintptr_t none = 0;
        if (!atomic_compare_exchange_strong_explicit(&windows_top, &none, top, memory_order_relaxed,
                                                     memory_order_relaxed))
            top = none;
    }
    for (uintptr_t slot = 0; slot < WINDOW_SLOTS; slot++) {
        void *p = map_at((void *)(top - slot * align), size, PROT_READ | PROT_WRITE, 0);
        if (p)
            return p;
    }
    return NULL;
}

/* size bytes at the start of a free window of align bytes (larger),
 * aligned to it: far below the kernel's own mappings (NULL where there is
 * no room there, or the kernel places from the bottom up, as under
 * valgrind), or near them, next to its own choice (map_aligned_within).
 * The page arenas map the rest of their window as they grow
 * (os_map_more). */
void *os_map_window(size_t size, size_t align, bool far)
{
    if (os_memory_refuses(size))
        return map_failed();
    int saved = errno;
    void *p = NULL;
    if (far) {
        char *near = mmap(NULL, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (near != MAP_FAILED) {
            munmap(near, size);
            p = map_in_far_window(size, align, (uintptr_t)near);
        }
    } else {
        p = map_aligned_within(size, align, 0, align, PROT_READ | PROT_WRITE, 0);
    }
    errno = saved;
    if (!p)
        return map_failed();
    account_mapped(size);
    return p;
}

/* size bytes more at p, the end of a mapping, where nothing is mapped. */
bool os_map_more(void *p, size_t size)
{
    if (os_memory_refuses(size))
        return false;
    int saved = errno;
    bool done = map_at(p, size, PROT_READ | PROT_WRITE, 0) != NULL;
    errno = saved;
    if (done)
        account_mapped(size);
    return done;
}

/* Address space only (the page arenas): no access and no commit charge
 * until os_commit makes a part of it memory. */
void *os_reserve_aligned(size_t size, size_t align) { return map_aligned_at(size, align, 0, PROT_NONE, MAP_NORESERVE); }

/* Reserved pages become readable and writable (charged to the commit
 * limit then, as any mapping: false where the system refuses). */
bool os_commit(void *p, size_t size)
{
    if (os_memory_refuses(size))
        return false;
    int saved = errno;
    bool done = mprotect(p, size, PROT_READ | PROT_WRITE) == 0;
    errno = saved;
    if (done)
        account_mapped(size);
    return done;
}

/* A reservation goes back, `committed` bytes of it made memory. */
void os_release(void *p, size_t size, size_t committed)
{
    if (os_unmap(p, size))
        atomic_fetch_add_explicit(&hak_mapped_bytes, size - committed, memory_order_relaxed);
}

void *os_map_aligned(size_t size, size_t align) { return os_map_aligned_at(size, align, 0); }

/* Grow a mapping to new_size, in place if the next pages are free, else by
 * moving its pages (no copy) to a fresh address q with q + offset aligned
 * to align. */
void *os_remap_aligned(void *p, size_t old_size, size_t new_size, size_t align, size_t offset,
                       bool (*accept)(const void *range, size_t size))
{
    if (os_memory_refuses(new_size - old_size))
        return map_failed();
    int saved = errno;
    void *q = accept(p, new_size) ? mremap(p, old_size, new_size, 0) : MAP_FAILED;
    if (q == MAP_FAILED) {
        q = os_map_aligned_at(new_size, align, offset);
        if (q && !accept(q, new_size)) {
            os_unmap(q, new_size);
            q = NULL;
        }
        if (q) {
            atomic_fetch_sub_explicit(&hak_mapped_bytes, new_size, memory_order_relaxed);
            if (mremap(p, old_size, new_size, MREMAP_MAYMOVE | MREMAP_FIXED, q) == MAP_FAILED) {
                os_unmap(q, new_size);
                atomic_fetch_add_explicit(&hak_mapped_bytes, new_size, memory_order_relaxed);
                q = MAP_FAILED;
            } else {
                OS_TELL_VALGRIND_MAPPED((char *)q + old_size, new_size - old_size);
            }
        } else {
            q = MAP_FAILED;
        }
    }
    errno = saved;
    if (q == MAP_FAILED)
        return map_failed();
    account_mapped(new_size - old_size);
    return q;
}

/* munmap splits a mapping to unmap a part of it (or a block the kernel
 * merged with its neighbours), and refuses (ENOMEM) where the process is
 * at its limit of mappings (vm.max_map_count). The range is then purged:
 * its pages go back, its address space stays mapped and counted, as
 * glibc, jemalloc and mimalloc leave theirs (hakmem used to end the
 * program there). Whether the range is gone. */
bool os_unmap(void *p, size_t size)
{
    int saved = errno;
    bool gone = munmap(p, size) == 0;
    errno = saved;
    if (gone) {
        atomic_fetch_sub_explicit(&hak_mapped_bytes, size, memory_order_relaxed);
        return true;
    }
    os_purge(p, size);
    static const char refused[] = "hakmem: munmap refused (the limit of mappings, vm.max_map_count?): purged instead\n";
    if (hak_config.verbose)
        os_write_stderr(refused, sizeof refused - 1);
    return false;
}

/* Give the pages back to the kernel. With MADV_DONTNEED the range reads as
 * zeros afterwards; with MADV_FREE the old contents may stay until the
 * kernel needs the pages (neither matters: purged pages are free). Pages
 * of a program that locked its memory (mlockall) refuse both (EINVAL);
 * MADV_DONTNEED_LOCKED (Linux 5.18) drops them, and they come back locked
 * when touched again.
 *
 * Only the whole pages inside the range go back. The page arenas count
 * 4 KiB pages: on a kernel of 16 or 64 KiB pages a range may begin or end
 * inside one of the kernel's, whose other bytes belong to a live block,
 * and madvise would refuse a start inside one and take a length up to the
 * page's end. Those edge bytes stay resident and are cleared instead,
 * where purged pages must read as zeros. */
void os_purge(void *p, size_t size)
{
    uintptr_t page = os_page_size(), from = (uintptr_t)p, to = from + size;
    uintptr_t first = (from + page - 1) & ~(page - 1), last = to & ~(page - 1);
    if (first >= last) {
        first = last = to; /* inside one page: nothing goes back */
    }
    if (os_purged_pages_read_zero()) {
        memset(p, 0, first - from);
        memset((void *)last, 0, to - last);
    }
    if (first == last)
        return;
    int saved = errno;
    void *whole = (void *)first;
    size = last - first;
#ifdef MADV_FREE
    if (hak_config.purge_advice == PURGE_FREE && madvise(whole, size, MADV_FREE) == 0) {
        errno = saved;
        return;
    }
#endif
    if (madvise(whole, size, MADV_DONTNEED) != 0 && errno == EINVAL)
        madvise(whole, size, MADV_DONTNEED_LOCKED);
    errno = saved;
}

/* Whether purged pages read back as zeros (MADV_DONTNEED): with MADV_FREE
 * they may keep their old contents until the kernel takes them. */
bool os_purged_pages_read_zero(void) { return hak_config.purge_advice == PURGE_DONTNEED; }

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23 /* Linux 5.14 */
#endif

/* Fault the pages in with one call; older kernels refuse, and the pages
 * then fault on first touch as usual. */
void os_prefault(void *p, size_t size)
{
    int saved = errno;
    uintptr_t start = (uintptr_t)p & ~(uintptr_t)(os_page_size() - 1);
    madvise((void *)start, (uintptr_t)p + size - start, MADV_POPULATE_WRITE);
    errno = saved;
}

/* Ask the kernel to back the whole 2 MiB chunks of [p, p + size) with
 * transparent huge pages: one fault and one zeroing per chunk instead of
 * 512 faults. Nothing happens where the system turned them off. */
void os_advise_huge(void *p, size_t size)
{
    int saved = errno;
    madvise(p, size, MADV_HUGEPAGE);
    errno = saved;
}

/* The opposite: 4 KiB pages only, asked before the first touch. Where
 * the system gives huge pages to every mapping (enabled=always), the first
 * touch of a 2 MiB-aligned chunk makes the whole chunk resident. */
void os_advise_small_pages(void *p, size_t size)
{
    int saved = errno;
    madvise(p, size, MADV_NOHUGEPAGE);
    errno = saved;
}

/* Whether the kernel changed the protection: it refuses (ENOMEM) where
 * that splits a mapping of a process at its limit of mappings. */
/* Fresh zero pages at p (p and size page aligned), in place of what was
 * there: writable, or read-only and charged to no commit limit until made
 * writable. Not counted in hak_mapped_bytes: segmap.c's own table. */
bool os_protect(void *p, size_t size, bool accessible)
{
    int saved = errno;
    bool done = mprotect(p, size, accessible ? PROT_READ | PROT_WRITE : PROT_NONE) == 0;
    errno = saved;
    return done;
}

/* ---- meshing's kernel side (mesh.c) ---- */

int os_memfd(const char *name, uint64_t size)
{
    int saved = errno, fd = (int)syscall(SYS_memfd_create, name, MFD_CLOEXEC);
    if (fd >= 0 && syscall(SYS_ftruncate, fd, (off_t)size) != 0) {
        syscall(SYS_close, fd);
        fd = -1;
    }
    errno = saved;
    return fd;
}

int os_userfaultfd(bool user_mode_only, uint64_t features, uint64_t *supported)
{
    int saved = errno;
    int fd = (int)syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK | (user_mode_only ? UFFD_USER_MODE_ONLY : 0));
    struct uffdio_api api = {.api = UFFD_API, .features = features};
    if (fd >= 0 && ioctl(fd, UFFDIO_API, &api) != 0) {
        syscall(SYS_close, fd);
        fd = -1;
    }
    if (fd >= 0 && supported)
        *supported = api.features;
    errno = saved;
    return fd;
}

bool os_uffd_write_protect(int uffd, void *p, size_t size)
{
    int saved = errno;
    struct uffdio_register reg = {.range = {(uintptr_t)p, size}, .mode = UFFDIO_REGISTER_MODE_WP};
    struct uffdio_writeprotect wp = {.range = {(uintptr_t)p, size}, .mode = UFFDIO_WRITEPROTECT_MODE_WP};
    bool done = ioctl(uffd, UFFDIO_REGISTER, &reg) == 0 && ioctl(uffd, UFFDIO_WRITEPROTECT, &wp) == 0;
    errno = saved;
    return done;
}

void os_uffd_write_unprotect(int uffd, void *p, size_t size)
{
    int saved = errno;
    struct uffdio_writeprotect wp = {.range = {(uintptr_t)p, size}, .mode = 0};
    struct uffdio_range range = {(uintptr_t)p, size};
    ioctl(uffd, UFFDIO_WRITEPROTECT, &wp);
    ioctl(uffd, UFFDIO_UNREGISTER, &range);
    errno = saved;
}

void os_uffd_wake(int uffd, void *p, size_t size)
{
    int saved = errno;
    struct uffdio_range range = {(uintptr_t)p, size};
    ioctl(uffd, UFFDIO_WAKE, &range);
    errno = saved;
}

bool os_map_file_fixed(void *p, size_t size, int fd, uint64_t offset)
{
    int saved = errno;
    bool done = mmap(p, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, (off_t)offset) != MAP_FAILED;
    errno = saved;
    return done;
}

bool os_map_anon_fixed(void *p, size_t size)
{
    int saved = errno;
    bool done = mmap(p, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) != MAP_FAILED;
    errno = saved;
    return done;
}

bool os_pwrite(int fd, const void *buf, size_t size, uint64_t offset)
{
    int saved = errno;
    bool done = syscall(SYS_pwrite64, fd, buf, size, (off_t)offset) == (long)size;
    errno = saved;
    return done;
}

void os_punch_hole(int fd, uint64_t offset, uint64_t size)
{
    int saved = errno;
    syscall(SYS_fallocate, fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)offset, (off_t)size);
    errno = saved;
}

/* 64 random bits from getrandom; where it fails (no entropy yet, a seccomp
 * filter) the kernel's AT_RANDOM bytes mixed with the clock and a counter. */
uint64_t os_random(void)
{
    uint64_t v;
    if (syscall(SYS_getrandom, &v, sizeof v, GRND_NONBLOCK) == (long)sizeof v)
        return v;
    static _Atomic uint64_t calls;
    v = 0;
    const void *random = (const void *)getauxval(AT_RANDOM);
    if (random)
        memcpy(&v, random, sizeof v);
    v ^= os_now_ns() + atomic_fetch_add_explicit(&calls, 0x9e3779b97f4a7c15u, memory_order_relaxed);
    v = (v ^ (v >> 30)) * 0xbf58476d1ce4e5b9u; /* splitmix64's finalizer */
    v = (v ^ (v >> 27)) * 0x94d049bb133111ebu;
    return v ^ (v >> 31);
}

uint64_t os_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

uint64_t os_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Bytes of [p, p + size) resident now (mincore), p page-aligned. */
size_t os_resident_bytes(const void *p, size_t size)
{
    int saved = errno;
    size_t page = os_kernel_page_size(), resident = 0;
    unsigned char vec[256];
    for (size_t off = 0; off < size; off += sizeof vec * page) {
        size_t len = size - off < sizeof vec * page ? size - off : sizeof vec * page;
        if (mincore((char *)p + off, len, vec) != 0)
            break;
        for (size_t i = 0; i < (len + page - 1) / page; i++)
            resident += vec[i] & 1;
    }
    errno = saved;
    return resident * page;
}

void os_write_stderr(const char *s, size_t n)
{
    int saved = errno;
    while (n > 0) {
        ssize_t w = syscall(SYS_write, STDERR_FILENO, s, n);
        if (w <= 0) {
            if (w < 0 && errno == EINTR)
                continue;
            break;
        }
        s += w;
        n -= (size_t)w;
    }
    errno = saved;
}

/* Read a /proc file into buf (NUL-terminated); its length, 0 on failure. */
static size_t read_proc(const char *path, char *buf, size_t size)
{
    int saved = errno;
    int fd = (int)syscall(SYS_openat, AT_FDCWD, path, O_RDONLY | O_CLOEXEC);
    ssize_t n = fd >= 0 ? syscall(SYS_read, fd, buf, size - 1) : -1;
    if (fd >= 0)
        syscall(SYS_close, fd);
    errno = saved;
    if (n <= 0)
        return 0;
    buf[n] = 0;
    return (size_t)n;
}

/* Whether the calling thread runs under a seccomp filter, which may kill
 * the process for a system call outside its list: OpenSSH's
 * pre-authentication sandbox, for one, kills on clone and membarrier, and
 * a global preload of hakmem into sshd would have ended every login. Read
 * from /proc/thread-self/status; where it cannot be read (that sandbox
 * refuses open, with EACCES), assumed so. A filter is never removed, so a
 * thread found filtered stays so, and so does a child it forks. Asked
 * before the calls that filters list least (starting the purger thread,
 * membarrier), which are rare; an open is what nearly every filter lets
 * through or refuses without a kill. */
static HAK_TLS bool thread_filtered;

bool os_thread_filtered(void)
{
    if (thread_filtered)
        return true;
    char text[4096];
    const char *mode = read_proc("/proc/thread-self/status", text, sizeof text) ? strstr(text, "\nSeccomp:") : NULL;
    if (mode)
        mode += strspn(mode + strlen("\nSeccomp:"), " \t") + strlen("\nSeccomp:");
    thread_filtered = !mode || *mode != '0';
    return thread_filtered;
}

/* The CPUs the process may run on, at least 1 (sched_getaffinity: sysconf
 * reads /sys with opendir, which allocates, and this runs inside init). */
unsigned os_cpu_count(void)
{
    cpu_set_t cpus;
    int saved = errno;
    int count = sched_getaffinity(0, sizeof cpus, &cpus) == 0 ? CPU_COUNT(&cpus) : 1;
    errno = saved;
    return count < 1 ? 1 : (unsigned)count;
}

/* A copy of fd with a number from min_fd up, closed on exec; -1 if none. */
int os_dup(int fd, int min_fd)
{
    int saved = errno;
    int copy = fcntl(fd, F_DUPFD_CLOEXEC, min_fd); /* a cancellation point only with F_SETLKW */
    errno = saved;
    return copy < 0 ? -1 : copy;
}

/* A copy of fd numbered out of the way of the numbers a program counts
 * on: from 100 up, or under a lower limit of descriptors (ulimit -n 64)
 * from the upper half of what it allows; -1 if none. */
int os_dup_aside(int fd)
{
    int copy = os_dup(fd, 100);
    long files = os_files_limit();
    if (copy < 0 && files > 6 && files <= 100)
        copy = os_dup(fd, (int)files / 2);
    return copy;
}

/* A file at path, created or emptied, to write the report into. Unlike
 * every other call here it leaves errno as the kernel set it on failure:
 * the caller says why. */
int os_create(const char *path)
{
    int saved = errno;
    int fd = (int)syscall(SYS_openat, AT_FDCWD, path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd >= 0)
        errno = saved;
    return fd < 0 ? -1 : fd;
}

int os_open_read(const char *path) { return (int)syscall(SYS_openat, AT_FDCWD, path, O_RDONLY | O_CLOEXEC); }

long os_read(int fd, void *buf, size_t size) { return (long)syscall(SYS_read, fd, buf, size); }

long os_pread(int fd, void *buf, size_t size, uint64_t offset)
{
    return (long)syscall(SYS_pread64, fd, buf, size, (off_t)offset);
}

void os_close(int fd) { syscall(SYS_close, fd); }

int os_pid(void) { return (int)syscall(SYS_getpid); }
/* -1 under a seccomp filter, which may kill for getppid (the tests' does,
 * as a sandbox listing only what it expects would): a report written
 * there (HAKMEM_STATS=1 at exit) must not end the process. */
int os_parent_pid(void) { return os_thread_filtered() ? -1 : (int)syscall(SYS_getppid); }
/* The program's name as it was started, kept before main runs: a
 * program that sets its process title (redis-server) writes over argv[0],
 * where program_invocation_short_name points, and its report's name and
 * HAKMEM_PROFILE_FILE's %e became "redis-server 127.0.0.1:6379". */
static char program_name[64];

void os_keep_program_name(void)
{
    const char *name = program_invocation_short_name;
    size_t n = name ? strnlen(name, sizeof program_name - 1) : 0;
    memcpy(program_name, name, n);
    program_name[n] = 0;
}

const char *os_program_name(void) { return program_name[0] ? program_name : program_invocation_short_name; }

/* The limit of descriptors of the process (RLIMIT_NOFILE's soft one), 0
 * if unknown. */
long os_files_limit(void)
{
    struct rlimit files;
    int saved = errno;
    long limit = getrlimit(RLIMIT_NOFILE, &files) == 0 ? (long)files.rlim_cur : 0;
    errno = saved;
    return limit;
}

/* Which file fd names (os_file_is compares); false if fd names none. */
bool os_file_id(int fd, os_file_id_t *id)
{
    struct stat st;
    int saved = errno;
    bool named = fstat(fd, &st) == 0;
    errno = saved;
    if (named)
        *id = (os_file_id_t){(uint64_t)st.st_dev, (uint64_t)st.st_ino};
    return named;
}

/* Whether fd still names the file id was taken from. */
bool os_file_is(int fd, const os_file_id_t *id)
{
    os_file_id_t now;
    return fd >= 0 && os_file_id(fd, &now) && now.dev == id->dev && now.ino == id->ino;
}

/* The kernel's id of the calling thread, and whether a thread of this
 * process with that id is still counted by the kernel (a dying thread
 * stays in the thread group a moment after its last instruction). */
int os_thread_id(void) { return (int)syscall(SYS_gettid); }

bool os_thread_alive(int tid)
{
    int saved = errno;
    bool alive = syscall(SYS_tgkill, getpid(), tid, 0) == 0;
    errno = saved;
    return alive;
}

/* unshare and setns themselves: hakmem's exported wrappers (purger.c)
 * stop the purger thread first. */
int os_unshare(int flags) { return (int)syscall(SYS_unshare, flags); }
int os_setns(int fd, int nstype) { return (int)syscall(SYS_setns, fd, nstype); }

/* The claims of a heap's caches (BigCache's front, the mid classes' frees)
 * put the whole barrier on the claimer's side: membarrier runs a full
 * barrier on every CPU that runs one of our threads. It needs the process
 * registered (again in a fork child); where the kernel refuses (old
 * kernels, seccomp filters), nothing is claimed and those caches are off. */
bool hak_claims_on;

void os_membarrier_init(void)
{
    hak_claims_on = !thread_filtered && syscall(SYS_membarrier, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED, 0, 0) == 0;
}

bool os_membarrier(void)
{
    return !os_thread_filtered() && syscall(SYS_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0, 0) == 0;
}

/* Resident set size now, from /proc/self/statm (second field, in pages). */
size_t os_rss_bytes(void)
{
    char buf[128];
    if (!read_proc("/proc/self/statm", buf, sizeof buf))
        return 0;
    const char *s = buf;
    while (*s && *s != ' ')
        s++;
    size_t pages = 0;
    while (*s == ' ')
        s++;
    while (*s >= '0' && *s <= '9')
        pages = pages * 10 + (size_t)(*s++ - '0');
    return pages * os_page_size();
}

/* The peak resident set (VmHWM in /proc/self/status). */
size_t os_rss_peak_bytes(void)
{
    char buf[2048];
    if (!read_proc("/proc/self/status", buf, sizeof buf))
        return 0;
    const char *s = strstr(buf, "VmHWM:");
    if (!s)
        return 0;
    s += 6;
    while (*s == ' ' || *s == '\t')
        s++;
    size_t kib = 0;
    while (*s >= '0' && *s <= '9')
        kib = kib * 10 + (size_t)(*s++ - '0');
    return kib << 10;
}

void os_page_faults(uint64_t *minor, uint64_t *major)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    *minor = (uint64_t)ru.ru_minflt;
    *major = (uint64_t)ru.ru_majflt;
}
