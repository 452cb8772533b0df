/*
 * pd.c - the PD bootstrap tables (kvcoord/pd.h): the prefill rank table,
 * its topology and the bootstrap room -> DP rank map, in the segment's PD
 * region (layout_pd.h) behind the PD lock.
 *
 * Every change saves what it overwrites into the region's undo record
 * first (valid set last); recovery after a dead writer copies it back and
 * recounts.  The room map is open addressing with linear probing over
 * KVC_PD_MAX_ROOMS slots and backward-shift removal (no tombstones).
 */
#include <sched.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "internal.h"
#include "kvcoord/pd.h"
#include "seqlock.h"

/* ---- writing: undo record and seqlock windows (layout_pd.h) --------- */

static void publish_gauges(kvc_pd_region *pd);
static void room_remove_from(kvc_pd_region *pd, uint32_t h);

/* Save rank slot i and the topology into the undo record (lock held,
 * outside a window): stored atomically, as lock-free readers of an odd
 * sequence copy it; valid last. */
static void save_rank(kvc_pd_region *pd, uint32_t i)
{
    const uint32_t kind = 1;
    kvc_seq_store(&pd->undo.kind, &kind, sizeof kind);
    kvc_seq_store(&pd->undo.index, &i, sizeof i);
    kvc_seq_store(&pd->undo.slot, &pd->slots[i], sizeof pd->undo.slot);
    kvc_seq_store(&pd->undo.topo, &pd->topo, sizeof pd->undo.topo);
    atomic_store_explicit(&pd->undo.valid, 1, memory_order_release);
}

static void save_room(kvc_pd_region *pd, uint32_t i)
{
    const uint32_t kind = 2;
    kvc_seq_store(&pd->undo.kind, &kind, sizeof kind);
    kvc_seq_store(&pd->undo.index, &i, sizeof i);
    kvc_seq_store(&pd->undo.room, &pd->rooms[i], sizeof pd->undo.room);
    atomic_store_explicit(&pd->undo.valid, 1, memory_order_release);
}

/* Open a window on seq once the undo record is saved (asserted in debug
 * builds): the release fence orders the undo record before the odd value,
 * so a reader that sees the odd value sees the record. */
static void window_open(kvc_pd_region *pd, _Atomic uint32_t *seq)
{
    kvc__assert(atomic_load_explicit(&pd->undo.valid, memory_order_relaxed));
    (void)pd;
    atomic_thread_fence(memory_order_release);
    kvc_seq_write_begin(seq);
}

/* ---- recovery ---------------------------------------------------------- */

static void recount(kvc_pd_region *pd)
{
    uint32_t ranks = 0, rooms = 0;
    for (uint32_t i = 0; i < KVC_PD_MAX_RANKS; i++)
        ranks += pd->slots[i].state != KVC_PD_FREE;
    for (uint32_t i = 0; i < KVC_PD_MAX_ROOMS; i++)
        rooms += pd->rooms[i].state == KVC_PD_ROOM_USED;
    pd->ranks_used = ranks;
    pd->rooms_used = rooms;
}

/* Make seq even again after a dead writer (lock held): a window it left
 * open is closed (its change rolled back by the caller first). */
static void even(_Atomic uint32_t *seq)
{
    uint32_t v = atomic_load_explicit(seq, memory_order_relaxed);
    if (v & 1)
        atomic_store_explicit(seq, v + 1, memory_order_release);
}

static void pd_recover(kvc_segment *seg, int id)
{
    (void)id;
    kvc_pd_region *pd = seg->pd;
    kvc_pd_undo *u = &pd->undo;
    if (atomic_load(&u->valid)) {
        /* Roll the change back, inside a window of its own (or the one the
         * dead writer left open, whose readers read the undo record). */
        _Atomic uint32_t *seq = u->kind == 1 ? &pd->seq_ranks : &pd->seq_rooms;
        if (!(atomic_load_explicit(seq, memory_order_relaxed) & 1))
            window_open(pd, seq);
        if (u->kind == 1 && u->index < KVC_PD_MAX_RANKS) {
            kvc_seq_store(&pd->topo, &u->topo, sizeof pd->topo);
            kvc_seq_store(&pd->slots[u->index], &u->slot, sizeof u->slot);
        } else if (u->kind == 2 && u->index < KVC_PD_MAX_ROOMS) {
            kvc_seq_store(&pd->rooms[u->index], &u->room, sizeof u->room);
        }
        kvc_seq_write_end(seq);
        atomic_store(&u->valid, 0);
    }
    even(&pd->seq_ranks);
    even(&pd->seq_rooms);
    /* A room removal the dead writer left half-way: finish it. */
    for (uint32_t i = 0; i < KVC_PD_MAX_ROOMS; i++)
        if (pd->rooms[i].state == KVC_PD_ROOM_TOMB)
            room_remove_from(pd, i);
    recount(pd);
    publish_gauges(pd);
    atomic_fetch_add(&pd->epoch, 1);
}

void kvc__pd_register(kvc_segment *seg) { kvc__lock_register(seg, KVC_LOCK_PD, pd_recover); }

/* The lock-free gauges (kvc_pd_gauges_get), from the table (lock held). */
static void publish_gauges(kvc_pd_region *pd)
{
    uint32_t live = 0, wd = 0;
    for (uint32_t i = 0; i < KVC_PD_MAX_RANKS; i++) {
        live += pd->slots[i].state == KVC_PD_LIVE;
        wd += pd->slots[i].state == KVC_PD_WITHDRAWN;
    }
    const kvc_pd_topo *t = &pd->topo;
    uint64_t x = t->set && live ? (uint64_t)t->attn_tp_size * (uint64_t)t->attn_cp_size *
                                      (uint64_t)t->dp_size * (uint64_t)t->pp_size
                                : 0;
    atomic_store(&pd->g_live, live);
    atomic_store(&pd->g_withdrawn, wd);
    atomic_store(&pd->g_expected, x > UINT32_MAX ? UINT32_MAX : (uint32_t)x);
    atomic_store(&pd->g_rooms, pd->rooms_used);
}

