/*
 * xfer_internal.h - what the transfer engine's files share: the engine,
 * its regions, peers, connections, rooms and the frames in flight.
 *
 * Ownership, in one place:
 *  - the engine owns peers (array), receiving peers (list), connections
 *    (table indexed by id), sender rooms (per peer) and receiver rooms (per
 *    receiving peer), and the event queue;
 *  - a kvt__wr (one frame to send) is owned by whichever of these holds it:
 *    a peer's backlog, a connection's send queue, the connection's send
 *    batch (the kernel is reading it), the connection's ack FIFO.  It is
 *    freed when none does (flags in_q/in_batch/in_fifo all clear);
 *  - a connection is freed only once no SQE of it is in flight (ops == 0):
 *    the kernel may still be reading our iovecs or writing into rbuf.
 */
#ifndef KVC_XFER_INTERNAL_H
#define KVC_XFER_INTERNAL_H

#include "uring_ud.h"
#include <jansson.h>
#include <liburing.h>
#include <netinet/in.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include "clock.h"
#include "hostport.h"
#include "kvcoord/kvcoord.h"
#include "kvcoord/transfer.h"
#include "xfer_frame.h"
#include "xfer_gid.h"
#include "xfer_verbs_rules.h"

/* Marks the engine's public functions (kvt_*): the only symbols
 * libkvcoord-transfer exports (the library is built with hidden visibility
 * and a version script). */
#define KVT_API __attribute__((visibility("default")))

/* Record the calling thread's error message (kvc_last_error()), return err. */
#define kvt__fail kvc_error_set

/* Refuse a NULL pointer argument of the calling public function (KVC_E_INVAL,
 * the message names the function and the argument). */
