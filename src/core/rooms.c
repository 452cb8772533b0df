/*
 * rooms.c - bootstrap rooms: per-request KVPoll state and failure records
 * shared by every rank of the node.
 *
 * The room table is open addressing keyed by room id (linear probing).
 * Deletion leaves a tombstone, and every tombstone followed by a free slot
 * is turned back into a free slot (a probe reaching it would stop at the
 * next slot anyway), so tombstones do not pile up.
 *
 * Every update runs under the rooms lock inside an undo record: the bytes
 * about to change (the room slot, the failure ring slot, the counters) are
 * saved first and marked valid by one store; the update runs; the mark is
 * cleared.  A writer that dies at any instruction leaves a valid undo
 * record, and rooms_recover() copies the saved bytes back before the
 * mutex is marked consistent.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "internal.h"

/* While waiting on a room, participant liveness is re-checked this often,
 * so a dead participant is noticed even with no kvcoordd to report it. */
#define LIVENESS_SLICE_MS 200

KVC_API const char *kvc_poll_name(kvc_poll s)
{
    switch (s) {
    case KVC_POLL_FAILED: return "Failed";
    case KVC_POLL_BOOTSTRAPPING: return "Bootstrapping";
    case KVC_POLL_WAITING_FOR_INPUT: return "WaitingForInput";
    case KVC_POLL_TRANSFERRING: return "Transferring";
    case KVC_POLL_SUCCESS: return "Success";
    }
    return "Unknown";
}

/* ---- undo record ------------------------------------------------------ */

static void undo_begin(kvc_segment *seg, void *a, size_t alen, void *b, size_t blen)
{
    kvc_undo *u = &seg->hdr->room_undo;
    void *regions[2] = {a, b};
    size_t lens[2] = {alen, blen}, at = 0;
    u->nregions = 0;
    for (int i = 0; i < 2; i++) {
        if (!regions[i])
            continue;
        u->off[u->nregions] = (uint64_t)((unsigned char *)regions[i] - seg->base);
        u->len[u->nregions] = lens[i];
        memcpy(u->data + at, regions[i], lens[i]);
        at += lens[i];
        u->nregions++;
    }
    u->counters = seg->hdr->room_counters;
    atomic_store_explicit(&u->valid, 1, memory_order_release);
    KVC_INJECT("room.undo_saved");
}

static void undo_end(kvc_segment *seg)
{
    KVC_INJECT("room.before_commit");
    atomic_store_explicit(&seg->hdr->room_undo.valid, 0, memory_order_release);
    atomic_store(&seg->hdr->updated_ns, kvc__now_ns());
    atomic_fetch_add(&seg->hdr->room_epoch, 1);
}

static void rooms_recover(kvc_segment *seg, int id)
{
    (void)id;
    kvc_header *h = seg->hdr;
    kvc_undo *u = &h->room_undo;
    if (atomic_load(&u->valid)) {
        size_t at = 0;
        for (uint32_t i = 0; i < u->nregions && i < 2; i++) {
            if (u->off[i] + u->len[i] > seg->size || at + u->len[i] > sizeof u->data)
                break; /* never write outside the segment */
            memcpy(seg->base + u->off[i], u->data + at, u->len[i]);
            at += u->len[i];
        }
        h->room_counters = u->counters;
        atomic_store(&u->valid, 0);
    }
    uint32_t live = 0;
    for (uint32_t i = 0; i < h->room_slots; i++)
        live += seg->rooms[i].slot == KVC_SLOT_USED;
    h->room_counters.rooms_live = live;
    atomic_fetch_add(&h->room_epoch, 1);
    kvc__futex_wake_all(&h->room_epoch);
}

void kvc__rooms_register(kvc_segment *seg)
{
    kvc__lock_register(seg, KVC_LOCK_ROOMS, rooms_recover);
}

/* ---- table ------------------------------------------------------------ */

