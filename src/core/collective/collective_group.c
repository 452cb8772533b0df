/*
 * collective_group.c - the membership side of kvc_allreduce_min: whether a
 * member's process lives, the group slots, the abort notes (a round's
 * reason, written before the abort CAS, and the errors made from them), and
 * joining a group.  Callers: collective.c (kvc_allreduce_min_ex joins; its
 * rounds read liveness, write notes and abort), through
 * collective_internal.h.  The round protocol is collective.c's top comment.
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
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "collective_internal.h"

/* ---- identity and liveness --------------------------------------------- */

/* Whether the process that claimed a member (owner word) still holds its
 * process table entry and runs: true, or false with what happened to it in
 * what ("died (pid 12, killed by signal 9 (Killed))", "left (pid 12 closed
 * its segment handle or was reaped)").  Without test, only the table's own
 * marks are read (kvcoordd's dead mark, a freed or reused entry: no system
 * call); with it, the entry's liveness lock too (liveness.c: one fcntl,
 * right in every PID namespace), and a death it finds is published as the
 * entry's dead mark (kvc__proc_mark_dead). */
bool kvc__coll_owner_alive(kvc_segment *seg, uint64_t owner, int32_t known_pid, bool test,
                           char *what, size_t cap)
{
    uint32_t gen;
    kvc_proc *p = kvc__coll_owner_entry(seg, owner, &gen);
    if (!p) {
        snprintf(what, cap, "left (no process table entry)");
        return false;
    }
    uint32_t slot = (uint32_t)(p - seg->procs);
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
        /* Reaped (kvc_proc_reap: the dead mark and how it ended stay in the
         * entry, its pid cleared) rather than closed: say how it ended, as
         * its rooms' failures do.  The entry's gen is read again after the
         * copy: a new process taking the slot bumps it before clearing how. */
        if (atomic_load_explicit(&p->gen, memory_order_acquire) == gen &&
            atomic_load_explicit(&p->dead, memory_order_acquire)) {
            char how[KVC_HOW_MAX + 1];
            snprintf(how, sizeof how, "%s", p->how);
            atomic_thread_fence(memory_order_acquire);
            if (atomic_load_explicit(&p->gen, memory_order_relaxed) == gen && how[0]) {
                snprintf(what, cap, "died (pid %d, %s)", (int)known_pid, how);
                return false;
            }
        }
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
    /* Published in the process table: the rooms it joined fail on their
     * next read, not after their rate-limited liveness checks (a room this
     * rank's poll just read would otherwise look alive for up to
     * KVC__LIVENESS_RECHECK_MS after the collective reported the death). */
    kvc__proc_mark_dead(seg, atomic_load(&p->pid), p->start, how);
    snprintf(what, cap, "died (pid %d, %s)", (int)known_pid, how);
    return false;
}

/* ---- group slots -------------------------------------------------------- */

