/*
 * rooms.c - bootstrap rooms: per-request KVPoll state and failure records
 * shared by every rank of the node.
 *
 * The room table is split into KVC_ROOM_STRIPES stripes by the top bits of
 * the room id's hash; each stripe is an open-addressing table of its own
 * (linear probing that wraps inside the stripe), with its own robust
 * mutex, count, change epoch and undo record (kvc_room_stripe, layout.h).
 * Deletion leaves a tombstone, and every tombstone followed by a free slot
 * is turned back into a free slot (a probe reaching it would stop at the
 * next slot anyway), so tombstones do not pile up.
 *
 * Writers hold their room's stripe lock.  Every update runs inside the
 * stripe's undo record and the room's seqlock window (seqlock.h):
 *   save the bytes about to change (the room, and the failure ring entry
 *   it appends to, claimed first) -> undo valid -> compute the new bytes in
 *   a private copy -> room seq odd -> copy them in -> undo clear -> room seq
 *   even.
 * A writer that dies before the undo is cleared is rolled back by the
 * stripe's recovery (run by the next locker under EOWNERDEAD); one that
 * dies after it left complete new bytes, and recovery only evens the seq.
 * Either way a reader sees the old room or the new one, never a mix.
 *
 * Readers take no lock and make no system call: they probe the stripe's
 * table copying each slot under its seq, re-check, retry.  A reader that
 * keeps seeing an odd seq (a writer stopped or dead inside) takes the
 * stripe lock, which recovers a dead writer, and reads under it.  The
 * liveness of participants comes from the process table (slot generation
 * and the dead mark kvc_proc_reap() sets) while a watcher beats, else from
 * /proc at most every KVC__LIVENESS_RECHECK_MS per participant; either way
 * outside the lock.  Only a room that must change (a dead participant, a
 * TTL passed) sends the reader to the stripe lock.
 */
#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>

#include "internal.h"
#include "seqlock.h"

/* While waiting on a room, participant liveness is re-checked this often,
 * so a dead participant is noticed even with no kvcoordd to report it. */
#define LIVENESS_SLICE_MS 200
/* Reads of an odd seq before a reader takes the stripe lock (the first few
 * spin, the rest yield the CPU to the writer). */
#define ODD_SPINS 2000
#define ODD_PAUSES 64
/* Tries at claiming a failure ring entry another writer holds, and at
 * reading one being written, before giving up on it. */
#define RING_SPINS 2000

KVC_API const char *kvc_poll_name(kvc_poll s)
{
    switch (s) {
    case KVC_POLL_FAILED: return "Failed";
    case KVC_POLL_BOOTSTRAPPING: return "Bootstrapping";
    case KVC_POLL_WAITING_FOR_INPUT: return "WaitingForInput";
    case KVC_POLL_TRANSFERRING: return "Transferring";
    case KVC_POLL_SUCCESS: return "Success";
    }
    return "Unknown";
}

/* ---- addressing ---------------------------------------------------------- */

static kvc_room *stripe_table(kvc_segment *seg, uint32_t s)
{
    return seg->rooms + (size_t)s * seg->hdr->stripe_slots;
}

static uint32_t next_slot(uint32_t i, uint32_t n) { return i + 1 == n ? 0 : i + 1; }

static uint32_t prev_slot(uint32_t i, uint32_t n) { return i == 0 ? n - 1 : i - 1; }

/* Bytes of r an update saves: the head and the participants it has; with
 * its failure record too when the update writes one. */
static size_t room_len_of(uint32_t participants)
{
    uint32_t n = participants <= KVC_ROOM_MAX_PARTICIPANTS ? participants : 0;
    return offsetof(kvc_room, part) + n * sizeof(kvc_room_part);
}

static size_t room_len(const kvc_room *r) { return room_len_of(r->participants); }

static size_t room_len_failure(void) { return offsetof(kvc_room, checked_ms); }

static void cpu_relax(void) { __asm__ __volatile__("" ::: "memory"); }

/* ---- an update: undo record + seqlock window (stripe lock held) --------- */

typedef struct upd {
    kvc_segment *seg;
    uint32_t s;
    kvc_room_stripe *st;
    kvc_room *r;            /* the slot, in the segment */
    size_t len;             /* bytes of it the update saves and rewrites */
    kvc_failure_slot *ring; /* claimed ring entry, or NULL */
    uint64_t ring_n;        /* 1 + its index */
    kvc_room w;             /* the new bytes, made here (private) first */
} upd;

/* Claim the next failure ring entry for stripe s's writer.  The entry's
 * offset goes into the undo record before the claim, so the stripe's
 * recovery can finish an entry its dead writer claimed.  NULL when another
 * writer (1024 appends ago, stopped or dead) still holds the entry: the
 * record is then kept in its room only. */
/* An append that will not be made: uncount it if it is still the last. */
static void give_back(kvc_header *h, kvc_undo *un)
{
    uint64_t n = un->ring_n;
    if (n)
        atomic_compare_exchange_strong(&h->failures_total, &n, n - 1);
    un->ring_n = 0;
}

static kvc_failure_slot *ring_claim(upd *u)
{
    kvc_header *h = u->seg->hdr;
    kvc_undo *un = &u->st->undo;
    un->ring_n = 0;
    uint64_t k = atomic_fetch_add(&h->failures_total, 1);
    un->ring_n = k + 1;
    kvc_failure_slot *f = &u->seg->failures[k % KVC_FAILURE_RING];
    un->ring_off = (uint64_t)((unsigned char *)f - u->seg->base);
    for (int spins = 0; spins < RING_SPINS; spins++) {
        uint64_t c = atomic_load(&f->claim);
        if ((c >> 32) & 1) {
            sched_yield();
            continue;
        }
        uint64_t mine = (((c >> 32) + 1) << 32) | (u->s + 1);
        if (atomic_compare_exchange_strong(&f->claim, &c, mine)) {
            kvc_seq_write_prepare(); /* the claim (odd) before the entry's bytes */
            KVC_INJECT("room.ring_claimed");
            u->ring_n = k + 1;
            return f;
        }
    }
    un->ring_off = 0;
    give_back(h, un);
    return NULL;
}

static void ring_release(kvc_failure_slot *f)
{
    uint64_t c = atomic_load(&f->claim);
    atomic_store_explicit(&f->claim, ((c >> 32) + 1) << 32, memory_order_release);
}

/* Save what the update changes (len bytes of r; the ring entry when
 * with_ring) and mark the undo valid.  Returns the private copy of those
 * bytes the update then changes; upd_commit() copies them into r. */
static kvc_room *upd_begin(upd *u, kvc_segment *seg, uint32_t s, kvc_room *r, size_t len,
                           int with_ring)
{
    u->seg = seg;
    u->s = s;
    u->st = &seg->stripes[s];
    u->r = r;
    u->len = len;
    u->ring = with_ring ? ring_claim(u) : NULL;
    kvc_undo *un = &u->st->undo;
    un->room_off = (uint64_t)((unsigned char *)r - seg->base);
    un->room_len = len;
    /* Word copies (seqlock.h's; under the lock plain copies would do, but
     * gcc makes a variable-length memcpy of these aligned rooms a string
     * instruction that takes longer to start than a room's few words). */
    kvc_seq_load(&u->w, r, len);
    kvc_seq_store(&un->room, &u->w, len);
    if (u->ring)
        memcpy(&un->ring, u->ring, sizeof *u->ring);
    un->rooms_live = u->st->rooms_live;
    atomic_store_explicit(&un->valid, 1, memory_order_release);
    KVC_INJECT("room.undo_saved");
    return &u->w;
}

