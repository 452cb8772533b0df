/* test_xfer_verbs_dp.c - the verbs data path without a device: the QP
 * record exchanged over the control channel (encode, refusals), the
 * attributes of INIT/RTR/RTS built from a peer's record (RoCE and
 * InfiniBand), a room's WC bookkeeping (first failure wins with
 * ibv_wc_status_str and its number, flushes ignored), async event
 * classes, wr_id tags, the end-of-room note; and on the wire: QP_INFO sent
 * to an engine without a device is refused with the reason, a verbs
 * descriptor seen by a TCP engine is served over TCP. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include "testutil.h"
#include "xfer_internal.h"
#include "xfer_util.h"
#include "xfer_verbs_rules.h"

static kvt__qp_rec roce_rec(void)
{
    kvt__qp_rec r;
    memset(&r, 0, sizeof r);
    r.qpn = 0x1234;
    r.psn = 0xabcdef;
    inet_pton(AF_INET6, "::ffff:10.0.0.7", r.gid);
    r.mtu = IBV_MTU_1024;
    r.is_roce = 1;
    r.gid_index = 3;
    r.rd_atom = 16;
    return r;
}

static void test_qp_rec_roundtrip(void **state)
{
    (void)state;
    kvt__qp_rec r = roce_rec(), d;
    uint8_t b[KVT_QPREC_LEN];
    char err[200];
    kvt__qp_rec_encode(&r, b);
    assert_int_equal(kvt__qp_rec_decode(b, sizeof b, &d, err, sizeof err), 0);
    assert_int_equal(d.qpn, 0x1234);
    assert_int_equal(d.psn, 0xabcdef);
    assert_int_equal(d.mtu, IBV_MTU_1024);
    assert_int_equal(d.is_roce, 1);
    assert_int_equal(d.gid_index, 3);
    assert_int_equal(d.rd_atom, 16);
    assert_memory_equal(d.gid, r.gid, 16);
    /* InfiniBand: a LID, no GID needed. */
    kvt__qp_rec ib = {.qpn = 7, .psn = 1, .lid = 0x11, .mtu = IBV_MTU_4096};
    kvt__qp_rec_encode(&ib, b);
    assert_int_equal(kvt__qp_rec_decode(b, sizeof b, &d, err, sizeof err), 0);
    assert_int_equal(d.lid, 0x11);
    assert_int_equal(d.is_roce, 0);
}

static void expect_refused(const kvt__qp_rec *r, const char *why)
{
    uint8_t b[KVT_QPREC_LEN];
    kvt__qp_rec d;
    char err[200] = "";
    kvt__qp_rec_encode(r, b);
    assert_int_equal(kvt__qp_rec_decode(b, sizeof b, &d, err, sizeof err), -1);
    if (!strstr(err, why))
        fail_msg("\"%s\" lacks \"%s\"", err, why);
}

static void test_qp_rec_refusals(void **state)
{
    (void)state;
    kvt__qp_rec r = roce_rec();
    uint8_t b[KVT_QPREC_LEN + 1];
    kvt__qp_rec d;
    char err[200];
    kvt__qp_rec_encode(&r, b);
    assert_int_equal(kvt__qp_rec_decode(b, KVT_QPREC_LEN - 1, &d, err, sizeof err), -1);
    assert_non_null(strstr(err, "bytes"));
    assert_int_equal(kvt__qp_rec_decode(b, KVT_QPREC_LEN + 1, &d, err, sizeof err), -1);
    b[0] = 2;
    assert_int_equal(kvt__qp_rec_decode(b, KVT_QPREC_LEN, &d, err, sizeof err), -1);
    assert_non_null(strstr(err, "version 2"));
    kvt__qp_rec_encode(&r, b);
    b[2] = 2; /* is_roce is 0 or 1 (byte 3 is rd_atom, any value) */
    assert_int_equal(kvt__qp_rec_decode(b, KVT_QPREC_LEN, &d, err, sizeof err), -1);
    assert_non_null(strstr(err, "reserved"));
    kvt__qp_rec x = r;
    x.qpn = 0;
    expect_refused(&x, "QPN 0");
    x = r;
    x.qpn = 0x1000000;
    expect_refused(&x, "QPN");
    x = r;
    x.psn = 0x1000000;
    expect_refused(&x, "PSN");
    x = r;
    x.mtu = 0;
    expect_refused(&x, "MTU code 0");
    x.mtu = 6;
    expect_refused(&x, "MTU code 6");
    x = r;
    memset(x.gid, 0, 16);
    expect_refused(&x, "RoCE peer without a GID");
    x = r;
    x.is_roce = 0;
    x.lid = 0;
    expect_refused(&x, "LID 0");
}

