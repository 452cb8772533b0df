/*
 * xfer_tcp.c - the tcp backend: the sockets under the connection layer
 * (xfer_conn.h), on io_uring.  Listen, accept and connect; sending a
 * connection's queued frames (batched sendmsg, short sends resumed, large
 * data payloads by synchronous vmsplice + splice); the socket's part of a
 * close.  It calls the connection layer only (and the engine's
 * utilities): the handshake, the receive path and the deadlines are shared
 * code.
 *
 * One SQE kind per operation (accept, connect, send, a splice's wait,
 * cancel), each with its handler; user_data is encoded with KVT_UD
 * (operation, conn id).
 * A recv's completion never comes here (kvt__conn_cqe sends it to
 * xfer_rx.c).
 */
#include <errno.h>
#include <fcntl.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "xfer_cma.h"
#include "xfer_conn.h"
#include "xfer_tcp.h"

/* A connection on socket fd (xfer_conn.c's table), with TCP_NODELAY:
 * frames are batched here, never held back by Nagle. */
static kvt__conn *tcp_conn(kvt_engine *e, int fd, bool client)
{
    kvt__conn *c = kvt__conn_new(e, fd, client);
    if (!c)
        return NULL;
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return c;
}

/* ---- listen / accept / connect ----------------------------------------------------- */

kvc_err kvt__tcp_listen(kvt_engine *e)
{
    struct sockaddr_storage sa;
    socklen_t len;
    kvc_err err = kvt__resolve(e->o.listen, KVC_HOSTPORT_LISTEN, &sa, &len);
    if (err)
        return err;
    int fd = socket(sa.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return kvt__fail(KVC_E_SYS, "socket: %s", strerror(errno));
    int one = 1, rcvbuf = KVT_SOCK_RCVBUF;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    /* Accepted sockets inherit the receive buffer, and it must be set
     * before the handshake to count in the window scale.  Fixed rather
     * than autotuned: measured on loopback, it saves the receiver recvs
     * and wakeups (docs/transfer.md, Benchmark).  Best effort: the kernel
     * caps it at net.core.rmem_max (and doubles it). */
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof rcvbuf);
    /* A fixed port still held by a predecessor that just died: its
     * io_uring gives the socket back only once the ring is torn down,
     * shortly after the process is gone.  Retried for a bounded time. */
    uint64_t give_up = kvc__mono_ns() + (uint64_t)KVT_BIND_RETRY_MS * 1000000ull;
    int rc;
    while ((rc = bind(fd, (struct sockaddr *)&sa, len)) && errno == EADDRINUSE &&
           kvc__mono_ns() < give_up) {
        const struct timespec pause = {0, KVT_BIND_RETRY_STEP_MS * 1000000l};
        nanosleep(&pause, NULL);
    }
    if (rc || listen(fd, 1024)) {
        int er = errno;
        close(fd);
        if (er == EADDRINUSE)
            return kvt__fail(KVC_E_SYS, "bind/listen %s: %s (still after %d ms of retries)",
                             e->o.listen, strerror(er), KVT_BIND_RETRY_MS);
        return kvt__fail(KVC_E_SYS, "bind/listen %s: %s", e->o.listen, strerror(er));
    }
    len = sizeof sa;
    getsockname(fd, (struct sockaddr *)&sa, &len);
    e->lfd = fd;
    char host[256] = "", *use = NULL;
    if (e->o.advertise_host) {
        kvt__str(host, sizeof host, "%s", e->o.advertise_host);
        use = host;
    } else {
        uint16_t port;
        kvt__split_hostport(e->o.listen, KVC_HOSTPORT_LISTEN, host, sizeof host, &port);
        if (!host[0] || !strcmp(host, "0.0.0.0") || !strcmp(host, "::")) {
            if (kvt__first_address(sa.ss_family, host, sizeof host))
                kvt__str(host, sizeof host, "%s", sa.ss_family == AF_INET6 ? "::1" : "127.0.0.1");
            use = host;
        }
    }
    kvt__format_session(&sa, use, e->sid, sizeof e->sid);
    return KVC_OK;
}

