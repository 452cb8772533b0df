/*
 * http_session.c - kvcoordd's connections: reading requests, answering them
 * in order, sending, long-poll parking, deadlines and closing.  The ring and
 * the loop are http_server.c's; the HTTP parsing is http_conn.c's.
 *
 * A slot is reused only once every SQE naming it has completed
 * (conn->inflight == 0): a late CQE can never land on the next connection in
 * the same slot.  For the same reason a socket is closed only then: a
 * kernel operation never sees its fd number reused.
 *
 * Per connection at most one recv and one send are in flight.  Answers are
 * appended to out[cur] while out[cur ^ 1] is being sent: the buffer under a
 * send is never written or moved (the kernel may read it at any time until
 * the send completes).
 */
#include <errno.h>
#include <stddef.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"
#include "http_resp.h"
#include "http_server_int.h"
#include "log.h"
#include "metrics.h"

#define RBUF_SIZE 16384       /* per-connection receive buffer */
#define OUT_HIGH (256u << 10) /* stop reading requests while this much is unsent */
#define OUT_KEEP (256 * 1024) /* output buffer kept per connection */
#define LINGER_MS 5000        /* reading (and discarding) after a final answer */
#define ZERO_SENDS_MAX 8      /* zero-byte send results in a row before giving up */
#define RECV_POLL 1           /* OP_RECV sequence of the poll before the first recv */
/* A helper thread's answer up to this size is copied into the connection's
 * buffer (cheaper than a piece of its own); a larger one is queued as it
 * is, a shared body. */
#define JOB_COPY_MAX 4096

static void conn_process(struct server *s, struct conn *c);
static void share_leave(struct conn *c);

/* ---- operations ---------------------------------------------------------- */

/* A recv into the connection's buffer.  A connection that has none yet (a
 * slot never used, or one accepted and idle so far) first waits for its
 * first bytes with a poll (RECV_POLL): the buffer is allocated only then,
 * so a burst of idle connections costs no memory and no page faults. */
static void arm_recv(struct server *s, struct conn *c)
{
    struct io_uring_sqe *sqe = op_sqe(s, OP_RECV, c, c->rbuf ? 0 : RECV_POLL);
    if (!sqe) {
        conn_close(s, c, "no_sqe");
        return;
    }
    if (c->rbuf)
        io_uring_prep_recv(sqe, c->fd, c->rbuf + c->rlen, RBUF_SIZE - c->rlen, 0);
    else
        io_uring_prep_poll_add(sqe, c->fd, POLLIN | POLLRDHUP);
    c->recv_armed = 1;
}

/* Send what is left of out[cur ^ 1]: its bytes and the shared bodies
 * queued between them, in one sendmsg (no copy of a shared body). */
static void arm_send(struct server *s, struct conn *c)
{
    const struct buf *b = &c->out[c->cur ^ 1];
    struct io_uring_sqe *sqe = op_sqe(s, OP_SEND, c, 0);
    if (!sqe) {
        conn_close(s, c, "no_sqe");
        return;
    }
    unsigned n = buf_iov(b, c->sent, c->iov, SEND_IOV);
    c->msg = (struct msghdr){.msg_iov = c->iov, .msg_iovlen = n};
    io_uring_prep_sendmsg(sqe, c->fd, &c->msg, MSG_NOSIGNAL);
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
    return buf_total(&c->out[c->cur]) + (buf_total(&c->out[c->cur ^ 1]) - c->sent);
}

/* Answer bytes c holds of its own: both buffers' bytes, the one being sent
 * counted whole until all of it has left (it is freed only then).  The
 * shared bodies it queues are counted once for all connections
 * (shared_body_queued_bytes). */
static size_t out_held(const struct conn *c) { return c->out[0].len + c->out[1].len; }

/* Answer bytes held daemon-wide: the connections' own, and each shared
 * body queued anywhere once. */
static size_t answers_held(const struct server *s)
{
    return s->answer_bytes + shared_body_queued_bytes();
}

