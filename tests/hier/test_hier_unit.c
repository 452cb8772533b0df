/* test_hier_unit.c - kvc_hier_* (include/kvcoord/hier.h) in one network
 * namespace: two "nodes" are two segments, their leaders joined by a
 * socketpair; every rank a forked process.  The argument checks of
 * kvc_hier_open; 400 steps of lengths 0..1000 (over several segment rounds)
 * equal to the MIN each child computes itself, with a mismatched tag and a
 * mismatched length that fail every rank naming the rank; a leader
 * SIGKILLed: every other rank fails with KVC_E_PEER naming it and its node,
 * and its next call fails at once.  (tests/hier/test_hier.py does the same
 * across network namespaces with gloo.) */
#include <fcntl.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>

#include <kvcoord/hier.h>

#include "../lib/testutil.h"
#include "tu_proc.h"

#define WAIT_MS 60000u /* hang guard: never expected to run out */
#define SIZE 4
static const uint32_t NODE_OF[SIZE] = {0, 0, 1, 1};

static uint64_t mix(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static void input(uint64_t step, uint32_t r, uint8_t *v, size_t len)
{
    uint64_t x = mix(step * 1000003u + r);
    for (size_t i = 0; i < len; i++) {
        if (i % 8 == 0)
            x = mix(x);
        v[i] = (uint8_t)((x >> (8 * (i % 8))) % ((step & 1) ? 5 : 256));
    }
}

static size_t step_len(uint64_t step)
{
    static const size_t lens[] = {64, 1, 0, 64, 200, 300, 1000, 7};
    return lens[mix(step) % (sizeof lens / sizeof *lens)];
}

static kvc_segment *open_client(const char *name)
{
    kvc_options o;
    kvc_options_init(&o);
    o.name = name;
    o.role = KVC_ROLE_CLIENT;
    kvc_segment *s = NULL;
    return kvc_open(&o, &s) == KVC_OK ? s : NULL;
}

static void make_segments(const char **a, const char **b)
{
    *a = tu_name();
    *b = tu_name();
    kvc_close(tu_open(*a, KVC_OPEN_FRESH, KVC_ROLE_NONE));
    kvc_close(tu_open(*b, KVC_OPEN_FRESH, KVC_ROLE_NONE));
}

/* In a child: rank r's handle (its node's segment; sv: the leaders' pair). */
static kvc_hier *child_open(uint32_t r, const char *a, const char *b, const int sv[2],
                            kvc_segment **seg)
{
    *seg = open_client(NODE_OF[r] ? b : a);
    if (!*seg)
        _exit(10);
    int fds[2] = {-1, -1};
    if (r == 0)
        fds[1] = sv[0];
    if (r == 2)
        fds[0] = sv[1];
    if (r != 0)
        close(sv[0]);
    if (r != 2)
        close(sv[1]);
    kvc_hier_options o = {.seg = *seg,
                          .group = 0x5eed,
                          .size = SIZE,
                          .rank = r,
                          .nodes = 2,
                          .node_of = NODE_OF,
                          .node_names = (const char *const[]){"A", "B"},
                          .fds = r == 0 || r == 2 ? fds : NULL};
    kvc_hier *h = NULL;
    if (kvc_hier_open(&o, &h))
        _exit(11);
    return h;
}

static void open_bad_args(void **state)
{
    (void)state;
    const char *a, *b;
    make_segments(&a, &b);
    kvc_segment *seg = open_client(a);
    assert_non_null(seg);
    kvc_hier *h = NULL;
    uint32_t bad_node[SIZE] = {0, 0, 2, 1};
    int pipefd[2];
    assert_int_equal(pipe(pipefd), 0);
    int not_socket[2] = {-1, pipefd[0]};
    int sv[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    int good[2] = {-1, sv[0]};
    kvc_hier_options base = {
        .seg = seg, .group = 1, .size = SIZE, .rank = 0, .nodes = 2, .node_of = NODE_OF};
    kvc_hier_options o;
    assert_int_equal(kvc_hier_open(NULL, &h), KVC_E_INVAL);
    o = base, o.nodes = 0;
    assert_int_equal(kvc_hier_open(&o, &h), KVC_E_INVAL);
    o = base, o.rank = SIZE;
    assert_int_equal(kvc_hier_open(&o, &h), KVC_E_INVAL);
    o = base, o.node_of = bad_node, o.fds = good;
    assert_int_equal(kvc_hier_open(&o, &h), KVC_E_INVAL);
    assert_non_null(strstr(kvc_last_error(), "node 2"));
    o = base; /* a leader without sockets */
    assert_int_equal(kvc_hier_open(&o, &h), KVC_E_INVAL);
    assert_non_null(strstr(kvc_last_error(), "is its node's leader"));
    o = base, o.rank = 1, o.fds = good; /* sockets on a non-leader */
    assert_int_equal(kvc_hier_open(&o, &h), KVC_E_INVAL);
    o = base, o.fds = not_socket;
    assert_int_equal(kvc_hier_open(&o, &h), KVC_E_INVAL);
    assert_non_null(strstr(kvc_last_error(), "not a stream socket"));
    assert_null(h);
    o = base, o.fds = good; /* taken over: closed by kvc_hier_close */
    assert_int_equal(kvc_hier_open(&o, &h), KVC_OK);
    uint8_t v[4] = {0};
    assert_int_equal(kvc_hier_allreduce_min(h, UINT32_MAX, v, 4, 10, NULL), KVC_E_INVAL);
    assert_int_equal(kvc_hier_allreduce_min(h, 0, NULL, 4, 10, NULL), KVC_E_INVAL);
    assert_int_equal(kvc_hier_allreduce_min(h, 0, v, KVC_HIER_MAX_LEN + 1, 10, NULL), KVC_E_INVAL);
    kvc_hier_close(h);
    assert_int_equal(fcntl(sv[0], F_GETFD), -1);
    kvc_hier_close(NULL);
    close(sv[1]);
    close(pipefd[0]);
    close(pipefd[1]);
    kvc_close(seg);
    kvc_unlink(a);
    kvc_unlink(b);
}

#define STEPS 400
#define ODD_TAG_STEP 100 /* rank 3 calls with tag 7 */
#define ODD_LEN_STEP 200 /* rank 1 calls with one more byte */

/* A child: STEPS steps; exit 0 when every answer was right. */
static void agree_child(uint32_t r, const char *a, const char *b, const int sv[2])
{
    kvc_segment *seg;
    kvc_hier *h = child_open(r, a, b, sv, &seg);
    static uint8_t v[1100], want[1100], other[1100];
    for (uint64_t step = 0; step < STEPS; step++) {
        size_t len = step_len(step);
        input(step, r, v, len);
        memset(want, 0xFF, len);
        for (uint32_t q = 0; q < SIZE; q++) {
            input(step, q, other, len);
            for (size_t i = 0; i < len; i++)
                want[i] = other[i] < want[i] ? other[i] : want[i];
        }
        uint32_t tag = step == ODD_TAG_STEP && r == 3 ? 7 : 0;
        size_t n = step == ODD_LEN_STEP && r == 1 ? len + 1 : len;
        kvc_hier_failure why;
        kvc_err e = kvc_hier_allreduce_min(h, tag, v, n, WAIT_MS, &why);
        if (step == ODD_TAG_STEP || step == ODD_LEN_STEP) {
            uint32_t odd = step == ODD_TAG_STEP ? 3 : 1;
            if (e != KVC_E_INVAL || !why.mismatch || why.ranks != 1ull << odd ||
                why.node != (int32_t)NODE_OF[odd] || why.step != step) {
                fprintf(stderr, "rank %u step %llu: %d %s\n", r, (unsigned long long)step, e,
                        kvc_last_error());
                _exit(20);
            }
            continue;
        }
        if (e || memcmp(v, want, len)) {
            fprintf(stderr, "rank %u step %llu: %d %s\n", r, (unsigned long long)step, e,
                    e ? kvc_last_error() : "wrong MIN");
            _exit(21);
        }
    }
    kvc_hier_close(h);
    kvc_close(seg);
    _exit(0);
}

static void two_nodes_agree(void **state)
{
    (void)state;
    const char *a, *b;
    make_segments(&a, &b);
    int sv[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    pid_t kids[SIZE];
    for (uint32_t r = 0; r < SIZE; r++) {
        kids[r] = fork();
        assert_true(kids[r] >= 0);
        if (kids[r] == 0)
            agree_child(r, a, b, sv);
    }
    close(sv[0]);
    close(sv[1]);
    tu_reap_ok(kids, SIZE);
    kvc_unlink(a);
    kvc_unlink(b);
}

/* A child: steps until one fails; then reports it and whether the next
 * call fails at once the same way. */
typedef struct report {
    int32_t err, err2, node, node2;
    uint64_t ranks, ranks2;
    int dead;
} report;

static void loop_child(uint32_t r, const char *a, const char *b, const int sv[2], int ready,
                       int out)
{
    kvc_segment *seg;
    kvc_hier *h = child_open(r, a, b, sv, &seg);
    uint8_t v[64];
    report rep = {0};
    for (uint64_t step = 0;; step++) {
        input(step, r, v, sizeof v);
        kvc_hier_failure why;
        kvc_err e = kvc_hier_allreduce_min(h, 0, v, sizeof v, WAIT_MS, &why);
        if (step == 20 && write(ready, "r", 1) != 1)
            _exit(30);
        if (!e)
            continue;
        rep.err = e;
        rep.ranks = why.ranks;
        rep.node = why.node;
        rep.dead = why.dead;
        e = kvc_hier_allreduce_min(h, 0, v, sizeof v, WAIT_MS, &why);
        rep.err2 = e;
        rep.ranks2 = why.ranks;
        rep.node2 = why.node;
        break;
    }
    if (write(out, &rep, sizeof rep) != sizeof rep)
        _exit(31);
    _exit(0);
}

static void leader_killed(void **state)
{
    (void)state;
    const char *a, *b;
    make_segments(&a, &b);
    int sv[2], ready[2], out[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    assert_int_equal(pipe(ready), 0);
    assert_int_equal(pipe(out), 0);
    pid_t kids[SIZE];
    for (uint32_t r = 0; r < SIZE; r++) {
        kids[r] = fork();
        assert_true(kids[r] >= 0);
        if (kids[r] == 0)
            loop_child(r, a, b, sv, ready[1], out[1]);
    }
    close(sv[0]);
    close(sv[1]);
    close(ready[1]);
    close(out[1]);
    char c;
    for (int i = 0; i < SIZE; i++)
        assert_int_equal(read(ready[0], &c, 1), 1);
    kill(kids[2], SIGKILL); /* node B's leader */
    assert_int_equal(waitpid(kids[2], NULL, 0), kids[2]);
    for (int i = 0; i < SIZE - 1; i++) {
        report rep;
        assert_int_equal(read(out[0], &rep, sizeof rep), (ssize_t)sizeof rep);
        assert_int_equal(rep.err, KVC_E_PEER);
        assert_true(rep.dead);
        assert_true(rep.ranks & (1ull << 2));
        assert_int_equal(rep.node, 1);
        assert_int_equal(rep.err2, KVC_E_PEER); /* broken: at once, the same */
        assert_int_equal(rep.ranks2, rep.ranks);
        assert_int_equal(rep.node2, 1);
    }
    for (uint32_t r = 0; r < SIZE; r++)
        if (r != 2)
            assert_int_equal(tu_wait_exit(kids[r]), 0);
    close(ready[0]);
    close(out[0]);
    kvc_unlink(a);
    kvc_unlink(b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(open_bad_args),
        cmocka_unit_test(two_nodes_agree),
        cmocka_unit_test(leader_killed),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
