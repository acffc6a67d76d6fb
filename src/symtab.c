/* Function names from a module's own symbol table (.symtab), and files
 * and lines from its DWARF line table (lines.c), for the report's frames.
 * dladdr reads the dynamic symbols alone, which name what a library
 * exports and nothing of an executable built without -rdynamic, so that a
 * program's own functions and every static function came out as
 * "module+0x1234". What a module's file lacks (stripped, or built without
 * -g) is looked up once more in the separate debug file its build ID names
 * (/usr/lib/debug/.build-id/xx/yyyy.debug, where Debian's -dbgsym packages
 * put them). Read at report time only, with the report's own untracked
 * allocations; a file that cannot be read or parsed names nothing.
 * Compressed debug sections (SHF_COMPRESSED, as objcopy
 * --compress-debug-sections writes them) are not read: inflating them
 * would take zlib into the allocator. */
#define _GNU_SOURCE
#include "report.h"

#include <elf.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SYMTAB_FILE_MAX ((uint64_t)1 << 30) /* a table or section larger than this is not read */

typedef struct function {
    uint64_t start, size; /* link-time addresses */
    uint32_t name;        /* offset in the string table */
} function_t;

struct symtab {
    struct symtab *next;
    char path[256];        /* the module's file as dladdr named it ("" for the program) */
    bool exec;             /* ET_EXEC: addresses are absolute, not relative to the load address */
    function_t *functions; /* sorted by start */
    size_t count;
    char *names;
    size_t names_size;
    line_table_t lines;
};

static bool read_at(int fd, void *buf, size_t size, uint64_t offset)
{
    return os_pread(fd, buf, size, offset) == (long)size;
}

static void *read_block(int fd, uint64_t offset, uint64_t size)
{
    if (!size || size > SYMTAB_FILE_MAX)
        return NULL;
    void *p = hak_alloc((size_t)size, 0); /* site 0: never tracked */
    if (p && !read_at(fd, p, (size_t)size, offset)) {
        hak_free_checked(p, "free");
        p = NULL;
    }
    return p;
}

static int by_start(const void *a, const void *b)
{
    uint64_t x = ((const function_t *)a)->start, y = ((const function_t *)b)->start;
    return x < y ? -1 : x > y;
}

/* The build ID note's bytes into id (at most 64); its length, 0 if none. */
static size_t build_id(int fd, const Elf64_Shdr *sections, unsigned count, unsigned char *id)
{
    for (unsigned i = 0; i < count; i++) {
        const Elf64_Shdr *s = &sections[i];
        if (s->sh_type != SHT_NOTE || s->sh_size > 4096)
            continue;
        unsigned char note[4096];
        if (!read_at(fd, note, s->sh_size, s->sh_offset))
            continue;
        for (size_t at = 0; at + sizeof(Elf64_Nhdr) <= s->sh_size;) {
            const Elf64_Nhdr *n = (const Elf64_Nhdr *)(note + at);
            size_t name = (n->n_namesz + 3) & ~(size_t)3, desc = (n->n_descsz + 3) & ~(size_t)3;
            size_t body = at + sizeof *n + name;
            if (body + n->n_descsz > s->sh_size)
                break;
            if (n->n_type == NT_GNU_BUILD_ID && n->n_namesz == 4 && !memcmp(note + at + sizeof *n, "GNU", 4) &&
                n->n_descsz && n->n_descsz <= 64) {
                memcpy(id, note + body, n->n_descsz);
                return n->n_descsz;
            }
            at = body + desc;
        }
    }
    return 0;
}

