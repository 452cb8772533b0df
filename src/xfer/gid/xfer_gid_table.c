/*
 * xfer_gid_table.c - reading an RDMA port's GID table (libibverbs), for
 * the engine's device setup and for `kvcoord-diag rdma` alike.
 */
#include <infiniband/verbs.h>
#include <net/if.h>
#include <string.h>

#include "xfer_gid.h"

size_t kvt__gid_read_table(struct ibv_context *ctx, int port, kvt__gid_entry *t, size_t cap)
{
    struct ibv_gid_entry g[256];
    ssize_t n = ibv_query_gid_table(ctx, g, 256, 0);
    size_t k = 0;
    for (ssize_t i = 0; i < n && k < cap; i++) {
        if ((int)g[i].port_num != port)
            continue;
        kvt__gid_entry *x = &t[k++];
        memset(x, 0, sizeof *x);
        x->index = (int)g[i].gid_index;
        memcpy(x->raw, g[i].gid.raw, 16);
        x->type = g[i].gid_type == IBV_GID_TYPE_ROCE_V2   ? KVT_GID_ROCE_V2
                  : g[i].gid_type == IBV_GID_TYPE_ROCE_V1 ? KVT_GID_ROCE_V1
                                                          : KVT_GID_IB;
        if (g[i].ndev_ifindex)
            if_indextoname(g[i].ndev_ifindex, x->netdev);
    }
    return k;
}
