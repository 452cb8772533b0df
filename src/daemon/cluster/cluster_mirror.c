/*
 * cluster_mirror.c - the other nodes' records, as the watch thread delivers
 * them (a snapshot, then events): their node records, their entries'
 * records (checked; the large bytes are asked of the fetch thread,
 * cluster_fetch.c), deletions, and dropping the mirror when the watch
 * stays unconfirmed longer than the nodes' leases.
 */

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "cluster_internal.h"
#include "log.h"

/* ---- nodes --------------------------------------------------------------- */

static struct node_rec *find_node(struct cluster *c, const char *name)
{
    for (size_t i = 0; i < c->peers.nnodes; i++)
        if (!strcmp(c->peers.nodes[i].name, name))
            return &c->peers.nodes[i];
    return NULL;
}

static void node_put(struct cluster *c, const char *name, const etcd_kv *kv)
{
    struct node_rec *n = find_node(c, name);
    if (!n) {
        if (c->peers.nnodes == c->peers.cap_nodes) {
            size_t cap = c->peers.cap_nodes ? c->peers.cap_nodes * 2 : 16;
            struct node_rec *p = realloc(c->peers.nodes, cap * sizeof *p);
            if (!p)
                return;
            c->peers.nodes = p, c->peers.cap_nodes = cap;
        }
        n = &c->peers.nodes[c->peers.nnodes++];
        memset(n, 0, sizeof *n);
        snprintf(n->name, sizeof n->name, "%s", name);
        n->seen_ns = kvc__now_ns();
        if (strcmp(name, c->cfg.node))
            log_event(LOG_INFO, "node_joined", "cluster=%s node=%s", c->cfg.cluster, name);
        cluster__follow_node_back(c, name);
    }
    n->stale = 0;
    n->lease = kv->lease;
    json_error_t je;
    json_t *o = json_loadb(kv->value, kv->value_len, 0, &je);
    const char *url = json_string_value(json_object_get(o, "url"));
    snprintf(n->url, sizeof n->url, "%s", url ? url : "");
    n->pid = json_integer_value(json_object_get(o, "pid"));
    n->ttl = json_integer_value(json_object_get(o, "ttl"));
    n->started_ns = (uint64_t)json_integer_value(json_object_get(o, "started_ns"));
    json_decref(o);
}

static void node_delete(struct cluster *c, const char *name)
{
    struct node_rec *n = find_node(c, name);
    if (!n)
        return;
    if (strcmp(name, c->cfg.node))
        log_event(LOG_INFO, "node_left",
                  "cluster=%s node=%s note=\"its lease ended (stopped, "
                  "killed or frozen past its TTL)\"",
                  c->cfg.cluster, name);
    cluster__follow_node_left(c, name); /* the rooms it shared fail here */
    *n = c->peers.nodes[--c->peers.nnodes];
}

/* ---- remote records (watch) ---------------------------------------------- */

static void rank_delete(struct cluster *c, unsigned ti, const char *node, uint32_t rank);

/* A record of node's entry arrived (put). */
static void rank_put(struct cluster *c, unsigned ti, const struct keyref *k, const etcd_kv *kv,
                     int apply)
{
    uint32_t rank = (uint32_t)k->num;
    struct rslot *s = cluster__slot(c, ti, rank);
    if (!s)
        return;
    json_error_t je;
    json_t *o = json_loadb(kv->value, kv->value_len, 0, &je);
    if (!strcmp(k->node, c->cfg.node)) {
        /* Our own record: its revision orders it against the others (an
         * older one, overtaken by a later local change, does not count). */
        const char *dg = json_string_value(json_object_get(o, "digest"));
        s->published = 1;
        if (s->local && dg && !strcmp(dg, s->local_digest) && s->local_rev == INT64_MAX)
            s->local_rev = kv->mod_rev;
        json_decref(o);
        return;
    }
    struct rec rc;
    const char *why = cluster__check_record(c, ti, k, o, &rc);
    char d2[DIGEST_HEX];
    if (!why && rc.info) {
        cluster__digest_of(rc.sid, rc.info, rc.info_len, d2);
        if (strcmp(d2, rc.digest)) {
            STAT_ADD(c, digest_mismatches, 1);
            why = "its bytes do not match its \"digest\"";
        }
    }
    if (why) {
        /* Skipped: the key holds nothing usable now, so what it held before
         * goes (as a snapshot would see it). */
        cluster__record_skipped(c, kv->key, why);
        json_decref(o);
        rank_delete(c, ti, k->node, rank);
        return;
    }
    struct remote *r = cluster__find_remote(s, k->node, NULL);
    if (!r) {
        r = calloc(1, sizeof *r);
        if (!r) {
            json_decref(o);
            return;
        }
        snprintf(r->node, sizeof r->node, "%s", k->node);
        r->next = s->remotes;
        s->remotes = r;
    }
    r->stale = 0;
    int same = r->info && !strcmp(r->digest, rc.digest) && !strcmp(r->sid, rc.sid);
    r->mod_rev = kv->mod_rev;
    r->gen = rc.gen;
    snprintf(r->digest, sizeof r->digest, "%s", rc.digest);
    snprintf(r->sid, sizeof r->sid, "%s", rc.sid);
    snprintf(r->url, sizeof r->url, "%s", rc.url);
    if (!same) {
        free(r->info);
        r->info = NULL;
        if (rc.info && (r->info = malloc(rc.info_len + 1))) {
            memcpy(r->info, rc.info, rc.info_len + 1);
            r->info_len = rc.info_len;
        } else if (!rc.info) {
            r->fetch_retry_at = 0;
            cluster__fetch_ask(c, ti, rank, r); /* the fetch thread's answer applies it */
        }
    }
    json_decref(o);
    char note[KVC_NOTE_MAX + 1];
    if (!r->info)
        snprintf(note, sizeof note, "replaced on node %s; its new bytes are being fetched",
                 r->node);
    if (apply)
        cluster__apply_winner(c, ti, rank, r->info ? NULL : note);
}

