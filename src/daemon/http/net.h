/*
 * net.h - kvcoordd's listening socket: parse ADDR:PORT and listen.
 */
#ifndef KVC_NET_H
#define KVC_NET_H

#include <stddef.h>
#include <stdint.h>

/* Parse spec ("127.0.0.1:6789", "[::1]:6789", "localhost:6789",
 * ":6789" for every address) without resolving it, by the project's one
 * host:port rule (src/common/hostport.h, as a listen address: an empty host
 * is every address; a bare IPv6 literal is refused).  host receives the
 * address part without brackets (hostcap bytes), *port the port.
 * Returns 0, or -1 with a message in err (errcap bytes). */
int net_parse_addr(const char *spec, char *host, size_t hostcap, uint16_t *port, char *err,
                   size_t errcap);

/* Bind and listen on spec (SO_REUSEADDR; IPv6 sockets are IPv6-only).
 * Returns the socket (close-on-exec, blocking), and the bound address as
 * "ADDR:PORT" / "[ADDR]:PORT" in bound (the real port when spec asked for
 * port 0) and the port in *port.  -1 with a message in err on failure, and
 * errno set to the bind/listen error (EADDRINUSE: the port is taken, e.g.
 * by the listening socket of a daemon killed a moment ago, which the kernel
 * frees shortly after; the caller may retry). */
int net_listen(const char *spec, char *bound, size_t boundcap, uint16_t *port, char *err,
               size_t errcap);

/* The first descriptor of the socket-activation protocol (sd_listen_fds). */
#define NET_LISTEN_FDS_START 3

/* A listening socket handed over by the supervisor (systemd's socket
 * activation protocol: LISTEN_PID equal to our pid, LISTEN_FDS = 1, the
 * socket at descriptor 3).  Returns the descriptor (made close-on-exec; the
 * three variables are removed from the environment, so nothing started
 * later takes it for its own), with its address in bound and *port as
 * net_listen does; -1 when no socket is passed to this process (no
 * LISTEN_PID/LISTEN_FDS, or LISTEN_PID names another process); -2 with a
 * message in err when one is passed but unusable (more than one, not a
 * listening stream socket, a bad value). */
int net_inherited(char *bound, size_t boundcap, uint16_t *port, char *err, size_t errcap);

#endif /* KVC_NET_H */