/* Write the new bytes inside r's seqlock window: seq odd, the bytes (in
 * two halves, so that a crash test can stop a writer between them), the
 * undo cleared (the new bytes are whole), seq even, the ring entry
 * released. */
static void upd_commit(upd *u, uint64_t now_real)
{
    kvc_room *r = u->r;
    unsigned char *dst = (unsigned char *)r + sizeof r->seq;
    const unsigned char *src = (const unsigned char *)&u->w + sizeof r->seq;
    size_t n = u->len - sizeof r->seq;
    size_t half = ((n / 2) & ~(size_t)7) + sizeof r->seq; /* dst + half: word-aligned */
    if (half > n)
        half = n;
    kvc_seq_write_begin(&r->seq);
    KVC_INJECT("room.seq_odd");
    kvc_seq_store(dst, src, half);
    KVC_INJECT("room.half_written");
    kvc_seq_store(dst + half, src + half, n - half);
    KVC_INJECT("room.before_commit");
    atomic_store_explicit(&u->st->undo.valid, 0, memory_order_release);
    KVC_INJECT("room.committed");
    kvc_seq_write_end(&r->seq);
    if (u->ring) {
        ring_release(u->ring);
        u->st->undo.ring_off = 0;
        atomic_fetch_add(&u->seg->hdr->room_epoch, 1);
    }
    atomic_fetch_add(&u->st->epoch, 1);
    /* The header's "updated" is for people: at most one store per ms, so
     * the writers of all stripes do not fight over its cache line. */
    if (now_real > atomic_load_explicit(&u->seg->hdr->updated_ns, memory_order_relaxed) + 1000000)
        atomic_store_explicit(&u->seg->hdr->updated_ns, now_real, memory_order_relaxed);
}

/* Stripe recovery, with the stripe lock held after EOWNERDEAD (or on
 * demand by repair): roll back an interrupted update, finish a ring entry
 * the dead writer claimed, even every seq it left odd, recount the rooms. */
static void stripe_recover(kvc_segment *seg, int id)
{
    if (id < KVC_LOCK_ROOMS || id >= KVC_LOCK_COUNT)
        return;
    uint32_t s = (uint32_t)(id - KVC_LOCK_ROOMS), n = seg->hdr->stripe_slots;
    kvc_room_stripe *st = &seg->stripes[s];
    kvc_undo *u = &st->undo;
    kvc_room *t = stripe_table(seg, s);
    uint64_t lo = (uint64_t)((unsigned char *)t - seg->base), hi = lo + (uint64_t)n * sizeof *t;
    if (atomic_load(&u->valid)) {
        if (u->room_off >= lo && u->room_off < hi && (u->room_off - lo) % sizeof *t == 0 &&
            u->room_len >= sizeof u->room.seq && u->room_len <= sizeof u->room) {
            kvc_room *r = (kvc_room *)(seg->base + u->room_off);
            uint32_t saved = atomic_load(&u->room.seq);
            /* Everything but the seq, which stays odd until the bytes are
             * back (a window of this process's: seqlock.h). */
            atomic_store_explicit(&r->seq, saved | 1, memory_order_relaxed);
            kvc_seq_write_prepare();
            kvc_seq_store((unsigned char *)r + sizeof r->seq,
                          (unsigned char *)&u->room + sizeof r->seq, u->room_len - sizeof r->seq);
            atomic_store_explicit(&r->seq, (saved | 1) + 1, memory_order_release);
        }
        if (u->ring_off) {
            kvc_failure_slot *f = (kvc_failure_slot *)(seg->base + u->ring_off);
            uint64_t c = atomic_load(&f->claim);
            if (((c >> 32) & 1) && (uint32_t)c == s + 1 &&
                atomic_load(&u->ring.claim) == c) { /* saved after our claim */
                kvc_seq_write_prepare();            /* after the (odd) claim, as its writer */
                kvc_seq_store(&f->n, &u->ring.n, sizeof f->n);
                kvc_seq_store(&f->rec, &u->ring.rec, sizeof f->rec);
                give_back(seg->hdr, u);
            }
        }
        atomic_store(&u->valid, 0);
    }
    if (u->ring_off && u->ring_off >= seg->hdr->failures_off &&
        u->ring_off < seg->hdr->failures_off + KVC_FAILURE_RING * sizeof(kvc_failure_slot)) {
        kvc_failure_slot *f = (kvc_failure_slot *)(seg->base + u->ring_off);
        uint64_t c = atomic_load(&f->claim);
        if (((c >> 32) & 1) && (uint32_t)c == s + 1) {
            /* Claimed, and either written and committed (it holds its
             * index) or never written (died before its undo was saved). */
            if (f->n != u->ring_n)
                give_back(seg->hdr, u);
            ring_release(f);
        }
    }
    u->ring_off = 0;
    uint32_t live = 0;
    for (uint32_t i = 0; i < n; i++) {
        uint32_t q = atomic_load(&t[i].seq);
        if (q & 1) /* the writer died after its undo was cleared: bytes complete */
            atomic_store(&t[i].seq, q + 1);
        live += t[i].slot == KVC_SLOT_USED;
    }
    __atomic_store_n(&st->rooms_live, live, __ATOMIC_RELAXED);
    atomic_fetch_add(&st->epoch, 1);
    kvc__futex_wake_all(&st->epoch);
    atomic_fetch_add(&seg->hdr->room_epoch, 1);
    kvc__futex_wake_all(&seg->hdr->room_epoch);
}

void kvc__rooms_register(kvc_segment *seg)
{
    for (int i = 0; i < (int)KVC_ROOM_STRIPES; i++)
        kvc__lock_register(seg, KVC_LOCK_ROOMS + i, stripe_recover);
}

/* ---- locked access ---------------------------------------------------- */

/* One room fewer in stripe s (lock held; read unlocked by rooms_in_use). */
static void stripe_uncount(kvc_segment *seg, uint32_t s)
{
    kvc_room_stripe *st = &seg->stripes[s];
    __atomic_store_n(&st->rooms_live, st->rooms_live - 1, __ATOMIC_RELAXED);
}

static kvc_err lock_stripe(kvc_segment *seg, uint32_t s)
{
    return kvc__lock(seg, KVC_LOCK_ROOMS + (int)s);
}

/* Release stripe s, waking its room waiters when its epoch moved. */
static void unlock_stripe(kvc_segment *seg, uint32_t s, uint32_t epoch_before)
{
    kvc_room_stripe *st = &seg->stripes[s];
    bool changed = atomic_load(&st->epoch) != epoch_before;
    kvc__unlock(seg, KVC_LOCK_ROOMS + (int)s);
    if (changed && atomic_load(&st->waiters))
        kvc__futex_wake_all(&st->epoch);
}

/* Slot of room id in stripe s (lock held), or NULL. */
static kvc_room *find(kvc_segment *seg, uint32_t s, uint64_t h, uint64_t id)
{
    uint32_t n = seg->hdr->stripe_slots, i = kvc__room_home(h, n);
    kvc_room *t = stripe_table(seg, s);
    for (uint32_t k = 0; k < n; k++, i = next_slot(i, n)) {
        if (t[i].slot == KVC_SLOT_FREE)
            return NULL;
        if (t[i].slot == KVC_SLOT_USED && t[i].id == id)
            return &t[i];
    }
    return NULL;
}

kvc_room *kvc__room_find(kvc_segment *seg, uint64_t id)
{
    uint64_t h = kvc__room_hash(id);
    return find(seg, kvc__room_stripe(h), h, id);
}

