/*
 * xfer_rx.c - receiving frames on a connection: the recv loop, the frame
 * parser, and the handlers of each frame type on either side.
 *
 * Headers and control payloads arrive in the connection's staging buffer
 * (rbuf).  A WRITE's payload is checked against the registered regions
 * from its header alone, before one payload byte is stored.  Small writes
 * are read many to a recv and copied out of rbuf; on a connection carrying
 * large writes only the header is read into rbuf and the payload is
 * received straight into place (kvt__rx_arm), short recvs resumed.
 * A write is acknowledged only after all of its bytes are in place.
 */
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "xfer_cma.h"
#include "xfer_conn.h"

/* The socket's SO_RCVLOWAT for the recv being armed: want bytes (0: the
 * default, 1).  While a large payload is received in place the poll behind
 * the recv then wakes this thread once a good part of it has arrived, not
 * for every segment: measured on loopback, that halved the receiver's
 * sleeps and cut the CPU per byte of both sides by 10-20% (docs/transfer.md,
 * "SO_RCVLOWAT").  Never more than the payload still to come, so the
 * wake-up always comes (and the kernel caps it at half the receive
 * buffer); best effort: a refusal leaves the default. */
static void rx_lowat(kvt__conn *c, int want)
{
    if (want <= 1)
        want = 0;
    if (c->lowat == want)
        return;
    int v = want ? want : 1;
    if (!setsockopt(c->fd, SOL_SOCKET, SO_RCVLOWAT, &v, sizeof v))
        c->lowat = want;
}

/* The iovecs of a WRITEV's runs still to fill (c->wv from run rd_ent,
 * offset rd_off) into c->rmsg; returns their bytes. */
_Static_assert(offsetof(kvt__read_ent, addr) == 0, "kvt__scatter reads the address at offset 0");

static kvt__scatter wv_scatter(const kvt__conn *c)
{
    return (kvt__scatter){(const uint8_t *)c->wv, sizeof c->wv[0], offsetof(kvt__read_ent, len),
                          c->wv_n};
}

static size_t wv_arm(kvt__conn *c)
{
    kvt__scatter s = wv_scatter(c);
    return kvt__scatter_iov(&s, c->rd_ent, c->rd_off, c->riov, KVT_RIOV, &c->rmsg);
}

/* Arm the connection's one recv.  Three shapes:
 *  - payload of the current WRITE, nothing buffered: straight into the
 *    destination region (already checked against the registered regions
 *    by on_write_header), as much as is left; a short recv is resumed by
 *    the next arm; SO_RCVLOWAT min(left, KVT_RX_LOWAT) (rx_lowat);
 *  - between frames on a connection carrying large writes (c->big): only
 *    the rest of the 40-byte header, into rbuf, so that no payload byte
 *    lands in the staging buffer and has to be copied out again;
 *  - otherwise (small frames, control payloads, skipped bytes, before the
 *    first large write): as much as rbuf holds, so many small frames cost
 *    one recv.
 * Hazard: rbuf is compacted only here, when no recv into it is in flight. */
void kvt__rx_arm(kvt_engine *e, kvt__conn *c)
{
    if (c->recving || c->state == CS_CLOSING)
        return;
    struct io_uring_sqe *s = kvt__sqe(e);
    if (!s)
        return;
    if (c->rstate == RS_PAYLOAD && c->rpos == c->rlen && c->left &&
        (c->big || c->left >= KVT_DIRECT_MIN)) {
        size_t n = c->left > (1u << 30) ? (1u << 30) : (size_t)c->left;
        rx_lowat(c, n > KVT_RX_LOWAT ? (int)KVT_RX_LOWAT : (int)n);
        io_uring_prep_recv(s, c->fd, c->dst, n, 0);
        c->direct = true;
    } else if (c->rstate == RS_WDATA && c->rpos == c->rlen && c->left) {
        /* A WRITEV's data: one recvmsg scattering into every run still to
         * fill (all checked against the regions by on_writev). */
        size_t n = wv_arm(c);
        rx_lowat(c, n > KVT_RX_LOWAT ? (int)KVT_RX_LOWAT : (int)n);
        io_uring_prep_recvmsg(s, c->fd, &c->rmsg, 0);
        c->direct = true;
    } else if (c->rstate == RS_RDATA && c->rpos == c->rlen && c->left &&
               (c->big || c->left >= KVT_DIRECT_MIN)) {
        /* READ data: one recvmsg scattering into every run still to fill
         * (xfer_read.c).  The room is held (in_kernel, pending) until the
         * CQE: the kernel writes into its memory meanwhile. */
        size_t n = kvt__read_arm(c);
        rx_lowat(c, n > KVT_RX_LOWAT ? (int)KVT_RX_LOWAT : (int)n);
        io_uring_prep_recvmsg(s, c->fd, &c->rmsg, 0);
        c->rd_room = c->rd->room;
        c->rd_room->in_kernel++;
        c->rd_room->pending++;
        c->direct = true;
    } else {
        if (c->rpos == c->rlen)
            c->rpos = c->rlen = 0;
        else if (c->rpos > 0) { /* under a header's worth left: move it down */
            memmove(c->rbuf, c->rbuf + c->rpos, c->rlen - c->rpos);
            c->rlen -= c->rpos;
            c->rpos = 0;
        }
        size_t want = KVT_RBUF - c->rlen;
        if (c->big && c->rstate == RS_HDR && c->rlen < KVT_HDR_LEN)
            want = KVT_HDR_LEN - c->rlen; /* header only: the payload goes in place */
        else if (c->big && c->rstate == RS_CTL && c->rpos == c->rlen)
            want = c->cur.len - c->ctl_len; /* a WRITEV's table only: its data follows */
        rx_lowat(c, 0);
        io_uring_prep_recv(s, c->fd, c->rbuf + c->rlen, want, 0);
        c->direct = false;
    }
    io_uring_sqe_set_data64(s, KVT_UD(KVT_OP_RECV, c->id));
    c->ops++;
    c->recving = true;
}

