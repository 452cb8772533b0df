/*
 * inspect_ranks.c - the rank tables for people: seqlock peeks of a rank
 * descriptor (kvc__rank_peek, with the core's own snapshot read), and the
 * check of the rank tables and the arena (kvc__check_ranks): every entry's
 * counter even, every published descriptor valid, no registered rank of a
 * dead worker, the blobs disjoint, the bitmap and the derived counts
 * matching the published blobs.
 *
 * Lock rule: kvc__rank_peek takes no lock (a seqlock read, at most
 * PEEK_SPINS retries; kvcoord-diag ranks); kvc__check_ranks holds the
 * ranks lock through kvc__ck_take (inspect_check.c, its only caller) unless
 * its owner is dead or keeps it, and then checks only what a read without
 * the lock can tell.
 */
#include <sched.h>
#include <stdlib.h>
#include <string.h>

#include "inspect_internal.h"

/* Seqlock retries of a peek before an odd counter is called stuck. */
#define PEEK_SPINS 200

/* ---- rank descriptors --------------------------------------------------- */

static void peek_fill(kvc_rank_peek *o, uint64_t seq, uint32_t active, const kvc_rank_slot *sl)
{
    memset(o, 0, sizeof *o);
    o->seq = seq;
    o->active = active;
    o->state = sl->state;
    o->entries = sl->entries;
    o->generation = sl->generation;
    o->changed_ns = sl->changed_ns;
    o->pid = sl->pid;
    o->pid_start = sl->pid_start;
    o->session_len = sl->session_len;
    o->info_len = sl->info_len;
    o->blob_off = sl->blob_off;
    o->blob_blocks = sl->blob_blocks;
    o->owned = sl->owned;
}

/* The core's seqlock read, with at most spins retries of an odd counter. */
static kvc_err peek_entry(kvc_rank_entry *e, uint32_t rank, kvc_rank_peek *out, int spins)
{
    for (int tries = 0;; tries++) {
        kvc_rank_slot sl;
        uint64_t seq;
        uint32_t a;
        int r = kvc__rank_snapshot(e, &sl, &seq, &a);
        if (r == 0) {
            peek_fill(out, seq, a, &sl);
            return KVC_OK;
        }
        if (tries >= spins) {
            peek_fill(out, seq, a, &sl);
            return kvc__fail(KVC_E_BUSY, "rank %u: sequence counter stays odd (%llu)", rank,
                             (unsigned long long)seq);
        }
        sched_yield();
    }
}

static kvc_err peek(kvc_segment *seg, uint32_t rank, kvc_rank_peek *out, int spins)
{
    return peek_entry(&seg->ranks[rank], rank, out, spins);
}

kvc_err kvc__rank_peek(kvc_segment *seg, uint32_t rank, kvc_rank_peek *out)
{
    if (!seg || !out)
        return kvc__fail(KVC_E_INVAL, "kvc__rank_peek: NULL argument");
    if (rank >= seg->hdr->max_ranks)
        return kvc__fail(KVC_E_CAPACITY, "rank %u exceeds the segment's max ranks (%u)", rank,
                         seg->hdr->max_ranks);
    return peek(seg, rank, out, PEEK_SPINS);
}

/* ---- the check: ranks and the arena -------------------------------------- */

typedef struct blob {
    uint64_t first, blocks; /* in blocks */
    uint32_t rank;
} blob;

static int blob_cmp(const void *a, const void *b)
{
    const blob *x = a, *y = b;
    return x->first < y->first ? -1 : x->first > y->first;
}

/* Why a published registered descriptor is unusable, or NULL. */
static const char *slot_problem(const kvc_segment *seg, const kvc_rank_peek *p)
{
    if (p->active > 1)
        return "active index is neither 0 nor 1";
    if (p->state > KVC_RANK_WITHDRAWN)
        return "state is not empty, registered or withdrawn";
    if (p->state != KVC_RANK_REGISTERED)
        return NULL;
    /* 0: a parallelism config (kept in the other rank tables) */
    if (p->session_len > KVC_SESSION_ID_MAX)
        return "session_id length out of range";
    if (p->blob_blocks == 0 || !kvc__arena_range_ok(seg, p->blob_off, p->blob_blocks))
        return "info blob outside the arena";
    if (p->info_len > seg->hdr->max_info_bytes)
        return "info longer than max info bytes";
    if (p->session_len + p->info_len > p->blob_blocks * KVC_BLOCK)
        return "info longer than its blob";
    return NULL;
}

typedef struct rank_scan {
    kvc__tally seq, slot, owner;
    blob *blobs;
    uint32_t nblobs;
    uint32_t nconfigs; /* of nblobs, parallelism configs (the rest: ranks' info) */
} rank_scan;

