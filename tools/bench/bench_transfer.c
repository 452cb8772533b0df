/*
 * bench_transfer.c - the `transfer` and `kv` subcommands of kvcoord-bench
 * (dispatched from bench.c's main to bench_transfer_main), measuring the
 * transfer engine between two processes.
 *
 *   kvcoord-bench transfer [--backend tcp|verbs|auto] [--block 1M]
 *       [--batch 16] [--working-set N] [--conns 2] [--depth 2] [--duration 4]
 *       [--pin S,R] [--listen H:P] [--read] [--json]
 *   kvcoord-bench transfer --rw [--block 64K] [--batch 256] [--rounds 5] ...
 *   kvcoord-bench kv [--backend ...] [--conns 2] [--depth 2] [--duration 4] [--json]
 *
 * transfer: each room is a batch of `batch` blocks of `block` bytes
 * (4 KiB..64 MiB; K/M suffixes), never contiguous (so never coalesced),
 * written as one frame each; `depth` rooms in flight.  The blocks of a
 * room are `working-set` distinct blocks on each side (default: batch,
 * every block distinct; 1: the same source block written to the same
 * destination block batch times, the one reused buffer of iperf3).
 * --pin S,R pins the sender to CPU S and the receiver to CPU R (as
 * iperf3 -A S,R does).  kv: each room is
 * one request of Llama-3.1-8B at TP=8, per rank: 32 layers x K,V x 1 KV
 * head x 128 dim x bf16 per token, 4096 tokens in scattered pages of 16
 * tokens (16384 runs of 4 KiB, 64 MiB).  One summary line: GB/s (1e9
 * bytes), writes/s, room latency median and p99.  The receiver is a
 * forked process on the same host; the data goes through the socket
 * (force_socket) unless --same-host lets the engines copy it
 * (docs/transfer.md, "Same-host copy").  --read: the same blocks are read
 * (kvt_submit_read) from the forked process into this one's memory.
 */
#include <errno.h>
#include <sched.h>
#include <stdbool.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"
#include "bench_transfer.h"
#include "kvcoord/transfer.h"

static int parse_size(const char *s, uint64_t *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || v <= 0)
        return -1;
    if (*end == 'K' || *end == 'k')
        v *= 1024, end++;
    else if (*end == 'M' || *end == 'm')
        v *= 1024 * 1024, end++;
    else if (*end == 'G' || *end == 'g')
        v *= 1024.0 * 1024 * 1024, end++;
    if (*end == 'i' || *end == 'B')
        end += *end == 'i' ? (end[1] == 'B' ? 2 : 1) : 1;
    if (*end)
        return -1;
    *out = (uint64_t)v;
    return 0;
}

void bench_transfer_usage(FILE *out)
{
    fprintf(
        out,
        "       kvcoord-bench transfer [--backend tcp|verbs|auto] [--block SIZE] [--batch N]\n"
        "                       [--working-set N] [--conns N] [--depth N] [--duration S]\n"
        "                       [--pin SENDER_CPU,RECEIVER_CPU] [--splice-min SIZE]\n"
        "                       [--compare [--rounds N]] [--read] [--rw [--rounds N]]\n"
        "                       [--listen HOST:PORT] [--same-host] [--json]\n"
        "       kvcoord-bench kv [--backend B] [--conns N] [--depth N] [--duration S] [--json]\n");
}

static void usage(void)
{
    fprintf(stderr, "usage:\n");
    bench_transfer_usage(stderr);
    fprintf(stderr, "SIZE accepts K/M suffixes (4K..64M).\n");
    exit(2);
}

