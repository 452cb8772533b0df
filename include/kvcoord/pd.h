/*
 * kvcoord/pd.h - the prefill-decode (PD) bootstrap tables of a node's
 * segment: the prefill rank table and the bootstrap room -> DP rank map
 * that sglang's PD bootstrap server (CommonKVBootstrapServer, at a
 * prefill's bootstrap port) keeps in its own process.  kvcoordd serves them
 * over HTTP with that server's routes (docs/http-api.md, "PD bootstrap");
 * this header reads and writes them without HTTP.
 *
 * Conventions are kvcoord.h's: every call returns a kvc_err, sets
 * kvc_last_error() on failure, never prints or exits, and is safe from any
 * thread of any attached process.  Both tables live in the segment behind
 * one robust process-shared mutex (a writer killed half-way is rolled back
 * by the next locker), so they survive kvcoordd restarts like the rank
 * table.
 *
 * Rules followed (sglang's python/sglang/srt/disaggregation/common/conn.py,
 * CommonKVBootstrapServer, at commit 0094505da741):
 *  - a prefill rank is keyed by (dp group, cp rank, tp rank, pp rank); its
 *    dp group is attn_dp_rank when system_dp_size is 1, else
 *    system_dp_rank;
 *  - the topology (attn_tp_size, attn_cp_size, dp size, pp size) is the one
 *    of the first registration; dp size is attn_dp_size when system_dp_size
 *    is 1, else system_dp_size; page size, KV cache dtype and the prefill's
 *    HTTP port are each taken from the first registration that has one.
 * Where sglang's server would count wrongly, these tables do not:
 *  - readiness counts distinct live ranks: a rank registered again replaces
 *    its entry and is counted once; ready means every rank of the topology
 *    is registered (registered == expected, never more);
 *  - one prefill per table.  sglang's server keeps its first topology for
 *    its life and still stores and counts a registration of another one
 *    (so it can say "ready" with ranks missing).  Here a registration whose
 *    topology differs from the live one is refused (KVC_E_EXISTS, the
 *    message naming both) while any live entry's registrant is known to
 *    run; when none is (every live entry's registrant ended, or is unknown:
 *    KVC_PD_OWNER_NONE, e.g. registered from another host), the live
 *    entries are withdrawn ("replaced by a prefill of topology ...") and the
 *    new topology taken, as sglang's server restarted with the new prefill
 *    would;
 *  - an entry whose registering process ends is withdrawn (kvc_pd_reap);
 *    when no live entry is left the topology is forgotten;
 *  - limits are refused up front, with their numbers: a topology of more
 *    than KVC_PD_MAX_RANKS ranks, a size above KVC_PD_DIM_MAX
 *    (kvc_pd_registration_check), a room map of KVC_PD_MAX_ROOMS - 1
 *    entries (KVC_E_FULL).
 *
 * Locking: writers take the PD lock; readers (kvc_pd_lookup,
 * kvc_pd_status_get, kvc_pd_list, kvc_pd_room_get, kvc_pd_gauges_get)
 * never do: they copy under the region's sequence counters, so a process
 * stopped (SIGSTOP, a debugger) or killed while holding the lock stalls no
 * reader.
 */
#ifndef KVCOORD_PD_H
#define KVCOORD_PD_H

#include <stddef.h>
#include <stdint.h>

#include "kvcoord/kvcoord.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Longest rank_ip kept (a hostname label or an IPv6 literal), bytes
 * excluding the NUL. */
#define KVC_PD_IP_MAX 63
/* Longest kv_cache_dtype kept ("auto", "fp8_e5m2", ...), bytes excluding
 * the NUL. */
#define KVC_PD_DTYPE_MAX 31
/* Prefill ranks a node's table holds: a topology of more ranks (dp x cp x
 * tp x pp) is refused at registration. */
#define KVC_PD_MAX_RANKS 1024
/* Bootstrap rooms the room -> DP rank map holds at once. */
#define KVC_PD_MAX_ROOMS 65536
/* Largest size of one parallel dimension accepted (tp, cp, dp, pp). */
#define KVC_PD_DIM_MAX 4096

/* One prefill rank's registration: the body of sglang's PUT /route.  Sizes
 * are 1..KVC_PD_DIM_MAX and ranks 0..size-1 (system_dp_rank below
 * system_dp_size); rank_ip 1..KVC_PD_IP_MAX bytes without control
 * characters; rank_port 1..65535; kv_cache_dtype NULL (none) or
 * 1..KVC_PD_DTYPE_MAX printable bytes; the has_ flags say whether the
 * optional fields were given. */
