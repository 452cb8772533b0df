/* test_shared_rules.c - every rule the units share has one source
 * (docs/architecture.md, "Where each rule lives"); this test feeds each
 * rule's callers the same cases and expects the same answer from all of
 * them.  (The GID rule has its own: tests/diag/test_gid.c.) */
#include "testutil.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>

#include "buf.h"
#include "hostport.h"
#include "http_resp.h"
#include "log.h"
#include "metrics.h"
#include "utf8.h"
#include "inspect.h"
#include "internal.h"
#include "net.h"
#include "proc_sockets.h"
#include "sock_holder.h"
#include "xfer_internal.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <sys/socket.h>

/* ---- host:port: kvcoordd's --listen and the transfer engine ------------ */

struct hp_case {
    const char *spec;
    int listen_ok;    /* valid as a listen address */
    int peer_ok;      /* valid as a peer to connect to (session_id) */
    const char *host; /* when valid */
    unsigned port;    /* when valid */
    const char *why;  /* a substring of the reason, when invalid as a peer */
};

static const struct hp_case hp_cases[] = {
    {"127.0.0.1:6789", 1, 1, "127.0.0.1", 6789, NULL},
    {"localhost:0", 1, 1, "localhost", 0, NULL},
    {"node-7.example:65535", 1, 1, "node-7.example", 65535, NULL},
    {"[::1]:6789", 1, 1, "::1", 6789, NULL},
    {"[fe80::1%eth0]:5000", 1, 1, "fe80::1%eth0", 5000, NULL},
    {"0.0.0.0:16000", 1, 1, "0.0.0.0", 16000, NULL},
    {"10.0.0.5:006789", 1, 1, "10.0.0.5", 6789, NULL},
    /* empty host: every address, for listening only */
    {":6789", 1, 0, "", 6789, "empty host"},
    {"[]:6789", 1, 0, "", 6789, "empty host"},
    /* a bare IPv6 literal: refused by both (which colon is the port?) */
    {"::1:5000", 0, 0, NULL, 0, "must be in brackets"},
    {"fe80::1", 0, 0, NULL, 0, "must be in brackets"},
    {"2001:db8::5:16000", 0, 0, NULL, 0, "must be in brackets"},
    /* ports */
    {"127.0.0.1:65536", 0, 0, NULL, 0, "bad port"},
    {"127.0.0.1:", 0, 0, NULL, 0, "bad port"},
    {"127.0.0.1:-1", 0, 0, NULL, 0, "bad port"},
    {"127.0.0.1:+80", 0, 0, NULL, 0, "bad port"},
    {"127.0.0.1: 80", 0, 0, NULL, 0, "bad port"},
    {"127.0.0.1:80x", 0, 0, NULL, 0, "bad port"},
    {"127.0.0.1:99999999999999999999", 0, 0, NULL, 0, "bad port"},
    /* shapes */
    {"127.0.0.1", 0, 0, NULL, 0, "no port"},
    {"", 0, 0, NULL, 0, "empty address"},
    {"[::1]6789", 0, 0, NULL, 0, "[IPV6]:PORT"},
    {"[::1", 0, 0, NULL, 0, "[IPV6]:PORT"},
};

static void test_hostport_same_rule(void **st)
{
    (void)st;
    for (size_t i = 0; i < sizeof hp_cases / sizeof *hp_cases; i++) {
        const struct hp_case *c = &hp_cases[i];
        char h1[256] = "", h2[256] = "", h3[256] = "", err[128] = "";
        uint16_t p1 = 1, p2 = 2, p3 = 3;
        /* kvcoordd --listen */
        int d = net_parse_addr(c->spec, h1, sizeof h1, &p1, err, sizeof err);
        /* the engine's listen address */
        kvc_err l = kvt__split_hostport(c->spec, KVC_HOSTPORT_LISTEN, h2, sizeof h2, &p2);
        /* the engine's peer (a session_id) */
        kvc_err p = kvt__split_hostport(c->spec, 0, h3, sizeof h3, &p3);
        print_message("%-34s daemon %s, engine listen %s, engine peer %s\n", c->spec,
                      d ? "refused" : "ok", l ? "refused" : "ok", p ? "refused" : "ok");
        assert_int_equal(d == 0, c->listen_ok);
        assert_int_equal(l == KVC_OK, c->listen_ok);
        assert_int_equal(p == KVC_OK, c->peer_ok);
        if (c->listen_ok) {
            assert_string_equal(h1, c->host);
            assert_string_equal(h2, c->host);
            assert_int_equal(p1, c->port);
            assert_int_equal(p2, c->port);
        } else {
            assert_non_null(strstr(err, c->why));
            assert_int_equal(l, KVC_E_INVAL);
        }
        if (c->peer_ok) {
            assert_string_equal(h3, c->host);
            assert_int_equal(p3, c->port);
        } else {
            assert_int_equal(p, KVC_E_INVAL);
            assert_non_null(strstr(kvc_last_error(), c->why));
        }
    }
}

