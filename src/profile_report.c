/* The heap profile as its readers take it: a copy of the stack table
 * (stack.c), its frames named with dladdr, written as the report's call
 * sites (text), as the JSON report's stacks, as a heap profile in the
 * text format google-pprof reads, and as folded stacks for flame graphs.
 *
 * Frames are named by dladdr and, for what it cannot name, by the
 * modules' own symbol tables (symtab.c), with the source file and line
 * where the module has a DWARF line table (lines.c).
 *
 * The text report's call sites are stacks grouped by their first frame
 * outside the allocation wrappers: a program that allocates through
 * xmalloc or g_malloc is told which code called the wrapper, not the
 * wrapper. The wrappers are functions named in wrapper_names below or in
 * HAKMEM_PROFILE_SKIP; a frame without a name (a stripped binary's
 * static function) is never taken for one. */
#define _GNU_SOURCE
#include "report.h"
#include "init.h"
#include "hakmem.h"

#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>
#include <sys/auxv.h>

#define TOP_SITES 10
#define FRAMES_SHOWN 4 /* frames of a site's heaviest stack the text shows, from the site on */

/* Functions that allocate for their caller, looked through by default:
 * a name, or a prefix ending in '*'. C++'s operator new is named as the
 * linker names it (_Znwm: new(size_t)). */
static const char *const wrapper_names[] = {
    /* libc */
    "strdup", "__strdup", "strndup", "__strndup",
    /* C++ */
    "_Znwm*", "_Znam*", "_Znwj*", "_Znaj*", "_ZN9__gnu_cxx13new_allocator*", "_ZNSt15__new_allocator*",
    /* gnulib, git, bash, coreutils */
    "xmalloc", "xcalloc", "xrealloc", "xzalloc", "xmallocz*", "xmemdup*", "xstrdup", "xstrndup", "do_xmalloc",
    "xnmalloc", "xnrealloc", "x2nrealloc", "xpalloc", "ximalloc", "xicalloc", "xirealloc", "sh_xmalloc",
    "sh_xrealloc",
    /* GLib */
    "g_malloc*", "g_try_malloc*", "g_realloc*", "g_try_realloc*", "g_slice_alloc*", "g_strdup*", "g_memdup*",
    /* CPython */
    "PyMem_*", "_PyMem_*", "PyObject_Malloc", "PyObject_Calloc", "PyObject_Realloc", "_PyObject_Malloc",
    "_PyObject_Calloc", "_PyObject_Realloc", "PyObject_GC_*", "_PyObject_GC_*", "PyType_GenericAlloc",
    /* redis, SQLite */
    "zmalloc*", "ztrymalloc*", "zcalloc*", "ztrycalloc*", "zrealloc*", "ztryrealloc*", "zstrdup",
    "sqlite3_malloc*", "sqlite3_realloc*", "sqlite3Malloc*", "sqlite3DbMalloc*", "sqlite3DbRealloc*",
    "sqlite3Realloc",
};

static bool name_matches(const char *name, const char *pattern, size_t len)
{
    if (len && pattern[len - 1] == '*')
        return strncmp(name, pattern, len - 1) == 0;
    return strlen(name) == len && strncmp(name, pattern, len) == 0;
}

/* Whether a function of this name allocates for its caller. */
static bool is_wrapper(const char *name)
{
    if (!name)
        return false;
    for (size_t i = 0; i < sizeof wrapper_names / sizeof *wrapper_names; i++)
        if (name_matches(name, wrapper_names[i], strlen(wrapper_names[i])))
            return true;
    for (const char *s = hak_config.profile_skip; *s;) {
        size_t len = strcspn(s, ",");
        if (len && name_matches(name, s, len))
            return true;
        s += len + (s[len] == ',');
    }
    return false;
}

/* ---- the copy and its names -------------------------------------------------- */

static const uintptr_t *frames_of(const profile_view_t *v, const stack_entry_t *e) { return &v->frames[e->frames]; }

static int by_address(const void *a, const void *b)
{
    uintptr_t x = *(const uintptr_t *)a, y = *(const uintptr_t *)b;
    return x < y ? -1 : x > y;
}

/* The addresses the frames' lines are asked for (each return address
 * minus 1), sorted: the modules' line tables keep the rows for these
 * alone. Without room, the tables keep every row. */
