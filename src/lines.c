/* Source file and line of a code address, from a module's DWARF line
 * table (.debug_line, DWARF versions 2 to 5), for the report's frames:
 * "site_big+0x9 at tests/two_sites.c:23". The line programs of every unit
 * are run once, at report time, into rows sorted by address; a lookup is
 * a binary search. A row stands for the addresses from its own to the
 * next row's; a sequence's end row (line 0) ends the range, so an address
 * between two sequences has no line.
 *
 * Only what a line needs is kept: the rows and the paths of the files
 * rows name (not every header a unit lists). A path is as the compiler
 * recorded it, relative to the directory it was compiled in where it was
 * given so ("tests/two_sites.c"), absolute otherwise. Read with the
 * report's own untracked allocations; a malformed unit is skipped, the
 * others still name their lines. */
#include "report.h"

#include <stdlib.h>
#include <string.h>

struct line_row {
    uint64_t address;
    uint32_t path; /* offset of the file's path in the table's paths */
    uint32_t line; /* 0: the end of a sequence */
};

typedef struct cursor {
    const unsigned char *at, *end;
    bool bad; /* read past the end */
} cursor_t;

static void skip(cursor_t *c, uint64_t n)
{
    if ((uint64_t)(c->end - c->at) < n) {
        c->bad = true;
        c->at = c->end;
    } else {
        c->at += n;
    }
}

/* An unsigned little-endian integer of n bytes (at most 8). */
static uint64_t read_fixed(cursor_t *c, unsigned n)
{
    if ((size_t)(c->end - c->at) < n) {
        skip(c, n);
        return 0;
    }
    uint64_t v = 0;
    for (unsigned i = 0; i < n; i++)
        v |= (uint64_t)c->at[i] << (8 * i);
    c->at += n;
    return v;
}

static uint64_t read_uleb(cursor_t *c)
{
    uint64_t v = 0;
    for (unsigned shift = 0; c->at < c->end; shift += 7) {
        unsigned char b = *c->at++;
        if (shift < 64)
            v |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80))
            return v;
    }
    c->bad = true;
    return v;
}

static int64_t read_sleb(cursor_t *c)
{
    uint64_t v = 0;
    for (unsigned shift = 0; c->at < c->end;) {
        unsigned char b = *c->at++;
        if (shift < 64)
            v |= (uint64_t)(b & 0x7f) << shift;
        shift += 7;
        if (!(b & 0x80)) {
            if (shift < 64 && (b & 0x40))
                v |= ~(uint64_t)0 << shift;
            return (int64_t)v;
        }
    }
    c->bad = true;
    return (int64_t)v;
}

static const char *read_string(cursor_t *c)
{
    const unsigned char *s = c->at, *nul = memchr(s, 0, (size_t)(c->end - s));
    if (!nul) {
        skip(c, (uint64_t)(c->end - s) + 1);
        return NULL;
    }
    c->at = nul + 1;
    return (const char *)s;
}

/* The string at offset in a string section, NULL if outside it. */
static const char *section_string(const dwarf_section_t *s, uint64_t offset)
{
    if (!s->data || offset >= s->size || !memchr(s->data + offset, 0, s->size - offset))
        return NULL;
    return (const char *)s->data + offset;
}

/* Room for one more element of size `each` in *array (of *capacity). */
static bool make_room(void **array, size_t *capacity, size_t count, size_t each)
{
    if (count < *capacity)
        return true;
    size_t grown = *capacity ? 2 * *capacity : 64;
    void *p = hak_alloc(grown * each, 0); /* site 0: never tracked */
    if (!p)
        return false;
    if (*array) {
        memcpy(p, *array, count * each);
        hak_free_checked(*array, "free");
    }
    *array = p;
    *capacity = grown;
    return true;
}

/* ---- one unit's directories and files --------------------------------------- */

/* DWARF 5's forms and content types that a line table header uses. */
enum {
    FORM_BLOCK = 0x09, FORM_DATA1 = 0x0b, FORM_DATA2 = 0x05, FORM_DATA4 = 0x06, FORM_DATA8 = 0x07,
    FORM_DATA16 = 0x1e, FORM_STRING = 0x08, FORM_STRP = 0x0e, FORM_LINE_STRP = 0x1f, FORM_UDATA = 0x0f,
    FORM_STRX = 0x1a, FORM_STRX1 = 0x25, FORM_STRX2 = 0x26, FORM_STRX3 = 0x27, FORM_STRX4 = 0x28,
};
enum { LNCT_PATH = 1, LNCT_DIRECTORY_INDEX = 2 };

typedef struct file_entry {
    const char *name; /* NULL: not known */
    uint64_t dir;
    uint32_t path; /* its path's offset in the table, UINT32_MAX until a row names it */
} file_entry_t;

