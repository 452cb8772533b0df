/*
 * cluster_internal.h - what the files of kvcoordd's cluster view (cluster.h)
 * share, and nothing else uses: its limits, the state the cluster thread
 * owns, and the functions one of its files calls in another (prefixed
 * cluster__).  Not installed; the rest of kvcoordd includes cluster.h only.
 *
 * One cluster thread owns most of the state below and is the only one
 * that writes mirrored entries or talks to etcd for publishing.  Four
 * helpers feed it through the inbox (struct cluster_inbox: one mutex +
 * condition variable):
 *   - the watch thread: a range of the whole prefix (a snapshot), then a
 *     watch stream from the next revision; each response is queued, and
 *     the time the stream last knew itself current is noted;
 *   - the fetch thread: large entries' bytes from their origin kvcoordd,
 *     asked for through its own queue (struct cluster_fetcher);
 *   - the rank waiter and the room waiter: sleep on the segment's futex
 *     epochs and flag a change.
 * struct cluster is made of parts, one per concern, each naming its owner
 * thread and its lock (none where one thread owns it).
 *
 * Telling local changes from the thread's own writes: every write the
 * cluster thread makes to the rank table returns the entry's generation,
 * kept as mine_gen; a scan that finds another generation sees a change
 * made by someone else on this node (HTTP or a worker), i.e. a local one.
 *
 * The files, one concern each:
 *   cluster.c          start and stop, the cluster thread's loop
 *   cluster_session.c  this node's session: etcd's health and backoff, the
 *                      lease, the node key
 *   cluster_keys.c     names, the etcd key layout and its parsing, digests,
 *                      the checks of what a peer's record holds
 *   cluster_slots.c    tables and slots, the segment's entries by table, and
 *                      the conflict rule that puts each winner into the segment
 *   cluster_publish.c  local changes (scanning the rank tables) and publishing
 *   cluster_rooms.c    room failures: published, and taken from other nodes
 *   cluster_mirror.c   the other nodes' records, from the watch's snapshots
 *                      and events; the mirror's drop and its leftovers
 *   cluster_fetch.c    large entries fetched from their origin, off the
 *                      cluster thread
 *   cluster_push.c     this node's room failures pushed to the nodes that
 *                      follow the room, beside etcd; a peer's push taken
 *   cluster_watch.c    the watch thread and the futex waiters
 *   cluster_follow.c   which nodes follow which rooms: this node's published,
 *                      the others' known, a departed node's shared rooms failed
 *   cluster_pd.c       the PD prefill tables: this node's published as one
 *                      record, the others' mirrored (pd_mirror.h)
 *   cluster_render.c   the figures: the readers' copy, /metrics, GET /cluster
 *
 * Every cluster__ function below runs on the cluster thread (and so uses
 * the parts it owns without a lock) unless its comment names another
 * thread.
 */
#ifndef KVC_CLUSTER_INTERNAL_H
#define KVC_CLUSTER_INTERNAL_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include <curl/curl.h>
#include <jansson.h>

#include "cluster.h"
#include "etcd_client.h"
#include "pd_mirror.h"

#define URL_MAX 256
#define DIGEST_HEX 65 /* SHA-256 in hex + NUL */
#define BACKOFF_MIN_MS 100
#define BACKOFF_MAX_MS 3000
#define ADOPTED_RING 8192
#define PENDING_ROOMS_MAX 4096
#define FAILURES_READ_TRIES 8 /* reads of the failure ring until its count holds still */
#define CONFLICTS_SHOWN 64
#define KEY_MAX 256

/* The entries the cluster view follows: the transfer-engine info (kind
 * EK_INFO) and the parallelism config (EK_PCFG) of every (rank, role).
 * Table ti = kind * CLUSTER_ROLES + role index; role 0 is the default role
 * and (EK_INFO, 0) is the rank table.  Role names from the segment always
 * find room; names that only peers use take at most REMOTE_ROLES_MAX
 * indexes (the segment keeps KVC_RANK_ROLES roles, the default included). */
enum entry_kind { EK_INFO = 0, EK_PCFG = 1, EK_KINDS };
#define CLUSTER_ROLES 16
#define REMOTE_ROLES_MAX (CLUSTER_ROLES - KVC_RANK_ROLES)
#define NTABLES (EK_KINDS * CLUSTER_ROLES)

/* ---- state --------------------------------------------------------------- */

