/*
 * xfer_submit.c - the sending side: peers and their health, batches of
 * writes (check, coalesce, slice), sender rooms and their outcome.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "xfer_conn.h"

/* ---- peers ---------------------------------------------------------------- */

kvt_peer *kvt__peer_find(kvt_engine *e, const char *sid)
{
    for (size_t i = 0; i < e->npeers; i++)
        if (!strcmp(e->peers[i]->sid, sid))
            return e->peers[i];
    return NULL;
}

kvc_err kvt__peer_get(kvt_engine *e, const char *sid, kvt_peer **out)
{
    kvt_peer *p = kvt__peer_find(e, sid);
    if (!p) {
        if (e->npeers == KVT_MAX_PEERS)
            return kvt__fail(KVC_E_FULL, "too many peers (max %d)", KVT_MAX_PEERS);
        struct sockaddr_storage sa;
        socklen_t len;
        kvc_err err = kvt__resolve(sid, 0, &sa, &len);
        if (err)
            return err;
        p = calloc(1, sizeof *p);
        if (p)
            p->conns = calloc(e->o.conns_per_peer, sizeof *p->conns);
        if (!p || !p->conns) {
            free(p);
            return kvt__fail(KVC_E_SYS, "out of memory for a peer");
        }
        kvt__str(p->sid, sizeof p->sid, "%s", sid);
        p->sa = sa;
        p->salen = len;
        p->next_seq = 1;
        e->peers[e->npeers++] = p;
    }
    *out = p;
    return KVC_OK;
}

KVT_API kvc_err kvt_peer_stat(kvt_engine *e, const kvt_peer *p, kvt_peer_info *out)
{
    KVT_ARG(e);
    KVT_ARG(p);
    KVT_ARG(out);
    memset(out, 0, sizeof *out);
    kvt__str(out->session_id, sizeof out->session_id, "%s", p->sid);
    out->generation = p->generation;
    uint64_t now = kvc__mono_ns();
    out->healthy = p->unhealthy_until_ns <= now;
    out->unhealthy_left_ms = out->healthy ? 0 : (p->unhealthy_until_ns - now) / 1000000ull;
    out->last_code = p->last_code;
    kvt__str(out->last_error, sizeof out->last_error, "%s", p->last_error);
    for (uint32_t i = 0; i < e->o.conns_per_peer; i++)
        if (p->conns[i] && p->conns[i]->state == CS_UP) {
            out->conns_up++;
            out->conns_same_host += p->conns[i]->cma == KVT_CMA_ON;
        }
    out->bytes_sent = p->bytes_sent;
    return KVC_OK;
}

void kvt__peers_free(kvt_engine *e)
{
    for (size_t i = 0; i < e->npeers; i++) {
        kvt_peer *p = e->peers[i];
        while (p->bl_head) {
            kvt__wr *w = p->bl_head;
            p->bl_head = w->next;
            kvt__wr_free(e, w);
        }
        while (p->rooms) {
            kvt__sroom *r = p->rooms;
            p->rooms = r->next;
            free(r);
        }
        free(p->regions);
        free(p->conns);
        free(p);
    }
    e->npeers = 0;
}

/* Mark p unhealthy for the TTL and fail every unfinished room to it; close
 * its connections.  Rooms to other peers are untouched. */
