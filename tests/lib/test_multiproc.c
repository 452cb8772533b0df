/* test_multiproc.c - real forked processes sharing one segment. */
#include <signal.h>
#include <sys/wait.h>

#include "testutil.h"
#include "tu_proc.h"

#define WORKERS 8

/* Attach to name as rank's worker (its ranks are withdrawn when it closes
 * or dies); NULL on failure. */
static kvc_segment *open_worker(const char *name, uint32_t rank)
{
    kvc_options o;
    kvc_options_init(&o);
    o.name = name;
    o.role = KVC_ROLE_WORKER;
    o.rank = (int32_t)rank;
    kvc_segment *s;
    return kvc_open(&o, &s) == KVC_OK ? s : NULL;
}

static int worker(const char *name, uint32_t rank, int gate_fd, int done_fd, int stay_fd)
{
    kvc_segment *s = open_worker(name, rank);
    if (!s)
        return 10;
    char c;
    if (read(gate_fd, &c, 1) != 0) /* wait until the parent opens the gate */
        return 11;
    char sid[32], *mine = tu_info(40 + (int)rank, rank);
    snprintf(sid, sizeof sid, "127.0.0.1:%u", 16000 + rank);
    if (kvc_rank_register(s, rank, sid, mine, strlen(mine), NULL))
        return 12;
    free(mine);
    kvc_rank_info ri = {0};
    for (uint32_t j = 0; j < WORKERS; j++) {
        if (kvc_rank_wait(s, j, 30000, &ri))
            return 13;
        char *want = tu_info(40 + (int)j, j);
        snprintf(sid, sizeof sid, "127.0.0.1:%u", 16000 + j);
        if (strcmp(ri.info, want) || strcmp(ri.session_id, sid) || ri.entries != 40 + j)
            return 14;
        free(want);
    }
    kvc_rank_info_free(&ri);
    /* Stay attached until every worker has read every rank: a worker's
     * ranks are withdrawn when it closes its last handle. */
    char c2;
    if (write(done_fd, "d", 1) != 1 || read(stay_fd, &c2, 1) != 0)
        return 15;
    kvc_close(s);
    return 0;
}

static void test_eight_workers_register_and_read_all(void **st)
{
    (void)st;
    const char *name = tu_name();
    kvc_segment *s = tu_open(name, KVC_OPEN_FRESH, KVC_ROLE_DAEMON);
    int gate[2], done[2], stay[2];
    assert_int_equal(pipe(gate), 0);
    assert_int_equal(pipe(done), 0);
    assert_int_equal(pipe(stay), 0);
    pid_t pids[WORKERS];
    for (uint32_t i = 0; i < WORKERS; i++) {
        pids[i] = fork();
        if (pids[i] == 0) {
            close(gate[1]);
            close(stay[1]);
            _exit(worker(name, i, gate[0], done[1], stay[0]));
        }
    }
    close(gate[0]);
    close(stay[0]);
    close(gate[1]); /* all workers start registering at once */
    char c;
    for (int i = 0; i < WORKERS; i++)
        if (read(done[0], &c, 1) != 1)
            break;
    kvc_segment_info mid;
    kvc_segment_stat(s, &mid);
    assert_int_equal(mid.ranks_registered, WORKERS);
    close(stay[1]); /* now they may go */
    tu_reap_ok(pids, WORKERS);
    /* Gone: their ranks were withdrawn when they closed. */
    kvc_segment_info si;
    kvc_segment_stat(s, &si);
    assert_int_equal(si.ranks_registered, 0);
    kvc_rank_info ri = {0};
    assert_int_equal(kvc_rank_lookup(s, 3, &ri), KVC_E_WITHDRAWN);
    assert_non_null(strstr(ri.note, "exited (closed its segment handle)"));
    kvc_rank_info_free(&ri);
    close(done[0]);
    close(done[1]);
    kvc_close(s);
    kvc_unlink(name);
}

/* A worker registers (sid, info) for rank, says so on ready_fd, then stays
 * attached until go_fd is closed. */
static int same_bytes_worker(const char *name, uint32_t rank, int ready_fd, int go_fd)
{
    kvc_segment *s = open_worker(name, rank);
    if (!s)
        return 10;
    char *info = tu_info(8, rank);
    if (kvc_rank_register(s, rank, "127.0.0.1:17005", info, strlen(info), NULL))
        return 12;
    free(info);
    char c;
    if (write(ready_fd, "r", 1) != 1 || read(go_fd, &c, 1) != 0)
        return 15;
    kvc_close(s);
    return 0;
}

