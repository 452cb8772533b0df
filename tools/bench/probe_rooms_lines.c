/*
 * probe_rooms_lines.c - kvcoord-probe-rooms: which lines two processes
 * cycling rooms of their own on one segment pay for (issue 30).
 *
 * Two processes pinned to CPUs 0 and 1, each running kvcoord-bench rooms'
 * cycle (open, 3 state updates, kvc_room_get, release) on rooms of its
 * own; every cycle is timed (TSC ticks on x86, else ns) and each process reports its
 * median (a cycle preempted by the machine's other work is an outlier, not
 * the median) and its mean (what throughput pays, slow cycles included).
 * Four modes, interleaved round by round:
 *   shared     one segment, room ids in sequence (the bench's shared case)
 *   private    a segment per process (the bench's baseline)
 *   split      one segment, process p only takes ids whose stripe is
 *              even/odd: nothing of a stripe or of its slots is shared
 *   slotsplit  one segment, every stripe shared, but process p only takes
 *              ids whose home slot is in the lower/upper half of the
 *              stripe's table: the stripes' lines are shared, the room
 *              slots' lines are not
 * shared - slotsplit is what the room slots' lines cost (a slot last
 * written by the other process), slotsplit - split what the stripes' lines
 * cost.  Run under `chrt -f 10` on a loaded machine, so that the two
 * processes run at the same time as on a quiet one.  White-box (the room
 * hash, internal.h); not a test, prints and judges nothing.
 *
 * Usage: kvcoord-probe-rooms [ROUNDS [CYCLES]]   (default 5, 100000)
 */
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#if defined(__x86_64__) || defined(__i386__)
#include <x86intrin.h>
#endif

#include "bench_rooms.h"
#include "internal.h"

enum { SHARED, PRIVATE, SPLIT, SLOTSPLIT, MODES, MAX_ROUNDS = 64 };
static const char *const mode_names[MODES] = {"shared", "private", "split", "slotsplit"};

struct sync {
    volatile int ready;
    double median[2]; /* TSC ticks per cycle, per process */
    double mean[2];   /* the same, the mean: what throughput pays, slow cycles included */
};

static kvc_segment *open_seg(const char *name, kvc_open_mode mode)
{
    return bench_rooms_open(name, mode, "kvcoord-probe-rooms");
}

