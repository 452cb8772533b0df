/* test_xfer_cma.c - the same-host copy (src/xfer/xfer_cma.c) between real
 * processes on this host: scattered writes and reads verified by checksum
 * and proven to have gone by process_vm_readv (the engines' counters); a
 * write outside the server's regions refused with nothing written; a
 * server SIGKILLed mid-call fails the call at once (its connections'
 * reset, not a deadline) naming it; a writer
 * SIGKILLed while the server copies leaves the server usable; a server
 * restarted at the same port with its region elsewhere: nothing written at
 * the old addresses; KVCOORD_FORCE_SOCKET and force_socket really use the
 * socket; a server that may not read this process (another uid: EPERM)
 * falls back to the socket, logged once, bytes still right.  On the wire:
 * a same-host write without the negotiation is refused; a client naming
 * another process (which even holds the server's nonce, as a relay would
 * arrange) is refused because that process does not hold its socket. */
#include <arpa/inet.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <netinet/in.h>
#include <stdbool.h>
#include <stddef.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <time.h>

#include "testutil.h"
#include "xfer_raw.h"

#define REGION (32u << 20)

enum { SRV_FORCE = 1, SRV_NOBODY = 2 };

/* What a server reports: per event and per query. */
typedef struct srep {
    uint64_t room;
    int32_t state, code;
    uint64_t sum, decoy_sum; /* its region, the decoy mapping (0: none) */
    kvt_stats st;
    int fell_logs; /* its WARN lines of a copy that fell back to the socket */
} srep;

typedef struct srv {
    pid_t pid;
    int rd, cmd; /* reports from it; queries to it */
    char *desc;
} srv;

/* From now on process_vm_readv fails with EPERM in every thread of this
 * process, as under a container's seccomp profile (a real refusal by the
 * kernel, after the same-host copy was negotiated).  0, or -1. */
static int block_vm_readv(void)
{
    struct sock_filter f[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_process_vm_readv, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (EPERM & SECCOMP_RET_DATA)),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    struct sock_fprog p = {sizeof f / sizeof f[0], f};
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0))
        return -1;
    return (int)syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_TSYNC, &p);
}

static int srv_fell_logs;

static void srv_log(void *ctx, int level, const char *msg)
{
    (void)ctx;
    if (level <= KVT_LOG_WARN && strstr(msg, "goes through the socket from now on"))
        srv_fell_logs++;
    xu_quiet_log(NULL, level, msg);
}

/* A serving process's engine, pipes and memory, for srv_events. */
typedef struct srv_state {
    kvt_engine *e;
    int fd, cmd;
    const unsigned char *buf, *dec;
    size_t bytes;
} srv_state;

/* xu_serve_region's on_events: an srep per event, and one (room
 * UINT64_MAX) per query byte on the command pipe.  Non-zero: the parent
 * is gone. */
static int srv_events(void *ctx, const kvt_event *ev, size_t n)
{
    srv_state *s = ctx;
    struct pollfd pf = {s->cmd, POLLIN, 0};
    bool query = poll(&pf, 1, 0) == 1;
    if (query) {
        char q;
        if (read(s->cmd, &q, 1) != 1)
            return -1;
        if (q == 's' && block_vm_readv()) /* 's': copy no more, then a report */
            _exit(4);
    }
    for (size_t i = 0; i < n + query; i++) {
        srep r;
        memset(&r, 0, sizeof r);
        if (i < n) {
            r.room = ev[i].room;
            r.state = (int32_t)ev[i].state;
            r.code = ev[i].code;
        } else {
            r.room = UINT64_MAX; /* the query's answer */
        }
        r.sum = xu_sum(s->buf, s->bytes);
        r.decoy_sum = s->dec ? xu_sum(s->dec, s->bytes) : 0;
        kvt_engine_stat(s->e, &r.st);
        r.fell_logs = srv_fell_logs;
        if (xu_write_all(s->fd, &r, sizeof r))
            return -1;
    }
    return 0;
}

/* A serving process: one region of `bytes` filled with pattern seed; a
 * decoy mapping of the same size at `decoy` (not registered) when not 0;
 * answers a query byte on its command pipe with a report. */