/* Protocol error on input: tell the peer why (ERROR frame), stop reading
 * and close once the ERROR is sent.  Other connections are unaffected. */
static void proto_error(kvt_engine *e, kvt__conn *c, int32_t code, const char *msg)
{
    kvt__rx_proto_error(e, c, code, msg);
}

void kvt__rx_proto_error(kvt_engine *e, kvt__conn *c, int32_t code, const char *msg)
{
    e->st.frames_refused++;
    kvt__log(e, KVT_LOG_WARN, "connection from %s refused: %s",
             c->rpeer  ? c->rpeer->sid
             : c->peer ? c->peer->sid
                       : "(unknown peer)",
             msg);
    if (c->client) {
        kvt__conn_fail(e, c, code, "receive", msg);
        return;
    }
    if (c->rpeer)
        kvt__rx_fail_rpeer_rooms(e, c->rpeer, code, msg);
    kvt__wr *w = kvt__ctl_wr(KVT_F_ERROR, 0, 0, 0, code, msg, (uint32_t)strlen(msg));
    if (w)
        kvt__conn_enqueue(c, w);
    c->close_after_send = true;
    c->rstate = RS_SKIP;
    c->left = UINT64_MAX; /* discard whatever else comes */
    e->net->kick(e, c);
    if (!c->sending)
        kvt__conn_close(e, c);
}

/* ---- receiver rooms -------------------------------------------------------------- */

static kvt__rroom *rroom_get(kvt_engine *e, kvt__rpeer *rp, uint64_t room, bool create)
{
    for (kvt__rroom *r = rp->rooms; r; r = r->next)
        if (r->room == room)
            return r;
    if (!create)
        return NULL;
    if (rp->nrooms >= KVT_RPEER_ROOMS_MAX)
        return NULL;
    kvt__rroom *r = calloc(1, sizeof *r);
    if (!r)
        return NULL;
    r->room = room;
    r->next = rp->rooms;
    rp->rooms = r;
    rp->nrooms++;
    kvt__seg_open(e, room, KVC_ROOM_ROLE_DECODE);
    return r;
}

/* The room a frame on c adds to, opened on first use; NULL after refusing
 * the connection (the sender's cap on open rooms, out of memory). */
static kvt__rroom *rroom_need(kvt_engine *e, kvt__conn *c, uint64_t room)
{
    kvt__rroom *r = rroom_get(e, c->rpeer, room, true);
    if (r)
        return r;
    char msg[256];
    if (c->rpeer->nrooms >= KVT_RPEER_ROOMS_MAX) {
        kvt__str(msg, sizeof msg,
                 "room %llu refused: peer %s has %u rooms open here, the most one sender may",
                 (unsigned long long)room, c->rpeer->sid, c->rpeer->nrooms);
        proto_error(e, c, ENOSPC, msg);
    } else {
        proto_error(e, c, ENOMEM, "out of memory for a room");
    }
    return NULL;
}

static void rroom_remove(kvt__rpeer *rp, kvt__rroom *r)
{
    kvt__rroom **pp = &rp->rooms;
    while (*pp && *pp != r)
        pp = &(*pp)->next;
    if (*pp) {
        *pp = r->next;
        rp->nrooms--;
    }
    free(r);
}

static void rx_event(kvt_engine *e, kvt__rpeer *rp, uint64_t room, uint64_t bytes, int32_t code,
                     const char *why)
{
    kvt_event ev;
    memset(&ev, 0, sizeof ev);
    ev.room = room;
    ev.side = KVT_SIDE_RECEIVER;
    ev.state = why ? KVC_POLL_FAILED : KVC_POLL_SUCCESS;
    ev.code = code;
    ev.bytes = bytes;
    kvt__str(ev.peer, sizeof ev.peer, "%s", rp->sid);
    if (why)
        kvt__str(ev.reason, sizeof ev.reason, "%s", why);
    kvt__push_event(e, &ev);
}

void kvt__rx_fail_rpeer_rooms(kvt_engine *e, kvt__rpeer *rp, int32_t code, const char *why)
{
    while (rp->rooms) {
        kvt__rroom *r = rp->rooms;
        char msg[KVC_REASON_MAX + 1];
        kvt__str(msg, sizeof msg, "room %llu from peer %s: %s", (unsigned long long)r->room,
                 rp->sid, why);
        kvt__seg_fail(e, r->room, code, msg);
        rx_event(e, rp, r->room, r->bytes, code, msg);
        rroom_remove(rp, r);
    }
}

void kvt__rx_rpeer_closed(kvt_engine *e, kvt__rpeer *rp)
{
    if (rp->conns || e->destroying)
        return;    /* the engine's teardown frees every rpeer at its end */
    if (rp->rooms) /* no connection left to finish them on */
        kvt__rx_fail_rpeer_rooms(e, rp, ECONNRESET, "every connection of the sender closed");
    if (rp->vqp) /* verbs: freed when its QP goes (kvt__verbs_rpeer_down) */
        return;
    for (kvt__rpeer **pp = &e->rpeers; *pp; pp = &(*pp)->next)
        if (*pp == rp) {
            *pp = rp->next;
            e->nrpeers--;
            break;
        }
    free(rp);
}

