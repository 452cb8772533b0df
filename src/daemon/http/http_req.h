/*
 * http_req.h - one parsed HTTP request, as http_conn.c hands it to the
 * routes.  Every pointer stays valid until the response to this request has
 * been produced (also while a long-poll keeps it parked).
 */
#ifndef KVC_HTTP_REQ_H
#define KVC_HTTP_REQ_H

#include <stddef.h>

struct http_req {
    int method;       /* enum http_method (http_parser.h) */
    const char *path; /* percent-decoded path, not NUL-terminated: for people
                         (logs, metrics); routes match raw_path */
    size_t path_len;
    /* The path as received (percent-escapes checked, not decoded), not
     * NUL-terminated.  Routes split it at '/' and decode each segment
     * alone (RFC 3986 2.2, 7.3): "%2F" is data inside a segment, never a
     * separator, so /rooms/5%2Ffailure is not /rooms/5/failure.  NULL (a
     * request built by hand, as the fuzz targets do): routes match path. */
    const char *raw_path;
    size_t raw_path_len;
    const char *query; /* raw query string after '?', not decoded */
    size_t query_len;
    const char *body; /* de-chunked body */
    size_t body_len;
    unsigned char http_minor; /* 1.0 or 1.1 (major is always 1) */
    unsigned char keep_alive; /* answer keeps the connection open; 0: close */
    /* The Authorization header's value (NULL: none), not NUL-terminated.
     * Never logged; wiped once the request is answered. */
    const char *authorization;
    size_t authorization_len;
    unsigned char authorization_bad; /* duplicate or oversized header: deny */
    /* The connection's socket (-1: none), open until the answer is
     * produced; for routes that ask who the peer is (http_pd.c). */
    int fd;
};

#endif /* KVC_HTTP_REQ_H */
