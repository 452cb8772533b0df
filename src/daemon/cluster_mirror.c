/*
 * cluster_mirror.c - the other nodes' records, as the watch thread delivers
 * them (a snapshot, then events): their node records, their entries'
 * records (checked, the large bytes fetched from the origin kvcoordd and
 * checked against their digest), deletions, and dropping the mirror when
 * etcd stays away longer than the nodes' leases.
 */

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "cluster_internal.h"
#include "log.h"

#define FETCH_TIMEOUT_MS 5000

/* ---- nodes --------------------------------------------------------------- */

static struct node_rec *find_node(struct cluster *c, const char *name)
{
    for (size_t i = 0; i < c->nnodes; i++)
        if (!strcmp(c->nodes[i].name, name))
            return &c->nodes[i];
    return NULL;
}

static void node_put(struct cluster *c, const char *name, const etcd_kv *kv)
{
    struct node_rec *n = find_node(c, name);
    if (!n) {
        if (c->nnodes == c->cap_nodes) {
            size_t cap = c->cap_nodes ? c->cap_nodes * 2 : 16;
            struct node_rec *p = realloc(c->nodes, cap * sizeof *p);
            if (!p)
                return;
            c->nodes = p, c->cap_nodes = cap;
        }
        n = &c->nodes[c->nnodes++];
        memset(n, 0, sizeof *n);
        snprintf(n->name, sizeof n->name, "%s", name);
        n->seen_ns = kvc__now_ns();
        if (strcmp(name, c->node))
            log_event(LOG_INFO, "node_joined", "cluster=%s node=%s", c->cluster, name);
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
    if (strcmp(name, c->node))
        log_event(LOG_INFO, "node_left",
                  "cluster=%s node=%s note=\"its lease ended (stopped, "
                  "killed or frozen past its TTL)\"",
                  c->cluster, name);
    *n = c->nodes[--c->nnodes];
}

/* ---- large entries, fetched from their origin ---------------------------- */

/* The answer of a fetch, at most limit bytes (a peer's url may answer
 * anything). */
struct fetch_buf {
    char *p;
    size_t len, cap, limit;
};

static size_t fetch_write(char *data, size_t size, size_t nmemb, void *arg)
{
    struct fetch_buf *b = arg;
    size_t n = size * nmemb;
    if (n > b->limit - b->len)
        return 0; /* too large: curl stops with CURLE_WRITE_ERROR */
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 64 * 1024;
        while (cap < b->len + n + 1)
            cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p)
            return 0;
        b->p = p, b->cap = cap;
    }
    memcpy(b->p + b->len, data, n);
    b->len += n;
    b->p[b->len] = '\0';
    return n;
}

/* Fetch a large entry's bytes from its origin kvcoordd (GET
 * /get_transfer_engine_info or /get_parallelism_config, with ?role= for a
 * role other than the default) and check them against the record's
 * digest.  Returns 0 with r->info set, else -1. */
