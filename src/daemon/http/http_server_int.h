/*
 * http_server_int.h - what http_server.c (the ring, the loop, the server's
 * own operations) and http_session.c (connections) share, and nothing else
 * uses.
 *
 * Every operation in flight is one SQE whose user_data says what it is for:
 * ud_pack() below is the only place that encoding lives.  Connections live
 * in a fixed table of cfg->max_conns slots, so a CQE finds its connection by
 * index without a lookup.
 */
#ifndef KVC_HTTP_SERVER_INT_H
#define KVC_HTTP_SERVER_INT_H

#include <liburing.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/signalfd.h>

#include "buf.h"
#include "http_conn.h"
#include "http_routes.h"
#include "http_server.h"
#include "http_worker.h"
#include "peers.h"
#include "proc_watch.h"
#include "rank_watch.h"
#include "uring_ud.h"

/* ---- user_data --------------------------------------------------------- */

enum op {
    OP_IGNORE = 0,     /* cancel and timeout-remove requests: result unused */
    OP_ACCEPT,         /* multishot accept on the listening socket */
    OP_ACCEPT_BACKOFF, /* timer before accept is armed again */
    OP_RECV,
    OP_SEND,
    OP_PARK_TIMEOUT, /* a parked lookup's wait_ms ran out */
    OP_SWEEP,        /* periodic deadline sweep */
    OP_SIGNAL,       /* read of the signalfd */
    OP_WAKE,         /* read of the rank watch's eventfd */
    OP_JOBS          /* read of the helper threads' eventfd */
};

/* The one packing of kvcoord's rings (uring_ud.h): op, sequence (which
 * park a timer belongs to), slot. */
static inline uint64_t ud_pack(enum op op, uint32_t slot, uint16_t seq)
{
    return kvc__ud_pack((unsigned)op, slot, seq);
}
static inline enum op ud_op(uint64_t ud) { return (enum op)kvc__ud_op(ud); }
static inline uint16_t ud_seq(uint64_t ud) { return (uint16_t)kvc__ud_seq(ud); }
static inline uint32_t ud_slot(uint64_t ud) { return kvc__ud_id(ud); }

static inline struct __kernel_timespec ms_ts(uint64_t ms)
{
    return (struct __kernel_timespec){.tv_sec = (long long)(ms / 1000),
                                      .tv_nsec = (long long)(ms % 1000) * 1000000};
}

/* ---- state --------------------------------------------------------------- */

#define SEND_IOV 16 /* pieces of output one send takes at most */

struct conn {
    int fd; /* -1: slot free */
    uint32_t slot;
    unsigned inflight; /* SQEs naming this slot, not yet completed */
    unsigned recv_armed : 1, send_armed : 1, parked : 1, park_timer : 1;
    unsigned closing : 1;          /* being torn down: waits for inflight == 0 */
    unsigned close_after_send : 1; /* answer what is queued, then close */
    unsigned peer_eof : 1;         /* the client shut its side */
    unsigned lingering : 1;        /* final answer sent: discarding input until EOF */
    unsigned deferred : 1;         /* its request is with the helper thread (job) */
    unsigned stop_answered : 1;    /* a parked lookup answered 503 at shutdown */
    uint16_t park_seq;
    unsigned zero_sends;
    unsigned head_pieces;   /* recvs that continued the current request head */
    uint64_t served;        /* requests answered */
    uint64_t wait_since_ms; /* accepted, or its last answer made: near the
                               cap, waiting long for a request is evictable */
    size_t out_counted;     /* its held answer bytes as counted in answer_bytes */
    uint64_t accepted_ms, head_start_ms, deadline_ms; /* 0: no deadline */
    uint64_t body_start_ms; /* the body being received began (its deadline) */
    uint64_t req_start_ns;  /* first byte of the request being served (metrics) */
    char *rbuf;             /* RBUF_SIZE bytes, allocated at the first bytes received
                               and kept with the slot; [roff, rlen) not parsed yet */
    uint32_t roff, rlen;
    struct buf out[2]; /* out[cur]: being filled; out[cur ^ 1]: being sent (its
                          bytes and the shared bodies queued in it: buf_total) */
    unsigned cur;
    size_t sent;                /* bytes of out[cur ^ 1] sent */
    struct msghdr msg;          /* the send in flight: ... */
    struct iovec iov[SEND_IOV]; /* ... its pieces (out's bytes, shared bodies) */
    struct http_conn http;
    struct route_slot route;
    struct worker_job job; /* a deferred request; counted in inflight */
    struct __kernel_timespec park_ts;
    struct conn *park_prev, *park_next; /* parked lookups */
    struct conn *next_free;
    struct conn *wait_prev, *wait_next; /* server.wait_head list (eviction order) */
    struct peer_addr peer;              /* its peer; counted in server.peers when capped */
    /* Shared renderings (ROUTE_SHARED): a deferred request identical to
     * another's whose job has not started joins it (leader) and is
     * answered with the same bytes; the leader lists its joiners. */
    struct conn *leader, *joiners, *join_next;
    uint32_t share_hash;
};

