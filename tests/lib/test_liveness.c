/*
 * test_liveness.c - liveness that does not depend on pids, and one truth
 * per segment (issue 20, items 1 and 8), with real processes:
 *  - a worker in its own PID namespace (pid 1 there) and one in a time
 *    namespace, SIGKILLed: its liveness lock goes, its room fails, its
 *    rank is withdrawn (no daemon: the library's own test);
 *  - a room read from a time namespace is not timed out early;
 *  - a fork child neither keeps a dead parent alive nor releases a live
 *    parent's lock;
 *  - one entry and one handle count per process across two copies of the
 *    library (the static one and libkvcoord.so), with no limit of names;
 *  - KVC_OPEN_FRESH refuses while processes are attached, naming them;
 *    KVC_OPEN_FRESH_FORCE makes their next call fail with KVC_E_STALE, as
 *    does an unlinked or replaced segment file;
 *  - a header whose table sizes were overwritten is refused at attach.
 * Namespace cases need CAP_SYS_ADMIN (unshare); without it they print why
 * and are skipped.
 */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>

#include "internal.h"
#include "testutil.h"

#ifndef CLONE_NEWTIME
#define CLONE_NEWTIME 0x00000080
#endif

static uint64_t now_ms(void) { return kvc__mono_ms(); }

/* testutil.h's options with smaller tables (64 processes, 256 rooms, a
 * 4 MiB arena). */
static kvc_options small_options(const char *name, kvc_open_mode mode, kvc_role role)
{
    kvc_options o = tu_options(name, mode, role);
    o.max_procs = 64;
    o.max_rooms = 256;
    o.arena_bytes = 4ull << 20;
    o.max_info_bytes = 1ull << 20;
    return o;
}

static kvc_segment *open_small(const char *name, kvc_open_mode mode, kvc_role role, uint32_t ttl_ms)
{
    kvc_options o = small_options(name, mode, role);
    o.room_ttl_ms = ttl_ms ? ttl_ms : 60000;
    return tu_open_with(&o);
}

/* The entry of pid (own namespace's pid) in the table, or NULL. */
static bool find_proc(kvc_segment *s, int32_t pid, kvc_proc_info *out)
{
    kvc_proc_info p[64];
    size_t n = 0;
    assert_int_equal(kvc_proc_list(s, p, 64, &n), KVC_OK);
    for (size_t i = 0; i < n && i < 64; i++)
        if (p[i].pid == pid) {
            *out = p[i];
            return true;
        }
    return false;
}

/* ---- a worker in other namespaces, SIGKILLed --------------------------- */

/* What the worker reports once it registered and joined: its pid in its
 * namespace, and its pid as we see it. */
struct ready {
    int32_t own_pid, host_pid;
};

/* In the grandchild (inside the namespaces): register rank, join room 7
 * as participant 1 of 2, report, wait to be killed. */
static void worker_body(const char *name, uint32_t rank, int wfd)
{
    kvc_options o;
    kvc_options_init(&o);
    o.name = name;
    o.role = KVC_ROLE_WORKER;
    o.rank = (int32_t)rank;
    kvc_segment *w = NULL;
    if (kvc_open(&o, &w) || kvc_rank_register(w, rank, "h:13", "{}", 2, NULL) ||
        kvc_room_open(w, 7, 2, 1, KVC_ROOM_ROLE_DECODE) ||
        kvc_room_set_state(w, 7, 1, KVC_POLL_WAITING_FOR_INPUT))
        _exit(20);
    struct ready r = {(int32_t)getpid(), 0};
    r.host_pid = w->shown_pid;
    (void)!write(wfd, &r, sizeof r);
    for (;;)
        pause();
}

/* Fork a child that unshares `flags` and forks the worker into them
 * (a PID or time namespace takes effect for children).  Returns the
 * intermediate child's pid (it waits for the worker), or -1 when the
 * namespaces cannot be made here (*why says why). */
