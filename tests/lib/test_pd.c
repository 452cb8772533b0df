/* test_pd.c - the PD bootstrap tables (kvcoord/pd.h): sglang's registration
 * and topology rules, readiness by distinct ranks, bad input refused with
 * nothing stored, entries withdrawn when their process is SIGKILLed, writers
 * SIGKILLed half-way rolled back, and the room -> DP rank map's expiry. */
#include <signal.h>
#include <sys/wait.h>
#include <time.h>

#include "kvcoord/pd.h"
#include "testutil.h"
#include "tu_robust.h"
#include "internal.h"

static kvc_pd_registration reg(int tp, int dp)
{
    kvc_pd_registration r;
    memset(&r, 0, sizeof r);
    r.attn_tp_size = 2;
    r.attn_tp_rank = tp;
    r.attn_cp_size = 1;
    r.attn_dp_size = 2;
    r.attn_dp_rank = dp;
    r.pp_size = 1;
    r.system_dp_size = 1;
    r.rank_ip = "10.0.0.1";
    r.rank_port = 17000 + tp + 10 * dp;
    r.page_size = 64;
    r.kv_cache_dtype = "auto";
    r.follow_bootstrap_room = 1;
    return r;
}

static kvc_pd_status status(kvc_segment *s)
{
    kvc_pd_status st;
    assert_int_equal(kvc_pd_status_get(s, &st), KVC_OK);
    return st;
}

static void test_register_lookup_ready(void **state)
{
    (void)state;
    const char *name = tu_name();
    kvc_segment *s = tu_open(name, KVC_OPEN_CREATE, KVC_ROLE_DAEMON);
    kvc_pd_status st = status(s);
    assert_false(st.has_topology);
    assert_false(st.ready);
    /* TP=2 x DP=2, out of order; the first registration's topology stays. */
    int order[4][2] = {{1, 1}, {0, 0}, {1, 0}, {0, 1}};
    for (int i = 0; i < 4; i++) {
        kvc_pd_registration r = reg(order[i][0], order[i][1]);
        if (i == 0) {
            r.has_prefill_http_port = 1;
            r.prefill_http_port = 30000;
            r.kv_cache_dtype = NULL; /* taken from a later registration */
        } else {
            r.page_size = 128; /* not taken: the first had one */
        }
        assert_int_equal(kvc_pd_register(s, &r, KVC_PD_OWNER_NONE, 0, 0), KVC_OK);
        st = status(s);
        assert_int_equal(st.registered, (uint32_t)i + 1);
        assert_int_equal(st.ready, i == 3);
        /* Registered again: replaced, counted once. */
        assert_int_equal(kvc_pd_register(s, &r, KVC_PD_OWNER_NONE, 0, 0), KVC_OK);
        assert_int_equal(status(s).registered, (uint32_t)i + 1);
    }
    st = status(s);
    assert_true(st.has_topology);
    assert_int_equal(st.attn_tp_size, 2);
    assert_int_equal(st.dp_size, 2);
    assert_int_equal(st.expected, 4);
    assert_int_equal(st.page_size, 64);
    assert_true(st.has_kv_cache_dtype);
    assert_string_equal(st.kv_cache_dtype, "auto");
    assert_true(st.has_prefill_http_port);
    assert_int_equal(st.prefill_http_port, 30000);
    kvc_pd_rank pr;
    assert_int_equal(kvc_pd_lookup(s, 1, 0, 1, 0, &pr), KVC_OK);
    assert_string_equal(pr.rank_ip, "10.0.0.1");
    assert_int_equal(pr.rank_port, 17011);
    assert_int_equal(kvc_pd_lookup(s, 0, 0, 5, 0, &pr), KVC_E_NOENT);
    assert_int_equal(kvc_pd_lookup(s, -1, 0, 0, 0, &pr), KVC_E_NOENT);
    size_t n = 0;
    kvc_pd_rank list[8];
    assert_int_equal(kvc_pd_list(s, list, 8, &n), KVC_OK);
    assert_int_equal(n, 4);
    assert_int_equal(list[0].dp_group, 0);
    assert_int_equal(list[0].tp_rank, 0);
    assert_int_equal(list[3].dp_group, 1);
    assert_int_equal(list[3].tp_rank, 1);
    /* Withdrawn: the lookup says why; readiness drops. */
    assert_int_equal(kvc_pd_withdraw(s, 0, 0, 1, 0, "gone for a test"), KVC_OK);
    assert_int_equal(kvc_pd_lookup(s, 0, 0, 1, 0, &pr), KVC_E_WITHDRAWN);
    assert_string_equal(pr.note, "gone for a test");
    assert_false(status(s).ready);
    assert_int_equal(kvc_pd_withdraw(s, 0, 0, 1, 0, NULL), KVC_E_NOENT);
    /* system_dp_size > 1: the dp group is system_dp_rank, dp size system_dp_size. */
    for (int i = 0; i < 4; i++)
        kvc_pd_withdraw(s, list[i].dp_group, 0, list[i].tp_rank, 0, NULL);
    kvc_pd_registration r = reg(0, 0);
    r.system_dp_size = 3;
    r.system_dp_rank = 2;
    r.attn_dp_size = 1;
    assert_int_equal(kvc_pd_register(s, &r, KVC_PD_OWNER_NONE, 0, 0), KVC_OK);
    st = status(s);
    assert_int_equal(st.dp_size, 3); /* a fresh topology: the table was empty */
    assert_int_equal(kvc_pd_lookup(s, 2, 0, 0, 0, &pr), KVC_OK);
    kvc_close(s);
    kvc_unlink(name);
}

