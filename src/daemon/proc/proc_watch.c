/*
 * proc_watch.c - kvcoordd's dead-process detection.
 *
 * Every process attached to the segment (the library's process table) is
 * watched through a pidfd, in the watch thread's epoll set: it is readable
 * once the process exits (POLLIN is raised at exit, while it is still a
 * zombie; reaping by its parent is not needed).  Then the process is
 * reaped in the segment: kvc_proc_reap() fails every non-terminal room it
 * takes part in and withdraws the ranks it registered as a worker, naming
 * how it ended, and removes its entry.
 *
 * The table is re-scanned when its change epoch moved (kvc_proc_epoch).
 * A helper thread sleeps in kvc_proc_wait_change() (the segment's shared
 * futex, woken on every attach, detach and reap); when it wakes it opens a
 * pidfd for each process that attached since (the race that matters: a
 * worker that registers and dies at once, and is reaped by its parent at
 * once, takes its exit status with it unless a pidfd was opened before the
 * reap; the thread is the shortest path from the attach to that open),
 * hands the descriptors over and writes an eventfd the watch thread
 * sleeps on; its scan then watches those processes with the descriptors
 * already open.  The 1 s tick and every mutating request (a poke) check
 * the epoch too, as a safety net.  A scan reads the small table, opens a pidfd for each (pid, start time) not
 * watched yet, and reaps at once an entry whose process is already gone
 * (one that died while the daemon was down, or before the scan).  A
 * process that detached cleanly (kvc_close) leaves the table: its watch is
 * cancelled, and its registrations stay, as the library documents.
 *
 * How a process ended comes from ioctl(PIDFD_GET_INFO) with
 * PIDFD_INFO_EXIT (Linux >= 6.15; the kernel fills it once the process is
 * reaped by its parent), else from its zombie's /proc/PID/stat, else
 * kvc_exit_unknown_text() says what is known (gone, when it started, not
 * our child).
 *
 * Once a complete scan is done, the thread publishes a watch beat
 * (kvc_proc_watch_beat) every KVC_PROC_WATCH_BEAT_MS (100 ms, its own
 * timer): while it is fresh (KVC_PROC_WATCH_STALE_MS, 500 ms),
 * kvc_room_get() in every process judges the liveness of room participants
 * from the dead marks kvc_proc_reap() sets, with no system call.  The beat
 * is short so that a daemon that dies (SIGKILL) stops being trusted within
 * half a second: readers then look at /proc themselves.  It is withdrawn
 * at stop.  The 1 s tick sweeps rooms past their TTL (kvc_room_sweep) every few
 * seconds, logs what changed in the segment (seg_events.h), keeps the
 * rooms figures of GET /metrics warm and checks the segment file
 * (seg_watch.h).  The daemon never watches itself.
 *
 * None of this runs on the io_uring loop's thread: every step may wait for
 * a segment lock (a stopped lock holder makes it wait the whole lock
 * timeout).  The watch thread sleeps in epoll_wait() on the pidfds and an
 * eventfd (pokes and the helper thread's hand-overs) with a 1 s timeout
 * for the tick; the loop only pokes it (proc_watch_poke).
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <sys/epoll.h>

#include "clock.h"
#include "log.h"
#include "metrics.h"
#include "pd_upkeep.h"
#include "proc_watch.h"
#include "seg_events.h"
#include "seg_watch.h"
#include "wake.h"

#define TICK_MS 1000        /* the watch thread's tick */
#define ROOM_SWEEP_TICKS 5  /* kvc_room_sweep every 5 ticks */
#define EVENTS_MAX 64       /* epoll events taken at once */
#define POKE_TAG UINT64_MAX /* epoll data of the eventfd */
/* Bound on one futex sleep of the helper thread, so a stop request is seen
 * within it. */
#define WAKER_SLICE_MS 250
/* How often the liveness locks of processes with no pidfd (other PID
 * namespaces) are tested: a death there is seen within this. */
#define LOCK_POLL_MS 100

/* Debian 12's linux/pidfd.h predates PIDFD_GET_INFO (Linux 6.13) and
 * PIDFD_INFO_EXIT (6.15).  This is the first published layout of struct
 * pidfd_info (PIDFD_INFO_SIZE_VER0, 64 bytes) with 6.15's name for its last
 * field; the kernel reads the size from the ioctl number, so later kernels
 * (whose struct grew) accept it and fill only these 64 bytes. */
