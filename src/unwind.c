/* The unwinder of the heap profile's samples: the calling thread's return
 * addresses, read from the stack by the call frame information every
 * binary GCC or Clang builds carries in .eh_frame (for C++ exceptions and
 * thread cancellation), so that it needs no frame pointers: Debian builds
 * python3, git and redis-server without them.
 *
 * libgcc's _Unwind_Backtrace reads the same tables, but interprets a
 * function's whole CFA program at every frame of every walk: 12,000
 * instructions a sample of seven frames (bench battle json, callgrind),
 * three times the allocation rate of a program that allocates 64 KiB
 * blocks without touching them. On x86-64 this file interprets each
 * return address's program once and keeps the outcome, the rule that
 * finds the caller's frame from this one (where the canonical frame
 * address is, where the return address and the caller's rbp were saved),
 * in a cache: a walk is then a lookup and two loads a frame. A return
 * address's tables are found once, by its module's .eh_frame_hdr search
 * table: the module from _dl_find_object (glibc 2.35 and later), which
 * takes no lock and never allocates, else from dl_iterate_phdr (musl),
 * called with no lock of hakmem's held. Other architectures walk with
 * libgcc's _Unwind_Backtrace.
 *
 * A walk ends where a frame's rule cannot be read (no tables: JIT code,
 * a hand-written function without CFI; a rule this file does not model:
 * a CFA computed by a DWARF expression, as in PLT entries and signal
 * trampolines), where the return address is undefined (_start, a
 * thread's start), and where the next frame would not lie above this one
 * within UNWIND_FRAME_MAX bytes (a corrupt stack); it never follows a
 * pointer it has not checked so. */
#define _GNU_SOURCE
#include "profile.h"

#include <dlfcn.h>
#include <link.h>
#include <pthread.h>
#include <string.h>
#include <unwind.h>

#define UNWIND_SKIP_MAX 24 /* hakmem's own frames above the call site, at most */

typedef struct walk {
    uintptr_t site;   /* the return address of the program's call into hakmem */
    uintptr_t *frames;
    unsigned depth, max, skipped;
} walk_t;

/* Keep frame pc; false once the walk has all it wants. */
static bool walk_keep(walk_t *w, uintptr_t pc)
{
    if (!w->depth && pc != w->site) /* still inside hakmem */
        return ++w->skipped < UNWIND_SKIP_MAX;
    w->frames[w->depth++] = pc;
    return w->depth < w->max;
}

#if defined(__x86_64__)

#define RULE_CACHE 4096             /* return addresses, a power of two */
#define UNWIND_FRAME_MAX (64 << 20) /* a frame larger than this ends the walk */
#define STATE_STACK 8               /* DW_CFA_remember_state's depth */

/* DWARF's register numbers on x86-64. */
enum { REG_RBP = 6, REG_RSP = 7, REG_RA = 16 };

/* The caller's frame from this one: CFA = (rsp or rbp) + cfa_offset; the
 * return address at CFA + ra_offset; the caller's rbp at CFA +
 * rbp_offset, or unchanged where rbp_saved is false. */
typedef struct unwind_rule {
    uintptr_t pc;       /* the return address it is for, 0 for a free slot */
    int32_t cfa_offset;
    int16_t ra_offset;
    int16_t rbp_offset;
    uint8_t cfa_reg;    /* REG_RSP or REG_RBP */
    bool rbp_saved;
    bool usable;        /* false: the walk ends at this address */
} unwind_rule_t;

static pthread_mutex_t rule_lock = PTHREAD_MUTEX_INITIALIZER;
static unwind_rule_t *rules; /* RULE_CACHE of them, mapped at the first walk */

/* ---- reading .eh_frame ------------------------------------------------------ */

typedef struct reader {
    const uint8_t *at, *end;
    bool bad;
} reader_t;

static uint64_t read_uleb(reader_t *r)
{
    uint64_t v = 0;
    for (unsigned shift = 0; r->at < r->end; shift += 7) {
        uint8_t b = *r->at++;
        if (shift < 64)
            v |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80))
            return v;
    }
    r->bad = true;
    return 0;
}

static int64_t read_sleb(reader_t *r)
{
    int64_t v = 0;
    unsigned shift = 0;
    uint8_t b = 0;
    do {
        if (r->at >= r->end) {
            r->bad = true;
            return 0;
        }
        b = *r->at++;
        if (shift < 64)
            v |= (int64_t)(b & 0x7f) << shift;
        shift += 7;
    } while (b & 0x80);
    if (shift < 64 && (b & 0x40))
        v |= -((int64_t)1 << shift);
    return v;
}

