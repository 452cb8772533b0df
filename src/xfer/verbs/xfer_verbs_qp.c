/*
 * xfer_verbs_qp.c - the verbs data path: RC QPs set up over the TCP control
 * channel, RDMA WRITE of a room's runs, the end-of-room SEND, completions
 * and asynchronous events, both polled through the engine's io_uring.
 *
 * Sequence between a sender (client) and a receiver (server), both verbs:
 *   1. connection slot 0 to the peer is the control channel; after
 *      HELLO_OK the sender creates its QP (RESET->INIT) and sends QP_INFO
 *      with its record (QPN, PSN, GID, LID, MTU);
 *   2. the receiver creates its QP, takes it INIT->RTR->RTS toward that
 *      record, posts its receive buffers and answers QP_INFO with its own;
 *   3. the sender takes its QP RTR->RTS; the peer's backlog of writes is
 *      posted as RDMA WRITEs (every run was checked against our regions
 *      and the peer's descriptor at submit; lkey and rkey come from them);
 *      (reads: each run of a READ request is an RDMA READ from the peer's
 *      region into ours; the room ends when every one completed);
 *   4. once every WRITE of a closed room completed, one SEND carries the
 *      room, its write count and bytes; RC delivers it after the WRITEs,
 *      so its receive completion tells the receiver the data is in place,
 *      and its send completion tells the sender the same.
 * Failures: the first failed WC of a room fails it (ibv_wc_status_str and
 * the status number) and the peer (the QP is in the error state now);
 * WR_FLUSH_ERR completions after it are noise (kvt__wc_note).  QP-fatal
 * and device-fatal async events fail the rooms they affect and mark the
 * peers unhealthy.  A room's Failed event waits until every WRITE of it
 * has completed or been flushed: only then is our memory no longer read.
 *
 * Pure parts (records, QP attributes, WC bookkeeping, event classes) are
 * in xfer_verbs_rules.c, unit-tested without a device.
 */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "xfer_conn.h"
#include "xfer_verbs.h"

#define KVT_VQP_SQ 512u  /* send work requests outstanding per QP */
#define KVT_VQP_RQ 32u   /* receive buffers per QP (end-of-room notes) */
#define KVT_VQP_RBUF 32u /* bytes per receive buffer (>= KVT_NOTE_LEN) */

struct kvt__vqp {
    struct kvt__vqp *next; /* engine list (v->qps) */
    struct ibv_qp *qp;
    struct ibv_mr *rmr; /* receive buffers */
    uint8_t *rbuf;
    uint32_t rq_head;   /* next receive to complete (RC: in order) */
    uint32_t sq_used;   /* send WRs outstanding */
    uint32_t rq_posted; /* receive WRs outstanding */
    kvt_peer *peer;     /* sender side */
    kvt__rpeer *rpeer;  /* receiver side */
    uint32_t conn_id;   /* the control connection */
    kvt__qp_local local;
    bool up;   /* RTS */
    bool dead; /* moved to the error state: draining */
};

/* ---- QP life ---------------------------------------------------------------------- */

static void vqp_destroy(kvt_engine *e, kvt__vqp *q)
{
    struct kvt__verbs *v = e->verbs;
    for (kvt__vqp **pp = &v->qps; *pp; pp = &(*pp)->next)
        if (*pp == q) {
            *pp = q->next;
            v->nqps--;
            break;
        }
    if (q->qp)
        ibv_destroy_qp(q->qp);
    if (q->rmr)
        ibv_dereg_mr(q->rmr);
    free(q->rbuf);
    free(q);
}

/* Destroy q once no work request of it is outstanding. */
static void vqp_free_if_flushed(kvt_engine *e, kvt__vqp *q)
{
    if (q->dead && q->sq_used == 0 && q->rq_posted == 0)
        vqp_destroy(e, q);
}

/* Move q to the error state: every outstanding WR completes with
 * WR_FLUSH_ERR, after which on_wc destroys q (vqp_free_if_flushed).
 * Hazard: never destroys q itself -- callers may be inside a WC handler
 * that still uses q. */
static void vqp_kill(kvt_engine *e, kvt__vqp *q)
{
    if (q->dead)
        return;
    q->dead = true;
    q->up = false;
    struct ibv_qp_attr a = {.qp_state = IBV_QPS_ERR};
    if (ibv_modify_qp(q->qp, &a, IBV_QP_STATE))
        kvt__log(e, KVT_LOG_ERROR, "QP %u: modify to ERR failed (%s): its work is not flushed",
                 q->qp->qp_num, strerror(errno));
}

