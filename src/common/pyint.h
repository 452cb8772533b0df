/*
 * pyint.h - the one integer rule of the PD bootstrap routes and the PD
 * Python API: what Python's int() makes of a value, as sglang's bootstrap
 * server (CommonKVBootstrapServer, aiohttp) applies it to query parameters
 * and JSON body values (sglang python/sglang/srt/disaggregation/common/
 * conn.py at commit 0094505da741, read for this rule).
 *
 * Text (a query parameter, a JSON string, a Python str), as int(str) in
 * Python 3.11 (Unicode 14.0):
 *   - surrounding whitespace is ignored: ASCII \t\n\v\f\r and space, and
 *     the non-ASCII characters of str.isspace() (U+0085, U+00A0, U+1680,
 *     U+2000..U+200A, U+2028, U+2029, U+202F, U+205F, U+3000) - not
 *     U+001C..U+001F, which isspace() counts but int() refuses;
 *   - then an optional sign '+' or '-', directly followed by
 *   - decimal digits of any script (Unicode category Nd: '0'..'9',
 *     Arabic-Indic, fullwidth, ...), leading zeros allowed ("007" is 7),
 *     single underscores allowed between two digits ("1_000");
 *   - at most 4,300 digits (Python's int_max_str_digits); nothing else
 *     (no NUL, no inner space, no "0x", no fraction).
 * A JSON real (or a Python float) is truncated toward zero, as int(1.9) is
 * 1; NaN is invalid; JSON true/false are 1/0 (int(True)).
 *
 * Python's ints are unbounded; kvcoord keeps int64: a valid integer
 * outside -2^63..2^63-1 is KVC_PYINT_RANGE (each caller says what that
 * means: 400 naming the range for a value to store, "not found" for a key
 * to look up).
 *
 * Header-only (static inline): no symbol crosses a library boundary.
 * Thread-safe, no allocation, never prints.
 */
#ifndef KVC_PYINT_H
#define KVC_PYINT_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#define KVC_PYINT_OK 0
#define KVC_PYINT_INVALID (-1) /* not an integer by int()'s rule */
#define KVC_PYINT_RANGE (-2)   /* an integer outside int64 */

/* Python's int_max_str_digits (3.11): longer digit strings are refused. */
#define KVC_PYINT_MAX_DIGITS 4300

/* The first code point (digit zero) of every run of ten Unicode 14.0
 * decimal digits (category Nd), ascending; generated from Python 3.11's
 * unicodedata (every Nd character is in one such run). */
static const uint32_t kvc__pyint_zeros[] = {
    0x30,    0x660,   0x6F0,   0x7C0,   0x966,   0x9E6,   0xA66,   0xAE6,   0xB66,   0xBE6,
    0xC66,   0xCE6,   0xD66,   0xDE6,   0xE50,   0xED0,   0xF20,   0x1040,  0x1090,  0x17E0,
    0x1810,  0x1946,  0x19D0,  0x1A80,  0x1A90,  0x1B50,  0x1BB0,  0x1C40,  0x1C50,  0xA620,
    0xA8D0,  0xA900,  0xA9D0,  0xA9F0,  0xAA50,  0xABF0,  0xFF10,  0x104A0, 0x10D30, 0x11066,
    0x110F0, 0x11136, 0x111D0, 0x112F0, 0x11450, 0x114D0, 0x11650, 0x116C0, 0x11730, 0x118E0,
    0x11950, 0x11C50, 0x11D50, 0x11DA0, 0x16A60, 0x16AC0, 0x16B50, 0x1D7CE, 0x1D7D8, 0x1D7E2,
    0x1D7EC, 0x1D7F6, 0x1E140, 0x1E2F0, 0x1E950, 0x1FBF0};

