/*
 * hier.h - the hierarchical MIN all-reduce: one group of ranks spread over
 * several nodes, each node with its own kvcoord segment.
 *
 * A step (one kvc_hier_allreduce_min call on every rank of the group):
 *  1. within each node, the segment's MIN (kvc_allreduce_min_ex) over the
 *     node's ranks, with every rank's call signature (tag and length);
 *  2. the node's leader - its lowest rank, fixed when the group is opened -
 *     sends the node's partial MIN to every other node's leader over one TCP
 *     connection per node pair (set up once by the caller, handed over as
 *     file descriptors) and takes the MIN of what they sent;
 *  3. the leader spreads the result (or the step's failure) through its
 *     node's segment: a second segment round, which every rank of the node
 *     waits in.
 * Steps are counted by every rank from 0 since kvc_hier_open, each call
 * counting whatever its outcome: the k-th call of every rank reduces
 * together or fails, on every node.
 *
 * Built on libkvcoord's public API (kvcoord.h); the unit is src/hier/
 * (static library kvcoord_hier).  The Python binding's kvcoord.HierGroup
 * wraps it and kvcoord._hier.handshake() makes the connections.
 */
#ifndef KVCOORD_HIER_H
#define KVCOORD_HIER_H

#include <stddef.h>
#include <stdint.h>

#include <kvcoord/kvcoord.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Most nodes a group may span. */
#define KVC_HIER_MAX_NODES 16

/* Longest vector of one call, bytes. */
#define KVC_HIER_MAX_LEN (1u << 20)

/* Longest failure text carried between nodes (with its NUL). */
#define KVC_HIER_TEXT 200

/* Longest node name (with its NUL); longer ones are cut. */
#define KVC_HIER_NAME 48

typedef struct kvc_hier kvc_hier;

/* What kvc_hier_open needs.  Every rank of the group passes the same group,
 * size, nodes, node_of and node_names; rank and fds are its own. */
typedef struct kvc_hier_options {
    kvc_segment *seg;              /* this node's segment, opened with a role other than
                                      KVC_ROLE_NONE by this process; must outlive the handle */
    uint64_t group;                /* the group id, the same on every rank of every node */
    uint32_t size;                 /* ranks in the group, 1..KVC_COLL_MAX_SIZE */
    uint32_t rank;                 /* this rank, 0..size-1 */
    uint32_t nodes;                /* nodes, 1..KVC_HIER_MAX_NODES; each has a rank */
    const uint32_t *node_of;       /* [size]: the node (0..nodes-1) of every rank */
    const char *const *node_names; /* [nodes] names for messages (e.g. the address), or
                                      NULL: "node 0", "node 1", ... */
    const int *fds;                /* [nodes], only on a node's leader (its lowest rank):
                                      fds[j] a connected stream socket to node j's leader
                                      for every j other than this node, -1 at its own
                                      index; NULL on other ranks.  Taken over on success
                                      (closed by kvc_hier_close), left to the caller on
                                      failure. */
} kvc_hier_options;

/* Why a step failed (kvc_hier_allreduce_min's *why). */
typedef struct kvc_hier_failure {
    uint64_t group;      /* the group id */
    uint64_t step;       /* the step (0 = the first call) that failed */
    uint64_t ranks;      /* bit r: global rank r died or left (dead), did not arrive or
                            answer in time (neither), or called differently (mismatch) */
    int32_t node;        /* the node of the lowest of ranks, -1 if unknown */
    int dead;            /* 1: those ranks died or left (or their node's connection
                            closed); the group is broken from then on */
    int mismatch;        /* 1: a rank called with another tag or length than rank 0 */
    int32_t pid;         /* pid of the lowest of ranks when known (same node), else 0 */
    uint32_t timeout_ms; /* the timeout that ran out (neither dead nor mismatch) */
} kvc_hier_failure;

/* Open this rank's end of hierarchical group o->group.  No I/O: the
 * segment group and the connections are first used by the first call.
 * Errors (*out untouched; nothing taken over): KVC_E_INVAL for a NULL o,
 * out, seg or node_of, size/rank/nodes out of range, a node without ranks,
 * a node index out of range, the handle without a process table entry or
 * inherited across fork(), a leader without a valid socket for every other
 * node (fds NULL, or an fd that is not a stream socket), fds given on a rank
 * that is not its node's leader; KVC_E_SYS when memory or fcntl fails.
 * Thread-safe. */
kvc_err kvc_hier_open(const kvc_hier_options *o, kvc_hier **out);

/* Element-wise MIN of vec[0..len) over every rank of the group (every node),
 * the same on every rank on KVC_OK.  tag: the caller's name for the kind of
 * call (e.g. which of several collectives it is); every rank of a step must
 * pass the same tag and len, else the step fails on every rank with
 * KVC_E_INVAL naming the lowest rank whose (tag, len) differs from rank 0's
 * ("rank 5 on node B called with tag 2 and 64 bytes, rank 0 on node A with
 * tag 1 and 64 bytes") - as soon as every rank arrived, never by timeout.
 * timeout_ms: how long to wait for the ranks of this node, and (plus a
 * quarter and 50 ms) a leader for the other nodes' leaders; a rank waiting
 * for its own node's leader waits up to the sum of both plus 100 ms.
 *
 * Failure (every rank of the step gets the same error and text, on every
 * node; *why, may be NULL, says which ranks):
 *  - KVC_E_PEER: a rank died or left its segment ("rank 5 on node B died or
 *    left (pid 1234; ...)"), or a node's leader connection closed ("node B's
 *    leader, rank 4, closed its connection: it died or left").  The group is
 *    broken: every later call fails at once with the same error, until a new
 *    group is opened by every rank (new processes, a new handshake).
 *  - KVC_E_TIMEDOUT: a rank of a node did not arrive within the timeout, or
 *    a node's leader sent nothing for the step in time ("node B (leader
 *    rank 4, ranks 4-7) sent nothing for step 17 within 1300 ms").  The next
 *    step works again once the late ranks come back (a late rank's own step
 *    fails with the reason).
 *  - KVC_E_INVAL: the mismatch above (the step counts; the next works);
 *    NULL h, vec NULL with len > 0, len > KVC_HIER_MAX_LEN, tag
 *    0xFFFFFFFF, the handle used across fork() or from two threads at once
 *    (these do not count as a step).
 *  - others from kvc_allreduce_min_ex joining the node's segment group
 *    (KVC_E_FULL, KVC_E_BUSY...), KVC_E_SYS for memory.
 * One exception to "the same on every rank": a step that completes on one
 * node can fail on another when a leader dies, or a timeout runs out, in
 * the instant between the leaders' exchange and the spread (no rank ever
 * gets a value other than the MIN of the same step).  On failure vec is
 * unchanged.  One thread at a time per handle. */
kvc_err kvc_hier_allreduce_min(kvc_hier *h, uint32_t tag, uint8_t *vec, size_t len,
                               uint32_t timeout_ms, kvc_hier_failure *why);

/* This rank's node (0..nodes-1).  Never fails; any thread. */
uint32_t kvc_hier_node(const kvc_hier *h);
/* 1 when this rank is its node's leader (the lowest rank of the node, the
 * one that exchanges the node's partial MIN with the other nodes), else 0.
 * Never fails; any thread. */
int kvc_hier_is_leader(const kvc_hier *h);

/* Close the handle and its sockets (the other nodes' leaders see the
 * connection close: their group is broken).  NULL is a no-op. */
void kvc_hier_close(kvc_hier *h);

#ifdef __cplusplus
}
#endif

#endif