static pid_t spawn_in_ns(const char *name, int flags, uint32_t rank, struct ready *r, char *why,
                         size_t cap)
{
    int p[2], e[2];
    assert_int_equal(pipe(p), 0);
    assert_int_equal(pipe(e), 0);
    pid_t mid = fork();
    assert_true(mid >= 0);
    if (mid == 0) {
        close(p[0]);
        close(e[0]);
        if (unshare(flags) < 0) {
            int err = errno;
            (void)!write(e[1], &err, sizeof err);
            _exit(30);
        }
        if (flags & CLONE_NEWTIME) { /* offsets for the children: 100000 s ahead */
            int fd = open("/proc/self/timens_offsets", O_WRONLY);
            const char *off = "monotonic 100000 0\nboottime 100000 0\n";
            if (fd < 0 || write(fd, off, strlen(off)) < 0) {
                int err = errno;
                (void)!write(e[1], &err, sizeof err);
                _exit(31);
            }
            close(fd);
        }
        close(e[1]); /* no error: the parent reads EOF */
        pid_t w = fork();
        if (w == 0)
            worker_body(name, rank, p[1]);
        int st;
        waitpid(w, &st, 0);
        _exit(0);
    }
    close(p[1]);
    close(e[1]);
    int err = 0;
    if (read(e[0], &err, sizeof err) == (ssize_t)sizeof err) {
        snprintf(why, cap, "unshare(0x%x): %s", (unsigned)flags, strerror(err));
        waitpid(mid, NULL, 0);
        close(p[0]);
        close(e[0]);
        return -1;
    }
    close(e[0]);
    ssize_t n = read(p[0], r, sizeof *r);
    close(p[0]);
    assert_int_equal(n, (ssize_t)sizeof *r);
    return mid;
}

static void killed_in_ns(int flags, const char *what)
{
    const char *name = tu_name();
    kvc_segment *s = open_small(name, KVC_OPEN_FRESH, KVC_ROLE_CLIENT, 0);
    assert_int_equal(kvc_room_open(s, 7, 2, 0, KVC_ROOM_ROLE_PREFILL), KVC_OK);
    struct ready r;
    char why[128];
    pid_t mid = spawn_in_ns(name, flags, 13, &r, why, sizeof why);
    if (mid < 0) {
        print_message("skipped (%s): %s\n", what, why);
        kvc_close(s);
        kvc_unlink(name);
        return;
    }
    print_message("%s: worker pid %d in its namespace, %d here\n", what, (int)r.own_pid,
                  (int)r.host_pid);
    if (flags & CLONE_NEWPID)
        assert_int_equal(r.own_pid, 1);
    kvc_proc_info p;
    assert_true(find_proc(s, r.own_pid, &p));
    assert_true(p.alive);
    assert_int_equal(p.role, KVC_ROLE_WORKER);
    assert_int_equal(p.shown_pid, r.host_pid);
    /* Alive, whatever its pid means here (pid 1 is our init). */
    kvc_room_info ri;
    assert_int_equal(kvc_room_get(s, 7, 0, &ri), KVC_OK);
    assert_int_equal(ri.state, KVC_POLL_BOOTSTRAPPING);
    kvc_rank_info info = {0};
    assert_int_equal(kvc_rank_lookup(s, 13, &info), KVC_OK);
    kvc_rank_info_free(&info);

    uint64_t t0 = now_ms();
    assert_int_equal(kill(r.host_pid, SIGKILL), 0);
    /* The room fails once a reader tests the lock (no daemon here). */
    for (;;) {
        assert_int_equal(kvc_room_get(s, 7, 0, &ri), KVC_OK);
        if (ri.state == KVC_POLL_FAILED || now_ms() - t0 > 30000)
            break;
        usleep(2000);
    }
    uint64_t t_room = now_ms() - t0;
    assert_int_equal(ri.state, KVC_POLL_FAILED);
    char want[64]; /* the pid people know: the host's (this test shares its /proc) */
    snprintf(want, sizeof want, "rank 1 (pid %d)", (int)r.host_pid);
    assert_non_null(strstr(ri.failure.reason, want));
    size_t reaped = 0;
    assert_int_equal(kvc_proc_reap_dead(s, &reaped), KVC_OK);
    assert_int_equal(reaped, 1);
    assert_int_equal(kvc_rank_lookup(s, 13, &info), KVC_E_WITHDRAWN);
    kvc_rank_info_free(&info);
    assert_false(find_proc(s, r.own_pid, &p));
    print_message("%s: SIGKILL -> room failed after %llu ms (reader's liveness test), rank "
                  "withdrawn by the reap\n",
                  what, (unsigned long long)t_room);
    int st;
    waitpid(mid, &st, 0);
    kvc_close(s);
    kvc_unlink(name);
}

