/*
 * xfer_fetch.c - kvt_descriptor_fetch: a peer's descriptor straight from
 * its listener (P2P handshake, no metadata server).  Blocking, with one
 * deadline for the whole exchange; needs no engine and touches no global
 * state, so any thread may call it.  The server side is kvt__desc_serve
 * (xfer_read.c).
 */
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "xfer_internal.h"

/* Milliseconds left until end (ns), at least 0. */
static int left_ms(uint64_t end)
{
    uint64_t now = kvc__mono_ns();
    return now >= end ? 0 : (int)((end - now + 999999ull) / 1000000ull);
}

/* Wait for ev on fd until end: 0, or a kvc_err set with the reason. */
static kvc_err wait_fd(int fd, short ev, uint64_t end, const char *sid, int timeout_ms,
                       const char *what)
{
    for (;;) {
        struct pollfd pf = {fd, ev, 0};
        int ms = left_ms(end);
        int r = ms ? poll(&pf, 1, ms) : 0;
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            return kvt__fail(KVC_E_SYS, "descriptor fetch from %s: poll: %s", sid, strerror(errno));
        if (r == 0)
            return kvt__fail(KVC_E_TIMEDOUT, "descriptor fetch from %s: no %s within %d ms", sid,
                             what, timeout_ms);
        return KVC_OK;
    }
}

static kvc_err recv_all(int fd, void *buf, size_t n, uint64_t end, const char *sid, int timeout_ms,
                        size_t *got_total)
{
    uint8_t *p = buf;
    while (n) {
        kvc_err err = wait_fd(fd, POLLIN, end, sid, timeout_ms, "answer");
        if (err)
            return err;
        ssize_t k = recv(fd, p, n, MSG_DONTWAIT);
        if (k < 0 && (errno == EINTR || errno == EAGAIN))
            continue;
        if (k < 0)
            return kvt__fail(KVC_E_SYS, "descriptor fetch from %s: recv: %s", sid, strerror(errno));
        if (k == 0)
            return kvt__fail(KVC_E_SYS,
                             "descriptor fetch from %s: connection closed by peer after %zu "
                             "bytes of its answer",
                             sid, *got_total);
        p += k;
        n -= (size_t)k;
        *got_total += (size_t)k;
    }
    return KVC_OK;
}

static kvc_err send_all(int fd, const uint8_t *p, size_t n, uint64_t end, const char *sid,
                        int timeout_ms)
{
    while (n) {
        kvc_err err = wait_fd(fd, POLLOUT, end, sid, timeout_ms, "room to send the request");
        if (err)
            return err;
        ssize_t k = send(fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (k < 0 && (errno == EINTR || errno == EAGAIN))
            continue;
        if (k < 0)
            return kvt__fail(KVC_E_SYS, "descriptor fetch from %s: send: %s", sid, strerror(errno));
        p += k;
        n -= (size_t)k;
    }
    return KVC_OK;
}

static kvc_err connect_to(const char *sid, uint64_t end, int timeout_ms, int *out)
{
    struct sockaddr_storage sa;
    socklen_t len;
    kvc_err err = kvt__resolve(sid, 0, &sa, &len);
    if (err)
        return err;
    int fd = socket(sa.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0)
        return kvt__fail(KVC_E_SYS, "socket: %s", strerror(errno));
    if (connect(fd, (struct sockaddr *)&sa, len) && errno != EINPROGRESS) {
        int er = errno;
        close(fd);
        return kvt__fail(KVC_E_SYS, "connect to %s: %s", sid, strerror(er));
    }
    err = wait_fd(fd, POLLOUT, end, sid, timeout_ms, "connection");
    int soerr = 0;
    socklen_t sl = sizeof soerr;
    if (!err && getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl))
        soerr = errno;
    if (!err && soerr)
        err = kvt__fail(KVC_E_SYS, "connect to %s: %s", sid, strerror(soerr));
    if (err) {
        close(fd);
        return err;
    }
    *out = fd;
    return KVC_OK;
}

