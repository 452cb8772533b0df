/*
 * diag_pd.c - `kvcoord-diag pd`: the PD bootstrap tables (kvcoord/pd.h) that
 * kvcoordd serves as sglang's PD bootstrap server: the topology, readiness
 * and every prefill rank entry.
 */
#include <stdlib.h>

#include "diag.h"
#include "kvcoord/pd.h"

static const char pd_help[] =
    "DESCRIPTION\n"
    "  Shows the PD bootstrap tables of the segment: the prefill topology (the\n"
    "  first registration's attn_tp_size, attn_cp_size, dp size and pp size, page\n"
    "  size, KV cache dtype, the prefill's HTTP port), readiness (distinct live\n"
    "  ranks registered against those expected), the number of bootstrap rooms in\n"
    "  the room -> DP rank map, and every prefill rank entry (dp group, cp, tp, pp\n"
    "  rank, rank_ip:rank_port, its registering process, live or withdrawn and\n"
    "  why, and when it last changed: registered or withdrawn).  A decode worker's GET /route "
    "answers from these tables.  pd takes the\n"
    "  segment's PD lock (bounded by --lock-timeout).\n"
    "\n"
    "OPTIONS\n"
    "  The global options only.\n"
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
    "  change: registration or withdrawal)}]}.\n";

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

static void pd_text(const diag *d, const kvc_pd_status *st, const kvc_pd_rank *p, size_t n)
{
    if (!st->has_topology)
        printf("PD bootstrap table of %s: no prefill rank registered\n", d->segment);
    else {
        char page[16] = "none", port[16] = "none";
        if (st->has_page_size)
            snprintf(page, sizeof page, "%d", (int)st->page_size);
        if (st->has_prefill_http_port)
            snprintf(port, sizeof port, "%d", (int)st->prefill_http_port);
        printf("PD bootstrap table of %s: %s, %u of %u ranks registered (tp %d x cp %d x dp %d x "
               "pp %d), page size %s, kv cache dtype %s, prefill http port %s\n",
               d->segment, st->ready ? "ready" : "NOT READY", st->registered, st->expected,
               st->attn_tp_size, st->attn_cp_size, st->dp_size, st->pp_size, page,
               st->has_kv_cache_dtype ? st->kv_cache_dtype : "none", port);
    }
    printf("rooms in the room -> DP rank map: %u\n", st->rooms);
    if (!n)
        return;
    static const char *const head[] = {"DP",      "CP",  "TP",    "PP",
                                       "ADDRESS", "PID", "STATE", "REGISTERED"};
    diag_table *t = diag_table_new(8, head, "rrrrlrll");
    char when[40];
    for (size_t i = 0; i < n; i++)
        diag_table_addf(t, "%d\t%d\t%d\t%d\t%s:%d\t%d\t%s%s%s\t%s", (int)p[i].dp_group,
                        (int)p[i].cp_rank, (int)p[i].tp_rank, (int)p[i].pp_rank, p[i].rank_ip,
                        (int)p[i].rank_port, (int)p[i].pid, p[i].withdrawn ? "withdrawn" : "live",
                        p[i].withdrawn ? ": " : "", p[i].withdrawn ? p[i].note : "",
                        diag_time(p[i].registered_ns, when, sizeof when));
    diag_table_print(t, stdout, 0);
}

static int run_pd(diag *d, int argc, char **argv)
{
    int rc = diag_parse_exit(diag_parse(d, &diag_cmd_pd, argc, argv, "", NULL, NULL, NULL));
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
    if (d->json) {
        json_t *doc = diag_jdoc(d, "pd"), *arr = json_array();
        for (size_t i = 0; i < n; i++)
            json_array_append_new(arr, rank_json(&p[i]));
        json_object_set_new(doc, "topology", topology_json(&st));
        json_object_set_new(doc, "expected", diag_jint(st.expected));
        json_object_set_new(doc, "registered", diag_jint(st.registered));
        json_object_set_new(doc, "withdrawn", diag_jint(st.withdrawn));
        json_object_set_new(doc, "ready", json_boolean(st.ready));
        json_object_set_new(doc, "rooms", diag_jint(st.rooms));
        json_object_set_new(doc, "ranks", arr);
        diag_jprint(doc);
    } else {
        pd_text(d, &st, p, n);
    }
    free(p);
    kvc__close_reader(seg);
    return DIAG_EXIT_OK;
}

const diag_cmd diag_cmd_pd = {
    "pd",   "PD bootstrap tables: prefill topology, readiness, prefill ranks, room map size",
    "pd",   pd_help,
    run_pd,
};
