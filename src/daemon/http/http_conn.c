/*
 * http_conn.c - one connection's HTTP/1.1 parsing; see http_conn.h.
 *
 * http-parser calls back with pieces of the request as they arrive (a piece
 * may be split across recv() calls).  A callback that needs the server to
 * act stops the parser with http_parser_pause(); hconn_parse() then returns
 * the event, and the next call resumes exactly where the parser stopped.
 */
#include "http_conn.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "hex.h"
#include "query.h"

#define URL_KEEP 4096       /* URL buffer kept between requests */
#define BODY_KEEP 65536     /* body buffer kept between requests */
#define HEADER_LINE_EXTRA 4 /* ": " and CRLF, counted toward max_head */

enum { KEEP_NONE = 0, KEEP_EXPECT = 1, KEEP_TE = 2, KEEP_AUTH = 3 };

/* head_scan()'s states (fold_st) */
enum { FOLD_START = 0, FOLD_LINE, FOLD_CR, FOLD_BOL, FOLD_BOL_CR, FOLD_DONE };

/* chunk_scan()'s states (chunk_st) */
enum {
    CK_OFF = 0,  /* no chunked body being read (or its head not ended yet) */
    CK_HEAD_END, /* next byte: the head's last (head_scan's) */
    CK_SIZE0,    /* a chunk-size's first digit */
    CK_SIZE,     /* more digits, BWS, ';' or CR */
    CK_BWS,      /* whitespace after the size: ';' must follow */
    CK_EXT,      /* chunk extensions, up to CR */
    CK_SIZE_LF,  /* the LF of the chunk-size line */
    CK_DATA,     /* chunk_left bytes of data */
    CK_DATA_CR,  /* the CRLF after the data */
    CK_DATA_LF,
    CK_TRAILERS /* the trailer section: head_scan checks it */
};

static struct http_conn *conn_of(http_parser *p) { return p->data; }

/* Stop the parser and report ev from hconn_parse(). */
static int stop_with(struct http_conn *c, enum hconn_event ev)
{
    c->event = ev;
    http_parser_pause(&c->parser, 1);
    return 0;
}

static int fail(struct http_conn *c, int status, const char *detail)
{
    c->err_status = status;
    c->err_detail = detail;
    c->err_extra = status == 401   ? "WWW-Authenticate: Bearer\r\n"
                   : status == 503 ? "Retry-After: 1\r\n"
                                   : NULL;
    return stop_with(c, HCONN_ERROR);
}

/* Give back what this request reserved of the daemon-wide budget. */
static void unreserve(struct http_conn *c)
{
    if (c->reserved && c->lim->buffered)
        *c->lim->buffered -= c->reserved;
    if (c->reserved && c->untrusted && c->lim->untrusted)
        *c->lim->untrusted -= c->reserved;
    if (c->reserved && c->peer_bytes)
        *c->peer_bytes -= c->reserved;
    c->reserved = 0;
    c->untrusted = 0;
}

/* Does n more bytes fit in max, with *used held already? */
static int fits(size_t used, size_t max, uint64_t n)
{
    return n <= max - (used < max ? used : max);
}

/* Reserve n more body bytes of the daemon-wide budget; 503 when they do
 * not fit. */
static int reserve(struct http_conn *c, uint64_t n)
{
    if (!c->lim->max_buffered || !c->lim->buffered || n == 0)
        return 0;
    int share = c->untrusted && c->lim->untrusted && c->lim->max_untrusted;
    if (c->peer_bytes && c->peer_max && !fits(*c->peer_bytes, c->peer_max, n)) {
        fail(c, 503,
             "Server busy: request bodies being received from this address exceed its share of "
             "the buffer budget");
        return -1;
    }
    if (!fits(*c->lim->buffered, c->lim->max_buffered, n) ||
        (share && !fits(*c->lim->untrusted, c->lim->max_untrusted, n))) {
        fail(c, 503,
             share ? "Server busy: request bodies of clients without the token being received "
                     "exceed their share of the buffer budget"
                   : "Server busy: request bodies being received exceed its buffer budget");
        return -1;
    }
    *c->lim->buffered += (size_t)n;
    if (share)
        *c->lim->untrusted += (size_t)n;
    if (c->peer_bytes)
        *c->peer_bytes += (size_t)n;
    c->reserved += (size_t)n;
    return 0;
}

