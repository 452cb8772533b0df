/*
 * test_etcd_client.c - kvcoordd's etcd gateway client against a real
 * 3-member etcd cluster started by the test: put/range/delete, create-only
 * transactions, leases (keep-alive, revoke, expiry), the watch stream,
 * values of a megabyte, fail-over when a member is killed, and
 * authentication (right and wrong password).
 */
#include <dirent.h>
#include <pthread.h>
#include <signal.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "etcd_client.h"
#include "etcd_fixture.h"

static struct etcd_fixture fx;

/* A client whose per-member timeout is a hang guard: no call here goes to
 * a frozen member (a killed one refuses at once), and a healthy put of a
 * megabyte took more than 3 s per member at load 30. */
static etcd *open_client(void)
{
    struct etcd_conf conf = {.endpoints = fx.endpoints, .timeout_ms = 60000};
    char err[256];
    etcd *c = NULL;
    if (etcd_open(&conf, &c, err, sizeof err))
        fail_msg("etcd_open: %s", err);
    return c;
}

/* The call on this line of the test succeeded (cmocka reports the line
 * of fail_msg, so the caller's is in the message). */
#define ok(c, rc) ok_at((c), (rc), __LINE__)
static void ok_at(etcd *c, int rc, int line)
{
    if (rc)
        fail_msg("etcd call at line %d failed: %s", line, etcd_error(c));
}

static void test_put_range_delete(void **state)
{
    (void)state;
    etcd *c = open_client();
    int64_t rev1 = 0, rev2 = 0;
    ok(c, etcd_put(c, "/t/prd/a", "alpha", 5, 0, &rev1));
    ok(c, etcd_put(c, "/t/prd/b", "\0\1\2binary", 9, 0, &rev2));
    assert_true(rev2 > rev1);
    ok(c, etcd_put(c, "/t/prd0", "outside", 7, 0, NULL)); /* past the prefix */
    etcd_kv *kvs;
    size_t n;
    int64_t rev;
    ok(c, etcd_range_prefix(c, "/t/prd/", &kvs, &n, &rev));
    assert_int_equal(n, 2);
    assert_string_equal(kvs[0].key, "/t/prd/a");
    assert_memory_equal(kvs[0].value, "alpha", 5);
    assert_int_equal(kvs[1].value_len, 9);
    assert_memory_equal(kvs[1].value, "\0\1\2binary", 9);
    assert_int_equal(kvs[1].mod_rev, rev2);
    assert_true(rev >= rev2);
    etcd_kvs_free(kvs, n);
    int64_t deleted;
    ok(c, etcd_delete(c, "/t/prd/", 1, &deleted));
    assert_int_equal(deleted, 2);
    ok(c, etcd_range_prefix(c, "/t/prd/", &kvs, &n, NULL));
    assert_int_equal(n, 0);
    etcd_kvs_free(kvs, n);
    ok(c, etcd_delete(c, "/t/prd0", 0, &deleted));
    assert_int_equal(deleted, 1);
    etcd_close(c);
}

static void test_create_only(void **state)
{
    (void)state;
    etcd *c = open_client();
    int created = -1;
    etcd_kv cur = {0};
    ok(c, etcd_put_create(c, "/t/co/room", "first", 5, 0, &created, &cur, NULL));
    assert_int_equal(created, 1);
    ok(c, etcd_put_create(c, "/t/co/room", "second", 6, 0, &created, &cur, NULL));
    assert_int_equal(created, 0);
    assert_int_equal(cur.value_len, 5);
    assert_string_equal(cur.value, "first");
    etcd_kv_free(&cur);
    ok(c, etcd_delete(c, "/t/co/", 1, NULL));
    etcd_close(c);
}

static void test_lease(void **state)
{
    (void)state;
    etcd *c = open_client();
    int64_t id, ttl;
    ok(c, etcd_lease_grant(c, 5, &id));
    ok(c, etcd_put(c, "/t/lease/k", "v", 1, id, NULL));
    ok(c, etcd_lease_keepalive(c, id, &ttl));
    assert_true(ttl >= 4 && ttl <= 5);
    ok(c, etcd_lease_revoke(c, id));
    etcd_kv *kvs;
    size_t n;
    ok(c, etcd_range_prefix(c, "/t/lease/", &kvs, &n, NULL));
    assert_int_equal(n, 0); /* revoking deleted the key */
    etcd_kvs_free(kvs, n);
    ok(c, etcd_lease_keepalive(c, id, &ttl));
    assert_int_equal(ttl, 0);        /* gone */
    ok(c, etcd_lease_revoke(c, id)); /* already gone: not an error */
    assert_int_not_equal(etcd_put(c, "/t/lease/k", "v", 1, id, NULL), 0);
    assert_non_null(strstr(etcd_error(c), "lease not found"));

    /* Expiry without keep-alive: the key goes by itself. */
    ok(c, etcd_lease_grant(c, 1, &id));
    ok(c, etcd_put(c, "/t/lease/exp", "v", 1, id, NULL));
    for (int i = 0; i < 100; i++) {
        ok(c, etcd_range_prefix(c, "/t/lease/", &kvs, &n, NULL));
        etcd_kvs_free(kvs, n);
        if (!n)
            break;
        usleep(100 * 1000);
    }
    assert_int_equal(n, 0);
    etcd_close(c);
}