static void wanted_addresses(profile_view_t *v)
{
    size_t total = 0;
    for (size_t i = 0; i < v->count; i++)
        total += v->stacks[i].depth;
    uintptr_t *wanted = total ? hak_alloc(total * sizeof *wanted, 0) : NULL;
    if (!wanted)
        return;
    size_t n = 0;
    for (size_t i = 0; i < v->count; i++)
        for (unsigned k = 0; k < v->stacks[i].depth; k++)
            wanted[n++] = frames_of(v, &v->stacks[i])[k] - 1;
    qsort(wanted, n, sizeof *wanted, by_address);
    size_t unique = 0;
    for (size_t i = 0; i < n; i++)
        if (!unique || wanted[i] != wanted[unique - 1])
            wanted[unique++] = wanted[i];
    v->symtabs.wanted = wanted;
    v->symtabs.wanted_count = unique;
}

bool profile_view_open(profile_view_t *v)
{
    *v = (profile_view_t){0};
    size_t entries, frames;
    stack_table_size(&entries, &frames);
    entries += 64, frames += 64 * STACK_DEPTH_MAX; /* what other threads add meanwhile */
    size_t symbols = 64;
    while (symbols < 2 * frames)
        symbols <<= 1;
    v->stacks = hak_alloc(entries * sizeof *v->stacks, 0); /* site 0: never tracked */
    v->frames = hak_alloc(frames * sizeof *v->frames, 0);
    v->symbols = hak_calloc_slow(symbols * sizeof *v->symbols, 0);
    if (!v->stacks || !v->frames || !v->symbols) {
        profile_view_close(v);
        return false;
    }
    v->symbol_mask = symbols - 1;
    Dl_info program; /* the module that holds the program's headers */
    if (dladdr((void *)getauxval(AT_PHDR), &program))
        v->program_base = program.dli_fbase;
    v->count = stack_table_copy(v->stacks, entries, v->frames, frames);
    wanted_addresses(v);
    return true;
}

void profile_view_close(profile_view_t *v)
{
    if (v->stacks)
        hak_free_checked(v->stacks, "free");
    if (v->frames)
        hak_free_checked(v->frames, "free");
    if (v->symbols)
        hak_free_checked(v->symbols, "free");
    symtab_free(&v->symtabs);
    if (v->symtabs.wanted)
        hak_free_checked((void *)v->symtabs.wanted, "free");
    *v = (profile_view_t){0};
}

/* The names of the code at return address pc, looked up once: dladdr's,
 * or the file's symbol table's where it names a function dladdr does not
 * see (static, or in a program that exports nothing). The address looked
 * up is pc - 1, inside the call: a call that never returns may end its
 * function, and pc is then the next one's. */
static const symbol_t *symbol_of(profile_view_t *v, uintptr_t pc)
{
    size_t i = (size_t)((pc * 0x9e3779b97f4a7c15ull) >> 20) & v->symbol_mask;
    while (v->symbols[i].pc && v->symbols[i].pc != pc)
        i = (i + 1) & v->symbol_mask;
    symbol_t *s = &v->symbols[i];
    if (s->pc)
        return s;
    s->pc = pc;
    Dl_info info;
    if (dladdr((void *)(pc - 1), &info) && info.dli_fname) {
        /* The program: dladdr names it by argv[0], which a program that
         * sets its process title has written over; symtab_name reads it
         * through /proc/self/exe. */
        bool program = info.dli_fbase == v->program_base;
        const char *path = program ? "" : info.dli_fname, *slash = strrchr(path, '/');
        s->module = program ? os_program_name() : slash ? slash + 1 : path;
        s->base = (uintptr_t)info.dli_fbase;
        if (info.dli_sname && info.dli_saddr) {
            s->name = info.dli_sname;
            s->start = (uintptr_t)info.dli_saddr;
        }
        uintptr_t start;
        const char *name = symtab_name(&v->symtabs, path, s->base, pc - 1, &start);
        if (name && (!s->name || start > s->start)) {
            s->name = name;
            s->start = start;
        }
        s->file = symtab_line(&v->symtabs, path, s->base, pc - 1, &s->line);
    }
    return s;
}

/* "function+0x1f (module)", "module+0x1234" (addr2line -e module 0x1234
 * names it where the file has its symbols), or the bare address. */
static void frame_name(profile_view_t *v, uintptr_t pc, char *out, size_t size)
{
    const symbol_t *s = symbol_of(v, pc);
    if (s->name)
        snprintf(out, size, "%s+0x%zx (%s)", s->name, (size_t)(pc - s->start), s->module);
    else if (s->module)
        snprintf(out, size, "%s+0x%zx", s->module, (size_t)(pc - s->base));
    else
        snprintf(out, size, "0x%zx", (size_t)pc);
}

