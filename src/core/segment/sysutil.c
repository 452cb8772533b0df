/*
 * sysutil.c - process identity (pid + start time) and the shared
 * futex the epoch words are waited on with.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <linux/futex.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"

/* Fields of /proc/<pid>/stat (proc(5)): 3 state, 22 start time (ticks
 * since boot, shifted by the reader's time namespace: returned as the
 * host's), 52 exit
 * code.  The command name (field 2) may hold spaces and parentheses, so
 * parsing starts after its last ')'.  Returns false if unreadable. */
static bool proc_stat_at(const char *path, char *state, uint64_t *start, int *exit_code);

static bool proc_stat(int32_t pid, char *state, uint64_t *start, int *exit_code)
{
    char path[64];
    if (pid <= 0)
        return false;
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    return proc_stat_at(path, state, start, exit_code);
}

static bool proc_stat_at(const char *path, char *state, uint64_t *start, int *exit_code)
{
    char buf[2048];
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return false;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
        return false;
    buf[n] = '\0';
    char *p = strrchr(buf, ')');
    if (!p || p[1] != ' ')
        return false;
    p += 2; /* field 3 */
    *state = *p;
    *start = 0;
    *exit_code = -1;
    unsigned long long v = 0;
    for (int field = 3; *p; p++) {
        if (*p != ' ')
            continue;
        field++;
        if (field == 22 && sscanf(p + 1, "%llu", &v) == 1)
            /* Shown shifted by the reader's time namespace: the host's. */
            *start = (uint64_t)v - (uint64_t)kvc__boot_offset_ticks();
        if (field == 52) {
            *exit_code = atoi(p + 1);
            break;
        }
    }
    return true;
}

KVC_API kvc_err kvc_proc_stat_read(int32_t pid, kvc_proc_stat *out)
{
    if (!out)
        return kvc__fail(KVC_E_INVAL, "kvc_proc_stat_read: argument out is NULL");
    if (pid <= 0)
        return kvc__fail(KVC_E_INVAL, "kvc_proc_stat_read: bad pid %d", (int)pid);
    memset(out, 0, sizeof *out);
    out->exit_status = -1;
    if (!proc_stat(pid, &out->state, &out->start, &out->exit_status))
        return kvc__fail(KVC_E_NOENT, "no process %d (or /proc/%d/stat unreadable)", (int)pid,
                         (int)pid);
    return KVC_OK;
}

uint64_t kvc__proc_start(int32_t pid)
{
    char st = 0;
    uint64_t start = 0;
    int code = 0;
    return proc_stat(pid, &st, &start, &code) ? start : 0;
}

bool kvc__proc_alive(int32_t pid, uint64_t start)
{
    if (pid <= 0)
        return false;
    char st = 0;
    uint64_t now = 0;
    int code = 0;
    if (!proc_stat(pid, &st, &now, &code)) {
        /* Unreadable /proc (hidepid) but the pid exists: trust kill(0). */
        if (syscall(SYS_kill, pid, 0) == 0 || errno == EPERM)
            return true;
        return false;
    }
    if (st == 'Z' || st == 'X')
        return false;
    return start == 0 || now == start;
}

uint64_t kvc__proc_start_self(void)
{
    /* /proc/self, not /proc/<getpid()>: in a PID namespace sharing the
     * host's /proc, getpid() names another process there (pid 1: init). */
    char st = 0;
    uint64_t start = 0;
    int code = 0;
    return proc_stat_at("/proc/self/stat", &st, &start, &code) ? start : 0;
}

/* ---- exits told by a watcher (kvc_proc_exit_note) ------------------------- */

#define EXIT_NOTES 256

static struct exit_note {
    int32_t pid;
    uint64_t start;
    int status;
} exit_notes[EXIT_NOTES];
static unsigned exit_notes_next;
static pthread_mutex_t exit_notes_mu = PTHREAD_MUTEX_INITIALIZER;

KVC_API kvc_err kvc_proc_exit_note(int32_t pid, uint64_t start, int status)
{
    if (pid <= 0)
        return kvc__fail(KVC_E_INVAL, "kvc_proc_exit_note: bad pid %d", (int)pid);
    pthread_mutex_lock(&exit_notes_mu);
    exit_notes[exit_notes_next++ % EXIT_NOTES] =
        (struct exit_note){.pid = pid, .start = start, .status = status};
    pthread_mutex_unlock(&exit_notes_mu);
    return KVC_OK;
}

/* The wait status noted for (pid, start); -1 if none. */
static int exit_noted(int32_t pid, uint64_t start)
{
    int status = -1;
    pthread_mutex_lock(&exit_notes_mu);
    for (unsigned i = 0; i < EXIT_NOTES; i++)
        if (exit_notes[i].pid == pid && (!start || exit_notes[i].start == start))
            status = exit_notes[i].status;
    pthread_mutex_unlock(&exit_notes_mu);
    return status;
}

