/*
 * test_notify.c - src/notify.c against a unix datagram socket standing in
 * for systemd's: NOTIFY_SOCKET as a path and as an @abstract name, unset,
 * and invalid.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cmocka.h>

#include "notify.h"

/* Bind a datagram socket at name (path, or "@abstract"). */
static int listener(const char *name)
{
    int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    assert_true(fd >= 0);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    size_t n = strlen(name);
    memcpy(sa.sun_path, name, n);
    socklen_t len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + n);
    if (name[0] == '@')
        sa.sun_path[0] = '\0';
    else
        len++;
    assert_int_equal(bind(fd, (struct sockaddr *)&sa, len), 0);
    return fd;
}

/* Receive one datagram (the send happened already: never blocks). */
static void expect_msg(int fd, const char *want_prefix)
{
    char buf[512];
    ssize_t n = recv(fd, buf, sizeof buf - 1, MSG_DONTWAIT);
    assert_true(n > 0);
    buf[n] = '\0';
    if (strncmp(buf, want_prefix, strlen(want_prefix)))
        fail_msg("got '%s', want prefix '%s'", buf, want_prefix);
}

static void test_path(void **state)
{
    (void)state;
    char path[64];
    snprintf(path, sizeof path, "/tmp/kvc-notify-%d.sock", (int)getpid());
    unlink(path);
    int fd = listener(path);
    setenv("NOTIFY_SOCKET", path, 1);
    assert_int_equal(notify_ready(NULL), 1);
    expect_msg(fd, "READY=1");
    assert_int_equal(notify_ready("listening on 127.0.0.1:6789"), 1);
    expect_msg(fd, "READY=1\nSTATUS=listening on 127.0.0.1:6789");
    assert_int_equal(notify_reloading(), 1);
    expect_msg(fd, "RELOADING=1\nMONOTONIC_USEC=");
    assert_int_equal(notify_stopping(), 1);
    expect_msg(fd, "STOPPING=1");
    close(fd);
    unlink(path);
    /* the socket is gone: an error, not a crash */
    char err[256] = "";
    assert_int_equal(notify_send("READY=1", err, sizeof err), -1);
    assert_non_null(strstr(err, "sendto"));
    unsetenv("NOTIFY_SOCKET");
}

static void test_abstract(void **state)
{
    (void)state;
    char name[64];
    snprintf(name, sizeof name, "@kvc-notify-test-%d", (int)getpid());
    int fd = listener(name);
    setenv("NOTIFY_SOCKET", name, 1);
    assert_int_equal(notify_ready("x"), 1);
    expect_msg(fd, "READY=1\nSTATUS=x");
    close(fd);
    unsetenv("NOTIFY_SOCKET");
}

static void test_unset_and_invalid(void **state)
{
    (void)state;
    unsetenv("NOTIFY_SOCKET");
    assert_int_equal(notify_ready(NULL), 0);
    setenv("NOTIFY_SOCKET", "", 1);
    assert_int_equal(notify_ready(NULL), 0);
    setenv("NOTIFY_SOCKET", "relative/path", 1);
    char err[256] = "";
    assert_int_equal(notify_send("READY=1", err, sizeof err), -1);
    assert_int_equal(errno, EINVAL);
    assert_non_null(strstr(err, "relative/path"));
    unsetenv("NOTIFY_SOCKET");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_path),
        cmocka_unit_test(test_abstract),
        cmocka_unit_test(test_unset_and_invalid),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
