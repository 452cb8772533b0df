/*
 * etcd_kv.c - the unary calls of etcd_client.h: put, create-only put (a
 * transaction comparing the key's create revision with 0), a transaction
 * of many operations, range over a prefix, delete, the lease calls, and a
 * member's status.  Each is one POST through etcd__call (fail-over, the
 * deadline) but the member status, asked of one member.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "etcd_internal.h"

/* ---- KV ------------------------------------------------------------------ */

int etcd_put(etcd *c, const char *key, const void *value, size_t len, int64_t lease, int64_t *rev)
{
    json_t *req = json_object();
    json_object_set_new(req, "key", etcd__b64_json(key, strlen(key)));
    json_object_set_new(req, "value", etcd__b64_json(value, len));
    if (lease)
        json_object_set_new(req, "lease", etcd__i64_json(lease));
    json_t *resp;
    if (etcd__call(c, "/v3/kv/put", req, &resp))
        return -1;
    if (rev)
        *rev = etcd__get_i64(json_object_get(resp, "header"), "revision");
    json_decref(resp);
    return 0;
}

int etcd_put_create(etcd *c, const char *key, const void *value, size_t len, int64_t lease,
                    int *created, etcd_kv *existing, int64_t *rev)
{
    json_t *k = etcd__b64_json(key, strlen(key));
    json_t *put = json_object();
    json_object_set(put, "key", k);
    json_object_set_new(put, "value", etcd__b64_json(value, len));
    if (lease)
        json_object_set_new(put, "lease", etcd__i64_json(lease));
    json_t *req = json_pack("{s:[{s:O, s:s, s:s, s:s}], s:[{s:o}], s:[{s:{s:O}}]}", "compare",
                            "key", k, "target", "CREATE", "result", "EQUAL", "create_revision", "0",
                            "success", "request_put", put, "failure", "request_range", "key", k);
    json_decref(k);
    if (!req) {
        etcd__set_err(c, "out of memory for an etcd transaction");
        return -1;
    }
    json_t *resp;
    if (etcd__call(c, "/v3/kv/txn", req, &resp))
        return -1;
    *created = json_is_true(json_object_get(resp, "succeeded"));
    if (rev)
        *rev = etcd__get_i64(json_object_get(resp, "header"), "revision");
    int rc = 0;
    if (!*created && existing) {
        json_t *r0 = json_array_get(json_object_get(resp, "responses"), 0);
        json_t *kv0 =
            json_array_get(json_object_get(json_object_get(r0, "response_range"), "kvs"), 0);
        if (!kv0) {
            /* Deleted between the compare and the range: cannot happen in
             * one transaction, but an empty record is still an answer. */
            memset(existing, 0, sizeof *existing);
        } else if (etcd__parse_kv(kv0, existing)) {
            etcd__set_err(c, "etcd txn: undecodable key or value in the answer");
            rc = -1;
        }
    }
    json_decref(resp);
    return rc;
}

int etcd_txn_batch(etcd *c, const struct etcd_op *ops, size_t n, int64_t lease, int64_t *rev)
{
    json_t *succ = json_array();
    for (size_t i = 0; i < n; i++) {
        json_t *op = json_object();
        json_object_set_new(op, "key", etcd__b64_json(ops[i].key, strlen(ops[i].key)));
        if (ops[i].is_delete) {
            json_array_append_new(succ, json_pack("{s:o}", "request_delete_range", op));
            continue;
        }
        json_object_set_new(op, "value", etcd__b64_json(ops[i].value, ops[i].len));
        if (lease)
            json_object_set_new(op, "lease", etcd__i64_json(lease));
        json_array_append_new(succ, json_pack("{s:o}", "request_put", op));
    }
    json_t *req = json_pack("{s:o}", "success", succ);
    if (!req) {
        etcd__set_err(c, "out of memory for an etcd transaction");
        return -1;
    }
    json_t *resp;
    if (etcd__call(c, "/v3/kv/txn", req, &resp))
        return -1;
    if (rev)
        *rev = etcd__get_i64(json_object_get(resp, "header"), "revision");
    json_decref(resp);
    return 0;
}

