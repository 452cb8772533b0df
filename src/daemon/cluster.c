/*
 * cluster.c - publishing this node's ranks and room failures in etcd and
 * mirroring the other nodes'; see cluster.h for the keys and the rules.
 *
 * One cluster thread owns all the state below and is the only one that
 * writes mirrored entries or talks to etcd for publishing.  Three helpers
 * feed it through one mutex + condition variable:
 *   - the watch thread: a range of the whole prefix (a snapshot), then a
 *     watch stream from the next revision; each response is queued;
 *   - the rank waiter and the room waiter: sleep on the segment's futex
 *     epochs and flag a change.
 *
 * Telling local changes from the thread's own writes: every write the
 * cluster thread makes to the rank table returns the entry's generation,
 * kept as mine_gen; a scan that finds another generation sees a change
 * made by someone else on this node (HTTP or a worker), i.e. a local one.
 */
#include "clock.h"
#include "cluster.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <curl/curl.h>
#include <jansson.h>
#include <openssl/evp.h>

#include "etcd_client.h"
#include "log.h"

#define URL_MAX 256
#define DIGEST_HEX 65 /* SHA-256 in hex + NUL */
#define WAITER_SLICE_MS 250
#define BACKOFF_MIN_MS 100
#define BACKOFF_MAX_MS 3000
#define FETCH_TIMEOUT_MS 5000
#define ADOPTED_RING 8192
#define PENDING_ROOMS_MAX 4096
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
    int stale; /* snapshot bookkeeping */
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
    uint64_t time_ns;
    char reason[KVC_REASON_MAX + 1];
};

struct conflict {
    uint32_t rank;
    unsigned ti;
    char winner[CLUSTER_NAME_MAX + 1];
    char nodes[160];
};

struct cluster {
    /* configuration */
    char cluster[CLUSTER_NAME_MAX + 1], node[CLUSTER_NAME_MAX + 1], url[URL_MAX];
    char prefix[160]; /* /kvcoord/<cluster>/ */
    uint32_t ttl_s;
    struct etcd_conf econf;
    char *endpoints, *user, *password_file, *cacert, *cert, *key;
    kvc_segment *seg;
    uint32_t max_ranks;
    uint64_t max_info_bytes;
    uint32_t room_ttl_s;

    /* threads */
    pthread_t thread, watch_thread, rank_waiter, room_waiter;
    int started_thread, started_watch, started_rank, started_room;
    pthread_mutex_t mu; /* guards the fields down to `stop` */
    pthread_cond_t cv;
    struct batch *q_head, *q_tail;
    int rank_changed, room_changed;
    int watch_up;              /* the watch thread holds a stream */
    uint64_t watch_down_since; /* monotonic ns; 0 while up */
    int restart_watch;         /* cluster thread asks for a new stream */
    int stop, clean;

    /* cluster thread state */
    etcd *ec;
    CURL *fetch;
    char roles[CLUSTER_ROLES][KVC_ROLE_NAME_MAX + 1]; /* roles[0]: KVC_DEFAULT_ROLE */
    unsigned nroles;
    struct rslot **slots[NTABLES]; /* max_ranks each, allocated on first use */
    uint32_t *dirty_q;             /* ti * max_ranks + rank */
    size_t ndirty, cap_dirty;
    kvc_rank_info *list;
    kvc_rank_info look;
    struct node_rec *nodes;
    size_t nnodes, cap_nodes;
    int64_t lease;
    uint64_t lease_granted_mono, next_keepalive, retry_at, fetch_retry_at;
    uint32_t backoff_ms;
    uint64_t etcd_down_since; /* monotonic; 0 while etcd answers */
    int have_snapshot;
    uint64_t failures_seen;
    uint64_t adopted[ADOPTED_RING];
    size_t nadopted;
    struct pending_room *pending;
    size_t npending;
    int64_t room_lease;
    uint64_t room_lease_mono;
    int dropped;                  /* mirrors dropped after etcd stayed away */
    uint64_t watch_restarted_for; /* the etcd_down_since a fresh stream was asked for */

    /* figures, under smu */
    pthread_mutex_t smu;
    struct cluster_stats st;
    struct conflict conflicts[CONFLICTS_SHOWN];
    size_t nconflicts;
    struct node_rec *nodes_copy;
    size_t nnodes_copy;
};

int cluster_name_ok(const char *s)
{
    size_t n = strlen(s);
    if (n < 1 || n > CLUSTER_NAME_MAX)
        return 0;
    for (const char *p = s; *p; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
              *p == '.' || *p == '_' || *p == '-'))
            return 0;
    return 1;
}

static void digest_of(const char *sid, const char *info, size_t info_len, char out[DIGEST_HEX])
{
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int n = 0;
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    EVP_DigestInit_ex(ctx, EVP_sha256(), NULL);
    EVP_DigestUpdate(ctx, sid, strlen(sid) + 1); /* with its NUL: a separator */
    EVP_DigestUpdate(ctx, info, info_len);
    EVP_DigestFinal_ex(ctx, md, &n);
    EVP_MD_CTX_free(ctx);
    for (unsigned i = 0; i < n && i < 32; i++)
        snprintf(out + 2 * i, 3, "%02x", md[i]);
    out[64] = '\0';
}

/* ---- figures --------------------------------------------------------------- */

#define STAT_ADD(c, field, n)            \
    do {                                 \
        pthread_mutex_lock(&(c)->smu);   \
        (c)->st.field += (n);            \
        pthread_mutex_unlock(&(c)->smu); \
    } while (0)

static void etcd_failed(struct cluster *c, const char *what)
{
    uint64_t now = kvc__mono_ns();
    int first = !c->etcd_down_since;
    if (first)
        c->etcd_down_since = now;
    pthread_mutex_lock(&c->smu);
    c->st.etcd_errors++;
    if (first) {
        c->st.etcd_up = 0;
        c->st.etcd_down_since_ns = kvc__now_ns();
    }
    snprintf(c->st.last_error, sizeof c->st.last_error, "%s: %s", what, etcd_error(c->ec));
    pthread_mutex_unlock(&c->smu);
    if (first)
        log_event(LOG_WARN, "etcd_unreachable",
                  "cluster=%s node=%s op=%s err=\"%s\" note=\"serving this node's ranks; "
                  "retrying with backoff\"",
                  c->cluster, c->node, what, etcd_error(c->ec));
}

static void etcd_answered(struct cluster *c)
{
    if (c->etcd_down_since) {
        uint64_t down_ms = (kvc__mono_ns() - c->etcd_down_since) / 1000000;
        log_event(LOG_INFO, "etcd_reachable", "cluster=%s node=%s endpoint=%s down_ms=%" PRIu64,
                  c->cluster, c->node, etcd_endpoint(c->ec), down_ms);
        c->etcd_down_since = 0;
    }
    c->backoff_ms = 0;
    pthread_mutex_lock(&c->smu);
    c->st.etcd_up = 1;
    c->st.etcd_down_since_ns = 0;
    snprintf(c->st.endpoint, sizeof c->st.endpoint, "%s", etcd_endpoint(c->ec));
    pthread_mutex_unlock(&c->smu);
}

static uint32_t next_backoff(struct cluster *c)
{
    c->backoff_ms = c->backoff_ms ? c->backoff_ms * 2 : BACKOFF_MIN_MS;
    if (c->backoff_ms > BACKOFF_MAX_MS)
        c->backoff_ms = BACKOFF_MAX_MS;
    return c->backoff_ms;
}

/* ---- keys ---------------------------------------------------------------- */

static unsigned t_kind(unsigned ti) { return ti / CLUSTER_ROLES; }

static const char *t_role(const struct cluster *c, unsigned ti)
{
    return c->roles[ti % CLUSTER_ROLES];
}

/* An entry's key: ranks/<node>/<rank> (the rank table), roles/<node>/<role>/<rank>
 * (transfer-engine info under another role), parallelism/<node>/<role>/<rank>. */
static void key_entry(const struct cluster *c, unsigned ti, const char *node, uint32_t rank,
                      char *out, size_t cap)
{
    if (ti == 0)
        snprintf(out, cap, "%sranks/%s/%u", c->prefix, node, rank);
    else
        snprintf(out, cap, "%s%s/%s/%s/%u", c->prefix,
                 t_kind(ti) == EK_INFO ? "roles" : "parallelism", node, t_role(c, ti), rank);
}

static void key_node(const struct cluster *c, char *out, size_t cap)
{
    snprintf(out, cap, "%snodes/%s", c->prefix, c->node);
}

/* K_BAD: under ranks/, roles/ or parallelism/ but not a key of that form
 * (logged and skipped); K_OTHER: not ours to read (ignored). */
enum key_kind { K_OTHER, K_BAD, K_NODE, K_ENTRY, K_ROOM };

/* What a key names. */
struct keyref {
    unsigned kind;                    /* K_ENTRY: enum entry_kind */
    char role[KVC_ROLE_NAME_MAX + 1]; /* K_ENTRY: the role ("target" for ranks/) */
    char node[CLUSTER_NAME_MAX + 1];  /* K_NODE, K_ENTRY */
    uint64_t num;                     /* K_ENTRY: the rank; K_ROOM: the room */
};

/* Copy the path segment at *p (up to '/' or the end) into out[0..cap) and
 * step past it and its '/'; -1 when empty or too long. */
static int take_segment(const char **p, char *out, size_t cap)
{
    const char *end = strchr(*p, '/');
    size_t n = end ? (size_t)(end - *p) : strlen(*p);
    if (!n || n >= cap)
        return -1;
    memcpy(out, *p, n);
    out[n] = '\0';
    *p += n + (end ? 1 : 0);
    return end ? 1 : 0; /* 1: more follows */
}

/* A decimal number of at most 20 digits, nothing else; -1 otherwise. */
static int parse_decimal(const char *s, uint64_t max, uint64_t *out)
{
    uint64_t v = 0;
    if (!*s || strlen(s) > 20)
        return -1;
    for (; *s; s++) {
        if (*s < '0' || *s > '9' || v > (max - (uint64_t)(*s - '0')) / 10)
            return -1;
        v = v * 10 + (uint64_t)(*s - '0');
    }
    *out = v;
    return 0;
}

/* Split a key under the prefix: nodes/<n>, ranks/<n>/<rank>,
 * roles/<n>/<role>/<rank>, parallelism/<n>/<role>/<rank>, rooms/<id>.
 * *why: what is wrong with a K_BAD key. */
static enum key_kind parse_key(const struct cluster *c, const char *key, struct keyref *k,
                               const char **why)
{
    size_t pl = strlen(c->prefix);
    *why = "";
    if (strncmp(key, c->prefix, pl))
        return K_OTHER;
    const char *p = key + pl;
    char num[32];
    if (!strncmp(p, "nodes/", 6)) {
        if (!cluster_name_ok(p + 6))
            return K_OTHER;
        snprintf(k->node, sizeof k->node, "%s", p + 6);
        return K_NODE;
    }
    if (!strncmp(p, "rooms/", 6))
        return parse_decimal(p + 6, UINT64_MAX, &k->num) ? K_OTHER : K_ROOM;
    int with_role;
    if (!strncmp(p, "ranks/", 6)) {
        p += 6, with_role = 0, k->kind = EK_INFO;
    } else if (!strncmp(p, "roles/", 6)) {
        p += 6, with_role = 1, k->kind = EK_INFO;
    } else if (!strncmp(p, "parallelism/", 12)) {
        p += 12, with_role = 1, k->kind = EK_PCFG;
    } else {
        return K_OTHER;
    }
    snprintf(k->role, sizeof k->role, "%s", KVC_DEFAULT_ROLE);
    if (take_segment(&p, k->node, sizeof k->node) != 1 || !cluster_name_ok(k->node)) {
        *why = "bad node name in the key";
        return K_BAD;
    }
    if (with_role &&
        (take_segment(&p, k->role, sizeof k->role) != 1 || kvc_role_check(k->role) != KVC_OK)) {
        *why = "bad role name in the key (1..31 bytes of [A-Za-z0-9._-])";
        return K_BAD;
    }
    if (with_role && k->kind == EK_INFO && !strcmp(k->role, KVC_DEFAULT_ROLE)) {
        *why = "the default role's ranks live under ranks/, not roles/";
        return K_BAD;
    }
    if (take_segment(&p, num, sizeof num) != 0 || parse_decimal(num, UINT32_MAX, &k->num)) {
        *why = "bad rank in the key";
        return K_BAD;
    }
    return K_ENTRY;
}

/* ---- what a peer sends: logged and skipped when malformed ---------------- */

/* A record or key read from etcd that is not usable: counted and logged
 * (the log escapes what it prints), never mirrored. */
