/* Size classes: which block size serves a request, and how many 64 KiB
 * pages a slab of each class spans. */
#include "internal.h"

/* hak_tiny_class_of[(size + 15) / 16]: class k is 16 * (k + 1) bytes, and
 * size 0 takes the smallest. Constant so that the fast path can use it
 * before init. */
const uint8_t hak_tiny_class_of[TINY_MAX / 16 + 1] = {
    0, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20,
    21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39,
    40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58,
    59, 60, 61, 62, 63};

/* hak_mid_class_of[(size - 1) / 128] for TINY_MAX < size <= SLAB_CLASS_MAX:
 * every mid class ends on a multiple of 128 B (8 steps per doubling from
 * 1 KiB), so each 128 B of sizes has one class. A table, as the tiny one,
 * usable before init: the logarithm it replaces took a mid malloc 9
 * instructions more. Checked against hak_class_size at init in debug
 * builds. The first 8 entries (1 KiB and less) are never read. */
const uint8_t hak_mid_class_of[SLAB_CLASS_MAX / 128] = {
    64, 64, 64, 64, 64, 64, 64, 64,                                 /* up to 1 KiB: unused */
    64, 65, 66, 67, 68, 69, 70, 71,                                 /* to 2 KiB, classes 128 B apart */
    72, 72, 73, 73, 74, 74, 75, 75, 76, 76, 77, 77, 78, 78, 79, 79, /* to 4 KiB, 256 B apart */
    80, 80, 80, 80, 81, 81, 81, 81, 82, 82, 82, 82, 83, 83, 83, 83, /* to 8 KiB, 512 B apart */
    84, 84, 84, 84, 85, 85, 85, 85, 86, 86, 86, 86, 87, 87, 87, 87,
    88, 88, 88, 88, 88, 88, 88, 88, 89, 89, 89, 89, 89, 89, 89, 89, /* to 16 KiB, 1 KiB apart */
    90, 90, 90, 90, 90, 90, 90, 90, 91, 91, 91, 91, 91, 91, 91, 91,
    92, 92, 92, 92, 92, 92, 92, 92, 93, 93, 93, 93, 93, 93, 93, 93,
    94, 94, 94, 94, 94, 94, 94, 94, 95, 95, 95, 95, 95, 95, 95, 95};

_Static_assert(TINY_CLASSES == 64 && CLASS_COUNT == 96, "hak_mid_class_of's values");

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
#endif
}