/* The answer to a head over the limit, its detail in err_buf: 414 when
 * the request line (its target) is what overflowed, else 431 (RFC 9110
 * 15.5.15, RFC 6585 5). */
static int head_too_large(struct http_conn *c, int in_line)
{
    if (in_line) {
        snprintf(c->err_buf, sizeof c->err_buf,
                 "URI too long: the request line exceeds the head's limit of %zu bytes",
                 c->lim->max_head);
        return 414;
    }
    snprintf(c->err_buf, sizeof c->err_buf, "Request header fields too large (limit %zu bytes)",
             c->lim->max_head);
    return 431;
}

/* Count n more bytes of request head (in_line: of the request target);
 * 414 or 431 past the limit. */
static int add_head(struct http_conn *c, size_t n, int in_line)
{
    c->head_bytes += n;
    if (c->head_bytes <= c->lim->max_head)
        return 0;
    fail(c, head_too_large(c, in_line), c->err_buf);
    return -1;
}

/* Forget the Authorization value of the last request (a secret: zeroed,
 * not just marked unused). */
static void auth_wipe(struct http_conn *c)
{
    size_t n = c->auth_len < sizeof c->auth ? c->auth_len : sizeof c->auth;
    if (n)
        memset(c->auth, 0, n);
    c->auth_len = 0;
    c->auth_count = c->auth_overflow = 0;
    c->req.authorization = NULL;
    c->req.authorization_len = 0;
    c->req.authorization_bad = 0;
}

static int on_message_begin(http_parser *p)
{
    struct http_conn *c = conn_of(p);
    c->phase = HCONN_HEAD;
    c->head_bytes = 0;
    buf_reset(&c->url);
    buf_reset(&c->body);
    c->field_len = c->in_value = c->keep = 0;
    c->te_count = c->host_count = c->expect_len = c->te_len = 0;
    c->split = 0;
    unreserve(c);
    auth_wipe(c);
    return 0;
}

static int on_url(http_parser *p, const char *at, size_t n)
{
    struct http_conn *c = conn_of(p);
    if (add_head(c, n, 1))
        return 0;
    buf_append(&c->url, at, n);
    return 0;
}

static int on_header_field(http_parser *p, const char *at, size_t n)
{
    struct http_conn *c = conn_of(p);
    if (add_head(c, n + (c->in_value || !c->field_len ? HEADER_LINE_EXTRA : 0), 0))
        return 0;
    if (c->in_value) { /* a new header starts */
        c->field_len = 0;
        c->in_value = 0;
        c->keep = KEEP_NONE;
    }
    /* "Name : value" must be rejected (RFC 9112 5.1): some parsers take the
     * name with the space as another header, which lets a smuggled
     * Content-Length or Transfer-Encoding through. */
    if (memchr(at, ' ', n) || memchr(at, '\t', n))
        return fail(c, 400, "Malformed HTTP request: whitespace in a header field name");
    for (size_t i = 0; i < n && c->field_len < sizeof c->field; i++)
        c->field[c->field_len++] = at[i];
    return 0;
}