/* t's functions from the section of type SHT_SYMTAB, if it has none yet. */
static void load_functions(symtab_t *t, int fd, const Elf64_Shdr *sections, unsigned count)
{
    for (unsigned i = 0; i < count && !t->functions; i++) {
        const Elf64_Shdr *s = &sections[i];
        if (s->sh_type != SHT_SYMTAB || s->sh_entsize != sizeof(Elf64_Sym) || s->sh_link >= count)
            continue;
        const Elf64_Shdr *strings = &sections[s->sh_link];
        Elf64_Sym *symbols = read_block(fd, s->sh_offset, s->sh_size);
        char *names = symbols ? read_block(fd, strings->sh_offset, strings->sh_size) : NULL;
        size_t total = s->sh_size / sizeof *symbols, kept = 0;
        function_t *functions = names ? hak_alloc(total * sizeof *functions + 1, 0) : NULL;
        if (functions) {
            for (size_t k = 0; k < total; k++) {
                const Elf64_Sym *y = &symbols[k];
                unsigned type = ELF64_ST_TYPE(y->st_info);
                if ((type == STT_FUNC || type == STT_GNU_IFUNC) && y->st_shndx != SHN_UNDEF && y->st_size &&
                    y->st_name < strings->sh_size)
                    functions[kept++] = (function_t){y->st_value, y->st_size, y->st_name};
            }
            qsort(functions, kept, sizeof *functions, by_start);
            t->functions = functions, t->count = kept, t->names = names, t->names_size = strings->sh_size;
        } else if (names) {
            hak_free_checked(names, "free");
        }
        if (symbols)
            hak_free_checked(symbols, "free");
    }
}

/* The contents of the section called name (NULL data if there is none, or
 * it is empty or compressed), read into memory the caller frees. */
static dwarf_section_t read_section(int fd, const Elf64_Shdr *sections, unsigned count, const char *names,
                                    size_t names_size, const char *name)
{
    for (unsigned i = 0; i < count; i++) {
        const Elf64_Shdr *s = &sections[i];
        if (s->sh_name >= names_size || strcmp(names + s->sh_name, name) || s->sh_type == SHT_NOBITS ||
            (s->sh_flags & SHF_COMPRESSED))
            continue;
        unsigned char *data = read_block(fd, s->sh_offset, s->sh_size);
        return (dwarf_section_t){data, data ? (size_t)s->sh_size : 0};
    }
    return (dwarf_section_t){0};
}

/* t's line table from the file's DWARF sections, if it has none yet: the
 * rows for the set's wanted addresses, the module being loaded at base. */
static void load_lines(symtab_t *t, const symtab_set_t *set, uintptr_t base, int fd, const Elf64_Ehdr *h,
                       const Elf64_Shdr *sections)
{
    if (t->lines.count || h->e_shstrndx >= h->e_shnum)
        return;
    const Elf64_Shdr *shstrtab = &sections[h->e_shstrndx];
    char *names = read_block(fd, shstrtab->sh_offset, shstrtab->sh_size);
    if (!names)
        return;
    size_t size = shstrtab->sh_size;
    names[size - 1] = 0;
    dwarf_sections_t d = {.line = read_section(fd, sections, h->e_shnum, names, size, ".debug_line")};
    if (d.line.data) {
        d.line_str = read_section(fd, sections, h->e_shnum, names, size, ".debug_line_str");
        d.str = read_section(fd, sections, h->e_shnum, names, size, ".debug_str");
        line_table_read(&t->lines, &d, set->wanted, set->wanted_count, t->exec ? 0 : base);
    }
    const dwarf_section_t *all[] = {&d.line, &d.line_str, &d.str};
    for (unsigned k = 0; k < 3; k++)
        if (all[k]->data)
            hak_free_checked((void *)all[k]->data, "free");
    hak_free_checked(names, "free");
}

/* What t lacks of its functions and lines, from the ELF file at path;
 * debug, when not NULL, receives the path of the file's separate debug
 * file if something is still lacking ("" otherwise). */