static void parse(int argc, char **argv, bt_args *a)
{
    if (argc < 2 || (strcmp(argv[1], "transfer") && strcmp(argv[1], "kv")))
        usage();
    *a = (bt_args){.kv = !strcmp(argv[1], "kv"),
                   .backend = KVT_BACKEND_TCP,
                   .block = 1u << 20,
                   .batch = 16,
                   .conns = 2,
                   .depth = 2,
                   .duration = 4,
                   .listen = "127.0.0.1:0",
                   .pin_send = -1,
                   .pin_recv = -1,
                   .splice_min = -1,
                   .rounds = 5};
    static struct option opts[] = {
        {"backend", 1, 0, 'b'}, {"block", 1, 0, 'k'},     {"batch", 1, 0, 'n'},
        {"conns", 1, 0, 'c'},   {"depth", 1, 0, 'd'},     {"duration", 1, 0, 't'},
        {"listen", 1, 0, 'l'},  {"json", 0, 0, 'j'},      {"working-set", 1, 0, 'w'},
        {"pin", 1, 0, 'p'},     {"help", 0, 0, 'h'},      {"splice-min", 1, 0, 's'},
        {"compare", 0, 0, 'C'}, {"rounds", 1, 0, 'r'},    {"read", 0, 0, 'R'},
        {"rw", 0, 0, 'W'},      {"same-host", 0, 0, 'S'}, {0, 0, 0, 0}};
    int c;
    optind = 2;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case 'b':
            if (kvt_backend_parse(optarg, &a->backend))
                usage();
            break;
        case 'k':
            if (parse_size(optarg, &a->block) || a->block < 4096 || a->block > (64u << 20)) {
                fprintf(stderr, "--block must be 4K..64M\n");
                exit(2);
            }
            a->block_given = 1;
            break;
        case 'n':
            a->batch = (uint32_t)atoi(optarg);
            a->batch_given = 1;
            break;
        case 'c':
            a->conns = (uint32_t)atoi(optarg);
            a->conns_given = 1;
            break;
        case 'd':
            a->depth = (uint32_t)atoi(optarg);
            a->depth_given = 1;
            break;
        case 'w':
            a->wset = (uint32_t)atoi(optarg);
            a->wset_given = 1;
            break;
        case 'C': a->compare = 1; break;
        case 'R': a->read = 1; break;
        case 'S': a->same_host = 1; break;
        case 'W': a->rw = 1; break;
        case 'r': a->rounds = atoi(optarg); break;
        case 'p':
            if (sscanf(optarg, "%d,%d", &a->pin_send, &a->pin_recv) != 2 || a->pin_send < 0 ||
                a->pin_recv < 0) {
                fprintf(stderr, "--pin takes SENDER_CPU,RECEIVER_CPU\n");
                exit(2);
            }
            break;
        case 's': {
            uint64_t v = 0;
            if (strcmp(optarg, "0") && (parse_size(optarg, &v) || v > UINT32_MAX)) {
                fprintf(stderr, "--splice-min takes a size (0: off)\n");
                exit(2);
            }
            a->splice_min = (int64_t)v;
            break;
        }
        case 't': a->duration = atof(optarg); break;
        case 'l': a->listen = optarg; break;
        case 'j': a->json = 1; break;
        case 'h':
            printf("usage:\n");
            bench_transfer_usage(stdout);
            printf("SIZE accepts K/M suffixes (4K..64M).  kvcoord-bench --help describes them.\n");
            exit(0);
        default: usage();
        }
    }
    if (!a->batch || !a->conns || !a->depth || a->depth > 64 || a->duration <= 0 || a->rounds < 1 ||
        (a->compare && a->kv) || (a->rw && (a->kv || a->compare)))
        usage();
    if (a->rw) { /* sglang's call pattern: 64 KiB pages, 256 a call, one call at a time */
        if (!a->block_given)
            a->block = 64u << 10;
        if (!a->batch_given)
            a->batch = 256;
        if (!a->depth_given)
            a->depth = 1;
    }
    if (a->compare && !a->wset_given)
        a->wset = 1; /* iperf3's working set: one buffer on each side */
    if (a->compare && !a->conns_given)
        a->conns = 1; /* iperf3 -P1: one stream */
    if (!a->wset || a->wset > a->batch)
        a->wset = a->batch;
}

static void pin(int cpu)
{
    if (cpu < 0)
        return;
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    if (sched_setaffinity(0, sizeof set, &set))
        perror("sched_setaffinity");
}

static void log_err(void *ctx, int level, const char *msg)
{
    (void)ctx;
    if (level <= KVT_LOG_WARN || getenv("KVT_BENCH_VERBOSE"))
        fprintf(stderr, "kvcoord-bench[%d]: %s\n", (int)getpid(), msg);
}

