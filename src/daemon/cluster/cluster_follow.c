/*
 * cluster_follow.c - which nodes follow which bootstrap rooms, so that a
 * node's death fails the rooms it shared.
 *
 * This node publishes follows/<node>/<room> under its lease for every room
 * of its segment that a local rank opened and that is not terminal yet
 * (looked at every FOLLOW_SCAN_MS, put and deleted many per transaction).
 * From the watch it learns which rooms the other nodes follow (the remote
 * map: (room, node) pairs).  When etcd deletes a node's record (its lease
 * ended: killed, frozen past its TTL, cut off, or stopped), every room of
 * this node's segment that the node followed, still open here and not
 * terminal, fails at once with the reason "node A left the cluster (its
 * lease ended)".  Nothing else fails a room: a watch that restarts, a slow
 * member, or this node's own outage only delay what etcd says.
 */

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "cluster_internal.h"
#include "log.h"

#define FOLLOW_SCAN_MS 100
#define FOLLOW_BATCH 64

/* ---- this node's rooms --------------------------------------------------- */

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* The rooms a local rank follows now (opened here, not terminal), sorted,
 * into f->cur; 0, or -1 when the segment could not be read. */
static int list_followed(struct cluster *c)
{
    struct cluster_follow *f = &c->follow;
    size_t n = 0;
    for (int tries = 0; tries < 3; tries++) {
        if (kvc_room_list(c->cfg.seg, -1, f->list, f->cap_list, &n) != KVC_OK)
            return -1;
        if (n <= f->cap_list)
            break;
        size_t cap = n + n / 4 + 16;
        kvc_room_info *l = realloc(f->list, cap * sizeof *l);
        uint64_t *cur = realloc(f->cur, cap * sizeof *cur);
        if (l)
            f->list = l;
        if (cur)
            f->cur = cur;
        if (!l || !cur)
            return -1;
        f->cap_list = cap;
    }
    if (n > f->cap_list)
        n = f->cap_list;
    f->ncur = 0;
    for (size_t i = 0; i < n; i++) {
        const kvc_room_info *r = &f->list[i];
        if (r->joined && r->state != KVC_POLL_FAILED && r->state != KVC_POLL_SUCCESS)
            f->cur[f->ncur++] = r->room;
    }
    if (f->ncur)
        qsort(f->cur, f->ncur, sizeof *f->cur, cmp_u64);
    return 0;
}

void cluster__follow_session(struct cluster *c)
{
    c->follow.npub = 0; /* a new lease: every followed room is put again */
    c->follow.next_scan = 0;
}

uint64_t cluster__follow_due(const struct cluster *c)
{
    uint64_t due = c->follow.next_scan;
    for (unsigned i = 0; i < c->follow.nleft; i++)
        if (c->follow.left[i].due < due)
            due = c->follow.left[i].due;
    return due;
}

/* Send ops[0..n) in one transaction under the node's lease. */
static int send_batch(struct cluster *c, struct etcd_op *ops, size_t n)
{
    if (!n)
        return 0;
    if (etcd_txn_batch(c->ses.ec, ops, n, c->ses.lease, NULL)) {
        if (strstr(etcd_error(c->ses.ec), "lease not found"))
            cluster__lease_gone(c, "a followed room's put found the lease gone");
        else
            cluster__etcd_failed(c, "followed rooms txn");
        return -1;
    }
    cluster__etcd_answered(c);
    return 0;
}

