/*
 * http_resp.h - writing HTTP/1.1 responses into a connection's output
 * buffer, in one contiguous piece per response (no writev, no per-request
 * allocation once the buffer has grown).
 *
 * Every response carries Content-Length and Date; "Connection: close" when
 * req->keep_alive is 0, "Connection: keep-alive" for a kept-alive HTTP/1.0
 * client.  A HEAD request gets the headers of the GET answer and no body.
 */
#ifndef KVC_HTTP_RESP_H
#define KVC_HTTP_RESP_H

#include <stddef.h>

#include "buf.h"
#include "http_req.h"

#define CT_TEXT "text/plain; charset=utf-8"
#define CT_JSON "application/json"

/* Reason phrase of a status code ("Unknown" for codes not used here). */
const char *http_reason(int status);

/* Status line and headers for a body of clen bytes; the caller appends the
 * body itself when resp_has_body(req).  extra: NULL, or more header lines,
 * each ending in "\r\n". */
void resp_head(struct buf *out, const struct http_req *req, int status, const char *ctype,
               size_t clen, const char *extra);

/* Whether the response to req carries its body (not for HEAD). */
int resp_has_body(const struct http_req *req);

/* A whole response with body[0..len). */
void resp_send(struct buf *out, const struct http_req *req, int status, const char *ctype,
               const char *body, size_t len, const char *extra);

/* 200 text/plain "OK". */
void resp_ok(struct buf *out, const struct http_req *req);

/* An error answer {"detail":"<detail, JSON-escaped>"} as application/json. */
void resp_detail(struct buf *out, const struct http_req *req, int status, const char *detail,
                 const char *extra);

/* The interim "HTTP/1.1 100 Continue" answer to Expect: 100-continue. */
void resp_continue(struct buf *out);

/* JSON string escaping of s[0..n) without the quotes: '"', '\\' and control
 * characters are escaped, valid UTF-8 is copied, as Python's
 * json.dumps(ensure_ascii=False) does, and each byte that is not part of
 * valid UTF-8 becomes \ufffd, so the result is always valid UTF-8 JSON.
 * json_escape_len() gives the escaped length; json_escape() writes it at
 * dst and returns the end. */
size_t json_escape_len(const char *s, size_t n);
char *json_escape(char *dst, const char *s, size_t n);

/* Append s[0..n) JSON-escaped (without quotes) to b. */
void json_escape_append(struct buf *b, const char *s, size_t n);

#endif /* KVC_HTTP_RESP_H */