/* other_go: another worker's go write end, closed in the child so that
 * closing it in the parent is that worker's EOF (-1: none). */
static pid_t start_same_bytes_worker(const char *name, uint32_t rank, int ready[2], int go[2],
                                     int other_go)
{
    pid_t pid = fork();
    if (pid == 0) {
        close(go[1]);
        if (other_go >= 0)
            close(other_go);
        _exit(same_bytes_worker(name, rank, ready[1], go[0]));
    }
    char c;
    assert_int_equal(read(ready[0], &c, 1), 1);
    return pid;
}

/* Byte-identical registrations from two processes: the second takes the
 * rank over, so the first one's exit does not withdraw it from under the
 * second (it used to be a no-op that left the first as the owner). */
static void test_same_bytes_from_another_process_take_over(void **st)
{
    (void)st;
    const char *name = tu_name();
    kvc_segment *s = tu_open(name, KVC_OPEN_FRESH, KVC_ROLE_DAEMON);
    int ready[2], go_a[2], go_b[2];
    assert_int_equal(pipe(ready), 0);
    assert_int_equal(pipe(go_a), 0);
    pid_t a = start_same_bytes_worker(name, 5, ready, go_a, -1);
    close(go_a[0]);
    assert_int_equal(pipe(go_b), 0); /* after A's fork: A does not hold it */
    kvc_rank_info ri = {0};
    assert_int_equal(kvc_rank_lookup(s, 5, &ri), KVC_OK);
    uint64_t gen_a = ri.generation;
    pid_t b = start_same_bytes_worker(name, 5, ready, go_b, go_a[1]);
    close(go_b[0]);
    assert_int_equal(kvc_rank_lookup(s, 5, &ri), KVC_OK);
    assert_true(ri.generation > gen_a); /* a new owner is a change */
    assert_int_equal(ri.pid, b);
    close(go_a[1]); /* A closes its handle and exits */
    assert_int_equal(tu_wait_exit(a), 0);
    assert_int_equal(kvc_rank_lookup(s, 5, &ri), KVC_OK); /* still B's */
    assert_int_equal(ri.pid, b);
    /* The daemon (HTTP) registering the same bytes takes it over too: B's
     * SIGKILL and reaping then leave it registered. */
    char *info = tu_info(8, 5);
    assert_int_equal(kvc_rank_register(s, 5, "127.0.0.1:17005", info, strlen(info), NULL), KVC_OK);
    free(info);
    kill(b, SIGKILL);
    assert_int_equal(waitpid(b, NULL, 0), b);
    assert_int_equal(kvc_proc_reap_dead(s, NULL), KVC_OK);
    assert_int_equal(kvc_rank_lookup(s, 5, &ri), KVC_OK);
    assert_int_equal(ri.pid, getpid());
    /* The same process registering the same bytes again stays a no-op. */
    uint64_t gen = ri.generation;
    info = tu_info(8, 5);
    assert_int_equal(kvc_rank_register(s, 5, "127.0.0.1:17005", info, strlen(info), NULL), KVC_OK);
    free(info);
    assert_int_equal(kvc_rank_lookup(s, 5, &ri), KVC_OK);
    assert_int_equal(ri.generation, gen);
    kvc_rank_info_free(&ri);
    close(go_b[1]);
    close(ready[0]);
    close(ready[1]);
    kvc_close(s);
    kvc_unlink(name);
}

/* In a child: rank 6 registered with (sid, info) through a handle of
 * role `role`, which is then closed; 0, else what failed. */
static int register_from_child(const char *name, kvc_role role, const char *sid, const char *info)
{
    kvc_segment *c = tu_open(name, KVC_OPEN_ATTACH, role);
    if (!c)
        return 10;
    kvc_err e = kvc_rank_register(c, 6, sid, info, strlen(info), NULL);
    kvc_close(c);
    return e ? 11 : 0;
}

static pid_t register_in_child(const char *name, kvc_role role, const char *sid, const char *info)
{
    pid_t pid = fork();
    if (pid == 0)
        _exit(register_from_child(name, role, sid, info));
    assert_int_equal(tu_wait_exit(pid), 0);
    return pid;
}

/* Between registrations no exit withdraws (a daemon's, a client's), the
 * same bytes from another process change nothing: a kvcoordd restarted on
 * the segment re-registering its predecessor's HTTP registration keeps the
 * generation (and the pid of the process that made the last change).  A
 * worker's registration of the same bytes is still a change of owner. */