/* The whole header name is known: decide whether its value is kept. */
static void classify_field(struct http_conn *c)
{
    size_t n = c->field_len;
    c->in_value = 1;
    c->keep = KEEP_NONE;
    if (n == 6 && !strncasecmp(c->field, "expect", 6)) {
        c->keep = KEEP_EXPECT;
    } else if (n == 17 && !strncasecmp(c->field, "transfer-encoding", 17)) {
        c->keep = KEEP_TE;
        if (++c->te_count > 1)
            fail(c, 400, "Malformed HTTP request: duplicate Transfer-Encoding header");
    } else if (n == 4 && !strncasecmp(c->field, "host", 4)) {
        /* RFC 9112 3.2: more than one Host header field is a 400. */
        if (++c->host_count > 1)
            fail(c, 400, "Malformed HTTP request: more than one Host header");
    } else if (n == 13 && !strncasecmp(c->field, "authorization", 13)) {
        c->keep = KEEP_AUTH;
        if (c->auth_count < 255)
            c->auth_count++;
    }
}

static void keep_bytes(char *dst, unsigned char *len, size_t cap, const char *at, size_t n)
{
    for (size_t i = 0; i < n && *len < cap; i++)
        dst[(*len)++] = at[i];
}

static int on_header_value(http_parser *p, const char *at, size_t n)
{
    struct http_conn *c = conn_of(p);
    if (add_head(c, n, 0))
        return 0;
    if (!c->in_value)
        classify_field(c);
    if (HTTP_PARSER_ERRNO(p) == HPE_PAUSED)
        return 0;
    if (c->keep == KEEP_EXPECT)
        keep_bytes(c->expect, &c->expect_len, sizeof c->expect, at, n);
    else if (c->keep == KEEP_TE)
        keep_bytes(c->te, &c->te_len, sizeof c->te, at, n);
    else if (c->keep == KEEP_AUTH && c->auth_count == 1) {
        if (n > sizeof c->auth - c->auth_len) {
            c->auth_overflow = 1; /* denied; nothing past the buffer is kept */
            n = sizeof c->auth - c->auth_len;
        }
        memcpy(c->auth + c->auth_len, at, n);
        c->auth_len += n;
    }
    return 0;
}

/* A kept header value without surrounding whitespace equals word
 * (case-insensitive); a truncated value never does. */
static int value_is(const char *v, size_t len, size_t cap, const char *word)
{
    if (len >= cap)
        return 0;
    while (len && (*v == ' ' || *v == '\t'))
        v++, len--;
    while (len && (v[len - 1] == ' ' || v[len - 1] == '\t'))
        len--;
    return len == strlen(word) && !strncasecmp(v, word, len);
}

static int body_expected(const http_parser *p)
{
    return (p->flags & F_CHUNKED) || (p->content_length > 0 && p->content_length != UINT64_MAX);
}

static int body_too_large(struct http_conn *c)
{
    snprintf(c->err_buf, sizeof c->err_buf, "Request body too large (limit %zu bytes)",
             c->lim->max_body);
    return fail(c, 413, c->err_buf);
}

/* Split the request target into the raw path, its decoded copy (after
 * the target in c->url) and the raw query.  -1: a bad percent-escape (or
 * URL); -2: out of memory. */
static int split_target(struct http_conn *c)
{
    char *u = c->url.p;
    size_t n = c->url.len;
    size_t path_off = 0, path_len, q_off = n, q_len = 0;
    if (n == 0) /* http-parser never passes an empty target; be safe */
        return -1;
    if (u[0] != '/' && !(n == 1 && u[0] == '*')) { /* absolute-form */
        struct http_parser_url pu;
        http_parser_url_init(&pu);
        if (http_parser_parse_url(u, n, 0, &pu))
            return -1;
        path_off = pu.field_data[UF_PATH].off;
        path_len = (pu.field_set & (1 << UF_PATH)) ? pu.field_data[UF_PATH].len : 0;
        if (pu.field_set & (1 << UF_QUERY))
            q_off = pu.field_data[UF_QUERY].off, q_len = pu.field_data[UF_QUERY].len;
    } else {
        char *hash = memchr(u, '#', n);
        if (hash)
            n = (size_t)(hash - u);
        char *qm = memchr(u, '?', n);
        path_len = qm ? (size_t)(qm - u) : n;
        if (qm)
            q_off = path_len + 1, q_len = n - path_len - 1;
    }
    long dlen = pct_decode(NULL, u + path_off, path_len, 0);
    if (dlen < 0)
        return -1;
    size_t dec_off = c->url.len;
    if (!buf_space(&c->url, (size_t)dlen + 1))
        return -2;
    u = c->url.p; /* may have moved */
    pct_decode(u + dec_off, u + path_off, path_len, 0);
    buf_commit(&c->url, (size_t)dlen);
    c->req.raw_path = path_len ? u + path_off : "/";
    c->req.raw_path_len = path_len ? path_len : 1;
    c->req.path = path_len ? u + dec_off : "/";
    c->req.path_len = path_len ? (size_t)dlen : 1;
    c->req.query = u + q_off;
    c->req.query_len = q_len;
    return 0;
}

