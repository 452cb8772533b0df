/*
 * inspect_internal.h - what the files of the check (kvc__check) share, and
 * nothing else uses: inspect_check.c (reporting, the header, the locks, the
 * process table, kvc__check itself), inspect_ranks.c (the rank tables and
 * the arena, with the seqlock peeks of rank descriptors) and
 * inspect_rooms.c (the room stripes and the failure ring).  inspect.c holds
 * the views that are not the check (raw headers, lock probes, rebuild).
 *
 * Lock rule of the check: each table is read under its lock, taken through
 * kvc__ck_take (one lock at a time, given back with kvc__ck_give before the
 * next is taken), unless the lock's owner died (then the state is read as
 * it left it, the lock left for `repair`) or a live owner keeps it past the
 * timeout (then only what is safe to read without it is checked).
 */
#ifndef KVC_INSPECT_INTERNAL_H
#define KVC_INSPECT_INTERNAL_H

#include "inspect.h"
#include "internal.h"

/* One run of the check: where findings go and the worst so far. */
typedef struct kvc__ck {
    kvc_segment *seg;
    kvc_check_fn fn;
    void *ctx;
    kvc_check_stats *st;
    kvc_severity worst;
} kvc__ck;

/* Problems of one invariant: the first few (MAX_REPORTS, inspect_check.c)
 * are reported, the rest counted; none at all gives one "ok" finding. */
typedef struct kvc__tally {
    const char *id;
    unsigned n;
    kvc_severity sev;
} kvc__tally;

/* How a table was read: under its lock, as its dead owner left it, or
 * without the lock a live owner keeps. */
enum kvc__access { KVC__LOCKED, KVC__UNLOCKED_DEAD, KVC__UNLOCKED_BUSY };

/* ---- inspect_check.c ----------------------------------------------------- */

/* One finding of severity sev under id. */
__attribute__((format(printf, 4, 5))) void kvc__ck_say(kvc__ck *ck, kvc_severity sev,
                                                       const char *id, const char *fmt, ...);
/* One problem of tally t (reported while t has reported fewer than
 * MAX_REPORTS, counted always). */
__attribute__((format(printf, 4, 5))) void kvc__ck_problem(kvc__ck *ck, kvc__tally *t,
                                                           kvc_severity sev, const char *fmt, ...);
/* Close a tally: "ok" with the message when nothing was found. */
__attribute__((format(printf, 3, 4))) void kvc__ck_settle(kvc__ck *ck, kvc__tally *t,
                                                          const char *fmt, ...);
/* Decide how to read the table under lock id, report the lock (quiet: no
 * finding when it is fine), and take it when its owner is not dead. */
enum kvc__access kvc__ck_take_q(kvc__ck *ck, int id, int quiet);
enum kvc__access kvc__ck_take(kvc__ck *ck, int id);
/* Give back what kvc__ck_take took (nothing unless KVC__LOCKED). */
void kvc__ck_give(kvc__ck *ck, int id, enum kvc__access a);

/* ---- inspect_ranks.c, inspect_rooms.c: the tables' checks ---------------- */

/* The rank tables and the arena, under the ranks lock. */
void kvc__check_ranks(kvc__ck *ck);
/* The room stripes (each under its lock, in turn) and the failure ring. */
void kvc__check_rooms(kvc__ck *ck);
/* The PD bootstrap region (inspect_pd.c): under the PD lock, then its rank
 * table through the lock-free readers. */
void kvc__check_pd(kvc__ck *ck);

#endif
