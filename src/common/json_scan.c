/*
 * json_scan.c - the strict validating JSON scanner (json_scan.h).
 *
 * One pass, no recursion (an explicit stack of KVC_JSON_MAX_DEPTH frames,
 * 20 bytes each), no allocation.  Runs of string bytes that need no
 * attention (printable ASCII other than '"' and '\\') are skipped eight at
 * a time.
 */
#include "json_scan.h"

#include <limits.h>
#include <stdio.h>
#include <string.h>

#include "hex.h"

#if defined(__GNUC__)
#define LIKELY(x) __builtin_expect(!!(x), 1)
#define UNLIKELY(x) __builtin_expect(!!(x), 0)
#else
#define LIKELY(x) (x)
#define UNLIKELY(x) (x)
#endif

/* A byte that may stand in a string as it is and ends nothing: printable
 * ASCII other than '"' and '\\'. */
static inline int plain(unsigned char c) { return c >= 0x20 && c < 0x80 && c != '"' && c != '\\'; }

/* Whether all 8 bytes at p are plain (SWAR: no byte below 0x20, none with
 * the high bit, none equal to '"' or '\\'). */
static inline int plain8(const unsigned char *p)
{
    uint64_t x, ones = 0x0101010101010101ull, high = 0x8080808080808080ull;
    memcpy(&x, p, 8);
    uint64_t q = x ^ (ones * '"'), b = x ^ (ones * '\\');
    uint64_t bad = ((x - ones * 0x20) & ~x) | x | ((q - ones) & ~q) | ((b - ones) & ~b);
    return !(bad & high);
}

struct frame {
    unsigned char object; /* 1: object, 0: array */
    unsigned char unused;
    short watch; /* the watch whose value this is; -1 the root, -2 none */
};

struct scan {
    const unsigned char *p;
    size_t len;
    size_t pos;
    struct kvc_json_error *err;
    size_t err_off;
    const char *why;
};

static int fail(struct scan *s, size_t off, const char *why)
{
    s->err_off = off;
    s->why = why;
    return -1;
}

/* Four hex digits at p[i..i+4) (i + 4 <= len checked by the caller). */
static long hex4(const unsigned char *p)
{
    long v = 0;
    for (int k = 0; k < 4; k++) {
        int h = kvc__hex_digit(p[k]);
        if (h < 0)
            return -1;
        v = v << 4 | h;
    }
    return v;
}

/* One UTF-8 sequence starting at s->pos (a byte >= 0x80): its length, or
 * -1 after recording the error. */
static int utf8_seq(struct scan *s)
{
    const unsigned char *p = s->p + s->pos;
    size_t left = s->len - s->pos;
    unsigned char c = p[0];
    int n;
    unsigned char lo = 0x80, hi = 0xbf; /* allowed range of the 2nd byte */
    if (c >= 0xc2 && c <= 0xdf)
        n = 2;
    else if (c >= 0xe0 && c <= 0xef) {
        n = 3;
        if (c == 0xe0)
            lo = 0xa0; /* no overlong */
        else if (c == 0xed)
            hi = 0x9f; /* no UTF-16 surrogates */
    } else if (c >= 0xf0 && c <= 0xf4) {
        n = 4;
        if (c == 0xf0)
            lo = 0x90;
        else if (c == 0xf4)
            hi = 0x8f; /* nothing past U+10FFFF */
    } else {
        return fail(s, s->pos, "invalid UTF-8 byte");
    }
    if (left < (size_t)n)
        return fail(s, s->pos, "truncated UTF-8 sequence");
    if (p[1] < lo || p[1] > hi)
        return fail(s, s->pos, "invalid UTF-8 sequence");
    for (int k = 2; k < n; k++)
        if ((p[k] & 0xc0) != 0x80)
            return fail(s, s->pos, "invalid UTF-8 sequence");
    return n;
}

/* A string starting at s->pos (the opening quote).  On return s->pos is
 * past the closing quote; *escaped says whether it held any escape. */