/* First reusable slot on id's probe path in stripe s (after find failed). */
static kvc_room *find_free(kvc_segment *seg, uint32_t s, uint64_t h)
{
    uint32_t n = seg->hdr->stripe_slots, i = kvc__room_home(h, n);
    kvc_room *t = stripe_table(seg, s);
    for (uint32_t k = 0; k < n; k++, i = next_slot(i, n))
        if (t[i].slot != KVC_SLOT_USED)
            return &t[i];
    return NULL;
}

/* After r became a tombstone: turn tombstones before a free slot back into
 * free slots, each step a single store that leaves every probe's result
 * unchanged (a probe stops at the free slot that follows anyway). */
static void tombs_to_free(kvc_segment *seg, uint32_t s, kvc_room *r)
{
    uint32_t n = seg->hdr->stripe_slots, i = (uint32_t)(r - stripe_table(seg, s));
    kvc_room *t = stripe_table(seg, s);
    if (t[next_slot(i, n)].slot != KVC_SLOT_FREE)
        return;
    for (uint32_t k = 0; k < n && t[i].slot == KVC_SLOT_TOMB; k++) {
        __atomic_store_n(&t[i].slot, KVC_SLOT_FREE, __ATOMIC_RELEASE);
        KVC_INJECT("room.tomb_freed");
        i = prev_slot(i, n);
    }
}

/* ---- room state ------------------------------------------------------- */

kvc_poll kvc__room_state(const kvc_room *r)
{
    if (r->terminal >= 0)
        return (kvc_poll)r->terminal;
    int min = KVC_POLL_SUCCESS;
    for (uint32_t i = 0; i < r->participants && i < KVC_ROOM_MAX_PARTICIPANTS; i++) {
        int s = r->part[i].state < 0 ? KVC_POLL_BOOTSTRAPPING : r->part[i].state;
        if (s < min)
            min = s;
    }
    return (kvc_poll)min;
}

/* Copy at most KVC_REASON_MAX bytes, never cutting a UTF-8 sequence. */
static void copy_reason(char *dst, const char *src)
{
    size_t n = src ? strlen(src) : 0;
    if (n > KVC_REASON_MAX) {
        n = KVC_REASON_MAX;
        while (n > 0 && ((unsigned char)src[n] & 0xC0) == 0x80)
            n--; /* src[n] continues a character: cut before that character */
    }
    if (n)
        memcpy(dst, src, n);
    dst[n] = '\0';
}

/* Inside an update with a ring entry: write the room's failure record
 * (replacing any it had) and its copy in the ring. */
static void put_failure(upd *u, uint32_t origin, int32_t code, const char *reason, int32_t pid,
                        uint64_t time_ns)
{
    kvc_room *r = &u->w;
    kvc_failure_rec *f = &r->failure;
    f->room = r->id;
    f->time_ns = time_ns;
    f->origin_rank = (int32_t)origin;
    f->origin_pid = pid;
    f->code = code;
    copy_reason(f->reason, reason && *reason ? reason : "no reason given");
    KVC_INJECT("room.failure_half");
    r->has_failure = 1;
    r->terminal = KVC_POLL_FAILED;
    r->updated_ns = time_ns;
    r->updated_mono = kvc__seg_mono_coarse_ns();
    if (u->ring) { /* claimed: its seq is odd (ring_claim) */
        kvc_seq_store(&u->ring->n, &u->ring_n, sizeof u->ring->n);
        kvc_seq_store(&u->ring->rec, f, sizeof *f);
    }
}

/* Record the first failure of room r in stripe s (lock held); 1 if kept. */
static int record_failure(kvc_segment *seg, uint32_t s, kvc_room *r, uint32_t origin, int32_t code,
                          const char *reason, int32_t pid)
{
    if (r->has_failure || r->terminal == KVC_POLL_SUCCESS)
        return 0;
    upd u;
    uint64_t now = kvc__now_ns(); /* a failure's time is shown: the precise clock */
    (void)upd_begin(&u, seg, s, r, room_len_failure(), 1);
    put_failure(&u, origin, code, reason, pid, now);
    upd_commit(&u, now);
    return 1;
}

/* What a reader found wrong with a room it read without the lock. */
typedef struct verdict {
    int what; /* 0 nothing, 1 a participant is dead, 2 the TTL passed */
    uint32_t rank;
    int32_t pid;
    uint64_t start;
    int32_t shown_pid; /* pid as people know it (kvc__shown_pid) */
    char how[KVC_HOW_MAX + 1];
} verdict;

/* Fail r (stripe s, lock held) for what v says, if it still holds: the same
 * participant not released, the room not terminal, the TTL still passed. */
static void apply_verdict(kvc_segment *seg, uint32_t s, kvc_room *r, const verdict *v)
{
    if (r->terminal >= 0)
        return;
    char reason[KVC_REASON_MAX + 1];
    if (v->what == 1) {
        const kvc_room_part *p = &r->part[v->rank];
        if (v->rank >= r->participants || p->pid != v->pid || p->start != v->start || p->released)
            return;
        snprintf(reason, sizeof reason, "rank %u (pid %d) %s", v->rank, (int)v->shown_pid, v->how);
        record_failure(seg, s, r, v->rank, ESRCH, reason, 0);
    } else if (v->what == 2) {
        uint64_t ttl_ns = (uint64_t)seg->hdr->room_ttl_ms * 1000000ull;
        if (kvc__seg_mono_coarse_ns() <= r->updated_mono + ttl_ns)
            return;
        snprintf(reason, sizeof reason, "room %llu timed out: no update for %u ms (room TTL)",
                 (unsigned long long)r->id, seg->hdr->room_ttl_ms);
        record_failure(seg, s, r, KVC_ORIGIN_RANK_NONE, ETIMEDOUT, reason, 0); /* no rank's */
    }
}

static void fill_info(const kvc_room *r, int32_t asking, kvc_room_info *out)
{
    memset(out, 0, sizeof *out);
    out->room = r->id;
    out->state = kvc__room_state(r);
    out->participants = r->participants;
    out->opened_ns = r->opened_ns;
    out->updated_ns = r->updated_ns;
    for (uint32_t i = 0; i < KVC_ROOM_MAX_PARTICIPANTS; i++) {
        out->local[i] = i < r->participants ? r->part[i].state : -1;
        out->joined += i < r->participants && r->part[i].pid != 0;
        out->released += i < r->participants && r->part[i].released;
    }
    out->has_failure = (int)r->has_failure;
    if (r->has_failure) {
        const kvc_failure_rec *f = &r->failure;
        out->failure.room = f->room;
        out->failure.origin_rank = (uint32_t)f->origin_rank;
        out->failure.origin_pid = f->origin_pid;
        out->failure.code = f->code;
        out->failure.time_ns = f->time_ns;
        out->failure.is_from_another_rank = f->origin_rank < 0 || asking != f->origin_rank;
        memcpy(out->failure.reason, f->reason, sizeof out->failure.reason);
        out->failure.reason[KVC_REASON_MAX] = '\0';
    }
}

/* ---- lock-free reading -------------------------------------------------- */

/* Wait out an odd seq: spin, then yield; false once a reader should take
 * the lock instead. */
static bool odd_wait(int *spins)
{
    if (++*spins >= ODD_SPINS)
        return false;
    if (*spins < ODD_PAUSES)
        cpu_relax();
    else
        sched_yield();
    return true;
}

/* Copy slot r into *out if it holds room id (seqlock read; parts and the
 * failure record only when it matches).  Returns 1 copied, 0 not this room
 * (*free_slot says whether the probe ends here), -1 a writer is inside. */
