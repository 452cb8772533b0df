/*
 * inspect_pd.c - the check of the PD bootstrap region (layout_pd.h,
 * kvcoord/pd.h): its lock, its two sequences and undo record, the rank
 * table by the library's own validator (kvc_pd_table_check), the counters
 * and gauges, each live entry's registrant, and the room map's slots and
 * probe sequences.
 *
 * Lock rule: the region is read under the PD lock (kvc__ck_take) when its
 * owner is alive and lets go within the timeout, else as found (a dead
 * owner's state, or - a live owner keeping the lock, e.g. a stopped one -
 * the rank table through the library's lock-free readers only).
 */
#include <stdlib.h>
#include <string.h>

#include "inspect_internal.h"
#include "kvcoord/pd.h"

static uint32_t home_of(int64_t room)
{
    return (uint32_t)(kvc__room_hash((uint64_t)room) >> 32) & (KVC_PD_MAX_ROOMS - 1);
}

/* The rank table through the public readers (no lock), checked by the
 * library's validator. */
static void check_table(kvc__ck *ck)
{
    kvc__tally t = {"pd.table", 0, 0};
    kvc_pd_status st;
    size_t n = 0;
    kvc_pd_rank *ranks = calloc(KVC_PD_MAX_RANKS, sizeof *ranks);
    kvc_err e = ranks ? kvc_pd_status_get(ck->seg, &st) : KVC_E_SYS;
    if (!e)
        e = kvc_pd_list(ck->seg, ranks, KVC_PD_MAX_RANKS, &n);
    if (e) {
        kvc__ck_problem(ck, &t, KVC_SEV_DEGRADED, "the PD tables could not be read: %s",
                        ranks ? kvc_last_error() : "out of memory");
    } else {
        kvc_pd_status chk = st;
        if (kvc_pd_table_check(&chk, ranks, n) != KVC_OK)
            kvc__ck_problem(ck, &t, KVC_SEV_BROKEN, "prefill rank table: %s", kvc_last_error());
        else if (chk.registered != st.registered || chk.ready != st.ready)
            kvc__ck_problem(ck, &t, KVC_SEV_BROKEN,
                            "readiness: %u live of %u expected, ready %d, but the status says "
                            "%u, ready %d",
                            chk.registered, chk.expected, chk.ready, st.registered, st.ready);
    }
    kvc__ck_settle(ck, &t,
                   "prefill rank table valid (kvc_pd_table_check): %u live, %u withdrawn, %u "
                   "expected, %s",
                   e ? 0 : st.registered, e ? 0 : st.withdrawn, e ? 0 : st.expected,
                   !e && st.ready ? "ready" : "not ready");
    free(ranks);
}

/* Under the lock (or as a dead owner left it): sequences, undo record,
 * counters, gauges, owners, room map. */
