/*
 * xfer_verbs.c - the libibverbs side of the engine: device selection
 * (skipping devices that cannot be opened, with a warning), port and GID
 * choice (the rule: gid/xfer_gid.c, shared with kvcoord-diag), protection domain, completion channel and
 * CQ, memory registration with RLIMIT_MEMLOCK named in errors.  The data
 * path (QPs, RDMA WRITE, completions, async events) is xfer_verbs_qp.c.
 *
 * Always compiled and linked.  On a host without an RDMA device
 * ibv_get_device_list() finds none and kvt__verbs_open() says so.
 */
#include <errno.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "xfer_gid.h"
#include "xfer_verbs.h"

kvc_err kvt__reg_error(int err, uint64_t addr, uint64_t len, const char *what)
{
    struct rlimit rl = {0, 0};
    getrlimit(RLIMIT_MEMLOCK, &rl);
    char lim[160] = "";
    if (err == ENOMEM || err == EPERM || err == EAGAIN) {
        char s[32], h[32];
        kvt__str(s, sizeof s, rl.rlim_cur == RLIM_INFINITY ? "unlimited" : "%llu bytes",
                 (unsigned long long)rl.rlim_cur);
        kvt__str(h, sizeof h, rl.rlim_max == RLIM_INFINITY ? "unlimited" : "%llu bytes",
                 (unsigned long long)rl.rlim_max);
        kvt__str(lim, sizeof lim, "; RLIMIT_MEMLOCK soft %s, hard %s%s", s, h,
                 rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < len
                     ? ": below the region's size, raise it (ulimit -l, LimitMEMLOCK=infinity)"
                     : "");
    }
    return kvt__fail(KVC_E_SYS, "cannot register [0x%llx, +%llu): %s: %s%s%s",
                     (unsigned long long)addr, (unsigned long long)len, what, strerror(err),
                     err == EFAULT ? " (range not mapped)" : "", lim);
}

int kvt__verbs_gid_pick(const kvt_options *o, const kvt__gid_entry *t, size_t n, int link_is_ib,
                        char *why, size_t cap)
{
    return kvt__gid_choose(t, n, link_is_ib, o->verbs_gid_index, why, cap);
}

/* Try one device: open, port active, a GID chosen.  0 on success. */
static int try_device(kvt_engine *e, struct ibv_device *d, struct kvt__verbs *v, char *why,
                      size_t cap)
{
    const char *name = ibv_get_device_name(d);
    v->ctx = ibv_open_device(d);
    if (!v->ctx) {
        kvt__str(why, cap, "RDMA device %s skipped: cannot open it (%s; uverbs node missing?)",
                 name, strerror(errno));
        return -1;
    }
    struct ibv_port_attr pa;
    if (ibv_query_port(v->ctx, (uint8_t)v->port, &pa) || pa.state != IBV_PORT_ACTIVE) {
        kvt__str(why, cap, "RDMA device %s skipped: port %d not active", name, v->port);
        return -1;
    }
    kvt__gid_entry t[256];
    size_t n = kvt__gid_read_table(v->ctx, v->port, t, 256);
    char gw[384];
    int idx =
        kvt__verbs_gid_pick(&e->o, t, n, pa.link_layer == IBV_LINK_LAYER_INFINIBAND, gw, sizeof gw);
    if (idx < 0 || ibv_query_gid(v->ctx, (uint8_t)v->port, idx, &v->gid)) {
        kvt__str(why, cap, "RDMA device %s skipped: %s", name, gw);
        return -1;
    }
    struct ibv_device_attr da;
    if (ibv_query_device(v->ctx, &da)) {
        kvt__str(why, cap, "RDMA device %s skipped: ibv_query_device: %s", name, strerror(errno));
        return -1;
    }
    v->max_qp_init_rd_atom = da.max_qp_init_rd_atom;
    v->max_qp_rd_atom = da.max_qp_rd_atom;
    v->gid_index = idx;
    v->lid = pa.lid;
    v->is_roce = pa.link_layer == IBV_LINK_LAYER_ETHERNET;
    v->active_mtu = pa.active_mtu;
    kvt__str(v->dev, sizeof v->dev, "%s", name);
    v->pd = ibv_alloc_pd(v->ctx);
    v->chan = v->pd ? ibv_create_comp_channel(v->ctx) : NULL;
    /* Room for the WRs of ~30 QPs (xfer_verbs_qp.c grows it past that). */
    v->cq = v->chan ? ibv_create_cq(v->ctx, 16384, NULL, v->chan, 0) : NULL;
    if (!v->cq || ibv_req_notify_cq(v->cq, 0)) {
        kvt__str(why, cap, "RDMA device %s skipped: PD/CQ setup failed (%s)", name,
                 strerror(errno));
        return -1;
    }
    /* Both fds are polled on the engine's io_uring (POLL_ADD), then read
     * until EAGAIN: they must not block. */
    if (fcntl(v->chan->fd, F_SETFL, fcntl(v->chan->fd, F_GETFL) | O_NONBLOCK) ||
        fcntl(v->ctx->async_fd, F_SETFL, fcntl(v->ctx->async_fd, F_GETFL) | O_NONBLOCK)) {
        kvt__str(why, cap, "RDMA device %s skipped: fcntl O_NONBLOCK: %s", name, strerror(errno));
        return -1;
    }
    kvt__str(why, cap, "device %s port %d, %s", name, v->port, gw);
    return 0;
}