/* Bring the daemon-wide count of held answer bytes up to date with c. */
static void out_account(struct server *s, struct conn *c)
{
    size_t now = c->fd >= 0 && !c->closing ? out_held(c) : 0;
    s->answer_bytes = s->answer_bytes - c->out_counted + now;
    c->out_counted = now;
    if (s->metrics)
        metrics_answers(s->metrics, answers_held(s), s->cfg->max_answer_bytes);
}

/* Unsent bytes up to which c's next request is read and answered: the
 * per-connection bound, or, while all connections together are over the
 * answer budget, none at all (a client that does not read gets nothing
 * more made for it; one that does is served as before). */
static size_t out_limit(const struct server *s)
{
    size_t max = s->cfg->max_answer_bytes;
    return max && answers_held(s) >= max ? 1 : OUT_HIGH;
}

/* Tell the routes where the budget stands before they answer c. */
static void answer_room(const struct server *s, struct conn *c)
{
    c->route.answer_used = answers_held(s) - c->out_counted + out_held(c);
    c->route.answer_max = s->cfg->max_answer_bytes;
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
    if (c->park_timer)
        cancel_park_timer(s, c);
}

/* The list of open connections by wait_since_ms (eviction order): c
 * goes to its tail when opened and each time it answers a request. */
static void wait_unlink(struct server *s, struct conn *c)
{
    if (c->wait_prev)
        c->wait_prev->wait_next = c->wait_next;
    else if (s->wait_head == c)
        s->wait_head = c->wait_next;
    if (c->wait_next)
        c->wait_next->wait_prev = c->wait_prev;
    else if (s->wait_tail == c)
        s->wait_tail = c->wait_prev;
    c->wait_prev = c->wait_next = NULL;
}

static void wait_touch(struct server *s, struct conn *c)
{
    wait_unlink(s, c);
    c->wait_since_ms = s->now_ms;
    c->wait_prev = s->wait_tail;
    if (s->wait_tail)
        s->wait_tail->wait_next = c;
    else
        s->wait_head = c;
    s->wait_tail = c;
}

/* Give the slot back once nothing in flight names it. */
static void conn_release(struct server *s, struct conn *c)
{
    close(c->fd);
    c->fd = -1;
    out_account(s, c); /* its unsent answers leave the budget */
    if (c->closing)
        s->nclosing--;
    if (s->metrics)
        metrics_conn_close(s->metrics);
    hconn_free(&c->http);
    if (s->metrics) /* its reservation is back in the budget */
        metrics_buffered(s->metrics, s->buffered, s->cfg->max_buffered_bytes);
    route_slot_free(&c->route);
    buf_free(&c->job.out);
    buf_trim(&c->out[0], OUT_KEEP);
    buf_trim(&c->out[1], OUT_KEEP);
    if (peer_capped(s, &c->peer)) /* after hconn_free gave its bytes back */
        peers_put(&s->peers, &c->peer);
    c->peer.valid = 0;
    c->next_free = s->free_list;
    s->free_list = c;
    s->nconns--;
}

/* Abortive close: cancel what is in flight, release the slot when the last
 * completion arrives.  Safe to call twice. */
void conn_close(struct server *s, struct conn *c, const char *why)
{
    if (c->closing)
        return;
    c->closing = 1;
    s->nclosing++;
    wait_unlink(s, c);
    share_leave(c);
    out_account(s, c);
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
static void reject_busy(struct server *s, int fd, const struct peer_addr *peer)
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
    if (peer_capped(s, peer))
        peers_put(&s->peers, peer);
    if (s->metrics)
        metrics_conn_refused(s->metrics);
    if (!s->stopping && s->now_ms - s->cap_logged_ms >= 1000) { /* a line a second at most */
        log_event(LOG_WARN, "connection_cap", "max_conns=%u", s->cfg->max_conns);
        s->cap_logged_ms = s->now_ms;
    }
}

int peer_capped(const struct server *s, const struct peer_addr *peer)
{
    return s->cfg->max_conns_per_peer && peer->valid &&
           (!peer->loopback || s->cfg->peer_cap_loopback);
}

