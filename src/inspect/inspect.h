/*
 * inspect.h - looking inside a segment without changing it, for
 * kvcoord-diag: each lock's state and owner read without taking the lock,
 * the raw header of a segment kvc_open() refuses (another layout version,
 * a truncated file), rank descriptors read through the seqlock, and a check
 * of every invariant of the segment.
 *
 * Library-internal (not installed, not part of the public API).  Like the
 * rest of the library it never prints: findings go to a callback.
 *
 * What may change the segment: kvc__check() takes each lock whose owner is
 * alive (bounded by the lock timeout) to read a consistent state, and a
 * lock whose owner dies meanwhile is recovered as every lock path does;
 * a lock whose owner is already dead is left alone and the state under it
 * read as the dead owner left it.  kvc__rebuild() is the one repair.
 */
#ifndef KVC_INSPECT_H
#define KVC_INSPECT_H

#include <stdint.h>

#include "kvcoord/kvcoord.h"

/* Severity of a finding; the worst one found is the segment's verdict. */
typedef enum kvc_severity {
    KVC_SEV_OK = 0,       /* an invariant that holds */
    KVC_SEV_INFO = 1,     /* worth knowing, nothing wrong */
    KVC_SEV_DEGRADED = 2, /* works, but holds stale state (dead processes still listed,
                             a rank of a dead worker still served, a stuck lock) */
    KVC_SEV_BROKEN = 3    /* an invariant is violated, or a lock's owner died and the
                             state under it awaits recovery */
} kvc_severity;

/* "ok", "info", "degraded", "broken". */
const char *kvc__severity_name(kvc_severity s);

/* ---- header --------------------------------------------------------- */

/* A segment's header as found, for segments that may not be openable.
 * The stable prefix (magic, layout version, header size, creator) is read
 * from any file long enough to hold it; the rest only when the layout
 * version is this build's and the file holds a whole header. */
typedef struct kvc_raw_header {
    int has_stat;          /* the file_* fields below are known */
    const char *file_type; /* "regular file", "FIFO", "symlink", ... (static) */
    uint64_t file_bytes;   /* size of the file in /dev/shm */
    uint32_t file_mode;    /* permission bits */
    uint32_t file_uid;
    int has_prefix; /* the file holds the stable prefix */
    int magic_ok;
    int creating; /* a creator holds the creation lock right now */
    uint64_t magic;
    uint32_t layout_version;
    uint32_t header_size;
    int32_t creator_pid;
    uint64_t creator_start; /* ticks since boot */
    int creator_alive;
    int creator_stopped; /* alive but stopped: state T or t in /proc (SIGSTOP, a
                            debugger): it serves nothing until continued */
    int full;            /* the fields below are valid */
    uint32_t rank_entry_size, proc_size, lock_size, block_size, room_size;
    uint64_t total_bytes; /* the size the header says the file has */
    uint32_t max_ranks, max_procs, world_size, max_rooms, room_slots, room_ttl_ms;
    uint64_t max_info_bytes, arena_bytes, arena_blocks;
    uint64_t created_ns, updated_ns;
} kvc_raw_header;

/* Read name's header from /dev/shm without mapping the file (so a short
 * file cannot SIGBUS).  The file is opened O_NONBLOCK | O_NOFOLLOW, so
 * nothing put in /dev/shm can block the reader or redirect it.
 * Errors: KVC_E_INVAL (bad name), KVC_E_NOENT (no such segment),
 * KVC_E_CORRUPT (a symlink, or not a regular file: a FIFO, a directory...;
 * the message says which), KVC_E_SYS (permission denied: the message says
 * so, with the file's mode and owner; open, fstat or read failed).  The
 * file_* fields are filled whenever the file could be stat'ed (has_stat). */
kvc_err kvc__header_read(const char *name, kvc_raw_header *out);

/* The header of an open segment (always full). */
void kvc__header_of(kvc_segment *seg, kvc_raw_header *out);

/* Name of a file type from st_mode ("regular file", "FIFO", ...). */
const char *kvc__file_type(unsigned mode);

/* The magic as its eight characters ("COKVCRD1" when valid), into buf[9]. */
void kvc__magic_text(uint64_t magic, char buf[9]);

/* Alive: pid runs with that start time (0: any) and is not a zombie. */
int kvc__pid_alive(int32_t pid, uint64_t start);

/* The pid (as this /proc names it) of a live kvcoordd attached to seg
 * other than creator_pid: the daemon that adopted the segment after its
 * creator ended (a restart); 0 when none.  Reads the process table
 * without its lock (each entry's pid atomically; a hint for people). */
int32_t kvc__adopter(kvc_segment *seg, int32_t creator_pid);

/* Alive as kvc__pid_alive() and stopped: state T (SIGSTOP) or t (a tracer)
 * in /proc, so it runs nothing until continued. */
int kvc__pid_stopped(int32_t pid, uint64_t start);

/* Unmap and free a handle of a diagnostic reader (opened with
 * KVC_ROLE_NONE, no room opened through it) without taking any lock.
 * kvc_close() fails the rooms its process takes part in, under the rooms
 * lock - which would recover a dead owner's lock that a read-only command
 * must leave alone, and wait up to the lock timeout on a stuck one.  A
 * handle with a process entry is passed to kvc_close().  NULL is ignored.
 * The library's count of this process's handles on the segment is left as
 * it was (so a later kvc_close() of another handle never counts as the
 * last): fine for kvcoord-diag, which opens no room through any handle. */
void kvc__close_reader(kvc_segment *seg);

/* ---- locks ---------------------------------------------------------- */

