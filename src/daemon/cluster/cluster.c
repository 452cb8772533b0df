/*
 * cluster.c - publishing this node's ranks and room failures in etcd and
 * mirroring the other nodes'; see cluster.h for the keys and the rules.
 *
 * This file starts and stops the cluster view and runs the cluster
 * thread's loop: it sleeps until a helper thread flags a change or a timer
 * is due, then scans the rank tables, applies the watch's batches, keeps
 * the session, publishes, retries failed fetches and decides when the
 * mirror is no longer verified.  The state, the threads and which file
 * holds what: cluster_internal.h.
 */

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "clock.h"
#include "cluster_internal.h"
#include "log.h"

/* ---- the mirror's confirmation ------------------------------------------ */

/* How long the other nodes' entries live in etcd without their node: the
 * longest lease TTL seen (this node's included), ns. */
static uint64_t lease_limit(const struct cluster *c)
{
    uint64_t limit = (uint64_t)c->cfg.ttl_s * 1000000000ull;
    for (size_t i = 0; i < c->peers.nnodes; i++)
        if (c->peers.nodes[i].ttl > 0 && (uint64_t)c->peers.nodes[i].ttl * 1000000000ull > limit)
            limit = (uint64_t)c->peers.nodes[i].ttl * 1000000000ull;
    return limit;
}

/* The watch's probe interval, ms: a quarter of the shortest lease TTL of
 * the nodes, this node's included (within cfg.quiet_ms's bounds).  An
 * outage long enough to let the shortest lease lapse then meets a probe of
 * the watch, unanswered or slow: this node's trouble with etcd, so that
 * node's departure is taken as etcd's doing (cluster_follow.c), even when
 * this node's own, longer, lease and requests came through. */
static uint32_t watch_quiet(const struct cluster *c)
{
    uint32_t q = c->cfg.quiet_ms;
    for (size_t i = 0; i < c->peers.nnodes; i++) {
        int64_t t = c->peers.nodes[i].ttl;
        uint32_t v = t > 0 && t < 3600 ? (uint32_t)t * 250 : q;
        if (v < 250)
            v = 250;
        if (v < q)
            q = v;
    }
    return q;
}

/* The mirror is what the watch last confirmed (heard: a message, an
 * answered probe, a snapshot; monotonic ns).  Unconfirmed once the watch
 * is down, or quiet past its probe interval by more than a probe of a
 * healthy member takes (quiet_ms + 250 ms); dropped, whether
 * etcd refuses or hangs, once unconfirmed past the leases: the entries
 * mirrored may have expired there.  Requests of this node's session that
 * fail while the watch is confirmed (this node's own trouble) do not make
 * the others' entries doubtful. */
static void check_confirmed(struct cluster *c, uint64_t heard, int watch_up)
{
    uint64_t now = kvc__mono_ns();
    uint64_t grace = ((uint64_t)c->cfg.quiet_ms + 250) * 1000000ull;
    uint64_t age = heard && now > heard ? now - heard : 0;
    int confirmed = heard && watch_up && age <= grace;
    uint64_t since = confirmed ? 0 : heard ? heard : c->ses.etcd_down_since;
    pthread_mutex_lock(&c->fig.mu);
    if (since && !c->fig.st.unverified_since_ns)
        c->fig.st.unconfirmed_episodes++; /* counted: the state can be short */
    c->fig.st.unverified_since_ns =
        since ? kvc__now_ns() - (now - since) : 0; /* as a wall-clock time */
    c->fig.st.confirmed_ns = heard ? kvc__now_ns() - (now - heard) : 0;
    pthread_mutex_unlock(&c->fig.mu);
    if (heard && !c->peers.dropped && age > lease_limit(c))
        cluster__drop_unverified(c, heard);
}

/* The longest the cluster thread's next etcd calls may take: their usual
 * deadline, cut to what is left before the mirror's drop is due (at least
 * 250 ms) while the mirror is unconfirmed, so that an etcd that hangs
 * holds the drop back no more than one that refuses. */
