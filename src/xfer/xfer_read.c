/*
 * xfer_read.c - reads (kvt_submit_read) over the connection layer, and the
 * descriptor request (kvt_descriptor_fetch's server side).
 *
 * A reader (client) packs a room's runs into READ requests of up to
 * KVT_READ_ENTS_MAX runs and KVT_READ_REQ_MAX bytes; each waits on the
 * peer's backlog, is sent on a connection with window room (its cost: the
 * bytes it asks for), then waits in the connection's read FIFO.  The server
 * checks every run of a request against its registered regions before it
 * sends a byte: one outside them refuses the whole request (READ_NACK with
 * the reason; nothing of it is sent).  Otherwise one READ_DATA frame
 * carries the runs' bytes back to back, sent by one sendmsg straight from
 * the regions (one iovec per run, no copy), and the reader receives them
 * straight into place by recvmsg with one iovec per run: no per-run frame,
 * no per-run syscall on either side.  Answers come in request order on a
 * connection (one stream), so the FIFO's head is always the one answered.
 * Regions a request reads from (server) or into (client) are busy until
 * the request is done: deregistering them is refused with KVC_E_BUSY.
 */
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "xfer_cma.h"
#include "xfer_conn.h"

/* ---- busy counts --------------------------------------------------------------- */

static void busy_drop(kvt_engine *e, uint64_t addr, uint64_t len)
{
    kvt__region *g = kvt__region_find(e, addr, len);
    if (g && g->busy)
        g->busy--;
}

void kvt__wr_free(kvt_engine *e, kvt__wr *w)
{
    for (uint32_t i = 0; i < w->nent; i++)
        busy_drop(e, w->ent[i].laddr, w->ent[i].len);
    for (uint32_t i = 0; !w->room && i < w->nsiov; i++) /* a READ answer's regions */
        busy_drop(e, (uint64_t)(uintptr_t)w->siov[i].iov_base, w->siov[i].iov_len);
    free(w);
}

/* ---- client: requests ------------------------------------------------------------ */

/* One READ request for runs v[0..k) of room r (already checked). */
static kvt__wr *read_wr(kvt_engine *e, kvt_peer *p, kvt__sroom *r, const kvt__rent *v, uint32_t k,
                        uint64_t total)
{
    size_t plen = (size_t)k * KVT_READ_ENT_LEN;
    kvt__wr *w = calloc(1, sizeof *w + plen + (size_t)k * sizeof(kvt__rent));
    if (!w)
        return NULL;
    w->ent = (kvt__rent *)(void *)(w->owned + plen); /* plen is a multiple of 16 */
    for (uint32_t i = 0; i < k; i++) {
        w->ent[i] = v[i];
        kvt__put64(w->owned + (size_t)i * KVT_READ_ENT_LEN, v[i].raddr);
        kvt__put64(w->owned + (size_t)i * KVT_READ_ENT_LEN + 8, v[i].len);
        kvt__region *g = kvt__region_find(e, v[i].laddr, v[i].len);
        if (g)
            g->busy++;
    }
    w->nent = k;
    w->room = r;
    w->payload = w->owned;
    w->plen = (uint32_t)plen;
    w->rbytes = total;
    w->seq = p->next_seq++;
    kvt__frame f = {
        .type = KVT_F_READ, .len = (uint32_t)plen, .seq = w->seq, .room = r->room, .addr = total};
    kvt__frame_encode(&f, w->hdr);
    return w;
}

