/*
 * bench_rate.c - `kvcoord-bench rate`: HTTP latency at a fixed request rate.
 *
 * wrk and similar tools are closed-loop: a connection sends its next request
 * when the previous answer arrives.  A faster server then makes the client
 * ask more, and on a machine with few CPUs the client's own run-queue waits
 * show up as the server's tail latency; a server that stalls also makes the
 * client ask less, which hides the stall (coordinated omission).  This tool
 * is open-loop: request k is due at start + k / rate, whatever the server
 * does, on connection k mod C.  HTTP/1.1 has one request in flight per
 * connection, so a request due while its connection still waits for an
 * answer is queued; its latency is counted from when it was due, not from
 * when it could be sent.  Two figures per run:
 *
 *   latency  answer complete - request due (what a caller at that rate sees)
 *   service  answer complete - request written (the server and the network)
 *
 * One thread, non-blocking sockets, epoll with a nanosecond timeout
 * (epoll_pwait2) and a 1 ns timer slack (the default 50 us would make every
 * request late by up to that much at low rates).  Answers are framed with http_parser (Content-Length or
 * chunked) and their bodies discarded.  Requests due in the first --warmup
 * seconds are sent but not counted.  A non-2xx status, a closed connection
 * or a socket error counts as failed; a closed connection is reopened.
 * Figures are printed, never judged.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <http_parser.h>
#include <math.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "bench_rate.h"
#include "clock.h"

#define RATE_MAX_CONNS 4096
#define RATE_QUEUE 64 /* requests due but not yet sent, per connection */

typedef struct rate_conn {
    int fd;
    http_parser parser;
    int in_flight;              /* a request written, its answer not complete */
    int complete;               /* set by on_message_complete */
    uint64_t sent_ns;           /* when the in-flight request was written */
    uint64_t due_ns;            /* when it was due */
    uint64_t queue[RATE_QUEUE]; /* due times of requests waiting to be sent */
    unsigned qhead, qlen;
    size_t woff; /* bytes of the request already written */
} rate_conn;

typedef struct rate_run {
    const char *host, *port, *path;
    double rate;    /* requests per second, all connections */
    long conns;     /* connections */
    double seconds; /* measured duration */
    double warmup;  /* seconds not counted */
    int json;
    char request[1024]; /* the GET, written as is */
    size_t request_len;
    int ep;
    rate_conn *c;
    uint64_t *lat, *svc; /* counted samples, ns */
    size_t n, cap;
    uint64_t failed, dropped, reconnects;
    uint64_t non_2xx;     /* of failed: answered with a status outside 2xx */
    unsigned last_status; /* the last such status */
} rate_run;

static const char *rprog = "kvcoord-bench rate";

void bench_rate_usage(FILE *out)
{
    fprintf(out, "       kvcoord-bench rate     --url http://HOST:PORT --rate R [--path P]\n"
                 "                       [--connections C] [--duration S] [--warmup S] [--json]\n");
}

static void rate_help(FILE *out)
{
    fprintf(out,
            "Usage: kvcoord-bench rate --url http://HOST:PORT --rate R [--path P]\n"
            "                          [--connections C] [--duration S] [--warmup S] [--json]\n"
            "\n"
            "HTTP GET latency at a fixed, open-loop request rate: request k is due at\n"
            "start + k/R on connection k mod C, whether or not the server keeps up (a\n"
            "request due while its connection waits for an answer is queued and its\n"
            "latency counts from when it was due).  Prints the completed rate, latency\n"
            "(answer complete minus due) and service time (answer complete minus written):\n"
            "median, p90, p99, p99.9 and max in us, and the failed requests.\n"
            "\n"
            "Options:\n"
            "  -u, --url URL          server, http://HOST:PORT (no TLS, no path)\n"
            "  -p, --path P           request target (default /get_transfer_engine_info?rank=0)\n"
            "  -R, --rate R           requests per second in total, 1..10000000\n"
            "  -c, --connections C    keep-alive connections, 1..%d (default 64)\n"
            "  -d, --duration S       seconds measured, 1..3600 (default 10)\n"
            "  -w, --warmup S         seconds sent first and not counted, 0..600 (default 1)\n"
            "  -j, --json             one JSON object instead of the table\n"
            "  -h, --help             print this help\n"
            "\n"
            "Exit status: 0 measured, 1 runtime error (cannot connect, out of memory),\n"
            "2 usage.\n",
            RATE_MAX_CONNS);
}

