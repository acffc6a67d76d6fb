/* Layer 5, meshing (mesh.c): two slabs of one class of one slab page
 * (tiny, or mid up to 8 KiB) whose live blocks on a 4 KiB page at the
 * same offset do not overlap share one physical page, so that memory
 * follows live data without moving a pointer (after Mesh, PLDI 2019),
 * and pages with no live block go back alone. The owner meshes its own
 * slabs (hak_collect, malloc_trim, a refill that would grow the heap),
 * the purger those a thread loosened (heap.c); docs/architecture.md,
 * "Meshing". */
#ifndef HAKMEM_MESH_H
#define HAKMEM_MESH_H

#include "block.h"

/* Meshing works on 4 KiB pages, 16 to a slab page. */
#define MESH_PAGE_SHIFT 12
#define MESH_PAGE ((size_t)1 << MESH_PAGE_SHIFT)
#define MESH_PAGES (SLAB_PAGE_SIZE / MESH_PAGE)
#define MESH_MAX_SLOTS (SLAB_PAGE_SIZE / 16)

/* At most this many slabs of a class are meshed together in one pass. */
#define MESH_PASS_SLABS 512

void mesh_init(void);
/* Whether meshing is on, or may turn on at its first need (its memfd and
 * userfaultfd are opened then). */
bool mesh_enabled(void);
/* The files opened if they are not (a caller about to hand slabs over for
 * meshing): false if meshing is off, or turned off now for what the
 * system refused. */
bool mesh_ready(void);
/* Whether the files are open (meshing has met a need). */
bool mesh_started(void);
/* Why meshing is off though HAKMEM_MESH asks for it; NULL otherwise. */
const char *mesh_off_reason(void);
/* Whether writes into a block being meshed by a system call wait (a full
 * userfaultfd) or fail with EFAULT (user-mode faults only). */
bool mesh_kernel_writes_wait(void);

/* s carries SLAB_MESHED: b, a block of s, lies on a meshed page where
 * its slot is the partner's (freeing it through s is a double free). */
bool mesh_slot_reserved(const slab_t *s, const void *b);
/* The blocks of s that are its partners' (counted in s->used). */
uint32_t mesh_reserved(const slab_t *s);

/* Whether meshing may take s: a slab of one slab page in use with 1 /
 * free_share of its carved blocks free at least (but with
 * HAKMEM_MESH=stress). A pass looks at the slabs a quarter free. */
#define MESH_SCAN_SHARE 4
bool mesh_candidate(const slab_t *s, uint32_t free_share);

/* Whether meshing takes class c's slabs: those of one slab page (the
 * tiny classes, and the mid ones up to 8 KiB). */
static inline bool class_meshes(unsigned c) { return hak_class_span[c] == 1; }

/* Mesh what it can among n slabs of one class that the caller owns,
 * each with its exact lists (none of its blocks in a cache), until
 * os_now_ns() passes deadline_ns (0: no deadline). A pass with a deadline
 * is paced: it meshes nothing unless that gives back enough of the pages
 * it looks at (mesh.c). The pages given back are counted in mesh_stats. */
void mesh_slabs(slab_t *const *slabs, size_t n, uint64_t deadline_ns);

/* s, meshed, holds no live block of its own: its meshed pages go back to
 * being its own (and its partners' slots there to them), and it is left
 * empty with nothing carved, its pages purged. */
void mesh_dissolve(slab_t *s);

/* Whether some slab has pages meshing found with no live block and gave
 * back (their slots reserved); and s's such pages made its own again,
 * their slots on its list: how many. For a refill that would otherwise
 * take a new slab. */
bool mesh_has_vacant(void);
uint32_t mesh_unvacate(slab_t *s);

void mesh_fork_prepare(void);
void mesh_fork_parent(void);
void mesh_fork_child(void);

/* Physical pages given back now (two slabs' pages sharing one count one),
 * and pages meshed since the start. */
void mesh_stats(size_t *pages_now, uint64_t *pages_ever);

#endif
