/*
 * xfer_engine.c - the transfer engine's API: options, backend choice,
 * memory regions, logging, the io_uring loop (progress), events, and room
 * bookkeeping in the segment.  Peers and writes are in xfer_submit.c, the
 * connection layer in xfer_conn.c and xfer_rx.c, the backends behind
 * e->net (xfer_tcp.c) and e->rdma (verbs/), the descriptor in xfer_desc.c.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "xfer_cma.h"
#include "xfer_conn.h"

KVT_API const char *kvt_backend_name(kvt_backend b)
{
    switch (b) {
    case KVT_BACKEND_AUTO: return "auto";
    case KVT_BACKEND_TCP: return "tcp";
    case KVT_BACKEND_VERBS: return "verbs";
    }
    return "unknown";
}

KVT_API kvc_err kvt_backend_parse(const char *s, kvt_backend *out)
{
    static const kvt_backend all[] = {KVT_BACKEND_AUTO, KVT_BACKEND_TCP, KVT_BACKEND_VERBS};
    KVT_ARG(s);
    KVT_ARG(out);
    for (size_t i = 0; i < 3; i++)
        if (!strcmp(s, kvt_backend_name(all[i]))) {
            *out = all[i];
            return KVC_OK;
        }
    return kvt__fail(KVC_E_INVAL, "unknown backend \"%s\" (want auto, tcp or verbs)", s);
}

KVT_API void kvt_options_init(kvt_options *o)
{
    if (!o)
        return;
    memset(o, 0, sizeof *o);
    o->backend = KVT_BACKEND_AUTO;
    o->listen = "127.0.0.1:0";
    o->verbs_gid_index = -1;
    o->verbs_port = 1;
    o->conns_per_peer = 2;
    o->slice_bytes = 1u << 20;
    o->window_bytes = 32u << 20;
    o->tcp_splice_min = 0; /* off: measured, docs/transfer.md "Splice" */
    o->connect_timeout_ms = 5000;
    o->io_timeout_ms = 10000;
    o->unhealthy_ttl_ms = 30000;
}

void kvt__str(char *dst, size_t cap, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(dst, cap, fmt, ap);
    va_end(ap);
}

void kvt__log(kvt_engine *e, int level, const char *fmt, ...)
{
    if (!e->o.log)
        return;
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    e->o.log(e->o.log_ctx, level, buf);
}

struct io_uring_sqe *kvt__sqe(kvt_engine *e)
{
    if (e->ring_err)
        return NULL;
    /* The full-SQ policy kvcoordd uses too (uring_ud.h). */
    int err;
    struct io_uring_sqe *s = kvc__uring_sqe(&e->ring, &err);
    if (!s) { /* the kernel took nothing: the engine cannot queue work */
        e->ring_err = err ? err : EAGAIN;
        kvt__str(e->ring_why, sizeof e->ring_why,
                 "io_uring submission queue of the transfer engine stays full (submit: %s); the "
                 "engine is unusable: destroy it",
                 err ? strerror(err) : "nothing consumed");
    }
    return s;
}

/* KVC_E_SYS once kvt__sqe() could not get an SQE. */
kvc_err kvt__ring_check(kvt_engine *e)
{
    return e->ring_err ? kvt__fail(KVC_E_SYS, "%s", e->ring_why) : KVC_OK;
}

static kvc_err check_options(const kvt_options *o)
{
    if (o->conns_per_peer < 1 || o->conns_per_peer > 16)
        return kvt__fail(KVC_E_INVAL, "conns_per_peer %u out of 1..16", o->conns_per_peer);
    if (o->slice_bytes < 4096 || o->slice_bytes > KVT_FRAME_MAX)
        return kvt__fail(KVC_E_INVAL, "slice_bytes %u out of 4096..%u", o->slice_bytes,
                         KVT_FRAME_MAX);
    if (o->window_bytes < o->slice_bytes)
        return kvt__fail(KVC_E_INVAL, "window_bytes %u smaller than slice_bytes %u",
                         o->window_bytes, o->slice_bytes);
    if (!o->connect_timeout_ms || !o->io_timeout_ms)
        return kvt__fail(KVC_E_INVAL, "timeouts must be > 0 ms");
    if (o->token && strlen(o->token) > KVT_HELLO_STR_MAX)
        return kvt__fail(KVC_E_INVAL, "token longer than %u bytes", KVT_HELLO_STR_MAX);
    if (o->token && !o->token[0]) /* would silently mean "no token required" */
        return kvt__fail(KVC_E_INVAL, "token is empty (pass NULL for none)");
    if ((unsigned)o->backend > KVT_BACKEND_VERBS)
        return kvt__fail(KVC_E_INVAL, "unknown backend %d", (int)o->backend);
    return KVC_OK;
}

