/*
 * procs.c - the process table: every attached process's pid, start time,
 * role and rank.  Liveness is (pid, start time): a pid alone is reused.
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

/* A free slot, or -1 with the first dead process's (pid, start) in
 * *dead_pid / *dead_start (0 when every entry is alive).  Procs lock held. */
KVC_API const char *kvc_role_name(kvc_role role)
{
    static const char *const names[] = {"none", "worker", "daemon", "client"};
    return (unsigned)role < sizeof names / sizeof *names ? names[role] : "invalid";
}

static int32_t find_slot(kvc_segment *seg, int32_t *dead_pid, uint64_t *dead_start)
{
    const kvc_header *h = seg->hdr;
    *dead_pid = 0;
    *dead_start = 0;
    for (uint32_t i = 0; i < h->max_procs; i++)
        if (atomic_load(&seg->procs[i].pid) == 0)
            return (int32_t)i;
    for (uint32_t i = 0; i < h->max_procs; i++) {
        kvc_proc *p = &seg->procs[i];
        int32_t pid = atomic_load(&p->pid);
        if (pid && !kvc__proc_alive(pid, p->start)) {
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
    kvc_err e = kvc__lock(seg, KVC_LOCK_PROCS);
    if (e)
        return e;
    /* A full table's dead entry is not reused here: the caller reaps it
     * first (session.c), so its ranks are never left served by nobody. */
    int32_t i = find_slot(seg, dead_pid, dead_start);
    if (i < 0) {
        kvc__unlock(seg, KVC_LOCK_PROCS);
        return kvc__fail(KVC_E_FULL,
                         "process table of segment %s is full (%u live processes, each attached "
                         "process takes an entry): raise it with kvcoordd --max-procs (or "
                         "kvc_options.max_procs), which sizes a new segment",
                         seg->name, seg->hdr->max_procs);
    }
    kvc_proc *p = &seg->procs[i];
    /* A new gen before the pid is published: participants that recorded the
     * slot's previous gen see that their process left. */
    atomic_fetch_add_explicit(&p->gen, 1, memory_order_relaxed);
    atomic_store_explicit(&p->dead, 0, memory_order_relaxed);
    p->how[0] = '\0';
    p->role = (int32_t)role;
    p->rank = rank;
    p->start = seg->start;
    p->attached_ns = kvc__now_ns();
    atomic_store_explicit(&p->pid, seg->pid, memory_order_release);
    atomic_fetch_add(&seg->hdr->proc_epoch, 1);
    kvc__unlock(seg, KVC_LOCK_PROCS);
    kvc__futex_wake_all(&seg->hdr->proc_epoch);
    seg->proc_slot = i;
    return KVC_OK;
}

kvc_err kvc__proc_detach(kvc_segment *seg)
{
    /* A child that inherited the handle across fork() is not the process
     * the entry names: leave the parent's entry alone. */
    if (seg->proc_slot < 0 || !seg->hdr || (int32_t)getpid() != seg->pid)
        return KVC_OK;
    kvc_err e = kvc__lock(seg, KVC_LOCK_PROCS);
    if (e)
        return e;
    kvc_proc *p = &seg->procs[seg->proc_slot];
    if (atomic_load(&p->pid) == seg->pid && p->start == seg->start)
        atomic_store(&p->pid, 0);
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
    for (uint32_t i = 0; i < seg->hdr->max_procs; i++) {
        const kvc_proc *p = &seg->procs[i];
        int32_t pid = atomic_load_explicit(&p->pid, memory_order_acquire);
        if (pid == 0)
            continue;
        if (n < cap) {
            kvc_proc_info *o = &out[n];
            o->pid = pid;
            o->role = (kvc_role)p->role;
            o->rank = p->rank;
            o->start = p->start;
            o->attached_ns = p->attached_ns;
            o->alive = kvc__proc_alive(pid, p->start);
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
    for (uint32_t i = 0; i < seg->hdr->max_procs; i++) {
        kvc_proc *p = &seg->procs[i];
        if (atomic_load(&p->pid) != pid || (start && p->start != start) || atomic_load(&p->dead))
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
    atomic_store_explicit(&h->watch_beat_mono, kvc__mono_ns(), memory_order_release);
    return KVC_OK;
}

kvc_err kvc__proc_forget(kvc_segment *seg, int32_t pid, uint64_t start)
{
    kvc_err e = kvc__lock(seg, KVC_LOCK_PROCS);
    if (e)
        return e;
    for (uint32_t i = 0; i < seg->hdr->max_procs; i++) {
        kvc_proc *p = &seg->procs[i];
        if (atomic_load(&p->pid) == pid && (!start || p->start == start))
            atomic_store(&p->pid, 0);
    }
    atomic_fetch_add(&seg->hdr->proc_epoch, 1);
    kvc__unlock(seg, KVC_LOCK_PROCS);
    kvc__futex_wake_all(&seg->hdr->proc_epoch);
    return KVC_OK;
}
