/*
 * test_metrics.c - GET /metrics' renderer (src/metrics.c) on a segment in a
 * known state: ranks registered, re-registered and withdrawn, rooms in
 * every KVPoll state, failures from two origin ranks, daemon counters.
 *
 *   test_metrics              cmocka: check the values
 *   test_metrics --dump FILE  write the same exposition to FILE (for
 *                             `promtool check metrics`, test_promtool.sh)
 *   test_metrics --dump-bare FILE  the exposition of fresh counters and no
 *                             segment (empty families)
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "buf.h"
#include "kvcoord/kvcoord.h"
#include "http_routes.h"
#include "metrics.h"

static char seg_name[64];

static void check(kvc_err e, const char *what)
{
    if (e)
        fail_msg("%s: %s: %s", what, kvc_strerror(e), kvc_last_error());
}

/* Build the known state; returns the open segment. */
static kvc_segment *build_segment(void)
{
    snprintf(seg_name, sizeof seg_name, "kvctest-ops-metrics-%d", (int)getpid());
    kvc_options o;
    kvc_options_init(&o);
    o.name = seg_name;
    o.mode = KVC_OPEN_FRESH;
    o.role = KVC_ROLE_DAEMON;
    o.max_ranks = 64;
    o.max_rooms = 128;
    o.world_size = 8; /* failure origins 5 and 2 are participants */
    o.arena_bytes = 16ull << 20;
    o.max_info_bytes = 1ull << 20;
    kvc_segment *seg = NULL;
    check(kvc_open(&o, &seg), "kvc_open");
    /* Unlinked by close_segment(): an unlinked segment refuses changes
     * (KVC_E_STALE), so not before the state is built. */
    const char *info = "{\"w\":[140000000000,1024,2]}";
    for (uint32_t r = 0; r < 3; r++)
        check(kvc_rank_register(seg, r, "10.0.0.5:16000", info, strlen(info), NULL), "register");
    const char *info2 = "{\"w\":[140000000256,1024,2]}";
    check(kvc_rank_register(seg, 1, "10.0.0.5:16001", info2, strlen(info2), NULL), "re-register");
    check(kvc_rank_register(seg, 7, "10.0.0.5:16007", info, strlen(info), NULL), "register 7");
    check(kvc_rank_withdraw(seg, 2, "test"), "withdraw");
    /* rooms: 10 Bootstrapping, 11 WaitingForInput, 12 Transferring, 13 Success,
     * 14/15/16 Failed (origins 5, 5, 2) */
    for (uint64_t room = 10; room <= 13; room++)
        check(kvc_room_open(seg, room, 1, 0, KVC_ROOM_ROLE_PREFILL), "room_open");
    check(kvc_room_set_state(seg, 11, 0, KVC_POLL_WAITING_FOR_INPUT), "state 11");
    check(kvc_room_set_state(seg, 12, 0, KVC_POLL_TRANSFERRING), "state 12");
    check(kvc_room_set_state(seg, 13, 0, KVC_POLL_SUCCESS), "state 13");
    check(kvc_room_fail(seg, 14, 5, 110, "timed out", NULL), "fail 14");
    check(kvc_room_fail(seg, 15, 5, 12, "WR flush error", NULL), "fail 15");
    check(kvc_room_fail(seg, 16, 2, 0, "peer \"gone\"", NULL), "fail 16");
    return seg;
}

/* Close and remove the segment build_segment() made. */
static void close_segment(kvc_segment *seg)
{
    if (!seg)
        return;
    kvc_close(seg);
    kvc_unlink(seg_name);
}

static struct metrics *build_metrics(void)
{
    struct metrics *m = metrics_create();
    assert_non_null(m);
    metrics_request(m, metrics_route_of("/register_transfer_engine_info", 30), 200, 3000000);
    unsigned reg = metrics_route_of("/register_transfer_engine_info", 30);
    metrics_request(m, reg, 200, 3000000);
    metrics_request(m, reg, 401, 20000);
    metrics_request(m, metrics_route_of("/get_transfer_engine_info", 25), 404, 50000);
    metrics_request(m, metrics_route_of("/nope", 5), 404, 10000);
    metrics_request(m, metrics_route_of("/get_transfer_engine_info", 25), 200,
                    70000000000ull);                               /* past the last bucket */
    metrics_request(m, metrics_route_of("/health", 7), 999, 1000); /* odd status: counted as 0 */
    metrics_conn_open(m);
    metrics_conn_open(m);
    metrics_conn_open(m);
    metrics_conn_close(m);
    metrics_conn_refused(m);
    metrics_dead_processes(m, 2);
    metrics_auth_reload(m, 1);
    metrics_auth_reload(m, 0);
    metrics_auth_reload(m, 1);
    metrics_buffered(m, 4096, 1 << 20);
    return m;
}

