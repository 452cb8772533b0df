/*
 * cluster_publish.c - this node's entries on their way to etcd: the scan of
 * the segment's rank tables that finds local changes (told from the cluster
 * thread's own writes by their generation), the record of a local entry,
 * and publishing the dirty ones many per transaction under the node's lease.
 */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cluster_internal.h"

/* ---- local changes (the rank tables) ------------------------------------- */

static void scan_table(struct cluster *c, unsigned ti)
{
    size_t n = 0;
    if (cluster__seg_list(c, ti, &n) != KVC_OK)
        return;
    if (n > c->cfg.max_ranks)
        n = c->cfg.max_ranks;
    for (size_t i = 0; i < n; i++) {
        const kvc_rank_info *e = &c->tab.list[i];
        struct rslot *s = cluster__slot(c, ti, e->rank);
        if (!s || e->generation == s->seen_gen)
            continue;
        s->seen_gen = e->generation;
        if (e->generation == s->mine_gen)
            continue;
        if (e->state == KVC_RANK_REGISTERED && !e->origin[0]) {
            if (cluster__seg_lookup(c, ti, e->rank, &c->tab.look) != KVC_OK)
                continue; /* changed again meanwhile: the next scan sees it */
            s->seen_gen = c->tab.look.generation;
            s->local = 1;
            s->local_gen = c->tab.look.generation;
            cluster__digest_of(c->tab.look.session_id, c->tab.look.info, c->tab.look.info_len,
                               s->local_digest);
            s->local_rev = INT64_MAX;
            cluster__drop_saved(s);
            s->applied = AP_LOCAL;
            cluster__mark_dirty(c, ti, e->rank, s);
        } else if (e->state == KVC_RANK_REGISTERED) {
            /* A mirror left by an earlier kvcoordd: reconciled with the
             * snapshot (kept meanwhile, so lookups go on answering). */
            s->applied = AP_REMOTE;
            snprintf(s->applied_node, sizeof s->applied_node, "%s", e->origin);
            s->applied_gen = e->origin_generation;
            s->applied_digest[0] = '\0';
            s->mine_gen = e->generation;
        } else if (s->applied == AP_REMOTE) {
            /* Someone withdrew a mirrored entry here: its origin still has
             * it, so it comes back (withdraw on the origin node). */
            s->applied = AP_NONE;
            cluster__apply_winner(c, ti, e->rank, NULL);
        } else if (s->local || s->applied == AP_LOCAL) {
            s->local = 0;
            s->applied = AP_NONE;
            cluster__drop_saved(s);
            cluster__mark_dirty(c, ti, e->rank, s);
            cluster__apply_winner(c, ti, e->rank, NULL);
        }
    }
}

/* Every table of every role the segment keeps: the rank table, the other
 * roles' transfer-engine infos and the parallelism configs. */
void cluster__scan_local(struct cluster *c)
{
    char names[KVC_RANK_ROLES][KVC_ROLE_NAME_MAX + 1];
    size_t nr = 0;
    if (kvc_role_names(c->cfg.seg, names, KVC_RANK_ROLES, &nr) != KVC_OK)
        nr = 1;
    if (nr > KVC_RANK_ROLES)
        nr = KVC_RANK_ROLES;
    snprintf(names[0], sizeof names[0], "%s", KVC_DEFAULT_ROLE);
    for (size_t i = 0; i < nr; i++)
        for (unsigned kind = 0; kind < EK_KINDS; kind++) {
            int ti = cluster__table_for(c, kind, names[i], 1);
            if (ti >= 0)
                scan_table(c, (unsigned)ti);
        }
}

/* ---- publishing ---------------------------------------------------------- */

/* The record of a local entry: the rank table's as before roles were
 * published (no "role"); another role's with "role"; a parallelism
 * config's with "role" and the config as "config" (no session_id). */
static char *rank_record(struct cluster *c, unsigned ti, uint32_t rank, const kvc_rank_info *ri,
                         const char *digest)
{
    json_t *o = json_pack("{s:I, s:s, s:I, s:s, s:I, s:s, s:I}", "rank", (json_int_t)rank, "node",
                          c->cfg.node, "generation", (json_int_t)ri->generation, "digest", digest,
                          "bytes", (json_int_t)ri->info_len, "url", c->cfg.url, "registered_ns",
                          (json_int_t)ri->registered_ns);
    if (!o)
        return NULL;
    if (t_kind(ti) == EK_INFO)
        json_object_set_new(o, "session_id", json_string(ri->session_id));
    if (ti != 0)
        json_object_set_new(o, "role", json_string(t_role(c, ti)));
    if (ri->info_len <= CLUSTER_INLINE_MAX)
        json_object_set_new(o, t_kind(ti) == EK_INFO ? "info" : "config",
                            json_stringn(ri->info, ri->info_len));
    char *s = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    return s;
}

