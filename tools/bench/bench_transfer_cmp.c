/*
 * bench_transfer_cmp.c - `kvcoord-bench transfer --compare`: the engine's
 * TCP path side by side with iperf3 in one run (bench_transfer.h).
 *
 * Blocks: --block, or else 1 MiB and 4 MiB (the sizes issue 22's aim
 * names).  Each round measures, at each block, in an order rotated from
 * round to round (so a drift of the machine's load does not always favour
 * the same column):
 *   - iperf3 -c 127.0.0.1 -P1 -l min(block, 1 MiB) against an iperf3 -s this
 *     command starts (iperf3 refuses -l above 1 MiB);
 *   - the send/recv loop at the block itself (bench_sock.c): iperf3's loop
 *     where iperf3 cannot go, the same-block baseline;
 *   - the engine with splice on (--splice-min, default 256 KiB or the block
 *     size if smaller, so that every payload goes by splice);
 *   - the engine with splice off (tcp_splice_min 0).
 * The engine's figure is the one of the pair its default tcp_splice_min
 * selects (kvt_options_init).  Then per block the medians over the rounds:
 * GB/s, CPU seconds (both processes) per GB, and the medians of the
 * per-round ratios engine / iperf3 and engine / loop.  By default one
 * connection and the same working set as iperf3 (one block on each side),
 * the like-for-like comparison.
 */
#include <jansson.h>
#include <math.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench_transfer.h"

#define CMP_SPLICE_ON (256u << 10)

typedef struct cmp_fig {
    double gbs, cpu; /* GB/s; CPU s per GB */
} cmp_fig;

static int port_open(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET,
                             .sin_port = htons((uint16_t)port),
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    int ok = fd >= 0 && connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0;
    if (fd >= 0)
        close(fd);
    return ok;
}

/* iperf3 -s on a free-looking port; its pid, or -1 (no iperf3). */
static pid_t iperf3_server(int *port)
{
    srand((unsigned)time(NULL) ^ (unsigned)getpid());
    for (int tries = 0; tries < 5; tries++) {
        *port = 20000 + rand() % 20000;
        if (port_open(*port))
            continue; /* taken */
        pid_t pid = fork();
        if (pid == 0) {
            if (!freopen("/dev/null", "w", stdout) || !freopen("/dev/null", "w", stderr))
                _exit(127);
            char p[16];
            snprintf(p, sizeof p, "%d", *port);
            execlp("iperf3", "iperf3", "-s", "-p", p, (char *)NULL);
            _exit(127);
        }
        if (pid < 0)
            return -1;
        for (int i = 0; i < 100; i++) { /* up to 5 s for it to listen */
            if (port_open(*port))
                return pid;
            int st;
            if (waitpid(pid, &st, WNOHANG) == pid)
                break; /* exited: no iperf3, or the port was taken */
            struct timespec ts = {0, 50 * 1000000L};
            nanosleep(&ts, NULL);
        }
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
    }
    return -1;
}

/* iperf3's write size for a block: iperf3 refuses -l above 1 MiB. */
static uint64_t iperf3_len(const bt_args *a)
{
    return a->block < (1u << 20) ? a->block : (1u << 20);
}

/* "1M", "64K" or the byte count, for the rounds' table. */
static const char *size_label(uint64_t n, char *buf, size_t cap)
{
    if (n >= (1u << 20) && !(n & ((1u << 20) - 1)))
        snprintf(buf, cap, "%lluM", (unsigned long long)(n >> 20));
    else if (n >= 1024 && !(n & 1023))
        snprintf(buf, cap, "%lluK", (unsigned long long)(n >> 10));
    else
        snprintf(buf, cap, "%llu", (unsigned long long)n);
    return buf;
}