/* A READY slot none of whose claimed members lives (procs lock held). */
static bool reclaimable(kvc_segment *seg, kvc_coll_group *g)
{
    char what[160];
    for (uint32_t r = 0; r < g->size && r < KVC_COLL_MAX_SIZE; r++) {
        uint64_t o = atomic_load(&g->member[r].owner);
        if (o &&
            kvc__coll_owner_alive(seg, o, atomic_load(&g->member[r].pid), true, what, sizeof what))
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

void kvc__coll_note_write(kvc_coll_member *m, uint64_t gen, const note *n)
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

/* The error of a round given up with reason n (NULL: unknown); tail: what
 * is said after it ("" or TAIL_*). */
kvc_err kvc__coll_fail_round(uint64_t group, uint64_t gen, uint32_t rank, const note *n,
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
    if (n->kind == NOTE_MISMATCH)
        return kvc__fail(KVC_E_INVAL, "rank %s of group 0x%llx %s (generation %llu)%s", list,
                         (unsigned long long)group, n->what, (unsigned long long)gen, tail);
    if (n->kind == NOTE_GAVE_UP)
        return kvc__fail(KVC_E_TIMEDOUT,
                         "rank %s of group 0x%llx gave up the call before it completed: its "
                         "caller stopped waiting (pid %d: interrupted, or closing its segment "
                         "handle; generation %llu)%s",
                         list, (unsigned long long)group, (int)n->pid, (unsigned long long)gen,
                         tail);
    if (n->kind == NOTE_STUCK)
        return kvc__fail(KVC_E_TIMEDOUT,
                         "rank %s of group 0x%llx stayed inside an earlier round for more than "
                         "%u ms (pid %d is alive but does not go on; generation %llu)%s",
                         list, (unsigned long long)group, n->timeout_ms, (int)n->pid,
                         (unsigned long long)gen, tail);
    if (n->what[0]) /* the lowest of them is stopped (collective.c, stopped_what) */
        return kvc__fail(KVC_E_TIMEDOUT,
                         "rank%s %s of group 0x%llx did not arrive within %u ms: rank %d: %s "
                         "(generation %llu)%s",
                         many ? "s" : "", list, (unsigned long long)group, n->timeout_ms,
                         lowest(n->ranks), n->what, (unsigned long long)gen, tail);
    return kvc__fail(KVC_E_TIMEDOUT,
                     "rank%s %s of group 0x%llx did not arrive within %u ms "
                     "(generation %llu)%s",
                     many ? "s" : "", list, (unsigned long long)group, n->timeout_ms,
                     (unsigned long long)gen, tail);
}

kvc_err kvc__coll_fail_from(kvc_coll_group *g, uint64_t gen, uint32_t rank, uint32_t out,
                            const char *tail, kvc_coll_failure *why)
{
    note n;
    if (out >= 1 && out <= KVC_COLL_MAX_SIZE && note_read(&g->member[out - 1], gen, &n))
        return kvc__coll_fail_round(g->id, gen, rank, &n, tail, why);
    return kvc__coll_fail_round(g->id, gen, rank, NULL, tail, why);
}

/* Record the epoch broken by what rank's note for gen says (the note
 * written first); the first record stays. */
void kvc__coll_mark_broken(kvc_coll_group *g, uint32_t rank, uint64_t gen)
{
    uint64_t zero = 0;
    atomic_compare_exchange_strong(&g->broken, &zero,
                                   gen << KVC_COLL_BROKEN_RANK_BITS | (uint64_t)(rank + 1));
}

/* The reason the epoch is broken (broken word b): the marker's note, or
 * (overwritten: cannot happen, the marker makes no round after) a bare
 * one.  Returns the generation the note is of. */
uint64_t kvc__coll_broken_note(kvc_coll_group *g, uint64_t b, note *n)
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
kvc_err kvc__coll_fail_broken(kvc_coll_group *g, uint64_t b, uint32_t rank, kvc_coll_failure *why)
{
    note n;
    uint64_t gen = kvc__coll_broken_note(g, b, &n);
    if (n.ranks)
        return kvc__coll_fail_round(g->id, gen, rank, &n,
                                    n.kind == NOTE_MISMATCH ? TAIL_MISMATCH : TAIL_BROKEN, why);
    if (why) {
        why->group = g->id;
        why->generation = gen;
        why->dead = 1;
    }
    return kvc__fail(KVC_E_PEER,
                     "a rank of group 0x%llx died, left or got stuck (generation %llu)%s",
                     (unsigned long long)g->id, (unsigned long long)gen, TAIL_BROKEN);
}

/* Abort round gen (word w undecided) as rank, with reason n: note first,
 * then the CAS.  Returns the word after (decided by someone on success).
 * A note the epoch's broken record points at (this rank marked it broken
 * at gen) is already written and stays: rewriting it would make it
 * unreadable to its readers for a moment (note_gen is UINT64_MAX while a
 * note is written), and they would report an unknown reason. */
uint64_t kvc__coll_try_abort(kvc_coll_group *g, uint32_t rank, uint64_t gen, uint64_t w,
                             const note *n)
{
    if (atomic_load(&g->broken) != (gen << KVC_COLL_BROKEN_RANK_BITS | (uint64_t)(rank + 1)))
        kvc__coll_note_write(&g->member[rank], gen, n);
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
        if (kvc__coll_owner_alive(seg, o, pid, true, how, sizeof how)) {
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

/* A joiner of size differs from live group g's size (procs lock held): a
 * size mismatch, told at once to every rank - the epoch is recorded broken
 * with the joiner's note (in its member, unclaimed: only joiners, under
 * the procs lock, write there) and the round in progress aborted, so its
 * waiters and every later call fail naming the mismatch; the joiner gets
 * the same error.  When the joiner's rank is held by a live process the
 * note cannot be written: the joiner alone is told. */
static kvc_err size_mismatch(kvc_coll_group *g, uint32_t size, uint32_t rank)
{
    note n = {.ranks = 1ull << rank, .kind = NOTE_MISMATCH, .pid = (int32_t)getpid()};
    snprintf(n.what, sizeof n.what,
             "called with size %u, the group's ranks with size %u: a size mismatch (every rank "
             "of a group must give the same size)",
             size, g->size);
    uint64_t w = atomic_load(&g->round), gen = w_gen(w);
    kvc_coll_member *m = &g->member[rank];
    if (!atomic_load(&m->owner) && !atomic_load(&g->broken)) {
        kvc__coll_note_write(m, gen, &n);
        kvc__coll_mark_broken(g, rank, gen);
        /* A round completed meanwhile is left alone: the next one fails at
         * its start (broken), or in its wait (check_peers). */
        while (w_gen(w) == gen && !w_decided(w, g->size))
            w = kvc__coll_try_abort(g, rank, gen, w, &n);
    }
    return kvc__coll_fail_round(g->id, gen, rank, &n, TAIL_MISMATCH, NULL);
}

/* Find, create or re-form group id and claim member rank for this process
 * (procs lock taken): the rules at the top. */
kvc_err kvc__coll_join(kvc_segment *seg, uint64_t id, uint32_t size, uint32_t rank, uint64_t me,
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
        e = size_mismatch(g, size, rank);
        kvc__unlock(seg, KVC_LOCK_PROCS);
        return e;
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
