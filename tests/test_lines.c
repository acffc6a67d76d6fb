/* The DWARF line table reader (lines.c), linked from the static library:
 * built with -gdwarf-3 (test_symbols covers DWARF 4 and 5 through the
 * report), it finds the line of a call in its own file; then it reads
 * its own .debug_line damaged in thousands of ways (bytes changed, cut
 * short) without reading outside it or naming a path outside its table:
 * the report reads whatever files a process maps. */
#define _GNU_SOURCE
#include "../src/report.h"
#include "check.h"

#include <dlfcn.h>
#include <elf.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/auxv.h>
#include <sys/mman.h>
#include <unistd.h>

static int call_line;

__attribute__((noinline)) static void *return_address(void)
{
    void *pc = __builtin_return_address(0);
    __asm__ volatile("" : "+r"(pc));
    return pc;
}

/* The contents of the program's own section `name`; NULL if none. */
static unsigned char *own_section(const char *name, size_t *size)
{
    FILE *f = fopen("/proc/self/exe", "rb");
    if (!f)
        return NULL;
    unsigned char *data = NULL;
    Elf64_Ehdr h;
    Elf64_Shdr *s = NULL;
    char *names = NULL;
    if (fread(&h, sizeof h, 1, f) != 1 || !(s = calloc(h.e_shnum, sizeof *s)) || fseek(f, (long)h.e_shoff, SEEK_SET) ||
        fread(s, sizeof *s, h.e_shnum, f) != h.e_shnum || h.e_shstrndx >= h.e_shnum)
        goto done;
    names = calloc(1, s[h.e_shstrndx].sh_size + 1);
    if (!names || fseek(f, (long)s[h.e_shstrndx].sh_offset, SEEK_SET) ||
        fread(names, 1, s[h.e_shstrndx].sh_size, f) != s[h.e_shstrndx].sh_size)
        goto done;
    for (unsigned i = 0; i < h.e_shnum; i++) {
        if (s[i].sh_name >= s[h.e_shstrndx].sh_size || strcmp(names + s[i].sh_name, name))
            continue;
        data = malloc(s[i].sh_size);
        *size = s[i].sh_size;
        if (data && (fseek(f, (long)s[i].sh_offset, SEEK_SET) || fread(data, 1, *size, f) != *size)) {
            free(data);
            data = NULL;
        }
        break;
    }
done:
    free(names);
    free(s);
    fclose(f);
    return data;
}

static void own_call_line(void)
{
    void *pc;
    call_line = __LINE__, pc = return_address();
    Dl_info program;
    CHECK(dladdr((void *)getauxval(AT_PHDR), &program) != 0);
    symtab_set_t tables = {0};
    unsigned line = 0;
    const char *file = symtab_line(&tables, "", (uintptr_t)program.dli_fbase, (uintptr_t)pc - 1, &line);
    CHECK(file && strstr(file, "test_lines.c"));
    CHECK(line == (unsigned)call_line);
    if (!file || line != (unsigned)call_line)
        printf("call at line %d named %s:%u\n", call_line, file ? file : "(none)", line);
    symtab_free(&tables);

    /* Asked for that address alone, the table keeps its row and the end
     * of its sequence. */
    size_t size = 0;
    unsigned char *section = own_section(".debug_line", &size);
    CHECK(section != NULL);
    if (!section)
        return;
    uintptr_t want = (uintptr_t)pc - 1;
    line_table_t t = {0};
    dwarf_sections_t d = {.line = {section, size}};
    CHECK(line_table_read(&t, &d, &want, 1, (uintptr_t)program.dli_fbase));
    file = line_table_find(&t, want - (uintptr_t)program.dli_fbase, &line);
    CHECK(file && line == (unsigned)call_line);
    CHECK(t.count <= 2);
    line_table_free(&t);
    free(section);
}

/* Every row the table has for addresses up to `limit` names a path that
 * lies in the table and ends there. */
static bool paths_inside(const line_table_t *t, uint64_t limit)
{
    for (uint64_t a = 0; a < limit; a += 13) {
        unsigned line;
        const char *path = line_table_find(t, a, &line);
        if (path && (path < t->paths || path >= t->paths + t->paths_size ||
                     !memchr(path, 0, (size_t)(t->paths + t->paths_size - path))))
            return false;
    }
    return true;
}

static void damaged_tables(void)
{
    size_t size = 0;
    unsigned char *line = own_section(".debug_line", &size);
    CHECK(line != NULL);
    if (!line)
        return;
    line_table_t whole = {0};
    dwarf_sections_t d = {.line = {line, size}};
    CHECK(line_table_read(&whole, &d, NULL, 0, 0));
    line_table_free(&whole);
    unsigned char *copy = malloc(size);
    size_t page = (size_t)sysconf(_SC_PAGESIZE), span = (size + page - 1) / page * page;
    unsigned char *area = mmap(NULL, span + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(area != MAP_FAILED && mprotect(area + span, page, PROT_NONE) == 0);
    if (area == MAP_FAILED)
        return;
    unsigned char *guard_end = area + span;
    unsigned seed = 12345, bad = 0;
    for (int round = 0; round < 3000 && copy; round++) {
        memcpy(copy, line, size);
        size_t cut = size;
        if (round % 3 == 0) {
            cut = (size_t)rand_r(&seed) % size;
        } else {
            for (int k = 0; k < 1 + round % 8; k++)
                copy[(size_t)rand_r(&seed) % size] = (unsigned char)rand_r(&seed);
        }
        /* the copy ends where a page without access begins: a read past
         * it faults */
        unsigned char *exact = guard_end - cut;
        memcpy(exact, copy, cut);
        line_table_t t = {0};
        dwarf_sections_t damaged = {.line = {exact, cut}};
        static const uintptr_t some[] = {0x1100, 0x1234, 0x2000, 0x3001};
        if (round % 2)
            line_table_read(&t, &damaged, some, sizeof some / sizeof some[0], 0);
        else
            line_table_read(&t, &damaged, NULL, 0, 0);
        if (!paths_inside(&t, 0x10000))
            bad++;
        line_table_free(&t);
    }
    CHECK(bad == 0);
    munmap(area, span + page);
    free(copy);
    free(line);
}

int main(void)
{
    own_call_line();
    damaged_tables();
    return check_summary("test_lines");
}
