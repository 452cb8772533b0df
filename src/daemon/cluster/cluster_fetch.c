/*
 * cluster_fetch.c - large entries' bytes fetched from their origin
 * kvcoordd (GET /get_transfer_engine_info or /get_parallelism_config, with
 * ?role= for a role other than the default) on a thread of their own, so
 * that the cluster thread never waits for a peer.
 *
 * The cluster thread asks (cluster__fetch_ask: a job with the record's
 * digest), the fetch thread runs the jobs on one curl multi handle, at
 * most FETCH_PER_PEER at a time per origin node and FETCH_MAX in all (each
 * at most FETCH_TIMEOUT_MS), checks each answer against its digest and
 * hands the job back through the inbox; the cluster thread takes the bytes
 * if the record has not changed since (cluster__fetched).  A frozen peer
 * holds its own slot until its fetch times out: its entries wait, nobody
 * else's.
 */

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "cluster_internal.h"
#include "log.h"

#define FETCH_TIMEOUT_MS 5000
#define FETCH_RETRY_MS 1000
#define FETCH_PER_PEER 1
#define FETCH_MAX 8

/* ---- the cluster thread's side ------------------------------------------- */

void cluster__fetch_ask(struct cluster *c, unsigned ti, uint32_t rank, struct remote *r)
{
    if (!r->url[0] || r->fetching)
        return;
    struct fetch_job *j = calloc(1, sizeof *j);
    if (!j) {
        r->fetch_retry_at = kvc__mono_ns() + FETCH_RETRY_MS * 1000000ull;
        return;
    }
    j->ti = ti;
    j->rank = rank;
    snprintf(j->node, sizeof j->node, "%s", r->node);
    snprintf(j->url, sizeof j->url, "%s/%s?rank=%u%s%s", r->url,
             t_kind(ti) == EK_INFO ? "get_transfer_engine_info" : "get_parallelism_config", rank,
             ti % CLUSTER_ROLES ? "&role=" : "", ti % CLUSTER_ROLES ? t_role(c, ti) : "");
    snprintf(j->digest, sizeof j->digest, "%s", r->digest);
    snprintf(j->sid, sizeof j->sid, "%s", r->sid);
    cluster__entry_label(c, ti, rank, j->label, sizeof j->label);
    j->pcfg = t_kind(ti) == EK_PCFG;
    /* The answer: the stored bytes, with the JSON-escaped session_id around
     * them for a transfer-engine info (at most 6 bytes per byte). */
    j->limit = c->cfg.max_info_bytes + 6 * KVC_SESSION_ID_MAX + 256;
    r->fetching = 1;
    pthread_mutex_lock(&c->fx.mu);
    struct fetch_job **pp = &c->fx.queue;
    while (*pp)
        pp = &(*pp)->next;
    *pp = j;
    pthread_mutex_unlock(&c->fx.mu);
    curl_multi_wakeup(c->fx.multi);
}

void cluster__fetch_due(struct cluster *c)
{
    uint64_t now = kvc__mono_ns();
    for (unsigned ti = 0; ti < NTABLES; ti++)
        for (uint32_t r = 0; c->tab.slots[ti] && r < c->cfg.max_ranks; r++) {
            struct rslot *s = c->tab.slots[ti][r];
            for (struct remote *x = s ? s->remotes : NULL; x; x = x->next)
                if (!x->info && x->url[0] && !x->fetching && now >= x->fetch_retry_at)
                    cluster__fetch_ask(c, ti, r, x);
        }
}

void cluster__fetched(struct cluster *c, struct fetch_job *j)
{
    struct rslot *s = slot_at(c, j->ti, j->rank);
    struct remote *r = s ? cluster__find_remote(s, j->node, NULL) : NULL;
    if (r)
        r->fetching = 0; /* a record has at most one job out: this one */
    if (!r || r->info || strcmp(r->digest, j->digest) || strcmp(r->sid, j->sid))
        return; /* changed or gone meanwhile: cluster__fetch_due asks again if needed */
    if (!j->info) {
        r->fetch_retry_at = kvc__mono_ns() + FETCH_RETRY_MS * 1000000ull;
        return;
    }
    r->info = j->info;
    r->info_len = j->info_len;
    j->info = NULL;
    cluster__apply_winner(c, j->ti, j->rank, NULL);
}

