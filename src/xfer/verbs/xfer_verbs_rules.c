/*
 * xfer_verbs_rules.c - the verbs backend's pure logic: the QP record, the
 * QP transitions' attributes, a room's WC bookkeeping, async event
 * classification, the end-of-room note.  See xfer_verbs_rules.h.
 */
#include <stdio.h>
#include <string.h>

#include "xfer_frame.h"
#include "xfer_verbs_rules.h"

void kvt__qp_rec_encode(const kvt__qp_rec *r, uint8_t out[KVT_QPREC_LEN])
{
    memset(out, 0, KVT_QPREC_LEN);
    out[0] = KVT_QPREC_VERSION;
    out[1] = r->mtu;
    out[2] = r->is_roce ? 1 : 0;
    out[3] = r->rd_atom;
    kvt__put32(out + 4, r->qpn);
    kvt__put32(out + 8, r->psn);
    out[12] = (uint8_t)r->lid;
    out[13] = (uint8_t)(r->lid >> 8);
    out[14] = (uint8_t)r->gid_index;
    out[15] = (uint8_t)(r->gid_index >> 8);
    memcpy(out + 16, r->gid, 16);
}

static bool gid_zero(const uint8_t g[16])
{
    for (int i = 0; i < 16; i++)
        if (g[i])
            return false;
    return true;
}

int kvt__qp_rec_decode(const uint8_t *b, size_t len, kvt__qp_rec *r, char *err, size_t cap)
{
    memset(r, 0, sizeof *r);
    if (len != KVT_QPREC_LEN) {
        snprintf(err, cap, "QP record of %zu bytes (want %u)", len, KVT_QPREC_LEN);
        return -1;
    }
    if (b[0] != KVT_QPREC_VERSION) {
        snprintf(err, cap, "QP record version %u (want %u)", b[0], KVT_QPREC_VERSION);
        return -1;
    }
    r->mtu = b[1];
    r->is_roce = b[2];
    r->rd_atom = b[3];
    r->qpn = kvt__get32(b + 4);
    r->psn = kvt__get32(b + 8);
    r->lid = (uint16_t)(b[12] | (b[13] << 8));
    r->gid_index = (uint16_t)(b[14] | (b[15] << 8));
    memcpy(r->gid, b + 16, 16);
    if (b[2] > 1) {
        snprintf(err, cap, "QP record: reserved bits set");
        return -1;
    }
    if (r->qpn == 0 || r->qpn > 0xffffffu) {
        snprintf(err, cap, "QP record: QPN %u out of 1..0xffffff", r->qpn);
        return -1;
    }
    if (r->psn > 0xffffffu) {
        snprintf(err, cap, "QP record: PSN %u over 24 bits", r->psn);
        return -1;
    }
    if (r->mtu < IBV_MTU_256 || r->mtu > IBV_MTU_4096) {
        snprintf(err, cap, "QP record: MTU code %u out of 1..5 (256..4096 bytes)", r->mtu);
        return -1;
    }
    if (r->is_roce && gid_zero(r->gid)) {
        snprintf(err, cap, "QP record: RoCE peer without a GID");
        return -1;
    }
    if (!r->is_roce && r->lid == 0) {
        snprintf(err, cap, "QP record: InfiniBand peer with LID 0");
        return -1;
    }
    return 0;
}

void kvt__qp_init_attr(const kvt__qp_local *l, struct ibv_qp_attr *a, int *mask)
{
    memset(a, 0, sizeof *a);
    a->qp_state = IBV_QPS_INIT;
    a->pkey_index = 0;
    a->port_num = l->port;
    a->qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
    *mask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
}

int kvt__qp_rtr_attr(const kvt__qp_local *l, const kvt__qp_rec *p, struct ibv_qp_attr *a, int *mask,
                     char *err, size_t cap)
{
    memset(a, 0, sizeof *a);
    *mask = 0;
    if ((bool)p->is_roce != l->is_roce) {
        snprintf(err, cap, "link layers differ: peer %s, this engine %s",
                 p->is_roce ? "Ethernet (RoCE)" : "InfiniBand",
                 l->is_roce ? "Ethernet (RoCE)" : "InfiniBand");
        return -1;
    }
    if (p->qpn == 0 || p->qpn > 0xffffffu || p->psn > 0xffffffu ||
        (p->is_roce ? gid_zero(p->gid) : p->lid == 0)) {
        snprintf(err, cap, "peer QP record invalid (QPN %u, PSN %u, LID %u)", p->qpn, p->psn,
                 p->lid);
        return -1;
    }
    if (l->is_roce && l->gid_index < 0) {
        snprintf(err, cap, "no local GID index for RoCE");
        return -1;
    }
    a->qp_state = IBV_QPS_RTR;
    a->path_mtu = (enum ibv_mtu)(p->mtu < l->active_mtu ? p->mtu : l->active_mtu);
    a->dest_qp_num = p->qpn;
    a->rq_psn = p->psn;
    a->max_dest_rd_atomic = l->resp_depth ? l->resp_depth : 1;
    a->min_rnr_timer = KVT_QP_MIN_RNR_TIMER;
    a->ah_attr.port_num = l->port;
    a->ah_attr.sl = 0;
    a->ah_attr.src_path_bits = 0;
    if (l->is_roce) {
        /* RoCE has no LIDs: every packet carries a GRH addressed by GID. */
        a->ah_attr.is_global = 1;
        memcpy(a->ah_attr.grh.dgid.raw, p->gid, 16);
        a->ah_attr.grh.sgid_index = (uint8_t)l->gid_index;
        a->ah_attr.grh.hop_limit = 64;
        a->ah_attr.grh.flow_label = 0;
        a->ah_attr.grh.traffic_class = 0;
    } else {
        a->ah_attr.is_global = 0;
        a->ah_attr.dlid = p->lid;
    }
    *mask = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
            IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
    return 0;
}