KVT_API kvc_err kvt_room_expect(kvt_engine *e, uint64_t room, uint32_t senders)
{
    KVT_ARG(e);
    if (!senders)
        return kvt__fail(KVC_E_INVAL, "kvt_room_expect: senders must be >= 1");
    if (room > KVC_ROOM_ID_MAX)
        return kvt__fail(KVC_E_INVAL,
                         "kvt_room_expect: room id %llu out of range 0..%llu (2^63 - 1)",
                         (unsigned long long)room, (unsigned long long)KVC_ROOM_ID_MAX);
    for (kvt__expect *x = e->expects; x; x = x->next)
        if (x->room == room) {
            x->senders = senders;
            return KVC_OK;
        }
    kvt__expect *x = calloc(1, sizeof *x);
    if (!x)
        return kvt__fail(KVC_E_SYS, "out of memory");
    x->room = room;
    x->senders = senders;
    x->next = e->expects;
    e->expects = x;
    return KVC_OK;
}

/* One sender ended room r correctly: Success once every expected sender did. */
static void rx_room_done(kvt_engine *e, kvt__rpeer *rp, kvt__rroom *r)
{
    uint64_t bytes = r->bytes;
    for (kvt__expect **pp = &e->expects; *pp; pp = &(*pp)->next) {
        kvt__expect *x = *pp;
        if (x->room != r->room)
            continue;
        x->bytes += r->bytes;
        if (++x->done < x->senders)
            return;
        bytes = x->bytes;
        *pp = x->next;
        free(x);
        break;
    }
    kvt__seg_success(e, r->room);
    rx_event(e, rp, r->room, bytes, 0, NULL);
}

/* ---- frame handlers: server side --------------------------------------------------- */

/* A sender restarted (a handshake with a new generation of its session
 * id): what its old process left here goes.  Its open rooms fail, its
 * connections close (the old process is gone; a connection of its still
 * open here is one whose end was not seen), which frees it. */
static void rpeer_supersede(kvt_engine *e, kvt__rpeer *old, uint64_t generation)
{
    char why[KVC_REASON_MAX + 1];
    kvt__str(why, sizeof why, "peer %s restarted (generation %llu replaces %llu)", old->sid,
             (unsigned long long)generation, (unsigned long long)old->generation);
    kvt__log(e, KVT_LOG_INFO, "%s: closing what its old process left here", why);
    kvt__rx_fail_rpeer_rooms(e, old, ESTALE, why);
    uint32_t left = old->conns;
    for (uint32_t i = 0; left && i < e->nconns_cap; i++) {
        kvt__conn *c = e->conns[i];
        if (c && !c->client && c->state != CS_CLOSING && c->rpeer == old) {
            left--; /* the last close frees old */
            kvt__conn_fail(e, c, ESTALE, "connection", why);
        }
    }
}

/* The sender of handshake h: found, or created.  NULL with msg and *code
 * when refused (a cap, out of memory). */
static kvt__rpeer *rpeer_get(kvt_engine *e, const kvt__hello *h, int32_t *code, char *msg,
                             size_t cap)
{
    kvt__rpeer *old = NULL;
    for (kvt__rpeer *rp = e->rpeers; rp; rp = rp->next) {
        if (strcmp(rp->sid, h->session_id))
            continue;
        if (rp->generation != h->generation) {
            old = rp;
            continue;
        }
        if (rp->conns >= KVT_RPEER_CONNS_MAX) {
            *code = EMFILE;
            kvt__str(msg, cap, "peer %s has %u connections here, the most one sender may", rp->sid,
                     rp->conns);
            return NULL;
        }
        return rp;
    }
    if (old) /* at most one generation per session id is ever kept */
        rpeer_supersede(e, old, h->generation);
    if (e->nrpeers >= KVT_MAX_RPEERS) {
        *code = EUSERS;
        kvt__str(msg, cap, "peer %s refused: %u senders are connected here, the most allowed",
                 h->session_id, e->nrpeers);
        return NULL;
    }
    kvt__rpeer *rp = calloc(1, sizeof *rp);
    if (!rp) {
        *code = ENOMEM;
        kvt__str(msg, cap, "out of memory");
        return NULL;
    }
    kvt__str(rp->sid, sizeof rp->sid, "%s", h->session_id);
    rp->generation = h->generation;
    rp->next = e->rpeers;
    e->rpeers = rp;
    e->nrpeers++;
    return rp;
}

int32_t kvt__rx_hello(const kvt__conn *c, kvt__hello *h, char *msg, size_t cap)
{
    char err[160];
    int bad = kvt__hello_decode((const uint8_t *)c->ctl, c->ctl_len, h, err, sizeof err);
    if (c->ctl_len >= 4 && h->version != KVT_PROTOCOL_VERSION) {
        kvt__str(msg, cap, "incompatible protocol versions %u vs %u (peer vs this engine)",
                 h->version, KVT_PROTOCOL_VERSION);
        return EPROTONOSUPPORT;
    }
    if (bad) {
        kvt__str(msg, cap, "%s", err);
        return EPROTO;
    }
    return 0;
}

static void on_hello(kvt_engine *e, kvt__conn *c)
{
    kvt__hello h;
    char msg[256];
    int32_t code = kvt__rx_hello(c, &h, msg, sizeof msg);
    if (code) {
        proto_error(e, c, code, msg);
        return;
    }
    /* The token: compared in constant time (kvt__token_equal), whatever
     * its length.  Refused before the peer is known (no rpeer, no room):
     * nothing of its is ever written here. */
    if (e->token && !kvt__token_equal(e->token_pad, h.token)) {
        kvt__str(msg, sizeof msg, "unauthorized: peer %s sent %s handshake token", h.session_id,
                 h.token[0] ? "a wrong" : "no");
        proto_error(e, c, EACCES, msg);
        return;
    }
    kvt__rpeer *rp = rpeer_get(e, &h, &code, msg, sizeof msg);
    if (!rp) {
        proto_error(e, c, code, msg);
        return;
    }
    rp->conns++;
    c->rpeer = rp;
    c->state = CS_UP;
    c->cma_offer = (h.flags & KVT_HELLO_F_CMA) && e->cma_on;
    kvt__conn_hello(e, c, KVT_F_HELLO_OK);
}

