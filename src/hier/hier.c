/*
 * hier.c - kvc_hier_open / kvc_hier_allreduce_min / kvc_hier_close: a
 * hierarchical step (include/kvcoord/hier.h says the protocol's three
 * parts; hier_net.c the leaders' exchange; hier_fail.c the failures).
 *
 * The node's part rides on the segment's collective (kvc_allreduce_min_ex,
 * group lgid of the node's ranks): generation counting, death and timeout
 * detection inside the node are its.  A step is two segment rounds on
 * every rank of the node, whatever happens:
 *  - round 1: [signatures][data].  Each rank writes its (tag, len) at its
 *    own slot (0xFF elsewhere), so the MIN gives every local rank's
 *    signature.  When the local lengths differ the segment refuses the
 *    round on every local rank (KVC_E_INVAL, "called with len") and round
 *    1 is redone with the signatures alone, so that the leader still learns
 *    who differs.
 *  - the spread: [record][data].  The leader writes the step's outcome
 *    (record) and result; the others write 0xFF everywhere, so the MIN is
 *    the leader's bytes.  Only when round 1 completed: a round 1 that
 *    failed failed on every rank of the node (the segment's rule), which
 *    then all skip the spread, and the counts stay together.
 * The leader is the node's lowest rank, fixed at open: a rank's death
 * breaks the group on every node (the segment's epoch rule, carried to the
 * other nodes), so no other rank ever has to take over.  A leader that dies
 * is seen by its node's ranks in the segment (they wait for it in the
 * spread or the next round 1) and by the other leaders as its connection
 * closing.
 */
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "hier_internal.h"

static void put_sig(uint8_t *p, uint32_t tag, uint32_t len)
{
    for (int i = 0; i < 4; i++) {
        p[i] = (uint8_t)(tag >> (8 * i));
        p[4 + i] = (uint8_t)(len >> (8 * i));
    }
}

static bool grow(uint8_t **p, size_t *cap, size_t need)
{
    if (need <= *cap)
        return true;
    size_t nc = need + 256;
    uint8_t *nb = realloc(*p, nc);
    if (!nb)
        return false;
    *p = nb;
    *cap = nc;
    return true;
}

