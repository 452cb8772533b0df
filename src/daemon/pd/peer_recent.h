/*
 * peer_recent.h - the processes that registered over loopback lately (PUT
 * /route's owners, peer_proc.c), looked at first when the next connection's
 * owner is sought: a registrant seen before is found by reading its own
 * /proc/PID/fd (and its descendants' children lists), not every process's,
 * so the cost of PUT /route no longer grows with the host's process count.
 * A miss falls back to peer_proc.c's full scan, which adds what it finds.
 * The environment variable KVCOORD_BENCH_NO_PEER_RECENT (any value) turns
 * both this and peer_diag_inode() off, for tools/bench/bench_pd_register.py's
 * same-run comparison with the /proc scans alone.
 */
#ifndef KVC_PEER_RECENT_H
#define KVC_PEER_RECENT_H

#include <stdint.h>

/* Processes remembered (the oldest is forgotten first). */
#define PEER_RECENT_MAX 64
/* Descendants of a candidate looked at (a socket shared with a child after
 * fork has no one owner); more, and the full scan decides. */
#define PEER_RECENT_DESCENDANTS 256

/* The one remembered process (still running, same start time) holding
 * socket inode ino, when none of its descendants holds it too: its pid,
 * with *start.  0: not found this way (the caller scans /proc).
 * Thread-safe. */
int32_t peer_recent_find(unsigned long ino, uint64_t *start);

struct sockaddr_storage;

/* The inode of the loopback TCP socket whose local end is peer and remote
 * end self (our peer's socket), asked of the kernel by its addresses
 * (NETLINK_SOCK_DIAG, one exact lookup: no read of /proc/net/tcp, whose
 * length grows with every socket of the host, TIME_WAIT ones included).
 * 0 when the kernel does not say (the caller reads /proc/net/tcp).
 * Thread-safe. */
unsigned long peer_diag_inode(const struct sockaddr_storage *peer,
                              const struct sockaddr_storage *self);

/* Remember (pid, start) as a registrant.  Thread-safe. */
void peer_recent_add(int32_t pid, uint64_t start);

#endif /* KVC_PEER_RECENT_H */
