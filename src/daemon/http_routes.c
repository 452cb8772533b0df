/*
 * http_routes.c - kvcoordd's routes.  Handlers call the public kvc_* API
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
 *     waited for up to N ms (clamped to 60000) before the 404.  The wait
 *     parks the connection; the event loop keeps serving others.
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
#include "http_routes.h"

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
    int on_worker;               /* a helper thread's clone: runs what the loop defers */
    struct route_match match;    /* the "{}" segment of the route being run */
};

/* The last answer to GET /get_transfer_engine_info of a rank (its headers'
 * extension lines and body), valid while the rank table's change epoch is
 * the one read before the lookup it came from: any registration,
 * withdrawal, mirror or recovery bumps the epoch, so a hit is an answer
 * the lookup would give now, without copying the info out of the segment
 * again.  Direct-mapped by rank (a rank evicts another with the same slot);
 * bodies up to ANSWER_CACHE_MAX only, so the cache stays under 4 MiB.
 * Touched by the loop thread only (lookups are never deferred). */
#define ANSWER_CACHE_SLOTS 64
#define ANSWER_CACHE_MAX (64 * 1024)

struct cached_answer {
    int valid;
    uint32_t rank, epoch;
    char extra[64 + 2 * KVC_ORIGIN_MAX];
    struct buf body;
};

#define ROUTES_FAILURES_DEFAULT 100
#define ROUTES_FAILURES_MAX KVC_FAILURE_RING

#define M(m) (UINT64_C(1) << (m))

/* ---- helpers ---------------------------------------------------------- */