int cluster__follow_publish(struct cluster *c)
{
    struct cluster_follow *f = &c->follow;
    uint64_t now = kvc__mono_ns();
    if (now < f->next_scan)
        return 0;
    f->next_scan = now + FOLLOW_SCAN_MS * 1000000ull;
    if (!f->ncur && !f->npub) {
        kvc_segment_info si;
        if (kvc_segment_stat(c->cfg.seg, &si) == KVC_OK && si.rooms_live == 0)
            return 0; /* nothing followed, nothing published: no scan */
    }
    if (list_followed(c))
        return 0;
    /* The difference with what etcd was given, in key batches. */
    struct etcd_op ops[FOLLOW_BATCH];
    char keys[FOLLOW_BATCH][KEY_MAX];
    static const char val[] = "{}";
    size_t n = 0, i = 0, j = 0, puts = 0, dels = 0;
    while (i < f->ncur || j < f->npub) {
        int put;
        uint64_t room;
        if (j == f->npub || (i < f->ncur && f->cur[i] < f->pub[j])) {
            put = 1, room = f->cur[i++];
        } else if (i == f->ncur || f->pub[j] < f->cur[i]) {
            put = 0, room = f->pub[j++];
        } else {
            i++, j++;
            continue;
        }
        snprintf(keys[n], sizeof keys[n], "%sfollows/%s/%" PRIu64, c->cfg.prefix, c->cfg.node,
                 room);
        ops[n] = (struct etcd_op){keys[n], put ? val : NULL, put ? sizeof val - 1 : 0, !put};
        puts += put, dels += !put;
        if (++n == FOLLOW_BATCH) {
            if (send_batch(c, ops, n))
                return -1; /* etcd keeps what it had; the next look sends the rest */
            n = 0;
        }
    }
    if (send_batch(c, ops, n))
        return -1;
    /* etcd has cur now. */
    if (f->cap_pub < f->ncur) {
        uint64_t *p = realloc(f->pub, f->cap_list * sizeof *p);
        if (!p) {
            f->npub = 0;
            return 0;
        }
        f->pub = p, f->cap_pub = f->cap_list;
    }
    if (f->ncur)
        memcpy(f->pub, f->cur, f->ncur * sizeof *f->pub);
    f->npub = f->ncur;
    if (puts || dels) {
        pthread_mutex_lock(&c->fig.mu);
        c->fig.st.rooms_followed = (uint32_t)f->npub;
        pthread_mutex_unlock(&c->fig.mu);
    }
    return 0;
}

/* ---- the other nodes' rooms ---------------------------------------------- */

/* The index of a node name in the map's names, claimed when new; -1 when
 * FOLLOW_NODES names are in use. */
static int node_index(struct cluster *c, const char *node, int claim)
{
    struct cluster_follow *f = &c->follow;
    for (unsigned i = 0; i < f->nnames; i++)
        if (!strcmp(f->names[i], node))
            return (int)i;
    if (!claim)
        return -1;
    for (unsigned i = 0; i < f->nnames; i++)
        if (!f->names[i][0]) { /* freed when its node left */
            snprintf(f->names[i], sizeof f->names[i], "%s", node);
            return (int)i;
        }
    if (f->nnames == FOLLOW_NODES)
        return -1;
    snprintf(f->names[f->nnames], sizeof f->names[0], "%s", node);
    return (int)f->nnames++;
}

static size_t slot_of(uint64_t room, unsigned node, size_t cap)
{
    uint64_t h = (room ^ ((uint64_t)node << 48)) * 0x9E3779B97F4A7C15ull;
    return (size_t)(h >> 20) & (cap - 1);
}

enum { FE_FREE = 0, FE_USED, FE_TOMB };

static struct follow_entry *map_find(struct cluster_follow *f, uint64_t room, unsigned node)
{
    if (!f->cap)
        return NULL;
    for (size_t i = slot_of(room, node, f->cap), k = 0; k < f->cap;
         k++, i = (i + 1) & (f->cap - 1)) {
        struct follow_entry *e = &f->tab[i];
        if (e->st == FE_FREE)
            return NULL;
        if (e->st == FE_USED && e->room == room && e->node == node)
            return e;
    }
    return NULL;
}

static int map_grow(struct cluster_follow *f)
{
    size_t cap = f->cap ? f->cap : 1024;
    while ((f->used + 1) * 2 > cap)
        cap *= 2;
    struct follow_entry *t = calloc(cap, sizeof *t);
    if (!t)
        return -1;
    for (size_t i = 0; i < f->cap; i++) {
        struct follow_entry *e = &f->tab[i];
        if (e->st != FE_USED)
            continue;
        size_t k = slot_of(e->room, e->node, cap);
        while (t[k].st == FE_USED)
            k = (k + 1) & (cap - 1);
        t[k] = *e;
    }
    free(f->tab);
    f->tab = t, f->cap = cap, f->filled = f->used;
    return 0;
}

static void map_put(struct cluster *c, uint64_t room, unsigned node)
{
    struct cluster_follow *f = &c->follow;
    struct follow_entry *e = map_find(f, room, node);
    if (e) {
        e->stale = 0;
        return;
    }
    if ((f->filled + 1) * 10 > f->cap * 6 && map_grow(f))
        return;
    size_t i = slot_of(room, node, f->cap);
    while (f->tab[i].st == FE_USED)
        i = (i + 1) & (f->cap - 1);
    f->filled += f->tab[i].st == FE_FREE;
    f->tab[i] = (struct follow_entry){room, (uint16_t)node, FE_USED, 0};
    f->used++;
}

static void map_drop(struct cluster_follow *f, struct follow_entry *e)
{
    e->st = FE_TOMB;
    f->used--;
}

