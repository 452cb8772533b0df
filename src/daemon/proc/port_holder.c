/*
 * port_holder.c - who holds a TCP port: /proc/net/tcp{,6}, then
 * /proc/[pid]/fd.
 */
#include "port_holder.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define TCP_LISTEN 0x0A /* include/net/tcp_states.h */

/* The socket bound to port in one /proc/net file; a listening one wins. */
static void scan_table(const char *path, uint16_t port, struct port_holder *h)
{
    FILE *f = fopen(path, "re");
    if (!f)
        return;
    char line[512];
    if (!fgets(line, sizeof line, f)) { /* the heading */
        fclose(f);
        return;
    }
    while (fgets(line, sizeof line, f)) {
        unsigned lport, st, uid;
        unsigned long inode;
        if (sscanf(line,
                   " %*u: %*[0-9A-Fa-f]:%x %*[0-9A-Fa-f]:%*x %x %*x:%*x %*x:%*x %*x %u %*u %lu",
                   &lport, &st, &uid, &inode) != 4 ||
            lport != port || !inode)
            continue; /* another port, or TIME_WAIT (no inode, blocks no SO_REUSEADDR bind) */
        if (h->socket && (h->listening || st != TCP_LISTEN))
            continue;
        h->socket = true;
        h->listening = st == TCP_LISTEN;
        h->uid = uid;
        h->inode = inode;
    }
    fclose(f);
}

/* Whether process dir (a /proc entry) holds socket inode open. */
static bool holds(int procfd, const char *pid, uint64_t inode, struct port_holder *h)
{
    char path[300], want[48], link[48];
    snprintf(path, sizeof path, "%s/fd", pid);
    int dfd = openat(procfd, path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0) {
        struct stat sb;
        /* Not readable (another user's): it matters only if it could be the
         * socket's owner. */
        if (errno == EACCES && (fstatat(procfd, pid, &sb, 0) || sb.st_uid == h->uid))
            h->saw_all = false;
        return false;
    }
    DIR *d = fdopendir(dfd);
    if (!d) {
        close(dfd);
        return false;
    }
    snprintf(want, sizeof want, "socket:[%llu]", (unsigned long long)inode);
    bool found = false;
    struct dirent *e;
    while (!found && (e = readdir(d))) {
        ssize_t n = readlinkat(dfd, e->d_name, link, sizeof link - 1);
        found = n > 0 && (size_t)n == strlen(want) && !memcmp(link, want, (size_t)n);
    }
    closedir(d);
    return found;
}

bool port_holder_find(uint16_t port, struct port_holder *h)
{
    memset(h, 0, sizeof *h);
    scan_table("/proc/net/tcp", port, h);
    scan_table("/proc/net/tcp6", port, h);
    if (!h->socket)
        return false;
    h->saw_all = true;
    int procfd = open("/proc", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    DIR *d = procfd < 0 ? NULL : fdopendir(procfd);
    if (!d) {
        if (procfd >= 0)
            close(procfd);
        h->saw_all = false;
        return true;
    }
    long self = (long)getpid();
    struct dirent *e;
    while ((e = readdir(d))) {
        char *end;
        long pid = strtol(e->d_name, &end, 10);
        if (*end || pid <= 0 || pid == self || !holds(procfd, e->d_name, h->inode, h))
            continue;
        h->pid = (int32_t)pid;
        char path[300];
        snprintf(path, sizeof path, "%s/comm", e->d_name);
        int cfd = openat(procfd, path, O_RDONLY | O_CLOEXEC);
        ssize_t n = cfd < 0 ? -1 : read(cfd, h->comm, sizeof h->comm - 1);
        if (cfd >= 0)
            close(cfd);
        h->comm[n > 0 ? n : 0] = '\0';
        h->comm[strcspn(h->comm, "\n")] = '\0';
        break;
    }
    closedir(d);
    return true;
}

char *port_holder_text(const struct port_holder *h, char *buf, size_t cap)
{
    /* never the word "listening": scripts wait for the "listening" event */
    const char *how = h->listening ? "listens on it" : "has a socket bound to it";
    if (!h->socket)
        snprintf(buf, cap, "no socket this network namespace lists");
    else if (h->pid)
        snprintf(buf, cap, "pid %d (%s), which %s", (int)h->pid, h->comm[0] ? h->comm : "?", how);
    else if (h->saw_all)
        snprintf(buf, cap, "a socket no process holds any more (its process just ended)");
    else
        snprintf(buf, cap, "a socket of uid %u whose process this user cannot see",
                 (unsigned)h->uid);
    return buf;
}
