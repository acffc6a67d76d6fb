/* Allocation across a dlopen boundary: a library loaded at run time gets
 * hakmem's malloc, its blocks are freed by the program and the program's
 * by it, and blocks it made outlive its dlclose. Loaded and unloaded a
 * few times. Then a C++ library, loaded with RTLD_LOCAL into this C
 * program, which maps no libstdc++ before it: its new is hakmem's, and
 * when new finds no memory it reaches the new_handler and throws
 * std::bad_alloc through that library's libstdc++ (cxx_module.cc).
 * Usage: test_dlopen path/to/libdl_module.so path/to/libcxx_module.so */
#include "check.h"
#include "hakmem.h"

#include <dlfcn.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef char *(*make_fn)(size_t, int);
typedef char *(*grow_fn)(char *, size_t);
typedef void (*free_fn)(void *);

static const size_t sizes[] = {1, 24, 200, 1024, 5000, 70000, 900000, 3 << 20};
#define NSIZES (sizeof sizes / sizeof sizes[0])

static int filled(const char *p, size_t n, int fill)
{
    for (size_t i = 0; i < n; i += 1 + i / 8)
        if (p[i] != (char)fill)
            return 0;
    return p[n - 1] == (char)fill;
}

static bool libstdcxx_mapped(void)
{
    FILE *maps = fopen("/proc/self/maps", "r");
    char line[512];
    bool found = false;
    while (maps && fgets(line, sizeof line, maps))
        found |= strstr(line, "libstdc++") != NULL;
    if (maps)
        fclose(maps);
    return found;
}

static void check_cxx_module(const char *path)
{
#ifndef SANITIZER_MAPS_LIBSTDCXX
    CHECK(!libstdcxx_mapped()); /* hakmem needs none: a module brings its own */
#endif
    void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    CHECK(lib != NULL);
    if (!lib) {
        fprintf(stderr, "dlopen: %s\n", dlerror());
        return;
    }
    CHECK(libstdcxx_mapped());
    char *(*make)(size_t) = (char *(*)(size_t))dlsym(lib, "module_cxx_new");
    void (*release)(char *) = (void (*)(char *))dlsym(lib, "module_cxx_delete");
    int (*failures)(void) = (int (*)(void))dlsym(lib, "module_cxx_new_failures");
    CHECK(make && release && failures);
    if (make && release && failures) {
        for (size_t i = 0; i < NSIZES; i++) {
            char *p = make(sizes[i]);
            CHECK(p && hak_owns(p));
            release(p);
        }
        CHECK(failures() == 0);
    }
    CHECK(dlclose(lib) == 0);
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: test_dlopen MODULE CXX_MODULE\n");
        return 2;
    }
    char *survivors[NSIZES] = {0};
    for (int round = 0; round < 3; round++) {
        void *lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
        CHECK(lib != NULL);
        if (!lib) {
            fprintf(stderr, "dlopen: %s\n", dlerror());
            break;
        }
        make_fn make = (make_fn)dlsym(lib, "module_make");
        grow_fn grow = (grow_fn)dlsym(lib, "module_grow");
        free_fn release = (free_fn)dlsym(lib, "module_free");
        CHECK(make && grow && release);
        for (size_t i = 0; i < NSIZES; i++) {
            char *theirs = make(sizes[i], 'a' + round); /* made there, freed here */
            CHECK(theirs && hak_owns(theirs) && filled(theirs, sizes[i], 'a' + round));
            free(theirs);
            char *ours = malloc(sizes[i]); /* made here, grown and freed there */
            memset(ours, 'x', sizes[i]);
            ours = grow(ours, sizes[i] * 2 + 1);
            CHECK(ours && hak_owns(ours) && filled(ours, sizes[i], 'x'));
            release(ours);
            if (round == 0)
                survivors[i] = make(sizes[i], 's'); /* outlives the library */
        }
        CHECK(dlclose(lib) == 0);
    }
    for (size_t i = 0; i < NSIZES; i++) {
        CHECK(survivors[i] && hak_owns(survivors[i]) && filled(survivors[i], sizes[i], 's'));
        free(survivors[i]);
    }
    check_cxx_module(argv[2]);
    return check_summary("test_dlopen");
}
