/*
 * http_routes.c - kvcoordd's routes: the table, the one path matcher,
 * dispatch and the helpers the handlers share; the handlers are in
 * http_routes_{lookup,register,rooms,ops}.c, by family.  Handlers call the public kvc_* API
 * only (HTTP -> routes -> library -> segment).
 *
 * sglang-compatible (EngineInfoBootstrapServer; same paths, status codes,
 * JSON shapes and fixed detail strings):
 *   GET  /health                          200 text/plain "OK"
 *   PUT  /register_transfer_engine_info   (POST too) body {"rank"|"tp_rank": int,
 *        "transfer_engine_info": {"session_id": str, "weights_info_dict": {...}}}
 *                                         200 "OK"; 400 naming the field
 *   GET  /get_transfer_engine_info?rank=N 200 {"rank":N,
 *        "remote_instance_transfer_engine_info":[session_id, weights_info_dict]};
 *        400 "Missing rank parameter" / "Invalid rank parameter";
 *        404 "No transfer engine info for rank N"
 * Extensions:
 *   - wait_ms=N on the lookup: long-poll; a rank not (yet) registered is
 *     waited for up to N ms (clamped to 60000) before the 404, whose
 *     detail then says the wait was capped.  The wait parks the
 *     connection; the event loop keeps serving others.
 *   - the lookup answer carries "X-Kvcoord-Generation: G", the rank's
 *     generation (changes on every re-registration).
 *   - 404 for a withdrawn rank says why: "... (withdrawn: <note>)", or
 *     "... (<note>)" when the note starts with "withdrawn" itself.
 *   - role (e.g. "draft", a speculative draft model's ranks): ?role=R on the
 *     lookup and the DELETE, "role" in the registration body (or ?role=R);
 *     entries are keyed by (rank, role), no role meaning "target", the
 *     rank table.  400 "Invalid role parameter" / "Invalid field 'role'".
 *   - PUT /register_parallelism_config (POST too) body {"rank"|"tp_rank":
 *     int, "parallelism_config": {...}, "role": str (optional)}: 200 "OK";
 *     GET /get_parallelism_config?rank=N[&role=R]: 200 the stored object;
 *     404 "No parallelism config for rank N".
 *   - A known path with trailing slashes: 307 to the path without them
 *     (the query kept), as sglang's FastAPI server answers.
 *   - GET /ranks: {"ranks":[{"rank","session_id","generation","entries",
 *     "info_bytes","registered_ns","pid"}...],"world_size":W}.
 *   - DELETE /transfer_engine_info?rank=N: withdraw; 200 "OK" or 404.
 *   - HEAD on every GET route.
 *   - GET /rooms/{room}[?rank=R]: a bootstrap room's state, participants,
 *     per-rank local states and failure record (is_from_another_rank as
 *     rank R sees it; without R, as an outside observer); 404 if unknown.
 *   - PUT /rooms/{room}/failure (POST too) body {"rank": int, "reason": str,
 *     "code": int (optional, 0)}: kvc_room_fail (first record wins);
 *     {"kept": bool, "failure": {...}}.
 *   - GET /failures[?limit=N][&rank=R]: the most recent failure records,
 *     newest first (default 100, at most 1024).
 *   - GET /metrics: Prometheus text exposition (metrics.h); with --etcd,
 *     the cluster view's families too (cluster.h).
 *   - POST /cluster/room_failure: a room failure pushed by a peer node's
 *     kvcoordd (--etcd; body: etcd's rooms/<room> record), taken only by a
 *     room without a failure record: 200 {"room": R, "taken": bool}; 400,
 *     409 (the record names this node), 404 without --etcd (cluster.h)
 *   - GET /cluster: the cluster view (--etcd) as JSON: this node, etcd's
 *     state, the lease, the nodes, conflicts (cluster.h); 404 "Cluster view
 *     off (kvcoordd runs without --etcd)" otherwise.
 *   - A rank (of any role) or parallelism config mirrored from another
 *     node (--etcd) is answered like a local one, with "X-Kvcoord-Origin:
 *     <node>" and "X-Kvcoord-Origin-Generation: G" on the lookups and
 *     "origin"/"origin_generation" in /ranks.
 *   - With a token configured (auth.h), the mutating routes (registration,
 *     DELETE /transfer_engine_info, PUT /rooms/{room}/failure) need
 *     "Authorization: Bearer <token>"; else 401 {"detail":"Unauthorized"}
 *     with WWW-Authenticate: Bearer, checked before the body is looked at.
 *   Room ids are decimal 63-bit integers, written as JSON integers.
 * Every error is application/json {"detail":"..."}; an unknown path (an
 * empty room id, "/rooms/" or "/rooms//failure", included) is 404 "Not
 * Found", a known path with another method 405 "Method Not Allowed"
 * with an Allow header.  Library errors: KVC_E_CAPACITY and KVC_E_INVAL 400,
 * KVC_E_TOOBIG 413, KVC_E_FULL 507, KVC_E_BUSY 503, others 500, the detail
 * ending with kvc_last_error().
 */