#define KVC__ROOM_STRIPES 64               /* room stripe locks: see layout.h */
#define KVC__LOCKS (3 + KVC__ROOM_STRIPES) /* ranks, procs, rooms.0 .. rooms.63, pd */
#define KVC__LOCK_ID_RANKS 0
#define KVC__LOCK_ID_PROCS 1
#define KVC__LOCK_ID_ROOMS 2 /* stripe 0; stripe s is KVC__LOCK_ID_ROOMS + s */

typedef enum kvc_lock_state {
    KVC_LOCKST_FREE = 0,
    KVC_LOCKST_HELD = 1,          /* by owner_pid (alive or not: see owner_alive) */
    KVC_LOCKST_OWNER_DIED = 2,    /* its owner died holding it; the next locker
                                      gets EOWNERDEAD and recovers */
    KVC_LOCKST_NOTRECOVERABLE = 3 /* unlocked without being made consistent */
} kvc_lock_state;

typedef struct kvc_lock_probe {
    const char *name; /* "ranks", "procs", "rooms.0" .. "rooms.63" */
    kvc_lock_state state;
    int32_t owner_pid;    /* holder, or the owner that died; 0 if unknown */
    uint64_t owner_start; /* its start time when recorded, else 0 */
    int owner_alive;
    int owner_stopped;   /* held by a live process that is stopped (state T or t
                          in /proc: SIGSTOP, a debugger): every locker waits */
    int waiters;         /* the futex word says processes are waiting */
    int recovering;      /* a locker got EOWNERDEAD and is recovering now */
    uint64_t recoveries; /* EOWNERDEAD recoveries of this lock, ever */
} kvc_lock_probe;

/* A lock's name is the core's kvc__lock_name() (src/core/segment/internal.h,
 * which the inspect files include as the core's friend). */

/* Read lock id's state and owner without taking it (never blocks, never
 * changes the segment). */
void kvc__lock_probe(kvc_segment *seg, int id, kvc_lock_probe *out);

/* "free", "held by pid N (alive)", "owner pid N died holding it", ... into
 * buf; returns buf. */
char *kvc__lock_text(const kvc_lock_probe *p, char *buf, size_t cap);

/* ---- ranks ---------------------------------------------------------- */

/* A rank entry's published descriptor, read through its seqlock. */
typedef struct kvc_rank_peek {
    uint64_t seq; /* the sequence counter as read (odd: a writer is inside) */
    uint32_t active;
    uint32_t state; /* kvc_rank_state */
    uint32_t entries;
    uint64_t generation;
    uint64_t changed_ns;
    int32_t pid;
    uint64_t pid_start;
    uint32_t session_len;
    uint64_t info_len; /* bytes of weights_info_dict JSON */
    uint64_t blob_off, blob_blocks;
    uint32_t owned; /* registered by a worker: withdrawn when it dies */
} kvc_rank_peek;

/* Copy rank's published descriptor without taking a lock: copy, re-check
 * the sequence, retry.  Never locks: an odd sequence that stays odd
 * (a writer died mid-publish) gives KVC_E_BUSY with out->seq odd.
 * Errors: KVC_E_INVAL, KVC_E_CAPACITY, KVC_E_BUSY. */
kvc_err kvc__rank_peek(kvc_segment *seg, uint32_t rank, kvc_rank_peek *out);

/* ---- check and rebuild ---------------------------------------------- */

/* Counts gathered by kvc__check(). */
typedef struct kvc_check_stats {
    uint32_t ranks_registered, ranks_withdrawn, ranks_odd;
    uint32_t rooms_live, rooms_by_state[5]; /* by KVPoll state */
    int rooms_counted;                      /* 0: the rooms lock was busy, rooms not read */
    uint32_t procs_attached, procs_alive, procs_dead;
    uint32_t procs_stopped;          /* of procs_alive: stopped (state T or t in /proc) */
    uint64_t arena_marked_blocks;    /* bits set in the arena bitmap */
    uint64_t arena_published_blocks; /* blocks of published rank info */
    uint64_t failures_total;
    kvc_lock_probe locks[KVC__LOCKS];
    int recovered_while_checking; /* a lock's owner died while we checked */
} kvc_check_stats;

/* Called once per finding: id names the invariant ("ranks.seq",
 * "arena.bitmap", ...: stable, documented in docs/diag.md), msg says what
 * was found.  An invariant that holds gets one KVC_SEV_OK finding. */
typedef void (*kvc_check_fn)(void *ctx, kvc_severity sev, const char *id, const char *msg);

/* Verify every invariant of an open segment; returns the worst severity.
 * stats (may be NULL) receives counts.  See the top of this file for what
 * it locks. */
kvc_severity kvc__check(kvc_segment *seg, kvc_check_fn fn, void *ctx, kvc_check_stats *stats);

/* Take lock id (recovering a dead owner's state as every lock path does),
 * run its recovery function anyway - rebuild the derived state under it
 * (arena bitmap and counts, rooms count, undo record) - and release it.
 * *recovered (may be NULL) is 1 when the owner had died.
 * Errors: those of taking the lock (KVC_E_BUSY, KVC_E_NOTRECOVERABLE). */
kvc_err kvc__rebuild(kvc_segment *seg, int id, int *recovered);

/* Take lock id and release it: a dead owner's lock is recovered.
 * *recovered (may be NULL) is 1 when it was.  Errors: as kvc__rebuild(). */
kvc_err kvc__lock_cycle(kvc_segment *seg, int id, int *recovered);

#endif /* KVC_INSPECT_H */
