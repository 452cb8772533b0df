/*
 * xfer_conn.c - the connection layer both backends ride on (xfer_conn.h):
 * the connection table, control frames and the send queue, the handshake's
 * state changes, a connection's failure, close and free, and deadlines.
 * The socket operations are the tcp backend's (e->net, xfer_tcp.c); the
 * receive path is xfer_rx.c.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include "xfer_cma.h"
#include "xfer_conn.h"

/* ---- the connection table ------------------------------------------------------- */

kvt__conn *kvt__conn_new(kvt_engine *e, int fd, bool client)
{
    uint32_t id = 0;
    while (id < e->nconns_cap && e->conns[id])
        id++;
    if (id == e->nconns_cap) {
        uint32_t cap = e->nconns_cap ? e->nconns_cap * 2 : 64;
        kvt__conn **n = realloc(e->conns, cap * sizeof *n);
        if (!n)
            return NULL;
        memset(n + e->nconns_cap, 0, (cap - e->nconns_cap) * sizeof *n);
        e->conns = n;
        e->nconns_cap = cap;
    }
    kvt__conn *c = calloc(1, sizeof *c);
    if (!c || !(c->rbuf = malloc(KVT_RBUF))) {
        free(c);
        return NULL;
    }
    c->id = id;
    c->fd = fd;
    c->pipe_r = c->pipe_w = -1;
    c->cma_pidfd = -1;
    c->client = client;
    c->started_ns = c->progress_ns = kvc__mono_ns();
    e->conns[id] = c;
    return c;
}

void kvt__conn_maybe_free(kvt_engine *e, kvt__conn *c)
{
    if (c->state != CS_CLOSING || c->ops > 0)
        return;
    /* Every SQE of c has completed: the kernel no longer reads our iovecs
     * or writes into rbuf / region memory. */
    e->net->forget(e, c);
    kvt__cma_forget(c);
    close(c->fd);
    e->conns[c->id] = NULL;
    free(c->rbuf);
    free(c);
}

void kvt__conn_close(kvt_engine *e, kvt__conn *c)
{
    if (c->state == CS_CLOSING)
        return;
    c->state = CS_CLOSING;
    /* The socket first: it may still reference the pages of writes that
     * are released below (xfer_tcp.c, "sending large payloads"). */
    e->net->close(e, c);
    if (c->peer) {
        for (uint32_t i = 0; i < e->o.conns_per_peer; i++)
            if (c->peer->conns[i] == c)
                c->peer->conns[i] = NULL;
    }
    if (c->rpeer && c->rpeer->conns)
        c->rpeer->conns--;
    e->rdma->conn_closed(e, c);
    if (c->rstate == RS_PAYLOAD && c->dreg)
        c->dreg->busy--;
    if (c->rstate == RS_WDATA)
        kvt__rx_wv_release(e, c);
    c->dreg = NULL;
    while (c->q_head) {
        kvt__wr *w = c->q_head;
        c->q_head = w->next;
        w->in_q = 0;
        kvt__wr_release(e, w);
    }
    c->q_tail = NULL;
    while (c->f_head) {
        kvt__wr *w = c->f_head;
        c->f_head = w->next;
        w->in_fifo = 0;
        kvt__wr_release(e, w); /* one still in the batch waits for its CQE */
    }
    c->f_tail = NULL;
    kvt__read_conn_closed(e, c);
    if (c->rpeer) { /* freed with its last connection */
        kvt__rpeer *rp = c->rpeer;
        c->rpeer = NULL;
        kvt__rx_rpeer_closed(e, rp);
    }
}

void kvt__conn_fail(kvt_engine *e, kvt__conn *c, int32_t code, const char *op, const char *what)
{
    if (c->state == CS_CLOSING)
        return;
    e->st.conns_failed++;
    if (c->client) {
        kvt__peer_fail(e, c->peer, code, "%s to peer %s failed: %s", op, c->peer->sid, what);
    } else {
        char why[KVC_REASON_MAX + 1];
        kvt__str(why, sizeof why, "%s from peer %s failed: %s", op,
                 c->rpeer ? c->rpeer->sid : "(before handshake)", what);
        if (c->rpeer)
            kvt__rx_fail_rpeer_rooms(e, c->rpeer, code, why);
        kvt__log(e, KVT_LOG_WARN, "%s", why);
        kvt__conn_close(e, c);
    }
}

