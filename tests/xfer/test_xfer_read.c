/* test_xfer_read.c - kvt_submit_read over loopback TCP between real
 * processes: scattered pages on both sides (4 KiB x 1,024 and 64 KiB x
 * 256), a whole-buffer read, every byte checked by checksum; a read
 * outside the server's regions refused with nothing written here; a
 * server SIGKILLed mid-read and a reader SIGKILLed mid-read; deregistering
 * a region a read is using; a server restarted at the same port (ESTALE,
 * nothing written); per-room state not kept (KVT_SUBMIT_NOROOM). */
#include <pthread.h>
#include <sys/socket.h>

#include "testutil.h"
#include "xfer_conn.h"
#include "xfer_util.h"

#define REGION (32u << 20)

/* A serving process: one region of `bytes` filled with pattern seed. */
typedef struct srv {
    pid_t pid;
    int rd; /* reports (xu_report per event) */
    char *desc;
} srv;

static void srv_main(int fd, const char *listen, size_t bytes, uint64_t seed, const char *token,
                     uint32_t io_ms)
{
    kvt_options o;
    kvt_options_init(&o);
    o.backend = KVT_BACKEND_TCP;
    o.listen = listen;
    o.token = token;
    o.log = xu_quiet_log;
    if (io_ms)
        o.io_timeout_ms = io_ms;
    kvt_engine *e = xu_engine_create_retry(&o);
    unsigned char *buf = xu_map(bytes);
    if (!buf)
        _exit(2);
    xu_fill(buf, bytes, seed);
    xu_serve_region(e, buf, bytes, fd, 100, xu_report_events, &(xu_serving){fd, buf, bytes});
}

static void srv_start(srv *s, const char *listen, size_t bytes, uint64_t seed, const char *token)
{
    int p[2];
    assert_int_equal(pipe(p), 0);
    s->pid = fork();
    if (s->pid == 0) {
        close(p[0]);
        srv_main(p[1], listen, bytes, seed, token, 3000);
    }
    close(p[1]);
    s->rd = p[0];
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
    s->rd = -1;
    free(s->desc);
    s->desc = NULL;
}

static uint64_t desc_base(const char *desc)
{
    const char *a = strstr(desc, "\"addr\":");
    return a ? strtoull(a + 7, NULL, 10) : 0;
}

static uint64_t desc_gen(const char *desc)
{
    const char *a = strstr(desc, "\"generation\":");
    return a ? strtoull(a + 13, NULL, 10) : 0;
}

static const char *desc_sid(const char *desc, char *out, size_t cap)
{
    const char *a = strstr(desc, "\"session_id\":\"");
    assert_non_null(a);
    a += 14;
    size_t n = strcspn(a, "\"");
    snprintf(out, cap, "%.*s", (int)n, a);
    return out;
}

/* Events that arrived while another room's was awaited. */
static kvt_event stash[64];
static size_t nstash;