static int post_recv(kvt__vqp *q, uint32_t slot)
{
    struct ibv_sge sge = {.addr = (uint64_t)(uintptr_t)(q->rbuf + (size_t)slot * KVT_VQP_RBUF),
                          .length = KVT_VQP_RBUF,
                          .lkey = q->rmr->lkey};
    struct ibv_recv_wr wr = {.wr_id = kvt__wrid(q, KVT_WRID_RECV), .sg_list = &sge, .num_sge = 1};
    struct ibv_recv_wr *bad;
    if (ibv_post_recv(q->qp, &wr, &bad))
        return -1;
    q->rq_posted++;
    return 0;
}

/* A QP in INIT with its receive buffers posted, or NULL with err. */
static kvt__vqp *vqp_new(kvt_engine *e, char *err, size_t cap)
{
    struct kvt__verbs *v = e->verbs;
    if (!v) {
        kvt__str(err, cap, "this engine runs tcp: no RDMA device");
        return NULL;
    }
    if (v->dead) {
        kvt__str(err, cap, "RDMA device %s unusable: %s", v->dev, v->dead_why);
        return NULL;
    }
    /* One CQ for every QP: it must hold all their outstanding WRs. */
    int need = (int)((v->nqps + 1) * (KVT_VQP_SQ + KVT_VQP_RQ));
    if (v->cq->cqe < need && ibv_resize_cq(v->cq, need)) {
        kvt__str(err, cap, "ibv_resize_cq to %d entries: %s", need, strerror(errno));
        return NULL;
    }
    kvt__vqp *q = calloc(1, sizeof *q);
    if (!q || !(q->rbuf = calloc(KVT_VQP_RQ, KVT_VQP_RBUF))) {
        free(q);
        kvt__str(err, cap, "out of memory for a QP");
        return NULL;
    }
    struct ibv_qp_init_attr ia = {
        .qp_context = q,
        .send_cq = v->cq,
        .recv_cq = v->cq,
        .cap = {.max_send_wr = KVT_VQP_SQ,
                .max_recv_wr = KVT_VQP_RQ,
                .max_send_sge = 1,
                .max_recv_sge = 1,
                .max_inline_data = KVT_NOTE_LEN},
        .qp_type = IBV_QPT_RC,
        .sq_sig_all = 1, /* every WR completes: a room counts its WRITEs */
    };
    q->qp = ibv_create_qp(v->pd, &ia);
    if (!q->qp) {
        kvt__str(err, cap, "ibv_create_qp (RC): %s", strerror(errno));
        free(q->rbuf);
        free(q);
        return NULL;
    }
    q->rmr = ibv_reg_mr(v->pd, q->rbuf, KVT_VQP_RQ * KVT_VQP_RBUF, IBV_ACCESS_LOCAL_WRITE);
    q->local = (kvt__qp_local){.port = (uint8_t)v->port,
                               .gid_index = v->gid_index,
                               .is_roce = v->is_roce,
                               .active_mtu = v->active_mtu,
                               .psn = (uint32_t)(kvc__mono_ns() ^ (uint64_t)random()) & 0xffffffu};
    kvt__qp_rd_depths(v->max_qp_init_rd_atom, v->max_qp_rd_atom, &q->local);
    q->next = v->qps;
    v->qps = q;
    v->nqps++;
    struct ibv_qp_attr a;
    int mask;
    kvt__qp_init_attr(&q->local, &a, &mask);
    if (!q->rmr || ibv_modify_qp(q->qp, &a, mask)) {
        kvt__str(err, cap, "%s: %s",
                 q->rmr ? "ibv_modify_qp RESET->INIT" : "ibv_reg_mr (receive buffers)",
                 strerror(errno));
        vqp_destroy(e, q);
        return NULL;
    }
    for (uint32_t i = 0; i < KVT_VQP_RQ; i++)
        if (post_recv(q, i)) {
            kvt__str(err, cap, "ibv_post_recv: %s", strerror(errno));
            vqp_kill(e, q); /* flushes what was posted; freed once flushed */
            vqp_free_if_flushed(e, q);
            return NULL;
        }
    return q;
}

