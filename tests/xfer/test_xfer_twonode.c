/* test_xfer_twonode.c - two "nodes" in two network namespaces joined by a
 * veth pair, as issue 5 asks: each namespace runs its own kvcoordd
 * (`ip netns exec NS kvcoordd --listen <its veth address>:PORT --segment
 * <unique> --fresh`; /dev/shm is shared across network namespaces, so the
 * segment names differ) and two worker processes (TP=2).
 *
 * Decode workers register their transfer-engine descriptor
 * (kvt_descriptor_export's JSON, as docs/transfer.md says a rank publishes)
 * in their node's segment through libkvcoord.  Prefill workers fetch it as
 * a remote node does: GET /get_transfer_engine_info?rank=N from the decode
 * node's kvcoordd across the veth (a tiny blocking HTTP client,
 * test_xfer_twonode_http.h), then kvt_peer_import it.
 *
 * 1. The prefill ranks move a realistic request (Llama-3.1-8B at TP=8 per
 *    rank: 32 layers x K,V x 1 KV head x 128 dim x bf16 per token, 4096
 *    tokens in scattered pages of 16 tokens) to the decode ranks; bytes are
 *    verified by checksums; the room is Success in both nodes' segments
 *    and in both daemons' GET /rooms/{room}.
 * 2. The decode worker of rank 0 is SIGKILLed mid-transfer: the prefill
 *    room fails (within the engine's deadlines) with a reason naming that
 *    peer's session_id; both prefill ranks read the same failure record
 *    (origin rank, code, reason) from the segment and over HTTP.  The
 *    decode node's kvcoordd keeps answering /health 200; its death watch
 *    withdraws the killed rank, whose lookup answers 404 naming the exit,
 *    and fails the decode room.
 * 3. The decode worker is restarted and registers again (new generation);
 *    the prefill ranks fetch its info again over HTTP and the next
 *    transfer succeeds.  Both daemons stop cleanly on SIGTERM (status 0).
 *
 * Needs root and `ip netns`; otherwise exits 77 (skipped) saying why.
 * Namespaces, processes and segments are removed on every exit path
 * (atexit, SIGINT/SIGTERM/SIGHUP; workers and daemons also die with the
 * test through PR_SET_PDEATHSIG).  Deadlines only bound waits: no
 * wall-clock time is asserted. */
#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <sched.h>
#include <stdarg.h>
#include <sys/prctl.h>

#include "test_xfer_twonode_http.h"
#include "tu_proc.h"
#include "xfer_util.h"

#define PLANES 64u /* 32 layers x K and V */
#define PAGE 4096u /* 16 tokens x 128 dim x 2 bytes */
#define POOL_PAGES 512u
#define REQ_PAGES 256u /* 4096 tokens / 16 */
#define POOL ((size_t)PLANES * POOL_PAGES * PAGE)
#define RANKS 2
#define PORT_P 7101 /* prefill node's kvcoordd, in its own netns */
#define PORT_D 7102 /* decode node's kvcoordd, in its own netns */

static char nsA[32], nsB[32], ipA[32], ipB[32];
static char segP[64], segD[64];
static pid_t parent_pid;
static pid_t daemonP = -1, daemonD = -1;
static int net_made;

#define CHECK(c, ...)                                            \
    do {                                                         \
        if (!(c)) {                                              \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__); \
            fprintf(stderr, __VA_ARGS__);                        \
            fprintf(stderr, "\n");                               \
            exit(1); /* atexit: cleanup() */                     \
        }                                                        \
    } while (0)

static pid_t pids[16];
static int npids;

static void track(pid_t p)
{
    if (npids < (int)(sizeof pids / sizeof pids[0]))
        pids[npids++] = p;
}

static void untrack(pid_t p)
{
    for (int i = 0; i < npids; i++)
        if (pids[i] == p)
            pids[i] = -1;
}

/* Kill every process this test started (workers and daemons), remove the
 * namespaces (and with them the veth pair) and both segments.  Idempotent;
 * only the test's own process does it (forked workers inherit atexit). */
static void cleanup(void)
{
    static int done;
    if (done || getpid() != parent_pid)
        return;
    done = 1;
    for (int i = 0; i < npids; i++)
        if (pids[i] > 0) {
            kill(pids[i], SIGKILL);
            waitpid(pids[i], NULL, 0);
            pids[i] = -1;
        }
    if (net_made) {
        char cmd[160];
        snprintf(cmd, sizeof cmd, "ip netns del %s 2>/dev/null; ip netns del %s 2>/dev/null", nsA,
                 nsB);
        if (system(cmd)) {
        }
    }
    if (segP[0])
        kvc_unlink(segP);
    if (segD[0])
        kvc_unlink(segD);
}

static void on_signal(int sig)
{
    cleanup();
    signal(sig, SIG_DFL);
    raise(sig);
}

