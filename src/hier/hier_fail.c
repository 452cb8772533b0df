/*
 * hier_fail.c - a hierarchical step's failure: the record every rank of
 * every node gets (made where the failure was seen, carried to the other
 * leaders and spread through each segment), its text in global ranks and
 * node names, and the error returned from it.  Callers: hier.c, hier_net.c.
 */
#include <stdio.h>
#include <string.h>

#include "hier_internal.h"

static void put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void put64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint32_t get32(const uint8_t *p)
{
    uint32_t v = 0;
    for (int i = 0; i < 4; i++)
        v |= (uint32_t)p[i] << (8 * i);
    return v;
}

static uint64_t get64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v |= (uint64_t)p[i] << (8 * i);
    return v;
}

void hier__rec_put(const hier_rec *r, uint8_t *out)
{
    out[0] = r->failed;
    out[1] = r->code;
    out[2] = r->dead;
    out[3] = r->mismatch;
    put32(out + 4, (uint32_t)r->node);
    put32(out + 8, (uint32_t)r->pid);
    put32(out + 12, r->timeout_ms);
    put64(out + 16, r->ranks);
    put64(out + 24, r->step);
    memcpy(out + 32, r->text, KVC_HIER_TEXT);
    out[32 + KVC_HIER_TEXT - 1] = '\0';
}

void hier__rec_get(hier_rec *r, const uint8_t *in)
{
    r->failed = in[0];
    r->code = in[1];
    r->dead = in[2];
    r->mismatch = in[3];
    r->node = (int32_t)get32(in + 4);
    r->pid = (int32_t)get32(in + 8);
    r->timeout_ms = get32(in + 12);
    r->ranks = get64(in + 16);
    r->step = get64(in + 24);
    memcpy(r->text, in + 32, KVC_HIER_TEXT);
    r->text[KVC_HIER_TEXT - 1] = '\0';
}

void hier__rank_list(uint64_t ranks, char *buf, size_t cap)
{
    size_t n = 0;
    buf[0] = '\0';
    for (uint32_t r = 0; r < 64 && n + 1 < cap;) {
        if (!(ranks >> r & 1)) {
            r++;
            continue;
        }
        uint32_t e = r;
        while (e + 1 < 64 && (ranks >> (e + 1) & 1))
            e++;
        int k = e > r ? snprintf(buf + n, cap - n, "%s%u-%u", n ? ", " : "", r, e)
                      : snprintf(buf + n, cap - n, "%s%u", n ? ", " : "", r);
        if (k < 0)
            break;
        n += (size_t)k;
        r = e + 1;
    }
    if (!ranks)
        snprintf(buf, cap, "?");
}

static int lowest(uint64_t m) { return m ? __builtin_ctzll(m) : -1; }

void hier__rec_local(const kvc_hier *h, hier_rec *r, kvc_err e, const kvc_coll_failure *cw,
                     const char *msg)
{
    memset(r, 0, sizeof *r);
    r->failed = 1;
    r->code = (uint8_t)e;
    r->step = h->step;
    r->node = (int32_t)h->node;
    const char *nm = h->names[h->node];
    if (e != KVC_E_PEER && e != KVC_E_TIMEDOUT) {
        r->ranks = 1ull << h->rank;
        snprintf(r->text, sizeof r->text, "rank %u on node %s could not take part: %s", h->rank, nm,
                 msg);
        return;
    }
    for (uint32_t i = 0; i < h->lsize && i < 64; i++)
        if (cw->ranks >> i & 1)
            r->ranks |= 1ull << h->local[i];
    r->dead = e == KVC_E_PEER;
    r->pid = cw->pid;
    r->timeout_ms = r->dead ? 0 : cw->timeout_ms;
    char list[64];
    hier__rank_list(r->ranks, list, sizeof list);
    bool many = r->ranks & (r->ranks - 1);
    if (!r->ranks) /* this rank came after its node's peers gave up the round */
        snprintf(r->text, sizeof r->text,
                 "step %llu went on without rank %u on node %s (it came late): %s",
                 (unsigned long long)h->step, h->rank, nm, msg);
    else if (r->dead)
        snprintf(r->text, sizeof r->text, "rank%s %s on node %s died or left (pid %d; %s)",
                 many ? "s" : "", list, nm, (int)cw->pid, msg);
    else
        snprintf(r->text, sizeof r->text, "rank%s %s on node %s did not arrive in time (%s)",
                 many ? "s" : "", list, nm, msg);
    if (!r->ranks)
        r->ranks = 1ull << h->rank;
}

void hier__rec_node(const kvc_hier *h, hier_rec *r, uint32_t j, bool closed, uint32_t timeout_ms,
                    const char *detail)
{
    memset(r, 0, sizeof *r);
    r->failed = 1;
    r->step = h->step;
    r->node = (int32_t)j;
    char list[64];
    hier__rank_list(h->ranks_of[j], list, sizeof list);
    if (closed) {
        r->code = KVC_E_PEER;
        r->dead = 1;
        r->ranks = 1ull << h->leader_of[j];
        snprintf(r->text, sizeof r->text,
                 "node %s's leader, rank %u, closed its connection: it died or left (%s; step "
                 "%llu of group 0x%llx)",
                 h->names[j], h->leader_of[j], detail, (unsigned long long)h->step,
                 (unsigned long long)h->group);
    } else {
        r->code = KVC_E_TIMEDOUT;
        r->ranks = h->ranks_of[j];
        r->timeout_ms = timeout_ms;
        snprintf(r->text, sizeof r->text,
                 "node %s (leader rank %u, ranks %s) sent nothing for step %llu of group "
                 "0x%llx within %u ms%s%s",
                 h->names[j], h->leader_of[j], list, (unsigned long long)h->step,
                 (unsigned long long)h->group, timeout_ms, *detail ? ": " : "", detail);
    }
}

static uint32_t sig_tag(const uint8_t *s) { return get32(s); }
static uint32_t sig_len(const uint8_t *s) { return get32(s + 4); }

bool hier__rec_mismatch(const kvc_hier *h, hier_rec *r)
{
    const uint8_t *ref = h->gsig[0];
    for (uint32_t g = 1; g < h->size; g++) {
        if (!memcmp(h->gsig[g], ref, SIG_BYTES))
            continue;
        memset(r, 0, sizeof *r);
        r->failed = 1;
        r->code = KVC_E_INVAL;
        r->mismatch = 1;
        r->step = h->step;
        r->ranks = 1ull << g;
        r->node = (int32_t)h->node_of[g];
        snprintf(r->text, sizeof r->text,
                 "rank %u on node %s called with tag %u and %u bytes, rank 0 on node %s with "
                 "tag %u and %u bytes (step %llu of group 0x%llx)",
                 g, h->names[h->node_of[g]], sig_tag(h->gsig[g]), sig_len(h->gsig[g]),
                 h->names[h->node_of[0]], sig_tag(ref), sig_len(ref), (unsigned long long)h->step,
                 (unsigned long long)h->group);
        return true;
    }
    return false;
}

kvc_err hier__fail(const kvc_hier *h, const hier_rec *r, kvc_hier_failure *why)
{
    if (why) {
        why->group = h->group;
        why->step = r->step;
        why->ranks = r->ranks;
        why->node = r->ranks ? (int32_t)h->node_of[lowest(r->ranks)] : r->node;
        why->dead = r->dead;
        why->mismatch = r->mismatch;
        why->pid = r->pid;
        why->timeout_ms = r->timeout_ms;
    }
    kvc_err e = r->code ? (kvc_err)r->code : KVC_E_PEER;
    return kvc_error_set(e, "%s", r->text);
}
