/*
 * kvcoordd_options.h - kvcoordd's command line.  Every option is one row
 * of options_table.c (name, short letter, kind, field, bounds, default,
 * help); the getopt_long array, the parsing with its range checks and the
 * --help text are generated from those rows by kvcoordd_options.c.
 * main() is kvcoordd.c's.
 */
#ifndef KVC_KVCOORDD_OPTIONS_H
#define KVC_KVCOORDD_OPTIONS_H

#include <stddef.h>
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
    uint64_t given;          /* bit i: the table's row i was on the command line */
    enum log_level log_level;
    /* cluster view: off without --etcd */
    const char *etcd, *cluster, *node, *advertise;
    const char *etcd_user, *etcd_password_file, *etcd_cacert, *etcd_cert, *etcd_key;
    uint32_t etcd_ttl_s;
    uint32_t pd_room_interval_s; /* --pd-room-interval (pd_upkeep.h) */
};

/* Parse argv into *o (defaults first: the table's, the library's for the
 * segment's sizes).  Returns 0 to run; -1 when --help or --version was
 * answered (exit 0); otherwise the exit status of a usage error (2),
 * already printed on stderr naming the option and the one range it
 * accepts.  Uses getopt_long's globals: not thread-safe. */
int options_parse(int argc, char **argv, struct options *o);

/* Whether an option that sets the field at offset off (offsetof(struct
 * options, ...)) was on the command line; 0 for an offset no option sets. */
int options_given(const struct options *o, size_t off);

#define OPTION_GIVEN(o, field) options_given((o), offsetof(struct options, field))

#endif /* KVC_KVCOORDD_OPTIONS_H */
