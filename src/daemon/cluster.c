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
    if (kvc_segment_stat(c->seg, &si) == KVC_OK) {
        c->failures_seen =
            si.failures_total > KVC_FAILURE_RING ? si.failures_total - KVC_FAILURE_RING : 0;
        uint64_t now = kvc__now_ns(), ttl = (uint64_t)si.room_ttl_ms * 1000000ull;
        cluster__scan_failures(c, now > ttl ? now - ttl : 0);
    }
    for (;;) {
        /* Sleep until something happens or the next timer (keep-alive,
         * retry, at most a second). */
        uint64_t now = kvc__mono_ns(), wake = now + 1000000000ull;
        if (c->lease && c->next_keepalive < wake)
            wake = c->next_keepalive;
        if (!c->lease && c->retry_at < wake)
            wake = c->retry_at;
        if ((c->ndirty || c->npending) && c->etcd_down_since && c->retry_at < wake)
            wake = c->retry_at;
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        if (wake > now) {
            uint64_t t = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec + (wake - now);
            ts.tv_sec = (time_t)(t / 1000000000ull);
            ts.tv_nsec = (long)(t % 1000000000ull);
        }
        pthread_mutex_lock(&c->mu);
        while (!c->stop && !c->rank_changed && !c->room_changed && !c->q_head &&
               wake > kvc__mono_ns()) {
            if (pthread_cond_timedwait(&c->cv, &c->mu, &ts) == ETIMEDOUT)
                break;
        }
        if (c->stop) {
            pthread_mutex_unlock(&c->mu);
            break;
        }
        int ranks = c->rank_changed, rooms = c->room_changed;
        c->rank_changed = c->room_changed = 0;
        struct batch *q = c->q_head;
        c->q_head = c->q_tail = NULL;
        int watch_up = c->watch_up;
        uint64_t watch_down = c->watch_down_since;
        pthread_mutex_unlock(&c->mu);

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
        if (rooms)
            cluster__scan_failures(c, 0);
        cluster__session_step(c);
        now = kvc__mono_ns();
        if (c->lease && (!c->etcd_down_since || now >= c->retry_at)) {
            if (cluster__publish_dirty(c) || cluster__publish_rooms(c))
                c->retry_at = now + (uint64_t)cluster__next_backoff(c) * 1000000ull;
        }
        /* Large records whose fetch failed: try again. */
        for (unsigned ti = 0; ti < NTABLES; ti++)
            for (uint32_t r = 0; c->slots[ti] && r < c->max_ranks; r++) {
                struct rslot *s = c->slots[ti][r];
                if (!s)
                    continue;
                for (struct remote *x = s->remotes; x; x = x->next)
                    if (!x->info && x->url[0] && now >= c->fetch_retry_at) {
                        if (!cluster__fetch_info(c, ti, r, x))
                            cluster__apply_winner(c, ti, r, NULL);
                        else
                            c->fetch_retry_at = now + 1000000000ull;
                    }
            }
        /* Unverified mirror: since when nothing confirms it. */
        uint64_t since = c->etcd_down_since;
        if (!watch_up && watch_down && (!since || watch_down < since))
            since = watch_down;
        pthread_mutex_lock(&c->smu);
        c->st.unverified_since_ns =
            since ? kvc__now_ns() - (kvc__mono_ns() - since) : 0; /* as a wall-clock time */
        pthread_mutex_unlock(&c->smu);
        uint64_t limit = (uint64_t)c->ttl_s * 1000000000ull;
        for (size_t i = 0; i < c->nnodes; i++)
            if (c->nodes[i].ttl > 0 && (uint64_t)c->nodes[i].ttl * 1000000000ull > limit)
                limit = (uint64_t)c->nodes[i].ttl * 1000000000ull;
        /* Dropped only once the watch itself is down that long: requests
         * failing while the stream delivers (this node's own trouble) do
         * not make the others' entries doubtful. */
        if (!watch_up && watch_down && !c->dropped && kvc__mono_ns() - watch_down > limit)
            cluster__drop_unverified(c, watch_down);
        if (c->etcd_down_since && watch_up && c->watch_restarted_for != c->etcd_down_since) {
            /* Requests fail while the stream looks fine: a member cut off
             * from the quorum keeps its watchers; ask once for a fresh
             * stream, whose snapshot (a quorum read) fails over. */
            c->watch_restarted_for = c->etcd_down_since;
            pthread_mutex_lock(&c->mu);
            c->restart_watch = 1;
            pthread_mutex_unlock(&c->mu);
        }
        cluster__refresh_stats(c);
    }
    /* Stopping. */
    if (c->clean) {
        if (c->lease && etcd_lease_revoke(c->ec, c->lease) == 0)
            log_event(LOG_INFO, "cluster_left",
                      "cluster=%s node=%s lease=%" PRId64 " note=\"lease revoked: this node's "
                      "records are gone from every node\"",
                      c->cluster, c->node, c->lease);
        cluster__drop_remotes(c, "kvcoordd stopped: mirrored entries dropped", 1);
    }
    return NULL;
}

/* ---- start / stop -------------------------------------------------------- */

static char *dup_opt(const char *s) { return s ? strdup(s) : NULL; }

