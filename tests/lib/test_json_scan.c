/* test_json_scan.c - the strict JSON scanner (src/common/json_scan.h):
 * what it accepts and refuses, where it says the error is, what its
 * watches record, and the library's use of it (numbers stored as sent). */
#include "json_scan.h"
#include "testutil.h"

static int scan(const char *text)
{
    return kvc__json_scan(text, strlen(text), NULL, 0, NULL, NULL);
}

static void test_valid_and_invalid(void **st)
{
    (void)st;
    static const char *valid[] = {
        "{}",
        "[]",
        "0",
        "-0",
        "1.5e-3",
        "1E5",
        "0.1",
        "\"\"",
        "true",
        "false",
        "null",
        " \t\r\n{ \"a\" : [ 1 , 2 ] } \n",
        "18446744073709551615",
        "-9223372036854775808",
        "1e400",
        "[\"\\u0000\"]",
        "\"\\ud83d\\ude00\"",
        "\"caf\xc3\xa9 \xf0\x9f\x98\x80\"",
        "\"\\\"\\\\\\/\\b\\f\\n\\r\\t\"",
        "{\"a\":1,\"a\":2}",
        "\"\x7f\"",
    };
    static const char *invalid[] = {
        "",
        " ",
        "{",
        "[1,]",
        "{\"a\":1,}",
        "{a:1}",
        "01",
        "-",
        "1.",
        "1e",
        ".5",
        "+1",
        "18446744073709551616",
        "-9223372036854775809",
        "123456789012345678901",
        "\"\\ud800\"",
        "\"\\udc00\"",
        "\"\\ud800\\u0041\"",
        "\"\\x\"",
        "\"\\u12g4\"",
        "\"\t\"",
        "\"\xff\"",
        "\"\xc0\x80\"",
        "\"\xed\xa0\x80\"",
        "\"\xf4\x90\x80\x80\"",
        "\"\xe2\x82\"",
        "tru",
        "nul",
        "[1 2]",
        "{\"a\" 1}",
        "1 2",
        "\"abc",
        "[\"a\\",
    };
    for (size_t i = 0; i < sizeof valid / sizeof valid[0]; i++)
        if (scan(valid[i]) != 0)
            fail_msg("refused valid JSON: %s", valid[i]);
    for (size_t i = 0; i < sizeof invalid / sizeof invalid[0]; i++)
        if (scan(invalid[i]) != -1)
            fail_msg("accepted invalid JSON: %s", invalid[i]);
    /* A NUL byte is refused wherever it is. */
    assert_int_equal(kvc__json_scan("{}\0", 3, NULL, 0, NULL, NULL), -1);
    assert_int_equal(kvc__json_scan("\"a\0\"", 4, NULL, 0, NULL, NULL), -1);
}

static void test_depth(void **st)
{
    (void)st;
    char *deep = malloc(2 * (KVC_JSON_MAX_DEPTH + 1) + 1);
    assert_non_null(deep);
    for (int n = KVC_JSON_MAX_DEPTH; n <= KVC_JSON_MAX_DEPTH + 1; n++) {
        memset(deep, '[', (size_t)n);
        memset(deep + n, ']', (size_t)n);
        deep[2 * n] = '\0';
        struct kvc_json_error err;
        int rc = kvc__json_scan(deep, strlen(deep), NULL, 0, NULL, &err);
        assert_int_equal(rc, n == KVC_JSON_MAX_DEPTH ? 0 : -1);
        if (rc) {
            assert_int_equal(err.offset, KVC_JSON_MAX_DEPTH);
            assert_non_null(strstr(err.text, "nesting"));
        }
    }
    free(deep);
}

static void test_error_position(void **st)
{
    (void)st;
    struct kvc_json_error err;
    const char *t = "{\n  \"caf\xc3\xa9\": x}";
    assert_int_equal(kvc__json_scan(t, strlen(t), NULL, 0, NULL, &err), -1);
    assert_int_equal(err.line, 2);
    assert_int_equal(err.column, 11); /* characters, not bytes: é is one */
    assert_int_equal(err.offset, (size_t)(strchr(t, 'x') - t));
    t = "{\"a\": \"unterminated";
    assert_int_equal(kvc__json_scan(t, strlen(t), NULL, 0, NULL, &err), -1);
    assert_int_equal(err.offset, strlen(t));
    assert_string_equal(err.text, "unterminated string");
}

