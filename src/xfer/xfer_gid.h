/*
 * xfer_gid.h - RoCE GID selection rules, pure so they can be tested on
 * recorded GID tables (no device needed).
 *
 * Rules, in order (FAILURE-MODES.md "RDMA"):
 *  1. An override index is used if it names a non-zero GID in the table
 *     (any type: the operator knows best); otherwise it is an error.
 *  2. InfiniBand link layer: the lowest non-zero GID (normally index 0).
 *  3. Ethernet (RoCE): only RoCEv2 GIDs attached to a netdev are
 *     candidates (RoCEv1 is not routable; a GID without a netdev is stale);
 *     zero GIDs are skipped.
 *  4. Among candidates: IPv4-mapped routable (::ffff:a.b.c.d, not
 *     169.254/16) first, then global IPv6, then link-local (fe80::/10)
 *     last; ties go to the lowest index.
 */
#ifndef KVC_XFER_GID_H
#define KVC_XFER_GID_H

#include <stddef.h>
#include <stdint.h>

enum { KVT_GID_IB = 0, KVT_GID_ROCE_V1 = 1, KVT_GID_ROCE_V2 = 2 };

typedef struct kvt_gid_entry {
    int index;
    uint8_t raw[16];
    int type;        /* KVT_GID_* */
    char netdev[32]; /* "" when not attached to a netdev */
} kvt_gid_entry;

/* Choose a GID index from t[0..n-1] for a port whose link layer is
 * InfiniBand (link_is_ib != 0) or Ethernet.  override >= 0 forces that
 * index.  Returns the index, or -1 with the reason in why; on success why
 * says what was chosen and why (for the log line). */
int kvt_gid_choose(const kvt_gid_entry *t, size_t n, int link_is_ib, int override, char *why,
                   size_t cap);

/* Text form of a GID (IPv6 notation) into out (>= 46 bytes). */
void kvt_gid_text(const uint8_t raw[16], char *out, size_t cap);

#endif
