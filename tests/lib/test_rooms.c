/* test_rooms.c - rooms across real processes: the first failure seen by
 * every rank, Success from all, death of a participant, crash injection
 * inside room updates, table load and capacity, TTL, and a randomised
 * multi-process run checked against a reference model. */
#include <errno.h>
#include <signal.h>
#include <sys/wait.h>

#include "internal.h"
#include "testutil.h"
#include "tu_probe.h"
#include "tu_proc.h"
#include "tu_robust.h"

#define N 8
#define ROOM 0x5eed00000000beefull

/* A room TTL no test outlives: 60 s was not enough on a loaded machine, where
 * test_crash_inside_room_updates' room 100 passed its TTL mid-test (load 46,
 * a fresh-machine run) and read as gone.  Tests of the TTL set their own. */
#define NO_TTL_MS 86400000u

static kvc_segment *open_seg(const char *name, kvc_open_mode mode, kvc_role role,
                             uint32_t max_rooms, uint32_t ttl_ms)
{
    kvc_options o = tu_options(name, mode, role);
    o.arena_bytes = 1 << 20;
    o.max_info_bytes = 1 << 16;
    o.max_rooms = max_rooms;
    o.room_ttl_ms = ttl_ms;
    return tu_open_with(&o);
}

/* ---- one failure, seen the same by all 8 ranks ---------------------- */

static int rank_main(const char *name, uint32_t rank, int ready_fd, int go_fd)
{
    kvc_segment *s = open_seg(name, KVC_OPEN_ATTACH, KVC_ROLE_WORKER, 0, 0);
    if (kvc_room_open(s, ROOM, N, rank, rank < 4 ? KVC_ROOM_ROLE_PREFILL : KVC_ROOM_ROLE_DECODE))
        return 10;
    if (kvc_room_set_state(s, ROOM, rank, KVC_POLL_TRANSFERRING))
        return 11;
    char c = 'r';
    kvc_room_info ri;
    if (rank == 5) {
        if (read(go_fd, &c, 1) != 1)
            return 12;
        int kept = 0;
        if (kvc_room_fail(s, ROOM, 5, 12,
                          "ibv_post_send: Cannot allocate memory (RLIMIT_MEMLOCK "
                          "8388608 bytes)",
                          &kept) ||
            !kept)
            return 13;
    } else {
        if (write(ready_fd, &c, 1) != 1)
            return 14;
        /* Block until the room changes away from Bootstrapping (its min). */
        kvc_err e = kvc_room_wait(s, ROOM, (int32_t)rank, KVC_POLL_BOOTSTRAPPING, 60000, &ri);
        while (!e && !ri.has_failure)
            e = kvc_room_wait(s, ROOM, (int32_t)rank, ri.state, 60000, &ri);
        if (e)
            return 15;
    }
    if (kvc_room_get(s, ROOM, (int32_t)rank, &ri))
        return 16;
    if (ri.state != KVC_POLL_FAILED || !ri.has_failure || ri.failure.origin_rank != 5 ||
        ri.failure.code != 12 || ri.failure.is_from_another_rank != (rank != 5) ||
        strcmp(ri.failure.reason, "ibv_post_send: Cannot allocate memory (RLIMIT_MEMLOCK "
                                  "8388608 bytes)"))
        return 17;
    char text[512];
    kvc_failure_text(&ri.failure, text, sizeof text);
    if (!strstr(text, "room 6840123409045700335") || !strstr(text, "rank 5") ||
        !strstr(text, "Cannot allocate memory") || strstr(text, "unknown reason"))
        return 18;
    kvc_close(s);
    return 0;
}

static void test_failure_seen_by_all_ranks(void **st)
{
    (void)st;
    const char *name = tu_name();
    kvc_segment *s = open_seg(name, KVC_OPEN_FRESH, KVC_ROLE_DAEMON, 128, NO_TTL_MS);
    int ready, go;
    pid_t pids[N];
    tu_fork_gated(name, N, rank_main, pids, &ready, &go);
    char c;
    for (int i = 0; i < N - 1; i++)
        assert_int_equal(read(ready, &c, 1), 1);
    usleep(100000); /* let the 7 waiters reach the futex */
    assert_int_equal(write(go, "g", 1), 1);
    tu_reap_ok(pids, N);
    close(ready);
    close(go);
    /* A second failure from another rank changes nothing. */
    int kept = 1;
    assert_int_equal(kvc_room_fail(s, ROOM, 2, 110, "timed out", &kept), KVC_OK);
    assert_int_equal(kept, 0);
    kvc_room_info ri;
    assert_int_equal(kvc_room_get(s, ROOM, 2, &ri), KVC_OK);
    assert_int_equal(ri.failure.origin_rank, 5);
    assert_int_equal(ri.failure.code, 12);
    assert_true(ri.failure.is_from_another_rank);
    kvc_failure_info recent[4];
    size_t n = 0;
    assert_int_equal(kvc_failures_recent(s, recent, 4, &n), KVC_OK);
    assert_int_equal(n, 1);
    assert_int_equal(recent[0].room, ROOM);
    kvc_close(s);
    kvc_unlink(name);
}

