/* test_xfer_wire.c - bad input on the wire, each refused with a clear
 * error while the engine keeps serving other peers: garbage bytes, a wrong
 * protocol version, truncated frames, a write outside the registered
 * regions, an oversized frame, a frame before the handshake; a large
 * write trickling in slowly is not a stall.  And the
 * sender's side: a peer of another version, a peer that never answers
 * (deadlines), the unhealthy mark and its clearing on re-registration. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include "testutil.h"
#include "xfer_raw.h"

#define REGION (4u << 20)

static xu_receiver rx;
static uint64_t rbase;
static int rport;
static const char *seg_name;
static kvc_segment *seg;

static void hello_ok(int fd, const char *sid)
{
    xu_raw_hello(fd, KVT_PROTOCOL_VERSION, sid, 42);
    kvt__frame f;
    char buf[1024];
    assert_int_equal(xu_raw_read(fd, &f, buf, sizeof buf), 0);
    assert_int_equal(f.type, KVT_F_HELLO_OK);
}

/* The receiver answers ERROR with msg, then closes. */
static void expect_error(int fd, const char *msg)
{
    kvt__frame f;
    char buf[4200];
    assert_int_equal(xu_raw_read(fd, &f, buf, sizeof buf), 0);
    assert_int_equal(f.type, KVT_F_ERROR);
    if (!strstr(buf, msg))
        fail_msg("ERROR \"%s\" lacks \"%s\"", buf, msg);
    char c;
    assert_true(read(fd, &c, 1) <= 0); /* closed */
    close(fd);
}

static int group_setup(void **state)
{
    (void)state;
    seg_name = tu_name();
    seg = tu_open(seg_name, KVC_OPEN_FRESH, KVC_ROLE_CLIENT);
    assert_int_equal(xu_receiver_start(&rx, "127.0.0.1:0", REGION, seg_name, 0, 1000), 0);
    const char *a = strstr(rx.desc, "\"addr\":");
    rbase = strtoull(a + 7, NULL, 10);
    const char *s = strstr(rx.desc, "127.0.0.1:");
    rport = atoi(s + 10);
    return 0;
}

static int group_teardown(void **state)
{
    (void)state;
    xu_receiver_stop(&rx);
    kvc_close(seg);
    kvc_unlink(seg_name);
    return 0;
}

static void test_garbage(void **state)
{
    (void)state;
    int fd = xu_raw_connect(rport);
    const char junk[] = "GET /health HTTP/1.1\r\nHost: x\r\n\r\n........";
    assert_int_equal(xu_write_all(fd, junk, sizeof junk), 0);
    expect_error(fd, "bad frame magic");
}

static void test_wrong_version(void **state)
{
    (void)state;
    int fd = xu_raw_connect(rport);
    xu_raw_hello(fd, 2, "fake:1", 1);
    expect_error(fd, "incompatible protocol versions 2 vs 1");
}

static void test_before_handshake(void **state)
{
    (void)state;
    int fd = xu_raw_connect(rport);
    xu_raw_frame(fd, KVT_F_WRITE, 8, 1, 1, rbase, "12345678", 8);
    expect_error(fd, "unexpected frame WRITE before the handshake");
}

static void test_oversized(void **state)
{
    (void)state;
    int fd = xu_raw_connect(rport);
    hello_ok(fd, "fake:2");
    xu_raw_frame(fd, KVT_F_WRITE, KVT_FRAME_MAX + 1, 1, 1, rbase, NULL, 0);
    expect_error(fd, "exceeds the limit");
}

static void test_reserved_bits(void **state)
{
    (void)state;
    int fd = xu_raw_connect(rport);
    hello_ok(fd, "fake:3");
    uint8_t h[KVT_HDR_LEN];
    kvt__frame f = {.type = KVT_F_DONE, .room = 1};
    kvt__frame_encode(&f, h);
    h[6] = 1;
    assert_int_equal(xu_write_all(fd, h, sizeof h), 0);
    expect_error(fd, "reserved bits");
}

