/*
 * ranks.c - the rank table: each TP rank's transfer-engine info.  This
 * file holds the table's recovery and its writers (register, mirror,
 * withdraw); the lock-free readers are in ranks_read.c, and what both use
 * in ranks_internal.h.
 *
 * Writers hold the rank lock, write the inactive half of the entry's double
 * buffer (descriptor + blob in the arena), then publish it with one store of
 * the active index inside an odd/even sequence bump.  Readers take no lock:
 * they copy the active half and its blob and re-check the sequence
 * (seqlock.h).  A reader of an older value may still be copying the half
 * or the blob a writer now reuses: the writer writes them only through
 * atomic stores, after kvc_seq_write_prepare(), so that such a reader sees
 * the sequence moved and retries.
 *
 * Crash points (KVC_INJECT) name every step of a registration so tests can
 * SIGKILL a writer there; ranks_recover() then makes the table
 * consistent again from the published halves alone.
 *
 * Lock rule: every writer holds the rank lock (kvc__lock KVC_LOCK_RANKS)
 * and takes no other; ranks_recover runs inside kvc__lock after
 * EOWNERDEAD.  Callers: the public API, roles.c (the kvc__entry_* calls),
 * session.c (kvc__ranks_withdraw_proc when a worker's session ends).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json_scan.h"

#include "ranks_internal.h"

const char *kvc__rank_label(kvc_segment *seg, unsigned table, uint32_t rank, char *buf, size_t cap)
{
    unsigned role = table % KVC_RANK_ROLES;
    if (table == 0)
        snprintf(buf, cap, "rank %u", rank);
    else if (table < KVC_TABLE_PARALLELISM)
        snprintf(buf, cap, "rank %u (role %s)", rank, seg->hdr->role_names[role]);
    else
        snprintf(buf, cap, "the parallelism config of rank %u (role %s)", rank,
                 seg->hdr->role_names[role]);
    return buf;
}

/* ---- recovery (rank lock held, after EOWNERDEAD) --------------------- */

static void ranks_recover(kvc_segment *seg, int id)
{
    (void)id;
    kvc_header *h = seg->hdr;
    uint32_t registered = 0;
    kvc__arena_clear_all(seg);
    /* Every table's blobs are in the arena; only the rank table counts. */
    for (uint64_t r = 0; r < (uint64_t)h->max_ranks * KVC_RANK_TABLES; r++) {
        kvc_rank_entry *e = &seg->ranks[r];
        uint64_t seq = atomic_load(&e->seq);
        /* Odd: the writer died inside the publish window.  The active index
         * is either the old or the new half; both are complete. */
        if (seq & 1)
            atomic_store(&e->seq, seq + 1);
        uint32_t a = atomic_load(&e->active) & 1;
        kvc_rank_slot *sl = &e->slot[a];
        if (sl->state != KVC_RANK_REGISTERED)
            continue;
        if (!kvc__rank_slot_sane(seg, sl)) {
            /* Cannot happen short of memory corruption; drop the entry
             * rather than serve or keep unreadable info. */
            kvc_rank_slot w = *sl;
            w.state = KVC_RANK_WITHDRAWN;
            w.blob_blocks = 0;
            snprintf(w.note, sizeof w.note, "info lost: invalid descriptor found by recovery");
            kvc_seq_write_begin(&e->seq);
            kvc_seq_store(sl, &w, sizeof w);
            kvc_seq_write_end(&e->seq);
            continue;
        }
        kvc__arena_mark(seg, sl->blob_off, sl->blob_blocks);
        registered += r < h->max_ranks;
    }
    atomic_store(&h->ranks_registered, registered);
    atomic_fetch_add(&h->rank_epoch, 1);
    kvc__futex_wake_all(&h->rank_epoch);
}

void kvc__ranks_register(kvc_segment *seg)
{
    kvc__lock_register(seg, KVC_LOCK_RANKS, ranks_recover);
}
/* ---- writing (rank lock held) ---------------------------------------- */

/* Strict RFC 8259 validation without building a tree (json_scan.h): the
 * bytes are then stored as they are, numbers included. */
