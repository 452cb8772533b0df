/*
 * cluster.h - kvcoordd's cluster view on etcd (--etcd): this node's ranks
 * and room failures published under /kvcoord/<cluster>/ with the node's
 * lease, and the other nodes' ranks and failures mirrored into this node's
 * segment, so every lookup is local.
 *
 * Keys (values are JSON):
 *   nodes/<node>          {"node","url","pid","ttl","started_ns"}   node's lease
 *   ranks/<node>/<rank>   {"rank","node","session_id","generation","digest",
 *                          "bytes","url", "info" (when small)}      node's lease
 *                          (transfer-engine info of the default role)
 *   roles/<node>/<role>/<rank>        the same + "role"             node's lease
 *                          (transfer-engine info under another role, e.g. draft)
 *   parallelism/<node>/<role>/<rank>  {"rank","role","node","generation",
 *                          "digest","bytes","url","registered_ns",
 *                          "config" (when small)}                   node's lease
 *   rooms/<room>          {"room","origin_rank","code","reason","time_ns",
 *                          "node"}       a lease of the room TTL; create-only
 *   pd/<node>             the node's PD prefill table (pd_record.h)  node's lease
 *                          (only while it has a topology)
 *
 * A rank's weights_info_dict travels in its record ("info") up to
 * CLUSTER_INLINE_MAX bytes; a larger one (etcd refuses requests above
 * 1.5 MiB) is fetched from the origin node's kvcoordd (GET
 * /get_transfer_engine_info at the record's "url") and checked against the
 * record's digest (SHA-256 of session_id, a NUL byte and the info).
 *
 * Every record read from etcd is checked (names, sizes, the key's node,
 * rank and role, the digest): a malformed one is logged
 * (cluster_record_skipped) and skipped.
 *
 * Conflict rule: when several nodes hold a record for the same rank, the
 * record with the newest etcd revision (mod_revision) wins, on every node;
 * a local registration not yet published counts as newest (this node
 * serves it while etcd is away).  A shadowed local registration is kept
 * aside and comes back when the winner goes.
 *
 * Threads: cluster_start() starts the cluster thread (the only writer of
 * mirrored entries and the only publisher), a watch thread (range + watch
 * stream of the prefix, probing a quiet stream's member), a fetch thread
 * (large entries from their origin kvcoordd) and two futex waiters (rank
 * table and rooms) that wake it.  Every etcd request is bounded by the TTL,
 * and the mirror is withdrawn once the watch has not been confirmed for
 * longer than the nodes' leases.  The io_uring loop never calls etcd: it reads the figures below
 * (a mutex held for a copy) and the segment, which the cluster thread
 * writes through the public API.
 */
#ifndef KVC_CLUSTER_H
#define KVC_CLUSTER_H

#include <stddef.h>
#include <stdint.h>

#include "buf.h"
#include "kvcoord/kvcoord.h"

/* Largest weights_info_dict carried inside an etcd record, bytes. */
#define CLUSTER_INLINE_MAX (256u * 1024u)

struct cluster_conf {
    const char *endpoints;     /* --etcd, comma-separated URLs */
    const char *cluster;       /* --cluster name ([A-Za-z0-9._-]) */
    const char *node;          /* --node name ([A-Za-z0-9._-]) */
    const char *url;           /* this node's HTTP base URL, "http://host:port" */
    uint32_t ttl_s;            /* lease TTL, seconds (>= 1) */
    const char *user;          /* --etcd-user, or NULL */
    const char *password_file; /* --etcd-password-file */
    const char *cacert, *cert, *key;
    const char *http_token; /* this node's HTTP token (auth.h), sent with the
                               failures pushed to peer nodes; NULL: none */
    kvc_segment *seg;       /* borrowed; outlives the cluster */
};

struct cluster;

/* Check the names and endpoints and start the threads.  Does not wait for
 * etcd: an unreachable cluster is retried with backoff while the node
 * serves its own ranks.  Returns 0, or -1 with a message in err (bad name,
 * bad endpoint, unreadable password file, thread creation). */
int cluster_start(const struct cluster_conf *conf, struct cluster **out, char *err, size_t cap);

/* Whether s is a valid cluster or node name: 1..CLUSTER_NAME_MAX bytes of
 * [A-Za-z0-9._-] (it is a path segment of etcd keys).  Pure. */
#define CLUSTER_NAME_MAX 63
int cluster_name_ok(const char *s);

