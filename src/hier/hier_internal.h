/*
 * hier_internal.h - what the files of src/hier/ share: the handle, the
 * failure record (carried between nodes and spread through a segment),
 * the wire messages.  Private to src/hier/.
 *
 * Files: hier.c (open/close, a step: the segment rounds and the spread),
 * hier_net.c (the leaders' exchange over TCP), hier_fail.c (failure
 * records and their texts).
 */
#ifndef KVC_HIER_INTERNAL_H
#define KVC_HIER_INTERNAL_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include <kvcoord/hier.h>

/* The public functions (the unit is a static library; visible for a
 * shared object that links it). */
#define KVC_API __attribute__((visibility("default")))

#define HIER_MAX_RANKS KVC_COLL_MAX_SIZE
#define SIG_BYTES 8u /* a rank's call signature: tag, len (little-endian u32 each) */

/* A step's failure, as carried between nodes (FAIL/ABORT) and through a
 * segment (the spread round's header): REC_BYTES, little-endian. */
typedef struct hier_rec {
    uint8_t failed; /* 0: the step completed */
    uint8_t code;   /* kvc_err */
    uint8_t dead, mismatch;
    int32_t node, pid;
    uint32_t timeout_ms;
    uint64_t ranks, step;
    char text[KVC_HIER_TEXT];
} hier_rec;
#define REC_BYTES (32u + KVC_HIER_TEXT)

void hier__rec_put(const hier_rec *r, uint8_t *out);
void hier__rec_get(hier_rec *r, const uint8_t *in);

/* A connection to another node's leader. */
typedef struct hier_peer {
    int fd;      /* -1: none (this node) or closed */
    uint8_t *rx; /* bytes received, not yet parsed */
    size_t have, cap;
    bool got; /* its message for the current step came */
} hier_peer;

struct kvc_hier {
    kvc_segment *seg;
    uint64_t group, lgid; /* lgid: the node's segment group */
    uint32_t size, rank, nodes, node, lidx, lsize;
    int32_t pid;
    bool leader;
    uint32_t node_of[HIER_MAX_RANKS];
    uint32_t local[HIER_MAX_RANKS];         /* global rank of each local index */
    uint32_t leader_of[KVC_HIER_MAX_NODES]; /* each node's leader (global rank) */
    uint64_t ranks_of[KVC_HIER_MAX_NODES];  /* each node's ranks (mask) */
    char names[KVC_HIER_MAX_NODES][KVC_HIER_NAME];
    hier_peer peer[KVC_HIER_MAX_NODES];
    uint64_t step;
    _Atomic int busy;
    bool broken;
    hier_rec why_broken;
    uint8_t *buf; /* scratch: a round's vector, the message sent */
    size_t cap;
    uint8_t *acc;                            /* the leader's MIN of the nodes' data */
    uint8_t gsig[HIER_MAX_RANKS][SIG_BYTES]; /* every rank's signature, this step */
    size_t acc_cap;
};

/* ---- hier_fail.c ---- */

/* A failure rec of step from the node's segment round that failed with e
 * (kvc_allreduce_min_ex's why: local ranks), its message in msg. */
void hier__rec_local(const kvc_hier *h, hier_rec *r, kvc_err e, const kvc_coll_failure *cw,
                     const char *msg);
/* The first difference between the signatures of the step (gsig), or 0. */
bool hier__rec_mismatch(const kvc_hier *h, hier_rec *r);
/* Node j's connection closed (dead) or sent nothing in time. */
void hier__rec_node(const kvc_hier *h, hier_rec *r, uint32_t j, bool closed, uint32_t timeout_ms,
                    const char *detail);
/* Return r's error (kvc_error_set) and fill why. */
kvc_err hier__fail(const kvc_hier *h, const hier_rec *r, kvc_hier_failure *why);
/* "4-7" or "1, 5" for a mask. */
void hier__rank_list(uint64_t ranks, char *buf, size_t cap);

/* ---- hier_net.c ---- */

/* The leader's exchange of step h->step: send this node's contribution
 * (mine: NULL for DATA with sigs/data, else a FAIL record), then (DATA only)
 * wait for every other node's until deadline (CLOCK_MONOTONIC ns); the MIN
 * of their data into h->acc (len bytes, holding this node's partial on
 * entry).  Returns false with *r filled when the step failed. */
bool hier__exchange(kvc_hier *h, const hier_rec *mine, const uint8_t *sigs, bool has_data,
                    size_t len, uint64_t deadline, hier_rec *r);

/* Send every other leader FAIL r as this node's message for step (a step
 * after the current one: the group broke after this node's message for the
 * current step went out), without waiting; then read what they sent. */
void hier__tell(kvc_hier *h, uint64_t step, const hier_rec *r);

/* Read whatever the other leaders sent (kept for its step): a process
 * leaving with unread bytes in a socket resets the connection. */
void hier__drain(kvc_hier *h);

uint64_t hier__mono_ns(void);

#endif