static void test_hostport_limits(void **st)
{
    (void)st;
    char spec[300], host[300], err[128];
    uint16_t port;
    memset(spec, 'a', 255);
    snprintf(spec + 255, sizeof spec - 255, ":80");
    assert_int_equal(net_parse_addr(spec, host, sizeof host, &port, err, sizeof err), 0);
    assert_int_equal(strlen(host), 255);
    assert_int_equal(kvt__split_hostport(spec, 0, host, sizeof host, &port), KVC_OK);
    memset(spec, 'a', 256);
    snprintf(spec + 256, sizeof spec - 256, ":80");
    assert_int_equal(net_parse_addr(spec, host, sizeof host, &port, err, sizeof err), -1);
    assert_non_null(strstr(err, "too long"));
    assert_int_equal(kvt__split_hostport(spec, 0, host, sizeof host, &port), KVC_E_INVAL);
    /* a buffer too small for the host is refused, never overrun */
    char small[4] = "xyz";
    assert_non_null(kvc__hostport_split("abcd:1", 0, small, sizeof small, &port));
    assert_string_equal(small, "xyz");
    assert_null(kvc__hostport_split("abc:1", 0, small, sizeof small, &port));
    assert_non_null(kvc__hostport_split(NULL, 0, small, sizeof small, &port));
}

/* ---- /proc/PID/stat: the core's liveness and kvcoordd's process watch -- */

/* A child whose command name is "a) b (c)" (spaces and parentheses, as a
 * real comm may hold), stopped in pause() until killed.  *ran_ns: a
 * CLOCK_REALTIME time the child read once it ran. */
static pid_t odd_child(uint64_t *ran_ns)
{
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        close(fds[0]);
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        uint64_t t = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
        if (write(fds[1], &t, sizeof t) != (ssize_t)sizeof t)
            _exit(1);
        close(fds[1]);
        prctl(PR_SET_NAME, "a) b (c)", 0, 0, 0);
        for (;;)
            pause();
    }
    close(fds[1]);
    assert_int_equal(read(fds[0], ran_ns, sizeof *ran_ns), (ssize_t)sizeof *ran_ns);
    close(fds[0]);
    char comm[64] = "";
    for (int i = 0; i < 2000 && !strstr(comm, "a) b"); i++) {
        char path[64];
        snprintf(path, sizeof path, "/proc/%d/comm", (int)pid);
        FILE *f = fopen(path, "r");
        if (f) {
            if (!fgets(comm, sizeof comm, f))
                comm[0] = '\0';
            fclose(f);
        }
        usleep(1000);
    }
    assert_non_null(strstr(comm, "a) b (c)"));
    return pid;
}