static int64_t find(kvc_segment *seg, uint64_t id)
{
    uint32_t mask = seg->hdr->room_slots - 1;
    uint32_t i = (uint32_t)kvc__room_hash(id) & mask;
    for (uint32_t n = 0; n <= mask; n++, i = (i + 1) & mask) {
        const kvc_room *r = &seg->rooms[i];
        if (r->slot == KVC_SLOT_FREE)
            return -1;
        if (r->slot == KVC_SLOT_USED && r->id == id)
            return i;
    }
    return -1;
}

/* First reusable slot on id's probe path (call only when find() failed). */
static int64_t find_free(kvc_segment *seg, uint64_t id)
{
    uint32_t mask = seg->hdr->room_slots - 1;
    uint32_t i = (uint32_t)kvc__room_hash(id) & mask;
    for (uint32_t n = 0; n <= mask; n++, i = (i + 1) & mask)
        if (seg->rooms[i].slot != KVC_SLOT_USED)
            return i;
    return -1;
}

/* Delete slot i: tombstone, then turn tombstones before a free slot back
 * into free slots, each step a single store that leaves every probe's
 * result unchanged. */
static void delete_slot(kvc_segment *seg, uint32_t i)
{
    uint32_t mask = seg->hdr->room_slots - 1;
    kvc_room *r = &seg->rooms[i];
    undo_begin(seg, r, sizeof *r, NULL, 0);
    r->slot = KVC_SLOT_TOMB;
    seg->hdr->room_counters.rooms_live--;
    undo_end(seg);
    if (seg->rooms[(i + 1) & mask].slot != KVC_SLOT_FREE)
        return;
    for (uint32_t n = 0; n <= mask && seg->rooms[i].slot == KVC_SLOT_TOMB; n++) {
        seg->rooms[i].slot = KVC_SLOT_FREE;
        i = (i - 1) & mask;
    }
}

/* ---- room state ------------------------------------------------------- */

static kvc_poll room_state(const kvc_room *r)
{
    if (r->terminal >= 0)
        return (kvc_poll)r->terminal;
    int min = KVC_POLL_SUCCESS;
    for (uint32_t i = 0; i < r->participants; i++) {
        int s = r->part[i].state < 0 ? KVC_POLL_BOOTSTRAPPING : r->part[i].state;
        if (s < min)
            min = s;
    }
    return (kvc_poll)min;
}

/* Copy at most KVC_REASON_MAX bytes, never cutting a UTF-8 sequence. */
static void copy_reason(char *dst, const char *src)
{
    size_t n = src ? strlen(src) : 0;
    if (n > KVC_REASON_MAX) {
        n = KVC_REASON_MAX;
        while (n > 0 && ((unsigned char)src[n] & 0xC0) == 0x80)
            n--; /* src[n] continues a character: cut before that character */
    }
    if (n)
        memcpy(dst, src, n);
    dst[n] = '\0';
}

/* Record the first failure of room r (lock held, outside any undo). */
static void write_failure(kvc_segment *seg, kvc_room *r, uint32_t origin, int32_t code,
                          const char *reason, int32_t pid, uint64_t time_ns);

static int record_failure(kvc_segment *seg, kvc_room *r, uint32_t origin, int32_t code,
                          const char *reason, int32_t pid)
{
    if (r->has_failure || r->terminal == KVC_POLL_SUCCESS)
        return 0;
    write_failure(seg, r, origin, code, reason, pid, kvc__now_ns());
    return 1;
}

/* Write r's failure record (and its copy in the ring) under one undo
 * record, replacing any record r had (lock held). */
static void write_failure(kvc_segment *seg, kvc_room *r, uint32_t origin, int32_t code,
                          const char *reason, int32_t pid, uint64_t time_ns)
{
    kvc_room_counters *c = &seg->hdr->room_counters;
    kvc_failure_rec *ring = &seg->failures[c->failures_total % KVC_FAILURE_RING];
    undo_begin(seg, r, sizeof *r, ring, sizeof *ring);
    kvc_failure_rec *f = &r->failure;
    f->room = r->id;
    f->time_ns = time_ns;
    f->origin_rank = (int32_t)origin;
    f->origin_pid = pid;
    f->code = code;
    copy_reason(f->reason, reason && *reason ? reason : "no reason given");
    KVC_INJECT("room.failure_half");
    r->has_failure = 1;
    r->terminal = KVC_POLL_FAILED;
    r->updated_ns = f->time_ns;
    *ring = *f;
    c->failures_total++;
    undo_end(seg);
}

