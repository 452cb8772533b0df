/* test_xfer_senders.c - the receiving engine's table of senders stays
 * bounded (kvt_stats.senders):
 *  - one sender reconnecting with a new generation each time (it
 *    restarted) keeps one entry: the handshake of the new generation closes
 *    what the old one left (its connection, its open room, which fails with
 *    ESTALE naming the restart);
 *  - many senders that connect and leave leave no entry;
 *  - caps on what one peer makes: connections of one sender, rooms it has
 *    open at once, senders connected at once; past each the handshake or
 *    the frame is refused with an ERROR naming the cap, and the engine
 *    goes on serving.
 * The receiver is an engine of this process, driven between the raw
 * socket's steps; its peers are raw sockets speaking the wire protocol. */
#include <poll.h>
#include <sys/resource.h>

#include "testutil.h"
#include "xfer_internal.h"
#include "xfer_raw.h"

#define REGION (1u << 20)

static kvt_engine *rx;
static unsigned char *region;
static int rport;
static kvt_event evs[64];
static size_t nevs;

static void drive(void)
{
    kvt_event ev[16];
    size_t n;
    assert_int_equal(kvt_progress(rx, 5, ev, 16, &n), KVC_OK);
    for (size_t i = 0; i < n && nevs < 64; i++)
        evs[nevs++] = ev[i];
}

static uint32_t senders(void)
{
    kvt_stats st;
    assert_int_equal(kvt_engine_stat(rx, &st), KVC_OK);
    return st.senders;
}

static void drive_until_senders(uint32_t n)
{
    while (senders() != n)
        drive();
}

static int readable(int fd)
{
    struct pollfd p = {.fd = fd, .events = POLLIN};
    return poll(&p, 1, 0) > 0;
}

static int raw_connect(void) { return xu_raw_connect(rport); }

/* The next frame on fd, the engine driven while it is awaited; payload
 * (NUL-terminated) into buf.  -1 on end of stream. */
static int next_frame(int fd, kvt__frame *f, char *buf, size_t cap)
{
    while (!readable(fd))
        drive();
    return xu_raw_read(fd, f, buf, cap);
}

/* Connect and send HELLO as sid of generation gen; the answer's type. */
static int hello(const char *sid, uint64_t gen, int *fd_out, char *msg, size_t cap)
{
    int fd = raw_connect();
    xu_raw_hello(fd, KVT_PROTOCOL_VERSION, sid, gen);
    kvt__frame f;
    assert_int_equal(next_frame(fd, &f, msg, cap), 0);
    *fd_out = fd;
    return f.type;
}

static int hello_ok(const char *sid, uint64_t gen)
{
    int fd;
    char msg[4200];
    int t = hello(sid, gen, &fd, msg, sizeof msg);
    if (t != KVT_F_HELLO_OK)
        fail_msg("HELLO of %s refused: %s", sid, msg);
    return fd;
}

/* The engine closed fd (an ERROR containing want first when want is set). */
static void expect_closed(int fd, const char *want)
{
    kvt__frame f;
    char buf[4200];
    int seen = 0;
    while (next_frame(fd, &f, buf, sizeof buf) == 0) {
        if (f.type == KVT_F_ERROR && want && strstr(buf, want))
            seen = 1;
    }
    if (want && !seen)
        fail_msg("no ERROR with \"%s\" before the close", want);
    close(fd);
}

static int setup(void **state)
{
    (void)state;
    kvt_options o;
    kvt_options_init(&o);
    o.backend = KVT_BACKEND_TCP;
    o.listen = "127.0.0.1:0";
    o.log = xu_quiet_log;
    assert_int_equal(kvt_engine_create(&o, &rx), KVC_OK);
    region = xu_map(REGION);
    assert_int_equal(kvt_mr_register(rx, region, REGION, NULL), KVC_OK);
    rport = atoi(strrchr(kvt_session_id(rx), ':') + 1);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    kvt_engine_destroy(rx);
    munmap(region, REGION);
    return 0;
}

/* A sender restarting 300 times: one entry; the old process's connection
 * is closed by the new one's handshake, its open room fails (ESTALE). */
static void test_restarts(void **state)
{
    (void)state;
    int prev = -1;
    for (uint64_t gen = 1; gen <= 300; gen++) {
        int fd = hello_ok("fake:1", gen);
        assert_int_equal(senders(), 1);
        if (prev >= 0)
            expect_closed(prev, NULL);
        prev = fd;
    }
    /* An open room (one write, no DONE) of generation 300, then 301. */
    xu_raw_frame(prev, KVT_F_WRITE, 100, 1, 7, (uint64_t)(uintptr_t)region, region + 4096, 100);
    kvt_stats st;
    do {
        drive();
        assert_int_equal(kvt_engine_stat(rx, &st), KVC_OK);
    } while (st.writes_recv < 1);
    nevs = 0;
    int fd = hello_ok("fake:1", 301);
    expect_closed(prev, NULL);
    while (nevs == 0)
        drive();
    assert_int_equal(evs[0].room, 7);
    assert_int_equal(evs[0].state, KVC_POLL_FAILED);
    assert_int_equal(evs[0].code, ESTALE);
    if (!strstr(evs[0].reason, "restarted (generation 301 replaces 300)"))
        fail_msg("reason: %s", evs[0].reason);
    assert_int_equal(senders(), 1);
    close(fd);
    drive_until_senders(0);
}