static int snap(const kvc_room *r, uint64_t id, kvc_room *out, bool *free_slot)
{
    uint32_t s1 = kvc_seq_read_begin(&r->seq);
    if (s1 & 1)
        return -1;
    kvc_seq_load(out, r, offsetof(kvc_room, part)); /* the head, one cache line */
    bool match = out->slot == KVC_SLOT_USED && out->id == id;
    if (match) {
        uint32_t n = out->participants <= KVC_ROOM_MAX_PARTICIPANTS ? out->participants : 0;
        if (out->has_failure)
            kvc_seq_load(&out->failure, &r->failure, sizeof out->failure);
        kvc_seq_load(out->part, r->part, n * sizeof *r->part);
    }
    if (kvc_seq_read_retry(&r->seq, s1))
        return -1;
    *free_slot = out->slot == KVC_SLOT_FREE;
    return match;
}

/* Read room id (hash h, stripe s) without a lock into *out; *where gets its
 * slot.  KVC_E_BUSY (no message) when a writer stayed inside a slot on the
 * way: the caller reads under the lock. */
static kvc_err read_unlocked(kvc_segment *seg, uint32_t s, uint64_t h, uint64_t id, kvc_room *out,
                             kvc_room **where)
{
    uint32_t n = seg->hdr->stripe_slots, i = kvc__room_home(h, n);
    kvc_room *t = stripe_table(seg, s);
    int spins = 0;
    for (uint32_t k = 0; k < n; k++, i = next_slot(i, n)) {
        bool free_slot = false;
        int got;
        while ((got = snap(&t[i], id, out, &free_slot)) < 0)
            if (!odd_wait(&spins))
                return KVC_E_BUSY;
        if (got) {
            *where = &t[i];
            return KVC_OK;
        }
        if (free_slot)
            break;
    }
    return KVC_E_NOENT;
}

static kvc_err no_room(uint64_t room)
{
    return kvc__fail(KVC_E_NOENT,
                     "no room %llu (never opened, released by all, or "
                     "reclaimed after its TTL)",
                     (unsigned long long)room);
}

/* Liveness of participant i of room copy r (slot in the segment: where)
 * judged outside any lock: 1 alive, 0 dead (v filled).  A participant with
 * a process entry: the watcher's dead mark, else (no watcher beating) its
 * liveness lock (liveness.c), namespace-proof; one without (a handle of
 * role none): /proc.  Either system call at most every
 * KVC__LIVENESS_RECHECK_MS per participant. */
static int participant_alive(kvc_segment *seg, kvc_room *where, const kvc_room *r, uint32_t i,
                             bool watched, uint64_t now_mono, verdict *v)
{
    const kvc_room_part *p = &r->part[i];
    bool entry = p->proc_slot >= 0 && (uint32_t)p->proc_slot < seg->max_procs;
    if (entry) {
        kvc_proc *ps = &seg->procs[p->proc_slot];
        if (atomic_load_explicit(&ps->gen, memory_order_acquire) == p->proc_gen &&
            atomic_load_explicit(&ps->pid, memory_order_acquire) == p->pid) {
            if (atomic_load_explicit(&ps->dead, memory_order_acquire)) {
                snprintf(v->how, sizeof v->how, "%s", ps->how);
                if (atomic_load(&ps->gen) != p->proc_gen)
                    snprintf(v->how, sizeof v->how, "exited (exit status unknown)");
                return 0;
            }
            if (watched)
                return 1;
        }
    }
    _Atomic uint32_t *c = &where->checked_ms[i];
    uint32_t now_ms = (uint32_t)(now_mono / 1000000), last = atomic_load(c);
    if ((uint32_t)(now_ms - last) < KVC__LIVENESS_RECHECK_MS ||
        !atomic_compare_exchange_strong(c, &last, now_ms))
        return 1;
    if (entry) {
        switch (kvc__proc_slot_state(seg, p->proc_slot, p->proc_gen)) {
        case KVC__SLOT_ALIVE: return 1;
        case KVC__SLOT_DEAD:
            /* Its pid means something here only in the same PID namespace
             * (then its zombie, if still there, says how it ended). */
            if (seg->procs[p->proc_slot].pid_ns == seg->pid_ns && seg->pid_ns)
                kvc__proc_how(p->pid, v->how, sizeof v->how);
            else
                snprintf(v->how, sizeof v->how, "died (exit status unknown)");
            return 0;
        case KVC__SLOT_GONE:
            /* Its session ended (last handle closed, or reaped) without
             * releasing the room. */
            snprintf(v->how, sizeof v->how, "left the process table (exit status unknown)");
            return 0;
        }
    }
    if (kvc__proc_alive(p->pid, p->start))
        return 1;
    kvc__proc_how(p->pid, v->how, sizeof v->how);
    return 0;
}

/* What must change in room copy r before it is answered (v->what 0: none). */
static void judge(kvc_segment *seg, kvc_room *where, const kvc_room *r, verdict *v)
{
    v->what = 0;
    if (r->terminal >= 0)
        return;
    const kvc_header *h = seg->hdr;
    uint64_t now = kvc__seg_mono_coarse_ns();
    if (now > r->updated_mono + (uint64_t)h->room_ttl_ms * 1000000ull) {
        v->what = 2;
        return;
    }
    uint64_t beat = atomic_load_explicit(&h->watch_beat_mono, memory_order_acquire);
    bool watched = beat && atomic_load_explicit(&h->watch_pid, memory_order_relaxed) &&
                   now < beat + (uint64_t)KVC__WATCH_STALE_MS * 1000000ull;
    for (uint32_t i = 0; i < r->participants && i < KVC_ROOM_MAX_PARTICIPANTS; i++) {
        const kvc_room_part *p = &r->part[i];
        if (!p->pid || p->released)
            continue;
        if (!participant_alive(seg, where, r, i, watched, now, v)) {
            v->what = 1;
            v->rank = i;
            v->pid = p->pid;
            v->start = p->start;
            v->shown_pid = kvc__shown_pid(seg, p->pid, p->start);
            return;
        }
    }
}

/* ---- creation ----------------------------------------------------------- */

/* The rooms in use: the sum of the stripes' counts (each read unlocked). */
static uint32_t rooms_in_use(kvc_segment *seg)
{
    uint32_t n = 0;
    for (uint32_t s = 0; s < KVC_ROOM_STRIPES; s++)
        n += __atomic_load_n(&seg->stripes[s].rooms_live, __ATOMIC_RELAXED);
    return n;
}

/* Reservations a handle takes from the header at a time: 1 (every room
 * writes rooms_reserved, as before) for small tables, up to 32 for large
 * ones, where a process that dies holding some leaves the count at most
 * 2 x 32 high (high is the safe side: at max rooms the exact count
 * decides). */
static uint32_t credit_batch(const kvc_header *hd)
{
    uint32_t b = hd->max_rooms / 1024;
    return b < 1 ? 1 : b > 32 ? 32 : b;
}

/* Reserve a room for a creation: from seg's credit while the header's
 * count is within max rooms (then the credit is a room the count already
 * holds), else from the header, a batch at a time while that stays within
 * max rooms, else one, with the exact count deciding at max rooms.  False
 * when the table is full. */