void kvt__peer_fail(kvt_engine *e, kvt_peer *p, int32_t code, const char *fmt, ...)
{
    char msg[KVC_REASON_MAX + 1];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    p->unhealthy_until_ns = kvc__mono_ns() + (uint64_t)e->o.unhealthy_ttl_ms * 1000000ull;
    p->last_code = code;
    kvt__str(p->last_error, sizeof p->last_error, "%s", msg);
    kvt__log(e, KVT_LOG_WARN, "peer %s marked unhealthy for %u ms: %s", p->sid,
             e->o.unhealthy_ttl_ms, msg);
    /* The rooms fail first, with this reason (closing a connection fails
     * the reads waiting on it with a vaguer one); their events wait until
     * nothing of theirs is in the kernel. */
    for (kvt__sroom *r = p->rooms, *next; r; r = next) {
        next = r->next; /* r may be freed by sroom_fail */
        if (!r->failed && !r->finished)
            kvt__sroom_fail(e, r, code, msg);
    }
    for (uint32_t i = 0; i < e->o.conns_per_peer; i++)
        if (p->conns[i])
            kvt__conn_close(e, p->conns[i]);
    e->rdma->peer_down(e, p); /* its QP flushes: rooms' events follow the flush */
    while (p->bl_head) {
        kvt__wr *w = p->bl_head;
        p->bl_head = w->next;
        w->in_q = 0;
        kvt__wr_release(e, w);
    }
    p->bl_tail = NULL;
    for (kvt__sroom *r = p->rooms, *next; r; r = next) {
        next = r->next; /* r may be freed by sroom_fail */
        if (!r->failed && !r->finished)
            kvt__sroom_fail(e, r, code, msg);
    }
}

/* A descriptor of p was imported: clear the unhealthy mark (the importer
 * vouches for the peer: the binding fetched the descriptor from it, so it
 * answers), and when the generation changed close the old connections,
 * which lead to the old process (or nowhere). */
void kvt__peer_renew(kvt_engine *e, kvt_peer *p, uint64_t generation)
{
    bool restarted = p->generation && p->generation != generation;
    if (restarted) {
        for (uint32_t i = 0; i < e->o.conns_per_peer; i++)
            if (p->conns[i])
                kvt__conn_close(e, p->conns[i]);
        e->rdma->peer_down(e, p);
    }
    if (p->unhealthy_until_ns > kvc__mono_ns())
        kvt__log(e, KVT_LOG_INFO, "peer %s %s (generation %llu): healthy", p->sid,
                 restarted ? "registered again" : "answered again", (unsigned long long)generation);
    p->unhealthy_until_ns = 0;
    p->generation = generation;
}

/* ---- sender rooms ------------------------------------------------------------ */

static void sroom_unlink_free(kvt__sroom *r)
{
    kvt__sroom **pp = &r->peer->rooms;
    while (*pp && *pp != r)
        pp = &(*pp)->next;
    if (*pp)
        *pp = r->next;
    free(r);
}

static void sroom_event(kvt_engine *e, kvt__sroom *r, kvc_poll state)
{
    kvt_event ev;
    memset(&ev, 0, sizeof ev);
    ev.room = r->room;
    ev.side = r->read ? KVT_SIDE_READER : KVT_SIDE_SENDER;
    ev.state = state;
    ev.code = r->code;
    ev.bytes = r->acked_bytes;
    kvt__str(ev.peer, sizeof ev.peer, "%s", r->peer->sid);
    kvt__str(ev.reason, sizeof ev.reason, "%s", r->reason);
    kvt__push_event(e, &ev);
}

/* Remove r's writes that are still only queued (backlog or send queues):
 * they will never be sent. */
static void sroom_drop_queued(kvt_engine *e, kvt__sroom *r)
{
    kvt_peer *p = r->peer;
    kvt__wr **pp = &p->bl_head, *last = NULL;
    while (*pp) {
        kvt__wr *w = *pp;
        if (w->room == r) {
            *pp = w->next;
            w->in_q = 0;
            kvt__wr_release(e, w);
        } else {
            last = w;
            pp = &w->next;
        }
    }
    p->bl_tail = last;
    for (uint32_t i = 0; i < e->o.conns_per_peer; i++) {
        kvt__conn *c = p->conns[i];
        if (!c)
            continue;
        pp = &c->q_head;
        last = NULL;
        while (*pp) {
            kvt__wr *w = *pp;
            if (w->room == r) {
                *pp = w->next;
                w->in_q = 0;
                c->unacked_bytes -= kvt__wr_cost(w);
                kvt__wr_release(e, w);
            } else {
                last = w;
                pp = &w->next;
            }
        }
        c->q_tail = last;
    }
}