static kvt_event wait_ev(kvt_engine *e, uint64_t room)
{
    for (int waited = 0; waited < 30000; waited += 50) {
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
    fail_msg("no event for room %llu", (unsigned long long)room);
    return stash[0];
}

typedef struct ctx {
    srv s;
    kvt_engine *e;
    kvt_peer *peer;
    unsigned char *local, *mirror; /* mirror: the server's pattern */
    uint64_t rbase;
} ctx;

static kvt_engine *engine(uint32_t io_ms)
{
    kvt_engine *e = xu_sender(NULL, 0, 2, io_ms);
    assert_non_null(e);
    return e;
}

static kvt_engine *mover_engine(void) { return engine(0); }

static int setup(void **state)
{
    ctx *c = calloc(1, sizeof *c);
    nstash = 0;
    srv_start(&c->s, "127.0.0.1:0", REGION, 11, NULL);
    c->e = engine(3000);
    c->local = xu_map(REGION);
    c->mirror = xu_map(REGION);
    xu_fill(c->mirror, REGION, 11);
    assert_int_equal(kvt_mr_register(c->e, c->local, REGION, NULL), KVC_OK);
    assert_int_equal(kvt_peer_import(c->e, c->s.desc, strlen(c->s.desc), &c->peer), KVC_OK);
    c->rbase = desc_base(c->s.desc);
    *state = c;
    return 0;
}

static int teardown(void **state)
{
    ctx *c = *state;
    kvt_engine_destroy(c->e);
    srv_stop(&c->s);
    munmap(c->local, REGION);
    munmap(c->mirror, REGION);
    free(c);
    return 0;
}

/* n pages of `page` bytes, every other page of both regions, in a random
 * order on each side: nothing an engine could merge. */
static void scattered(ctx *c, uint32_t page, uint32_t n, uint64_t room)
{
    kvt_run *runs = calloc(n, sizeof *runs);
    assert_int_equal(xu_scatter(runs, n, page, REGION, (uintptr_t)c->local, c->rbase, room), 0);
    unsigned char *want = xu_map(REGION);
    memcpy(want, c->local, REGION);
    for (uint32_t i = 0; i < n; i++)
        memcpy(want + (runs[i].laddr - (uintptr_t)c->local), c->mirror + (runs[i].raddr - c->rbase),
               page);
    assert_int_equal(kvt_submit_read(c->e, c->peer, room, runs, n, 0), KVC_OK);
    kvt_event ev = wait_ev(c->e, room);
    if (ev.state != KVC_POLL_SUCCESS)
        fail_msg("read room %llu failed: %s", (unsigned long long)room, ev.reason);
    assert_int_equal(ev.side, KVT_SIDE_READER);
    assert_int_equal(ev.bytes, (uint64_t)page * n);
    assert_true(xu_sum(c->local, REGION) == xu_sum(want, REGION));
    munmap(want, REGION);
    free(runs);
}

static void test_scattered_4k(void **state) { scattered(*state, 4096, 1024, 1); }

static void test_scattered_64k(void **state) { scattered(*state, 64u << 10, 256, 2); }

static void test_whole_buffer(void **state)
{
    ctx *c = *state;
    kvt_run run = {(uint64_t)(uintptr_t)c->local, c->rbase, REGION};
    assert_int_equal(kvt_submit_read(c->e, c->peer, 3, &run, 1, 0), KVC_OK);
    kvt_event ev = wait_ev(c->e, 3);
    assert_int_equal(ev.state, KVC_POLL_SUCCESS);
    assert_int_equal(ev.bytes, REGION);
    assert_true(xu_sum(c->local, REGION) == xu_sum(c->mirror, REGION));
    kvt_stats st;
    assert_int_equal(kvt_engine_stat(c->e, &st), KVC_OK);
    assert_true(st.bytes_read >= REGION);
}

/* Scattered writes (WRITEV frames: 256 runs each) then read back: the
 * server's region holds exactly what was written where it was written. */
static void test_write_then_read(void **state)
{
    ctx *c = *state;
    enum { N = 256, PG = 64 << 10 };
    xu_fill(c->local, REGION, 21);
    kvt_run w[N], r[N];
    assert_int_equal(xu_scatter(w, N, PG, REGION, (uintptr_t)c->local, c->rbase, 8), 0);
    for (uint32_t i = 0; i < N; i++)
        memcpy(c->mirror + (w[i].raddr - c->rbase), c->local + (w[i].laddr - (uintptr_t)c->local),
               PG);
    assert_int_equal(kvt_submit(c->e, c->peer, 50, w, N, 0), KVC_OK);
    kvt_event ev = wait_ev(c->e, 50);
    if (ev.state != KVC_POLL_SUCCESS)
        fail_msg("write room failed: %s", ev.reason);
    assert_int_equal(ev.bytes, (uint64_t)N * PG);
    /* The whole server region back into local memory: the mirror. */
    for (uint32_t i = 0; i < N; i++)
        r[i] = (kvt_run){(uint64_t)(uintptr_t)c->local + (uint64_t)i * (REGION / N),
                         c->rbase + (uint64_t)i * (REGION / N), REGION / N};
    assert_int_equal(kvt_submit_read(c->e, c->peer, 51, r, N, 0), KVC_OK);
    assert_int_equal(wait_ev(c->e, 51).state, KVC_POLL_SUCCESS);
    assert_true(xu_sum(c->local, REGION) == xu_sum(c->mirror, REGION));
}

/* A WRITEV with one run outside the server's regions: the whole frame is
 * refused (EFAULT, naming the range), nothing of it is written there. */
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
    xu_fill(c->local, REGION, 31);
    kvt_run w[3] = {{(uint64_t)(uintptr_t)c->local, c->rbase, 4096},
                    {(uint64_t)(uintptr_t)c->local + 8192, c->rbase + REGION + 4096, 4096},
                    {(uint64_t)(uintptr_t)c->local + 65536, c->rbase + 65536, 4096}};
    assert_int_equal(kvt_submit(c->e, p, 52, w, 3, 0), KVC_OK);
    kvt_event ev = wait_ev(c->e, 52);
    assert_int_equal(ev.state, KVC_POLL_FAILED);
    assert_int_equal(ev.code, EFAULT);
    assert_non_null(strstr(ev.reason, "outside every region"));
    char sid[128];
    assert_non_null(strstr(ev.reason, desc_sid(c->s.desc, sid, sizeof sid)));
    /* The server's region is still its pattern (read it back). */
    kvt_run r = {(uint64_t)(uintptr_t)c->local, c->rbase, 1u << 20};
    assert_int_equal(kvt_submit_read(c->e, p, 53, &r, 1, 0), KVC_OK);
    assert_int_equal(wait_ev(c->e, 53).state, KVC_POLL_SUCCESS);
    assert_true(memcmp(c->local, c->mirror, 1u << 20) == 0);
}

