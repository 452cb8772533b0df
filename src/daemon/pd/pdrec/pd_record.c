/*
 * pd_record.c - see pd_record.h.  A record comes from etcd, which any of
 * its clients may write: every field is checked against the ranges
 * kvc_pd_register() accepts, and a record that fails a check is not used
 * at all.
 */
#include "pd_record.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- encode ---------------------------------------------------------------- */

static json_t *opt_int(int has, int32_t v) { return has ? json_integer(v) : json_null(); }

static json_t *topology_of(const kvc_pd_status *st)
{
    return json_pack(
        "{s:i, s:i, s:i, s:i, s:o, s:o, s:b, s:b, s:o}", "attn_tp_size", (int)st->attn_tp_size,
        "attn_cp_size", (int)st->attn_cp_size, "dp_size", (int)st->dp_size, "pp_size",
        (int)st->pp_size, "page_size", opt_int(st->has_page_size, st->page_size), "kv_cache_dtype",
        st->has_kv_cache_dtype ? json_string(st->kv_cache_dtype) : json_null(),
        "follow_bootstrap_room", st->follow_bootstrap_room, "enable_dsa_cache_layer_split",
        st->enable_dsa_cache_layer_split, "prefill_http_port",
        opt_int(st->has_prefill_http_port, st->prefill_http_port));
}

static json_t *rank_of(const kvc_pd_rank *p)
{
    return json_pack("{s:i, s:i, s:i, s:i, s:s, s:i, s:s, s:s, s:i, s:I, s:I}", "dp",
                     (int)p->dp_group, "cp", (int)p->cp_rank, "tp", (int)p->tp_rank, "pp",
                     (int)p->pp_rank, "ip", p->rank_ip, "port", (int)p->rank_port, "state",
                     p->withdrawn ? "withdrawn" : "live", "note", p->note, "pid", (int)p->pid,
                     "generation", (json_int_t)p->generation, "registered_ns",
                     (json_int_t)p->registered_ns);
}

int pd_record_encode(kvc_segment *seg, const char *node, const char *url, char **out, char *err,
                     size_t cap)
{
    *out = NULL;
    kvc_pd_status st;
    size_t n = 0;
    if (kvc_pd_status_get(seg, &st) || kvc_pd_list(seg, NULL, 0, &n)) {
        snprintf(err, cap, "%s", kvc_last_error());
        return -1;
    }
    if (!st.has_topology)
        return 0;
    kvc_pd_rank *p = calloc(n + 1, sizeof *p);
    if (!p) {
        snprintf(err, cap, "out of memory");
        return -1;
    }
    if (kvc_pd_list(seg, p, n + 1, &n)) {
        snprintf(err, cap, "%s", kvc_last_error());
        free(p);
        return -1;
    }
    if (n > KVC_PD_MAX_RANKS)
        n = KVC_PD_MAX_RANKS;
    json_t *ranks = json_array();
    for (size_t i = 0; ranks && i < n; i++)
        json_array_append_new(ranks, rank_of(&p[i]));
    free(p);
    json_t *o = ranks ? json_pack("{s:s, s:s, s:o, s:o}", "node", node, "url", url ? url : "",
                                  "topology", topology_of(&st), "ranks", ranks)
                      : NULL;
    *out = o ? json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
    json_decref(o);
    if (!*out) {
        snprintf(err, cap, "out of memory");
        return -1;
    }
    return 0;
}

/* ---- decode ---------------------------------------------------------------- */

/* An integer field in lo..hi into *out; -1 if absent, of another type or
 * out of range. */
static int int_field(json_t *o, const char *name, int64_t lo, int64_t hi, int64_t *out)
{
    json_t *v = json_object_get(o, name);
    if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > hi)
        return -1;
    *out = json_integer_value(v);
    return 0;
}

/* A string of 1..max bytes (0..max when empty_ok) without control bytes
 * or NUL; NULL otherwise. */
static const char *text_field(json_t *o, const char *name, size_t max, int empty_ok)
{
    json_t *v = json_object_get(o, name);
    const char *s = json_string_value(v);
    if (!s || json_string_length(v) > max || (!empty_ok && !json_string_length(v)) ||
        strlen(s) != json_string_length(v))
        return NULL;
    for (const unsigned char *p = (const unsigned char *)s; *p; p++)
        if (*p < 0x20 || *p == 0x7f)
            return NULL;
    return s;
}

static const char *decode_topology(json_t *t, kvc_pd_status *st)
{
    if (!json_is_object(t))
        return "its \"topology\" is not an object";
    static const char *const dims[] = {"attn_tp_size", "attn_cp_size", "dp_size", "pp_size"};
    int32_t *to[] = {&st->attn_tp_size, &st->attn_cp_size, &st->dp_size, &st->pp_size};
    for (int i = 0; i < 4; i++) {
        int64_t x;
        if (int_field(t, dims[i], 1, KVC_PD_DIM_MAX, &x))
            return "a size of its \"topology\" is not an integer in 1..4096";
        *to[i] = (int32_t)x;
    }
    json_t *v = json_object_get(t, "page_size");
    int64_t x;
    if (v && !json_is_null(v)) {
        if (int_field(t, "page_size", 1, INT32_MAX, &x))
            return "its \"page_size\" is not null or a positive integer";
        st->has_page_size = 1, st->page_size = (int32_t)x;
    }
    v = json_object_get(t, "kv_cache_dtype");
    if (v && !json_is_null(v)) {
        const char *s = text_field(t, "kv_cache_dtype", KVC_PD_DTYPE_MAX, 0);
        if (!s)
            return "its \"kv_cache_dtype\" is not null or a string of 1..31 bytes";
        st->has_kv_cache_dtype = 1;
        snprintf(st->kv_cache_dtype, sizeof st->kv_cache_dtype, "%s", s);
    }
    v = json_object_get(t, "prefill_http_port");
    if (v && !json_is_null(v)) {
        if (int_field(t, "prefill_http_port", 1, 65535, &x))
            return "its \"prefill_http_port\" is not null or a port";
        st->has_prefill_http_port = 1, st->prefill_http_port = (int32_t)x;
    }
    json_t *f = json_object_get(t, "follow_bootstrap_room"),
           *d = json_object_get(t, "enable_dsa_cache_layer_split");
    if (!json_is_boolean(f) || !json_is_boolean(d))
        return "its \"follow_bootstrap_room\" or \"enable_dsa_cache_layer_split\" is not a bool";
    st->follow_bootstrap_room = json_is_true(f);
    st->enable_dsa_cache_layer_split = json_is_true(d);
    return NULL;
}

