/*
 * session.c - a process's session on a segment, from kvc_open() to its end.
 *
 * A session ends in one of two ways, and both are here: the process closes
 * its last handle (kvc_close), or it died and someone reaps it
 * (kvc_proc_reap).  Either way the rooms it still takes part in fail
 * (rooms.c), the ranks it served as a worker are withdrawn (ranks.c) and its
 * process entry goes (procs.c), each under its own table's lock, one after
 * the other.  This file is the only one that calls into several tables; no
 * table calls back into it.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "internal.h"

/* The handles this copy of the library has open, for its fork handler:
 * a child of fork() closes its copy of each one's liveness lock holder
 * (liveness.c), so it never keeps a parent that died "alive".  The count
 * of handles a process has on a segment lives in the segment's process
 * entry (procs.c), shared by every copy of the library in the process. */
static pthread_mutex_t handles_mu = PTHREAD_MUTEX_INITIALIZER;
static kvc_segment **handles;
static size_t nhandles, handles_cap;

/* Held across fork(): no handle of this copy is half attached in a child. */
static int32_t forking_pid;
static void fork_prepare(void)
{
    pthread_mutex_lock(&handles_mu);
    forking_pid = (int32_t)getpid();
}
static void fork_parent(void) { pthread_mutex_unlock(&handles_mu); }
static void fork_child(void)
{
    for (size_t i = 0; i < nhandles; i++) {
        kvc__liveness_forget_child(handles[i], handles[i]->proc_slot, forking_pid);
        atomic_store(&handles[i]->room_credit, 0); /* the parent's (rooms.c) */
        atomic_store(&handles[i]->forked, true);
    }
    pthread_mutex_unlock(&handles_mu);
}

static void handles_init(void) { pthread_atfork(fork_prepare, fork_parent, fork_child); }

static void handles_lock(void)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, handles_init);
    pthread_mutex_lock(&handles_mu);
}

/* Add (handles_mu held); false when out of memory. */
static bool handles_add(kvc_segment *seg)
{
    if (nhandles == handles_cap) {
        size_t cap = handles_cap ? handles_cap * 2 : 16;
        kvc_segment **v = realloc(handles, cap * sizeof *v);
        if (!v)
            return false;
        handles = v, handles_cap = cap;
    }
    handles[nhandles++] = seg;
    return true;
}

static void handles_remove(kvc_segment *seg)
{
    handles_lock();
    for (size_t i = 0; i < nhandles; i++)
        if (handles[i] == seg) {
            handles[i] = handles[--nhandles];
            break;
        }
    if (!nhandles) { /* nothing left for a library that is dlclose()d after */
        free(handles);
        handles = NULL;
        handles_cap = 0;
    }
    pthread_mutex_unlock(&handles_mu);
}

/* Record this process in the process table.  When the table is full, a
 * dead process's entry is reused only after it is reaped (its rooms failed,
 * its ranks withdrawn, its entry removed), so its ranks are never left
 * served by nobody.  Reaping takes the rooms and ranks locks, so it runs
 * with no lock held; another attacher may take the freed slot meanwhile:
 * try again (bounded). */
static kvc_err attach_proc(kvc_segment *seg, kvc_role role, int32_t rank)
{
    for (int attempt = 0;; attempt++) {
        int32_t dead_pid = 0;
        uint64_t dead_start = 0;
        kvc_err e = kvc__proc_attach(seg, role, rank, &dead_pid, &dead_start);
        if (e != KVC_E_FULL || !dead_pid || attempt >= 16)
            return e;
        if ((e = kvc_proc_reap(seg, dead_pid, dead_start, NULL, NULL, NULL)))
            return kvc__fail(e,
                             "process table of segment %s is full and the entry of dead "
                             "process %d could not be reaped: %s",
                             seg->name, (int)dead_pid, kvc_last_error());
    }
}

KVC_API kvc_err kvc_open(const kvc_options *opts, kvc_segment **out)
{
    KVC_ARG(opts);
    KVC_ARG(out);
    *out = NULL;
    if ((unsigned)opts->role > KVC_ROLE_CLIENT)
        return kvc__fail(KVC_E_INVAL, "kvc_open: role %d out of range 0..3 (kvc_role)",
                         (int)opts->role);
    if ((unsigned)opts->mode > KVC_OPEN_FRESH_FORCE)
        return kvc__fail(KVC_E_INVAL, "kvc_open: mode %d out of range 0..3 (kvc_open_mode)",
                         (int)opts->mode);
    if (opts->rank < -1)
        return kvc__fail(KVC_E_INVAL, "kvc_open: rank %d out of range (-1 for none)",
                         (int)opts->rank);
    const char *name = opts->name ? opts->name : "kvcoord-6789";
    kvc_err e = kvc_name_check(name);
    if (e)
        return e;
    kvc_segment *seg = calloc(1, sizeof *seg);
    if (!seg)
        return kvc__fail(KVC_E_SYS, "kvc_open: out of memory");
    snprintf(seg->name, sizeof seg->name, "%s", name);
    seg->fd = -1;
    seg->proc_slot = -1;
    seg->pid = (int32_t)getpid();
    seg->start = kvc__proc_start_self();
    kvc__self_identity(&seg->shown_pid, &seg->pid_ns, &seg->time_ns);
    seg->lock_timeout_ms = opts->lock_timeout_ms ? opts->lock_timeout_ms : 2000;
    seg->role = opts->role;
    /* Every table's lock recovery, before any lock of this handle is taken. */
    kvc__ranks_register(seg);
    kvc__procs_register(seg);
    kvc__rooms_register(seg);
    kvc__pd_register(seg);
    /* A worker serves the rank it registers (kvcoordd and clients register
     * on behalf of others): the process table says which. */
    if (opts->role == KVC_ROLE_WORKER)
        seg->serves_rank = kvc__proc_set_rank;
    e = kvc__segment_map(seg, opts);
    if (e) {
        kvc__segment_free(seg);
        return e;
    }
    /* Attached and listed under one hold of handles_mu, so that a fork
     * child sees either no entry of this handle or its holder. */
    handles_lock();
    if (opts->role != KVC_ROLE_NONE)
        e = attach_proc(seg, opts->role, opts->rank);
    if (!e && !handles_add(seg)) {
        int last = 0;
        uint32_t flags = 0;
        kvc__proc_release(seg, &last, &flags);
        if (last)
            kvc__proc_detach(seg);
        e = kvc__fail(KVC_E_SYS, "kvc_open: out of memory");
    }
    pthread_mutex_unlock(&handles_mu);
    if (e) {
        kvc__segment_free(seg);
        return e;
    }
    *out = seg;
    return KVC_OK;
}

