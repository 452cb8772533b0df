/*
 * buf.c - growable byte buffer; see buf.h.
 */
#include "buf.h"

#include <stdlib.h>
#include <string.h>

char *buf_space(struct buf *b, size_t extra)
{
    if (b->oom)
        return NULL;
    if (b->cap - b->len >= extra)
        return b->p + b->len;
    size_t cap = b->cap ? b->cap : 256;
    while (cap - b->len < extra) {
        if (cap > SIZE_MAX / 2) {
            b->oom = 1;
            return NULL;
        }
        cap *= 2;
    }
    char *p = realloc(b->p, cap);
    if (!p) {
        b->oom = 1;
        return NULL;
    }
    b->p = p;
    b->cap = cap;
    return p + b->len;
}

void buf_commit(struct buf *b, size_t n) { b->len += n; }

void buf_append(struct buf *b, const void *data, size_t n)
{
    char *dst = buf_space(b, n);
    if (dst && n) {
        memcpy(dst, data, n);
        b->len += n;
    }
}

void buf_puts(struct buf *b, const char *s) { buf_append(b, s, strlen(s)); }

size_t u64_to_dec(char *dst, uint64_t v)
{
    char tmp[20];
    size_t n = 0;
    do {
        tmp[n++] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    for (size_t i = 0; i < n; i++)
        dst[i] = tmp[n - 1 - i];
    return n;
}

void buf_putu64(struct buf *b, uint64_t v)
{
    char *dst = buf_space(b, 20);
    if (dst)
        b->len += u64_to_dec(dst, v);
}

void buf_reset(struct buf *b)
{
    b->len = 0;
    b->oom = 0;
}

void buf_trim(struct buf *b, size_t keep)
{
    buf_reset(b);
    if (b->cap > keep)
        buf_free(b);
}

void buf_free(struct buf *b)
{
    free(b->p);
    b->p = NULL;
    b->len = b->cap = 0;
    b->oom = 0;
}