/* Stop the threads.  clean: revoke the lease first (this node's records
 * vanish from every node at once) and withdraw the mirrored entries from
 * the segment; else leave them to expire.  NULL ignored. */
void cluster_stop(struct cluster *c, int clean);

/* Figures for /metrics and GET /cluster (a consistent copy). */
struct cluster_stats {
    int etcd_up;                 /* last request to etcd succeeded */
    uint64_t etcd_down_since_ns; /* when it stopped answering; 0 while up */
    int64_t lease_id;            /* 0: none now */
    uint64_t lease_granted_ns;
    uint64_t sessions;   /* leases granted (1 + republishes) */
    uint64_t lease_lost; /* leases found gone (frozen past TTL, etcd reset) */
    uint64_t puts, deletes, publish_errors;
    uint64_t etcd_errors;
    uint32_t local_ranks;          /* published by this node (the default role's) */
    uint32_t mirrored_ranks;       /* other nodes' ranks in the segment now (the default role's) */
    uint32_t local_role_ranks;     /* the same for ranks under other roles */
    uint32_t mirrored_role_ranks;  /* (e.g. draft) */
    uint32_t local_parallelism;    /* the same for parallelism configs, every role */
    uint32_t mirrored_parallelism; /* */
    uint32_t conflicts;            /* entries with records from several nodes, every kind */
    uint64_t records_skipped;      /* malformed records and keys read from etcd, skipped */
    uint32_t nodes;                /* nodes with a live record, this one included */
    uint64_t mirror_writes, mirror_withdrawals;
    uint64_t fetches, fetch_failures, digest_mismatches;
    uint64_t rooms_published, rooms_lost_race, rooms_adopted;
    /* This node's failures pushed to peers (answered 200, or not); peers'
     * pushes received here, and taken (the room had no record). */
    uint64_t pushes, push_failures;
    uint64_t pushes_received, pushes_taken;
    uint32_t rooms_followed;         /* rooms a local rank follows, published */
    uint32_t rooms_shared;           /* (room, node) pairs other nodes follow */
    uint64_t rooms_failed_node_left; /* rooms failed when a node sharing them left */
    int pd_published;                /* etcd holds this node's PD prefill table */
    uint64_t unverified_since_ns;    /* mirror not confirmed by etcd since; 0: current */
    uint64_t confirmed_ns;           /* the watch last knew itself current (wall clock); 0: never */
    uint64_t unconfirmed_episodes;   /* times the mirror went from confirmed to unconfirmed */
    int watch_up;                    /* the watch thread holds a stream */
    char watch_endpoint[128];        /* the member of the stream (or of the last one) */
    uint64_t mirror_dropped;         /* mirrored entries dropped after etcd stayed away */
    int64_t revision;                /* newest etcd revision seen */
    int name_conflict;     /* this node's name is held by another kvcoordd (its URL below) */
    char name_holder[256]; /* as long as a node record's URL */
    char endpoint[128];    /* member answering */
    char last_error[640];  /* what failed: an etcd error (up to 512 bytes) with its hint */
};

void cluster_get_stats(struct cluster *c, struct cluster_stats *out);

/* A room failure pushed by a peer node (POST /cluster/room_failure, body:
 * etcd's rooms/<room> record of the origin node): checked as a record read
 * from etcd, and taken only by a room without a failure record
 * (kvc_room_fail_mirror_first: the first record stays, so a push never
 * displaces what etcd settled, and the same record twice is harmless).
 * Returns the HTTP status: 200 (*taken 1 when the room took it, 0 when it
 * had a record; *room the record's room), 400 (malformed: err says what),
 * 409 (the record names this node), 503/500 (the segment refused: err).
 * Any thread (it uses the segment's API and the figures' mutex). */
int cluster_push_receive(struct cluster *c, const char *body, size_t len, uint64_t *room,
                         int *taken, char *err, size_t cap);

/* The other nodes' PD prefill tables mirrored (pd_mirror.h; lives as long
 * as c), and this node's name (c's). */
struct pd_mirror *cluster_pd_mirror(struct cluster *c);
const char *cluster_node_name(const struct cluster *c);

/* Append the cluster's Prometheus families (kvcoord_cluster_*) to out. */
void cluster_render_metrics(struct cluster *c, struct buf *out);

/* Append GET /cluster's JSON answer to out: this node, etcd state, the
 * figures above, the nodes seen and the conflicts. */
void cluster_render_json(struct cluster *c, struct buf *out);

#endif /* KVC_CLUSTER_H */