KVC_API kvc_err kvc_close(kvc_segment *seg)
{
    if (!seg)
        return KVC_OK;
    handles_remove(seg);
    /* A segment discarded or replaced under this handle: nobody serves
     * it, there is nothing to end in it. */
    if (seg->hdr && kvc__seg_current(seg, 0) != KVC_OK) {
        kvc__segment_free(seg);
        return KVC_OK;
    }
    kvc__rooms_return_credit(seg);
    if (seg->rooms_opened)
        kvc__proc_note_rooms(seg);
    /* Rooms this process still takes part in cannot complete without it,
     * once its last handle on the segment is closed (the count is the
     * process entry's, whatever library copy opened the others).  A child
     * that inherited the handle across fork() is not that process. */
    int last = 0;
    uint32_t flags = 0;
    kvc_err first = KVC_OK, e;
    char msg[512] = "";
    if (seg->proc_slot >= 0) {
        if ((e = kvc__proc_release(seg, &last, &flags))) {
            first = e;
            snprintf(msg, sizeof msg,
                     "kvc_close: this handle still counts in the process table: %s",
                     kvc_last_error());
        }
    } else if (seg->hdr && (int32_t)getpid() == seg->pid && seg->rooms_opened) {
        /* A handle with no process entry (KVC_ROLE_NONE) that opened rooms:
         * they end with it unless another handle of this process is attached. */
        last = !kvc__pid_attached(seg);
        flags = KVC_PROC_F_ROOMS;
    }
    /* Every step is tried; the first failure is the one reported, with what
     * it left undone. */
    if (last && (flags & KVC_PROC_F_ROOMS) &&
        (e = kvc__rooms_fail_proc(seg, seg->pid, seg->start,
                                  "closed its segment handle without releasing the room", NULL)) &&
        !first) {
        first = e;
        snprintf(msg, sizeof msg,
                 "kvc_close: the rooms this process left unreleased were not failed: %s",
                 kvc_last_error());
    }
    /* A worker's session ends with it: its ranks must not be handed out. */
    if (last && (flags & KVC_PROC_F_WORKER) &&
        (e = kvc__ranks_withdraw_proc(seg, seg->pid, seg->start,
                                      "exited (closed its segment handle)", NULL)) &&
        !first) {
        first = e;
        snprintf(msg, sizeof msg,
                 "kvc_close: this worker's ranks were not withdrawn (they are served until "
                 "kvcoordd or `kvcoord-diag repair` reaps this process): %s",
                 kvc_last_error());
    }
    if (last && seg->proc_slot >= 0 && (e = kvc__proc_detach(seg)) && !first) {
        first = e;
        snprintf(msg, sizeof msg,
                 "kvc_close: this process's entry stays in the process table (reaped once it "
                 "exits): %s",
                 kvc_last_error());
    }
    kvc__segment_free(seg);
    return first ? kvc__fail(first, "%s", msg) : KVC_OK;
}

KVC_API kvc_err kvc_proc_reap(kvc_segment *seg, int32_t pid, uint64_t start, const char *how,
                              size_t *rooms_failed, size_t *ranks_withdrawn)
{
    KVC_ARG(seg);
    if (pid <= 0)
        return kvc__fail(KVC_E_INVAL, "kvc_proc_reap: pid %d is not a process id", (int)pid);
    char found[96];
    if (!how) {
        kvc__proc_how(pid, start, found, sizeof found);
        how = found;
    }
    if (rooms_failed)
        *rooms_failed = 0;
    /* Marked dead first: readers of its rooms see it with no system call
     * (and fail them with this same reason) while the rooms are failed. */
    kvc__proc_mark_dead(seg, pid, start, how);
    kvc_err e = kvc__rooms_fail_proc(seg, pid, start, how, rooms_failed);
    if (!e)
        e = kvc__ranks_withdraw_proc(seg, pid, start, how, ranks_withdrawn);
    if (!e)
        e = kvc__proc_forget(seg, pid, start);
    return e;
}

KVC_API kvc_err kvc_proc_reap_dead(kvc_segment *seg, size_t *reaped)
{
    KVC_ARG(seg);
    size_t n = 0;
    for (uint32_t i = 0; i < seg->max_procs; i++) {
        kvc_proc *p = &seg->procs[i];
        int32_t pid = atomic_load(&p->pid);
        if (pid == 0 ||
            kvc__proc_slot_state(seg, (int32_t)i, atomic_load(&p->gen)) != KVC__SLOT_DEAD)
            continue;
        kvc_err e = kvc_proc_reap(seg, pid, p->start, NULL, NULL, NULL);
        if (e)
            return e;
        n++;
    }
    if (reaped)
        *reaped = n;
    return KVC_OK;
}