/* Most operations and bytes of one publishing transaction: below etcd's
 * default --max-txn-ops (128) and request limit (1.5 MiB, and values
 * travel base64-encoded: 4/3 of their size). */
#define BATCH_OPS 64

#define BATCH_BYTES (900u * 1024u)

/* The record to put for a dirty local entry, or NULL (changed since the
 * scan: the next scan queues it again). */
static char *local_record(struct cluster *c, unsigned ti, uint32_t rank, struct rslot *s)
{
    kvc_err e = cluster__seg_lookup(c, ti, rank, &c->tab.look);
    if (e == KVC_OK && !c->tab.look.origin[0] && c->tab.look.generation == s->local_gen)
        return rank_record(c, ti, rank, &c->tab.look, s->local_digest);
    if (!s->saved_info)
        return NULL;
    /* Shadowed by a mirror: publish the kept copy. */
    kvc_rank_info tmp = {0};
    tmp.generation = s->local_gen;
    snprintf(tmp.session_id, sizeof tmp.session_id, "%s", s->saved_sid ? s->saved_sid : "");
    tmp.info = s->saved_info;
    tmp.info_len = s->saved_len;
    return rank_record(c, ti, rank, &tmp, s->local_digest);
}

/* Send the dirty entries, many per transaction (a node registering 128
 * ranks costs a few round trips and raft entries, not 128).  Returns 0,
 * -1 when etcd failed (they stay dirty: retried later). */
int cluster__publish_dirty(struct cluster *c)
{
    struct etcd_op ops[BATCH_OPS];
    char *vals[BATCH_OPS];
    char keys[BATCH_OPS][KEY_MAX];
    uint32_t ids[BATCH_OPS];
    while (c->tab.ndirty) {
        size_t n = 0, bytes = 0, take = 0;
        while (take < c->tab.ndirty && n < BATCH_OPS) {
            uint32_t id = c->tab.dirty_q[c->tab.ndirty - 1 - take];
            unsigned ti = id / c->cfg.max_ranks;
            uint32_t rank = id % c->cfg.max_ranks;
            struct rslot *s = slot_at(c, ti, rank);
            char *rec = NULL;
            if (s->dirty && s->local && !(rec = local_record(c, ti, rank, s)))
                s->dirty = 0;
            if (!s->dirty || (!s->local && !s->published)) {
                s->dirty = 0;
                take++;
                continue;
            }
            size_t len = rec ? strlen(rec) : 0;
            if (n && bytes + len > BATCH_BYTES) {
                free(rec);
                break;
            }
            cluster__key_entry(c, ti, c->cfg.node, rank, keys[n], sizeof keys[n]);
            ops[n] = (struct etcd_op){keys[n], rec, len, !s->local};
            vals[n] = rec;
            ids[n] = id;
            bytes += len;
            n++;
            take++;
        }
        int64_t rev = 0;
        int rc = n ? etcd_txn_batch(c->ses.ec, ops, n, c->ses.lease, &rev) : 0;
        for (size_t i = 0; i < n; i++)
            free(vals[i]);
        if (rc) {
            STAT_ADD(c, publish_errors, 1);
            if (strstr(etcd_error(c->ses.ec), "lease not found"))
                cluster__lease_gone(c, "a put found the lease gone");
            else
                cluster__etcd_failed(c, "put");
            return -1;
        }
        if (n)
            cluster__etcd_answered(c);
        size_t puts = 0, dels = 0;
        for (size_t i = 0; i < n; i++) {
            struct rslot *s = slot_at(c, ids[i] / c->cfg.max_ranks, ids[i] % c->cfg.max_ranks);
            if (ops[i].is_delete) {
                s->published = 0;
                dels++;
            } else {
                s->local_rev = rev;
                s->published = 1;
                puts++;
            }
            s->dirty = 0;
        }
        for (size_t i = 0; i < take; i++) {
            uint32_t id = c->tab.dirty_q[c->tab.ndirty - 1];
            slot_at(c, id / c->cfg.max_ranks, id % c->cfg.max_ranks)->queued = 0;
            c->tab.ndirty--;
        }
        pthread_mutex_lock(&c->fig.mu);
        c->fig.st.puts += puts;
        c->fig.st.deletes += dels;
        pthread_mutex_unlock(&c->fig.mu);
    }
    return 0;
}
