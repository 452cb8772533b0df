/*
 * rooms_ring.c - failure records: a room's own record and the node's
 * failure ring (KVC_FAILURE_RING entries, newest last), which keeps a copy
 * of every record for kvc_failures_recent even after its room is gone.
 *
 * A writer claims the next ring entry with a compare-and-swap of its claim
 * word (odd while claimed, naming the writer's stripe), writes the record
 * into its room and the entry in one update (rooms_update.c), and releases
 * the claim; the stripe's recovery finishes or rolls back an entry its dead
 * writer held.  Readers copy an entry under its claim word as under a seq
 * and skip one that holds another record.
 *
 * Lock rule: kvc__ring_claim, kvc__put_failure and kvc__record_failure run
 * with the room's stripe lock held, inside one update (called by rooms.c,
 * rooms_update.c and rooms_liveness.c); kvc_failures_recent and
 * kvc_failure_text take no lock (public API).
 */
#include <sched.h>
#include <stdio.h>
#include <string.h>

#include "rooms_internal.h"

/* An append that will not be made: uncount it if it is still the last. */
void kvc__ring_give_back(kvc_header *h, kvc_undo *un)
{
    uint64_t n = un->ring_n;
    if (n)
        atomic_compare_exchange_strong(&h->failures_total, &n, n - 1);
    un->ring_n = 0;
}

/* Claim the next failure ring entry for stripe s's writer.  The entry's
 * offset goes into the undo record before the claim, so the stripe's
 * recovery can finish an entry its dead writer claimed.  NULL when another
 * writer (1024 appends ago, stopped or dead) still holds the entry: the
 * record is then kept in its room only. */
kvc_failure_slot *kvc__ring_claim(kvc__upd *u)
{
    kvc_header *h = u->seg->hdr;
    kvc_undo *un = &u->st->undo;
    un->ring_n = 0;
    uint64_t k = atomic_fetch_add(&h->failures_total, 1);
    un->ring_n = k + 1;
    kvc_failure_slot *f = &u->seg->failures[k % KVC_FAILURE_RING];
    un->ring_off = (uint64_t)((unsigned char *)f - u->seg->base);
    for (int spins = 0; spins < KVC__RING_SPINS; spins++) {
        uint64_t c = atomic_load(&f->claim);
        if ((c >> 32) & 1) {
            sched_yield();
            continue;
        }
        uint64_t mine = (((c >> 32) + 1) << 32) | (u->s + 1);
        if (atomic_compare_exchange_strong(&f->claim, &c, mine)) {
            kvc_seq_write_prepare(); /* the claim (odd) before the entry's bytes */
            KVC_INJECT("room.ring_claimed");
            u->ring_n = k + 1;
            return f;
        }
    }
    un->ring_off = 0;
    kvc__ring_give_back(h, un);
    return NULL;
}

void kvc__ring_release(kvc_failure_slot *f)
{
    uint64_t c = atomic_load(&f->claim);
    kvc__assert(((c >> 32) & 1) && "released by the writer that claimed it (odd)");
    atomic_store_explicit(&f->claim, ((c >> 32) + 1) << 32, memory_order_release);
}

/* Copy at most KVC_REASON_MAX bytes, never cutting a UTF-8 sequence. */
void kvc__copy_reason(char *dst, const char *src)
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

/* Inside an update with a ring entry: write the room's failure record
 * (replacing any it had) and its copy in the ring. */
