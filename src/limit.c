/* The memory limit: HAKMEM_MEMORY_LIMIT bytes of the process's resident
 * memory, or else the limit of the cgroup the process runs in: the
 * nearest of its cgroup and that cgroup's parents that sets one, against
 * that cgroup's use, which is what a container's OOM killer compares
 * (cgroup v2's memory.max and memory.current, or v1's memory controller's
 * memory.limit_in_bytes and memory.usage_in_bytes). Without one, nothing
 * here runs but a test of limit_bytes.
 *
 * Where the memory in use plus a new mapping would pass the limit, the
 * mapping is refused as the kernel refuses one (os.c); the tiers then
 * retry once after the purger gave back at once what waits for the purge
 * delay and what the caches hold (purger_release_caches), and only then
 * fail with ENOMEM. Without this, a process in a container near its limit
 * is killed while hakmem still holds freed pages it would have given
 * back a few hundred milliseconds later.
 *
 * The use is read from the files at each new mapping (a few microseconds;
 * mappings come a SuperSlab, an arena's commit or a large block at a
 * time, each of which faults in far more). Pages already mapped that the
 * program touches again after a purge pass unchecked: they count at the
 * next mapping. */
#define _GNU_SOURCE
#include "os.h"

#include <string.h>

#define CGROUP_ROOT "/sys/fs/cgroup"

static size_t limit_bytes;   /* 0: no limit */
static char usage_path[320]; /* the cgroup's memory.current; "": the process's resident memory */
static char stat_path[320];  /* the cgroup's memory.stat */
static const char *inactive_key; /* its line of inactive file pages */
static char source[256];         /* what set the limit, for the report */

/* a then b into out (size bytes); false if they do not fit. */
static bool join(char *out, size_t size, const char *a, const char *b)
{
    size_t n = strlen(a), m = strlen(b);
    if (n + m + 1 > size)
        return false;
    memcpy(out, a, n);
    memcpy(out + n, b, m + 1);
    return true;
}

/* The first number in the file at path, or the word "max" (*max set);
 * false if the file cannot be read or holds neither. */
static bool read_number(const char *path, uint64_t *value, bool *max)
{
    char text[64];
    int fd = os_open_read(path);
    if (fd < 0)
        return false;
    long got = os_read(fd, text, sizeof text - 1);
    os_close(fd);
    if (got <= 0)
        return false;
    text[got] = 0;
    if (max)
        *max = !strncmp(text, "max", 3);
    if (max && *max)
        return true;
    uint64_t v = 0;
    const char *c = text;
    while (*c == ' ')
        c++;
    if (*c < '0' || *c > '9')
        return false;
    for (; *c >= '0' && *c <= '9'; c++)
        v = v * 10 + (uint64_t)(*c - '0');
    *value = v;
    return true;
}

/* The process's directory in the cgroup hierarchy of a line of
 * /proc/self/cgroup: "0::/path" for cgroup v2 (controllers ""), or
 * "N:memory,...:/path" for the memory controller of cgroup v1, under root
 * into dir; false without one. */
static bool cgroup_dir(const char *text, bool v1, const char *root, char *dir, size_t size)
{
    for (const char *line = text; line && *line; line = (line = strchr(line, '\n')) ? line + 1 : NULL) {
        const char *controllers = strchr(line, ':'), *path = controllers ? strchr(controllers + 1, ':') : NULL;
        if (!path)
            return false;
        controllers++;
        size_t listed = (size_t)(path - controllers);
        bool memory = false;
        for (const char *c = controllers; c < path; c += strcspn(c, ",:") + 1)
            memory |= !strncmp(c, "memory", 6) && (c[6] == ',' || c[6] == ':');
        if (v1 ? !memory : listed != 0)
            continue;
        path++;
        size_t n = strcspn(path, "\n"), r = strlen(root);
        if (r + n + 1 > size)
            return false;
        memcpy(dir, root, r);
        memcpy(dir + r, path, n);
        dir[r + n] = 0;
        while (n && dir[r + n - 1] == '/') /* ":/" is the hierarchy's root itself */
            dir[r + --n] = 0;
        return true;
    }
    return false;
}

/* The nearest limit from dir up to root: the file `max` names it ("max",
 * or a number at or above 2^62, for none), `current` the use. */
static bool nearest_limit(char *dir, const char *root, const char *max, const char *current)
{
    char path[320];
    for (;;) {
        uint64_t bytes;
        bool none;
        if (join(path, sizeof path, dir, max) && read_number(path, &bytes, &none) && !none && bytes &&
            bytes < ((uint64_t)1 << 62) && join(stat_path, sizeof stat_path, dir, "/memory.stat") &&
            join(usage_path, sizeof usage_path, dir, current) && join(source, sizeof source, "the cgroup ", dir)) {
            limit_bytes = (size_t)bytes;
            return true;
        }
        char *slash = strrchr(dir, '/');
        if (!slash || (size_t)(slash - dir) < strlen(root))
            return false;
        *slash = 0;
    }
}

