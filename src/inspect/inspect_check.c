/*
 * inspect_check.c - the invariant check, kvc__check (inspect.h): how
 * findings are reported (one per invariant, the first MAX_REPORTS problems
 * of a kind listed), the header, taking each table's lock for the check,
 * the process table; the rank tables and the rooms are checked by
 * inspect_ranks.c and inspect_rooms.c.
 *
 * The check reads each table under its lock when the lock's owner is
 * alive, so what it sees is consistent.  When the owner died holding the
 * lock, nothing can be writing, so the state is read as the dead owner left
 * it - that is what an operator needs to see - and the lock is left for
 * `repair` (or the next locker) to recover.  When a live owner keeps the
 * lock past the timeout, only what is safe to read without it is checked.
 *
 * Lock rule: one lock at a time, taken by kvc__ck_take and given back by
 * kvc__ck_give.  kvc__check is called by kvcoord-diag (check, status,
 * repair), kvcoord-torture and tests.
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "inspect_internal.h"

/* Problems of one kind reported one by one up to this many; then counted. */
#define MAX_REPORTS 20

/* ---- the check: reporting ----------------------------------------------- */

static void emit(kvc__ck *ck, kvc_severity sev, const char *id, const char *msg)
{
    if (sev > ck->worst)
        ck->worst = sev;
    if (ck->fn)
        ck->fn(ck->ctx, sev, id, msg);
}

void kvc__ck_say(kvc__ck *ck, kvc_severity sev, const char *id, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    emit(ck, sev, id, msg);
}

void kvc__ck_problem(kvc__ck *ck, kvc__tally *t, kvc_severity sev, const char *fmt, ...)
{
    if (sev > t->sev)
        t->sev = sev;
    if (t->n++ >= MAX_REPORTS)
        return;
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    emit(ck, sev, t->id, msg);
}

/* Close a tally: "ok" with ok_msg when nothing was found. */
void kvc__ck_settle(kvc__ck *ck, kvc__tally *t, const char *fmt, ...)
{
    char msg[512];
    if (t->n == 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof msg, fmt, ap);
        va_end(ap);
        emit(ck, KVC_SEV_OK, t->id, msg);
    } else if (t->n > MAX_REPORTS) {
        snprintf(msg, sizeof msg, "%u more problems of this kind not listed", t->n - MAX_REPORTS);
        emit(ck, t->sev, t->id, msg);
    }
}

/* ---- the check: header -------------------------------------------------- */

/* False when the file is shorter than the mapping: reading on would SIGBUS. */
static bool check_header(kvc__ck *ck)
{
    kvc_raw_header h;
    kvc__header_of(ck->seg, &h);
    int32_t adopter;
    char magic[9];
    kvc__magic_text(h.magic, magic);
    kvc__ck_say(ck, KVC_SEV_OK, "header.magic", "magic %s", magic);
    kvc__ck_say(ck, KVC_SEV_OK, "header.version", "layout version %u, as this build",
                h.layout_version);
    kvc__ck_say(
        ck, KVC_SEV_OK, "header.sizes",
        "structure sizes match this build (header %u, rank entry %u, proc %u, lock %u, room %u, "
        "block %u bytes) and the region offsets match the capacities",
        h.header_size, h.rank_entry_size, h.proc_size, h.lock_size, h.room_size, h.block_size);
    if (h.file_bytes < h.total_bytes) {
        kvc__ck_say(ck, KVC_SEV_BROKEN, "header.file",
                    "the file is %llu bytes but the header says %llu: truncated while attached; "
                    "nothing more is read",
                    (unsigned long long)h.file_bytes, (unsigned long long)h.total_bytes);
        return false;
    }
    if (h.file_bytes > h.total_bytes)
        kvc__ck_say(ck, KVC_SEV_DEGRADED, "header.file",
                    "the file is %llu bytes, more than the %llu the "
                    "header says (extended by something else)",
                    (unsigned long long)h.file_bytes, (unsigned long long)h.total_bytes);
    else
        kvc__ck_say(ck, KVC_SEV_OK, "header.file", "file is %llu bytes, as the header says",
                    (unsigned long long)h.file_bytes);
    if (h.creator_stopped)
        kvc__ck_say(ck, KVC_SEV_DEGRADED, "header.creator",
                    "creator pid %d (kvcoordd) is stopped (state T in /proc: SIGSTOP or a "
                    "debugger): it answers nothing and reaps nothing until continued (kill -CONT "
                    "%d)",
                    (int)h.creator_pid, (int)h.creator_pid);
    else if (h.creator_alive)
        kvc__ck_say(ck, KVC_SEV_OK, "header.creator", "creator pid %d is running",
                    (int)h.creator_pid);
    else if ((adopter = kvc__adopter(ck->seg, h.creator_pid)) > 0)
        kvc__ck_say(ck, KVC_SEV_OK, "header.creator",
                    "creator pid %d has ended; kvcoordd pid %d adopted the segment and runs",
                    (int)h.creator_pid, (int)adopter);
    else
        kvc__ck_say(ck, KVC_SEV_INFO, "header.creator",
                    "creator pid %d is not running (the segment "
                    "outlives it; a restarted kvcoordd reuses it)",
                    (int)h.creator_pid);
    if (h.updated_ns < h.created_ns)
        kvc__ck_say(ck, KVC_SEV_INFO, "header.times",
                    "updated time is before the creation time "
                    "(the clock was set back)");
    return true;
}

