/*
 * http_routes.h - kvcoordd's HTTP routes: dispatch a parsed request to its
 * handler, which answers through the public kvc_* API only.  The route
 * table and the extensions are described at the top of http_routes.c and
 * in docs/http-api.md.
 *
 * A lookup with wait_ms may not be answerable yet: the handler then returns
 * ROUTE_PARK and the server keeps the connection parked (without blocking
 * its loop) until the rank table changes or the wait ends, and calls
 * routes_resume().  A request that may wait for a segment lock (every
 * mutating route, the room routes, /failures, /metrics when its rooms
 * figures must be read) or parse megabytes returns ROUTE_DEFER once it is
 * known good (method, path, token): the server runs routes_deferred() on a
 * helper thread (http_worker.h), so the event loop never waits for a lock.
 * A lock still busy after the segment's lock timeout answers 503 with
 * Retry-After and a detail naming the lock and its owner's pid.
 */
#ifndef KVC_HTTP_ROUTES_H
#define KVC_HTTP_ROUTES_H

#include <stdint.h>

#include "buf.h"
#include "http_req.h"
#include "kvcoord/kvcoord.h"

/* Longest long-poll; larger wait_ms values are clamped to it, and the 404
 * after such a wait says so. */
#define ROUTES_MAX_WAIT_MS 60000u

struct routes;
struct auth;
struct metrics;

/* Answers up to this many bytes are small: always made, whatever the
 * daemon-wide budget of unsent answers (http_server.h max_answer_bytes). */
#define ROUTES_SMALL_ANSWER (64 * 1024)

/* Per-connection state of the routes, owned by the connection. */
struct route_slot {
    kvc_rank_info ri; /* lookup buffer, reused from request to request */
    /* Set by the server before each dispatch: answer bytes of all
     * connections not sent yet, and their budget (0: none).  A large
     * answer that would take the total past the budget, while others are
     * unsent, is answered 503 instead (routes_answer_fits()). */
    size_t answer_used, answer_max;
    int shared;            /* set by routes_dispatch() on ROUTE_DEFER of a ROUTE_SHARED row */
    uint32_t park_rank;    /* parked lookup: the rank waited for */
    uint32_t park_wait_ms; /* ... how long to wait at most */
    int park_capped;       /* ... the wait_ms asked for was above ROUTES_MAX_WAIT_MS */
    char park_role[KVC_ROLE_NAME_MAX + 1]; /* ... under this role ("": default) */
};

enum route_rc {
    ROUTE_DONE = 0, /* the whole answer was appended to out */
    ROUTE_PARK = 1, /* nothing appended: park, then routes_resume() */
    ROUTE_DEFER = 2 /* nothing appended: may wait for a lock; run
                       routes_deferred() on a helper thread */
};

/* Create the routes for an open segment.  Returns 0, or -1 (out of memory). */
int routes_create(struct routes **out, kvc_segment *seg);
void routes_destroy(struct routes *r);

/* Bearer-token check of the mutating routes (auth NULL or off: every
 * request allowed) and the counters GET /metrics renders (NULL: the
 * segment's figures only).  Both must outlive r; the check runs in
 * routes_dispatch(), on the caller's (the event loop's) thread. */
void routes_set_ops(struct routes *r, const struct auth *auth, const struct metrics *m);

struct cluster;

/* The cluster view (--etcd) GET /cluster and /metrics report, or NULL. */
void routes_set_cluster(struct routes *r, struct cluster *c);

/* Answer req into out, or ask to park it. */
enum route_rc routes_dispatch(struct routes *r, struct route_slot *s, const struct http_req *req,
                              struct buf *out);

/* Re-check a parked lookup: after a rank table change (expired 0), or once
 * its wait is over (expired 1: always answers, 404 if still absent). */
enum route_rc routes_resume(struct routes *r, struct route_slot *s, const struct http_req *req,
                            struct buf *out, int expired);

/* Routes for a helper thread: the same segment, token check and counters
 * as r, scratch buffers of their own; they run what r deferred.  Returns 0,
 * or -1 (out of memory).  Free with routes_destroy(). */
int routes_clone(const struct routes *r, struct routes **out);

