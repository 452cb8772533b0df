/*
 * http_server.c - the io_uring event loop of kvcoordd; see http_server.h.
 *
 * One ring, one thread.  Every operation in flight is one SQE whose
 * user_data says what it was for (ud_pack below, the only place that
 * encoding lives); the loop reaps completions and hands each to the handler
 * named after its operation: handle_accept, handle_recv, handle_send,
 * handle_park_timeout, handle_sweep, handle_signal, handle_wake.
 *
 * Connections live in a fixed table of cfg->max_conns slots, so a CQE finds
 * its connection by index.  A slot is reused only once every SQE naming it
 * has completed (conn->inflight == 0): a late CQE can never land on the next
 * connection in the same slot.  For the same reason a socket is closed only
 * then: a kernel operation never sees its fd number reused.
 *
 * Per connection at most one recv and one send are in flight.  Responses
 * are appended to out[cur] while out[cur ^ 1] is being sent: the buffer
 * under a send is never written or moved (the kernel may read it at any
 * time until the send completes).
 */
#include "http_server.h"

#include <errno.h>
#include <liburing.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "http_conn.h"
#include "http_resp.h"
#include "http_routes.h"
#include "log.h"
#include "rank_watch.h"

/* Ring sizes; overridable to test a full SQ and an overflowing CQ
 * (-DSQ_ENTRIES=4 -DCQ_ENTRIES_MAX=8). */
#ifndef SQ_ENTRIES
#define SQ_ENTRIES 1024
#endif
#ifndef CQ_ENTRIES_MAX
#define CQ_ENTRIES_MAX 65536
#endif
#define RBUF_SIZE 16384            /* per-connection receive buffer */
#define OUT_HIGH (4u << 20)        /* stop reading requests while this much is unsent */
#define OUT_KEEP (256 * 1024)      /* output buffer kept per connection */
#define LINGER_MS 5000             /* reading (and discarding) after a final answer */
#define SWEEP_MS 1000              /* deadline sweep period */
#define ACCEPT_BACKOFF_MS 100      /* pause after accept ran out of fds or memory */
#define ACCEPT_ERRORS_MAX 64       /* consecutive unexpected accept errors before giving up */
#define ZERO_SENDS_MAX 8           /* zero-byte send results in a row before giving up */
#define SHUTDOWN_WAIT_MS 2000      /* bound on waiting for cancelled operations */

/* ---- user_data --------------------------------------------------------- */

enum op {
    OP_IGNORE = 0,     /* cancel and timeout-remove requests: result unused */
    OP_ACCEPT,         /* multishot accept on the listening socket */
    OP_ACCEPT_BACKOFF, /* timer before accept is armed again */
    OP_RECV,
    OP_SEND,
    OP_PARK_TIMEOUT,   /* a parked lookup's wait_ms ran out */
    OP_SWEEP,          /* periodic deadline sweep */
    OP_SIGNAL,         /* read of the signalfd */
    OP_WAKE            /* read of the rank watch's eventfd */
};

/* bits 0-7: op; 8-23: sequence (which park a timer belongs to); 32-63: slot. */
static inline uint64_t ud_pack(enum op op, uint32_t slot, uint16_t seq)
{
    return (uint64_t)slot << 32 | (uint64_t)seq << 8 | (uint64_t)op;
}
static inline enum op ud_op(uint64_t ud) { return (enum op)(ud & 0xff); }
static inline uint16_t ud_seq(uint64_t ud) { return (uint16_t)(ud >> 8); }
static inline uint32_t ud_slot(uint64_t ud) { return (uint32_t)(ud >> 32); }

/* ---- state --------------------------------------------------------------- */

struct conn {
    int fd;                 /* -1: slot free */
    uint32_t slot;
    unsigned inflight;      /* SQEs naming this slot, not yet completed */
    unsigned recv_armed : 1, send_armed : 1, parked : 1, park_timer : 1;
    unsigned closing : 1;          /* being torn down: waits for inflight == 0 */
    unsigned close_after_send : 1; /* answer what is queued, then close */
    unsigned peer_eof : 1;         /* the client shut its side */
    unsigned lingering : 1;        /* final answer sent: discarding input until EOF */
    uint16_t park_seq;
    unsigned zero_sends;
    uint64_t served;        /* requests answered */
    uint64_t accepted_ms, head_start_ms, deadline_ms; /* 0: no deadline */
    char *rbuf;             /* RBUF_SIZE bytes; [roff, rlen) not parsed yet */
    uint32_t roff, rlen;
    struct buf out[2];      /* out[cur]: being filled; out[cur ^ 1]: being sent */
    unsigned cur;
    size_t sent;            /* bytes of out[cur ^ 1] sent */
    struct http_conn http;
    struct route_slot route;
    struct __kernel_timespec park_ts;
    struct conn *park_prev, *park_next; /* parked lookups */
    struct conn *next_free;
};

