/*
 * http_pd.h - the routes of sglang's PD bootstrap server (http_pd.c): the
 * handlers of their rows in http_routes.c's route table, one per method
 * (the table decides which; none dispatches again).  The rows say which
 * change the PD tables (ROUTE_MUTATING: PUT /route, POST
 * /register_dp_rank); every handler but the 405s takes the segment's PD
 * lock, so those rows run off the event loop (ROUTE_DEFER).  The 405s
 * (route.own_405) are answered on the loop, as sglang's aiohttp words
 * them.
 */
#ifndef KVC_HTTP_PD_H
#define KVC_HTTP_PD_H

#include "http_routes.h"

/* PUT /route, GET /route, POST /register_dp_rank, POST /query_dp_ranks
 * (route_fn; GET /route answers from the cluster view's mirrored tables
 * too, with --etcd: routes_cluster()). */
enum route_rc route_pd_put_route(struct routes *r, struct route_slot *s, const struct http_req *req,
                                 struct buf *out);
enum route_rc route_pd_get_route(struct routes *r, struct route_slot *s, const struct http_req *req,
                                 struct buf *out);
enum route_rc route_pd_register_dp_rank(struct routes *r, struct route_slot *s,
                                        const struct http_req *req, struct buf *out);
enum route_rc route_pd_query_dp_ranks(struct routes *r, struct route_slot *s,
                                      const struct http_req *req, struct buf *out);
/* Another method on /route: sglang's 405 text "Method not allowed"
 * (typed application/json, as its handler answers). */
enum route_rc route_pd_route_405(struct routes *r, struct route_slot *s, const struct http_req *req,
                                 struct buf *out);
/* Another method on /register_dp_rank or /query_dp_ranks: aiohttp's
 * "405: Method Not Allowed" with Allow: POST. */
enum route_rc route_pd_post_405(struct routes *r, struct route_slot *s, const struct http_req *req,
                                struct buf *out);

#endif /* KVC_HTTP_PD_H */