int etcd_range_prefix(etcd *c, const char *prefix, etcd_kv **kvs, size_t *n, int64_t *rev)
{
    json_t *resp;
    if (etcd__call(c, "/v3/kv/range", etcd__range_req(prefix), &resp))
        return -1;
    json_t *arr = json_object_get(resp, "kvs");
    size_t cnt = json_array_size(arr);
    etcd_kv *out = calloc(cnt ? cnt : 1, sizeof *out);
    if (!out) {
        json_decref(resp);
        etcd__set_err(c, "out of memory for %zu etcd keys", cnt);
        return -1;
    }
    for (size_t i = 0; i < cnt; i++) {
        if (etcd__parse_kv(json_array_get(arr, i), &out[i])) {
            etcd_kvs_free(out, i);
            json_decref(resp);
            etcd__set_err(c, "etcd range: undecodable key or value in the answer");
            return -1;
        }
    }
    if (rev)
        *rev = etcd__get_i64(json_object_get(resp, "header"), "revision");
    json_decref(resp);
    *kvs = out;
    *n = cnt;
    return 0;
}

int etcd_delete(etcd *c, const char *key, int prefix, int64_t *deleted)
{
    json_t *req;
    if (prefix) {
        req = etcd__range_req(key);
    } else {
        req = json_object();
        json_object_set_new(req, "key", etcd__b64_json(key, strlen(key)));
    }
    json_t *resp;
    if (etcd__call(c, "/v3/kv/deleterange", req, &resp))
        return -1;
    if (deleted)
        *deleted = etcd__get_i64(resp, "deleted");
    json_decref(resp);
    return 0;
}

/* ---- leases -------------------------------------------------------------- */

int etcd_lease_grant(etcd *c, int64_t ttl_s, int64_t *id)
{
    json_t *req = json_object();
    json_object_set_new(req, "TTL", etcd__i64_json(ttl_s));
    json_t *resp;
    if (etcd__call(c, "/v3/lease/grant", req, &resp))
        return -1;
    *id = etcd__get_i64(resp, "ID");
    const char *e = json_string_value(json_object_get(resp, "error"));
    json_decref(resp);
    if (!*id) {
        etcd__set_err(c, "etcd lease grant: no lease ID in the answer%s%s", e ? ": " : "",
                      e ? e : "");
        return -1;
    }
    return 0;
}

int etcd_lease_keepalive(etcd *c, int64_t id, int64_t *ttl_left)
{
    json_t *req = json_object();
    json_object_set_new(req, "ID", etcd__i64_json(id));
    json_t *resp;
    if (etcd__call(c, "/v3/lease/keepalive", req, &resp))
        return -1;
    /* A streaming method: the answer is {"result": {...}}; a lease that no
     * longer exists comes back with no TTL (0). */
    json_t *r = json_object_get(resp, "result");
    *ttl_left = etcd__get_i64(r ? r : resp, "TTL");
    json_decref(resp);
    return 0;
}

int etcd_lease_ttl(etcd *c, int64_t id, int64_t *ttl_left, int64_t *granted)
{
    json_t *req = json_object();
    json_object_set_new(req, "ID", etcd__i64_json(id));
    json_t *resp;
    if (etcd__call(c, "/v3/lease/timetolive", req, &resp))
        return -1;
    /* An expired lease answers TTL -1 (as a string or a number). */
    *ttl_left = etcd__get_i64(resp, "TTL");
    *granted = etcd__get_i64(resp, "grantedTTL");
    json_decref(resp);
    return 0;
}

int etcd_lease_revoke(etcd *c, int64_t id)
{
    json_t *req = json_object();
    json_object_set_new(req, "ID", etcd__i64_json(id));
    json_t *resp;
    if (etcd__call(c, "/v3/lease/revoke", req, &resp)) {
        if (strstr(c->err, "lease not found"))
            return 0;
        return -1;
    }
    json_decref(resp);
    return 0;
}

int etcd_member_status(etcd *c, const char *url, uint64_t *leader, int64_t *revision)
{
    json_t *resp = NULL;
    char *token = c->token;
    if (c->user && !token && etcd__authenticate(c, url) != X_OK)
        return -1;
    int k = etcd__exchange(c, c->curl, url, "/v3/maintenance/status", "{}", c->timeout_ms, &resp);
    if (k != X_OK)
        return -1;
    *leader = etcd__get_u64(resp, "leader");
    *revision = etcd__get_i64(json_object_get(resp, "header"), "revision");
    json_decref(resp);
    return 0;
}