struct accepted {
    int fd;
    uint64_t ms;           /* when accepted: at the cap it waits for a slot, bounded */
    struct peer_addr peer; /* counted in server.peers when capped (peer_capped) */
};

struct server {
    struct io_uring ring;
    const struct server_config *cfg;
    struct http_limits limits;
    size_t buffered;  /* body bytes reserved by all connections (limits.buffered) */
    size_t untrusted; /* ... of which by unauthenticated peers' (limits.untrusted) */
    size_t
        answer_bytes;  /* answer bytes all connections hold, not all sent (cfg->max_answer_bytes) */
    unsigned nclosing; /* connections closing, their slots not back yet */
    int nodelay_inherited;              /* accepted sockets get TCP_NODELAY from the listener */
    struct conn *wait_head, *wait_tail; /* open connections by wait_since_ms, oldest first */
    uint64_t evicted;                   /* connections closed to make room at the cap */
    uint64_t evict_logged_ms, evict_logged;
    struct routes *routes;
    struct rank_watch *watch;
    int wake_fd;
    struct http_worker *worker;
    int jobs_fd;
    struct conn *conns;
    struct conn *free_list;
    unsigned nconns;
    struct conn *parked;
    uint64_t pending; /* operations in flight (every SQE but OP_IGNORE) */
    uint64_t now_ms;
    uint64_t batches; /* batches of completions taken (routes_batch) */
    int stopping, exit_code;
    int accept_armed, accept_waiting;
    unsigned accept_errors;
    struct accepted *accept_q; /* accepted sockets not opened yet (a ring of accept_cap) */
    unsigned accept_head, accept_len, accept_cap;
    uint64_t cap_logged_ms;
    struct peers peers; /* connections per peer address (--max-conns-per-peer) */
#define SHARE_SLOTS 64
    struct conn *share[SHARE_SLOTS]; /* deferred ROUTE_SHARED requests others may join,
                                        by hash of what their answer depends on */
    uint64_t shared_answers;         /* requests answered by joining another's job */
    uint64_t peer_refused, peer_logged_ms, peer_logged;
    struct __kernel_timespec sweep_ts, backoff_ts;
    struct signalfd_siginfo sig_buf;
    uint64_t wake_buf, jobs_buf;
    int ring_ok;
    struct proc_watch *procs;  /* segment maintenance, off the loop (proc_watch.h) */
    struct metrics *metrics;   /* NULL: not counted */
    struct seg_events *events; /* the segment's event log, run by procs */
    int poke_pending;          /* procs to be poked once this pass's answers are submitted */
};

/* http_server.c: an SQE for op (on connection c, or NULL for the server's
 * own), with its user_data set and counted in flight; NULL when the kernel
 * takes no more (callers cope: never dereference it). */
struct io_uring_sqe *op_sqe(struct server *s, enum op op, struct conn *c, uint16_t seq);

/* http_session.c */
/* A socket accept()ed, from peer (counted in s->peers when capped:
 * the connection now owns that count). */
void conn_open(struct server *s, int fd, const struct peer_addr *peer);
/* A socket just accepted: its peer address into *peer and, when capped,
 * counted; returns 1, or 0 when the peer is at --max-conns-per-peer (the
 * socket then answered 503 and closed, the refusal logged). */
int conn_admit(struct server *s, int fd, struct peer_addr *peer);
/* Is peer's count kept (and capped) in s->peers? */
int peer_capped(const struct server *s, const struct peer_addr *peer);
void conn_close(struct server *s, struct conn *c, const char *why);
/* A completion of one of c's operations (OP_RECV, OP_SEND, OP_PARK_TIMEOUT). */
void conn_complete(struct server *s, enum op op, struct conn *c, int res, uint16_t seq);
void conns_wake(struct server *s);      /* the rank table changed: re-check parked lookups */
void conns_jobs_done(struct server *s); /* the helper thread finished jobs */
void conns_sweep(struct server *s);     /* close connections past their deadline */
/* A slow peer: its current request head has come in HEAD_PIECES_SLOW or
 * more pieces (a trickle); its completions wait behind the others'. */
#define HEAD_PIECES_SLOW 3
static inline int conn_is_slow(const struct conn *c) { return c->head_pieces >= HEAD_PIECES_SLOW; }
/* At the cap: close up to want connections that have waited
 * CONN_EVICT_AFTER_MS or more for a request (a new one, or the rest of
 * one), oldest first; returns how many were closed. */
unsigned conns_evict(struct server *s, unsigned want);
#define CONN_EVICT_AFTER_MS 250
/* Shutdown: answer every parked lookup 503 "kvcoordd is stopping" (then
 * close); returns how many.  conns_stop_sending(): 1 while one of those
 * answers is not sent yet. */
unsigned conns_stop_parked(struct server *s);
int conns_stop_sending(const struct server *s);

#endif /* KVC_HTTP_SERVER_INT_H */
