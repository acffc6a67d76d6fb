/* Size classes: which block size serves a request, and how many 64 KiB
 * pages a slab of each class spans. */
#include "internal.h"

/* hak_tiny_class_of[(size + 7) / 8]: class 0 is 8 B, class k (k >= 1) is
 * 16 * k bytes. Constant so that the fast path can use it before init. */
const uint8_t hak_tiny_class_of[TINY_MAX / 8 + 1] = {
    0, 0, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7, 8, 8, 9, 9, 10, 10, 11, 11, 12,
    12, 13, 13, 14, 14, 15, 15, 16, 16, 17, 17, 18, 18, 19, 19, 20, 20, 21, 21,
    22, 22, 23, 23, 24, 24, 25, 25, 26, 26, 27, 27, 28, 28, 29, 29, 30, 30, 31,
    31, 32, 32, 33, 33, 34, 34, 35, 35, 36, 36, 37, 37, 38, 38, 39, 39, 40, 40,
    41, 41, 42, 42, 43, 43, 44, 44, 45, 45, 46, 46, 47, 47, 48, 48, 49, 49, 50,
    50, 51, 51, 52, 52, 53, 53, 54, 54, 55, 55, 56, 56, 57, 57, 58, 58, 59, 59,
    60, 60, 61, 61, 62, 62, 63, 63, 64, 64};

uint32_t hak_class_size[CLASS_COUNT];
uint8_t hak_class_span[CLASS_COUNT];

/* L2 slabs (blocks up to 256 KiB) aim at 8 or more blocks (so a slab is
 * not refilled for every allocation) with at most 1/8 of the slab left
 * over; classes too large for 8 blocks take a slab of at least 1 MiB.
 * L2.5 blocks (above 256 KiB) are page bundles: one block per slab, the
 * fewest pages that hold it with at most 1/8 left over, so that a freed
 * block gives its pages back to the SuperSlab at once instead of pinning a
 * slab that a few other blocks keep alive. */
#define SLAB_MIN_BLOCKS 8
#define SLAB_BIG_BYTES ((size_t)1 << 20)
#define L25_MIN_BLOCK ((size_t)256 << 10)

static uint8_t span_for(size_t block_size)
{
    size_t first = (block_size + SLAB_PAGE_SIZE - 1) / SLAB_PAGE_SIZE;
    for (size_t span = first; span <= SS_MAX_SPAN; span++) {
        size_t bytes = span * SLAB_PAGE_SIZE;
        size_t blocks = bytes / block_size;
        size_t waste = bytes - blocks * block_size;
        if (waste * 8 <= bytes &&
            (blocks >= SLAB_MIN_BLOCKS || bytes >= SLAB_BIG_BYTES || block_size > L25_MIN_BLOCK))
            return (uint8_t)span;
    }
    return (uint8_t)first;
}

void sizeclass_init(void)
{
    hak_class_size[0] = HAK_SECURE ? 16 : 8; /* the hardened build marks a free block's second word */
    for (unsigned c = 1; c < TINY_CLASSES; c++)
        hak_class_size[c] = 16 * c;
    for (unsigned c = TINY_CLASSES; c < CLASS_COUNT; c++) {
        unsigned b = MID_MIN_SHIFT + (c - TINY_CLASSES) / MID_CLASSES_PER_DOUBLING;
        unsigned step = (c - TINY_CLASSES) % MID_CLASSES_PER_DOUBLING + 1;
        hak_class_size[c] = (1u << b) + step * (1u << (b - 3));
    }
    for (unsigned c = 0; c < CLASS_COUNT; c++)
        hak_class_span[c] = class_is_tiny(c) ? 1 : span_for(hak_class_size[c]);
}