static void test_same_bytes_unowned_from_another_process_keep(void **st)
{
    (void)st;
    const char *name = tu_name();
    kvc_segment *s = tu_open(name, KVC_OPEN_FRESH, KVC_ROLE_DAEMON);
    char *info = tu_info(8, 6);
    pid_t first = register_in_child(name, KVC_ROLE_DAEMON, "127.0.0.1:17006", info);
    kvc_rank_info ri = {0};
    assert_int_equal(kvc_rank_lookup(s, 6, &ri), KVC_OK);
    uint64_t gen = ri.generation;
    assert_int_equal(ri.pid, first);
    register_in_child(name, KVC_ROLE_DAEMON, "127.0.0.1:17006", info); /* the "restart" */
    assert_int_equal(kvc_rank_lookup(s, 6, &ri), KVC_OK);
    assert_int_equal(ri.generation, gen);
    assert_int_equal(ri.pid, first);
    register_in_child(name, KVC_ROLE_CLIENT, "127.0.0.1:17006", info);
    uint64_t g2 = 0;
    assert_int_equal(kvc_rank_register(s, 6, "127.0.0.1:17006", info, strlen(info), &g2), KVC_OK);
    assert_int_equal(g2, gen); /* this daemon too */
    /* Other bytes are a change, whoever sends them. */
    pid_t other = register_in_child(name, KVC_ROLE_DAEMON, "127.0.0.1:17007", info);
    assert_int_equal(kvc_rank_lookup(s, 6, &ri), KVC_OK);
    assert_int_equal(ri.generation, gen + 1);
    assert_int_equal(ri.pid, other);
    /* A worker's same bytes take the rank over (withdrawn at its exit). */
    pid_t w = register_in_child(name, KVC_ROLE_WORKER, "127.0.0.1:17007", info);
    kvc_err e = kvc_rank_lookup(s, 6, &ri); /* withdrawn once the worker's exit is seen */
    assert_true(e == KVC_OK || e == KVC_E_WITHDRAWN);
    assert_true(ri.generation > gen + 1);
    assert_true(e == KVC_E_WITHDRAWN || ri.pid == w);
    free(info);
    kvc_rank_info_free(&ri);
    kvc_close(s);
    kvc_unlink(name);
}

static void test_reader_in_other_process_wakes(void **st)
{
    (void)st;
    const char *name = tu_name();
    kvc_segment *s = tu_open(name, KVC_OPEN_FRESH, KVC_ROLE_DAEMON);
    pid_t child = fork();
    if (child == 0) {
        kvc_segment *c = tu_open(name, KVC_OPEN_ATTACH, KVC_ROLE_CLIENT);
        kvc_rank_info ri = {0};
        kvc_err e = kvc_rank_wait(c, 30, 60000, &ri);
        _exit(e == KVC_OK && !strcmp(ri.session_id, "[::1]:16030") ? 0 : 1);
    }
    usleep(200000);
    int status;
    assert_int_equal(waitpid(child, &status, WNOHANG), 0); /* still blocked */
    assert_int_equal(kvc_rank_register(s, 30, "[::1]:16030", "{}", 2, NULL), KVC_OK);
    assert_int_equal(tu_wait_exit(child), 0);
    kvc_close(s);
    kvc_unlink(name);
}

static void test_proc_wait_change_wakes_on_attach(void **st)
{
    (void)st;
    const char *name = tu_name();
    kvc_segment *s = tu_open(name, KVC_OPEN_FRESH, KVC_ROLE_DAEMON);
    uint32_t ep = kvc_proc_epoch(s);
    assert_int_equal(kvc_proc_wait_change(s, ep, 20), KVC_E_TIMEDOUT);
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    pid_t child = fork();
    if (child == 0) {
        char c;
        if (read(fds[0], &c, 1) != 1) /* attach only once the parent waits */
            _exit(2);
        kvc_segment *c2 = tu_open(name, KVC_OPEN_ATTACH, KVC_ROLE_WORKER);
        kvc_close(c2);
        _exit(0);
    }
    assert_int_equal(write(fds[1], "g", 1), 1);
    assert_int_equal(kvc_proc_wait_change(s, ep, 60000), KVC_OK);
    assert_int_not_equal(kvc_proc_epoch(s), ep);
    assert_int_equal(tu_wait_exit(child), 0);
    kvc_close(s);
    kvc_unlink(name);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_eight_workers_register_and_read_all),
        cmocka_unit_test(test_same_bytes_from_another_process_take_over),
        cmocka_unit_test(test_same_bytes_unowned_from_another_process_keep),
        cmocka_unit_test(test_reader_in_other_process_wakes),
        cmocka_unit_test(test_proc_wait_change_wakes_on_attach),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
