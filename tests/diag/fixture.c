/*
 * fixture.c - diag_fixture: puts a segment into a known state through the
 * library, for the kvcoord-diag tests.
 *
 *   diag_fixture NAME SCENARIO [--hold]
 *
 * Scenarios (every one creates NAME afresh, small capacities):
 *   empty           nothing registered
 *   ranks8          ranks 0..7 registered by this process (a client, so they
 *                   survive its death), rank 7 with an IPv6 session_id
 *   ranks8pcfg      ranks8, and rank 0's parallelism config (its blob shares
 *                   the arena)
 *   bignum          rank 0 registered with a weights_info_dict holding numbers a
 *                   double or an int64 cannot hold (2^64-1, 1E400, 0.10)
 *   rooms           rooms 1001..1005 in every KVPoll state (2 participants, both
 *                   opened by this process; 1005 failed with a reason and code)
 *   failure         one failure record (room 42, rank 5, code 110), no participant
 *   bigroom         room KVC_ROOM_ID_MAX (2^63-1) failed; a second record whose room
 *                   id is then overwritten with 2^64-1 (only tampering can do that)
 *   lockdead-ranks  ranks 0..3 committed; a worker child re-registering rank 1 is
 *                   SIGKILLed inside the publish window (ranks lock held, sequence
 *                   odd): a dead lock owner and a stale process entry
 *   lockdead-rooms  ranks 0..3 committed; a worker child opening a room is
 *                   SIGKILLed after saving its undo record (rooms lock held)
 *   lockheld        ranks 0..1 committed; a live child holds the ranks lock and
 *                   waits (a stuck owner); prints "holder PID"; needs --hold
 *   lockheld-rooms  the same with the rooms lock (inside a room update)
 *   pdheld          a live child holds the PD lock, re-registering prefill rank
 *                   (dp 0, cp 0, tp 0, pp 0) as 10.9.9.9:19999, its undo record
 *                   saved (PD rank sequence even); prints "holder PID"; --hold
 *   pdheld-odd      the same inside the change's window (sequence odd: the
 *                   topology written, the slot not yet)
 *   pdheld-room     the same inside a room write (room 77 to dp 0)
 *   The pd* scenarios attach to an existing segment (DIAG_FIXTURE_ATTACH=1:
 *   one kvcoordd serves; the rank and the room must exist) or create one
 *   with prefill rank 0 of a 1-rank topology at 10.0.0.1:17000 and room 77
 *   at dp 1.
 *   stale           ranks 0..1 committed; a worker child attaches, registers rank
 *                   5 and is SIGKILLed: a stale process entry, a dead worker's rank
 *   version         a valid segment whose layout version is then changed to 1
 *   truncated       a valid segment whose file is then cut to half its size
 *   tiny            a valid segment whose file is then cut to 16 bytes
 *
 * Prints "ready" when done.  With --hold it stays attached (as a client, so
 * its rooms' participants stay alive) until stdin reaches EOF, then detaches
 * with kvc_close() (which fails the rooms it leaves unreleased); a line
 * "kill" on stdin makes it SIGKILL itself instead, leaving a dead client
 * entry and rooms waiting on a dead participant.  A "lockheld" holder is
 * killed either way.
 *
 * The lockdead-* scenarios attach this process with no process entry and
 * close with kvc__close_reader(), not kvc_close(): closing takes the rooms
 * lock, and would recover the dead owner's lock the scenario leaves.
 */
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "inspect.h"
#include "internal.h"
#include "kvcoord/pd.h"

static const char *name;
static const char *die_point;
static int notify_fd = -1;

static void fail(const char *what, kvc_err e)
{
    fprintf(stderr, "diag_fixture %s: %s: %s: %s\n", name, what, kvc_strerror(e), kvc_last_error());
    exit(1);
}