static void test_proc_stat_same_answer(void **st)
{
    (void)st;
    kvc_proc_stat ps;
    char how[96], text[96];
    /* this process */
    assert_int_equal(kvc_proc_stat_read(getpid(), &ps), KVC_OK);
    assert_true(ps.start > 0);
    assert_int_equal(ps.start, kvc__proc_start(getpid()));
    assert_true(kvc__proc_alive(getpid(), ps.start));
    assert_false(kvc__proc_alive(getpid(), ps.start + 1));
    /* a live child with an awkward command name */
    time_t t0 = time(NULL);
    uint64_t ran_ns = 0;
    pid_t pid = odd_child(&ran_ns);
    assert_int_equal(kvc_proc_stat_read(pid, &ps), KVC_OK);
    assert_true(ps.state == 'S' || ps.state == 'R');
    assert_int_equal(ps.start, kvc__proc_start(pid));
    assert_true(kvc__proc_alive(pid, ps.start));
    uint64_t start = ps.start;
    /* the same child as a zombie killed by SIGKILL: both read the same
     * wait status out of field 52 */
    kill(pid, SIGKILL);
    siginfo_t si;
    assert_int_equal(waitid(P_PID, (id_t)pid, &si, WEXITED | WNOWAIT), 0);
    assert_int_equal(kvc_proc_stat_read(pid, &ps), KVC_OK);
    assert_int_equal(ps.state, 'Z');
    assert_int_equal(ps.start, start);
    assert_false(kvc__proc_alive(pid, start));
    assert_true(ps.exit_status >= 0);
    kvc__proc_how(pid, start, how, sizeof how);
    assert_string_equal(how, kvc_wait_status_text(ps.exit_status, text, sizeof text));
    assert_non_null(strstr(how, "killed by signal 9"));
    /* a namesake (another start time) is not that zombie */
    kvc__proc_how(pid, start + 1, how, sizeof how);
    assert_null(strstr(how, "killed by signal"));
    waitpid(pid, NULL, 0);
    /* gone: both say so */
    assert_int_equal(kvc_proc_stat_read(pid, &ps), KVC_E_NOENT);
    assert_int_equal(kvc__proc_start(pid), 0);
    assert_false(kvc__proc_alive(pid, start));
    /* reaped: the one text of an unknown exit status, with its start time */
    kvc__proc_how(pid, start, how, sizeof how);
    assert_string_equal(how, kvc_exit_unknown_text(start, text, sizeof text));
    struct tm tm = {0};
    const char *end = strptime(how, "is gone (started %Y-%m-%dT%H:%M:%S", &tm);
    assert_non_null(end);
    unsigned ms = 1000;
    int used = 0;
    assert_int_equal(sscanf(end, ".%3uZ)%n", &ms, &used), 1);
    assert_true(used == 6 && ms < 1000);
    assert_string_equal(end + used, "; not our child, so its exit status is not known");
    time_t started = timegm(&tm), now = time(NULL);
    assert_true(started <= now && started >= t0 - 1); /* it started in this test */
    /* never later than something the child did: to the millisecond */
    uint64_t started_ms = (uint64_t)started * 1000u + ms;
    assert_true(started_ms <= ran_ns / 1000000u);
    assert_true(kvc_proc_start_realtime_ns(start) <= ran_ns);
    uint64_t again_ms = kvc_proc_start_realtime_ns(start) / 1000000u; /* read again: jitter */
    assert_true(again_ms + 1 >= started_ms && again_ms <= started_ms + 1);
    assert_int_equal(kvc_proc_start_realtime_ns(0), 0);
    assert_true(strlen(how) <= 90);
    assert_string_equal(kvc_exit_unknown_text(0, text, sizeof text),
                        "is gone; not our child, so its exit status is not known");
}

/* ---- the seqlock read of a rank: kvc_rank_lookup and inspect's peek --- */

/* Both readers of rank r agree: same state and generation, and peek's
 * descriptor is what the lookup returned. */
static void same_view(kvc_segment *s, uint32_t r, kvc_rank_state want)
{
    kvc_rank_info ri = {0};
    kvc_rank_peek pk;
    kvc_err le = kvc_rank_lookup(s, r, &ri);
    assert_int_equal(kvc__rank_peek(s, r, &pk), KVC_OK);
    assert_int_equal(pk.seq & 1, 0);
    assert_int_equal(pk.state, want);
    if (want == KVC_RANK_REGISTERED) {
        assert_int_equal(le, KVC_OK);
        assert_int_equal(ri.generation, pk.generation);
        assert_int_equal(ri.entries, pk.entries);
        assert_int_equal(strlen(ri.session_id), pk.session_len);
        assert_int_equal(ri.info_len, pk.info_len);
    } else {
        assert_int_not_equal(le, KVC_OK);
    }
    kvc_rank_info_free(&ri);
}