static void rank_delete(struct cluster *c, unsigned ti, const char *node, uint32_t rank)
{
    struct rslot *s = cluster__slot(c, ti, rank);
    if (!s)
        return;
    if (!strcmp(node, c->cfg.node)) {
        if (s->published) {
            /* Our key went without us (lease expired while we were frozen,
             * or an operator): put it back. */
            s->published = 0;
            if (s->local)
                cluster__mark_dirty(c, ti, rank, s);
        }
        return;
    }
    struct remote **link;
    struct remote *r = cluster__find_remote(s, node, &link);
    if (!r)
        return;
    *link = r->next;
    cluster__free_remote(r);
    char note[KVC_NOTE_MAX + 1];
    if (find_node(c, node))
        snprintf(note, sizeof note, "withdrawn on node %s", node);
    else
        snprintf(note, sizeof note, "node %s left the cluster (its lease ended)", node);
    cluster__apply_winner(c, ti, rank, note);
}

/* The table of an entry key, or -1 (logged: more role names than this
 * node follows, or a rank beyond its segment's). */
static int entry_table(struct cluster *c, const struct keyref *k, const char *key)
{
    if (k->num >= c->cfg.max_ranks) {
        char why[96];
        snprintf(why, sizeof why, "rank beyond this node's max ranks (%u)", c->cfg.max_ranks);
        cluster__record_skipped(c, key, why);
        return -1;
    }
    int ti = cluster__table_for(c, k->kind, k->role, !strcmp(k->node, c->cfg.node));
    if (ti < 0)
        cluster__record_skipped(c, key,
                                "more role names in the cluster than this node follows (12)");
    return ti;
}

void cluster__handle_events(struct cluster *c, const etcd_event *ev, size_t n)
{
    struct keyref k;
    const char *why;
    /* Our own record deleted with others': etcd revoked live leases (a
     * member resumed from a pause, a restore), not only dead nodes'. */
    for (size_t i = 0; i < n; i++)
        if (ev[i].is_delete && cluster__parse_key(c, ev[i].kv.key, &k, &why) == K_NODE &&
            !strcmp(k.node, c->cfg.node))
            c->ses.trouble_mono = kvc__mono_ns();
    /* Nodes first: a lease's end deletes the node key and its ranks in one
     * revision, and the withdrawal notes should say the node left. */
    for (size_t i = 0; i < n; i++) {
        if (cluster__parse_key(c, ev[i].kv.key, &k, &why) != K_NODE)
            continue;
        if (ev[i].is_delete) {
            node_delete(c, k.node);
            if (!strcmp(k.node, c->cfg.node) && c->ses.lease)
                c->ses.next_keepalive = 0; /* is our lease gone?  ask now */
        } else {
            node_put(c, k.node, &ev[i].kv);
        }
    }
    for (size_t i = 0; i < n; i++) {
        enum key_kind kk = cluster__parse_key(c, ev[i].kv.key, &k, &why);
        int ti;
        if (kk == K_BAD && !ev[i].is_delete) {
            cluster__record_skipped(c, ev[i].kv.key, why);
        } else if (kk == K_ENTRY && ev[i].is_delete) {
            if (k.num < c->cfg.max_ranks && (ti = cluster__table_find(c, k.kind, k.role)) >= 0)
                rank_delete(c, (unsigned)ti, k.node, (uint32_t)k.num);
        } else if (kk == K_ENTRY && (ti = entry_table(c, &k, ev[i].kv.key)) >= 0) {
            rank_put(c, (unsigned)ti, &k, &ev[i].kv, 1);
        } else if (kk == K_ROOM && !ev[i].is_delete) {
            cluster__adopt_room(c, ev[i].kv.value, ev[i].kv.value_len);
        } else if (kk == K_PD) {
            cluster__pd_record(c, k.node, &ev[i].kv, ev[i].is_delete);
        } else if (kk == K_FOLLOW) {
            cluster__follow_record(c, k.node, k.num, ev[i].is_delete);
        }
        pthread_mutex_lock(&c->fig.mu);
        if (ev[i].kv.mod_rev > c->fig.st.revision)
            c->fig.st.revision = ev[i].kv.mod_rev;
        pthread_mutex_unlock(&c->fig.mu);
    }
}