/* Split the target once; on failure the error is set (returns -1). */
static int split_once(struct http_conn *c)
{
    if (c->split)
        return 0;
    if (c->url.oom) {
        fail(c, 500, "Out of memory reading the request");
        return -1;
    }
    int rc = split_target(c);
    if (rc == -2) {
        fail(c, 500, "Out of memory reading the request");
        return -1;
    }
    if (rc) {
        fail(c, 400, "Invalid request target (bad percent-encoding or URL)");
        return -1;
    }
    c->split = 1;
    return 0;
}

static int on_headers_complete(http_parser *p)
{
    struct http_conn *c = conn_of(p);
    c->phase = HCONN_BODY;
    if (p->http_major != 1)
        return fail(c, 400, "Malformed HTTP request: unsupported HTTP version");
    if (c->te_count && !value_is(c->te, c->te_len, sizeof c->te, "chunked"))
        return fail(c, 501, "Unsupported Transfer-Encoding (only chunked is accepted)");
    if (c->auth_count) {
        c->req.authorization = c->auth;
        c->req.authorization_len = c->auth_len;
        c->req.authorization_bad = c->auth_count > 1 || c->auth_overflow;
    }
    /* RFC 9112 3.2: a server MUST answer 400 to an HTTP/1.1 request
     * without a Host header field (more than one is refused as it comes). */
    if (p->http_minor >= 1 && c->host_count == 0)
        return fail(c, 400, "Malformed HTTP request: no Host header (HTTP/1.1 requires one)");
    /* The target is whole now: split (and decode) it once, here. */
    if (split_once(c))
        return 0;
    c->req.method = p->method;
    if (body_expected(p)) {
        /* Refused from the headers alone: the body is never buffered.  The
         * token is checked before the size, so a peer without it learns
         * nothing of the limit (a chunked body is measured later still). */
        int st = c->lim->head_check ? c->lim->head_check(c->lim->head_arg, &c->req) : 0;
        if (st >= 100)
            return fail(c, st, st == 401 ? "Unauthorized" : "Request refused");
        c->untrusted = st == HEAD_UNTRUSTED;
        if (!(p->flags & F_CHUNKED) && p->content_length > c->lim->max_body)
            return body_too_large(c);
        if (!(p->flags & F_CHUNKED) && reserve(c, p->content_length))
            return 0;
    }
    /* A chunked body's framing is checked as it arrives (chunk_scan), from
     * the head's last byte: pausing here leaves that byte unconsumed. */
    int chunked = (p->flags & F_CHUNKED) && !p->upgrade;
    if (chunked)
        c->chunk_st = CK_HEAD_END;
    /* RFC 9110 10.1.1: Expect is ignored in HTTP/1.0 requests. */
    if (c->expect_len && p->http_minor >= 1) {
        if (!value_is(c->expect, c->expect_len, sizeof c->expect, "100-continue"))
            return fail(c, 417, "Unsupported Expect header (only 100-continue is accepted)");
        if (body_expected(p))
            return stop_with(c, HCONN_CONTINUE);
    }
    return chunked ? stop_with(c, HCONN_MORE) : 0;
}