struct watch_seen {
    int puts, deletes;
    int64_t last_rev;
    char last_key[64];
    size_t big_len;
    int want_puts, want_deletes;
    volatile int stop;
};

static int on_events(void *arg, const etcd_event *ev, size_t n, int64_t rev)
{
    struct watch_seen *s = arg;
    (void)rev;
    for (size_t i = 0; i < n; i++) {
        if (ev[i].is_delete)
            s->deletes++;
        else
            s->puts++;
        if (ev[i].kv.value_len > s->big_len)
            s->big_len = ev[i].kv.value_len;
        snprintf(s->last_key, sizeof s->last_key, "%s", ev[i].kv.key);
        s->last_rev = ev[i].kv.mod_rev;
    }
    return s->puts >= s->want_puts && s->deletes >= s->want_deletes;
}

static int on_idle(void *arg)
{
    struct watch_seen *s = arg;
    return s->stop;
}

struct watcher {
    pthread_t t;
    struct watch_seen seen;
    int64_t start;
    int rc;
    char err[512];
};

static void *watch_main(void *arg)
{
    struct watcher *w = arg;
    etcd *c = open_client();
    int64_t last;
    struct etcd_watch_cb cb = {.events = on_events, .idle = on_idle, .arg = &w->seen};
    w->rc = etcd_watch(c, "/t/w/", w->start, &cb, &last);
    snprintf(w->err, sizeof w->err, "%s", etcd_error(c));
    etcd_close(c);
    return NULL;
}

static void test_watch_stream(void **state)
{
    (void)state;
    etcd *c = open_client();
    int64_t rev;
    ok(c, etcd_put(c, "/t/w/before", "x", 1, 0, &rev));
    struct watcher w = {.start = rev, .seen = {.want_puts = 4, .want_deletes = 1}};
    pthread_create(&w.t, NULL, watch_main, &w);
    ok(c, etcd_put(c, "/t/w/a", "1", 1, 0, NULL));
    size_t big = 1u << 20;
    char *v = malloc(big);
    for (size_t i = 0; i < big; i++)
        v[i] = (char)('a' + i % 26);
    ok(c, etcd_put(c, "/t/w/big", v, big, 0, NULL)); /* split across many writes */
    free(v);
    ok(c, etcd_put(c, "/t/w/c", "3", 1, 0, NULL));
    ok(c, etcd_delete(c, "/t/w/a", 0, NULL));
    pthread_join(w.t, NULL);
    assert_int_equal(w.rc, 0);
    assert_int_equal(w.seen.puts, 4); /* "before" replayed from its revision */
    assert_int_equal(w.seen.deletes, 1);
    assert_int_equal(w.seen.big_len, big);
    assert_string_equal(w.seen.last_key, "/t/w/a");
    ok(c, etcd_delete(c, "/t/w/", 1, NULL));
    etcd_close(c);
}

/* A watch that is told to stop while quiet ends with 0. */
static void test_watch_stop_idle(void **state)
{
    (void)state;
    struct watcher w = {.start = 1, .seen = {.want_puts = 1000000}};
    pthread_create(&w.t, NULL, watch_main, &w);
    usleep(300 * 1000);
    w.seen.stop = 1;
    pthread_join(w.t, NULL);
    assert_int_equal(w.rc, 0);
}

static void test_failover(void **state)
{
    (void)state;
    etcd *c = open_client();
    ok(c, etcd_put(c, "/t/fo/a", "1", 1, 0, NULL));
    assert_string_equal(etcd_endpoint(c), etcd_endpoint_at(c, 0));
    assert_int_equal(etcd_fixture_run(&fx, "kill-member", "0"), 0);
    ok(c, etcd_put(c, "/t/fo/b", "2", 1, 0, NULL)); /* through another member */
    assert_string_not_equal(etcd_endpoint(c), etcd_endpoint_at(c, 0));
    etcd_kv *kvs;
    size_t n;
    ok(c, etcd_range_prefix(c, "/t/fo/", &kvs, &n, NULL));
    assert_int_equal(n, 2);
    etcd_kvs_free(kvs, n);
    uint64_t leader;
    int64_t rev;
    assert_int_not_equal(etcd_member_status(c, etcd_endpoint_at(c, 0), &leader, &rev), 0);
    ok(c, etcd_member_status(c, etcd_endpoint_at(c, 1), &leader, &rev));
    assert_true(leader != 0);
    assert_int_equal(etcd_fixture_run(&fx, "start-member", "0"), 0);
    /* start-member does not wait: member 0 back in the cluster (its status
     * names a leader) before the tests that follow start their calls with
     * it.  The wait's hang guard is ctest's TIMEOUT. */
    while (etcd_member_status(c, etcd_endpoint_at(c, 0), &leader, &rev) || !leader)
        usleep(100 * 1000);
    ok(c, etcd_delete(c, "/t/fo/", 1, NULL));
    etcd_close(c);
}

