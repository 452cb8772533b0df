/*
 * proc_sockets.c - which process holds a TCP socket (proc_sockets.h): one
 * table scan (sock_find: a row of /proc/net/tcp{,6} by local port, or by
 * local and remote address) and one holder scan (sock_holders: the
 * processes whose /proc/PID/fd names the socket's inode), used by both
 * questions.
 */
#include "peer_recent.h"
#include "proc_sockets.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kvcoord/kvcoord.h"
#include "proc_watch.h"

#define TCP_LISTEN 0x0A /* include/net/tcp_states.h */

/* ---- /proc/net/tcp{,6} ----------------------------------------------------- */

/* What a socket row is looked up by: its local port (port 0: not), or its
 * local and remote addresses as /proc writes them ("0100007F:1F90"). */
struct sock_key {
    uint16_t port;
    const char *local, *remote;
};

struct sock_row {
    bool found, listening;
    uint32_t uid;
    uint64_t inode;
};

/* The row of file matching key into *row; by port a listening socket wins
 * over one only bound (a row without inode - TIME_WAIT - never matches). */
static void sock_find(const char *file, const struct sock_key *key, struct sock_row *row)
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
        *row = (struct sock_row){
            .found = true, .listening = st == TCP_LISTEN, .uid = uid, .inode = inode};
        if (!key->port)
            break; /* an address pair names one socket */
    }
    fclose(f);
}

/* ---- /proc/PID/fd ------------------------------------------------------------ */

struct holders {
    int32_t first; /* the first holder found (0: none) */
    bool many;     /* another process holds it too */
    bool saw_all;  /* every process that could hold it was readable */
};

/* Whether process dir `pid` of /proc (procfd) holds socket `want` open.
 * An unreadable one (another user's) clears saw_all if it could be the
 * holder. */
static bool holds(int procfd, const char *pid, const char *want, struct holders *h)
{
    char path[300], link[64];
    snprintf(path, sizeof path, "%s/fd", pid);
    int dfd = openat(procfd, path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0) {
        if (errno == EACCES)
            h->saw_all = false;
        return false;
    }
    DIR *d = fdopendir(dfd);
    if (!d) {
        close(dfd);
        return false;
    }
    size_t wlen = strlen(want);
    bool found = false;
    struct dirent *e;
    while (!found && (e = readdir(d))) {
        if (e->d_name[0] == '.')
            continue;
        ssize_t n = readlinkat(dfd, e->d_name, link, sizeof link - 1);
        found = n > 0 && (size_t)n == wlen && !memcmp(link, want, wlen);
    }
    closedir(d);
    return found;
}

/* The processes holding socket inode (created by uid), this one excluded;
 * stop_at_many: stop once a second holder is found.  Only processes of
 * that uid are looked at (a stat of their /proc entry, no descriptor
 * listing for the others): a socket is held by the user who made it,
 * unless passed on (SCM_RIGHTS, setuid after bind), which this misses. */
static void sock_holders(uint64_t inode, uint32_t uid, bool stop_at_many, struct holders *h)
{
    *h = (struct holders){.saw_all = true};
    char want[48];
    snprintf(want, sizeof want, "socket:[%llu]", (unsigned long long)inode);
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
        if (!holds(procfd, e->d_name, want, h))
            continue;
        if (h->first && h->first != (int32_t)pid) {
            h->many = true;
            if (stop_at_many)
                break;
            continue;
        }
        h->first = (int32_t)pid;
        if (!stop_at_many)
            break; /* the first is enough */
    }
    closedir(d);
}

/* ---- who holds a port ---------------------------------------------------------- */

bool port_holder_find(uint16_t port, struct port_holder *h)
{
    memset(h, 0, sizeof *h);
    struct sock_key key = {.port = port};
    struct sock_row row = {0};
    sock_find("/proc/net/tcp", &key, &row);
    sock_find("/proc/net/tcp6", &key, &row);
    if (!row.found)
        return false;
    h->socket = true;
    h->listening = row.listening;
    h->uid = row.uid;
    h->inode = row.inode;
    struct holders who;
    sock_holders(row.inode, row.uid, false, &who);
    h->saw_all = who.saw_all;
    h->pid = who.first;
    if (h->pid) {
        char path[64];
        snprintf(path, sizeof path, "/proc/%d/comm", (int)h->pid);
        int cfd = open(path, O_RDONLY | O_CLOEXEC);
        ssize_t n = cfd < 0 ? -1 : read(cfd, h->comm, sizeof h->comm - 1);
        if (cfd >= 0)
            close(cfd);
        h->comm[n > 0 ? n : 0] = '\0';
        h->comm[strcspn(h->comm, "\n")] = '\0';
    }
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

/* ---- the process at the other end of a connection ------------------------------- */

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
    /* A registrant seen before, its socket asked of the kernel by address
     * (pd/peer_recent.h): no read of /proc/net/tcp nor of every process. */
    uint64_t seen_start = 0;
    unsigned long dino = peer_diag_inode(&peer, &self);
    int32_t seen = dino ? peer_recent_find(dino, &seen_start) : 0;
    if (seen > 0 && seen != getpid()) {
        *pid = seen;
        *start = seen_start;
        proc_watch_adopt(atomic_load(&watch), seen, seen_start);
        return 0;
    }
    /* The peer's socket: local = its address (our peer), remote = ours. */
    struct sock_key key = {.local = p, .remote = s};
    struct sock_row row = {0};
    sock_find(v6p ? "/proc/net/tcp6" : "/proc/net/tcp", &key, &row);
    if (!row.found)
        return -1;
    struct holders who;
    sock_holders(row.inode, row.uid, true, &who);
    if (who.first <= 0 || who.many)
        return -1;
    kvc_proc_stat st;
    if (kvc_proc_stat_read(who.first, &st))
        return -1;
    *pid = who.first;
    *start = st.start;
    peer_recent_add(who.first, st.start);
    proc_watch_adopt(atomic_load(&watch), who.first, st.start);
    return 0;
}