#include <pthread.h>

#include "http_conn.h"
#include "http_pd.h"
#include "http_routes_int.h"

/* ---- helpers ---------------------------------------------------------- */

void route_detailf(struct buf *out, const struct http_req *req, int status, const char *fmt, ...)
{
    char detail[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(detail, sizeof detail, fmt, ap);
    va_end(ap);
    /* 503: a segment lock stayed busy past its timeout (the detail names the
     * lock and its owner's pid); worth retrying shortly. */
    resp_detail(out, req, status, detail, status == 503 ? "Retry-After: 1\r\n" : NULL);
}

/* HTTP status for a library error. */
int route_lib_status(kvc_err e)
{
    switch (e) {
    case KVC_E_INVAL:
    case KVC_E_CAPACITY: return 400;
    case KVC_E_TOOBIG: return 413;
    case KVC_E_FULL: return 507;
    case KVC_E_BUSY: return 503;
    default: return 500;
    }
}

/* A role name from a request: "" (the default role) when absent; -1 when
 * it is not one (the caller answers 400). */
int route_role_value(const char *v, char *role)
{
    if (strlen(v) > KVC_ROLE_NAME_MAX || kvc_role_check(v) != KVC_OK)
        return -1;
    snprintf(role, KVC_ROLE_NAME_MAX + 1, "%s", v);
    return 0;
}

/* Read rank (required), role (optional: "" when absent) and wait_ms
 * (optional, 0 when absent; as given, not capped) from the query; on a bad
 * one the 400 is written and -1 returned. */
int route_rank_params(const struct http_req *req, struct buf *out, uint32_t *rank, char *role,
                      uint64_t *wait_ms)
{
    char rv[24], wv[24], ov[KVC_ROLE_NAME_MAX + 2];
    struct query_param want[3] = {{"rank", rv, sizeof rv, 0, 0},
                                  {"role", ov, sizeof ov, 0, 0},
                                  {"wait_ms", wv, sizeof wv, 0, 0}};
    uint64_t v;
    int qrc = query_parse(req->query, req->query_len, want, wait_ms ? 3 : 2);
    if (qrc < 0) {
        resp_detail(out, req, 400, query_error_text(qrc), NULL);
        return -1;
    }
    if (!want[0].found) {
        resp_detail(out, req, 400, "Missing rank parameter", NULL);
        return -1;
    }
    if (want[0].too_long || parse_rank(rv, &v)) {
        resp_detail(out, req, 400, "Invalid rank parameter", NULL);
        return -1;
    }
    *rank = (uint32_t)v;
    role[0] = '\0';
    if (want[1].found && (want[1].too_long || route_role_value(ov, role))) {
        resp_detail(out, req, 400, "Invalid role parameter", NULL);
        return -1;
    }
    if (!wait_ms)
        return 0;
    *wait_ms = 0;
    if (want[2].found) {
        if (want[2].too_long || parse_uint(wv, UINT64_MAX, wait_ms)) {
            resp_detail(out, req, 400, "Invalid wait_ms parameter", NULL);
            return -1;
        }
    }
    return 0;
}

/* The token check of a mutating request (AUTH_ALLOW without a token). */
static enum auth_result token_check(const struct routes *r, const struct http_req *req)
{
    if (!r->auth || !auth_enabled(r->auth))
        return AUTH_ALLOW;
    return req->authorization_bad
               ? AUTH_DENY_TOKEN
               : auth_check_n(r->auth, req->authorization, req->authorization_len);
}

/* A mutating request without a valid token: answers 401 and returns 1. */
static int unauthorized(struct routes *r, const struct http_req *req, struct buf *out)
{
    enum auth_result rc = token_check(r, req);
    if (rc == AUTH_ALLOW)
        return 0;
    resp_detail(out, req, 401, "Unauthorized", "WWW-Authenticate: Bearer\r\n");
    if (log_enabled(LOG_DEBUG)) /* never the header itself */
        log_event(LOG_DEBUG, "unauthorized", "method=%s path=\"%.*s\" reason=%s",
                  http_method_str((enum http_method)req->method),
                  (int)(req->path_len > 200 ? 200 : req->path_len), req->path,
                  auth_result_name(rc));
    return 1;
}

/* Does an answer with a body of len bytes fit the daemon-wide budget of
 * unsent answers (route_slot)?  A small one always does, and so does one
 * that would be the only answer unsent (a single rank's info larger than
 * the budget is still served, one at a time).  Else the 503 is written
 * and 0 returned. */
int route_answer_fits(const struct route_slot *s, const struct http_req *req, struct buf *out,
                      size_t len)
{
    size_t used = s->answer_used, max = s->answer_max;
    if (!resp_has_body(req) || len <= ROUTES_SMALL_ANSWER || !max || !used ||
        len <= max - (used < max ? used : max))
        return 1;
    route_detailf(out, req, 503,
                  "Server busy: answers not yet read by their clients (%zu bytes) leave no room in "
                  "the answer budget (%zu bytes, --max-answer-bytes) for this one (%zu bytes)",
                  used, max, len);
    return 0;
}

/* " (role R)" for a named role, "" for the default one. */
const char *route_role_suffix(const char *role, char *buf, size_t cap)
{
    if (!role[0] || !strcmp(role, KVC_DEFAULT_ROLE))
        return "";
    snprintf(buf, cap, " (role %s)", role);
    return buf;
}

int route_bad_field(struct buf *out, const struct http_req *req, const char *field, const char *why)
{
    if (why)
        route_detailf(out, req, 400, "Invalid field '%s': %s", field, why);
    else
        route_detailf(out, req, 400, "Missing field '%s'", field);
    return -1;
}

int route_duplicate_field(struct buf *out, const struct http_req *req, const char *field,
                          unsigned times)
{
    route_detailf(out, req, 400, "Duplicate field '%s': it occurs %u times; send each field once",
                  field, times);
    return -1;
}

/* The request body as JSON, or NULL after answering 400 with jansson's
 * reason and position.  \u0000 is parsed (JSON_ALLOW_NUL) so that the
 * caller refuses it naming the field, as registration does, instead of
 * jansson's "\u0000 is not allowed without JSON_ALLOW_NUL".  A field the
 * route reads occurs at most once, as in a registration: parsers disagree
 * on which occurrence of a repeated key counts.  It is counted by
 * kvc__json_scan (as registration counts), so the 400 names the field and
 * its count in registration's words; a key the route does not read may
 * repeat (jansson keeps the last), as in a registration. */
json_t *route_parse_body(const struct http_req *req, struct buf *out, const char *const *fields,
                         size_t nfields)
{
    struct kvc_json_watch w[8];
    if (nfields > sizeof w / sizeof w[0])
        nfields = sizeof w / sizeof w[0];
    memset(w, 0, sizeof w);
    for (size_t i = 0; i < nfields; i++)
        w[i].parent = -1, w[i].key = fields[i];
    if (!kvc__json_scan(req->body, req->body_len, w, nfields, NULL, NULL))
        for (size_t i = 0; i < nfields; i++)
            if (w[i].seen > 1) {
                route_duplicate_field(out, req, fields[i], w[i].seen);
                return NULL;
            }
    json_error_t jerr;
    json_t *root = json_loadb(req->body, req->body_len, JSON_DECODE_ANY | JSON_ALLOW_NUL, &jerr);
    if (!root)
        route_detailf(out, req, 400, "Invalid JSON at line %d, column %d: %s", jerr.line,
                      jerr.column, jerr.text);
    return root;
}

/* " (withdrawn: <note>)" for a withdrawn entry's 404, or " (<note>)" when
 * the note already says so ("withdrawn over HTTP ...", "withdrawn on node
 * B"), so the detail does not read "withdrawn: withdrawn ...". */
const char *route_withdrawn_suffix(const char *note, char *buf, size_t cap)
{
    if (!note[0])
        snprintf(buf, cap, " (withdrawn)");
    else if (!strncmp(note, "withdrawn", strlen("withdrawn")))
        snprintf(buf, cap, " (%s)", note);
    else
        snprintf(buf, cap, " (withdrawn: %s)", note);
    return buf;
}

/* ---- the route table, and dispatch ------------------------------------------ */

/* Every route, and what it is.  A route's flags decide the token check
 * and the thread (routes_dispatch), from this table alone: a route added
 * here with ROUTE_MUTATING is checked and deferred without another line
 * (test_http_routes fails if a route with a state-changing method lacks
 * it, or if any route changes the segment without the token). */
static const struct route route_table[] = {
    {"/health", M(HTTP_GET) | M(HTTP_HEAD), 0, route_get_health, NULL},
    {"/get_transfer_engine_info", M(HTTP_GET) | M(HTTP_HEAD), 0, route_get_info, NULL},
    {"/register_transfer_engine_info", M(HTTP_PUT) | M(HTTP_POST), ROUTE_MUTATING,
     route_put_register, NULL},
    {"/ranks", M(HTTP_GET) | M(HTTP_HEAD), 0, route_get_ranks, NULL},
    {"/transfer_engine_info", M(HTTP_DELETE), ROUTE_MUTATING, route_delete_info, NULL},
    {"/failures", M(HTTP_GET) | M(HTTP_HEAD), ROUTE_MAY_WAIT | ROUTE_SHARED, route_get_failures,
     NULL},
    {"/metrics", M(HTTP_GET) | M(HTTP_HEAD), ROUTE_WAITS_IF_STALE | ROUTE_SHARED, route_get_metrics,
     NULL},
    {"/cluster", M(HTTP_GET) | M(HTTP_HEAD), 0, route_get_cluster, NULL},
    {"/cluster/room_failure", M(HTTP_POST), ROUTE_MUTATING, route_post_room_push, NULL},
    {"/register_parallelism_config", M(HTTP_PUT) | M(HTTP_POST), ROUTE_MUTATING,
     route_put_parallelism, NULL},
    {"/get_parallelism_config", M(HTTP_GET) | M(HTTP_HEAD), 0, route_get_parallelism, NULL},
    {"/rooms/{room}", M(HTTP_GET) | M(HTTP_HEAD), ROUTE_MAY_WAIT, route_room, NULL},
    {"/rooms/{room}/failure", M(HTTP_PUT) | M(HTTP_POST), ROUTE_MUTATING, route_room_failure, NULL},
    /* sglang's PD bootstrap server (http_pd.h): a row per method, each
     * with its handler; other methods get aiohttp's own 405s (own_405).
     * Every handler takes the PD lock. */
    {"/route", M(HTTP_GET), ROUTE_MAY_WAIT | ROUTE_OWN_405 | ROUTE_SHARED, route_pd_get_route,
     route_pd_route_405},
    {"/route", M(HTTP_PUT), ROUTE_MUTATING | ROUTE_OWN_405, route_pd_put_route, NULL},
    {"/register_dp_rank", M(HTTP_POST), ROUTE_MUTATING | ROUTE_OWN_405, route_pd_register_dp_rank,
     route_pd_post_405},
    {"/query_dp_ranks", M(HTTP_POST), ROUTE_MAY_WAIT | ROUTE_OWN_405 | ROUTE_READS_ONLY,
     route_pd_query_dp_ranks, route_pd_post_405},
};

#define ROUTES_N (sizeof route_table / sizeof route_table[0])

const struct route *routes_table(size_t *count)
{
    *count = ROUTES_N;
    return route_table;
}

/* ---- metrics labels, from the table's rows -------------------------------- */

/* A route's label is its pattern ("/rooms/{room}/failure"): one per path,
 * whatever its methods, so no path is counted as another's. */

_Static_assert(1 + ROUTES_N <= MR_MAX, "more route labels than metrics.h's MR_MAX counters");

static const char *labels[1 + ROUTES_N]; /* [0] "other", then one per path */
static unsigned label_of_entry[ROUTES_N];
static unsigned nlabels;
static pthread_once_t labels_once = PTHREAD_ONCE_INIT;

static void labels_init(void)
{
    labels[MR_OTHER] = "other";
    nlabels = 1;
    for (size_t i = 0; i < ROUTES_N; i++) {
        const char *l = route_table[i].pattern;
        unsigned j = 1;
        while (j < nlabels && strcmp(labels[j], l))
            j++;
        if (j == nlabels)
            labels[nlabels++] = l;
        label_of_entry[i] = j;
    }
}

unsigned routes_label_count(void)
{
    pthread_once(&labels_once, labels_init);
    return nlabels;
}

const char *routes_label(unsigned i)
{
    pthread_once(&labels_once, labels_init);
    return i < nlabels ? labels[i] : labels[MR_OTHER];
}

/* One segment of a path (raw) against one of a pattern: a literal equals
 * the segment once decoded; "{name}" takes any non-empty segment, decoded into
 * m (its length past ROUTE_ARG_MAX only counted). */
static int segment_matches(const char *pat, size_t plen, const char *seg, size_t slen,
                           struct route_match *m)
{
    char dec[ROUTE_ARG_MAX + 1];
    long dlen = slen <= ROUTE_ARG_MAX * 3 ? pct_decode(NULL, seg, slen, 0) : (long)slen;
    if (dlen < 0)
        return 0; /* cannot happen: the parser checked every escape */
    if (plen >= 2 && pat[0] == '{' && pat[plen - 1] == '}') {
        if (dlen == 0)
            return 0;
        m->arg_len = (size_t)dlen;
        if ((size_t)dlen <= ROUTE_ARG_MAX) {
            pct_decode(m->arg, seg, slen, 0);
            m->arg[dlen] = '\0';
        }
        return 1;
    }
    if ((size_t)dlen != plen || plen > ROUTE_ARG_MAX)
        return 0;
    pct_decode(dec, seg, slen, 0);
    return !memcmp(dec, pat, plen);
}

/* The one path matcher: path (raw, as received) split at '/' first, each
 * segment decoded alone (RFC 3986 2.2, 7.3), so "%2F" is data inside a
 * segment and never a separator: /rooms/5%2Ffailure is the room
 * "5/failure", not the failure route. */
static int path_matches(const char *pat, const char *path, size_t len, struct route_match *m)
{
    if (!len || path[0] != '/')
        return 0;
    const char *pe = pat + strlen(pat), *end = path + len;
    pat++, path++;
    for (;;) {
        const char *ps = memchr(pat, '/', (size_t)(pe - pat));
        const char *ss = memchr(path, '/', (size_t)(end - path));
        size_t plen = ps ? (size_t)(ps - pat) : (size_t)(pe - pat);
        size_t slen = ss ? (size_t)(ss - path) : (size_t)(end - path);
        if (!segment_matches(pat, plen, path, slen, m))
            return 0;
        if (!ps || !ss)
            return !ps && !ss;
        pat = ps + 1, path = ss + 1;
    }
}

static int method_allowed(const struct route *rt, int method)
{
    return method >= 0 && method < 64 && (rt->methods & M(method));
}

/* The route of a raw path and method: the first entry of the path that
 * accepts the method (*method_ok 1), else the path's first entry
 * (*method_ok 0: a 405, or the handler's own), else NULL (404). */
static const struct route *route_find(const char *path, size_t len, int method,
                                      struct route_match *m, int *method_ok)
{
    const struct route *first = NULL;
    for (size_t i = 0; i < sizeof route_table / sizeof route_table[0]; i++) {
        const struct route *rt = &route_table[i];
        if (first && strcmp(rt->pattern, first->pattern))
            continue; /* entries of one path are only looked at once it matched */
        if (!first && !path_matches(rt->pattern, path, len, m))
            continue;
        if (!first)
            first = rt;
        if (method_allowed(rt, method)) {
            *method_ok = 1;
            return rt;
        }
    }
    *method_ok = 0;
    return first;
}

unsigned routes_label_of(const char *path, size_t len)
{
    struct route_match m;
    int ok;
    pthread_once(&labels_once, labels_init);
    const struct route *rt = route_find(path, len, -1, &m, &ok);
    return rt ? label_of_entry[rt - route_table] : MR_OTHER;
}

/* The path routes match: as received, or the decoded one of a request
 * built by hand (raw_path NULL). */
static void route_path(const struct http_req *req, const char **p, size_t *n)
{
    *p = req->raw_path ? req->raw_path : req->path;
    *n = req->raw_path ? req->raw_path_len : req->path_len;
}

/* Runs on a helper thread, never on the loop: every mutating route, those
 * that may wait for a lock, and /metrics when its rooms figures must be
 * read (metrics.h); lookups, /ranks and /health never lock. */
static int may_wait(struct routes *r, const struct route *rt)
{
    if (rt->flags & (ROUTE_MUTATING | ROUTE_MAY_WAIT))
        return 1;
    if (rt->flags & ROUTE_WAITS_IF_STALE)
        return !metrics_rooms_fresh((struct metrics *)r->metrics, r->seg);
    return 0;
}

/* "Allow: GET, HEAD\r\n" for rt's methods. */
static void allow_header(const struct route *rt, char *buf, size_t cap)
{
    static const int order[] = {HTTP_GET, HTTP_HEAD, HTTP_PUT, HTTP_POST, HTTP_DELETE};
    size_t n = (size_t)snprintf(buf, cap, "Allow:");
    const char *sep = " ";
    uint64_t methods = 0;
    for (size_t i = 0; i < sizeof route_table / sizeof route_table[0]; i++)
        if (!strcmp(route_table[i].pattern, rt->pattern))
            methods |= route_table[i].methods;
    for (size_t i = 0; i < sizeof order / sizeof order[0] && n < cap; i++)
        if (methods & M(order[i])) {
            n += (size_t)snprintf(buf + n, cap - n, "%s%s", sep,
                                  http_method_str((enum http_method)order[i]));
            sep = ", ";
        }
    if (n < cap)
        snprintf(buf + n, cap - n, "\r\n");
}

/* A known path with trailing slashes ("/get_transfer_engine_info/",
 * "/rooms/42//"): 307 to the path without them, query kept, as Starlette's
 * redirect_slashes answers (it strips every trailing slash, and redirects
 * only when what is left is a route; requests and curl -L follow it,
 * repeating method and body).  Returns 1 when answered. */
static int redirect_slash(const struct http_req *req, struct buf *out)
{
    const char *path;
    size_t n;
    route_path(req, &path, &n);
    if (n < 2 || path[n - 1] != '/')
        return 0;
    while (n && path[n - 1] == '/')
        n--;
    struct route_match m;
    int ok;
    const struct route *rt = route_find(path, n, req->method, &m, &ok);
    if (!rt || (rt->flags & ROUTE_OWN_405)) /* sglang's PD server redirects nothing */
        return 0;
    char loc[512];
    int w = snprintf(loc, sizeof loc, "Location: %.*s%s%.*s\r\n", (int)n, path,
                     req->query_len ? "?" : "", (int)req->query_len, req->query ? req->query : "");
    if (w < 0 || (size_t)w >= sizeof loc)
        return 0; /* too long to redirect: let it 404 */
    resp_send(out, req, 307, CT_JSON, "", 0, loc);
    return 1;
}

enum route_rc routes_dispatch(struct routes *r, struct route_slot *s, const struct http_req *req,
                              struct buf *out)
{
    const char *path;
    size_t n;
    route_path(req, &path, &n);
    int ok;
    s->shared = 0;
    const struct route *rt = route_find(path, n, req->method, &r->match, &ok);
    if (!rt) {
        if (!redirect_slash(req, out))
            resp_detail(out, req, 404, "Not Found", NULL);
        return ROUTE_DONE;
    }
    if (!ok && rt->own_405) /* the row's own 405 (no lock: on the loop) */
        return rt->own_405(r, s, req, out);
    if (!ok) {
        char allow[64];
        allow_header(rt, allow, sizeof allow);
        resp_detail(out, req, 405, "Method Not Allowed", allow);
        return ROUTE_DONE;
    }
    /* Before anything else, ROUTE_DEFER included: the helper thread
     * never sees an unauthenticated body (and never reads the token). */
    if (!r->on_worker && (rt->flags & ROUTE_MUTATING) && unauthorized(r, req, out))
        return ROUTE_DONE;
    if (!r->on_worker && may_wait(r, rt)) {
        s->shared = (rt->flags & ROUTE_SHARED) != 0;
        return ROUTE_DEFER;
    }
    return rt->fn(r, s, req, out);
}

int routes_create(struct routes **out, kvc_segment *seg)
{
    kvc_segment_info si;
    if (kvc_segment_stat(seg, &si))
        return -1;
    struct routes *r = calloc(1, sizeof *r);
    if (!r)
        return -1;
    r->seg = seg;
    r->max_ranks = si.max_ranks;
    r->list = calloc(si.max_ranks ? si.max_ranks : 1, sizeof *r->list);
    r->failures = calloc(ROUTES_FAILURES_MAX, sizeof *r->failures);
    r->cache = calloc(ANSWER_CACHE_SLOTS, sizeof *r->cache);
    if (!r->list || !r->failures || !r->cache) {
        free(r->list);
        free(r->failures);
        free(r->cache);
        free(r);
        return -1;
    }
    *out = r;
    return 0;
}

/* Does req (method, path) need the token?  The table's flag says. */
static int needs_token(const struct http_req *req)
{
    const char *path;
    size_t n;
    struct route_match m;
    int ok;
    route_path(req, &path, &n);
    const struct route *rt = route_find(path, n, req->method, &m, &ok);
    return rt && ok && (rt->flags & ROUTE_MUTATING);
}

int routes_head_check(void *arg, const struct http_req *req)
{
    struct routes *r = arg;
    enum auth_result rc = token_check(r, req);
    if (!needs_token(req)) /* a read: allowed; trusted only with the token */
        return rc == AUTH_ALLOW ? 0 : HEAD_UNTRUSTED;
    if (rc == AUTH_ALLOW)
        return 0;
    if (log_enabled(LOG_DEBUG)) /* never the header itself */
        log_event(LOG_DEBUG, "unauthorized", "method=%s path=\"%.*s\" reason=%s body=unread",
                  http_method_str((enum http_method)req->method),
                  (int)(req->path_len > 200 ? 200 : req->path_len), req->path,
                  auth_result_name(rc));
    return 401;
}

void routes_deferred(struct routes *r, const struct http_req *req, struct buf *out)
{
    struct route_slot none = {0}; /* no deferred route parks */
    enum route_rc rc = routes_dispatch(r, &none, req, out);
    if (rc != ROUTE_DONE) /* cannot happen: a clone never defers or parks */
        resp_detail(out, req, 500, "Internal error: request could not be run", NULL);
    route_slot_free(&none);
}

int routes_clone(const struct routes *r, struct routes **out)
{
    if (routes_create(out, r->seg))
        return -1;
    (*out)->auth = r->auth;
    (*out)->metrics = r->metrics;
    (*out)->cluster = r->cluster;
    (*out)->on_worker = 1;
    return 0;
}

void routes_set_ops(struct routes *r, const struct auth *auth, const struct metrics *m)
{
    r->auth = auth;
    r->metrics = m;
}

void routes_set_cluster(struct routes *r, struct cluster *c) { r->cluster = c; }

void routes_batch(struct routes *r, uint64_t n) { r->batch = n; }

kvc_segment *routes_segment(const struct routes *r) { return r->seg; }

struct cluster *routes_cluster(const struct routes *r) { return r->cluster; }

void routes_destroy(struct routes *r)
{
    if (!r)
        return;
    free(r->list);
    free(r->failures);
    kvc_rank_info_free(&r->scratch);
    buf_free(&r->body);
    for (int i = 0; r->cache && i < ANSWER_CACHE_SLOTS; i++)
        shared_body_unref(r->cache[i].body);
    shared_body_unref(r->ranks);
    shared_body_unref(r->memo[0]);
    shared_body_unref(r->memo[1]);
    free(r->cache);
    free(r);
}

void route_slot_done(struct route_slot *s)
{
    if (s->ri.info_cap > RI_KEEP)
        kvc_rank_info_free(&s->ri);
}

void route_slot_free(struct route_slot *s) { kvc_rank_info_free(&s->ri); }