static kvc_segment *open_seg(kvc_open_mode mode, kvc_role role)
{
    kvc_options o;
    kvc_options_init(&o);
    o.name = name;
    o.mode = mode;
    o.role = role;
    o.max_ranks = 64;
    o.max_procs = 64;
    o.max_rooms = 256;
    o.arena_bytes = 64ull << 20;
    o.max_info_bytes = 8ull << 20;
    o.lock_timeout_ms = 2000;
    kvc_segment *s = NULL;
    kvc_err e = kvc_open(&o, &s);
    if (e)
        fail("kvc_open", e);
    return s;
}

/* A weights_info_dict of n entries, tagged. */
static char *info(int n, unsigned tag)
{
    size_t cap = (size_t)n * 96 + 16, len = 0;
    char *s = malloc(cap);
    s[len++] = '{';
    for (int i = 0; i < n; i++)
        len += (size_t)snprintf(s + len, cap - len, "%s\"model.layers.%d.w%u\":[%llu,%d,2]",
                                i ? "," : "", i, tag,
                                0x7f0000000000ull + (unsigned long long)i * 256, 4096 + (int)tag);
    s[len++] = '}';
    s[len] = '\0';
    return s;
}

static void reg(kvc_segment *s, uint32_t rank, const char *sid, int entries)
{
    char *v = info(entries, rank);
    kvc_err e = kvc_rank_register(s, rank, sid, v, strlen(v), NULL);
    free(v);
    if (e)
        fail("kvc_rank_register", e);
}

static void reg_range(kvc_segment *s, uint32_t n)
{
    char sid[64];
    for (uint32_t r = 0; r < n; r++) {
        snprintf(sid, sizeof sid, "10.0.0.%u:%u", r + 1, 16000 + r);
        reg(s, r, sid, 10 + (int)r);
    }
}

static void check(kvc_err e, const char *what)
{
    if (e)
        fail(what, e);
}

/* ---- children that die (or hang) inside a critical section ---------------- */

static void die_at(const char *point)
{
    if (strcmp(point, die_point))
        return;
    if (notify_fd >= 0) { /* lockheld: tell the parent, then hold the lock */
        (void)!write(notify_fd, "x", 1);
        for (;;)
            pause();
    }
    raise(SIGKILL);
}

enum child_job { JOB_REREGISTER, JOB_OPEN_ROOM, JOB_REGISTER_5, JOB_PD_RANK, JOB_PD_ROOM };

/* Prefill rank tp of a 1-rank topology (the pd* scenarios). */
static kvc_pd_registration pd_reg(const char *ip, int32_t port)
{
    kvc_pd_registration r;
    memset(&r, 0, sizeof r);
    r.attn_tp_size = r.attn_cp_size = r.attn_dp_size = r.pp_size = r.system_dp_size = 1;
    r.rank_ip = ip;
    r.rank_port = port;
    r.page_size = 64;
    r.kv_cache_dtype = "auto";
    r.follow_bootstrap_room = 1;
    return r;
}

/* Fork a worker that attaches and does job; it dies at point (NULL: after
 * the job, by SIGKILL from the parent).  Returns its pid once dead, or once
 * it holds the lock when hold is set. */
