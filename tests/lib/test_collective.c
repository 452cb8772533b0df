/* test_collective.c - kvc_allreduce_min() across real forked processes:
 * thousands of generations of random vectors checked against the MIN each
 * child computes itself, a rank SIGKILLed mid-call (at each point of the
 * call, and from outside while it waits elsewhere), a rank that never
 * arrives, mismatched lengths, group slots filled and reclaimed. */
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/wait.h>

#include "testutil.h"
#include "internal.h"
#include "tu_proc.h"
#include "tu_robust.h"

#define LONG_WAIT_MS 60000u /* hang guard: never expected to run out */

/* ---- helpers ------------------------------------------------------------ */

/* Attach as a client.  The segment's locks wait up to the hang guard, not
 * the 2 s default: eight children attaching at once on a loaded machine
 * (load 46 in a fresh-machine run) waited out 2 s on the process table.
 * A failure is said on stderr, since callers are forked children. */
static kvc_segment *open_client(const char *name)
{
    kvc_options o;
    kvc_options_init(&o);
    o.name = name;
    o.role = KVC_ROLE_CLIENT;
    o.lock_timeout_ms = LONG_WAIT_MS;
    kvc_segment *s = NULL;
    kvc_err e = kvc_open(&o, &s);
    if (e)
        fprintf(stderr, "pid %d: kvc_open(%s): %s: %s\n", (int)getpid(), name, kvc_strerror(e),
                kvc_last_error());
    return e ? NULL : s;
}