/* INIT -> RTR -> RTS toward the peer's record. */
static int vqp_connect(kvt__vqp *q, const kvt__qp_rec *r, char *err, size_t cap)
{
    struct ibv_qp_attr a;
    int mask;
    if (kvt__qp_rtr_attr(&q->local, r, &a, &mask, err, cap))
        return -1;
    if (ibv_modify_qp(q->qp, &a, mask)) {
        kvt__str(err, cap, "ibv_modify_qp INIT->RTR (peer QPN %u): %s", r->qpn, strerror(errno));
        return -1;
    }
    q->local.peer_resp_depth = r->rd_atom;
    kvt__qp_rts_attr(&q->local, &a, &mask);
    if (ibv_modify_qp(q->qp, &a, mask)) {
        kvt__str(err, cap, "ibv_modify_qp RTR->RTS: %s", strerror(errno));
        return -1;
    }
    q->up = true;
    return 0;
}

static void send_qp_info(kvt_engine *e, kvt__conn *c, kvt__vqp *q)
{
    struct kvt__verbs *v = e->verbs;
    kvt__qp_rec r = {.qpn = q->qp->qp_num,
                     .psn = q->local.psn,
                     .lid = v->lid,
                     .mtu = (uint8_t)v->active_mtu,
                     .is_roce = v->is_roce,
                     .gid_index = (uint16_t)v->gid_index,
                     .rd_atom = q->local.resp_depth};
    memcpy(r.gid, v->gid.raw, 16);
    uint8_t buf[KVT_QPREC_LEN];
    kvt__qp_rec_encode(&r, buf);
    kvt__wr *w = kvt__ctl_wr(KVT_F_QP_INFO, 0, 0, 0, 0, buf, KVT_QPREC_LEN);
    if (!w) {
        kvt__conn_fail(e, c, ENOMEM, "QP setup", "out of memory");
        return;
    }
    kvt__conn_enqueue(c, w);
    e->net->kick(e, c);
}

void kvt__verbs_hello_ok(kvt_engine *e, kvt__conn *c)
{
    kvt_peer *p = c->peer;
    if (!p->verbs || p->vqp || p->conns[0] != c)
        return;
    char err[200];
    kvt__vqp *q = vqp_new(e, err, sizeof err);
    if (!q) {
        kvt__peer_fail(e, p, EIO, "QP to peer %s: %s", p->sid, err);
        return;
    }
    q->peer = p;
    q->conn_id = c->id;
    p->vqp = q;
    c->qp_wait = true;
    send_qp_info(e, c, q);
}

/* QP_INFO arrived on c.  Server: create, connect, answer.  Client: connect.
 * Returns 0, or -1 with the reason in err (the caller fails c). */
int kvt__verbs_qp_info(kvt_engine *e, kvt__conn *c, const kvt__qp_rec *r, char *err, size_t cap)
{
    if (c->client) {
        kvt__vqp *q = c->peer->vqp;
        if (!c->qp_wait || !q) {
            kvt__str(err, cap, "QP_INFO not asked for");
            return -1;
        }
        c->qp_wait = false;
        if (vqp_connect(q, r, err, cap))
            return -1;
        kvt__log(e, KVT_LOG_DEBUG, "QP %u to peer %s (QPN %u) ready", q->qp->qp_num, c->peer->sid,
                 r->qpn);
        kvt__peer_pump(e, c->peer);
        return 0;
    }
    kvt__rpeer *rp = c->rpeer;
    if (rp->vqp)
        kvt__verbs_rpeer_down(e, rp); /* the sender set up a new one */
    kvt__vqp *q = vqp_new(e, err, cap);
    if (!q)
        return -1;
    q->rpeer = rp;
    q->conn_id = c->id;
    rp->vqp = q;
    if (vqp_connect(q, r, err, cap)) {
        kvt__verbs_rpeer_down(e, rp);
        return -1;
    }
    send_qp_info(e, c, q);
    return 0;
}

void kvt__verbs_peer_down(kvt_engine *e, kvt_peer *p)
{
    kvt__vqp *q = p->vqp;
    if (!q)
        return;
    p->vqp = NULL;
    vqp_kill(e, q);
}

void kvt__verbs_rpeer_down(kvt_engine *e, kvt__rpeer *rp)
{
    kvt__vqp *q = rp->vqp;
    if (!q)
        return;
    rp->vqp = NULL;
    q->rpeer = NULL;
    vqp_kill(e, q);
}

/* ---- posting ----------------------------------------------------------------------- */

static kvt__rregion *peer_region(kvt_peer *p, uint64_t addr, uint64_t len)
{
    for (size_t i = 0; i < p->nregions; i++) {
        kvt__rregion *r = &p->regions[i];
        if (addr >= r->addr && addr - r->addr <= r->len && len <= r->len - (addr - r->addr))
            return r;
    }
    return NULL;
}

