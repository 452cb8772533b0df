/*
 * cluster_watch.c - the cluster thread's helpers, each a thread of its own
 * that only queues or flags under c->in.mu: the watch thread (a range of the
 * whole prefix, then a watch stream from the next revision, each response
 * queued as a batch) and the rank and room waiters (the segment's futex
 * epochs).
 */

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "clock.h"
#include "cluster_internal.h"
#include "log.h"

#define WAITER_SLICE_MS 250

/* ---- watch thread -------------------------------------------------------- */

struct watch_arg {
    struct cluster *c;
};

static void enqueue(struct cluster *c, struct batch *b)
{
    pthread_mutex_lock(&c->in.mu);
    if (c->in.q_tail)
        c->in.q_tail->next = b;
    else
        c->in.q_head = b;
    c->in.q_tail = b;
    pthread_cond_signal(&c->in.cv);
    pthread_mutex_unlock(&c->in.mu);
}

static char *dupn(const char *p, size_t n)
{
    char *d = malloc(n + 1);
    if (d) {
        memcpy(d, p, n);
        d[n] = '\0';
    }
    return d;
}

static int on_watch_events(void *arg, const etcd_event *ev, size_t n, int64_t rev)
{
    struct cluster *c = arg;
    struct batch *b = calloc(1, sizeof *b);
    etcd_event *copy = calloc(n, sizeof *copy);
    if (!b || !copy) {
        free(b);
        free(copy);
        return 1; /* ends the stream: the next one starts with a snapshot */
    }
    for (size_t i = 0; i < n; i++) {
        copy[i] = ev[i];
        copy[i].kv.key = dupn(ev[i].kv.key, ev[i].kv.key_len);
        copy[i].kv.value = dupn(ev[i].kv.value, ev[i].kv.value_len);
    }
    b->ev = copy;
    b->nev = n;
    b->rev = rev;
    enqueue(c, b);
    return 0;
}

/* How long a probe or a snapshot may take before the watch counts etcd as
 * slow, ms: a quarter of the member bound, at most the probe interval (a
 * peer's short lease may lapse in an outage that short).  Under c->in.mu. */
static uint64_t slow_ms(const struct cluster *c)
{
    uint64_t ms = c->cfg.call_ms / 4;
    if (c->in.watch_quiet_ms && c->in.watch_quiet_ms < ms)
        ms = c->in.watch_quiet_ms;
    return ms;
}

/* The stream is known current (a message, or its member answered the
 * probe after a quiet spell). */
static void on_watch_current(void *arg, int64_t rev)
{
    (void)rev;
    struct cluster *c = arg;
    uint64_t now = kvc__mono_ns();
    pthread_mutex_lock(&c->in.mu);
    /* Since the stream's last idle turn, only a probe of its member ran:
     * one that took this long met an etcd that was not answering (every
     * member frozen, then resumed before the probe's bound), which may have
     * let live nodes' leases lapse. */
    if (c->in.watch_tick && now - c->in.watch_tick > slow_ms(c) * 1000000ull)
        c->in.watch_trouble = now;
    c->in.watch_heard = now;
    pthread_mutex_unlock(&c->in.mu);
}

static int on_watch_idle(void *arg)
{
    struct cluster *c = arg;
    pthread_mutex_lock(&c->in.mu);
    c->in.watch_tick = kvc__mono_ns();
    if (c->in.watch_ec && c->in.watch_quiet_ms)
        etcd_set_watch_quiet(c->in.watch_ec, c->in.watch_quiet_ms);
    int stop = c->in.stop || c->in.restart_watch;
    c->in.restart_watch = 0;
    pthread_mutex_unlock(&c->in.mu);
    return stop;
}

/* up: a snapshot was read from the member at endpoint (the stream
 * follows it there), which confirms the mirror now. */
static void set_watch_state(struct cluster *c, int up, const char *endpoint)
{
    uint64_t now = kvc__mono_ns();
    pthread_mutex_lock(&c->in.mu);
    if (up) {
        c->in.watch_up = 1;
        c->in.watch_down_since = 0;
        c->in.watch_heard = now;
        c->in.watch_tick = now;
        snprintf(c->in.watch_endpoint, sizeof c->in.watch_endpoint, "%s", endpoint);
    } else {
        c->in.watch_trouble = now; /* etcd failed the watch: this node's trouble with it */
        if (c->in.watch_up || !c->in.watch_down_since) {
            c->in.watch_up = 0;
            c->in.watch_down_since = now;
        }
    }
    pthread_mutex_unlock(&c->in.mu);
}

/* Sleep ms unless stopped; returns non-zero when stopping. */
static int watch_sleep(struct cluster *c, uint32_t ms)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    uint64_t t = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec + ms * 1000000ull;
    ts.tv_sec = (time_t)(t / 1000000000ull);
    ts.tv_nsec = (long)(t % 1000000000ull);
    pthread_mutex_lock(&c->in.mu);
    while (!c->in.stop && pthread_cond_timedwait(&c->in.cv, &c->in.mu, &ts) != ETIMEDOUT) {
    }
    int stop = c->in.stop;
    pthread_mutex_unlock(&c->in.mu);
    return stop;
}

