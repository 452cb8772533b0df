/* test_xfer_bind.c - kvt_engine_create on a fixed port still in use:
 * retried while the holder lets go (a socket closed 300 ms later, a
 * predecessor engine SIGKILLed just before), refused with a clear message
 * when the holder keeps it past the retries. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdbool.h>
#include <sys/socket.h>

#include "testutil.h"
#include "xfer_util.h"

/* A listening socket on 127.0.0.1, port *port (0: any); its fd. */
static int hold_port(uint16_t *port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    assert_true(fd >= 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(*port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(bind(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    assert_int_equal(listen(fd, 4), 0);
    socklen_t len = sizeof sa;
    assert_int_equal(getsockname(fd, (struct sockaddr *)&sa, &len), 0);
    *port = ntohs(sa.sin_port);
    return fd;
}

static kvc_err create_at(uint16_t port, kvt_engine **e)
{
    char listen_at[64];
    snprintf(listen_at, sizeof listen_at, "127.0.0.1:%u", port);
    kvt_options o;
    kvt_options_init(&o);
    o.backend = KVT_BACKEND_TCP;
    o.listen = listen_at;
    o.log = xu_quiet_log;
    return kvt_engine_create(&o, e);
}

static void *close_later(void *arg)
{
    int fd = *(int *)arg;
    usleep(300 * 1000);
    close(fd);
    return NULL;
}

/* The port is freed 300 ms into the call: the engine gets it. */
static void test_released_while_retrying(void **state)
{
    (void)state;
    uint16_t port = 0;
    int fd = hold_port(&port);
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, close_later, &fd), 0);
    kvt_engine *e = NULL;
    kvc_err err = create_at(port, &e);
    pthread_join(t, NULL);
    if (err)
        fail_msg("kvt_engine_create: %s", kvc_last_error());
    char want[64];
    snprintf(want, sizeof want, "127.0.0.1:%u", port);
    assert_string_equal(kvt_session_id(e), want);
    kvt_engine_destroy(e);
}

/* Held for good: KVC_E_SYS naming the address and the retries. */
static void test_held_past_retries(void **state)
{
    (void)state;
    uint16_t port = 0;
    int fd = hold_port(&port);
    kvt_engine *e = NULL;
    assert_int_equal(create_at(port, &e), KVC_E_SYS);
    assert_null(e);
    assert_non_null(strstr(kvc_last_error(), "Address already in use"));
    assert_non_null(strstr(kvc_last_error(), "retries"));
    close(fd);
}

/* An engine at the port SIGKILLed, a new one at once at the same port. */
static void test_predecessor_killed(void **state)
{
    (void)state;
    uint16_t port = 0;
    close(hold_port(&port)); /* a port that was free a moment ago */
    int p[2];
    assert_int_equal(pipe(p), 0);
    pid_t pid = fork();
    if (pid == 0) {
        kvt_engine *e;
        if (create_at(port, &e))
            _exit(2);
        char ok = 1;
        if (write(p[1], &ok, 1) != 1)
            _exit(3);
        for (;;) {
            kvt_event ev[4];
            size_t n;
            kvt_progress(e, 100, ev, 4, &n);
        }
    }
    close(p[1]);
    char ok = 0;
    assert_int_equal(xu_read_all(p[0], &ok, 1, -1), 0);
    close(p[0]);
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    kvt_engine *e = NULL;
    if (create_at(port, &e))
        fail_msg("kvt_engine_create after the predecessor's death: %s", kvc_last_error());
    kvt_engine_destroy(e);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_released_while_retrying),
        cmocka_unit_test(test_held_past_retries),
        cmocka_unit_test(test_predecessor_killed),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
