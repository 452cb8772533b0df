/*
 * ranks_read.c - reading the rank tables without a lock: kvc_rank_lookup,
 * kvc_rank_wait, kvc_rank_list, the rank epoch, and the seqlock snapshot
 * of an entry (kvc__rank_snapshot) that inspect's peek uses too.
 *
 * Readers copy the active half of the entry's double buffer and its blob
 * and re-check the sequence (seqlock.h); the writer (ranks.c) stores only
 * through atomic stores after kvc_seq_write_prepare(), so a reader of an
 * older value that is still copying sees the sequence moved and retries.
 *
 * Lock rule: no lock, except that a reader which keeps seeing an odd
 * sequence (ODD_SPINS) takes the rank lock once, which recovers a dead
 * writer, and evens a stale odd sequence under it.  Callers: the public API
 * (workers, kvcoordd's lookups, the Python binding); kvc__entry_lookup and
 * kvc__entry_list by roles.c for the role and parallelism tables;
 * kvc__rank_snapshot by src/inspect/.
 */
#include <sched.h>
#include <stdlib.h>
#include <string.h>

#include "ranks_internal.h"

/* Spins on an odd sequence before suspecting a dead writer and taking the
 * lock (which runs recovery if the writer is dead). */
#define ODD_SPINS 2000

int kvc__rank_snapshot(kvc_rank_entry *e, kvc_rank_slot *sl, uint64_t *seq, uint32_t *active)
{
    uint64_t s1 = kvc_seq_read_begin(&e->seq);
    *seq = s1;
    if (s1 & 1 && !active)
        return 1; /* a lookup only needs to know */
    uint32_t a = atomic_load_explicit(&e->active, memory_order_acquire);
    kvc_seq_load(sl, &e->slot[a & 1], sizeof *sl);
    if (active)
        *active = a;
    if (s1 & 1)
        return 1;
    return kvc__rank_unchanged(e, s1) ? 0 : -1;
}

/* Wait out an odd sequence; after ODD_SPINS take the lock, which recovers a
 * dead writer's entry (or waits for a live one).  Holding the lock, an odd
 * sequence can only be stale - every writer publishes under the lock - so
 * it is evened here too: a reader never spins forever. */
static kvc_err odd_backoff(kvc_segment *seg, kvc_rank_entry *e, int *spins)
{
    if (++*spins < ODD_SPINS) {
        sched_yield();
        return KVC_OK;
    }
    *spins = 0;
    kvc_err err = kvc__lock(seg, KVC_LOCK_RANKS);
    if (err)
        return err;
    uint64_t seq = atomic_load(&e->seq);
    if (seq & 1)
        atomic_store(&e->seq, seq + 1);
    kvc__unlock(seg, KVC_LOCK_RANKS);
    return KVC_OK;
}

static void fill_meta(kvc_rank_info *out, uint32_t rank, const kvc_rank_slot *sl)
{
    out->rank = rank;
    out->state = (kvc_rank_state)sl->state;
    out->generation = sl->generation;
    out->registered_ns = sl->changed_ns;
    out->pid = sl->pid;
    out->entries = sl->entries;
    memcpy(out->note, sl->note, sizeof out->note);
    out->note[KVC_NOTE_MAX] = '\0';
    memcpy(out->origin, sl->origin, sizeof out->origin);
    out->origin[KVC_ORIGIN_MAX] = '\0';
    out->origin_generation = sl->origin_generation;
}

static kvc_err grow(kvc_rank_info *out, size_t need)
{
    if (out->info_cap >= need)
        return KVC_OK;
    size_t cap = out->info_cap ? out->info_cap : 4096;
    while (cap < need)
        cap *= 2;
    char *p = realloc(out->info, cap);
    if (!p)
        return kvc__fail(KVC_E_SYS, "out of memory for %zu bytes of rank info", cap);
    out->info = p;
    out->info_cap = cap;
    return KVC_OK;
}

/* Read rank's published half (and its blob when want_info) consistently. */
static kvc_err read_entry(kvc_segment *seg, unsigned table, uint32_t rank, kvc_rank_info *out,
                          bool want_info)
{
    kvc_rank_entry *e = kvc__rank_entry(seg, table, rank);
    char what[KVC_ROLE_NAME_MAX + 64];
    int spins = 0;
    for (;;) {
        kvc_rank_slot sl;
        uint64_t s1;
        int r = kvc__rank_snapshot(e, &sl, &s1, NULL);
        if (r > 0) {
            kvc_err err = odd_backoff(seg, e, &spins);
            if (err)
                return err;
        }
        if (r)
            continue;
        if (!kvc__rank_slot_sane(seg, &sl))
            return kvc__fail(KVC_E_CORRUPT, "%s of segment %s has an invalid descriptor",
                             kvc__rank_label(seg, table, rank, what, sizeof what), seg->name);
        if (sl.state == KVC_RANK_REGISTERED && want_info) {
            kvc_err err = grow(out, sl.info_len + 1);
            if (err)
                return err;
            const unsigned char *blob = seg->arena + sl.blob_off;
            kvc_seq_load(out->session_id, blob, sl.session_len);
            kvc_seq_load(out->info, blob + sl.session_len, sl.info_len);
        } else if (sl.state == KVC_RANK_REGISTERED) {
            kvc_seq_load(out->session_id, seg->arena + sl.blob_off, sl.session_len);
        }
        if (!kvc__rank_unchanged(e, s1))
            continue; /* the blob may have been reused meanwhile */
        fill_meta(out, rank, &sl);
        if (sl.state == KVC_RANK_EMPTY)
            return kvc__fail(KVC_E_NOENT, "%s is not registered",
                             kvc__rank_label(seg, table, rank, what, sizeof what));
        if (sl.state == KVC_RANK_WITHDRAWN) {
            out->session_id[0] = '\0';
            return kvc__fail(KVC_E_WITHDRAWN, "%s was withdrawn: %s",
                             kvc__rank_label(seg, table, rank, what, sizeof what), sl.note);
        }
        out->session_id[sl.session_len] = '\0';
        if (want_info) {
            out->info[sl.info_len] = '\0';
            out->info_len = sl.info_len;
        }
        return KVC_OK;
    }
}

