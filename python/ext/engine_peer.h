/*
 * engine_peer.h - small tables of kvcoord.mooncake's engine core
 * (engine_core.c): the peers by session id with their kvt_peer and the
 * time of their last handshake, this engine's registered regions, and the
 * two calls into the transfer engine that depend on what this build of it
 * offers (descriptor fetch, READ).  Every function here runs under the
 * core's mutex, except mce_fetch_descriptor (network; thread-safe).
 */
#ifndef KVCOORD_EXT_ENGINE_PEER_H
#define KVCOORD_EXT_ENGINE_PEER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvcoord/transfer.h"

typedef struct mce_peer {
    char sid[KVC_SESSION_ID_MAX + 1];
    kvt_peer *p;         /* NULL: fetch the descriptor before the next call */
    uint64_t fetched_ns; /* CLOCK_MONOTONIC of the last handshake attempt */
    char why[256];       /* why its handshake failed ("" when it did not) */
} mce_peer;

typedef struct mce_peers {
    mce_peer *v;
    size_t n, cap;
} mce_peers;

void mce_peers_init(mce_peers *t);
void mce_peers_free(mce_peers *t);
mce_peer *mce_peer_lookup(mce_peers *t, const char *sid);
/* Record a handshake's outcome for sid (p NULL: it failed, why says why). */
void mce_peer_fetched(mce_peers *t, const char *sid, kvt_peer *p, const char *why);
/* The next call to sid fetches its descriptor again. */
void mce_peer_forget(mce_peers *t, const char *sid);
/* A refetch after a refusal is allowed at most once a second per peer. */
bool mce_peer_may_refetch(const mce_peer *pe, uint64_t now_ns);

typedef struct mce_region {
    uint64_t addr, len;
} mce_region;

typedef struct mce_regions {
    mce_region *v;
    size_t n, cap;
} mce_regions;

int mce_regions_add(mce_regions *t, uint64_t addr, uint64_t len); /* 0 or -1 (memory) */
uint64_t mce_regions_len(const mce_regions *t, uint64_t addr);    /* 0: none starts there */
void mce_regions_del(mce_regions *t, uint64_t addr);

/* Fetch the descriptor of the engine at sid (its listen port: the P2P
 * handshake), within timeout_ms.  0 with *json malloc()ed, or -1 with the
 * reason in why. */
int mce_fetch_descriptor(const char *sid, const char *token, uint32_t timeout_ms, char **json,
                         char *why, size_t cap);

/* 1 when this build's transfer engine has READ (kvt_submit_read), and
 * descriptor fetch (kvt_descriptor_fetch). */
extern const int MCE_HAVE_READ, MCE_HAVE_FETCH;

/* kvt_submit (MCE_WRITE) or kvt_submit_read (MCE_READ) of one whole room. */
kvc_err mce_kvt_submit(kvt_engine *e, kvt_peer *p, uint64_t room, const kvt_run *runs, size_t n,
                       int op);

#endif
