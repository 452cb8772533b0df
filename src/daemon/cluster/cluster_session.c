/*
 * cluster_session.c - this node's session with etcd: whether etcd answers
 * (the figures, the log lines, the backoff), the lease, and the node key
 * nodes/<node>, created only when no other kvcoordd holds the name; a new
 * session republishes everything this node holds.
 */

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "clock.h"
#include "cluster_internal.h"
#include "log.h"

/* ---- etcd's health ------------------------------------------------------- */

void cluster__etcd_failed(struct cluster *c, const char *what)
{
    uint64_t now = kvc__mono_ns();
    int first = !c->ses.etcd_down_since;
    if (first)
        c->ses.etcd_down_since = now;
    c->ses.trouble_mono = now;
    pthread_mutex_lock(&c->fig.mu);
    c->fig.st.etcd_errors++;
    if (first) {
        c->fig.st.etcd_up = 0;
        c->fig.st.etcd_down_since_ns = kvc__now_ns();
    }
    snprintf(c->fig.st.last_error, sizeof c->fig.st.last_error, "%s: %s", what,
             etcd_error(c->ses.ec));
    pthread_mutex_unlock(&c->fig.mu);
    /* A refused password is logged even when the outage began otherwise
     * (an authentication cut by its deadline on a loaded host): once. */
    int refused = strstr(etcd_error(c->ses.ec), "authentication of user") != NULL;
    if (first)
        log_event(LOG_WARN, "etcd_unreachable",
                  "cluster=%s node=%s op=%s err=\"%s\" note=\"serving this node's ranks; "
                  "retrying with backoff\"",
                  c->cfg.cluster, c->cfg.node, what, etcd_error(c->ses.ec));
    else if (refused && !c->ses.auth_logged)
        log_event(LOG_ERROR, "etcd_auth_refused",
                  "cluster=%s node=%s op=%s err=\"%s\" note=\"check --etcd-user and "
                  "--etcd-password-file; retrying with backoff\"",
                  c->cfg.cluster, c->cfg.node, what, etcd_error(c->ses.ec));
    if (first)
        c->ses.auth_logged = refused;
    else if (refused)
        c->ses.auth_logged = 1;
}

void cluster__etcd_answered(struct cluster *c)
{
    int recovered = c->ses.etcd_down_since != 0;
    if (recovered) {
        uint64_t down_ms = (kvc__mono_ns() - c->ses.etcd_down_since) / 1000000;
        log_event(LOG_INFO, "etcd_reachable", "cluster=%s node=%s endpoint=%s down_ms=%" PRIu64,
                  c->cfg.cluster, c->cfg.node, etcd_endpoint(c->ses.ec), down_ms);
        c->ses.etcd_down_since = 0;
    }
    c->ses.backoff_ms = 0;
    pthread_mutex_lock(&c->fig.mu);
    /* GET /cluster's last_error is the trouble now: the etcd error of the
     * outage that just ended goes (the etcd_reachable line above and the
     * etcd_unreachable one before keep it). */
    if (recovered)
        c->fig.st.last_error[0] = '\0';
    c->fig.st.etcd_up = 1;
    c->fig.st.etcd_down_since_ns = 0;
    snprintf(c->fig.st.endpoint, sizeof c->fig.st.endpoint, "%s", etcd_endpoint(c->ses.ec));
    pthread_mutex_unlock(&c->fig.mu);
}

uint32_t cluster__next_backoff(struct cluster *c)
{
    c->ses.backoff_ms = c->ses.backoff_ms ? c->ses.backoff_ms * 2 : BACKOFF_MIN_MS;
    if (c->ses.backoff_ms > BACKOFF_MAX_MS)
        c->ses.backoff_ms = BACKOFF_MAX_MS;
    return c->ses.backoff_ms;
}

void cluster__lease_gone(struct cluster *c, const char *why)
{
    log_event(LOG_WARN, "lease_lost",
              "cluster=%s node=%s lease=%" PRId64 " why=\"%s\" note=\"republishing everything "
              "this node holds under a new lease\"",
              c->cfg.cluster, c->cfg.node, c->ses.lease, why);
    c->ses.lease = 0;
    c->ses.trouble_mono = kvc__mono_ns(); /* a live node's lease lapsed: others' may have too */
    c->ses.retry_at = 0;
    pthread_mutex_lock(&c->fig.mu);
    c->fig.st.lease_lost++;
    c->fig.st.lease_id = 0;
    pthread_mutex_unlock(&c->fig.mu);
}