int cluster__fetch_info(struct cluster *c, unsigned ti, uint32_t rank, struct remote *r)
{
    if (!r->url[0])
        return -1;
    STAT_ADD(c, fetches, 1);
    char url[URL_MAX + 128], lbl[96];
    snprintf(url, sizeof url, "%s/%s?rank=%u%s%s", r->url,
             t_kind(ti) == EK_INFO ? "get_transfer_engine_info" : "get_parallelism_config", rank,
             ti % CLUSTER_ROLES ? "&role=" : "", ti % CLUSTER_ROLES ? t_role(c, ti) : "");
    /* The answer: the stored bytes, with the JSON-escaped session_id around
     * them for a transfer-engine info (at most 6 bytes per byte). */
    struct fetch_buf b = {NULL, 0, 0, c->max_info_bytes + 6 * KVC_SESSION_ID_MAX + 256};
    curl_easy_reset(c->fetch);
    curl_easy_setopt(c->fetch, CURLOPT_URL, url);
    curl_easy_setopt(c->fetch, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(c->fetch, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c->fetch, CURLOPT_TIMEOUT_MS, (long)FETCH_TIMEOUT_MS);
    curl_easy_setopt(c->fetch, CURLOPT_CONNECTTIMEOUT_MS, 1000L);
    curl_easy_setopt(c->fetch, CURLOPT_MAXFILESIZE_LARGE, (curl_off_t)b.limit);
    curl_easy_setopt(c->fetch, CURLOPT_WRITEFUNCTION, fetch_write);
    curl_easy_setopt(c->fetch, CURLOPT_WRITEDATA, &b);
    CURLcode cc = curl_easy_perform(c->fetch);
    long status = 0;
    curl_easy_getinfo(c->fetch, CURLINFO_RESPONSE_CODE, &status);
    int rc = -1;
    const char *why = "bad answer";
    const char *info = NULL;
    size_t ilen = 0;
    char sidbuf[KVC_SESSION_ID_MAX + 1] = "";
    json_t *sid = NULL;
    if (cc != CURLE_OK) {
        why = cc == CURLE_WRITE_ERROR || cc == CURLE_FILESIZE_EXCEEDED
                  ? "answer larger than this segment's max info bytes"
                  : curl_easy_strerror(cc);
    } else if (status != 200) {
        why = "not 200";
    } else if (t_kind(ti) == EK_PCFG) {
        info = b.p ? b.p : "", ilen = b.len; /* the stored object, verbatim */
    } else {
        /* {"rank":N,"remote_instance_transfer_engine_info":["<sid>",<info>]}
         * with info verbatim: take the bytes between the session_id string
         * and the closing "]}" (parsing and re-serialising would change
         * them). */
        const char *tag = "\"remote_instance_transfer_engine_info\":[";
        char *at = b.p ? strstr(b.p, tag) : NULL;
        if (at) {
            at += strlen(tag);
            json_error_t je;
            sid = json_loadb(at, b.len - (size_t)(at - b.p),
                             JSON_DECODE_ANY | JSON_DISABLE_EOF_CHECK, &je);
            char *p = at + je.position;
            if (json_is_string(sid) && json_string_length(sid) <= KVC_SESSION_ID_MAX && *p == ',' &&
                b.len >= 2 && !memcmp(b.p + b.len - 2, "]}", 2) && p + 1 <= b.p + b.len - 2) {
                snprintf(sidbuf, sizeof sidbuf, "%s", json_string_value(sid));
                info = p + 1, ilen = (size_t)(b.p + b.len - 2 - (p + 1));
            }
        }
    }
    if (info) {
        char dg[DIGEST_HEX];
        cluster__digest_of(sidbuf, info, ilen, dg);
        if (!strcmp(dg, r->digest) && !strcmp(sidbuf, r->sid)) {
            free(r->info);
            r->info = malloc(ilen + 1);
            if (r->info) {
                memcpy(r->info, info, ilen);
                r->info[ilen] = '\0';
                r->info_len = ilen;
                rc = 0;
            }
        } else {
            why = "digest mismatch (the origin changed it since: a newer record follows)";
            STAT_ADD(c, digest_mismatches, 1);
        }
    }
    json_decref(sid);
    free(b.p);
    if (rc) {
        STAT_ADD(c, fetch_failures, 1);
        log_event(LOG_WARN, "mirror_fetch_failed", "%s origin=%s url=%s err=\"%s\"",
                  cluster__entry_label(c, ti, rank, lbl, sizeof lbl), r->node, url, why);
    }
    return rc;
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
    if (!strcmp(k->node, c->node)) {
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
            cluster__fetch_info(c, ti, rank, r);
        }
    }
    json_decref(o);
    if (apply)
        cluster__apply_winner(c, ti, rank, NULL);
}

