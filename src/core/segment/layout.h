/*
 * layout.h - the shared-memory segment's layout.  The one place that
 * defines it; every structure here lives in the segment and is addressed by
 * offsets (each process maps the segment at its own address).
 *
 *   [kvc_header | kvc_rank_entry x max_ranks x KVC_RANK_TABLES | kvc_proc x max_procs |
 *    kvc_room_stripe x KVC_ROOM_STRIPES | room index entry x room_slots | kvc_room x room_slots |
 *    kvc_failure_slot x KVC_FAILURE_RING | kvc_coll_group x KVC_COLL_GROUPS | kvc_pd_region |
 *    arena bitmap | arena (info blobs, KVC_BLOCK-byte blocks)]
 *
 * Any change here must bump KVC_LAYOUT_VERSION (kvcoord.h); the header also
 * records every structure's size, so a build whose structures differ (other
 * compiler, other glibc mutex size) refuses the segment instead of misreading it.
 */
#ifndef KVC_LAYOUT_H
#define KVC_LAYOUT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "kvcoord/kvcoord.h"

#define KVC_MAGIC 0x31445243564b4f43ull /* "COKVCRD1" little-endian */
#define KVC_BLOCK 1024u                 /* arena allocation unit, bytes */
#define KVC_ALIGN 4096u                 /* alignment of each region, bytes */

/* A robust process-shared mutex and what diagnostics need about its holder.
 * owner_pid/owner_start are written right after locking and cleared right
 * before unlocking; they are advisory (a crash between the two leaves them
 * stale, which the robust mutex itself does not care about). */
typedef struct kvc_lock {
    pthread_mutex_t mutex;
    _Atomic int32_t owner_pid;
    uint32_t pad;
    _Atomic uint64_t owner_start; /* owner's start time, clock ticks since boot */
    _Atomic uint64_t recoveries;  /* EOWNERDEAD recoveries of this lock */
} kvc_lock;

/* The rank entries form KVC_RANK_TABLES tables of max_ranks entries each:
 * table kind * KVC_RANK_ROLES + role holds, for role index `role` (0 = the
 * default role), the transfer-engine info (kind 0) or the parallelism
 * config (kind 1) of every rank.  Table 0 is the rank table.  All of them
 * share the ranks lock, the arena and the rank epoch. */
#define KVC_RANK_TABLES (2 * KVC_RANK_ROLES)
#define KVC_TABLE_PARALLELISM KVC_RANK_ROLES /* kind 1's first table */

/* The room table is split into KVC_ROOM_STRIPES stripes, each a table of
 * its own (stripe_slots slots) with its own robust mutex and undo record:
 * room id -> stripe = top bits of kvc__room_hash(id), so ranks updating
 * rooms of different stripes never wait for each other. */
#define KVC_ROOM_STRIPE_BITS 6
#define KVC_ROOM_STRIPES (1u << KVC_ROOM_STRIPE_BITS)

/* Lock ids: the two header locks, then one per room stripe
 * (KVC_LOCK_ROOMS + stripe).  kvc__lock_ptr() maps an id to its mutex. */
enum kvc_lock_id {
    KVC_LOCK_RANKS = 0,
    KVC_LOCK_PROCS = 1,
    KVC_LOCK_HEADER_COUNT = 2,
    KVC_LOCK_ROOMS = 2,                 /* stripe 0; stripe s is KVC_LOCK_ROOMS + s */
    KVC_LOCK_PD = 2 + KVC_ROOM_STRIPES, /* the PD bootstrap region (layout_pd.h) */
    KVC_LOCK_COUNT = 3 + KVC_ROOM_STRIPES
};

/* One half of a rank entry's double buffer.  Written only while inactive,
 * under the rank lock; published by storing its index into entry->active. */
typedef struct kvc_rank_slot {
    uint32_t state;   /* kvc_rank_state */
    uint32_t entries; /* top-level keys of weights_info_dict */
    uint64_t generation;
    uint64_t changed_ns;
    int32_t pid;          /* process that made this change */
    uint32_t session_len; /* bytes, blob[0..session_len) */
    uint64_t pid_start;   /* that process's start time (ticks since boot) */
    uint64_t blob_off;    /* offset of the blob from the arena start, bytes */
    uint64_t blob_blocks; /* KVC_BLOCK blocks held by the blob; 0 = none */
    uint64_t info_len;    /* bytes, blob[session_len..session_len+info_len) */
    uint32_t owned;       /* 1: registered by a worker, withdrawn when it dies */
    uint32_t pad;
    char note[KVC_NOTE_MAX + 1];
    uint64_t origin_generation;      /* mirrored entry: its generation on the origin node */
    char origin[KVC_ORIGIN_MAX + 1]; /* mirrored entry: the origin node; "" = local */
} kvc_rank_slot;