/* Record r's failure (first one wins here and in the segment).  Its event
 * follows once no write of it is in the kernel (kvt__sroom_check). */
void kvt__sroom_fail(kvt_engine *e, kvt__sroom *r, int32_t code, const char *reason)
{
    if (r->failed || r->finished)
        return;
    r->failed = true;
    r->code = code;
    /* A reader's reason names the operation first. */
    kvt__str(r->reason, sizeof r->reason, "%s%s",
             r->read && strncmp(reason, "read", 4) ? "read: " : "", reason);
    if (!r->noroom)
        kvt__seg_fail(e, r->room, code, r->reason);
    r->pending++; /* r must outlive the releases of its queued writes */
    sroom_drop_queued(e, r);
    r->pending--;
    kvt__sroom_check(e, r);
}

/* Advance r: send its DONE when every write is acknowledged; emit its
 * event when it ended; free it when nothing refers to it any more. */
void kvt__sroom_check(kvt_engine *e, kvt__sroom *r)
{
    if (!r->finished && r->failed && r->in_kernel == 0) {
        r->finished = true;
        sroom_event(e, r, KVC_POLL_FAILED);
    } else if (r->read) {
        /* A reader room ends when every request's data is in place. */
        if (!r->finished && !r->failed && r->closed && r->pending == 0 && r->in_kernel == 0) {
            r->finished = true;
            if (!r->noroom)
                kvt__seg_success(e, r->room);
            sroom_event(e, r, KVC_POLL_SUCCESS);
        }
    } else if (!r->finished && !r->failed && r->closed && r->pending == 0 && !r->done_sent &&
               r->peer->verbs) {
        /* Every RDMA WRITE completed: the end-of-room SEND.  Hold r: a
         * failed post fails the peer, and with it r, re-entering here. */
        r->pending++;
        e->rdma->notify(e, r);
        r->pending--;
    } else if (!r->finished && !r->failed && r->closed && r->pending == 0 && !r->done_sent) {
        kvt__conn *c = NULL;
        for (uint32_t i = 0; i < e->o.conns_per_peer && !c; i++)
            if (r->peer->conns[i] && r->peer->conns[i]->state == CS_UP)
                c = r->peer->conns[i];
        if (!c)
            return; /* no connection yet: kvt__peer_pump calls again */
        kvt__wr *w = kvt__ctl_wr(KVT_F_DONE, r->writes, r->room, r->bytes, 0, NULL, 0);
        if (!w) {
            kvt__sroom_fail(e, r, ENOMEM, "out of memory for DONE");
            return;
        }
        r->done_sent = true;
        c->done_waits++;
        kvt__conn_enqueue(c, w);
        e->net->kick(e, c);
    }
    if (r->finished && r->pending == 0)
        sroom_unlink_free(r);
}

/* DONE_ACK for room from p's connection c. */
void kvt__sroom_done_ack(kvt_engine *e, kvt__conn *c, uint64_t room, int32_t status,
                         const char *msg)
{
    if (c->done_waits)
        c->done_waits--;
    for (kvt__sroom *r = c->peer->rooms; r; r = r->next) {
        if (r->room != room || !r->done_sent || r->finished)
            continue;
        if (status == 0) {
            r->finished = true;
            if (!r->noroom)
                kvt__seg_success(e, room);
            sroom_event(e, r, KVC_POLL_SUCCESS);
            kvt__sroom_check(e, r);
        } else {
            char why[KVC_REASON_MAX + 1];
            kvt__str(why, sizeof why, "peer %s refused the end of room %llu: %s", c->peer->sid,
                     (unsigned long long)room, msg);
            kvt__sroom_fail(e, r, status, why);
        }
        return;
    }
    kvt__log(e, KVT_LOG_WARN, "peer %s: DONE_ACK for unknown room %llu", c->peer->sid,
             (unsigned long long)room);
}

