/*
 * diag_pd.c - `kvcoord-diag pd`: the PD bootstrap tables (kvcoord/pd.h) that
 * kvcoordd serves as sglang's PD bootstrap server: the topology, readiness
 * and every prefill rank entry; with --etcd, every node's table as the
 * cluster view publishes it (pd/<node>, pd_record.h), read from etcd.
 */
#include <stdlib.h>
#include <string.h>

#include "diag_etcd.h"
#include "kvcoord/pd.h"
#include "pd_record.h"

static const char pd_help[] =
    "DESCRIPTION\n"
    "  Shows the PD bootstrap tables of the segment: the prefill topology (the\n"
    "  first registration's attn_tp_size, attn_cp_size, dp size and pp size, page\n"
    "  size, KV cache dtype, the prefill's HTTP port), readiness (distinct live\n"
    "  ranks registered against those expected), the number of bootstrap rooms in\n"
    "  the room -> DP rank map, and every prefill rank entry (dp group, cp, tp, pp\n"
    "  rank, rank_ip:rank_port, its registering process, live or withdrawn and\n"
    "  why, and when it last changed, CHANGED: \"registered TIME\" or \"withdrawn\n"
    "  TIME\"; the entry keeps only the time of its last change).  A decode worker's GET /route "
    "answers from these tables.  pd takes the\n"
    "  segment's PD lock (bounded by --lock-timeout).\n"
    "\n"
    "  With --etcd, also every node's table as kvcoordd --etcd publishes it in\n"
    "  etcd (/kvcoord/CLUSTER/pd/NODE; a node publishes its table while it has a\n"
    "  topology), each shown with its node: the tables a decode node's kvcoordd\n"
    "  answers GET /route from when it has none of its own.\n"
    "\n"
    "OPTIONS\n"
    "  --etcd URL[,URL...]        etcd client URLs (as kvcoordd --etcd)\n"
    "  --cluster NAME             cluster name (default kvcoord)\n"
    "  --etcd-user USER           authenticate as USER ...\n"
    "  --etcd-password-file FILE  ... with the password on FILE's first line\n"
    "  --etcd-cacert FILE, --etcd-cert FILE, --etcd-key FILE   TLS\n"
    "\n"
    "OUTPUT\n"
    "  --json: {\"schema\", \"command\": \"pd\", \"segment\", \"topology\" (null before\n"
    "  any registration, else {\"attn_tp_size\", \"attn_cp_size\", \"dp_size\",\n"
    "  \"pp_size\", \"page_size\", \"kv_cache_dtype\", \"follow_bootstrap_room\",\n"
    "  \"enable_dsa_cache_layer_split\", \"prefill_http_port\"}), \"expected\",\n"
    "  \"registered\", \"withdrawn\", \"ready\", \"rooms\", \"ranks\": [{\"dp_group\",\n"
    "  \"cp_rank\", \"tp_rank\", \"pp_rank\", \"rank_ip\", \"rank_port\", \"pid\", \"state\"\n"
    "  (live|withdrawn), \"note\", \"generation\", \"registered_ns\", \"registered_utc\" (its "
    "last\n"
    "  change: registration or withdrawal)}]}; with --etcd also \"cluster\": [{\"node\",\n"
    "  \"url\", \"topology\", \"expected\", \"registered\", \"withdrawn\", \"ready\",\n"
    "  \"ranks\" (as above), or \"error\" for a record that is not usable}].\n"
    "\n"
    "EXIT STATUS\n"
    "  0 read; 2 the segment cannot be read, or (--etcd) etcd cannot be read.\n";

static kvc_pd_rank *fetch(kvc_segment *seg, size_t *n)
{
    size_t count = 0;
    *n = 0;
    if (kvc_pd_list(seg, NULL, 0, &count) != KVC_OK)
        return NULL;
    kvc_pd_rank *p = calloc(count + 1, sizeof *p);
    if (!p || kvc_pd_list(seg, p, count + 1, &count) != KVC_OK) {
        free(p);
        return NULL;
    }
    *n = count < KVC_PD_MAX_RANKS ? count : KVC_PD_MAX_RANKS;
    return p;
}

