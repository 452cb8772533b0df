/*
 * diag_gid.c - which GID of a port kvcoord uses, and why.  Pure functions
 * over a GID table, so the rules are tested without RDMA hardware.
 *
 * Field failures this guards against: a RoCEv1 GID listed first (filter by
 * type); several RoCEv2 GIDs, with a link-local one tying with a routable
 * one (skip fe80::/10, prefer a netdev-attached routable address, IPv4-mapped
 * first since RoCEv2 fabrics are mostly routed IPv4).
 */
#include <arpa/inet.h>
#include <stdio.h>
#include <string.h>

#include "diag.h"

const char *diag_gid_type_name(diag_gid_type t, int infiniband)
{
    switch (t) {
    case DIAG_GID_ROCE_V1: return infiniband ? "IB" : "RoCEv1";
    case DIAG_GID_ROCE_V2: return "RoCEv2";
    default: return "unknown";
    }
}

char *diag_gid_text(const uint8_t raw[16], char *buf, size_t cap)
{
    char tmp[INET6_ADDRSTRLEN];
    if (!inet_ntop(AF_INET6, raw, tmp, sizeof tmp))
        snprintf(tmp, sizeof tmp, "?");
    snprintf(buf, cap, "%s", tmp);
    return buf;
}

static int is_zero(const uint8_t *a)
{
    for (int i = 0; i < 16; i++)
        if (a[i])
            return 0;
    return 1;
}

static int is_link_local(const uint8_t *a) { return a[0] == 0xfe && (a[1] & 0xc0) == 0x80; }

static int is_v4_mapped(const uint8_t *a)
{
    static const uint8_t prefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    return !memcmp(a, prefix, 12);
}

typedef struct skipped {
    unsigned v1, no_netdev, link_local, zero, unknown;
} skipped;

/* 2: IPv4-mapped, 1: other routable, 0: not a candidate (counted in sk). */
static int score(const diag_gid *g, skipped *sk)
{
    if (is_zero(g->raw))
        return sk->zero++, 0;
    if (g->type == DIAG_GID_ROCE_V1)
        return sk->v1++, 0;
    if (g->type != DIAG_GID_ROCE_V2)
        return sk->unknown++, 0;
    if (!g->netdev[0])
        return sk->no_netdev++, 0;
    if (is_link_local(g->raw))
        return sk->link_local++, 0;
    return is_v4_mapped(g->raw) ? 2 : 1;
}

static void skipped_text(const skipped *sk, char *buf, size_t cap)
{
    size_t o = 0;
    buf[0] = '\0';
    const struct {
        unsigned n;
        const char *what;
    } parts[] = {{sk->v1, "RoCEv1"},
                 {sk->link_local, "link-local"},
                 {sk->no_netdev, "without a netdev"},
                 {sk->unknown, "of unknown type"}};
    for (size_t i = 0; i < sizeof parts / sizeof *parts && o < cap; i++)
        if (parts[i].n)
            o += (size_t)snprintf(buf + o, cap - o, "%s%u %s", o ? ", " : "", parts[i].n,
                                  parts[i].what);
    if (!o)
        snprintf(buf, cap, "none");
}

int diag_gid_choose(const diag_gid *g, size_t n, int infiniband, char *why, size_t cap)
{
    if (infiniband) {
        for (size_t i = 0; i < n; i++)
            if (g[i].index == 0 && !is_zero(g[i].raw)) {
                snprintf(why, cap,
                         "InfiniBand link layer: index 0, the port GID (routing uses "
                         "LIDs)");
                return 0;
            }
        snprintf(why, cap, "InfiniBand link layer but GID index 0 is empty");
        return -1;
    }
    skipped sk = {0};
    int best = -1, best_score = 0;
    unsigned candidates = 0;
    for (size_t i = 0; i < n; i++) {
        int s = score(&g[i], &sk);
        candidates += s > 0;
        if (s > best_score || (s == best_score && s > 0 && g[i].index < g[best].index)) {
            best = (int)i;
            best_score = s;
        }
    }
    char skip[160], addr[INET6_ADDRSTRLEN];
    skipped_text(&sk, skip, sizeof skip);
    if (best < 0) {
        snprintf(why, cap, "no RoCEv2 GID with a netdev and a routable address (skipped: %s)",
                 skip);
        return -1;
    }
    snprintf(why, cap,
             "RoCEv2, %s %s on %s; %u candidate%s (IPv4-mapped first, then the lowest "
             "index); skipped: %s",
             best_score == 2 ? "IPv4-mapped" : "routable IPv6",
             diag_gid_text(g[best].raw, addr, sizeof addr), g[best].netdev, candidates,
             candidates == 1 ? "" : "s", skip);
    return g[best].index;
}