KVC_API kvc_err kvc_hier_open(const kvc_hier_options *o, kvc_hier **out)
{
    if (!o || !out || !o->seg || !o->node_of)
        return kvc_error_set(KVC_E_INVAL, "kvc_hier_open: NULL %s",
                             !o        ? "options"
                             : !out    ? "out"
                             : !o->seg ? "seg"
                                       : "node_of");
    if (o->size < 1 || o->size > HIER_MAX_RANKS || o->rank >= o->size)
        return kvc_error_set(KVC_E_INVAL,
                             "kvc_hier_open: rank %u of size %u out of range (size 1..%d)", o->rank,
                             o->size, HIER_MAX_RANKS);
    if (o->nodes < 1 || o->nodes > KVC_HIER_MAX_NODES)
        return kvc_error_set(KVC_E_INVAL, "kvc_hier_open: %u nodes out of range 1..%d", o->nodes,
                             KVC_HIER_MAX_NODES);
    kvc_hier *h = calloc(1, sizeof *h);
    if (!h)
        return kvc_error_set(KVC_E_SYS, "kvc_hier_open: out of memory");
    h->seg = o->seg;
    h->group = o->group;
    h->size = o->size;
    h->rank = o->rank;
    h->nodes = o->nodes;
    h->pid = (int32_t)getpid();
    for (uint32_t j = 0; j < KVC_HIER_MAX_NODES; j++)
        h->peer[j].fd = -1;
    for (uint32_t r = 0; r < o->size; r++) {
        uint32_t n = o->node_of[r];
        if (n >= o->nodes) {
            free(h);
            return kvc_error_set(KVC_E_INVAL, "kvc_hier_open: rank %u's node %u is not below %u", r,
                                 n, o->nodes);
        }
        h->node_of[r] = n;
        if (!h->ranks_of[n])
            h->leader_of[n] = r;
        h->ranks_of[n] |= 1ull << r;
    }
    for (uint32_t j = 0; j < o->nodes; j++) {
        if (!h->ranks_of[j]) {
            free(h);
            return kvc_error_set(KVC_E_INVAL, "kvc_hier_open: node %u has no rank", j);
        }
        if (o->node_names && o->node_names[j])
            snprintf(h->names[j], sizeof h->names[j], "%s", o->node_names[j]);
        else
            snprintf(h->names[j], sizeof h->names[j], "%u", j);
    }
    h->node = h->node_of[h->rank];
    for (uint32_t r = 0; r < o->size; r++)
        if (h->node_of[r] == h->node) {
            if (r == h->rank)
                h->lidx = h->lsize;
            h->local[h->lsize++] = r;
        }
    h->leader = h->leader_of[h->node] == h->rank;
    if (h->leader != (o->fds != NULL) && o->nodes > 1) {
        bool leader = h->leader;
        uint32_t lead = h->leader_of[h->node];
        free(h);
        return kvc_error_set(KVC_E_INVAL,
                             "kvc_hier_open: rank %u %s its node's leader (rank %u) but %s fds",
                             o->rank, leader ? "is" : "is not", lead, o->fds ? "got" : "got no");
    }
    if (h->leader && o->nodes > 1)
        for (uint32_t j = 0; j < o->nodes; j++) {
            if (j == h->node)
                continue;
            int type = 0;
            socklen_t sl = sizeof type;
            if (o->fds[j] < 0 || getsockopt(o->fds[j], SOL_SOCKET, SO_TYPE, &type, &sl) ||
                type != SOCK_STREAM) {
                free(h);
                return kvc_error_set(KVC_E_INVAL,
                                     "kvc_hier_open: fds[%u] (%d, for node %u) is not a "
                                     "stream socket",
                                     j, o->fds[j], j);
            }
        }
    /* The node's segment group: another id than any single-node group of
     * the same id (and per node, should two nodes share a segment). */
    uint64_t x = (o->group ^ 0x6869657261726368ull) + (uint64_t)h->node * 0x9E3779B97F4A7C15ull;
    x ^= x >> 31;
    x *= 0xBF58476D1CE4E5B9ull;
    h->lgid = x ^ (x >> 29);
    if (h->leader && o->nodes > 1)
        for (uint32_t j = 0; j < o->nodes; j++)
            if (j != h->node) {
                int one = 1;
                setsockopt(o->fds[j], IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
                h->peer[j].fd = o->fds[j];
            }
    *out = h;
    return KVC_OK;
}

KVC_API uint32_t kvc_hier_node(const kvc_hier *h) { return h ? h->node : 0; }

KVC_API int kvc_hier_is_leader(const kvc_hier *h) { return h && h->leader; }

KVC_API void kvc_hier_close(kvc_hier *h)
{
    if (!h)
        return;
    hier__drain(h); /* nothing unread: the peers see the connection end, not a reset */
    for (uint32_t j = 0; j < KVC_HIER_MAX_NODES; j++) {
        if (h->peer[j].fd >= 0)
            close(h->peer[j].fd);
        free(h->peer[j].rx);
    }
    free(h->buf);
    free(h->acc);
    free(h);
}

static uint32_t add_ms(uint64_t a, uint64_t b)
{
    return a + b > UINT32_MAX ? UINT32_MAX : (uint32_t)(a + b);
}

/* The step failed with r: broken when a rank died; the error. */
static kvc_err step_failed(kvc_hier *h, const hier_rec *r, kvc_hier_failure *why)
{
    if (r->dead && !h->broken) {
        h->broken = true;
        h->why_broken = *r;
    }
    return hier__fail(h, r, why);
}

static kvc_err step(kvc_hier *h, uint32_t tag, uint8_t *vec, size_t len, uint32_t timeout_ms,
                    kvc_hier_failure *why)
{
    size_t sigb = (size_t)h->lsize * SIG_BYTES;
    if (!grow(&h->buf, &h->cap, 20 + (size_t)HIER_MAX_RANKS * SIG_BYTES + REC_BYTES + len) ||
        !grow(&h->acc, &h->acc_cap, len + 1))
        return kvc_error_set(KVC_E_SYS, "kvc_hier_allreduce_min: out of memory");
    /* longest waits: the other leaders (a leader), the leader (the others) */
    uint32_t x_ms = add_ms(timeout_ms, timeout_ms / 4 + 50);
    uint32_t spread_ms = add_ms(x_ms, (uint64_t)timeout_ms + 100);
    uint8_t *b = h->buf;
    kvc_coll_failure cw;
    hier_rec r;

    /* round 1: signatures and data */
    memset(b, 0xFF, sigb);
    put_sig(b + (size_t)h->lidx * SIG_BYTES, tag, (uint32_t)len);
    if (len)
        memcpy(b + sigb, vec, len);
    bool has_data = true;
    kvc_err e =
        kvc_allreduce_min_ex(h->seg, h->lgid, h->lsize, h->lidx, b, sigb + len, timeout_ms, &cw);
    if (e == KVC_E_INVAL && strstr(kvc_last_error(), "called with len")) {
        has_data = false; /* the node's lengths differ: who, by the signatures alone */
        memset(b, 0xFF, sigb);
        put_sig(b + (size_t)h->lidx * SIG_BYTES, tag, (uint32_t)len);
        e = kvc_allreduce_min_ex(h->seg, h->lgid, h->lsize, h->lidx, b, sigb, timeout_ms, &cw);
    }
    if (e) {
        hier__rec_local(h, &r, e, &cw, kvc_last_error());
        if (h->leader && h->nodes > 1) {
            hier_rec unused;
            hier__exchange(h, &r, NULL, false, 0, hier__mono_ns() + (uint64_t)x_ms * 1000000ull,
                           &unused);
        }
        return step_failed(h, &r, why);
    }
    uint8_t lsig[HIER_MAX_RANKS * SIG_BYTES];
    memcpy(lsig, b, sigb);
    for (uint32_t i = 0; i < h->lsize; i++)
        memcpy(h->gsig[h->local[i]], lsig + (size_t)i * SIG_BYTES, SIG_BYTES);
    size_t spread_len = REC_BYTES + (has_data ? len : 0);

    if (!h->leader) { /* the spread: the leader's bytes */
        memset(b, 0xFF, spread_len);
        e = kvc_allreduce_min_ex(h->seg, h->lgid, h->lsize, h->lidx, b, spread_len, spread_ms, &cw);
        if (e) {
            hier__rec_local(h, &r, e, &cw, kvc_last_error());
            return step_failed(h, &r, why);
        }
        hier__rec_get(&r, b);
        if (r.failed)
            return step_failed(h, &r, why);
        if (len)
            memcpy(vec, b + REC_BYTES, len);
        return KVC_OK;
    }

    /* the leader: the other nodes, then the spread */
    bool ok;
    memset(&r, 0, sizeof r);
    if (has_data && len)
        memcpy(h->acc, b + sigb, len);
    if (h->nodes > 1)
        ok = hier__exchange(h, NULL, lsig, has_data, len,
                            hier__mono_ns() + (uint64_t)x_ms * 1000000ull, &r);
    else
        ok = !hier__rec_mismatch(h, &r);
    if (ok && !has_data) { /* the lengths differed but every signature is equal: cannot be */
        hier__rec_local(h, &r, KVC_E_INVAL, &cw, "lengths differ");
        ok = false;
    }
    if (ok)
        memset(&r, 0, sizeof r);
    r.step = h->step;
    hier__rec_put(&r, b);
    if (ok && len)
        memcpy(b + REC_BYTES, h->acc, len);
    hier_rec mine = r;
    e = kvc_allreduce_min_ex(h->seg, h->lgid, h->lsize, h->lidx, b, spread_len, timeout_ms, &cw);
    if (e) {
        hier__rec_local(h, &r, e, &cw, kvc_last_error());
        /* The other nodes may have completed this step: a death here is
         * theirs to learn at the next one, as this node's message for it. */
        if (r.dead && h->nodes > 1)
            hier__tell(h, h->step + 1, &r);
        return step_failed(h, &r, why);
    }
    if (!ok)
        return step_failed(h, &mine, why);
    if (len)
        memcpy(vec, h->acc, len);
    return KVC_OK;
}

KVC_API kvc_err kvc_hier_allreduce_min(kvc_hier *h, uint32_t tag, uint8_t *vec, size_t len,
                                       uint32_t timeout_ms, kvc_hier_failure *why)
{
    if (why)
        memset(why, 0, sizeof *why);
    if (!h)
        return kvc_error_set(KVC_E_INVAL, "kvc_hier_allreduce_min: NULL handle");
    if (len && !vec)
        return kvc_error_set(KVC_E_INVAL, "kvc_hier_allreduce_min: NULL vec with len %zu", len);
    if (len > KVC_HIER_MAX_LEN)
        return kvc_error_set(KVC_E_INVAL, "kvc_hier_allreduce_min: len %zu above %u", len,
                             KVC_HIER_MAX_LEN);
    if (tag == UINT32_MAX)
        return kvc_error_set(KVC_E_INVAL, "kvc_hier_allreduce_min: tag 0xFFFFFFFF is reserved");
    if ((int32_t)getpid() != h->pid)
        return kvc_error_set(KVC_E_INVAL,
                             "kvc_hier_allreduce_min: the handle was opened by pid %d, not this "
                             "process (inherited across fork())",
                             (int)h->pid);
    int idle = 0;
    if (!atomic_compare_exchange_strong(&h->busy, &idle, 1))
        return kvc_error_set(KVC_E_INVAL,
                             "kvc_hier_allreduce_min: rank %u of group 0x%llx is "
                             "called from two threads at once",
                             h->rank, (unsigned long long)h->group);
    kvc_err e;
    if (h->broken) {
        e = hier__fail(h, &h->why_broken, why);
        kvc_error_set(e,
                      "%s; no step of the group can complete any more (it is re-formed by "
                      "a new handshake of new processes)",
                      h->why_broken.text);
    } else {
        e = step(h, tag, vec, len, timeout_ms, why);
        h->step++;
    }
    atomic_store(&h->busy, 0);
    return e;
}