/* http_limits.head_check (http_conn.h) of the loop's routes (arg): 401
 * for a mutating request whose token is missing or wrong, decided from its
 * headers, so its body is never buffered; HEAD_UNTRUSTED for a read
 * without a valid token while one is configured (its body is let in, on
 * the terms of an unauthenticated peer: http_conn.h); 0 otherwise.  Loop
 * thread only (the token is re-read there on SIGHUP). */
int routes_head_check(void *arg, const struct http_req *req);

/* Run a request r's original deferred (ROUTE_DEFER), on the clone r of a
 * helper thread: answer req into out.  The token was checked on the loop;
 * one request at a time per clone. */
void routes_deferred(struct routes *r, const struct http_req *req, struct buf *out);

/* ---- the route table (what each route is; for the tests) ---------------- */

/* Flags of a route, read by routes_dispatch() and routes_head_check(). */
enum {
    ROUTE_MUTATING = 1,       /* changes the segment: the token is checked (when one
                                is configured) before anything else, and it runs on a
                                helper thread */
    ROUTE_MAY_WAIT = 2,       /* may wait for a segment lock: runs on a helper thread */
    ROUTE_WAITS_IF_STALE = 4, /* on a helper thread only when its figures must be read
                                under a lock (GET /metrics: metrics_rooms_fresh()) */
    ROUTE_OWN_405 = 8,        /* another method on this path is answered by the row's
                                own_405 (on the loop), not the table's 405; no redirect
                                of trailing slashes (sglang's PD bootstrap server) */
    ROUTE_SHARED = 32,        /* the answer depends on the method, path, query and the
                                state only: identical requests deferred together share
                                one rendering (route_slot.shared) */
    ROUTE_READS_ONLY = 16     /* accepts POST yet changes nothing (sglang's POST
                                /query_dp_ranks): no token; test_http_routes checks it */
};

#define ROUTE_ARG_MAX 64 /* longest "{name}" segment kept, decoded */

/* The "{name}" segment of the path matched (at most one per pattern). */
struct route_match {
    char arg[ROUTE_ARG_MAX + 1]; /* percent-decoded, NUL-terminated when it fits */
    size_t arg_len;              /* decoded length; above ROUTE_ARG_MAX: too long */
};

typedef enum route_rc (*route_fn)(struct routes *, struct route_slot *, const struct http_req *,
                                  struct buf *);

struct route {
    const char *pattern; /* "/health", "/rooms/{room}/failure": "{room}" is one non-empty
                            segment; matched segment by segment, each decoded alone.
                            A path may have several entries (adjacent), one per set
                            of methods with the same flags */
    uint64_t methods;    /* bit (1 << enum http_method) per method accepted */
    unsigned flags;      /* ROUTE_* above */
    route_fn fn;
    route_fn own_405; /* ROUTE_OWN_405, on a path's first row: answers the other methods */
};

/* The loop took a new batch of completions (number n, increasing): every
 * request it answers from now on arrived before this call, so a body
 * rendered after it is theirs all (GET /metrics and /cluster render once
 * per batch).  Loop thread only. */
void routes_batch(struct routes *r, uint64_t n);

/* The segment r answers from, and the cluster view (NULL without --etcd):
 * for the route families outside http/ (pd/http_pd.c). */
kvc_segment *routes_segment(const struct routes *r);
struct cluster *routes_cluster(const struct routes *r);

/* The route table (static, count entries). */
const struct route *routes_table(size_t *count);

/* Metrics route labels, from the table: index 0 is "other" (a path the
 * table does not know), then each path's pattern ("/rooms/{room}") in
 * table order.  Thread-safe
 * (built once). */
unsigned routes_label_count(void);
/* The label of index i ("other" for i out of range). */
const char *routes_label(unsigned i);
/* The label index of path[0..len) (raw or decoded; not NUL-terminated):
 * its route's, whatever the method; 0 when no route has that path. */
unsigned routes_label_of(const char *path, size_t len);

/* The request using s was answered: free a large lookup buffer. */
void route_slot_done(struct route_slot *s);

/* Free everything s holds. */
void route_slot_free(struct route_slot *s);

#endif /* KVC_HTTP_ROUTES_H */