size_t cluster__room_followers(struct cluster *c, uint64_t room, char (*out)[CLUSTER_NAME_MAX + 1],
                               size_t max)
{
    struct cluster_follow *f = &c->follow;
    size_t n = 0;
    pthread_mutex_lock(&f->mu);
    for (unsigned i = 0; i < f->nnames && n < max; i++)
        if (f->names[i][0] && map_find(f, room, i))
            memcpy(out[n++], f->names[i], sizeof out[0]);
    pthread_mutex_unlock(&f->mu);
    return n;
}

static void follow_record(struct cluster *c, const char *node, uint64_t room, int is_delete);

void cluster__follow_record(struct cluster *c, const char *node, uint64_t room, int is_delete)
{
    pthread_mutex_lock(&c->follow.mu);
    follow_record(c, node, room, is_delete);
    pthread_mutex_unlock(&c->follow.mu);
}

static void follow_record(struct cluster *c, const char *node, uint64_t room, int is_delete)
{
    if (!strcmp(node, c->cfg.node) || room > KVC_ROOM_ID_MAX)
        return;
    int ni = node_index(c, node, !is_delete);
    if (ni < 0)
        return;
    if (!is_delete) {
        map_put(c, room, (unsigned)ni);
    } else {
        for (unsigned i = 0; i < c->follow.nleft; i++)
            if (c->follow.left[i].node == ni)
                return; /* its lease's end, deferred: the pairs decide then */
        struct follow_entry *e = map_find(&c->follow, room, (unsigned)ni);
        if (e)
            map_drop(&c->follow, e);
    }
}

/* Forget node ni's pairs (returns the rooms it followed, malloc'd, in
 * *out[0..*n)); its name is kept while keep_name. */
static void take_pairs(struct cluster_follow *f, int ni, uint64_t **out, size_t *n)
{
    size_t nr = 0, cap = 0;
    uint64_t *rooms = NULL;
    for (size_t i = 0; i < f->cap; i++) {
        struct follow_entry *e = &f->tab[i];
        if (e->st != FE_USED || e->node != (uint16_t)ni)
            continue;
        if (nr == cap) {
            size_t nc = cap ? cap * 2 : 64;
            uint64_t *p = realloc(rooms, nc * sizeof *p);
            if (!p)
                break;
            rooms = p, cap = nc;
        }
        rooms[nr++] = e->room;
        map_drop(f, e);
    }
    *out = rooms, *n = nr;
}

static void fail_shared(struct cluster *c, int ni, const char *node);

void cluster__follow_node_left(struct cluster *c, const char *node)
{
    struct cluster_follow *f = &c->follow;
    int ni = node_index(c, node, 0);
    if (ni < 0 || !strcmp(node, c->cfg.node))
        return;
    uint64_t now = kvc__mono_ns(), ttl = (uint64_t)c->cfg.ttl_s * 1000000000ull;
    /* Is this node's own lease alive?  If etcd revoked it too, the
     * departure may be etcd's doing (an outage, a paused member resuming),
     * not the node's death. */
    int64_t left = 1, granted = 0;
    if (c->ses.lease && etcd_lease_ttl(c->ses.ec, c->ses.lease, &left, &granted))
        c->ses.trouble_mono = now; /* no answer: our own trouble */
    else if (left <= 0)
        c->ses.trouble_mono = now;
    /* The watch's trouble is this node's too: a live node whose lease
     * lapsed in an outage that left this node's lease and requests alone
     * (their keep-alives fell on each side of the outage) is seen leaving
     * by a watch that went blind or slow meanwhile. */
    pthread_mutex_lock(&c->in.mu);
    uint64_t trouble = c->in.watch_trouble;
    pthread_mutex_unlock(&c->in.mu);
    if (c->ses.trouble_mono > trouble)
        trouble = c->ses.trouble_mono;
    if (trouble && now - trouble < 2 * ttl + 1000000000ull &&
        f->nleft < sizeof f->left / sizeof f->left[0]) {
        /* Right after this node's own trouble with etcd: the node may be
         * alive and only its lease lapsed in the outage.  It has a TTL
         * (and a second) to come back before its rooms fail. */
        for (unsigned i = 0; i < f->nleft; i++)
            if (f->left[i].node == ni)
                return;
        f->left[f->nleft].node = ni;
        f->left[f->nleft].due = now + ttl + 1000000000ull;
        f->nleft++;
        log_event(LOG_WARN, "node_left_deferred",
                  "node=%s note=\"its lease ended right after this node's trouble with etcd; "
                  "its shared rooms fail in %u s unless it comes back\"",
                  node, c->cfg.ttl_s + 1);
        return;
    }
    fail_shared(c, ni, node);
}