static void commit(kvc_pd_region *pd)
{
    atomic_store_explicit(&pd->undo.valid, 0, memory_order_release);
    atomic_fetch_add(&pd->epoch, 1);
}

/* After a change of the rank table (lock held). */
static void commit_rank(kvc_pd_region *pd)
{
    commit(pd);
    publish_gauges(pd);
}

/* ---- validation -------------------------------------------------------- */

static kvc_err check_dim(const char *size_name, int32_t size, const char *rank_name, int32_t rank)
{
    if (size < 1 || size > KVC_PD_DIM_MAX)
        return kvc__fail(KVC_E_INVAL, "%s %d out of range 1..%d", size_name, (int)size,
                         KVC_PD_DIM_MAX);
    if (rank < 0 || rank >= size)
        return kvc__fail(KVC_E_INVAL, "%s %d out of range 0..%d (%s %d)", rank_name, (int)rank,
                         (int)size - 1, size_name, (int)size);
    return KVC_OK;
}

static kvc_err check_text(const char *what, const char *s, size_t max)
{
    size_t n = strlen(s);
    if (n < 1 || n > max)
        return kvc__fail(KVC_E_INVAL, "%s of %zu bytes out of range 1..%zu", what, n, max);
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] < 0x21 || (unsigned char)s[i] > 0x7e)
            return kvc__fail(KVC_E_INVAL, "%s has byte 0x%02x at offset %zu (printable ASCII only)",
                             what, (unsigned char)s[i], i);
    return KVC_OK;
}

/* The ranks of a topology (capped at UINT32_MAX). */
static uint32_t topo_ranks(int32_t tp, int32_t cp, int32_t dp, int32_t pp)
{
    uint64_t x = (uint64_t)tp * (uint64_t)cp * (uint64_t)dp * (uint64_t)pp;
    return x > UINT32_MAX ? UINT32_MAX : (uint32_t)x;
}

static kvc_err check_size(int32_t tp, int32_t cp, int32_t dp, int32_t pp)
{
    uint32_t n = topo_ranks(tp, cp, dp, pp);
    if (n > KVC_PD_MAX_RANKS)
        return kvc__fail(KVC_E_INVAL,
                         "a topology of %u prefill ranks (attn_tp_size %d x attn_cp_size %d x dp "
                         "size %d x pp_size %d) exceeds the PD table's %d ranks",
                         n, (int)tp, (int)cp, (int)dp, (int)pp, KVC_PD_MAX_RANKS);
    return KVC_OK;
}

KVC_API kvc_err kvc_pd_registration_check(const kvc_pd_registration *r)
{
    KVC_ARG(r);
    kvc_err e;
    if ((e = check_dim("attn_tp_size", r->attn_tp_size, "attn_tp_rank", r->attn_tp_rank)) ||
        (e = check_dim("attn_cp_size", r->attn_cp_size, "attn_cp_rank", r->attn_cp_rank)) ||
        (e = check_dim("attn_dp_size", r->attn_dp_size, "attn_dp_rank", r->attn_dp_rank)) ||
        (e = check_dim("pp_size", r->pp_size, "pp_rank", r->pp_rank)) ||
        (e = check_dim("system_dp_size", r->system_dp_size, "system_dp_rank", r->system_dp_rank)))
        return e;
    if ((e = check_size(r->attn_tp_size, r->attn_cp_size,
                        r->system_dp_size == 1 ? r->attn_dp_size : r->system_dp_size, r->pp_size)))
        return e;
    if (!r->rank_ip)
        return kvc__fail(KVC_E_INVAL, "rank_ip is NULL");
    if ((e = check_text("rank_ip", r->rank_ip, KVC_PD_IP_MAX)))
        return e;
    if (r->rank_port < 1 || r->rank_port > 65535)
        return kvc__fail(KVC_E_INVAL, "rank_port %d out of range 1..65535", (int)r->rank_port);
    if (r->page_size < 1)
        return kvc__fail(KVC_E_INVAL, "page_size %d out of range 1..2^31-1", (int)r->page_size);
    if (r->kv_cache_dtype &&
        (e = check_text("kv_cache_dtype", r->kv_cache_dtype, KVC_PD_DTYPE_MAX)))
        return e;
    if (r->has_prefill_http_port && (r->prefill_http_port < 1 || r->prefill_http_port > 65535))
        return kvc__fail(KVC_E_INVAL, "prefill_http_port %d out of range 1..65535",
                         (int)r->prefill_http_port);
    return KVC_OK;
}

/* A note: at most KVC_NOTE_MAX bytes, no control byte. */
static kvc_err check_note(const char *s, size_t cap)
{
    size_t n = strnlen(s, cap);
    if (n == cap)
        return kvc__fail(KVC_E_INVAL, "a note is not NUL-terminated within %zu bytes", cap);
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] < 0x20 || (unsigned char)s[i] == 0x7f)
            return kvc__fail(KVC_E_INVAL, "a note has control byte 0x%02x at offset %zu",
                             (unsigned char)s[i], i);
    return KVC_OK;
}