typedef struct kvc_pd_registration {
    int32_t attn_tp_size, attn_tp_rank;
    int32_t attn_cp_size, attn_cp_rank;
    int32_t attn_dp_size, attn_dp_rank;
    int32_t pp_size, pp_rank;
    int32_t system_dp_size, system_dp_rank;
    const char *rank_ip;
    int32_t rank_port;
    int32_t page_size;
    const char *kv_cache_dtype;
    int follow_bootstrap_room; /* load_balance_method == "follow_bootstrap_room"
                                  (sglang's default when the field is absent) */
    int enable_dsa_cache_layer_split;
    int has_prefill_http_port;
    int32_t prefill_http_port; /* 1..65535 when given */
} kvc_pd_registration;

/* The registering process of an entry, for liveness: who ends the entry
 * when it ends.  KVC_PD_OWNER_SELF: the calling process (its process table
 * slot when it is attached as a worker, else its pid and start time);
 * KVC_PD_OWNER_PID: the process (pid, pid_start) named, e.g. the one
 * kvcoordd found at the other end of a loopback HTTP connection;
 * KVC_PD_OWNER_NONE: nobody (the entry stays until replaced or withdrawn). */
typedef enum kvc_pd_owner {
    KVC_PD_OWNER_NONE = 0,
    KVC_PD_OWNER_SELF = 1,
    KVC_PD_OWNER_PID = 2
} kvc_pd_owner;

/* A prefill rank entry as read. */
typedef struct kvc_pd_rank {
    int32_t dp_group, cp_rank, tp_rank, pp_rank;
    char rank_ip[KVC_PD_IP_MAX + 1];
    int32_t rank_port;
    int withdrawn;               /* 1: withdrawn (note says why); 0: live */
    int32_t pid;                 /* registering process (0: none known) */
    uint64_t pid_start;          /* its start time, clock ticks since boot */
    uint64_t generation;         /* bumped on every change of this entry */
    uint64_t registered_ns;      /* CLOCK_REALTIME of the last change */
    char note[KVC_NOTE_MAX + 1]; /* why withdrawn, else "" */
} kvc_pd_rank;

/* The table's state: the topology and readiness. */
typedef struct kvc_pd_status {
    int has_topology; /* 0 until a registration (and after the last live
                         entry ended); the fields below are then 0 */
    int32_t attn_tp_size, attn_cp_size, dp_size, pp_size;
    int has_page_size;
    int32_t page_size;
    int has_kv_cache_dtype;
    char kv_cache_dtype[KVC_PD_DTYPE_MAX + 1];
    int follow_bootstrap_room;
    int enable_dsa_cache_layer_split;
    int has_prefill_http_port;
    int32_t prefill_http_port;
    uint32_t expected;   /* attn_tp_size * attn_cp_size * dp_size * pp_size */
    uint32_t registered; /* distinct live entries */
    uint32_t withdrawn;  /* entries kept withdrawn (to say why) */
    int ready;           /* has_topology && registered == expected */
    uint32_t rooms;      /* entries of the room -> DP rank map */
} kvc_pd_status;

/* Check registration r without storing anything: every field in the
 * ranges of kvc_pd_registration, and its topology (attn_tp_size x
 * attn_cp_size x dp size x pp_size) at most KVC_PD_MAX_RANKS ranks.  The
 * one check of a registration: kvc_pd_register, kvcoordd's PUT /route and
 * the Python binding all apply it.  Pure: no segment, any thread.
 * Errors: KVC_E_INVAL (NULL, or the first field out of range: the message
 * names it and the range). */
kvc_err kvc_pd_registration_check(const kvc_pd_registration *r);

/* Check a PD table as read from elsewhere (another node's published
 * record, a snapshot): st's topology fields (has_topology, the four sizes
 * 1..KVC_PD_DIM_MAX of at most KVC_PD_MAX_RANKS ranks, page size, dtype,
 * HTTP port) and the n entries of ranks[] (keys 0..KVC_PD_DIM_MAX-1, no
 * key twice, rank_ip and note NUL-terminated text, ports 1..65535, every
 * live entry inside the topology, a topology only with a live entry, at
 * most KVC_PD_MAX_RANKS entries).  Fills st->expected, registered,
 * withdrawn and ready by this header's rules (other fields untouched).
 * The one validator of a PD table: kvcoordd's record decoder and
 * kvcoord-diag use it.  Pure, any thread.
 * Errors: KVC_E_INVAL (the first problem, named; st's counts are then
 * meaningless). */
kvc_err kvc_pd_table_check(kvc_pd_status *st, const kvc_pd_rank *ranks, size_t n);

/* Register (or register again: the entry is replaced, counted once) the
 * prefill rank `r` describes, owned as `owner` says (pid and pid_start are
 * read for KVC_PD_OWNER_PID only).  Takes the PD lock.
 * Errors: KVC_E_INVAL (NULL, kvc_pd_registration_check's errors: the
 * message names the field), KVC_E_EXISTS (another topology is live and
 * one of its registrants runs: see the rule above), KVC_E_FULL (never
 * for a valid topology: withdrawn entries are reused), KVC_E_BUSY,
 * KVC_E_NOTRECOVERABLE. */
