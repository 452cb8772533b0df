/*
 * sock_holder.c - which process holds a TCP socket (sock_holder.h): one
 * table reader (a row of /proc/net/tcp{,6} by local port, or by local and
 * remote address) and one descriptor reader (/proc/PID/fd), for kvcoordd
 * and the transfer engine alike.
 */
#include "sock_holder.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define TCP_LISTEN 0x0A /* include/net/tcp_states.h */

/* ---- /proc/net/tcp{,6} ----------------------------------------------------- */

const char *kvc__sock_proc_addr(const struct sockaddr_storage *sa, char *buf, size_t cap)
{
    if (cap)
        buf[0] = '\0';
    if (sa->ss_family == AF_INET) {
        const struct sockaddr_in *a = (const struct sockaddr_in *)sa;
        snprintf(buf, cap, "%08X:%04X", (unsigned)a->sin_addr.s_addr, ntohs(a->sin_port));
        return "/proc/net/tcp";
    }
    if (sa->ss_family == AF_INET6) {
        const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)sa;
        uint32_t w[4];
        memcpy(w, &a->sin6_addr, sizeof w);
        snprintf(buf, cap, "%08X%08X%08X%08X:%04X", w[0], w[1], w[2], w[3], ntohs(a->sin6_port));
        return "/proc/net/tcp6";
    }
    return NULL;
}

/* What a row is looked up by: its local port (port 0: not), or its local
 * and remote addresses as /proc writes them. */
struct sock_key {
    uint16_t port;
    const char *local, *remote;
};

/* The row of file matching key into *row; by port a listening socket wins
 * over one only bound (a row without inode - TIME_WAIT - never matches). */
static void sock_find(const char *file, const struct sock_key *key, struct kvc__sock_row *row)
{
    FILE *f = fopen(file, "re");
    if (!f)
        return;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        char l[64], r[64];
        unsigned st, uid;
        unsigned long inode;
        if (sscanf(line, " %*u: %63s %63s %x %*x:%*x %*x:%*x %*x %u %*u %lu", l, r, &st, &uid,
                   &inode) != 5 ||
            !inode)
            continue; /* the heading, or TIME_WAIT (no inode, blocks no SO_REUSEADDR bind) */
        if (key->port) {
            const char *colon = strrchr(l, ':');
            if (!colon || strtoul(colon + 1, NULL, 16) != key->port)
                continue;
            if (row->found && (row->listening || st != TCP_LISTEN))
                continue;
        } else if (strcmp(l, key->local) || strcmp(r, key->remote)) {
            continue;
        }
        *row = (struct kvc__sock_row){
            .found = true, .listening = st == TCP_LISTEN, .uid = uid, .inode = inode};
        if (!key->port)
            break; /* an address pair names one socket */
    }
    fclose(f);
}

void kvc__sock_find_port(uint16_t port, struct kvc__sock_row *row)
{
    *row = (struct kvc__sock_row){0};
    if (!port)
        return;
    struct sock_key key = {.port = port};
    sock_find("/proc/net/tcp", &key, row);
    sock_find("/proc/net/tcp6", &key, row);
}

void kvc__sock_find_pair(const struct sockaddr_storage *local,
                         const struct sockaddr_storage *remote, struct kvc__sock_row *row)
{
    *row = (struct kvc__sock_row){0};
    char l[64], r[64];
    const char *file = kvc__sock_proc_addr(local, l, sizeof l);
    if (!file || !kvc__sock_proc_addr(remote, r, sizeof r))
        return;
    struct sock_key key = {.local = l, .remote = r};
    sock_find(file, &key, row);
}

/* ---- /proc/PID/fd ------------------------------------------------------------ */

int kvc__sock_pid_holds(int32_t pid, uint64_t inode)
{
    char path[64], want[48], link[64];
    snprintf(path, sizeof path, "/proc/%d/fd", (int)pid);
    int wlen = snprintf(want, sizeof want, "socket:[%llu]", (unsigned long long)inode);
    int dfd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0)
        return errno;
    DIR *d = fdopendir(dfd);
    if (!d) {
        int err = errno;
        close(dfd);
        return err;
    }
    int rc = ENOENT;
    struct dirent *e;
    while (rc && (e = readdir(d))) {
        if (e->d_name[0] == '.')
            continue;
        ssize_t n = readlinkat(dfd, e->d_name, link, sizeof link - 1);
        if (n == wlen && !memcmp(link, want, (size_t)wlen))
            rc = 0;
    }
    closedir(d);
    return rc;
}

void kvc__sock_holders(uint64_t inode, uint32_t uid, bool stop_at_many, struct kvc__sock_holders *h)
{
    *h = (struct kvc__sock_holders){.saw_all = true};
    int procfd = open("/proc", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    DIR *d = procfd < 0 ? NULL : fdopendir(procfd);
    if (!d) {
        if (procfd >= 0)
            close(procfd);
        h->saw_all = false;
        return;
    }
    long self = (long)getpid();
    struct dirent *e;
    while ((e = readdir(d))) {
        char *end;
        long pid = strtol(e->d_name, &end, 10);
        struct stat sb;
        if (*end || pid <= 0 || pid == self)
            continue;
        if (fstatat(procfd, e->d_name, &sb, 0) || sb.st_uid != uid)
            continue; /* gone, or another user's */
        int rc = kvc__sock_pid_holds((int32_t)pid, inode);
        if (rc) {
            if (rc == EACCES)
                h->saw_all = false; /* it could be the holder */
            continue;
        }
        if (h->first) {
            h->many = true;
            break;
        }
        h->first = (int32_t)pid;
        if (!stop_at_many)
            break; /* the first is enough */
    }
    closedir(d);
}
