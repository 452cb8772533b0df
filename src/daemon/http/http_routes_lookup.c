/*
 * http_routes_lookup.c - kvcoordd's reads of the rank table: GET
 * /get_transfer_engine_info (with its answer cache and the wait_ms
 * long-poll) and GET /ranks.  Routes: http_routes.c.
 */
#include "http_routes_int.h"

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

/* The extension header lines of ri's answer, into extra (cap bytes). */
static void info_extra(char *extra, size_t cap, const kvc_rank_info *ri)
{
    if (ri->origin[0])
        snprintf(extra, cap,
                 "X-Kvcoord-Generation: %" PRIu64 "\r\nX-Kvcoord-Origin: %s\r\n"
                 "X-Kvcoord-Origin-Generation: %" PRIu64 "\r\n",
                 ri->generation, ri->origin, ri->origin_generation);
    else
        snprintf(extra, cap, "X-Kvcoord-Generation: %" PRIu64 "\r\n", ri->generation);
}

/* ri's answer body, rendered once into a shared body (NULL: out of
 * memory). */
static struct shared_body *render_info(const kvc_rank_info *ri)
{
    struct shared_body *b = shared_body_new(info_len(ri));
    if (!b)
        return NULL;
    char num[20], *p = b->data;
    size_t nlen = u64_to_dec(num, ri->rank);
    memcpy(p, info_p1, sizeof info_p1 - 1), p += sizeof info_p1 - 1;
    memcpy(p, num, nlen), p += nlen;
    memcpy(p, info_p2, sizeof info_p2 - 1), p += sizeof info_p2 - 1;
    p = json_escape(p, ri->session_id, strlen(ri->session_id));
    memcpy(p, info_p3, sizeof info_p3 - 1), p += sizeof info_p3 - 1;
    memcpy(p, ri->info, ri->info_len), p += ri->info_len;
    memcpy(p, info_p4, sizeof info_p4 - 1);
    return b;
}

/* The answer: headers into out, the body queued by reference. */
static void send_info(struct buf *out, const struct http_req *req, const char *extra,
                      struct shared_body *body)
{
    resp_head(out, req, 200, CT_JSON, body->len, extra);
    if (resp_has_body(req))
        buf_attach(out, body);
}

/* Render ri's answer, keep it in cache slot a (NULL: none) for epoch, and
 * answer it. */
static void write_info(struct routes *r, struct buf *out, const struct http_req *req,
                       const kvc_rank_info *ri, struct cached_answer *a, uint32_t epoch)
{
    char extra[sizeof a->extra];
    info_extra(extra, sizeof extra, ri);
    struct shared_body *body = render_info(ri);
    if (!body) {
        resp_detail(out, req, 500, "Out of memory rendering the answer", NULL);
        return;
    }
    send_info(out, req, extra, body);
    if (a) {
        if (a->body)
            r->cache_bytes -= a->body->len;
        shared_body_unref(a->body);
        a->body = NULL;
        if (r->cache_bytes + body->len <= ANSWER_CACHE_BYTES) {
            memcpy(a->extra, extra, sizeof extra);
            a->rank = ri->rank;
            a->epoch = epoch;
            a->body = body;
            r->cache_bytes += body->len;
            return; /* the cache's reference */
        }
    }
    shared_body_unref(body); /* out's reference keeps it until it is sent */
}

/* Answer from the cache when it holds rank's current answer; 1 if so
 * (answered, or 503 when it does not fit the answer budget). */
static int cached_info(struct routes *r, struct route_slot *s, const struct http_req *req,
                       struct buf *out, uint32_t rank, uint32_t epoch)
{
    struct cached_answer *a = r->cache ? &r->cache[rank % ANSWER_CACHE_SLOTS] : NULL;
    if (!a || !a->body || a->rank != rank || a->epoch != epoch)
        return 0;
    /* Queued elsewhere already, it costs no more bytes. */
    if (a->body->queued || route_answer_fits(s, req, out, a->body->len))
        send_info(out, req, a->extra, a->body);
    return 1;
}

/* capped: the wait that just ended was cut to ROUTES_MAX_WAIT_MS (the
 * client asked for more): the 404 says so. */
static void write_lookup_error(struct buf *out, const struct http_req *req, uint32_t rank,
                               const char *role, kvc_err e, const kvc_rank_info *ri, int capped)
{
    char rs[KVC_ROLE_NAME_MAX + 16], ws[KVC_NOTE_MAX + 16], cap[64] = "";
    if (capped)
        snprintf(cap, sizeof cap, " (waited %u ms: wait_ms is capped at %u)", ROUTES_MAX_WAIT_MS,
                 ROUTES_MAX_WAIT_MS);
    if (e == KVC_E_NOENT || e == KVC_E_CAPACITY)
        route_detailf(out, req, 404, "No transfer engine info for rank %u%s%s", rank,
                      route_role_suffix(role, rs, sizeof rs), cap);
    else if (e == KVC_E_WITHDRAWN)
        route_detailf(out, req, 404, "No transfer engine info for rank %u%s%s%s", rank,
                      route_role_suffix(role, rs, sizeof rs),
                      route_withdrawn_suffix(ri->note, ws, sizeof ws), cap);
    else
        route_detailf(out, req, route_lib_status(e), "Lookup of rank %u failed: %s", rank,
                      kvc_last_error());
}

