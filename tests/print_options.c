/* Prints hakmem's option table (for the docs check) and, with an argument,
 * allocates once so that option parsing and its warnings happen. */
#include "hakmem.h"

#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv)
{
    (void)argv;
    if (argc > 1) {
        void *p = malloc(10);
        int owned = hak_owns(p);
        free(p);
        return owned ? 0 : 1;
    }
    hak_options_print(stdout);
    return 0;
}
