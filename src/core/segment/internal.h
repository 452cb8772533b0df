/*
 * internal.h - what the library's files share and nothing else may use.
 *
 * src/core/ is one folder per concern: segment/ (this header, layout.h,
 * seqlock.h: the segment, its robust locks, the info arena, the process
 * table, sessions, liveness, errors), ranks/, rooms/, collective/ and pd/,
 * each with one internal header that says its lock rule, and each
 * including this one.
 *
 * Lock rule: every table owns its robust lock(s) (layout.h, enum
 * kvc_lock_id), taken through kvc__lock() only, and registers the lock's
 * recovery (kvc__lock_register); a recovery never takes another lock.  The
 * arena is written under the rank lock, the process table under the procs
 * lock; session.c, the one file that calls into several tables, takes their
 * locks one after the other.
 */
#ifndef KVC_INTERNAL_H
#define KVC_INTERNAL_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "clock.h"
#include "kvcoord/kvcoord.h"
#include "layout.h"

#if defined(KVC_BUILDING_LIB)
#define KVC_API __attribute__((visibility("default")))
#else
#define KVC_API
#endif

/* A table's repair of what a lock owner that died may have half-written,
 * run with lock id held (after EOWNERDEAD, before the mutex is marked
 * consistent; or on demand through kvc__lock_recover).  Must only
 * recompute or roll back: never fails, never takes another lock. */
typedef void (*kvc_recover_fn)(kvc_segment *seg, int id);

/* Entries of kvc_segment.seen_alive (liveness.c). */
#define KVC__SEEN_ALIVE_SLOTS 256

struct kvc_segment {
    char name[KVC_NAME_MAX + 1];
    int fd;
    unsigned char *base;
    size_t size;
    kvc_header *hdr;
    kvc_rank_entry *ranks;
    kvc_proc *procs;
    kvc_room_stripe *stripes;
    kvc_room *rooms;
    _Atomic uint64_t *room_index; /* the stripes' room index entries (layout.h) */
    kvc_failure_slot *failures;
    kvc_coll_group *coll; /* KVC_COLL_GROUPS collective groups (collective.c) */
    kvc_pd_region *pd;
    _Atomic uint64_t *bitmap;
    unsigned char *arena;
    int32_t proc_slot; /* our process table entry, -1 if none */
    uint32_t proc_gen; /* its gen when we attached */
    int32_t pid;
    /* Set in a fork() child (session.c's atfork handler): the handle is its
     * parent's (pid above), told without a getpid() system call. */
    _Atomic bool forked;
    uint64_t start; /* our start time, ticks since the host's boot */
    int32_t shown_pid;
    uint64_t pid_ns, time_ns;    /* namespace inodes (kvc__self_identity) */
    uint32_t max_procs;          /* the header's, as validated at attach */
    uint64_t file_ino, file_dev; /* the segment file's (fstat at mapping) */
    /* CLOCK_MONOTONIC ms of the last look at the file (kvc__seg_current),
     * and whether it found the file gone (sticky) */
    _Atomic uint64_t file_checked_ms;
    _Atomic bool stale;
    uint32_t lock_timeout_ms;
    kvc_role role;
    /* A room was opened through this handle (set by rooms.c, read by
     * kvc_close in session.c: the last close fails unreleased rooms). */
    bool rooms_opened;
    /* Room reservations this handle holds ahead of need (rooms_table.c): taken
     * from the header's rooms_reserved in batches so that the processes
     * creating and releasing rooms do not each write that one shared line
     * twice per room; given back by kvc_close (session.c). */
    _Atomic uint32_t room_credit;
    /* Notes in the process table the rank this handle's process registered
     * and so serves: set by kvc_open (session.c) for a worker, called by
     * ranks.c after a registration; NULL for other roles.  ranks.c thus
     * names nothing of procs.c. */
    void (*serves_rank)(kvc_segment *seg, int32_t rank);
    /* Each lock's recovery, registered by the table that owns the lock
     * (kvc__lock_register); see lock.c. */
    kvc_recover_fn recover[KVC_LOCK_COUNT];
    /* The liveness locks this handle found held lately (liveness.c,
     * kvc__proc_seen_alive): one test per process and
     * KVC__LIVENESS_RECHECK_MS for all the rooms it joined. */
    _Atomic uint64_t seen_alive[KVC__SEEN_ALIVE_SLOTS];
};

