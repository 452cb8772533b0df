/*
 * fuzz_pd_record.c - fuzz target: the check of a node's PD prefill record
 * read from etcd (pd_record_decode, src/daemon/pd/pdrec/pd_record.h), which any etcd
 * client may have written.
 *
 * The input is a record's bytes, for the key of node "A".
 *   1. A refusal says why (a non-empty text) and leaves nothing allocated.
 *   2. An accepted record holds what kvc_pd_register() would accept: sizes
 *      1..4096, ranks 0..4095, no (dp, cp, tp, pp) twice, rank_ip 1..63 and
 *      kv_cache_dtype 1..31 bytes without control bytes, ports 1..65535,
 *      notes of at most 127 bytes; registered and withdrawn count its live
 *      and withdrawn entries, at least one live; expected is the product of
 *      the sizes and ready is registered >= expected; node is "A".
 *   3. The table written back as a record (the format pd_record_encode
 *      writes) is accepted again and equal, field by field.
 */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_common.h"
#include "pd_record.h"

static int clean_text(const char *s, size_t min, size_t max)
{
    size_t n = strlen(s);
    if (n < min || n > max)
        return 0;
    for (const unsigned char *p = (const unsigned char *)s; *p; p++)
        if (*p < 0x20 || *p == 0x7f)
            return 0;
    return 1;
}

static json_t *opt(int has, int32_t v) { return has ? json_integer(v) : json_null(); }

/* t as a record, in pd_record_encode's format. */
static char *write_back(const struct pd_table *t)
{
    const kvc_pd_status *st = &t->st;
    json_t *ranks = json_array();
    for (size_t i = 0; i < t->n; i++) {
        const kvc_pd_rank *p = &t->ranks[i];
        json_array_append_new(
            ranks, json_pack("{s:i, s:i, s:i, s:i, s:s, s:i, s:s, s:s, s:i, s:I, s:I}", "dp",
                             (int)p->dp_group, "cp", (int)p->cp_rank, "tp", (int)p->tp_rank, "pp",
                             (int)p->pp_rank, "ip", p->rank_ip, "port", (int)p->rank_port, "state",
                             p->withdrawn ? "withdrawn" : "live", "note", p->note, "pid",
                             (int)p->pid, "generation", (json_int_t)p->generation, "registered_ns",
                             (json_int_t)p->registered_ns));
    }
    json_t *topo = json_pack(
        "{s:i, s:i, s:i, s:i, s:o, s:o, s:b, s:b, s:o}", "attn_tp_size", (int)st->attn_tp_size,
        "attn_cp_size", (int)st->attn_cp_size, "dp_size", (int)st->dp_size, "pp_size",
        (int)st->pp_size, "page_size", opt(st->has_page_size, st->page_size), "kv_cache_dtype",
        st->has_kv_cache_dtype ? json_string(st->kv_cache_dtype) : json_null(),
        "follow_bootstrap_room", st->follow_bootstrap_room, "enable_dsa_cache_layer_split",
        st->enable_dsa_cache_layer_split, "prefill_http_port",
        opt(st->has_prefill_http_port, st->prefill_http_port));
    json_t *o = json_pack("{s:s, s:s, s:o, s:o}", "node", t->node, "url", t->url, "topology", topo,
                          "ranks", ranks);
    char *s = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    return s;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct pd_table t;
    const char *why = pd_record_decode("A", (const char *)data, size, &t);
    if (why) {
        FZ_CHECK(why[0] && !t.ranks && !t.n, "a refusal without a reason, or with ranks left");
        return 0;
    }
    const kvc_pd_status *st = &t.st;
    FZ_CHECK(!strcmp(t.node, "A") && st->has_topology, "node or topology");
    int32_t dims[4] = {st->attn_tp_size, st->attn_cp_size, st->dp_size, st->pp_size};
    uint64_t expected = 1;
    for (int i = 0; i < 4; i++) {
        FZ_CHECK(dims[i] >= 1 && dims[i] <= KVC_PD_DIM_MAX, "size %d out of range", (int)dims[i]);
        expected *= (uint64_t)dims[i];
    }
    FZ_CHECK(st->expected == (expected > UINT32_MAX ? UINT32_MAX : expected), "expected");
    FZ_CHECK(!st->has_page_size || st->page_size >= 1, "page size");
    FZ_CHECK(!st->has_kv_cache_dtype || clean_text(st->kv_cache_dtype, 1, KVC_PD_DTYPE_MAX),
             "dtype");
    FZ_CHECK(!st->has_prefill_http_port ||
                 (st->prefill_http_port >= 1 && st->prefill_http_port <= 65535),
             "http port");
    uint32_t live = 0, gone = 0;
    FZ_CHECK(t.n <= KVC_PD_MAX_RANKS, "too many ranks");
    for (size_t i = 0; i < t.n; i++) {
        const kvc_pd_rank *p = &t.ranks[i];
        int32_t k[4] = {p->dp_group, p->cp_rank, p->tp_rank, p->pp_rank};
        for (int j = 0; j < 4; j++)
            FZ_CHECK(k[j] >= 0 && k[j] < KVC_PD_DIM_MAX, "rank key out of range");
        FZ_CHECK(clean_text(p->rank_ip, 1, KVC_PD_IP_MAX), "rank_ip");
        FZ_CHECK(p->rank_port >= 1 && p->rank_port <= 65535, "rank_port");
        FZ_CHECK(clean_text(p->note, 0, KVC_NOTE_MAX), "note");
        FZ_CHECK(pd_table_find(&t, k[0], k[1], k[2], k[3]) == p, "a key twice");
        live += !p->withdrawn;
        gone += p->withdrawn;
    }
    FZ_CHECK(live >= 1 && st->registered == live && st->withdrawn == gone, "counts");
    FZ_CHECK(st->ready == (st->registered >= st->expected), "ready");
    char *again = write_back(&t);
    FZ_CHECK(again, "write back");
    struct pd_table u;
    why = pd_record_decode("A", again, strlen(again), &u);
    FZ_CHECK(!why, "written back, refused: %s (%s)", why, again);
    FZ_CHECK(!memcmp(&u.st, &t.st, sizeof u.st) && u.n == t.n && !strcmp(u.url, t.url),
             "written back, another table");
    for (size_t i = 0; i < t.n; i++)
        FZ_CHECK(!memcmp(&u.ranks[i], &t.ranks[i], sizeof u.ranks[i]),
                 "written back, rank %zu differs", i);
    free(again);
    pd_table_free(&u);
    pd_table_free(&t);
    return 0;
}