static uint64_t read_fixed(reader_t *r, unsigned size)
{
    if (r->end - r->at < (ptrdiff_t)size) {
        r->bad = true;
        return 0;
    }
    uint64_t v = 0;
    memcpy(&v, r->at, size); /* little-endian */
    r->at += size;
    return v;
}

/* A value of pointer encoding enc (DW_EH_PE_*), its format only: the
 * FDE's address range, and the CIE's personality skipped over. */
static uint64_t read_encoded(reader_t *r, uint8_t enc)
{
    switch (enc & 0x0f) {
    case 0x00: return read_fixed(r, 8);
    case 0x01: return read_uleb(r);
    case 0x02: return read_fixed(r, 2);
    case 0x03: return read_fixed(r, 4);
    case 0x04: return read_fixed(r, 8);
    case 0x09: return (uint64_t)read_sleb(r);
    case 0x0a: return (uint64_t)(int64_t)(int16_t)read_fixed(r, 2);
    case 0x0b: return (uint64_t)(int64_t)(int32_t)read_fixed(r, 4);
    case 0x0c: return read_fixed(r, 8);
    default: r->bad = true; return 0;
    }
}

/* What the CFA program has said so far about the registers the walk
 * follows. */
typedef struct cfa_state {
    int64_t cfa_offset;
    uint64_t cfa_reg;
    int64_t ra_offset, rbp_offset;
    bool ra_saved, rbp_saved, ra_undefined, modelled;
} cfa_state_t;

typedef struct cie_info {
    uint64_t code_align;
    int64_t data_align;
    uint64_t ra_reg;
    uint8_t fde_encoding;
    bool augmented; /* 'z': the FDE has augmentation data to skip */
    reader_t program;
} cie_info_t;

static bool parse_cie(const uint8_t *cie, cie_info_t *out)
{
    reader_t r = {.at = cie, .end = cie + 16};
    uint64_t length = read_fixed(&r, 4);
    if (length == 0xffffffffu || length < 8)
        return false;
    r.end = cie + 4 + length;
    if (read_fixed(&r, 4) != 0) /* CIE id */
        return false;
    uint8_t version = (uint8_t)read_fixed(&r, 1);
    if (r.bad || r.at >= r.end)
        return false;
    const char *aug = (const char *)r.at;
    size_t aug_len = strnlen(aug, (size_t)(r.end - r.at));
    r.at += aug_len + 1;
    if (version >= 4)
        r.at += 2; /* address and segment selector sizes */
    out->code_align = read_uleb(&r);
    out->data_align = read_sleb(&r);
    out->ra_reg = version == 1 ? read_fixed(&r, 1) : read_uleb(&r);
    out->fde_encoding = 0;
    out->augmented = aug[0] == 'z';
    if (out->augmented) {
        uint64_t data_len = read_uleb(&r);
        const uint8_t *data_end = r.at + data_len;
        for (size_t i = 1; i < aug_len && !r.bad; i++) {
            if (aug[i] == 'R') {
                out->fde_encoding = (uint8_t)read_fixed(&r, 1);
            } else if (aug[i] == 'P') {
                uint8_t enc = (uint8_t)read_fixed(&r, 1);
                read_encoded(&r, enc);
            } else if (aug[i] == 'L') {
                read_fixed(&r, 1);
            } else if (aug[i] != 'S' && aug[i] != 'B') {
                break; /* unknown: the length says where the data ends */
            }
        }
        r.at = data_end;
    }
    out->program = (reader_t){.at = r.at, .end = r.end};
    return !r.bad && r.at <= r.end;
}

/* Register reg saved at CFA + offset. */
static void saved_at(cfa_state_t *s, uint64_t reg, int64_t offset)
{
    if (reg == REG_RA)
        s->ra_offset = offset, s->ra_saved = true;
    else if (reg == REG_RBP)
        s->rbp_offset = offset, s->rbp_saved = true;
}

