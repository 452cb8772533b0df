/* test_ranks.c - the rank table in one process: register, look up,
 * overwrite, identical no-op, capacities, withdraw, list, wait. */
#include <pthread.h>

#include "testutil.h"

static const char *NAME;
static kvc_segment *S;

static int setup(void **st)
{
    (void)st;
    NAME = tu_name();
    S = tu_open(NAME, KVC_OPEN_FRESH, KVC_ROLE_WORKER);
    return 0;
}

static int teardown(void **st)
{
    (void)st;
    kvc_close(S);
    kvc_unlink(NAME);
    return 0;
}

static void test_register_lookup_overwrite(void **st)
{
    (void)st;
    char *v1 = tu_info(10, 1), *v2 = tu_info(20, 2);
    uint64_t gen = 0;
    kvc_rank_info ri = {0};
    assert_int_equal(kvc_rank_lookup(S, 0, &ri), KVC_E_NOENT);
    assert_int_equal(kvc_rank_register(S, 0, "127.0.0.1:16000", v1, strlen(v1), &gen), KVC_OK);
    assert_int_equal(gen, 1);
    assert_int_equal(kvc_rank_lookup(S, 0, &ri), KVC_OK);
    assert_int_equal(ri.state, KVC_RANK_REGISTERED);
    assert_int_equal(ri.entries, 10);
    assert_int_equal(ri.info_len, strlen(v1));
    assert_string_equal(ri.info, v1);
    assert_int_equal(ri.pid, getpid());
    /* identical: no-op, same generation */
    assert_int_equal(kvc_rank_register(S, 0, "127.0.0.1:16000", v1, strlen(v1), &gen), KVC_OK);
    assert_int_equal(gen, 1);
    /* overwrite: new value, generation bumped */
    assert_int_equal(kvc_rank_register(S, 0, "127.0.0.1:16100", v2, strlen(v2), &gen), KVC_OK);
    assert_int_equal(gen, 2);
    assert_int_equal(kvc_rank_lookup(S, 0, &ri), KVC_OK);
    assert_string_equal(ri.info, v2);
    assert_string_equal(ri.session_id, "127.0.0.1:16100");
    assert_int_equal(ri.generation, 2);
    /* same info, new session_id is a change */
    assert_int_equal(kvc_rank_register(S, 0, "127.0.0.1:16000", v2, strlen(v2), &gen), KVC_OK);
    assert_int_equal(gen, 3);
    kvc_segment_info si;
    kvc_segment_stat(S, &si);
    assert_int_equal(si.ranks_registered, 1);
    /* Only the live half holds arena blocks. */
    assert_int_equal(si.arena_used, (strlen(v2) + 15 + 1023) / 1024 * 1024);
    free(v1);
    free(v2);
    kvc_rank_info_free(&ri);
}

static void test_bad_input(void **st)
{
    (void)st;
    kvc_rank_info ri = {0};
    assert_int_equal(kvc_rank_register(S, 64, "h:1", "{}", 2, NULL), KVC_E_CAPACITY);
    assert_non_null(strstr(kvc_last_error(), "max ranks (64"));
    assert_int_equal(kvc_rank_lookup(S, 1000, &ri), KVC_E_CAPACITY);
    assert_int_equal(kvc_rank_register(S, 1, "", "{}", 2, NULL), KVC_E_INVAL);
    assert_int_equal(kvc_rank_register(S, 1, "h:1", "[1,2]", 5, NULL), KVC_E_INVAL);
    assert_non_null(strstr(kvc_last_error(), "JSON object"));
    assert_int_equal(kvc_rank_register(S, 1, "h:1", "{\"a\":", 5, NULL), KVC_E_INVAL);
    assert_non_null(strstr(kvc_last_error(), "line 1"));
    assert_int_equal(kvc_rank_register(S, 1, NULL, "{}", 2, NULL), KVC_E_INVAL);
    char sid[KVC_SESSION_ID_MAX + 2];
    memset(sid, 'x', sizeof sid - 1);
    sid[sizeof sid - 1] = '\0';
    assert_int_equal(kvc_rank_register(S, 1, sid, "{}", 2, NULL), KVC_E_TOOBIG);
    /* Over max info bytes (8 MiB in tests). */
    size_t big = (8u << 20) + 10;
    char *huge = malloc(big);
    memset(huge, ' ', big);
    huge[0] = '{';
    huge[big - 1] = '}';
    assert_int_equal(kvc_rank_register(S, 1, "h:1", huge, big, NULL), KVC_E_TOOBIG);
    assert_non_null(strstr(kvc_last_error(), "max info bytes"));
    free(huge);
    /* Nothing was stored by any of these. */
    assert_int_equal(kvc_rank_lookup(S, 1, &ri), KVC_E_NOENT);
    kvc_rank_info_free(&ri);
}

