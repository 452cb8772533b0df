/*
 * test_http_units.c - unit tests of kvcoordd's HTTP pieces without a socket:
 * percent-decoding and query parameters (query.c), request parsing and its
 * limits (http_conn.c), response formatting (http_resp.c).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "http_conn.h"
#include "http_resp.h"
#include "peers.h"
#include "query.h"

/* ---- query.c ------------------------------------------------------------- */

static void test_pct_decode(void **state)
{
    (void)state;
    char out[64];
    assert_int_equal(pct_decode(out, "a%20b%2Fc+d", 11, 1), 7);
    assert_memory_equal(out, "a b/c d", 7);
    assert_int_equal(pct_decode(out, "a+b", 3, 0), 3);
    assert_memory_equal(out, "a+b", 3);
    assert_int_equal(pct_decode(out, "%41%6a", 6, 0), 2);
    assert_memory_equal(out, "Aj", 2);
    assert_int_equal(pct_decode(out, "%zz", 3, 0), -1);
    assert_int_equal(pct_decode(out, "%4", 2, 0), -1);
    assert_int_equal(pct_decode(out, "abc%", 4, 0), -1);
    assert_int_equal(pct_decode(NULL, "ok%2", 4, 0), -1);
    assert_int_equal(pct_decode(NULL, "", 0, 0), 0);
    /* A decoded NUL is refused wherever it appears. */
    assert_int_equal(pct_decode(out, "1%00junk", 8, 1), QUERY_ENUL);
    assert_int_equal(pct_decode(NULL, "%00", 3, 0), QUERY_ENUL);
    assert_int_equal(pct_decode(out, "%01", 3, 0), 1); /* other bytes decode */
}

static void test_query_parse(void **state)
{
    (void)state;
    char rank[8], wait[8];
    struct query_param want[2] = {{"rank", rank, sizeof rank, 0, 0},
                                  {"wait_ms", wait, sizeof wait, 0, 0}};
    const char *q = "x=1&rank=3&%77ait_ms=5&&rank=4&flag";
    assert_int_equal(query_parse(q, strlen(q), want, 2), 0);
    assert_true(want[0].found && want[1].found);
    assert_string_equal(rank, "4"); /* the last occurrence wins */
    assert_string_equal(wait, "5");

    q = "other=%zz&rank=1";
    assert_int_equal(query_parse(q, strlen(q), want, 2), -1); /* bad escape anywhere */
    q = "rank=1%00junk";
    assert_int_equal(query_parse(q, strlen(q), want, 2), QUERY_ENUL);
    q = "rank=1&other=%00";
    assert_int_equal(query_parse(q, strlen(q), want, 2), QUERY_ENUL); /* in any value */
    q = "ra%00nk=1";
    assert_int_equal(query_parse(q, strlen(q), want, 2), QUERY_ENUL); /* or key */
    assert_string_equal(query_error_text(QUERY_ENUL),
                        "Invalid query string: NUL byte (%00) in a parameter");
    assert_string_equal(query_error_text(QUERY_EESCAPE),
                        "Invalid percent-encoding in query string");
    q = "rank=12345678";
    assert_int_equal(query_parse(q, strlen(q), want, 2), 0);
    assert_true(want[0].too_long);
    assert_false(want[1].found);
    q = "rank";
    assert_int_equal(query_parse(q, strlen(q), want, 1), 0);
    assert_true(want[0].found);
    assert_string_equal(rank, "");
    assert_int_equal(query_parse("", 0, want, 2), 0);
    assert_false(want[0].found);
}

