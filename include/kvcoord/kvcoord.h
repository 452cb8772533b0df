/*
 * kvcoord.h - the node's shared-memory coordinator: segment, rank table.
 *
 * One POSIX shared-memory segment per coordinator instance holds the rank
 * table (each TP rank's transfer-engine info: session_id and
 * weights_info_dict) behind robust process-shared mutexes.  Co-located
 * processes attach to it with kvc_open(); kvcoordd serves the same table over
 * HTTP (the API of sglang's engine-info bootstrap server).
 *
 * Conventions for every function in this header:
 *  - Return a kvc_err; KVC_OK (0) is success.  On failure a human-readable
 *    message naming the cause is available from kvc_last_error() in the
 *    calling thread until that thread's next failing call.
 *  - The library never prints, never exits, never installs signal handlers.
 *  - A kvc_segment handle may be used by several threads of one process at
 *    once; all cross-process safety comes from the robust mutexes and
 *    seqlocks inside the segment.  kvc_close() must not race other calls on
 *    the same handle.
 *  - Pointer arguments must not be NULL unless the function's comment says
 *    so; a NULL one is refused with KVC_E_INVAL and kvc_last_error() names
 *    the function and the argument ("kvc_room_get: argument out is NULL").
 *    An enum argument outside its declared values is refused the same way.
 *    Functions that return no kvc_err say what they do with NULL.
 *  - Timestamps are CLOCK_REALTIME nanoseconds since the Unix epoch unless
 *    noted; timeouts are milliseconds, and every deadline (lock waits,
 *    futex waits, timeouts) runs on CLOCK_MONOTONIC, so setting the clock
 *    neither shortens nor stretches a wait.
 */
#ifndef KVCOORD_KVCOORD_H
#define KVCOORD_KVCOORD_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Version of this library (semantic versioning), as a string "X.Y.Z". */
#define KVC_VERSION "0.1.0"

/* Layout version of the shared-memory segment this build reads and writes.
 * Bumped on any change to the segment's structures; a segment with another
 * layout version is never read (kvc_open fails with KVC_E_VERSION). */
#define KVC_LAYOUT_VERSION 13u

/* Default HTTP port, as sglang's --engine-info-bootstrap-port default. */
#define KVC_DEFAULT_PORT 6789

/* Longest segment name accepted, in bytes, excluding the NUL. */
#define KVC_NAME_MAX 200

/* Longest session_id accepted, in bytes, excluding the NUL. */
#define KVC_SESSION_ID_MAX 255

/* Longest withdrawal note kept for a rank, in bytes, excluding the NUL. */
#define KVC_NOTE_MAX 127

/* Longest origin node name of a mirrored rank, in bytes, excluding the NUL. */
#define KVC_ORIGIN_MAX 63

/* Error codes.  kvc_strerror() gives a short fixed description of each;
 * kvc_last_error() gives the message of the last failure with its context. */
typedef enum kvc_err {
    KVC_OK = 0,
    KVC_E_INVAL = 1,           /* invalid argument: bad name, NULL pointer, bad rank,
                                  weights_info_dict not a JSON object, ... */
    KVC_E_NOENT = 2,           /* no such segment (attach), or rank never registered */
    KVC_E_WITHDRAWN = 3,       /* rank was registered, then withdrawn (by a call or
                                  because its process exited); see the note */
    KVC_E_CAPACITY = 4,        /* rank >= the segment's max ranks */
    KVC_E_TOOBIG = 5,          /* info larger than max info bytes, or session_id
                                  longer than KVC_SESSION_ID_MAX */
    KVC_E_FULL = 6,            /* a table or the info arena is full */
    KVC_E_VERSION = 7,         /* segment built with another layout version */
    KVC_E_CORRUPT = 8,         /* segment header invalid or file truncated */
    KVC_E_SYS = 9,             /* a system call failed; the message names it and errno */
    KVC_E_TIMEDOUT = 10,       /* a wait ran out of time */
    KVC_E_BUSY = 11,           /* a lock could not be taken within the lock timeout
                                  (held by a live, stuck process) */
    KVC_E_NOTRECOVERABLE = 12, /* a mutex is ENOTRECOVERABLE (should never happen:
                                  reported, never spun on) */
    KVC_E_EXISTS = 13,         /* a live segment is in the way: another layout version,
                                  or (KVC_OPEN_FRESH) one whose creator runs or that
                                  processes are attached to */
    KVC_E_PEER = 14,           /* a collective's peer died or left the segment: the
                                  message names its rank and pid (kvc_allreduce_min) */
    KVC_E_STALE = 15           /* the handle's segment is no longer the one served under
                                  its name: discarded (kvc_open KVC_OPEN_FRESH_FORCE,
                                  kvc_unlink), unlinked, replaced or re-created; the
                                  handle must be closed and the segment opened again */
} kvc_err;

/* Short fixed description of an error code (static storage, never NULL;
 * unknown codes give "unknown error").  Thread-safe. */
const char *kvc_strerror(kvc_err err);

/* Message of the last failing call made by the calling thread, with its
 * context (e.g. "rank 2000 exceeds the segment's max ranks (1024)").
 * Thread-local storage owned by the library, valid until the same thread's
 * next failing call; "" when none failed yet.  Never NULL. */
const char *kvc_last_error(void);

/* Set the calling thread's last-error message (what kvc_last_error() then
 * returns) from a printf-style format, and return err unchanged.  For
 * libraries layered on libkvcoord (the transfer engine, language bindings)
 * so that one kvc_last_error() reports every failure.  The message is
 * truncated to 511 bytes.  fmt must not be NULL.  Thread-safe (the message
 * is thread-local); async-signal-unsafe (vsnprintf). */