static void test_success_needs_all_and_is_sticky(void **st)
{
    (void)st;
    const char *name = tu_name();
    kvc_segment *s = open_seg(name, KVC_OPEN_FRESH, KVC_ROLE_DAEMON, 128, NO_TTL_MS);
    kvc_room_info ri;
    for (uint32_t r = 0; r < N; r++)
        assert_int_equal(kvc_room_open(s, 7, 0, r, KVC_ROOM_ROLE_DECODE), KVC_OK);
    assert_int_equal(kvc_room_open(s, 7, 4, 0, KVC_ROOM_ROLE_DECODE), KVC_E_INVAL);
    assert_int_equal(kvc_room_open(s, 7, 0, N, KVC_ROOM_ROLE_DECODE), KVC_E_INVAL);
    assert_int_equal(kvc_room_get(s, 7, 0, &ri), KVC_OK);
    assert_int_equal(ri.participants, N); /* default: world size */
    assert_int_equal(ri.state, KVC_POLL_BOOTSTRAPPING);
    assert_int_equal(kvc_room_set_state(s, 7, 0, KVC_POLL_WAITING_FOR_INPUT), KVC_OK);
    assert_int_equal(kvc_room_get(s, 7, 0, &ri), KVC_OK);
    assert_int_equal(ri.state, KVC_POLL_BOOTSTRAPPING); /* others unwritten */
    for (uint32_t r = 0; r < N - 1; r++)
        assert_int_equal(kvc_room_set_state(s, 7, r, KVC_POLL_SUCCESS), KVC_OK);
    assert_int_equal(kvc_room_get(s, 7, 0, &ri), KVC_OK);
    assert_int_equal(ri.state, KVC_POLL_BOOTSTRAPPING);
    assert_int_equal(kvc_room_set_state(s, 7, N - 1, KVC_POLL_TRANSFERRING), KVC_OK);
    assert_int_equal(kvc_room_get(s, 7, 0, &ri), KVC_OK);
    assert_int_equal(ri.state, KVC_POLL_TRANSFERRING);
    assert_int_equal(kvc_room_set_state(s, 7, N - 1, KVC_POLL_SUCCESS), KVC_OK);
    assert_int_equal(kvc_room_get(s, 7, 0, &ri), KVC_OK);
    assert_int_equal(ri.state, KVC_POLL_SUCCESS);
    /* Sticky: later writes and failures change nothing. */
    assert_int_equal(kvc_room_set_state(s, 7, 3, KVC_POLL_TRANSFERRING), KVC_OK);
    int kept = 1;
    assert_int_equal(kvc_room_fail(s, 7, 3, 5, "late", &kept), KVC_OK);
    assert_int_equal(kept, 0);
    assert_int_equal(kvc_room_get(s, 7, 0, &ri), KVC_OK);
    assert_int_equal(ri.state, KVC_POLL_SUCCESS);
    assert_false(ri.has_failure);
    /* set_state(Failed) records a failure naming the rank. */
    assert_int_equal(kvc_room_open(s, 8, 2, 0, KVC_ROOM_ROLE_PREFILL), KVC_OK);
    assert_int_equal(kvc_room_set_state(s, 8, 1, KVC_POLL_FAILED), KVC_OK);
    assert_int_equal(kvc_room_get(s, 8, 0, &ri), KVC_OK);
    assert_int_equal(ri.state, KVC_POLL_FAILED);
    assert_string_equal(ri.failure.reason, "rank 1 reported Failed");
    assert_int_equal(kvc_room_set_state(s, 8, 1, (kvc_poll)9), KVC_E_INVAL);
    /* A failure's origin is a participant: below the room's count (2), or
     * the world size (N) for a room not there yet, which is not created. */
    assert_int_equal(kvc_room_fail(s, 8, 2, 1, "x", NULL), KVC_E_INVAL);
    assert_string_equal(kvc_last_error(),
                        "rank 2 out of range for room 8: it has 2 participants (ranks 0..1)");
    assert_int_equal(kvc_room_fail(s, 557, N, 1, "x", NULL), KVC_E_INVAL);
    assert_int_equal(kvc_room_get(s, 557, 0, &ri), KVC_E_NOENT);
    /* A refused open leaves no room behind; an origin beyond the table is refused. */
    assert_int_equal(kvc_room_open(s, 555, 2, 5, KVC_ROOM_ROLE_DECODE), KVC_E_INVAL);
    assert_int_equal(kvc_room_get(s, 555, 0, &ri), KVC_E_NOENT);
    /* participants 0 is the world size (N), and the refusal says so. */
    assert_int_equal(kvc_room_open(s, 555, 0, N + 3, KVC_ROOM_ROLE_DECODE), KVC_E_INVAL);
    assert_string_equal(kvc_last_error(),
                        "rank 11 out of range for room 555: it has 8 participants (ranks 0..7; "
                        "participants 0 means the segment's world size, 8)");
    assert_int_equal(kvc_room_open(s, 555, 1, 1, KVC_ROOM_ROLE_DECODE), KVC_E_INVAL);
    assert_string_equal(kvc_last_error(),
                        "rank 1 out of range for room 555: it has 1 participant (rank 0)");
    assert_int_equal(kvc_room_get(s, 555, 0, &ri), KVC_E_NOENT);
    assert_int_equal(kvc_room_fail(s, 556, 64, 1, "x", NULL), KVC_E_INVAL);
    assert_int_equal(kvc_room_get(s, 556, 0, &ri), KVC_E_NOENT);
    assert_int_equal(kvc_room_set_state(s, 99, 1, KVC_POLL_SUCCESS), KVC_E_NOENT);
    /* Release by all reclaims the room. */
    assert_int_equal(kvc_room_release(s, 8, 0), KVC_OK);
    assert_int_equal(kvc_room_get(s, 8, 0, &ri), KVC_OK);
    assert_int_equal(ri.released, 1);
    assert_int_equal(kvc_room_release(s, 8, 1), KVC_OK);
    assert_int_equal(kvc_room_get(s, 8, 0, &ri), KVC_E_NOENT);
    /* Long reasons are cut on a character boundary. */
    char reason[600];
    size_t at = 0;
    while (at + 3 < sizeof reason - 1)
        at += (size_t)snprintf(reason + at, sizeof reason - at, "\xc3\xa9"); /* é */
    assert_int_equal(kvc_room_fail(s, 9, 0, 1, reason, &kept), KVC_OK);
    assert_int_equal(kvc_room_get(s, 9, 0, &ri), KVC_OK);
    assert_int_equal(strlen(ri.failure.reason) % 2, 0);
    assert_true(strlen(ri.failure.reason) <= KVC_REASON_MAX);
    kvc_close(s);
    kvc_unlink(name);
}

/* ---- a participant killed with SIGKILL, no daemon --------------------- */

static void test_dead_participant_fails_room(void **st)
{
    (void)st;
    const char *name = tu_name();
    kvc_segment *s = open_seg(name, KVC_OPEN_FRESH, KVC_ROLE_WORKER, 128, NO_TTL_MS);
    assert_int_equal(kvc_room_open(s, 42, 4, 0, KVC_ROOM_ROLE_PREFILL), KVC_OK);
    assert_int_equal(kvc_rank_register(s, 0, "h:0", "{}", 2, NULL), KVC_OK);
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    pid_t child = fork();
    if (child == 0) {
        kvc_segment *c = open_seg(name, KVC_OPEN_ATTACH, KVC_ROLE_WORKER, 0, 0);
        kvc_room_open(c, 42, 4, 2, KVC_ROOM_ROLE_PREFILL);
        kvc_room_set_state(c, 42, 2, KVC_POLL_TRANSFERRING);
        kvc_rank_register(c, 2, "h:2", "{\"w\":[1,2,2]}", 13, NULL);
        (void)!write(fds[1], "x", 1);
        for (;;)
            pause();
    }
    char c;
    assert_int_equal(read(fds[0], &c, 1), 1);
    kvc_room_info ri;
    assert_int_equal(kvc_room_get(s, 42, 0, &ri), KVC_OK);
    assert_int_equal(ri.state, KVC_POLL_BOOTSTRAPPING);
    kill(child, SIGKILL);
    /* Not reaped yet (a zombie): the library reads how it ended. */
    siginfo_t si;
    assert_int_equal(waitid(P_PID, (id_t)child, &si, WEXITED | WNOWAIT), 0);
    /* With no watcher, readers look a participant up in /proc at most every
     * 100 ms: the wait re-reads the room until it fails. */
    assert_int_equal(kvc_room_wait(s, 42, 0, KVC_POLL_BOOTSTRAPPING, 10000, &ri), KVC_OK);
    assert_int_equal(ri.state, KVC_POLL_FAILED);
    /* How it ended is read only for the process whose start time was
     * recorded: the child's own record of it. */
    const char *no_self_stat = tu_probe_self_stat();
    const char *how = no_self_stat ? "" : " killed by signal 9";
    char want[64];
    snprintf(want, sizeof want, "rank 2 (pid %d)%s", (int)child, how);
    assert_non_null(strstr(ri.failure.reason, want));
    assert_int_equal(ri.failure.origin_rank, 2);
    assert_true(ri.failure.is_from_another_rank);
    /* Reaping withdraws the ranks it registered. */
    size_t reaped = 0;
    assert_int_equal(kvc_proc_reap_dead(s, &reaped), KVC_OK);
    assert_int_equal(reaped, 1);
    kvc_rank_info rk = {0};
    assert_int_equal(kvc_rank_lookup(s, 2, &rk), KVC_E_WITHDRAWN);
    snprintf(want, sizeof want, "rank 2's process %d%s", (int)child, how);
    assert_non_null(strstr(rk.note, want));
    assert_int_equal(kvc_rank_lookup(s, 0, &rk), KVC_OK); /* ours is untouched */
    kvc_proc_info procs[8];
    size_t np = 0;
    assert_int_equal(kvc_proc_list(s, procs, 8, &np), KVC_OK);
    assert_int_equal(np, 1);
    assert_int_equal(procs[0].pid, getpid());
    waitpid(child, NULL, 0);
    kvc_rank_info_free(&rk);
    kvc_close(s);
    kvc_unlink(name);
    TU_SKIP_PART_UNLESS(no_self_stat, "the reason's \"killed by signal 9\"");
}

