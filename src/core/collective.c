/*
 * collective.c - kvc_allreduce_min(): a generation-counted MIN all-reduce
 * over the members of a group, in the segment.
 *
 * A group (layout.h: kvc_coll_group) has one member per rank and one round
 * word.  A call is one round per KVC_COLL_CHUNK bytes; in round g, rank r:
 *  1. (only when its previous round did not complete) waits until no member
 *     is still inside generation g - 2, whose buffers it is about to reuse;
 *  2. writes its chunk into its part[g & 1] and publishes seq = 2g + 1;
 *  3. arrives: one CAS on the round word, which either counts it in round g
 *     (opening g first when the word still holds g - 1, decided) or finds g
 *     aborted or passed (then the call fails at once with its peers' reason);
 *  4. waits, spinning briefly then on a futex on the word's low half, until
 *     the round is decided: all `size` arrived, or some rank aborted it with
 *     one CAS - after it saw a member dead, or its timeout ran out - having
 *     written its reason (the member's note) first;
 *  5. on completion reads every member's part[g & 1] and takes the MIN, then
 *     publishes seq = 2g + 2.
 * The round word moves to g + 1 only once g is decided, and to g + 2 only
 * after the opener checked (step 1) that nobody is inside g: so a waiter
 * always finds its round's outcome in the word (the previous-round bits
 * once g + 1 opened), and a member's part is never rewritten while read.
 * Every step is a single store or CAS by the process that owns the member:
 * a process killed anywhere leaves a state the others read correctly.
 *
 * Membership (epochs).  A member's generation is its own count of rounds
 * since it joined the epoch: it moves from g to g + 1 whatever the round's
 * outcome (completed, aborted, given up before it arrived), and a round
 * completes only with `size` arrivals at the same generation, one per rank;
 * so the k-th round of every rank reduces together, or fails.  A process
 * joins as a rank of a group (procs lock held):
 *  - a group none of whose claimed members lives (all died or closed their
 *    segment, or it never existed) is (re)formed: a new epoch, every member
 *    unclaimed at generation 0, the size the joiner's;
 *  - else the size must be the group's, the rank unclaimed (or held by this
 *    process), and no claimed member gone: a process cannot take the place
 *    of a member that died or left while others of its epoch still live
 *    (their calls and its would count from different starts), it gets
 *    KVC_E_PEER naming the gone rank and the live ones.
 * A member that sees another of its epoch gone (or stuck inside an earlier
 * round past its timeout) records the epoch broken (group->broken, pointing
 * at its note): every later call of the epoch fails at once with that
 * reason, until all its members died or left and the group is re-formed.
 *
 * Group slots are created, and members claimed, under the procs lock
 * (rare; the lock's holder is the only claimer, so a CLAIMING slot it finds
 * is a dead claimer's leftover); the rounds take no lock.
 */
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "internal.h"

/* Spin this long for the round to complete before sleeping on the futex,
 * when the group has no more ranks than this process may use CPUs, and
 * while spinning pays (wait_round): long enough to catch a peer on another
 * core.  A larger group sleeps at once (a spinning rank would take the CPU
 * its late peers need). */
#define SPIN_NS 20000ull
#define SPIN_SCORE_MAX 16 /* a spin that caught the round: +1, up to this */
#define SPIN_SCORE_LOSS 2 /* one that did not: -2 (0: sleep at once) */
/* While waiting, test the members' liveness locks first after this long
 * and then this often (the process table's own marks, which need no
 * system call, are read at every wake-up). */
#define LIVENESS_FIRST_MS 5u
#define LIVENESS_EVERY_MS 10u
/* A drain wait (step 1) polls this often, ms. */
#define DRAIN_POLL_MS 1u

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
static _Atomic uint32_t *round_futex(kvc_coll_group *g)
{
    unsigned char *p = (unsigned char *)&g->round;
#if __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    p += 4;
#endif
    return (_Atomic uint32_t *)(void *)p;
}

/* CPUs this process may run on (its affinity mask), read once. */
static uint32_t cpus_usable(void)
{
    static _Atomic uint32_t cached;
    uint32_t n = atomic_load_explicit(&cached, memory_order_relaxed);
    if (n)
        return n;
    cpu_set_t set;
    n = sched_getaffinity(0, sizeof set, &set) == 0 ? (uint32_t)CPU_COUNT(&set) : 1;
    n = n ? n : 1;
    atomic_store_explicit(&cached, n, memory_order_relaxed);
    return n;
}

static void spin_pause(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield" ::: "memory");
#else
    __asm__ __volatile__("" ::: "memory");
#endif
}

/* ---- identity and liveness --------------------------------------------- */

static uint64_t my_owner(kvc_segment *seg)
{
    kvc_proc *p = &seg->procs[seg->proc_slot];
    return ((uint64_t)atomic_load(&p->gen) << 32) | (uint32_t)(seg->proc_slot + 1);
}

