/* torture_model.c - the reference for kvcoord-torture: from the workers'
 * logs, what every rank must hold and which failure records must exist. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "torture.h"

enum { K_REG = 1, K_WD = 2 };

static void pend(struct rank_model *r, int kind, uint64_t v)
{
    if (r->npending < sizeof r->pending / sizeof r->pending[0]) {
        r->pending[r->npending].kind = kind;
        r->pending[r->npending].value = v;
        r->npending++;
    }
}

void model_line(struct model *m, const char *line)
{
    char a, k;
    unsigned rank = 0;
    unsigned long long v = 0;
    m->ops++;
    if (line[0] == 'X') { /* a worker read a torn room */
        m->torn++;
        fprintf(stderr, "torn read: %s", line);
        return;
    }
    if (sscanf(line, "%c %c %u %llu", &a, &k, &rank, &v) < 3 && sscanf(line, "%c %c", &a, &k) != 2)
        return;
    if (k == 'F') {
        sscanf(line, "C F %llu", &v);
        if (m->nkept < sizeof m->kept_values / sizeof m->kept_values[0])
            m->kept_values[m->nkept++] = v;
        return;
    }
    if (rank >= T_RANKS)
        return;
    struct rank_model *r = &m->ranks[rank];
    if (a == 'A') {
        pend(r, k == 'R' ? K_REG : K_WD, v);
        return;
    }
    /* A commit: the operations started before it are settled.  A
     * withdrawal of an empty or withdrawn rank fails, so commits of 'W'
     * always follow a registration. */
    r->committed = k == 'R' ? K_REG : K_WD;
    r->value = v;
    r->npending = 0;
}

static int allowed(const struct rank_model *r, int state, uint64_t v)
{
    if (r->committed == 0 && state == 0)
        return 1;
    if (r->committed == K_REG && state == K_REG && r->value == v)
        return 1;
    if (r->committed == K_WD && state == K_WD)
        return 1;
    for (size_t i = 0; i < r->npending; i++) {
        if (r->pending[i].kind == K_REG && state == K_REG && r->pending[i].value == v)
            return 1;
        if (r->pending[i].kind == K_WD && state == K_WD)
            return 1;
    }
    return 0;
}

static size_t check_rank(struct rank_model *r, kvc_segment *seg, uint32_t rank, unsigned round)
{
    static kvc_rank_info ri;
    kvc_err e = kvc_rank_lookup(seg, rank, &ri);
    int state = e == KVC_OK ? K_REG : e == KVC_E_WITHDRAWN ? K_WD : e == KVC_E_NOENT ? 0 : -1;
    unsigned long long v = 0, v2 = 0, v3 = 0;
    if (state == K_REG) {
        const char *end = strstr(ri.info, "\"end\":[");
        if (sscanf(ri.session_id, "t:%llu", &v) != 1 ||
            sscanf(ri.info, "{\"v\":[%llu,", &v2) != 1 || !end ||
            sscanf(end, "\"end\":[%llu,", &v3) != 1 || v != v2 || v != v3) {
            fprintf(stderr, "round %u: rank %u holds a torn value (session %s)\n", round, rank,
                    ri.session_id);
            return 1;
        }
    }
    if (state < 0 || !allowed(r, state, v)) {
        fprintf(stderr,
                "round %u: rank %u lost: state %d value %llu; committed %d value %llu, "
                "%zu pending (%s)\n",
                round, rank, state, v, r->committed, (unsigned long long)r->value, r->npending,
                kvc_last_error());
        return 1;
    }
    /* What is stored is now the committed truth for the next round. */
    r->committed = state;
    r->value = v;
    r->npending = 0;
    return 0;
}

size_t model_check(struct model *m, kvc_segment *seg, unsigned round)
{
    size_t lost = 0;
    for (uint32_t r = 0; r < T_RANKS; r++)
        lost += check_rank(&m->ranks[r], seg, r, round);
    static kvc_failure_info recent[KVC_FAILURE_RING];
    size_t n = 0;
    if (kvc_failures_recent(seg, recent, KVC_FAILURE_RING, &n) != KVC_OK)
        return lost + 1;
    for (size_t k = 0; k < m->nkept; k++) {
        char want[40];
        snprintf(want, sizeof want, "t:%llu", (unsigned long long)m->kept_values[k]);
        int found = 0;
        for (size_t i = 0; i < n && !found; i++)
            found = !strcmp(recent[i].reason, want);
        if (!found) {
            fprintf(stderr, "round %u: failure record %s was kept, then lost\n", round, want);
            lost++;
        }
    }
    m->nkept = 0;
    return lost;
}