static kvt_engine *make_engine(const bt_args *a, uint64_t slice)
{
    kvt_options o;
    kvt_options_init(&o);
    o.backend = a->backend;
    o.listen = a->listen;
    o.conns_per_peer = a->conns;
    o.slice_bytes = (uint32_t)slice;
    o.window_bytes = (uint32_t)(slice * 4 > (32u << 20) ? slice * 4 : (32u << 20));
    o.log = log_err;
    /* The receiver is on this host: without --same-host the data goes
     * through the socket, the path measured against iperf3. */
    o.force_socket = !a->same_host;
    if (a->splice_min >= 0)
        o.tcp_splice_min = (uint32_t)a->splice_min;
    kvt_engine *e;
    if (kvt_engine_create(&o, &e)) {
        fprintf(stderr, "kvcoord-bench: %s\n", kvc_last_error());
        exit(1);
    }
    return e;
}

static void *map(size_t n)
{
    void *p =
        mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    if (p == MAP_FAILED) {
        perror("mmap");
        exit(1);
    }
    return p;
}

/* Receiver: a region of len bytes; writes its descriptor to fd; drives
 * its engine until killed. */
static void receiver(const bt_args *a, uint64_t slice, size_t len, int fd)
{
    kvt_engine *e = make_engine(a, slice);
    void *buf = map(len);
    char *d;
    if (kvt_mr_register(e, buf, len, NULL) || kvt_descriptor_export(e, &d)) {
        fprintf(stderr, "receiver: %s\n", kvc_last_error());
        _exit(1);
    }
    uint32_t n = (uint32_t)strlen(d);
    if (write(fd, &n, 4) != 4 || write(fd, d, n) != (ssize_t)n)
        _exit(1);
    for (;;) {
        kvt_event ev[64];
        size_t k;
        if (kvt_progress(e, 1000, ev, 64, &k))
            _exit(1);
    }
}

static double tv_s(const struct timeval *t) { return (double)t->tv_sec + (double)t->tv_usec / 1e6; }

static int cmp_u64(const void *x, const void *y)
{
    uint64_t a = *(const uint64_t *)x, b = *(const uint64_t *)y;
    return a < b ? -1 : a > b;
}

/* The kv mode's request: 64 planes x 256 pages of 4 KiB, pages scattered
 * in a pool of 512 pages per plane on each side. */
#define KV_PLANES 64u
#define KV_PAGE 4096u
#define KV_POOL_PAGES 512u
#define KV_REQ_PAGES 256u

static size_t kv_runs(uint64_t lbase, uint64_t rbase, kvt_run *runs, unsigned seed)
{
    uint32_t src[KV_POOL_PAGES], dst[KV_POOL_PAGES];
    for (uint32_t i = 0; i < KV_POOL_PAGES; i++)
        src[i] = dst[i] = i;
    srand(seed);
    for (uint32_t i = KV_POOL_PAGES - 1; i > 0; i--) {
        uint32_t j = (uint32_t)rand() % (i + 1), t = src[i];
        src[i] = src[j], src[j] = t;
        j = (uint32_t)rand() % (i + 1), t = dst[i];
        dst[i] = dst[j], dst[j] = t;
    }
    size_t n = 0;
    for (uint32_t p = 0; p < KV_PLANES; p++)
        for (uint32_t i = 0; i < KV_REQ_PAGES; i++)
            runs[n++] =
                (kvt_run){lbase + ((uint64_t)p * KV_POOL_PAGES + src[i]) * KV_PAGE,
                          rbase + ((uint64_t)p * KV_POOL_PAGES + dst[i]) * KV_PAGE, KV_PAGE};
    return n;
}

/* A run that cannot go on: its receiver goes (it would serve forever). */
static int abort_run(pid_t pid)
{
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    return 1;
}

