/*
 * fuzz_register.c - fuzz target: validation of registrations, in the route
 * (PUT /register_transfer_engine_info's body handling) and in the library
 * (kvc_rank_register's weights_info_dict check).
 *
 * The input is a request body.  jansson (JSON_ALLOW_NUL) is the reference
 * for what is valid JSON, but for the scanner's deliberate differences
 * (json_scan.h; fuzz_json_scan.c): integers in 2^63..2^64-1, reals past a
 * double's range and "\u0000" in keys are valid JSON kvcoord accepts; a raw
 * NUL byte (where jansson stops reading) is invalid anywhere.
 *   1. Through routes_dispatch() as a PUT: the answer is 200 "OK" or a 400,
 *      413, 503 or 507 with a JSON {"detail": ...}; never anything else.
 *      On 200, GET /get_transfer_engine_info?rank=R answers 200 and ends
 *      with the body's weights_info_dict byte for byte as it was sent
 *      (then "]}"), and when jansson reads the body, with [session_id,
 *      weights_info_dict] equal (json_equal) to what the body held, rank
 *      taken from "rank", else "tp_rank".
 *   2. The same bytes as weights_info_dict straight to kvc_rank_register():
 *      accepted exactly when they are a JSON object (and fit), and a lookup
 *      then returns the same bytes, byte for byte.
 */
#include <http_parser.h>
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "buf.h"
#include "fuzz_common.h"
#include "fuzz_sent.h"
#include "http_req.h"
#include "http_routes.h"
#include "json_scan.h"
#include "log.h"

#define DIRECT_RANK (FZ_MAX_RANKS - 1) /* rank used by the direct library check */

static struct routes *routes;
static struct routes *worker; /* the helper thread's clone: runs what the loop defers */

static void free_routes(void)
{
    routes_destroy(worker);
    routes_destroy(routes);
    routes = worker = NULL;
}

static void setup(void)
{
    if (routes)
        return;
    log_set_level(LOG_ERROR);
    FZ_CHECK(routes_create(&routes, fz_segment("reg")) == 0, "routes_create");
    FZ_CHECK(routes_clone(routes, &worker) == 0, "routes_clone");
    fz_before_close = free_routes;
}

/* Split a response in out into status and body (Content-Length is checked
 * by fuzz_http; here only what the registration answers mean). */
static int parse_answer(const struct buf *out, const char **body, size_t *body_len)
{
    size_t n;
    const char *p = fz_sent_bytes(out, 0, &n); /* shared bodies included */
    FZ_CHECK(n > 12 && !memcmp(p, "HTTP/1.1 ", 9), "bad status line");
    int status = atoi(p + 9);
    const char *end = memmem(p, n, "\r\n\r\n", 4);
    FZ_CHECK(end, "no end of headers");
    *body = end + 4;
    *body_len = n - (size_t)(end + 4 - p);
    return status;
}

/* The rank the route should have stored, from the parsed body. */
static json_int_t body_rank(json_t *root)
{
    json_t *r = json_object_get(root, "rank");
    if (!r)
        r = json_object_get(root, "tp_rank");
    return r && json_is_integer(r) ? json_integer_value(r) : -1;
}

/* jansson's reading of data (NULL when it refuses), and whether a refusal
 * is only one of the scanner's deliberate differences. */
static json_t *reference(const uint8_t *data, size_t size, int *tolerated)
{
    json_error_t je;
    json_t *v = json_loadb((const char *)data, size, JSON_DECODE_ANY | JSON_ALLOW_NUL, &je);
    if (v && memchr(data, 0, size)) { /* jansson stopped at the NUL: invalid to kvcoord */
        json_decref(v);
        v = NULL;
        je.text[0] = '\0';
    }
    *tolerated = !v && (strstr(je.text, "too big integer") || strstr(je.text, "too big negative") ||
                        strstr(je.text, "real number overflow") ||
                        strstr(je.text, "NUL byte in object key"));
    return v;
}