static void test_bad_input_stores_nothing(void **state)
{
    (void)state;
    const char *name = tu_name();
    kvc_segment *s = tu_open(name, KVC_OPEN_CREATE, KVC_ROLE_DAEMON);
    kvc_pd_registration bad[12];
    for (int i = 0; i < 12; i++)
        bad[i] = reg(0, 0);
    bad[0].attn_tp_size = 0;
    bad[1].attn_tp_rank = 2;
    bad[2].attn_cp_rank = -1;
    bad[3].pp_size = KVC_PD_DIM_MAX + 1;
    bad[4].system_dp_rank = 1;
    bad[5].rank_ip = "";
    bad[6].rank_ip = "10.0.0.1\n";
    bad[7].rank_port = 0;
    bad[8].rank_port = 65536;
    bad[9].page_size = 0;
    bad[10].kv_cache_dtype = "a very long dtype name that is far too long";
    bad[11].has_prefill_http_port = 1;
    for (int i = 0; i < 12; i++) {
        assert_int_equal(kvc_pd_register(s, &bad[i], KVC_PD_OWNER_NONE, 0, 0), KVC_E_INVAL);
        const char *err = kvc_last_error();
        assert_true(strstr(err, "range") || strstr(err, "byte"));
    }
    kvc_pd_registration ok = reg(0, 0);
    assert_int_equal(kvc_pd_register(s, &ok, (kvc_pd_owner)7, 0, 0), KVC_E_INVAL);
    assert_int_equal(kvc_pd_register(s, &ok, KVC_PD_OWNER_PID, 0, 0), KVC_E_INVAL);
    assert_int_equal(kvc_pd_register(s, NULL, KVC_PD_OWNER_NONE, 0, 0), KVC_E_INVAL);
    kvc_pd_status st = status(s);
    assert_int_equal(st.registered, 0);
    assert_false(st.has_topology);
    assert_int_equal(kvc_pd_room_set(s, 1, -1), KVC_E_INVAL);
    assert_int_equal(kvc_pd_room_set(s, 1, KVC_PD_DIM_MAX), KVC_E_INVAL);
    assert_int_equal(status(s).rooms, 0);
    size_t n;
    assert_int_equal(kvc_pd_list(s, NULL, 3, &n), KVC_E_INVAL);
    assert_int_equal(kvc_pd_list(s, NULL, 0, &n), KVC_OK);
    assert_int_equal(n, 0);
    kvc_close(s);
    kvc_unlink(name);
}

/* Waits (generously) for kvc_pd_reap to withdraw one entry. */
static void reap_until_withdrawn(kvc_segment *s, int32_t dp, int32_t tp)
{
    kvc_pd_rank pr;
    for (int i = 0; i < 1000; i++) {
        size_t n = 0;
        assert_int_equal(kvc_pd_reap(s, &n), KVC_OK);
        if (kvc_pd_lookup(s, dp, 0, tp, 0, &pr) == KVC_E_WITHDRAWN)
            return;
        usleep(10000);
    }
    fail_msg("entry dp=%d tp=%d never withdrawn", dp, tp);
}