struct server {
    struct io_uring ring;
    const struct server_config *cfg;
    struct http_limits limits;
    struct routes *routes;
    struct rank_watch *watch;
    int wake_fd;
    struct conn *conns;
    struct conn *free_list;
    unsigned nconns;
    struct conn *parked;
    uint64_t pending;       /* operations in flight (every SQE but OP_IGNORE) */
    uint64_t now_ms;
    int stopping, exit_code;
    int accept_armed, accept_waiting;
    unsigned accept_errors;
    uint64_t cap_logged_ms;
    struct __kernel_timespec sweep_ts, backoff_ts;
    struct signalfd_siginfo sig_buf;
    uint64_t wake_buf;
    int ring_ok;
};

static uint64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static struct __kernel_timespec ms_ts(uint64_t ms)
{
    return (struct __kernel_timespec){.tv_sec = (long long)(ms / 1000),
                                      .tv_nsec = (long long)(ms % 1000) * 1000000};
}

/* ---- submission ------------------------------------------------------------ */

/* An SQE, or NULL when the kernel refuses to take more (callers must cope:
 * never dereference it).  A full SQ is normal under load: hand what is
 * queued to the kernel to make room, then retry; a ring that keeps
 * refusing (EBUSY/EAGAIN while its CQ is backed up) gets a few tries only,
 * since completions are only reaped by our own loop. */
static struct io_uring_sqe *get_sqe(struct server *s)
{
    struct io_uring_sqe *sqe = io_uring_get_sqe(&s->ring);
    for (int tries = 0; !sqe && tries < 4; tries++) {
        int ret = io_uring_submit(&s->ring);
        if (ret < 0 && ret != -EINTR && ret != -EAGAIN && ret != -EBUSY) {
            log_event(LOG_ERROR, "ring_submit_failed", "err=\"%s\"", strerror(-ret));
            break;
        }
        sqe = io_uring_get_sqe(&s->ring);
    }
    if (!sqe)
        log_event(LOG_WARN, "sq_full", "pending=%llu", (unsigned long long)s->pending);
    return sqe;
}

/* Prepare an SQE for op on slot (NULL conn: not a connection's op). */
static struct io_uring_sqe *op_sqe(struct server *s, enum op op, struct conn *c, uint16_t seq)
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

/* ---- forward declarations ---------------------------------------------------- */

static void conn_close(struct server *s, struct conn *c, const char *why);
static void conn_process(struct server *s, struct conn *c);

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

static void arm_recv(struct server *s, struct conn *c)
{
    struct io_uring_sqe *sqe = op_sqe(s, OP_RECV, c, 0);
    if (!sqe) {
        conn_close(s, c, "no_sqe");
        return;
    }
    io_uring_prep_recv(sqe, c->fd, c->rbuf + c->rlen, RBUF_SIZE - c->rlen, 0);
    c->recv_armed = 1;
}

static void arm_send(struct server *s, struct conn *c)
{
    const struct buf *b = &c->out[c->cur ^ 1];
    struct io_uring_sqe *sqe = op_sqe(s, OP_SEND, c, 0);
    if (!sqe) {
        conn_close(s, c, "no_sqe");
        return;
    }
    io_uring_prep_send(sqe, c->fd, b->p + c->sent, b->len - c->sent, MSG_NOSIGNAL);
    c->send_armed = 1;
}

static void arm_park_timer(struct server *s, struct conn *c)
{
    struct io_uring_sqe *sqe = op_sqe(s, OP_PARK_TIMEOUT, c, c->park_seq);
    if (!sqe)
        return; /* caller answers at once */
    c->park_ts = ms_ts(c->route.park_wait_ms);
    io_uring_prep_timeout(sqe, &c->park_ts, 0, 0);
    c->park_timer = 1;
}

