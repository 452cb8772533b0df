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
 * Callers: the public API (kvcoord.h; the Python binding's
 * Segment.allreduce_min).  Membership (epochs, joining), group slots and
 * abort notes are collective_group.c's, shared through
 * collective_internal.h.  Lock rule: the rounds take no lock (joining takes
 * the procs lock, collective_group.c's top).
 */
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "collective_internal.h"

/* Spin up to this long for the round to complete before sleeping on the
 * futex, when the group has no more ranks than this process may use CPUs
 * and this thread's recent waits were short (wait_round): a futex wake-up
 * costs tens of µs (an idle virtual CPU's far more), about what a typical
 * wait for a peer on another core is, so a spin that catches the round
 * halves the call.  A larger group sleeps at once (a spinning rank would
 * take the CPU its late peers need), and so does a thread whose waits run
 * long (its peers were busy elsewhere or not running). */
#define SPIN_NS 150000ull
/* The thread's wait estimate: an average over its recent waits (from its
 * arrival to the round's decision, ns), each weighing 1/WAIT_AVG_DIV and
 * counted at most WAIT_AVG_CAP, so that one long wait does not stop the
 * spinning for long; it spins while the estimate is below SPIN_NS. */
#define WAIT_AVG_DIV 8
#define WAIT_AVG_CAP (4 * SPIN_NS)
/* While waiting, test the members' liveness locks first after this long
 * and then this often (the process table's own marks, which need no
 * system call, are read at every wake-up). */
#define LIVENESS_FIRST_MS 5u
#define LIVENESS_EVERY_MS 10u
/* A drain wait (step 1) polls this often, ms. */
#define DRAIN_POLL_MS 1u

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

/* ---- a round ------------------------------------------------------------ */

typedef struct call {
    kvc_segment *seg;
    kvc_coll_group *g;
    uint32_t size, rank;
    uint64_t len;      /* the call's len */
    uint64_t deadline; /* CLOCK_MONOTONIC ns */
    uint32_t timeout_ms;
    uint32_t kind;
    int (*stop)(void *);
    void *stop_arg;
    kvc_coll_failure *why;
} call;

/* A part's len word: the call's len (below 2^48) and its kind. */
#define KIND_SHIFT 48
static inline uint64_t len_word(const call *c) { return c->len | (uint64_t)c->kind << KIND_SHIFT; }

/* Whether the caller's stop hook asks the call to give up. */
static bool stopped(const call *c) { return c->stop && c->stop(c->stop_arg); }

/* Check every other member's liveness; if one is gone, abort round gen
 * (word w) naming them.  Returns the (maybe new) word. */
static uint64_t check_peers(call *c, uint64_t gen, uint64_t w, bool test)
{
    note n = {0};
    uint64_t b = atomic_load_explicit(&c->g->broken, memory_order_acquire);
    if (b) { /* broken meanwhile: this round cannot complete either */
        kvc__coll_broken_note(c->g, b, &n);
        return kvc__coll_try_abort(c->g, c->rank, gen, w, &n);
    }
    for (uint32_t r = 0; r < c->size; r++) {
        kvc_coll_member *m = &c->g->member[r];
        uint64_t o = atomic_load(&m->owner);
        if (r == c->rank || !o) /* never claimed: not arrived yet, not dead */
            continue;
        char what[160];
        int32_t pid = atomic_load(&m->pid);
        if (kvc__coll_owner_alive(c->seg, o, pid, test, what, sizeof what))
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
    kvc__coll_note_write(&c->g->member[c->rank], gen, &n);
    kvc__coll_mark_broken(c->g, c->rank, gen);
    return kvc__coll_try_abort(c->g, c->rank, gen, w, &n);
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

/* Count a wait that began at `arrived` into the thread's average *avg. */
static void wait_note(uint64_t *avg, uint64_t arrived)
{
    uint64_t d = kvc__mono_ns() - arrived;
    d = d < WAIT_AVG_CAP ? d : WAIT_AVG_CAP;
    *avg = *avg + d / WAIT_AVG_DIV - *avg / WAIT_AVG_DIV;
}

/* What a late rank's note adds when its process is stopped (SIGSTOP, a
 * debugger: /proc/PID/stat state T or t) rather than slow: owner is its
 * member's claim (process table slot + 1, generation << 32), pid its own
 * pid.  Said only for a process of this PID namespace whose start time is
 * the entry's (elsewhere its pid names nothing here); what stays "" else. */
static void stopped_what(kvc_segment *seg, uint64_t owner, int32_t pid, char *what, size_t cap)
{
    uint32_t gen;
    const kvc_proc *p = kvc__coll_owner_entry(seg, owner, &gen);
    if (!p || pid <= 0)
        return;
    kvc_proc_stat ps;
    if (atomic_load_explicit(&p->gen, memory_order_acquire) != gen || !p->pid_ns ||
        p->pid_ns != seg->pid_ns || kvc_proc_stat_read(pid, &ps) != KVC_OK ||
        ps.start != p->start || (ps.state != 'T' && ps.state != 't'))
        return;
    snprintf(what, cap, "its process %d is stopped (state %c: SIGSTOP, or a debugger)", (int)pid,
             ps.state);
}

/* Wait for round gen (this rank arrived; word w) to be decided. */
static uint64_t wait_round(call *c, uint64_t gen, uint64_t w)
{
    kvc_coll_group *g = c->g;
    /* Spin only while spinning pays: a thread whose recent waits ran long
     * sleeps at once; its waits still count, so it spins again once its
     * peers come back in time. */
    static _Thread_local uint64_t wait_avg;
    bool spin = c->size <= cpus_usable() && wait_avg < SPIN_NS;
    uint64_t arrived = kvc__mono_ns(), spin_end = arrived + (spin ? SPIN_NS : 0);
    for (unsigned i = 0;; i++) {
        w = atomic_load_explicit(&g->round, memory_order_acquire);
        if (w_ahead(w, gen) != 0 || w_decided(w, c->size)) {
            wait_note(&wait_avg, arrived);
            return w;
        }
        if ((i & 63) == 63 && kvc__mono_ns() >= spin_end)
            break;
        kvc__spin_pause();
    }
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
        if (stopped(c)) { /* this rank gives the round up: its peers fail it at once */
            note n = {.ranks = 1ull << c->rank,
                      .kind = NOTE_GAVE_UP,
                      .pid = atomic_load(&g->member[c->rank].pid)};
            kvc__coll_try_abort(g, c->rank, gen, w, &n);
            continue;
        }
        if (now >= c->deadline) {
            note n = {.ranks = missing(c, gen), .timeout_ms = c->timeout_ms};
            if (!n.ranks) /* all published, one not counted: it died between */
                n.ranks = ~(1ull << c->rank) & (c->size == 64 ? ~0ull : (1ull << c->size) - 1);
            int lo = lowest(n.ranks);
            n.pid = lo >= 0 ? atomic_load(&g->member[lo].pid) : 0;
            if (lo >= 0)
                stopped_what(c->seg, atomic_load(&g->member[lo].owner), n.pid, n.what,
                             sizeof n.what);
            kvc__coll_try_abort(g, c->rank, gen, w, &n);
            continue;
        }
        uint64_t until = next_check < c->deadline ? next_check : c->deadline;
        uint32_t ms = (uint32_t)((until - now + 999999) / 1000000);
        kvc__futex_wait(round_futex(g), (uint32_t)w, ms ? ms : 1);
    }
    atomic_fetch_and(&g->sleepers, ~bit);
    wait_note(&wait_avg, arrived);
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
            if (!kvc__coll_owner_alive(c->seg, atomic_load(&m->owner), pid, true, what,
                                       sizeof what)) {
                n.kind = NOTE_DEAD;
                snprintf(n.what, sizeof n.what, "%s", what);
                atomic_fetch_and(&c->g->sleepers, ~n.ranks);
            } else if (kvc__mono_ns() >= c->deadline) {
                n.kind = NOTE_STUCK;
                n.timeout_ms = c->timeout_ms;
            } else if (stopped(c)) { /* not arrived: nothing counts */
                return kvc__fail(KVC_E_TIMEDOUT,
                                 "kvc_allreduce_min: rank %u of group 0x%llx was stopped by its "
                                 "caller before it arrived (generation %llu)",
                                 c->rank, (unsigned long long)c->g->id, (unsigned long long)gen);
            } else {
                usleep(DRAIN_POLL_MS * 1000);
                continue;
            }
            kvc__coll_note_write(&c->g->member[c->rank], gen, &n);
            kvc__coll_mark_broken(c->g, c->rank, gen);
            return kvc__coll_fail_round(c->g->id, gen, c->rank, &n, TAIL_BROKEN, c->why);
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
    uint64_t w0 = g->member[0].part[par].len, mask = (1ull << KIND_SHIFT) - 1;
    for (uint32_t r = 1; r < c->size; r++) {
        uint64_t wr = g->member[r].part[par].len;
        if (wr >> KIND_SHIFT != w0 >> KIND_SHIFT)
            return kvc__fail(KVC_E_INVAL,
                             "kvc_allreduce_min: rank %u of group 0x%llx made a call of kind %u, "
                             "rank 0 one of kind %u, in the same round (generation %llu): the "
                             "ranks called different collectives in the same step",
                             r, (unsigned long long)g->id, (unsigned)(wr >> KIND_SHIFT),
                             (unsigned)(w0 >> KIND_SHIFT), (unsigned long long)gen);
        if (wr != w0)
            return kvc__fail(KVC_E_INVAL,
                             "kvc_allreduce_min: rank %u of group 0x%llx called with len %llu, "
                             "rank 0 with len %llu (generation %llu)",
                             r, (unsigned long long)g->id, (unsigned long long)(wr & mask),
                             (unsigned long long)(w0 & mask), (unsigned long long)gen);
    }
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
        return kvc__coll_fail_broken(g, b, c->rank, c->why);
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
    p->len = len_word(c);
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
            kvc_err e = kvc__coll_fail_from(g, gen, c->rank, out ? out : 1 + 64, TAIL_LATE, c->why);
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
    kvc_err e = out ? kvc__coll_fail_from(g, gen, c->rank, out, "", c->why) : reduce(c, gen, v, n);
    if (out)
        atomic_store(&m->drain, 1);
    KVC_INJECT("coll.reduced");
    atomic_store(&m->seq, 2 * gen + 2);
    return e;
}

/* ---- API ---------------------------------------------------------------- */

static kvc_err check_call(kvc_segment *seg, uint32_t size, uint32_t rank)
{
    KVC_ARG(seg);
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
    if (atomic_load_explicit(&seg->forked, memory_order_relaxed)) /* no getpid() per call */
        return kvc__fail(KVC_E_INVAL,
                         "kvc_allreduce_min: the handle was opened by pid %d, not this process "
                         "(inherited across fork(): open the segment again)",
                         (int)seg->pid);
    return KVC_OK;
}

/* The group of this call, joined (the fast path: found and ours). */
static kvc_err group_of(kvc_segment *seg, uint64_t group, uint32_t size, uint32_t rank,
                        kvc_coll_group **out, kvc_coll_failure *why)
{
    uint64_t me = my_owner(seg);
    kvc_coll_group *g = find_group(seg, group);
    if (g && g->size == size && atomic_load(&g->member[rank].owner) == me) {
        *out = g;
        return KVC_OK;
    }
    return kvc__coll_join(seg, group, size, rank, me, out, why);
}

KVC_API kvc_err kvc_allreduce_min_opt(kvc_segment *seg, uint64_t group, uint32_t size,
                                      uint32_t rank, uint8_t *vec, size_t len,
                                      const kvc_coll_opts *opts, kvc_coll_failure *why)
{
    if (why)
        memset(why, 0, sizeof *why);
    kvc_err e = check_call(seg, size, rank);
    if (e)
        return e;
    if (len)
        KVC_ARG(vec);
    kvc_coll_opts dflt = {.timeout_ms = 30000};
    if (!opts)
        opts = &dflt;
    if (opts->kind > 0xffff || (uint64_t)len >> KIND_SHIFT)
        return kvc__fail(KVC_E_INVAL,
                         "kvc_allreduce_min: kind %u above 65535 or len %zu at or "
                         "above 2^48",
                         opts->kind, len);
    kvc_coll_group *g;
    if ((e = group_of(seg, group, size, rank, &g, why)))
        return e;
    call c = {.seg = seg,
              .g = g,
              .size = size,
              .rank = rank,
              .len = len,
              .deadline = kvc__mono_ns() + (uint64_t)opts->timeout_ms * 1000000ull,
              .timeout_ms = opts->timeout_ms,
              .kind = opts->kind,
              .stop = opts->stop,
              .stop_arg = opts->stop_arg,
              .why = why};
    size_t off = 0;
    do {
        size_t n = len - off < KVC_COLL_CHUNK ? len - off : KVC_COLL_CHUNK;
        e = do_round(&c, n ? vec + off : vec, n);
        if (e) {
            if (why && e != KVC_E_PEER && e != KVC_E_TIMEDOUT)
                memset(why, 0, sizeof *why);
            return e;
        }
        off += n;
    } while (off < len);
    return KVC_OK;
}

KVC_API kvc_err kvc_allreduce_min_ex(kvc_segment *seg, uint64_t group, uint32_t size, uint32_t rank,
                                     uint8_t *vec, size_t len, uint32_t timeout_ms,
                                     kvc_coll_failure *why)
{
    kvc_coll_opts o = {.timeout_ms = timeout_ms};
    return kvc_allreduce_min_opt(seg, group, size, rank, vec, len, &o, why);
}

KVC_API kvc_err kvc_allreduce_min(kvc_segment *seg, uint64_t group, uint32_t size, uint32_t rank,
                                  uint8_t *vec, size_t len, uint32_t timeout_ms)
{
    return kvc_allreduce_min_ex(seg, group, size, rank, vec, len, timeout_ms, NULL);
}

KVC_API kvc_err kvc_coll_join(kvc_segment *seg, uint64_t group, uint32_t size, uint32_t rank)
{
    kvc_err e = check_call(seg, size, rank);
    kvc_coll_group *g;
    return e ? e : group_of(seg, group, size, rank, &g, NULL);
}

KVC_API void kvc_coll_wake(kvc_segment *seg)
{
    if (!seg || !seg->coll)
        return;
    for (uint32_t i = 0; i < KVC_COLL_GROUPS; i++) {
        kvc_coll_group *g = &seg->coll[i];
        if ((atomic_load(&g->state) & 3) == KVC_COLL_READY && atomic_load(&g->sleepers))
            kvc__futex_wake_all(round_futex(g));
    }
}