static void check_region(kvc__ck *ck, enum kvc__access a)
{
    kvc_pd_region *pd = ck->seg->pd;
    kvc__tally seq = {"pd.seq", 0, 0}, undo = {"pd.undo", 0, 0}, count = {"pd.count", 0, 0},
               owner = {"pd.owner", 0, 0}, slot = {"pd.rooms.slot", 0, 0},
               probe = {"pd.rooms.probe", 0, 0};
    uint32_t sr = atomic_load(&pd->seq_ranks), so = atomic_load(&pd->seq_rooms);
    if (sr & 1 || so & 1)
        kvc__ck_problem(ck, &seq, KVC_SEV_BROKEN,
                        "a PD sequence is odd (ranks %u, rooms %u): a writer died inside its "
                        "window; readers read the table as before that change until the next "
                        "writer (or `repair`) rolls it back",
                        sr, so);
    kvc__ck_settle(ck, &seq, "PD sequences even (ranks %u, rooms %u)", sr, so);
    if (atomic_load(&pd->undo.valid))
        kvc__ck_problem(ck, &undo, KVC_SEV_BROKEN,
                        "the PD undo record is valid (kind %u, slot %u): a change was "
                        "interrupted; the next writer (or `repair`) rolls it back",
                        pd->undo.kind, pd->undo.index);
    kvc__ck_settle(ck, &undo, "no interrupted PD change");

    uint32_t used = 0, live = 0, wd = 0;
    for (uint32_t i = 0; i < KVC_PD_MAX_RANKS; i++) {
        const kvc_pd_slot *s = &pd->slots[i];
        if (s->state > KVC_PD_WITHDRAWN) {
            kvc__ck_problem(ck, &count, KVC_SEV_BROKEN, "rank slot %u has state %u", i, s->state);
            continue;
        }
        used += s->state != KVC_PD_FREE;
        live += s->state == KVC_PD_LIVE;
        wd += s->state == KVC_PD_WITHDRAWN;
        if (s->state != KVC_PD_LIVE)
            continue;
        /* A live entry whose known registrant ended: the reaper (kvcoordd,
         * every second) withdraws it. */
        int known = s->proc_slot >= 0 || s->pid > 0;
        int alive =
            s->proc_slot >= 0 && (uint32_t)s->proc_slot < ck->seg->hdr->max_procs
                ? kvc__proc_slot_state(ck->seg, s->proc_slot, s->proc_gen) == KVC__SLOT_ALIVE
                : kvc__proc_alive(s->pid, s->pid_start);
        if (known && !alive)
            kvc__ck_problem(ck, &owner, KVC_SEV_DEGRADED,
                            "prefill rank dp=%d cp=%d tp=%d pp=%d is live but its registrant "
                            "pid %d is not running (kvcoordd withdraws it within a second; "
                            "is kvcoordd running?)",
                            (int)s->dp_group, (int)s->cp_rank, (int)s->tp_rank, (int)s->pp_rank,
                            (int)s->pid);
    }
    kvc__ck_settle(ck, &owner, "every live prefill rank's known registrant runs");
    uint32_t rooms = 0, tombs = 0;
    const uint32_t mask = KVC_PD_MAX_ROOMS - 1;
    for (uint32_t i = 0; i < KVC_PD_MAX_ROOMS; i++) {
        const kvc_pd_room *r = &pd->rooms[i];
        if (r->state == KVC_PD_ROOM_FREE)
            continue;
        if (r->state == KVC_PD_ROOM_TOMB) {
            tombs++;
            continue;
        }
        if (r->state != KVC_PD_ROOM_USED || r->dp_rank < 0 || r->dp_rank >= KVC_PD_DIM_MAX) {
            kvc__ck_problem(ck, &slot, KVC_SEV_BROKEN, "room slot %u: state %u, dp_rank %d", i,
                            r->state, (int)r->dp_rank);
            continue;
        }
        rooms++;
        /* Found by its probe: no free slot between its home and it. */
        uint32_t h = home_of(r->room);
        for (uint32_t j = h; j != i; j = (j + 1) & mask) {
            if (pd->rooms[j].state == KVC_PD_ROOM_FREE) {
                kvc__ck_problem(ck, &probe, KVC_SEV_BROKEN,
                                "room %lld at slot %u is not found: free slot %u lies between "
                                "its home %u and it",
                                (long long)r->room, i, j, h);
                break;
            }
            if (pd->rooms[j].state == KVC_PD_ROOM_USED && pd->rooms[j].room == r->room) {
                kvc__ck_problem(ck, &probe, KVC_SEV_DEGRADED,
                                "room %lld is in slots %u and %u (a move a dead writer "
                                "interrupted; the first is found, a sweep removes both)",
                                (long long)r->room, j, i);
                break;
            }
        }
    }
    if (tombs && a == KVC__LOCKED)
        kvc__ck_problem(ck, &slot, KVC_SEV_BROKEN,
                        "%u room tombstones with the PD lock free (a removal left half-way "
                        "and not finished by recovery)",
                        tombs);
    if (rooms >= KVC_PD_MAX_ROOMS)
        kvc__ck_problem(ck, &slot, KVC_SEV_BROKEN, "no free room slot: probes never end");
    kvc__ck_settle(ck, &slot, "%u room slots in use, states and dp ranks valid", rooms);
    kvc__ck_settle(ck, &probe, "every room is found by its probe sequence, none twice");
    if (a == KVC__LOCKED) {
        if (used != pd->ranks_used || rooms != pd->rooms_used)
            kvc__ck_problem(ck, &count, KVC_SEV_BROKEN,
                            "counters: %u rank slots and %u rooms in use, the region says %u "
                            "and %u",
                            used, rooms, pd->ranks_used, pd->rooms_used);
        kvc_pd_gauges g;
        kvc_pd_gauges_get(ck->seg, &g);
        if (g.live != live || g.withdrawn != wd || g.rooms != rooms)
            kvc__ck_problem(ck, &count, KVC_SEV_DEGRADED,
                            "gauges (/metrics) say %u live, %u withdrawn, %u rooms; the tables "
                            "hold %u, %u, %u",
                            g.live, g.withdrawn, g.rooms, live, wd, rooms);
    }
    kvc__ck_settle(ck, &count,
                   "PD counters and gauges match the tables (%u rank entries, %u rooms)", used,
                   rooms);
}

void kvc__check_pd(kvc__ck *ck)
{
    enum kvc__access a = kvc__ck_take(ck, KVC_LOCK_PD);
    if (a != KVC__UNLOCKED_BUSY)
        check_region(ck, a);
    kvc__ck_give(ck, KVC_LOCK_PD, a);
    /* Lock-free: checked whatever the lock. */
    check_table(ck);
}
