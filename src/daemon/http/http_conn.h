/*
 * http_conn.h - the HTTP/1.1 side of one connection: feeds received bytes
 * to http-parser, collects the request (target, framing headers, body) and
 * enforces the protocol limits.  No I/O here: http_server.c owns the socket
 * and the ring, and calls hconn_parse() with what it received.
 *
 * hconn_parse() stops after each complete request (so pipelined requests
 * are answered one at a time, in order) and at each event the server must
 * act on before more bytes are parsed:
 *   - Expect: 100-continue     -> HCONN_CONTINUE (send "100 Continue" now)
 *   - a protocol error         -> HCONN_ERROR (answer err_status, then close):
 *       400 malformed request, raw non-HTTP bytes, CL+TE, duplicate or
 *           differing Content-Length (http-parser), duplicate
 *           Transfer-Encoding, whitespace before a header's colon, bad
 *           percent-escape in the path, HTTP version other than 1.x, an
 *           HTTP/1.1 request without Host or with more than one (RFC 9112
 *           3.2), a header line folded onto the next (obs-fold, RFC 9112
 *           5.2), a CR not followed by LF in the head or the trailers, a
 *           chunked body's framing other than RFC 9112 7.1's (a chunk's
 *           data not followed by CRLF, a chunk-size line not ended by
 *           CRLF, a control byte in a chunk extension)
 *       414 request line over max_head bytes (no header field begun)
 *       431 request line + headers over max_head bytes
 *       401 (or another status) from head_check: refused from the headers,
 *           before the body's size is looked at
 *       413 body over max_body bytes (declared or received)
 *       503 body over what is left of the daemon-wide budget (max_buffered)
 *       417 an Expect other than 100-continue
 *       501 a Transfer-Encoding other than chunked
 * Memory stays bounded whatever arrives: only the URL (bounded by
 * max_head), three short header values and the body (bounded by max_body)
 * are kept.  The Authorization value (kept for the routes' token check)
 * is wiped by hconn_done() and hconn_free().
 */
#ifndef KVC_HTTP_CONN_H
#define KVC_HTTP_CONN_H

#include <http_parser.h>
#include <stddef.h>
#include <stdint.h>

#include "auth.h"
#include "buf.h"
#include "http_req.h"

struct http_limits {
    size_t max_head; /* request line + header bytes; at most http-parser's own
                        HTTP_MAX_HEADER_SIZE (80 KiB) takes effect */
    size_t max_body; /* body bytes */
    /* Daemon-wide budget of body bytes (0: none): every connection sharing
     * these limits reserves its body in *buffered before buffering it - the
     * declared Content-Length at the end of the head, each chunk's size
     * before the chunk - and gives it back when the request is done.  A
     * body that does not fit is refused with 503 before a byte of it is
     * kept.  One thread only (the loop). */
    size_t max_buffered;
    size_t *buffered;
    /* Of max_buffered, what requests of unauthenticated peers may hold
     * together (0: no such share): a token is configured and the request
     * does not carry it (head_check said HEAD_UNTRUSTED).  The rest is
     * kept for authenticated ones, so bodies trickled by peers without the
     * token cannot take the budget a registration needs.  *untrusted
     * counts what they hold. */
    size_t max_untrusted;
    size_t *untrusted;
    /* Called at the end of a head announcing a body, with req's method,
     * path, query and Authorization set: a return of 100 or more (an HTTP
     * status, 401) refuses the request before its body is read;
     * HEAD_UNTRUSTED lets it in as an unauthenticated peer's; 0 lets it in
     * (NULL: none). */
    int (*head_check)(void *arg, const struct http_req *req);
    void *head_arg;
};

#define HEAD_UNTRUSTED 1

enum hconn_event {
    HCONN_MORE = 0, /* every byte consumed; no complete request yet */
    HCONN_REQUEST,  /* conn->req holds a complete request */
    HCONN_CONTINUE, /* Expect: 100-continue accepted: send 100, keep parsing */
    HCONN_ERROR     /* answer err_status/err_detail with Connection: close */
};

enum hconn_phase {
    HCONN_IDLE = 0, /* between requests: no byte of the next one yet */
    HCONN_HEAD,     /* inside a request line or headers */
    HCONN_BODY      /* headers done, body arriving */
};

struct http_conn {
    http_parser parser;
    const struct http_limits *lim;
    struct buf url;  /* request target as received */
    struct buf body; /* de-chunked body */
    struct http_req req;
    enum hconn_phase phase;
    enum hconn_event event; /* set by the callback that paused the parser */
    size_t head_bytes;
    int err_status;
    const char *err_detail;
    const char *err_extra;   /* extra header lines of the error answer, or NULL */
    size_t reserved;         /* body bytes reserved in *lim->buffered */
    size_t *peer_bytes;      /* its peer's reserved body bytes (set by the server
                                after hconn_init; NULL: its peer has no share) */
    size_t peer_max;         /* ... the most they may be */
    unsigned char untrusted; /* the request being read is an unauthenticated
                                peer's (HEAD_UNTRUSTED): its body reserves from
                                *lim->untrusted too, and its connection may be
                                closed at the cap while the body trickles */
    unsigned char split;     /* req.path/query set from the URL (decoded once) */
    char err_buf[96];
    /* header being read: name (lower-cased, truncated) and which value we keep */
    char field[24];
    unsigned char field_len;
    unsigned char in_value; /* 1 after the first value byte of the current header */
    unsigned char keep;     /* 0 none, 1 Expect, 2 Transfer-Encoding, 3 Authorization */
    unsigned char te_count;
    unsigned char host_count; /* Host header fields seen (RFC 9112 3.2: exactly one) */
    unsigned char fold_st;    /* where the scan of the head (or trailers) is (http_conn.c) */
    unsigned char line_seen;  /* that scan met the request line's end (414 or 431) */
    unsigned char chunk_st;   /* where the chunked-framing scan of the body is (http_conn.c) */
    uint64_t chunk_left;      /* ... the chunk size read, then its data bytes still due */
    char expect[24];
    unsigned char expect_len;
    char te[32];
    unsigned char te_len;
    /* Authorization: a value longer than the buffer, or a second header,
     * makes the request's authorization_bad (a deny, never a truncation
     * that could match). */
    char auth[AUTH_TOKEN_MAX + 64];
    size_t auth_len;
    unsigned char auth_count, auth_overflow;
};

/* Prepare a connection's HTTP state (lim must outlive it). */
void hconn_init(struct http_conn *c, const struct http_limits *lim);

/* Parse data[0..len); *consumed receives the bytes used (the rest must be
 * passed again, after the event was handled). */
enum hconn_event hconn_parse(struct http_conn *c, const char *data, size_t len, size_t *consumed);

/* The current request has been answered: release what it held (large
 * buffers are freed, small ones kept for the next request). */
void hconn_done(struct http_conn *c);

/* Free everything (the connection is closing). */
void hconn_free(struct http_conn *c);

#endif /* KVC_HTTP_CONN_H */
