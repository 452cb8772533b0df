/*
 * net.h - kvcoordd's listening socket: parse ADDR:PORT and listen.
 */
#ifndef KVC_NET_H
#define KVC_NET_H

#include <stddef.h>
#include <stdint.h>

/* Parse spec ("127.0.0.1:6789", "[::1]:6789", "localhost:6789",
 * ":6789" for every address) without resolving it.  host receives the
 * address part without brackets (hostcap bytes), *port the port.
 * Returns 0, or -1 with a message in err (errcap bytes). */
int net_parse_addr(const char *spec, char *host, size_t hostcap, uint16_t *port, char *err,
                   size_t errcap);

/* Bind and listen on spec (SO_REUSEADDR; IPv6 sockets are IPv6-only).
 * Returns the socket (close-on-exec, blocking), and the bound address as
 * "ADDR:PORT" / "[ADDR]:PORT" in bound (the real port when spec asked for
 * port 0) and the port in *port.  -1 with a message in err on failure. */
int net_listen(const char *spec, char *bound, size_t boundcap, uint16_t *port, char *err,
               size_t errcap);

#endif /* KVC_NET_H */