static int rate_usage_error(const char *fmt, const char *arg)
{
    fprintf(stderr, "%s: ", rprog);
    fprintf(stderr, fmt, arg);
    fprintf(stderr, "\n(see kvcoord-bench rate --help)\n");
    return 2;
}

static int parse_num(const char *s, double lo, double hi, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !isfinite(v) || v < lo || v > hi)
        return -1;
    *out = v;
    return 0;
}

/* ---- connections ---------------------------------------------------------- */

static int on_complete(http_parser *p)
{
    rate_conn *c = p->data;
    c->complete = 1;
    return 0;
}

static const http_parser_settings parser_settings = {.on_message_complete = on_complete};

static void conn_close(rate_run *r, rate_conn *c)
{
    if (c->fd >= 0) {
        epoll_ctl(r->ep, EPOLL_CTL_DEL, c->fd, NULL);
        close(c->fd);
    }
    c->fd = -1;
}

/* Connects c (blocking connect, then non-blocking); 0 or -1 with a message. */
static int conn_open(rate_run *r, rate_conn *c)
{
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *res = NULL;
    int rc = getaddrinfo(r->host, r->port, &hints, &res);
    if (rc != 0) {
        fprintf(stderr, "%s: cannot resolve %s:%s: %s\n", rprog, r->host, r->port,
                gai_strerror(rc));
        return -1;
    }
    int err = 0;
    c->fd = -1;
    for (struct addrinfo *ai = res; ai && c->fd < 0; ai = ai->ai_next) {
        int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
        if (fd < 0) {
            err = errno;
            continue;
        }
        int one = 1;
        if (connect(fd, ai->ai_addr, ai->ai_addrlen) != 0 ||
            setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) != 0 ||
            fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK) != 0) {
            err = errno;
            close(fd);
            continue;
        }
        c->fd = fd;
    }
    freeaddrinfo(res);
    if (c->fd < 0) {
        fprintf(stderr, "%s: cannot connect to %s:%s: %s\n", rprog, r->host, r->port,
                strerror(err));
        return -1;
    }
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = c};
    if (epoll_ctl(r->ep, EPOLL_CTL_ADD, c->fd, &ev) != 0) {
        fprintf(stderr, "%s: epoll_ctl: %s\n", rprog, strerror(errno));
        close(c->fd);
        c->fd = -1;
        return -1;
    }
    http_parser_init(&c->parser, HTTP_RESPONSE);
    c->parser.data = c;
    c->in_flight = c->complete = 0;
    c->woff = 0;
    return 0;
}

/* Writes what is left of the in-flight request; EPOLLOUT while it does not
 * fit.  0, or -1 when the connection failed. */
static int conn_write(rate_run *r, rate_conn *c)
{
    while (c->woff < r->request_len) {
        ssize_t w = send(c->fd, r->request + c->woff, r->request_len - c->woff,
                         MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0 && errno == EAGAIN) {
            struct epoll_event ev = {.events = EPOLLIN | EPOLLOUT, .data.ptr = c};
            return epoll_ctl(r->ep, EPOLL_CTL_MOD, c->fd, &ev);
        }
        if (w < 0)
            return -1;
        c->woff += (size_t)w;
    }
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = c};
    return epoll_ctl(r->ep, EPOLL_CTL_MOD, c->fd, &ev);
}

/* Sends the oldest queued request on an idle connection. */
static int conn_send_next(rate_run *r, rate_conn *c)
{
    if (c->in_flight || c->qlen == 0)
        return 0;
    c->due_ns = c->queue[c->qhead];
    c->qhead = (c->qhead + 1) % RATE_QUEUE;
    c->qlen--;
    c->in_flight = 1;
    c->complete = 0;
    c->woff = 0;
    c->sent_ns = kvc__mono_ns();
    return conn_write(r, c);
}

static int record(rate_run *r, uint64_t lat, uint64_t svc)
{
    if (r->n == r->cap) {
        size_t ncap = r->cap ? r->cap * 2 : 65536;
        uint64_t *a = realloc(r->lat, ncap * sizeof *a);
        if (!a)
            return -1;
        r->lat = a;
        uint64_t *b = realloc(r->svc, ncap * sizeof *b);
        if (!b)
            return -1;
        r->svc = b;
        r->cap = ncap;
    }
    r->lat[r->n] = lat;
    r->svc[r->n] = svc;
    r->n++;
    return 0;
}