static int sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int sh(const char *fmt, ...)
{
    char cmd[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    return system(cmd);
}

/* In a forked child: default signal handling, die with the test. */
static void child_init(void)
{
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    signal(SIGHUP, SIG_DFL);
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent_pid)
        _exit(1);
}

static void enter_ns(const char *ns)
{
    char path[128];
    snprintf(path, sizeof path, "/var/run/netns/%s", ns);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0 || setns(fd, CLONE_NEWNET)) {
        fprintf(stderr, "setns %s: %s\n", ns, strerror(errno));
        _exit(2);
    }
    close(fd);
}

/* The request's pages of one side: REQ_PAGES distinct pool pages. */
static void req_pages(uint64_t room, uint32_t rank, int side, uint32_t *out)
{
    uint32_t all[POOL_PAGES];
    for (uint32_t i = 0; i < POOL_PAGES; i++)
        all[i] = i;
    uint64_t x = room * 1000003u + rank * 7919u + (uint64_t)side * 104729u + 1;
    for (uint32_t i = 0; i < REQ_PAGES; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        uint32_t j = i + (uint32_t)(x % (POOL_PAGES - i)), t = all[i];
        all[i] = all[j];
        all[j] = t;
        out[i] = all[i];
    }
}

static unsigned char *page_at(unsigned char *pool, uint32_t plane, uint32_t page)
{
    return pool + ((size_t)plane * POOL_PAGES + page) * PAGE;
}

/* Checksum of the request's pages in request order. */
static uint64_t req_sum(unsigned char *pool, const uint32_t *pages)
{
    uint64_t h = 0;
    for (uint32_t p = 0; p < PLANES; p++)
        for (uint32_t i = 0; i < REQ_PAGES; i++)
            h = h * 31 + xu_sum(page_at(pool, p, pages[i]), PAGE);
    return h;
}

static kvc_segment *attach(const char *name, int worker, uint32_t rank)
{
    kvc_options o;
    kvc_options_init(&o);
    o.name = name;
    o.mode = KVC_OPEN_ATTACH;
    o.role = worker ? KVC_ROLE_WORKER : KVC_ROLE_NONE;
    o.rank = (int32_t)rank;
    kvc_segment *s = NULL;
    if (kvc_open(&o, &s)) {
        fprintf(stderr, "attach %s: %s\n", name, kvc_last_error());
        if (worker)
            _exit(2);
        return NULL;
    }
    return s;
}

static kvt_engine *engine(kvc_segment *seg, uint32_t rank, const char *ip)
{
    char listen[64];
    snprintf(listen, sizeof listen, "%s:0", ip);
    kvt_options o;
    kvt_options_init(&o);
    o.backend = KVT_BACKEND_TCP;
    o.listen = listen;
    o.seg = seg;
    o.rank = rank;
    o.io_timeout_ms = 3000;
    o.connect_timeout_ms = 3000;
    o.log = xu_quiet_log;
    kvt_engine *e;
    if (kvt_engine_create(&o, &e)) {
        fprintf(stderr, "engine: %s\n", kvc_last_error());
        _exit(2);
    }
    return e;
}

/* ---- decode worker ------------------------------------------------------------------ */

typedef struct dreport {
    uint64_t room;
    int32_t state;
    uint64_t sum;
    char reason[256];
} dreport;

/* Attach to the decode node's segment as a worker of rank `rank`, register
 * the engine's descriptor there (libkvcoord, no HTTP), report each room.
 * kill_room: on that room's first write, say "started" (one byte) and stop
 * driving the engine, so the parent's SIGKILL lands mid-transfer. */
static void decode_main(uint32_t rank, int fd, uint64_t kill_room)
{
    enter_ns(nsB);
    kvc_segment *seg = attach(segD, 1, rank);
    kvt_engine *e = engine(seg, rank, ipB);
    unsigned char *pool = xu_map(POOL);
    char *desc;
    if (!pool || kvt_mr_register(e, pool, POOL, NULL) || kvt_descriptor_export(e, &desc) ||
        kvc_rank_register(seg, rank, kvt_session_id(e), desc, strlen(desc), NULL)) {
        fprintf(stderr, "decode setup: %s\n", kvc_last_error());
        _exit(2);
    }
    free(desc);
    for (;;) {
        kvt_event ev[8];
        size_t n;
        if (kvt_progress(e, kill_room ? 1 : 100, ev, 8, &n))
            _exit(3);
        for (size_t i = 0; i < n; i++) {
            dreport r = {.room = ev[i].room, .state = (int32_t)ev[i].state};
            uint32_t pages[REQ_PAGES];
            req_pages(ev[i].room, rank, 1, pages);
            r.sum = req_sum(pool, pages);
            snprintf(r.reason, sizeof r.reason, "%s", ev[i].reason);
            if (xu_write_all(fd, &r, sizeof r))
                _exit(0);
        }
        kvc_room_info ri;
        if (kill_room && kvc_room_get(seg, kill_room, (int32_t)rank, &ri) == KVC_OK &&
            ri.local[rank] == KVC_POLL_TRANSFERRING) {
            xu_write_all(fd, "S", 1);
            for (;;)
                pause();
        }
    }
}

