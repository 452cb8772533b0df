/*
 * cluster_rooms.c - room failures across the cluster: this node's new
 * failure records queued and published create-only under the node's lease
 * (the first record of a room wins cluster-wide; the key is deleted once
 * the room TTL has passed), and the records of other nodes (or of the winner of a
 * race) taken into this node's segment with their provenance.
 */

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "cluster_internal.h"
#include "log.h"

static int adopted_has(const struct cluster *c, uint64_t room)
{
    size_t n = c->rooms.nadopted < ADOPTED_RING ? c->rooms.nadopted : ADOPTED_RING;
    for (size_t i = 0; i < n; i++)
        if (c->rooms.adopted[i] == room)
            return 1;
    return 0;
}

static void adopted_add(struct cluster *c, uint64_t room)
{
    c->rooms.adopted[c->rooms.nadopted++ % ADOPTED_RING] = room;
}

/* Take a room record of another node (or the winner of a race), keeping
 * its provenance (origin node, rank, pid, code).  Returns 1 when the
 * record is this node's own (published earlier: nothing to take), else 0. */
int cluster__adopt_room(struct cluster *c, const char *value, size_t len)
{
    json_error_t je;
    json_t *o = json_loadb(value, len, 0, &je);
    json_t *room = json_object_get(o, "room"), *rank = json_object_get(o, "origin_rank");
    const char *reason = json_string_value(json_object_get(o, "reason"));
    const char *node = json_string_value(json_object_get(o, "node"));
    if (!json_is_integer(room) || !json_is_integer(rank) || !reason || !node ||
        !strcmp(node, c->cfg.node) || !cluster_name_ok(node) || json_integer_value(room) < 0) {
        int own = node && !strcmp(node, c->cfg.node);
        json_decref(o);
        return own;
    }
    int changed = 0;
    uint64_t id = (uint64_t)json_integer_value(room);
    adopted_add(c, id);
    kvc_failure_info f;
    memset(&f, 0, sizeof f);
    f.room = id;
    f.origin_rank = (uint32_t)json_integer_value(rank);
    f.origin_pid = (int32_t)json_integer_value(json_object_get(o, "pid")); /* 0 if absent */
    f.code = (int32_t)json_integer_value(json_object_get(o, "code"));
    f.time_ns = (uint64_t)json_integer_value(json_object_get(o, "time_ns"));
    snprintf(f.reason, sizeof f.reason, "%s", reason);
    snprintf(f.origin_node, sizeof f.origin_node, "%s", node);
    kvc_err e = kvc_room_fail_mirror(c->cfg.seg, &f, &changed);
    if (e != KVC_OK)
        log_event(LOG_WARN, "room_adopt_failed", "room=%" PRIu64 " origin=%s err=\"%s\"", id, node,
                  kvc_last_error());
    else if (changed) {
        STAT_ADD(c, rooms_adopted, 1);
        log_event(LOG_INFO, "room_failure_mirrored",
                  "room=%" PRIu64 " origin=%s origin_rank=%" JSON_INTEGER_FORMAT
                  " origin_pid=%d reason=\"%s\"",
                  id, node, json_integer_value(rank), (int)f.origin_pid, reason);
    }
    json_decref(o);
    return 0;
}

char *cluster__room_record(const struct cluster *c, const struct pending_room *p)
{
    json_t *o =
        json_pack("{s:I, s:I, s:i, s:s, s:I, s:s, s:i}", "room", (json_int_t)p->room, "origin_rank",
                  (json_int_t)p->origin_rank, "code", (int)p->code, "reason", p->reason, "time_ns",
                  (json_int_t)p->time_ns, "node", c->cfg.node, "pid", (int)p->pid);
    char *val = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    return val;
}

/* Queue the failures recorded since the last look (failures_seen) for
 * publishing, leaving out those recorded before not_before_ns (CLOCK_
 * REALTIME; 0: none left out) and the ones taken from other nodes. */
