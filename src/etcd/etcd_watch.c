/*
 * etcd_watch.c - the watch stream of etcd_client.h: one POST to /v3/watch
 * whose answer is a stream of JSON messages (one per line), run on a curl
 * multi handle so that the stream can be judged while it is open.
 *
 * A stream that delivers nothing is either quiet or blind (its member
 * frozen, or cut off from the quorum while the TCP connection stays up:
 * the kernel still answers keep-alive probes of a SIGSTOPped process).  The
 * stream asks for progress notifications (progress_notify; etcd sends them
 * every --experimental-watch-progress-notify-interval, 10 minutes unless
 * set), and after watch_quiet_ms without any message the member holding it
 * is probed with a linearizable read of one key of the prefix, on a second
 * easy handle, within the request timeout: an answer means quiet (the
 * stream is current), no answer means blind, and the stream ends so that
 * the next one starts on the next member.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "etcd_internal.h"

struct watch_ctx {
    etcd *c;
    struct etcd_body buf; /* bytes of the stream not yet parsed */
    const struct etcd_watch_cb *cb;
    int64_t last_rev;
    uint64_t heard; /* monotonic ns: the last message, or the last probe answered */
    int stop;       /* a callback asked to end */
    int failed;     /* the stream said canceled / compacted / error */
    int created;    /* the watch was acknowledged */
};

/* The stream is current up to rev. */
static void heard(struct watch_ctx *w, int64_t rev)
{
    w->heard = kvc__mono_ns();
    if (w->cb->current)
        w->cb->current(w->cb->arg, rev);
}

/* Handle one JSON message of the stream. */
static void watch_message(struct watch_ctx *w, const char *text, size_t len)
{
    json_error_t je;
    json_t *j = json_loadb(text, len, 0, &je);
    if (!j)
        return;
    json_t *r = json_object_get(j, "result");
    json_t *err = json_object_get(j, "error");
    if (err || !r) {
        json_t *msg = json_is_object(err) ? json_object_get(err, "message") : err;
        etcd__set_err(w->c, "etcd watch: %s",
                      json_is_string(msg) ? json_string_value(msg) : "stream error");
        w->failed = 1;
        json_decref(j);
        return;
    }
    int64_t rev = etcd__get_i64(json_object_get(r, "header"), "revision");
    /* Every message counts: created, events, a progress notification (a
     * result with a header and nothing else). */
    heard(w, rev);
    if (json_is_true(json_object_get(r, "created")))
        w->created = 1;
    int64_t compact = etcd__get_i64(r, "compact_revision");
    if (compact || json_is_true(json_object_get(r, "canceled"))) {
        const char *why = json_string_value(json_object_get(r, "cancel_reason"));
        if (compact)
            etcd__set_err(w->c, "etcd watch: compacted (oldest revision kept %lld)",
                          (long long)compact);
        else
            etcd__set_err(w->c, "etcd watch canceled: %s", why ? why : "no reason given");
        w->failed = 1;
        json_decref(j);
        return;
    }
    json_t *evs = json_object_get(r, "events");
    size_t n = json_array_size(evs);
    if (n) {
        etcd_event *ev = calloc(n, sizeof *ev);
        size_t k = 0;
        for (size_t i = 0; ev && i < n; i++) {
            json_t *e = json_array_get(evs, i);
            const char *type = json_string_value(json_object_get(e, "type"));
            if (etcd__parse_kv(json_object_get(e, "kv"), &ev[k].kv))
                continue;
            ev[k].is_delete = type && !strcmp(type, "DELETE");
            if (ev[k].kv.mod_rev > w->last_rev)
                w->last_rev = ev[k].kv.mod_rev;
            k++;
        }
        if (ev && k && w->cb->events(w->cb->arg, ev, k, rev))
            w->stop = 1;
        for (size_t i = 0; ev && i < k; i++)
            etcd_kv_free(&ev[i].kv);
        free(ev);
    }
    json_decref(j);
}

/* The gateway writes one JSON object per message, each followed by a
 * newline; a message may arrive split across writes. */
static size_t on_watch_data(char *ptr, size_t size, size_t nmemb, void *arg)
{
    struct watch_ctx *w = arg;
    size_t n = size * nmemb;
    if (etcd__on_data(ptr, 1, n, &w->buf) != n)
        return 0;
    char *start = w->buf.data, *end = w->buf.data + w->buf.len;
    for (;;) {
        char *nl = memchr(start, '\n', (size_t)(end - start));
        if (!nl)
            break;
        if (nl > start)
            watch_message(w, start, (size_t)(nl - start));
        start = nl + 1;
        if (w->stop || w->failed)
            return 0; /* ends the transfer (CURLE_WRITE_ERROR) */
    }
    size_t rest = (size_t)(end - start);
    memmove(w->buf.data, start, rest);
    w->buf.len = rest;
    w->buf.data[rest] = '\0';
    return n;
}

/* Ask the member at url for one key of the prefix, linearizably (through
 * its leader's read index), on the probe handle.  1: it answered (even
 * with a refusal: it runs and reaches the quorum's answer), 0: no answer
 * within the request timeout, or one that names a lost leader or quorum. */