static void test_parse_uint(void **state)
{
    (void)state;
    uint64_t v;
    assert_int_equal(parse_uint("0", 10, &v), 0);
    assert_int_equal(v, 0);
    assert_int_equal(parse_uint("007", 10, &v), 0);
    assert_int_equal(v, 7);
    assert_int_equal(parse_uint("2147483647", INT32_MAX, &v), 0);
    assert_int_equal(parse_uint("2147483648", INT32_MAX, &v), -1);
    assert_int_equal(parse_uint("18446744073709551615", UINT64_MAX, &v), 0);
    assert_true(v == UINT64_MAX);
    assert_int_equal(parse_uint("18446744073709551616", UINT64_MAX, &v), -1);
    assert_int_equal(parse_uint("", 10, &v), -1);
    assert_int_equal(parse_uint("-1", 10, &v), -1);
    assert_int_equal(parse_uint("+1", 10, &v), -1);
    assert_int_equal(parse_uint(" 1", 10, &v), -1);
    assert_int_equal(parse_uint("1.0", 10, &v), -1);
}

/* A rank parameter: "-0" is 0 (Python's int(), sglang's FastAPI), any
 * other sign refused. */
static void test_parse_rank(void **state)
{
    (void)state;
    uint64_t v = 9;
    assert_int_equal(parse_rank("-0", &v), 0);
    assert_int_equal(v, 0);
    v = 9;
    assert_int_equal(parse_rank("-000", &v), 0);
    assert_int_equal(v, 0);
    assert_int_equal(parse_rank("12", &v), 0);
    assert_int_equal(v, 12);
    assert_int_equal(parse_rank("2147483648", &v), -1);
    assert_int_equal(parse_rank("-", &v), -1);
    assert_int_equal(parse_rank("-1", &v), -1);
    assert_int_equal(parse_rank("-01", &v), -1);
    assert_int_equal(parse_rank("--0", &v), -1);
    assert_int_equal(parse_rank("+0", &v), -1);
    assert_int_equal(parse_rank("", &v), -1);
}

/* ---- http_conn.c ------------------------------------------------------------ */

static const struct http_limits limits = {.max_head = 1024, .max_body = 100};

/* Feed s whole; returns the event and sets *used. */
static enum hconn_event feed(struct http_conn *c, const char *s, size_t *used)
{
    return hconn_parse(c, s, strlen(s), used);
}

static void test_pipelined_requests(void **state)
{
    (void)state;
    struct http_conn c;
    hconn_init(&c, &limits);
    const char *in = "GET /a%2Fb?rank=1 HTTP/1.1\r\nHost: x\r\n\r\n"
                     "PUT /p HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc";
    size_t used, off = 0;
    assert_int_equal(feed(&c, in, &used), HCONN_REQUEST);
    assert_int_equal(c.req.method, HTTP_GET);
    assert_int_equal(c.req.path_len, 4);
    assert_memory_equal(c.req.path, "/a/b", 4);
    assert_int_equal(c.req.raw_path_len, 6); /* routes split this one, then decode */
    assert_memory_equal(c.req.raw_path, "/a%2Fb", 6);
    assert_int_equal(c.req.query_len, 6);
    assert_memory_equal(c.req.query, "rank=1", 6);
    assert_true(c.req.keep_alive);
    hconn_done(&c);
    off += used;
    assert_int_equal(feed(&c, in + off, &used), HCONN_REQUEST);
    assert_int_equal(c.req.method, HTTP_PUT);
    assert_int_equal(c.req.body_len, 3);
    assert_memory_equal(c.req.body, "abc", 3);
    off += used;
    assert_int_equal(off, strlen(in));
    hconn_free(&c);
}

static void test_chunked_split_anywhere(void **state)
{
    (void)state;
    const char *in = "POST /r HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                     "3\r\nabc\r\n4;x=y\r\ndefg\r\n0\r\n\r\n";
    for (size_t split = 1; split < strlen(in); split++) {
        struct http_conn c;
        hconn_init(&c, &limits);
        size_t used;
        assert_int_equal(hconn_parse(&c, in, split, &used), HCONN_MORE);
        assert_int_equal(used, split);
        assert_int_equal(hconn_parse(&c, in + split, strlen(in) - split, &used), HCONN_REQUEST);
        assert_int_equal(c.req.body_len, 7);
        assert_memory_equal(c.req.body, "abcdefg", 7);
        hconn_free(&c);
    }
}