/* Choose the backend: verbs when asked or (auto) when a device opens. */
static kvc_err choose_backend(kvt_engine *e)
{
    char why[256] = "";
    if (e->o.backend == KVT_BACKEND_TCP) {
        e->backend = KVT_BACKEND_TCP;
        return KVC_OK;
    }
    if (e->rdma->open(e, why, sizeof why) == 0) {
        e->backend = KVT_BACKEND_VERBS;
        kvt__log(e, KVT_LOG_INFO, "transfer backend: verbs (%s)", why);
        return KVC_OK;
    }
    if (e->o.backend == KVT_BACKEND_VERBS)
        return kvt__fail(KVC_E_NOENT, "verbs backend unavailable: %s", why);
    e->backend = KVT_BACKEND_TCP;
    kvt__log(e, KVT_LOG_INFO, "transfer backend: tcp (auto: %s)", why);
    return KVC_OK;
}

KVT_API kvc_err kvt_engine_create(const kvt_options *opts, kvt_engine **out)
{
    KVT_ARG(opts);
    KVT_ARG(out);
    *out = NULL;
    kvc_err err = check_options(opts);
    if (err)
        return err;
    kvt_engine *e = calloc(1, sizeof *e);
    if (!e)
        return kvt__fail(KVC_E_SYS, "out of memory for the engine");
    kvt__backends_bind(e);
    e->o = *opts;
    e->o.listen = NULL;
    e->o.advertise_host = NULL;
    e->o.verbs_device = NULL;
    e->lfd = -1;
    e->next_rkey = 1;
    e->generation = (kvc__now_ns() ^ ((uint64_t)getpid() << 40)) & INT64_MAX;
    if (opts->token && !(e->token = strdup(opts->token)))
        err = kvt__fail(KVC_E_SYS, "out of memory");
    if (e->token) /* calloc'ed: the rest stays zero */
        memcpy(e->token_pad, e->token, strlen(e->token));
    if (!err) {
        e->o.verbs_device = opts->verbs_device; /* used during create only */
        err = choose_backend(e);
        e->o.verbs_device = NULL;
    }
    if (!err)
        kvt__cma_init(e);
    if (!err) {
        int rc = io_uring_queue_init(1024, &e->ring, 0);
        if (rc < 0)
            err = kvt__fail(KVC_E_SYS, "io_uring_queue_init: %s", strerror(-rc));
        else
            e->ring_ok = true;
    }
    if (!err) {
        e->o.listen = opts->listen ? opts->listen : "127.0.0.1:0";
        e->o.advertise_host = opts->advertise_host;
        err = e->net->listen(e);
        e->o.listen = NULL;
        e->o.advertise_host = NULL;
    }
    if (err) {
        kvt_engine_destroy(e);
        return err;
    }
    e->net->arm_accept(e);
    *out = e;
    return KVC_OK;
}

/* The accessors answer a NULL engine with a value no engine has, and say so
 * in kvc_last_error(). */
static void null_engine(const char *fn) { kvt__fail(KVC_E_INVAL, "%s: argument e is NULL", fn); }

KVT_API kvt_backend kvt_engine_backend(const kvt_engine *e)
{
    if (!e) {
        null_engine(__func__);
        return KVT_BACKEND_AUTO;
    }
    return e->backend;
}

KVT_API const char *kvt_session_id(const kvt_engine *e)
{
    if (!e) {
        null_engine(__func__);
        return "";
    }
    return e->sid;
}

KVT_API uint64_t kvt_generation(const kvt_engine *e)
{
    if (!e) {
        null_engine(__func__);
        return 0;
    }
    return e->generation;
}

KVT_API int kvt_fd(const kvt_engine *e)
{
    if (!e) {
        null_engine(__func__);
        return -1;
    }
    return e->ring.ring_fd;
}