struct kvcd_pidfd_info {
    uint64_t mask;
    uint64_t cgroupid;
    uint32_t pid, tgid, ppid, ruid, rgid, euid, egid, suid, sgid, fsuid, fsgid;
    int32_t exit_code; /* a wait(2) status, valid when mask has PIDFD_INFO_EXIT */
};
_Static_assert(sizeof(struct kvcd_pidfd_info) == 64, "PIDFD_INFO_SIZE_VER0");
#define KVCD_PIDFD_INFO_EXIT (1ull << 3)
#define KVCD_PIDFS_IOCTL_MAGIC 0xFF
#define KVCD_PIDFD_GET_INFO _IOWR(KVCD_PIDFS_IOCTL_MAGIC, 11, struct kvcd_pidfd_info)

struct watched {
    int32_t pid; /* 0: slot free; as the process table names it */
    int32_t rank;
    uint64_t start;
    int32_t os_pid; /* the pid in our namespace (its pidfd's): pid, or for a
                       process of another PID namespace sharing our /proc,
                       its shown_pid */
    int pidfd;
    unsigned seen : 1;    /* found in the table by the current scan */
    unsigned adopted : 1; /* not in the table: an HTTP registrant (proc_watch_adopt) */
};

/* A pidfd opened by the helper thread for (pid, start). */
struct preopen {
    int32_t pid;
    uint64_t start;
    int fd;
};

struct proc_watch {
    kvc_segment *seg;
    struct seg_events *events;
    struct seg_watch *file;
    int epfd;          /* the watch thread's epoll: pidfds and efd */
    pthread_t watcher; /* the watch thread */
    int watcher_ok;
    int32_t self_pid;
    uint64_t self_start;
    uint64_t self_pid_ns;  /* inode of our PID namespace: a pid means the same to us only
                              for a process of that namespace */
    uint32_t unwatched;    /* live entries of the last scan with no pidfd (other namespaces) */
    uint64_t next_poll_ms; /* when the liveness locks of those are tested next */
    struct watched *w;     /* cap slots; the poll of slot i has user_data slot i */
    uint32_t cap;
    kvc_proc_info *list; /* kvc_proc_list() buffer */
    size_t list_cap;
    uint32_t epoch; /* process table epoch of the last scan */
    int scanned;    /* a scan ran */
    unsigned ticks;
    struct metrics *metrics;
    /* the helper thread waking the watch thread on process table changes */
    int efd; /* eventfd: pokes and hand-overs */
    pthread_t thread;
    int thread_ok;
    atomic_int stop;
    atomic_int poked;    /* a poke since the watch thread last looked */
    pthread_mutex_t mu;  /* guards pre/npre */
    struct preopen *pre; /* pidfds the thread opened, for the loop */
    size_t npre, pre_cap;
    /* the thread's own: its table buffer and the processes it has seen */
    kvc_proc_info *tlist;
    size_t tlist_cap;
    struct preopen *known; /* fd unused: (pid, start) seen in the table */
    size_t nknown, known_cap;
    struct pd_upkeep pd;   /* the PD bootstrap tables' upkeep (pd_upkeep.h) */
    struct preopen *adopt; /* pidfds of HTTP registrants to watch (proc_watch_adopt) */
    size_t nadopt, adopt_cap;
    int info_exit; /* the kernel has PIDFD_INFO_EXIT (probed at start) */
};

/* ---- /proc --------------------------------------------------------------- */

/* State, start time and exit code (a wait status; only meaningful for a
 * zombie) of pid, by the library's parser of /proc/PID/stat.  Returns 0,
 * or -1 when the process does not exist. */
static int read_stat(int32_t pid, char *state, uint64_t *start, int *exit_code)
{
    kvc_proc_stat ps;
    if (kvc_proc_stat_read(pid, &ps) != KVC_OK)
        return -1;
    *state = ps.state;
    *start = ps.start;
    *exit_code = ps.exit_status;
    return 0;
}

/* The wait status of (pid, start), through its pidfd (once reaped) or its
 * zombie (before).  Tried twice: the parent may reap the zombie between
 * the ioctl and the read of /proc, and the kernel publishes the exit
 * information before it frees the pid.  Returns 1 (from the pidfd) or 2
 * (from the zombie) and sets *status, or -1 when neither says. */
static int exit_status(int pidfd, int32_t pid, uint64_t start, int *status)
{
    for (int tries = 0; tries < 2; tries++) {
        struct kvcd_pidfd_info info;
        memset(&info, 0, sizeof info);
        info.mask = KVCD_PIDFD_INFO_EXIT;
        if (ioctl(pidfd, KVCD_PIDFD_GET_INFO, &info) == 0 && (info.mask & KVCD_PIDFD_INFO_EXIT)) {
            *status = info.exit_code;
            return 1;
        }
        char st;
        uint64_t st_start;
        int code;
        if (read_stat(pid, &st, &st_start, &code) == 0 && st_start == start &&
            (st == 'Z' || st == 'X') && code >= 0) {
            *status = code;
            return 2;
        }
    }
    return -1;
}