static void test_killed_in_pid_namespace(void **st)
{
    (void)st;
    killed_in_ns(CLONE_NEWPID, "PID namespace");
}

static void test_killed_in_pid_and_time_namespace(void **st)
{
    (void)st;
    killed_in_ns(CLONE_NEWPID | CLONE_NEWTIME, "PID + time namespace");
}

/* A reader in a time namespace 100000 s ahead neither times out a room
 * written here nor has its own stamps read as 100000 s old here. */
static void test_room_ttl_across_time_namespaces(void **st)
{
    (void)st;
    const char *name = tu_name();
    kvc_segment *s = open_small(name, KVC_OPEN_FRESH, KVC_ROLE_CLIENT, 60000);
    assert_int_equal(kvc_room_open(s, 11, 2, 0, KVC_ROOM_ROLE_PREFILL), KVC_OK);
    int e[2];
    assert_int_equal(pipe(e), 0);
    pid_t mid = fork();
    if (mid == 0) {
        close(e[0]);
        int code = 0;
        if (unshare(CLONE_NEWTIME) < 0) {
            code = 77;
        } else {
            int fd = open("/proc/self/timens_offsets", O_WRONLY);
            const char *off = "monotonic 100000 0\nboottime 100000 0\n";
            if (fd < 0 || write(fd, off, strlen(off)) < 0)
                code = 77;
            if (fd >= 0)
                close(fd);
        }
        if (code) {
            (void)!write(e[1], &code, sizeof code);
            _exit(code);
        }
        pid_t c = fork();
        if (c == 0) {
            kvc_segment *t = open_small(name, KVC_OPEN_ATTACH, KVC_ROLE_CLIENT, 0);
            kvc_room_info ri;
            struct timespec ts;
            clock_gettime(CLOCK_MONOTONIC, &ts);
            int bad = ts.tv_sec < 100000 ? 1 : 0; /* really ahead */
            if (kvc_room_get(t, 11, 1, &ri) != KVC_OK || ri.state != KVC_POLL_BOOTSTRAPPING)
                bad |= 2;
            /* Its own room, stamped from 100000 s ahead (released, so that
             * its close does not fail it). */
            if (kvc_room_open(t, 12, 2, 1, KVC_ROOM_ROLE_DECODE) != KVC_OK ||
                kvc_room_release(t, 12, 1) != KVC_OK)
                bad |= 4;
            size_t swept = 0;
            if (kvc_room_sweep(t, &swept) != KVC_OK || swept != 0)
                bad |= 8;
            kvc_close(t);
            _exit(bad ? 40 + bad : 0);
        }
        int cst;
        waitpid(c, &cst, 0);
        code = WIFEXITED(cst) ? WEXITSTATUS(cst) : 99;
        (void)!write(e[1], &code, sizeof code);
        _exit(code);
    }
    close(e[1]);
    int code = -1;
    assert_int_equal(read(e[0], &code, sizeof code), (ssize_t)sizeof code);
    close(e[0]);
    waitpid(mid, NULL, 0);
    if (code == 77) {
        print_message("skipped: cannot make a time namespace here\n");
    } else {
        assert_int_equal(code, 0);
        /* Its room, stamped from 100000 s ahead, is fresh here too. */
        kvc_room_info ri;
        assert_int_equal(kvc_room_get(s, 12, 0, &ri), KVC_OK);
        assert_int_equal(ri.state, KVC_POLL_BOOTSTRAPPING);
        size_t swept = 0;
        assert_int_equal(kvc_room_sweep(s, &swept), KVC_OK);
        assert_int_equal(swept, 0);
    }
    kvc_close(s);
    kvc_unlink(name);
}