/* One iperf3 client run; 0, 1 (iperf3 said why: errbuf) or -1. */
static int iperf3_once(const bt_args *a, int port, cmp_fig *out, char *errbuf, size_t cap)
{
    char cmd[256], aff[32] = "";
    int secs = (int)ceil(a->duration);
    uint64_t len = iperf3_len(a);
    if (a->pin_send >= 0)
        snprintf(aff, sizeof aff, " -A %d,%d", a->pin_send, a->pin_recv);
    snprintf(cmd, sizeof cmd, "iperf3 -c 127.0.0.1 -p %d -t %d -l %llu%s -J", port,
             secs < 1 ? 1 : secs, (unsigned long long)len, aff);
    FILE *f = popen(cmd, "r");
    if (!f) {
        perror("popen iperf3");
        return -1;
    }
    json_error_t jerr;
    json_t *d = json_loadf(f, 0, &jerr);
    int st = pclose(f);
    double bps = 0, secs_rx = 0, bytes = 0, host = 0, remote = 0;
    int got = d && json_unpack(d, "{s:{s:{s:F,s:F,s:F},s:{s:F,s:F}}}", "end", "sum_received",
                               "bits_per_second", &bps, "seconds", &secs_rx, "bytes", &bytes,
                               "cpu_utilization_percent", "host_total", &host, "remote_total",
                               &remote) == 0;
    const char *why = d ? json_string_value(json_object_get(d, "error")) : NULL;
    snprintf(errbuf, cap, "%s: %s (exit status %d)", cmd, why ? why : "no result", st);
    json_decref(d);
    if (!got || st != 0 || bytes <= 0)
        return 1;
    out->gbs = bps / 8e9;
    out->cpu = (host + remote) / 100 * secs_rx / (bytes / 1e9);
    return 0;
}

/* iperf3_once, again after a pause when it fails: the server takes a moment
 * to be ready for the next test ("the server is busy running a test"). */
static int iperf3_run(const bt_args *a, int port, cmp_fig *out)
{
    char why[512];
    for (int tries = 0; tries < 5; tries++) {
        if (!iperf3_once(a, port, out, why, sizeof why))
            return 0;
        struct timespec ts = {0, 300 * 1000000L};
        nanosleep(&ts, NULL);
    }
    fprintf(stderr, "kvcoord-bench: %s\n", why);
    return -1;
}

static int engine_run(const bt_args *a, int64_t splice_min, cmp_fig *out, uint64_t *spliced)
{
    bt_args b = *a;
    b.splice_min = splice_min;
    bt_result r;
    if (bench_transfer_run(&b, &r))
        return -1;
    out->gbs = r.gbs;
    out->cpu = r.cpu_s_per_gb;
    *spliced = r.bytes_spliced;
    return 0;
}

static int cmp_dbl(const void *x, const void *y)
{
    double a = *(const double *)x, b = *(const double *)y;
    return a < b ? -1 : a > b;
}

/* Per block and round, CMP_COLS figures: GB/s and CPU s/GB of iperf3, the
 * send/recv loop, splice on, splice off; then the engine / iperf3 and the
 * engine / loop ratios of the round. */
enum { C_IP, C_SOCK, C_ON, C_OFF, C_IPCPU, C_SOCKCPU, C_ONCPU, C_OFFCPU, C_RIP, C_RSOCK, CMP_COLS };

/* Median of column c of n rows of CMP_COLS (scratch: n doubles). */
static double median_col(const double *v, int n, int c, double *scratch)
{
    for (int r = 0; r < n; r++)
        scratch[r] = v[r * CMP_COLS + c];
    qsort(scratch, (size_t)n, sizeof *scratch, cmp_dbl);
    return n % 2 ? scratch[n / 2] : (scratch[n / 2 - 1] + scratch[n / 2]) / 2;
}

/* One round at one block: the four measurements in an order rotated by
 * the round.  0, or -1 (said why on stderr). */