/* A write outside the regions is refused (NACK), the connection goes on:
 * a good write is then acknowledged and the room ends in Success. */
static void test_outside_region(void **state)
{
    (void)state;
    int fd = xu_raw_connect(rport);
    hello_ok(fd, "fake:4");
    char data[100];
    memset(data, 'x', sizeof data);
    xu_raw_frame(fd, KVT_F_WRITE, 100, 1, 7, 0x1000, data, 100);
    xu_raw_frame(fd, KVT_F_WRITE, 100, 2, 7, rbase + REGION - 50, data,
                 100); /* straddles the end */
    kvt__frame f;
    char buf[1024];
    for (uint64_t seq = 1; seq <= 2; seq++) {
        assert_int_equal(xu_raw_read(fd, &f, buf, sizeof buf), 0);
        assert_int_equal(f.type, KVT_F_NACK);
        assert_int_equal(f.seq, seq);
        assert_int_equal(f.status, EFAULT);
        assert_non_null(strstr(buf, "outside every region registered here"));
    }
    xu_raw_frame(fd, KVT_F_WRITE, 100, 3, 7, rbase, data, 100);
    assert_int_equal(xu_raw_read(fd, &f, buf, sizeof buf), 0);
    assert_int_equal(f.type, KVT_F_ACK);
    assert_int_equal(f.seq, 3);
    assert_int_equal(f.addr, 1);
    xu_raw_frame(fd, KVT_F_DONE, 0, 1, 7, 100, NULL, 0);
    assert_int_equal(xu_raw_read(fd, &f, buf, sizeof buf), 0);
    assert_int_equal(f.type, KVT_F_DONE_ACK);
    assert_int_equal(f.status, 0);
    xu_report r;
    assert_int_equal(xu_read_all(rx.rd, &r, sizeof r, -1), 0);
    assert_int_equal(r.room, 7);
    assert_int_equal(r.state, KVC_POLL_SUCCESS);
    assert_string_equal(r.peer, "fake:4");
    /* A DONE whose tally differs is refused, and the room fails. */
    xu_raw_frame(fd, KVT_F_WRITE, 100, 4, 8, rbase, data, 100);
    xu_raw_frame(fd, KVT_F_DONE, 0, 2, 8, 200, NULL, 0);
    assert_int_equal(xu_raw_read(fd, &f, buf, sizeof buf), 0);
    assert_int_equal(f.type, KVT_F_ACK);
    assert_int_equal(xu_raw_read(fd, &f, buf, sizeof buf), 0);
    assert_int_equal(f.type, KVT_F_DONE_ACK);
    assert_int_equal(f.status, EIO);
    assert_non_null(strstr(buf, "received 1 writes / 100 bytes, sender sent 2 / 200"));
    assert_int_equal(xu_read_all(rx.rd, &r, sizeof r, -1), 0);
    assert_int_equal(r.state, KVC_POLL_FAILED);
    close(fd);
}

/* Acknowledgements are cumulative and may cover several writes (the
 * receiver holds them back while more input is queued): a burst of 300
 * writes, a refused one in the middle and a DONE, sent at once.  The ACKs
 * must cover exactly writes 1..150 before the NACK of 151, then exactly
 * 152..301, all before the DONE_ACK; how many ACK frames that takes is
 * up to the receiver (not asserted). */
