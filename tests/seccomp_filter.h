/* A seccomp filter as a sandbox installs one (OpenSSH's kills on clone
 * and membarrier): the usual calls let through, open as `open_allowed`
 * says (else EACCES), the process killed for any other call
 * (test_release seccomp, test_mesh auto). */
#ifndef HAKMEM_TEST_SECCOMP_FILTER_H
#define HAKMEM_TEST_SECCOMP_FILTER_H

#include <errno.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/prctl.h>
#include <sys/syscall.h>

static inline bool install_filter(bool open_allowed)
{
    static const long usual[] = {SYS_read, SYS_write, SYS_writev /* musl's stdio */, SYS_close, SYS_exit,
                                 SYS_exit_group, SYS_mmap, SYS_munmap, SYS_mprotect, SYS_mremap, SYS_madvise, SYS_brk,
                                 SYS_futex, SYS_clock_gettime, SYS_clock_nanosleep, SYS_nanosleep,
                                 SYS_rt_sigprocmask, SYS_getpid, SYS_gettid, SYS_getrandom, SYS_fstat,
                                 SYS_newfstatat, SYS_lseek,
                                 SYS_getrusage,    /* hak_stats_get's, for the tests' own figures */
                                 SYS_sched_yield}; /* a wait on a purger thread started before the filter */
    enum { USUAL = sizeof usual / sizeof usual[0] };
    struct sock_filter code[1 + 2 * USUAL + 3];
    unsigned n = 0;
    code[n++] = (struct sock_filter)BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr));
    for (unsigned i = 0; i < USUAL; i++) {
        code[n++] = (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, (uint32_t)usual[i], 0, 1);
        code[n++] = (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW);
    }
    code[n++] = (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_openat, 0, 1);
    code[n++] = (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, open_allowed ? SECCOMP_RET_ALLOW : SECCOMP_RET_ERRNO | EACCES);
    code[n++] = (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS);
    struct sock_fprog program = {(unsigned short)n, code};
    return prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0 && prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &program) == 0;
}

#endif