/* Queue one ACK for every write applied since the last one. */
static void flush_acks(kvt_engine *e, kvt__conn *c)
{
    if (!c->ack_count)
        return;
    kvt__wr *w = kvt__ctl_wr(KVT_F_ACK, c->ack_seq, 0, c->ack_count, 0, NULL, 0);
    if (!w) {
        kvt__conn_fail(e, c, ENOMEM, "acknowledge", "out of memory");
        return;
    }
    c->ack_count = 0;
    c->ack_bytes = 0;
    kvt__conn_enqueue(c, w);
}

/* NACK write c->cur (outside the regions, or its copy failed): status
 * code, reason msg, logged. */
static void nack_write(kvt_engine *e, kvt__conn *c, int32_t code, const char *msg)
{
    e->st.frames_refused++;
    kvt__log(e, KVT_LOG_WARN, "peer %s: %s", c->rpeer->sid, msg);
    flush_acks(e, c); /* keep the ACK/NACK order the sender expects */
    kvt__wr *w =
        kvt__ctl_wr(KVT_F_NACK, c->cur.seq, c->cur.room, 0, code, msg, (uint32_t)strlen(msg));
    if (w)
        kvt__conn_enqueue(c, w);
}

/* NACK write c->cur: its run i (c->wv[i], of a WRITEV or CMA_WRITE) is
 * outside every registered region. */
static void nack_run_outside(kvt_engine *e, kvt__conn *c, uint32_t i)
{
    char msg[240];
    kvt__str(msg, sizeof msg,
             "write of %llu bytes to 0x%llx (run %u of write %llu, room %llu) is outside every "
             "region registered here",
             (unsigned long long)c->wv[i].len, (unsigned long long)c->wv[i].addr, i,
             (unsigned long long)c->cur.seq, (unsigned long long)c->cur.room);
    nack_write(e, c, EFAULT, msg);
}

/* Write c->cur applied (bytes of payload): counted in its room r (NULL:
 * gone) and in the engine's statistics, acknowledged by the next ACK. */
static void write_applied(kvt_engine *e, kvt__conn *c, kvt__rroom *r, uint64_t bytes)
{
    if (r) {
        r->writes++;
        r->bytes += bytes;
    }
    e->st.writes_recv++;
    e->st.bytes_recv += bytes;
    c->ack_seq = c->cur.seq;
    c->ack_count++;
    c->ack_bytes += bytes;
}

static void on_write_header(kvt_engine *e, kvt__conn *c)
{
    kvt__frame *f = &c->cur;
    kvt__region *reg = f->len ? kvt__region_find(e, f->addr, f->len) : NULL;
    if (!reg) {
        char msg[200];
        kvt__str(msg, sizeof msg,
                 "write of %u bytes to 0x%llx (room %llu) is outside every region registered here",
                 f->len, (unsigned long long)f->addr, (unsigned long long)f->room);
        nack_write(e, c, EFAULT, msg);
        c->rstate = RS_SKIP;
        c->left = f->len;
        return;
    }
    if (!rroom_need(e, c, f->room))
        return;
    reg->busy++;
    c->big = f->len >= KVT_DIRECT_MIN; /* sizes the next header's recv (kvt__rx_arm) */
    c->dreg = reg;
    c->dst = (uint8_t *)(uintptr_t)f->addr;
    c->left = f->len;
    c->rstate = RS_PAYLOAD;
}

static void on_write_applied(kvt_engine *e, kvt__conn *c)
{
    c->dreg->busy--;
    c->dreg = NULL;
    write_applied(e, c, rroom_get(e, c->rpeer, c->cur.room, false), c->cur.len);
    c->rstate = RS_HDR;
}

/* WRITEV: every run checked against the registered regions before one
 * byte is stored; one outside refuses the whole frame (NACK, its data
 * skipped), as a WRITE's. */
static void on_writev(kvt_engine *e, kvt__conn *c)
{
    kvt__frame *f = &c->cur;
    uint64_t total = 0;
    char msg[240];
    int n = kvt__read_decode((const uint8_t *)c->ctl, c->ctl_len, KVT_FRAME_MAX, KVT_FRAME_MAX,
                             c->wv, &total, msg, sizeof msg);
    if (n < 0 || total != f->addr) {
        if (n >= 0)
            kvt__str(msg, sizeof msg, "WRITEV announces %llu bytes, its entries %llu",
                     (unsigned long long)f->addr, (unsigned long long)total);
        proto_error(e, c, EPROTO, msg);
        return;
    }
    for (int i = 0; i < n; i++) {
        if (kvt__region_find(e, c->wv[i].addr, c->wv[i].len))
            continue;
        nack_run_outside(e, c, (uint32_t)i);
        c->rstate = RS_SKIP;
        c->left = total;
        return;
    }
    if (!rroom_need(e, c, f->room))
        return;
    for (int i = 0; i < n; i++)
        kvt__region_find(e, c->wv[i].addr, c->wv[i].len)->busy++;
    c->wv_n = (uint32_t)n;
    c->rd_ent = 0;
    c->rd_off = 0;
    c->left = total;
    c->big = true; /* the next header alone (kvt__rx_arm) */
    c->rstate = RS_WDATA;
}

/* n bytes of the WRITEV's data arrived at the current position (copied
 * from src when not NULL); the whole write applied at its last byte. */