/* Whether the process that claimed a member (owner word) still holds its
 * process table entry and runs: true, or false with what happened to it in
 * what ("died (pid 12, killed by signal 9 (Killed))", "left (pid 12 closed
 * its segment handle or was reaped)").  Without test, only the table's own
 * marks are read (kvcoordd's dead mark, a freed or reused entry: no system
 * call); with it, the entry's liveness lock too (liveness.c: one fcntl,
 * right in every PID namespace). */
static bool owner_alive(kvc_segment *seg, uint64_t owner, int32_t known_pid, bool test, char *what,
                        size_t cap)
{
    uint32_t slot = (uint32_t)owner - 1, gen = (uint32_t)(owner >> 32);
    if ((uint32_t)owner == 0 || slot >= seg->max_procs) {
        snprintf(what, cap, "left (no process table entry)");
        return false;
    }
    kvc_proc *p = &seg->procs[slot];
    bool same = atomic_load_explicit(&p->gen, memory_order_acquire) == gen &&
                atomic_load_explicit(&p->pid, memory_order_acquire) != 0;
    if (same && atomic_load_explicit(&p->dead, memory_order_acquire)) {
        char how[KVC_HOW_MAX + 1];
        snprintf(how, sizeof how, "%s", p->how);
        snprintf(what, cap, "died (pid %d, %s)", (int)known_pid, how);
        return false;
    }
    kvc_slot_state st = !same  ? KVC__SLOT_GONE
                        : test ? kvc__proc_slot_state(seg, (int32_t)slot, gen)
                               : KVC__SLOT_ALIVE;
    if (st == KVC__SLOT_ALIVE)
        return true;
    if (st == KVC__SLOT_GONE) {
        snprintf(what, cap, "left (pid %d closed its segment handle or was reaped)",
                 (int)known_pid);
        return false;
    }
    /* Its pid means something here only in the same PID namespace (then
     * its zombie, if still there, says how it ended). */
    char how[KVC_HOW_MAX + 1];
    if (p->pid_ns && p->pid_ns == seg->pid_ns)
        kvc__proc_how(atomic_load(&p->pid), p->start, how, sizeof how);
    else
        kvc_exit_unknown_text(p->start, how, sizeof how);
    snprintf(what, cap, "died (pid %d, %s)", (int)known_pid, how);
    return false;
}

/* ---- group slots -------------------------------------------------------- */

static uint32_t group_home(uint64_t id) { return (uint32_t)(kvc__room_hash(id) % KVC_COLL_GROUPS); }

/* The READY slot of group id, or NULL (no lock: the state is re-read
 * around the id, so a slot being re-claimed is never matched). */
static kvc_coll_group *find_group(kvc_segment *seg, uint64_t id)
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

/* A READY slot none of whose claimed members lives (procs lock held). */
static bool reclaimable(kvc_segment *seg, kvc_coll_group *g)
{
    char what[160];
    for (uint32_t r = 0; r < g->size && r < KVC_COLL_MAX_SIZE; r++) {
        uint64_t o = atomic_load(&g->member[r].owner);
        if (o && owner_alive(seg, o, atomic_load(&g->member[r].pid), true, what, sizeof what))
            return false;
    }
    return true;
}

/* (Re)form slot g as group id of size (procs lock held; none of its
 * members lives): a new epoch, every member unclaimed at generation 0. */
static kvc_coll_group *init_group(kvc_coll_group *g, uint64_t id, uint32_t size)
{
    uint64_t inc = (atomic_load(&g->state) >> 2) + 1;
    atomic_store(&g->state, inc << 2 | KVC_COLL_CLAIMING);
    memset(g->member, 0, sizeof g->member);
    atomic_store(&g->round, 0);
    atomic_store(&g->sleepers, 0);
    atomic_store(&g->broken, 0);
    g->epoch++;
    g->id = id;
    g->size = size;
    g->created_ns = kvc__now_ns();
    KVC_INJECT("coll.claiming");
    atomic_store_explicit(&g->state, inc << 2 | KVC_COLL_READY, memory_order_release);
    return g;
}

/* Make a slot for group id (procs lock held): a free one, a dead claimer's,
 * else one whose members are all gone.  NULL when all are in use. */
static kvc_coll_group *new_group(kvc_segment *seg, uint64_t id, uint32_t size)
{
    uint32_t h = group_home(id);
    kvc_coll_group *pick = NULL;
    for (uint32_t i = 0; i < KVC_COLL_GROUPS && !pick; i++) {
        kvc_coll_group *g = &seg->coll[(h + i) % KVC_COLL_GROUPS];
        if ((atomic_load(&g->state) & 3) != KVC_COLL_READY)
            pick = g;
    }
    for (uint32_t i = 0; i < KVC_COLL_GROUPS && !pick; i++) {
        kvc_coll_group *g = &seg->coll[(h + i) % KVC_COLL_GROUPS];
        if (reclaimable(seg, g))
            pick = g;
    }
    return pick ? init_group(pick, id, size) : NULL;
}

