/*
 * proc_watch.h - kvcoordd's segment maintenance, off the event loop: the
 * attached processes are watched and the dead ones reaped, rooms past
 * their TTL swept, what changed in the segment logged (seg_events.h), the
 * lock-taking figures of GET /metrics kept warm (metrics.h) and the
 * segment file watched (a timer tick).  All of it may wait for a segment
 * lock (up to the segment's lock timeout), so none of it runs on the
 * io_uring loop's thread: two threads of its own do it, and the loop only
 * pokes them.  It neither includes nor calls the HTTP server.
 */
#ifndef KVC_PROC_WATCH_H
#define KVC_PROC_WATCH_H

#include "kvcoord/kvcoord.h"

struct metrics;
struct seg_events;
struct seg_watch;
struct proc_watch;

/* What the watch looks after.  seg, events, file and metrics (each but seg
 * may be NULL) must outlive it; events and file are used from its thread
 * only.  When the segment file check (seg_watch_check) finds the segment
 * can no longer be served, the process exits with status 1 (seg_watch.h
 * says why that, and not a restore). */
struct proc_watch_config {
    kvc_segment *seg;
    struct seg_events *events;
    struct seg_watch *file;
    struct metrics *metrics;
    uint64_t pd_room_interval_ms; /* PD room -> DP rank entry lifetime; 0: sglang's 120 s */
};

/* Run the first scan on the calling thread (processes that died while the
 * daemon was down are reaped, so no lookup hands out their ranks; the live
 * ones are watched), then start the threads.  Returns 0, or -1 with errno
 * set (nothing left running). */
int proc_watch_start(struct proc_watch **out, const struct proc_watch_config *cfg);

/* Look at the segment now rather than at the next tick: the process table
 * (a registration may come with a newly attached process), the rank table
 * and failure records (to log them).  Any thread; never blocks. */
void proc_watch_poke(struct proc_watch *pw);

/* Stop and join the threads, close every descriptor, free pw (NULL
 * ignored).  Waits for a reap in progress (bounded by the lock timeout). */
void proc_watch_stop(struct proc_watch *pw);

/* Watch a process that is not attached to the segment but owns what it
 * registered over HTTP (the peer of a PUT /route, proc_sockets.h): a pidfd is
 * opened now, while it is alive, so that when it ends its exit status is
 * known (PIDFD_INFO_EXIT, Linux 6.15+) and told (kvc_proc_exit_note()) to
 * the reap of its entries, which then runs at once.  Any thread; a
 * process already watched, gone, or whose pid names another process now
 * (start differs) is not added. */
void proc_watch_adopt(struct proc_watch *pw, int32_t pid, uint64_t start);

#endif /* KVC_PROC_WATCH_H */
