/* test_lock_clock.c - the segment's lock waits are bounded on
 * CLOCK_MONOTONIC, shown without touching the real clock:
 *  - pthread_mutex_clocklock and pthread_mutex_timedlock are interposed
 *    (this executable's definitions win over libc's for the statically
 *    linked library): every timed lock asks for CLOCK_MONOTONIC and none
 *    uses timedlock (whose deadline is CLOCK_REALTIME); an uncontended
 *    lock is a trylock (no deadline, no clock read), counted too;
 *  - with a holder process keeping the lock, the wait measured on
 *    CLOCK_MONOTONIC lasts at least the lock timeout and ends in KVC_E_BUSY
 *    naming the holder;
 *  - a room stripe found held is watched a bounded while before the timed
 *    wait: no trylock again while the holder's owner mark is set, one per
 *    round (KVC__STRIPE_SPINS) while it is clear, then one timed wait. */
#include <dlfcn.h>
#include <pthread.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>

#include "testutil.h"
#include "tu_robust.h"
#include "internal.h"
#include "rooms_internal.h"

static int clocklock_calls, clocklock_other_clock, timedlock_calls, trylock_calls;

int pthread_mutex_trylock(pthread_mutex_t *m)
{
    static int (*real)(pthread_mutex_t *);
    if (!real)
        *(void **)&real = dlsym(RTLD_NEXT, "pthread_mutex_trylock");
    trylock_calls++;
    return real(m);
}

int pthread_mutex_clocklock(pthread_mutex_t *m, clockid_t clk, const struct timespec *abstime)
{
    static int (*real)(pthread_mutex_t *, clockid_t, const struct timespec *);
    if (!real)
        *(void **)&real = dlsym(RTLD_NEXT, "pthread_mutex_clocklock");
    clocklock_calls++;
    if (clk != CLOCK_MONOTONIC)
        clocklock_other_clock++;
    return real(m, clk, abstime);
}

int pthread_mutex_timedlock(pthread_mutex_t *m, const struct timespec *abstime)
{
    static int (*real)(pthread_mutex_t *, const struct timespec *);
    if (!real)
        *(void **)&real = dlsym(RTLD_NEXT, "pthread_mutex_timedlock");
    timedlock_calls++;
    return real(m, abstime);
}

static uint64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static kvc_segment *open_seg(const char *name, kvc_open_mode mode, uint32_t timeout_ms)
{
    kvc_options o = tu_options(name, mode, KVC_ROLE_NONE);
    o.max_ranks = 8;
    o.arena_bytes = 4ull << 20;
    o.max_info_bytes = 1ull << 20;
    o.lock_timeout_ms = timeout_ms;
    return tu_open_with(&o);
}

static void test_every_lock_is_a_monotonic_clocklock(void **st)
{
    (void)st;
    const char *name = tu_name();
    kvc_segment *s = open_seg(name, KVC_OPEN_FRESH, 2000);
    clocklock_calls = clocklock_other_clock = timedlock_calls = trylock_calls = 0;
    assert_int_equal(kvc_rank_register(s, 0, "h:0", "{}", 2, NULL), KVC_OK);    /* ranks */
    assert_int_equal(kvc_room_open(s, 1, 1, 0, KVC_ROOM_ROLE_PREFILL), KVC_OK); /* rooms */
    assert_int_equal(kvc_proc_reap_dead(s, NULL), KVC_OK);
    assert_int_equal(kvc_proc_reap(s, 1 << 22, 0, "gone", NULL, NULL), KVC_OK); /* procs */
    assert_true(clocklock_calls + trylock_calls >= 4);
    assert_int_equal(clocklock_other_clock, 0);
    assert_int_equal(timedlock_calls, 0);
    kvc_close(s);
    kvc_unlink(name);
}