/* Another node's record of a rank. */
struct remote {
    struct remote *next;
    char node[CLUSTER_NAME_MAX + 1];
    int64_t mod_rev;
    uint64_t gen;
    char digest[DIGEST_HEX];
    char sid[KVC_SESSION_ID_MAX + 1];
    char url[URL_MAX];
    char *info; /* NULL until known (inline, or fetched from url) */
    size_t info_len;
    int fetching;            /* a fetch job of this record is out (cluster_fetch.c) */
    uint64_t fetch_retry_at; /* monotonic ns: when a failed fetch is asked again */
    int stale;               /* snapshot bookkeeping */
};

enum applied { AP_NONE = 0, AP_LOCAL, AP_REMOTE };

/* What the cluster thread knows of one rank. */
struct rslot {
    struct remote *remotes;
    int local; /* this node has a registration of its own */
    uint64_t local_gen;
    char local_digest[DIGEST_HEX];
    int64_t local_rev;            /* its key's revision; INT64_MAX until published */
    int dirty;                    /* etcd does not have the local state yet (put or delete) */
    int queued;                   /* in the dirty queue */
    int published;                /* ranks/<me>/<rank> exists as far as we know */
    char *saved_sid, *saved_info; /* a local registration shadowed by a mirror */
    size_t saved_len;
    int32_t saved_pid; /* the process that registered it */
    uint64_t seen_gen; /* segment generation last looked at */
    uint64_t mine_gen; /* generation of the cluster thread's own last write */
    enum applied applied;
    char applied_node[CLUSTER_NAME_MAX + 1];
    uint64_t applied_gen;
    char applied_digest[DIGEST_HEX];
};

struct node_rec {
    char name[CLUSTER_NAME_MAX + 1];
    char url[URL_MAX];
    int64_t pid, ttl, lease;
    uint64_t started_ns, seen_ns;
    int stale;
};

/* A response of the watch thread: a snapshot (kvs) or events. */
struct batch {
    struct batch *next;
    int snapshot;
    etcd_kv *kvs;
    size_t nkv;
    etcd_event *ev;
    size_t nev;
    int64_t rev;
};

struct pending_room {
    uint64_t room;
    uint32_t origin_rank;
    int32_t code;
    int32_t pid;
    uint64_t time_ns;
    char reason[KVC_REASON_MAX + 1];
};

/* A rooms/<id> key this node created, deleted once the room TTL has passed
 * (it lives under the node's lease meanwhile). */
struct published_room {
    uint64_t room;
    uint64_t mono; /* when it was created, monotonic ns */
};

struct conflict {
    uint32_t rank;
    unsigned ti;
    char winner[CLUSTER_NAME_MAX + 1];
    char nodes[160];
};

/* A fetch of a large entry's bytes from its origin kvcoordd
 * (cluster_fetch.c): asked by the cluster thread, run by the fetch thread,
 * handed back with its result. */
struct fetch_job {
    struct fetch_job *next;
    unsigned ti;
    uint32_t rank;
    char node[CLUSTER_NAME_MAX + 1];
    char url[URL_MAX + 160]; /* the GET */
    char digest[DIGEST_HEX];
    char sid[KVC_SESSION_ID_MAX + 1];
    char label[96]; /* cluster__entry_label, for the log */
    int pcfg;       /* a parallelism config: the answer is the bytes */
    size_t limit;   /* most bytes of an answer */
    /* the result (the fetch thread's until handed back) */
    char *info; /* NULL: failed (err says why) */
    size_t info_len;
    char err[160];
    void *xfer; /* the fetch thread's transfer state */
};

/* A room failure pushed to one peer node (cluster_push.c): made by the
 * cluster thread, sent and freed by the push thread. */
struct push_job {
    struct push_job *next;
    char node[CLUSTER_NAME_MAX + 1];
    char url[URL_MAX + 32]; /* <the node's url>/cluster/room_failure */
    char *body;             /* the record, as etcd's rooms/<room> value */
    CURL *h;                /* the push thread's transfer */
};

/* Each part of the state names the thread that owns it and the lock, if
 * any, that guards it; nothing else is shared. */

/* What the cluster view was started with.  Written by cluster_start()
 * before any thread exists; read-only afterwards, by every thread, without
 * a lock. */