/* frame_name's, with " at file:line" after the function where the module
 * has a line table. */
static void frame_name_line(profile_view_t *v, uintptr_t pc, char *out, size_t size)
{
    const symbol_t *s = symbol_of(v, pc);
    if (s->name && s->file)
        snprintf(out, size, "%s+0x%zx at %s:%u (%s)", s->name, (size_t)(pc - s->start), s->file, s->line,
                 s->module);
    else if (s->file)
        snprintf(out, size, "%s+0x%zx at %s:%u", s->module, (size_t)(pc - s->base), s->file, s->line);
    else
        frame_name(v, pc, out, size);
}

/* The function's name alone where it has one (flame graphs merge a
 * function's calls). */
static void function_name(profile_view_t *v, uintptr_t pc, char *out, size_t size)
{
    const symbol_t *s = symbol_of(v, pc);
    if (s->name)
        snprintf(out, size, "%s", s->name);
    else
        frame_name(v, pc, out, size);
}


/* The stack's first frame outside the wrappers (its last if all are). */
static unsigned site_frame(profile_view_t *v, const stack_entry_t *e)
{
    const uintptr_t *f = frames_of(v, e);
    unsigned k = 0;
    while (k + 1 < e->depth && is_wrapper(symbol_of(v, f[k])->name))
        k++;
    return k;
}

/* ---- the text report's call sites ------------------------------------------- */

typedef struct site_group {
    uintptr_t pc;          /* the site frame; 0 for the stacks without room */
    const stack_entry_t *heaviest; /* its stack with the most bytes */
    unsigned frame;        /* the site frame's index in it */
    double allocs, bytes, live_bytes;
    uint64_t samples;
    size_t min_size, max_size;
} site_group_t;

static int groups_by_bytes(const void *a, const void *b)
{
    double x = ((const site_group_t *)a)->bytes, y = ((const site_group_t *)b)->bytes;
    return x < y ? 1 : x > y ? -1 : 0;
}

static int groups_by_live_bytes(const void *a, const void *b)
{
    double x = ((const site_group_t *)a)->live_bytes, y = ((const site_group_t *)b)->live_bytes;
    return x < y ? 1 : x > y ? -1 : 0;
}

static int groups_by_count(const void *a, const void *b)
{
    double x = ((const site_group_t *)a)->allocs, y = ((const site_group_t *)b)->allocs;
    return x < y ? 1 : x > y ? -1 : 0;
}

/* The stacks grouped by site frame, into groups (v->count of them at
 * most); returns how many. */
static size_t group_sites(profile_view_t *v, site_group_t *groups, size_t *slots, size_t slot_mask)
{
    size_t n = 0;
    for (size_t i = 0; i < v->count; i++) {
        const stack_entry_t *e = &v->stacks[i];
        if (!e->samples)
            continue;
        unsigned k = e->depth ? site_frame(v, e) : 0;
        uintptr_t pc = e->depth ? frames_of(v, e)[k] : 0;
        size_t h = (size_t)((pc * 0x9e3779b97f4a7c15ull) >> 20) & slot_mask;
        while (slots[h] && groups[slots[h] - 1].pc != pc)
            h = (h + 1) & slot_mask;
        if (!slots[h]) {
            groups[n] = (site_group_t){.pc = pc, .heaviest = e, .frame = k, .min_size = e->min_size};
            slots[h] = ++n;
        }
        site_group_t *g = &groups[slots[h] - 1];
        if (e->bytes > g->heaviest->bytes)
            g->heaviest = e, g->frame = k;
        g->allocs += e->allocs;
        g->bytes += e->bytes;
        g->live_bytes += e->live_bytes;
        g->samples += e->samples;
        if (e->min_size < g->min_size)
            g->min_size = e->min_size;
        if (e->max_size > g->max_size)
            g->max_size = e->max_size;
    }
    return n;
}

static double mib(double bytes) { return bytes / (1024.0 * 1024.0); }

