/*
 * xfer_verbs.h - the RDMA backend's functions, for the files of verbs/ and
 * for xfer_backends.c, which puts them in the engine's rdma table
 * (kvt__verbs_rdma).  The shared engine code never includes this header:
 * it calls the backend through e->rdma (xfer_internal.h).
 */
#ifndef KVC_XFER_VERBS_H
#define KVC_XFER_VERBS_H

#include "xfer_internal.h"

/* The engine's rdma table (xfer_verbs.c). */
extern const struct kvt__rdma_ops kvt__verbs_rdma;

/* xfer_verbs.c: the GID index the engine uses on a port whose table is
 * t[0..n-1]: the shared rule (kvt__gid_choose, gid/xfer_gid.h) with the
 * engine's override (o->verbs_gid_index); -1 and why when none. */
int kvt__verbs_gid_pick(const kvt_options *o, const kvt__gid_entry *t, size_t n, int link_is_ib,
                        char *why, size_t cap);
/* xfer_verbs.c: device probe for auto/verbs; fills why on failure. */
int kvt__verbs_open(kvt_engine *e, char *why, size_t cap);
/* The "verbs" member of this engine's descriptor (NULL without verbs). */
json_t *kvt__verbs_desc(kvt_engine *e);
void kvt__verbs_close(kvt_engine *e);
kvc_err kvt__verbs_reg(kvt_engine *e, kvt__region *r);
void kvt__verbs_dereg(kvt_engine *e, kvt__region *r);
/* The verbs data path (xfer_verbs_qp.c).  QP setup over connection c: */
void kvt__verbs_hello_ok(kvt_engine *e, kvt__conn *c); /* client: create, send QP_INFO */
int kvt__verbs_qp_info(kvt_engine *e, kvt__conn *c, const kvt__qp_rec *r, char *err, size_t cap);
void kvt__verbs_pump(kvt_engine *e, struct kvt_peer *p);      /* post RDMA WRITEs */
void kvt__verbs_notify(kvt_engine *e, kvt__sroom *r);         /* end of room: SEND */
void kvt__verbs_peer_down(kvt_engine *e, struct kvt_peer *p); /* QP to ERR: flush */
void kvt__verbs_rpeer_down(kvt_engine *e, kvt__rpeer *rp);
void kvt__verbs_conn_closed(kvt_engine *e, kvt__conn *c);
void kvt__verbs_arm(kvt_engine *e); /* POLL_ADD on CQ and async fds */
void kvt__verbs_cqe(kvt_engine *e, struct io_uring_cqe *cqe);
bool kvt__verbs_busy(kvt_engine *e); /* work requests outstanding */
void kvt__verbs_free_qps(kvt_engine *e);

#endif