kvc_failure_info *cluster__failures_since(struct cluster *c, uint64_t *seen, size_t *n)
{
    /* kvc_failures_recent() gives the newest d records as of its own look:
     * a record added between the count and the read would push the oldest
     * of the d out of the answer, and *seen past it, for good.  So the
     * count is taken again after the read, and the read repeated until
     * both agree (a storm of failures that never lets them: the last read,
     * as before). */
    for (int attempt = 0;; attempt++) {
        kvc_segment_info si, after;
        *n = 0;
        if (kvc_segment_stat(c->cfg.seg, &si) != KVC_OK || si.failures_total == *seen)
            return NULL;
        uint64_t d = si.failures_total - *seen;
        if (d > KVC_FAILURE_RING)
            d = KVC_FAILURE_RING;
        kvc_failure_info *f = calloc(d, sizeof *f);
        if (!f || kvc_failures_recent(c->cfg.seg, f, d, n) != KVC_OK) {
            free(f);
            *n = 0;
            return NULL;
        }
        if (attempt < FAILURES_READ_TRIES && kvc_segment_stat(c->cfg.seg, &after) == KVC_OK &&
            after.failures_total != si.failures_total) {
            free(f);
            continue;
        }
        *seen = si.failures_total;
        return f;
    }
}

int cluster__queue_failure(struct cluster *c, const kvc_failure_info *f)
{
    if (c->rooms.npending >= PENDING_ROOMS_MAX) {
        log_event(LOG_WARN, "room_failure_not_published",
                  "room=%" PRIu64 " note=\"%d failures wait for etcd already\"", f->room,
                  PENDING_ROOMS_MAX);
        return 0;
    }
    struct pending_room *p = &c->rooms.pending[c->rooms.npending++];
    p->room = f->room;
    p->origin_rank = f->origin_rank;
    p->code = f->code;
    p->pid = f->origin_pid;
    p->time_ns = f->time_ns;
    snprintf(p->reason, sizeof p->reason, "%s", f->reason);
    return 1;
}

void cluster__scan_failures(struct cluster *c, uint64_t not_before_ns)
{
    size_t n;
    kvc_failure_info *f = cluster__failures_since(c, &c->rooms.failures_seen, &n);
    if (!f)
        return;
    for (size_t i = n; i-- > 0;) { /* oldest first */
        if (f[i].time_ns < not_before_ns || f[i].from_another_node || adopted_has(c, f[i].room))
            continue;
        cluster__queue_failure(c, &f[i]);
    }
    free(f);
}

/* Remember a rooms/<id> key this node created, to delete it once the room
 * TTL has passed. */
static void published_add(struct cluster *c, uint64_t room)
{
    struct cluster_rooms *R = &c->rooms;
    if (R->pub_head && R->pub_head * 2 >= R->npub + R->pub_head) { /* compact */
        memmove(R->pub, R->pub + R->pub_head, R->npub * sizeof *R->pub);
        R->pub_head = 0;
    }
    if (R->pub_head + R->npub == R->cap_pub) {
        size_t cap = R->cap_pub ? R->cap_pub * 2 : 256;
        struct published_room *p = realloc(R->pub, cap * sizeof *p);
        if (!p)
            return; /* the key then lives until the node's lease ends */
        R->pub = p, R->cap_pub = cap;
    }
    R->pub[R->pub_head + R->npub++] = (struct published_room){room, kvc__mono_ns()};
}

/* Delete the rooms/<id> keys older than the room TTL (their rooms are
 * gone everywhere), many per transaction.  0, or -1 when etcd failed. */
