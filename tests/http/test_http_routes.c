/*
 * test_http_routes.c - the route table declares what each route is, and
 * nothing that changes the segment is reachable without the token.
 *
 * For every route of the table and every method (the accepted ones and a
 * few others), a request is run the way kvcoordd runs it - routes_dispatch()
 * on the loop's routes, then routes_deferred() on a helper's clone when it
 * says ROUTE_DEFER - against a real segment, with a token configured:
 *   - without the token: a route that changed anything (rank table, rooms,
 *     failure records, parallelism configs) fails the test, whatever its
 *     flags say; a mutating route must answer 401 and leave the body
 *     unread (routes_head_check() refuses it from the headers);
 *   - with the token: every mutating route does change the segment (so
 *     the check above can see a change: the test can fail);
 *   - a route accepting PUT, POST, DELETE or PATCH is flagged mutating.
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
#include <http_parser.h>

#include "auth.h"
#include "buf.h"
#include "http_routes.h"
#include "kvcoord/kvcoord.h"
#include "kvcoord/pd.h"

#define TOKEN "s3cret-token"
#define RANK 1

struct fixture {
    kvc_segment *seg;
    char name[64];
    struct auth auth;
    struct routes *loop, *worker;
    unsigned counter; /* fresh values per request: a no-op is never mistaken */
};

/* What a request may change. */
struct state {
    uint32_t rank_epoch, room_epoch;
    size_t failures;
    uint64_t pcfg_gen; /* 0: none */
    kvc_pd_gauges pd;  /* sglang's PD tables */
};

static struct state snapshot(struct fixture *f)
{
    struct state st = {kvc_rank_epoch(f->seg), kvc_room_epoch(f->seg), 0, 0, {0}};
    assert_int_equal(kvc_pd_gauges_get(f->seg, &st.pd), KVC_OK);
    kvc_failure_info fi[64];
    assert_int_equal(kvc_failures_recent(f->seg, fi, 64, &st.failures), KVC_OK);
    kvc_rank_info ri = {0};
    if (kvc_parallelism_lookup(f->seg, "", RANK, &ri) == KVC_OK)
        st.pcfg_gen = ri.generation;
    kvc_rank_info_free(&ri);
    return st;
}

static int changed(const struct state *a, const struct state *b)
{
    return a->rank_epoch != b->rank_epoch || a->room_epoch != b->room_epoch ||
           a->failures != b->failures || a->pcfg_gen != b->pcfg_gen ||
           memcmp(&a->pd, &b->pd, sizeof a->pd);
}

static int setup(void **state)
{
    struct fixture *f = calloc(1, sizeof *f);
    assert_non_null(f);
    snprintf(f->name, sizeof f->name, "kvctest-routes-%d", (int)getpid());
    kvc_options o;
    kvc_options_init(&o);
    o.name = f->name;
    o.mode = KVC_OPEN_FRESH;
    o.max_ranks = 16;
    o.max_info_bytes = 1 << 16;
    o.arena_bytes = 16 << 20;
    o.max_rooms = 256;
    o.max_procs = 16;
    assert_int_equal(kvc_open(&o, &f->seg), KVC_OK);
    char err[256];
    assert_int_equal(auth_init(&f->auth, NULL, TOKEN, err, sizeof err), 0);
    assert_true(auth_enabled(&f->auth));
    assert_int_equal(routes_create(&f->loop, f->seg), 0);
    routes_set_ops(f->loop, &f->auth, NULL);
    assert_int_equal(routes_clone(f->loop, &f->worker), 0);
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    struct fixture *f = *state;
    routes_destroy(f->worker);
    routes_destroy(f->loop);
    auth_clear(&f->auth);
    kvc_close(f->seg);
    kvc_unlink(f->name);
    free(f);
    return 0;
}

/* Run req as kvcoordd does; returns the status answered. */
static int run(struct fixture *f, const struct http_req *req)
{
    struct route_slot slot = {0};
    struct buf out = {0};
    enum route_rc rc = routes_dispatch(f->loop, &slot, req, &out);
    if (rc == ROUTE_DEFER)
        routes_deferred(f->worker, req, &out);
    else if (rc == ROUTE_PARK) /* a lookup with wait_ms: none here */
        fail_msg("%s parked", req->path);
    int status = 0;
    assert_true(out.len > 12);
    sscanf(out.p, "HTTP/1.1 %d", &status);
    buf_free(&out);
    route_slot_free(&slot);
    return status;
}

