/*
 * cluster_pd.c - the PD prefill tables in the cluster view: this node's
 * table published as one record, pd/<node> (pd_record.h), under the node's
 * lease like its ranks, and the other nodes' records mirrored into
 * kvcoordd's memory (pd_mirror.h), where GET /route finds them.
 *
 * Publishing: the cluster thread looks at the segment's table on each of
 * its turns (at least once a second) and puts the record when it differs
 * from what etcd was last given, deleting the key once the table has no
 * topology (its last live entry ended).  The liveness rules are the
 * segment's: an entry whose registering process ends is withdrawn there
 * (kvc_pd_reap), so the next record says so.  A new session (a lease
 * granted) puts it again.
 *
 * Mirroring: a record of another node replaces what was known of that
 * node; its deletion (withdrawn, the node's lease ended) removes it; a
 * snapshot replaces them all; the mirror is dropped with the ranks' when
 * the watch stays unconfirmed past the leases (cluster__drop_unverified).
 */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "cluster_internal.h"
#include "log.h"

#define PD_LOOK_NS 100000000ull /* the segment's table looked at most every 100 ms */

static void pd_key(const struct cluster *c, const char *node, char *out, size_t cap)
{
    snprintf(out, cap, "%spd/%s", c->cfg.prefix, node);
}

void cluster__pd_session(struct cluster *c)
{
    /* Put again under the new lease; a key of an earlier lease (an
     * earlier kvcoordd of this node) is deleted when this one has none. */
    c->pd.dirty = 1;
    c->pd.key_exists = 1;
}

int cluster__pd_publish(struct cluster *c)
{
    uint64_t now = kvc__mono_ns();
    if (!c->pd.dirty && now < c->pd.next_look)
        return 0;
    c->pd.next_look = now + PD_LOOK_NS;
    char *rec = NULL, err[160];
    if (pd_record_encode(c->cfg.seg, c->cfg.node, c->cfg.url, &rec, err, sizeof err)) {
        log_event(LOG_WARN, "pd_publish_skipped", "cluster=%s node=%s err=\"%s\"", c->cfg.cluster,
                  c->cfg.node, err);
        return 0; /* the segment's trouble, not etcd's: looked at again */
    }
    int same = rec && c->pd.published && !strcmp(rec, c->pd.published);
    if (!c->pd.dirty && (same || (!rec && !c->pd.published)))
        goto done;
    if (!rec && !c->pd.key_exists) {
        c->pd.dirty = 0;
        goto done;
    }
    char key[KEY_MAX];
    pd_key(c, c->cfg.node, key, sizeof key);
    int rc = rec ? etcd_put(c->ses.ec, key, rec, strlen(rec), c->ses.lease, NULL)
                 : etcd_delete(c->ses.ec, key, 0, NULL);
    if (rc) {
        STAT_ADD(c, publish_errors, 1);
        if (strstr(etcd_error(c->ses.ec), "lease not found"))
            cluster__lease_gone(c, "a put found the lease gone");
        else
            cluster__etcd_failed(c, rec ? "pd put" : "pd delete");
        free(rec);
        return -1;
    }
    cluster__etcd_answered(c);
    if (rec)
        STAT_ADD(c, puts, 1);
    else
        STAT_ADD(c, deletes, 1);
    log_event(LOG_DEBUG, rec ? "pd_published" : "pd_unpublished", "cluster=%s node=%s bytes=%zu",
              c->cfg.cluster, c->cfg.node, rec ? strlen(rec) : 0);
    free(c->pd.published);
    c->pd.published = rec;
    c->pd.key_exists = rec != NULL;
    c->pd.dirty = 0;
    pthread_mutex_lock(&c->fig.mu);
    c->fig.st.pd_published = rec != NULL;
    pthread_mutex_unlock(&c->fig.mu);
    return 0;
done:
    free(rec);
    return 0;
}

/* node's table went from the mirror (why), logged when it had one. */
static void pd_gone(struct cluster *c, const char *node, const char *why)
{
    if (pd_mirror_remove(c->pd.mirror, node))
        log_event(LOG_INFO, "pd_mirror_withdrawn", "cluster=%s node=%s origin=%s why=\"%s\"",
                  c->cfg.cluster, c->cfg.node, node, why);
}

void cluster__pd_record(struct cluster *c, const char *node, const etcd_kv *kv, int is_delete)
{
    if (!strcmp(node, c->cfg.node)) {
        /* Our own key: deleted without us (the lease ended while this
         * process was frozen, or an operator), it is put back. */
        c->pd.key_exists = !is_delete;
        c->pd.seen_own |= !is_delete;
        if (is_delete && c->pd.published)
            c->pd.dirty = 1;
        return;
    }
    if (is_delete) {
        pd_gone(c, node, "its record was deleted (the table emptied, or the node's lease ended)");
        return;
    }
    struct pd_table t;
    const char *why = pd_record_decode(node, kv->value, kv->value_len, &t);
    if (why) {
        cluster__record_skipped(c, kv->key, why);
        pd_gone(c, node, "its record is not usable");
        return;
    }
    uint32_t registered = t.st.registered, expected = t.st.expected;
    int ready = t.st.ready;
    if (pd_mirror_put(c->pd.mirror, &t))
        log_event(LOG_WARN, "pd_mirror_failed", "cluster=%s origin=%s err=\"out of memory\"",
                  c->cfg.cluster, node);
    else
        log_event(LOG_INFO, "pd_mirrored",
                  "cluster=%s node=%s origin=%s registered=%u expected=%u "
                  "ready=%d",
                  c->cfg.cluster, c->cfg.node, node, registered, expected, ready);
}

void cluster__pd_snapshot_begin(struct cluster *c)
{
    pd_mirror_mark_stale(c->pd.mirror);
    c->pd.seen_own = 0;
}

void cluster__pd_snapshot_end(struct cluster *c)
{
    size_t n = pd_mirror_drop_stale(c->pd.mirror);
    if (n)
        log_event(LOG_INFO, "pd_mirror_withdrawn",
                  "cluster=%s node=%s tables=%zu why=\"not in "
                  "etcd's snapshot\"",
                  c->cfg.cluster, c->cfg.node, n);
    if (!c->pd.seen_own) {
        c->pd.key_exists = 0;
        if (c->pd.published)
            c->pd.dirty = 1; /* etcd lost it */
    }
}

void cluster__pd_drop(struct cluster *c, const char *why)
{
    size_t n = pd_mirror_clear(c->pd.mirror);
    if (n)
        log_event(LOG_WARN, "pd_mirror_dropped", "cluster=%s node=%s tables=%zu why=\"%s\"",
                  c->cfg.cluster, c->cfg.node, n, why);
}