/* ---- abort notes -------------------------------------------------------- */

enum { NOTE_LATE = 0, NOTE_DEAD = 1, NOTE_STUCK = 2 };

typedef struct note {
    uint64_t ranks;
    uint32_t kind; /* NOTE_* */
    int32_t pid;
    uint32_t timeout_ms;
    char what[160];
} note;

static void note_write(kvc_coll_member *m, uint64_t gen, const note *n)
{
    atomic_store(&m->note_gen, UINT64_MAX);
    m->note_ranks = n->ranks;
    m->note_dead = n->kind;
    m->note_pid = n->pid;
    m->note_timeout = n->timeout_ms;
    snprintf(m->note_how, sizeof m->note_how, "%s", n->what);
    atomic_store_explicit(&m->note_gen, gen, memory_order_release);
}

static bool note_read(kvc_coll_member *m, uint64_t gen, note *n)
{
    if (atomic_load_explicit(&m->note_gen, memory_order_acquire) != gen)
        return false;
    n->ranks = m->note_ranks;
    n->kind = m->note_dead;
    n->pid = m->note_pid;
    n->timeout_ms = m->note_timeout;
    memcpy(n->what, m->note_how, sizeof n->what);
    n->what[sizeof n->what - 1] = '\0';
    atomic_thread_fence(memory_order_acquire);
    return atomic_load_explicit(&m->note_gen, memory_order_relaxed) == gen;
}

/* "3" or "3, 5, 7" (at most the first 8, then "..."). */
static void rank_list(uint64_t ranks, char *buf, size_t cap)
{
    size_t n = 0;
    int shown = 0;
    snprintf(buf, cap, "%s", ranks ? "" : "?");
    for (uint32_t r = 0; r < 64 && n < cap; r++) {
        if (!(ranks >> r & 1))
            continue;
        if (shown == 8) {
            snprintf(buf + n, cap - n, ", ...");
            break;
        }
        int k = snprintf(buf + n, cap - n, "%s%u", shown ? ", " : "", r);
        if (k < 0)
            break;
        n += (size_t)k;
        shown++;
    }
}

static int lowest(uint64_t ranks) { return ranks ? __builtin_ctzll(ranks) : -1; }

#define TAIL_LATE "; this rank arrived after its peers gave up the call"
#define TAIL_BROKEN                                                                        \
    "; no call of the group can complete without it: the group is re-formed once all its " \
    "ranks died or left (kvcoord.h, kvc_allreduce_min)"

/* The error of a round given up with reason n (NULL: unknown); tail: what
 * is said after it ("" or TAIL_*). */
static kvc_err fail_round(uint64_t group, uint64_t gen, uint32_t rank, const note *n,
                          const char *tail, kvc_coll_failure *why)
{
    if (!n) {
        if (why) {
            why->group = group;
            why->generation = gen;
            why->ranks = 1ull << rank;
        }
        return kvc__fail(KVC_E_TIMEDOUT,
                         "generation %llu of group 0x%llx went on without rank %u: it arrived "
                         "after its peers gave up the call",
                         (unsigned long long)gen, (unsigned long long)group, rank);
    }
    if (why) {
        why->group = group;
        why->generation = gen;
        why->ranks = n->ranks;
        why->dead = n->kind == NOTE_DEAD;
        why->pid = n->pid;
        why->timeout_ms = n->kind == NOTE_DEAD ? 0 : n->timeout_ms;
    }
    char list[64];
    rank_list(n->ranks, list, sizeof list);
    bool many = n->ranks & (n->ranks - 1);
    if (n->kind == NOTE_DEAD) {
        if (!many)
            return kvc__fail(KVC_E_PEER, "rank %s of group 0x%llx %s (generation %llu)%s", list,
                             (unsigned long long)group, n->what, (unsigned long long)gen, tail);
        return kvc__fail(KVC_E_PEER,
                         "ranks %s of group 0x%llx died or left (rank %d %s; generation %llu)%s",
                         list, (unsigned long long)group, lowest(n->ranks), n->what,
                         (unsigned long long)gen, tail);
    }
    if (n->kind == NOTE_STUCK)
        return kvc__fail(KVC_E_TIMEDOUT,
                         "rank %s of group 0x%llx stayed inside an earlier round for more than "
                         "%u ms (pid %d is alive but does not go on; generation %llu)%s",
                         list, (unsigned long long)group, n->timeout_ms, (int)n->pid,
                         (unsigned long long)gen, tail);
    return kvc__fail(KVC_E_TIMEDOUT,
                     "rank%s %s of group 0x%llx did not arrive within %u ms "
                     "(generation %llu)%s",
                     many ? "s" : "", list, (unsigned long long)group, n->timeout_ms,
                     (unsigned long long)gen, tail);
}