static void release(struct kvt__verbs *v)
{
    if (v->cq)
        ibv_destroy_cq(v->cq);
    if (v->chan)
        ibv_destroy_comp_channel(v->chan);
    if (v->pd)
        ibv_dealloc_pd(v->pd);
    if (v->ctx)
        ibv_close_device(v->ctx);
    memset(v, 0, sizeof *v);
}

int kvt__verbs_open(kvt_engine *e, char *why, size_t cap)
{
    int num = 0;
    errno = 0;
    struct ibv_device **list = ibv_get_device_list(&num);
    if (!list) {
        kvt__str(why, cap, "ibv_get_device_list failed: %s (no RDMA support in this kernel?)",
                 strerror(errno));
        return -1;
    }
    if (num == 0) {
        kvt__str(why, cap, "no RDMA device found by ibv_get_device_list");
        ibv_free_device_list(list);
        return -1;
    }
    struct kvt__verbs *v = calloc(1, sizeof *v);
    int rc = -1;
    char last[256] = "no usable RDMA device";
    for (int i = 0; v && i < num && rc; i++) {
        const char *name = ibv_get_device_name(list[i]);
        if (e->o.verbs_device && strcmp(e->o.verbs_device, name))
            continue;
        v->port = e->o.verbs_port > 0 ? e->o.verbs_port : 1;
        rc = try_device(e, list[i], v, last, sizeof last);
        if (rc) {
            kvt__log(e, KVT_LOG_WARN, "%s", last);
            release(v);
        }
    }
    ibv_free_device_list(list);
    if (rc) {
        if (e->o.verbs_device && !strcmp(last, "no usable RDMA device"))
            kvt__str(last, sizeof last, "RDMA device %s not found", e->o.verbs_device);
        kvt__str(why, cap, "%s", last);
        free(v);
        return -1;
    }
    kvt__str(why, cap, "%s", last);
    e->verbs = v;
    return 0;
}

void kvt__verbs_close(kvt_engine *e)
{
    if (!e->verbs)
        return;
    kvt__verbs_free_qps(e); /* QPs before the CQ they complete on */
    release(e->verbs);
    free(e->verbs);
    e->verbs = NULL;
}

kvc_err kvt__verbs_reg(kvt_engine *e, kvt__region *r)
{
    struct ibv_mr *mr =
        ibv_reg_mr(e->verbs->pd, (void *)(uintptr_t)r->addr, r->len,
                   IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
    if (!mr)
        return kvt__reg_error(errno ? errno : ENOMEM, r->addr, r->len, "ibv_reg_mr");
    r->mr = mr;
    r->rkey = mr->rkey;
    return KVC_OK;
}

void kvt__verbs_dereg(kvt_engine *e, kvt__region *r)
{
    (void)e;
    if (r->mr)
        ibv_dereg_mr(r->mr);
    r->mr = NULL;
}

json_t *kvt__verbs_desc(kvt_engine *e)
{
    if (!e->verbs)
        return NULL;
    char gid[64];
    kvt__gid_text(e->verbs->gid.raw, gid, sizeof gid);
    return json_pack("{s:s,s:i,s:i,s:s,s:i}", "device", e->verbs->dev, "port", e->verbs->port,
                     "gid_index", e->verbs->gid_index, "gid", gid, "lid", (int)e->verbs->lid);
}

const struct kvt__rdma_ops kvt__verbs_rdma = {
    .open = kvt__verbs_open,
    .close = kvt__verbs_close,
    .desc = kvt__verbs_desc,
    .reg = kvt__verbs_reg,
    .dereg = kvt__verbs_dereg,
    .hello_ok = kvt__verbs_hello_ok,
    .qp_info = kvt__verbs_qp_info,
    .pump = kvt__verbs_pump,
    .notify = kvt__verbs_notify,
    .peer_down = kvt__verbs_peer_down,
    .conn_closed = kvt__verbs_conn_closed,
    .arm = kvt__verbs_arm,
    .cqe = kvt__verbs_cqe,
    .busy = kvt__verbs_busy,
};
