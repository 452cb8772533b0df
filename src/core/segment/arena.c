/*
 * arena.c - the info arena: one region of KVC_BLOCK-byte blocks shared by
 * every rank, with a bitmap of blocks in use.  All calls hold the rank lock.
 *
 * The bitmap is derived state: the published slots of the rank table are
 * the truth, and recovery rebuilds the bitmap from them, so a writer killed
 * between allocating and publishing (or between publishing and freeing the
 * old half) leaks nothing and never causes two ranks to share blocks.
 */
#include "internal.h"

static inline bool bit_get(const kvc_segment *seg, uint64_t i)
{
    return (atomic_load_explicit(&seg->bitmap[i / 64], memory_order_relaxed) >> (i % 64)) & 1u;
}

static void set_range(kvc_segment *seg, uint64_t first, uint64_t n, bool on)
{
    for (uint64_t i = first; i < first + n; i++) {
        uint64_t mask = 1ull << (i % 64);
        if (on)
            atomic_fetch_or_explicit(&seg->bitmap[i / 64], mask, memory_order_relaxed);
        else
            atomic_fetch_and_explicit(&seg->bitmap[i / 64], ~mask, memory_order_relaxed);
    }
}

kvc_err kvc__arena_alloc(kvc_segment *seg, uint64_t bytes, uint64_t *off, uint64_t *blocks)
{
    uint64_t need = (bytes + KVC_BLOCK - 1) / KVC_BLOCK;
    uint64_t total = seg->hdr->arena_blocks;
    if (need == 0)
        need = 1;
    uint64_t run = 0;
    for (uint64_t i = 0; i < total; i++) {
        /* Skip whole used words quickly. */
        if (run == 0 && i % 64 == 0 && i + 64 <= total &&
            atomic_load_explicit(&seg->bitmap[i / 64], memory_order_relaxed) == ~0ull) {
            i += 63;
            continue;
        }
        if (bit_get(seg, i)) {
            run = 0;
            continue;
        }
        if (++run == need) {
            uint64_t first = i + 1 - need;
            set_range(seg, first, need, true);
            atomic_fetch_add(&seg->hdr->arena_used_blocks, need);
            *off = first * KVC_BLOCK;
            *blocks = need;
            return KVC_OK;
        }
    }
    return kvc__fail(KVC_E_FULL,
                     "info arena of segment %s full: no %llu contiguous free bytes "
                     "(arena %llu bytes, %llu in use)",
                     seg->name, (unsigned long long)(need * KVC_BLOCK),
                     (unsigned long long)seg->hdr->arena_bytes,
                     (unsigned long long)(atomic_load(&seg->hdr->arena_used_blocks) * KVC_BLOCK));
}

void kvc__arena_free(kvc_segment *seg, uint64_t off, uint64_t blocks)
{
    if (blocks == 0 || !kvc__arena_range_ok(seg, off, blocks))
        return;
    set_range(seg, off / KVC_BLOCK, blocks, false);
    atomic_fetch_sub(&seg->hdr->arena_used_blocks, blocks);
}

void kvc__arena_mark(kvc_segment *seg, uint64_t off, uint64_t blocks)
{
    set_range(seg, off / KVC_BLOCK, blocks, true);
    atomic_fetch_add(&seg->hdr->arena_used_blocks, blocks);
}

void kvc__arena_clear_all(kvc_segment *seg)
{
    uint64_t words = (seg->hdr->arena_blocks + 63) / 64;
    for (uint64_t w = 0; w < words; w++)
        atomic_store_explicit(&seg->bitmap[w], 0, memory_order_relaxed);
    atomic_store(&seg->hdr->arena_used_blocks, 0);
}

bool kvc__arena_range_ok(const kvc_segment *seg, uint64_t off, uint64_t blocks)
{
    uint64_t total = seg->hdr->arena_blocks;
    return off % KVC_BLOCK == 0 && blocks <= total && off / KVC_BLOCK <= total - blocks;
}