/* ---- prefill worker ----------------------------------------------------------------- */

typedef struct preport {
    uint64_t room;
    int32_t state, code;
    uint64_t sum;
    char reason[256];
    /* the decode rank's info as fetched over HTTP for this room */
    uint64_t gen;
    char sid[256];
    /* the room's failure record as this rank reads it in its segment */
    int room_state, has_failure, is_other;
    uint32_t origin;
    int32_t fcode;
    char freason[256];
} preport;

/* The first region's address in a descriptor (JSON). */
static uint64_t desc_region0(const char *desc)
{
    json_t *root = json_loads(desc, 0, NULL);
    json_t *a = json_object_get(json_array_get(json_object_get(root, "regions"), 0), "addr");
    uint64_t v = json_is_integer(a) ? (uint64_t)json_integer_value(a) : 0;
    json_decref(root);
    return v;
}

static void prefill_room(kvt_engine *e, kvc_segment *seg, uint32_t rank, unsigned char *pool,
                         uint64_t room, preport *r)
{
    memset(r, 0, sizeof *r);
    r->room = room;
    /* The decode rank's transfer-engine info, from the decode node's
     * kvcoordd across the veth, as a remote node gets it. */
    th_info in;
    kvt_peer *p;
    if (th_get_info(NULL, ipB, PORT_D, rank, 10000, &in) || in.status != 200) {
        snprintf(r->reason, sizeof r->reason,
                 "GET /get_transfer_engine_info?rank=%u from %s:%d: %d %.150s", rank, ipB, PORT_D,
                 in.status, in.detail);
        r->state = -1;
        th_info_free(&in);
        return;
    }
    r->gen = in.gen;
    snprintf(r->sid, sizeof r->sid, "%s", in.session_id);
    uint64_t rbase = desc_region0(in.desc);
    if (kvt_peer_import(e, in.desc, strlen(in.desc), &p) || !rbase) {
        snprintf(r->reason, sizeof r->reason, "kvt_peer_import: %s",
                 rbase ? kvc_last_error() : "no region");
        r->state = -1;
        th_info_free(&in);
        return;
    }
    th_info_free(&in);
    uint32_t src[REQ_PAGES], dst[REQ_PAGES];
    req_pages(room, rank, 0, src);
    req_pages(room, rank, 1, dst);
    kvt_run *runs = calloc((size_t)PLANES * REQ_PAGES, sizeof *runs);
    if (!runs)
        _exit(2);
    size_t n = 0;
    for (uint32_t pl = 0; pl < PLANES; pl++)
        for (uint32_t i = 0; i < REQ_PAGES; i++) {
            xu_fill(page_at(pool, pl, src[i]), PAGE, room * 977 + rank * 131 + pl * 7 + i);
            runs[n++] = (kvt_run){(uint64_t)(uintptr_t)page_at(pool, pl, src[i]),
                                  rbase + ((uint64_t)pl * POOL_PAGES + dst[i]) * PAGE, PAGE};
        }
    r->sum = req_sum(pool, src);
    if (kvt_submit(e, p, room, runs, n, 0)) {
        snprintf(r->reason, sizeof r->reason, "submit: %s", kvc_last_error());
        r->state = -1;
        free(runs);
        return;
    }
    free(runs);
    kvt_event ev;
    if (xu_wait_event(e, room, &ev)) {
        r->state = -2;
        snprintf(r->reason, sizeof r->reason, "kvt_progress: %s", kvc_last_error());
        return;
    }
    r->state = (int32_t)ev.state;
    r->code = ev.code;
    snprintf(r->reason, sizeof r->reason, "%s", ev.reason);
    /* Wait (bounded) for the room (all ranks) to be terminal, then read its
     * record as this rank. */
    kvc_room_info info;
    memset(&info, 0, sizeof info);
    for (int i = 0; i < 150; i++) {
        if (kvc_room_get(seg, room, (int32_t)rank, &info))
            break;
        if (info.state == KVC_POLL_FAILED || info.state == KVC_POLL_SUCCESS)
            break;
        kvc_room_wait(seg, room, (int32_t)rank, info.state, 200, &info);
    }
    r->room_state = (int)info.state;
    r->has_failure = info.has_failure;
    r->is_other = info.failure.is_from_another_rank;
    r->origin = info.failure.origin_rank;
    r->fcode = info.failure.code;
    snprintf(r->freason, sizeof r->freason, "%s", info.failure.reason);
}