static bool reserve_room(kvc_segment *seg)
{
    kvc_header *hd = seg->hdr;
    uint32_t batch = credit_batch(hd);
    uint32_t c = atomic_load_explicit(&seg->room_credit, memory_order_relaxed);
    if (c && atomic_load_explicit(&hd->rooms_reserved, memory_order_relaxed) <= hd->max_rooms)
        while (c)
            if (atomic_compare_exchange_weak_explicit(&seg->room_credit, &c, c - 1,
                                                      memory_order_relaxed, memory_order_relaxed))
                return true;
    if (batch > 1 &&
        atomic_load_explicit(&hd->rooms_reserved, memory_order_relaxed) + batch <= hd->max_rooms) {
        if (atomic_fetch_add(&hd->rooms_reserved, batch) + batch <= hd->max_rooms) {
            atomic_fetch_add_explicit(&seg->room_credit, batch - 1, memory_order_relaxed);
            return true;
        }
        atomic_fetch_sub(&hd->rooms_reserved, batch);
    }
    if (atomic_fetch_add(&hd->rooms_reserved, 1) >= hd->max_rooms &&
        rooms_in_use(seg) >= hd->max_rooms) {
        atomic_fetch_sub(&hd->rooms_reserved, 1);
        return false;
    }
    return true;
}

/* A room reclaimed (or a reservation not used): into seg's credit; past two
 * batches, one batch goes back to the header. */
static void unreserve_room(kvc_segment *seg)
{
    kvc_header *hd = seg->hdr;
    uint32_t batch = credit_batch(hd);
    if (batch == 1) {
        atomic_fetch_sub(&hd->rooms_reserved, 1);
        return;
    }
    uint32_t c = atomic_fetch_add_explicit(&seg->room_credit, 1, memory_order_relaxed) + 1;
    if (c > 2 * batch &&
        atomic_compare_exchange_strong_explicit(&seg->room_credit, &c, c - batch,
                                                memory_order_relaxed, memory_order_relaxed))
        atomic_fetch_sub(&hd->rooms_reserved, batch);
}

void kvc__rooms_return_credit(kvc_segment *seg)
{
    uint32_t c = atomic_exchange(&seg->room_credit, 0);
    if (c)
        atomic_fetch_sub(&seg->hdr->rooms_reserved, c);
}

/* Create room id in stripe s (lock held).  KVC_E_FULL with *swept_hint 1
 * when sweeping the whole table might make room. */
static kvc_err create_room(kvc_segment *seg, uint32_t s, uint64_t h, uint64_t id,
                           uint32_t participants, kvc_room **out)
{
    kvc_header *hd = seg->hdr;
    kvc_room_stripe *st = &seg->stripes[s];
    /* Reserve first (a writer dying after this leaves the reservation
     * high, never low); at max rooms the exact count decides. */
    if (!reserve_room(seg))
        return kvc__fail(KVC_E_FULL,
                         "room table of segment %s is full: %u active rooms (max "
                         "rooms %u); no active room is evicted",
                         seg->name, rooms_in_use(seg), hd->max_rooms);
    kvc_room *r = st->rooms_live + 1 < hd->stripe_slots ? find_free(seg, s, h) : NULL;
    if (!r) {
        unreserve_room(seg);
        return kvc__fail(KVC_E_FULL,
                         "room table stripe %u of segment %s is full (%u rooms hash to it, of "
                         "%u active)",
                         s, seg->name, st->rooms_live, rooms_in_use(seg));
    }
    upd u;
    uint64_t now = kvc__now_coarse_ns();
    /* The head and the participants it will have (rolled back, the slot is
     * free, or a tombstone, again and nobody reads its participants).  Only
     * those participants are initialised (none reads beyond), and the
     * failure record is written when there is one. */
    kvc_room *w = upd_begin(&u, seg, s, r, room_len_of(participants), 0);
    w->id = id;
    w->participants = participants;
    w->terminal = -1;
    w->has_failure = 0;
    w->opened_ns = w->updated_ns = now;
    w->updated_mono = kvc__seg_mono_coarse_ns();
    memset(w->part, 0, participants * sizeof *w->part);
    for (uint32_t p = 0; p < participants; p++) {
        w->part[p].state = -1;
        w->part[p].proc_slot = -1;
    }
    KVC_INJECT("room.creating");
    w->slot = KVC_SLOT_USED;
    __atomic_store_n(&st->rooms_live, st->rooms_live + 1, __ATOMIC_RELAXED);
    upd_commit(&u, now);
    *out = r;
    return KVC_OK;
}

/* Find room (stripe s, lock held), creating it with participants when
 * participants != 0 and it does not exist. */
static kvc_err find_or_create(kvc_segment *seg, uint32_t s, uint64_t h, uint64_t room,
                              uint32_t participants, kvc_room **out)
{
    *out = find(seg, s, h, room);
    if (*out || !participants)
        return *out ? KVC_OK : no_room(room);
    return create_room(seg, s, h, room, participants, out);
}

/* ---- public API --------------------------------------------------------- */

static kvc_err check_participants(const kvc_segment *seg, uint32_t *participants)
{
    if (*participants == 0)
        *participants = seg->hdr->world_size;
    if (*participants > KVC_ROOM_MAX_PARTICIPANTS)
        return kvc__fail(KVC_E_INVAL, "a room has at most %d participants, not %u",
                         KVC_ROOM_MAX_PARTICIPANTS, *participants);
    return KVC_OK;
}

static kvc_err rank_range(uint64_t room, uint32_t rank, uint32_t participants)
{
    return kvc__fail(KVC_E_INVAL, "rank %u out of range for room %llu (participants 0..%u)", rank,
                     (unsigned long long)room, participants - 1);
}

static kvc_err open_locked(kvc_segment *seg, uint32_t s, uint64_t h, uint64_t room, uint32_t asked,
                           uint32_t participants, uint32_t rank, kvc_room_role role)
{
    kvc_room *r = find(seg, s, h, room);
    kvc_err e = KVC_OK;
    if (!r && rank >= participants)
        return rank_range(room, rank, participants);
    if (!r && (e = create_room(seg, s, h, room, participants, &r)))
        return e;
    if (asked != 0 && asked != r->participants)
        return kvc__fail(KVC_E_INVAL, "room %llu has %u participants, not %u",
                         (unsigned long long)room, r->participants, participants);
    if (rank >= r->participants)
        return rank_range(room, rank, r->participants);
    seg->rooms_opened = true;
    kvc_room_part *p = &r->part[rank];
    int32_t slot = seg->proc_slot;
    uint32_t gen = slot >= 0 ? atomic_load(&seg->procs[slot].gen) : 0;
    if (p->pid == seg->pid && p->start == seg->start && p->proc_slot == slot && p->proc_gen == gen)
        return KVC_OK;
    upd u;
    uint64_t now = kvc__now_coarse_ns(), mono = kvc__seg_mono_coarse_ns();
    kvc_room *w = upd_begin(&u, seg, s, r, room_len(r), 0);
    p = &w->part[rank];
    p->pid = seg->pid;
    p->start = seg->start;
    p->role = (uint8_t)role;
    p->released = 0;
    p->proc_slot = slot;
    p->proc_gen = gen;
    w->updated_ns = now;
    w->updated_mono = mono;
    upd_commit(&u, now);
    /* Alive now, by definition: no /proc look for a while. */
    atomic_store_explicit(&r->checked_ms[rank], (uint32_t)(mono / 1000000), memory_order_relaxed);
    return KVC_OK;
}

/* Run op under room's stripe lock; a full table is swept (every stripe,
 * one lock at a time) and op tried once more. */
typedef kvc_err (*locked_op)(kvc_segment *seg, uint32_t s, uint64_t h, void *arg);

static kvc_err with_stripe(kvc_segment *seg, uint64_t room, locked_op op, void *arg)
{
    uint64_t h = kvc__room_hash(room);
    uint32_t s = kvc__room_stripe(h);
    for (int attempt = 0;; attempt++) {
        kvc_err e = lock_stripe(seg, s);
        if (e)
            return e;
        uint32_t ep = atomic_load(&seg->stripes[s].epoch);
        e = op(seg, s, h, arg);
        unlock_stripe(seg, s, ep);
        size_t reclaimed = 0;
        if (e != KVC_E_FULL || attempt > 0 || kvc_room_sweep(seg, &reclaimed) || !reclaimed)
            return e;
    }
}

