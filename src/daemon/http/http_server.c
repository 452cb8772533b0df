/*
 * http_server.c - the io_uring event loop of kvcoordd; see http_server.h.
 *
 * One ring, one thread, which never waits for a segment lock.  Helpers
 * that never touch the ring: the rank watch for long-polls, the worker
 * threads for every request that may lock (http_worker.h), each waking the
 * loop through an eventfd read on the ring; and the segment maintenance
 * (proc_watch.h: reaping, room sweep, event log, segment file watch),
 * which the loop only pokes; the cluster threads (cluster.c) talk to etcd.
 * The loop reaps completions and hands each to the handler named after its
 * operation: handle_accept, handle_sweep, handle_signal, handle_wake,
 * handle_jobs here, and for connections handle_recv, handle_send and
 * handle_park_timeout in http_session.c.  What an SQE is for is packed in
 * its user_data (http_server_int.h).
 */
#include "clock.h"
#include "http_server.h"

#include <errno.h>
#include <liburing.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <stdio.h>
#include <sys/signalfd.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "auth.h"
#include "http_server_int.h"
#include "log.h"
#include "metrics.h"
#include "notify.h"
#include "proc_sockets.h"
#include "seg_events.h"

/* Ring sizes; overridable to test a full SQ and an overflowing CQ
 * (-DSQ_ENTRIES=4 -DCQ_ENTRIES_MAX=8). */
#ifndef SQ_ENTRIES
#define SQ_ENTRIES 1024
#endif
#ifndef CQ_ENTRIES_MAX
#define CQ_ENTRIES_MAX 65536
#endif
#define SWEEP_MS 1000            /* deadline sweep period */
#define ACCEPT_BACKOFF_MS 100    /* pause after accept ran out of fds or memory */
#define ACCEPT_ERRORS_MAX 64     /* consecutive unexpected accept errors before giving up */
#define SHUTDOWN_WAIT_MS 2000    /* bound on waiting for cancelled operations */
#define STOP_ANSWER_WAIT_MS 1000 /* bound on sending parked lookups their 503 */
#define ACCEPT_BATCH 16          /* accepted sockets opened between two looks at the ring */
#define CQE_BATCH 128            /* completions taken from the CQ at a time */
#define ACCEPT_WAIT_MS 1000      /* at the cap, longest wait of a new connection for a slot */
#define ACCEPT_TICK_MS 5         /* ... re-checked this often */

/* ---- submission ------------------------------------------------------------ */

/* An SQE, or NULL when the kernel refuses to take more (callers must cope:
 * never dereference it).  A full SQ is normal under load: the shared
 * policy (uring_ud.h) hands what is queued to the kernel and retries a few
 * times, never waiting (completions are only drained by this loop). */
static struct io_uring_sqe *get_sqe(struct server *s)
{
    int err;
    struct io_uring_sqe *sqe = kvc__uring_sqe(&s->ring, &err);
    if (!sqe && err && err != EINTR && err != EAGAIN && err != EBUSY)
        log_event(LOG_ERROR, "ring_submit_failed", "err=\"%s\"", strerror(err));
    if (!sqe)
        log_event(LOG_WARN, "sq_full", "pending=%llu", (unsigned long long)s->pending);
    return sqe;
}

/* Prepare an SQE for op on slot (NULL conn: not a connection's op). */
struct io_uring_sqe *op_sqe(struct server *s, enum op op, struct conn *c, uint16_t seq)
{
    struct io_uring_sqe *sqe = get_sqe(s);
    if (!sqe)
        return NULL;
    io_uring_sqe_set_data64(sqe, ud_pack(op, c ? c->slot : 0, seq));
    if (op != OP_IGNORE)
        s->pending++;
    if (c)
        c->inflight++;
    return sqe;
}

/* ---- arming operations --------------------------------------------------------- */

static void arm_accept(struct server *s)
{
    struct io_uring_sqe *sqe = op_sqe(s, OP_ACCEPT, NULL, 0);
    if (!sqe)
        return; /* the sweep re-arms it */
    io_uring_prep_multishot_accept(sqe, s->cfg->listen_fd, NULL, NULL, SOCK_CLOEXEC);
    s->accept_armed = 1;
}

static void arm_accept_backoff(struct server *s)
{
    struct io_uring_sqe *sqe = op_sqe(s, OP_ACCEPT_BACKOFF, NULL, 0);
    if (!sqe)
        return; /* the sweep re-arms accept */
    s->backoff_ts = ms_ts(ACCEPT_BACKOFF_MS);
    io_uring_prep_timeout(sqe, &s->backoff_ts, 0, 0);
    s->accept_waiting = 1;
}