/* The connection broke: its in-flight request failed; reconnect and go on
 * with the queue.  -1 when it cannot reconnect. */
static int conn_fail(rate_run *r, rate_conn *c, uint64_t counted_from)
{
    if (c->in_flight && c->due_ns >= counted_from)
        r->failed++;
    conn_close(r, c);
    r->reconnects++;
    if (conn_open(r, c) != 0)
        return -1;
    return conn_send_next(r, c);
}

/* Reads what the server sent; records an answer when it is complete.
 * 0, or -1 on out of memory or when a broken connection cannot reopen. */
static int conn_read(rate_run *r, rate_conn *c, uint64_t counted_from)
{
    static char buf[256 * 1024];
    for (;;) {
        ssize_t n = recv(c->fd, buf, sizeof buf, MSG_DONTWAIT);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && errno == EAGAIN)
            return 0;
        if (n <= 0 || !c->in_flight)
            return conn_fail(r, c, counted_from);
        size_t used = http_parser_execute(&c->parser, &parser_settings, buf, (size_t)n);
        if (c->parser.http_errno != HPE_OK || (!c->complete && used != (size_t)n))
            return conn_fail(r, c, counted_from);
        if (!c->complete)
            continue;
        uint64_t t = kvc__mono_ns();
        unsigned status = c->parser.status_code;
        int keep = http_should_keep_alive(&c->parser);
        c->in_flight = 0;
        if (c->due_ns >= counted_from) {
            if (status < 200 || status > 299) {
                r->failed++;
                r->non_2xx++;
                r->last_status = status;
            } else if (record(r, t - c->due_ns, t - c->sent_ns) != 0)
                return -1;
        }
        if (!keep) {
            conn_close(r, c);
            r->reconnects++;
            if (conn_open(r, c) != 0)
                return -1;
        }
        return conn_send_next(r, c);
    }
}

/* ---- the run ---------------------------------------------------------------- */

static int rate_loop(rate_run *r)
{
    r->ep = epoll_create1(EPOLL_CLOEXEC);
    if (r->ep < 0) {
        fprintf(stderr, "%s: epoll_create1: %s\n", rprog, strerror(errno));
        return 1;
    }
    r->c = calloc((size_t)r->conns, sizeof *r->c);
    if (!r->c) {
        fprintf(stderr, "%s: out of memory\n", rprog);
        return 1;
    }
    for (long i = 0; i < r->conns; i++)
        if (conn_open(r, &r->c[i]) != 0)
            return 1;
    prctl(PR_SET_TIMERSLACK, 1UL, 0UL, 0UL, 0UL);
    const double interval = 1e9 / r->rate;
    const uint64_t start = kvc__mono_ns() + 1000000;
    const uint64_t counted_from = start + (uint64_t)(r->warmup * 1e9);
    const uint64_t end = counted_from + (uint64_t)(r->seconds * 1e9);
    const uint64_t drain_end = end + 10ull * 1000000000u; /* late answers: failed */
    uint64_t k = 0;
    struct epoll_event ev[64];
    for (;;) {
        uint64_t t = kvc__mono_ns();
        uint64_t due = start + (uint64_t)((double)k * interval);
        while (due <= t && due < end) {
            rate_conn *c = &r->c[k % (uint64_t)r->conns];
            if (c->qlen == RATE_QUEUE) {
                if (due >= counted_from)
                    r->dropped++;
            } else {
                c->queue[(c->qhead + c->qlen) % RATE_QUEUE] = due;
                c->qlen++;
                if (conn_send_next(r, c) != 0 && conn_fail(r, c, counted_from) != 0)
                    return 1;
            }
            k++;
            due = start + (uint64_t)((double)k * interval);
        }
        int busy = 0;
        for (long i = 0; i < r->conns && !busy; i++)
            busy = r->c[i].in_flight || r->c[i].qlen;
        if (due >= end && (!busy || t >= drain_end))
            break;
        uint64_t wake = due < end ? due : drain_end;
        uint64_t wait = wake > t ? wake - t : 0;
        struct timespec ts = {.tv_sec = (time_t)(wait / 1000000000u),
                              .tv_nsec = (long)(wait % 1000000000u)};
        int n = epoll_pwait2(r->ep, ev, 64, &ts, NULL);
        if (n < 0 && errno != EINTR) {
            fprintf(stderr, "%s: epoll_pwait2: %s\n", rprog, strerror(errno));
            return 1;
        }
        for (int i = 0; i < n; i++) {
            rate_conn *c = ev[i].data.ptr;
            int rc = 0;
            if (ev[i].events & (EPOLLIN | EPOLLERR | EPOLLHUP))
                rc = conn_read(r, c, counted_from);
            else if (ev[i].events & EPOLLOUT)
                rc = conn_write(r, c) != 0 ? conn_fail(r, c, counted_from) : 0;
            if (rc != 0) {
                fprintf(stderr, "%s: out of memory or cannot reconnect\n", rprog);
                return 1;
            }
        }
    }
    for (long i = 0; i < r->conns; i++) {
        rate_conn *c = &r->c[i];
        if (c->in_flight && c->due_ns >= counted_from)
            r->failed++;
        for (unsigned q = 0; q < c->qlen; q++)
            if (c->queue[(c->qhead + q) % RATE_QUEUE] >= counted_from)
                r->failed++;
        conn_close(r, c);
    }
    close(r->ep);
    return 0;
}

