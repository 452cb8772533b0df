/*
 * peer_proc.h - which process is at the other end of a loopback TCP
 * connection: kvcoordd makes it the owner of what it registers over HTTP
 * (the PD prefill table), so that its end withdraws it.
 */
#ifndef KVC_PEER_PROC_H
#define KVC_PEER_PROC_H

#include <stdint.h>

/* For the connected TCP socket fd: when its peer is on this host (loopback,
 * or one of this host's addresses) and its socket is found in
 * /proc/net/tcp{,6} and in one process's /proc/PID/fd, that process's pid
 * (as this process's PID namespace sees it) and start time (clock ticks
 * since boot).  Returns 0, or -1 when it cannot be told (remote peer, the
 * socket held by no visible process or by several, /proc unreadable).
 * Cost: one read of /proc/net/tcp{,6} and a scan of every process's fds
 * (about a millisecond on a node with a few hundred processes); for
 * registrations, never for lookups.  Thread-safe. */
int peer_process(int fd, int32_t *pid, uint64_t *start);

struct proc_watch;

/* From now on, each process peer_process() finds is also handed to pw
 * (proc_watch_adopt: a pidfd opened while it is alive, so its exit status
 * is known when it ends).  NULL: none.  Call before requests are served. */
void peer_process_watch(struct proc_watch *pw);

#endif /* KVC_PEER_PROC_H */