void *cluster__watch_main(void *arg)
{
    struct cluster *c = arg;
    char err[256];
    etcd *w = NULL;
    if (etcd_open(&c->cfg.econf, &w, err, sizeof err)) {
        log_event(LOG_ERROR, "etcd_watch_failed", "err=\"%s\"", err);
        return NULL;
    }
    pthread_mutex_lock(&c->in.mu);
    c->in.watch_ec = w;
    pthread_mutex_unlock(&c->in.mu);
    uint32_t backoff = 0;
    int logged = 0;
    for (;;) {
        pthread_mutex_lock(&c->in.mu);
        int stop = c->in.stop;
        c->in.restart_watch = 0;
        pthread_mutex_unlock(&c->in.mu);
        if (stop)
            break;
        etcd_kv *kvs;
        size_t n;
        int64_t rev;
        uint64_t t0 = kvc__mono_ns();
        if (etcd_range_prefix(w, c->cfg.prefix, &kvs, &n, &rev)) {
            set_watch_state(c, 0, NULL);
            if (!logged++)
                log_event(LOG_WARN, "etcd_watch_down", "cluster=%s err=\"%s\"", c->cfg.cluster,
                          etcd_error(w));
            backoff = backoff ? (backoff * 2 > BACKOFF_MAX_MS ? BACKOFF_MAX_MS : backoff * 2)
                              : BACKOFF_MIN_MS;
            if (watch_sleep(c, backoff))
                break;
            continue;
        }
        backoff = 0;
        if (logged)
            log_event(LOG_INFO, "etcd_watch_up", "cluster=%s endpoint=%s revision=%" PRId64,
                      c->cfg.cluster, etcd_endpoint(w), rev);
        logged = 0;
        struct batch *b = calloc(1, sizeof *b);
        if (!b) {
            etcd_kvs_free(kvs, n);
            continue;
        }
        b->snapshot = 1, b->kvs = kvs, b->nkv = n, b->rev = rev;
        pthread_mutex_lock(&c->in.mu); /* a slow snapshot: as a slow probe */
        if (kvc__mono_ns() - t0 > slow_ms(c) * 1000000ull)
            c->in.watch_trouble = kvc__mono_ns();
        pthread_mutex_unlock(&c->in.mu);
        set_watch_state(c, 1, etcd_endpoint(w));
        enqueue(c, b);
        int64_t last;
        struct etcd_watch_cb cb = {.events = on_watch_events,
                                   .idle = on_watch_idle,
                                   .current = on_watch_current,
                                   .arg = c};
        if (etcd_watch(w, c->cfg.prefix, rev + 1, &cb, &last) == 0)
            continue; /* stop, or a fresh stream asked for */
        set_watch_state(c, 0, NULL);
        log_event(LOG_WARN, "etcd_watch_down",
                  "cluster=%s err=\"%s\" note=\"a new stream starts with a snapshot, from the "
                  "next member\"",
                  c->cfg.cluster, etcd_error(w));
        logged = 1;
        if (watch_sleep(c, BACKOFF_MIN_MS))
            break;
    }
    pthread_mutex_lock(&c->in.mu);
    c->in.watch_ec = NULL;
    pthread_mutex_unlock(&c->in.mu);
    etcd_close(w);
    return NULL;
}

/* ---- futex waiters ------------------------------------------------------- */

/* cluster_stop() has asked the threads to end. */
static int stop_asked(struct cluster *c)
{
    pthread_mutex_lock(&c->in.mu);
    int stop = c->in.stop;
    pthread_mutex_unlock(&c->in.mu);
    return stop;
}

void *cluster__rank_waiter_main(void *arg)
{
    struct cluster *c = arg;
    uint32_t seen = kvc_rank_epoch(c->cfg.seg);
    for (;;) {
        if (stop_asked(c))
            break;
        if (kvc_rank_wait_change(c->cfg.seg, seen, WAITER_SLICE_MS) == KVC_OK) {
            seen = kvc_rank_epoch(c->cfg.seg); /* before flagging: no lost change */
            pthread_mutex_lock(&c->in.mu);
            c->in.rank_changed = 1;
            pthread_cond_signal(&c->in.cv);
            pthread_mutex_unlock(&c->in.mu);
        }
    }
    return NULL;
}

void *cluster__room_waiter_main(void *arg)
{
    struct cluster *c = arg;
    uint32_t seen = kvc_room_epoch(c->cfg.seg);
    uint64_t failures = 0;
    kvc_segment_info si;
    if (kvc_segment_stat(c->cfg.seg, &si) == KVC_OK)
        failures = si.failures_total;
    for (;;) {
        if (stop_asked(c))
            break;
        if (kvc_room_wait_change(c->cfg.seg, seen, WAITER_SLICE_MS) != KVC_OK)
            continue;
        seen = kvc_room_epoch(c->cfg.seg);
        /* Rooms change all the time; only a new failure record matters. */
        if (kvc_segment_stat(c->cfg.seg, &si) != KVC_OK || si.failures_total == failures)
            continue;
        failures = si.failures_total;
        cluster__push_wake(c); /* first: the push thread never waits for etcd */
        pthread_mutex_lock(&c->in.mu);
        c->in.room_changed = 1;
        pthread_cond_signal(&c->in.cv);
        pthread_mutex_unlock(&c->in.mu);
    }
    return NULL;
}