static void wv_step(kvt_engine *e, kvt__conn *c, const uint8_t *src, size_t n)
{
    c->left -= n;
    kvt__scatter s = wv_scatter(c);
    kvt__scatter_step(&s, &c->rd_ent, &c->rd_off, src, n);
    if (c->left)
        return;
    kvt__rx_wv_release(e, c);
    write_applied(e, c, rroom_get(e, c->rpeer, c->cur.room, false), c->cur.addr);
    c->rstate = RS_HDR;
}

/* The copy of the CMA_WRITE in c->cur failed with err for a reason of
 * this host's (or failed earlier on c): the sender sends it again through
 * the socket (NACK with KVT_NACK_SOCKET), and c copies no more. */
static void nack_socket(kvt_engine *e, kvt__conn *c, int32_t err, const char *why)
{
    kvt__cma_fell(e, c, err, why);
    char msg[KVC_REASON_MAX + 1];
    kvt__str(msg, sizeof msg,
             "same-host copy off on this connection (%s): send it through the socket",
             strerror(c->cma_err));
    flush_acks(e, c); /* keep the ACK/NACK order the sender expects */
    kvt__wr *w = kvt__ctl_wr(KVT_F_NACK, c->cur.seq, c->cur.room, KVT_NACK_SOCKET, c->cma_err, msg,
                             (uint32_t)strlen(msg));
    if (!w) {
        kvt__conn_fail(e, c, ENOMEM, "receive", "out of memory");
        return;
    }
    kvt__conn_enqueue(c, w);
}

/* CMA_WRITE: the runs checked against the registered regions exactly as
 * a WRITEV's (one outside refuses the whole frame, nothing written), kept
 * busy (deregistering refused) while they are copied from the sender's
 * memory (xfer_cma.c), then applied and acknowledged as a WRITEV. */
static void on_cma_write(kvt_engine *e, kvt__conn *c)
{
    kvt__frame *f = &c->cur;
    uint64_t total = 0;
    char msg[KVC_REASON_MAX + 1];
    uint32_t n = c->ctl_len / KVT_CMA_ENT_LEN;
    if (c->cma != KVT_CMA_ON && c->cma != KVT_CMA_FELL) {
        kvt__rx_proto_error(
            e, c, EPROTO, "same-host write on a connection whose peer is not proven on this host");
        return;
    }
    int k = c->ctl_len % KVT_CMA_ENT_LEN
                ? -1
                : kvt__read_decode((const uint8_t *)c->ctl, (size_t)n * KVT_READ_ENT_LEN,
                                   KVT_FRAME_MAX, KVT_FRAME_MAX, c->wv, &total, msg, sizeof msg);
    if (k < 0 || total != f->addr) {
        if (k >= 0 || c->ctl_len % KVT_CMA_ENT_LEN)
            kvt__str(msg, sizeof msg,
                     "CMA_WRITE of %u bytes announces %llu bytes, its entries %llu", c->ctl_len,
                     (unsigned long long)f->addr, (unsigned long long)total);
        proto_error(e, c, EPROTO, msg);
        return;
    }
    struct iovec local[KVT_READ_ENTS_MAX], remote[KVT_READ_ENTS_MAX];
    const uint8_t *src = (const uint8_t *)c->ctl + (size_t)n * KVT_READ_ENT_LEN;
    for (uint32_t i = 0; i < n; i++) {
        if (!kvt__region_find(e, c->wv[i].addr, c->wv[i].len)) {
            nack_run_outside(e, c, i);
            return;
        }
        local[i] = (struct iovec){(void *)(uintptr_t)c->wv[i].addr, (size_t)c->wv[i].len};
        remote[i] = (struct iovec){(void *)(uintptr_t)kvt__get64(src + (size_t)i * 8),
                                   (size_t)c->wv[i].len};
    }
    kvt__rroom *r = rroom_need(e, c, f->room);
    if (!r)
        return;
    if (c->cma == KVT_CMA_FELL) { /* an earlier copy fell back: the socket */
        nack_socket(e, c, c->cma_err, "");
        return;
    }
    for (uint32_t i = 0; i < n; i++) /* pinned against deregistration for the copy */
        kvt__region_find(e, c->wv[i].addr, c->wv[i].len)->busy++;
    c->wv_n = n;
    int err = kvt__cma_pull(e, c, local, remote, n, msg, sizeof msg);
    kvt__rx_wv_release(e, c);
    if (err && kvt__cma_falls_back(err)) {
        nack_socket(e, c, err, msg);
        return;
    }
    if (err) {
        nack_write(e, c, err, msg);
        return;
    }
    write_applied(e, c, r, total);
}

void kvt__rx_wv_release(kvt_engine *e, kvt__conn *c)
{
    for (uint32_t i = 0; i < c->wv_n; i++) {
        kvt__region *g = kvt__region_find(e, c->wv[i].addr, c->wv[i].len);
        if (g && g->busy)
            g->busy--;
    }
    c->wv_n = 0;
}

static void on_done(kvt_engine *e, kvt__conn *c)
{
    kvt__frame *f = &c->cur;
    kvt__rroom *r = rroom_need(e, c, f->room);
    if (!r)
        return;
    flush_acks(e, c);
    char msg[256] = "";
    int32_t st = 0;
    if (r->writes != f->seq || r->bytes != f->addr) {
        st = EIO;
        kvt__str(msg, sizeof msg,
                 "room %llu: received %llu writes / %llu bytes, sender sent %llu / %llu",
                 (unsigned long long)f->room, (unsigned long long)r->writes,
                 (unsigned long long)r->bytes, (unsigned long long)f->seq,
                 (unsigned long long)f->addr);
        kvt__seg_fail(e, r->room, st, msg);
        rx_event(e, c->rpeer, r->room, r->bytes, st, msg);
    } else {
        rx_room_done(e, c->rpeer, r);
    }
    rroom_remove(c->rpeer, r);
    kvt__wr *w =
        kvt__ctl_wr(KVT_F_DONE_ACK, f->seq, f->room, f->addr, st, msg, (uint32_t)strlen(msg));
    if (w)
        kvt__conn_enqueue(c, w);
}