static void test_withdraw_and_list(void **st)
{
    (void)st;
    for (uint32_t r = 10; r < 14; r++)
        assert_int_equal(kvc_rank_register(S, r, "h:2", "{\"x\":[1,2,2]}", 13, NULL), KVC_OK);
    assert_int_equal(kvc_rank_withdraw(S, 11, "process 42 exited: killed by signal 9"), KVC_OK);
    assert_int_equal(kvc_rank_withdraw(S, 11, NULL), KVC_E_NOENT);
    kvc_rank_info ri = {0};
    assert_int_equal(kvc_rank_lookup(S, 11, &ri), KVC_E_WITHDRAWN);
    assert_string_equal(ri.note, "process 42 exited: killed by signal 9");
    assert_int_equal(ri.generation, 2);
    kvc_rank_info list[64];
    memset(list, 0, sizeof list);
    size_t n = 0;
    assert_int_equal(kvc_rank_list(S, list, 64, &n, 0), KVC_OK);
    size_t seen = 0;
    for (size_t i = 0; i < n; i++)
        if (list[i].rank >= 10 && list[i].rank < 14) {
            assert_int_not_equal(list[i].rank, 11);
            assert_string_equal(list[i].session_id, "h:2");
            assert_int_equal(list[i].entries, 1);
            seen++;
        }
    assert_int_equal(seen, 3);
    size_t n2 = 0;
    assert_int_equal(kvc_rank_list(S, list, 2, &n2, 1), KVC_OK);
    assert_int_equal(n2, n + 1); /* count beyond cap, withdrawn included */
    /* Re-registering a withdrawn rank works and bumps the generation. */
    uint64_t gen;
    assert_int_equal(kvc_rank_register(S, 11, "h:3", "{}", 2, &gen), KVC_OK);
    assert_int_equal(gen, 3);
    kvc_rank_info_free(&ri);
}

static void test_arena_full(void **st)
{
    (void)st;
    /* 64 MiB arena, 8 MiB max per rank: fill it with 6 MiB ranks. */
    size_t len = 6u << 20;
    char *v = malloc(len);
    memset(v, ' ', len);
    v[0] = '{';
    v[len - 1] = '}';
    kvc_err e = KVC_OK;
    uint32_t r = 20;
    for (; r < 40 && !e; r++)
        e = kvc_rank_register(S, r, "h:4", v, len, NULL);
    assert_int_equal(e, KVC_E_FULL);
    assert_non_null(strstr(kvc_last_error(), "arena"));
    for (uint32_t q = 20; q < r - 1; q++)
        assert_int_equal(kvc_rank_withdraw(S, q, NULL), KVC_OK);
    assert_int_equal(kvc_rank_register(S, 20, "h:4", v, len, NULL), KVC_OK);
    assert_int_equal(kvc_rank_withdraw(S, 20, NULL), KVC_OK);
    free(v);
}

struct waiter {
    uint32_t rank;
    kvc_err result;
    char sid[KVC_SESSION_ID_MAX + 1];
};

static void *wait_thread(void *arg)
{
    struct waiter *w = arg;
    kvc_rank_info ri = {0};
    w->result = kvc_rank_wait(S, w->rank, 20000, &ri);
    snprintf(w->sid, sizeof w->sid, "%s", ri.session_id);
    kvc_rank_info_free(&ri);
    return NULL;
}

static void test_wait_timeout_and_wake(void **st)
{
    (void)st;
    kvc_rank_info ri = {0};
    assert_int_equal(kvc_rank_wait(S, 50, 30, &ri), KVC_E_TIMEDOUT);
    assert_int_equal(kvc_rank_wait(S, 50, 0, &ri), KVC_E_TIMEDOUT);
    struct waiter w = {.rank = 50};
    pthread_t t;
    pthread_create(&t, NULL, wait_thread, &w);
    usleep(50000);
    assert_int_equal(kvc_rank_register(S, 50, "10.0.0.5:16050", "{}", 2, NULL), KVC_OK);
    pthread_join(t, NULL);
    assert_int_equal(w.result, KVC_OK);
    assert_string_equal(w.sid, "10.0.0.5:16050");
    uint32_t ep = kvc_rank_epoch(S);
    assert_int_equal(kvc_rank_wait_change(S, ep, 20), KVC_E_TIMEDOUT);
    assert_int_equal(kvc_rank_wait_change(S, ep - 1, 20), KVC_OK);
    kvc_rank_info_free(&ri);
}

/* A mirrored entry (kvcoordd's cluster view) carries its origin node and
 * generation, survives its writer's exit, and a local registration of the
 * same bytes takes it back. */
