/*
 * engine_peer.c - the peer and region tables of kvcoord.mooncake's engine
 * core, and its calls into the transfer engine's descriptor fetch and
 * READ (engine_peer.h).
 */
#include "engine_peer.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine_core.h"

void mce_peers_init(mce_peers *t) { memset(t, 0, sizeof *t); }

void mce_peers_free(mce_peers *t)
{
    free(t->v);
    memset(t, 0, sizeof *t);
}

mce_peer *mce_peer_lookup(mce_peers *t, const char *sid)
{
    for (size_t i = 0; i < t->n; i++)
        if (!strcmp(t->v[i].sid, sid))
            return &t->v[i];
    return NULL;
}

void mce_peer_fetched(mce_peers *t, const char *sid, kvt_peer *p, const char *why)
{
    mce_peer *pe = mce_peer_lookup(t, sid);
    if (!pe) {
        if (t->n == t->cap) {
            size_t cap = t->cap ? 2 * t->cap : 16;
            mce_peer *v = realloc(t->v, cap * sizeof *v);
            if (!v)
                return; /* not cached: the next call fetches again */
            t->v = v;
            t->cap = cap;
        }
        pe = &t->v[t->n++];
        memset(pe, 0, sizeof *pe);
        snprintf(pe->sid, sizeof pe->sid, "%s", sid);
    }
    pe->p = p;
    snprintf(pe->why, sizeof pe->why, "%s", p ? "" : why);
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    pe->fetched_ns = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

void mce_peer_forget(mce_peers *t, const char *sid)
{
    mce_peer *pe = mce_peer_lookup(t, sid);
    if (pe)
        pe->p = NULL;
}

bool mce_peer_may_refetch(const mce_peer *pe, uint64_t now_ns)
{
    return pe && now_ns - pe->fetched_ns > 1000000000ull;
}

int mce_regions_add(mce_regions *t, uint64_t addr, uint64_t len)
{
    if (t->n == t->cap) {
        size_t cap = t->cap ? 2 * t->cap : 64;
        mce_region *v = realloc(t->v, cap * sizeof *v);
        if (!v)
            return -1;
        t->v = v;
        t->cap = cap;
    }
    t->v[t->n++] = (mce_region){addr, len};
    return 0;
}

uint64_t mce_regions_len(const mce_regions *t, uint64_t addr)
{
    for (size_t i = 0; i < t->n; i++)
        if (t->v[i].addr == addr)
            return t->v[i].len;
    return 0;
}

void mce_regions_del(mce_regions *t, uint64_t addr)
{
    for (size_t i = 0; i < t->n; i++)
        if (t->v[i].addr == addr) {
            t->v[i] = t->v[--t->n];
            return;
        }
}

#ifdef KVT_HAVE_DESCRIPTOR_FETCH
const int MCE_HAVE_FETCH = 1;
int mce_fetch_descriptor(const char *sid, const char *token, uint32_t timeout_ms, char **json,
                         char *why, size_t cap)
{
    if (kvt_descriptor_fetch(sid, token, (int)timeout_ms, json) == KVC_OK)
        return 0;
    snprintf(why, cap, "%s", kvc_last_error());
    return -1;
}
#else
const int MCE_HAVE_FETCH = 0;
int mce_fetch_descriptor(const char *sid, const char *token, uint32_t timeout_ms, char **json,
                         char *why, size_t cap)
{
    (void)sid;
    (void)token;
    (void)timeout_ms;
    *json = NULL;
    snprintf(why, cap, "this build's transfer engine cannot fetch descriptors");
    return -1;
}
#endif

#ifdef KVT_HAVE_SUBMIT_READ
const int MCE_HAVE_READ = 1;
#else
const int MCE_HAVE_READ = 0;
#endif

kvc_err mce_kvt_submit(kvt_engine *e, kvt_peer *p, uint64_t room, const kvt_run *runs, size_t n,
                       int op)
{
#ifdef KVT_HAVE_SUBMIT_READ
    if (op == MCE_READ)
        return kvt_submit_read(e, p, room, runs, n, 0);
#else
    if (op == MCE_READ)
        return kvc_error_set(KVC_E_INVAL, "no READ in this build");
#endif
    return kvt_submit(e, p, room, runs, n, 0);
}
