/*
 * xfer_gid.h - which GID of an RDMA port kvcoord uses: THE rule, one
 * source for the transfer engine (verbs/xfer_verbs.c) and for
 * `kvcoord-diag rdma` (tools/diag/diag_gid.c), which links this unit
 * (kvcoord_gid) rather than restating it.  kvt__gid_choose is pure, so the
 * rule is tested on recorded GID tables without a device
 * (tests/diag/test_gid.c feeds the same tables to both callers).
 *
 * Rules, in order (docs/transfer.md "RDMA"):
 *  1. An override index is used if it names a non-zero GID in the table
 *     (any type: the operator knows best); otherwise it is an error.
 *  2. InfiniBand link layer: the lowest-index non-zero GID (normally 0).
 *  3. Ethernet (RoCE): only RoCEv2 GIDs attached to a netdev are
 *     candidates (RoCEv1 is not routable; a GID without a netdev is stale);
 *     zero GIDs are skipped.
 *  4. Among candidates: IPv4-mapped routable (::ffff:a.b.c.d, not
 *     169.254/16) first, then global IPv6, then link-local (fe80::/10, or
 *     IPv4-mapped 169.254/16) last: a link-local GID is chosen when it is
 *     the only candidate.  Ties go to the lowest index.
 *
 * Not part of libkvcoord-transfer's exported API (hidden symbols).
 */
#ifndef KVC_XFER_GID_H
#define KVC_XFER_GID_H

#include <stddef.h>
#include <stdint.h>

enum { KVT_GID_IB = 0, KVT_GID_ROCE_V1 = 1, KVT_GID_ROCE_V2 = 2 };

typedef struct kvt__gid_entry {
    int index;
    uint8_t raw[16];
    int type;        /* KVT_GID_* */
    char netdev[32]; /* "" when not attached to a netdev */
} kvt__gid_entry;

/* Choose a GID index from t[0..n-1] (t may be NULL when n is 0) for a port
 * whose link layer is InfiniBand (link_is_ib != 0) or Ethernet.  override
 * >= 0 forces that index.  Returns the index, or -1; either way why (cap
 * bytes, truncated to fit) says what was chosen or why none was, and on
 * Ethernet how many candidates of each kind there were and what was
 * skipped ("; candidates: 1 IPv4-mapped routable, 1 link-local; skipped: 2
 * RoCEv1").  Pure: no I/O, thread-safe. */
int kvt__gid_choose(const kvt__gid_entry *t, size_t n, int link_is_ib, int override, char *why,
                    size_t cap);

/* Text form of a GID (IPv6 notation; IPv4-mapped as ::ffff:a.b.c.d) into
 * out (cap >= 46 bytes for every GID; "?" if it cannot be written). */
void kvt__gid_text(const uint8_t raw[16], char *out, size_t cap);

/* "IB", "RoCEv1", "RoCEv2" for a KVT_GID_* type ("unknown" otherwise). */
const char *kvt__gid_type_name(int type);

/* Read port's GID table from an open device (ibv_query_gid_table: valid
 * entries only, each with its type and netdev) into t (cap entries).
 * Returns the count; 0 when the table cannot be read (errno set by
 * libibverbs).  What the engine chooses from, and what diag shows. */
struct ibv_context;
size_t kvt__gid_read_table(struct ibv_context *ctx, int port, kvt__gid_entry *t, size_t cap);

#endif