/* ---- the check: locks ----------------------------------------------------- */

/* quiet: no finding when the lock is fine (the room stripes: one summary). */
enum kvc__access kvc__ck_take_q(kvc__ck *ck, int id, int quiet)
{
    char id_s[32], text[160];
    /* The room stripes report under one id, "locks.rooms". */
    snprintf(id_s, sizeof id_s, "locks.%s",
             id >= KVC_LOCK_ROOMS && id < KVC_LOCK_PD ? "rooms" : kvc__lock_name(id));
    kvc_lock_probe *p = &ck->st->locks[id];
    kvc__lock_probe(ck->seg, id, p);
    /* Held by a process that is gone: look again, in case it released the
     * lock and exited between our reads of the mutex and of its owner. */
    if (p->state == KVC_LOCKST_HELD && !p->owner_alive)
        kvc__lock_probe(ck->seg, id, p);
    kvc__lock_text(p, text, sizeof text);
    if (p->state == KVC_LOCKST_OWNER_DIED) {
        kvc__ck_say(ck, KVC_SEV_BROKEN, id_s,
                    "%s lock: %s; the state under it is read as left "
                    "(the next locker, or `repair`, recovers it)",
                    kvc__lock_name(id), text);
        return KVC__UNLOCKED_DEAD;
    }
    if (p->state == KVC_LOCKST_NOTRECOVERABLE ||
        (p->state == KVC_LOCKST_HELD && !p->owner_alive && !p->recovering)) {
        kvc__ck_say(ck, KVC_SEV_BROKEN, id_s, "%s lock: %s", kvc__lock_name(id), text);
        return KVC__UNLOCKED_DEAD;
    }
    if (p->state == KVC_LOCKST_HELD && p->owner_stopped) {
        /* Waiting would only run out the timeout: a stopped owner holds it
         * until continued or killed. */
        kvc__ck_say(ck, KVC_SEV_DEGRADED, id_s,
                    "%s lock: %s; every writer waits for it (lock-free readers do not); what "
                    "needs the lock was not checked",
                    kvc__lock_name(id), text);
        return KVC__UNLOCKED_BUSY;
    }
    uint64_t before = p->recoveries;
    kvc_err e = kvc__lock(ck->seg, id);
    if (e == KVC_E_BUSY) {
        kvc__lock_probe(ck->seg, id, p);
        kvc__lock_text(p, text, sizeof text);
        kvc__ck_say(ck, KVC_SEV_DEGRADED, id_s,
                    "%s lock: %s for over %u ms (stuck?); what needs the "
                    "lock was not checked",
                    kvc__lock_name(id), text, ck->seg->lock_timeout_ms);
        return KVC__UNLOCKED_BUSY;
    }
    if (e) {
        kvc__ck_say(ck, KVC_SEV_BROKEN, id_s, "%s lock: %s", kvc__lock_name(id), kvc_last_error());
        return KVC__UNLOCKED_DEAD;
    }
    if (atomic_load(&kvc__lock_ptr(ck->seg, id)->recoveries) != before) {
        ck->st->recovered_while_checking = 1;
        kvc__ck_say(ck, KVC_SEV_INFO, id_s,
                    "%s lock: its owner died while being checked; recovered", kvc__lock_name(id));
    } else if (!quiet) {
        kvc__ck_say(ck, KVC_SEV_OK, id_s, "%s lock: %s (%llu recoveries since creation)",
                    kvc__lock_name(id), p->state == KVC_LOCKST_FREE ? "free" : "taken and released",
                    (unsigned long long)p->recoveries);
    }
    return KVC__LOCKED;
}