/* ---- liveness from a watcher's marks ------------------------------------ */

/* Fork a worker that opens room (2 participants) as rank 1, writes a byte
 * to ready_fd and waits to be killed; its pid. */
static pid_t fork_participant(const char *name, uint64_t room, int ready_fd)
{
    pid_t pid = fork();
    if (pid == 0) {
        kvc_segment *c = open_seg(name, KVC_OPEN_ATTACH, KVC_ROLE_WORKER, 0, 0);
        kvc_room_open(c, room, 2, 1, KVC_ROOM_ROLE_DECODE);
        (void)!write(ready_fd, "p", 1);
        for (;;)
            pause();
    }
    return pid;
}

/* While a watcher beats, readers trust the process table: a participant
 * that died but is not marked yet still counts as alive (no /proc read),
 * and the dead mark alone fails the room with the reason the mark names. */
static void test_watched_liveness_from_marks(void **st)
{
    (void)st;
    /* The marks name the child by the start time it recorded itself. */
    TU_SKIP_UNLESS(tu_probe_self_stat());
    const char *name = tu_name();
    kvc_segment *s = open_seg(name, KVC_OPEN_FRESH, KVC_ROLE_DAEMON, 128, NO_TTL_MS);
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    pid_t child = fork_participant(name, 77, fds[1]);
    char ch;
    assert_int_equal(read(fds[0], &ch, 1), 1);
    assert_int_equal(kvc_proc_watch_beat(s, 1), KVC_OK);
    uint64_t start = kvc__proc_start(child);
    kill(child, SIGKILL);
    waitpid(child, NULL, 0);
    usleep(150000); /* past the /proc re-check interval: only the marks count */
    kvc_room_info ri;
    assert_int_equal(kvc_room_get(s, 77, 0, &ri), KVC_OK);
    assert_int_equal(ri.state, KVC_POLL_BOOTSTRAPPING); /* not marked yet: alive */
    kvc__proc_mark_dead(s, child, start, "killed by signal 9 (Killed), as the watcher saw");
    assert_int_equal(kvc_room_get(s, 77, 0, &ri), KVC_OK);
    assert_int_equal(ri.state, KVC_POLL_FAILED);
    char want[96];
    snprintf(want, sizeof want, "rank 1 (pid %d) killed by signal 9 (Killed), as the", (int)child);
    assert_non_null(strstr(ri.failure.reason, want));
    /* The beat withdrawn: back to /proc for the others. */
    assert_int_equal(kvc_proc_watch_beat(s, 0), KVC_OK);
    size_t reaped = 0;
    assert_int_equal(kvc_proc_reap_dead(s, &reaped), KVC_OK);
    assert_int_equal(reaped, 1);
    kvc_close(s);
    kvc_unlink(name);
}

/* ---- a watcher SIGKILLed, then a participant: trust ends in time ------ */

/* The README's promise: rooms fail at once even with kvcoordd down.  A
 * watcher (as kvcoordd) beats every KVC_PROC_WATCH_BEAT_MS and is
 * SIGKILLed, then a participant is SIGKILLed (nobody marks it dead).  The
 * first read later than the watcher's death + KVC_PROC_WATCH_STALE_MS +
 * the /proc re-check interval (+ 50 ms for the coarse clock) must see the
 * room Failed.  (With the old 3 s staleness it read Bootstrapping.) */
static void test_watcher_death_ends_trust(void **st)
{
    (void)st;
    TU_SKIP_UNLESS(tu_probe_self_stat());
    const char *name = tu_name();
    kvc_segment *s = open_seg(name, KVC_OPEN_FRESH, KVC_ROLE_DAEMON, 128, NO_TTL_MS);
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    pid_t watcher = fork();
    if (watcher == 0) {
        kvc_segment *c = open_seg(name, KVC_OPEN_ATTACH, KVC_ROLE_DAEMON, 0, 0);
        kvc_proc_watch_beat(c, 1);
        (void)!write(fds[1], "w", 1);
        for (;;) {
            usleep(KVC_PROC_WATCH_BEAT_MS * 1000);
            kvc_proc_watch_beat(c, 1);
        }
    }
    pid_t part = fork_participant(name, 7001, fds[1]);
    char ch;
    assert_int_equal(read(fds[0], &ch, 1), 1);
    assert_int_equal(read(fds[0], &ch, 1), 1);
    kvc_room_info ri;
    assert_int_equal(kvc_room_get(s, 7001, 0, &ri), KVC_OK);
    assert_int_equal(ri.state, KVC_POLL_BOOTSTRAPPING);
    kill(watcher, SIGKILL);
    waitpid(watcher, NULL, 0);
    uint64_t dead_ns = kvc__seg_mono_ns(); /* its last beat was before this */
    kill(part, SIGKILL);
    waitpid(part, NULL, 0);
    uint64_t bound_ns =
        dead_ns + (uint64_t)(KVC_PROC_WATCH_STALE_MS + KVC__LIVENESS_RECHECK_MS + 50) * 1000000ull;
    /* Readers poll as rank 0 would; before the bound nothing is asserted
     * (the beat may go stale sooner on a loaded machine: /proc then
     * answers at once). */
    for (;;) {
        uint64_t t = kvc__seg_mono_ns();
        assert_int_equal(kvc_room_get(s, 7001, 0, &ri), KVC_OK);
        if (t > bound_ns)
            break;
        usleep(20000);
    }
    assert_int_equal(ri.state, KVC_POLL_FAILED);
    char want[48];
    snprintf(want, sizeof want, "rank 1 (pid %d)", (int)part);
    assert_non_null(strstr(ri.failure.reason, want));
    close(fds[0]);
    close(fds[1]);
    kvc_close(s);
    kvc_unlink(name);
}

/* ---- a participant that closes its last handle without releasing ------ */

static void test_close_fails_unreleased_rooms(void **st)
{
    (void)st;
    const char *name = tu_name();
    kvc_segment *s = open_seg(name, KVC_OPEN_FRESH, KVC_ROLE_NONE, 128, NO_TTL_MS);
    pid_t child = fork();
    if (child == 0) {
        kvc_segment *a = open_seg(name, KVC_OPEN_ATTACH, KVC_ROLE_WORKER, 0, 0);
        kvc_segment *b = open_seg(name, KVC_OPEN_ATTACH, KVC_ROLE_WORKER, 0, 0);
        kvc_room_open(a, 77, 2, 0, KVC_ROOM_ROLE_DECODE);
        kvc_room_open(a, 78, 2, 0, KVC_ROOM_ROLE_DECODE);
        kvc_room_release(a, 78, 0);
        kvc_close(b); /* not the last handle: nothing fails */
        kvc_room_info ri;
        if (kvc_room_get(a, 77, 0, &ri) || ri.has_failure)
            _exit(1);
        kvc_close(a);
        _exit(0);
    }
    assert_int_equal(tu_wait_exit(child), 0);
    kvc_room_info ri;
    assert_int_equal(kvc_room_get(s, 77, 1, &ri), KVC_OK);
    assert_int_equal(ri.state, KVC_POLL_FAILED);
    assert_non_null(strstr(ri.failure.reason, "closed its segment handle without releasing"));
    assert_int_equal(kvc_room_get(s, 78, 1, &ri), KVC_OK); /* released: not failed */
    assert_false(ri.has_failure);
    kvc_close(s);
    kvc_unlink(name);
}