static void record_skipped(struct cluster *c, const char *key, const char *why)
{
    STAT_ADD(c, records_skipped, 1);
    log_event(LOG_WARN, "cluster_record_skipped", "cluster=%s key=%.200s why=\"%s\"", c->cluster,
              key, why);
}

/* ---- tables and slots ------------------------------------------------------ */

/* The table of (kind, role) if the role has an index, else -1. */
static int table_find(const struct cluster *c, unsigned kind, const char *role)
{
    for (unsigned i = 0; i < c->nroles; i++)
        if (!strcmp(c->roles[i], role))
            return (int)(kind * CLUSTER_ROLES + i);
    return -1;
}

/* The table of (kind, role), claiming a role index for a new name (local:
 * a role of this node's segment, which always finds one).  -1: no index
 * left for a name only peers use. */
static int table_for(struct cluster *c, unsigned kind, const char *role, int local)
{
    int ti = table_find(c, kind, role);
    if (ti >= 0)
        return ti;
    if (c->nroles >= (local ? CLUSTER_ROLES : REMOTE_ROLES_MAX))
        return -1;
    snprintf(c->roles[c->nroles], sizeof c->roles[0], "%s", role);
    return (int)(kind * CLUSTER_ROLES + c->nroles++);
}

static struct rslot *slot(struct cluster *c, unsigned ti, uint32_t rank)
{
    if (rank >= c->max_ranks || ti >= NTABLES)
        return NULL;
    if (!c->slots[ti] && !(c->slots[ti] = calloc(c->max_ranks, sizeof *c->slots[ti])))
        return NULL;
    if (!c->slots[ti][rank])
        c->slots[ti][rank] = calloc(1, sizeof(struct rslot));
    return c->slots[ti][rank];
}

/* The slot if it exists, without creating it. */
static struct rslot *slot_at(const struct cluster *c, unsigned ti, uint32_t rank)
{
    return c->slots[ti] ? c->slots[ti][rank] : NULL;
}

static void free_remote(struct remote *r)
{
    free(r->info);
    free(r);
}

static void drop_saved(struct rslot *s)
{
    free(s->saved_sid);
    free(s->saved_info);
    s->saved_sid = s->saved_info = NULL;
    s->saved_len = 0;
    s->saved_pid = 0;
}

static void mark_dirty(struct cluster *c, unsigned ti, uint32_t rank, struct rslot *s)
{
    s->dirty = 1;
    if (s->queued)
        return;
    if (c->ndirty == c->cap_dirty) {
        size_t cap = c->cap_dirty ? c->cap_dirty * 2 : 256;
        uint32_t *q = realloc(c->dirty_q, cap * sizeof *q);
        if (!q)
            return; /* stays dirty: queued again by the next session or snapshot */
        c->dirty_q = q, c->cap_dirty = cap;
    }
    s->queued = 1;
    c->dirty_q[c->ndirty++] = ti * c->max_ranks + rank;
}

/* ---- the segment's entries, by table ---------------------------------- */

static kvc_err seg_lookup(struct cluster *c, unsigned ti, uint32_t rank, kvc_rank_info *out)
{
    if (ti == 0)
        return kvc_rank_lookup(c->seg, rank, out);
    if (t_kind(ti) == EK_INFO)
        return kvc_role_lookup(c->seg, t_role(c, ti), rank, out);
    return kvc_parallelism_lookup(c->seg, t_role(c, ti), rank, out);
}

static kvc_err seg_list(struct cluster *c, unsigned ti, size_t *n)
{
    if (ti == 0)
        return kvc_rank_list(c->seg, c->list, c->max_ranks, n, 1);
    if (t_kind(ti) == EK_INFO)
        return kvc_role_list(c->seg, t_role(c, ti), c->list, c->max_ranks, n, 1);
    return kvc_parallelism_list(c->seg, t_role(c, ti), c->list, c->max_ranks, n, 1);
}

/* A local registration again (a shadowed one coming back). */
static kvc_err seg_register(struct cluster *c, unsigned ti, uint32_t rank, const char *sid,
                            const char *info, size_t len, uint64_t *gen)
{
    if (t_kind(ti) == EK_INFO)
        return kvc_role_register(c->seg, t_role(c, ti), rank, sid, info, len, gen);
    return kvc_parallelism_register(c->seg, t_role(c, ti), rank, info, len, gen);
}

static kvc_err seg_mirror(struct cluster *c, unsigned ti, uint32_t rank, const struct remote *r,
                          uint64_t expect, uint64_t *gen)
{
    if (ti == 0)
        return kvc_rank_register_mirror(c->seg, rank, r->sid, r->info, r->info_len, r->node, r->gen,
                                        expect, gen);
    if (t_kind(ti) == EK_INFO)
        return kvc_role_register_mirror(c->seg, t_role(c, ti), rank, r->sid, r->info, r->info_len,
                                        r->node, r->gen, expect, gen);
    return kvc_parallelism_register_mirror(c->seg, t_role(c, ti), rank, r->info, r->info_len,
                                           r->node, r->gen, expect, gen);
}

static kvc_err seg_withdraw_mirror(struct cluster *c, unsigned ti, uint32_t rank, const char *note,
                                   uint64_t expect)
{
    if (ti == 0)
        return kvc_rank_withdraw_mirror(c->seg, rank, note, expect);
    if (t_kind(ti) == EK_INFO)
        return kvc_role_withdraw_mirror(c->seg, t_role(c, ti), rank, note, expect);
    return kvc_parallelism_withdraw_mirror(c->seg, t_role(c, ti), rank, note, expect);
}

/* "rank 3", "rank 3 role=draft", "parallelism rank 3 role=target": which
 * entry a log line is about. */
static const char *entry_label(const struct cluster *c, unsigned ti, uint32_t rank, char *buf,
                               size_t cap)
{
    if (ti == 0)
        snprintf(buf, cap, "rank=%u", rank);
    else
        snprintf(buf, cap, "rank=%u role=%s kind=%s", rank, t_role(c, ti),
                 t_kind(ti) == EK_INFO ? "transfer_engine_info" : "parallelism_config");
    return buf;
}

static void remember_mine(struct cluster *c, unsigned ti, uint32_t rank, struct rslot *s)
{
    /* The generation our write produced: read it back (a withdrawal does
     * not return it). */
    kvc_err e = seg_lookup(c, ti, rank, &c->look);
    if (e == KVC_OK || e == KVC_E_WITHDRAWN)
        s->mine_gen = s->seen_gen = c->look.generation;
}

/* Look at the rank table again on the next turn of the loop. */
static void rescan(struct cluster *c)
{
    pthread_mutex_lock(&c->mu);
    c->rank_changed = 1;
    pthread_mutex_unlock(&c->mu);
}

static struct remote *find_remote(struct rslot *s, const char *node, struct remote ***link)
{
    struct remote **pp = &s->remotes;
    for (; *pp; pp = &(*pp)->next)
        if (!strcmp((*pp)->node, node)) {
            if (link)
                *link = pp;
            return *pp;
        }
    return NULL;
}

/* Put the winner of (table ti, rank) into the segment (the conflict rule
 * of cluster.h).  note: why a mirrored entry goes, when it does. */
static void apply_winner(struct cluster *c, unsigned ti, uint32_t rank, const char *note)
{
    struct rslot *s = slot(c, ti, rank);
    if (!s)
        return;
    char lbl[96];
    struct remote *best = NULL;
    int64_t best_rev = s->local ? s->local_rev : -1;
    for (struct remote *r = s->remotes; r; r = r->next)
        if (r->info && r->mod_rev > best_rev)
            best = r, best_rev = r->mod_rev;
    uint64_t gen;
    kvc_err e = KVC_OK;
    if (!best && s->local) {
        if (s->applied != AP_LOCAL && s->saved_info) {
            e = seg_register(c, ti, rank, s->saved_sid, s->saved_info, s->saved_len, &gen);
            if (e == KVC_OK)
                remember_mine(c, ti, rank, s);
            drop_saved(s);
        }
        s->applied = AP_LOCAL;
    } else if (best) {
        if (s->applied == AP_REMOTE && !strcmp(s->applied_node, best->node) &&
            s->applied_gen == best->gen && !strcmp(s->applied_digest, best->digest))
            return;
        if (s->applied == AP_LOCAL && s->local && !s->saved_info &&
            seg_lookup(c, ti, rank, &c->look) == KVC_OK && !c->look.origin[0]) {
            s->saved_sid = strdup(c->look.session_id);
            s->saved_info = malloc(c->look.info_len + 1);
            if (s->saved_info)
                memcpy(s->saved_info, c->look.info, c->look.info_len + 1);
            s->saved_len = c->look.info_len;
            /* Withdrawn with its process only if that still runs now: a
             * registration left by an earlier kvcoordd of this segment (its
             * pid gone) stays this node's until withdrawn. */
            s->saved_pid =
                c->look.pid > 0 && (kill(c->look.pid, 0) == 0 || errno == EPERM) ? c->look.pid : 0;
            if (!s->saved_sid || !s->saved_info)
                drop_saved(s);
        }
        /* Conditional on the generation last seen: a local registration
         * landing meanwhile is never overwritten (the scan it triggers
         * decides again). */
        e = seg_mirror(c, ti, rank, best, s->seen_gen, &gen);
        if (e == KVC_E_INVAL || e == KVC_E_TOOBIG) {
            /* The bytes (matching their digest) are not what the segment
             * holds (not a JSON object, too large): the record is skipped
             * and the next best one decides. */
            char key[KEY_MAX];
            key_entry(c, ti, best->node, rank, key, sizeof key);
            record_skipped(c, key, kvc_last_error());
            struct remote **link;
            if (find_remote(s, best->node, &link)) {
                *link = best->next;
                free_remote(best);
            }
            apply_winner(c, ti, rank, note);
            return;
        }
        if (e == KVC_OK) {
            s->mine_gen = s->seen_gen = gen;
            s->applied = AP_REMOTE;
            snprintf(s->applied_node, sizeof s->applied_node, "%s", best->node);
            s->applied_gen = best->gen;
            snprintf(s->applied_digest, sizeof s->applied_digest, "%s", best->digest);
            STAT_ADD(c, mirror_writes, 1);
            log_event(
                LOG_DEBUG, "mirror_put", "%s origin=%s origin_generation=%" PRIu64 " rev=%" PRId64,
                entry_label(c, ti, rank, lbl, sizeof lbl), best->node, best->gen, best->mod_rev);
        }
    } else if (s->applied == AP_REMOTE) {
        char buf[KVC_NOTE_MAX + 1];
        snprintf(buf, sizeof buf, "%s", note ? note : "withdrawn on its origin node");
        e = seg_withdraw_mirror(c, ti, rank, buf, s->seen_gen);
        if (e == KVC_OK || e == KVC_E_NOENT)
            remember_mine(c, ti, rank, s);
        if (e == KVC_E_EXISTS)
            rescan(c);
        s->applied = AP_NONE;
        STAT_ADD(c, mirror_withdrawals, 1);
        log_event(LOG_DEBUG, "mirror_withdrawn", "%s origin=%s note=\"%s\"",
                  entry_label(c, ti, rank, lbl, sizeof lbl), s->applied_node, buf);
        e = KVC_OK;
    }
    if (e == KVC_E_EXISTS)
        rescan(c); /* changed on this node meanwhile */
    else if (e != KVC_OK)
        log_event(LOG_WARN, "mirror_write_failed", "%s err=\"%s\"",
                  entry_label(c, ti, rank, lbl, sizeof lbl), kvc_last_error());
}

/* A shadowed local registration of a worker that has exited: the segment
 * no longer holds it (the mirror does), so the library's withdrawal at the
 * worker's end did not reach it; withdraw it here. */
static void reap_shadowed(struct cluster *c)
{
    char lbl[96];
    for (unsigned ti = 0; ti < NTABLES; ti++)
        for (uint32_t r = 0; c->slots[ti] && r < c->max_ranks; r++) {
            struct rslot *s = c->slots[ti][r];
            if (!s || !s->saved_info || s->saved_pid <= 0 || s->saved_pid == getpid() ||
                kill(s->saved_pid, 0) == 0 || errno != ESRCH)
                continue;
            log_event(LOG_INFO, "shadowed_withdrawn",
                      "%s pid=%d note=\"the worker of this node's registration (shadowed by "
                      "node %s's) exited\"",
                      entry_label(c, ti, r, lbl, sizeof lbl), (int)s->saved_pid, s->applied_node);
            drop_saved(s);
            s->local = 0;
            mark_dirty(c, ti, r, s);
            apply_winner(c, ti, r, NULL);
        }
}

/* ---- local changes (the rank tables) ------------------------------------ */