void cluster__fetch_free(struct fetch_job *j)
{
    while (j) {
        struct fetch_job *next = j->next;
        free(j->info);
        free(j);
        j = next;
    }
}

/* ---- the fetch thread ---------------------------------------------------- */

/* A transfer: the answer so far, at most limit bytes (a peer's url may
 * answer anything). */
struct xfer {
    CURL *h;
    char *p;
    size_t len, cap, limit;
};

static size_t fetch_write(char *data, size_t size, size_t nmemb, void *arg)
{
    struct xfer *b = arg;
    size_t n = size * nmemb;
    if (n > b->limit - b->len)
        return 0; /* too large: curl stops with CURLE_WRITE_ERROR */
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 64 * 1024;
        while (cap < b->len + n + 1)
            cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p)
            return 0;
        b->p = p, b->cap = cap;
    }
    memcpy(b->p + b->len, data, n);
    b->len += n;
    b->p[b->len] = '\0';
    return n;
}

static int start_job(CURLM *m, struct fetch_job *j)
{
    struct xfer *x = calloc(1, sizeof *x);
    if (!x || !(x->h = curl_easy_init())) {
        free(x);
        snprintf(j->err, sizeof j->err, "out of memory");
        return -1;
    }
    x->limit = j->limit;
    CURL *h = x->h;
    curl_easy_setopt(h, CURLOPT_URL, j->url);
    curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, (long)FETCH_TIMEOUT_MS);
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, 1000L);
    curl_easy_setopt(h, CURLOPT_MAXFILESIZE_LARGE, (curl_off_t)x->limit);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, fetch_write);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, x);
    curl_easy_setopt(h, CURLOPT_PRIVATE, j);
    j->xfer = x;
    if (curl_multi_add_handle(m, h) != CURLM_OK) {
        curl_easy_cleanup(h);
        free(x);
        j->xfer = NULL;
        snprintf(j->err, sizeof j->err, "cannot start the transfer");
        return -1;
    }
    return 0;
}

/* The bytes of a finished transfer, checked against the job's digest:
 * j->info set, or j->err says why not. */
static void finish_job(struct cluster *c, struct fetch_job *j, CURLcode cc)
{
    struct xfer *b = j->xfer;
    long status = 0;
    curl_easy_getinfo(b->h, CURLINFO_RESPONSE_CODE, &status);
    const char *why = "bad answer";
    const char *info = NULL;
    size_t ilen = 0;
    char sidbuf[KVC_SESSION_ID_MAX + 1] = "";
    json_t *sid = NULL;
    if (cc != CURLE_OK) {
        why = cc == CURLE_WRITE_ERROR || cc == CURLE_FILESIZE_EXCEEDED
                  ? "answer larger than this segment's max info bytes"
                  : curl_easy_strerror(cc);
    } else if (status != 200) {
        why = "not 200";
    } else if (j->pcfg) {
        info = b->p ? b->p : "", ilen = b->len; /* the stored object, verbatim */
    } else {
        /* {"rank":N,"remote_instance_transfer_engine_info":["<sid>",<info>]}
         * with info verbatim: take the bytes between the session_id string
         * and the closing "]}" (parsing and re-serialising would change
         * them). */
        const char *tag = "\"remote_instance_transfer_engine_info\":[";
        char *at = b->p ? strstr(b->p, tag) : NULL;
        if (at) {
            at += strlen(tag);
            json_error_t je;
            sid = json_loadb(at, b->len - (size_t)(at - b->p),
                             JSON_DECODE_ANY | JSON_DISABLE_EOF_CHECK, &je);
            char *p = at + je.position;
            if (json_is_string(sid) && json_string_length(sid) <= KVC_SESSION_ID_MAX && *p == ',' &&
                b->len >= 2 && !memcmp(b->p + b->len - 2, "]}", 2) && p + 1 <= b->p + b->len - 2) {
                snprintf(sidbuf, sizeof sidbuf, "%s", json_string_value(sid));
                info = p + 1, ilen = (size_t)(b->p + b->len - 2 - (p + 1));
            }
        }
    }
    if (info) {
        char dg[DIGEST_HEX];
        cluster__digest_of(sidbuf, info, ilen, dg);
        if (!strcmp(dg, j->digest) && !strcmp(sidbuf, j->sid)) {
            if ((j->info = malloc(ilen + 1))) {
                memcpy(j->info, info, ilen);
                j->info[ilen] = '\0';
                j->info_len = ilen;
            } else {
                why = "out of memory";
            }
        } else {
            why = "digest mismatch (the origin changed it since: a newer record follows)";
            STAT_ADD(c, digest_mismatches, 1);
        }
    }
    json_decref(sid);
    if (!j->info) {
        snprintf(j->err, sizeof j->err, "%s", why);
        STAT_ADD(c, fetch_failures, 1);
        log_event(LOG_WARN, "mirror_fetch_failed", "%s origin=%s url=%s err=\"%s\"", j->label,
                  j->node, j->url, why);
    }
    curl_multi_remove_handle(c->fx.multi, b->h);
    curl_easy_cleanup(b->h);
    free(b->p);
    free(b);
    j->xfer = NULL;
}

