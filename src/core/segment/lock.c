/*
 * lock.c - the segment's robust process-shared mutexes.
 *
 * Every lock path goes through kvc__lock() (or kvc__lock_spin, for the
 * room stripes: a held lock watched a bounded while first): a bounded
 * timed wait; on EOWNERDEAD the lock's recovery function repairs the
 * shared state the dead owner may have half-written, and only then is the
 * mutex marked consistent (LMDB's order: repair first, then
 * pthread_mutex_consistent).  The recovery functions are the tables': each
 * registers its own on the handle (kvc__lock_register), so this file
 * depends on no table.
 * ENOTRECOVERABLE is reported, never spun on.
 *
 * The wait's deadline is on CLOCK_MONOTONIC (pthread_mutex_clocklock, glibc
 * 2.30+): stepping the real-time clock neither fails every locker at once
 * nor makes a wait unbounded.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "internal.h"

_Static_assert(KVC_ROOM_STRIPES == 64, "one name per room stripe below");
static const char *const lock_names[KVC_LOCK_COUNT] = {
    "ranks",    "procs",    "rooms.0",  "rooms.1",  "rooms.2",  "rooms.3",  "rooms.4",  "rooms.5",
    "rooms.6",  "rooms.7",  "rooms.8",  "rooms.9",  "rooms.10", "rooms.11", "rooms.12", "rooms.13",
    "rooms.14", "rooms.15", "rooms.16", "rooms.17", "rooms.18", "rooms.19", "rooms.20", "rooms.21",
    "rooms.22", "rooms.23", "rooms.24", "rooms.25", "rooms.26", "rooms.27", "rooms.28", "rooms.29",
    "rooms.30", "rooms.31", "rooms.32", "rooms.33", "rooms.34", "rooms.35", "rooms.36", "rooms.37",
    "rooms.38", "rooms.39", "rooms.40", "rooms.41", "rooms.42", "rooms.43", "rooms.44", "rooms.45",
    "rooms.46", "rooms.47", "rooms.48", "rooms.49", "rooms.50", "rooms.51", "rooms.52", "rooms.53",
    "rooms.54", "rooms.55", "rooms.56", "rooms.57", "rooms.58", "rooms.59", "rooms.60", "rooms.61",
    "rooms.62", "rooms.63", "pd"};

const char *kvc__lock_name(int id)
{
    return id >= 0 && id < KVC_LOCK_COUNT ? lock_names[id] : "unknown";
}

kvc_lock *kvc__lock_ptr(kvc_segment *seg, int id)
{
    if (id < KVC_LOCK_HEADER_COUNT)
        return &seg->hdr->locks[id];
    if (id == KVC_LOCK_PD)
        return &seg->pd->lock;
    return &seg->stripes[id - KVC_LOCK_ROOMS].lock;
}

void kvc__lock_register(kvc_segment *seg, int id, kvc_recover_fn fn)
{
    if (id >= 0 && id < KVC_LOCK_COUNT)
        seg->recover[id] = fn;
}

void kvc__lock_recover(kvc_segment *seg, int id)
{
    if (id >= 0 && id < KVC_LOCK_COUNT && seg->recover[id])
        seg->recover[id](seg, id);
}

/* Advisory (diagnostics, messages): relaxed stores, which on x86-64 are
 * plain moves where the default seq_cst ones are locked exchanges, twice
 * per lock and twice per unlock of every room update. */
static void note_owner(kvc_segment *seg, kvc_lock *l)
{
    atomic_store_explicit(&l->owner_start, seg->start, memory_order_relaxed);
    atomic_store_explicit(&l->owner_pid, seg->pid, memory_order_relaxed);
}

/* EOWNERDEAD: repair first, then mark the mutex consistent. */
static kvc_err recovered(kvc_segment *seg, int id, kvc_lock *l)
{
    kvc__lock_recover(seg, id);
    atomic_fetch_add(&l->recoveries, 1);
    int c = pthread_mutex_consistent(&l->mutex);
    if (c != 0) {
        /* Still inconsistent: unlocking makes it ENOTRECOVERABLE for
         * everyone, which every later locker then reports. */
        pthread_mutex_unlock(&l->mutex);
        return kvc__fail(KVC_E_NOTRECOVERABLE,
                         "%s lock of segment %s: its owner died and "
                         "pthread_mutex_consistent failed: %s",
                         lock_names[id], seg->name, strerror(c));
    }
    note_owner(seg, l);
    return KVC_OK;
}