static void scan_table(struct cluster *c, unsigned ti)
{
    size_t n = 0;
    if (seg_list(c, ti, &n) != KVC_OK)
        return;
    if (n > c->max_ranks)
        n = c->max_ranks;
    for (size_t i = 0; i < n; i++) {
        const kvc_rank_info *e = &c->list[i];
        struct rslot *s = slot(c, ti, e->rank);
        if (!s || e->generation == s->seen_gen)
            continue;
        s->seen_gen = e->generation;
        if (e->generation == s->mine_gen)
            continue;
        if (e->state == KVC_RANK_REGISTERED && !e->origin[0]) {
            if (seg_lookup(c, ti, e->rank, &c->look) != KVC_OK)
                continue; /* changed again meanwhile: the next scan sees it */
            s->seen_gen = c->look.generation;
            s->local = 1;
            s->local_gen = c->look.generation;
            digest_of(c->look.session_id, c->look.info, c->look.info_len, s->local_digest);
            s->local_rev = INT64_MAX;
            drop_saved(s);
            s->applied = AP_LOCAL;
            mark_dirty(c, ti, e->rank, s);
        } else if (e->state == KVC_RANK_REGISTERED) {
            /* A mirror left by an earlier kvcoordd: reconciled with the
             * snapshot (kept meanwhile, so lookups go on answering). */
            s->applied = AP_REMOTE;
            snprintf(s->applied_node, sizeof s->applied_node, "%s", e->origin);
            s->applied_gen = e->origin_generation;
            s->applied_digest[0] = '\0';
            s->mine_gen = e->generation;
        } else if (s->applied == AP_REMOTE) {
            /* Someone withdrew a mirrored entry here: its origin still has
             * it, so it comes back (withdraw on the origin node). */
            s->applied = AP_NONE;
            apply_winner(c, ti, e->rank, NULL);
        } else if (s->local || s->applied == AP_LOCAL) {
            s->local = 0;
            s->applied = AP_NONE;
            drop_saved(s);
            mark_dirty(c, ti, e->rank, s);
            apply_winner(c, ti, e->rank, NULL);
        }
    }
}

/* Every table of every role the segment keeps: the rank table, the other
 * roles' transfer-engine infos and the parallelism configs. */
static void scan_local(struct cluster *c)
{
    char names[KVC_RANK_ROLES][KVC_ROLE_NAME_MAX + 1];
    size_t nr = 0;
    if (kvc_role_names(c->seg, names, KVC_RANK_ROLES, &nr) != KVC_OK)
        nr = 1;
    if (nr > KVC_RANK_ROLES)
        nr = KVC_RANK_ROLES;
    snprintf(names[0], sizeof names[0], "%s", KVC_DEFAULT_ROLE);
    for (size_t i = 0; i < nr; i++)
        for (unsigned kind = 0; kind < EK_KINDS; kind++) {
            int ti = table_for(c, kind, names[i], 1);
            if (ti >= 0)
                scan_table(c, (unsigned)ti);
        }
}

/* ---- publishing ---------------------------------------------------------- */

/* The record of a local entry: the rank table's as before roles were
 * published (no "role"); another role's with "role"; a parallelism
 * config's with "role" and the config as "config" (no session_id). */
static char *rank_record(struct cluster *c, unsigned ti, uint32_t rank, const kvc_rank_info *ri,
                         const char *digest)
{
    json_t *o = json_pack("{s:I, s:s, s:I, s:s, s:I, s:s, s:I}", "rank", (json_int_t)rank, "node",
                          c->node, "generation", (json_int_t)ri->generation, "digest", digest,
                          "bytes", (json_int_t)ri->info_len, "url", c->url, "registered_ns",
                          (json_int_t)ri->registered_ns);
    if (!o)
        return NULL;
    if (t_kind(ti) == EK_INFO)
        json_object_set_new(o, "session_id", json_string(ri->session_id));
    if (ti != 0)
        json_object_set_new(o, "role", json_string(t_role(c, ti)));
    if (ri->info_len <= CLUSTER_INLINE_MAX)
        json_object_set_new(o, t_kind(ti) == EK_INFO ? "info" : "config",
                            json_stringn(ri->info, ri->info_len));
    char *s = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    return s;
}

static void lease_gone(struct cluster *c, const char *why)
{
    log_event(LOG_WARN, "lease_lost",
              "cluster=%s node=%s lease=%" PRId64 " why=\"%s\" note=\"republishing everything "
              "this node holds under a new lease\"",
              c->cluster, c->node, c->lease, why);
    c->lease = 0;
    c->retry_at = 0;
    pthread_mutex_lock(&c->smu);
    c->st.lease_lost++;
    c->st.lease_id = 0;
    pthread_mutex_unlock(&c->smu);
}

/* Most operations and bytes of one publishing transaction: below etcd's
 * default --max-txn-ops (128) and request limit (1.5 MiB, and values
 * travel base64-encoded: 4/3 of their size). */
#define BATCH_OPS 64
#define BATCH_BYTES (900u * 1024u)

/* The record to put for a dirty local entry, or NULL (changed since the
 * scan: the next scan queues it again). */
static char *local_record(struct cluster *c, unsigned ti, uint32_t rank, struct rslot *s)
{
    kvc_err e = seg_lookup(c, ti, rank, &c->look);
    if (e == KVC_OK && !c->look.origin[0] && c->look.generation == s->local_gen)
        return rank_record(c, ti, rank, &c->look, s->local_digest);
    if (!s->saved_info)
        return NULL;
    /* Shadowed by a mirror: publish the kept copy. */
    kvc_rank_info tmp = {0};
    tmp.generation = s->local_gen;
    snprintf(tmp.session_id, sizeof tmp.session_id, "%s", s->saved_sid ? s->saved_sid : "");
    tmp.info = s->saved_info;
    tmp.info_len = s->saved_len;
    return rank_record(c, ti, rank, &tmp, s->local_digest);
}

/* Send the dirty entries, many per transaction (a node registering 128
 * ranks costs a few round trips and raft entries, not 128).  Returns 0,
 * -1 when etcd failed (they stay dirty: retried later). */
static int publish_dirty(struct cluster *c)
{
    struct etcd_op ops[BATCH_OPS];
    char *vals[BATCH_OPS];
    char keys[BATCH_OPS][KEY_MAX];
    uint32_t ids[BATCH_OPS];
    while (c->ndirty) {
        size_t n = 0, bytes = 0, take = 0;
        while (take < c->ndirty && n < BATCH_OPS) {
            uint32_t id = c->dirty_q[c->ndirty - 1 - take];
            unsigned ti = id / c->max_ranks;
            uint32_t rank = id % c->max_ranks;
            struct rslot *s = slot_at(c, ti, rank);
            char *rec = NULL;
            if (s->dirty && s->local && !(rec = local_record(c, ti, rank, s)))
                s->dirty = 0;
            if (!s->dirty || (!s->local && !s->published)) {
                s->dirty = 0;
                take++;
                continue;
            }
            size_t len = rec ? strlen(rec) : 0;
            if (n && bytes + len > BATCH_BYTES) {
                free(rec);
                break;
            }
            key_entry(c, ti, c->node, rank, keys[n], sizeof keys[n]);
            ops[n] = (struct etcd_op){keys[n], rec, len, !s->local};
            vals[n] = rec;
            ids[n] = id;
            bytes += len;
            n++;
            take++;
        }
        int64_t rev = 0;
        int rc = n ? etcd_txn_batch(c->ec, ops, n, c->lease, &rev) : 0;
        for (size_t i = 0; i < n; i++)
            free(vals[i]);
        if (rc) {
            STAT_ADD(c, publish_errors, 1);
            if (strstr(etcd_error(c->ec), "lease not found"))
                lease_gone(c, "a put found the lease gone");
            else
                etcd_failed(c, "put");
            return -1;
        }
        if (n)
            etcd_answered(c);
        size_t puts = 0, dels = 0;
        for (size_t i = 0; i < n; i++) {
            struct rslot *s = slot_at(c, ids[i] / c->max_ranks, ids[i] % c->max_ranks);
            if (ops[i].is_delete) {
                s->published = 0;
                dels++;
            } else {
                s->local_rev = rev;
                s->published = 1;
                puts++;
            }
            s->dirty = 0;
        }
        for (size_t i = 0; i < take; i++) {
            uint32_t id = c->dirty_q[c->ndirty - 1];
            slot_at(c, id / c->max_ranks, id % c->max_ranks)->queued = 0;
            c->ndirty--;
        }
        pthread_mutex_lock(&c->smu);
        c->st.puts += puts;
        c->st.deletes += dels;
        pthread_mutex_unlock(&c->smu);
    }
    return 0;
}

/* ---- room failures ----------------------------------------------------- */

static int adopted_has(const struct cluster *c, uint64_t room)
{
    size_t n = c->nadopted < ADOPTED_RING ? c->nadopted : ADOPTED_RING;
    for (size_t i = 0; i < n; i++)
        if (c->adopted[i] == room)
            return 1;
    return 0;
}

static void adopted_add(struct cluster *c, uint64_t room)
{
    c->adopted[c->nadopted++ % ADOPTED_RING] = room;
}

/* Take a room record of another node (or the winner of a race).  Returns
 * 1 when the record is this node's own (published earlier: nothing to
 * take), else 0. */
static int adopt_room(struct cluster *c, const char *value, size_t len)
{
    json_error_t je;
    json_t *o = json_loadb(value, len, 0, &je);
    json_t *room = json_object_get(o, "room"), *rank = json_object_get(o, "origin_rank");
    const char *reason = json_string_value(json_object_get(o, "reason"));
    const char *node = json_string_value(json_object_get(o, "node"));
    if (!json_is_integer(room) || !json_is_integer(rank) || !reason || !node ||
        !strcmp(node, c->node)) {
        int own = node && !strcmp(node, c->node);
        json_decref(o);
        return own;
    }
    int changed = 0;
    uint64_t id = (uint64_t)json_integer_value(room);
    adopted_add(c, id);
    kvc_err e =
        kvc_room_fail_adopt(c->seg, id, (uint32_t)json_integer_value(rank),
                            (int32_t)json_integer_value(json_object_get(o, "code")), reason,
                            (uint64_t)json_integer_value(json_object_get(o, "time_ns")), &changed);
    if (e != KVC_OK)
        log_event(LOG_WARN, "room_adopt_failed", "room=%" PRIu64 " origin=%s err=\"%s\"", id, node,
                  kvc_last_error());
    else if (changed) {
        STAT_ADD(c, rooms_adopted, 1);
        log_event(LOG_INFO, "room_failure_mirrored",
                  "room=%" PRIu64 " origin=%s origin_rank=%" JSON_INTEGER_FORMAT " reason=\"%s\"",
                  id, node, json_integer_value(rank), reason);
    }
    json_decref(o);
    return 0;
}

/* Queue the failures recorded since the last look (failures_seen) for
 * publishing, leaving out those recorded before not_before_ns (CLOCK_
 * REALTIME; 0: none left out) and the ones taken from other nodes. */
static void scan_failures(struct cluster *c, uint64_t not_before_ns)
{
    kvc_segment_info si;
    if (kvc_segment_stat(c->seg, &si) != KVC_OK || si.failures_total == c->failures_seen)
        return;
    uint64_t d = si.failures_total - c->failures_seen;
    if (d > KVC_FAILURE_RING)
        d = KVC_FAILURE_RING;
    kvc_failure_info *f = calloc(d, sizeof *f);
    size_t n = 0;
    if (!f || kvc_failures_recent(c->seg, f, d, &n) != KVC_OK) {
        free(f);
        return;
    }
    c->failures_seen = si.failures_total;
    for (size_t i = n; i-- > 0;) { /* oldest first */
        if (f[i].time_ns < not_before_ns || adopted_has(c, f[i].room))
            continue;
        if (c->npending >= PENDING_ROOMS_MAX) {
            log_event(LOG_WARN, "room_failure_not_published",
                      "room=%" PRIu64 " note=\"%d failures wait for etcd already\"", f[i].room,
                      PENDING_ROOMS_MAX);
            continue;
        }
        struct pending_room *p = &c->pending[c->npending++];
        p->room = f[i].room;
        p->origin_rank = f[i].origin_rank;
        p->code = f[i].code;
        p->time_ns = f[i].time_ns;
        snprintf(p->reason, sizeof p->reason, "%s", f[i].reason);
    }
    free(f);
}

/* Publish the pending failures, create-only: the first record of a room
 * wins cluster-wide; a node that loses takes the winner's record. */
