/*
 * sock_holder.h - which process holds a TCP socket, read from /proc: the
 * socket's row in /proc/net/tcp{,6} (its inode and its owner's uid), then
 * the processes whose /proc/PID/fd names "socket:[inode]".  The one
 * scanner for its three users:
 *
 *  - kvcoordd, who holds a port (src/daemon/proc/proc_sockets.c,
 *    port_holder_find: the EADDRINUSE message at start);
 *  - kvcoordd, which process is at the other end of a loopback connection
 *    (proc_sockets.c, peer_process: the owner of a PUT /route, and
 *    src/daemon/pd/peer_recent.c: a registrant seen before);
 *  - the transfer engine, whether the pid a same-host peer names holds the
 *    other end of this very connection (src/xfer/xfer_cma.c).
 *
 * Compiled as its own object (kvcoord_sock_holder, src/common/CMakeLists.txt)
 * into kvcoordd and into both transfer libraries with hidden visibility:
 * internal (kvc__), exported by no library.
 *
 * Only this network namespace's sockets and this PID namespace's processes
 * are seen.  No state: every function is thread-safe; none allocates but
 * what opendir(3) / fopen(3) do, nor prints.
 */
#ifndef KVC_COMMON_SOCK_HOLDER_H
#define KVC_COMMON_SOCK_HOLDER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

/* A socket's row of /proc/net/tcp{,6}. */
struct kvc__sock_row {
    bool found;     /* a row matched (the rest is 0 otherwise) */
    bool listening; /* its state is LISTEN */
    uint32_t uid;   /* its owner's uid */
    uint64_t inode; /* its inode (never 0 when found: TIME_WAIT rows, which
                       have none, never match) */
};

/* The address sa as /proc/net/tcp{,6} writes it into buf (cap bytes, 64
 * is enough): the raw 32-bit words of the address as %08X each, then ':'
 * and the port as %04X ("0100007F:1F90").  Returns the table that lists
 * such addresses ("/proc/net/tcp" or "/proc/net/tcp6"), or NULL when sa is
 * not AF_INET / AF_INET6 (buf is then ""). */
const char *kvc__sock_proc_addr(const struct sockaddr_storage *sa, char *buf, size_t cap);

/* The socket bound to local TCP port `port` (both tables; a listening one
 * wins over one only bound) into *row, all zero when none. */
void kvc__sock_find_port(uint16_t port, struct kvc__sock_row *row);

/* The connected socket whose local address is `local` and remote address
 * `remote` into *row, all zero when none (not in this network namespace,
 * closed, or not inet).  For the other end of one of our connections,
 * local = getpeername's, remote = getsockname's. */
void kvc__sock_find_pair(const struct sockaddr_storage *local,
                         const struct sockaddr_storage *remote, struct kvc__sock_row *row);

/* Whether process pid holds socket `inode` among its descriptors: 0 it
 * does, ENOENT it does not (or it is gone), else the errno of listing
 * /proc/PID/fd (EACCES: another user's process). */
int kvc__sock_pid_holds(int32_t pid, uint64_t inode);

/* The processes holding a socket, as kvc__sock_holders() found them. */
struct kvc__sock_holders {
    int32_t first; /* the first holder found (0: none) */
    bool many;     /* another process holds it too (only looked for with
                      stop_at_many) */
    bool saw_all;  /* every process that could hold it was readable (so
                      first == 0 means none holds it) */
};

/* The processes holding socket `inode` made by `uid`, this process
 * excluded, into *h.  Only processes whose /proc entry belongs to uid are
 * listed (a socket is held by the user who made it, unless passed on by
 * SCM_RIGHTS or kept across setuid, which this misses).  stop_at_many
 * false: stop at the first holder; true: look on until a second one
 * (h->many).  Cost: a stat of every /proc entry and a listing of the
 * descriptors of uid's processes (a millisecond or so on a node with a few
 * hundred processes). */
void kvc__sock_holders(uint64_t inode, uint32_t uid, bool stop_at_many,
                       struct kvc__sock_holders *h);

#endif /* KVC_COMMON_SOCK_HOLDER_H */
