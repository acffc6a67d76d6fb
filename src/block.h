/* Layer 3, blocks: a free block's link to the next and its free mark,
 * encoded in the hardened build. Every list of free slab blocks uses
 * these. */
#ifndef HAKMEM_BLOCK_H
#define HAKMEM_BLOCK_H

#include "layout.h"
#include "error.h"

/* ---- Block links and the free mark ------------------------------------ */

/* A block not handed out holds the link to the next one in its first word
 * and a mark in its second (blocks are 16 B at least): its SuperSlab's
 * random mark secret xor its own address. Handing a block out clears the
 * mark, so that every free tells a free block from a live one: a double
 * free is caught however late it comes and from whichever thread (a live
 * block holds its mark by chance once in 2^64, and a copy of a freed
 * block's bytes elsewhere is not a mark there). The hardened build
 * (HAKMEM_SECURE) also stores the link xor a second secret and the
 * address, so that a write after free cannot plant a pointer the allocator
 * would follow (and reading a mark tells nothing of that key). */
/* The secrets of a SuperSlab, read once for a run of links into it. */
typedef struct block_keys {
    uintptr_t link, mark;
} block_keys_t;

static inline block_keys_t block_keys(const void *b)
{
    const superslab_t *ss = superslab_of(b);
    return (block_keys_t){HAK_SECURE ? ss->link_secret : 0, ss->mark_secret};
}

/* Hardened: the stored link of b xor its SuperSlab's secret, which is the
 * next block's address xor b's. Its bits above the SuperSlab's are zero
 * for every link: a list never leaves its slab, let alone its SuperSlab;
 * only the NULL that ends a list (giving b itself) and corruption are
 * above. Checked before b is mixed back in: two instructions fewer than
 * decoding first. */
static inline uintptr_t block_next_xor_b(const void *b) { return *(const uintptr_t *)b ^ block_keys(b).link; }

static inline void *block_next(const void *b)
{
    if (!HAK_SECURE)
        return *(void *const *)b;
    uintptr_t next_xor_b = block_next_xor_b(b);
    if (unlikely(next_xor_b >= SS_SIZE) && next_xor_b != (uintptr_t)b)
        hak_free_list_corrupt(b);
    return (void *)(next_xor_b ^ (uintptr_t)b);
}

/* b joins a list, in front of next. */
static inline void block_link_with(void *b, void *next, block_keys_t keys)
{
    ((uintptr_t *)b)[0] = (uintptr_t)next ^ (HAK_SECURE ? keys.link ^ (uintptr_t)b : 0);
    ((uintptr_t *)b)[1] = keys.mark ^ (uintptr_t)b;
}

static inline void block_link(void *b, void *next) { block_link_with(b, next, block_keys(b)); }

/* b is on a list or in a cache. */
static inline bool block_is_free(const void *b)
{
    return ((const uintptr_t *)b)[1] == (block_keys(b).mark ^ (uintptr_t)b);
}

static inline void block_handed_out(void *b) { ((uintptr_t *)b)[1] = 0; }

#endif