kvc_err kvt__read_queue(kvt_engine *e, kvt_peer *p, kvt__sroom *r, const kvt_run *v, size_t n)
{
    uint64_t cap = e->o.window_bytes < KVT_READ_REQ_MAX ? e->o.window_bytes : KVT_READ_REQ_MAX;
    kvt__rent batch[KVT_READ_ENTS_MAX];
    uint32_t k = 0;
    uint64_t total = 0;
    for (size_t i = 0; i <= n; i++) {
        for (uint64_t off = 0; i < n && off < v[i].len;) {
            uint64_t len = v[i].len - off;
            if (len > e->o.slice_bytes)
                len = e->o.slice_bytes;
            if (k == KVT_READ_ENTS_MAX || (k && total + len > cap)) {
                kvt__wr *w = read_wr(e, p, r, batch, k, total);
                if (!w)
                    return kvt__fail(KVC_E_SYS, "out of memory queueing reads");
                w->in_q = 1;
                if (p->bl_tail)
                    p->bl_tail->next = w;
                else
                    p->bl_head = w;
                p->bl_tail = w;
                r->pending++;
                r->writes++;
                r->bytes += total;
                k = 0;
                total = 0;
            }
            batch[k++] = (kvt__rent){v[i].laddr + off, v[i].raddr + off, len};
            total += len;
            off += len;
        }
        if (i == n && k) { /* the last request */
            kvt__wr *w = read_wr(e, p, r, batch, k, total);
            if (!w)
                return kvt__fail(KVC_E_SYS, "out of memory queueing reads");
            w->in_q = 1;
            if (p->bl_tail)
                p->bl_tail->next = w;
            else
                p->bl_head = w;
            p->bl_tail = w;
            r->pending++;
            r->writes++;
            r->bytes += total;
        }
    }
    return KVC_OK;
}

/* ---- client: answers ---------------------------------------------------------------- */

void kvt__read_data_header(kvt_engine *e, kvt__conn *c)
{
    kvt__wr *w = c->rf_head;
    if (!w || w->seq != c->cur.seq || w->rbytes != c->cur.len || w->nent != c->cur.addr) {
        char msg[200];
        kvt__str(msg, sizeof msg, "READ_DATA for request %llu (%u bytes) does not match %s",
                 (unsigned long long)c->cur.seq, c->cur.len,
                 w ? "the oldest request outstanding" : "any request outstanding");
        kvt__conn_fail(e, c, EPROTO, "read", msg);
        return;
    }
    c->rd = w;
    c->rd_ent = 0;
    c->rd_off = 0;
    c->left = c->cur.len;
    c->rstate = RS_RDATA;
}

/* Every byte of c->rd is in place. */
static void read_done(kvt_engine *e, kvt__conn *c)
{
    kvt__wr *w = c->rd;
    c->rd = NULL;
    c->rstate = RS_HDR;
    c->rf_head = w->next;
    if (!c->rf_head)
        c->rf_tail = NULL;
    w->next = NULL;
    w->in_fifo = 0;
    c->unacked_bytes -= w->rbytes;
    c->big = w->rbytes >= KVT_DIRECT_MIN; /* the next header alone (kvt__rx_arm) */
    kvt__sroom *r = w->room;
    r->acked_writes++;
    r->acked_bytes += w->rbytes;
    e->st.reads_done++;
    e->st.bytes_read += w->rbytes;
    kvt__wr_release(e, w); /* the room may end here */
    kvt__peer_pump(e, c->peer);
}

/* A READ request's local runs as a scatter (kvt__scatter). */
_Static_assert(offsetof(kvt__rent, laddr) == 0, "kvt__scatter reads the address at offset 0");

static kvt__scatter rd_scatter(const kvt__wr *w)
{
    return (kvt__scatter){(const uint8_t *)w->ent, sizeof w->ent[0], offsetof(kvt__rent, len),
                          w->nent};
}

/* Account n bytes arrived at the current position; copy them from src
 * when not NULL. */
static void rd_step(kvt_engine *e, kvt__conn *c, const uint8_t *src, size_t n)
{
    c->left -= n;
    kvt__scatter s = rd_scatter(c->rd);
    kvt__scatter_step(&s, &c->rd_ent, &c->rd_off, src, n);
    if (!c->left)
        read_done(e, c);
}

void kvt__read_copy(kvt_engine *e, kvt__conn *c, const uint8_t *p, size_t n)
{
    rd_step(e, c, p, n);
}