static json_t *topology_json(const kvc_pd_status *st)
{
    if (!st->has_topology)
        return json_null();
    json_t *o = json_object();
    json_object_set_new(o, "attn_tp_size", diag_jint(st->attn_tp_size));
    json_object_set_new(o, "attn_cp_size", diag_jint(st->attn_cp_size));
    json_object_set_new(o, "dp_size", diag_jint(st->dp_size));
    json_object_set_new(o, "pp_size", diag_jint(st->pp_size));
    json_object_set_new(o, "page_size", st->has_page_size ? diag_jint(st->page_size) : json_null());
    json_object_set_new(o, "kv_cache_dtype",
                        st->has_kv_cache_dtype ? json_string(st->kv_cache_dtype) : json_null());
    json_object_set_new(o, "follow_bootstrap_room", json_boolean(st->follow_bootstrap_room));
    json_object_set_new(o, "enable_dsa_cache_layer_split",
                        json_boolean(st->enable_dsa_cache_layer_split));
    json_object_set_new(o, "prefill_http_port",
                        st->has_prefill_http_port ? diag_jint(st->prefill_http_port) : json_null());
    return o;
}

static json_t *rank_json(const kvc_pd_rank *p)
{
    json_t *o = json_object();
    json_object_set_new(o, "dp_group", diag_jint(p->dp_group));
    json_object_set_new(o, "cp_rank", diag_jint(p->cp_rank));
    json_object_set_new(o, "tp_rank", diag_jint(p->tp_rank));
    json_object_set_new(o, "pp_rank", diag_jint(p->pp_rank));
    json_object_set_new(o, "rank_ip", json_string(p->rank_ip));
    json_object_set_new(o, "rank_port", diag_jint(p->rank_port));
    json_object_set_new(o, "pid", diag_jint(p->pid));
    json_object_set_new(o, "state", json_string(p->withdrawn ? "withdrawn" : "live"));
    json_object_set_new(o, "note", json_string(p->note));
    json_object_set_new(o, "generation", diag_jint((int64_t)p->generation));
    diag_jtime(o, "registered", p->registered_ns);
    return o;
}

/* One table in text: its heading names `what` (the segment, or a node). */
static void pd_text(const char *what, const kvc_pd_status *st, const kvc_pd_rank *p, size_t n,
                    int rooms)
{
    if (!st->has_topology)
        printf("PD bootstrap table of %s: no prefill rank registered\n", what);
    else {
        char page[16] = "none", port[16] = "none";
        if (st->has_page_size)
            snprintf(page, sizeof page, "%d", (int)st->page_size);
        if (st->has_prefill_http_port)
            snprintf(port, sizeof port, "%d", (int)st->prefill_http_port);
        printf("PD bootstrap table of %s: %s, %u of %u %s registered (tp %d x cp %d x dp %d x "
               "pp %d), page size %s, kv cache dtype %s, prefill http port %s\n",
               what, st->ready ? "ready" : "NOT READY", st->registered, st->expected,
               diag_noun(st->expected, "rank", "ranks"), st->attn_tp_size, st->attn_cp_size,
               st->dp_size, st->pp_size, page, st->has_kv_cache_dtype ? st->kv_cache_dtype : "none",
               port);
    }
    if (rooms)
        printf("rooms in the room -> DP rank map: %u\n", st->rooms);
    if (!n)
        return;
    static const char *const head[] = {"DP",      "CP",  "TP",    "PP",
                                       "ADDRESS", "PID", "STATE", "CHANGED"};
    diag_table *t = diag_table_new(8, head, "rrrrlrll");
    char when[40];
    /* The entry keeps one time, that of its last change (kvc_pd_rank's
     * registered_ns): its registration, or its withdrawal once withdrawn. */
    for (size_t i = 0; i < n; i++)
        diag_table_addf(t, "%d\t%d\t%d\t%d\t%s:%d\t%d\t%s%s%s\t%s %s", (int)p[i].dp_group,
                        (int)p[i].cp_rank, (int)p[i].tp_rank, (int)p[i].pp_rank, p[i].rank_ip,
                        (int)p[i].rank_port, (int)p[i].pid, p[i].withdrawn ? "withdrawn" : "live",
                        p[i].withdrawn ? ": " : "", p[i].withdrawn ? p[i].note : "",
                        p[i].withdrawn ? "withdrawn" : "registered",
                        diag_time(p[i].registered_ns, when, sizeof when));
    diag_table_print(t, stdout, 0);
}

static json_t *table_json(const kvc_pd_status *st, const kvc_pd_rank *p, size_t n)
{
    json_t *o = json_object(), *arr = json_array();
    for (size_t i = 0; i < n; i++)
        json_array_append_new(arr, rank_json(&p[i]));
    json_object_set_new(o, "topology", topology_json(st));
    json_object_set_new(o, "expected", diag_jint(st->expected));
    json_object_set_new(o, "registered", diag_jint(st->registered));
    json_object_set_new(o, "withdrawn", diag_jint(st->withdrawn));
    json_object_set_new(o, "ready", json_boolean(st->ready));
    json_object_set_new(o, "ranks", arr);
    return o;
}