static void test_rank_seqlock_same_answer(void **st)
{
    (void)st;
    const char *name = tu_name();
    kvc_segment *s = tu_open(name, KVC_OPEN_FRESH, KVC_ROLE_CLIENT);
    const char *info = "{\"w\": [1, 2, 2], \"v\": [3, 4, 2]}";
    same_view(s, 2, KVC_RANK_EMPTY);
    assert_int_equal(kvc_rank_register(s, 2, "10.0.0.5:16000", info, strlen(info), NULL), KVC_OK);
    same_view(s, 2, KVC_RANK_REGISTERED);
    assert_int_equal(kvc_rank_register(s, 2, "10.0.0.5:16001", "{}", 2, NULL), KVC_OK);
    same_view(s, 2, KVC_RANK_REGISTERED);
    assert_int_equal(kvc_rank_withdraw(s, 2, "test"), KVC_OK);
    same_view(s, 2, KVC_RANK_WITHDRAWN);
    /* A writer that died inside its publish window leaves the sequence odd:
     * the shared read says so to both (inspect reports it, not hiding the
     * dead writer; a lookup takes the lock, which evens it), and then both
     * read the same published value again. */
    assert_int_equal(kvc_rank_register(s, 3, "h:1", info, strlen(info), NULL), KVC_OK);
    kvc_rank_entry *e = &s->ranks[3];
    atomic_fetch_add(&e->seq, 1);
    kvc_rank_slot sl;
    uint64_t seq;
    uint32_t a;
    assert_int_equal(kvc__rank_snapshot(e, &sl, &seq, &a), 1);
    assert_int_equal(seq & 1, 1);
    assert_int_equal(sl.state, KVC_RANK_REGISTERED); /* what is there, for diagnostics */
    assert_int_equal(kvc__rank_snapshot(e, &sl, &seq, NULL), 1);
    kvc_rank_peek pk;
    assert_int_equal(kvc__rank_peek(s, 3, &pk), KVC_E_BUSY);
    assert_int_equal(pk.seq & 1, 1);
    assert_int_equal(pk.state, KVC_RANK_REGISTERED);
    kvc_rank_info ri = {0};
    assert_int_equal(kvc_rank_lookup(s, 3, &ri), KVC_OK);
    kvc_rank_info_free(&ri);
    same_view(s, 3, KVC_RANK_REGISTERED);
    kvc_close(s);
    kvc_unlink(name);
}

/* ---- a room's state and its probe: the library and inspect's check ----- */

static void no_findings(void *ctx, kvc_severity sev, const char *id, const char *msg)
{
    (void)ctx;
    if (sev >= KVC_SEV_DEGRADED)
        print_message("finding %s: %s\n", id, msg);
}

static void test_room_state_same_answer(void **st)
{
    (void)st;
    const char *name = tu_name();
    kvc_segment *s = tu_open(name, KVC_OPEN_FRESH, KVC_ROLE_CLIENT);
    /* rooms of 2 participants (this process both times): one per KVPoll
     * state, the minimum over the two, sticky terminals */
    static const struct {
        int a, b;      /* states set by rank 0 and rank 1; -1: none */
        kvc_poll want; /* the room's state */
    } cases[] = {
        {-1, -1, KVC_POLL_BOOTSTRAPPING},
        {KVC_POLL_TRANSFERRING, -1, KVC_POLL_BOOTSTRAPPING},
        {KVC_POLL_WAITING_FOR_INPUT, KVC_POLL_TRANSFERRING, KVC_POLL_WAITING_FOR_INPUT},
        {KVC_POLL_TRANSFERRING, KVC_POLL_TRANSFERRING, KVC_POLL_TRANSFERRING},
        {KVC_POLL_SUCCESS, KVC_POLL_SUCCESS, KVC_POLL_SUCCESS},
        {KVC_POLL_SUCCESS, KVC_POLL_FAILED, KVC_POLL_FAILED},
    };
    uint32_t want_by_state[5] = {0};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        uint64_t room = 1000 + i * 7919;
        assert_int_equal(kvc_room_open(s, room, 2, 0, KVC_ROOM_ROLE_PREFILL), KVC_OK);
        assert_int_equal(kvc_room_open(s, room, 2, 1, KVC_ROOM_ROLE_DECODE), KVC_OK);
        if (cases[i].a >= 0)
            assert_int_equal(kvc_room_set_state(s, room, 0, (kvc_poll)cases[i].a), KVC_OK);
        if (cases[i].b == KVC_POLL_FAILED)
            assert_int_equal(kvc_room_fail(s, room, 1, 5, "test", NULL), KVC_OK);
        else if (cases[i].b >= 0)
            assert_int_equal(kvc_room_set_state(s, room, 1, (kvc_poll)cases[i].b), KVC_OK);
        kvc_room_info ri;
        assert_int_equal(kvc_room_get(s, room, -1, &ri), KVC_OK);
        assert_int_equal(ri.state, cases[i].want);
        kvc_room *r = kvc__room_find(s, room);
        assert_non_null(r);
        assert_int_equal(kvc__room_state(r), cases[i].want);
        want_by_state[cases[i].want]++;
    }
    assert_null(kvc__room_find(s, 424242));
    /* inspect's check counts the same states, and finds every room by the
     * same probe (a room its probe cannot find is reported "rooms.probe") */
    kvc_check_stats cs;
    assert_true(kvc__check(s, no_findings, NULL, &cs) < KVC_SEV_DEGRADED);
    for (int k = 0; k < 5; k++)
        assert_int_equal(cs.rooms_by_state[k], want_by_state[k]);
    kvc_close(s);
    kvc_unlink(name);
}

