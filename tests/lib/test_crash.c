/* test_crash.c - SIGKILL a registering process at each named injection
 * point inside the rank lock; the next locker recovers (EOWNERDEAD), the
 * entry holds the old or the new value completely, the arena accounting is
 * exact, and ENOTRECOVERABLE never appears. */
#include <signal.h>
#include <sys/wait.h>

#include "testutil.h"
#include "tu_proc.h"
#include "tu_robust.h"
#include "internal.h"

static const char *target;
static int notify_fd = -1;

static void die_at(const char *point)
{
    if (strcmp(point, target))
        return;
    if (notify_fd >= 0) { /* let the parent do the killing */
        (void)!write(notify_fd, "x", 1);
        for (;;)
            pause();
    }
    raise(SIGKILL);
}

struct point {
    const char *name;
    int new_value_visible; /* after recovery: 1 = new value, 0 = old value */
};

static const struct point points[] = {
    {"reg.locked", 0},       {"reg.allocated", 0}, {"reg.copying", 0},   {"reg.copied", 0},
    {"reg.slot_written", 0}, {"reg.seq_odd", 0},   {"reg.published", 1}, {"reg.old_freed", 1},
};

static uint64_t blob_bytes(size_t sid, size_t info) { return (sid + info + 1023) / 1024 * 1024; }

/* Sum of the arena bytes every registered entry should hold: the rank
 * table's, the "draft" role's and both roles' parallelism configs. */
static uint64_t expected_arena(kvc_segment *s)
{
    uint64_t sum = 0;
    kvc_rank_info ri = {0};
    for (uint32_t r = 0; r < 64; r++) {
        if (kvc_rank_lookup(s, r, &ri) == KVC_OK)
            sum += blob_bytes(strlen(ri.session_id), ri.info_len);
        if (kvc_role_lookup(s, "draft", r, &ri) == KVC_OK)
            sum += blob_bytes(strlen(ri.session_id), ri.info_len);
        if (kvc_parallelism_lookup(s, NULL, r, &ri) == KVC_OK)
            sum += blob_bytes(0, ri.info_len);
        if (kvc_parallelism_lookup(s, "draft", r, &ri) == KVC_OK)
            sum += blob_bytes(0, ri.info_len);
    }
    kvc_rank_info_free(&ri);
    return sum;
}

static void crash_at(const char *name, const struct point *pt, uint32_t rank, int external)
{
    kvc_segment *s = tu_open(name, KVC_OPEN_ATTACH, KVC_ROLE_NONE);
    char *v1 = tu_info(300, 1), *v2 = tu_info(500, 2);
    assert_int_equal(kvc_rank_register(s, rank, "host-a:1", v1, strlen(v1), NULL), KVC_OK);
    kvc_segment_info before;
    kvc_segment_stat(s, &before);
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    pid_t child = fork();
    if (child == 0) {
        close(fds[0]);
        kvc_segment *c = tu_open(name, KVC_OPEN_ATTACH, KVC_ROLE_WORKER);
        target = pt->name;
        notify_fd = external ? fds[1] : -1;
        kvc__test_set_inject(die_at);
        kvc_rank_register(c, rank, "host-b:2", v2, strlen(v2), NULL);
        _exit(3); /* not reached: the point must be hit */
    }
    close(fds[1]);
    if (external) {
        char c;
        assert_int_equal(read(fds[0], &c, 1), 1);
        kill(child, SIGKILL);
    }
    close(fds[0]);
    assert_int_equal(tu_wait_exit(child), TU_KILLED(SIGKILL));
    tu_owner_died(s, child); /* the kernel's part, where it does not */

    /* A lock-free reader sees exactly one whole value. */
    kvc_rank_info ri = {0};
    assert_int_equal(kvc_rank_lookup(s, rank, &ri), KVC_OK);
    const char *want = pt->new_value_visible ? v2 : v1;
    assert_string_equal(ri.info, want);
    assert_string_equal(ri.session_id, pt->new_value_visible ? "host-b:2" : "host-a:1");
    /* The next locker recovers; registration works; no ENOTRECOVERABLE. */
    assert_int_equal(kvc_rank_register(s, 63, "host-c:3", v1, strlen(v1), NULL), KVC_OK);
    assert_int_equal(kvc_rank_withdraw(s, 63, NULL), KVC_OK);
    kvc_segment_info after;
    kvc_segment_stat(s, &after);
    assert_int_equal(after.lock_recoveries, before.lock_recoveries + 1);
    assert_int_equal(after.arena_used, expected_arena(s));
    /* And the crashed rank can be re-registered. */
    uint64_t gen;
    assert_int_equal(kvc_rank_register(s, rank, "host-b:2", v2, strlen(v2), &gen), KVC_OK);
    assert_int_equal(kvc_rank_lookup(s, rank, &ri), KVC_OK);
    assert_string_equal(ri.info, v2);
    kvc_rank_info_free(&ri);
    free(v1);
    free(v2);
    kvc_close(s);
}