/* The outcome of round gen as word w records it (w decided for gen, or
 * one round ahead): 0 completed, else 1 + the rank whose abort won. */
static uint32_t outcome(uint64_t w, uint64_t gen)
{
    if (w_ahead(w, gen) == 0)
        return (w & KVC_COLL_ABORTED) ? 1 + w_aborter(w) : 0;
    if (w_ahead(w, gen) == 1)
        return (w & KVC_COLL_PREV_ABORTED) ? 1 + w_prev_aborter(w) : 0;
    return 1 + 64; /* further: cannot happen (see the top); unknown reason */
}

static kvc_err fail_from(kvc_coll_group *g, uint64_t gen, uint32_t rank, uint32_t out,
                         const char *tail, kvc_coll_failure *why)
{
    note n;
    if (out >= 1 && out <= KVC_COLL_MAX_SIZE && note_read(&g->member[out - 1], gen, &n))
        return fail_round(g->id, gen, rank, &n, tail, why);
    return fail_round(g->id, gen, rank, NULL, tail, why);
}

/* Record the epoch broken by what rank's note for gen says (the note
 * written first); the first record stays. */
static void mark_broken(kvc_coll_group *g, uint32_t rank, uint64_t gen)
{
    uint64_t zero = 0;
    atomic_compare_exchange_strong(&g->broken, &zero,
                                   gen << KVC_COLL_BROKEN_RANK_BITS | (uint64_t)(rank + 1));
}

/* The reason the epoch is broken (broken word b): the marker's note, or
 * (overwritten: cannot happen, the marker makes no round after) a bare
 * one.  Returns the generation the note is of. */
static uint64_t broken_note(kvc_coll_group *g, uint64_t b, note *n)
{
    uint32_t by = (uint32_t)(b & ((1u << KVC_COLL_BROKEN_RANK_BITS) - 1)) - 1;
    uint64_t gen = b >> KVC_COLL_BROKEN_RANK_BITS;
    if (by >= KVC_COLL_MAX_SIZE || !note_read(&g->member[by], gen, n)) {
        *n = (note){.kind = NOTE_DEAD};
        snprintf(n->what, sizeof n->what, "died, left or got stuck");
    }
    return gen;
}

/* The error of a call of a broken epoch (broken word b). */
static kvc_err fail_broken(kvc_coll_group *g, uint64_t b, uint32_t rank, kvc_coll_failure *why)
{
    note n;
    uint64_t gen = broken_note(g, b, &n);
    if (n.ranks)
        return fail_round(g->id, gen, rank, &n, TAIL_BROKEN, why);
    if (why) {
        why->group = g->id;
        why->generation = gen;
        why->dead = 1;
    }
    return kvc__fail(KVC_E_PEER,
                     "a rank of group 0x%llx died, left or got stuck (generation %llu)%s",
                     (unsigned long long)g->id, (unsigned long long)gen, TAIL_BROKEN);
}

static void wake(kvc_coll_group *g)
{
    if (atomic_load(&g->sleepers))
        kvc__futex_wake_all(round_futex(g));
}

/* Abort round gen (word w undecided) as rank, with reason n: note first,
 * then the CAS.  Returns the word after (decided by someone on success).
 * A note the epoch's broken record points at (this rank marked it broken
 * at gen) is already written and stays: rewriting it would make it
 * unreadable to its readers for a moment (note_gen is UINT64_MAX while a
 * note is written), and they would report an unknown reason. */
static uint64_t try_abort(kvc_coll_group *g, uint32_t rank, uint64_t gen, uint64_t w, const note *n)
{
    if (atomic_load(&g->broken) != (gen << KVC_COLL_BROKEN_RANK_BITS | (uint64_t)(rank + 1)))
        note_write(&g->member[rank], gen, n);
    uint64_t nw = w | KVC_COLL_ABORTED | (uint64_t)rank << KVC_COLL_ABORTER_SHIFT;
    if (atomic_compare_exchange_strong(&g->round, &w, nw)) {
        wake(g);
        return nw;
    }
    return w;
}

/* ---- joining ------------------------------------------------------------ */

/* Whether owner (alive) is an entry of this process (another handle). */
static bool same_process(kvc_segment *seg, uint64_t owner)
{
    const kvc_proc *p = &seg->procs[(uint32_t)owner - 1];
    return atomic_load(&p->pid) == seg->pid && p->start == seg->start && p->pid_ns == seg->pid_ns;
}

/* The members of g claimed by a live process (bit r), and those claimed
 * by one that died or left, with the lowest of them described in what
 * (procs lock held: one liveness test per claimed member). */