void kvt__tcp_arm_accept(kvt_engine *e)
{
    if (e->lfd < 0 || e->accept_armed)
        return;
    struct io_uring_sqe *s = kvt__sqe(e);
    if (!s)
        return;
    io_uring_prep_accept(s, e->lfd, NULL, NULL, SOCK_CLOEXEC);
    io_uring_sqe_set_data64(s, KVT_UD(KVT_OP_ACCEPT, 0));
    e->accept_armed = true;
}

static void handle_accept(kvt_engine *e, int res)
{
    if (res < 0) {
        /* EMFILE and the like: re-armed on the next progress call, never
         * in a tight loop here. */
        kvt__log(e, KVT_LOG_WARN, "accept: %s", strerror(-res));
        return;
    }
    kvt__conn *c = tcp_conn(e, res, false);
    if (!c) {
        close(res);
        kvt__log(e, KVT_LOG_ERROR, "out of memory accepting a connection");
        return;
    }
    kvt__conn_accepted(e, c);
    kvt__tcp_arm_accept(e);
}

kvc_err kvt__tcp_connect(kvt_engine *e, kvt_peer *p, uint32_t slot)
{
    int fd = socket(p->sa.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return kvt__fail(KVC_E_SYS, "socket: %s", strerror(errno));
    /* The client receives READ data: the same fixed receive buffer as an
     * accepted socket (kvt__tcp_listen), set before connect so that it
     * counts in the window scale.  Best effort. */
    int rcvbuf = KVT_SOCK_RCVBUF;
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof rcvbuf);
    kvt__conn *c = tcp_conn(e, fd, true);
    if (!c) {
        close(fd);
        return kvt__fail(KVC_E_SYS, "out of memory for a connection");
    }
    c->peer = p;
    c->state = CS_CONNECTING;
    c->sa = p->sa;
    c->salen = p->salen;
    p->conns[slot] = c;
    struct io_uring_sqe *s = kvt__sqe(e);
    if (!s)
        return kvt__ring_check(e);
    io_uring_prep_connect(s, fd, (struct sockaddr *)&c->sa, c->salen);
    io_uring_sqe_set_data64(s, KVT_UD(KVT_OP_CONNECT, c->id));
    c->ops++;
    return KVC_OK;
}

/* ---- sending ----------------------------------------------------------------------- */

/* Large payloads by vmsplice + splice.
 *
 * A data payload of at least o.tcp_splice_min bytes is not copied into the
 * socket: vmsplice() puts references to its pages, at most the pipe's size
 * at a time, into the connection's pipe, and splice() moves them from the
 * pipe to the socket.  Both are synchronous calls in this thread, and
 * nonblocking (the socket is made O_NONBLOCK when its pipe is created):
 * the sender does the work itself, in the engine's thread, as it does for
 * sendmsg.  (IORING_OP_SPLICE was used first: io_uring always runs a
 * splice in an io-wq worker as a blocking call, a third thread to wake per
 * chunk, which cost more than the copy it saved; docs/transfer.md,
 * "Splice".)  When the socket is full, an IORING_OP_POLL_ADD for POLLOUT
 * resumes the payload; a splice error is reported through an
 * IORING_OP_NOP's completion, so that it is handled where a failed send
 * is.  Headers and small payloads in front of it go by sendmsg; one
 * operation in flight per connection stays the rule (kvt__tcp_kick).
 *
 * Page lifetime: the pipe and then the socket's skbs reference the
 * caller's pages, which may change under them (no SPLICE_F_GIFT: the pages
 * stay the caller's).  That is safe because the caller may reuse a source
 * only after the room's event, and a room succeeds only on the receiver's
 * DONE_ACK (kvt__sroom_done_ack), which the receiver sends once it has
 * applied, i.e. copied out of the stream, every write of the room; so every
 * byte has left the sender's pages first.  A failed room's event waits for
 * in_kernel == 0, i.e. the release of the batch in flight
 * (kvt__conn_batch_done).
 * A connection that fails closes its pipe before that release, dropping the
 * references in it (no byte not yet handed to the socket is sent after the
 * event), and kvt__tcp_close (the socket's part of kvt__conn_close) aborts a socket that may still hold references
 * (RST, its send queue purged).  Bytes a loopback peer has already queued
 * for reading still point at the pages; its room fails with the
 * connection. */