/* TSC ticks (x86), else CLOCK_MONOTONIC ns. */
static uint64_t ticks(void)
{
#if defined(__x86_64__) || defined(__i386__)
    return __rdtsc();
#else
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
#endif
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The next room id of process p in mode m after r. */
static uint64_t next_room(uint64_t r, int m, int p)
{
    for (r++;; r++) {
        uint64_t h = kvc__room_hash(r);
        if (m == SPLIT && kvc__room_stripe(h) % 2 != (uint32_t)p)
            continue;
        if (m == SLOTSPLIT && ((h & 0xffffffffull) >> 31) != (uint64_t)p)
            continue; /* kvc__room_home: the low 32 bits scaled to the stripe */
        return r;
    }
}

static int cycle(kvc_segment *s, uint64_t room)
{
    kvc_room_info ri;
    return kvc_room_open(s, room, 1, 0, KVC_ROOM_ROLE_PREFILL) ||
           kvc_room_set_state(s, room, 0, KVC_POLL_WAITING_FOR_INPUT) ||
           kvc_room_set_state(s, room, 0, KVC_POLL_TRANSFERRING) ||
           kvc_room_set_state(s, room, 0, KVC_POLL_SUCCESS) || kvc_room_get(s, room, 0, &ri) ||
           kvc_room_release(s, room, 0);
}

static void worker(const char *name, int m, int p, long cycles, struct sync *sy, uint64_t *t)
{
    cpu_set_t cs;
    CPU_ZERO(&cs);
    CPU_SET(p, &cs);
    sched_setaffinity(0, sizeof cs, &cs);
    kvc_segment *s = open_seg(name, KVC_OPEN_ATTACH);
    uint64_t room = ((uint64_t)(p + 1) << 40);
    for (int i = 0; i < 2000; i++) /* warm up */
        if (cycle(s, room = next_room(room, m, p)))
            goto fail;
    __atomic_add_fetch(&sy->ready, 1, __ATOMIC_SEQ_CST);
    while (__atomic_load_n(&sy->ready, __ATOMIC_SEQ_CST) < 2)
        sched_yield();
    for (long i = 0; i < cycles; i++) {
        room = next_room(room, m, p);
        uint64_t a = ticks();
        if (cycle(s, room))
            goto fail;
        t[i] = ticks() - a;
    }
    double sum = 0;
    for (long i = 0; i < cycles; i++)
        sum += (double)t[i];
    sy->mean[p] = sum / (double)cycles;
    qsort(t, (size_t)cycles, sizeof *t, cmp_u64);
    sy->median[p] = (double)t[cycles / 2];
    kvc_close(s);
    return;
fail:
    fprintf(stderr, "kvcoord-probe-rooms: %s\n", kvc_last_error());
    exit(1);
}

int main(int argc, char **argv)
{
    int rounds = argc > 1 ? atoi(argv[1]) : 5;
    long cycles = argc > 2 ? atol(argv[2]) : 100000;
    if (rounds < 1 || rounds > MAX_ROUNDS || cycles < 100 || cycles > 10000000) {
        fprintf(stderr, "usage: kvcoord-probe-rooms [ROUNDS 1..64 [CYCLES 100..10000000]]\n");
        return 2;
    }
    char names[3][64];
    kvc_segment *segs[3];
    for (int i = 0; i < 3; i++) {
        snprintf(names[i], sizeof names[i], "kvcoord-probe-%d-%d", (int)getpid(), i);
        segs[i] = open_seg(names[i], KVC_OPEN_FRESH);
    }
    struct sync *sy =
        mmap(NULL, sizeof *sy, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    uint64_t *t = mmap(NULL, 2 * (size_t)cycles * sizeof *t, PROT_READ | PROT_WRITE,
                       MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (sy == MAP_FAILED || t == MAP_FAILED) {
        perror("kvcoord-probe-rooms: mmap");
        return 1;
    }
    double v[MODES][MAX_ROUNDS], mv[MODES][MAX_ROUNDS];
    for (int k = 0; k < rounds; k++)
        for (int m = 0; m < MODES; m++) {
            sy->ready = 0;
            pid_t pid[2];
            for (int p = 0; p < 2; p++)
                if ((pid[p] = fork()) == 0) {
                    worker(names[m == PRIVATE ? 1 + p : 0], m, p, cycles, sy,
                           t + (size_t)p * (size_t)cycles);
                    _exit(0);
                }
            int bad = 0;
            for (int p = 0; p < 2; p++) {
                int st = 0;
                waitpid(pid[p], &st, 0);
                bad |= !WIFEXITED(st) || WEXITSTATUS(st) != 0;
            }
            if (bad)
                return 1;
            v[m][k] = (sy->median[0] + sy->median[1]) / 2;
            mv[m][k] = (sy->mean[0] + sy->mean[1]) / 2;
        }
    printf("median TSC ticks per room cycle, 2 processes on CPUs 0 and 1, %d rounds of %ld "
           "cycles\n",
           rounds, cycles);
    double med[MODES];
    for (int m = 0; m < MODES; m++) {
        double x[MAX_ROUNDS];
        memcpy(x, v[m], (size_t)rounds * sizeof *x);
        qsort(x, (size_t)rounds, sizeof *x, cmp_d);
        med[m] = x[rounds / 2];
        printf("  %-9s %6.0f  [", mode_names[m], med[m]);
        for (int k = 0; k < rounds; k++)
            printf("%s%.0f", k ? " " : "", v[m][k]);
        printf("]\n");
    }
    printf("private / shared %.2f; room slots' lines (shared - slotsplit) %.0f, stripes' lines "
           "(slotsplit - split) %.0f ticks per cycle\n",
           med[PRIVATE] / med[SHARED], med[SHARED] - med[SLOTSPLIT], med[SLOTSPLIT] - med[SPLIT]);
    double mmed[MODES];
    for (int m = 0; m < MODES; m++) {
        double x[MAX_ROUNDS];
        memcpy(x, mv[m], (size_t)rounds * sizeof *x);
        qsort(x, (size_t)rounds, sizeof *x, cmp_d);
        mmed[m] = x[rounds / 2];
    }
    printf("mean ticks per cycle (slow cycles included; median of rounds): shared %.0f, private "
           "%.0f, split %.0f, slotsplit %.0f; private / shared %.2f\n",
           mmed[SHARED], mmed[PRIVATE], mmed[SPLIT], mmed[SLOTSPLIT], mmed[PRIVATE] / mmed[SHARED]);
    for (int i = 0; i < 3; i++) {
        kvc_close(segs[i]);
        kvc_unlink(names[i]);
    }
    return 0;
}
