/* Start-up under LD_PRELOAD: allocation from a constructor and from a
 * thread started before main, racing with main's own first allocations.
 * Not linked with hakmem; hak_owns is looked up at run time. */
#define _GNU_SOURCE
#include "check.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

static void *from_constructor[64];
static pthread_t early_thread;
static _Atomic int early_done;
static void *from_early_thread[1000];

static void *early_worker(void *arg)
{
    (void)arg;
    for (int i = 0; i < 1000; i++) {
        from_early_thread[i] = malloc((size_t)(i % 300) + 1);
        if (i % 2)
            free(malloc((size_t)i * 50));
    }
    early_done = 1;
    return NULL;
}

__attribute__((constructor)) static void allocate_before_main(void)
{
    for (int i = 0; i < 64; i++)
        from_constructor[i] = malloc((size_t)i * 40 + 1);
    pthread_create(&early_thread, NULL, early_worker, NULL);
}

int main(void)
{
    bool (*owns)(const void *) = (bool (*)(const void *))dlsym(RTLD_DEFAULT, "hak_owns");
    CHECK(owns != NULL);
    void *mine[1000];
    for (int i = 0; i < 1000; i++) /* races with the early thread */
        mine[i] = malloc((size_t)(i % 500) + 1);
    pthread_join(early_thread, NULL);
    CHECK(early_done);
    int owned = owns != NULL;
    for (int i = 0; owns && i < 64; i++)
        owned &= owns(from_constructor[i]);
    for (int i = 0; owns && i < 1000; i++)
        owned &= owns(from_early_thread[i]) && owns(mine[i]);
    CHECK(owned);
    for (int i = 0; i < 1000; i++) {
        free(from_early_thread[i]); /* blocks of a thread that has exited */
        free(mine[i]);
    }
    for (int i = 0; i < 64; i++)
        free(from_constructor[i]);
    return check_summary("test_startup");
}
