/* test_log.c - kvcoordd's log escaping: every string value goes through
 * log_escape() (quotes, backslashes, control bytes, invalid UTF-8), and an
 * unquoted value that would not stay one token is quoted. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "log.h"

static const char *esc(const char *s, size_t n, int quote)
{
    static char buf[256];
    size_t len = log_escape(buf, sizeof buf - 1, s, n, quote);
    assert_true(len < sizeof buf);
    buf[len] = '\0';
    return buf;
}

static void test_escape(void **st)
{
    (void)st;
    assert_string_equal(esc("plain", 5, 0), "plain");
    assert_string_equal(esc("a\"b\\c", 5, 0), "a\\\"b\\\\c");
    assert_string_equal(esc("l1\nl2\r\t", 7, 0), "l1\\nl2\\r\\t");
    assert_string_equal(esc("\x01\x1f\x7f", 3, 0), "\\x01\\x1f\\x7f");
    assert_string_equal(esc("nul\0x", 5, 0), "nul\\x00x");
    /* Valid UTF-8 passes; invalid bytes are escaped one by one. */
    assert_string_equal(esc("caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80", 14, 0),
                        "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80");
    assert_string_equal(esc("\xff\xc3", 2, 0), "\\xff\\xc3");                   /* bad, truncated */
    assert_string_equal(esc("\xc0\xaf", 2, 0), "\\xc0\\xaf");                   /* overlong '/' */
    assert_string_equal(esc("\xed\xa0\x80", 3, 0), "\\xed\\xa0\\x80");          /* surrogate */
    assert_string_equal(esc("\xf4\x90\x80\x80", 4, 0), "\\xf4\\x90\\x80\\x80"); /* > U+10FFFF */
    assert_string_equal(esc("x", 1, 1), "\"x\"");
    /* Truncation: the length is the whole escaped text, only cap written. */
    char small[4] = "zzz";
    assert_int_equal(log_escape(small, 2, "\"\"", 2, 0), 4);
    assert_memory_equal(small, "\\\"z", 3);
}

static const char *fmt_line(const char *s)
{
    static char buf[512];
    size_t n = log_format(buf, sizeof buf - 1, "a=%s b=\"%s\" c=%.*s n=%d u=%llu z=%zu x=%x", s, s,
                          3, s, -7, 18446744073709551615ull, (size_t)42, 255u);
    assert_true(n < sizeof buf);
    buf[n] = '\0';
    return buf;
}

static void test_format(void **st)
{
    (void)st;
    assert_string_equal(fmt_line("v"), "a=v b=\"v\" c=v n=-7 u=18446744073709551615 z=42 x=ff");
    /* Log injection: the value stays one field of one line. */
    assert_string_equal(fmt_line("x\" level=error evil=\"1"),
                        "a=\"x\\\" level=error evil=\\\"1\" b=\"x\\\" level=error evil=\\\"1\" "
                        "c=\"x\\\" \" n=-7 u=18446744073709551615 z=42 x=ff");
    assert_string_equal(fmt_line("two words"),
                        "a=\"two words\" b=\"two words\" c=two n=-7 u=18446744073709551615 "
                        "z=42 x=ff");
    assert_string_equal(fmt_line(""), "a=\"\" b=\"\" c=\"\" n=-7 u=18446744073709551615 z=42 x=ff");
    assert_string_equal(
        fmt_line("k=v\n"),
        "a=\"k=v\\n\" b=\"k=v\\n\" c=\"k=v\" n=-7 u=18446744073709551615 z=42 x=ff");
    char buf[64];
    const char *volatile none = NULL; /* hidden from gcc's format checks */
    size_t n = log_format(buf, sizeof buf - 1, "p=%s%% q=%c", (const char *)none, '"');
    buf[n] = '\0';
    assert_string_equal(buf, "p=(null)% q=\"\\\"\"");
    /* Output longer than the buffer: the full length is returned. */
    char tiny[8];
    assert_int_equal(log_format(tiny, sizeof tiny, "%s", "0123456789abcdef"), 16);
    assert_memory_equal(tiny, "01234567", 8);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_escape),
        cmocka_unit_test(test_format),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
