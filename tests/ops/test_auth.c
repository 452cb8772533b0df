/*
 * test_auth.c - the bearer-token matrix of src/auth.c: no header, wrong
 * token, Basic, lower-case bearer, right token, empty configured token,
 * token file with a trailing newline, world-readable file, reload.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "auth.h"

static char dir[64];

/* Write content to dir/name with mode; returns the path (static ring). */
static const char *write_file(const char *name, const char *content, mode_t mode)
{
    static char paths[8][128];
    static int n;
    char *p = paths[n++ % 8];
    snprintf(p, sizeof paths[0], "%s/%s", dir, name);
    FILE *f = fopen(p, "w");
    assert_non_null(f);
    fputs(content, f);
    fclose(f);
    assert_int_equal(chmod(p, mode), 0);
    return p;
}

static int setup(void **state)
{
    (void)state;
    snprintf(dir, sizeof dir, "/tmp/kvc-auth-XXXXXX");
    return mkdtemp(dir) ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    return system(cmd) == 0 ? 0 : -1;
}

static void test_off(void **state)
{
    (void)state;
    struct auth a;
    char err[256];
    assert_int_equal(auth_init(&a, NULL, NULL, err, sizeof err), 0);
    assert_false(auth_enabled(&a));
    assert_int_equal(auth_check(&a, NULL), AUTH_ALLOW);
    assert_int_equal(auth_check(&a, "Basic Zm9vOmJhcg=="), AUTH_ALLOW);
    assert_int_equal(auth_reload(&a, err, sizeof err), 0);
}

static void test_matrix_env(void **state)
{
    (void)state;
    struct auth a;
    char err[256];
    assert_int_equal(auth_init(&a, NULL, "s3cret-Token_1", err, sizeof err), 0);
    assert_true(auth_enabled(&a));
    assert_int_equal(a.source, AUTH_SRC_ENV);
    assert_int_equal(auth_check(&a, NULL), AUTH_DENY_MISSING);
    assert_int_equal(auth_check(&a, "Bearer wrong"), AUTH_DENY_TOKEN);
    assert_int_equal(auth_check(&a, "Bearer s3cret-Token_"), AUTH_DENY_TOKEN);   /* prefix */
    assert_int_equal(auth_check(&a, "Bearer s3cret-Token_12"), AUTH_DENY_TOKEN); /* longer */
    assert_int_equal(auth_check(&a, "Bearer S3CRET-TOKEN_1"), AUTH_DENY_TOKEN);  /* case */
    assert_int_equal(auth_check(&a, "Basic czNjcmV0LVRva2VuXzE="), AUTH_DENY_SCHEME);
    assert_int_equal(auth_check(&a, "Basic s3cret-Token_1"), AUTH_DENY_SCHEME);
    assert_int_equal(auth_check(&a, "s3cret-Token_1"), AUTH_DENY_SCHEME);
    assert_int_equal(auth_check(&a, "Bearer"), AUTH_DENY_SCHEME);
    assert_int_equal(auth_check(&a, "Bearer "), AUTH_DENY_SCHEME);
    assert_int_equal(auth_check(&a, ""), AUTH_DENY_SCHEME);
    assert_int_equal(auth_check(&a, "Bearers3cret-Token_1"), AUTH_DENY_SCHEME);
    assert_int_equal(auth_check(&a, "Bearer s3cret-Token_1"), AUTH_ALLOW);
    assert_int_equal(auth_check(&a, "bearer s3cret-Token_1"), AUTH_ALLOW);
    assert_int_equal(auth_check(&a, "BEARER s3cret-Token_1"), AUTH_ALLOW);
    assert_int_equal(auth_check(&a, "  Bearer   s3cret-Token_1 \t"), AUTH_ALLOW);
    assert_int_equal(auth_check(&a, "Bearer s3cret Token_1"), AUTH_DENY_TOKEN);
    /* not NUL-terminated: only len bytes count */
    assert_int_equal(auth_check_n(&a, "Bearer s3cret-Token_1XYZ", 21), AUTH_ALLOW);
    assert_int_equal(auth_check_n(&a, NULL, 0), AUTH_DENY_MISSING);
    /* a presented token longer than any configured one */
    char big[AUTH_TOKEN_MAX + 64];
    memcpy(big, "Bearer ", 7);
    memset(big + 7, 'x', sizeof big - 8);
    big[sizeof big - 1] = '\0';
    assert_int_equal(auth_check(&a, big), AUTH_DENY_TOKEN);
    /* env: nothing to reload */
    assert_int_equal(auth_reload(&a, err, sizeof err), 0);
    assert_string_equal(auth_result_name(AUTH_DENY_SCHEME), "scheme");
    assert_string_equal(auth_source_name(a.source), "env");
    auth_clear(&a);
    assert_false(auth_enabled(&a));
}

