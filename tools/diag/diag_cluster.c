/*
 * diag_cluster.c - `kvcoord-diag cluster`: the cluster view (kvcoordd
 * --etcd) as this node's segment holds it (which ranks are mirrored from
 * which node), and, given etcd's endpoints, as etcd holds it: each
 * member's health, the nodes and their leases, every node's ranks (of every
 * role) and parallelism configs, and the conflicts (an entry published by
 * several nodes; the newest etcd revision wins).  Needs no kvcoordd: the
 * segment and etcd are read directly.
 */
#include <stdlib.h>
#include <string.h>

#include "diag_etcd.h"

static const char cluster_help[] =
    "DESCRIPTION\n"
    "  Shows the cluster view of kvcoordd --etcd.  From the segment: how many\n"
    "  entries are this node's own and which are mirrored from another node (with\n"
    "  the origin node and the entry's generation there): ranks of every role\n"
    "  and parallelism configs.  With --etcd: every member's health (leader,\n"
    "  revision) or why it cannot be reached; the nodes with a live record under\n"
    "  /kvcoord/CLUSTER/ (URL, pid, lease, seconds left on the lease, age); how\n"
    "  many ranks (default role), ranks under other roles and parallelism configs\n"
    "  each publishes; and the conflicts: entries published by several nodes,\n"
    "  with the winner by the rule every kvcoordd applies (the record with the\n"
    "  newest etcd revision).\n"
    "\n"
    "OPTIONS\n"
    "  --etcd URL[,URL...]        etcd client URLs (as kvcoordd --etcd); without\n"
    "                             it only the segment is read\n"
    "  --cluster NAME             cluster name (default kvcoord)\n"
    "  --etcd-user USER           authenticate as USER ...\n"
    "  --etcd-password-file FILE  ... with the password on FILE's first line\n"
    "  --etcd-cacert FILE, --etcd-cert FILE, --etcd-key FILE   TLS\n"
    "\n"
    "OUTPUT\n"
    "  --json: {\"schema\", \"command\": \"cluster\", \"segment\", \"local_ranks\",\n"
    "  \"local_role_ranks\", \"local_parallelism_configs\", \"mirrored\": [{\"rank\",\n"
    "  \"role\", \"kind\", \"origin\", \"origin_generation\", \"generation\",\n"
    "  \"session_id\"}], and with --etcd \"cluster\", \"members\": [{\"url\", \"up\",\n"
    "  \"leader\", \"revision\", \"error\"}], \"nodes\": [{\"node\", \"url\", \"pid\",\n"
    "  \"lease\", \"ttl_left\", \"ttl\", \"age_s\", \"ranks\", \"role_ranks\",\n"
    "  \"parallelism_configs\"}], \"conflicts\": [{\"rank\", \"role\", \"kind\",\n"
    "  \"winner\", \"nodes\"}]}.  kind: transfer_engine_info or parallelism_config.\n"
    "\n"
    "EXIT STATUS\n"
    "  0 everything answers and nothing conflicts; 1 a member is unreachable or\n"
    "  a rank conflicts; 2 the segment cannot be read or no member answers.\n";

static const char *const kind_name[2] = {"transfer_engine_info", "parallelism_config"};

/* The segment's part: mirrored entries (origin set) of every role and kind,
 * and the counts of local ones. */
