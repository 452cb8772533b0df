/*
 * bench.c - kvcoord-bench: how fast a rank's transfer-engine info is read and
 * written, through libkvcoord (shared memory) and over HTTP (kvcoordd), in
 * the same run so the two figures are comparable.
 *
 *   kvcoord-bench lookup   --segment NAME --rank N [--iters N] [--http-iters N]
 *                          [--url http://127.0.0.1:PORT] [--json]
 *   kvcoord-bench register --segment NAME --info FILE [--rank N] [--reps N]
 *                          [--url http://127.0.0.1:PORT] [--json]
 *   kvcoord-bench transfer ... / kvcoord-bench kv ...   (tools/bench_transfer.c)
 *
 * lookup: from this process (not the daemon), kvc_rank_lookup() of the rank
 * into one reused buffer, each call timed (median, p99, ns); then, when --url
 * is given, GET /get_transfer_engine_info?rank=N round trips over one
 * keep-alive HTTP/1.1 connection on a blocking socket (median, p99, us); and
 * the ratio of the medians.
 *
 * register: the rank-N.json body in FILE (as tools/gen_model_info.py writes
 * it) registered --reps times through kvc_rank_register() and, with --url,
 * as many times with PUT /register_transfer_engine_info; every repetition
 * carries different content (the first entry's data_ptr changes), so none is
 * the identical-registration no-op, which is timed separately.  Times in ms
 * (median, min, max).
 *
 * The HTTP client is deliberately minimal: one connection, Content-Length or
 * chunked responses, reconnect when the server closes.  Figures are printed,
 * never judged: speed is not asserted anywhere.
 */
#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "clock.h"
#include "bench_rate.h"
#include "bench_rooms.h"
#include "bench_transfer.h"
#include "kvcoord/kvcoord.h"

#define EXIT_RUNTIME 1
#define EXIT_USAGE 2

static const char *prog = "kvcoord-bench";

static void die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void die(const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "%s: ", prog);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    exit(EXIT_RUNTIME);
}

static void usage(FILE *out)
{
    fprintf(out,
            "Usage: %s lookup   --segment NAME --rank N [--iters N] [--http-iters N]\n"
            "                       [--url http://HOST:PORT] [--json]\n"
            "       %s register --segment NAME --info FILE [--rank N] [--reps N]\n"
            "                       [--url http://HOST:PORT] [--json]\n",
            prog, prog);
    bench_transfer_usage(out);
    bench_rooms_usage(out);
    bench_rate_usage(out);
    fprintf(out,
            "\n"
            "Measures reading and writing a rank's transfer-engine info through libkvcoord\n"
            "(the node's shared-memory segment) and over HTTP (kvcoordd), in one run; and\n"
            "the transfer engine moving memory between two processes.\n"
            "\n"
            "lookup    kvc_rank_lookup() of rank N from this process into a reused buffer,\n"
            "          each call timed (median and p99, ns); with --url, GET\n"
            "          /get_transfer_engine_info?rank=N round trips over one keep-alive\n"
            "          HTTP/1.1 connection (median and p99, us); and their ratio.\n"
            "register  registers the rank in FILE (a rank-<N>.json written by\n"
            "          tools/gen_model_info.py) --reps times through kvc_rank_register()\n"
            "          and, with --url, with PUT /register_transfer_engine_info; each\n"
            "          repetition has different content (never the identical no-op, which\n"
            "          is timed separately); median, min and max in ms.  Overwrites the\n"
            "          rank in the segment: use a scratch segment.\n"
            "transfer  a forked receiver engine and this process's sender: rooms of --batch\n"
            "          blocks of --block bytes (4K..64M, K/M suffixes; default 1M x 16),\n"
            "          --depth rooms in flight, --conns connections, for --duration seconds\n"
            "          (default 4); one line: GB/s, ops/s, room latency median and p99.\n"
            "          --working-set N: the blocks of a room come from N distinct blocks\n"
            "          (default --batch; 1 = one block reused, as iperf3 does); --pin S,R\n"
            "          pins the sender to CPU S and the receiver to CPU R; --splice-min SIZE\n"
            "          sets tcp_splice_min (0: off, the default).  --compare [--rounds N]:\n"
            "          N rounds (default 5), at --block or else at 1M and 4M, of iperf3 -c\n"
            "          (against an iperf3 -s it starts; -l at most 1M), a plain send/recv\n"
            "          loop at the block, the engine with splice on and off, then the\n"
            "          medians per block (GB/s, CPU s/GB, engine/iperf3, engine/loop); one\n"
            "          connection and --working-set 1 unless given.\n"
            "rooms     failure propagation: kvc_room_fail() in one process to another\n"
            "          process's kvc_room_wait() returning (median, p99 us; baseline a bare\n"
            "          pipe wake-up); room cycles/s (open, 3 updates, poll, release) with 1, 2\n"
            "          and 8 processes; a scratch segment; --rounds, --duration, --json.\n"
            "rate      HTTP GET latency at a fixed, open-loop request rate against any\n"
            "          server (kvcoord-bench rate --help); no segment.\n"
            "kv        the same with a realistic request: Llama-3.1-8B at TP=8 per rank,\n"
            "          4096 tokens in scattered 16-token pages (16384 runs of 4 KiB).\n"
            "          transfer and kv take --backend tcp|verbs|auto (default tcp),\n"
            "          --listen HOST:PORT and --json; no segment.\n"
            "\n"
            "Options:\n"
            "  -s, --segment NAME   segment to attach to (must exist: kvcoordd creates it)\n"
            "  -r, --rank N         rank to look up; for register, overrides the file's rank\n"
            "  -n, --iters N        library lookups to time (default 200000)\n"
            "      --http-iters N   HTTP lookups to time (default 20000)\n"
            "  -i, --info FILE      register: the rank's registration body\n"
            "      --reps N         register: repetitions per path (default 7)\n"
            "  -u, --url URL        kvcoordd's base URL, http://HOST:PORT (no TLS)\n"
            "  -j, --json           print one JSON object instead of the table\n"
            "  -h, --help           print this help\n"
            "\n"
            "Exit status: 0 measured, 1 runtime error (segment, rank, HTTP, a failed\n"
            "transfer room), 2 usage.\n");
}