/* ---- UTF-8: kvcoordd's JSON answers, log lines and metric labels ------- */

/* Is s[0..n) all valid UTF-8 (by the shared rule)? */
static int all_valid(const char *s, size_t n)
{
    for (size_t i = 0; i < n;) {
        size_t k = kvc__utf8_seq((const unsigned char *)s + i, n - i);
        if (!k)
            return 0;
        i += k;
    }
    return 1;
}

static int contains(const char *hay, size_t n, const char *needle, size_t m)
{
    for (size_t i = 0; m <= n && i + m <= n; i++)
        if (!memcmp(hay + i, needle, m))
            return 1;
    return 0;
}

static void test_utf8_same_rule(void **st)
{
    (void)st;
    static const struct {
        const char *bytes;
        size_t seq; /* kvc__utf8_seq of the whole string */
    } cases[] = {
        {"A", 1},
        {"\xc3\xa9", 2},         /* U+00E9 */
        {"\xe2\x82\xac", 3},     /* U+20AC */
        {"\xf0\x9f\x98\x80", 4}, /* U+1F600 */
        {"\xf4\x8f\xbf\xbf", 4}, /* U+10FFFF, the last */
        {"\xc0\xaf", 0},         /* overlong '/' */
        {"\xe0\x80\xaf", 0},     /* overlong */
        {"\xf0\x80\x80\xaf", 0}, /* overlong */
        {"\xed\xa0\x80", 0},     /* surrogate U+D800 */
        {"\xf4\x90\x80\x80", 0}, /* U+110000 */
        {"\xe2\x82", 0},         /* truncated */
        {"\x80", 0},             /* lone continuation */
        {"\xff", 0},             /* never a lead byte */
        {"\xc3\x28", 0},         /* lead then not a continuation */
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        const char *in = cases[i].bytes;
        size_t n = strlen(in);
        assert_int_equal(kvc__utf8_seq((const unsigned char *)in, n), cases[i].seq);
        int valid = cases[i].seq == n;
        /* the three callers: each keeps valid text byte for byte and turns
         * anything else into valid UTF-8 without the offending bytes */
        struct buf j = {0}, m = {0};
        json_escape_append(&j, in, n);
        metrics_label_escape(&m, in, n);
        char l[64];
        size_t ln = log_escape(l, sizeof l, in, n, 0);
        assert_true(ln <= sizeof l);
        const struct {
            const char *who, *p;
            size_t n;
        } outs[] = {{"json", j.p, j.len}, {"metrics", m.p, m.len}, {"log", l, ln}};
        for (size_t k = 0; k < 3; k++) {
            print_message("case %zu %s: %zu bytes\n", i, outs[k].who, outs[k].n);
            assert_true(all_valid(outs[k].p, outs[k].n));
            if (valid && in[0] != 'A')
                assert_true(contains(outs[k].p, outs[k].n, in, n));
            if (!valid)
                assert_false(contains(outs[k].p, outs[k].n, in, n));
        }
        buf_free(&j);
        buf_free(&m);
    }
}

