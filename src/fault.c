/* A fault inside the allocator gets a line that names hakmem and the
 * likely cause before the process dies as it would have. The default
 * library follows its free lists without checking them (checks would cost
 * the fast path): a write to a freed block or past a block's end plants a
 * pointer that a later malloc follows, and the process dies in malloc,
 * far from the bad write, with nothing said. The handler tells that story
 * and names the hardened library, which checks every link and stops at
 * the bad block.
 *
 * Installed at init where SIGSEGV and SIGBUS are still the default (a
 * sanitizer's or the program's own handler comes first and stays; one the
 * program sets later replaces this one). A fault outside hakmem's code
 * says nothing. Either way the handler puts the default action back and
 * returns: the faulting instruction runs again and the process ends by
 * the same signal, with its core dump, as without the handler. A program
 * linked statically with hakmem has no handler: its code and hakmem's are
 * one module, and a fault in the program's code must not be blamed on the
 * allocator. HAKMEM_FAULT_MESSAGE=0 leaves the signals alone. */
#define _GNU_SOURCE
#include "error.h"
#include "os.h"

#include <link.h>
#include <signal.h>
#include <sys/auxv.h>
#include <ucontext.h>

static uintptr_t base, text_start, text_end; /* hakmem's load address and executable segment */

#define STACK_NEAR ((uintptr_t)64 << 10) /* a fault this close to the stack pointer: the stack overflowed */

static void registers(const ucontext_t *uc, uintptr_t *pc, uintptr_t *sp)
{
#if defined(__x86_64__)
    *pc = (uintptr_t)uc->uc_mcontext.gregs[REG_RIP];
    *sp = (uintptr_t)uc->uc_mcontext.gregs[REG_RSP];
#elif defined(__aarch64__)
    *pc = (uintptr_t)uc->uc_mcontext.pc;
    *sp = (uintptr_t)uc->uc_mcontext.sp;
#else
    *pc = *sp = 0;
#endif
}

static void on_fault(int sig, siginfo_t *info, void *context)
{
    uintptr_t pc, sp, address = (uintptr_t)info->si_addr;
    registers(context, &pc, &sp);
    if (info->si_code > 0 && pc >= text_start && pc < text_end) {
        msgbuf_t m = {.len = 0};
        msg_str(&m, sig == SIGBUS ? "hakmem: SIGBUS" : "hakmem: SIGSEGV");
        msg_str(&m, " inside the allocator (code at libhakmem+");
        msg_ptr(&m, (void *)(pc - base));
        if (info->si_code == SI_KERNEL) { /* x86-64: an address no mapping can have */
            msg_str(&m, ", an address outside the address space):\n");
        } else {
            msg_str(&m, ", memory at ");
            msg_ptr(&m, (void *)address);
            msg_str(&m, "):\n");
        }
        os_write_stderr(m.buf, m.len);
        static const char stack[] = "hakmem: the thread's stack overflowed\n";
        static const char heap[] =
            "hakmem: its free lists or block headers were overwritten, most likely by a write to a freed block "
            "or past the end of a block, somewhere before this call; LD_PRELOAD=libhakmem-secure.so (the "
            "hardened library) checks every link and stops at the block that was written\n";
        if (address + STACK_NEAR >= sp && address < sp + STACK_NEAR)
            os_write_stderr(stack, sizeof stack - 1);
        else
            os_write_stderr(heap, sizeof heap - 1);
    }
    struct sigaction fallback = {.sa_handler = SIG_DFL};
    sigemptyset(&fallback.sa_mask);
    sigaction(sig, &fallback, NULL);
    if (info->si_code <= 0) /* sent by kill or raise, not a fault: deliver it again */
        raise(sig);
}

/* The module's own ELF header, where the linker put it: hakmem's code is
 * its executable segment. Read from memory, with no lock: init may run
 * inside the loader. */
extern const ElfW(Ehdr) __ehdr_start __attribute__((visibility("hidden")));

void fault_message_init(void)
{
    const ElfW(Ehdr) *h = &__ehdr_start;
    const ElfW(Phdr) *phdrs = (const ElfW(Phdr) *)((const char *)h + h->e_phoff);
    if ((uintptr_t)phdrs == getauxval(AT_PHDR))
        return; /* the program itself: hakmem was linked statically */
    base = (uintptr_t)h;
    for (unsigned i = 0; i < h->e_phnum; i++) {
        const ElfW(Phdr) *p = &phdrs[i];
        if (p->p_type == PT_LOAD) {
            base = (uintptr_t)h - p->p_vaddr; /* the first segment holds the header */
            break;
        }
    }
    for (unsigned i = 0; i < h->e_phnum; i++) {
        const ElfW(Phdr) *p = &phdrs[i];
        if (p->p_type == PT_LOAD && (p->p_flags & PF_X)) {
            text_start = base + p->p_vaddr;
            text_end = text_start + p->p_memsz;
        }
    }
    static const int signals[] = {SIGSEGV, SIGBUS};
    for (unsigned k = 0; text_end && k < 2; k++) {
        struct sigaction old;
        if (sigaction(signals[k], NULL, &old) != 0 || (old.sa_flags & SA_SIGINFO) || old.sa_handler != SIG_DFL)
            continue;
        struct sigaction action = {.sa_sigaction = on_fault, .sa_flags = SA_SIGINFO | SA_ONSTACK};
        sigemptyset(&action.sa_mask);
        sigaction(signals[k], &action, NULL);
    }
}