static char *render(kvc_segment *seg, const struct metrics *m)
{
    struct buf b = {0};
    assert_int_equal(metrics_render(&b, seg, m), 0);
    buf_puts(&b, ""); /* NUL-terminate below */
    char *s = malloc(b.len + 1);
    memcpy(s, b.p, b.len);
    s[b.len] = '\0';
    buf_free(&b);
    return s;
}

/* The exposition holds the sample line `line` exactly. */
static void has(const char *text, const char *line)
{
    size_t n = strlen(line);
    for (const char *p = text; (p = strstr(p, line)); p++)
        if ((p == text || p[-1] == '\n') && p[n] == '\n')
            return;
    fail_msg("missing line: %s", line);
}

static void lacks(const char *text, const char *prefix)
{
    for (const char *p = text; (p = strstr(p, prefix)); p++)
        if (p == text || p[-1] == '\n')
            fail_msg("unexpected line starting: %s", prefix);
}

static void test_segment_families(void **state)
{
    (void)state;
    kvc_segment *seg = build_segment();
    struct metrics *m = build_metrics();
    char *t = render(seg, m);
    has(t, "# TYPE kvcoord_ranks_registered gauge");
    has(t, "kvcoord_ranks_registered 3");
    has(t, "kvcoord_ranks_withdrawn 1");
    has(t, "kvcoord_ranks_max 64");
    has(t, "kvcoord_world_size 8");
    has(t, "kvcoord_rank_generation{rank=\"0\"} 1");
    has(t, "kvcoord_rank_generation{rank=\"1\"} 2");
    has(t, "kvcoord_rank_generation{rank=\"2\"} 2");
    has(t, "kvcoord_rank_generation{rank=\"7\"} 1");
    lacks(t, "kvcoord_rank_generation{rank=\"3\"}");
    has(t, "kvcoord_rooms{state=\"Bootstrapping\"} 1");
    has(t, "kvcoord_rooms{state=\"WaitingForInput\"} 1");
    has(t, "kvcoord_rooms{state=\"Transferring\"} 1");
    has(t, "kvcoord_rooms{state=\"Success\"} 1");
    has(t, "kvcoord_rooms{state=\"Failed\"} 3");
    has(t, "kvcoord_rooms_max 128");
    has(t, "# TYPE kvcoord_failures_total counter");
    has(t, "kvcoord_failures_total 3");
    has(t, "kvcoord_failures_recent{origin_rank=\"5\"} 2");
    has(t, "kvcoord_failures_recent{origin_rank=\"2\"} 1");
    has(t, "# TYPE kvcoord_lock_recoveries_total counter");
    has(t, "kvcoord_lock_recoveries_total 0");
    has(t, "kvcoord_processes_attached{role=\"daemon\"} 1");
    has(t, "kvcoord_processes_dead 0");
    char line[160];
    snprintf(line, sizeof line, "kvcoord_segment_info{segment=\"%s\"} 1", seg_name);
    has(t, line);
    kvc_segment_info si;
    check(kvc_segment_stat(seg, &si), "stat");
    assert_true(si.arena_used > 0);
    snprintf(line, sizeof line, "kvcoord_arena_used_bytes %llu", (unsigned long long)si.arena_used);
    has(t, line);
    has(t, "kvcoord_arena_size_bytes 16777216");
    snprintf(line, sizeof line, "kvcoord_build_info{version=\"%s\",layout_version=\"%u\"} 1",
             KVC_VERSION, KVC_LAYOUT_VERSION);
    has(t, line);
    free(t);
    metrics_destroy(m);
    close_segment(seg);
}