#define KVT_SPLICE_PIPE (1u << 20) /* wanted pipe size, capped by fs/pipe-max-size */

static void pipe_close(kvt__conn *c)
{
    if (c->pipe_w >= 0) {
        close(c->pipe_w);
        close(c->pipe_r);
    }
    c->pipe_r = c->pipe_w = -1;
    c->pipe_fill = 0;
}

static uint32_t pipe_max_size(void)
{
    FILE *f = fopen("/proc/sys/fs/pipe-max-size", "re");
    unsigned long v = 0;
    if (f) {
        if (fscanf(f, "%lu", &v) != 1)
            v = 0;
        fclose(f);
    }
    return v && v < KVT_SPLICE_PIPE ? (uint32_t)v : KVT_SPLICE_PIPE;
}

/* c's pipe, created on first use.  false: none to be had (the connection
 * sends by sendmsg only; not an error). */
static bool pipe_get(kvt_engine *e, kvt__conn *c)
{
    if (c->pipe_w >= 0)
        return true;
    if (c->pipe_failed)
        return false;
    int p[2];
    if (pipe2(p, O_CLOEXEC | O_NONBLOCK)) {
        c->pipe_failed = true;
        kvt__log(e, KVT_LOG_DEBUG, "no pipe for splice (%s): sendmsg only on this connection",
                 strerror(errno));
        return false;
    }
    /* Refused above the user's pipe quota: keep the default size then. */
    int sz = fcntl(p[1], F_SETPIPE_SZ, (int)pipe_max_size());
    if (sz <= 0)
        sz = fcntl(p[1], F_GETPIPE_SZ);
    if (sz <= 0) {
        close(p[0]);
        close(p[1]);
        c->pipe_failed = true;
        return false;
    }
    /* splice(2) to the socket must not block this thread.  io_uring's own
     * sends and recvs on it are unaffected: they wait by poll either way. */
    int fl = fcntl(c->fd, F_GETFL);
    if (fl < 0 || fcntl(c->fd, F_SETFL, fl | O_NONBLOCK)) {
        close(p[0]);
        close(p[1]);
        c->pipe_failed = true;
        return false;
    }
    c->pipe_r = p[0];
    c->pipe_w = p[1];
    c->pipe_cap = (uint32_t)sz;
    return true;
}

/* Wait for the spliced payload to go on: POLLOUT on the socket, or (err)
 * a NOP whose completion reports the splice error. */
static void splice_wait(kvt_engine *e, kvt__conn *c, int err)
{
    struct io_uring_sqe *s = kvt__sqe(e);
    if (!s)
        return;
    if (err)
        io_uring_prep_nop(s);
    else
        io_uring_prep_poll_add(s, c->fd, POLLOUT);
    io_uring_sqe_set_data64(s, KVT_UD(KVT_OP_SPLICE, c->id));
    c->splice_err = err;
    c->ops++;
    c->sending = true;
}

/* Move the spliced payload at iov[iov_at] into the socket as far as the
 * socket takes it now: vmsplice the next chunk into the pipe when it is
 * empty, splice the pipe's contents to the socket, again until the payload
 * is all sent or the socket is full.  1: waiting (splice_wait), 0: the
 * payload is sent, -1: vmsplice failed, the rest of the batch goes by
 * sendmsg (the pipe was empty: nothing is lost). */