static void test_mirror_origin(void **st)
{
    (void)st;
    char *v = tu_info(5, 7);
    uint64_t gen = 0;
    kvc_rank_info ri = {0};
    assert_int_equal(kvc_rank_register_mirror(S, 3, "10.0.0.9:16000", v, strlen(v), "node-b", 42,
                                              KVC_GEN_ANY, &gen),
                     KVC_OK);
    assert_int_equal(gen, 1);
    assert_int_equal(kvc_rank_lookup(S, 3, &ri), KVC_OK);
    assert_string_equal(ri.origin, "node-b");
    assert_int_equal(ri.origin_generation, 42);
    assert_string_equal(ri.info, v);
    /* identical mirror: no change */
    assert_int_equal(kvc_rank_register_mirror(S, 3, "10.0.0.9:16000", v, strlen(v), "node-b", 42,
                                              KVC_GEN_ANY, &gen),
                     KVC_OK);
    assert_int_equal(gen, 1);
    /* new origin generation: a change */
    assert_int_equal(kvc_rank_register_mirror(S, 3, "10.0.0.9:16000", v, strlen(v), "node-b", 43,
                                              KVC_GEN_ANY, &gen),
                     KVC_OK);
    assert_int_equal(gen, 2);
    /* bad origin names */
    assert_int_equal(kvc_rank_register_mirror(S, 3, "x:1", v, strlen(v), "", 1, KVC_GEN_ANY, NULL),
                     KVC_E_INVAL);
    assert_int_equal(
        kvc_rank_register_mirror(S, 3, "x:1", v, strlen(v), "a/b", 1, KVC_GEN_ANY, NULL),
        KVC_E_INVAL);
    assert_int_equal(kvc_rank_register_mirror(S, 3, "x:1", "[1]", 3, "b", 1, KVC_GEN_ANY, NULL),
                     KVC_E_INVAL);
    /* a local registration of the same bytes is a change: the entry is local */
    assert_int_equal(kvc_rank_register(S, 3, "10.0.0.9:16000", v, strlen(v), &gen), KVC_OK);
    assert_int_equal(gen, 3);
    assert_int_equal(kvc_rank_lookup(S, 3, &ri), KVC_OK);
    assert_string_equal(ri.origin, "");
    assert_int_equal(ri.origin_generation, 0);
    /* withdrawing a mirror keeps whose it was */
    assert_int_equal(
        kvc_rank_register_mirror(S, 4, "h:1", v, strlen(v), "node-c", 1, KVC_GEN_ANY, NULL),
        KVC_OK);
    assert_int_equal(kvc_rank_withdraw(S, 4, "node-c left"), KVC_OK);
    assert_int_equal(kvc_rank_lookup(S, 4, &ri), KVC_E_WITHDRAWN);
    assert_string_equal(ri.origin, "node-c");
    assert_string_equal(ri.note, "node-c left");
    /* the list reports origins */
    kvc_rank_info list[64] = {0};
    size_t n = 0;
    assert_int_equal(kvc_rank_list(S, list, 64, &n, 1), KVC_OK);
    int seen = 0;
    for (size_t i = 0; i < n && i < 64; i++)
        if (list[i].rank == 4)
            seen = !strcmp(list[i].origin, "node-c");
    assert_true(seen);
    /* Conditional mirror writes: never over a change the caller has not seen. */
    kvc_rank_info cur = {0};
    assert_int_equal(kvc_rank_lookup(S, 3, &cur), KVC_OK); /* local now */
    assert_int_equal(
        kvc_rank_register_mirror(S, 3, "m:1", v, strlen(v), "node-b", 44, cur.generation - 1, NULL),
        KVC_E_EXISTS);
    assert_int_equal(kvc_rank_withdraw_mirror(S, 3, "x", KVC_GEN_ANY), KVC_E_EXISTS);
    assert_int_equal(
        kvc_rank_register_mirror(S, 3, "m:1", v, strlen(v), "node-b", 44, cur.generation, &gen),
        KVC_OK);
    assert_int_equal(kvc_rank_withdraw_mirror(S, 3, "x", gen - 1), KVC_E_EXISTS);
    assert_int_equal(kvc_rank_withdraw_mirror(S, 3, "node-b left", gen), KVC_OK);
    assert_int_equal(kvc_rank_withdraw_mirror(S, 3, "again", KVC_GEN_ANY), KVC_E_NOENT);
    assert_int_equal(kvc_rank_register_mirror(S, 5, "m:5", v, strlen(v), "node-b", 1, 0, NULL),
                     KVC_OK); /* never registered: generation 0 */
    kvc_rank_withdraw(S, 5, NULL);
    kvc_rank_info_free(&cur);
    free(v);
    kvc_rank_info_free(&ri);
}

/* Mirrors under a role and of parallelism configs: the same rules as the
 * rank table's (origin kept, conditional writes, withdrawal as a mirror
 * only), each (rank, role) its own entry. */