static void test_qp_attrs_roce(void **state)
{
    (void)state;
    kvt__qp_local l = {
        .port = 1, .gid_index = 5, .is_roce = true, .active_mtu = IBV_MTU_4096, .psn = 0x123456};
    kvt__qp_rec p = roce_rec();
    struct ibv_qp_attr a;
    int mask;
    char err[200];

    kvt__qp_init_attr(&l, &a, &mask);
    assert_int_equal(a.qp_state, IBV_QPS_INIT);
    assert_int_equal(a.port_num, 1);
    assert_true(a.qp_access_flags & IBV_ACCESS_REMOTE_WRITE);
    assert_int_equal(mask, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);

    assert_int_equal(kvt__qp_rtr_attr(&l, &p, &a, &mask, err, sizeof err), 0);
    assert_int_equal(a.qp_state, IBV_QPS_RTR);
    assert_int_equal(a.path_mtu, IBV_MTU_1024); /* the smaller of both */
    assert_int_equal(a.dest_qp_num, 0x1234);
    assert_int_equal(a.rq_psn, 0xabcdef);
    assert_int_equal(a.ah_attr.is_global, 1);
    assert_memory_equal(a.ah_attr.grh.dgid.raw, p.gid, 16);
    assert_int_equal(a.ah_attr.grh.sgid_index, 5);
    assert_int_equal(a.ah_attr.grh.hop_limit, 64);
    assert_int_equal(a.ah_attr.port_num, 1);
    assert_true(mask & IBV_QP_AV);
    assert_true(mask & IBV_QP_DEST_QPN);
    assert_true(mask & IBV_QP_RQ_PSN);
    assert_true(mask & IBV_QP_PATH_MTU);
    assert_true(mask & IBV_QP_MAX_DEST_RD_ATOMIC);
    assert_true(mask & IBV_QP_MIN_RNR_TIMER);

    p.mtu = IBV_MTU_4096;
    l.active_mtu = IBV_MTU_2048;
    assert_int_equal(kvt__qp_rtr_attr(&l, &p, &a, &mask, err, sizeof err), 0);
    assert_int_equal(a.path_mtu, IBV_MTU_2048);

    kvt__qp_rts_attr(&l, &a, &mask);
    assert_int_equal(a.qp_state, IBV_QPS_RTS);
    assert_int_equal(a.sq_psn, 0x123456);
    assert_int_equal(a.timeout, KVT_QP_TIMEOUT);
    assert_int_equal(a.retry_cnt, KVT_QP_RETRY);
    assert_int_equal(a.rnr_retry, KVT_QP_RNR_RETRY);
    assert_true(mask & IBV_QP_SQ_PSN);
    assert_true(mask & IBV_QP_RETRY_CNT);
}

/* RDMA READ: remote read granted at INIT, the depths from the device's
 * attributes (responder resources at RTR, initiator depth at RTS bounded
 * by the peer's responder resources), a device that cannot initiate READs
 * refused with a reason. */
