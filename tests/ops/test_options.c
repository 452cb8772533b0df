/* test_options.c - kvcoordd's options table against the real program:
 * `kvcoordd --help` lists every row with its range, and every numeric
 * option refuses a value below and above its range (and one that is no
 * number) with exit 2 and a message naming it, while its bounds themselves
 * are accepted.  Usage: test_options KVCOORDD. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "options_table.h"

static const char *daemon_path;
static char out[64 * 1024];

/* Run kvcoordd with args (NULL-terminated, after argv[0]); stream 1 or 2
 * into out; returns the exit status (-1: killed). */
static int run(int stream, const char *const *args)
{
    const char *argv[16] = {daemon_path};
    size_t n = 1;
    while (args[n - 1] && n < 15) {
        argv[n] = args[n - 1];
        n++;
    }
    argv[n] = NULL;
    int p[2];
    assert_int_equal(pipe(p), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        int null = open("/dev/null", O_WRONLY);
        dup2(null, 3 - stream);
        dup2(p[1], stream);
        close(p[0]);
        unsetenv("SGLANG_DISAGGREGATION_BOOTSTRAP_ENTRY_CLEANUP_INTERVAL");
        execv(daemon_path, (char *const *)argv);
        _exit(127);
    }
    close(p[1]);
    size_t len = 0;
    ssize_t r;
    while ((r = read(p[0], out + len, sizeof out - 1 - len)) > 0)
        len += (size_t)r;
    out[len] = '\0';
    close(p[0]);
    int st;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* The help paragraph of option name: from its line to the next option's. */
static const char *paragraph(const char *help, const char *name, char *buf, size_t cap)
{
    char key[64];
    snprintf(key, sizeof key, "--%s", name);
    for (const char *p = help; (p = strstr(p, key)); p++) {
        const char *line = p;
        while (line > help && line[-1] != '\n')
            line--;
        /* "  --name" or "  -X, --name", followed by a space or the line's end */
        int starts = (p - line == 2 || (p - line == 6 && line[2] == '-')) && line[0] == ' ';
        char after = p[strlen(key)];
        if (!starts || (after != ' ' && after != '\n'))
            continue;
        const char *end = strstr(p, "\n  -");
        const char *blank = strstr(p, "\n\n");
        if (!end || (blank && blank < end))
            end = blank;
        size_t n = end ? (size_t)(end - line) : strlen(line);
        snprintf(buf, cap, "%.*s", (int)(n < cap ? n : cap - 1), line);
        return buf;
    }
    return NULL;
}

static void test_help_lists_every_row(void **st)
{
    (void)st;
    assert_int_equal(run(1, (const char *[]){"--help", NULL}), 0);
    static char help[sizeof out];
    memcpy(help, out, sizeof out);
    for (size_t i = 0; i < opt_nrows; i++) {
        const struct opt_row *r = &opt_rows[i];
        char para[4096], range[64];
        const char *p = paragraph(help, r->name, para, sizeof para);
        if (!p)
            fail_msg("--help does not list --%s", r->name);
        if (r->arg)
            assert_non_null(strstr(p, r->arg));
        if (r->kind == OPT_COUNT) {
            snprintf(range, sizeof range, "%llu..%llu", (unsigned long long)r->min,
                     (unsigned long long)r->max);
            if (!strstr(p, range))
                fail_msg("--%s's help does not give its range %s:\n%s", r->name, range, p);
        }
        for (const char *l = p; *l;) { /* no line past 79 columns */
            size_t n = strcspn(l, "\n");
            if (n > 79)
                fail_msg("--%s's help has a line of %zu columns", r->name, n);
            l += n + (l[n] != '\0');
        }
    }
}

/* kvcoordd --NAME VALUE extra: "invalid --NAME 'VALUE'" (exit 2) when the
 * value is refused; "unexpected argument 'extra'" (also exit 2, nothing
 * started) when it is accepted. */
static void expect(const struct opt_row *r, const char *v, int accepted)
{
    char opt[64], want[160];
    snprintf(opt, sizeof opt, "--%s", r->name);
    int rc = run(2, (const char *[]){opt, v, "extra", NULL});
    if (rc != 2)
        fail_msg("%s %s exited %d, not 2: %s", opt, v, rc, out);
    if (accepted)
        snprintf(want, sizeof want, "kvcoordd: unexpected argument 'extra'");
    else
        snprintf(want, sizeof want, "kvcoordd: invalid %s '%s' (expected ", opt, v);
    if (strncmp(out, want, strlen(want)))
        fail_msg("%s %s: wanted \"%s...\", got: %s", opt, v, want, out);
}

static void test_numeric_values_checked(void **st)
{
    (void)st;
    int checked = 0;
    for (size_t i = 0; i < opt_nrows; i++) {
        const struct opt_row *r = &opt_rows[i];
        if (r->kind != OPT_COUNT && r->kind != OPT_SIZE)
            continue;
        char v[32];
        snprintf(v, sizeof v, "%llu", (unsigned long long)r->min);
        expect(r, v, 1);
        snprintf(v, sizeof v, "%llu", (unsigned long long)r->max);
        expect(r, v, 1);
        if (r->min > 0) {
            snprintf(v, sizeof v, "%llu", (unsigned long long)r->min - 1);
            expect(r, v, 0);
        }
        snprintf(v, sizeof v, "%llu", (unsigned long long)r->max + 1);
        expect(r, v, 0);
        expect(r, "twelve", 0);
        expect(r, "-1", 0);
        checked++;
    }
    assert_true(checked >= 19); /* 13 counts and 6 sizes when written */
}

/* Options each valid alone that cannot work together: refused, exit 2,
 * naming both.  (The token file that does not exist makes a daemon that
 * accepted them exit 1 at start instead of serving.) */
#define NO_TOKEN "--auth-token-file", "/nonexistent/kvcoord-test-token"
static void test_per_peer_cap_above_max_conns(void **st)
{
    (void)st;
    int rc =
        run(2, (const char *[]){"--max-conns", "10", "--max-conns-per-peer", "20", NO_TOKEN, NULL});
    assert_int_equal(rc, 2);
    if (!strstr(out, "kvcoordd: --max-conns-per-peer 20 is above --max-conns 10"))
        fail_msg("not named: %s", out);
    assert_non_null(strstr(out, "Try 'kvcoordd --help'"));
    rc =
        run(2, (const char *[]){"--max-conns-per-peer", "20", "--max-conns", "10", NO_TOKEN, NULL});
    assert_int_equal(rc, 2); /* in either order */
    assert_non_null(strstr(out, "is above --max-conns 10"));
}

/* An option with a value given twice: exit 2 naming it (the last one used
 * to win silently); a flag given twice stays harmless. */
static void test_repeat_refused(void **st)
{
    (void)st;
    /* NO_TOKEN: a daemon that accepted the repeat exits 1 at start (no hang) */
    int rc = run(
        2, (const char *[]){"--listen", "127.0.0.1:0", "--listen", "127.0.0.1:1", NO_TOKEN, NULL});
    assert_int_equal(rc, 2);
    if (!strstr(out, "kvcoordd: option '--listen' is given more than once (again as "
                     "'127.0.0.1:1'): give it once"))
        fail_msg("not named: %s", out);
    assert_non_null(strstr(out, "Try 'kvcoordd --help'"));
    rc = run(2, (const char *[]){"--max-conns=10", "--max-conns", "10", NO_TOKEN, NULL});
    assert_int_equal(rc, 2); /* the same value too, any spelling */
    assert_non_null(strstr(out, "option '--max-conns' is given more than once"));
    rc = run(2, (const char *[]){"--fresh", "--fresh", "--world-size", "99", NULL});
    assert_int_equal(rc, 2); /* refused for the world size, not the repeated flag */
    assert_null(strstr(out, "more than once"));
    rc = run(1, (const char *[]){"--help", NULL});
    assert_int_equal(rc, 0);
    assert_non_null(strstr(out, "Each option with a value is given once"));
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: test_options KVCOORDD\n");
        return 2;
    }
    daemon_path = argv[1];
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_help_lists_every_row),
        cmocka_unit_test(test_numeric_values_checked),
        cmocka_unit_test(test_per_peer_cap_above_max_conns),
        cmocka_unit_test(test_repeat_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