/* Checked here first: nothing sent, the run named. */
static void test_bad_runs(void **state)
{
    ctx *c = *state;
    kvt_run run = {(uint64_t)(uintptr_t)c->mirror, c->rbase, 4096};
    assert_int_equal(kvt_submit_read(c->e, c->peer, 4, &run, 1, 0), KVC_E_INVAL);
    assert_non_null(strstr(kvc_last_error(), "run 0: local range"));
    run = (kvt_run){(uint64_t)(uintptr_t)c->local, c->rbase + REGION, 4096};
    assert_int_equal(kvt_submit_read(c->e, c->peer, 4, &run, 1, 0), KVC_E_INVAL);
    assert_non_null(strstr(kvc_last_error(), "run 0: remote range"));
    assert_int_equal(kvt_submit_read(c->e, c->peer, 4, &run, 1, 0x80), KVC_E_INVAL);
}

/* The server refuses a run outside its regions (our descriptor claims a
 * larger region): the whole request is refused, nothing written here. */
static void test_out_of_region(void **state)
{
    ctx *c = *state;
    char *d = strdup(c->s.desc);
    char *len = strstr(d, "\"length\":");
    assert_non_null(len);
    char buf[4096];
    snprintf(buf, sizeof buf, "%.*s\"length\":%u%s", (int)(len - d), d, 2 * REGION,
             len + 9 + strspn(len + 9, "0123456789"));
    kvt_peer *p;
    assert_int_equal(kvt_peer_import(c->e, buf, strlen(buf), &p), KVC_OK);
    free(d);
    xu_fill(c->local, REGION, 99);
    uint64_t before = xu_sum(c->local, REGION);
    kvt_run runs[3] = {{(uint64_t)(uintptr_t)c->local, c->rbase, 4096},
                       {(uint64_t)(uintptr_t)c->local + 8192, c->rbase + REGION + 4096, 4096},
                       {(uint64_t)(uintptr_t)c->local + 65536, c->rbase + 65536, 65536}};
    assert_int_equal(kvt_submit_read(c->e, p, 5, runs, 3, 0), KVC_OK);
    kvt_event ev = wait_ev(c->e, 5);
    assert_int_equal(ev.state, KVC_POLL_FAILED);
    assert_int_equal(ev.side, KVT_SIDE_READER);
    assert_int_equal(ev.code, EFAULT);
    char sid[128];
    assert_non_null(strstr(ev.reason, desc_sid(c->s.desc, sid, sizeof sid)));
    assert_non_null(strstr(ev.reason, "outside every region"));
    assert_non_null(strstr(ev.reason, "read"));
    assert_true(xu_sum(c->local, REGION) == before);
    /* The connection stays usable: a good read after. */
    kvt_run ok = {(uint64_t)(uintptr_t)c->local, c->rbase, 1u << 20};
    assert_int_equal(kvt_submit_read(c->e, p, 6, &ok, 1, 0), KVC_OK);
    assert_int_equal(wait_ev(c->e, 6).state, KVC_POLL_SUCCESS);
    assert_true(memcmp(c->local, c->mirror, 1u << 20) == 0);
}