kvc_err kvc_pd_register(kvc_segment *seg, const kvc_pd_registration *r, kvc_pd_owner owner,
                        int32_t pid, uint64_t pid_start);

/* Read the entry of (dp_group, cp_rank, tp_rank, pp_rank) into *out.
 * Errors: KVC_E_INVAL (NULL), KVC_E_NOENT (never registered, or a negative
 * key), KVC_E_WITHDRAWN (withdrawn: *out is filled, its note says why),
 * KVC_E_BUSY, KVC_E_NOTRECOVERABLE. */
kvc_err kvc_pd_lookup(kvc_segment *seg, int32_t dp_group, int32_t cp_rank, int32_t tp_rank,
                      int32_t pp_rank, kvc_pd_rank *out);

/* The topology and readiness into *out.  Errors: KVC_E_INVAL (NULL),
 * KVC_E_BUSY, KVC_E_NOTRECOVERABLE. */
kvc_err kvc_pd_status_get(kvc_segment *seg, kvc_pd_status *out);

/* Up to cap entries (live and withdrawn, ordered by dp, cp, tp, pp) into
 * out[]; *count receives how many exist (may exceed cap: call again with
 * a larger array).  Errors: KVC_E_INVAL (NULL count, or NULL out with cap
 * > 0), KVC_E_BUSY, KVC_E_NOTRECOVERABLE. */
kvc_err kvc_pd_list(kvc_segment *seg, kvc_pd_rank *out, size_t cap, size_t *count);

/* Withdraw the entry of (dp_group, cp_rank, tp_rank, pp_rank), keeping note
 * (may be NULL; truncated to KVC_NOTE_MAX bytes) to say why.
 * Errors: KVC_E_NOENT (no live entry), KVC_E_BUSY, KVC_E_NOTRECOVERABLE. */
kvc_err kvc_pd_withdraw(kvc_segment *seg, int32_t dp_group, int32_t cp_rank, int32_t tp_rank,
                        int32_t pp_rank, const char *note);

/* Withdraw every live entry whose registering process has ended (its
 * process table slot was reaped or given to another process, or its pid +
 * start time no longer runs), the note naming the process and how it
 * ended.  *withdrawn (may be NULL) receives the count.  kvcoordd runs it
 * every second and whenever it reaps a process.
 * Errors: KVC_E_BUSY, KVC_E_NOTRECOVERABLE. */
kvc_err kvc_pd_reap(kvc_segment *seg, size_t *withdrawn);

/* Remember that bootstrap room `room` is served by DP rank dp_rank (0 ..
 * KVC_PD_DIM_MAX-1), stamped now (CLOCK_REALTIME), replacing an earlier
 * entry.  Errors: KVC_E_INVAL (dp_rank out of range), KVC_E_FULL
 * (KVC_PD_MAX_ROOMS entries: expired ones are swept first), KVC_E_BUSY,
 * KVC_E_NOTRECOVERABLE. */
kvc_err kvc_pd_room_set(kvc_segment *seg, int64_t room, int32_t dp_rank);

/* The DP rank of bootstrap room `room` into *dp_rank.  Entries are kept
 * until a sweep removes them (sglang's rule: see kvc_pd_room_sweep), so a
 * lookup between expiry and the next sweep still answers.
 * Errors: KVC_E_INVAL (NULL), KVC_E_NOENT, KVC_E_BUSY,
 * KVC_E_NOTRECOVERABLE. */
kvc_err kvc_pd_room_get(kvc_segment *seg, int64_t room, int32_t *dp_rank);

/* Remove every room entry stamped more than interval_ms ago (sglang's
 * cleanup task: every interval it removes entries older than the
 * interval, so an entry lives between one and two intervals).  *removed
 * (may be NULL) receives the count.
 * Errors: KVC_E_BUSY, KVC_E_NOTRECOVERABLE. */
kvc_err kvc_pd_room_sweep(kvc_segment *seg, uint64_t interval_ms, size_t *removed);

/* The PD tables' counts as of their last change, read without the PD
 * lock (for /metrics, which must not wait): live and withdrawn prefill
 * rank entries, expected ranks (0 without a topology), room map entries.
 * Each count is exact; together they may mix two consecutive changes. */
typedef struct kvc_pd_gauges {
    uint32_t live, withdrawn, expected, rooms;
} kvc_pd_gauges;

/* Fill *out.  Takes no lock, makes no system call.  Errors: KVC_E_INVAL
 * (NULL). */
kvc_err kvc_pd_gauges_get(kvc_segment *seg, kvc_pd_gauges *out);

#ifdef __cplusplus
}
#endif

#endif /* KVCOORD_PD_H */