/* ---- crash injection inside room updates ---------------------------- */

static const char *target;
static void die_at(const char *point)
{
    if (!strcmp(point, target))
        raise(SIGKILL);
}

enum op { OP_STATE, OP_FAIL, OP_CREATE, OP_RELEASE, OP_DELETE };

/* A child attached to segment name runs op and is SIGKILLed at point (the
 * inject hook) inside it; s (attached here) sees its death as the kernel
 * would tell a lock waiter.  The crash cases' one setup. */
static void killed_inside(kvc_segment *s, const char *name, const char *point, enum op op)
{
    pid_t child = fork();
    if (child == 0) {
        kvc_segment *c = open_seg(name, KVC_OPEN_ATTACH, KVC_ROLE_NONE, 0, 0);
        target = point;
        kvc__test_set_inject(die_at);
        switch (op) {
        case OP_STATE: kvc_room_set_state(c, 100, 1, KVC_POLL_TRANSFERRING); break;
        case OP_FAIL: kvc_room_fail(c, 100, 1, 5, "crashing writer", NULL); break;
        case OP_CREATE: kvc_room_open(c, 101, 2, 0, KVC_ROOM_ROLE_PREFILL); break;
        case OP_RELEASE: kvc_room_release(c, 100, 1); break;
        case OP_DELETE: kvc_room_release(c, 7, 0); break; /* its only participant */
        }
        _exit(3);
    }
    assert_int_equal(tu_wait_exit(child), TU_KILLED(SIGKILL));
    tu_owner_died(s, child); /* the kernel's part, where it does not */
}

/* Compare the room as read now with the room before a killed update:
 * rolled back (committed 0) it reads exactly as before; committed it reads
 * as after the whole update. */
static void expect_room(kvc_segment *s, enum op op, int committed, int have, int have101,
                        const kvc_room_info *before)
{
    kvc_room_info after;
    assert_int_equal(kvc_room_get(s, 100, 0, &after) == KVC_OK, have);
    if (have) {
        int8_t want[KVC_ROOM_MAX_PARTICIPANTS];
        memcpy(want, before->local, sizeof want);
        if (committed && op == OP_STATE && before->state != KVC_POLL_FAILED)
            want[1] = KVC_POLL_TRANSFERRING;
        assert_memory_equal(after.local, want, sizeof want);
        assert_int_equal(after.has_failure, before->has_failure || (committed && op == OP_FAIL));
        assert_int_equal(after.released, before->released + (committed && op == OP_RELEASE));
        if (!committed)
            assert_int_equal(after.state, before->state);
    }
    assert_int_equal(kvc_room_get(s, 101, 0, &after) == KVC_OK,
                     have101 || (committed && op == OP_CREATE));
}

static void crash_room_op(const char *name, const char *point, enum op op, int committed)
{
    kvc_segment *s = open_seg(name, KVC_OPEN_ATTACH, KVC_ROLE_NONE, 0, 0);
    kvc_room_info before;
    kvc_segment_info sb, sa;
    int have = kvc_room_get(s, 100, 0, &before) == KVC_OK;
    kvc_room_info r101;
    int have101 = kvc_room_get(s, 101, 0, &r101) == KVC_OK;
    kvc_segment_stat(s, &sb);
    killed_inside(s, name, point, op);
    /* Read without a lock while the dead writer's lock awaits recovery: old
     * or new, never a mix (a reader that keeps seeing an odd sequence takes
     * the lock, which recovers it). */
    expect_room(s, op, committed, have, have101, &before);
    /* Any locker recovers the stripe; the room reads the same after it. */
    assert_int_equal(kvc_room_sweep(s, NULL), KVC_OK);
    expect_room(s, op, committed, have, have101, &before);
    kvc_segment_stat(s, &sa);
    assert_int_equal(sa.lock_recoveries, sb.lock_recoveries + 1);
    assert_int_equal(sa.rooms_live, sb.rooms_live + (committed && op == OP_CREATE));
    assert_int_equal(sa.failures_total, sb.failures_total + (committed && op == OP_FAIL));
    kvc_close(s);
}

static void test_crash_inside_room_updates(void **st)
{
    (void)st;
    const char *name = tu_name();
    kvc_segment *s = open_seg(name, KVC_OPEN_FRESH, KVC_ROLE_WORKER, 128, NO_TTL_MS);
    assert_int_equal(kvc_room_open(s, 100, 2, 0, KVC_ROOM_ROLE_PREFILL), KVC_OK);
    assert_int_equal(kvc_room_open(s, 100, 2, 1, KVC_ROOM_ROLE_PREFILL), KVC_OK);
    /* Killed before the undo record is cleared: rolled back. */
    const char *points[] = {"room.undo_saved", "room.seq_odd", "room.half_written",
                            "room.before_commit"};
    for (int i = 0; i < 4; i++) {
        crash_room_op(name, points[i], OP_STATE, 0);
        crash_room_op(name, points[i], OP_CREATE, 0);
        crash_room_op(name, points[i], OP_RELEASE, 0);
        crash_room_op(name, points[i], OP_FAIL, 0);
    }
    crash_room_op(name, "room.state_written", OP_STATE, 0);
    crash_room_op(name, "room.creating", OP_CREATE, 0);
    crash_room_op(name, "room.index_written", OP_CREATE, 0);
    crash_room_op(name, "room.ring_claimed", OP_FAIL, 0);
    crash_room_op(name, "room.failure_half", OP_FAIL, 0);
    /* Killed after it (sequence still odd): the new room, whole. */
    crash_room_op(name, "room.committed", OP_STATE, 1);
    crash_room_op(name, "room.committed", OP_RELEASE, 1);
    crash_room_op(name, "room.committed", OP_CREATE, 1);
    crash_room_op(name, "room.committed", OP_FAIL, 1);
    /* After all that, updates still work. */
    int kept = 0;
    assert_int_equal(kvc_room_fail(s, 102, 1, 5, "real", &kept), KVC_OK);
    assert_int_equal(kept, 1);
    kvc_close(s);
    kvc_unlink(name);
}

/* A release that deletes room 7 (its only participant), its writer killed
 * at point: deleted is whether the room is gone afterwards.  Either way the
 * stripe reads the same before and after its recovery, the count agrees,
 * and the id opens, reads and deletes again as one room. */