static void free_cluster(struct cluster *c)
{
    if (!c)
        return;
    etcd_close(c->ec);
    if (c->fetch)
        curl_easy_cleanup(c->fetch);
    for (unsigned ti = 0; ti < NTABLES; ti++) {
        for (uint32_t r = 0; c->slots[ti] && r < c->max_ranks; r++) {
            struct rslot *s = c->slots[ti][r];
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
        free(c->slots[ti]);
    }
    free(c->dirty_q);
    for (uint32_t i = 0; c->list && i < c->max_ranks; i++)
        kvc_rank_info_free(&c->list[i]);
    free(c->list);
    kvc_rank_info_free(&c->look);
    free(c->nodes);
    free(c->nodes_copy);
    free(c->pending);
    while (c->q_head) {
        struct batch *b = c->q_head;
        c->q_head = b->next;
        etcd_kvs_free(b->kvs, b->nkv);
        for (size_t i = 0; i < b->nev; i++)
            etcd_kv_free(&b->ev[i].kv);
        free(b->ev);
        free(b);
    }
    free(c->endpoints);
    free(c->user);
    free(c->password_file);
    free(c->cacert);
    free(c->cert);
    free(c->key);
    pthread_mutex_destroy(&c->mu);
    pthread_mutex_destroy(&c->smu);
    pthread_cond_destroy(&c->cv);
    free(c);
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
    pthread_mutex_init(&c->mu, NULL);
    pthread_mutex_init(&c->smu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&c->cv, &ca);
    pthread_condattr_destroy(&ca);
    snprintf(c->cluster, sizeof c->cluster, "%s", conf->cluster);
    snprintf(c->node, sizeof c->node, "%s", conf->node);
    snprintf(c->url, sizeof c->url, "%s", conf->url ? conf->url : "");
    snprintf(c->prefix, sizeof c->prefix, "/kvcoord/%s/", c->cluster);
    c->ttl_s = conf->ttl_s;
    c->seg = conf->seg;
    c->endpoints = dup_opt(conf->endpoints);
    c->user = dup_opt(conf->user);
    c->password_file = dup_opt(conf->password_file);
    c->cacert = dup_opt(conf->cacert);
    c->cert = dup_opt(conf->cert);
    c->key = dup_opt(conf->key);
    c->econf = (struct etcd_conf){.endpoints = c->endpoints,
                                  .user = c->user,
                                  .password_file = c->password_file,
                                  .cacert = c->cacert,
                                  .cert = c->cert,
                                  .key = c->key,
                                  .timeout_ms = 2000};
    kvc_segment_info si;
    if (kvc_segment_stat(c->seg, &si) != KVC_OK) {
        snprintf(err, cap, "segment: %s", kvc_last_error());
        free_cluster(c);
        return -1;
    }
    if (si.max_ranks > UINT32_MAX / NTABLES) {
        snprintf(err, cap, "the cluster view follows at most %u ranks", UINT32_MAX / NTABLES);
        free_cluster(c);
        return -1;
    }
    c->max_ranks = si.max_ranks;
    c->max_info_bytes = si.max_info_bytes;
    c->room_ttl_s = si.room_ttl_ms / 1000 ? si.room_ttl_ms / 1000 : 1;
    snprintf(c->roles[0], sizeof c->roles[0], "%s", KVC_DEFAULT_ROLE);
    c->nroles = 1;
    c->list = calloc(c->max_ranks, sizeof *c->list);
    c->pending = calloc(PENDING_ROOMS_MAX, sizeof *c->pending);
    c->fetch = curl_easy_init();
    if (!c->list || !c->pending || !c->fetch) {
        snprintf(err, cap, "out of memory for the cluster view of %u ranks", c->max_ranks);
        free_cluster(c);
        return -1;
    }
    if (etcd_open(&c->econf, &c->ec, err, cap)) {
        free_cluster(c);
        return -1;
    }
    c->st.etcd_up = 0;
    c->etcd_down_since = 0;
    if (pthread_create(&c->thread, NULL, cluster_main, c) == 0)
        c->started_thread = 1;
    if (c->started_thread && pthread_create(&c->watch_thread, NULL, cluster__watch_main, c) == 0)
        c->started_watch = 1;
    if (c->started_watch &&
        pthread_create(&c->rank_waiter, NULL, cluster__rank_waiter_main, c) == 0)
        c->started_rank = 1;
    if (c->started_rank && pthread_create(&c->room_waiter, NULL, cluster__room_waiter_main, c) == 0)
        c->started_room = 1;
    if (!c->started_room) {
        snprintf(err, cap, "cannot start the cluster threads");
        cluster_stop(c, 0);
        return -1;
    }
    log_event(LOG_INFO, "cluster",
              "cluster=%s node=%s url=%s ttl_s=%u endpoints=%s auth=%s conflict_rule=\"newest "
              "etcd revision wins\"",
              c->cluster, c->node, c->url, c->ttl_s, c->endpoints, c->user ? "user" : "none");
    *out = c;
    return 0;
}

void cluster_stop(struct cluster *c, int clean)
{
    if (!c)
        return;
    pthread_mutex_lock(&c->mu);
    c->stop = 1;
    c->clean = clean;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    if (c->started_room)
        pthread_join(c->room_waiter, NULL);
    if (c->started_rank)
        pthread_join(c->rank_waiter, NULL);
    if (c->started_watch)
        pthread_join(c->watch_thread, NULL);
    if (c->started_thread)
        pthread_join(c->thread, NULL);
    free_cluster(c);
}
