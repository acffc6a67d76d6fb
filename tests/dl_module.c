/* A library that test_dlopen loads with dlopen: it allocates blocks the
 * program frees, and frees and grows blocks the program allocated. */
#include <stdlib.h>
#include <string.h>

char *module_make(size_t n, int fill)
{
    char *p = malloc(n);
    if (p)
        memset(p, fill, n);
    return p;
}

char *module_grow(char *p, size_t n) { return realloc(p, n); }

void module_free(void *p) { free(p); }