static uint64_t live_members(kvc_segment *seg, kvc_coll_group *g, uint64_t *gone, char *what,
                             size_t cap, int32_t *gone_pid)
{
    uint64_t live = 0;
    *gone = 0;
    for (uint32_t r = 0; r < g->size && r < KVC_COLL_MAX_SIZE; r++) {
        uint64_t o = atomic_load(&g->member[r].owner);
        if (!o)
            continue;
        char how[160];
        int32_t pid = atomic_load(&g->member[r].pid);
        if (owner_alive(seg, o, pid, true, how, sizeof how)) {
            live |= 1ull << r;
        } else {
            if (!*gone) {
                snprintf(what, cap, "%s", how);
                *gone_pid = pid;
            }
            *gone |= 1ull << r;
        }
    }
    return live;
}

/* The KVC_E_PEER of a process that would join an epoch some of whose
 * members are gone while others live. */
static kvc_err fail_mixed(kvc_coll_group *g, uint32_t rank, uint64_t live, uint64_t gone,
                          const char *what, int32_t gone_pid, kvc_coll_failure *why)
{
    if (why) {
        why->group = g->id;
        why->ranks = gone;
        why->dead = 1;
        why->pid = gone_pid;
        why->generation = atomic_load(&g->member[__builtin_ctzll(gone | 1ull << 63)].seq) / 2;
    }
    char glist[64], llist[64];
    rank_list(gone, glist, sizeof glist);
    rank_list(live, llist, sizeof llist);
    int lo = __builtin_ctzll(live | 1ull << 63); /* both are non-empty here */
    return kvc__fail(KVC_E_PEER,
                     "kvc_allreduce_min: rank %u of group 0x%llx cannot be joined: rank%s %s of "
                     "its epoch %llu died or left (rank %d %s) while rank%s %s still live (rank "
                     "%d: pid %d); a group is re-formed by new processes only once all of its "
                     "ranks died or left",
                     rank, (unsigned long long)g->id, gone & (gone - 1) ? "s" : "", glist,
                     (unsigned long long)g->epoch, lowest(gone), what, live & (live - 1) ? "s" : "",
                     llist, lo, (int)atomic_load(&g->member[lo].pid));
}

/* Find, create or re-form group id and claim member rank for this process
 * (procs lock taken): the rules at the top. */
static kvc_err join(kvc_segment *seg, uint64_t id, uint32_t size, uint32_t rank, uint64_t me,
                    kvc_coll_group **out, kvc_coll_failure *why)
{
    kvc_err e = kvc__lock(seg, KVC_LOCK_PROCS);
    if (e)
        return e;
    kvc_coll_group *g = find_group(seg, id);
    char what[160] = "";
    int32_t gone_pid = 0;
    uint64_t gone = 0, live = g ? live_members(seg, g, &gone, what, sizeof what, &gone_pid) : 0;
    if (g && !live) {
        init_group(g, id, size); /* nobody of its epoch lives: a new one */
        gone = 0;
    } else if (!g && !(g = new_group(seg, id, size))) {
        kvc__unlock(seg, KVC_LOCK_PROCS);
        return kvc__fail(KVC_E_FULL,
                         "kvc_allreduce_min: segment %s already has %d collective groups with a "
                         "live member (a group's slot is reclaimed once all its members died "
                         "or left)",
                         seg->name, KVC_COLL_GROUPS);
    }
    if (g->size != size) {
        kvc__unlock(seg, KVC_LOCK_PROCS);
        return kvc__fail(KVC_E_INVAL,
                         "kvc_allreduce_min: size %u differs from group 0x%llx's size %u (set "
                         "by the first call of its epoch, whose ranks still live)",
                         size, (unsigned long long)id, g->size);
    }
    kvc_coll_member *m = &g->member[rank];
    uint64_t cur = atomic_load(&m->owner);
    if (cur != me) {
        if (live >> rank & 1) {
            if (!same_process(seg, cur)) {
                int32_t pid = atomic_load(&m->pid);
                kvc__unlock(seg, KVC_LOCK_PROCS);
                return kvc__fail(KVC_E_INVAL,
                                 "kvc_allreduce_min: rank %u of group 0x%llx is held by another "
                                 "live process (pid %d)",
                                 rank, (unsigned long long)id, (int)pid);
            }
            /* Another handle of this process: the rank is this process's,
             * its count goes on. */
            atomic_store(&m->owner, me);
        } else if (gone) {
            e = fail_mixed(g, rank, live, gone, what, gone_pid, why);
            kvc__unlock(seg, KVC_LOCK_PROCS);
            return e;
        } else {
            /* Unclaimed in this epoch: it starts at generation 0, as
             * every member of the epoch did. */
            atomic_store(&m->seq, 0);
            atomic_store(&m->drain, 0);
            atomic_store(&m->pid, seg->pid);
            atomic_fetch_and(&g->sleepers, ~(1ull << rank));
            KVC_INJECT("coll.claim");
            atomic_store(&m->owner, me);
        }
    }
    kvc__unlock(seg, KVC_LOCK_PROCS);
    *out = g;
    return KVC_OK;
}

