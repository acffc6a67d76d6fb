/* What the kernel gives meshing (docs/architecture.md, "Not built yet"):
 * whether a write to a page waits while the page is copied into a memfd
 * page and that page is mapped over it, under a userfaultfd write
 * protection, for a store and for a read() into the page, with a full
 * userfaultfd (root, CAP_SYS_PTRACE or vm.unprivileged_userfaultfd=1)
 * and with UFFD_USER_MODE_ONLY (any process, Linux 5.11 on); then what
 * meshing a pair of pages costs and how many mappings it leaves.
 * Build and run: gcc -O1 -pthread scripts/mesh_probe.c -o /tmp/mesh_probe
 * && /tmp/mesh_probe */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static long page_size;
static char *page;
static int pipe_fd[2];

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static int uffd_open(int mode_flags)
{
    int uffd = (int)syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK | mode_flags);
    struct uffdio_api api = {.api = UFFD_API, .features = UFFD_FEATURE_PAGEFAULT_FLAG_WP};
    if (uffd < 0 || ioctl(uffd, UFFDIO_API, &api) != 0)
        return -1;
    return uffd;
}

static int uffd_protect(int uffd, void *at, size_t len, int register_too)
{
    struct uffdio_register reg = {.range = {(unsigned long)at, len}, .mode = UFFDIO_REGISTER_MODE_WP};
    struct uffdio_writeprotect wp = {.range = {(unsigned long)at, len}, .mode = UFFDIO_WRITEPROTECT_MODE_WP};
    if (register_too && ioctl(uffd, UFFDIO_REGISTER, &reg) != 0)
        return -1;
    return ioctl(uffd, UFFDIO_WRITEPROTECT, &wp);
}

static void *store_into_page(void *arg)
{
    (void)arg;
    double start = now();
    page[100] = 'S';
    printf("  a store: done after %.1f ms\n", (now() - start) * 1e3);
    return NULL;
}

static void *read_into_page(void *arg)
{
    (void)arg;
    double start = now();
    ssize_t n = read(pipe_fd[0], page + 200, 5);
    printf("  a read() into the page: %s after %.1f ms\n", n == 5 ? "done" : strerror(errno), (now() - start) * 1e3);
    return NULL;
}

/* Two threads write the protected page; 50 ms later it is meshed. */
static void barrier(const char *what, int mode_flags)
{
    printf("%s:\n", what);
    int uffd = uffd_open(mode_flags);
    if (uffd < 0) {
        printf("  userfaultfd refused: %s\n", strerror(errno));
        return;
    }
    page = mmap(NULL, (size_t)page_size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    memset(page, 'a', (size_t)page_size);
    if (uffd_protect(uffd, page, (size_t)page_size, 1) != 0) {
        printf("  write protection refused: %s\n", strerror(errno));
        return;
    }
    if (pipe(pipe_fd) != 0 || write(pipe_fd[1], "hello", 5) != 5)
        return;
    pthread_t store, reader;
    pthread_create(&store, NULL, store_into_page, NULL);
    pthread_create(&reader, NULL, read_into_page, NULL);
    usleep(50000);
    int fd = memfd_create("mesh", MFD_CLOEXEC);
    if (fd < 0 || ftruncate(fd, page_size) != 0)
        return;
    char *shared = mmap(NULL, (size_t)page_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    memcpy(shared, page, (size_t)page_size);
    mmap(page, (size_t)page_size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0);
    struct uffdio_range wake = {(unsigned long)page, (unsigned long)page_size};
    ioctl(uffd, UFFDIO_WAKE, &wake);
    pthread_join(store, NULL);
    pthread_join(reader, NULL);
    printf("  the meshed page holds the store: %s, the read: %s\n", shared[100] == 'S' ? "yes" : "no",
           memcmp(shared + 200, "hello", 5) == 0 ? "yes" : "no");
    munmap(shared, (size_t)page_size);
    munmap(page, (size_t)page_size);
    close(fd);
    close(uffd);
    close(pipe_fd[0]);
    close(pipe_fd[1]);
}

/* PAIRS pairs of pages meshed: both protected, each's half copied into a
 * memfd page, which is mapped over both, the waiters woken. */
static void cost(void)
{
    enum { PAIRS = 2000 };
    size_t ps = (size_t)page_size, len = 2 * PAIRS * ps;
    int uffd = uffd_open(UFFD_USER_MODE_ONLY), fd = memfd_create("mesh", MFD_CLOEXEC);
    char *a = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (uffd < 0 || fd < 0 || ftruncate(fd, (off_t)(PAIRS * ps)) != 0)
        return;
    memset(a, 1, len);
    struct uffdio_register reg = {.range = {(unsigned long)a, len}, .mode = UFFDIO_REGISTER_MODE_WP};
    if (ioctl(uffd, UFFDIO_REGISTER, &reg) != 0)
        return;
    char *m = mmap(NULL, PAIRS * ps, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    double start = now();
    for (size_t i = 0; i < PAIRS; i++) {
        char *x = a + 2 * i * ps, *y = x + ps;
        uffd_protect(uffd, x, 2 * ps, 0);
        memcpy(m + i * ps, x, ps / 2);
        memcpy(m + i * ps + ps / 2, y + ps / 2, ps / 2);
        mmap(x, ps, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, (off_t)(i * ps));
        mmap(y, ps, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, (off_t)(i * ps));
        struct uffdio_range wake = {(unsigned long)x, 2 * ps};
        ioctl(uffd, UFFDIO_WAKE, &wake);
    }
    double took = now() - start;
    char line[256];
    int maps = 0;
    FILE *f = fopen("/proc/self/maps", "r");
    while (f && fgets(line, sizeof line, f))
        maps++;
    printf("meshing a pair of pages: %.1f us (%d pairs); the process has %d mappings after\n", took / PAIRS * 1e6,
           PAIRS, maps);
}

int main(void)
{
    page_size = sysconf(_SC_PAGESIZE);
    barrier("a full userfaultfd", 0);
    barrier("UFFD_USER_MODE_ONLY", UFFD_USER_MODE_ONLY);
    cost();
    return 0;
}
