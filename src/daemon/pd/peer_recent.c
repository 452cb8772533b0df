/*
 * peer_recent.c - recent loopback registrants, looked at before a scan of
 * every process (peer_recent.h).
 */
#include <dirent.h>
#include <linux/inet_diag.h>
#include <linux/netlink.h>
#include <linux/sock_diag.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "kvcoord/kvcoord.h"
#include "peer_recent.h"
#include "sock_holder.h"

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static struct {
    int32_t pid;
    uint64_t start;
} recent[PEER_RECENT_MAX];
static unsigned next_slot;

/* Append pid's children (every thread's /proc/PID/task/TID/children) to
 * list[*n..cap); returns -1 when cap was reached. */
static int children(int32_t pid, int32_t *list, size_t *n, size_t cap)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/task", (int)pid);
    DIR *tasks = opendir(path);
    if (!tasks)
        return 0;
    int rc = 0;
    struct dirent *t;
    while (!rc && (t = readdir(tasks))) {
        if (t->d_name[0] == '.')
            continue;
        char cp[400];
        snprintf(cp, sizeof cp, "%s/%s/children", path, t->d_name);
        FILE *f = fopen(cp, "re");
        if (!f)
            continue;
        long c;
        while (fscanf(f, "%ld", &c) == 1) {
            if (*n >= cap) {
                rc = -1;
                break;
            }
            list[(*n)++] = (int32_t)c;
        }
        fclose(f);
    }
    closedir(tasks);
    return rc;
}

/* Does a descendant of pid hold the socket too (a fork after connect)?
 * 1 yes, or too many descendants to tell; 0 no. */
static int shared_below(int32_t pid, unsigned long ino)
{
    int32_t list[PEER_RECENT_DESCENDANTS];
    size_t n = 0;
    if (children(pid, list, &n, PEER_RECENT_DESCENDANTS))
        return 1;
    for (size_t i = 0; i < n; i++) {
        if (!kvc__sock_pid_holds(list[i], ino) ||
            children(list[i], list, &n, PEER_RECENT_DESCENDANTS))
            return 1;
    }
    return 0;
}

/* KVCOORD_BENCH_NO_PEER_RECENT set: off (tools/bench/bench_pd_register.py
 * measures PUT /route with and without, same binary, same run). */
static int disabled(void)
{
    static _Atomic int off = -1;
    int v = atomic_load(&off);
    if (v < 0) {
        v = getenv("KVCOORD_BENCH_NO_PEER_RECENT") != NULL;
        atomic_store(&off, v);
    }
    return v;
}

int32_t peer_recent_find(unsigned long ino, uint64_t *start)
{
    if (disabled())
        return 0;
    int32_t pids[PEER_RECENT_MAX];
    uint64_t starts[PEER_RECENT_MAX];
    size_t n = 0;
    pthread_mutex_lock(&mu);
    for (size_t i = 0; i < PEER_RECENT_MAX; i++)
        if (recent[i].pid > 0) {
            pids[n] = recent[i].pid;
            starts[n++] = recent[i].start;
        }
    pthread_mutex_unlock(&mu);
    for (size_t i = 0; i < n; i++) {
        kvc_proc_stat st;
        if (kvc_proc_stat_read(pids[i], &st) || st.start != starts[i] ||
            kvc__sock_pid_holds(pids[i], ino))
            continue;
        if (shared_below(pids[i], ino))
            return 0; /* several holders, or cannot tell: the full scan says */
        *start = starts[i];
        return pids[i];
    }
    return 0;
}

void peer_recent_add(int32_t pid, uint64_t start)
{
    if (disabled())
        return;
    pthread_mutex_lock(&mu);
    for (size_t i = 0; i < PEER_RECENT_MAX; i++)
        if (recent[i].pid == pid && recent[i].start == start) {
            pthread_mutex_unlock(&mu);
            return;
        }
    recent[next_slot].pid = pid;
    recent[next_slot].start = start;
    next_slot = (next_slot + 1) % PEER_RECENT_MAX;
    pthread_mutex_unlock(&mu);
}

unsigned long peer_diag_inode(const struct sockaddr_storage *peer,
                              const struct sockaddr_storage *self)
{
    if (disabled())
        return 0;
    struct {
        struct nlmsghdr nlh;
        struct inet_diag_req_v2 r;
    } req;
    memset(&req, 0, sizeof req);
    req.nlh.nlmsg_len = sizeof req;
    req.nlh.nlmsg_type = SOCK_DIAG_BY_FAMILY;
    req.nlh.nlmsg_flags = NLM_F_REQUEST;
    req.r.sdiag_family = (uint8_t)peer->ss_family;
    req.r.sdiag_protocol = IPPROTO_TCP;
    req.r.idiag_states = ~0u;
    req.r.id.idiag_cookie[0] = req.r.id.idiag_cookie[1] = INET_DIAG_NOCOOKIE;
    /* The peer's socket: its local end is our peer, its remote end us. */
    if (peer->ss_family == AF_INET && self->ss_family == AF_INET) {
        const struct sockaddr_in *p = (const void *)peer, *s = (const void *)self;
        req.r.id.idiag_sport = p->sin_port;
        req.r.id.idiag_dport = s->sin_port;
        memcpy(req.r.id.idiag_src, &p->sin_addr, 4);
        memcpy(req.r.id.idiag_dst, &s->sin_addr, 4);
    } else if (peer->ss_family == AF_INET6 && self->ss_family == AF_INET6) {
        const struct sockaddr_in6 *p = (const void *)peer, *s = (const void *)self;
        req.r.id.idiag_sport = p->sin6_port;
        req.r.id.idiag_dport = s->sin6_port;
        memcpy(req.r.id.idiag_src, &p->sin6_addr, 16);
        memcpy(req.r.id.idiag_dst, &s->sin6_addr, 16);
    } else {
        return 0;
    }
    int fd = socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG);
    if (fd < 0)
        return 0;
    struct timeval tv = {1, 0}; /* the kernel answers at once; never hang a worker */
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    unsigned long ino = 0;
    union {
        struct nlmsghdr h;
        char buf[8192];
    } ans;
    if (send(fd, &req, sizeof req, 0) == (ssize_t)sizeof req) {
        ssize_t n = recv(fd, &ans, sizeof ans, 0);
        for (struct nlmsghdr *h = &ans.h; n > 0 && NLMSG_OK(h, (size_t)n); h = NLMSG_NEXT(h, n)) {
            if (h->nlmsg_type != SOCK_DIAG_BY_FAMILY)
                break; /* NLMSG_ERROR (no such socket) or NLMSG_DONE */
            const struct inet_diag_msg *m = NLMSG_DATA(h);
            ino = m->idiag_inode;
            break;
        }
    }
    close(fd);
    return ino;
}
