/*
 * xfer_gid.c - RoCE GID selection rules (see xfer_gid.h).  Pure.
 */
#include "xfer_gid.h"

#include <arpa/inet.h>
#include <stdio.h>
#include <string.h>

static const char *type_name(int t)
{
    return t == KVT_GID_ROCE_V2 ? "RoCEv2" : t == KVT_GID_ROCE_V1 ? "RoCEv1" : "IB";
}

void kvt_gid_text(const uint8_t raw[16], char *out, size_t cap)
{
    if (!inet_ntop(AF_INET6, raw, out, (socklen_t)cap))
        snprintf(out, cap, "?");
}

static int is_zero(const uint8_t *g)
{
    for (int i = 0; i < 16; i++)
        if (g[i])
            return 0;
    return 1;
}

/* 3: IPv4-mapped routable, 2: global IPv6, 1: link-local (v6 fe80::/10
 * or v4 169.254/16).  Higher is better. */
static int rank_of(const uint8_t *g)
{
    static const uint8_t v4map[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    if (!memcmp(g, v4map, 12))
        return g[12] == 169 && g[13] == 254 ? 1 : 3;
    if (g[0] == 0xfe && (g[1] & 0xc0) == 0x80)
        return 1;
    return 2;
}

static int choose_override(const kvt_gid_entry *t, size_t n, int override, char *why, size_t cap)
{
    char txt[64];
    for (size_t i = 0; i < n; i++)
        if (t[i].index == override && !is_zero(t[i].raw)) {
            kvt_gid_text(t[i].raw, txt, sizeof txt);
            snprintf(why, cap, "GID index %d (%s %s%s%s, override)", override, type_name(t[i].type),
                     txt, t[i].netdev[0] ? " on " : "", t[i].netdev);
            return override;
        }
    snprintf(why, cap, "GID index %d (override) is not a valid GID of this port", override);
    return -1;
}

int kvt_gid_choose(const kvt_gid_entry *t, size_t n, int link_is_ib, int override, char *why,
                   size_t cap)
{
    if (override >= 0)
        return choose_override(t, n, override, why, cap);
    int best = -1, best_rank = 0;
    size_t bi = 0;
    for (size_t i = 0; i < n; i++) {
        if (is_zero(t[i].raw))
            continue;
        if (link_is_ib) {
            if (best < 0 || t[i].index < best) {
                best = t[i].index;
                bi = i;
            }
            continue;
        }
        if (t[i].type != KVT_GID_ROCE_V2 || !t[i].netdev[0])
            continue;
        int r = rank_of(t[i].raw);
        if (r > best_rank || (r == best_rank && t[i].index < best)) {
            best = t[i].index;
            best_rank = r;
            bi = i;
        }
    }
    if (best < 0) {
        snprintf(why, cap, "%s",
                 link_is_ib ? "no valid GID on this InfiniBand port"
                            : "no RoCEv2 GID attached to a netdev on this port");
        return -1;
    }
    char txt[64];
    kvt_gid_text(t[bi].raw, txt, sizeof txt);
    static const char *rk[] = {"", "link-local", "global IPv6", "IPv4-mapped routable"};
    snprintf(why, cap, "GID index %d (%s %s%s%s, %s)", best, type_name(t[bi].type), txt,
             t[bi].netdev[0] ? " on " : "", t[bi].netdev,
             link_is_ib ? "InfiniBand" : rk[best_rank]);
    return best;
}
