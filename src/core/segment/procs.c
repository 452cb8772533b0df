/*
 * procs.c - the process table: every attached process's pid, start time,
 * role, rank and count of open handles (one entry per process, whatever
 * the number of library copies in it that attached).  Liveness is the
 * entry's liveness lock (liveness.c), never the pid.
 *
 * An entry is filled, then published by storing its pid last; it is freed
 * by storing pid 0 first.  A writer that dies at any instruction therefore
 * leaves either a free slot or a complete entry, and recovery has nothing to
 * roll back.
 */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "internal.h"

/* Nothing to roll back (see above): only tell watchers to look again. */
static void procs_recover(kvc_segment *seg, int id)
{
    (void)id;
    atomic_fetch_add(&seg->hdr->proc_epoch, 1);
}

void kvc__procs_register(kvc_segment *seg)
{
    kvc__lock_register(seg, KVC_LOCK_PROCS, procs_recover);
}

KVC_API const char *kvc_role_name(kvc_role role)
{
    static const char *const names[] = {"none", "worker", "daemon", "client"};
    return (unsigned)role < sizeof names / sizeof *names ? names[role] : "invalid";
}

/* This process's own entry (another handle of it, through any copy of
 * the library, attached already), or -1.  Procs lock held. */
static int32_t find_own(kvc_segment *seg)
{
    for (uint32_t i = 0; i < seg->max_procs; i++) {
        kvc_proc *p = &seg->procs[i];
        if (atomic_load(&p->pid) == seg->pid && p->start == seg->start &&
            p->pid_ns == seg->pid_ns && atomic_load(&p->handles) > 0 &&
            kvc__liveness_held(seg, (int32_t)i))
            return (int32_t)i;
    }
    return -1;
}

int32_t kvc__shown_pid(kvc_segment *seg, int32_t pid, uint64_t start)
{
    for (uint32_t i = 0; i < seg->max_procs; i++) {
        kvc_proc *p = &seg->procs[i];
        if (atomic_load(&p->pid) == pid && (!start || p->start == start) && p->shown_pid > 0)
            return p->shown_pid;
    }
    return pid;
}

bool kvc__pid_attached(kvc_segment *seg)
{
    for (uint32_t i = 0; i < seg->max_procs; i++) {
        kvc_proc *p = &seg->procs[i];
        if (atomic_load(&p->pid) == seg->pid && p->start == seg->start &&
            p->pid_ns == seg->pid_ns && atomic_load(&p->handles) > 0)
            return true;
    }
    return false;
}

/* A free slot whose liveness lock this process now holds (*holder), or -1
 * with the first dead process's (pid, start) in *dead_pid / *dead_start (0
 * when every entry is alive).  Procs lock held. */
static int32_t find_slot(kvc_segment *seg, int *holder, int32_t *dead_pid, uint64_t *dead_start,
                         kvc_err *err)
{
    *dead_pid = 0;
    *dead_start = 0;
    *err = KVC_OK;
    for (uint32_t i = 0; i < seg->max_procs; i++) {
        if (atomic_load(&seg->procs[i].pid) != 0)
            continue;
        /* Busy: a free entry whose lock a description still holds (a fork
         * child of a dead process that kept its holder): skipped. */
        kvc_err e = kvc__liveness_hold(seg, (int32_t)i, holder);
        if (e == KVC_OK)
            return (int32_t)i;
        if (e != KVC_E_BUSY) {
            *err = e;
            return -1;
        }
    }
    for (uint32_t i = 0; i < seg->max_procs; i++) {
        kvc_proc *p = &seg->procs[i];
        int32_t pid = atomic_load(&p->pid);
        if (pid && kvc__proc_slot_state(seg, (int32_t)i, atomic_load(&p->gen)) == KVC__SLOT_DEAD) {
            *dead_pid = pid;
            *dead_start = p->start;
            break;
        }
    }
    return -1;
}

