/*
 * proc_sockets.h - which process holds a TCP socket, read from /proc: the
 * socket's row in /proc/net/tcp{,6} (its inode and owner's uid), then the
 * process whose /proc/PID/fd names "socket:[inode]" (src/common/
 * sock_holder.h: the one scanner, the transfer engine's too).  The two
 * questions kvcoordd asks:
 *
 *  - who holds a port (port_holder_find): for the EADDRINUSE message at
 *    start;
 *  - which process is at the other end of a loopback connection
 *    (peer_process): it owns what it registers over HTTP (the PD prefill
 *    table), so that its end withdraws it.
 *
 * Cost: one read of /proc/net/tcp{,6} and a look at the descriptors of
 * every process whose /proc entry belongs to the socket's uid (a
 * millisecond or so on a node with a few hundred processes): for
 * registrations and errors, never for lookups.  Thread-safe.  Only this PID
 * namespace's processes are seen.
 */
#ifndef KVC_PROC_SOCKETS_H
#define KVC_PROC_SOCKETS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ---- who holds a port ------------------------------------------------------ */

struct port_holder {
    bool socket;    /* a socket bound to the port is listed in /proc/net/tcp{,6} */
    bool listening; /* ... and it listens */
    uint32_t uid;   /* its owner's uid (when socket) */
    uint64_t inode; /* its inode (when socket) */
    int32_t pid;    /* a process holding it open, or 0: none seen */
    char comm[32];  /* that process's name (/proc/PID/comm), or "" */
    bool saw_all;   /* every process that could hold it could be read (so pid 0
                       means no process holds it: the socket of a process that
                       just ended, which the kernel frees shortly) */
};

/* Look up the socket bound to TCP port `port` in this network namespace (a
 * listening one first), then a process holding it (this process excluded).
 * Always fills *h (all zero when nothing is found); returns h->socket. */
bool port_holder_find(uint16_t port, struct port_holder *h);

/* "pid 1234 (kvcoordd), which listens on it", "a socket no process holds
 * any more (its process just ended)", ... into buf (cap bytes): the holder
 * as port_holder_find found it, for a message.  Returns buf. */
char *port_holder_text(const struct port_holder *h, char *buf, size_t cap);

/* ---- the process at the other end of a connection -------------------------- */

/* For the connected TCP socket fd: when its peer is on this host (loopback,
 * or this socket's own address) and its socket is held by exactly one
 * process (not this one), that process's pid (as this PID namespace sees
 * it) and start time (clock ticks since boot).  Returns 0, or -1 when it
 * cannot be told (remote peer, the socket held by no visible process or by
 * several - after a fork -, /proc unreadable).  Each process found is also
 * handed to the watch set by peer_process_watch(). */
int peer_process(int fd, int32_t *pid, uint64_t *start);

struct proc_watch;

/* From now on, each process peer_process() finds is also handed to pw
 * (proc_watch_adopt: a pidfd opened while it is alive, so its exit status
 * is known when it ends).  NULL: none.  Call before requests are served. */
void peer_process_watch(struct proc_watch *pw);

#endif /* KVC_PROC_SOCKETS_H */