typedef struct unit {
    const dwarf_sections_t *d;
    const uintptr_t *wanted; /* see line_table_read */
    size_t wanted_count;
    uintptr_t bias;
    unsigned version, offset_size;
    const char **dirs;
    size_t dir_count, dir_capacity;
    file_entry_t *files;
    size_t file_count, file_capacity;
} unit_t;

/* A value of the form: its number in *number, or its string. */
static const char *read_form(unit_t *u, cursor_t *c, uint64_t form, uint64_t *number)
{
    *number = 0;
    switch (form) {
    case FORM_STRING: return read_string(c);
    case FORM_LINE_STRP: return section_string(&u->d->line_str, read_fixed(c, u->offset_size));
    case FORM_STRP: return section_string(&u->d->str, read_fixed(c, u->offset_size));
    case FORM_UDATA: *number = read_uleb(c); return NULL;
    case FORM_DATA1: *number = read_fixed(c, 1); return NULL;
    case FORM_DATA2: *number = read_fixed(c, 2); return NULL;
    case FORM_DATA4: *number = read_fixed(c, 4); return NULL;
    case FORM_DATA8: *number = read_fixed(c, 8); return NULL;
    case FORM_DATA16: skip(c, 16); return NULL;
    case FORM_BLOCK: skip(c, read_uleb(c)); return NULL;
    /* Indexes into .debug_str_offsets, whose base only the unit's DIE
     * gives: the name stays unknown. */
    case FORM_STRX: read_uleb(c); return NULL;
    case FORM_STRX1: skip(c, 1); return NULL;
    case FORM_STRX2: skip(c, 2); return NULL;
    case FORM_STRX3: skip(c, 3); return NULL;
    case FORM_STRX4: skip(c, 4); return NULL;
    default: c->bad = true; return NULL;
    }
}

static bool add_file(unit_t *u, const char *name, uint64_t dir)
{
    if (!make_room((void **)&u->files, &u->file_capacity, u->file_count, sizeof *u->files))
        return false;
    u->files[u->file_count++] = (file_entry_t){name, dir, UINT32_MAX};
    return true;
}

static bool add_dir(unit_t *u, const char *name)
{
    if (!make_room((void **)&u->dirs, &u->dir_capacity, u->dir_count, sizeof *u->dirs))
        return false;
    u->dirs[u->dir_count++] = name;
    return true;
}

/* DWARF 5's directory or file entries: a list of (content, form) pairs,
 * then the entries. */
static bool read_entries(unit_t *u, cursor_t *c, bool files)
{
    unsigned formats = (unsigned)read_fixed(c, 1);
    uint64_t content[16], form[16];
    if (formats > 16)
        return false;
    for (unsigned k = 0; k < formats; k++) {
        content[k] = read_uleb(c);
        form[k] = read_uleb(c);
    }
    uint64_t count = read_uleb(c);
    for (uint64_t i = 0; i < count && !c->bad; i++) {
        const char *name = NULL;
        uint64_t dir = 0;
        for (unsigned k = 0; k < formats; k++) {
            uint64_t number;
            const char *s = read_form(u, c, form[k], &number);
            if (content[k] == LNCT_PATH)
                name = s;
            else if (content[k] == LNCT_DIRECTORY_INDEX)
                dir = number;
        }
        if (!(files ? add_file(u, name, dir) : add_dir(u, name)))
            return false;
    }
    return !c->bad;
}

/* DWARF 2-4: directory names then files (name, directory, time, size),
 * each list ending with an empty name. Index 0 is the unit's own: the
 * compile directory, and no file. */
static bool read_legacy_entries(unit_t *u, cursor_t *c)
{
    if (!add_dir(u, NULL) || !add_file(u, NULL, 0))
        return false;
    const char *s;
    while ((s = read_string(c)) && *s)
        if (!add_dir(u, s))
            return false;
    while ((s = read_string(c)) && *s) {
        uint64_t dir = read_uleb(c);
        read_uleb(c);
        read_uleb(c);
        if (!add_file(u, s, dir))
            return false;
    }
    return !c->bad;
}

/* Appends s (n bytes) to the table's paths. */
static bool add_path_text(line_table_t *t, const char *s, size_t n)
{
    while (t->paths_size + n + 1 > t->paths_capacity)
        if (!make_room((void **)&t->paths, &t->paths_capacity, t->paths_capacity, 1))
            return false;
    memcpy(t->paths + t->paths_size, s, n);
    t->paths_size += n;
    return true;
}

/* The path of the unit's file `index`, added to the table when a row
 * first names it; UINT32_MAX if the file is not known. Directory 0 is the
 * compile directory: a name relative to it stays so. */