static void arm_sweep(struct server *s)
{
    struct io_uring_sqe *sqe = op_sqe(s, OP_SWEEP, NULL, 0);
    if (!sqe) {
        /* Without the sweep no deadline fires: that is not a state to run in. */
        log_event(LOG_ERROR, "sweep_not_armed", NULL);
        s->stopping = 1;
        s->exit_code = 1;
        return;
    }
    s->sweep_ts = ms_ts(SWEEP_MS);
    io_uring_prep_timeout(sqe, &s->sweep_ts, 0, 0);
}

static void arm_read(struct server *s, enum op op, int fd, void *dst, unsigned len)
{
    struct io_uring_sqe *sqe = op_sqe(s, op, NULL, 0);
    if (!sqe) {
        log_event(LOG_ERROR, "read_not_armed", "op=%d", (int)op);
        s->stopping = 1;
        s->exit_code = 1;
        return;
    }
    io_uring_prep_read(sqe, fd, dst, len, 0);
}

/* ---- completion handlers ------------------------------------------------------------- */

/* A burst of connections must not delay the ones being served: accepted
 * sockets are queued and opened ACCEPT_BATCH at a time, with a look at
 * the ring (other connections' completions) between two batches. */
static void accept_push(struct server *s, int fd)
{
    struct peer_addr peer;
    if (!conn_admit(s, fd, &peer))
        return; /* its address holds its share already (--max-conns-per-peer) */
    if (s->accept_len == s->accept_cap) { /* more than can be served anyway */
        conn_open(s, fd, &peer);
        return;
    }
    s->accept_q[(s->accept_head + s->accept_len++) % s->accept_cap] =
        (struct accepted){.fd = fd, .ms = s->now_ms, .peer = peer};
}

/* Near the cap (no free slot), connections that have waited long for a
 * request make room for the new ones (conns_evict), as nginx closes idle
 * keep-alives when it runs out of connections: a flood of connections
 * that never finish a request cannot lock others out.  An evicted slot
 * comes back once its cancelled operations complete, and a connection
 * becomes evictable CONN_EVICT_AFTER_MS after its last answer: new
 * connections wait in the queue meanwhile, first come first served, for
 * ACCEPT_WAIT_MS at most; then the oldest is answered 503 (conn_open).
 * Returns 1 when the queue's head may be opened (or refused) now. */
static int accept_room(struct server *s)
{
    if (s->free_list || s->stopping)
        return 1;
    if (s->nclosing < s->accept_len)
        conns_evict(s, s->accept_len - s->nclosing);
    if (s->free_list)
        return 1;
    return s->now_ms - s->accept_q[s->accept_head].ms >= ACCEPT_WAIT_MS;
}

static void accept_drain(struct server *s, unsigned max)
{
    for (unsigned n = 0; n < max && s->accept_len; n++) {
        if (!accept_room(s))
            break; /* slots are on their way back, or will be evictable soon */
        struct accepted a = s->accept_q[s->accept_head];
        s->accept_head = (s->accept_head + 1) % s->accept_cap;
        s->accept_len--;
        conn_open(s, a.fd, &a.peer);
    }
}

static void handle_accept(struct server *s, int res, unsigned flags)
{
    /* A multishot accept that ends (no F_MORE: an error, a CQ overflow, or
     * the kernel's choice) must be armed again, or the server goes deaf. */
    int ended = !(flags & IORING_CQE_F_MORE);
    if (ended) {
        s->accept_armed = 0;
        log_event(LOG_DEBUG, "accept_ended", "res=%d", res);
    }
    if (res >= 0) {
        s->accept_errors = 0;
        accept_push(s, res);
    } else if (res == -EMFILE || res == -ENFILE || res == -ENOBUFS || res == -ENOMEM) {
        /* Out of descriptors or memory: the pending connection stays queued,
         * so accepting again at once fails again at once, a hot loop.  Wait
         * a little (connections closing free descriptors meanwhile). */
        log_event(LOG_WARN, "accept_failed", "err=\"%s\" conns=%u retry_ms=%d", strerror(-res),
                  s->nconns, ACCEPT_BACKOFF_MS);
        if (ended && !s->accept_waiting && !s->stopping)
            arm_accept_backoff(s);
        return;
    } else if (res != -ECONNABORTED && res != -EINTR && res != -EAGAIN &&
               ++s->accept_errors >= ACCEPT_ERRORS_MAX) {
        /* EBADF, EINVAL, ENOTSOCK...: the listening socket is unusable.
         * Re-arming would fail forever; stop instead of looping. */
        log_event(LOG_ERROR, "accept_fatal", "err=\"%s\" errors=%u", strerror(-res),
                  s->accept_errors);
        s->stopping = 1;
        s->exit_code = 1;
        return;
    }
    if (!s->accept_armed && !s->accept_waiting && !s->stopping)
        arm_accept(s);
}