void kvt__read_advance(kvt_engine *e, kvt__conn *c, size_t n) { rd_step(e, c, NULL, n); }

size_t kvt__read_arm(kvt__conn *c)
{
    kvt__scatter s = rd_scatter(c->rd);
    return kvt__scatter_iov(&s, c->rd_ent, c->rd_off, c->riov, KVT_RIOV, &c->rmsg);
}

/* Take the oldest request off c's read FIFO (its answer will not come). */
static kvt__wr *rf_pop(kvt__conn *c)
{
    kvt__wr *w = c->rf_head;
    c->rf_head = w->next;
    if (!c->rf_head)
        c->rf_tail = NULL;
    w->next = NULL;
    w->in_fifo = 0;
    c->unacked_bytes -= w->rbytes;
    return w;
}

void kvt__read_nack(kvt_engine *e, kvt__conn *c)
{
    if (!c->rf_head || c->rf_head->seq != c->cur.seq) {
        kvt__conn_fail(e, c, EPROTO, "read", "READ_NACK out of order");
        return;
    }
    kvt__wr *w = rf_pop(c);
    char why[KVC_REASON_MAX + 1];
    kvt__str(why, sizeof why, "read of room %llu from peer %s refused there: %.*s",
             (unsigned long long)c->cur.room, c->peer->sid, (int)c->ctl_len, c->ctl);
    kvt__sroom *r = w->room;
    r->pending++; /* keep r alive across the release */
    kvt__sroom_fail(e, r, c->cur.status ? c->cur.status : EFAULT, why);
    kvt__wr_release(e, w);
    r->pending--;
    kvt__sroom_check(e, r);
    kvt__peer_pump(e, c->peer);
}

void kvt__read_conn_closed(kvt_engine *e, kvt__conn *c)
{
    /* Server: same-host reads granted and not ended: unpinned (a copy the
     * peer may still make reads memory that is no longer promised). */
    while (c->pin_head) {
        kvt__wr *w = c->pin_head;
        c->pin_head = w->next;
        kvt__wr_free(e, w);
    }
    c->pin_tail = NULL;
    c->rd = NULL;
    while (c->rf_head) {
        kvt__wr *w = rf_pop(c);
        kvt__sroom *r = w->room;
        r->pending++;
        if (!r->failed) {
            char why[KVC_REASON_MAX + 1];
            kvt__str(why, sizeof why,
                     "read of room %llu from peer %s: connection closed before its data arrived",
                     (unsigned long long)r->room, r->peer->sid);
            kvt__sroom_fail(e, r, ECONNRESET, why);
        }
        kvt__wr_release(e, w);
        r->pending--;
        kvt__sroom_check(e, r);
    }
}

/* ---- server: answering -------------------------------------------------------------- */