struct cluster_cfg {
    char cluster[CLUSTER_NAME_MAX + 1], node[CLUSTER_NAME_MAX + 1], url[URL_MAX];
    char prefix[160]; /* /kvcoord/<cluster>/ */
    uint32_t ttl_s;
    uint32_t call_ms;     /* an etcd request's bound per member (econf.timeout_ms) */
    uint32_t quiet_ms;    /* a watch stream this long without a message is probed */
    uint32_t deadline_ms; /* an etcd call's bound, fail-over included (econf.deadline_ms) */
    struct etcd_conf econf;
    char *endpoints, *user, *password_file, *cacert, *cert, *key;
    kvc_segment *seg;
    uint32_t max_ranks;
    uint64_t max_info_bytes;
    uint32_t room_ttl_s;
};

/* The threads.  Written by cluster_start() and cluster_stop() only (on
 * the thread that calls them). */
struct cluster_threads {
    pthread_t thread, watch_thread, rank_waiter, room_waiter, fetcher, pusher;
    int started_thread, started_watch, started_rank, started_room, started_fetcher, started_pusher;
};

/* What the helper threads hand the cluster thread, and cluster_stop()'s
 * request: every field under `mu`, and the cluster thread sleeps on `cv`
 * for any of them. */
struct cluster_inbox {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct batch *q_head, *q_tail;  /* the watch thread's responses */
    struct fetch_job *fetched;      /* the fetch thread's finished jobs */
    int rank_changed, room_changed; /* the futex waiters' flags */
    int watch_up;                   /* the watch thread holds a stream */
    uint64_t watch_down_since;      /* monotonic ns; 0 while up */
    uint64_t watch_heard;           /* monotonic ns: the watch last knew itself current (a message,
                              an answered probe, a snapshot); 0: never */
    char watch_endpoint[128];       /* the member of the stream, or of the last one */
    uint64_t watch_tick;            /* monotonic ns: the stream's last idle turn (at most 100 ms
                                       apart while nothing blocks it) */
    uint32_t watch_quiet_ms;        /* the stream's probe interval: a quarter of the shortest
                                       lease TTL of the nodes (cfg.quiet_ms's bounds), set by the
                                       cluster thread */
    etcd *watch_ec;                 /* the watch thread's handle (that thread's alone) */
    uint64_t watch_trouble;         /* monotonic ns: the watch last found etcd failing or slow (a
                              stream or snapshot that failed, a blind member, a probe or
                              snapshot slower than a quarter of the member bound); 0: never */
    int restart_watch;              /* the cluster thread asks for a new stream */
    int stop, clean;                /* cluster_stop() asks every thread to end */
};

/* The fetch thread's queue: every field under `mu`; the transfers
 * themselves (multi) are the fetch thread's alone. */
struct cluster_fetcher {
    pthread_mutex_t mu;
    struct fetch_job *queue; /* asked for, not started, oldest first */
    int stop;
    CURLM *multi; /* created by cluster_start(), then the fetch thread's */
};

/* The push thread's inbox: scan and stop under `mu`; the rest is the push
 * thread's (multi and headers made by cluster_start()). */
struct cluster_pusher {
    pthread_mutex_t mu;
    int scan; /* the room waiter saw a new failure record */
    int stop;
    uint64_t seen;                  /* the segment's failures_total last looked at */
    struct push_job *queue, **tail; /* not started yet, oldest first */
    size_t nqueued;
    CURLM *multi;
    struct curl_slist *headers; /* Content-Type, Expect, the token's Authorization */
    unsigned failed_in_row;
};

/* This node's session with etcd.  The cluster thread's alone (no lock). */
struct cluster_session {
    etcd *ec;
    int64_t lease;
    uint64_t lease_granted_mono, next_keepalive, retry_at;
    uint32_t backoff_ms;
    uint64_t etcd_down_since;     /* monotonic; 0 while etcd answers */
    uint64_t trouble_mono;        /* monotonic: a request to etcd last failed; 0: never */
    uint64_t watch_restarted_for; /* the etcd_down_since a fresh stream was asked for */
    int auth_logged;              /* this outage's refused authentication was logged */
};

/* The entries followed, table by table.  The cluster thread's alone. */
struct cluster_tables {
    char roles[CLUSTER_ROLES][KVC_ROLE_NAME_MAX + 1]; /* roles[0]: KVC_DEFAULT_ROLE */
    unsigned nroles;
    struct rslot **slots[NTABLES]; /* max_ranks each, allocated on first use */
    uint32_t *dirty_q;             /* ti * max_ranks + rank */
    size_t ndirty, cap_dirty;
    kvc_rank_info *list; /* scratch of the segment's calls */
    kvc_rank_info look;
};

