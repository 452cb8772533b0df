/*
 * utf8.h - what a valid UTF-8 sequence is, one rule for every place that
 * copies text it did not write: kvcoordd's JSON answers (http_resp.c), its
 * log lines (log.c) and its Prometheus labels (metrics.c).  Each copies a
 * valid sequence as it is and replaces what is not (tests/lib/
 * test_shared_rules.c feeds the three the same bytes).
 *
 * Header-only (static inline): each unit gets its own hidden copy.  Pure.
 */
#ifndef KVC_COMMON_UTF8_H
#define KVC_COMMON_UTF8_H

#include <stddef.h>
#include <stdint.h>

/* Length (1..4) of the valid UTF-8 sequence that starts at s[0] within
 * s[0..n), or 0 when it is not one: a byte that cannot start a sequence
 * (0x80..0xc1, 0xf5..0xff), a sequence cut short by n or by a byte that is
 * not a continuation, an overlong form, a surrogate (U+D800..U+DFFF), or a
 * code point above U+10FFFF.  n must be at least 1. */
static inline size_t kvc__utf8_seq(const unsigned char *s, size_t n)
{
    unsigned char c = s[0];
    size_t need;
    uint32_t cp, min;
    if (c < 0x80)
        return 1;
    if (c >= 0xc2 && c <= 0xdf)
        need = 2, cp = c & 0x1fu, min = 0x80;
    else if (c >= 0xe0 && c <= 0xef)
        need = 3, cp = c & 0x0fu, min = 0x800;
    else if (c >= 0xf0 && c <= 0xf4)
        need = 4, cp = c & 0x07u, min = 0x10000;
    else
        return 0;
    if (n < need)
        return 0;
    for (size_t i = 1; i < need; i++) {
        if ((s[i] & 0xc0) != 0x80)
            return 0;
        cp = cp << 6 | (s[i] & 0x3fu);
    }
    if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
        return 0;
    return need;
}

#endif /* KVC_COMMON_UTF8_H */