/* Release w from whichever holder just let go of it (flags already
 * cleared by the caller); free it when nobody holds it. */
void kvt__wr_release(kvt_engine *e, kvt__wr *w)
{
    if (w->in_q || w->in_batch || w->in_fifo)
        return;
    kvt__sroom *r = w->room;
    kvt__wr_free(e, w);
    if (r) {
        r->pending--;
        kvt__sroom_check(e, r);
    }
}

/* ---- submitting ----------------------------------------------------------------- */

static kvt__rregion *rregion_find(kvt_peer *p, uint64_t addr, uint64_t len)
{
    for (size_t i = 0; i < p->nregions; i++) {
        kvt__rregion *r = &p->regions[i];
        if (addr >= r->addr && addr - r->addr <= r->len && len <= r->len - (addr - r->addr))
            return r;
    }
    return NULL;
}

static int run_cmp(const void *a, const void *b)
{
    const kvt_run *x = a, *y = b;
    return x->laddr < y->laddr ? -1 : x->laddr > y->laddr;
}

/* Check every run before anything is queued. */
static kvc_err check_runs(kvt_engine *e, kvt_peer *p, const kvt_run *runs, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        const kvt_run *r = &runs[i];
        if (!r->len)
            return kvt__fail(KVC_E_INVAL, "run %zu has length 0", i);
        if (!kvt__region_find(e, r->laddr, r->len))
            return kvt__fail(
                KVC_E_INVAL,
                "run %zu: local range [0x%llx, +%llu) is not inside a registered region", i,
                (unsigned long long)r->laddr, (unsigned long long)r->len);
        if (!rregion_find(p, r->raddr, r->len))
            return kvt__fail(KVC_E_INVAL,
                             "run %zu: remote range [0x%llx, +%llu) is not inside a region of peer "
                             "%s's descriptor",
                             i, (unsigned long long)r->raddr, (unsigned long long)r->len, p->sid);
    }
    return KVC_OK;
}

/* Sort by local address and merge runs contiguous on both sides within
 * the same regions.  Returns the new count. */
static size_t coalesce(kvt_engine *e, kvt_peer *p, kvt_run *v, size_t n)
{
    if (n < 2)
        return n;
    qsort(v, n, sizeof *v, run_cmp);
    size_t k = 0;
    for (size_t i = 1; i < n; i++) {
        kvt_run *a = &v[k];
        const kvt_run *b = &v[i];
        if (a->laddr + a->len == b->laddr && a->raddr + a->len == b->raddr &&
            kvt__region_find(e, a->laddr, a->len + b->len) &&
            rregion_find(p, a->raddr, a->len + b->len))
            a->len += b->len;
        else
            v[++k] = *b;
    }
    return k + 1;
}

static kvt__wr *data_wr(kvt_peer *p, kvt__sroom *r, uint64_t laddr, uint64_t raddr, uint32_t len)
{
    kvt__wr *w = calloc(1, sizeof *w + KVT_CMA_ENT_LEN);
    if (!w)
        return NULL;
    /* Its CMA_WRITE table (one run), for a same-host connection. */
    kvt__put64(w->owned, raddr);
    kvt__put64(w->owned + 8, len);
    kvt__put64(w->owned + 16, laddr);
    w->cma = w->owned;
    w->ncma = 1;
    w->room = r;
    w->payload = (const void *)(uintptr_t)laddr;
    w->plen = len;
    w->seq = p->next_seq++;
    kvt__frame f = {.type = KVT_F_WRITE, .len = len, .seq = w->seq, .room = r->room, .addr = raddr};
    kvt__frame_encode(&f, w->hdr);
    return w;
}