kvc_err kvc__lock(kvc_segment *seg, int id) { return kvc__lock_spin(seg, id, 0); }

kvc_err kvc__lock_spin(kvc_segment *seg, int id, int spins)
{
    /* Every change goes through a lock: none is written into a segment
     * that was discarded (the header's flag, always), unlinked or replaced
     * (one fstat: every time for the rank and process tables, whose writes
     * say what the node serves; at most every KVC__FILE_CHECK_WRITE_MS for
     * the per-request room updates, where a system call would triple the
     * cost of an update). */
    kvc_err e = kvc__seg_current(seg, id < KVC_LOCK_HEADER_COUNT ? 0 : KVC__FILE_CHECK_WRITE_MS);
    if (e)
        return e;
    kvc_lock *l = kvc__lock_ptr(seg, id);
    /* Uncontended: no clock read.  A trylock reports a dead owner too. */
    int r = pthread_mutex_trylock(&l->mutex);
    /* Held: watch it while its holder's mark is set (the holder clears it
     * just before unlocking), trying again whenever it is not. */
    for (int k = 0; r == EBUSY && k < spins; k++) {
        if (atomic_load_explicit(&l->owner_pid, memory_order_relaxed))
            kvc__spin_pause();
        else
            r = pthread_mutex_trylock(&l->mutex);
    }
    if (r == 0) {
        note_owner(seg, l);
        return KVC_OK;
    }
    if (r == EOWNERDEAD)
        return recovered(seg, id, l);
    if (r == ENOTRECOVERABLE)
        return kvc__fail(KVC_E_NOTRECOVERABLE, "%s lock of segment %s is not recoverable",
                         lock_names[id], seg->name);
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    ts.tv_sec += seg->lock_timeout_ms / 1000;
    ts.tv_nsec += (long)(seg->lock_timeout_ms % 1000) * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    r = pthread_mutex_clocklock(&l->mutex, CLOCK_MONOTONIC, &ts);
    if (r == 0) {
        note_owner(seg, l);
        return KVC_OK;
    }
    if (r == EOWNERDEAD)
        return recovered(seg, id, l);
    if (r == ETIMEDOUT)
        return kvc__fail(KVC_E_BUSY, "%s lock of segment %s held for over %u ms by pid %d",
                         kvc__lock_name(id), seg->name, seg->lock_timeout_ms,
                         (int)atomic_load(&l->owner_pid));
    if (r == ENOTRECOVERABLE)
        return kvc__fail(KVC_E_NOTRECOVERABLE, "%s lock of segment %s is not recoverable",
                         kvc__lock_name(id), seg->name);
    return kvc__fail(KVC_E_SYS, "%s lock of segment %s: pthread_mutex_clocklock: %s",
                     kvc__lock_name(id), seg->name, strerror(r));
}

void kvc__assert_fail(const char *what, const char *file, int line)
{
    fprintf(stderr, "libkvcoord: %s:%d: invariant failed: %s\n", file, line, what);
    abort();
}

bool kvc__lock_held(kvc_segment *seg, int id)
{
    kvc_lock *l = kvc__lock_ptr(seg, id);
    return atomic_load_explicit(&l->owner_pid, memory_order_relaxed) == seg->pid &&
           atomic_load_explicit(&l->owner_start, memory_order_relaxed) == seg->start;
}

void kvc__unlock(kvc_segment *seg, int id)
{
    kvc_lock *l = kvc__lock_ptr(seg, id);
    atomic_store_explicit(&l->owner_pid, 0, memory_order_relaxed);
    atomic_store_explicit(&l->owner_start, 0, memory_order_relaxed);
    pthread_mutex_unlock(&l->mutex);
}