/* 1 when jansson refuses data, read with JSON_REJECT_DUPLICATES, for a
 * repeated key. */
static int jansson_repeats(const char *data, size_t size, enum json_error_code *code)
{
    json_error_t je;
    json_t *v =
        json_loadb(data, size, JSON_DECODE_ANY | JSON_ALLOW_NUL | JSON_REJECT_DUPLICATES, &je);
    json_decref(v);
    *code = v ? json_error_unknown : json_error_code(&je);
    return !v && *code == json_error_duplicate_key;
}

/* A private-use code point that data holds neither as UTF-8 nor as a
 * \uXXXX escape (any case), or 0 when every one of them occurs. */
static unsigned unused_code_point(const uint8_t *data, size_t size)
{
    for (unsigned c = 0xE000; c <= 0xF8FF; c++) {
        char utf8[3] = {(char)(0xE0 | (c >> 12)), (char)(0x80 | ((c >> 6) & 0x3F)),
                        (char)(0x80 | (c & 0x3F))};
        char lo[16], up[16];
        snprintf(lo, sizeof lo, "\\u%04x", c);
        snprintf(up, sizeof up, "\\u%04X", c);
        if (!memmem(data, size, utf8, 3) && !memmem(data, size, lo, 6) &&
            !memmem(data, size, up, 6))
            return c;
    }
    return 0;
}

/* A copy of data that jansson can read where only the scanner's deliberate
 * differences stopped it, keys kept apart as they were: every "\u0000"
 * escape becomes one of code point c (which the body holds nowhere else),
 * and every number outside strings becomes "0" padded with spaces (so
 * integers past 2^63 and reals past a double's range read).  The caller
 * frees it. */
static char *tamed(const uint8_t *data, size_t size, unsigned c)
{
    char *copy = malloc(size ? size : 1);
    FZ_CHECK(copy, "out of memory");
    memcpy(copy, data, size);
    char with[16];
    snprintf(with, sizeof with, "\\u%04x", c);
    int in_string = 0;
    for (size_t i = 0; i < size; i++) {
        if (in_string) {
            if (copy[i] == '"')
                in_string = 0;
            else if (copy[i] == '\\') { /* an escape: consumed together */
                if (i + 6 <= size && !memcmp(copy + i + 1, "u0000", 5))
                    memcpy(copy + i, with, 6);
                i++;
            }
        } else if (copy[i] == '"') {
            in_string = 1;
        } else if (copy[i] == '-' || (copy[i] >= '0' && copy[i] <= '9')) {
            copy[i] = '0';
            while (i + 1 < size && copy[i + 1] && strchr("0123456789+-.eE", copy[i + 1]))
                copy[++i] = ' ';
        }
    }
    return copy;
}

/* 1 when some object of the body repeats a key (jansson's reading).
 * jansson refuses a "\u0000" in a key and numbers past its range before it
 * looks for repeats, where kvcoord's scanner reads on: then jansson reads
 * tamed()'s copy, in which keys that differed still differ and keys that
 * were equal are still equal. */
static int repeated_key(const uint8_t *data, size_t size)
{
    enum json_error_code code;
    if (jansson_repeats((const char *)data, size, &code))
        return 1;
    unsigned c;
    if ((code != json_error_null_byte_in_key && code != json_error_numeric_overflow) ||
        !(c = unused_code_point(data, size)))
        return 0;
    char *copy = tamed(data, size, c);
    int repeats = jansson_repeats(copy, size, &code);
    free(copy);
    return repeats;
}