/* ---- reaping ---------------------------------------------------------------- */

/* Reap (pid, start) in the segment and log it.  how NULL: from its zombie
 * if it is one, else kvc_exit_unknown_text(). */
static void reap(struct proc_watch *pw, int32_t pid, uint64_t start, int32_t rank, const char *how,
                 int32_t shown_pid)
{
    size_t rooms = 0, ranks = 0;
    char st, zombie_how[96];
    uint64_t st_start;
    int code;
    if (!how && read_stat(pid, &st, &st_start, &code) == 0 && st_start == start &&
        (st == 'Z' || st == 'X') && code >= 0)
        how = kvc_wait_status_text(code, zombie_how, sizeof zombie_how);
    if (!how) /* the log and the segment say the same */
        how = kvc_exit_unknown_text(start, zombie_how, sizeof zombie_how);
    /* Counted first: a request served while the reap runs (on this thread,
     * while the loop answers) that sees its rank withdrawn sees the count. */
    if (pw->metrics)
        metrics_dead_processes(pw->metrics, 1);
    kvc_err e = kvc_proc_reap(pw->seg, pid, start, how, &rooms, &ranks);
    if (e) {
        log_event(LOG_ERROR, "proc_reap_failed", "pid=%d rank=%d err=\"%s\"", (int)pid, (int)rank,
                  kvc_last_error());
        if (pw->metrics) /* not reaped: counted again when it is */
            metrics_dead_processes(pw->metrics, UINT64_MAX);
        pw->scanned = 0; /* try again on the next check */
        return;
    }
    /* pid: as its /proc names it (the host's when shared); ns_pid, when
     * it differs: in its own PID namespace.  (Two formats: a %s field is an
     * escaped value, quoted when empty or spaced, never a piece of text.) */
    const char *h = how;
    if (shown_pid && shown_pid != pid)
        log_event(LOG_INFO, "proc_dead",
                  "rank=%d pid=%d how=\"%s\" rooms_failed=%zu ranks_withdrawn=%zu ns_pid=%d",
                  (int)rank, (int)shown_pid, h, rooms, ranks, (int)pid);
    else
        log_event(LOG_INFO, "proc_dead",
                  "rank=%d pid=%d how=\"%s\" rooms_failed=%zu ranks_withdrawn=%zu", (int)rank,
                  (int)pid, h, rooms, ranks);
    pd_upkeep_run(&pw->pd, pw->seg); /* its PD entries too, at once */
}

/* The table's entry for (pid, start), or NULL. */
static const kvc_proc_info *table_find(struct proc_watch *pw, size_t n, int32_t pid, uint64_t start)
{
    for (size_t i = 0; i < n; i++)
        if (pw->list[i].pid == pid && pw->list[i].start == start)
            return &pw->list[i];
    return NULL;
}

/* Read the process table into pw->list; returns the entry count (growing
 * the buffer as needed), or -1. */
static long table_read(struct proc_watch *pw)
{
    for (;;) {
        size_t count = 0;
        if (kvc_proc_list(pw->seg, pw->list, pw->list_cap, &count)) {
            log_event(LOG_ERROR, "proc_list_failed", "err=\"%s\"", kvc_last_error());
            return -1;
        }
        if (count <= pw->list_cap)
            return (long)count;
        size_t cap = count + 64;
        kvc_proc_info *l = realloc(pw->list, cap * sizeof *l);
        if (!l) {
            log_event(LOG_ERROR, "proc_list_failed", "err=\"out of memory\"");
            return -1;
        }
        pw->list = l;
        pw->list_cap = cap;
    }
}

/* ---- watches ------------------------------------------------------------------ */

static struct watched *watch_find(struct proc_watch *pw, int32_t pid, uint64_t start)
{
    for (uint32_t i = 0; i < pw->cap; i++)
        if (pw->w[i].pid == pid && pw->w[i].start == start)
            return &pw->w[i];
    return NULL;
}

static struct watched *watch_alloc(struct proc_watch *pw)
{
    for (uint32_t i = 0; i < pw->cap; i++)
        if (pw->w[i].pid == 0)
            return &pw->w[i];
    uint32_t cap = pw->cap ? pw->cap * 2 : 64;
    struct watched *w = realloc(pw->w, cap * sizeof *w);
    if (!w)
        return NULL;
    memset(w + pw->cap, 0, (cap - pw->cap) * sizeof *w);
    for (uint32_t i = pw->cap; i < cap; i++)
        w[i].pidfd = -1;
    pw->w = w;
    struct watched *slot = &w[pw->cap];
    pw->cap = cap;
    return slot;
}

