/*
 * seg_watch.h - kvcoordd watches its segment file (/dev/shm/NAME) under
 * it: every attached process maps one file of one size, so a change made
 * behind their backs either is undone or ends the daemon, never ignored.
 *
 *   - re-moded (chmod) or extended (truncate -s bigger): undone at once
 *     (fchmod back, ftruncate back to the mapped size: nobody maps the
 *     extra bytes) and logged at error naming the change;
 *   - truncated (shorter than the mapping), unlinked, or replaced (another
 *     file under the name): cannot be undone - the lost pages are gone, an
 *     unlinked or renamed-over file has no name left to give back, and a
 *     new file would split the attached processes between two tables - so
 *     the check reports it and kvcoordd exits with status 1 after one
 *     error line naming the change (proc_watch.c), without touching the
 *     mapping again.  Its supervisor restarts it on a new segment; the
 *     workers attached to the old file must be restarted too.
 *
 * The check runs every second on the watch thread (proc_watch.h).  A
 * truncation can still be hit between two checks: kvcoordd's SIGBUS
 * handler (kvcoordd.c) then logs the same kind of line and exits 1.
 */
#ifndef KVC_SEG_WATCH_H
#define KVC_SEG_WATCH_H

#include <stddef.h>

#include "kvcoord/kvcoord.h"

struct seg_watch;

/* Watch /dev/shm/name, the file seg maps: its identity (device, inode),
 * size (the segment's total_bytes) and mode are taken now.  Returns 0, or
 * -1 with a message in err (errcap bytes). */
int seg_watch_open(struct seg_watch **out, kvc_segment *seg, const char *name, char *err,
                   size_t errcap);

/* Compare the file with what was taken.  Returns 0 (unchanged), 1 (a mode
 * or size change was undone; logged here at error), or -1 with what
 * changed in msg (cap bytes) when the segment can no longer be served. */
int seg_watch_check(struct seg_watch *w, char *msg, size_t cap);

void seg_watch_close(struct seg_watch *w); /* NULL ignored */

#endif /* KVC_SEG_WATCH_H */
