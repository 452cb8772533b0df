/*
 * fuzz_http.c - fuzz target: kvcoordd's request path, bytes in to response
 * bytes out, without a socket.
 *
 * The input is what one connection receives.  It goes through
 * hconn_parse() exactly as http_session.c drives it (pipelined requests one
 * at a time, 100-continue, errors answered then the connection closed,
 * Connection: close honoured), each request through routes_dispatch() on a
 * real segment (a long-poll is resumed as expired: that is the answer it
 * gets when its wait ends; a deferred request runs routes_deferred() as the
 * helper thread would), into the connection's output buffer.  It runs
 * twice: all bytes in one piece, then in small pieces of sizes drawn from
 * the input (as recv() may deliver them).
 *
 * Checked for every answer:
 *   - a well-formed status line ("HTTP/1.1 NNN Reason"), header lines
 *     "Name: value" with no stray CR or LF (no header injection), exactly
 *     one Content-Length, and a body of exactly that length (none for HEAD);
 *   - "Connection: close" on an error answer and when the request asked;
 *   - a JSON body parses (jansson) and an error body has a "detail" string;
 *   - 100 Continue is exactly "HTTP/1.1 100 Continue\r\n\r\n";
 *   - HCONN_MORE consumed every byte, and every other event made progress
 *     or produced an answer; a parked lookup resumed as expired answers.
 * And the pieces do not change the framing: both runs see the same events
 * (requests and 100s at the same offsets, an error at the same place in
 * the sequence), so state carried across calls (the head and chunk scans)
 * is checked against the one-piece run.  Which error may differ (a long
 * bad target is 400 in one piece, 414 when the parser hands it over in
 * pieces): the status and detail are printed, not compared.
 */
#include <http_parser.h>
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "buf.h"
#include "fuzz_common.h"
#include "fuzz_sent.h"
#include "http_conn.h"
#include "http_resp.h"
#include "http_routes.h"
#include "json_scan.h"
#include "log.h"

static struct routes *routes;
static struct routes *worker; /* the helper thread's clone: runs what the loop defers */
static const struct http_limits limits = {.max_head = 16384, .max_body = 65536};

static void free_routes(void)
{
    routes_destroy(worker);
    routes_destroy(routes);
    routes = worker = NULL;
}

static void setup(void)
{
    if (routes)
        return;
    log_set_level(LOG_ERROR); /* a registration logs one line at info */
    kvc_segment *seg = fz_segment("http");
    /* Two ranks registered, so lookups also take the found path. */
    static const char info[] = "{\"model.embed_tokens.weight\":[140234567680000,262668288,2],"
                               "\"lm_head.weight\":[140235000000000,262668288,2]}";
    FZ_CHECK(kvc_rank_register(seg, 0, "10.0.0.1:16051", info, sizeof info - 1, NULL) == KVC_OK,
             "%s", kvc_last_error());
    FZ_CHECK(kvc_rank_register(seg, 1, "[2001:db8::1]:16051", "{}", 2, NULL) == KVC_OK, "%s",
             kvc_last_error());
    FZ_CHECK(routes_create(&routes, seg) == 0, "routes_create");
    FZ_CHECK(routes_clone(routes, &worker) == 0, "routes_clone");
    fz_before_close = free_routes;
}

