/* Layer 10, introspection: the heap profile as readers take it
 * (profile_report.c, symtab.c), for the report (report.c). */
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
} symbol_t;

/* symtab.c: the function at address in the module loaded at base from
 * the file at path ("": the program), from the file's .symtab or its
 * separate debug file, read into *tables once; NULL if none is known.
 * Names live until symtab_free. */
typedef struct symtab symtab_t;
const char *symtab_name(symtab_t **tables, const char *path, uintptr_t base, uintptr_t address, uintptr_t *start);
void symtab_free(symtab_t *tables);

typedef struct profile_view {
    stack_entry_t *stacks;
    size_t count;
    uintptr_t *frames;
    symbol_t *symbols; /* names looked up so far, by pc */
    size_t symbol_mask;
    symtab_t *symtabs; /* the modules' symbol tables read so far */
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
