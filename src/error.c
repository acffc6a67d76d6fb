/* Diagnostics: one line on stderr naming hakmem, built without malloc or
 * stdio (either may be what is broken), then abort or carry on as
 * HAKMEM_ON_ERROR says. */
#include "error.h"
#include "os.h"

#include <stdlib.h>
#include <string.h>

void msg_str(msgbuf_t *m, const char *s)
{
    while (*s && m->len < sizeof m->buf - 1)
        m->buf[m->len++] = *s++;
}

void msg_uint(msgbuf_t *m, uint64_t v)
{
    char digits[24];
    int n = 0;
    do {
        digits[n++] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    while (n > 0 && m->len < sizeof m->buf - 1)
        m->buf[m->len++] = digits[--n];
}

void msg_ptr(msgbuf_t *m, const void *p)
{
    static const char hex[] = "0123456789abcdef";
    uintptr_t v = (uintptr_t)p;
    char digits[2 * sizeof v];
    int n = 0;
    do {
        digits[n++] = hex[v & 15];
        v >>= 4;
    } while (v);
    msg_str(m, "0x");
    while (n > 0 && m->len < sizeof m->buf - 1)
        m->buf[m->len++] = digits[--n];
}

static void msg_emit(msgbuf_t *m)
{
    m->buf[m->len++] = '\n';
    os_write_stderr(m->buf, m->len);
}

void hak_report_bad_pointer(const char *op, const void *p, const char *fault)
{
    msgbuf_t m = {.len = 0};
    msg_str(&m, "hakmem: ");
    msg_str(&m, op);
    msg_str(&m, "(");
    msg_ptr(&m, p);
    msg_str(&m, "): ");
    msg_str(&m, fault);
    bool warn = hak_config.on_error == ON_ERROR_WARN;
    msg_str(&m, warn ? "; ignored (HAKMEM_ON_ERROR=warn)" : "; aborting (set HAKMEM_ON_ERROR=warn to ignore)");
    msg_emit(&m);
    if (!warn)
        abort();
}

/* Hardened build: a free list link points out of its SuperSlab. Nothing
 * can be trusted any more, whatever HAKMEM_ON_ERROR says. */
void hak_free_list_corrupt(const void *b)
{
    msgbuf_t m = {.len = 0};
    msg_str(&m, "hakmem: malloc: free list corrupted at ");
    msg_ptr(&m, b);
    msg_str(&m, " (a write to freed memory?); aborting");
    msg_emit(&m);
    abort();
}

void hak_warn(const char *what, const char *detail)
{
    msgbuf_t m = {.len = 0};
    msg_str(&m, "hakmem: warning: ");
    msg_str(&m, what);
    if (detail) {
        msg_str(&m, ": ");
        msg_str(&m, detail);
    }
    msg_emit(&m);
}

void hak_fatal(const char *what)
{
    msgbuf_t m = {.len = 0};
    msg_str(&m, "hakmem: fatal: ");
    msg_str(&m, what);
    msg_emit(&m);
    abort();
}

void hak_assert_fail(const char *cond, const char *file, int line)
{
    msgbuf_t m = {.len = 0};
    msg_str(&m, "hakmem: assertion failed: ");
    msg_str(&m, cond);
    msg_str(&m, " at ");
    msg_str(&m, file);
    msg_str(&m, ":");
    msg_uint(&m, (uint64_t)line);
    msg_emit(&m);
    abort();
}
