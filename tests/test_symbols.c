/* The report's names: a static function of a program that exports
 * nothing (built without -rdynamic), and its main, come from the file's
 * own symbol table (symtab.c) instead of "test_symbols+0x1234"; the
 * program keeps the name it was started with when it writes over argv[0]
 * to set its process title, as redis-server does. Built with -g (DWARF 5,
 * and DWARF 4 as test_symbols_dwarf4), the frames carry their file and
 * line from the line table (lines.c). Run with HAKMEM_PROFILE_SAMPLE=1:
 * every allocation is a sample. */
#define _GNU_SOURCE
#include "check.h"

#include <limits.h>

static int malloc_line, caller_line; /* of the calls whose return addresses the stacks hold */

__attribute__((noipa)) static void *allocate_in_static_function(size_t size)
{
    void *p;
    malloc_line = __LINE__, p = malloc(size);
    __asm__ volatile("" : "+r"(p));
    return p;
}

int main(int argc, char **argv)
{
    (void)argc;
    char name[64], *slash = strrchr(argv[0], '/');
    snprintf(name, sizeof name, "%s", slash ? slash + 1 : argv[0]);
    memset(argv[0], 'x', strlen(argv[0])); /* a process title */
    for (int i = 0; i < 1000; i++)
        caller_line = __LINE__, free(allocate_in_static_function(4096));
    char *text = NULL;
    size_t len = 0;
    FILE *out = open_memstream(&text, &len);
    CHECK(out != NULL);
    if (!out)
        return check_summary(name);
    hak_stats_print(out);
    fclose(out);
    char line[PATH_MAX + 128];
    snprintf(line, sizeof line, ", %s (parent", name);
    CHECK(strstr(text, line) != NULL);
    const char *site = strstr(text, "allocate_in_static_function+0x");
    const char *end = site ? strchr(site, '\n') : NULL;
    snprintf(line, sizeof line, " at %s:%d (%s)", __FILE__, malloc_line, name);
    const char *at = site ? strstr(site, line) : NULL;
    CHECK(at && at < end);
    const char *caller = site ? strstr(site, "from main+0x") : NULL;
    CHECK(caller != NULL);
    snprintf(line, sizeof line, " at %s:%d (%s)", __FILE__, caller_line, name);
    at = caller ? strstr(caller, line) : NULL;
    CHECK(at && at < strchr(caller, '\n'));
    if (!site || !caller || !at)
        fputs(text, stdout);
    free(text);
    return check_summary(name);
}
