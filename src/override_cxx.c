/* C++ operator new and delete on hakmem, every variant of C++17 (plain,
 * array, nothrow, sized, aligned), written in C under their mangled names
 * so that libhakmem needs no C++ runtime: a C program run with
 * LD_PRELOAD=libhakmem.so maps no libstdc++, libm or libgcc_s (1.2 MiB
 * resident, measured at dcf154b), and new inlines the malloc
 * fast path.
 *
 * Only a new that finds no memory needs the C++ runtime, and a program
 * that calls new has one: the new_handler is libstdc++'s, std::bad_alloc
 * is thrown by libstdc++'s std::__throw_bad_alloc, and a nothrow new with
 * a handler installed goes through libstdc++'s own nothrow new, which
 * calls ours in a try block (C cannot catch what the handler throws).
 * They are looked up when needed: among the program's symbols, else in a
 * libstdc++ loaded with RTLD_LOCAL (a Python extension written in C++).
 * The file is compiled with -fexceptions: std::bad_alloc unwinds through
 * its frames. Not defined when the build says HAKMEM_OVERRIDE=OFF. */
#define _GNU_SOURCE
#include "alloc.h"

#ifdef HAKMEM_OVERRIDE
#include <dlfcn.h>

typedef void (*new_handler_t)(void);
typedef new_handler_t (*get_new_handler_t)(void);
typedef struct nothrow_tag { char empty; } nothrow_t; /* std::nothrow_t: passed by reference, never read */
static const nothrow_t nothrow_value;

/* libstdc++'s definition of name; with `next`, a name hakmem defines too. */
static void *cxx_runtime(const char *name, bool next)
{
    void *f = dlsym(next ? RTLD_NEXT : RTLD_DEFAULT, name);
    if (!f) {
        void *lib = dlopen("libstdc++.so.6", RTLD_LAZY | RTLD_NOLOAD);
        if (lib) {
            f = dlsym(lib, name);
            dlclose(lib);
        }
    }
    return f;
}

static void *new_block(size_t size, size_t align, uintptr_t site)
{
    if (!align)
        return hak_alloc(size, site);
    return is_power_of_two(align) ? hak_alloc_aligned(align, size, site) : NULL;
}

/* A new that found no memory: the standard's loop through the
 * new_handler, then std::bad_alloc, or null for the nothrow forms. */
static __attribute__((noinline, cold)) void *new_failed(size_t size, size_t align, uintptr_t site, bool nothrow)
{
    get_new_handler_t get_handler = (get_new_handler_t)cxx_runtime("_ZSt15get_new_handlerv", false);
    new_handler_t handler = get_handler ? get_handler() : NULL;
    if (nothrow) {
        if (!handler)
            return NULL;
        /* libstdc++'s operator new(size[, align], nothrow): our throwing
         * new inside try { } catch (...) { return nullptr; } */
        if (align) {
            void *(*nothrow_new)(size_t, size_t, const nothrow_t *) = (void *(*)(size_t, size_t, const nothrow_t *))
                cxx_runtime("_ZnwmSt11align_val_tRKSt9nothrow_t", true);
            return nothrow_new ? nothrow_new(size, align, &nothrow_value) : NULL;
        }
        void *(*nothrow_new)(size_t, const nothrow_t *) =
            (void *(*)(size_t, const nothrow_t *))cxx_runtime("_ZnwmRKSt9nothrow_t", true);
        return nothrow_new ? nothrow_new(size, &nothrow_value) : NULL;
    }
    for (; handler; handler = get_handler()) {
        handler(); /* may free memory, throw, or end the program */
        void *p = new_block(size, align, site);
        if (p)
            return p;
    }
    void (*throw_bad_alloc)(void) = (void (*)(void))cxx_runtime("_ZSt17__throw_bad_allocv", false);
    if (throw_bad_alloc)
        throw_bad_alloc();
    hak_fatal("operator new found no memory, and no libstdc++ to throw std::bad_alloc");
}

static inline void *cxx_new(size_t size, size_t align, uintptr_t site, bool nothrow)
{
    void *p = new_block(size, align, site);
    return likely(p != NULL) ? p : new_failed(size, align, site, nothrow);
}

/* The mangled names: operator new takes a std::size_t, delete a void *;
 * std::align_val_t is a size_t, a std::nothrow_t comes by reference. */
HAK_EXPORT void *_Znwm(size_t n) { return cxx_new(n, 0, HAK_CALLER, false); }
HAK_EXPORT void *_Znam(size_t n) { return cxx_new(n, 0, HAK_CALLER, false); }
HAK_EXPORT void *_ZnwmRKSt9nothrow_t(size_t n, const nothrow_t *t) { return cxx_new(n, 0, HAK_CALLER, true); }
HAK_EXPORT void *_ZnamRKSt9nothrow_t(size_t n, const nothrow_t *t) { return cxx_new(n, 0, HAK_CALLER, true); }
HAK_EXPORT void *_ZnwmSt11align_val_t(size_t n, size_t a) { return cxx_new(n, a, HAK_CALLER, false); }
HAK_EXPORT void *_ZnamSt11align_val_t(size_t n, size_t a) { return cxx_new(n, a, HAK_CALLER, false); }
HAK_EXPORT void *_ZnwmSt11align_val_tRKSt9nothrow_t(size_t n, size_t a, const nothrow_t *t)
{
    return cxx_new(n, a, HAK_CALLER, true);
}
HAK_EXPORT void *_ZnamSt11align_val_tRKSt9nothrow_t(size_t n, size_t a, const nothrow_t *t)
{
    return cxx_new(n, a, HAK_CALLER, true);
}

/* delete and delete[]: plain, nothrow, sized, aligned, sized and aligned, aligned and nothrow */
HAK_EXPORT void _ZdlPv(void *p) { hak_free_checked(p, "operator delete"); }
HAK_EXPORT void _ZdaPv(void *p) { hak_free_checked(p, "operator delete[]"); }
HAK_EXPORT void _ZdlPvRKSt9nothrow_t(void *p, const nothrow_t *t) { hak_free_checked(p, "operator delete"); }
HAK_EXPORT void _ZdaPvRKSt9nothrow_t(void *p, const nothrow_t *t) { hak_free_checked(p, "operator delete[]"); }
HAK_EXPORT void _ZdlPvm(void *p, size_t n) { hak_free_checked(p, "operator delete"); }
HAK_EXPORT void _ZdaPvm(void *p, size_t n) { hak_free_checked(p, "operator delete[]"); }
HAK_EXPORT void _ZdlPvSt11align_val_t(void *p, size_t a) { hak_free_checked(p, "operator delete"); }
HAK_EXPORT void _ZdaPvSt11align_val_t(void *p, size_t a) { hak_free_checked(p, "operator delete[]"); }
HAK_EXPORT void _ZdlPvmSt11align_val_t(void *p, size_t n, size_t a) { hak_free_checked(p, "operator delete"); }
HAK_EXPORT void _ZdaPvmSt11align_val_t(void *p, size_t n, size_t a) { hak_free_checked(p, "operator delete[]"); }
HAK_EXPORT void _ZdlPvSt11align_val_tRKSt9nothrow_t(void *p, size_t a, const nothrow_t *t)
{
    hak_free_checked(p, "operator delete");
}
HAK_EXPORT void _ZdaPvSt11align_val_tRKSt9nothrow_t(void *p, size_t a, const nothrow_t *t)
{
    hak_free_checked(p, "operator delete[]");
}

#endif /* HAKMEM_OVERRIDE */