static void on_abort(kvt_engine *e, kvt__conn *c)
{
    kvt__rroom *r = rroom_get(e, c->rpeer, c->cur.room, false);
    if (!r)
        return;
    char msg[KVC_REASON_MAX + 1];
    kvt__str(msg, sizeof msg, "room %llu aborted by peer %s: %.*s", (unsigned long long)r->room,
             c->rpeer->sid, (int)c->ctl_len, c->ctl);
    kvt__seg_fail(e, r->room, c->cur.status, msg);
    rx_event(e, c->rpeer, r->room, r->bytes, c->cur.status, msg);
    rroom_remove(c->rpeer, r);
}

/* ---- frame handlers: client side ---------------------------------------------------- */

static void on_hello_ok(kvt_engine *e, kvt__conn *c)
{
    kvt__hello h;
    char msg[256];
    int32_t code = kvt__rx_hello(c, &h, msg, sizeof msg);
    if (code) {
        kvt__conn_fail(e, c, code, "handshake", msg);
        return;
    }
    kvt_peer *p = c->peer;
    if (p->generation && h.generation != p->generation) {
        /* The peer restarted at this session_id since its descriptor was
         * imported: its regions are not the ones we know.  Nothing is sent
         * on this connection; the caller fetches the new descriptor. */
        e->st.conns_failed++;
        kvt__peer_fail(e, p, ESTALE,
                       "peer %s restarted (generation %llu, descriptor has %llu): fetch its "
                       "descriptor again",
                       p->sid, (unsigned long long)h.generation, (unsigned long long)p->generation);
        return;
    }
    /* Both offered the same-host copy: negotiate it first (xfer_cma.c),
     * the connection goes up at its end. */
    if (kvt__cma_client_start(e, c, h.flags))
        return;
    kvt__rx_up(e, c);
}

void kvt__rx_up(kvt_engine *e, kvt__conn *c)
{
    c->state = CS_UP;
    c->progress_ns = kvc__mono_ns();
    e->rdma->hello_ok(e, c); /* verbs peer: set up the QP first */
    kvt__peer_pump(e, c->peer);
}

/* QP_INFO: the peer's RC QP record (verbs), either side. */
static void on_qp_info(kvt_engine *e, kvt__conn *c)
{
    kvt__qp_rec r;
    char err[200];
    if (kvt__qp_rec_decode((const uint8_t *)c->ctl, c->ctl_len, &r, err, sizeof err) ||
        e->rdma->qp_info(e, c, &r, err, sizeof err)) {
        char msg[256];
        kvt__str(msg, sizeof msg, "RDMA QP setup: %s", err);
        if (c->client)
            kvt__conn_fail(e, c, EPROTO, "QP setup", msg);
        else
            proto_error(e, c, EPROTO, msg);
    }
}

void kvt__rx_room_notified(kvt_engine *e, kvt__rpeer *rp, uint64_t room, uint64_t writes,
                           uint64_t bytes)
{
    kvt__rroom *r = rroom_get(e, rp, room, true); /* Transferring, then at once: */
    if (!r) {
        kvt__log(e, KVT_LOG_ERROR, "room %llu from %s: %s", (unsigned long long)room, rp->sid,
                 rp->nrooms >= KVT_RPEER_ROOMS_MAX ? "too many rooms open from this sender"
                                                   : "out of memory");
        return;
    }
    r->writes = writes;
    r->bytes = bytes;
    e->st.writes_recv += writes;
    e->st.bytes_recv += bytes;
    rx_room_done(e, rp, r);
    rroom_remove(rp, r);
}

static void on_ack(kvt_engine *e, kvt__conn *c)
{
    uint64_t n = c->cur.addr;
    kvt__wr *last = NULL;
    c->progress_ns = kvc__mono_ns();
    while (n--) {
        kvt__wr *w = c->f_head;
        if (!w) {
            kvt__conn_fail(e, c, EPROTO, "receive", "ACK for more writes than were sent");
            return;
        }
        c->f_head = w->next;
        if (!c->f_head)
            c->f_tail = NULL;
        w->in_fifo = 0;
        uint64_t bytes = kvt__wr_cost(w); /* a WRITE's payload, a WRITEV's data */
        c->unacked_bytes -= bytes;
        w->room->acked_writes++;
        w->room->acked_bytes += bytes;
        c->peer->bytes_sent += bytes;
        e->st.writes_sent++;
        e->st.bytes_sent += bytes;
        last = w;
        if (!n && last->seq != c->cur.seq) {
            kvt__conn_fail(e, c, EPROTO, "receive", "ACK out of order");
            kvt__wr_release(e, w);
            return;
        }
        kvt__wr_release(e, w);
    }
    kvt__peer_pump(e, c->peer);
}