static void test_qp_read_depths(void **state)
{
    (void)state;
    kvt__qp_local l = {
        .port = 1, .gid_index = 5, .is_roce = true, .active_mtu = IBV_MTU_4096, .psn = 1};
    kvt__qp_rd_depths(16, 8, &l);
    assert_int_equal(l.init_depth, 16);
    assert_int_equal(l.resp_depth, 8);
    struct ibv_qp_attr a;
    int mask;
    char err[200];
    kvt__qp_init_attr(&l, &a, &mask);
    assert_true(a.qp_access_flags & IBV_ACCESS_REMOTE_READ);
    assert_true(a.qp_access_flags & IBV_ACCESS_REMOTE_WRITE);
    kvt__qp_rec p = roce_rec();
    assert_int_equal(kvt__qp_rtr_attr(&l, &p, &a, &mask, err, sizeof err), 0);
    assert_int_equal(a.max_dest_rd_atomic, 8);
    assert_true(mask & IBV_QP_MAX_DEST_RD_ATOMIC);
    l.peer_resp_depth = 4; /* the peer serves 4 at once: no more in flight */
    kvt__qp_rts_attr(&l, &a, &mask);
    assert_int_equal(a.max_rd_atomic, 4);
    assert_true(mask & IBV_QP_MAX_QP_RD_ATOMIC);
    l.peer_resp_depth = 64; /* ours is the bound */
    kvt__qp_rts_attr(&l, &a, &mask);
    assert_int_equal(a.max_rd_atomic, 16);
    l.peer_resp_depth = 0; /* an engine older than READ: 1 */
    kvt__qp_rts_attr(&l, &a, &mask);
    assert_int_equal(a.max_rd_atomic, 1);
    assert_int_equal(kvt__qp_read_ok(&l, err, sizeof err), 0);
    kvt__qp_rd_depths(1000, -3, &l); /* clamped */
    assert_int_equal(l.init_depth, 255);
    assert_int_equal(l.resp_depth, 0);
    assert_int_equal(kvt__qp_rtr_attr(&l, &p, &a, &mask, err, sizeof err), 0);
    assert_int_equal(a.max_dest_rd_atomic, 1); /* at least one */
    kvt__qp_rd_depths(0, 16, &l);
    l.peer_resp_depth = 16;
    kvt__qp_rts_attr(&l, &a, &mask);
    assert_int_equal(a.max_rd_atomic, 0);
    assert_int_equal(kvt__qp_read_ok(&l, err, sizeof err), -1);
    assert_non_null(strstr(err, "cannot initiate RDMA READ"));
    /* The record carries the responder depth. */
    uint8_t b[KVT_QPREC_LEN];
    kvt__qp_rec d;
    p.rd_atom = 8;
    kvt__qp_rec_encode(&p, b);
    assert_int_equal(b[3], 8);
    assert_int_equal(kvt__qp_rec_decode(b, sizeof b, &d, err, sizeof err), 0);
    assert_int_equal(d.rd_atom, 8);
    /* wr_id tags: four kinds in the low bits of an aligned pointer. */
    static _Alignas(16) char obj[16];
    assert_int_equal(kvt__wrid_tag(kvt__wrid(obj, KVT_WRID_READ)), KVT_WRID_READ);
    assert_ptr_equal(kvt__wrid_ptr(kvt__wrid(obj, KVT_WRID_READ)), obj);
}

static void test_qp_attrs_ib_and_mismatch(void **state)
{
    (void)state;
    kvt__qp_local l = {
        .port = 2, .gid_index = 0, .is_roce = false, .active_mtu = IBV_MTU_4096, .psn = 9};
    kvt__qp_rec p = {.qpn = 0x55, .psn = 4, .lid = 0x21, .mtu = IBV_MTU_4096};
    struct ibv_qp_attr a;
    int mask;
    char err[200];
    assert_int_equal(kvt__qp_rtr_attr(&l, &p, &a, &mask, err, sizeof err), 0);
    assert_int_equal(a.ah_attr.is_global, 0);
    assert_int_equal(a.ah_attr.dlid, 0x21);
    assert_int_equal(a.ah_attr.port_num, 2);
    /* A RoCE peer for an InfiniBand port, and the reverse. */
    kvt__qp_rec r = roce_rec();
    assert_int_equal(kvt__qp_rtr_attr(&l, &r, &a, &mask, err, sizeof err), -1);
    assert_non_null(strstr(err, "link layers differ"));
    assert_int_equal(mask, 0);
    l.is_roce = true;
    assert_int_equal(kvt__qp_rtr_attr(&l, &p, &a, &mask, err, sizeof err), -1);
    assert_non_null(strstr(err, "link layers differ"));
    /* A record that the decoder would refuse is refused here too. */
    r.qpn = 0;
    assert_int_equal(kvt__qp_rtr_attr(&l, &r, &a, &mask, err, sizeof err), -1);
    assert_non_null(strstr(err, "invalid"));
}