/* The other nodes as etcd shows them.  The cluster thread's alone. */
struct cluster_peers {
    struct node_rec *nodes;
    size_t nnodes, cap_nodes;
    int have_snapshot;
    int dropped; /* mirrors dropped after the watch stayed unconfirmed */
};

/* Room failures, published and adopted.  The cluster thread's alone. */
struct cluster_rooms {
    uint64_t failures_seen;
    uint64_t adopted[ADOPTED_RING];
    size_t nadopted;
    struct pending_room *pending;
    size_t npending;
    struct published_room *pub; /* oldest first, from pub_head */
    size_t npub, pub_head, cap_pub;
};

/* One (room, node) pair of the remote map: node follows room. */
struct follow_entry {
    uint64_t room;
    uint16_t node; /* index into cluster_follow.names */
    uint8_t st;    /* free, used, tombstone (cluster_follow.c) */
    uint8_t stale; /* snapshot bookkeeping */
};

#define FOLLOW_NODES 4096 /* node names the remote map tells apart */

/* Which rooms this node follows (published as follows/<node>/<room>) and
 * which rooms the other nodes follow (from the watch).  The cluster
 * thread's; the remote map (tab, cap, used, filled, names, nnames) is
 * written by it under `mu`, and read by the push thread under `mu`. */
struct cluster_follow {
    pthread_mutex_t mu;
    kvc_room_info *list; /* scratch of kvc_room_list */
    size_t cap_list;
    uint64_t *cur, *pub; /* followed now / as etcd has them; sorted */
    size_t ncur, npub, cap_pub;
    uint64_t next_scan;       /* monotonic ns */
    struct follow_entry *tab; /* open addressing, cap a power of two */
    size_t cap, used, filled; /* filled: used + tombstones */
    char (*names)[CLUSTER_NAME_MAX + 1];
    unsigned nnames;
    /* Nodes whose record etcd deleted right after this node's own trouble
     * with etcd (an outage ends with every lease revoked that was not kept
     * alive in time): their rooms fail at `due` unless the node is back. */
    struct {
        int node; /* index into names */
        uint64_t due;
    } left[64];
    unsigned nleft;
};

/* The figures readers see (/metrics, GET /cluster): every field under
 * `mu`; the cluster thread writes them (the fetch thread adds its counts
 * with STAT_ADD), the io_uring loop copies them. */
struct cluster_figures {
    pthread_mutex_t mu;
    struct cluster_stats st;
    struct conflict conflicts[CONFLICTS_SHOWN];
    size_t nconflicts;
    struct node_rec *nodes_copy;
    size_t nnodes_copy;
};

/* The PD prefill tables (cluster_pd.c).  The cluster thread's alone, but
 * for the mirror, which has its own mutex (pd_mirror.h): the PD routes
 * read it. */
struct cluster_pd {
    struct pd_mirror *mirror; /* created by cluster_start() */
    char *published;          /* the record etcd was last given of this node's table */
    int dirty;                /* put (or delete) it again, changed or not */
    int key_exists;           /* pd/<node> is in etcd, as far as this node knows */
    int seen_own;             /* a snapshot held pd/<node> */
    uint64_t next_look;       /* monotonic ns: the segment's table looked at next */
};

struct cluster {
    struct cluster_cfg cfg;
    struct cluster_threads thr;
    struct cluster_inbox in;
    struct cluster_fetcher fx;
    struct cluster_pusher px;
    struct cluster_session ses;
    struct cluster_tables tab;
    struct cluster_peers peers;
    struct cluster_rooms rooms;
    struct cluster_follow follow;
    struct cluster_figures fig;
    struct cluster_pd pd;
};

/* Add n to the figure fig.st.field (under fig.mu). */
#define STAT_ADD(c, field, n)               \
    do {                                    \
        pthread_mutex_lock(&(c)->fig.mu);   \
        (c)->fig.st.field += (n);           \
        pthread_mutex_unlock(&(c)->fig.mu); \
    } while (0)

/* ---- tables, keys, records ----------------------------------------------- */

static inline unsigned t_kind(unsigned ti) { return ti / CLUSTER_ROLES; }

static inline const char *t_role(const struct cluster *c, unsigned ti)
{
    return c->tab.roles[ti % CLUSTER_ROLES];
}