kvc_err kvc__proc_attach(kvc_segment *seg, kvc_role role, int32_t rank, int32_t *dead_pid,
                         uint64_t *dead_start)
{
    *dead_pid = 0;
    *dead_start = 0;
    kvc_err e = kvc__lock(seg, KVC_LOCK_PROCS);
    if (e)
        return e;
    uint32_t worker = role == KVC_ROLE_WORKER ? KVC_PROC_F_WORKER : 0;
    int32_t i = find_own(seg);
    if (i >= 0) {
        /* One entry per process: this handle counts in it. */
        kvc_proc *p = &seg->procs[i];
        atomic_fetch_add(&p->handles, 1);
        atomic_fetch_or(&p->flags, worker);
        if (worker)
            p->role = KVC_ROLE_WORKER;
        if (rank >= 0)
            p->rank = rank;
        seg->proc_slot = i;
        seg->proc_gen = atomic_load(&p->gen);
        kvc__unlock(seg, KVC_LOCK_PROCS);
        return KVC_OK;
    }
    /* A full table's dead entry is not reused here: the caller reaps it
     * first (session.c), so its ranks are never left served by nobody. */
    int holder = -1;
    i = find_slot(seg, &holder, dead_pid, dead_start, &e);
    if (i < 0) {
        kvc__unlock(seg, KVC_LOCK_PROCS);
        if (e)
            return e;
        return kvc__fail(KVC_E_FULL,
                         "process table of segment %s is full (%u live processes, each attached "
                         "process takes an entry): raise it with kvcoordd --max-procs (or "
                         "kvc_options.max_procs), which sizes a new segment",
                         seg->name, seg->max_procs);
    }
    kvc_proc *p = &seg->procs[i];
    /* A new gen before the pid is published: participants that recorded the
     * slot's previous gen see that their process left. */
    uint32_t gen = atomic_fetch_add_explicit(&p->gen, 1, memory_order_relaxed) + 1;
    atomic_store_explicit(&p->dead, 0, memory_order_relaxed);
    p->how[0] = '\0';
    p->role = (int32_t)role;
    p->rank = rank;
    p->start = seg->start;
    p->attached_ns = kvc__now_ns();
    p->pid_ns = seg->pid_ns;
    p->time_ns = seg->time_ns;
    p->shown_pid = seg->shown_pid;
    p->holder_fd = holder;
    atomic_store(&p->handles, 1);
    atomic_store(&p->flags, worker);
    atomic_store_explicit(&p->pid, seg->pid, memory_order_release);
    atomic_fetch_add(&seg->hdr->proc_epoch, 1);
    kvc__unlock(seg, KVC_LOCK_PROCS);
    kvc__futex_wake_all(&seg->hdr->proc_epoch);
    seg->proc_slot = i;
    seg->proc_gen = gen;
    return KVC_OK;
}

/* Our entry, if it is still ours (same gen, our pid). */
static kvc_proc *own_entry(kvc_segment *seg)
{
    if (seg->proc_slot < 0 || !seg->hdr || (int32_t)getpid() != seg->pid)
        return NULL;
    kvc_proc *p = &seg->procs[seg->proc_slot];
    if (atomic_load(&p->pid) != seg->pid || p->start != seg->start ||
        atomic_load(&p->gen) != seg->proc_gen)
        return NULL;
    return p;
}

void kvc__proc_note_rooms(kvc_segment *seg)
{
    kvc_proc *p = own_entry(seg);
    if (p)
        atomic_fetch_or(&p->flags, KVC_PROC_F_ROOMS);
}

kvc_err kvc__proc_release(kvc_segment *seg, int *last, uint32_t *flags)
{
    *last = 0;
    *flags = 0;
    /* A child that inherited the handle across fork() is not the process
     * the entry names: leave the parent's entry alone. */
    if (seg->proc_slot < 0 || !seg->hdr || (int32_t)getpid() != seg->pid)
        return KVC_OK;
    kvc_err e = kvc__lock(seg, KVC_LOCK_PROCS);
    if (e)
        return e;
    kvc_proc *p = own_entry(seg);
    if (p && atomic_fetch_sub(&p->handles, 1) == 1) {
        *last = 1;
        *flags = atomic_load(&p->flags);
    }
    kvc__unlock(seg, KVC_LOCK_PROCS);
    if (!*last)
        seg->proc_slot = -1;
    return KVC_OK;
}

kvc_err kvc__proc_detach(kvc_segment *seg)
{
    if (seg->proc_slot < 0 || !seg->hdr || (int32_t)getpid() != seg->pid)
        return KVC_OK;
    kvc_err e = kvc__lock(seg, KVC_LOCK_PROCS);
    if (e)
        return e;
    kvc_proc *p = own_entry(seg);
    if (p && atomic_load(&p->handles) == 0) {
        int holder = p->holder_fd;
        p->holder_fd = -1;
        /* Unpublished before the lock goes: a tester that finds the lock
         * free and the entry still there knows the process died. */
        atomic_store(&p->pid, 0);
        kvc__liveness_release(seg, seg->proc_slot, holder);
    }
    atomic_fetch_add(&seg->hdr->proc_epoch, 1);
    kvc__unlock(seg, KVC_LOCK_PROCS);
    kvc__futex_wake_all(&seg->hdr->proc_epoch);
    seg->proc_slot = -1;
    return KVC_OK;
}