/* ---- a round ------------------------------------------------------------ */

typedef struct call {
    kvc_segment *seg;
    kvc_coll_group *g;
    uint32_t size, rank;
    uint64_t len;      /* the call's len */
    uint64_t deadline; /* CLOCK_MONOTONIC ns */
    uint32_t timeout_ms;
    kvc_coll_failure *why;
} call;

/* Check every other member's liveness; if one is gone, abort round gen
 * (word w) naming them.  Returns the (maybe new) word. */
static uint64_t check_peers(call *c, uint64_t gen, uint64_t w, bool test)
{
    note n = {0};
    uint64_t b = atomic_load_explicit(&c->g->broken, memory_order_acquire);
    if (b) { /* broken meanwhile: this round cannot complete either */
        broken_note(c->g, b, &n);
        return try_abort(c->g, c->rank, gen, w, &n);
    }
    for (uint32_t r = 0; r < c->size; r++) {
        kvc_coll_member *m = &c->g->member[r];
        uint64_t o = atomic_load(&m->owner);
        if (r == c->rank || !o) /* never claimed: not arrived yet, not dead */
            continue;
        char what[160];
        int32_t pid = atomic_load(&m->pid);
        if (owner_alive(c->seg, o, pid, test, what, sizeof what))
            continue;
        if (!n.ranks) {
            n.pid = pid;
            snprintf(n.what, sizeof n.what, "%s", what);
        }
        n.ranks |= 1ull << r;
    }
    if (!n.ranks)
        return w;
    n.kind = NOTE_DEAD;
    /* None of them sleeps any more (a sleeper killed asleep left its bit). */
    atomic_fetch_and(&c->g->sleepers, ~n.ranks);
    /* Broken first, then the abort: whoever the abort wakes finds the
     * epoch broken at its next call. */
    note_write(&c->g->member[c->rank], gen, &n);
    mark_broken(c->g, c->rank, gen);
    return try_abort(c->g, c->rank, gen, w, &n);
}

/* Ranks that have not published their part for gen. */
static uint64_t missing(call *c, uint64_t gen)
{
    uint64_t ranks = 0;
    for (uint32_t r = 0; r < c->size; r++)
        if (r != c->rank && atomic_load(&c->g->member[r].seq) != 2 * gen + 1)
            ranks |= 1ull << r;
    return ranks;
}

/* Wait for round gen (this rank arrived; word w) to be decided. */
static uint64_t wait_round(call *c, uint64_t gen, uint64_t w)
{
    kvc_coll_group *g = c->g;
    /* Spin only while spinning pays: a thread whose recent spins mostly
     * ended with the round still open (its peers were not running: more
     * runnable processes than CPUs) sleeps at once, and tries a spin again
     * now and then. */
    static _Thread_local int score = SPIN_SCORE_MAX;
    static _Thread_local unsigned probe;
    bool spin = c->size <= cpus_usable() && (score > 0 || (++probe & 31) == 0);
    uint64_t spin_end = kvc__mono_ns() + (spin ? SPIN_NS : 0);
    for (unsigned i = 0;; i++) {
        w = atomic_load_explicit(&g->round, memory_order_acquire);
        if (w_ahead(w, gen) != 0 || w_decided(w, c->size)) {
            if (spin && score < SPIN_SCORE_MAX)
                score++;
            return w;
        }
        if ((i & 63) == 63 && kvc__mono_ns() >= spin_end)
            break;
        spin_pause();
    }
    if (spin)
        score = score > SPIN_SCORE_LOSS ? score - SPIN_SCORE_LOSS : 0;
    uint64_t bit = 1ull << c->rank;
    atomic_fetch_or(&g->sleepers, bit);
    uint64_t now = kvc__mono_ns();
    uint64_t next_check = now + LIVENESS_FIRST_MS * 1000000ull;
    for (;;) {
        w = atomic_load_explicit(&g->round, memory_order_acquire);
        if (w_ahead(w, gen) != 0 || w_decided(w, c->size))
            break;
        now = kvc__mono_ns();
        bool test = now >= next_check;
        if (test)
            next_check = now + LIVENESS_EVERY_MS * 1000000ull;
        uint64_t w2 = check_peers(c, gen, w, test);
        if (w2 != w)
            continue;
        if (now >= c->deadline) {
            note n = {.ranks = missing(c, gen), .timeout_ms = c->timeout_ms};
            if (!n.ranks) /* all published, one not counted: it died between */
                n.ranks = ~(1ull << c->rank) & (c->size == 64 ? ~0ull : (1ull << c->size) - 1);
            int lo = lowest(n.ranks);
            n.pid = lo >= 0 ? atomic_load(&g->member[lo].pid) : 0;
            try_abort(g, c->rank, gen, w, &n);
            continue;
        }
        uint64_t until = next_check < c->deadline ? next_check : c->deadline;
        uint32_t ms = (uint32_t)((until - now + 999999) / 1000000);
        kvc__futex_wait(round_futex(g), (uint32_t)w, ms ? ms : 1);
    }
    atomic_fetch_and(&g->sleepers, ~bit);
    return w;
}