/* Register reg's rule back to the CIE's (initial: NULL while running the CIE's own). */
static void restored(cfa_state_t *s, uint64_t reg, const cfa_state_t *initial)
{
    if (initial && reg == REG_RBP)
        s->rbp_offset = initial->rbp_offset, s->rbp_saved = initial->rbp_saved;
    if (initial && reg == REG_RA)
        s->ra_offset = initial->ra_offset, s->ra_saved = initial->ra_saved;
}

/* Run a CFA program up to (not past) location target, from loc. initial:
 * the state after the CIE's program (DW_CFA_restore's), NULL while
 * running it. */
static void run_cfa(reader_t r, const cie_info_t *cie, uintptr_t loc, uintptr_t target, cfa_state_t *s,
                    const cfa_state_t *initial)
{
    cfa_state_t saved[STATE_STACK];
    unsigned depth = 0;
    while (r.at < r.end && !r.bad && s->modelled) {
        uint8_t op = *r.at++;
        uint64_t reg = op & 0x3f, delta = 0;
        switch (op >> 6) {
        case 1: /* advance_loc */
            delta = reg * cie->code_align;
            break;
        case 2: /* offset */
            saved_at(s, reg, (int64_t)read_uleb(&r) * cie->data_align);
            continue;
        case 3: /* restore */
            restored(s, reg, initial);
            continue;
        default:
            switch (op) {
            case 0x00: /* nop */
                continue;
            case 0x02: delta = read_fixed(&r, 1) * cie->code_align; break;
            case 0x03: delta = read_fixed(&r, 2) * cie->code_align; break;
            case 0x04: delta = read_fixed(&r, 4) * cie->code_align; break;
            case 0x05: case 0x11: /* offset_extended(_sf) */
                reg = read_uleb(&r);
                saved_at(s, reg, (op == 0x05 ? (int64_t)read_uleb(&r) : read_sleb(&r)) * cie->data_align);
                continue;
            case 0x06: /* restore_extended */
                restored(s, read_uleb(&r), initial);
                continue;
            case 0x08: /* same_value */
                reg = read_uleb(&r);
                if (reg == REG_RBP)
                    s->rbp_saved = false;
                if (reg == REG_RA)
                    s->modelled = false;
                continue;
            case 0x07: /* undefined */
                reg = read_uleb(&r);
                if (reg == REG_RA)
                    s->ra_undefined = true;
                else if (reg == REG_RBP)
                    s->rbp_saved = false; /* its value is lost; frames above do not need it */
                continue;
            case 0x09: /* register: one register kept in another */
                reg = read_uleb(&r);
                read_uleb(&r);
                if (reg == REG_RA || reg == REG_RBP)
                    s->modelled = false;
                continue;
            case 0x0a:
                if (depth == STATE_STACK)
                    s->modelled = false;
                else
                    saved[depth++] = *s;
                continue;
            case 0x0b: /* restore_state: every rule, the CFA's too, as GCC's code expects */
                if (!depth)
                    s->modelled = false;
                else
                    *s = saved[--depth];
                continue;
            case 0x0c: s->cfa_reg = read_uleb(&r); s->cfa_offset = (int64_t)read_uleb(&r); continue;
            case 0x0d: s->cfa_reg = read_uleb(&r); continue;
            case 0x0e: s->cfa_offset = (int64_t)read_uleb(&r); continue;
            case 0x12: s->cfa_reg = read_uleb(&r); s->cfa_offset = read_sleb(&r) * cie->data_align; continue;
            case 0x13: s->cfa_offset = read_sleb(&r) * cie->data_align; continue;
            case 0x10: case 0x16: { /* expression, val_expression */
                reg = read_uleb(&r);
                uint64_t len = read_uleb(&r);
                r.at += len;
                if (reg == REG_RA || reg == REG_RBP)
                    s->modelled = false;
                continue;
            }
            case 0x14: case 0x15: /* val_offset(_sf) */
                reg = read_uleb(&r);
                if (op == 0x14)
                    read_uleb(&r);
                else
                    read_sleb(&r);
                if (reg == REG_RA || reg == REG_RBP)
                    s->modelled = false;
                continue;
            case 0x2e: read_uleb(&r); continue;  /* GNU_args_size */
            default: /* def_cfa_expression, set_loc and anything else */
                s->modelled = false;
                continue;
            }
        }
        if (loc + delta > target)
            return;
        loc += delta;
    }
    if (r.bad)
        s->modelled = false;
}

/* ---- finding a PC's FDE ------------------------------------------------------- */