/* Stop watching: out of the epoll set (closing the pidfd does it), slot freed. */
static void watch_free(struct watched *w)
{
    if (w->pidfd >= 0)
        close(w->pidfd);
    memset(w, 0, sizeof *w);
    w->pidfd = -1;
}

/* A process whose pid means to us what it means to itself: same PID
 * namespace.  Only those get a pidfd (which names a pid of our namespace);
 * the others are watched through their liveness lock alone. */
static int same_ns(const struct proc_watch *pw, const kvc_proc_info *p)
{
    return p->pid_ns && p->pid_ns == pw->self_pid_ns;
}

/* Start watching a table entry of our PID namespace through a pidfd (fd:
 * the one the helper thread opened for it, or -1 to open one now).
 * Returns 1 when watched; 0 when not (the process is gone, or its pid now
 * names another process, or an error): its liveness lock, tested every
 * LOCK_POLL_MS, then decides. */
static int watch_add(struct proc_watch *pw, const kvc_proc_info *p, int fd)
{
    int checked = fd >= 0; /* the helper thread checked its pidfd's start time */
    /* Another PID namespace's process is opened by the pid our /proc gives
     * it (its shown_pid, when its /proc is ours): the start time check
     * below tells whether that is the same process. */
    int32_t os_pid = same_ns(pw, p) ? p->pid : p->shown_pid;
    if (os_pid <= 0)
        return 0;
    if (fd < 0)
        fd = (int)syscall(SYS_pidfd_open, (pid_t)os_pid, 0);
    if (fd < 0) {
        if (errno != ESRCH)
            log_event(LOG_WARN, "pidfd_open_failed", "pid=%d err=\"%s\"", (int)os_pid,
                      strerror(errno));
        return 0;
    }
    fcntl(fd, F_SETFD, FD_CLOEXEC);
    /* The pid may have been reused between the table read and the open:
     * the pidfd is ours to keep only if the process it names (alive now,
     * or a zombie) has the entry's start time. */
    char st;
    uint64_t start;
    int code;
    if (!checked && (read_stat(os_pid, &st, &start, &code) || start != p->start)) {
        close(fd);
        return 0;
    }
    struct watched *w = watch_alloc(pw);
    struct epoll_event ev = {.events = EPOLLIN};
    if (w)
        ev.data.u64 = (uint64_t)(w - pw->w);
    if (!w || epoll_ctl(pw->epfd, EPOLL_CTL_ADD, fd, &ev)) {
        log_event(LOG_WARN, "proc_watch_failed", "pid=%d err=\"%s\"", (int)p->pid,
                  w ? strerror(errno) : "out of memory");
        close(fd);
        return 0;
    }
    *w = (struct watched){.pid = p->pid,
                          .rank = p->rank,
                          .start = p->start,
                          .os_pid = os_pid,
                          .pidfd = fd,
                          .seen = 1};
    /* Named as proc_dead names it: pid as our /proc shows it, ns_pid when
     * its own namespace calls it otherwise. */
    if (os_pid != p->pid)
        log_event(LOG_DEBUG, "proc_watch", "pid=%d rank=%d role=%d ns_pid=%d", (int)os_pid,
                  (int)p->rank, (int)p->role, (int)p->pid);
    else
        log_event(LOG_DEBUG, "proc_watch", "pid=%d rank=%d role=%d", (int)p->pid, (int)p->rank,
                  (int)p->role);
    return 1;
}

/* How a process ended that we could only see through its liveness lock:
 * NULL (its zombie, if any, says), or for one of another PID namespace
 * (whose pid means another process here) what is known, into buf. */
static const char *lock_how(const struct proc_watch *pw, const kvc_proc_info *p, char *buf,
                            size_t cap)
{
    return same_ns(pw, p) ? NULL : kvc_exit_unknown_text(p->start, buf, cap);
}

static struct preopen *preopen_find(struct preopen *pre, size_t n, const kvc_proc_info *p)
{
    for (size_t i = 0; i < n; i++)
        if (pre[i].fd >= 0 && pre[i].pid == p->pid && pre[i].start == p->start)
            return &pre[i];
    return NULL;
}

static int preopen_has(struct preopen *pre, size_t n, const kvc_proc_info *p)
{
    return preopen_find(pre, n, p) != NULL;
}

/* The thread's pidfd for p (then no longer in pre), or -1. */
static int preopen_take(struct preopen *pre, size_t n, const kvc_proc_info *p)
{
    struct preopen *e = preopen_find(pre, n, p);
    if (!e)
        return -1;
    int fd = e->fd;
    e->fd = -1;
    return fd;
}

static int is_self(const struct proc_watch *pw, const kvc_proc_info *p)
{
    return p->pid == pw->self_pid && p->start == pw->self_start;
}