static void test_wc_first_failure_wins(void **state)
{
    (void)state;
    kvt__wc_tally t = {.posted = 5};
    char why[256] = "";
    const char *peer = "10.0.0.5:4000";
    assert_int_equal(kvt__wc_note(&t, IBV_WC_SUCCESS, 0, 4096, "RDMA WRITE", peer, why, sizeof why),
                     KVT_WC_OK);
    /* A flush before any failure: noise, the room has no failure yet. */
    assert_int_equal(
        kvt__wc_note(&t, IBV_WC_WR_FLUSH_ERR, 0, 0, "RDMA WRITE", peer, why, sizeof why),
        KVT_WC_NOISE);
    assert_false(t.failed);
    assert_string_equal(why, "");
    assert_int_equal(
        kvt__wc_note(&t, IBV_WC_RETRY_EXC_ERR, 0x81, 0, "RDMA WRITE", peer, why, sizeof why),
        KVT_WC_FIRST_FAIL);
    assert_true(t.failed);
    assert_int_equal(t.status, IBV_WC_RETRY_EXC_ERR);
    char want[160];
    snprintf(want, sizeof want,
             "RDMA WRITE to peer 10.0.0.5:4000 failed: %s (WC status %d, vendor error 0x81)",
             ibv_wc_status_str(IBV_WC_RETRY_EXC_ERR), IBV_WC_RETRY_EXC_ERR);
    assert_string_equal(why, want);
    assert_non_null(strstr(why, "retry")); /* "transport retry counter exceeded" */
    /* Later: flushes and other failures change nothing. */
    strcpy(why, "unchanged");
    assert_int_equal(
        kvt__wc_note(&t, IBV_WC_WR_FLUSH_ERR, 0, 0, "RDMA WRITE", peer, why, sizeof why),
        KVT_WC_NOISE);
    assert_int_equal(
        kvt__wc_note(&t, IBV_WC_REM_ACCESS_ERR, 0, 0, "RDMA WRITE", peer, why, sizeof why),
        KVT_WC_NOISE);
    assert_string_equal(why, "unchanged");
    assert_int_equal(t.status, IBV_WC_RETRY_EXC_ERR);
    assert_int_equal(t.completed, t.posted); /* every completion is back */
    assert_int_equal(t.ok_bytes, 4096);
}

static void test_wc_access_error(void **state)
{
    (void)state;
    kvt__wc_tally t = {.posted = 1};
    char why[256];
    assert_int_equal(kvt__wc_note(&t, IBV_WC_REM_ACCESS_ERR, 0, 0, "SEND (end of room)",
                                  "[fd00::1]:9", why, sizeof why),
                     KVT_WC_FIRST_FAIL);
    assert_non_null(strstr(why, ibv_wc_status_str(IBV_WC_REM_ACCESS_ERR)));
    assert_non_null(strstr(why, "SEND (end of room) to peer [fd00::1]:9"));
}

static void test_async_classes(void **state)
{
    (void)state;
    assert_int_equal(kvt__async_classify(IBV_EVENT_QP_FATAL), KVT_ASYNC_QP_FATAL);
    assert_int_equal(kvt__async_classify(IBV_EVENT_QP_REQ_ERR), KVT_ASYNC_QP_FATAL);
    assert_int_equal(kvt__async_classify(IBV_EVENT_QP_ACCESS_ERR), KVT_ASYNC_QP_FATAL);
    assert_int_equal(kvt__async_classify(IBV_EVENT_PATH_MIG_ERR), KVT_ASYNC_QP_FATAL);
    assert_int_equal(kvt__async_classify(IBV_EVENT_DEVICE_FATAL), KVT_ASYNC_DEVICE_FATAL);
    assert_int_equal(kvt__async_classify(IBV_EVENT_CQ_ERR), KVT_ASYNC_DEVICE_FATAL);
    assert_int_equal(kvt__async_classify(IBV_EVENT_PORT_ERR), KVT_ASYNC_INFO);
    assert_int_equal(kvt__async_classify(IBV_EVENT_PORT_ACTIVE), KVT_ASYNC_INFO);
    assert_int_equal(kvt__async_classify(IBV_EVENT_COMM_EST), KVT_ASYNC_INFO);
    assert_int_equal(kvt__async_classify(IBV_EVENT_LID_CHANGE), KVT_ASYNC_INFO);
    assert_int_equal(kvt__async_classify(IBV_EVENT_SQ_DRAINED), KVT_ASYNC_INFO);
}