static void prefill_main(uint32_t rank, int cmd, int out)
{
    enter_ns(nsA);
    kvc_segment *seg = attach(segP, 1, rank);
    kvt_engine *e = engine(seg, rank, ipA);
    unsigned char *pool = xu_map(POOL);
    if (!pool || kvt_mr_register(e, pool, POOL, NULL))
        _exit(2);
    uint64_t room;
    while (xu_read_all(cmd, &room, sizeof room, -1) == 0) {
        preport r;
        prefill_room(e, seg, rank, pool, room, &r);
        if (xu_write_all(out, &r, sizeof r))
            break;
    }
    kvt_engine_destroy(e);
    kvc_close(seg);
    _exit(0);
}

/* ---- parent ------------------------------------------------------------------------- */

typedef struct worker {
    pid_t pid;
    int to, from;
} worker;

static worker spawn(int prefill, uint32_t rank, uint64_t kill_room)
{
    int a[2], b[2];
    CHECK(!pipe2(a, O_CLOEXEC) && !pipe2(b, O_CLOEXEC), "pipe");
    worker w;
    w.pid = fork();
    CHECK(w.pid >= 0, "fork: %s", strerror(errno));
    if (w.pid == 0) {
        child_init();
        /* Keep only this worker's pipe ends: inheriting the other workers'
         * would keep their pipes open past the parent closing them. */
        for (int fd = 3; fd < 1024; fd++)
            if (fd != a[0] && fd != b[1])
                close(fd);
        if (prefill)
            prefill_main(rank, a[0], b[1]);
        decode_main(rank, b[1], kill_room);
        _exit(0);
    }
    close(a[0]);
    close(b[1]);
    w.to = a[1];
    w.from = b[0];
    track(w.pid);
    return w;
}

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Whether process `daemon` holds a pidfd on process `pid` (a pidfd's
 * /proc/PID/fdinfo has a "Pid:" line). */
static int holds_pidfd(pid_t daemon, pid_t pid)
{
    char dir[64];
    snprintf(dir, sizeof dir, "/proc/%d/fdinfo", (int)daemon);
    DIR *d = opendir(dir);
    if (!d)
        return 0;
    int found = 0;
    struct dirent *de;
    while (!found && (de = readdir(d))) {
        if (de->d_name[0] == '.')
            continue;
        char path[128], line[128];
        snprintf(path, sizeof path, "%s/%.20s", dir, de->d_name);
        FILE *f = fopen(path, "re");
        if (!f)
            continue;
        while (fgets(line, sizeof line, f))
            if (!strncmp(line, "Pid:", 4) && atoi(line + 4) == (int)pid) {
                found = 1;
                break;
            }
        fclose(f);
    }
    closedir(d);
    return found;
}

/* Wait (bounded) until kvcoordd's death watch has a pidfd on worker pid.
 * The daemon learns of newly attached processes on its 1 s sweep (or after
 * a mutating request); a worker killed before that is found already gone
 * and, once its parent reaped it, reported as "exit status unknown". */
static void wait_watched(pid_t daemon, pid_t pid)
{
    int64_t deadline = th_now_ms() + 15000;
    while (!holds_pidfd(daemon, pid)) {
        CHECK(th_now_ms() < deadline, "kvcoordd %d never watched worker %d through a pidfd",
              (int)daemon, (int)pid);
        sleep_ms(20);
    }
}

/* The kvcoordd binary: $KVCOORDD (set by ctest), else ../kvcoordd next to
 * this test's directory (build/tests/ -> build/). */
static const char *daemon_path(void)
{
    static char path[PATH_MAX];
    const char *env = getenv("KVCOORDD");
    if (env && *env)
        return env;
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0)
        return "kvcoordd";
    exe[n] = '\0';
    char *slash = strrchr(exe, '/');
    if (slash)
        *slash = '\0';
    snprintf(path, sizeof path, "%.*s/../kvcoordd", (int)(sizeof path - 16), exe);
    return path;
}

/* `ip netns exec NS kvcoordd --listen IP:PORT --segment SEG --fresh ...`
 * (ip execs the daemon in place, so the pid is the daemon's), then wait
 * (bounded) until its /health answers 200 from inside that namespace. */