/* Re-scan the process table if it changed since the last scan (force:
 * anyway): watch new processes, reap gone ones, drop detached ones. */
static void procs_check(struct proc_watch *pw, int force)
{
    /* The epoch is read before the table: a change after it is seen by the
     * next check. */
    uint32_t epoch = kvc_proc_epoch(pw->seg);
    /* The helper thread's descriptors: taken (and the scan forced) now, so
     * none waits; those no scan entry claims are closed below. */
    struct preopen *pre = NULL;
    size_t npre = 0;
    pthread_mutex_lock(&pw->mu);
    if (pw->npre) {
        pre = pw->pre, npre = pw->npre;
        pw->pre = NULL, pw->npre = pw->pre_cap = 0;
    }
    pthread_mutex_unlock(&pw->mu);
    if (!force && !npre && pw->scanned && epoch == pw->epoch)
        return;
    pw->epoch = epoch;
    pw->scanned = 1;
    long n = table_read(pw);
    if (n < 0) {
        pw->scanned = 0;
        n = 0; /* the descriptors handed over are closed below */
    }
    for (uint32_t i = 0; i < pw->cap; i++)
        pw->w[i].seen = 0;
    uint32_t unwatched = 0;
    char how[96];
    for (long i = 0; i < n; i++) {
        const kvc_proc_info *p = &pw->list[i];
        if (is_self(pw, p))
            continue;
        struct watched *w = watch_find(pw, p->pid, p->start);
        if (w)
            w->seen = 1, w->rank = p->rank;
        else if (!p->alive && !preopen_has(pre, npre, p)) /* its liveness lock is free */
            reap(pw, p->pid, p->start, p->rank, lock_how(pw, p, how, sizeof how), p->shown_pid);
        else if (!p->alive || same_ns(pw, p) || p->shown_pid != p->pid) {
            /* a dead one with a pidfd: watched, its pidfd is ready at once;
             * another PID namespace's through the pid our /proc gives it */
            if (!watch_add(pw, p, preopen_take(pre, npre, p)))
                unwatched++;
        } else {
            unwatched++; /* another PID namespace: its liveness lock alone */
        }
    }
    pw->unwatched = unwatched;
    for (size_t i = 0; i < npre; i++)
        if (pre[i].fd >= 0)
            close(pre[i].fd);
    free(pre);
    if (n == 0 && !pw->scanned)
        return;
    for (uint32_t i = 0; i < pw->cap; i++) {
        struct watched *w = &pw->w[i];
        if (w->pid && !w->seen && !w->adopted) /* detached cleanly (kvc_close): its
                                                  registrations stay */
            watch_free(w);
    }
}

/* Watch slot's pidfd is readable: the process exited.  Reap it only if it
 * is still in the table: one that detached first (kvc_close) keeps its
 * registrations. */
static void proc_exited(struct proc_watch *pw, uint32_t slot)
{
    if (slot >= pw->cap || !pw->w[slot].pid)
        return;
    struct watched *w = &pw->w[slot];
    if (w->adopted) {
        /* An HTTP registrant: its status told, the reap of its PD entries
         * (kvc_pd_reap, which finds it gone) says it. */
        int status, from = exit_status(w->pidfd, w->os_pid, w->start, &status);
        if (from > 0)
            kvc_proc_exit_note(w->pid, w->start, status);
        log_event(LOG_DEBUG, "proc_exit", "pid=%d from=%s registrant=http", (int)w->pid,
                  from == 1   ? "pidfd_info"
                  : from == 2 ? "zombie"
                              : "unknown");
        watch_free(w);
        pd_upkeep_run(&pw->pd, pw->seg);
        return;
    }
    long n = table_read(pw);
    const kvc_proc_info *entry = n >= 0 ? table_find(pw, (size_t)n, w->pid, w->start) : NULL;
    if (entry) {
        w->rank = entry->rank; /* it may have registered since it attached */
        char how[96];
        int status, from = exit_status(w->pidfd, w->os_pid, w->start, &status);
        if (from > 0)
            kvc_proc_exit_note(w->pid, w->start, status);
        log_event(LOG_DEBUG, "proc_exit", "pid=%d from=%s", (int)w->pid,
                  from == 1   ? "pidfd_info"
                  : from == 2 ? "zombie"
                              : "unknown");
        if (from > 0)
            reap(pw, w->pid, w->start, w->rank, kvc_wait_status_text(status, how, sizeof how),
                 entry->shown_pid);
        else
            reap(pw, w->pid, w->start, w->rank, NULL, entry->shown_pid);
    } else if (n < 0) {
        return; /* the table could not be read: its pidfd stays ready, tried again */
    }
    watch_free(w);
}

/* Every tick: the table (safety net: the helper thread wakes us first),
 * every few ticks the room sweep. */
