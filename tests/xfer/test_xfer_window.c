/* test_xfer_window.c - rooms much larger than the connections' windows,
 * and many rooms outstanding at once, complete with every byte in place.
 *
 * The sender runs a small window (128 KiB per connection, 2 connections,
 * 64 KiB slices), so the flow control of kvt__peer_pump / on_ack carries
 * every room many times over: a write room and a read room of 32x the
 * peer's total window, and 32 rooms of 2x that window submitted before
 * the engine is driven once.  Each waits for its event with no time limit
 * of its own (ctest's timeout catches a hang); bytes are checked by
 * checksum against a mirror of the receiver's whole region. */
#include <stdbool.h>

#include "testutil.h"
#include "xfer_util.h"

#define REGION (16u << 20)
#define PAGE (64u << 10)
#define WINDOW (128u << 10)
#define CONNS 2u
#define NPAGES (REGION / PAGE)

typedef struct ctx {
    xu_receiver rx;
    kvt_engine *e;
    kvt_peer *peer;
    unsigned char *src, *dst, *mirror;
    uint64_t rbase;
    uint32_t perm[NPAGES]; /* a shuffled page order */
} ctx;

static uint64_t desc_base(const char *desc)
{
    const char *a = strstr(desc, "\"addr\":");
    return a ? strtoull(a + 7, NULL, 10) : 0;
}

static int setup(void **state)
{
    ctx *c = calloc(1, sizeof *c);
    assert_int_equal(xu_receiver_start(&c->rx, "127.0.0.1:0", REGION, NULL, 0, 0), 0);
    kvt_options o;
    kvt_options_init(&o);
    o.backend = KVT_BACKEND_TCP;
    o.conns_per_peer = CONNS;
    o.slice_bytes = PAGE;
    o.window_bytes = WINDOW;
    o.log = xu_quiet_log;
    if (kvt_engine_create(&o, &c->e))
        fail_msg("kvt_engine_create: %s", kvc_last_error());
    c->src = xu_map(REGION);
    c->dst = xu_map(REGION);
    c->mirror = xu_map(REGION);
    assert_non_null(c->src);
    assert_non_null(c->dst);
    assert_non_null(c->mirror);
    xu_fill(c->src, REGION, 23);
    assert_int_equal(kvt_mr_register(c->e, c->src, REGION, NULL), KVC_OK);
    assert_int_equal(kvt_mr_register(c->e, c->dst, REGION, NULL), KVC_OK);
    assert_int_equal(kvt_peer_import(c->e, c->rx.desc, strlen(c->rx.desc), &c->peer), KVC_OK);
    c->rbase = desc_base(c->rx.desc);
    assert_true(c->rbase != 0);
    for (uint32_t i = 0; i < NPAGES; i++)
        c->perm[i] = i;
    srand(5);
    for (uint32_t i = NPAGES - 1; i > 0; i--) {
        uint32_t j = (uint32_t)rand() % (i + 1), t = c->perm[i];
        c->perm[i] = c->perm[j];
        c->perm[j] = t;
    }
    *state = c;
    return 0;
}

static int teardown(void **state)
{
    ctx *c = *state;
    kvt_engine_destroy(c->e);
    xu_receiver_stop(&c->rx);
    munmap(c->src, REGION);
    munmap(c->dst, REGION);
    munmap(c->mirror, REGION);
    free(c);
    return 0;
}

/* n scattered pages: local page perm[first + i], remote page
 * perm[NPAGES - 1 - first - i] (never contiguous with a neighbour on both
 * sides at once, so nothing merges), as absolute addresses. */
static void page_runs(ctx *c, uint32_t first, uint32_t n, unsigned char *local, kvt_run *runs)
{
    for (uint32_t i = 0; i < n; i++) {
        uint64_t l = (uint64_t)c->perm[first + i] * PAGE;
        uint64_t r = (uint64_t)c->perm[NPAGES - 1 - first - i] * PAGE;
        runs[i] = (kvt_run){(uint64_t)(uintptr_t)local + l, c->rbase + r, PAGE};
    }
}

static void mirror_writes(ctx *c, const kvt_run *runs, size_t n)
{
    for (size_t i = 0; i < n; i++)
        memcpy(c->mirror + (runs[i].raddr - c->rbase), (const void *)(uintptr_t)runs[i].laddr,
               runs[i].len);
}

/* Drive the engine until the events of want rooms [first, first+want)
 * arrived (xu_next_events: no limit of its own); each must be Success
 * with bytes each. */
static void wait_rooms(ctx *c, uint64_t first, uint32_t want, uint64_t bytes, kvt_side side)
{
    bool *seen = calloc(want, sizeof *seen);
    uint32_t got = 0;
    while (got < want) {
        kvt_event ev[16];
        size_t n;
        if (xu_next_events(c->e, ev, 16, &n))
            fail_msg("kvt_progress: %s", kvc_last_error());
        for (size_t i = 0; i < n; i++) {
            if (ev[i].state != KVC_POLL_SUCCESS)
                fail_msg("room %llu failed: %s", (unsigned long long)ev[i].room, ev[i].reason);
            assert_true(ev[i].room >= first && ev[i].room < first + want);
            assert_false(seen[ev[i].room - first]);
            seen[ev[i].room - first] = true;
            assert_int_equal(ev[i].side, side);
            assert_int_equal(ev[i].bytes, bytes);
            got++;
        }
    }
    free(seen);
}

