/*
 * pd_upkeep.h - kvcoordd's upkeep of the PD bootstrap tables
 * (kvcoord/pd.h): entries of prefill ranks whose registering process
 * ended are withdrawn, and room -> DP rank entries expire by sglang's rule
 * (every interval, those older than the interval go).  Run by the process
 * watch's thread (proc_watch.c), which may wait for segment locks.
 */
#ifndef KVC_PD_UPKEEP_H
#define KVC_PD_UPKEEP_H

#include <stdint.h>

#include "kvcoord/kvcoord.h"

/* sglang's SGLANG_DISAGGREGATION_BOOTSTRAP_ENTRY_CLEANUP_INTERVAL default. */
#define PD_ROOM_INTERVAL_DEFAULT_S 120

struct pd_upkeep {
    uint64_t interval_ms;   /* room entry lifetime and sweep period; 0: the default */
    uint64_t next_sweep_ms; /* CLOCK_MONOTONIC ms of the next room sweep; 0: not yet set */
};

/* Withdraw dead registrants' entries (logged), and sweep the room map when
 * its interval has passed.  Called every watch tick and after a reap. */
void pd_upkeep_run(struct pd_upkeep *u, kvc_segment *seg);

#endif /* KVC_PD_UPKEEP_H */