KVT_API kvc_err kvt_engine_stat(const kvt_engine *e, kvt_stats *out)
{
    KVT_ARG(e);
    KVT_ARG(out);
    *out = e->st;
    out->peers = (uint32_t)e->npeers;
    out->peers_unhealthy = 0;
    uint64_t now = kvc__mono_ns();
    for (size_t i = 0; i < e->npeers; i++)
        if (e->peers[i]->unhealthy_until_ns > now)
            out->peers_unhealthy++;
    out->senders = e->nrpeers;
    out->conns_up = 0;
    for (uint32_t i = 0; i < e->nconns_cap; i++)
        if (e->conns[i] && e->conns[i]->state == CS_UP)
            out->conns_up++;
    return KVC_OK;
}

/* ---- memory regions --------------------------------------------------- */

kvt__region *kvt__region_find(kvt_engine *e, uint64_t addr, uint64_t len)
{
    for (size_t i = 0; i < e->nregions; i++) {
        kvt__region *r = &e->regions[i];
        if (addr >= r->addr && addr - r->addr <= r->len && len <= r->len - (addr - r->addr))
            return r;
    }
    return NULL;
}

/* EFAULT when any page of [addr, addr+len) is not mapped (mincore says
 * ENOMEM), checked in chunks so the vector stays small. */
static int range_mapped(uint64_t addr, uint64_t len)
{
    long pg = sysconf(_SC_PAGESIZE);
    uint64_t a = addr & ~(uint64_t)(pg - 1), end = addr + len;
    unsigned char vec[4096];
    while (a < end) {
        uint64_t n = (end - a + (uint64_t)pg - 1) / (uint64_t)pg;
        if (n > sizeof vec)
            n = sizeof vec;
        if (mincore((void *)(uintptr_t)a, n * (uint64_t)pg, vec))
            return errno == ENOMEM ? EFAULT : errno;
        a += n * (uint64_t)pg;
    }
    return 0;
}

KVT_API kvc_err kvt_mr_register(kvt_engine *e, void *addr, size_t len, uint32_t *rkey_out)
{
    KVT_ARG(e);
    KVT_ARG(addr);
    if (!len)
        return kvt__fail(KVC_E_INVAL, "kvt_mr_register: len is 0");
    uint64_t a = (uint64_t)(uintptr_t)addr;
    if (a + len < a)
        return kvt__fail(KVC_E_INVAL, "region [0x%llx, +%zu) wraps around", (unsigned long long)a,
                         len);
    for (size_t i = 0; i < e->nregions; i++) {
        kvt__region *r = &e->regions[i];
        if (a < r->addr + r->len && r->addr < a + len)
            return kvt__fail(KVC_E_INVAL,
                             "region [0x%llx, +%zu) overlaps registered [0x%llx, +%llu)",
                             (unsigned long long)a, len, (unsigned long long)r->addr,
                             (unsigned long long)r->len);
    }
    if (e->nregions == KVT_MAX_REGIONS)
        return kvt__fail(KVC_E_FULL, "too many memory regions (max %d)", KVT_MAX_REGIONS);
    int rc = range_mapped(a, len);
    if (rc)
        return kvt__reg_error(rc, a, len, "mincore");
    kvt__region *r = &e->regions[e->nregions];
    memset(r, 0, sizeof *r);
    r->addr = a;
    r->len = len;
    r->rkey = e->next_rkey++;
    if (e->backend == KVT_BACKEND_VERBS) {
        kvc_err err = e->rdma->reg(e, r);
        if (err)
            return err;
    }
    e->nregions++;
    if (rkey_out)
        *rkey_out = r->rkey;
    return KVC_OK;
}

KVT_API kvc_err kvt_mr_deregister(kvt_engine *e, void *addr)
{
    KVT_ARG(e);
    for (size_t i = 0; i < e->nregions; i++) {
        kvt__region *r = &e->regions[i];
        if (r->addr != (uint64_t)(uintptr_t)addr)
            continue;
        if (r->busy)
            return kvt__fail(KVC_E_BUSY,
                             "region 0x%llx: %u receive(s) or read(s) into or from it in progress",
                             (unsigned long long)r->addr, r->busy);
        /* A sender's queued writes may point into it: the caller's contract
         * (transfer.h) is to wait for the room's event first. */
        e->rdma->dereg(e, r);
        /* The last entry moves into slot i: a receive in flight into it
         * holds its pointer (c->dreg), which follows it. */
        kvt__region *last = &e->regions[--e->nregions];
        if (last != r) {
            *r = *last;
            for (uint32_t k = 0; k < e->nconns_cap; k++)
                if (e->conns[k] && e->conns[k]->dreg == last)
                    e->conns[k]->dreg = r;
        }
        return KVC_OK;
    }
    return kvt__fail(KVC_E_NOENT, "no region starts at %p", addr);
}