/* A rank's entry.  Readers: s1 = seq (even), copy slot[active] and its blob,
 * re-read seq; equal → consistent.  Writer (rank lock held): fill
 * slot[!active] and its blob, seq odd, active = !active, seq even. */
typedef struct kvc_rank_entry {
    _Atomic uint64_t seq;
    _Atomic uint32_t active; /* 0 or 1 */
    uint32_t pad;
    kvc_rank_slot slot[2];
} kvc_rank_entry;

#define KVC_HOW_MAX 95 /* "killed by signal 9 (Killed)", ... */

/* Process table entry: one per attached process (not per handle), shared
 * by every copy of the library the process has loaded.  pid 0 = free.
 * Identity is (pid, start) as the process itself sees them, and for room
 * participants (slot, gen): gen is bumped every time the slot is given to
 * a process, so a participant whose slot's gen moved has left the table.
 * Liveness is the slot's liveness lock (liveness.c), never the pid: an OFD
 * lock on the entry's first byte, held through holder_fd by the process
 * while handles > 0.  dead is set (how written first) by kvc_proc_reap()
 * - kvcoordd's watch - before the process's rooms are failed, and by any
 * library that finds the entry's liveness lock free (a room read, a
 * collective): readers of rooms judge liveness from it without a system
 * call (and without their rate limit).  handles, flags and holder_fd change only under the procs lock. */
#define KVC_PROC_F_WORKER 1u /* a worker handle was opened: its ranks go with it */
#define KVC_PROC_F_ROOMS 2u  /* a room was opened through one of its handles */
typedef struct kvc_proc {
    _Atomic int32_t pid; /* its own (namespace's) pid */
    int32_t role;        /* kvc_role: a worker once any handle is a worker's */
    int32_t rank;        /* -1 if none */
    _Atomic uint32_t gen;
    uint64_t start; /* start time, clock ticks since the host's boot (/proc/pid/stat #22) */
    uint64_t attached_ns;
    _Atomic uint32_t dead; /* 1: seen dead and being reaped; how says how it ended */
    uint32_t pad;
    char how[KVC_HOW_MAX + 1];
    uint64_t pid_ns;          /* inode of its PID namespace, 0 unknown */
    uint64_t time_ns;         /* inode of its time namespace, 0 unknown */
    int32_t shown_pid;        /* its pid as its /proc names it (NSpid), shown to people */
    int32_t holder_fd;        /* the descriptor holding its liveness lock (its own fd table) */
    _Atomic uint32_t handles; /* handles it has open on the segment, every library copy */
    _Atomic uint32_t flags;   /* KVC_PROC_F_* */
} kvc_proc;

/* ---- rooms ---- */
enum { KVC_SLOT_FREE = 0, KVC_SLOT_USED = 1 };

typedef struct kvc_room_part {
    int32_t pid;  /* 0: has not opened the room */
    int8_t state; /* local KVPoll, -1 unwritten (counts as Bootstrapping) */
    uint8_t role; /* kvc_room_role */
    uint8_t released;
    uint8_t pad;
    uint64_t start;    /* the participant's start time, ticks since boot */
    int32_t proc_slot; /* its process table slot when it opened, -1 if none */
    uint32_t proc_gen; /* that slot's gen then */
} kvc_room_part;

typedef struct kvc_failure_rec {
    uint64_t room;
    uint64_t time_ns; /* CLOCK_REALTIME: shown to people */
    int32_t origin_rank;
    int32_t origin_pid;
    int32_t code;
    uint32_t flags; /* KVC__FAIL_* */
    char reason[KVC_REASON_MAX + 1];
    char node[KVC_NODE_NAME_MAX + 1]; /* origin node; "" outside a cluster */
} kvc_failure_rec;

/* kvc_failure_rec.flags: the record came from another node (mirrored by
 * kvcoordd's cluster view, kvc_room_fail_mirror). */
#define KVC__FAIL_OTHER_NODE 1u

/* A stripe's room table is two arrays of stripe_slots each: the index, an
 * open-addressing table of 8-byte entries (linear probing inside the
 * stripe from the id's home, tombstones turned back into free entries
 * whenever the next entry is free), and the rooms (kvc_room), where a room
 * may sit in any slot: its creator takes a free one from its own part of
 * the stripe's rooms (KVC_ROOM_PARTS parts, by process table slot) first,
 * so that a process's new room lands on lines it wrote itself.  An index
 * entry is KVC_IX_FREE, KVC_IX_TOMB, or (tag << 32 | (room slot + 2)),
 * tag = kvc__ix_tag(hash): written under the stripe lock with one atomic
 * store, read without a lock. */
