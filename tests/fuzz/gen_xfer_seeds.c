/*
 * gen_xfer_seeds.c - writes the seed corpus of fuzz_xfer_frame into DIR
 * (tests/fuzz/xfer_frame/), frames made by the real encoders
 * (kvt__frame_encode, kvt__hello_encode): the exchanges of docs/transfer.md
 * on both sides, plus refused forms (bad magic, reserved bits, unknown type,
 * oversized payload, truncated HELLO).  The first byte of each seed picks
 * the fuzzer's max_write (see fuzz_xfer_frame.c).
 *
 *   build/tests/fuzz_gen_xfer_seeds tests/fuzz/xfer_frame
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "xfer_frame.h"

static uint8_t buf[65536];
static size_t len;

static void start(uint8_t max_write_sel)
{
    len = 0;
    buf[len++] = max_write_sel;
}

static void frame(uint8_t type, uint32_t plen, int32_t status, uint64_t seq, uint64_t room,
                  uint64_t addr, const void *payload)
{
    kvt__frame f = {
        .type = type, .len = plen, .status = status, .seq = seq, .room = room, .addr = addr};
    kvt__frame_encode(&f, buf + len);
    len += KVT_HDR_LEN;
    if (payload) {
        memcpy(buf + len, payload, plen);
        len += plen;
    }
}

static void hello(uint8_t type, uint32_t version, const char *sid, const char *token)
{
    kvt__hello h = {.version = version, .generation = 7};
    snprintf(h.session_id, sizeof h.session_id, "%s", sid);
    snprintf(h.token, sizeof h.token, "%s", token);
    uint8_t p[600];
    size_t n = kvt__hello_encode(&h, p, sizeof p);
    if (!n)
        abort();
    frame(type, (uint32_t)n, 0, 0, 0, 0, p);
}

static void save(const char *dir, const char *name)
{
    char path[512];
    snprintf(path, sizeof path, "%s/seed-%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(buf, 1, len, f) != len || fclose(f)) {
        perror(path);
        exit(1);
    }
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s DIR\n", argv[0]);
        return 2;
    }
    const char *d = argv[1];
    static const char data[256] = "kv pages";
    static const char reason[] = "write 3 outside the registered regions";

    start(2); /* client -> server: a whole room */
    hello(KVT_F_HELLO, 1, "10.0.0.1:16051", "");
    frame(KVT_F_WRITE, 256, 0, 1, 42, 0x7f0000001000, data);
    frame(KVT_F_WRITE, 256, 0, 2, 42, 0x7f0000001100, data);
    frame(KVT_F_DONE, 0, 0, 2, 42, 512, NULL);
    save(d, "client-room");

    start(2); /* reads: client -> server, then the answers */
    {
        uint8_t req[3 * KVT_READ_ENT_LEN];
        for (int i = 0; i < 3; i++) {
            kvt__put64(req + i * KVT_READ_ENT_LEN, 0x7f0000100000ull + (uint64_t)i * 8192);
            kvt__put64(req + i * KVT_READ_ENT_LEN + 8, 64);
        }
        hello(KVT_F_HELLO, 1, "10.0.0.1:16051", "");
        frame(KVT_F_READ, sizeof req, 0, 1, 43, 192, req);
        frame(KVT_F_READ_DATA, 192, 0, 1, 43, 3, data);
        frame(KVT_F_READ_NACK, sizeof reason - 1, 14, 2, 43, 0, reason);
        save(d, "read-exchange");
        start(2); /* a WRITEV of two runs: the table, then their bytes */
        hello(KVT_F_HELLO, 1, "10.0.0.1:16051", "");
        frame(KVT_F_WRITEV, 2 * KVT_READ_ENT_LEN, 0, 1, 44, 128, req);
        memcpy(buf + len, data, 128);
        len += 128;
        frame(KVT_F_DONE, 0, 0, 1, 44, 128, NULL);
        save(d, "writev");
        start(3); /* a READ whose entry wraps, then one of 0 bytes */
        kvt__put64(req, UINT64_MAX - 10);
        kvt__put64(req + 8, 64);
        frame(KVT_F_READ, KVT_READ_ENT_LEN, 0, 1, 43, 64, req);
        kvt__put64(req + 8, 0);
        frame(KVT_F_READ, KVT_READ_ENT_LEN, 0, 2, 43, 0, req);
        save(d, "read-bad-entries");
        start(2); /* descriptor fetch: request, answer */
        hello(KVT_F_DESC_REQ, 1, "", "tok");
        static const char desc[] = "{\"session_id\":\"10.0.0.2:16051\",\"regions\":[]}";
        frame(KVT_F_DESC, sizeof desc - 1, 0, 0, 0, 0, desc);
        save(d, "desc-exchange");
    }

    start(2); /* server -> client */
    hello(KVT_F_HELLO_OK, 1, "[2001:db8::1]:16051", "secret-token");
    frame(KVT_F_ACK, 0, 0, 2, 42, 2, NULL);
    frame(KVT_F_NACK, sizeof reason - 1, 14, 3, 42, 0, reason);
    frame(KVT_F_DONE_ACK, 0, 0, 2, 42, 0, NULL);
    frame(KVT_F_DONE_ACK, sizeof reason - 1, 5, 2, 43, 0, reason);
    save(d, "server-replies");

    start(1);
    hello(KVT_F_HELLO, 1, "h:1", "t");
    frame(KVT_F_ABORT, sizeof reason - 1, 0, 0, 44, 0, reason);
    frame(KVT_F_ERROR, sizeof reason - 1, 71, 0, 0, 0, reason);
    save(d, "abort-error");

    start(0);
    hello(KVT_F_HELLO, 99, "h:1", ""); /* a future protocol version */
    save(d, "hello-version-99");

    start(3); /* a hello whose strings are at their limit */
    char longs[KVT_HELLO_STR_MAX + 1];
    memset(longs, 'x', KVT_HELLO_STR_MAX);
    longs[KVT_HELLO_STR_MAX] = '\0';
    hello(KVT_F_HELLO, 1, longs, longs);
    save(d, "hello-max-strings");

    start(1); /* WRITE over max_write (4096) */
    frame(KVT_F_WRITE, 8192, 0, 1, 1, 0, NULL);
    save(d, "write-too-big");

    start(2); /* control payload over KVT_CTL_MAX */
    frame(KVT_F_NACK, KVT_CTL_MAX + 1, 0, 1, 1, 0, NULL);
    save(d, "ctl-too-big");

    start(2); /* reserved bits, then unknown type */
    frame(KVT_F_ACK, 0, 0, 1, 1, 0, NULL);
    buf[len - KVT_HDR_LEN + 6] = 1;
    save(d, "reserved-bits");
    start(2);
    frame(KVT_F_ACK, 0, 0, 1, 1, 0, NULL);
    buf[len - KVT_HDR_LEN + 4] = 77;
    save(d, "unknown-type");

    start(2); /* HTTP sent to a transfer port */
    static const char http[] = "GET /health HTTP/1.1\r\nHost: x\r\nAccept: */*\r\n\r\n";
    memcpy(buf + len, http, sizeof http - 1);
    len += sizeof http - 1;
    save(d, "http-bytes");

    start(2); /* HELLO whose declared string runs past the payload */
    hello(KVT_F_HELLO, 1, "10.0.0.1:16051", "tok");
    buf[1 + KVT_HDR_LEN + 16] = 200;
    save(d, "hello-overrun");

    start(2); /* truncated mid-payload */
    hello(KVT_F_HELLO, 1, "10.0.0.1:16051", "tok");
    len -= 5;
    save(d, "hello-truncated");
    printf("%s: 12 seeds\n", d);
    return 0;
}
