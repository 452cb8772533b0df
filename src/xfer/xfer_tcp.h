/*
 * xfer_tcp.h - the tcp backend's functions (xfer_tcp.c), for xfer_tcp.c
 * and for xfer_backends.c, which puts them in the engine's net table
 * (kvt__tcp_net).  No other file includes this header: the connection
 * layer and the engine call the sockets through e->net (xfer_internal.h).
 */
#ifndef KVC_XFER_TCP_H
#define KVC_XFER_TCP_H

#include "xfer_internal.h"

/* The engine's net table (xfer_tcp.c). */
extern const struct kvt__net_ops kvt__tcp_net;

kvc_err kvt__tcp_listen(kvt_engine *e);
void kvt__tcp_arm_accept(kvt_engine *e);
kvc_err kvt__tcp_connect(kvt_engine *e, struct kvt_peer *p, uint32_t slot);
void kvt__tcp_cqe(kvt_engine *e, struct io_uring_cqe *cqe);
void kvt__tcp_kick(kvt_engine *e, kvt__conn *c);
void kvt__tcp_close(kvt_engine *e, kvt__conn *c);

#endif
