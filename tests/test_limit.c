/* The memory limit (limit.c): a program that frees 40 MiB of blocks of
 * one tier and allocates 40 MiB of another, three times over, peaks at
 * about 120 MiB of resident memory while the freed pages wait for the
 * purge delay (10 s here). With HAKMEM_MEMORY_LIMIT=64M it peaks under
 * the limit, every block of the three phases served, and blocks kept past
 * the limit fail with ENOMEM instead of killing the process. In a memory
 * cgroup of 64 MiB made for the test (where the test may make one: root,
 * cgroup v1's memory controller or v2's), the default run reads the
 * cgroup's limit and completes, where a run told to ignore it
 * (HAKMEM_MEMORY_LIMIT=1T) is killed by the kernel's OOM killer. */
#define _GNU_SOURCE
#include "check.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define MiB ((size_t)1 << 20)
#define LIMIT (64 * MiB)

static size_t status_kib(const char *key)
{
    char line[256];
    size_t kib = 0, n = strlen(key);
    FILE *f = fopen("/proc/self/status", "r");
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, key, n))
            kib = strtoul(line + n, NULL, 10);
    if (f)
        fclose(f);
    return kib;
}

static void *touched(size_t size)
{
    char *p = malloc(size);
    if (p)
        memset(p, 1, size);
    return p;
}

/* 40 MiB of a size, touched, then freed. */
static bool phase(size_t size)
{
    size_t count = 40 * MiB / size;
    void **blocks = calloc(count, sizeof *blocks);
    bool all = blocks != NULL;
    for (size_t i = 0; all && i < count; i++)
        all = (blocks[i] = touched(size)) != NULL && hak_owns(blocks[i]);
    for (size_t i = 0; blocks && i < count; i++)
        free(blocks[i]);
    free(blocks);
    return all;
}

/* What the report names as the limit's source: 1 the option, 2 a cgroup,
 * 0 no limit. */
static int report_source(void)
{
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (!f)
        return -1;
    hak_stats_print(f);
    fclose(f);
    const char *line = strstr(text, "  memory limit  ");
    int source = !line ? 0 : strstr(line, "MiB, from HAKMEM_MEMORY_LIMIT\n") ? 1
                             : strstr(line, "MiB, from the cgroup /sys/fs/cgroup") ? 2 : -1;
    free(text);
    return source;
}

/* The child: the phases, then 1 MiB blocks kept until one fails (up to
 * `fill`). Prints "served kept failed_with_enomem peak_kib source". */
static int workload(int fill)
{
    bool served = phase(256 << 10) && phase(4 * MiB) && phase(512);
    static void *kept[256];
    int n = 0;
    errno = 0;
    while (n < fill && (kept[n] = touched(MiB)) != NULL)
        n++;
    bool enomem = n < fill && errno == ENOMEM;
    size_t peak = status_kib("VmHWM:");
    for (int i = 0; i < n; i++)
        free(kept[i]);
    printf("%d %d %d %zu %d\n", served, n, enomem, peak, report_source());
    return 0;
}

typedef struct outcome {
    int status;
    int served, kept, enomem;
    size_t peak_kib;
    int source; /* report_source */
} outcome_t;

/* The workload in a fresh process: with the limit option when not NULL,
 * moved into the cgroup directory when not NULL. */
static outcome_t run(const char *limit, const char *cgroup, int fill)
{
    outcome_t o = {0};
    int out[2];
    if (pipe(out) != 0)
        return o;
    pid_t pid = fork();
    if (pid == 0) {
        dup2(out[1], STDOUT_FILENO);
        if (cgroup) {
            char path[512], pid_text[32];
            snprintf(path, sizeof path, "%s/cgroup.procs", cgroup);
            int fd = open(path, O_WRONLY);
            int n = snprintf(pid_text, sizeof pid_text, "%d", (int)getpid());
            if (fd < 0 || write(fd, pid_text, (size_t)n) != n)
                _exit(97);
            close(fd);
        }
        if (limit)
            setenv("HAKMEM_MEMORY_LIMIT", limit, 1);
        setenv("HAKMEM_PURGE_DELAY_MS", "10000", 1);
        char fill_text[16];
        snprintf(fill_text, sizeof fill_text, "%d", fill);
        exec_self((char *[]){"test_limit", "--workload", fill_text, NULL});
        _exit(99);
    }
    close(out[1]);
    char text[256];
    read_to_end(out[0], text, sizeof text);
    waitpid(pid, &o.status, 0);
    o.source = -2;
    sscanf(text, "%d %d %d %zu %d", &o.served, &o.kept, &o.enomem, &o.peak_kib, &o.source);
    return o;
}