static void test_ack_coalesced(void **state)
{
    (void)state;
    int fd = xu_raw_connect(rport);
    hello_ok(fd, "fake:9");
    enum { N = 301, BAD = 151, LEN = 64 };
    size_t fl = KVT_HDR_LEN + LEN, total = (size_t)N * fl + KVT_HDR_LEN;
    uint8_t *burst = malloc(total);
    for (uint64_t seq = 1; seq <= N; seq++) {
        uint8_t *p = burst + (seq - 1) * fl;
        uint64_t addr = seq == BAD ? 0x1000 : rbase + 8192 + (seq - 1) * LEN;
        kvt__frame f = {.type = KVT_F_WRITE, .len = LEN, .seq = seq, .room = 21, .addr = addr};
        kvt__frame_encode(&f, p);
        memset(p + KVT_HDR_LEN, (int)(seq & 0xff), LEN);
    }
    kvt__frame d = {.type = KVT_F_DONE, .seq = N - 1, .room = 21, .addr = (uint64_t)(N - 1) * LEN};
    kvt__frame_encode(&d, burst + (size_t)N * fl);
    assert_int_equal(xu_write_all(fd, burst, total), 0);
    free(burst);
    uint64_t acked = 0, last = 0;
    kvt__frame f;
    char buf[1024];
    for (;;) {
        assert_int_equal(xu_raw_read(fd, &f, buf, sizeof buf), 0);
        if (f.type == KVT_F_ACK) {
            assert_true(f.addr >= 1);
            acked += f.addr;
            last = f.seq;
            /* cumulative: seq is the last write covered (the refused one
             * is not counted) */
            assert_int_equal(last, acked + (last > BAD ? 1 : 0));
            continue;
        }
        if (f.type == KVT_F_NACK) {
            assert_int_equal(f.seq, BAD);
            assert_int_equal(acked, BAD - 1); /* every earlier write acknowledged first */
            continue;
        }
        assert_int_equal(f.type, KVT_F_DONE_ACK);
        break;
    }
    assert_int_equal(acked, N - 1);
    assert_int_equal(last, N);
    assert_int_equal(f.status, 0);
    xu_report r;
    assert_int_equal(xu_read_all(rx.rd, &r, sizeof r, -1), 0);
    assert_int_equal(r.room, 21);
    assert_int_equal(r.state, KVC_POLL_SUCCESS);
    assert_int_equal(r.bytes, (uint64_t)(N - 1) * LEN);
    close(fd);
}

/* Truncated frames: a header cut short, a payload cut short.  The room of
 * the cut write fails naming the peer; no other effect. */
static void test_truncated(void **state)
{
    (void)state;
    int fd = xu_raw_connect(rport);
    hello_ok(fd, "fake:5");
    uint8_t h[KVT_HDR_LEN];
    kvt__frame f = {.type = KVT_F_WRITE, .len = 1000, .seq = 1, .room = 9, .addr = rbase};
    kvt__frame_encode(&f, h);
    assert_int_equal(xu_write_all(fd, h, 20), 0);
    close(fd);
    fd = xu_raw_connect(rport);
    hello_ok(fd, "fake:6");
    xu_raw_frame(fd, KVT_F_WRITE, 1000, 1, 10, rbase, "0123456789", 10);
    usleep(100000);
    close(fd);
    xu_report r;
    assert_int_equal(xu_read_all(rx.rd, &r, sizeof r, -1), 0);
    assert_int_equal(r.room, 10);
    assert_int_equal(r.state, KVC_POLL_FAILED);
    assert_non_null(strstr(r.reason, "fake:6"));
    assert_non_null(strstr(r.reason, "connection closed by peer"));
    kvc_room_info ri;
    assert_int_equal(kvc_room_get(seg, 10, -1, &ri), KVC_OK);
    assert_int_equal(ri.state, KVC_POLL_FAILED);
    assert_non_null(strstr(ri.failure.reason, "fake:6"));
}

/* A stalled frame hits the receive deadline (1 s in this receiver). */
static void test_stalled_frame(void **state)
{
    (void)state;
    int fd = xu_raw_connect(rport);
    hello_ok(fd, "fake:7");
    xu_raw_frame(fd, KVT_F_WRITE, 1000, 1, 11, rbase, "0123456789", 10);
    xu_report r;
    assert_int_equal(xu_read_all(rx.rd, &r, sizeof r, -1), 0);
    assert_int_equal(r.room, 11);
    assert_int_equal(r.state, KVC_POLL_FAILED);
    assert_int_equal(r.code, ETIMEDOUT);
    assert_non_null(strstr(r.reason, "no progress"));
    close(fd);
}