/* ---- fork children and the lock ------------------------------------------ */

static void test_fork_child_and_parent_lock(void **st)
{
    (void)st;
    const char *name = tu_name();
    kvc_segment *s = open_small(name, KVC_OPEN_FRESH, KVC_ROLE_CLIENT, 0);
    int p[2];
    assert_int_equal(pipe(p), 0);
    pid_t parent = fork();
    if (parent == 0) {
        /* The worker: attached, then forks a child that exits at once (its
         * exit must not release our lock) and one that stays. */
        kvc_segment *w = open_small(name, KVC_OPEN_ATTACH, KVC_ROLE_WORKER, 0);
        if (kvc_rank_register(w, 3, "h:3", "{}", 2, NULL))
            _exit(20);
        pid_t c1 = fork();
        if (c1 == 0)
            _exit(0);
        waitpid(c1, NULL, 0);
        pid_t c2 = fork();
        if (c2 == 0) {
            sleep(60); /* bounded: a failed test leaves nothing behind for long */
            _exit(0);
        }
        pid_t pids[2] = {getpid(), c2};
        (void)!write(p[1], pids, sizeof pids);
        for (;;)
            pause();
    }
    close(p[1]);
    pid_t pids[2];
    assert_int_equal(read(p[0], pids, sizeof pids), (ssize_t)sizeof pids);
    close(p[0]);
    kvc_proc_info pi;
    /* The child that exited took nothing with it. */
    assert_true(find_proc(s, pids[0], &pi));
    assert_true(pi.alive);
    assert_false(find_proc(s, pids[1], &pi)); /* a fork child is not attached */
    kill(pids[0], SIGKILL);
    waitpid(pids[0], NULL, 0);
    /* Dead, although its child (which shared the holder's description
     * until it closed its copy in its fork handler, which may not have run
     * yet when the parent died) still runs. */
    uint64_t t0 = now_ms();
    for (;;) {
        assert_true(find_proc(s, pids[0], &pi));
        if (!pi.alive || now_ms() - t0 > 30000)
            break;
        usleep(1000);
    }
    assert_false(pi.alive);
    print_message("parent SIGKILLed, its fork child running: dead after %llu ms\n",
                  (unsigned long long)(now_ms() - t0));
    assert_int_equal(kill(pids[1], 0), 0);
    size_t reaped = 0;
    assert_int_equal(kvc_proc_reap_dead(s, &reaped), KVC_OK);
    assert_int_equal(reaped, 1);
    kvc_rank_info ri = {0};
    assert_int_equal(kvc_rank_lookup(s, 3, &ri), KVC_E_WITHDRAWN);
    kvc_rank_info_free(&ri);
    kill(pids[1], SIGKILL); /* reparented to init (or our subreaper): not ours to wait */
    kvc_close(s);
    kvc_unlink(name);
}

/* ---- one count per process, every library copy -------------------------- */

/* libkvcoord.so loaded beside the static copy this test links: a second
 * copy of the library with its own statics, as the Python extension is. */
struct copy {
    void *dl;
    void (*options_init)(kvc_options *);
    kvc_err (*open)(const kvc_options *, kvc_segment **);
    kvc_err (*close)(kvc_segment *);
};

static bool load_copy(struct copy *c)
{
    c->dl = dlopen(KVC_TEST_SHARED_LIB, RTLD_NOW | RTLD_LOCAL);
    if (!c->dl)
        return false;
    *(void **)&c->options_init = dlsym(c->dl, "kvc_options_init");
    *(void **)&c->open = dlsym(c->dl, "kvc_open");
    *(void **)&c->close = dlsym(c->dl, "kvc_close");
    return c->options_init && c->open && c->close;
}