/* Step 1: wait until no member is inside generation gen - 2.  A member
 * that died there, or stays there past the timeout, breaks the epoch (no
 * round from gen on could complete as its count says): the note is
 * written and the epoch recorded broken. */
static kvc_err drain(call *c, uint64_t gen)
{
    uint64_t busy = 2 * gen_add(gen, GEN_MASK - 1) + 1; /* 2 (gen - 2) + 1 */
    for (uint32_t r = 0; r < c->size; r++) {
        kvc_coll_member *m = &c->g->member[r];
        while (r != c->rank && atomic_load(&m->seq) == busy) {
            char what[160];
            int32_t pid = atomic_load(&m->pid);
            note n = {.ranks = 1ull << r, .pid = pid};
            if (!owner_alive(c->seg, atomic_load(&m->owner), pid, true, what, sizeof what)) {
                n.kind = NOTE_DEAD;
                snprintf(n.what, sizeof n.what, "%s", what);
                atomic_fetch_and(&c->g->sleepers, ~n.ranks);
            } else if (kvc__mono_ns() >= c->deadline) {
                n.kind = NOTE_STUCK;
                n.timeout_ms = c->timeout_ms;
            } else {
                usleep(DRAIN_POLL_MS * 1000);
                continue;
            }
            note_write(&c->g->member[c->rank], gen, &n);
            mark_broken(c->g, c->rank, gen);
            return fail_round(c->g->id, gen, c->rank, &n, TAIL_BROKEN, c->why);
        }
    }
    return KVC_OK;
}

/* After a round of gen that did not complete for this member: its next
 * round is gen + 1 (its own count), checking its peers first. */
static void next_after_failure(kvc_coll_member *m, uint64_t gen)
{
    atomic_store(&m->drain, 1);
    atomic_store(&m->seq, 2 * gen_add(gen, 1));
}

/* The MIN of every member's part of round gen into v[0..n). */
static kvc_err reduce(call *c, uint64_t gen, uint8_t *v, size_t n)
{
    kvc_coll_group *g = c->g;
    uint32_t par = (uint32_t)(gen & 1);
    uint64_t len0 = g->member[0].part[par].len;
    for (uint32_t r = 1; r < c->size; r++)
        if (g->member[r].part[par].len != len0)
            return kvc__fail(KVC_E_INVAL,
                             "kvc_allreduce_min: rank %u of group 0x%llx called with len %llu, "
                             "rank 0 with len %llu (generation %llu)",
                             r, (unsigned long long)g->id,
                             (unsigned long long)g->member[r].part[par].len,
                             (unsigned long long)len0, (unsigned long long)gen);
    for (uint32_t r = 0; r < c->size; r++) {
        const unsigned char *d = g->member[r].part[par].data;
        for (size_t i = 0; i < n; i++)
            v[i] = d[i] < v[i] ? d[i] : v[i];
    }
    return KVC_OK;
}