#define KVC_IX_FREE 0ull
#define KVC_IX_TOMB 1ull
#define KVC_ROOM_PARTS 8u

/* A room slot.  slot is KVC_SLOT_USED while it holds a room, else
 * KVC_SLOT_FREE.  seq is the room's seqlock: odd while a writer (stripe
 * lock held) changes anything below it; readers copy, re-check, retry. */
typedef struct kvc_room {
    _Atomic uint32_t seq;
    uint32_t slot; /* KVC_SLOT_* */
    uint64_t id;
    uint32_t participants;
    int32_t terminal; /* -1, KVC_POLL_FAILED or KVC_POLL_SUCCESS: sticky */
    uint32_t has_failure;
    uint32_t ix;           /* while used: its index entry (0..stripe_slots-1) */
    uint64_t opened_ns;    /* CLOCK_REALTIME, shown */
    uint64_t updated_ns;   /* CLOCK_REALTIME, shown */
    uint64_t updated_mono; /* CLOCK_MONOTONIC (coarse): the TTL counts from it */
    /* The fields above fill one cache line; an update saves them and the
     * participants it has (part[0..participants)), and the failure record
     * only when it writes one. */
    kvc_room_part part[KVC_ROOM_MAX_PARTICIPANTS];
    kvc_failure_rec failure;
    /* Outside the seqlock: when a reader last read /proc for participant i
     * (CLOCK_MONOTONIC ms, wrapping), so that with no watcher each
     * participant is looked up at most once per KVC__LIVENESS_RECHECK_MS. */
    _Atomic uint32_t checked_ms[KVC_ROOM_MAX_PARTICIPANTS];
} __attribute__((aligned(64))) kvc_room;

/* A failure ring entry.  claim packs (seq << 32 | owner): seq odd while a
 * writer fills it, owner = 1 + the writer's stripe, so that stripe's
 * recovery can finish an entry its dead writer claimed; n = 1 + the index
 * (failures_total before the append) the entry holds, so an entry whose
 * append was rolled back, or not made, is told from the one wanted. */
typedef struct kvc_failure_slot {
    _Atomic uint64_t claim;
    uint64_t n;
    kvc_failure_rec rec;
} kvc_failure_slot;

/* Undo record of one stripe: the bytes an update is about to change (a
 * room slot, its index entry, and the failure ring entry it appends to), saved first and
 * marked valid last; recovery under EOWNERDEAD copies them back (the seq
 * words excepted, which it moves past the dead writer's value). */
typedef struct kvc_undo {
    _Atomic uint32_t valid;
    uint32_t rooms_live; /* the stripe's count before the update */
    uint64_t room_off;   /* from the segment start, bytes; 0 = none */
    uint64_t room_len;
    uint64_t ring_off; /* set before the entry is claimed; 0 = none */
    uint64_t ring_n;   /* 1 + the ring index claimed (failures_total after it) */
    /* The index entry the update rewrites (offset from the segment start,
     * 0 = none; stored after ix_old) and its value before. */
    _Atomic uint64_t ix_off;
    uint64_t ix_old;
    kvc_room room;
    kvc_failure_slot ring;
} kvc_undo;

/* One stripe of the room table: its lock, count, change epoch (a futex word
 * its room waiters sleep on; waiters counts them, so writers make no
 * system call when nobody waits) and undo record.  Cache-line aligned. */
typedef struct kvc_room_stripe {
    kvc_lock lock;
    _Atomic uint32_t epoch;
    _Atomic uint32_t waiters;
    uint32_t rooms_live; /* USED slots of the stripe; rebuilt by recovery */
    /* Failed rooms nobody joined evicted for a new room (kvc__room_evict;
     * a statistic: a writer dying in the eviction may leave it one low). */
    _Atomic uint32_t evicted;
    kvc_undo undo;
} __attribute__((aligned(64))) kvc_room_stripe;

/* ---- collectives (collective.c) ---- */

/* A collective group's round word packs, so that one CAS decides a round:
 * bits 0..6 the ranks that arrived at the round, bit 7 aborted, bits 8..13
 * the rank whose abort won, bit 14 / bits 15..20 the same two for the
 * previous round (kept when the next round opens, for a waiter that wakes
 * late), bits 21..63 the round's generation (mod 2^43). */
