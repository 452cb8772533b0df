/*
 * layout_pd.h - the PD bootstrap region of the segment (kvcoord/pd.h): the
 * prefill rank table, its topology and the bootstrap room -> DP rank map,
 * behind one robust mutex (KVC_LOCK_PD).  Part of the layout: any change
 * here bumps KVC_LAYOUT_VERSION (layout.h's rule).
 *
 * Crash safety: every change under the lock touches one rank slot (and the
 * topology), or one room slot.  Before writing, the writer saves what it
 * is about to change into undo and marks it valid last; recovery after
 * EOWNERDEAD copies it back and recomputes the counters.
 *
 * Readers never lock (seqlock.h's protocol): every change is made inside
 * a window of seq_ranks (rank slots, topology) or seq_rooms (room slots),
 * its stores through kvc_seq_store().  A reader copies, then re-checks
 * the sequence.  A reader that finds the sequence odd - a writer inside
 * its window, possibly stopped (SIGSTOP) or killed there - reads the table
 * as it was before that change: the one slot (and topology) the window
 * touches, as the undo record saved it, in place of the slot itself.  The
 * undo record is written before the window opens (a release fence before
 * the odd store) and stays valid until it closes.
 *
 * A room removal is a chain of one-slot changes (backward shift): the
 * removed slot becomes a tombstone (KVC_PD_ROOM_TOMB: probes go on past
 * it), each entry moved back is written into the tombstone and its old
 * slot becomes the tombstone, and the last tombstone becomes free.  At
 * every step every entry is found by its probe; recovery finishes a chain
 * a dead writer left.
 */
#ifndef KVC_LAYOUT_PD_H
#define KVC_LAYOUT_PD_H

#include <stdatomic.h>
#include <stdint.h>

#include "kvcoord/kvcoord.h"
#include "kvcoord/pd.h"

enum { KVC_PD_FREE = 0, KVC_PD_LIVE = 1, KVC_PD_WITHDRAWN = 2 };
enum { KVC_PD_ROOM_FREE = 0, KVC_PD_ROOM_USED = 1, KVC_PD_ROOM_TOMB = 2 };

typedef struct kvc_pd_slot {
    uint32_t state; /* KVC_PD_* */
    int32_t dp_group, cp_rank, tp_rank, pp_rank;
    int32_t rank_port;
    char rank_ip[KVC_PD_IP_MAX + 1];
    int32_t pid;       /* registering process, 0 = none */
    int32_t proc_slot; /* its process table slot when attached, -1 if none */
    uint32_t proc_gen; /* that slot's gen then */
    uint32_t pad;
    uint64_t pid_start;
    uint64_t generation;
    uint64_t registered_ns;
    char note[KVC_NOTE_MAX + 1];
} kvc_pd_slot;

typedef struct kvc_pd_topo {
    uint32_t set;
    int32_t attn_tp_size, attn_cp_size, dp_size, pp_size;
    uint32_t has_page_size;
    int32_t page_size;
    uint32_t has_kv_cache_dtype;
    char kv_cache_dtype[KVC_PD_DTYPE_MAX + 1];
    uint32_t follow_bootstrap_room;
    uint32_t enable_dsa_cache_layer_split;
    uint32_t has_prefill_http_port;
    int32_t prefill_http_port;
} kvc_pd_topo;

typedef struct kvc_pd_room {
    uint32_t state; /* KVC_PD_ROOM_* */
    int32_t dp_rank;
    int64_t room;
    uint64_t stamp_ns; /* CLOCK_REALTIME, as sglang's time.time() */
} kvc_pd_room;

typedef struct kvc_pd_undo {
    _Atomic uint32_t valid;
    uint32_t kind; /* 1: rank slot + topology, 2: room slot */
    uint32_t index;
    uint32_t pad;
    kvc_pd_slot slot;
    kvc_pd_topo topo;
    kvc_pd_room room;
} kvc_pd_undo;

typedef struct kvc_pd_region {
    kvc_lock lock;
    _Atomic uint32_t epoch;     /* bumped on every change */
    uint32_t ranks_used;        /* slots not FREE; rebuilt by recovery */
    uint32_t rooms_used;        /* USED room slots; rebuilt by recovery */
    _Atomic uint32_t seq_ranks; /* odd: a change of a rank slot or the topology */
    _Atomic uint32_t seq_rooms; /* odd: a change of a room slot */
    uint32_t pad;
    uint64_t next_generation;
    /* Published after every change (lock held), read without it
     * (kvc_pd_gauges_get): live and withdrawn entries, expected ranks (0
     * without a topology), room map entries. */
    _Atomic uint32_t g_live, g_withdrawn, g_expected, g_rooms;
    kvc_pd_topo topo;
    kvc_pd_undo undo;
    kvc_pd_slot slots[KVC_PD_MAX_RANKS];
    kvc_pd_room rooms[KVC_PD_MAX_ROOMS];
} kvc_pd_region;

#endif /* KVC_LAYOUT_PD_H */
