/* test_xfer_token.c - the handshake token (kvt_options.token).
 *
 * Two TCP engines in this process, driven in turn:
 *  - the same token on both sides: rooms succeed on both sides, bytes
 *    verified;
 *  - a receiver with a token and a sender with none, with a wrong one of
 *    another length, of the same length, or a prefix of it: the handshake
 *    is refused; the sender's room fails naming the receiver, with
 *    "unauthorized" and "token" (EACCES, not a dead peer); the receiver
 *    logs the refusal naming the sender; not one byte lands in the
 *    receiver's region and it reports no room;
 *  - a sender with a token and a receiver without: accepted (the token
 *    authenticates a sender to the receiver whose memory it writes; a
 *    receiver that requires none ignores it);
 *  - kvt__token_equal on its own, and the options checks (empty, too long).
 * Timing is not asserted (never wall-clock); kvt__token_equal's constant
 * time is by construction (every byte of the padded buffers compared). */
#include <stdbool.h>

#include "testutil.h"
#include "xfer_frame.h"
#include "xfer_util.h"

#define REGION (2u << 20)

static char rx_log[8192];

static void capture_log(void *ctx, int level, const char *msg)
{
    (void)ctx;
    if (level <= KVT_LOG_WARN) {
        size_t n = strlen(rx_log);
        snprintf(rx_log + n, sizeof rx_log - n, "%s\n", msg);
    }
    if (getenv("XU_VERBOSE"))
        fprintf(stderr, "[token] %s\n", msg);
}

static kvt_engine *engine(const char *token, kvt_log_fn log)
{
    kvt_options o;
    kvt_options_init(&o);
    o.backend = KVT_BACKEND_TCP;
    o.token = token;
    o.log = log ? log : xu_quiet_log;
    o.connect_timeout_ms = 3000;
    o.io_timeout_ms = 3000;
    kvt_engine *e = NULL;
    if (kvt_engine_create(&o, &e))
        fail_msg("kvt_engine_create: %s", kvc_last_error());
    return e;
}

typedef struct pair {
    kvt_engine *tx, *rx;
    kvt_peer *peer;
    unsigned char *src, *dst;
} pair;

static void pair_open(pair *p, const char *tx_token, const char *rx_token)
{
    rx_log[0] = '\0';
    p->tx = engine(tx_token, NULL);
    p->rx = engine(rx_token, capture_log);
    p->src = xu_map(REGION);
    p->dst = xu_map(REGION);
    assert_non_null(p->src);
    assert_non_null(p->dst);
    xu_fill(p->src, REGION, 77);
    assert_int_equal(kvt_mr_register(p->tx, p->src, REGION, NULL), KVC_OK);
    assert_int_equal(kvt_mr_register(p->rx, p->dst, REGION, NULL), KVC_OK);
    char *desc;
    assert_int_equal(kvt_descriptor_export(p->rx, &desc), KVC_OK);
    assert_int_equal(kvt_peer_import(p->tx, desc, strlen(desc), &p->peer), KVC_OK);
    free(desc);
}

static void pair_close(pair *p)
{
    kvt_engine_destroy(p->tx);
    kvt_engine_destroy(p->rx);
    munmap(p->src, REGION);
    munmap(p->dst, REGION);
}

/* Submit one room of the whole region (sliced into 1 MiB writes) and drive
 * both engines until the sender's event; the receiver's events, if any,
 * go to rx_ev (*nrx counts them).  Drives the receiver a little longer
 * after the sender's event so that any event of its would show. */
static kvt_event run_room(pair *p, uint64_t room, kvt_event *rx_ev, size_t *nrx)
{
    kvt_run run = {(uint64_t)(uintptr_t)p->src, (uint64_t)(uintptr_t)p->dst, REGION};
    assert_int_equal(kvt_submit(p->tx, p->peer, room, &run, 1, 0), KVC_OK);
    kvt_event tx_ev;
    bool got = false;
    int after = 0;
    *nrx = 0;
    for (int i = 0; i < 4000 && after < 20; i++) {
        kvt_event ev[8];
        size_t n;
        assert_int_equal(kvt_progress(p->tx, 1, ev, 8, &n), KVC_OK);
        for (size_t k = 0; k < n; k++)
            if (ev[k].room == room) {
                tx_ev = ev[k];
                got = true;
            }
        assert_int_equal(kvt_progress(p->rx, 1, ev, 8, &n), KVC_OK);
        for (size_t k = 0; k < n && *nrx < 4; k++)
            rx_ev[(*nrx)++] = ev[k];
        if (got)
            after++;
    }
    assert_true(got);
    return tx_ev;
}

static void test_same_token(void **state)
{
    (void)state;
    pair p;
    pair_open(&p, "s3cret-token", "s3cret-token");
    for (uint64_t room = 1; room <= 3; room++) {
        memset(p.dst, 0, REGION);
        kvt_event rx_ev[4];
        size_t nrx;
        kvt_event ev = run_room(&p, room, rx_ev, &nrx);
        if (ev.state != KVC_POLL_SUCCESS)
            fail_msg("room %llu: %s", (unsigned long long)room, ev.reason);
        assert_int_equal(ev.bytes, REGION);
        assert_int_equal(nrx, 1);
        assert_int_equal(rx_ev[0].room, room);
        assert_int_equal(rx_ev[0].state, KVC_POLL_SUCCESS);
        assert_int_equal(rx_ev[0].bytes, REGION);
        assert_true(xu_sum(p.dst, REGION) == xu_sum(p.src, REGION));
    }
    assert_null(strstr(rx_log, "unauthorized"));
    pair_close(&p);
}