static kvt__sroom *sroom_get(kvt_engine *e, kvt_peer *p, uint64_t room, bool read, bool *created)
{
    *created = false;
    for (kvt__sroom *r = p->rooms; r; r = r->next)
        if (r->room == room && !r->finished && r->read == read)
            return r;
    kvt__sroom *r = calloc(1, sizeof *r);
    if (!r)
        return NULL;
    r->peer = p;
    r->room = room;
    r->read = read;
    r->next = p->rooms;
    p->rooms = r;
    *created = true;
    (void)e;
    return r;
}

/* One WRITEV of runs v[0..k) (k >= 2): the entries table as its payload,
 * the runs' data as iovecs straight from the caller's memory. */
static kvt__wr *writev_wr(kvt_peer *p, kvt__sroom *r, const kvt__rent *v, uint32_t k,
                          uint64_t total)
{
    size_t plen = (size_t)k * KVT_READ_ENT_LEN;
    /* owned: the entries (the WRITEV's payload), the source addresses
     * (with the entries, a CMA_WRITE's payload), the iovecs.  24 k rounds
     * up to 16 bytes for the iovecs. */
    size_t tab = ((size_t)k * KVT_CMA_ENT_LEN + 15) & ~(size_t)15;
    kvt__wr *w = calloc(1, sizeof *w + tab + (size_t)k * sizeof(struct iovec));
    if (!w)
        return NULL;
    w->siov = (struct iovec *)(void *)(w->owned + tab);
    for (uint32_t i = 0; i < k; i++) {
        kvt__put64(w->owned + (size_t)i * KVT_READ_ENT_LEN, v[i].raddr);
        kvt__put64(w->owned + (size_t)i * KVT_READ_ENT_LEN + 8, v[i].len);
        kvt__put64(w->owned + plen + (size_t)i * 8, v[i].laddr);
        w->siov[i] = (struct iovec){(void *)(uintptr_t)v[i].laddr, (size_t)v[i].len};
    }
    w->cma = w->owned;
    w->ncma = k;
    w->nsiov = k;
    w->dlen = total;
    w->room = r;
    w->payload = w->owned;
    w->plen = (uint32_t)plen;
    w->seq = p->next_seq++;
    kvt__frame f = {
        .type = KVT_F_WRITEV, .len = (uint32_t)plen, .seq = w->seq, .room = r->room, .addr = total};
    kvt__frame_encode(&f, w->hdr);
    return w;
}

static void backlog_add(kvt_peer *p, kvt__sroom *r, kvt__wr *w, uint64_t bytes)
{
    w->in_q = 1;
    if (p->bl_tail)
        p->bl_tail->next = w;
    else
        p->bl_head = w;
    p->bl_tail = w;
    r->pending++;
    r->writes++;
    r->bytes += bytes;
}

/* Queue what is gathered in g[0..*k) (a WRITE for one run, a WRITEV for
 * more), then empty it. */
static kvc_err flush_group(kvt_peer *p, kvt__sroom *r, kvt__rent *g, uint32_t *k, uint64_t *total)
{
    if (!*k)
        return KVC_OK;
    kvt__wr *w = *k == 1 ? data_wr(p, r, g[0].laddr, g[0].raddr, (uint32_t)g[0].len)
                         : writev_wr(p, r, g, *k, *total);
    if (!w)
        return kvt__fail(KVC_E_SYS, "out of memory queueing writes");
    backlog_add(p, r, w, *total);
    *k = 0;
    *total = 0;
    return KVC_OK;
}

/* Queue the runs as slices on the peer's backlog.  On the TCP path,
 * consecutive slices are gathered into WRITEV frames (up to 256 runs and
 * min(window_bytes, 16 MiB)): the receiver then takes a whole batch of
 * scattered pages with one recvmsg instead of two recvs per page.  Slices
 * that splice (tcp_splice_min) and the RDMA path go one WRITE each. */
