/*
 * query.c - percent-decoding and query parameters; see query.h.
 */
#include "query.h"

#include <string.h>

#include "hex.h"

long pct_decode(char *dst, const char *src, size_t n, int plus_is_space)
{
    size_t o = 0;
    for (size_t i = 0; i < n; i++, o++) {
        char c = src[i];
        if (c == '%') {
            if (n - i < 3)
                return QUERY_EESCAPE;
            int hi = kvc__hex_digit((unsigned char)src[i + 1]);
            int lo = kvc__hex_digit((unsigned char)src[i + 2]);
            if (hi < 0 || lo < 0)
                return QUERY_EESCAPE;
            c = (char)(hi << 4 | lo);
            if (c == '\0')
                return QUERY_ENUL; /* would cut the value short in every C consumer */
            i += 2;
        } else if (c == '+' && plus_is_space) {
            c = ' ';
        }
        if (dst)
            dst[o] = c;
    }
    return (long)o;
}

/* Decode value v[0..vlen) into p->out, or mark it too long. */
static int take_value(struct query_param *p, const char *v, size_t vlen)
{
    long dlen = pct_decode(NULL, v, vlen, 1);
    if (dlen < 0)
        return (int)dlen;
    p->found = 1;
    p->too_long = (size_t)dlen >= p->cap;
    if (!p->too_long) {
        pct_decode(p->out, v, vlen, 1);
        p->out[dlen] = '\0';
    }
    return 0;
}

/* One "key=value" pair (value may be absent: "key"); first: a name
 * already found keeps its value. */
static int parse_pair(const char *s, size_t n, struct query_param *want, size_t nwant, int first)
{
    const char *eq = memchr(s, '=', n);
    size_t klen = eq ? (size_t)(eq - s) : n;
    const char *v = eq ? eq + 1 : s + n;
    size_t vlen = eq ? n - klen - 1 : 0;
    char key[64];
    long dk = klen < sizeof key ? pct_decode(key, s, klen, 1) : pct_decode(NULL, s, klen, 1);
    if (dk < 0)
        return (int)dk;
    for (size_t i = 0; klen < sizeof key && i < nwant; i++) {
        if (strlen(want[i].name) == (size_t)dk && !memcmp(want[i].name, key, (size_t)dk)) {
            if (first && want[i].found)
                break; /* kept; the value is still checked below */
            return take_value(&want[i], v, vlen);
        }
    }
    long dv = pct_decode(NULL, v, vlen, 1);
    return dv < 0 ? (int)dv : 0;
}

static int parse_all(const char *q, size_t qlen, struct query_param *want, size_t nwant, int first)
{
    for (size_t i = 0; i < nwant; i++)
        want[i].found = want[i].too_long = 0;
    while (qlen > 0) {
        const char *amp = memchr(q, '&', qlen);
        size_t n = amp ? (size_t)(amp - q) : qlen;
        int rc = n ? parse_pair(q, n, want, nwant, first) : 0;
        if (rc < 0)
            return rc;
        if (!amp)
            break;
        qlen -= n + 1;
        q = amp + 1;
    }
    return 0;
}

int query_parse(const char *q, size_t qlen, struct query_param *want, size_t nwant)
{
    return parse_all(q, qlen, want, nwant, 0);
}

int query_parse_first(const char *q, size_t qlen, struct query_param *want, size_t nwant)
{
    return parse_all(q, qlen, want, nwant, 1);
}

const char *query_error_text(int rc)
{
    return rc == QUERY_ENUL ? "Invalid query string: NUL byte (%00) in a parameter"
                            : "Invalid percent-encoding in query string";
}

int parse_uint(const char *s, uint64_t max, uint64_t *out)
{
    uint64_t v = 0;
    if (!*s)
        return -1;
    for (; *s; s++) {
        if (*s < '0' || *s > '9')
            return -1;
        unsigned d = (unsigned)(*s - '0');
        if (d > max || v > (max - d) / 10)
            return -1;
        v = v * 10 + d;
    }
    *out = v;
    return 0;
}

int parse_rank(const char *s, uint64_t *out)
{
    if (*s == '-') {
        uint64_t v;
        if (parse_uint(s + 1, 0, &v))
            return -1;
        *out = 0;
        return 0;
    }
    return parse_uint(s, INT32_MAX, out);
}
