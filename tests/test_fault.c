/* A fault inside the allocator is named (fault.c): a program that writes
 * over freed blocks and then allocates dies in malloc, and in the default
 * build it says so on stderr first, naming the likely cause and the
 * hardened library; the hardened library (secure_fault) stops at the
 * first bad link instead. Faults that are not hakmem's stay silent and
 * every case dies by its own signal, as without hakmem. Each case runs in
 * a fresh image of this program. */
#define _GNU_SOURCE
#include "check.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

/* Every block of a size freed, then the first word (a free block's link)
 * of each overwritten, then allocations of that size: the allocator
 * follows a planted link. */
static void write_after_free(void)
{
    enum { N = 4096 };
    static char *blocks[N];
    for (int i = 0; i < N; i++)
        blocks[i] = malloc(48);
    for (int i = 0; i < N; i++)
        free(blocks[i]);
    const uintptr_t planted = 0x4141414141414140; /* aligned: UBSan lets the load fault */
    for (int i = 0; i < N; i++)
        memcpy(*(char *volatile *)&blocks[i], &planted, sizeof planted);
    for (int i = 0; i < 100000; i++) {
        void *volatile p = malloc(48);
        if (!p)
            break;
    }
}

/* The program's own bad pointer. */
static void program_fault(void)
{
    volatile int *p = (int *)(uintptr_t)0x40;
    *p = 1;
}

static void sent(void) { raise(SIGSEGV); }

typedef struct fault_case {
    const char *name;
    void (*run)(void);
    const char *option;   /* HAKMEM_FAULT_MESSAGE's value, NULL: unset */
    int default_signal;   /* how it ends, default build */
    bool default_message; /* whether the default build names hakmem */
} fault_case_t;

static const fault_case_t cases[] = {
    {"write after free", write_after_free, NULL, SIGSEGV, true},
    {"write after free, message off", write_after_free, "0", SIGSEGV, false},
    {"the program's own fault", program_fault, NULL, SIGSEGV, false},
    {"a SIGSEGV sent", sent, NULL, SIGSEGV, false},
};

static void run_case(const fault_case_t *c, bool hardened)
{
    int err[2];
    CHECK(pipe(err) == 0);
    pid_t pid = fork();
    if (pid == 0) {
        dup2(err[1], STDERR_FILENO);
        if (c->option)
            setenv("HAKMEM_FAULT_MESSAGE", c->option, 1);
        exec_self((char *[]){"test_fault", "--case", (char *)c->name, NULL});
        _exit(99);
    }
    close(err[1]);
    char message[2048];
    read_to_end(err[0], message, sizeof message);
    int status = 0;
    waitpid(pid, &status, 0);
    /* The hardened library checks the links: it aborts at the first bad
     * one, whatever the option says. */
    bool planted = c->run == write_after_free;
    int signal = hardened && planted ? SIGABRT : c->default_signal;
    bool ended = WIFSIGNALED(status) && WTERMSIG(status) == signal;
    bool ok;
    if (hardened && planted)
        ok = strstr(message, "hakmem: malloc: free list corrupted") != NULL;
    else if (c->default_message)
        ok = strstr(message, "hakmem: SIGSEGV inside the allocator") &&
             strstr(message, "a write to a freed block") && strstr(message, "libhakmem-secure.so");
    else
        ok = !strstr(message, "hakmem");
    if (!ended || !ok)
        fprintf(stderr, "case '%s' (%s build): status %#x, stderr: %s\n", c->name, hardened ? "hardened" : "default",
                status, message);
    CHECK(ended);
    CHECK(ok);
}

int main(int argc, char **argv)
{
    check_expected_build();
    size_t count = sizeof cases / sizeof cases[0];
    if (argc == 3 && strcmp(argv[1], "--case") == 0) {
        for (size_t i = 0; i < count; i++)
            if (strcmp(cases[i].name, argv[2]) == 0) {
                if (!hak_owns(malloc(16)))
                    return 97; /* hakmem must serve this process */
                cases[i].run();
                return 0;
            }
        return 98;
    }
    hak_stats_t stats;
    hak_stats_get(&stats);
    for (size_t i = 0; i < count; i++)
        run_case(&cases[i], stats.hardened);
    return check_summary("test_fault");
}
