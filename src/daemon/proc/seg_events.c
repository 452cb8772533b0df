/*
 * seg_events.c - the segment's event log; see seg_events.h.
 */
#include "seg_events.h"

#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "log.h"

#define STAT_TRIES 3 /* re-reads when failures land while the ring is read */

struct seg_events {
    kvc_segment *seg;
    uint32_t max_ranks;
    kvc_rank_info *list; /* max_ranks entries */
    uint64_t *gen;       /* last generation logged, by rank */
    int32_t *pid;        /* its registrant then (a local registration), else 0 */
    uint32_t rank_epoch;
    int ranks_ok;           /* gen[] matches rank_epoch */
    uint64_t recoveries;    /* lock_recoveries last seen */
    uint64_t failures;      /* failures_total last seen */
    kvc_failure_info *ring; /* KVC_FAILURE_RING */
};

/* Read the rank table into e->list; returns the entry count or -1. */
static long ranks_read(struct seg_events *e)
{
    size_t count = 0;
    kvc_err err = kvc_rank_list(e->seg, e->list, e->max_ranks, &count, 1);
    if (err) {
        log_event(LOG_WARN, "rank_list_failed", "err=\"%s\"", kvc_last_error());
        return -1;
    }
    return (long)(count < e->max_ranks ? count : e->max_ranks);
}

static void log_rank(const kvc_rank_info *ri)
{
    if (ri->state == KVC_RANK_REGISTERED && ri->origin[0])
        log_event(LOG_INFO, "mirror",
                  "rank=%u generation=%" PRIu64 " session_id=\"%s\" origin=%s "
                  "origin_generation=%" PRIu64 " entries=%u",
                  ri->rank, ri->generation, ri->session_id, ri->origin, ri->origin_generation,
                  ri->entries);
    else if (ri->state == KVC_RANK_REGISTERED)
        log_event(LOG_INFO, "register",
                  "rank=%u generation=%" PRIu64 " session_id=\"%s\" "
                  "pid=%d entries=%u",
                  ri->rank, ri->generation, ri->session_id, (int)ri->pid, ri->entries);
    /* Two formats, not an optional "%s%s" tail: log_event() quotes an empty
     * unquoted value (""), which would leave stray quotes on the line. */
    else if (ri->state == KVC_RANK_WITHDRAWN && ri->origin[0])
        log_event(LOG_INFO, "withdraw",
                  "rank=%u generation=%" PRIu64 " pid=%d note=\"%s\" origin=%s", ri->rank,
                  ri->generation, (int)ri->pid, ri->note, ri->origin);
    else if (ri->state == KVC_RANK_WITHDRAWN)
        log_event(LOG_INFO, "withdraw", "rank=%u generation=%" PRIu64 " pid=%d note=\"%s\"",
                  ri->rank, ri->generation, (int)ri->pid, ri->note);
}

/* A local registration by another process over one whose registrant still
 * runs: the library replaces it silently (last writer wins) and withdraws
 * the rank when the new registrant ends, while the first one runs on; say
 * so, naming both.  (An HTTP registration says so itself, as it is made:
 * http_register_replaces_live.)  A pid reused since is a false alarm in a
 * log line, never more. */
static void replaced(struct seg_events *e, const kvc_rank_info *ri)
{
    int32_t was = e->pid[ri->rank], self = (int32_t)getpid();
    int local = ri->state == KVC_RANK_REGISTERED && !ri->origin[0];
    e->pid[ri->rank] = local ? ri->pid : 0;
    if (!local || was <= 0 || was == ri->pid || was == self || ri->pid == self ||
        (kill(was, 0) != 0 && errno != EPERM))
        return;
    log_event(LOG_WARN, "rank_replaced",
              "rank=%u generation=%" PRIu64 " pid=%d pid_was=%d note=\"rank %u, registered by "
              "process %d which still runs, was replaced by process %d: the rank is withdrawn "
              "when process %d ends, and process %d's registration is not restored\"",
              ri->rank, ri->generation, (int)ri->pid, (int)was, ri->rank, (int)was, (int)ri->pid,
              (int)ri->pid, (int)was);
}