static int segment_part(diag *d, json_t *doc, int *rc)
{
    kvc_segment *seg = diag_open(d, "cluster", rc);
    if (!seg)
        return -1;
    *rc = DIAG_EXIT_OK; /* diag_open() left its failure status */
    kvc_segment_info si;
    kvc_segment_stat(seg, &si);
    char roles[KVC_RANK_ROLES][KVC_ROLE_NAME_MAX + 1];
    size_t nroles = 0;
    kvc_rank_info *list = calloc(si.max_ranks ? si.max_ranks : 1, sizeof *list);
    kvc_err e = list ? kvc_role_names(seg, roles, KVC_RANK_ROLES, &nroles) : KVC_E_SYS;
    if (nroles > KVC_RANK_ROLES)
        nroles = KVC_RANK_ROLES;
    size_t local[3] = {0, 0, 0}; /* the rank table, other roles, parallelism configs */
    json_t *arr = json_array();
    static const char *const head[] = {"RANK",       "ROLE",       "KIND",      "ORIGIN",
                                       "ORIGIN_GEN", "GENERATION", "SESSION_ID"};
    diag_table *t = diag_table_new(7, head, "rllrrrl");
    for (size_t ri = 0; e == KVC_OK && ri < nroles; ri++)
        for (int kind = 0; e == KVC_OK && kind < 2; kind++) {
            size_t n = 0;
            e = kind ? kvc_parallelism_list(seg, roles[ri], list, si.max_ranks, &n, 0)
                     : kvc_role_list(seg, roles[ri], list, si.max_ranks, &n, 0);
            for (size_t i = 0; e == KVC_OK && i < n && i < si.max_ranks; i++) {
                const kvc_rank_info *r = &list[i];
                if (!r->origin[0]) {
                    local[kind ? 2 : ri ? 1 : 0]++;
                    continue;
                }
                json_t *o = json_object();
                json_object_set_new(o, "rank", diag_jint(r->rank));
                json_object_set_new(o, "role", diag_jstr(roles[ri]));
                json_object_set_new(o, "kind", diag_jstr(kind_name[kind]));
                json_object_set_new(o, "origin", diag_jstr(r->origin));
                json_object_set_new(o, "origin_generation",
                                    diag_jint((int64_t)r->origin_generation));
                json_object_set_new(o, "generation", diag_jint((int64_t)r->generation));
                json_object_set_new(o, "session_id", diag_jstr(r->session_id));
                json_array_append_new(arr, o);
                diag_table_addf(t, "%u\t%s\t%s\t%s\t%llu\t%llu\t%s", r->rank, roles[ri],
                                kind ? "parallelism" : "info", r->origin,
                                (unsigned long long)r->origin_generation,
                                (unsigned long long)r->generation, r->session_id);
            }
        }
    if (e != KVC_OK) {
        fprintf(stderr, "%s cluster: %s\n", d->prog, list ? kvc_last_error() : "out of memory");
        free(list);
        json_decref(arr);
        diag_table_free(t);
        kvc__close_reader(seg);
        *rc = DIAG_EXIT_BROKEN;
        return -1;
    }
    if (d->json) {
        json_object_set_new(doc, "local_ranks", diag_jint((int64_t)local[0]));
        json_object_set_new(doc, "local_role_ranks", diag_jint((int64_t)local[1]));
        json_object_set_new(doc, "local_parallelism_configs", diag_jint((int64_t)local[2]));
        json_object_set_new(doc, "mirrored", arr);
        diag_table_free(t);
    } else {
        size_t m = json_array_size(arr);
        printf("segment %s: %zu local %s, %zu under other roles, %zu parallelism %s; "
               "%zu %s mirrored from other nodes\n",
               d->segment, local[0], diag_noun(local[0], "rank", "ranks"), local[1], local[2],
               diag_noun(local[2], "config", "configs"), m, diag_noun(m, "entry", "entries"));
        if (json_array_size(arr))
            diag_table_print(t, stdout, 2);
        else
            diag_table_free(t);
        json_decref(arr);
    }
    free(list);
    kvc__close_reader(seg);
    return 0;
}

/* A node's record of an entry: ranks/<node>/<rank> (kind 0, role target),
 * roles/<node>/<role>/<rank> (kind 0), parallelism/<node>/<role>/<rank>
 * (kind 1). */
struct rank_rec {
    uint32_t rank;
    int kind;
    char role[KVC_ROLE_NAME_MAX + 1];
    char node[64];
    int64_t rev;
};

static int by_rank_rev(const void *a, const void *b)
{
    const struct rank_rec *x = a, *y = b;
    if (x->kind != y->kind)
        return x->kind - y->kind;
    int r = strcmp(x->role, y->role);
    if (r)
        return r;
    if (x->rank != y->rank)
        return x->rank < y->rank ? -1 : 1;
    return x->rev > y->rev ? -1 : x->rev < y->rev; /* newest first */
}

static int same_entry(const struct rank_rec *x, const struct rank_rec *y)
{
    return x->rank == y->rank && x->kind == y->kind && !strcmp(x->role, y->role);
}

/* Copy the segment at *p up to '/' (or the end when last) into out[0..cap);
 * 0 when it is there, non-empty and fits. */
