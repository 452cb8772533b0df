/*
 * http_routes_int.h - what kvcoordd's route files share, and nothing else
 * uses: http_routes.c (the table, the one path matcher, dispatch, the
 * helpers below), http_routes_lookup.c (reads of the rank table),
 * http_routes_register.c (registrations, parallelism configs, withdrawal),
 * http_routes_rooms.c (rooms and failure records) and http_routes_ops.c
 * (/health, /metrics, /cluster).  The routes themselves are described at
 * the top of http_routes.c.
 */
#ifndef KVC_HTTP_ROUTES_INT_H
#define KVC_HTTP_ROUTES_INT_H

#include <http_parser.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "auth.h"
#include "cluster.h"
#include "http_resp.h"
#include "http_routes.h"
#include "json_scan.h"
#include "log.h"
#include "metrics.h"
#include "query.h"

#define RI_KEEP (256 * 1024) /* lookup buffer kept per connection */
#define WITHDRAW_NOTE "withdrawn over HTTP (DELETE /transfer_engine_info)"

struct routes {
    kvc_segment *seg;
    uint32_t max_ranks;
    kvc_rank_info *list; /* max_ranks entries, for /ranks */
    kvc_rank_info scratch;
    struct buf body;            /* /ranks, /rooms and /failures answer bodies */
    kvc_failure_info *failures; /* ROUTES_FAILURES_MAX, for /failures */
    const struct auth *auth;    /* NULL: no token check */
    const struct metrics *metrics;
    struct cluster *cluster;     /* NULL: no --etcd */
    struct cached_answer *cache; /* ANSWER_CACHE_SLOTS, for lookups of the default role */
    size_t cache_bytes;          /* bytes of the bodies cached */
    struct shared_body *ranks;   /* the GET /ranks body of ranks_epoch (NULL: none) */
    uint32_t ranks_epoch;
    uint64_t ranks_world;
    int on_worker; /* a helper thread's clone: runs what the loop defers */
    /* GET /metrics and /cluster answered on the loop: the body rendered
     * for the loop's batch of completions memo_batch[i] (routes_batch),
     * shared by every request of that batch (MEMO_METRICS, MEMO_CLUSTER). */
    uint64_t batch;
    struct shared_body *memo[2];
    uint64_t memo_batch[2];
    struct route_match match; /* the "{name}" segment of the route being run */
};

/* The answer to GET /get_transfer_engine_info of a rank (its headers'
 * extension lines and its body), valid while the rank table's change epoch
 * is the one read before the lookup it came from: any registration,
 * withdrawal, mirror or recovery bumps the epoch, so a hit is the answer
 * the lookup would give now.  The body is rendered once per epoch into a
 * shared body (buf.h) that every connection answering it queues by
 * reference: 300 clients of a 4 MB rank cost one rendering and 4 MB, not
 * 300 copies.  Direct-mapped by rank (a rank evicts another with the same
 * slot); the cached bodies together stay under ANSWER_CACHE_BYTES (a body
 * past it is rendered for the request and shared by its own queue only).
 * Touched by the loop thread only (lookups are never deferred). */
#define ANSWER_CACHE_SLOTS 64
#define ANSWER_CACHE_BYTES (64u << 20)

struct cached_answer {
    uint32_t rank, epoch;
    char extra[64 + 2 * KVC_ORIGIN_MAX];
    struct shared_body *body; /* NULL: empty slot */
};

enum { MEMO_METRICS, MEMO_CLUSTER };

#define ROUTES_FAILURES_DEFAULT 100
#define ROUTES_FAILURES_MAX KVC_FAILURE_RING

#define M(m) (UINT64_C(1) << (m))

/* ---- helpers (http_routes.c) -------------------------------------------- */

/* An error answer whose detail is formatted (a 503 gets Retry-After). */
void route_detailf(struct buf *out, const struct http_req *req, int status, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* HTTP status for a library error. */
int route_lib_status(kvc_err e);
/* A role name from a request into role ("" when absent); -1: not one. */
int route_role_value(const char *v, char *role);
/* rank (required), role and wait_ms (optional; wait_ms NULL: not read;
 * its value as given, 0..UINT64_MAX, the caller applies the cap) from the
 * query; on a bad one the 400 is written and -1 returned. */
int route_rank_params(const struct http_req *req, struct buf *out, uint32_t *rank, char *role,
                      uint64_t *wait_ms);
/* Does an answer with a body of len bytes fit the daemon-wide budget of
 * unsent answers?  Else the 503 is written and 0 returned. */
int route_answer_fits(const struct route_slot *s, const struct http_req *req, struct buf *out,
                      size_t len);
/* " (role R)" for a named role, "" for the default one. */
const char *route_role_suffix(const char *role, char *buf, size_t cap);
/* " (withdrawn: <note>)" for a withdrawn entry's 404 (or " (<note>)"
 * when the note says so itself). */
const char *route_withdrawn_suffix(const char *note, char *buf, size_t cap);
/* 400 naming a missing (why NULL) or invalid field; returns -1. */
int route_bad_field(struct buf *out, const struct http_req *req, const char *field,
                    const char *why);
/* 400 "Duplicate field 'F': it occurs N times; send each field once", the
 * one wording of a repeated field on every route; returns -1. */
int route_duplicate_field(struct buf *out, const struct http_req *req, const char *field,
                          unsigned times);
/* The request body as JSON, or NULL after answering 400: invalid JSON, or
 * one of the top-level fields[0..nfields) (nfields <= 8) given twice. */
json_t *route_parse_body(const struct http_req *req, struct buf *out, const char *const *fields,
                         size_t nfields);

/* ---- handlers (route_fn), one file per family ------------------------------ */

enum route_rc route_get_info(struct routes *, struct route_slot *, const struct http_req *,
                             struct buf *);
enum route_rc route_get_ranks(struct routes *, struct route_slot *, const struct http_req *,
                              struct buf *);
enum route_rc route_put_register(struct routes *, struct route_slot *, const struct http_req *,
                                 struct buf *);
enum route_rc route_put_parallelism(struct routes *, struct route_slot *, const struct http_req *,
                                    struct buf *);
enum route_rc route_get_parallelism(struct routes *, struct route_slot *, const struct http_req *,
                                    struct buf *);
enum route_rc route_delete_info(struct routes *, struct route_slot *, const struct http_req *,
                                struct buf *);
enum route_rc route_room(struct routes *, struct route_slot *, const struct http_req *,
                         struct buf *);
enum route_rc route_room_failure(struct routes *, struct route_slot *, const struct http_req *,
                                 struct buf *);
enum route_rc route_get_failures(struct routes *, struct route_slot *, const struct http_req *,
                                 struct buf *);
enum route_rc route_get_health(struct routes *, struct route_slot *, const struct http_req *,
                               struct buf *);
enum route_rc route_get_metrics(struct routes *, struct route_slot *, const struct http_req *,
                                struct buf *);
enum route_rc route_post_room_push(struct routes *, struct route_slot *, const struct http_req *,
                                   struct buf *);
enum route_rc route_get_cluster(struct routes *, struct route_slot *, const struct http_req *,
                                struct buf *);

#endif /* KVC_HTTP_ROUTES_INT_H */