static void handle_accept_backoff(struct server *s)
{
    s->accept_waiting = 0;
    if (!s->accept_armed && !s->stopping)
        arm_accept(s);
}

/* The rank table changed: re-check every parked lookup, log what changed. */
static void handle_wake(struct server *s, int res)
{
    (void)res; /* the counter's value does not matter */
    conns_wake(s);
    s->poke_pending = 1; /* logs what changed, off the loop (loop() pokes) */
    if (!s->stopping)
        arm_read(s, OP_WAKE, s->wake_fd, &s->wake_buf, sizeof s->wake_buf);
}

/* The helper thread finished requests. */
static void handle_jobs(struct server *s)
{
    conns_jobs_done(s);
    if (!s->stopping)
        arm_read(s, OP_JOBS, s->jobs_fd, &s->jobs_buf, sizeof s->jobs_buf);
}

static void handle_sweep(struct server *s)
{
    conns_sweep(s); /* the segment's own tick is proc_watch's, off the loop */
    if (!s->accept_armed && !s->accept_waiting && !s->stopping)
        arm_accept(s); /* a re-arm that found no SQE earlier */
    if (!s->stopping)
        arm_sweep(s);
}

/* SIGHUP: re-read the token file; one log line per reload, whatever its
 * outcome.  A failed re-read keeps the token in force (auth.h), so a bad
 * edit never turns auth off; the reason comes before the file's name, so a
 * long path cannot cut it off the line. */
static void handle_reload(struct server *s)
{
    char err[256];
    struct auth *a = s->cfg->auth;
    notify_reloading();
    int rc = a ? auth_reload(a, err, sizeof err) : 0;
    if (rc > 0 && a->token_len == 0)
        log_event(LOG_WARN, "auth_reloaded",
                  "source=file file=%s note=\"empty token: every mutating request will be "
                  "refused\"",
                  a->path);
    else if (rc > 0)
        log_event(LOG_INFO, "auth_reloaded", "source=file file=%s", a->path);
    else if (rc == 0)
        log_event(LOG_INFO, "reload", "note=\"no token file\"");
    else
        log_event(LOG_ERROR, "auth_reload_failed",
                  "err=\"%s\" file=%s note=\"previous token kept\"", err, a->path);
    if (rc != 0 && s->metrics)
        metrics_auth_reload(s->metrics, rc > 0);
    notify_ready(NULL);
}

static void handle_signal(struct server *s, int res)
{
    if (s->stopping)
        return; /* cancelled while shutting down */
    if (res == -EINTR || res == -EAGAIN) {
        arm_read(s, OP_SIGNAL, s->cfg->signal_fd, &s->sig_buf, sizeof s->sig_buf);
        return;
    }
    if (res != (int)sizeof s->sig_buf) {
        log_event(LOG_ERROR, "signalfd_read_failed", "res=%d", res);
        s->exit_code = 1;
    } else {
        int signo = (int)s->sig_buf.ssi_signo;
        if (signo == SIGHUP) { /* one line: handle_reload's */
            handle_reload(s);
            arm_read(s, OP_SIGNAL, s->cfg->signal_fd, &s->sig_buf, sizeof s->sig_buf);
            return;
        }
        log_event(LOG_INFO, "signal", "name=%s", strsignal(signo));
    }
    notify_stopping();
    s->stopping = 1;
}

static void dispatch(struct server *s, uint64_t ud, int res, unsigned flags)
{
    enum op op = ud_op(ud);
    if (op != OP_IGNORE && !(flags & IORING_CQE_F_MORE))
        s->pending--;
    switch (op) {
    case OP_IGNORE: break;
    case OP_ACCEPT: handle_accept(s, res, flags); break;
    case OP_ACCEPT_BACKOFF: handle_accept_backoff(s); break;
    case OP_RECV:
    case OP_SEND:
    case OP_PARK_TIMEOUT: conn_complete(s, op, &s->conns[ud_slot(ud)], res, ud_seq(ud)); break;
    case OP_SWEEP: handle_sweep(s); break;
    case OP_SIGNAL: handle_signal(s, res); break;
    case OP_WAKE: handle_wake(s, res); break;
    case OP_JOBS: handle_jobs(s); break;
    }
}