static pid_t child(enum child_job job, const char *point, int hold)
{
    int fds[2];
    if (pipe(fds) < 0)
        exit(1);
    pid_t pid = fork();
    if (pid == 0) {
        close(fds[0]);
        kvc_segment *c = open_seg(KVC_OPEN_ATTACH, KVC_ROLE_WORKER);
        die_point = point;
        notify_fd = hold ? fds[1] : -1;
        if (point)
            kvc__test_set_inject(die_at);
        char *v = info(3, 99);
        if (job == JOB_REREGISTER)
            kvc_rank_register(c, 1, "10.9.9.9:1", v, strlen(v), NULL);
        else if (job == JOB_OPEN_ROOM)
            kvc_room_open(c, 7777, 2, 0, KVC_ROOM_ROLE_PREFILL);
        else if (job == JOB_PD_RANK) {
            kvc_pd_registration r = pd_reg("10.9.9.9", 19999);
            kvc_pd_register(c, &r, KVC_PD_OWNER_NONE, 0, 0);
        } else if (job == JOB_PD_ROOM)
            kvc_pd_room_set(c, 77, 0);
        else
            kvc_rank_register(c, 5, "10.0.0.55:16005", v, strlen(v), NULL);
        (void)!write(fds[1], "x", 1);
        for (;;)
            pause(); /* the parent kills us */
    }
    close(fds[1]);
    char ch;
    ssize_t got = read(fds[0], &ch, 1);
    close(fds[0]);
    /* It writes when it holds the lock (hold), or after its job: with a
     * point to die at, that means the point was never reached. */
    if (got != 1 && (hold || !point)) {
        fprintf(stderr, "diag_fixture: child %d ended early\n", (int)pid);
        exit(1);
    }
    if (got == 1 && point && !hold) {
        fprintf(stderr, "diag_fixture: child %d never reached %s\n", (int)pid, point);
        exit(1);
    }
    if (hold)
        return pid;
    kill(pid, SIGKILL);
    int st;
    waitpid(pid, &st, 0);
    return pid;
}

/* ---- scenarios -------------------------------------------------------------- */

static void rooms(kvc_segment *s)
{
    for (uint64_t room = 1001; room <= 1005; room++)
        for (uint32_t r = 0; r < 2; r++)
            check(kvc_room_open(s, room, 2, r, r ? KVC_ROOM_ROLE_DECODE : KVC_ROOM_ROLE_PREFILL),
                  "kvc_room_open");
    /* 1001 Bootstrapping: nobody wrote a state. */
    check(kvc_room_set_state(s, 1002, 0, KVC_POLL_WAITING_FOR_INPUT), "set_state");
    check(kvc_room_set_state(s, 1002, 1, KVC_POLL_WAITING_FOR_INPUT), "set_state");
    check(kvc_room_set_state(s, 1003, 0, KVC_POLL_TRANSFERRING), "set_state");
    check(kvc_room_set_state(s, 1003, 1, KVC_POLL_SUCCESS), "set_state");
    check(kvc_room_set_state(s, 1004, 0, KVC_POLL_SUCCESS), "set_state");
    check(kvc_room_set_state(s, 1004, 1, KVC_POLL_SUCCESS), "set_state");
    check(kvc_room_fail(s, 1005, 1, 110,
                        "RDMA WRITE to 10.0.0.2 timed out (transport retry "
                        "counter exceeded)",
                        NULL),
          "kvc_room_fail");
}

static void poke_version(void)
{
    char path[256];
    snprintf(path, sizeof path, "/dev/shm/%s", name);
    int fd = open(path, O_RDWR);
    uint32_t v = 1;
    if (fd < 0 || pwrite(fd, &v, sizeof v, offsetof(kvc_header, layout_version)) != sizeof v)
        exit(1);
    close(fd);
}

static void cut(int tiny)
{
    char path[256];
    snprintf(path, sizeof path, "/dev/shm/%s", name);
    int fd = open(path, O_RDWR);
    off_t size = fd < 0 ? 0 : lseek(fd, 0, SEEK_END);
    if (fd < 0 || ftruncate(fd, tiny ? 16 : size / 2) < 0)
        exit(1);
    close(fd);
}