static void test_sigkilled_registrant_withdrawn(void **state)
{
    (void)state;
    const char *name = tu_name();
    kvc_segment *s = tu_open(name, KVC_OPEN_CREATE, KVC_ROLE_DAEMON);
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    /* An attached worker registers for itself. */
    pid_t w = fork();
    if (w == 0) {
        kvc_segment *c = tu_open(name, KVC_OPEN_ATTACH, KVC_ROLE_WORKER);
        kvc_pd_registration r = reg(0, 0);
        char ok = kvc_pd_register(c, &r, KVC_PD_OWNER_SELF, 0, 0) == KVC_OK ? 'y' : 'n';
        if (write(fds[1], &ok, 1) != 1)
            _exit(2);
        pause();
        _exit(0);
    }
    /* A process that never attaches, registered on its behalf by pid. */
    pid_t p = fork();
    if (p == 0) {
        pause();
        _exit(0);
    }
    char c;
    assert_int_equal(read(fds[0], &c, 1), 1);
    assert_int_equal(c, 'y');
    kvc_proc_stat ps;
    assert_int_equal(kvc_proc_stat_read(p, &ps), KVC_OK);
    kvc_pd_registration r = reg(1, 0);
    assert_int_equal(kvc_pd_register(s, &r, KVC_PD_OWNER_PID, p, ps.start), KVC_OK);
    size_t n = 9;
    assert_int_equal(kvc_pd_reap(s, &n), KVC_OK);
    assert_int_equal(n, 0); /* both alive */
    assert_int_equal(status(s).registered, 2);
    kill(w, SIGKILL);
    kill(p, SIGKILL);
    assert_int_equal(waitpid(w, NULL, 0), w);
    assert_int_equal(waitpid(p, NULL, 0), p);
    reap_until_withdrawn(s, 0, 0);
    reap_until_withdrawn(s, 0, 1);
    kvc_pd_rank pr;
    assert_int_equal(kvc_pd_lookup(s, 0, 0, 1, 0, &pr), KVC_E_WITHDRAWN);
    char want[160], gone[96];
    /* reaped by us before the library looked: what is known of it */
    snprintf(want, sizeof want, "its process %d %s", (int)p,
             kvc_exit_unknown_text(ps.start, gone, sizeof gone));
    assert_non_null(strstr(pr.note, want));
    kvc_pd_status st = status(s);
    assert_int_equal(st.registered, 0);
    assert_int_equal(st.withdrawn, 2);
    assert_false(st.has_topology);
    close(fds[0]);
    close(fds[1]);
    kvc_close(s);
    kvc_unlink(name);
}

static const char *die_point;
static void die_at(const char *point)
{
    if (!strcmp(point, die_point))
        raise(SIGKILL);
}

/* A writer SIGKILLed at each point leaves what was there before. */
static void test_writer_killed_rolled_back(void **state)
{
    (void)state;
    static const char *const points[] = {"pd.rank.saved", "pd.rank.half", "pd.room.half"};
    for (size_t k = 0; k < 3; k++) {
        const char *name = tu_name();
        kvc_segment *s = tu_open(name, KVC_OPEN_CREATE, KVC_ROLE_DAEMON);
        kvc_pd_registration r = reg(0, 0);
        assert_int_equal(kvc_pd_register(s, &r, KVC_PD_OWNER_NONE, 0, 0), KVC_OK);
        assert_int_equal(kvc_pd_room_set(s, 77, 1), KVC_OK);
        kvc_segment_info before;
        kvc_segment_stat(s, &before);
        pid_t c = fork();
        if (c == 0) {
            kvc_segment *cs = tu_open(name, KVC_OPEN_ATTACH, KVC_ROLE_WORKER);
            die_point = points[k];
            kvc__test_set_inject(die_at);
            kvc_pd_registration r2 = reg(0, 0);
            r2.rank_ip = "10.9.9.9";
            r2.rank_port = 19999;
            kvc_pd_register(cs, &r2, KVC_PD_OWNER_NONE, 0, 0);
            kvc_pd_room_set(cs, 77, 0);
            _exit(3);
        }
        int st;
        assert_int_equal(waitpid(c, &st, 0), c);
        assert_true(WIFSIGNALED(st));
        tu_owner_died(s, c); /* the kernel's part, where it does not */
        /* Readers take no lock: before any recovery (the dead writer's
         * window may still be open) they read the table as it was before
         * the interrupted change; after the next writer's recovery too. */
        for (int pass = 0; pass < 2; pass++) {
            kvc_pd_rank pr;
            assert_int_equal(kvc_pd_lookup(s, 0, 0, 0, 0, &pr), KVC_OK);
            int32_t dp = -1;
            assert_int_equal(kvc_pd_room_get(s, 77, &dp), KVC_OK);
            if (k < 2) { /* the registration was rolled back */
                assert_string_equal(pr.rank_ip, "10.0.0.1");
                assert_int_equal(pr.rank_port, 17000);
                assert_int_equal(dp, 1);
            } else { /* the registration was whole, the room update rolled back */
                assert_string_equal(pr.rank_ip, "10.9.9.9");
                assert_int_equal(dp, 1);
            }
            kvc_pd_status ps = status(s);
            assert_int_equal(ps.registered, 1);
            assert_int_equal(ps.rooms, 1);
            kvc_segment_info after;
            kvc_segment_stat(s, &after);
            assert_int_equal(after.lock_recoveries, before.lock_recoveries + (unsigned)pass);
            if (!pass)
                assert_int_equal(kvc_pd_reap(s, NULL), KVC_OK); /* a writer: recovers */
        }
        kvc_close(s);
        kvc_unlink(name);
    }
}

