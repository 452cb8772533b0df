/*
 * http_routes_register.c - kvcoordd's writes of the rank table: PUT
 * /register_transfer_engine_info, the parallelism configs (PUT
 * /register_parallelism_config, GET /get_parallelism_config) and DELETE
 * /transfer_engine_info.  Routes: http_routes.c.
 */
#include "http_routes_int.h"

#include <errno.h>
#include <signal.h>
#include <unistd.h>

/* ---- PUT /register_transfer_engine_info ---------------------------------- */

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

/* Field paths of the watches, for the 400 of a repeated one. */
static const char *const register_field[W_COUNT] = {
    [W_RANK] = "rank",
    [W_TP_RANK] = "tp_rank",
    [W_TEI] = "transfer_engine_info",
    [W_SID] = "transfer_engine_info.session_id",
    [W_WID] = "transfer_engine_info.weights_info_dict",
    [W_ROLE] = "role",
    [W_PCFG] = "parallelism_config",
};

/* A field kvcoordd reads occurs at most once: parsers disagree on which
 * occurrence of a repeated key counts (Python's json and FastAPI take the
 * last, others the first), so {"rank":9,"rank":0,...} would name one rank
 * to kvcoordd and another to a proxy or a log reader in front of it.
 * sglang's clients build bodies from dicts and never repeat a key.  On a
 * repeated one the 400 is written and -1 returned. */
static int register_unique(const struct http_req *req, struct buf *out,
                           const struct kvc_json_watch *w)
{
    for (int i = 0; i < W_COUNT; i++)
        if (w[i].seen > 1)
            return route_duplicate_field(out, req, register_field[i], w[i].seen);
    return 0;
}

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
        return route_bad_field(out, req, name, "must be a non-negative integer");
    if (v >= UINT32_MAX) { /* beyond what the library takes; its wording (kvc__rank_check) */
        route_detailf(out, req, 400,
                      "Failed to register rank %" PRIu64 ": rank %" PRIu64
                      " exceeds the segment's max ranks (%u; ranks are 0..%u)",
                      v, v, r->max_ranks, r->max_ranks - 1);
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
        return route_bad_field(out, req, "transfer_engine_info", NULL);
    if (w[W_TEI].type != KVC_JSON_OBJECT)
        return route_bad_field(out, req, "transfer_engine_info", "must be an object");
    const struct kvc_json_watch *js = &w[W_SID];
    if (js->type == KVC_JSON_NONE)
        return route_bad_field(out, req, "transfer_engine_info.session_id", NULL);
    if (js->type != KVC_JSON_STRING || js->end - js->start == 2)
        return route_bad_field(out, req, "transfer_engine_info.session_id",
                               "must be a non-empty string");
    int nul = 0;
    long n = kvc__json_string(req->body, js->start, js->end, sid, KVC_SESSION_ID_MAX + 1, &nul);
    if (n < 0)
        return route_bad_field(out, req, "transfer_engine_info.session_id",
                               "longer than 255 bytes");
    if (n == 0)
        return route_bad_field(out, req, "transfer_engine_info.session_id",
                               "must be a non-empty string");
    if (nul)
        return route_bad_field(out, req, "transfer_engine_info.session_id", "must not contain NUL");
    if (w[W_WID].type == KVC_JSON_NONE)
        return route_bad_field(out, req, "transfer_engine_info.weights_info_dict", NULL);
    if (w[W_WID].type != KVC_JSON_OBJECT)
        return route_bad_field(out, req, "transfer_engine_info.weights_info_dict",
                               "must be an object");
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
        if (n < 0 || nul || route_role_value(ov, role))
            return route_bad_field(out, req, "role",
                                   "must be a role name: at most 31 bytes of [A-Za-z0-9._-]");
        return 0;
    }
    struct query_param want[1] = {{"role", ov, sizeof ov, 0, 0}};
    int qrc = query_parse(req->query, req->query_len, want, 1);
    if (qrc < 0) {
        resp_detail(out, req, 400, query_error_text(qrc), NULL);
        return -1;
    }
    if (want[0].found && (want[0].too_long || route_role_value(ov, role))) {
        resp_detail(out, req, 400, "Invalid role parameter", NULL);
        return -1;
    }
    return 0;
}

/* The pid of the process that registered rank (under role) itself, when
 * it is alive: a worker through the library, not this daemon (an HTTP
 * registration's pid) nor a mirror of another node; else 0.  Its entry is
 * left in r->scratch.  (A pid reused since is a false alarm in a log
 * line, never a refusal.) */