/* ---- session: lease, node key, republish --------------------------------- */

/* The "url" of a node record (a kvcoordd's nodes/<name> value) into
 * out[0..cap); 0 when it has none. */
static int node_url_of(const etcd_kv *kv, char *out, size_t cap)
{
    json_error_t je;
    json_t *o = kv->value ? json_loadb(kv->value, kv->value_len, 0, &je) : NULL;
    const char *u = json_string_value(json_object_get(o, "url"));
    if (u)
        snprintf(out, cap, "%s", u);
    json_decref(o);
    return u != NULL;
}

/* Another kvcoordd holds this node name: say so once per episode, and in
 * GET /cluster's last_error; nothing of this node is published meanwhile. */
static void name_in_use(struct cluster *c, const char *other, const etcd_kv *kv)
{
    cluster__etcd_answered(c); /* etcd is up: the name is the trouble */
    /* st.name_conflict is written only by this thread, so read unlocked. */
    int first = !c->fig.st.name_conflict;
    pthread_mutex_lock(&c->fig.mu);
    c->fig.st.name_conflict = 1;
    snprintf(c->fig.st.name_holder, sizeof c->fig.st.name_holder, "%s", other);
    snprintf(c->fig.st.last_error, sizeof c->fig.st.last_error,
             "node name %.64s is in use by the kvcoordd at %.100s (lease %" PRId64
             "); waiting for its lease to end",
             c->cfg.node, other, kv->lease);
    pthread_mutex_unlock(&c->fig.mu);
    if (first)
        log_event(LOG_ERROR, "node_name_in_use",
                  "cluster=%s node=%s url=%s other_url=%s other_lease=%" PRId64
                  " note=\"another kvcoordd runs with the same --node; nothing of this node is "
                  "published until its lease ends: give each node its own --node\"",
                  c->cfg.cluster, c->cfg.node, c->cfg.url, other, kv->lease);
}