static void print_group(FILE *out, profile_view_t *v, const site_group_t *g)
{
    char name[512];
    if (g->pc)
        frame_name_line(v, g->pc, name, sizeof name);
    else
        snprintf(name, sizeof name, "(other stacks: the stack table was full)");
    fprintf(out, "    %12.0f %10.2f %10.2f %8zu..%-8zu %8llu  %s\n", g->allocs, mib(g->bytes),
            mib(g->live_bytes > 0 ? g->live_bytes : 0), g->min_size, g->max_size, (unsigned long long)g->samples, name);
    if (!g->pc)
        return;
    const stack_entry_t *e = g->heaviest;
    const uintptr_t *f = frames_of(v, e);
    for (unsigned k = g->frame + 1; k < e->depth && k <= g->frame + FRAMES_SHOWN - 1; k++) {
        frame_name_line(v, f[k], name, sizeof name);
        fprintf(out, "    %63s from %s\n", "", name);
    }
    if (g->frame) {
        fprintf(out, "    %63s via ", "");
        for (unsigned k = g->frame; k-- > 0;) {
            function_name(v, f[k], name, sizeof name);
            fprintf(out, "%s%s", name, k ? " <- " : "\n");
        }
    }
}

void profile_print_sites(FILE *out, profile_view_t *v)
{
    size_t slot_count = 64;
    while (slot_count < 2 * v->count)
        slot_count <<= 1;
    site_group_t *groups = hak_alloc((v->count + 1) * sizeof *groups, 0);
    size_t *slots = hak_calloc_slow(slot_count * sizeof *slots, 0);
    if (!groups || !slots) {
        if (groups)
            hak_free_checked(groups, "free");
        if (slots)
            hak_free_checked(slots, "free");
        return;
    }
    size_t n = group_sites(v, groups, slots, slot_count - 1);
    uint64_t samples = 0;
    for (size_t i = 0; i < n; i++)
        samples += groups[i].samples;
    size_t top = n < TOP_SITES ? n : TOP_SITES;
    static const char *const header =
        "           allocs        MiB   live MiB  size range        samples  site (the first caller outside the "
        "allocation wrappers), its callers\n";
    size_t peak = sample_mean_peak();
    if (hak_config.profile_sample > 1 && peak)
        fprintf(out, "  top call sites by bytes (%zu sites, %zu stacks, %llu samples: one per %zu KiB allocated on "
                     "average, up to %zu KiB on threads whose samples would have taken more than %ld%% of their "
                     "time; figures are estimates)\n",
                n, v->count ? v->count - 1 : 0, (unsigned long long)samples, hak_config.profile_sample >> 10,
                peak >> 10, hak_config.profile_budget);
    else if (hak_config.profile_sample > 1)
        fprintf(out, "  top call sites by bytes (%zu sites, %zu stacks, %llu samples: one per %zu KiB allocated on "
                     "average; figures are estimates)\n",
                n, v->count ? v->count - 1 : 0, (unsigned long long)samples, hak_config.profile_sample >> 10);
    else
        fprintf(out, "  top call sites by bytes (%zu sites, %zu stacks; every allocation recorded)\n", n,
                v->count ? v->count - 1 : 0);
    fputs(header, out);
    qsort(groups, n, sizeof *groups, groups_by_bytes);
    for (size_t i = 0; i < top; i++)
        print_group(out, v, &groups[i]);
    fprintf(out, "  top call sites by count\n");
    fputs(header, out);
    qsort(groups, n, sizeof *groups, groups_by_count);
    for (size_t i = 0; i < top; i++)
        print_group(out, v, &groups[i]);
    /* The leak view: what is still allocated, by site. At exit, what the
     * program never freed (or kept to its end on purpose). */
    qsort(groups, n, sizeof *groups, groups_by_live_bytes);
    size_t live = 0;
    while (live < top && groups[live].live_bytes >= 0.5)
        live++;
    fprintf(out, "  top call sites by live bytes (still allocated when the report was written%s)\n",
            live ? "" : ": none");
    if (live)
        fputs(header, out);
    for (size_t i = 0; i < live; i++)
        print_group(out, v, &groups[i]);
    hak_free_checked(groups, "free");
    hak_free_checked(slots, "free");
}

/* ---- JSON --------------------------------------------------------------------- */

void json_string(FILE *out, const char *s)
{
    fputc('"', out);
    for (; *s; s++) {
        if (*s == '"' || *s == '\\')
            fprintf(out, "\\%c", *s);
        else if ((unsigned char)*s < 0x20)
            fprintf(out, "\\u%04x", (unsigned char)*s);
        else
            fputc(*s, out);
    }
    fputc('"', out);
}