static void load_file(symtab_t *t, const symtab_set_t *set, uintptr_t base, const char *path, char *debug,
                      size_t debug_size)
{
    if (debug)
        *debug = 0;
    int fd = os_open_read(path);
    if (fd < 0)
        return;
    Elf64_Ehdr h;
    Elf64_Shdr *sections = NULL;
    if (!read_at(fd, &h, sizeof h, 0) || memcmp(h.e_ident, ELFMAG, SELFMAG) || h.e_ident[EI_CLASS] != ELFCLASS64 ||
        h.e_shentsize != sizeof(Elf64_Shdr) || !h.e_shnum)
        goto done;
    if (debug)
        t->exec = h.e_type == ET_EXEC; /* a debug file says nothing of where the module is */
    sections = read_block(fd, h.e_shoff, (uint64_t)h.e_shnum * sizeof *sections);
    if (!sections)
        goto done;
    load_functions(t, fd, sections, h.e_shnum);
    load_lines(t, set, base, fd, &h, sections);
    unsigned char id[64];
    size_t id_size;
    if ((!t->functions || !t->lines.count) && debug && (id_size = build_id(fd, sections, h.e_shnum, id)) >= 2) {
        static const char hex[] = "0123456789abcdef";
        size_t n = (size_t)snprintf(debug, debug_size, "/usr/lib/debug/.build-id/%c%c/", hex[id[0] >> 4],
                                    hex[id[0] & 15]);
        for (size_t k = 1; k < id_size && n + 3 < debug_size; k++) {
            debug[n++] = hex[id[k] >> 4];
            debug[n++] = hex[id[k] & 15];
        }
        snprintf(debug + n, debug_size - n, ".debug");
    }
done:
    if (sections)
        hak_free_checked(sections, "free");
    os_close(fd);
}

static symtab_t *symtab_of(symtab_set_t *set, const char *path, uintptr_t base)
{
    for (symtab_t *t = set->list; t; t = t->next)
        if (!strcmp(t->path, path))
            return t;
    symtab_t *t = hak_calloc_slow(sizeof *t, 0);
    if (!t)
        return NULL;
    snprintf(t->path, sizeof t->path, "%s", path);
    t->next = set->list;
    set->list = t;
    char debug[256];
    /* The program itself: dladdr names it "" (or as it was started,
     * relative to a directory it may have left). */
    const char *file = *path ? path : "/proc/self/exe";
    load_file(t, set, base, file, debug, sizeof debug);
    if (*debug)
        load_file(t, set, base, debug, NULL, 0);
    return t;
}

const char *symtab_name(symtab_set_t *set, const char *path, uintptr_t base, uintptr_t address, uintptr_t *start)
{
    symtab_t *t = symtab_of(set, path, base);
    if (!t || !t->count)
        return NULL;
    uint64_t at = t->exec ? address : address - base;
    size_t low = 0, high = t->count; /* the last function starting at or below `at` */
    while (low < high) {
        size_t mid = (low + high) / 2;
        if (t->functions[mid].start <= at)
            low = mid + 1;
        else
            high = mid;
    }
    if (!low)
        return NULL;
    const function_t *f = &t->functions[low - 1];
    if (at >= f->start + f->size || f->name >= t->names_size)
        return NULL;
    *start = t->exec ? (uintptr_t)f->start : base + (uintptr_t)f->start;
    return t->names + f->name;
}

const char *symtab_line(symtab_set_t *set, const char *path, uintptr_t base, uintptr_t address, unsigned *line)
{
    symtab_t *t = symtab_of(set, path, base);
    if (!t || !t->lines.count)
        return NULL;
    return line_table_find(&t->lines, t->exec ? address : address - base, line);
}

void symtab_free(symtab_set_t *set)
{
    symtab_t *tables = set->list;
    set->list = NULL;
    while (tables) {
        symtab_t *next = tables->next;
        if (tables->functions)
            hak_free_checked(tables->functions, "free");
        if (tables->names)
            hak_free_checked(tables->names, "free");
        line_table_free(&tables->lines);
        hak_free_checked(tables, "free");
        tables = next;
    }
}