/* A full snapshot replaces what we knew of the others. */
void cluster__handle_snapshot(struct cluster *c, const etcd_kv *kvs, size_t n, int64_t rev)
{
    for (size_t i = 0; i < c->peers.nnodes; i++)
        c->peers.nodes[i].stale = 1;
    for (unsigned ti = 0; ti < NTABLES; ti++)
        for (uint32_t r = 0; c->tab.slots[ti] && r < c->cfg.max_ranks; r++)
            if (c->tab.slots[ti][r])
                for (struct remote *x = c->tab.slots[ti][r]->remotes; x; x = x->next)
                    x->stale = 1;
    struct keyref k;
    const char *why;
    int own_seen_node = 0;
    cluster__pd_snapshot_begin(c);
    cluster__follow_snapshot_begin(c);
    for (size_t i = 0; i < n; i++)
        if (cluster__parse_key(c, kvs[i].key, &k, &why) == K_NODE) {
            node_put(c, k.node, &kvs[i]);
            own_seen_node |= !strcmp(k.node, c->cfg.node);
        }
    for (size_t i = c->peers.nnodes; i-- > 0;)
        if (c->peers.nodes[i].stale)
            node_delete(c, c->peers.nodes[i].name);
    /* Which of our own keys etcd has. */
    for (unsigned ti = 0; ti < NTABLES; ti++)
        for (uint32_t r = 0; c->tab.slots[ti] && r < c->cfg.max_ranks; r++)
            if (c->tab.slots[ti][r])
                c->tab.slots[ti][r]->published = 0;
    for (size_t i = 0; i < n; i++) {
        enum key_kind kk = cluster__parse_key(c, kvs[i].key, &k, &why);
        int ti;
        if (kk == K_BAD)
            cluster__record_skipped(c, kvs[i].key, why);
        else if (kk == K_ENTRY && (ti = entry_table(c, &k, kvs[i].key)) >= 0)
            rank_put(c, (unsigned)ti, &k, &kvs[i], 0);
        else if (kk == K_ROOM)
            cluster__adopt_room(c, kvs[i].value, kvs[i].value_len);
        else if (kk == K_PD)
            cluster__pd_record(c, k.node, &kvs[i], 0);
        else if (kk == K_FOLLOW)
            cluster__follow_record(c, k.node, k.num, 0);
    }
    cluster__pd_snapshot_end(c);
    cluster__follow_snapshot_end(c);
    for (unsigned ti = 0; ti < NTABLES; ti++)
        for (uint32_t r = 0; c->tab.slots[ti] && r < c->cfg.max_ranks; r++) {
            struct rslot *s = c->tab.slots[ti][r];
            if (!s)
                continue;
            for (struct remote **pp = &s->remotes; *pp;) {
                if ((*pp)->stale) {
                    struct remote *x = *pp;
                    *pp = x->next;
                    cluster__free_remote(x);
                } else {
                    pp = &(*pp)->next;
                }
            }
            if (s->local != s->published)
                cluster__mark_dirty(c, ti, r,
                                    s); /* etcd lost it (or never had it), or it is stale */
            if (s->remotes || s->applied == AP_REMOTE) {
                struct remote *pend = cluster__find_remote(s, s->applied_node, NULL);
                cluster__apply_winner(c, ti, r,
                                      pend && !pend->info
                                          ? "replaced on its origin node; its new bytes are "
                                            "being fetched from it"
                                          : "its origin node no longer publishes it");
            }
        }
    if (!own_seen_node && c->ses.lease)
        c->ses.next_keepalive = 0;
    c->peers.have_snapshot = 1;
    c->peers.dropped = 0;
    pthread_mutex_lock(&c->fig.mu);
    if (rev > c->fig.st.revision)
        c->fig.st.revision = rev;
    pthread_mutex_unlock(&c->fig.mu);
}