/* A chunk announces its size first: refuse one that cannot fit before it
 * arrives. */
static int on_chunk_header(http_parser *p)
{
    struct http_conn *c = conn_of(p);
    if (p->content_length > c->lim->max_body - c->body.len)
        return body_too_large(c);
    reserve(c, p->content_length);
    return 0;
}

static int on_body(http_parser *p, const char *at, size_t n)
{
    struct http_conn *c = conn_of(p);
    if (n > c->lim->max_body - c->body.len)
        return body_too_large(c);
    buf_append(&c->body, at, n);
    return 0;
}

static int on_message_complete(http_parser *p)
{
    struct http_conn *c = conn_of(p);
    c->phase = HCONN_IDLE;
    if (c->url.oom || c->body.oom)
        return fail(c, 500, "Out of memory reading the request");
    if (split_once(c))
        return 0;
    c->req.method = p->method;
    c->req.body = c->body.len ? c->body.p : "";
    c->req.body_len = c->body.len;
    c->req.http_minor = (unsigned char)p->http_minor;
    /* An upgrade (or CONNECT) is answered, then the connection closes: the
     * bytes after it would be another protocol. */
    c->req.keep_alive = http_should_keep_alive(p) && !p->upgrade;
    return stop_with(c, HCONN_REQUEST);
}

static const http_parser_settings settings = {
    .on_message_begin = on_message_begin,
    .on_url = on_url,
    .on_header_field = on_header_field,
    .on_header_value = on_header_value,
    .on_headers_complete = on_headers_complete,
    .on_chunk_header = on_chunk_header,
    .on_body = on_body,
    .on_message_complete = on_message_complete,
};

void hconn_init(struct http_conn *c, const struct http_limits *lim)
{
    memset(c, 0, sizeof *c);
    http_parser_init(&c->parser, HTTP_REQUEST);
    c->parser.data = c;
    c->lim = lim;
}

static enum hconn_event parser_error(struct http_conn *c, enum http_errno e)
{
    if (e == HPE_HEADER_OVERFLOW) {
        /* http-parser's own limit, met before a callback: the head scan
         * (head_scan) says whether the request line had ended. */
        c->err_status = head_too_large(c, !c->line_seen);
        c->err_detail = c->err_buf;
    } else if (e == HPE_INVALID_CONTENT_LENGTH) {
        /* http-parser reports both a bad Content-Length and a bad chunk size
         * (one above 2^64-1 included) under this one code: say which. */
        snprintf(c->err_buf, sizeof c->err_buf, "Malformed HTTP request: %s",
                 (c->parser.flags & F_CHUNKED)
                     ? "invalid chunk size (not hexadecimal, or above 2^64-1)"
                     : "invalid Content-Length (not a decimal number, or above 2^64-1)");
        c->err_status = 400;
        c->err_detail = c->err_buf;
    } else if (e == HPE_UNEXPECTED_CONTENT_LENGTH) {
        /* http-parser uses this one code for a second Content-Length (found
         * at its value, before on_header_value runs for it) and for
         * Content-Length with Transfer-Encoding (found at the end of the
         * head): say which. RFC 9112 6.1 lets a server reject the latter;
         * we do, so no intermediary can read the body another way. */
        int dup_cl =
            !c->in_value && c->field_len == 14 && !strncasecmp(c->field, "content-length", 14);
        c->err_status = 400;
        c->err_detail = dup_cl ? "Malformed HTTP request: more than one Content-Length header"
                               : "Malformed HTTP request: both Content-Length and "
                                 "Transfer-Encoding headers (send one of them)";
    } else {
        snprintf(c->err_buf, sizeof c->err_buf, "Malformed HTTP request: %s",
                 http_errno_description(e));
        c->err_status = 400;
        c->err_detail = c->err_buf;
    }
    return HCONN_ERROR;
}