static void srv_main(int fd, int cmd, const char *listen, size_t bytes, uint64_t seed,
                     unsigned flags, uint64_t decoy)
{
    if ((flags & SRV_NOBODY) && (setgid(65534) || setuid(65534))) {
        fprintf(stderr, "server: setuid(nobody): %s\n", strerror(errno));
        _exit(2);
    }
    unsigned char *dec = NULL;
    if (decoy) {
        /* MAP_FIXED: what the parent had there (inherited) is not used */
        dec = mmap((void *)(uintptr_t)decoy, bytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
        if (dec == MAP_FAILED || (uint64_t)(uintptr_t)dec != decoy)
            _exit(2);
        xu_fill(dec, bytes, seed);
    }
    kvt_options o;
    kvt_options_init(&o);
    o.backend = KVT_BACKEND_TCP;
    o.listen = listen;
    o.log = srv_log;
    o.io_timeout_ms = 3000;
    o.force_socket = (flags & SRV_FORCE) != 0;
    kvt_engine *e = xu_engine_create_retry(&o);
    unsigned char *buf = xu_map(bytes);
    if (!buf)
        _exit(2);
    xu_fill(buf, bytes, seed);
    srv_state st = {e, fd, cmd, buf, dec, bytes};
    xu_serve_region(e, buf, bytes, fd, 20, srv_events, &st);
}

static void srv_start(srv *s, const char *listen, uint64_t seed, unsigned flags, uint64_t decoy)
{
    int p[2], q[2];
    assert_int_equal(pipe(p), 0);
    assert_int_equal(pipe(q), 0);
    s->pid = fork();
    if (s->pid == 0) {
        close(p[0]);
        close(q[1]);
        srv_main(p[1], q[0], listen, REGION, seed, flags, decoy);
    }
    close(p[1]);
    close(q[0]);
    s->rd = p[0];
    s->cmd = q[1];
    s->desc = xu_recv_str(s->rd, -1);
    assert_non_null(s->desc);
}

static void srv_stop(srv *s)
{
    if (s->pid > 0) {
        kill(s->pid, SIGKILL);
        waitpid(s->pid, NULL, 0);
        s->pid = 0;
    }
    if (s->rd >= 0)
        close(s->rd);
    if (s->cmd >= 0)
        close(s->cmd);
    s->rd = s->cmd = -1;
    free(s->desc);
    s->desc = NULL;
}

/* The server's state now (its reports of events before are skipped);
 * after blocking its process_vm_readv when cmd is 's'. */
static srep srv_cmd(srv *s, const char *cmd)
{
    srep r;
    assert_int_equal(write(s->cmd, cmd, 1), 1);
    do
        assert_int_equal(xu_read_all(s->rd, &r, sizeof r, -1), 0);
    while (r.room != UINT64_MAX);
    return r;
}

static srep srv_query(srv *s)
{
    srep r;
    assert_int_equal(write(s->cmd, "q", 1), 1);
    do
        assert_int_equal(xu_read_all(s->rd, &r, sizeof r, -1), 0);
    while (r.room != UINT64_MAX);
    return r;
}

static uint64_t desc_base(const char *desc)
{
    const char *a = strstr(desc, "\"addr\":");
    return a ? strtoull(a + 7, NULL, 10) : 0;
}

static const char *desc_sid(const char *desc, char *out, size_t cap)
{
    const char *a = strstr(desc, "\"session_id\":\"");
    assert_non_null(a);
    a += 14;
    snprintf(out, cap, "%.*s", (int)strcspn(a, "\""), a);
    return out;
}

static uint64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* This process's engine logs WARN lines here (the fallback's). */
static char warned[4096];
static int nwarned;

static void log_fn(void *ctx, int level, const char *msg)
{
    (void)ctx;
    if (level <= KVT_LOG_WARN && strstr(msg, "same-host")) {
        nwarned++;
        snprintf(warned, sizeof warned, "%s", msg);
    }
    xu_quiet_log(NULL, level, msg);
}

static kvt_engine *engine(int force)
{
    kvt_options o;
    kvt_options_init(&o);
    o.backend = KVT_BACKEND_TCP;
    o.io_timeout_ms = 3000;
    o.force_socket = force;
    o.log = log_fn;
    kvt_engine *e = NULL;
    if (kvt_engine_create(&o, &e))
        fail_msg("engine: %s", kvc_last_error());
    return e;
}

static kvt_engine *mover_engine(void) { return engine(0); }

/* Events that arrived while another room's was awaited. */
static kvt_event stash[64];
static size_t nstash;

/* Drive e until room's event (no wall-clock limit: ctest's TIMEOUT ends
 * a hang). */
static kvt_event wait_ev(kvt_engine *e, uint64_t room)
{
    for (;;) {
        for (size_t i = 0; i < nstash; i++)
            if (stash[i].room == room) {
                kvt_event ev = stash[i];
                stash[i] = stash[--nstash];
                return ev;
            }
        kvt_event ev[16];
        size_t n;
        if (kvt_progress(e, 50, ev, 16, &n))
            fail_msg("kvt_progress: %s", kvc_last_error());
        for (size_t i = 0; i < n && nstash < 64; i++)
            stash[nstash++] = ev[i];
    }
}

typedef struct ctx {
    srv s;
    kvt_engine *e;
    kvt_peer *peer;
    unsigned char *local, *mirror; /* mirror: what the server's region holds */
    uint64_t rbase;
} ctx;

