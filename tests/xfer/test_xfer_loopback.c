/* test_xfer_loopback.c - two engines in two processes over loopback TCP:
 * every byte verified by checksum against a mirror of the receiver's
 * region, rooms Success on both sides (events and segments), coalescing
 * and slicing, concurrent rooms, runs refused before anything is sent;
 * large payloads by splice and by sendmsg, a receiver stopped and killed
 * (or timed out) under a spliced transfer. */
#include "testutil.h"
#include "xfer_util.h"

#define REGION (16u << 20)
#define PAGE 4096u

typedef struct ctx {
    const char *seg_s, *seg_r;
    kvc_segment *ss, *sr;
    xu_receiver rx;
    kvt_engine *e;
    kvt_peer *peer;
    unsigned char *src, *mirror;
    uint64_t rbase;
} ctx;

static kvc_segment *open_seg(const char *name)
{
    kvc_options o;
    kvc_options_init(&o);
    o.name = name;
    o.mode = KVC_OPEN_FRESH;
    o.role = KVC_ROLE_CLIENT;
    o.world_size = 1;
    o.max_ranks = 8;
    o.arena_bytes = 8u << 20;
    o.max_info_bytes = 1u << 20;
    o.max_rooms = 256;
    kvc_segment *s = NULL;
    if (kvc_open(&o, &s))
        fail_msg("kvc_open %s: %s", name, kvc_last_error());
    return s;
}

static uint64_t desc_base(const char *desc)
{
    const char *a = strstr(desc, "\"addr\":");
    return a ? strtoull(a + 7, NULL, 10) : 0;
}

static int setup(void **state)
{
    ctx *c = calloc(1, sizeof *c);
    c->seg_s = tu_name();
    c->seg_r = tu_name();
    c->ss = open_seg(c->seg_s);
    c->sr = open_seg(c->seg_r);
    assert_int_equal(xu_receiver_start(&c->rx, "127.0.0.1:0", REGION, c->seg_r, 0, 0), 0);
    c->e = xu_sender(c->ss, 0, 2, 0);
    assert_non_null(c->e);
    c->src = xu_map(REGION);
    c->mirror = xu_map(REGION);
    xu_fill(c->src, REGION, 7);
    assert_int_equal(kvt_mr_register(c->e, c->src, REGION, NULL), KVC_OK);
    assert_int_equal(kvt_peer_import(c->e, c->rx.desc, strlen(c->rx.desc), &c->peer), KVC_OK);
    c->rbase = desc_base(c->rx.desc);
    assert_true(c->rbase != 0);
    *state = c;
    return 0;
}

static int teardown(void **state)
{
    ctx *c = *state;
    kvt_engine_destroy(c->e);
    xu_receiver_stop(&c->rx);
    kvc_close(c->ss);
    kvc_close(c->sr);
    kvc_unlink(c->seg_s);
    kvc_unlink(c->seg_r);
    munmap(c->src, REGION);
    munmap(c->mirror, REGION);
    free(c);
    return 0;
}

/* Submit runs (offsets into src / the receiver's region) for room, apply
 * them to the mirror, and return after the sender's event. */
static void submit(ctx *c, uint64_t room, kvt_run *runs, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        memcpy(c->mirror + runs[i].raddr, c->src + runs[i].laddr, runs[i].len);
        runs[i].laddr += (uint64_t)(uintptr_t)c->src;
        runs[i].raddr += c->rbase;
    }
    kvc_err err = kvt_submit(c->e, c->peer, room, runs, n, 0);
    if (err)
        fail_msg("kvt_submit: %s", kvc_last_error());
}

static void expect_success(ctx *c, uint64_t room, uint64_t bytes)
{
    kvt_event ev;
    assert_int_equal(xu_wait_event(c->e, room, &ev), 0);
    if (ev.state != KVC_POLL_SUCCESS)
        fail_msg("room %llu failed: %s", (unsigned long long)room, ev.reason);
    assert_int_equal(ev.bytes, bytes);
    assert_int_equal(ev.side, KVT_SIDE_SENDER);
    xu_report r;
    assert_int_equal(xu_read_all(c->rx.rd, &r, sizeof r, -1), 0);
    assert_int_equal(r.room, room);
    assert_int_equal(r.state, KVC_POLL_SUCCESS);
    assert_int_equal(r.bytes, bytes);
    assert_string_equal(r.peer, kvt_session_id(c->e));
    assert_true(r.sum == xu_sum(c->mirror, REGION)); /* every byte, no stray write */
    kvc_room_info ri;
    assert_int_equal(kvc_room_get(c->ss, room, 0, &ri), KVC_OK);
    assert_int_equal(ri.state, KVC_POLL_SUCCESS);
    assert_int_equal(kvc_room_get(c->sr, room, 0, &ri), KVC_OK);
    assert_int_equal(ri.state, KVC_POLL_SUCCESS);
}

