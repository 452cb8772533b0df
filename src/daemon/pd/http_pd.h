/*
 * http_pd.h - the routes of sglang's PD bootstrap server (http_pd.c), for
 * http_routes.c's route table, whose entries say which methods change the
 * PD tables (ROUTE_MUTATING: PUT /route, POST /register_dp_rank).  Every
 * handler takes the segment's PD lock, so the dispatch runs them off the
 * event loop (ROUTE_DEFER).
 */
#ifndef KVC_HTTP_PD_H
#define KVC_HTTP_PD_H

#include <stddef.h>

#include "buf.h"
#include "http_req.h"
#include "kvcoord/kvcoord.h"

/* Nonzero if path[0..len) is one of the PD routes (/route,
 * /register_dp_rank, /query_dp_ranks). */
int pd_path(const char *path, size_t len);

struct cluster;

/* Answer req (a PD path) into out.  cluster: the cluster view (--etcd),
 * whose mirrored PD tables GET /route may answer from, or NULL. */
void pd_dispatch(kvc_segment *seg, struct cluster *cluster, const struct http_req *req,
                 struct buf *out);

#endif /* KVC_HTTP_PD_H */
