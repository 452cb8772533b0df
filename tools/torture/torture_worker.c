/* torture_worker.c - one torture worker: random registrations,
 * withdrawals and room operations, each logged before and after. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "internal.h"
#include "torture.h"

static volatile sig_atomic_t stop;
static unsigned selfkill_per, inj_seed;

static void on_usr1(int sig)
{
    (void)sig;
    stop = 1;
}

/* Crash injection: die at a random named point inside a critical section. */
static void maybe_die(const char *point)
{
    (void)point;
    if (selfkill_per && rand_r(&inj_seed) % selfkill_per == 0)
        raise(SIGKILL);
}

static void logf_line(int fd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void logf_line(int fd, const char *fmt, ...)
{
    char buf[128];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (write(fd, buf, (size_t)n) != n)
        _exit(3); /* the parent is gone */
}

/* Info JSON naming value v (so a torn mix of two values is detectable),
 * padded to a random size to exercise the arena. */
static size_t make_info(char *buf, size_t cap, uint64_t v, unsigned *seed)
{
    size_t pad = (size_t)(rand_r(seed) % 16000);
    int n = snprintf(buf, cap, "{\"v\":[%llu,1,2],\"pad\":\"", (unsigned long long)v);
    size_t len = (size_t)n;
    for (size_t i = 0; i < pad && len + 40 < cap; i++)
        buf[len++] = (char)('a' + (v + i) % 26);
    len += (size_t)snprintf(buf + len, cap - len, "\",\"end\":[%llu,1,2]}", (unsigned long long)v);
    return len;
}

static void rank_op(kvc_segment *s, int fd, unsigned w, unsigned workers, uint64_t v,
                    unsigned *seed)
{
    static char info[20000];
    unsigned mine = (T_RANKS + workers - 1 - w) / workers; /* ranks owned by w */
    uint32_t rank = w + workers * (uint32_t)(rand_r(seed) % (mine ? mine : 1));
    if (rank >= T_RANKS)
        return;
    if (rand_r(seed) % 6 == 0) {
        logf_line(fd, "A W %u\n", rank);
        if (kvc_rank_withdraw(s, rank, "torture") == KVC_OK)
            logf_line(fd, "C W %u\n", rank);
        return;
    }
    char sid[40];
    snprintf(sid, sizeof sid, "t:%llu", (unsigned long long)v);
    size_t len = make_info(info, sizeof info, v, seed);
    logf_line(fd, "A R %u %llu\n", rank, (unsigned long long)v);
    if (kvc_rank_register(s, rank, sid, info, len, NULL) == KVC_OK)
        logf_line(fd, "C R %u %llu\n", rank, (unsigned long long)v);
}

/* A room as read without a lock must be one whole room: Failed exactly
 * when it has a failure record (for its own id), Success only when every
 * participant wrote Success, otherwise the minimum of the local states.
 * Returns NULL, or what is wrong. */
static const char *torn(uint64_t room, const kvc_room_info *ri)
{
    if (ri->room != room || ri->participants < 1 || ri->participants > KVC_ROOM_MAX_PARTICIPANTS ||
        ri->joined > ri->participants || ri->released > ri->participants)
        return "counts";
    if ((ri->state == KVC_POLL_FAILED) != (ri->has_failure != 0))
        return "Failed without its record, or a record without Failed";
    if (ri->has_failure)
        return ri->failure.room == room ? NULL : "failure record of another room";
    int min = KVC_POLL_SUCCESS;
    for (uint32_t i = 0; i < ri->participants; i++) {
        int st = ri->local[i] < 0 ? KVC_POLL_BOOTSTRAPPING : ri->local[i];
        if (st < KVC_POLL_FAILED || st > KVC_POLL_SUCCESS)
            return "local state out of range";
        min = st < min ? st : min;
    }
    return (int)ri->state == min ? NULL : "state is not the minimum of the local states";
}

static void check_read(int fd, uint64_t room, const kvc_room_info *ri)
{
    const char *why = torn(room, ri);
    if (why)
        logf_line(fd, "X T %llu %.60s\n", (unsigned long long)room, why);
}

static void room_op(kvc_segment *s, int fd, uint64_t v, unsigned *seed)
{
    uint64_t room = 1 + (uint64_t)(rand_r(seed) % T_ROOMS);
    uint32_t rank = (uint32_t)(rand_r(seed) % 2);
    switch (rand_r(seed) % 6) {
    case 0: kvc_room_open(s, room, 2, rank, KVC_ROOM_ROLE_PREFILL); break;
    case 1: kvc_room_set_state(s, room, rank, (kvc_poll)(1 + rand_r(seed) % 4)); break;
    case 2: kvc_room_release(s, room, rank); break;
    case 3: { /* lock-free read: never a torn room */
        kvc_room_info ri;
        if (kvc_room_get(s, room, (int32_t)rank, &ri) == KVC_OK)
            check_read(fd, room, &ri);
        break;
    }
    case 4: { /* every room, lock-free */
        kvc_room_info all[T_ROOMS];
        size_t n = 0;
        if (kvc_room_list(s, -1, all, T_ROOMS, &n) == KVC_OK)
            for (size_t i = 0; i < n && i < T_ROOMS; i++)
                check_read(fd, all[i].room, &all[i]);
        break;
    }
    default: {
        char reason[40];
        snprintf(reason, sizeof reason, "t:%llu", (unsigned long long)v);
        int kept = 0;
        if (kvc_room_fail(s, room, rank, 5, reason, &kept) == KVC_OK && kept)
            logf_line(fd, "C F %llu\n", (unsigned long long)v);
    }
    }
}

void torture_worker(const struct torture_opts *o, unsigned w, unsigned round, int out_fd)
{
    /* SIGUSR1 was blocked by the parent before fork(): unblock it only once
     * the handler is in place, so an early stop request is not fatal. */
    signal(SIGUSR1, on_usr1);
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGUSR1);
    sigprocmask(SIG_UNBLOCK, &set, NULL);
    unsigned seed = o->seed * 7919u + round * 104729u + w;
    inj_seed = seed ^ 0x5bd1e995u;
    selfkill_per = o->selfkill_per;
    kvc_options opts;
    kvc_options_init(&opts);
    opts.name = o->segment;
    opts.role = KVC_ROLE_CLIENT; /* its ranks outlive it: they must never be lost */
    kvc_segment *s;
    if (kvc_open(&opts, &s) != KVC_OK)
        _exit(2);
    kvc__test_set_inject(maybe_die);
    for (uint64_t n = 0; !stop; n++) {
        uint64_t v = ((uint64_t)round << 32) | ((uint64_t)w << 24) | (n & 0xffffff);
        if (rand_r(&seed) % 2)
            rank_op(s, out_fd, w, o->workers, v, &seed);
        else
            room_op(s, out_fd, v, &seed);
    }
    kvc__test_set_inject(NULL);
    kvc_close(s);
    _exit(0);
}
