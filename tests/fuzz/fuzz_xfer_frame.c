/*
 * fuzz_xfer_frame.c - fuzz target: the transfer engine's wire decoding
 * (src/xfer_frame.c): kvt__frame_decode(), kvt__hello_decode() and
 * kvt__read_decode().
 *
 * The input is a byte stream as a TCP peer would send it.  It is cut into
 * frames the way the receiver's parser (xfer_rx.c, rx_parse) does: a
 * 40-byte header, then its payload (a WRITE's or READ_DATA's payload
 * skipped, a control payload collected up to KVT_CTL_MAX, a DESC's up to
 * KVT_DESC_FRAME_MAX); the first refused header ends the stream, as it
 * ends the connection.  Checked:
 *   - a decoded header re-encodes to the same 40 bytes, and its payload
 *     length respects the limits (KVT_CTL_MAX; max_write for WRITE and
 *     READ_DATA; KVT_DESC_FRAME_MAX for DESC);
 *   - a READ payload (also any control payload tried as one): accepted
 *     entries are 1..KVT_READ_ENTS_MAX, each of length 1..the cap, not
 *     wrapping, their sum the reported total within its cap, and they are
 *     the payload's bytes; a refused one leaves a reason;
 *   - a refused header leaves a NUL-terminated reason;
 *   - a decoded HELLO (also any control payload tried as one) re-encodes to
 *     the same bytes (the reserved flags word aside), its strings
 *     NUL-terminated and at most KVT_HELLO_STR_MAX; a refused one still
 *     reports the version when 4 bytes were there.
 * The first input byte picks max_write (the receiver's limit is
 * configurable), so both sides of that check are reached.
 */
#include <stdint.h>
#include <string.h>

#include "fuzz_common.h"
#include "xfer_frame.h"

#ifndef KVT_F_MAX /* the last frame type, in headers that name it */
#define KVT_F_MAX KVT_F_ERROR
#endif

static void check_hello(const uint8_t *p, size_t len)
{
    kvt__hello h;
    char err[160];
    err[0] = '\0';
    memset(&h, 0xa5, sizeof h);
    if (kvt__hello_decode(p, len, &h, err, sizeof err)) {
        FZ_CHECK(memchr(err, 0, sizeof err) && err[0], "refused HELLO without a reason");
        if (len >= 4)
            FZ_CHECK(h.version == kvt__get32(p), "version not reported on error");
        return;
    }
    size_t ls = strnlen(h.session_id, sizeof h.session_id);
    size_t lt = strnlen(h.token, sizeof h.token);
    FZ_CHECK(ls <= KVT_HELLO_STR_MAX && lt <= KVT_HELLO_STR_MAX, "unterminated string");
    uint8_t again[16 + 2 * (2 + KVT_HELLO_STR_MAX)];
    size_t n = kvt__hello_encode(&h, again, sizeof again);
    FZ_CHECK(n == len, "HELLO of %zu bytes re-encodes to %zu", len, n);
    FZ_CHECK(!memcmp(again, p, 4) && !memcmp(again + 8, p + 8, len - 8),
             "HELLO does not re-encode to the same bytes");
}

static void check_read(const uint8_t *p, size_t len, uint64_t max_len, uint64_t max_total)
{
    kvt__read_ent ent[KVT_READ_ENTS_MAX];
    uint64_t total = 0, sum = 0;
    char err[200];
    err[0] = '\0';
    int n = kvt__read_decode(p, len, max_len, max_total, ent, &total, err, sizeof err);
    if (n < 0) {
        FZ_CHECK(memchr(err, 0, sizeof err) && err[0], "refused READ without a reason");
        return;
    }
    FZ_CHECK(n >= 1 && n <= (int)KVT_READ_ENTS_MAX && (size_t)n * KVT_READ_ENT_LEN == len,
             "READ of %zu bytes gave %d entries", len, n);
    for (int i = 0; i < n; i++) {
        FZ_CHECK(ent[i].len >= 1 && ent[i].len <= max_len, "entry %d length %llu accepted", i,
                 (unsigned long long)ent[i].len);
        FZ_CHECK(ent[i].addr + ent[i].len >= ent[i].addr, "entry %d wraps", i);
        FZ_CHECK(ent[i].addr == kvt__get64(p + (size_t)i * KVT_READ_ENT_LEN) &&
                     ent[i].len == kvt__get64(p + (size_t)i * KVT_READ_ENT_LEN + 8),
                 "entry %d is not the payload's bytes", i);
        sum += ent[i].len;
    }
    FZ_CHECK(sum == total && total <= max_total, "READ total %llu (sum %llu, cap %llu)",
             (unsigned long long)total, (unsigned long long)sum, (unsigned long long)max_total);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    static const uint32_t max_writes[4] = {0, 4096, 1u << 20, UINT32_MAX};
    uint32_t max_write = max_writes[data[0] & 3];
    const uint8_t *p = data + 1;
    size_t left = size - 1;
    while (left >= KVT_HDR_LEN) {
        kvt__frame f;
        char err[160];
        err[0] = '\0';
        if (kvt__frame_decode(p, max_write, &f, err, sizeof err)) {
            FZ_CHECK(memchr(err, 0, sizeof err) && err[0], "refused frame without a reason");
            return 0; /* the receiver closes the connection here */
        }
        uint8_t again[KVT_HDR_LEN];
        kvt__frame_encode(&f, again);
        FZ_CHECK(!memcmp(again, p, KVT_HDR_LEN), "header does not re-encode to the same bytes");
        FZ_CHECK(f.type >= KVT_F_HELLO && f.type <= KVT_F_MAX, "type %u accepted", f.type);
        FZ_CHECK(strcmp(kvt__ftype_name(f.type), "unknown"), "known type without a name");
        uint32_t lim = f.type == KVT_F_WRITE || f.type == KVT_F_READ_DATA ? max_write
                       : f.type == KVT_F_DESC                             ? KVT_DESC_FRAME_MAX
                       : f.type == KVT_F_CMA_WRITE                        ? KVT_CMA_CTL_MAX
                                                                          : KVT_CTL_MAX;
        FZ_CHECK(f.len <= lim, "payload of %u bytes accepted for %s", f.len,
                 kvt__ftype_name(f.type));
        p += KVT_HDR_LEN, left -= KVT_HDR_LEN;
        size_t n = f.len < left ? f.len : left;
        if (f.type != KVT_F_WRITE && f.type != KVT_F_READ_DATA && f.type != KVT_F_DESC) {
            check_hello(p, n); /* a truncated payload too: it must be refused cleanly */
            check_read(p, n, max_write ? max_write : 1, f.addr ? f.addr : UINT64_MAX);
        }
        p += n, left -= n;
    }
    if (left)
        check_hello(p, left);
    return 0;
}