/* What the victim writes in the role tables: the "draft" role's
 * transfer-engine info (kind 0) or its parallelism config (kind 1). */
static kvc_err write_kind(kvc_segment *s, int kind, uint32_t rank, const char *sid,
                          const char *json)
{
    if (kind == 0)
        return kvc_role_register(s, "draft", rank, sid, json, strlen(json), NULL);
    return kvc_parallelism_register(s, "draft", rank, json, strlen(json), NULL);
}

static kvc_err read_kind(kvc_segment *s, int kind, uint32_t rank, kvc_rank_info *ri)
{
    return kind == 0 ? kvc_role_lookup(s, "draft", rank, ri)
                     : kvc_parallelism_lookup(s, "draft", rank, ri);
}

/* As crash_at, for an entry of a role table: the same points, the same
 * guarantees (one whole value, exact arena accounting after recovery). */
static void crash_role_at(const char *name, const struct point *pt, uint32_t rank, int kind)
{
    kvc_segment *s = tu_open(name, KVC_OPEN_ATTACH, KVC_ROLE_NONE);
    char *v1 = tu_info(300, 1), *v2 = tu_info(500, 2);
    assert_int_equal(write_kind(s, kind, rank, "host-a:1", v1), KVC_OK);
    kvc_segment_info before;
    kvc_segment_stat(s, &before);
    pid_t child = fork();
    if (child == 0) {
        kvc_segment *c = tu_open(name, KVC_OPEN_ATTACH, KVC_ROLE_WORKER);
        target = pt->name;
        notify_fd = -1;
        kvc__test_set_inject(die_at);
        write_kind(c, kind, rank, "host-b:2", v2);
        _exit(3); /* not reached: the point must be hit */
    }
    int status;
    assert_int_equal(waitpid(child, &status, 0), child);
    assert_true(WIFSIGNALED(status));
    tu_owner_died(s, child); /* the kernel's part, where it does not */
    kvc_rank_info ri = {0};
    assert_int_equal(read_kind(s, kind, rank, &ri), KVC_OK);
    assert_string_equal(ri.info, pt->new_value_visible ? v2 : v1);
    assert_string_equal(ri.session_id, kind == 1               ? ""
                                       : pt->new_value_visible ? "host-b:2"
                                                               : "host-a:1");
    assert_int_equal(kvc_rank_register(s, 63, "host-c:3", v1, strlen(v1), NULL), KVC_OK);
    assert_int_equal(kvc_rank_withdraw(s, 63, NULL), KVC_OK);
    kvc_segment_info after;
    kvc_segment_stat(s, &after);
    assert_int_equal(after.lock_recoveries, before.lock_recoveries + 1);
    assert_int_equal(after.arena_used, expected_arena(s));
    assert_int_equal(write_kind(s, kind, rank, "host-b:2", v2), KVC_OK);
    assert_int_equal(read_kind(s, kind, rank, &ri), KVC_OK);
    assert_string_equal(ri.info, v2);
    kvc_rank_info_free(&ri);
    free(v1);
    free(v2);
    kvc_close(s);
}

static void test_sigkill_role_tables(void **st)
{
    (void)st;
    const char *name = tu_name();
    kvc_segment *owner = tu_open(name, KVC_OPEN_FRESH, KVC_ROLE_DAEMON);
    for (int kind = 0; kind < 2; kind++)
        for (size_t i = 0; i < sizeof points / sizeof *points; i++) {
            print_message("%s: self-kill at %s\n", kind ? "parallelism config" : "role draft",
                          points[i].name);
            crash_role_at(name, &points[i], 30 + (uint32_t)i, kind);
        }
    kvc_close(owner);
    kvc_unlink(name);
}

static void test_sigkill_at_each_point(void **st)
{
    (void)st;
    const char *name = tu_name();
    kvc_segment *owner = tu_open(name, KVC_OPEN_FRESH, KVC_ROLE_DAEMON);
    for (size_t i = 0; i < sizeof points / sizeof *points; i++) {
        print_message("self-kill at %s\n", points[i].name);
        crash_at(name, &points[i], (uint32_t)i, 0);
    }
    for (size_t i = 0; i < sizeof points / sizeof *points; i++) {
        print_message("killed by another process at %s\n", points[i].name);
        crash_at(name, &points[i], 20 + (uint32_t)i, 1);
    }
    kvc_close(owner);
    kvc_unlink(name);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sigkill_at_each_point),
        cmocka_unit_test(test_sigkill_role_tables),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