static bool write_file(const char *dir, const char *name, const char *value)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    int fd = open(path, O_WRONLY);
    if (fd < 0)
        return false;
    bool ok = write(fd, value, strlen(value)) == (ssize_t)strlen(value);
    close(fd);
    return ok;
}

/* A child memory cgroup of 64 MiB without swap, in dir; NULL and why not
 * where the test may not make one. */
static const char *make_cgroup(char *dir, size_t size)
{
    char text[1024] = {0};
    FILE *f = fopen("/proc/self/cgroup", "r");
    if (!f)
        return "no /proc/self/cgroup";
    size_t got = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[got] = 0;
    char limit[32];
    snprintf(limit, sizeof limit, "%zu", LIMIT);
    /* v1's memory controller, else v2 */
    const char *line = strstr(text, ":memory:");
    if (line) {
        size_t n = strcspn(line + 8, "\n");
        snprintf(dir, size, "/sys/fs/cgroup/memory%.*s/hakmem_test_limit_%d", (int)n, line + 8, (int)getpid());
        if (mkdir(dir, 0755) != 0)
            return "cannot make a cgroup v1 memory group here";
        if (!write_file(dir, "memory.limit_in_bytes", limit)) {
            rmdir(dir);
            return "cannot set a v1 memory limit";
        }
        write_file(dir, "memory.memsw.limit_in_bytes", limit); /* absent without swap accounting */
        return NULL;
    }
    line = strstr(text, "0::");
    if (!line)
        return "no cgroup";
    size_t n = strcspn(line + 3, "\n");
    snprintf(dir, size, "/sys/fs/cgroup%.*s/hakmem_test_limit_%d", (int)n, line + 3, (int)getpid());
    if (mkdir(dir, 0755) != 0)
        return "cannot make a cgroup v2 group here";
    if (!write_file(dir, "memory.max", limit)) {
        rmdir(dir);
        return "the memory controller is not enabled for cgroup v2 groups here";
    }
    write_file(dir, "memory.swap.max", "0");
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc == 3 && !strcmp(argv[1], "--workload"))
        return workload(atoi(argv[2]));
    size_t limit_kib = LIMIT >> 10;

    outcome_t limited = run("64M", NULL, 200);
    printf("HAKMEM_MEMORY_LIMIT=64M: phases served %d, then %d MiB kept (ENOMEM %d), peak %zu KiB\n",
           limited.served, limited.kept, limited.enomem, limited.peak_kib);
    CHECK(WIFEXITED(limited.status) && WEXITSTATUS(limited.status) == 0);
    CHECK(limited.served);
    CHECK(limited.peak_kib && limited.peak_kib <= limit_kib);
    CHECK(limited.enomem && limited.kept >= 40 && limited.kept <= 64);
    CHECK(limited.source == 1); /* the report's "memory limit 64.00 MiB, from HAKMEM_MEMORY_LIMIT" */

    /* The same without a limit: the freed pages wait, the peak passes it. */
    outcome_t free_run = run(NULL, NULL, 0);
    printf("no limit: phases served %d, peak %zu KiB\n", free_run.served, free_run.peak_kib);
    CHECK(WIFEXITED(free_run.status) && free_run.served);
    CHECK(free_run.source == 0 || free_run.source == 2); /* this machine's cgroup may have a limit */
    CHECK(free_run.peak_kib > limit_kib + 16 * 1024);

    char dir[512];
    const char *why = make_cgroup(dir, sizeof dir);
    if (why) {
        printf("cgroup runs skipped: %s\n", why);
    } else {
        outcome_t in_cgroup = run(NULL, dir, 200);
        printf("in a cgroup of 64 MiB: status %#x, phases served %d, then %d MiB kept (ENOMEM %d), peak %zu KiB\n",
               in_cgroup.status, in_cgroup.served, in_cgroup.kept, in_cgroup.enomem, in_cgroup.peak_kib);
        CHECK(WIFEXITED(in_cgroup.status) && WEXITSTATUS(in_cgroup.status) == 0);
        CHECK(in_cgroup.served && in_cgroup.enomem);
        CHECK(in_cgroup.source == 2);
        outcome_t ignored = run("1T", dir, 200);
        printf("in it, the limit ignored (HAKMEM_MEMORY_LIMIT=1T): status %#x\n", ignored.status);
        CHECK(WIFSIGNALED(ignored.status) && WTERMSIG(ignored.status) == SIGKILL);
        rmdir(dir);
    }
    return check_summary("test_limit");
}