struct open_arg {
    uint64_t room;
    uint32_t asked, participants, rank;
    kvc_room_role role;
};

static kvc_err open_op(kvc_segment *seg, uint32_t s, uint64_t h, void *arg)
{
    struct open_arg *a = arg;
    return open_locked(seg, s, h, a->room, a->asked, a->participants, a->rank, a->role);
}

KVC_API kvc_err kvc_room_open(kvc_segment *seg, uint64_t room, uint32_t participants, uint32_t rank,
                              kvc_room_role role)
{
    KVC_ARG(seg);
    KVC_ROOM_ARG(room);
    if ((unsigned)role > KVC_ROOM_ROLE_DECODE)
        return kvc__fail(KVC_E_INVAL, "kvc_room_open: role %d out of range 0..2 (kvc_room_role)",
                         (int)role);
    struct open_arg a = {room, participants, participants, rank, role};
    kvc_err e = check_participants(seg, &a.participants);
    return e ? e : with_stripe(seg, room, open_op, &a);
}

/* Find room and check rank is one of its participants (lock held). */
static kvc_err find_participant(kvc_segment *seg, uint32_t s, uint64_t h, uint64_t room,
                                uint32_t rank, kvc_room **out)
{
    kvc_err e = find_or_create(seg, s, h, room, 0, out);
    if (!e && rank >= (*out)->participants)
        e = rank_range(room, rank, (*out)->participants);
    return e;
}

struct state_arg {
    uint64_t room;
    uint32_t rank;
    kvc_poll state;
};

static kvc_err state_op(kvc_segment *seg, uint32_t s, uint64_t h, void *arg)
{
    struct state_arg *a = arg;
    kvc_room *r = NULL;
    kvc_err e = find_participant(seg, s, h, a->room, a->rank, &r);
    if (e || r->terminal >= 0)
        return e;
    /* Failed from a rank records the failure in the same window: no reader
     * ever sees a Failed room without its record. */
    int fails = a->state == KVC_POLL_FAILED && !r->has_failure;
    upd u;
    uint64_t now = kvc__now_coarse_ns();
    kvc_room *w = upd_begin(&u, seg, s, r, fails ? room_len_failure() : room_len(r), fails);
    w->part[a->rank].state = (int8_t)a->state;
    w->updated_ns = now;
    w->updated_mono = kvc__seg_mono_coarse_ns();
    KVC_INJECT("room.state_written");
    if (kvc__room_state(w) == KVC_POLL_SUCCESS)
        w->terminal = KVC_POLL_SUCCESS;
    if (fails) {
        char reason[64];
        snprintf(reason, sizeof reason, "rank %u reported Failed", a->rank);
        put_failure(&u, a->rank, 0, reason, seg->pid, kvc__now_ns());
    }
    upd_commit(&u, now);
    return KVC_OK;
}

KVC_API kvc_err kvc_room_set_state(kvc_segment *seg, uint64_t room, uint32_t rank, kvc_poll state)
{
    KVC_ARG(seg);
    KVC_ROOM_ARG(room);
    if ((unsigned)state > KVC_POLL_SUCCESS)
        return kvc__fail(KVC_E_INVAL, "kvc_room_set_state: KVPoll state %d out of range 0..4",
                         (int)state);
    struct state_arg a = {room, rank, state};
    return with_stripe(seg, room, state_op, &a);
}

KVC_API kvc_err kvc_room_sync(kvc_segment *seg, uint32_t rank, size_t n, const uint64_t *rooms,
                              const kvc_poll *states, kvc_poll *out, size_t *failed_at)
{
    KVC_ARG(seg);
    if (n && (!rooms || !out))
        return kvc__fail(KVC_E_INVAL, "kvc_room_sync: argument %s is NULL",
                         !rooms ? "rooms" : "out");
    for (size_t i = 0; i < n; i++) {
        if (failed_at)
            *failed_at = i;
        KVC_ROOM_ARG(rooms[i]);
        if (states && (unsigned)states[i] > KVC_POLL_SUCCESS)
            return kvc__fail(KVC_E_INVAL, "kvc_room_sync: KVPoll state %d out of range 0..4",
                             (int)states[i]);
    }
    /* Each update under its room's stripe lock; each read without a lock
     * (liveness from the watcher's marks, or /proc rate-limited per
     * participant, as kvc_room_get()). */
    for (size_t i = 0; i < n; i++) {
        if (failed_at)
            *failed_at = i;
        kvc_err e;
        if (states) {
            struct state_arg a = {rooms[i], rank, states[i]};
            if ((e = with_stripe(seg, rooms[i], state_op, &a)))
                return e;
        }
        kvc_room_info ri;
        if ((e = kvc_room_get(seg, rooms[i], (int32_t)rank, &ri)))
            return e;
        if (rank >= ri.participants)
            return rank_range(rooms[i], rank, ri.participants);
        out[i] = ri.state;
    }
    return KVC_OK;
}

struct fail_arg {
    uint64_t room;
    uint32_t origin;
    int32_t code;
    const char *reason;
    uint64_t time_ns; /* adopt: the record's time (0: now) */
    int adopt;
    int result; /* kept / changed */
};

static kvc_err fail_op(kvc_segment *seg, uint32_t s, uint64_t h, void *arg)
{
    struct fail_arg *a = arg;
    kvc_room *r = NULL;
    if (!a->adopt) {
        /* A failure comes from one of the room's participants (the world
         * size of a room this call would create), as a state does.  An
         * adopted record may name a rank of another node: not checked. */
        kvc_room *have = find(seg, s, h, a->room);
        uint32_t n = have ? have->participants : seg->hdr->world_size;
        if (a->origin >= n)
            return rank_range(a->room, a->origin, n);
    }
    kvc_err e = find_or_create(seg, s, h, a->room, seg->hdr->world_size, &r);
    if (e)
        return e;
    if (!a->adopt) {
        a->result = record_failure(seg, s, r, a->origin, a->code, a->reason,
                                   seg->role == KVC_ROLE_DAEMON ? 0 : seg->pid);
        return KVC_OK;
    }
    char want[KVC_REASON_MAX + 1];
    copy_reason(want, a->reason && *a->reason ? a->reason : "no reason given");
    if (r->has_failure && r->failure.origin_rank == (int32_t)a->origin &&
        r->failure.code == a->code && !strcmp(r->failure.reason, want))
        return KVC_OK;
    upd u;
    uint64_t now = kvc__now_coarse_ns();
    (void)upd_begin(&u, seg, s, r, room_len_failure(), 1);
    put_failure(&u, a->origin, a->code, want, 0, a->time_ns ? a->time_ns : kvc__now_ns());
    upd_commit(&u, now);
    a->result = 1;
    return KVC_OK;
}

KVC_API kvc_err kvc_room_fail(kvc_segment *seg, uint64_t room, uint32_t origin_rank, int32_t code,
                              const char *reason, int *kept)
{
    if (kept)
        *kept = 0;
    KVC_ARG(seg);
    KVC_ROOM_ARG(room);
    if (origin_rank >= seg->hdr->max_ranks)
        return kvc__fail(KVC_E_INVAL, "origin rank %u exceeds the segment's max ranks (%u)",
                         origin_rank, seg->hdr->max_ranks);
    struct fail_arg a = {room, origin_rank, code, reason, 0, 0, 0};
    kvc_err e = with_stripe(seg, room, fail_op, &a);
    if (!e && kept)
        *kept = a.result;
    return e;
}