static int probe_member(etcd *c, const char *url, const char *body)
{
    json_t *resp = NULL;
    int k = etcd__exchange(c, c->probe, url, "/v3/kv/range", body, c->timeout_ms, &resp);
    json_decref(resp);
    return k != X_UNREACHABLE;
}

/* Run the stream on the member at url until it ends, a callback asks to
 * stop, or it turns out blind (*blind set).  The transfer's result. */
static CURLcode run_stream(etcd *c, const char *url, struct watch_ctx *w, const char *probe_body,
                           int *blind)
{
    CURLM *m = curl_multi_init();
    if (!m)
        return CURLE_OUT_OF_MEMORY;
    curl_multi_add_handle(m, c->curl);
    CURLcode cc = CURLE_OK;
    int running = 1;
    w->heard = kvc__mono_ns();
    while (running) {
        if (curl_multi_perform(m, &running) != CURLM_OK || !running)
            break;
        curl_multi_poll(m, NULL, 0, 100, NULL);
        if (w->cb->idle && w->cb->idle(w->cb->arg)) {
            w->stop = 1;
            break;
        }
        uint64_t quiet = (kvc__mono_ns() - w->heard) / 1000000;
        if (c->watch_quiet_ms && quiet >= (uint64_t)c->watch_quiet_ms) {
            if (!probe_member(c, url, probe_body)) {
                char why[ETCD_ERR_CAP];
                snprintf(why, sizeof why, "%s", c->err);
                etcd__set_err(c,
                              "etcd watch on %s: no event or progress notification for %llu ms "
                              "and the member did not answer a read: %.300s",
                              url, (unsigned long long)quiet, why);
                *blind = 1;
                break;
            }
            heard(w, 0);
        }
    }
    int left;
    for (CURLMsg *msg; (msg = curl_multi_info_read(m, &left));)
        if (msg->msg == CURLMSG_DONE)
            cc = msg->data.result;
    curl_multi_remove_handle(m, c->curl);
    curl_multi_cleanup(m);
    return cc;
}

int etcd_watch(etcd *c, const char *prefix, int64_t start_rev, const struct etcd_watch_cb *cb,
               int64_t *last_rev)
{
    json_t *cr = etcd__range_req(prefix);
    json_object_set_new(cr, "start_revision", etcd__i64_json(start_rev));
    json_object_set_new(cr, "progress_notify", json_true());
    json_t *req = json_pack("{s:o}", "create_request", cr);
    char *body = json_dumps(req, JSON_COMPACT);
    json_decref(req);
    json_t *pr = etcd__range_req(prefix);
    json_object_set_new(pr, "limit", etcd__i64_json(1));
    json_object_set_new(pr, "keys_only", json_true());
    char *probe_body = json_dumps(pr, JSON_COMPACT);
    json_decref(pr);
    struct watch_ctx w = {.c = c, .cb = cb, .last_rev = start_rev - 1};
    int rc = -1;
    for (size_t t = 0; t < c->nurls && body && probe_body; t++) {
        size_t i = (c->cur + t) % c->nurls;
        if (c->user && !c->token) {
            c->call_deadline = 0;
            int k = etcd__authenticate(c, c->urls[i]);
            if (k == X_UNREACHABLE)
                continue;
            if (k != X_OK)
                break;
        }
        struct curl_slist *hd = etcd__prepare(c, c->curl, c->urls[i], "/v3/watch", body, 0);
        curl_easy_setopt(c->curl, CURLOPT_WRITEFUNCTION, on_watch_data);
        curl_easy_setopt(c->curl, CURLOPT_WRITEDATA, &w);
        /* A member that vanishes without closing the connection: TCP
         * keep-alive probes end the stream within a few seconds. */
        curl_easy_setopt(c->curl, CURLOPT_TCP_KEEPALIVE, 1L);
        curl_easy_setopt(c->curl, CURLOPT_TCP_KEEPIDLE, 2L);
        curl_easy_setopt(c->curl, CURLOPT_TCP_KEEPINTVL, 1L);
        int blind = 0;
        CURLcode cc = run_stream(c, c->urls[i], &w, probe_body, &blind);
        curl_slist_free_all(hd);
        w.buf.len = 0;
        if (w.stop) {
            rc = 0;
            c->cur = i;
            break;
        }
        if (w.failed)
            break;
        if (blind) {
            c->cur = (i + 1) % c->nurls; /* the next stream starts elsewhere */
            break;
        }
        if (cc != CURLE_OK)
            etcd__set_err(c, "etcd watch on %s: %s", c->urls[i], curl_easy_strerror(cc));
        else
            etcd__set_err(c, "etcd watch on %s: the stream ended", c->urls[i]);
        if (w.created) {
            c->cur = (i + 1) % c->nurls; /* it worked, then the member went */
            break;
        }
    }
    free(w.buf.data);
    free(body);
    free(probe_body);
    if (last_rev)
        *last_rev = w.last_rev;
    return rc;
}