static const char *decode_rank(json_t *r, kvc_pd_rank *p)
{
    if (!json_is_object(r))
        return "a rank is not an object";
    static const char *const keys[] = {"dp", "cp", "tp", "pp"};
    int32_t *to[] = {&p->dp_group, &p->cp_rank, &p->tp_rank, &p->pp_rank};
    int64_t x;
    for (int i = 0; i < 4; i++) {
        if (int_field(r, keys[i], 0, KVC_PD_DIM_MAX - 1, &x))
            return "a rank's dp, cp, tp or pp is not an integer in 0..4095";
        *to[i] = (int32_t)x;
    }
    const char *ip = text_field(r, "ip", KVC_PD_IP_MAX, 0);
    if (!ip)
        return "a rank's \"ip\" is not a string of 1..63 bytes";
    snprintf(p->rank_ip, sizeof p->rank_ip, "%s", ip);
    if (int_field(r, "port", 1, 65535, &x))
        return "a rank's \"port\" is not a port";
    p->rank_port = (int32_t)x;
    const char *state = json_string_value(json_object_get(r, "state"));
    if (!state || (strcmp(state, "live") && strcmp(state, "withdrawn")))
        return "a rank's \"state\" is not \"live\" or \"withdrawn\"";
    p->withdrawn = !strcmp(state, "withdrawn");
    const char *note = text_field(r, "note", KVC_NOTE_MAX, 1);
    if (!note)
        return "a rank's \"note\" is not a string of at most 127 bytes";
    snprintf(p->note, sizeof p->note, "%s", note);
    if (int_field(r, "pid", 0, INT32_MAX, &x))
        return "a rank's \"pid\" is not a non-negative integer";
    p->pid = (int32_t)x;
    if (int_field(r, "generation", 0, INT64_MAX, &x))
        return "a rank's \"generation\" is not a non-negative integer";
    p->generation = (uint64_t)x;
    if (int_field(r, "registered_ns", 0, INT64_MAX, &x))
        return "a rank's \"registered_ns\" is not a non-negative integer";
    p->registered_ns = (uint64_t)x;
    return NULL;
}

const char *pd_record_decode(const char *node, const char *val, size_t len, struct pd_table *out)
{
    memset(out, 0, sizeof *out);
    json_error_t je;
    json_t *o = val ? json_loadb(val, len, 0, &je) : NULL;
    const char *why = NULL;
    json_t *ranks = json_object_get(o, "ranks");
    const char *url = NULL;
    if (!json_is_object(o))
        why = "not a JSON object";
    else if (!json_string_value(json_object_get(o, "node")) ||
             strcmp(json_string_value(json_object_get(o, "node")), node))
        why = "its \"node\" is not the key's node";
    else if (!(url = text_field(o, "url", PD_URL_MAX, 1)))
        why = "its \"url\" is not a string of at most 255 bytes";
    else if ((why = decode_topology(json_object_get(o, "topology"), &out->st)))
        ;
    else if (!json_is_array(ranks) || json_array_size(ranks) > KVC_PD_MAX_RANKS)
        why = "its \"ranks\" is not an array of at most 1024";
    else if (!(out->ranks = calloc(json_array_size(ranks) + 1, sizeof *out->ranks)))
        why = "out of memory";
    if (!why) {
        snprintf(out->node, sizeof out->node, "%s", node);
        snprintf(out->url, sizeof out->url, "%s", url);
        for (size_t i = 0; !why && i < json_array_size(ranks); i++) {
            kvc_pd_rank *p = &out->ranks[i];
            if ((why = decode_rank(json_array_get(ranks, i), p)))
                break;
            out->n = i + 1;
        }
    }
    /* The library's one check of a PD table (kvc_pd_table_check): ranges,
     * no key twice, every live entry inside the topology, the counts. */
    out->st.has_topology = 1;
    if (!why && kvc_pd_table_check(&out->st, out->ranks, out->n) != KVC_OK)
        why = kvc_last_error();
    json_decref(o);
    if (why) {
        pd_table_free(out);
        memset(out, 0, sizeof *out);
        return why;
    }
    return NULL;
}

const kvc_pd_rank *pd_table_find(const struct pd_table *t, int32_t dp, int32_t cp, int32_t tp,
                                 int32_t pp)
{
    for (size_t i = 0; i < t->n; i++) {
        const kvc_pd_rank *p = &t->ranks[i];
        if (p->dp_group == dp && p->cp_rank == cp && p->tp_rank == tp && p->pp_rank == pp)
            return p;
    }
    return NULL;
}

void pd_table_free(struct pd_table *t)
{
    if (!t)
        return;
    free(t->ranks);
    t->ranks = NULL;
    t->n = 0;
}