/* Drain every completion there is, in batches.  Each CQE is copied and
 * marked seen before its handler runs, so handlers may submit (and the
 * kernel post) freely.  io_uring_peek_batch_cqe() also flushes completions
 * the kernel kept aside when the CQ was full (IORING_FEAT_NODROP): none is
 * lost.  In each batch the completions of slow peers (a request head
 * trickling in: http_session.c's conn_is_slow) are handled after the
 * others, and the answers made for the others are handed to the kernel
 * in between: hundreds of trickled bytes landing in the same tick do not
 * stand in front of a normal client's request.  A connection's own
 * completions keep their order (all of a batch are in the same class). */
struct done {
    uint64_t ud;
    int res;
    unsigned flags;
};

static int done_slow(const struct server *s, uint64_t ud)
{
    return ud_op(ud) == OP_RECV && conn_is_slow(&s->conns[ud_slot(ud)]);
}

static void drain_completions(struct server *s)
{
    struct io_uring_cqe *cqes[CQE_BATCH];
    struct done now[CQE_BATCH], later[CQE_BATCH];
    unsigned n;
    while ((n = io_uring_peek_batch_cqe(&s->ring, cqes, CQE_BATCH)) > 0) {
        unsigned nn = 0, nl = 0;
        routes_batch(s->routes, ++s->batches); /* what is answered now arrived before */
        for (unsigned i = 0; i < n; i++) {
            struct done d = {cqes[i]->user_data, cqes[i]->res, cqes[i]->flags};
            if (done_slow(s, d.ud))
                later[nl++] = d;
            else
                now[nn++] = d;
        }
        io_uring_cq_advance(&s->ring, n);
        for (unsigned i = 0; i < nn; i++)
            dispatch(s, now[i].ud, now[i].res, now[i].flags);
        if (nl && io_uring_sq_ready(&s->ring))
            io_uring_submit(&s->ring); /* the normal clients' answers first */
        for (unsigned i = 0; i < nl; i++)
            dispatch(s, later[i].ud, later[i].res, later[i].flags);
    }
}

/* ---- set-up, loop, shut-down ----------------------------------------------------------- */

static unsigned pow2_at_least(unsigned v)
{
    unsigned p = 1;
    while (p < v && p < (1u << 30))
        p <<= 1;
    return p;
}

/* The CQ holds a completion for every operation that can be in flight at
 * once (per connection a recv, a send and a park timer, plus a few of the
 * server's own), so it does not overflow even with every connection busy;
 * should it anyway, the kernel keeps the extra completions (NODROP) and
 * drain_completions() flushes them. */
static int ring_init(struct server *s)
{
    unsigned cq = pow2_at_least(s->cfg->max_conns * 4 + 64);
    if (cq > CQ_ENTRIES_MAX)
        cq = CQ_ENTRIES_MAX;
    if (cq < 2 * SQ_ENTRIES) /* the kernel wants at least as many CQ as SQ entries */
        cq = 2 * SQ_ENTRIES;
    struct io_uring_params p;
    memset(&p, 0, sizeof p);
    p.flags = IORING_SETUP_CQSIZE | IORING_SETUP_SUBMIT_ALL | IORING_SETUP_SINGLE_ISSUER |
              IORING_SETUP_DEFER_TASKRUN;
    p.cq_entries = cq;
    int ret = io_uring_queue_init_params(SQ_ENTRIES, &s->ring, &p);
    if (ret == -EINVAL) { /* an older kernel: plain ring */
        memset(&p, 0, sizeof p);
        p.flags = IORING_SETUP_CQSIZE;
        p.cq_entries = cq;
        ret = io_uring_queue_init_params(SQ_ENTRIES, &s->ring, &p);
    }
    if (ret < 0) {
        log_event(LOG_ERROR, "ring_setup_failed", "err=\"%s\"", strerror(-ret));
        return -1;
    }
    if (!(p.features & IORING_FEAT_NODROP))
        log_event(LOG_WARN, "ring_no_nodrop", "cq_entries=%u", p.cq_entries);
    log_event(LOG_DEBUG, "ring", "sq_entries=%u cq_entries=%u flags=0x%x", p.sq_entries,
              p.cq_entries, p.flags);
    s->ring_ok = 1;
    return 0;
}