static void ctx_open(ctx *c, unsigned srv_flags, int force)
{
    memset(c, 0, sizeof *c);
    nstash = 0;
    nwarned = 0;
    warned[0] = '\0';
    srv_start(&c->s, "127.0.0.1:0", 11, srv_flags, 0);
    c->e = engine(force);
    c->local = xu_map(REGION);
    c->mirror = xu_map(REGION);
    xu_fill(c->mirror, REGION, 11);
    assert_int_equal(kvt_mr_register(c->e, c->local, REGION, NULL), KVC_OK);
    assert_int_equal(kvt_peer_import(c->e, c->s.desc, strlen(c->s.desc), &c->peer), KVC_OK);
    c->rbase = desc_base(c->s.desc);
}

static int setup(void **state)
{
    ctx *c = malloc(sizeof *c);
    ctx_open(c, 0, 0);
    *state = c;
    return 0;
}

static void ctx_close(ctx *c)
{
    kvt_engine_destroy(c->e);
    srv_stop(&c->s);
    munmap(c->local, REGION);
    munmap(c->mirror, REGION);
}

static int teardown(void **state)
{
    ctx_close(*state);
    free(*state);
    return 0;
}

/* n pages of `page` bytes written to the server (write) or read from it,
 * every other page of both regions in a random order on each side
 * (nothing an engine could merge); the bytes checked on the side written.
 * Returns the bytes moved. */
static uint64_t scattered(ctx *c, bool write, uint32_t page, uint32_t n, uint64_t room)
{
    kvt_run *runs = calloc(n, sizeof *runs);
    assert_int_equal(xu_scatter(runs, n, page, REGION, (uintptr_t)c->local, c->rbase, room), 0);
    unsigned char *want = xu_map(REGION);
    xu_fill(c->local, REGION, room * 7 + 3);
    memcpy(want, write ? c->mirror : c->local, REGION);
    for (uint32_t i = 0; i < n; i++) {
        uint64_t lo = runs[i].laddr - (uintptr_t)c->local, ro = runs[i].raddr - c->rbase;
        if (write)
            memcpy(want + ro, c->local + lo, page);
        else
            memcpy(want + lo, c->mirror + ro, page);
    }
    kvc_err err = write ? kvt_submit(c->e, c->peer, room, runs, n, 0)
                        : kvt_submit_read(c->e, c->peer, room, runs, n, 0);
    assert_int_equal(err, KVC_OK);
    kvt_event ev = wait_ev(c->e, room);
    if (ev.state != KVC_POLL_SUCCESS)
        fail_msg("room %llu failed: %s", (unsigned long long)room, ev.reason);
    assert_int_equal(ev.bytes, (uint64_t)page * n);
    if (write) {
        memcpy(c->mirror, want, REGION);
        assert_true(srv_query(&c->s).sum == xu_sum(want, REGION));
    } else {
        assert_true(xu_sum(c->local, REGION) == xu_sum(want, REGION));
    }
    munmap(want, REGION);
    free(runs);
    return (uint64_t)page * n;
}

static uint32_t same_host_conns(ctx *c)
{
    kvt_peer_info pi;
    assert_int_equal(kvt_peer_stat(c->e, c->peer, &pi), KVC_OK);
    return pi.conns_same_host;
}

/* Writes: the server copied every byte (its counter), bytes right. */
static void test_write_scattered(void **state)
{
    ctx *c = *state;
    srep r0 = srv_query(&c->s);
    uint64_t bytes = scattered(c, true, 4096, 1024, 1);
    bytes += scattered(c, true, 64u << 10, 256, 2);
    srep r1 = srv_query(&c->s);
    assert_int_equal(r1.st.same_host_bytes - r0.st.same_host_bytes, bytes);
    assert_true(r1.st.same_host_copies > r0.st.same_host_copies);
    assert_int_equal(r1.st.bytes_recv - r0.st.bytes_recv, bytes);
    assert_true(same_host_conns(c) >= 1);
    kvt_stats st;
    assert_int_equal(kvt_engine_stat(c->e, &st), KVC_OK);
    assert_int_equal(st.same_host_bytes, 0); /* the writer copies nothing */
    assert_int_equal(st.bytes_sent, bytes);
}

/* Reads: this process copied every byte (its counter), bytes right. */
static void test_read_scattered(void **state)
{
    ctx *c = *state;
    uint64_t bytes = scattered(c, false, 4096, 1024, 3);
    bytes += scattered(c, false, 64u << 10, 256, 4);
    kvt_stats st;
    assert_int_equal(kvt_engine_stat(c->e, &st), KVC_OK);
    assert_int_equal(st.same_host_bytes, bytes);
    assert_int_equal(st.bytes_read, bytes);
    assert_true(same_host_conns(c) >= 1);
    assert_int_equal(srv_query(&c->s).st.same_host_bytes, 0);
}

/* A write with one run outside the server's regions (our descriptor
 * claims a larger region): the whole frame refused, EFAULT, the range and
 * the peer named, nothing of it written there. */