/* The head (RFC 9112 2.2, 5.2).  http-parser, built without
 * HTTP_PARSER_STRICT as Debian ships it, joins a header line that starts
 * with a space or a tab to the previous one (obs-fold) and takes any byte
 * after the CR of the blank line ending the head (or the trailers) for its
 * LF.  So the bytes the parser consumed are scanned here, from the request
 * line (after the empty lines the parser skips before it) to that blank
 * line: a line start followed by whitespace, or a CR not followed by LF,
 * is refused.  The trailer section of a chunked body is scanned the same
 * way (from FOLD_BOL).  The state carries over from one call to the next.
 * Returns NULL, or what is wrong. */

static const char *head_scan(struct http_conn *c, const char *p, size_t n)
{
    unsigned st = c->fold_st;
    for (size_t i = 0; i < n && st != FOLD_DONE; i++) {
        char b = p[i];
        if ((st == FOLD_CR || st == FOLD_BOL_CR) && b != '\n')
            return "Malformed HTTP request: header line not ended by CRLF";
        if (st == FOLD_BOL && (b == ' ' || b == '\t'))
            return "Malformed HTTP request: header line folded onto the next (obs-fold)";
        if (st == FOLD_START)
            st = b == '\r' || b == '\n' ? FOLD_START : FOLD_LINE;
        else if (st == FOLD_BOL)
            st = b == '\r' ? FOLD_BOL_CR : b == '\n' ? FOLD_DONE : FOLD_LINE;
        else if (st == FOLD_BOL_CR)
            st = FOLD_DONE;
        else { /* FOLD_LINE, FOLD_CR */
            if (b == '\n')
                c->line_seen = 1;
            st = b == '\n' ? FOLD_BOL : b == '\r' ? FOLD_CR : FOLD_LINE;
        }
    }
    c->fold_st = (unsigned char)st;
    return NULL;
}

/* A chunked body's framing (RFC 9112 7.1).  http-parser without
 * HTTP_PARSER_STRICT takes any two bytes after a chunk's data for its
 * CRLF, any byte after a chunk-size line's CR for its LF, and anything up
 * to a CR (LF included) as chunk extensions: a proxy in front that reads
 * chunks strictly would split the stream elsewhere (request smuggling).
 * So the body bytes the parser consumed are checked here, byte for byte
 * except the data, which is counted:
 *   chunk      = chunk-size [ BWS ";" ext ] CRLF chunk-data CRLF
 *   last-chunk = 1*"0" [ BWS ";" ext ] CRLF, then the trailer section,
 *                scanned as the head is (head_scan) and parsed by
 *                http-parser as header lines
 * where ext holds no control byte but HTAB (names and values are not
 * looked at further: they are ignored).  on_headers_complete pauses the
 * parser just before the head's last byte, so the scan knows where the
 * body starts; the state (chunk_st, chunk_left) carries over from one call
 * to the next and is reset with each request. */