/* Hand a finished job back to the cluster thread. */
static void hand_back(struct cluster *c, struct fetch_job *j)
{
    pthread_mutex_lock(&c->in.mu);
    j->next = c->in.fetched;
    c->in.fetched = j;
    pthread_cond_signal(&c->in.cv);
    pthread_mutex_unlock(&c->in.mu);
}

static size_t running_for(struct fetch_job *active, const char *node)
{
    size_t n = 0;
    for (; active; active = active->next)
        n += !strcmp(active->node, node);
    return n;
}

void *cluster__fetch_main(void *arg)
{
    struct cluster *c = arg;
    CURLM *m = c->fx.multi;
    struct fetch_job *active = NULL;
    size_t nactive = 0;
    for (;;) {
        /* Start what the bounds allow, oldest first. */
        pthread_mutex_lock(&c->fx.mu);
        int stop = c->fx.stop;
        for (struct fetch_job **pp = &c->fx.queue; *pp && nactive < FETCH_MAX && !stop;) {
            struct fetch_job *j = *pp;
            if (running_for(active, j->node) >= FETCH_PER_PEER) {
                pp = &j->next;
                continue;
            }
            *pp = j->next;
            pthread_mutex_unlock(&c->fx.mu);
            STAT_ADD(c, fetches, 1);
            if (start_job(m, j)) {
                STAT_ADD(c, fetch_failures, 1);
                hand_back(c, j);
            } else {
                j->next = active;
                active = j;
                nactive++;
            }
            pthread_mutex_lock(&c->fx.mu);
            pp = &c->fx.queue; /* the queue may have grown meanwhile */
        }
        pthread_mutex_unlock(&c->fx.mu);
        if (stop)
            break;
        int running = 0;
        curl_multi_perform(m, &running);
        int left;
        for (CURLMsg *msg; (msg = curl_multi_info_read(m, &left));) {
            if (msg->msg != CURLMSG_DONE)
                continue;
            struct fetch_job *j = NULL;
            curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, (char **)&j);
            CURLcode cc = msg->data.result;
            for (struct fetch_job **pp = &active; *pp; pp = &(*pp)->next)
                if (*pp == j) {
                    *pp = j->next;
                    nactive--;
                    break;
                }
            finish_job(c, j, cc);
            hand_back(c, j);
        }
        curl_multi_poll(m, NULL, 0, 100, NULL);
    }
    /* Stopping: what runs or waits is dropped. */
    while (active) {
        struct fetch_job *j = active;
        active = j->next;
        struct xfer *x = j->xfer;
        curl_multi_remove_handle(m, x->h);
        curl_easy_cleanup(x->h);
        free(x->p);
        free(x);
        j->next = NULL;
        cluster__fetch_free(j);
    }
    return NULL;
}