/* Take w off p's backlog: it was posted, or refused. */
static void backlog_pop(kvt_peer *p, kvt__wr *w)
{
    p->bl_head = w->next;
    if (!p->bl_head)
        p->bl_tail = NULL;
    w->next = NULL;
    w->in_q = 0;
}

/* Post READ request w (first on p's backlog) as RDMA READs, one per run,
 * local buffer and remote range checked again (regions may have changed
 * since the submit).  0: posted or refused (w is off the backlog); -1: the
 * peer failed (ibv_post_send), stop. */
static int post_reads(kvt_engine *e, kvt_peer *p, kvt__vqp *q, kvt__wr *w)
{
    kvt__sroom *r = w->room;
    char why[KVC_REASON_MAX + 1] = "";
    int32_t code = EFAULT;
    struct ibv_send_wr wrs[KVT_READ_ENTS_MAX];
    struct ibv_sge sges[KVT_READ_ENTS_MAX];
    if (kvt__qp_read_ok(&q->local, why, sizeof why))
        code = EOPNOTSUPP;
    for (uint32_t i = 0; !why[0] && i < w->nent; i++) {
        const kvt__rent *t = &w->ent[i];
        kvt__region *lr = kvt__region_find(e, t->laddr, t->len);
        kvt__rregion *rr = peer_region(p, t->raddr, t->len);
        if (!lr || !lr->mr || !rr) {
            kvt__str(why, sizeof why,
                     "RDMA READ of room %llu from peer %s refused before posting: %s range "
                     "[0x%llx, +%llu) is not inside a registered region",
                     (unsigned long long)r->room, p->sid, lr && lr->mr ? "remote" : "local",
                     (unsigned long long)(lr && lr->mr ? t->raddr : t->laddr),
                     (unsigned long long)t->len);
            break;
        }
        sges[i] = (struct ibv_sge){
            .addr = t->laddr, .length = (uint32_t)t->len, .lkey = ((struct ibv_mr *)lr->mr)->lkey};
        wrs[i] = (struct ibv_send_wr){.wr_id = kvt__wrid(w, KVT_WRID_READ),
                                      .next = i + 1 < w->nent ? &wrs[i + 1] : NULL,
                                      .sg_list = &sges[i],
                                      .num_sge = 1,
                                      .opcode = IBV_WR_RDMA_READ,
                                      .send_flags = IBV_SEND_SIGNALED};
        wrs[i].wr.rdma.remote_addr = t->raddr;
        wrs[i].wr.rdma.rkey = rr->rkey;
    }
    if (why[0] || r->failed) {
        backlog_pop(p, w);
        r->pending++; /* keep r across the release */
        kvt__wr_release(e, w);
        if (why[0])
            kvt__sroom_fail(e, r, code, why);
        r->pending--;
        kvt__sroom_check(e, r);
        return 0;
    }
    struct ibv_send_wr *bad = NULL;
    int rc = ibv_post_send(q->qp, wrs, &bad);
    /* The WRs before `bad` were posted and will complete (or flush). */
    uint32_t posted = rc ? (uint32_t)(bad - wrs) : w->nent;
    backlog_pop(p, w);
    if (posted) {
        w->in_batch = 1; /* the HCA writes our memory until the last WC */
        w->vleft = posted;
        r->in_kernel++;
        r->wc.posted += posted;
        q->sq_used += posted;
    }
    if (rc) {
        w->acked = 1; /* failed: no success is counted for it */
        if (!posted) {
            r->pending++;
            kvt__wr_release(e, w);
            r->pending--;
        }
        kvt__peer_fail(e, p, rc, "ibv_post_send (RDMA READ) to peer %s: %s", p->sid, strerror(rc));
        return -1;
    }
    return 0;
}

/* Post p's backlog as RDMA WRITEs (READ requests as RDMA READs) while its
 * QP has room. */
