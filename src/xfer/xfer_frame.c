/*
 * xfer_frame.c - encode and decode the transfer engine's wire frames.
 * Pure: see xfer_frame.h for the layout.
 */
#include "xfer_frame.h"

#include <stdio.h>
#include <string.h>

const char *kvt__ftype_name(uint8_t type)
{
    switch (type) {
    case KVT_F_HELLO: return "HELLO";
    case KVT_F_HELLO_OK: return "HELLO_OK";
    case KVT_F_WRITE: return "WRITE";
    case KVT_F_ACK: return "ACK";
    case KVT_F_NACK: return "NACK";
    case KVT_F_DONE: return "DONE";
    case KVT_F_DONE_ACK: return "DONE_ACK";
    case KVT_F_ABORT: return "ABORT";
    case KVT_F_ERROR: return "ERROR";
    case KVT_F_QP_INFO: return "QP_INFO";
    case KVT_F_READ: return "READ";
    case KVT_F_READ_DATA: return "READ_DATA";
    case KVT_F_READ_NACK: return "READ_NACK";
    case KVT_F_DESC_REQ: return "DESC_REQ";
    case KVT_F_DESC: return "DESC";
    case KVT_F_WRITEV: return "WRITEV";
    case KVT_F_CMA_HELLO: return "CMA_HELLO";
    case KVT_F_CMA_CHECK: return "CMA_CHECK";
    case KVT_F_CMA_WRITE: return "CMA_WRITE";
    case KVT_F_CMA_READ: return "CMA_READ";
    case KVT_F_CMA_READ_GO: return "CMA_READ_GO";
    case KVT_F_CMA_READ_END: return "CMA_READ_END";
    }
    return "unknown";
}

void kvt__frame_encode(const kvt__frame *f, uint8_t out[KVT_HDR_LEN])
{
    kvt__put32(out, KVT_FRAME_MAGIC);
    out[4] = f->type;
    out[5] = f->flags;
    out[6] = 0;
    out[7] = 0;
    kvt__put32(out + 8, f->len);
    kvt__put32(out + 12, (uint32_t)f->status);
    kvt__put64(out + 16, f->seq);
    kvt__put64(out + 24, f->room);
    kvt__put64(out + 32, f->addr);
}

int kvt__frame_decode(const uint8_t in[KVT_HDR_LEN], uint32_t max_write, kvt__frame *f, char *err,
                      size_t cap)
{
    uint32_t magic = kvt__get32(in);
    if (magic != KVT_FRAME_MAGIC) {
        snprintf(err, cap, "bad frame magic 0x%08x (expected 0x%08x): not a kvcoord transfer peer",
                 magic, KVT_FRAME_MAGIC);
        return -1;
    }
    f->type = in[4];
    f->flags = in[5];
    f->len = kvt__get32(in + 8);
    f->status = (int32_t)kvt__get32(in + 12);
    f->seq = kvt__get64(in + 16);
    f->room = kvt__get64(in + 24);
    f->addr = kvt__get64(in + 32);
    if (f->flags || in[6] || in[7]) {
        snprintf(err, cap, "frame %s has reserved bits set", kvt__ftype_name(f->type));
        return -1;
    }
    if (f->type < KVT_F_HELLO || f->type > KVT_F_MAX) {
        snprintf(err, cap, "unknown frame type %u", f->type);
        return -1;
    }
    uint32_t lim = f->type == KVT_F_WRITE || f->type == KVT_F_READ_DATA ? max_write
                   : f->type == KVT_F_DESC                              ? KVT_DESC_FRAME_MAX
                   : f->type == KVT_F_CMA_WRITE                         ? KVT_CMA_CTL_MAX
                                                                        : KVT_CTL_MAX;
    if (f->len > lim) {
        snprintf(err, cap, "frame %s payload of %u bytes exceeds the limit of %u bytes",
                 kvt__ftype_name(f->type), f->len, lim);
        return -1;
    }
    return 0;
}

static size_t put_str(uint8_t *p, const char *s, size_t n)
{
    p[0] = (uint8_t)n;
    p[1] = (uint8_t)(n >> 8);
    memcpy(p + 2, s, n);
    return n + 2;
}