static void rank_delete(struct cluster *c, unsigned ti, const char *node, uint32_t rank)
{
    struct rslot *s = cluster__slot(c, ti, rank);
    if (!s)
        return;
    if (!strcmp(node, c->node)) {
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
    if (k->num >= c->max_ranks) {
        char why[96];
        snprintf(why, sizeof why, "rank beyond this node's max ranks (%u)", c->max_ranks);
        cluster__record_skipped(c, key, why);
        return -1;
    }
    int ti = cluster__table_for(c, k->kind, k->role, !strcmp(k->node, c->node));
    if (ti < 0)
        cluster__record_skipped(c, key,
                                "more role names in the cluster than this node follows (12)");
    return ti;
}

void cluster__handle_events(struct cluster *c, const etcd_event *ev, size_t n)
{
    struct keyref k;
    const char *why;
    /* Nodes first: a lease's end deletes the node key and its ranks in one
     * revision, and the withdrawal notes should say the node left. */
    for (size_t i = 0; i < n; i++) {
        if (cluster__parse_key(c, ev[i].kv.key, &k, &why) != K_NODE)
            continue;
        if (ev[i].is_delete) {
            node_delete(c, k.node);
            if (!strcmp(k.node, c->node) && c->lease)
                c->next_keepalive = 0; /* is our lease gone?  ask now */
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
            if (k.num < c->max_ranks && (ti = cluster__table_find(c, k.kind, k.role)) >= 0)
                rank_delete(c, (unsigned)ti, k.node, (uint32_t)k.num);
        } else if (kk == K_ENTRY && (ti = entry_table(c, &k, ev[i].kv.key)) >= 0) {
            rank_put(c, (unsigned)ti, &k, &ev[i].kv, 1);
        } else if (kk == K_ROOM && !ev[i].is_delete) {
            cluster__adopt_room(c, ev[i].kv.value, ev[i].kv.value_len);
        }
        pthread_mutex_lock(&c->smu);
        if (ev[i].kv.mod_rev > c->st.revision)
            c->st.revision = ev[i].kv.mod_rev;
        pthread_mutex_unlock(&c->smu);
    }
}

/* A full snapshot replaces what we knew of the others. */
void cluster__handle_snapshot(struct cluster *c, const etcd_kv *kvs, size_t n, int64_t rev)
{
    for (size_t i = 0; i < c->nnodes; i++)
        c->nodes[i].stale = 1;
    for (unsigned ti = 0; ti < NTABLES; ti++)
        for (uint32_t r = 0; c->slots[ti] && r < c->max_ranks; r++)
            if (c->slots[ti][r])
                for (struct remote *x = c->slots[ti][r]->remotes; x; x = x->next)
                    x->stale = 1;
    struct keyref k;
    const char *why;
    int own_seen_node = 0;
    for (size_t i = 0; i < n; i++)
        if (cluster__parse_key(c, kvs[i].key, &k, &why) == K_NODE) {
            node_put(c, k.node, &kvs[i]);
            own_seen_node |= !strcmp(k.node, c->node);
        }
    for (size_t i = c->nnodes; i-- > 0;)
        if (c->nodes[i].stale)
            node_delete(c, c->nodes[i].name);
    /* Which of our own keys etcd has. */
    for (unsigned ti = 0; ti < NTABLES; ti++)
        for (uint32_t r = 0; c->slots[ti] && r < c->max_ranks; r++)
            if (c->slots[ti][r])
                c->slots[ti][r]->published = 0;
    for (size_t i = 0; i < n; i++) {
        enum key_kind kk = cluster__parse_key(c, kvs[i].key, &k, &why);
        int ti;
        if (kk == K_BAD)
            cluster__record_skipped(c, kvs[i].key, why);
        else if (kk == K_ENTRY && (ti = entry_table(c, &k, kvs[i].key)) >= 0)
            rank_put(c, (unsigned)ti, &k, &kvs[i], 0);
        else if (kk == K_ROOM)
            cluster__adopt_room(c, kvs[i].value, kvs[i].value_len);
    }
    for (unsigned ti = 0; ti < NTABLES; ti++)
        for (uint32_t r = 0; c->slots[ti] && r < c->max_ranks; r++) {
            struct rslot *s = c->slots[ti][r];
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
            if (s->remotes || s->applied == AP_REMOTE)
                cluster__apply_winner(c, ti, r, "its origin node no longer publishes it");
        }
    if (!own_seen_node && c->lease)
        c->next_keepalive = 0;
    c->have_snapshot = 1;
    c->dropped = 0;
    pthread_mutex_lock(&c->smu);
    if (rev > c->st.revision)
        c->st.revision = rev;
    pthread_mutex_unlock(&c->smu);
}

/* Drop every remote record this node holds and what it mirrored from them
 * (note: why), looking at every entry when all (else only those with
 * remote records); returns how many entries had some. */
size_t cluster__drop_remotes(struct cluster *c, const char *note, int all)
{
    size_t n = 0;
    for (unsigned ti = 0; ti < NTABLES; ti++)
        for (uint32_t r = 0; c->slots[ti] && r < c->max_ranks; r++) {
            struct rslot *s = c->slots[ti][r];
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

/* etcd stayed away longer than the other nodes' leases: what we mirror
 * may be gone there, so it goes here too (it comes back with the next
 * snapshot). */
void cluster__drop_unverified(struct cluster *c, uint64_t since_mono)
{
    char note[KVC_NOTE_MAX + 1];
    snprintf(note, sizeof note,
             "etcd unreachable for %" PRIu64 " s: mirror unverified past its "
             "lease TTL",
             (uint64_t)((kvc__mono_ns() - since_mono) / 1000000000ull));
    size_t n = cluster__drop_remotes(c, note, 0);
    c->dropped = 1;
    pthread_mutex_lock(&c->mu);
    c->restart_watch = 1; /* the next stream starts with a snapshot */
    pthread_mutex_unlock(&c->mu);
    STAT_ADD(c, mirror_dropped, n);
    log_event(LOG_WARN, "mirror_dropped", "cluster=%s node=%s ranks=%zu note=\"%s\"", c->cluster,
              c->node, n, note);
}