void cluster__follow_node_back(struct cluster *c, const char *node)
{
    struct cluster_follow *f = &c->follow;
    int ni = node_index(c, node, 0);
    for (unsigned i = 0; ni >= 0 && i < f->nleft; i++) {
        if (f->left[i].node != ni)
            continue;
        f->left[i] = f->left[--f->nleft];
        uint64_t *rooms;
        size_t n;
        pthread_mutex_lock(&f->mu);
        take_pairs(f, ni, &rooms, &n); /* it republishes what it follows now */
        pthread_mutex_unlock(&f->mu);
        free(rooms);
        log_event(LOG_INFO, "node_back",
                  "node=%s shared=%zu note=\"back before its rooms "
                  "failed: nothing failed\"",
                  node, n);
        return;
    }
}

void cluster__follow_tick(struct cluster *c)
{
    struct cluster_follow *f = &c->follow;
    uint64_t now = kvc__mono_ns();
    for (unsigned i = 0; i < f->nleft;) {
        if (f->left[i].due > now) {
            i++;
            continue;
        }
        int ni = f->left[i].node;
        f->left[i] = f->left[--f->nleft];
        char name[CLUSTER_NAME_MAX + 1];
        snprintf(name, sizeof name, "%s", f->names[ni]);
        fail_shared(c, ni, name);
    }
}

static void fail_shared(struct cluster *c, int ni, const char *node)
{
    struct cluster_follow *f = &c->follow;
    size_t nr = 0, failed = 0;
    uint64_t *rooms = NULL;
    pthread_mutex_lock(&f->mu);
    take_pairs(f, ni, &rooms, &nr);
    f->names[ni][0] = '\0';
    pthread_mutex_unlock(&f->mu);
    kvc_failure_info fi;
    memset(&fi, 0, sizeof fi);
    fi.origin_rank = KVC_ORIGIN_RANK_NONE;
    fi.code = EHOSTDOWN;
    snprintf(fi.reason, sizeof fi.reason, "node %s left the cluster (its lease ended)", node);
    snprintf(fi.origin_node, sizeof fi.origin_node, "%s", node);
    for (size_t k = 0; k < nr; k++) {
        kvc_room_info ri;
        if (kvc_room_get(c->cfg.seg, rooms[k], -1, &ri) != KVC_OK || !ri.joined ||
            ri.state == KVC_POLL_FAILED || ri.state == KVC_POLL_SUCCESS)
            continue; /* not followed here (any more), or decided already */
        fi.room = rooms[k];
        fi.time_ns = kvc__now_ns();
        int changed = 0;
        if (kvc_room_fail_mirror(c->cfg.seg, &fi, &changed) == KVC_OK && changed) {
            failed++;
            /* Published as this node's record of the room: a node that
             * only looked gone (frozen, cut off from etcd past its TTL)
             * and comes back learns from it that this side gave up the
             * room, instead of waiting for it until the room TTL; this
             * side's own later failure of the room is not recorded. */
            cluster__queue_failure(c, &fi);
            log_event(LOG_WARN, "room_failed_node_left", "room=%" PRIu64 " node=%s reason=\"%s\"",
                      rooms[k], node, fi.reason);
        }
    }
    free(rooms);
    if (nr)
        log_event(LOG_INFO, "node_left_rooms", "node=%s shared=%zu failed=%zu", node, nr, failed);
    STAT_ADD(c, rooms_failed_node_left, failed);
}

void cluster__follow_snapshot_begin(struct cluster *c)
{
    for (size_t i = 0; i < c->follow.cap; i++)
        c->follow.tab[i].stale = 1;
}

void cluster__follow_snapshot_end(struct cluster *c)
{
    struct cluster_follow *f = &c->follow;
    pthread_mutex_lock(&f->mu);
    for (size_t i = 0; i < f->cap; i++) {
        int deferred = 0; /* a departed node's pairs wait for its verdict */
        for (unsigned k = 0; k < f->nleft; k++)
            deferred |= f->left[k].node == f->tab[i].node;
        if (f->tab[i].st == FE_USED && f->tab[i].stale && !deferred)
            map_drop(f, &f->tab[i]);
    }
    pthread_mutex_unlock(&f->mu);
    pthread_mutex_lock(&c->fig.mu);
    c->fig.st.rooms_shared = (uint32_t)f->used;
    pthread_mutex_unlock(&c->fig.mu);
}

void cluster__follow_count(struct cluster *c)
{
    pthread_mutex_lock(&c->fig.mu);
    c->fig.st.rooms_shared = (uint32_t)c->follow.used;
    pthread_mutex_unlock(&c->fig.mu);
}

void cluster__follow_free(struct cluster *c)
{
    free(c->follow.tab);
    free(c->follow.list);
    free(c->follow.cur);
    free(c->follow.pub);
}