static void test_empty_configured(void **state)
{
    (void)state;
    struct auth a;
    char err[256];
    /* KVCOORD_AUTH_TOKEN="" : fail closed */
    assert_int_equal(auth_init(&a, NULL, "", err, sizeof err), 0);
    assert_true(auth_enabled(&a));
    assert_int_equal(auth_check(&a, NULL), AUTH_DENY_EMPTY_CONFIG);
    assert_int_equal(auth_check(&a, "Bearer "), AUTH_DENY_EMPTY_CONFIG);
    assert_int_equal(auth_check(&a, "Bearer x"), AUTH_DENY_EMPTY_CONFIG);
    /* an empty file, and a file holding only a newline */
    const char *p = write_file("empty", "", 0600);
    assert_int_equal(auth_init(&a, p, NULL, err, sizeof err), 0);
    assert_int_equal(auth_check(&a, "Bearer "), AUTH_DENY_EMPTY_CONFIG);
    p = write_file("nl", "\n", 0600);
    assert_int_equal(auth_init(&a, p, "envtoken", err, sizeof err), 0);
    assert_int_equal(a.source, AUTH_SRC_FILE); /* the file wins over the environment */
    assert_int_equal(auth_check(&a, "Bearer envtoken"), AUTH_DENY_EMPTY_CONFIG);
}

static void test_file(void **state)
{
    (void)state;
    struct auth a;
    char err[256];
    const char *p = write_file("token", "abc.DEF-123\n", 0600);
    assert_int_equal(auth_init(&a, p, "ignored-env", err, sizeof err), 0);
    assert_int_equal(a.source, AUTH_SRC_FILE);
    assert_int_equal(a.token_len, 11);
    assert_int_equal(auth_check(&a, "Bearer abc.DEF-123"), AUTH_ALLOW);
    assert_int_equal(auth_check(&a, "Bearer abc.DEF-123\n"), AUTH_DENY_TOKEN);
    assert_int_equal(auth_check(&a, "Bearer ignored-env"), AUTH_DENY_TOKEN);
    /* CRLF trimmed too; group-readable accepted */
    p = write_file("crlf", "tok\r\n", 0640);
    assert_int_equal(auth_init(&a, p, NULL, err, sizeof err), 0);
    assert_int_equal(auth_check(&a, "Bearer tok"), AUTH_ALLOW);
    /* only ONE newline is trimmed: a second one is a bad byte */
    p = write_file("two", "tok\n\n", 0600);
    assert_int_equal(auth_init(&a, p, NULL, err, sizeof err), -1);
    assert_non_null(strstr(err, "0x0a"));
    assert_false(auth_enabled(&a));
    /* a space inside */
    p = write_file("space", "to k", 0600);
    assert_int_equal(auth_init(&a, p, NULL, err, sizeof err), -1);
}