KVC_API kvc_err kvc_pd_table_check(kvc_pd_status *st, const kvc_pd_rank *ranks, size_t n)
{
    KVC_ARG(st);
    if (n && !ranks)
        return kvc__fail(KVC_E_INVAL, "kvc_pd_table_check: ranks is NULL with n %zu", n);
    st->registered = st->withdrawn = 0;
    st->expected = 0;
    st->ready = 0;
    if (n > KVC_PD_MAX_RANKS)
        return kvc__fail(KVC_E_INVAL, "%zu entries, more than the PD table's %d", n,
                         KVC_PD_MAX_RANKS);
    kvc_err e;
    if (st->has_topology) {
        const int32_t sz[4] = {st->attn_tp_size, st->attn_cp_size, st->dp_size, st->pp_size};
        static const char *const names[4] = {"attn_tp_size", "attn_cp_size", "dp_size", "pp_size"};
        for (int i = 0; i < 4; i++)
            if (sz[i] < 1 || sz[i] > KVC_PD_DIM_MAX)
                return kvc__fail(KVC_E_INVAL, "topology %s %d out of range 1..%d", names[i],
                                 (int)sz[i], KVC_PD_DIM_MAX);
        if ((e = check_size(sz[0], sz[1], sz[2], sz[3])))
            return e;
        if (st->has_page_size && st->page_size < 1)
            return kvc__fail(KVC_E_INVAL, "topology page_size %d out of range 1..2^31-1",
                             (int)st->page_size);
        if (st->has_kv_cache_dtype &&
            (e = check_text("topology kv_cache_dtype", st->kv_cache_dtype, KVC_PD_DTYPE_MAX)))
            return e;
        if (st->has_prefill_http_port &&
            (st->prefill_http_port < 1 || st->prefill_http_port > 65535))
            return kvc__fail(KVC_E_INVAL, "topology prefill_http_port %d out of range 1..65535",
                             (int)st->prefill_http_port);
        st->expected = topo_ranks(sz[0], sz[1], sz[2], sz[3]);
    }
    for (size_t i = 0; i < n; i++) {
        const kvc_pd_rank *p = &ranks[i];
        const int32_t k[4] = {p->dp_group, p->cp_rank, p->tp_rank, p->pp_rank};
        for (int j = 0; j < 4; j++)
            if (k[j] < 0 || k[j] >= KVC_PD_DIM_MAX)
                return kvc__fail(KVC_E_INVAL,
                                 "entry %zu: a rank of (dp %d, cp %d, tp %d, pp %d) "
                                 "out of range 0..%d",
                                 i, (int)k[0], (int)k[1], (int)k[2], (int)k[3], KVC_PD_DIM_MAX - 1);
        if (strnlen(p->rank_ip, sizeof p->rank_ip) == sizeof p->rank_ip)
            return kvc__fail(KVC_E_INVAL, "entry %zu: rank_ip is not NUL-terminated", i);
        if ((e = check_text("rank_ip", p->rank_ip, KVC_PD_IP_MAX)) ||
            (e = check_note(p->note, sizeof p->note)))
            return e;
        if (p->rank_port < 1 || p->rank_port > 65535)
            return kvc__fail(KVC_E_INVAL, "entry %zu: rank_port %d out of range 1..65535", i,
                             (int)p->rank_port);
        if (p->pid < 0)
            return kvc__fail(KVC_E_INVAL, "entry %zu: pid %d is negative", i, (int)p->pid);
        for (size_t j = 0; j < i; j++)
            if (ranks[j].dp_group == k[0] && ranks[j].cp_rank == k[1] && ranks[j].tp_rank == k[2] &&
                ranks[j].pp_rank == k[3])
                return kvc__fail(KVC_E_INVAL,
                                 "entries %zu and %zu have the same key (dp %d, cp %d, tp %d, "
                                 "pp %d)",
                                 j, i, (int)k[0], (int)k[1], (int)k[2], (int)k[3]);
        if (p->withdrawn) {
            st->withdrawn++;
            continue;
        }
        if (!st->has_topology)
            return kvc__fail(KVC_E_INVAL, "entry %zu is live but the table has no topology", i);
        if (k[0] >= st->dp_size || k[1] >= st->attn_cp_size || k[2] >= st->attn_tp_size ||
            k[3] >= st->pp_size)
            return kvc__fail(KVC_E_INVAL,
                             "live entry %zu (dp %d, cp %d, tp %d, pp %d) is outside the "
                             "topology (dp size %d, attn_cp_size %d, attn_tp_size %d, pp_size "
                             "%d)",
                             i, (int)k[0], (int)k[1], (int)k[2], (int)k[3], (int)st->dp_size,
                             (int)st->attn_cp_size, (int)st->attn_tp_size, (int)st->pp_size);
        st->registered++;
    }
    if (st->has_topology && !st->registered)
        return kvc__fail(KVC_E_INVAL, "a topology without a live entry");
    st->ready = st->has_topology && st->registered == st->expected;
    return KVC_OK;
}

/* ---- liveness ---------------------------------------------------------- */

/* Has slot s's registering process ended?  how receives what is known. */
static bool owner_ended(kvc_segment *seg, const kvc_pd_slot *s, char *how, size_t cap)
{
    if (s->proc_slot >= 0 && (uint32_t)s->proc_slot < seg->hdr->max_procs) {
        /* An attached registrant: its process table slot's liveness lock
         * (liveness.c), right in every PID namespace. */
        kvc_slot_state st = kvc__proc_slot_state(seg, s->proc_slot, s->proc_gen);
        if (st == KVC__SLOT_ALIVE)
            return false;
        kvc_proc *p = &seg->procs[s->proc_slot];
        if (st == KVC__SLOT_DEAD && atomic_load(&p->dead))
            snprintf(how, cap, "%s", p->how);
        else if (st == KVC__SLOT_DEAD && p->pid_ns && p->pid_ns == seg->pid_ns)
            kvc__proc_how(atomic_load(&p->pid), p->start, how, cap); /* its zombie, if any */
        else if (st == KVC__SLOT_DEAD)
            kvc_exit_unknown_text(p->start, how, cap);
        else
            snprintf(how, cap, "left the segment");
        return true;
    }
    if (s->pid > 0 && !kvc__proc_alive(s->pid, s->pid_start)) {
        kvc__proc_how(s->pid, s->pid_start, how, cap);
        return true;
    }
    return false;
}

/* ---- prefill ranks ----------------------------------------------------- */

static int key_cmp(const kvc_pd_slot *s, int32_t dp, int32_t cp, int32_t tp, int32_t pp)
{
    return s->dp_group == dp && s->cp_rank == cp && s->tp_rank == tp && s->pp_rank == pp;
}

static int32_t find_key(kvc_pd_region *pd, int32_t dp, int32_t cp, int32_t tp, int32_t pp)
{
    for (uint32_t i = 0; i < KVC_PD_MAX_RANKS; i++)
        if (pd->slots[i].state != KVC_PD_FREE && key_cmp(&pd->slots[i], dp, cp, tp, pp))
            return (int32_t)i;
    return -1;
}