static void scan_rank(kvc__ck *ck, rank_scan *rs, uint32_t r, enum kvc__access a)
{
    kvc_rank_peek p;
    /* Under the lock (or a dead owner's) nothing moves: one read is exact. */
    peek(ck->seg, r, &p, a == KVC__UNLOCKED_BUSY ? PEEK_SPINS : 0);
    if (p.seq & 1) {
        ck->st->ranks_odd++;
        kvc__ck_problem(
            ck, &rs->seq, KVC_SEV_BROKEN,
            "rank %u: sequence counter is odd (%llu): a writer "
            "died inside the publish window; readers wait, then recover it by taking the lock",
            r, (unsigned long long)p.seq);
    }
    const char *why = slot_problem(ck->seg, &p);
    if (why) {
        kvc__ck_problem(ck, &rs->slot, KVC_SEV_BROKEN, "rank %u: published descriptor invalid: %s",
                        r, why);
        return;
    }
    if (p.state == KVC_RANK_WITHDRAWN)
        ck->st->ranks_withdrawn++;
    if (p.state != KVC_RANK_REGISTERED)
        return;
    ck->st->ranks_registered++;
    rs->blobs[rs->nblobs++] = (blob){p.blob_off / KVC_BLOCK, p.blob_blocks, r};
    if (p.owned && !kvc__pid_alive_in(ck->seg, p.pid, p.pid_start))
        kvc__ck_problem(
            ck, &rs->owner, KVC_SEV_DEGRADED,
            "rank %u is registered by worker pid %d, which "
            "is not running: lookups hand out a dead session until it is reaped (by kvcoordd "
            "or `repair`)",
            r, (int)p.pid);
}

/* The role and parallelism tables (layout.h): their blobs share the arena,
 * so they count as published info; their descriptors must be valid too. */
static void scan_other_tables(kvc__ck *ck, rank_scan *rs, enum kvc__access a)
{
    uint32_t max = ck->seg->hdr->max_ranks;
    for (unsigned t = 1; t < KVC_RANK_TABLES; t++) {
        for (uint32_t r = 0; r < max; r++) {
            kvc_rank_peek p;
            peek_entry(&ck->seg->ranks[(uint64_t)t * max + r], r, &p,
                       a == KVC__UNLOCKED_BUSY ? PEEK_SPINS : 0);
            const char *why = slot_problem(ck->seg, &p);
            if (why)
                kvc__ck_problem(ck, &rs->slot, KVC_SEV_BROKEN,
                                "rank %u of rank table %u: published descriptor invalid: %s", r, t,
                                why);
            else if (p.state == KVC_RANK_REGISTERED) {
                rs->blobs[rs->nblobs++] = (blob){p.blob_off / KVC_BLOCK, p.blob_blocks, r};
                rs->nconfigs += t >= KVC_TABLE_PARALLELISM;
            }
        }
    }
}

static void check_overlap(kvc__ck *ck, rank_scan *rs)
{
    kvc__tally t = {"ranks.overlap", 0, KVC_SEV_OK};
    qsort(rs->blobs, rs->nblobs, sizeof *rs->blobs, blob_cmp);
    for (uint32_t i = 1; i < rs->nblobs; i++) {
        const blob *x = &rs->blobs[i - 1], *y = &rs->blobs[i];
        if (x->first + x->blocks > y->first)
            kvc__ck_problem(ck, &t, KVC_SEV_BROKEN, "ranks %u and %u share arena blocks from %llu",
                            x->rank, y->rank, (unsigned long long)y->first);
    }
    /* Count what is counted: ranks' info (every role) and parallelism
     * configs, which share the arena. */
    uint32_t ranks = rs->nblobs - rs->nconfigs;
    if (rs->nconfigs)
        kvc__ck_settle(ck, &t,
                       "the info of the %u registered ranks and %u parallelism "
                       "config%s occupies disjoint arena blocks",
                       ranks, rs->nconfigs, rs->nconfigs == 1 ? "" : "s");
    else
        kvc__ck_settle(ck, &t, "the info of the %u registered ranks occupies disjoint arena blocks",
                       ranks);
}

/* Bits of word w that the published blobs cover (blobs sorted; *k advances). */
static uint64_t expected_word(const rank_scan *rs, uint32_t *k, uint64_t w)
{
    uint64_t lo = w * 64, hi = lo + 64, mask = 0;
    while (*k < rs->nblobs && rs->blobs[*k].first + rs->blobs[*k].blocks <= lo)
        (*k)++;
    for (uint32_t j = *k; j < rs->nblobs && rs->blobs[j].first < hi; j++) {
        uint64_t a = rs->blobs[j].first > lo ? rs->blobs[j].first : lo;
        uint64_t b = rs->blobs[j].first + rs->blobs[j].blocks;
        if (b > hi)
            b = hi;
        for (uint64_t i = a; i < b; i++)
            mask |= 1ull << (i - lo);
    }
    return mask;
}