static int is_tchar(unsigned char ch)
{
    return (ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
           (ch && strchr("!#$%&'*+-.^_`|~", ch));
}

/* Find "\r\n" in p[0..n) from off; returns its offset or n. */
static size_t find_crlf(const char *p, size_t n, size_t off)
{
    for (size_t i = off; i + 1 < n; i++)
        if (p[i] == '\r' && p[i + 1] == '\n')
            return i;
    return n;
}

/* Check that p[0..n) is exactly one response.  is_head: answer to HEAD
 * (no body); must_close: "Connection: close" required. */
/* jansson's refusals of valid JSON: integers past int64, reals past a
 * double (the same list as fuzz_json_scan.c's). */
static int beyond_jansson(const char *jansson_error)
{
    return strstr(jansson_error, "too big integer") || strstr(jansson_error, "too big negative") ||
           strstr(jansson_error, "real number overflow");
}

static void check_response(const char *p, size_t n, int is_head, int must_close)
{
    static const char cont[] = "HTTP/1.1 100 Continue\r\n\r\n";
    FZ_CHECK(n >= 17 && !memcmp(p, "HTTP/1.1 ", 9), "bad status line: %.*s", (int)(n < 40 ? n : 40),
             p);
    FZ_CHECK(p[9] >= '1' && p[9] <= '5' && p[10] >= '0' && p[10] <= '9' && p[11] >= '0' &&
                 p[11] <= '9' && p[12] == ' ',
             "bad status code: %.*s", 16, p);
    int status = (p[9] - '0') * 100 + (p[10] - '0') * 10 + (p[11] - '0');
    if (status == 100) {
        FZ_CHECK(n == sizeof cont - 1 && !memcmp(p, cont, n), "bad 100 Continue (%zu bytes)", n);
        return;
    }
    size_t eol = find_crlf(p, n, 0);
    FZ_CHECK(eol < n && eol > 13, "status line without reason or CRLF");
    for (size_t i = 13; i < eol; i++)
        FZ_CHECK(p[i] >= 0x20 && p[i] < 0x7f, "control byte 0x%02x in the reason phrase",
                 (unsigned char)p[i]);
    long long clen = -1;
    int n_clen = 0, close_hdr = 0, json = 0;
    size_t off = eol + 2;
    for (;;) {
        eol = find_crlf(p, n, off);
        FZ_CHECK(eol < n, "headers not terminated by an empty line");
        if (eol == off)
            break;
        size_t colon = off;
        while (colon < eol && is_tchar((unsigned char)p[colon]))
            colon++;
        FZ_CHECK(colon > off && colon + 1 < eol && p[colon] == ':' && p[colon + 1] == ' ',
                 "bad header line: %.*s", (int)(eol - off > 80 ? 80 : eol - off), p + off);
        for (size_t i = colon + 2; i < eol; i++)
            FZ_CHECK(p[i] != '\r' && p[i] != '\n' && p[i] != 0,
                     "CR, LF or NUL inside a header value: %.*s", (int)(eol - off), p + off);
        const char *name = p + off, *val = p + colon + 2;
        size_t nlen = colon - off, vlen = eol - colon - 2;
        if (nlen == 14 && !strncasecmp(name, "content-length", 14)) {
            n_clen++;
            clen = 0;
            FZ_CHECK(vlen > 0 && vlen <= 18, "Content-Length of %zu digits", vlen);
            for (size_t i = 0; i < vlen; i++) {
                FZ_CHECK(val[i] >= '0' && val[i] <= '9', "Content-Length not a number");
                clen = clen * 10 + (val[i] - '0');
            }
        } else if (nlen == 10 && !strncasecmp(name, "connection", 10)) {
            close_hdr = vlen == 5 && !strncasecmp(val, "close", 5);
        } else if (nlen == 12 && !strncasecmp(name, "content-type", 12)) {
            json = vlen >= 16 && !strncmp(val, "application/json", 16);
        }
        off = eol + 2;
    }
    size_t body_off = eol + 2;
    FZ_CHECK(n_clen == 1, "%d Content-Length headers in a %d answer", n_clen, status);
    size_t body_len = n - body_off;
    FZ_CHECK((long long)body_len == (is_head ? 0 : clen),
             "Content-Length %lld but %zu body bytes (HEAD %d, status %d)", clen, body_len, is_head,
             status);
    if (must_close)
        FZ_CHECK(close_hdr, "Connection: close missing (status %d)", status);
    if (json && body_len) {
        const uint8_t *b = (const uint8_t *)p + body_off;
        if (!fz_utf8_valid(b, body_len)) {
            FZ_CHECK(!fz_check_utf8(), "%d answer's JSON body is not valid UTF-8: %.*s", status,
                     (int)(body_len > 200 ? 200 : body_len), p + body_off);
            return;
        }
        json_error_t jerr;
        json_t *v = json_loadb(p + body_off, body_len, 0, &jerr);
        if (!v && beyond_jansson(jerr.text)) {
            /* Valid JSON jansson cannot read (a rank's dict is returned as
             * sent: 1e999, 2^64-1): checked by the RFC 8259 scanner instead. */
            struct kvc_json_error je;
            FZ_CHECK(kvc__json_scan(p + body_off, body_len, NULL, 0, NULL, &je) == 0,
                     "%d answer's JSON body is not JSON: %s at %u:%u", status, je.text, je.line,
                     je.column);
            FZ_CHECK(status < 400, "an error body jansson cannot read (%s)", jerr.text);
            return;
        }
        FZ_CHECK(v, "%d answer's JSON body does not parse: %s (body: %.*s)", status, jerr.text,
                 (int)(body_len > 200 ? 200 : body_len), p + body_off);
        if (status >= 400)
            FZ_CHECK(json_is_string(json_object_get(v, "detail")),
                     "error body without a \"detail\" string");
        json_decref(v);
    }
}

/* The events of one run, to compare the two (error: status, detail). */
#define MAX_EVENTS 64
struct fz_events {
    size_t n;
    struct {
        int ev, status;
        size_t off;       /* input offset after a request or 100 (0 for an error) */
        char detail[160]; /* copied: it may be in the connection's buffer */
    } e[MAX_EVENTS];
};

static void fz_log_event(struct fz_events *log, int ev, int status, size_t off, const char *detail)
{
    if (log->n < MAX_EVENTS) {
        log->e[log->n].ev = ev, log->e[log->n].status = status, log->e[log->n].off = off;
        snprintf(log->e[log->n].detail, sizeof log->e[log->n].detail, "%s", detail ? detail : "");
    }
    log->n++;
}

static void same_events(const struct fz_events *a, const struct fz_events *b)
{
    FZ_CHECK(a->n == b->n, "%zu events in one piece, %zu in pieces", a->n, b->n);
    for (size_t i = 0; i < a->n && i < MAX_EVENTS; i++)
        FZ_CHECK(a->e[i].ev == b->e[i].ev && a->e[i].off == b->e[i].off,
                 "event %zu: %d %d at %zu (%s) in one piece, %d %d at %zu (%s) in pieces", i,
                 a->e[i].ev, a->e[i].status, a->e[i].off, a->e[i].detail, b->e[i].ev,
                 b->e[i].status, b->e[i].off, b->e[i].detail);
}

/* Feed data to one connection in pieces: piece sizes come from the
 * xorshift state (0: everything at once). */
static void run_conn(const uint8_t *data, size_t size, uint32_t rng, struct fz_events *log)
{
    log->n = 0;
    struct http_conn hc;
    struct route_slot slot;
    struct buf out = {0};
    memset(&slot, 0, sizeof slot);
    hconn_init(&hc, &limits);
    size_t off = 0, avail = 0;
    int closing = 0, stalled = 0;
    while (!closing) {
        if (off == avail) { /* everything received so far is consumed: "recv" more */
            if (avail == size)
                break;
            size_t piece = size - avail;
            if (rng) {
                rng ^= rng << 13, rng ^= rng >> 17, rng ^= rng << 5;
                size_t want = 1 + rng % 64;
                piece = want < piece ? want : piece;
            }
            avail += piece;
        }
        size_t used = 0;
        enum hconn_event ev = hconn_parse(&hc, (const char *)data + off, avail - off, &used);
        FZ_CHECK(used <= avail - off, "consumed %zu of %zu", used, avail - off);
        off += used;
        /* http_session.c loops while bytes remain: an event that consumes
         * nothing, again and again, would spin the daemon. */
        stalled = used ? 0 : stalled + 1;
        FZ_CHECK(stalled < 8, "%d events in a row consumed nothing (event %d)", stalled, ev);
        size_t start = buf_total(&out), n_sent;
        const char *sent;
        switch (ev) {
        case HCONN_MORE:
            FZ_CHECK(off == avail, "HCONN_MORE left %zu bytes unconsumed", avail - off);
            continue;
        case HCONN_CONTINUE:
            fz_log_event(log, ev, 100, off, NULL);
            resp_continue(&out);
            sent = fz_sent_bytes(&out, start, &n_sent);
            check_response(sent, n_sent, 0, 0);
            continue;
        case HCONN_ERROR: {
            static const struct http_req closing_req = {
                .method = HTTP_GET, .http_minor = 1, .keep_alive = 0};
            FZ_CHECK(hc.err_status >= 400 && hc.err_status <= 599 && hc.err_detail,
                     "error event with status %d", hc.err_status);
            fz_log_event(log, ev, hc.err_status, 0, hc.err_detail);
            resp_detail(&out, &closing_req, hc.err_status, hc.err_detail, NULL);
            sent = fz_sent_bytes(&out, start, &n_sent);
            check_response(sent, n_sent, 0, 1);
            closing = 1;
            continue;
        }
        case HCONN_REQUEST: break;
        }
        const struct http_req *req = &hc.req;
        fz_log_event(log, ev, 0, off, NULL);
        FZ_CHECK(req->path_len == 0 || req->path, "path NULL");
        enum route_rc rc = routes_dispatch(routes, &slot, req, &out);
        buf_flatten(&out); /* shared bodies into the bytes checked */
        if (rc == ROUTE_PARK) {
            FZ_CHECK(buf_total(&out) == start, "a parked request wrote %zu bytes",
                     buf_total(&out) - start);
            rc = routes_resume(routes, &slot, req, &out, 1);
            FZ_CHECK(rc == ROUTE_DONE, "an expired long-poll parked again");
        } else if (rc == ROUTE_DEFER) {
            /* What the helper thread runs (http_worker.c), here inline. */
            FZ_CHECK(buf_total(&out) == start, "a deferred request wrote %zu bytes",
                     buf_total(&out) - start);
            routes_deferred(worker, req, &out);
        }
        FZ_CHECK(!out.oom, "output buffer out of memory");
        FZ_CHECK(buf_total(&out) > start, "request answered with nothing");
        sent = fz_sent_bytes(&out, start, &n_sent);
        check_response(sent, n_sent, req->method == HTTP_HEAD, !req->keep_alive);
        if (!req->keep_alive)
            closing = 1;
        hconn_done(&hc);
        route_slot_done(&slot);
        buf_reset(&out); /* as if sent */
    }
    hconn_free(&hc);
    route_slot_free(&slot);
    buf_free(&out);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static struct fz_events whole, pieces;
    setup();
    run_conn(data, size, 0, &whole);
    uint32_t seed = 0x9e3779b9u ^ (uint32_t)size;
    for (size_t i = 0; i < size && i < 16; i++)
        seed = seed * 31 + data[i];
    run_conn(data, size, seed ? seed : 1, &pieces);
    same_events(&whole, &pieces);
    return 0;
}