static void procs_tick(struct proc_watch *pw)
{
    procs_check(pw, 0);
    pd_upkeep_run(&pw->pd, pw->seg);
    if (++pw->ticks % ROOM_SWEEP_TICKS)
        return;
    size_t reclaimed = 0;
    if (kvc_room_sweep(pw->seg, &reclaimed))
        log_event(LOG_WARN, "room_sweep_failed", "err=\"%s\"", kvc_last_error());
    else if (reclaimed)
        log_event(LOG_INFO, "room_sweep", "reclaimed=%zu", reclaimed);
}

/* What changed in the segment: logged, and the rooms figures of /metrics
 * re-read if they moved. */
static void look_at_segment(struct proc_watch *pw)
{
    seg_events_ranks(pw->events);
    seg_events_check(pw->events);
    if (pw->metrics)
        metrics_rooms_refresh(pw->metrics, pw->seg);
}

/* The segment file itself; a change that cannot be undone ends the daemon
 * (seg_watch.h says why). */
static void check_file(struct proc_watch *pw)
{
    char msg[512];
    if (pw->file && seg_watch_check(pw->file, msg, sizeof msg) < 0) {
        log_event(LOG_ERROR, "segment_file_changed", "err=\"%s\" action=exit status=1", msg);
        _exit(1); /* nothing may touch the mapping again: no kvc_close */
    }
}

/* Watch the HTTP registrants handed over by proc_watch_adopt(). */
static void adopt_drain(struct proc_watch *pw)
{
    pthread_mutex_lock(&pw->mu);
    struct preopen *v = pw->adopt;
    size_t n = pw->nadopt;
    pw->adopt = NULL, pw->nadopt = pw->adopt_cap = 0;
    pthread_mutex_unlock(&pw->mu);
    for (size_t i = 0; i < n; i++) {
        struct watched *w = watch_find(pw, v[i].pid, v[i].start);
        struct epoll_event ev = {.events = EPOLLIN};
        if (!w && (w = watch_alloc(pw)) != NULL) {
            ev.data.u64 = (uint64_t)(w - pw->w);
            if (epoll_ctl(pw->epfd, EPOLL_CTL_ADD, v[i].fd, &ev) == 0) {
                *w = (struct watched){.pid = v[i].pid,
                                      .rank = -1,
                                      .start = v[i].start,
                                      .os_pid = v[i].pid,
                                      .pidfd = v[i].fd,
                                      .adopted = 1};
                continue;
            }
        }
        close(v[i].fd); /* watched already, or no room: its liveness poll remains */
    }
    free(v);
}

static void *watcher_main(void *arg)
{
    struct proc_watch *pw = arg;
    struct epoll_event evs[EVENTS_MAX];
    uint64_t next_tick = kvc__mono_ms() + TICK_MS, next_beat = 0;
    while (!atomic_load(&pw->stop)) {
        uint64_t now = kvc__mono_ms();
        uint64_t next =
            pw->unwatched && pw->next_poll_ms < next_tick ? pw->next_poll_ms : next_tick;
        if (pw->scanned && next_beat < next)
            next = next_beat;
        int timeout = now >= next ? 0 : (int)(next - now);
        int n = epoll_wait(pw->epfd, evs, EVENTS_MAX, timeout);
        if (atomic_load(&pw->stop))
            break;
        /* Every attached process is watched (or reaped) once a scan is
         * complete: readers of rooms may judge liveness from the process
         * table's dead marks while this beat is fresh.  A wake for the beat
         * alone does nothing else (the file and segment looks keep their
         * pace). */
        if (pw->scanned && kvc__mono_ms() >= next_beat) {
            kvc_proc_watch_beat(pw->seg, 1);
            now = kvc__mono_ms();
            next_beat = now + KVC_PROC_WATCH_BEAT_MS;
            if (n == 0 && now < next_tick && !(pw->unwatched && now >= pw->next_poll_ms))
                continue;
        }
        int poked = 0;
        for (int i = 0; i < n; i++) {
            if (evs[i].data.u64 == POKE_TAG) {
                uint64_t v;
                ssize_t r = read(pw->efd, &v, sizeof v);
                (void)r;
                poked = 1;
            } else {
                proc_exited(pw, (uint32_t)evs[i].data.u64);
            }
        }
        check_file(pw);
        if (poked)
            adopt_drain(pw);
        if (poked || atomic_exchange(&pw->poked, 0))
            procs_check(pw, 0);
        if (pw->unwatched && kvc__mono_ms() >= pw->next_poll_ms) {
            /* Processes with no pidfd: a scan tests every liveness lock. */
            procs_check(pw, 1);
            pw->next_poll_ms = kvc__mono_ms() + LOCK_POLL_MS;
        }
        if (kvc__mono_ms() >= next_tick) {
            procs_tick(pw);
            next_tick = kvc__mono_ms() + TICK_MS;
        }
        look_at_segment(pw);
    }
    look_at_segment(pw); /* what the last requests changed is logged before the end */
    return NULL;
}