static void test_wait_on_a_held_lock_is_measured_on_the_monotonic_clock(void **st)
{
    (void)st;
    const char *name = tu_name();
    const uint32_t timeout_ms = 300;
    kvc_segment *s = open_seg(name, KVC_OPEN_FRESH, timeout_ms);
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    pid_t holder = fork();
    assert_true(holder >= 0);
    if (holder == 0) {
        kvc_segment *h = open_seg(name, KVC_OPEN_ATTACH, timeout_ms);
        /* The lock of room 9's stripe. */
        if (kvc__lock(h, KVC_LOCK_ROOMS + (int)kvc__room_stripe(kvc__room_hash(9))) != KVC_OK)
            _exit(1);
        char c = 'l';
        if (write(fds[1], &c, 1) != 1)
            _exit(1);
        for (;;)
            pause();
    }
    char c;
    close(fds[1]);
    assert_int_equal(read(fds[0], &c, 1), 1);
    close(fds[0]);
    clocklock_other_clock = 0;
    uint64_t t0 = mono_ms();
    kvc_err e = kvc_room_open(s, 9, 1, 0, KVC_ROOM_ROLE_PREFILL);
    uint64_t waited = mono_ms() - t0;
    assert_int_equal(e, KVC_E_BUSY);
    char who[32];
    snprintf(who, sizeof who, "pid %d", (int)holder);
    assert_non_null(strstr(kvc_last_error(), "rooms."));
    assert_non_null(strstr(kvc_last_error(), " lock of segment"));
    assert_non_null(strstr(kvc_last_error(), who));
    assert_int_equal(clocklock_other_clock, 0);
    /* The deadline is a CLOCK_MONOTONIC one: the wait ends no earlier than
     * the timeout on that clock (no upper bound is asserted). */
    assert_true(waited >= timeout_ms);
    printf("# waited %llu ms on CLOCK_MONOTONIC for a %u ms lock timeout\n",
           (unsigned long long)waited, timeout_ms);
    kill(holder, SIGKILL);
    waitpid(holder, NULL, 0);
    tu_owner_died(s, holder); /* the kernel's part, where it does not */
    /* The dead holder's lock is recovered by the next locker. */
    assert_int_equal(kvc_room_open(s, 9, 1, 0, KVC_ROOM_ROLE_PREFILL), KVC_OK);
    kvc_close(s);
    kvc_unlink(name);
}

static void test_a_held_stripe_is_watched_a_bounded_while(void **st)
{
    (void)st;
    const char *name = tu_name();
    kvc_segment *s = open_seg(name, KVC_OPEN_FRESH, 100);
    int up[2], down[2];
    assert_int_equal(pipe(up), 0);
    assert_int_equal(pipe(down), 0);
    int id = KVC_LOCK_ROOMS + (int)kvc__room_stripe(kvc__room_hash(9));
    pid_t holder = fork();
    assert_true(holder >= 0);
    if (holder == 0) {
        /* Every wait ends when the parent is gone (its pipe ends close),
         * so a failed assertion there leaves no holder behind. */
        close(up[0]);
        close(down[1]);
        kvc_segment *h = open_seg(name, KVC_OPEN_ATTACH, 100);
        char c = 'l';
        if (kvc__lock(h, id) != KVC_OK || write(up[1], &c, 1) != 1 || read(down[0], &c, 1) != 1)
            _exit(1);
        /* Still holding the mutex, as between the mark's clear and the
         * unlock of kvc__unlock. */
        atomic_store(&kvc__lock_ptr(h, id)->owner_pid, 0);
        if (write(up[1], &c, 1) != 1)
            _exit(1);
        (void)!read(down[0], &c, 1);
        _exit(0);
    }
    close(up[1]);
    close(down[0]);
    char c;
    assert_int_equal(read(up[0], &c, 1), 1);
    /* Marked: one trylock, the watch, one timed wait. */
    trylock_calls = clocklock_calls = 0;
    assert_int_equal(kvc_room_open(s, 9, 1, 0, KVC_ROOM_ROLE_PREFILL), KVC_E_BUSY);
    assert_int_equal(trylock_calls, 1);
    assert_int_equal(clocklock_calls, 1);
    assert_int_equal(write(down[1], "c", 1), 1);
    assert_int_equal(read(up[0], &c, 1), 1);
    /* Unmarked: a trylock every round of the watch, which is bounded. */
    trylock_calls = clocklock_calls = 0;
    assert_int_equal(kvc_room_open(s, 9, 1, 0, KVC_ROOM_ROLE_PREFILL), KVC_E_BUSY);
    assert_int_equal(trylock_calls, 1 + KVC__STRIPE_SPINS);
    assert_int_equal(clocklock_calls, 1);
    kill(holder, SIGKILL);
    waitpid(holder, NULL, 0);
    close(up[0]);
    close(down[1]);
    tu_owner_died(s, holder);
    assert_int_equal(kvc_room_open(s, 9, 1, 0, KVC_ROOM_ROLE_PREFILL), KVC_OK);
    kvc_close(s);
    kvc_unlink(name);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_lock_is_a_monotonic_clocklock),
        cmocka_unit_test(test_wait_on_a_held_lock_is_measured_on_the_monotonic_clock),
        cmocka_unit_test(test_a_held_stripe_is_watched_a_bounded_while),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