size_t kvt__hello_encode(const kvt__hello *h, uint8_t *buf, size_t cap)
{
    size_t ls = strnlen(h->session_id, sizeof h->session_id);
    size_t lt = strnlen(h->token, sizeof h->token);
    size_t need = 16 + 2 + ls + 2 + lt;
    if (ls > KVT_HELLO_STR_MAX || lt > KVT_HELLO_STR_MAX || need > cap)
        return 0;
    kvt__put32(buf, h->version);
    kvt__put32(buf + 4, h->flags);
    kvt__put64(buf + 8, h->generation);
    size_t off = 16;
    off += put_str(buf + off, h->session_id, ls);
    off += put_str(buf + off, h->token, lt);
    return off;
}

/* Read a u16-length-prefixed string at *off into dst (KVT_HELLO_STR_MAX+1). */
static int get_str(const uint8_t *buf, size_t len, size_t *off, char *dst)
{
    if (len - *off < 2)
        return -1;
    size_t n = (size_t)buf[*off] | ((size_t)buf[*off + 1] << 8);
    *off += 2;
    if (n > KVT_HELLO_STR_MAX || len - *off < n || memchr(buf + *off, 0, n))
        return -1;
    memcpy(dst, buf + *off, n);
    dst[n] = '\0';
    *off += n;
    return 0;
}

int kvt__hello_decode(const uint8_t *buf, size_t len, kvt__hello *h, char *err, size_t cap)
{
    memset(h, 0, sizeof *h);
    if (len < 4) {
        snprintf(err, cap, "HELLO of %zu bytes is too short", len);
        return -1;
    }
    h->version = kvt__get32(buf);
    if (len < 16) {
        snprintf(err, cap, "HELLO of %zu bytes is too short", len);
        return -1;
    }
    h->flags = kvt__get32(buf + 4);
    h->generation = kvt__get64(buf + 8);
    size_t off = 16;
    if (get_str(buf, len, &off, h->session_id) || get_str(buf, len, &off, h->token) || off != len) {
        snprintf(err, cap, "malformed HELLO payload (%zu bytes)", len);
        return -1;
    }
    return 0;
}

int kvt__token_equal(const char want[KVT_HELLO_STR_MAX + 1], const char got[KVT_HELLO_STR_MAX + 1])
{
    /* volatile: keep the compiler from ending the loop at the first
     * difference. */
    volatile unsigned char d = 0;
    for (size_t i = 0; i < KVT_HELLO_STR_MAX + 1; i++)
        d |= (unsigned char)(want[i] ^ got[i]);
    return d == 0;
}

int kvt__read_decode(const uint8_t *buf, size_t len, uint64_t max_len, uint64_t max_total,
                     kvt__read_ent *ent, uint64_t *total, char *err, size_t cap)
{
    *total = 0;
    if (!len || len % KVT_READ_ENT_LEN || len / KVT_READ_ENT_LEN > KVT_READ_ENTS_MAX) {
        snprintf(err, cap, "READ payload of %zu bytes is not 1..%u entries of %u bytes", len,
                 KVT_READ_ENTS_MAX, KVT_READ_ENT_LEN);
        return -1;
    }
    int n = (int)(len / KVT_READ_ENT_LEN);
    for (int i = 0; i < n; i++) {
        ent[i].addr = kvt__get64(buf + (size_t)i * KVT_READ_ENT_LEN);
        ent[i].len = kvt__get64(buf + (size_t)i * KVT_READ_ENT_LEN + 8);
        if (!ent[i].len || ent[i].len > max_len || ent[i].addr + ent[i].len < ent[i].addr) {
            snprintf(err, cap, "READ entry %d: length %llu at 0x%llx out of 1..%llu or wrapping", i,
                     (unsigned long long)ent[i].len, (unsigned long long)ent[i].addr,
                     (unsigned long long)max_len);
            return -1;
        }
        *total += ent[i].len;
        if (*total > max_total) {
            snprintf(err, cap, "READ of more than %llu bytes in one request",
                     (unsigned long long)max_total);
            return -1;
        }
    }
    return n;
}
