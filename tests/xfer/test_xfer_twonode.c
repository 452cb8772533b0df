/* test_xfer_twonode.c - two "nodes" in two network namespaces joined by a
 * veth pair, each with its own segment and two worker processes (TP=2).
 * The prefill ranks move a realistic request (Llama-3.1-8B at TP=8 per
 * rank: 32 layers x K,V x 1 KV head x 128 dim x bf16 per token, 4096
 * tokens in scattered pages of 16 tokens) to the decode ranks; bytes are
 * verified by checksums.  Then the decode worker of rank 0 is SIGKILLed
 * mid-transfer: the prefill room fails with a reason naming that peer and
 * both prefill ranks read the same failure record.  The decode worker is
 * restarted (new generation) and the next transfer succeeds.
 * Needs root and `ip netns`; otherwise exits 77 (skipped) saying why. */
#include <fcntl.h>
#include <sched.h>
#include <stdarg.h>

#include "xfer_util.h"

#define PLANES 64u      /* 32 layers x K and V */
#define PAGE 4096u      /* 16 tokens x 128 dim x 2 bytes */
#define POOL_PAGES 512u
#define REQ_PAGES 256u  /* 4096 tokens / 16 */
#define POOL ((size_t)PLANES * POOL_PAGES * PAGE)
#define RANKS 2

static char nsA[32], nsB[32], ipA[32], ipB[32];
static const char *segP, *segD;
static char segPn[64], segDn[64];

