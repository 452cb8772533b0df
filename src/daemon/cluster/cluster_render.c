/*
 * cluster_render.c - the cluster view's figures: the copy the cluster thread
 * makes for readers (counts, conflicts, nodes), and what the io_uring loop
 * reads from it under smu: cluster_get_stats, the kvcoord_cluster_* families
 * of /metrics and GET /cluster's JSON.
 */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "cluster_internal.h"

/* ---- figures copy -------------------------------------------------------- */

void cluster__refresh_stats(struct cluster *c)
{
    /* [0]: the rank table; [1]: other roles' infos; [2]: parallelism configs */
    uint32_t local[3] = {0, 0, 0}, mirrored[3] = {0, 0, 0}, conflicts = 0;
    struct conflict shown[CONFLICTS_SHOWN];
    size_t nshown = 0;
    for (unsigned ti = 0; ti < NTABLES; ti++)
        for (uint32_t r = 0; c->tab.slots[ti] && r < c->cfg.max_ranks; r++) {
            struct rslot *s = c->tab.slots[ti][r];
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
                     s->applied == AP_REMOTE ? s->applied_node : c->cfg.node);
            size_t at = 0;
            k->nodes[0] = '\0';
            if (s->local)
                at += (size_t)snprintf(k->nodes + at, sizeof k->nodes - at, "%s", c->cfg.node);
            for (struct remote *x = s->remotes; x && at < sizeof k->nodes; x = x->next)
                at += (size_t)snprintf(k->nodes + at, sizeof k->nodes - at, "%s%s", at ? "," : "",
                                       x->node);
        }
    pthread_mutex_lock(&c->fig.mu);
    c->fig.st.local_ranks = local[0];
    c->fig.st.mirrored_ranks = mirrored[0];
    c->fig.st.local_role_ranks = local[1];
    c->fig.st.mirrored_role_ranks = mirrored[1];
    c->fig.st.local_parallelism = local[2];
    c->fig.st.mirrored_parallelism = mirrored[2];
    c->fig.st.conflicts = conflicts;
    c->fig.st.nodes = (uint32_t)c->peers.nnodes;
    memcpy(c->fig.conflicts, shown, nshown * sizeof *shown);
    c->fig.nconflicts = nshown;
    struct node_rec *copy = c->peers.nnodes ? malloc(c->peers.nnodes * sizeof *copy) : NULL;
    if (copy || !c->peers.nnodes) {
        if (copy)
            memcpy(copy, c->peers.nodes, c->peers.nnodes * sizeof *copy);
        free(c->fig.nodes_copy);
        c->fig.nodes_copy = copy;
        c->fig.nnodes_copy = c->peers.nnodes;
    }
    pthread_mutex_unlock(&c->fig.mu);
}

/* ---- figures out --------------------------------------------------------- */

void cluster_get_stats(struct cluster *c, struct cluster_stats *out)
{
    pthread_mutex_lock(&c->fig.mu);
    *out = c->fig.st;
    pthread_mutex_unlock(&c->fig.mu);
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
    fam(o, "kvcoord_cluster_room_pushes_total", "counter",
        "Room failures of this node pushed to the nodes that follow the room (answered 200, or "
        "not), and peers' pushes received here (taken: the room had no failure record yet).");
    val(o, "kvcoord_cluster_room_pushes_total", "{result=\"sent\"}", s.pushes);
    val(o, "kvcoord_cluster_room_pushes_total", "{result=\"failed\"}", s.push_failures);
    val(o, "kvcoord_cluster_room_pushes_total", "{result=\"received\"}", s.pushes_received);
    val(o, "kvcoord_cluster_room_pushes_total", "{result=\"taken\"}", s.pushes_taken);
    one(o, "kvcoord_cluster_rooms_followed", "gauge",
        "Rooms a rank of this node follows, published for the other nodes.", s.rooms_followed);
    one(o, "kvcoord_cluster_rooms_shared", "gauge",
        "(room, node) pairs: rooms other nodes follow, as this node knows them.", s.rooms_shared);
    one(o, "kvcoord_cluster_rooms_failed_node_left_total", "counter",
        "Rooms of this node failed because another node that followed them left the cluster.",
        s.rooms_failed_node_left);
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
    size_t tables = 0, live = 0;
    pd_mirror_counts(c->pd.mirror, &tables, &live);
    one(o, "kvcoord_cluster_pd_published", "gauge",
        "1 while etcd holds this node's PD prefill table (it has a topology), else 0.",
        (uint64_t)s.pd_published);
    one(o, "kvcoord_cluster_pd_mirrored_tables", "gauge",
        "Other nodes' PD prefill tables mirrored (GET /route answers from them).", tables);
    one(o, "kvcoord_cluster_pd_mirrored_ranks", "gauge",
        "Live prefill rank entries in the mirrored PD prefill tables.", live);
}