static void check_arena(kvc__ck *ck, rank_scan *rs)
{
    const kvc_header *h = ck->seg->hdr;
    uint64_t words = (h->arena_blocks + 63) / 64, leaked = 0, unmarked = 0, marked = 0, pub = 0;
    uint32_t k = 0;
    for (uint64_t w = 0; w < words; w++) {
        uint64_t want = expected_word(rs, &k, w), got = atomic_load(&ck->seg->bitmap[w]);
        marked += (uint64_t)__builtin_popcountll(got);
        pub += (uint64_t)__builtin_popcountll(want);
        leaked += (uint64_t)__builtin_popcountll(got & ~want);
        unmarked += (uint64_t)__builtin_popcountll(want & ~got);
    }
    ck->st->arena_marked_blocks = marked;
    ck->st->arena_published_blocks = pub;
    if (unmarked)
        kvc__ck_say(ck, KVC_SEV_BROKEN, "arena.bitmap",
                    "%llu blocks of published rank info are free in "
                    "the bitmap: the next registration may overwrite them",
                    (unsigned long long)unmarked);
    if (leaked)
        kvc__ck_say(
            ck, KVC_SEV_DEGRADED, "arena.bitmap",
            "%llu blocks are marked in use but hold no "
            "published info (leaked by a writer that died before publishing; recovery rebuilds "
            "the bitmap)",
            (unsigned long long)leaked);
    if (!unmarked && !leaked)
        kvc__ck_say(ck, KVC_SEV_OK, "arena.bitmap",
                    "the bitmap marks exactly the %llu blocks of "
                    "published rank info",
                    (unsigned long long)pub);
    uint64_t used = atomic_load(&h->arena_used_blocks);
    if (used != marked)
        kvc__ck_say(ck, KVC_SEV_DEGRADED, "arena.used",
                    "arena_used_blocks is %llu but %llu blocks are "
                    "marked (derived count; recovery rebuilds it)",
                    (unsigned long long)used, (unsigned long long)marked);
    else
        kvc__ck_say(ck, KVC_SEV_OK, "arena.used", "arena_used_blocks (%llu) matches the bitmap",
                    (unsigned long long)used);
}

void kvc__check_ranks(kvc__ck *ck)
{
    const kvc_header *h = ck->seg->hdr;
    enum kvc__access a = kvc__ck_take(ck, KVC_LOCK_RANKS);
    rank_scan rs = {{"ranks.seq", 0, 0}, {"ranks.slot", 0, 0}, {"ranks.owner", 0, 0}, NULL, 0, 0};
    rs.blobs = malloc((size_t)h->max_ranks * KVC_RANK_TABLES * sizeof *rs.blobs);
    if (!rs.blobs) {
        kvc__ck_give(ck, KVC_LOCK_RANKS, a);
        kvc__ck_say(ck, KVC_SEV_BROKEN, "ranks.seq", "out of memory checking %u ranks",
                    h->max_ranks);
        return;
    }
    for (uint32_t r = 0; r < h->max_ranks; r++)
        scan_rank(ck, &rs, r, a);
    scan_other_tables(ck, &rs, a);
    kvc__ck_settle(ck, &rs.seq, "sequence counters of all %u rank entries are even", h->max_ranks);
    kvc__ck_settle(ck, &rs.slot, "published descriptors are valid (%u registered, %u withdrawn)",
                   ck->st->ranks_registered, ck->st->ranks_withdrawn);
    kvc__ck_settle(ck, &rs.owner, "no registered rank belongs to a dead worker");
    check_overlap(ck, &rs);
    if (a == KVC__UNLOCKED_BUSY) {
        kvc__ck_say(ck, KVC_SEV_INFO, "arena.bitmap", "not checked: the ranks lock is busy");
    } else {
        uint32_t counted = atomic_load(&h->ranks_registered);
        if (counted != ck->st->ranks_registered)
            kvc__ck_say(ck, KVC_SEV_BROKEN, "ranks.count",
                        "ranks_registered is %u but %u entries are "
                        "registered (derived count; recovery rebuilds it)",
                        counted, ck->st->ranks_registered);
        else
            kvc__ck_say(ck, KVC_SEV_OK, "ranks.count", "ranks_registered (%u) matches the entries",
                        counted);
        check_arena(ck, &rs);
    }
    kvc__ck_give(ck, KVC_LOCK_RANKS, a);
    free(rs.blobs);
}