static void test_one_count_across_library_copies(void **st)
{
    (void)st;
    struct copy so = {0};
    if (!load_copy(&so))
        fail_msg("dlopen %s: %s", KVC_TEST_SHARED_LIB, dlerror());
    assert_ptr_not_equal((void *)so.open, (void *)kvc_open);
    const char *name = tu_name();
    kvc_segment *d = open_small(name, KVC_OPEN_FRESH, KVC_ROLE_NONE, 0);
    kvc_segment *w = open_small(name, KVC_OPEN_ATTACH, KVC_ROLE_WORKER, 0);
    assert_int_equal(kvc_rank_register(w, 5, "h:5", "{}", 2, NULL), KVC_OK);
    kvc_options o;
    so.options_init(&o);
    o.name = name;
    o.role = KVC_ROLE_CLIENT;
    kvc_segment *other = NULL;
    assert_int_equal(so.open(&o, &other), KVC_OK);
    kvc_proc_info pi;
    assert_true(find_proc(d, getpid(), &pi));
    assert_int_equal(pi.handles, 2);
    size_t n = 0;
    assert_int_equal(kvc_proc_list(d, NULL, 0, &n), KVC_OK);
    assert_int_equal(n, 1); /* one entry for this process */
    /* Closing the other copy's handle is not this process's last close. */
    assert_int_equal(so.close(other), KVC_OK);
    kvc_rank_info ri = {0};
    assert_int_equal(kvc_rank_lookup(d, 5, &ri), KVC_OK);
    kvc_rank_info_free(&ri);
    assert_true(find_proc(d, getpid(), &pi));
    assert_int_equal(pi.handles, 1);
    /* The other way round: the .so's handle outlives the static one's. */
    assert_int_equal(so.open(&o, &other), KVC_OK);
    assert_int_equal(kvc_close(w), KVC_OK);
    assert_int_equal(kvc_rank_lookup(d, 5, &ri), KVC_OK);
    kvc_rank_info_free(&ri);
    /* The last close, whichever copy makes it, ends the worker's session. */
    assert_int_equal(so.close(other), KVC_OK);
    assert_int_equal(kvc_rank_lookup(d, 5, &ri), KVC_E_WITHDRAWN);
    kvc_rank_info_free(&ri);
    assert_false(find_proc(d, getpid(), &pi));
    kvc_close(d);
    kvc_unlink(name);
    dlclose(so.dl);
}

/* Past 32 segment names (the old per-copy table's size) every count is
 * still right: closing one of two handles never withdraws. */
static void test_counts_have_no_name_limit(void **st)
{
    (void)st;
    enum { NAMES = 40 };
    char names[NAMES][48];
    kvc_segment *a[NAMES], *b[NAMES];
    for (int i = 0; i < NAMES; i++) {
        snprintf(names[i], sizeof names[i], "%s", tu_name());
        a[i] = open_small(names[i], KVC_OPEN_FRESH, KVC_ROLE_WORKER, 0);
        b[i] = open_small(names[i], KVC_OPEN_ATTACH, KVC_ROLE_WORKER, 0);
        assert_int_equal(kvc_rank_register(a[i], 1, "h:1", "{}", 2, NULL), KVC_OK);
    }
    for (int i = 0; i < NAMES; i++) {
        assert_int_equal(kvc_close(a[i]), KVC_OK);
        kvc_rank_info ri = {0};
        assert_int_equal(kvc_rank_lookup(b[i], 1, &ri), KVC_OK);
        kvc_rank_info_free(&ri);
        assert_int_equal(kvc_close(b[i]), KVC_OK);
        kvc_segment *c = open_small(names[i], KVC_OPEN_ATTACH, KVC_ROLE_NONE, 0);
        assert_int_equal(kvc_rank_lookup(c, 1, &ri), KVC_E_WITHDRAWN);
        kvc_rank_info_free(&ri);
        kvc_close(c);
        kvc_unlink(names[i]);
    }
}

/* ---- one truth per segment ------------------------------------------------ */

#define EXPECT(err, call, text)                                                     \
    do {                                                                            \
        kvc_err e_ = (call);                                                        \
        if (e_ != (err) || !strstr(kvc_last_error(), (text)))                       \
            fail_msg("%s: got %s (%s), want %s with '%s'", #call, kvc_strerror(e_), \
                     kvc_last_error(), kvc_strerror(err), (text));                  \
    } while (0)

/* A worker attached in a child; it reports the result of each call the
 * parent asks for over a pipe: 'r' register, 'l' lookup, 'v' verify. */
