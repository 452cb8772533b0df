/*
 * cluster_watch.c - the cluster thread's helpers, each a thread of its own
 * that only queues or flags under c->mu: the watch thread (a range of the
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
    pthread_mutex_lock(&c->mu);
    if (c->q_tail)
        c->q_tail->next = b;
    else
        c->q_head = b;
    c->q_tail = b;
    pthread_cond_signal(&c->cv);
    pthread_mutex_unlock(&c->mu);
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

static int on_watch_idle(void *arg)
{
    struct cluster *c = arg;
    pthread_mutex_lock(&c->mu);
    int stop = c->stop || c->restart_watch;
    c->restart_watch = 0;
    pthread_mutex_unlock(&c->mu);
    return stop;
}

static void set_watch_state(struct cluster *c, int up)
{
    pthread_mutex_lock(&c->mu);
    if (up) {
        c->watch_up = 1;
        c->watch_down_since = 0;
    } else if (c->watch_up || !c->watch_down_since) {
        c->watch_up = 0;
        c->watch_down_since = kvc__mono_ns();
    }
    pthread_mutex_unlock(&c->mu);
}

/* Sleep ms unless stopped; returns non-zero when stopping. */
static int watch_sleep(struct cluster *c, uint32_t ms)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    uint64_t t = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec + ms * 1000000ull;
    ts.tv_sec = (time_t)(t / 1000000000ull);
    ts.tv_nsec = (long)(t % 1000000000ull);
    pthread_mutex_lock(&c->mu);
    while (!c->stop && pthread_cond_timedwait(&c->cv, &c->mu, &ts) != ETIMEDOUT) {
    }
    int stop = c->stop;
    pthread_mutex_unlock(&c->mu);
    return stop;
}

void *cluster__watch_main(void *arg)
{
    struct cluster *c = arg;
    char err[256];
    etcd *w = NULL;
    if (etcd_open(&c->econf, &w, err, sizeof err)) {
        log_event(LOG_ERROR, "etcd_watch_failed", "err=\"%s\"", err);
        return NULL;
    }
    uint32_t backoff = 0;
    int logged = 0;
    for (;;) {
        pthread_mutex_lock(&c->mu);
        int stop = c->stop;
        c->restart_watch = 0;
        pthread_mutex_unlock(&c->mu);
        if (stop)
            break;
        etcd_kv *kvs;
        size_t n;
        int64_t rev;
        if (etcd_range_prefix(w, c->prefix, &kvs, &n, &rev)) {
            set_watch_state(c, 0);
            if (!logged++)
                log_event(LOG_WARN, "etcd_watch_down", "cluster=%s err=\"%s\"", c->cluster,
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
                      c->cluster, etcd_endpoint(w), rev);
        logged = 0;
        struct batch *b = calloc(1, sizeof *b);
        if (!b) {
            etcd_kvs_free(kvs, n);
            continue;
        }
        b->snapshot = 1, b->kvs = kvs, b->nkv = n, b->rev = rev;
        set_watch_state(c, 1);
        enqueue(c, b);
        int64_t last;
        if (etcd_watch(w, c->prefix, rev + 1, on_watch_events, on_watch_idle, c, &last) == 0)
            continue; /* stop, or a fresh stream asked for */
        set_watch_state(c, 0);
        log_event(LOG_WARN, "etcd_watch_down", "cluster=%s err=\"%s\"", c->cluster, etcd_error(w));
        logged = 1;
        if (watch_sleep(c, BACKOFF_MIN_MS))
            break;
    }
    etcd_close(w);
    return NULL;
}

/* ---- futex waiters ------------------------------------------------------- */

/* cluster_stop() has asked the threads to end. */
static int stop_asked(struct cluster *c)
{
    pthread_mutex_lock(&c->mu);
    int stop = c->stop;
    pthread_mutex_unlock(&c->mu);
    return stop;
}

void *cluster__rank_waiter_main(void *arg)
{
    struct cluster *c = arg;
    uint32_t seen = kvc_rank_epoch(c->seg);
    for (;;) {
        if (stop_asked(c))
            break;
        if (kvc_rank_wait_change(c->seg, seen, WAITER_SLICE_MS) == KVC_OK) {
            seen = kvc_rank_epoch(c->seg); /* before flagging: no lost change */
            pthread_mutex_lock(&c->mu);
            c->rank_changed = 1;
            pthread_cond_signal(&c->cv);
            pthread_mutex_unlock(&c->mu);
        }
    }
    return NULL;
}

void *cluster__room_waiter_main(void *arg)
{
    struct cluster *c = arg;
    uint32_t seen = kvc_room_epoch(c->seg);
    uint64_t failures = 0;
    kvc_segment_info si;
    if (kvc_segment_stat(c->seg, &si) == KVC_OK)
        failures = si.failures_total;
    for (;;) {
        if (stop_asked(c))
            break;
        if (kvc_room_wait_change(c->seg, seen, WAITER_SLICE_MS) != KVC_OK)
            continue;
        seen = kvc_room_epoch(c->seg);
        /* Rooms change all the time; only a new failure record matters. */
        if (kvc_segment_stat(c->seg, &si) != KVC_OK || si.failures_total == failures)
            continue;
        failures = si.failures_total;
        pthread_mutex_lock(&c->mu);
        c->room_changed = 1;
        pthread_cond_signal(&c->cv);
        pthread_mutex_unlock(&c->mu);
    }
    return NULL;
}