static void test_write_out_of_region(void **state)
{
    ctx *c = *state;
    char *d = strdup(c->s.desc), buf[4096];
    char *len = strstr(d, "\"length\":");
    snprintf(buf, sizeof buf, "%.*s\"length\":%u%s", (int)(len - d), d, 2 * REGION,
             len + 9 + strspn(len + 9, "0123456789"));
    free(d);
    kvt_peer *p;
    assert_int_equal(kvt_peer_import(c->e, buf, strlen(buf), &p), KVC_OK);
    scattered(c, true, 4096, 4, 9); /* the connections are up, same host */
    srep r0 = srv_query(&c->s);
    xu_fill(c->local, REGION, 31);
    kvt_run w[3] = {{(uint64_t)(uintptr_t)c->local, c->rbase, 4096},
                    {(uint64_t)(uintptr_t)c->local + 8192, c->rbase + REGION + 4096, 4096},
                    {(uint64_t)(uintptr_t)c->local + 65536, c->rbase + 65536, 4096}};
    assert_int_equal(kvt_submit(c->e, p, 10, w, 3, 0), KVC_OK);
    kvt_event ev = wait_ev(c->e, 10);
    assert_int_equal(ev.state, KVC_POLL_FAILED);
    assert_int_equal(ev.code, EFAULT);
    assert_non_null(strstr(ev.reason, "outside every region"));
    char sid[128];
    assert_non_null(strstr(ev.reason, desc_sid(c->s.desc, sid, sizeof sid)));
    srep r1 = srv_query(&c->s);
    assert_true(r1.sum == r0.sum); /* nothing written */
    assert_int_equal(r1.st.same_host_bytes, r0.st.same_host_bytes);
    assert_true(r1.st.frames_refused > r0.st.frames_refused);
    assert_true(same_host_conns(c) >= 1);
}

/* The server SIGKILLed mid-call (stopped with requests queued, then
 * killed): the call fails within 3 s, the reason naming the peer. */
static void test_server_killed(void **state)
{
    ctx *c = *state;
    scattered(c, false, 4096, 4, 11); /* connections up, same host */
    kill(c->s.pid, SIGSTOP);
    kvt_run run = {(uint64_t)(uintptr_t)c->local, c->rbase, REGION};
    assert_int_equal(kvt_submit(c->e, c->peer, 12, &run, 1, 0), KVC_OK);
    assert_int_equal(kvt_submit_read(c->e, c->peer, 13, &run, 1, 0), KVC_OK);
    kvt_event ev;
    size_t n;
    assert_int_equal(kvt_progress(c->e, 100, &ev, 1, &n), KVC_OK);
    assert_int_equal(n, 0);
    kill(c->s.pid, SIGKILL);
    waitpid(c->s.pid, NULL, 0);
    c->s.pid = 0;
    uint64_t t0 = mono_ms();
    kvt_event a = wait_ev(c->e, 12), b = wait_ev(c->e, 13);
    uint64_t ms = mono_ms() - t0;
    fprintf(stderr, "server killed: failed after %llu ms: %s | %s\n", (unsigned long long)ms,
            a.reason, b.reason);
    /* Prompt by construction: the connections' reset fails them, not a
     * deadline (io_timeout_ms is 3 s here). */
    assert_true(a.code != ETIMEDOUT && b.code != ETIMEDOUT);
    char sid[128];
    desc_sid(c->s.desc, sid, sizeof sid);
    assert_int_equal(a.state, KVC_POLL_FAILED);
    assert_int_equal(b.state, KVC_POLL_FAILED);
    assert_non_null(strstr(a.reason, sid));
    assert_non_null(strstr(b.reason, sid));
    /* Nothing of ours is in use any more. */
    assert_int_equal(kvt_mr_deregister(c->e, c->local), KVC_OK);
    assert_int_equal(kvt_mr_register(c->e, c->local, REGION, NULL), KVC_OK);
}

/* A writer SIGKILLed while this engine copies from it: its writes fail
 * here (ESRCH or the connection's end), nothing hangs, the region can be
 * deregistered, and the next writer is served. */
static void test_writer_killed(void **state)
{
    (void)state;
    kvt_engine *srv_e = engine(0);
    unsigned char *buf = xu_map(REGION);
    assert_int_equal(kvt_mr_register(srv_e, buf, REGION, NULL), KVC_OK);
    char *desc;
    assert_int_equal(kvt_descriptor_export(srv_e, &desc), KVC_OK);
    /* a writer of the whole region, over and over */
    pid_t pid = xu_mover_start(srv_e, mover_engine, desc, desc_base(desc), REGION, 0);
    assert_true(pid > 0);
    kvt_stats st;
    assert_int_equal(kvt_engine_stat(srv_e, &st), KVC_OK);
    assert_true(st.same_host_bytes >= REGION);
    kill(pid, SIGKILL); /* while its next writes are in flight */
    waitpid(pid, NULL, 0);
    assert_int_equal(xu_deregister_settled(srv_e, buf), KVC_OK);
    /* Both of its connections end: the one copying may see the end (reset)
     * a progress call after the region is free (no time limit: ctest's
     * TIMEOUT names a hang). */
    for (;;) {
        assert_int_equal(kvt_engine_stat(srv_e, &st), KVC_OK);
        if (!st.conns_up)
            break;
        kvt_event ev[4];
        size_t n;
        assert_int_equal(kvt_progress(srv_e, 50, ev, 4, &n), KVC_OK);
    }
    free(desc);
    kvt_engine_destroy(srv_e);
    munmap(buf, REGION);
}