static int splice_some_(kvt_engine *e, kvt__conn *c)
{
    struct iovec *v = &c->iov[c->iov_at];
    for (;;) {
        if (!c->pipe_fill) {
            if (!v->iov_len)
                return 0;
            struct iovec chunk = {v->iov_base, v->iov_len < c->pipe_cap ? v->iov_len : c->pipe_cap};
            ssize_t n = vmsplice(c->pipe_w, &chunk, 1, SPLICE_F_NONBLOCK);
            if (n <= 0) {
                kvt__log(e, KVT_LOG_DEBUG, "vmsplice: %s: sendmsg only on this connection",
                         n < 0 ? strerror(errno) : "0 bytes");
                pipe_close(c);
                c->pipe_failed = true;
                memset(c->iov_splice + c->iov_at, 0, (size_t)(c->niov - c->iov_at));
                return -1;
            }
            v->iov_base = (char *)v->iov_base + n;
            v->iov_len -= (size_t)n;
            c->pipe_fill = (uint32_t)n;
            c->spliced = true;
        }
        ssize_t n = splice(c->pipe_r, NULL, c->fd, NULL, c->pipe_fill,
                           SPLICE_F_NONBLOCK | (v->iov_len ? SPLICE_F_MORE : 0));
        if (n > 0 && (size_t)n <= c->pipe_fill) {
            c->pipe_fill -= (uint32_t)n;
            e->st.bytes_spliced += (uint64_t)n;
            c->progress_ns = kvc__mono_ns();
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        splice_wait(e, c, n < 0 && errno == EAGAIN ? 0 : n < 0 ? errno : EPIPE);
        return 1;
    }
}

/* splice_some_ with SIGPIPE held off: splice(2) has no MSG_NOSIGNAL, and
 * the library must not raise a signal (a closed socket gives EPIPE, and
 * the SIGPIPE that came with it, if it was not pending before, is taken
 * back).  The caller's signal mask is restored. */
static int splice_some(kvt_engine *e, kvt__conn *c)
{
    sigset_t pipe_set, old, pending;
    sigemptyset(&pipe_set);
    sigaddset(&pipe_set, SIGPIPE);
    bool masked = pthread_sigmask(SIG_BLOCK, &pipe_set, &old) == 0;
    bool was_pending = masked && !sigpending(&pending) && sigismember(&pending, SIGPIPE);
    int r = splice_some_(e, c);
    if (masked) {
        if (!was_pending && !sigpending(&pending) && sigismember(&pending, SIGPIPE)) {
            const struct timespec zero = {0, 0};
            while (sigtimedwait(&pipe_set, NULL, &zero) < 0 && errno == EINTR) {
            }
        }
        pthread_sigmask(SIG_SETMASK, &old, NULL);
    }
    return r;
}

/* sendmsg of the iovecs from iov_at up to the next spliced payload. */
static void submit_send(kvt_engine *e, kvt__conn *c)
{
    int end = c->iov_at;
    while (end < c->niov && !c->iov_splice[end])
        end++;
    memset(&c->msg, 0, sizeof c->msg);
    c->msg.msg_iov = c->iov + c->iov_at;
    c->msg.msg_iovlen = (size_t)(end - c->iov_at);
    struct io_uring_sqe *s = kvt__sqe(e);
    if (!s)
        return;
    io_uring_prep_sendmsg(s, c->fd, &c->msg, MSG_NOSIGNAL);
    io_uring_sqe_set_data64(s, KVT_UD(KVT_OP_SEND, c->id));
    c->ops++;
    c->sending = true;
}

/* Submit the batch's next operation.  false: the batch is all sent. */
static bool send_next(kvt_engine *e, kvt__conn *c)
{
    while (c->iov_at < c->niov && !c->iov[c->iov_at].iov_len &&
           !(c->iov_splice[c->iov_at] && c->pipe_fill))
        c->iov_at++;
    if (c->iov_at == c->niov)
        return false;
    if (c->iov_splice[c->iov_at]) {
        int r = splice_some(e, c);
        if (r > 0)
            return true;
        if (r == 0) /* sent: on to what follows it */
            return send_next(e, c);
    }
    submit_send(e, c);
    return true;
}

/* Start a send of the queued frames, if none is in flight.
 * Hazard: only one send per connection may be in flight.  Two sendmsg on
 * one stream socket may each be cut short and their bytes interleave,
 * corrupting the framing; so the next batch waits for the previous one
 * to complete entirely (short sends resumed first, in handle_send). */
void kvt__tcp_kick(kvt_engine *e, kvt__conn *c)
{
    if (c->sending || !c->q_head || c->state == CS_CONNECTING || c->state == CS_CLOSING)
        return;
    c->nbatch = c->niov = c->iov_at = 0;
    while (c->q_head && c->nbatch < KVT_BATCH_WRS) {
        kvt__wr *w = c->q_head;
        /* On a same-host connection a data write or read request goes as
         * its CMA frame: a table, no data (xfer_cma.h). */
        const void *cpay = NULL;
        uint32_t cplen = 0;
        bool cma = kvt__cma_frame(c, w, &cpay, &cplen);
        int need = cma ? 2 : 1 + (w->plen ? 1 : 0) + (int)w->nsiov;
        if (c->niov + need > (int)KVT_IOV_MAX)
            break; /* the next batch takes it */
        c->q_head = w->next;
        if (!c->q_head)
            c->q_tail = NULL;
        w->next = NULL;
        w->in_q = 0;
        w->in_batch = 1;
        c->batch[c->nbatch++] = w;
        c->iov_splice[c->niov] = 0;
        c->iov[c->niov++] = (struct iovec){cma ? w->chdr : w->hdr, KVT_HDR_LEN};
        if (cma) {
            c->iov_splice[c->niov] = 0;
            c->iov[c->niov++] = (struct iovec){(void *)cpay, cplen};
        } else if (w->plen) {
            c->iov_splice[c->niov] = w->room && !w->nsiov && !w->rbytes && e->o.tcp_splice_min &&
                                     w->plen >= e->o.tcp_splice_min && pipe_get(e, c);
            c->iov[c->niov++] = (struct iovec){(void *)w->payload, w->plen};
        }
        /* The data of a READ answer or a WRITEV: one iovec per run, straight
         * from the memory (registered regions; the caller's runs). */
        for (uint32_t i = 0; !cma && i < w->nsiov; i++) {
            c->iov_splice[c->niov] = 0;
            c->iov[c->niov++] = w->siov[i];
        }
        if (w->room) {
            /* Data: awaits its ACK in send order (the receiver applies and
             * acknowledges a connection's writes in order).  The ACK may
             * arrive before this send's CQE, so it is queued now. */
            w->room->in_kernel++;
            w->in_fifo = 1;
            kvt__wr **head = w->rbytes ? &c->rf_head : &c->f_head; /* a READ: its data */
            kvt__wr **tail = w->rbytes ? &c->rf_tail : &c->f_tail;
            if (*tail)
                (*tail)->next = w;
            else
                *head = w;
            *tail = w;
        }
    }
    if ((!c->f_head || c->f_head->in_batch) && (!c->rf_head || c->rf_head->in_batch))
        c->progress_ns = kvc__mono_ns(); /* idle until now: the clock starts */
    send_next(e, c);
}

/* Part of the batch went out: submit the rest, or finish the batch and
 * start the next. */
static void send_continue(kvt_engine *e, kvt__conn *c)
{
    c->progress_ns = kvc__mono_ns();
    if (send_next(e, c))
        return;
    kvt__conn_batch_done(e, c, true);
}

/* A send or splice failed, or its connection is closing. */
static void send_failed(kvt_engine *e, kvt__conn *c, int res, const char *op)
{
    /* The pipe's page references go before the batch is released (the
     * release may deliver a failed room's event). */
    pipe_close(c);
    kvt__conn_batch_done(e, c, false);
    if (c->state != CS_CLOSING)
        kvt__conn_fail(e, c, res < 0 ? -res : EPIPE, op, res < 0 ? strerror(-res) : "sent 0 bytes");
    kvt__conn_maybe_free(e, c);
}

static void handle_send(kvt_engine *e, kvt__conn *c, int res)
{
    c->ops--;
    if (c->state == CS_CLOSING || res <= 0) {
        send_failed(e, c, res, "send");
        return;
    }
    size_t n = (size_t)res;
    while (n && c->iov_at < c->niov) {
        struct iovec *v = &c->iov[c->iov_at];
        if (n >= v->iov_len) {
            n -= v->iov_len;
            c->iov_at++;
        } else {
            v->iov_base = (char *)v->iov_base + n;
            v->iov_len -= n;
            n = 0;
        }
    }
    send_continue(e, c); /* a short send resumes the remainder first */
}

/* The spliced payload's wait ended: the socket has room (res: the poll's
 * mask), or the NOP of a splice error. */
static void handle_splice(kvt_engine *e, kvt__conn *c, int res)
{
    c->ops--;
    int err = c->splice_err;
    c->splice_err = 0;
    if (c->state == CS_CLOSING || res < 0 || err) {
        send_failed(e, c, err ? -err : res, "splice");
        return;
    }
    send_continue(e, c);
}

/* ---- closing ---------------------------------------------------------------------- */

/* The socket's part of kvt__conn_close (which has set CS_CLOSING and then
 * releases the queues): drop the pipe, end the operations in flight. */
void kvt__tcp_close(kvt_engine *e, kvt__conn *c)
{
    bool abort_sock = c->spliced && (c->sending || c->f_head);
    pipe_close(c); /* splices are synchronous: no operation reads the pipe */
    /* Wake every pending operation: shutdown() ends blocked recv/send, the
     * cancel covers a connect in progress.  The fd is closed only when the
     * last CQE is in (kvt__conn_maybe_free). */
    shutdown(c->fd, SHUT_RDWR);
    if (abort_sock) {
        /* Spliced bytes the peer has not acknowledged: the send queue may
         * still reference the caller's pages.  Disconnecting (RST) purges
         * it, so they are not sent after the room's failure event. */
        struct sockaddr unspec = {.sa_family = AF_UNSPEC};
        (void)connect(c->fd, &unspec, sizeof unspec);
    }
    if (c->ops) {
        struct io_uring_sqe *s = kvt__sqe(e);
        if (!s) /* shutdown() above ends the operations in flight */
            return;
        io_uring_prep_cancel_fd(s, c->fd, IORING_ASYNC_CANCEL_ALL);
        io_uring_sqe_set_data64(s, KVT_UD(KVT_OP_CANCEL, c->id));
        c->ops++;
    } else {
        c->want_close = true;
    }
}

/* c is being freed (its last SQE is done): its pipe goes. */
static void tcp_forget(kvt_engine *e, kvt__conn *c)
{
    (void)e;
    pipe_close(c);
}

/* ---- CQE dispatch ------------------------------------------------------------------- */

void kvt__tcp_cqe(kvt_engine *e, struct io_uring_cqe *cqe)
{
    int op = KVT_UD_OP(cqe->user_data);
    if (op == KVT_OP_ACCEPT) {
        handle_accept(e, cqe->res);
        return;
    }
    uint32_t id = KVT_UD_ID(cqe->user_data);
    kvt__conn *c = id < e->nconns_cap ? e->conns[id] : NULL;
    if (!c)
        return; /* cannot happen: a conn is freed only after its last CQE */
    switch (op) {
    case KVT_OP_CONNECT:
        c->ops--;
        kvt__conn_connected(e, c, cqe->res);
        break;
    case KVT_OP_SEND: handle_send(e, c, cqe->res); return;
    case KVT_OP_SPLICE: handle_splice(e, c, cqe->res); return;
    case KVT_OP_CANCEL: c->ops--; break;
    }
    kvt__conn_maybe_free(e, c);
}

const struct kvt__net_ops kvt__tcp_net = {
    .listen = kvt__tcp_listen,
    .arm_accept = kvt__tcp_arm_accept,
    .connect = kvt__tcp_connect,
    .cqe = kvt__tcp_cqe,
    .kick = kvt__tcp_kick,
    .close = kvt__tcp_close,
    .forget = tcp_forget,
};
