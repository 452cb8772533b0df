/*
 * query.h - request-target helpers for kvcoordd: percent-decoding and query
 * string parameters (application/x-www-form-urlencoded rules: '&'
 * separates pairs, '+' is a space in the query).
 *
 * Decoding is strict: '%' must be followed by two hex digits, anything else
 * is an error the caller answers with 400 (a lenient decoder would let two
 * parsers disagree about the same request).  A decoded NUL byte (%00) is an
 * error too, in paths, keys and values alike: every consumer of the decoded
 * text is C, where it would silently cut the value short ("rank=1%00junk"
 * read as rank 1).
 */
#ifndef KVC_QUERY_H
#define KVC_QUERY_H

#include <stddef.h>
#include <stdint.h>

/* Errors of pct_decode() and query_parse(). */
#define QUERY_EESCAPE (-1) /* '%' not followed by two hex digits */
#define QUERY_ENUL (-2)    /* %00: a NUL byte once decoded */

/* Decode n bytes of src into dst (which may equal src: decoding never
 * grows; dst NULL only checks).  plus_is_space: '+' becomes ' ' (query
 * strings, not paths).  Returns the decoded length, or QUERY_EESCAPE on a
 * bad escape, QUERY_ENUL on an escape that decodes to NUL (dst is then
 * partly written). */
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
 * Returns 0, or QUERY_EESCAPE / QUERY_ENUL when any pair holds a bad
 * escape / a %00. */
int query_parse(const char *q, size_t qlen, struct query_param *want, size_t nwant);

/* query_parse(), except that the first occurrence of a repeated name wins
 * (aiohttp's request.query.get(), for sglang's PD routes); later ones are
 * still checked for bad escapes. */
int query_parse_first(const char *q, size_t qlen, struct query_param *want, size_t nwant);

/* The 400 detail for a query_parse() error. */
const char *query_error_text(int rc);

/* Parse s as a non-negative decimal integer: one or more ASCII digits and
 * nothing else (no sign, no spaces), at most max.  Returns 0 and sets *out,
 * or -1. */
int parse_uint(const char *s, uint64_t max, uint64_t *out);

/* A rank parameter: parse_uint(s, INT32_MAX, out), and "-0" (a minus sign
 * before digits that are all 0) is 0, as Python's int() and sglang's
 * FastAPI server read it (and as a body's "rank": -0 is read); any other
 * sign is refused.  Returns 0 and sets *out, or -1. */
int parse_rank(const char *s, uint64_t *out);

#endif /* KVC_QUERY_H */