static void crash_delete(const char *name, const char *point, int deleted)
{
    kvc_segment *s = open_seg(name, KVC_OPEN_ATTACH, KVC_ROLE_NONE, 0, 0);
    assert_int_equal(kvc_room_open(s, 7, 1, 0, KVC_ROOM_ROLE_PREFILL), KVC_OK);
    kvc_segment_info sb, sa;
    kvc_segment_stat(s, &sb);
    killed_inside(s, name, point, OP_DELETE);
    kvc_room_info ri;
    for (int pass = 0; pass < 2; pass++) { /* before the recovery, then after it */
        assert_int_equal(kvc_room_get(s, 7, 0, &ri), deleted ? KVC_E_NOENT : KVC_OK);
        if (!deleted)
            assert_int_equal(ri.released, 0);
        assert_int_equal(kvc_room_sweep(s, NULL), KVC_OK);
    }
    kvc_segment_stat(s, &sa);
    assert_int_equal(sa.lock_recoveries, sb.lock_recoveries + 1);
    assert_int_equal(sa.rooms_live, sb.rooms_live - (uint32_t)deleted);
    assert_int_equal(kvc_room_open(s, 7, 1, 0, KVC_ROOM_ROLE_PREFILL), KVC_OK);
    kvc_segment_stat(s, &sa);
    assert_int_equal(sa.rooms_live, sb.rooms_live);
    assert_int_equal(kvc_room_release(s, 7, 0), KVC_OK);
    assert_int_equal(kvc_room_get(s, 7, 0, &ri), KVC_E_NOENT);
    assert_null(kvc__room_find(s, 7));
    kvc_close(s);
}

static void test_crash_deleting_room(void **st)
{
    (void)st;
    const char *name = tu_name();
    kvc_segment *s = open_seg(name, KVC_OPEN_FRESH, KVC_ROLE_WORKER, 128, NO_TTL_MS);
    /* Rooms beside 7 in its stripe, so that its index entry has neighbours. */
    uint32_t s7 = kvc__room_stripe(kvc__room_hash(7));
    for (uint64_t id = 8, k = 0; k < 20; id++)
        if (kvc__room_stripe(kvc__room_hash(id)) == s7) {
            assert_int_equal(kvc_room_open(s, id, 1, 0, KVC_ROOM_ROLE_DECODE), KVC_OK);
            k++;
        }
    const char *kept[] = {"room.undo_saved", "room.seq_odd", "room.half_written",
                          "room.before_commit"};
    for (int i = 0; i < 4; i++)
        crash_delete(name, kept[i], 0);
    crash_delete(name, "room.committed", 1);
    crash_delete(name, "room.entry_tombed", 1);
    kvc_close(s);
    kvc_unlink(name);
}

/* ---- Failed rooms nobody joined: evicted for a new room ---------------- */

#define EVICT_MAX 16 /* below 32: every stripe holds the whole table */

/* Failures reported for ids nobody opened fill the table (max 16); a
 * worker's new room then evicts the oldest of them (its failure stays in
 * the ring), counted in rooms_evicted.  (The old code: KVC_E_FULL.) */
static void test_unjoined_failures_evicted(void **st)
{
    (void)st;
    const char *name = tu_name();
    kvc_segment *s = open_seg(name, KVC_OPEN_FRESH, KVC_ROLE_DAEMON, EVICT_MAX, NO_TTL_MS);
    for (uint64_t id = 1; id <= EVICT_MAX; id++) {
        assert_int_equal(kvc_room_fail(s, 1000 + id, 0, 5, "reported, never opened", NULL), KVC_OK);
        usleep(5000); /* distinct coarse stamps: oldest first is 1001 */
    }
    kvc_segment_info si;
    kvc_segment_stat(s, &si);
    assert_int_equal(si.rooms_live, EVICT_MAX);
    assert_int_equal(si.rooms_evicted, 0);
    pid_t child = fork();
    if (child == 0) {
        kvc_segment *c = open_seg(name, KVC_OPEN_ATTACH, KVC_ROLE_WORKER, 0, 0);
        _exit(c && kvc_room_open(c, 77, 2, 0, KVC_ROOM_ROLE_PREFILL) == KVC_OK ? 0 : 1);
    }
    assert_int_equal(tu_wait_exit(child), 0);
    kvc_segment_stat(s, &si);
    assert_int_equal(si.rooms_live, EVICT_MAX);
    assert_int_equal(si.rooms_evicted, 1);
    kvc_room_info ri;
    assert_int_equal(kvc_room_get(s, 1001, -1, &ri), KVC_E_NOENT); /* the oldest */
    assert_int_equal(kvc_room_get(s, 1002, -1, &ri), KVC_OK);
    assert_int_equal(ri.state, KVC_POLL_FAILED);
    /* Its failure is still in the node's ring. */
    kvc_failure_info f[EVICT_MAX + 1];
    size_t n = 0, found = 0;
    assert_int_equal(kvc_failures_recent(s, f, EVICT_MAX + 1, &n), KVC_OK);
    for (size_t i = 0; i < n; i++)
        found += f[i].room == 1001;
    assert_int_equal(found, 1);
    /* A late joiner of the evicted room sees its failure (from the ring);
     * its room takes the place of the next oldest (1002). */
    assert_int_equal(kvc_room_open(s, 1001, 0, 0, KVC_ROOM_ROLE_DECODE), KVC_OK);
    assert_int_equal(kvc_room_get(s, 1001, 0, &ri), KVC_OK);
    assert_int_equal(ri.state, KVC_POLL_FAILED);
    assert_non_null(strstr(ri.failure.reason, "reported, never opened"));
    assert_int_equal(kvc_room_get(s, 1002, -1, &ri), KVC_E_NOENT);
    /* A new report for a new id evicts the next oldest, not 507/FULL. */
    assert_int_equal(kvc_room_fail(s, 2000, 0, 5, "another", NULL), KVC_OK);
    assert_int_equal(kvc_room_get(s, 1003, -1, &ri), KVC_E_NOENT);
    kvc_segment_stat(s, &si);
    assert_int_equal(si.rooms_evicted, 3);
    kvc_close(s);
    kvc_unlink(name);
}

/* A Failed room someone joined is never evicted: a table of those stays
 * full (KVC_E_FULL), and only the one nobody joined goes. */
static void test_joined_failures_kept(void **st)
{
    (void)st;
    const char *name = tu_name();
    kvc_segment *s = open_seg(name, KVC_OPEN_FRESH, KVC_ROLE_WORKER, EVICT_MAX, NO_TTL_MS);
    for (uint64_t id = 1; id < EVICT_MAX; id++) {
        assert_int_equal(kvc_room_open(s, id, 2, 0, KVC_ROOM_ROLE_PREFILL), KVC_OK);
        assert_int_equal(kvc_room_fail(s, id, 0, 5, "joined, then failed", NULL), KVC_OK);
    }
    usleep(5000);
    assert_int_equal(kvc_room_fail(s, 500, 0, 5, "never opened, newest", NULL), KVC_OK);
    assert_int_equal(kvc_room_open(s, 600, 2, 0, KVC_ROOM_ROLE_PREFILL), KVC_OK);
    kvc_room_info ri;
    assert_int_equal(kvc_room_get(s, 500, -1, &ri), KVC_E_NOENT);
    for (uint64_t id = 1; id < EVICT_MAX; id++) {
        assert_int_equal(kvc_room_get(s, id, -1, &ri), KVC_OK);
        assert_int_equal(ri.state, KVC_POLL_FAILED);
    }
    assert_int_equal(kvc_room_open(s, 601, 2, 0, KVC_ROOM_ROLE_PREFILL), KVC_E_FULL);
    kvc_segment_info si;
    kvc_segment_stat(s, &si);
    assert_int_equal(si.rooms_evicted, 1);
    kvc_close(s);
    kvc_unlink(name);
}

/* A writer SIGKILLed inside an eviction: before its commit the evicted
 * room is back whole, after it the room is gone; either way the table
 * stays consistent and the next open succeeds. */
