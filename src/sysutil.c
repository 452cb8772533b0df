/*
 * sysutil.c - clocks, process identity (pid + start time) and the shared
 * futex the epoch words are waited on with.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"

uint64_t kvc__now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

uint64_t kvc__mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Field 22 of /proc/<pid>/stat (proc(5)); the command name (field 2) may
 * hold spaces and parentheses, so parsing starts after its last ')'. */
uint64_t kvc__proc_start(int32_t pid)
{
    char path[64], buf[1024];
    if (pid <= 0)
        return 0;
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
        return 0;
    buf[n] = '\0';
    char *p = strrchr(buf, ')');
    if (!p)
        return 0;
    p++;
    /* p is at " S ppid ..." : state is field 3; skip to field 22. */
    for (int field = 2; field < 22 && *p; p++)
        if (*p == ' ')
            field++;
    unsigned long long start = 0;
    if (sscanf(p, "%llu", &start) != 1)
        return 0;
    return (uint64_t)start;
}

bool kvc__proc_alive(int32_t pid, uint64_t start)
{
    if (pid <= 0)
        return false;
    uint64_t now = kvc__proc_start(pid);
    if (now == 0) {
        /* Unreadable /proc (hidepid) but the pid exists: trust kill(0). */
        if (syscall(SYS_kill, pid, 0) == 0 || errno == EPERM)
            return start == 0;
        return false;
    }
    return start == 0 || now == start;
}

int kvc__futex_wait(_Atomic uint32_t *word, uint32_t val, uint32_t timeout_ms)
{
    struct timespec ts = {.tv_sec = timeout_ms / 1000, .tv_nsec = (long)(timeout_ms % 1000) * 1000000L};
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