void seg_events_ranks(struct seg_events *e)
{
    if (!e)
        return;
    /* The epoch is read before the table: a change after it is seen next time. */
    uint32_t epoch = kvc_rank_epoch(e->seg);
    if (e->ranks_ok && epoch == e->rank_epoch)
        return;
    long n = ranks_read(e);
    if (n < 0) {
        e->ranks_ok = 0; /* try again on the next look */
        return;
    }
    for (long i = 0; i < n; i++) {
        const kvc_rank_info *ri = &e->list[i];
        if (ri->rank >= e->max_ranks || e->gen[ri->rank] == ri->generation)
            continue;
        e->gen[ri->rank] = ri->generation;
        log_rank(ri);
        replaced(e, ri);
    }
    e->rank_epoch = epoch;
    e->ranks_ok = 1;
}

static void log_failure(const kvc_failure_info *f)
{
    log_event(LOG_WARN, "failure",
              "room=%" PRIu64 " origin_rank=%u origin_pid=%d code=%d "
              "reason=\"%s\"",
              f->room, f->origin_rank, (int)f->origin_pid, (int)f->code, f->reason);
}

/* Log the failure records after the first e->failures ones, given
 * total; returns 0, or -1 (nothing logged) when total moved while the ring
 * was read, unless last. */
static int failures_log(struct seg_events *e, uint64_t total, int last)
{
    uint64_t delta = total - e->failures;
    size_t want = delta > KVC_FAILURE_RING ? KVC_FAILURE_RING : (size_t)delta, count = 0;
    if (kvc_failures_recent(e->seg, e->ring, want, &count)) {
        log_event(LOG_WARN, "failures_read_failed", "err=\"%s\"", kvc_last_error());
        return 0; /* counted as seen: a busy ring must not repeat them later */
    }
    kvc_segment_info si;
    if (!last && kvc_segment_stat(e->seg, &si) == KVC_OK && si.failures_total != total)
        return -1; /* newer records pushed some of ours out of the read */
    if (delta > want)
        log_event(LOG_WARN, "failures_dropped", "count=%" PRIu64, delta - want);
    for (size_t i = count; i-- > 0;) /* oldest first */
        log_failure(&e->ring[i]);
    return 0;
}

void seg_events_check(struct seg_events *e)
{
    if (!e)
        return;
    kvc_segment_info si;
    for (int tries = 0; tries < STAT_TRIES; tries++) {
        if (kvc_segment_stat(e->seg, &si) != KVC_OK)
            return;
        if (si.lock_recoveries != e->recoveries) {
            log_event(LOG_WARN, "lock_recovered", "count=%" PRIu64 " total=%" PRIu64,
                      si.lock_recoveries - e->recoveries, si.lock_recoveries);
            e->recoveries = si.lock_recoveries;
        }
        if (si.failures_total == e->failures)
            return;
        if (si.failures_total < e->failures ||
            failures_log(e, si.failures_total, tries == STAT_TRIES - 1) == 0) {
            e->failures = si.failures_total;
            return;
        }
    }
}

int seg_events_init(struct seg_events **out, kvc_segment *seg)
{
    kvc_segment_info si;
    if (kvc_segment_stat(seg, &si))
        return -1;
    struct seg_events *e = calloc(1, sizeof *e);
    if (!e)
        return -1;
    e->seg = seg;
    e->max_ranks = si.max_ranks ? si.max_ranks : 1;
    e->list = calloc(e->max_ranks, sizeof *e->list);
    e->gen = calloc(e->max_ranks, sizeof *e->gen);
    e->pid = calloc(e->max_ranks, sizeof *e->pid);
    e->ring = calloc(KVC_FAILURE_RING, sizeof *e->ring);
    if (!e->list || !e->gen || !e->pid || !e->ring) {
        seg_events_free(e);
        return -1;
    }
    e->recoveries = si.lock_recoveries;
    e->failures = si.failures_total;
    e->rank_epoch = kvc_rank_epoch(seg);
    long n = ranks_read(e);
    for (long i = 0; i < n; i++)
        if (e->list[i].rank < e->max_ranks) {
            e->gen[e->list[i].rank] = e->list[i].generation;
            e->pid[e->list[i].rank] =
                e->list[i].state == KVC_RANK_REGISTERED && !e->list[i].origin[0] ? e->list[i].pid
                                                                                 : 0;
        }
    e->ranks_ok = n >= 0;
    *out = e;
    return 0;
}

void seg_events_free(struct seg_events *e)
{
    if (!e)
        return;
    free(e->list);
    free(e->gen);
    free(e->pid);
    free(e->ring);
    free(e);
}