/* The slot if it exists, without creating it. */
static inline struct rslot *slot_at(const struct cluster *c, unsigned ti, uint32_t rank)
{
    return c->tab.slots[ti] ? c->tab.slots[ti][rank] : NULL;
}

/* K_BAD: under ranks/, roles/ or parallelism/ but not a key of that form
 * (logged and skipped); K_OTHER: not ours to read (ignored). */
enum key_kind { K_OTHER, K_BAD, K_NODE, K_ENTRY, K_ROOM, K_PD, K_FOLLOW };

/* What a key names. */
struct keyref {
    unsigned kind;                    /* K_ENTRY: enum entry_kind */
    char role[KVC_ROLE_NAME_MAX + 1]; /* K_ENTRY: the role ("target" for ranks/) */
    char node[CLUSTER_NAME_MAX + 1];  /* K_NODE, K_ENTRY, K_PD, K_FOLLOW */
    uint64_t num;                     /* K_ENTRY: the rank; K_ROOM, K_FOLLOW: the room */
};

/* A peer's record, checked field by field (what etcd holds is untrusted:
 * any client of it may have written it). */
struct rec {
    uint64_t gen;
    const char *sid, *digest, *url, *info;
    size_t info_len;
};

/* ---- cluster_session.c --------------------------------------------------- */

/* A request to etcd failed (what: which one): counted, and logged when etcd
 * was answering until now. */
void cluster__etcd_failed(struct cluster *c, const char *what);
/* etcd answered: the backoff starts again, and a recovery is logged. */
void cluster__etcd_answered(struct cluster *c);
/* The next retry delay, ms: doubled from BACKOFF_MIN_MS up to BACKOFF_MAX_MS. */
uint32_t cluster__next_backoff(struct cluster *c);
/* The lease is gone (why): the next session step republishes everything
 * under a new one. */
void cluster__lease_gone(struct cluster *c, const char *why);
/* Start a session when none runs (and its retry is due), else keep the
 * lease alive when due. */
void cluster__session_step(struct cluster *c);

/* ---- cluster_keys.c ------------------------------------------------------ */

/* SHA-256 of sid, a NUL byte and info[0..info_len), in lowercase hex.
 * Any thread (the fetch thread checks its answers with it). */
void cluster__digest_of(const char *sid, const char *info, size_t info_len, char out[DIGEST_HEX]);
/* The key of node's entry (table ti, rank) into out[0..cap). */
void cluster__key_entry(const struct cluster *c, unsigned ti, const char *node, uint32_t rank,
                        char *out, size_t cap);
/* This node's nodes/<node> key into out[0..cap). */
void cluster__key_node(const struct cluster *c, char *out, size_t cap);
/* What key names, into *k; *why: what is wrong with a K_BAD key. */
enum key_kind cluster__parse_key(const struct cluster *c, const char *key, struct keyref *k,
                                 const char **why);
/* A record or key read from etcd that is not usable (why): counted and
 * logged, never mirrored. */
void cluster__record_skipped(struct cluster *c, const char *key, const char *why);
/* Check record o of key k (table ti) into *out; NULL when usable, else why
 * not (out's strings point into o). */
const char *cluster__check_record(const struct cluster *c, unsigned ti, const struct keyref *k,
                                  json_t *o, struct rec *out);

/* ---- cluster_slots.c ----------------------------------------------------- */

/* The table of (kind, role) if the role has an index, else -1. */
int cluster__table_find(const struct cluster *c, unsigned kind, const char *role);
/* The table of (kind, role), claiming an index for a new role name (local:
 * a role of this node's segment); -1 when no index is left. */
int cluster__table_for(struct cluster *c, unsigned kind, const char *role, int local);
/* The slot of (ti, rank), created on first use; NULL when out of range or
 * out of memory. */
struct rslot *cluster__slot(struct cluster *c, unsigned ti, uint32_t rank);
void cluster__free_remote(struct remote *r);
/* Forget a slot's kept copy of a shadowed local registration. */
void cluster__drop_saved(struct rslot *s);
/* etcd does not have s's local state yet: queue it for publishing. */
void cluster__mark_dirty(struct cluster *c, unsigned ti, uint32_t rank, struct rslot *s);
/* The segment's entry (ti, rank), and the list of table ti into c->list. */
kvc_err cluster__seg_lookup(struct cluster *c, unsigned ti, uint32_t rank, kvc_rank_info *out);
kvc_err cluster__seg_list(struct cluster *c, unsigned ti, size_t *n);
/* Withdraw the mirrored entry (ti, rank) of generation expect (note: why). */
kvc_err cluster__seg_withdraw(struct cluster *c, unsigned ti, uint32_t rank, const char *note,
                              uint64_t expect);