/* ---- which rank a process serves: noted by a worker's registration only - */

static int32_t listed_rank(kvc_segment *s, int32_t pid, kvc_role role)
{
    kvc_proc_info p[16];
    size_t n = 0;
    assert_int_equal(kvc_proc_list(s, p, 16, &n), KVC_OK);
    for (size_t i = 0; i < n && i < 16; i++)
        if (p[i].pid == pid && p[i].role == role)
            return p[i].rank;
    fail_msg("no entry for pid %d", (int)pid);
    return -2;
}

static void test_served_rank(void **st)
{
    (void)st;
    const char *name = tu_name();
    kvc_segment *c = tu_open(name, KVC_OPEN_FRESH, KVC_ROLE_CLIENT);
    assert_int_equal(listed_rank(c, getpid(), KVC_ROLE_CLIENT), -1);
    /* One entry per process: a worker handle makes it a worker's. */
    kvc_segment *w = tu_open(name, KVC_OPEN_ATTACH, KVC_ROLE_WORKER);
    assert_int_equal(listed_rank(c, getpid(), KVC_ROLE_WORKER), -1);
    assert_int_equal(kvc_rank_register(w, 5, "h:1", "{}", 2, NULL), KVC_OK);
    assert_int_equal(listed_rank(c, getpid(), KVC_ROLE_WORKER), 5);
    /* A registration through the client handle is on behalf of another. */
    assert_int_equal(kvc_rank_register(c, 6, "h:2", "{}", 2, NULL), KVC_OK);
    assert_int_equal(listed_rank(c, getpid(), KVC_ROLE_WORKER), 5);
    kvc_close(w);
    kvc_close(c);
    kvc_unlink(name);
}

/* ---- names of locks, process roles, KVPoll states ---------------------- */

static void test_names_one_source(void **st)
{
    (void)st;
    static const char *const roles[] = {"none", "worker", "daemon", "client"};
    static const char *const polls[] = {"Failed", "Bootstrapping", "WaitingForInput",
                                        "Transferring", "Success"};
    const char *name = tu_name();
    kvc_segment *s = tu_open(name, KVC_OPEN_FRESH, KVC_ROLE_NONE);
    /* ranks, procs, one lock per room stripe: rooms.0 .. rooms.63, then pd */
    for (int id = 0; id < KVC_LOCK_COUNT; id++) {
        char want[16];
        if (id < KVC_LOCK_ROOMS)
            snprintf(want, sizeof want, "%s", id == KVC_LOCK_RANKS ? "ranks" : "procs");
        else if (id == KVC_LOCK_PD)
            snprintf(want, sizeof want, "pd");
        else
            snprintf(want, sizeof want, "rooms.%d", id - KVC_LOCK_ROOMS);
        kvc_lock_probe p;
        kvc__lock_probe(s, id, &p); /* what kvcoord-diag shows */
        assert_string_equal(kvc__lock_name(id), want);
        assert_string_equal(p.name, want);
    }
    assert_string_equal(kvc__lock_name(KVC_LOCK_COUNT), "unknown");
    for (int r = 0; r < 4; r++)
        assert_string_equal(kvc_role_name((kvc_role)r), roles[r]);
    assert_string_equal(kvc_role_name((kvc_role)-1), "invalid");
    for (int i = 0; i < 5; i++)
        assert_string_equal(kvc_poll_name((kvc_poll)i), polls[i]);
    kvc_close(s);
    kvc_unlink(name);
}

/* ---- /proc socket holders: kvcoordd's owner scans and the engine's check -- */

/* A child connected to *port of 127.0.0.1, holding its end until killed;
 * *fd: our accepted end. */
static pid_t connected_child(int lfd, int *fd)
{
    struct sockaddr_in a;
    socklen_t al = sizeof a;
    assert_int_equal(getsockname(lfd, (struct sockaddr *)&a, &al), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        close(lfd);
        int c = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (c < 0 || connect(c, (struct sockaddr *)&a, sizeof a))
            _exit(1);
        for (;;)
            pause();
    }
    *fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
    assert_true(*fd >= 0);
    return pid;
}