static int cmp_round(const bt_args *a, int port, int64_t on, int default_on, int r, double *row)
{
    cmp_fig f[4] = {{0, 0}, {0, 0}, {0, 0}, {0, 0}};
    uint64_t spl_on = 0, spl_off = 0;
    for (int k = 0; k < 4; k++) {
        int which = (k + r) % 4, rc;
        if (which == 0)
            rc = iperf3_run(a, port, &f[0]);
        else if (which == 1)
            rc = bench_sock_run(a, &f[1].gbs, &f[1].cpu);
        else if (which == 2)
            rc = engine_run(a, on, &f[2], &spl_on);
        else
            rc = engine_run(a, 0, &f[3], &spl_off);
        if (rc)
            return -1;
    }
    if (!spl_on || spl_off)
        fprintf(stderr,
                "kvcoord-bench: round %d: %llu bytes spliced with splice on, %llu "
                "with it off\n",
                r + 1, (unsigned long long)spl_on, (unsigned long long)spl_off);
    double eng = default_on ? f[2].gbs : f[3].gbs;
    for (int i = 0; i < 4; i++) {
        row[C_IP + i] = f[i].gbs;
        row[C_IPCPU + i] = f[i].cpu;
    }
    row[C_RIP] = f[0].gbs > 0 ? eng / f[0].gbs : 0;
    row[C_RSOCK] = f[1].gbs > 0 ? eng / f[1].gbs : 0;
    return 0;
}

static void cmp_summary(const bt_args *a, const double *v, int n, int default_on)
{
    double m[CMP_COLS], *scratch = malloc((size_t)n * sizeof *scratch);
    if (!scratch)
        return;
    for (int c = 0; c < CMP_COLS; c++)
        m[c] = median_col(v, n, c, scratch);
    free(scratch);
    double eng = default_on ? m[C_ON] : m[C_OFF], engcpu = default_on ? m[C_ONCPU] : m[C_OFFCPU];
    printf("block %llu, median of %d rounds: iperf3 %.2f GB/s; send/recv loop %.2f GB/s; "
           "engine (default, splice %s) %.2f GB/s = %.2fx iperf3, %.2fx the loop (medians of "
           "the rounds' ratios); splice on %.2f / off %.2f GB/s (on/off %.2fx); CPU s/GB "
           "iperf3 %.3f, loop %.3f, engine %.3f (splice on %.3f, off %.3f)\n",
           (unsigned long long)a->block, n, m[C_IP], m[C_SOCK], default_on ? "on" : "off", eng,
           m[C_RIP], m[C_RSOCK], m[C_ON], m[C_OFF], m[C_OFF] > 0 ? m[C_ON] / m[C_OFF] : 0,
           m[C_IPCPU], m[C_SOCKCPU], engcpu, m[C_ONCPU], m[C_OFFCPU]);
    if (a->json)
        printf("{\"mode\":\"compare\",\"block\":%llu,\"iperf3_block\":%llu,\"working_set\":%u,"
               "\"conns\":%u,\"rounds\":%d,\"iperf3_gb_per_s\":%.3f,\"engine_gb_per_s\":%.3f,"
               "\"ratio\":%.3f,\"splice_on_gb_per_s\":%.3f,\"splice_off_gb_per_s\":%.3f,"
               "\"sock_gb_per_s\":%.3f,\"ratio_sock\":%.3f,"
               "\"cpu_s_per_gb_iperf3\":%.3f,\"cpu_s_per_gb_sock\":%.3f,"
               "\"cpu_s_per_gb_splice_on\":%.3f,\"cpu_s_per_gb_splice_off\":%.3f,"
               "\"default_splice\":%s}\n",
               (unsigned long long)a->block, (unsigned long long)iperf3_len(a), a->wset, a->conns,
               n, m[C_IP], eng, m[C_RIP], m[C_ON], m[C_OFF], m[C_SOCK], m[C_RSOCK], m[C_IPCPU],
               m[C_SOCKCPU], m[C_ONCPU], m[C_OFFCPU], default_on ? "true" : "false");
}