/* A request for the route's pattern ("{room}" -> a fresh room id), with a body
 * every mutating route accepts. */
struct built {
    char path[128], query[32], body[512], authz[64];
    struct http_req req;
};

static void build(struct fixture *f, const struct route *rt, int method, int with_token,
                  struct built *b)
{
    unsigned n = ++f->counter;
    const char *arg = strchr(rt->pattern, '{');
    if (arg)
        snprintf(b->path, sizeof b->path, "%.*s%u%s", (int)(arg - rt->pattern), rt->pattern,
                 1000 + n, strchr(arg, '}') + 1);
    else
        snprintf(b->path, sizeof b->path, "%s", rt->pattern);
    snprintf(b->query, sizeof b->query, "rank=%d", RANK);
    snprintf(b->body, sizeof b->body,
             "{\"rank\":%d,\"transfer_engine_info\":{\"session_id\":\"10.0.0.%u:1\","
             "\"weights_info_dict\":{\"w\":[%u,2,3]}},\"parallelism_config\":{\"tp\":%u},"
             "\"reason\":\"test %u\",\"code\":1}",
             RANK, n % 250, n, n, n);
    if (!strcmp(rt->pattern, "/route")) /* sglang's PD registration, a new rank each time */
        snprintf(b->body, sizeof b->body,
                 "{\"attn_tp_size\":64,\"attn_tp_rank\":%u,\"attn_cp_size\":1,"
                 "\"attn_cp_rank\":0,\"attn_dp_size\":1,\"attn_dp_rank\":0,\"pp_size\":1,"
                 "\"pp_rank\":0,\"system_dp_size\":1,\"system_dp_rank\":0,"
                 "\"rank_ip\":\"10.0.0.1\",\"rank_port\":%u,\"page_size\":64,"
                 "\"kv_cache_dtype\":\"auto\"}",
                 n % 64, 17000 + n);
    else if (!strcmp(rt->pattern, "/register_dp_rank"))
        snprintf(b->body, sizeof b->body, "{\"bootstrap_room\":%u,\"dp_rank\":0}", 5000 + n);
    snprintf(b->authz, sizeof b->authz, "Bearer " TOKEN);
    b->req = (struct http_req){.method = method,
                               .path = b->path,
                               .path_len = strlen(b->path),
                               .raw_path = b->path,
                               .raw_path_len = strlen(b->path),
                               .query = b->query,
                               .query_len = strlen(b->query),
                               .body = b->body,
                               .body_len = strlen(b->body),
                               .http_minor = 1,
                               .keep_alive = 1};
    if (with_token) {
        b->req.authorization = b->authz;
        b->req.authorization_len = strlen(b->authz);
    }
}

/* The rank exists before each request, so a withdrawal has one to withdraw. */
static void reset(struct fixture *f)
{
    char info[64];
    snprintf(info, sizeof info, "{\"w\":[%u,1,1]}", f->counter);
    assert_int_equal(kvc_rank_register(f->seg, RANK, "10.0.0.1:1", info, strlen(info), NULL),
                     KVC_OK);
}

static const int methods[] = {HTTP_GET, HTTP_HEAD, HTTP_PUT, HTTP_POST, HTTP_DELETE, HTTP_PATCH};

static void test_state_changing_methods_are_flagged(void **state)
{
    (void)state;
    size_t n;
    const struct route *t = routes_table(&n);
    assert_true(n >= 16);
    uint64_t changing = (UINT64_C(1) << HTTP_PUT) | (UINT64_C(1) << HTTP_POST) |
                        (UINT64_C(1) << HTTP_DELETE) | (UINT64_C(1) << HTTP_PATCH);
    for (size_t i = 0; i < n; i++)
        if ((t[i].methods & changing) && !(t[i].flags & (ROUTE_MUTATING | ROUTE_READS_ONLY)))
            fail_msg("%s accepts a state-changing method but is flagged neither "
                     "ROUTE_MUTATING nor ROUTE_READS_ONLY",
                     t[i].pattern);
}