static kvc_err validate_json(const char *json, size_t len, const char *what, uint32_t *entries)
{
    struct kvc_json_error jerr;
    struct kvc_json_root root;
    if (kvc__json_scan(json, len, NULL, 0, &root, &jerr))
        return kvc__fail(KVC_E_INVAL,
                         "%s is not valid JSON: %s at line %u, "
                         "column %u (byte %zu)",
                         what, jerr.text, jerr.line, jerr.column, jerr.offset);
    if (root.type != KVC_JSON_OBJECT)
        return kvc__fail(KVC_E_INVAL, "%s must be a JSON object", what);
    *entries = root.members > UINT32_MAX ? UINT32_MAX : (uint32_t)root.members;
    return KVC_OK;
}

/* Publish the inactive half: the single store of the active index sits in
 * an odd sequence window, so a reader never mixes halves.  The rank lock
 * is held (asserted in debug builds): it is the seq's one writer. */
static void publish(kvc_segment *seg, kvc_rank_entry *e, uint32_t next)
{
    kvc__assert(kvc__lock_held(seg, KVC_LOCK_RANKS));
    (void)seg;
    kvc_seq_write_begin(&e->seq);
    KVC_INJECT("reg.seq_odd");
    atomic_store_explicit(&e->active, next, memory_order_release);
    KVC_INJECT("reg.published");
    kvc_seq_write_end(&e->seq);
}

/* After a publish: free the old half's blob and announce the change. */
static void retire(kvc_segment *seg, kvc_rank_slot *old, int registered_delta)
{
    kvc__arena_free(seg, old->blob_off, old->blob_blocks);
    /* after publish's window opened: a reader still copying old retries */
    __atomic_store_n(&old->blob_blocks, 0, __ATOMIC_RELAXED);
    KVC_INJECT("reg.old_freed");
    if (registered_delta > 0)
        atomic_fetch_add(&seg->hdr->ranks_registered, 1);
    else if (registered_delta < 0)
        atomic_fetch_sub(&seg->hdr->ranks_registered, 1);
    atomic_store(&seg->hdr->updated_ns, kvc__now_ns());
    atomic_fetch_add(&seg->hdr->rank_epoch, 1);
}

/* Who a registration is from: a local one ("", 0) or a mirror of another
 * node's (kvc_rank_register_mirror). */
struct origin {
    const char *name;
    uint64_t generation;
    uint64_t expect; /* the entry's generation it must still have; KVC_GEN_ANY: any */
};

static const struct origin LOCAL = {"", 0, KVC_GEN_ANY};

static bool same_registration(const kvc_segment *seg, const kvc_rank_slot *cur, const char *sid,
                              size_t sid_len, const char *info, size_t info_len,
                              const struct origin *o)
{
    if (cur->state != KVC_RANK_REGISTERED || cur->session_len != sid_len ||
        cur->info_len != info_len || cur->origin_generation != o->generation ||
        strncmp(cur->origin, o->name, sizeof cur->origin))
        return false;
    /* The same bytes from another process are not a no-op when either
     * registration is a worker's (owned: withdrawn at its exit): the new
     * process takes the rank over, or the first one's exit would withdraw
     * the rank from under the one that registered it last (and still runs).
     * Between registrations no exit withdraws (kvcoordd's over HTTP, a
     * client's, a mirror), which process wrote the bytes changes nothing a
     * reader sees: a kvcoordd restarted on the segment re-registering what
     * its predecessor stored keeps the generation. */
    bool owned = seg->role == KVC_ROLE_WORKER && !o->name[0];
    if ((bool)cur->owned != owned)
        return false;
    if (owned && (cur->pid != seg->pid || cur->pid_start != seg->start))
        return false;
    const unsigned char *blob = seg->arena + cur->blob_off;
    return kvc_seq_equal(blob, sid, sid_len) && kvc_seq_equal(blob + sid_len, info, info_len);
}