/* Every node's table in etcd: into doc's "cluster" (--json) or printed.
 * Returns an exit status. */
static int etcd_tables(diag *d, const struct diag_etcd_opts *o, json_t *doc)
{
    char prefix[200];
    etcd *c = diag_etcd_open(d, "pd", o);
    if (!c)
        return DIAG_EXIT_BROKEN;
    snprintf(prefix, sizeof prefix, "/kvcoord/%s/pd/", o->cluster);
    etcd_kv *kvs = NULL;
    size_t n = 0;
    if (etcd_range_prefix(c, prefix, &kvs, &n, NULL)) {
        fprintf(stderr, "%s pd: cannot read %s from etcd: %s\n", d->prog, prefix, etcd_error(c));
        etcd_close(c);
        return DIAG_EXIT_BROKEN;
    }
    json_t *arr = json_array();
    if (!d->json)
        printf("\nPD prefill tables in etcd (%s): %zu\n", prefix, n);
    for (size_t i = 0; i < n; i++) {
        const char *node = kvs[i].key + strlen(prefix);
        struct pd_table t;
        const char *why = pd_record_decode(node, kvs[i].value, kvs[i].value_len, &t);
        json_t *e = why ? json_object() : table_json(&t.st, t.ranks, t.n);
        json_object_set_new(e, "node", diag_jstr(node));
        json_object_set_new(e, "url", diag_jstr(why ? "" : t.url));
        if (why)
            json_object_set_new(e, "error", diag_jstr(why));
        json_array_append_new(arr, e);
        if (!d->json) {
            char what[PD_NODE_MAX + PD_URL_MAX + 16];
            snprintf(what, sizeof what, "node %s (%s)", node, why ? "?" : t.url);
            printf("\n");
            if (why)
                printf("PD bootstrap table of %s: record not usable: %s\n", what, why);
            else
                pd_text(what, &t.st, t.ranks, t.n, 0);
        }
        pd_table_free(&t);
    }
    json_object_set_new(doc, "cluster", arr);
    etcd_kvs_free(kvs, n);
    etcd_close(c);
    return DIAG_EXIT_OK;
}

static int run_pd(diag *d, int argc, char **argv)
{
    struct diag_etcd_opts o = DIAG_ETCD_OPTS_INIT;
    int rc = diag_parse_exit(
        diag_parse(d, &diag_cmd_pd, argc, argv, "", diag_etcd_longopts, diag_etcd_opt, &o));
    if (rc >= 0)
        return rc;
    if (optind < argc) {
        diag_usage_error(d, &diag_cmd_pd, "unexpected argument '%s'", argv[optind]);
        return DIAG_EXIT_USAGE;
    }
    kvc_segment *seg = diag_open(d, "pd", &rc);
    if (!seg)
        return rc;
    kvc_pd_status st;
    size_t n = 0;
    kvc_pd_rank *p = NULL;
    if (kvc_pd_status_get(seg, &st) != KVC_OK || !(p = fetch(seg, &n))) {
        fprintf(stderr, "%s pd: %s\n", d->prog, kvc_last_error());
        kvc__close_reader(seg);
        return DIAG_EXIT_BROKEN;
    }
    json_t *doc = diag_jdoc(d, "pd");
    if (d->json) {
        json_t *t = table_json(&st, p, n);
        json_object_update(doc, t);
        json_decref(t);
        json_object_set_new(doc, "rooms", diag_jint(st.rooms));
    } else {
        pd_text(d->segment, &st, p, n, 1);
    }
    free(p);
    kvc__close_reader(seg);
    rc = o.etcd ? etcd_tables(d, &o, doc) : DIAG_EXIT_OK;
    if (d->json && rc == DIAG_EXIT_OK)
        diag_jprint(doc);
    else
        json_decref(doc);
    return rc;
}

const diag_cmd diag_cmd_pd = {
    "pd",
    "PD bootstrap tables: prefill topology, readiness, prefill ranks, room map size; with --etcd "
    "every node's",
    "pd [--etcd URL[,URL...]] [--cluster NAME] [--etcd-user U --etcd-password-file F]",
    pd_help,
    run_pd,
};