int bench_transfer_compare(const bt_args *a)
{
    /* Without --block: 1 MiB and 4 MiB, the sizes the aim names. */
    uint64_t blocks[2] = {1u << 20, 4u << 20};
    int nb = a->block_given ? 1 : 2;
    if (a->block_given)
        blocks[0] = a->block;
    int port;
    pid_t srv = iperf3_server(&port);
    if (srv < 0) {
        fprintf(stderr, "kvcoord-bench: --compare needs iperf3 (apt-get install iperf3), "
                        "which did not start a server\n");
        return 77;
    }
    kvt_options o;
    kvt_options_init(&o);
    int default_on = o.tcp_splice_min != 0;
    int n = a->rounds, rc = 0;
    double *v = calloc((size_t)n * nb * CMP_COLS, sizeof *v);
    if (!v) {
        kill(srv, SIGKILL);
        waitpid(srv, NULL, 0);
        return 1;
    }
    bt_args b[2];
    int64_t on[2];
    for (int k = 0; k < nb; k++) {
        b[k] = *a;
        b[k].block = blocks[k];
        /* splice on: every payload of the block's size goes by splice */
        on[k] = a->splice_min > 0                     ? a->splice_min
                : blocks[k] < (uint64_t)CMP_SPLICE_ON ? (int64_t)blocks[k]
                                                      : CMP_SPLICE_ON;
        printf("transfer --compare: block %llu (iperf3 -l %llu), batch %u, working set %u, "
               "conns %u, depth %u, %.1f s per run; engine default tcp_splice_min %u (%s); "
               "splice on = %lld bytes\n",
               (unsigned long long)blocks[k], (unsigned long long)iperf3_len(&b[k]), a->batch,
               a->wset, a->conns, a->depth, a->duration, o.tcp_splice_min,
               default_on ? "on" : "off", (long long)on[k]);
    }
    printf("%-5s %-6s %7s %7s %7s %7s %7s %7s   %s\n", "round", "block", "iperf3", "loop", "spl-on",
           "spl-off", "/iperf3", "/loop", "CPU s/GB iperf3 / loop / on / off");
    for (int r = 0; r < n && !rc; r++)
        for (int k = 0; k < nb && !rc; k++) {
            double *row = v + ((size_t)k * n + r) * CMP_COLS;
            char lab[24];
            rc = cmp_round(&b[k], port, on[k], default_on, r, row);
            if (rc)
                break;
            printf("%-5d %-6s %7.2f %7.2f %7.2f %7.2f %6.2fx %6.2fx   %.3f / %.3f / %.3f / "
                   "%.3f\n",
                   r + 1, size_label(blocks[k], lab, sizeof lab), row[C_IP], row[C_SOCK], row[C_ON],
                   row[C_OFF], row[C_RIP], row[C_RSOCK], row[C_IPCPU], row[C_SOCKCPU], row[C_ONCPU],
                   row[C_OFFCPU]);
            fflush(stdout);
        }
    kill(srv, SIGTERM);
    waitpid(srv, NULL, 0);
    if (!rc)
        for (int k = 0; k < nb; k++)
            cmp_summary(&b[k], v + (size_t)k * n * CMP_COLS, n, default_on);
    free(v);
    return rc ? 1 : 0;
}

/* ---- --rw: iperf3, engine write, engine read ----------------------------------- */

enum { RW_IP, RW_WR, RW_RD, RW_COLS };

