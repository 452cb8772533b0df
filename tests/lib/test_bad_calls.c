/* test_bad_calls.c - every public function of kvcoord.h and transfer.h
 * called with NULL pointers and out-of-range values: each returns its
 * documented error (never crashes), and kvc_last_error() names the function
 * and the argument.  Also: every failure reported (kvc_close that could not
 * withdraw a worker's ranks), and a full process table that reaps a dead
 * process's entry before reusing it. */
#include <errno.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include "kvcoord/transfer.h"
#include "testutil.h"
#include "tu_proc.h"
#include "internal.h"
#include "xfer_internal.h"

/* call returns want, and kvc_last_error() contains each of the words. */
#define EXPECT_ERR(want, call, ...)                                                               \
    do {                                                                                          \
        kvc_error_set(KVC_OK, "stale message");                                                   \
        kvc_err got_ = (call);                                                                    \
        if (got_ != (want))                                                                       \
            fail_msg("%s: got %s (%s), want %s", #call, kvc_strerror(got_), kvc_last_error(),     \
                     kvc_strerror(want));                                                         \
        const char *words_[] = {__VA_ARGS__};                                                     \
        for (size_t w_ = 0; w_ < sizeof words_ / sizeof *words_; w_++)                            \
            if (!strstr(kvc_last_error(), words_[w_]))                                            \
                fail_msg("%s: message \"%s\" lacks \"%s\"", #call, kvc_last_error(), words_[w_]); \
    } while (0)

#define EXPECT_NULL_ARG(fn, arg, call) EXPECT_ERR(KVC_E_INVAL, call, #fn, "argument " arg)

static kvc_segment *seg;
static const char *seg_name;

static int setup(void **st)
{
    (void)st;
    seg_name = tu_name();
    seg = tu_open(seg_name, KVC_OPEN_FRESH, KVC_ROLE_DAEMON);
    return seg ? 0 : -1;
}

static int teardown(void **st)
{
    (void)st;
    kvc_close(seg);
    kvc_unlink(seg_name);
    return 0;
}

/* kvc_error_setv() with a NULL format, through a va_list. */
static kvc_err setv_null(kvc_err err, ...)
{
    const char *volatile fmt = NULL;
    va_list ap;
    va_start(ap, err);
    kvc_err r = kvc_error_setv(err, (const char *)fmt, ap);
    va_end(ap);
    return r;
}

static void test_segment_calls(void **st)
{
    (void)st;
    kvc_options o;
    kvc_segment *s = NULL;
    char buf[64];
    kvc_segment_info si;

    kvc_options_init(NULL); /* ignored */
    EXPECT_NULL_ARG(kvc_open, "opts", kvc_open(NULL, &s));
    kvc_options_init(&o);
    o.name = seg_name;
    EXPECT_NULL_ARG(kvc_open, "out", kvc_open(&o, NULL));
    o.role = (kvc_role)99;
    EXPECT_ERR(KVC_E_INVAL, kvc_open(&o, &s), "kvc_open", "role 99");
    assert_null(s);
    o.role = (kvc_role)-1;
    EXPECT_ERR(KVC_E_INVAL, kvc_open(&o, &s), "kvc_open", "role -1");
    o.role = KVC_ROLE_CLIENT;
    o.mode = (kvc_open_mode)7;
    EXPECT_ERR(KVC_E_INVAL, kvc_open(&o, &s), "kvc_open", "mode 7");
    o.mode = KVC_OPEN_ATTACH;
    o.rank = -5;
    EXPECT_ERR(KVC_E_INVAL, kvc_open(&o, &s), "kvc_open", "rank -5");
    assert_null(s);

    assert_int_equal(kvc_close(NULL), KVC_OK);
    EXPECT_ERR(KVC_E_INVAL, kvc_unlink(NULL), "segment name is NULL");
    EXPECT_ERR(KVC_E_INVAL, kvc_name_check(NULL), "segment name is NULL");
    EXPECT_NULL_ARG(kvc_name_for_port, "buf", kvc_name_for_port(1, NULL, 64));
    EXPECT_ERR(KVC_E_INVAL, kvc_name_for_port(6789, buf, 3), "too small");
    assert_string_equal(kvc_segment_name(NULL), "");
    EXPECT_NULL_ARG(kvc_segment_stat, "seg", kvc_segment_stat(NULL, &si));
    EXPECT_NULL_ARG(kvc_segment_stat, "out", kvc_segment_stat(seg, NULL));
    EXPECT_ERR(KVC_E_BUSY, setv_null(KVC_E_BUSY, 1), "no message");
    assert_string_equal(kvc_strerror((kvc_err)1000), "unknown error");
}

/* Not a segment under the name: a FIFO must not block kvc_open (attach or
 * create), a symlink is not followed. */
static void test_open_refuses_what_is_not_a_regular_file(void **st)
{
    (void)st;
    const char *name = tu_name();
    char path[128];
    snprintf(path, sizeof path, "/dev/shm/%s", name);
    assert_int_equal(mkfifo(path, 0600), 0);
    kvc_options o;
    kvc_options_init(&o);
    o.name = name;
    kvc_segment *s = NULL;
    EXPECT_ERR(KVC_E_CORRUPT, kvc_open(&o, &s), "not a regular file");
    assert_null(s);
    unlink(path);
    assert_int_equal(symlink("/etc/hostname", path), 0);
    EXPECT_ERR(KVC_E_CORRUPT, kvc_open(&o, &s), "is a symlink");
    unlink(path);
}

static void test_rank_calls(void **st)
{
    (void)st;
    kvc_rank_info ri = {0};
    uint64_t gen;
    size_t n;
    const char *info = "{\"w\":[1,2,2]}";

    EXPECT_NULL_ARG(kvc_rank_register, "seg", kvc_rank_register(NULL, 0, "h:1", info, 13, &gen));
    EXPECT_NULL_ARG(kvc_rank_register, "session_id",
                    kvc_rank_register(seg, 0, NULL, info, 13, &gen));
    EXPECT_NULL_ARG(kvc_rank_register, "info_json",
                    kvc_rank_register(seg, 0, "h:1", NULL, 13, &gen));
    EXPECT_NULL_ARG(kvc_rank_register_validated, "seg",
                    kvc_rank_register_validated(NULL, 0, "h:1", info, 13, 1, &gen));
    EXPECT_NULL_ARG(kvc_rank_register_validated, "session_id",
                    kvc_rank_register_validated(seg, 0, NULL, info, 13, 1, &gen));
    EXPECT_NULL_ARG(kvc_rank_register_validated, "info_json",
                    kvc_rank_register_validated(seg, 0, "h:1", NULL, 13, 1, &gen));
    EXPECT_NULL_ARG(
        kvc_rank_register_mirror, "seg",
        kvc_rank_register_mirror(NULL, 0, "h:1", info, 13, "node-b", 1, KVC_GEN_ANY, &gen));
    EXPECT_NULL_ARG(
        kvc_rank_register_mirror, "session_id",
        kvc_rank_register_mirror(seg, 0, NULL, info, 13, "node-b", 1, KVC_GEN_ANY, &gen));
    EXPECT_NULL_ARG(
        kvc_rank_register_mirror, "info_json",
        kvc_rank_register_mirror(seg, 0, "h:1", NULL, 13, "node-b", 1, KVC_GEN_ANY, &gen));
    EXPECT_NULL_ARG(kvc_rank_register_mirror, "origin",
                    kvc_rank_register_mirror(seg, 0, "h:1", info, 13, NULL, 1, KVC_GEN_ANY, &gen));
    EXPECT_ERR(KVC_E_CAPACITY, kvc_rank_register(seg, 1u << 30, "h:1", info, 13, NULL), "rank");
    assert_int_equal(kvc_rank_register(seg, 0, "h:1", info, 13, NULL), KVC_OK);

    EXPECT_NULL_ARG(kvc_rank_lookup, "seg", kvc_rank_lookup(NULL, 0, &ri));
    EXPECT_NULL_ARG(kvc_rank_lookup, "out", kvc_rank_lookup(seg, 0, NULL));
    EXPECT_ERR(KVC_E_CAPACITY, kvc_rank_lookup(seg, UINT32_MAX, &ri), "rank");
    EXPECT_NULL_ARG(kvc_rank_wait, "seg", kvc_rank_wait(NULL, 0, 0, &ri));
    EXPECT_NULL_ARG(kvc_rank_wait, "out", kvc_rank_wait(seg, 0, 0, NULL));
    EXPECT_NULL_ARG(kvc_rank_list, "seg", kvc_rank_list(NULL, &ri, 1, &n, 0));
    EXPECT_NULL_ARG(kvc_rank_list, "count", kvc_rank_list(seg, &ri, 1, NULL, 0));
    EXPECT_NULL_ARG(kvc_rank_list, "out", kvc_rank_list(seg, NULL, 1, &n, 0));
    assert_int_equal(kvc_rank_list(seg, NULL, 0, &n, 0), KVC_OK); /* cap 0: out unused */
    assert_int_equal(n, 1);
    EXPECT_NULL_ARG(kvc_rank_withdraw, "seg", kvc_rank_withdraw(NULL, 0, NULL));
    EXPECT_NULL_ARG(kvc_rank_withdraw_mirror, "seg",
                    kvc_rank_withdraw_mirror(NULL, 0, NULL, KVC_GEN_ANY));
    EXPECT_ERR(KVC_E_CAPACITY, kvc_rank_withdraw(seg, UINT32_MAX, NULL), "rank");

    /* Roles and parallelism configs. */
    char names[KVC_RANK_ROLES][KVC_ROLE_NAME_MAX + 1];
    assert_int_equal(kvc_role_check(NULL), KVC_OK); /* NULL: the default role */
    EXPECT_ERR(KVC_E_INVAL, kvc_role_check("bad role"), "role name", "0x20");
    EXPECT_NULL_ARG(kvc_role_register, "seg",
                    kvc_role_register(NULL, "draft", 0, "h:1", info, 13, &gen));
    EXPECT_NULL_ARG(kvc_role_register, "session_id",
                    kvc_role_register(seg, "draft", 0, NULL, info, 13, &gen));
    EXPECT_NULL_ARG(kvc_role_register, "info_json",
                    kvc_role_register(seg, "draft", 0, "h:1", NULL, 13, &gen));
    EXPECT_NULL_ARG(kvc_role_register_validated, "seg",
                    kvc_role_register_validated(NULL, "draft", 0, "h:1", info, 13, 1, &gen));
    EXPECT_ERR(KVC_E_INVAL, kvc_role_register_validated(seg, "draft", 0, NULL, info, 13, 1, &gen),
               "argument session_id");
    EXPECT_NULL_ARG(kvc_role_lookup, "seg", kvc_role_lookup(NULL, "draft", 0, &ri));
    EXPECT_NULL_ARG(kvc_role_lookup, "out", kvc_role_lookup(seg, "draft", 0, NULL));
    EXPECT_NULL_ARG(kvc_role_withdraw, "seg", kvc_role_withdraw(NULL, "draft", 0, NULL));
    EXPECT_NULL_ARG(kvc_parallelism_register, "seg",
                    kvc_parallelism_register(NULL, NULL, 0, "{}", 2, &gen));
    EXPECT_NULL_ARG(kvc_parallelism_register, "config_json",
                    kvc_parallelism_register(seg, NULL, 0, NULL, 2, &gen));
    EXPECT_NULL_ARG(kvc_parallelism_lookup, "seg", kvc_parallelism_lookup(NULL, NULL, 0, &ri));
    EXPECT_NULL_ARG(kvc_parallelism_lookup, "out", kvc_parallelism_lookup(seg, NULL, 0, NULL));
    EXPECT_NULL_ARG(
        kvc_role_register_mirror, "seg",
        kvc_role_register_mirror(NULL, "draft", 0, "h:1", info, 13, "b", 1, KVC_GEN_ANY, &gen));
    EXPECT_ERR(KVC_E_INVAL,
               kvc_role_register_mirror(seg, "draft", 0, NULL, info, 13, "b", 1, KVC_GEN_ANY, &gen),
               "argument session_id");
    EXPECT_ERR(
        KVC_E_INVAL,
        kvc_role_register_mirror(seg, "draft", 0, "h:1", info, 13, NULL, 1, KVC_GEN_ANY, &gen),
        "origin");
    EXPECT_ERR(
        KVC_E_INVAL,
        kvc_role_register_mirror(seg, "bad role", 0, "h:1", info, 13, "b", 1, KVC_GEN_ANY, &gen),
        "role name");
    EXPECT_NULL_ARG(kvc_role_withdraw_mirror, "seg",
                    kvc_role_withdraw_mirror(NULL, "draft", 0, NULL, KVC_GEN_ANY));
    EXPECT_NULL_ARG(kvc_role_list, "seg", kvc_role_list(NULL, "draft", &ri, 1, &n, 0));
    EXPECT_NULL_ARG(kvc_role_list, "count", kvc_role_list(seg, "draft", &ri, 1, NULL, 0));
    EXPECT_NULL_ARG(kvc_role_list, "out", kvc_role_list(seg, "draft", NULL, 1, &n, 0));
    EXPECT_NULL_ARG(
        kvc_parallelism_register_mirror, "seg",
        kvc_parallelism_register_mirror(NULL, NULL, 0, "{}", 2, "b", 1, KVC_GEN_ANY, &gen));
    EXPECT_NULL_ARG(
        kvc_parallelism_register_mirror, "config_json",
        kvc_parallelism_register_mirror(seg, NULL, 0, NULL, 2, "b", 1, KVC_GEN_ANY, &gen));
    EXPECT_ERR(KVC_E_INVAL,
               kvc_parallelism_register_mirror(seg, NULL, 0, "{}", 2, "a b", 1, KVC_GEN_ANY, &gen),
               "origin node name", "0x20");
    EXPECT_NULL_ARG(kvc_parallelism_withdraw_mirror, "seg",
                    kvc_parallelism_withdraw_mirror(NULL, NULL, 0, NULL, KVC_GEN_ANY));
    EXPECT_NULL_ARG(kvc_parallelism_list, "seg", kvc_parallelism_list(NULL, NULL, &ri, 1, &n, 0));
    EXPECT_NULL_ARG(kvc_parallelism_list, "count",
                    kvc_parallelism_list(seg, NULL, &ri, 1, NULL, 0));
    EXPECT_NULL_ARG(kvc_role_names, "seg", kvc_role_names(NULL, names, 4, &n));
    EXPECT_NULL_ARG(kvc_role_names, "count", kvc_role_names(seg, names, 4, NULL));
    EXPECT_NULL_ARG(kvc_role_names, "names", kvc_role_names(seg, NULL, 4, &n));
    assert_string_equal(kvc_role_name((kvc_role)42), "invalid");

    kvc_error_set(KVC_OK, "stale");
    assert_int_equal(kvc_rank_epoch(NULL), 0);
    assert_non_null(strstr(kvc_last_error(), "kvc_rank_epoch: argument seg is NULL"));
    EXPECT_NULL_ARG(kvc_rank_wait_change, "seg", kvc_rank_wait_change(NULL, 0, 10));
    kvc_rank_info_free(NULL);
    kvc_rank_info_free(&ri);
}

static void test_room_calls(void **st)
{
    (void)st;
    kvc_room_info ri;
    kvc_failure_info fi[2];
    size_t n;
    int kept = 7;
    const uint64_t big = KVC_ROOM_ID_MAX + 1ull;

    EXPECT_NULL_ARG(kvc_room_open, "seg", kvc_room_open(NULL, 1, 2, 0, KVC_ROOM_ROLE_PREFILL));
    EXPECT_ERR(KVC_E_INVAL, kvc_room_open(seg, 1, 2, 0, (kvc_room_role)7), "kvc_room_open",
               "role 7");
    EXPECT_ERR(KVC_E_INVAL, kvc_room_open(seg, 1, 2, 0, (kvc_room_role)-1), "role -1");
    EXPECT_ERR(KVC_E_INVAL, kvc_room_open(seg, big, 2, 0, KVC_ROOM_ROLE_PREFILL), "kvc_room_open",
               "room id 9223372036854775808 out of range");
    EXPECT_ERR(KVC_E_INVAL, kvc_room_open(seg, UINT64_MAX, 2, 0, KVC_ROOM_ROLE_PREFILL),
               "room id 18446744073709551615");
    EXPECT_ERR(KVC_E_INVAL, kvc_room_open(seg, 1, 33, 0, KVC_ROOM_ROLE_PREFILL), "at most 32");
    /* The largest id is a valid room. */
    assert_int_equal(kvc_room_open(seg, KVC_ROOM_ID_MAX, 2, 0, KVC_ROOM_ROLE_DECODE), KVC_OK);

    EXPECT_NULL_ARG(kvc_room_set_state, "seg",
                    kvc_room_set_state(NULL, 1, 0, KVC_POLL_TRANSFERRING));
    EXPECT_ERR(KVC_E_INVAL, kvc_room_set_state(seg, KVC_ROOM_ID_MAX, 0, (kvc_poll)9),
               "state 9 out of range");
    EXPECT_ERR(KVC_E_INVAL, kvc_room_set_state(seg, KVC_ROOM_ID_MAX, 0, (kvc_poll)-1),
               "state -1 out of range");
    EXPECT_ERR(KVC_E_INVAL, kvc_room_set_state(seg, big, 0, KVC_POLL_SUCCESS), "room id");

    EXPECT_NULL_ARG(kvc_room_fail, "seg", kvc_room_fail(NULL, 1, 0, 0, "x", &kept));
    assert_int_equal(kept, 0);
    kept = 7;
    EXPECT_ERR(KVC_E_INVAL, kvc_room_fail(seg, UINT64_MAX, 0, 0, "x", &kept), "kvc_room_fail",
               "room id 18446744073709551615");
    assert_int_equal(kept, 0);
    EXPECT_ERR(KVC_E_INVAL, kvc_room_fail(seg, 5, UINT32_MAX, 0, "x", NULL), "origin rank");
    /* NULL reason and NULL kept are documented as allowed. */
    assert_int_equal(kvc_room_fail(seg, KVC_ROOM_ID_MAX, 1, 5, NULL, NULL), KVC_OK);

    EXPECT_NULL_ARG(kvc_room_fail_adopt, "seg", kvc_room_fail_adopt(NULL, 1, 0, 0, "x", 1, &kept));
    assert_int_equal(kept, 0);
    EXPECT_ERR(KVC_E_INVAL, kvc_room_fail_adopt(seg, big, 0, 0, "x", 1, NULL),
               "kvc_room_fail_adopt", "room id");
    kvc_error_set(KVC_OK, "stale");
    assert_int_equal(kvc_room_epoch(NULL), 0);
    assert_non_null(strstr(kvc_last_error(), "kvc_room_epoch: argument seg is NULL"));
    EXPECT_NULL_ARG(kvc_room_wait_change, "seg", kvc_room_wait_change(NULL, 0, 10));
    EXPECT_NULL_ARG(kvc_room_get, "seg", kvc_room_get(NULL, 1, 0, &ri));
    EXPECT_NULL_ARG(kvc_room_get, "out", kvc_room_get(seg, 1, 0, NULL));
    EXPECT_ERR(KVC_E_INVAL, kvc_room_get(seg, big, 0, &ri), "kvc_room_get", "room id");
    assert_int_equal(kvc_room_get(seg, KVC_ROOM_ID_MAX, 0, &ri), KVC_OK);
    assert_true(ri.room == KVC_ROOM_ID_MAX);

    EXPECT_NULL_ARG(kvc_room_wait, "seg",
                    kvc_room_wait(NULL, 1, 0, KVC_POLL_BOOTSTRAPPING, 10, &ri));
    EXPECT_NULL_ARG(kvc_room_wait, "out",
                    kvc_room_wait(seg, 1, 0, KVC_POLL_BOOTSTRAPPING, 10, NULL));
    EXPECT_ERR(KVC_E_INVAL, kvc_room_wait(seg, 1, 0, (kvc_poll)9, 10, &ri), "known state 9");
    EXPECT_ERR(KVC_E_INVAL, kvc_room_wait(seg, big, 0, KVC_POLL_FAILED, 10, &ri), "room id");

    EXPECT_NULL_ARG(kvc_room_release, "seg", kvc_room_release(NULL, 1, 0));
    EXPECT_ERR(KVC_E_INVAL, kvc_room_release(seg, big, 0), "kvc_room_release", "room id");

    size_t reclaimed = 9;
    EXPECT_NULL_ARG(kvc_room_sweep, "seg", kvc_room_sweep(NULL, &reclaimed));
    assert_int_equal(reclaimed, 0);

    EXPECT_NULL_ARG(kvc_room_list, "seg", kvc_room_list(NULL, -1, &ri, 1, &n));
    EXPECT_NULL_ARG(kvc_room_list, "count", kvc_room_list(seg, -1, &ri, 1, NULL));
    EXPECT_NULL_ARG(kvc_room_list, "out", kvc_room_list(seg, -1, NULL, 1, &n));
    EXPECT_ERR(KVC_E_INVAL, kvc_room_list(seg, 9, &ri, 1, &n), "state_filter 9");
    EXPECT_ERR(KVC_E_INVAL, kvc_room_list(seg, -2, &ri, 1, &n), "state_filter -2");
    assert_int_equal(kvc_room_list(seg, KVC_POLL_FAILED, NULL, 0, &n), KVC_OK);
    assert_int_equal(n, 1);

    EXPECT_NULL_ARG(kvc_failures_recent, "seg", kvc_failures_recent(NULL, fi, 2, &n));
    EXPECT_NULL_ARG(kvc_failures_recent, "count", kvc_failures_recent(seg, fi, 2, NULL));
    EXPECT_NULL_ARG(kvc_failures_recent, "out", kvc_failures_recent(seg, NULL, 2, &n));

    /* Text helpers: NULL buffers and records are safe. */
    char text[128];
    memset(text, 'x', sizeof text);
    int len = kvc_failure_text(NULL, text, sizeof text);
    assert_string_equal(text, "no failure record");
    assert_int_equal(len, (int)strlen(text));
    assert_int_equal(kvc_failure_text(NULL, NULL, 100), len);
    assert_int_equal(kvc_failures_recent(seg, fi, 2, &n), KVC_OK);
    assert_true(n >= 1);
    len = kvc_failure_text(&fi[0], NULL, 512); /* measures only */
    assert_true(len > 0);
    assert_int_equal(kvc_failure_text(&fi[0], text, 0), len);
    assert_int_equal(kvc_failure_text(&fi[0], text, 8), len);
    assert_int_equal(strlen(text), 7);
    assert_null(kvc_wait_status_text(9, NULL, 64));
    text[0] = 'x';
    assert_ptr_equal(kvc_wait_status_text(9, text, 0), text);
    assert_int_equal(text[0], 'x');
    assert_string_equal(kvc_wait_status_text(9, text, 10), "killed by");
    assert_string_equal(kvc_poll_name((kvc_poll)77), "Unknown");
    assert_string_equal(kvc_role_name((kvc_role)77), "invalid");
}

static void test_proc_calls(void **st)
{
    (void)st;
    kvc_proc_info pi;
    size_t n;
    EXPECT_NULL_ARG(kvc_proc_list, "seg", kvc_proc_list(NULL, &pi, 1, &n));
    EXPECT_NULL_ARG(kvc_proc_list, "count", kvc_proc_list(seg, &pi, 1, NULL));
    EXPECT_NULL_ARG(kvc_proc_list, "out", kvc_proc_list(seg, NULL, 1, &n));
    kvc_error_set(KVC_OK, "stale");
    assert_int_equal(kvc_proc_epoch(NULL), 0);
    assert_non_null(strstr(kvc_last_error(), "kvc_proc_epoch: argument seg is NULL"));
    EXPECT_NULL_ARG(kvc_proc_wait_change, "seg", kvc_proc_wait_change(NULL, 0, 10));
    EXPECT_NULL_ARG(kvc_proc_reap, "seg", kvc_proc_reap(NULL, 1, 0, NULL, NULL, NULL));
    EXPECT_ERR(KVC_E_INVAL, kvc_proc_reap(seg, 0, 0, NULL, NULL, NULL), "pid 0");
    EXPECT_ERR(KVC_E_INVAL, kvc_proc_reap(seg, -4, 0, NULL, NULL, NULL), "pid -4");
    EXPECT_NULL_ARG(kvc_proc_reap_dead, "seg", kvc_proc_reap_dead(NULL, &n));
    kvc_proc_stat ps;
    EXPECT_NULL_ARG(kvc_proc_stat_read, "out", kvc_proc_stat_read(1, NULL));
    EXPECT_ERR(KVC_E_INVAL, kvc_proc_stat_read(0, &ps), "pid 0");
    EXPECT_ERR(KVC_E_INVAL, kvc_proc_stat_read(-4, &ps), "pid -4");
}

static void test_transfer_calls(void **st)
{
    (void)st;
    kvt_options o;
    kvt_engine *e = NULL;
    kvt_backend b;
    kvt_stats ks;
    char *json;
    kvt_peer *p = NULL;
    kvt_peer_info pi;
    kvt_event ev[2];
    size_t n;
    char mem[64];

    kvt_options_init(NULL); /* ignored */
    EXPECT_NULL_ARG(kvt_backend_parse, "s", kvt_backend_parse(NULL, &b));
    EXPECT_NULL_ARG(kvt_backend_parse, "out", kvt_backend_parse("tcp", NULL));
    EXPECT_ERR(KVC_E_INVAL, kvt_backend_parse("udp", &b), "udp");
    assert_string_equal(kvt_backend_name((kvt_backend)9), "unknown");
    EXPECT_NULL_ARG(kvt_engine_create, "opts", kvt_engine_create(NULL, &e));
    kvt_options_init(&o);
    EXPECT_NULL_ARG(kvt_engine_create, "out", kvt_engine_create(&o, NULL));
    o.backend = (kvt_backend)9;
    EXPECT_ERR(KVC_E_INVAL, kvt_engine_create(&o, &e), "backend 9");
    o.backend = (kvt_backend)-1;
    EXPECT_ERR(KVC_E_INVAL, kvt_engine_create(&o, &e), "backend -1");
    assert_null(e);

    /* Accessors answer NULL with a value no engine has. */
    kvt_engine_destroy(NULL);
    assert_int_equal(kvt_engine_backend(NULL), KVT_BACKEND_AUTO);
    assert_string_equal(kvt_session_id(NULL), "");
    assert_int_equal(kvt_generation(NULL), 0);
    assert_int_equal(kvt_fd(NULL), -1);
    assert_non_null(strstr(kvc_last_error(), "kvt_fd: argument e is NULL"));

    EXPECT_NULL_ARG(kvt_engine_stat, "e", kvt_engine_stat(NULL, &ks));
    EXPECT_NULL_ARG(kvt_mr_register, "e", kvt_mr_register(NULL, mem, sizeof mem, NULL));
    EXPECT_NULL_ARG(kvt_mr_deregister, "e", kvt_mr_deregister(NULL, mem));
    EXPECT_NULL_ARG(kvt_descriptor_export, "e", kvt_descriptor_export(NULL, &json));
    EXPECT_NULL_ARG(kvt_peer_import, "e", kvt_peer_import(NULL, "{}", 2, &p));
    EXPECT_NULL_ARG(kvt_peer_stat, "e", kvt_peer_stat(NULL, p, &pi));
    EXPECT_NULL_ARG(kvt_submit, "e", kvt_submit(NULL, p, 1, NULL, 0, 0));
    EXPECT_NULL_ARG(kvt_progress, "e", kvt_progress(NULL, 0, ev, 2, &n));
    EXPECT_NULL_ARG(kvt_room_expect, "e", kvt_room_expect(NULL, 1, 1));

    kvt_options_init(&o);
    o.backend = KVT_BACKEND_TCP;
    assert_int_equal(kvt_engine_create(&o, &e), KVC_OK);
    EXPECT_NULL_ARG(kvt_engine_stat, "out", kvt_engine_stat(e, NULL));
    EXPECT_NULL_ARG(kvt_mr_register, "addr", kvt_mr_register(e, NULL, 64, NULL));
    EXPECT_ERR(KVC_E_INVAL, kvt_mr_register(e, mem, 0, NULL), "len is 0");
    EXPECT_ERR(KVC_E_NOENT, kvt_mr_deregister(e, NULL), "no region");
    EXPECT_NULL_ARG(kvt_descriptor_export, "json_out", kvt_descriptor_export(e, NULL));
    EXPECT_NULL_ARG(kvt_peer_import, "json", kvt_peer_import(e, NULL, 2, &p));
    EXPECT_NULL_ARG(kvt_peer_import, "out", kvt_peer_import(e, "{}", 2, NULL));
    assert_int_equal(kvt_descriptor_export(e, &json), KVC_OK);
    assert_int_equal(kvt_peer_import(e, json, strlen(json), &p), KVC_OK);
    free(json);
    EXPECT_NULL_ARG(kvt_peer_stat, "p", kvt_peer_stat(e, NULL, &pi));
    EXPECT_NULL_ARG(kvt_peer_stat, "out", kvt_peer_stat(e, p, NULL));
    EXPECT_NULL_ARG(kvt_submit, "p", kvt_submit(e, NULL, 1, NULL, 0, 0));
    EXPECT_NULL_ARG(kvt_submit, "runs", kvt_submit(e, p, 1, NULL, 3, 0));
    EXPECT_ERR(KVC_E_INVAL, kvt_submit(e, p, KVC_ROOM_ID_MAX + 1ull, NULL, 0, 0), "kvt_submit",
               "room id 9223372036854775808");
    EXPECT_NULL_ARG(kvt_progress, "n", kvt_progress(e, 0, ev, 2, NULL));
    EXPECT_NULL_ARG(kvt_progress, "ev", kvt_progress(e, 0, NULL, 2, &n));
    assert_int_equal(kvt_progress(e, 0, NULL, 0, &n), KVC_OK);
    EXPECT_ERR(KVC_E_INVAL, kvt_room_expect(e, 1, 0), "senders");
    EXPECT_ERR(KVC_E_INVAL, kvt_room_expect(e, UINT64_MAX, 1), "room id");
    kvt_engine_destroy(e);
}

/* ---- every failure reported -------------------------------------------- */

/* An io_uring whose submission queue stays full (here: the submit fails)
 * makes the engine report KVC_E_SYS; it never aborts the host process. */
static void test_full_submission_queue_is_an_error(void **st)
{
    (void)st;
    kvt_options o;
    kvt_engine *e = NULL;
    kvt_options_init(&o);
    o.backend = KVT_BACKEND_TCP;
    o.io_timeout_ms = 200;
    assert_int_equal(kvt_engine_create(&o, &e), KVC_OK);
    char *json;
    kvt_peer *p = NULL;
    assert_int_equal(kvt_descriptor_export(e, &json), KVC_OK);
    assert_int_equal(kvt_peer_import(e, json, strlen(json), &p), KVC_OK);
    free(json);
    struct io_uring_sqe *s;
    while ((s = io_uring_get_sqe(&e->ring)))
        io_uring_prep_nop(s);
    int fd = e->ring.enter_ring_fd;
    e->ring.enter_ring_fd = -1; /* io_uring_submit now fails (EBADF): nothing is consumed */
    assert_null(kvt__sqe(e));
    e->ring.enter_ring_fd = fd;
    size_t n;
    EXPECT_ERR(KVC_E_SYS, kvt_progress(e, 0, NULL, 0, &n), "submission queue", "stays full",
               "unusable");
    EXPECT_ERR(KVC_E_SYS, kvt_submit(e, p, 1, NULL, 0, 0), "stays full");
    kvt_engine_destroy(e);
}

/* A child that attaches and holds the ranks lock until killed. */
static pid_t hold_ranks_lock(const char *name)
{
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        kvc_segment *s = tu_open(name, KVC_OPEN_ATTACH, KVC_ROLE_NONE);
        if (!s || kvc__lock(s, KVC_LOCK_RANKS) != KVC_OK)
            _exit(1);
        char c = 'l';
        if (write(fds[1], &c, 1) != 1)
            _exit(1);
        for (;;)
            pause();
    }
    char c;
    close(fds[1]);
    assert_int_equal(read(fds[0], &c, 1), 1);
    close(fds[0]);
    return pid;
}