static void crash_evict(const char *point, int evicted)
{
    const char *name = tu_name();
    kvc_segment *s = open_seg(name, KVC_OPEN_FRESH, KVC_ROLE_DAEMON, EVICT_MAX, NO_TTL_MS);
    for (uint64_t id = 1; id <= EVICT_MAX; id++) {
        assert_int_equal(kvc_room_fail(s, 1000 + id, 0, 5, "never opened", NULL), KVC_OK);
        usleep(5000);
    }
    kvc_segment_info sb, sa;
    kvc_segment_stat(s, &sb);
    pid_t child = fork();
    if (child == 0) {
        kvc_segment *c = open_seg(name, KVC_OPEN_ATTACH, KVC_ROLE_NONE, 0, 0);
        target = point;
        kvc__test_set_inject(die_at);
        kvc_room_open(c, 77, 2, 0, KVC_ROOM_ROLE_PREFILL);
        _exit(3);
    }
    assert_int_equal(tu_wait_exit(child), TU_KILLED(SIGKILL));
    tu_owner_died(s, child);
    kvc_room_info ri;
    for (int pass = 0; pass < 2; pass++) { /* before the recovery, then after it */
        kvc_err e = kvc_room_get(s, 1001, -1, &ri);
        assert_int_equal(e, evicted ? KVC_E_NOENT : KVC_OK);
        if (!evicted) {
            assert_int_equal(ri.state, KVC_POLL_FAILED);
            assert_non_null(strstr(ri.failure.reason, "never opened"));
        }
        assert_int_equal(kvc_room_sweep(s, NULL), KVC_OK);
    }
    kvc_segment_stat(s, &sa);
    assert_int_equal(sa.lock_recoveries, sb.lock_recoveries + 1);
    assert_int_equal(sa.rooms_live, sb.rooms_live - (uint32_t)evicted);
    assert_int_equal(kvc_room_open(s, 77, 2, 0, KVC_ROOM_ROLE_PREFILL), KVC_OK);
    kvc_segment_stat(s, &sa);
    assert_int_equal(sa.rooms_live, EVICT_MAX);
    assert_int_equal(kvc_room_get(s, 77, 0, &ri), KVC_OK);
    assert_int_equal(kvc_room_get(s, 1001, -1, &ri), KVC_E_NOENT);
    kvc_close(s);
    kvc_unlink(name);
}

static void test_crash_evicting(void **st)
{
    (void)st;
    crash_evict("room.evicting", 0);
    crash_evict("room.entry_tombed", 1);
}

/* Two processes creating rooms of one stripe take slots of their own
 * parts of it (issue 30: a new room does not land on lines the other
 * process wrote), and a process whose part is full takes any free slot. */
static void test_rooms_land_in_own_part(void **st)
{
    (void)st;
    const char *name = tu_name();
    kvc_segment *s = open_seg(name, KVC_OPEN_FRESH, KVC_ROLE_WORKER, 4096, NO_TTL_MS);
    uint32_t n = s->hdr->stripe_slots, stripe = kvc__room_stripe(kvc__room_hash(1));
    uint64_t ids[64];
    size_t nid = 0;
    for (uint64_t id = 1; nid < 64; id++)
        if (kvc__room_stripe(kvc__room_hash(id)) == stripe)
            ids[nid++] = id;
    pid_t child = fork();
    if (child == 0) {
        kvc_segment *c = open_seg(name, KVC_OPEN_ATTACH, KVC_ROLE_WORKER, 0, 0);
        _exit(c && c->proc_slot != s->proc_slot && !kvc_room_open(c, ids[0], 2, 0, 0) ? 0 : 1);
    }
    assert_int_equal(tu_wait_exit(child), 0);
    kvc_room *theirs = kvc__room_find(s, ids[0]);
    assert_non_null(theirs);
    int32_t their_slot = theirs->part[0].proc_slot;
    assert_true(their_slot >= 0 && their_slot != s->proc_slot);
    kvc_room *t = s->rooms + (size_t)stripe * n;
    /* Each process's first room sits at the start of its part. */
    assert_int_equal(theirs - t, (uint64_t)(their_slot % KVC_ROOM_PARTS) * n / KVC_ROOM_PARTS);
    uint32_t lo = (uint32_t)((uint64_t)(s->proc_slot % KVC_ROOM_PARTS) * n / KVC_ROOM_PARTS),
             hi = (uint32_t)((uint64_t)(s->proc_slot % KVC_ROOM_PARTS + 1) * n / KVC_ROOM_PARTS);
    /* Ours fill our part, then go on past it; all found, none evicted. */
    for (size_t k = 1; k < nid; k++) {
        assert_int_equal(kvc_room_open(s, ids[k], 1, 0, KVC_ROOM_ROLE_DECODE), KVC_OK);
        kvc_room *r = kvc__room_find(s, ids[k]);
        assert_non_null(r);
        assert_ptr_not_equal(r, theirs);
        if (k <= hi - lo)
            assert_int_equal(r - t, lo + k - 1);
        else
            assert_false(r - t >= lo && r - t < hi);
    }
    for (size_t k = 0; k < nid; k++) {
        kvc_room_info ri;
        assert_int_equal(kvc_room_get(s, ids[k], 0, &ri), KVC_OK);
        assert_int_equal(ri.room, ids[k]);
    }
    kvc_close(s);
    kvc_unlink(name);
}

/* ---- load, capacity, TTL -------------------------------------------- */