static kvc_err lock_rooms(kvc_segment *seg) { return kvc__lock(seg, KVC_LOCK_ROOMS); }

static void unlock_rooms(kvc_segment *seg, uint32_t epoch_before)
{
    bool changed = atomic_load(&seg->hdr->room_epoch) != epoch_before;
    kvc__unlock(seg, KVC_LOCK_ROOMS);
    if (changed)
        kvc__futex_wake_all(&seg->hdr->room_epoch);
}

/* Liveness answers already read during one call over many rooms
 * (kvc_room_sync): the same processes take part in every room of a TP
 * group, and each check reads /proc. */
struct alive_cache {
    uint32_t n;
    struct {
        int32_t pid;
        bool alive;
        uint64_t start;
    } e[2 * KVC_ROOM_MAX_PARTICIPANTS];
};

static bool part_alive(struct alive_cache *c, const kvc_room_part *p)
{
    if (!c)
        return kvc__proc_alive(p->pid, p->start);
    for (uint32_t i = 0; i < c->n; i++)
        if (c->e[i].pid == p->pid && c->e[i].start == p->start)
            return c->e[i].alive;
    bool alive = kvc__proc_alive(p->pid, p->start);
    if (c->n < sizeof c->e / sizeof c->e[0]) {
        c->e[c->n].pid = p->pid;
        c->e[c->n].start = p->start;
        c->e[c->n++].alive = alive;
    }
    return alive;
}

/* Fail r if a participant died or it idled past the TTL (lock held).
 * cache: NULL, or the liveness answers of the current call. */
static void check_room(kvc_segment *seg, kvc_room *r, uint64_t now, struct alive_cache *cache)
{
    if (r->terminal >= 0)
        return;
    for (uint32_t i = 0; i < r->participants; i++) {
        kvc_room_part *p = &r->part[i];
        if (!p->pid || p->released || part_alive(cache, p))
            continue;
        char how[96], reason[KVC_REASON_MAX + 1];
        kvc__proc_how(p->pid, how, sizeof how);
        snprintf(reason, sizeof reason, "rank %u (pid %d) %s", i, (int)p->pid, how);
        record_failure(seg, r, i, ESRCH, reason, 0);
        return;
    }
    uint64_t ttl_ns = (uint64_t)seg->hdr->room_ttl_ms * 1000000ull;
    if (now > r->updated_ns + ttl_ns) {
        char reason[KVC_REASON_MAX + 1];
        snprintf(reason, sizeof reason, "room %llu timed out: no update for %u ms (room TTL)",
                 (unsigned long long)r->id, seg->hdr->room_ttl_ms);
        record_failure(seg, r, 0, ETIMEDOUT, reason, 0);
    }
}

static void fill_info(const kvc_room *r, int32_t asking, kvc_room_info *out)
{
    memset(out, 0, sizeof *out);
    out->room = r->id;
    out->state = room_state(r);
    out->participants = r->participants;
    out->opened_ns = r->opened_ns;
    out->updated_ns = r->updated_ns;
    for (uint32_t i = 0; i < KVC_ROOM_MAX_PARTICIPANTS; i++) {
        out->local[i] = i < r->participants ? r->part[i].state : -1;
        out->joined += i < r->participants && r->part[i].pid != 0;
        out->released += i < r->participants && r->part[i].released;
    }
    out->has_failure = (int)r->has_failure;
    if (r->has_failure) {
        const kvc_failure_rec *f = &r->failure;
        out->failure.room = f->room;
        out->failure.origin_rank = (uint32_t)f->origin_rank;
        out->failure.origin_pid = f->origin_pid;
        out->failure.code = f->code;
        out->failure.time_ns = f->time_ns;
        out->failure.is_from_another_rank = asking != f->origin_rank;
        memcpy(out->failure.reason, f->reason, sizeof out->failure.reason);
    }
}