/* 503 for a connection whose peer holds --max-conns-per-peer already,
 * written directly (non-blocking), with a line a second at most naming
 * the peer. */
static void reject_peer(struct server *s, int fd, const struct peer_addr *peer)
{
    static const char busy[] = "HTTP/1.1 503 Service Unavailable\r\n"
                               "Content-Type: application/json\r\n"
                               "Content-Length: 50\r\n"
                               "Retry-After: 1\r\n"
                               "Connection: close\r\n\r\n"
                               "{\"detail\":\"Too many connections from this address\"}";
    ssize_t n = send(fd, busy, sizeof busy - 1, MSG_DONTWAIT | MSG_NOSIGNAL);
    (void)n;
    shutdown(fd, SHUT_WR);
    close(fd);
    s->peer_refused++;
    if (s->metrics)
        metrics_conn_refused(s->metrics);
    if (s->now_ms - s->peer_logged_ms >= 1000) { /* a line a second at most */
        char addr[64];
        log_event(LOG_WARN, "peer_connection_cap",
                  "peer=%s conns=%u max_conns_per_peer=%u refused=%llu note=\"this address "
                  "holds its share of the connection table; its new connections are answered "
                  "503\"",
                  peer_addr_str(peer, addr, sizeof addr), peers_count(&s->peers, peer),
                  s->cfg->max_conns_per_peer,
                  (unsigned long long)(s->peer_refused - s->peer_logged));
        s->peer_logged_ms = s->now_ms;
        s->peer_logged = s->peer_refused;
    }
}

int conn_admit(struct server *s, int fd, struct peer_addr *peer)
{
    memset(peer, 0, sizeof *peer);
    if (!s->cfg->max_conns_per_peer)
        return 1;
    peer_addr_of(fd, peer);
    if (!peer_capped(s, peer) || peers_take(&s->peers, peer, s->cfg->max_conns_per_peer))
        return 1;
    reject_peer(s, fd, peer);
    return 0;
}

void conn_open(struct server *s, int fd, const struct peer_addr *peer)
{
    struct conn *c = s->free_list;
    if (!c || s->stopping) {
        reject_busy(s, fd, peer);
        return;
    }
    s->free_list = c->next_free;
    s->nconns++;
    if (s->metrics)
        metrics_conn_open(s->metrics);
    char *rbuf = c->rbuf;
    struct buf out0 = c->out[0], out1 = c->out[1];
    uint32_t slot = c->slot;
    memset(c, 0, sizeof *c);
    c->slot = slot, c->rbuf = rbuf, c->out[0] = out0, c->out[1] = out1;
    c->fd = fd;
    c->peer = *peer;
    c->accepted_ms = s->now_ms;
    wait_touch(s, c);
    c->req_start_ns = kvc__mono_ns();
    hconn_init(&c->http, &s->limits);
    if (peer_capped(s, peer)) { /* a quarter of the body budget per address */
        c->http.peer_bytes = peers_bytes(&s->peers, peer);
        c->http.peer_max = s->cfg->max_buffered_bytes / 4;
    }
    if (!s->nodelay_inherited) {
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    }
    if (log_enabled(LOG_DEBUG))
        log_event(LOG_DEBUG, "accept", "slot=%u fd=%d conns=%u", c->slot, fd, s->nconns);
    conn_process(s, c);
}

/* ---- requests ----------------------------------------------------------------------- */

/* The request in c->http.req has been answered into out[cur]. */
static void request_done(struct server *s, struct conn *c, int status)
{
    const struct http_req *req = &c->http.req;
    c->served++;
    c->head_pieces = 0;
    wait_touch(s, c);
    if (s->metrics)
        metrics_request(s->metrics, metrics_route_of(req->path, req->path_len), status,
                        kvc__mono_ns() - c->req_start_ns);
    /* A registration may come with a newly attached process: look at the
     * process table now rather than at the next sweep (an epoch compare
     * when nothing changed); and log what it changed. */
    if (req->method == HTTP_PUT || req->method == HTTP_POST || req->method == HTTP_DELETE)
        s->poke_pending = 1; /* after the answer is submitted: loop() */
    if (!req->keep_alive)
        c->close_after_send = 1;
    if (log_enabled(LOG_DEBUG))
        log_event(LOG_DEBUG, "request", "slot=%u method=%s path=\"%.*s\" keep_alive=%d", c->slot,
                  http_method_str((enum http_method)req->method),
                  (int)(req->path_len > 200 ? 200 : req->path_len), req->path, req->keep_alive);
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
    arm_park_timer(s, c);
}