static kvc_err do_round(call *c, uint8_t *v, size_t n)
{
    kvc_coll_group *g = c->g;
    kvc_coll_member *m = &g->member[c->rank];
    uint64_t b = atomic_load_explicit(&g->broken, memory_order_acquire);
    if (b)
        return fail_broken(g, b, c->rank, c->why);
    uint64_t seq = atomic_load(&m->seq);
    if (seq & 1)
        return kvc__fail(KVC_E_INVAL,
                         "kvc_allreduce_min: rank %u of group 0x%llx is inside generation %llu "
                         "already (is the rank called from two threads at once?)",
                         c->rank, (unsigned long long)g->id, (unsigned long long)(seq / 2));
    uint64_t gen = (seq / 2) & GEN_MASK;
    if (atomic_load(&m->drain)) {
        kvc_err e = drain(c, gen);
        if (e)
            return e;
        atomic_store(&m->drain, 0);
    }
    kvc_coll_part *p = &m->part[gen & 1];
    if (n)
        memcpy(p->data, v, n);
    p->len = c->len;
    atomic_store(&m->seq, 2 * gen + 1);
    KVC_INJECT("coll.published");
    uint64_t w = atomic_load(&g->round);
    for (;;) {
        uint64_t d = w_ahead(w, gen), nw;
        if (d == 0 && !w_decided(w, c->size))
            nw = w + 1;
        else if (d == GEN_MASK && w_decided(w, c->size))
            nw = gen << KVC_COLL_GEN_SHIFT | 1 |
                 ((w & KVC_COLL_ABORTED) ? KVC_COLL_PREV_ABORTED |
                                               (uint64_t)w_aborter(w) << KVC_COLL_PREV_ABORTER_SHIFT
                                         : 0);
        else if (d == GEN_MASK) {
            /* The previous round is undecided: this rank's count is ahead
             * of the group's, which only two threads calling as one rank at
             * once can cause. */
            atomic_store(&m->seq, 2 * gen);
            return kvc__fail(KVC_E_INVAL,
                             "kvc_allreduce_min: rank %u of group 0x%llx is at generation %llu "
                             "while the group's is %llu (is the rank called from two threads "
                             "at once?)",
                             c->rank, (unsigned long long)g->id, (unsigned long long)gen,
                             (unsigned long long)w_gen(w));
        } else {
            /* gen was aborted, or passed without this rank (it cannot
             * complete without it): this round fails, the next is gen + 1
             * whatever the group's is, so that the k-th round of every
             * rank stays the same generation. */
            uint32_t out = d == 0 || d == 1 ? outcome(w, gen) : 1 + 64;
            kvc_err e = fail_from(g, gen, c->rank, out ? out : 1 + 64, TAIL_LATE, c->why);
            next_after_failure(m, gen);
            return e;
        }
        if (atomic_compare_exchange_strong(&g->round, &w, nw)) {
            w = nw;
            break;
        }
    }
    KVC_INJECT("coll.arrived");
    if (w_count(w) >= c->size)
        wake(g);
    else
        w = wait_round(c, gen, w);
    uint32_t out = outcome(w, gen);
    kvc_err e = out ? fail_from(g, gen, c->rank, out, "", c->why) : reduce(c, gen, v, n);
    if (out)
        atomic_store(&m->drain, 1);
    KVC_INJECT("coll.reduced");
    atomic_store(&m->seq, 2 * gen + 2);
    return e;
}

/* ---- API ---------------------------------------------------------------- */

KVC_API kvc_err kvc_allreduce_min_ex(kvc_segment *seg, uint64_t group, uint32_t size, uint32_t rank,
                                     uint8_t *vec, size_t len, uint32_t timeout_ms,
                                     kvc_coll_failure *why)
{
    if (why)
        memset(why, 0, sizeof *why);
    KVC_ARG(seg);
    if (len)
        KVC_ARG(vec);
    if (size < 1 || size > KVC_COLL_MAX_SIZE)
        return kvc__fail(KVC_E_INVAL, "kvc_allreduce_min: size %u out of range 1..%d", size,
                         KVC_COLL_MAX_SIZE);
    if (rank >= size)
        return kvc__fail(KVC_E_INVAL, "kvc_allreduce_min: rank %u out of range 0..%u (size %u)",
                         rank, size - 1, size);
    if (seg->proc_slot < 0)
        return kvc__fail(KVC_E_INVAL,
                         "kvc_allreduce_min: the handle has no process table entry (opened with "
                         "role none), so its peers could not tell whether it lives");
    if ((int32_t)getpid() != seg->pid)
        return kvc__fail(KVC_E_INVAL,
                         "kvc_allreduce_min: the handle was opened by pid %d, not this process "
                         "(inherited across fork(): open the segment again)",
                         (int)seg->pid);
    uint64_t me = my_owner(seg);
    kvc_coll_group *g = find_group(seg, group);
    if (!g || g->size != size || atomic_load(&g->member[rank].owner) != me) {
        kvc_err e = join(seg, group, size, rank, me, &g, why);
        if (e)
            return e;
    }
    call c = {.seg = seg,
              .g = g,
              .size = size,
              .rank = rank,
              .len = len,
              .deadline = kvc__mono_ns() + (uint64_t)timeout_ms * 1000000ull,
              .timeout_ms = timeout_ms,
              .why = why};
    size_t off = 0;
    do {
        size_t n = len - off < KVC_COLL_CHUNK ? len - off : KVC_COLL_CHUNK;
        kvc_err e = do_round(&c, n ? vec + off : vec, n);
        if (e) {
            if (why && e != KVC_E_PEER && e != KVC_E_TIMEDOUT)
                memset(why, 0, sizeof *why);
            return e;
        }
        off += n;
    } while (off < len);
    return KVC_OK;
}

KVC_API kvc_err kvc_allreduce_min(kvc_segment *seg, uint64_t group, uint32_t size, uint32_t rank,
                                  uint8_t *vec, size_t len, uint32_t timeout_ms)
{
    return kvc_allreduce_min_ex(seg, group, size, rank, vec, len, timeout_ms, NULL);
}