void kvt__verbs_pump(kvt_engine *e, kvt_peer *p)
{
    kvt__vqp *q = p->vqp;
    if (!q || !q->up)
        return;
    while (p->bl_head && q->sq_used < KVT_VQP_SQ) {
        kvt__wr *w = p->bl_head;
        if (w->rbytes) { /* a READ request: one RDMA READ per run */
            if (q->sq_used + w->nent > KVT_VQP_SQ)
                return; /* when completions make room */
            if (post_reads(e, p, q, w))
                return;
            continue;
        }
        uint64_t raddr = kvt__get64(w->hdr + 32);
        uint64_t laddr = (uint64_t)(uintptr_t)w->payload;
        /* Checked at submit; checked again because regions may have been
         * deregistered or replaced (a new descriptor) since. */
        kvt__region *lr = kvt__region_find(e, laddr, w->plen);
        kvt__rregion *rr = peer_region(p, raddr, w->plen);
        bool bad = !lr || !lr->mr || !rr || w->nsiov;
        if (bad || w->room->failed) {
            /* Never posted: off the backlog, then the room fails (once). */
            kvt__sroom *r = w->room;
            char why[KVC_REASON_MAX + 1];
            if (w->nsiov) /* queued as a TCP WRITEV before a descriptor made the peer verbs */
                kvt__str(why, sizeof why,
                         "RDMA WRITE of room %llu to peer %s refused before posting: queued for "
                         "the TCP path before the peer's descriptor switched it to verbs",
                         (unsigned long long)r->room, p->sid);
            else
                kvt__str(why, sizeof why,
                         "RDMA WRITE of room %llu to peer %s refused before posting: %s range "
                         "[0x%llx, +%u) is not inside a registered region",
                         (unsigned long long)r->room, p->sid,
                         bad && lr && lr->mr ? "remote" : "local",
                         (unsigned long long)(lr && lr->mr ? raddr : laddr), w->plen);
            p->bl_head = w->next;
            if (!p->bl_head)
                p->bl_tail = NULL;
            w->next = NULL;
            w->in_q = 0;
            r->pending++; /* keep r across the release */
            kvt__wr_release(e, w);
            if (bad)
                kvt__sroom_fail(e, r, EFAULT, why);
            r->pending--;
            kvt__sroom_check(e, r);
            continue;
        }
        struct ibv_sge sge = {
            .addr = laddr, .length = w->plen, .lkey = ((struct ibv_mr *)lr->mr)->lkey};
        struct ibv_send_wr wr = {.wr_id = kvt__wrid(w, KVT_WRID_DATA),
                                 .sg_list = &sge,
                                 .num_sge = 1,
                                 .opcode = IBV_WR_RDMA_WRITE,
                                 .send_flags = IBV_SEND_SIGNALED};
        wr.wr.rdma.remote_addr = raddr;
        wr.wr.rdma.rkey = rr->rkey;
        struct ibv_send_wr *bad_wr;
        if (ibv_post_send(q->qp, &wr, &bad_wr)) {
            kvt__peer_fail(e, p, errno ? errno : EIO, "ibv_post_send (RDMA WRITE) to peer %s: %s",
                           p->sid, strerror(errno ? errno : EIO));
            return;
        }
        p->bl_head = w->next;
        if (!p->bl_head)
            p->bl_tail = NULL;
        w->next = NULL;
        w->in_q = 0;
        w->in_batch = 1; /* the HCA reads our memory until its WC */
        w->room->in_kernel++;
        w->room->wc.posted++;
        q->sq_used++;
    }
}

/* Every WRITE of closed room r completed: tell the receiver with a SEND
 * (inline: no buffer of ours is referenced). */
void kvt__verbs_notify(kvt_engine *e, kvt__sroom *r)
{
    kvt_peer *p = r->peer;
    kvt__vqp *q = p->vqp;
    if (!q || !q->up || q->sq_used >= KVT_VQP_SQ)
        return; /* called again from the pump */
    uint8_t note[KVT_NOTE_LEN];
    kvt__note_encode(r->room, r->writes, r->bytes, note);
    struct ibv_sge sge = {.addr = (uint64_t)(uintptr_t)note, .length = KVT_NOTE_LEN, .lkey = 0};
    struct ibv_send_wr wr = {.wr_id = kvt__wrid(r, KVT_WRID_NOTIFY),
                             .sg_list = &sge,
                             .num_sge = 1,
                             .opcode = IBV_WR_SEND,
                             .send_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE};
    struct ibv_send_wr *bad;
    if (ibv_post_send(q->qp, &wr, &bad)) {
        kvt__peer_fail(e, p, errno ? errno : EIO, "ibv_post_send (end of room) to peer %s: %s",
                       p->sid, strerror(errno ? errno : EIO));
        return;
    }
    r->done_sent = true;
    r->pending++; /* r stays until the SEND's completion */
    r->wc.posted++;
    q->sq_used++;
}

/* ---- completions ------------------------------------------------------------------- */