/* ---- frames to send ----------------------------------------------------------------- */

kvt__wr *kvt__ctl_wr(uint8_t type, uint64_t seq, uint64_t room, uint64_t addr, int32_t status,
                     const void *payload, uint32_t plen)
{
    kvt__wr *w = calloc(1, sizeof *w + plen);
    if (!w)
        return NULL;
    if (plen)
        memcpy(w->owned, payload, plen);
    w->payload = w->owned;
    w->plen = plen;
    kvt__frame f = {
        .type = type, .len = plen, .status = status, .seq = seq, .room = room, .addr = addr};
    kvt__frame_encode(&f, w->hdr);
    return w;
}

void kvt__conn_enqueue(kvt__conn *c, kvt__wr *w)
{
    w->in_q = 1;
    w->next = NULL;
    if (c->q_tail)
        c->q_tail->next = w;
    else
        c->q_head = w;
    c->q_tail = w;
}

void kvt__conn_batch_done(kvt_engine *e, kvt__conn *c, bool ok)
{
    /* Hazard: releasing a write may end a room, whose DONE is queued and
     * kicked on this very connection.  Keep `sending` set until the whole
     * batch is released, or that kick would refill c->batch under us. */
    int nb = c->nbatch;
    c->nbatch = 0;
    for (int i = 0; i < nb; i++) {
        kvt__wr *w = c->batch[i];
        kvt__sroom *r = w->room;
        w->in_batch = 0;
        if (w->nsiov && !w->room) /* a READ answer left the queue */
            c->read_out -= w->dlen;
        if (r)
            r->in_kernel--;
        kvt__wr_release(e, w); /* freed here unless still awaiting its ACK */
    }
    c->sending = false;
    /* A failed room's event waits for in_kernel == 0: check them now. */
    if (c->peer)
        for (kvt__sroom *r = c->peer->rooms, *next; r; r = next) {
            next = r->next;
            if (r->failed && !r->finished)
                kvt__sroom_check(e, r);
        }
    if (!ok)
        return;
    if (c->close_after_send && !c->q_head) {
        kvt__conn_close(e, c);
        kvt__conn_maybe_free(e, c);
        return;
    }
    e->net->kick(e, c);
    if (c->peer && !c->sending)
        kvt__peer_pump(e, c->peer);
}

/* ---- the handshake ------------------------------------------------------------------- */

void kvt__conn_hello(kvt_engine *e, kvt__conn *c, uint8_t type)
{
    kvt__hello h;
    memset(&h, 0, sizeof h);
    h.version = KVT_PROTOCOL_VERSION;
    h.generation = e->generation;
    /* The same-host copy: offered by a client whose engine has it on, and
     * by a server to a client that offered it (kvt__cma_on_hello). */
    if (type == KVT_F_HELLO ? e->cma_on : c->cma_offer)
        h.flags |= KVT_HELLO_F_CMA;
    kvt__str(h.session_id, sizeof h.session_id, "%s", e->sid);
    if (e->token && type == KVT_F_HELLO)
        kvt__str(h.token, sizeof h.token, "%s", e->token);
    uint8_t buf[16 + 4 + 2 * KVT_HELLO_STR_MAX];
    size_t n = kvt__hello_encode(&h, buf, sizeof buf);
    kvt__wr *w = kvt__ctl_wr(type, 0, 0, 0, 0, buf, (uint32_t)n);
    if (w) {
        kvt__conn_enqueue(c, w);
        e->net->kick(e, c);
    }
}

void kvt__conn_accepted(kvt_engine *e, kvt__conn *c)
{
    c->state = CS_HELLO; /* until the peer's HELLO, under connect_timeout */
    kvt__rx_arm(e, c);
}