/* Make room for one more: reclaim expired rooms when at capacity. */
static void sweep_locked(kvc_segment *seg, size_t *reclaimed)
{
    uint64_t now = kvc__now_ns(), ttl_ns = (uint64_t)seg->hdr->room_ttl_ms * 1000000ull;
    for (uint32_t i = 0; i < seg->hdr->room_slots; i++) {
        kvc_room *r = &seg->rooms[i];
        if (r->slot != KVC_SLOT_USED || now <= r->updated_ns + ttl_ns)
            continue;
        check_room(seg, r, now, NULL); /* records the timeout if not terminal */
        delete_slot(seg, i);
        if (reclaimed)
            (*reclaimed)++;
    }
}

static kvc_err create_room(kvc_segment *seg, uint64_t id, uint32_t participants, int64_t *slot)
{
    kvc_header *h = seg->hdr;
    if (h->room_counters.rooms_live >= h->max_rooms)
        sweep_locked(seg, NULL);
    if (h->room_counters.rooms_live >= h->max_rooms)
        return kvc__fail(KVC_E_FULL,
                         "room table of segment %s is full: %u active rooms (max "
                         "rooms %u); no active room is evicted",
                         seg->name, h->room_counters.rooms_live, h->max_rooms);
    int64_t i = find_free(seg, id);
    if (i < 0)
        return kvc__fail(KVC_E_FULL, "room table of segment %s has no free slot", seg->name);
    kvc_room *r = &seg->rooms[i];
    undo_begin(seg, r, sizeof *r, NULL, 0);
    memset(r, 0, sizeof *r);
    r->id = id;
    r->participants = participants;
    r->opened_ns = r->updated_ns = kvc__now_ns();
    r->terminal = -1;
    for (uint32_t p = 0; p < KVC_ROOM_MAX_PARTICIPANTS; p++)
        r->part[p].state = -1;
    KVC_INJECT("room.creating");
    r->slot = KVC_SLOT_USED;
    h->room_counters.rooms_live++;
    undo_end(seg);
    *slot = i;
    return KVC_OK;
}

/* ---- public API --------------------------------------------------------- */

static kvc_err check_participants(const kvc_segment *seg, uint32_t *participants)
{
    if (*participants == 0)
        *participants = seg->hdr->world_size;
    if (*participants > KVC_ROOM_MAX_PARTICIPANTS)
        return kvc__fail(KVC_E_INVAL, "a room has at most %d participants, not %u",
                         KVC_ROOM_MAX_PARTICIPANTS, *participants);
    return KVC_OK;
}

KVC_API kvc_err kvc_room_open(kvc_segment *seg, uint64_t room, uint32_t participants, uint32_t rank,
                              kvc_room_role role)
{
    KVC_ARG(seg);
    KVC_ROOM_ARG(room);
    if ((unsigned)role > KVC_ROOM_ROLE_DECODE)
        return kvc__fail(KVC_E_INVAL, "kvc_room_open: role %d out of range 0..2 (kvc_room_role)",
                         (int)role);
    uint32_t asked = participants;
    kvc_err e = check_participants(seg, &participants);
    if (e)
        return e;
    if ((e = lock_rooms(seg)))
        return e;
    uint32_t ep = atomic_load(&seg->hdr->room_epoch);
    int64_t i = find(seg, room);
    if (i < 0 && rank >= participants)
        e = kvc__fail(KVC_E_INVAL, "rank %u out of range for room %llu (participants 0..%u)", rank,
                      (unsigned long long)room, participants - 1);
    else if (i < 0)
        e = create_room(seg, room, participants, &i);
    kvc_room *r = e ? NULL : &seg->rooms[i];
    if (r && asked != 0 && asked != r->participants)
        e = kvc__fail(KVC_E_INVAL, "room %llu has %u participants, not %u",
                      (unsigned long long)room, r->participants, participants);
    else if (r && rank >= r->participants)
        e = kvc__fail(KVC_E_INVAL, "rank %u out of range for room %llu (participants 0..%u)", rank,
                      (unsigned long long)room, r->participants - 1);
    if (!e)
        seg->rooms_opened = true;
    if (!e && !(r->part[rank].pid == seg->pid && r->part[rank].start == seg->start)) {
        undo_begin(seg, r, sizeof *r, NULL, 0);
        r->part[rank].pid = seg->pid;
        r->part[rank].start = seg->start;
        r->part[rank].role = (uint8_t)role;
        r->part[rank].released = 0;
        r->updated_ns = kvc__now_ns();
        undo_end(seg);
    }
    unlock_rooms(seg, ep);
    return e;
}