#define KVC_COLL_COUNT_MASK 0x7full
#define KVC_COLL_ABORTED (1ull << 7)
#define KVC_COLL_ABORTER_SHIFT 8
#define KVC_COLL_PREV_ABORTED (1ull << 14)
#define KVC_COLL_PREV_ABORTER_SHIFT 15
#define KVC_COLL_GEN_SHIFT 21
#define KVC_COLL_GEN_MASK ((1ull << 43) - 1)

/* One round's contribution of a member: written by the member only, before
 * it publishes seq = 2g + 1; double-buffered by the generation's parity,
 * and rewritten (generation g + 2) only once no member is still inside
 * generation g. */
typedef struct kvc_coll_part {
    uint64_t len; /* the whole call's len, bytes (in every round of the call) */
    unsigned char data[KVC_COLL_CHUNK];
} kvc_coll_part;

/* A member: rank r of the group.  owner = (process table gen << 32) |
 * (process table slot + 1), 0 = not claimed in this epoch; claimed under
 * the procs lock.  seq, written only by the owner: 2g + 1 from the moment
 * it published its part for generation g until it is done with it, then
 * 2g + 2; g is the member's own count of rounds in the epoch (every round
 * it started, completed or failed, counts).  The note is the reason the
 * member gives when it aborts a round or records the epoch broken:
 * written (note_gen UINT64_MAX while writing, then the round's generation)
 * before its abort CAS, read under that check. */
typedef struct kvc_coll_member {
    _Atomic uint64_t owner;
    _Atomic uint64_t seq;
    _Atomic int32_t pid;    /* the owner's pid, for messages */
    _Atomic uint32_t drain; /* 1: its last round did not complete; check peers first */
    _Atomic uint64_t note_gen;
    uint64_t note_ranks;   /* bit r: rank r died/left (dead) or did not arrive */
    uint32_t note_dead;    /* 0: did not arrive in time; 1: died or left; 2: stuck */
    int32_t note_pid;      /* pid of the lowest rank named, 0 if unknown */
    uint32_t note_timeout; /* ms, when not dead */
    uint32_t pad;
    char note_how[160]; /* "died (pid 12, killed by signal 9 (Killed))", ... */
    kvc_coll_part part[2];
} __attribute__((aligned(64))) kvc_coll_member;

enum { KVC_COLL_FREE = 0, KVC_COLL_CLAIMING = 1, KVC_COLL_READY = 2 };

/* broken: 0 while the epoch is whole; else (generation << 7) | (1 + rank):
 * that rank's note for that generation names the member that died, left or
 * got stuck, after which no call of the epoch can complete. */
#define KVC_COLL_BROKEN_RANK_BITS 7

/* A group slot.  state = (incarnation << 2) | KVC_COLL_*: set to CLAIMING,
 * filled and made READY under the procs lock (a CLAIMING slot seen under it
 * is a dead claimer's: free); looked up without a lock.  epoch counts the
 * times the slot was formed (a new group, or the same id re-formed once
 * none of its members lived): every member of an epoch starts at
 * generation 0.  round is the futex word (its low half changes at every
 * transition); sleepers has bit r set while rank r may sleep on it (a bit,
 * not a count, so that a sleeper killed asleep leaves nothing a peer cannot
 * clear: whoever sees rank r dead clears bit r). */
typedef struct kvc_coll_group {
    _Atomic uint64_t state;
    uint64_t id;
    uint32_t size;
    uint32_t pad;
    uint64_t created_ns;
    uint64_t epoch;
    _Atomic uint64_t broken;
    _Atomic uint64_t round __attribute__((aligned(64)));
    _Atomic uint64_t sleepers;
    uint64_t pad2[6];
    kvc_coll_member member[KVC_COLL_MAX_SIZE];
} __attribute__((aligned(64))) kvc_coll_group;

