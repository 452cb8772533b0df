/* xfer_raw.h - a raw client of the transfer engine's wire for the tests
 * that speak it frame by frame (test_xfer_wire.c, test_xfer_cma.c): a
 * loopback connection, one frame sent, one frame read.  Failures end the
 * test (cmocka asserts); include after testutil.h. */
#ifndef KVC_XFER_RAW_H
#define KVC_XFER_RAW_H

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>

#include "xfer_frame.h"
#include "xfer_util.h"

/* A TCP connection to 127.0.0.1:port; a blocking read on it gives up
 * after 10 s (a hang guard: the reads here expect an answer or a close). */
static inline int xu_raw_connect(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    assert_true(fd >= 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    struct timeval tv = {10, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    return fd;
}

/* Send frame f's header (as encoded: f->len may differ from plen, to lie)
 * and plen bytes of payload. */
static inline void xu_raw_send(int fd, const kvt__frame *f, const void *payload, size_t plen)
{
    uint8_t h[KVT_HDR_LEN];
    kvt__frame_encode(f, h);
    assert_int_equal(xu_write_all(fd, h, sizeof h), 0);
    if (plen)
        assert_int_equal(xu_write_all(fd, payload, plen), 0);
}

/* Send a frame of these header fields (len as given, possibly a lie) and
 * plen bytes of payload. */
static inline void xu_raw_frame(int fd, uint8_t type, uint32_t len, uint64_t seq, uint64_t room,
                                uint64_t addr, const void *payload, size_t plen)
{
    kvt__frame f = {.type = type, .len = len, .seq = seq, .room = room, .addr = addr};
    xu_raw_send(fd, &f, payload, plen);
}

/* Send HELLO as session sid, generation gen, protocol version. */
static inline void xu_raw_hello(int fd, uint32_t version, const char *sid, uint64_t gen)
{
    kvt__hello h;
    memset(&h, 0, sizeof h);
    h.version = version;
    h.generation = gen;
    snprintf(h.session_id, sizeof h.session_id, "%s", sid);
    uint8_t b[600];
    size_t n = kvt__hello_encode(&h, b, sizeof b);
    xu_raw_frame(fd, KVT_F_HELLO, (uint32_t)n, 0, 0, 0, b, n);
}

/* Read one frame into *f, its payload NUL-terminated into buf (cap bytes,
 * more than the payload).  0, or -1 on EOF (or nothing for 10 s). */
static inline int xu_raw_read(int fd, kvt__frame *f, char *buf, size_t cap)
{
    uint8_t h[KVT_HDR_LEN];
    char err[160];
    if (xu_read_all(fd, h, sizeof h, 10000))
        return -1;
    assert_int_equal(kvt__frame_decode(h, KVT_FRAME_MAX, f, err, sizeof err), 0);
    assert_true(f->len < cap);
    assert_int_equal(xu_read_all(fd, buf, f->len, 10000), 0);
    buf[f->len] = '\0';
    return 0;
}

#endif