static void bound_calls(struct cluster *c, uint64_t heard, int watch_up)
{
    long ms = c->cfg.deadline_ms;
    uint64_t now = kvc__mono_ns();
    uint64_t grace = ((uint64_t)c->cfg.quiet_ms + 250) * 1000000ull;
    int confirmed = heard && watch_up && now - heard <= grace;
    if (heard && !confirmed && !c->peers.dropped) {
        uint64_t due = heard + lease_limit(c);
        uint64_t left = due > now ? (due - now) / 1000000ull : 0;
        if (left < (uint64_t)ms)
            ms = left < 250 ? 250 : (long)left;
    }
    etcd_set_deadline(c->ses.ec, ms);
}

/* ---- the cluster thread -------------------------------------------------- */

static void *cluster_main(void *arg)
{
    struct cluster *c = arg;
    cluster__scan_local(c); /* what the segment holds before any change */
    /* Failures recorded while no kvcoordd ran (workers record them
     * through the library) are published now, if their rooms can still
     * matter: those recorded less than a room TTL ago.  One this node
     * published before a restart is found in etcd as its own and left. */
    kvc_segment_info si;
    if (kvc_segment_stat(c->cfg.seg, &si) == KVC_OK) {
        c->rooms.failures_seen =
            si.failures_total > KVC_FAILURE_RING ? si.failures_total - KVC_FAILURE_RING : 0;
        uint64_t now = kvc__now_ns(), ttl = (uint64_t)si.room_ttl_ms * 1000000ull;
        cluster__scan_failures(c, now > ttl ? now - ttl : 0);
    }
    uint64_t heard = 0;
    for (;;) {
        /* Sleep until something happens or the next timer (keep-alive,
         * retry, the mirror's drop, at most a second). */
        uint64_t now = kvc__mono_ns(), wake = now + 1000000000ull;
        if (c->ses.lease && c->ses.next_keepalive < wake)
            wake = c->ses.next_keepalive;
        if (!c->ses.lease && c->ses.retry_at < wake)
            wake = c->ses.retry_at;
        if (c->ses.lease && !c->ses.etcd_down_since && cluster__follow_due(c) < wake)
            wake = cluster__follow_due(c) > now ? cluster__follow_due(c) : now;
        if ((c->tab.ndirty || c->rooms.npending) && c->ses.etcd_down_since &&
            c->ses.retry_at < wake)
            wake = c->ses.retry_at;
        /* When the mirror stops being confirmed (shown at once), and when
         * its drop is due. */
        uint64_t unconfirmed_at = heard + ((uint64_t)c->cfg.quiet_ms + 251) * 1000000ull;
        if (heard && unconfirmed_at > now && unconfirmed_at < wake)
            wake = unconfirmed_at;
        if (heard && !c->peers.dropped && heard + lease_limit(c) + 1000000ull < wake)
            wake = heard + lease_limit(c) + 1000000ull;
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        if (wake > now) {
            uint64_t t = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec + (wake - now);
            ts.tv_sec = (time_t)(t / 1000000000ull);
            ts.tv_nsec = (long)(t % 1000000000ull);
        }
        pthread_mutex_lock(&c->in.mu);
        while (!c->in.stop && !c->in.rank_changed && !c->in.room_changed && !c->in.q_head &&
               !c->in.fetched && wake > kvc__mono_ns()) {
            if (pthread_cond_timedwait(&c->in.cv, &c->in.mu, &ts) == ETIMEDOUT)
                break;
        }
        if (c->in.stop) {
            pthread_mutex_unlock(&c->in.mu);
            break;
        }
        int ranks = c->in.rank_changed, rooms = c->in.room_changed;
        c->in.rank_changed = c->in.room_changed = 0;
        struct batch *q = c->in.q_head;
        c->in.q_head = c->in.q_tail = NULL;
        struct fetch_job *fetched = c->in.fetched;
        c->in.fetched = NULL;
        int watch_up = c->in.watch_up;
        heard = c->in.watch_heard;
        char watch_ep[sizeof c->in.watch_endpoint];
        memcpy(watch_ep, c->in.watch_endpoint, sizeof watch_ep);
        pthread_mutex_unlock(&c->in.mu);
        pthread_mutex_lock(&c->fig.mu);
        c->fig.st.watch_up = watch_up;
        memcpy(c->fig.st.watch_endpoint, watch_ep, sizeof watch_ep);
        pthread_mutex_unlock(&c->fig.mu);

        if (ranks)
            cluster__scan_local(c);
        cluster__reap_shadowed(c);
        while (q) {
            struct batch *b = q;
            q = b->next;
            if (b->snapshot)
                cluster__handle_snapshot(c, b->kvs, b->nkv, b->rev);
            else
                cluster__handle_events(c, b->ev, b->nev);
            etcd_kvs_free(b->kvs, b->nkv);
            for (size_t i = 0; i < b->nev; i++)
                etcd_kv_free(&b->ev[i].kv);
            free(b->ev);
            free(b);
        }
        uint32_t quiet = watch_quiet(c);
        pthread_mutex_lock(&c->in.mu);
        c->in.watch_quiet_ms = quiet;
        pthread_mutex_unlock(&c->in.mu);
        if (rooms)
            cluster__scan_failures(c, 0);
        check_confirmed(c, heard, watch_up); /* a drop due goes before any etcd call */
        bound_calls(c, heard, watch_up);
        cluster__session_step(c);
        now = kvc__mono_ns();
        if (c->ses.lease && (!c->ses.etcd_down_since || now >= c->ses.retry_at)) {
            if (cluster__publish_dirty(c) || cluster__publish_rooms(c) ||
                (c->ses.lease && cluster__pd_publish(c)) ||
                (c->ses.lease && cluster__follow_publish(c)))
                c->ses.retry_at = now + (uint64_t)cluster__next_backoff(c) * 1000000ull;
        }
        /* Large records: the fetch thread's answers, and what to ask
         * (again). */
        for (struct fetch_job *j = fetched; j; j = j->next)
            cluster__fetched(c, j);
        cluster__fetch_free(fetched);
        cluster__fetch_due(c);
        check_confirmed(c, heard, watch_up);
        cluster__follow_tick(c);
        cluster__follow_count(c);
        if (c->ses.etcd_down_since && watch_up &&
            c->ses.watch_restarted_for != c->ses.etcd_down_since) {
            /* Requests fail while the stream looks fine: a member cut off
             * from the quorum keeps its watchers; ask once for a fresh
             * stream, whose snapshot (a quorum read) fails over. */
            c->ses.watch_restarted_for = c->ses.etcd_down_since;
            pthread_mutex_lock(&c->in.mu);
            c->in.restart_watch = 1;
            pthread_mutex_unlock(&c->in.mu);
        }
        cluster__refresh_stats(c);
    }
    /* Stopping. */
    if (c->in.clean) {
        if (c->ses.lease && etcd_lease_revoke(c->ses.ec, c->ses.lease) == 0)
            log_event(LOG_INFO, "cluster_left",
                      "cluster=%s node=%s lease=%" PRId64 " note=\"lease revoked: this node's "
                      "records are gone from every node\"",
                      c->cfg.cluster, c->cfg.node, c->ses.lease);
        cluster__drop_remotes(c, "kvcoordd stopped: mirrored entries dropped", 1);
        cluster__pd_drop(c, "kvcoordd stopped");
    }
    return NULL;
}