static void test_role_and_parallelism_mirrors(void **st)
{
    (void)st;
    char *v = tu_info(3, 9);
    const char *cfg = "{\"tp_size\": 8, \"tp_rank\": 6}";
    uint64_t gen = 0, pgen = 0;
    kvc_rank_info ri = {0};
    kvc_rank_info list[8] = {{0}};
    size_t n = 9;
    assert_int_equal(kvc_role_list(S, "never-used", list, 8, &n, 1), KVC_OK);
    assert_int_equal(n, 0);
    assert_int_equal(kvc_role_register_mirror(S, "draft", 6, "d:6", v, strlen(v), "node-b", 7,
                                              KVC_GEN_ANY, &gen),
                     KVC_OK);
    assert_int_equal(kvc_role_lookup(S, "draft", 6, &ri), KVC_OK);
    assert_string_equal(ri.origin, "node-b");
    assert_int_equal(ri.origin_generation, 7);
    assert_string_equal(ri.session_id, "d:6");
    assert_int_equal(kvc_rank_lookup(S, 6, &ri), KVC_E_NOENT); /* the target's rank 6: untouched */
    assert_int_equal(kvc_role_list(S, "draft", list, 8, &n, 1), KVC_OK);
    assert_int_equal(n, 1);
    assert_int_equal(list[0].rank, 6);
    assert_string_equal(list[0].origin, "node-b");
    assert_int_equal(
        kvc_role_register_mirror(S, "draft", 6, "d:6", "[1]", 3, "node-b", 8, KVC_GEN_ANY, NULL),
        KVC_E_INVAL);
    assert_int_equal(kvc_role_withdraw_mirror(S, "draft", 6, "x", gen + 1), KVC_E_EXISTS);
    assert_int_equal(kvc_role_withdraw_mirror(S, "draft", 6, "node-b left", gen), KVC_OK);
    assert_int_equal(kvc_role_lookup(S, "draft", 6, &ri), KVC_E_WITHDRAWN);
    assert_string_equal(ri.origin, "node-b");
    assert_string_equal(ri.note, "node-b left");
    assert_int_equal(kvc_role_withdraw_mirror(S, "no-such-role", 6, "x", KVC_GEN_ANY), KVC_E_NOENT);

    assert_int_equal(
        kvc_parallelism_register_mirror(S, NULL, 6, cfg, strlen(cfg), "node-b", 2, 0, &pgen),
        KVC_OK);
    assert_int_equal(kvc_parallelism_lookup(S, "target", 6, &ri), KVC_OK);
    assert_string_equal(ri.info, cfg);
    assert_string_equal(ri.origin, "node-b");
    assert_string_equal(ri.session_id, "");
    assert_int_equal(
        kvc_parallelism_register_mirror(S, NULL, 6, "[1]", 3, "node-b", 3, KVC_GEN_ANY, NULL),
        KVC_E_INVAL);
    assert_int_equal(kvc_parallelism_list(S, NULL, list, 8, &n, 0), KVC_OK);
    assert_int_equal(n, 1);
    assert_string_equal(list[0].origin, "node-b");
    /* a local registration takes it back: no longer withdrawn as a mirror */
    assert_int_equal(kvc_parallelism_register(S, NULL, 6, cfg, strlen(cfg), &gen), KVC_OK);
    assert_int_equal(kvc_parallelism_lookup(S, NULL, 6, &ri), KVC_OK);
    assert_string_equal(ri.origin, "");
    assert_int_equal(kvc_parallelism_withdraw_mirror(S, NULL, 6, "x", KVC_GEN_ANY), KVC_E_EXISTS);
    assert_int_equal(
        kvc_parallelism_register_mirror(S, NULL, 6, cfg, strlen(cfg), "node-b", 4, gen - 1, NULL),
        KVC_E_EXISTS);
    assert_int_equal(
        kvc_parallelism_register_mirror(S, NULL, 6, cfg, strlen(cfg), "node-b", 4, gen, &pgen),
        KVC_OK);
    assert_int_equal(kvc_parallelism_withdraw_mirror(S, NULL, 6, "node-b left", pgen), KVC_OK);
    assert_int_equal(kvc_parallelism_lookup(S, NULL, 6, &ri), KVC_E_WITHDRAWN);
    assert_string_equal(ri.origin, "node-b");
    free(v);
    kvc_rank_info_free(&ri);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_register_lookup_overwrite),
        cmocka_unit_test(test_bad_input),
        cmocka_unit_test(test_withdraw_and_list),
        cmocka_unit_test(test_arena_full),
        cmocka_unit_test(test_wait_timeout_and_wake),
        cmocka_unit_test(test_mirror_origin),
        cmocka_unit_test(test_role_and_parallelism_mirrors),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