/* ---- figures ---------------------------------------------------------------- */

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* The smallest sample with at least q of them <= it, in us. */
static double pct_us(const uint64_t *v, size_t n, double q)
{
    if (n == 0)
        return NAN;
    size_t i = (size_t)ceil(q * (double)n);
    return (double)v[(i ? i : 1) - 1] / 1e3;
}

static void report(rate_run *r)
{
    static const double qs[] = {0.5, 0.9, 0.99, 0.999, 1.0};
    static const char *names[] = {"p50", "p90", "p99", "p99_9", "max"};
    if (r->n) { /* with nothing answered the arrays are NULL */
        qsort(r->lat, r->n, sizeof *r->lat, cmp_u64);
        qsort(r->svc, r->n, sizeof *r->svc, cmp_u64);
    }
    double done = (double)r->n / r->seconds;
    if (r->json) {
        printf(
            "{\"offered_per_s\":%.0f,\"connections\":%ld,\"seconds\":%g,\"warmup\":%g,"
            "\"completed_per_s\":%.1f,\"failed\":%llu,\"non_2xx\":%llu,\"last_non_2xx_status\":%u,"
            "\"dropped\":%llu,\"reconnects\":%llu",
            r->rate, r->conns, r->seconds, r->warmup, done, (unsigned long long)r->failed,
            (unsigned long long)r->non_2xx, r->last_status, (unsigned long long)r->dropped,
            (unsigned long long)r->reconnects);
        for (int w = 0; w < 2; w++) {
            printf(",\"%s_us\":{", w ? "service" : "latency");
            for (int i = 0; i < 5; i++) {
                double v = pct_us(w ? r->svc : r->lat, r->n, qs[i]);
                if (isnan(v)) /* nothing answered: JSON has no NaN */
                    printf("%s\"%s\":null", i ? "," : "", names[i]);
                else
                    printf("%s\"%s\":%.1f", i ? "," : "", names[i], v);
            }
            printf("}");
        }
        printf("}\n");
        return;
    }
    printf("%.0f req/s offered on %ld connections for %g s (after %g s warm-up): %.0f req/s "
           "completed, %llu failed, %llu dropped (client queue full), %llu reconnects\n",
           r->rate, r->conns, r->seconds, r->warmup, done, (unsigned long long)r->failed,
           (unsigned long long)r->dropped, (unsigned long long)r->reconnects);
    if (r->non_2xx)
        printf("of the failed: %llu answered with a status outside 2xx (the last: %u)%s\n",
               (unsigned long long)r->non_2xx, r->last_status,
               r->failed > r->non_2xx ? "; the rest got no answer (connection closed or broken, "
                                        "or still waiting at the end)"
                                      : "");
    if (r->n == 0)
        printf("no request was answered with 2xx: no latency to show\n");
    printf("%-9s %9s %9s %9s %9s %9s\n", "us", "p50", "p90", "p99", "p99.9", "max");
    for (int w = 0; w < 2; w++) {
        printf("%-9s", w ? "service" : "latency");
        for (int i = 0; i < 5; i++)
            printf(" %9.1f", pct_us(w ? r->svc : r->lat, r->n, qs[i]));
        printf("\n");
    }
}