/* A slot for a new key: a free one, else the oldest withdrawn one. */
static int32_t find_free(kvc_pd_region *pd)
{
    int32_t oldest = -1;
    for (uint32_t i = 0; i < KVC_PD_MAX_RANKS; i++) {
        const kvc_pd_slot *s = &pd->slots[i];
        if (s->state == KVC_PD_FREE)
            return (int32_t)i;
        if (s->state == KVC_PD_WITHDRAWN &&
            (oldest < 0 || s->registered_ns < pd->slots[oldest].registered_ns))
            oldest = (int32_t)i;
    }
    return oldest;
}

static uint32_t live_count(const kvc_pd_region *pd)
{
    uint32_t n = 0;
    for (uint32_t i = 0; i < KVC_PD_MAX_RANKS; i++)
        n += pd->slots[i].state == KVC_PD_LIVE;
    return n;
}

/* sglang's first-seen topology rules (pd.h), applied to t. */
static void take_topology(kvc_pd_topo *t, const kvc_pd_registration *r)
{
    if (!t->set) {
        t->set = 1;
        t->attn_tp_size = r->attn_tp_size;
        t->attn_cp_size = r->attn_cp_size;
        t->dp_size = r->system_dp_size == 1 ? r->attn_dp_size : r->system_dp_size;
        t->pp_size = r->pp_size;
        t->follow_bootstrap_room = r->follow_bootstrap_room ? 1 : 0;
        t->enable_dsa_cache_layer_split = r->enable_dsa_cache_layer_split ? 1 : 0;
    }
    if (!t->has_page_size) {
        t->has_page_size = 1;
        t->page_size = r->page_size;
    }
    if (!t->has_kv_cache_dtype && r->kv_cache_dtype) {
        t->has_kv_cache_dtype = 1;
        snprintf(t->kv_cache_dtype, sizeof t->kv_cache_dtype, "%s", r->kv_cache_dtype);
    }
    if (!t->has_prefill_http_port && r->has_prefill_http_port) {
        t->has_prefill_http_port = 1;
        t->prefill_http_port = r->prefill_http_port;
    }
}

static void withdraw_slot(kvc_pd_region *pd, uint32_t i, const char *note);

/* Does registration r's topology differ from the live one's (lock held)?
 * The rule (pd.h): while any live entry's registrant is known to run, the
 * live topology stands and r is refused (KVC_E_EXISTS, naming both);
 * otherwise (every live entry's registrant unknown - registered from
 * another host - or ended) the live entries are withdrawn, each noting
 * the topology that replaced it, and r's topology is taken. */
static kvc_err topology_conflict(kvc_segment *seg, const kvc_pd_registration *r)
{
    kvc_pd_region *pd = seg->pd;
    const kvc_pd_topo *t = &pd->topo;
    int32_t dp_size = r->system_dp_size == 1 ? r->attn_dp_size : r->system_dp_size;
    if (!t->set || !live_count(pd) ||
        (t->attn_tp_size == r->attn_tp_size && t->attn_cp_size == r->attn_cp_size &&
         t->dp_size == dp_size && t->pp_size == r->pp_size))
        return KVC_OK;
    char how[KVC_HOW_MAX + 1];
    for (uint32_t i = 0; i < KVC_PD_MAX_RANKS; i++) {
        const kvc_pd_slot *s = &pd->slots[i];
        if (s->state == KVC_PD_LIVE && (s->proc_slot >= 0 || s->pid > 0) &&
            !owner_ended(seg, s, how, sizeof how))
            return kvc__fail(KVC_E_EXISTS,
                             "topology attn_tp_size %d x attn_cp_size %d x dp size %d x pp_size "
                             "%d differs from the registered prefill's (%d x %d x %d x %d), whose "
                             "rank dp=%d cp=%d tp=%d pp=%d (pid %d) still runs: one prefill per "
                             "table; its entries go when their processes end",
                             (int)r->attn_tp_size, (int)r->attn_cp_size, (int)dp_size,
                             (int)r->pp_size, (int)t->attn_tp_size, (int)t->attn_cp_size,
                             (int)t->dp_size, (int)t->pp_size, (int)s->dp_group, (int)s->cp_rank,
                             (int)s->tp_rank, (int)s->pp_rank, (int)s->pid);
    }
    char note[KVC_NOTE_MAX + 1];
    snprintf(note, sizeof note,
             "replaced by a prefill of topology %d x %d x %d x %d (tp x cp x "
             "dp x pp)",
             (int)r->attn_tp_size, (int)r->attn_cp_size, (int)dp_size, (int)r->pp_size);
    for (uint32_t i = 0; i < KVC_PD_MAX_RANKS; i++)
        if (pd->slots[i].state == KVC_PD_LIVE)
            withdraw_slot(pd, i, note);
    return KVC_OK;
}