static int publish_rooms(struct cluster *c)
{
    size_t done = 0;
    int rc = 0;
    for (; done < c->npending; done++) {
        struct pending_room *p = &c->pending[done];
        uint64_t now = kvc__mono_ns();
        if (!c->room_lease || now - c->room_lease_mono > 1000000000ull) {
            /* One lease per second of failures: the key outlives the room
             * TTL by at most a second. */
            if (etcd_lease_grant(c->ec, c->room_ttl_s + 1, &c->room_lease)) {
                c->room_lease = 0;
                etcd_failed(c, "room lease grant");
                rc = -1;
                break;
            }
            c->room_lease_mono = now;
        }
        json_t *o =
            json_pack("{s:I, s:I, s:i, s:s, s:I, s:s}", "room", (json_int_t)p->room, "origin_rank",
                      (json_int_t)p->origin_rank, "code", (int)p->code, "reason", p->reason,
                      "time_ns", (json_int_t)p->time_ns, "node", c->node);
        char *val = o ? json_dumps(o, JSON_COMPACT) : NULL;
        json_decref(o);
        if (!val)
            break;
        char key[200];
        snprintf(key, sizeof key, "%srooms/%" PRIu64, c->prefix, p->room);
        int created = 0;
        etcd_kv cur = {0};
        int r = etcd_put_create(c->ec, key, val, strlen(val), c->room_lease, &created, &cur, NULL);
        free(val);
        if (r) {
            if (strstr(etcd_error(c->ec), "lease not found")) {
                c->room_lease = 0;
                done--; /* again, with a new lease */
                continue;
            }
            etcd_failed(c, "room txn");
            rc = -1;
            break;
        }
        etcd_answered(c);
        if (created) {
            STAT_ADD(c, rooms_published, 1);
        } else if (!cur.value || !adopt_room(c, cur.value, cur.value_len)) {
            STAT_ADD(c, rooms_lost_race, 1);
        } /* else: this node's own record, published before a restart */
        etcd_kv_free(&cur);
    }
    memmove(c->pending, c->pending + done, (c->npending - done) * sizeof *c->pending);
    c->npending -= done;
    return rc;
}

/* ---- remote records (watch) --------------------------------------------- */

static struct node_rec *find_node(struct cluster *c, const char *name)
{
    for (size_t i = 0; i < c->nnodes; i++)
        if (!strcmp(c->nodes[i].name, name))
            return &c->nodes[i];
    return NULL;
}

static void node_put(struct cluster *c, const char *name, const etcd_kv *kv)
{
    struct node_rec *n = find_node(c, name);
    if (!n) {
        if (c->nnodes == c->cap_nodes) {
            size_t cap = c->cap_nodes ? c->cap_nodes * 2 : 16;
            struct node_rec *p = realloc(c->nodes, cap * sizeof *p);
            if (!p)
                return;
            c->nodes = p, c->cap_nodes = cap;
        }
        n = &c->nodes[c->nnodes++];
        memset(n, 0, sizeof *n);
        snprintf(n->name, sizeof n->name, "%s", name);
        n->seen_ns = kvc__now_ns();
        if (strcmp(name, c->node))
            log_event(LOG_INFO, "node_joined", "cluster=%s node=%s", c->cluster, name);
    }
    n->stale = 0;
    n->lease = kv->lease;
    json_error_t je;
    json_t *o = json_loadb(kv->value, kv->value_len, 0, &je);
    const char *url = json_string_value(json_object_get(o, "url"));
    snprintf(n->url, sizeof n->url, "%s", url ? url : "");
    n->pid = json_integer_value(json_object_get(o, "pid"));
    n->ttl = json_integer_value(json_object_get(o, "ttl"));
    n->started_ns = (uint64_t)json_integer_value(json_object_get(o, "started_ns"));
    json_decref(o);
}

static void node_delete(struct cluster *c, const char *name)
{
    struct node_rec *n = find_node(c, name);
    if (!n)
        return;
    if (strcmp(name, c->node))
        log_event(LOG_INFO, "node_left",
                  "cluster=%s node=%s note=\"its lease ended (stopped, "
                  "killed or frozen past its TTL)\"",
                  c->cluster, name);
    *n = c->nodes[--c->nnodes];
}

/* The answer of a fetch, at most limit bytes (a peer's url may answer
 * anything). */
struct fetch_buf {
    char *p;
    size_t len, cap, limit;
};

static size_t fetch_write(char *data, size_t size, size_t nmemb, void *arg)
{
    struct fetch_buf *b = arg;
    size_t n = size * nmemb;
    if (n > b->limit - b->len)
        return 0; /* too large: curl stops with CURLE_WRITE_ERROR */
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 64 * 1024;
        while (cap < b->len + n + 1)
            cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p)
            return 0;
        b->p = p, b->cap = cap;
    }
    memcpy(b->p + b->len, data, n);
    b->len += n;
    b->p[b->len] = '\0';
    return n;
}

/* Fetch a large entry's bytes from its origin kvcoordd (GET
 * /get_transfer_engine_info or /get_parallelism_config, with ?role= for a
 * role other than the default) and check them against the record's
 * digest.  Returns 0 with r->info set, else -1. */