/* errors.c: set the calling thread's last error message; returns err. */
kvc_err kvc__fail(kvc_err err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Refuse a NULL pointer argument of the calling public function: return
 * KVC_E_INVAL with a message naming the function and the argument
 * ("kvc_room_get: argument out is NULL"). */
#define KVC_ARG(p)                                                                  \
    do {                                                                            \
        if (!(p))                                                                   \
            return kvc__fail(KVC_E_INVAL, "%s: argument %s is NULL", __func__, #p); \
    } while (0)

/* Refuse a room id outside 0..KVC_ROOM_ID_MAX (the one range of room ids on
 * every interface: library, HTTP, kvcoord-diag). */
#define KVC_ROOM_ARG(room)                                                                    \
    do {                                                                                      \
        if ((room) > KVC_ROOM_ID_MAX)                                                         \
            return kvc__fail(KVC_E_INVAL, "%s: room id %llu out of range 0..%llu (2^63 - 1)", \
                             __func__, (unsigned long long)(room),                            \
                             (unsigned long long)KVC_ROOM_ID_MAX);                            \
    } while (0)

/* sysutil.c (clocks: clock.h) */
uint64_t kvc__proc_start(int32_t pid); /* ticks since boot; 0 if no such process */
/* Alive: the pid exists with that start time (0: any) and is not a zombie. */
bool kvc__proc_alive(int32_t pid, uint64_t start);
/* How dead process (pid, start; start 0: any) ended, into buf: from its
 * zombie's exit code when it is still a zombie, else
 * kvc_exit_unknown_text(start). */
void kvc__proc_how(int32_t pid, uint64_t start, char *buf, size_t cap);
/* This process's start time (/proc/self/stat: right in a PID namespace
 * that shares the host's /proc, where /proc/<getpid()> is another
 * process), clock ticks since boot on the host's clock; 0 if unreadable. */
uint64_t kvc__proc_start_self(void);
/* Shared (not private) futex wait on word while it equals val, up to
 * timeout_ms; returns 0 when woken or the value differs, ETIMEDOUT, EINTR. */
int kvc__futex_wait(_Atomic uint32_t *word, uint32_t val, uint32_t timeout_ms);
void kvc__futex_wake_all(_Atomic uint32_t *word);
/* The kvc_*_wait_change() loop of every table: return KVC_OK once *epoch
 * differs from seen, sleeping on it (shared futex) up to timeout_ms of
 * CLOCK_MONOTONIC; KVC_E_TIMEDOUT "<what> unchanged after N ms" after. */
kvc_err kvc__epoch_wait(_Atomic uint32_t *epoch, uint32_t seen, uint32_t timeout_ms,
                        const char *what);

/* Invariants checked in debug builds (LMDB's mdb_cassert, Linux's
 * lockdep_assert_held): with KVC_ASSERTS defined (CMake's Debug build and
 * KVCOORD_SANITIZE builds, src/core/CMakeLists.txt) a false one aborts,
 * naming its text, file and line; otherwise it compiles to nothing and its
 * argument is not evaluated. */
#ifdef KVC_ASSERTS
#define kvc__assert(c) ((c) ? (void)0 : kvc__assert_fail(#c, __FILE__, __LINE__))
#else
#define kvc__assert(c) ((void)0)
#endif
_Noreturn void kvc__assert_fail(const char *what, const char *file, int line);
/* lock.c: lock id is held by this process (the owner mark kvc__lock sets).
 * For kvc__assert only: another process's lock may change meanwhile. */
bool kvc__lock_held(kvc_segment *seg, int id);

/* A busy-wait's pause between two looks at a shared word: PAUSE on x86,
 * YIELD on arm64 (each tells the core a spin is under way, sparing the
 * sibling thread and the memory order machinery), else a compiler barrier. */
static inline void kvc__spin_pause(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield" ::: "memory");
#else
    __asm__ __volatile__("" ::: "memory");
#endif
}

/* lock.c: take lock id, recovering a dead owner's state (the recovery
 * registered for that lock) before marking the mutex consistent.  Bounded
 * by the segment's lock timeout.  Errors: KVC_E_BUSY, KVC_E_NOTRECOVERABLE,
 * KVC_E_SYS. */
kvc_err kvc__lock(kvc_segment *seg, int id);
/* lock.c: kvc__lock, but a lock found held is first watched for up to
 * spins pauses (re-tried whenever its owner mark clears) before the timed
 * wait sleeps on it: for locks held well under the cost of a futex sleep
 * and wake (the room stripes). */
kvc_err kvc__lock_spin(kvc_segment *seg, int id, int spins);
void kvc__unlock(kvc_segment *seg, int id);
/* lock.c: lock id's mutex in the segment (header locks, then room stripes). */
kvc_lock *kvc__lock_ptr(kvc_segment *seg, int id);
/* lock.c: the name of lock id (enum kvc_lock_id, layout.h): "ranks",
 * "procs", "rooms.0" .. "rooms.63" (the room stripes), "pd"; "unknown" for
 * any other id.  The one name of each lock, in every message and diagnostic
 * that names one (the core's errors, inspect's report).  Static storage;
 * any thread. */
const char *kvc__lock_name(int id);
/* lock.c: register fn as lock id's recovery on seg.  lock.c knows no table:
 * each table registers its own (kvc__ranks_register, ...), and kvc_open has
 * every table register before any lock of the handle is taken. */
void kvc__lock_register(kvc_segment *seg, int id, kvc_recover_fn fn);
/* lock.c: run lock id's registered recovery now (caller holds lock id).
 * Used by repair: every recovery is safe to run at any time under its lock. */
void kvc__lock_recover(kvc_segment *seg, int id);
/* Each table registers the recovery of the lock it owns on seg. */
void kvc__ranks_register(kvc_segment *seg);
void kvc__procs_register(kvc_segment *seg);
void kvc__rooms_register(kvc_segment *seg);
void kvc__pd_register(kvc_segment *seg);
/* The room table's hash (splitmix64's finaliser): a room lives in stripe
 * kvc__room_stripe(h) on the linear probe path inside that stripe starting
 * at kvc__room_home(h, stripe_slots), h = kvc__room_hash(id).  Room ids are
 * random, but the table does not rely on it. */
static inline uint64_t kvc__room_hash(uint64_t x)
{
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static inline uint32_t kvc__room_stripe(uint64_t h)
{
    return (uint32_t)(h >> (64 - KVC_ROOM_STRIPE_BITS));
}
static inline uint32_t kvc__room_home(uint64_t h, uint32_t stripe_slots)
{
    return (uint32_t)(((h & 0xffffffffull) * stripe_slots) >> 32);
}

/* The tag a room's index entry carries (layout.h): bits of the hash
 * besides the stripe's, so that a probe reads only the rooms it may want. */
static inline uint32_t kvc__ix_tag(uint64_t h) { return (uint32_t)(h >> 26); }

/* With no process watcher beating, a reader of a room looks a participant
 * up in /proc at most this often (outside any lock). */
#define KVC__LIVENESS_RECHECK_MS 100
/* A watcher's beat older than this is not trusted (it beats every
 * KVC_PROC_WATCH_BEAT_MS): the bound, after a watcher's death, on the time
 * readers keep trusting dead marks it no longer sets. */
#define KVC__WATCH_STALE_MS KVC_PROC_WATCH_STALE_MS

/* liveness.c (see its comment): the process table's liveness locks and
 * the namespace-free monotonic clock of every stamp kept in the segment. */
typedef enum kvc_slot_state {
    KVC__SLOT_GONE = 0,  /* the slot is free or given to another process since (gen moved):
                            the process left the table (closed, or was reaped) */
    KVC__SLOT_DEAD = 1,  /* still in the table with that gen, its liveness lock free: died */
    KVC__SLOT_ALIVE = 2, /* in the table with that gen, its lock held */
} kvc_slot_state;
/* The state of process-table slot `slot` for a process recorded with the
 * slot's gen `gen` (kvc_proc.gen, e.g. a room participant's proc_gen).
 * One fcntl(F_OFD_GETLK) on seg's descriptor; no lock, no /proc; right in
 * every PID and time namespace.  Any thread. */
kvc_slot_state kvc__proc_slot_state(kvc_segment *seg, int32_t slot, uint32_t gen);
/* Whether this handle found the liveness lock of (slot, gen) held (a
 * kvc__proc_slot_state answering ALIVE, which notes it) at or after
 * ms now_ms - KVC__LIVENESS_RECHECK_MS (kvc__seg_mono_coarse_ns): a room reader
 * trusts it instead of testing again, so that the participants of many
 * rooms cost one test per process and period.  No system call; any
 * thread. */
bool kvc__proc_seen_alive(kvc_segment *seg, int32_t slot, uint32_t gen, uint32_t now_ms);
/* Whether the liveness lock of slot is held by anyone (true when it
 * cannot be told). */
bool kvc__liveness_held(kvc_segment *seg, int32_t slot);
/* Alive as far as the process table can tell (the liveness lock of the
 * entry recorded for (pid, start)), else from /proc. */
bool kvc__pid_alive_in(kvc_segment *seg, int32_t pid, uint64_t start);
/* Take slot's liveness lock on a new descriptor of its own (*holder).
 * KVC_E_BUSY (no message): another description holds it; KVC_E_SYS. */
kvc_err kvc__liveness_hold(kvc_segment *seg, int32_t slot, int *holder);
/* Release slot's lock and close holder (only if holder is a descriptor of
 * the segment's file). */
void kvc__liveness_release(kvc_segment *seg, int32_t slot, int holder);
/* In a fork child of process parent: close its copy of the holder of
 * slot (parent's entry, when seg is a handle parent opened) without
 * unlocking. */
void kvc__liveness_forget_child(kvc_segment *seg, int32_t slot, int32_t parent);
/* This process's pid as its /proc shows it (NSpid, else getpid()) and the
 * inodes of its PID and time namespaces (0 when unknown). */
void kvc__self_identity(int32_t *shown_pid, uint64_t *pid_ns, uint64_t *time_ns);
/* This process's time namespace offsets (0 outside one): CLOCK_MONOTONIC
 * in ns, CLOCK_BOOTTIME in clock ticks. */
int64_t kvc__mono_offset_ns(void);
int64_t kvc__boot_offset_ticks(void);
/* CLOCK_MONOTONIC(_COARSE) of the host (this process's time namespace
 * offset removed): the clock of every monotonic stamp in the segment. */
uint64_t kvc__seg_mono_ns(void);
uint64_t kvc__seg_mono_coarse_ns(void);

/* segment.c: KVC_OK while seg's file is the one served under its name;
 * KVC_E_STALE (message) once it was discarded (kvc_open FRESH_FORCE,
 * kvc_unlink: the header's flag, an atomic load, always looked at),
 * unlinked, replaced or re-created (the file's link count: one fstat,
 * every call when every_ms is 0, else at most every every_ms per handle;
 * once seen, every later call fails). */
#define KVC__FILE_CHECK_READ_MS 100 /* lookups, room reads */
#define KVC__FILE_CHECK_WRITE_MS 10 /* room updates */
kvc_err kvc__seg_current(kvc_segment *seg, uint32_t every_ms);

/* segment.c: map seg (name, pid, start, lock timeout set) as opts->mode
 * says: attach, create or fresh.  The errors of kvc_open(). */
kvc_err kvc__segment_map(kvc_segment *seg, const kvc_options *opts);
/* segment.c: unmap, close and free a handle, with no session teardown (that
 * is kvc_close's, in session.c).  NULL is ignored. */
void kvc__segment_free(kvc_segment *seg);

/* rooms_table.c: give the header back the room reservations seg holds ahead of
 * need (kvc_close). */
void kvc__rooms_return_credit(kvc_segment *seg);
/* rooms_liveness.c: fail every non-terminal room pid participates in (own lock). */
kvc_err kvc__rooms_fail_proc(kvc_segment *seg, int32_t pid, uint64_t start, const char *how,
                             size_t *failed);
/* ranks.c: withdraw the worker-owned ranks registered by (pid, start). */
kvc_err kvc__ranks_withdraw_proc(kvc_segment *seg, int32_t pid, uint64_t start,
                                 const char *note_how, size_t *withdrawn);

/* ranks.c, ranks_read.c: the entries behind the rank table (table 0) and
 * the role and parallelism tables (layout.h), for roles.c.  kvc__entry_register()
 * validates json as an object unless `validated` (then `entries` is taken
 * as given); a parallelism table's entry has no session_id. */
kvc_err kvc__entry_lookup(kvc_segment *seg, unsigned table, uint32_t rank, kvc_rank_info *out);
kvc_err kvc__entry_register(kvc_segment *seg, unsigned table, uint32_t rank, const char *session_id,
                            const char *json, size_t len, int validated, uint32_t entries,
                            uint64_t *gen_out);
kvc_err kvc__entry_withdraw(kvc_segment *seg, unsigned table, uint32_t rank, const char *note);
/* The mirror writes (kvc_rank_register_mirror, kvc_rank_withdraw_mirror)
 * and the listing (kvc_rank_list) of any table; seg is not NULL. */
kvc_err kvc__entry_register_mirror(kvc_segment *seg, unsigned table, uint32_t rank,
                                   const char *session_id, const char *json, size_t len,
                                   const char *origin, uint64_t origin_generation,
                                   uint64_t expect_generation, uint64_t *gen_out);
kvc_err kvc__entry_withdraw_mirror(kvc_segment *seg, unsigned table, uint32_t rank,
                                   const char *note, uint64_t expect_generation);
kvc_err kvc__entry_list(kvc_segment *seg, unsigned table, kvc_rank_info *out, size_t cap,
                        size_t *count, int include_withdrawn);

/* ranks.c: the seqlock read of a rank entry, the one rule for lookups and
 * for inspect.  Copies e's published (active) descriptor into *sl, the
 * sequence read first into *seq and, when active is not NULL, the active
 * index into *active.  Returns 0 when the copy is one whole published
 * value; 1 when the sequence is odd (a writer is inside its publish window:
 * with active NULL nothing is copied, else *sl holds what is there now, for
 * diagnostics); -1 when the entry moved during the copy (retry).  Lock-free,
 * never blocks. */
int kvc__rank_snapshot(kvc_rank_entry *e, kvc_rank_slot *sl, uint64_t *seq, uint32_t *active);

/* rooms_table.c: the rooms' two rules, for the library and for inspect's check.
 * kvc__room_state: a room's KVPoll state (its terminal state once it has
 * one, else the minimum over its participants, Bootstrapping for one that
 * has not reported).  kvc__room_find: the slot room id's probe finds in its
 * stripe, or NULL (under the stripe's lock, or on a table nobody writes:
 * a dead owner's, for inspect). */
kvc_poll kvc__room_state(const kvc_room *r);
kvc_room *kvc__room_find(kvc_segment *seg, uint64_t id);
/* rooms_read.c, for kvc_poll_allreduce: whether kvcoord itself failed room
 * (judged as kvc_room_get does); kvc_room_get's errors.  *ttl_at: when
 * *ours is false and the room was read without the lock, the monotonic ns
 * (kvc__seg_mono_coarse_ns) at which its TTL could fail it next
 * (UINT64_MAX: terminal, never); else 0. */
kvc_err kvc__room_failed_by_kvcoord(kvc_segment *seg, uint64_t room, bool *ours, uint64_t *ttl_at);
/* rooms_ring.c: for each of the n rooms, the origin pid of its newest
 * record in the failure ring (0: kvcoord made it), -1 when the ring holds
 * none; one pass over the ring, reading two fields per entry.  Lock-free. */
void kvc__ring_origins(kvc_segment *seg, const uint64_t *rooms, int32_t *origin, size_t n);

/* arena.c (rank lock held) */
kvc_err kvc__arena_alloc(kvc_segment *seg, uint64_t bytes, uint64_t *off, uint64_t *blocks);
void kvc__arena_free(kvc_segment *seg, uint64_t off, uint64_t blocks);
void kvc__arena_mark(kvc_segment *seg, uint64_t off, uint64_t blocks);
void kvc__arena_clear_all(kvc_segment *seg);
bool kvc__arena_range_ok(const kvc_segment *seg, uint64_t off, uint64_t blocks);

/* segment.c: allocate real pages for [off, off+len) of the segment file
 * (posix_fallocate), so that writing there cannot SIGBUS on a full
 * /dev/shm.  Errors: KVC_E_FULL (no space: the message says how much is
 * free), KVC_E_SYS. */
kvc_err kvc__reserve(kvc_segment *seg, uint64_t off, uint64_t len, const char *what);

/* procs.c: the process table.  attach/detach this handle's entry; forget
 * (pid, start)'s entry (the last step of reaping it, session.c); set the
 * rank this worker serves (session.c installs it as seg->serves_rank). */
/* attach: KVC_E_FULL when no entry is free, with the first dead process's
 * (pid, start) in *dead_pid / *dead_start (0: every entry is alive) for the
 * caller to reap before trying again. */
kvc_err kvc__proc_attach(kvc_segment *seg, kvc_role role, int32_t rank, int32_t *dead_pid,
                         uint64_t *dead_start);
/* release: this handle stops counting in its process's entry; *last 1
 * when it was the process's last handle (the entry stays published, its
 * lock held, until kvc__proc_detach: the caller ends the session in
 * between), with the entry's KVC_PROC_F_* flags in *flags.  detach: remove
 * the entry (after a last release), releasing its liveness lock. */
kvc_err kvc__proc_release(kvc_segment *seg, int *last, uint32_t *flags);
kvc_err kvc__proc_detach(kvc_segment *seg);
/* Note in this process's entry that it opened a room (KVC_PROC_F_ROOMS). */
void kvc__proc_note_rooms(kvc_segment *seg);
/* The pid to show people for (pid, start): its entry's shown_pid (its pid
 * as its /proc names it, the host's when it shares it), else pid. */
int32_t kvc__shown_pid(kvc_segment *seg, int32_t pid, uint64_t start);
/* Whether this process has an entry in the table (a handle attached). */
bool kvc__pid_attached(kvc_segment *seg);
kvc_err kvc__proc_forget(kvc_segment *seg, int32_t pid, uint64_t start);
/* procs.c: publish that (pid, start) is dead, and how, in its entry (no
 * lock): the first step of reaping it, before its rooms are failed. */
void kvc__proc_mark_dead(kvc_segment *seg, int32_t pid, uint64_t start, const char *how);
void kvc__proc_set_rank(kvc_segment *seg, int32_t rank);

/* Crash-injection hook for tests: when set, called at each named point
 * inside critical sections ("reg.locked", ...).  Tests make it SIGKILL the
 * process.  Not part of the public API. */
typedef void (*kvc__inject_fn)(const char *point);
void kvc__test_set_inject(kvc__inject_fn fn);
extern kvc__inject_fn kvc__inject;
#define KVC_INJECT(point)       \
    do {                        \
        if (kvc__inject)        \
            kvc__inject(point); \
    } while (0)

#endif /* KVC_INTERNAL_H */