KVC_API kvc_err kvc_pd_register(kvc_segment *seg, const kvc_pd_registration *r, kvc_pd_owner owner,
                                int32_t pid, uint64_t pid_start)
{
    KVC_ARG(seg);
    KVC_ARG(r);
    kvc_err e = kvc_pd_registration_check(r);
    if (e)
        return e;
    if (owner != KVC_PD_OWNER_NONE && owner != KVC_PD_OWNER_SELF && owner != KVC_PD_OWNER_PID)
        return kvc__fail(KVC_E_INVAL, "owner %d is not a kvc_pd_owner", (int)owner);
    if (owner == KVC_PD_OWNER_PID && pid <= 0)
        return kvc__fail(KVC_E_INVAL, "owner pid %d must be positive", (int)pid);
    int32_t dp = r->system_dp_size == 1 ? r->attn_dp_rank : r->system_dp_rank;
    if ((e = kvc__lock(seg, KVC_LOCK_PD)))
        return e;
    kvc_pd_region *pd = seg->pd;
    if ((e = topology_conflict(seg, r))) {
        kvc__unlock(seg, KVC_LOCK_PD);
        return e;
    }
    int32_t i = find_key(pd, dp, r->attn_cp_rank, r->attn_tp_rank, r->pp_rank);
    if (i < 0 && (i = find_free(pd)) < 0) {
        kvc__unlock(seg, KVC_LOCK_PD);
        return kvc__fail(KVC_E_FULL, "PD prefill table full (%d live entries)", KVC_PD_MAX_RANKS);
    }
    /* The new slot and topology, built privately, then stored inside
     * one window (layout_pd.h). */
    kvc_pd_topo t = pd->topo;
    if (!live_count(pd))
        memset(&t, 0, sizeof t); /* a fresh prefill: sglang's fresh server */
    take_topology(&t, r);
    kvc_pd_slot ns;
    memset(&ns, 0, sizeof ns);
    ns.dp_group = dp;
    ns.cp_rank = r->attn_cp_rank;
    ns.tp_rank = r->attn_tp_rank;
    ns.pp_rank = r->pp_rank;
    ns.rank_port = r->rank_port;
    snprintf(ns.rank_ip, sizeof ns.rank_ip, "%s", r->rank_ip);
    ns.proc_slot = -1;
    if (owner == KVC_PD_OWNER_SELF) {
        ns.pid = seg->pid;
        ns.pid_start = seg->start;
        if (seg->proc_slot >= 0) {
            ns.proc_slot = seg->proc_slot;
            ns.proc_gen = atomic_load(&seg->procs[seg->proc_slot].gen);
        }
    } else if (owner == KVC_PD_OWNER_PID) {
        ns.pid = pid;
        ns.pid_start = pid_start;
    }
    ns.generation = pd->next_generation + 1;
    ns.registered_ns = kvc__now_ns();
    ns.state = KVC_PD_LIVE;
    uint32_t was = pd->slots[i].state;
    save_rank(pd, (uint32_t)i);
    KVC_INJECT("pd.rank.saved");
    window_open(pd, &pd->seq_ranks);
    kvc_seq_store(&pd->topo, &t, sizeof t);
    KVC_INJECT("pd.rank.half");
    kvc_seq_store(&pd->slots[i], &ns, sizeof ns);
    kvc_seq_write_end(&pd->seq_ranks);
    pd->next_generation++;
    if (was == KVC_PD_FREE)
        pd->ranks_used++;
    commit_rank(pd);
    kvc__unlock(seg, KVC_LOCK_PD);
    return KVC_OK;
}

/* ---- reading without the lock (layout_pd.h) ------------------------- */

/* A copy in progress: the sequence it started from and, when that was odd,
 * the undo record of the change inside its window (read in place of the
 * slot it names). */
struct pd_read {
    uint32_t s1;
    int overlay;
    uint32_t index;
    kvc_pd_slot slot;
    kvc_pd_topo topo;
    kvc_pd_room room;
};

/* The prefix of a rank slot a scan reads: its state and key. */
struct pd_key {
    uint32_t state;
    int32_t dp_group, cp_rank, tp_rank, pp_rank;
};
_Static_assert(offsetof(kvc_pd_slot, state) == offsetof(struct pd_key, state) &&
                   offsetof(kvc_pd_slot, pp_rank) == offsetof(struct pd_key, pp_rank),
               "struct pd_key is kvc_pd_slot's prefix");

/* Start a copy under seq (kind 1: ranks and topology, 2: rooms).  Returns
 * 0, or -1 when the copy cannot start yet (odd, and no undo record of that
 * kind: a recovery in progress): wait and call again. */
static int read_begin(kvc_pd_region *pd, _Atomic uint32_t *seq, uint32_t kind, struct pd_read *r)
{
    r->s1 = kvc_seq_read_begin(seq);
    r->overlay = 0;
    if (!(r->s1 & 1))
        return 0;
    if (!atomic_load_explicit(&pd->undo.valid, memory_order_acquire))
        return -1;
    uint32_t k;
    kvc_seq_load(&k, &pd->undo.kind, sizeof k);
    if (k != kind)
        return -1;
    kvc_seq_load(&r->index, &pd->undo.index, sizeof r->index);
    if (kind == 1) {
        kvc_seq_load(&r->slot, &pd->undo.slot, sizeof r->slot);
        kvc_seq_load(&r->topo, &pd->undo.topo, sizeof r->topo);
    } else {
        kvc_seq_load(&r->room, &pd->undo.room, sizeof r->room);
    }
    r->overlay = 1;
    return 0;
}

/* Copy len bytes of rank slot i's start (or the whole slot). */
static void read_slot(kvc_pd_region *pd, const struct pd_read *r, uint32_t i, void *dst, size_t len)
{
    if (r->overlay && r->index == i)
        memcpy(dst, &r->slot, len);
    else
        kvc_seq_load(dst, &pd->slots[i], len);
}

static void read_topo(kvc_pd_region *pd, const struct pd_read *r, kvc_pd_topo *t)
{
    if (r->overlay)
        *t = r->topo;
    else
        kvc_seq_load(t, &pd->topo, sizeof *t);
}

static void read_room(kvc_pd_region *pd, const struct pd_read *r, uint32_t i, kvc_pd_room *dst)
{
    if (r->overlay && r->index == i)
        *dst = r->room;
    else
        kvc_seq_load(dst, &pd->rooms[i], sizeof *dst);
}

static uint64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* After a copy that must be made again: yield, and give up after the lock
 * timeout (KVC_E_BUSY) - only a copy that can never start (an odd sequence
 * without an undo record, which nothing but a stopped recovery leaves) or
 * a writer changing the table without pause could take that long. */
static kvc_err read_again(kvc_segment *seg, unsigned *tries, uint64_t *deadline)
{
    if (++*tries < 64)
        return KVC_OK;
    sched_yield();
    uint64_t now = mono_ns();
    if (!*deadline)
        *deadline = now + (uint64_t)seg->lock_timeout_ms * 1000000ull;
    else if (now > *deadline)
        return kvc__fail(KVC_E_BUSY,
                         "the PD tables of %s kept changing for over %u ms: no consistent copy",
                         seg->name, seg->lock_timeout_ms);
    return KVC_OK;
}

static void fill_rank(const kvc_pd_slot *s, kvc_pd_rank *out)
{
    memset(out, 0, sizeof *out);
    out->dp_group = s->dp_group;
    out->cp_rank = s->cp_rank;
    out->tp_rank = s->tp_rank;
    out->pp_rank = s->pp_rank;
    memcpy(out->rank_ip, s->rank_ip, sizeof out->rank_ip);
    out->rank_ip[KVC_PD_IP_MAX] = 0;
    out->rank_port = s->rank_port;
    out->withdrawn = s->state == KVC_PD_WITHDRAWN;
    out->pid = s->pid;
    out->pid_start = s->pid_start;
    out->generation = s->generation;
    out->registered_ns = s->registered_ns;
    memcpy(out->note, s->note, sizeof out->note);
    out->note[KVC_NOTE_MAX] = 0;
}