static int fetch_info(struct cluster *c, unsigned ti, uint32_t rank, struct remote *r)
{
    if (!r->url[0])
        return -1;
    STAT_ADD(c, fetches, 1);
    char url[URL_MAX + 128], lbl[96];
    snprintf(url, sizeof url, "%s/%s?rank=%u%s%s", r->url,
             t_kind(ti) == EK_INFO ? "get_transfer_engine_info" : "get_parallelism_config", rank,
             ti % CLUSTER_ROLES ? "&role=" : "", ti % CLUSTER_ROLES ? t_role(c, ti) : "");
    /* The answer: the stored bytes, with the JSON-escaped session_id around
     * them for a transfer-engine info (at most 6 bytes per byte). */
    struct fetch_buf b = {NULL, 0, 0, c->max_info_bytes + 6 * KVC_SESSION_ID_MAX + 256};
    curl_easy_reset(c->fetch);
    curl_easy_setopt(c->fetch, CURLOPT_URL, url);
    curl_easy_setopt(c->fetch, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(c->fetch, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c->fetch, CURLOPT_TIMEOUT_MS, (long)FETCH_TIMEOUT_MS);
    curl_easy_setopt(c->fetch, CURLOPT_CONNECTTIMEOUT_MS, 1000L);
    curl_easy_setopt(c->fetch, CURLOPT_MAXFILESIZE_LARGE, (curl_off_t)b.limit);
    curl_easy_setopt(c->fetch, CURLOPT_WRITEFUNCTION, fetch_write);
    curl_easy_setopt(c->fetch, CURLOPT_WRITEDATA, &b);
    CURLcode cc = curl_easy_perform(c->fetch);
    long status = 0;
    curl_easy_getinfo(c->fetch, CURLINFO_RESPONSE_CODE, &status);
    int rc = -1;
    const char *why = "bad answer";
    const char *info = NULL;
    size_t ilen = 0;
    char sidbuf[KVC_SESSION_ID_MAX + 1] = "";
    json_t *sid = NULL;
    if (cc != CURLE_OK) {
        why = cc == CURLE_WRITE_ERROR || cc == CURLE_FILESIZE_EXCEEDED
                  ? "answer larger than this segment's max info bytes"
                  : curl_easy_strerror(cc);
    } else if (status != 200) {
        why = "not 200";
    } else if (t_kind(ti) == EK_PCFG) {
        info = b.p ? b.p : "", ilen = b.len; /* the stored object, verbatim */
    } else {
        /* {"rank":N,"remote_instance_transfer_engine_info":["<sid>",<info>]}
         * with info verbatim: take the bytes between the session_id string
         * and the closing "]}" (parsing and re-serialising would change
         * them). */
        const char *tag = "\"remote_instance_transfer_engine_info\":[";
        char *at = b.p ? strstr(b.p, tag) : NULL;
        if (at) {
            at += strlen(tag);
            json_error_t je;
            sid = json_loadb(at, b.len - (size_t)(at - b.p),
                             JSON_DECODE_ANY | JSON_DISABLE_EOF_CHECK, &je);
            char *p = at + je.position;
            if (json_is_string(sid) && json_string_length(sid) <= KVC_SESSION_ID_MAX && *p == ',' &&
                b.len >= 2 && !memcmp(b.p + b.len - 2, "]}", 2) && p + 1 <= b.p + b.len - 2) {
                snprintf(sidbuf, sizeof sidbuf, "%s", json_string_value(sid));
                info = p + 1, ilen = (size_t)(b.p + b.len - 2 - (p + 1));
            }
        }
    }
    if (info) {
        char dg[DIGEST_HEX];
        digest_of(sidbuf, info, ilen, dg);
        if (!strcmp(dg, r->digest) && !strcmp(sidbuf, r->sid)) {
            free(r->info);
            r->info = malloc(ilen + 1);
            if (r->info) {
                memcpy(r->info, info, ilen);
                r->info[ilen] = '\0';
                r->info_len = ilen;
                rc = 0;
            }
        } else {
            why = "digest mismatch (the origin changed it since: a newer record follows)";
            STAT_ADD(c, digest_mismatches, 1);
        }
    }
    json_decref(sid);
    free(b.p);
    if (rc) {
        STAT_ADD(c, fetch_failures, 1);
        log_event(LOG_WARN, "mirror_fetch_failed", "%s origin=%s url=%s err=\"%s\"",
                  entry_label(c, ti, rank, lbl, sizeof lbl), r->node, url, why);
    }
    return rc;
}

/* A peer's record, checked field by field (what etcd holds is untrusted:
 * any client of it may have written it). */
struct rec {
    uint64_t gen;
    const char *sid, *digest, *url, *info;
    size_t info_len;
};

static int is_digest(const char *s)
{
    if (strlen(s) != DIGEST_HEX - 1)
        return 0;
    for (; *s; s++)
        if (!((*s >= '0' && *s <= '9') || (*s >= 'a' && *s <= 'f')))
            return 0;
    return 1;
}

/* A string field: its value when it is a string of 1..max bytes with no
 * NUL (and, if url, an http(s) URL of printable ASCII), else NULL. */
static const char *str_field(json_t *o, const char *name, size_t max, int url)
{
    json_t *v = json_object_get(o, name);
    const char *s = json_string_value(v);
    if (!s || !json_string_length(v) || json_string_length(v) > max ||
        strlen(s) != json_string_length(v))
        return NULL;
    if (url) {
        if (strncmp(s, "http://", 7) && strncmp(s, "https://", 8))
            return NULL;
        for (const char *p = s; *p; p++)
            if (*p <= 0x20 || *p >= 0x7f)
                return NULL;
    }
    return s;
}

/* Check record o of key k (table ti) into *out; NULL when usable, else why not. */
static const char *check_record(const struct cluster *c, unsigned ti, const struct keyref *k,
                                json_t *o, struct rec *out)
{
    memset(out, 0, sizeof *out);
    if (!json_is_object(o))
        return "not a JSON object";
    const char *node = json_string_value(json_object_get(o, "node"));
    if (!node || strcmp(node, k->node))
        return "its \"node\" is not the key's node";
    json_t *rank = json_object_get(o, "rank");
    if (!json_is_integer(rank) || json_integer_value(rank) != (json_int_t)k->num)
        return "its \"rank\" is not the key's rank";
    json_t *role = json_object_get(o, "role");
    if ((ti != 0 || role) &&
        (!json_string_value(role) || strcmp(json_string_value(role), t_role(c, ti))))
        return "its \"role\" is not the key's role";
    json_t *gen = json_object_get(o, "generation");
    if (!json_is_integer(gen) || json_integer_value(gen) < 1)
        return "its \"generation\" is not a positive integer";
    out->gen = (uint64_t)json_integer_value(gen);
    out->digest = str_field(o, "digest", DIGEST_HEX - 1, 0);
    if (!out->digest || !is_digest(out->digest))
        return "its \"digest\" is not 64 lowercase hex digits";
    if (t_kind(ti) == EK_INFO) {
        out->sid = str_field(o, "session_id", KVC_SESSION_ID_MAX, 0);
        if (!out->sid)
            return "its \"session_id\" is not a string of 1..255 bytes";
    } else {
        out->sid = "";
        if (json_object_get(o, "session_id"))
            return "a parallelism config has no \"session_id\"";
    }
    json_t *bytes = json_object_get(o, "bytes");
    if (bytes && (!json_is_integer(bytes) || json_integer_value(bytes) < 0 ||
                  (uint64_t)json_integer_value(bytes) > c->max_info_bytes))
        return "its \"bytes\" is not an integer within this segment's max info bytes";
    out->url = "";
    if (json_object_get(o, "url") && !(out->url = str_field(o, "url", URL_MAX - 1, 1)))
        return "its \"url\" is not an http(s) URL of at most 255 bytes";
    json_t *info = json_object_get(o, t_kind(ti) == EK_INFO ? "info" : "config");
    if (info) {
        out->info = json_string_value(info);
        out->info_len = json_string_length(info);
        if (!out->info || out->info_len > CLUSTER_INLINE_MAX || strlen(out->info) != out->info_len)
            return t_kind(ti) == EK_INFO ? "its \"info\" is not a string of at most 256 KiB"
                                         : "its \"config\" is not a string of at most 256 KiB";
    } else if (!out->url[0]) {
        return "neither the bytes inline nor a \"url\" to fetch them from";
    }
    return NULL;
}

static void rank_delete(struct cluster *c, unsigned ti, const char *node, uint32_t rank);

/* A record of node's entry arrived (put). */
static void rank_put(struct cluster *c, unsigned ti, const struct keyref *k, const etcd_kv *kv,
                     int apply)
{
    uint32_t rank = (uint32_t)k->num;
    struct rslot *s = slot(c, ti, rank);
    if (!s)
        return;
    json_error_t je;
    json_t *o = json_loadb(kv->value, kv->value_len, 0, &je);
    if (!strcmp(k->node, c->node)) {
        /* Our own record: its revision orders it against the others (an
         * older one, overtaken by a later local change, does not count). */
        const char *dg = json_string_value(json_object_get(o, "digest"));
        s->published = 1;
        if (s->local && dg && !strcmp(dg, s->local_digest) && s->local_rev == INT64_MAX)
            s->local_rev = kv->mod_rev;
        json_decref(o);
        return;
    }
    struct rec rc;
    const char *why = check_record(c, ti, k, o, &rc);
    char d2[DIGEST_HEX];
    if (!why && rc.info) {
        digest_of(rc.sid, rc.info, rc.info_len, d2);
        if (strcmp(d2, rc.digest)) {
            STAT_ADD(c, digest_mismatches, 1);
            why = "its bytes do not match its \"digest\"";
        }
    }
    if (why) {
        /* Skipped: the key holds nothing usable now, so what it held before
         * goes (as a snapshot would see it). */
        record_skipped(c, kv->key, why);
        json_decref(o);
        rank_delete(c, ti, k->node, rank);
        return;
    }
    struct remote *r = find_remote(s, k->node, NULL);
    if (!r) {
        r = calloc(1, sizeof *r);
        if (!r) {
            json_decref(o);
            return;
        }
        snprintf(r->node, sizeof r->node, "%s", k->node);
        r->next = s->remotes;
        s->remotes = r;
    }
    r->stale = 0;
    int same = r->info && !strcmp(r->digest, rc.digest) && !strcmp(r->sid, rc.sid);
    r->mod_rev = kv->mod_rev;
    r->gen = rc.gen;
    snprintf(r->digest, sizeof r->digest, "%s", rc.digest);
    snprintf(r->sid, sizeof r->sid, "%s", rc.sid);
    snprintf(r->url, sizeof r->url, "%s", rc.url);
    if (!same) {
        free(r->info);
        r->info = NULL;
        if (rc.info && (r->info = malloc(rc.info_len + 1))) {
            memcpy(r->info, rc.info, rc.info_len + 1);
            r->info_len = rc.info_len;
        } else if (!rc.info) {
            fetch_info(c, ti, rank, r);
        }
    }
    json_decref(o);
    if (apply)
        apply_winner(c, ti, rank, NULL);
}

static void rank_delete(struct cluster *c, unsigned ti, const char *node, uint32_t rank)
{
    struct rslot *s = slot(c, ti, rank);
    if (!s)
        return;
    if (!strcmp(node, c->node)) {
        if (s->published) {
            /* Our key went without us (lease expired while we were frozen,
             * or an operator): put it back. */
            s->published = 0;
            if (s->local)
                mark_dirty(c, ti, rank, s);
        }
        return;
    }
    struct remote **link;
    struct remote *r = find_remote(s, node, &link);
    if (!r)
        return;
    *link = r->next;
    free_remote(r);
    char note[KVC_NOTE_MAX + 1];
    if (find_node(c, node))
        snprintf(note, sizeof note, "withdrawn on node %s", node);
    else
        snprintf(note, sizeof note, "node %s left the cluster (its lease ended)", node);
    apply_winner(c, ti, rank, note);
}

/* The table of an entry key, or -1 (logged: more role names than this
 * node follows, or a rank beyond its segment's). */
static int entry_table(struct cluster *c, const struct keyref *k, const char *key)
{
    if (k->num >= c->max_ranks) {
        char why[96];
        snprintf(why, sizeof why, "rank beyond this node's max ranks (%u)", c->max_ranks);
        record_skipped(c, key, why);
        return -1;
    }
    int ti = table_for(c, k->kind, k->role, !strcmp(k->node, c->node));
    if (ti < 0)
        record_skipped(c, key, "more role names in the cluster than this node follows (12)");
    return ti;
}

static void handle_events(struct cluster *c, const etcd_event *ev, size_t n)
{
    struct keyref k;
    const char *why;
    /* Nodes first: a lease's end deletes the node key and its ranks in one
     * revision, and the withdrawal notes should say the node left. */
    for (size_t i = 0; i < n; i++) {
        if (parse_key(c, ev[i].kv.key, &k, &why) != K_NODE)
            continue;
        if (ev[i].is_delete) {
            node_delete(c, k.node);
            if (!strcmp(k.node, c->node) && c->lease)
                c->next_keepalive = 0; /* is our lease gone?  ask now */
        } else {
            node_put(c, k.node, &ev[i].kv);
        }
    }
    for (size_t i = 0; i < n; i++) {
        enum key_kind kk = parse_key(c, ev[i].kv.key, &k, &why);
        int ti;
        if (kk == K_BAD && !ev[i].is_delete) {
            record_skipped(c, ev[i].kv.key, why);
        } else if (kk == K_ENTRY && ev[i].is_delete) {
            if (k.num < c->max_ranks && (ti = table_find(c, k.kind, k.role)) >= 0)
                rank_delete(c, (unsigned)ti, k.node, (uint32_t)k.num);
        } else if (kk == K_ENTRY && (ti = entry_table(c, &k, ev[i].kv.key)) >= 0) {
            rank_put(c, (unsigned)ti, &k, &ev[i].kv, 1);
        } else if (kk == K_ROOM && !ev[i].is_delete) {
            adopt_room(c, ev[i].kv.value, ev[i].kv.value_len);
        }
        pthread_mutex_lock(&c->smu);
        if (ev[i].kv.mod_rev > c->st.revision)
            c->st.revision = ev[i].kv.mod_rev;
        pthread_mutex_unlock(&c->smu);
    }
}

/* A full snapshot replaces what we knew of the others. */
static void handle_snapshot(struct cluster *c, const etcd_kv *kvs, size_t n, int64_t rev)
{
    for (size_t i = 0; i < c->nnodes; i++)
        c->nodes[i].stale = 1;
    for (unsigned ti = 0; ti < NTABLES; ti++)
        for (uint32_t r = 0; c->slots[ti] && r < c->max_ranks; r++)
            if (c->slots[ti][r])
                for (struct remote *x = c->slots[ti][r]->remotes; x; x = x->next)
                    x->stale = 1;
    struct keyref k;
    const char *why;
    int own_seen_node = 0;
    for (size_t i = 0; i < n; i++)
        if (parse_key(c, kvs[i].key, &k, &why) == K_NODE) {
            node_put(c, k.node, &kvs[i]);
            own_seen_node |= !strcmp(k.node, c->node);
        }
    for (size_t i = c->nnodes; i-- > 0;)
        if (c->nodes[i].stale)
            node_delete(c, c->nodes[i].name);
    /* Which of our own keys etcd has. */
    for (unsigned ti = 0; ti < NTABLES; ti++)
        for (uint32_t r = 0; c->slots[ti] && r < c->max_ranks; r++)
            if (c->slots[ti][r])
                c->slots[ti][r]->published = 0;
    for (size_t i = 0; i < n; i++) {
        enum key_kind kk = parse_key(c, kvs[i].key, &k, &why);
        int ti;
        if (kk == K_BAD)
            record_skipped(c, kvs[i].key, why);
        else if (kk == K_ENTRY && (ti = entry_table(c, &k, kvs[i].key)) >= 0)
            rank_put(c, (unsigned)ti, &k, &kvs[i], 0);
        else if (kk == K_ROOM)
            adopt_room(c, kvs[i].value, kvs[i].value_len);
    }
    for (unsigned ti = 0; ti < NTABLES; ti++)
        for (uint32_t r = 0; c->slots[ti] && r < c->max_ranks; r++) {
            struct rslot *s = c->slots[ti][r];
            if (!s)
                continue;
            for (struct remote **pp = &s->remotes; *pp;) {
                if ((*pp)->stale) {
                    struct remote *x = *pp;
                    *pp = x->next;
                    free_remote(x);
                } else {
                    pp = &(*pp)->next;
                }
            }
            if (s->local != s->published)
                mark_dirty(c, ti, r, s); /* etcd lost it (or never had it), or it is stale */
            if (s->remotes || s->applied == AP_REMOTE)
                apply_winner(c, ti, r, "its origin node no longer publishes it");
        }
    if (!own_seen_node && c->lease)
        c->next_keepalive = 0;
    c->have_snapshot = 1;
    c->dropped = 0;
    pthread_mutex_lock(&c->smu);
    if (rev > c->st.revision)
        c->st.revision = rev;
    pthread_mutex_unlock(&c->smu);
}

/* Drop every remote record this node holds and what it mirrored from them
 * (note: why), looking at every entry when all (else only those with
 * remote records); returns how many entries had some. */
static size_t drop_remotes(struct cluster *c, const char *note, int all)
{
    size_t n = 0;
    for (unsigned ti = 0; ti < NTABLES; ti++)
        for (uint32_t r = 0; c->slots[ti] && r < c->max_ranks; r++) {
            struct rslot *s = c->slots[ti][r];
            if (!s || (!s->remotes && !all))
                continue;
            n += s->remotes != NULL;
            while (s->remotes) {
                struct remote *x = s->remotes;
                s->remotes = x->next;
                free_remote(x);
            }
            apply_winner(c, ti, r, note);
        }
    return n;
}

/* etcd stayed away longer than the other nodes' leases: what we mirror
 * may be gone there, so it goes here too (it comes back with the next
 * snapshot). */
static void drop_unverified(struct cluster *c, uint64_t since_mono)
{
    char note[KVC_NOTE_MAX + 1];
    snprintf(note, sizeof note,
             "etcd unreachable for %" PRIu64 " s: mirror unverified past its "
             "lease TTL",
             (uint64_t)((kvc__mono_ns() - since_mono) / 1000000000ull));
    size_t n = drop_remotes(c, note, 0);
    c->dropped = 1;
    pthread_mutex_lock(&c->mu);
    c->restart_watch = 1; /* the next stream starts with a snapshot */
    pthread_mutex_unlock(&c->mu);
    STAT_ADD(c, mirror_dropped, n);
    log_event(LOG_WARN, "mirror_dropped", "cluster=%s node=%s ranks=%zu note=\"%s\"", c->cluster,
              c->node, n, note);
}

/* ---- session: lease, node key, republish ------------------------------ */

/* The "url" of a node record (a kvcoordd's nodes/<name> value) into
 * out[0..cap); 0 when it has none. */
static int node_url_of(const etcd_kv *kv, char *out, size_t cap)
{
    json_error_t je;
    json_t *o = kv->value ? json_loadb(kv->value, kv->value_len, 0, &je) : NULL;
    const char *u = json_string_value(json_object_get(o, "url"));
    if (u)
        snprintf(out, cap, "%s", u);
    json_decref(o);
    return u != NULL;
}

/* Another kvcoordd holds this node name: say so once per episode, and in
 * GET /cluster's last_error; nothing of this node is published meanwhile. */
static void name_in_use(struct cluster *c, const char *other, const etcd_kv *kv)
{
    etcd_answered(c); /* etcd is up: the name is the trouble */
    /* st.name_conflict is written only by this thread, so read unlocked. */
    int first = !c->st.name_conflict;
    pthread_mutex_lock(&c->smu);
    c->st.name_conflict = 1;
    snprintf(c->st.name_holder, sizeof c->st.name_holder, "%s", other);
    snprintf(c->st.last_error, sizeof c->st.last_error,
             "node name %.64s is in use by the kvcoordd at %.100s (lease %" PRId64
             "); waiting for its lease to end",
             c->node, other, kv->lease);
    pthread_mutex_unlock(&c->smu);
    if (first)
        log_event(LOG_ERROR, "node_name_in_use",
                  "cluster=%s node=%s url=%s other_url=%s other_lease=%" PRId64
                  " note=\"another kvcoordd runs with the same --node; nothing of this node is "
                  "published until its lease ends: give each node its own --node\"",
                  c->cluster, c->node, c->url, other, kv->lease);
}

static int start_session(struct cluster *c)
{
    int64_t lease;
    if (etcd_lease_grant(c->ec, c->ttl_s, &lease)) {
        etcd_failed(c, "lease grant");
        return -1;
    }
    char key[256];
    key_node(c, key, sizeof key);
    json_t *o = json_pack("{s:s, s:s, s:I, s:I, s:I}", "node", c->node, "url", c->url, "pid",
                          (json_int_t)getpid(), "ttl", (json_int_t)c->ttl_s, "started_ns",
                          (json_int_t)kvc__now_ns());
    char *val = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    /* Create-only: a live record of this node name with another URL is
     * another kvcoordd using the same --node, whose records this one
     * would overwrite; wait (with backoff) until its lease ends.  A record
     * with this URL is an earlier kvcoordd of this node (SIGKILLed, or
     * this one frozen past its TTL): replaced. */
    int created = 0, rc = -1, taken = 0;
    etcd_kv cur = {0};
    if (val && !(rc = etcd_put_create(c->ec, key, val, strlen(val), lease, &created, &cur, NULL)) &&
        !created) {
        char other[URL_MAX];
        taken = node_url_of(&cur, other, sizeof other) && strcmp(other, c->url);
        if (taken)
            name_in_use(c, other, &cur);
        else
            rc = etcd_put(c->ec, key, val, strlen(val), lease, NULL);
    }
    etcd_kv_free(&cur);
    free(val);
    if (taken) {
        etcd_lease_revoke(c->ec, lease);
        return -1;
    }
    if (rc) {
        etcd_failed(c, "node put");
        return -1;
    }
    if (c->st.name_conflict) { /* written only by this thread: read unlocked */
        log_event(LOG_INFO, "node_name_free", "cluster=%s node=%s url=%s", c->cluster, c->node,
                  c->url);
        pthread_mutex_lock(&c->smu);
        c->st.name_conflict = 0;
        c->st.name_holder[0] = '\0';
        c->st.last_error[0] = '\0';
        pthread_mutex_unlock(&c->smu);
    }
    /* Our keys under an earlier lease (this process frozen past its TTL,
     * or an earlier kvcoordd of this node killed moments ago), of the
     * three kinds. */
    static const char *const dirs[] = {"ranks", "roles", "parallelism"};
    etcd_kv *own[3] = {NULL, NULL, NULL};
    size_t nown[3] = {0, 0, 0};
    for (int d = 0; d < 3; d++) {
        char prefix[KEY_MAX];
        snprintf(prefix, sizeof prefix, "%s%s/%s/", c->prefix, dirs[d], c->node);
        if (etcd_range_prefix(c->ec, prefix, &own[d], &nown[d], NULL)) {
            for (int e = 0; e < d; e++)
                etcd_kvs_free(own[e], nown[e]);
            etcd_failed(c, "range own keys");
            return -1;
        }
    }
    c->lease = lease;
    for (int d = 0; d < 3; d++) {
        for (size_t i = 0; i < nown[d]; i++) {
            struct keyref k;
            const char *why;
            struct rslot *s;
            int ti;
            if (parse_key(c, own[d][i].key, &k, &why) == K_ENTRY && k.num < c->max_ranks &&
                (ti = table_for(c, k.kind, k.role, 1)) >= 0 &&
                (s = slot(c, (unsigned)ti, (uint32_t)k.num)))
                s->published = 1; /* deleted below unless local */
        }
        etcd_kvs_free(own[d], nown[d]);
    }
    uint32_t local = 0;
    for (unsigned ti = 0; ti < NTABLES; ti++)
        for (uint32_t r = 0; c->slots[ti] && r < c->max_ranks; r++) {
            struct rslot *s = c->slots[ti][r];
            if (s && (s->local || s->published)) {
                mark_dirty(c, ti, r, s);
                local += s->local;
            }
        }
    uint64_t now = kvc__mono_ns();
    c->lease_granted_mono = now;
    c->next_keepalive = now + (uint64_t)c->ttl_s * 1000000000ull / 3;
    etcd_answered(c);
    pthread_mutex_lock(&c->smu);
    c->st.sessions++;
    c->st.lease_id = lease;
    c->st.lease_granted_ns = kvc__now_ns();
    uint64_t sessions = c->st.sessions;
    pthread_mutex_unlock(&c->smu);
    log_event(LOG_INFO, "cluster_session",
              "cluster=%s node=%s lease=%" PRId64 " ttl_s=%u session=%" PRIu64 " local_ranks=%u "
              "endpoint=%s",
              c->cluster, c->node, lease, c->ttl_s, sessions, local, etcd_endpoint(c->ec));
    return 0;
}

static void session_step(struct cluster *c)
{
    uint64_t now = kvc__mono_ns();
    if (!c->lease) {
        if (now < c->retry_at)
            return;
        if (start_session(c))
            c->retry_at = now + (uint64_t)next_backoff(c) * 1000000ull;
        return;
    }
    if (now < c->next_keepalive)
        return;
    int64_t left = 0;
    if (etcd_lease_keepalive(c->ec, c->lease, &left)) {
        etcd_failed(c, "keepalive");
        c->next_keepalive = now + (uint64_t)next_backoff(c) * 1000000ull;
        return;
    }
    etcd_answered(c);
    if (left <= 0) {
        lease_gone(c, "keep-alive found the lease expired");
        if (start_session(c))
            c->retry_at = now + (uint64_t)next_backoff(c) * 1000000ull;
        return;
    }
    c->next_keepalive = now + (uint64_t)c->ttl_s * 1000000000ull / 3;
}

/* ---- figures copy --------------------------------------------------- */

static void refresh_stats(struct cluster *c)
{
    /* [0]: the rank table; [1]: other roles' infos; [2]: parallelism configs */
    uint32_t local[3] = {0, 0, 0}, mirrored[3] = {0, 0, 0}, conflicts = 0;
    struct conflict shown[CONFLICTS_SHOWN];
    size_t nshown = 0;
    for (unsigned ti = 0; ti < NTABLES; ti++)
        for (uint32_t r = 0; c->slots[ti] && r < c->max_ranks; r++) {
            struct rslot *s = c->slots[ti][r];
            if (!s)
                continue;
            int cls = ti == 0 ? 0 : t_kind(ti) == EK_INFO ? 1 : 2;
            local[cls] += s->local;
            mirrored[cls] += s->applied == AP_REMOTE;
            size_t holders = (size_t)s->local;
            for (struct remote *x = s->remotes; x; x = x->next)
                holders++;
            if (holders < 2)
                continue;
            conflicts++;
            if (nshown == CONFLICTS_SHOWN)
                continue;
            struct conflict *k = &shown[nshown++];
            k->rank = r;
            k->ti = ti;
            snprintf(k->winner, sizeof k->winner, "%s",
                     s->applied == AP_REMOTE ? s->applied_node : c->node);
            size_t at = 0;
            k->nodes[0] = '\0';
            if (s->local)
                at += (size_t)snprintf(k->nodes + at, sizeof k->nodes - at, "%s", c->node);
            for (struct remote *x = s->remotes; x && at < sizeof k->nodes; x = x->next)
                at += (size_t)snprintf(k->nodes + at, sizeof k->nodes - at, "%s%s", at ? "," : "",
                                       x->node);
        }
    pthread_mutex_lock(&c->smu);
    c->st.local_ranks = local[0];
    c->st.mirrored_ranks = mirrored[0];
    c->st.local_role_ranks = local[1];
    c->st.mirrored_role_ranks = mirrored[1];
    c->st.local_parallelism = local[2];
    c->st.mirrored_parallelism = mirrored[2];
    c->st.conflicts = conflicts;
    c->st.nodes = (uint32_t)c->nnodes;
    memcpy(c->conflicts, shown, nshown * sizeof *shown);
    c->nconflicts = nshown;
    struct node_rec *copy = c->nnodes ? malloc(c->nnodes * sizeof *copy) : NULL;
    if (copy || !c->nnodes) {
        if (copy)
            memcpy(copy, c->nodes, c->nnodes * sizeof *copy);
        free(c->nodes_copy);
        c->nodes_copy = copy;
        c->nnodes_copy = c->nnodes;
    }
    pthread_mutex_unlock(&c->smu);
}

/* ---- the cluster thread ---------------------------------------------- */

static void *cluster_main(void *arg)
{
    struct cluster *c = arg;
    scan_local(c); /* what the segment holds before any change */
    /* Failures recorded while no kvcoordd ran (workers record them
     * through the library) are published now, if their rooms can still
     * matter: those recorded less than a room TTL ago.  One this node
     * published before a restart is found in etcd as its own and left. */
    kvc_segment_info si;
    if (kvc_segment_stat(c->seg, &si) == KVC_OK) {
        c->failures_seen =
            si.failures_total > KVC_FAILURE_RING ? si.failures_total - KVC_FAILURE_RING : 0;
        uint64_t now = kvc__now_ns(), ttl = (uint64_t)si.room_ttl_ms * 1000000ull;
        scan_failures(c, now > ttl ? now - ttl : 0);
    }
    for (;;) {
        /* Sleep until something happens or the next timer (keep-alive,
         * retry, at most a second). */
        uint64_t now = kvc__mono_ns(), wake = now + 1000000000ull;
        if (c->lease && c->next_keepalive < wake)
            wake = c->next_keepalive;
        if (!c->lease && c->retry_at < wake)
            wake = c->retry_at;
        if ((c->ndirty || c->npending) && c->etcd_down_since && c->retry_at < wake)
            wake = c->retry_at;
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        if (wake > now) {
            uint64_t t = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec + (wake - now);
            ts.tv_sec = (time_t)(t / 1000000000ull);
            ts.tv_nsec = (long)(t % 1000000000ull);
        }
        pthread_mutex_lock(&c->mu);
        while (!c->stop && !c->rank_changed && !c->room_changed && !c->q_head &&
               wake > kvc__mono_ns()) {
            if (pthread_cond_timedwait(&c->cv, &c->mu, &ts) == ETIMEDOUT)
                break;
        }
        if (c->stop) {
            pthread_mutex_unlock(&c->mu);
            break;
        }
        int ranks = c->rank_changed, rooms = c->room_changed;
        c->rank_changed = c->room_changed = 0;
        struct batch *q = c->q_head;
        c->q_head = c->q_tail = NULL;
        int watch_up = c->watch_up;
        uint64_t watch_down = c->watch_down_since;
        pthread_mutex_unlock(&c->mu);

        if (ranks)
            scan_local(c);
        reap_shadowed(c);
        while (q) {
            struct batch *b = q;
            q = b->next;
            if (b->snapshot)
                handle_snapshot(c, b->kvs, b->nkv, b->rev);
            else
                handle_events(c, b->ev, b->nev);
            etcd_kvs_free(b->kvs, b->nkv);
            for (size_t i = 0; i < b->nev; i++)
                etcd_kv_free(&b->ev[i].kv);
            free(b->ev);
            free(b);
        }
        if (rooms)
            scan_failures(c, 0);
        session_step(c);
        now = kvc__mono_ns();
        if (c->lease && (!c->etcd_down_since || now >= c->retry_at)) {
            if (publish_dirty(c) || publish_rooms(c))
                c->retry_at = now + (uint64_t)next_backoff(c) * 1000000ull;
        }
        /* Large records whose fetch failed: try again. */
        for (unsigned ti = 0; ti < NTABLES; ti++)
            for (uint32_t r = 0; c->slots[ti] && r < c->max_ranks; r++) {
                struct rslot *s = c->slots[ti][r];
                if (!s)
                    continue;
                for (struct remote *x = s->remotes; x; x = x->next)
                    if (!x->info && x->url[0] && now >= c->fetch_retry_at) {
                        if (!fetch_info(c, ti, r, x))
                            apply_winner(c, ti, r, NULL);
                        else
                            c->fetch_retry_at = now + 1000000000ull;
                    }
            }
        /* Unverified mirror: since when nothing confirms it. */
        uint64_t since = c->etcd_down_since;
        if (!watch_up && watch_down && (!since || watch_down < since))
            since = watch_down;
        pthread_mutex_lock(&c->smu);
        c->st.unverified_since_ns =
            since ? kvc__now_ns() - (kvc__mono_ns() - since) : 0; /* as a wall-clock time */
        pthread_mutex_unlock(&c->smu);
        uint64_t limit = (uint64_t)c->ttl_s * 1000000000ull;
        for (size_t i = 0; i < c->nnodes; i++)
            if (c->nodes[i].ttl > 0 && (uint64_t)c->nodes[i].ttl * 1000000000ull > limit)
                limit = (uint64_t)c->nodes[i].ttl * 1000000000ull;
        /* Dropped only once the watch itself is down that long: requests
         * failing while the stream delivers (this node's own trouble) do
         * not make the others' entries doubtful. */
        if (!watch_up && watch_down && !c->dropped && kvc__mono_ns() - watch_down > limit)
            drop_unverified(c, watch_down);
        if (c->etcd_down_since && watch_up && c->watch_restarted_for != c->etcd_down_since) {
            /* Requests fail while the stream looks fine: a member cut off
             * from the quorum keeps its watchers; ask once for a fresh
             * stream, whose snapshot (a quorum read) fails over. */
            c->watch_restarted_for = c->etcd_down_since;
            pthread_mutex_lock(&c->mu);
            c->restart_watch = 1;
            pthread_mutex_unlock(&c->mu);
        }
        refresh_stats(c);
    }
    /* Stopping. */
    if (c->clean) {
        if (c->lease && etcd_lease_revoke(c->ec, c->lease) == 0)
            log_event(LOG_INFO, "cluster_left",
                      "cluster=%s node=%s lease=%" PRId64 " note=\"lease revoked: this node's "
                      "records are gone from every node\"",
                      c->cluster, c->node, c->lease);
        drop_remotes(c, "kvcoordd stopped: mirrored entries dropped", 1);
    }
    return NULL;
}

/* ---- watch thread ------------------------------------------------------- */

struct watch_arg {
    struct cluster *c;
};

static void enqueue(struct cluster *c, struct batch *b)
{
    pthread_mutex_lock(&c->mu);
    if (c->q_tail)
        c->q_tail->next = b;
    else
        c->q_head = b;
    c->q_tail = b;
    pthread_cond_signal(&c->cv);
    pthread_mutex_unlock(&c->mu);
}

static char *dupn(const char *p, size_t n)
{
    char *d = malloc(n + 1);
    if (d) {
        memcpy(d, p, n);
        d[n] = '\0';
    }
    return d;
}

static int on_watch_events(void *arg, const etcd_event *ev, size_t n, int64_t rev)
{
    struct cluster *c = arg;
    struct batch *b = calloc(1, sizeof *b);
    etcd_event *copy = calloc(n, sizeof *copy);
    if (!b || !copy) {
        free(b);
        free(copy);
        return 1; /* ends the stream: the next one starts with a snapshot */
    }
    for (size_t i = 0; i < n; i++) {
        copy[i] = ev[i];
        copy[i].kv.key = dupn(ev[i].kv.key, ev[i].kv.key_len);
        copy[i].kv.value = dupn(ev[i].kv.value, ev[i].kv.value_len);
    }
    b->ev = copy;
    b->nev = n;
    b->rev = rev;
    enqueue(c, b);
    return 0;
}

static int on_watch_idle(void *arg)
{
    struct cluster *c = arg;
    pthread_mutex_lock(&c->mu);
    int stop = c->stop || c->restart_watch;
    c->restart_watch = 0;
    pthread_mutex_unlock(&c->mu);
    return stop;
}

static void set_watch_state(struct cluster *c, int up)
{
    pthread_mutex_lock(&c->mu);
    if (up) {
        c->watch_up = 1;
        c->watch_down_since = 0;
    } else if (c->watch_up || !c->watch_down_since) {
        c->watch_up = 0;
        c->watch_down_since = kvc__mono_ns();
    }
    pthread_mutex_unlock(&c->mu);
}

/* Sleep ms unless stopped; returns non-zero when stopping. */
static int watch_sleep(struct cluster *c, uint32_t ms)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    uint64_t t = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec + ms * 1000000ull;
    ts.tv_sec = (time_t)(t / 1000000000ull);
    ts.tv_nsec = (long)(t % 1000000000ull);
    pthread_mutex_lock(&c->mu);
    while (!c->stop && pthread_cond_timedwait(&c->cv, &c->mu, &ts) != ETIMEDOUT) {
    }
    int stop = c->stop;
    pthread_mutex_unlock(&c->mu);
    return stop;
}