/* ROUTE_OWN_405: the path's first row (where route_find lands for a
 * method no row takes) carries the handler of the other methods; no row
 * has one without the flag.  One dispatch, from the table. */
static void test_own_405_from_the_table(void **state)
{
    (void)state;
    size_t n;
    const struct route *t = routes_table(&n);
    for (size_t i = 0; i < n; i++) {
        int first = 1;
        for (size_t j = 0; j < i; j++)
            first &= strcmp(t[j].pattern, t[i].pattern) != 0;
        if (t[i].own_405 && !(t[i].flags & ROUTE_OWN_405))
            fail_msg("%s has own_405 without ROUTE_OWN_405", t[i].pattern);
        if (first && (t[i].flags & ROUTE_OWN_405) && !t[i].own_405)
            fail_msg("%s is ROUTE_OWN_405 but its first row has no own_405", t[i].pattern);
    }
}

/* The entry of t that serves method on t[i]'s path (as route_find picks
 * it: the first of the path's entries accepting it), or NULL. */
static const struct route *entry_for(const struct route *t, size_t n, size_t i, int method)
{
    for (size_t j = 0; j < n; j++)
        if (!strcmp(t[j].pattern, t[i].pattern) && (t[j].methods & (UINT64_C(1) << method)))
            return &t[j];
    return NULL;
}

static void test_no_change_without_the_token(void **state)
{
    struct fixture *f = *state;
    size_t n;
    const struct route *t = routes_table(&n);
    unsigned mutating_runs = 0;
    for (size_t i = 0; i < n; i++) {
        for (size_t k = 0; k < sizeof methods / sizeof methods[0]; k++) {
            int m = methods[k];
            struct built b;
            reset(f);
            build(f, &t[i], m, 0, &b);
            struct state before = snapshot(f);
            int status = run(f, &b.req);
            struct state after = snapshot(f);
            if (changed(&before, &after))
                fail_msg("%s %s changed the segment without the token (answered %d)",
                         http_method_str((enum http_method)m), b.path, status);
            const struct route *e = entry_for(t, n, i, m);
            int accepted = e != NULL;
            if (accepted && (e->flags & ROUTE_MUTATING)) {
                assert_int_equal(status, 401);
                /* refused from the headers, before its body is buffered */
                assert_int_equal(routes_head_check(f->loop, &b.req), 401);
                mutating_runs++;
            } else if (!accepted) {
                assert_int_equal(status, 405);
            }
        }
    }
    assert_true(mutating_runs >= 9); /* 4 routes x 2 methods, DELETE 1, 2 PD (+ repeats) */
}

static void test_the_token_lets_each_mutating_route_change_it(void **state)
{
    struct fixture *f = *state;
    size_t n;
    const struct route *t = routes_table(&n);
    for (size_t i = 0; i < n; i++) {
        if (!(t[i].flags & ROUTE_MUTATING))
            continue;
        if (!strncmp(t[i].pattern, "/cluster/", 9))
            continue; /* 404 without --etcd; with it: tests/cluster/test_shared_rooms.py */
        for (size_t k = 0; k < sizeof methods / sizeof methods[0]; k++) {
            int m = methods[k];
            if (!(t[i].methods & (UINT64_C(1) << m)))
                continue;
            struct built b;
            reset(f);
            build(f, &t[i], m, 1, &b);
            assert_int_equal(routes_head_check(f->loop, &b.req), 0);
            struct state before = snapshot(f);
            int status = run(f, &b.req);
            struct state after = snapshot(f);
            if (status != 200 || !changed(&before, &after))
                fail_msg("%s %s with the token: %d, segment %s",
                         http_method_str((enum http_method)m), b.path, status,
                         changed(&before, &after) ? "changed" : "unchanged");
        }
    }
}

