/* Prints hakmem's option table: as hak_options_print writes it, or with
 * `markdown` as the rows of docs/options.md's table (the options check
 * and `make options-doc`); with `alloc`, allocates once so that option
 * parsing and its warnings happen. */
#define _GNU_SOURCE
#include "hakmem.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* name, type, default, meaning: one markdown row. */
static void print_markdown_row(char *line)
{
    char *field[4] = {line, NULL, NULL, NULL};
    for (int i = 1; i < 4; i++) {
        field[i] = strchr(field[i - 1], '\t');
        if (!field[i]) {
            fprintf(stderr, "print_options: a line of hak_options_print has fewer than 4 fields\n");
            exit(1);
        }
        *field[i]++ = 0;
    }
    printf("| `%s` | %s | `%s` | %s |\n", field[0], field[1], field[2], field[3]);
}

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "alloc") == 0) {
        void *p = malloc(10);
        int owned = hak_owns(p);
        free(p);
        return owned ? 0 : 1;
    }
    if (argc > 1 && strcmp(argv[1], "markdown") == 0) {
        char *text = NULL;
        size_t size = 0;
        FILE *table = open_memstream(&text, &size);
        hak_options_print(table);
        fclose(table);
        printf("| option | type | default | meaning |\n|---|---|---|---|\n");
        for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n"))
            print_markdown_row(line);
        free(text);
        return 0;
    }
    hak_options_print(stdout);
    return 0;
}