static void *watch_main(void *arg)
{
    struct cluster *c = arg;
    char err[256];
    etcd *w = NULL;
    if (etcd_open(&c->econf, &w, err, sizeof err)) {
        log_event(LOG_ERROR, "etcd_watch_failed", "err=\"%s\"", err);
        return NULL;
    }
    uint32_t backoff = 0;
    int logged = 0;
    for (;;) {
        pthread_mutex_lock(&c->mu);
        int stop = c->stop;
        c->restart_watch = 0;
        pthread_mutex_unlock(&c->mu);
        if (stop)
            break;
        etcd_kv *kvs;
        size_t n;
        int64_t rev;
        if (etcd_range_prefix(w, c->prefix, &kvs, &n, &rev)) {
            set_watch_state(c, 0);
            if (!logged++)
                log_event(LOG_WARN, "etcd_watch_down", "cluster=%s err=\"%s\"", c->cluster,
                          etcd_error(w));
            backoff = backoff ? (backoff * 2 > BACKOFF_MAX_MS ? BACKOFF_MAX_MS : backoff * 2)
                              : BACKOFF_MIN_MS;
            if (watch_sleep(c, backoff))
                break;
            continue;
        }
        backoff = 0;
        if (logged)
            log_event(LOG_INFO, "etcd_watch_up", "cluster=%s endpoint=%s revision=%" PRId64,
                      c->cluster, etcd_endpoint(w), rev);
        logged = 0;
        struct batch *b = calloc(1, sizeof *b);
        if (!b) {
            etcd_kvs_free(kvs, n);
            continue;
        }
        b->snapshot = 1, b->kvs = kvs, b->nkv = n, b->rev = rev;
        set_watch_state(c, 1);
        enqueue(c, b);
        int64_t last;
        if (etcd_watch(w, c->prefix, rev + 1, on_watch_events, on_watch_idle, c, &last) == 0)
            continue; /* stop, or a fresh stream asked for */
        set_watch_state(c, 0);
        log_event(LOG_WARN, "etcd_watch_down", "cluster=%s err=\"%s\"", c->cluster, etcd_error(w));
        logged = 1;
        if (watch_sleep(c, BACKOFF_MIN_MS))
            break;
    }
    etcd_close(w);
    return NULL;
}