static void test_load_full_and_ttl(void **st)
{
    (void)st;
    const char *name = tu_name();
    const uint32_t cap = 1000;
    kvc_segment *s = open_seg(name, KVC_OPEN_FRESH, KVC_ROLE_NONE, cap, 600000);
    uint64_t live[1000];
    size_t nlive = 0;
    srand(7);
    uint64_t next = 1;
    /* 90% load, then churn: delete and re-insert. */
    while (nlive < cap * 9 / 10) {
        uint64_t id = (((uint64_t)rand() << 31 ^ (uint64_t)rand()) * 2654435761u + next++) &
                      KVC_ROOM_ID_MAX; /* ids are 63-bit */
        assert_int_equal(kvc_room_open(s, id, 1, 0, KVC_ROOM_ROLE_DECODE), KVC_OK);
        live[nlive++] = id;
    }
    for (int round = 0; round < 5000; round++) {
        size_t k = (size_t)rand() % nlive;
        assert_int_equal(kvc_room_release(s, live[k], 0), KVC_OK);
        kvc_room_info ri;
        assert_int_equal(kvc_room_get(s, live[k], 0, &ri), KVC_E_NOENT);
        live[k] =
            (((uint64_t)rand() << 31 ^ (uint64_t)rand()) * 2654435761u + next++) & KVC_ROOM_ID_MAX;
        assert_int_equal(kvc_room_open(s, live[k], 1, 0, KVC_ROOM_ROLE_DECODE), KVC_OK);
    }
    for (size_t k = 0; k < nlive; k++) {
        kvc_room_info ri;
        assert_int_equal(kvc_room_get(s, live[k], 0, &ri), KVC_OK);
        assert_int_equal(ri.room, live[k]);
    }
    kvc_segment_info si;
    kvc_segment_stat(s, &si);
    assert_int_equal(si.rooms_live, nlive);
    /* Fill up: KVC_E_FULL, and no active room evicted. */
    while (nlive < cap) {
        live[nlive] = next++ * 0x9e3779b97f4a7c15ull & KVC_ROOM_ID_MAX;
        assert_int_equal(kvc_room_open(s, live[nlive], 1, 0, KVC_ROOM_ROLE_DECODE), KVC_OK);
        nlive++;
    }
    assert_int_equal(kvc_room_open(s, 0xfeedull, 1, 0, KVC_ROOM_ROLE_DECODE), KVC_E_FULL);
    assert_int_equal(kvc_room_fail(s, 0xfeedull, 0, 1, "x", NULL), KVC_E_FULL);
    for (size_t k = 0; k < nlive; k++) {
        kvc_room_info ri;
        assert_int_equal(kvc_room_get(s, live[k], 0, &ri), KVC_OK);
    }
    assert_int_equal(kvc_room_release(s, live[0], 0), KVC_OK);
    assert_int_equal(kvc_room_open(s, 0xfeedull, 1, 0, KVC_ROOM_ROLE_DECODE), KVC_OK);
    kvc_close(s);
    kvc_unlink(name);

    /* TTL: an idle room fails with a timeout, then is reclaimed. */
    name = tu_name();
    s = open_seg(name, KVC_OPEN_FRESH, KVC_ROLE_NONE, 4, 50);
    assert_int_equal(kvc_room_open(s, 1, 1, 0, KVC_ROOM_ROLE_DECODE), KVC_OK);
    assert_int_equal(kvc_room_open(s, 2, 1, 0, KVC_ROOM_ROLE_DECODE), KVC_OK);
    usleep(120000);
    kvc_room_info ri;
    assert_int_equal(kvc_room_get(s, 1, 0, &ri), KVC_OK);
    assert_int_equal(ri.state, KVC_POLL_FAILED);
    assert_int_equal(ri.failure.code, ETIMEDOUT);
    assert_non_null(strstr(ri.failure.reason, "timed out"));
    /* No rank failed it: the origin is no rank, another rank's for every rank. */
    assert_int_equal(ri.failure.origin_rank, KVC_ORIGIN_RANK_NONE);
    assert_int_equal(ri.failure.is_from_another_rank, 1);
    char text[KVC_REASON_MAX + 256];
    kvc_failure_text(&ri.failure, text, sizeof text);
    assert_non_null(strstr(text, "(timed out, no rank recorded it; code 110)"));
    assert_null(strstr(text, "on rank"));
    kvc_failure_info recent[4];
    size_t nrecent = 0;
    assert_int_equal(kvc_failures_recent(s, recent, 4, &nrecent), KVC_OK);
    assert_true(nrecent >= 1);
    assert_int_equal(recent[0].origin_rank, KVC_ORIGIN_RANK_NONE);
    /* Room 2 idled out; room 1's failure stays readable one more TTL. */
    size_t reclaimed = 0;
    assert_int_equal(kvc_room_sweep(s, &reclaimed), KVC_OK);
    assert_int_equal(reclaimed, 1);
    assert_int_equal(kvc_room_get(s, 2, 0, &ri), KVC_E_NOENT);
    assert_int_equal(kvc_room_get(s, 1, 0, &ri), KVC_OK);
    usleep(120000);
    assert_int_equal(kvc_room_sweep(s, &reclaimed), KVC_OK);
    assert_int_equal(reclaimed, 1);
    assert_int_equal(kvc_room_get(s, 1, 0, &ri), KVC_E_NOENT);
    /* A full table of expired rooms makes way for a new one. */
    for (uint64_t id = 10; id < 14; id++)
        assert_int_equal(kvc_room_open(s, id, 1, 0, KVC_ROOM_ROLE_DECODE), KVC_OK);
    assert_int_equal(kvc_room_open(s, 20, 1, 0, KVC_ROOM_ROLE_DECODE), KVC_E_FULL);
    usleep(120000);
    assert_int_equal(kvc_room_open(s, 20, 1, 0, KVC_ROOM_ROLE_DECODE), KVC_OK);
    kvc_close(s);
    kvc_unlink(name);
}

/* ---- randomised processes against a reference model ------------------ */

#define P 4
#define ROOMS 24
#define STEPS 400

struct outcome { /* what one process did to one room */
    int8_t final_state;
    int8_t failed_kept;
    int8_t failed_tried;
    int8_t pad;
};

static int random_proc(const char *name, uint32_t rank, int out_fd)
{
    kvc_segment *s = open_seg(name, KVC_OPEN_ATTACH, KVC_ROLE_WORKER, 0, 0);
    struct outcome oc[ROOMS];
    memset(oc, 0, sizeof oc);
    unsigned seed = 1234 + rank;
    for (int r = 0; r < ROOMS; r++)
        if (kvc_room_open(s, 1000 + (uint64_t)r, P, rank, KVC_ROOM_ROLE_PREFILL))
            return 20;
    for (int step = 0; step < STEPS; step++) {
        int r = rand_r(&seed) % ROOMS, what = rand_r(&seed) % 20;
        if (what == 0 && r % 3 == 0) {
            char reason[64];
            snprintf(reason, sizeof reason, "rank %u step %d", rank, step);
            int kept = 0;
            if (kvc_room_fail(s, 1000 + (uint64_t)r, rank, step, reason, &kept))
                return 21;
            oc[r].failed_tried = 1;
            oc[r].failed_kept |= (int8_t)kept;
        } else if (kvc_room_set_state(s, 1000 + (uint64_t)r, rank,
                                      (kvc_poll)(1 + rand_r(&seed) % 3))) {
            return 22;
        }
    }
    for (int r = 0; r < ROOMS; r++) { /* final write: 1..4 */
        oc[r].final_state = (int8_t)(1 + rand_r(&seed) % 4);
        if (r % 2)
            oc[r].final_state = KVC_POLL_SUCCESS;
        if (kvc_room_set_state(s, 1000 + (uint64_t)r, rank, (kvc_poll)oc[r].final_state))
            return 23;
    }
    if (write(out_fd, oc, sizeof oc) != (ssize_t)sizeof oc)
        return 24;
    return 0; /* exits without releasing: rooms stay for the check */
}

static void test_random_against_model(void **st)
{
    (void)st;
    const char *name = tu_name();
    kvc_segment *s = open_seg(name, KVC_OPEN_FRESH, KVC_ROLE_NONE, 256, 600000);
    int fds[P][2];
    pid_t pids[P];
    for (uint32_t p = 0; p < P; p++) {
        assert_int_equal(pipe(fds[p]), 0);
        if ((pids[p] = fork()) == 0)
            _exit(random_proc(name, p, fds[p][1]));
    }
    struct outcome oc[P][ROOMS];
    for (int p = 0; p < P; p++)
        assert_int_equal(read(fds[p][0], oc[p], sizeof oc[p]), sizeof oc[p]);
    for (int p = 0; p < P; p++)
        assert_int_equal(tu_wait_exit(pids[p]), 0);
    /* kvc_room_list does no liveness check, so the exited participants do
     * not fail the rooms being checked. */
    size_t count = 0;
    kvc_room_info all[ROOMS];
    assert_int_equal(kvc_room_list(s, -1, all, ROOMS, &count), KVC_OK);
    assert_int_equal(count, ROOMS);
    for (size_t i = 0; i < count; i++) {
        int r = (int)(all[i].room - 1000);
        int kept = 0, tried = 0, min = KVC_POLL_SUCCESS;
        for (int p = 0; p < P; p++) {
            kept += oc[p][r].failed_kept;
            tried += oc[p][r].failed_tried;
            if (oc[p][r].final_state < min)
                min = oc[p][r].final_state;
        }
        assert_true(kept <= 1); /* the first record wins, once */
        if (kept) {
            assert_int_equal(all[i].state, KVC_POLL_FAILED);
            assert_true(all[i].has_failure);
            int origin = (int)all[i].failure.origin_rank;
            assert_int_equal(oc[origin][r].failed_kept, 1);
        } else {
            /* No failure kept: none tried, or tried after Success. */
            assert_false(all[i].has_failure);
            if (tried)
                assert_int_equal(all[i].state, KVC_POLL_SUCCESS);
            else
                assert_int_equal(all[i].state, min);
        }
        for (int p = 0; p < P; p++)
            if (!kept)
                assert_int_equal(all[i].local[p], oc[p][r].final_state);
    }
    kvc_close(s);
    kvc_unlink(name);
}

