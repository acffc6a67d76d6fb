/* A minimal check harness: CHECK counts, reports the failing expression,
 * and check_summary() prints "N passed, N failed" and gives the exit code. */
#ifndef HAKMEM_TEST_CHECK_H
#define HAKMEM_TEST_CHECK_H

#include <stdio.h>

static int checks_passed, checks_failed;

#define CHECK(cond)                                                                    \
    do {                                                                               \
        if (cond) {                                                                    \
            checks_passed++;                                                           \
        } else {                                                                       \
            checks_failed++;                                                           \
            if (checks_failed <= 20)                                                   \
                fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
        }                                                                              \
    } while (0)

static inline int check_summary(const char *name)
{
    printf("%s: %d passed, %d failed\n", name, checks_passed, checks_failed);
    return checks_failed ? 1 : 0;
}

#endif
