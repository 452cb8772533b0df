/*
 * xfer_net.c - addresses of the transfer engine: "host:port" parsing (the
 * project's one rule, src/common/hostport.h), resolution, session_id text.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hostport.h"
#include "xfer_internal.h"

kvc_err kvt__split_hostport(const char *s, unsigned flags, char *host, size_t hcap, uint16_t *port)
{
    const char *why = kvc__hostport_split(s, flags, host, hcap, port);
    if (why)
        return kvt__fail(KVC_E_INVAL, "bad address \"%s\": %s", s ? s : "", why);
    return KVC_OK;
}

kvc_err kvt__resolve(const char *hostport, unsigned flags, struct sockaddr_storage *sa,
                     socklen_t *len)
{
    char host[KVC_HOSTPORT_HOST_MAX + 1];
    uint16_t port = 0;
    kvc_err e = kvt__split_hostport(hostport, flags, host, sizeof host, &port);
    if (e)
        return e;
    /* An empty host (listening only): every address. */
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_NUMERICSERV | (host[0] ? 0 : AI_PASSIVE)};
    struct addrinfo *res = NULL;
    char ps[8];
    kvt__str(ps, sizeof ps, "%u", port);
    int rc = getaddrinfo(host[0] ? host : NULL, ps, &hints, &res);
    if (rc)
        return kvt__fail(KVC_E_INVAL, "cannot resolve \"%s\": %s", host, gai_strerror(rc));
    memcpy(sa, res->ai_addr, res->ai_addrlen);
    *len = res->ai_addrlen;
    freeaddrinfo(res);
    return KVC_OK;
}

void kvt__format_session(const struct sockaddr_storage *sa, const char *host_override, char *out,
                         size_t cap)
{
    char h[INET6_ADDRSTRLEN] = "?";
    uint16_t port = 0;
    int v6 = sa->ss_family == AF_INET6;
    if (v6) {
        const struct sockaddr_in6 *s6 = (const void *)sa;
        inet_ntop(AF_INET6, &s6->sin6_addr, h, sizeof h);
        port = ntohs(s6->sin6_port);
    } else {
        const struct sockaddr_in *s4 = (const void *)sa;
        inet_ntop(AF_INET, &s4->sin_addr, h, sizeof h);
        port = ntohs(s4->sin_port);
    }
    const char *host = host_override ? host_override : h;
    if (strchr(host, ':'))
        kvt__str(out, cap, "[%s]:%u", host, port);
    else
        kvt__str(out, cap, "%s:%u", host, port);
}

/* First non-loopback address of this host of the given family, for a
 * session_id when listening on a wildcard.  Returns 0 when found. */
int kvt__first_address(int family, char *out, size_t cap)
{
    struct ifaddrs *ifa = NULL, *i;
    if (getifaddrs(&ifa))
        return -1;
    int found = -1;
    for (i = ifa; i && found; i = i->ifa_next) {
        if (!i->ifa_addr || i->ifa_addr->sa_family != family)
            continue;
        const void *a = family == AF_INET6
                            ? (const void *)&((struct sockaddr_in6 *)i->ifa_addr)->sin6_addr
                            : (const void *)&((struct sockaddr_in *)i->ifa_addr)->sin_addr;
        if (family == AF_INET && ((const uint8_t *)a)[0] == 127)
            continue;
        if (family == AF_INET6 && (IN6_IS_ADDR_LOOPBACK(a) || IN6_IS_ADDR_LINKLOCAL(a)))
            continue;
        if (inet_ntop(family, a, out, (socklen_t)cap))
            found = 0;
    }
    freeifaddrs(ifa);
    return found;
}
