/*
 * bench_rooms.c - `kvcoord-bench rooms`: how fast a failure reaches the
 * other ranks, and how many room operations the segment sustains.
 *
 * propagation: a waiter process blocks in kvc_room_wait() on a room; this
 * process records a failure (kvc_room_fail) after noting the time in a
 * shared page; the waiter notes when it returned.  --rounds rounds; median
 * and p99 in us.  Baseline in the same run: the same two processes, the
 * waiter blocked in read() on a pipe and woken by a one-byte write - the
 * cost of a bare cross-process wake-up.  The two kinds of sample alternate.
 *
 * ops: P processes (1, 2 and 8), each cycling rooms of its own: open,
 * 3 state updates (WaitingForInput, Transferring, Success), one poll
 * (kvc_room_get), release (the room is reclaimed).  Cycles per second in
 * total, and the ratio to the 1-process figure.  The --duration seconds per
 * process count are cut into --slices slices, run 1, 2, 8, 1, 2, 8, ...
 * so that a change in the machine's load hits every count alike; figures
 * are medians over the slices (a ratio is the median of the slices' own
 * ratios).  Baseline in the same run, the same slices (shared first in
 * even slices, private first in odd ones): the same P processes each on
 * a segment of its own (nothing shared), which is how far this machine
 * lets P processes scale at all; the last ratio is shared
 * over private.  Both run on segments created for the ops run (empty room
 * tables).  And what the machine charges for sharing at all: the one-way
 * hand-over of a cache line between two processes spinning on it in turn
 * (median of LINE_RUNS runs), beside the private 2-process cycle's time
 * per process.  A cycle on a new room takes its stripe's lock; each of two
 * processes is as likely as the other to have taken a stripe last, so
 * about half the shared cycles wait for that line: shared / private at 2
 * processes near cycle / (cycle + hand-over / 2) for any design in which
 * creating a room of a random id writes one line that the other creator
 * also writes.  Printed as that estimate (an estimate: a run can beat it
 * where the hand-over overlaps other work, or the host moved the CPUs).
 *
 * get: 8 forked participant processes open one room (8 participants) and
 * set their states, then stay alive; this process - not a participant -
 * times kvc_room_get() of that room, in batches of GET_BATCH calls, and
 * reports the median per call.  Baseline in the same run, interleaved batch
 * by batch: kvc_rank_lookup() of a small rank (session_id and a one-entry
 * weights_info_dict) into a reused buffer - the rank table's seqlock read.
 * Timed twice: with no process watcher (liveness from /proc, at most every
 * 100 ms per participant), then with this process publishing the watch
 * beat as kvcoordd does (kvc_proc_watch_beat: liveness from the process
 * table's dead marks, no system call).
 *
 * A scratch segment is created and removed.  Figures are printed, never
 * judged.
 */
#include <errno.h>
#include <getopt.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"
#include "bench_rooms.h"
#include "kvcoord/kvcoord.h"

struct shared {              /* one page shared with the forked processes */
    volatile uint64_t t0;    /* CLOCK_MONOTONIC ns, set before the wake */
    volatile uint64_t lat[]; /* per round, written by the waiter */
};

#define GET_BATCH 64
#define GET_PARTICIPANTS 8

static int cmp64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static void stats(uint64_t *v, size_t n, double *p50, double *p99)
{
    qsort(v, n, sizeof *v, cmp64);
    *p50 = (double)v[n / 2] / 1e3;
    *p99 = (double)v[n * 99 / 100 < n ? n * 99 / 100 : n - 1] / 1e3;
}

static kvc_segment *open_seg(const char *name, kvc_open_mode mode)
{
    return bench_rooms_open(name, mode, "kvcoord-bench rooms");
}

/* Sample k of 2 x rounds: a room failure or a pipe wake-up.  The two kinds
 * alternate, and which goes first alternates with each pair, so neither gets
 * the warmer (or the colder) half of the run. */
static bool sample_is_room(size_t k) { return (k % 2 == 0) == (k / 2 % 2 == 0); }