int bench_transfer_rw(const bt_args *a)
{
    int port;
    pid_t srv = iperf3_server(&port);
    if (srv < 0) {
        fprintf(stderr, "kvcoord-bench: --rw needs iperf3 (apt-get install iperf3), which did "
                        "not start a server\n");
        return 77;
    }
    int n = a->rounds, rc = 0;
    double *v = calloc((size_t)n * RW_COLS, sizeof *v), *scratch = calloc((size_t)n, sizeof *v);
    bt_args ip = *a;
    ip.block = 1u << 20; /* iperf3 -l 1 MiB, one stream */
    printf("transfer --rw: engine block %llu x %u per room (every block distinct), conns %u, "
           "depth %u, %.1f s per run; iperf3 -P1 -l 1 MiB; %d rounds, order rotated\n",
           (unsigned long long)a->block, a->batch, a->conns, a->depth, a->duration, n);
    printf("%-5s %8s %8s %8s %8s %8s %8s\n", "round", "iperf3", "write", "read", "wr/ip", "rd/ip",
           "rd/wr");
    for (int r = 0; r < n && !rc && v && scratch; r++) {
        double *row = v + (size_t)r * RW_COLS;
        for (int k = 0; k < RW_COLS && !rc; k++) {
            int which = (k + r) % RW_COLS;
            if (which == RW_IP) {
                cmp_fig f;
                rc = iperf3_run(&ip, port, &f);
                row[RW_IP] = f.gbs;
            } else {
                bt_args b = *a;
                b.read = which == RW_RD;
                bt_result res;
                rc = bench_transfer_run(&b, &res) ? -1 : 0;
                row[which] = res.gbs;
            }
        }
        if (rc)
            break;
        printf("%-5d %8.2f %8.2f %8.2f %7.2fx %7.2fx %7.2fx\n", r + 1, row[RW_IP], row[RW_WR],
               row[RW_RD], row[RW_WR] / row[RW_IP], row[RW_RD] / row[RW_IP],
               row[RW_RD] / row[RW_WR]);
        fflush(stdout);
    }
    kill(srv, SIGTERM);
    waitpid(srv, NULL, 0);
    if (!rc && v && scratch) {
        double m[RW_COLS], rat[3];
        for (int c = 0; c < RW_COLS; c++) {
            for (int r = 0; r < n; r++)
                scratch[r] = v[r * RW_COLS + c];
            qsort(scratch, (size_t)n, sizeof *scratch, cmp_dbl);
            m[c] = n % 2 ? scratch[n / 2] : (scratch[n / 2 - 1] + scratch[n / 2]) / 2;
        }
        for (int k = 0; k < 3; k++) { /* medians of the rounds' ratios */
            for (int r = 0; r < n; r++) {
                const double *row = v + (size_t)r * RW_COLS;
                scratch[r] = k == 0   ? row[RW_WR] / row[RW_IP]
                             : k == 1 ? row[RW_RD] / row[RW_IP]
                                      : row[RW_RD] / row[RW_WR];
            }
            qsort(scratch, (size_t)n, sizeof *scratch, cmp_dbl);
            rat[k] = n % 2 ? scratch[n / 2] : (scratch[n / 2 - 1] + scratch[n / 2]) / 2;
        }
        printf("median of %d rounds: iperf3 %.2f GB/s, engine write %.2f GB/s (%.2fx iperf3), "
               "engine read %.2f GB/s (%.2fx iperf3, %.2fx write)\n",
               n, m[RW_IP], m[RW_WR], rat[0], m[RW_RD], rat[1], rat[2]);
        if (a->json)
            printf("{\"mode\":\"rw\",\"block\":%llu,\"batch\":%u,\"conns\":%u,\"depth\":%u,"
                   "\"rounds\":%d,\"iperf3_gb_per_s\":%.3f,\"write_gb_per_s\":%.3f,"
                   "\"read_gb_per_s\":%.3f,\"write_ratio\":%.3f,\"read_ratio\":%.3f,"
                   "\"read_write_ratio\":%.3f}\n",
                   (unsigned long long)a->block, a->batch, a->conns, a->depth, n, m[RW_IP],
                   m[RW_WR], m[RW_RD], rat[0], rat[1], rat[2]);
    }
    free(v);
    free(scratch);
    return rc ? 1 : 0;
}