/* A role no registration can ever use: not in use while the segment's
 * KVC_RANK_ROLES roles are all taken (a name stays taken while the segment
 * lasts).  Writes the 404 saying so and returns 1; else 0. */
_Static_assert(KVC_RANK_ROLES == 4, "role_cannot_exist names 4 roles");

static int role_cannot_exist(struct routes *r, const struct http_req *req, struct buf *out,
                             uint32_t rank, const char *role)
{
    char names[KVC_RANK_ROLES][KVC_ROLE_NAME_MAX + 1];
    size_t n = 0;
    if (!role[0] || !strcmp(role, KVC_DEFAULT_ROLE) ||
        kvc_role_names(r->seg, names, KVC_RANK_ROLES, &n) != KVC_OK || n < KVC_RANK_ROLES)
        return 0;
    for (size_t i = 0; i < n; i++)
        if (!strcmp(names[i], role))
            return 0;
    route_detailf(out, req, 404,
                  "No transfer engine info for rank %u (role %s: the segment keeps %d roles, all "
                  "taken (%s, %s, %s, %s), so no registration can use it)",
                  rank, role, KVC_RANK_ROLES, names[0], names[1], names[2], names[3]);
    return 1;
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
    if (plain && cached_info(r, s, req, out, s->park_rank, epoch))
        return ROUTE_DONE;
    kvc_err e = kvc_role_lookup(r->seg, s->park_role, s->park_rank, &s->ri);
    if (e == KVC_OK && !route_answer_fits(s, req, out, info_len(&s->ri)))
        return ROUTE_DONE;
    if (e == KVC_OK) {
        write_info(r, out, req, &s->ri,
                   plain && r->cache ? &r->cache[s->park_rank % ANSWER_CACHE_SLOTS] : NULL, epoch);
        return ROUTE_DONE;
    }
    if (e == KVC_E_NOENT && role_cannot_exist(r, req, out, s->park_rank, s->park_role))
        return ROUTE_DONE;
    if (may_park && (e == KVC_E_NOENT || e == KVC_E_WITHDRAWN))
        return ROUTE_PARK;
    write_lookup_error(out, req, s->park_rank, s->park_role, e, &s->ri,
                       !may_park && s->park_capped);
    return ROUTE_DONE;
}

enum route_rc route_get_info(struct routes *r, struct route_slot *s, const struct http_req *req,
                             struct buf *out)
{
    uint64_t wait_ms;
    if (route_rank_params(req, out, &s->park_rank, s->park_role, &wait_ms))
        return ROUTE_DONE;
    s->park_capped = wait_ms > ROUTES_MAX_WAIT_MS;
    s->park_wait_ms = s->park_capped ? ROUTES_MAX_WAIT_MS : (uint32_t)wait_ms;
    return lookup_once(r, s, req, out, s->park_wait_ms > 0);
}

enum route_rc routes_resume(struct routes *r, struct route_slot *s, const struct http_req *req,
                            struct buf *out, int expired)
{
    return lookup_once(r, s, req, out, !expired);
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

/* The /ranks body is rendered once per rank table epoch (and world size)
 * into a shared body every connection answering it queues. */
enum route_rc route_get_ranks(struct routes *r, struct route_slot *s, const struct http_req *req,
                              struct buf *out)
{
    kvc_segment_info si;
    size_t count = 0;
    uint32_t epoch = kvc_rank_epoch(r->seg);
    kvc_err e = kvc_segment_stat(r->seg, &si);
    if (!e && r->ranks && r->ranks_epoch == epoch && r->ranks_world == si.world_size)
        goto answer;
    if (!e)
        e = kvc_rank_list(r->seg, r->list, r->max_ranks, &count, 0);
    if (e) {
        route_detailf(out, req, route_lib_status(e), "Listing ranks failed: %s", kvc_last_error());
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
    struct shared_body *body = b->oom ? NULL : shared_body_take(b);
    buf_trim(b, RI_KEEP);
    if (!body) {
        resp_detail(out, req, 500, "Out of memory listing ranks", NULL);
        return ROUTE_DONE;
    }
    shared_body_unref(r->ranks);
    r->ranks = body;
    r->ranks_epoch = epoch;
    r->ranks_world = si.world_size;
answer:
    if (r->ranks->queued || route_answer_fits(s, req, out, r->ranks->len)) {
        resp_head(out, req, 200, CT_JSON, r->ranks->len, NULL);
        if (resp_has_body(req))
            buf_attach(out, r->ranks);
    }
    return ROUTE_DONE;
}