static int scan_string(struct scan *s, int *escaped)
{
    const unsigned char *p = s->p;
    size_t len = s->len, i = s->pos + 1;
    int esc = 0;
    for (;;) {
        while (i + 8 <= len && plain8(p + i))
            i += 8;
        while (i < len && plain(p[i]))
            i++;
        if (UNLIKELY(i >= len))
            return fail(s, len, "unterminated string");
        unsigned char c = p[i];
        if (c == '"') {
            s->pos = i + 1;
            *escaped = esc;
            return 0;
        }
        if (c == '\\') {
            esc = 1;
            if (i + 1 >= len)
                return fail(s, len, "unterminated string");
            unsigned char e = p[i + 1];
            if (e == 'u') {
                if (len - i < 6)
                    return fail(s, len, "unterminated \\u escape");
                long u = hex4(p + i + 2);
                if (u < 0)
                    return fail(s, i, "invalid \\u escape");
                if (u >= 0xdc00 && u <= 0xdfff)
                    return fail(s, i, "lone low surrogate in \\u escape");
                if (u >= 0xd800 && u <= 0xdbff) {
                    long lo = -1;
                    if (len - i >= 12 && p[i + 6] == '\\' && p[i + 7] == 'u')
                        lo = hex4(p + i + 8);
                    if (lo < 0xdc00 || lo > 0xdfff)
                        return fail(s, i, "high surrogate not followed by a low one");
                    i += 12;
                } else {
                    i += 6;
                }
                continue;
            }
            if (e == '"' || e == '\\' || e == '/' || e == 'b' || e == 'f' || e == 'n' || e == 'r' ||
                e == 't') {
                i += 2;
                continue;
            }
            return fail(s, i, "invalid escape");
        }
        if (c < 0x20)
            return fail(s, i, c ? "control character in string" : "NUL byte in string");
        s->pos = i;
        int n = utf8_seq(s);
        if (n < 0)
            return -1;
        i += (size_t)n;
    }
}

static int is_digit(unsigned char c) { return c >= '0' && c <= '9'; }

/* A number at s->pos; *type receives KVC_JSON_INTEGER or KVC_JSON_REAL. */
static int scan_number(struct scan *s, enum kvc_json_type *type)
{
    const unsigned char *p = s->p;
    size_t len = s->len, i = s->pos, start = i;
    int neg = p[i] == '-';
    if (neg)
        i++;
    size_t d0 = i;
    if (i >= len || !is_digit(p[i]))
        return fail(s, i < len ? i : len, "invalid number");
    if (p[i] == '0') {
        i++;
        if (i < len && is_digit(p[i]))
            return fail(s, start, "invalid number (leading zero)");
    } else {
        while (i < len && is_digit(p[i]))
            i++;
    }
    size_t digits = i - d0;
    int real = 0;
    if (i < len && p[i] == '.') {
        i++;
        if (i >= len || !is_digit(p[i]))
            return fail(s, i < len ? i : len, "invalid number (digit expected after '.')");
        while (i < len && is_digit(p[i]))
            i++;
        real = 1;
    }
    if (i < len && (p[i] | 0x20) == 'e') {
        i++;
        if (i < len && (p[i] == '+' || p[i] == '-'))
            i++;
        if (i >= len || !is_digit(p[i]))
            return fail(s, i < len ? i : len, "invalid number (digit expected in exponent)");
        while (i < len && is_digit(p[i]))
            i++;
        real = 1;
    }
    if (!real && digits >= 19) {
        /* 18 digits always fit; compare longer ones with the bounds. */
        static const char umax[] = "18446744073709551615", imin[] = "9223372036854775808";
        const char *bound = neg ? imin : umax;
        size_t blen = neg ? sizeof imin - 1 : sizeof umax - 1;
        if (digits > blen || (digits == blen && memcmp(p + d0, bound, blen) > 0))
            return fail(s, start, "integer out of range (-2^63..2^64-1)");
    }
    *type = real ? KVC_JSON_REAL : KVC_JSON_INTEGER;
    s->pos = i;
    return 0;
}

static void skip_ws(struct scan *s)
{
    const unsigned char *p = s->p;
    size_t i = s->pos, len = s->len;
    while (i < len && (p[i] == ' ' || p[i] == '\n' || p[i] == '\r' || p[i] == '\t'))
        i++;
    s->pos = i;
}

/* Is the key text[start+1 .. end-1) (escaped or not) equal to key? */
static int key_equal(const char *text, size_t start, size_t end, int escaped, const char *key)
{
    size_t klen = strlen(key);
    if (!escaped)
        return end - start - 2 == klen && !memcmp(text + start + 1, key, klen);
    char buf[64];
    long n = kvc__json_string(text, start, end, buf, sizeof buf, NULL);
    return n >= 0 && (size_t)n == klen && !memcmp(buf, key, klen);
}

/* Whether watch w lies (at any depth) under watch anc. */
static int under(const struct kvc_json_watch *watch, int w, int anc)
{
    for (int p = watch[w].parent; p >= 0; p = watch[p].parent)
        if (p == anc)
            return 1;
    return 0;
}

/* A watched member occurs again (a duplicate key): forget what its
 * earlier occurrence recorded below it, so the last one wins whole. */
static void reset_under(struct kvc_json_watch *watch, size_t nwatch, int anc)
{
    for (size_t i = 0; i < nwatch; i++)
        if (under(watch, (int)i, anc))
            watch[i].type = KVC_JSON_NONE, watch[i].seen = 0;
}

