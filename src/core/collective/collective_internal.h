/*
 * collective_internal.h - what collective.c (the rounds, the API) and
 * collective_group.c (identity and liveness, group slots, abort notes,
 * joining) share; private to src/core/.
 *
 * The round word's helpers, the futex word, this process's owner word,
 * find_group(), outcome() and wake() are static inline here: the round's
 * fast path (kvc_allreduce_min_ex -> do_round -> wait_round) makes no call
 * into collective_group.c unless a peer failed, the group must be joined
 * or a wait outlasted its spin.  Lock rule: none of these take a lock
 * (collective_group.c's top says which of its functions run under the
 * procs lock).
 */
#ifndef KVC_COLLECTIVE_INTERNAL_H
#define KVC_COLLECTIVE_INTERNAL_H

#include "internal.h"

#define GEN_MASK KVC_COLL_GEN_MASK

static inline uint64_t w_gen(uint64_t w) { return w >> KVC_COLL_GEN_SHIFT; }
static inline uint32_t w_count(uint64_t w) { return (uint32_t)(w & KVC_COLL_COUNT_MASK); }
static inline uint32_t w_aborter(uint64_t w)
{
    return (uint32_t)(w >> KVC_COLL_ABORTER_SHIFT) & 63;
}
static inline uint32_t w_prev_aborter(uint64_t w)
{
    return (uint32_t)(w >> KVC_COLL_PREV_ABORTER_SHIFT) & 63;
}
static inline uint64_t gen_add(uint64_t g, uint64_t d) { return (g + d) & GEN_MASK; }
/* How far the word's generation is ahead of g (mod 2^43): 0 same, 1 next,
 * GEN_MASK one behind. */
static inline uint64_t w_ahead(uint64_t w, uint64_t g) { return (w_gen(w) - g) & GEN_MASK; }
static inline bool w_decided(uint64_t w, uint32_t size)
{
    return (w & KVC_COLL_ABORTED) || w_count(w) >= size;
}

/* The futex word: the round word's low half, which every transition changes
 * (count, abort bit, or the low bits of the generation). */
static inline _Atomic uint32_t *round_futex(kvc_coll_group *g)
{
    unsigned char *p = (unsigned char *)&g->round;
#if __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    p += 4;
#endif
    return (_Atomic uint32_t *)(void *)p;
}

/* ---- identity --------------------------------------------------------- */

static inline uint64_t my_owner(kvc_segment *seg)
{
    kvc_proc *p = &seg->procs[seg->proc_slot];
    return ((uint64_t)atomic_load(&p->gen) << 32) | (uint32_t)(seg->proc_slot + 1);
}

/* ---- group slots -------------------------------------------------------- */

static inline uint32_t group_home(uint64_t id)
{
    return (uint32_t)(kvc__room_hash(id) % KVC_COLL_GROUPS);
}

/* The READY slot of group id, or NULL (no lock: the state is re-read
 * around the id, so a slot being re-claimed is never matched). */
static inline kvc_coll_group *find_group(kvc_segment *seg, uint64_t id)
{
    uint32_t h = group_home(id);
    for (uint32_t i = 0; i < KVC_COLL_GROUPS; i++) {
        kvc_coll_group *g = &seg->coll[(h + i) % KVC_COLL_GROUPS];
        uint64_t st = atomic_load_explicit(&g->state, memory_order_acquire);
        if ((st & 3) != KVC_COLL_READY)
            continue;
        uint64_t gid = __atomic_load_n(&g->id, __ATOMIC_RELAXED);
        atomic_thread_fence(memory_order_acquire);
        if (gid == id && atomic_load_explicit(&g->state, memory_order_relaxed) == st)
            return g;
    }
    return NULL;
}

/* ---- abort notes -------------------------------------------------------- */

/* NOTE_GAVE_UP: the rank's caller stopped the wait (kvc_coll_opts.stop);
 * NOTE_MISMATCH: a joiner's size differs from the group's (what says
 * how). */
enum { NOTE_LATE = 0, NOTE_DEAD = 1, NOTE_STUCK = 2, NOTE_GAVE_UP = 3, NOTE_MISMATCH = 4 };

typedef struct note {
    uint64_t ranks;
    uint32_t kind; /* NOTE_* */
    int32_t pid;
    uint32_t timeout_ms;
    char what[160];
} note;

static inline int lowest(uint64_t ranks) { return ranks ? __builtin_ctzll(ranks) : -1; }

#define TAIL_LATE "; this rank arrived after its peers gave up the call"
#define TAIL_MISMATCH \
    "; the group is re-formed once all its ranks died or left (kvcoord.h, kvc_allreduce_min)"
#define TAIL_BROKEN                                                                        \
    "; no call of the group can complete without it: the group is re-formed once all its " \
    "ranks died or left (kvcoord.h, kvc_allreduce_min)"

/* The outcome of round gen as word w records it (w decided for gen, or
 * one round ahead): 0 completed, else 1 + the rank whose abort won. */
static inline uint32_t outcome(uint64_t w, uint64_t gen)
{
    if (w_ahead(w, gen) == 0)
        return (w & KVC_COLL_ABORTED) ? 1 + w_aborter(w) : 0;
    if (w_ahead(w, gen) == 1)
        return (w & KVC_COLL_PREV_ABORTED) ? 1 + w_prev_aborter(w) : 0;
    return 1 + 64; /* further: cannot happen (see collective.c's top); unknown reason */
}

static inline void wake(kvc_coll_group *g)
{
    if (atomic_load(&g->sleepers))
        kvc__futex_wake_all(round_futex(g));
}

/* ---- collective_group.c -------------------------------------------------- */

/* The process table entry a member's owner word names (the claim: process
 * table slot + 1 in the low 32 bits, the entry's generation in the high
 * 32), and that generation in *gen; NULL when the word names no entry (0,
 * or a slot past the table).  Reads nothing shared: whether the entry is
 * still that process is the caller's check of p->gen against *gen. */
static inline kvc_proc *kvc__coll_owner_entry(kvc_segment *seg, uint64_t owner, uint32_t *gen)
{
    uint32_t slot = (uint32_t)owner - 1;
    *gen = (uint32_t)(owner >> 32);
    return (uint32_t)owner == 0 || slot >= seg->max_procs ? NULL : &seg->procs[slot];
}

/* Liveness of a member's owner (owner_alive in collective_group.c). */
bool kvc__coll_owner_alive(kvc_segment *seg, uint64_t owner, int32_t known_pid, bool test,
                           char *what, size_t cap);
void kvc__coll_note_write(kvc_coll_member *m, uint64_t gen, const note *n);
kvc_err kvc__coll_fail_round(uint64_t group, uint64_t gen, uint32_t rank, const note *n,
                             const char *tail, kvc_coll_failure *why);
kvc_err kvc__coll_fail_from(kvc_coll_group *g, uint64_t gen, uint32_t rank, uint32_t out,
                            const char *tail, kvc_coll_failure *why);
void kvc__coll_mark_broken(kvc_coll_group *g, uint32_t rank, uint64_t gen);
uint64_t kvc__coll_broken_note(kvc_coll_group *g, uint64_t b, note *n);
kvc_err kvc__coll_fail_broken(kvc_coll_group *g, uint64_t b, uint32_t rank, kvc_coll_failure *why);
uint64_t kvc__coll_try_abort(kvc_coll_group *g, uint32_t rank, uint64_t gen, uint64_t w,
                             const note *n);
kvc_err kvc__coll_join(kvc_segment *seg, uint64_t id, uint32_t size, uint32_t rank, uint64_t me,
                       kvc_coll_group **out, kvc_coll_failure *why);

#endif