/* Remove a pending park timer; its CQE then comes with -ECANCELED. */
static void cancel_park_timer(struct server *s, struct conn *c)
{
    struct io_uring_sqe *sqe = op_sqe(s, OP_IGNORE, NULL, 0);
    if (sqe) /* else it fires later, finds the park over and is ignored */
        io_uring_prep_timeout_remove(sqe, ud_pack(OP_PARK_TIMEOUT, c->slot, c->park_seq), 0);
    c->park_timer = 0;
}

/* ---- connection slots ------------------------------------------------------------- */

static size_t out_pending(const struct conn *c)
{
    return c->out[c->cur].len + (c->out[c->cur ^ 1].len - c->sent);
}

static void park_unlink(struct server *s, struct conn *c)
{
    if (c->park_prev)
        c->park_prev->park_next = c->park_next;
    else
        s->parked = c->park_next;
    if (c->park_next)
        c->park_next->park_prev = c->park_prev;
    c->park_prev = c->park_next = NULL;
}

static void unpark(struct server *s, struct conn *c)
{
    if (!c->parked)
        return;
    c->parked = 0;
    park_unlink(s, c);
    rank_watch_unpark(s->watch);
    if (c->park_timer)
        cancel_park_timer(s, c);
}

/* Give the slot back once nothing in flight names it. */
static void conn_release(struct server *s, struct conn *c)
{
    close(c->fd);
    c->fd = -1;
    hconn_free(&c->http);
    route_slot_free(&c->route);
    buf_trim(&c->out[0], OUT_KEEP);
    buf_trim(&c->out[1], OUT_KEEP);
    c->next_free = s->free_list;
    s->free_list = c;
    s->nconns--;
}

/* Abortive close: cancel what is in flight, release the slot when the last
 * completion arrives.  Safe to call twice. */
static void conn_close(struct server *s, struct conn *c, const char *why)
{
    if (c->closing)
        return;
    c->closing = 1;
    unpark(s, c);
    if (log_enabled(LOG_DEBUG))
        log_event(LOG_DEBUG, "close", "slot=%u why=%s served=%llu", c->slot, why,
                  (unsigned long long)c->served);
    if (c->inflight == 0) {
        conn_release(s, c);
        return;
    }
    struct io_uring_sqe *sqe = op_sqe(s, OP_IGNORE, NULL, 0);
    if (sqe)
        io_uring_prep_cancel_fd(sqe, c->fd, IORING_ASYNC_CANCEL_ALL);
    else
        shutdown(c->fd, SHUT_RDWR); /* ends the pending recv and send just the same */
}

/* 503 for a connection over the cap, written directly (non-blocking): the
 * connections being served are not affected. */
static void reject_busy(struct server *s, int fd)
{
    static const char busy[] = "HTTP/1.1 503 Service Unavailable\r\n"
                               "Content-Type: application/json\r\n"
                               "Content-Length: 33\r\n"
                               "Connection: close\r\n\r\n"
                               "{\"detail\":\"Too many connections\"}";
    ssize_t n = send(fd, busy, sizeof busy - 1, MSG_DONTWAIT | MSG_NOSIGNAL);
    (void)n;
    shutdown(fd, SHUT_WR);
    close(fd);
    if (s->now_ms - s->cap_logged_ms >= 1000) { /* at most one line a second */
        log_event(LOG_WARN, "connection_cap", "max_conns=%u", s->cfg->max_conns);
        s->cap_logged_ms = s->now_ms;
    }
}

static void conn_open(struct server *s, int fd)
{
    struct conn *c = s->free_list;
    if (!c || s->stopping) {
        reject_busy(s, fd);
        return;
    }
    if (!c->rbuf && !(c->rbuf = malloc(RBUF_SIZE))) {
        reject_busy(s, fd);
        return;
    }
    s->free_list = c->next_free;
    s->nconns++;
    char *rbuf = c->rbuf;
    struct buf out0 = c->out[0], out1 = c->out[1];
    uint32_t slot = c->slot;
    memset(c, 0, sizeof *c);
    c->slot = slot, c->rbuf = rbuf, c->out[0] = out0, c->out[1] = out1;
    c->fd = fd;
    c->accepted_ms = s->now_ms;
    hconn_init(&c->http, &s->limits);
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (log_enabled(LOG_DEBUG))
        log_event(LOG_DEBUG, "accept", "slot=%u fd=%d conns=%u", c->slot, fd, s->nconns);
    conn_process(s, c);
}