static kvc_err write_registration(kvc_segment *seg, unsigned table, uint32_t rank, const char *sid,
                                  size_t sid_len, const char *info, size_t info_len,
                                  uint32_t entries, const struct origin *o, uint64_t *gen_out)
{
    kvc_rank_entry *e = kvc__rank_entry(seg, table, rank);
    uint32_t a = atomic_load(&e->active) & 1;
    kvc_rank_slot *cur = &e->slot[a], *nxt = &e->slot[a ^ 1];
    if (o->expect != KVC_GEN_ANY && cur->generation != o->expect)
        return kvc__fail(KVC_E_EXISTS,
                         "rank %u changed meanwhile (generation %llu, expected %llu): not "
                         "overwritten by the mirror of node %s",
                         rank, (unsigned long long)cur->generation, (unsigned long long)o->expect,
                         o->name);
    if (same_registration(seg, cur, sid, sid_len, info, info_len, o)) {
        *gen_out = cur->generation;
        return KVC_OK;
    }
    uint64_t off, blocks;
    kvc_err err = kvc__arena_alloc(seg, sid_len + info_len, &off, &blocks);
    if (err)
        return err;
    err = kvc__reserve(seg, seg->hdr->arena_off + off, blocks * KVC_BLOCK, "rank info");
    if (err) {
        kvc__arena_free(seg, off, blocks);
        return err;
    }
    KVC_INJECT("reg.allocated");
    /* The blob's blocks and nxt may still be read by readers of older
     * values: atomic stores, after the fence (seqlock.h). */
    kvc_seq_write_prepare();
    unsigned char *blob = seg->arena + off;
    kvc_seq_store(blob, sid, sid_len);
    kvc_seq_store(blob + sid_len, info, info_len / 2);
    KVC_INJECT("reg.copying");
    kvc_seq_store(blob + sid_len + info_len / 2, info + info_len / 2, info_len - info_len / 2);
    KVC_INJECT("reg.copied");
    kvc_rank_slot w = {0};
    w.state = KVC_RANK_REGISTERED;
    w.entries = entries;
    w.generation = cur->generation + 1;
    w.changed_ns = kvc__now_ns();
    w.pid = seg->pid;
    w.pid_start = seg->start;
    w.session_len = (uint32_t)sid_len;
    w.blob_off = off;
    w.blob_blocks = blocks;
    w.info_len = info_len;
    w.owned = seg->role == KVC_ROLE_WORKER && !o->name[0];
    w.origin_generation = o->generation;
    snprintf(w.origin, sizeof w.origin, "%s", o->name);
    kvc_seq_store(nxt, &w, sizeof w);
    KVC_INJECT("reg.slot_written");
    int delta = cur->state == KVC_RANK_REGISTERED || table ? 0 : 1;
    publish(seg, e, a ^ 1);
    retire(seg, cur, delta);
    *gen_out = w.generation;
    return KVC_OK;
}

/* Lock-free: is rank's published value exactly (sid, info)?  Compares in
 * place through the seqlock; *gen receives its generation when it is. */
static bool published_equal(kvc_segment *seg, unsigned table, uint32_t rank, const char *sid,
                            size_t sid_len, const char *info, size_t info_len, uint64_t *gen)
{
    kvc_rank_entry *e = kvc__rank_entry(seg, table, rank);
    for (int tries = 0; tries < 4; tries++) {
        kvc_rank_slot sl;
        uint64_t s1;
        int r = kvc__rank_snapshot(e, &sl, &s1, NULL);
        if (r > 0)
            return false; /* a writer is publishing: let the locked path decide */
        if (r < 0)
            continue;
        if (!kvc__rank_slot_sane(seg, &sl))
            return false;
        bool same = same_registration(seg, &sl, sid, sid_len, info, info_len, &LOCAL);
        if (!kvc__rank_unchanged(e, s1))
            continue;
        *gen = sl.generation;
        return same;
    }
    return false;
}

static kvc_err check_args(const char *fn, kvc_segment *seg, uint32_t rank, const char *session_id,
                          const char *info_json, size_t info_len, size_t *sid_len)
{
    if (!seg || !session_id || !info_json)
        return kvc__fail(KVC_E_INVAL, "%s: argument %s is NULL", fn,
                         !seg          ? "seg"
                         : !session_id ? "session_id"
                                       : "info_json");
    kvc_err err = kvc__rank_check(seg, rank);
    if (err)
        return err;
    *sid_len = strlen(session_id);
    if (*sid_len == 0)
        return kvc__fail(KVC_E_INVAL, "session_id is empty");
    if (*sid_len > KVC_SESSION_ID_MAX)
        return kvc__fail(KVC_E_TOOBIG, "session_id is %zu bytes; the limit is %d", *sid_len,
                         KVC_SESSION_ID_MAX);
    if (*sid_len + info_len > seg->hdr->max_info_bytes)
        return kvc__fail(KVC_E_TOOBIG,
                         "rank %u info is %zu bytes (session_id + "
                         "weights_info_dict); the segment's max info bytes is %llu",
                         rank, *sid_len + info_len, (unsigned long long)seg->hdr->max_info_bytes);
    return KVC_OK;
}

