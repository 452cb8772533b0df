/*
 * cluster_slots.c - what the cluster thread knows of each entry it follows,
 * and the segment's entries it writes: a table per (kind, role), a slot per
 * rank (this node's registration, the other nodes' records), the segment
 * calls of each table, and the conflict rule that puts the winner of every
 * slot into the segment (cluster__apply_winner), keeping a shadowed local
 * registration aside until the winner goes.
 */

#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cluster_internal.h"
#include "log.h"

/* ---- tables and slots ---------------------------------------------------- */

/* The table of (kind, role) if the role has an index, else -1. */
int cluster__table_find(const struct cluster *c, unsigned kind, const char *role)
{
    for (unsigned i = 0; i < c->tab.nroles; i++)
        if (!strcmp(c->tab.roles[i], role))
            return (int)(kind * CLUSTER_ROLES + i);
    return -1;
}

/* The table of (kind, role), claiming a role index for a new name (local:
 * a role of this node's segment, which always finds one).  -1: no index
 * left for a name only peers use. */
int cluster__table_for(struct cluster *c, unsigned kind, const char *role, int local)
{
    int ti = cluster__table_find(c, kind, role);
    if (ti >= 0)
        return ti;
    if (c->tab.nroles >= (local ? CLUSTER_ROLES : REMOTE_ROLES_MAX))
        return -1;
    snprintf(c->tab.roles[c->tab.nroles], sizeof c->tab.roles[0], "%s", role);
    return (int)(kind * CLUSTER_ROLES + c->tab.nroles++);
}

struct rslot *cluster__slot(struct cluster *c, unsigned ti, uint32_t rank)
{
    if (rank >= c->cfg.max_ranks || ti >= NTABLES)
        return NULL;
    if (!c->tab.slots[ti] &&
        !(c->tab.slots[ti] = calloc(c->cfg.max_ranks, sizeof *c->tab.slots[ti])))
        return NULL;
    if (!c->tab.slots[ti][rank])
        c->tab.slots[ti][rank] = calloc(1, sizeof(struct rslot));
    return c->tab.slots[ti][rank];
}

void cluster__free_remote(struct remote *r)
{
    free(r->info);
    free(r);
}

void cluster__drop_saved(struct rslot *s)
{
    free(s->saved_sid);
    free(s->saved_info);
    s->saved_sid = s->saved_info = NULL;
    s->saved_len = 0;
    s->saved_pid = 0;
}

void cluster__mark_dirty(struct cluster *c, unsigned ti, uint32_t rank, struct rslot *s)
{
    s->dirty = 1;
    if (s->queued)
        return;
    if (c->tab.ndirty == c->tab.cap_dirty) {
        size_t cap = c->tab.cap_dirty ? c->tab.cap_dirty * 2 : 256;
        uint32_t *q = realloc(c->tab.dirty_q, cap * sizeof *q);
        if (!q)
            return; /* stays dirty: queued again by the next session or snapshot */
        c->tab.dirty_q = q, c->tab.cap_dirty = cap;
    }
    s->queued = 1;
    c->tab.dirty_q[c->tab.ndirty++] = ti * c->cfg.max_ranks + rank;
}

/* ---- the segment's entries, by table ------------------------------------- */

kvc_err cluster__seg_lookup(struct cluster *c, unsigned ti, uint32_t rank, kvc_rank_info *out)
{
    if (ti == 0)
        return kvc_rank_lookup(c->cfg.seg, rank, out);
    if (t_kind(ti) == EK_INFO)
        return kvc_role_lookup(c->cfg.seg, t_role(c, ti), rank, out);
    return kvc_parallelism_lookup(c->cfg.seg, t_role(c, ti), rank, out);
}

kvc_err cluster__seg_list(struct cluster *c, unsigned ti, size_t *n)
{
    if (ti == 0)
        return kvc_rank_list(c->cfg.seg, c->tab.list, c->cfg.max_ranks, n, 1);
    if (t_kind(ti) == EK_INFO)
        return kvc_role_list(c->cfg.seg, t_role(c, ti), c->tab.list, c->cfg.max_ranks, n, 1);
    return kvc_parallelism_list(c->cfg.seg, t_role(c, ti), c->tab.list, c->cfg.max_ranks, n, 1);
}

/* A local registration again (a shadowed one coming back). */
static kvc_err seg_register(struct cluster *c, unsigned ti, uint32_t rank, const char *sid,
                            const char *info, size_t len, uint64_t *gen)
{
    if (t_kind(ti) == EK_INFO)
        return kvc_role_register(c->cfg.seg, t_role(c, ti), rank, sid, info, len, gen);
    return kvc_parallelism_register(c->cfg.seg, t_role(c, ti), rank, info, len, gen);
}