/* ---- requests ----------------------------------------------------------------------- */

/* The request in c->http.req has been answered into out[cur]. */
static void request_done(struct server *s, struct conn *c)
{
    const struct http_req *req = &c->http.req;
    (void)s;
    c->served++;
    if (!req->keep_alive)
        c->close_after_send = 1;
    if (log_enabled(LOG_DEBUG))
        log_event(LOG_DEBUG, "request", "slot=%u method=%s path=\"%.*s\" keep_alive=%d",
                  c->slot, http_method_str((enum http_method)req->method),
                  (int)(req->path_len > 200 ? 200 : req->path_len), req->path,
                  req->keep_alive);
    hconn_done(&c->http);
    route_slot_done(&c->route);
}

/* Park a lookup until the rank table changes or its wait ends.  Parsing of
 * this connection stops meanwhile: pipelined requests behind it wait, so
 * answers stay in order. */
static void park(struct server *s, struct conn *c)
{
    c->parked = 1;
    c->park_seq++;
    c->park_next = s->parked;
    if (s->parked)
        s->parked->park_prev = c;
    s->parked = c;
    rank_watch_park(s->watch, c->route.park_epoch);
    arm_park_timer(s, c);
}

/* Re-check a parked lookup (expired: its wait is over, answer in any
 * case).  Returns 1 when it was answered (the connection then goes on with
 * the requests behind it: the caller runs conn_process), 0 if still parked. */
static int resume_parked(struct server *s, struct conn *c, int expired)
{
    enum route_rc rc = routes_resume(s->routes, &c->route, &c->http.req, &c->out[c->cur],
                                     expired);
    if (rc == ROUTE_PARK)
        return 0; /* still absent; the watch keeps waiting */
    unpark(s, c);
    request_done(s, c);
    return 1;
}

static void serve(struct server *s, struct conn *c)
{
    enum route_rc rc = routes_dispatch(s->routes, &c->route, &c->http.req, &c->out[c->cur]);
    if (rc == ROUTE_DONE) {
        request_done(s, c);
        return;
    }
    park(s, c);
    if (!c->park_timer) /* no SQE for its timer: answer now rather than never */
        resume_parked(s, c, 1);
}

/* A protocol error: answer it, then close (the byte stream cannot be
 * trusted past it). */
static void answer_error(struct server *s, struct conn *c)
{
    static const struct http_req closing = {.method = HTTP_GET, .http_minor = 1, .keep_alive = 0};
    (void)s;
    resp_detail(&c->out[c->cur], &closing, c->http.err_status, c->http.err_detail, NULL);
    c->close_after_send = 1;
    if (log_enabled(LOG_DEBUG))
        log_event(LOG_DEBUG, "bad_request", "slot=%u status=%d detail=\"%s\"", c->slot,
                  c->http.err_status, c->http.err_detail);
}

/* ---- deadlines, closing ------------------------------------------------------------- */

static void update_deadline(struct server *s, struct conn *c)
{
    const struct server_config *cfg = s->cfg;
    if (c->lingering)
        return; /* fixed when lingering began */
    if (c->parked) {
        c->deadline_ms = 0; /* the park timer bounds it */
        return;
    }
    if (c->http.phase == HCONN_HEAD) {
        /* Slowloris: the whole head must arrive within the header timeout of
         * its first byte, however slowly it trickles in. */
        if (!c->head_start_ms)
            c->head_start_ms = s->now_ms;
        c->deadline_ms = c->head_start_ms + cfg->header_timeout_ms;
        return;
    }
    c->head_start_ms = 0;
    if (c->http.phase == HCONN_IDLE && !out_pending(c) && c->served == 0)
        c->deadline_ms = c->accepted_ms + cfg->header_timeout_ms;
    else /* idle keep-alive, a body arriving or an answer leaving: since last progress */
        c->deadline_ms = s->now_ms + cfg->idle_timeout_ms;
}