/* The exchange on a connected socket. */
static kvc_err exchange(int fd, const char *sid, const char *token, uint64_t end, int timeout_ms,
                        char **json_out)
{
    kvt__hello h;
    memset(&h, 0, sizeof h);
    h.version = KVT_PROTOCOL_VERSION;
    if (token)
        kvt__str(h.token, sizeof h.token, "%s", token);
    uint8_t req[KVT_HDR_LEN + 16 + 4 + 2 * KVT_HELLO_STR_MAX];
    size_t plen = kvt__hello_encode(&h, req + KVT_HDR_LEN, sizeof req - KVT_HDR_LEN);
    kvt__frame f = {.type = KVT_F_DESC_REQ, .len = (uint32_t)plen};
    kvt__frame_encode(&f, req);
    kvc_err err = send_all(fd, req, KVT_HDR_LEN + plen, end, sid, timeout_ms);
    if (err)
        return err;
    uint8_t hdr[KVT_HDR_LEN];
    size_t got = 0;
    err = recv_all(fd, hdr, sizeof hdr, end, sid, timeout_ms, &got);
    if (err)
        return err;
    char why[200];
    if (kvt__frame_decode(hdr, 0, &f, why, sizeof why)) {
        if (kvt__get32(hdr) == KVT_FRAME_MAGIC && hdr[4] == KVT_F_DESC)
            return kvt__fail(KVC_E_TOOBIG,
                             "descriptor fetch from %s: the answer announces %u bytes, more than "
                             "%u",
                             sid, kvt__get32(hdr + 8), KVT_DESC_FRAME_MAX);
        return kvt__fail(KVC_E_INVAL, "descriptor fetch from %s: bad answer: %s", sid, why);
    }
    if (f.type != KVT_F_DESC && f.type != KVT_F_ERROR)
        return kvt__fail(KVC_E_INVAL, "descriptor fetch from %s: unexpected answer frame %s", sid,
                         kvt__ftype_name(f.type));
    char *s = malloc((size_t)f.len + 1);
    if (!s)
        return kvt__fail(KVC_E_SYS, "out of memory for a descriptor of %u bytes", f.len);
    err = recv_all(fd, s, f.len, end, sid, timeout_ms, &got);
    if (err) {
        free(s);
        return err;
    }
    s[f.len] = '\0';
    if (f.type == KVT_F_ERROR) {
        kvc_err code = f.status == EPROTONOSUPPORT ? KVC_E_VERSION : KVC_E_PEER;
        err = kvt__fail(code, "descriptor fetch from %s refused by the peer: %.*s", sid,
                        (int)strnlen(s, f.len), s);
        free(s);
        return err;
    }
    json_error_t je;
    json_t *o = json_loadb(s, f.len, 0, &je);
    bool ok = json_is_object(o) && json_is_string(json_object_get(o, "session_id"));
    json_decref(o);
    if (!ok) {
        free(s);
        return kvt__fail(KVC_E_INVAL,
                         "descriptor fetch from %s: the answer is not a descriptor (a JSON object "
                         "with a session_id)",
                         sid);
    }
    *json_out = s;
    return KVC_OK;
}

KVT_API kvc_err kvt_descriptor_fetch(const char *session_id, const char *token, int timeout_ms,
                                     char **json_out)
{
    KVT_ARG(session_id);
    KVT_ARG(json_out);
    *json_out = NULL;
    if (timeout_ms <= 0)
        return kvt__fail(KVC_E_INVAL, "kvt_descriptor_fetch: timeout_ms %d must be > 0",
                         timeout_ms);
    if (token && (!token[0] || strlen(token) > KVT_HELLO_STR_MAX))
        return kvt__fail(KVC_E_INVAL, "kvt_descriptor_fetch: token empty or longer than %u bytes",
                         KVT_HELLO_STR_MAX);
    uint64_t end = kvc__mono_ns() + (uint64_t)timeout_ms * 1000000ull;
    int fd = -1;
    kvc_err err = connect_to(session_id, end, timeout_ms, &fd);
    if (err)
        return err;
    err = exchange(fd, session_id, token, end, timeout_ms, json_out);
    close(fd);
    return err;
}