/* The server restarted at the same port, its region elsewhere and an
 * unregistered mapping at the old addresses: a write with the old
 * descriptor fails (ESTALE), nothing is written at the old addresses nor
 * in the new region; with the new descriptor the write lands by copy. */
static void test_restarted_peer(void **state)
{
    ctx *c = *state;
    scattered(c, true, 4096, 4, 20); /* connections up, same host */
    char sid[128];
    desc_sid(c->s.desc, sid, sizeof sid);
    srv_stop(&c->s);
    srv_start(&c->s, sid, 12, 0, c->rbase); /* decoy at the old region */
    uint64_t nbase = desc_base(c->s.desc);
    assert_true(nbase != c->rbase);
    for (int i = 0; i < 4; i++) { /* the old connections' end is seen */
        kvt_event ev[4];
        size_t n;
        kvt_progress(c->e, 20, ev, 4, &n);
    }
    srep r0 = srv_query(&c->s);
    xu_fill(c->local, REGION, 5);
    kvt_run w = {(uint64_t)(uintptr_t)c->local, c->rbase, 1u << 20};
    assert_int_equal(kvt_submit(c->e, c->peer, 21, &w, 1, 0), KVC_OK);
    kvt_event ev = wait_ev(c->e, 21);
    assert_int_equal(ev.state, KVC_POLL_FAILED);
    assert_int_equal(ev.code, ESTALE);
    assert_non_null(strstr(ev.reason, "restarted"));
    srep r1 = srv_query(&c->s);
    assert_true(r1.decoy_sum == r0.decoy_sum);
    assert_true(r1.sum == r0.sum);
    assert_int_equal(r1.st.same_host_bytes, 0);
    /* The new descriptor: the write lands in the new region, by copy. */
    char *fresh = NULL;
    assert_int_equal(kvt_descriptor_fetch(sid, NULL, 5000, &fresh), KVC_OK);
    kvt_peer *p;
    assert_int_equal(kvt_peer_import(c->e, fresh, strlen(fresh), &p), KVC_OK);
    free(fresh);
    w.raddr = nbase;
    assert_int_equal(kvt_submit(c->e, p, 22, &w, 1, 0), KVC_OK);
    ev = wait_ev(c->e, 22);
    if (ev.state != KVC_POLL_SUCCESS)
        fail_msg("write after the new descriptor: %s", ev.reason);
    srep r2 = srv_query(&c->s);
    assert_true(r2.decoy_sum == r0.decoy_sum);
    assert_int_equal(r2.st.same_host_bytes, 1u << 20);
    unsigned char *want = xu_map(REGION);
    xu_fill(want, REGION, 12);
    memcpy(want, c->local, 1u << 20);
    assert_true(r2.sum == xu_sum(want, REGION));
    munmap(want, REGION);
}

/* KVCOORD_FORCE_SOCKET on this side, then force_socket on the server's:
 * the bytes go through the socket (no copy counted anywhere), still right. */
static void test_force_socket(void **state)
{
    (void)state;
    ctx c;
    setenv("KVCOORD_FORCE_SOCKET", "1", 1);
    ctx_open(&c, 0, 0);
    unsetenv("KVCOORD_FORCE_SOCKET");
    uint64_t bytes = scattered(&c, true, 64u << 10, 256, 30);
    bytes += scattered(&c, false, 4096, 512, 31);
    kvt_stats st;
    assert_int_equal(kvt_engine_stat(c.e, &st), KVC_OK);
    assert_int_equal(st.same_host_bytes, 0);
    assert_int_equal(st.bytes_sent + st.bytes_read, bytes);
    assert_int_equal(same_host_conns(&c), 0);
    assert_int_equal(srv_query(&c.s).st.same_host_bytes, 0);
    ctx_close(&c);
}

static void test_force_socket_server(void **state)
{
    (void)state;
    ctx cc, *c = &cc;
    ctx_open(c, SRV_FORCE, 0);
    uint64_t bytes = scattered(c, true, 4096, 256, 32);
    bytes += scattered(c, false, 64u << 10, 64, 33);
    kvt_stats st;
    assert_int_equal(kvt_engine_stat(c->e, &st), KVC_OK);
    assert_int_equal(st.same_host_bytes, 0);
    assert_int_equal(st.bytes_sent + st.bytes_read, bytes);
    assert_int_equal(same_host_conns(c), 0);
    assert_int_equal(srv_query(&c->s).st.same_host_bytes, 0);
    assert_int_equal(nwarned, 0); /* a choice, not a refusal */
    ctx_close(c);
}