/* Scattered 4 KiB pages, randomly mapped on both sides. */
static void test_scattered_pages(void **state)
{
    ctx *c = *state;
    size_t n = 1024;
    kvt_run *runs = calloc(n, sizeof *runs);
    uint32_t *perm = malloc(REGION / PAGE * sizeof *perm);
    for (uint32_t i = 0; i < REGION / PAGE; i++)
        perm[i] = i;
    srand(11);
    for (uint32_t i = REGION / PAGE - 1; i > 0; i--) {
        uint32_t j = (uint32_t)rand() % (i + 1), t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    for (size_t i = 0; i < n; i++)
        runs[i] = (kvt_run){(uint64_t)perm[i] * PAGE, (uint64_t)perm[n + i] * PAGE, PAGE};
    submit(c, 1, runs, n);
    expect_success(c, 1, (uint64_t)n * PAGE);
    free(runs);
    free(perm);
}

/* Contiguous runs are coalesced, then sliced at 1 MiB: 8 MiB in 2048
 * runs (given in reverse order) goes out as 8 writes. */
static void test_coalesce_slice(void **state)
{
    ctx *c = *state;
    size_t n = 2048;
    kvt_run *runs = calloc(n, sizeof *runs);
    for (size_t i = 0; i < n; i++) {
        size_t k = n - 1 - i;
        runs[i] = (kvt_run){k * PAGE, (4u << 20) + k * PAGE, PAGE};
    }
    kvt_stats before, after;
    kvt_engine_stat(c->e, &before);
    submit(c, 2, runs, n);
    expect_success(c, 2, 8u << 20);
    kvt_engine_stat(c->e, &after);
    /* 2048 runs coalesce into one 8 MiB run, sliced into 8 of 1 MiB, sent
     * as one WRITEV frame (one write on the wire). */
    assert_int_equal(after.writes_sent - before.writes_sent, 1);
    assert_int_equal(after.bytes_sent - before.bytes_sent, 8u << 20);
    free(runs);
}

/* Odd lengths at odd offsets, not page-aligned. */
static void test_unaligned(void **state)
{
    ctx *c = *state;
    size_t n = 500;
    kvt_run *runs = calloc(n, sizeof *runs);
    srand(5);
    uint64_t total = 0;
    for (size_t i = 0; i < n; i++) {
        uint64_t len = 1 + (uint64_t)rand() % 8000;
        runs[i] = (kvt_run){i * 8192 + 3, (8u << 20) + i * 8192 + 1, len};
        total += len;
    }
    submit(c, 3, runs, n);
    expect_success(c, 3, total);
    free(runs);
}

/* Several rooms in flight at once, in two batches each (KVT_SUBMIT_MORE). */
static void test_concurrent_rooms(void **state)
{
    ctx *c = *state;
    enum { ROOMS = 8 };
    uint64_t per = 1u << 20;
    xu_fill(c->src, REGION, 99);
    for (uint64_t r = 0; r < ROOMS; r++) {
        kvt_run a = {r * per, r * per, per / 2},
                b = {r * per + per / 2, r * per + per / 2, per / 2};
        memcpy(c->mirror + a.raddr, c->src + a.laddr, per);
        a.laddr += (uint64_t)(uintptr_t)c->src;
        a.raddr += c->rbase;
        b.laddr += (uint64_t)(uintptr_t)c->src;
        b.raddr += c->rbase;
        assert_int_equal(kvt_submit(c->e, c->peer, 100 + r, &a, 1, KVT_SUBMIT_MORE), KVC_OK);
        assert_int_equal(kvt_submit(c->e, c->peer, 100 + r, &b, 1, 0), KVC_OK);
    }
    int done = 0;
    for (int i = 0; i < 400 && done < ROOMS; i++) {
        kvt_event ev[8];
        size_t n;
        assert_int_equal(kvt_progress(c->e, 50, ev, 8, &n), KVC_OK);
        for (size_t k = 0; k < n; k++) {
            if (ev[k].state != KVC_POLL_SUCCESS)
                fail_msg("room %llu: %s", (unsigned long long)ev[k].room, ev[k].reason);
            done++;
        }
    }
    assert_int_equal(done, ROOMS);
    xu_report r;
    for (int i = 0; i < ROOMS; i++) {
        assert_int_equal(xu_read_all(c->rx.rd, &r, sizeof r, -1), 0);
        assert_int_equal(r.state, KVC_POLL_SUCCESS);
    }
    assert_true(r.sum == xu_sum(c->mirror, REGION)); /* after the last room */
}

/* Runs outside a local or a peer's region: refused before anything is sent. */
static void test_refused_before_send(void **state)
{
    ctx *c = *state;
    kvt_stats before, after;
    kvt_engine_stat(c->e, &before);
    static char unreg[4096];
    kvt_run ok = {(uint64_t)(uintptr_t)c->src, c->rbase, 4096};
    kvt_run bad_local[2] = {ok, {(uint64_t)(uintptr_t)unreg, c->rbase, 4096}};
    assert_int_equal(kvt_submit(c->e, c->peer, 50, bad_local, 2, 0), KVC_E_INVAL);
    assert_non_null(strstr(kvc_last_error(), "run 1: local range"));
    kvt_run bad_remote[2] = {ok, {(uint64_t)(uintptr_t)c->src, c->rbase + REGION - 100, 4096}};
    assert_int_equal(kvt_submit(c->e, c->peer, 51, bad_remote, 2, 0), KVC_E_INVAL);
    assert_non_null(strstr(kvc_last_error(), "run 1: remote range"));
    kvt_run zero = {(uint64_t)(uintptr_t)c->src, c->rbase, 0};
    assert_int_equal(kvt_submit(c->e, c->peer, 52, &zero, 1, 0), KVC_E_INVAL);
    kvt_event ev[4];
    size_t n;
    assert_int_equal(kvt_progress(c->e, 200, ev, 4, &n), KVC_OK);
    assert_int_equal(n, 0);
    kvt_engine_stat(c->e, &after);
    assert_int_equal(after.writes_sent, before.writes_sent);
    kvc_room_info ri;
    assert_int_equal(kvc_room_get(c->ss, 50, 0, &ri), KVC_E_NOENT);
}

/* Replace c's sender by one with these options (conns, io_timeout_ms,
 * tcp_splice_min) on the socket path, its source registered and the
 * receiver imported. */
static void resender(ctx *c, uint32_t conns, uint32_t io_timeout_ms, uint32_t splice_min)
{
    kvt_engine_destroy(c->e);
    kvt_options o;
    kvt_options_init(&o);
    o.backend = KVT_BACKEND_TCP;
    o.seg = c->ss;
    o.conns_per_peer = conns;
    o.slice_bytes = 4u << 20;
    if (io_timeout_ms)
        o.io_timeout_ms = io_timeout_ms;
    o.tcp_splice_min = splice_min;
    o.force_socket = 1; /* splice is the socket path's (the receiver is on this host) */
    o.log = xu_quiet_log;
    assert_int_equal(kvt_engine_create(&o, &c->e), KVC_OK);
    assert_int_equal(kvt_mr_register(c->e, c->src, REGION, NULL), KVC_OK);
    assert_int_equal(kvt_peer_import(c->e, c->rx.desc, strlen(c->rx.desc), &c->peer), KVC_OK);
}

/* Drive c's sender until rooms first..first+n-1 have all failed (each
 * with code, unless 0); 0 when they did within 20 s. */
static int wait_failed(ctx *c, uint64_t first, int n, int32_t code)
{
    int seen = 0;
    for (int waited = 0; waited < 20000 && seen < n; waited += 50) {
        kvt_event ev[16];
        size_t k;
        if (kvt_progress(c->e, 50, ev, 16, &k))
            return -1;
        for (size_t i = 0; i < k; i++) {
            if (ev[i].room < first || ev[i].room >= first + (uint64_t)n)
                continue;
            if (ev[i].state != KVC_POLL_FAILED || (code && ev[i].code != code))
                return -1;
            seen++;
        }
    }
    return seen == n ? 0 : -1;
}

/* Large payloads go by vmsplice + splice (tcp_splice_min 256 KiB; off by
 * default) or by sendmsg (0): the exact bytes arrive either way, small
 * writes of the same batch included, and a source rewritten after a
 * room's event is what the next room delivers (the pipe carries the pages,
 * not a copy made earlier). */
static void test_splice_settings(void **state)
{
    ctx *c = *state;
    const uint32_t settings[2] = {256u << 10, 0};
    for (int k = 0; k < 2; k++) {
        resender(c, 1, 0, settings[k]);
        for (int round = 0; round < 2; round++) {
            xu_fill(c->src, REGION, 100 + (uint64_t)(2 * k + round));
            kvt_run runs[4] = {
                {3, 5, (9u << 20) + 1234},                 /* 4 MiB, 4 MiB, 1 MiB + 1234 */
                {(10u << 20) + 1, 12u << 20, 1000},        /* small: sendmsg */
                {(11u << 20) + 7, 13u << 20, 300u << 10},  /* just over the threshold */
                {(12u << 20) + 9, (14u << 20) + 3, 200000} /* under it */
            };
            uint64_t spliced = (9u << 20) + 1234 + (300u << 10);
            uint64_t total = spliced + 1000 + 200000;
            kvt_stats before, after;
            kvt_engine_stat(c->e, &before);
            uint64_t room = 60 + (uint64_t)(2 * k + round);
            submit(c, room, runs, 4);
            expect_success(c, room, total);
            kvt_engine_stat(c->e, &after);
            assert_int_equal(after.bytes_spliced - before.bytes_spliced, settings[k] ? spliced : 0);
        }
    }
}

/* The receiver stops reading (SIGSTOP) with more spliced rooms in flight
 * than the window and the socket buffers hold, so the sender's splice
 * waits on a full socket; then the receiver is killed.  Every room fails,
 * nothing hangs, and the engine sends the next room to a new receiver
 * (ASan: nothing leaked). */
static void test_splice_peer_killed(void **state)
{
    ctx *c = *state;
    const int nrooms = 6;          /* 96 MiB, 2 connections of a 32 MiB window */
    resender(c, 2, 0, 256u << 10); /* splice on (off by default) */
    kvt_run warm[2] = {{0, 0, 1u << 20}, {2u << 20, 2u << 20, 1u << 20}};
    submit(c, 69, warm, 2); /* both connections up */
    expect_success(c, 69, 2u << 20);
    assert_int_equal(kill(c->rx.pid, SIGSTOP), 0);
    for (int i = 0; i < nrooms; i++) {
        kvt_run run = {0, 0, REGION};
        submit(c, 70 + (uint64_t)i, &run, 1);
    }
    kvt_event ev[8];
    size_t n;
    for (int i = 0; i < 10; i++) {
        assert_int_equal(kvt_progress(c->e, 50, ev, 8, &n), KVC_OK);
        assert_int_equal(n, 0);
    }
    kvt_stats st;
    kvt_engine_stat(c->e, &st);
    assert_true(st.bytes_spliced > 0);
    assert_true(st.bytes_spliced < (uint64_t)nrooms * REGION);
    assert_int_equal(kill(c->rx.pid, SIGKILL), 0);
    waitpid(c->rx.pid, NULL, 0);
    c->rx.pid = 0;
    assert_int_equal(wait_failed(c, 70, nrooms, 0), 0);
    xu_receiver_stop(&c->rx);
    assert_int_equal(xu_receiver_start(&c->rx, "127.0.0.1:0", REGION, c->seg_r, 0, 0), 0);
    assert_int_equal(kvt_peer_import(c->e, c->rx.desc, strlen(c->rx.desc), &c->peer), KVC_OK);
    c->rbase = desc_base(c->rx.desc);
    memset(c->mirror, 0, REGION);
    kvt_run run = {5, 7, 6u << 20};
    submit(c, 80, &run, 1);
    expect_success(c, 80, 6u << 20);
}

/* The same stop, but the sender's io_timeout fails the rooms: closing the
 * connections ends the splice waiting on the full socket (no hang). */
static void test_splice_stalled_timeout(void **state)
{
    ctx *c = *state;
    resender(c, 1, 500, 256u << 10);
    kvt_run warm = {0, 0, 1u << 20};
    submit(c, 89, &warm, 1); /* the connection up */
    expect_success(c, 89, 1u << 20);
    assert_int_equal(kill(c->rx.pid, SIGSTOP), 0);
    for (int i = 0; i < 3; i++) {
        kvt_run run = {0, 0, REGION};
        submit(c, 90 + (uint64_t)i, &run, 1);
    }
    assert_int_equal(wait_failed(c, 90, 3, ETIMEDOUT), 0);
    kvt_stats st;
    kvt_engine_stat(c->e, &st);
    assert_true(st.bytes_spliced > 0);
    assert_int_equal(kill(c->rx.pid, SIGCONT), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_scattered_pages, setup, teardown),
        cmocka_unit_test_setup_teardown(test_coalesce_slice, setup, teardown),
        cmocka_unit_test_setup_teardown(test_unaligned, setup, teardown),
        cmocka_unit_test_setup_teardown(test_concurrent_rooms, setup, teardown),
        cmocka_unit_test_setup_teardown(test_refused_before_send, setup, teardown),
        cmocka_unit_test_setup_teardown(test_splice_settings, setup, teardown),
        cmocka_unit_test_setup_teardown(test_splice_peer_killed, setup, teardown),
        cmocka_unit_test_setup_teardown(test_splice_stalled_timeout, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
