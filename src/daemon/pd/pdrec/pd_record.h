/*
 * pd_record.h - a node's PD prefill table (kvcoord/pd.h) as one etcd record,
 * pd/<node> under the cluster prefix (cluster.h), and back: what kvcoordd
 * --etcd publishes of its own table and what it mirrors of the others'.
 *
 * The record (JSON):
 *   {"node", "url", "topology": {"attn_tp_size", "attn_cp_size", "dp_size",
 *    "pp_size", "page_size" (int|null), "kv_cache_dtype" (str|null),
 *    "follow_bootstrap_room", "enable_dsa_cache_layer_split" (bools),
 *    "prefill_http_port" (int|null)},
 *    "ranks": [{"dp", "cp", "tp", "pp", "ip", "port", "state" ("live" |
 *    "withdrawn"), "note", "pid", "generation", "registered_ns"}]}
 * Only a table with a topology (a live entry) is published; the counts a
 * reader needs (registered, expected, ready) are recomputed from the ranks
 * by the rules of kvcoord/pd.h, never taken from the record.
 *
 * Pure functions: no lock, no I/O but the segment read of
 * pd_record_encode (which takes the PD lock).  Any thread.
 */
#ifndef KVC_PD_RECORD_H
#define KVC_PD_RECORD_H

#include <stddef.h>
#include <stdint.h>

#include "kvcoord/pd.h"

#define PD_NODE_MAX 63
#define PD_URL_MAX 255

/* A node's table as read from its record (or from this node's segment). */
struct pd_table {
    char node[PD_NODE_MAX + 1];
    char url[PD_URL_MAX + 1];
    kvc_pd_status st; /* rooms is 0: the room map is not published */
    kvc_pd_rank *ranks;
    size_t n;
};

/* This segment's table as a record (malloc'd, NUL-terminated) into *out,
 * or *out NULL when it has no topology (nothing to publish).  Returns 0, or
 * -1 with err set (the segment's lock, out of memory). */
int pd_record_encode(kvc_segment *seg, const char *node, const char *url, char **out, char *err,
                     size_t cap);

/* Check the record val[0..len) of key node pd/<node> into *out (its ranks
 * malloc'd: pd_table_free): its JSON shape here, its content by the
 * library's kvc_pd_table_check().  Returns NULL, or why the record is not
 * usable (out then holds nothing to free): a static string, or
 * kvc_last_error()'s text, valid until this thread's next failing kvcoord
 * call. */
const char *pd_record_decode(const char *node, const char *val, size_t len, struct pd_table *out);

/* The entry of (dp, cp, tp, pp) in t, or NULL. */
const kvc_pd_rank *pd_table_find(const struct pd_table *t, int32_t dp, int32_t cp, int32_t tp,
                                 int32_t pp);

/* Free t's ranks (t itself is the caller's).  NULL ignored. */
void pd_table_free(struct pd_table *t);

#endif /* KVC_PD_RECORD_H */