static kvc_err find_room(kvc_segment *seg, uint64_t room, kvc_room **out)
{
    int64_t i = find(seg, room);
    if (i < 0)
        return kvc__fail(KVC_E_NOENT,
                         "no room %llu (never opened, released by all, or "
                         "reclaimed after its TTL)",
                         (unsigned long long)room);
    *out = &seg->rooms[i];
    return KVC_OK;
}

/* Find room and check rank is one of its participants (lock held). */
static kvc_err find_participant(kvc_segment *seg, uint64_t room, uint32_t rank, kvc_room **out)
{
    kvc_err e = find_room(seg, room, out);
    if (!e && rank >= (*out)->participants)
        e = kvc__fail(KVC_E_INVAL, "rank %u out of range for room %llu (participants 0..%u)", rank,
                      (unsigned long long)room, (*out)->participants - 1);
    return e;
}

/* Write rank's own state in r (lock held, r found and rank in range). */
static void set_state_locked(kvc_segment *seg, kvc_room *r, uint32_t rank, kvc_poll state)
{
    if (r->terminal >= 0)
        return;
    undo_begin(seg, r, sizeof *r, NULL, 0);
    r->part[rank].state = (int8_t)state;
    r->updated_ns = kvc__now_ns();
    KVC_INJECT("room.state_written");
    if (room_state(r) == KVC_POLL_SUCCESS)
        r->terminal = KVC_POLL_SUCCESS;
    undo_end(seg);
    if (state == KVC_POLL_FAILED) {
        char reason[64];
        snprintf(reason, sizeof reason, "rank %u reported Failed", rank);
        record_failure(seg, r, rank, 0, reason, seg->pid);
    }
}

KVC_API kvc_err kvc_room_set_state(kvc_segment *seg, uint64_t room, uint32_t rank, kvc_poll state)
{
    KVC_ARG(seg);
    KVC_ROOM_ARG(room);
    if ((unsigned)state > KVC_POLL_SUCCESS)
        return kvc__fail(KVC_E_INVAL, "kvc_room_set_state: KVPoll state %d out of range 0..4",
                         (int)state);
    kvc_err e = lock_rooms(seg);
    if (e)
        return e;
    uint32_t ep = atomic_load(&seg->hdr->room_epoch);
    kvc_room *r = NULL;
    e = find_participant(seg, room, rank, &r);
    if (!e)
        set_state_locked(seg, r, rank, state);
    unlock_rooms(seg, ep);
    return e;
}