static int key_part(const char **p, char *out, size_t cap, int last)
{
    const char *end = last ? *p + strlen(*p) : strchr(*p, '/');
    if (!end || end == *p || (size_t)(end - *p) >= cap)
        return -1;
    memcpy(out, *p, (size_t)(end - *p));
    out[end - *p] = '\0';
    *p = last ? end : end + 1;
    return 0;
}

/* Parse an entry key (k: after the prefix) into *r; 0 when it is one. */
static int parse_entry_key(const char *k, struct rank_rec *r)
{
    char num[16];
    int with_role = 1;
    if (!strncmp(k, "ranks/", 6))
        k += 6, r->kind = 0, with_role = 0;
    else if (!strncmp(k, "roles/", 6))
        k += 6, r->kind = 0;
    else if (!strncmp(k, "parallelism/", 12))
        k += 12, r->kind = 1;
    else
        return -1;
    snprintf(r->role, sizeof r->role, "%s", KVC_DEFAULT_ROLE);
    if (key_part(&k, r->node, sizeof r->node, 0) ||
        (with_role && key_part(&k, r->role, sizeof r->role, 0)) || key_part(&k, num, sizeof num, 1))
        return -1;
    char *end;
    unsigned long v = strtoul(num, &end, 10);
    if (*end || num[0] < '0' || num[0] > '9' || v > UINT32_MAX)
        return -1;
    r->rank = (uint32_t)v;
    return 0;
}

/* No node under /kvcoord/<cluster>/: name the clusters that have nodes, so
 * a wrong (or default) --cluster is seen at once. */
static void hint_clusters(etcd *c, const char *cluster)
{
    etcd_kv *kvs = NULL;
    size_t n = 0;
    int64_t rev;
    char seen[1024] = "", last[200] = "";
    size_t at = 0, count = 0;
    if (etcd_range_prefix(c, "/kvcoord/", &kvs, &n, &rev) == 0)
        for (size_t i = 0; i < n && at < sizeof seen; i++) { /* keys come sorted */
            const char *name = kvs[i].key + 9, *slash = strchr(name, '/');
            if (!slash || slash == name || strncmp(slash, "/nodes/", 7) ||
                (size_t)(slash - name) >= sizeof last)
                continue;
            char item[sizeof last];
            snprintf(item, sizeof item, "%.*s", (int)(slash - name), name);
            if (!strcmp(item, last) || !strcmp(item, cluster))
                continue;
            snprintf(last, sizeof last, "%s", item);
            at += (size_t)snprintf(seen + at, sizeof seen - at, "%s%s", count ? ", " : "", item);
            count++;
        }
    etcd_kvs_free(kvs, n);
    if (count)
        printf("no node in cluster '%s'; pass --cluster NAME (clusters with nodes: %s)\n", cluster,
               seen);
    else
        printf("no node in cluster '%s', nor in any other cluster under /kvcoord/ (is kvcoordd "
               "started with --etcd, and with --cluster NAME? then pass --cluster NAME)\n",
               cluster);
}

