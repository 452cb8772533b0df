/*
 * port_holder.h - who holds a TCP port (for kvcoordd's EADDRINUSE message).
 */
#ifndef KVC_PORT_HOLDER_H
#define KVC_PORT_HOLDER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct port_holder {
    bool socket;    /* a socket bound to the port is listed in /proc/net/tcp{,6} */
    bool listening; /* ... and it listens */
    uint32_t uid;   /* its owner's uid (when socket) */
    uint64_t inode; /* its inode (when socket) */
    int32_t pid;    /* a process holding it open, or 0: none seen */
    char comm[32];  /* that process's name (/proc/PID/comm), or "" */
    bool saw_all;   /* every process's descriptors could be read (so pid 0
                       * means no process holds it: the socket of a process
                       * that just ended, which the kernel frees shortly) */
};

/* Look up the socket bound to TCP port `port` in this network namespace
 * (a listening one first) in /proc/net/tcp and /proc/net/tcp6, then the
 * process holding it through /proc/[pid]/fd (the first one found; this
 * PID namespace's processes only).  Reads /proc, a few ms; meant for an
 * error path.  Always fills *h (all zero when nothing is found); returns
 * h->socket. */
bool port_holder_find(uint16_t port, struct port_holder *h);

/* "pid 1234 (kvcoordd), which listens on it", "a socket no process holds
 * any more (its process just ended)", ... into buf (cap bytes): the holder
 * as port_holder_find found it, for a message.  Returns buf. */
char *port_holder_text(const struct port_holder *h, char *buf, size_t cap);

#endif
