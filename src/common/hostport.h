/*
 * hostport.h - "host:port" parsing, the one rule for kvcoordd's --listen
 * (src/daemon/http/net.c) and the transfer engine's listen address and peer
 * session_ids (src/xfer/xfer_net.c).  tests/lib/test_shared_rules.c
 * (test_hostport_same_rule) feeds the same cases to both callers.
 *
 * The rule:
 *   host:port        host is a name or an IPv4 address; it holds no colon.
 *   [v6]:port        an IPv6 literal is always in brackets.  A bare IPv6
 *                    literal ("::1:5000", "fe80::1") is refused: which
 *                    colon starts the port would be a guess.
 *   :port            empty host: every address.  Accepted only where an
 *                    address is listened on (KVC_HOSTPORT_LISTEN); a peer
 *                    to connect to must name a host.  "[]:port" is the
 *                    same as ":port".
 *   port             ASCII decimal digits, 0..65535 (0: the kernel
 *                    picks a free one when listening); no sign, no spaces.
 *   host             at most KVC_HOSTPORT_HOST_MAX bytes, no NUL.
 * No name is resolved here.
 *
 * Header-only (static inline): each unit gets its own hidden copy, so no
 * symbol crosses a library boundary.  Pure, thread-safe.
 */
#ifndef KVC_COMMON_HOSTPORT_H
#define KVC_COMMON_HOSTPORT_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define KVC_HOSTPORT_HOST_MAX 255 /* bytes, without the brackets */
#define KVC_HOSTPORT_LISTEN 1u    /* flag: an empty host (every address) is allowed */

/* Split s into host (without brackets; hostcap bytes, at least
 * KVC_HOSTPORT_HOST_MAX + 1 to take every valid host) and *port.  flags:
 * KVC_HOSTPORT_LISTEN or 0.  Returns NULL on success, else why s is not a
 * valid address (a static string, e.g. "an IPv6 address must be in
 * brackets: [ADDR]:PORT"); host and *port are then unchanged. */
static inline const char *kvc__hostport_split(const char *s, unsigned flags, char *host,
                                              size_t hostcap, uint16_t *port)
{
    if (!s || !*s)
        return "empty address (expected HOST:PORT)";
    const char *h = s, *colon;
    size_t hlen;
    if (s[0] == '[') {
        const char *close = strchr(s, ']');
        if (!close || close[1] != ':')
            return "expected [IPV6]:PORT";
        h = s + 1;
        hlen = (size_t)(close - h);
        colon = close + 1;
    } else {
        colon = strrchr(s, ':');
        if (!colon)
            return "no port (expected HOST:PORT)";
        hlen = (size_t)(colon - s);
        if (memchr(s, ':', hlen))
            return "an IPv6 address must be in brackets: [ADDR]:PORT";
    }
    if (hlen == 0 && !(flags & KVC_HOSTPORT_LISTEN))
        return "empty host (expected HOST:PORT)";
    if (hlen > KVC_HOSTPORT_HOST_MAX || hlen >= hostcap)
        return "host too long";
    const char *p = colon + 1;
    uint32_t v = 0;
    size_t digits = 0;
    for (; *p; p++, digits++) {
        if (*p < '0' || *p > '9')
            return "bad port (expected 0..65535)";
        v = v * 10 + (uint32_t)(*p - '0');
        if (v > 65535)
            return "bad port (expected 0..65535)";
    }
    if (!digits)
        return "bad port (expected 0..65535)";
    memcpy(host, h, hlen);
    host[hlen] = '\0';
    *port = (uint16_t)v;
    return NULL;
}

#endif /* KVC_COMMON_HOSTPORT_H */