/* Everything queued has been sent and the connection is to close.  Closing
 * with unread input would make the kernel send RST, which can destroy the
 * answer (e.g. a 413 or 431) before the client reads it; so shut down our
 * side and read until the client closes, for LINGER_MS at most. */
static void finish(struct server *s, struct conn *c)
{
    if (c->peer_eof || c->lingering) {
        conn_close(s, c, "done");
        return;
    }
    shutdown(c->fd, SHUT_WR);
    c->lingering = 1;
    c->deadline_ms = s->now_ms + LINGER_MS;
    if (!c->recv_armed) {
        c->roff = c->rlen = 0;
        arm_recv(s, c);
    }
}

/* Start sending what is queued, unless a send is in flight. */
static void flush(struct server *s, struct conn *c)
{
    if (c->send_armed || c->closing)
        return;
    struct buf *sending = &c->out[c->cur ^ 1];
    if (c->sent < sending->len) {
        arm_send(s, c); /* the rest of a short send */
        return;
    }
    buf_trim(sending, OUT_KEEP);
    c->sent = 0;
    struct buf *filled = &c->out[c->cur];
    if (filled->oom) {
        conn_close(s, c, "out_of_memory");
    } else if (filled->len) {
        c->cur ^= 1; /* what was filled is sent; the other buffer takes new answers */
        arm_send(s, c);
    } else if (c->close_after_send && !c->parked) {
        finish(s, c);
    }
}

static int may_read(const struct conn *c)
{
    return !c->recv_armed && !c->parked && !c->closing && !c->close_after_send
           && !c->peer_eof && c->roff == c->rlen && out_pending(c) < OUT_HIGH;
}

/* Parse what was received and answer complete requests, in order, until
 * the input runs out or something stops it (a park, a close, a full output
 * queue); then send, and read more when there is room. */
static void conn_process(struct server *s, struct conn *c)
{
    while (!c->parked && !c->closing && !c->close_after_send && c->roff < c->rlen
           && out_pending(c) < OUT_HIGH) {
        size_t used;
        enum hconn_event ev = hconn_parse(&c->http, c->rbuf + c->roff, c->rlen - c->roff, &used);
        c->roff += (uint32_t)used;
        if (ev == HCONN_REQUEST)
            serve(s, c);
        else if (ev == HCONN_CONTINUE)
            resp_continue(&c->out[c->cur]);
        else if (ev == HCONN_ERROR)
            answer_error(s, c);
    }
    if (c->closing)
        return;
    if (c->roff == c->rlen)
        c->roff = c->rlen = 0;
    update_deadline(s, c);
    flush(s, c);
    if (!c->closing && may_read(c))
        arm_recv(s, c);
}