/* Re-check a parked lookup (expired: its wait is over, answer in any
 * case).  Returns 1 when it was answered (the connection then goes on with
 * the requests behind it: the caller runs conn_process), 0 if still parked. */
static int resume_parked(struct server *s, struct conn *c, int expired)
{
    answer_room(s, c);
    c->out[c->cur].status = 0;
    enum route_rc rc = routes_resume(s->routes, &c->route, &c->http.req, &c->out[c->cur], expired);
    if (rc == ROUTE_PARK)
        return 0; /* still absent; the watch keeps waiting */
    unpark(s, c);
    request_done(s, c, c->out[c->cur].status);
    return 1;
}

/* ---- shared renderings (ROUTE_SHARED) ------------------------------------ */

/* What a shared answer's bytes depend on besides the state: the method
 * (HEAD has no body), the version and keep-alive (its Connection line),
 * the path and the query as received. */
static uint32_t share_hash_of(const struct http_req *q)
{
    const char *p;
    size_t n;
    uint32_t h = 2166136261u ^ (uint32_t)q->method ^ ((uint32_t)q->keep_alive << 8) ^
                 ((uint32_t)q->http_minor << 9);
    for (int part = 0; part < 2; part++) {
        p = part ? q->query : (q->raw_path ? q->raw_path : q->path);
        n = part ? q->query_len : (q->raw_path ? q->raw_path_len : q->path_len);
        for (size_t i = 0; p && i < n; i++)
            h = (h ^ (uint8_t)p[i]) * 16777619u;
        h = (h ^ 0xff) * 16777619u;
    }
    return h;
}

static int same_bytes(const char *a, size_t an, const char *b, size_t bn)
{
    return an == bn && (!an || !memcmp(a, b, an));
}

static int same_answer(const struct http_req *a, const struct http_req *b)
{
    return a->method == b->method && a->keep_alive == b->keep_alive &&
           a->http_minor == b->http_minor &&
           same_bytes(
               a->raw_path ? a->raw_path : a->path, a->raw_path ? a->raw_path_len : a->path_len,
               b->raw_path ? b->raw_path : b->path, b->raw_path ? b->raw_path_len : b->path_len) &&
           same_bytes(a->query, a->query_len, b->query, b->query_len);
}

/* c's request (a deferred ROUTE_SHARED one) joins an identical request's
 * job that no thread has begun: its answer is read from the state after
 * both arrived, so it is c's answer too.  Returns 1 when joined (c then
 * waits, deferred, for the leader's job); else c becomes the one later
 * identical requests may join. */
static int share_join(struct server *s, struct conn *c)
{
    uint32_t h = share_hash_of(&c->http.req);
    struct conn **slot = &s->share[h % SHARE_SLOTS];
    struct conn *l = *slot;
    if (l && l != c && l->deferred && !l->closing && l->share_hash == h &&
        same_answer(&l->http.req, &c->http.req) && !worker_job_started(s->worker, &l->job)) {
        c->deferred = 1;
        c->leader = l;
        c->join_next = l->joiners;
        l->joiners = c;
        return 1;
    }
    c->share_hash = h;
    *slot = c;
    return 0;
}

/* c (a joiner) leaves its leader's list: it closes. */
static void share_leave(struct conn *c)
{
    struct conn *l = c->leader;
    if (!l)
        return;
    for (struct conn **p = &l->joiners; *p; p = &(*p)->join_next)
        if (*p == c) {
            *p = c->join_next;
            break;
        }
    c->leader = c->join_next = NULL;
}