static void on_nack(kvt_engine *e, kvt__conn *c)
{
    kvt__wr *w = c->f_head;
    if (!w || w->seq != c->cur.seq) {
        kvt__conn_fail(e, c, EPROTO, "receive", "NACK out of order");
        return;
    }
    c->f_head = w->next;
    if (!c->f_head)
        c->f_tail = NULL;
    w->in_fifo = 0;
    if (c->cur.addr == KVT_NACK_SOCKET && w->ncma) {
        /* Its copy fell back there: the same write again, as its socket
         * frame (w->hdr), behind what is queued; the connection's data
         * goes through the socket from now on.  Still pending: the room's
         * DONE waits for its ACK. */
        char why[KVC_REASON_MAX + 1];
        kvt__str(why, sizeof why, "peer %s could not copy a write of room %llu: %.*s", c->peer->sid,
                 (unsigned long long)c->cur.room, (int)c->ctl_len, c->ctl);
        kvt__cma_fell(e, c, c->cur.status ? c->cur.status : EPERM, why);
        kvt__conn_enqueue(c, w);
        e->net->kick(e, c);
        return;
    }
    c->unacked_bytes -= kvt__wr_cost(w);
    char why[KVC_REASON_MAX + 1];
    kvt__str(why, sizeof why, "peer %s refused a write of room %llu: %.*s", c->peer->sid,
             (unsigned long long)c->cur.room, (int)c->ctl_len, c->ctl);
    kvt__sroom *r = w->room;
    r->pending++; /* keep r alive across the release */
    kvt__wr_release(e, w);
    kvt__sroom_fail(e, r, c->cur.status ? c->cur.status : EFAULT, why);
    r->pending--;
    kvt__sroom_check(e, r);
    kvt__peer_pump(e, c->peer);
}

static void on_error(kvt_engine *e, kvt__conn *c)
{
    char msg[KVC_REASON_MAX + 1];
    kvt__str(msg, sizeof msg, "peer said: %.*s", (int)c->ctl_len, c->ctl);
    if (c->client)
        kvt__conn_fail(e, c, c->cur.status ? c->cur.status : EPROTO,
                       c->state == CS_HELLO ? "handshake" : "write", msg);
    else
        kvt__conn_fail(e, c, c->cur.status ? c->cur.status : EPROTO, "connection", msg);
}

/* A complete frame (header, and control payload in c->ctl). */
static void on_frame(kvt_engine *e, kvt__conn *c)
{
    uint8_t t = c->cur.type;
    char msg[128];
    if (t == KVT_F_ERROR) {
        on_error(e, c);
        return;
    }
    bool ok =
        c->client
            ? (c->state == CS_HELLO
                   ? (c->cma == KVT_CMA_OFF ? t == KVT_F_HELLO_OK
                                            : t == KVT_F_CMA_HELLO || t == KVT_F_CMA_CHECK)
                   : t == KVT_F_ACK || t == KVT_F_NACK || t == KVT_F_DONE_ACK ||
                         t == KVT_F_QP_INFO || t == KVT_F_READ_NACK || t == KVT_F_CMA_READ_GO)
            : (c->state == CS_HELLO
                   ? t == KVT_F_HELLO || t == KVT_F_DESC_REQ
                   : t == KVT_F_WRITE || t == KVT_F_DONE || t == KVT_F_ABORT ||
                         t == KVT_F_QP_INFO || t == KVT_F_READ || t == KVT_F_WRITEV ||
                         t == KVT_F_CMA_HELLO || t == KVT_F_CMA_CHECK || t == KVT_F_CMA_WRITE ||
                         t == KVT_F_CMA_READ || t == KVT_F_CMA_READ_END);
    if (!ok) {
        kvt__str(msg, sizeof msg, "unexpected frame %s %s", kvt__ftype_name(t),
                 c->state == CS_HELLO ? "before the handshake" : "here");
        proto_error(e, c, EPROTO, msg);
        return;
    }
    switch (t) {
    case KVT_F_HELLO: on_hello(e, c); break;
    case KVT_F_HELLO_OK: on_hello_ok(e, c); break;
    case KVT_F_WRITE: on_write_header(e, c); break;
    case KVT_F_DONE: on_done(e, c); break;
    case KVT_F_ABORT: on_abort(e, c); break;
    case KVT_F_ACK: on_ack(e, c); break;
    case KVT_F_NACK: on_nack(e, c); break;
    case KVT_F_QP_INFO: on_qp_info(e, c); break;
    case KVT_F_READ:
    case KVT_F_CMA_READ: kvt__read_serve(e, c); break;
    case KVT_F_CMA_HELLO: kvt__cma_on_hello(e, c); break;
    case KVT_F_CMA_CHECK: kvt__cma_on_check(e, c); break;
    case KVT_F_CMA_WRITE: on_cma_write(e, c); break;
    case KVT_F_CMA_READ_GO: kvt__read_cma_go(e, c); break;
    case KVT_F_CMA_READ_END: kvt__read_cma_end(e, c); break;
    case KVT_F_WRITEV: on_writev(e, c); break;
    case KVT_F_READ_NACK: kvt__read_nack(e, c); break;
    case KVT_F_DESC_REQ: kvt__desc_serve(e, c); break;
    case KVT_F_DONE_ACK:
        kvt__sroom_done_ack(e, c, c->cur.room, c->cur.status, c->ctl_len ? c->ctl : "");
        break;
    }
}

/* ---- parser -------------------------------------------------------------------------- */

/* Consume what rbuf holds.  Stops at the end of the data, or when the
 * connection starts closing. */