/* Whether every thread of process pid is stopped (state T in
 * /proc/PID/task/TID/stat); fails the test when the process is gone. */
static int all_threads_stopped(int pid)
{
    char dir[64];
    snprintf(dir, sizeof dir, "/proc/%d/task", pid);
    DIR *d = opendir(dir);
    if (!d)
        fail_msg("etcd member pid %d is gone", pid);
    int all = 1;
    struct dirent *e;
    while (all && (e = readdir(d))) {
        if (e->d_name[0] == '.')
            continue;
        char path[384], buf[512];
        snprintf(path, sizeof path, "%s/%s/stat", dir, e->d_name);
        FILE *f = fopen(path, "r");
        if (!f)
            continue; /* the thread ended */
        size_t n = fread(buf, 1, sizeof buf - 1, f);
        fclose(f);
        buf[n] = '\0';
        const char *r = strrchr(buf, ')');
        all = r && r[1] && (r[2] == 'T' || r[2] == 't');
    }
    closedir(d);
    return all;
}

/* SIGSTOP or SIGCONT member i (its pid file in the fixture's directory).
 * SIGSTOP returns once every thread of the member has stopped: kill()
 * only starts the stop, which one thread carries out when it next runs,
 * and until then the member's other threads go on answering (seen: a put
 * answered 40-150 ms after every member was sent SIGSTOP, on a loaded
 * host).  The wait's hang guard is ctest's TIMEOUT. */
static void signal_member(int i, int sig)
{
    char path[300];
    snprintf(path, sizeof path, "%s/m%d.pid", fx.dir, i);
    FILE *f = fopen(path, "r");
    int pid = 0;
    assert_non_null(f);
    assert_int_equal(fscanf(f, "%d", &pid), 1);
    fclose(f);
    assert_int_equal(kill(pid, sig), 0);
    while (sig == SIGSTOP && !all_threads_stopped(pid))
        usleep(1000);
}

struct blind_watch {
    int rc;
    int current; /* current() calls */
};

static int enough_probes(void *arg) { return ((struct blind_watch *)arg)->current >= 4; }

static void on_current(void *arg, int64_t rev)
{
    (void)rev;
    ((struct blind_watch *)arg)->current++;
}

static int on_no_events(void *arg, const etcd_event *ev, size_t n, int64_t rev)
{
    (void)arg, (void)ev, (void)n, (void)rev;
    return 0;
}

/* A frozen member (SIGSTOP: it still accepts connections, nothing answers):
 * a call fails over to the next member within its deadline; a watch on it
 * sees no event or progress notification, probes it, gets no answer and
 * ends with -1, the next stream starting elsewhere; with every member
 * frozen, a call ends (-1) instead of hanging. */