static int server_init(struct server *s, const struct server_config *cfg, kvc_segment *seg)
{
    memset(s, 0, sizeof *s);
    s->cfg = cfg;
    s->limits.max_head = cfg->max_head_bytes;
    s->limits.max_body = cfg->max_body_bytes;
    s->limits.max_buffered = cfg->max_buffered_bytes;
    s->limits.buffered = &s->buffered;
    /* With a token configured, peers without it may hold half the body
     * budget at most: the other half is kept for authenticated requests. */
    s->limits.max_untrusted =
        cfg->auth && auth_enabled(cfg->auth) ? cfg->max_buffered_bytes / 2 : 0;
    s->limits.untrusted = &s->untrusted;
    s->wake_fd = s->jobs_fd = -1;
    s->metrics = cfg->metrics;
    if (s->metrics) /* the budgets show from the start */
        metrics_answers(s->metrics, 0, cfg->max_answer_bytes);
    s->now_ms = kvc__mono_ms();
    s->conns = calloc(cfg->max_conns, sizeof *s->conns);
    s->accept_cap = cfg->max_conns + 64;
    s->accept_q = calloc(s->accept_cap, sizeof *s->accept_q);
    if (!s->conns || !s->accept_q || peers_init(&s->peers, s->accept_cap + cfg->max_conns) ||
        routes_create(&s->routes, seg) || seg_events_init(&s->events, seg)) {
        log_event(LOG_ERROR, "server_init_failed", "err=\"out of memory\"");
        return -1;
    }
    /* Accepted sockets inherit TCP_NODELAY from the listening one (Linux
     * copies the option at accept): one call here instead of one per
     * connection, which a burst of connections would wait behind. */
    int one = 1;
    s->nodelay_inherited =
        setsockopt(cfg->listen_fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) == 0;
    routes_set_ops(s->routes, cfg->auth, cfg->metrics);
    routes_set_cluster(s->routes, cfg->cluster);
    s->limits.head_check = routes_head_check;
    s->limits.head_arg = s->routes;
    for (unsigned i = cfg->max_conns; i-- > 0;) {
        s->conns[i].fd = -1;
        s->conns[i].slot = i;
        s->conns[i].next_free = s->free_list;
        s->free_list = &s->conns[i];
    }
    if (rank_watch_start(&s->watch, seg, &s->wake_fd) ||
        worker_start(&s->worker, s->routes, WORKER_THREADS, &s->jobs_fd)) {
        log_event(LOG_ERROR, "server_init_failed", "err=\"helper thread: %s\"", strerror(errno));
        return -1;
    }
    struct proc_watch_config pc = {.seg = seg,
                                   .events = s->events,
                                   .file = cfg->segment_file,
                                   .metrics = cfg->metrics,
                                   .pd_room_interval_ms = cfg->pd_room_interval_ms};
    if (proc_watch_start(&s->procs, &pc)) {
        log_event(LOG_ERROR, "server_init_failed", "err=\"process watch: %s\"", strerror(errno));
        return -1;
    }
    peer_process_watch(s->procs); /* HTTP registrants' deaths told as they happened */
    return ring_init(s);
}

/* Cancel everything and wait (bounded) for the completions, so no kernel
 * operation still targets our buffers when they are freed. */
static void server_drain(struct server *s)
{
    accept_drain(s, s->accept_len); /* stopping: each is answered 503 and closed */
    /* Parked lookups get an answer (503, "kvcoordd is stopping") rather than
     * a closed connection: run the ring until each is sent, bounded. */
    if (conns_stop_parked(s)) {
        uint64_t until = kvc__mono_ms() + STOP_ANSWER_WAIT_MS;
        while (conns_stop_sending(s) && kvc__mono_ms() < until) {
            struct __kernel_timespec ts = ms_ts(100);
            struct io_uring_cqe *cqe;
            io_uring_submit_and_wait_timeout(&s->ring, &cqe, 1, &ts, NULL);
            s->now_ms = kvc__mono_ms();
            drain_completions(s);
        }
    }
    for (unsigned i = 0; i < s->cfg->max_conns; i++)
        if (s->conns[i].fd >= 0)
            conn_close(s, &s->conns[i], "shutdown");
    struct io_uring_sqe *sqe = op_sqe(s, OP_IGNORE, NULL, 0);
    if (sqe)
        io_uring_prep_cancel64(sqe, 0, IORING_ASYNC_CANCEL_ANY);
    uint64_t deadline = kvc__mono_ms() + SHUTDOWN_WAIT_MS;
    while (s->pending > 0 && kvc__mono_ms() < deadline) {
        struct __kernel_timespec ts = ms_ts(100);
        struct io_uring_cqe *cqe;
        io_uring_submit_and_wait_timeout(&s->ring, &cqe, 1, &ts, NULL);
        drain_completions(s);
    }
    if (s->pending)
        log_event(LOG_WARN, "shutdown_incomplete", "pending=%llu", (unsigned long long)s->pending);
}