/* ---- start / stop -------------------------------------------------------- */

static char *dup_opt(const char *s) { return s ? strdup(s) : NULL; }

static void free_cluster(struct cluster *c)
{
    if (!c)
        return;
    etcd_close(c->ses.ec);
    if (c->fx.multi)
        curl_multi_cleanup(c->fx.multi);
    if (c->px.multi)
        curl_multi_cleanup(c->px.multi);
    curl_slist_free_all(c->px.headers);
    cluster__push_free(c->px.queue);
    cluster__fetch_free(c->fx.queue);
    cluster__fetch_free(c->in.fetched);
    for (unsigned ti = 0; ti < NTABLES; ti++) {
        for (uint32_t r = 0; c->tab.slots[ti] && r < c->cfg.max_ranks; r++) {
            struct rslot *s = c->tab.slots[ti][r];
            if (!s)
                continue;
            while (s->remotes) {
                struct remote *x = s->remotes;
                s->remotes = x->next;
                cluster__free_remote(x);
            }
            cluster__drop_saved(s);
            free(s);
        }
        free(c->tab.slots[ti]);
    }
    free(c->tab.dirty_q);
    for (uint32_t i = 0; c->tab.list && i < c->cfg.max_ranks; i++)
        kvc_rank_info_free(&c->tab.list[i]);
    free(c->tab.list);
    kvc_rank_info_free(&c->tab.look);
    free(c->peers.nodes);
    free(c->fig.nodes_copy);
    free(c->rooms.pending);
    free(c->rooms.pub);
    cluster__follow_free(c);
    free(c->follow.names);
    pd_mirror_free(c->pd.mirror);
    free(c->pd.published);
    while (c->in.q_head) {
        struct batch *b = c->in.q_head;
        c->in.q_head = b->next;
        etcd_kvs_free(b->kvs, b->nkv);
        for (size_t i = 0; i < b->nev; i++)
            etcd_kv_free(&b->ev[i].kv);
        free(b->ev);
        free(b);
    }
    free(c->cfg.endpoints);
    free(c->cfg.user);
    free(c->cfg.password_file);
    free(c->cfg.cacert);
    free(c->cfg.cert);
    free(c->cfg.key);
    pthread_mutex_destroy(&c->in.mu);
    pthread_mutex_destroy(&c->fx.mu);
    pthread_mutex_destroy(&c->px.mu);
    pthread_mutex_destroy(&c->follow.mu);
    pthread_mutex_destroy(&c->fig.mu);
    pthread_cond_destroy(&c->in.cv);
    free(c);
}