/* The one matcher: segments first, then each decoded alone. */
static void test_paths_match_by_segment(void **state)
{
    struct fixture *f = *state;
    struct {
        const char *path;
        int method, status;
    } cases[] = {
        {"/health", HTTP_GET, 200},
        {"/h%65alth", HTTP_GET, 200},          /* an escaped letter is the letter */
        {"/rooms/5%2Ffailure", HTTP_GET, 400}, /* room "5/failure": invalid id */
        {"/rooms/5%2Ffailure", HTTP_PUT, 405}, /* not the failure route */
        {"/rooms%2F5", HTTP_GET, 404},         /* one segment "rooms/5" */
        {"/rooms/", HTTP_GET, 404},            /* an empty id is no room path */
        {"/rooms//failure", HTTP_PUT, 404},
        {"/rooms/5/failure/x", HTTP_PUT, 404},
        {"/health/", HTTP_GET, 307}, /* trailing slash: redirected */
        {"/rooms/5/failure/", HTTP_PUT, 307},
        {"/nope", HTTP_GET, 404},
        {"/health", HTTP_DELETE, 405},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct http_req req = {.method = cases[i].method,
                               .path = cases[i].path,
                               .path_len = strlen(cases[i].path),
                               .raw_path = cases[i].path,
                               .raw_path_len = strlen(cases[i].path),
                               .query = "",
                               .body = "",
                               .http_minor = 1,
                               .keep_alive = 1,
                               .authorization = "Bearer " TOKEN,
                               .authorization_len = strlen("Bearer " TOKEN)};
        int got = run(f, &req);
        if (got != cases[i].status)
            fail_msg("%s %s: %d, wanted %d", http_method_str((enum http_method)cases[i].method),
                     cases[i].path, got, cases[i].status);
    }
}

/* A long-poll lookup of an absent rank: wait_ms above the cap parks for the
 * cap, and the 404 at its end says the wait was capped; one within the cap
 * parks for what was asked and ends in the plain 404. */
static void test_wait_ms_capped_and_said(void **state)
{
    struct fixture *f = *state;
    static const struct {
        const char *query;
        uint32_t parked_ms;
        int capped;
    } cases[] = {
        {"rank=9&wait_ms=600000", ROUTES_MAX_WAIT_MS, 1},
        {"rank=9&wait_ms=18446744073709551615", ROUTES_MAX_WAIT_MS, 1},
        {"rank=9&wait_ms=60000", ROUTES_MAX_WAIT_MS, 0},
        {"rank=9&wait_ms=250", 250, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct http_req req = {.method = HTTP_GET,
                               .path = "/get_transfer_engine_info",
                               .path_len = strlen("/get_transfer_engine_info"),
                               .raw_path = "/get_transfer_engine_info",
                               .raw_path_len = strlen("/get_transfer_engine_info"),
                               .query = cases[i].query,
                               .query_len = strlen(cases[i].query),
                               .body = "",
                               .http_minor = 1,
                               .keep_alive = 1};
        struct route_slot slot = {0};
        struct buf out = {0};
        assert_int_equal(routes_dispatch(f->loop, &slot, &req, &out), ROUTE_PARK);
        assert_int_equal(slot.park_wait_ms, cases[i].parked_ms);
        assert_int_equal(routes_resume(f->loop, &slot, &req, &out, 1), ROUTE_DONE);
        buf_flatten(&out);
        buf_append(&out, "", 1);
        if (strncmp(out.p, "HTTP/1.1 404", 12))
            fail_msg("%s: %s", cases[i].query, out.p);
        const char *said = strstr(out.p, "No transfer engine info for rank 9");
        assert_non_null(said);
        int has = strstr(said, "(waited 60000 ms: wait_ms is capped at 60000)") != NULL;
        if (has != cases[i].capped)
            fail_msg("%s: %s", cases[i].query, said);
        buf_free(&out);
        route_slot_free(&slot);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_state_changing_methods_are_flagged),
        cmocka_unit_test(test_own_405_from_the_table),
        cmocka_unit_test_setup_teardown(test_no_change_without_the_token, setup, teardown),
        cmocka_unit_test_setup_teardown(test_the_token_lets_each_mutating_route_change_it, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_paths_match_by_segment, setup, teardown),
        cmocka_unit_test_setup_teardown(test_wait_ms_capped_and_said, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
