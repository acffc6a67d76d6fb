/* Layer 2, diagnostics (error.c, fault.c): one-line messages written
 * without malloc or stdio, the reports of bad pointers and corrupt lists,
 * and of faults inside the allocator. */
#ifndef HAKMEM_ERROR_H
#define HAKMEM_ERROR_H

#include "config.h"

void hak_free_list_corrupt(const void *b) __attribute__((noreturn, cold));
/* A growing message line without malloc or stdio. */
typedef struct msgbuf {
    char buf[256];
    size_t len;
} msgbuf_t;

void msg_str(msgbuf_t *m, const char *s);
void msg_ptr(msgbuf_t *m, const void *p);
void msg_uint(msgbuf_t *m, uint64_t v);

void hak_report_bad_pointer(const char *op, const void *p, const char *fault);
void hak_warn(const char *what, const char *detail);
void hak_fatal(const char *what) __attribute__((noreturn));

/* fault.c: a message for a fault inside hakmem's code, where SIGSEGV and
 * SIGBUS are at their default. */
void fault_message_init(void);

#endif