static pid_t scenario(kvc_segment *s, const char *what)
{
    if (!strcmp(what, "ranks8")) {
        reg_range(s, 7);
        reg(s, 7, "[2001:db8::7]:16007", 17);
    } else if (!strcmp(what, "ranks8pcfg")) {
        static const char cfg[] = "{\"tp_size\": 8, \"dp_size\": 1}";
        reg_range(s, 7);
        reg(s, 7, "[2001:db8::7]:16007", 17);
        check(kvc_parallelism_register(s, NULL, 0, cfg, sizeof cfg - 1, NULL),
              "kvc_parallelism_register");
    } else if (!strcmp(what, "bignum")) {
        static const char v[] =
            "{\"w\": [18446744073709551615, -9223372036854775808, 1E400, 0.10]}";
        check(kvc_rank_register(s, 0, "10.0.0.1:16000", v, sizeof v - 1, NULL),
              "kvc_rank_register");
    } else if (!strcmp(what, "rooms")) {
        rooms(s);
    } else if (!strcmp(what, "failure")) {
        check(kvc_room_fail(s, 42, 5, 110, "transfer to decode rank 5 timed out", NULL),
              "kvc_room_fail");
    } else if (!strcmp(what, "bigroom")) {
        check(kvc_room_fail(s, KVC_ROOM_ID_MAX, 3, 5, "largest room id", NULL), "kvc_room_fail");
        check(kvc_room_fail(s, 7, 3, 5, "tampered id", NULL), "kvc_room_fail");
        s->failures[1].rec.room = UINT64_MAX;
    } else if (!strcmp(what, "lockdead-ranks")) {
        reg_range(s, 4);
        child(JOB_REREGISTER, "reg.seq_odd", 0);
    } else if (!strcmp(what, "lockdead-rooms")) {
        reg_range(s, 4);
        child(JOB_OPEN_ROOM, "room.undo_saved", 0);
    } else if (!strcmp(what, "lockheld")) {
        reg_range(s, 2);
        return child(JOB_REREGISTER, "reg.locked", 1);
    } else if (!strcmp(what, "lockheld-rooms")) {
        reg_range(s, 2);
        return child(JOB_OPEN_ROOM, "room.undo_saved", 1);
    } else if (!strncmp(what, "pdheld", 6)) {
        if (!getenv("DIAG_FIXTURE_ATTACH")) {
            kvc_pd_registration r = pd_reg("10.0.0.1", 17000);
            check(kvc_pd_register(s, &r, KVC_PD_OWNER_NONE, 0, 0), "kvc_pd_register");
            check(kvc_pd_room_set(s, 77, 1), "kvc_pd_room_set");
        }
        if (!strcmp(what, "pdheld-room"))
            return child(JOB_PD_ROOM, "pd.room.half", 1);
        return child(JOB_PD_RANK, strcmp(what, "pdheld-odd") ? "pd.rank.saved" : "pd.rank.half", 1);
    } else if (!strcmp(what, "stale")) {
        reg_range(s, 2);
        child(JOB_REGISTER_5, NULL, 0);
    } else if (strcmp(what, "empty") && strcmp(what, "version") && strcmp(what, "truncated") &&
               strcmp(what, "tiny")) {
        fprintf(stderr, "diag_fixture: unknown scenario %s\n", what);
        exit(2);
    }
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: diag_fixture NAME SCENARIO [--hold]\n");
        return 2;
    }
    name = argv[1];
    int hold = argc > 3 && !strcmp(argv[3], "--hold");
    int lockdead = !strncmp(argv[2], "lockdead-", 9);
    kvc_segment *s = open_seg(getenv("DIAG_FIXTURE_ATTACH") ? KVC_OPEN_ATTACH : KVC_OPEN_FRESH,
                              lockdead ? KVC_ROLE_NONE : KVC_ROLE_CLIENT);
    pid_t holder = scenario(s, argv[2]);
    if (!hold)
        lockdead ? kvc__close_reader(s) : (void)kvc_close(s);
    if (!strcmp(argv[2], "version"))
        poke_version();
    else if (!strcmp(argv[2], "truncated") || !strcmp(argv[2], "tiny"))
        cut(!strcmp(argv[2], "tiny"));
    if (holder)
        printf("holder %d\n", (int)holder);
    printf("ready\n");
    fflush(stdout);
    if (!hold)
        return 0;
    char line[64];
    int die = 0;
    while (!die && fgets(line, sizeof line, stdin))
        die = !strncmp(line, "kill", 4);
    if (holder) {
        kill(holder, SIGKILL);
        waitpid(holder, NULL, 0);
    }
    if (die)
        raise(SIGKILL);
    kvc_close(s);
    return 0;
}