/* The receiver's reports of rooms [first, first+want): Success, bytes
 * each; the region after the last one equals the mirror. */
static void expect_received(ctx *c, uint64_t first, uint32_t want, uint64_t bytes)
{
    xu_report r;
    for (uint32_t k = 0; k < want; k++) {
        assert_int_equal(xu_read_all(c->rx.rd, &r, sizeof r, -1), 0);
        assert_true(r.room >= first && r.room < first + want);
        if (r.state != KVC_POLL_SUCCESS)
            fail_msg("receiver: room %llu failed: %s", (unsigned long long)r.room, r.reason);
        assert_int_equal(r.bytes, bytes);
    }
    assert_true(r.sum == xu_sum(c->mirror, REGION)); /* every byte, no stray write */
}

/* One write room of 8 MiB in 128 scattered 64 KiB pages: 32x the
 * sender's two windows together. */
static void test_write_room_32x_window(void **state)
{
    ctx *c = *state;
    uint32_t n = 128;
    kvt_run *runs = calloc(n, sizeof *runs);
    page_runs(c, 0, n, c->src, runs);
    mirror_writes(c, runs, n);
    assert_true((uint64_t)n * PAGE >= 4ull * CONNS * WINDOW);
    if (kvt_submit(c->e, c->peer, 1, runs, n, KVT_SUBMIT_NOROOM))
        fail_msg("kvt_submit: %s", kvc_last_error());
    wait_rooms(c, 1, 1, (uint64_t)n * PAGE, KVT_SIDE_SENDER);
    expect_received(c, 1, 1, (uint64_t)n * PAGE);
    free(runs);
}

/* 32 rooms of 512 KiB (8 pages, 2x the windows together) submitted before
 * the engine is driven: all complete, every byte in place. */
static void test_many_rooms_outstanding(void **state)
{
    ctx *c = *state;
    uint32_t rooms = 32, per = 8;
    kvt_run runs[8];
    for (uint32_t k = 0; k < rooms; k++) {
        page_runs(c, k * per, per, c->src, runs);
        mirror_writes(c, runs, per);
        if (kvt_submit(c->e, c->peer, 100 + k, runs, per, KVT_SUBMIT_NOROOM))
            fail_msg("kvt_submit room %u: %s", 100 + k, kvc_last_error());
    }
    wait_rooms(c, 100, rooms, (uint64_t)per * PAGE, KVT_SIDE_SENDER);
    expect_received(c, 100, rooms, (uint64_t)per * PAGE);
}

/* Write 8 MiB of scattered pages, then read them back (other local pages,
 * one read room of 32x the windows, and 16 read rooms outstanding):
 * byte for byte what was written. */
static void test_read_rooms_large_and_many(void **state)
{
    ctx *c = *state;
    uint32_t n = 128;
    kvt_run *runs = calloc(n, sizeof *runs);
    page_runs(c, 0, n, c->src, runs);
    mirror_writes(c, runs, n);
    if (kvt_submit(c->e, c->peer, 1, runs, n, KVT_SUBMIT_NOROOM))
        fail_msg("kvt_submit: %s", kvc_last_error());
    wait_rooms(c, 1, 1, (uint64_t)n * PAGE, KVT_SIDE_SENDER);
    expect_received(c, 1, 1, (uint64_t)n * PAGE);
    /* the same remote pages into dst, same local offsets as in src */
    page_runs(c, 0, n, c->dst, runs);
    if (kvt_submit_read(c->e, c->peer, 2, runs, n, KVT_SUBMIT_NOROOM))
        fail_msg("kvt_submit_read: %s", kvc_last_error());
    wait_rooms(c, 2, 1, (uint64_t)n * PAGE, KVT_SIDE_READER);
    for (uint32_t i = 0; i < n; i++) {
        size_t off = (size_t)c->perm[i] * PAGE;
        assert_memory_equal(c->dst + off, c->src + off, PAGE);
    }
    memset(c->dst, 0, REGION);
    for (uint32_t k = 0; k < 16; k++) {
        page_runs(c, k * 8, 8, c->dst, runs);
        if (kvt_submit_read(c->e, c->peer, 10 + k, runs, 8, KVT_SUBMIT_NOROOM))
            fail_msg("kvt_submit_read room %u: %s", 10 + k, kvc_last_error());
    }
    wait_rooms(c, 10, 16, 8ull * PAGE, KVT_SIDE_READER);
    for (uint32_t i = 0; i < n; i++) {
        size_t off = (size_t)c->perm[i] * PAGE;
        assert_memory_equal(c->dst + off, c->src + off, PAGE);
    }
    free(runs);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_write_room_32x_window, setup, teardown),
        cmocka_unit_test_setup_teardown(test_many_rooms_outstanding, setup, teardown),
        cmocka_unit_test_setup_teardown(test_read_rooms_large_and_many, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
