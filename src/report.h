/* Layer 10, introspection: the heap profile as readers take it
 * (profile_report.c, symtab.c, lines.c), for the report (report.c). */
#ifndef HAKMEM_REPORT_H
#define HAKMEM_REPORT_H

#include "alloc.h"

/* A copy of the stack table with its frames' names: what every output of
 * the profile reads. */
typedef struct symbol {
    uintptr_t pc;       /* a return address (0: a free slot) */
    const char *name;   /* the function's, NULL if not known */
    uintptr_t start;    /* the function's address */
    const char *module; /* the file's base name, NULL if not known */
    uintptr_t base;     /* the module's load address */
    const char *file;   /* the source file, NULL if not known */
    unsigned line;
} symbol_t;

/* symtab.c: the function at address in the module loaded at base from
 * the file at path ("": the program), from the file's .symtab or its
 * separate debug file, read into the set once; NULL if none is known.
 * Names live until symtab_free. */
typedef struct symtab symtab_t;
typedef struct symtab_set {
    symtab_t *list;          /* the modules' tables read so far */
    const uintptr_t *wanted; /* the addresses lines will be asked for, sorted (NULL: any) */
    size_t wanted_count;
} symtab_set_t;
const char *symtab_name(symtab_set_t *set, const char *path, uintptr_t base, uintptr_t address, uintptr_t *start);
/* The source file and line of the code at address (as symtab_name),
 * from the module's DWARF line table; NULL if it has none, or if address
 * is not among the set's wanted ones. */
const char *symtab_line(symtab_set_t *set, const char *path, uintptr_t base, uintptr_t address, unsigned *line);
void symtab_free(symtab_set_t *set);

/* lines.c: a module's DWARF line table, read from its sections. */
typedef struct dwarf_section {
    const unsigned char *data; /* NULL: the file has no such section */
    size_t size;
} dwarf_section_t;
typedef struct dwarf_sections {
    dwarf_section_t line, line_str, str; /* .debug_line, .debug_line_str, .debug_str */
} dwarf_sections_t;
typedef struct line_table {
    struct line_row *rows; /* sorted by address */
    size_t count, capacity;
    char *paths; /* the files' paths, each ending in a NUL */
    size_t paths_size, paths_capacity;
} line_table_t;
/* Adds the sections' rows to t (zeroed); false if it has none. Paths are
 * copied: the sections may go once it returns. Where wanted is not NULL,
 * only the rows that cover one of its addresses (sorted, run-time: a
 * row's address plus bias) are kept, so that a large program's table
 * costs what the profile's frames need. */
bool line_table_read(line_table_t *t, const dwarf_sections_t *d, const uintptr_t *wanted, size_t wanted_count,
                     uintptr_t bias);
/* The file of the row for address (link-time), its line in *line; NULL if
 * no row covers it. */
const char *line_table_find(const line_table_t *t, uint64_t address, unsigned *line);
void line_table_free(line_table_t *t);

typedef struct profile_view {
    stack_entry_t *stacks;
    size_t count;
    uintptr_t *frames;
    symbol_t *symbols; /* names looked up so far, by pc */
    size_t symbol_mask;
    symtab_set_t symtabs; /* the modules' symbol and line tables read so far */
    void *program_base; /* the program's load address, as dladdr gives it */
} profile_view_t;

bool profile_view_open(profile_view_t *v);
void profile_view_close(profile_view_t *v);
void profile_print_sites(FILE *out, profile_view_t *v);
void profile_print_json_stacks(FILE *out, profile_view_t *v);
void profile_print_pprof(FILE *out, profile_view_t *v);
void profile_print_folded(FILE *out, profile_view_t *v);

/* JSON's string quoting, for the report's JSON too. */
void json_string(FILE *out, const char *s);

#endif