static void via_route(const uint8_t *data, size_t size)
{
    struct route_slot slot;
    memset(&slot, 0, sizeof slot);
    struct buf out = {0};
    struct http_req req = {.method = HTTP_PUT,
                           .path = "/register_transfer_engine_info",
                           .path_len = strlen("/register_transfer_engine_info"),
                           .body = (const char *)data,
                           .body_len = size,
                           .http_minor = 1,
                           .keep_alive = 1};
    enum route_rc rc = routes_dispatch(routes, &slot, &req, &out);
    FZ_CHECK(rc != ROUTE_PARK, "registration parked");
    if (rc == ROUTE_DEFER) { /* a large body: what the helper thread runs */
        FZ_CHECK(buf_total(&out) == 0, "a deferred registration wrote %zu bytes", buf_total(&out));
        routes_deferred(worker, &req, &out);
    }
    const char *body;
    size_t blen;
    int status = parse_answer(&out, &body, &blen);
    int tolerated;
    json_t *sent = reference(data, size, &tolerated);
    if (status != 200) {
        FZ_CHECK(status == 400 || status == 413 || status == 503 || status == 507,
                 "registration answered %d: %.*s", status, (int)blen, body);
        int utf8 = fz_utf8_valid((const uint8_t *)body, blen);
        FZ_CHECK(utf8 || !fz_check_utf8(), "error body is not valid UTF-8: %.*s", (int)blen, body);
        json_t *d = json_loadb(body, blen, 0, NULL);
        FZ_CHECK(!utf8 || (d && json_is_string(json_object_get(d, "detail"))),
                 "bad error body: %.*s", (int)blen, body);
        /* A repeated field kvcoordd reads is refused (parsers disagree on
         * which occurrence counts): only for a body that repeats a key. */
        const char *detail = d ? json_string_value(json_object_get(d, "detail")) : NULL;
        int dup = detail && !strncmp(detail, "Duplicate field", strlen("Duplicate field"));
        FZ_CHECK(!dup || repeated_key(data, size), "'Duplicate field' without a repeated key: %.*s",
                 (int)blen, body);
        json_decref(d);
        /* A well-formed registration of an allowed rank must not be refused
         * as a bad request (a "role" member has a rule of its own, checked
         * by the route: its refusals are not counted here). */
        json_int_t r = sent ? body_rank(sent) : -1;
        json_t *tei = sent ? json_object_get(sent, "transfer_engine_info") : NULL;
        json_t *sid = json_object_get(tei, "session_id");
        if (status == 400 && !dup && r >= 0 && r < FZ_MAX_RANKS && json_is_string(sid) &&
            json_string_length(sid) > 0 && json_string_length(sid) <= KVC_SESSION_ID_MAX &&
            strlen(json_string_value(sid)) == json_string_length(sid) &&
            json_is_object(json_object_get(tei, "weights_info_dict")) &&
            !json_object_get(sent, "role"))
            FZ_CHECK(0, "valid registration refused: %.*s", (int)blen, body);
        json_decref(sent);
        buf_free(&out);
        return;
    }
    FZ_CHECK((sent && json_is_object(sent)) || (!sent && tolerated),
             "200 for a body that is not a JSON object");
    struct kvc_json_watch w[4] = {{.parent = -1, .key = "rank"},
                                  {.parent = -1, .key = "tp_rank"},
                                  {.parent = -1, .key = "transfer_engine_info"},
                                  {.parent = 2, .key = "weights_info_dict"}};
    FZ_CHECK(!kvc__json_scan((const char *)data, size, w, 4, NULL, NULL), "200 for invalid JSON");
    const struct kvc_json_watch *wr = w[0].type ? &w[0] : &w[1];
    FZ_CHECK(wr->type == KVC_JSON_INTEGER && w[3].type == KVC_JSON_OBJECT, "200 without rank/dict");
    int negative;
    uint64_t urank;
    kvc__json_integer((const char *)data, wr->start, wr->end, &negative, &urank);
    FZ_CHECK(!negative && urank < FZ_MAX_RANKS, "200 for rank %llu", (unsigned long long)urank);
    json_int_t rank = (json_int_t)urank;
    FZ_CHECK(!sent || body_rank(sent) == rank, "rank differs from jansson's reading");

    /* Read it back as a remote instance would. */
    char query[32];
    int qlen = snprintf(query, sizeof query, "rank=%lld", (long long)rank);
    struct http_req get = {.method = HTTP_GET,
                           .path = "/get_transfer_engine_info",
                           .path_len = strlen("/get_transfer_engine_info"),
                           .query = query,
                           .query_len = (size_t)qlen,
                           .http_minor = 1,
                           .keep_alive = 1};
    buf_reset(&out);
    FZ_CHECK(routes_dispatch(routes, &slot, &get, &out) == ROUTE_DONE, "lookup parked");
    buf_flatten(&out); /* the shared body into the bytes checked */
    status = parse_answer(&out, &body, &blen);
    FZ_CHECK(status == 200, "lookup of a registered rank answered %d: %.*s", status, (int)blen,
             body);
    size_t wlen = w[3].end - w[3].start;
    FZ_CHECK(blen >= wlen + 2 && !memcmp(body + blen - 2, "]}", 2) &&
                 !memcmp(body + blen - 2 - wlen, data + w[3].start, wlen),
             "weights_info_dict not returned as sent");
    if (!sent) { /* valid, but beyond what jansson reads: the bytes are checked */
        route_slot_free(&slot);
        buf_free(&out);
        return;
    }
    json_error_t jerr;
    json_t *got = json_loadb(body, blen, JSON_ALLOW_NUL, &jerr);
    FZ_CHECK(got, "lookup body does not parse: %s", jerr.text);
    json_t *pair = json_object_get(got, "remote_instance_transfer_engine_info");
    json_t *tei = json_object_get(sent, "transfer_engine_info");
    FZ_CHECK(json_integer_value(json_object_get(got, "rank")) == rank, "rank differs");
    FZ_CHECK(json_is_array(pair) && json_array_size(pair) == 2, "bad pair");
    FZ_CHECK(json_equal(json_array_get(pair, 0), json_object_get(tei, "session_id")),
             "session_id differs");
    FZ_CHECK(json_equal(json_array_get(pair, 1), json_object_get(tei, "weights_info_dict")),
             "weights_info_dict differs");
    json_decref(got);
    json_decref(sent);
    route_slot_free(&slot);
    buf_free(&out);
}

