/*
 * bench_transfer_cmp.c - `kvcoord-bench transfer --compare`: the engine's
 * TCP path side by side with iperf3 in one run (bench_transfer.h).
 *
 * Each round measures, in an order rotated from round to round (so a drift
 * of the machine's load does not always favour the same column):
 *   - iperf3 -c 127.0.0.1 -P1 -l min(block, 1 MiB) against an iperf3 -s this
 *     command starts (iperf3 refuses -l above 1 MiB);
 *   - the engine with splice on (--splice-min, default 256 KiB or the block
 *     size if smaller, so that every payload goes by splice);
 *   - the engine with splice off (tcp_splice_min 0).
 * The engine's figure is the one of the pair its default tcp_splice_min
 * selects (kvt_options_init).  Then the medians over the rounds: GB/s,
 * CPU seconds (both processes) per GB, and the median of the per-round
 * ratios engine / iperf3.  By default one connection and the same working
 * set as iperf3 (one block on each side), the like-for-like comparison.
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

/* One iperf3 client run; 0, 1 (iperf3 said why: errbuf) or -1. */
static int iperf3_once(const bt_args *a, int port, cmp_fig *out, char *errbuf, size_t cap)
{
    char cmd[256], aff[32] = "";
    int secs = (int)ceil(a->duration);
    uint64_t len = a->block < (1u << 20) ? a->block : (1u << 20);
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

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_dbl);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

int bench_transfer_compare(const bt_args *a)
{
    int port;
    pid_t srv = iperf3_server(&port);
    if (srv < 0) {
        fprintf(stderr, "kvcoord-bench: --compare needs iperf3 (apt-get install iperf3), "
                        "which did not start a server\n");
        return 77;
    }
    kvt_options o;
    kvt_options_init(&o);
    /* splice on: every payload of the block's size goes by splice */
    int64_t on = a->splice_min > 0                    ? a->splice_min
                 : a->block < (uint64_t)CMP_SPLICE_ON ? (int64_t)a->block
                                                      : CMP_SPLICE_ON;
    int default_on = o.tcp_splice_min != 0;
    int n = a->rounds, rc = 0;
    double *v = calloc((size_t)n * 8, sizeof *v); /* per round: ip, on, off, cpu x3, ratio */
    if (!v) {
        kill(srv, SIGKILL);
        waitpid(srv, NULL, 0);
        return 1;
    }
    printf("transfer --compare: block %llu, batch %u, working set %u, conns %u, depth %u, "
           "%.1f s per run; engine default tcp_splice_min %u (%s); splice on = %lld bytes\n",
           (unsigned long long)a->block, a->batch, a->wset, a->conns, a->depth, a->duration,
           o.tcp_splice_min, default_on ? "on" : "off", (long long)on);
    printf("%-5s %8s %8s %8s %8s   %s\n", "round", "iperf3", "spl-on", "spl-off", "ratio",
           "CPU s/GB iperf3 / on / off");
    for (int r = 0; r < n && !rc; r++) {
        cmp_fig f[3] = {{0, 0}, {0, 0}, {0, 0}};
        uint64_t spl_on = 0, spl_off = 0;
        for (int k = 0; k < 3 && !rc; k++) {
            int which = (k + r) % 3;
            if (which == 0)
                rc = iperf3_run(a, port, &f[0]);
            else if (which == 1)
                rc = engine_run(a, on, &f[1], &spl_on);
            else
                rc = engine_run(a, 0, &f[2], &spl_off);
        }
        if (rc)
            break;
        if (!spl_on || spl_off)
            fprintf(stderr,
                    "kvcoord-bench: round %d: %llu bytes spliced with splice on, %llu "
                    "with it off\n",
                    r + 1, (unsigned long long)spl_on, (unsigned long long)spl_off);
        double eng = default_on ? f[1].gbs : f[2].gbs;
        double *row = v + r * 7;
        row[0] = f[0].gbs, row[1] = f[1].gbs, row[2] = f[2].gbs;
        row[3] = f[0].cpu, row[4] = f[1].cpu, row[5] = f[2].cpu;
        row[6] = f[0].gbs > 0 ? eng / f[0].gbs : 0;
        printf("%-5d %8.2f %8.2f %8.2f %7.2fx   %.3f / %.3f / %.3f\n", r + 1, row[0], row[1],
               row[2], row[6], row[3], row[4], row[5]);
        fflush(stdout);
    }
    kill(srv, SIGTERM);
    waitpid(srv, NULL, 0);
    if (!rc) {
        double m[7], *col = v + (size_t)n * 7; /* scratch: the 8th column */
        int k = n;
        for (int c = 0; c < 7; c++) {
            for (int r = 0; r < k; r++)
                col[r] = v[r * 7 + c];
            m[c] = median(col, k);
        }
        printf("median of %d rounds: iperf3 %.2f GB/s; engine (default, splice %s) %.2f GB/s, "
               "%.2fx iperf3 (median of the ratios); splice on %.2f / off %.2f GB/s "
               "(on/off %.2fx); CPU s/GB iperf3 %.3f, splice on %.3f, off %.3f\n",
               k, m[0], default_on ? "on" : "off", default_on ? m[1] : m[2], m[6], m[1], m[2],
               m[2] > 0 ? m[1] / m[2] : 0, m[3], m[4], m[5]);
        if (a->json)
            printf("{\"mode\":\"compare\",\"block\":%llu,\"working_set\":%u,\"conns\":%u,"
                   "\"rounds\":%d,\"iperf3_gb_per_s\":%.3f,\"engine_gb_per_s\":%.3f,"
                   "\"ratio\":%.3f,\"splice_on_gb_per_s\":%.3f,\"splice_off_gb_per_s\":%.3f,"
                   "\"cpu_s_per_gb_iperf3\":%.3f,\"cpu_s_per_gb_splice_on\":%.3f,"
                   "\"cpu_s_per_gb_splice_off\":%.3f,\"default_splice\":%s}\n",
                   (unsigned long long)a->block, a->wset, a->conns, k, m[0],
                   default_on ? m[1] : m[2], m[6], m[1], m[2], m[3], m[4], m[5],
                   default_on ? "true" : "false");
    }
    free(v);
    return rc ? 1 : 0;
}
