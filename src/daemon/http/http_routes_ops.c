/*
 * http_routes_ops.c - kvcoordd's routes for operators: GET /health, GET
 * /metrics and GET /cluster; and POST /cluster/room_failure, a peer
 * node's pushed room failure (cluster.h).  Routes: http_routes.c.
 */
#include "http_routes_int.h"

/* ---- GET /health -------------------------------------------------------- */

enum route_rc route_get_health(struct routes *r, struct route_slot *s, const struct http_req *req,
                               struct buf *out)
{
    (void)r, (void)s;
    resp_ok(out, req);
    return ROUTE_DONE;
}

/* ---- render once per batch ---------------------------------------------- */

/* Answer from the body memo[i] rendered for this batch of the loop's
 * completions; 0 when there is none (the caller renders into r->body and
 * calls memo_answer). */
static int memo_hit(struct routes *r, struct route_slot *s, int i, const struct http_req *req,
                    struct buf *out, const char *ctype)
{
    if (r->on_worker || !r->batch || !r->memo[i] || r->memo_batch[i] != r->batch)
        return 0;
    if (r->memo[i]->queued || route_answer_fits(s, req, out, r->memo[i]->len)) {
        resp_head(out, req, 200, ctype, r->memo[i]->len, NULL);
        if (resp_has_body(req))
            buf_attach(out, r->memo[i]);
    }
    return 1;
}

/* Answer 200 with r->body, just rendered; on the loop it becomes memo[i]
 * for the rest of this batch (a shared body, never copied); a helper
 * thread copies it into its answer. */
static void memo_answer(struct routes *r, struct route_slot *s, int i, const struct http_req *req,
                        struct buf *out, const char *ctype)
{
    struct buf *b = &r->body;
    struct shared_body *body = r->on_worker || !r->batch ? NULL : shared_body_take(b);
    if (!body) {
        resp_send(out, req, 200, ctype, b->p, b->len, NULL);
        buf_trim(b, RI_KEEP);
        return;
    }
    shared_body_unref(r->memo[i]);
    r->memo[i] = body;
    r->memo_batch[i] = r->batch;
    memo_hit(r, s, i, req, out, ctype);
}

/* ---- GET /metrics ------------------------------------------------------------ */

enum route_rc route_get_metrics(struct routes *r, struct route_slot *s, const struct http_req *req,
                                struct buf *out)
{
    if (memo_hit(r, s, MEMO_METRICS, req, out, METRICS_CONTENT_TYPE))
        return ROUTE_DONE;
    struct buf *b = &r->body;
    buf_reset(b);
    int rc = metrics_render(b, r->seg, r->metrics);
    if (!rc && r->cluster) {
        cluster_render_metrics(r->cluster, b);
        rc = b->oom ? -1 : 0;
    }
    if (rc) {
        resp_detail(out, req, 500, "Out of memory rendering metrics", NULL);
        buf_trim(b, RI_KEEP);
    } else {
        memo_answer(r, s, MEMO_METRICS, req, out, METRICS_CONTENT_TYPE);
    }
    return ROUTE_DONE;
}

/* ---- GET /cluster ---------------------------------------------------------- */

enum route_rc route_get_cluster(struct routes *r, struct route_slot *s, const struct http_req *req,
                                struct buf *out)
{
    if (!r->cluster) {
        resp_detail(out, req, 404, "Cluster view off (kvcoordd runs without --etcd)", NULL);
        return ROUTE_DONE;
    }
    if (memo_hit(r, s, MEMO_CLUSTER, req, out, CT_JSON))
        return ROUTE_DONE;
    struct buf *b = &r->body;
    buf_reset(b);
    cluster_render_json(r->cluster, b);
    if (b->oom) {
        resp_detail(out, req, 500, "Out of memory rendering the cluster view", NULL);
        buf_trim(b, RI_KEEP);
    } else {
        memo_answer(r, s, MEMO_CLUSTER, req, out, CT_JSON);
    }
    return ROUTE_DONE;
}

/* ---- POST /cluster/room_failure --------------------------------------------- */

enum route_rc route_post_room_push(struct routes *r, struct route_slot *s,
                                   const struct http_req *req, struct buf *out)
{
    (void)s;
    if (!r->cluster) {
        resp_detail(out, req, 404, "Cluster view off (kvcoordd runs without --etcd)", NULL);
        return ROUTE_DONE;
    }
    char err[256] = "";
    uint64_t room = 0;
    int taken = 0;
    int st = cluster_push_receive(r->cluster, req->body ? req->body : "", req->body_len, &room,
                                  &taken, err, sizeof err);
    if (st != 200) {
        route_detailf(out, req, st, "%s", err);
        return ROUTE_DONE;
    }
    char body[96];
    int n = snprintf(body, sizeof body, "{\"room\":%" PRIu64 ",\"taken\":%s}", room,
                     taken ? "true" : "false");
    resp_send(out, req, 200, CT_JSON, body, (size_t)n, NULL);
    return ROUTE_DONE;
}