/* ---- completion handlers ------------------------------------------------------------- */

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
        conn_open(s, res);
    } else if (res == -EMFILE || res == -ENFILE || res == -ENOBUFS || res == -ENOMEM) {
        /* Out of descriptors or memory: the pending connection stays queued,
         * so accepting again at once fails again at once, a hot loop.  Wait
         * a little (connections closing free descriptors meanwhile). */
        log_event(LOG_WARN, "accept_failed", "err=\"%s\" conns=%u retry_ms=%d", strerror(-res),
                  s->nconns, ACCEPT_BACKOFF_MS);
        if (ended && !s->accept_waiting && !s->stopping)
            arm_accept_backoff(s);
        return;
    } else if (res != -ECONNABORTED && res != -EINTR && res != -EAGAIN
               && ++s->accept_errors >= ACCEPT_ERRORS_MAX) {
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

static void handle_recv(struct server *s, struct conn *c, int res)
{
    c->recv_armed = 0;
    if (res == -EINTR || res == -EAGAIN || res == -ENOBUFS) {
        arm_recv(s, c);
        return;
    }
    if (c->lingering) {
        if (res > 0) /* discard: the answer is out, only the client's EOF is awaited */
            arm_recv(s, c);
        else
            conn_close(s, c, "linger_done");
        return;
    }
    if (res < 0) {
        conn_close(s, c, "recv_error");
        return;
    }
    if (res == 0) {
        /* The client finished sending: answer what is complete, then close. */
        c->peer_eof = 1;
        c->close_after_send = 1;
        if (c->parked) /* cannot happen: no recv while parked; be safe */
            return;
    }
    c->rlen += (uint32_t)res;
    conn_process(s, c);
}

static void handle_send(struct server *s, struct conn *c, int res)
{
    c->send_armed = 0;
    if (res == -EINTR || res == -EAGAIN) {
        flush(s, c); /* resubmits the same bytes */
        return;
    }
    if (res < 0) {
        conn_close(s, c, "send_error");
        return;
    }
    /* A zero-byte result for a non-empty send means no progress; retrying
     * is right once or twice, forever would spin. */
    if (res == 0 && ++c->zero_sends > ZERO_SENDS_MAX) {
        conn_close(s, c, "send_no_progress");
        return;
    }
    if (res > 0)
        c->zero_sends = 0;
    c->sent += (size_t)res; /* a short send: flush() submits the remainder */
    if (c->sent < c->out[c->cur ^ 1].len && log_enabled(LOG_DEBUG))
        log_event(LOG_DEBUG, "send_partial", "slot=%u sent=%zu of=%zu", c->slot, c->sent,
                  c->out[c->cur ^ 1].len);
    conn_process(s, c);
}

static void handle_park_timeout(struct server *s, struct conn *c, uint16_t seq)
{
    if (seq != c->park_seq)
        return; /* the timer of an earlier park, removed after its answer */
    c->park_timer = 0;
    if (c->parked && resume_parked(s, c, 1))
        conn_process(s, c);
}

/* The rank table changed: re-check every parked lookup. */
static void handle_wake(struct server *s, int res)
{
    (void)res; /* the counter's value does not matter */
    struct conn *next;
    for (struct conn *c = s->parked; c; c = next) {
        next = c->park_next; /* c may leave the list (and park again at its head) */
        if (resume_parked(s, c, 0))
            conn_process(s, c);
    }
    if (!s->stopping)
        arm_read(s, OP_WAKE, s->wake_fd, &s->wake_buf, sizeof s->wake_buf);
}

static void handle_sweep(struct server *s)
{
    for (unsigned i = 0; i < s->cfg->max_conns; i++) {
        struct conn *c = &s->conns[i];
        if (c->fd >= 0 && !c->closing && c->deadline_ms && s->now_ms >= c->deadline_ms)
            conn_close(s, c, c->lingering ? "linger_timeout"
                             : c->http.phase == HCONN_HEAD ? "header_timeout"
                                                           : "idle_timeout");
    }
    if (!s->accept_armed && !s->accept_waiting && !s->stopping)
        arm_accept(s); /* a re-arm that found no SQE earlier */
    if (!s->stopping)
        arm_sweep(s);
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
        log_event(LOG_INFO, "signal", "name=%s", strsignal((int)s->sig_buf.ssi_signo));
    }
    s->stopping = 1;
}

/* A connection's completion: account for it, then run its handler. */
static void dispatch_conn(struct server *s, enum op op, struct conn *c, int res, uint16_t seq)
{
    c->inflight--;
    if (c->closing) {
        if (c->inflight == 0)
            conn_release(s, c);
        return;
    }
    if (op == OP_RECV)
        handle_recv(s, c, res);
    else if (op == OP_SEND)
        handle_send(s, c, res);
    else
        handle_park_timeout(s, c, seq);
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
    case OP_PARK_TIMEOUT: dispatch_conn(s, op, &s->conns[ud_slot(ud)], res, ud_seq(ud)); break;
    case OP_SWEEP: handle_sweep(s); break;
    case OP_SIGNAL: handle_signal(s, res); break;
    case OP_WAKE: handle_wake(s, res); break;
    }
}

/* Reap every completion there is.  Each CQE is copied and marked seen
 * before its handler runs, so handlers may submit (and the kernel post)
 * freely.  io_uring_peek_cqe() also flushes completions the kernel kept
 * aside when the CQ was full (IORING_FEAT_NODROP): none is lost. */
