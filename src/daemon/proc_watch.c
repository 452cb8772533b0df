/*
 * proc_watch.c - kvcoordd's dead-process detection.
 *
 * Every process attached to the segment (the library's process table) is
 * watched through a pidfd: an IORING_OP_POLL_ADD of POLLIN on it completes
 * when the process exits (POLLIN is raised at exit, while it is still a
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
 * hands the descriptors over and writes an eventfd the loop reads on its
 * ring; the loop's scan then watches those processes with the descriptors
 * already open.  The server's 1 s sweep and every mutating request check
 * the epoch too, as a safety net.  A scan reads the small table, opens a pidfd for each (pid, start time) not
 * watched yet, and reaps at once an entry whose process is already gone
 * (one that died while the daemon was down, or before the scan).  A
 * process that detached cleanly (kvc_close) leaves the table: its watch is
 * cancelled, and its registrations stay, as the library documents.
 *
 * How a process ended comes from ioctl(PIDFD_GET_INFO) with
 * PIDFD_INFO_EXIT (Linux >= 6.15; the kernel fills it once the process is
 * reaped by its parent), else from its zombie's /proc/PID/stat, else the
 * library says "exit status unknown".
 *
 * The same tick sweeps rooms past their TTL (kvc_room_sweep) every few
 * seconds.  The daemon never watches itself.
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
#include <sys/syscall.h>
#include <unistd.h>

#include "http_server_int.h"
#include "log.h"
#include "metrics.h"
#include "wake.h"

#define ROOM_SWEEP_TICKS 5 /* kvc_room_sweep every 5 sweeps of 1 s */
/* Bound on one futex sleep of the helper thread, so a stop request is seen
 * within it. */
#define WAKER_SLICE_MS 250

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
    int32_t pid; /* 0: slot free */
    int32_t rank;
    uint64_t start;
    int pidfd;
    unsigned seen : 1;       /* found in the table by the current scan */
    unsigned cancelling : 1; /* left the table: its poll is being cancelled */
};

/* A pidfd opened by the helper thread for (pid, start). */
struct preopen {
    int32_t pid;
    uint64_t start;
    int fd;
};