void kvc__proc_set_rank(kvc_segment *seg, int32_t rank)
{
    /* Only a worker serves the rank it registers; kvcoordd registers on
     * behalf of remote processes. */
    if (seg->proc_slot >= 0 && seg->role == KVC_ROLE_WORKER)
        seg->procs[seg->proc_slot].rank = rank;
}

KVC_API uint32_t kvc_proc_epoch(kvc_segment *seg)
{
    if (!seg) {
        kvc__fail(KVC_E_INVAL, "kvc_proc_epoch: argument seg is NULL");
        return 0;
    }
    return atomic_load(&seg->hdr->proc_epoch);
}

KVC_API kvc_err kvc_proc_wait_change(kvc_segment *seg, uint32_t seen, uint32_t timeout_ms)
{
    KVC_ARG(seg);
    return kvc__epoch_wait(&seg->hdr->proc_epoch, seen, timeout_ms, "process table");
}

KVC_API kvc_err kvc_proc_list(kvc_segment *seg, kvc_proc_info *out, size_t cap, size_t *count)
{
    KVC_ARG(seg);
    KVC_ARG(count);
    if (cap)
        KVC_ARG(out);
    size_t n = 0;
    for (uint32_t i = 0; i < seg->max_procs; i++) {
        const kvc_proc *p = &seg->procs[i];
        uint32_t gen = atomic_load_explicit(&p->gen, memory_order_acquire);
        int32_t pid = atomic_load_explicit(&p->pid, memory_order_acquire);
        if (pid == 0)
            continue;
        if (n < cap) {
            kvc_proc_info *o = &out[n];
            memset(o, 0, sizeof *o);
            o->pid = pid;
            o->role = (kvc_role)p->role;
            o->rank = p->rank;
            o->start = p->start;
            o->attached_ns = p->attached_ns;
            o->alive = kvc__proc_slot_state(seg, (int32_t)i, gen) != KVC__SLOT_DEAD;
            o->shown_pid = p->shown_pid ? p->shown_pid : pid;
            o->pid_ns = p->pid_ns;
            o->time_ns = p->time_ns;
            o->handles = atomic_load(&p->handles);
        }
        n++;
    }
    *count = n;
    return KVC_OK;
}

/* Publish that (pid, start) is dead, and how, before its rooms are failed:
 * a reader of one of its rooms sees the mark without a system call and
 * fails the room with the same reason.  Plain stores on the slot (no lock:
 * a slot is only reused under the procs lock after forget()). */
void kvc__proc_mark_dead(kvc_segment *seg, int32_t pid, uint64_t start, const char *how)
{
    for (uint32_t i = 0; i < seg->max_procs; i++) {
        kvc_proc *p = &seg->procs[i];
        if (atomic_load(&p->pid) != pid || (start && p->start != start) || atomic_load(&p->dead) ||
            kvc__liveness_held(seg, (int32_t)i)) /* alive: a namesake in another namespace */
            continue;
        snprintf(p->how, sizeof p->how, "%s", how);
        atomic_store_explicit(&p->dead, 1, memory_order_release);
    }
}

KVC_API kvc_err kvc_proc_watch_beat(kvc_segment *seg, int watching)
{
    KVC_ARG(seg);
    kvc_header *h = seg->hdr;
    if (!watching) {
        if (atomic_load(&h->watch_pid) == seg->pid) {
            atomic_store(&h->watch_beat_mono, 0);
            atomic_store(&h->watch_pid, 0);
        }
        return KVC_OK;
    }
    atomic_store(&h->watch_pid, seg->pid);
    atomic_store_explicit(&h->watch_beat_mono, kvc__seg_mono_ns(), memory_order_release);
    return KVC_OK;
}

kvc_err kvc__proc_forget(kvc_segment *seg, int32_t pid, uint64_t start)
{
    kvc_err e = kvc__lock(seg, KVC_LOCK_PROCS);
    if (e)
        return e;
    for (uint32_t i = 0; i < seg->max_procs; i++) {
        kvc_proc *p = &seg->procs[i];
        /* A live process that has the same (pid, start) in another PID
         * namespace keeps its entry: only a dead one's goes. */
        if (atomic_load(&p->pid) == pid && (!start || p->start == start) &&
            !kvc__liveness_held(seg, (int32_t)i))
            atomic_store(&p->pid, 0);
    }
    atomic_fetch_add(&seg->hdr->proc_epoch, 1);
    kvc__unlock(seg, KVC_LOCK_PROCS);
    kvc__futex_wake_all(&seg->hdr->proc_epoch);
    return KVC_OK;
}