static void test_expect_continue(void **state)
{
    (void)state;
    struct http_conn c;
    hconn_init(&c, &limits);
    const char *in =
        "PUT /r HTTP/1.1\r\nHost: x\r\nExpect: 100-Continue \r\nContent-Length: 2\r\n\r\nhi";
    size_t used, off;
    assert_int_equal(feed(&c, in, &used), HCONN_CONTINUE);
    off = used;
    assert_int_equal(feed(&c, in + off, &used), HCONN_REQUEST);
    assert_int_equal(off + used, strlen(in));
    assert_memory_equal(c.req.body, "hi", 2);
    hconn_free(&c);

    hconn_init(&c, &limits); /* HTTP/1.0: Expect is ignored */
    assert_int_equal(feed(&c,
                          "PUT /r HTTP/1.0\r\nExpect: 100-continue\r\nContent-Length: 1"
                          "\r\n\r\nx",
                          &used),
                     HCONN_REQUEST);
    assert_false(c.req.keep_alive);
    hconn_free(&c);
}

/* The request is rejected with status. */
static void assert_rejected(const char *in, int status)
{
    struct http_conn c;
    hconn_init(&c, &limits);
    size_t used;
    enum hconn_event ev = hconn_parse(&c, in, strlen(in), &used);
    if (ev != HCONN_ERROR || c.err_status != status)
        fail_msg("'%s': event %d status %d, wanted an error %d", in, ev, c.err_status, status);
    assert_non_null(c.err_detail);
    hconn_free(&c);
}

static void test_rejections(void **state)
{
    (void)state;
    assert_rejected("\x16\x03\x01\x02\x00", 400);
    assert_rejected("hello world\r\n\r\n", 400);
    assert_rejected("GET / HTTP/2.0\r\n\r\n", 400);
    assert_rejected(
        "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n",
        400);
    assert_rejected("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\n",
                    400);
    assert_rejected("POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
                    "transfer-encoding: chunked\r\n\r\n",
                    400);
    assert_rejected("POST / HTTP/1.1\r\nHost: x\r\nContent-Length : 1\r\n\r\nx", 400);
    assert_rejected("POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", 501);
    assert_rejected("POST / HTTP/1.1\r\nHost: x\r\nExpect: magic\r\nContent-Length: 1\r\n\r\n",
                    417);
    assert_rejected("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 101\r\n\r\n", 413);
    assert_rejected("POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n65\r\n", 413);
    assert_rejected("GET /%zz HTTP/1.1\r\nHost: x\r\n\r\n", 400);
}

/* head_check of the tests: 401 unless the request carries an
 * Authorization header. */
static int check_token(void *arg, const struct http_req *req)
{
    (void)arg;
    return req->authorization ? 0 : 401;
}

/* A peer without the token is refused 401 from the headers whatever size
 * its body announces: the 413 (and the limit it names) is only for a peer
 * that has the token, Content-Length and chunked alike. */
static void test_token_before_body_size(void **state)
{
    (void)state;
    const struct http_limits lim = {.max_head = 1024, .max_body = 100, .head_check = check_token};
    const struct {
        const char *in;
        int status;
    } cases[] = {
        {"PUT /x HTTP/1.1\r\nHost: x\r\nContent-Length: 300000000\r\n\r\n", 401},
        {"PUT /x HTTP/1.1\r\nHost: x\r\nContent-Length: 101\r\n\r\n", 401},
        {"PUT /x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n65\r\n", 401},
        {"PUT /x HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer t\r\n"
         "Content-Length: 101\r\n\r\n",
         413},
        {"PUT /x HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer t\r\n"
         "Transfer-Encoding: chunked\r\n\r\n65\r\n",
         413},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct http_conn c;
        size_t used;
        hconn_init(&c, &lim);
        enum hconn_event ev = hconn_parse(&c, cases[i].in, strlen(cases[i].in), &used);
        if (ev != HCONN_ERROR || c.err_status != cases[i].status)
            fail_msg("case %zu: event %d status %d, wanted an error %d", i, ev, c.err_status,
                     cases[i].status);
        if (cases[i].status == 401)
            assert_null(strstr(c.err_detail, "100")); /* the limit is not told */
        hconn_free(&c);
    }
}