KVC_API kvc_err kvc_room_sync(kvc_segment *seg, uint32_t rank, size_t n, const uint64_t *rooms,
                              const kvc_poll *states, kvc_poll *out, size_t *failed_at)
{
    KVC_ARG(seg);
    if (n && (!rooms || !out))
        return kvc__fail(KVC_E_INVAL, "kvc_room_sync: argument %s is NULL",
                         !rooms ? "rooms" : "out");
    for (size_t i = 0; i < n; i++) {
        if (failed_at)
            *failed_at = i;
        KVC_ROOM_ARG(rooms[i]);
        if (states && (unsigned)states[i] > KVC_POLL_SUCCESS)
            return kvc__fail(KVC_E_INVAL, "kvc_room_sync: KVPoll state %d out of range 0..4",
                             (int)states[i]);
    }
    kvc_err e = n ? lock_rooms(seg) : KVC_OK;
    if (e || !n)
        return e;
    uint32_t ep = atomic_load(&seg->hdr->room_epoch);
    struct alive_cache cache = {0};
    uint64_t now = kvc__now_ns();
    for (size_t i = 0; i < n && !e; i++) {
        kvc_room *r = NULL;
        if (failed_at)
            *failed_at = i;
        e = find_participant(seg, rooms[i], rank, &r);
        if (e)
            break;
        if (states)
            set_state_locked(seg, r, rank, states[i]);
        check_room(seg, r, now, &cache);
        out[i] = room_state(r);
    }
    unlock_rooms(seg, ep);
    return e;
}

KVC_API kvc_err kvc_room_fail(kvc_segment *seg, uint64_t room, uint32_t origin_rank, int32_t code,
                              const char *reason, int *kept)
{
    if (kept)
        *kept = 0;
    KVC_ARG(seg);
    KVC_ROOM_ARG(room);
    if (origin_rank >= seg->hdr->max_ranks)
        return kvc__fail(KVC_E_INVAL, "origin rank %u exceeds the segment's max ranks (%u)",
                         origin_rank, seg->hdr->max_ranks);
    kvc_err e = lock_rooms(seg);
    if (e)
        return e;
    uint32_t ep = atomic_load(&seg->hdr->room_epoch);
    int64_t i = find(seg, room);
    if (i < 0)
        e = create_room(seg, room, seg->hdr->world_size, &i);
    if (!e) {
        int k = record_failure(seg, &seg->rooms[i], origin_rank, code, reason,
                               seg->role == KVC_ROLE_DAEMON ? 0 : seg->pid);
        if (kept)
            *kept = k;
    }
    unlock_rooms(seg, ep);
    return e;
}

KVC_API kvc_err kvc_room_fail_adopt(kvc_segment *seg, uint64_t room, uint32_t origin_rank,
                                    int32_t code, const char *reason, uint64_t time_ns,
                                    int *changed)
{
    if (changed)
        *changed = 0;
    KVC_ARG(seg);
    KVC_ROOM_ARG(room);
    if (origin_rank >= seg->hdr->max_ranks)
        return kvc__fail(KVC_E_INVAL, "origin rank %u exceeds the segment's max ranks (%u)",
                         origin_rank, seg->hdr->max_ranks);
    kvc_err e = lock_rooms(seg);
    if (e)
        return e;
    uint32_t ep = atomic_load(&seg->hdr->room_epoch);
    int64_t i = find(seg, room);
    if (i < 0)
        e = create_room(seg, room, seg->hdr->world_size, &i);
    if (!e) {
        kvc_room *r = &seg->rooms[i];
        char want[KVC_REASON_MAX + 1];
        copy_reason(want, reason && *reason ? reason : "no reason given");
        if (!r->has_failure || r->failure.origin_rank != (int32_t)origin_rank ||
            r->failure.code != code || strcmp(r->failure.reason, want)) {
            write_failure(seg, r, origin_rank, code, want, 0, time_ns ? time_ns : kvc__now_ns());
            if (changed)
                *changed = 1;
        }
    }
    unlock_rooms(seg, ep);
    return e;
}

KVC_API uint32_t kvc_room_epoch(kvc_segment *seg)
{
    if (!seg) {
        kvc__fail(KVC_E_INVAL, "kvc_room_epoch: argument seg is NULL");
        return 0;
    }
    return atomic_load_explicit(&seg->hdr->room_epoch, memory_order_acquire);
}