static void detailf(struct buf *out, const struct http_req *req, int status, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static void detailf(struct buf *out, const struct http_req *req, int status, const char *fmt, ...)
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
static int lib_status(kvc_err e)
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
static int role_value(const char *v, char *role)
{
    if (strlen(v) > KVC_ROLE_NAME_MAX || kvc_role_check(v) != KVC_OK)
        return -1;
    snprintf(role, KVC_ROLE_NAME_MAX + 1, "%s", v);
    return 0;
}

/* Read rank (required), role (optional: "" when absent) and wait_ms
 * (optional, 0 when absent) from the query; on a bad one the 400 is
 * written and -1 returned. */
static int rank_params(const struct http_req *req, struct buf *out, uint32_t *rank, char *role,
                       uint32_t *wait_ms)
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
    if (want[0].too_long || parse_uint(rv, INT32_MAX, &v)) {
        resp_detail(out, req, 400, "Invalid rank parameter", NULL);
        return -1;
    }
    *rank = (uint32_t)v;
    role[0] = '\0';
    if (want[1].found && (want[1].too_long || role_value(ov, role))) {
        resp_detail(out, req, 400, "Invalid role parameter", NULL);
        return -1;
    }
    if (!wait_ms)
        return 0;
    *wait_ms = 0;
    if (want[2].found) {
        if (want[2].too_long || parse_uint(wv, UINT64_MAX, &v)) {
            resp_detail(out, req, 400, "Invalid wait_ms parameter", NULL);
            return -1;
        }
        *wait_ms = v > ROUTES_MAX_WAIT_MS ? ROUTES_MAX_WAIT_MS : (uint32_t)v;
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
static int answer_fits(const struct route_slot *s, const struct http_req *req, struct buf *out,
                       size_t len)
{
    size_t used = s->answer_used, max = s->answer_max;
    if (!resp_has_body(req) || len <= ROUTES_SMALL_ANSWER || !max || !used ||
        len <= max - (used < max ? used : max))
        return 1;
    detailf(out, req, 503,
            "Server busy: answers not yet read by their clients (%zu bytes) leave no room in "
            "the answer budget (%zu bytes, --max-answer-bytes) for this one (%zu bytes)",
            used, max, len);
    return 0;
}

/* ---- GET /health -------------------------------------------------------- */

static enum route_rc get_health(struct routes *r, struct route_slot *s, const struct http_req *req,
                                struct buf *out)
{
    (void)r, (void)s;
    resp_ok(out, req);
    return ROUTE_DONE;
}

/* ---- GET /get_transfer_engine_info --------------------------------------- */

/* The answer, built by concatenation: the stored weights_info_dict text is
 * appended verbatim (never re-parsed), session_id JSON-escaped. */
static const char info_p1[] = "{\"rank\":",
                  info_p2[] = ",\"remote_instance_transfer_engine_info\":[\"", info_p3[] = "\",",
                  info_p4[] = "]}";

/* The body length of ri's answer. */
static size_t info_len(const kvc_rank_info *ri)
{
    char num[20];
    return sizeof info_p1 - 1 + u64_to_dec(num, ri->rank) + sizeof info_p2 - 1 +
           json_escape_len(ri->session_id, strlen(ri->session_id)) + sizeof info_p3 - 1 +
           ri->info_len + sizeof info_p4 - 1;
}

static void write_info(struct buf *out, const struct http_req *req, const kvc_rank_info *ri,
                       struct cached_answer *cache, uint32_t epoch)
{
    const char *p1 = info_p1, *p2 = info_p2, *p3 = info_p3, *p4 = info_p4;
    char num[20], extra[64 + 2 * KVC_ORIGIN_MAX];
    size_t nlen = u64_to_dec(num, ri->rank);
    size_t sid_len = strlen(ri->session_id);
    size_t clen = info_len(ri);
    if (ri->origin[0])
        snprintf(extra, sizeof extra,
                 "X-Kvcoord-Generation: %" PRIu64 "\r\nX-Kvcoord-Origin: %s\r\n"
                 "X-Kvcoord-Origin-Generation: %" PRIu64 "\r\n",
                 ri->generation, ri->origin, ri->origin_generation);
    else
        snprintf(extra, sizeof extra, "X-Kvcoord-Generation: %" PRIu64 "\r\n", ri->generation);
    resp_head(out, req, 200, CT_JSON, clen, extra);
    char *start = resp_has_body(req) ? buf_space(out, clen) : NULL;
    if (cache && clen <= ANSWER_CACHE_MAX && (start || !resp_has_body(req))) {
        memcpy(cache->extra, extra, sizeof extra);
        cache->rank = ri->rank;
        cache->valid = 0; /* until the body is in */
    }
    if (!start)
        return;
    char *p = start;
    memcpy(p, p1, sizeof info_p1 - 1), p += sizeof info_p1 - 1;
    memcpy(p, num, nlen), p += nlen;
    memcpy(p, p2, sizeof info_p2 - 1), p += sizeof info_p2 - 1;
    p = json_escape(p, ri->session_id, sid_len);
    memcpy(p, p3, sizeof info_p3 - 1), p += sizeof info_p3 - 1;
    memcpy(p, ri->info, ri->info_len), p += ri->info_len;
    memcpy(p, p4, sizeof info_p4 - 1), p += sizeof info_p4 - 1;
    buf_commit(out, (size_t)(p - start));
    if (cache && clen <= ANSWER_CACHE_MAX) {
        buf_reset(&cache->body);
        buf_append(&cache->body, start, clen);
        cache->epoch = epoch;
        cache->valid = !cache->body.oom;
    }
}

/* Answer from the cache when it holds rank's current answer; 1 if so. */
static int cached_info(struct routes *r, const struct http_req *req, struct buf *out, uint32_t rank,
                       uint32_t epoch)
{
    struct cached_answer *a = r->cache ? &r->cache[rank % ANSWER_CACHE_SLOTS] : NULL;
    if (!a || !a->valid || a->rank != rank || a->epoch != epoch)
        return 0;
    resp_head(out, req, 200, CT_JSON, a->body.len, a->extra);
    if (resp_has_body(req))
        buf_append(out, a->body.p, a->body.len);
    return 1;
}

/* " (role R)" for a named role, "" for the default one. */
static const char *role_suffix(const char *role, char *buf, size_t cap)
{
    if (!role[0] || !strcmp(role, KVC_DEFAULT_ROLE))
        return "";
    snprintf(buf, cap, " (role %s)", role);
    return buf;
}

/* " (withdrawn: <note>)" for a withdrawn entry's 404, or " (<note>)" when
 * the note already says so ("withdrawn over HTTP ...", "withdrawn on node
 * B"), so the detail does not read "withdrawn: withdrawn ...". */
static const char *withdrawn_suffix(const char *note, char *buf, size_t cap)
{
    if (!note[0])
        snprintf(buf, cap, " (withdrawn)");
    else if (!strncmp(note, "withdrawn", strlen("withdrawn")))
        snprintf(buf, cap, " (%s)", note);
    else
        snprintf(buf, cap, " (withdrawn: %s)", note);
    return buf;
}

static void write_lookup_error(struct buf *out, const struct http_req *req, uint32_t rank,
                               const char *role, kvc_err e, const kvc_rank_info *ri)
{
    char rs[KVC_ROLE_NAME_MAX + 16], ws[KVC_NOTE_MAX + 16];
    if (e == KVC_E_NOENT || e == KVC_E_CAPACITY)
        detailf(out, req, 404, "No transfer engine info for rank %u%s", rank,
                role_suffix(role, rs, sizeof rs));
    else if (e == KVC_E_WITHDRAWN)
        detailf(out, req, 404, "No transfer engine info for rank %u%s%s", rank,
                role_suffix(role, rs, sizeof rs), withdrawn_suffix(ri->note, ws, sizeof ws));
    else
        detailf(out, req, lib_status(e), "Lookup of rank %u failed: %s", rank, kvc_last_error());
}

/* One lookup of the slot's rank; parks when allowed and the rank is absent. */
static enum route_rc lookup_once(struct routes *r, struct route_slot *s, const struct http_req *req,
                                 struct buf *out, int may_park)
{
    /* No lost wake: a registration landing after this lookup wakes the rank
     * watch (rank_watch.h), which has the loop re-check every parked one.
     * The epoch is read before the lookup: a cached answer is used only
     * while it is unchanged. */
    uint32_t epoch = kvc_rank_epoch(r->seg);
    int plain = !s->park_role[0] || !strcmp(s->park_role, KVC_DEFAULT_ROLE);
    if (plain && cached_info(r, req, out, s->park_rank, epoch))
        return ROUTE_DONE;
    kvc_err e = kvc_role_lookup(r->seg, s->park_role, s->park_rank, &s->ri);
    if (e == KVC_OK && !answer_fits(s, req, out, info_len(&s->ri)))
        return ROUTE_DONE;
    if (e == KVC_OK) {
        write_info(out, req, &s->ri,
                   plain && r->cache ? &r->cache[s->park_rank % ANSWER_CACHE_SLOTS] : NULL, epoch);
        return ROUTE_DONE;
    }
    if (may_park && (e == KVC_E_NOENT || e == KVC_E_WITHDRAWN))
        return ROUTE_PARK;
    write_lookup_error(out, req, s->park_rank, s->park_role, e, &s->ri);
    return ROUTE_DONE;
}

static enum route_rc get_info(struct routes *r, struct route_slot *s, const struct http_req *req,
                              struct buf *out)
{
    if (rank_params(req, out, &s->park_rank, s->park_role, &s->park_wait_ms))
        return ROUTE_DONE;
    return lookup_once(r, s, req, out, s->park_wait_ms > 0);
}

enum route_rc routes_resume(struct routes *r, struct route_slot *s, const struct http_req *req,
                            struct buf *out, int expired)
{
    return lookup_once(r, s, req, out, !expired);
}

/* ---- PUT /register_transfer_engine_info ---------------------------------- */

static int bad_field(struct buf *out, const struct http_req *req, const char *field,
                     const char *why)
{
    if (why)
        detailf(out, req, 400, "Invalid field '%s': %s", field, why);
    else
        detailf(out, req, 400, "Missing field '%s'", field);
    return -1;
}

/* The members of a registration body the scanner locates (json_scan.h);
 * the indexes name them below. */
enum { W_RANK, W_TP_RANK, W_TEI, W_SID, W_WID, W_ROLE, W_PCFG, W_COUNT };
static const struct kvc_json_watch register_watch[W_COUNT] = {
    [W_RANK] = {.parent = -1, .key = "rank"},
    [W_TP_RANK] = {.parent = -1, .key = "tp_rank"},
    [W_TEI] = {.parent = -1, .key = "transfer_engine_info"},
    [W_SID] = {.parent = W_TEI, .key = "session_id"},
    [W_WID] = {.parent = W_TEI, .key = "weights_info_dict"},
    [W_ROLE] = {.parent = -1, .key = "role"},
    [W_PCFG] = {.parent = -1, .key = "parallelism_config"}, /* its own route */
};

/* The rank of a registration: "rank", else "tp_rank" (rank 0 is valid). */
static int register_rank(struct routes *r, const struct http_req *req, struct buf *out,
                         const struct kvc_json_watch *w, uint32_t *rank)
{
    const char *name = "rank";
    const struct kvc_json_watch *jr = &w[W_RANK];
    if (jr->type == KVC_JSON_NONE)
        jr = &w[W_TP_RANK], name = "tp_rank";
    if (jr->type == KVC_JSON_NONE) {
        resp_detail(out, req, 400, "Missing field 'rank' (or 'tp_rank')", NULL);
        return -1;
    }
    int negative = 1;
    uint64_t v = 0;
    if (jr->type == KVC_JSON_INTEGER)
        kvc__json_integer(req->body, jr->start, jr->end, &negative, &v);
    if (negative)
        return bad_field(out, req, name, "must be a non-negative integer");
    if (v >= UINT32_MAX) { /* beyond what the library takes */
        detailf(out, req, 400,
                "Failed to register rank %" PRIu64 ": rank %" PRIu64
                " exceeds the segment's max ranks (%u)",
                v, v, r->max_ranks);
        return -1;
    }
    *rank = (uint32_t)v;
    return 0;
}

/* Check transfer_engine_info; on success sid holds the decoded session_id,
 * else the 400 naming the field is written and -1 returned. */
static int register_info(const struct http_req *req, struct buf *out,
                         const struct kvc_json_watch *w, char sid[KVC_SESSION_ID_MAX + 1])
{
    if (w[W_TEI].type == KVC_JSON_NONE)
        return bad_field(out, req, "transfer_engine_info", NULL);
    if (w[W_TEI].type != KVC_JSON_OBJECT)
        return bad_field(out, req, "transfer_engine_info", "must be an object");
    const struct kvc_json_watch *js = &w[W_SID];
    if (js->type == KVC_JSON_NONE)
        return bad_field(out, req, "transfer_engine_info.session_id", NULL);
    if (js->type != KVC_JSON_STRING || js->end - js->start == 2)
        return bad_field(out, req, "transfer_engine_info.session_id", "must be a non-empty string");
    int nul = 0;
    long n = kvc__json_string(req->body, js->start, js->end, sid, KVC_SESSION_ID_MAX + 1, &nul);
    if (n < 0)
        return bad_field(out, req, "transfer_engine_info.session_id", "longer than 255 bytes");
    if (n == 0)
        return bad_field(out, req, "transfer_engine_info.session_id", "must be a non-empty string");
    if (nul)
        return bad_field(out, req, "transfer_engine_info.session_id", "must not contain NUL");
    if (w[W_WID].type == KVC_JSON_NONE)
        return bad_field(out, req, "transfer_engine_info.weights_info_dict", NULL);
    if (w[W_WID].type != KVC_JSON_OBJECT)
        return bad_field(out, req, "transfer_engine_info.weights_info_dict", "must be an object");
    return 0;
}

/* The role of a registration: "role" in the body, else ?role= in the
 * query, else "" (the default role).  On a bad one the 400 is written. */
static int register_role(const struct http_req *req, struct buf *out,
                         const struct kvc_json_watch *w, char *role)
{
    const struct kvc_json_watch *jr = &w[W_ROLE];
    char ov[KVC_ROLE_NAME_MAX + 2];
    role[0] = '\0';
    if (jr->type != KVC_JSON_NONE) {
        int nul = 0;
        long n = jr->type == KVC_JSON_STRING
                     ? kvc__json_string(req->body, jr->start, jr->end, ov, sizeof ov, &nul)
                     : -1;
        if (n < 0 || nul || role_value(ov, role))
            return bad_field(out, req, "role",
                             "must be a role name: at most 31 bytes of [A-Za-z0-9._-]");
        return 0;
    }
    struct query_param want[1] = {{"role", ov, sizeof ov, 0, 0}};
    int qrc = query_parse(req->query, req->query_len, want, 1);
    if (qrc < 0) {
        resp_detail(out, req, 400, query_error_text(qrc), NULL);
        return -1;
    }
    if (want[0].found && (want[0].too_long || role_value(ov, role))) {
        resp_detail(out, req, 400, "Invalid role parameter", NULL);
        return -1;
    }
    return 0;
}

/* Store a validated registration: weights_info_dict's bytes exactly as
 * they were sent (validated, never re-encoded); writes the answer. */
static void register_store(struct routes *r, const struct http_req *req, struct buf *out,
                           uint32_t rank, const char *role, const char *sid,
                           const struct kvc_json_watch *wid)
{
    const char *text = req->body + wid->start;
    size_t len = wid->end - wid->start;
    uint64_t gen = 0;
    kvc_err e = kvc_role_register_validated(
        r->seg, role, rank, sid, text, len,
        wid->members > UINT32_MAX ? UINT32_MAX : (uint32_t)wid->members, &gen);
    if (e) {
        char rs[KVC_ROLE_NAME_MAX + 16];
        detailf(out, req, lib_status(e), "Failed to register rank %u%s: %s", rank,
                role_suffix(role, rs, sizeof rs), kvc_last_error());
        return;
    }
    /* At debug: the daemon's rank table watch logs every registration
     * once at info, whoever made it (seg_events.c). */
    log_event(LOG_DEBUG, "http_register",
              "rank=%u session_id=\"%s\" generation=%" PRIu64 " bytes=%zu", rank, sid, gen, len);
    resp_ok(out, req);
}

/* The request body as JSON, or NULL after answering 400 with jansson's
 * reason and position.  \u0000 is parsed (JSON_ALLOW_NUL) so that the
 * caller refuses it naming the field, as registration does, instead of
 * jansson's "\u0000 is not allowed without JSON_ALLOW_NUL". */
static json_t *parse_body(const struct http_req *req, struct buf *out)
{
    json_error_t jerr;
    json_t *root = json_loadb(req->body, req->body_len, JSON_DECODE_ANY | JSON_ALLOW_NUL, &jerr);
    if (!root)
        detailf(out, req, 400, "Invalid JSON at line %d, column %d: %s", jerr.line, jerr.column,
                jerr.text);
    return root;
}

/* Validate (one pass of the strict scanner, no tree), check and store a
 * registration; writes the answer. */
static void register_now(struct routes *r, const struct http_req *req, struct buf *out)
{
    struct kvc_json_watch w[W_COUNT];
    memcpy(w, register_watch, sizeof w);
    struct kvc_json_root root;
    struct kvc_json_error jerr;
    uint32_t rank;
    char sid[KVC_SESSION_ID_MAX + 1], role[KVC_ROLE_NAME_MAX + 1];
    if (kvc__json_scan(req->body, req->body_len, w, W_COUNT, &root, &jerr))
        detailf(out, req, 400, "Invalid JSON at line %u, column %u: %s", jerr.line, jerr.column,
                jerr.text);
    else if (root.type != KVC_JSON_OBJECT)
        resp_detail(out, req, 400, "Request body must be a JSON object", NULL);
    else if (!register_rank(r, req, out, w, &rank) && !register_info(req, out, w, sid) &&
             !register_role(req, out, w, role))
        register_store(r, req, out, rank, role, sid, &w[W_WID]);
}

static enum route_rc put_register(struct routes *r, struct route_slot *s,
                                  const struct http_req *req, struct buf *out)
{
    (void)s;
    register_now(r, req, out);
    return ROUTE_DONE;
}

/* ---- PUT /register_parallelism_config, GET /get_parallelism_config ---------- */

/* Store a checked parallelism config (its bytes as sent, validated by the
 * scanner); writes the answer. */
static void parallelism_store(struct routes *r, const struct http_req *req, struct buf *out,
                              uint32_t rank, const char *role, const struct kvc_json_watch *cfg)
{
    uint64_t gen = 0;
    kvc_err e = kvc_parallelism_register(r->seg, role, rank, req->body + cfg->start,
                                         cfg->end - cfg->start, &gen);
    char rs[KVC_ROLE_NAME_MAX + 16];
    if (e)
        detailf(out, req, lib_status(e),
                "Failed to register the parallelism config of rank %u%s: %s", rank,
                role_suffix(role, rs, sizeof rs), kvc_last_error());
    else
        resp_ok(out, req);
}

/* Configs are small (a few hundred bytes); stored under the ranks lock, so
 * run on a helper thread like every mutating route. */
static enum route_rc put_parallelism(struct routes *r, struct route_slot *s,
                                     const struct http_req *req, struct buf *out)
{
    (void)s;
    struct kvc_json_watch w[W_COUNT];
    memcpy(w, register_watch, sizeof w);
    struct kvc_json_root root;
    struct kvc_json_error jerr;
    uint32_t rank;
    char role[KVC_ROLE_NAME_MAX + 1];
    if (kvc__json_scan(req->body, req->body_len, w, W_COUNT, &root, &jerr))
        detailf(out, req, 400, "Invalid JSON at line %u, column %u: %s", jerr.line, jerr.column,
                jerr.text);
    else if (root.type != KVC_JSON_OBJECT)
        resp_detail(out, req, 400, "Request body must be a JSON object", NULL);
    else if (register_rank(r, req, out, w, &rank) || register_role(req, out, w, role))
        ; /* answered */
    else if (w[W_PCFG].type == KVC_JSON_NONE)
        bad_field(out, req, "parallelism_config", NULL);
    else if (w[W_PCFG].type != KVC_JSON_OBJECT)
        bad_field(out, req, "parallelism_config", "must be an object");
    else
        parallelism_store(r, req, out, rank, role, &w[W_PCFG]);
    return ROUTE_DONE;
}

static enum route_rc get_parallelism(struct routes *r, struct route_slot *s,
                                     const struct http_req *req, struct buf *out)
{
    uint32_t rank;
    char role[KVC_ROLE_NAME_MAX + 1], rs[KVC_ROLE_NAME_MAX + 16], gen[64 + 2 * KVC_ORIGIN_MAX];
    if (rank_params(req, out, &rank, role, NULL))
        return ROUTE_DONE;
    kvc_err e = kvc_parallelism_lookup(r->seg, role, rank, &s->ri);
    if (e == KVC_OK) {
        if (s->ri.origin[0]) /* mirrored from another node (--etcd), as on the info lookup */
            snprintf(gen, sizeof gen,
                     "X-Kvcoord-Generation: %" PRIu64 "\r\nX-Kvcoord-Origin: %s\r\n"
                     "X-Kvcoord-Origin-Generation: %" PRIu64 "\r\n",
                     s->ri.generation, s->ri.origin, s->ri.origin_generation);
        else
            snprintf(gen, sizeof gen, "X-Kvcoord-Generation: %" PRIu64 "\r\n", s->ri.generation);
        resp_send(out, req, 200, CT_JSON, s->ri.info, s->ri.info_len, gen);
    } else if (e == KVC_E_NOENT || e == KVC_E_CAPACITY) {
        detailf(out, req, 404, "No parallelism config for rank %u%s", rank,
                role_suffix(role, rs, sizeof rs));
    } else if (e == KVC_E_WITHDRAWN) {
        char ws[KVC_NOTE_MAX + 16];
        detailf(out, req, 404, "No parallelism config for rank %u%s%s", rank,
                role_suffix(role, rs, sizeof rs), withdrawn_suffix(s->ri.note, ws, sizeof ws));
    } else {
        detailf(out, req, lib_status(e), "Lookup of the parallelism config of rank %u failed: %s",
                rank, kvc_last_error());
    }
    return ROUTE_DONE;
}

/* ---- GET /ranks ----------------------------------------------------------- */

static void append_rank(struct buf *b, const kvc_rank_info *ri, int first)
{
    buf_puts(b, first ? "{\"rank\":" : ",{\"rank\":");
    buf_putu64(b, ri->rank);
    buf_puts(b, ",\"session_id\":\"");
    json_escape_append(b, ri->session_id, strlen(ri->session_id));
    buf_puts(b, "\",\"generation\":");
    buf_putu64(b, ri->generation);
    buf_puts(b, ",\"entries\":");
    buf_putu64(b, ri->entries);
    buf_puts(b, ",\"info_bytes\":");
    buf_putu64(b, ri->info_len);
    buf_puts(b, ",\"registered_ns\":");
    buf_putu64(b, ri->registered_ns);
    buf_puts(b, ",\"pid\":");
    buf_putu64(b, (uint64_t)(ri->pid > 0 ? ri->pid : 0));
    if (ri->origin[0]) { /* origin names are [A-Za-z0-9._-]: nothing to escape */
        buf_puts(b, ",\"origin\":\"");
        buf_puts(b, ri->origin);
        buf_puts(b, "\",\"origin_generation\":");
        buf_putu64(b, ri->origin_generation);
    }
    buf_puts(b, "}");
}

static enum route_rc get_ranks(struct routes *r, struct route_slot *s, const struct http_req *req,
                               struct buf *out)
{
    kvc_segment_info si;
    size_t count = 0;
    kvc_err e = kvc_segment_stat(r->seg, &si);
    if (!e)
        e = kvc_rank_list(r->seg, r->list, r->max_ranks, &count, 0);
    if (e) {
        detailf(out, req, lib_status(e), "Listing ranks failed: %s", kvc_last_error());
        return ROUTE_DONE;
    }
    struct buf *b = &r->body;
    buf_reset(b);
    buf_puts(b, "{\"ranks\":[");
    int first = 1;
    for (size_t i = 0; i < count && i < r->max_ranks; i++) {
        /* The list carries no info size: look the rank up (it may have been
         * withdrawn since the list was taken; then it is left out). */
        if (kvc_rank_lookup(r->seg, r->list[i].rank, &r->scratch) == KVC_OK) {
            append_rank(b, &r->scratch, first);
            first = 0;
        }
    }
    buf_puts(b, "],\"world_size\":");
    buf_putu64(b, si.world_size);
    buf_puts(b, "}");
    kvc_rank_info_free(&r->scratch);
    if (b->oom)
        resp_detail(out, req, 500, "Out of memory listing ranks", NULL);
    else if (answer_fits(s, req, out, b->len))
        resp_send(out, req, 200, CT_JSON, b->p, b->len, NULL);
    buf_trim(b, RI_KEEP);
    return ROUTE_DONE;
}

/* ---- DELETE /transfer_engine_info ------------------------------------------ */

static enum route_rc delete_info(struct routes *r, struct route_slot *s, const struct http_req *req,
                                 struct buf *out)
{
    (void)s;
    uint32_t rank;
    char role[KVC_ROLE_NAME_MAX + 1], rs[KVC_ROLE_NAME_MAX + 16];
    if (rank_params(req, out, &rank, role, NULL))
        return ROUTE_DONE;
    kvc_err e = kvc_role_withdraw(r->seg, role, rank, WITHDRAW_NOTE);
    if (e == KVC_E_NOENT || e == KVC_E_CAPACITY) {
        detailf(out, req, 404, "No transfer engine info for rank %u%s", rank,
                role_suffix(role, rs, sizeof rs));
    } else if (e) {
        detailf(out, req, lib_status(e), "Withdrawing rank %u failed: %s", rank, kvc_last_error());
    } else {
        log_event(LOG_DEBUG, "http_withdraw", "rank=%u", rank);
        resp_ok(out, req);
    }
    return ROUTE_DONE;
}

/* ---- rooms ---------------------------------------------------------------- */

#define ROOM_ID_RULE "must be a decimal integer in 0..9223372036854775807"

/* Parse a room id: decimal digits only, at most 2^63 - 1 (ids are 63-bit
 * and written as JSON integers, which then fit an int64). */
static int parse_room_id(const char *s, size_t n, uint64_t *out)
{
    char digits[24];
    if (n == 0 || n >= sizeof digits)
        return -1;
    memcpy(digits, s, n);
    digits[n] = '\0';
    return parse_uint(digits, INT64_MAX, out);
}

/* The optional ?rank=R of the room routes: *asking = R, or -1 when absent.
 * On a bad one the 400 is written and -1 returned. */
static int asking_rank(const struct http_req *req, struct buf *out, struct query_param *extra,
                       int32_t *asking)
{
    char rv[24];
    struct query_param want[2] = {{"rank", rv, sizeof rv, 0, 0}};
    size_t n = 1;
    if (extra)
        want[n++] = *extra;
    int qrc = query_parse(req->query, req->query_len, want, n);
    if (qrc < 0) {
        resp_detail(out, req, 400, query_error_text(qrc), NULL);
        return -1;
    }
    if (extra)
        *extra = want[1];
    *asking = -1;
    uint64_t v;
    if (want[0].found) {
        if (want[0].too_long || parse_uint(rv, INT32_MAX, &v)) {
            resp_detail(out, req, 400, "Invalid rank parameter", NULL);
            return -1;
        }
        *asking = (int32_t)v;
    }
    return 0;
}

static void put_bool(struct buf *b, int v) { buf_puts(b, v ? "true" : "false"); }

static void put_i64(struct buf *b, int64_t v)
{
    if (v < 0) {
        buf_puts(b, "-");
        buf_putu64(b, (uint64_t)0 - (uint64_t)v);
    } else {
        buf_putu64(b, (uint64_t)v);
    }
}

/* A failure record as JSON; is_from_another_rank relative to asking (-1:
 * an outside observer, for whom every record is from another rank). */
static void append_failure(struct buf *b, const kvc_failure_info *f, int32_t asking)
{
    char text[KVC_REASON_MAX + 256];
    kvc_failure_info seen = *f;
    seen.is_from_another_rank = asking < 0 || (uint32_t)asking != f->origin_rank;
    kvc_failure_text(&seen, text, sizeof text);
    buf_puts(b, "{\"room\":");
    buf_putu64(b, f->room);
    buf_puts(b, ",\"origin_rank\":");
    buf_putu64(b, f->origin_rank);
    buf_puts(b, ",\"origin_pid\":");
    put_i64(b, f->origin_pid);
    buf_puts(b, ",\"code\":");
    put_i64(b, f->code);
    buf_puts(b, ",\"reason\":\"");
    json_escape_append(b, f->reason, strlen(f->reason));
    buf_puts(b, "\",\"time_ns\":");
    buf_putu64(b, f->time_ns);
    buf_puts(b, ",\"is_from_another_rank\":");
    put_bool(b, seen.is_from_another_rank);
    buf_puts(b, ",\"text\":\"");
    json_escape_append(b, text, strlen(text));
    buf_puts(b, "\"}");
}

static void append_state(struct buf *b, int state)
{
    buf_puts(b, "\"state\":\"");
    buf_puts(b, kvc_poll_name((kvc_poll)state));
    buf_puts(b, "\",\"state_value\":");
    buf_putu64(b, (uint64_t)state);
}

static void append_room(struct buf *b, const kvc_room_info *ri, int32_t asking)
{
    buf_puts(b, "{\"room\":");
    buf_putu64(b, ri->room);
    buf_puts(b, ",");
    append_state(b, ri->state);
    buf_puts(b, ",\"participants\":");
    buf_putu64(b, ri->participants);
    buf_puts(b, ",\"joined\":");
    buf_putu64(b, ri->joined);
    buf_puts(b, ",\"released\":");
    buf_putu64(b, ri->released);
    buf_puts(b, ",\"opened_ns\":");
    buf_putu64(b, ri->opened_ns);
    buf_puts(b, ",\"updated_ns\":");
    buf_putu64(b, ri->updated_ns);
    buf_puts(b, ",\"local\":[");
    for (uint32_t i = 0; i < ri->participants && i < KVC_ROOM_MAX_PARTICIPANTS; i++) {
        buf_puts(b, i ? ",{\"rank\":" : "{\"rank\":");
        buf_putu64(b, i);
        buf_puts(b, ",");
        if (ri->local[i] < 0)
            buf_puts(b, "\"state\":null,\"state_value\":null");
        else
            append_state(b, ri->local[i]);
        buf_puts(b, "}");
    }
    buf_puts(b, "],\"failure\":");
    if (ri->has_failure)
        append_failure(b, &ri->failure, asking);
    else
        buf_puts(b, "null");
    buf_puts(b, "}");
}

/* Send r->body as the 200 answer (or a 500 if building it ran out of memory). */
static void send_body(struct routes *r, const struct http_req *req, struct buf *out)
{
    struct buf *b = &r->body;
    if (b->oom)
        resp_detail(out, req, 500, "Out of memory building the answer", NULL);
    else
        resp_send(out, req, 200, CT_JSON, b->p, b->len, NULL);
    buf_trim(b, RI_KEEP);
}

static void get_room(struct routes *r, const struct http_req *req, struct buf *out, uint64_t room)
{
    int32_t asking;
    if (asking_rank(req, out, NULL, &asking))
        return;
    kvc_room_info ri;
    kvc_err e = kvc_room_get(r->seg, room, asking, &ri);
    if (e == KVC_E_NOENT) {
        detailf(out, req, 404, "No room %" PRIu64, room);
        return;
    }
    if (e) {
        detailf(out, req, lib_status(e), "Reading room %" PRIu64 " failed: %s", room,
                kvc_last_error());
        return;
    }
    buf_reset(&r->body);
    append_room(&r->body, &ri, asking);
    send_body(r, req, out);
}

/* The body of PUT /rooms/{room}/failure; on a bad one the 400 naming the
 * field is written and -1 returned.  *reason points into root. */
static int failure_body(json_t *root, const struct http_req *req, struct buf *out, uint32_t *rank,
                        const char **reason, int32_t *code)
{
    if (!json_is_object(root)) {
        resp_detail(out, req, 400, "Request body must be a JSON object", NULL);
        return -1;
    }
    json_t *jr = json_object_get(root, "rank");
    if (!jr)
        return bad_field(out, req, "rank", NULL);
    if (!json_is_integer(jr) || json_integer_value(jr) < 0 || json_integer_value(jr) > INT32_MAX)
        return bad_field(out, req, "rank", "must be an integer in 0..2147483647");
    *rank = (uint32_t)json_integer_value(jr);
    json_t *js = json_object_get(root, "reason");
    if (!js)
        return bad_field(out, req, "reason", NULL);
    if (!json_is_string(js))
        return bad_field(out, req, "reason", "must be a string");
    if (strlen(json_string_value(js)) != json_string_length(js))
        return bad_field(out, req, "reason", "must not contain NUL");
    *reason = json_string_value(js);
    *code = 0;
    json_t *jc = json_object_get(root, "code");
    if (jc && !json_is_null(jc)) {
        if (!json_is_integer(jc) || json_integer_value(jc) < INT32_MIN ||
            json_integer_value(jc) > INT32_MAX)
            return bad_field(out, req, "code", "must be a 32-bit integer");
        *code = (int32_t)json_integer_value(jc);
    }
    return 0;
}

static void put_room_failure(struct routes *r, const struct http_req *req, struct buf *out,
                             uint64_t room)
{
    json_t *root = parse_body(req, out);
    if (!root)
        return;
    uint32_t rank = 0;       /* set by failure_body when it returns 0; */
    const char *reason = ""; /* initialised for gcc -Os, which cannot see that */
    int32_t code = 0;
    if (failure_body(root, req, out, &rank, &reason, &code)) {
        json_decref(root);
        return;
    }
    int kept = 0;
    kvc_err e = kvc_room_fail(r->seg, room, rank, code, reason, &kept);
    if (e == KVC_E_INVAL) { /* the room id is valid: rank is not a participant */
        bad_field(out, req, "rank", kvc_last_error());
        json_decref(root);
        return;
    }
    if (e) {
        detailf(out, req, lib_status(e), "Recording a failure of room %" PRIu64 " failed: %s", room,
                kvc_last_error());
        json_decref(root);
        return;
    }
    if (kept) /* the failure record itself is logged by seg_events.c */
        log_event(LOG_DEBUG, "http_room_failure", "room=%" PRIu64 " rank=%u code=%d reason=\"%s\"",
                  room, rank, (int)code, reason);
    json_decref(root);
    /* The record kept (this call's or an earlier one), as the rank sees it. */
    kvc_room_info ri;
    e = kvc_room_get(r->seg, room, (int32_t)rank, &ri);
    struct buf *b = &r->body;
    buf_reset(b);
    buf_puts(b, "{\"kept\":");
    put_bool(b, kept);
    buf_puts(b, ",\"failure\":");
    if (!e && ri.has_failure)
        append_failure(b, &ri.failure, (int32_t)rank);
    else
        buf_puts(b, "null"); /* reclaimed meanwhile */
    buf_puts(b, "}");
    send_body(r, req, out);
}

/* GET /rooms/{room} and PUT /rooms/{room}/failure: the segment is the
 * room id (a bad one is a 400).  Both take the rooms lock: deferred to a
 * helper thread once known good (the table's flags). */
static int room_of(struct routes *r, const struct http_req *req, struct buf *out, uint64_t *room)
{
    const struct route_match *m = &r->match;
    if (m->arg_len > ROUTE_ARG_MAX || parse_room_id(m->arg, m->arg_len, room)) {
        resp_detail(out, req, 400, "Invalid room id: " ROOM_ID_RULE, NULL);
        return -1;
    }
    return 0;
}

static enum route_rc room_route(struct routes *r, struct route_slot *s, const struct http_req *req,
                                struct buf *out)
{
    (void)s;
    uint64_t room;
    if (!room_of(r, req, out, &room))
        get_room(r, req, out, room);
    return ROUTE_DONE;
}

static enum route_rc room_failure_route(struct routes *r, struct route_slot *s,
                                        const struct http_req *req, struct buf *out)
{
    (void)s;
    uint64_t room;
    if (!room_of(r, req, out, &room))
        put_room_failure(r, req, out, room);
    return ROUTE_DONE;
}

/* ---- GET /failures --------------------------------------------------------- */

static enum route_rc get_failures(struct routes *r, struct route_slot *s,
                                  const struct http_req *req, struct buf *out)
{
    (void)s;
    char lv[24];
    struct query_param lim = {"limit", lv, sizeof lv, 0, 0};
    int32_t asking;
    if (asking_rank(req, out, &lim, &asking))
        return ROUTE_DONE;
    uint64_t limit = ROUTES_FAILURES_DEFAULT;
    if (lim.found && (lim.too_long || parse_uint(lv, UINT64_MAX, &limit))) {
        resp_detail(out, req, 400, "Invalid limit parameter", NULL);
        return ROUTE_DONE;
    }
    if (limit > ROUTES_FAILURES_MAX)
        limit = ROUTES_FAILURES_MAX;
    size_t count = 0;
    kvc_err e = limit ? kvc_failures_recent(r->seg, r->failures, limit, &count) : KVC_OK;
    if (e) {
        detailf(out, req, lib_status(e), "Reading failure records failed: %s", kvc_last_error());
        return ROUTE_DONE;
    }
    struct buf *b = &r->body;
    buf_reset(b);
    buf_puts(b, "{\"failures\":[");
    for (size_t i = 0; i < count; i++) {
        if (i)
            buf_puts(b, ",");
        append_failure(b, &r->failures[i], asking);
    }
    buf_puts(b, "],\"count\":");
    buf_putu64(b, count);
    buf_puts(b, "}");
    send_body(r, req, out);
    return ROUTE_DONE;
}

/* ---- GET /metrics ------------------------------------------------------------ */

static enum route_rc get_metrics(struct routes *r, struct route_slot *s, const struct http_req *req,
                                 struct buf *out)
{
    (void)s;
    struct buf *b = &r->body;
    buf_reset(b);
    int rc = metrics_render(b, r->seg, r->metrics);
    if (!rc && r->cluster) {
        cluster_render_metrics(r->cluster, b);
        rc = b->oom ? -1 : 0;
    }
    if (rc)
        resp_detail(out, req, 500, "Out of memory rendering metrics", NULL);
    else
        resp_send(out, req, 200, METRICS_CONTENT_TYPE, b->p, b->len, NULL);
    buf_trim(b, RI_KEEP);
    return ROUTE_DONE;
}

/* ---- GET /cluster ---------------------------------------------------------- */

static enum route_rc get_cluster(struct routes *r, struct route_slot *s, const struct http_req *req,
                                 struct buf *out)
{
    (void)s;
    if (!r->cluster) {
        resp_detail(out, req, 404, "Cluster view off (kvcoordd runs without --etcd)", NULL);
        return ROUTE_DONE;
    }
    struct buf *b = &r->body;
    buf_reset(b);
    cluster_render_json(r->cluster, b);
    if (b->oom)
        resp_detail(out, req, 500, "Out of memory rendering the cluster view", NULL);
    else
        resp_send(out, req, 200, CT_JSON, b->p, b->len, NULL);
    buf_trim(b, RI_KEEP);
    return ROUTE_DONE;
}

/* ---- the route table, and dispatch ------------------------------------------ */

/* Every route, and what it is.  A route's flags decide the token check
 * and the thread (routes_dispatch), from this table alone: a route added
 * here with ROUTE_MUTATING is checked and deferred without another line
 * (test_http_routes fails if a route with a state-changing method lacks
 * it, or if any route changes the segment without the token). */
static const struct route route_table[] = {
    {"/health", M(HTTP_GET) | M(HTTP_HEAD), 0, get_health},
    {"/get_transfer_engine_info", M(HTTP_GET) | M(HTTP_HEAD), 0, get_info},
    {"/register_transfer_engine_info", M(HTTP_PUT) | M(HTTP_POST), ROUTE_MUTATING, put_register},
    {"/ranks", M(HTTP_GET) | M(HTTP_HEAD), 0, get_ranks},
    {"/transfer_engine_info", M(HTTP_DELETE), ROUTE_MUTATING, delete_info},
    {"/failures", M(HTTP_GET) | M(HTTP_HEAD), ROUTE_MAY_WAIT, get_failures},
    {"/metrics", M(HTTP_GET) | M(HTTP_HEAD), ROUTE_WAITS_IF_STALE, get_metrics},
    {"/cluster", M(HTTP_GET) | M(HTTP_HEAD), 0, get_cluster},
    {"/register_parallelism_config", M(HTTP_PUT) | M(HTTP_POST), ROUTE_MUTATING, put_parallelism},
    {"/get_parallelism_config", M(HTTP_GET) | M(HTTP_HEAD), 0, get_parallelism},
    {"/rooms/{}", M(HTTP_GET) | M(HTTP_HEAD), ROUTE_MAY_WAIT, room_route},
    {"/rooms/{}/failure", M(HTTP_PUT) | M(HTTP_POST), ROUTE_MUTATING, room_failure_route},
};

const struct route *routes_table(size_t *count)
{
    *count = sizeof route_table / sizeof route_table[0];
    return route_table;
}

/* One segment of a path (raw) against one of a pattern: a literal equals
 * the segment once decoded; "{}" takes any non-empty segment, decoded into
 * m (its length past ROUTE_ARG_MAX only counted). */
static int segment_matches(const char *pat, size_t plen, const char *seg, size_t slen,
                           struct route_match *m)
{
    char dec[ROUTE_ARG_MAX + 1];
    long dlen = slen <= ROUTE_ARG_MAX * 3 ? pct_decode(NULL, seg, slen, 0) : (long)slen;
    if (dlen < 0)
        return 0; /* cannot happen: the parser checked every escape */
    if (plen == 2 && pat[0] == '{' && pat[1] == '}') {
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

/* The route of a raw path, or NULL (404). */
static const struct route *route_find(const char *path, size_t len, struct route_match *m)
{
    for (size_t i = 0; i < sizeof route_table / sizeof route_table[0]; i++)
        if (path_matches(route_table[i].pattern, path, len, m))
            return &route_table[i];
    return NULL;
}

/* The path routes match: as received, or the decoded one of a request
 * built by hand (raw_path NULL). */
static void route_path(const struct http_req *req, const char **p, size_t *n)
{
    *p = req->raw_path ? req->raw_path : req->path;
    *n = req->raw_path ? req->raw_path_len : req->path_len;
}

static int method_allowed(const struct route *rt, int method)
{
    return method >= 0 && method < 64 && (rt->methods & M(method));
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
    for (size_t i = 0; i < sizeof order / sizeof order[0] && n < cap; i++)
        if (rt->methods & M(order[i])) {
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
    if (!route_find(path, n, &m))
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
    const struct route *rt = route_find(path, n, &r->match);
    if (!rt) {
        if (!redirect_slash(req, out))
            resp_detail(out, req, 404, "Not Found", NULL);
        return ROUTE_DONE;
    }
    if (!method_allowed(rt, req->method)) {
        char allow[64];
        allow_header(rt, allow, sizeof allow);
        resp_detail(out, req, 405, "Method Not Allowed", allow);
        return ROUTE_DONE;
    }
    /* Before anything else, ROUTE_DEFER included: the helper thread
     * never sees an unauthenticated body (and never reads the token). */
    if (!r->on_worker && (rt->flags & ROUTE_MUTATING) && unauthorized(r, req, out))
        return ROUTE_DONE;
    if (!r->on_worker && may_wait(r, rt))
        return ROUTE_DEFER;
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
    route_path(req, &path, &n);
    const struct route *rt = route_find(path, n, &m);
    return rt && method_allowed(rt, req->method) && (rt->flags & ROUTE_MUTATING);
}

int routes_head_check(void *arg, const struct http_req *req)
{
    struct routes *r = arg;
    if (!needs_token(req))
        return 0;
    enum auth_result rc = token_check(r, req);
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

void routes_destroy(struct routes *r)
{
    if (!r)
        return;
    free(r->list);
    free(r->failures);
    kvc_rank_info_free(&r->scratch);
    buf_free(&r->body);
    for (int i = 0; r->cache && i < ANSWER_CACHE_SLOTS; i++)
        buf_free(&r->cache[i].body);
    free(r->cache);
    free(r);
}

void route_slot_done(struct route_slot *s)
{
    if (s->ri.info_cap > RI_KEEP)
        kvc_rank_info_free(&s->ri);
}

void route_slot_free(struct route_slot *s) { kvc_rank_info_free(&s->ri); }