/* The value 0..9 of decimal digit c, or -1. */
static inline int kvc__pyint_digit(uint32_t c)
{
    if (c - 0x30u < 10u)
        return (int)(c - 0x30u);
    size_t lo = 0, hi = sizeof kvc__pyint_zeros / sizeof *kvc__pyint_zeros;
    while (lo < hi) { /* the last zero <= c */
        size_t mid = (lo + hi) / 2;
        if (kvc__pyint_zeros[mid] <= c)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo && c - kvc__pyint_zeros[lo - 1] < 10u ? (int)(c - kvc__pyint_zeros[lo - 1]) : -1;
}

static inline int kvc__pyint_space(uint32_t c)
{
    return (c >= 0x9 && c <= 0xD) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
           c == 0x205F || c == 0x3000;
}

/* Decode one UTF-8 code point at s[*i..len) (strict: no overlongs, no
 * surrogates, at most U+10FFFF); advances *i.  Returns it, or UINT32_MAX
 * for invalid bytes. */
static inline uint32_t kvc__pyint_utf8(const unsigned char *s, size_t len, size_t *i)
{
    unsigned char b = s[*i];
    uint32_t c, min;
    size_t n;
    if (b < 0x80) {
        (*i)++;
        return b;
    }
    if (b >= 0xC2 && b <= 0xDF)
        n = 1, c = b & 0x1Fu, min = 0x80;
    else if (b >= 0xE0 && b <= 0xEF)
        n = 2, c = b & 0x0Fu, min = 0x800;
    else if (b >= 0xF0 && b <= 0xF4)
        n = 3, c = b & 0x07u, min = 0x10000;
    else
        return UINT32_MAX;
    if (len - *i <= n)
        return UINT32_MAX;
    for (size_t k = 1; k <= n; k++) {
        if ((s[*i + k] & 0xC0) != 0x80)
            return UINT32_MAX;
        c = c << 6 | (s[*i + k] & 0x3Fu);
    }
    if (c < min || c > 0x10FFFF || (c >= 0xD800 && c <= 0xDFFF))
        return UINT32_MAX;
    *i += n + 1;
    return c;
}

/* int(text) for the len bytes of UTF-8 at s (which need not end in NUL).
 * Returns KVC_PYINT_OK with *out set, KVC_PYINT_RANGE (*out = INT64_MIN or
 * INT64_MAX by sign) or KVC_PYINT_INVALID. */
static inline int kvc_pyint_text(const char *text, size_t len, int64_t *out)
{
    const unsigned char *s = (const unsigned char *)text;
    size_t i = 0, digits = 0;
    uint32_t c = 0;
    int neg = 0, range = 0, prev_digit = 0, done = 0;
    uint64_t mag = 0; /* magnitude, up to 2^63 */
    while (i < len) {
        size_t at = i;
        c = kvc__pyint_utf8(s, len, &i);
        if (c == UINT32_MAX)
            return KVC_PYINT_INVALID;
        if (!kvc__pyint_space(c)) {
            i = at;
            break;
        }
    }
    if (i < len && (s[i] == '+' || s[i] == '-'))
        neg = s[i++] == '-';
    while (i < len) {
        size_t at = i;
        c = kvc__pyint_utf8(s, len, &i);
        if (c == UINT32_MAX)
            return KVC_PYINT_INVALID;
        int d = kvc__pyint_digit(c);
        if (d >= 0) {
            if (done)
                return KVC_PYINT_INVALID;
            if (++digits > KVC_PYINT_MAX_DIGITS)
                return KVC_PYINT_INVALID;
            if (!range && mag > (UINT64_C(1) << 63) / 10)
                range = 1;
            else if (!range && (mag = mag * 10 + (uint64_t)d) > (UINT64_C(1) << 63))
                range = 1;
            prev_digit = 1;
            continue;
        }
        if (c == '_' && !done) {
            /* only between two digits */
            if (!prev_digit || i >= len)
                return KVC_PYINT_INVALID;
            size_t j = i;
            uint32_t nx = kvc__pyint_utf8(s, len, &j);
            if (nx == UINT32_MAX || kvc__pyint_digit(nx) < 0)
                return KVC_PYINT_INVALID;
            prev_digit = 0;
            continue;
        }
        if (kvc__pyint_space(c) && digits) {
            done = 1; /* trailing whitespace only from here */
            continue;
        }
        (void)at;
        return KVC_PYINT_INVALID;
    }
    if (!digits)
        return KVC_PYINT_INVALID;
    if (range || (!neg && mag > (uint64_t)INT64_MAX)) {
        *out = neg ? INT64_MIN : INT64_MAX;
        return KVC_PYINT_RANGE;
    }
    *out = neg ? (int64_t)(0 - mag) : (int64_t)mag; /* 2^63 negated is INT64_MIN */
    return KVC_PYINT_OK;
}

/* int(x) for a float x: truncated toward zero.  Returns KVC_PYINT_OK,
 * KVC_PYINT_RANGE (infinite or outside int64) or KVC_PYINT_INVALID
 * (NaN). */
static inline int kvc_pyint_real(double x, int64_t *out)
{
    if (isnan(x))
        return KVC_PYINT_INVALID;
    /* -2^63 <= x < 2^63 (both bounds are exact doubles; no double lies
     * strictly between -2^63 - 1 and -2^63); the conversion truncates
     * toward zero, as int() does. */
    if (!(x >= -9223372036854775808.0 && x < 9223372036854775808.0)) {
        *out = x < 0 ? INT64_MIN : INT64_MAX;
        return KVC_PYINT_RANGE;
    }
    *out = (int64_t)x;
    return KVC_PYINT_OK;
}

#endif /* KVC_PYINT_H */