KVC_API kvc_err kvc_pd_lookup(kvc_segment *seg, int32_t dp_group, int32_t cp_rank, int32_t tp_rank,
                              int32_t pp_rank, kvc_pd_rank *out)
{
    KVC_ARG(seg);
    KVC_ARG(out);
    if (dp_group < 0 || cp_rank < 0 || tp_rank < 0 || pp_rank < 0)
        return kvc__fail(KVC_E_NOENT, "no prefill rank dp=%d cp=%d tp=%d pp=%d (negative)",
                         (int)dp_group, (int)cp_rank, (int)tp_rank, (int)pp_rank);
    kvc_pd_region *pd = seg->pd;
    struct pd_read r;
    kvc_pd_slot sl;
    int32_t found;
    unsigned tries = 0;
    uint64_t deadline = 0;
    kvc_err e;
    for (;;) {
        found = -1;
        if (read_begin(pd, &pd->seq_ranks, 1, &r) == 0) {
            for (uint32_t i = 0; i < KVC_PD_MAX_RANKS && found < 0; i++) {
                struct pd_key k;
                read_slot(pd, &r, i, &k, sizeof k);
                if (k.state != KVC_PD_FREE && k.dp_group == dp_group && k.cp_rank == cp_rank &&
                    k.tp_rank == tp_rank && k.pp_rank == pp_rank)
                    found = (int32_t)i;
            }
            if (found >= 0)
                read_slot(pd, &r, (uint32_t)found, &sl, sizeof sl);
            if (!kvc_seq_read_retry(&pd->seq_ranks, r.s1))
                break;
        }
        if ((e = read_again(seg, &tries, &deadline)))
            return e;
    }
    if (found < 0)
        return kvc__fail(KVC_E_NOENT, "no prefill rank dp=%d cp=%d tp=%d pp=%d registered",
                         (int)dp_group, (int)cp_rank, (int)tp_rank, (int)pp_rank);
    fill_rank(&sl, out);
    if (out->withdrawn)
        return kvc__fail(KVC_E_WITHDRAWN, "prefill rank dp=%d cp=%d tp=%d pp=%d withdrawn: %s",
                         (int)dp_group, (int)cp_rank, (int)tp_rank, (int)pp_rank, out->note);
    return KVC_OK;
}

KVC_API kvc_err kvc_pd_status_get(kvc_segment *seg, kvc_pd_status *out)
{
    KVC_ARG(seg);
    KVC_ARG(out);
    kvc_pd_region *pd = seg->pd;
    struct pd_read r;
    kvc_pd_topo t;
    uint32_t live, wd;
    unsigned tries = 0;
    uint64_t deadline = 0;
    kvc_err e;
    for (;;) {
        live = wd = 0;
        if (read_begin(pd, &pd->seq_ranks, 1, &r) == 0) {
            for (uint32_t i = 0; i < KVC_PD_MAX_RANKS; i++) {
                uint32_t st;
                read_slot(pd, &r, i, &st, sizeof st);
                live += st == KVC_PD_LIVE;
                wd += st == KVC_PD_WITHDRAWN;
            }
            read_topo(pd, &r, &t);
            if (!kvc_seq_read_retry(&pd->seq_ranks, r.s1))
                break;
        }
        if ((e = read_again(seg, &tries, &deadline)))
            return e;
    }
    memset(out, 0, sizeof *out);
    out->registered = live;
    out->withdrawn = wd;
    out->rooms = atomic_load(&pd->g_rooms);
    if (t.set && live) {
        out->has_topology = 1;
        out->attn_tp_size = t.attn_tp_size;
        out->attn_cp_size = t.attn_cp_size;
        out->dp_size = t.dp_size;
        out->pp_size = t.pp_size;
        out->has_page_size = (int)t.has_page_size;
        out->page_size = t.page_size;
        out->has_kv_cache_dtype = (int)t.has_kv_cache_dtype;
        memcpy(out->kv_cache_dtype, t.kv_cache_dtype, sizeof out->kv_cache_dtype);
        out->kv_cache_dtype[KVC_PD_DTYPE_MAX] = 0;
        out->follow_bootstrap_room = (int)t.follow_bootstrap_room;
        out->enable_dsa_cache_layer_split = (int)t.enable_dsa_cache_layer_split;
        out->has_prefill_http_port = (int)t.has_prefill_http_port;
        out->prefill_http_port = t.prefill_http_port;
        out->expected = topo_ranks(t.attn_tp_size, t.attn_cp_size, t.dp_size, t.pp_size);
        /* every live entry lies in the topology (kvc_pd_register's rule) */
        out->ready = out->registered == out->expected;
    }
    return KVC_OK;
}

static int slot_before(const kvc_pd_slot *a, const kvc_pd_slot *b)
{
    if (a->dp_group != b->dp_group)
        return a->dp_group < b->dp_group;
    if (a->cp_rank != b->cp_rank)
        return a->cp_rank < b->cp_rank;
    if (a->tp_rank != b->tp_rank)
        return a->tp_rank < b->tp_rank;
    return a->pp_rank < b->pp_rank;
}

