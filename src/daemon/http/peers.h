/*
 * peers.h - connections per peer address, for kvcoordd's per-peer cap
 * (--max-conns-per-peer): one remote address cannot take the whole
 * connection table.
 *
 * A table of the addresses that hold connections (open, or accepted and
 * waiting for a slot), each with its count: open addressing with linear
 * probing and backward-shift deletion, sized at twice the connection cap
 * so it never fills.  Loop thread only; no allocation after peers_init().
 */
#ifndef KVC_PEERS_H
#define KVC_PEERS_H

#include <stddef.h>
#include <stdint.h>

/* A peer's address: IPv6, or IPv4 as ::ffff:a.b.c.d.  valid 0: not an IP
 * peer (a Unix socket, or getpeername() failed): never counted. */
struct peer_addr {
    uint8_t a[16];
    uint8_t valid, loopback;
};

struct peer_entry {
    uint8_t a[16];
    uint32_t count; /* 0: empty */
    uint32_t rec;   /* its record in peers.bytes (entries move; records do not) */
};

struct peers {
    struct peer_entry *t;
    uint32_t mask; /* size - 1 (a power of two) */
    uint32_t used;
    size_t *bytes;       /* per record: request body bytes the peer's connections
                            have reserved (http_conn's per-peer share) */
    uint32_t *free_recs; /* records not in use */
    uint32_t nfree;
};

/* A table for up to max_conns connections.  Returns 0, or -1 out of memory. */
int peers_init(struct peers *p, unsigned max_conns);
void peers_free(struct peers *p);

/* The peer address of connected socket fd (valid 0 when it has none). */
void peer_addr_of(int fd, struct peer_addr *a);

/* a as text ("10.1.2.3", "::1") into buf (INET6_ADDRSTRLEN bytes or
 * more); "unknown" for an invalid one.  Returns buf. */
const char *peer_addr_str(const struct peer_addr *a, char *buf, size_t cap);

/* Count one more connection of a when it holds fewer than cap; returns
 * 1 when counted, 0 when a is at its cap (nothing changed). */
int peers_take(struct peers *p, const struct peer_addr *a, unsigned cap);
/* Connections a holds now (0 when none). */
unsigned peers_count(const struct peers *p, const struct peer_addr *a);
/* The body bytes a's connections hold (a record that stays put while a
 * holds a connection), or NULL when a holds none. */
size_t *peers_bytes(const struct peers *p, const struct peer_addr *a);
/* One connection of a (counted by peers_take) is gone (its reserved bytes
 * given back before). */
void peers_put(struct peers *p, const struct peer_addr *a);

#endif /* KVC_PEERS_H */