#ifndef DLFO_EH_SEGMENT_TYPE
typedef struct phdr_search {
    uintptr_t pc;
    const uint8_t *eh_frame_hdr;
} phdr_search_t;

static int phdr_visit(struct dl_phdr_info *info, size_t size, void *arg)
{
    phdr_search_t *search = arg;
    const ElfW(Phdr) *eh = NULL;
    bool holds = false;
    for (ElfW(Half) i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        uintptr_t start = info->dlpi_addr + ph->p_vaddr;
        if (ph->p_type == PT_LOAD && search->pc >= start && search->pc - start < ph->p_memsz)
            holds = true;
        if (ph->p_type == PT_GNU_EH_FRAME)
            eh = ph;
    }
    if (!holds)
        return 0;
    search->eh_frame_hdr = eh ? (const uint8_t *)(info->dlpi_addr + eh->p_vaddr) : NULL;
    return 1;
}
#endif

/* The .eh_frame_hdr of the module holding pc, or NULL. */
static const uint8_t *eh_frame_hdr_of(uintptr_t pc)
{
#ifdef DLFO_EH_SEGMENT_TYPE
    struct dl_find_object found;
    return _dl_find_object((void *)pc, &found) == 0 ? found.dlfo_eh_frame : NULL;
#else
    phdr_search_t search = {.pc = pc};
    dl_iterate_phdr(phdr_visit, &search);
    return search.eh_frame_hdr;
#endif
}

/* The FDE that may cover pc, by the binary search table of its module's
 * .eh_frame_hdr (entries of 4-byte offsets from the header, sorted by
 * their function's start: the encoding every linker writes), and its
 * function's start in *func. */
static const uint8_t *fde_of(uintptr_t pc, uintptr_t *func)
{
    const uint8_t *hdr = eh_frame_hdr_of(pc);
    if (!hdr || hdr[0] != 1 || hdr[3] != 0x3b) /* version 1, table DW_EH_PE_datarel | sdata4 */
        return NULL;
    reader_t r = {.at = hdr + 4, .end = hdr + 4 + 16};
    read_encoded(&r, hdr[1]); /* eh_frame_ptr */
    uint64_t count = read_encoded(&r, hdr[2]);
    if (r.bad || !count)
        return NULL;
    const int32_t *table = (const int32_t *)r.at;
    size_t lo = 0, hi = (size_t)count;
    while (hi - lo > 1) { /* the last entry starting at or before pc */
        size_t mid = lo + (hi - lo) / 2;
        if ((uintptr_t)(hdr + table[2 * mid]) <= pc)
            lo = mid;
        else
            hi = mid;
    }
    if ((uintptr_t)(hdr + table[2 * lo]) > pc)
        return NULL;
    *func = (uintptr_t)(hdr + table[2 * lo]);
    return hdr + table[2 * lo + 1];
}

/* The rule for return address pc, from its FDE. */
static unwind_rule_t rule_for(uintptr_t pc)
{
    unwind_rule_t rule = {.pc = pc};
    uintptr_t start = 0;
    const uint8_t *fde = fde_of(pc - 1, &start);
    if (!fde)
        return rule;
    reader_t r = {.at = fde, .end = fde + 8};
    uint64_t length = read_fixed(&r, 4);
    if (length == 0xffffffffu || length < 8)
        return rule;
    r.end = fde + 4 + length;
    const uint8_t *id_at = r.at;
    uint32_t cie_offset = (uint32_t)read_fixed(&r, 4);
    cie_info_t cie;
    if (!parse_cie(id_at - cie_offset, &cie))
        return rule;
    read_encoded(&r, cie.fde_encoding); /* pc_begin: the search table's start */
    uint64_t range = read_encoded(&r, cie.fde_encoding & 0x0f);
    if (pc - 1 - start >= range) /* between two functions: no FDE covers it */
        return rule;
    if (cie.augmented)
        r.at += read_uleb(&r);
    if (r.bad || r.at > r.end)
        return rule;
    cfa_state_t s = {.cfa_reg = REG_RSP, .modelled = true};
    run_cfa(cie.program, &cie, start, UINTPTR_MAX, &s, NULL);
    cfa_state_t initial = s;
    run_cfa(r, &cie, start, pc - 1, &s, &initial);
    if (!s.modelled || s.ra_undefined || cie.ra_reg != REG_RA || !s.ra_saved ||
        (s.cfa_reg != REG_RSP && s.cfa_reg != REG_RBP) || s.cfa_offset <= 0 || s.cfa_offset > INT32_MAX ||
        s.ra_offset < INT16_MIN || s.ra_offset > INT16_MAX || s.rbp_offset < INT16_MIN || s.rbp_offset > INT16_MAX)
        return rule;
    rule.cfa_offset = (int32_t)s.cfa_offset;
    rule.cfa_reg = (uint8_t)s.cfa_reg;
    rule.ra_offset = (int16_t)s.ra_offset;
    rule.rbp_offset = (int16_t)s.rbp_offset;
    rule.rbp_saved = s.rbp_saved;
    rule.usable = true;
    return rule;
}