/* The receiver requires rx_token; the sender offers tx_token (or none). */
static void refused(const char *tx_token, const char *rx_token, const char *what)
{
    pair p;
    pair_open(&p, tx_token, rx_token);
    kvt_event rx_ev[4];
    size_t nrx;
    kvt_event ev = run_room(&p, 9, rx_ev, &nrx);
    assert_int_equal(ev.state, KVC_POLL_FAILED);
    assert_int_equal(ev.code, EACCES);
    const char *rsid = kvt_session_id(p.rx), *tsid = kvt_session_id(p.tx);
    if (!strstr(ev.reason, rsid) || !strstr(ev.reason, "unauthorized") ||
        !strstr(ev.reason, "token") || !strstr(ev.reason, what) || strstr(ev.reason, "dead"))
        fail_msg("sender's reason \"%s\" should name %s, \"unauthorized\", \"%s\"", ev.reason, rsid,
                 what);
    assert_string_equal(ev.peer, rsid);
    /* The receiver: logged naming the sender, nothing written, no room. */
    if (!strstr(rx_log, "unauthorized") || !strstr(rx_log, tsid) || !strstr(rx_log, what))
        fail_msg("receiver's log lacks the refusal of %s: \"%s\"", tsid, rx_log);
    assert_int_equal(nrx, 0);
    for (size_t i = 0; i < REGION; i++)
        if (p.dst[i])
            fail_msg("byte %zu of the receiver's region was written", i);
    kvt_stats st;
    assert_int_equal(kvt_engine_stat(p.rx, &st), KVC_OK);
    assert_int_equal(st.writes_recv, 0);
    assert_int_equal(st.bytes_recv, 0);
    assert_true(st.frames_refused >= 1);
    /* The sender: the peer is unhealthy with that reason. */
    kvt_peer_info pi;
    assert_int_equal(kvt_peer_stat(p.tx, p.peer, &pi), KVC_OK);
    assert_int_equal(pi.healthy, 0);
    assert_int_equal(pi.last_code, EACCES);
    assert_non_null(strstr(pi.last_error, "unauthorized"));
    pair_close(&p);
}

static void test_sender_without_token(void **state)
{
    (void)state;
    refused(NULL, "s3cret-token", "sent no handshake token");
}

static void test_sender_wrong_token(void **state)
{
    (void)state;
    refused("s3cret-tokeN", "s3cret-token", "sent a wrong handshake token"); /* same length */
    refused("s3cret", "s3cret-token", "sent a wrong handshake token");       /* a prefix */
    refused("s3cret-token-and-more", "s3cret-token", "sent a wrong handshake token"); /* longer */
}

/* Decision: a receiver that requires no token accepts any sender, token or
 * not (docs/transfer.md, "Handshake token"). */
static void test_receiver_without_token(void **state)
{
    (void)state;
    pair p;
    pair_open(&p, "s3cret-token", NULL);
    kvt_event rx_ev[4];
    size_t nrx;
    kvt_event ev = run_room(&p, 5, rx_ev, &nrx);
    if (ev.state != KVC_POLL_SUCCESS)
        fail_msg("room: %s", ev.reason);
    assert_int_equal(nrx, 1);
    assert_int_equal(rx_ev[0].state, KVC_POLL_SUCCESS);
    assert_true(xu_sum(p.dst, REGION) == xu_sum(p.src, REGION));
    pair_close(&p);
}

static void pad(char out[KVT_HELLO_STR_MAX + 1], const char *s)
{
    memset(out, 0, KVT_HELLO_STR_MAX + 1);
    memcpy(out, s, strlen(s));
}

static void test_token_equal(void **state)
{
    (void)state;
    char a[KVT_HELLO_STR_MAX + 1], b[KVT_HELLO_STR_MAX + 1];
    pad(a, "abc");
    pad(b, "abc");
    assert_true(kvt__token_equal(a, b));
    pad(b, "abd");
    assert_false(kvt__token_equal(a, b));
    pad(b, "ab");
    assert_false(kvt__token_equal(a, b));
    pad(b, "abcd");
    assert_false(kvt__token_equal(a, b));
    pad(b, "");
    assert_false(kvt__token_equal(a, b));
    char longest[KVT_HELLO_STR_MAX + 1];
    memset(longest, 'x', KVT_HELLO_STR_MAX);
    longest[KVT_HELLO_STR_MAX] = '\0';
    pad(a, longest);
    pad(b, longest);
    assert_true(kvt__token_equal(a, b));
    b[KVT_HELLO_STR_MAX - 1] = 'y'; /* the last byte differs */
    assert_false(kvt__token_equal(a, b));
}

static void test_token_options(void **state)
{
    (void)state;
    kvt_options o;
    kvt_options_init(&o);
    o.backend = KVT_BACKEND_TCP;
    kvt_engine *e = NULL;
    o.token = "";
    assert_int_equal(kvt_engine_create(&o, &e), KVC_E_INVAL);
    assert_non_null(strstr(kvc_last_error(), "token is empty"));
    char big[KVT_HELLO_STR_MAX + 2];
    memset(big, 't', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    o.token = big;
    assert_int_equal(kvt_engine_create(&o, &e), KVC_E_INVAL);
    assert_non_null(strstr(kvc_last_error(), "token longer than"));
    big[KVT_HELLO_STR_MAX] = '\0'; /* 255 bytes: the longest allowed */
    assert_int_equal(kvt_engine_create(&o, &e), KVC_OK);
    kvt_engine_destroy(e);
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_token_equal),        cmocka_unit_test(test_token_options),
        cmocka_unit_test(test_same_token),         cmocka_unit_test(test_sender_without_token),
        cmocka_unit_test(test_sender_wrong_token), cmocka_unit_test(test_receiver_without_token),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