/* sock_holder.h answers what kvcoordd (proc_sockets.h: peer_process, the
 * owner of a PUT /route; port_holder_find) and the transfer engine (the
 * same-host check: the peer's socket inode, then whether the named pid
 * holds it) ask, for one real loopback connection to a child. */
static void test_sock_holder_same_answer(void **st)
{
    (void)st;
    int lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    assert_int_equal(bind(lfd, (struct sockaddr *)&a, sizeof a), 0);
    assert_int_equal(listen(lfd, 4), 0);
    socklen_t al = sizeof a;
    assert_int_equal(getsockname(lfd, (struct sockaddr *)&a, &al), 0);
    int fd;
    pid_t child = connected_child(lfd, &fd);

    /* the engine's question: the peer's end (local = its address) */
    struct sockaddr_storage me, him;
    socklen_t ml = sizeof me, hl = sizeof him;
    assert_int_equal(getsockname(fd, (struct sockaddr *)&me, &ml), 0);
    assert_int_equal(getpeername(fd, (struct sockaddr *)&him, &hl), 0);
    char text[64];
    assert_string_equal(kvc__sock_proc_addr(&him, text, sizeof text), "/proc/net/tcp");
    char want[64];
    snprintf(want, sizeof want, "0100007F:%04X", ntohs(((struct sockaddr_in *)&him)->sin_port));
    assert_string_equal(text, want);
    struct kvc__sock_row peer_row, my_row;
    kvc__sock_find_pair(&him, &me, &peer_row);
    kvc__sock_find_pair(&me, &him, &my_row);
    assert_true(peer_row.found && my_row.found);
    assert_false(peer_row.listening);
    assert_int_equal(peer_row.uid, getuid());
    assert_true(peer_row.inode && peer_row.inode != my_row.inode);
    assert_int_equal(kvc__sock_pid_holds(child, peer_row.inode), 0);
    assert_int_equal(kvc__sock_pid_holds(getpid(), peer_row.inode), ENOENT); /* not the peer */
    assert_int_equal(kvc__sock_pid_holds(getpid(), my_row.inode), 0);

    /* kvcoordd's question: the one process holding the peer's end */
    struct kvc__sock_holders h;
    kvc__sock_holders(peer_row.inode, peer_row.uid, true, &h);
    assert_int_equal(h.first, child);
    assert_false(h.many);
    int32_t pid = 0;
    uint64_t start = 0;
    assert_int_equal(peer_process(fd, &pid, &start), 0);
    kvc_proc_stat ps;
    assert_int_equal(kvc_proc_stat_read(child, &ps), KVC_OK);
    assert_int_equal(pid, child);
    assert_int_equal(start, ps.start);
    /* our own end: held by this process only, which the scan leaves out */
    kvc__sock_holders(my_row.inode, my_row.uid, true, &h);
    assert_int_equal(h.first, 0);

    /* who holds the port: our listening socket (this process not named) */
    struct kvc__sock_row port_row;
    kvc__sock_find_port(ntohs(a.sin_port), &port_row);
    assert_true(port_row.found && port_row.listening);
    struct port_holder ph;
    assert_true(port_holder_find(ntohs(a.sin_port), &ph));
    assert_true(ph.listening);
    assert_int_equal(ph.inode, port_row.inode);
    assert_int_equal(ph.pid, 0);

    /* the child gone: it holds nothing, and the pair's row is gone or
     * held by no process */
    kill(child, SIGKILL);
    waitpid(child, NULL, 0);
    assert_int_equal(kvc__sock_pid_holds(child, peer_row.inode), ENOENT);
    assert_int_not_equal(peer_process(fd, &pid, &start), 0);
    close(fd);
    close(lfd);
    kvc__sock_find_port(ntohs(a.sin_port), &port_row);
    assert_false(port_row.found && port_row.listening);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hostport_same_rule),
        cmocka_unit_test(test_hostport_limits),
        cmocka_unit_test(test_proc_stat_same_answer),
        cmocka_unit_test(test_sock_holder_same_answer),
        cmocka_unit_test(test_rank_seqlock_same_answer),
        cmocka_unit_test(test_room_state_same_answer),
        cmocka_unit_test(test_utf8_same_rule),
        cmocka_unit_test(test_served_rank),
        cmocka_unit_test(test_names_one_source),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