/* ---- futex waiters ------------------------------------------------------ */

static void *rank_waiter_main(void *arg)
{
    struct cluster *c = arg;
    uint32_t seen = kvc_rank_epoch(c->seg);
    for (;;) {
        pthread_mutex_lock(&c->mu);
        int stop = c->stop;
        pthread_mutex_unlock(&c->mu);
        if (stop)
            break;
        if (kvc_rank_wait_change(c->seg, seen, WAITER_SLICE_MS) == KVC_OK) {
            seen = kvc_rank_epoch(c->seg); /* before flagging: no lost change */
            pthread_mutex_lock(&c->mu);
            c->rank_changed = 1;
            pthread_cond_signal(&c->cv);
            pthread_mutex_unlock(&c->mu);
        }
    }
    return NULL;
}

static void *room_waiter_main(void *arg)
{
    struct cluster *c = arg;
    uint32_t seen = kvc_room_epoch(c->seg);
    uint64_t failures = 0;
    kvc_segment_info si;
    if (kvc_segment_stat(c->seg, &si) == KVC_OK)
        failures = si.failures_total;
    for (;;) {
        pthread_mutex_lock(&c->mu);
        int stop = c->stop;
        pthread_mutex_unlock(&c->mu);
        if (stop)
            break;
        if (kvc_room_wait_change(c->seg, seen, WAITER_SLICE_MS) != KVC_OK)
            continue;
        seen = kvc_room_epoch(c->seg);
        /* Rooms change all the time; only a new failure record matters. */
        if (kvc_segment_stat(c->seg, &si) != KVC_OK || si.failures_total == failures)
            continue;
        failures = si.failures_total;
        pthread_mutex_lock(&c->mu);
        c->room_changed = 1;
        pthread_cond_signal(&c->cv);
        pthread_mutex_unlock(&c->mu);
    }
    return NULL;
}

/* ---- start / stop -------------------------------------------------------- */

static char *dup_opt(const char *s) { return s ? strdup(s) : NULL; }

static void free_cluster(struct cluster *c)
{
    if (!c)
        return;
    etcd_close(c->ec);
    if (c->fetch)
        curl_easy_cleanup(c->fetch);
    for (unsigned ti = 0; ti < NTABLES; ti++) {
        for (uint32_t r = 0; c->slots[ti] && r < c->max_ranks; r++) {
            struct rslot *s = c->slots[ti][r];
            if (!s)
                continue;
            while (s->remotes) {
                struct remote *x = s->remotes;
                s->remotes = x->next;
                free_remote(x);
            }
            drop_saved(s);
            free(s);
        }
        free(c->slots[ti]);
    }
    free(c->dirty_q);
    for (uint32_t i = 0; c->list && i < c->max_ranks; i++)
        kvc_rank_info_free(&c->list[i]);
    free(c->list);
    kvc_rank_info_free(&c->look);
    free(c->nodes);
    free(c->nodes_copy);
    free(c->pending);
    while (c->q_head) {
        struct batch *b = c->q_head;
        c->q_head = b->next;
        etcd_kvs_free(b->kvs, b->nkv);
        for (size_t i = 0; i < b->nev; i++)
            etcd_kv_free(&b->ev[i].kv);
        free(b->ev);
        free(b);
    }
    free(c->endpoints);
    free(c->user);
    free(c->password_file);
    free(c->cacert);
    free(c->cert);
    free(c->key);
    pthread_mutex_destroy(&c->mu);
    pthread_mutex_destroy(&c->smu);
    pthread_cond_destroy(&c->cv);
    free(c);
}

int cluster_start(const struct cluster_conf *conf, struct cluster **out, char *err, size_t cap)
{
    if (!conf->cluster || !cluster_name_ok(conf->cluster)) {
        snprintf(err, cap, "invalid cluster name '%s' (1..%d bytes of [A-Za-z0-9._-])",
                 conf->cluster ? conf->cluster : "", CLUSTER_NAME_MAX);
        return -1;
    }
    if (!conf->node || !cluster_name_ok(conf->node)) {
        snprintf(err, cap, "invalid node name '%s' (1..%d bytes of [A-Za-z0-9._-])",
                 conf->node ? conf->node : "", CLUSTER_NAME_MAX);
        return -1;
    }
    if (conf->ttl_s < 1) {
        snprintf(err, cap, "the etcd lease TTL must be at least 1 s");
        return -1;
    }
    struct cluster *c = calloc(1, sizeof *c);
    if (!c) {
        snprintf(err, cap, "out of memory");
        return -1;
    }
    pthread_mutex_init(&c->mu, NULL);
    pthread_mutex_init(&c->smu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&c->cv, &ca);
    pthread_condattr_destroy(&ca);
    snprintf(c->cluster, sizeof c->cluster, "%s", conf->cluster);
    snprintf(c->node, sizeof c->node, "%s", conf->node);
    snprintf(c->url, sizeof c->url, "%s", conf->url ? conf->url : "");
    snprintf(c->prefix, sizeof c->prefix, "/kvcoord/%s/", c->cluster);
    c->ttl_s = conf->ttl_s;
    c->seg = conf->seg;
    c->endpoints = dup_opt(conf->endpoints);
    c->user = dup_opt(conf->user);
    c->password_file = dup_opt(conf->password_file);
    c->cacert = dup_opt(conf->cacert);
    c->cert = dup_opt(conf->cert);
    c->key = dup_opt(conf->key);
    c->econf = (struct etcd_conf){.endpoints = c->endpoints,
                                  .user = c->user,
                                  .password_file = c->password_file,
                                  .cacert = c->cacert,
                                  .cert = c->cert,
                                  .key = c->key,
                                  .timeout_ms = 2000};
    kvc_segment_info si;
    if (kvc_segment_stat(c->seg, &si) != KVC_OK) {
        snprintf(err, cap, "segment: %s", kvc_last_error());
        free_cluster(c);
        return -1;
    }
    if (si.max_ranks > UINT32_MAX / NTABLES) {
        snprintf(err, cap, "the cluster view follows at most %u ranks", UINT32_MAX / NTABLES);
        free_cluster(c);
        return -1;
    }
    c->max_ranks = si.max_ranks;
    c->max_info_bytes = si.max_info_bytes;
    c->room_ttl_s = si.room_ttl_ms / 1000 ? si.room_ttl_ms / 1000 : 1;
    snprintf(c->roles[0], sizeof c->roles[0], "%s", KVC_DEFAULT_ROLE);
    c->nroles = 1;
    c->list = calloc(c->max_ranks, sizeof *c->list);
    c->pending = calloc(PENDING_ROOMS_MAX, sizeof *c->pending);
    c->fetch = curl_easy_init();
    if (!c->list || !c->pending || !c->fetch) {
        snprintf(err, cap, "out of memory for the cluster view of %u ranks", c->max_ranks);
        free_cluster(c);
        return -1;
    }
    if (etcd_open(&c->econf, &c->ec, err, cap)) {
        free_cluster(c);
        return -1;
    }
    c->st.etcd_up = 0;
    c->etcd_down_since = 0;
    if (pthread_create(&c->thread, NULL, cluster_main, c) == 0)
        c->started_thread = 1;
    if (c->started_thread && pthread_create(&c->watch_thread, NULL, watch_main, c) == 0)
        c->started_watch = 1;
    if (c->started_watch && pthread_create(&c->rank_waiter, NULL, rank_waiter_main, c) == 0)
        c->started_rank = 1;
    if (c->started_rank && pthread_create(&c->room_waiter, NULL, room_waiter_main, c) == 0)
        c->started_room = 1;
    if (!c->started_room) {
        snprintf(err, cap, "cannot start the cluster threads");
        cluster_stop(c, 0);
        return -1;
    }
    log_event(LOG_INFO, "cluster",
              "cluster=%s node=%s url=%s ttl_s=%u endpoints=%s auth=%s conflict_rule=\"newest "
              "etcd revision wins\"",
              c->cluster, c->node, c->url, c->ttl_s, c->endpoints, c->user ? "user" : "none");
    *out = c;
    return 0;
}

