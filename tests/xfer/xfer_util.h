/* xfer_util.h - helpers shared by the transfer engine's tests: a receiver
 * process, pipes for descriptors and results, patterns and checksums. */
#ifndef KVC_XFER_UTIL_H
#define KVC_XFER_UTIL_H

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kvcoord/kvcoord.h"
#include "kvcoord/transfer.h"

/* 64-bit checksum of n bytes (n multiple of 8 not required). */
static inline uint64_t xu_sum(const void *p, size_t n)
{
    const unsigned char *b = p;
    uint64_t h = 0x9e3779b97f4a7c15ull;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, b + i, 8);
        h = (h ^ w) * 0x100000001b3ull;
        h ^= h >> 29;
    }
    for (; i < n; i++)
        h = (h ^ b[i]) * 0x100000001b3ull;
    return h ^ n;
}

/* Deterministic pattern: byte i of stream seed. */
static inline void xu_fill(void *p, size_t n, uint64_t seed)
{
    uint64_t x = seed * 0x2545f4914f6cdd1dull + 1;
    unsigned char *b = p;
    for (size_t i = 0; i < n; i += 8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        memcpy(b + i, &x, n - i < 8 ? n - i : 8);
    }
}

/* v[0..n) := a permutation of 0..n-1, shuffled by stream seed. */
static inline void xu_shuffle(uint32_t *v, uint32_t n, uint64_t seed)
{
    for (uint32_t i = 0; i < n; i++)
        v[i] = i;
    uint64_t x = seed * 0x9e3779b97f4a7c15ull + 1;
    for (uint32_t i = n - 1; i > 0; i--) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        uint32_t j = (uint32_t)(x % (i + 1));
        uint32_t t = v[i];
        v[i] = v[j];
        v[j] = t;
    }
}

/* runs[0..n) := n runs of `page` bytes, every other page of a local and a
 * remote region of `region` bytes each (at laddr, raddr), in a random
 * order on each side (seeds seed, seed + 1): nothing an engine could
 * merge.  n must be at most region / page / 2; returns -1 if not. */
static inline int xu_scatter(kvt_run *runs, uint32_t n, uint32_t page, uint64_t region,
                             uint64_t laddr, uint64_t raddr, uint64_t seed)
{
    uint32_t slots = (uint32_t)(region / page / 2);
    if (n > slots)
        return -1;
    uint32_t *pl = malloc(slots * sizeof *pl), *pr = malloc(slots * sizeof *pr);
    if (!pl || !pr)
        abort();
    xu_shuffle(pl, slots, seed);
    xu_shuffle(pr, slots, seed + 1);
    for (uint32_t i = 0; i < n; i++)
        runs[i] =
            (kvt_run){laddr + (uint64_t)pl[i] * 2 * page, raddr + (uint64_t)pr[i] * 2 * page, page};
    free(pl);
    free(pr);
    return 0;
}