/* Which entry a log line is about ("rank=3 role=draft kind=..."), in buf. */
const char *cluster__entry_label(const struct cluster *c, unsigned ti, uint32_t rank, char *buf,
                                 size_t cap);
/* node's record in s, and (if link) the pointer that points at it. */
struct remote *cluster__find_remote(struct rslot *s, const char *node, struct remote ***link);
/* Put the winner of (ti, rank) into the segment (the conflict rule of
 * cluster.h); note: why a mirrored entry goes, when it does. */
void cluster__apply_winner(struct cluster *c, unsigned ti, uint32_t rank, const char *note);
/* Withdraw the shadowed local registrations whose worker has exited. */
void cluster__reap_shadowed(struct cluster *c);

/* ---- cluster_publish.c --------------------------------------------------- */

/* Look at every table of every role the segment keeps for local changes. */
void cluster__scan_local(struct cluster *c);
/* Send the dirty entries; 0, or -1 when etcd failed (they stay dirty). */
int cluster__publish_dirty(struct cluster *c);

/* ---- cluster_rooms.c ----------------------------------------------------- */

/* Take a room failure record of another node; 1 when it is this node's own. */
int cluster__adopt_room(struct cluster *c, const char *value, size_t len);
/* Queue one failure for publishing as this node's record of its room (the
 * record names this node, whatever f->origin_node says): 1, or 0 (logged)
 * when PENDING_ROOMS_MAX failures wait already. */
int cluster__queue_failure(struct cluster *c, const kvc_failure_info *f);
/* Queue the failures recorded since the last look, leaving out those
 * recorded before not_before_ns (CLOCK_REALTIME; 0: none left out). */
void cluster__scan_failures(struct cluster *c, uint64_t not_before_ns);
/* The failures recorded in c's segment since *seen (its failures_total at
 * the caller's last look), newest first, at most the ring's size: a
 * calloc'd array of *n the caller frees, and *seen moved to the current
 * total; NULL (nothing to free, *seen unchanged) when none is new or the
 * ring cannot be read now.  Shared by the publisher and the push. */
kvc_failure_info *cluster__failures_since(struct cluster *c, uint64_t *seen, size_t *n);
/* Publish the queued failures, create-only; 0, or -1 when etcd failed.
 * This node's own record found under another lease is put again under
 * this one. */
int cluster__publish_rooms(struct cluster *c);
/* A new session (lease): the rooms/<room> keys published under the lost
 * lease are gone with it, so the failures of those rooms still held by the
 * segment are queued again (their records as first written), and the rest
 * forgotten.  Otherwise a node whose watch was down while the key lived
 * (etcd back after a hang, the lease then revoked) never learns of the
 * failure.  Cluster thread only. */
void cluster__rooms_session(struct cluster *c);
/* etcd's rooms/<room> value of a failure of this node (malloc'd; NULL: out
 * of memory).  Any thread (reads cfg only). */
char *cluster__room_record(const struct cluster *c, const struct pending_room *p);

/* ---- cluster_follow.c ---------------------------------------------------- */

/* A lease was granted: every followed room is put again. */
void cluster__follow_session(struct cluster *c);
/* When this node's rooms are looked at next (monotonic ns). */
uint64_t cluster__follow_due(const struct cluster *c);
/* When due, put (delete) follows/<node>/<room> for the rooms a local rank
 * follows (no longer); 0, or -1 when etcd failed (sent again later). */
int cluster__follow_publish(struct cluster *c);
/* A follows/<node>/<room> key of another node put or deleted. */
void cluster__follow_record(struct cluster *c, const char *node, uint64_t room, int is_delete);
/* etcd deleted node's record (its lease ended): the rooms of this node's
 * segment it followed fail, and its pairs are forgotten; deferred by the
 * lease TTL + 1 s when this node had trouble with etcd within two TTLs
 * (the node may be alive, its lease lapsed in the outage), and dropped if
 * it comes back meanwhile (cluster__follow_node_back). */