KVC_API kvc_err kvc_rank_lookup(kvc_segment *seg, uint32_t rank, kvc_rank_info *out)
{
    KVC_ARG(seg);
    KVC_ARG(out);
    kvc_err e = kvc__rank_check(seg, rank);
    return e ? e : read_entry(seg, 0, rank, out, true);
}

KVC_API void kvc_rank_info_free(kvc_rank_info *ri)
{
    if (!ri)
        return;
    free(ri->info);
    ri->info = NULL;
    ri->info_len = 0;
    ri->info_cap = 0;
}

KVC_API uint32_t kvc_rank_epoch(kvc_segment *seg)
{
    if (!seg) {
        kvc__fail(KVC_E_INVAL, "kvc_rank_epoch: argument seg is NULL");
        return 0;
    }
    return atomic_load_explicit(&seg->hdr->rank_epoch, memory_order_acquire);
}

KVC_API kvc_err kvc_rank_wait_change(kvc_segment *seg, uint32_t seen, uint32_t timeout_ms)
{
    KVC_ARG(seg);
    return kvc__epoch_wait(&seg->hdr->rank_epoch, seen, timeout_ms, "rank table");
}

KVC_API kvc_err kvc_rank_wait(kvc_segment *seg, uint32_t rank, uint32_t timeout_ms,
                              kvc_rank_info *out)
{
    KVC_ARG(seg);
    KVC_ARG(out);
    kvc_err e = kvc__rank_check(seg, rank);
    if (e)
        return e;
    uint64_t deadline = kvc__mono_ns() + (uint64_t)timeout_ms * 1000000ull;
    for (;;) {
        /* Epoch first, then the entry: a registration in between changes
         * the epoch, so the futex wait below returns at once (no lost wake). */
        uint32_t ep = kvc_rank_epoch(seg);
        e = read_entry(seg, 0, rank, out, true);
        if (e != KVC_E_NOENT && e != KVC_E_WITHDRAWN)
            return e;
        uint64_t now = kvc__mono_ns();
        if (now >= deadline)
            return kvc__fail(KVC_E_TIMEDOUT, "rank %u not registered within %u ms", rank,
                             timeout_ms);
        uint64_t left_ms = (deadline - now + 999999) / 1000000;
        kvc__futex_wait(&seg->hdr->rank_epoch, ep, (uint32_t)left_ms);
    }
}

/* Lock-free: is entry e plainly empty (never registered)?  Lets a listing
 * skip it without read_entry()'s message for the caller's last error (the
 * daemon lists the whole table after every registration). */
static bool plainly_empty(kvc_rank_entry *e)
{
    uint64_t s1 = kvc_seq_read_begin(&e->seq);
    if (s1 & 1)
        return false;
    uint32_t state; /* the state alone, inside the same seqlock window */
    kvc_seq_load(&state, &e->slot[atomic_load_explicit(&e->active, memory_order_acquire) & 1].state,
                 sizeof state);
    return kvc__rank_unchanged(e, s1) && state == KVC_RANK_EMPTY;
}

KVC_API kvc_err kvc_rank_list(kvc_segment *seg, kvc_rank_info *out, size_t cap, size_t *count,
                              int include_withdrawn)
{
    KVC_ARG(seg);
    KVC_ARG(count);
    if (cap)
        KVC_ARG(out);
    return kvc__entry_list(seg, 0, out, cap, count, include_withdrawn);
}

kvc_err kvc__entry_list(kvc_segment *seg, unsigned table, kvc_rank_info *out, size_t cap,
                        size_t *count, int include_withdrawn)
{
    size_t n = 0;
    for (uint32_t r = 0; r < seg->hdr->max_ranks; r++) {
        if (plainly_empty(kvc__rank_entry(seg, table, r)))
            continue;
        kvc_rank_info tmp = {0};
        kvc_err e = read_entry(seg, table, r, &tmp, false);
        if (e == KVC_OK || (e == KVC_E_WITHDRAWN && include_withdrawn)) {
            if (n < cap) {
                char *info = out[n].info;
                size_t len = out[n].info_len, icap = out[n].info_cap;
                out[n] = tmp;
                out[n].info = info, out[n].info_len = len, out[n].info_cap = icap;
            }
            n++;
        } else if (e != KVC_E_NOENT && e != KVC_E_WITHDRAWN) {
            return e;
        }
    }
    *count = n;
    return KVC_OK;
}

/* The entry-level lookup for the role and parallelism tables (roles.c). */
kvc_err kvc__entry_lookup(kvc_segment *seg, unsigned table, uint32_t rank, kvc_rank_info *out)
{
    if (!seg || !out)
        return kvc__fail(KVC_E_INVAL, "lookup: NULL argument");
    kvc_err e = kvc__rank_check(seg, rank);
    return e ? e : read_entry(seg, table, rank, out, true);
}
