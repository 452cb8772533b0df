/*
 * ranks_internal.h - what the rank table's two files share, and nothing
 * else uses: ranks.c (recovery and the writers, under the rank lock) and
 * ranks_read.c (the lock-free readers).  The helpers are static inline, as
 * they were static when the table was one file: a lookup calls them on its
 * fast path.  roles.c (role names and parallelism configs) writes the same
 * tables through ranks.c's entry-level calls.
 *
 * Lock rule: writers hold the rank lock (KVC_LOCK_RANKS) and take no other
 * inside it; readers take no lock (seqlock.h), except a reader that keeps
 * seeing an odd sequence, which takes the rank lock once to recover a dead
 * writer.
 */
#ifndef KVC_RANKS_INTERNAL_H
#define KVC_RANKS_INTERNAL_H

#include "internal.h"
#include "seqlock.h"

/* Entry rank of table (0: the rank table; the role and parallelism tables
 * follow it, layout.h). */
static inline kvc_rank_entry *kvc__rank_entry(kvc_segment *seg, unsigned table, uint32_t rank)
{
    return &seg->ranks[(uint64_t)table * seg->hdr->max_ranks + rank];
}

/* rank is within the segment's rank tables, and the segment is the one its
 * name holds now (kvc__seg_current). */
static inline kvc_err kvc__rank_check(kvc_segment *seg, uint32_t rank)
{
    kvc_err e =
        kvc__seg_current(seg, KVC__FILE_CHECK_READ_MS); /* a discarded segment answers nothing */
    if (e)
        return e;
    if (rank >= seg->hdr->max_ranks)
        return kvc__fail(KVC_E_CAPACITY,
                         "rank %u exceeds the segment's max ranks (%u; ranks are "
                         "0..%u)",
                         rank, seg->hdr->max_ranks, seg->hdr->max_ranks - 1);
    return KVC_OK;
}

/* A descriptor a reader may use: a known state, and a registered one's
 * blob inside the arena and long enough for what it says it holds. */
static inline bool kvc__rank_slot_sane(const kvc_segment *seg, const kvc_rank_slot *sl)
{
    if (sl->state != KVC_RANK_REGISTERED)
        return sl->state == KVC_RANK_EMPTY || sl->state == KVC_RANK_WITHDRAWN;
    /* session_len 0: a parallelism config (the rank table's entries are
     * refused an empty session_id before they are ever written) */
    return sl->session_len <= KVC_SESSION_ID_MAX &&
           kvc__arena_range_ok(seg, sl->blob_off, sl->blob_blocks) &&
           sl->info_len <= seg->hdr->max_info_bytes &&
           sl->session_len + sl->info_len <= sl->blob_blocks * KVC_BLOCK;
}

/* The seqlock's check: nothing was republished since the sequence read
 * as seq (so what was copied in between is one whole value). */
static inline bool kvc__rank_unchanged(kvc_rank_entry *e, uint64_t seq)
{
    return !kvc_seq_read_retry(&e->seq, seq);
}

/* ranks.c: what an entry is, for messages ("rank 3", "rank 3 (role
 * draft)", "the parallelism config of rank 3 (role target)"), in buf. */
const char *kvc__rank_label(kvc_segment *seg, unsigned table, uint32_t rank, char *buf, size_t cap);

#endif
