/* hakmem loaded with dlopen into a program that does not link it (as a
 * language's foreign-function module loads a library) and closed again:
 * the library stays mapped (-z nodelete), since its blocks, its purger
 * thread and its thread-exit hook outlive the handle. Blocks freed through
 * the API start the purger, the library is closed, the purge falls due and
 * a thread that used the API exits: all of it ran code of an unmapped
 * library, and the program died of SIGSEGV, before nodelete.
 * Usage: test_unload path/to/libhakmem.so (HAKMEM_PURGE_DELAY_MS short) */
#include "check.h"

#include <dlfcn.h>
#include <pthread.h>
#include <string.h>
#include <unistd.h>

typedef struct api {
    void *(*malloc)(size_t);
    void (*free)(void *);
    bool (*owns)(const void *);
} api_t;

static api_t api;
static pthread_barrier_t closed;

/* Blocks of every tier, up to 4 MiB, touched and freed: pages wait for
 * the purger, which starts. */
static void *use_and_wait(void *arg)
{
    for (size_t size = 16; size <= ((size_t)4 << 20); size *= 2) {
        char *p = api.malloc(size);
        CHECK(p && api.owns(p));
        memset(p, 1, size);
        api.free(p);
    }
    if (arg)
        pthread_barrier_wait(&closed); /* exits after the dlclose */
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc != 2)
        return fprintf(stderr, "usage: test_unload path/to/libhakmem.so\n"), 2;
    void *lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    CHECK(lib != NULL);
    if (!lib)
        return check_summary("unload");
    api.malloc = (void *(*)(size_t))dlsym(lib, "hak_malloc");
    api.free = (void (*)(void *))dlsym(lib, "hak_free");
    api.owns = (bool (*)(const void *))dlsym(lib, "hak_owns");
    CHECK(api.malloc && api.free && api.owns);
    pthread_barrier_init(&closed, NULL, 2);
    pthread_t user;
    pthread_create(&user, NULL, use_and_wait, &closed);
    use_and_wait(NULL);
    CHECK(dlclose(lib) == 0);
    CHECK(dlopen(argv[1], RTLD_NOW | RTLD_NOLOAD) != NULL); /* still loaded */
    pthread_barrier_wait(&closed);
    pthread_join(user, NULL);
    usleep(300 * 1000); /* the purges fall due */
    return check_summary("unload");
}