/* The headers of every push (cluster_push.c): JSON, no "Expect: 100-
 * continue" round trip, and this node's HTTP token when it has one (the
 * peers' mutating routes want theirs; the nodes of a cluster share it).
 * 1, or 0 when out of memory. */
static int push_headers(struct cluster *c, const char *token)
{
    struct curl_slist *h = curl_slist_append(NULL, "Content-Type: application/json");
    struct curl_slist *h2 = h ? curl_slist_append(h, "Expect:") : NULL;
    if (!h2) {
        curl_slist_free_all(h);
        return 0;
    }
    c->px.headers = h2;
    if (token) {
        size_t n = strlen(token) + 32;
        char *line = malloc(n);
        struct curl_slist *h3 = NULL;
        if (line) {
            snprintf(line, n, "Authorization: Bearer %s", token);
            h3 = curl_slist_append(c->px.headers, line);
            memset(line, 0, n);
            free(line);
        }
        if (!h3)
            return 0;
        c->px.headers = h3;
    }
    return 1;
}

int cluster_start(const struct cluster_conf *conf, struct cluster **out, char *err, size_t cap)
{
    if (!conf->cluster || !cluster_name_ok(conf->cluster)) {
        snprintf(err, cap, "invalid cluster name '%s' (1..%d bytes of [A-Za-z0-9._-])",
                 conf->cluster ? conf->cluster : "", CLUSTER_NAME_MAX);
        return -1;
    }
    if (!conf->node || !cluster_name_ok(conf->node)) {
        snprintf(err, cap, "invalid node name '%s' (1..%d bytes of [A-Za-z0-9._-])",
                 conf->node ? conf->node : "", CLUSTER_NAME_MAX);
        return -1;
    }
    if (conf->ttl_s < 1) {
        snprintf(err, cap, "the etcd lease TTL must be at least 1 s");
        return -1;
    }
    struct cluster *c = calloc(1, sizeof *c);
    if (!c) {
        snprintf(err, cap, "out of memory");
        return -1;
    }
    pthread_mutex_init(&c->in.mu, NULL);
    pthread_mutex_init(&c->fx.mu, NULL);
    pthread_mutex_init(&c->px.mu, NULL);
    pthread_mutex_init(&c->follow.mu, NULL);
    c->px.tail = &c->px.queue;
    pthread_mutex_init(&c->fig.mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&c->in.cv, &ca);
    pthread_condattr_destroy(&ca);
    snprintf(c->cfg.cluster, sizeof c->cfg.cluster, "%s", conf->cluster);
    snprintf(c->cfg.node, sizeof c->cfg.node, "%s", conf->node);
    snprintf(c->cfg.url, sizeof c->cfg.url, "%s", conf->url ? conf->url : "");
    snprintf(c->cfg.prefix, sizeof c->cfg.prefix, "/kvcoord/%s/", c->cfg.cluster);
    c->cfg.ttl_s = conf->ttl_s;
    /* Every etcd request is bounded by the TTL: a member tried gets a
     * quarter of it (1 s .. 2 s: a TLS handshake on a busy host takes
     * hundreds of ms), a whole call (fail-over included) half of it (at
     * least two members' worth), so the cluster thread looks at the
     * mirror's confirmation within about a TTL even when etcd hangs; a
     * watch stream quiet for a quarter of the TTL (250 ms .. 5 s) has its
     * member probed. */
    uint32_t ttl_ms = conf->ttl_s > 3600 ? 3600000u : conf->ttl_s * 1000u;
    c->cfg.call_ms = ttl_ms / 4 < 1000 ? 1000 : ttl_ms / 4 > 2000 ? 2000 : ttl_ms / 4;
    c->cfg.quiet_ms = ttl_ms / 4 < 250 ? 250 : ttl_ms / 4 > 5000 ? 5000 : ttl_ms / 4;
    uint32_t deadline_ms = ttl_ms / 2 < 2 * c->cfg.call_ms ? 2 * c->cfg.call_ms : ttl_ms / 2;
    c->cfg.deadline_ms = deadline_ms;
    c->cfg.seg = conf->seg;
    c->cfg.endpoints = dup_opt(conf->endpoints);
    c->cfg.user = dup_opt(conf->user);
    c->cfg.password_file = dup_opt(conf->password_file);
    c->cfg.cacert = dup_opt(conf->cacert);
    c->cfg.cert = dup_opt(conf->cert);
    c->cfg.key = dup_opt(conf->key);
    c->cfg.econf = (struct etcd_conf){.endpoints = c->cfg.endpoints,
                                      .user = c->cfg.user,
                                      .password_file = c->cfg.password_file,
                                      .cacert = c->cfg.cacert,
                                      .cert = c->cfg.cert,
                                      .key = c->cfg.key,
                                      .timeout_ms = c->cfg.call_ms,
                                      .deadline_ms = deadline_ms,
                                      .watch_quiet_ms = c->cfg.quiet_ms};
    kvc_segment_info si;
    if (kvc_segment_stat(c->cfg.seg, &si) != KVC_OK) {
        snprintf(err, cap, "segment: %s", kvc_last_error());
        free_cluster(c);
        return -1;
    }
    if (si.max_ranks > UINT32_MAX / NTABLES) {
        snprintf(err, cap, "the cluster view follows at most %u ranks", UINT32_MAX / NTABLES);
        free_cluster(c);
        return -1;
    }
    c->cfg.max_ranks = si.max_ranks;
    c->cfg.max_info_bytes = si.max_info_bytes;
    c->cfg.room_ttl_s = si.room_ttl_ms / 1000 ? si.room_ttl_ms / 1000 : 1;
    snprintf(c->tab.roles[0], sizeof c->tab.roles[0], "%s", KVC_DEFAULT_ROLE);
    c->tab.nroles = 1;
    c->tab.list = calloc(c->cfg.max_ranks, sizeof *c->tab.list);
    c->rooms.pending = calloc(PENDING_ROOMS_MAX, sizeof *c->rooms.pending);
    c->follow.names = calloc(FOLLOW_NODES, sizeof *c->follow.names);
    c->fx.multi = curl_multi_init();
    c->px.multi = curl_multi_init();
    c->pd.mirror = pd_mirror_new();
    int headers_ok = push_headers(c, conf->http_token);
    if (!c->tab.list || !c->rooms.pending || !c->fx.multi || !c->px.multi || !c->pd.mirror ||
        !c->follow.names || !headers_ok) {
        snprintf(err, cap, "out of memory for the cluster view of %u ranks", c->cfg.max_ranks);
        free_cluster(c);
        return -1;
    }
    /* The failures recorded here from now on name this node. */
    if (kvc_segment_set_node(c->cfg.seg, c->cfg.node) != KVC_OK) {
        snprintf(err, cap, "segment: %s", kvc_last_error());
        free_cluster(c);
        return -1;
    }
    if (etcd_open(&c->cfg.econf, &c->ses.ec, err, cap)) {
        free_cluster(c);
        return -1;
    }
    c->fig.st.etcd_up = 0;
    c->ses.etcd_down_since = 0;
    /* Before anything serves the segment (the HTTP server starts after
     * cluster_start returns): an earlier kvcoordd's mirror is not what
     * etcd says now. */
    size_t left = cluster__withdraw_leftovers(c);
    if (left)
        log_event(LOG_INFO, "mirror_unconfirmed_total",
                  "cluster=%s node=%s entries=%zu note=\"mirrored entries an earlier kvcoordd "
                  "left in the segment are withdrawn until etcd's snapshot confirms them\"",
                  c->cfg.cluster, c->cfg.node, left);
    if (pthread_create(&c->thr.thread, NULL, cluster_main, c) == 0)
        c->thr.started_thread = 1;
    if (c->thr.started_thread &&
        pthread_create(&c->thr.watch_thread, NULL, cluster__watch_main, c) == 0)
        c->thr.started_watch = 1;
    if (c->thr.started_watch &&
        pthread_create(&c->thr.rank_waiter, NULL, cluster__rank_waiter_main, c) == 0)
        c->thr.started_rank = 1;
    if (c->thr.started_rank &&
        pthread_create(&c->thr.room_waiter, NULL, cluster__room_waiter_main, c) == 0)
        c->thr.started_room = 1;
    if (c->thr.started_room && pthread_create(&c->thr.fetcher, NULL, cluster__fetch_main, c) == 0)
        c->thr.started_fetcher = 1;
    if (c->thr.started_fetcher && pthread_create(&c->thr.pusher, NULL, cluster__push_main, c) == 0)
        c->thr.started_pusher = 1;
    if (!c->thr.started_pusher) {
        snprintf(err, cap, "cannot start the cluster threads");
        cluster_stop(c, 0);
        return -1;
    }
    log_event(LOG_INFO, "cluster",
              "cluster=%s node=%s url=%s ttl_s=%u endpoints=%s auth=%s request_ms=%u "
              "call_deadline_ms=%u watch_quiet_ms=%u conflict_rule=\"newest etcd revision wins\"",
              c->cfg.cluster, c->cfg.node, c->cfg.url, c->cfg.ttl_s, c->cfg.endpoints,
              c->cfg.user ? "user" : "none", c->cfg.call_ms, deadline_ms, c->cfg.quiet_ms);
    *out = c;
    return 0;
}