/* Append e to *v (growing it); returns 0 or -1 (out of memory). */
static int preopen_push(struct preopen **v, size_t *n, size_t *cap, struct preopen e)
{
    if (*n == *cap) {
        size_t c = *cap ? *cap * 2 : 16;
        struct preopen *nv = realloc(*v, c * sizeof *nv);
        if (!nv)
            return -1;
        *v = nv, *cap = c;
    }
    (*v)[(*n)++] = e;
    return 0;
}

/* The helper thread's scan: open a pidfd for each process in the table it
 * has not seen before, and hand it to the loop.  (pid, start) is checked
 * after the open, so a reused pid is never watched.  keep_fds 0: only note
 * what is there (at start: the loop's first scan watches those). */
static void preopen_scan(struct proc_watch *pw, int keep_fds)
{
    size_t count = 0;
    for (;;) {
        if (kvc_proc_list(pw->seg, pw->tlist, pw->tlist_cap, &count))
            return;
        if (count <= pw->tlist_cap)
            break;
        kvc_proc_info *l = realloc(pw->tlist, (count + 64) * sizeof *l);
        if (!l)
            return;
        pw->tlist = l, pw->tlist_cap = count + 64;
    }
    struct preopen *known = NULL;
    size_t nknown = 0, known_cap = 0;
    for (size_t i = 0; i < count; i++) {
        const kvc_proc_info *p = &pw->tlist[i];
        struct preopen e = {.pid = p->pid, .start = p->start, .fd = -1};
        if (preopen_push(&known, &nknown, &known_cap, e)) {
            free(known);
            return; /* out of memory: the loop's own scan opens them */
        }
        if (!keep_fds || !p->alive || is_self(pw, p) || !same_ns(pw, p) ||
            preopen_find(pw->known, pw->nknown, p))
            continue;
        int fd = (int)syscall(SYS_pidfd_open, (pid_t)p->pid, 0);
        char st;
        uint64_t start;
        int code;
        if (fd < 0)
            continue; /* gone already: the loop reaps it */
        fcntl(fd, F_SETFD, FD_CLOEXEC);
        if (read_stat(p->pid, &st, &start, &code) || start != p->start) {
            close(fd);
            continue;
        }
        e.fd = fd;
        pthread_mutex_lock(&pw->mu);
        int rc = preopen_push(&pw->pre, &pw->npre, &pw->pre_cap, e);
        pthread_mutex_unlock(&pw->mu);
        if (rc)
            close(fd);
    }
    free(pw->known); /* what is no longer in the table is forgotten */
    for (size_t i = 0; i < nknown; i++)
        known[i].fd = 0; /* "seen" marks for preopen_find */
    pw->known = known, pw->nknown = nknown, pw->known_cap = known_cap;
}

/* The helper thread: on every change of the process table's epoch, open
 * pidfds for new processes, then write the eventfd.  The new epoch is read
 * before the scan, so a change either is in the scan or moves the epoch
 * past what the thread waits on: none is missed. */
static void *waker_main(void *arg)
{
    struct proc_watch *pw = arg;
    uint32_t seen = kvc_proc_epoch(pw->seg);
    preopen_scan(pw, 0);
    while (!atomic_load_explicit(&pw->stop, memory_order_relaxed)) {
        if (kvc_proc_wait_change(pw->seg, seen, WAKER_SLICE_MS) != KVC_OK)
            continue; /* timed out: look at stop again */
        seen = kvc_proc_epoch(pw->seg);
        preopen_scan(pw, 1);
        wake_loop(pw->efd);
    }
    return NULL;
}

void proc_watch_adopt(struct proc_watch *pw, int32_t pid, uint64_t start)
{
    if (!pw || pid <= 0 || (pid == pw->self_pid && start == pw->self_start))
        return;
    int fd = (int)syscall(SYS_pidfd_open, (pid_t)pid, 0);
    if (fd < 0)
        return; /* gone already: the PD upkeep's liveness check sees it */
    fcntl(fd, F_SETFD, FD_CLOEXEC);
    char st;
    uint64_t now;
    int code;
    if (read_stat(pid, &st, &now, &code) || now != start) {
        close(fd);
        return;
    }
    pthread_mutex_lock(&pw->mu);
    int rc = preopen_push(&pw->adopt, &pw->nadopt, &pw->adopt_cap,
                          (struct preopen){.pid = pid, .start = start, .fd = fd});
    pthread_mutex_unlock(&pw->mu);
    if (rc)
        close(fd);
    else
        wake_loop(pw->efd);
}