static uint64_t mix(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* Rank r's input of step `step`: every child derives every rank's vector
 * from the shared seed.  Half the steps use KVPoll-like values 0..4 (many
 * ties), half any byte. */
static void input(uint64_t seed, uint64_t step, uint32_t r, uint8_t *v, size_t len)
{
    uint64_t x = mix(seed ^ mix(step * 1000003u + r));
    unsigned mod = (step & 1) ? 5 : 256;
    for (size_t i = 0; i < len; i++) {
        if (i % 8 == 0)
            x = mix(x);
        v[i] = (uint8_t)((x >> (8 * (i % 8))) % mod);
    }
}

/* The length of step `step`'s vectors: some inside one round, some over
 * several (KVC_COLL_CHUNK bytes each), sometimes none. */
static size_t step_len(uint64_t seed, uint64_t step)
{
    static const size_t lens[] = {64, 1, 0, 64, 511, 512, 513, 64, 1500, 3000, 7, 64};
    return lens[mix(seed + step) % (sizeof lens / sizeof *lens)];
}

/* The MIN of every rank's step input, computed here (not by the library). */
static void expected(uint64_t seed, uint64_t step, uint32_t size, uint8_t *out, size_t len)
{
    uint8_t tmp[4096];
    memset(out, 0xff, len);
    for (uint32_t r = 0; r < size; r++) {
        input(seed, step, r, tmp, len);
        for (size_t i = 0; i < len; i++)
            out[i] = tmp[i] < out[i] ? tmp[i] : out[i];
    }
}

/* Run steps [from, to) of group `group` as rank; returns the count of
 * wrong results, or -1 - the failing step on an error (message on
 * stderr). */
static long run_steps(kvc_segment *s, uint64_t group, uint32_t size, uint32_t rank, uint64_t seed,
                      uint64_t from, uint64_t to)
{
    uint8_t v[4096], want[4096];
    long wrong = 0;
    for (uint64_t k = from; k < to; k++) {
        size_t len = step_len(seed, k);
        input(seed, k, rank, v, len);
        kvc_err e = kvc_allreduce_min(s, group, size, rank, v, len, LONG_WAIT_MS);
        if (e) {
            fprintf(stderr, "rank %u step %llu: %s: %s\n", rank, (unsigned long long)k,
                    kvc_strerror(e), kvc_last_error());
            return -1 - (long)k;
        }
        expected(seed, k, size, want, len);
        wrong += len && memcmp(v, want, len) != 0;
    }
    return wrong;
}

static void close_unlink(kvc_segment *s, const char *name)
{
    kvc_close(s);
    kvc_unlink(name);
}

/* ---- equality with the independently computed MIN ----------------------- */

static int random_child(const char *name, uint32_t size, uint32_t rank, uint64_t steps)
{
    kvc_segment *s = open_client(name);
    if (!s)
        return 10;
    long r = run_steps(s, 0x5eed0000u + size, size, rank, 42 + size, 0, steps);
    kvc_close(s);
    if (r < 0)
        return 11;
    return r > 0 ? 12 : 0;
}

static void random_steps(uint32_t size, uint64_t steps)
{
    const char *name = tu_name();
    kvc_segment *s = tu_open(name, KVC_OPEN_FRESH, KVC_ROLE_CLIENT);
    pid_t pids[8];
    for (uint32_t r = 0; r < size; r++)
        if ((pids[r] = fork()) == 0)
            _exit(random_child(name, size, r, steps));
    for (uint32_t r = 0; r < size; r++)
        assert_int_equal(tu_wait_exit(pids[r]), 0);
    close_unlink(s, name);
}

static void test_random_2(void **st)
{
    (void)st;
    random_steps(2, 4000);
}
static void test_random_4(void **st)
{
    (void)st;
    random_steps(4, 2500);
}
static void test_random_8(void **st)
{
    (void)st;
    random_steps(8, 1500);
}

/* ---- bad calls (one process) -------------------------------------------- */

static void test_bad_calls(void **st)
{
    (void)st;
    const char *name = tu_name();
    kvc_segment *s = tu_open(name, KVC_OPEN_FRESH, KVC_ROLE_CLIENT);
    uint8_t v[4] = {9, 8, 7, 6};
    assert_int_equal(kvc_allreduce_min(NULL, 1, 1, 0, v, 4, 10), KVC_E_INVAL);
    assert_int_equal(kvc_allreduce_min(s, 1, 1, 0, NULL, 4, 10), KVC_E_INVAL);
    assert_int_equal(kvc_allreduce_min(s, 1, 0, 0, v, 4, 10), KVC_E_INVAL);
    assert_non_null(strstr(kvc_last_error(), "size 0 out of range 1..64"));
    assert_int_equal(kvc_allreduce_min(s, 1, 65, 0, v, 4, 10), KVC_E_INVAL);
    assert_int_equal(kvc_allreduce_min(s, 1, 2, 2, v, 4, 10), KVC_E_INVAL);
    assert_non_null(strstr(kvc_last_error(), "rank 2 out of range 0..1"));
    /* A group of one is its own MIN, at once; len 0 is a barrier. */
    assert_int_equal(kvc_allreduce_min(s, 1, 1, 0, v, 4, 10), KVC_OK);
    assert_int_equal(v[0], 9);
    assert_int_equal(v[3], 6);
    assert_int_equal(kvc_allreduce_min(s, 1, 1, 0, NULL, 0, 10), KVC_OK);
    /* Another size for an existing group. */
    assert_int_equal(kvc_allreduce_min(s, 1, 2, 0, v, 4, 10), KVC_E_INVAL);
    assert_non_null(strstr(kvc_last_error(),
                           "called with size 2, the group's ranks with size 1: a size mismatch"));
    /* The _ex form zeroes *why on anything but a peer failure. */
    kvc_coll_failure why;
    memset(&why, 0x5a, sizeof why);
    assert_int_equal(kvc_allreduce_min_ex(s, 1, 1, 0, v, 4, 10, &why), KVC_OK);
    assert_int_equal(why.ranks, 0);
    assert_int_equal(why.group, 0);
    /* Another handle of the same process may call as the same rank: the
     * rank is the process's. */
    kvc_segment *other = tu_open(name, KVC_OPEN_ATTACH, KVC_ROLE_CLIENT);
    assert_int_equal(kvc_allreduce_min(other, 1, 1, 0, v, 4, 10), KVC_OK);
    assert_int_equal(kvc_allreduce_min(s, 1, 1, 0, v, 4, 10), KVC_OK);
    kvc_close(other);
    assert_int_equal(kvc_allreduce_min(s, 1, 1, 0, v, 4, 10), KVC_OK);
    /* A handle with no process table entry cannot take part. */
    kvc_segment *none = tu_open(name, KVC_OPEN_ATTACH, KVC_ROLE_NONE);
    assert_int_equal(kvc_allreduce_min(none, 1, 1, 0, v, 4, 10), KVC_E_INVAL);
    assert_non_null(strstr(kvc_last_error(), "no process table entry"));
    kvc_close(none);
    /* A handle inherited across fork() is refused in the child. */
    pid_t pid = fork();
    if (pid == 0)
        _exit(kvc_allreduce_min(s, 1, 1, 0, v, 4, 10) == KVC_E_INVAL &&
                      strstr(kvc_last_error(), "inherited across fork()")
                  ? 0
                  : 1);
    assert_int_equal(tu_wait_exit(pid), 0);
    close_unlink(s, name);
}

/* A rank held by another live process is refused. */
static void test_rank_held(void **st)
{
    (void)st;
    const char *name = tu_name();
    kvc_segment *s = tu_open(name, KVC_OPEN_FRESH, KVC_ROLE_CLIENT);
    int ready[2], go[2];
    assert_int_equal(pipe(ready), 0);
    assert_int_equal(pipe(go), 0);
    pid_t pid = fork();
    if (pid == 0) {
        close(go[1]);
        kvc_segment *c = open_client(name);
        uint8_t v[1] = {1};
        /* rank 0 of a group of 2 whose rank 1 never comes: claims rank 0 */
        kvc_err e = kvc_allreduce_min(c, 77, 2, 0, v, 1, 1);
        char x;
        (void)!write(ready[1], "r", 1);
        (void)!read(go[0], &x, 1);
        kvc_close(c);
        _exit(e == KVC_E_TIMEDOUT ? 0 : 1);
    }
    close(go[0]);
    close(ready[1]);
    char x;
    assert_int_equal(read(ready[0], &x, 1), 1);
    close(ready[0]);
    uint8_t v[1] = {1};
    assert_int_equal(kvc_allreduce_min(s, 77, 2, 0, v, 1, 10), KVC_E_INVAL);
    assert_non_null(strstr(kvc_last_error(), "rank 0 of group 0x4d is held by another live"));
    close(go[1]);
    assert_int_equal(tu_wait_exit(pid), 0);
    /* Its holder left: the rank is free to take (the round it waits in
     * is rank 1's, which does not come: timeout). */
    assert_int_equal(kvc_allreduce_min(s, 77, 2, 0, v, 1, 10), KVC_E_TIMEDOUT);
    close_unlink(s, name);
}

/* ---- mismatched lengths -------------------------------------------------- */

static int mismatch_child(const char *name, uint32_t rank, size_t len)
{
    kvc_segment *s = open_client(name);
    uint8_t v[700];
    memset(v, (int)(10 + rank), sizeof v);
    kvc_err e = kvc_allreduce_min(s, 9, 2, rank, v, len, LONG_WAIT_MS);
    int bad = 0;
    if (e != KVC_E_INVAL || !strstr(kvc_last_error(), "rank 1 of group 0x9 called with len"))
        bad |= 1;
    if (!strstr(kvc_last_error(), "rank 0 with len"))
        bad |= 2;
    if (v[0] != 10 + rank) /* unchanged on failure */
        bad |= 4;
    /* The group goes on: the next call, with equal lengths, works. */
    e = kvc_allreduce_min(s, 9, 2, rank, v, 64, LONG_WAIT_MS);
    if (e || v[0] != 10)
        bad |= 8;
    if (run_steps(s, 9, 2, rank, 5, 0, 200) != 0)
        bad |= 16;
    kvc_close(s);
    return bad;
}

static void test_len_mismatch(void **st)
{
    (void)st;
    static const size_t lens[][2] = {{64, 32}, {600, 64}, {0, 1}};
    for (size_t t = 0; t < sizeof lens / sizeof *lens; t++) {
        const char *name = tu_name();
        kvc_segment *s = tu_open(name, KVC_OPEN_FRESH, KVC_ROLE_CLIENT);
        pid_t a = fork();
        if (a == 0)
            _exit(mismatch_child(name, 0, lens[t][0]));
        pid_t b = fork();
        if (b == 0)
            _exit(mismatch_child(name, 1, lens[t][1]));
        assert_int_equal(tu_wait_exit(a), 0);
        assert_int_equal(tu_wait_exit(b), 0);
        close_unlink(s, name);
    }
}

/* ---- a rank that never arrives ------------------------------------------- */

/* Ranks 0 and 1 call with a short timeout while rank 2 is held back; they
 * fail naming rank 2; then rank 2 is let go: its call at the abandoned
 * generation fails at once, and from then on all three agree again. */
static int late_child(const char *name, uint32_t rank, int report_fd, int go_fd)
{
    kvc_segment *s = open_client(name);
    if (!s)
        return 10;
    uint8_t v[64];
    memset(v, 1, sizeof v);
    int bad = 0;
    if (rank < 2) {
        /* Both enter the timed call together (a barrier of their own), so
         * that only rank 2 is missing when the first one's time runs out. */
        if (kvc_allreduce_min(s, 0xba77, 2, rank, NULL, 0, LONG_WAIT_MS))
            bad |= 64;
        kvc_coll_failure why;
        kvc_err e = kvc_allreduce_min_ex(s, 0x1a7e, 3, rank, v, sizeof v, 1000, &why);
        if (e != KVC_E_TIMEDOUT ||
            !strstr(kvc_last_error(), "rank 2 of group 0x1a7e did not arrive within 1000 ms"))
            bad |= 1;
        if (why.ranks != 1u << 2 || why.dead || why.timeout_ms != 1000 || why.group != 0x1a7e)
            bad |= 2;
        if (v[0] != 1)
            bad |= 4;
        fprintf(stderr, "rank %u: %s\n", rank, kvc_last_error());
        (void)!write(report_fd, "f", 1);
    } else {
        char x;
        (void)!read(go_fd, &x, 1); /* the parent closes it once 0 and 1 failed */
        kvc_coll_failure why;
        kvc_err e = kvc_allreduce_min_ex(s, 0x1a7e, 3, rank, v, sizeof v, LONG_WAIT_MS, &why);
        fprintf(stderr, "rank %u: %s\n", rank, kvc_last_error());
        if (e != KVC_E_TIMEDOUT || !strstr(kvc_last_error(), "arrived after its peers gave up"))
            bad |= 8;
        if (!(why.ranks & 1u << 2))
            bad |= 16;
    }
    if (run_steps(s, 0x1a7e, 3, rank, 11, 0, 300) != 0)
        bad |= 32;
    kvc_close(s);
    return bad;
}

static void test_never_arrives(void **st)
{
    (void)st;
    const char *name = tu_name();
    kvc_segment *s = tu_open(name, KVC_OPEN_FRESH, KVC_ROLE_CLIENT);
    int ready, go;
    pid_t pids[3];
    tu_fork_gated(name, 3, late_child, pids, &ready, &go);
    char x;
    assert_int_equal(read(ready, &x, 1), 1);
    assert_int_equal(read(ready, &x, 1), 1);
    close(go);
    close(ready);
    for (uint32_t r = 0; r < 3; r++)
        assert_int_equal(tu_wait_exit(pids[r]), 0);
    close_unlink(s, name);
}

/* Rank 1 of test_stopped_rank_named: takes its rank, reports, waits. */
static int joined_child(const char *name, uint32_t rank, int ready_fd, int go_fd)
{
    (void)rank;
    kvc_segment *c = open_client(name);
    if (kvc_coll_join(c, 0x1b0, 2, 1) != KVC_OK)
        return 1;
    char x;
    (void)!write(ready_fd, "r", 1);
    (void)!read(go_fd, &x, 1);
    kvc_close(c);
    return 0;
}

/* A rank that does not arrive because its process is stopped (SIGSTOP) is
 * named as stopped, not only as late.  (Skipped under qemu-user, whose
 * processes record a start time that /proc/PID/stat does not show: the
 * check of the entry's start time then says nothing, as it should.) */
static void test_stopped_rank_named(void **st)
{
    (void)st;
    TU_SKIP_UNLESS(tu_probe_self_stat());
    const char *name = tu_name();
    kvc_segment *s = tu_open(name, KVC_OPEN_FRESH, KVC_ROLE_CLIENT);
    int ready, go;
    pid_t pid;
    /* one child, as rank 1: tu_fork_gated's rank 0 runs joined_child */
    tu_fork_gated(name, 1, joined_child, &pid, &ready, &go);
    char x;
    assert_int_equal(read(ready, &x, 1), 1);
    assert_int_equal(kill(pid, SIGSTOP), 0);
    int status;
    assert_int_equal(waitpid(pid, &status, WUNTRACED), pid);
    assert_true(WIFSTOPPED(status));
    uint8_t v[1] = {3};
    assert_int_equal(kvc_allreduce_min(s, 0x1b0, 2, 0, v, 1, 200), KVC_E_TIMEDOUT);
    char want[96];
    snprintf(want, sizeof want, "rank 1: its process %d is stopped (state T", (int)pid);
    if (!strstr(kvc_last_error(), "rank 1 of group 0x1b0 did not arrive within 200 ms") ||
        !strstr(kvc_last_error(), want))
        fail_msg("%s", kvc_last_error());
    assert_int_equal(kill(pid, SIGCONT), 0);
    close(go);
    close(ready);
    assert_int_equal(tu_wait_exit(pid), 0);
    close_unlink(s, name);
}

/* ---- a rank SIGKILLed mid-call -------------------------------------------- */

#define KILL_SIZE 4
#define KILL_RANK 3
#define KILL_STEP 50
static const char *kill_point;

static void die_at(const char *point)
{
    if (kill_point && !strcmp(point, kill_point))
        raise(SIGKILL);
}

/* Calls of an epoch broken by rank 3's death: each fails at once, naming
 * it.  Returns a bit mask of problems. */
static int broken_calls(kvc_segment *s, uint64_t group, uint32_t rank, int calls)
{
    uint8_t v[64];
    for (int i = 0; i < calls; i++) {
        memset(v, (int)(100 + rank), sizeof v);
        kvc_coll_failure why;
        kvc_err e =
            kvc_allreduce_min_ex(s, group, KILL_SIZE, rank, v, sizeof v, LONG_WAIT_MS, &why);
        if (e != KVC_E_PEER || why.ranks != 1u << KILL_RANK || !why.dead ||
            !strstr(kvc_last_error(), "rank 3 of group") ||
            !strstr(kvc_last_error(), "re-formed once all its ranks died or left") ||
            v[0] != 100 + rank) {
            fprintf(stderr, "rank %u: unexpected %s: %s\n", rank, kvc_strerror(e),
                    kvc_last_error());
            return 1;
        }
    }
    return 0;
}

static int kill_child(const char *name, uint64_t group, uint32_t rank, int external, int ready_fd,
                      int go_fd)
{
    kvc_segment *s = open_client(name);
    if (!s)
        return 10;
    if (run_steps(s, group, KILL_SIZE, rank, 7, 0, KILL_STEP) != 0)
        return 11;
    if (rank == KILL_RANK) {
        if (external) { /* stopped outside any call; the parent kills it */
            (void)!write(ready_fd, "k", 1);
            for (;;)
                pause();
        }
        kvc__test_set_inject(die_at);
        run_steps(s, group, KILL_SIZE, rank, 7, KILL_STEP, KILL_STEP + 10);
        return 12; /* not reached: killed at the point */
    }
    /* The others: the step at which rank 3 dies fails, naming it (unless
     * it died after arriving and the round completed: then the next one). */
    uint8_t v[4096], want[4096];
    int saw_peer = 0, bad = 0;
    for (uint64_t k = KILL_STEP; k < KILL_STEP + 10; k++) {
        size_t len = step_len(7, k);
        input(7, k, rank, v, len);
        kvc_coll_failure why;
        kvc_err e = kvc_allreduce_min_ex(s, group, KILL_SIZE, rank, v, len, LONG_WAIT_MS, &why);
        if (e == KVC_OK) {
            expected(7, k, KILL_SIZE, want, len);
            if (len && memcmp(v, want, len))
                bad |= 32;
            continue;
        }
        if (e != KVC_E_PEER || why.ranks != 1u << KILL_RANK || !why.dead ||
            !strstr(kvc_last_error(), "rank 3 of group") || !strstr(kvc_last_error(), "died")) {
            fprintf(stderr, "rank %u: unexpected %s: %s\n", rank, kvc_strerror(e),
                    kvc_last_error());
            bad |= 64;
        }
        saw_peer = 1;
        break;
    }
    if (!saw_peer)
        bad |= 128;
    /* The epoch is broken: every later call fails at once, naming rank 3
     * (none pairs with a call of another count). */
    bad |= broken_calls(s, group, rank, 20) << 8;
    (void)!write(ready_fd, "f", 1); /* the parent tries a new rank 3 */
    char x;
    (void)!read(go_fd, &x, 1); /* EOF: it did; still broken, then leave */
    bad |= broken_calls(s, group, rank, 3) << 9;
    kvc_close(s);
    return bad;
}

/* A new process for rank 3 while ranks 0-2 of the old epoch live: a clear
 * error naming rank 3 and the live ones, not a place among them; a new
 * process for a rank still held is refused too. */
static int replacement_child(const char *name, uint64_t group)
{
    kvc_segment *s = open_client(name);
    if (!s)
        return 10;
    uint8_t v[64];
    memset(v, 7, sizeof v);
    kvc_coll_failure why;
    int bad = 0;
    kvc_err e = kvc_allreduce_min_ex(s, group, KILL_SIZE, KILL_RANK, v, sizeof v, 100, &why);
    fprintf(stderr, "replacement: %s\n", kvc_last_error());
    if (e != KVC_E_PEER || !strstr(kvc_last_error(), "rank 3 of group") ||
        !strstr(kvc_last_error(), "cannot be joined") ||
        !strstr(kvc_last_error(), "ranks 0, 1, 2 still live") || why.ranks != 1u << KILL_RANK ||
        !why.dead || v[0] != 7)
        bad |= 1;
    e = kvc_allreduce_min(s, group, KILL_SIZE, 0, v, sizeof v, 100);
    if (e != KVC_E_INVAL || !strstr(kvc_last_error(), "held by another live process"))
        bad |= 2;
    kvc_close(s);
    return bad;
}

/* A whole new set of processes once the old ones left: a new epoch. */
static int new_epoch_child(const char *name, uint64_t group, uint32_t size, uint32_t rank,
                           uint64_t seed, uint64_t steps)
{
    kvc_segment *s = open_client(name);
    if (!s)
        return 10;
    long r = run_steps(s, group, size, rank, seed, 0, steps);
    kvc_close(s);
    return r < 0 ? 11 : r > 0 ? 12 : 0;
}

/* Another group of two processes running all along: never disturbed. */
static int bystander_child(const char *name, uint32_t rank, int stop_fd)
{
    kvc_segment *s = open_client(name);
    if (!s)
        return 10;
    uint64_t k = 0;
    for (;;) {
        long r = run_steps(s, 0xb0b, 2, rank, 3, k, k + 20);
        if (r)
            return 11;
        k += 20;
        /* Stop once told, at a step both agree on (each reads the pipe
         * at its own pace: the MIN of their answers decides). */
        char x;
        uint8_t go = read(stop_fd, &x, 1) != 0; /* 0: EOF, the parent closed it */
        if (kvc_allreduce_min(s, 0xb0b, 2, rank, &go, 1, LONG_WAIT_MS))
            return 12;
        if (!go)
            break;
    }
    kvc_close(s);
    return 0;
}

static void kill_at(const char *point, int external)
{
    const char *name = tu_name();
    kvc_segment *s = tu_open(name, KVC_OPEN_FRESH, KVC_ROLE_CLIENT);
    uint64_t group = 0xdead0000u + (uint64_t)(point ? strlen(point) : 99);
    int rep[2], stop[2], go[2];
    assert_int_equal(pipe(rep), 0);
    assert_int_equal(pipe(stop), 0);
    assert_int_equal(pipe(go), 0);
    pid_t by[2];
    for (uint32_t r = 0; r < 2; r++)
        if ((by[r] = fork()) == 0) {
            close(stop[1]);
            close(go[1]); /* the old ranks wait for its EOF */
            fcntl(stop[0], F_SETFL, O_NONBLOCK);
            _exit(bystander_child(name, r, stop[0]));
        }
    close(stop[0]);
    kill_point = point;
    pid_t pids[KILL_SIZE];
    for (uint32_t r = 0; r < KILL_SIZE; r++)
        if ((pids[r] = fork()) == 0) {
            close(go[1]);
            _exit(kill_child(name, group, r, external, rep[1], go[0]));
        }
    close(rep[1]); /* a child that dies before reporting ends the read */
    close(go[0]);
    char x;
    if (external) {
        assert_int_equal(read(rep[0], &x, 1), 1);
        kill(pids[KILL_RANK], SIGKILL);
    }
    assert_int_equal(tu_wait_exit(pids[KILL_RANK]), 128 + SIGKILL);
    for (int i = 0; i < KILL_SIZE - 1; i++)
        assert_int_equal(read(rep[0], &x, 1), 1);
    close(rep[0]);
    pid_t rp = fork();
    if (rp == 0)
        _exit(replacement_child(name, group));
    assert_int_equal(tu_wait_exit(rp), 0);
    close(go[1]); /* the old ranks leave */
    for (uint32_t r = 0; r < KILL_SIZE - 1; r++)
        assert_int_equal(tu_wait_exit(pids[r]), 0);
    /* Now none of the old epoch lives: new processes re-form the group (of
     * another size, even) and agree from their first call on. */
    pid_t fresh[KILL_SIZE - 1];
    for (uint32_t r = 0; r < KILL_SIZE - 1; r++)
        if ((fresh[r] = fork()) == 0)
            _exit(new_epoch_child(name, group, KILL_SIZE - 1, r, 9, 500));
    for (uint32_t r = 0; r < KILL_SIZE - 1; r++)
        assert_int_equal(tu_wait_exit(fresh[r]), 0);
    close(stop[1]);
    for (uint32_t r = 0; r < 2; r++)
        assert_int_equal(tu_wait_exit(by[r]), 0);
    close_unlink(s, name);
}

static void test_kill_published(void **st)
{
    (void)st;
    kill_at("coll.published", 0);
}
static void test_kill_arrived(void **st)
{
    (void)st;
    kill_at("coll.arrived", 0);
}
static void test_kill_reduced(void **st)
{
    (void)st;
    kill_at("coll.reduced", 0);
}
static void test_kill_outside(void **st)
{
    (void)st;
    kill_at(NULL, 1);
}

/* A whole group is SIGKILLed between calls; new processes for every rank
 * re-form it (none of the old epoch lives), and their very first call
 * succeeds. */
static int restart_child(const char *name, uint32_t rank, uint64_t from, int ready_fd)
{
    kvc_segment *s = open_client(name);
    if (!s)
        return 10;
    if (run_steps(s, 0x4e57, 3, rank, 21, from, from + 40) != 0)
        return 11;
    if (ready_fd >= 0) { /* the first incarnation: wait here to be killed */
        (void)!write(ready_fd, "k", 1);
        for (;;)
            pause();
    }
    kvc_close(s);
    return 0;
}

static void test_whole_group_restarted(void **st)
{
    (void)st;
    const char *name = tu_name();
    kvc_segment *s = tu_open(name, KVC_OPEN_FRESH, KVC_ROLE_CLIENT);
    int rep[2];
    assert_int_equal(pipe(rep), 0);
    pid_t old[3];
    for (uint32_t r = 0; r < 3; r++)
        if ((old[r] = fork()) == 0)
            _exit(restart_child(name, r, 0, rep[1]));
    close(rep[1]);
    char x;
    for (int i = 0; i < 3; i++)
        assert_int_equal(read(rep[0], &x, 1), 1);
    close(rep[0]);
    for (uint32_t r = 0; r < 3; r++) {
        kill(old[r], SIGKILL);
        assert_int_equal(tu_wait_exit(old[r]), 128 + SIGKILL);
    }
    /* The first new one to call re-forms the group; the others join its
     * epoch at generation 0 and meet it there. */
    pid_t fresh[3];
    for (uint32_t r = 0; r < 3; r++)
        if ((fresh[r] = fork()) == 0)
            _exit(restart_child(name, r, 100, -1));
    for (uint32_t r = 0; r < 3; r++)
        assert_int_equal(tu_wait_exit(fresh[r]), 0);
    close_unlink(s, name);
}

/* ---- a group id reused by new processes (epochs) ------------------------- */

/* Steps of group 0x4e58 until killed: a byte on ready_fd after the first
 * 50 verified steps; a wrong MIN exits 12 at once (the parent sees it
 * instead of SIGKILL).  A peer failure is expected (the parent kills the
 * members one by one): then it waits to be killed. */
static int doomed_child(const char *name, uint32_t size, uint32_t rank, uint64_t seed, int ready_fd)
{
    kvc_segment *s = open_client(name);
    if (!s)
        return 10;
    for (uint64_t k = 0;; k++) {
        long r = run_steps(s, 0x4e58, size, rank, seed, k, k + 1);
        if (r > 0)
            return 12;
        if (r < 0)
            break;
        if (k == 50)
            (void)!write(ready_fd, "r", 1);
    }
    for (;;)
        pause();
}

/* The whole group is SIGKILLed at a random moment of its calls (members
 * asleep in the futex, inside a round, between calls), several times;
 * each new set of processes (another size each time) re-forms the group
 * and gets the right MIN from its first call, and the last one for
 * thousands of random steps. */
static void test_whole_group_killed_reused(void **st)
{
    (void)st;
    const char *name = tu_name();
    kvc_segment *s = tu_open(name, KVC_OPEN_FRESH, KVC_ROLE_CLIENT);
    static const uint32_t sizes[] = {3, 2, 4, 2, 3};
    for (uint32_t t = 0; t < sizeof sizes / sizeof *sizes; t++) {
        uint32_t size = sizes[t];
        int rep[2];
        assert_int_equal(pipe(rep), 0);
        pid_t pids[4];
        for (uint32_t r = 0; r < size; r++)
            if ((pids[r] = fork()) == 0) {
                close(rep[0]);
                _exit(doomed_child(name, size, r, 100 + t, rep[1]));
            }
        close(rep[1]);
        char x;
        for (uint32_t r = 0; r < size; r++)
            assert_int_equal(read(rep[0], &x, 1), 1);
        close(rep[0]);
        usleep((useconds_t)(mix(t) % 3000));
        for (uint32_t r = 0; r < size; r++)
            kill(pids[r], SIGKILL);
        for (uint32_t r = 0; r < size; r++)
            assert_int_equal(tu_wait_exit(pids[r]), 128 + SIGKILL);
    }
    /* The last set starts one after the other: the first waits in the new
     * epoch's generation 0 for the others. */
    pid_t fresh[3];
    for (uint32_t r = 0; r < 3; r++) {
        if ((fresh[r] = fork()) == 0)
            _exit(new_epoch_child(name, 0x4e58, 3, r, 77, 3000));
        usleep(20000);
    }
    for (uint32_t r = 0; r < 3; r++)
        assert_int_equal(tu_wait_exit(fresh[r]), 0);
    close_unlink(s, name);
}

/* Rank 1 of an old group of 2 closes its segment after 100 steps while
 * rank 0 goes on: rank 0's calls fail naming it ("left"), a new rank 1 is
 * refused while rank 0 lives; once rank 0 closed too, a new set of 3
 * processes re-forms the group and agrees for 2,000 random steps. */
static int leaver_child(const char *name, uint32_t rank, int ready_fd, int go_fd)
{
    kvc_segment *s = open_client(name);
    if (!s)
        return 10;
    if (run_steps(s, 0x4e59, 2, rank, 5, 0, 100) != 0)
        return 11;
    if (rank == 1) {
        kvc_close(s);
        return 0;
    }
    int bad = 0;
    for (int i = 0; i < 5; i++) {
        uint8_t v[8] = {1};
        kvc_coll_failure why;
        kvc_err e = kvc_allreduce_min_ex(s, 0x4e59, 2, 0, v, sizeof v, LONG_WAIT_MS, &why);
        if (e != KVC_E_PEER || why.ranks != 2 || !why.dead ||
            !strstr(kvc_last_error(), "rank 1 of group 0x4e59 left")) {
            fprintf(stderr, "rank 0: unexpected %s: %s\n", kvc_strerror(e), kvc_last_error());
            bad |= 1;
        }
    }
    (void)!write(ready_fd, "f", 1);
    char x;
    (void)!read(go_fd, &x, 1);
    kvc_close(s);
    return bad;
}

static void test_reuse_after_clean_exit(void **st)
{
    (void)st;
    const char *name = tu_name();
    kvc_segment *s = tu_open(name, KVC_OPEN_FRESH, KVC_ROLE_CLIENT);
    int ready, go;
    pid_t old[2];
    tu_fork_gated(name, 2, leaver_child, old, &ready, &go);
    assert_int_equal(tu_wait_exit(old[1]), 0);
    char x;
    assert_int_equal(read(ready, &x, 1), 1);
    close(ready);
    /* Mixed: a new rank 1 while the old rank 0 lives. */
    uint8_t v[8] = {3};
    kvc_coll_failure why;
    assert_int_equal(kvc_allreduce_min_ex(s, 0x4e59, 2, 1, v, sizeof v, 100, &why), KVC_E_PEER);
    assert_non_null(strstr(kvc_last_error(), "rank 1 of group 0x4e59 cannot be joined: rank 1"));
    assert_non_null(strstr(kvc_last_error(), "left"));
    assert_non_null(strstr(kvc_last_error(), "rank 0 still live"));
    assert_int_equal(why.ranks, 2);
    assert_int_equal(v[0], 3);
    close(go);
    assert_int_equal(tu_wait_exit(old[0]), 0);
    pid_t fresh[3];
    for (uint32_t r = 0; r < 3; r++) {
        if ((fresh[r] = fork()) == 0)
            _exit(new_epoch_child(name, 0x4e59, 3, r, 55, 2000));
        usleep(10000);
    }
    for (uint32_t r = 0; r < 3; r++)
        assert_int_equal(tu_wait_exit(fresh[r]), 0);
    close_unlink(s, name);
}

/* ---- a sleeper killed asleep ----------------------------------------------- */

static kvc_coll_group *group_of(kvc_segment *s, uint64_t id)
{
    for (uint32_t i = 0; i < KVC_COLL_GROUPS; i++)
        if ((atomic_load(&s->coll[i].state) & 3) == KVC_COLL_READY && s->coll[i].id == id)
            return &s->coll[i];
    return NULL;
}

/* Ranks 0 and 1 run 20 steps; rank 1 then calls alone and goes to sleep on
 * the futex, and is SIGKILLed there; rank 0's next call completes the
 * round rank 1 had arrived at, the one after fails naming rank 1 - and
 * rank 1's sleeper bit is gone with it (before, the count stayed one too
 * high for good: a FUTEX_WAKE system call per round). */
static int sleeper_child(const char *name, uint32_t rank, int ready_fd, int go_fd)
{
    kvc_segment *s = open_client(name);
    if (!s)
        return 10;
    if (run_steps(s, 0x51ee, 2, rank, 13, 0, 20) != 0)
        return 11;
    if (rank == 1) {
        run_steps(s, 0x51ee, 2, rank, 13, 20, 21);
        return 12; /* not reached: killed asleep */
    }
    (void)!write(ready_fd, "2", 1);
    char x;
    (void)!read(go_fd, &x, 1);
    if (run_steps(s, 0x51ee, 2, rank, 13, 20, 21) != 0)
        return 13;
    uint8_t v[4] = {1};
    kvc_coll_failure why;
    kvc_err e = kvc_allreduce_min_ex(s, 0x51ee, 2, 0, v, sizeof v, LONG_WAIT_MS, &why);
    int bad = e == KVC_E_PEER && why.ranks == 2 && why.dead ? 0 : 14;
    kvc_close(s);
    return bad;
}

static void test_sleeper_killed_asleep(void **st)
{
    (void)st;
    const char *name = tu_name();
    kvc_segment *s = tu_open(name, KVC_OPEN_FRESH, KVC_ROLE_CLIENT);
    int ready, go;
    pid_t pids[2];
    tu_fork_gated(name, 2, sleeper_child, pids, &ready, &go);
    char x;
    assert_int_equal(read(ready, &x, 1), 1);
    close(ready);
    kvc_coll_group *g = group_of(s, 0x51ee);
    assert_non_null(g);
    /* Rank 1 arrived at generation 20 and sleeps: its bit is set. */
    for (int i = 0; i < 600000 && !(atomic_load(&g->sleepers) & 2); i++)
        usleep(100);
    assert_int_equal(atomic_load(&g->sleepers), 2);
    usleep(2000);
    kill(pids[1], SIGKILL);
    assert_int_equal(tu_wait_exit(pids[1]), 128 + SIGKILL);
    assert_int_equal(atomic_load(&g->sleepers), 2); /* left by the dead sleeper */
    close(go);
    assert_int_equal(tu_wait_exit(pids[0]), 0);
    assert_int_equal(atomic_load(&g->sleepers), 0); /* repaired when its death was seen */
    assert_int_not_equal(atomic_load(&g->broken), 0);
    close_unlink(s, name);
}

/* Killed while claiming its rank (procs lock held) or creating the group:
 * the next process to call as that rank, or to create a group, proceeds. */
static void test_kill_claiming(void **st)
{
    (void)st;
    static const char *const points[] = {"coll.claim", "coll.claiming"};
    for (int p = 0; p < 2; p++) {
        const char *name = tu_name();
        kvc_segment *s = tu_open(name, KVC_OPEN_FRESH, KVC_ROLE_CLIENT);
        kill_point = points[p];
        pid_t pid = fork();
        if (pid == 0) {
            kvc_segment *c = open_client(name);
            kvc__test_set_inject(die_at);
            uint8_t v[1] = {0};
            kvc_allreduce_min(c, 5, 1, 0, v, 1, 10);
            _exit(1);
        }
        assert_int_equal(tu_wait_exit(pid), 128 + SIGKILL);
        tu_owner_died(s, pid); /* the kernel's part (procs lock), where it does not */
        uint8_t v[2] = {4, 2};
        assert_int_equal(kvc_allreduce_min(s, 5, 1, 0, v, 2, 1000), KVC_OK);
        assert_int_equal(v[0], 4);
        close_unlink(s, name);
    }
}

/* ---- group slots ----------------------------------------------------------- */

static void test_groups_full_and_reclaimed(void **st)
{
    (void)st;
    const char *name = tu_name();
    kvc_segment *s = tu_open(name, KVC_OPEN_FRESH, KVC_ROLE_CLIENT);
    uint8_t v[1] = {3};
    for (uint64_t g = 0; g < KVC_COLL_GROUPS; g++)
        assert_int_equal(kvc_allreduce_min(s, 1000 + g, 1, 0, v, 1, 10), KVC_OK);
    assert_int_equal(kvc_allreduce_min(s, 5000, 1, 0, v, 1, 10), KVC_E_FULL);
    assert_non_null(strstr(kvc_last_error(), "32 collective groups with a live member"));
    /* Still usable, every one. */
    for (uint64_t g = 0; g < KVC_COLL_GROUPS; g++)
        assert_int_equal(kvc_allreduce_min(s, 1000 + g, 1, 0, v, 1, 10), KVC_OK);
    /* Its members leave: every slot can be reclaimed. */
    kvc_close(s);
    s = tu_open(name, KVC_OPEN_ATTACH, KVC_ROLE_CLIENT);
    for (uint64_t g = 0; g < KVC_COLL_GROUPS; g++)
        assert_int_equal(kvc_allreduce_min(s, 2000 + g, 1, 0, v, 1, 10), KVC_OK);
    assert_int_equal(kvc_allreduce_min(s, 5000, 1, 0, v, 1, 10), KVC_E_FULL);
    /* A process holding them all dies: reclaimed too. */
    kvc_close(s);
    pid_t pid = fork();
    if (pid == 0) {
        kvc_segment *c = open_client(name);
        for (uint64_t g = 0; g < KVC_COLL_GROUPS; g++)
            if (kvc_allreduce_min(c, 3000 + g, 1, 0, v, 1, 10))
                _exit(1);
        raise(SIGKILL);
    }
    assert_int_equal(tu_wait_exit(pid), 128 + SIGKILL);
    s = tu_open(name, KVC_OPEN_ATTACH, KVC_ROLE_CLIENT);
    for (uint64_t g = 0; g < KVC_COLL_GROUPS; g++)
        assert_int_equal(kvc_allreduce_min(s, 4000 + g, 1, 0, v, 1, 10), KVC_OK);
    close_unlink(s, name);
}

/* ---- kinds, the stop hook, the poll fold, joining (one process) --------- */

struct kind_arg {
    kvc_segment *s;
    uint32_t rank, kind;
    kvc_err e;
    char msg[512];
};

static void *kind_thread(void *p)
{
    struct kind_arg *a = p;
    uint8_t v[2] = {(uint8_t)(a->rank + 1), 9};
    kvc_coll_opts o = {.timeout_ms = 60000, .kind = a->kind};
    a->e = kvc_allreduce_min_opt(a->s, 0x6e, 2, a->rank, v, 2, &o, NULL);
    snprintf(a->msg, sizeof a->msg, "%s", kvc_last_error());
    return NULL;
}

/* Two threads call as ranks 0 and 1 of one group with kinds k0, k1. */
static void two_kinds(kvc_segment *s, uint32_t k0, uint32_t k1, struct kind_arg out[2])
{
    pthread_t t[2];
    for (uint32_t r = 0; r < 2; r++) {
        out[r] = (struct kind_arg){.s = s, .rank = r, .kind = r ? k1 : k0};
        assert_int_equal(pthread_create(&t[r], NULL, kind_thread, &out[r]), 0);
    }
    for (int r = 0; r < 2; r++)
        pthread_join(t[r], NULL);
}

static void test_kind_mismatch(void **st)
{
    (void)st;
    const char *name = tu_name();
    kvc_segment *s = tu_open(name, KVC_OPEN_FRESH, KVC_ROLE_CLIENT);
    struct kind_arg a[2];
    two_kinds(s, 3, 3, a);
    assert_int_equal(a[0].e, KVC_OK);
    assert_int_equal(a[1].e, KVC_OK);
    two_kinds(s, 3, 5, a);
    for (int r = 0; r < 2; r++) {
        assert_int_equal(a[r].e, KVC_E_INVAL);
        assert_non_null(strstr(a[r].msg, "rank 1 of group 0x6e made a call of kind 5, rank 0 "
                                         "one of kind 3"));
    }
    two_kinds(s, 4, 4, a); /* the group goes on */
    assert_int_equal(a[0].e, KVC_OK);
    assert_int_equal(a[1].e, KVC_OK);
    kvc_coll_opts big = {.timeout_ms = 10, .kind = 70000};
    uint8_t v[1] = {1};
    assert_int_equal(kvc_allreduce_min_opt(s, 0x6f, 1, 0, v, 1, &big, NULL), KVC_E_INVAL);
    close_unlink(s, name);
}

static int stop_after(void *p) { return ++*(int *)p >= 3; }

static void test_stop_hook(void **st)
{
    (void)st;
    const char *name = tu_name();
    kvc_segment *s = tu_open(name, KVC_OPEN_FRESH, KVC_ROLE_CLIENT);
    int asked = 0;
    kvc_coll_opts o = {.timeout_ms = 60000, .stop = stop_after, .stop_arg = &asked};
    uint8_t v[2] = {1, 2};
    kvc_coll_failure why;
    /* Rank 1 never comes: the hook stops the wait (not the 60 s timeout). */
    assert_int_equal(kvc_allreduce_min_opt(s, 0x57, 2, 0, v, 2, &o, &why), KVC_E_TIMEDOUT);
    assert_non_null(strstr(kvc_last_error(), "rank 0 of group 0x57 gave up the call"));
    assert_int_equal(asked, 3);
    assert_int_equal(v[0], 1);
    kvc_coll_wake(s); /* nobody asleep: nothing */
    kvc_coll_wake(NULL);
    close_unlink(s, name);
}

static void test_poll_fold_and_join(void **st)
{
    (void)st;
    const char *name = tu_name();
    kvc_segment *s = tu_open(name, KVC_OPEN_FRESH, KVC_ROLE_CLIENT);
    /* Room 5 failed by a rank (origin pid: this process): not kvcoord's. */
    assert_int_equal(kvc_room_open(s, 5, 2, 0, KVC_ROOM_ROLE_PREFILL), KVC_OK);
    assert_int_equal(kvc_room_fail(s, 5, 1, 0, "rank 1's own", NULL), KVC_OK);
    /* Room 6 failed by kvcoord (the cluster's adopted record: origin pid 0). */
    assert_int_equal(kvc_room_open(s, 6, 2, 0, KVC_ROOM_ROLE_PREFILL), KVC_OK);
    assert_int_equal(kvc_room_fail_adopt(s, 6, KVC_ORIGIN_RANK_NONE, 110, "timed out", 0, NULL),
                     KVC_OK);
    assert_int_equal(kvc_room_open(s, 7, 2, 0, KVC_ROOM_ROLE_PREFILL), KVC_OK);
    uint8_t polls[5] = {3, 3, 3, 4, 2};
    uint64_t rooms[5] = {5, 6, 7, KVC_ROOM_NONE, 999};
    assert_int_equal(kvc_poll_allreduce(s, 0x70, 1, 0, polls, rooms, 5, NULL, NULL), KVC_OK);
    uint8_t want[5] = {3, 0, 3, 4, 2};
    assert_memory_equal(polls, want, 5);
    /* That fold's hints (kvc_poll_prefetch) change nothing: room 7, failed
     * by kvcoord since, is seen by the next call, which reads it anew. */
    for (size_t i = 0; i < 8; i++)
        kvc_poll_prefetch(s, i);
    kvc_poll_prefetch(NULL, 0);
    assert_int_equal(kvc_room_fail_adopt(s, 7, KVC_ORIGIN_RANK_NONE, 110, "timed out", 0, NULL),
                     KVC_OK);
    uint8_t again[5] = {3, 3, 3, 4, 2}, want2[5] = {3, 0, 0, 4, 2};
    assert_int_equal(kvc_poll_allreduce(s, 0x70, 1, 0, again, rooms, 5, NULL, NULL), KVC_OK);
    assert_memory_equal(again, want2, 5);
    polls[0] = 9;
    assert_int_equal(kvc_poll_allreduce(s, 0x70, 1, 0, polls, NULL, 5, NULL, NULL), KVC_E_INVAL);
    /* Joining without a round, then a size mismatch from an unheld rank:
     * the epoch is broken with that note, told to every later call. */
    assert_int_equal(kvc_coll_join(s, 0x71, 3, 0), KVC_OK);
    assert_int_equal(kvc_coll_join(s, 0x71, 2, 1), KVC_E_INVAL);
    assert_non_null(strstr(kvc_last_error(), "rank 1 of group 0x71 called with size 2, the "
                                             "group's ranks with size 3: a size mismatch"));
    uint8_t v[1] = {1};
    assert_int_equal(kvc_allreduce_min(s, 0x71, 3, 0, v, 1, 60000), KVC_E_INVAL);
    assert_non_null(strstr(kvc_last_error(), "a size mismatch"));
    for (uint64_t r = 5; r <= 7; r++)
        kvc_room_release(s, r, 0);
    close_unlink(s, name);
}

/* Ranks of test_poll_fold_trusted: each opens 4 rooms as participant 1 of
 * 2 and reports; rank 0 is then killed; rank 1, woken, closes its handle
 * without releasing them (it leaves the process table), reports, and
 * stays alive until the parent lets it go. */
static int trusted_child(const char *name, uint32_t rank, int ready_fd, int go_fd)
{
    kvc_segment *c = open_client(name);
    for (uint64_t r = 0; r < 4; r++)
        if (kvc_room_open(c, 3000 + rank * 4 + r, 2, 1, KVC_ROOM_ROLE_DECODE) != KVC_OK)
            return 1;
    char x;
    (void)!write(ready_fd, "r", 1);
    (void)!read(go_fd, &x, 1);
    kvc_close(c);
    (void)!write(ready_fd, "c", 1);
    (void)!read(go_fd, &x, 1);
    return 0;
}

/* The rooms a fold found not failed by kvcoord are trusted for a while
 * (collective_poll.c): a participant killed (no kvcoordd: the readers'
 * own liveness checks find it) and one that left the process table
 * without releasing its rooms are still folded in as Failed; a room
 * nobody left stays as polled.  (A hang guard, not a time limit: 3000
 * folds 10 ms apart.) */
static void test_poll_fold_trusted(void **st)
{
    (void)st;
    const char *name = tu_name();
    kvc_segment *s = tu_open(name, KVC_OPEN_FRESH, KVC_ROLE_CLIENT);
    pid_t pids[2];
    int ready, go;
    char x[2];
    tu_fork_gated(name, 2, trusted_child, pids, &ready, &go);
    assert_int_equal(read(ready, x, 1), 1);
    assert_int_equal(read(ready, x + 1, 1), 1);
    enum { N = 9 };
    uint64_t rooms[N];
    uint8_t polls[N];
    for (int i = 0; i < N; i++) {
        rooms[i] = 3000 + (uint64_t)i; /* 3008: this process's alone */
        assert_int_equal(kvc_room_open(s, rooms[i], i < 8 ? 2 : 1, 0, KVC_ROOM_ROLE_PREFILL),
                         KVC_OK);
        polls[i] = KVC_POLL_TRANSFERRING;
    }
    for (int round = 0; round < 3; round++) { /* found clean, then trusted */
        assert_int_equal(kvc_poll_allreduce(s, 0x73, 1, 0, polls, rooms, N, NULL, NULL), KVC_OK);
        for (int i = 0; i < N; i++)
            assert_int_equal(polls[i], KVC_POLL_TRANSFERRING);
    }
    assert_int_equal(kill(pids[0], SIGKILL), 0);
    assert_int_equal(tu_wait_exit(pids[0]), TU_KILLED(SIGKILL));
    assert_int_equal(write(go, "g", 1), 1); /* rank 1 closes its handle */
    assert_int_equal(read(ready, x, 1), 1);
    assert_int_equal(x[0], 'c');
    int failed = 0;
    for (int tries = 0; tries < 3000 && failed < 8; tries++) {
        for (int i = 0; i < N; i++)
            polls[i] = KVC_POLL_TRANSFERRING;
        assert_int_equal(kvc_poll_allreduce(s, 0x73, 1, 0, polls, rooms, N, NULL, NULL), KVC_OK);
        failed = 0;
        for (int i = 0; i < 8; i++)
            failed += polls[i] == KVC_POLL_FAILED;
        if (failed < 8)
            usleep(10000);
    }
    assert_int_equal(failed, 8);
    assert_int_equal(polls[8], KVC_POLL_TRANSFERRING);
    close(go);
    close(ready);
    assert_int_equal(tu_wait_exit(pids[1]), 0);
    for (int i = 0; i < N; i++)
        kvc_room_release(s, rooms[i], 0);
    close_unlink(s, name);
}

/* Rooms reclaimed after they failed: the newest record of each in the ring
 * of recent failures says whose the failure was (more than one batch of
 * rooms, so that the batches and the one ring pass per batch are crossed). */
static void test_poll_fold_reclaimed(void **st)
{
    (void)st;
    const char *name = tu_name();
    kvc_segment *s = tu_open(name, KVC_OPEN_FRESH, KVC_ROLE_CLIENT);
    enum { N = 150 };
    uint8_t polls[N];
    uint64_t rooms[N];
    for (int i = 0; i < N; i++) {
        uint64_t id = 1000 + (uint64_t)i;
        rooms[i] = id;
        polls[i] = 3;
        assert_int_equal(kvc_room_open(s, id, 1, 0, KVC_ROOM_ROLE_PREFILL), KVC_OK);
        if (i % 3 == 0) /* kvcoord's record (origin pid 0) */
            assert_int_equal(
                kvc_room_fail_adopt(s, id, KVC_ORIGIN_RANK_NONE, 110, "timed out", 0, NULL),
                KVC_OK);
        else if (i % 3 == 1) /* the rank's own */
            assert_int_equal(kvc_room_fail(s, id, 0, 0, "rank 0's own", NULL), KVC_OK);
        assert_int_equal(kvc_room_release(s, id, 0), KVC_OK);
        kvc_room_info ri;
        assert_int_equal(kvc_room_get(s, id, -1, &ri), KVC_E_NOENT);
    }
    assert_int_equal(kvc_poll_allreduce(s, 0x72, 1, 0, polls, rooms, N, NULL, NULL), KVC_OK);
    for (int i = 0; i < N; i++)
        assert_int_equal(polls[i], i % 3 == 0 ? KVC_POLL_FAILED : 3);
    close_unlink(s, name);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bad_calls),
        cmocka_unit_test(test_rank_held),
        cmocka_unit_test(test_random_2),
        cmocka_unit_test(test_random_4),
        cmocka_unit_test(test_random_8),
        cmocka_unit_test(test_len_mismatch),
        cmocka_unit_test(test_never_arrives),
        cmocka_unit_test(test_stopped_rank_named),
        cmocka_unit_test(test_kill_published),
        cmocka_unit_test(test_kill_arrived),
        cmocka_unit_test(test_kill_reduced),
        cmocka_unit_test(test_kill_outside),
        cmocka_unit_test(test_kill_claiming),
        cmocka_unit_test(test_whole_group_restarted),
        cmocka_unit_test(test_whole_group_killed_reused),
        cmocka_unit_test(test_reuse_after_clean_exit),
        cmocka_unit_test(test_sleeper_killed_asleep),
        cmocka_unit_test(test_groups_full_and_reclaimed),
        cmocka_unit_test(test_kind_mismatch),
        cmocka_unit_test(test_stop_hook),
        cmocka_unit_test(test_poll_fold_and_join),
        cmocka_unit_test(test_poll_fold_trusted),
        cmocka_unit_test(test_poll_fold_reclaimed),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
