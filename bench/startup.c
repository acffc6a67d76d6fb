/* What starting a short program costs under the allocator: the runner's
 * LD_PRELOAD passes to every child, which loads the library, initialises
 * it, serves the program's allocations and exits (taking down the
 * allocator's threads, where it started any). Shell scripts and build
 * systems pay it thousands of times, and a library named in
 * /etc/ld.so.preload adds it to every program. We run PROGRAM RUNS times,
 * its output to /dev/null, and report the median wall time of a run and
 * the children's soft page faults per run. Usage: startup RUNS PROGRAM
 * [ARGS...] */
#include "common.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>

extern char **environ;

int main(int argc, char **argv)
{
    if (argc < 3)
        return fprintf(stderr, "usage: startup RUNS PROGRAM [ARGS...]\n"), 2;
    long runs = atol(argv[1]);
    if (runs < 1)
        return fprintf(stderr, "startup: RUNS must be at least 1\n"), 2;
    double *ns = malloc(sizeof(double) * (size_t)runs);
    posix_spawn_file_actions_t quiet;
    posix_spawn_file_actions_init(&quiet);
    posix_spawn_file_actions_addopen(&quiet, 1, "/dev/null", O_WRONLY, 0);
    long faults = 0;
    for (long i = 0; i < runs; i++) {
        double t0 = now_ns();
        pid_t pid;
        int status;
        struct rusage ru;
        if (posix_spawn(&pid, argv[2], &quiet, NULL, argv + 2, environ) != 0)
            return fprintf(stderr, "startup: cannot run %s\n", argv[2]), 1;
        if (wait4(pid, &status, 0, &ru) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
            return fprintf(stderr, "startup: %s did not exit with 0\n", argv[2]), 1;
        ns[i] = now_ns() - t0;
        faults += ru.ru_minflt;
    }
    report("faults_per_run", (double)faults / (double)runs);
    report("median_ns", percentile(ns, (size_t)runs, 0.50));
    return 0;
}