/* The server runs as nobody: it may not read this (root's) process, so
 * its check of us fails with EPERM; the connections fall back to the
 * socket, logged once, and the bytes are still right. */
static void test_eperm_fallback(void **state)
{
    (void)state;
    if (getuid() != 0)
        skip(); /* needs root to become nobody */
    ctx cc, *c = &cc;
    ctx_open(c, SRV_NOBODY, 0);
    uint64_t bytes = scattered(c, true, 4096, 1024, 40);
    bytes += scattered(c, false, 64u << 10, 256, 41);
    kvt_stats st;
    assert_int_equal(kvt_engine_stat(c->e, &st), KVC_OK);
    fprintf(stderr, "fallback: %d line(s): %s\n", nwarned, warned);
    assert_int_equal(st.same_host_bytes, 0);
    assert_int_equal(st.bytes_sent + st.bytes_read, bytes);
    assert_true(st.same_host_fallbacks >= 1);
    assert_int_equal(same_host_conns(c), 0);
    assert_int_equal(nwarned, 1); /* once per peer, whatever the connections */
    assert_non_null(strstr(warned, "EPERM"));
    char sid[128];
    assert_non_null(strstr(warned, desc_sid(c->s.desc, sid, sizeof sid)));
    srep r = srv_query(&c->s);
    assert_int_equal(r.st.same_host_bytes, 0);
    assert_true(r.st.same_host_fallbacks >= 1);
    ctx_close(c);
}

/* The server's copies start failing (EPERM by seccomp) after the copy
 * was negotiated and used: the writes go on through the socket on the same
 * connections, every room succeeds with the bytes right, the server logs
 * it once; a write outside its regions is still refused. */
static void test_copy_fails_later_write(void **state)
{
    ctx *c = *state;
    scattered(c, true, 64u << 10, 64, 50);
    srep r0 = srv_query(&c->s);
    assert_true(r0.st.same_host_bytes >= (64u << 20) / 16);
    srep r1 = srv_cmd(&c->s, "s");
    assert_int_equal(r1.st.same_host_fallbacks, 0);
    uint64_t before = r1.st.bytes_recv;
    uint64_t bytes = scattered(c, true, 4096, 512, 51);
    bytes += scattered(c, true, 64u << 10, 64, 52);
    bytes += scattered(c, true, 1u << 20, 4, 53);
    srep r = srv_query(&c->s);
    assert_int_equal(r.st.same_host_bytes, r0.st.same_host_bytes); /* none copied since */
    assert_int_equal(r.st.bytes_recv - before, bytes);
    assert_true(r.st.same_host_fallbacks >= 1 && r.st.same_host_fallbacks <= 2); /* conns */
    assert_int_equal(r.fell_logs, 1);                                            /* once per peer */
    assert_int_equal(r.st.frames_refused, 0);
    /* Outside the server's regions: refused as ever, not retried. */
    kvt_run run = {(uint64_t)(uintptr_t)c->local, c->rbase + REGION - 4096, 8192};
    kvt_peer *p2;
    char *d2 = strdup(c->s.desc); /* a descriptor claiming a larger region */
    char *len = strstr(d2, "\"length\":");
    assert_non_null(len);
    char big[64];
    snprintf(big, sizeof big, "\"length\":%u", 2 * REGION);
    char *rest = strchr(len, ',') ? strchr(len, ',') : strchr(len, '}');
    char *d3 = malloc(strlen(d2) + 64);
    sprintf(d3, "%.*s%s%s", (int)(len - d2), d2, big, rest);
    assert_int_equal(kvt_peer_import(c->e, d3, strlen(d3), &p2), KVC_OK);
    assert_int_equal(kvt_submit(c->e, p2, 54, &run, 1, 0), KVC_OK);
    kvt_event ev = wait_ev(c->e, 54);
    assert_int_equal(ev.state, KVC_POLL_FAILED);
    if (!strstr(ev.reason, "outside every region"))
        fail_msg("reason: %s", ev.reason);
    free(d2);
    free(d3);
}

/* For a forked child, where a cmocka failure would run the rest of the
 * suite in it: n pages of `page` bytes (every other page) read from the
 * server into the same offsets here, checked against c->mirror.  The
 * bytes read, or 0 with the reason on stderr. */