static void test_room_map(void **state)
{
    (void)state;
    const char *name = tu_name();
    kvc_segment *s = tu_open(name, KVC_OPEN_CREATE, KVC_ROLE_DAEMON);
    int32_t dp;
    assert_int_equal(kvc_pd_room_get(s, 5, &dp), KVC_E_NOENT);
    assert_int_equal(kvc_pd_room_set(s, 5, 3), KVC_OK);
    assert_int_equal(kvc_pd_room_set(s, -5, 2), KVC_OK);
    assert_int_equal(kvc_pd_room_set(s, 5, 1), KVC_OK); /* replaced */
    assert_int_equal(kvc_pd_room_get(s, 5, &dp), KVC_OK);
    assert_int_equal(dp, 1);
    assert_int_equal(kvc_pd_room_get(s, -5, &dp), KVC_OK);
    assert_int_equal(dp, 2);
    assert_int_equal(status(s).rooms, 2);
    size_t n = 9;
    /* sglang's rule: only entries older than the interval go. */
    assert_int_equal(kvc_pd_room_sweep(s, 3600 * 1000, &n), KVC_OK);
    assert_int_equal(n, 0);
    struct timespec ts = {0, 5 * 1000 * 1000};
    nanosleep(&ts, NULL);
    assert_int_equal(kvc_pd_room_sweep(s, 1, &n), KVC_OK);
    assert_int_equal(n, 2);
    assert_int_equal(kvc_pd_room_get(s, 5, &dp), KVC_E_NOENT);
    /* Filled to capacity, then full; swept, reusable. */
    for (int64_t i = 0; i < KVC_PD_MAX_ROOMS - 1; i++)
        assert_int_equal(kvc_pd_room_set(s, i * 7919, (int32_t)(i % 8)), KVC_OK);
    assert_int_equal(kvc_pd_room_set(s, -1, 0), KVC_E_FULL);
    assert_int_equal(kvc_pd_room_get(s, 7919 * 100, &dp), KVC_OK);
    assert_int_equal(dp, 100 % 8);
    nanosleep(&ts, NULL);
    assert_int_equal(kvc_pd_room_sweep(s, 1, &n), KVC_OK);
    assert_int_equal(n, KVC_PD_MAX_ROOMS - 1);
    assert_int_equal(status(s).rooms, 0);
    for (int64_t i = 0; i < 1000; i++)
        assert_int_equal(kvc_pd_room_set(s, -i - 100, 1), KVC_OK);
    assert_int_equal(status(s).rooms, 1000);
    /* Removal by backward shift keeps every remaining entry findable. */
    for (int64_t i = 0; i < 20000; i++)
        assert_int_equal(kvc_pd_room_set(s, i * 31, (int32_t)(i % 5)), KVC_OK);
    nanosleep(&ts, NULL);
    assert_int_equal(kvc_pd_room_sweep(s, 1, &n), KVC_OK);
    for (int64_t i = 0; i < 20000; i += 2)
        assert_int_equal(kvc_pd_room_set(s, i * 31, (int32_t)(i % 5)), KVC_OK);
    for (int64_t i = 1; i < 20000; i += 2)
        assert_int_equal(kvc_pd_room_get(s, i * 31, &dp), KVC_E_NOENT);
    for (int64_t i = 0; i < 20000; i += 2) {
        assert_int_equal(kvc_pd_room_get(s, i * 31, &dp), KVC_OK);
        assert_int_equal(dp, (int32_t)(i % 5));
    }
    kvc_close(s);
    kvc_unlink(name);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_register_lookup_ready),
        cmocka_unit_test(test_bad_input_stores_nothing),
        cmocka_unit_test(test_sigkilled_registrant_withdrawn),
        cmocka_unit_test(test_writer_killed_rolled_back),
        cmocka_unit_test(test_room_map),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