/* ---- time and statistics ---------------------------------------------- */

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

typedef struct stats {
    size_t n;
    uint64_t min, median, p99, max;
    double mean;
} stats;

/* Sorts v. Percentile p: the smallest sample with at least p of them <= it. */
static stats summarize(uint64_t *v, size_t n)
{
    stats s = {0};
    if (n == 0)
        return s;
    qsort(v, n, sizeof *v, cmp_u64);
    double sum = 0;
    for (size_t i = 0; i < n; i++)
        sum += (double)v[i];
    size_t i99 = (size_t)ceil(0.99 * (double)n);
    s.n = n;
    s.min = v[0];
    s.max = v[n - 1];
    s.median = n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
    s.p99 = v[(i99 ? i99 : 1) - 1];
    s.mean = sum / (double)n;
    return s;
}

/* ---- numbers ------------------------------------------------------------ */

static long parse_long(const char *opt, const char *s, long lo, long hi)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) {
        fprintf(stderr, "%s: %s wants an integer in [%ld, %ld], got '%s'\n", prog, opt, lo, hi, s);
        exit(EXIT_USAGE);
    }
    return v;
}

/* ---- a minimal HTTP/1.1 client ----------------------------------------- */

typedef struct http_client {
    char host[256]; /* as given in the URL, for the Host header */
    char port[16];
    int fd;
    char *buf; /* received bytes not yet consumed: buf[off..len) */
    size_t off, len, cap;
    unsigned reconnects;
} http_client;

typedef struct http_response {
    int status;
    int close;  /* server said Connection: close */
    char *body; /* malloc'd, NUL-terminated */
    size_t body_len;
} http_response;

static void http_parse_url(http_client *c, const char *url)
{
    const char *p = url;
    if (strncmp(p, "http://", 7) != 0) {
        fprintf(stderr, "%s: --url must start with http:// (got '%s')\n", prog, url);
        exit(EXIT_USAGE);
    }
    p += 7;
    const char *host_end;
    const char *host = p;
    if (*p == '[') { /* [IPv6]:port */
        host = p + 1;
        host_end = strchr(host, ']');
        if (!host_end) {
            fprintf(stderr, "%s: unterminated '[' in --url '%s'\n", prog, url);
            exit(EXIT_USAGE);
        }
        p = host_end + 1;
    } else {
        host_end = p + strcspn(p, ":/");
        p = host_end;
    }
    size_t hl = (size_t)(host_end - host);
    if (hl == 0 || hl >= sizeof c->host) {
        fprintf(stderr, "%s: bad host in --url '%s'\n", prog, url);
        exit(EXIT_USAGE);
    }
    memcpy(c->host, host, hl);
    c->host[hl] = '\0';
    snprintf(c->port, sizeof c->port, "80");
    if (*p == ':') {
        p++;
        size_t pl = strcspn(p, "/");
        if (pl == 0 || pl >= sizeof c->port) {
            fprintf(stderr, "%s: bad port in --url '%s'\n", prog, url);
            exit(EXIT_USAGE);
        }
        memcpy(c->port, p, pl);
        c->port[pl] = '\0';
        parse_long("--url port", c->port, 1, 65535);
        p += pl;
    }
    if (*p && strcmp(p, "/") != 0) {
        fprintf(stderr, "%s: --url takes no path (got '%s')\n", prog, url);
        exit(EXIT_USAGE);
    }
    c->fd = -1;
}

