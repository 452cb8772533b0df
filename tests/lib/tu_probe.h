/*
 * tu_probe.h - kernel behaviour some multi-process cases need, probed at
 * run time, so that a case skips (cmocka skip, with the reason printed)
 * where the system under the test lacks it, instead of failing or hanging,
 * or (robust futex lists, tu_robust.h) the test stands in for it.
 *
 * Real Linux kernels have both.  qemu-user (the arm64 step of
 * tools/kvcoord.sh test runs the arm64 build under qemu-aarch64-static)
 * has neither:
 *   - robust futex lists: set_robust_list/get_robust_list are ENOSYS, so a
 *     process-shared robust mutex whose owner died is never marked
 *     EOWNERDEAD; the next locker waits out its timeout (KVC_E_BUSY)
 *     unless the test marks it as the kernel would (tu_robust.h).
 *   - its own /proc/self/stat: qemu answers it (and /proc/<own pid>/stat)
 *     itself, and a forked child reports its parent's start time, so the
 *     identity a process records for itself (pid, start time) is not the
 *     one other processes read in /proc/<pid>/stat.
 * Each probe runs once per process; NULL means the behaviour is there,
 * otherwise a sentence saying what is missing.
 */
#ifndef KVC_TU_PROBE_H
#define KVC_TU_PROBE_H

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "kvcoord/kvcoord.h"

/* Does a robust process-shared mutex whose owner is SIGKILLed report
 * EOWNERDEAD to the next locker? */
static inline const char *tu_probe_robust(void)
{
    static int done;
    static char why[256];
    if (done)
        return why[0] ? why : NULL;
    done = 1;
    pthread_mutex_t *m =
        mmap(NULL, sizeof *m, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    int fds[2];
    if (m == MAP_FAILED || pipe(fds) != 0) {
        snprintf(why, sizeof why, "robust mutex probe: mmap or pipe failed: %s", strerror(errno));
        return why;
    }
    pthread_mutexattr_t a;
    pthread_mutexattr_init(&a);
    pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
    pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST);
    pthread_mutex_init(m, &a);
    pthread_mutexattr_destroy(&a);
    pid_t child = fork();
    if (child == 0) {
        if (pthread_mutex_lock(m) != 0 || write(fds[1], "l", 1) != 1)
            _exit(1);
        for (;;)
            pause();
    }
    char c;
    int got = child > 0 && read(fds[0], &c, 1) == 1;
    if (child > 0) {
        kill(child, SIGKILL);
        waitpid(child, NULL, 0);
    }
    close(fds[0]);
    close(fds[1]);
    int r = got ? pthread_mutex_trylock(m) : -1;
    if (r == EOWNERDEAD) {
        pthread_mutex_consistent(m);
        pthread_mutex_unlock(m);
    } else {
        void *head;
        size_t len;
        long g = syscall(SYS_get_robust_list, 0, &head, &len);
        snprintf(why, sizeof why,
                 "a robust mutex whose owner was SIGKILLed is not EOWNERDEAD here "
                 "(trylock: %s; get_robust_list: %s): no robust futex lists "
                 "(qemu-user does not implement them)",
                 r < 0 ? "probe child failed" : strerror(r), g ? strerror(errno) : "works");
    }
    pthread_mutex_destroy(m);
    munmap(m, sizeof *m);
    return why[0] ? why : NULL;
}

/* Does a forked process read the start time in its own /proc/<pid>/stat
 * that its parent reads there? */
static inline const char *tu_probe_self_stat(void)
{
    static int done;
    static char why[256];
    if (done)
        return why[0] ? why : NULL;
    done = 1;
    int up[2], down[2];
    if (pipe(up) != 0 || pipe(down) != 0) {
        snprintf(why, sizeof why, "/proc probe: pipe failed: %s", strerror(errno));
        return why;
    }
    pid_t child = fork();
    if (child == 0) {
        close(down[1]);
        kvc_proc_stat own;
        uint64_t start = kvc_proc_stat_read(getpid(), &own) == KVC_OK ? own.start : 0;
        char c;
        if (write(up[1], &start, sizeof start) != sizeof start || read(down[0], &c, 1) < 0)
            _exit(1);
        _exit(0);
    }
    uint64_t self_start = 0;
    kvc_proc_stat seen = {0};
    int got = child > 0 && read(up[0], &self_start, sizeof self_start) == sizeof self_start &&
              kvc_proc_stat_read(child, &seen) == KVC_OK;
    close(down[1]); /* the child ends */
    if (child > 0)
        waitpid(child, NULL, 0);
    close(up[0]);
    close(up[1]);
    close(down[0]);
    if (!got)
        snprintf(why, sizeof why, "/proc probe: the child's start time could not be read");
    else if (self_start != seen.start)
        snprintf(why, sizeof why,
                 "a forked process reads start time %llu in its own /proc/%d/stat, its parent "
                 "reads %llu there (qemu-user answers /proc/self/stat itself and gives a "
                 "forked child its parent's start time)",
                 (unsigned long long)self_start, (int)child, (unsigned long long)seen.start);
    return why[0] ? why : NULL;
}

/* Skip the running case, saying why, when the probe found something
 * missing. */
#define TU_SKIP_UNLESS(probe)                          \
    do {                                               \
        const char *tu_why_ = (probe);                 \
        if (tu_why_) {                                 \
            print_message("# skipped: %s\n", tu_why_); \
            skip();                                    \
        }                                              \
    } while (0)

/* The same at the end of a case that checked all it could without what
 * the probe found missing: part names what was left unchecked. */
#define TU_SKIP_PART_UNLESS(probe, part)                            \
    do {                                                            \
        const char *tu_why_ = (probe);                              \
        if (tu_why_) {                                              \
            print_message("# skipped (%s): %s\n", (part), tu_why_); \
            skip();                                                 \
        }                                                           \
    } while (0)

#endif