KVC_API kvc_err kvc_room_wait_change(kvc_segment *seg, uint32_t seen, uint32_t timeout_ms)
{
    KVC_ARG(seg);
    uint64_t deadline = kvc__mono_ns() + (uint64_t)timeout_ms * 1000000ull;
    for (;;) {
        if (kvc_room_epoch(seg) != seen)
            return KVC_OK;
        uint64_t now = kvc__mono_ns();
        if (now >= deadline)
            return kvc__fail(KVC_E_TIMEDOUT, "rooms unchanged after %u ms", timeout_ms);
        kvc__futex_wait(&seg->hdr->room_epoch, seen,
                        (uint32_t)((deadline - now + 999999) / 1000000));
    }
}

KVC_API kvc_err kvc_room_get(kvc_segment *seg, uint64_t room, int32_t asking_rank,
                             kvc_room_info *out)
{
    KVC_ARG(seg);
    KVC_ARG(out);
    KVC_ROOM_ARG(room);
    kvc_err e = lock_rooms(seg);
    if (e)
        return e;
    uint32_t ep = atomic_load(&seg->hdr->room_epoch);
    kvc_room *r = NULL;
    e = find_room(seg, room, &r);
    if (!e) {
        check_room(seg, r, kvc__now_ns(), NULL);
        fill_info(r, asking_rank, out);
    }
    unlock_rooms(seg, ep);
    return e;
}

KVC_API kvc_err kvc_room_wait(kvc_segment *seg, uint64_t room, int32_t asking_rank, kvc_poll known,
                              uint32_t timeout_ms, kvc_room_info *out)
{
    KVC_ARG(seg);
    KVC_ARG(out);
    KVC_ROOM_ARG(room);
    if ((unsigned)known > KVC_POLL_SUCCESS)
        return kvc__fail(KVC_E_INVAL, "kvc_room_wait: known state %d out of range 0..4",
                         (int)known);
    uint64_t deadline = kvc__mono_ns() + (uint64_t)timeout_ms * 1000000ull;
    for (;;) {
        uint32_t ep = atomic_load_explicit(&seg->hdr->room_epoch, memory_order_acquire);
        kvc_err e = kvc_room_get(seg, room, asking_rank, out);
        if (e || out->state != known || out->has_failure)
            return e;
        uint64_t now = kvc__mono_ns();
        if (now >= deadline)
            return kvc__fail(KVC_E_TIMEDOUT, "room %llu still %s after %u ms",
                             (unsigned long long)room, kvc_poll_name(known), timeout_ms);
        uint64_t left = (deadline - now + 999999) / 1000000;
        kvc__futex_wait(&seg->hdr->room_epoch, ep,
                        (uint32_t)(left < LIVENESS_SLICE_MS ? left : LIVENESS_SLICE_MS));
    }
}

KVC_API int kvc_failure_text(const kvc_failure_info *f, char *buf, size_t cap)
{
    if (!buf)
        cap = 0; /* snprintf(NULL, 0, ...) only measures */
    if (!f)
        return snprintf(buf, cap, "no failure record");
    char code[48] = "";
    if (f->code)
        snprintf(code, sizeof code, "; code %d", (int)f->code);
    return snprintf(buf, cap, "KV transfer of room %llu failed on rank %u (%s%s): %s",
                    (unsigned long long)f->room, f->origin_rank,
                    f->is_from_another_rank ? "another rank" : "this rank", code, f->reason);
}

KVC_API kvc_err kvc_room_release(kvc_segment *seg, uint64_t room, uint32_t rank)
{
    KVC_ARG(seg);
    KVC_ROOM_ARG(room);
    kvc_err e = lock_rooms(seg);
    if (e)
        return e;
    uint32_t ep = atomic_load(&seg->hdr->room_epoch);
    kvc_room *r = NULL;
    e = find_participant(seg, room, rank, &r);
    if (!e) {
        undo_begin(seg, r, sizeof *r, NULL, 0);
        r->part[rank].released = 1;
        r->updated_ns = kvc__now_ns();
        undo_end(seg);
        uint32_t released = 0;
        for (uint32_t i = 0; i < r->participants; i++)
            released += r->part[i].released;
        if (released == r->participants)
            delete_slot(seg, (uint32_t)(r - seg->rooms));
    }
    unlock_rooms(seg, ep);
    return e;
}