void kvt__conn_connected(kvt_engine *e, kvt__conn *c, int res)
{
    if (c->state == CS_CLOSING)
        return;
    if (res < 0) {
        kvt__peer_fail(e, c->peer, -res, "connect to %s: %s", c->peer->sid, strerror(-res));
        return;
    }
    c->state = CS_HELLO;
    c->progress_ns = kvc__mono_ns();
    kvt__conn_hello(e, c, KVT_F_HELLO);
    kvt__rx_arm(e, c);
}

/* ---- completions ---------------------------------------------------------------------- */

void kvt__conn_cqe(kvt_engine *e, struct io_uring_cqe *cqe)
{
    if (KVT_UD_OP(cqe->user_data) != KVT_OP_RECV) {
        e->net->cqe(e, cqe);
        return;
    }
    uint32_t id = KVT_UD_ID(cqe->user_data);
    kvt__conn *c = id < e->nconns_cap ? e->conns[id] : NULL;
    if (c) /* always: a conn is freed only after its last CQE */
        kvt__rx_cqe(e, c, cqe->res, cqe->flags);
}

/* ---- deadlines ------------------------------------------------------------------------ */

static bool conn_busy(const kvt__conn *c)
{
    if (c->state == CS_CONNECTING || c->state == CS_HELLO)
        return true;
    if (c->state != CS_UP)
        return false;
    if (c->sending || c->q_head || c->f_head || c->rf_head || c->done_waits || c->qp_wait)
        return true;
    return !c->client && (c->rstate != RS_HDR || c->rlen > c->rpos);
}

bool kvt__conn_has_deadlines(kvt_engine *e)
{
    for (uint32_t i = 0; i < e->nconns_cap; i++)
        if (e->conns[i] && conn_busy(e->conns[i]))
            return true;
    return false;
}

/* A recv waiting under SO_RCVLOWAT (kvt__rx_arm) completes only once that
 * many bytes are queued: a sender slower than that per io_timeout_ms is
 * still progressing if the socket's queue grew since the last look. */
static bool lowat_progress(kvt__conn *c, uint64_t now)
{
    int q = 0;
    if (!c->lowat || ioctl(c->fd, FIONREAD, &q) || q <= 0 || q == c->inq_seen)
        return false;
    c->inq_seen = q;
    c->progress_ns = now;
    return true;
}

void kvt__conn_deadlines(kvt_engine *e, uint64_t now)
{
    for (uint32_t i = 0; i < e->nconns_cap; i++) {
        kvt__conn *c = e->conns[i];
        if (!c)
            continue;
        if (c->state == CS_CLOSING) {
            if (c->want_close && !c->ops)
                kvt__conn_maybe_free(e, c);
            continue;
        }
        if (!conn_busy(c)) {
            c->progress_ns = now;
            continue;
        }
        char what[128];
        if (c->state != CS_UP) {
            uint64_t lim = (uint64_t)e->o.connect_timeout_ms * 1000000ull;
            if (now - c->started_ns <= lim)
                continue;
            kvt__str(what, sizeof what, "no handshake within %u ms", e->o.connect_timeout_ms);
            kvt__conn_fail(e, c, ETIMEDOUT, c->state == CS_CONNECTING ? "connect" : "handshake",
                           what);
        } else if (now - c->progress_ns > (uint64_t)e->o.io_timeout_ms * 1000000ull &&
                   !lowat_progress(c, now)) {
            bool rd = c->client && c->rf_head && !c->f_head;
            kvt__str(what, sizeof what, "no progress for %u ms (%s)", e->o.io_timeout_ms,
                     c->client    ? (c->sending ? "send pending"
                                     : rd       ? "waiting for read data"
                                                : "waiting for acknowledgement")
                     : c->sending ? "send pending"
                                  : "frame incomplete");
            kvt__conn_fail(e, c, ETIMEDOUT,
                           c->client    ? (rd ? "read" : "write")
                           : c->sending ? "send"
                                        : "receive",
                           what);
        }
        if (e->conns[i] == c)
            kvt__conn_maybe_free(e, c);
    }
}