/* Hand the request to the helper thread; parsing of this connection stops
 * until it is answered (conns_jobs_done).  The job counts as an operation
 * in flight: the slot, and the request buffers the thread reads, stay until
 * it is done, even if the connection closes meanwhile. */
static void defer(struct server *s, struct conn *c)
{
    c->deferred = 1;
    c->inflight++;
    c->job.req = &c->http.req;
    buf_reset(&c->job.out);
    worker_submit(s->worker, &c->job);
}

static void serve(struct server *s, struct conn *c)
{
    answer_room(s, c);
    c->http.req.fd = c->fd;
    c->out[c->cur].status = 0;
    enum route_rc rc = routes_dispatch(s->routes, &c->route, &c->http.req, &c->out[c->cur]);
    if (rc == ROUTE_DONE) {
        request_done(s, c, c->out[c->cur].status);
        return;
    }
    if (rc == ROUTE_DEFER) {
        if (!c->route.shared || !share_join(s, c))
            defer(s, c);
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
    resp_detail(&c->out[c->cur], &closing, c->http.err_status, c->http.err_detail,
                c->http.err_extra);
    c->close_after_send = 1;
    if (s->metrics) /* the route once the target is known (a 401 or 503 from the head) */
        metrics_request(s->metrics,
                        c->http.split ? metrics_route_of(c->http.req.path, c->http.req.path_len)
                                      : MR_OTHER,
                        c->http.err_status, kvc__mono_ns() - c->req_start_ns);
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
    if (c->parked || c->deferred) {
        c->deadline_ms = 0; /* bounded by the park timer, or the helper's work */
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
    if (c->http.phase == HCONN_BODY && cfg->body_timeout_ms) {
        /* A trickled body: the whole of it must arrive within the body
         * timeout of its head, however slowly it drips in. */
        if (!c->body_start_ms)
            c->body_start_ms = s->now_ms;
        uint64_t idle = s->now_ms + cfg->idle_timeout_ms;
        uint64_t whole = c->body_start_ms + cfg->body_timeout_ms;
        c->deadline_ms = idle < whole ? idle : whole;
        return;
    }
    c->body_start_ms = 0;
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
    if (c->sent < buf_total(sending)) {
        arm_send(s, c); /* the rest of a short send */
        return;
    }
    buf_trim(sending, OUT_KEEP);
    c->sent = 0;
    struct buf *filled = &c->out[c->cur];
    if (filled->oom) {
        conn_close(s, c, "out_of_memory");
    } else if (buf_total(filled)) {
        c->cur ^= 1; /* what was filled is sent; the other buffer takes new answers */
        arm_send(s, c);
    } else if (c->close_after_send && !c->parked && !c->deferred) {
        finish(s, c);
    }
}

static int may_read(const struct server *s, const struct conn *c)
{
    return !c->recv_armed && !c->parked && !c->deferred && !c->closing && !c->close_after_send &&
           !c->peer_eof && c->roff == c->rlen && out_pending(c) < out_limit(s);
}

/* Parse what was received and answer complete requests, in order, until
 * the input runs out or something stops it (a park, a close, a full output
 * queue); then send, and read more when there is room. */
static void conn_process(struct server *s, struct conn *c)
{
    while (!c->parked && !c->deferred && !c->closing && !c->close_after_send && c->roff < c->rlen &&
           out_pending(c) < out_limit(s)) {
        size_t used;
        int between = c->http.phase == HCONN_IDLE;
        enum hconn_event ev = hconn_parse(&c->http, c->rbuf + c->roff, c->rlen - c->roff, &used);
        c->roff += (uint32_t)used;
        if (between && used) { /* the first bytes of a request: its latency starts */
            c->req_start_ns = kvc__mono_ns();
            /* and its own head and body deadlines: never the previous
             * request's, which update_deadline may not have cleared (it
             * was deferred, parked, or ended in this same pass) */
            c->head_start_ms = s->now_ms;
            c->body_start_ms = 0;
        }
        if (ev == HCONN_REQUEST)
            serve(s, c);
        else if (ev == HCONN_CONTINUE)
            resp_continue(&c->out[c->cur]);
        else if (ev == HCONN_ERROR)
            answer_error(s, c);
    }
    if (s->metrics)
        metrics_buffered(s->metrics, s->buffered, s->cfg->max_buffered_bytes);
    if (c->closing)
        return;
    if (c->roff == c->rlen)
        c->roff = c->rlen = 0;
    update_deadline(s, c);
    flush(s, c);
    out_account(s, c);
    if (!c->closing && may_read(s, c))
        arm_recv(s, c);
}

/* ---- completions -------------------------------------------------------- */

static void handle_recv(struct server *s, struct conn *c, int res, uint16_t seq)
{
    c->recv_armed = 0;
    if (seq == RECV_POLL && res >= 0) { /* readable (or closed): now a buffer */
        if (!c->rbuf && !(c->rbuf = malloc(RBUF_SIZE))) {
            conn_close(s, c, "out_of_memory");
            return;
        }
        arm_recv(s, c);
        return;
    }
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
    if (res > 0 && c->http.phase == HCONN_HEAD && c->head_pieces < HEAD_PIECES_SLOW)
        c->head_pieces++; /* more of a head already begun */
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
    if (c->sent < buf_total(&c->out[c->cur ^ 1]) && log_enabled(LOG_DEBUG))
        log_event(LOG_DEBUG, "send_partial", "slot=%u sent=%zu of=%zu", c->slot, c->sent,
                  buf_total(&c->out[c->cur ^ 1]));
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

/* A connection's completion: account for it, then run its handler. */
void conn_complete(struct server *s, enum op op, struct conn *c, int res, uint16_t seq)
{
    c->inflight--;
    if (c->closing) {
        if (c->inflight == 0)
            conn_release(s, c);
        return;
    }
    if (op == OP_RECV)
        handle_recv(s, c, res, seq);
    else if (op == OP_SEND)
        handle_send(s, c, res);
    else
        handle_park_timeout(s, c, seq);
}

/* The rank table changed: re-check every parked lookup. */
void conns_wake(struct server *s)
{
    struct conn *next;
    for (struct conn *c = s->parked; c; c = next) {
        next = c->park_next; /* c may leave the list (and park again at its head) */
        if (resume_parked(s, c, 0))
            conn_process(s, c);
    }
}

void conns_sweep(struct server *s)
{
    for (unsigned i = 0; i < s->cfg->max_conns; i++) {
        struct conn *c = &s->conns[i];
        if (c->fd >= 0 && !c->closing && c->deadline_ms && s->now_ms >= c->deadline_ms)
            conn_close(s, c,
                       c->lingering                  ? "linger_timeout"
                       : c->http.phase == HCONN_HEAD ? "header_timeout"
                       : c->http.phase == HCONN_BODY ? "body_timeout"
                                                     : "idle_timeout");
    }
}

/* Evictable at the cap: a connection that is not working on anything
 * (no complete request being answered, parked or deferred, nothing left
 * to send) and has waited CONN_EVICT_AFTER_MS or more for its next request -
 * an idle keep-alive, or one whose request is still incomplete: its head,
 * or the body of an unauthenticated peer's request (with a token
 * configured, http_conn.h).  An authenticated body is never cut. */
static int evictable(const struct server *s, const struct conn *c)
{
    return c->fd >= 0 && !c->closing && !c->parked && !c->deferred && !c->lingering &&
           !c->close_after_send && (c->http.phase != HCONN_BODY || c->http.untrusted) &&
           !out_pending(c) && s->now_ms - c->wait_since_ms >= CONN_EVICT_AFTER_MS;
}

unsigned conns_evict(struct server *s, unsigned want)
{
    unsigned n = 0;
    struct conn *next;
    for (struct conn *c = s->wait_head; c && n < want; c = next) {
        next = c->wait_next;
        if (s->now_ms - c->wait_since_ms < CONN_EVICT_AFTER_MS)
            break; /* the rest waited less */
        if (evictable(s, c)) {
            conn_close(s, c,
                       c->http.phase == HCONN_HEAD   ? "evicted_incomplete"
                       : c->http.phase == HCONN_BODY ? "evicted_untrusted_body"
                                                     : "evicted_idle");
            n++;
        }
    }
    s->evicted += n;
    if (n && s->metrics)
        metrics_conn_evicted(s->metrics, n);
    if (n && s->now_ms - s->evict_logged_ms >= 1000) { /* a line a second at most */
        log_event(LOG_WARN, "connection_cap_evict",
                  "max_conns=%u evicted=%llu note=\"closed connections that waited %d ms or "
                  "more for a request, to serve new ones\"",
                  s->cfg->max_conns, (unsigned long long)(s->evicted - s->evict_logged),
                  CONN_EVICT_AFTER_MS);
        s->evict_logged_ms = s->now_ms;
        s->evict_logged = s->evicted;
    }
    return n;
}

/* Append the helper thread's answers and go on with each connection. */
/* Queue a helper thread's answer (its buffer, status) in c's output:
 * copied when small, else the shared body b (made once for all). */
static void queue_answer(struct conn *c, const struct buf *job_out, struct shared_body *b)
{
    if (b)
        buf_attach(&c->out[c->cur], b);
    else if (job_out->oom || job_out->len > JOB_COPY_MAX) /* out of memory */
        c->out[c->cur].oom = 1;
    else
        buf_append(&c->out[c->cur], job_out->p, job_out->len);
}

/* Append the helper thread's answers and go on with each connection; the
 * requests that joined one (share_join) get the same bytes. */
void conns_jobs_done(struct server *s)
{
    struct worker_job *job = worker_take_done(s->worker), *next;
    for (; job; job = next) {
        next = job->next;
        struct conn *c = (struct conn *)((char *)job - offsetof(struct conn, job));
        c->inflight--;
        c->deferred = 0;
        if (s->share[c->share_hash % SHARE_SLOTS] == c)
            s->share[c->share_hash % SHARE_SLOTS] = NULL;
        int status = job->out.status; /* set where the answer was made */
        /* A large answer, or one several connections send, becomes a
         * shared body: the helper's bytes are never copied again. */
        struct shared_body *b = NULL;
        if (!job->out.oom && (job->out.len > JOB_COPY_MAX || c->joiners))
            b = shared_body_take(&job->out);
        struct conn *j = c->joiners;
        c->joiners = NULL;
        while (j) {
            struct conn *jn = j->join_next;
            j->leader = j->join_next = NULL;
            j->deferred = 0;
            s->shared_answers++;
            queue_answer(j, &job->out, b);
            request_done(s, j, status);
            conn_process(s, j);
            j = jn;
        }
        if (c->closing) {
            shared_body_unref(b);
            buf_trim(&job->out, 4096);
            if (c->inflight == 0)
                conn_release(s, c);
            continue;
        }
        queue_answer(c, &job->out, b);
        shared_body_unref(b);
        buf_trim(&job->out, 4096);
        request_done(s, c, status);
        conn_process(s, c);
    }
}

unsigned conns_stop_parked(struct server *s)
{
    unsigned n = 0;
    while (s->parked) {
        struct conn *c = s->parked;
        unpark(s, c);
        struct http_req req = c->http.req; /* its version and method; closing */
        req.keep_alive = 0;
        resp_detail(&c->out[c->cur], &req, 503, "kvcoordd is stopping", NULL);
        request_done(s, c, 503);
        c->close_after_send = 1;
        c->stop_answered = 1;
        flush(s, c);
        out_account(s, c);
        n++;
    }
    return n;
}

int conns_stop_sending(const struct server *s)
{
    for (unsigned i = 0; i < s->cfg->max_conns; i++) {
        const struct conn *c = &s->conns[i];
        if (c->fd >= 0 && c->stop_answered && !c->closing && !c->lingering)
            return 1;
    }
    return 0;
}