static kvt__vqp *vqp_by_num(kvt_engine *e, uint32_t qpn)
{
    for (kvt__vqp *q = e->verbs->qps; q; q = q->next)
        if (q->qp->qp_num == qpn)
            return q;
    return NULL;
}

/* A send-side WC failed for room r: the first one fails the room and the
 * peer (the QP is in the error state); flushes and later ones are noise. */
static void send_wc_failed(kvt_engine *e, kvt__vqp *q, kvt__sroom *r, const struct ibv_wc *wc,
                           uint32_t len, const char *what)
{
    char why[KVC_REASON_MAX + 1];
    int k = kvt__wc_note(&r->wc, (int)wc->status, wc->vendor_err, len, what, r->peer->sid, why,
                         sizeof why);
    if (k == KVT_WC_FIRST_FAIL) {
        kvt__sroom_fail(e, r, (int32_t)wc->status, why);
        if (q->peer && q->peer->vqp == q)
            kvt__peer_fail(e, q->peer, (int32_t)wc->status, "%s", why);
    } else if (q->peer && q->peer->vqp == q) {
        /* A flush with no recorded cause (no failed WC, no async event
         * yet): the QP is in the error state all the same. */
        kvt__peer_fail(e, q->peer, (int32_t)wc->status,
                       "RDMA QP %u to peer %s flushed its work (%s)", q->qp->qp_num, q->peer->sid,
                       ibv_wc_status_str(wc->status));
    }
}

/* A WC of one RDMA READ of request w: the request is done when every one
 * of its READs completed; a failed one fails the room (and the peer). */
static void on_read_wc(kvt_engine *e, kvt__vqp *q, kvt__wr *w, const struct ibv_wc *wc)
{
    kvt__sroom *r = w->room;
    r->pending++; /* keep r across the failure and the release */
    if (wc->status == IBV_WC_SUCCESS) {
        kvt__wc_note(&r->wc, IBV_WC_SUCCESS, 0, wc->byte_len, "RDMA READ", r->peer->sid, NULL, 0);
    } else {
        w->acked = 1;
        send_wc_failed(e, q, r, wc, 0, "RDMA READ");
    }
    if (--w->vleft == 0) {
        w->in_batch = 0;
        r->in_kernel--;
        if (!w->acked && !r->failed) {
            r->acked_writes++;
            r->acked_bytes += w->rbytes;
            e->st.reads_done++;
            e->st.bytes_read += w->rbytes;
        }
        kvt__wr_release(e, w);
    }
    r->pending--;
    kvt__sroom_check(e, r);
}

static void on_send_wc(kvt_engine *e, kvt__vqp *q, const struct ibv_wc *wc)
{
    q->sq_used--;
    if (kvt__wrid_tag(wc->wr_id) == KVT_WRID_NOTIFY) {
        kvt__sroom *r = kvt__wrid_ptr(wc->wr_id);
        if (wc->status == IBV_WC_SUCCESS) {
            kvt__wc_note(&r->wc, IBV_WC_SUCCESS, 0, 0, "SEND", r->peer->sid, NULL, 0);
            if (!r->finished && !r->failed) {
                r->finished = true;
                kvt__seg_success(e, r->room);
                kvt_event ev = {.room = r->room,
                                .side = KVT_SIDE_SENDER,
                                .state = KVC_POLL_SUCCESS,
                                .bytes = r->acked_bytes};
                kvt__str(ev.peer, sizeof ev.peer, "%s", r->peer->sid);
                kvt__push_event(e, &ev);
            }
        } else {
            send_wc_failed(e, q, r, wc, 0, "SEND (end of room)");
        }
        r->pending--;
        kvt__sroom_check(e, r);
        return;
    }
    kvt__wr *w = kvt__wrid_ptr(wc->wr_id);
    kvt__sroom *r = w->room;
    if (kvt__wrid_tag(wc->wr_id) == KVT_WRID_READ) {
        on_read_wc(e, q, w, wc);
        return;
    }
    w->in_batch = 0;
    r->in_kernel--;
    if (wc->status == IBV_WC_SUCCESS) {
        kvt__wc_note(&r->wc, IBV_WC_SUCCESS, 0, w->plen, "RDMA WRITE", r->peer->sid, NULL, 0);
        r->acked_writes++;
        r->acked_bytes += w->plen;
        r->peer->bytes_sent += w->plen;
        e->st.writes_sent++;
        e->st.bytes_sent += w->plen;
        kvt__wr_release(e, w); /* may send the room's note */
    } else {
        /* Fail first, release after: releasing the last write of a closed
         * room that has not failed yet would post its end-of-room note. */
        r->pending++; /* keep r across both */
        send_wc_failed(e, q, r, wc, 0, "RDMA WRITE");
        kvt__wr_release(e, w);
        r->pending--;
        kvt__sroom_check(e, r);
    }
}

