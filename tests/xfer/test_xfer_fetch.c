/* test_xfer_fetch.c - kvt_descriptor_fetch against real engines in other
 * processes and against fake peers: the answer is the peer's exported
 * descriptor; a refused connection, a peer that never answers, a wrong or
 * missing token, an oversized and a garbage answer each give their own
 * clear error; many threads fetch at once. */
#include <netinet/in.h>
#include <pthread.h>
#include <sys/socket.h>

#include "testutil.h"
#include "clock.h"
#include "xfer_frame.h"
#include "xfer_util.h"

typedef struct peer {
    pid_t pid;
    char *desc;
    char sid[128];
} peer;

static void peer_main(int fd, const char *token)
{
    kvt_options o;
    kvt_options_init(&o);
    o.backend = KVT_BACKEND_TCP;
    o.token = token;
    o.log = xu_quiet_log;
    kvt_engine *e;
    if (kvt_engine_create(&o, &e))
        _exit(2);
    static unsigned char a[8192], b[4096];
    char *desc = NULL;
    if (kvt_mr_register(e, a, sizeof a, NULL) || kvt_mr_register(e, b, sizeof b, NULL) ||
        kvt_descriptor_export(e, &desc) || xu_send_str(fd, desc))
        _exit(2);
    for (;;) {
        kvt_event ev[4];
        size_t n;
        if (kvt_progress(e, 100, ev, 4, &n))
            _exit(3);
    }
}

static void peer_start(peer *p, const char *token)
{
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    p->pid = fork();
    if (p->pid == 0) {
        close(fds[0]);
        peer_main(fds[1], token);
    }
    close(fds[1]);
    p->desc = xu_recv_str(fds[0], -1);
    close(fds[0]);
    assert_non_null(p->desc);
    const char *a = strstr(p->desc, "\"session_id\":\"") + 14;
    snprintf(p->sid, sizeof p->sid, "%.*s", (int)strcspn(a, "\""), a);
}

static void peer_stop(peer *p)
{
    kill(p->pid, SIGKILL);
    waitpid(p->pid, NULL, 0);
    free(p->desc);
}

static void test_fetch_ok(void **state)
{
    (void)state;
    peer p;
    peer_start(&p, NULL);
    char *json = NULL;
    assert_int_equal(kvt_descriptor_fetch(p.sid, NULL, 5000, &json), KVC_OK);
    assert_string_equal(json, p.desc);
    /* It imports. */
    kvt_options o;
    kvt_options_init(&o);
    o.backend = KVT_BACKEND_TCP;
    kvt_engine *e;
    assert_int_equal(kvt_engine_create(&o, &e), KVC_OK);
    kvt_peer *kp;
    assert_int_equal(kvt_peer_import(e, json, strlen(json), &kp), KVC_OK);
    kvt_engine_destroy(e);
    free(json);
    /* A token the peer does not ask for is accepted. */
    assert_int_equal(kvt_descriptor_fetch(p.sid, "unused", 5000, &json), KVC_OK);
    free(json);
    peer_stop(&p);
}

static void test_fetch_token(void **state)
{
    (void)state;
    peer p;
    peer_start(&p, "s3cret");
    char *json = NULL;
    assert_int_equal(kvt_descriptor_fetch(p.sid, "s3cret", 5000, &json), KVC_OK);
    assert_string_equal(json, p.desc);
    free(json);
    assert_int_equal(kvt_descriptor_fetch(p.sid, "wrong", 5000, &json), KVC_E_PEER);
    assert_null(json);
    assert_non_null(strstr(kvc_last_error(), "unauthorized"));
    assert_non_null(strstr(kvc_last_error(), p.sid));
    assert_int_equal(kvt_descriptor_fetch(p.sid, NULL, 5000, &json), KVC_E_PEER);
    assert_non_null(strstr(kvc_last_error(), "no handshake token"));
    peer_stop(&p);
}

static int listener(int *port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    assert_int_equal(listen(fd, 8), 0);
    getsockname(fd, (struct sockaddr *)&a, &len);
    *port = ntohs(a.sin_port);
    return fd;
}

static void test_fetch_refused(void **state)
{
    (void)state;
    int port;
    close(listener(&port)); /* nothing listens there now */
    char sid[64];
    snprintf(sid, sizeof sid, "127.0.0.1:%d", port);
    char *json = NULL;
    assert_int_equal(kvt_descriptor_fetch(sid, NULL, 2000, &json), KVC_E_SYS);
    char want[128];
    snprintf(want, sizeof want, "connect to %s: Connection refused", sid);
    assert_string_equal(kvc_last_error(), want);
}

static void test_fetch_timeout(void **state)
{
    (void)state;
    int port, fd = listener(&port); /* accepts (backlog), never answers */
    char sid[64];
    snprintf(sid, sizeof sid, "127.0.0.1:%d", port);
    char *json = NULL;
    uint64_t t0 = kvc__mono_ns();
    assert_int_equal(kvt_descriptor_fetch(sid, NULL, 300, &json), KVC_E_TIMEDOUT);
    uint64_t ms = (kvc__mono_ns() - t0) / 1000000;
    assert_true(ms >= 290);
    assert_non_null(strstr(kvc_last_error(), "no answer within 300 ms"));
    close(fd);
}

