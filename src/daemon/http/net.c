/*
 * net.c - parse ADDR:PORT and listen; see net.h.
 */
#include "net.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "hostport.h"
#include "query.h"

int net_parse_addr(const char *spec, char *host, size_t hostcap, uint16_t *port, char *err,
                   size_t errcap)
{
    const char *why = kvc__hostport_split(spec, KVC_HOSTPORT_LISTEN, host, hostcap, port);
    if (why)
        snprintf(err, errcap, "%s", why);
    return why ? -1 : 0;
}

/* "ADDR:PORT" or "[ADDR]:PORT" of a bound socket. */
static void format_bound(int fd, char *bound, size_t cap, uint16_t *port)
{
    struct sockaddr_storage ss;
    socklen_t len = sizeof ss;
    char ip[INET6_ADDRSTRLEN] = "?";
    *port = 0;
    if (getsockname(fd, (struct sockaddr *)&ss, &len) == 0) {
        if (ss.ss_family == AF_INET6) {
            struct sockaddr_in6 *a = (struct sockaddr_in6 *)&ss;
            inet_ntop(AF_INET6, &a->sin6_addr, ip, sizeof ip);
            *port = ntohs(a->sin6_port);
            snprintf(bound, cap, "[%s]:%u", ip, *port);
            return;
        }
        struct sockaddr_in *a = (struct sockaddr_in *)&ss;
        inet_ntop(AF_INET, &a->sin_addr, ip, sizeof ip);
        *port = ntohs(a->sin_port);
    }
    snprintf(bound, cap, "%s:%u", ip, *port);
}

/* Socket bound to one resolved address and listening, or -1 (errno set). */
static int listen_one(const struct addrinfo *ai)
{
    int one = 1;
    int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (ai->ai_family == AF_INET6)
        setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof one);
    if (bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && listen(fd, SOMAXCONN) == 0)
        return fd;
    int saved = errno;
    close(fd);
    errno = saved;
    return -1;
}

int net_listen(const char *spec, char *bound, size_t boundcap, uint16_t *port, char *err,
               size_t errcap)
{
    char host[256], service[8];
    if (net_parse_addr(spec, host, sizeof host, port, err, errcap))
        return -1;
    snprintf(service, sizeof service, "%u", *port);
    struct addrinfo hints = {.ai_flags = AI_PASSIVE | AI_NUMERICSERV,
                             .ai_family = AF_UNSPEC,
                             .ai_socktype = SOCK_STREAM};
    struct addrinfo *res = NULL;
    int gai = getaddrinfo(host[0] ? host : NULL, service, &hints, &res);
    if (gai) {
        snprintf(err, errcap, "cannot resolve '%s': %s", host, gai_strerror(gai));
        return -1;
    }
    int fd = -1, saved = 0;
    for (struct addrinfo *ai = res; ai && fd < 0; ai = ai->ai_next)
        if ((fd = listen_one(ai)) < 0)
            saved = errno;
    freeaddrinfo(res);
    if (fd < 0) {
        snprintf(err, errcap, "cannot listen on %s: %s", spec, strerror(saved));
        errno = saved;
        return -1;
    }
    format_bound(fd, bound, boundcap, port);
    return fd;
}

int net_inherited(char *bound, size_t boundcap, uint16_t *port, char *err, size_t errcap)
{
    const char *pid_s = getenv("LISTEN_PID"), *fds_s = getenv("LISTEN_FDS");
    uint64_t pid, fds;
    if (!pid_s || !fds_s)
        return -1;
    if (parse_uint(pid_s, INT32_MAX, &pid) || pid != (uint64_t)getpid())
        return -1; /* meant for another process (e.g. the one that started us) */
    unsetenv("LISTEN_PID");
    unsetenv("LISTEN_FDS");
    unsetenv("LISTEN_FDNAMES");
    if (parse_uint(fds_s, 1024, &fds)) {
        snprintf(err, errcap, "bad LISTEN_FDS '%s'", fds_s);
        return -2;
    }
    if (fds == 0)
        return -1;
    if (fds != 1) {
        snprintf(err, errcap,
                 "LISTEN_FDS=%llu: kvcoordd takes exactly one listening socket "
                 "(one ListenStream= in its .socket unit)",
                 (unsigned long long)fds);
        return -2;
    }
    int fd = NET_LISTEN_FDS_START, type = 0, acc = 0;
    socklen_t len = sizeof type;
    struct stat st;
    if (fstat(fd, &st) || !S_ISSOCK(st.st_mode) ||
        getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) || type != SOCK_STREAM) {
        snprintf(err, errcap, "descriptor %d passed by LISTEN_FDS is not a stream socket", fd);
        return -2;
    }
    len = sizeof acc;
    if (getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &acc, &len) || !acc) {
        snprintf(err, errcap, "socket %d passed by LISTEN_FDS is not listening", fd);
        return -2;
    }
    fcntl(fd, F_SETFD, FD_CLOEXEC);
    format_bound(fd, bound, boundcap, port);
    return fd;
}
