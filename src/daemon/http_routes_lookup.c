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

static void write_lookup_error(struct buf *out, const struct http_req *req, uint32_t rank,
                               const char *role, kvc_err e, const kvc_rank_info *ri)
{
    char rs[KVC_ROLE_NAME_MAX + 16], ws[KVC_NOTE_MAX + 16];
    if (e == KVC_E_NOENT || e == KVC_E_CAPACITY)
        route_detailf(out, req, 404, "No transfer engine info for rank %u%s", rank,
                      route_role_suffix(role, rs, sizeof rs));
    else if (e == KVC_E_WITHDRAWN)
        route_detailf(out, req, 404, "No transfer engine info for rank %u%s%s", rank,
                      route_role_suffix(role, rs, sizeof rs),
                      route_withdrawn_suffix(ri->note, ws, sizeof ws));
    else
        route_detailf(out, req, route_lib_status(e), "Lookup of rank %u failed: %s", rank,
                      kvc_last_error());
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
    if (e == KVC_OK && !route_answer_fits(s, req, out, info_len(&s->ri)))
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

enum route_rc route_get_info(struct routes *r, struct route_slot *s, const struct http_req *req,
                             struct buf *out)
{
    if (route_rank_params(req, out, &s->park_rank, s->park_role, &s->park_wait_ms))
        return ROUTE_DONE;
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

enum route_rc route_get_ranks(struct routes *r, struct route_slot *s, const struct http_req *req,
                              struct buf *out)
{
    kvc_segment_info si;
    size_t count = 0;
    kvc_err e = kvc_segment_stat(r->seg, &si);
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
    if (b->oom)
        resp_detail(out, req, 500, "Out of memory listing ranks", NULL);
    else if (route_answer_fits(s, req, out, b->len))
        resp_send(out, req, 200, CT_JSON, b->p, b->len, NULL);
    buf_trim(b, RI_KEEP);
    return ROUTE_DONE;
}
