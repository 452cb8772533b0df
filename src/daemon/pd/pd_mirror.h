/*
 * pd_mirror.h - the other nodes' PD prefill tables (pd_record.h) that
 * kvcoordd --etcd mirrors, in kvcoordd's memory (not in the segment: only
 * kvcoordd's GET /route answers from them).  The cluster thread is the only
 * writer; the PD routes (off the event loop) and the figures read.  Every
 * call takes the mirror's mutex for the copy it makes; any thread.
 */
#ifndef KVC_PD_MIRROR_H
#define KVC_PD_MIRROR_H

#include <stddef.h>

#include <jansson.h>

#include "pd_record.h"

struct pd_mirror;

/* A new, empty mirror; NULL when out of memory. */
struct pd_mirror *pd_mirror_new(void);
/* Free m and its tables.  NULL ignored. */
void pd_mirror_free(struct pd_mirror *m);

/* ---- the writer (the cluster thread) ---- */

/* Put node t->node's table, replacing the one it had; takes t's ranks (t
 * is left empty).  Returns 0, or -1 when out of memory (t freed). */
int pd_mirror_put(struct pd_mirror *m, struct pd_table *t);
/* Remove node's table; 1 when it had one, else 0. */
int pd_mirror_remove(struct pd_mirror *m, const char *node);
/* Remove every table; how many there were. */
size_t pd_mirror_clear(struct pd_mirror *m);
/* A snapshot: mark every table stale, put() those still there (which
 * clears the mark), then drop the rest: how many went. */
void pd_mirror_mark_stale(struct pd_mirror *m);
size_t pd_mirror_drop_stale(struct pd_mirror *m);

/* ---- the readers ---- */

enum pd_pick { PD_PICK_OK = 0, PD_PICK_NONE, PD_PICK_MANY, PD_PICK_UNKNOWN };

/* The table GET /route answers from: node's (node non-NULL) or, with node
 * NULL, the only one mirrored.  PD_PICK_OK: its status into *st and its
 * node's name into node_out[PD_NODE_MAX + 1]; PD_PICK_NONE: no table is
 * mirrored (node NULL); PD_PICK_MANY (node NULL) and PD_PICK_UNKNOWN (no
 * table of node): the mirrored nodes' names, comma-separated, into
 * names[0..cap) (cut short with "..." when they do not fit). */
enum pd_pick pd_mirror_pick(struct pd_mirror *m, const char *node, kvc_pd_status *st,
                            char *node_out, char *names, size_t cap);

/* The entry (dp, cp, tp, pp) of node's table into *out: 0, or -1 when node
 * has no table or the table no such entry. */
int pd_mirror_lookup(struct pd_mirror *m, const char *node, int32_t dp, int32_t cp, int32_t tp,
                     int32_t pp, kvc_pd_rank *out);

/* Up to cap entries of node's table (live and withdrawn) into out: how
 * many it has (0 when node has no table). */
size_t pd_mirror_ranks(struct pd_mirror *m, const char *node, kvc_pd_rank *out, size_t cap);

/* Tables mirrored, and their live entries, for /metrics. */
void pd_mirror_counts(struct pd_mirror *m, size_t *tables, size_t *live);

/* GET /cluster's "pd" list: [{"node", "url", "ready", "registered",
 * "expected", "withdrawn", "attn_tp_size", "attn_cp_size", "dp_size",
 * "pp_size"}] (a new reference; NULL when out of memory). */
json_t *pd_mirror_json(struct pd_mirror *m);

#endif /* KVC_PD_MIRROR_H */