kvc_err kvc_error_set(kvc_err err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* kvc_error_set() with a va_list (consumed, as vsnprintf consumes it). */
kvc_err kvc_error_setv(kvc_err err, const char *fmt, va_list ap)
    __attribute__((format(printf, 2, 0)));

/* Opaque handle on an attached segment.  Created by kvc_open(), destroyed by
 * kvc_close(). */
typedef struct kvc_segment kvc_segment;

/* Role recorded for an attached process in the segment's process table. */
typedef enum kvc_role {
    KVC_ROLE_NONE = 0,   /* not recorded (diagnostic tools, short-lived readers) */
    KVC_ROLE_WORKER = 1, /* a TP worker; its ranks are withdrawn when it dies */
    KVC_ROLE_DAEMON = 2, /* kvcoordd */
    KVC_ROLE_CLIENT = 3  /* any other attached process */
} kvc_role;

/* Name of a process role ("none", "worker", "daemon", "client"; "invalid"
 * for any other value), as kvcoordd's metrics and kvcoord-diag show it.
 * Static storage; never NULL; thread-safe.  (Not the rank roles of
 * kvc_role_names().) */
const char *kvc_role_name(kvc_role role);

/* How kvc_open() treats an existing or missing segment. */
typedef enum kvc_open_mode {
    KVC_OPEN_ATTACH = 0,     /* attach to an existing valid segment; KVC_E_NOENT if none */
    KVC_OPEN_CREATE = 1,     /* reuse a valid segment (its registrations survive), else
                            create it; an invalid one is recreated under the same
                            name; one of another layout version is recreated
                            only when its creator is dead (else KVC_E_EXISTS) */
    KVC_OPEN_FRESH = 2,      /* remove any existing segment of that name, then create;
                            refused (KVC_E_EXISTS) while the existing segment's
                            creator (another process: its kvcoordd) is running, or
                            while other processes are attached to it (the message
                            names them: pid, role, rank) */
    KVC_OPEN_FRESH_FORCE = 3 /* KVC_OPEN_FRESH even with processes attached (not with
                                its creator running): the old segment is marked
                                discarded first, so every later call of those
                                processes on it fails with KVC_E_STALE */
} kvc_open_mode;

/* Options for kvc_open().  Initialise with kvc_options_init(), then change
 * fields.  Capacities only matter when a segment is created; attaching uses
 * the capacities stored in the segment. */
typedef struct kvc_options {
    const char *name;         /* segment name ([A-Za-z0-9._-], 1..KVC_NAME_MAX bytes);
                                NULL: "kvcoord-6789".  Borrowed for the call only. */
    kvc_open_mode mode;       /* default KVC_OPEN_ATTACH */
    kvc_role role;            /* default KVC_ROLE_CLIENT */
    int32_t rank;             /* rank this process serves, -1 if none (default -1);
                                recorded in the process table */
    uint32_t max_ranks;       /* rank table entries; default 1024 */
    uint64_t max_info_bytes;  /* per rank: session_id + weights_info_dict JSON, bytes;
                                default 16 MiB */
    uint64_t arena_bytes;     /* info arena shared by all ranks, bytes; sparse on tmpfs,
                                so untouched pages cost nothing; default 1 GiB */
    uint32_t max_procs;       /* process table entries; default 4096 */
    uint32_t world_size;      /* TP group size on this node; default 8 */
    mode_t perm;              /* segment file mode on creation; default 0600 */
    uint32_t lock_timeout_ms; /* bound on every lock wait; default 2000 ms */
    uint32_t max_rooms;       /* active bootstrap rooms; default 32768 */
    uint32_t room_ttl_ms;     /* a room idle this long fails and is reclaimed;
                                default 300000 ms (5 min, sglang's waiting timeout) */
} kvc_options;

/* The ranges kvc_open() accepts for a new segment's capacities in
 * kvc_options (outside them: KVC_E_INVAL naming the range).  Besides these,
 * world_size is 1..max_ranks and max_info_bytes at most arena_bytes / 2 (a
 * re-registration holds a rank's old and new info at once). */
#define KVC_LIMIT_MAX_RANKS (1u << 20)   /* max_ranks: 1..1048576 */
#define KVC_LIMIT_MAX_PROCS (1u << 20)   /* max_procs: 1..1048576 */
#define KVC_LIMIT_MAX_ROOMS (1u << 22)   /* max_rooms: 1..4194304 */
#define KVC_LIMIT_ARENA_MIN 1024ull      /* arena_bytes: 1 KiB (one block).. */
#define KVC_LIMIT_ARENA_MAX (1ull << 40) /* ..1 TiB */
#define KVC_LIMIT_INFO_MIN 64ull         /* max_info_bytes: at least 64 bytes */
/* lock_timeout_ms: 1..3600000 (one hour), for the library, kvcoordd's and
 * kvcoord-diag's --lock-timeout and Python's lock_timeout alike (a written
 * number, without a suffix, so that tools can print it in their help). */
#define KVC_LIMIT_LOCK_TIMEOUT_MS 3600000

/* Fill *opts with the defaults documented above.  Never fails; NULL is
 * ignored. */
void kvc_options_init(kvc_options *opts);

/* Write the default segment name for an HTTP port ("kvcoord-<port>") into
 * buf (cap bytes, including the NUL).
 * Errors: KVC_E_INVAL if buf is NULL or cap is too small. */
kvc_err kvc_name_for_port(uint16_t port, char *buf, size_t cap);

/* Check a segment name: 1..KVC_NAME_MAX bytes of [A-Za-z0-9._-], not "." or
 * "..", not starting with '-'.  Returns KVC_OK or KVC_E_INVAL (with a message
 * naming the bad byte). */
kvc_err kvc_name_check(const char *name);

/* Open (create, reuse or attach to) the segment named in opts, as opts->mode
 * says, and record this process in its process table unless the role is
 * KVC_ROLE_NONE.  The segment is /dev/shm/<name>, mode opts->perm.  Its
 * tables (everything but the info arena) get real pages at creation, and
 * arena pages are allocated before rank info is written into them, so a full
 * /dev/shm gives an error, never a SIGBUS.
 * On success *out owns the mapping until kvc_close().
 * Errors: KVC_E_INVAL (NULL opts or out, bad name or options, mode or role
 * outside the enum, rank below -1), KVC_E_NOENT (attach and no
 * segment), KVC_E_VERSION (attach to another layout version: the message
 * names both versions), KVC_E_EXISTS (create over a live segment of another
 * layout version, or FRESH over a segment whose creator runs), KVC_E_CORRUPT (attach to an invalid or truncated segment),
 * KVC_E_FULL (process table full of live processes: a dead process's entry
 * is reaped first - its rooms failed, its ranks withdrawn - then reused),
 * KVC_E_BUSY (a lock needed for that reaping is held), KVC_E_SYS (shm_open, ftruncate, mmap,
 * flock failed). */
kvc_err kvc_open(const kvc_options *opts, kvc_segment **out);

/* Remove this process from the process table, unmap and free the handle.
 * On the last handle of a KVC_ROLE_WORKER process, the ranks it registered
 * are withdrawn ("rank N's process P exited (closed its segment handle)"):
 * a worker's session ends with it.  Other roles' registrations stay.
 * When it is this process's last handle on the segment, every non-terminal
 * room the process opened and has not released fails
 * ("rank N (pid P) closed its segment handle without releasing the room"),
 * since it cannot complete without this participant.
 * The handle is freed whatever happens.  NULL is accepted and ignored
 * (KVC_OK).  Errors: the first failure among failing the rooms,
 * withdrawing the ranks and removing the process entry (KVC_E_BUSY,
 * KVC_E_NOTRECOVERABLE, KVC_E_SYS: a lock could not be taken; the message
 * says which step was skipped, so the caller knows its ranks may still be
 * served until the process is reaped). */
kvc_err kvc_close(kvc_segment *seg);

/* Remove the segment named name from /dev/shm, marking it discarded first:
 * processes attached keep their mapping, and each of their later calls on
 * it fails with KVC_E_STALE (kvc_segment_verify).  Errors: KVC_E_INVAL (bad name), KVC_E_NOENT (no such
 * segment), KVC_E_SYS. */
kvc_err kvc_unlink(const char *name);

/* Whether seg's segment is still the one served under its name: KVC_OK, or
 * KVC_E_STALE once it was discarded (another process opened the name with
 * KVC_OPEN_FRESH_FORCE, or kvc_unlink removed it), unlinked or replaced
 * (its file has no name any more: one fstat).  Every call looks at the
 * discarded flag first (an atomic load) and fails with KVC_E_STALE; at the
 * file, every call that changes the rank or process tables (register,
 * withdraw, open, close), room updates at most every 10 ms and lookups and
 * room reads at most every 100 ms per handle (a system call would triple
 * the cost of a room update); once seen, every later call fails.  A stale handle
 * stays valid to close (kvc_close then ends nothing in the segment).
 * Thread-safe.  Errors: KVC_E_INVAL (NULL), KVC_E_STALE. */
kvc_err kvc_segment_verify(kvc_segment *seg);

/* The segment's name (owned by the handle, valid until kvc_close). */
const char *kvc_segment_name(const kvc_segment *seg);

/* Capacities and identity of an open segment, as stored in its header. */
typedef struct kvc_segment_info {
    uint32_t layout_version;
    uint32_t max_ranks;
    uint32_t max_procs;
    uint32_t world_size;
    uint64_t max_info_bytes; /* bytes */
    uint64_t arena_bytes;    /* bytes */
    uint64_t arena_used;     /* bytes in use by published rank info (blocks) */
    uint64_t total_bytes;    /* size of the segment file, bytes */
    int32_t creator_pid;
    uint64_t created_ns;
    uint64_t updated_ns;
    uint64_t lock_recoveries; /* EOWNERDEAD recoveries since creation */
    uint32_t ranks_registered;
    uint32_t max_rooms;
    uint32_t rooms_live; /* rooms in the table */
    uint32_t room_ttl_ms;
    uint64_t failures_total; /* failure records ever kept */
    /* Failed rooms no participant had joined, evicted to make room for a
     * new room in a full table (kvc_room_open), since creation. */
    uint64_t rooms_evicted;
} kvc_segment_info;

/* Fill *out from the header (reads only; no lock taken).  Errors: KVC_E_INVAL. */
kvc_err kvc_segment_stat(kvc_segment *seg, kvc_segment_info *out);

/* ---- Rank table ------------------------------------------------------ */

/* The largest rank number any interface takes (the C API's uint32_t ranks,
 * Python's int, kvcoord-diag's --rank): 0..4294967294.  UINT32_MAX is
 * KVC_ORIGIN_RANK_NONE, no rank.  A segment serves ranks below its
 * max_ranks; a larger one is refused there with that bound. */
#define KVC_RANK_MAX 4294967294u

/* State of a rank entry. */
typedef enum kvc_rank_state {
    KVC_RANK_EMPTY = 0, /* never registered */
    KVC_RANK_REGISTERED = 1,
    KVC_RANK_WITHDRAWN = 2 /* withdrawn; note says why */
} kvc_rank_state;

/* A rank's entry as read by kvc_rank_lookup()/kvc_rank_wait()/kvc_rank_list().
 * Zero-initialise before first use.  info is a buffer owned by the caller
 * that the library grows with realloc() when needed (info_cap bytes); it is
 * NUL-terminated after a successful lookup; release it with
 * kvc_rank_info_free() or free(). */
typedef struct kvc_rank_info {
    uint32_t rank;
    kvc_rank_state state;
    uint64_t generation;                     /* bumped by every change of the entry; 0 = never */
    uint64_t registered_ns;                  /* time of the last registration or withdrawal */
    int32_t pid;                             /* process that made the last change */
    uint32_t entries;                        /* top-level keys of weights_info_dict */
    char session_id[KVC_SESSION_ID_MAX + 1]; /* verbatim, NUL-terminated */
    char note[KVC_NOTE_MAX + 1];             /* why withdrawn, else "" */
    char *info;                              /* weights_info_dict JSON text (lookup only) */
    size_t info_len;                         /* bytes of JSON in info, excluding the NUL */
    size_t info_cap;                         /* allocated bytes behind info */
    char origin[KVC_ORIGIN_MAX + 1];         /* "" for a registration made on this node;
                                                for a rank mirrored from another node
                                                (kvcoordd --etcd) that node's name, kept
                                                when the mirror is withdrawn */
    uint64_t origin_generation;              /* its generation on the origin node, else 0 */
} kvc_rank_info;

/* Free the info buffer of *ri and reset the buffer fields.  NULL is ignored. */
void kvc_rank_info_free(kvc_rank_info *ri);

/* Register (or re-register) rank with its transfer-engine info.
 * session_id: NUL-terminated, 1..KVC_SESSION_ID_MAX bytes, stored verbatim
 * (IPv6 literals included).  info_json/info_len: the weights_info_dict, a
 * JSON object (validated), stored byte for byte.  Re-registration overwrites
 * and bumps the generation; an identical one (same bytes, entry registered)
 * changes nothing and succeeds when it comes from the process that made
 * the entry, or when neither is a worker's (role KVC_ROLE_WORKER: withdrawn
 * at its exit) - a daemon's or a client's same bytes from another process,
 * e.g. a restarted kvcoordd's, keep the generation and the entry's pid.
 * The same bytes from or over a worker's registration by another process
 * are a change of owner: written and the generation bumped, so the rank is
 * withdrawn with the process that registered it last, not with an earlier
 * one (a worker's ranks go with it; a daemon's stay).  The new info is written to the inactive
 * half of the entry and published by one store: a crash at any instruction
 * leaves the old or the new value, never a mix.  *gen_out (may be NULL)
 * receives the entry's generation afterwards.  Wakes kvc_rank_wait()ers.
 * info_json is validated strictly (RFC 8259; UTF-8; at most 2048 nested
 * levels; integers from -2^63 to 2^64-1; no raw NUL byte) without being
 * decoded, so numbers stay as written.
 * Errors: KVC_E_INVAL (NULL, empty session_id, info not a JSON object: the
 * message gives the reason, line, column and byte), KVC_E_CAPACITY (rank >=
 * max ranks), KVC_E_TOOBIG (session_id too long, or session_id + info >
 * max info bytes), KVC_E_FULL (arena full, or /dev/shm has no space for
 * the info's pages), KVC_E_BUSY,
 * KVC_E_NOTRECOVERABLE. */
kvc_err kvc_rank_register(kvc_segment *seg, uint32_t rank, const char *session_id,
                          const char *info_json, size_t info_len, uint64_t *gen_out);

/* kvc_rank_register() for a caller that has already parsed and validated
 * info_json as one JSON object with `entries` top-level keys (kvcoordd,
 * which parsed the HTTP request body): the body is not parsed a second
 * time, only checked to begin with '{' and end with '}'.  `entries` is
 * recorded as given (shown by kvc_rank_lookup() and diagnostics).  Same
 * storage, crash-consistency, ownership and errors as kvc_rank_register();
 * KVC_E_INVAL also when info_json plainly is not an object. */
kvc_err kvc_rank_register_validated(kvc_segment *seg, uint32_t rank, const char *session_id,
                                    const char *info_json, size_t info_len, uint32_t entries,
                                    uint64_t *gen_out);

/* "Any generation" for the expect_generation of the mirror calls below. */
#define KVC_GEN_ANY UINT64_MAX

/* Register rank as a mirror of another node's registration (kvcoordd's
 * cluster view): as kvc_rank_register(), and the entry records origin (the
 * origin node's name: 1..KVC_ORIGIN_MAX bytes of [A-Za-z0-9._-]) and
 * origin_generation (the rank's generation there), which lookups and lists
 * return.  A mirrored entry is never withdrawn with the process that wrote
 * it.  expect_generation: the entry's generation the caller last saw (0 for
 * a never registered rank); when the entry has another one now (a local
 * registration landed meanwhile) nothing is written and KVC_E_EXISTS is
 * returned; KVC_GEN_ANY skips the check.  An identical call (same bytes,
 * origin and origin generation) changes nothing; kvc_rank_register() of the
 * same bytes over a mirrored entry makes it a local registration again (and
 * bumps the generation).
 * Errors: those of kvc_rank_register(), KVC_E_INVAL for a bad origin,
 * KVC_E_EXISTS as above. */
kvc_err kvc_rank_register_mirror(kvc_segment *seg, uint32_t rank, const char *session_id,
                                 const char *info_json, size_t info_len, const char *origin,
                                 uint64_t origin_generation, uint64_t expect_generation,
                                 uint64_t *gen_out);

/* Withdraw rank if it is still a mirrored entry (origin set) with
 * generation expect_generation (KVC_GEN_ANY: any), with note as
 * kvc_rank_withdraw().  A local registration, or another generation, is
 * left alone: KVC_E_EXISTS.  Errors: KVC_E_INVAL, KVC_E_CAPACITY,
 * KVC_E_NOENT (not registered), KVC_E_EXISTS, KVC_E_BUSY,
 * KVC_E_NOTRECOVERABLE. */
kvc_err kvc_rank_withdraw_mirror(kvc_segment *seg, uint32_t rank, const char *note,
                                 uint64_t expect_generation);

/* Read rank's entry into *out without taking a lock (seqlock: copy,
 * re-check, retry; a writer that died mid-publish is recovered by taking the
 * lock).  On KVC_OK the entry is registered and out->info holds its
 * weights_info_dict.  On KVC_E_WITHDRAWN the metadata (generation, note)
 * is filled and info is not.
 * Errors: KVC_E_INVAL, KVC_E_CAPACITY (rank >= max ranks), KVC_E_NOENT
 * (never registered), KVC_E_WITHDRAWN, KVC_E_SYS (realloc failed),
 * KVC_E_BUSY / KVC_E_NOTRECOVERABLE (recovery needed the lock). */
kvc_err kvc_rank_lookup(kvc_segment *seg, uint32_t rank, kvc_rank_info *out);

/* As kvc_rank_lookup(), but when the rank is not registered waits up to
 * timeout_ms for it to be (re-)registered, sleeping on the rank table's
 * shared futex epoch (no polling).  timeout_ms 0 is one lookup.
 * Errors: those of kvc_rank_lookup(), KVC_E_TIMEDOUT when the time ran out
 * (out then holds the last state seen). */
kvc_err kvc_rank_wait(kvc_segment *seg, uint32_t rank, uint32_t timeout_ms, kvc_rank_info *out);

/* List entries that are registered (and withdrawn ones too when
 * include_withdrawn is non-zero), ascending by rank, into out[0..cap-1]
 * without their info (info fields untouched).  *count receives the number
 * of matching entries, which may exceed cap (then only cap are written).
 * Errors: KVC_E_INVAL. */
kvc_err kvc_rank_list(kvc_segment *seg, kvc_rank_info *out, size_t cap, size_t *count,
                      int include_withdrawn);

/* Withdraw rank: lookups then return KVC_E_WITHDRAWN with note (may be NULL,
 * truncated to KVC_NOTE_MAX bytes).  Frees its info; bumps the generation.
 * Errors: KVC_E_INVAL, KVC_E_CAPACITY, KVC_E_NOENT (not registered),
 * KVC_E_BUSY, KVC_E_NOTRECOVERABLE. */
kvc_err kvc_rank_withdraw(kvc_segment *seg, uint32_t rank, const char *note);

/* Current value of the rank table's change epoch (a 32-bit counter bumped
 * on every change, wrapping).  Use with kvc_rank_wait_change().  NULL seg:
 * returns 0 and sets kvc_last_error(). */
uint32_t kvc_rank_epoch(kvc_segment *seg);

/* Sleep until the rank table's epoch differs from seen or timeout_ms passes
 * (shared futex).  Errors: KVC_E_INVAL (NULL seg), KVC_E_TIMEDOUT. */
kvc_err kvc_rank_wait_change(kvc_segment *seg, uint32_t seen, uint32_t timeout_ms);

/* ---- Roles and parallelism configs ------------------------------------
 *
 * Newer sglang workers publish under a role (e.g. "draft": a speculative-
 * decoding draft model's ranks, whose registrations must not overwrite the
 * target model's) and also publish each rank's parallelism config (sglang's
 * RankParallelismConfig: tp/pp/ep/moe_tp/attn_tp/attn_dp sizes and ranks,
 * world_size, global_rank, local_rank) as a JSON object.  A segment keeps
 * both keyed by (rank, role):
 *  - role NULL, "" and KVC_DEFAULT_ROLE ("target") name the default role,
 *    whose transfer-engine info is the rank table above (kvc_rank_*);
 *  - up to KVC_RANK_ROLES - 1 other role names (1..KVC_ROLE_NAME_MAX bytes
 *    of [A-Za-z0-9._-]), each claimed by the first registration that uses
 *    it and kept for the segment's life.
 * Storage, crash consistency (double buffer, one-store publish, seqlock
 * reads) and process ownership (a worker's entries are withdrawn when it
 * exits or dies) are those of the rank table.  Thread- and process-safe. */

/* Roles a segment keeps, the default role included. */
#define KVC_RANK_ROLES 4

/* Longest role name, bytes, excluding the NUL. */
#define KVC_ROLE_NAME_MAX 31

/* Name of the default role (what a request that names no role means). */
#define KVC_DEFAULT_ROLE "target"

/* Check a role name (NULL and "" are the default role).
 * Errors: KVC_E_INVAL naming the bad byte or the length. */
kvc_err kvc_role_check(const char *role);

/* kvc_rank_register() under a role (claimed if new).  The default role is
 * exactly kvc_rank_register().  Errors: those of kvc_rank_register(),
 * KVC_E_INVAL (bad role name), KVC_E_FULL (KVC_RANK_ROLES roles in use). */
kvc_err kvc_role_register(kvc_segment *seg, const char *role, uint32_t rank, const char *session_id,
                          const char *info_json, size_t info_len, uint64_t *gen_out);

/* kvc_rank_register_validated() under a role (kvcoordd). */
kvc_err kvc_role_register_validated(kvc_segment *seg, const char *role, uint32_t rank,
                                    const char *session_id, const char *info_json, size_t info_len,
                                    uint32_t entries, uint64_t *gen_out);

/* kvc_rank_lookup() under a role.  Errors: those of kvc_rank_lookup();
 * KVC_E_NOENT also for a role no registration has used. */
kvc_err kvc_role_lookup(kvc_segment *seg, const char *role, uint32_t rank, kvc_rank_info *out);

/* kvc_rank_withdraw() under a role.  Errors: those of kvc_rank_withdraw(). */
kvc_err kvc_role_withdraw(kvc_segment *seg, const char *role, uint32_t rank, const char *note);

/* Store rank's parallelism config under role: config_json/config_len, a
 * JSON object (validated; stored byte for byte), at most max info bytes.
 * Re-registration overwrites and bumps the entry's generation (identical
 * bytes change nothing).  Wakes kvc_rank_wait_change()ers.
 * Errors: KVC_E_INVAL (NULL, bad role, not a JSON object), KVC_E_CAPACITY,
 * KVC_E_TOOBIG, KVC_E_FULL (arena or role table full), KVC_E_BUSY,
 * KVC_E_NOTRECOVERABLE. */
kvc_err kvc_parallelism_register(kvc_segment *seg, const char *role, uint32_t rank,
                                 const char *config_json, size_t config_len, uint64_t *gen_out);

/* Read rank's parallelism config under role into *out (lock-free, as
 * kvc_rank_lookup()): out->info holds the JSON object, out->session_id is
 * "", out->entries its top-level keys.  Errors: those of kvc_rank_lookup()
 * (KVC_E_NOENT: none stored for that rank and role). */
kvc_err kvc_parallelism_lookup(kvc_segment *seg, const char *role, uint32_t rank,
                               kvc_rank_info *out);

/* kvc_rank_register_mirror() under a role (claimed if new; the default
 * role is the rank table): the entry records origin and origin_generation,
 * is never withdrawn with the process that wrote it, and is written only
 * while its generation is expect_generation (KVC_GEN_ANY: any).
 * Errors: those of kvc_rank_register_mirror(), KVC_E_INVAL (bad role),
 * KVC_E_FULL (KVC_RANK_ROLES roles in use). */
kvc_err kvc_role_register_mirror(kvc_segment *seg, const char *role, uint32_t rank,
                                 const char *session_id, const char *info_json, size_t info_len,
                                 const char *origin, uint64_t origin_generation,
                                 uint64_t expect_generation, uint64_t *gen_out);

/* kvc_rank_withdraw_mirror() under a role.  Errors: those of
 * kvc_rank_withdraw_mirror(); KVC_E_NOENT also for a role not in use. */
kvc_err kvc_role_withdraw_mirror(kvc_segment *seg, const char *role, uint32_t rank,
                                 const char *note, uint64_t expect_generation);

/* kvc_rank_list() of role's transfer-engine infos (lock-free; info fields
 * untouched).  A role no registration has used lists nothing (*count 0).
 * Errors: KVC_E_INVAL (NULL, bad role), KVC_E_CORRUPT. */
kvc_err kvc_role_list(kvc_segment *seg, const char *role, kvc_rank_info *out, size_t cap,
                      size_t *count, int include_withdrawn);

/* kvc_parallelism_register() as a mirror of another node's config (kvcoordd's
 * cluster view): origin (1..KVC_ORIGIN_MAX bytes of [A-Za-z0-9._-]) and
 * origin_generation are recorded; written only while the entry's
 * generation is expect_generation (KVC_GEN_ANY: any), else KVC_E_EXISTS;
 * never withdrawn with the process that wrote it.  Errors: those of
 * kvc_parallelism_register(), KVC_E_INVAL (bad origin), KVC_E_EXISTS. */
kvc_err kvc_parallelism_register_mirror(kvc_segment *seg, const char *role, uint32_t rank,
                                        const char *config_json, size_t config_len,
                                        const char *origin, uint64_t origin_generation,
                                        uint64_t expect_generation, uint64_t *gen_out);

/* Withdraw rank's parallelism config under role if it is still a mirrored
 * entry with generation expect_generation (KVC_GEN_ANY: any), with note.
 * Errors: as kvc_rank_withdraw_mirror() (KVC_E_NOENT also for a role not
 * in use). */
kvc_err kvc_parallelism_withdraw_mirror(kvc_segment *seg, const char *role, uint32_t rank,
                                        const char *note, uint64_t expect_generation);

/* kvc_rank_list() of role's parallelism configs (lock-free; info fields
 * untouched; session_id ""); a role not in use lists nothing.
 * Errors: KVC_E_INVAL (NULL, bad role), KVC_E_CORRUPT. */
kvc_err kvc_parallelism_list(kvc_segment *seg, const char *role, kvc_rank_info *out, size_t cap,
                             size_t *count, int include_withdrawn);

/* Names of the roles in use, the default role first, into
 * names[0..cap-1]; *count receives how many are in use.  Lock-free.
 * Errors: KVC_E_INVAL (NULL). */
kvc_err kvc_role_names(kvc_segment *seg, char (*names)[KVC_ROLE_NAME_MAX + 1], size_t cap,
                       size_t *count);

/* ---- Rooms: KVPoll state and failure records -------------------------
 *
 * A bootstrap room is one request's KV transfer, followed by every TP rank
 * of the instance.  Each participant writes its local KVPoll state; the
 * room's state is the minimum over participants (one that has not written
 * counts as Bootstrapping), so Failed from any rank wins and Success needs
 * all - the answer sglang gets from an all-reduce with MIN.  Terminal states
 * are sticky.  The first failure recorded wins and every rank reads that
 * same record.  All room calls are process- and thread-safe.  The room
 * table is split into 64 stripes by a hash of the room id, each with its
 * own robust lock: an update takes its room's stripe lock (bounded by the
 * lock timeout) and keeps an undo record that recovery rolls back if the
 * writer dies mid-way, so ranks updating rooms of different stripes do not
 * wait for each other.  Readers (kvc_room_get, kvc_room_list,
 * kvc_failures_recent) take no lock: they copy under a sequence counter and
 * retry; one that keeps seeing a writer inside (a dead one) takes the lock,
 * which recovers the room.
 */

/* KVPoll states, with the numbers sglang uses. */
typedef enum kvc_poll {
    KVC_POLL_FAILED = 0,
    KVC_POLL_BOOTSTRAPPING = 1,
    KVC_POLL_WAITING_FOR_INPUT = 2,
    KVC_POLL_TRANSFERRING = 3,
    KVC_POLL_SUCCESS = 4
} kvc_poll;

/* Name of a KVPoll state ("Failed", "Bootstrapping", "WaitingForInput",
 * "Transferring", "Success"; "Unknown" otherwise).  Static storage. */
const char *kvc_poll_name(kvc_poll state);

/* Role of a participant in a room. */
typedef enum kvc_room_role {
    KVC_ROOM_ROLE_UNSPECIFIED = 0,
    KVC_ROOM_ROLE_PREFILL = 1, /* sender of KV pages */
    KVC_ROOM_ROLE_DECODE = 2   /* receiver of KV pages */
} kvc_room_role;

/* Largest bootstrap room id: ids are 0..2^63-1 on every interface (this
 * library, kvcoordd's HTTP API, kvcoord-diag's text and JSON), so an id fits
 * a JSON integer and a signed 64-bit integer everywhere.  Every room function
 * refuses a larger id with KVC_E_INVAL. */
#define KVC_ROOM_ID_MAX 0x7fffffffffffffffull

/* Most participants a room can have (TP ranks of one instance on a node). */
#define KVC_ROOM_MAX_PARTICIPANTS 32

/* Longest failure reason kept, in bytes, excluding the NUL; longer reasons
 * are truncated on a UTF-8 character boundary. */
#define KVC_REASON_MAX 255

/* Longest node name (a cluster's --node), bytes, excluding the NUL. */
#define KVC_NODE_NAME_MAX 63

/* origin_rank of a failure no rank recorded: a room that timed out (no
 * update for the room TTL).  It is another rank's failure for every rank. */
#define KVC_ORIGIN_RANK_NONE UINT32_MAX

/* A failure record as a rank sees it. */
typedef struct kvc_failure_info {
    uint64_t room;            /* bootstrap room id */
    uint32_t origin_rank;     /* rank that recorded the failure, or
                                 KVC_ORIGIN_RANK_NONE (the room timed out) */
    int32_t origin_pid;       /* process that recorded it (0 if over HTTP) */
    int32_t code;             /* errno, RDMA WC status, or 0 */
    uint64_t time_ns;         /* when it was recorded */
    int is_from_another_rank; /* 1 when the asking rank is not the origin */
    char reason[KVC_REASON_MAX + 1];
    /* The node where it was recorded ("" outside a cluster: kvcoordd
     * without --etcd), and 1 when that is another node than this segment's
     * (the record was mirrored from it by kvcoordd's cluster view). */
    char origin_node[KVC_NODE_NAME_MAX + 1];
    int from_another_node;
} kvc_failure_info;

/* A room as read by kvc_room_get(). */
typedef struct kvc_room_info {
    uint64_t room;
    kvc_poll state; /* the room's state (minimum, terminal sticky) */
    uint32_t participants;
    uint32_t joined;   /* participants that opened the room */
    uint32_t released; /* participants that released it */
    uint64_t opened_ns;
    uint64_t updated_ns;
    int8_t local[KVC_ROOM_MAX_PARTICIPANTS]; /* each rank's own KVPoll; -1 unwritten */
    int has_failure;
    kvc_failure_info failure; /* valid when has_failure */
} kvc_room_info;

/* Open bootstrap room `room` as participant `rank` (0..participants-1) with
 * a role.  participants 0 means the segment's world size.  The first opener
 * creates the room; later openers must give the same count (or 0).  Opening
 * again from the same rank is a no-op.  Records this process (pid + start
 * time) as the rank's participant, for liveness checks.
 * Errors: KVC_E_INVAL (room > KVC_ROOM_ID_MAX, role outside the enum,
 * participants > KVC_ROOM_MAX_PARTICIPANTS, rank out of range: "rank R
 * out of range for room ID: it has N participants (ranks 0..N-1)", with
 * "; participants 0 means the segment's world size, N" when 0 was passed,
 * count differing from the room's), KVC_E_FULL (as many active rooms
 * as the segment's max rooms, none of them evictable), KVC_E_BUSY,
 * KVC_E_NOTRECOVERABLE.  A full table (or stripe) first evicts the oldest
 * Failed room that no participant ever joined (a failure reported,
 * kvc_room_fail(), for a room nobody opened; its record stays in the
 * failure ring): such reports cannot fill the table against new rooms.
 * Joined rooms are never evicted.  Opening an evicted room later finds it
 * Failed with its record while the ring (KVC_FAILURE_RING) still holds it. */
kvc_err kvc_room_open(kvc_segment *seg, uint64_t room, uint32_t participants, uint32_t rank,
                      kvc_room_role role);

/* Set rank's local KVPoll state in room.  Setting KVC_POLL_FAILED without a
 * failure recorded records one ("rank N reported Failed", code 0).  Once
 * the room is terminal (Failed, or Success from all) further writes are
 * accepted and ignored.  Before that, the rank's state is the last one
 * written, lower or higher (sglang only moves a rank's state forward; this
 * call does not police it), and any handle may set any participant's state
 * (kvcoordd does so for HTTP clients), whether or not that rank opened the
 * room.  Wakes kvc_room_wait()ers.
 * Errors: KVC_E_INVAL (state out of 0..4, rank out of range, room >
 * KVC_ROOM_ID_MAX), KVC_E_NOENT
 * (no such room), KVC_E_BUSY, KVC_E_NOTRECOVERABLE. */
kvc_err kvc_room_set_state(kvc_segment *seg, uint64_t room, uint32_t rank, kvc_poll state);

/* Record a failure of room from origin_rank (a participant of the room:
 * below its participant count, or the segment's world size when the room
 * does not exist yet; KVC_ORIGIN_RANK_NONE is refused: only a room TTL
 * records it): reason (NUL-terminated, may be
 * NULL; truncated to KVC_REASON_MAX bytes), code (errno or RDMA WC status).
 * The first record wins; later ones change nothing.  Creates the room (with
 * the world size as participant count) if it does not exist, so a failure
 * reported from another node is not lost.  *kept (may be NULL) is 1 when
 * this call's record is the one kept.  Wakes waiters.
 * Errors: KVC_E_INVAL (origin_rank >= max ranks, or >= the room's
 * participants / the world size: "rank R out of range for room ID: it
 * has N participants (ranks 0..N-1)"; nothing is recorded or created, room >
 * KVC_ROOM_ID_MAX), KVC_E_FULL, KVC_E_BUSY, KVC_E_NOTRECOVERABLE. */
kvc_err kvc_room_fail(kvc_segment *seg, uint64_t room, uint32_t origin_rank, int32_t code,
                      const char *reason, int *kept);

/* Read room as asking_rank sees it (asking_rank only sets
 * failure.is_from_another_rank; pass -1 for an outside observer, which
 * counts as another rank).  Takes no lock and makes no system call in the
 * common case: the room is copied under its sequence counter (never a torn
 * room).  Before answering, checks the liveness of every participant that
 * has not released the room: from the process table's dead marks while a
 * watcher beats (kvc_proc_watch_beat: kvcoordd), else from /proc (pid +
 * start time, at most every 100 ms per participant, outside any lock), so
 * detection does not depend on kvcoordd; a dead one fails the room (then
 * the room's stripe lock is taken) with a reason naming its rank, pid and
 * how it ended.  A room idle for longer than the TTL (CLOCK_MONOTONIC)
 * fails with a timeout reason.
 * Errors: KVC_E_INVAL (NULL, room > KVC_ROOM_ID_MAX), KVC_E_NOENT (no such
 * room, or reclaimed), KVC_E_BUSY, KVC_E_NOTRECOVERABLE. */
kvc_err kvc_room_get(kvc_segment *seg, uint64_t room, int32_t asking_rank, kvc_room_info *out);

/* Wait until room's state differs from `known` (or it gains a failure
 * record), up to timeout_ms, sleeping on the shared futex epoch of the
 * room's stripe (no polling; liveness re-checked every 200 ms); *out
 * receives the room as kvc_room_get() reads it.
 * Errors: those of kvc_room_get(), KVC_E_INVAL (known out of 0..4),
 * KVC_E_TIMEDOUT. */
kvc_err kvc_room_wait(kvc_segment *seg, uint64_t room, int32_t asking_rank, kvc_poll known,
                      uint32_t timeout_ms, kvc_room_info *out);

/* The node-local replacement of sglang's poll all-reduce, for n rooms at
 * once: for each i in order, set rank's own state in rooms[i] to states[i]
 * (skipped when states is NULL), then check the room (dead participants,
 * TTL, as kvc_room_get()) and read its state (the minimum over its
 * participants, terminal states sticky) into out[i].  Each update takes its
 * room's stripe lock; each read takes none and makes no system call (as
 * kvc_room_get()).  Unlike an all-reduce
 * it does not wait for the other ranks.  *failed_at (may be NULL) receives
 * the index of the room an error is about; rooms before it were updated.
 * Errors: KVC_E_INVAL (NULL, room id or state out of range, rank not a
 * participant of a room), KVC_E_NOENT (no such room), KVC_E_BUSY,
 * KVC_E_NOTRECOVERABLE. */
kvc_err kvc_room_sync(kvc_segment *seg, uint32_t rank, size_t n, const uint64_t *rooms,
                      const kvc_poll *states, kvc_poll *out, size_t *failed_at);

/* Record, for room, the failure that won cluster-wide (kvcoordd's cluster
 * view: the first record of any node, from etcd): like kvc_room_fail(), but
 * a different record already kept here is replaced by this one (reason,
 * origin_rank, code, time_ns as given; origin pid 0), so every node reads
 * the same record.  Creates the room if it does not exist.  *changed (may
 * be NULL) is 1 when the room's record changed.  Wakes waiters.
 * origin_rank may be KVC_ORIGIN_RANK_NONE (a room that timed out there).
 * Errors: KVC_E_INVAL (NULL, origin_rank >= max ranks and not
 * KVC_ORIGIN_RANK_NONE, room > KVC_ROOM_ID_MAX), KVC_E_FULL,
 * KVC_E_BUSY, KVC_E_NOTRECOVERABLE. */
kvc_err kvc_room_fail_adopt(kvc_segment *seg, uint64_t room, uint32_t origin_rank, int32_t code,
                            const char *reason, uint64_t time_ns, int *changed);

/* Record, for f->room, a failure record mirrored from another node
 * (kvcoordd's cluster view), keeping its provenance: f->origin_rank,
 * origin_pid, code, reason, time_ns (0: now) and origin_node (the node it
 * was recorded on; required) as given, marked as from another node
 * (kvc_failure_info.from_another_node).  Like kvc_room_fail_adopt(), a
 * different record kept here is replaced, the room is created if it does
 * not exist, and *changed (may be NULL) is 1 when the room's record
 * changed.  Wakes waiters.  Process- and thread-safe.
 * Errors: KVC_E_INVAL (NULL, room > KVC_ROOM_ID_MAX, origin_rank >= max
 * ranks and not KVC_ORIGIN_RANK_NONE, origin_node empty or not 1..63 bytes
 * of [A-Za-z0-9._-]), KVC_E_FULL, KVC_E_BUSY, KVC_E_NOTRECOVERABLE. */
kvc_err kvc_room_fail_mirror(kvc_segment *seg, const kvc_failure_info *f, int *changed);

/* Like kvc_room_fail_mirror(), but a failure record the room has already
 * (of this node or mirrored) is kept and nothing changes: f is taken only
 * by a room without one (created if it does not exist).  kvcoordd applies
 * a failure pushed by a peer node this way, so that a record etcd already
 * settled (the first of the cluster) is never replaced by a late push.
 * *changed (may be NULL) is 1 when f was taken.  Process- and thread-safe.
 * Errors: as kvc_room_fail_mirror(). */
kvc_err kvc_room_fail_mirror_first(kvc_segment *seg, const kvc_failure_info *f, int *changed);

/* Name this segment's node in a cluster (kvcoordd --etcd --node NAME):
 * every failure recorded on the segment from then on carries it
 * (kvc_failure_info.origin_node), and the reasons kvcoord writes itself
 * name it ("rank 1 (pid 42 on node A) killed by signal 9 (Killed)").
 * node "" or NULL: none (the default; reasons without a node).  Process-
 * and thread-safe; a reader racing the change sees the old name or the new.
 * Errors: KVC_E_INVAL (NULL seg, node longer than KVC_NODE_NAME_MAX bytes
 * or not of [A-Za-z0-9._-]). */
kvc_err kvc_segment_set_node(kvc_segment *seg, const char *node);

/* Current value of the rooms' failure epoch (bumped whenever a room gains
 * or changes its failure record, and when a room lock is recovered;
 * wrapping).  Use with kvc_room_wait_change().  NULL seg: returns 0 and sets
 * kvc_last_error(). */
uint32_t kvc_room_epoch(kvc_segment *seg);

/* Sleep until the rooms' epoch differs from seen or timeout_ms passes
 * (shared futex, no polling).  Errors: KVC_E_INVAL (NULL), KVC_E_TIMEDOUT. */
kvc_err kvc_room_wait_change(kvc_segment *seg, uint32_t seen, uint32_t timeout_ms);

/* Write into buf (cap bytes, always NUL-terminated when cap > 0) the error
 * text a rank raises for a failed room, naming the room, the origin rank
 * and the real reason, e.g. "KV transfer of room 42 failed on rank 5
 * (another rank; code 110): timed out".  With f->is_from_another_rank
 * negative the reader is no rank (an outside observer, e.g. an HTTP
 * client): "... failed on rank 5 (code 110): timed out".  Returns the length it would have
 * written, as snprintf.  buf NULL: nothing is written (any cap).  f NULL:
 * the text is "no failure record". */
int kvc_failure_text(const kvc_failure_info *f, char *buf, size_t cap);

/* Release room for rank.  Once every participant released it the room is
 * reclaimed.  Errors: KVC_E_INVAL, KVC_E_NOENT, KVC_E_BUSY,
 * KVC_E_NOTRECOVERABLE. */
kvc_err kvc_room_release(kvc_segment *seg, uint64_t room, uint32_t rank);

/* Reclaim rooms idle for longer than the segment's room TTL (a non-terminal
 * one is first failed with a timeout reason).  *reclaimed (may be NULL)
 * receives how many.  Errors: KVC_E_INVAL (NULL seg), KVC_E_BUSY,
 * KVC_E_NOTRECOVERABLE. */
kvc_err kvc_room_sweep(kvc_segment *seg, size_t *reclaimed);

/* List live rooms into out[0..cap-1] (no liveness check, no lock: each
 * room read whole under its sequence counter), optionally only those in
 * state_filter (-1: all; else a kvc_poll value 0..4).  *count receives the
 * number matching, which may exceed cap.  Errors: KVC_E_INVAL (NULL,
 * state_filter out of -1..4), KVC_E_BUSY (a dead writer's room could not be
 * recovered in time). */
kvc_err kvc_room_list(kvc_segment *seg, int state_filter, kvc_room_info *out, size_t cap,
                      size_t *count);

/* Failure records kept in the segment's ring, whatever happens to their rooms. */
#define KVC_FAILURE_RING 1024

/* The most recent failure records, newest first, from the ring of the last
 * KVC_FAILURE_RING records (kept even after their rooms are reclaimed).
 * is_from_another_rank is 1 in every record returned.  *count receives how
 * many were written (<= cap).
 * Errors: KVC_E_INVAL, KVC_E_BUSY, KVC_E_NOTRECOVERABLE. */
kvc_err kvc_failures_recent(kvc_segment *seg, kvc_failure_info *out, size_t cap, size_t *count);

/* ---- Collectives ------------------------------------------------------ */

/* Groups that can exist at once in a segment.  A group comes into being at
 * its first call and takes a slot until every member process has died or
 * left the segment (closed its handle); then the slot is reclaimed by the
 * next new group that needs one, or re-formed by the next call of the same
 * id (kvc_allreduce_min: epochs). */
#define KVC_COLL_GROUPS 32

/* Largest group: ranks 0..KVC_COLL_MAX_SIZE-1. */
#define KVC_COLL_MAX_SIZE 64

/* Bytes reduced per round: a longer vector is reduced in rounds of this
 * many bytes (ceil(len / KVC_COLL_CHUNK) rounds, one for len 0), each a
 * generation of the group. */
#define KVC_COLL_CHUNK 512

/* Why a collective call failed, for callers that need more than the
 * message (the Python binding's CollectiveError.ranks / .dead). */
typedef struct kvc_coll_failure {
    uint64_t group;      /* the group id */
    uint64_t generation; /* the group's generation (round) that failed */
    uint64_t ranks;      /* bit r set: rank r died or left (dead), or did not
                            arrive in time (not dead) */
    int dead;            /* 1: the ranks died or left; 0: they did not arrive */
    int32_t pid;         /* the pid of the lowest rank in ranks, 0 if unknown */
    uint32_t timeout_ms; /* the timeout that ran out (not dead) */
} kvc_coll_failure;

/* Element-wise MIN all-reduce of a uint8 vector over the `size` ranks of
 * group `group` (any id the ranks agree on) in this segment: every rank
 * 0..size-1 calls it with its own vec of len bytes, and on KVC_OK each
 * rank's vec holds, for every i, the minimum of vec[i] over all ranks'
 * vectors of the same call.  The call returns once every rank arrived (or
 * on failure): it spins briefly, then sleeps on a shared futex in the
 * segment (no lock is held while waiting; the procs lock is taken only the
 * first time a process calls as a rank of a group, and to create or
 * re-form a group).  timeout_ms: how long to wait for the others,
 * CLOCK_MONOTONIC.
 *
 * Matching.  Every call is one round or more (one per KVC_COLL_CHUNK
 * bytes); each member counts its own rounds from 0 in the group's epoch,
 * every round that reached the group counting whatever its outcome
 * (completed, failed, given up by the peers before this rank came), and a
 * round completes only when all `size` ranks arrived at the same count.  So
 * the k-th call of every rank reduces together or fails - never with
 * another call.  Calls refused before they reach the group (the argument
 * errors of KVC_E_INVAL below, KVC_E_FULL, KVC_E_BUSY) do not count.
 *
 * Membership (epochs).  One process (the process table's entry: pid and
 * start time) holds each rank, through any of its handles; threads of that
 * process may call as different ranks at once, but not as the same rank.
 * A process's first call as a rank joins the group:
 *  - if no process that holds a rank of the group lives (the group is new,
 *    or every member died or closed its segment handle: a whole TP group
 *    restarted on the same segment), the group is (re)formed: a new epoch,
 *    of the caller's size, every rank unclaimed and counting from 0;
 *  - else the caller takes an unclaimed rank of the current epoch (its
 *    count starts at 0 too); the size must be the epoch's, and a rank held
 *    by another live process is refused;
 *  - a process cannot take the place of a member that died or left while
 *    other members of its epoch live (the survivors' calls and its own
 *    would count from different starts): KVC_E_PEER, naming the gone rank
 *    and the live ones ("rank 3 of group 0x2a cannot be joined: rank 3 of
 *    its epoch 1 died (...) while ranks 0, 1, 2 still live ...").
 * Once a member of an epoch died or left (or stayed inside a round past a
 * peer's timeout while alive), the epoch is broken: the round in progress
 * fails on every rank naming it, and so does every later call of the
 * epoch, at once (KVC_E_PEER, "...; no call of the group can complete
 * without it: the group is re-formed once all its ranks died or left"),
 * until its last member died or left; then the next call re-forms it.  A
 * rank that merely did not arrive within a peer's timeout does not break
 * the epoch: that round fails (KVC_E_TIMEDOUT) on every rank that takes
 * part in it, the late rank's included when it arrives, and the next round
 * works again.  The handle must be recorded in the process table (opened
 * with a role other than KVC_ROLE_NONE) and used by the process that
 * opened it.
 *
 * Failure (every rank of the failed call gets it):
 *  - KVC_E_PEER: a member died or left before the round completed:
 *    "rank 3 of group 0x2a died (pid 1234, killed by signal 9 (Killed))
 *    (generation 17)", or "... left (pid 1234 closed its segment handle or
 *    was reaped)"; noticed after about 5 ms of waiting (the member's
 *    process-table liveness lock, then every 10 ms; kvcoordd's dead mark at
 *    the next wake-up); later calls of the epoch fail at once the same way
 *    (above); a process that would join an epoch with a gone member and
 *    live ones (above).
 *  - KVC_E_TIMEDOUT: a member did not arrive within the timeout of a rank
 *    that waited for it: "rank 3 of group 0x2a did not arrive within 30000
 *    ms (generation 17)", or, when the lowest such rank's process (of this
 *    PID namespace) is stopped, "... within 30000 ms: rank 3: its process
 *    42 is stopped (state T: SIGSTOP, or a debugger) (generation 17)"; a
 *    rank that arrives at a round its peers gave up
 *    fails at once with their reason ("...; this rank arrived after its
 *    peers gave up the call"); a member that stayed inside an earlier
 *    round past the timeout while alive ("stayed inside an earlier round",
 *    which breaks the epoch).
 *  - KVC_E_INVAL: NULL seg, or vec NULL with len > 0; size 0 or above
 *    KVC_COLL_MAX_SIZE; rank >= size; size differing from the epoch's
 *    ("rank 1 of group 0x2a called with size 4, the group's ranks with size
 *    8: a size mismatch ..."; when that rank is not held by a live process
 *    the epoch is broken by it: the round in progress and every later call
 *    fail at once on every rank with the same message, until its processes
 *    are gone); a len or size differing
 *    between the ranks of one call (every rank of the call gets it, naming
 *    both: "rank 2 called with len 32, rank 0 with len 64"; the round
 *    counts); the rank held by another live process, or called from two
 *    threads at once; a handle without a process table entry or inherited
 *    across fork().
 *  - KVC_E_FULL: KVC_COLL_GROUPS groups with a live member exist.
 *  - KVC_E_BUSY, KVC_E_NOTRECOVERABLE: the procs lock (joining only).
 * On failure vec is unchanged when len <= KVC_COLL_CHUNK; a longer one
 * holds the MIN in the chunks whose rounds completed.  A process SIGKILLed
 * at any point of a call leaves the other groups usable and its own group
 * re-formable (the others' round fails naming it, as above).
 * Thread-safe. */
kvc_err kvc_allreduce_min(kvc_segment *seg, uint64_t group, uint32_t size, uint32_t rank,
                          uint8_t *vec, size_t len, uint32_t timeout_ms);

/* kvc_allreduce_min(), and on KVC_E_PEER or KVC_E_TIMEDOUT *why (may be
 * NULL) says which ranks and how; on any other result *why is zeroed. */
kvc_err kvc_allreduce_min_ex(kvc_segment *seg, uint64_t group, uint32_t size, uint32_t rank,
                             uint8_t *vec, size_t len, uint32_t timeout_ms, kvc_coll_failure *why);

/* How a collective call waits and what it is (kvc_allreduce_min_opt,
 * kvc_poll_allreduce).  Zero-initialise, then set what you need. */
typedef struct kvc_coll_opts {
    uint32_t timeout_ms; /* as kvc_allreduce_min's timeout_ms */
    /* What the caller is doing, 0..65535 (kvc_allreduce_min's calls are
     * kind 0): every rank of a round must give the same kind, else that
     * round fails at once on every rank with KVC_E_INVAL naming the first
     * rank whose kind (or len) differs from rank 0's - two ranks calling
     * different collectives in the same step are told so, never reduced
     * together. */
    uint32_t kind;
    /* NULL, or called (with stop_arg) while the call waits for its peers,
     * from the waiting thread, after each wake-up that did not end the
     * wait: at least every 10 ms, at once after kvc_coll_wake() or a signal
     * that interrupted the wait.  Nonzero: the call gives up - a round it
     * arrived at is aborted (its peers fail that round at once with
     * KVC_E_TIMEDOUT, "rank R ... gave up the call"; the group's next round
     * works) - and returns KVC_E_TIMEDOUT ("stopped by its caller"), unless
     * the round completed meanwhile (then KVC_OK).  A call stopped before it
     * arrived does not count.  It may take locks of its own (the Python
     * binding takes the GIL to run the signal handlers: Ctrl-C), never call
     * into this segment. */
    int (*stop)(void *stop_arg);
    void *stop_arg;
} kvc_coll_opts;

/* kvc_allreduce_min_ex() waiting as opts says (NULL: 30 s, kind 0, no
 * stop).  len must be below 2^48.  Errors: those of kvc_allreduce_min,
 * and KVC_E_INVAL for a kind above 65535 or a kind differing between the
 * ranks of one round. */
kvc_err kvc_allreduce_min_opt(kvc_segment *seg, uint64_t group, uint32_t size, uint32_t rank,
                              uint8_t *vec, size_t len, const kvc_coll_opts *opts,
                              kvc_coll_failure *why);

/* A room id meaning "no room" in kvc_poll_allreduce's rooms. */
#define KVC_ROOM_NONE UINT64_MAX

/* sglang's poll agreement, in one call: polls[0..n) are this rank's KVPoll
 * values (0..4) for the step; for each i with rooms[i] != KVC_ROOM_NONE
 * (a room this process follows in the segment) and polls[i] not Failed,
 * the room is read (kvc_room_get: its participants' liveness, the TTL)
 * and, when kvcoord itself failed it (Failed with a record no rank process
 * made: a participant died, the room TTL passed; also found in the ring of
 * recent failures once the room was reclaimed), polls[i] becomes Failed
 * (0); then the element-wise MIN of polls over the group's ranks
 * (kvc_allreduce_min_opt) is written back into polls.  rooms may be NULL
 * (no room followed).  A room that cannot be read is left as polled.
 * A room a call of this thread found not failed by kvcoord is not read
 * again for at most 100 ms (the period of a reader's own liveness checks)
 * while no failure record is written in the segment (kvc_room_epoch: with
 * kvcoordd running, it fails a dead process's rooms as it reaps it), no
 * process attaches or leaves it, and no such room's TTL can have passed:
 * any of these, and the next call reads every room again.  Without
 * kvcoordd, a participant's death is so found at most 200 ms after it.
 * Allocates nothing (but once per reclaimed room looked up in the ring).
 * Errors: those of kvc_allreduce_min_opt.  Thread-safe as it is. */
kvc_err kvc_poll_allreduce(kvc_segment *seg, uint64_t group, uint32_t size, uint32_t rank,
                           uint8_t *polls, const uint64_t *rooms, size_t n,
                           const kvc_coll_opts *opts, kvc_coll_failure *why);

/* A hint before kvc_poll_allreduce(): start loading into the CPU's cache,
 * without waiting, the i-th room (in fold order: i-th of the rooms[] it
 * read) of the calling thread's last kvc_poll_allreduce() on seg.  A caller
 * that makes its polls one at a time before the call (the Python binding
 * calls each poller's poll()) calls it with i = 0, 1, ... as it goes: a
 * step's rooms are mostly the last step's, and the fold then finds them in
 * cache instead of waiting for each.  Changes no result and no state: seg
 * is only compared with that call's handle and never read, so a closed
 * handle, a reclaimed room or an i past those rooms costs nothing.  Never
 * fails.  Thread-safe (per thread, no lock). */
void kvc_poll_prefetch(const kvc_segment *seg, size_t i);

/* Claim rank of group as the first kvc_allreduce_min call would (create
 * or re-form the group, or join its epoch), without a round: lets the ranks
 * of a group learn before their first round whether each can take part,
 * and agree on another path when one cannot.  Errors: the joining errors
 * of kvc_allreduce_min (KVC_E_INVAL, KVC_E_PEER, KVC_E_FULL, KVC_E_BUSY,
 * KVC_E_NOTRECOVERABLE).  A size differing from a live group's breaks the
 * group's epoch (as kvc_allreduce_min's does). */
kvc_err kvc_coll_join(kvc_segment *seg, uint64_t group, uint32_t size, uint32_t rank);

/* Wake every thread of every process sleeping in a collective call of seg:
 * each re-checks its round and asks its stop hook (kvc_coll_opts.stop)
 * at once.  For a closing handle (the Python binding's close()).  NULL
 * seg: nothing.  Thread-safe; makes one system call per group in use. */
void kvc_coll_wake(kvc_segment *seg);

/* ---- Attached processes -------------------------------------------- */

/* An entry of the process table. */
typedef struct kvc_proc_info {
    int32_t pid;    /* its pid in its own PID namespace (with start: its identity) */
    kvc_role role;  /* a worker once any of its handles is a worker's */
    int32_t rank;   /* last rank it registered or declared, -1 if none */
    uint64_t start; /* start time, clock ticks since the host's boot (proc(5) field 22,
                       its time namespace's boottime offset removed) */
    uint64_t attached_ns;
    int alive;         /* holds its liveness lock: an OFD lock on its entry in the segment
                          file, held while it has a handle open and released by the kernel
                          when it dies, whatever PID or time namespace it runs in */
    int32_t shown_pid; /* its pid as its /proc names it (the first of NSpid, proc(5)): the
                          host's pid when it sees the host's /proc; else pid.  For people */
    uint64_t pid_ns;   /* inode of its PID namespace (/proc/PID/ns/pid), 0 unknown: a pid
                          is only meaningful to a process of the same PID namespace */
    uint64_t time_ns;  /* inode of its time namespace (/proc/PID/ns/time), 0 unknown */
    uint32_t handles;  /* handles it has open on the segment (every copy of the library it
                          loaded: libkvcoord.so, the Python extension, ...) */
} kvc_proc_info;

/* List the process table into out[0..cap-1]; *count receives the number of
 * entries, which may exceed cap.  Errors: KVC_E_INVAL. */
kvc_err kvc_proc_list(kvc_segment *seg, kvc_proc_info *out, size_t cap, size_t *count);

/* Change counter of the process table (bumped on attach and detach).  NULL
 * seg: returns 0 and sets kvc_last_error(). */
uint32_t kvc_proc_epoch(kvc_segment *seg);

/* Sleep until the process table's epoch differs from seen or timeout_ms
 * passes (shared futex, no polling): how kvcoordd learns at once that a
 * process attached.  Errors: KVC_E_INVAL (NULL), KVC_E_TIMEDOUT. */
kvc_err kvc_proc_wait_change(kvc_segment *seg, uint32_t seen, uint32_t timeout_ms);

/* What the kernel says of a process (proc(5), /proc/PID/stat), as the
 * library itself reads it for liveness: the one parser of that file, for
 * kvcoordd's process watch too. */
typedef struct kvc_proc_stat {
    char state;      /* field 3: 'R', 'S', 'D', 'T', 'Z' (zombie), 'X' (dead), ... */
    uint64_t start;  /* field 22: start time, clock ticks since boot (kvc_proc_info.start) */
    int exit_status; /* field 52: a wait status, meaningful for a zombie; -1 when not shown */
} kvc_proc_stat;

/* Read pid's /proc/PID/stat into *out.  Thread-safe; a few microseconds.
 * Errors: KVC_E_INVAL (NULL out, pid <= 0), KVC_E_NOENT (no such process,
 * or its entry cannot be read or parsed). */
kvc_err kvc_proc_stat_read(int32_t pid, kvc_proc_stat *out);

/* Handle the death of process (pid, start): every non-terminal room it
 * participates in fails with a reason naming the rank, the pid and `how`
 * (e.g. "killed by signal 9"; NULL: determined here, from /proc if the
 * process is a zombie, else kvc_exit_unknown_text(start)), the ranks it
 * registered are withdrawn with a note saying so, and its process entry is
 * removed.  Safe to call more than once.  *rooms_failed and *ranks_withdrawn
 * (may be NULL) receive counts.
 * Errors: KVC_E_INVAL, KVC_E_BUSY, KVC_E_NOTRECOVERABLE. */
kvc_err kvc_proc_reap(kvc_segment *seg, int32_t pid, uint64_t start, const char *how,
                      size_t *rooms_failed, size_t *ranks_withdrawn);

/* kvc_proc_reap() every process of the table that is not alive.  *reaped
 * (may be NULL) receives how many.  Errors: those of kvc_proc_reap(). */
kvc_err kvc_proc_reap_dead(kvc_segment *seg, size_t *reaped);

/* How often a process watcher calls kvc_proc_watch_beat() (ms), and the
 * age (ms) past which readers no longer trust its beat. */
#define KVC_PROC_WATCH_BEAT_MS 100
#define KVC_PROC_WATCH_STALE_MS 500

/* Declare (watching non-zero) that the calling process watches the death
 * of every attached process and reaps each at once with kvc_proc_reap(),
 * which marks it dead in the process table before failing its rooms - as
 * kvcoordd's pidfd watch does.  While such beats are fresh (the last one
 * less than KVC_PROC_WATCH_STALE_MS old: call it every
 * KVC_PROC_WATCH_BEAT_MS), kvc_room_get() judges the liveness of
 * participants from those marks alone, with no system call; otherwise it
 * reads /proc (at most every 100 ms per participant).  So a watcher that
 * dies (SIGKILL) stops being trusted within KVC_PROC_WATCH_STALE_MS of its
 * last beat: a participant dead by then fails its rooms at the first read
 * past that (+ at most 100 ms), whatever the watcher missed.
 * watching 0: the caller stops watching (only clears its own beat).
 * Thread- and process-safe; no lock.  Errors: KVC_E_INVAL (NULL). */
kvc_err kvc_proc_watch_beat(kvc_segment *seg, int watching);

/* Tell this process's library how process (pid, start) ended: status is
 * its wait(2) status, as a watcher of it learnt it (kvcoordd reads it
 * from a pidfd with PIDFD_INFO_EXIT).  Texts that say how a process ended
 * (kvc_pd_reap()'s note, a room's failure reason) then use it where
 * /proc could not tell (a non-child, reaped already).  The last 256 told
 * are kept, in this process only.  Thread-safe.
 * Errors: KVC_E_INVAL (pid <= 0). */
kvc_err kvc_proc_exit_note(int32_t pid, uint64_t start, int status);

/* Describe a wait(2) status: "exited with status N" or "killed by signal N
 * (NAME)".  Writes at most cap bytes into buf (always NUL-terminated when
 * cap > 0); returns buf.  buf NULL or cap 0: nothing is written. */
char *kvc_wait_status_text(int status, char *buf, size_t cap);

/* The wall-clock time (CLOCK_REALTIME, ns since the epoch) at which a
 * process started, from start, its start time in clock ticks since boot
 * (kvc_proc_stat.start, kvc_proc_info.start: the host's clock).  Exact to
 * the tick (1/sysconf(_SC_CLK_TCK) s, 10 ms on Linux): never later than
 * the process's first instruction, as /proc rounds the tick down.  Follows
 * a wall-clock step made since (it is now minus the time since the start).
 * 0 when start is 0 or the clocks cannot be read.  Thread-safe; two
 * clock_gettime(2) calls.  The one conversion of start times to wall time
 * (kvc_exit_unknown_text(), kvcoord-diag). */
uint64_t kvc_proc_start_realtime_ns(uint64_t start);

/* Describe the end of a process whose exit status cannot be known: it is
 * not the caller's child (only its parent can wait(2) for it) and no zombie
 * holds the status any more (its parent reaped it, or it ran in another PID
 * namespace): "is gone (started 2026-12-02T01:02:03.456Z); not our child,
 * so its exit status is not known", the time in UTC to the millisecond from
 * start, the process's start time in clock ticks since boot
 * (kvc_proc_info.start; kvc_proc_start_realtime_ns(); 0 leaves the time
 * out).  At most 90 bytes.  The one wording of that case for the
 * library's room, collective and PD reasons, kvcoordd's logs and
 * kvc_proc_reap(how NULL).  Writes at most cap bytes into buf (always
 * NUL-terminated when cap > 0); returns buf.  buf NULL or cap 0: nothing is
 * written.  Thread-safe. */
char *kvc_exit_unknown_text(uint64_t start, char *buf, size_t cap);

#ifdef __cplusplus
}
#endif
#endif /* KVCOORD_KVCOORD_H */