void kvc__proc_how(int32_t pid, uint64_t start, char *buf, size_t cap)
{
    char st = 0;
    uint64_t now = 0;
    int code = -1;
    int noted = exit_noted(pid, start);
    if (noted >= 0)
        kvc_wait_status_text(noted, buf, cap);
    else if (proc_stat(pid, &st, &now, &code) && (st == 'Z' || st == 'X') && code >= 0 &&
             (!start || now == start))
        kvc_wait_status_text(code, buf, cap);
    else
        kvc_exit_unknown_text(start, buf, cap);
}

KVC_API uint64_t kvc_proc_start_realtime_ns(uint64_t start)
{
    long hz = sysconf(_SC_CLK_TCK);
    struct timespec rt, bt;
    if (!start || hz <= 0 || clock_gettime(CLOCK_REALTIME, &rt) ||
        clock_gettime(CLOCK_BOOTTIME, &bt))
        return 0;
    /* proc(5) field 22 counts from boot (CLOCK_BOOTTIME), in whole ticks
     * rounded down; start is on the host's clock (proc_stat removed this
     * process's time namespace offset), so is boot here. */
    const uint64_t ns = 1000000000ull, h = (uint64_t)hz;
    int64_t boot = (int64_t)bt.tv_sec * (int64_t)ns + bt.tv_nsec -
                   kvc__boot_offset_ticks() * (int64_t)(ns / h);
    uint64_t now = (uint64_t)rt.tv_sec * ns + (uint64_t)rt.tv_nsec;
    uint64_t since = start / h * ns + start % h * ns / h;
    if (boot <= 0 || since > (uint64_t)boot || (uint64_t)boot - since > now)
        return 0;
    return now - ((uint64_t)boot - since);
}

KVC_API char *kvc_exit_unknown_text(uint64_t start, char *buf, size_t cap)
{
    if (!buf || !cap)
        return buf;
    char when[48] = "";
    uint64_t at = kvc_proc_start_realtime_ns(start);
    time_t t = (time_t)(at / 1000000000ull);
    struct tm tm;
    if (at && gmtime_r(&t, &tm)) {
        char sec[24];
        strftime(sec, sizeof sec, "%Y-%m-%dT%H:%M:%S", &tm);
        snprintf(when, sizeof when, " (started %s.%03uZ)", sec,
                 (unsigned)(at / 1000000ull % 1000ull));
    }
    snprintf(buf, cap, "is gone%s; not our child, so its exit status is not known", when);
    return buf;
}

KVC_API char *kvc_wait_status_text(int status, char *buf, size_t cap)
{
    if (!buf || !cap)
        return buf;
    if (WIFSIGNALED(status))
        snprintf(buf, cap, "killed by signal %d (%s)", WTERMSIG(status),
                 strsignal(WTERMSIG(status)));
    else if (WIFEXITED(status))
        snprintf(buf, cap, "exited with status %d", WEXITSTATUS(status));
    else
        snprintf(buf, cap, "ended with wait status 0x%x", (unsigned)status);
    return buf;
}

int kvc__futex_wait(_Atomic uint32_t *word, uint32_t val, uint32_t timeout_ms)
{
    struct timespec ts = {.tv_sec = timeout_ms / 1000,
                          .tv_nsec = (long)(timeout_ms % 1000) * 1000000L};
    /* FUTEX_WAIT without FUTEX_PRIVATE_FLAG: the word lives in shared memory
     * and waiters and wakers are different processes. */
    long r = syscall(SYS_futex, (uint32_t *)word, FUTEX_WAIT, val, &ts, NULL, 0);
    if (r == 0)
        return 0;
    if (errno == EAGAIN)
        return 0;
    return errno;
}

void kvc__futex_wake_all(_Atomic uint32_t *word)
{
    syscall(SYS_futex, (uint32_t *)word, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

kvc_err kvc__epoch_wait(_Atomic uint32_t *epoch, uint32_t seen, uint32_t timeout_ms,
                        const char *what)
{
    uint64_t deadline = kvc__mono_ns() + (uint64_t)timeout_ms * 1000000ull;
    for (;;) {
        if (atomic_load_explicit(epoch, memory_order_acquire) != seen)
            return KVC_OK;
        uint64_t now = kvc__mono_ns();
        if (now >= deadline)
            return kvc__fail(KVC_E_TIMEDOUT, "%s unchanged after %u ms", what, timeout_ms);
        kvc__futex_wait(epoch, seen, (uint32_t)((deadline - now + 999999) / 1000000));
    }
}