/* A large write trickling in, slower per receive deadline (1 s here) than
 * the receiver's SO_RCVLOWAT (256 KiB, kvt__rx_arm), is progress, not a
 * stall: 320 KiB in 16 KiB pieces 150 ms apart (about 2.4 s per 256 KiB);
 * the room succeeds with every byte in place. */
static void test_slow_large_write(void **state)
{
    (void)state;
    enum { LEN = 320 << 10, PIECE = 16 << 10 };
    int fd = xu_raw_connect(rport);
    hello_ok(fd, "fake:10");
    uint8_t h[KVT_HDR_LEN], *payload = malloc(LEN);
    for (size_t i = 0; i < LEN; i++)
        payload[i] = (uint8_t)(i * 7 + 3);
    kvt__frame f = {.type = KVT_F_WRITE, .len = LEN, .seq = 1, .room = 23, .addr = rbase + 65536};
    kvt__frame_encode(&f, h);
    assert_int_equal(xu_write_all(fd, h, sizeof h), 0);
    usleep(50000); /* the header alone: the payload is then received in place */
    for (size_t off = 0; off < LEN; off += PIECE) {
        assert_int_equal(xu_write_all(fd, payload + off, PIECE), 0);
        usleep(150000);
    }
    xu_raw_frame(fd, KVT_F_DONE, 0, 1, 23, LEN, NULL, 0);
    char buf[1024];
    do
        assert_int_equal(xu_raw_read(fd, &f, buf, sizeof buf), 0);
    while (f.type == KVT_F_ACK);
    assert_int_equal(f.type, KVT_F_DONE_ACK);
    assert_int_equal(f.status, 0);
    xu_report r;
    assert_int_equal(xu_read_all(rx.rd, &r, sizeof r, -1), 0);
    assert_int_equal(r.room, 23);
    assert_int_equal(r.state, KVC_POLL_SUCCESS);
    assert_int_equal(r.bytes, (uint64_t)LEN);
    free(payload);
    close(fd);
}

/* After all that, and with a silent connection open, a real sender's
 * room still succeeds. */
static void test_still_serving(void **state)
{
    (void)state;
    int silent = xu_raw_connect(rport);
    kvt_engine *e = xu_sender(NULL, 0, 2, 0);
    void *src = xu_map(REGION);
    xu_fill(src, REGION, 3);
    assert_int_equal(kvt_mr_register(e, src, REGION, NULL), KVC_OK);
    kvt_peer *p;
    assert_int_equal(kvt_peer_import(e, rx.desc, strlen(rx.desc), &p), KVC_OK);
    kvt_run run = {(uint64_t)(uintptr_t)src, rbase, REGION};
    assert_int_equal(kvt_submit(e, p, 12, &run, 1, 0), KVC_OK);
    kvt_event ev;
    assert_int_equal(xu_wait_event(e, 12, &ev), 0);
    assert_int_equal(ev.state, KVC_POLL_SUCCESS);
    xu_report r;
    assert_int_equal(xu_read_all(rx.rd, &r, sizeof r, -1), 0);
    assert_int_equal(r.state, KVC_POLL_SUCCESS);
    assert_true(r.sum == xu_sum(src, REGION));
    kvt_engine_destroy(e);
    munmap(src, REGION);
    close(silent);
}

/* ---- the sender's side ------------------------------------------------------------ */

/* A fake peer: listens, then for each connection does `mode`:
 * 0 never answers, 1 answers HELLO_OK of version 2, 2 handshakes and never
 * acknowledges.  Returns its pid; *port receives the port. */