void kvt__read_serve(kvt_engine *e, kvt__conn *c)
{
    kvt__read_ent ent[KVT_READ_ENTS_MAX];
    uint64_t total = 0;
    char err[200];
    int n = kvt__read_decode((const uint8_t *)c->ctl, c->ctl_len, KVT_FRAME_MAX, KVT_FRAME_MAX, ent,
                             &total, err, sizeof err);
    if (n < 0 || total != c->cur.addr) {
        if (n >= 0)
            kvt__str(err, sizeof err, "READ announces %llu bytes, its entries %llu",
                     (unsigned long long)c->cur.addr, (unsigned long long)total);
        kvt__rx_proto_error(e, c, EPROTO, err);
        return;
    }
    for (int i = 0; i < n; i++) {
        if (kvt__region_find(e, ent[i].addr, ent[i].len))
            continue;
        char msg[240];
        kvt__str(msg, sizeof msg,
                 "read of %llu bytes at 0x%llx (run %d of request %llu, room %llu) is outside "
                 "every region registered here",
                 (unsigned long long)ent[i].len, (unsigned long long)ent[i].addr, i,
                 (unsigned long long)c->cur.seq, (unsigned long long)c->cur.room);
        e->st.frames_refused++;
        kvt__log(e, KVT_LOG_WARN, "peer %s: %s", c->rpeer->sid, msg);
        kvt__wr *w = kvt__ctl_wr(KVT_F_READ_NACK, c->cur.seq, c->cur.room, 0, EFAULT, msg,
                                 (uint32_t)strlen(msg));
        if (!w) {
            kvt__conn_fail(e, c, ENOMEM, "read", "out of memory");
            return;
        }
        kvt__conn_enqueue(c, w);
        return;
    }
    bool cma = c->cur.type == KVT_F_CMA_READ;
    if (cma && c->cma != KVT_CMA_ON && c->cma != KVT_CMA_FELL) {
        kvt__rx_proto_error(e, c, EPROTO,
                            "same-host read on a connection whose peer is not proven on this host");
        return;
    }
    if (c->read_out + total > KVT_READ_OUT_MAX) {
        kvt__str(err, sizeof err,
                 "more than %u bytes of read answers outstanding on one connection (%llu queued, "
                 "%llu asked)",
                 KVT_READ_OUT_MAX, (unsigned long long)c->read_out, (unsigned long long)total);
        kvt__rx_proto_error(e, c, EPROTO, err);
        return;
    }
    kvt__wr *w = calloc(1, sizeof *w + (size_t)n * sizeof(struct iovec));
    if (!w) {
        kvt__conn_fail(e, c, ENOMEM, "read", "out of memory");
        return;
    }
    w->siov = (struct iovec *)(void *)w->owned;
    for (int i = 0; i < n; i++) {
        w->siov[i] = (struct iovec){(void *)(uintptr_t)ent[i].addr, (size_t)ent[i].len};
        kvt__region_find(e, ent[i].addr, ent[i].len)->busy++;
    }
    w->nsiov = (uint32_t)n;
    w->dlen = total;
    kvt__frame f = {.type = KVT_F_READ_DATA,
                    .len = (uint32_t)total,
                    .seq = c->cur.seq,
                    .room = c->cur.room,
                    .addr = (uint64_t)n};
    kvt__frame_encode(&f, w->hdr);
    c->read_out += total;
    e->st.reads_served++;
    e->st.bytes_served += total;
    if (!cma) {
        kvt__conn_enqueue(c, w);
        return;
    }
    /* Same host: the runs stay pinned (busy) until the reader's
     * CMA_READ_END; the reader copies them itself (xfer_cma.h). */
    kvt__wr *go = kvt__ctl_wr(KVT_F_CMA_READ_GO, c->cur.seq, c->cur.room, total, 0, NULL, 0);
    if (!go) {
        c->read_out -= total;
        kvt__wr_free(e, w);
        kvt__conn_fail(e, c, ENOMEM, "read", "out of memory");
        return;
    }
    w->seq = c->cur.seq;
    if (c->pin_tail)
        c->pin_tail->next = w;
    else
        c->pin_head = w;
    c->pin_tail = w;
    kvt__conn_enqueue(c, go);
}

void kvt__read_cma_end(kvt_engine *e, kvt__conn *c)
{
    kvt__wr *w = c->pin_head;
    if (!w || w->seq != c->cur.seq) {
        kvt__rx_proto_error(e, c, EPROTO, "CMA_READ_END out of order");
        return;
    }
    c->pin_head = w->next;
    if (!c->pin_head)
        c->pin_tail = NULL;
    c->read_out -= w->dlen;
    kvt__wr_free(e, w); /* unpinned */
}