static int32_t registrant_alive(struct routes *r, const char *role, uint32_t rank)
{
    kvc_err e = kvc_role_lookup(r->seg, role, rank, &r->scratch);
    kvc_rank_info_free(&r->scratch); /* its info is not needed: no buffer kept */
    if (e != KVC_OK)
        return 0;
    int32_t pid = r->scratch.pid;
    if (pid <= 0 || pid == (int32_t)getpid() || r->scratch.origin[0])
        return 0;
    return kill(pid, 0) == 0 || errno == EPERM ? pid : 0;
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
    int32_t live = registrant_alive(r, role, rank);
    kvc_err e = kvc_role_register_validated(
        r->seg, role, rank, sid, text, len,
        wid->members > UINT32_MAX ? UINT32_MAX : (uint32_t)wid->members, &gen);
    if (e) {
        char rs[KVC_ROLE_NAME_MAX + 16];
        route_detailf(out, req, route_lib_status(e), "Failed to register rank %u%s: %s", rank,
                      route_role_suffix(role, rs, sizeof rs), kvc_last_error());
        return;
    }
    if (live > 0)
        log_event(
            LOG_WARN, "http_register_replaces_live",
            "rank=%u role=%s pid=%d session_id_was=\"%s\" session_id=\"%s\" generation=%" PRIu64
            " note=\"rank %u was registered by process %d, which is alive: this HTTP "
            "registration replaces it, and that process's exit will no longer withdraw "
            "the rank\"",
            rank, role[0] ? role : KVC_DEFAULT_ROLE, (int)live, r->scratch.session_id, sid, gen,
            rank, (int)live);
    /* At debug: the daemon's rank table watch logs every registration
     * once at info, whoever made it (seg_events.c). */
    log_event(LOG_DEBUG, "http_register",
              "rank=%u session_id=\"%s\" generation=%" PRIu64 " bytes=%zu", rank, sid, gen, len);
    resp_ok(out, req);
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
        route_detailf(out, req, 400, "Invalid JSON at line %u, column %u: %s", jerr.line,
                      jerr.column, jerr.text);
    else if (root.type != KVC_JSON_OBJECT)
        resp_detail(out, req, 400, "Request body must be a JSON object", NULL);
    else if (!register_unique(req, out, w) && !register_rank(r, req, out, w, &rank) &&
             !register_info(req, out, w, sid) && !register_role(req, out, w, role))
        register_store(r, req, out, rank, role, sid, &w[W_WID]);
}

enum route_rc route_put_register(struct routes *r, struct route_slot *s, const struct http_req *req,
                                 struct buf *out)
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
        route_detailf(out, req, route_lib_status(e),
                      "Failed to register the parallelism config of rank %u%s: %s", rank,
                      route_role_suffix(role, rs, sizeof rs), kvc_last_error());
    else
        resp_ok(out, req);
}

/* Configs are small (a few hundred bytes); stored under the ranks lock, so
 * run on a helper thread like every mutating route. */
enum route_rc route_put_parallelism(struct routes *r, struct route_slot *s,
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
        route_detailf(out, req, 400, "Invalid JSON at line %u, column %u: %s", jerr.line,
                      jerr.column, jerr.text);
    else if (root.type != KVC_JSON_OBJECT)
        resp_detail(out, req, 400, "Request body must be a JSON object", NULL);
    else if (register_unique(req, out, w) || register_rank(r, req, out, w, &rank) ||
             register_role(req, out, w, role))
        ; /* answered */
    else if (w[W_PCFG].type == KVC_JSON_NONE)
        route_bad_field(out, req, "parallelism_config", NULL);
    else if (w[W_PCFG].type != KVC_JSON_OBJECT)
        route_bad_field(out, req, "parallelism_config", "must be an object");
    else
        parallelism_store(r, req, out, rank, role, &w[W_PCFG]);
    return ROUTE_DONE;
}

enum route_rc route_get_parallelism(struct routes *r, struct route_slot *s,
                                    const struct http_req *req, struct buf *out)
{
    uint32_t rank;
    char role[KVC_ROLE_NAME_MAX + 1], rs[KVC_ROLE_NAME_MAX + 16], gen[64 + 2 * KVC_ORIGIN_MAX];
    if (route_rank_params(req, out, &rank, role, NULL))
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
        route_detailf(out, req, 404, "No parallelism config for rank %u%s", rank,
                      route_role_suffix(role, rs, sizeof rs));
    } else if (e == KVC_E_WITHDRAWN) {
        char ws[KVC_NOTE_MAX + 16];
        route_detailf(out, req, 404, "No parallelism config for rank %u%s%s", rank,
                      route_role_suffix(role, rs, sizeof rs),
                      route_withdrawn_suffix(s->ri.note, ws, sizeof ws));
    } else {
        route_detailf(out, req, route_lib_status(e),
                      "Lookup of the parallelism config of rank %u failed: %s", rank,
                      kvc_last_error());
    }
    return ROUTE_DONE;
}

/* ---- DELETE /transfer_engine_info ------------------------------------------ */

enum route_rc route_delete_info(struct routes *r, struct route_slot *s, const struct http_req *req,
                                struct buf *out)
{
    (void)s;
    uint32_t rank;
    char role[KVC_ROLE_NAME_MAX + 1], rs[KVC_ROLE_NAME_MAX + 16];
    if (route_rank_params(req, out, &rank, role, NULL))
        return ROUTE_DONE;
    kvc_err e = kvc_role_withdraw(r->seg, role, rank, WITHDRAW_NOTE);
    if (e == KVC_E_NOENT || e == KVC_E_CAPACITY) {
        route_detailf(out, req, 404, "No transfer engine info for rank %u%s", rank,
                      route_role_suffix(role, rs, sizeof rs));
    } else if (e) {
        route_detailf(out, req, route_lib_status(e), "Withdrawing rank %u failed: %s", rank,
                      kvc_last_error());
    } else {
        log_event(LOG_DEBUG, "http_withdraw", "rank=%u", rank);
        resp_ok(out, req);
    }
    return ROUTE_DONE;
}