static kvc_err seg_mirror(struct cluster *c, unsigned ti, uint32_t rank, const struct remote *r,
                          uint64_t expect, uint64_t *gen)
{
    if (ti == 0)
        return kvc_rank_register_mirror(c->cfg.seg, rank, r->sid, r->info, r->info_len, r->node,
                                        r->gen, expect, gen);
    if (t_kind(ti) == EK_INFO)
        return kvc_role_register_mirror(c->cfg.seg, t_role(c, ti), rank, r->sid, r->info,
                                        r->info_len, r->node, r->gen, expect, gen);
    return kvc_parallelism_register_mirror(c->cfg.seg, t_role(c, ti), rank, r->info, r->info_len,
                                           r->node, r->gen, expect, gen);
}

kvc_err cluster__seg_withdraw(struct cluster *c, unsigned ti, uint32_t rank, const char *note,
                              uint64_t expect)
{
    if (ti == 0)
        return kvc_rank_withdraw_mirror(c->cfg.seg, rank, note, expect);
    if (t_kind(ti) == EK_INFO)
        return kvc_role_withdraw_mirror(c->cfg.seg, t_role(c, ti), rank, note, expect);
    return kvc_parallelism_withdraw_mirror(c->cfg.seg, t_role(c, ti), rank, note, expect);
}

/* "rank 3", "rank 3 role=draft", "parallelism rank 3 role=target": which
 * entry a log line is about. */
const char *cluster__entry_label(const struct cluster *c, unsigned ti, uint32_t rank, char *buf,
                                 size_t cap)
{
    if (ti == 0)
        snprintf(buf, cap, "rank=%u", rank);
    else
        snprintf(buf, cap, "rank=%u role=%s kind=%s", rank, t_role(c, ti),
                 t_kind(ti) == EK_INFO ? "transfer_engine_info" : "parallelism_config");
    return buf;
}

/* ---- the winner ---------------------------------------------------------- */

static void remember_mine(struct cluster *c, unsigned ti, uint32_t rank, struct rslot *s)
{
    /* The generation our write produced: read it back (a withdrawal does
     * not return it). */
    kvc_err e = cluster__seg_lookup(c, ti, rank, &c->tab.look);
    if (e == KVC_OK || e == KVC_E_WITHDRAWN)
        s->mine_gen = s->seen_gen = c->tab.look.generation;
}

/* Look at the rank table again on the next turn of the loop. */
static void rescan(struct cluster *c)
{
    pthread_mutex_lock(&c->in.mu);
    c->in.rank_changed = 1;
    pthread_mutex_unlock(&c->in.mu);
}

struct remote *cluster__find_remote(struct rslot *s, const char *node, struct remote ***link)
{
    struct remote **pp = &s->remotes;
    for (; *pp; pp = &(*pp)->next)
        if (!strcmp((*pp)->node, node)) {
            if (link)
                *link = pp;
            return *pp;
        }
    return NULL;
}

/* Put the winner of (table ti, rank) into the segment (the conflict rule
 * of cluster.h).  note: why a mirrored entry goes, when it does. */