static pid_t start_daemon(const char *ns, const char *ip, int port, const char *seg)
{
    char listen[64];
    snprintf(listen, sizeof listen, "%s:%d", ip, port);
    const char *bin = daemon_path();
    CHECK(access(bin, X_OK) == 0, "kvcoordd not found at %s (set KVCOORDD)", bin);
    pid_t pid = fork();
    CHECK(pid >= 0, "fork: %s", strerror(errno));
    if (pid == 0) {
        child_init();
        execlp("ip", "ip", "netns", "exec", ns, bin, "--listen", listen, "--segment", seg,
               "--fresh", "--world-size", "2", "--max-ranks", "16", "--arena-bytes", "64M",
               "--max-info-bytes", "1M", (char *)NULL);
        fprintf(stderr, "exec ip netns exec %s %s: %s\n", ns, bin, strerror(errno));
        _exit(127);
    }
    track(pid);
    int64_t deadline = th_now_ms() + 30000;
    for (;;) {
        th_resp r;
        int ok = th_request(ns, ip, port, "GET", "/health", NULL, 2000, &r) == 0 &&
                 r.status == 200 && !strcmp(r.body, "OK");
        th_resp_free(&r);
        if (ok)
            break;
        int st;
        CHECK(waitpid(pid, &st, WNOHANG) == 0,
              "kvcoordd in %s exited during startup (wait status 0x%x)", ns, st);
        CHECK(th_now_ms() < deadline, "kvcoordd in %s never answered GET /health on %s", ns,
              listen);
        sleep_ms(50);
    }
    printf("kvcoordd pid %d: netns %s, %s, segment %s, /health 200\n", (int)pid, ns, listen, seg);
    return pid;
}

/* SIGTERM a daemon and wait for it (no limit of its own: ctest's TIMEOUT
 * names a daemon that never stops): it must exit with status 0. */
static void stop_daemon(pid_t *pid, const char *what)
{
    kill(*pid, SIGTERM);
    int rc = tu_wait_exit(*pid);
    untrack(*pid);
    *pid = -1;
    CHECK(rc == 0, "%s kvcoordd ended with %d (128 + N: signal N)", what, rc);
}

/* GET path from inside ns; the body parsed as JSON (status must be want). */
static json_t *get_json(const char *ns, const char *ip, int port, const char *path, int want)
{
    th_resp r;
    CHECK(th_request(ns, ip, port, "GET", path, NULL, 10000, &r) == 0, "GET %s from %s:%d: %s",
          path, ip, port, r.err);
    CHECK(r.status == want, "GET %s from %s:%d: status %d, want %d: %s", path, ip, port, r.status,
          want, r.body);
    json_error_t je;
    json_t *j = json_loadb(r.body, r.body_len, 0, &je);
    CHECK(j != NULL, "GET %s: not JSON (%s): %s", path, je.text, r.body);
    th_resp_free(&r);
    return j;
}

static const char *jstr(json_t *o, const char *k)
{
    const char *s = json_string_value(json_object_get(o, k));
    return s ? s : "";
}

static long long jint(json_t *o, const char *k)
{
    json_t *v = json_object_get(o, k);
    return json_is_integer(v) ? json_integer_value(v) : LLONG_MIN;
}

/* The room as a node's kvcoordd reports it: state `want`. */
static void http_room_state(const char *ns, const char *ip, int port, uint64_t room,
                            const char *want)
{
    char path[64];
    snprintf(path, sizeof path, "/rooms/%llu", (unsigned long long)room);
    json_t *j = get_json(ns, ip, port, path, 200);
    CHECK(!strcmp(jstr(j, "state"), want), "GET %s on %s:%d: state %s, want %s", path, ip, port,
          jstr(j, "state"), want);
    if (!strcmp(want, "Success"))
        CHECK(json_is_null(json_object_get(j, "failure")),
              "GET %s on %s:%d: Success with a failure", path, ip, port);
    json_decref(j);
}

/* Lookup of a decode rank from the prefill node (nsA), as a remote node
 * does: must be 200 with a generation. */
static void info_from_prefill_node(uint32_t rank, int wait_ms, th_info *out)
{
    CHECK(th_get_info(nsA, ipB, PORT_D, rank, wait_ms, out) == 0 && out->status == 200,
          "decode rank %u's info over HTTP: status %d: %s", rank, out->status, out->detail);
}