static uint64_t child_read(ctx *c, uint32_t page, uint32_t n, uint64_t room)
{
    kvt_run *runs = calloc(n, sizeof *runs);
    if (!runs || (uint64_t)n * 2 * page > REGION)
        return 0;
    memset(c->local, 0, REGION);
    for (uint32_t i = 0; i < n; i++) {
        uint64_t off = (uint64_t)i * 2 * page;
        runs[i] = (kvt_run){(uint64_t)(uintptr_t)c->local + off, c->rbase + off, page};
    }
    kvc_err err = kvt_submit_read(c->e, c->peer, room, runs, n, 0);
    free(runs);
    kvt_event ev = {0};
    for (size_t k = 0; !err && ev.room != room;) {
        if (kvt_progress(c->e, 50, &ev, 1, &k))
            err = KVC_E_SYS;
        if (!k)
            ev.room = UINT64_MAX;
    }
    if (err || ev.state != KVC_POLL_SUCCESS) {
        fprintf(stderr, "child: room %llu: %s\n", (unsigned long long)room,
                err ? kvc_last_error() : ev.reason);
        return 0;
    }
    for (uint32_t i = 0; i < n; i++) {
        uint64_t off = (uint64_t)i * 2 * page;
        if (memcmp(c->local + off, c->mirror + off, page)) {
            fprintf(stderr, "child: room %llu: page %u differs\n", (unsigned long long)room, i);
            return 0;
        }
    }
    return (uint64_t)page * n;
}

/* This process's copies (its reads from the server) start failing after
 * the copy was used: the reads go on through the socket, bytes right.  In
 * a child: the seccomp filter cannot be taken off again. */
static void test_copy_fails_later_read(void **state)
{
    ctx *p = *state;
    pid_t pid = fork();
    if (pid == 0) { /* its own engine (none is used across fork) */
        ctx cc = *p, *c = &cc;
        c->e = engine(0);
        c->local = xu_map(REGION);
        if (kvt_mr_register(c->e, c->local, REGION, NULL) ||
            kvt_peer_import(c->e, c->s.desc, strlen(c->s.desc), &c->peer))
            _exit(9);
        kvt_stats st;
        uint64_t b = child_read(c, 64u << 10, 64, 60);
        if (!b || kvt_engine_stat(c->e, &st) || st.same_host_bytes < b)
            _exit(10);
        if (block_vm_readv())
            _exit(11);
        uint64_t b1 = child_read(c, 4096, 512, 61), b2 = child_read(c, 1u << 20, 4, 62);
        if (!b1 || !b2)
            _exit(15);
        b = b1 + b2;
        kvt_stats st2;
        if (kvt_engine_stat(c->e, &st2) || st2.same_host_bytes != st.same_host_bytes)
            _exit(12);
        if (st2.same_host_fallbacks < 1 || st2.bytes_read - st.bytes_read != b)
            _exit(13);
        if (nwarned != 1 || !strstr(warned, "EPERM"))
            _exit(14);
        _exit(0);
    }
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    if (!WIFEXITED(status) || WEXITSTATUS(status))
        fail_msg("reader child: status %#x (exit %d)", status, WEXITSTATUS(status));
}

/* ---- on the wire ---------------------------------------------------------------- */

static int raw_connect(const char *desc)
{
    char sid[128];
    desc_sid(desc, sid, sizeof sid);
    return xu_raw_connect(atoi(strrchr(sid, ':') + 1));
}

static void send_frame(int fd, uint8_t type, int32_t status, uint64_t seq, uint64_t addr,
                       const void *payload, uint32_t plen)
{
    kvt__frame f = {.type = type, .len = plen, .status = status, .seq = seq, .addr = addr};
    xu_raw_send(fd, &f, payload, plen);
}

/* HELLO offering the copy; the server's HELLO_OK must offer it too. */
static void raw_hello(int fd)
{
    kvt__hello h;
    memset(&h, 0, sizeof h);
    h.version = KVT_PROTOCOL_VERSION;
    h.flags = KVT_HELLO_F_CMA;
    h.generation = 7;
    snprintf(h.session_id, sizeof h.session_id, "127.0.0.1:1");
    uint8_t b[600];
    size_t n = kvt__hello_encode(&h, b, sizeof b);
    send_frame(fd, KVT_F_HELLO, 0, 0, 0, b, (uint32_t)n);
    kvt__frame f;
    char buf[1024];
    assert_int_equal(xu_raw_read(fd, &f, buf, sizeof buf), 0);
    assert_int_equal(f.type, KVT_F_HELLO_OK);
    assert_int_equal(kvt__hello_decode((const uint8_t *)buf, f.len, &h, buf, sizeof buf), 0);
    assert_true(h.flags & KVT_HELLO_F_CMA);
}

