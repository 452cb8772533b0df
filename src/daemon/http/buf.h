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
#include <sys/uio.h>

/* An answer body rendered once and sent by every connection that answers
 * it (kvcoordd's answer cache, a helper thread's answer): reference-counted,
 * never written once made.  Its holders are the cache and each output
 * buffer it is queued in (buf_attach), so it is freed when the last of
 * them lets go.  Loop thread only (the event loop makes, queues and drops
 * them; a helper thread's buffer becomes one on the loop). */
struct buf;

struct shared_body {
    unsigned refs;   /* holders */
    unsigned queued; /* of those, output buffers not sent yet */
    size_t len;
    char *data;
};

/* A body of len bytes for the caller to fill (data), one reference
 * (the caller's); NULL when out of memory.  Counted as a rendering. */
struct shared_body *shared_body_new(size_t len);
/* The bytes of b become a shared body (one reference, the caller's); b is
 * left empty, without its allocation.  NULL when out of memory (b kept). */
struct shared_body *shared_body_take(struct buf *b);
void shared_body_unref(struct shared_body *s);

/* Bytes of all shared bodies queued in some output buffer, each counted
 * once however many buffers queue it (loop thread). */
size_t shared_body_queued_bytes(void);
/* Shared bodies made, and times one was queued (read from any thread). */
uint64_t shared_body_renders(void);
uint64_t shared_body_sends(void);

/* A shared body queued in a buffer, after its first `at` bytes. */
struct buf_ref {
    size_t at;
    struct shared_body *body;
};

struct buf {
    char *p;
    size_t len; /* bytes in use */
    size_t cap; /* bytes allocated behind p */
    int oom;    /* an allocation failed since the last buf_reset() */
    int status; /* output buffers: the status of the last answer head written
                   (resp_head: the number as the answer was made, for the
                   metrics); 0 none since buf_reset() or the caller cleared it */
    /* Output buffers only: shared bodies queued between the bytes of p.  The
     * buffer's contents are then p's bytes with each body inserted at its
     * place (buf_total() bytes; buf_iov() lists them). */
    struct buf_ref *refs;
    unsigned nrefs, refs_cap;
    size_t ref_bytes; /* their bytes */
};

/* Make room for extra more bytes; returns a pointer to p + len, or NULL (and
 * sets oom) when memory runs out.  The caller writes there and then adds to
 * len itself (buf_commit). */
char *buf_space(struct buf *b, size_t extra);
void buf_commit(struct buf *b, size_t n);

void buf_append(struct buf *b, const void *data, size_t n);
void buf_puts(struct buf *b, const char *s);
void buf_putu64(struct buf *b, uint64_t v);

/* Queue body s at the end of b (a new reference to it; sets oom when out
 * of memory).  Loop thread only. */
void buf_attach(struct buf *b, struct shared_body *s);

/* The buffer's whole contents: its bytes and the shared bodies queued. */
static inline size_t buf_total(const struct buf *b) { return b->len + b->ref_bytes; }

/* Up to max iovecs listing the contents of b from byte off on (off <
 * buf_total(b)); returns how many. */
unsigned buf_iov(const struct buf *b, size_t off, struct iovec *iov, unsigned max);

/* Copy the shared bodies queued in b into its bytes, where they stand, and
 * let them go: b->p then holds the whole contents (for tests and fuzz
 * targets that read an answer; sets oom when out of memory). */
void buf_flatten(struct buf *b);

/* Empty the buffer (len 0, oom cleared, shared bodies let go); keeps the
 * allocation. */
void buf_reset(struct buf *b);

/* Empty the buffer and free its allocation if larger than keep bytes. */
void buf_trim(struct buf *b, size_t keep);

void buf_free(struct buf *b);

/* Decimal digits of v written at dst (no NUL); returns how many (1..20). */
size_t u64_to_dec(char *dst, uint64_t v);

#endif /* KVC_BUF_H */