/* A region a read is going into cannot be deregistered until its event. */
static void test_deregister_busy(void **state)
{
    ctx *c = *state;
    kvt_run run = {(uint64_t)(uintptr_t)c->local, c->rbase, REGION};
    assert_int_equal(kvt_submit_read(c->e, c->peer, 7, &run, 1, 0), KVC_OK);
    assert_int_equal(kvt_mr_deregister(c->e, c->local), KVC_E_BUSY);
    assert_int_equal(wait_ev(c->e, 7).state, KVC_POLL_SUCCESS);
    assert_int_equal(kvt_mr_deregister(c->e, c->local), KVC_OK);
    assert_int_equal(kvt_mr_register(c->e, c->local, REGION, NULL), KVC_OK);
}

/* The server SIGKILLed mid-read: the room fails naming the peer; another
 * server is unaffected. */
static void test_server_killed(void **state)
{
    ctx *c = *state;
    srv other;
    srv_start(&other, "127.0.0.1:0", 1u << 20, 5, NULL);
    kvt_peer *p2;
    assert_int_equal(kvt_peer_import(c->e, other.desc, strlen(other.desc), &p2), KVC_OK);
    kill(c->s.pid, SIGSTOP); /* requests go out, no answer comes */
    kvt_run run = {(uint64_t)(uintptr_t)c->local, c->rbase, REGION};
    for (uint64_t room = 10; room < 14; room++)
        assert_int_equal(kvt_submit_read(c->e, c->peer, room, &run, 1, 0), KVC_OK);
    kvt_event ev;
    size_t n;
    assert_int_equal(kvt_progress(c->e, 200, &ev, 1, &n), KVC_OK);
    assert_int_equal(n, 0);
    kill(c->s.pid, SIGKILL);
    waitpid(c->s.pid, NULL, 0);
    c->s.pid = 0;
    uint64_t t0 = kvc__mono_ns();
    ev = wait_ev(c->e, 10);
    uint64_t ms = (kvc__mono_ns() - t0) / 1000000;
    assert_int_equal(ev.state, KVC_POLL_FAILED);
    assert_int_equal(ev.side, KVT_SIDE_READER);
    assert_true(ev.code != 0);
    char sid[128];
    assert_non_null(strstr(ev.reason, desc_sid(c->s.desc, sid, sizeof sid)));
    assert_true(strncmp(ev.reason, "read", 4) == 0);
    fprintf(stderr, "server killed: failed after %llu ms: %s\n", (unsigned long long)ms, ev.reason);
    for (uint64_t room = 11; room < 14; room++)
        assert_int_equal(wait_ev(c->e, room).state, KVC_POLL_FAILED);
    /* Another peer: unaffected. */
    kvt_run r2 = {(uint64_t)(uintptr_t)c->local, desc_base(other.desc), 1u << 20};
    assert_int_equal(kvt_submit_read(c->e, p2, 15, &r2, 1, 0), KVC_OK);
    assert_int_equal(wait_ev(c->e, 15).state, KVC_POLL_SUCCESS);
    unsigned char *want = xu_map(1u << 20);
    xu_fill(want, 1u << 20, 5);
    assert_true(memcmp(c->local, want, 1u << 20) == 0);
    munmap(want, 1u << 20);
    /* Nothing of the failed rooms is still being received: deregistering
     * works now. */
    assert_int_equal(kvt_mr_deregister(c->e, c->local), KVC_OK);
    srv_stop(&other);
}

/* A server stopped (not dead) fails the room by the io deadline. */
static void test_server_stalled(void **state)
{
    ctx *c = *state;
    kvt_run run = {(uint64_t)(uintptr_t)c->local, c->rbase, REGION};
    assert_int_equal(kvt_submit_read(c->e, c->peer, 19, &run, 1, 0), KVC_OK);
    assert_int_equal(wait_ev(c->e, 19).state, KVC_POLL_SUCCESS); /* connections up */
    kill(c->s.pid, SIGSTOP);
    assert_int_equal(kvt_submit_read(c->e, c->peer, 20, &run, 1, 0), KVC_OK);
    kvt_event ev = wait_ev(c->e, 20);
    kill(c->s.pid, SIGCONT);
    fprintf(stderr, "server stalled: %s\n", ev.reason);
    assert_int_equal(ev.state, KVC_POLL_FAILED);
    assert_int_equal(ev.code, ETIMEDOUT);
    assert_non_null(strstr(ev.reason, "read to peer"));
    assert_non_null(strstr(ev.reason, "waiting for read data"));
}