static kvc_err queue_runs(kvt_engine *e, kvt_peer *p, kvt__sroom *r, const kvt_run *v, size_t n)
{
    uint64_t cap = e->o.window_bytes < KVT_READ_REQ_MAX ? e->o.window_bytes : KVT_READ_REQ_MAX;
    uint64_t solo = e->o.tcp_splice_min ? e->o.tcp_splice_min : UINT64_MAX;
    kvt__rent g[KVT_READ_ENTS_MAX];
    uint32_t k = 0;
    uint64_t total = 0;
    kvc_err err = KVC_OK;
    for (size_t i = 0; i < n && !err; i++) {
        for (uint64_t off = 0; off < v[i].len && !err;) {
            uint64_t len = v[i].len - off;
            if (len > e->o.slice_bytes)
                len = e->o.slice_bytes;
            kvt__rent s = {v[i].laddr + off, v[i].raddr + off, len};
            off += len;
            if (p->verbs || len >= solo) {
                err = flush_group(p, r, g, &k, &total);
                uint64_t one = len;
                uint32_t k1 = 1;
                if (!err)
                    err = flush_group(p, r, &s, &k1, &one);
                continue;
            }
            if (k == KVT_READ_ENTS_MAX || (k && total + len > cap))
                err = flush_group(p, r, g, &k, &total);
            g[k++] = s;
            total += len;
        }
    }
    if (!err)
        err = flush_group(p, r, g, &k, &total);
    return err;
}

static kvc_err refuse_unhealthy(kvt_engine *e, kvt_peer *p, uint64_t room, unsigned flags,
                                kvc_room_role role)
{
    uint64_t left = (p->unhealthy_until_ns - kvc__mono_ns()) / 1000000ull;
    char why[KVC_REASON_MAX + 1];
    kvt__str(why, sizeof why, "peer %s is unhealthy for another %llu ms (%s)", p->sid,
             (unsigned long long)left, p->last_error);
    if (!(flags & KVT_SUBMIT_NOROOM)) {
        kvt__seg_open(e, room, role);
        kvt__seg_fail(e, room, p->last_code ? p->last_code : EHOSTDOWN, why);
    }
    return kvt__fail(KVC_E_BUSY, "room %llu: %s", (unsigned long long)room, why);
}

/* kvt_submit and kvt_submit_read: the same checks, room and queueing. */
static kvc_err submit(kvt_engine *e, kvt_peer *p, uint64_t room, const kvt_run *runs, size_t n,
                      unsigned flags, bool read, const char *fn)
{
    KVT_ARG(e);
    KVT_ARG(p);
    if (n)
        KVT_ARG(runs);
    if (room > KVC_ROOM_ID_MAX)
        return kvt__fail(KVC_E_INVAL, "%s: room id %llu out of range 0..%llu (2^63 - 1)", fn,
                         (unsigned long long)room, (unsigned long long)KVC_ROOM_ID_MAX);
    if (flags & ~(KVT_SUBMIT_MORE | KVT_SUBMIT_NOROOM))
        return kvt__fail(KVC_E_INVAL, "%s: unknown flags 0x%x", fn, flags);
    kvc_err rerr = kvt__ring_check(e);
    if (rerr)
        return rerr;
    kvc_room_role role = read ? KVC_ROOM_ROLE_DECODE : KVC_ROOM_ROLE_PREFILL;
    uint64_t now = kvc__mono_ns();
    if (p->unhealthy_until_ns > now)
        return refuse_unhealthy(e, p, room, flags, role);
    kvc_err err = check_runs(e, p, runs, n);
    if (err)
        return err;
    kvt_run *v = n ? malloc(n * sizeof *v) : NULL;
    if (n && !v)
        return kvt__fail(KVC_E_SYS, "out of memory copying %zu runs", n);
    if (n)
        memcpy(v, runs, n * sizeof *v);
    n = coalesce(e, p, v, n);
    bool created;
    kvt__sroom *r = sroom_get(e, p, room, read, &created);
    if (!r) {
        free(v);
        return kvt__fail(KVC_E_SYS, "out of memory for a room");
    }
    if (r->closed) {
        free(v);
        return kvt__fail(KVC_E_INVAL, "room %llu %s %s already ended", (unsigned long long)room,
                         read ? "from" : "to", p->sid);
    }
    if (created) {
        r->noroom = (flags & KVT_SUBMIT_NOROOM) != 0;
        if (!r->noroom)
            kvt__seg_open(e, room, role);
    }
    err = read ? kvt__read_queue(e, p, r, v, n) : queue_runs(e, p, r, v, n);
    free(v);
    if (!(flags & KVT_SUBMIT_MORE))
        r->closed = true;
    if (err) {
        kvt__sroom_fail(e, r, ENOMEM,
                        read ? "out of memory queueing reads" : "out of memory queueing writes");
        return err;
    }
    kvt__peer_pump(e, p);
    kvt__sroom_check(e, r);
    return KVC_OK;
}

