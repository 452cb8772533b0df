/* test_xfer_twonode_http.h - a tiny blocking HTTP/1.1 client for the
 * two-node test: one request per connection ("Connection: close"), every
 * step bounded by a deadline, optionally from inside a named network
 * namespace (the socket is created there; the caller's own namespace is
 * restored at once).  Answers are parsed with jansson (libkvcoord's JSON
 * library) where they are JSON. */
#ifndef KVC_TEST_XFER_TWONODE_HTTP_H
#define KVC_TEST_XFER_TWONODE_HTTP_H

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

typedef struct th_resp {
    int status; /* HTTP status, 0 when no answer came */
    char *head; /* status line + headers (malloc()ed, NUL-terminated) */
    char *body; /* body (malloc()ed, NUL-terminated) */
    size_t body_len;
    uint64_t gen; /* X-Kvcoord-Generation, when has_gen */
    int has_gen;
    char err[160]; /* why there is no answer */
} th_resp;

static inline void th_resp_free(th_resp *r)
{
    free(r->head);
    free(r->body);
    memset(r, 0, sizeof *r);
}

static inline int64_t th_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* A TCP socket created in network namespace ns (NULL: the caller's). */
static inline int th_socket_in(const char *ns)
{
    if (!ns)
        return socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    char path[128];
    snprintf(path, sizeof path, "/var/run/netns/%s", ns);
    int self = open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC);
    int target = open(path, O_RDONLY | O_CLOEXEC);
    int fd = -1;
    if (self >= 0 && target >= 0 && setns(target, CLONE_NEWNET) == 0) {
        fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        int saved = errno;
        if (setns(self, CLONE_NEWNET)) {
            fprintf(stderr, "setns back to the own netns: %s\n", strerror(errno));
            abort();
        }
        errno = saved;
    }
    if (self >= 0)
        close(self);
    if (target >= 0)
        close(target);
    return fd;
}

/* method path on ip:port (from inside ns, NULL: here), body may be NULL.
 * Returns 0 when an answer was read (r->status set), -1 otherwise (r->err
 * says why).  timeout_ms bounds the whole exchange. */
static inline int th_request(const char *ns, const char *ip, int port, const char *method,
                             const char *path, const char *body, int timeout_ms, th_resp *r)
{
    memset(r, 0, sizeof *r);
    int64_t deadline = th_now_ms() + timeout_ms;
    int fd = th_socket_in(ns);
    if (fd < 0) {
        snprintf(r->err, sizeof r->err, "socket in netns %s: %s", ns ? ns : "(own)",
                 strerror(errno));
        return -1;
    }
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    if (inet_pton(AF_INET, ip, &sa.sin_addr) != 1) {
        snprintf(r->err, sizeof r->err, "bad address %s", ip);
        close(fd);
        return -1;
    }
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) && errno != EINPROGRESS) {
        snprintf(r->err, sizeof r->err, "connect %s:%d: %s", ip, port, strerror(errno));
        close(fd);
        return -1;
    }
    size_t blen = body ? strlen(body) : 0;
    size_t cap = 512 + blen, len = 0, off = 0;
    char *out = malloc(cap);
    if (!out) {
        close(fd);
        snprintf(r->err, sizeof r->err, "out of memory");
        return -1;
    }
    len = (size_t)snprintf(out, cap,
                           "%s %s HTTP/1.1\r\nHost: %s:%d\r\nConnection: close\r\n"
                           "Content-Type: application/json\r\nContent-Length: %zu\r\n\r\n",
                           method, path, ip, port, blen);
    if (blen)
        memcpy(out + len, body, blen);
    len += blen;
    size_t icap = 4096, ilen = 0;
    char *in = malloc(icap);
    int ok = in != NULL, eof = 0;
    while (ok && !eof) {
        int64_t left = deadline - th_now_ms();
        if (left <= 0) {
            snprintf(r->err, sizeof r->err, "%s %s: no complete answer within %d ms", method, path,
                     timeout_ms);
            ok = 0;
            break;
        }
        struct pollfd pf = {fd, (short)(off < len ? POLLOUT : POLLIN), 0};
        int k = poll(&pf, 1, (int)left);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            continue; /* the deadline check above ends it */
        if (off < len) {
            ssize_t w = send(fd, out + off, len - off, MSG_NOSIGNAL);
            if (w < 0 && (errno == EAGAIN || errno == EINTR))
                continue;
            if (w < 0) {
                snprintf(r->err, sizeof r->err, "send to %s:%d: %s", ip, port, strerror(errno));
                ok = 0;
            } else {
                off += (size_t)w;
            }
            continue;
        }
        if (ilen + 1 >= icap) {
            char *n = realloc(in, icap * 2);
            if (!n) {
                ok = 0;
                break;
            }
            in = n;
            icap *= 2;
        }
        ssize_t got = recv(fd, in + ilen, icap - ilen - 1, 0);
        if (got < 0 && (errno == EAGAIN || errno == EINTR))
            continue;
        if (got < 0) {
            snprintf(r->err, sizeof r->err, "recv from %s:%d: %s", ip, port, strerror(errno));
            ok = 0;
        } else if (got == 0) {
            eof = 1;
        } else {
            ilen += (size_t)got;
        }
    }
    free(out);
    close(fd);
    if (!ok) {
        free(in);
        return -1;
    }
    in[ilen] = '\0';
    char *sep = strstr(in, "\r\n\r\n");
    int st = 0;
    if (!sep || sscanf(in, "HTTP/1.%*d %d", &st) != 1) {
        snprintf(r->err, sizeof r->err, "%s %s: not an HTTP answer (%zu bytes)", method, path,
                 ilen);
        free(in);
        return -1;
    }
    r->status = st;
    size_t hlen = (size_t)(sep - in) + 2;
    r->head = strndup(in, hlen);
    const char *b = sep + 4;
    r->body_len = ilen - (size_t)(b - in);
    /* Headers: Content-Length bounds the body; the generation extension. */
    for (char *line = strstr(r->head, "\r\n"); line && line[2]; line = strstr(line + 2, "\r\n")) {
        const char *h = line + 2;
        if (!strncasecmp(h, "Content-Length:", 15)) {
            size_t cl = strtoull(h + 15, NULL, 10);
            if (cl < r->body_len)
                r->body_len = cl;
        } else if (!strncasecmp(h, "X-Kvcoord-Generation:", 21)) {
            r->gen = strtoull(h + 21, NULL, 10);
            r->has_gen = 1;
        }
    }
    r->body = malloc(r->body_len + 1);
    if (r->body) {
        memcpy(r->body, b, r->body_len);
        r->body[r->body_len] = '\0';
    }
    free(in);
    return r->head && r->body ? 0 : -1;
}