static const char *chunk_scan(struct http_conn *c, const char *p, size_t n)
{
    static const char size_crlf[] = "Malformed HTTP request: chunk size line not ended by CRLF";
    static const char data_crlf[] = "Malformed HTTP request: chunk data not followed by CRLF";
    static const char bad_size[] =
        "Malformed HTTP request: invalid chunk size (not hexadecimal, or above 2^64-1)";
    unsigned st = c->chunk_st;
    for (size_t i = 0; i < n && st != CK_TRAILERS; i++) {
        unsigned char b = (unsigned char)p[i];
        int h = kvc__hex_digit(b);
        switch (st) {
        case CK_HEAD_END: st = CK_SIZE0; break;
        case CK_SIZE0:
            if (h < 0)
                return bad_size;
            c->chunk_left = (uint64_t)h;
            st = CK_SIZE;
            break;
        case CK_SIZE:
            if (h >= 0 && c->chunk_left > (UINT64_MAX >> 4)) /* http-parser refuses it first */
                return bad_size;
            if (h >= 0)
                c->chunk_left = c->chunk_left * 16 + (uint64_t)h;
            else if (b == ' ' || b == '\t')
                st = CK_BWS;
            else if (b == ';')
                st = CK_EXT;
            else if (b == '\r')
                st = CK_SIZE_LF;
            else
                return b == '\n' ? size_crlf : bad_size;
            break;
        case CK_BWS:
            if (b == ';')
                st = CK_EXT;
            else if (b != ' ' && b != '\t')
                return "Malformed HTTP request: chunk extension without ';'";
            break;
        case CK_EXT:
            if (b == '\r')
                st = CK_SIZE_LF;
            else if (b == '\n')
                return size_crlf;
            else if ((b < 0x20 && b != '\t') || b == 0x7f)
                return "Malformed HTTP request: control byte in a chunk extension";
            break;
        case CK_SIZE_LF:
            if (b != '\n')
                return size_crlf;
            if (c->chunk_left == 0) { /* the last chunk: trailers follow */
                st = CK_TRAILERS;
                c->fold_st = FOLD_BOL;
                c->chunk_st = (unsigned char)st;
                return head_scan(c, p + i + 1, n - i - 1);
            }
            st = CK_DATA;
            break;
        case CK_DATA: {
            size_t k = n - i; /* this byte and the ones after it */
            if (k > c->chunk_left)
                k = (size_t)c->chunk_left;
            c->chunk_left -= k;
            i += k - 1;
            if (c->chunk_left == 0)
                st = CK_DATA_CR;
            break;
        }
        case CK_DATA_CR:
            if (b != '\r')
                return data_crlf;
            st = CK_DATA_LF;
            break;
        case CK_DATA_LF:
            if (b != '\n')
                return data_crlf;
            st = CK_SIZE0;
            break;
        }
    }
    c->chunk_st = (unsigned char)st;
    return NULL;
}

enum hconn_event hconn_parse(struct http_conn *c, const char *data, size_t len, size_t *consumed)
{
    if (c->phase == HCONN_IDLE) { /* the next bytes start a request */
        c->fold_st = FOLD_START;
        c->line_seen = 0;
        c->chunk_st = CK_OFF;
    }
    size_t total = 0;
    enum http_errno e;
    for (;;) {
        c->event = HCONN_MORE;
        /* chunk_st set by on_headers_complete during this execute: what
         * it consumed is head. */
        int in_body = c->chunk_st != CK_OFF;
        size_t n = http_parser_execute(&c->parser, &settings, data + total, len - total);
        e = HTTP_PARSER_ERRNO(&c->parser);
        if (e == HPE_PAUSED)
            http_parser_pause(&c->parser, 0);
        const char *bad = c->fold_st != FOLD_DONE ? head_scan(c, data + total, n) : NULL;
        if (!bad && in_body)
            bad = chunk_scan(c, data + total, n);
        total += n;
        *consumed = total;
        if (bad) {
            c->err_status = 400;
            c->err_detail = bad;
            c->err_extra = NULL;
            return HCONN_ERROR;
        }
        /* on_headers_complete's pause at a chunked head's end: go on. */
        if (!(e == HPE_PAUSED && c->event == HCONN_MORE && total < len))
            break;
    }
    if (e == HPE_PAUSED)
        return c->event;
    if (e != HPE_OK)
        return parser_error(c, e);
    if (total < len) /* cannot happen without an error or a pause */
        return parser_error(c, HPE_UNKNOWN);
    return HCONN_MORE;
}

void hconn_done(struct http_conn *c)
{
    unreserve(c);
    auth_wipe(c);
    buf_trim(&c->url, URL_KEEP);
    buf_trim(&c->body, BODY_KEEP);
}

void hconn_free(struct http_conn *c)
{
    unreserve(c);
    auth_wipe(c);
    buf_free(&c->url);
    buf_free(&c->body);
}