static uint32_t file_path(line_table_t *t, unit_t *u, uint64_t index)
{
    if (index >= u->file_count || !u->files[index].name)
        return UINT32_MAX;
    file_entry_t *f = &u->files[index];
    if (f->path != UINT32_MAX)
        return f->path;
    if (t->paths_size > UINT32_MAX / 2)
        return UINT32_MAX;
    uint32_t at = (uint32_t)t->paths_size;
    const char *dir = f->name[0] != '/' && f->dir && f->dir < u->dir_count ? u->dirs[f->dir] : NULL;
    if ((dir && (!add_path_text(t, dir, strlen(dir)) || !add_path_text(t, "/", 1))) ||
        !add_path_text(t, f->name, strlen(f->name) + 1)) {
        t->paths_size = at;
        return UINT32_MAX;
    }
    return f->path = at;
}

/* ---- the line program ------------------------------------------------------- */

enum {
    LNS_COPY = 1, LNS_ADVANCE_PC, LNS_ADVANCE_LINE, LNS_SET_FILE, LNS_SET_COLUMN, LNS_NEGATE_STMT,
    LNS_SET_BASIC_BLOCK, LNS_CONST_ADD_PC, LNS_FIXED_ADVANCE_PC,
};
enum { LNE_END_SEQUENCE = 1, LNE_SET_ADDRESS = 2, LNE_DEFINE_FILE = 3 };

typedef struct machine {
    uint64_t address, file, line;
    size_t first;      /* the sequence's first row in the table */
    bool seen, dropped; /* the sequence's first row; whether it was at 0 */
} machine_t;

/* Whether a wanted address lies in [from, to) (link-time addresses). */
static bool covers_wanted(const unit_t *u, uint64_t from, uint64_t to)
{
    if (!u->wanted)
        return true;
    uintptr_t low_address = (uintptr_t)from + u->bias, high_address = (uintptr_t)to + u->bias;
    size_t low = 0, high = u->wanted_count; /* the first wanted at or above from */
    while (low < high) {
        size_t mid = (low + high) / 2;
        if (u->wanted[mid] < low_address)
            low = mid + 1;
        else
            high = mid;
    }
    return low < u->wanted_count && u->wanted[low] < high_address;
}

/* The machine's row. A row at the address of the sequence's last row
 * replaces it (that one covered no addresses); one that names the same
 * line as the last is not needed. Sequences at address 0 are functions
 * the linker dropped. */
static bool add_row(line_table_t *t, unit_t *u, machine_t *m, bool end)
{
    if (!m->seen) {
        m->seen = true;
        m->dropped = !m->address;
    }
    if (m->dropped)
        return true;
    struct line_row row = {m->address, file_path(t, u, m->file), end ? 0 : (uint32_t)m->line};
    if (!end && (row.path == UINT32_MAX || !row.line))
        row.path = UINT32_MAX, row.line = 0; /* no line known here: ends the range before */
    if (t->count > m->first) {
        struct line_row *last = &t->rows[t->count - 1];
        if (last->path == row.path && last->line == row.line && !end)
            return true;
        /* last covers [its address, row's): dropped where no address
         * wanted lies there */
        if (last->address == row.address || !covers_wanted(u, last->address, row.address)) {
            if (end && t->count - 1 == m->first)
                t->count--; /* a sequence that covers nothing wanted */
            else
                *last = row;
            return true;
        }
    } else if (end) {
        return true; /* a sequence without rows */
    }
    if (!make_room((void **)&t->rows, &t->capacity, t->count, sizeof *t->rows))
        return false;
    t->rows[t->count++] = row;
    return true;
}

static bool run_program(line_table_t *t, unit_t *u, cursor_t *c, const unsigned char *header)
{
    unsigned min_length = header[0], line_range = header[3], opcode_base = header[4];
    int line_base = (int8_t)header[2];
    const unsigned char *lengths = header + 5; /* of the standard opcodes, from 1 */
    machine_t m = {.file = 1, .line = 1, .first = t->count};
    while (c->at < c->end && !c->bad) {
        unsigned op = *c->at++;
        if (op >= opcode_base) {
            unsigned adjusted = op - opcode_base;
            m.address += (uint64_t)(adjusted / line_range) * min_length;
            m.line += (uint64_t)(int64_t)(line_base + (int)(adjusted % line_range));
            if (!add_row(t, u, &m, false))
                return false;
            continue;
        }
        switch (op) {
        case 0: {
            uint64_t length = read_uleb(c);
            if (!length || length > (uint64_t)(c->end - c->at)) {
                c->bad = true;
                break;
            }
            cursor_t e = {c->at, c->at + length, false};
            c->at += length;
            unsigned sub = (unsigned)read_fixed(&e, 1);
            if (sub == LNE_END_SEQUENCE) {
                if (!add_row(t, u, &m, true))
                    return false;
                m = (machine_t){.file = 1, .line = 1, .first = t->count};
            } else if (sub == LNE_SET_ADDRESS && length - 1 <= 8) {
                m.address = read_fixed(&e, (unsigned)(length - 1));
            } else if (sub == LNE_DEFINE_FILE && u->version < 5) {
                const char *name = read_string(&e);
                if (name && !add_file(u, name, read_uleb(&e)))
                    return false;
            }
            break;
        }
        case LNS_COPY:
            if (!add_row(t, u, &m, false))
                return false;
            break;
        case LNS_ADVANCE_PC: m.address += read_uleb(c) * min_length; break;
        case LNS_ADVANCE_LINE: m.line += (uint64_t)read_sleb(c); break;
        case LNS_SET_FILE: m.file = read_uleb(c); break;
        case LNS_CONST_ADD_PC: m.address += (uint64_t)((255 - opcode_base) / line_range) * min_length; break;
        case LNS_FIXED_ADVANCE_PC: m.address += read_fixed(c, 2); break;
        default: /* column, flags, and opcodes of later versions: their operands */
            for (unsigned k = 0; k < lengths[op - 1]; k++)
                read_uleb(c);
        }
    }
    return true;
}

