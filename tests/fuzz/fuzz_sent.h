/* fuzz_sent.h - what a connection would send from an output buffer: its own
 * bytes with the shared bodies queued between them (buf.h: answers rendered
 * once and queued by reference), laid out in one buffer, so the fuzzers
 * check the bytes a client receives.  Header-only, for the fuzz targets. */
#ifndef KVC_FUZZ_SENT_H
#define KVC_FUZZ_SENT_H

#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>

#include "buf.h"
#include "fuzz_common.h"

/* The bytes of b from byte `from` on; *n receives their count.  The
 * returned buffer is owned here and valid until the next call. */
static inline const char *fz_sent_bytes(const struct buf *b, size_t from, size_t *n)
{
    static char *flat;
    static size_t cap;
    size_t total = buf_total(b);
    *n = total - from;
    if (*n > cap) {
        free(flat);
        cap = *n;
        flat = malloc(cap);
        FZ_CHECK(flat, "out of memory flattening %zu bytes", cap);
    }
    size_t at = 0;
    while (from + at < total) {
        struct iovec iov[16];
        unsigned k = buf_iov(b, from + at, iov, 16);
        FZ_CHECK(k > 0, "buf_iov listed nothing at %zu of %zu", from + at, total);
        for (unsigned i = 0; i < k; i++) {
            memcpy(flat + at, iov[i].iov_base, iov[i].iov_len);
            at += iov[i].iov_len;
        }
    }
    return flat;
}

#endif /* KVC_FUZZ_SENT_H */