int bench_transfer_run(const bt_args *ap, bt_result *res)
{
    bt_args a = *ap;
    memset(res, 0, sizeof *res);
    uint64_t stride = a.block + 4096; /* a gap: blocks are never coalesced */
    uint32_t slots = a.wset;
    while (slots > 1 && (uint64_t)slots * stride > (512ull << 20))
        slots--;
    size_t len = a.kv ? (size_t)KV_PLANES * KV_POOL_PAGES * KV_PAGE : (size_t)slots * stride;
    uint64_t slice = a.kv ? (1u << 20) : a.block;
    int p[2];
    if (pipe(p))
        return 1;
    pid_t pid = fork();
    if (pid == 0) {
        close(p[0]);
        pin(a.pin_recv);
        receiver(&a, slice, len, p[1]);
    }
    close(p[1]);
    pin(a.pin_send);
    uint32_t n;
    char *desc = NULL;
    bool got =
        read(p[0], &n, 4) == 4 && (desc = calloc(1, n + 1)) && read(p[0], desc, n) == (ssize_t)n;
    close(p[0]);
    if (!got) {
        fprintf(stderr, "kvcoord-bench: receiver did not start\n");
        free(desc);
        return abort_run(pid);
    }
    kvt_engine *e = make_engine(&a, slice);
    unsigned char *src = map(len);
    memset(src, 0x5a, len);
    kvt_peer *peer;
    if (kvt_mr_register(e, src, len, NULL) || kvt_peer_import(e, desc, n, &peer)) {
        fprintf(stderr, "kvcoord-bench: %s\n", kvc_last_error());
        return abort_run(pid);
    }
    const char *ad = strstr(desc, "\"addr\":");
    uint64_t rbase = ad ? strtoull(ad + 7, NULL, 10) : 0;
    size_t nruns = a.kv ? (size_t)KV_PLANES * KV_REQ_PAGES : a.batch;
    kvt_run *runs = calloc(nruns, sizeof *runs);
    uint64_t room_bytes = 0;
    if (a.kv) {
        kv_runs((uint64_t)(uintptr_t)src, rbase, runs, 1);
    } else {
        for (uint32_t i = 0; i < a.batch; i++)
            runs[i] = (kvt_run){(uint64_t)(uintptr_t)src + (i % slots) * stride,
                                rbase + (i % slots) * stride, a.block};
    }
    for (size_t i = 0; i < nruns; i++)
        room_bytes += runs[i].len;

    size_t lat_cap = 1 << 20, nlat = 0;
    uint64_t *lat = malloc(lat_cap * sizeof *lat);
    uint64_t start_of[64] = {0};
    uint64_t next_room = 1, done_rooms = 0, failed = 0;
    kvt_stats s0, s1;
    kvt_engine_stat(e, &s0);
    struct rusage ru0, ru1, rur;
    getrusage(RUSAGE_SELF, &ru0);
    uint64_t t0 = kvc__mono_ns(), end = t0 + (uint64_t)(a.duration * 1e9), inflight = 0;
    for (;;) {
        uint64_t t = kvc__mono_ns();
        while (t < end && inflight < a.depth) {
            start_of[next_room % 64] = kvc__mono_ns();
            if ((a.read ? kvt_submit_read : kvt_submit)(e, peer, next_room, runs, nruns,
                                                        KVT_SUBMIT_NOROOM)) {
                fprintf(stderr, "kvcoord-bench: submit: %s\n", kvc_last_error());
                return abort_run(pid);
            }
            next_room++;
            inflight++;
        }
        if (!inflight)
            break;
        kvt_event ev[64];
        size_t k;
        if (kvt_progress(e, 100, ev, 64, &k)) {
            fprintf(stderr, "kvcoord-bench: %s\n", kvc_last_error());
            return abort_run(pid);
        }
        uint64_t tn = kvc__mono_ns();
        for (size_t i = 0; i < k; i++) {
            inflight--;
            if (ev[i].state != KVC_POLL_SUCCESS) {
                failed++;
                fprintf(stderr, "kvcoord-bench: room %llu failed: %s\n",
                        (unsigned long long)ev[i].room, ev[i].reason);
                continue;
            }
            done_rooms++;
            if (nlat < lat_cap)
                lat[nlat++] = tn - start_of[ev[i].room % 64];
        }
    }
    double secs = (double)(kvc__mono_ns() - t0) / 1e9;
    kvt_engine_stat(e, &s1);
    getrusage(RUSAGE_SELF, &ru1);
    kill(pid, SIGKILL);
    int wst;
    if (wait4(pid, &wst, 0, &rur) < 0)
        memset(&rur, 0, sizeof rur);
    /* CPU seconds of both processes per GB moved: the sender's during the
     * run, the receiver's over its whole life (its setup is a few ms). */
    double cpu = tv_s(&ru1.ru_utime) + tv_s(&ru1.ru_stime) - tv_s(&ru0.ru_utime) -
                 tv_s(&ru0.ru_stime) + tv_s(&rur.ru_utime) + tv_s(&rur.ru_stime);
    qsort(lat, nlat, sizeof *lat, cmp_u64);
    double med = nlat ? (double)lat[nlat / 2] / 1e6 : 0,
           p99 = nlat ? (double)lat[(nlat * 99) / 100] / 1e6 : 0;
    uint64_t bytes = a.read ? s1.bytes_read - s0.bytes_read : s1.bytes_sent - s0.bytes_sent,
             writes = a.read ? s1.reads_done - s0.reads_done : s1.writes_sent - s0.writes_sent;
    double gbs = (double)bytes / secs / 1e9, ops = (double)writes / secs;
    *res = (bt_result){.secs = secs,
                       .gbs = gbs,
                       .cpu_s_per_gb = bytes ? cpu / ((double)bytes / 1e9) : 0.0,
                       .ops = ops,
                       .lat_med_ms = med,
                       .lat_p99_ms = p99,
                       .rooms = done_rooms,
                       .failed = failed,
                       .room_bytes = room_bytes,
                       .bytes = bytes,
                       .bytes_spliced = s1.bytes_spliced - s0.bytes_spliced,
                       .slots = slots,
                       .nruns = nruns,
                       .backend = kvt_engine_backend(e)};
    kvt_engine_destroy(e);
    munmap(src, len);
    free(runs);
    free(lat);
    free(desc);
    return failed ? 1 : 0;
}

