/*
 * engine_core.c - kvcoord.mooncake's engine core: one kvt_engine behind a
 * mutex, its progress thread, the waiters of the calls in flight, the
 * peers' descriptors (fetched on first use, again when stale), and the
 * reasons of failures.  Contract: engine_core.h.
 */
#include "engine_core.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "engine_peer.h"

#define MCE_REASON 512
#define MCE_EVENTS 64
#define MCE_LOG_LINES 64
#define MCE_ASYNC_MAX 4096 /* asynchronous batches not yet waited for */
#define MCE_TICK_MS 50     /* progress thread's poll bound (deadlines) */

/* One call (or asynchronous batch) in flight: a room of the engine. */
typedef struct mce_waiter {
    struct mce_waiter *next; /* in flight list / free list */
    pthread_cond_t cond;
    uint64_t room;
    uint64_t lo, hi;   /* local address range its runs touch */
    uint64_t deadline; /* CLOCK_MONOTONIC ns */
    uint64_t bytes;    /* payload bytes of the batch */
    int op;            /* MCE_WRITE / MCE_READ */
    bool done;         /* the engine's event arrived */
    bool abandoned;    /* nobody will look: recycle on the event */
    bool async;        /* waited for by mce_batch_wait */
    bool ok;
    int32_t code;
    char sid[KVC_SESSION_ID_MAX + 1];
    char reason[KVC_REASON_MAX + 1];
} mce_waiter;

struct mce {
    pthread_mutex_t mu;  /* everything below, and every call into e */
    pthread_cond_t idle; /* a waiter finished (unregister waits on it) */
    kvt_engine *e;
    mce_peers peers;
    mce_regions regions; /* registered here: start -> length */
    uint64_t next_room;
    mce_waiter *inflight, *free;
    uint32_t nasync;
    pthread_t thr;
    int efd; /* wakes the progress thread to stop */
    bool stop, dead;
    char dead_why[MCE_REASON];
    uint64_t timeout_ns;
    uint32_t fetch_ms;
    char *token;
    char last[MCE_REASON];
    uint64_t last_ns;
    uint64_t calls_ok, calls_failed;
    /* engine log lines (WARN, ERROR) for the Python side to log */
    char log[MCE_LOG_LINES][256];
    int log_level[MCE_LOG_LINES];
    unsigned log_head, log_n;
};