static void test_file_refused(void **state)
{
    (void)state;
    struct auth a;
    char err[256];
    const char *p = write_file("world", "tok\n", 0644);
    assert_int_equal(auth_init(&a, p, NULL, err, sizeof err), -1);
    assert_non_null(strstr(err, "others"));
    assert_non_null(strstr(err, "0644"));
    assert_false(auth_enabled(&a));
    p = write_file("worldw", "tok\n", 0602);
    assert_int_equal(auth_init(&a, p, NULL, err, sizeof err), -1);
    char missing[128];
    snprintf(missing, sizeof missing, "%s/nope", dir);
    assert_int_equal(auth_init(&a, missing, NULL, err, sizeof err), -1);
    assert_non_null(strstr(err, "No such file"));
    assert_int_equal(auth_init(&a, dir, NULL, err, sizeof err), -1); /* a directory */
    assert_non_null(strstr(err, "regular"));
    /* longest accepted, and one byte more */
    char *t = malloc(AUTH_TOKEN_MAX + 3);
    memset(t, 'k', AUTH_TOKEN_MAX);
    strcpy(t + AUTH_TOKEN_MAX, "\n");
    p = write_file("max", t, 0600);
    assert_int_equal(auth_init(&a, p, NULL, err, sizeof err), 0);
    assert_int_equal(a.token_len, AUTH_TOKEN_MAX);
    char *h = malloc(AUTH_TOKEN_MAX + 16);
    snprintf(h, AUTH_TOKEN_MAX + 16, "Bearer %.*s", AUTH_TOKEN_MAX, t);
    assert_int_equal(auth_check(&a, h), AUTH_ALLOW);
    strcpy(t + AUTH_TOKEN_MAX, "k\n");
    p = write_file("over", t, 0600);
    assert_int_equal(auth_init(&a, p, NULL, err, sizeof err), -1);
    assert_non_null(strstr(err, "longer"));
    free(t);
    free(h);
}

static void test_reload(void **state)
{
    (void)state;
    struct auth a;
    char err[256];
    const char *p = write_file("rl", "first\n", 0600);
    assert_int_equal(auth_init(&a, p, NULL, err, sizeof err), 0);
    assert_int_equal(auth_check(&a, "Bearer first"), AUTH_ALLOW);
    write_file("rl", "second\n", 0600);
    assert_int_equal(auth_check(&a, "Bearer first"), AUTH_ALLOW); /* not before reload */
    assert_int_equal(auth_reload(&a, err, sizeof err), 1);
    assert_int_equal(auth_check(&a, "Bearer first"), AUTH_DENY_TOKEN);
    assert_int_equal(auth_check(&a, "Bearer second"), AUTH_ALLOW);
    /* a bad edit (world-readable) keeps the previous token */
    write_file("rl", "third\n", 0644);
    assert_int_equal(auth_reload(&a, err, sizeof err), -1);
    assert_non_null(strstr(err, "others"));
    assert_int_equal(auth_check(&a, "Bearer second"), AUTH_ALLOW);
    assert_int_equal(auth_check(&a, "Bearer third"), AUTH_DENY_TOKEN);
    assert_null(strstr(err, p)); /* the reason alone: the caller names the file */
    /* a FIFO in the file's place: refused at once, not waited on for a writer */
    unlink(p);
    assert_int_equal(mkfifo(p, 0600), 0);
    assert_int_equal(auth_reload(&a, err, sizeof err), -1);
    assert_string_equal(err, "not a regular file");
    assert_int_equal(auth_check(&a, "Bearer second"), AUTH_ALLOW);
    /* the file removed: old token kept too */
    unlink(p);
    assert_int_equal(auth_reload(&a, err, sizeof err), -1);
    assert_string_equal(err, "open: No such file or directory");
    assert_int_equal(auth_check(&a, "Bearer second"), AUTH_ALLOW);
    /* emptied: fail closed after the reload */
    write_file("rl", "", 0600);
    assert_int_equal(auth_reload(&a, err, sizeof err), 1);
    assert_int_equal(auth_check(&a, "Bearer second"), AUTH_DENY_EMPTY_CONFIG);
    assert_int_equal(a.reloads, 2);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_off),
        cmocka_unit_test(test_matrix_env),
        cmocka_unit_test(test_empty_configured),
        cmocka_unit_test(test_file),
        cmocka_unit_test(test_file_refused),
        cmocka_unit_test(test_reload),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
