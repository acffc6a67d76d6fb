/* Layer 3, blocks: a free block's link to the next and its free mark,
 * encoded in the hardened build. Every list of free slab blocks uses
 * these. */
#ifndef HAKMEM_BLOCK_H
#define HAKMEM_BLOCK_H

#include "layout.h"
#include "error.h"

#include <string.h>

/* ---- Block links and the free mark ------------------------------------ */

/* A block not handed out holds the link to the next one in its first word
 * and a mark in its second (blocks are 16 B at least): the random mark
 * secret (hak_mark_key) xor its own address. Handing a block out clears the
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
    return (block_keys_t){HAK_SECURE ? ss->link_secret : 0, hak_mark_key.secret};
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

/* b is on a list or in a cache; with the keys of b's SuperSlab. */
static inline bool block_is_free_with(const void *b, block_keys_t keys)
{
    return ((const uintptr_t *)b)[1] == (keys.mark ^ (uintptr_t)b);
}

static inline bool block_is_free(const void *b) { return block_is_free_with(b, block_keys(b)); }

static inline void block_handed_out(void *b) { ((uintptr_t *)b)[1] = 0; }

/* ---- Canaries (hardened build) ------------------------------------------- */

/* Every slab block of the hardened build ends with a canary of
 * BLOCK_CANARY bytes, never part of its usable size: its SuperSlab's
 * canary secret xor the canary's own address, written when the block is
 * carved and never touched by the allocator after (a free block's link
 * and mark are its first two words; the 16-byte class, whose canary
 * would be the mark, is not used). A free checks the block's own canary,
 * which a write past its end overwrites first, and the one before it,
 * the previous block's, which a write before its start does; the first
 * block of a slab has one of its own before it where the slab has room
 * (slab_lead).
 *
 * A mid block (above 1 KiB, classes 128 B apart and more) also checks
 * its slack: malloc stores the bytes between the request's end and the
 * canary in the canary's upper half and fills their first 8 with
 * CANARY_BYTE (block_slack_set), so that a write one byte past the
 * request, and every overflow that runs on from the request's end, is
 * caught as at a tiny block, whose request is never more than 15 bytes
 * from its canary; the usable size is the request. (All of a slack filled
 * and compared cost a page-arena block up to 4 KiB a pair, bench_threads
 * mid 36 times as long as with the default library; the first 64 bytes,
 * bench_tiny lifo 1100 B 1.6 times.) The page arenas end their
 * blocks with the same canary (arena.c), the large blocks have one before
 * them (large.c).
 *
 * A canary's first and last bytes, those next to the blocks either side,
 * are CANARY_BYTE in every canary, and so is every byte of slack: a stray
 * write of one byte is caught whatever it writes but that byte (a random
 * byte there let one such write in 256 through). The secret keys the six
 * bytes between; the address enters shifted past the first byte. */
#define CANARY_SLACK_SHIFT 32
#define CANARY_BYTE 0xa5
#define CANARY_ENDS_MASK ((uint64_t)0xff << 56 | 0xff)
#define CANARY_ENDS ((uint64_t)CANARY_BYTE << 56 | CANARY_BYTE)

#define SLACK_FILL (0x0101010101010101u * CANARY_BYTE)

/* Fill the first 8 bytes (SLACK_CHECKED) of the slack of `slack` bytes at
 * from, or all of a shorter one. */
static inline void slack_fill(char *from, size_t slack)
{
    const uint64_t fill = SLACK_FILL;
    if (likely(slack >= sizeof fill))
        memcpy(from, &fill, sizeof fill);
    else
        for (size_t i = 0; i < slack; i++)
            from[i] = (char)CANARY_BYTE;
}

/* Whether the slack of `slack` bytes at from holds its fill (slack_fill). */
static inline bool slack_intact(const char *from, size_t slack)
{
    uint64_t word;
    if (likely(slack >= sizeof word)) {
        memcpy(&word, from, sizeof word);
        return word == SLACK_FILL;
    }
    for (size_t i = 0; i < slack; i++)
        if ((uint8_t)from[i] != CANARY_BYTE)
            return false;
    return true;
}

/* A secret for canaries: random but for its first and last bytes. */
static inline uint64_t canary_secret_of(uint64_t random) { return (random & ~CANARY_ENDS_MASK) | CANARY_ENDS; }

