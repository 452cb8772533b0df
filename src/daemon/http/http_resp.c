/*
 * http_resp.c - response formatting; see http_resp.h.
 */
#include "http_resp.h"
#include "utf8.h"

#include <http_parser.h>
#include <string.h>
#include <time.h>

const char *http_reason(int status)
{
    switch (status) {
    case 100: return "Continue";
    case 200: return "OK";
    case 307: return "Temporary Redirect";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 413: return "Payload Too Large";
    case 414: return "URI Too Long";
    case 417: return "Expectation Failed";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 503: return "Service Unavailable";
    case 507: return "Insufficient Storage";
    default: return "Unknown";
    }
}

/* "Date: Sun, 06 Nov 1994 08:49:37 GMT\r\n", formatted once per second
 * (per thread: the loop and the helper thread both write answers). */
static const char *date_header(void)
{
    static _Thread_local char line[64];
    static _Thread_local time_t cached = -1;
    time_t now = time(NULL);
    if (now != cached) {
        struct tm tm;
        gmtime_r(&now, &tm);
        strftime(line, sizeof line, "Date: %a, %d %b %Y %H:%M:%S GMT\r\n", &tm);
        cached = now;
    }
    return line;
}

static char *put(char *dst, const char *s)
{
    size_t n = strlen(s);
    memcpy(dst, s, n);
    return dst + n;
}

int resp_has_body(const struct http_req *req) { return req->method != HTTP_HEAD; }

void resp_head(struct buf *out, const struct http_req *req, int status, const char *ctype,
               size_t clen, const char *extra)
{
    const char *reason = http_reason(status);
    out->status = status;
    size_t need = 160 + strlen(reason) + strlen(ctype) + (extra ? strlen(extra) : 0);
    char *start = buf_space(out, need);
    if (!start)
        return;
    char *p = put(start, "HTTP/1.1 ");
    p += u64_to_dec(p, (uint64_t)status);
    *p++ = ' ';
    p = put(p, reason);
    p = put(p, "\r\nContent-Type: ");
    p = put(p, ctype);
    p = put(p, "\r\nContent-Length: ");
    p += u64_to_dec(p, clen);
    p = put(p, "\r\n");
    p = put(p, date_header());
    if (!req->keep_alive)
        p = put(p, "Connection: close\r\n");
    else if (req->http_minor == 0)
        p = put(p, "Connection: keep-alive\r\n");
    if (extra)
        p = put(p, extra);
    p = put(p, "\r\n");
    buf_commit(out, (size_t)(p - start));
}

void resp_send(struct buf *out, const struct http_req *req, int status, const char *ctype,
               const char *body, size_t len, const char *extra)
{
    resp_head(out, req, status, ctype, len, extra);
    if (resp_has_body(req))
        buf_append(out, body, len);
}

void resp_ok(struct buf *out, const struct http_req *req)
{
    resp_send(out, req, 200, CT_TEXT, "OK", 2, NULL);
}

void resp_detail(struct buf *out, const struct http_req *req, int status, const char *detail,
                 const char *extra)
{
    static const char pre[] = "{\"detail\":\"", post[] = "\"}";
    size_t dlen = strlen(detail);
    size_t clen = sizeof pre - 1 + json_escape_len(detail, dlen) + sizeof post - 1;
    resp_head(out, req, status, CT_JSON, clen, extra);
    if (!resp_has_body(req))
        return;
    buf_puts(out, pre);
    json_escape_append(out, detail, dlen);
    buf_puts(out, post);
}

void resp_continue(struct buf *out) { buf_puts(out, "HTTP/1.1 100 Continue\r\n\r\n"); }

/* The escape of ASCII byte c inside a JSON string, 0 if none is needed. */
static char short_escape(unsigned char c)
{
    switch (c) {
    case '"': return '"';
    case '\\': return '\\';
    case '\b': return 'b';
    case '\f': return 'f';
    case '\n': return 'n';
    case '\r': return 'r';
    case '\t': return 't';
    default: return 0;
    }
}

/* Bytes that input sequence s[0..seq) takes in a JSON string; seq 0 is one
 * byte that is not UTF-8, written as U+FFFD so every answer is valid UTF-8
 * (jansson's error texts can cut a character in two, for instance). */
static size_t escaped_size(const unsigned char *s, size_t seq)
{
    if (seq == 0)
        return 6; /* \ufffd */
    if (seq > 1)
        return seq;
    return short_escape(s[0]) ? 2 : s[0] < 0x20 ? 6 : 1;
}

size_t json_escape_len(const char *s, size_t n)
{
    const unsigned char *u = (const unsigned char *)s;
    size_t len = 0;
    for (size_t i = 0; i < n;) {
        size_t seq = kvc__utf8_seq(u + i, n - i);
        len += escaped_size(u + i, seq);
        i += seq ? seq : 1;
    }
    return len;
}

char *json_escape(char *dst, const char *s, size_t n)
{
    static const char hex[] = "0123456789abcdef";
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        size_t seq = kvc__utf8_seq(u + i, n - i);
        char esc = seq == 1 ? short_escape(u[i]) : 0;
        if (seq == 0) {
            memcpy(dst, "\\ufffd", 6);
            dst += 6;
        } else if (esc) {
            *dst++ = '\\';
            *dst++ = esc;
        } else if (seq == 1 && u[i] < 0x20) {
            memcpy(dst, "\\u00", 4);
            dst[4] = hex[u[i] >> 4];
            dst[5] = hex[u[i] & 15];
            dst += 6;
        } else {
            memcpy(dst, u + i, seq);
            dst += seq;
        }
        i += seq ? seq : 1;
    }
    return dst;
}

void json_escape_append(struct buf *b, const char *s, size_t n)
{
    char *p = buf_space(b, json_escape_len(s, n));
    if (p)
        buf_commit(b, (size_t)(json_escape(p, s, n) - p));
}