/* RFC 9112 3.2 and 5.2: an HTTP/1.1 request needs exactly one Host; a
 * header line folded onto the next (obs-fold) is refused, wherever the
 * bytes are split. */
static void test_host_and_obs_fold(void **state)
{
    (void)state;
    assert_rejected("GET /health HTTP/1.1\r\n\r\n", 400);
    assert_rejected("GET /health HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", 400);
    struct http_conn c;
    size_t used;
    hconn_init(&c, &limits); /* HTTP/1.0 has no such rule */
    assert_int_equal(feed(&c, "GET /health HTTP/1.0\r\n\r\n", &used), HCONN_REQUEST);
    hconn_free(&c);
    const char *folded[] = {
        "GET /health HTTP/1.1\r\nHost: x\r\nX-A: 1\r\n 2\r\n\r\n",
        "GET /health HTTP/1.1\r\nHost: x\r\nX-A: 1\r\n\t2\r\n\r\n",
        "GET /health HTTP/1.1\r\nHost: x\nX-A: 1\n 2\n\n", /* bare LF line ends */
        "GET /health HTTP/1.1\r\n Host: x\r\n\r\n",        /* after the request line */
        "PUT /r HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n 1\r\n\r\nx",
    };
    for (size_t i = 0; i < sizeof folded / sizeof folded[0]; i++) {
        assert_rejected(folded[i], 400);
        hconn_init(&c, &limits); /* byte by byte: the state carries over */
        enum hconn_event ev = HCONN_MORE;
        for (size_t n = 0; ev == HCONN_MORE && folded[i][n]; n++)
            ev = hconn_parse(&c, folded[i] + n, 1, &used);
        if (ev != HCONN_ERROR || c.err_status != 400 || !strstr(c.err_detail, "obs-fold"))
            fail_msg("'%s' byte by byte: event %d status %d", folded[i], ev, c.err_status);
        hconn_free(&c);
    }
    /* A body is not a head: spaces after line ends in it are data. */
    const char *body = "PUT /r HTTP/1.1\r\nHost: x\r\nContent-Length: 6\r\n\r\na\n b\n ";
    hconn_init(&c, &limits);
    assert_int_equal(feed(&c, body, &used), HCONN_REQUEST);
    assert_int_equal(c.req.body_len, 6);
    hconn_done(&c);
    /* and the next request's head is scanned afresh */
    assert_int_equal(feed(&c, "GET / HTTP/1.1\r\nHost: x\r\nA: 1\r\n\tb\r\n\r\n", &used),
                     HCONN_ERROR);
    hconn_free(&c);
}

/* Feed in byte by byte; returns the last event. */
static enum hconn_event feed_bytes(struct http_conn *c, const char *in, size_t len)
{
    enum hconn_event ev = HCONN_MORE;
    size_t used;
    for (size_t n = 0; ev == HCONN_MORE && n < len; n++)
        ev = hconn_parse(c, in + n, 1, &used);
    return ev;
}

/* RFC 9112 7.1: a chunked body's framing is checked (http-parser without
 * HTTP_PARSER_STRICT does not), in one piece or byte by byte; a CR in the
 * head or the trailers must be followed by LF (RFC 9112 2.2). */