/* The canary at `at`, with no slack, under secret. */
static inline uintptr_t canary_keyed(uint64_t secret, const void *at) { return secret ^ (uintptr_t)at << 8; }

static inline uintptr_t block_canary_at(const superslab_t *ss, const void *at)
{
    return canary_keyed(ss->canary_secret, at);
}

/* Canaries for n blocks of size bytes from first, with no slack. */
static inline void block_canaries_set(char *first, uint32_t n, uint32_t size)
{
    const superslab_t *ss = superslab_of(first);
    for (char *at = first + size - BLOCK_CANARY; n--; at += size)
        *(uintptr_t *)at = block_canary_at(ss, at);
}

/* The slack a canary that ends a block of size bytes records, or -1
 * where it was overwritten: its low bits must decode to zero and the
 * slack must fit the block. One read of the word: its owner may be
 * rewriting it (block_slack_set), and the old and new words both decode. */
static inline long canary_slack_decoded(uintptr_t decoded, size_t size)
{
    uintptr_t slack = decoded >> CANARY_SLACK_SHIFT;
    return decoded & (((uintptr_t)1 << CANARY_SLACK_SHIFT) - 1) || slack >= size ? -1 : (long)slack;
}

/* The slack recorded in b's canary (b of size bytes), or -1. */
static inline long block_slack(const void *b, uint32_t size)
{
    const char *at = (const char *)b + size - BLOCK_CANARY;
    return canary_slack_decoded(*(const uintptr_t *)at ^ block_canary_at(superslab_of(b), at), size);
}

/* b (of size bytes) handed out for a request of request bytes (0 counts
 * as 1: a usable size of 0 would read as a bad pointer's). */
static inline void block_slack_set(char *b, uint32_t size, size_t request)
{
    const superslab_t *ss = superslab_of(b);
    request += !request;
    char *at = b + size - BLOCK_CANARY;
    size_t slack = (size_t)(at - b) - request;
    slack_fill(b + request, slack);
    *(uintptr_t *)at = block_canary_at(ss, at) ^ ((uintptr_t)slack << CANARY_SLACK_SHIFT);
}

/* b, a block of s: both its canaries hold and record no slack (a tiny
 * block's, and one before it in a tiny slab). The free fast path's test;
 * anything else goes to the full check below. */
/* The first block of a slab with no room for a canary before it: the word
 * before it may lie in a guard page or a closed one (superslab.c). */
static inline bool block_first_unguarded(const slab_t *s, const void *b)
{
    return b == s->start && !((uintptr_t)b & SLAB_LEAD_MASK);
}

static inline bool block_canaries_plain(const slab_t *s, const void *b)
{
    uintptr_t secret = superslab_of(b)->canary_secret;
    const char *after = (const char *)b + s->block_size - BLOCK_CANARY;
    const char *before = block_first_unguarded(s, b) ? after : (const char *)b - BLOCK_CANARY;
    return ((*(const uintptr_t *)after ^ canary_keyed(secret, after)) |
            (*(const uintptr_t *)before ^ canary_keyed(secret, before))) == 0;
}

/* b, a block of s: 0 when its canaries and slack hold, else 1 for a
 * write past its end and -1 for one before its start. */
static inline int block_canary_broken(const slab_t *s, const void *b)
{
    long slack = block_slack(b, s->block_size);
    if (unlikely(slack != 0)) {
        if (slack < 0)
            return 1;
        const char *end = (const char *)b + s->block_size - BLOCK_CANARY;
        if (!slack_intact(end - slack, (size_t)slack))
            return 1;
    }
    if (unlikely(!block_first_unguarded(s, b) && block_slack((const char *)b - s->block_size, s->block_size) < 0))
        return -1;
    return 0;
}

/* Both canaries of b written again (after a report in HAKMEM_ON_ERROR=warn
 * mode, so that its neighbours' frees do not report it again). */
static inline void block_canaries_repair(const slab_t *s, char *b)
{
    if (block_first_unguarded(s, b))
        block_canaries_set(b, 1, s->block_size);
    else
        block_canaries_set(b - s->block_size, 2, s->block_size);
}

#endif