KVC_API kvc_err kvc_pd_list(kvc_segment *seg, kvc_pd_rank *out, size_t cap, size_t *count)
{
    KVC_ARG(seg);
    KVC_ARG(count);
    if (cap && !out)
        return kvc__fail(KVC_E_INVAL, "kvc_pd_list: out is NULL with cap %zu", cap);
    kvc_pd_region *pd = seg->pd;
    kvc_pd_slot *snap = malloc(KVC_PD_MAX_RANKS * sizeof *snap);
    if (!snap)
        return kvc__fail(KVC_E_SYS, "kvc_pd_list: out of memory for a %zu-byte snapshot",
                         KVC_PD_MAX_RANKS * sizeof *snap);
    struct pd_read r;
    unsigned tries = 0;
    uint64_t deadline = 0;
    kvc_err e;
    for (;;) {
        if (read_begin(pd, &pd->seq_ranks, 1, &r) == 0) {
            for (uint32_t i = 0; i < KVC_PD_MAX_RANKS; i++)
                read_slot(pd, &r, i, &snap[i], sizeof snap[i]);
            if (!kvc_seq_read_retry(&pd->seq_ranks, r.s1))
                break;
        }
        if ((e = read_again(seg, &tries, &deadline))) {
            free(snap);
            return e;
        }
    }
    size_t n = 0;
    /* Selection in key order from the snapshot: at most KVC_PD_MAX_RANKS^2
     * compares (kvcoord-diag, the cluster record, tests). */
    const kvc_pd_slot *prev = NULL;
    for (;;) {
        const kvc_pd_slot *best = NULL;
        for (uint32_t i = 0; i < KVC_PD_MAX_RANKS; i++) {
            const kvc_pd_slot *sl = &snap[i];
            if (sl->state == KVC_PD_FREE || (prev && !slot_before(prev, sl)))
                continue;
            if (!best || slot_before(sl, best))
                best = sl;
        }
        if (!best)
            break;
        if (n < cap)
            fill_rank(best, &out[n]);
        n++;
        prev = best;
    }
    free(snap);
    *count = n;
    return KVC_OK;
}

/* Withdraw slot i (lock held), inside a window. */
static void withdraw_slot(kvc_pd_region *pd, uint32_t i, const char *note)
{
    kvc_pd_slot ns = pd->slots[i];
    ns.state = KVC_PD_WITHDRAWN;
    ns.generation = ++pd->next_generation;
    ns.registered_ns = kvc__now_ns();
    snprintf(ns.note, sizeof ns.note, "%s", note && *note ? note : "withdrawn");
    save_rank(pd, i);
    window_open(pd, &pd->seq_ranks);
    kvc_seq_store(&pd->slots[i], &ns, sizeof ns);
    kvc_seq_write_end(&pd->seq_ranks);
    commit_rank(pd);
}

KVC_API kvc_err kvc_pd_withdraw(kvc_segment *seg, int32_t dp_group, int32_t cp_rank,
                                int32_t tp_rank, int32_t pp_rank, const char *note)
{
    KVC_ARG(seg);
    kvc_err e = kvc__lock(seg, KVC_LOCK_PD);
    if (e)
        return e;
    int32_t i = find_key(seg->pd, dp_group, cp_rank, tp_rank, pp_rank);
    bool live = i >= 0 && seg->pd->slots[i].state == KVC_PD_LIVE;
    if (live)
        withdraw_slot(seg->pd, (uint32_t)i, note);
    kvc__unlock(seg, KVC_LOCK_PD);
    if (!live)
        return kvc__fail(KVC_E_NOENT, "no live prefill rank dp=%d cp=%d tp=%d pp=%d", (int)dp_group,
                         (int)cp_rank, (int)tp_rank, (int)pp_rank);
    return KVC_OK;
}

KVC_API kvc_err kvc_pd_reap(kvc_segment *seg, size_t *withdrawn)
{
    KVC_ARG(seg);
    size_t n = 0;
    kvc_err e = kvc__lock(seg, KVC_LOCK_PD);
    if (e)
        return e;
    kvc_pd_region *pd = seg->pd;
    for (uint32_t i = 0; i < KVC_PD_MAX_RANKS; i++) {
        kvc_pd_slot *s = &pd->slots[i];
        char how[KVC_HOW_MAX + 1] = "", note[KVC_NOTE_MAX + 1];
        if (s->state != KVC_PD_LIVE || !owner_ended(seg, s, how, sizeof how))
            continue;
        if (!*how)
            kvc_exit_unknown_text(s->pid_start, how, sizeof how);
        /* "its process 12 killed by signal 9 (Killed)", as a room's reason */
        snprintf(note, sizeof note, "its process %d %s", (int)s->pid, how);
        withdraw_slot(pd, i, note);
        n++;
    }
    kvc__unlock(seg, KVC_LOCK_PD);
    if (withdrawn)
        *withdrawn = n;
    return KVC_OK;
}

/* ---- room -> DP rank map ---------------------------------------------- */

static uint32_t room_home(int64_t room)
{
    return (uint32_t)(kvc__room_hash((uint64_t)room) >> 32) & (KVC_PD_MAX_ROOMS - 1);
}

_Static_assert((KVC_PD_MAX_ROOMS & (KVC_PD_MAX_ROOMS - 1)) == 0, "a power of two");

/* The slot holding room, or -1; *free_at receives the free slot that ends
 * its probe sequence (-1 if the map is full).  Writers (lock held). */
static int32_t room_find(kvc_pd_region *pd, int64_t room, int32_t *free_at)
{
    uint32_t h = room_home(room);
    if (free_at)
        *free_at = -1;
    for (uint32_t k = 0; k < KVC_PD_MAX_ROOMS; k++) {
        uint32_t i = (h + k) & (KVC_PD_MAX_ROOMS - 1);
        const kvc_pd_room *r = &pd->rooms[i];
        if (r->state == KVC_PD_ROOM_FREE) {
            if (free_at)
                *free_at = (int32_t)i;
            return -1;
        }
        if (r->state == KVC_PD_ROOM_USED && r->room == room)
            return (int32_t)i;
    }
    return -1;
}

/* Write room slot i (lock held): undo record, window, commit. */
static void put_room(kvc_pd_region *pd, uint32_t i, const kvc_pd_room *v)
{
    save_room(pd, i);
    window_open(pd, &pd->seq_rooms);
    kvc_seq_store(&pd->rooms[i], v, sizeof *v);
    kvc_seq_write_end(&pd->seq_rooms);
    commit(pd);
}

static void put_state(kvc_pd_region *pd, uint32_t i, uint32_t state)
{
    kvc_pd_room v = pd->rooms[i];
    v.state = state;
    put_room(pd, i, &v);
}