KVC_API kvc_err kvc_room_fail_adopt(kvc_segment *seg, uint64_t room, uint32_t origin_rank,
                                    int32_t code, const char *reason, uint64_t time_ns,
                                    int *changed)
{
    if (changed)
        *changed = 0;
    KVC_ARG(seg);
    KVC_ROOM_ARG(room);
    if (origin_rank >= seg->hdr->max_ranks && origin_rank != KVC_ORIGIN_RANK_NONE)
        return kvc__fail(KVC_E_INVAL, "origin rank %u exceeds the segment's max ranks (%u)",
                         origin_rank, seg->hdr->max_ranks);
    struct fail_arg a = {room, origin_rank, code, reason, time_ns, 1, 0};
    kvc_err e = with_stripe(seg, room, fail_op, &a);
    if (!e && changed)
        *changed = a.result;
    return e;
}

KVC_API uint32_t kvc_room_epoch(kvc_segment *seg)
{
    if (!seg) {
        kvc__fail(KVC_E_INVAL, "kvc_room_epoch: argument seg is NULL");
        return 0;
    }
    return atomic_load_explicit(&seg->hdr->room_epoch, memory_order_acquire);
}

KVC_API kvc_err kvc_room_wait_change(kvc_segment *seg, uint32_t seen, uint32_t timeout_ms)
{
    KVC_ARG(seg);
    return kvc__epoch_wait(&seg->hdr->room_epoch, seen, timeout_ms, "rooms");
}

struct get_arg {
    uint64_t room;
    int32_t asking;
    const verdict *v;
    kvc_room_info *out;
};

/* The reader's slow path: under the stripe lock, apply what it found (a
 * dead participant, a TTL passed) and read the room. */
static kvc_err get_op(kvc_segment *seg, uint32_t s, uint64_t h, void *arg)
{
    struct get_arg *a = arg;
    kvc_room *r = NULL;
    kvc_err e = find_or_create(seg, s, h, a->room, 0, &r);
    if (e)
        return e;
    if (a->v)
        apply_verdict(seg, s, r, a->v);
    fill_info(r, a->asking, a->out);
    return KVC_OK;
}

KVC_API kvc_err kvc_room_get(kvc_segment *seg, uint64_t room, int32_t asking_rank,
                             kvc_room_info *out)
{
    KVC_ARG(seg);
    KVC_ARG(out);
    KVC_ROOM_ARG(room);
    uint64_t h = kvc__room_hash(room);
    uint32_t s = kvc__room_stripe(h);
    kvc_room copy, *where = NULL;
    struct get_arg a = {room, asking_rank, NULL, out};
    kvc_err e = kvc__seg_current(seg, KVC__FILE_CHECK_READ_MS);
    if (e)
        return e;
    e = read_unlocked(seg, s, h, room, &copy, &where);
    if (e == KVC_E_NOENT)
        return no_room(room);
    if (e) /* a writer stayed inside: the lock waits for it, or recovers it */
        return with_stripe(seg, room, get_op, &a);
    verdict v;
    judge(seg, where, &copy, &v);
    if (v.what) {
        a.v = &v;
        return with_stripe(seg, room, get_op, &a);
    }
    fill_info(&copy, asking_rank, out);
    return KVC_OK;
}

KVC_API kvc_err kvc_room_wait(kvc_segment *seg, uint64_t room, int32_t asking_rank, kvc_poll known,
                              uint32_t timeout_ms, kvc_room_info *out)
{
    KVC_ARG(seg);
    KVC_ARG(out);
    KVC_ROOM_ARG(room);
    if ((unsigned)known > KVC_POLL_SUCCESS)
        return kvc__fail(KVC_E_INVAL, "kvc_room_wait: known state %d out of range 0..4",
                         (int)known);
    kvc_room_stripe *st = &seg->stripes[kvc__room_stripe(kvc__room_hash(room))];
    uint64_t deadline = kvc__mono_ns() + (uint64_t)timeout_ms * 1000000ull;
    for (;;) {
        uint32_t ep = atomic_load(&st->epoch);
        kvc_err e = kvc_room_get(seg, room, asking_rank, out);
        if (e || out->state != known || out->has_failure)
            return e;
        uint64_t now = kvc__mono_ns();
        if (now >= deadline)
            return kvc__fail(KVC_E_TIMEDOUT, "room %llu still %s after %u ms",
                             (unsigned long long)room, kvc_poll_name(known), timeout_ms);
        uint64_t left = (deadline - now + 999999) / 1000000;
        /* Counted as a waiter before the epoch is looked at again: a writer
         * either sees the count and wakes, or moved the epoch first. */
        atomic_fetch_add(&st->waiters, 1);
        if (atomic_load(&st->epoch) == ep)
            kvc__futex_wait(&st->epoch, ep,
                            (uint32_t)(left < LIVENESS_SLICE_MS ? left : LIVENESS_SLICE_MS));
        atomic_fetch_sub(&st->waiters, 1);
    }
}

KVC_API int kvc_failure_text(const kvc_failure_info *f, char *buf, size_t cap)
{
    if (!buf)
        cap = 0; /* snprintf(NULL, 0, ...) only measures */
    if (!f)
        return snprintf(buf, cap, "no failure record");
    char code[48] = "";
    if (f->code)
        snprintf(code, sizeof code, "; code %d", (int)f->code);
    if (f->origin_rank == KVC_ORIGIN_RANK_NONE)
        return snprintf(buf, cap,
                        "KV transfer of room %llu failed (timed out, no rank recorded it%s): %s",
                        (unsigned long long)f->room, code, f->reason);
    return snprintf(buf, cap, "KV transfer of room %llu failed on rank %u (%s%s): %s",
                    (unsigned long long)f->room, f->origin_rank,
                    f->is_from_another_rank ? "another rank" : "this rank", code, f->reason);
}

struct release_arg {
    uint64_t room;
    uint32_t rank;
    int deleted;
};

static kvc_err release_op(kvc_segment *seg, uint32_t s, uint64_t h, void *arg)
{
    struct release_arg *a = arg;
    kvc_room *r = NULL;
    kvc_err e = find_participant(seg, s, h, a->room, a->rank, &r);
    if (e)
        return e;
    uint32_t released = 0;
    for (uint32_t i = 0; i < r->participants; i++)
        released += r->part[i].released || i == a->rank;
    upd u;
    uint64_t now = kvc__now_coarse_ns();
    kvc_room *w = upd_begin(&u, seg, s, r, room_len(r), 0);
    w->part[a->rank].released = 1;
    w->updated_ns = now;
    w->updated_mono = kvc__seg_mono_coarse_ns();
    if (released == r->participants) { /* the last one out reclaims it */
        w->slot = KVC_SLOT_TOMB;
        stripe_uncount(seg, s);
        a->deleted = 1;
    }
    upd_commit(&u, now);
    if (a->deleted) {
        tombs_to_free(seg, s, r);
        unreserve_room(seg);
    }
    return KVC_OK;
}

KVC_API kvc_err kvc_room_release(kvc_segment *seg, uint64_t room, uint32_t rank)
{
    KVC_ARG(seg);
    KVC_ROOM_ARG(room);
    struct release_arg a = {room, rank, 0};
    return with_stripe(seg, room, release_op, &a);
}