void kvt__qp_rts_attr(const kvt__qp_local *l, struct ibv_qp_attr *a, int *mask)
{
    memset(a, 0, sizeof *a);
    a->qp_state = IBV_QPS_RTS;
    a->sq_psn = l->psn & 0xffffffu;
    a->timeout = KVT_QP_TIMEOUT;
    a->retry_cnt = KVT_QP_RETRY;
    a->rnr_retry = KVT_QP_RNR_RETRY;
    uint8_t peer = l->peer_resp_depth ? l->peer_resp_depth : 1;
    a->max_rd_atomic = l->init_depth < peer ? l->init_depth : peer;
    *mask = IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
            IBV_QP_MAX_QP_RD_ATOMIC;
}

static uint8_t clamp_depth(int v) { return v <= 0 ? 0 : v > 255 ? 255 : (uint8_t)v; }

void kvt__qp_rd_depths(int max_qp_init_rd_atom, int max_qp_rd_atom, kvt__qp_local *l)
{
    l->init_depth = clamp_depth(max_qp_init_rd_atom);
    l->resp_depth = clamp_depth(max_qp_rd_atom);
}

int kvt__qp_read_ok(const kvt__qp_local *l, char *err, size_t cap)
{
    if (l->init_depth)
        return 0;
    snprintf(err, cap, "the RDMA device cannot initiate RDMA READ (max_qp_init_rd_atom 0)");
    return -1;
}

int kvt__wc_note(kvt__wc_tally *t, int status, uint32_t vendor_err, uint64_t bytes,
                 const char *what, const char *peer, char *reason, size_t cap)
{
    t->completed++;
    if (status == IBV_WC_SUCCESS) {
        t->ok_bytes += bytes;
        return KVT_WC_OK;
    }
    /* A flush only says the QP was already in the error state: the cause
     * is another completion or an async event, recorded there. */
    if (status == IBV_WC_WR_FLUSH_ERR || t->failed)
        return KVT_WC_NOISE;
    t->failed = true;
    t->status = status;
    snprintf(reason, cap, "%s to peer %s failed: %s (WC status %d, vendor error 0x%x)", what, peer,
             ibv_wc_status_str((enum ibv_wc_status)status), status, vendor_err);
    return KVT_WC_FIRST_FAIL;
}

int kvt__async_classify(enum ibv_event_type t)
{
    switch (t) {
    case IBV_EVENT_QP_FATAL:
    case IBV_EVENT_QP_REQ_ERR:
    case IBV_EVENT_QP_ACCESS_ERR:
    case IBV_EVENT_PATH_MIG_ERR: return KVT_ASYNC_QP_FATAL;
    case IBV_EVENT_DEVICE_FATAL:
    case IBV_EVENT_CQ_ERR: /* our one CQ overran or broke: every QP on it is lost */
        return KVT_ASYNC_DEVICE_FATAL;
    default:
        /* PORT_ERR included: in-flight work fails through its WCs (retry
         * exceeded), and the port may come back (PORT_ACTIVE). */
        return KVT_ASYNC_INFO;
    }
}

void kvt__note_encode(uint64_t room, uint64_t writes, uint64_t bytes, uint8_t out[KVT_NOTE_LEN])
{
    kvt__put64(out, room);
    kvt__put64(out + 8, writes);
    kvt__put64(out + 16, bytes);
}

int kvt__note_decode(const uint8_t *buf, size_t len, uint64_t *room, uint64_t *writes,
                     uint64_t *bytes)
{
    if (len != KVT_NOTE_LEN)
        return -1;
    *room = kvt__get64(buf);
    *writes = kvt__get64(buf + 8);
    *bytes = kvt__get64(buf + 16);
    return 0;
}