static void test_frozen_member(void **state)
{
    (void)state;
    struct etcd_conf conf = {
        .endpoints = fx.endpoints, .timeout_ms = 1000, .deadline_ms = 3000, .watch_quiet_ms = 300};
    char err[256];
    etcd *c, *w;
    assert_int_equal(etcd_open(&conf, &c, err, sizeof err), 0);
    assert_int_equal(etcd_open(&conf, &w, err, sizeof err), 0);
    ok(w, etcd_put(w, "/t/fz/a", "1", 1, 0, NULL));
    int m = 0; /* the member w answered on, where its watches start */
    while (strcmp(etcd_endpoint(w), etcd_endpoint_at(w, (size_t)m)))
        m++;
    /* A quiet watch on a live member stays open: its probes answer (the
     * created message, then one current() per answered probe). */
    struct blind_watch bw = {0};
    struct etcd_watch_cb cb = {
        .events = on_no_events, .idle = enough_probes, .current = on_current, .arg = &bw};
    int64_t last;
    assert_int_equal(etcd_watch(w, "/t/fz/", 1, &cb, &last), 0);
    assert_true(bw.current >= 4);
    assert_string_equal(etcd_endpoint(w), etcd_endpoint_at(w, (size_t)m));
    signal_member(m, SIGSTOP);
    ok(c, etcd_put(c, "/t/fz/b", "2", 1, 0, NULL)); /* fails over if it tried m */
    assert_string_not_equal(etcd_endpoint(c), etcd_endpoint_at(c, (size_t)m));
    cb.idle = NULL;
    bw.rc = etcd_watch(w, "/t/fz/", 1, &cb, &last);
    assert_int_equal(bw.rc, -1);
    assert_non_null(strstr(etcd_error(w), "no event or progress notification"));
    assert_non_null(strstr(etcd_error(w), etcd_endpoint_at(w, (size_t)m)));
    /* the next stream starts on the next member */
    assert_string_equal(etcd_endpoint(w), etcd_endpoint_at(w, (size_t)(m + 1) % 3));
    signal_member((m + 1) % 3, SIGSTOP);
    signal_member((m + 2) % 3, SIGSTOP);
    assert_int_not_equal(etcd_put(c, "/t/fz/c", "3", 1, 0, NULL), 0);
    for (int i = 0; i < 3; i++)
        signal_member(i, SIGCONT);
    ok(c, etcd_delete(c, "/t/fz/", 1, NULL));
    etcd_close(w);
    etcd_close(c);
}

/* After test_frozen_member, failed or not: no member left stopped for the
 * tests that follow. */
static int thaw_members(void **state)
{
    (void)state;
    for (int i = 0; i < 3; i++)
        signal_member(i, SIGCONT);
    return 0;
}

static int etcdctl(const char *args)
{
    char line[1024];
    /* Its 2 s dial and 5 s command timeouts become hang guards. */
    snprintf(line, sizeof line,
             "ETCDCTL_API=3 etcdctl --dial-timeout=60s --command-timeout=60s --endpoints=%s %s "
             ">/dev/null 2>&1",
             fx.endpoints, args);
    return system(line);
}

static void test_auth(void **state)
{
    (void)state;
    char pw[300], bad[300];
    snprintf(pw, sizeof pw, "%s/pw", fx.dir);
    snprintf(bad, sizeof bad, "%s/bad", fx.dir);
    FILE *f = fopen(pw, "w");
    fputs("s3cret\n", f);
    fclose(f);
    f = fopen(bad, "w");
    fputs("wrong\n", f);
    fclose(f);
    assert_int_equal(etcdctl("user add root:s3cret"), 0);
    assert_int_equal(etcdctl("auth enable"), 0);

    /* The timeout a hang guard, as open_client's (the default 2 s ran out
     * on an authentication at load 30). */
    struct etcd_conf conf = {
        .endpoints = fx.endpoints, .user = "root", .password_file = pw, .timeout_ms = 60000};
    char err[256];
    etcd *c;
    assert_int_equal(etcd_open(&conf, &c, err, sizeof err), 0);
    ok(c, etcd_put(c, "/t/auth/a", "1", 1, 0, NULL));
    etcd_close(c);

    conf.password_file = bad;
    assert_int_equal(etcd_open(&conf, &c, err, sizeof err), 0);
    assert_int_not_equal(etcd_put(c, "/t/auth/b", "1", 1, 0, NULL), 0);
    assert_non_null(strstr(etcd_error(c), "authentication of user 'root' failed"));
    assert_non_null(strstr(etcd_error(c), "invalid user ID or password"));
    etcd_close(c);

    /* No credentials against an auth-enabled cluster: refused. */
    c = open_client();
    assert_int_not_equal(etcd_put(c, "/t/auth/c", "1", 1, 0, NULL), 0);
    etcd_close(c);

    conf.password_file = "/nonexistent/pw";
    assert_int_not_equal(etcd_open(&conf, &c, err, sizeof err), 0);
    assert_non_null(strstr(err, "/nonexistent/pw"));

    assert_int_equal(etcdctl("--user root:s3cret auth disable"), 0);
}

int main(void)
{
    int s = etcd_fixture_start(&fx);
    if (s == 77) {
        printf("SKIP: /usr/bin/etcd not installed (apt-get install etcd-server etcd-client)\n");
        return 77;
    }
    if (s) {
        fprintf(stderr, "could not start the etcd cluster in %s\n", fx.dir);
        etcd_fixture_stop(&fx);
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_put_range_delete),
        cmocka_unit_test(test_create_only),
        cmocka_unit_test(test_lease),
        cmocka_unit_test(test_watch_stream),
        cmocka_unit_test(test_watch_stop_idle),
        cmocka_unit_test(test_failover),
        cmocka_unit_test_teardown(test_frozen_member, thaw_members),
        cmocka_unit_test(test_auth),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    etcd_fixture_stop(&fx);
    return rc;
}