/* A fake peer: accepts one connection, reads the request, sends `answer`
 * (n bytes), closes. */
typedef struct fake {
    int fd;
    const void *answer;
    size_t n;
} fake;

static void *fake_main(void *arg)
{
    fake *f = arg;
    int c = accept(f->fd, NULL, NULL);
    if (c < 0)
        return NULL;
    char buf[1024];
    struct pollfd pf = {c, POLLIN, 0};
    if (poll(&pf, 1, 5000) == 1 && read(c, buf, sizeof buf) > 0)
        (void)!write(c, f->answer, f->n);
    usleep(100000);
    close(c);
    return NULL;
}

static kvc_err fetch_fake(const void *answer, size_t n, char **json)
{
    int port;
    fake f = {listener(&port), answer, n};
    pthread_t t;
    pthread_create(&t, NULL, fake_main, &f);
    char sid[64];
    snprintf(sid, sizeof sid, "127.0.0.1:%d", port);
    kvc_err err = kvt_descriptor_fetch(sid, NULL, 3000, json);
    pthread_join(t, NULL);
    close(f.fd);
    return err;
}

static void test_fetch_bad_answers(void **state)
{
    (void)state;
    char *json = NULL;
    const char http[] = "HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n";
    assert_int_equal(fetch_fake(http, sizeof http - 1, &json), KVC_E_INVAL);
    assert_non_null(strstr(kvc_last_error(), "bad frame magic"));
    uint8_t big[KVT_HDR_LEN];
    kvt__frame f = {.type = KVT_F_DESC, .len = (2u << 20)};
    kvt__frame_encode(&f, big);
    assert_int_equal(fetch_fake(big, sizeof big, &json), KVC_E_TOOBIG);
    assert_non_null(strstr(kvc_last_error(), "2097152 bytes"));
    uint8_t junk[KVT_HDR_LEN + 8];
    f = (kvt__frame){.type = KVT_F_DESC, .len = 8};
    kvt__frame_encode(&f, junk);
    memcpy(junk + KVT_HDR_LEN, "not json", 8);
    assert_int_equal(fetch_fake(junk, sizeof junk, &json), KVC_E_INVAL);
    assert_non_null(strstr(kvc_last_error(), "not a descriptor"));
    f = (kvt__frame){.type = KVT_F_ACK};
    kvt__frame_encode(&f, big);
    assert_int_equal(fetch_fake(big, sizeof big, &json), KVC_E_INVAL);
    assert_non_null(strstr(kvc_last_error(), "unexpected answer frame ACK"));
    f = (kvt__frame){.type = KVT_F_DESC, .len = 100}; /* cut short */
    kvt__frame_encode(&f, big);
    assert_int_equal(fetch_fake(big, sizeof big, &json), KVC_E_SYS);
    assert_non_null(strstr(kvc_last_error(), "connection closed by peer"));
    assert_null(json);
    assert_int_equal(kvt_descriptor_fetch("nohostport", NULL, 100, &json), KVC_E_INVAL);
    assert_int_equal(kvt_descriptor_fetch("127.0.0.1:1", NULL, 0, &json), KVC_E_INVAL);
    assert_int_equal(kvt_descriptor_fetch("127.0.0.1:1", "", 100, &json), KVC_E_INVAL);
}

/* Thread-safe: many threads fetch from one peer at once. */
static const char *g_sid, *g_desc;
static void *fetcher(void *arg)
{
    (void)arg;
    for (int i = 0; i < 20; i++) {
        char *json = NULL;
        if (kvt_descriptor_fetch(g_sid, NULL, 10000, &json) || strcmp(json, g_desc))
            return (void *)1;
        free(json);
    }
    return NULL;
}

static void test_fetch_threads(void **state)
{
    (void)state;
    peer p;
    peer_start(&p, NULL);
    g_sid = p.sid;
    g_desc = p.desc;
    pthread_t t[8];
    for (int i = 0; i < 8; i++)
        pthread_create(&t[i], NULL, fetcher, NULL);
    for (int i = 0; i < 8; i++) {
        void *r;
        pthread_join(t[i], &r);
        assert_null(r);
    }
    peer_stop(&p);
}

int main(int argc, char **argv)
{
    signal(SIGPIPE, SIG_IGN);
    if (argc > 1) /* one test by name */
        cmocka_set_test_filter(argv[1]);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fetch_ok),          cmocka_unit_test(test_fetch_token),
        cmocka_unit_test(test_fetch_refused),     cmocka_unit_test(test_fetch_timeout),
        cmocka_unit_test(test_fetch_bad_answers), cmocka_unit_test(test_fetch_threads),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