#define CHECK(c, ...)                                                                              \
    do {                                                                                           \
        if (!(c)) {                                                                                \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                                   \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fprintf(stderr, "\n");                                                                 \
            cleanup();                                                                             \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

static pid_t pids[8];
static int npids;

static void cleanup(void)
{
    for (int i = 0; i < npids; i++)
        if (pids[i] > 0) {
            kill(pids[i], SIGKILL);
            waitpid(pids[i], NULL, 0);
        }
    char cmd[128];
    snprintf(cmd, sizeof cmd, "ip netns del %s 2>/dev/null; ip netns del %s 2>/dev/null", nsA, nsB);
    if (system(cmd)) {
    }
    kvc_unlink(segPn);
    kvc_unlink(segDn);
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

static kvc_segment *attach(const char *name, uint32_t rank)
{
    kvc_options o;
    kvc_options_init(&o);
    o.name = name;
    o.mode = KVC_OPEN_ATTACH;
    o.role = KVC_ROLE_WORKER;
    o.rank = (int32_t)rank;
    kvc_segment *s = NULL;
    if (kvc_open(&o, &s)) {
        fprintf(stderr, "attach %s: %s\n", name, kvc_last_error());
        _exit(2);
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

/* kill_room: on its first write, say "started" (one byte) and stop
 * driving the engine, so the parent's SIGKILL lands mid-transfer. */
static void decode_main(uint32_t rank, int fd, uint64_t kill_room)
{
    enter_ns(nsB);
    kvc_segment *seg = attach(segD, rank);
    kvt_engine *e = engine(seg, rank, ipB);
    unsigned char *pool = xu_map(POOL);
    char *desc;
    if (!pool || kvt_mr_register(e, pool, POOL, NULL) || kvt_descriptor_export(e, &desc) ||
        kvc_rank_register(seg, rank, kvt_session_id(e), desc, strlen(desc), NULL)) {
        fprintf(stderr, "decode setup: %s\n", kvc_last_error());
        _exit(2);
    }
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
            xu_write_all(fd, &r, sizeof r);
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
    /* the room's failure record as this rank reads it */
    int has_failure, is_other;
    uint32_t origin;
    int32_t fcode;
    char freason[256];
} preport;

static void prefill_room(kvt_engine *e, kvc_segment *seg, kvc_segment *dseg, uint32_t rank,
                         unsigned char *pool, uint64_t room, preport *r)
{
    memset(r, 0, sizeof *r);
    r->room = room;
    kvc_rank_info ri = {0};
    kvt_peer *p;
    if (kvc_rank_lookup(dseg, rank, &ri) || kvt_peer_import(e, ri.info, ri.info_len, &p)) {
        snprintf(r->reason, sizeof r->reason, "lookup/import: %s", kvc_last_error());
        r->state = -1;
        kvc_rank_info_free(&ri);
        return;
    }
    kvc_rank_info_free(&ri);
    const char *d;
    uint32_t src[REQ_PAGES], dst[REQ_PAGES];
    req_pages(room, rank, 0, src);
    req_pages(room, rank, 1, dst);
    kvt_run *runs = calloc((size_t)PLANES * REQ_PAGES, sizeof *runs);
    uint64_t rbase = 0;
    {
        kvc_rank_info r2 = {0};
        kvc_rank_lookup(dseg, rank, &r2);
        d = strstr(r2.info, "\"addr\":");
        rbase = d ? strtoull(d + 7, NULL, 10) : 0;
        kvc_rank_info_free(&r2);
    }
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
    if (xu_wait_event(e, room, 30000, &ev)) {
        r->state = -2;
        snprintf(r->reason, sizeof r->reason, "no event within 30 s");
        return;
    }
    r->state = (int32_t)ev.state;
    r->code = ev.code;
    snprintf(r->reason, sizeof r->reason, "%s", ev.reason);
    /* Wait for the room (all ranks) to be terminal, then read its record. */
    kvc_room_info info;
    for (int i = 0; i < 100; i++) {
        if (kvc_room_get(seg, room, (int32_t)rank, &info))
            break;
        if (info.state == KVC_POLL_FAILED || info.state == KVC_POLL_SUCCESS)
            break;
        kvc_room_wait(seg, room, (int32_t)rank, info.state, 200, &info);
    }
    r->has_failure = info.has_failure;
    r->is_other = info.failure.is_from_another_rank;
    r->origin = info.failure.origin_rank;
    r->fcode = info.failure.code;
    snprintf(r->freason, sizeof r->freason, "%s", info.failure.reason);
}

static void prefill_main(uint32_t rank, int cmd, int out)
{
    enter_ns(nsA);
    kvc_segment *seg = attach(segP, rank);
    kvc_options o;
    kvc_options_init(&o);
    o.name = segD;
    o.role = KVC_ROLE_NONE;
    kvc_segment *dseg = NULL;
    if (kvc_open(&o, &dseg)) /* stands in for the decode node's HTTP lookup */
        _exit(2);
    kvt_engine *e = engine(seg, rank, ipA);
    unsigned char *pool = xu_map(POOL);
    if (!pool || kvt_mr_register(e, pool, POOL, NULL))
        _exit(2);
    uint64_t room;
    while (xu_read_all(cmd, &room, sizeof room, -1) == 0) {
        preport r;
        prefill_room(e, seg, dseg, rank, pool, room, &r);
        xu_write_all(out, &r, sizeof r);
    }
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
    CHECK(!pipe(a) && !pipe(b), "pipe");
    worker w;
    w.pid = fork();
    if (w.pid == 0) {
        close(a[1]);
        close(b[0]);
        if (prefill)
            prefill_main(rank, a[0], b[1]);
        decode_main(rank, b[1], kill_room);
        _exit(0);
    }
    close(a[0]);
    close(b[1]);
    w.to = a[1];
    w.from = b[0];
    pids[npids++] = w.pid;
    return w;
}

static void wait_registered(kvc_segment *d, uint32_t rank, uint64_t after_gen)
{
    for (int i = 0; i < 100; i++) {
        kvc_rank_info ri = {0};
        kvc_err e = kvc_rank_wait(d, rank, 200, &ri);
        uint64_t g = ri.generation;
        kvc_rank_info_free(&ri);
        if (e == KVC_OK && g > after_gen)
            return;
        if (e == KVC_OK)
            kvc_rank_wait_change(d, kvc_rank_epoch(d), 200);
    }
    CHECK(0, "decode rank %u never registered", rank);
}

static void transfer_ok(worker *P, worker *D, kvc_segment *sp, kvc_segment *sd, uint64_t room)
{
    for (int r = 0; r < RANKS; r++)
        CHECK(!xu_write_all(P[r].to, &room, sizeof room), "cmd");
    for (int r = 0; r < RANKS; r++) {
        preport pr;
        dreport dr;
        CHECK(!xu_read_all(P[r].from, &pr, sizeof pr, 60000), "prefill %d: no report", r);
        CHECK(pr.state == KVC_POLL_SUCCESS, "room %llu prefill %d: state %d: %s", (unsigned long long)room, r,
              pr.state, pr.reason);
        CHECK(!xu_read_all(D[r].from, &dr, sizeof dr, 60000), "decode %d: no report", r);
        CHECK(dr.room == room && dr.state == KVC_POLL_SUCCESS, "decode %d: %s", r, dr.reason);
        CHECK(dr.sum == pr.sum, "room %llu rank %d: checksums differ", (unsigned long long)room, r);
    }
    kvc_room_info ri;
    CHECK(kvc_room_get(sp, room, -1, &ri) == KVC_OK && ri.state == KVC_POLL_SUCCESS, "prefill room state");
    CHECK(kvc_room_get(sd, room, -1, &ri) == KVC_OK && ri.state == KVC_POLL_SUCCESS, "decode room state");
    printf("room %llu: %u MiB per rank x %d ranks verified, Success on both nodes\n",
           (unsigned long long)room, (unsigned)(PLANES * REQ_PAGES * PAGE >> 20), RANKS);
}

static int setup_net(void)
{
    int id = getpid() % 100000;
    snprintf(nsA, sizeof nsA, "kvtA%d", id);
    snprintf(nsB, sizeof nsB, "kvtB%d", id);
    snprintf(ipA, sizeof ipA, "10.%d.%d.1", 200 + id % 50, id % 250);
    snprintf(ipB, sizeof ipB, "10.%d.%d.2", 200 + id % 50, id % 250);
    if (sh("ip netns add %s && ip netns add %s", nsA, nsB))
        return -1;
    if (sh("ip link add kva%d type veth peer name kvb%d && ip link set kva%d netns %s && "
           "ip link set kvb%d netns %s",
           id, id, id, nsA, id, nsB) ||
        sh("ip -n %s addr add %s/24 dev kva%d && ip -n %s link set kva%d up && ip -n %s link set lo up",
           nsA, ipA, id, nsA, id, nsA) ||
        sh("ip -n %s addr add %s/24 dev kvb%d && ip -n %s link set kvb%d up && ip -n %s link set lo up",
           nsB, ipB, id, nsB, id, nsB))
        return -1;
    return 0;
}

static kvc_segment *create_seg(const char *name)
{
    kvc_options o;
    kvc_options_init(&o);
    o.name = name;
    o.mode = KVC_OPEN_FRESH;
    o.role = KVC_ROLE_NONE;
    o.world_size = RANKS;
    o.max_ranks = 16;
    o.arena_bytes = 16u << 20;
    o.max_info_bytes = 1u << 20;
    o.max_rooms = 64;
    kvc_segment *s = NULL;
    CHECK(kvc_open(&o, &s) == KVC_OK, "kvc_open %s: %s", name, kvc_last_error());
    return s;
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    if (geteuid() != 0) {
        printf("SKIP: the two-node test needs root to create network namespaces (euid %d)\n", (int)geteuid());
        return 77;
    }
    if (system("command -v ip >/dev/null 2>&1")) {
        printf("SKIP: iproute2's `ip` is not installed (apt-get install iproute2)\n");
        return 77;
    }
    if (setup_net()) {
        cleanup();
        printf("SKIP: network namespaces or veth pairs unavailable here (ip netns add / ip link add failed)\n");
        return 77;
    }
    snprintf(segPn, sizeof segPn, "kvt2n-P-%d", (int)getpid());
    snprintf(segDn, sizeof segDn, "kvt2n-D-%d", (int)getpid());
    segP = segPn;
    segD = segDn;
    kvc_segment *sp = create_seg(segP), *sd = create_seg(segD);
    printf("prefill node: netns %s %s; decode node: netns %s %s\n", nsA, ipA, nsB, ipB);

    worker D[RANKS], P[RANKS];
    D[0] = spawn(0, 0, 2); /* rank 0 stops and is killed on room 2 */
    D[1] = spawn(0, 1, 0);
    wait_registered(sd, 0, 0);
    wait_registered(sd, 1, 0);
    for (uint32_t r = 0; r < RANKS; r++)
        P[r] = spawn(1, r, 0);

    transfer_ok(P, D, sp, sd, 1);

    /* Room 2: SIGKILL decode rank 0 mid-transfer. */
    kvc_rank_info ri0 = {0};
    CHECK(kvc_rank_lookup(sd, 0, &ri0) == KVC_OK, "lookup");
    char dead_sid[KVC_SESSION_ID_MAX + 1];
    snprintf(dead_sid, sizeof dead_sid, "%s", ri0.session_id);
    uint64_t gen0 = ri0.generation;
    kvc_rank_info_free(&ri0);
    uint64_t room = 2;
    for (int r = 0; r < RANKS; r++)
        CHECK(!xu_write_all(P[r].to, &room, sizeof room), "cmd");
    char s;
    CHECK(!xu_read_all(D[0].from, &s, 1, 30000) && s == 'S', "decode 0 never started room 2");
    kill(D[0].pid, SIGKILL);
    waitpid(D[0].pid, NULL, 0);
    pids[0] = -1;
    printf("room 2: decode rank 0 (%s) SIGKILLed mid-transfer\n", dead_sid);
    preport pr[RANKS];
    for (int r = 0; r < RANKS; r++)
        CHECK(!xu_read_all(P[r].from, &pr[r], sizeof pr[r], 60000), "prefill %d: no report", r);
    CHECK(pr[0].state == KVC_POLL_FAILED, "prefill 0 state %d", pr[0].state);
    CHECK(strstr(pr[0].reason, dead_sid) != NULL, "reason \"%s\" does not name %s", pr[0].reason, dead_sid);
    printf("room 2: prefill rank 0 failed: %s\n", pr[0].reason);
    for (int r = 0; r < RANKS; r++) {
        CHECK(pr[r].has_failure, "prefill %d sees no failure record", r);
        CHECK(!strcmp(pr[r].freason, pr[0].freason) && pr[r].origin == 0 && pr[r].fcode == pr[0].fcode,
              "prefill %d sees another record: \"%s\" origin %u", r, pr[r].freason, pr[r].origin);
        CHECK(pr[r].is_other == (r != 0), "prefill %d: is_from_another_rank %d", r, pr[r].is_other);
    }
    CHECK(strstr(pr[1].freason, dead_sid) != NULL, "record lacks the peer");
    dreport dr;
    CHECK(!xu_read_all(D[1].from, &dr, sizeof dr, 60000), "decode 1: no report");
    printf("room 2: both prefill ranks read the same record (origin rank 0, code %d)\n", pr[0].fcode);

    /* Restart decode rank 0: registers again (new generation); room 3 succeeds. */
    D[0] = spawn(0, 0, 0);
    wait_registered(sd, 0, gen0);
    transfer_ok(P, D, sp, sd, 3);

    for (int r = 0; r < RANKS; r++)
        close(P[r].to);
    kvc_close(sp);
    kvc_close(sd);
    cleanup();
    printf("OK\n");
    return 0;
}