static void test_wrid_and_note(void **state)
{
    (void)state;
    void *p = malloc(64);
    for (int tag = KVT_WRID_DATA; tag <= KVT_WRID_RECV; tag++) {
        uint64_t id = kvt__wrid(p, tag);
        assert_int_equal(kvt__wrid_tag(id), tag);
        assert_ptr_equal(kvt__wrid_ptr(id), p);
    }
    free(p);
    uint8_t n[KVT_NOTE_LEN];
    uint64_t room, w, b;
    kvt__note_encode(0xfedcba9876543210ull, 16384, 64ull << 20, n);
    assert_int_equal(kvt__note_decode(n, sizeof n, &room, &w, &b), 0);
    assert_true(room == 0xfedcba9876543210ull);
    assert_int_equal(w, 16384);
    assert_true(b == 64ull << 20);
    assert_int_equal(kvt__note_decode(n, sizeof n - 1, &room, &w, &b), -1);
    assert_string_equal(kvt__ftype_name(KVT_F_QP_INFO), "QP_INFO");
}

/* ---- on the wire, without a device -------------------------------------------------- */

static kvt_engine *tcp_engine(void)
{
    kvt_options o;
    kvt_options_init(&o);
    o.backend = KVT_BACKEND_TCP;
    o.io_timeout_ms = 5000;
    kvt_engine *e;
    assert_int_equal(kvt_engine_create(&o, &e), KVC_OK);
    return e;
}

static void frame_out(int fd, uint8_t type, const void *payload, uint32_t len)
{
    uint8_t h[KVT_HDR_LEN];
    kvt__frame f = {.type = type, .len = len};
    kvt__frame_encode(&f, h);
    assert_int_equal(xu_write_all(fd, h, sizeof h), 0);
    if (len)
        assert_int_equal(xu_write_all(fd, payload, len), 0);
}

/* Drive e until fd has a whole frame; read it (payload NUL-terminated). */
static void frame_in(kvt_engine *e, int fd, kvt__frame *f, char *buf, size_t cap)
{
    uint8_t h[KVT_HDR_LEN];
    size_t got = 0;
    char err[160];
    for (int i = 0; i < 1000 && got < KVT_HDR_LEN; i++) {
        kvt_event ev[4];
        size_t k;
        kvt_progress(e, 5, ev, 4, &k);
        ssize_t r = recv(fd, h + got, KVT_HDR_LEN - got, MSG_DONTWAIT);
        if (r > 0)
            got += (size_t)r;
    }
    assert_int_equal(got, KVT_HDR_LEN);
    assert_int_equal(kvt__frame_decode(h, KVT_FRAME_MAX, f, err, sizeof err), 0);
    assert_true(f->len < cap);
    assert_int_equal(xu_read_all(fd, buf, f->len, 5000), 0);
    buf[f->len] = '\0';
}

/* A sender asking a TCP engine for a QP gets ERROR naming the reason. */
static void test_qp_info_to_tcp_engine(void **state)
{
    (void)state;
    kvt_engine *e = tcp_engine();
    const char *sid = kvt_session_id(e);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET,
                             .sin_port = htons((uint16_t)atoi(strrchr(sid, ':') + 1))};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    kvt__hello h;
    memset(&h, 0, sizeof h);
    h.version = KVT_PROTOCOL_VERSION;
    h.generation = 7;
    snprintf(h.session_id, sizeof h.session_id, "127.0.0.1:1");
    uint8_t b[600];
    size_t n = kvt__hello_encode(&h, b, sizeof b);
    frame_out(fd, KVT_F_HELLO, b, (uint32_t)n);
    kvt__frame f;
    char buf[4200];
    frame_in(e, fd, &f, buf, sizeof buf);
    assert_int_equal(f.type, KVT_F_HELLO_OK);
    /* A malformed record first would be refused the same way; a valid
     * one is refused because this engine has no device. */
    kvt__qp_rec r = roce_rec();
    uint8_t rb[KVT_QPREC_LEN];
    kvt__qp_rec_encode(&r, rb);
    frame_out(fd, KVT_F_QP_INFO, rb, sizeof rb);
    frame_in(e, fd, &f, buf, sizeof buf);
    assert_int_equal(f.type, KVT_F_ERROR);
    if (!strstr(buf, "RDMA QP setup: this engine runs tcp"))
        fail_msg("ERROR \"%s\"", buf);
    close(fd);
    kvt_engine_destroy(e);
}

