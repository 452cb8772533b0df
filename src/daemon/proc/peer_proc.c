/*
 * peer_proc.c - the process at the other end of a loopback TCP connection
 * (peer_proc.h): the peer's socket is the /proc/net/tcp{,6} row whose local
 * address is our peer address and whose remote address is our local one;
 * its inode names it in exactly one process's /proc/PID/fd (or in several
 * after a fork, when the owner cannot be told: -1).
 */
#include <arpa/inet.h>
#include <dirent.h>
#include <stdatomic.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "kvcoord/kvcoord.h"
#include "peer_proc.h"
#include "proc_watch.h"

static struct proc_watch *_Atomic watch; /* peer_process_watch() */

void peer_process_watch(struct proc_watch *pw) { atomic_store(&watch, pw); }

/* The address of sa as /proc/net/tcp{,6} writes it: the raw 32-bit words of
 * the address in host byte order as %08X each, then ':' and the port as
 * %04X. */
static int proc_addr(const struct sockaddr_storage *sa, char *buf, size_t cap, int *v6)
{
    if (sa->ss_family == AF_INET) {
        const struct sockaddr_in *a = (const struct sockaddr_in *)sa;
        *v6 = 0;
        return snprintf(buf, cap, "%08X:%04X", a->sin_addr.s_addr, ntohs(a->sin_port)) < 0 ? -1 : 0;
    }
    if (sa->ss_family == AF_INET6) {
        const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)sa;
        uint32_t w[4];
        memcpy(w, &a->sin6_addr, sizeof w);
        *v6 = 1;
        return snprintf(buf, cap, "%08X%08X%08X%08X:%04X", w[0], w[1], w[2], w[3],
                        ntohs(a->sin6_port)) < 0
                   ? -1
                   : 0;
    }
    return -1;
}

static int is_local(const struct sockaddr_storage *peer, const struct sockaddr_storage *self)
{
    if (peer->ss_family == AF_INET) {
        const struct sockaddr_in *p = (const struct sockaddr_in *)peer,
                                 *s = (const struct sockaddr_in *)self;
        return (ntohl(p->sin_addr.s_addr) >> 24) == 127 || p->sin_addr.s_addr == s->sin_addr.s_addr;
    }
    if (peer->ss_family == AF_INET6) {
        const struct sockaddr_in6 *p = (const struct sockaddr_in6 *)peer,
                                  *s = (const struct sockaddr_in6 *)self;
        return IN6_IS_ADDR_LOOPBACK(&p->sin6_addr) ||
               !memcmp(&p->sin6_addr, &s->sin6_addr, sizeof p->sin6_addr);
    }
    return 0;
}

/* The inode of the socket whose local address is `local` and remote one
 * `remote` (both in /proc's notation), or 0. */
static unsigned long socket_inode(const char *file, const char *local, const char *remote)
{
    FILE *f = fopen(file, "re");
    if (!f)
        return 0;
    char line[512], l[64], r[64];
    unsigned long ino = 0, found = 0;
    while (fgets(line, sizeof line, f)) {
        if (sscanf(line, " %*d: %63s %63s %*x %*s %*s %*s %*d %*d %lu", l, r, &ino) != 3)
            continue;
        if (!strcmp(l, local) && !strcmp(r, remote)) {
            found = ino;
            break;
        }
    }
    fclose(f);
    return found;
}

/* The one process holding socket:[ino], or -1 (none, or several). */
static int32_t holder(unsigned long ino)
{
    char want[48];
    snprintf(want, sizeof want, "socket:[%lu]", ino);
    DIR *proc = opendir("/proc");
    if (!proc)
        return -1;
    int32_t found = -1;
    int many = 0;
    struct dirent *d;
    while (!many && (d = readdir(proc))) {
        char *end;
        long pid = strtol(d->d_name, &end, 10);
        if (*end || pid <= 0)
            continue;
        char path[64];
        snprintf(path, sizeof path, "/proc/%ld/fd", pid);
        DIR *fds = opendir(path);
        if (!fds)
            continue;
        struct dirent *e;
        while ((e = readdir(fds))) {
            char link[320], target[64];
            if (e->d_name[0] == '.')
                continue;
            snprintf(link, sizeof link, "/proc/%ld/fd/%s", pid, e->d_name);
            ssize_t n = readlink(link, target, sizeof target - 1);
            if (n <= 0)
                continue;
            target[n] = 0;
            if (strcmp(target, want))
                continue;
            if (found > 0 && found != (int32_t)pid)
                many = 1;
            found = (int32_t)pid;
            break;
        }
        closedir(fds);
    }
    closedir(proc);
    return many ? -1 : found;
}

int peer_process(int fd, int32_t *pid, uint64_t *start)
{
    struct sockaddr_storage peer, self;
    socklen_t pl = sizeof peer, sl = sizeof self;
    if (getpeername(fd, (struct sockaddr *)&peer, &pl) ||
        getsockname(fd, (struct sockaddr *)&self, &sl))
        return -1;
    if (!is_local(&peer, &self))
        return -1;
    char p[64], s[64];
    int v6p, v6s;
    if (proc_addr(&peer, p, sizeof p, &v6p) || proc_addr(&self, s, sizeof s, &v6s))
        return -1;
    /* The peer's socket: local = its address (our peer), remote = ours. */
    unsigned long ino = socket_inode(v6p ? "/proc/net/tcp6" : "/proc/net/tcp", p, s);
    if (!ino)
        return -1;
    int32_t who = holder(ino);
    if (who <= 0 || who == getpid())
        return -1;
    kvc_proc_stat st;
    if (kvc_proc_stat_read(who, &st))
        return -1;
    *pid = who;
    *start = st.start;
    proc_watch_adopt(atomic_load(&watch), who, st.start);
    return 0;
}
