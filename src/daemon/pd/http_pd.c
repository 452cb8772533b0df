/*
 * http_pd.c - the routes of sglang's PD bootstrap server
 * (CommonKVBootstrapServer, python/sglang/srt/disaggregation/common/
 * conn.py), served from the segment's PD tables (kvcoord/pd.h):
 *
 *   PUT  /route            a prefill rank registers; 200 text "OK"
 *   GET  /route?prefill_dp_rank=&prefill_cp_rank=&target_tp_rank=&target_pp_rank=
 *                          200 {"rank_ip", "rank_port"}; all four -1: the
 *                          topology; 503 text until every rank registered;
 *                          404 text for an absent rank; 400 text when a
 *                          parameter is missing or empty.  With --etcd, a
 *                          node without a table of its own answers from the
 *                          one other node's table the cluster view mirrors
 *                          (cluster_pd.c), or the one node= names (an
 *                          extension); 409 when several and none named
 *   other methods on /route  405 text "Method not allowed" (typed
 *                          application/json, as sglang's handler answers)
 *   POST /register_dp_rank {"bootstrap_room", "dp_rank"}: 200 text "OK"
 *   POST /query_dp_ranks   {"bootstrap_rooms": [...]}: 200 {"<room>": dp}
 *   other methods on those two: aiohttp's 405 "405: Method Not Allowed"
 *
 * Bodies, status codes and content types are sglang's (its aiohttp
 * answers: "text/plain; charset=utf-8", "application/json; charset=utf-8",
 * json.dumps separators ", " and ": ").  Where sglang's server answers a
 * malformed request with 500 (a KeyError or ValueError in the handler),
 * these answer 400 {"detail": "..."} naming the field and store nothing
 * (docs/http-api.md lists each).  The registering process, when it is at
 * the other end of a loopback connection, owns the entry (proc_sockets.h):
 * its end withdraws it.
 */
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <http_parser.h>

#include "cluster.h"
#include "http_pd.h"
#include "http_routes.h"
#include "http_resp.h"
#include "kvcoord/pd.h"
#include "log.h"
#include "pd_mirror.h"
#include "proc_sockets.h"
#include "pyint.h"
#include "query.h"

#define CT_TEXT_AIO "text/plain; charset=utf-8"
#define CT_JSON_AIO "application/json; charset=utf-8"

/* Longest query parameter value of GET /route, decoded (docs/http-api.md). */
#define PD_QUERY_VALUE_MAX 255

static void text(struct buf *out, const struct http_req *req, int status, const char *ctype,
                 const char *extra, const char *fmt, ...) __attribute__((format(printf, 6, 7)));

static void text(struct buf *out, const struct http_req *req, int status, const char *ctype,
                 const char *extra, const char *fmt, ...)
{
    char body[1024];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(body, sizeof body, fmt, ap);
    va_end(ap);
    if (n < 0)
        n = 0;
    if ((size_t)n >= sizeof body)
        n = (int)sizeof body - 1;
    resp_send(out, req, status, ctype, body, (size_t)n, extra);
}