void cluster_render_json(struct cluster *c, struct buf *o)
{
    struct cluster_stats s;
    pthread_mutex_lock(&c->fig.mu);
    s = c->fig.st;
    json_t *nodes = json_array();
    uint64_t now = kvc__now_ns();
    for (size_t i = 0; i < c->fig.nnodes_copy; i++) {
        const struct node_rec *n = &c->fig.nodes_copy[i];
        json_array_append_new(
            nodes,
            json_pack("{s:s, s:s, s:I, s:I, s:I, s:f, s:b}", "node", n->name, "url", n->url, "pid",
                      (json_int_t)n->pid, "ttl", (json_int_t)n->ttl, "lease", (json_int_t)n->lease,
                      "age_s",
                      n->started_ns && now > n->started_ns ? (double)(now - n->started_ns) / 1e9
                                                           : 0.0,
                      "self", !strcmp(n->name, c->cfg.node) && !strcmp(n->url, c->cfg.url)));
    }
    json_t *conf = json_array();
    for (size_t i = 0; i < c->fig.nconflicts; i++) {
        unsigned ti = c->fig.conflicts[i].ti;
        json_array_append_new(
            conf,
            json_pack("{s:I, s:s, s:s, s:s, s:s}", "rank", (json_int_t)c->fig.conflicts[i].rank,
                      "winner", c->fig.conflicts[i].winner, "nodes", c->fig.conflicts[i].nodes,
                      "role", t_role(c, ti), "kind",
                      t_kind(ti) == EK_INFO ? "transfer_engine_info" : "parallelism_config"));
    }
    pthread_mutex_unlock(&c->fig.mu);
    json_t *eps = json_array();
    char *list = strdup(c->cfg.endpoints), *save = NULL;
    for (char *t = list ? strtok_r(list, ",", &save) : NULL; t; t = strtok_r(NULL, ",", &save))
        json_array_append_new(eps, json_string(t));
    free(list);
    json_t *root = json_pack(
        "{s:s, s:s, s:s, s:I, s:s, s:{s:b, s:s, s:I, s:s, s:o, s:I}, s:{s:I, s:I, s:I, s:I}, "
        "s:{s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I}, s:o, "
        "s:o}",
        "cluster", c->cfg.cluster, "node", c->cfg.node, "url", c->cfg.url, "ttl_s",
        (json_int_t)c->cfg.ttl_s, "conflict_rule", "newest etcd revision wins", "etcd", "up",
        s.etcd_up, "endpoint", s.endpoint, "down_since_ns", (json_int_t)s.etcd_down_since_ns,
        "last_error", s.last_error, "endpoints", eps, "revision", (json_int_t)s.revision, "lease",
        "id", (json_int_t)s.lease_id, "granted_ns", (json_int_t)s.lease_granted_ns, "sessions",
        (json_int_t)s.sessions, "lost", (json_int_t)s.lease_lost, "counts", "nodes",
        (json_int_t)s.nodes, "local_ranks", (json_int_t)s.local_ranks, "mirrored_ranks",
        (json_int_t)s.mirrored_ranks, "conflicts", (json_int_t)s.conflicts, "puts",
        (json_int_t)s.puts, "deletes", (json_int_t)s.deletes, "publish_errors",
        (json_int_t)s.publish_errors, "mirror_writes", (json_int_t)s.mirror_writes,
        "mirror_withdrawals", (json_int_t)s.mirror_withdrawals, "fetches", (json_int_t)s.fetches,
        "fetch_failures", (json_int_t)s.fetch_failures, "rooms_published",
        (json_int_t)s.rooms_published, "rooms_lost_race", (json_int_t)s.rooms_lost_race,
        "rooms_adopted", (json_int_t)s.rooms_adopted, "unverified_since_ns",
        (json_int_t)s.unverified_since_ns, "nodes", nodes, "conflicts", conf);
    /* The watch: its member, and when it last knew itself current (an
     * event, a progress notification, a probe answered, a snapshot). */
    json_object_set_new(root, "watch",
                        json_pack("{s:b, s:s, s:I, s:I}", "up", s.watch_up, "endpoint",
                                  s.watch_endpoint, "confirmed_ns", (json_int_t)s.confirmed_ns,
                                  "unconfirmed_episodes", (json_int_t)s.unconfirmed_episodes));
    json_t *counts = json_object_get(root, "counts");
    json_object_set_new(counts, "local_role_ranks", json_integer(s.local_role_ranks));
    json_object_set_new(counts, "room_pushes_sent", json_integer((json_int_t)s.pushes));
    json_object_set_new(counts, "room_pushes_failed", json_integer((json_int_t)s.push_failures));
    json_object_set_new(counts, "room_pushes_received",
                        json_integer((json_int_t)s.pushes_received));
    json_object_set_new(counts, "room_pushes_taken", json_integer((json_int_t)s.pushes_taken));
    json_object_set_new(counts, "mirrored_role_ranks", json_integer(s.mirrored_role_ranks));
    json_object_set_new(counts, "local_parallelism_configs", json_integer(s.local_parallelism));
    json_object_set_new(counts, "mirrored_parallelism_configs",
                        json_integer(s.mirrored_parallelism));
    json_object_set_new(counts, "records_skipped", json_integer((json_int_t)s.records_skipped));
    /* Rooms across nodes: followed here, followed by others, failed when
     * a node that followed them left. */
    json_object_set_new(counts, "rooms_followed", json_integer(s.rooms_followed));
    json_object_set_new(counts, "rooms_shared", json_integer(s.rooms_shared));
    json_object_set_new(counts, "rooms_failed_node_left",
                        json_integer((json_int_t)s.rooms_failed_node_left));
    /* The PD prefill tables: this node's published or not, the others'. */
    json_t *pd = pd_mirror_json(c->pd.mirror);
    json_object_set_new(
        root, "pd",
        json_pack("{s:b, s:o}", "published", s.pd_published, "mirrored", pd ? pd : json_array()));
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