/* Whether this kernel tells a reaped process's exit status through its
 * pidfd (PIDFD_INFO_EXIT, Linux 6.15+): a child that exits at once, its
 * pidfd opened before it is reaped, asked after. */
static int probe_info_exit(void)
{
    pid_t child = fork();
    if (child == 0)
        _exit(0);
    if (child < 0)
        return 0;
    int fd = (int)syscall(SYS_pidfd_open, child, 0);
    int status;
    while (waitpid(child, &status, 0) < 0 && errno == EINTR)
        ;
    if (fd < 0)
        return 0;
    struct kvcd_pidfd_info info;
    memset(&info, 0, sizeof info);
    info.mask = KVCD_PIDFD_INFO_EXIT;
    int ok = ioctl(fd, KVCD_PIDFD_GET_INFO, &info) == 0 && (info.mask & KVCD_PIDFD_INFO_EXIT);
    close(fd);
    return ok;
}

void proc_watch_poke(struct proc_watch *pw)
{
    if (!pw)
        return;
    atomic_store(&pw->poked, 1);
    wake_loop(pw->efd);
}

int proc_watch_start(struct proc_watch **out, const struct proc_watch_config *cfg)
{
    struct proc_watch *pw = calloc(1, sizeof *pw);
    if (!pw)
        return -1;
    pw->seg = cfg->seg;
    pw->events = cfg->events;
    pw->file = cfg->file;
    pw->metrics = cfg->metrics;
    pw->pd.interval_ms = cfg->pd_room_interval_ms;
    pw->self_pid = (int32_t)getpid();
    pw->efd = pw->epfd = -1;
    pthread_mutex_init(&pw->mu, NULL);
    char st;
    int code, err = 0;
    if (read_stat(pw->self_pid, &st, &pw->self_start, &code))
        err = ESRCH;
    pw->info_exit = probe_info_exit();
    if (!pw->info_exit) /* once */
        log_event(LOG_WARN, "pidfd_info_exit_unavailable",
                  "note=\"this kernel has no PIDFD_INFO_EXIT (Linux 6.15+): how a process "
                  "kvcoordd did not start ended is told only when its zombie is seen; else "
                  "'exit status is not known'\"");
    struct stat ns;
    pw->self_pid_ns = stat("/proc/self/ns/pid", &ns) == 0 ? (uint64_t)ns.st_ino : 0;
    if (!err && (pw->epfd = epoll_create1(EPOLL_CLOEXEC)) < 0)
        err = errno;
    if (!err) {
        /* Before the daemon serves: processes that died while it was down
         * are reaped (their ranks withdrawn) before the first lookup. */
        procs_check(pw, 1);
        look_at_segment(pw);
    }
    if (!err && wake_thread_start(&pw->efd, &pw->thread, waker_main, pw))
        err = errno;
    if (!err) {
        pw->thread_ok = 1;
        struct epoll_event ev = {.events = EPOLLIN, .data.u64 = POKE_TAG};
        if (epoll_ctl(pw->epfd, EPOLL_CTL_ADD, pw->efd, &ev))
            err = errno;
    }
    if (!err && (err = pthread_create(&pw->watcher, NULL, watcher_main, pw)) == 0)
        pw->watcher_ok = 1;
    if (err) {
        proc_watch_stop(pw);
        errno = err;
        return -1;
    }
    *out = pw;
    return 0;
}

void proc_watch_stop(struct proc_watch *pw)
{
    if (!pw)
        return;
    kvc_proc_watch_beat(pw->seg, 0); /* readers go back to /proc */
    atomic_store(&pw->stop, 1);
    if (pw->efd >= 0)
        wake_loop(pw->efd);
    if (pw->watcher_ok)
        pthread_join(pw->watcher, NULL);
    if (pw->thread_ok)
        pthread_join(pw->thread, NULL);
    if (pw->efd >= 0)
        close(pw->efd);
    if (pw->epfd >= 0)
        close(pw->epfd);
    for (uint32_t i = 0; i < pw->cap; i++)
        if (pw->w[i].pid)
            watch_free(&pw->w[i]);
    for (size_t i = 0; i < pw->npre; i++)
        if (pw->pre[i].fd >= 0)
            close(pw->pre[i].fd);
    free(pw->pre);
    for (size_t i = 0; i < pw->nadopt; i++)
        close(pw->adopt[i].fd);
    free(pw->adopt);
    free(pw->tlist);
    free(pw->known);
    pthread_mutex_destroy(&pw->mu);
    free(pw->w);
    free(pw->list);
    free(pw);
}