static void record(struct kvc_json_watch *watch, struct kvc_json_root *root, int w,
                   enum kvc_json_type type, size_t start, size_t end, size_t members)
{
    if (w >= 0) {
        watch[w].type = type;
        watch[w].start = start;
        watch[w].end = end;
        watch[w].members = members;
    } else if (w == -1 && root) {
        root->type = type;
        root->members = members;
    }
}

static void position(const unsigned char *p, size_t len, size_t off, struct kvc_json_error *err)
{
    unsigned line = 1, col = 1;
    if (off > len)
        off = len;
    for (size_t i = 0; i < off; i++) {
        if (p[i] == '\n')
            line++, col = 1;
        else if ((p[i] & 0xc0) != 0x80)
            col++;
    }
    err->offset = off;
    err->line = line;
    err->column = col;
}

int kvc__json_scan(const char *text, size_t len, struct kvc_json_watch *watch, size_t nwatch,
                   struct kvc_json_root *root, struct kvc_json_error *err)
{
    struct frame stack[KVC_JSON_MAX_DEPTH];
    size_t starts[KVC_JSON_MAX_DEPTH];  /* where each open container began */
    size_t members[KVC_JSON_MAX_DEPTH]; /* its members so far */
    struct scan s = {(const unsigned char *)text, text ? len : 0, 0, err, 0, NULL};
    const unsigned char *p = s.p;
    size_t depth = 0;
    int w = -1; /* the watch the next value fills */
    int rc = -1;
    for (size_t i = 0; i < nwatch; i++)
        watch[i].type = KVC_JSON_NONE, watch[i].members = 0, watch[i].seen = 0;
    if (root)
        root->type = KVC_JSON_NONE, root->members = 0;

    for (;;) {
        /* ---- a value ---- */
        skip_ws(&s);
        if (s.pos >= s.len) {
            fail(&s, s.len, depth || s.len ? "unexpected end of input" : "empty input");
            goto out;
        }
        size_t vstart = s.pos;
        unsigned char c = p[s.pos];
        enum kvc_json_type type;
        if (c == '{' || c == '[') {
            if (depth == KVC_JSON_MAX_DEPTH) {
                fail(&s, s.pos, "nesting too deep (more than 2048 levels)");
                goto out;
            }
            stack[depth].object = c == '{';
            stack[depth].watch = (short)w;
            starts[depth] = s.pos;
            members[depth] = 0;
            depth++;
            s.pos++;
            skip_ws(&s);
            if (s.pos < s.len && p[s.pos] == (c == '{' ? '}' : ']')) {
                s.pos++;
                depth--;
                record(watch, root, stack[depth].watch, c == '{' ? KVC_JSON_OBJECT : KVC_JSON_ARRAY,
                       starts[depth], s.pos, 0);
                goto after_value;
            }
            if (c == '[') {
                w = -2;
                continue;
            }
            goto key;
        } else if (c == '"') {
            int esc;
            if (scan_string(&s, &esc))
                goto out;
            type = KVC_JSON_STRING;
        } else if (c == '-' || is_digit(c)) {
            if (scan_number(&s, &type))
                goto out;
        } else if (c == 't' && s.len - s.pos >= 4 && !memcmp(p + s.pos, "true", 4)) {
            s.pos += 4, type = KVC_JSON_TRUE;
        } else if (c == 'f' && s.len - s.pos >= 5 && !memcmp(p + s.pos, "false", 5)) {
            s.pos += 5, type = KVC_JSON_FALSE;
        } else if (c == 'n' && s.len - s.pos >= 4 && !memcmp(p + s.pos, "null", 4)) {
            s.pos += 4, type = KVC_JSON_NULL;
        } else {
            fail(&s, s.pos, c ? "invalid token (a value expected)" : "NUL byte");
            goto out;
        }
        record(watch, root, w, type, vstart, s.pos, 0);

    after_value:
        /* ---- after a value: ',' or the close of its container ---- */
        for (;;) {
            skip_ws(&s);
            if (depth == 0) {
                if (s.pos != s.len) {
                    fail(&s, s.pos, "end of input expected after the value");
                    goto out;
                }
                rc = 0;
                goto out;
            }
            struct frame *f = &stack[depth - 1];
            members[depth - 1]++;
            if (s.pos >= s.len) {
                fail(&s, s.len, "unexpected end of input");
                goto out;
            }
            c = p[s.pos];
            if (c == ',') {
                s.pos++;
                if (f->object)
                    goto key;
                w = -2;
                break; /* the next element */
            }
            if (c != (f->object ? '}' : ']')) {
                fail(&s, s.pos, f->object ? "',' or '}' expected" : "',' or ']' expected");
                goto out;
            }
            s.pos++;
            depth--;
            record(watch, root, f->watch, f->object ? KVC_JSON_OBJECT : KVC_JSON_ARRAY,
                   starts[depth], s.pos, members[depth]);
        }
        continue;

    key:
        /* ---- a member's key and ':' ---- */
        skip_ws(&s);
        if (s.pos >= s.len || p[s.pos] != '"') {
            fail(&s, s.pos, s.pos >= s.len ? "unexpected end of input" : "string key expected");
            goto out;
        }
        {
            size_t kstart = s.pos;
            int esc;
            if (scan_string(&s, &esc))
                goto out;
            int parent = stack[depth - 1].watch;
            w = -2;
            if (parent != -2)
                for (size_t i = 0; i < nwatch; i++)
                    if (watch[i].parent == parent &&
                        key_equal(text, kstart, s.pos, esc, watch[i].key)) {
                        w = (int)i;
                        break;
                    }
            /* A repeated key: its last occurrence wins whole, whatever the
             * type of its new value, so what an earlier occurrence recorded
             * below it is forgotten now. */
            if (w >= 0) {
                reset_under(watch, nwatch, w);
                if (watch[w].seen < UINT_MAX)
                    watch[w].seen++;
            }
        }
        skip_ws(&s);
        if (s.pos >= s.len || p[s.pos] != ':') {
            fail(&s, s.pos, s.pos >= s.len ? "unexpected end of input" : "':' expected");
            goto out;
        }
        s.pos++;
    }

out:
    if (rc && err) {
        position(p, s.len, s.err_off, err);
        snprintf(err->text, sizeof err->text, "%s", s.why ? s.why : "invalid JSON");
    }
    if (rc) {
        for (size_t i = 0; i < nwatch; i++)
            watch[i].type = KVC_JSON_NONE;
        if (root)
            root->type = KVC_JSON_NONE;
    }
    return rc;
}