/* A parallelism config's arguments: there is no session_id, only the JSON
 * object, which must fit in the segment's max info bytes. */
static kvc_err check_pcfg_args(const char *fn, kvc_segment *seg, uint32_t rank, const char *json,
                               size_t len)
{
    if (!seg || !json)
        return kvc__fail(KVC_E_INVAL, "%s: NULL argument", fn);
    kvc_err err = kvc__rank_check(seg, rank);
    if (err)
        return err;
    if (len > seg->hdr->max_info_bytes)
        return kvc__fail(KVC_E_TOOBIG,
                         "parallelism config of rank %u is %zu bytes; the segment's max info "
                         "bytes is %llu",
                         rank, len, (unsigned long long)seg->hdr->max_info_bytes);
    return KVC_OK;
}

static kvc_err register_checked(kvc_segment *seg, unsigned table, uint32_t rank,
                                const char *session_id, size_t sid_len, const char *info_json,
                                size_t info_len, uint32_t entries, const struct origin *o,
                                uint64_t *gen_out)
{
    kvc_err err = kvc__lock(seg, KVC_LOCK_RANKS);
    if (err)
        return err;
    KVC_INJECT("reg.locked");
    uint64_t gen = 0;
    uint32_t ep = atomic_load(&seg->hdr->rank_epoch);
    err = write_registration(seg, table, rank, session_id, sid_len, info_json, info_len, entries, o,
                             &gen);
    bool changed = atomic_load(&seg->hdr->rank_epoch) != ep;
    kvc__unlock(seg, KVC_LOCK_RANKS);
    if (changed)
        kvc__futex_wake_all(&seg->hdr->rank_epoch);
    if (!err) {
        /* a mirror's writer does not serve that rank */
        if (!o->name[0] && !table && seg->serves_rank)
            seg->serves_rank(seg, (int32_t)rank);
        if (gen_out)
            *gen_out = gen;
    }
    return err;
}

KVC_API kvc_err kvc_rank_register(kvc_segment *seg, uint32_t rank, const char *session_id,
                                  const char *info_json, size_t info_len, uint64_t *gen_out)
{
    size_t sid_len = 0;
    uint64_t gen;
    kvc_err err = check_args(__func__, seg, rank, session_id, info_json, info_len, &sid_len);
    if (err)
        return err;
    /* A repeated registration (a client retrying after its timeout) is
     * answered without parsing megabytes of JSON or taking the lock. */
    if (published_equal(seg, 0, rank, session_id, sid_len, info_json, info_len, &gen)) {
        if (gen_out)
            *gen_out = gen;
        return KVC_OK;
    }
    uint32_t entries = 0; /* set by validate_json; gcc -O2 cannot see it */
    if ((err = validate_json(info_json, info_len, "weights_info_dict", &entries)))
        return err;
    return register_checked(seg, 0, rank, session_id, sid_len, info_json, info_len, entries, &LOCAL,
                            gen_out);
}

KVC_API kvc_err kvc_rank_register_validated(kvc_segment *seg, uint32_t rank, const char *session_id,
                                            const char *info_json, size_t info_len,
                                            uint32_t entries, uint64_t *gen_out)
{
    size_t sid_len = 0;
    kvc_err err = check_args(__func__, seg, rank, session_id, info_json, info_len, &sid_len);
    if (err)
        return err;
    /* Not parsed again (the caller did), but what is plainly not an object
     * is still refused: the table only ever holds JSON objects. */
    if (info_len < 2 || info_json[0] != '{' || info_json[info_len - 1] != '}')
        return kvc__fail(KVC_E_INVAL,
                         "weights_info_dict is not a JSON object (starts with "
                         "0x%02x, %zu bytes)",
                         info_len ? (unsigned char)info_json[0] : 0u, info_len);
    return register_checked(seg, 0, rank, session_id, sid_len, info_json, info_len, entries, &LOCAL,
                            gen_out);
}