void cluster__follow_node_left(struct cluster *c, const char *node);
void cluster__follow_node_back(struct cluster *c, const char *node);
/* Fail the rooms of the deferred departures that are due. */
void cluster__follow_tick(struct cluster *c);
/* Around a snapshot's records: pairs not in it are forgotten. */
void cluster__follow_snapshot_begin(struct cluster *c);
void cluster__follow_snapshot_end(struct cluster *c);
/* The figures' count of known pairs. */
void cluster__follow_count(struct cluster *c);
void cluster__follow_free(struct cluster *c);
/* The other nodes that follow room, as etcd last said: at most max names
 * copied into out; how many.  Any thread (takes follow.mu). */
size_t cluster__room_followers(struct cluster *c, uint64_t room, char (*out)[CLUSTER_NAME_MAX + 1],
                               size_t max);

/* ---- cluster_mirror.c ---------------------------------------------------- */

/* The watch's events, and a snapshot (which replaces what was known of the
 * other nodes). */
void cluster__handle_events(struct cluster *c, const etcd_event *ev, size_t n);
void cluster__handle_snapshot(struct cluster *c, const etcd_kv *kvs, size_t n, int64_t rev);
/* Drop every remote record and what was mirrored from them (note: why),
 * every entry when all; returns how many entries had some. */
size_t cluster__drop_remotes(struct cluster *c, const char *note, int all);
/* The watch unconfirmed past the leases (since since_mono): drop the mirror. */
void cluster__drop_unverified(struct cluster *c, uint64_t since_mono);
/* Withdraw the mirrored entries an earlier kvcoordd left in the segment
 * (cluster_start(), before any thread runs); how many. */
size_t cluster__withdraw_leftovers(struct cluster *c);

/* ---- cluster_pd.c -------------------------------------------------------- */

/* A lease was granted: this node's PD record is put again. */
void cluster__pd_session(struct cluster *c);
/* Put (or delete) this node's PD record when the segment's table changed
 * (or a new session asks for it); 0, or -1 when etcd failed (retried). */
int cluster__pd_publish(struct cluster *c);
/* A pd/<node> key of a snapshot or an event (is_delete: its deletion). */
void cluster__pd_record(struct cluster *c, const char *node, const etcd_kv *kv, int is_delete);
/* Around a snapshot's records: tables not in it go. */
void cluster__pd_snapshot_begin(struct cluster *c);
void cluster__pd_snapshot_end(struct cluster *c);
/* Drop every mirrored table (why). */
void cluster__pd_drop(struct cluster *c, const char *why);

/* ---- cluster_fetch.c ----------------------------------------------------- */

/* Ask the fetch thread for r's bytes (unless a job of r is out already);
 * cluster__fetched() takes the answer. */
void cluster__fetch_ask(struct cluster *c, unsigned ti, uint32_t rank, struct remote *r);
/* Ask again for the records whose fetch failed, once their retry is due. */
void cluster__fetch_due(struct cluster *c);
/* A job the fetch thread handed back: its bytes go to its record if that
 * has not changed since, and the winner is applied. */
void cluster__fetched(struct cluster *c, struct fetch_job *j);
/* Free a list of jobs (NULL ignored). */
void cluster__fetch_free(struct fetch_job *j);
/* The fetch thread (arg: the cluster); runs until fx.stop is set. */
void *cluster__fetch_main(void *arg);

/* ---- cluster_push.c ------------------------------------------------------ */

/* Ask the push thread to look for new failures of this node (the room
 * waiter, on a new failure record). */
void cluster__push_wake(struct cluster *c);
/* The push thread (arg: the cluster); runs until px.stop is set. */
void *cluster__push_main(void *arg);
/* Free a list of jobs (NULL ignored). */
void cluster__push_free(struct push_job *j);

/* ---- cluster_watch.c ----------------------------------------------------- */

/* The helpers' thread functions (arg: the cluster), each on a thread of its
 * own; they run until c->stop is set (the watch thread also ends at once
 * when it cannot open its etcd client, logged). */
void *cluster__watch_main(void *arg);
void *cluster__rank_waiter_main(void *arg);
void *cluster__room_waiter_main(void *arg);

/* ---- cluster_render.c ---------------------------------------------------- */

/* Copy the counts, conflicts and nodes for the readers (under smu). */
void cluster__refresh_stats(struct cluster *c);

#endif /* KVC_CLUSTER_INTERNAL_H */