/* Waiter side of one propagation round: block until the room fails. */
static void wait_round(kvc_segment *s, uint64_t room, int ready_fd, struct shared *sh, size_t i)
{
    kvc_room_info ri;
    kvc_room_open(s, room, 2, 1, KVC_ROOM_ROLE_DECODE);
    kvc_room_set_state(s, room, 1, KVC_POLL_TRANSFERRING);
    if (write(ready_fd, "r", 1) != 1)
        _exit(2);
    kvc_err e = kvc_room_wait(s, room, 1, KVC_POLL_BOOTSTRAPPING, 10000, &ri);
    while (!e && !ri.has_failure)
        e = kvc_room_wait(s, room, 1, ri.state, 10000, &ri);
    sh->lat[i] = kvc__mono_ns() - sh->t0;
    kvc_room_release(s, room, 1);
}

static void run_propagation(const char *name, size_t rounds, double out[4])
{
    struct shared *sh = mmap(NULL, sizeof *sh + 2 * rounds * sizeof(uint64_t),
                             PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    int ready[2], wake[2];
    if (sh == MAP_FAILED || pipe(ready) || pipe(wake)) {
        perror("kvcoord-bench rooms");
        exit(1);
    }
    pid_t child = fork();
    if (child == 0) {
        kvc_segment *s = open_seg(name, KVC_OPEN_ATTACH);
        for (size_t k = 0; k < 2 * rounds; k++) {
            size_t i = k / 2;
            char c;
            if (sample_is_room(k)) {
                wait_round(s, 1000 + i, ready[1], sh, i);
                continue;
            }
            /* baseline: a bare pipe wake-up */
            if (write(ready[1], "r", 1) != 1 || read(wake[0], &c, 1) != 1)
                _exit(2);
            sh->lat[rounds + i] = kvc__mono_ns() - sh->t0;
        }
        kvc_close(s);
        _exit(0);
    }
    kvc_segment *s = open_seg(name, KVC_OPEN_ATTACH);
    char c;
    for (size_t k = 0; k < 2 * rounds; k++) {
        if (read(ready[0], &c, 1) != 1)
            break;
        usleep(200); /* let the waiter reach its futex (or read) */
        sh->t0 = kvc__mono_ns();
        if (sample_is_room(k))
            kvc_room_fail(s, 1000 + k / 2, 0, ETIMEDOUT, "bench: transfer timed out", NULL);
        else if (write(wake[1], "w", 1) != 1)
            break;
    }
    waitpid(child, NULL, 0);
    uint64_t *v = malloc(2 * rounds * sizeof *v);
    memcpy(v, (const void *)sh->lat, 2 * rounds * sizeof *v);
    stats(v, rounds, &out[0], &out[1]);
    stats(v + rounds, rounds, &out[2], &out[3]);
    free(v);
    kvc_close(s);
    munmap(sh, sizeof *sh + 2 * rounds * sizeof(uint64_t));
}

/* One process's share of the ops run: room cycles until the deadline. */
static uint64_t ops_worker(const char *name, unsigned id, uint64_t deadline)
{
    kvc_segment *s = open_seg(name, KVC_OPEN_ATTACH);
    uint64_t n = 0;
    kvc_room_info ri;
    for (uint64_t room = ((uint64_t)id << 40) + 1; kvc__mono_ns() < deadline; room++, n++) {
        if (kvc_room_open(s, room, 1, 0, KVC_ROOM_ROLE_PREFILL) ||
            kvc_room_set_state(s, room, 0, KVC_POLL_WAITING_FOR_INPUT) ||
            kvc_room_set_state(s, room, 0, KVC_POLL_TRANSFERRING) ||
            kvc_room_set_state(s, room, 0, KVC_POLL_SUCCESS) || kvc_room_get(s, room, 0, &ri) ||
            kvc_room_release(s, room, 0)) {
            fprintf(stderr, "kvcoord-bench rooms: %s\n", kvc_last_error());
            break;
        }
    }
    kvc_close(s);
    return n;
}

/* procs processes cycling rooms for the given seconds; with private, the
 * process p works on segment privates[p] instead of name.  Cycles/s. */
static double run_ops(const char *name, char (*privates)[64], unsigned procs, double seconds)
{
    uint64_t *counts = mmap(NULL, procs * sizeof(uint64_t), PROT_READ | PROT_WRITE,
                            MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    uint64_t start = kvc__mono_ns(), deadline = start + (uint64_t)(seconds * 1e9);
    pid_t pids[64];
    for (unsigned p = 0; p < procs; p++)
        if ((pids[p] = fork()) == 0) {
            counts[p] = ops_worker(privates ? privates[p] : name, p + 1, deadline);
            _exit(0);
        }
    uint64_t total = 0;
    for (unsigned p = 0; p < procs; p++) {
        waitpid(pids[p], NULL, 0);
        total += counts[p];
    }
    double elapsed = (double)(kvc__mono_ns() - start) / 1e9;
    munmap(counts, procs * sizeof(uint64_t));
    return (double)total / elapsed;
}

#define OPS_COUNTS 3
#define OPS_MAX_PROCS 8
#define OPS_MAX_SLICES 100

static double median_d(double *v, size_t n)
{
    double t[OPS_MAX_SLICES];
    memcpy(t, v, n * sizeof *t);
    for (size_t i = 1; i < n; i++) /* n <= 100: insertion sort */
        for (size_t j = i; j > 0 && t[j - 1] > t[j]; j--) {
            double x = t[j];
            t[j] = t[j - 1];
            t[j - 1] = x;
        }
    return n % 2 ? t[n / 2] : (t[n / 2 - 1] + t[n / 2]) / 2;
}

#define LINE_RUNS 5
#define LINE_HANDOVERS 200000 /* per run, even */

/* One cache line handed between this process and a forked one, each
 * waiting for the other's count before writing its own (yielding now and
 * then, should both share a CPU): ns per one-way hand-over, the median of
 * LINE_RUNS runs; 0 when the fork fails. */
static double run_line_handover(void)
{
    _Atomic uint64_t *ball =
        mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (ball == MAP_FAILED)
        return 0;
    double ns[LINE_RUNS];
    unsigned done = 0;
    for (unsigned run = 0; run < LINE_RUNS; run++) {
        atomic_store(ball, 0);
        pid_t pid = fork();
        if (pid < 0)
            break;
        unsigned mine = pid == 0; /* the child writes the odd counts */
        uint64_t start = kvc__mono_ns();
        for (uint64_t i = mine; i < LINE_HANDOVERS; i += 2) {
            for (unsigned spins = 0; atomic_load_explicit(ball, memory_order_acquire) != i;)
                if (++spins % 4096 == 0)
                    sched_yield();
            atomic_store_explicit(ball, i + 1, memory_order_release);
        }
        if (pid == 0)
            _exit(0);
        while (atomic_load_explicit(ball, memory_order_acquire) != LINE_HANDOVERS)
            sched_yield();
        ns[done++] = (double)(kvc__mono_ns() - start) / LINE_HANDOVERS;
        waitpid(pid, NULL, 0);
    }
    munmap((void *)ball, 4096);
    return done ? median_d(ns, done) : 0;
}

/* The ops figures: per process count, median cycles/s on the shared
 * segment and on private ones, the median ratio of each to its 1-process
 * slice, and the median ratio shared / private. */
struct ops_result {
    double shared[OPS_COUNTS], priv[OPS_COUNTS];
    double shared_scale[OPS_COUNTS], priv_scale[OPS_COUNTS], vs_priv[OPS_COUNTS];
};

static const unsigned ops_procs[OPS_COUNTS] = {1, 2, OPS_MAX_PROCS};

static void run_ops_slices(const char *name, unsigned slices, double duration, struct ops_result *r)
{
    /* A fresh shared segment too: the rooms the propagation rounds left
     * (failed, waiting for their TTL) would lengthen its probe chains. */
    char shared[64], privates[OPS_MAX_PROCS][64];
    snprintf(shared, sizeof shared, "%s-s", name);
    kvc_segment *common = open_seg(shared, KVC_OPEN_FRESH), *own[OPS_MAX_PROCS];
    for (unsigned p = 0; p < OPS_MAX_PROCS; p++) {
        snprintf(privates[p], sizeof privates[p], "%s-p%u", name, p);
        own[p] = open_seg(privates[p], KVC_OPEN_FRESH);
    }
    double sh[OPS_COUNTS][OPS_MAX_SLICES], pr[OPS_COUNTS][OPS_MAX_SLICES];
    double shs[OPS_COUNTS][OPS_MAX_SLICES], prs[OPS_COUNTS][OPS_MAX_SLICES];
    double vs[OPS_COUNTS][OPS_MAX_SLICES];
    double each = duration / slices;
    /* Shared and private in turn, the first of the two alternating slice
     * by slice, so that neither always runs on the caches and the
     * frequency the other left. */
    for (unsigned k = 0; k < slices; k++)
        for (int i = 0; i < OPS_COUNTS; i++) {
            if (k % 2)
                pr[i][k] = run_ops(shared, privates, ops_procs[i], each);
            sh[i][k] = run_ops(shared, NULL, ops_procs[i], each);
            if (!(k % 2))
                pr[i][k] = run_ops(shared, privates, ops_procs[i], each);
        }
    for (int i = 0; i < OPS_COUNTS; i++) {
        for (unsigned k = 0; k < slices; k++) {
            shs[i][k] = sh[i][k] / sh[0][k];
            prs[i][k] = pr[i][k] / pr[0][k];
            vs[i][k] = sh[i][k] / pr[i][k];
        }
        r->shared[i] = median_d(sh[i], slices);
        r->priv[i] = median_d(pr[i], slices);
        r->shared_scale[i] = median_d(shs[i], slices);
        r->priv_scale[i] = median_d(prs[i], slices);
        r->vs_priv[i] = median_d(vs[i], slices);
    }
    for (unsigned p = 0; p < OPS_MAX_PROCS; p++) {
        kvc_close(own[p]);
        kvc_unlink(privates[p]);
    }
    kvc_close(common);
    kvc_unlink(shared);
}

/* One participant of the get run: join the room, report a state, wait for
 * the parent to close the pipe. */
static void get_participant(const char *name, uint64_t room, unsigned rank, int ready_fd,
                            int hold_fd)
{
    kvc_segment *s = open_seg(name, KVC_OPEN_ATTACH);
    if (kvc_room_open(s, room, GET_PARTICIPANTS, rank, KVC_ROOM_ROLE_DECODE) ||
        kvc_room_set_state(s, room, rank, KVC_POLL_TRANSFERRING)) {
        fprintf(stderr, "kvcoord-bench rooms: %s\n", kvc_last_error());
        _exit(1);
    }
    char c;
    if (write(ready_fd, "r", 1) != 1 || read(hold_fd, &c, 1) < 0)
        _exit(2);
    kvc_room_release(s, room, rank);
    kvc_close(s);
    _exit(0);
}

static double median_of(uint64_t *v, size_t n)
{
    qsort(v, n, sizeof *v, cmp64);
    return (double)v[n / 2] / GET_BATCH;
}

/* out: kvc_room_get median ns, kvc_rank_lookup median ns; unwatched, then
 * watched. */
static void run_get(const char *name, size_t batches, double out[4])
{
    const uint64_t room = 7777;
    int ready[2], hold[2];
    if (pipe(ready) || pipe(hold)) {
        perror("kvcoord-bench rooms");
        exit(1);
    }
    pid_t pids[GET_PARTICIPANTS];
    for (unsigned r = 0; r < GET_PARTICIPANTS; r++)
        if ((pids[r] = fork()) == 0) {
            close(hold[1]);
            get_participant(name, room, r, ready[1], hold[0]);
        }
    close(hold[0]);
    char c;
    for (unsigned r = 0; r < GET_PARTICIPANTS; r++)
        if (read(ready[0], &c, 1) != 1) {
            fprintf(stderr, "kvcoord-bench rooms: a participant failed\n");
            exit(1);
        }
    kvc_segment *s = open_seg(name, KVC_OPEN_ATTACH);
    static const char wid[] = "{\"model.embed_tokens.weight\":[139637976727552,65667072,2]}";
    uint64_t gen = 0;
    if (kvc_rank_register(s, 0, "127.0.0.1:16000", wid, sizeof wid - 1, &gen)) {
        fprintf(stderr, "kvcoord-bench rooms: %s\n", kvc_last_error());
        exit(1);
    }
    kvc_room_info ri;
    kvc_rank_info rk = {0};
    uint64_t *tg = malloc(batches * sizeof *tg), *tl = malloc(batches * sizeof *tl);
    for (int watched = 0; watched < 2; watched++) {
        kvc_proc_watch_beat(s, watched);
        for (size_t b = 0; b < batches; b++) {
            if (watched) /* as kvcoordd, every KVC_PROC_WATCH_BEAT_MS: kept fresh */
                kvc_proc_watch_beat(s, 1);
            uint64_t t0 = kvc__mono_ns();
            for (int i = 0; i < GET_BATCH; i++)
                if (kvc_room_get(s, room, -1, &ri) || ri.joined != GET_PARTICIPANTS) {
                    fprintf(stderr, "kvcoord-bench rooms: kvc_room_get: %s\n", kvc_last_error());
                    exit(1);
                }
            uint64_t t1 = kvc__mono_ns();
            for (int i = 0; i < GET_BATCH; i++)
                if (kvc_rank_lookup(s, 0, &rk)) {
                    fprintf(stderr, "kvcoord-bench rooms: kvc_rank_lookup: %s\n", kvc_last_error());
                    exit(1);
                }
            uint64_t t2 = kvc__mono_ns();
            tg[b] = t1 - t0;
            tl[b] = t2 - t1;
        }
        out[2 * watched] = median_of(tg, batches);
        out[2 * watched + 1] = median_of(tl, batches);
    }
    kvc_proc_watch_beat(s, 0);
    free(tg);
    free(tl);
    kvc_rank_info_free(&rk);
    close(hold[1]);
    for (unsigned r = 0; r < GET_PARTICIPANTS; r++)
        waitpid(pids[r], NULL, 0);
    close(ready[0]);
    close(ready[1]);
    kvc_close(s);
}

void bench_rooms_usage(FILE *out)
{
    fprintf(out,
            "       kvcoord-bench rooms [--rounds N] [--duration SECONDS] [--slices N] [--json]\n");
}

int bench_rooms_main(int argc, char **argv)
{
    static const struct option longs[] = {
        {"rounds", required_argument, 0, 'n'}, {"duration", required_argument, 0, 'd'},
        {"slices", required_argument, 0, 's'}, {"json", no_argument, 0, 'j'},
        {"help", no_argument, 0, 'h'},         {0, 0, 0, 0}};
    size_t rounds = 1000;
    double duration = 2.0;
    unsigned long slices = 5;
    int json = 0, c;
    optind = 2;
    while ((c = getopt_long(argc, argv, "n:d:s:jh", longs, NULL)) != -1) {
        switch (c) {
        case 'n': rounds = strtoul(optarg, NULL, 10); break;
        case 'd': duration = strtod(optarg, NULL); break;
        case 's': slices = strtoul(optarg, NULL, 10); break;
        case 'j': json = 1; break;
        case 'h':
            printf("Usage: kvcoord-bench rooms [--rounds N] [--duration SECONDS] [--slices N] "
                   "[--json]\n\n"
                   "propagation: time from kvc_room_fail() in one process to the return of\n"
                   "another process's kvc_room_wait(), --rounds rounds (default 1000); baseline:\n"
                   "a bare pipe wake-up between the same processes.\n"
                   "get: median ns of kvc_room_get() of a room joined by 8 live processes,\n"
                   "from another process, --rounds batches of 64 calls; baseline:\n"
                   "kvc_rank_lookup() of a small rank, interleaved batch by batch.\n"
                   "ops: room cycles per second (open, 3 state updates, poll, release) with 1,\n"
                   "2 and 8 processes, --duration seconds each (default 2) cut into --slices\n"
                   "slices (default 5) run in turn, medians over slices; ratio to 1 process;\n"
                   "baseline: the same processes each on a private segment (nothing shared);\n"
                   "the machine's one-way hand-over of a cache line between 2 processes, and\n"
                   "the shared / private it implies when creating a room writes one line\n"
                   "the other creator also writes (about half the cycles wait for it).\n");
            return 0;
        default: return 2;
        }
    }
    if (rounds < 10 || rounds > 1000000 || !(duration > 0 && duration <= 3600) || slices < 1 ||
        slices > OPS_MAX_SLICES) {
        fprintf(stderr, "kvcoord-bench rooms: --rounds 10..1000000, --duration 0..3600 s, "
                        "--slices 1..100\n");
        return 2;
    }
    char name[64];
    snprintf(name, sizeof name, "kvcbench-rooms-%d", (int)getpid());
    kvc_segment *owner = open_seg(name, KVC_OPEN_FRESH);
    double get[4];
    run_get(name, rounds, get);
    double prop[4];
    run_propagation(name, rounds, prop);
    struct ops_result ops;
    run_ops_slices(name, (unsigned)slices, duration, &ops);
    kvc_close(owner);
    kvc_unlink(name);
    /* The private 2-process cycle per process, and the estimate of shared
     * / private with one shared line per new room (the file's top). */
    double line = run_line_handover();
    double cycle = ops.priv[1] > 0 ? 2e9 / ops.priv[1] : 0;
    double estimate = cycle > 0 ? cycle / (cycle + line / 2) : 0;
    if (json) {
        printf("{\"propagation_us\":{\"median\":%.1f,\"p99\":%.1f},\"pipe_wake_us\":{\"median\":"
               "%.1f,\"p99\":%.1f},\"ratio\":%.2f,\"room_cycles_per_s\":{\"1\":%.0f,\"2\":%.0f,"
               "\"8\":%.0f},\"room_cycles_scale\":{\"2\":%.2f,\"8\":%.2f},"
               "\"private_cycles_per_s\":{\"1\":%.0f,\"2\":%.0f,\"8\":%.0f},"
               "\"private_scale\":{\"2\":%.2f,\"8\":%.2f},"
               "\"shared_vs_private\":{\"1\":%.2f,\"2\":%.2f,\"8\":%.2f},\"slices\":%lu,"
               "\"room_get_ns\":%.1f,\"rank_lookup_ns\":%.1f,\"get_ratio\":%.2f,"
               "\"room_get_watched_ns\":%.1f,\"rank_lookup_watched_ns\":%.1f,"
               "\"line_handover_ns\":%.1f,\"private_cycle_ns_2\":%.1f,"
               "\"one_shared_line_estimate_2\":%.2f}\n",
               prop[0], prop[1], prop[2], prop[3], prop[0] / prop[2], ops.shared[0], ops.shared[1],
               ops.shared[2], ops.shared_scale[1], ops.shared_scale[2], ops.priv[0], ops.priv[1],
               ops.priv[2], ops.priv_scale[1], ops.priv_scale[2], ops.vs_priv[0], ops.vs_priv[1],
               ops.vs_priv[2], slices, get[0], get[1], get[0] / get[1], get[2], get[3], line, cycle,
               estimate);
        return 0;
    }
    printf("kvc_room_get of a room joined by %d live processes, from another process "
           "(%zu batches of %d): median %.0f ns\n",
           GET_PARTICIPANTS, rounds, GET_BATCH, get[0]);
    printf("  baseline, kvc_rank_lookup of a small rank, same process, interleaved: "
           "median %.0f ns; ratio %.2fx\n",
           get[1], get[0] / get[1]);
    printf("kvc_room_get, the same, with a process watcher beating (as kvcoordd): median %.0f ns; "
           "kvc_rank_lookup interleaved %.0f ns; ratio %.2fx\n",
           get[2], get[3], get[2] / get[3]);
    printf("failure propagation (%zu rounds): kvc_room_fail -> other process's kvc_room_wait "
           "returns: median %.1f us, p99 %.1f us\n",
           rounds, prop[0], prop[1]);
    printf("  baseline, bare pipe wake-up between the same processes:       median %.1f us, "
           "p99 %.1f us; ratio %.2fx\n",
           prop[2], prop[3], prop[0] / prop[2]);
    printf("room cycles (open + 3 updates + poll + release), medians of %lu slices:\n", slices);
    for (int i = 0; i < OPS_COUNTS; i++)
        printf("  %u process%s: %9.0f /s (%7.0f calls/s); ratio to 1 process %.2fx\n"
               "    baseline, each process on a private segment: %9.0f /s; ratio to 1 process "
               "%.2fx; shared / private %.2fx\n",
               ops_procs[i], ops_procs[i] > 1 ? "es" : "  ", ops.shared[i], ops.shared[i] * 6,
               ops.shared_scale[i], ops.priv[i], ops.priv_scale[i], ops.vs_priv[i]);
    printf("the machine: a cache line handed between 2 processes, one way: median %.0f ns "
           "(%d runs);\n  a private 2-process cycle: %.0f ns per process; so one shared line per "
           "new room\n  (about half the cycles wait for it) puts shared / private at 2 processes "
           "near %.2fx\n",
           line, LINE_RUNS, cycle, estimate);
    return 0;
}