static kvc_err check_origin(const char *origin)
{
    if (!origin)
        return kvc__fail(KVC_E_INVAL, "origin node name is NULL");
    if (!*origin || strlen(origin) > KVC_ORIGIN_MAX)
        return kvc__fail(KVC_E_INVAL, "origin node name must be 1..%d bytes", KVC_ORIGIN_MAX);
    for (const char *p = origin; *p; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
              *p == '.' || *p == '_' || *p == '-'))
            return kvc__fail(KVC_E_INVAL,
                             "origin node name '%s' has byte 0x%02x (allowed: "
                             "[A-Za-z0-9._-])",
                             origin, (unsigned char)*p);
    return KVC_OK;
}

KVC_API kvc_err kvc_rank_register_mirror(kvc_segment *seg, uint32_t rank, const char *session_id,
                                         const char *info_json, size_t info_len, const char *origin,
                                         uint64_t origin_generation, uint64_t expect_generation,
                                         uint64_t *gen_out)
{
    KVC_ARG(seg);
    KVC_ARG(origin);
    return kvc__entry_register_mirror(seg, 0, rank, session_id, info_json, info_len, origin,
                                      origin_generation, expect_generation, gen_out);
}

kvc_err kvc__entry_register_mirror(kvc_segment *seg, unsigned table, uint32_t rank,
                                   const char *session_id, const char *json, size_t len,
                                   const char *origin, uint64_t origin_generation,
                                   uint64_t expect_generation, uint64_t *gen_out)
{
    size_t sid_len = 0;
    kvc_err err;
    bool pcfg = table >= KVC_TABLE_PARALLELISM; /* no session_id: only the JSON object */
    if (pcfg) {
        if ((err = check_pcfg_args("kvc_parallelism_register_mirror", seg, rank, json, len)))
            return err;
        session_id = "";
    } else if ((err = check_args("kvc_rank_register_mirror", seg, rank, session_id, json, len,
                                 &sid_len))) {
        return err;
    }
    if ((err = check_origin(origin)))
        return err;
    uint32_t entries = 0; /* set by validate_json; gcc -O2 cannot see it */
    if ((err =
             validate_json(json, len, pcfg ? "parallelism_config" : "weights_info_dict", &entries)))
        return err;
    struct origin o = {origin, origin_generation, expect_generation};
    return register_checked(seg, table, rank, session_id, sid_len, json, len, entries, &o, gen_out);
}

/* Publish a withdrawal of rank (lock held). */
static kvc_err withdraw_locked(kvc_segment *seg, unsigned table, uint32_t rank, const char *note)
{
    kvc_rank_entry *e = kvc__rank_entry(seg, table, rank);
    uint32_t a = atomic_load(&e->active) & 1;
    kvc_rank_slot *cur = &e->slot[a], *nxt = &e->slot[a ^ 1];
    char what[KVC_ROLE_NAME_MAX + 64];
    if (cur->state != KVC_RANK_REGISTERED)
        return kvc__fail(KVC_E_NOENT, "%s is not registered",
                         kvc__rank_label(seg, table, rank, what, sizeof what));
    kvc_rank_slot w = {0};
    w.state = KVC_RANK_WITHDRAWN;
    w.generation = cur->generation + 1;
    w.changed_ns = kvc__now_ns();
    w.pid = seg->pid;
    w.pid_start = seg->start;
    snprintf(w.note, sizeof w.note, "%s", note ? note : "withdrawn");
    memcpy(w.origin, cur->origin, sizeof w.origin); /* a mirror says whose it was */
    w.origin_generation = cur->origin_generation;
    kvc_seq_write_prepare(); /* nxt may still be read by readers of older values */
    kvc_seq_store(nxt, &w, sizeof w);
    publish(seg, e, a ^ 1);
    retire(seg, cur, table ? 0 : -1);
    return KVC_OK;
}

KVC_API kvc_err kvc_rank_withdraw(kvc_segment *seg, uint32_t rank, const char *note)
{
    KVC_ARG(seg);
    return kvc__entry_withdraw(seg, 0, rank, note);
}

KVC_API kvc_err kvc_rank_withdraw_mirror(kvc_segment *seg, uint32_t rank, const char *note,
                                         uint64_t expect_generation)
{
    KVC_ARG(seg);
    return kvc__entry_withdraw_mirror(seg, 0, rank, note, expect_generation);
}