static void test_daemon_families(void **state)
{
    (void)state;
    struct metrics *m = build_metrics();
    char *t = render(NULL, m);
    lacks(t, "kvcoord_rooms{");
    has(t,
        "kvcoord_http_requests_total{route=\"/register_transfer_engine_info\",status=\"200\"} 2");
    has(t,
        "kvcoord_http_requests_total{route=\"/register_transfer_engine_info\",status=\"401\"} 1");
    has(t, "kvcoord_http_requests_total{route=\"/get_transfer_engine_info\",status=\"404\"} 1");
    has(t, "kvcoord_http_requests_total{route=\"other\",status=\"404\"} 1");
    has(t, "kvcoord_http_requests_total{route=\"/health\",status=\"0\"} 1");
    lacks(t, "kvcoord_http_requests_total{route=\"/ranks\"");
    /* 20 us, 3 ms, 3 ms: cumulative buckets */
    has(t, "# TYPE kvcoord_http_request_duration_seconds histogram");
    has(t, "kvcoord_http_request_duration_seconds_bucket{route=\"/"
           "register_transfer_engine_info\",le=\"0.0001\"} 1");
    has(t, "kvcoord_http_request_duration_seconds_bucket{route=\"/"
           "register_transfer_engine_info\",le=\"0.0025\"} 1");
    has(t, "kvcoord_http_request_duration_seconds_bucket{route=\"/"
           "register_transfer_engine_info\",le=\"0.005\"} 3");
    has(t, "kvcoord_http_request_duration_seconds_bucket{route=\"/"
           "register_transfer_engine_info\",le=\"+Inf\"} 3");
    has(t, "kvcoord_http_request_duration_seconds_sum{route=\"/register_transfer_engine_info\"} "
           "0.006020000");
    has(t,
        "kvcoord_http_request_duration_seconds_count{route=\"/register_transfer_engine_info\"} 3");
    /* 70 s lands only in +Inf */
    has(t, "kvcoord_http_request_duration_seconds_bucket{route=\"/"
           "get_transfer_engine_info\",le=\"60\"} 1");
    has(t, "kvcoord_http_request_duration_seconds_bucket{route=\"/"
           "get_transfer_engine_info\",le=\"+Inf\"} 2");
    has(t, "kvcoord_http_request_duration_seconds_sum{route=\"/get_transfer_engine_info\"} "
           "70.000050000");
    has(t, "kvcoord_http_request_duration_seconds_count{route=\"/metrics\"} 0");
    has(t, "kvcoord_http_open_connections 2");
    has(t, "kvcoord_http_connections_total 3");
    has(t, "kvcoord_http_connections_refused_total 1");
    has(t, "kvcoord_http_buffered_bytes 4096");
    has(t, "kvcoord_http_buffered_bytes_max 1048576");
    has(t, "kvcoord_dead_processes_total 2");
    has(t, "kvcoord_auth_reloads_total{result=\"ok\"} 2");
    has(t, "kvcoord_auth_reloads_total{result=\"error\"} 1");
    free(t);
    metrics_destroy(m);
}

static void test_label_escape(void **state)
{
    (void)state;
    struct buf b = {0};
    const char in[] = "a\"b\\c\nd\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80\xc0\xaf\xed\xa0\x80z";
    metrics_label_escape(&b, in, sizeof in - 1);
    buf_append(&b, "", 1);
    /* valid 2/3/4-byte sequences kept; overlong C0 AF and surrogate ED A0 80
     * replaced byte by byte */
    assert_string_equal(b.p, "a\\\"b\\\\c\\nd\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80"
                             "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbdz");
    buf_free(&b);
    /* every label comes from the route table's row: each path of the
     * table has its own, an unknown path is "other" */
    static const struct {
        const char *path, *label;
    } cases[] = {
        {"/rooms/42", "/rooms/{room}"},
        {"/rooms/42/failure", "/rooms/{room}/failure"},
        {"/rooms", "other"},
        {"/roomsx", "other"},
        {"/metrics", "/metrics"},
        {"/failures", "/failures"},
        {"/cluster", "/cluster"},
        {"/register_parallelism_config", "/register_parallelism_config"},
        {"/get_parallelism_config", "/get_parallelism_config"},
        {"/route", "/route"},
        {"/register_dp_rank", "/register_dp_rank"},
        {"/query_dp_ranks", "/query_dp_ranks"},
        {"/nope", "other"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        assert_string_equal(
            metrics_route_name(metrics_route_of(cases[i].path, strlen(cases[i].path))),
            cases[i].label);
    assert_int_equal(metrics_route_of("/nope", 5), MR_OTHER);
    assert_string_equal(metrics_route_name(MR_MAX), "other");
    /* every path of the table has a label of its own, none is "other" */
    size_t n;
    const struct route *t = routes_table(&n);
    for (size_t i = 0; i < n; i++) {
        if (strchr(t[i].pattern, '{'))
            continue;
        unsigned r = metrics_route_of(t[i].pattern, strlen(t[i].pattern));
        assert_true(r != MR_OTHER);
        assert_string_equal(metrics_route_name(r), t[i].pattern);
    }
}

int main(int argc, char **argv)
{
    if (argc == 3 && (!strcmp(argv[1], "--dump") || !strcmp(argv[1], "--dump-bare"))) {
        int bare = !strcmp(argv[1], "--dump-bare");
        kvc_segment *seg = bare ? NULL : build_segment();
        struct metrics *m = bare ? metrics_create() : build_metrics();
        char *t = render(seg, m);
        FILE *f = fopen(argv[2], "w");
        if (!f || fputs(t, f) < 0 || fclose(f)) {
            perror(argv[2]);
            return 1;
        }
        free(t);
        metrics_destroy(m);
        close_segment(seg);
        return 0;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_segment_families),
        cmocka_unit_test(test_daemon_families),
        cmocka_unit_test(test_label_escape),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