/* One unit at c: its header, then its program. False only when out of
 * memory; a unit that cannot be read is passed over. */
static bool read_unit(line_table_t *t, unit_t u, cursor_t *c)
{
    uint64_t length = read_fixed(c, 4);
    if (length == 0xffffffff) {
        length = read_fixed(c, 8);
        u.offset_size = 8;
    }
    if (c->bad || length > (uint64_t)(c->end - c->at)) {
        c->bad = true;
        return true;
    }
    cursor_t h = {c->at, c->at + length, false};
    c->at += length;
    u.version = (unsigned)read_fixed(&h, 2);
    if (u.version < 2 || u.version > 5)
        return true;
    if (u.version >= 5)
        skip(&h, 2); /* address and segment selector sizes */
    uint64_t header_length = read_fixed(&h, u.offset_size);
    if (h.bad || header_length > (uint64_t)(h.end - h.at))
        return true;
    cursor_t program = {h.at + header_length, h.end, false};
    /* minimum instruction length, [maximum operations,] default is_stmt,
     * line base, line range, opcode base, then the opcodes' lengths */
    unsigned char header[5 + 255];
    header[0] = (unsigned char)read_fixed(&h, 1);
    if (u.version >= 4)
        skip(&h, 1);
    for (unsigned k = 1; k < 5; k++)
        header[k] = (unsigned char)read_fixed(&h, 1);
    unsigned opcode_base = header[4];
    for (unsigned k = 1; k < opcode_base; k++)
        header[4 + k] = (unsigned char)read_fixed(&h, 1);
    bool ok = true;
    if (!h.bad && header[3] && opcode_base >= 10) {
        bool entries = u.version >= 5 ? read_entries(&u, &h, false) && read_entries(&u, &h, true)
                                      : read_legacy_entries(&u, &h);
        /* the entries read are kept even if the list ends badly */
        if (entries || u.file_count)
            ok = run_program(t, &u, &program, header);
    }
    if (u.dirs)
        hak_free_checked(u.dirs, "free");
    if (u.files)
        hak_free_checked(u.files, "free");
    return ok;
}

static int rows_by_address(const void *a, const void *b)
{
    const struct line_row *x = a, *y = b;
    if (x->address != y->address)
        return x->address < y->address ? -1 : 1;
    return (x->line != 0) - (y->line != 0); /* a sequence's end before the next one's start */
}

bool line_table_read(line_table_t *t, const dwarf_sections_t *d, const uintptr_t *wanted, size_t wanted_count,
                     uintptr_t bias)
{
    cursor_t c = {d->line.data, d->line.data + d->line.size, false};
    unit_t unit = {.d = d, .offset_size = 4, .wanted = wanted, .wanted_count = wanted_count, .bias = bias};
    while (c.at < c.end && !c.bad)
        if (!read_unit(t, unit, &c))
            break;
    if (t->rows)
        qsort(t->rows, t->count, sizeof *t->rows, rows_by_address);
    return t->count != 0;
}

const char *line_table_find(const line_table_t *t, uint64_t address, unsigned *line)
{
    size_t low = 0, high = t->count; /* the last row at or below address */
    while (low < high) {
        size_t mid = (low + high) / 2;
        if (t->rows[mid].address <= address)
            low = mid + 1;
        else
            high = mid;
    }
    if (!low)
        return NULL;
    const struct line_row *r = &t->rows[low - 1];
    if (!r->line || r->path >= t->paths_size)
        return NULL;
    *line = r->line;
    return t->paths + r->path;
}

void line_table_free(line_table_t *t)
{
    if (t->rows)
        hak_free_checked(t->rows, "free");
    if (t->paths)
        hak_free_checked(t->paths, "free");
    *t = (line_table_t){0};
}