static void detail(struct buf *out, const struct http_req *req, int status, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static void detail(struct buf *out, const struct http_req *req, int status, const char *fmt, ...)
{
    char d[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(d, sizeof d, fmt, ap);
    va_end(ap);
    resp_detail(out, req, status, d, status == 503 ? "Retry-After: 1\r\n" : NULL);
}

static int lib_status(kvc_err e)
{
    switch (e) {
    case KVC_E_INVAL: return 400;
    case KVC_E_FULL: return 507;
    case KVC_E_EXISTS: return 409; /* another prefill's topology is live */
    case KVC_E_BUSY: return 503;
    default: return 500;
    }
}

static void json_answer(struct buf *out, const struct http_req *req, json_t *v, const char *extra)
{
    char *s = v ? json_dumps(v, JSON_ENSURE_ASCII | JSON_PRESERVE_ORDER) : NULL;
    if (!s)
        detail(out, req, 500, "Out of memory building the answer");
    else
        resp_send(out, req, 200, CT_JSON_AIO, s, strlen(s), extra);
    free(s);
    json_decref(v);
}

/* The body as a JSON object, or NULL after answering 400. */
static json_t *body_object(const struct http_req *req, struct buf *out)
{
    json_error_t jerr;
    json_t *root = json_loadb(req->body ? req->body : "", req->body_len, JSON_DECODE_ANY, &jerr);
    if (!root) {
        detail(out, req, 400, "Invalid JSON at line %d, column %d: %s", jerr.line, jerr.column,
               jerr.text);
        return NULL;
    }
    if (!json_is_object(root)) {
        json_decref(root);
        detail(out, req, 400, "Request body must be a JSON object");
        return NULL;
    }
    return root;
}

/* A JSON value as sglang's int(data[...]) takes it (pyint.h, the one
 * rule): an integer; a real, truncated; true/false; a string of int()'s
 * text.  Returns KVC_PYINT_OK with *out set, KVC_PYINT_RANGE (beyond
 * int64) or KVC_PYINT_INVALID (null, an array, an object, a string int()
 * refuses, NaN). */
static int json_pyint(json_t *v, int64_t *out)
{
    switch (json_typeof(v)) {
    case JSON_INTEGER: *out = json_integer_value(v); return KVC_PYINT_OK;
    case JSON_REAL: return kvc_pyint_real(json_real_value(v), out);
    case JSON_TRUE: *out = 1; return KVC_PYINT_OK;
    case JSON_FALSE: *out = 0; return KVC_PYINT_OK;
    case JSON_STRING: return kvc_pyint_text(json_string_value(v), json_string_length(v), out);
    default: return KVC_PYINT_INVALID;
    }
}

/* An integer field: json_pyint() within lo..hi.  Returns 0, or -1 after
 * answering 400 naming the field (missing, not an integer by int()'s
 * rule, or out of lo..hi, the range said with the value). */
static int int_of(json_t *v, const char *field, int64_t lo, int64_t hi, int64_t *out,
                  const struct http_req *req, struct buf *o)
{
    int64_t x = 0;
    if (!v) {
        detail(o, req, 400, "Missing field '%s'", field);
        return -1;
    }
    int rc = json_pyint(v, &x);
    if (rc == KVC_PYINT_INVALID) {
        if (json_is_string(v))
            detail(o, req, 400, "Invalid field '%s': \"%.64s\" is not an integer", field,
                   json_string_value(v));
        else
            detail(o, req, 400, "Invalid field '%s': must be an integer", field);
        return -1;
    }
    if (rc == KVC_PYINT_RANGE || x < lo || x > hi) {
        if (rc == KVC_PYINT_RANGE)
            detail(o, req, 400, "Invalid field '%s': out of range %lld..%lld", field, (long long)lo,
                   (long long)hi);
        else
            detail(o, req, 400, "Invalid field '%s': %lld out of range %lld..%lld", field,
                   (long long)x, (long long)lo, (long long)hi);
        return -1;
    }
    *out = x;
    return 0;
}

/* ---- PUT /route ------------------------------------------------------- */

static const char *const dims[] = {
    "attn_tp_size", "attn_tp_rank", "attn_cp_size", "attn_cp_rank",   "attn_dp_size",
    "attn_dp_rank", "pp_size",      "pp_rank",      "system_dp_size", "system_dp_rank"};

/* Python's truthiness of a JSON value (bool(x) in sglang). */
static int truthy(json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_TRUE: return 1;
    case JSON_INTEGER: return json_integer_value(v) != 0;
    case JSON_REAL: return json_real_value(v) != 0.0;
    case JSON_STRING: return json_string_length(v) != 0;
    case JSON_ARRAY: return json_array_size(v) != 0;
    case JSON_OBJECT: return json_object_size(v) != 0;
    default: return 0;
    }
}

static int optional_string(json_t *root, const char *field, const char **out,
                           const struct http_req *req, struct buf *o)
{
    json_t *v = json_object_get(root, field);
    *out = NULL;
    if (!v || json_is_null(v))
        return 0;
    if (!json_is_string(v)) {
        detail(o, req, 400, "Invalid field '%s': must be a string or null", field);
        return -1;
    }
    *out = json_string_value(v);
    return 0;
}

static void put_route(kvc_segment *seg, const struct http_req *req, struct buf *out)
{
    json_t *root = body_object(req, out);
    if (!root)
        return;
    kvc_pd_registration r;
    memset(&r, 0, sizeof r);
    int32_t *fields[] = {&r.attn_tp_size,   &r.attn_tp_rank,  &r.attn_cp_size, &r.attn_cp_rank,
                         &r.attn_dp_size,   &r.attn_dp_rank,  &r.pp_size,      &r.pp_rank,
                         &r.system_dp_size, &r.system_dp_rank};
    int64_t x;
    for (size_t i = 0; i < sizeof dims / sizeof *dims; i++) {
        json_t *v = json_object_get(root, dims[i]);
        if (v && !json_is_integer(v)) {
            detail(out, req, 400, "Invalid field '%s': must be an integer", dims[i]);
            goto done;
        }
        /* sizes 1..KVC_PD_DIM_MAX, ranks 0..KVC_PD_DIM_MAX-1 (below their
         * size: checked by kvc_pd_register) */
        if (int_of(v, dims[i], i % 2 ? 0 : 1, i % 2 ? KVC_PD_DIM_MAX - 1 : KVC_PD_DIM_MAX, &x, req,
                   out))
            goto done;
        *fields[i] = (int32_t)x;
    }
    json_t *ip = json_object_get(root, "rank_ip");
    if (!ip) {
        detail(out, req, 400, "Missing field 'rank_ip'");
        goto done;
    }
    if (!json_is_string(ip)) {
        detail(out, req, 400, "Invalid field 'rank_ip': must be a string");
        goto done;
    }
    r.rank_ip = json_string_value(ip);
    if (int_of(json_object_get(root, "rank_port"), "rank_port", 1, 65535, &x, req, out))
        goto done;
    r.rank_port = (int32_t)x;
    if (int_of(json_object_get(root, "page_size"), "page_size", 1, INT32_MAX, &x, req, out))
        goto done;
    r.page_size = (int32_t)x;
    if (!json_object_get(root, "kv_cache_dtype")) {
        detail(out, req, 400, "Missing field 'kv_cache_dtype'");
        goto done;
    }
    if (optional_string(root, "kv_cache_dtype", &r.kv_cache_dtype, req, out))
        goto done;
    json_t *hp = json_object_get(root, "prefill_http_port");
    if (hp && !json_is_null(hp)) {
        if (int_of(hp, "prefill_http_port", 1, 65535, &x, req, out))
            goto done;
        r.has_prefill_http_port = 1;
        r.prefill_http_port = (int32_t)x;
    }
    const char *lbm;
    if (optional_string(root, "load_balance_method", &lbm, req, out))
        goto done;
    /* sglang: data.get("load_balance_method", "follow_bootstrap_room") ==
     * "follow_bootstrap_room" (an explicit null is not the default). */
    json_t *lv = json_object_get(root, "load_balance_method");
    r.follow_bootstrap_room = !lv || (lbm && !strcmp(lbm, "follow_bootstrap_room"));
    json_t *dsa = json_object_get(root, "enable_dsa_cache_layer_split");
    r.enable_dsa_cache_layer_split = dsa ? truthy(dsa) : 0;

    int32_t pid = 0;
    uint64_t start = 0;
    kvc_pd_owner owner = KVC_PD_OWNER_NONE;
    if (req->fd >= 0 && peer_process(req->fd, &pid, &start) == 0)
        owner = KVC_PD_OWNER_PID;
    kvc_err e = kvc_pd_register(seg, &r, owner, pid, start);
    if (e == KVC_E_INVAL)
        detail(out, req, 400, "Invalid registration: %s", kvc_last_error());
    else if (e)
        detail(out, req, lib_status(e), "%s", kvc_last_error());
    else {
        int32_t dp = r.system_dp_size == 1 ? r.attn_dp_rank : r.system_dp_rank;
        log_event(LOG_INFO, "pd_register",
                  "dp=%d cp=%d tp=%d pp=%d rank_ip=\"%s\" rank_port=%d pid=%d", (int)dp,
                  (int)r.attn_cp_rank, (int)r.attn_tp_rank, (int)r.pp_rank, r.rank_ip,
                  (int)r.rank_port, (int)pid);
        text(out, req, 200, CT_TEXT_AIO, NULL, "OK");
    }
done:
    json_decref(root);
}

/* ---- GET /route ------------------------------------------------------- */

/* The table a GET /route answers from: this node's segment, or another
 * node's mirrored by the cluster view (remote: its name in node, and
 * extra holds the X-Kvcoord-Origin header naming it). */
struct pd_source {
    kvc_segment *seg;
    struct pd_mirror *mirror;
    int remote;
    char node[PD_NODE_MAX + 1];
    char extra[PD_NODE_MAX + 32];
    kvc_pd_status st;
};

/* Why the table src answers from holds withdrawn entries, for the 503
 * text: " N entries withdrawn: <the latest one's note>" (the note the
 * table records, e.g. "its process 4242 exited with status 0"), with how
 * many of them share it when they differ; "" when none is withdrawn or the
 * entries cannot be read.  A mirrored table says what its node's does. */
static void withdrawn_why(const struct pd_source *src, char *why, size_t cap)
{
    why[0] = '\0';
    if (!src->st.withdrawn)
        return;
    kvc_pd_rank *all = malloc(KVC_PD_MAX_RANKS * sizeof *all);
    size_t n = 0;
    if (!all)
        return;
    if (src->remote)
        n = pd_mirror_ranks(src->mirror, src->node, all, KVC_PD_MAX_RANKS);
    else if (kvc_pd_list(src->seg, all, KVC_PD_MAX_RANKS, &n))
        n = 0;
    if (n > KVC_PD_MAX_RANKS)
        n = KVC_PD_MAX_RANKS;
    const kvc_pd_rank *last = NULL;
    size_t wd = 0, same = 0;
    for (size_t i = 0; i < n; i++)
        if (all[i].withdrawn && (!last || all[i].registered_ns > last->registered_ns))
            last = &all[i];
    for (size_t i = 0; last && i < n; i++)
        if (all[i].withdrawn) {
            wd++;
            same += !strcmp(all[i].note, last->note);
        }
    if (last && same == wd)
        snprintf(why, cap, " %zu %s withdrawn: %s.", wd, wd == 1 ? "entry" : "entries", last->note);
    else if (last)
        snprintf(why, cap, " %zu entries withdrawn; the latest %zu: %s.", wd, same, last->note);
    free(all);
}

/* sglang's 503 text, followed by why the table's entries were withdrawn
 * (a client reads the status, as sglang's decode does). */
static void not_ready(struct buf *out, const struct http_req *req, const struct pd_source *src)
{
    char why[KVC_NOTE_MAX + 96];
    withdrawn_why(src, why, sizeof why);
    text(out, req, 503, CT_TEXT_AIO, src->remote ? src->extra : NULL,
         "Prefill server not fully registered yet (%u workers registered).%s", src->st.registered,
         why);
}

static json_t *topology_json(const kvc_pd_status *st)
{
    json_t *o = json_object();
    if (!o)
        return NULL;
    json_object_set_new(o, "attn_tp_size", json_integer(st->attn_tp_size));
    json_object_set_new(o, "attn_cp_size", json_integer(st->attn_cp_size));
    json_object_set_new(o, "dp_size", json_integer(st->dp_size));
    json_object_set_new(o, "pp_size", json_integer(st->pp_size));
    json_object_set_new(o, "page_size",
                        st->has_page_size ? json_integer(st->page_size) : json_null());
    json_object_set_new(o, "kv_cache_dtype",
                        st->has_kv_cache_dtype ? json_string(st->kv_cache_dtype) : json_null());
    json_object_set_new(o, "follow_bootstrap_room", json_boolean(st->follow_bootstrap_room));
    json_object_set_new(o, "enable_dsa_cache_layer_split",
                        json_boolean(st->enable_dsa_cache_layer_split));
    json_object_set_new(o, "prefill_http_port",
                        st->has_prefill_http_port ? json_integer(st->prefill_http_port)
                                                  : json_null());
    /* The decode side's fields of sglang's PrefillServerInfo, unset. */
    static const char *const unset[] = {"target_tp_rank",        "target_tp_ranks",
                                        "target_cp_ranks",       "target_pp_ranks",
                                        "required_dst_info_num", "required_prefill_response_num"};
    for (size_t i = 0; i < sizeof unset / sizeof *unset; i++)
        json_object_set_new(o, unset[i], json_null());
    return o;
}

/* Choose the table (the rule of docs/http-api.md, "PD bootstrap across
 * nodes"): node= names one (this node's or a mirrored one); else this
 * node's when it has any entry (it serves a prefill, as sglang's own server
 * would); else the only table mirrored; else this node's (empty) one.
 * Returns 0, or -1 after answering (several tables and none named, an
 * unknown node, the library's trouble). */
static int pick_source(struct cluster *cluster, const char *node, struct pd_source *src,
                       const struct http_req *req, struct buf *out)
{
    kvc_err e = kvc_pd_status_get(src->seg, &src->st);
    if (e) {
        detail(out, req, lib_status(e), "%s", kvc_last_error());
        return -1;
    }
    src->mirror = cluster ? cluster_pd_mirror(cluster) : NULL;
    if (node && cluster && !strcmp(node, cluster_node_name(cluster)))
        return 0;
    if (!node && (src->st.has_topology || src->st.withdrawn || !src->mirror))
        return 0;
    char names[512] = "";
    kvc_pd_status rst;
    enum pd_pick p = src->mirror
                         ? pd_mirror_pick(src->mirror, node, &rst, src->node, names, sizeof names)
                         : PD_PICK_UNKNOWN;
    switch (p) {
    case PD_PICK_OK:
        src->remote = 1;
        src->st = rst;
        snprintf(src->extra, sizeof src->extra, "X-Kvcoord-Origin: %s\r\n", src->node);
        return 0;
    case PD_PICK_NONE: return 0;
    case PD_PICK_MANY:
        text(out, req, 409, CT_TEXT_AIO, NULL,
             "This node has no prefill table and several nodes of the cluster have one (%s): "
             "name one with &node=<name>.",
             names);
        return -1;
    default:
        if (!cluster)
            text(out, req, 404, CT_TEXT_AIO, NULL,
                 "No prefill table of node %s: this kvcoordd runs without --etcd.", node);
        else
            text(out, req, 404, CT_TEXT_AIO, NULL,
                 "No prefill table of node %s in the cluster view (tables mirrored: %s).", node,
                 names[0] ? names : "none");
        return -1;
    }
}

static void get_route(kvc_segment *seg, struct cluster *cluster, const struct http_req *req,
                      struct buf *out)
{
    /* aiohttp's request.query.get(): the first occurrence of a repeated
     * parameter; values up to PD_QUERY_VALUE_MAX bytes once decoded. */
    char v[5][PD_QUERY_VALUE_MAX + 1];
    struct query_param want[5] = {{"prefill_dp_rank", v[0], sizeof v[0], 0, 0},
                                  {"prefill_cp_rank", v[1], sizeof v[1], 0, 0},
                                  {"target_tp_rank", v[2], sizeof v[2], 0, 0},
                                  {"target_pp_rank", v[3], sizeof v[3], 0, 0},
                                  {"node", v[4], sizeof v[4], 0, 0}};
    int rc = query_parse_first(req->query ? req->query : "", req->query_len, want, 5);
    if (rc) {
        detail(out, req, 400, "%s", query_error_text(rc));
        return;
    }
    for (int i = 0; i < 4; i++)
        if (!want[i].found || !v[i][0]) {
            text(out, req, 400, CT_TEXT_AIO, NULL, "Missing inputs for bootstrap server.");
            return;
        }
    /* int(value) as sglang applies it (pyint.h); beyond int64 no rank
     * matches (404 once ready), as no key of sglang's table would. */
    int64_t k[4];
    int beyond = 0;
    for (int i = 0; i < 4; i++) {
        int prc = want[i].too_long ? KVC_PYINT_INVALID : kvc_pyint_text(v[i], strlen(v[i]), &k[i]);
        if (prc == KVC_PYINT_INVALID) {
            if (want[i].too_long)
                detail(out, req, 400, "Invalid parameter '%s': longer than %d bytes", want[i].name,
                       PD_QUERY_VALUE_MAX);
            else
                detail(out, req, 400, "Invalid parameter '%s': \"%.32s\" is not an integer",
                       want[i].name, v[i]);
            return;
        }
        beyond |= prc == KVC_PYINT_RANGE;
    }
    if (want[4].found && (want[4].too_long || !cluster_name_ok(v[4]))) {
        detail(out, req, 400,
               "Invalid parameter 'node': \"%.63s\" is not a node name (1..%d bytes of "
               "[A-Za-z0-9._-])",
               v[4], CLUSTER_NAME_MAX);
        return;
    }
    struct pd_source src = {.seg = seg};
    if (pick_source(cluster, want[4].found ? v[4] : NULL, &src, req, out))
        return;
    const char *extra = src.remote ? src.extra : NULL;
    if (!beyond && k[0] == -1 && k[1] == -1 && k[2] == -1 && k[3] == -1) {
        if (!src.st.ready)
            not_ready(out, req, &src);
        else
            json_answer(out, req, topology_json(&src.st), extra);
        return;
    }
    if (!src.st.ready) {
        not_ready(out, req, &src);
        return;
    }
    kvc_pd_rank pr;
    kvc_err e;
    if (beyond || k[0] < INT32_MIN || k[0] > INT32_MAX || k[1] < INT32_MIN || k[1] > INT32_MAX ||
        k[2] < INT32_MIN || k[2] > INT32_MAX || k[3] < INT32_MIN || k[3] > INT32_MAX)
        e = KVC_E_NOENT;
    else if (!src.remote)
        e = kvc_pd_lookup(seg, (int32_t)k[0], (int32_t)k[1], (int32_t)k[2], (int32_t)k[3], &pr);
    else if (pd_mirror_lookup(src.mirror, src.node, (int32_t)k[0], (int32_t)k[1], (int32_t)k[2],
                              (int32_t)k[3], &pr))
        e = KVC_E_NOENT;
    else
        e = pr.withdrawn ? KVC_E_WITHDRAWN : KVC_OK;
    if (e == KVC_E_NOENT || e == KVC_E_WITHDRAWN) {
        char why[KVC_NOTE_MAX + 32] = "";
        if (e == KVC_E_WITHDRAWN)
            snprintf(why, sizeof why, " (withdrawn: %s)", pr.note);
        text(out, req, 404, CT_TEXT_AIO, extra,
             "Bootstrap info not found for dp_rank=%s cp_rank=%s tp_rank=%s pp_rank=%s%s", v[0],
             v[1], v[2], v[3], why);
        return;
    }
    if (e) {
        detail(out, req, lib_status(e), "%s", kvc_last_error());
        return;
    }
    json_t *o = json_object();
    if (o) {
        json_object_set_new(o, "rank_ip", json_string(pr.rank_ip));
        json_object_set_new(o, "rank_port", json_integer(pr.rank_port));
    }
    json_answer(out, req, o, extra);
}

/* ---- room -> DP rank ------------------------------------------------- */

static void register_dp_rank(kvc_segment *seg, const struct http_req *req, struct buf *out)
{
    json_t *root = body_object(req, out);
    if (!root)
        return;
    int64_t room, dp;
    if (!int_of(json_object_get(root, "bootstrap_room"), "bootstrap_room", INT64_MIN, INT64_MAX,
                &room, req, out) &&
        !int_of(json_object_get(root, "dp_rank"), "dp_rank", 0, KVC_PD_DIM_MAX - 1, &dp, req,
                out)) {
        kvc_err e = kvc_pd_room_set(seg, room, (int32_t)dp);
        if (e)
            detail(out, req, lib_status(e), "%s", kvc_last_error());
        else
            text(out, req, 200, CT_TEXT_AIO, NULL, "OK");
    }
    json_decref(root);
}

static void query_dp_ranks(kvc_segment *seg, const struct http_req *req, struct buf *out)
{
    json_t *root = body_object(req, out);
    if (!root)
        return;
    json_t *rooms = json_object_get(root, "bootstrap_rooms"), *res = NULL;
    if (!rooms)
        detail(out, req, 400, "Missing field 'bootstrap_rooms'");
    else if (!json_is_array(rooms))
        detail(out, req, 400, "Invalid field 'bootstrap_rooms': must be an array");
    else if (!(res = json_object()))
        detail(out, req, 500, "Out of memory building the answer");
    else {
        size_t i;
        json_t *v;
        json_array_foreach(rooms, i, v)
        {
            int64_t room;
            char field[48], key[24];
            snprintf(field, sizeof field, "bootstrap_rooms[%zu]", i);
            /* int(room) as sglang takes it; one beyond int64 was never
             * stored (register_dp_rank refuses it): not found. */
            int prc = json_pyint(v, &room);
            if (prc == KVC_PYINT_RANGE)
                continue;
            if (prc == KVC_PYINT_INVALID) {
                int_of(v, field, INT64_MIN, INT64_MAX, &room, req, out); /* answers 400 */
                json_decref(res);
                res = NULL;
                break;
            }
            int32_t dp;
            kvc_err e = kvc_pd_room_get(seg, room, &dp);
            if (e == KVC_E_NOENT)
                continue;
            if (e) {
                detail(out, req, lib_status(e), "%s", kvc_last_error());
                json_decref(res);
                res = NULL;
                break;
            }
            snprintf(key, sizeof key, "%lld", (long long)room);
            json_object_set_new(res, key, json_integer(dp));
        }
        if (res)
            json_answer(out, req, res, NULL);
    }
    json_decref(root);
}

/* ---- the handlers of the route table's rows (http_routes.c) ---------- */

enum route_rc route_pd_put_route(struct routes *r, struct route_slot *s, const struct http_req *req,
                                 struct buf *out)
{
    (void)s;
    put_route(routes_segment(r), req, out);
    return ROUTE_DONE;
}

enum route_rc route_pd_get_route(struct routes *r, struct route_slot *s, const struct http_req *req,
                                 struct buf *out)
{
    (void)s;
    get_route(routes_segment(r), routes_cluster(r), req, out);
    return ROUTE_DONE;
}

enum route_rc route_pd_register_dp_rank(struct routes *r, struct route_slot *s,
                                        const struct http_req *req, struct buf *out)
{
    (void)s;
    register_dp_rank(routes_segment(r), req, out);
    return ROUTE_DONE;
}

enum route_rc route_pd_query_dp_ranks(struct routes *r, struct route_slot *s,
                                      const struct http_req *req, struct buf *out)
{
    (void)s;
    query_dp_ranks(routes_segment(r), req, out);
    return ROUTE_DONE;
}

/* sglang's handler of /route answers other methods itself. */
enum route_rc route_pd_route_405(struct routes *r, struct route_slot *s, const struct http_req *req,
                                 struct buf *out)
{
    (void)r, (void)s;
    text(out, req, 405, CT_JSON_AIO, NULL, "Method not allowed");
    return ROUTE_DONE;
}

/* aiohttp's own 405 on the two POST-only routes. */
enum route_rc route_pd_post_405(struct routes *r, struct route_slot *s, const struct http_req *req,
                                struct buf *out)
{
    (void)r, (void)s;
    text(out, req, 405, CT_TEXT_AIO, "Allow: POST\r\n", "405: Method Not Allowed");
    return ROUTE_DONE;
}