static pid_t fake_peer(int mode, int *port)
{
    int l = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof sa;
    assert_int_equal(bind(l, (struct sockaddr *)&sa, sizeof sa), 0);
    listen(l, 16);
    getsockname(l, (struct sockaddr *)&sa, &len);
    *port = ntohs(sa.sin_port);
    pid_t pid = fork();
    if (pid)
        return close(l), pid;
    for (;;) {
        int fd = accept(l, NULL, NULL);
        if (fd < 0)
            _exit(0);
        if (mode == 0)
            continue; /* keep fd open, say nothing */
        uint8_t h[KVT_HDR_LEN], b[1024];
        if (xu_read_all(fd, h, sizeof h, 5000))
            continue;
        uint32_t plen = kvt__get32(h + 8);
        xu_read_all(fd, b, plen, 5000);
        kvt__hello hh;
        memset(&hh, 0, sizeof hh);
        hh.version = mode == 1 ? 2 : KVT_PROTOCOL_VERSION;
        hh.generation = 5;
        snprintf(hh.session_id, sizeof hh.session_id, "127.0.0.1:%d", *port);
        size_t n = kvt__hello_encode(&hh, b, sizeof b);
        kvt__frame f = {.type = KVT_F_HELLO_OK, .len = (uint32_t)n};
        kvt__frame_encode(&f, h);
        xu_write_all(fd, h, sizeof h);
        xu_write_all(fd, b, n);
        /* mode 2: read and drop everything, never acknowledge */
    }
}

static char *fake_desc(int port, uint64_t gen, unsigned version)
{
    char *s = malloc(512);
    snprintf(s, 512,
             "{\"session_id\":\"127.0.0.1:%d\",\"backend\":\"tcp\",\"protocol\":\"kvt\",\"protocol_"
             "version\":%u,"
             "\"generation\":%llu,\"regions\":[{\"addr\":4096,\"length\":1048576,\"rkey\":1}],"
             "\"extra\":1}",
             port, version, (unsigned long long)gen);
    return s;
}

static kvt_event run_to_fake(int mode, uint32_t timeout_ms, kvt_engine **eo, kvt_peer **po,
                             pid_t *pid)
{
    int port;
    *pid = fake_peer(mode, &port);
    kvt_options o;
    kvt_options_init(&o);
    o.backend = KVT_BACKEND_TCP;
    o.connect_timeout_ms = timeout_ms;
    o.io_timeout_ms = timeout_ms;
    o.seg = seg;
    o.rank = 3;
    o.log = xu_quiet_log;
    assert_int_equal(kvt_engine_create(&o, eo), KVC_OK);
    static char buf[65536];
    assert_int_equal(kvt_mr_register(*eo, buf, sizeof buf, NULL), KVC_OK);
    char *d = fake_desc(port, 5, KVT_PROTOCOL_VERSION); /* the fake's generation */
    assert_int_equal(kvt_peer_import(*eo, d, strlen(d), po), KVC_OK);
    free(d);
    uint64_t room = 1000 + (uint64_t)mode;
    kvt_run run = {(uint64_t)(uintptr_t)buf, 4096, sizeof buf};
    assert_int_equal(kvt_submit(*eo, *po, room, &run, 1, 0), KVC_OK);
    kvt_event ev;
    assert_int_equal(xu_wait_event(*eo, room, &ev), 0);
    assert_int_equal(ev.state, KVC_POLL_FAILED);
    kvc_room_info ri;
    assert_int_equal(kvc_room_get(seg, room, 0, &ri), KVC_OK);
    assert_int_equal(ri.state, KVC_POLL_FAILED);
    assert_int_equal(ri.failure.origin_rank, 3);
    assert_non_null(strstr(ri.failure.reason, "127.0.0.1:"));
    return ev;
}

static void test_sender_version_mismatch(void **state)
{
    (void)state;
    kvt_engine *e;
    kvt_peer *p;
    pid_t pid;
    kvt_event ev = run_to_fake(1, 2000, &e, &p, &pid);
    assert_non_null(strstr(ev.reason, "incompatible protocol versions 2 vs 1"));
    assert_null(strstr(ev.reason, "dead"));
    assert_int_equal(ev.code, EPROTONOSUPPORT);
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    kvt_engine_destroy(e);
    /* The descriptor of another version is refused on import too. */
    kvt_engine *e2 = xu_sender(NULL, 0, 1, 0);
    char *d = fake_desc(1, 1, 9);
    assert_int_equal(kvt_peer_import(e2, d, strlen(d), &p), KVC_E_VERSION);
    assert_non_null(strstr(kvc_last_error(), "incompatible protocol versions 9 vs 1"));
    free(d);
    assert_int_equal(kvt_peer_import(e2, "{\"session_id\":1}", 16, &p), KVC_E_INVAL);
    assert_int_equal(kvt_peer_import(e2, "not json", 8, &p), KVC_E_INVAL);
    kvt_engine_destroy(e2);
}