/* The reader SIGKILLed mid-read: the server drops the connection, its
 * regions are released (deregister works), and it serves the next. */
static void test_reader_killed(void **state)
{
    (void)state;
    kvt_engine *srv_e = engine(2000);
    unsigned char *buf = xu_map(REGION);
    xu_fill(buf, REGION, 3);
    assert_int_equal(kvt_mr_register(srv_e, buf, REGION, NULL), KVC_OK);
    char *desc;
    assert_int_equal(kvt_descriptor_export(srv_e, &desc), KVC_OK);
    /* reader: reads the region over and over */
    pid_t pid = xu_mover_start(srv_e, mover_engine, desc, desc_base(desc), REGION, 1);
    assert_true(pid > 0);
    for (int i = 0; i < 3; i++) { /* mid-transfer of the next rooms */
        kvt_event ev[4];
        size_t n;
        kvt_progress(srv_e, 10, ev, 4, &n);
    }
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    assert_int_equal(xu_deregister_settled(srv_e, buf), KVC_OK);
    kvt_stats st;
    assert_int_equal(kvt_engine_stat(srv_e, &st), KVC_OK);
    assert_true(st.reads_served >= 2);
    assert_int_equal(st.conns_up, 0);
    free(desc);
    kvt_engine_destroy(srv_e);
    munmap(buf, REGION);
}

/* The server restarted at the same port: ESTALE, nothing written there
 * (write) or here (read); after fetching the new descriptor it works. */
static void test_restarted_peer(void **state)
{
    ctx *c = *state;
    kvt_run run = {(uint64_t)(uintptr_t)c->local, c->rbase, 1u << 20};
    assert_int_equal(kvt_submit_read(c->e, c->peer, 30, &run, 1, 0), KVC_OK);
    assert_int_equal(wait_ev(c->e, 30).state, KVC_POLL_SUCCESS);
    char sid[128], listen[160];
    desc_sid(c->s.desc, sid, sizeof sid);
    snprintf(listen, sizeof listen, "%s", sid);
    uint64_t old_gen = desc_gen(c->s.desc);
    srv_stop(&c->s);
    srv_start(&c->s, listen, REGION, 12, NULL); /* same port, new generation */
    assert_true(desc_gen(c->s.desc) != old_gen);
    for (int i = 0; i < 4; i++) { /* the old connections' end is seen */
        kvt_event ev[4];
        size_t n;
        kvt_progress(c->e, 20, ev, 4, &n);
    }
    xu_fill(c->local, REGION, 77);
    uint64_t before = xu_sum(c->local, REGION);
    assert_int_equal(kvt_submit_read(c->e, c->peer, 31, &run, 1, 0), KVC_OK);
    kvt_event ev = wait_ev(c->e, 31);
    assert_int_equal(ev.state, KVC_POLL_FAILED);
    assert_int_equal(ev.code, ESTALE);
    assert_non_null(strstr(ev.reason, "restarted"));
    assert_non_null(strstr(ev.reason, "fetch its descriptor again"));
    assert_non_null(strstr(ev.reason, sid));
    assert_true(xu_sum(c->local, REGION) == before);
    /* A write to the old addresses: refused while the mark lasts, then
     * (new descriptor) allowed at the new ones only. */
    kvt_run w = {(uint64_t)(uintptr_t)c->local, c->rbase, 4096};
    assert_int_equal(kvt_submit(c->e, c->peer, 32, &w, 1, 0), KVC_E_BUSY);
    char *fresh = NULL;
    assert_int_equal(kvt_descriptor_fetch(sid, NULL, 5000, &fresh), KVC_OK);
    assert_int_equal(desc_gen(fresh), desc_gen(c->s.desc));
    kvt_peer *p;
    assert_int_equal(kvt_peer_import(c->e, fresh, strlen(fresh), &p), KVC_OK);
    assert_ptr_equal(p, c->peer);
    free(fresh);
    c->rbase = desc_base(c->s.desc);
    xu_fill(c->mirror, REGION, 12);
    run.raddr = c->rbase;
    assert_int_equal(kvt_submit_read(c->e, c->peer, 33, &run, 1, 0), KVC_OK);
    assert_int_equal(wait_ev(c->e, 33).state, KVC_POLL_SUCCESS);
    assert_true(memcmp(c->local, c->mirror, 1u << 20) == 0);
}