/* The limit of the process's cgroup: v2's memory.max, else the v1 memory
 * controller's memory.limit_in_bytes (hosts that mount both keep the
 * memory controller in v1). */
static void cgroup_limit(void)
{
    char text[1024], dir[256];
    int fd = os_open_read("/proc/self/cgroup");
    if (fd < 0)
        return;
    long got = os_read(fd, text, sizeof text - 1);
    os_close(fd);
    if (got <= 0)
        return;
    text[got] = 0;
    inactive_key = "\ninactive_file ";
    if (cgroup_dir(text, false, CGROUP_ROOT, dir, sizeof dir) &&
        nearest_limit(dir, CGROUP_ROOT, "/memory.max", "/memory.current"))
        return;
    inactive_key = "\ntotal_inactive_file "; /* the cgroup's and its children's */
    if (cgroup_dir(text, true, CGROUP_ROOT "/memory", dir, sizeof dir))
        nearest_limit(dir, CGROUP_ROOT "/memory", "/memory.limit_in_bytes", "/memory.usage_in_bytes");
}

void os_memory_limit_init(size_t bytes)
{
    if (bytes) {
        limit_bytes = bytes;
        usage_path[0] = 0;
        join(source, sizeof source, "HAKMEM_MEMORY_LIMIT", "");
    } else {
        cgroup_limit();
    }
}

size_t os_memory_limit(void) { return limit_bytes; }

const char *os_memory_limit_source(void) { return source; }

/* The cgroup's inactive file pages: page cache the kernel takes back
 * before it kills anything, which the use counts (the working set that
 * container runtimes watch leaves it out). 0 if not known. */
static size_t inactive_file_bytes(void)
{
    char text[4096];
    int fd = os_open_read(stat_path);
    if (fd < 0)
        return 0;
    long got = os_read(fd, text + 1, sizeof text - 2);
    os_close(fd);
    if (got <= 0)
        return 0;
    text[0] = '\n'; /* the first line matches as the others */
    text[got + 1] = 0;
    const char *line = strstr(text, inactive_key);
    uint64_t v = 0;
    if (line)
        for (const char *c = line + strlen(inactive_key); *c >= '0' && *c <= '9'; c++)
            v = v * 10 + (uint64_t)(*c - '0');
    return (size_t)v;
}

/* Bytes in use now, as the limit counts them; 0 if not known. */
static size_t memory_in_use(void)
{
    uint64_t v = 0;
    if (*usage_path) {
        if (!read_number(usage_path, &v, NULL))
            return 0;
        size_t inactive = inactive_file_bytes();
        return v > inactive ? (size_t)(v - inactive) : 1;
    }
    char text[128];
    int fd = os_open_read("/proc/self/statm");
    if (fd < 0)
        return 0;
    long got = os_read(fd, text, sizeof text - 1);
    os_close(fd);
    if (got <= 0)
        return 0;
    text[got] = 0;
    const char *c = strchr(text, ' '); /* size, then resident, in pages */
    if (!c)
        return 0;
    for (c++; *c >= '0' && *c <= '9'; c++)
        v = v * 10 + (uint64_t)(*c - '0');
    return (size_t)v * os_kernel_page_size();
}

bool os_memory_pressed(size_t bytes)
{
    if (!limit_bytes)
        return false;
    static _Atomic size_t unchecked; /* bytes faulted in anew since the last look */
    size_t step = limit_bytes / 64 > ((size_t)1 << 20) ? limit_bytes / 64 : (size_t)1 << 20;
    if (atomic_fetch_add_explicit(&unchecked, bytes, memory_order_relaxed) + bytes < step)
        return false;
    atomic_store_explicit(&unchecked, 0, memory_order_relaxed);
    size_t used = memory_in_use();
    return used && used + step > limit_bytes;
}

/* Room kept under the limit for what the process touches between two
 * looks outside the mappings they weigh: its stack, its code, the C
 * library's pages. Without it the sanitizer build of test_limit peaked 8
 * to 28 KiB past a 64 MiB limit (65544-65564 KiB), where a cgroup's OOM
 * killer would have struck. */
#define LIMIT_HEADROOM ((size_t)256 << 10)

bool os_memory_refuses(size_t adding)
{
    if (!limit_bytes)
        return false;
    size_t used = memory_in_use();
    return used && used + adding + LIMIT_HEADROOM > limit_bytes;
}