static void print_result(const bt_args *ap, const bt_result *r)
{
    bt_args a = *ap;
    uint32_t slots = r->slots;
    size_t nruns = r->nruns;
    uint64_t done_rooms = r->rooms, failed = r->failed, room_bytes = r->room_bytes,
             bytes = r->bytes;
    double secs = r->secs, gbs = r->gbs, ops = r->ops, med = r->lat_med_ms, p99 = r->lat_p99_ms;
    double cpu_per_gb = r->cpu_s_per_gb;
    const char *be = kvt_backend_name(r->backend);
    if (a.json)
        printf("{\"mode\":\"%s\",\"op\":\"%s\",\"backend\":\"%s\",\"block\":%llu,\"batch\":%u,"
               "\"working_set\":%u,"
               "\"conns\":%u,"
               "\"depth\":%u,"
               "\"duration_s\":%.3f,\"rooms\":%llu,\"rooms_failed\":%llu,\"room_bytes\":%llu,"
               "\"bytes\":%llu,"
               "\"gb_per_s\":%.3f,\"cpu_s_per_gb\":%.3f,\"writes_per_s\":%.1f,\"latency_median_"
               "ms\":%.3f,\"latency_p99_"
               "ms\":%.3f}\n",
               a.kv ? "kv" : "transfer", a.read ? "read" : "write", be,
               (unsigned long long)(a.kv ? KV_PAGE : a.block), a.kv ? (unsigned)nruns : a.batch,
               a.kv ? 0 : slots, a.conns, a.depth, secs, (unsigned long long)done_rooms,
               (unsigned long long)failed, (unsigned long long)room_bytes,
               (unsigned long long)bytes, gbs, cpu_per_gb, ops, med, p99);
    else if (a.kv)
        printf("kv backend=%s request=%llu MiB (%zu runs of 4 KiB) conns=%u depth=%u: %.2f GB/s, "
               "%.0f writes/s, "
               "%.1f requests/s, request latency median %.2f ms p99 %.2f ms (%llu requests, %llu "
               "failed)\n",
               be, (unsigned long long)(room_bytes >> 20), nruns, a.conns, a.depth, gbs, ops,
               (double)done_rooms / secs, med, p99, (unsigned long long)done_rooms,
               (unsigned long long)failed);
    else
        printf("transfer %s backend=%s block=%llu batch=%u working-set=%u conns=%u depth=%u: %.2f "
               "GB/s, %.0f ops/s, batch latency median %.2f ms p99 %.2f ms (%llu batches, %llu "
               "failed)\n",
               a.read ? "read" : "write", be, (unsigned long long)a.block, a.batch, slots, a.conns,
               a.depth, gbs, ops, med, p99, (unsigned long long)done_rooms,
               (unsigned long long)failed);
}

int bench_transfer_main(int argc, char **argv)
{
    bt_args a;
    parse(argc, argv, &a);
    signal(SIGPIPE, SIG_IGN);
    if (a.compare)
        return bench_transfer_compare(&a);
    if (a.rw)
        return bench_transfer_rw(&a);
    bt_result r;
    int rc = bench_transfer_run(&a, &r);
    if (rc == 0 || r.bytes)
        print_result(&a, &r);
    return rc;
}