struct peer {
    pid_t pid;
    int cmd, res;
};

static struct peer peer_start(const char *name)
{
    int c[2], r[2];
    assert_int_equal(pipe(c), 0);
    assert_int_equal(pipe(r), 0);
    struct peer p = {fork(), c[1], r[0]};
    if (p.pid == 0) {
        close(c[1]);
        close(r[0]);
        kvc_options o;
        kvc_options_init(&o);
        o.name = name;
        o.role = KVC_ROLE_WORKER;
        o.rank = 4;
        kvc_segment *w = NULL;
        kvc_err e = kvc_open(&o, &w);
        (void)!write(r[1], &e, sizeof e);
        char op;
        while (read(c[0], &op, 1) == 1) {
            kvc_rank_info ri = {0};
            if (op == 'r')
                e = kvc_rank_register(w, 4, "h:4", "{\"a\":1}", 7, NULL);
            else if (op == 'l')
                e = kvc_rank_lookup(w, 4, &ri);
            else if (op == 'v')
                e = kvc_segment_verify(w);
            else
                e = kvc_close(w);
            kvc_rank_info_free(&ri);
            char msg[256];
            snprintf(msg, sizeof msg, "%s", e ? kvc_last_error() : "");
            (void)!write(r[1], &e, sizeof e);
            (void)!write(r[1], msg, sizeof msg);
        }
        _exit(0);
    }
    close(c[0]);
    close(r[1]);
    kvc_err e;
    assert_int_equal(read(p.res, &e, sizeof e), (ssize_t)sizeof e);
    assert_int_equal(e, KVC_OK);
    return p;
}

static kvc_err peer_call(struct peer *p, char op, char *msg)
{
    kvc_err e;
    char m[256];
    assert_int_equal(write(p->cmd, &op, 1), 1);
    assert_int_equal(read(p->res, &e, sizeof e), (ssize_t)sizeof e);
    assert_int_equal(read(p->res, m, sizeof m), (ssize_t)sizeof m);
    if (msg)
        memcpy(msg, m, sizeof m);
    return e;
}

static void peer_stop(struct peer *p)
{
    close(p->cmd);
    close(p->res);
    waitpid(p->pid, NULL, 0);
}

static void test_fresh_refuses_then_forced_fails_their_calls(void **st)
{
    (void)st;
    const char *name = tu_name();
    kvc_segment *d = open_small(name, KVC_OPEN_FRESH, KVC_ROLE_CLIENT, 0);
    struct peer p = peer_start(name);
    assert_int_equal(peer_call(&p, 'r', NULL), KVC_OK);
    kvc_close(d); /* the creator goes: only the attached worker is in the way */
    kvc_options o = small_options(name, KVC_OPEN_FRESH, KVC_ROLE_DAEMON);
    kvc_segment *n = NULL;
    char want[96];
    snprintf(want, sizeof want, "1 other attached process: pid %d (worker, rank 4)", (int)p.pid);
    EXPECT(KVC_E_EXISTS, kvc_open(&o, &n), want);
    assert_null(n);
    /* Refused: nothing changed for the worker. */
    assert_int_equal(peer_call(&p, 'v', NULL), KVC_OK);
    assert_int_equal(peer_call(&p, 'l', NULL), KVC_OK);
    o.mode = KVC_OPEN_FRESH_FORCE;
    assert_int_equal(kvc_open(&o, &n), KVC_OK);
    char msg[256];
    assert_int_equal(peer_call(&p, 'r', msg), KVC_E_STALE);
    assert_non_null(strstr(msg, "was discarded"));
    assert_int_equal(peer_call(&p, 'l', msg), KVC_E_STALE);
    assert_int_equal(peer_call(&p, 'v', msg), KVC_E_STALE);
    /* Nothing it did reached the new segment. */
    kvc_rank_info ri = {0};
    assert_int_equal(kvc_rank_lookup(n, 4, &ri), KVC_E_NOENT);
    /* Its close ends nothing in the new one and succeeds. */
    assert_int_equal(peer_call(&p, 'c', NULL), KVC_OK);
    peer_stop(&p);
    kvc_close(n);
    kvc_unlink(name);
}