void kvt__read_cma_go(kvt_engine *e, kvt__conn *c)
{
    kvt__wr *w = c->rf_head;
    if (!w || w->seq != c->cur.seq || w->rbytes != c->cur.addr) {
        kvt__conn_fail(e, c, EPROTO, "read", "CMA_READ_GO does not match the oldest request");
        return;
    }
    struct iovec local[KVT_READ_ENTS_MAX], remote[KVT_READ_ENTS_MAX];
    for (uint32_t i = 0; i < w->nent; i++) {
        local[i] = (struct iovec){(void *)(uintptr_t)w->ent[i].laddr, (size_t)w->ent[i].len};
        remote[i] = (struct iovec){(void *)(uintptr_t)w->ent[i].raddr, (size_t)w->ent[i].len};
    }
    char why[KVC_REASON_MAX + 1];
    /* A connection whose copy fell back copies no more (a grant for a
     * request sent before that is given back and asked again). */
    int err = c->cma == KVT_CMA_FELL ? c->cma_err
                                     : kvt__cma_pull(e, c, local, remote, w->nent, why, sizeof why);
    /* The peer unpins its runs whatever the outcome. */
    kvt__wr *end = kvt__ctl_wr(KVT_F_CMA_READ_END, w->seq, c->cur.room, 0, err, NULL, 0);
    if (!end) {
        kvt__conn_fail(e, c, ENOMEM, "read", "out of memory");
        return;
    }
    kvt__conn_enqueue(c, end);
    c->progress_ns = kvc__mono_ns();
    if (!err) {
        c->rd = w;
        read_done(e, c); /* the room may end here */
        c->big = false;  /* no data on this connection: frames many to a recv */
        return;
    }
    if (kvt__cma_falls_back(err)) {
        /* Not the caller's doing (a permission, the pid check): the same
         * request again as a socket READ (w->hdr), behind what is queued;
         * the connection reads through the socket from now on.  Bytes the
         * failed copy placed are overwritten by the answer. */
        if (c->cma != KVT_CMA_FELL)
            kvt__cma_fell(e, c, err, why);
        w = rf_pop(c);
        c->unacked_bytes += w->rbytes;
        kvt__conn_enqueue(c, w);
        e->net->kick(e, c);
        return;
    }
    kvt__log(e, KVT_LOG_WARN, "read of room %llu: %s", (unsigned long long)c->cur.room, why);
    w = rf_pop(c);
    kvt__sroom *r = w->room;
    r->pending++; /* keep r alive across the release */
    kvt__sroom_fail(e, r, err, why);
    kvt__wr_release(e, w);
    r->pending--;
    kvt__sroom_check(e, r);
    kvt__peer_pump(e, c->peer);
}

/* DESC_REQ: instead of a HELLO; version and token as a HELLO's.  The
 * descriptor goes back, then the connection closes; no peer is created. */
void kvt__desc_serve(kvt_engine *e, kvt__conn *c)
{
    kvt__hello h;
    char msg[256];
    int32_t code = kvt__rx_hello(c, &h, msg, sizeof msg);
    if (code) {
        kvt__rx_proto_error(e, c, code, msg);
        return;
    }
    if (e->token && !kvt__token_equal(e->token_pad, h.token)) {
        kvt__str(msg, sizeof msg, "unauthorized: descriptor request with %s handshake token",
                 h.token[0] ? "a wrong" : "no");
        kvt__rx_proto_error(e, c, EACCES, msg);
        return;
    }
    char *json = NULL;
    if (kvt_descriptor_export(e, &json)) {
        kvt__rx_proto_error(e, c, ENOMEM, "out of memory building the descriptor");
        return;
    }
    size_t len = strlen(json);
    if (len > KVT_DESC_FRAME_MAX) {
        free(json);
        kvt__str(msg, sizeof msg, "descriptor of %zu bytes exceeds %u bytes", len,
                 KVT_DESC_FRAME_MAX);
        kvt__rx_proto_error(e, c, EMSGSIZE, msg);
        return;
    }
    kvt__wr *w = kvt__ctl_wr(KVT_F_DESC, 0, 0, 0, 0, json, (uint32_t)len);
    free(json);
    if (!w) {
        kvt__rx_proto_error(e, c, ENOMEM, "out of memory");
        return;
    }
    kvt__conn_enqueue(c, w);
    c->close_after_send = true;
    c->rstate = RS_SKIP;
    c->left = UINT64_MAX; /* whatever else comes is ignored */
    e->net->kick(e, c);
}