static void test_watches(void **st)
{
    (void)st;
    const char *t = "{\"r\\u0061nk\": 7, \"tei\": {\"sid\": \"old\", \"wid\": {\"x\": 1}}, "
                    "\"tei\": {\"sid\": \"h\\u003a1 \\ud83d\\ude00\", \"wid\": {\"a\": [0.1, 1E5], "
                    "\"b\": 18446744073709551615, \"c\": {}}}, \"other\": {\"sid\": 1}}";
    struct kvc_json_watch w[4] = {{.parent = -1, .key = "rank"},
                                  {.parent = -1, .key = "tei"},
                                  {.parent = 1, .key = "sid"},
                                  {.parent = 1, .key = "wid"}};
    struct kvc_json_root root;
    assert_int_equal(kvc__json_scan(t, strlen(t), w, 4, &root, NULL), 0);
    assert_int_equal(root.type, KVC_JSON_OBJECT);
    assert_int_equal(root.members, 4);             /* as written: "tei" twice */
    assert_int_equal(w[0].type, KVC_JSON_INTEGER); /* escaped key matched */
    int neg;
    uint64_t v;
    kvc__json_integer(t, w[0].start, w[0].end, &neg, &v);
    assert_int_equal(neg, 0);
    assert_int_equal(v, 7);
    /* the last "tei" wins, whole */
    assert_int_equal(w[2].type, KVC_JSON_STRING);
    char sid[64];
    int nul;
    assert_int_equal(kvc__json_string(t, w[2].start, w[2].end, sid, sizeof sid, &nul), 8);
    assert_string_equal(sid, "h:1 \xf0\x9f\x98\x80");
    assert_int_equal(nul, 0);
    assert_int_equal(kvc__json_string(t, w[2].start, w[2].end, sid, 8, NULL), -1);
    assert_int_equal(w[3].type, KVC_JSON_OBJECT);
    assert_int_equal(w[3].members, 3);
    const char *want = "{\"a\": [0.1, 1E5], \"b\": 18446744073709551615, \"c\": {}}";
    assert_int_equal(w[3].end - w[3].start, strlen(want));
    assert_memory_equal(t + w[3].start, want, strlen(want));
    /* a parent repeated with a value of another type: nothing recorded
     * under its first occurrence survives (found by fuzz_json_scan) */
    const char *d = "{\"tei\": {\"sid\": \"x\", \"wid\": {}}, \"tei\": 4073709551615}";
    assert_int_equal(kvc__json_scan(d, strlen(d), w, 4, &root, NULL), 0);
    assert_int_equal(w[1].type, KVC_JSON_INTEGER);
    assert_int_equal(w[2].type, KVC_JSON_NONE);
    assert_int_equal(w[3].type, KVC_JSON_NONE);
    /* ... and a child repeated inside the one parent: its last value */
    const char *e = "{\"tei\": {\"sid\": [1], \"sid\": true}}";
    assert_int_equal(kvc__json_scan(e, strlen(e), w, 4, &root, NULL), 0);
    assert_int_equal(w[2].type, KVC_JSON_TRUE);
    /* invalid: nothing recorded */
    assert_int_equal(kvc__json_scan(t, strlen(t) - 1, w, 4, &root, NULL), -1);
    for (int i = 0; i < 4; i++)
        assert_int_equal(w[i].type, KVC_JSON_NONE);
    kvc__json_integer("-0", 0, 2, &neg, &v);
    assert_int_equal(neg, 0);
    kvc__json_integer("-9223372036854775808", 0, 20, &neg, &v);
    assert_int_equal(neg, 1);
    assert_true(v == UINT64_C(9223372036854775808));
    assert_int_equal(kvc__json_string("\"a\\u0000b\"", 0, 10, sid, sizeof sid, &nul), 3);
    assert_int_equal(nul, 1);
}

/* The library validates with the scanner and stores the bytes as given. */
static void test_library_stores_as_sent(void **st)
{
    (void)st;
    const char *name = tu_name();
    kvc_segment *s = tu_open(name, KVC_OPEN_FRESH, KVC_ROLE_WORKER);
    const char *wid = "{\"a\": [0.1, 1E5, 18446744073709551615], \"b\":-0}";
    uint64_t gen;
    assert_int_equal(kvc_rank_register(s, 1, "h:1", wid, strlen(wid), &gen), KVC_OK);
    kvc_rank_info ri = {0};
    assert_int_equal(kvc_rank_lookup(s, 1, &ri), KVC_OK);
    assert_string_equal(ri.info, wid);
    assert_int_equal(ri.entries, 2);
    const char *bad = "{\"a\": 18446744073709551616}";
    assert_int_equal(kvc_rank_register(s, 2, "h:1", bad, strlen(bad), &gen), KVC_E_INVAL);
    assert_non_null(strstr(kvc_last_error(), "integer out of range"));
    assert_non_null(strstr(kvc_last_error(), "column 7"));
    assert_int_equal(kvc_rank_register(s, 2, "h:1", "[1]", 3, &gen), KVC_E_INVAL);
    kvc_rank_info_free(&ri);
    kvc_close(s);
    kvc_unlink(name);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_valid_and_invalid),      cmocka_unit_test(test_depth),
        cmocka_unit_test(test_error_position),         cmocka_unit_test(test_watches),
        cmocka_unit_test(test_library_stores_as_sent),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