void kvc__put_failure(kvc__upd *u, uint32_t origin, int32_t code, const char *reason, int32_t pid,
                      uint64_t time_ns, const char *node, uint32_t flags)
{
    kvc_room *r = &u->w;
    kvc_failure_rec *f = &r->failure;
    f->room = r->id;
    f->time_ns = time_ns;
    f->origin_rank = (int32_t)origin;
    f->origin_pid = pid;
    f->code = code;
    f->flags = flags;
    kvc__copy_reason(f->reason, reason && *reason ? reason : "no reason given");
    memset(f->node, 0, sizeof f->node);
    if (node)
        snprintf(f->node, sizeof f->node, "%s", node);
    KVC_INJECT("room.failure_half");
    u->failure = true;
    r->has_failure = 1;
    r->terminal = KVC_POLL_FAILED;
    r->updated_ns = time_ns;
    r->updated_mono = kvc__seg_mono_coarse_ns();
    if (u->ring) { /* claimed: its seq is odd (kvc__ring_claim) */
        kvc_seq_store(&u->ring->n, &u->ring_n, sizeof u->ring->n);
        kvc_seq_store(&u->ring->rec, f, sizeof *f);
    }
}

/* Record the first failure of room r in stripe s (lock held); 1 if kept. */
int kvc__record_failure(kvc_segment *seg, uint32_t s, kvc_room *r, uint32_t origin, int32_t code,
                        const char *reason, int32_t pid)
{
    if (r->has_failure || r->terminal == KVC_POLL_SUCCESS)
        return 0;
    kvc__upd u;
    uint64_t now = kvc__now_ns(); /* a failure's time is shown: the precise clock */
    char node[KVC_NODE_NAME_MAX + 1];
    kvc__node_name(seg, node);
    (void)kvc__upd_begin(&u, seg, s, r, kvc__room_len_failure(), 1);
    kvc__put_failure(&u, origin, code, reason, pid, now, node, 0);
    kvc__upd_commit(&u, now);
    return 1;
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
    if (f->from_another_node && f->origin_node[0]) {
        if (f->origin_rank == KVC_ORIGIN_RANK_NONE)
            return snprintf(buf, cap,
                            "KV transfer of room %llu failed on node %s (another node, no rank "
                            "recorded it%s): %s",
                            (unsigned long long)f->room, f->origin_node, code, f->reason);
        return snprintf(buf, cap,
                        "KV transfer of room %llu failed on rank %u of node %s (another node%s): "
                        "%s",
                        (unsigned long long)f->room, f->origin_rank, f->origin_node, code,
                        f->reason);
    }
    if (f->origin_rank == KVC_ORIGIN_RANK_NONE)
        return snprintf(buf, cap,
                        "KV transfer of room %llu failed (timed out, no rank recorded it%s): %s",
                        (unsigned long long)f->room, code, f->reason);
    if (f->is_from_another_rank < 0) /* an outside observer: no rank of its own */
        return snprintf(buf, cap, "KV transfer of room %llu failed on rank %u%s%s%s: %s",
                        (unsigned long long)f->room, f->origin_rank, *code ? " (" : "",
                        *code ? code + 2 : "", *code ? ")" : "", f->reason);
    return snprintf(buf, cap, "KV transfer of room %llu failed on rank %u (%s%s): %s",
                    (unsigned long long)f->room, f->origin_rank,
                    f->is_from_another_rank ? "another rank" : "this rank", code, f->reason);
}

/* Copy ring entry k (0-based index of the append) under its claim word;
 * false when it holds another record (rolled back, or overwritten) or stays
 * claimed by a writer that does not finish. */
static bool ring_read(kvc_segment *seg, uint64_t k, kvc_failure_rec *out)
{
    const kvc_failure_slot *f = &seg->failures[k % KVC_FAILURE_RING];
    for (int spins = 0; spins < KVC__RING_SPINS; spins++) {
        uint64_t c1 = kvc_seq_read_begin(&f->claim); /* its seq: the top half */
        if ((c1 >> 32) & 1) {
            sched_yield();
            continue;
        }
        uint64_t n;
        kvc_seq_load(&n, &f->n, sizeof n);
        kvc_seq_load(out, &f->rec, sizeof *out);
        if (kvc_seq_read_retry(&f->claim, c1))
            continue;
        out->reason[KVC_REASON_MAX] = '\0';
        return n == k + 1;
    }
    return false;
}