void cluster__apply_winner(struct cluster *c, unsigned ti, uint32_t rank, const char *note)
{
    struct rslot *s = cluster__slot(c, ti, rank);
    if (!s)
        return;
    char lbl[96];
    struct remote *best = NULL;
    int64_t best_rev = s->local ? s->local_rev : -1;
    for (struct remote *r = s->remotes; r; r = r->next)
        if (r->info && r->mod_rev > best_rev)
            best = r, best_rev = r->mod_rev;
    uint64_t gen;
    kvc_err e = KVC_OK;
    if (!best && s->local) {
        if (s->applied != AP_LOCAL && s->saved_info) {
            e = seg_register(c, ti, rank, s->saved_sid, s->saved_info, s->saved_len, &gen);
            if (e == KVC_OK)
                remember_mine(c, ti, rank, s);
            cluster__drop_saved(s);
        }
        s->applied = AP_LOCAL;
    } else if (best) {
        if (s->applied == AP_REMOTE && !strcmp(s->applied_node, best->node) &&
            s->applied_gen == best->gen && !strcmp(s->applied_digest, best->digest))
            return;
        if (s->applied == AP_LOCAL && s->local && !s->saved_info &&
            cluster__seg_lookup(c, ti, rank, &c->tab.look) == KVC_OK && !c->tab.look.origin[0]) {
            s->saved_sid = strdup(c->tab.look.session_id);
            s->saved_info = malloc(c->tab.look.info_len + 1);
            if (s->saved_info)
                memcpy(s->saved_info, c->tab.look.info, c->tab.look.info_len + 1);
            s->saved_len = c->tab.look.info_len;
            /* Withdrawn with its process only if that still runs now: a
             * registration left by an earlier kvcoordd of this segment (its
             * pid gone) stays this node's until withdrawn. */
            s->saved_pid = c->tab.look.pid > 0 && (kill(c->tab.look.pid, 0) == 0 || errno == EPERM)
                               ? c->tab.look.pid
                               : 0;
            if (!s->saved_sid || !s->saved_info)
                cluster__drop_saved(s);
        }
        /* Conditional on the generation last seen: a local registration
         * landing meanwhile is never overwritten (the scan it triggers
         * decides again). */
        e = seg_mirror(c, ti, rank, best, s->seen_gen, &gen);
        if (e == KVC_E_INVAL || e == KVC_E_TOOBIG) {
            /* The bytes (matching their digest) are not what the segment
             * holds (not a JSON object, too large): the record is skipped
             * and the next best one decides. */
            char key[KEY_MAX];
            cluster__key_entry(c, ti, best->node, rank, key, sizeof key);
            cluster__record_skipped(c, key, kvc_last_error());
            struct remote **link;
            if (cluster__find_remote(s, best->node, &link)) {
                *link = best->next;
                cluster__free_remote(best);
            }
            cluster__apply_winner(c, ti, rank, note);
            return;
        }
        if (e == KVC_OK) {
            s->mine_gen = s->seen_gen = gen;
            s->applied = AP_REMOTE;
            snprintf(s->applied_node, sizeof s->applied_node, "%s", best->node);
            s->applied_gen = best->gen;
            snprintf(s->applied_digest, sizeof s->applied_digest, "%s", best->digest);
            STAT_ADD(c, mirror_writes, 1);
            log_event(LOG_DEBUG, "mirror_put",
                      "%s origin=%s origin_generation=%" PRIu64 " rev=%" PRId64,
                      cluster__entry_label(c, ti, rank, lbl, sizeof lbl), best->node, best->gen,
                      best->mod_rev);
        }
    } else if (s->applied == AP_REMOTE) {
        char buf[KVC_NOTE_MAX + 1];
        snprintf(buf, sizeof buf, "%s", note ? note : "no node's record of it can be served now");
        e = cluster__seg_withdraw(c, ti, rank, buf, s->seen_gen);
        if (e == KVC_OK || e == KVC_E_NOENT)
            remember_mine(c, ti, rank, s);
        if (e == KVC_E_EXISTS)
            rescan(c);
        s->applied = AP_NONE;
        STAT_ADD(c, mirror_withdrawals, 1);
        log_event(LOG_DEBUG, "mirror_withdrawn", "%s origin=%s note=\"%s\"",
                  cluster__entry_label(c, ti, rank, lbl, sizeof lbl), s->applied_node, buf);
        e = KVC_OK;
    }
    if (e == KVC_E_EXISTS)
        rescan(c); /* changed on this node meanwhile */
    else if (e != KVC_OK)
        log_event(LOG_WARN, "mirror_write_failed", "%s err=\"%s\"",
                  cluster__entry_label(c, ti, rank, lbl, sizeof lbl), kvc_last_error());
}

/* A shadowed local registration of a worker that has exited: the segment
 * no longer holds it (the mirror does), so the library's withdrawal at the
 * worker's end did not reach it; withdraw it here. */
void cluster__reap_shadowed(struct cluster *c)
{
    char lbl[96];
    for (unsigned ti = 0; ti < NTABLES; ti++)
        for (uint32_t r = 0; c->tab.slots[ti] && r < c->cfg.max_ranks; r++) {
            struct rslot *s = c->tab.slots[ti][r];
            if (!s || !s->saved_info || s->saved_pid <= 0 || s->saved_pid == getpid() ||
                kill(s->saved_pid, 0) == 0 || errno != ESRCH)
                continue;
            log_event(LOG_INFO, "shadowed_withdrawn",
                      "%s pid=%d note=\"the worker of this node's registration (shadowed by "
                      "node %s's) exited\"",
                      cluster__entry_label(c, ti, r, lbl, sizeof lbl), (int)s->saved_pid,
                      s->applied_node);
            cluster__drop_saved(s);
            s->local = 0;
            cluster__mark_dirty(c, ti, r, s);
            cluster__apply_winner(c, ti, r, NULL);
        }
}