/* The same, for a write: the restarted server's region stays as it was. */
static void test_restarted_peer_write(void **state)
{
    ctx *c = *state;
    char sid[128];
    desc_sid(c->s.desc, sid, sizeof sid);
    srv_stop(&c->s);
    srv_start(&c->s, sid, REGION, 11, NULL);
    kvt_run w = {(uint64_t)(uintptr_t)c->local, c->rbase, 1u << 20};
    assert_int_equal(kvt_submit(c->e, c->peer, 40, &w, 1, 0), KVC_OK);
    kvt_event ev = wait_ev(c->e, 40);
    assert_int_equal(ev.state, KVC_POLL_FAILED);
    assert_int_equal(ev.code, ESTALE);
    /* The server got no room: no report; its region is its pattern. */
    struct pollfd pf = {c->s.rd, POLLIN, 0};
    assert_int_equal(poll(&pf, 1, 300), 0);
}

/* KVT_SUBMIT_NOROOM: nothing in the segment, nothing kept per room. */
static void test_noroom(void **state)
{
    ctx *c = *state;
    const char *name = tu_name();
    kvc_options so = tu_options(name, KVC_OPEN_FRESH, KVC_ROLE_CLIENT);
    so.world_size = 1;
    kvc_segment *seg = tu_open_with(&so);
    kvt_engine *e = xu_sender(seg, 0, 2, 0);
    assert_non_null(e);
    assert_int_equal(kvt_mr_register(e, c->local, REGION, NULL), KVC_OK);
    kvt_peer *p;
    assert_int_equal(kvt_peer_import(e, c->s.desc, strlen(c->s.desc), &p), KVC_OK);
    for (uint64_t room = 1000; room < 3000; room++) {
        kvt_run run = {(uint64_t)(uintptr_t)c->local + (room % 64) * 4096,
                       c->rbase + (room % 100) * 4096, 4096};
        assert_int_equal(kvt_submit_read(e, p, room, &run, 1, KVT_SUBMIT_NOROOM), KVC_OK);
        assert_int_equal(wait_ev(e, room).state, KVC_POLL_SUCCESS);
        assert_null(p->rooms); /* freed with its event */
    }
    kvc_room_info ri;
    assert_int_equal(kvc_room_get(seg, 1500, 0, &ri), KVC_E_NOENT);
    /* Without the flag the room is recorded (decode side). */
    kvt_run run = {(uint64_t)(uintptr_t)c->local, c->rbase, 4096};
    assert_int_equal(kvt_submit_read(e, p, 5, &run, 1, 0), KVC_OK);
    assert_int_equal(wait_ev(e, 5).state, KVC_POLL_SUCCESS);
    assert_int_equal(kvc_room_get(seg, 5, 0, &ri), KVC_OK);
    assert_int_equal(ri.state, KVC_POLL_SUCCESS);
    kvt_engine_destroy(e);
    kvc_close(seg);
    kvc_unlink(name);
}

int main(int argc, char **argv)
{
    signal(SIGPIPE, SIG_IGN);
    if (argc > 1) /* one test by name */
        cmocka_set_test_filter(argv[1]);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_scattered_4k, setup, teardown),
        cmocka_unit_test_setup_teardown(test_scattered_64k, setup, teardown),
        cmocka_unit_test_setup_teardown(test_whole_buffer, setup, teardown),
        cmocka_unit_test_setup_teardown(test_write_then_read, setup, teardown),
        cmocka_unit_test_setup_teardown(test_write_out_of_region, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bad_runs, setup, teardown),
        cmocka_unit_test_setup_teardown(test_out_of_region, setup, teardown),
        cmocka_unit_test_setup_teardown(test_deregister_busy, setup, teardown),
        cmocka_unit_test_setup_teardown(test_server_killed, setup, teardown),
        cmocka_unit_test_setup_teardown(test_server_stalled, setup, teardown),
        cmocka_unit_test(test_reader_killed),
        cmocka_unit_test_setup_teardown(test_restarted_peer, setup, teardown),
        cmocka_unit_test_setup_teardown(test_restarted_peer_write, setup, teardown),
        cmocka_unit_test_setup_teardown(test_noroom, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