static uint64_t start_of(pid_t pid)
{
    char path[64], b[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    size_t n = fread(b, 1, sizeof b - 1, f);
    fclose(f);
    b[n] = '\0';
    char *p = strrchr(b, ')') + 1;
    for (int field = 3; field < 22; field++) {
        while (*p == ' ')
            p++;
        while (*p && *p != ' ')
            p++;
    }
    return strtoull(p, NULL, 10);
}

/* A CMA_WRITE with no negotiation: refused (ERROR), nothing written. */
static void test_wire_unproven(void **state)
{
    ctx *c = *state;
    srep r0 = srv_query(&c->s);
    int fd = raw_connect(c->s.desc);
    raw_hello(fd);
    uint8_t tab[KVT_CMA_ENT_LEN];
    kvt__put64(tab, c->rbase);
    kvt__put64(tab + 8, 4096);
    kvt__put64(tab + 16, (uint64_t)(uintptr_t)c->local);
    send_frame(fd, KVT_F_CMA_WRITE, 0, 1, 4096, tab, sizeof tab);
    kvt__frame f;
    char buf[4096];
    assert_int_equal(xu_raw_read(fd, &f, buf, sizeof buf), 0);
    assert_int_equal(f.type, KVT_F_ERROR);
    assert_non_null(strstr(buf, "not proven"));
    close(fd);
    srep r1 = srv_query(&c->s);
    assert_true(r1.sum == r0.sum);
    assert_int_equal(r1.st.same_host_bytes, 0);
}

/* The relay: a client names another process of this host as itself, and
 * that process even holds the server's nonce at the slot named (put there
 * here, as another engine would have been made to).  The server refuses:
 * that process does not hold the client's socket; a CMA_WRITE after is a
 * protocol error, nothing written. */
static void test_wire_relay_refused(void **state)
{
    ctx *c = *state;
    static uint8_t slot[16]; /* the same address in the forked decoy */
    pid_t decoy = fork();
    if (decoy == 0) {
        for (;;)
            pause();
    }
    srep r0 = srv_query(&c->s);
    int fd = raw_connect(c->s.desc);
    raw_hello(fd);
    uint8_t id[92];
    memset(id, 0, sizeof id);
    FILE *b = fopen("/proc/sys/kernel/random/boot_id", "r");
    assert_non_null(b);
    assert_int_equal(fread(id, 1, 36, b), 36);
    fclose(b);
    struct stat st;
    assert_int_equal(stat("/proc/self/ns/pid", &st), 0);
    kvt__put64(id + 36, (uint64_t)st.st_dev);
    kvt__put64(id + 44, (uint64_t)st.st_ino);
    kvt__put32(id + 52, (uint32_t)decoy);
    kvt__put64(id + 60, start_of(decoy));
    kvt__put64(id + 68, (uint64_t)(uintptr_t)slot);
    memset(id + 76, 0x5a, 16);
    send_frame(fd, KVT_F_CMA_HELLO, 0, 0, 0, id, sizeof id);
    kvt__frame f;
    char buf[4096];
    assert_int_equal(xu_raw_read(fd, &f, buf, sizeof buf), 0);
    assert_int_equal(f.type, KVT_F_CMA_HELLO);
    assert_int_equal(f.status, 0);
    assert_int_equal(f.len, 92);
    /* The server's nonce, into the decoy's slot. */
    struct iovec l = {buf + 76, 16}, r = {slot, 16};
    assert_int_equal(process_vm_writev(decoy, &l, 1, &r, 1, 0), 16);
    send_frame(fd, KVT_F_CMA_CHECK, 0, 0, 0, NULL, 0);
    assert_int_equal(xu_raw_read(fd, &f, buf, sizeof buf), 0);
    assert_int_equal(f.type, KVT_F_CMA_CHECK);
    assert_int_equal(f.status, EACCES);
    assert_non_null(strstr(buf, "does not hold the peer's end of the connection"));
    uint8_t tab[KVT_CMA_ENT_LEN];
    kvt__put64(tab, c->rbase);
    kvt__put64(tab + 8, 4096);
    kvt__put64(tab + 16, (uint64_t)(uintptr_t)slot);
    send_frame(fd, KVT_F_CMA_WRITE, 0, 1, 4096, tab, sizeof tab);
    assert_int_equal(xu_raw_read(fd, &f, buf, sizeof buf), 0);
    assert_int_equal(f.type, KVT_F_ERROR);
    close(fd);
    kill(decoy, SIGKILL);
    waitpid(decoy, NULL, 0);
    srep r1 = srv_query(&c->s);
    assert_true(r1.sum == r0.sum);
    assert_int_equal(r1.st.same_host_bytes, 0);
}

int main(int argc, char **argv)
{
    signal(SIGPIPE, SIG_IGN);
    if (argc > 1) /* one test by name */
        cmocka_set_test_filter(argv[1]);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_write_scattered, setup, teardown),
        cmocka_unit_test_setup_teardown(test_read_scattered, setup, teardown),
        cmocka_unit_test_setup_teardown(test_write_out_of_region, setup, teardown),
        cmocka_unit_test_setup_teardown(test_server_killed, setup, teardown),
        cmocka_unit_test(test_writer_killed),
        cmocka_unit_test_setup_teardown(test_restarted_peer, setup, teardown),
        cmocka_unit_test(test_force_socket),
        cmocka_unit_test(test_force_socket_server),
        cmocka_unit_test(test_eperm_fallback),
        cmocka_unit_test_setup_teardown(test_copy_fails_later_write, setup, teardown),
        cmocka_unit_test_setup_teardown(test_copy_fails_later_read, setup, teardown),
        cmocka_unit_test_setup_teardown(test_wire_unproven, setup, teardown),
        cmocka_unit_test_setup_teardown(test_wire_relay_refused, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