bool kvc__ring_find(kvc_segment *seg, uint64_t room, kvc_failure_rec *out)
{
    uint64_t total = atomic_load(&seg->hdr->failures_total);
    for (uint64_t k = total; k > 0 && total - k < KVC_FAILURE_RING; k--) {
        /* A peek at the id first (one line per entry, no claim word): only
         * an entry that may be room's is read under its claim word. */
        uint64_t id;
        kvc_seq_load(&id, &seg->failures[(k - 1) % KVC_FAILURE_RING].rec.room, sizeof id);
        if (id == room && ring_read(seg, k - 1, out) && out->room == room)
            return true;
    }
    return false;
}

void kvc__room_refail(kvc_segment *seg, uint32_t s, kvc_room *r, const kvc_failure_rec *f)
{
    kvc__upd u;
    uint64_t now = kvc__now_coarse_ns();
    kvc_room *w = kvc__upd_begin(&u, seg, s, r, kvc__room_len_failure(), 0);
    u.failure = true;
    w->failure = *f;
    w->has_failure = 1;
    w->terminal = KVC_POLL_FAILED;
    w->updated_ns = now;
    w->updated_mono = kvc__seg_mono_coarse_ns();
    kvc__upd_commit(&u, now);
}

void kvc__ring_origins(kvc_segment *seg, const uint64_t *rooms, int32_t *origin, size_t n)
{
    size_t left = n;
    for (size_t i = 0; i < n; i++)
        origin[i] = -1;
    uint64_t total = atomic_load(&seg->hdr->failures_total);
    for (uint64_t k = total; k > 0 && left && total - k < KVC_FAILURE_RING; k--) {
        const kvc_failure_slot *f = &seg->failures[(k - 1) % KVC_FAILURE_RING];
        uint64_t room = 0, at = 0;
        int32_t pid = 0;
        bool read = false;
        for (int spins = 0; spins < KVC__RING_SPINS && !read; spins++) {
            uint64_t c1 = kvc_seq_read_begin(&f->claim);
            if ((c1 >> 32) & 1) {
                sched_yield();
                continue;
            }
            kvc_seq_load(&at, &f->n, sizeof at);
            kvc_seq_load(&room, &f->rec.room, sizeof room);
            kvc_seq_load(&pid, &f->rec.origin_pid, sizeof pid);
            read = !kvc_seq_read_retry(&f->claim, c1);
        }
        if (!read || at != k)
            continue;
        for (size_t i = 0; i < n; i++)
            if (origin[i] == -1 && rooms[i] == room) {
                origin[i] = pid;
                left--;
            }
    }
}

KVC_API kvc_err kvc_failures_recent(kvc_segment *seg, kvc_failure_info *out, size_t cap,
                                    size_t *count)
{
    KVC_ARG(seg);
    KVC_ARG(count);
    if (cap)
        KVC_ARG(out);
    uint64_t total = atomic_load(&seg->hdr->failures_total);
    size_t n = 0;
    for (uint64_t k = total; k > 0 && n < cap && total - k < KVC_FAILURE_RING; k--) {
        kvc_failure_rec f;
        if (!ring_read(seg, k - 1, &f))
            continue;
        kvc_failure_info *o = &out[n++];
        memset(o, 0, sizeof *o);
        o->room = f.room;
        o->origin_rank = (uint32_t)f.origin_rank;
        o->origin_pid = f.origin_pid;
        o->code = f.code;
        o->time_ns = f.time_ns;
        o->is_from_another_rank = 1;
        memcpy(o->reason, f.reason, sizeof o->reason);
        memcpy(o->origin_node, f.node, sizeof o->origin_node);
        o->origin_node[KVC_NODE_NAME_MAX] = '\0';
        o->from_another_node = (f.flags & KVC__FAIL_OTHER_NODE) != 0;
    }
    *count = n;
    return KVC_OK;
}