/* etcd's part.  Returns the worst exit status found. */
static int etcd_part(diag *d, const struct diag_etcd_opts *o, json_t *doc)
{
    etcd *c = diag_etcd_open(d, "cluster", o);
    if (!c)
        return DIAG_EXIT_BROKEN;
    int rc = DIAG_EXIT_OK;
    size_t up = 0;
    json_t *members = json_array();
    static const char *const mh[] = {"MEMBER", "STATE", "LEADER", "REVISION"};
    diag_table *mt = diag_table_new(4, mh, "lllr"); /* a leader is an id, not a count */
    for (size_t i = 0; i < etcd_endpoint_count(c); i++) {
        const char *url = etcd_endpoint_at(c, i);
        uint64_t leader = 0;
        int64_t rev = 0;
        int ok = etcd_member_status(c, url, &leader, &rev) == 0;
        up += ok;
        json_t *m = json_object();
        json_object_set_new(m, "url", diag_jstr(url));
        json_object_set_new(m, "up", json_boolean(ok));
        json_object_set_new(m, "leader", diag_jint((int64_t)leader));
        json_object_set_new(m, "revision", diag_jint(rev));
        json_object_set_new(m, "error", diag_jstr(ok ? "" : etcd_error(c)));
        json_array_append_new(members, m);
        if (ok)
            diag_table_addf(mt, "%s\t%s\t%llx\t%lld", url, leader ? "up" : "up, no leader",
                            (unsigned long long)leader, (long long)rev);
        else
            diag_table_addf(mt, "%s\tunreachable: %s\t-\t-", url, etcd_error(c));
        if (!ok || !leader)
            rc = DIAG_EXIT_DEGRADED;
    }
    char prefix[200];
    snprintf(prefix, sizeof prefix, "/kvcoord/%s/", o->cluster);
    etcd_kv *kvs = NULL;
    size_t n = 0;
    int64_t rev = 0;
    int ranged = up && etcd_range_prefix(c, prefix, &kvs, &n, &rev) == 0;
    if (!up || !ranged)
        rc = DIAG_EXIT_BROKEN;
    /* Nodes, then every rank record. */
    json_t *nodes = json_array();
    struct rank_rec *recs = calloc(n ? n : 1, sizeof *recs);
    size_t nrecs = 0;
    size_t plen = strlen(prefix);
    for (size_t i = 0; ranged && recs && i < n; i++) {
        if (!parse_entry_key(kvs[i].key + plen, &recs[nrecs])) {
            recs[nrecs].rev = kvs[i].mod_rev;
            nrecs++;
        }
    }
    static const char *const nh[] = {"NODE", "URL",   "PID",        "LEASE", "TTL_LEFT",
                                     "AGE",  "RANKS", "ROLE_RANKS", "PCFGS"};
    diag_table *nt = diag_table_new(9, nh, "llrrrrrrr");
    for (size_t i = 0; ranged && i < n; i++) {
        const char *k = kvs[i].key + plen;
        if (strncmp(k, "nodes/", 6))
            continue;
        json_error_t je;
        json_t *v = json_loadb(kvs[i].value, kvs[i].value_len, 0, &je);
        int64_t left = -1, granted = 0;
        etcd_lease_ttl(c, kvs[i].lease, &left, &granted);
        size_t ranks = 0, role_ranks = 0, pcfgs = 0;
        for (size_t j = 0; j < nrecs; j++)
            if (!strcmp(recs[j].node, k + 6)) {
                if (recs[j].kind)
                    pcfgs++;
                else if (strcmp(recs[j].role, KVC_DEFAULT_ROLE))
                    role_ranks++;
                else
                    ranks++;
            }
        uint64_t started = (uint64_t)json_integer_value(json_object_get(v, "started_ns"));
        char age[32];
        const char *url = json_string_value(json_object_get(v, "url"));
        json_t *no = json_object();
        json_object_set_new(no, "node", diag_jstr(k + 6));
        json_object_set_new(no, "url", diag_jstr(url ? url : ""));
        json_object_set_new(no, "pid", diag_jint(json_integer_value(json_object_get(v, "pid"))));
        json_object_set_new(no, "lease", diag_jint(kvs[i].lease));
        json_object_set_new(no, "ttl_left", diag_jint(left));
        json_object_set_new(no, "ttl", diag_jint(granted));
        json_object_set_new(no, "age_s",
                            json_real(started && diag_now_ns() > started
                                          ? (double)(diag_now_ns() - started) / 1e9
                                          : 0.0));
        json_object_set_new(no, "ranks", diag_jint((int64_t)ranks));
        json_object_set_new(no, "role_ranks", diag_jint((int64_t)role_ranks));
        json_object_set_new(no, "parallelism_configs", diag_jint((int64_t)pcfgs));
        json_array_append_new(nodes, no);
        diag_table_addf(nt, "%s\t%s\t%lld\t%llx\t%lld/%lld s\t%s\t%zu\t%zu\t%zu", k + 6,
                        url ? url : "", (long long)json_integer_value(json_object_get(v, "pid")),
                        (unsigned long long)kvs[i].lease, (long long)left, (long long)granted,
                        diag_age(started, age, sizeof age), ranks, role_ranks, pcfgs);
        json_decref(v);
    }
    qsort(recs, nrecs, sizeof *recs, by_rank_rev);
    json_t *conflicts = json_array();
    static const char *const ch[] = {"RANK", "ROLE", "KIND", "WINNER", "NODES"};
    diag_table *ct = diag_table_new(5, ch, "rllll");
    for (size_t i = 0; i < nrecs;) {
        size_t j = i + 1;
        while (j < nrecs && same_entry(&recs[j], &recs[i]))
            j++;
        if (j - i > 1) {
            char list[512] = "";
            size_t at = 0;
            for (size_t k = i; k < j && at < sizeof list; k++)
                at += (size_t)snprintf(list + at, sizeof list - at, "%s%s", k > i ? "," : "",
                                       recs[k].node);
            json_t *co = json_object();
            json_object_set_new(co, "rank", diag_jint(recs[i].rank));
            json_object_set_new(co, "role", diag_jstr(recs[i].role));
            json_object_set_new(co, "kind", diag_jstr(kind_name[recs[i].kind]));
            json_object_set_new(co, "winner", diag_jstr(recs[i].node));
            json_object_set_new(co, "nodes", diag_jstr(list));
            json_array_append_new(conflicts, co);
            diag_table_addf(ct, "%u\t%s\t%s\t%s\t%s", recs[i].rank, recs[i].role,
                            recs[i].kind ? "parallelism" : "info", recs[i].node, list);
            if (rc == DIAG_EXIT_OK)
                rc = DIAG_EXIT_DEGRADED;
        }
        i = j;
    }
    if (d->json) {
        json_object_set_new(doc, "cluster", diag_jstr(o->cluster));
        json_object_set_new(doc, "revision", diag_jint(rev));
        json_object_set_new(doc, "members", members);
        json_object_set_new(doc, "nodes", nodes);
        json_object_set_new(doc, "conflicts", conflicts);
        diag_table_free(mt);
        diag_table_free(nt);
        diag_table_free(ct);
    } else {
        printf("\netcd members (%zu of %zu up)\n", up, etcd_endpoint_count(c));
        diag_table_print(mt, stdout, 2);
        size_t nn = json_array_size(nodes);
        printf("\ncluster %s: %zu %s, %zu entry %s (revision %lld)\n", o->cluster, nn,
               diag_noun(nn, "node", "nodes"), nrecs, diag_noun(nrecs, "record", "records"),
               (long long)rev);
        if (json_array_size(nodes))
            diag_table_print(nt, stdout, 2);
        else
            diag_table_free(nt);
        if (ranged && !json_array_size(nodes))
            hint_clusters(c, o->cluster);
        printf("\nconflicts (newest etcd revision wins): %zu\n", json_array_size(conflicts));
        if (json_array_size(conflicts))
            diag_table_print(ct, stdout, 2);
        else
            diag_table_free(ct);
        if (!ranged && up)
            printf("cannot read %s: %s\n", prefix, etcd_error(c));
        json_decref(members);
        json_decref(nodes);
        json_decref(conflicts);
    }
    free(recs);
    etcd_kvs_free(kvs, n);
    etcd_close(c);
    return rc;
}

static int run_cluster(diag *d, int argc, char **argv)
{
    struct diag_etcd_opts o = DIAG_ETCD_OPTS_INIT;
    int rc = diag_parse_exit(
        diag_parse(d, &diag_cmd_cluster, argc, argv, "", diag_etcd_longopts, diag_etcd_opt, &o));
    if (rc >= 0)
        return rc;
    if (optind < argc) {
        diag_usage_error(d, &diag_cmd_cluster, "unexpected argument '%s'", argv[optind]);
        return DIAG_EXIT_USAGE;
    }
    json_t *doc = diag_jdoc(d, "cluster");
    rc = DIAG_EXIT_OK;
    if (segment_part(d, doc, &rc)) {
        json_decref(doc);
        return rc;
    }
    if (o.etcd)
        rc = etcd_part(d, &o, doc);
    if (d->json)
        diag_jprint(doc);
    else
        json_decref(doc);
    return rc;
}

const diag_cmd diag_cmd_cluster = {
    "cluster",
    "the cluster view (kvcoordd --etcd): mirrored ranks; with --etcd: members, nodes, conflicts",
    "cluster [--etcd URL[,URL...]] [--cluster NAME] [--etcd-user U --etcd-password-file F]",
    cluster_help,
    run_cluster,
};