/* Splits http://HOST:PORT (no path) into r->host / r->port (static storage). */
static int parse_url(rate_run *r, const char *url)
{
    static char host[256], port[16];
    if (strncmp(url, "http://", 7) != 0)
        return -1;
    const char *h = url + 7, *e;
    if (*h == '[') {
        e = strchr(++h, ']');
        if (!e || e[1] != ':')
            return -1;
    } else {
        e = strchr(h, ':');
        if (!e)
            return -1;
    }
    size_t hl = (size_t)(e - h);
    const char *p = e + (*e == ']' ? 2 : 1);
    size_t pl = strcspn(p, "/");
    if (hl == 0 || hl >= sizeof host || pl == 0 || pl >= sizeof port ||
        (p[pl] && strcmp(p + pl, "/") != 0))
        return -1;
    memcpy(host, h, hl);
    host[hl] = '\0';
    memcpy(port, p, pl);
    port[pl] = '\0';
    double v;
    if (parse_num(port, 1, 65535, &v) != 0 || v != floor(v))
        return -1;
    r->host = host;
    r->port = port;
    return 0;
}

int bench_rate_main(int argc, char **argv)
{
    static const struct option opts[] = {
        {"url", required_argument, NULL, 'u'},
        {"path", required_argument, NULL, 'p'},
        {"rate", required_argument, NULL, 'R'},
        {"connections", required_argument, NULL, 'c'},
        {"duration", required_argument, NULL, 'd'},
        {"warmup", required_argument, NULL, 'w'},
        {"json", no_argument, NULL, 'j'},
        {"help", no_argument, NULL, 'h'},
        {0, 0, 0, 0},
    };
    rate_run r = {
        .path = "/get_transfer_engine_info?rank=0", .conns = 64, .seconds = 10, .warmup = 1};
    double v;
    int c;
    argv[1] = argv[0];
    argc--;
    argv++;
    opterr = 0;
    while ((c = getopt_long(argc, argv, ":u:p:R:c:d:w:jh", opts, NULL)) != -1) {
        switch (c) {
        case 'u':
            if (parse_url(&r, optarg) != 0)
                return rate_usage_error("--url wants http://HOST:PORT, got '%s'", optarg);
            break;
        case 'p':
            if (optarg[0] != '/' || strlen(optarg) > 512 || strpbrk(optarg, " \r\n"))
                return rate_usage_error("--path wants /TARGET (no spaces, at most 512 "
                                        "bytes), got '%s'",
                                        optarg);
            r.path = optarg;
            break;
        case 'R':
            if (parse_num(optarg, 1, 1e7, &r.rate) != 0)
                return rate_usage_error("--rate wants requests per second 1..10000000, got "
                                        "'%s'",
                                        optarg);
            break;
        case 'c':
            if (parse_num(optarg, 1, RATE_MAX_CONNS, &v) != 0 || v != floor(v))
                return rate_usage_error("--connections wants an integer 1..4096, got '%s'", optarg);
            r.conns = (long)v;
            break;
        case 'd':
            if (parse_num(optarg, 1, 3600, &r.seconds) != 0)
                return rate_usage_error("--duration wants seconds 1..3600, got '%s'", optarg);
            break;
        case 'w':
            if (parse_num(optarg, 0, 600, &r.warmup) != 0)
                return rate_usage_error("--warmup wants seconds 0..600, got '%s'", optarg);
            break;
        case 'j': r.json = 1; break;
        case 'h': rate_help(stdout); return 0;
        case ':': return rate_usage_error("%s needs a value", argv[optind - 1]);
        default: return rate_usage_error("unknown option '%s'", argv[optind - 1]);
        }
    }
    if (optind < argc)
        return rate_usage_error("unexpected argument '%s'", argv[optind]);
    if (!r.host)
        return rate_usage_error("%s", "--url http://HOST:PORT is required");
    if (r.rate <= 0)
        return rate_usage_error("%s", "--rate R is required");
    r.request_len =
        (size_t)snprintf(r.request, sizeof r.request, "GET %s HTTP/1.1\r\nHost: %s:%s\r\n\r\n",
                         r.path, r.host, r.port);
    int rc = rate_loop(&r);
    if (rc == 0)
        report(&r);
    free(r.lat);
    free(r.svc);
    free(r.c);
    return rc;
}
