/*
 * xfer_backends.c - the one file of the engine that names its backends:
 * it binds the tcp backend's sockets (xfer_tcp.c) and the RDMA data path
 * (verbs/) to an engine.  The shared code (the engine and the connection
 * layer, xfer_conn.h) calls them through e->net and e->rdma only, so no
 * file of it depends on a backend's; the backends call the connection
 * layer and the engine's reporting functions (xfer_internal.h).
 */
#include "xfer_tcp.h"
#include "xfer_verbs.h"

void kvt__backends_bind(kvt_engine *e)
{
    e->net = &kvt__tcp_net;
    e->rdma = &kvt__verbs_rdma;
}
