/*
 * pd_mirror.c - see pd_mirror.h.  A handful of tables (one per prefill
 * node), kept in an array searched by name.
 */
#include "pd_mirror.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct entry {
    struct pd_table t;
    int stale;
};

struct pd_mirror {
    pthread_mutex_t mu;
    struct entry *e;
    size_t n, cap;
};

struct pd_mirror *pd_mirror_new(void)
{
    struct pd_mirror *m = calloc(1, sizeof *m);
    if (m)
        pthread_mutex_init(&m->mu, NULL);
    return m;
}

void pd_mirror_free(struct pd_mirror *m)
{
    if (!m)
        return;
    pd_mirror_clear(m);
    free(m->e);
    pthread_mutex_destroy(&m->mu);
    free(m);
}

/* The entry of node, or NULL (mu held). */
static struct entry *find(struct pd_mirror *m, const char *node)
{
    for (size_t i = 0; i < m->n; i++)
        if (!strcmp(m->e[i].t.node, node))
            return &m->e[i];
    return NULL;
}

int pd_mirror_put(struct pd_mirror *m, struct pd_table *t)
{
    int rc = 0;
    pthread_mutex_lock(&m->mu);
    struct entry *x = find(m, t->node);
    if (!x && m->n == m->cap) {
        size_t cap = m->cap ? m->cap * 2 : 8;
        struct entry *p = realloc(m->e, cap * sizeof *p);
        if (p)
            m->e = p, m->cap = cap;
    }
    if (!x && m->n < m->cap) {
        x = &m->e[m->n++];
        memset(x, 0, sizeof *x);
    }
    if (x) {
        pd_table_free(&x->t);
        x->t = *t;
        x->stale = 0;
        memset(t, 0, sizeof *t);
    } else {
        pd_table_free(t);
        rc = -1;
    }
    pthread_mutex_unlock(&m->mu);
    return rc;
}

/* Remove entry i (mu held). */
static void drop_at(struct pd_mirror *m, size_t i)
{
    pd_table_free(&m->e[i].t);
    m->e[i] = m->e[--m->n];
}

int pd_mirror_remove(struct pd_mirror *m, const char *node)
{
    pthread_mutex_lock(&m->mu);
    struct entry *x = find(m, node);
    if (x)
        drop_at(m, (size_t)(x - m->e));
    pthread_mutex_unlock(&m->mu);
    return x != NULL;
}

size_t pd_mirror_clear(struct pd_mirror *m)
{
    pthread_mutex_lock(&m->mu);
    size_t n = m->n;
    while (m->n)
        drop_at(m, m->n - 1);
    pthread_mutex_unlock(&m->mu);
    return n;
}

void pd_mirror_mark_stale(struct pd_mirror *m)
{
    pthread_mutex_lock(&m->mu);
    for (size_t i = 0; i < m->n; i++)
        m->e[i].stale = 1;
    pthread_mutex_unlock(&m->mu);
}

size_t pd_mirror_drop_stale(struct pd_mirror *m)
{
    size_t n = 0;
    pthread_mutex_lock(&m->mu);
    for (size_t i = m->n; i-- > 0;)
        if (m->e[i].stale) {
            drop_at(m, i);
            n++;
        }
    pthread_mutex_unlock(&m->mu);
    return n;
}

/* The nodes' names, comma-separated, into names[0..cap) (mu held). */
static void list_names(const struct pd_mirror *m, char *names, size_t cap)
{
    size_t at = 0;
    if (!cap)
        return;
    names[0] = '\0';
    for (size_t i = 0; i < m->n; i++) {
        size_t need = strlen(m->e[i].t.node) + (at ? 2 : 0);
        if (at + need + 4 >= cap) {
            snprintf(names + at, cap - at, "%s...", at ? ", " : "");
            return;
        }
        at += (size_t)snprintf(names + at, cap - at, "%s%s", at ? ", " : "", m->e[i].t.node);
    }
}

enum pd_pick pd_mirror_pick(struct pd_mirror *m, const char *node, kvc_pd_status *st,
                            char *node_out, char *names, size_t cap)
{
    enum pd_pick rc;
    pthread_mutex_lock(&m->mu);
    struct entry *x = node ? find(m, node) : m->n == 1 ? &m->e[0] : NULL;
    if (x) {
        *st = x->t.st;
        snprintf(node_out, PD_NODE_MAX + 1, "%s", x->t.node);
        rc = PD_PICK_OK;
    } else {
        rc = node ? PD_PICK_UNKNOWN : m->n ? PD_PICK_MANY : PD_PICK_NONE;
        list_names(m, names, cap);
    }
    pthread_mutex_unlock(&m->mu);
    return rc;
}

int pd_mirror_lookup(struct pd_mirror *m, const char *node, int32_t dp, int32_t cp, int32_t tp,
                     int32_t pp, kvc_pd_rank *out)
{
    pthread_mutex_lock(&m->mu);
    struct entry *x = find(m, node);
    const kvc_pd_rank *p = x ? pd_table_find(&x->t, dp, cp, tp, pp) : NULL;
    if (p)
        *out = *p;
    pthread_mutex_unlock(&m->mu);
    return p ? 0 : -1;
}

size_t pd_mirror_ranks(struct pd_mirror *m, const char *node, kvc_pd_rank *out, size_t cap)
{
    pthread_mutex_lock(&m->mu);
    struct entry *x = find(m, node);
    size_t n = x ? x->t.n : 0;
    for (size_t i = 0; i < n && i < cap; i++)
        out[i] = x->t.ranks[i];
    pthread_mutex_unlock(&m->mu);
    return n;
}

void pd_mirror_counts(struct pd_mirror *m, size_t *tables, size_t *live)
{
    pthread_mutex_lock(&m->mu);
    *tables = m->n;
    *live = 0;
    for (size_t i = 0; i < m->n; i++)
        *live += m->e[i].t.st.registered;
    pthread_mutex_unlock(&m->mu);
}

json_t *pd_mirror_json(struct pd_mirror *m)
{
    json_t *a = json_array();
    pthread_mutex_lock(&m->mu);
    for (size_t i = 0; a && i < m->n; i++) {
        const struct pd_table *t = &m->e[i].t;
        json_array_append_new(
            a, json_pack("{s:s, s:s, s:b, s:I, s:I, s:I, s:i, s:i, s:i, s:i}", "node", t->node,
                         "url", t->url, "ready", t->st.ready, "registered",
                         (json_int_t)t->st.registered, "expected", (json_int_t)t->st.expected,
                         "withdrawn", (json_int_t)t->st.withdrawn, "attn_tp_size",
                         (int)t->st.attn_tp_size, "attn_cp_size", (int)t->st.attn_cp_size,
                         "dp_size", (int)t->st.dp_size, "pp_size", (int)t->st.pp_size));
    }
    pthread_mutex_unlock(&m->mu);
    return a;
}
