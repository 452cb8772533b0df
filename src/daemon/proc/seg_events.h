/*
 * seg_events.h - kvcoordd's log of what happens in the segment, whoever
 * did it: registrations and withdrawals (over HTTP, by workers through
 * libkvcoord, by a reap), lock recoveries and failure records.  Each is
 * logged once, at info (recoveries and failures at warn).
 *
 * The library never logs, so the daemon learns of these by comparing:
 *  - the rank table, by generation, whenever its epoch moved (the rank
 *    watch wakes the loop on every change; the 1 s sweep checks too);
 *  - kvc_segment_stat()'s lock_recoveries and failures_total, after each
 *    mutating request, each reap and on the 1 s sweep; new failure records
 *    come from kvc_failures_recent(), oldest first.
 * Two changes of one rank between two looks are one line (the newer
 * generation).  Everything runs on the event loop's thread.
 */
#ifndef KVC_SEG_EVENTS_H
#define KVC_SEG_EVENTS_H

#include "kvcoord/kvcoord.h"

struct seg_events;

/* Take the segment's current state as the baseline (nothing is logged for
 * it).  Returns 0, or -1 (out of memory, or the segment unreadable). */
int seg_events_init(struct seg_events **out, kvc_segment *seg);
void seg_events_free(struct seg_events *e);

/* Log the rank entries that changed, if the rank table's epoch moved. */
void seg_events_ranks(struct seg_events *e);

/* Log new lock recoveries and failure records. */
void seg_events_check(struct seg_events *e);

#endif /* KVC_SEG_EVENTS_H */
