/*
 * http_routes_rooms.c - kvcoordd's room routes: GET /rooms/{room}, PUT
 * /rooms/{room}/failure and GET /failures.  Routes: http_routes.c.
 */
#include "http_routes_int.h"

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
        if (want[0].too_long || parse_rank(rv, &v)) {
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
 * an outside observer, for whom every record is from another rank, and
 * whose text names the origin rank only, not "this/another rank"). */
static void append_failure(struct buf *b, const kvc_failure_info *f, int32_t asking)
{
    char text[KVC_REASON_MAX + 256];
    kvc_failure_info seen = *f;
    int other = asking < 0 || (uint32_t)asking != f->origin_rank || f->from_another_node;
    seen.is_from_another_rank = asking < 0 ? -1 : other;
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
    put_bool(b, other);
    buf_puts(b, ",\"origin_node\":\"");
    json_escape_append(b, f->origin_node, strlen(f->origin_node));
    buf_puts(b, "\",\"from_another_node\":");
    put_bool(b, f->from_another_node);
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
static void route_send_body(struct routes *r, const struct http_req *req, struct buf *out)
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
        route_detailf(out, req, 404, "No room %" PRIu64, room);
        return;
    }
    if (e) {
        route_detailf(out, req, route_lib_status(e), "Reading room %" PRIu64 " failed: %s", room,
                      kvc_last_error());
        return;
    }
    buf_reset(&r->body);
    append_room(&r->body, &ri, asking);
    route_send_body(r, req, out);
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
        return route_bad_field(out, req, "rank", NULL);
    if (!json_is_integer(jr) || json_integer_value(jr) < 0 || json_integer_value(jr) > INT32_MAX)
        return route_bad_field(out, req, "rank", "must be an integer in 0..2147483647");
    *rank = (uint32_t)json_integer_value(jr);
    json_t *js = json_object_get(root, "reason");
    if (!js)
        return route_bad_field(out, req, "reason", NULL);
    if (!json_is_string(js))
        return route_bad_field(out, req, "reason", "must be a string");
    if (strlen(json_string_value(js)) != json_string_length(js))
        return route_bad_field(out, req, "reason", "must not contain NUL");
    *reason = json_string_value(js);
    *code = 0;
    json_t *jc = json_object_get(root, "code");
    if (jc && !json_is_null(jc)) {
        if (!json_is_integer(jc) || json_integer_value(jc) < INT32_MIN ||
            json_integer_value(jc) > INT32_MAX)
            return route_bad_field(out, req, "code", "must be a 32-bit integer");
        *code = (int32_t)json_integer_value(jc);
    }
    return 0;
}

static void put_room_failure(struct routes *r, const struct http_req *req, struct buf *out,
                             uint64_t room)
{
    int32_t asking; /* who reads the answer: ?rank=R, else an outside observer */
    if (asking_rank(req, out, NULL, &asking))
        return;
    static const char *const fields[] = {"rank", "reason", "code"};
    json_t *root = route_parse_body(req, out, fields, sizeof fields / sizeof fields[0]);
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
        route_bad_field(out, req, "rank", kvc_last_error());
        json_decref(root);
        return;
    }
    if (e) {
        route_detailf(out, req, route_lib_status(e),
                      "Recording a failure of room %" PRIu64 " failed: %s", room, kvc_last_error());
        json_decref(root);
        return;
    }
    if (kept) /* the failure record itself is logged by seg_events.c */
        log_event(LOG_DEBUG, "http_room_failure", "room=%" PRIu64 " rank=%u code=%d reason=\"%s\"",
                  room, rank, (int)code, reason);
    json_decref(root);
    /* The record kept (this call's or an earlier one), as the caller sees
     * it: the body's rank is the failure's origin, not the reader. */
    kvc_room_info ri;
    e = kvc_room_get(r->seg, room, asking, &ri);
    struct buf *b = &r->body;
    buf_reset(b);
    buf_puts(b, "{\"kept\":");
    put_bool(b, kept);
    buf_puts(b, ",\"failure\":");
    if (!e && ri.has_failure)
        append_failure(b, &ri.failure, asking);
    else
        buf_puts(b, "null"); /* reclaimed meanwhile */
    buf_puts(b, "}");
    route_send_body(r, req, out);
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

enum route_rc route_room(struct routes *r, struct route_slot *s, const struct http_req *req,
                         struct buf *out)
{
    (void)s;
    uint64_t room;
    if (!room_of(r, req, out, &room))
        get_room(r, req, out, room);
    return ROUTE_DONE;
}

enum route_rc route_room_failure(struct routes *r, struct route_slot *s, const struct http_req *req,
                                 struct buf *out)
{
    (void)s;
    uint64_t room;
    if (!room_of(r, req, out, &room))
        put_room_failure(r, req, out, room);
    return ROUTE_DONE;
}

/* ---- GET /failures --------------------------------------------------------- */

enum route_rc route_get_failures(struct routes *r, struct route_slot *s, const struct http_req *req,
                                 struct buf *out)
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
        route_detailf(out, req, route_lib_status(e), "Reading failure records failed: %s",
                      kvc_last_error());
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
    route_send_body(r, req, out);
    return ROUTE_DONE;
}
