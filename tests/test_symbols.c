/* The report's names: a static function of a program that exports
 * nothing (built without -rdynamic), and its main, come from the file's
 * own symbol table (symtab.c) instead of "test_symbols+0x1234"; the
 * program keeps the name it was started with when it writes over argv[0]
 * to set its process title, as redis-server does. Run with
 * HAKMEM_PROFILE_SAMPLE=1: every allocation is a sample. */
#define _GNU_SOURCE
#include "check.h"

__attribute__((noipa)) static void *allocate_in_static_function(size_t size)
{
    void *p = malloc(size);
    __asm__ volatile("" : "+r"(p));
    return p;
}

int main(int argc, char **argv)
{
    (void)argc;
    memset(argv[0], 'x', strlen(argv[0])); /* a process title */
    for (int i = 0; i < 1000; i++)
        free(allocate_in_static_function(4096));
    char *text = NULL;
    size_t len = 0;
    FILE *out = open_memstream(&text, &len);
    CHECK(out != NULL);
    if (!out)
        return check_summary("test_symbols");
    hak_stats_print(out);
    fclose(out);
    CHECK(strstr(text, ", test_symbols (parent") != NULL);
    const char *site = strstr(text, "allocate_in_static_function+0x");
    CHECK(site && strstr(site, "(test_symbols)"));
    CHECK(site && strstr(site, "from main+0x"));
    if (!site)
        fputs(text, stdout);
    free(text);
    return check_summary("test_symbols");
}