static void transfer_ok(worker *P, worker *D, kvc_segment *sp, kvc_segment *sd, uint64_t room,
                        preport *pr)
{
    for (int r = 0; r < RANKS; r++)
        CHECK(!xu_write_all(P[r].to, &room, sizeof room), "cmd");
    for (int r = 0; r < RANKS; r++) {
        dreport dr;
        CHECK(!xu_read_all(P[r].from, &pr[r], sizeof pr[r], 60000), "prefill %d: no report", r);
        CHECK(pr[r].state == KVC_POLL_SUCCESS, "room %llu prefill %d: state %d: %s",
              (unsigned long long)room, r, pr[r].state, pr[r].reason);
        CHECK(pr[r].room_state == KVC_POLL_SUCCESS, "room %llu prefill %d: segment state %d",
              (unsigned long long)room, r, pr[r].room_state);
        CHECK(!xu_read_all(D[r].from, &dr, sizeof dr, 60000), "decode %d: no report", r);
        CHECK(dr.room == room && dr.state == KVC_POLL_SUCCESS, "decode %d: %s", r, dr.reason);
        CHECK(dr.sum == pr[r].sum, "room %llu rank %d: checksums differ", (unsigned long long)room,
              r);
    }
    /* In each node's segment (libkvcoord) ... */
    kvc_room_info ri;
    CHECK(kvc_room_get(sp, room, -1, &ri) == KVC_OK && ri.state == KVC_POLL_SUCCESS,
          "prefill segment room state");
    CHECK(kvc_room_get(sd, room, -1, &ri) == KVC_OK, "decode segment: room %llu: %s",
          (unsigned long long)room, kvc_last_error());
    /* the decode room turns Success once both decode ranks wrote theirs */
    for (int i = 0; i < 50 && ri.state != KVC_POLL_SUCCESS && ri.state != KVC_POLL_FAILED; i++)
        kvc_room_wait(sd, room, -1, ri.state, 200, &ri);
    CHECK(ri.state == KVC_POLL_SUCCESS, "decode segment room state %d", (int)ri.state);
    /* ... and as each node's kvcoordd reports it. */
    http_room_state(nsA, ipA, PORT_P, room, "Success");
    http_room_state(nsB, ipB, PORT_D, room, "Success");
    printf("room %llu: %u MiB per rank x %d ranks verified, Success in both segments and both "
           "kvcoordd "
           "(GET /rooms/%llu)\n",
           (unsigned long long)room, (unsigned)(PLANES * REQ_PAGES * PAGE >> 20), RANKS,
           (unsigned long long)room);
}

/* Leftovers of earlier runs of this test that were SIGKILLed (a ctest
 * timeout kills without a signal it could catch): namespaces kvtA<pid>,
 * kvtB<pid> and segments kvt2n-P-<pid>, kvt2n-D-<pid> whose test process
 * is gone are removed. */
static void sweep_stale(void)
{
    static const struct {
        const char *dir, *prefix[2];
        int netns;
    } kinds[] = {{"/var/run/netns", {"kvtA", "kvtB"}, 1},
                 {"/dev/shm", {"kvt2n-P-", "kvt2n-D-"}, 0}};
    for (size_t k = 0; k < 2; k++) {
        DIR *d = opendir(kinds[k].dir);
        if (!d)
            continue;
        struct dirent *de;
        while ((de = readdir(d))) {
            for (int i = 0; i < 2; i++) {
                size_t pl = strlen(kinds[k].prefix[i]);
                if (strncmp(de->d_name, kinds[k].prefix[i], pl))
                    continue;
                char *end;
                long pid = strtol(de->d_name + pl, &end, 10);
                if (*end || pid <= 0 || pid == (long)getpid() || kill((pid_t)pid, 0) == 0 ||
                    errno != ESRCH)
                    continue;
                printf("removing a leftover of an earlier run (pid %ld gone): %s/%s\n", pid,
                       kinds[k].dir, de->d_name);
                if (kinds[k].netns) {
                    if (sh("ip netns del %.60s 2>/dev/null", de->d_name)) {
                    }
                } else {
                    kvc_unlink(de->d_name);
                }
            }
        }
        closedir(d);
    }
}

