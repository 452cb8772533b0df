/*
 * http_server.h - kvcoordd's HTTP/1.1 server: one io_uring event loop on
 * one thread serving every connection.
 */
#ifndef KVC_HTTP_SERVER_H
#define KVC_HTTP_SERVER_H

#include <stddef.h>

#include "kvcoord/kvcoord.h"

struct auth;
struct metrics;

struct server_config {
    int listen_fd;                  /* bound and listening */
    const char *listen_addr;        /* for the "listening" line: ADDR:PORT */
    const char *segment_name;       /* for the "listening" line */
    int signal_fd;                  /* signalfd of SIGINT/SIGTERM/SIGHUP (blocked in every
                                    thread); SIGHUP re-reads the token file */
    unsigned max_conns;             /* connections served at once; more get 503 and close */
    size_t max_head_bytes;          /* request line + headers: 414/431 beyond */
    size_t max_body_bytes;          /* request body: 413 beyond */
    unsigned header_timeout_ms;     /* a request head (and a new connection's first
                                    request) must arrive within this */
    unsigned idle_timeout_ms;       /* keep-alive idle time, and the longest stall of a
                                    body being received or a response being sent */
    struct auth *auth;              /* token of the mutating routes (NULL: none);
                                    re-read on SIGHUP by the loop */
    struct metrics *metrics;        /* counters of GET /metrics (may be NULL) */
    struct cluster *cluster;        /* the cluster view (--etcd), or NULL */
    struct seg_watch *segment_file; /* the segment file watch (seg_watch.h), or NULL */
    size_t max_buffered_bytes;      /* request bytes all connections may buffer together
                                       (bodies and heads); a body that does not fit gets
                                       503 and is not read (0: no budget) */
    unsigned body_timeout_ms;       /* a body must arrive whole within this of its head
                                       (0: only the idle timeout applies) */
    size_t max_answer_bytes;        /* answer bytes all connections together may hold
                                       unsent; over it a large answer (more than
                                       ROUTES_SMALL_ANSWER) gets 503 unless it would be
                                       the only one, and connections with unsent bytes
                                       are not read (0: no budget) */
    unsigned max_conns_per_peer;    /* connections one peer address may hold, accepted
                                     and waiting included; more get 503 and close
                                     (0: no cap) */
    int peer_cap_loopback;          /* the cap applies to loopback peers too (else they
                                     are exempt: every co-located rank shares one) */
    uint64_t pd_room_interval_ms; /* PD room -> DP rank entry lifetime (pd_upkeep.h); 0: default */
};

/* Serve until SIGINT or SIGTERM arrives on cfg->signal_fd.  Sends systemd
 * READY=1 once listening (notify.h), STOPPING=1 on the signal.  Returns the
 * process exit status: 0 after a signal, 1 when the server could not start
 * or its ring failed (logged).  Logs no "stopped": the caller logs it once
 * everything after the server (the cluster view's leave) is done. */
int server_run(const struct server_config *cfg, kvc_segment *seg);

#endif /* KVC_HTTP_SERVER_H */
