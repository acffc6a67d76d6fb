/* Size classes: which block size serves a request, and how many 64 KiB
 * pages a slab of each class spans. */
#include "layout.h"

/* hak_tiny_class_of[(size + 15) / 16]: class k is 16 * (k + 1) bytes, and
 * size 0 takes the smallest. Constant so that the fast path can use it
 * before init. The hardened build never uses the 16-byte class, whose
 * canary would be the free mark's word (block.h): its entry 1, requests
 * of up to 8 bytes with their canary, names the 32-byte class. */
const uint8_t hak_tiny_class_of[TINY_MAX / 16 + 1] = {
    0, HAK_SECURE, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20,
    21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39,
    40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58,
    59, 60, 61, 62, 63};

/* hak_front_of[(size - 1) / 128] for TINY_MAX < size <= LARGE_THRESHOLD_MIN:
 * every mid class ends on a multiple of 128 B (8 steps per doubling from
 * 1 KiB), and so does every page count, so each 128 B of sizes has one
 * list. A table, as the tiny one, usable before init: the logarithm it
 * replaces took a mid malloc 9 instructions more. Checked against
 * hak_class_size at init in debug builds. The first 8 entries (1 KiB and
 * less) are never read. */
#define R8(x) x, x, x, x, x, x, x, x
#define FRONT_PAGE(list) R8(list), R8(list), R8(list), R8(list) /* 4 KiB: 32 granules */
const uint8_t hak_front_of[LARGE_THRESHOLD_MIN / FRONT_GRANULE] = {
    0, 0, 0, 0, 0, 0, 0, 0,                                         /* up to 1 KiB: unused */
    0, 1, 2, 3, 4, 5, 6, 7,                                         /* mid classes to 2 KiB, 128 B apart */
    8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13, 14, 14, 15, 15,     /* to 4 KiB, 256 B apart */
    16, 16, 16, 16, 17, 17, 17, 17, 18, 18, 18, 18, 19, 19, 19, 19, /* to 8 KiB, 512 B apart */
    20, 20, 20, 20, 21, 21, 21, 21, 22, 22, 22, 22, 23, 23, 23, 23,
    R8(24), R8(25), R8(26), R8(27), R8(28), R8(29), R8(30), R8(31), /* to 16 KiB, 1 KiB apart */
    FRONT_PAGE(32), FRONT_PAGE(33), FRONT_PAGE(34), FRONT_PAGE(35), /* the arenas' blocks of 5 to 16 pages */
    FRONT_PAGE(36), FRONT_PAGE(37), FRONT_PAGE(38), FRONT_PAGE(39),
    FRONT_PAGE(40), FRONT_PAGE(41), FRONT_PAGE(42), FRONT_PAGE(43)};
#undef FRONT_PAGE
#undef R8

_Static_assert(TINY_CLASSES == 64 && MID_CLASSES == 32 && ARENA_FRONT_MIN_PAGES == 5 && ARENA_EXACT_MAX_PAGES == 16,
               "hak_front_of's values");

/* The front to the arenas' bins (layout.h): a page count each up to 64
 * KiB, then classes of 2 pages to 128 KiB and of 4 to 256 KiB. */
#define R2(x) x, x
#define R4(x) x, x, x, x
const uint8_t hak_arena_bin_of[ARENA_FRONT_MAX_PAGES + 1] = {
    0,      0,      0,      0,      0,      0,      1,      2,      3,      4,      5,      6,     7,
    8,      9,      10,     11,     R2(12), R2(13), R2(14), R2(15), R2(16), R2(17), R2(18), R2(19),
    R4(20), R4(21), R4(22), R4(23), R4(24), R4(25), R4(26), R4(27)};
const uint8_t hak_arena_bin_pages[ARENA_FRONT_BINS] = {5,  6,  7,  8,  9,  10, 11, 12, 13, 14, 15, 16, 18, 20,
                                                       22, 24, 26, 28, 30, 32, 36, 40, 44, 48, 52, 56, 60, 64};
#undef R2
#undef R4
_Static_assert(ARENA_FRONT_MAX_PAGES == 64 && ARENA_FRONT_BINS == 28, "hak_arena_bin_of's values");

uint32_t hak_class_size[CLASS_COUNT];
uint8_t hak_class_span[CLASS_COUNT];

/* Slabs aim at 8 or more blocks (so a slab is not refilled for every
 * allocation) with at most 1/8 of the slab left over; classes too large
 * for 8 blocks take a slab of at least 1 MiB. */
#define SLAB_MIN_BLOCKS 8
#define SLAB_BIG_BYTES ((size_t)1 << 20)

static uint8_t span_for(size_t block_size)
{
    size_t first = (block_size + SLAB_PAGE_SIZE - 1) / SLAB_PAGE_SIZE;
    for (size_t span = first; span <= SS_MAX_SPAN; span++) {
        size_t bytes = span * SLAB_PAGE_SIZE;
        size_t blocks = bytes / block_size;
        size_t waste = bytes - blocks * block_size;
        if (waste * 8 <= bytes && (blocks >= SLAB_MIN_BLOCKS || bytes >= SLAB_BIG_BYTES))
            return (uint8_t)span;
    }
    return (uint8_t)first;
}

void sizeclass_init(void)
{
    for (unsigned c = 0; c < TINY_CLASSES; c++)
        hak_class_size[c] = 16 * (c + 1);
    for (unsigned c = TINY_CLASSES; c < CLASS_COUNT; c++) {
        unsigned b = MID_MIN_SHIFT + (c - TINY_CLASSES) / MID_CLASSES_PER_DOUBLING;
        unsigned step = (c - TINY_CLASSES) % MID_CLASSES_PER_DOUBLING + 1;
        hak_class_size[c] = (1u << b) + step * (1u << (b - 3));
    }
    for (unsigned c = 0; c < CLASS_COUNT; c++)
        hak_class_span[c] = class_is_tiny(c) ? 1 : span_for(hak_class_size[c]);
#ifdef HAKMEM_DEBUG
    for (size_t size = TINY_MAX + 1; size <= SLAB_CLASS_MAX; size++) /* the smallest class that holds it */
        hak_assert(hak_class_size[mid_class_of(size)] >= size && hak_class_size[mid_class_of(size) - 1] < size);
    for (size_t size = SLAB_CLASS_MAX + 1; size <= LARGE_THRESHOLD_MIN; size++) /* as many pages */
        hak_assert(front_of(size) == MID_CLASSES + (size + ARENA_PAGE - 1) / ARENA_PAGE - ARENA_FRONT_MIN_PAGES);
    for (uint32_t pages = ARENA_FRONT_MIN_PAGES; pages <= ARENA_FRONT_MAX_PAGES; pages++) { /* the smallest class */
        unsigned bin = hak_arena_bin_of[pages];
        hak_assert(bin < ARENA_FRONT_BINS && hak_arena_bin_pages[bin] >= pages &&
                   (hak_arena_bin_pages[bin] - pages) * 8 <= pages && (!bin || hak_arena_bin_pages[bin - 1] < pages));
    }
#endif
}