static int start_session(struct cluster *c)
{
    int64_t lease;
    if (etcd_lease_grant(c->ses.ec, c->cfg.ttl_s, &lease)) {
        cluster__etcd_failed(c, "lease grant");
        return -1;
    }
    char key[256];
    cluster__key_node(c, key, sizeof key);
    json_t *o = json_pack("{s:s, s:s, s:I, s:I, s:I}", "node", c->cfg.node, "url", c->cfg.url,
                          "pid", (json_int_t)getpid(), "ttl", (json_int_t)c->cfg.ttl_s,
                          "started_ns", (json_int_t)kvc__now_ns());
    char *val = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    /* Create-only: a live record of this node name with another URL is
     * another kvcoordd using the same --node, whose records this one
     * would overwrite; wait (with backoff) until its lease ends.  A record
     * with this URL is an earlier kvcoordd of this node (SIGKILLed, or
     * this one frozen past its TTL): replaced. */
    int created = 0, rc = -1, taken = 0;
    etcd_kv cur = {0};
    if (val &&
        !(rc = etcd_put_create(c->ses.ec, key, val, strlen(val), lease, &created, &cur, NULL)) &&
        !created) {
        char other[URL_MAX];
        taken = node_url_of(&cur, other, sizeof other) && strcmp(other, c->cfg.url);
        if (taken)
            name_in_use(c, other, &cur);
        else
            rc = etcd_put(c->ses.ec, key, val, strlen(val), lease, NULL);
    }
    etcd_kv_free(&cur);
    free(val);
    if (taken) {
        etcd_lease_revoke(c->ses.ec, lease);
        return -1;
    }
    if (rc) {
        cluster__etcd_failed(c, "node put");
        return -1;
    }
    if (c->fig.st.name_conflict) { /* written only by this thread: read unlocked */
        log_event(LOG_INFO, "node_name_free", "cluster=%s node=%s url=%s", c->cfg.cluster,
                  c->cfg.node, c->cfg.url);
        pthread_mutex_lock(&c->fig.mu);
        c->fig.st.name_conflict = 0;
        c->fig.st.name_holder[0] = '\0';
        c->fig.st.last_error[0] = '\0';
        pthread_mutex_unlock(&c->fig.mu);
    }
    /* Our keys under an earlier lease (this process frozen past its TTL,
     * or an earlier kvcoordd of this node killed moments ago), of the
     * three kinds. */
    static const char *const dirs[] = {"ranks", "roles", "parallelism"};
    etcd_kv *own[3] = {NULL, NULL, NULL};
    size_t nown[3] = {0, 0, 0};
    for (int d = 0; d < 3; d++) {
        char prefix[KEY_MAX];
        snprintf(prefix, sizeof prefix, "%s%s/%s/", c->cfg.prefix, dirs[d], c->cfg.node);
        if (etcd_range_prefix(c->ses.ec, prefix, &own[d], &nown[d], NULL)) {
            for (int e = 0; e < d; e++)
                etcd_kvs_free(own[e], nown[e]);
            cluster__etcd_failed(c, "range own keys");
            return -1;
        }
    }
    c->ses.lease = lease;
    for (int d = 0; d < 3; d++) {
        for (size_t i = 0; i < nown[d]; i++) {
            struct keyref k;
            const char *why;
            struct rslot *s;
            int ti;
            if (cluster__parse_key(c, own[d][i].key, &k, &why) == K_ENTRY &&
                k.num < c->cfg.max_ranks && (ti = cluster__table_for(c, k.kind, k.role, 1)) >= 0 &&
                (s = cluster__slot(c, (unsigned)ti, (uint32_t)k.num)))
                s->published = 1; /* deleted below unless local */
        }
        etcd_kvs_free(own[d], nown[d]);
    }
    uint32_t local = 0;
    for (unsigned ti = 0; ti < NTABLES; ti++)
        for (uint32_t r = 0; c->tab.slots[ti] && r < c->cfg.max_ranks; r++) {
            struct rslot *s = c->tab.slots[ti][r];
            if (s && (s->local || s->published)) {
                cluster__mark_dirty(c, ti, r, s);
                local += s->local;
            }
        }
    cluster__pd_session(c);
    cluster__follow_session(c);
    cluster__rooms_session(c);
    uint64_t now = kvc__mono_ns();
    c->ses.lease_granted_mono = now;
    c->ses.next_keepalive = now + (uint64_t)c->cfg.ttl_s * 1000000000ull / 3;
    cluster__etcd_answered(c);
    pthread_mutex_lock(&c->fig.mu);
    c->fig.st.sessions++;
    c->fig.st.lease_id = lease;
    c->fig.st.lease_granted_ns = kvc__now_ns();
    uint64_t sessions = c->fig.st.sessions;
    pthread_mutex_unlock(&c->fig.mu);
    log_event(LOG_INFO, "cluster_session",
              "cluster=%s node=%s lease=%" PRId64 " ttl_s=%u session=%" PRIu64 " local_ranks=%u "
              "endpoint=%s",
              c->cfg.cluster, c->cfg.node, lease, c->cfg.ttl_s, sessions, local,
              etcd_endpoint(c->ses.ec));
    return 0;
}

void cluster__session_step(struct cluster *c)
{
    uint64_t now = kvc__mono_ns();
    if (!c->ses.lease) {
        if (now < c->ses.retry_at)
            return;
        if (start_session(c))
            c->ses.retry_at = now + (uint64_t)cluster__next_backoff(c) * 1000000ull;
        return;
    }
    if (now < c->ses.next_keepalive)
        return;
    int64_t left = 0;
    if (etcd_lease_keepalive(c->ses.ec, c->ses.lease, &left)) {
        cluster__etcd_failed(c, "keepalive");
        /* Retried at least every TTL/3: once etcd is back (it restores the
         * leases with a fresh TTL), this live node's lease must not lapse
         * for a backoff, which would fail the rooms it shares elsewhere. */
        uint64_t ms = cluster__next_backoff(c), most = (uint64_t)c->cfg.ttl_s * 1000 / 3;
        c->ses.next_keepalive = now + (ms < most ? ms : most) * 1000000ull;
        return;
    }
    cluster__etcd_answered(c);
    if (left <= 0) {
        cluster__lease_gone(c, "keep-alive found the lease expired");
        if (start_session(c))
            c->ses.retry_at = now + (uint64_t)cluster__next_backoff(c) * 1000000ull;
        return;
    }
    c->ses.next_keepalive = now + (uint64_t)c->cfg.ttl_s * 1000000000ull / 3;
}
