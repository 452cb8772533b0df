/*
 * xfer_conn.h - the connection layer: the connections every engine has
 * and what rides on them, whichever backend carries the data.  The tcp
 * backend sends its data frames on them; the verbs backend its control
 * channel (HELLO, QP_INFO).  Both backends call these functions; the
 * socket operations under them (listen, accept, connect, send, splice,
 * the socket's close) are the tcp backend's, reached through e->net.
 *
 * xfer_conn.c holds a connection's lifetime (table, close, free), its
 * send queue and control frames, its failure, the handshake's state
 * changes and the deadlines; xfer_rx.c its receive path.
 */
#ifndef KVC_XFER_CONN_H
#define KVC_XFER_CONN_H

#include "xfer_internal.h"

/* A new connection on socket fd (owned by it from now on; closed when the
 * connection is freed), in the engine's table.  NULL: out of memory (fd is
 * the caller's then). */
kvt__conn *kvt__conn_new(kvt_engine *e, int fd, bool client);
/* Free c once it is closing and none of its SQEs is in flight (the kernel
 * no longer reads its iovecs or writes into rbuf).  Otherwise nothing. */
void kvt__conn_maybe_free(kvt_engine *e, kvt__conn *c);
/* Close c: unlink it from its peer, release what is queued on it, then the
 * socket (e->net->close).  Idempotent; freed later by kvt__conn_maybe_free. */
void kvt__conn_close(kvt_engine *e, kvt__conn *c);
/* Fail connection c (and what rides on it) with code, naming op and what:
 * a client's peer is marked unhealthy (kvt__peer_fail), a server's
 * receiver rooms of its peer fail and it is closed. */
void kvt__conn_fail(kvt_engine *e, kvt__conn *c, int32_t code, const char *op, const char *what);

/* A control frame with a copy of payload; NULL: out of memory. */
kvt__wr *kvt__ctl_wr(uint8_t type, uint64_t seq, uint64_t room, uint64_t addr, int32_t status,
                     const void *payload, uint32_t plen);
/* Append w to c's send queue (sent by the next e->net->kick). */
void kvt__conn_enqueue(kvt__conn *c, kvt__wr *w);
/* Queue and kick this engine's HELLO (type KVT_F_HELLO, with the token) or
 * HELLO_OK. */
void kvt__conn_hello(kvt_engine *e, kvt__conn *c, uint8_t type);

/* The socket of c is accepted (server) / its connect completed with res
 * (client; < 0: -errno, the peer fails): the handshake starts. */
void kvt__conn_accepted(kvt_engine *e, kvt__conn *c);
void kvt__conn_connected(kvt_engine *e, kvt__conn *c, int res);
/* c's send batch left the kernel (sent, failed or cancelled): release its
 * writes.  Then, when sent (ok), close if that was asked once the queue is
 * empty, or send the next batch and pump the peer. */
void kvt__conn_batch_done(kvt_engine *e, kvt__conn *c, bool ok);

/* A completion of a connection's operation: a recv goes to xfer_rx.c, the
 * rest to the tcp backend (e->net->cqe). */
void kvt__conn_cqe(kvt_engine *e, struct io_uring_cqe *cqe);

/* Whether some connection has a deadline running (the engine arms its
 * timer only then), and failing those overdue at now (ns, monotonic):
 * connect_timeout_ms for the handshake, io_timeout_ms without progress. */
bool kvt__conn_has_deadlines(kvt_engine *e);
void kvt__conn_deadlines(kvt_engine *e, uint64_t now);

#endif