static int expire_published(struct cluster *c)
{
    struct cluster_rooms *R = &c->rooms;
    uint64_t now = kvc__mono_ns(), ttl = (uint64_t)c->cfg.room_ttl_s * 1000000000ull;
    while (R->npub && R->pub[R->pub_head].mono + ttl < now) {
        struct etcd_op ops[64];
        char keys[64][KEY_MAX];
        size_t n = 0;
        while (n < 64 && n < R->npub && R->pub[R->pub_head + n].mono + ttl < now) {
            snprintf(keys[n], sizeof keys[n], "%srooms/%" PRIu64, c->cfg.prefix,
                     R->pub[R->pub_head + n].room);
            ops[n] = (struct etcd_op){keys[n], NULL, 0, 1};
            n++;
        }
        if (etcd_txn_batch(c->ses.ec, ops, n, 0, NULL)) {
            cluster__etcd_failed(c, "room key delete");
            return -1;
        }
        cluster__etcd_answered(c);
        R->pub_head += n;
        R->npub -= n;
    }
    if (!R->npub)
        R->pub_head = 0;
    return 0;
}

void cluster__rooms_session(struct cluster *c)
{
    struct cluster_rooms *R = &c->rooms;
    size_t queued = 0, gone = 0;
    for (size_t i = 0; i < R->npub; i++) {
        uint64_t room = R->pub[R->pub_head + i].room;
        kvc_room_info ri;
        /* Whatever its origin: this node put it (its own failure, or the
         * room it failed for a departed node, cluster__queue_failure). */
        if (kvc_room_get(c->cfg.seg, room, -1, &ri) != KVC_OK || !ri.has_failure) {
            gone++; /* reclaimed: its TTL has passed here, and so on the other nodes */
            continue;
        }
        queued += (size_t)cluster__queue_failure(c, &ri.failure);
    }
    if (queued || gone)
        log_event(LOG_INFO, "room_failures_republished",
                  "rooms=%zu gone=%zu note=\"the room records of the lost lease, put again "
                  "under the new one\"",
                  queued, gone);
    R->npub = R->pub_head = 0;
}

/* Publish the pending failures, create-only, under the node's lease: the
 * first record of a room wins cluster-wide; a node that loses takes the
 * winner's record. */
int cluster__publish_rooms(struct cluster *c)
{
    size_t done = 0;
    int rc = 0;
    for (; done < c->rooms.npending; done++) {
        struct pending_room *p = &c->rooms.pending[done];
        char *val = cluster__room_record(c, p);
        if (!val)
            break;
        char key[200];
        snprintf(key, sizeof key, "%srooms/%" PRIu64, c->cfg.prefix, p->room);
        int created = 0;
        etcd_kv cur = {0};
        int r =
            etcd_put_create(c->ses.ec, key, val, strlen(val), c->ses.lease, &created, &cur, NULL);
        free(val);
        if (r) {
            if (strstr(etcd_error(c->ses.ec), "lease not found"))
                cluster__lease_gone(c, "a room failure's put found the lease gone");
            else
                cluster__etcd_failed(c, "room txn");
            rc = -1;
            break;
        }
        cluster__etcd_answered(c);
        if (created) {
            STAT_ADD(c, rooms_published, 1);
            published_add(c, p->room);
        } else if (!cur.value || !cluster__adopt_room(c, cur.value, cur.value_len)) {
            STAT_ADD(c, rooms_lost_race, 1);
        } else {
            /* This node's own record: published before a restart, or by a
             * put that timed out while etcd hung and was carried out
             * after.  Under an earlier lease it goes with that lease, so it
             * is put again under this one; either way it is this session's
             * to put again if this lease is lost too. */
            if (cur.lease != c->ses.lease &&
                etcd_put(c->ses.ec, key, cur.value, cur.value_len, c->ses.lease, NULL)) {
                etcd_kv_free(&cur);
                cluster__etcd_failed(c, "room record re-put");
                rc = -1;
                break;
            }
            published_add(c, p->room);
        }
        etcd_kv_free(&cur);
    }
    memmove(c->rooms.pending, c->rooms.pending + done,
            (c->rooms.npending - done) * sizeof *c->rooms.pending);
    c->rooms.npending -= done;
    if (!rc && c->ses.lease)
        rc = expire_published(c);
    return rc;
}
