/*
 * buf.h - a growable byte buffer for kvcoordd (request bodies, URLs,
 * responses).
 *
 * Appends never fail loudly: an allocation failure sets the sticky `oom`
 * flag and later appends do nothing, so a caller builds a whole response and
 * checks once (the server then drops the connection).  Buffers are kept
 * across requests so a keep-alive connection does not malloc per request;
 * buf_trim() gives back memory a large request left behind.
 */
#ifndef KVC_BUF_H
#define KVC_BUF_H

#include <stddef.h>
#include <stdint.h>

struct buf {
    char *p;
    size_t len; /* bytes in use */
    size_t cap; /* bytes allocated behind p */
    int oom;    /* an allocation failed since the last buf_reset() */
};

/* Make room for extra more bytes; returns a pointer to p + len, or NULL (and
 * sets oom) when memory runs out.  The caller writes there and then adds to
 * len itself (buf_commit). */
char *buf_space(struct buf *b, size_t extra);
void buf_commit(struct buf *b, size_t n);

void buf_append(struct buf *b, const void *data, size_t n);
void buf_puts(struct buf *b, const char *s);
void buf_putu64(struct buf *b, uint64_t v);

/* Empty the buffer (len 0, oom cleared); keeps the allocation. */
void buf_reset(struct buf *b);

/* Empty the buffer and free its allocation if larger than keep bytes. */
void buf_trim(struct buf *b, size_t keep);

void buf_free(struct buf *b);

/* Decimal digits of v written at dst (no NUL); returns how many (1..20). */
size_t u64_to_dec(char *dst, uint64_t v);

#endif /* KVC_BUF_H */