struct proc_watch {
    kvc_segment *seg;
    int32_t self_pid;
    uint64_t self_start;
    struct watched *w; /* cap slots; the poll of slot i has user_data slot i */
    uint32_t cap;
    kvc_proc_info *list; /* kvc_proc_list() buffer */
    size_t list_cap;
    uint32_t epoch; /* process table epoch of the last scan */
    int scanned;    /* a scan ran */
    unsigned ticks;
    struct metrics *metrics;
    /* the helper thread waking the loop on process table changes */
    int efd;
    pthread_t thread;
    int thread_ok;
    atomic_int stop;
    pthread_mutex_t mu;  /* guards pre/npre */
    struct preopen *pre; /* pidfds the thread opened, for the loop */
    size_t npre, pre_cap;
    /* the thread's own: its table buffer and the processes it has seen */
    kvc_proc_info *tlist;
    size_t tlist_cap;
    struct preopen *known; /* fd unused: (pid, start) seen in the table */
    size_t nknown, known_cap;
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
 * if it is one, else the library says "exit status unknown". */
static void reap(struct proc_watch *pw, int32_t pid, uint64_t start, int32_t rank, const char *how)
{
    size_t rooms = 0, ranks = 0;
    char st, zombie_how[96];
    uint64_t st_start;
    int code;
    if (!how && read_stat(pid, &st, &st_start, &code) == 0 && st_start == start &&
        (st == 'Z' || st == 'X') && code >= 0)
        how = kvc_wait_status_text(code, zombie_how, sizeof zombie_how);
    kvc_err e = kvc_proc_reap(pw->seg, pid, start, how, &rooms, &ranks);
    if (e) {
        log_event(LOG_ERROR, "proc_reap_failed", "pid=%d rank=%d err=\"%s\"", (int)pid, (int)rank,
                  kvc_last_error());
        pw->scanned = 0; /* try again on the next check */
        return;
    }
    if (pw->metrics)
        metrics_dead_processes(pw->metrics, 1);
    log_event(LOG_INFO, "proc_dead",
              "rank=%d pid=%d how=\"%s\" rooms_failed=%zu "
              "ranks_withdrawn=%zu",
              (int)rank, (int)pid, how ? how : "exit status unknown", rooms, ranks);
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
    pw->w = w;
    struct watched *slot = &w[pw->cap];
    pw->cap = cap;
    return slot;
}

static void watch_free(struct watched *w)
{
    if (w->pidfd >= 0)
        close(w->pidfd);
    memset(w, 0, sizeof *w);
    w->pidfd = -1;
}

/* Start watching a table entry (fd: the pidfd the helper thread opened for
 * it, or -1 to open one now); an entry whose process turns out to be gone
 * already, with no pidfd, is reaped at once. */
static void watch_add(struct server *s, const kvc_proc_info *p, int fd)
{
    struct proc_watch *pw = s->procs;
    int checked = fd >= 0; /* the helper thread checked its pidfd's start time */
    if (fd < 0)
        fd = (int)syscall(SYS_pidfd_open, (pid_t)p->pid, 0);
    if (fd < 0) {
        if (errno == ESRCH) { /* gone since the table was read */
            reap(pw, p->pid, p->start, p->rank, NULL);
        } else {
            log_event(LOG_WARN, "pidfd_open_failed", "pid=%d err=\"%s\"", (int)p->pid,
                      strerror(errno));
            pw->scanned = 0; /* try again on the next check */
        }
        return;
    }
    fcntl(fd, F_SETFD, FD_CLOEXEC);
    /* The pid may have been reused between the table read and the open:
     * the pidfd is ours to keep only if the process it names (alive now,
     * or a zombie) has the entry's start time. */
    char st;
    uint64_t start;
    int code;
    if (!checked && (read_stat(p->pid, &st, &start, &code) || start != p->start)) {
        close(fd);
        reap(pw, p->pid, p->start, p->rank, NULL);
        return;
    }
    struct watched *w = watch_alloc(pw);
    struct io_uring_sqe *sqe = w ? op_sqe_slot(s, OP_PIDFD, (uint32_t)(w - pw->w), 0) : NULL;
    if (!sqe) {
        close(fd);
        log_event(LOG_WARN, "proc_watch_failed", "pid=%d err=\"%s\"", (int)p->pid,
                  w ? "no SQE" : "out of memory");
        pw->scanned = 0;
        return;
    }
    *w =
        (struct watched){.pid = p->pid, .rank = p->rank, .start = p->start, .pidfd = fd, .seen = 1};
    io_uring_prep_poll_add(sqe, fd, POLLIN);
    log_event(LOG_DEBUG, "proc_watch", "pid=%d rank=%d role=%d", (int)p->pid, (int)p->rank,
              (int)p->role);
}

/* A process left the table while alive (kvc_close): stop watching it.  The
 * poll's completion (-ECANCELED, or its exit if that raced) frees the slot. */
static void watch_cancel(struct server *s, struct watched *w)
{
    struct io_uring_sqe *sqe = op_sqe(s, OP_IGNORE, NULL, 0);
    if (!sqe)
        return; /* the next scan tries again */
    io_uring_prep_cancel64(sqe, ud_pack(OP_PIDFD, (uint32_t)(w - s->procs->w), 0), 0);
    w->cancelling = 1;
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

void procs_check(struct server *s, int force)
{
    struct proc_watch *pw = s->procs;
    if (!pw || s->stopping)
        return;
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
    for (long i = 0; i < n; i++) {
        const kvc_proc_info *p = &pw->list[i];
        if (is_self(pw, p))
            continue;
        struct watched *w = watch_find(pw, p->pid, p->start);
        if (w)
            w->seen = 1, w->rank = p->rank;
        else if (!p->alive && !preopen_has(pre, npre, p))
            reap(pw, p->pid, p->start, p->rank, NULL);
        else /* a dead one with a pidfd: watched, its poll fires at once */
            watch_add(s, p, preopen_take(pre, npre, p));
    }
    for (size_t i = 0; i < npre; i++)
        if (pre[i].fd >= 0)
            close(pre[i].fd);
    free(pre);
    if (n == 0 && !pw->scanned)
        return;
    for (uint32_t i = 0; i < pw->cap; i++) {
        struct watched *w = &pw->w[i];
        if (w->pid && !w->seen && !w->cancelling)
            watch_cancel(s, w);
    }
}

void procs_complete(struct server *s, uint32_t slot, int res)
{
    struct proc_watch *pw = s->procs;
    if (!pw || slot >= pw->cap || !pw->w[slot].pid)
        return;
    struct watched *w = &pw->w[slot];
    if (res < 0 || s->stopping) {
        if (res != -ECANCELED)
            log_event(s->stopping ? LOG_DEBUG : LOG_WARN, "proc_watch_ended", "pid=%d res=%d",
                      (int)w->pid, res);
        if (!w->cancelling)
            pw->scanned = 0; /* watch it again if it is still there */
        watch_free(w);
        return;
    }
    /* Exited.  Reap it only if it is still in the table: one that detached
     * first (kvc_close) keeps its registrations. */
    long n = table_read(pw);
    const kvc_proc_info *entry = n >= 0 ? table_find(pw, (size_t)n, w->pid, w->start) : NULL;
    if (entry) {
        w->rank = entry->rank; /* it may have registered since it attached */
        char how[96];
        int status, from = exit_status(w->pidfd, w->pid, w->start, &status);
        log_event(LOG_DEBUG, "proc_exit", "pid=%d from=%s", (int)w->pid,
                  from == 1   ? "pidfd_info"
                  : from == 2 ? "zombie"
                              : "unknown");
        if (from > 0)
            reap(pw, w->pid, w->start, w->rank, kvc_wait_status_text(status, how, sizeof how));
        else
            reap(pw, w->pid, w->start, w->rank, NULL);
    }
    watch_free(w);
}

void procs_tick(struct server *s)
{
    struct proc_watch *pw = s->procs;
    if (!pw || s->stopping)
        return;
    procs_check(s, 0);
    if (++pw->ticks % ROOM_SWEEP_TICKS)
        return;
    size_t reclaimed = 0;
    if (kvc_room_sweep(pw->seg, &reclaimed))
        log_event(LOG_WARN, "room_sweep_failed", "err=\"%s\"", kvc_last_error());
    else if (reclaimed)
        log_event(LOG_INFO, "room_sweep", "reclaimed=%zu", reclaimed);
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
        if (!keep_fds || !p->alive || is_self(pw, p) || preopen_find(pw->known, pw->nknown, p))
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

int procs_init(struct server *s, kvc_segment *seg)
{
    struct proc_watch *pw = calloc(1, sizeof *pw);
    if (!pw)
        return -1;
    pw->seg = seg;
    pw->metrics = s->metrics;
    pw->self_pid = (int32_t)getpid();
    pw->efd = -1;
    pthread_mutex_init(&pw->mu, NULL);
    s->procs = pw; /* procs_free() undoes a partial start */
    char st;
    int code;
    if (read_stat(pw->self_pid, &st, &pw->self_start, &code))
        return -1;
    if (wake_thread_start(&pw->efd, &pw->thread, waker_main, pw))
        return -1;
    pw->thread_ok = 1;
    s->procs_fd = pw->efd;
    return 0;
}

void procs_free(struct server *s)
{
    struct proc_watch *pw = s->procs;
    if (!pw)
        return;
    if (pw->thread_ok) {
        atomic_store(&pw->stop, 1);
        pthread_join(pw->thread, NULL);
    }
    if (pw->efd >= 0)
        close(pw->efd);
    s->procs_fd = -1;
    for (uint32_t i = 0; i < pw->cap; i++)
        if (pw->w[i].pid)
            watch_free(&pw->w[i]);
    for (size_t i = 0; i < pw->npre; i++)
        if (pw->pre[i].fd >= 0)
            close(pw->pre[i].fd);
    free(pw->pre);
    free(pw->tlist);
    free(pw->known);
    pthread_mutex_destroy(&pw->mu);
    free(pw->w);
    free(pw->list);
    free(pw);
    s->procs = NULL;
}