/* Connection c closes: the QP it set up goes with it. */
void kvt__verbs_conn_closed(kvt_engine *e, kvt__conn *c)
{
    if (c->client && c->peer && c->peer->vqp && c->peer->vqp->conn_id == c->id)
        kvt__verbs_peer_down(e, c->peer);
    else if (!c->client && c->rpeer && c->rpeer->vqp && c->rpeer->vqp->conn_id == c->id)
        kvt__verbs_rpeer_down(e, c->rpeer);
}

static void on_recv_wc(kvt_engine *e, kvt__vqp *q, const struct ibv_wc *wc)
{
    q->rq_posted--;
    uint32_t slot = q->rq_head;
    q->rq_head = (q->rq_head + 1) % KVT_VQP_RQ;
    if (wc->status != IBV_WC_SUCCESS) {
        if (wc->status != IBV_WC_WR_FLUSH_ERR && q->rpeer) {
            char why[KVC_REASON_MAX + 1];
            kvt__str(why, sizeof why,
                     "RDMA receive from peer %s failed: %s (WC status %d, vendor error 0x%x)",
                     q->rpeer->sid, ibv_wc_status_str(wc->status), (int)wc->status, wc->vendor_err);
            kvt__rx_fail_rpeer_rooms(e, q->rpeer, (int32_t)wc->status, why);
            kvt__verbs_rpeer_down(e, q->rpeer);
        }
        return;
    }
    uint64_t room, writes, bytes;
    const uint8_t *b = q->rbuf + (size_t)slot * KVT_VQP_RBUF;
    if (q->rpeer && !q->dead) {
        if (kvt__note_decode(b, wc->byte_len, &room, &writes, &bytes) == 0)
            kvt__rx_room_notified(e, q->rpeer, room, writes, bytes);
        else
            kvt__log(e, KVT_LOG_WARN, "peer %s: end-of-room note of %u bytes ignored",
                     q->rpeer->sid, wc->byte_len);
    }
    if (!q->dead && post_recv(q, slot))
        kvt__log(e, KVT_LOG_WARN, "ibv_post_recv: %s", strerror(errno));
}

static void on_wc(kvt_engine *e, const struct ibv_wc *wc)
{
    kvt__vqp *q = vqp_by_num(e, wc->qp_num);
    if (!q)
        return; /* cannot happen: a QP is destroyed only once drained */
    /* On an error WC only wr_id, status, qp_num and vendor_err are valid:
     * the wr_id's tag says what the work request was. */
    if (kvt__wrid_tag(wc->wr_id) == KVT_WRID_RECV)
        on_recv_wc(e, q, wc);
    else
        on_send_wc(e, q, wc);
    vqp_free_if_flushed(e, q);
}

static void poll_cq(kvt_engine *e)
{
    struct ibv_wc wc[32];
    int n, total = 0;
    while (e->verbs && (n = ibv_poll_cq(e->verbs->cq, 32, wc)) > 0) {
        total += n;
        for (int i = 0; i < n; i++)
            on_wc(e, &wc[i]);
    }
    if (!total)
        return;
    /* Send queues have room again: post more of the backlogs, and the
     * end-of-room notes that were waiting for room. */
    for (size_t i = 0; i < e->npeers; i++) {
        kvt_peer *p = e->peers[i];
        if (p->verbs && p->vqp && p->vqp->up && (p->bl_head || p->rooms))
            kvt__peer_pump(e, p);
    }
}

/* The completion channel is readable: take its events, re-arm the CQ
 * notification, then poll -- in this order, or a completion arriving
 * between the poll and the re-arm would raise no event. */
static void on_cq_event(kvt_engine *e)
{
    struct kvt__verbs *v = e->verbs;
    struct ibv_cq *cq;
    void *ctx;
    unsigned n = 0;
    while (ibv_get_cq_event(v->chan, &cq, &ctx) == 0)
        n++;
    if (n)
        ibv_ack_cq_events(v->cq, n);
    if (ibv_req_notify_cq(v->cq, 0))
        kvt__log(e, KVT_LOG_ERROR, "ibv_req_notify_cq: %s", strerror(errno));
    poll_cq(e);
}

