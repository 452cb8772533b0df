/*
 * lock.c - the segment's robust process-shared mutexes.
 *
 * Every lock path goes through kvc__lock(): a bounded timed wait; on
 * EOWNERDEAD the lock's recovery function repairs the shared state the dead
 * owner may have half-written, and only then is the mutex marked consistent
 * (LMDB's order: repair first, then pthread_mutex_consistent).  The
 * recovery functions are the tables': each registers its own on the handle
 * (kvc__lock_register), so this file depends on no table.
 * ENOTRECOVERABLE is reported, never spun on.
 *
 * The wait's deadline is on CLOCK_MONOTONIC (pthread_mutex_clocklock, glibc
 * 2.30+): stepping the real-time clock neither fails every locker at once
 * nor makes a wait unbounded.
 */
#include <errno.h>
#include <string.h>
#include <time.h>

#include "internal.h"

const char *kvc__lock_name(int id)
{
    static const char *const names[KVC_LOCK_COUNT] = {"ranks", "procs", "rooms"};
    return id >= 0 && id < KVC_LOCK_COUNT ? names[id] : "unknown";
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

static void note_owner(kvc_segment *seg, kvc_lock *l)
{
    atomic_store(&l->owner_start, seg->start);
    atomic_store(&l->owner_pid, seg->pid);
}

kvc_err kvc__lock(kvc_segment *seg, int id)
{
    kvc_lock *l = &seg->hdr->locks[id];
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    ts.tv_sec += seg->lock_timeout_ms / 1000;
    ts.tv_nsec += (long)(seg->lock_timeout_ms % 1000) * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    int r = pthread_mutex_clocklock(&l->mutex, CLOCK_MONOTONIC, &ts);
    if (r == 0) {
        note_owner(seg, l);
        return KVC_OK;
    }
    if (r == EOWNERDEAD) {
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
                             kvc__lock_name(id), seg->name, strerror(c));
        }
        note_owner(seg, l);
        return KVC_OK;
    }
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

void kvc__unlock(kvc_segment *seg, int id)
{
    kvc_lock *l = &seg->hdr->locks[id];
    atomic_store(&l->owner_pid, 0);
    atomic_store(&l->owner_start, 0);
    pthread_mutex_unlock(&l->mutex);
}