static void test_close_reports_failed_withdrawal(void **st)
{
    (void)st;
    const char *name = tu_name();
    kvc_options o = tu_options(name, KVC_OPEN_FRESH, KVC_ROLE_DAEMON);
    o.max_ranks = 8;
    o.arena_bytes = 4ull << 20;
    o.max_info_bytes = 1ull << 20;
    o.lock_timeout_ms = 100;
    kvc_segment *d = NULL, *w = NULL;
    assert_int_equal(kvc_open(&o, &d), KVC_OK);
    pid_t child = fork();
    assert_true(child >= 0);
    if (child == 0) { /* a worker that cannot withdraw its rank at close */
        o.mode = KVC_OPEN_ATTACH;
        o.role = KVC_ROLE_WORKER;
        if (kvc_open(&o, &w) || kvc_rank_register(w, 3, "h:3", "{}", 2, NULL))
            _exit(10);
        pid_t holder = hold_ranks_lock(name);
        kvc_err e = kvc_close(w);
        int ok = e == KVC_E_BUSY && strstr(kvc_last_error(), "ranks were not withdrawn") &&
                 strstr(kvc_last_error(), "ranks lock");
        kill(holder, SIGKILL);
        waitpid(holder, NULL, 0);
        _exit(ok ? 0 : 11);
    }
    assert_int_equal(tu_wait_exit(child), 0);
    /* Reported, and so left to be reaped: rank 3 still registered. */
    kvc_rank_info ri = {0};
    assert_int_equal(kvc_rank_lookup(d, 3, &ri), KVC_OK);
    size_t reaped = 0;
    assert_int_equal(kvc_proc_reap_dead(d, &reaped), KVC_OK);
    kvc_rank_info_free(&ri);
    kvc_close(d);
    kvc_unlink(name);
}