/* A rank's transfer-engine info as GET /get_transfer_engine_info returns it. */
typedef struct th_info {
    int status;   /* 200, 404, ... (0: no answer) */
    uint64_t gen; /* X-Kvcoord-Generation */
    char session_id[256];
    char *desc;       /* weights_info_dict as compact JSON (malloc()ed) */
    char detail[512]; /* the error's detail, or why nothing came */
} th_info;

/* GET /get_transfer_engine_info?rank=R[&wait_ms=W] and parse it. */
static inline int th_get_info(const char *ns, const char *ip, int port, uint32_t rank, int wait_ms,
                              th_info *out)
{
    memset(out, 0, sizeof *out);
    char path[96];
    if (wait_ms > 0)
        snprintf(path, sizeof path, "/get_transfer_engine_info?rank=%u&wait_ms=%d", rank, wait_ms);
    else
        snprintf(path, sizeof path, "/get_transfer_engine_info?rank=%u", rank);
    th_resp r;
    if (th_request(ns, ip, port, "GET", path, NULL, wait_ms + 10000, &r)) {
        snprintf(out->detail, sizeof out->detail, "%s", r.err);
        th_resp_free(&r);
        return -1;
    }
    out->status = r.status;
    out->gen = r.gen;
    json_error_t je;
    json_t *root = json_loadb(r.body, r.body_len, 0, &je);
    int rc = -1;
    if (!root) {
        snprintf(out->detail, sizeof out->detail, "status %d, body not JSON (%s): %.200s", r.status,
                 je.text, r.body);
    } else if (r.status != 200) {
        const char *d = json_string_value(json_object_get(root, "detail"));
        snprintf(out->detail, sizeof out->detail, "%s", d ? d : "(no detail)");
        rc = 0;
    } else {
        json_t *arr = json_object_get(root, "remote_instance_transfer_engine_info");
        json_t *rk = json_object_get(root, "rank");
        const char *sid = json_string_value(json_array_get(arr, 0));
        json_t *w = json_array_get(arr, 1);
        if (!json_is_integer(rk) || (uint64_t)json_integer_value(rk) != rank || !sid ||
            !json_is_object(w) || json_array_size(arr) != 2 || !r.has_gen) {
            snprintf(out->detail, sizeof out->detail, "unexpected 200 answer: %.300s", r.body);
        } else {
            snprintf(out->session_id, sizeof out->session_id, "%s", sid);
            out->desc = json_dumps(w, JSON_COMPACT);
            rc = out->desc ? 0 : -1;
        }
    }
    json_decref(root);
    th_resp_free(&r);
    return rc;
}

static inline void th_info_free(th_info *i)
{
    free(i->desc);
    i->desc = NULL;
}

#endif
