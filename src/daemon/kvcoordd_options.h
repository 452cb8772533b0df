/*
 * kvcoordd_options.h - kvcoordd's command line: the options, their
 * defaults, ranges and help text (kvcoordd_options.c); main() is
 * kvcoordd.c's.
 */
#ifndef KVC_KVCOORDD_OPTIONS_H
#define KVC_KVCOORDD_OPTIONS_H

#include <stdint.h>

#include "log.h"

struct options {
    const char *listen;
    const char *segment;   /* NULL: kvcoord-<port> */
    const char *auth_file; /* --auth-token-file; NULL: KVCOORD_AUTH_TOKEN or none */
    int fresh;             /* 1 --fresh, 2 --force-fresh */
    uint32_t world_size, max_ranks, max_rooms, max_procs, room_ttl_s;
    uint64_t max_info_bytes, arena_bytes, max_body, max_head;
    uint32_t max_conns;
    uint32_t max_conns_per_peer; /* --max-conns-per-peer, when given (0: no cap) */
    uint32_t header_timeout_s, idle_timeout_s;
    uint32_t bind_retry_s; /* how long EADDRINUSE is retried at start */
    uint32_t lock_timeout_ms;
    uint64_t max_buffered;   /* request bytes buffered by all connections together */
    uint32_t body_timeout_s; /* a whole body must arrive within this */
    uint64_t max_answer;     /* answer bytes all connections together may hold unsent */
    uint64_t given;          /* bit (c - OPT_LISTEN) for each option given */
    enum log_level log_level;
    /* cluster view: off without --etcd */
    const char *etcd, *cluster, *node, *advertise;
    const char *etcd_user, *etcd_password_file, *etcd_cacert, *etcd_cert, *etcd_key;
    uint32_t etcd_ttl_s;
    uint32_t pd_room_interval_s; /* --pd-room-interval (pd_upkeep.h) */
};

/* Each option's getopt value; o->given has bit (c - OPT_LISTEN) set for
 * each option given on the command line. */
enum {
    OPT_LISTEN = 256,
    OPT_SEGMENT,
    OPT_FRESH,
    OPT_FORCE_FRESH,
    OPT_WORLD,
    OPT_RANKS,
    OPT_INFO,
    OPT_ARENA,
    OPT_BODY,
    OPT_HEAD,
    OPT_CONNS,
    OPT_HTIMEOUT,
    OPT_ITIMEOUT,
    OPT_LOG,
    OPT_AUTH,
    OPT_ROOMS,
    OPT_PROCS,
    OPT_TTL,
    OPT_BIND_RETRY,
    OPT_LOCK_TIMEOUT,
    OPT_MAX_BUFFERED,
    OPT_BODY_TIMEOUT,
    OPT_ETCD,
    OPT_CLUSTER,
    OPT_NODE,
    OPT_ETCD_TTL,
    OPT_ADVERTISE,
    OPT_ETCD_USER,
    OPT_ETCD_PW,
    OPT_ETCD_CA,
    OPT_ETCD_CERT,
    OPT_ETCD_KEY,
    OPT_MAX_ANSWER,
    OPT_PD_INTERVAL,
    OPT_CONNS_PER_PEER
};

#define GIVEN(o, opt) (((o)->given >> ((opt)-OPT_LISTEN)) & 1)

/* Parse argv into *o (defaults first: the library's for the segment's
 * sizes).  Returns 0 to run; -1 when --help or --version was answered
 * (exit 0); otherwise the exit status of a usage error (2), already
 * printed on stderr with the one range each option accepts. */
int options_parse(int argc, char **argv, struct options *o);

#endif /* KVC_KVCOORDD_OPTIONS_H */