static int setup_net(void)
{
    int id = getpid() % 100000;
    snprintf(nsA, sizeof nsA, "kvtA%d", (int)getpid());
    snprintf(nsB, sizeof nsB, "kvtB%d", (int)getpid());
    snprintf(ipA, sizeof ipA, "10.%d.%d.1", 200 + id % 50, id % 250);
    snprintf(ipB, sizeof ipB, "10.%d.%d.2", 200 + id % 50, id % 250);
    net_made = 1;
    if (sh("ip netns add %s && ip netns add %s", nsA, nsB))
        return -1;
    /* veth names (<= 15 bytes) carry the whole pid: no clash with a
     * concurrent run. */
    int v = (int)getpid();
    if (sh("ip link add kva%d type veth peer name kvb%d && ip link set kva%d netns %s && "
           "ip link set kvb%d netns %s",
           v, v, v, nsA, v, nsB)) {
        if (sh("ip link del kva%d 2>/dev/null", v)) {
        }
        return -1;
    }
    if (sh("ip -n %s addr add %s/24 dev kva%d && ip -n %s link set kva%d up && ip -n %s link set "
           "lo up",
           nsA, ipA, v, nsA, v, nsA) ||
        sh("ip -n %s addr add %s/24 dev kvb%d && ip -n %s link set kvb%d up && ip -n %s link set "
           "lo up",
           nsB, ipB, v, nsB, v, nsB))
        return -1;
    return 0;
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    setvbuf(stdout, NULL, _IOLBF, 0);
    parent_pid = getpid();
    if (geteuid() != 0) {
        printf("SKIP: the two-node test needs root to create network namespaces (euid %d)\n",
               (int)geteuid());
        return 77;
    }
    if (system("command -v ip >/dev/null 2>&1")) {
        printf("SKIP: iproute2's `ip` is not installed (apt-get install iproute2)\n");
        return 77;
    }
    sweep_stale();
    atexit(cleanup);
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    signal(SIGHUP, on_signal);
    if (setup_net()) {
        cleanup();
        printf("SKIP: network namespaces or veth pairs unavailable here (ip netns add / ip link "
               "add failed)\n");
        return 77;
    }
    snprintf(segP, sizeof segP, "kvt2n-P-%d", (int)getpid());
    snprintf(segD, sizeof segD, "kvt2n-D-%d", (int)getpid());
    printf("prefill node: netns %s %s; decode node: netns %s %s\n", nsA, ipA, nsB, ipB);

    /* Each node: its own kvcoordd, which creates its segment (--fresh). */
    daemonP = start_daemon(nsA, ipA, PORT_P, segP);
    daemonD = start_daemon(nsB, ipB, PORT_D, segD);
    kvc_segment *sp = attach(segP, 0, 0), *sd = attach(segD, 0, 0);
    CHECK(sp && sd, "attach to the daemons' segments: %s", kvc_last_error());

    worker D[RANKS], P[RANKS];
    D[0] = spawn(0, 0, 2); /* rank 0 stops and is killed on room 2 */
    D[1] = spawn(0, 1, 0);
    th_info info[RANKS];
    for (uint32_t r = 0; r < RANKS; r++) {
        info_from_prefill_node(r, 20000, &info[r]);
        printf("decode rank %u over HTTP from netns %s: session_id %s, generation %llu\n", r, nsA,
               info[r].session_id, (unsigned long long)info[r].gen);
    }
    char dead_sid[256];
    snprintf(dead_sid, sizeof dead_sid, "%s", info[0].session_id);
    uint64_t gen0 = info[0].gen;
    for (int r = 0; r < RANKS; r++)
        th_info_free(&info[r]);
    for (uint32_t r = 0; r < RANKS; r++)
        P[r] = spawn(1, r, 0);

    preport pr[RANKS];
    transfer_ok(P, D, sp, sd, 1, pr);
    CHECK(!strcmp(pr[0].sid, dead_sid) && pr[0].gen == gen0, "prefill 0 fetched %s gen %llu",
          pr[0].sid, (unsigned long long)pr[0].gen);

    /* Room 2: SIGKILL decode rank 0 mid-transfer (once the decode node's
     * kvcoordd watches it, so it can tell how it ended). */
    wait_watched(daemonD, D[0].pid);
    uint64_t room = 2;
    for (int r = 0; r < RANKS; r++)
        CHECK(!xu_write_all(P[r].to, &room, sizeof room), "cmd");
    char s;
    CHECK(!xu_read_all(D[0].from, &s, 1, 30000) && s == 'S', "decode 0 never started room 2");
    pid_t dead_pid = D[0].pid;
    kill(dead_pid, SIGKILL);
    waitpid(dead_pid, NULL, 0);
    untrack(dead_pid);
    close(D[0].to);
    close(D[0].from);
    printf("room 2: decode rank 0 (pid %d, %s) SIGKILLed mid-transfer\n", (int)dead_pid, dead_sid);
    for (int r = 0; r < RANKS; r++)
        CHECK(!xu_read_all(P[r].from, &pr[r], sizeof pr[r], 60000), "prefill %d: no report", r);
    CHECK(pr[0].state == KVC_POLL_FAILED, "prefill 0 state %d: %s", pr[0].state, pr[0].reason);
    CHECK(strstr(pr[0].reason, dead_sid) != NULL, "reason \"%s\" does not name %s", pr[0].reason,
          dead_sid);
    printf("room 2: prefill rank 0 failed: %s\n", pr[0].reason);
    for (int r = 0; r < RANKS; r++) {
        CHECK(pr[r].room_state == KVC_POLL_FAILED, "prefill %d: room state %d", r,
              pr[r].room_state);
        CHECK(pr[r].has_failure, "prefill %d sees no failure record", r);
        CHECK(!strcmp(pr[r].freason, pr[0].freason) && pr[r].origin == 0 &&
                  pr[r].fcode == pr[0].fcode,
              "prefill %d sees another record: \"%s\" origin %u code %d", r, pr[r].freason,
              pr[r].origin, pr[r].fcode);
        CHECK(pr[r].is_other == (r != 0), "prefill %d: is_from_another_rank %d", r, pr[r].is_other);
    }
    CHECK(strstr(pr[0].freason, dead_sid) != NULL, "record \"%s\" lacks the peer %s", pr[0].freason,
          dead_sid);
    /* The same record over HTTP from the prefill node's kvcoordd, as each rank sees it. */
    for (int r = 0; r < RANKS; r++) {
        char path[64];
        snprintf(path, sizeof path, "/rooms/2?rank=%d", r);
        json_t *j = get_json(nsA, ipA, PORT_P, path, 200);
        json_t *f = json_object_get(j, "failure");
        CHECK(!strcmp(jstr(j, "state"), "Failed") && json_is_object(f),
              "GET %s: not Failed with a record", path);
        CHECK(jint(f, "origin_rank") == 0 && jint(f, "code") == pr[0].fcode &&
                  !strcmp(jstr(f, "reason"), pr[0].freason),
              "GET %s: record origin %lld code %lld \"%s\"", path, jint(f, "origin_rank"),
              jint(f, "code"), jstr(f, "reason"));
        CHECK(json_is_true(json_object_get(f, "is_from_another_rank")) == (r != 0),
              "GET %s: is_from_another_rank", path);
        json_decref(j);
    }
    printf("room 2: both prefill ranks read the same record (origin rank 0, code %d), in the "
           "segment and "
           "over HTTP\n",
           pr[0].fcode);
    dreport dr;
    CHECK(!xu_read_all(D[1].from, &dr, sizeof dr, 60000), "decode 1: no report of room 2");

    /* The decode node's kvcoordd: still serving; its death watch withdrew
     * the killed rank (404 naming the exit) and failed its room. */
    {
        th_resp h;
        CHECK(th_request(nsA, ipB, PORT_D, "GET", "/health", NULL, 10000, &h) == 0 &&
                  h.status == 200,
              "decode kvcoordd /health after the kill: %d %s", h.status, h.err);
        th_resp_free(&h);
        th_info gone;
        char pidtxt[32];
        snprintf(pidtxt, sizeof pidtxt, "process %d ", (int)dead_pid);
        int64_t deadline = th_now_ms() + 15000;
        for (;;) {
            uint32_t ep = kvc_rank_epoch(sd);
            CHECK(th_get_info(nsA, ipB, PORT_D, 0, 0, &gone) == 0, "lookup of rank 0: %s",
                  gone.detail);
            th_info_free(&gone);
            if (gone.status == 404)
                break;
            CHECK(gone.status == 200 && th_now_ms() < deadline,
                  "decode kvcoordd still hands out killed rank 0 (status %d)", gone.status);
            kvc_rank_wait_change(sd, ep, 500);
        }
        printf("decode kvcoordd: GET /get_transfer_engine_info?rank=0 -> 404 %s\n", gone.detail);
        CHECK(strstr(gone.detail, "withdrawn") && strstr(gone.detail, pidtxt) &&
                  strstr(gone.detail, "killed by signal 9"),
              "404 detail \"%s\" does not name the exit", gone.detail);
        kvc_room_info ri;
        CHECK(kvc_room_get(sd, 2, -1, &ri) == KVC_OK, "decode room 2: %s", kvc_last_error());
        for (int i = 0; i < 50 && ri.state != KVC_POLL_FAILED; i++)
            kvc_room_wait(sd, 2, -1, ri.state, 200, &ri);
        CHECK(ri.state == KVC_POLL_FAILED, "decode room 2 state %d", (int)ri.state);
        http_room_state(nsB, ipB, PORT_D, 2, "Failed");
        printf("decode kvcoordd: /health 200; room 2 Failed: %s\n", ri.failure.reason);
    }

    /* Restart decode rank 0: it registers again (new generation); the
     * prefill ranks fetch its info again over HTTP; room 3 succeeds. */
    D[0] = spawn(0, 0, 0);
    th_info again;
    info_from_prefill_node(0, 20000, &again);
    CHECK(again.gen > gen0, "restarted rank 0: generation %llu, was %llu",
          (unsigned long long)again.gen, (unsigned long long)gen0);
    printf("decode rank 0 restarted: session_id %s, generation %llu (was %llu)\n", again.session_id,
           (unsigned long long)again.gen, (unsigned long long)gen0);
    transfer_ok(P, D, sp, sd, 3, pr);
    CHECK(pr[0].gen == again.gen && !strcmp(pr[0].sid, again.session_id),
          "prefill 0 used %s gen %llu, not the re-registered %s gen %llu", pr[0].sid,
          (unsigned long long)pr[0].gen, again.session_id, (unsigned long long)again.gen);
    th_info_free(&again);

    /* Orderly end: workers exit, daemons stop cleanly on SIGTERM. */
    for (int r = 0; r < RANKS; r++) {
        close(P[r].to);
        int rc = tu_wait_exit(P[r].pid);
        untrack(P[r].pid);
        CHECK(rc == 0, "prefill %d ended with %d (128 + N: signal N)", r, rc);
        kill(D[r].pid, SIGTERM);
        waitpid(D[r].pid, NULL, 0);
        untrack(D[r].pid);
    }
    kvc_close(sp);
    kvc_close(sd);
    stop_daemon(&daemonD, "decode");
    stop_daemon(&daemonP, "prefill");
    printf("OK\n");
    return 0; /* atexit: namespaces and segments removed */
}
