/*
 * xfer_backends.c - the one file of the engine that names its backends:
 * it binds the TCP connection layer (xfer_tcp.c) and the RDMA data path
 * (verbs/) to an engine.  Everything else calls them through e->net and
 * e->rdma, so no file of the shared code depends on a backend's.
 */
#include "xfer_tcp.h"
#include "xfer_verbs.h"

void kvt__backends_bind(kvt_engine *e)
{
    e->net = &kvt__tcp_net;
    e->rdma = &kvt__verbs_rdma;
}