/* ---- rooms in the segment ----------------------------------------------- */

void kvt__seg_open(kvt_engine *e, uint64_t room, kvc_room_role role)
{
    if (!e->o.seg)
        return;
    kvc_err err = kvc_room_open(e->o.seg, room, 0, e->o.rank, role);
    if (!err)
        err = kvc_room_set_state(e->o.seg, room, e->o.rank, KVC_POLL_TRANSFERRING);
    if (err)
        kvt__log(e, KVT_LOG_WARN, "room %llu: cannot record Transferring: %s",
                 (unsigned long long)room, kvc_last_error());
}

void kvt__seg_success(kvt_engine *e, uint64_t room)
{
    if (e->o.seg && kvc_room_set_state(e->o.seg, room, e->o.rank, KVC_POLL_SUCCESS))
        kvt__log(e, KVT_LOG_WARN, "room %llu: cannot record Success: %s", (unsigned long long)room,
                 kvc_last_error());
}

void kvt__seg_fail(kvt_engine *e, uint64_t room, int32_t code, const char *reason)
{
    if (e->o.seg && kvc_room_fail(e->o.seg, room, e->o.rank, code, reason, NULL))
        kvt__log(e, KVT_LOG_WARN, "room %llu: cannot record failure: %s", (unsigned long long)room,
                 kvc_last_error());
}

void kvt__push_event(kvt_engine *e, const kvt_event *ev)
{
    if (e->nev == e->evcap) {
        size_t cap = e->evcap ? e->evcap * 2 : 64;
        kvt_event *n = realloc(e->evq, cap * sizeof *n);
        if (!n) {
            /* Out of memory: the segment still has the outcome; drop. */
            kvt__log(e, KVT_LOG_ERROR, "room %llu: event dropped (out of memory)",
                     (unsigned long long)ev->room);
            return;
        }
        e->evq = n;
        e->evcap = cap;
    }
    e->evq[e->nev++] = *ev;
    if (ev->state == KVC_POLL_SUCCESS)
        e->st.rooms_ok++;
    else
        e->st.rooms_failed++;
}

/* ---- the loop -------------------------------------------------------------- */

static void dispatch(kvt_engine *e, struct io_uring_cqe *cqe)
{
    switch (KVT_UD_OP(cqe->user_data)) {
    case KVT_OP_TIMER: e->timer_armed = false; break;
    case KVT_OP_VERBS_CQ:
    case KVT_OP_VERBS_ASYNC: e->rdma->cqe(e, cqe); break;
    case KVT_OP_ACCEPT:
        e->accept_armed = false;
        /* fallthrough */
    default: kvt__conn_cqe(e, cqe);
    }
}

/* Arm the deadline timer (a TIMEOUT SQE, so kvt_fd() wakes for it too). */
static void arm_timer(kvt_engine *e)
{
    if (e->timer_armed || !kvt__conn_has_deadlines(e))
        return;
    e->timer_ts.tv_sec = 0;
    e->timer_ts.tv_nsec = KVT_TICK_MS * 1000000LL;
    struct io_uring_sqe *s = kvt__sqe(e);
    if (!s)
        return;
    io_uring_prep_timeout(s, &e->timer_ts, 0, 0);
    io_uring_sqe_set_data64(s, KVT_UD(KVT_OP_TIMER, 0));
    e->timer_armed = true;
}