static _Thread_local char tl_err[MCE_REASON];
static _Thread_local uint64_t tl_err_ns;

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Record the calling thread's failure (and the engine's latest). */
static int fail(mce *m, int rc, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(mce *m, int rc, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(tl_err, sizeof tl_err, fmt, ap);
    va_end(ap);
    tl_err_ns = now_ns();
    if (m) {
        pthread_mutex_lock(&m->mu);
        snprintf(m->last, sizeof m->last, "%s", tl_err);
        m->last_ns = tl_err_ns;
        pthread_mutex_unlock(&m->mu);
    }
    return rc;
}

const char *mce_last_error(void) { return tl_err; }
uint64_t mce_last_error_ns(void) { return tl_err_ns; }

uint64_t mce_engine_last_error(mce *m, char *buf, size_t cap)
{
    pthread_mutex_lock(&m->mu);
    snprintf(buf, cap, "%s", m->last);
    uint64_t t = m->last_ns;
    pthread_mutex_unlock(&m->mu);
    return t;
}

/* kvt_log_fn: called under m->mu from whichever thread drives the engine. */
static void engine_log(void *ctx, int level, const char *msg)
{
    mce *m = ctx;
    if (level > KVT_LOG_WARN)
        return;
    if (m->log_n == MCE_LOG_LINES) { /* full: the oldest goes */
        m->log_head = (m->log_head + 1) % MCE_LOG_LINES;
        m->log_n--;
    }
    unsigned i = (m->log_head + m->log_n++) % MCE_LOG_LINES;
    snprintf(m->log[i], sizeof m->log[i], "%s", msg);
    m->log_level[i] = level;
}

int mce_log_take(mce *m, char *buf, size_t cap)
{
    int level = -1;
    pthread_mutex_lock(&m->mu);
    if (m->log_n) {
        snprintf(buf, cap, "%s", m->log[m->log_head]);
        level = m->log_level[m->log_head];
        m->log_head = (m->log_head + 1) % MCE_LOG_LINES;
        m->log_n--;
    }
    pthread_mutex_unlock(&m->mu);
    return level;
}

/* ---- waiters ------------------------------------------------------------- */

static mce_waiter *waiter_get(mce *m)
{
    mce_waiter *w = m->free;
    if (w) {
        m->free = w->next;
    } else {
        w = calloc(1, sizeof *w);
        if (!w)
            return NULL;
        pthread_condattr_t ca;
        pthread_condattr_init(&ca);
        pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
        pthread_cond_init(&w->cond, &ca);
        pthread_condattr_destroy(&ca);
    }
    w->done = w->abandoned = w->async = w->ok = false;
    w->code = 0;
    w->reason[0] = 0;
    w->next = m->inflight;
    m->inflight = w;
    return w;
}

static void waiter_unlink(mce *m, mce_waiter *w)
{
    mce_waiter **pp = &m->inflight;
    while (*pp && *pp != w)
        pp = &(*pp)->next;
    if (*pp)
        *pp = w->next;
}

/* w leaves the in-flight list for the pool; unregister may go on. */
static void waiter_put(mce *m, mce_waiter *w)
{
    waiter_unlink(m, w);
    w->next = m->free;
    m->free = w;
    pthread_cond_broadcast(&m->idle);
}

static void waiter_finish(mce *m, mce_waiter *w, bool ok, int32_t code, const char *reason)
{
    w->done = true;
    w->ok = ok;
    w->code = code;
    snprintf(w->reason, sizeof w->reason, "%s", reason);
    if (w->abandoned)
        waiter_put(m, w);
    else
        pthread_cond_signal(&w->cond);
}

/* The engine failed for good: fail every call in flight. */
static void fail_all(mce *m, const char *why)
{
    m->dead = true;
    snprintf(m->dead_why, sizeof m->dead_why, "%s", why);
    for (mce_waiter *w = m->inflight, *next; w; w = next) {
        next = w->next;
        if (!w->done)
            waiter_finish(m, w, false, EIO, why);
    }
}

/* Drive the engine once without blocking and deliver its events.  Under mu. */
static void drive(mce *m)
{
    kvt_event ev[MCE_EVENTS];
    size_t n;
    if (m->dead)
        return;
    do {
        if (kvt_progress(m->e, 0, ev, MCE_EVENTS, &n) != KVC_OK) {
            fail_all(m, kvc_last_error());
            return;
        }
        for (size_t i = 0; i < n; i++) {
            if (ev[i].side == KVT_SIDE_RECEIVER)
                continue; /* a peer's writes into our memory: nobody waits */
            for (mce_waiter *w = m->inflight; w; w = w->next)
                if (w->room == ev[i].room && !w->done) {
                    waiter_finish(m, w, ev[i].state == KVC_POLL_SUCCESS, ev[i].code, ev[i].reason);
                    break;
                }
        }
    } while (n == MCE_EVENTS);
}

static void *progress_main(void *arg)
{
    mce *m = arg;
    struct pollfd fds[2] = {{.fd = kvt_fd(m->e), .events = POLLIN},
                            {.fd = m->efd, .events = POLLIN}};
    for (;;) {
        poll(fds, 2, MCE_TICK_MS);
        if (fds[1].revents & POLLIN) { /* a submit's wake-up (or stop) */
            uint64_t v;
            if (read(m->efd, &v, sizeof v) < 0) { /* EAGAIN: another took it */
            }
        }
        pthread_mutex_lock(&m->mu);
        if (m->stop) {
            pthread_mutex_unlock(&m->mu);
            return NULL;
        }
        drive(m);
        pthread_mutex_unlock(&m->mu);
    }
}

/* ---- engine ---------------------------------------------------------------- */

int mce_create(const mce_opts *o, mce **out)
{
    *out = NULL;
    mce *m = calloc(1, sizeof *m);
    if (!m)
        return fail(NULL, -1, "out of memory");
    pthread_mutex_init(&m->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&m->idle, &ca);
    pthread_condattr_destroy(&ca);
    m->timeout_ns = o->timeout_ns;
    m->fetch_ms = o->fetch_ms ? o->fetch_ms : 5000;
    m->token = o->token ? strdup(o->token) : NULL;
    m->next_room = 1;
    m->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (m->efd < 0) {
        int err = errno;
        mce_destroy(m);
        return fail(NULL, -1, "eventfd: %s", strerror(err));
    }
    kvt_options ko;
    kvt_options_init(&ko);
    ko.backend = o->backend;
    ko.verbs_device = o->device && *o->device ? o->device : NULL;
    ko.token = m->token;
    if (o->io_timeout_ms)
        ko.io_timeout_ms = o->io_timeout_ms;
    ko.log = engine_log;
    ko.log_ctx = m;
    char listen[300];
    bool v6 = strchr(o->host, ':') != NULL;
    snprintf(listen, sizeof listen, v6 ? "[%s]:%u" : "%s:%u", o->host, (unsigned)o->port);
    ko.listen = listen;
    kvc_err err = kvt_engine_create(&ko, &m->e);
    if (err) {
        /* The host may name this machine without being bindable as is
         * (a name of several addresses): every address, advertised as
         * the caller's host, as Mooncake's P2P handshake listens. */
        char any[32];
        snprintf(any, sizeof any, v6 ? "[::]:%u" : ":%u", (unsigned)o->port);
        ko.listen = any;
        ko.advertise_host = o->host;
        char first[512];
        snprintf(first, sizeof first, "%s", kvc_last_error());
        if (kvt_engine_create(&ko, &m->e) != KVC_OK) {
            mce_destroy(m);
            return fail(NULL, -1, "transfer engine on %s: %s", o->host, first);
        }
    }
    mce_peers_init(&m->peers);
    if (pthread_create(&m->thr, NULL, progress_main, m)) {
        kvt_engine_destroy(m->e);
        m->e = NULL;
        mce_destroy(m);
        return fail(NULL, -1, "pthread_create failed");
    }
    *out = m;
    return 0;
}

void mce_destroy(mce *m)
{
    if (!m)
        return;
    if (m->e) {
        pthread_mutex_lock(&m->mu);
        m->stop = true;
        pthread_mutex_unlock(&m->mu);
        uint64_t one = 1;
        if (write(m->efd, &one, sizeof one) < 0) { /* it wakes within a tick anyway */
        }
        pthread_join(m->thr, NULL);
        kvt_engine_destroy(m->e);
    }
    mce_peers_free(&m->peers);
    free(m->regions.v);
    for (mce_waiter *w = m->inflight, *next; w; w = next) {
        next = w->next;
        pthread_cond_destroy(&w->cond);
        free(w);
    }
    for (mce_waiter *w = m->free, *next; w; w = next) {
        next = w->next;
        pthread_cond_destroy(&w->cond);
        free(w);
    }
    if (m->efd >= 0)
        close(m->efd);
    pthread_cond_destroy(&m->idle);
    pthread_mutex_destroy(&m->mu);
    free(m->token);
    free(m);
}

const char *mce_session_id(const mce *m) { return kvt_session_id(m->e); }

int mce_rpc_port(const mce *m)
{
    const char *s = strrchr(kvt_session_id(m->e), ':');
    return s ? atoi(s + 1) : 0;
}

const char *mce_backend_name(const mce *m) { return kvt_backend_name(kvt_engine_backend(m->e)); }

void mce_stats(mce *m, kvt_stats *st, uint64_t *calls_ok, uint64_t *calls_failed)
{
    pthread_mutex_lock(&m->mu);
    kvt_engine_stat(m->e, st);
    *calls_ok = m->calls_ok;
    *calls_failed = m->calls_failed;
    pthread_mutex_unlock(&m->mu);
}

/* ---- memory ------------------------------------------------------------------- */

int mce_mr_register(mce *m, uint64_t addr, uint64_t len)
{
    if (!addr && !len)
        return fail(m, MCE_ERR_INVALID_ARGUMENT,
                    "register_memory(0, 0): address 0 is NULL and length 0 registers nothing");
    if (!addr)
        return fail(m, MCE_ERR_INVALID_ARGUMENT,
                    "register_memory(0, %llu): address 0 is NULL: pass the buffer's address",
                    (unsigned long long)len);
    if (!len)
        return fail(m, MCE_ERR_INVALID_ARGUMENT,
                    "register_memory(0x%llx, 0): length 0: nothing to register",
                    (unsigned long long)addr);
    pthread_mutex_lock(&m->mu);
    kvc_err err = kvt_mr_register(m->e, (void *)(uintptr_t)addr, (size_t)len, NULL);
    char why[MCE_REASON];
    snprintf(why, sizeof why, "%s", err ? kvc_last_error() : "");
    if (!err && mce_regions_add(&m->regions, addr, len)) {
        kvt_mr_deregister(m->e, (void *)(uintptr_t)addr);
        err = KVC_E_SYS;
        snprintf(why, sizeof why, "out of memory");
    }
    pthread_mutex_unlock(&m->mu);
    if (!err)
        return 0;
    return fail(m, strstr(why, "overlap") ? MCE_ERR_ADDRESS_OVERLAPPED : MCE_ERR_INVALID_ARGUMENT,
                "register_memory [0x%llx, +%llu): %s", (unsigned long long)addr,
                (unsigned long long)len, why);
}

static bool touches(const mce *m, uint64_t lo, uint64_t hi)
{
    for (const mce_waiter *w = m->inflight; w; w = w->next)
        if (!w->done && w->lo < hi && lo < w->hi)
            return true;
    return false;
}

int mce_mr_unregister(mce *m, uint64_t addr)
{
    pthread_mutex_lock(&m->mu);
    uint64_t len = mce_regions_len(&m->regions, addr);
    if (!len) {
        /* Say why: NULL, inside a region (not its start), or unknown. */
        const mce_region *in = NULL;
        for (size_t i = 0; addr && i < m->regions.n && !in; i++)
            if (addr > m->regions.v[i].addr && addr - m->regions.v[i].addr < m->regions.v[i].len)
                in = &m->regions.v[i];
        char why[160];
        if (!addr)
            snprintf(why, sizeof why, "address 0 is NULL");
        else if (in)
            snprintf(why, sizeof why,
                     "0x%llx is inside the region registered at 0x%llx (+%llu), not its start: "
                     "pass 0x%llx",
                     (unsigned long long)addr, (unsigned long long)in->addr,
                     (unsigned long long)in->len, (unsigned long long)in->addr);
        else
            snprintf(why, sizeof why, "0x%llx is not registered (%zu region%s registered)",
                     (unsigned long long)addr, m->regions.n, m->regions.n == 1 ? "" : "s");
        pthread_mutex_unlock(&m->mu);
        return fail(m, MCE_ERR_ADDRESS_NOT_REGISTERED, "unregister_memory(0x%llx): %s",
                    (unsigned long long)addr, why);
    }
    while (touches(m, addr, addr + len)) /* calls reading or writing it finish first */
        pthread_cond_wait(&m->idle, &m->mu);
    kvc_err err;
    while ((err = kvt_mr_deregister(m->e, (void *)(uintptr_t)addr)) == KVC_E_BUSY) {
        drive(m); /* a peer's write into it is being received */
        pthread_mutex_unlock(&m->mu);
        usleep(1000);
        pthread_mutex_lock(&m->mu);
    }
    char why[MCE_REASON];
    snprintf(why, sizeof why, "%s", err ? kvc_last_error() : "");
    if (!err)
        mce_regions_del(&m->regions, addr);
    pthread_mutex_unlock(&m->mu);
    if (err)
        return fail(m, MCE_ERR_ADDRESS_NOT_REGISTERED, "unregister_memory 0x%llx: %s",
                    (unsigned long long)addr, why);
    return 0;
}

/* ---- peers ---------------------------------------------------------------------- */

/* Fetch sid's descriptor (network: mu not held) and import it (mu held on
 * return).  0, or -1 with the reason recorded. */
static int fetch_import(mce *m, const char *sid, uint64_t deadline)
{
    char *json = NULL;
    uint64_t now = now_ns();
    uint32_t ms = m->fetch_ms;
    if (deadline > now && (deadline - now) / 1000000ull < ms)
        ms = (uint32_t)((deadline - now) / 1000000ull) + 1;
    char why[MCE_REASON] = "";
    int rc = mce_fetch_descriptor(sid, m->token, ms, &json, why, sizeof why);
    pthread_mutex_lock(&m->mu);
    if (rc) {
        mce_peer_fetched(&m->peers, sid, NULL, why);
        pthread_mutex_unlock(&m->mu);
        fail(m, -1, "handshake with %s (fetching its descriptor): %s", sid, why);
        pthread_mutex_lock(&m->mu);
        return -1;
    }
    kvt_peer *p = NULL;
    kvc_err err = kvt_peer_import(m->e, json, strlen(json), &p);
    free(json);
    if (err) {
        snprintf(why, sizeof why, "%s", kvc_last_error());
        pthread_mutex_unlock(&m->mu);
        fail(m, -1, "handshake with %s: its descriptor: %s", sid, why);
        pthread_mutex_lock(&m->mu);
        return -1;
    }
    mce_peer_fetched(&m->peers, sid, p, "");
    return 0;
}

int mce_peer_add(mce *m, const char *json, size_t len)
{
    pthread_mutex_lock(&m->mu);
    kvt_peer *p = NULL;
    kvc_err err = kvt_peer_import(m->e, json, len, &p);
    if (!err) {
        kvt_peer_info pi;
        kvt_peer_stat(m->e, p, &pi);
        mce_peer_fetched(&m->peers, pi.session_id, p, "");
    }
    char why[MCE_REASON];
    snprintf(why, sizeof why, "%s", err ? kvc_last_error() : "");
    pthread_mutex_unlock(&m->mu);
    return err ? fail(m, -1, "descriptor: %s", why) : 0;
}

int mce_descriptor(mce *m, char **json)
{
    pthread_mutex_lock(&m->mu);
    kvc_err err = kvt_descriptor_export(m->e, json);
    char why[MCE_REASON];
    snprintf(why, sizeof why, "%s", err ? kvc_last_error() : "");
    pthread_mutex_unlock(&m->mu);
    return err ? fail(m, -1, "descriptor: %s", why) : 0;
}

int mce_probe(mce *m, const char *sid)
{
    if (fetch_import(m, sid, now_ns() + (uint64_t)m->fetch_ms * 1000000ull)) {
        pthread_mutex_unlock(&m->mu);
        return -1;
    }
    pthread_mutex_unlock(&m->mu);
    return 0;
}

/* ---- transfers ------------------------------------------------------------------ */

static const char *op_name(int op) { return op == MCE_READ ? "read" : "write"; }

/* Submit runs to sid as a new room; on success the waiter (in flight) is
 * returned and mu is held.  On failure NULL, mu not held, reason recorded. */
static mce_waiter *submit(mce *m, const char *sid, int op, kvt_run *runs, size_t n, bool async,
                          uint64_t deadline)
{
    uint64_t bytes = 0, lo = UINT64_MAX, hi = 0;
    for (size_t i = 0; i < n; i++) {
        bytes += runs[i].len;
        if (runs[i].laddr < lo)
            lo = runs[i].laddr;
        if (runs[i].laddr + runs[i].len > hi)
            hi = runs[i].laddr + runs[i].len;
    }
    if (!deadline)
        deadline = now_ns() + m->timeout_ns + bytes; /* 1 GiB/s, as Mooncake */
    if (!n) {
        fail(m, -1, "%s to %s: no entries", op_name(op), sid);
        return NULL;
    }
    if (op == MCE_READ && !MCE_HAVE_READ) {
        fail(m, -1, "read from %s: this build's transfer engine has no READ", sid);
        return NULL;
    }
    pthread_mutex_lock(&m->mu);
    for (int attempt = 0;; attempt++) {
        if (m->dead) {
            char why[MCE_REASON];
            snprintf(why, sizeof why, "%s", m->dead_why);
            pthread_mutex_unlock(&m->mu);
            fail(m, -1, "%s to %s: the engine failed: %s", op_name(op), sid, why);
            return NULL;
        }
        if (async && m->nasync >= MCE_ASYNC_MAX) {
            pthread_mutex_unlock(&m->mu);
            fail(m, -1, "%s to %s: %d asynchronous batches not yet waited for", op_name(op), sid,
                 MCE_ASYNC_MAX);
            return NULL;
        }
        mce_peer *pe = mce_peer_lookup(&m->peers, sid);
        uint64_t now = now_ns();
        if (pe && !pe->p && pe->why[0] && now - pe->fetched_ns < 1000000000ull) {
            /* its handshake failed under a second ago: fail fast, same reason */
            char why[MCE_REASON];
            snprintf(why, sizeof why, "handshake with %s failed %llu ms ago: %s", sid,
                     (unsigned long long)((now - pe->fetched_ns) / 1000000ull), pe->why);
            pthread_mutex_unlock(&m->mu);
            fail(m, -1, "%s %s %s: %s", op_name(op), op == MCE_READ ? "from" : "to", sid, why);
            return NULL;
        }
        if (!pe || !pe->p) {
            pthread_mutex_unlock(&m->mu);
            if (fetch_import(m, sid, deadline)) {
                pthread_mutex_unlock(&m->mu);
                return NULL;
            }
            pe = mce_peer_lookup(&m->peers, sid);
        }
        mce_waiter *w = waiter_get(m);
        if (!w) {
            pthread_mutex_unlock(&m->mu);
            fail(m, -1, "%s to %s: out of memory", op_name(op), sid);
            return NULL;
        }
        w->room = m->next_room++;
        w->lo = lo;
        w->hi = hi;
        w->bytes = bytes;
        w->deadline = deadline;
        w->op = op;
        w->async = async;
        snprintf(w->sid, sizeof w->sid, "%s", sid);
        kvc_err err = mce_kvt_submit(m->e, pe->p, w->room, runs, n, op);
        if (err == KVC_OK) {
            if (async)
                m->nasync++;
            /* The progress thread submits the SQEs, now: io_uring runs an
             * operation's completion work in the thread that submitted it,
             * and this one is about to sleep on its condition variable. */
            uint64_t one = 1;
            if (write(m->efd, &one, sizeof one) < 0) { /* it wakes within a tick anyway */
            }
            return w;
        }
        char why[MCE_REASON];
        snprintf(why, sizeof why, "%s", kvc_last_error());
        waiter_put(m, w);
        /* Unhealthy: the peer may have restarted at the same session id
         * (a new generation in its descriptor clears the mark): one fresh
         * handshake, at most one a second per peer. */
        if (err == KVC_E_BUSY && attempt == 0 && mce_peer_may_refetch(pe, now_ns())) {
            pe->p = NULL;
            continue;
        }
        pthread_mutex_unlock(&m->mu);
        fail(m, err == KVC_E_INVAL ? MCE_ERR_INVALID_ARGUMENT : -1, "%s %s %s: %s", op_name(op),
             op == MCE_READ ? "from" : "to", sid, why);
        return NULL;
    }
}

/* Wait (mu held) until w is done or its deadline; block 0: just look.
 * 1 done ok, -1 failed, -2 deadline passed, 0 pending. */
static int wait_locked(mce *m, mce_waiter *w, int block)
{
    while (!w->done) {
        if (!block)
            return now_ns() > w->deadline ? -2 : 0;
        struct timespec ts = {.tv_sec = (time_t)(w->deadline / 1000000000ull),
                              .tv_nsec = (long)(w->deadline % 1000000000ull)};
        if (pthread_cond_timedwait(&w->cond, &m->mu, &ts) == ETIMEDOUT && !w->done)
            return -2;
    }
    return w->ok ? 1 : -1;
}

/* Conclude a call whose waiter gave rc: recycle w or leave it abandoned
 * to the engine (a timed-out room is still in flight); unlock; record the
 * reason.  0 or -1. */
static int conclude(mce *m, mce_waiter *w, int rc)
{
    char why[MCE_REASON];
    int op = w->op;
    char sid[KVC_SESSION_ID_MAX + 1];
    snprintf(sid, sizeof sid, "%s", w->sid);
    if (rc == -2) {
        snprintf(why, sizeof why,
                 "deadline of %llu ms passed (MC_TRANSFER_TIMEOUT plus 1 ns per byte)",
                 (unsigned long long)((m->timeout_ns + w->bytes) / 1000000ull));
        w->abandoned = true; /* the engine's event recycles it */
    } else {
        snprintf(why, sizeof why, "%s", w->reason);
        waiter_put(m, w);
    }
    if (w->async && m->nasync)
        m->nasync--;
    if (rc == 1)
        m->calls_ok++;
    else
        m->calls_failed++;
    pthread_mutex_unlock(&m->mu);
    if (rc == 1)
        return 0;
    fail(m, -1, "%s %s %s: %s", op_name(op), op == MCE_READ ? "from" : "to", sid, why);
    return -1;
}

/* A call's runs go to the engine as rooms of at most MCE_ROOM_BYTES each
 * (split at run boundaries), all submitted at once.  Made for what looked
 * like a stall of rooms larger than the windows; it was the benchmark's
 * working set leaving the L3 (docs/transfer.md, "Rooms larger than the
 * windows": one 256 MiB room over 16 MiB of pages runs as fast as 16 rooms
 * of 16 MiB).  Kept until measured without it on a quiet machine. */
#define MCE_ROOM_BYTES (16ull << 20)
#define MCE_ROOMS_MAX 64

int mce_transfer(mce *m, const char *sid, int op, kvt_run *runs, size_t n)
{
    uint64_t total = 0;
    for (size_t i = 0; i < n; i++)
        total += runs[i].len;
    uint64_t chunk = MCE_ROOM_BYTES;
    if (2 * total / chunk + 1 > MCE_ROOMS_MAX) /* greedy split: < 2 total / chunk + 1 rooms */
        chunk = 2 * total / (MCE_ROOMS_MAX - 1) + 1;
    uint64_t deadline = now_ns() + m->timeout_ns + total;
    for (int attempt = 0;; attempt++) {
        mce_waiter *ws[MCE_ROOMS_MAX];
        size_t nw = 0, i = 0;
        bool submit_failed = n == 0;
        if (n == 0)
            fail(m, -1, "%s %s %s: no entries", op_name(op), op == MCE_READ ? "from" : "to", sid);
        while (i < n && nw < MCE_ROOMS_MAX) {
            size_t j = i;
            uint64_t b = 0;
            while (j < n && (j == i || b + runs[j].len <= chunk))
                b += runs[j++].len;
            if (nw == MCE_ROOMS_MAX - 1)
                j = n; /* the last room takes the rest */
            mce_waiter *w = submit(m, sid, op, runs + i, j - i, false, deadline);
            if (!w) { /* the reason is recorded; rooms already submitted run on */
                submit_failed = true;
                break;
            }
            ws[nw++] = w;
            pthread_mutex_unlock(&m->mu);
            i = j;
        }
        pthread_mutex_lock(&m->mu);
        int rc = 1;
        bool stale = false;
        char why[MCE_REASON] = "";
        for (size_t k = 0; k < nw; k++) {
            mce_waiter *w = ws[k];
            int r = wait_locked(m, w, 1);
            if (r != 1 && rc == 1) {
                rc = r;
                if (r == -2)
                    snprintf(why, sizeof why,
                             "deadline of %llu ms passed (MC_TRANSFER_TIMEOUT plus 1 ns per byte)",
                             (unsigned long long)((m->timeout_ns + total) / 1000000ull));
                else
                    snprintf(why, sizeof why, "%s", w->reason);
            }
            if (r == -1 && w->code == ESTALE)
                stale = true;
            if (r == -2)
                w->abandoned = true; /* still in flight: the engine's event recycles it */
            else
                waiter_put(m, w);
        }
        /* The peer restarted since its descriptor was fetched (the engine
         * refused before writing a byte): fetch again, once, and retry;
         * addresses outside its new regions then fail without a write. */
        if (stale && attempt == 0 && !submit_failed) {
            mce_peer_forget(&m->peers, sid);
            pthread_mutex_unlock(&m->mu);
            continue;
        }
        if (rc == 1 && !submit_failed)
            m->calls_ok++;
        else
            m->calls_failed++;
        pthread_mutex_unlock(&m->mu);
        if (rc == 1 && !submit_failed)
            return 0;
        if (rc != 1 && !submit_failed)
            fail(m, -1, "%s %s %s: %s", op_name(op), op == MCE_READ ? "from" : "to", sid, why);
        return -1;
    }
}

uint64_t mce_submit(mce *m, const char *sid, int op, kvt_run *runs, size_t n)
{
    mce_waiter *w = submit(m, sid, op, runs, n, true, 0);
    if (!w)
        return 0;
    uint64_t id = w->room;
    pthread_mutex_unlock(&m->mu);
    return id;
}

int mce_batch_wait(mce *m, uint64_t id, int block)
{
    pthread_mutex_lock(&m->mu);
    mce_waiter *w = m->inflight;
    while (w && !(w->async && !w->abandoned && w->room == id))
        w = w->next;
    if (!w) {
        pthread_mutex_unlock(&m->mu);
        return fail(m, -3, "batch %llu: unknown or already waited for", (unsigned long long)id);
    }
    int rc = wait_locked(m, w, block);
    if (rc == 0) {
        pthread_mutex_unlock(&m->mu);
        return 0;
    }
    int r = conclude(m, w, rc);
    return r == 0 ? 1 : rc;
}