static void http_connect(http_client *c)
{
    struct addrinfo hints = {0}, *res = NULL;
    hints.ai_socktype = SOCK_STREAM;
    int rc = getaddrinfo(c->host, c->port, &hints, &res);
    if (rc != 0)
        die("cannot resolve %s:%s: %s", c->host, c->port, gai_strerror(rc));
    int last_errno = 0;
    for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
        int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
        if (fd < 0) {
            last_errno = errno;
            continue;
        }
        if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0) {
            int one = 1;
            setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
            /* A guard against a hung server, not a measurement. */
            struct timeval tv = {.tv_sec = 60};
            setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
            setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
            c->fd = fd;
            freeaddrinfo(res);
            return;
        }
        last_errno = errno;
        close(fd);
    }
    freeaddrinfo(res);
    die("cannot connect to %s:%s: %s", c->host, c->port, strerror(last_errno));
}

static void http_close(http_client *c)
{
    if (c->fd >= 0)
        close(c->fd);
    c->fd = -1;
    c->off = c->len = 0;
}

static int send_all(int fd, const char *p, size_t n)
{
    while (n > 0) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

/* Read more bytes into the buffer (which only grows while a response is
 * read, so offsets into it stay valid); 0 on success, -1 on EOF or error. */
static int fill(http_client *c)
{
    if (c->len + 65536 > c->cap) {
        size_t ncap = c->cap ? c->cap * 2 : 262144;
        while (ncap < c->len + 65536)
            ncap *= 2;
        char *nb = realloc(c->buf, ncap);
        if (!nb)
            die("out of memory (%zu bytes)", ncap);
        c->buf = nb;
        c->cap = ncap;
    }
    for (;;) {
        ssize_t r = recv(c->fd, c->buf + c->len, c->cap - c->len, 0);
        if (r > 0) {
            c->len += (size_t)r;
            return 0;
        }
        if (r < 0 && errno == EINTR)
            continue;
        return -1;
    }
}

/* Find "\r\n" at or after from; returns its offset or (size_t)-1. */
static size_t find_crlf(const http_client *c, size_t from)
{
    for (size_t i = from; i + 1 < c->len; i++)
        if (c->buf[i] == '\r' && c->buf[i + 1] == '\n')
            return i;
    return (size_t)-1;
}

static size_t ensure_line(http_client *c, size_t from)
{
    size_t e;
    while ((e = find_crlf(c, from)) == (size_t)-1)
        if (fill(c) < 0)
            return (size_t)-1;
    return e;
}

static int ensure_bytes(http_client *c, size_t upto)
{
    while (c->len < upto)
        if (fill(c) < 0)
            return -1;
    return 0;
}

static void append(char **dst, size_t *len, size_t *cap, const char *src, size_t n)
{
    if (*len + n + 1 > *cap) {
        size_t ncap = *cap ? *cap : 4096;
        while (ncap < *len + n + 1)
            ncap *= 2;
        char *nb = realloc(*dst, ncap);
        if (!nb)
            die("out of memory (%zu bytes)", ncap);
        *dst = nb;
        *cap = ncap;
    }
    memcpy(*dst + *len, src, n);
    *len += n;
    (*dst)[*len] = '\0';
}

/* Read one response. 0 ok, -1 connection ended before a whole response. */
static int http_read_response(http_client *c, http_response *r)
{
    memset(r, 0, sizeof *r);
    if (c->off > 0) { /* drop consumed bytes; offsets below are stable after this */
        memmove(c->buf, c->buf + c->off, c->len - c->off);
        c->len -= c->off;
        c->off = 0;
    }
    size_t e = ensure_line(c, 0);
    if (e == (size_t)-1)
        return -1;
    if (e < 12 || strncmp(c->buf, "HTTP/1.", 7) != 0)
        die("malformed HTTP status line from %s:%s", c->host, c->port);
    r->status = atoi(c->buf + 9);
    int http10 = c->buf[7] == '0';
    long long content_length = -1;
    int chunked = 0, keep_alive = 0;
    size_t line = e + 2;
    for (;;) {
        e = ensure_line(c, line);
        if (e == (size_t)-1)
            return -1;
        if (e == line) { /* end of headers */
            line += 2;
            break;
        }
        const char *h = c->buf + line;
        size_t hl = e - line;
        const char *colon = memchr(h, ':', hl);
        if (colon) {
            size_t nl = (size_t)(colon - h);
            const char *v = colon + 1;
            while (v < h + hl && (*v == ' ' || *v == '\t'))
                v++;
            size_t vl = (size_t)(h + hl - v);
            if (nl == 14 && strncasecmp(h, "Content-Length", 14) == 0)
                content_length = strtoll(v, NULL, 10);
            else if (nl == 17 && strncasecmp(h, "Transfer-Encoding", 17) == 0 && vl >= 7 &&
                     strncasecmp(v + vl - 7, "chunked", 7) == 0)
                chunked = 1;
            else if (nl == 10 && strncasecmp(h, "Connection", 10) == 0) {
                if (vl >= 5 && strncasecmp(v, "close", 5) == 0)
                    r->close = 1;
                if (vl >= 10 && strncasecmp(v, "keep-alive", 10) == 0)
                    keep_alive = 1;
            }
        }
        line = e + 2;
    }
    if (http10 && !keep_alive)
        r->close = 1;
    if (r->status >= 100 && r->status < 200) { /* interim; the real response follows */
        c->off = line;
        return http_read_response(c, r);
    }
    size_t cap = 0;
    if (chunked) {
        for (;;) {
            e = ensure_line(c, line);
            if (e == (size_t)-1)
                return -1;
            size_t n = (size_t)strtoull(c->buf + line, NULL, 16);
            line = e + 2;
            if (n == 0) { /* trailers (none expected) end with an empty line */
                for (;;) {
                    e = ensure_line(c, line);
                    if (e == (size_t)-1)
                        return -1;
                    int empty = e == line;
                    line = e + 2;
                    if (empty)
                        break;
                }
                break;
            }
            if (ensure_bytes(c, line + n + 2) < 0)
                return -1;
            append(&r->body, &r->body_len, &cap, c->buf + line, n);
            line += n + 2;
        }
    } else if (content_length >= 0) {
        if (ensure_bytes(c, line + (size_t)content_length) < 0)
            return -1;
        append(&r->body, &r->body_len, &cap, c->buf + line, (size_t)content_length);
        line += (size_t)content_length;
    } else { /* body until close */
        while (fill(c) == 0)
            ;
        append(&r->body, &r->body_len, &cap, c->buf + line, c->len - line);
        line = c->len;
        r->close = 1;
    }
    if (!r->body)
        append(&r->body, &r->body_len, &cap, "", 0);
    c->off = line;
    return 0;
}

/* One request/response on the kept-alive connection (reconnecting once if
 * the server had closed it).  head: the request line and headers, without the
 * final CRLF CRLF; body may be NULL. */
static void http_roundtrip(http_client *c, const char *head, const char *body, size_t body_len,
                           http_response *r)
{
    for (int attempt = 0;; attempt++) {
        if (c->fd < 0)
            http_connect(c);
        int ok = send_all(c->fd, head, strlen(head)) == 0 &&
                 (body_len == 0 || send_all(c->fd, body, body_len) == 0) &&
                 http_read_response(c, r) == 0;
        if (ok) {
            if (r->close)
                http_close(c);
            return;
        }
        http_close(c);
        if (attempt > 0)
            die("HTTP request to %s:%s failed: connection closed", c->host, c->port);
        c->reconnects++;
    }
}

/* ---- common ------------------------------------------------------------- */

typedef struct bench_args {
    const char *cmd;
    const char *segment;
    const char *url;
    const char *info_path;
    long rank;
    long iters;
    long http_iters;
    long reps;
    int json;
} bench_args;

static kvc_segment *attach(const char *name)
{
    kvc_options o;
    kvc_options_init(&o);
    o.name = name;
    o.mode = KVC_OPEN_ATTACH;
    o.role = KVC_ROLE_NONE;
    kvc_segment *seg = NULL;
    kvc_err e = kvc_open(&o, &seg);
    if (e != KVC_OK)
        die("cannot attach to segment '%s': %s (%s)", name, kvc_strerror(e), kvc_last_error());
    return seg;
}

static void print_stats_json(const char *key, const stats *s, const char *unit, double div,
                             int last)
{
    printf("\"%s\":{\"n\":%zu,\"unit\":\"%s\",\"min\":%.3f,\"median\":%.3f,\"p99\":%.3f,"
           "\"max\":%.3f,\"mean\":%.3f}%s",
           key, s->n, unit, (double)s->min / div, (double)s->median / div, (double)s->p99 / div,
           (double)s->max / div, s->mean / div, last ? "" : ",");
}

/* ---- lookup --------------------------------------------------------------- */

static int cmd_lookup(const bench_args *a)
{
    if (a->rank < 0) {
        fprintf(stderr, "%s lookup: --rank is required\n", prog);
        return EXIT_USAGE;
    }
    kvc_segment *seg = attach(a->segment);
    kvc_rank_info ri = {0};
    kvc_err e = kvc_rank_lookup(seg, (uint32_t)a->rank, &ri);
    if (e != KVC_OK)
        die("rank %ld in segment '%s': %s (%s)", a->rank, a->segment, kvc_strerror(e),
            kvc_last_error());
    size_t info_len = ri.info_len;
    uint32_t entries = ri.entries;

    /* Warm up: page in the arena and the buffer, settle the branch predictors. */
    long warm = a->iters / 10 < 1000 ? 1000 : a->iters / 10;
    for (long i = 0; i < warm; i++)
        kvc_rank_lookup(seg, (uint32_t)a->rank, &ri);

    uint64_t *lib = malloc((size_t)a->iters * sizeof *lib);
    if (!lib)
        die("out of memory");
    for (long i = 0; i < a->iters; i++) {
        uint64_t t0 = kvc__mono_ns();
        e = kvc_rank_lookup(seg, (uint32_t)a->rank, &ri);
        uint64_t t1 = kvc__mono_ns();
        if (e != KVC_OK)
            die("lookup %ld of rank %ld failed: %s (%s)", i, a->rank, kvc_strerror(e),
                kvc_last_error());
        lib[i] = t1 - t0;
    }
    stats ls = summarize(lib, (size_t)a->iters);

    stats hs = {0};
    size_t http_body = 0;
    unsigned reconnects = 0;
    if (a->url) {
        http_client c = {0};
        http_parse_url(&c, a->url);
        char head[512];
        snprintf(head, sizeof head,
                 "GET /get_transfer_engine_info?rank=%ld HTTP/1.1\r\nHost: %s:%s\r\n"
                 "User-Agent: kvcoord-bench\r\nAccept: */*\r\n\r\n",
                 a->rank, c.host, c.port);
        http_response r;
        http_roundtrip(&c, head, NULL, 0, &r);
        if (r.status != 200)
            die("GET rank %ld over HTTP answered %d: %.200s", a->rank, r.status, r.body);
        http_body = r.body_len;
        free(r.body);
        long hwarm = a->http_iters / 10 < 100 ? 100 : a->http_iters / 10;
        for (long i = 0; i < hwarm; i++) {
            http_roundtrip(&c, head, NULL, 0, &r);
            free(r.body);
        }
        uint64_t *hv = malloc((size_t)a->http_iters * sizeof *hv);
        if (!hv)
            die("out of memory");
        for (long i = 0; i < a->http_iters; i++) {
            uint64_t t0 = kvc__mono_ns();
            http_roundtrip(&c, head, NULL, 0, &r);
            uint64_t t1 = kvc__mono_ns();
            if (r.status != 200)
                die("GET %ld answered %d", i, r.status);
            free(r.body);
            hv[i] = t1 - t0;
        }
        hs = summarize(hv, (size_t)a->http_iters);
        reconnects = c.reconnects;
        free(hv);
        http_close(&c);
        free(c.buf);
    }

    double ratio = hs.n && ls.median ? (double)hs.median / (double)ls.median : 0;
    if (a->json) {
        printf("{\"bench\":\"lookup\",\"segment\":\"%s\",\"rank\":%ld,\"info_bytes\":%zu,"
               "\"entries\":%u,",
               a->segment, a->rank, info_len, entries);
        print_stats_json("library_ns", &ls, "ns", 1, !a->url);
        if (a->url) {
            print_stats_json("http_us", &hs, "us", 1000, 0);
            printf("\"http_body_bytes\":%zu,\"http_reconnects\":%u,"
                   "\"ratio_http_over_library_median\":%.1f",
                   http_body, reconnects, ratio);
        }
        printf("}\n");
    } else {
        printf("lookup: segment %s, rank %ld: weights_info_dict %zu bytes, %u entries\n",
               a->segment, a->rank, info_len, entries);
        printf("  library kvc_rank_lookup (reused buffer)  n=%-7zu median %8.0f ns   "
               "p99 %8.0f ns   min %.0f ns  mean %.0f ns\n",
               ls.n, (double)ls.median, (double)ls.p99, (double)ls.min, ls.mean);
        if (a->url) {
            printf("  HTTP GET keep-alive round trip           n=%-7zu median %8.1f us   "
                   "p99 %8.1f us   min %.1f us  mean %.1f us  (%zu-byte body, %u reconnects)\n",
                   hs.n, (double)hs.median / 1000, (double)hs.p99 / 1000, (double)hs.min / 1000,
                   hs.mean / 1000, http_body, reconnects);
            printf("  ratio HTTP / library (medians): %.1fx\n", ratio);
        }
    }
    free(lib);
    kvc_rank_info_free(&ri);
    kvc_close(seg);
    return 0;
}

/* ---- register ------------------------------------------------------------- */

typedef struct reg_info {
    long rank;
    char session_id[KVC_SESSION_ID_MAX + 1];
    json_t *dict; /* weights_info_dict (owned) */
    size_t entries;
} reg_info;

static void load_info(const char *path, reg_info *ri)
{
    json_error_t err;
    json_t *root = json_load_file(path, 0, &err);
    if (!root)
        die("%s: %s (line %d column %d)", path, err.text, err.line, err.column);
    if (!json_is_object(root))
        die("%s: not a JSON object", path);
    json_t *rank = json_object_get(root, "rank");
    if (!rank)
        rank = json_object_get(root, "tp_rank");
    ri->rank = json_is_integer(rank) ? (long)json_integer_value(rank) : -1;
    json_t *tei = json_object_get(root, "transfer_engine_info");
    json_t *sid = json_object_get(tei, "session_id");
    json_t *dict = json_object_get(tei, "weights_info_dict");
    if (!json_is_string(sid) || !json_is_object(dict))
        die("%s: no transfer_engine_info.session_id (string) and .weights_info_dict (object)",
            path);
    if (snprintf(ri->session_id, sizeof ri->session_id, "%s", json_string_value(sid)) >=
        (int)sizeof ri->session_id)
        die("%s: session_id longer than %d bytes", path, KVC_SESSION_ID_MAX);
    ri->dict = json_incref(dict);
    ri->entries = json_object_size(dict);
    json_decref(root);
}

/* Make the content of version v differ from every other version: the first
 * entry's data_ptr (or an extra key when the first value is not
 * [int, ...]) changes with v. */
static void set_version(reg_info *ri, json_int_t base, long v)
{
    void *it = json_object_iter(ri->dict);
    json_t *val = it ? json_object_iter_value(it) : NULL;
    if (json_is_array(val) && json_is_integer(json_array_get(val, 0))) {
        json_array_set_new(val, 0, json_integer(base + (json_int_t)v * 256));
    } else {
        json_object_set_new(ri->dict, "kvcoord-bench.version", json_integer(v));
    }
}

static json_int_t first_base(reg_info *ri)
{
    void *it = json_object_iter(ri->dict);
    json_t *val = it ? json_object_iter_value(it) : NULL;
    if (json_is_array(val) && json_is_integer(json_array_get(val, 0)))
        return json_integer_value(json_array_get(val, 0));
    return 0;
}

static char *dump_dict(reg_info *ri, size_t *len)
{
    char *s = json_dumps(ri->dict, JSON_COMPACT | JSON_PRESERVE_ORDER);
    if (!s)
        die("json_dumps failed");
    *len = strlen(s);
    return s;
}

static char *dump_body(reg_info *ri, long rank, size_t *len)
{
    json_t *root =
        json_pack("{s:I, s:{s:s, s:O}}", "rank", (json_int_t)rank, "transfer_engine_info",
                  "session_id", ri->session_id, "weights_info_dict", ri->dict);
    if (!root)
        die("json_pack failed");
    char *s = json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(root);
    if (!s)
        die("json_dumps failed");
    *len = strlen(s);
    return s;
}

static int cmd_register(const bench_args *a)
{
    if (!a->info_path) {
        fprintf(stderr, "%s register: --info FILE is required\n", prog);
        return EXIT_USAGE;
    }
    reg_info ri = {0};
    load_info(a->info_path, &ri);
    long rank = a->rank >= 0 ? a->rank : ri.rank;
    if (rank < 0)
        die("%s has no rank: pass --rank", a->info_path);
    kvc_segment *seg = attach(a->segment);
    json_int_t base = first_base(&ri);
    long version = 1;
    size_t dict_bytes = 0;

    uint64_t *lib = calloc((size_t)a->reps, sizeof *lib);
    uint64_t *same = calloc((size_t)a->reps, sizeof *same);
    uint64_t *http = calloc((size_t)a->reps, sizeof *http);
    if (!lib || !same || !http)
        die("out of memory");

    /* Library: a new version each repetition, then the identical no-op. */
    char *last = NULL;
    size_t last_len = 0;
    for (long i = 0; i < a->reps; i++) {
        set_version(&ri, base, version++);
        free(last);
        last = dump_dict(&ri, &last_len);
        dict_bytes = last_len;
        uint64_t gen0 = 0, gen1 = 0;
        uint64_t t0 = kvc__mono_ns();
        kvc_err e = kvc_rank_register(seg, (uint32_t)rank, ri.session_id, last, last_len, &gen0);
        uint64_t t1 = kvc__mono_ns();
        if (e != KVC_OK)
            die("kvc_rank_register rank %ld: %s (%s)", rank, kvc_strerror(e), kvc_last_error());
        lib[i] = t1 - t0;
        t0 = kvc__mono_ns();
        e = kvc_rank_register(seg, (uint32_t)rank, ri.session_id, last, last_len, &gen1);
        t1 = kvc__mono_ns();
        if (e != KVC_OK)
            die("identical kvc_rank_register rank %ld: %s (%s)", rank, kvc_strerror(e),
                kvc_last_error());
        same[i] = t1 - t0;
        if (gen1 != gen0)
            fprintf(stderr,
                    "%s: note: the identical registration changed the generation "
                    "(%" PRIu64 " -> %" PRIu64 ")\n",
                    prog, gen0, gen1);
    }
    free(last);
    stats ls = summarize(lib, (size_t)a->reps);
    stats ss = summarize(same, (size_t)a->reps);

    stats hs = {0};
    size_t body_bytes = 0;
    if (a->url) {
        http_client c = {0};
        http_parse_url(&c, a->url);
        for (long i = 0; i < a->reps; i++) {
            set_version(&ri, base, version++);
            size_t blen;
            char *body = dump_body(&ri, rank, &blen);
            body_bytes = blen;
            char head[512];
            snprintf(head, sizeof head,
                     "PUT /register_transfer_engine_info HTTP/1.1\r\nHost: %s:%s\r\n"
                     "User-Agent: kvcoord-bench\r\nContent-Type: application/json\r\n"
                     "Content-Length: %zu\r\n\r\n",
                     c.host, c.port, blen);
            if (c.fd < 0)
                http_connect(&c); /* connection set-up is not part of the figure */
            http_response r;
            uint64_t t0 = kvc__mono_ns();
            http_roundtrip(&c, head, body, blen, &r);
            uint64_t t1 = kvc__mono_ns();
            if (r.status != 200)
                die("PUT rank %ld answered %d: %.300s", rank, r.status, r.body);
            free(r.body);
            free(body);
            http[i] = t1 - t0;
        }
        hs = summarize(http, (size_t)a->reps);
        http_close(&c);
        free(c.buf);
    }

    /* Leave the rank as the file had it (content of the file, version 0). */
    set_version(&ri, base, 0);
    {
        size_t l;
        char *s = dump_dict(&ri, &l);
        kvc_rank_register(seg, (uint32_t)rank, ri.session_id, s, l, NULL);
        free(s);
    }

    double ratio = hs.n && ls.median ? (double)hs.median / (double)ls.median : 0;
    if (a->json) {
        printf("{\"bench\":\"register\",\"segment\":\"%s\",\"rank\":%ld,\"entries\":%zu,"
               "\"dict_bytes\":%zu,",
               a->segment, rank, ri.entries, dict_bytes);
        print_stats_json("library_ms", &ls, "ms", 1e6, 0);
        print_stats_json("library_identical_ms", &ss, "ms", 1e6, !a->url);
        if (a->url) {
            print_stats_json("http_ms", &hs, "ms", 1e6, 0);
            printf("\"http_body_bytes\":%zu,\"ratio_http_over_library_median\":%.1f", body_bytes,
                   ratio);
        }
        printf("}\n");
    } else {
        printf("register: segment %s, rank %ld from %s: %zu entries, weights_info_dict %zu "
               "bytes, %ld repetitions each\n",
               a->segment, rank, a->info_path, ri.entries, dict_bytes, a->reps);
        printf("  library kvc_rank_register (new content)  median %8.3f ms   min %8.3f ms   "
               "max %8.3f ms\n",
               (double)ls.median / 1e6, (double)ls.min / 1e6, (double)ls.max / 1e6);
        printf("  library identical re-registration        median %8.3f ms   min %8.3f ms   "
               "max %8.3f ms\n",
               (double)ss.median / 1e6, (double)ss.min / 1e6, (double)ss.max / 1e6);
        if (a->url) {
            printf("  HTTP PUT keep-alive (new content)        median %8.3f ms   min %8.3f ms   "
                   "max %8.3f ms  (%zu-byte body)\n",
                   (double)hs.median / 1e6, (double)hs.min / 1e6, (double)hs.max / 1e6, body_bytes);
            printf("  ratio HTTP / library (medians): %.1fx\n", ratio);
        }
    }
    free(lib);
    free(same);
    free(http);
    json_decref(ri.dict);
    kvc_close(seg);
    return 0;
}

int main(int argc, char **argv)
{
    bench_args a = {.rank = -1, .iters = 200000, .http_iters = 20000, .reps = 7};
    enum { OPT_HTTP_ITERS = 256, OPT_REPS };
    static const struct option opts[] = {
        {"segment", required_argument, NULL, 's'},
        {"rank", required_argument, NULL, 'r'},
        {"iters", required_argument, NULL, 'n'},
        {"http-iters", required_argument, NULL, OPT_HTTP_ITERS},
        {"info", required_argument, NULL, 'i'},
        {"reps", required_argument, NULL, OPT_REPS},
        {"url", required_argument, NULL, 'u'},
        {"json", no_argument, NULL, 'j'},
        {"help", no_argument, NULL, 'h'},
        {0, 0, 0, 0},
    };
    if (argc >= 2 && (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0 ||
                      strcmp(argv[1], "help") == 0)) {
        usage(stdout);
        return 0;
    }
    if (argc < 2) {
        usage(stderr);
        return EXIT_USAGE;
    }
    if (argv[1][0] == '-') { /* an option before any command */
        fprintf(stderr, "%s: unrecognized option '%s'\nTry '%s --help' for more information.\n",
                prog, argv[1], prog);
        return EXIT_USAGE;
    }
    if (strcmp(argv[1], "transfer") == 0 || strcmp(argv[1], "kv") == 0)
        return bench_transfer_main(argc, argv);
    if (strcmp(argv[1], "rooms") == 0)
        return bench_rooms_main(argc, argv);
    if (strcmp(argv[1], "rate") == 0)
        return bench_rate_main(argc, argv);
    a.cmd = argv[1];
    if (strcmp(a.cmd, "lookup") != 0 && strcmp(a.cmd, "register") != 0) {
        fprintf(stderr, "%s: unknown command '%s' (lookup, register, transfer, kv, rooms, rate)\n",
                prog, a.cmd);
        usage(stderr);
        return EXIT_USAGE;
    }
    argv[1] = argv[0];
    argc--;
    argv++;
    int c;
    while ((c = getopt_long(argc, argv, "s:r:n:i:u:jh", opts, NULL)) != -1) {
        switch (c) {
        case 's': a.segment = optarg; break;
        case 'r': a.rank = parse_long("--rank", optarg, 0, 0x7fffffff); break;
        case 'n': a.iters = parse_long("--iters", optarg, 1, 100000000); break;
        case OPT_HTTP_ITERS: a.http_iters = parse_long("--http-iters", optarg, 1, 10000000); break;
        case 'i': a.info_path = optarg; break;
        case OPT_REPS: a.reps = parse_long("--reps", optarg, 1, 100000); break;
        case 'u': a.url = optarg; break;
        case 'j': a.json = 1; break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return EXIT_USAGE;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "%s: unexpected argument '%s'\n", prog, argv[optind]);
        return EXIT_USAGE;
    }
    if (!a.segment) {
        fprintf(stderr, "%s %s: --segment NAME is required\n", prog, a.cmd);
        return EXIT_USAGE;
    }
    if (kvc_name_check(a.segment) != KVC_OK) {
        fprintf(stderr, "%s: bad --segment: %s\n", prog, kvc_last_error());
        return EXIT_USAGE;
    }
    if (strcmp(a.cmd, "lookup") == 0)
        return cmd_lookup(&a);
    if (strcmp(a.cmd, "register") == 0)
        return cmd_register(&a);
    fprintf(stderr, "%s: unknown command '%s' (lookup, register, transfer, kv, rooms, rate)\n",
            prog, a.cmd);
    usage(stderr);
    return EXIT_USAGE;
}