/* Finish a removal whose hole is tombstone h (lock held): backward shift
 * (layout_pd.h).  Every later entry of the cluster whose home is not in
 * (h, j] is written into the tombstone, its old slot becomes the
 * tombstone; the last tombstone becomes free.  Probes go on past a
 * tombstone, so every entry is found at every step; a writer killed
 * between the two writes of a move leaves a duplicate (found first either
 * way, removed by a later sweep with the same stamp), never a loss. */
static void room_remove_from(kvc_pd_region *pd, uint32_t h)
{
    const uint32_t mask = KVC_PD_MAX_ROOMS - 1;
    for (uint32_t j = (h + 1) & mask; j != h && pd->rooms[j].state == KVC_PD_ROOM_USED;
         j = (j + 1) & mask) {
        uint32_t home = room_home(pd->rooms[j].room);
        /* j's entry may stay if its home lies cyclically in (h, j]. */
        if (((j - home) & mask) < ((j - h) & mask))
            continue;
        kvc_pd_room v = pd->rooms[j];
        put_room(pd, h, &v);
        KVC_INJECT("pd.room.shift");
        put_state(pd, j, KVC_PD_ROOM_TOMB);
        h = j;
    }
    put_state(pd, h, KVC_PD_ROOM_FREE);
}

/* Remove the entry at slot i (lock held). */
static void room_remove(kvc_pd_region *pd, uint32_t i)
{
    put_state(pd, i, KVC_PD_ROOM_TOMB);
    pd->rooms_used--;
    room_remove_from(pd, i);
}

KVC_API kvc_err kvc_pd_room_set(kvc_segment *seg, int64_t room, int32_t dp_rank)
{
    KVC_ARG(seg);
    if (dp_rank < 0 || dp_rank >= KVC_PD_DIM_MAX)
        return kvc__fail(KVC_E_INVAL, "dp_rank %d out of range 0..%d", (int)dp_rank,
                         KVC_PD_DIM_MAX - 1);
    kvc_err e = kvc__lock(seg, KVC_LOCK_PD);
    if (e)
        return e;
    kvc_pd_region *pd = seg->pd;
    int32_t hole, i = room_find(pd, room, &hole);
    /* One slot stays free, so that every probe ends. */
    if (i < 0 && (pd->rooms_used >= KVC_PD_MAX_ROOMS - 1 || (i = hole) < 0)) {
        kvc__unlock(seg, KVC_LOCK_PD);
        return kvc__fail(KVC_E_FULL, "PD room map full (%d rooms)", KVC_PD_MAX_ROOMS - 1);
    }
    kvc_pd_room v = {KVC_PD_ROOM_USED, dp_rank, room, kvc__now_ns()};
    if (pd->rooms[i].state != KVC_PD_ROOM_USED)
        pd->rooms_used++;
    save_room(pd, (uint32_t)i);
    window_open(pd, &pd->seq_rooms);
    KVC_INJECT("pd.room.half");
    kvc_seq_store(&pd->rooms[i], &v, sizeof v);
    kvc_seq_write_end(&pd->seq_rooms);
    commit(pd);
    atomic_store(&pd->g_rooms, pd->rooms_used);
    kvc__unlock(seg, KVC_LOCK_PD);
    return KVC_OK;
}

KVC_API kvc_err kvc_pd_room_get(kvc_segment *seg, int64_t room, int32_t *dp_rank)
{
    KVC_ARG(seg);
    KVC_ARG(dp_rank);
    kvc_pd_region *pd = seg->pd;
    struct pd_read r;
    int found;
    int32_t dp = -1;
    unsigned tries = 0;
    uint64_t deadline = 0;
    kvc_err e;
    const uint32_t home = room_home(room);
    for (;;) {
        found = 0;
        if (read_begin(pd, &pd->seq_rooms, 2, &r) == 0) {
            /* The probe (tombstones are gone past, a free slot ends it). */
            for (uint32_t k = 0; k < KVC_PD_MAX_ROOMS; k++) {
                kvc_pd_room v;
                read_room(pd, &r, (home + k) & (KVC_PD_MAX_ROOMS - 1), &v);
                if (v.state == KVC_PD_ROOM_FREE)
                    break;
                if (v.state == KVC_PD_ROOM_USED && v.room == room) {
                    found = 1;
                    dp = v.dp_rank;
                    break;
                }
            }
            if (!kvc_seq_read_retry(&pd->seq_rooms, r.s1))
                break;
        }
        if ((e = read_again(seg, &tries, &deadline)))
            return e;
    }
    if (!found)
        return kvc__fail(KVC_E_NOENT, "no DP rank registered for bootstrap room %lld",
                         (long long)room);
    *dp_rank = dp;
    return KVC_OK;
}

KVC_API kvc_err kvc_pd_room_sweep(kvc_segment *seg, uint64_t interval_ms, size_t *removed)
{
    KVC_ARG(seg);
    size_t n = 0;
    kvc_err e = kvc__lock(seg, KVC_LOCK_PD);
    if (e)
        return e;
    kvc_pd_region *pd = seg->pd;
    uint64_t now = kvc__now_ns(), limit = interval_ms * 1000000ull;
    /* A removal shifts later entries back into slot i: look at i again. */
    for (uint32_t i = 0; i < KVC_PD_MAX_ROOMS && pd->rooms_used;) {
        kvc_pd_room *r = &pd->rooms[i];
        if (r->state != KVC_PD_ROOM_USED || now < r->stamp_ns || now - r->stamp_ns <= limit) {
            i++;
            continue;
        }
        room_remove(pd, i);
        n++;
    }
    atomic_store(&pd->g_rooms, pd->rooms_used);
    kvc__unlock(seg, KVC_LOCK_PD);
    if (removed)
        *removed = n;
    return KVC_OK;
}

KVC_API kvc_err kvc_pd_gauges_get(kvc_segment *seg, kvc_pd_gauges *out)
{
    KVC_ARG(seg);
    KVC_ARG(out);
    const kvc_pd_region *pd = seg->pd;
    out->live = atomic_load(&pd->g_live);
    out->withdrawn = atomic_load(&pd->g_withdrawn);
    out->expected = atomic_load(&pd->g_expected);
    out->rooms = atomic_load(&pd->g_rooms);
    return KVC_OK;
}