/* Sweep stripe s (lock held): fail and reclaim rooms idle past the TTL. */
static void sweep_stripe(kvc_segment *seg, uint32_t s, size_t *reclaimed)
{
    uint64_t ttl_ns = (uint64_t)seg->hdr->room_ttl_ms * 1000000ull;
    kvc_room *t = stripe_table(seg, s);
    for (uint32_t i = 0; i < seg->hdr->stripe_slots; i++) {
        kvc_room *r = &t[i];
        if (r->slot != KVC_SLOT_USED || kvc__seg_mono_coarse_ns() <= r->updated_mono + ttl_ns)
            continue;
        verdict v = {.what = 2};
        apply_verdict(seg, s, r, &v); /* records the timeout if not terminal */
        upd u;
        uint64_t now = kvc__now_coarse_ns();
        upd_begin(&u, seg, s, r, offsetof(kvc_room, part), 0)->slot = KVC_SLOT_TOMB;
        stripe_uncount(seg, s);
        upd_commit(&u, now);
        tombs_to_free(seg, s, r);
        unreserve_room(seg);
        if (reclaimed)
            (*reclaimed)++;
    }
}

KVC_API kvc_err kvc_room_sweep(kvc_segment *seg, size_t *reclaimed)
{
    if (reclaimed)
        *reclaimed = 0;
    KVC_ARG(seg);
    for (uint32_t s = 0; s < KVC_ROOM_STRIPES; s++) {
        kvc_err e = lock_stripe(seg, s);
        if (e)
            return e;
        uint32_t ep = atomic_load(&seg->stripes[s].epoch);
        sweep_stripe(seg, s, reclaimed);
        unlock_stripe(seg, s, ep);
    }
    return KVC_OK;
}

/* Copy global slot i whole under its seqlock, or under its stripe's lock
 * when a writer stays inside.  Returns 1 when it holds a room. */
static int read_slot(kvc_segment *seg, uint32_t i, kvc_room *out, kvc_err *err)
{
    const kvc_room *r = &seg->rooms[i];
    int spins = 0;
    for (;;) {
        uint32_t s1 = kvc_seq_read_begin(&r->seq);
        if (!(s1 & 1)) {
            kvc_seq_load(out, r, offsetof(kvc_room, part));
            if (out->slot == KVC_SLOT_USED) {
                uint32_t n = out->participants <= KVC_ROOM_MAX_PARTICIPANTS ? out->participants : 0;
                kvc_seq_load(out->part, r->part, n * sizeof *r->part);
                if (out->has_failure)
                    kvc_seq_load(&out->failure, &r->failure, sizeof out->failure);
            }
            if (!kvc_seq_read_retry(&r->seq, s1))
                return out->slot == KVC_SLOT_USED;
            continue;
        }
        if (odd_wait(&spins))
            continue;
        uint32_t s = i / seg->hdr->stripe_slots;
        if ((*err = lock_stripe(seg, s)))
            return 0;
        /* No writer now: plain reads (checked_ms, outside the seqlock and
         * written by lock-free readers, is not copied). */
        memcpy(out, r, offsetof(kvc_room, checked_ms));
        kvc__unlock(seg, KVC_LOCK_ROOMS + (int)s);
        return out->slot == KVC_SLOT_USED;
    }
}

KVC_API kvc_err kvc_room_list(kvc_segment *seg, int state_filter, kvc_room_info *out, size_t cap,
                              size_t *count)
{
    KVC_ARG(seg);
    KVC_ARG(count);
    if (cap)
        KVC_ARG(out);
    if (state_filter < -1 || state_filter > KVC_POLL_SUCCESS)
        return kvc__fail(KVC_E_INVAL, "kvc_room_list: state_filter %d out of range -1..4",
                         state_filter);
    size_t n = 0;
    kvc_room r;
    for (uint32_t i = 0; i < seg->hdr->room_slots; i++) {
        /* Most slots are free: look at the slot word before copying. */
        if (__atomic_load_n(&seg->rooms[i].slot, __ATOMIC_RELAXED) != KVC_SLOT_USED &&
            !(atomic_load_explicit(&seg->rooms[i].seq, memory_order_relaxed) & 1))
            continue;
        kvc_err e = KVC_OK;
        int used = read_slot(seg, i, &r, &e);
        if (e)
            return e;
        if (!used || (state_filter >= 0 && (int)kvc__room_state(&r) != state_filter))
            continue;
        if (n < cap)
            fill_info(&r, -1, &out[n]);
        n++;
    }
    *count = n;
    return KVC_OK;
}

/* Copy ring entry k (0-based index of the append) under its claim word;
 * false when it holds another record (rolled back, or overwritten) or stays
 * claimed by a writer that does not finish. */
static bool ring_read(kvc_segment *seg, uint64_t k, kvc_failure_rec *out)
{
    const kvc_failure_slot *f = &seg->failures[k % KVC_FAILURE_RING];
    for (int spins = 0; spins < RING_SPINS; spins++) {
        uint64_t c1 = kvc_seq_read_begin(&f->claim); /* its seq: the top half */
        if ((c1 >> 32) & 1) {
            sched_yield();
            continue;
        }
        uint64_t n;
        kvc_seq_load(&n, &f->n, sizeof n);
        kvc_seq_load(out, &f->rec, sizeof *out);
        if (kvc_seq_read_retry(&f->claim, c1))
            continue;
        out->reason[KVC_REASON_MAX] = '\0';
        return n == k + 1;
    }
    return false;
}

KVC_API kvc_err kvc_failures_recent(kvc_segment *seg, kvc_failure_info *out, size_t cap,
                                    size_t *count)
{
    KVC_ARG(seg);
    KVC_ARG(count);
    if (cap)
        KVC_ARG(out);
    uint64_t total = atomic_load(&seg->hdr->failures_total);
    size_t n = 0;
    for (uint64_t k = total; k > 0 && n < cap && total - k < KVC_FAILURE_RING; k--) {
        kvc_failure_rec f;
        if (!ring_read(seg, k - 1, &f))
            continue;
        kvc_failure_info *o = &out[n++];
        memset(o, 0, sizeof *o);
        o->room = f.room;
        o->origin_rank = (uint32_t)f.origin_rank;
        o->origin_pid = f.origin_pid;
        o->code = f.code;
        o->time_ns = f.time_ns;
        o->is_from_another_rank = 1;
        memcpy(o->reason, f.reason, sizeof o->reason);
    }
    *count = n;
    return KVC_OK;
}

kvc_err kvc__rooms_fail_proc(kvc_segment *seg, int32_t pid, uint64_t start, const char *how,
                             size_t *failed)
{
    uint32_t n = seg->hdr->stripe_slots;
    int32_t shown = kvc__shown_pid(seg, pid, start);
    for (uint32_t s = 0; s < KVC_ROOM_STRIPES; s++) {
        kvc_err e = lock_stripe(seg, s);
        if (e)
            return e;
        uint32_t ep = atomic_load(&seg->stripes[s].epoch);
        kvc_room *t = stripe_table(seg, s);
        for (uint32_t i = 0; i < n; i++) {
            kvc_room *r = &t[i];
            if (r->slot != KVC_SLOT_USED || r->terminal >= 0)
                continue;
            for (uint32_t p = 0; p < r->participants && p < KVC_ROOM_MAX_PARTICIPANTS; p++) {
                if (r->part[p].pid != pid || (start && r->part[p].start != start) ||
                    r->part[p].released)
                    continue;
                char reason[KVC_REASON_MAX + 1];
                snprintf(reason, sizeof reason, "rank %u (pid %d) %s", p, (int)shown, how);
                if (record_failure(seg, s, r, p, ESRCH, reason, 0) && failed)
                    (*failed)++;
                break;
            }
        }
        unlock_stripe(seg, s, ep);
    }
    return KVC_OK;
}
