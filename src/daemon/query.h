/*
 * query.h - request-target helpers for kvcoordd: percent-decoding and query
 * string parameters (application/x-www-form-urlencoded rules: '&'
 * separates pairs, '+' is a space in the query).
 *
 * Decoding is strict: '%' must be followed by two hex digits, anything else
 * is an error the caller answers with 400 (a lenient decoder would let two
 * parsers disagree about the same request).
 */
#ifndef KVC_QUERY_H
#define KVC_QUERY_H

#include <stddef.h>
#include <stdint.h>

/* Decode n bytes of src into dst (which may equal src: decoding never
 * grows; dst NULL only checks).  plus_is_space: '+' becomes ' ' (query
 * strings, not paths).  Returns the decoded length, or -1 on a bad escape. */
long pct_decode(char *dst, const char *src, size_t n, int plus_is_space);

/* A parameter the caller wants from a query string. */
struct query_param {
    const char *name; /* compared with each decoded key */
    char *out;        /* decoded value, NUL-terminated, when found */
    size_t cap;       /* bytes at out */
    int found;        /* set when the name occurred (the last occurrence wins,
                         as in Starlette) */
    int too_long;     /* the value did not fit in cap - 1 bytes */
};

/* Parse the raw query string q[0..qlen): every key and value is checked
 * for bad escapes, and the values of the wanted names are decoded.
 * Returns 0, or -1 when any pair holds a bad escape. */
int query_parse(const char *q, size_t qlen, struct query_param *want, size_t nwant);

/* Parse s as a non-negative decimal integer: one or more ASCII digits and
 * nothing else (no sign, no spaces), at most max.  Returns 0 and sets *out,
 * or -1. */
int parse_uint(const char *s, uint64_t max, uint64_t *out);

#endif /* KVC_QUERY_H */