void profile_print_json_stacks(FILE *out, profile_view_t *v)
{
    fprintf(out, "\"sample_bytes\":%zu,\"sample_bytes_max\":%zu,\"stacks\":[", hak_config.profile_sample,
            sample_mean_peak() ? sample_mean_peak() : hak_config.profile_sample);
    bool first = true;
    for (size_t i = 0; i < v->count; i++) {
        const stack_entry_t *e = &v->stacks[i];
        if (!e->samples)
            continue;
        fprintf(out, "%s{\"allocs\":%.0f,\"bytes\":%.0f,\"live_objects\":%.0f,\"live_bytes\":%.0f,\"samples\":%llu,"
                     "\"min_size\":%zu,\"max_size\":%zu,\"site_frame\":%u,\"frames\":[",
                first ? "" : ",", e->allocs, e->bytes, e->live_objects > 0 ? e->live_objects : 0,
                e->live_bytes > 0 ? e->live_bytes : 0, (unsigned long long)e->samples, e->min_size, e->max_size,
                e->depth ? site_frame(v, e) : 0);
        first = false;
        const uintptr_t *f = frames_of(v, e);
        for (unsigned k = 0; k < e->depth; k++) {
            char name[320];
            frame_name(v, f[k], name, sizeof name);
            fprintf(out, "%s{\"address\":\"0x%zx\",\"name\":", k ? "," : "", (size_t)f[k]);
            json_string(out, name);
            const symbol_t *s = symbol_of(v, f[k]);
            if (s->file) {
                fputs(",\"file\":", out);
                json_string(out, s->file);
                fprintf(out, ",\"line\":%u", s->line);
            }
            fputc('}', out);
        }
        fputs("]}", out);
    }
    fputc(']', out);
}

/* ---- pprof --------------------------------------------------------------------- */

static unsigned long long rounded(double x) { return x > 0 ? (unsigned long long)(x + 0.5) : 0; }

/* The text heap profile of gperftools (google-pprof --text PROGRAM FILE):
 * a header with the totals, a line per stack with its in-use and
 * allocated objects and bytes and its return addresses, then the
 * process's mappings, by which pprof finds each address's file. The
 * figures are the estimates already (the "heapprofile" kind, which pprof
 * takes as they are). */
void profile_print_pprof(FILE *out, profile_view_t *v)
{
    double live_objects = 0, live_bytes = 0, allocs = 0, bytes = 0;
    for (size_t i = 0; i < v->count; i++) {
        const stack_entry_t *e = &v->stacks[i];
        live_objects += e->live_objects > 0 ? e->live_objects : 0;
        live_bytes += e->live_bytes > 0 ? e->live_bytes : 0;
        allocs += e->allocs;
        bytes += e->bytes;
    }
    fprintf(out, "heap profile: %llu: %llu [%llu: %llu] @ heapprofile\n", rounded(live_objects), rounded(live_bytes),
            rounded(allocs), rounded(bytes));
    for (size_t i = 0; i < v->count; i++) {
        const stack_entry_t *e = &v->stacks[i];
        if (!e->samples || !e->depth)
            continue;
        fprintf(out, "%llu: %llu [%llu: %llu] @", rounded(e->live_objects), rounded(e->live_bytes),
                rounded(e->allocs), rounded(e->bytes));
        const uintptr_t *f = frames_of(v, e);
        for (unsigned k = 0; k < e->depth; k++) /* pprof takes 1 from the return addresses but the first */
            fprintf(out, " 0x%zx", (size_t)f[k] - (k == 0));
        fputc('\n', out);
    }
    fputs("\nMAPPED_LIBRARIES:\n", out);
    fflush(out);
    int maps = os_open_read("/proc/self/maps");
    if (maps < 0)
        return;
    char buf[4096];
    long got;
    while ((got = os_read(maps, buf, sizeof buf)) > 0)
        fwrite(buf, 1, (size_t)got, out);
    os_close(maps);
}

/* ---- folded stacks ------------------------------------------------------------ */

/* One line per stack: its functions from the outermost in, separated by
 * ';', then the bytes it allocated (Brendan Gregg's folded format, which
 * flamegraph.pl, inferno, speedscope and `hakmem report --flamegraph`
 * read). A ';' in a name would split it: such names get a ':'. */
void profile_print_folded(FILE *out, profile_view_t *v)
{
    for (size_t i = 0; i < v->count; i++) {
        const stack_entry_t *e = &v->stacks[i];
        if (!e->samples || !e->depth || rounded(e->bytes) == 0)
            continue;
        const uintptr_t *f = frames_of(v, e);
        for (unsigned k = e->depth; k-- > 0;) {
            char name[320];
            function_name(v, f[k], name, sizeof name);
            for (char *c = name; *c; c++)
                if (*c == ';' || *c == '\n')
                    *c = ':';
            fprintf(out, "%s%s", name, k ? ";" : " ");
        }
        fprintf(out, "%llu\n", rounded(e->bytes));
    }
}