static void test_qp_info_malformed(void **state)
{
    (void)state;
    kvt_engine *e = tcp_engine();
    const char *sid = kvt_session_id(e);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET,
                             .sin_port = htons((uint16_t)atoi(strrchr(sid, ':') + 1))};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    kvt__hello h;
    memset(&h, 0, sizeof h);
    h.version = KVT_PROTOCOL_VERSION;
    snprintf(h.session_id, sizeof h.session_id, "127.0.0.1:2");
    uint8_t b[600];
    size_t n = kvt__hello_encode(&h, b, sizeof b);
    frame_out(fd, KVT_F_HELLO, b, (uint32_t)n);
    kvt__frame f;
    char buf[4200];
    frame_in(e, fd, &f, buf, sizeof buf);
    frame_out(fd, KVT_F_QP_INFO, "short", 5);
    frame_in(e, fd, &f, buf, sizeof buf);
    assert_int_equal(f.type, KVT_F_ERROR);
    if (!strstr(buf, "QP record of 5 bytes"))
        fail_msg("ERROR \"%s\"", buf);
    close(fd);
    kvt_engine_destroy(e);
}

/* A peer whose descriptor says "verbs", imported by an engine without a
 * device: the writes go over TCP (the verbs engine serves TCP too). */
static void test_verbs_descriptor_over_tcp(void **state)
{
    (void)state;
    kvt_engine *a = tcp_engine(), *b = tcp_engine();
    size_t len = 1u << 20;
    unsigned char *src = xu_map(len), *dst = xu_map(len);
    xu_fill(src, len, 3);
    char *d;
    assert_int_equal(kvt_mr_register(a, src, len, NULL), KVC_OK);
    assert_int_equal(kvt_mr_register(b, dst, len, NULL), KVC_OK);
    assert_int_equal(kvt_descriptor_export(b, &d), KVC_OK);
    /* Rewrite b's descriptor as a verbs engine's would read. */
    char *be = strstr(d, "\"backend\":\"tcp\"");
    assert_non_null(be);
    size_t dl = strlen(d);
    char *v = malloc(dl + 128);
    snprintf(v, dl + 128,
             "%.*s\"backend\":\"verbs\",\"verbs\":{\"device\":\"mlx5_0\",\"port\":1,"
             "\"gid_index\":3,\"gid\":\"::ffff:10.0.0.7\",\"lid\":0}%s",
             (int)(be - d), d, be + strlen("\"backend\":\"tcp\""));
    kvt_peer *p;
    assert_int_equal(kvt_peer_import(a, v, strlen(v), &p), KVC_OK);
    assert_false(p->verbs);
    kvt_run run = {(uint64_t)(uintptr_t)src, (uint64_t)(uintptr_t)dst, len};
    assert_int_equal(kvt_submit(a, p, 11, &run, 1, 0), KVC_OK);
    int sender = 0, receiver = 0;
    for (int i = 0; i < 2000 && !(sender && receiver); i++) {
        kvt_event ev[4];
        size_t k;
        kvt_progress(b, 0, ev, 4, &k);
        for (size_t j = 0; j < k; j++)
            receiver = ev[j].state == KVC_POLL_SUCCESS ? 1 : -1;
        kvt_progress(a, 5, ev, 4, &k);
        for (size_t j = 0; j < k; j++)
            sender = ev[j].state == KVC_POLL_SUCCESS ? 1 : -1;
    }
    assert_int_equal(sender, 1);
    assert_int_equal(receiver, 1);
    assert_memory_equal(src, dst, len);
    free(v);
    free(d);
    kvt_engine_destroy(a);
    kvt_engine_destroy(b);
    munmap(src, len);
    munmap(dst, len);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_qp_rec_roundtrip),
        cmocka_unit_test(test_qp_rec_refusals),
        cmocka_unit_test(test_qp_attrs_roce),
        cmocka_unit_test(test_qp_read_depths),
        cmocka_unit_test(test_qp_attrs_ib_and_mismatch),
        cmocka_unit_test(test_wc_first_failure_wins),
        cmocka_unit_test(test_wc_access_error),
        cmocka_unit_test(test_async_classes),
        cmocka_unit_test(test_wrid_and_note),
        cmocka_unit_test(test_qp_info_to_tcp_engine),
        cmocka_unit_test(test_qp_info_malformed),
        cmocka_unit_test(test_verbs_descriptor_over_tcp),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
