/*
 * notify.c - systemd readiness notification over $NOTIFY_SOCKET; see
 * notify.h.
 */
#include "notify.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"

int notify_send(const char *state, char *err, size_t errcap)
{
    const char *path = getenv("NOTIFY_SOCKET");
    if (!path || !*path)
        return 0;
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    size_t plen = strlen(path);
    if ((path[0] != '/' && path[0] != '@') || plen >= sizeof sa.sun_path) {
        if (err)
            snprintf(err, errcap,
                     "NOTIFY_SOCKET '%s': not an absolute path or @abstract name "
                     "that fits a unix socket address",
                     path);
        errno = EINVAL;
        return -1;
    }
    memcpy(sa.sun_path, path, plen);
    if (path[0] == '@')
        sa.sun_path[0] = '\0'; /* abstract namespace: not NUL-terminated */
    socklen_t salen = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + plen + (path[0] == '/'));
    int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        if (err)
            snprintf(err, errcap, "NOTIFY_SOCKET: socket: %s", strerror(errno));
        return -1;
    }
    size_t len = strlen(state);
    ssize_t n;
    do
        n = sendto(fd, state, len, MSG_NOSIGNAL, (struct sockaddr *)&sa, salen);
    while (n < 0 && errno == EINTR);
    int saved = errno;
    close(fd);
    if (n < 0 || (size_t)n != len) {
        if (err)
            snprintf(err, errcap, "NOTIFY_SOCKET %s: sendto: %s", path,
                     n < 0 ? strerror(saved) : "short datagram");
        errno = n < 0 ? saved : EMSGSIZE;
        return -1;
    }
    return 1;
}

int notify_ready(const char *status)
{
    char msg[512];
    if (status)
        snprintf(msg, sizeof msg, "READY=1\nSTATUS=%s", status);
    else
        snprintf(msg, sizeof msg, "READY=1");
    return notify_send(msg, NULL, 0);
}

int notify_reloading(void)
{
    char msg[96];
    snprintf(msg, sizeof msg, "RELOADING=1\nMONOTONIC_USEC=%llu",
             (unsigned long long)kvc__mono_us());
    return notify_send(msg, NULL, 0);
}

int notify_stopping(void) { return notify_send("STOPPING=1", NULL, 0); }