#define KVT_ARG(p)                                                                  \
    do {                                                                            \
        if (!(p))                                                                   \
            return kvt__fail(KVC_E_INVAL, "%s: argument %s is NULL", __func__, #p); \
    } while (0)

#define KVT_MAX_REGIONS 4096
#define KVT_MAX_PEERS 1024
/* Caps on what peers make here (secure by default): sending engines
 * connected at once, connections of one of them, rooms one of them has
 * open at once.  Past a cap the handshake, or the frame opening a room, is
 * refused (ERROR naming the cap, the connection closed). */
#define KVT_MAX_RPEERS 1024
#define KVT_RPEER_CONNS_MAX 64
#define KVT_RPEER_ROOMS_MAX 16384
#define KVT_BATCH_WRS 64 /* frames per sendmsg */
/* iovecs of one sendmsg batch: a header and a payload per frame, plus the
 * entries of one READ answer (its data is sent from the registered
 * regions, one iovec per entry). */
#define KVT_IOV_MAX (2 * KVT_BATCH_WRS + KVT_READ_ENTS_MAX + 2)
/* A READ request asks for at most this many bytes (and at most
 * window_bytes); a server refuses (closes) a connection with more than
 * KVT_READ_OUT_MAX bytes of answers queued and not yet sent. */
#define KVT_READ_REQ_MAX (16u << 20)
#define KVT_READ_OUT_MAX (256u << 20)
#define KVT_RBUF (256u << 10)      /* staging buffer for received bytes */
#define KVT_DIRECT_MIN (32u << 10) /* payload left >= this: recv straight into place */
#define KVT_RX_LOWAT (256u << 10)  /* SO_RCVLOWAT while a large payload is received (kvt__rx_arm) */
#define KVT_SOCK_RCVBUF (2 << 20)  /* SO_RCVBUF of accepted connections (kernel doubles it) */
#define KVT_TICK_MS 50             /* deadline timer granularity */
/* kvt_engine_create: a bind refused with EADDRINUSE is retried every
 * KVT_BIND_RETRY_STEP_MS for up to KVT_BIND_RETRY_MS (a killed
 * predecessor's io_uring releases its listening socket shortly after the
 * process is gone). */
#define KVT_BIND_RETRY_MS 3000
#define KVT_BIND_RETRY_STEP_MS 20
/* The receiver acknowledges applied writes (one cumulative ACK) when its
 * input goes idle (the recv's CQE lacks IORING_CQE_F_SOCK_NONEMPTY), or
 * once this many writes / bytes are unacknowledged, or before a NACK or a
 * DONE_ACK.  Far below the sender's window (window_bytes, >= slice_bytes):
 * the sender never stalls on a held-back ACK. */
#define KVT_ACK_WRITES 64
#define KVT_ACK_BYTES (4u << 20)

/* io_uring user_data: operation in the top byte, connection id below.
 * Encoded and decoded only here. */
enum kvt__op {
    KVT_OP_ACCEPT = 1,
    KVT_OP_CONNECT,
    KVT_OP_SEND,
    KVT_OP_RECV,
    KVT_OP_CANCEL,
    KVT_OP_SPLICE, /* a spliced payload waits: POLLOUT on the socket, or a NOP
                      carrying a splice(2) error (xfer_tcp.c) */
    KVT_OP_TIMER,
    KVT_OP_VERBS_CQ,   /* POLL_ADD on the completion channel's fd */
    KVT_OP_VERBS_ASYNC /* POLL_ADD on the device context's async event fd */
};
/* The packing kvcoordd uses too (uring_ud.h): op in bits 56-63, id below. */
#define KVT_UD(op, id) kvc__ud_pack((unsigned)(op), (uint32_t)(id), 0)
#define KVT_UD_OP(ud) ((int)kvc__ud_op(ud))
#define KVT_UD_ID(ud) kvc__ud_id(ud)

typedef struct kvt__region {
    uint64_t addr, len;
    uint32_t rkey;
    uint32_t busy; /* receives into it in progress */
    void *mr;      /* struct ibv_mr * (verbs) */
} kvt__region;

typedef struct kvt__rregion { /* a peer's region, from its descriptor */
    uint64_t addr, len;
    uint32_t rkey;
} kvt__rregion;

struct kvt__sroom;

/* One run of a read request, local side. */
typedef struct kvt__rent {
    uint64_t laddr, raddr, len;
} kvt__rent;

/* Scattered landing: a byte stream spread over runs, each an entry whose
 * u64 address is at offset 0 and u64 length at len_off, stride bytes
 * apart (a WRITEV's kvt__read_ent table on the server, a READ request's
 * kvt__rent runs on the client).  One position (entry *ent, offset *off)
 * is carried between recvs.  The one loop both landings use. */
typedef struct kvt__scatter {
    const uint8_t *ents;
    size_t stride, len_off;
    uint32_t n;
} kvt__scatter;

static inline uint64_t kvt__scatter_u64(const kvt__scatter *s, uint32_t i, size_t at)
{
    uint64_t v;
    memcpy(&v, s->ents + (size_t)i * s->stride + at, sizeof v);
    return v;
}

/* n bytes arrived at the position: advance it, copying them from src to
 * their places when src is not NULL (they were staged in rbuf). */
static inline void kvt__scatter_step(const kvt__scatter *s, uint32_t *ent, uint64_t *off,
                                     const uint8_t *src, size_t n)
{
    while (n) {
        uint64_t len = kvt__scatter_u64(s, *ent, s->len_off);
        uint64_t k = len - *off;
        if (k > n)
            k = n;
        if (src) {
            memcpy((uint8_t *)(uintptr_t)(kvt__scatter_u64(s, *ent, 0) + *off), src, (size_t)k);
            src += k;
        }
        *off += k;
        n -= (size_t)k;
        if (*off == len) {
            (*ent)++;
            *off = 0;
        }
    }
}

/* The places still to fill from the position, as up to cap iovecs in
 * iov, and msg pointing at them (for one recvmsg); returns their bytes. */
static inline size_t kvt__scatter_iov(const kvt__scatter *s, uint32_t ent, uint64_t off,
                                      struct iovec *iov, size_t cap, struct msghdr *msg)
{
    size_t k = 0, bytes = 0;
    for (uint32_t i = ent; i < s->n && k < cap; i++) {
        uint64_t skip = i == ent ? off : 0;
        iov[k].iov_base = (void *)(uintptr_t)(kvt__scatter_u64(s, i, 0) + skip);
        iov[k].iov_len = (size_t)(kvt__scatter_u64(s, i, s->len_off) - skip);
        bytes += iov[k++].iov_len;
    }
    memset(msg, 0, sizeof *msg);
    msg->msg_iov = iov;
    msg->msg_iovlen = k;
    return bytes;
}

typedef struct kvt__wr {
    struct kvt__wr *next;    /* backlog / send queue / ack FIFO link */
    struct kvt__sroom *room; /* NULL for a control frame or a READ answer */
    /* A READ request (client): its runs (ent, nent) and the bytes they
     * ask for (rbytes, > 0 only for a READ request); it holds a busy count
     * on each run's local region until freed, and waits in the
     * connection's read FIFO (in_fifo) for its READ_DATA. */
    kvt__rent *ent;
    uint32_t nent;
    uint64_t rbytes;
    /* A READ answer (server): the data as iovecs into registered regions
     * (busy counts held until freed); plen is their total. */
    struct iovec *siov;
    uint32_t nsiov;
    uint64_t dlen;  /* bytes in siov (a READ answer's or a WRITEV's data) */
    uint32_t vleft; /* verbs: RDMA READs of the request not yet completed */
    uint8_t hdr[KVT_HDR_LEN];
    const void *payload;
    uint32_t plen;
    uint64_t seq;
    /* A data write's CMA_WRITE table (KVT_CMA_ENT_LEN bytes per run, in
     * owned), sent instead of its data on a same-host connection
     * (kvt__cma_frame); ncma 0: none. */
    const uint8_t *cma;
    uint32_t ncma;
    uint8_t chdr[KVT_HDR_LEN]; /* the header of its CMA frame (hdr stays the
                                  socket's, for a fallback) */
    uint8_t in_q, in_batch, in_fifo, acked;
    _Alignas(16) uint8_t owned[]; /* control payload copy (payload points here),
                                     a READ request's runs, a READ answer's iovecs */
} kvt__wr;

/* A room being sent to one peer. */
typedef struct kvt__sroom {
    struct kvt__sroom *next;
    struct kvt_peer *peer;
    uint64_t room;
    uint64_t writes, bytes; /* posted */
    uint64_t acked_writes, acked_bytes;
    uint32_t pending;   /* data wrs not yet acked or dropped */
    uint32_t in_kernel; /* data wrs in a send batch (pages in use) */
    bool closed;        /* last batch submitted */
    bool done_sent, failed, finished;
    bool read;        /* a reader room (kvt_submit_read): its "writes" are READ
                    requests, acked_* what arrived in place */
    bool noroom;      /* KVT_SUBMIT_NOROOM: nothing recorded in the segment */
    kvt__wc_tally wc; /* verbs: the room's work completions */
    int32_t code;
    char reason[KVC_REASON_MAX + 1];
} kvt__sroom;

typedef struct kvt__conn kvt__conn;

struct kvt_peer {
    char sid[KVC_SESSION_ID_MAX + 1];
    uint64_t generation;
    struct sockaddr_storage sa;
    socklen_t salen;
    kvt__rregion *regions;
    size_t nregions;
    kvt__conn **conns;          /* conns_per_peer slots, NULL when none */
    uint32_t rr;                /* round-robin cursor */
    kvt__wr *bl_head, *bl_tail; /* data wrs waiting for a connection */
    kvt__sroom *rooms;
    uint64_t unhealthy_until_ns; /* 0: healthy */
    int32_t last_code;
    char last_error[KVC_REASON_MAX + 1];
    uint64_t bytes_sent;
    uint64_t next_seq;
    bool verbs;           /* both engines run verbs: data by RDMA WRITE,
                                      connection slot 0 is the control channel */
    bool cma_logged;      /* the same-host copy's refusal was logged */
    struct kvt__vqp *vqp; /* its RC QP (NULL until set up, and after a failure) */
};

/* A room being received from one peer. */
typedef struct kvt__rroom {
    struct kvt__rroom *next;
    uint64_t room;
    uint64_t writes, bytes;
} kvt__rroom;

/* A sending engine, as seen by this (receiving) engine: one per (session
 * id, generation) with a connection up.  Freed when its last connection
 * closes (its open rooms fail); a handshake with a new generation of the
 * same session id (the sender restarted) supersedes it: its rooms fail and
 * its connections are closed (xfer_rx.c, rpeer_get). */
typedef struct kvt__rpeer {
    struct kvt__rpeer *next;
    char sid[KVC_SESSION_ID_MAX + 1];
    uint64_t generation;
    uint32_t conns;  /* connections not closing */
    uint32_t nrooms; /* of rooms */
    bool cma_logged; /* a same-host copy from it fell back (logged) */
    kvt__rroom *rooms;
    struct kvt__vqp *vqp; /* verbs: the QP its RDMA WRITEs arrive on */
} kvt__rpeer;

/* Rooms a receiving engine expects several senders for. */
typedef struct kvt__expect {
    struct kvt__expect *next;
    uint64_t room;
    uint32_t senders, done;
    uint64_t bytes;
} kvt__expect;

enum kvt__cstate { CS_CONNECTING, CS_HELLO, CS_UP, CS_CLOSING };
/* A connection's same-host copy: off, being negotiated (client: CMA_HELLO
 * sent; CMA_CHECK sent; server: waiting for CMA_CHECK), on. */
enum { KVT_CMA_OFF, KVT_CMA_HELLO, KVT_CMA_CHECK, KVT_CMA_ON, KVT_CMA_FELL };
/* KVT_CMA_FELL: the copy was on, then failed on this connection for a
 * reason of the host's (xfer_cma.h, kvt__cma_falls_back): its data goes
 * through the socket from then on. */
enum kvt__rstate { RS_HDR, RS_CTL, RS_PAYLOAD, RS_SKIP, RS_RDATA, RS_WDATA };
#define KVT_RIOV KVT_READ_ENTS_MAX /* iovecs of one recvmsg of READ data */

struct kvt__conn {
    uint32_t id;
    int fd;
    bool client;
    enum kvt__cstate state;
    int ops; /* SQEs in flight */
    bool recving, close_after_send, want_close;
    struct kvt_peer *peer; /* client side */
    kvt__rpeer *rpeer;     /* server side, after HELLO */
    uint64_t started_ns, progress_ns;
    /* send side */
    kvt__wr *q_head, *q_tail;
    kvt__wr *f_head, *f_tail;   /* data wrs sent or being sent, awaiting ACK */
    kvt__wr *rf_head, *rf_tail; /* READ requests sent or being sent, awaiting data */
    uint64_t read_out;          /* server: READ answer bytes queued, not yet sent */
    uint64_t unacked_bytes;
    uint32_t done_waits; /* DONE frames awaiting DONE_ACK */
    bool sending;
    kvt__wr *batch[KVT_BATCH_WRS];
    int nbatch;
    struct iovec iov[KVT_IOV_MAX];
    int niov, iov_at;
    struct msghdr msg;
    /* Large payloads by vmsplice + splice (xfer_tcp.c, "sending large
     * payloads"): iov[i] with iov_splice[i] set goes through the pipe. */
    uint8_t iov_splice[KVT_IOV_MAX];
    int pipe_r, pipe_w; /* the connection's pipe, -1: none (yet, or closed) */
    bool pipe_failed;   /* none to be had: sendmsg only on this connection */
    bool spliced;       /* the socket may hold references to source pages */
    int splice_err;     /* errno of a failed splice(2), reported by its NOP's CQE */
    uint32_t pipe_cap;  /* the pipe's size, bytes */
    uint32_t pipe_fill; /* bytes in the pipe, not yet spliced to the socket */
    /* receive side */
    uint8_t *rbuf;
    size_t rpos, rlen;
    enum kvt__rstate rstate;
    kvt__frame cur;
    uint8_t *dst;  /* payload destination (RS_PAYLOAD) */
    uint64_t left; /* payload bytes still to come */
    kvt__region *dreg;
    bool direct;                   /* current recv goes straight to dst */
    bool big;                      /* last WRITE was large: recv headers alone */
    int lowat;                     /* SO_RCVLOWAT set on the socket; 0: the default (1) */
    int inq_seen;                  /* bytes queued on the socket at the last deadline look */
    bool qp_wait;                  /* verbs: QP_INFO sent, the answer is due */
    uint64_t ack_seq, ack_count;   /* writes applied, not yet acknowledged */
    uint64_t ack_bytes;            /* their payload bytes */
    char ctl[KVT_CMA_CTL_MAX + 1]; /* control payload being assembled, NUL-terminated */
    /* client: READ_DATA being received (RS_RDATA) into the runs of rd,
     * at run rd_ent, offset rd_off; left is the bytes still to come */
    kvt__wr *rd;
    uint32_t rd_ent;
    uint64_t rd_off;
    struct kvt__sroom *rd_room; /* room of a recv in flight into its memory
                                  (holds in_kernel and pending) */
    struct iovec riov[KVT_RIOV];
    struct msghdr rmsg;
    /* server: the runs of the WRITEV being received (RS_WDATA), at run
     * rd_ent, offset rd_off; each holds a busy count on its region */
    kvt__read_ent wv[KVT_READ_ENTS_MAX];
    uint32_t wv_n;
    uint32_t ctl_len;
    /* The same-host copy (xfer_cma.c): negotiation state, the peer's
     * verified pid (and a pidfd on it, -1: none), our slot the peer reads
     * (it must hold the nonce it chose), the nonce we chose, the peer's
     * slot address.  Server: reads granted (CMA_READ_GO sent), their runs
     * pinned until CMA_READ_END, oldest first. */
    uint8_t cma;     /* KVT_CMA_* */
    int32_t cma_err; /* KVT_CMA_FELL: the errno of the failed copy */
    bool cma_offer;  /* server: both HELLOs carried KVT_HELLO_F_CMA */
    uint32_t cma_pid;
    uint64_t cma_start; /* server: the start time the client claimed */
    int cma_pidfd;
    uint8_t cma_slot[16], cma_nonce[16];
    uint64_t cma_peer_slot;
    kvt__wr *pin_head, *pin_tail;
    struct sockaddr_storage sa;
    socklen_t salen;
};

/* The engine's RDMA device (xfer_verbs.c opens it; xfer_verbs_qp.c runs
 * the data path on it). */
typedef struct kvt__vqp kvt__vqp;
struct kvt__verbs {
    struct ibv_context *ctx;
    struct ibv_pd *pd;
    struct ibv_comp_channel *chan;
    struct ibv_cq *cq;
    int port;
    int gid_index;
    union ibv_gid gid;
    uint16_t lid;
    bool is_roce;
    enum ibv_mtu active_mtu;
    int max_qp_init_rd_atom, max_qp_rd_atom; /* ibv_query_device: READ depths */
    char dev[64];
    bool cq_armed, async_armed; /* POLL_ADD in flight */
    bool dead;                  /* device-fatal event seen */
    char dead_why[KVC_REASON_MAX + 1];
    struct kvt__vqp *qps; /* every QP, live or draining */
    uint32_t nqps;
};

/* The backends, behind two tables: the shared code (xfer_engine.c,
 * xfer_submit.c, xfer_desc.c, and the connection layer xfer_conn.c,
 * xfer_rx.c) calls them through e->net and e->rdma only, never by name;
 * xfer_backends.c, the one file that names them, binds both at
 * kvt_engine_create.  The backends call the connection layer
 * (xfer_conn.h) and report to the engine through its functions below.
 *
 * net: the sockets under the connections every engine has (TCP on
 * io_uring, xfer_tcp.c): they carry the control frames always, and the
 * data of the tcp backend. */
struct kvt__net_ops {
    kvc_err (*listen)(kvt_engine *e);  /* bind, listen, set e->sid */
    void (*arm_accept)(kvt_engine *e); /* (re)arm the accept */
    kvc_err (*connect)(kvt_engine *e, struct kvt_peer *p, uint32_t slot);
    void (*cqe)(kvt_engine *e, struct io_uring_cqe *cqe); /* its completions (no recv) */
    void (*kick)(kvt_engine *e, kvt__conn *c);            /* send what is queued */
    /* The socket's part of kvt__conn_close: c is CS_CLOSING, its queues not
     * yet released. */
    void (*close)(kvt_engine *e, kvt__conn *c);
    void (*forget)(kvt_engine *e, kvt__conn *c); /* c is being freed: its resources */
};

/* rdma: the RDMA WRITE data path (verbs/).  Bound on every engine; each
 * operation does nothing (or answers "not verbs") on an engine that runs
 * without a device (e->verbs NULL), so the shared code never asks. */
struct kvt__rdma_ops {
    int (*open)(kvt_engine *e, char *why, size_t cap); /* device probe; why on failure */
    void (*close)(kvt_engine *e);
    json_t *(*desc)(kvt_engine *e); /* the descriptor's "verbs" member, NULL without */
    kvc_err (*reg)(kvt_engine *e, kvt__region *r);
    void (*dereg)(kvt_engine *e, kvt__region *r);
    void (*hello_ok)(kvt_engine *e, kvt__conn *c); /* client: create the QP, send QP_INFO */
    int (*qp_info)(kvt_engine *e, kvt__conn *c, const kvt__qp_rec *r, char *err, size_t cap);
    void (*pump)(kvt_engine *e, struct kvt_peer *p);      /* post RDMA WRITEs */
    void (*notify)(kvt_engine *e, kvt__sroom *r);         /* end of room: SEND */
    void (*peer_down)(kvt_engine *e, struct kvt_peer *p); /* QP to ERR: flush */
    void (*conn_closed)(kvt_engine *e, kvt__conn *c);
    void (*arm)(kvt_engine *e); /* POLL_ADD on CQ and async fds */
    void (*cqe)(kvt_engine *e, struct io_uring_cqe *cqe);
    bool (*busy)(kvt_engine *e); /* work requests outstanding */
};

/* xfer_backends.c: bind e->net and e->rdma. */
void kvt__backends_bind(kvt_engine *e);

struct kvt_engine {
    kvt_options o;
    char *token;                           /* NULL: none */
    char token_pad[KVT_HELLO_STR_MAX + 1]; /* token zero-padded (kvt__token_equal) */
    kvt_backend backend;
    char sid[KVC_SESSION_ID_MAX + 1];
    uint64_t generation;
    struct io_uring ring;
    bool ring_ok;
    int ring_err; /* 0, or why no SQE could be had: the
                                               engine is unusable (kvt_progress
                                               and kvt_submit report it) */
    char ring_why[KVC_REASON_MAX + 1];
    int lfd;
    bool accept_armed, timer_armed;
    struct __kernel_timespec timer_ts;
    kvt__region regions[KVT_MAX_REGIONS];
    size_t nregions;
    uint32_t next_rkey;
    struct kvt_peer *peers[KVT_MAX_PEERS];
    size_t npeers;
    kvt__rpeer *rpeers;
    uint32_t nrpeers;
    bool destroying; /* kvt_engine_destroy: rpeers are freed at its end */
    kvt__expect *expects;
    kvt__conn **conns;
    uint32_t nconns_cap;
    kvt_event *evq;
    size_t nev, evcap;
    kvt_stats st;
    struct kvt__verbs *verbs;
    const struct kvt__net_ops *net;   /* kvt__backends_bind */
    const struct kvt__rdma_ops *rdma; /* kvt__backends_bind */
    int pending_sqes;
    /* The same-host copy (xfer_cma.c): on unless forced off or this
     * process's identity is unknown; the identity peers compare. */
    bool cma_on;
    struct kvt__cma_worker *cmaw; /* the copy helper thread, NULL until used */
    bool cmaw_failed;             /* it could not be started: one thread copies */
    char boot_id[40];
    uint64_t pidns_dev, pidns_ino, start_ticks;
    uint32_t pid;
};

/* xfer_net.c: split "host:port" by the project's one rule
 * (src/common/hostport.h; flags KVC_HOSTPORT_LISTEN for a listen address,
 * 0 for a peer), and resolve it.  KVC_E_INVAL with the reason. */
kvc_err kvt__split_hostport(const char *s, unsigned flags, char *host, size_t hcap, uint16_t *port);
kvc_err kvt__resolve(const char *hostport, unsigned flags, struct sockaddr_storage *sa,
                     socklen_t *len);
void kvt__format_session(const struct sockaddr_storage *sa, const char *host, char *out,
                         size_t cap);
int kvt__first_address(int family, char *out, size_t cap);

/* xfer_engine.c */
/* snprintf that truncates silently (messages are cut at their buffer's
 * size on purpose; gcc's -Wformat-truncation cannot see through it). */
void kvt__str(char *dst, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
void kvt__log(kvt_engine *e, int level, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* An SQE, submitting what is queued when the SQ is full.  NULL when the SQ
 * stays full even then (io_uring refuses the submit, e.g. -EBUSY while the
 * CQ overflows): e->ring_err and e->ring_why are set, the caller leaves its
 * state as it was, and the next kvt_progress()/kvt_submit() returns
 * KVC_E_SYS with that message.  Never aborts. */
struct io_uring_sqe *kvt__sqe(kvt_engine *e);
/* KVC_E_SYS with e->ring_why once kvt__sqe() failed, else KVC_OK. */
kvc_err kvt__ring_check(kvt_engine *e);
kvt__region *kvt__region_find(kvt_engine *e, uint64_t addr, uint64_t len);
void kvt__push_event(kvt_engine *e, const kvt_event *ev);
void kvt__peer_fail(kvt_engine *e, struct kvt_peer *p, int32_t code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
void kvt__sroom_fail(kvt_engine *e, kvt__sroom *r, int32_t code, const char *reason);
void kvt__sroom_check(kvt_engine *e, kvt__sroom *r);
void kvt__peer_pump(kvt_engine *e, struct kvt_peer *p);
void kvt__wr_release(kvt_engine *e, kvt__wr *w);
/* The window bytes w takes on a connection: a READ request's answer, a
 * write's payload. */
static inline uint64_t kvt__wr_cost(const kvt__wr *w)
{
    return w->rbytes ? w->rbytes : w->dlen ? w->dlen : w->plen;
}
void kvt__seg_open(kvt_engine *e, uint64_t room, kvc_room_role role);
void kvt__seg_success(kvt_engine *e, uint64_t room);
void kvt__seg_fail(kvt_engine *e, uint64_t room, int32_t code, const char *reason);

/* xfer_submit.c: peers by session_id (find: NULL if unknown; get: create
 * on first use), their renewal on re-registration, the engine's teardown
 * of all peers, and a receiver's DONE_ACK for a sender room. */
kvt_peer *kvt__peer_find(kvt_engine *e, const char *sid);
kvc_err kvt__peer_get(kvt_engine *e, const char *sid, kvt_peer **out);
void kvt__peer_renew(kvt_engine *e, kvt_peer *p, uint64_t generation);
void kvt__peers_free(kvt_engine *e);
void kvt__sroom_done_ack(kvt_engine *e, kvt__conn *c, uint64_t room, int32_t status,
                         const char *msg);

/* xfer_read.c: reads.  Client: queue a room's runs as READ requests on
 * the peer's backlog; READ_DATA's header (the data follows, RS_RDATA),
 * its bytes from rbuf (n at p) or by a recvmsg straight into place (arm:
 * fills c->rmsg, returns the bytes asked for; advance: res arrived), its
 * end; READ_NACK; a closing connection's requests.  Server: a READ
 * request (answered or refused); a DESC_REQ (the descriptor, then close). */
kvc_err kvt__read_queue(kvt_engine *e, struct kvt_peer *p, kvt__sroom *r, const kvt_run *v,
                        size_t n);
void kvt__read_data_header(kvt_engine *e, kvt__conn *c);
void kvt__read_copy(kvt_engine *e, kvt__conn *c, const uint8_t *p, size_t n);
size_t kvt__read_arm(kvt__conn *c);
void kvt__read_advance(kvt_engine *e, kvt__conn *c, size_t n);
void kvt__read_nack(kvt_engine *e, kvt__conn *c);
void kvt__read_conn_closed(kvt_engine *e, kvt__conn *c);
void kvt__read_serve(kvt_engine *e, kvt__conn *c);
void kvt__desc_serve(kvt_engine *e, kvt__conn *c);
/* Free w and drop the busy counts its runs or answer hold on regions. */
void kvt__wr_free(kvt_engine *e, kvt__wr *w);
/* xfer_rx.c: drop the busy counts of the WRITEV being received on c. */
void kvt__rx_wv_release(kvt_engine *e, kvt__conn *c);
/* xfer_rx.c: a protocol error on input (ERROR frame to the peer, close). */
void kvt__rx_proto_error(kvt_engine *e, kvt__conn *c, int32_t code, const char *msg);
/* xfer_rx.c: c's control bytes (a HELLO, HELLO_OK or DESC_REQ) decoded
 * into *h.  0; or EPROTONOSUPPORT (another protocol version) or EPROTO
 * (malformed), the reason in msg (cap bytes), for the caller to fail c. */
int32_t kvt__rx_hello(const kvt__conn *c, kvt__hello *h, char *msg, size_t cap);

/* xfer_rx.c: a client connection's handshake is over: it is up, data may
 * flow (the peer's backlog is pumped). */
void kvt__rx_up(kvt_engine *e, kvt__conn *c);
/* xfer_read.c: the same-host read's frames: server, CMA_READ_END (unpin
 * the oldest grant); client, CMA_READ_GO (copy, then CMA_READ_END). */
void kvt__read_cma_end(kvt_engine *e, kvt__conn *c);
void kvt__read_cma_go(kvt_engine *e, kvt__conn *c);

/* xfer_rx.c: the receiving side of a connection: (re)arm its recv, handle
 * its completions. */
void kvt__rx_arm(kvt_engine *e, kvt__conn *c);
void kvt__rx_cqe(kvt_engine *e, kvt__conn *c, int res, unsigned cflags);

/* xfer_rx.c: a connection of rp closed (rp->conns already counts it
 * out): once none is left, its open rooms fail and it is freed. */
void kvt__rx_rpeer_closed(kvt_engine *e, kvt__rpeer *rp);

/* xfer_rx.c: fail every receiver room of rp (a connection or QP of it
 * failed). */
void kvt__rx_fail_rpeer_rooms(kvt_engine *e, kvt__rpeer *rp, int32_t code, const char *why);

/* Message for a failed registration, naming RLIMIT_MEMLOCK when relevant. */
kvc_err kvt__reg_error(int err, uint64_t addr, uint64_t len, const char *what);
/* xfer_rx.c: the end-of-room note of an RDMA sender arrived. */
void kvt__rx_room_notified(kvt_engine *e, kvt__rpeer *rp, uint64_t room, uint64_t writes,
                           uint64_t bytes);

#endif