/* The cluster-wide first failure replaces a different local one; the same
 * record again changes nothing; the rooms' epoch moves and wakes. */
static void test_fail_adopt(void **st)
{
    (void)st;
    const char *name = tu_name();
    kvc_segment *s = open_seg(name, KVC_OPEN_FRESH, KVC_ROLE_DAEMON, 128, NO_TTL_MS);
    uint32_t ep = kvc_room_epoch(s);
    assert_int_equal(kvc_room_wait_change(s, ep, 10), KVC_E_TIMEDOUT);
    int kept = 0, changed = 0;
    assert_int_equal(kvc_room_fail(s, 77, 1, 5, "local reason", &kept), KVC_OK);
    assert_int_equal(kept, 1);
    assert_int_equal(kvc_room_wait_change(s, ep, 10), KVC_OK);
    assert_int_equal(kvc_room_fail_adopt(s, 77, 3, 110, "node A: rank 3 timed out", 1234, &changed),
                     KVC_OK);
    assert_int_equal(changed, 1);
    kvc_room_info ri;
    assert_int_equal(kvc_room_get(s, 77, -1, &ri), KVC_OK);
    assert_int_equal(ri.state, KVC_POLL_FAILED);
    assert_int_equal(ri.failure.origin_rank, 3);
    assert_int_equal(ri.failure.code, 110);
    assert_int_equal(ri.failure.time_ns, 1234);
    assert_string_equal(ri.failure.reason, "node A: rank 3 timed out");
    assert_int_equal(kvc_room_fail_adopt(s, 77, 3, 110, "node A: rank 3 timed out", 99, &changed),
                     KVC_OK);
    assert_int_equal(changed, 0);
    /* a room this node never saw is created with the record */
    assert_int_equal(kvc_room_fail_adopt(s, 78, 0, 0, "remote", 0, &changed), KVC_OK);
    assert_int_equal(changed, 1);
    assert_int_equal(kvc_room_get(s, 78, 0, &ri), KVC_OK);
    assert_string_equal(ri.failure.reason, "remote");
    assert_int_equal(kvc_room_fail_adopt(s, 79, 128, 0, "x", 0, NULL), KVC_E_INVAL);
    kvc_close(s);
    kvc_unlink(name);
}

/* kvc_room_fail_mirror keeps a mirrored record's provenance (origin node,
 * rank, pid, code, reason, time) and marks it from another node: another
 * rank's failure for every rank here, the same rank number included, and
 * in the ring too.  kvc_segment_set_node names this node in the records
 * and reasons it writes. */
static void test_fail_mirror_provenance(void **st)
{
    (void)st;
    const char *name = tu_name();
    kvc_segment *s = open_seg(name, KVC_OPEN_FRESH, KVC_ROLE_DAEMON, 128, NO_TTL_MS);
    kvc_failure_info f;
    memset(&f, 0, sizeof f);
    f.room = 90;
    f.origin_rank = 1;
    f.origin_pid = 4242;
    f.code = 110;
    f.time_ns = 777;
    snprintf(f.reason, sizeof f.reason, "transfer to 10.0.0.7:17003 timed out");
    snprintf(f.origin_node, sizeof f.origin_node, "A");
    int changed = 0;
    assert_int_equal(kvc_room_fail_mirror(s, &f, &changed), KVC_OK);
    assert_int_equal(changed, 1);
    kvc_room_info ri;
    assert_int_equal(kvc_room_get(s, 90, 1, &ri), KVC_OK);
    assert_int_equal(ri.state, KVC_POLL_FAILED);
    assert_int_equal(ri.failure.origin_rank, 1);
    assert_int_equal(ri.failure.origin_pid, 4242);
    assert_int_equal(ri.failure.code, 110);
    assert_int_equal(ri.failure.time_ns, 777);
    assert_string_equal(ri.failure.origin_node, "A");
    assert_int_equal(ri.failure.from_another_node, 1);
    assert_int_equal(ri.failure.is_from_another_rank, 1); /* rank 1 here is not A's rank 1 */
    char text[512];
    kvc_failure_text(&ri.failure, text, sizeof text);
    assert_non_null(strstr(text, "rank 1 of node A (another node; code 110)"));
    kvc_failure_info ring[4];
    size_t n = 0;
    assert_int_equal(kvc_failures_recent(s, ring, 4, &n), KVC_OK);
    assert_true(n >= 1);
    assert_string_equal(ring[0].origin_node, "A");
    assert_int_equal(ring[0].from_another_node, 1);
    assert_int_equal(kvc_room_fail_mirror(s, &f, &changed), KVC_OK); /* the same: no change */
    assert_int_equal(changed, 0);
    snprintf(f.origin_node, sizeof f.origin_node, "bad/name");
    assert_int_equal(kvc_room_fail_mirror(s, &f, NULL), KVC_E_INVAL);
    f.origin_node[0] = '\0';
    assert_int_equal(kvc_room_fail_mirror(s, &f, NULL), KVC_E_INVAL);
    /* This node named: its own records carry the name, not marked. */
    assert_int_equal(kvc_segment_set_node(s, "bad name"), KVC_E_INVAL);
    assert_int_equal(kvc_segment_set_node(s, "B"), KVC_OK);
    assert_int_equal(kvc_room_fail(s, 91, 0, 5, "local", NULL), KVC_OK);
    assert_int_equal(kvc_room_get(s, 91, 0, &ri), KVC_OK);
    assert_string_equal(ri.failure.origin_node, "B");
    assert_int_equal(ri.failure.from_another_node, 0);
    assert_int_equal(ri.failure.is_from_another_rank, 0);
    assert_int_equal(kvc_segment_set_node(s, ""), KVC_OK);
    assert_int_equal(kvc_room_fail(s, 92, 0, 5, "local", NULL), KVC_OK);
    assert_int_equal(kvc_room_get(s, 92, 0, &ri), KVC_OK);
    assert_string_equal(ri.failure.origin_node, "");
    kvc_close(s);
    kvc_unlink(name);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_failure_seen_by_all_ranks),
        cmocka_unit_test(test_success_needs_all_and_is_sticky),
        cmocka_unit_test(test_dead_participant_fails_room),
        cmocka_unit_test(test_watched_liveness_from_marks),
        cmocka_unit_test(test_watcher_death_ends_trust),
        cmocka_unit_test(test_close_fails_unreleased_rooms),
        cmocka_unit_test(test_crash_inside_room_updates),
        cmocka_unit_test(test_crash_deleting_room),
        cmocka_unit_test(test_rooms_land_in_own_part),
        cmocka_unit_test(test_unjoined_failures_evicted),
        cmocka_unit_test(test_joined_failures_kept),
        cmocka_unit_test(test_crash_evicting),
        cmocka_unit_test(test_load_full_and_ttl),
        cmocka_unit_test(test_random_against_model),
        cmocka_unit_test(test_fail_adopt),
        cmocka_unit_test(test_fail_mirror_provenance),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