void cluster_stop(struct cluster *c, int clean)
{
    if (!c)
        return;
    pthread_mutex_lock(&c->mu);
    c->stop = 1;
    c->clean = clean;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    if (c->started_room)
        pthread_join(c->room_waiter, NULL);
    if (c->started_rank)
        pthread_join(c->rank_waiter, NULL);
    if (c->started_watch)
        pthread_join(c->watch_thread, NULL);
    if (c->started_thread)
        pthread_join(c->thread, NULL);
    free_cluster(c);
}

/* ---- figures out ----------------------------------------------------------- */

void cluster_get_stats(struct cluster *c, struct cluster_stats *out)
{
    pthread_mutex_lock(&c->smu);
    *out = c->st;
    pthread_mutex_unlock(&c->smu);
}

static void fam(struct buf *o, const char *name, const char *type, const char *help)
{
    buf_puts(o, "# HELP ");
    buf_puts(o, name);
    buf_puts(o, " ");
    buf_puts(o, help);
    buf_puts(o, "\n# TYPE ");
    buf_puts(o, name);
    buf_puts(o, " ");
    buf_puts(o, type);
    buf_puts(o, "\n");
}

static void val(struct buf *o, const char *name, const char *labels, uint64_t v)
{
    buf_puts(o, name);
    if (labels)
        buf_puts(o, labels);
    buf_puts(o, " ");
    buf_putu64(o, v);
    buf_puts(o, "\n");
}

static void one(struct buf *o, const char *name, const char *type, const char *help, uint64_t v)
{
    fam(o, name, type, help);
    val(o, name, NULL, v);
}

void cluster_render_metrics(struct cluster *c, struct buf *o)
{
    struct cluster_stats s;
    cluster_get_stats(c, &s);
    uint64_t now = kvc__now_ns();
    one(o, "kvcoord_cluster_node_name_conflict", "gauge",
        "1 while another kvcoordd (another URL) holds this node's --node name: nothing of this "
        "node is published.",
        (uint64_t)s.name_conflict);
    one(o, "kvcoord_cluster_etcd_up", "gauge",
        "1 when the last request to etcd succeeded (--etcd), else 0.", (uint64_t)s.etcd_up);
    one(o, "kvcoord_cluster_etcd_down_seconds", "gauge",
        "Seconds since etcd stopped answering; 0 while it answers.",
        s.etcd_down_since_ns && now > s.etcd_down_since_ns
            ? (now - s.etcd_down_since_ns) / 1000000000ull
            : 0);
    one(o, "kvcoord_cluster_etcd_errors_total", "counter", "Failed requests to etcd.",
        s.etcd_errors);
    one(o, "kvcoord_cluster_sessions_total", "counter",
        "Leases granted to this node (the first, then one per republish).", s.sessions);
    one(o, "kvcoord_cluster_lease_lost_total", "counter",
        "Leases found expired (frozen past the TTL, etcd lost them); each is followed by a "
        "republish of everything this node holds.",
        s.lease_lost);
    one(o, "kvcoord_cluster_nodes", "gauge", "Nodes with a live record, this one included.",
        s.nodes);
    one(o, "kvcoord_cluster_local_ranks", "gauge", "Ranks of the default role this node publishes.",
        s.local_ranks);
    one(o, "kvcoord_cluster_mirrored_ranks", "gauge",
        "Other nodes' ranks of the default role mirrored into this node's segment.",
        s.mirrored_ranks);
    fam(o, "kvcoord_cluster_local_entries", "gauge",
        "Entries this node publishes, by kind: the default role's ranks, ranks under other "
        "roles, parallelism configs (every role).");
    val(o, "kvcoord_cluster_local_entries", "{kind=\"ranks\"}", s.local_ranks);
    val(o, "kvcoord_cluster_local_entries", "{kind=\"role_ranks\"}", s.local_role_ranks);
    val(o, "kvcoord_cluster_local_entries", "{kind=\"parallelism_configs\"}", s.local_parallelism);
    fam(o, "kvcoord_cluster_mirrored_entries", "gauge",
        "Other nodes' entries mirrored into this node's segment, by kind (as "
        "kvcoord_cluster_local_entries).");
    val(o, "kvcoord_cluster_mirrored_entries", "{kind=\"ranks\"}", s.mirrored_ranks);
    val(o, "kvcoord_cluster_mirrored_entries", "{kind=\"role_ranks\"}", s.mirrored_role_ranks);
    val(o, "kvcoord_cluster_mirrored_entries", "{kind=\"parallelism_configs\"}",
        s.mirrored_parallelism);
    one(o, "kvcoord_cluster_records_skipped_total", "counter",
        "Records and keys read from etcd that were malformed (logged as cluster_record_skipped "
        "and not mirrored).",
        s.records_skipped);
    one(o, "kvcoord_cluster_conflicts", "gauge",
        "Entries (ranks of every role, parallelism configs) with records from several nodes "
        "(newest etcd revision wins).",
        s.conflicts);
    fam(o, "kvcoord_cluster_publish_total", "counter", "Records written to etcd, by operation.");
    val(o, "kvcoord_cluster_publish_total", "{op=\"put\"}", s.puts);
    val(o, "kvcoord_cluster_publish_total", "{op=\"delete\"}", s.deletes);
    one(o, "kvcoord_cluster_publish_errors_total", "counter", "Puts and deletes that failed.",
        s.publish_errors);
    fam(o, "kvcoord_cluster_mirror_total", "counter",
        "Mirrored entries written into or withdrawn from the segment.");
    val(o, "kvcoord_cluster_mirror_total", "{op=\"write\"}", s.mirror_writes);
    val(o, "kvcoord_cluster_mirror_total", "{op=\"withdraw\"}", s.mirror_withdrawals);
    one(o, "kvcoord_cluster_fetches_total", "counter",
        "Large rank infos fetched from their origin kvcoordd.", s.fetches);
    one(o, "kvcoord_cluster_fetch_failures_total", "counter",
        "Fetches that failed (unreachable origin, digest mismatch).", s.fetch_failures);
    one(o, "kvcoord_cluster_digest_mismatches_total", "counter",
        "Rank infos whose bytes did not match their record's digest.", s.digest_mismatches);
    fam(o, "kvcoord_cluster_room_failures_total", "counter",
        "Room failure records: published first by this node, lost the race to another node's, "
        "or taken from another node.");
    val(o, "kvcoord_cluster_room_failures_total", "{result=\"published\"}", s.rooms_published);
    val(o, "kvcoord_cluster_room_failures_total", "{result=\"lost_race\"}", s.rooms_lost_race);
    val(o, "kvcoord_cluster_room_failures_total", "{result=\"adopted\"}", s.rooms_adopted);
    one(o, "kvcoord_cluster_mirror_unverified_seconds", "gauge",
        "Seconds the mirror has gone without etcd confirming it; 0 when current.",
        s.unverified_since_ns && now > s.unverified_since_ns
            ? (now - s.unverified_since_ns) / 1000000000ull
            : 0);
    one(o, "kvcoord_cluster_mirror_dropped_total", "counter",
        "Mirrored entries dropped because etcd stayed away past the nodes' lease TTL.",
        s.mirror_dropped);
    one(o, "kvcoord_cluster_revision", "gauge", "Newest etcd revision seen.",
        s.revision > 0 ? (uint64_t)s.revision : 0);
}

void cluster_render_json(struct cluster *c, struct buf *o)
{
    struct cluster_stats s;
    pthread_mutex_lock(&c->smu);
    s = c->st;
    json_t *nodes = json_array();
    uint64_t now = kvc__now_ns();
    for (size_t i = 0; i < c->nnodes_copy; i++) {
        const struct node_rec *n = &c->nodes_copy[i];
        json_array_append_new(
            nodes,
            json_pack("{s:s, s:s, s:I, s:I, s:I, s:f, s:b}", "node", n->name, "url", n->url, "pid",
                      (json_int_t)n->pid, "ttl", (json_int_t)n->ttl, "lease", (json_int_t)n->lease,
                      "age_s",
                      n->started_ns && now > n->started_ns ? (double)(now - n->started_ns) / 1e9
                                                           : 0.0,
                      "self", !strcmp(n->name, c->node) && !strcmp(n->url, c->url)));
    }
    json_t *conf = json_array();
    for (size_t i = 0; i < c->nconflicts; i++) {
        unsigned ti = c->conflicts[i].ti;
        json_array_append_new(
            conf, json_pack("{s:I, s:s, s:s, s:s, s:s}", "rank", (json_int_t)c->conflicts[i].rank,
                            "winner", c->conflicts[i].winner, "nodes", c->conflicts[i].nodes,
                            "role", t_role(c, ti), "kind",
                            t_kind(ti) == EK_INFO ? "transfer_engine_info" : "parallelism_config"));
    }
    pthread_mutex_unlock(&c->smu);
    json_t *eps = json_array();
    char *list = strdup(c->endpoints), *save = NULL;
    for (char *t = list ? strtok_r(list, ",", &save) : NULL; t; t = strtok_r(NULL, ",", &save))
        json_array_append_new(eps, json_string(t));
    free(list);
    json_t *root = json_pack(
        "{s:s, s:s, s:s, s:I, s:s, s:{s:b, s:s, s:I, s:s, s:o, s:I}, s:{s:I, s:I, s:I, s:I}, "
        "s:{s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I}, s:o, "
        "s:o}",
        "cluster", c->cluster, "node", c->node, "url", c->url, "ttl_s", (json_int_t)c->ttl_s,
        "conflict_rule", "newest etcd revision wins", "etcd", "up", s.etcd_up, "endpoint",
        s.endpoint, "down_since_ns", (json_int_t)s.etcd_down_since_ns, "last_error", s.last_error,
        "endpoints", eps, "revision", (json_int_t)s.revision, "lease", "id", (json_int_t)s.lease_id,
        "granted_ns", (json_int_t)s.lease_granted_ns, "sessions", (json_int_t)s.sessions, "lost",
        (json_int_t)s.lease_lost, "counts", "nodes", (json_int_t)s.nodes, "local_ranks",
        (json_int_t)s.local_ranks, "mirrored_ranks", (json_int_t)s.mirrored_ranks, "conflicts",
        (json_int_t)s.conflicts, "puts", (json_int_t)s.puts, "deletes", (json_int_t)s.deletes,
        "publish_errors", (json_int_t)s.publish_errors, "mirror_writes",
        (json_int_t)s.mirror_writes, "mirror_withdrawals", (json_int_t)s.mirror_withdrawals,
        "fetches", (json_int_t)s.fetches, "fetch_failures", (json_int_t)s.fetch_failures,
        "rooms_published", (json_int_t)s.rooms_published, "rooms_lost_race",
        (json_int_t)s.rooms_lost_race, "rooms_adopted", (json_int_t)s.rooms_adopted,
        "unverified_since_ns", (json_int_t)s.unverified_since_ns, "nodes", nodes, "conflicts",
        conf);
    json_t *counts = json_object_get(root, "counts");
    json_object_set_new(counts, "local_role_ranks", json_integer(s.local_role_ranks));
    json_object_set_new(counts, "mirrored_role_ranks", json_integer(s.mirrored_role_ranks));
    json_object_set_new(counts, "local_parallelism_configs", json_integer(s.local_parallelism));
    json_object_set_new(counts, "mirrored_parallelism_configs",
                        json_integer(s.mirrored_parallelism));
    json_object_set_new(counts, "records_skipped", json_integer((json_int_t)s.records_skipped));
    /* null, or the kvcoordd holding this node's name: {"holder": URL} */
    json_object_set_new(root, "name_conflict",
                        s.name_conflict ? json_pack("{s:s}", "holder", s.name_holder)
                                        : json_null());
    char *text = root ? json_dumps(root, JSON_COMPACT) : NULL;
    json_decref(root);
    if (text)
        buf_puts(o, text);
    else
        buf_puts(o, "{}");
    free(text);
}