static void test_chunked_framing(void **state)
{
    (void)state;
#define CHUNKED_HEAD "PUT /r HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
    static const struct {
        const char *in;
        const char *detail;
    } bad[] = {
        {CHUNKED_HEAD "2\r\nabXX0\r\n\r\n", "chunk data not followed by CRLF"},
        {CHUNKED_HEAD "2\r\nab\rX0\r\n\r\n", "chunk data not followed by CRLF"},
        {CHUNKED_HEAD "2\r\nab\n0\r\n\r\n", "chunk data not followed by CRLF"},
        {CHUNKED_HEAD "2\rZab\r\n0\r\n\r\n", "chunk size line not ended by CRLF"},
        {CHUNKED_HEAD "2;a=b\nZ\r\nab\r\n0\r\n\r\n", "chunk size line not ended by CRLF"},
        {CHUNKED_HEAD "2;a=\x01\r\nab\r\n0\r\n\r\n", "control byte in a chunk extension"},
        {CHUNKED_HEAD "2 x\r\nab\r\n0\r\n\r\n", "chunk extension without ';'"},
        {CHUNKED_HEAD "0\rX\r\n", "chunk size line not ended by CRLF"},
        /* a CR inside a line: http-parser's own "LF character expected" */
        {CHUNKED_HEAD "0\r\nX-T: 1\rZ\r\n", ""},
        {CHUNKED_HEAD "0\r\n\rZ", "header line not ended by CRLF"},
        {CHUNKED_HEAD "0\r\nX-T: 1\r\n 2\r\n\r\n", "obs-fold"},
        {"PUT /r HTTP/1.1\r\nHost: x\rZTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", ""},
        {"PUT /r HTTP/1.1\rZHost: x\r\n\r\n", ""},
        {"PUT /r HTTP/1.1\r\nHost: x\r\n\rZ", "header line not ended by CRLF"},
        /* the empty lines skipped before a request do not end its head */
        {"\r\n\r\nGET / HTTP/1.1\r\nHost: x\r\nA: 1\r\n 2\r\n\r\n", "obs-fold"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        for (int bytes = 0; bytes < 2; bytes++) {
            struct http_conn c;
            size_t used;
            hconn_init(&c, &limits);
            size_t len = strlen(bad[i].in);
            enum hconn_event ev =
                bytes ? feed_bytes(&c, bad[i].in, len) : hconn_parse(&c, bad[i].in, len, &used);
            if (ev != HCONN_ERROR || c.err_status != 400 || !strstr(c.err_detail, bad[i].detail) ||
                strncmp(c.err_detail, "Malformed HTTP request: ", 24))
                fail_msg("case %zu (%s): event %d status %d detail %s", i,
                         bytes ? "byte by byte" : "whole", ev, c.err_status,
                         c.err_detail ? c.err_detail : "-");
            hconn_free(&c);
        }
    }
    /* Well-framed: extensions (BWS included), upper-case hex, leading
     * zeros, trailers, then a pipelined request, whole or byte by byte. */
    const char ok[] = CHUNKED_HEAD "3 ;a=b;c=\"d e\"\r\nabc\r\n00A\r\n0123456789\r\n"
                                   "000;z\r\nX-T: 1\r\nY: 2\r\n\r\n"
                                   "GET /health HTTP/1.1\r\nHost: x\r\n\r\n";
    for (int bytes = 0; bytes < 2; bytes++) {
        struct http_conn c;
        size_t used;
        hconn_init(&c, &limits);
        size_t off = 0;
        enum hconn_event ev;
        if (bytes) {
            ev = HCONN_MORE;
            for (; ev == HCONN_MORE && off < sizeof ok - 1; off++)
                ev = hconn_parse(&c, ok + off, 1, &used);
        } else {
            ev = hconn_parse(&c, ok, sizeof ok - 1, &used);
            off = used;
        }
        assert_int_equal(ev, HCONN_REQUEST);
        assert_int_equal(c.req.body_len, 13);
        assert_memory_equal(c.req.body, "abc0123456789", 13);
        hconn_done(&c);
        assert_int_equal(hconn_parse(&c, ok + off, sizeof ok - 1 - off, &used), HCONN_REQUEST);
        assert_int_equal(c.req.method, HTTP_GET);
        assert_int_equal(off + used, sizeof ok - 1);
        hconn_free(&c);
    }
    /* With Expect: 100-continue, the scan starts after the 100. */
    struct http_conn c;
    size_t used;
    const char cont[] = "PUT /r HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n"
                        "Transfer-Encoding: chunked\r\n\r\n1\r\nab\r\n0\r\n\r\n";
    hconn_init(&c, &limits);
    assert_int_equal(hconn_parse(&c, cont, sizeof cont - 1, &used), HCONN_CONTINUE);
    assert_int_equal(hconn_parse(&c, cont + used, sizeof cont - 1 - used, &used), HCONN_ERROR);
    assert_non_null(strstr(c.err_detail, "chunk data not followed by CRLF"));
    hconn_free(&c);
#undef CHUNKED_HEAD
}

static void test_head_limit(void **state)
{
    (void)state;
    char big[4096];
    memcpy(big, "GET /", 5);
    memset(big + 5, 'a', sizeof big - 6);
    big[sizeof big - 1] = '\0';
    assert_rejected(big, 414); /* the request line: URI Too Long */
    memcpy(big, "GET / HTTP/1.1\r\nHost: x\r\nX: ", 19);
    assert_rejected(big, 431);
    struct http_conn c; /* the limit counts across feeds, byte by byte */
    hconn_init(&c, &limits);
    size_t used, n = 0;
    enum hconn_event ev = HCONN_MORE;
    for (; ev == HCONN_MORE && n < sizeof big - 1; n++)
        ev = hconn_parse(&c, big + n, 1, &used);
    assert_int_equal(ev, HCONN_ERROR);
    assert_int_equal(c.err_status, 431);
    assert_true(n < 1100);
    hconn_free(&c);
}

static void test_targets(void **state)
{
    (void)state;
    struct http_conn c;
    size_t used;
    hconn_init(&c, &limits);
    assert_int_equal(feed(&c, "GET http://h:1/health?rank=2 HTTP/1.1\r\nHost: x\r\n\r\n", &used),
                     HCONN_REQUEST);
    assert_int_equal(c.req.path_len, 7);
    assert_memory_equal(c.req.path, "/health", 7);
    assert_memory_equal(c.req.query, "rank=2", 6);
    hconn_free(&c);
    hconn_init(&c, &limits);
    assert_int_equal(
        feed(&c, "GET /x#frag HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", &used),
        HCONN_REQUEST);
    assert_int_equal(c.req.path_len, 2);
    assert_int_equal(c.req.query_len, 0);
    assert_false(c.req.keep_alive);
    hconn_free(&c);
}

/* ---- http_resp.c --------------------------------------------------------------- */

static void test_json_escape(void **state)
{
    (void)state;
    const char *s = "a\"b\\c\n\x01\xc3\xa9";
    char out[64];
    size_t n = json_escape_len(s, strlen(s));
    assert_int_equal(n, 1 + 2 + 1 + 2 + 1 + 2 + 6 + 2);
    assert_ptr_equal(json_escape(out, s, strlen(s)), out + n);
    assert_memory_equal(out, "a\\\"b\\\\c\\n\\u0001\xc3\xa9", n);
}

static void test_json_escape_invalid_utf8(void **state)
{
    (void)state;
    /* a cut sequence, a stray continuation, an overlong '/', a surrogate,
     * above U+10FFFF; then valid 2-, 3- and 4-byte characters */
    const char *s =
        "a\xc3\"\x80\xc0\xaf\xed\xa0\x80\xf4\x90\x80\x80|\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80";
    const char *want = "a\\ufffd\\\"\\ufffd\\ufffd\\ufffd\\ufffd\\ufffd\\ufffd\\ufffd\\ufffd"
                       "\\ufffd\\ufffd|\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80";
    char out[128];
    size_t n = json_escape_len(s, strlen(s));
    assert_int_equal(n, strlen(want));
    assert_ptr_equal(json_escape(out, s, strlen(s)), out + n);
    assert_memory_equal(out, want, n);
}

/* The per-peer table against plain counts: random takes and puts over a
 * few addresses that collide (a small table), every count and cap right
 * after each step, and the table empty at the end (backward-shift
 * deletion keeps every run findable). */
static void test_peers_table(void **state)
{
    (void)state;
    enum { NADDR = 40, CAP = 5 };
    struct peers p;
    assert_int_equal(peers_init(&p, 30), 0);
    struct peer_addr a[NADDR];
    unsigned want[NADDR] = {0};
    memset(a, 0, sizeof a);
    for (int i = 0; i < NADDR; i++) {
        a[i].valid = 1;
        a[i].a[10] = a[i].a[11] = 0xff;
        a[i].a[12] = 10, a[i].a[15] = (uint8_t)i;
    }
    uint32_t x = 12345;
    unsigned held = 0;
    for (int step = 0; step < 200000; step++) {
        x = x * 1103515245u + 12345u;
        int i = (int)((x >> 8) % NADDR);
        if ((x >> 20) & 1) {
            int ok = held < 30 && peers_take(&p, &a[i], CAP);
            if (held < 30) {
                assert_int_equal(ok, want[i] < CAP);
                if (ok && !want[i]++) /* a new entry: its record marked */
                    *peers_bytes(&p, &a[i]) = 1000u + (unsigned)i;
                held += (unsigned)ok;
            }
        } else if (want[i]) {
            peers_put(&p, &a[i]);
            want[i]--, held--;
        }
        for (int j = 0; j < NADDR; j++) {
            assert_int_equal(peers_count(&p, &a[j]), want[j]);
            if (want[j]) /* records stay put while entries move */
                assert_int_equal(*peers_bytes(&p, &a[j]), 1000u + (unsigned)j);
            else
                assert_null(peers_bytes(&p, &a[j]));
        }
    }
    for (int i = 0; i < NADDR; i++)
        while (want[i]--)
            peers_put(&p, &a[i]);
    assert_int_equal(p.used, 0);
    char buf[64];
    assert_string_equal(peer_addr_str(&a[7], buf, sizeof buf), "10.0.0.7");
    peers_free(&p);
}

static void test_resp_detail(void **state)
{
    (void)state;
    struct buf b = {0};
    struct http_req req = {.method = HTTP_GET, .http_minor = 0, .keep_alive = 1};
    resp_detail(&b, &req, 404, "No \"x\"", "Allow: GET\r\n");
    buf_append(&b, "", 1);
    assert_non_null(strstr(b.p, "HTTP/1.1 404 Not Found\r\n"));
    assert_non_null(strstr(b.p, "Content-Type: application/json\r\n"));
    assert_non_null(strstr(b.p, "Content-Length: 21\r\n"));
    assert_non_null(strstr(b.p, "Connection: keep-alive\r\n")); /* HTTP/1.0 keep-alive */
    assert_non_null(strstr(b.p, "Allow: GET\r\n"));
    assert_non_null(strstr(b.p, "\r\n\r\n{\"detail\":\"No \\\"x\\\"\"}"));
    buf_reset(&b);
    req.method = HTTP_HEAD;
    req.keep_alive = 0;
    resp_ok(&b, &req);
    buf_append(&b, "", 1);
    assert_non_null(strstr(b.p, "Connection: close\r\n"));
    assert_non_null(strstr(b.p, "Content-Length: 2\r\n"));
    assert_null(strstr(b.p, "\r\n\r\nOK")); /* HEAD: no body */
    buf_free(&b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pct_decode),
        cmocka_unit_test(test_peers_table),
        cmocka_unit_test(test_query_parse),
        cmocka_unit_test(test_parse_uint),
        cmocka_unit_test(test_parse_rank),
        cmocka_unit_test(test_pipelined_requests),
        cmocka_unit_test(test_chunked_split_anywhere),
        cmocka_unit_test(test_expect_continue),
        cmocka_unit_test(test_rejections),
        cmocka_unit_test(test_token_before_body_size),
        cmocka_unit_test(test_host_and_obs_fold),
        cmocka_unit_test(test_chunked_framing),
        cmocka_unit_test(test_head_limit),
        cmocka_unit_test(test_targets),
        cmocka_unit_test(test_json_escape),
        cmocka_unit_test(test_json_escape_invalid_utf8),
        cmocka_unit_test(test_resp_detail),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