/* ---- the walk ------------------------------------------------------------------ */

static unwind_rule_t *rule_slot(uintptr_t pc) { return &rules[((pc * 0x9e3779b97f4a7c15ull) >> 40) & (RULE_CACHE - 1)]; }

/* Under rule_lock: the rule for pc, found or computed (the lock released
 * meanwhile: the FDE lookup may take the loader's lock where
 * _dl_find_object is missing, and a thread holding that lock may be
 * sampling). */
static unwind_rule_t rule_of(uintptr_t pc)
{
    unwind_rule_t *slot = rule_slot(pc);
    if (slot->pc == pc)
        return *slot;
    pthread_mutex_unlock(&rule_lock);
    unwind_rule_t rule = rule_for(pc);
    pthread_mutex_lock(&rule_lock);
    *rule_slot(pc) = rule;
    return rule;
}

/* Frame pointers in this function only: its caller's frame is then read
 * without a rule (the return address at rbp + 8, the caller's rbp at
 * rbp, its stack pointer rbp + 16), and the walk starts there. */
__attribute__((noinline, optimize("no-omit-frame-pointer"))) static void walk_stack(walk_t *w)
{
    const uintptr_t *fp = __builtin_frame_address(0);
    uintptr_t pc = fp[1], rbp = fp[0], sp = (uintptr_t)(fp + 2);
    pthread_mutex_lock(&rule_lock);
    if (!rules) {
        rules = os_map(RULE_CACHE * sizeof *rules);
        if (!rules) {
            pthread_mutex_unlock(&rule_lock);
            return;
        }
    }
    while (pc && walk_keep(w, pc)) {
        unwind_rule_t rule = rule_of(pc);
        if (!rule.usable)
            break;
        uintptr_t cfa = (rule.cfa_reg == REG_RSP ? sp : rbp) + (uintptr_t)(intptr_t)rule.cfa_offset;
        if (cfa <= sp || cfa - sp > UNWIND_FRAME_MAX || (cfa & 7))
            break;
        uintptr_t caller_rbp = rule.rbp_saved ? *(const uintptr_t *)(cfa + (uintptr_t)(intptr_t)rule.rbp_offset) : rbp;
        pc = *(const uintptr_t *)(cfa + (uintptr_t)(intptr_t)rule.ra_offset);
        sp = cfa;
        rbp = caller_rbp;
    }
    pthread_mutex_unlock(&rule_lock);
}

#else /* other architectures: libgcc's walk */

static _Unwind_Reason_Code unwind_frame(struct _Unwind_Context *context, void *arg)
{
    uintptr_t pc = (uintptr_t)_Unwind_GetIP(context);
    return pc && walk_keep(arg, pc) ? _URC_NO_REASON : _URC_END_OF_STACK;
}

static void walk_stack(walk_t *w) { _Unwind_Backtrace(unwind_frame, w); }

#endif

/* The calling thread's return addresses from site (the return address of
 * its call into hakmem) on, up to max into frames; returns how many, 0
 * where site was not met within UNWIND_SKIP_MAX frames. */
unsigned unwind_from(uintptr_t site, uintptr_t *frames, unsigned max)
{
    walk_t w = {.site = site, .frames = frames, .max = max};
    walk_stack(&w);
    return w.depth;
}

void unwind_fork_prepare(void)
{
#if defined(__x86_64__)
    pthread_mutex_lock(&rule_lock);
#endif
}

void unwind_fork_parent(void)
{
#if defined(__x86_64__)
    pthread_mutex_unlock(&rule_lock);
#endif
}

void unwind_fork_child(void)
{
#if defined(__x86_64__)
    pthread_mutex_unlock(&rule_lock);
#endif
}