kvc_err kvc__entry_withdraw_mirror(kvc_segment *seg, unsigned table, uint32_t rank,
                                   const char *note, uint64_t expect_generation)
{
    kvc_err err = kvc__rank_check(seg, rank);
    if (err || (err = kvc__lock(seg, KVC_LOCK_RANKS)))
        return err;
    const kvc_rank_entry *e = kvc__rank_entry(seg, table, rank);
    const kvc_rank_slot *cur = &e->slot[atomic_load(&e->active) & 1];
    char what[KVC_ROLE_NAME_MAX + 64];
    if (cur->state == KVC_RANK_REGISTERED &&
        (!cur->origin[0] ||
         (expect_generation != KVC_GEN_ANY && cur->generation != expect_generation)))
        err = kvc__fail(KVC_E_EXISTS, "%s is %s (generation %llu): not withdrawn as a mirror",
                        kvc__rank_label(seg, table, rank, what, sizeof what),
                        cur->origin[0] ? "a newer mirror" : "a local registration now",
                        (unsigned long long)cur->generation);
    else
        err = withdraw_locked(seg, table, rank, note);
    kvc__unlock(seg, KVC_LOCK_RANKS);
    if (!err)
        kvc__futex_wake_all(&seg->hdr->rank_epoch);
    return err;
}

kvc_err kvc__entry_withdraw(kvc_segment *seg, unsigned table, uint32_t rank, const char *note)
{
    if (!seg)
        return kvc__fail(KVC_E_INVAL, "kvc_rank_withdraw: NULL argument");
    kvc_err err = kvc__rank_check(seg, rank);
    if (err || (err = kvc__lock(seg, KVC_LOCK_RANKS)))
        return err;
    err = withdraw_locked(seg, table, rank, note);
    kvc__unlock(seg, KVC_LOCK_RANKS);
    if (!err)
        kvc__futex_wake_all(&seg->hdr->rank_epoch);
    return err;
}

kvc_err kvc__ranks_withdraw_proc(kvc_segment *seg, int32_t pid, uint64_t start, const char *how,
                                 size_t *withdrawn)
{
    kvc_err err = kvc__lock(seg, KVC_LOCK_RANKS);
    if (err)
        return err;
    size_t n = 0;
    for (unsigned t = 0; t < KVC_RANK_TABLES; t++) {
        for (uint32_t r = 0; r < seg->hdr->max_ranks; r++) {
            const kvc_rank_entry *e = kvc__rank_entry(seg, t, r);
            const kvc_rank_slot *cur = &e->slot[atomic_load(&e->active) & 1];
            if (cur->state != KVC_RANK_REGISTERED || !cur->owned || cur->pid != pid ||
                (start && cur->pid_start != start))
                continue;
            char note[KVC_NOTE_MAX + 1];
            snprintf(note, sizeof note, "rank %u's process %d %s", r, (int)pid, how);
            if (withdraw_locked(seg, t, r, note) == KVC_OK && t == 0)
                n++; /* counted: the rank table's; the others follow it */
        }
    }
    kvc__unlock(seg, KVC_LOCK_RANKS);
    if (n)
        kvc__futex_wake_all(&seg->hdr->rank_epoch);
    if (withdrawn)
        *withdrawn = n;
    return KVC_OK;
}

/* ---- entry-level calls for the role and parallelism tables (roles.c) ---- */

kvc_err kvc__entry_register(kvc_segment *seg, unsigned table, uint32_t rank, const char *session_id,
                            const char *json, size_t len, int validated, uint32_t entries,
                            uint64_t *gen_out)
{
    size_t sid_len = 0;
    uint64_t gen;
    kvc_err err;
    if (table >= KVC_TABLE_PARALLELISM) { /* no session_id: only the JSON object */
        if ((err = check_pcfg_args("kvc_parallelism_register", seg, rank, json, len)))
            return err;
        session_id = "";
    } else if ((err =
                    check_args("kvc_role_register", seg, rank, session_id, json, len, &sid_len))) {
        return err;
    }
    if (published_equal(seg, table, rank, session_id, sid_len, json, len, &gen)) {
        if (gen_out)
            *gen_out = gen;
        return KVC_OK;
    }
    if (validated && (len < 2 || json[0] != '{' || json[len - 1] != '}'))
        return kvc__fail(KVC_E_INVAL, "not a JSON object (%zu bytes)", len);
    if (!validated &&
        (err = validate_json(
             json, len, table >= KVC_TABLE_PARALLELISM ? "parallelism_config" : "weights_info_dict",
             &entries)))
        return err;
    return register_checked(seg, table, rank, session_id, sid_len, json, len, entries, &LOCAL,
                            gen_out);
}