KVC_API kvc_err kvc_room_sweep(kvc_segment *seg, size_t *reclaimed)
{
    if (reclaimed)
        *reclaimed = 0;
    KVC_ARG(seg);
    kvc_err e = lock_rooms(seg);
    if (e)
        return e;
    uint32_t ep = atomic_load(&seg->hdr->room_epoch);
    sweep_locked(seg, reclaimed);
    unlock_rooms(seg, ep);
    return KVC_OK;
}

KVC_API kvc_err kvc_room_list(kvc_segment *seg, int state_filter, kvc_room_info *out, size_t cap,
                              size_t *count)
{
    KVC_ARG(seg);
    KVC_ARG(count);
    if (cap)
        KVC_ARG(out);
    if (state_filter < -1 || state_filter > KVC_POLL_SUCCESS)
        return kvc__fail(KVC_E_INVAL, "kvc_room_list: state_filter %d out of range -1..4",
                         state_filter);
    kvc_err e = lock_rooms(seg);
    if (e)
        return e;
    size_t n = 0;
    for (uint32_t i = 0; i < seg->hdr->room_slots; i++) {
        const kvc_room *r = &seg->rooms[i];
        if (r->slot != KVC_SLOT_USED || (state_filter >= 0 && (int)room_state(r) != state_filter))
            continue;
        if (n < cap)
            fill_info(r, -1, &out[n]);
        n++;
    }
    kvc__unlock(seg, KVC_LOCK_ROOMS);
    *count = n;
    return KVC_OK;
}

KVC_API kvc_err kvc_failures_recent(kvc_segment *seg, kvc_failure_info *out, size_t cap,
                                    size_t *count)
{
    KVC_ARG(seg);
    KVC_ARG(count);
    if (cap)
        KVC_ARG(out);
    kvc_err e = lock_rooms(seg);
    if (e)
        return e;
    uint64_t total = seg->hdr->room_counters.failures_total;
    size_t n = 0;
    for (uint64_t k = total; k > 0 && n < cap && total - k < KVC_FAILURE_RING; k--, n++) {
        const kvc_failure_rec *f = &seg->failures[(k - 1) % KVC_FAILURE_RING];
        kvc_failure_info *o = &out[n];
        memset(o, 0, sizeof *o);
        o->room = f->room;
        o->origin_rank = (uint32_t)f->origin_rank;
        o->origin_pid = f->origin_pid;
        o->code = f->code;
        o->time_ns = f->time_ns;
        o->is_from_another_rank = 1;
        memcpy(o->reason, f->reason, sizeof o->reason);
    }
    kvc__unlock(seg, KVC_LOCK_ROOMS);
    *count = n;
    return KVC_OK;
}

kvc_err kvc__rooms_fail_proc(kvc_segment *seg, int32_t pid, uint64_t start, const char *how,
                             size_t *failed)
{
    kvc_err e = lock_rooms(seg);
    if (e)
        return e;
    uint32_t ep = atomic_load(&seg->hdr->room_epoch);
    for (uint32_t i = 0; i < seg->hdr->room_slots; i++) {
        kvc_room *r = &seg->rooms[i];
        if (r->slot != KVC_SLOT_USED || r->terminal >= 0)
            continue;
        for (uint32_t p = 0; p < r->participants; p++) {
            if (r->part[p].pid != pid || (start && r->part[p].start != start) ||
                r->part[p].released)
                continue;
            char reason[KVC_REASON_MAX + 1];
            snprintf(reason, sizeof reason, "rank %u (pid %d) %s", p, (int)pid, how);
            if (record_failure(seg, r, p, ESRCH, reason, 0) && failed)
                (*failed)++;
            break;
        }
    }
    unlock_rooms(seg, ep);
    return KVC_OK;
}
