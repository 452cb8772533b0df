/*
 * xfer_verbs_rules.h - the verbs backend's pure logic, kept apart from the
 * device so it can be unit-tested on a host without one (like xfer_gid.h):
 *
 *  - the QP record two engines exchange over the TCP control channel
 *    (QPN, PSN, GID, LID, MTU, link layer), encoded and checked;
 *  - the attributes of the INIT, RTR and RTS transitions of an RC QP,
 *    built from this engine's port and the peer's record;
 *  - a room's work-completion bookkeeping: the first failed WC of a room is
 *    its failure (status text and number); WR_FLUSH_ERR completions, and
 *    every failure after the first, are noise;
 *  - the classification of asynchronous events (QP-fatal, device-fatal,
 *    informational);
 *  - the wr_id encoding of the engine's work requests.
 *
 * No function here calls into libibverbs beyond its header's enums and
 * string helpers (ibv_wc_status_str, ibv_event_type_str need no device).
 */
#ifndef KVC_XFER_VERBS_RULES_H
#define KVC_XFER_VERBS_RULES_H

#include <infiniband/verbs.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ---- the QP record (control frame KVT_F_QP_INFO's payload) ---------------- */

#define KVT_QPREC_LEN 32u
#define KVT_QPREC_VERSION 1u

typedef struct kvt__qp_rec {
    uint32_t qpn;       /* 24 bits, non-zero */
    uint32_t psn;       /* 24 bits: the sender's first packet sequence number */
    uint8_t gid[16];    /* the port's chosen GID (RoCE: must be non-zero) */
    uint16_t lid;       /* InfiniBand: must be non-zero */
    uint8_t mtu;        /* enum ibv_mtu of the port's active MTU, 1..5 */
    uint8_t is_roce;    /* link layer Ethernet (RoCE) rather than InfiniBand */
    uint16_t gid_index; /* the sender's own GID index (diagnostics only) */
    uint8_t rd_atom;    /* the sender's responder resources: RDMA READs it
                           serves at once on this QP (its max_dest_rd_atomic);
                           0 from an engine older than READ: taken as 1 */
} kvt__qp_rec;

/* Encode r into out (KVT_QPREC_LEN bytes, little-endian):
 *   off 0 u8 version (KVT_QPREC_VERSION), 1 u8 mtu, 2 u8 is_roce, 3 u8 rd_atom,
 *   4 u32 qpn, 8 u32 psn, 12 u16 lid, 14 u16 gid_index, 16 u8 gid[16]. */
void kvt__qp_rec_encode(const kvt__qp_rec *r, uint8_t out[KVT_QPREC_LEN]);

/* Decode and check a record of len bytes.  0, or -1 with the reason in
 * err: wrong length or version, QPN 0 or over 24 bits, PSN over 24 bits,
 * MTU out of 256..4096, a RoCE record with a zero GID, an InfiniBand
 * record with LID 0. */
int kvt__qp_rec_decode(const uint8_t *buf, size_t len, kvt__qp_rec *r, char *err, size_t cap);

/* ---- QP transitions --------------------------------------------------------- */

/* This engine's side of a QP. */
typedef struct kvt__qp_local {
    uint8_t port;
    int gid_index;
    bool is_roce;
    enum ibv_mtu active_mtu;
    uint32_t psn;
    /* RDMA READ depths (kvt__qp_rd_depths): initiator (max_rd_atomic, from
     * the device's max_qp_init_rd_atom), responder (max_dest_rd_atomic,
     * from max_qp_rd_atom, sent to the peer in the QP record), and the
     * peer's responder depth from its record (0: not known yet / old peer,
     * taken as 1). */
    uint8_t init_depth, resp_depth, peer_resp_depth;
} kvt__qp_local;

/* The READ depths of a QP from the device's attributes (ibv_query_device:
 * max_qp_init_rd_atom, max_qp_rd_atom), clamped to 0..255; a negative
 * attribute counts as 0. */
void kvt__qp_rd_depths(int max_qp_init_rd_atom, int max_qp_rd_atom, kvt__qp_local *l);

/* Whether RDMA READs may be posted on a QP of l: 0, or -1 with the reason
 * in err (the device cannot initiate RDMA READ: max_qp_init_rd_atom 0). */
int kvt__qp_read_ok(const kvt__qp_local *l, char *err, size_t cap);

/* Transport timeout 4.096 us << 14 (67 ms) per try, 7 tries: a dead peer
 * fails a room with "transport retry counter exceeded" within about half
 * a second.  Receiver not ready (no receive posted for an end-of-room
 * note): the responder asks for 491 ms (timer code 31), 6 tries, ~3 s --
 * finite, so a receiver that stopped driving its engine fails the room
 * rather than hanging it. */