static inline void *xu_map(size_t n)
{
    void *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

static inline int xu_write_all(int fd, const void *p, size_t n)
{
    const char *c = p;
    while (n) {
        ssize_t k = write(fd, c, n);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return -1;
        c += k;
        n -= (size_t)k;
    }
    return 0;
}

/* Read exactly n bytes within timeout_ms (-1: no limit; a child's pipe ends
 * with EOF when the child dies, and ctest's TIMEOUT catches a hang); 0 ok,
 * -1 EOF/error/timeout. */
static inline int xu_read_all(int fd, void *p, size_t n, int timeout_ms)
{
    char *c = p;
    while (n) {
        struct pollfd pf = {fd, POLLIN, 0};
        int r = poll(&pf, 1, timeout_ms);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return -1;
        ssize_t k = read(fd, c, n);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return -1;
        c += k;
        n -= (size_t)k;
    }
    return 0;
}

/* Length-prefixed string over a pipe (malloc()ed; NULL on failure). */
static inline int xu_send_str(int fd, const char *s)
{
    uint32_t n = (uint32_t)strlen(s);
    return xu_write_all(fd, &n, 4) || xu_write_all(fd, s, n) ? -1 : 0;
}
static inline char *xu_recv_str(int fd, int timeout_ms)
{
    uint32_t n;
    if (xu_read_all(fd, &n, 4, timeout_ms) || n > (64u << 20))
        return NULL;
    char *s = malloc(n + 1);
    if (!s || xu_read_all(fd, s, n, timeout_ms)) {
        free(s);
        return NULL;
    }
    s[n] = '\0';
    return s;
}

/* A receiver's report of one room's event. */
typedef struct xu_report {
    uint64_t room;
    int32_t state, code;
    uint64_t bytes;
    uint64_t sum; /* checksum of the receiver's whole region after the event */
    char peer[256];
    char reason[256];
} xu_report;

typedef struct xu_receiver {
    pid_t pid;
    int rd;     /* reports from the receiver */
    char *desc; /* its descriptor */
} xu_receiver;

static void xu_quiet_log(void *ctx, int level, const char *msg)
{
    (void)ctx;
    if (getenv("XU_VERBOSE") || level <= KVT_LOG_ERROR)
        fprintf(stderr, "[%d] %s\n", (int)getpid(), msg);
}

/* Child side: the engine of o, retrying EADDRINUSE every 50 ms for up to
 * 10 s (a restart at a killed server's port: its io_uring holds the
 * listening socket until the process is reaped); any other error, or a
 * port still busy, ends the child with status 2. */
static inline kvt_engine *xu_engine_create_retry(const kvt_options *o)
{
    kvt_engine *e;
    for (int tries = 0;; tries++) {
        if (kvt_engine_create(o, &e) == KVC_OK)
            return e;
        if (!strstr(kvc_last_error(), "Address already in use") || tries >= 200) {
            fprintf(stderr, "server: %s\n", kvc_last_error());
            _exit(2);
        }
        usleep(50000);
    }
}

/* Child side of a test server, after its engine e is made: register
 * region buf (bytes) on e, send its descriptor on fd (xu_send_str), then
 * drive e for ever: after each kvt_progress(e, wait_ms, ...), on_events(
 * ctx, ev, n) with what it returned (n may be 0: a turn to answer a
 * query).  Never returns: the child exits 2 when the setup fails, 3 when
 * kvt_progress fails, 0 when on_events returns non-zero (the parent is
 * gone). */
static inline void xu_serve_region(kvt_engine *e, void *buf, size_t bytes, int fd, int wait_ms,
                                   int (*on_events)(void *ctx, const kvt_event *ev, size_t n),
                                   void *ctx)
{
    char *desc = NULL;
    if (kvt_mr_register(e, buf, bytes, NULL) || kvt_descriptor_export(e, &desc) ||
        xu_send_str(fd, desc)) {
        fprintf(stderr, "server: setup: %s\n", kvc_last_error());
        _exit(2);
    }
    free(desc);
    for (;;) {
        kvt_event ev[16];
        size_t n;
        if (kvt_progress(e, wait_ms, ev, 16, &n)) {
            fprintf(stderr, "server: kvt_progress: %s\n", kvc_last_error());
            _exit(3);
        }
        if (on_events(ctx, ev, n))
            _exit(0);
    }
}

/* What xu_report_events reports to: the pipe, and the region whose
 * checksum each report carries. */
typedef struct xu_serving {
    int fd;
    const void *buf;
    size_t bytes;
} xu_serving;

/* on_events of xu_serve_region (ctx: an xu_serving): one xu_report per
 * event on ctx->fd.  Non-zero when the pipe is closed. */
static inline int xu_report_events(void *ctx, const kvt_event *ev, size_t n)
{
    const xu_serving *s = ctx;
    for (size_t i = 0; i < n; i++) {
        xu_report r;
        memset(&r, 0, sizeof r);
        r.room = ev[i].room;
        r.state = (int32_t)ev[i].state;
        r.code = ev[i].code;
        r.bytes = ev[i].bytes;
        r.sum = xu_sum(s->buf, s->bytes);
        snprintf(r.peer, sizeof r.peer, "%s", ev[i].peer);
        snprintf(r.reason, sizeof r.reason, "%s", ev[i].reason);
        if (xu_write_all(s->fd, &r, sizeof r))
            return -1;
    }
    return 0;
}

/* Child body: engine on listen with one region of region_bytes (zeroed),
 * segment seg_name (NULL: none) as rank; descriptor then one report per
 * event on fd; runs until killed (xu_receiver_stop sends SIGTERM). */
static inline void xu_receiver_main(int fd, const char *listen, size_t region_bytes,
                                    const char *seg_name, uint32_t rank, uint32_t io_timeout_ms)
{
    kvc_segment *seg = NULL;
    if (seg_name) {
        kvc_options so;
        kvc_options_init(&so);
        so.name = seg_name;
        so.mode = KVC_OPEN_ATTACH;
        so.role = KVC_ROLE_WORKER;
        so.rank = (int32_t)rank;
        if (kvc_open(&so, &seg)) {
            fprintf(stderr, "receiver: kvc_open: %s\n", kvc_last_error());
            _exit(2);
        }
    }
    kvt_options o;
    kvt_options_init(&o);
    o.backend = KVT_BACKEND_TCP;
    o.listen = listen;
    o.seg = seg;
    o.rank = rank;
    o.log = xu_quiet_log;
    if (io_timeout_ms)
        o.io_timeout_ms = io_timeout_ms;
    kvt_engine *e;
    if (kvt_engine_create(&o, &e)) {
        fprintf(stderr, "receiver: kvt_engine_create: %s\n", kvc_last_error());
        _exit(2);
    }
    unsigned char *buf = xu_map(region_bytes);
    if (!buf) {
        fprintf(stderr, "receiver: mmap of %zu bytes failed\n", region_bytes);
        _exit(2);
    }
    xu_serve_region(e, buf, region_bytes, fd, 100, xu_report_events,
                    &(xu_serving){fd, buf, region_bytes});
}

/* Fork a receiver; returns 0 with its descriptor read. */
static inline int xu_receiver_start(xu_receiver *r, const char *listen, size_t region_bytes,
                                    const char *seg_name, uint32_t rank, uint32_t io_timeout_ms)
{
    int p[2];
    if (pipe(p))
        return -1;
    r->pid = fork();
    if (r->pid == 0) {
        close(p[0]);
        xu_receiver_main(p[1], listen, region_bytes, seg_name, rank, io_timeout_ms);
    }
    close(p[1]);
    r->rd = p[0];
    r->desc = xu_recv_str(r->rd, -1);
    return r->desc ? 0 : -1;
}

static inline void xu_receiver_stop(xu_receiver *r)
{
    if (r->pid > 0) {
        kill(r->pid, SIGTERM);
        kill(r->pid, SIGCONT); /* a test that stopped it may have failed */
        waitpid(r->pid, NULL, 0);
    }
    close(r->rd);
    free(r->desc);
    r->desc = NULL;
}

/* Drive e until it reports events: up to cap of them into ev, their
 * count in *n (> 0).  No time limit of its own: a test that never gets its
 * event hangs until ctest's TIMEOUT, which names it.  0, or -1 when
 * kvt_progress() fails (kvc_last_error() says why). */
static inline int xu_next_events(kvt_engine *e, kvt_event *ev, size_t cap, size_t *n)
{
    do {
        if (kvt_progress(e, 100, ev, cap, n))
            return -1;
    } while (*n == 0);
    return 0;
}

/* Drive e until the event of room arrives, into *out; the events of other
 * rooms meanwhile are dropped.  No time limit of its own (as
 * xu_next_events); 0, or -1 when kvt_progress() fails. */
static inline int xu_wait_event(kvt_engine *e, uint64_t room, kvt_event *out)
{
    for (;;) {
        kvt_event ev[16];
        size_t n;
        if (xu_next_events(e, ev, 16, &n))
            return -1;
        for (size_t i = 0; i < n; i++)
            if (ev[i].room == room) {
                *out = ev[i];
                return 0;
            }
    }
}

/* Fork a process that, with the engine make() returns, moves `bytes`
 * between a region of its own and `remote` (in the region of descriptor
 * desc) over and over, one room each (kvt_submit_read when reads, else
 * kvt_submit); drive srv_e (the engine serving desc) until its first room
 * succeeded.  Returns the child's pid - it moves on until killed -, or -1
 * (reaped) when it failed first (its exit status 2..5 says where). */
static inline pid_t xu_mover_start(kvt_engine *srv_e, kvt_engine *(*make)(void), const char *desc,
                                   uint64_t remote, size_t bytes, int reads)
{
    int go[2];
    if (pipe(go))
        return -1;
    pid_t pid = fork();
    if (pid == 0) {
        close(go[0]);
        kvt_engine *e = make();
        unsigned char *l = xu_map(bytes);
        kvt_peer *p;
        if (!e || !l || kvt_mr_register(e, l, bytes, NULL) ||
            kvt_peer_import(e, desc, strlen(desc), &p))
            _exit(2);
        kvt_run run = {(uint64_t)(uintptr_t)l, remote, bytes};
        for (uint64_t room = 1;; room++) {
            if ((reads ? kvt_submit_read : kvt_submit)(e, p, room, &run, 1, KVT_SUBMIT_NOROOM))
                _exit(3);
            kvt_event ev;
            if (xu_wait_event(e, room, &ev) || ev.state != KVC_POLL_SUCCESS)
                _exit(4);
            if (room == 1 && write(go[1], "g", 1) != 1)
                _exit(5);
        }
    }
    close(go[1]);
    struct pollfd pf = {go[0], POLLIN, 0};
    while (pid > 0 && poll(&pf, 1, 0) == 0) {
        kvt_event ev[4];
        size_t n;
        kvt_progress(srv_e, 50, ev, 4, &n);
    }
    char g;
    if (pid > 0 && read(go[0], &g, 1) != 1) {
        waitpid(pid, NULL, 0);
        pid = -1;
    }
    close(go[0]);
    return pid;
}

/* Drive e until region buf deregisters (KVC_E_BUSY while a transfer of
 * it is still in flight), up to 200 rounds of 50 ms: KVC_OK, or the last
 * refusal, or kvt_progress's error. */
static inline kvc_err xu_deregister_settled(kvt_engine *e, void *buf)
{
    kvc_err err = KVC_E_BUSY;
    for (int i = 0; i < 200 && err == KVC_E_BUSY; i++) {
        kvt_event ev[4];
        size_t n;
        err = kvt_progress(e, 50, ev, 4, &n);
        if (!err)
            err = kvt_mr_deregister(e, buf);
    }
    return err;
}

/* A sender engine (TCP) with its own log. */
static inline kvt_engine *xu_sender(kvc_segment *seg, uint32_t rank, uint32_t conns,
                                    uint32_t io_timeout_ms)
{
    kvt_options o;
    kvt_options_init(&o);
    o.backend = KVT_BACKEND_TCP;
    o.seg = seg;
    o.rank = rank;
    o.conns_per_peer = conns;
    o.log = xu_quiet_log;
    if (io_timeout_ms)
        o.io_timeout_ms = io_timeout_ms;
    kvt_engine *e = NULL;
    if (kvt_engine_create(&o, &e))
        fprintf(stderr, "sender: %s\n", kvc_last_error());
    return e;
}

#endif