static void rx_parse(kvt_engine *e, kvt__conn *c)
{
    while (c->state != CS_CLOSING && !c->close_after_send) {
        size_t avail = c->rlen - c->rpos;
        uint8_t *p = c->rbuf + c->rpos;
        if (c->rstate == RS_HDR) {
            if (avail < KVT_HDR_LEN)
                return;
            char err[160];
            if (kvt__frame_decode(p, KVT_FRAME_MAX, &c->cur, err, sizeof err)) {
                proto_error(e, c, EPROTO, err);
                return;
            }
            c->rpos += KVT_HDR_LEN;
            c->ctl_len = 0;
            if (c->cur.type == KVT_F_WRITE) {
                if (c->state == CS_UP && !c->client)
                    on_write_header(e, c);
                else
                    on_frame(e, c); /* refused there */
            } else if (c->cur.type == KVT_F_READ_DATA) {
                if (c->state == CS_UP && c->client)
                    kvt__read_data_header(e, c);
                else
                    on_frame(e, c); /* refused there */
            } else if (c->cur.len >
                       (c->cur.type == KVT_F_CMA_WRITE ? KVT_CMA_CTL_MAX : KVT_CTL_MAX)) {
                /* a DESC: only kvt_descriptor_fetch takes one */
                char msg[96];
                kvt__str(msg, sizeof msg, "unexpected frame %s of %u bytes",
                         kvt__ftype_name(c->cur.type), c->cur.len);
                proto_error(e, c, EPROTO, msg);
                return;
            } else if (c->cur.len) {
                c->rstate = RS_CTL;
            } else {
                c->ctl[0] = '\0';
                on_frame(e, c);
            }
            continue;
        }
        if (!avail)
            return;
        if (c->rstate == RS_CTL) {
            size_t n = c->cur.len - c->ctl_len;
            n = n < avail ? n : avail;
            memcpy(c->ctl + c->ctl_len, p, n);
            c->ctl_len += (uint32_t)n;
            c->rpos += n;
            if (c->ctl_len == c->cur.len) {
                c->ctl[c->ctl_len] = '\0';
                c->rstate = RS_HDR;
                on_frame(e, c);
            }
        } else if (c->rstate == RS_RDATA) {
            size_t n = c->left < avail ? (size_t)c->left : avail;
            c->rpos += n;
            kvt__read_copy(e, c, p, n); /* may end the request (RS_HDR) */
        } else if (c->rstate == RS_WDATA) {
            size_t n = c->left < avail ? (size_t)c->left : avail;
            c->rpos += n;
            wv_step(e, c, p, n); /* may apply the write (RS_HDR) */
        } else {
            size_t n = c->left < avail ? (size_t)c->left : avail;
            if (c->rstate == RS_PAYLOAD) {
                memcpy(c->dst, p, n);
                c->dst += n;
            }
            c->left -= n;
            c->rpos += n;
            if (!c->left) {
                if (c->rstate == RS_PAYLOAD)
                    on_write_applied(e, c);
                else
                    c->rstate = RS_HDR;
            }
        }
    }
}

/* A client connection with nothing in flight or queued on it. */
static bool client_idle(const kvt__conn *c)
{
    return c->state == CS_UP && !c->sending && !c->q_head && !c->f_head && !c->rf_head &&
           !c->done_waits && !c->qp_wait && c->rstate == RS_HDR && c->rlen == c->rpos;
}

void kvt__rx_cqe(kvt_engine *e, kvt__conn *c, int res, unsigned cflags)
{
    c->ops--;
    c->recving = false;
    kvt__sroom *held = c->rd_room; /* a READ recv's room (kvt__rx_arm) */
    c->rd_room = NULL;
    if (held) /* its pending hold is dropped at the end, after this CQE */
        held->in_kernel--;
    if (c->state == CS_CLOSING)
        goto out;
    if (res <= 0) {
        const char *what = res == 0 ? "connection closed by peer" : strerror(-res);
        if (!c->client && res == 0 && c->rstate == RS_HDR && c->rlen == c->rpos &&
            (!c->rpeer || !c->rpeer->rooms))
            kvt__conn_close(e, c); /* clean end between frames, nothing pending */
        else if (c->client && res == 0 && c->close_after_send)
            kvt__conn_close(e, c);
        else if (c->client && (res == 0 || res == -ECONNRESET) && client_idle(c)) {
            /* An idle connection the peer closed (it restarted, or went
             * away): nothing is lost; the next operation connects again
             * and its handshake tells a restarted peer (ESTALE). */
            kvt__log(e, KVT_LOG_INFO, "peer %s closed an idle connection (%s)", c->peer->sid, what);
            kvt__conn_close(e, c);
        } else
            kvt__conn_fail(e, c, res == 0 ? ECONNRESET : -res, "receive", what);
        goto out;
    }
    c->progress_ns = kvc__mono_ns();
    if (c->direct && c->rstate == RS_RDATA) {
        kvt__read_advance(e, c, (size_t)res);
    } else if (c->direct && c->rstate == RS_WDATA) {
        wv_step(e, c, NULL, (size_t)res);
    } else if (c->direct) {
        c->dst += res;
        c->left -= (uint64_t)res;
        if (!c->left)
            on_write_applied(e, c);
    } else {
        c->rlen += (size_t)res;
    }
    rx_parse(e, c);
    if (c->state != CS_CLOSING) {
        /* Acknowledge now unless more input is already queued on the
         * socket (the kernel says so in the CQE: a recv will complete at
         * once, and this is decided again then) and the writes held back
         * are few.  Without that flag (older kernels) every recv flushes.
         * Either way a write is acknowledged only once it is in place. */
        if (!c->client && (!(cflags & IORING_CQE_F_SOCK_NONEMPTY) ||
                           c->ack_count >= KVT_ACK_WRITES || c->ack_bytes >= KVT_ACK_BYTES))
            flush_acks(e, c);
        e->net->kick(e, c);
        if (!c->close_after_send) /* after a refusal: stop reading, close once sent */
            kvt__rx_arm(e, c);
    }
out:
    if (held) { /* no byte of its goes into its memory any more */
        held->pending--;
        kvt__sroom_check(e, held);
    }
    if (c->state == CS_CLOSING && c->ops == 0)
        c->want_close = true;
}