static kvc_err drain_completions(kvt_engine *e, int wait_ms)
{
    struct io_uring_cqe *cqe;
    int rc;
    if (!e->accept_armed)
        e->net->arm_accept(e);
    arm_timer(e);
    e->rdma->arm(e);
    if (wait_ms > 0) {
        struct __kernel_timespec ts = {.tv_sec = wait_ms / 1000,
                                       .tv_nsec = (wait_ms % 1000) * 1000000LL};
        rc = io_uring_submit_and_wait_timeout(&e->ring, &cqe, 1, &ts, NULL);
    } else {
        rc = io_uring_submit(&e->ring);
    }
    if (rc < 0 && rc != -ETIME && rc != -EINTR && rc != -EBUSY && rc != -EAGAIN)
        return kvt__fail(KVC_E_SYS, "io_uring_submit_and_wait: %s", strerror(-rc));
    /* Copy the CQE and mark it seen before dispatching: handlers queue new
     * SQEs and may free the connection the CQE names. */
    while (io_uring_peek_cqe(&e->ring, &cqe) == 0) {
        struct io_uring_cqe copy = *cqe;
        io_uring_cqe_seen(&e->ring, cqe);
        dispatch(e, &copy);
    }
    kvt__conn_deadlines(e, kvc__mono_ns());
    io_uring_submit(&e->ring);
    return kvt__ring_check(e);
}

KVT_API kvc_err kvt_progress(kvt_engine *e, int timeout_ms, kvt_event *ev, size_t cap, size_t *n)
{
    KVT_ARG(e);
    KVT_ARG(n);
    *n = 0;
    if (cap)
        KVT_ARG(ev);
    kvc_err rerr = kvt__ring_check(e);
    if (rerr)
        return rerr;
    uint64_t end = timeout_ms < 0 ? UINT64_MAX : kvc__mono_ns() + (uint64_t)timeout_ms * 1000000ull;
    for (;;) {
        uint64_t now = kvc__mono_ns();
        int wait = 0;
        if (e->nev == 0 && now < end) {
            uint64_t left = (end - now) / 1000000ull;
            wait = left > KVT_TICK_MS ? KVT_TICK_MS : (int)(left ? left : 1);
        }
        kvc_err err = drain_completions(e, wait);
        if (err)
            return err;
        if (e->nev || kvc__mono_ns() >= end || timeout_ms == 0)
            break;
    }
    size_t k = e->nev < cap ? e->nev : cap;
    if (k) { /* evq is NULL until the first event */
        memcpy(ev, e->evq, k * sizeof *ev);
        memmove(e->evq, e->evq + k, (e->nev - k) * sizeof *ev);
        e->nev -= k;
    }
    *n = k;
    return KVC_OK;
}

/* Close every connection, then wait (bounded) until the kernel has given
 * back every buffer: connections are freed only when their SQEs are done. */
static void drain_all(kvt_engine *e)
{
    for (uint32_t i = 0; i < e->nconns_cap; i++)
        if (e->conns[i])
            kvt__conn_close(e, e->conns[i]);
    for (size_t i = 0; i < e->npeers; i++)
        if (e->peers[i]->rooms || e->peers[i]->bl_head)
            kvt__peer_fail(e, e->peers[i], ECANCELED, "engine destroyed");
    uint64_t end = kvc__mono_ns() + (uint64_t)e->o.io_timeout_ms * 1000000ull;
    for (;;) {
        bool any = false;
        for (uint32_t i = 0; i < e->nconns_cap && !any; i++)
            any = e->conns[i] != NULL;
        any = any || e->rdma->busy(e); /* WRs not yet flushed read our memory */
        if (!any || kvc__mono_ns() > end)
            break;
        drain_completions(e, 10);
    }
}

KVT_API void kvt_engine_destroy(kvt_engine *e)
{
    if (!e)
        return;
    e->destroying = true; /* the rpeers are freed below, rooms silently */
    if (e->ring_ok) {
        drain_all(e);
        io_uring_queue_exit(&e->ring);
    }
    if (e->lfd >= 0)
        close(e->lfd);
    kvt__peers_free(e);
    kvt__cma_fini(e);
    while (e->rpeers) {
        kvt__rpeer *rp = e->rpeers;
        e->rpeers = rp->next;
        while (rp->rooms) {
            kvt__rroom *r = rp->rooms;
            rp->rooms = r->next;
            free(r);
        }
        free(rp);
    }
    while (e->expects) {
        kvt__expect *x = e->expects;
        e->expects = x->next;
        free(x);
    }
    for (size_t i = 0; i < e->nregions; i++)
        e->rdma->dereg(e, &e->regions[i]);
    e->rdma->close(e);
    free(e->conns);
    free(e->evq);
    free(e->token);
    free(e);
}
