/*
 * proc_sockets.c - which process holds a TCP socket (proc_sockets.h): the
 * two questions kvcoordd asks, answered with src/common/sock_holder.h's
 * scanner (the table row, then the processes holding its inode), the one
 * the transfer engine's same-host check uses too.
 */
#include "peer_recent.h"
#include "proc_sockets.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "kvcoord/kvcoord.h"
#include "proc_watch.h"
#include "sock_holder.h"

/* ---- who holds a port ---------------------------------------------------------- */

bool port_holder_find(uint16_t port, struct port_holder *h)
{
    memset(h, 0, sizeof *h);
    struct kvc__sock_row row;
    kvc__sock_find_port(port, &row);
    if (!row.found)
        return false;
    h->socket = true;
    h->listening = row.listening;
    h->uid = row.uid;
    h->inode = row.inode;
    struct kvc__sock_holders who;
    kvc__sock_holders(row.inode, row.uid, false, &who);
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
    struct kvc__sock_row row;
    kvc__sock_find_pair(&peer, &self, &row);
    if (!row.found)
        return -1;
    struct kvc__sock_holders who;
    kvc__sock_holders(row.inode, row.uid, true, &who);
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