struct pd_mirror *cluster_pd_mirror(struct cluster *c) { return c->pd.mirror; }

const char *cluster_node_name(const struct cluster *c) { return c->cfg.node; }

void cluster_stop(struct cluster *c, int clean)
{
    if (!c)
        return;
    pthread_mutex_lock(&c->in.mu);
    c->in.stop = 1;
    c->in.clean = clean;
    pthread_cond_broadcast(&c->in.cv);
    pthread_mutex_unlock(&c->in.mu);
    pthread_mutex_lock(&c->fx.mu);
    c->fx.stop = 1;
    pthread_mutex_unlock(&c->fx.mu);
    if (c->fx.multi)
        curl_multi_wakeup(c->fx.multi);
    pthread_mutex_lock(&c->px.mu);
    c->px.stop = 1;
    pthread_mutex_unlock(&c->px.mu);
    if (c->px.multi)
        curl_multi_wakeup(c->px.multi);
    if (c->thr.started_pusher)
        pthread_join(c->thr.pusher, NULL);
    if (c->thr.started_fetcher)
        pthread_join(c->thr.fetcher, NULL);
    if (c->thr.started_room)
        pthread_join(c->thr.room_waiter, NULL);
    if (c->thr.started_rank)
        pthread_join(c->thr.rank_waiter, NULL);
    if (c->thr.started_watch)
        pthread_join(c->thr.watch_thread, NULL);
    if (c->thr.started_thread)
        pthread_join(c->thr.thread, NULL);
    free_cluster(c);
}