static void fail_everything(kvt_engine *e, int32_t code, const char *why)
{
    for (size_t i = 0; i < e->npeers; i++)
        if (e->peers[i]->verbs)
            kvt__peer_fail(e, e->peers[i], code, "%s", why);
    for (kvt__rpeer *rp = e->rpeers; rp; rp = rp->next)
        if (rp->vqp) {
            kvt__rx_fail_rpeer_rooms(e, rp, code, why);
            kvt__verbs_rpeer_down(e, rp);
        }
}

static void on_async_event(kvt_engine *e)
{
    struct kvt__verbs *v = e->verbs;
    struct ibv_async_event ev;
    while (ibv_get_async_event(v->ctx, &ev) == 0) {
        enum ibv_event_type t = ev.event_type;
        int cls = kvt__async_classify(t);
        char why[KVC_REASON_MAX + 1];
        if (cls == KVT_ASYNC_QP_FATAL) {
            kvt__vqp *q = ev.element.qp ? ev.element.qp->qp_context : NULL;
            if (q && q->peer && q->peer->vqp == q) {
                kvt__str(why, sizeof why, "RDMA QP %u to peer %s: %s", q->qp->qp_num, q->peer->sid,
                         ibv_event_type_str(t));
                kvt__peer_fail(e, q->peer, EIO, "%s", why);
            } else if (q && q->rpeer) {
                kvt__str(why, sizeof why, "RDMA QP %u from peer %s: %s", q->qp->qp_num,
                         q->rpeer->sid, ibv_event_type_str(t));
                kvt__log(e, KVT_LOG_WARN, "%s", why);
                kvt__rx_fail_rpeer_rooms(e, q->rpeer, EIO, why);
                kvt__verbs_rpeer_down(e, q->rpeer);
            }
        } else if (cls == KVT_ASYNC_DEVICE_FATAL) {
            kvt__str(why, sizeof why, "RDMA device %s: %s", v->dev, ibv_event_type_str(t));
            kvt__log(e, KVT_LOG_ERROR, "%s: every RDMA room fails", why);
            v->dead = true;
            kvt__str(v->dead_why, sizeof v->dead_why, "%s", ibv_event_type_str(t));
            fail_everything(e, ENODEV, why);
        } else {
            kvt__log(e, KVT_LOG_INFO, "RDMA device %s: async event %s", v->dev,
                     ibv_event_type_str(t));
        }
        ibv_ack_async_event(&ev);
    }
}

/* POLL_ADD on the completion channel and the async event fd, when not
 * already in flight (one-shot: re-armed after each CQE). */
void kvt__verbs_arm(kvt_engine *e)
{
    struct kvt__verbs *v = e->verbs;
    if (!v)
        return;
    if (!v->cq_armed) {
        struct io_uring_sqe *s = kvt__sqe(e);
        if (!s)
            return;
        io_uring_prep_poll_add(s, v->chan->fd, POLLIN);
        io_uring_sqe_set_data64(s, KVT_UD(KVT_OP_VERBS_CQ, 0));
        v->cq_armed = true;
    }
    if (!v->async_armed) {
        struct io_uring_sqe *s = kvt__sqe(e);
        if (!s)
            return;
        io_uring_prep_poll_add(s, v->ctx->async_fd, POLLIN);
        io_uring_sqe_set_data64(s, KVT_UD(KVT_OP_VERBS_ASYNC, 0));
        v->async_armed = true;
    }
}

void kvt__verbs_cqe(kvt_engine *e, struct io_uring_cqe *cqe)
{
    struct kvt__verbs *v = e->verbs;
    if (!v)
        return;
    if (KVT_UD_OP(cqe->user_data) == KVT_OP_VERBS_CQ) {
        v->cq_armed = false;
        on_cq_event(e);
    } else {
        v->async_armed = false;
        on_async_event(e);
    }
}

bool kvt__verbs_busy(kvt_engine *e)
{
    if (!e->verbs)
        return false;
    poll_cq(e); /* while draining, do not depend on the channel */
    for (kvt__vqp *q = e->verbs->qps; q; q = q->next)
        if (q->sq_used || (q->dead && q->rq_posted))
            return true;
    return false;
}

void kvt__verbs_free_qps(kvt_engine *e)
{
    while (e->verbs && e->verbs->qps)
        vqp_destroy(e, e->verbs->qps);
    for (size_t i = 0; i < e->npeers; i++)
        e->peers[i]->vqp = NULL;
    for (kvt__rpeer *rp = e->rpeers; rp; rp = rp->next)
        rp->vqp = NULL;
}