static void server_free(struct server *s)
{
    peer_process_watch(NULL);
    proc_watch_stop(s->procs); /* before the events and metrics it uses go */
    if (s->ring_ok)
        io_uring_queue_exit(&s->ring);
    rank_watch_stop(s->watch);
    worker_stop(s->worker); /* before the buffers its job may still read go */
    for (unsigned i = 0; s->conns && i < s->cfg->max_conns; i++) {
        struct conn *c = &s->conns[i];
        if (c->fd >= 0)
            close(c->fd);
        hconn_free(&c->http);
        route_slot_free(&c->route);
        buf_free(&c->job.out);
        buf_free(&c->out[0]);
        buf_free(&c->out[1]);
        free(c->rbuf);
    }
    free(s->conns);
    for (; s->accept_q && s->accept_len; s->accept_len--, s->accept_head++)
        close(s->accept_q[s->accept_head % s->accept_cap].fd);
    free(s->accept_q);
    peers_free(&s->peers);
    routes_destroy(s->routes);
    seg_events_free(s->events);
}

static void loop(struct server *s)
{
    arm_accept(s);
    arm_sweep(s);
    arm_read(s, OP_SIGNAL, s->cfg->signal_fd, &s->sig_buf, sizeof s->sig_buf);
    arm_read(s, OP_WAKE, s->wake_fd, &s->wake_buf, sizeof s->wake_buf);
    arm_read(s, OP_JOBS, s->jobs_fd, &s->jobs_buf, sizeof s->jobs_buf);
    while (!s->stopping) {
        /* With accepted sockets still queued, only look (no wait); when
         * they wait for a slot, wait a tick at most. */
        int ret;
        if (s->accept_len && !s->free_list) {
            struct __kernel_timespec ts = ms_ts(ACCEPT_TICK_MS);
            struct io_uring_cqe *cqe;
            ret = io_uring_submit_and_wait_timeout(&s->ring, &cqe, 1, &ts, NULL);
        } else {
            ret = io_uring_submit_and_wait(&s->ring, s->accept_len ? 0 : 1);
        }
        if (ret < 0 && ret != -EINTR && ret != -EAGAIN && ret != -EBUSY && ret != -ETIME) {
            log_event(LOG_ERROR, "ring_wait_failed", "err=\"%s\"", strerror(-ret));
            s->exit_code = 1;
            break;
        }
        s->now_ms = kvc__mono_ms();
        drain_completions(s);
        accept_drain(s, ACCEPT_BATCH);
        if (s->poke_pending) {
            /* The answers of this pass go to the kernel first: waking the
             * process watch (which then lists the rank table to log the
             * change) must not delay the registration's own answer. */
            io_uring_submit(&s->ring);
            s->poke_pending = 0;
            proc_watch_poke(s->procs);
        }
    }
}

int server_run(const struct server_config *cfg, kvc_segment *seg)
{
    struct server s;
    if (server_init(&s, cfg, seg)) {
        server_free(&s);
        return 1;
    }
    /* Ready: say so only now that the socket listens and the ring runs. */
    log_event(LOG_INFO, "listening",
              "addr=%s segment=%s max_conns=%u max_conns_per_peer=%u peer_cap=%s", cfg->listen_addr,
              cfg->segment_name, cfg->max_conns, cfg->max_conns_per_peer,
              !cfg->max_conns_per_peer ? "off"
              : cfg->peer_cap_loopback ? "every_address"
                                       : "remote_addresses");
    char status[256], err[128];
    snprintf(status, sizeof status, "READY=1\nSTATUS=listening on %s segment %s", cfg->listen_addr,
             cfg->segment_name);
    if (notify_send(status, err, sizeof err) < 0) /* never fatal */
        log_event(LOG_WARN, "notify_failed", "err=\"%s\"", err);
    loop(&s);
    s.stopping = 1;
    server_drain(&s);
    server_free(&s);
    return s.exit_code; /* "stopped" is the caller's to log, once it is all done */
}
