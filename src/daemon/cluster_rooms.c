/*
 * cluster_rooms.c - room failures across the cluster: this node's new
 * failure records queued and published create-only under short leases (the
 * first record of a room wins cluster-wide), and the records of other nodes
 * (or of the winner of a race) taken into this node's segment.
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

/* Take a room record of another node (or the winner of a race).  Returns
 * 1 when the record is this node's own (published earlier: nothing to
 * take), else 0. */
int cluster__adopt_room(struct cluster *c, const char *value, size_t len)
{
    json_error_t je;
    json_t *o = json_loadb(value, len, 0, &je);
    json_t *room = json_object_get(o, "room"), *rank = json_object_get(o, "origin_rank");
    const char *reason = json_string_value(json_object_get(o, "reason"));
    const char *node = json_string_value(json_object_get(o, "node"));
    if (!json_is_integer(room) || !json_is_integer(rank) || !reason || !node ||
        !strcmp(node, c->cfg.node)) {
        int own = node && !strcmp(node, c->cfg.node);
        json_decref(o);
        return own;
    }
    int changed = 0;
    uint64_t id = (uint64_t)json_integer_value(room);
    adopted_add(c, id);
    kvc_err e =
        kvc_room_fail_adopt(c->cfg.seg, id, (uint32_t)json_integer_value(rank),
                            (int32_t)json_integer_value(json_object_get(o, "code")), reason,
                            (uint64_t)json_integer_value(json_object_get(o, "time_ns")), &changed);
    if (e != KVC_OK)
        log_event(LOG_WARN, "room_adopt_failed", "room=%" PRIu64 " origin=%s err=\"%s\"", id, node,
                  kvc_last_error());
    else if (changed) {
        STAT_ADD(c, rooms_adopted, 1);
        log_event(LOG_INFO, "room_failure_mirrored",
                  "room=%" PRIu64 " origin=%s origin_rank=%" JSON_INTEGER_FORMAT " reason=\"%s\"",
                  id, node, json_integer_value(rank), reason);
    }
    json_decref(o);
    return 0;
}

/* Queue the failures recorded since the last look (failures_seen) for
 * publishing, leaving out those recorded before not_before_ns (CLOCK_
 * REALTIME; 0: none left out) and the ones taken from other nodes. */
void cluster__scan_failures(struct cluster *c, uint64_t not_before_ns)
{
    kvc_segment_info si;
    if (kvc_segment_stat(c->cfg.seg, &si) != KVC_OK || si.failures_total == c->rooms.failures_seen)
        return;
    uint64_t d = si.failures_total - c->rooms.failures_seen;
    if (d > KVC_FAILURE_RING)
        d = KVC_FAILURE_RING;
    kvc_failure_info *f = calloc(d, sizeof *f);
    size_t n = 0;
    if (!f || kvc_failures_recent(c->cfg.seg, f, d, &n) != KVC_OK) {
        free(f);
        return;
    }
    c->rooms.failures_seen = si.failures_total;
    for (size_t i = n; i-- > 0;) { /* oldest first */
        if (f[i].time_ns < not_before_ns || adopted_has(c, f[i].room))
            continue;
        if (c->rooms.npending >= PENDING_ROOMS_MAX) {
            log_event(LOG_WARN, "room_failure_not_published",
                      "room=%" PRIu64 " note=\"%d failures wait for etcd already\"", f[i].room,
                      PENDING_ROOMS_MAX);
            continue;
        }
        struct pending_room *p = &c->rooms.pending[c->rooms.npending++];
        p->room = f[i].room;
        p->origin_rank = f[i].origin_rank;
        p->code = f[i].code;
        p->time_ns = f[i].time_ns;
        snprintf(p->reason, sizeof p->reason, "%s", f[i].reason);
    }
    free(f);
}

/* Publish the pending failures, create-only: the first record of a room
 * wins cluster-wide; a node that loses takes the winner's record. */
int cluster__publish_rooms(struct cluster *c)
{
    size_t done = 0;
    int rc = 0;
    for (; done < c->rooms.npending; done++) {
        struct pending_room *p = &c->rooms.pending[done];
        uint64_t now = kvc__mono_ns();
        if (!c->rooms.room_lease || now - c->rooms.room_lease_mono > 1000000000ull) {
            /* One lease per second of failures: the key outlives the room
             * TTL by at most a second. */
            if (etcd_lease_grant(c->ses.ec, c->cfg.room_ttl_s + 1, &c->rooms.room_lease)) {
                c->rooms.room_lease = 0;
                cluster__etcd_failed(c, "room lease grant");
                rc = -1;
                break;
            }
            c->rooms.room_lease_mono = now;
        }
        json_t *o =
            json_pack("{s:I, s:I, s:i, s:s, s:I, s:s}", "room", (json_int_t)p->room, "origin_rank",
                      (json_int_t)p->origin_rank, "code", (int)p->code, "reason", p->reason,
                      "time_ns", (json_int_t)p->time_ns, "node", c->cfg.node);
        char *val = o ? json_dumps(o, JSON_COMPACT) : NULL;
        json_decref(o);
        if (!val)
            break;
        char key[200];
        snprintf(key, sizeof key, "%srooms/%" PRIu64, c->cfg.prefix, p->room);
        int created = 0;
        etcd_kv cur = {0};
        int r = etcd_put_create(c->ses.ec, key, val, strlen(val), c->rooms.room_lease, &created,
                                &cur, NULL);
        free(val);
        if (r) {
            if (strstr(etcd_error(c->ses.ec), "lease not found")) {
                c->rooms.room_lease = 0;
                done--; /* again, with a new lease */
                continue;
            }
            cluster__etcd_failed(c, "room txn");
            rc = -1;
            break;
        }
        cluster__etcd_answered(c);
        if (created) {
            STAT_ADD(c, rooms_published, 1);
        } else if (!cur.value || !cluster__adopt_room(c, cur.value, cur.value_len)) {
            STAT_ADD(c, rooms_lost_race, 1);
        } /* else: this node's own record, published before a restart */
        etcd_kv_free(&cur);
    }
    memmove(c->rooms.pending, c->rooms.pending + done,
            (c->rooms.npending - done) * sizeof *c->rooms.pending);
    c->rooms.npending -= done;
    return rc;
}
