/*
 * rank_watch.h - wakes kvcoordd's event loop when the rank table changes,
 * for parked long-poll lookups (wait_ms).
 *
 * A helper thread sleeps in kvc_rank_wait_change() (the segment's shared
 * futex: no polling) and on every change writes to an eventfd that the
 * loop reads on its ring; the loop then re-checks its parked lookups and
 * logs the entries that changed (seg_events.h).  It always waits, parked
 * lookups or not, so every registration and withdrawal is logged promptly.
 *
 * No lost wake-up: after each change the thread reads the new epoch
 * *before* writing the eventfd, so a change either precedes the loop's
 * re-check or bumps the epoch past what the thread waits on (the thread
 * starts before any lookup reads its epoch, so it needs no epoch from the
 * lookups it wakes).
 */
#ifndef KVC_RANK_WATCH_H
#define KVC_RANK_WATCH_H

#include <stdint.h>

#include "kvcoord/kvcoord.h"

struct rank_watch;

/* Start the thread.  *efd receives the eventfd to read (owned by the
 * watch).  Returns 0, or -1 with errno set. */
int rank_watch_start(struct rank_watch **out, kvc_segment *seg, int *efd);

/* Stop and join the thread, close the eventfd, free w (NULL ignored). */
void rank_watch_stop(struct rank_watch *w);

#endif /* KVC_RANK_WATCH_H */