#define KVT_QP_TIMEOUT 14
#define KVT_QP_RETRY 7
#define KVT_QP_RNR_RETRY 6
#define KVT_QP_MIN_RNR_TIMER 31

/* RESET -> INIT: port, pkey index 0, remote write and remote read allowed
 * (the peer writes into and reads from our registered regions; MRs grant
 * it per region). */
void kvt__qp_init_attr(const kvt__qp_local *l, struct ibv_qp_attr *a, int *mask);

/* INIT -> RTR toward the peer described by p: path MTU the smaller of
 * both, the peer's QPN and PSN, responder resources l->resp_depth (at
 * least 1), and an address handle -- RoCE: global
 * (GRH) with the peer's GID and our GID index, hop limit 64; InfiniBand:
 * the peer's LID.  Returns 0, or -1 with the reason in err (link layers
 * differ, or a record decode would have refused). */
int kvt__qp_rtr_attr(const kvt__qp_local *l, const kvt__qp_rec *p, struct ibv_qp_attr *a, int *mask,
                     char *err, size_t cap);

/* RTR -> RTS: our PSN, timeout, retry counts, and RDMA READs outstanding
 * at once: the smaller of our initiator depth and the peer's responder
 * depth (its record; 0 there counts as 1), at most 0 when our device
 * cannot initiate reads. */
void kvt__qp_rts_attr(const kvt__qp_local *l, struct ibv_qp_attr *a, int *mask);

/* ---- work completions of a room ---------------------------------------------- */

typedef struct kvt__wc_tally {
    uint64_t posted;    /* work requests posted for the room */
    uint64_t completed; /* completions seen, of any status */
    uint64_t ok_bytes;  /* bytes of successful completions */
    bool failed;        /* a first failure was recorded */
    int32_t status;     /* its enum ibv_wc_status */
} kvt__wc_tally;

enum {
    KVT_WC_OK = 0,     /* a success, counted */
    KVT_WC_FIRST_FAIL, /* the room's first failure: reason filled */
    KVT_WC_NOISE       /* a flush, or a failure after the first: ignored */
};

/* Account one WC of a room.  `what` names the operation ("RDMA WRITE",
 * "SEND (end of room)"), peer the peer's session_id.  On KVT_WC_FIRST_FAIL
 * reason receives e.g. "RDMA WRITE to peer 10.0.0.5:4000 failed: transport
 * retry counter exceeded (WC status 12, vendor error 0x81)".  The room
 * has every completion back when t->completed == t->posted. */
int kvt__wc_note(kvt__wc_tally *t, int status, uint32_t vendor_err, uint64_t bytes,
                 const char *what, const char *peer, char *reason, size_t cap);

/* ---- asynchronous events -------------------------------------------------------- */

enum {
    KVT_ASYNC_INFO = 0,    /* logged only (port active, path migrated, ...) */
    KVT_ASYNC_QP_FATAL,    /* that QP is in the error state: its peer's rooms fail */
    KVT_ASYNC_DEVICE_FATAL /* the device (or the CQ) is gone: every room fails */
};

/* What to do about an async event of this type. */
int kvt__async_classify(enum ibv_event_type t);

/* ---- wr_id ------------------------------------------------------------------------ */

/* A work request's wr_id: a pointer (malloc()ed, so 16-byte aligned)
 * tagged in its low bits with what it is.  Encoded and decoded only here. */
enum { KVT_WRID_DATA = 0, KVT_WRID_NOTIFY = 1, KVT_WRID_RECV = 2, KVT_WRID_READ = 3 };
static inline uint64_t kvt__wrid(const void *p, int tag)
{
    return (uint64_t)(uintptr_t)p | (uint64_t)tag;
}
static inline int kvt__wrid_tag(uint64_t id) { return (int)(id & 3u); }
static inline void *kvt__wrid_ptr(uint64_t id) { return (void *)(uintptr_t)(id & ~(uint64_t)3u); }

/* ---- the end-of-room notification (a SEND's 24-byte payload) ---------------------- */

#define KVT_NOTE_LEN 24u
void kvt__note_encode(uint64_t room, uint64_t writes, uint64_t bytes, uint8_t out[KVT_NOTE_LEN]);
int kvt__note_decode(const uint8_t *buf, size_t len, uint64_t *room, uint64_t *writes,
                     uint64_t *bytes);

#endif