static void test_unlinked_or_replaced_segment_fails_writes(void **st)
{
    (void)st;
    for (int how = 0; how < 3; how++) {
        const char *name = tu_name();
        kvc_segment *s = open_small(name, KVC_OPEN_FRESH, KVC_ROLE_WORKER, 0);
        assert_int_equal(kvc_rank_register(s, 1, "h:1", "{}", 2, NULL), KVC_OK);
        char path[128];
        snprintf(path, sizeof path, "/dev/shm/%s", name);
        const char *what = how == 0 ? "kvc_unlink" : how == 1 ? "unlink(2)" : "rename(2) over it";
        if (how == 0) {
            assert_int_equal(kvc_unlink(name), KVC_OK);
        } else if (how == 1) {
            assert_int_equal(unlink(path), 0);
        } else {
            /* Re-created by another: a new valid segment under the name. */
            char tmp[64];
            snprintf(tmp, sizeof tmp, "%s.new", name);
            kvc_segment *t = open_small(tmp, KVC_OPEN_FRESH, KVC_ROLE_NONE, 0);
            char tpath[128];
            snprintf(tpath, sizeof tpath, "/dev/shm/%s", tmp);
            assert_int_equal(rename(tpath, path), 0);
            kvc_close(t);
        }
        EXPECT(KVC_E_STALE, kvc_rank_register(s, 2, "h:2", "{}", 2, NULL),
               how == 0 ? "was discarded" : "removed from /dev/shm");
        EXPECT(KVC_E_STALE, kvc_room_open(s, 9, 2, 0, KVC_ROOM_ROLE_PREFILL), "segment");
        EXPECT(KVC_E_STALE, kvc_segment_verify(s), "segment");
        print_message("%s: the next write fails with KVC_E_STALE\n", what);
        assert_int_equal(kvc_close(s), KVC_OK);
        unlink(path);
    }
}

/* ---- the header's table sizes, overwritten ------------------------------- */

static void test_overwritten_sizes_refused_at_attach(void **st)
{
    (void)st;
    static const struct {
        const char *field;
        size_t off;
        uint32_t value;
    } cases[] = {
        {"stripe_slots", offsetof(kvc_header, stripe_slots), 1u << 30},
        {"room_slots", offsetof(kvc_header, room_slots), 7},
        {"max_procs", offsetof(kvc_header, max_procs), 0xffffffffu},
        {"max_ranks", offsetof(kvc_header, max_ranks), 0},
        {"world_size", offsetof(kvc_header, world_size), 100000},
        {"roles_used", offsetof(kvc_header, roles_used), 1000},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        const char *name = tu_name();
        kvc_segment *s = open_small(name, KVC_OPEN_FRESH, KVC_ROLE_NONE, 0);
        kvc_close(s);
        char path[128];
        snprintf(path, sizeof path, "/dev/shm/%s", name);
        int fd = open(path, O_RDWR);
        assert_true(fd >= 0);
        assert_int_equal(pwrite(fd, &cases[i].value, 4, (off_t)cases[i].off), 4);
        close(fd);
        kvc_options o;
        kvc_options_init(&o);
        o.name = name;
        o.role = KVC_ROLE_NONE;
        kvc_segment *t = NULL;
        EXPECT(KVC_E_CORRUPT, kvc_open(&o, &t), "inconsistent header");
        assert_null(t);
        print_message("%s overwritten: refused at attach\n", cases[i].field);
        kvc_unlink(name);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_killed_in_pid_namespace),
        cmocka_unit_test(test_killed_in_pid_and_time_namespace),
        cmocka_unit_test(test_room_ttl_across_time_namespaces),
        cmocka_unit_test(test_fork_child_and_parent_lock),
        cmocka_unit_test(test_one_count_across_library_copies),
        cmocka_unit_test(test_counts_have_no_name_limit),
        cmocka_unit_test(test_fresh_refuses_then_forced_fails_their_calls),
        cmocka_unit_test(test_unlinked_or_replaced_segment_fails_writes),
        cmocka_unit_test(test_overwritten_sizes_refused_at_attach),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