enum kvc__access kvc__ck_take(kvc__ck *ck, int id) { return kvc__ck_take_q(ck, id, 0); }

void kvc__ck_give(kvc__ck *ck, int id, enum kvc__access a)
{
    if (a == KVC__LOCKED)
        kvc__unlock(ck->seg, id);
}

/* ---- the check: processes ---------------------------------------------- */

static void check_procs(kvc__ck *ck)
{
    const kvc_header *h = ck->seg->hdr;
    enum kvc__access a = kvc__ck_take(ck, KVC_LOCK_PROCS);
    kvc__tally alive = {"procs.alive", 0, 0}, entry = {"procs.entry", 0, 0};
    for (uint32_t i = 0; i < h->max_procs; i++) {
        const kvc_proc *p = &ck->seg->procs[i];
        int32_t pid = atomic_load(&p->pid);
        if (pid == 0)
            continue;
        ck->st->procs_attached++;
        if (pid < 0 || p->role < 0 || p->role > KVC_ROLE_CLIENT || p->rank < -1)
            kvc__ck_problem(ck, &entry, KVC_SEV_BROKEN,
                            "process entry %u is invalid (pid %d, role %d, "
                            "rank %d)",
                            i, (int)pid, (int)p->role, (int)p->rank);
        /* Its liveness lock (liveness.c), right in any PID namespace. */
        if (kvc__proc_slot_state(ck->seg, (int32_t)i, atomic_load(&p->gen)) != KVC__SLOT_DEAD) {
            ck->st->procs_alive++;
            /* Alive but stopped (by the pid this /proc names it, when its
             * start time matches): it holds its rooms and collectives. */
            int32_t shown = p->shown_pid > 0 ? p->shown_pid : pid;
            if (kvc__pid_stopped(shown, p->start) && ++ck->st->procs_stopped)
                kvc__ck_problem(ck, &alive, KVC_SEV_DEGRADED,
                                "pid %d (%s, rank %d) is stopped (state T in /proc: SIGSTOP or a "
                                "debugger): %s until it is continued (kill -CONT %d)",
                                (int)shown, kvc_role_name((kvc_role)p->role), (int)p->rank,
                                p->role == KVC_ROLE_DAEMON
                                    ? "HTTP clients wait for it, dead workers' ranks and PD "
                                      "entries stay registered (nothing withdraws them) and the "
                                      "cluster view goes stale"
                                    : "its rooms, polls and collectives wait for it",
                                (int)shown);
            continue;
        }
        ck->st->procs_dead++;
        kvc__ck_problem(
            ck, &alive, KVC_SEV_DEGRADED,
            "pid %d (%s, rank %d) is not running but still "
            "attached; reaping it (kvcoordd, or `repair`) fails its rooms and withdraws its "
            "ranks",
            (int)pid, kvc_role_name((kvc_role)p->role), (int)p->rank);
    }
    kvc__ck_give(ck, KVC_LOCK_PROCS, a);
    kvc__ck_settle(ck, &entry, "%u process entries are well-formed", ck->st->procs_attached);
    kvc__ck_settle(ck, &alive, "all %u attached processes are running", ck->st->procs_attached);
}

kvc_severity kvc__check(kvc_segment *seg, kvc_check_fn fn, void *ctx, kvc_check_stats *stats)
{
    kvc_check_stats local;
    kvc__ck ck = {seg, fn, ctx, stats ? stats : &local, KVC_SEV_OK};
    memset(ck.st, 0, sizeof *ck.st);
    for (int i = 0; i < KVC_LOCK_COUNT; i++)
        ck.st->locks[i].name = kvc__lock_name(i);
    if (!check_header(&ck))
        return ck.worst;
    kvc__check_ranks(&ck);
    check_procs(&ck);
    kvc__check_rooms(&ck);
    kvc__check_pd(&ck);
    return ck.worst;
}