static void test_full_proc_table_reaps_before_reuse(void **st)
{
    (void)st;
    const char *name = tu_name();
    kvc_options o = tu_options(name, KVC_OPEN_FRESH, KVC_ROLE_DAEMON);
    o.max_ranks = 8;
    o.max_procs = 2;
    o.world_size = 2;
    o.arena_bytes = 4ull << 20;
    o.max_info_bytes = 1ull << 20;
    kvc_segment *d = NULL, *w = NULL, *w2 = NULL;
    assert_int_equal(kvc_open(&o, &d), KVC_OK);
    o.mode = KVC_OPEN_ATTACH;
    o.role = KVC_ROLE_WORKER;
    pid_t child = fork();
    assert_true(child >= 0);
    if (child == 0) { /* registers rank 1, joins room 77, dies without closing */
        if (kvc_open(&o, &w) || kvc_rank_register(w, 1, "h:1", "{}", 2, NULL) ||
            kvc_room_open(w, 77, 2, 1, KVC_ROOM_ROLE_DECODE))
            _exit(10);
        _exit(0);
    }
    assert_int_equal(tu_wait_exit(child), 0);
    /* The table (2 entries: this daemon, the dead child) is full: the next
     * attach (another process: this one's handles share its entry) reaps
     * the dead child before taking its slot. */
    int go[2];
    assert_int_equal(pipe(go), 0);
    pid_t second = fork();
    assert_true(second >= 0);
    if (second == 0) {
        if (kvc_open(&o, &w2))
            _exit(10);
        (void)!write(go[1], "x", 1);
        for (;;)
            pause();
    }
    char x;
    assert_int_equal(read(go[0], &x, 1), 1);
    close(go[0]);
    close(go[1]);
    kvc_rank_info ri = {0};
    char pidtext[32];
    snprintf(pidtext, sizeof pidtext, "process %d", (int)child);
    assert_int_equal(kvc_rank_lookup(d, 1, &ri), KVC_E_WITHDRAWN);
    assert_non_null(strstr(ri.note, pidtext));
    kvc_room_info room;
    assert_int_equal(kvc_room_get(d, 77, -1, &room), KVC_OK);
    assert_int_equal(room.state, KVC_POLL_FAILED);
    assert_true(room.has_failure);
    /* Live processes only: a third process's attach is refused, not
     * squeezed in; this one's own next handle shares its entry. */
    pid_t third = fork();
    assert_true(third >= 0);
    if (third == 0) {
        kvc_segment *w3 = NULL;
        kvc_err e = kvc_open(&o, &w3);
        _exit(e == KVC_E_FULL && !w3 && strstr(kvc_last_error(), "process table") &&
                      strstr(kvc_last_error(), "full")
                  ? 0
                  : 11);
    }
    assert_int_equal(tu_wait_exit(third), 0);
    assert_int_equal(kvc_open(&o, &w2), KVC_OK);
    kvc_close(w2);
    kill(second, SIGKILL);
    (void)tu_wait_exit(second);
    kvc_close(d);
    kvc_unlink(name);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_segment_calls),
        cmocka_unit_test(test_open_refuses_what_is_not_a_regular_file),
        cmocka_unit_test(test_rank_calls),
        cmocka_unit_test(test_room_calls),
        cmocka_unit_test(test_proc_calls),
        cmocka_unit_test(test_transfer_calls),
        cmocka_unit_test(test_full_submission_queue_is_an_error),
        cmocka_unit_test(test_close_reports_failed_withdrawal),
        cmocka_unit_test(test_full_proc_table_reaps_before_reuse),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