static void reap(struct server *s)
{
    struct io_uring_cqe *cqe;
    while (io_uring_peek_cqe(&s->ring, &cqe) == 0) {
        uint64_t ud = cqe->user_data;
        int res = cqe->res;
        unsigned flags = cqe->flags;
        io_uring_cqe_seen(&s->ring, cqe);
        dispatch(s, ud, res, flags);
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
 * reap() flushes them. */
static int ring_init(struct server *s)
{
    unsigned cq = pow2_at_least(s->cfg->max_conns * 4 + 64);
    if (cq > CQ_ENTRIES_MAX)
        cq = CQ_ENTRIES_MAX;
    if (cq < 2 * SQ_ENTRIES) /* the kernel wants at least as many CQ as SQ entries */
        cq = 2 * SQ_ENTRIES;
    struct io_uring_params p;
    memset(&p, 0, sizeof p);
    p.flags = IORING_SETUP_CQSIZE | IORING_SETUP_SUBMIT_ALL | IORING_SETUP_SINGLE_ISSUER
              | IORING_SETUP_DEFER_TASKRUN;
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
    s->wake_fd = -1;
    s->now_ms = mono_ms();
    s->conns = calloc(cfg->max_conns, sizeof *s->conns);
    if (!s->conns || routes_create(&s->routes, seg)) {
        log_event(LOG_ERROR, "server_init_failed", "err=\"out of memory\"");
        return -1;
    }
    for (unsigned i = cfg->max_conns; i-- > 0;) {
        s->conns[i].fd = -1;
        s->conns[i].slot = i;
        s->conns[i].next_free = s->free_list;
        s->free_list = &s->conns[i];
    }
    if (rank_watch_start(&s->watch, seg, &s->wake_fd)) {
        log_event(LOG_ERROR, "server_init_failed", "err=\"rank watch: %s\"", strerror(errno));
        return -1;
    }
    return ring_init(s);
}

/* Cancel everything and wait (bounded) for the completions, so no kernel
 * operation still targets our buffers when they are freed. */
static void server_drain(struct server *s)
{
    for (unsigned i = 0; i < s->cfg->max_conns; i++)
        if (s->conns[i].fd >= 0)
            conn_close(s, &s->conns[i], "shutdown");
    struct io_uring_sqe *sqe = op_sqe(s, OP_IGNORE, NULL, 0);
    if (sqe)
        io_uring_prep_cancel64(sqe, 0, IORING_ASYNC_CANCEL_ANY);
    uint64_t deadline = mono_ms() + SHUTDOWN_WAIT_MS;
    while (s->pending > 0 && mono_ms() < deadline) {
        struct __kernel_timespec ts = ms_ts(100);
        struct io_uring_cqe *cqe;
        io_uring_submit_and_wait_timeout(&s->ring, &cqe, 1, &ts, NULL);
        reap(s);
    }
    if (s->pending)
        log_event(LOG_WARN, "shutdown_incomplete", "pending=%llu",
                  (unsigned long long)s->pending);
}

static void server_free(struct server *s)
{
    if (s->ring_ok)
        io_uring_queue_exit(&s->ring);
    rank_watch_stop(s->watch);
    for (unsigned i = 0; s->conns && i < s->cfg->max_conns; i++) {
        struct conn *c = &s->conns[i];
        if (c->fd >= 0)
            close(c->fd);
        hconn_free(&c->http);
        route_slot_free(&c->route);
        buf_free(&c->out[0]);
        buf_free(&c->out[1]);
        free(c->rbuf);
    }
    free(s->conns);
    routes_destroy(s->routes);
}

static void loop(struct server *s)
{
    arm_accept(s);
    arm_sweep(s);
    arm_read(s, OP_SIGNAL, s->cfg->signal_fd, &s->sig_buf, sizeof s->sig_buf);
    arm_read(s, OP_WAKE, s->wake_fd, &s->wake_buf, sizeof s->wake_buf);
    while (!s->stopping) {
        int ret = io_uring_submit_and_wait(&s->ring, 1);
        if (ret < 0 && ret != -EINTR && ret != -EAGAIN && ret != -EBUSY && ret != -ETIME) {
            log_event(LOG_ERROR, "ring_wait_failed", "err=\"%s\"", strerror(-ret));
            s->exit_code = 1;
            break;
        }
        s->now_ms = mono_ms();
        reap(s);
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
    log_event(LOG_INFO, "listening", "addr=%s segment=%s max_conns=%u", cfg->listen_addr,
              cfg->segment_name, cfg->max_conns);
    loop(&s);
    s.stopping = 1;
    server_drain(&s);
    server_free(&s);
    log_event(LOG_INFO, "stopped", "status=%d", s.exit_code);
    return s.exit_code;
}