/* 300 senders that connect and leave: none is kept. */
static void test_many_leave(void **state)
{
    (void)state;
    for (int i = 0; i < 300; i++) {
        char sid[32];
        snprintf(sid, sizeof sid, "fake:%d", 1000 + i);
        int fd = hello_ok(sid, 5);
        assert_true(senders() >= 1);
        close(fd);
    }
    drive_until_senders(0);
}

/* One sender's connections: KVT_RPEER_CONNS_MAX, then refused. */
static void test_conns_cap(void **state)
{
    (void)state;
    int fds[KVT_RPEER_CONNS_MAX];
    for (int i = 0; i < KVT_RPEER_CONNS_MAX; i++)
        fds[i] = hello_ok("fake:2", 9);
    assert_int_equal(senders(), 1);
    int fd;
    char msg[4200];
    assert_int_equal(hello("fake:2", 9, &fd, msg, sizeof msg), KVT_F_ERROR);
    if (!strstr(msg, "peer fake:2 has 64 connections here, the most one sender may"))
        fail_msg("ERROR: %s", msg);
    expect_closed(fd, NULL);
    for (int i = 0; i < KVT_RPEER_CONNS_MAX; i++)
        close(fds[i]);
    drive_until_senders(0);
}

/* One sender's open rooms: KVT_RPEER_ROOMS_MAX, then its connection is
 * refused; the room it had open fail, and the engine serves the next. */
static void test_rooms_cap(void **state)
{
    (void)state;
    int fd = hello_ok("fake:3", 1);
    static uint8_t batch[256 * (KVT_HDR_LEN + 1)];
    uint64_t room = 0;
    kvt_stats st;
    assert_int_equal(kvt_engine_stat(rx, &st), KVC_OK);
    uint64_t base = st.writes_recv;
    while (room < KVT_RPEER_ROOMS_MAX) {
        size_t off = 0;
        for (int i = 0; i < 256; i++, room++) {
            kvt__frame f = {.type = KVT_F_WRITE,
                            .len = 1,
                            .seq = room + 1,
                            .room = room,
                            .addr = (uint64_t)(uintptr_t)region};
            kvt__frame_encode(&f, batch + off);
            batch[off + KVT_HDR_LEN] = 1;
            off += KVT_HDR_LEN + 1;
        }
        assert_int_equal(xu_write_all(fd, batch, off), 0);
        do { /* applied; its ACKs read and dropped */
            drive();
            char sink[4096];
            while (readable(fd))
                assert_true(read(fd, sink, sizeof sink) > 0);
            assert_int_equal(kvt_engine_stat(rx, &st), KVC_OK);
        } while (st.writes_recv - base < room);
    }
    nevs = 0;
    xu_raw_frame(fd, KVT_F_WRITE, 1, room + 1, room, (uint64_t)(uintptr_t)region, region, 1);
    expect_closed(fd, "rooms open here, the most one sender may");
    drive_until_senders(0);
    assert_true(nevs > 0); /* the open rooms failed (the first 64 are kept here) */
    assert_int_equal(evs[0].state, KVC_POLL_FAILED);
    /* The engine goes on. */
    fd = hello_ok("fake:3", 2);
    close(fd);
    drive_until_senders(0);
}

/* Senders connected at once: KVT_MAX_RPEERS, then refused. */
static void test_senders_cap(void **state)
{
    (void)state;
    struct rlimit rl;
    getrlimit(RLIMIT_NOFILE, &rl);
    rlim_t need = 2 * KVT_MAX_RPEERS + 200; /* both ends of every connection */
    if (rl.rlim_cur < need) {
        rl.rlim_cur = rl.rlim_max < need ? rl.rlim_max : need;
        setrlimit(RLIMIT_NOFILE, &rl);
        getrlimit(RLIMIT_NOFILE, &rl);
        if (rl.rlim_cur < need)
            skip(); /* cmocka: this test only */
    }
    static int fds[KVT_MAX_RPEERS];
    char sid[32];
    for (int i = 0; i < KVT_MAX_RPEERS; i++) {
        snprintf(sid, sizeof sid, "fake:%d", 20000 + i);
        fds[i] = hello_ok(sid, 1);
    }
    assert_int_equal(senders(), KVT_MAX_RPEERS);
    int fd;
    char msg[4200];
    assert_int_equal(hello("fake:9", 1, &fd, msg, sizeof msg), KVT_F_ERROR);
    if (!strstr(msg, "1024 senders are connected here, the most allowed"))
        fail_msg("ERROR: %s", msg);
    expect_closed(fd, NULL);
    /* A restart of a known sender is no new entry: still accepted. */
    fd = hello_ok("fake:20000", 2);
    expect_closed(fds[0], NULL);
    assert_int_equal(senders(), KVT_MAX_RPEERS);
    close(fd);
    for (int i = 1; i < KVT_MAX_RPEERS; i++)
        close(fds[i]);
    drive_until_senders(0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_restarts, setup, teardown),
        cmocka_unit_test_setup_teardown(test_many_leave, setup, teardown),
        cmocka_unit_test_setup_teardown(test_conns_cap, setup, teardown),
        cmocka_unit_test_setup_teardown(test_rooms_cap, setup, teardown),
        cmocka_unit_test_setup_teardown(test_senders_cap, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
