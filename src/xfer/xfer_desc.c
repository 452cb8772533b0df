/*
 * xfer_desc.c - the engine's descriptor (its transfer-engine info) as JSON:
 * export ours, import a peer's.  Format in transfer.h and docs/transfer.md.
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "xfer_internal.h"

KVT_API kvc_err kvt_descriptor_export(kvt_engine *e, char **json_out)
{
    KVT_ARG(e);
    KVT_ARG(json_out);
    json_t *regs = json_array();
    for (size_t i = 0; regs && i < e->nregions; i++)
        json_array_append_new(
            regs, json_pack("{s:I,s:I,s:I}", "addr", (json_int_t)e->regions[i].addr, "length",
                            (json_int_t)e->regions[i].len, "rkey", (json_int_t)e->regions[i].rkey));
    json_t *o = json_pack("{s:s,s:s,s:s,s:I,s:I,s:o}", "session_id", e->sid, "backend",
                          kvt_backend_name(e->backend), "protocol", "kvt", "protocol_version",
                          (json_int_t)KVT_PROTOCOL_VERSION, "generation",
                          (json_int_t)(e->generation & INT64_MAX), "regions", regs);
    if (o && e->backend == KVT_BACKEND_VERBS) {
        json_t *v = e->rdma->desc(e);
        if (v)
            json_object_set_new(o, "verbs", v);
    }
    char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    if (!s)
        return kvt__fail(KVC_E_SYS, "out of memory building the descriptor");
    *json_out = s;
    return KVC_OK;
}

static kvc_err get_int(json_t *o, const char *k, uint64_t *v)
{
    json_t *x = json_object_get(o, k);
    if (!json_is_integer(x) || json_integer_value(x) < 0)
        return kvt__fail(KVC_E_INVAL, "descriptor: \"%s\" missing or not a non-negative integer",
                         k);
    *v = (uint64_t)json_integer_value(x);
    return KVC_OK;
}

static kvc_err parse_regions(json_t *arr, kvt__rregion **out, size_t *n)
{
    if (!json_is_array(arr))
        return kvt__fail(KVC_E_INVAL, "descriptor: \"regions\" missing or not an array");
    size_t k = json_array_size(arr);
    kvt__rregion *v = calloc(k ? k : 1, sizeof *v);
    if (!v)
        return kvt__fail(KVC_E_SYS, "out of memory");
    for (size_t i = 0; i < k; i++) {
        json_t *r = json_array_get(arr, i);
        uint64_t rkey = 0;
        kvc_err err = json_is_object(r)
                          ? KVC_OK
                          : kvt__fail(KVC_E_INVAL, "descriptor: regions[%zu] not an object", i);
        if (!err)
            err = get_int(r, "addr", &v[i].addr);
        if (!err)
            err = get_int(r, "length", &v[i].len);
        if (!err)
            err = get_int(r, "rkey", &rkey);
        if (!err && v[i].addr + v[i].len < v[i].addr)
            err = kvt__fail(KVC_E_INVAL, "descriptor: regions[%zu] wraps around", i);
        if (err) {
            free(v);
            return err;
        }
        v[i].rkey = (uint32_t)rkey;
    }
    *out = v;
    *n = k;
    return KVC_OK;
}

static kvc_err import(kvt_engine *e, json_t *o, kvt_peer **out)
{
    if (!json_is_object(o))
        return kvt__fail(KVC_E_INVAL, "descriptor: not a JSON object");
    const char *sid = json_string_value(json_object_get(o, "session_id"));
    if (!sid || !*sid || strlen(sid) > KVC_SESSION_ID_MAX)
        return kvt__fail(KVC_E_INVAL, "descriptor: \"session_id\" missing, empty or too long");
    uint64_t ver = 0, gen = 0;
    kvc_err err = get_int(o, "protocol_version", &ver);
    if (!err && ver != KVT_PROTOCOL_VERSION)
        err = kvt__fail(KVC_E_VERSION,
                        "peer %s: incompatible protocol versions %llu vs %u (peer vs this engine)",
                        sid, (unsigned long long)ver, KVT_PROTOCOL_VERSION);
    if (!err)
        err = get_int(o, "generation", &gen);
    const char *be = json_string_value(json_object_get(o, "backend"));
    if (!err && (!be || (strcmp(be, "tcp") && strcmp(be, "verbs"))))
        err = kvt__fail(KVC_E_INVAL, "descriptor: \"backend\" missing or not tcp/verbs");
    kvt__rregion *regs = NULL;
    size_t n = 0;
    if (!err)
        err = parse_regions(json_object_get(o, "regions"), &regs, &n);
    kvt_peer *p = NULL;
    if (!err)
        err = kvt__peer_get(e, sid, &p);
    if (err) {
        free(regs);
        return err;
    }
    free(p->regions);
    p->regions = regs;
    p->nregions = n;
    /* RDMA WRITE when both run verbs; otherwise the TCP path (a verbs
     * engine still serves TCP writes). */
    bool verbs = e->backend == KVT_BACKEND_VERBS && !strcmp(be, "verbs");
    if (verbs != p->verbs)
        e->rdma->peer_down(e, p);
    p->verbs = verbs;
    kvt__peer_renew(e, p, gen);
    *out = p;
    return KVC_OK;
}

KVT_API kvc_err kvt_peer_import(kvt_engine *e, const char *json, size_t len, kvt_peer **out)
{
    KVT_ARG(e);
    KVT_ARG(json);
    KVT_ARG(out);
    json_error_t je;
    json_t *o = json_loadb(json, len, 0, &je);
    if (!o)
        return kvt__fail(KVC_E_INVAL, "descriptor is not JSON: %s (line %d, column %d)", je.text,
                         je.line, je.column);
    kvc_err err = import(e, o, out);
    json_decref(o);
    return err;
}
