/*
 * hex.h - the value of one hexadecimal digit, one rule for every place that
 * reads them: percent-escapes in a request target (query.c), \uXXXX in
 * JSON strings (json_scan.c) and chunk sizes (http_conn.c).
 *
 * Header-only (static inline): each unit gets its own hidden copy.  Pure.
 */
#ifndef KVC_COMMON_HEX_H
#define KVC_COMMON_HEX_H

/* 0..15 for '0'..'9', 'a'..'f' and 'A'..'F'; -1 for any other byte. */
static inline int kvc__hex_digit(unsigned char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    c |= 0x20; /* 'A'..'F' (and only they, with 'a'..'f') land on 'a'..'f' */
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    return -1;
}

#endif /* KVC_COMMON_HEX_H */