/* Append code point u as UTF-8 at out[*n] when it fits below cap - 1. */
static int put_utf8(char *out, size_t cap, size_t *n, unsigned long u)
{
    unsigned char b[4];
    size_t k;
    if (u < 0x80)
        b[0] = (unsigned char)u, k = 1;
    else if (u < 0x800)
        b[0] = (unsigned char)(0xc0 | u >> 6), b[1] = (unsigned char)(0x80 | (u & 0x3f)), k = 2;
    else if (u < 0x10000)
        b[0] = (unsigned char)(0xe0 | u >> 12), b[1] = (unsigned char)(0x80 | (u >> 6 & 0x3f)),
        b[2] = (unsigned char)(0x80 | (u & 0x3f)), k = 3;
    else
        b[0] = (unsigned char)(0xf0 | u >> 18), b[1] = (unsigned char)(0x80 | (u >> 12 & 0x3f)),
        b[2] = (unsigned char)(0x80 | (u >> 6 & 0x3f)), b[3] = (unsigned char)(0x80 | (u & 0x3f)),
        k = 4;
    if (*n + k >= cap)
        return -1;
    memcpy(out + *n, b, k);
    *n += k;
    return 0;
}

long kvc__json_string(const char *text, size_t start, size_t end, char *out, size_t cap,
                      int *has_nul)
{
    const unsigned char *p = (const unsigned char *)text;
    size_t n = 0;
    if (has_nul)
        *has_nul = 0;
    if (!cap || end < start + 2)
        return -1;
    for (size_t i = start + 1; i < end - 1;) {
        unsigned long u;
        if (p[i] != '\\') {
            if (n + 1 >= cap)
                return -1;
            out[n++] = (char)p[i++];
            continue;
        }
        unsigned char e = p[i + 1];
        i += 2;
        switch (e) {
        case 'b': u = '\b'; break;
        case 'f': u = '\f'; break;
        case 'n': u = '\n'; break;
        case 'r': u = '\r'; break;
        case 't': u = '\t'; break;
        case 'u':
            u = (unsigned long)hex4(p + i);
            i += 4;
            if (u >= 0xd800 && u <= 0xdbff) { /* validated: a low one follows */
                unsigned long lo = (unsigned long)hex4(p + i + 2);
                u = 0x10000 + ((u - 0xd800) << 10) + (lo - 0xdc00);
                i += 6;
            }
            break;
        default: u = e; break; /* '"', '\\', '/' */
        }
        if (u == 0 && has_nul)
            *has_nul = 1;
        if (put_utf8(out, cap, &n, u))
            return -1;
    }
    out[n] = '\0';
    return (long)n;
}

void kvc__json_integer(const char *text, size_t start, size_t end, int *negative, uint64_t *value)
{
    uint64_t v = 0;
    size_t i = start;
    int neg = i < end && text[i] == '-';
    if (neg)
        i++;
    for (; i < end; i++)
        v = v * 10 + (uint64_t)(text[i] - '0');
    *negative = neg && v != 0;
    *value = v;
}