/* Drop every remote record this node holds and what it mirrored from them
 * (note: why), looking at every entry when all (else only those with
 * remote records); returns how many entries had some. */
size_t cluster__drop_remotes(struct cluster *c, const char *note, int all)
{
    size_t n = 0;
    for (unsigned ti = 0; ti < NTABLES; ti++)
        for (uint32_t r = 0; c->tab.slots[ti] && r < c->cfg.max_ranks; r++) {
            struct rslot *s = c->tab.slots[ti][r];
            if (!s || (!s->remotes && !all))
                continue;
            n += s->remotes != NULL;
            while (s->remotes) {
                struct remote *x = s->remotes;
                s->remotes = x->next;
                cluster__free_remote(x);
            }
            cluster__apply_winner(c, ti, r, note);
        }
    return n;
}

/* The watch has not been confirmed current (a message, an answered probe,
 * a snapshot) for longer than the other nodes' leases: what we mirror may
 * be gone there, so it goes here too (it comes back with the next
 * snapshot). */
void cluster__drop_unverified(struct cluster *c, uint64_t since_mono)
{
    char note[KVC_NOTE_MAX + 1];
    uint64_t ms = (kvc__mono_ns() - since_mono) / 1000000ull;
    snprintf(note, sizeof note,
             "%s: mirror not confirmed for %" PRIu64 ".%03u s, past the lease TTL",
             c->ses.etcd_down_since ? "etcd unreachable" : "etcd's watch stream unconfirmed",
             ms / 1000, (unsigned)(ms % 1000));
    size_t n = cluster__drop_remotes(c, note, 0);
    cluster__pd_drop(c, note);
    c->peers.dropped = 1;
    pthread_mutex_lock(&c->in.mu);
    c->in.restart_watch = 1; /* the next stream starts with a snapshot */
    pthread_mutex_unlock(&c->in.mu);
    STAT_ADD(c, mirror_dropped, n);
    log_event(LOG_WARN, "mirror_dropped", "cluster=%s node=%s ranks=%zu note=\"%s\"",
              c->cfg.cluster, c->cfg.node, n, note);
}

/* Mirrored entries an earlier kvcoordd of this segment left: withdrawn
 * before anything serves them (cluster_start, before the HTTP server and
 * the threads run); the first snapshot mirrors again what etcd confirms. */
size_t cluster__withdraw_leftovers(struct cluster *c)
{
    char names[KVC_RANK_ROLES][KVC_ROLE_NAME_MAX + 1];
    size_t nr = 0, n = 0;
    if (kvc_role_names(c->cfg.seg, names, KVC_RANK_ROLES, &nr) != KVC_OK)
        nr = 1;
    if (nr > KVC_RANK_ROLES)
        nr = KVC_RANK_ROLES;
    snprintf(names[0], sizeof names[0], "%s", KVC_DEFAULT_ROLE);
    for (size_t i = 0; i < nr; i++)
        for (unsigned kind = 0; kind < EK_KINDS; kind++) {
            int ti = cluster__table_for(c, kind, names[i], 1);
            size_t cnt = 0;
            if (ti < 0 || cluster__seg_list(c, (unsigned)ti, &cnt) != KVC_OK)
                continue;
            for (size_t k = 0; k < cnt && k < c->cfg.max_ranks; k++) {
                const kvc_rank_info *e = &c->tab.list[k];
                if (e->state != KVC_RANK_REGISTERED || !e->origin[0])
                    continue;
                char note[KVC_NOTE_MAX + 1], lbl[96];
                snprintf(note, sizeof note,
                         "mirrored from node %s before kvcoordd restarted; awaits etcd", e->origin);
                if (cluster__seg_withdraw(c, (unsigned)ti, e->rank, note, e->generation) ==
                    KVC_OK) {
                    n++;
                    log_event(LOG_INFO, "mirror_unconfirmed", "%s origin=%s note=\"%s\"",
                              cluster__entry_label(c, (unsigned)ti, e->rank, lbl, sizeof lbl),
                              e->origin, note);
                }
            }
        }
    return n;
}
