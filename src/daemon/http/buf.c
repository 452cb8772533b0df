/*
 * buf.c - growable byte buffer; see buf.h.
 */
#include "buf.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

/* ---- shared bodies -------------------------------------------------------- */

static size_t queued_bytes; /* loop thread */
static atomic_uint_fast64_t renders, sends;

struct shared_body *shared_body_new(size_t len)
{
    struct shared_body *s = malloc(sizeof *s + (len ? len : 1));
    if (!s)
        return NULL;
    *s = (struct shared_body){.refs = 1, .len = len, .data = (char *)(s + 1)};
    atomic_fetch_add_explicit(&renders, 1, memory_order_relaxed);
    return s;
}

struct shared_body *shared_body_take(struct buf *b)
{
    struct shared_body *s = malloc(sizeof *s);
    if (!s)
        return NULL;
    /* The bytes stay where they are: only their owner changes. */
    *s = (struct shared_body){.refs = 1, .len = b->len, .data = b->p};
    if (!s->data)
        s->data = (char *)(s + 1); /* empty: never read, not freed */
    b->p = NULL;
    b->len = b->cap = 0;
    atomic_fetch_add_explicit(&renders, 1, memory_order_relaxed);
    return s;
}

void shared_body_unref(struct shared_body *s)
{
    if (!s || --s->refs)
        return;
    if (s->data != (char *)(s + 1))
        free(s->data);
    free(s);
}

size_t shared_body_queued_bytes(void) { return queued_bytes; }
uint64_t shared_body_renders(void) { return atomic_load_explicit(&renders, memory_order_relaxed); }
uint64_t shared_body_sends(void) { return atomic_load_explicit(&sends, memory_order_relaxed); }

void buf_attach(struct buf *b, struct shared_body *s)
{
    if (b->oom || !s)
        return;
    if (b->nrefs == b->refs_cap) {
        unsigned cap = b->refs_cap ? b->refs_cap * 2 : 4;
        struct buf_ref *r = realloc(b->refs, cap * sizeof *r);
        if (!r) {
            b->oom = 1;
            return;
        }
        b->refs = r;
        b->refs_cap = cap;
    }
    b->refs[b->nrefs++] = (struct buf_ref){.at = b->len, .body = s};
    b->ref_bytes += s->len;
    s->refs++;
    if (s->queued++ == 0)
        queued_bytes += s->len;
    atomic_fetch_add_explicit(&sends, 1, memory_order_relaxed);
}

/* Let go of the shared bodies queued in b. */
static void release_refs(struct buf *b)
{
    for (unsigned i = 0; i < b->nrefs; i++) {
        struct shared_body *s = b->refs[i].body;
        if (--s->queued == 0)
            queued_bytes -= s->len;
        shared_body_unref(s);
    }
    b->nrefs = 0;
    b->ref_bytes = 0;
}

/* Add piece [p, p + n) of the contents past *off to iov. */
static void iov_piece(const char *p, size_t n, size_t *off, struct iovec *iov, unsigned *k)
{
    if (*off >= n) {
        *off -= n;
        return;
    }
    iov[*k] = (struct iovec){.iov_base = (void *)(p + *off), .iov_len = n - *off};
    (*k)++;
    *off = 0;
}

unsigned buf_iov(const struct buf *b, size_t off, struct iovec *iov, unsigned max)
{
    unsigned k = 0;
    size_t pos = 0;
    for (unsigned i = 0; i <= b->nrefs && k < max; i++) {
        size_t end = i < b->nrefs ? b->refs[i].at : b->len;
        iov_piece(b->p + pos, end - pos, &off, iov, &k);
        pos = end;
        if (i < b->nrefs && k < max)
            iov_piece(b->refs[i].body->data, b->refs[i].body->len, &off, iov, &k);
    }
    return k;
}

void buf_flatten(struct buf *b)
{
    if (!b->nrefs)
        return;
    struct buf flat = {0};
    struct iovec iov[16];
    size_t off = 0, total = buf_total(b);
    while (off < total && !flat.oom) {
        unsigned n = buf_iov(b, off, iov, 16);
        for (unsigned i = 0; i < n; i++) {
            buf_append(&flat, iov[i].iov_base, iov[i].iov_len);
            off += iov[i].iov_len;
        }
    }
    int oom = b->oom || flat.oom;
    buf_free(b);
    *b = flat;
    b->oom = oom;
}

/* ---- bytes ---------------------------------------------------------------- */

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
    if (b->nrefs)
        release_refs(b);
    b->len = 0;
    b->oom = 0;
    b->status = 0;
}

void buf_trim(struct buf *b, size_t keep)
{
    buf_reset(b);
    if (b->cap > keep)
        buf_free(b);
}

void buf_free(struct buf *b)
{
    if (b->nrefs)
        release_refs(b);
    free(b->refs);
    b->refs = NULL;
    b->refs_cap = 0;
    free(b->p);
    b->p = NULL;
    b->len = b->cap = 0;
    b->oom = 0;
}
