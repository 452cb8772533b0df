/*
 * xfer_gid.c - RoCE GID selection rules (see xfer_gid.h).  Pure.
 */
#include "xfer_gid.h"

#include <arpa/inet.h>
#include <stdio.h>
#include <string.h>

/* Kinds of RoCEv2 candidates, best last (rule 4). */
enum { KIND_NONE = 0, KIND_LINK_LOCAL = 1, KIND_GLOBAL_V6 = 2, KIND_V4_MAPPED = 3, KINDS = 4 };
static const char *const kind_names[KINDS] = {"", "link-local", "global IPv6",
                                              "IPv4-mapped routable"};

const char *kvt__gid_type_name(int t)
{
    switch (t) {
    case KVT_GID_IB: return "IB";
    case KVT_GID_ROCE_V1: return "RoCEv1";
    case KVT_GID_ROCE_V2: return "RoCEv2";
    }
    return "unknown";
}

void kvt__gid_text(const uint8_t raw[16], char *out, size_t cap)
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

static int kind_of(const uint8_t *g)
{
    static const uint8_t v4map[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    if (!memcmp(g, v4map, 12))
        return g[12] == 169 && g[13] == 254 ? KIND_LINK_LOCAL : KIND_V4_MAPPED;
    if (g[0] == 0xfe && (g[1] & 0xc0) == 0x80)
        return KIND_LINK_LOCAL;
    return KIND_GLOBAL_V6;
}

/* What an Ethernet port's table held: candidates per kind, and the
 * entries that were not candidates, per reason. */
struct tally {
    unsigned kind[KINDS];
    unsigned v1, ib_type, no_netdev, zero;
};

/* Append "; candidates: ...; skipped: ..." to why (at offset o). */
static void tally_text(const struct tally *ty, char *why, size_t cap, size_t o)
{
    const struct {
        unsigned n;
        const char *what;
    } skipped[] = {{ty->v1, "RoCEv1"},
                   {ty->ib_type, "of IB type"},
                   {ty->no_netdev, "without a netdev"},
                   {ty->zero, "zero"}};
    size_t k = 0;
    for (int i = KINDS - 1; i > KIND_NONE && o < cap; i--)
        if (ty->kind[i])
            o += (size_t)snprintf(why + o, cap - o, "%s%u %s",
                                  k++ ? ", " : "; candidates: ", ty->kind[i], kind_names[i]);
    if (!k && o < cap)
        o += (size_t)snprintf(why + o, cap - o, "; candidates: none");
    k = 0;
    for (size_t i = 0; i < sizeof skipped / sizeof *skipped && o < cap; i++)
        if (skipped[i].n)
            o += (size_t)snprintf(why + o, cap - o, "%s%u %s",
                                  k++ ? ", " : "; skipped: ", skipped[i].n, skipped[i].what);
}

static size_t entry_text(const kvt__gid_entry *g, const char *note, char *why, size_t cap)
{
    char txt[64];
    kvt__gid_text(g->raw, txt, sizeof txt);
    int n = snprintf(why, cap, "GID index %d (%s %s%s%s, %s)", g->index,
                     kvt__gid_type_name(g->type), txt, g->netdev[0] ? " on " : "", g->netdev, note);
    return n < 0 ? 0 : (size_t)n < cap ? (size_t)n : cap;
}

static int choose_override(const kvt__gid_entry *t, size_t n, int override, char *why, size_t cap)
{
    for (size_t i = 0; i < n; i++)
        if (t[i].index == override && !is_zero(t[i].raw)) {
            entry_text(&t[i], "override", why, cap);
            return override;
        }
    snprintf(why, cap, "GID index %d (override) is not a valid GID of this port", override);
    return -1;
}

static int choose_ib(const kvt__gid_entry *t, size_t n, char *why, size_t cap)
{
    size_t best = n;
    for (size_t i = 0; i < n; i++)
        if (!is_zero(t[i].raw) && (best == n || t[i].index < t[best].index))
            best = i;
    if (best == n) {
        snprintf(why, cap, "no valid GID on this InfiniBand port");
        return -1;
    }
    entry_text(&t[best], "InfiniBand: the lowest valid index", why, cap);
    return t[best].index;
}

int kvt__gid_choose(const kvt__gid_entry *t, size_t n, int link_is_ib, int override, char *why,
                    size_t cap)
{
    char spare[8];
    if (!why || !cap) {
        why = spare;
        cap = sizeof spare;
    }
    if (!t)
        n = 0;
    if (override >= 0)
        return choose_override(t, n, override, why, cap);
    if (link_is_ib)
        return choose_ib(t, n, why, cap);
    struct tally ty = {{0}, 0, 0, 0, 0};
    size_t best = n;
    int best_kind = KIND_NONE;
    for (size_t i = 0; i < n; i++) {
        if (is_zero(t[i].raw)) {
            ty.zero++;
            continue;
        }
        if (t[i].type != KVT_GID_ROCE_V2) {
            t[i].type == KVT_GID_ROCE_V1 ? ty.v1++ : ty.ib_type++;
            continue;
        }
        if (!t[i].netdev[0]) {
            ty.no_netdev++;
            continue;
        }
        int k = kind_of(t[i].raw);
        ty.kind[k]++;
        if (k > best_kind || (k == best_kind && t[i].index < t[best].index)) {
            best = i;
            best_kind = k;
        }
    }
    size_t o;
    if (best == n) {
        int w = snprintf(why, cap, "no RoCEv2 GID attached to a netdev on this port");
        o = w < 0 ? 0 : (size_t)w;
    } else {
        o = entry_text(&t[best], kind_names[best_kind], why, cap);
    }
    tally_text(&ty, why, cap, o);
    return best == n ? -1 : t[best].index;
}