typedef struct kvc_header {
    /* Prefix kept identical in every layout version, so that any build can
     * name the other's version and tell whether its creator still runs. */
    _Atomic uint64_t magic; /* written last at creation: a half-built segment has none */
    uint32_t layout_version;
    uint32_t header_size;
    int32_t creator_pid;
    uint32_t pad1;
    uint64_t creator_start; /* creator's start time, ticks since boot */
    /* End of the stable prefix. */
    uint32_t rank_entry_size;
    uint32_t proc_size;
    uint32_t lock_size;
    uint32_t block_size;
    uint32_t room_size;
    uint32_t stripe_size;
    uint64_t total_size; /* bytes of the segment file */
    /* capacities, chosen at creation */
    uint32_t max_ranks;
    uint32_t max_procs;
    uint32_t world_size;
    uint32_t pad0;
    uint64_t max_info_bytes;
    uint64_t arena_bytes;
    uint64_t arena_blocks;
    /* region offsets from the segment start, bytes */
    uint64_t ranks_off;
    uint64_t procs_off;
    uint64_t bitmap_off;
    uint64_t arena_off;
    uint64_t created_ns;
    _Atomic uint64_t updated_ns;
    /* state */
    _Atomic uint32_t rank_epoch; /* futex word: bumped on every rank change */
    _Atomic uint32_t proc_epoch;
    _Atomic uint64_t arena_used_blocks; /* derived; rebuilt by recovery */
    _Atomic uint32_t ranks_registered;  /* derived; rebuilt by recovery */
    _Atomic uint32_t room_epoch;        /* futex word: bumped on every failure record */
    /* roles: names of the role tables in use (role_names[0] is
     * KVC_DEFAULT_ROLE); a name is written before roles_used counts it,
     * under the ranks lock, and never changes afterwards */
    _Atomic uint32_t roles_used;
    uint32_t pad_roles;
    char role_names[KVC_RANK_ROLES][KVC_ROLE_NAME_MAX + 1];
    /* rooms */
    uint32_t max_rooms;
    uint32_t room_slots;   /* KVC_ROOM_STRIPES x stripe_slots */
    uint32_t stripe_slots; /* slots of one stripe's table */
    uint32_t room_ttl_ms;
    uint64_t stripes_off;            /* KVC_ROOM_STRIPES kvc_room_stripe */
    uint64_t rooms_off;              /* stripe s's rooms: slots [s * stripe_slots, +stripe_slots) */
    uint64_t failures_off;           /* ring of KVC_FAILURE_RING kvc_failure_slot */
    _Atomic uint64_t failures_total; /* ring appends claimed, ever */
    uint64_t index_off;       /* stripe s's index: uint64 [s * stripe_slots, +stripe_slots) */
    uint64_t coll_off;        /* KVC_COLL_GROUPS kvc_coll_group */
    uint32_t coll_group_size; /* sizeof(kvc_coll_group) */
    uint32_t coll_pad;
    /* The process watcher (kvcoordd): while its beat (CLOCK_MONOTONIC ns)
     * is fresh, the process table's dead marks are trusted for liveness. */
    _Atomic int32_t watch_pid;
    /* Set (by kvc_open KVC_OPEN_FRESH_FORCE, kvc_unlink) before the segment
     * is unlinked: every call of a process still attached fails with
     * KVC_E_STALE instead of writing where nobody serves. */
    _Atomic uint32_t discarded;
    _Atomic uint64_t watch_beat_mono;
    kvc_lock locks[KVC_LOCK_HEADER_COUNT];
    /* Rooms reserved by creators: >= the rooms in use plus the handles'
     * credits (a writer that dies can only leave it higher); at max rooms
     * the exact count, the sum of the stripes' counts, decides.  Handles
     * take and give back reservations in batches (rooms_table.c, reserve_room),
     * and it sits alone on its cache line, so that room opens and
     * releases do not evict the read-mostly fields above from the other
     * processes' caches. */
    _Atomic uint32_t rooms_reserved __attribute__((aligned(64)));
    uint32_t pad_reserved[15];
    /* The PD bootstrap region (layout_pd.h), from the segment start. */
    uint64_t pd_off;
    uint32_t pd_size; /* sizeof(kvc_pd_region) */
    uint32_t pad_pd;
    /* This node's name in a cluster (kvc_segment_set_node: kvcoordd --etcd),
     * "" outside one: the failures recorded here carry it.  Written under
     * node_seq (odd while written), read by copying under it. */
    _Atomic uint32_t node_seq;
    uint32_t pad_node;
    char node_name[KVC_NODE_NAME_MAX + 1];
} kvc_header;

#include "layout_pd.h"

/* The cache-line claims above, held by the compiler. */
_Static_assert(offsetof(kvc_room, part) <= 64, "a room's fixed fields fill one cache line");
_Static_assert(sizeof(kvc_room) % 64 == 0 && _Alignof(kvc_room) == 64, "rooms are line-aligned");
_Static_assert(sizeof(kvc_room_stripe) % 64 == 0 && _Alignof(kvc_room_stripe) == 64,
               "stripes are line-aligned");
_Static_assert(sizeof(kvc_coll_member) % 64 == 0, "a member owns whole cache lines");
_Static_assert(offsetof(kvc_coll_group, round) % 64 == 0, "the round word starts a cache line");
_Static_assert(offsetof(kvc_header, rooms_reserved) % 64 == 0 &&
                   offsetof(kvc_header, pd_off) - offsetof(kvc_header, rooms_reserved) == 64,
               "rooms_reserved sits alone on its cache line");

#endif /* KVC_LAYOUT_H */