KVT_API kvc_err kvt_submit(kvt_engine *e, kvt_peer *p, uint64_t room, const kvt_run *runs, size_t n,
                           unsigned flags)
{
    KVT_ARG(e);
    KVT_ARG(p);
    if (n)
        KVT_ARG(runs);
    return submit(e, p, room, runs, n, flags, false, __func__);
}

KVT_API kvc_err kvt_submit_read(kvt_engine *e, kvt_peer *p, uint64_t room, const kvt_run *runs,
                                size_t n, unsigned flags)
{
    KVT_ARG(e);
    KVT_ARG(p);
    if (n)
        KVT_ARG(runs);
    return submit(e, p, room, runs, n, flags, true, __func__);
}

/* The UP connection of p with the fewest unacknowledged bytes, below the
 * window; NULL if none. */
static kvt__conn *pick_conn(kvt_engine *e, kvt_peer *p, uint32_t need)
{
    kvt__conn *best = NULL;
    for (uint32_t i = 0; i < e->o.conns_per_peer; i++) {
        kvt__conn *c = p->conns[(p->rr + i) % e->o.conns_per_peer];
        if (!c || c->state != CS_UP || c->unacked_bytes + need > e->o.window_bytes)
            continue;
        if (!best || c->unacked_bytes < best->unacked_bytes)
            best = c;
    }
    p->rr++;
    return best;
}

/* Open missing connections and move backlog writes onto connections
 * within their window. */
void kvt__peer_pump(kvt_engine *e, kvt_peer *p)
{
    if (p->unhealthy_until_ns > kvc__mono_ns())
        return;
    /* A verbs peer needs one connection: the control channel for its QP. */
    uint32_t nconn = p->verbs ? 1 : e->o.conns_per_peer;
    for (uint32_t i = 0; i < nconn; i++)
        if (!p->conns[i] && (p->bl_head || p->rooms)) {
            kvc_err err = e->net->connect(e, p, i);
            if (err) {
                kvt__peer_fail(e, p, ECONNREFUSED, "connect to %s: %s", p->sid, kvc_last_error());
                return;
            }
        }
    if (p->verbs)
        e->rdma->pump(e, p);
    while (!p->verbs && p->bl_head) {
        kvt__conn *c = pick_conn(e, p, kvt__wr_cost(p->bl_head));
        if (!c)
            break;
        kvt__wr *w = p->bl_head;
        p->bl_head = w->next;
        if (!p->bl_head)
            p->bl_tail = NULL;
        w->next = NULL;
        c->unacked_bytes += kvt__wr_cost(w);
        kvt__conn_enqueue(c, w);
    }
    for (uint32_t i = 0; i < e->o.conns_per_peer; i++)
        if (p->conns[i])
            e->net->kick(e, p->conns[i]);
    for (kvt__sroom *r = p->rooms, *next; r; r = next) {
        next = r->next;
        kvt__sroom_check(e, r);
    }
}