static void via_library(const uint8_t *data, size_t size)
{
    kvc_segment *seg = fz_segment("reg");
    kvc_err e = kvc_rank_register(seg, DIRECT_RANK, "fuzz:1", (const char *)data, size, NULL);
    int tolerated;
    json_t *v = reference(data, size, &tolerated);
    struct kvc_json_root root;
    int object = v ? json_is_object(v)
                   : tolerated && !kvc__json_scan((const char *)data, size, NULL, 0, &root, NULL) &&
                         root.type == KVC_JSON_OBJECT;
    json_decref(v);
    if (size + 6 > FZ_MAX_INFO) {
        FZ_CHECK(e == KVC_E_TOOBIG, "oversized info: %s", kvc_strerror(e));
        return;
    }
    FZ_CHECK(object ? e == KVC_OK : e == KVC_E_INVAL, "jansson says %s, library says %s (%s)",
             object ? "object" : "not an object", kvc_strerror(e), kvc_last_error());
    if (e)
        return;
    kvc_rank_info ri;
    memset(&ri, 0, sizeof ri);
    e = kvc_rank_lookup(seg, DIRECT_RANK, &ri);
    FZ_CHECK(e == KVC_OK, "lookup after register: %s", kvc_strerror(e));
    FZ_CHECK(ri.info_len == size && !memcmp(ri.info, data, size) && ri.info[size] == '\0',
             "stored info differs from what was registered");
    FZ_CHECK(!strcmp(ri.session_id, "fuzz:1"), "session_id differs");
    kvc_rank_info_free(&ri);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    setup();
    via_route(data, size);
    via_library(data, size);
    return 0;
}