static void test_sender_handshake_deadline(void **state)
{
    (void)state;
    kvt_engine *e;
    kvt_peer *p;
    pid_t pid;
    kvt_event ev = run_to_fake(0, 500, &e, &p, &pid);
    assert_int_equal(ev.code, ETIMEDOUT);
    assert_non_null(strstr(ev.reason, "no handshake within 500 ms"));
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    kvt_engine_destroy(e);
}

/* No acknowledgement: the write deadline fails the room; the peer is then
 * unhealthy (submits refused, with the time left) until its descriptor
 * is imported again (same generation or a new one). */
static void test_sender_ack_deadline_unhealthy(void **state)
{
    (void)state;
    kvt_engine *e;
    kvt_peer *p;
    pid_t pid;
    kvt_event ev = run_to_fake(2, 500, &e, &p, &pid);
    assert_int_equal(ev.code, ETIMEDOUT);
    assert_non_null(strstr(ev.reason, "waiting for acknowledgement"));
    kvt_peer_info pi;
    assert_int_equal(kvt_peer_stat(e, p, &pi), KVC_OK);
    assert_int_equal(pi.healthy, 0);
    assert_true(pi.unhealthy_left_ms > 0);
    static char buf[4096];
    kvt_run run = {(uint64_t)(uintptr_t)buf, 4096, 4096};
    assert_int_equal(kvt_mr_register(e, buf, sizeof buf, NULL), KVC_OK);
    assert_int_equal(kvt_submit(e, p, 1100, &run, 1, 0), KVC_E_BUSY);
    assert_non_null(strstr(kvc_last_error(), "unhealthy for another"));
    kvc_room_info ri;
    assert_int_equal(kvc_room_get(seg, 1100, 0, &ri), KVC_OK);
    assert_int_equal(ri.state, KVC_POLL_FAILED);
    /* Its descriptor imported again, the same generation (the peer was
     * only slow, or paused, and answers again): healthy at once, not
     * after the TTL. */
    int port = atoi(strrchr(pi.session_id, ':') + 1);
    char *d = fake_desc(port, 5, KVT_PROTOCOL_VERSION);
    assert_int_equal(kvt_peer_import(e, d, strlen(d), &p), KVC_OK);
    free(d);
    assert_int_equal(kvt_peer_stat(e, p, &pi), KVC_OK);
    assert_int_equal(pi.healthy, 1);
    assert_int_equal(pi.unhealthy_left_ms, 0);
    /* Registered again with a new generation: healthy. */
    d = fake_desc(port, 2, KVT_PROTOCOL_VERSION);
    assert_int_equal(kvt_peer_import(e, d, strlen(d), &p), KVC_OK);
    free(d);
    assert_int_equal(kvt_peer_stat(e, p, &pi), KVC_OK);
    assert_int_equal(pi.healthy, 1);
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    kvt_engine_destroy(e);
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_garbage),
        cmocka_unit_test(test_wrong_version),
        cmocka_unit_test(test_before_handshake),
        cmocka_unit_test(test_oversized),
        cmocka_unit_test(test_reserved_bits),
        cmocka_unit_test(test_outside_region),
        cmocka_unit_test(test_ack_coalesced),
        cmocka_unit_test(test_truncated),
        cmocka_unit_test(test_stalled_frame),
        cmocka_unit_test(test_slow_large_write),
        cmocka_unit_test(test_still_serving),
        cmocka_unit_test(test_sender_version_mismatch),
        cmocka_unit_test(test_sender_handshake_deadline),
        cmocka_unit_test(test_sender_ack_deadline_unhealthy),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
