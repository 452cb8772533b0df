/*
 * cluster_push.c - a room failure recorded on this node pushed straight to
 * the kvcoordd of every other node that follows the room (POST
 * /cluster/room_failure at the node's advertise URL), beside its create-
 * only put in etcd, so that the decode side learns of it without waiting
 * for etcd's commit (a quorum's fsyncs).
 *
 * The room waiter wakes the push thread on a new failure record; the push
 * thread reads the segment's failure ring, and for each failure of this
 * node finds the nodes that follow its room (follows/<node>/<room>, the
 * cluster thread's map, under its lock) and their URLs (nodes/<node>),
 * and sends the record (the same JSON as etcd's rooms/<room> value) on one
 * curl multi handle (keep-alive connections per peer, at most
 * PUSH_MAX at a time, each at most PUSH_TIMEOUT_MS) with this node's HTTP
 * token, and counts the answers.  It never waits for etcd: the cluster
 * thread may be inside an etcd call (a commit, a keep-alive) when the
 * failure is recorded.  Nothing waits for a push and nothing is retried:
 * etcd's record follows in any case and is the one that settles the room
 * cluster-wide.
 *
 * The receiving node (cluster_push_receive, on an HTTP thread) checks the
 * record as one read from etcd and takes it only into a room without a
 * failure record (kvc_room_fail_mirror_first): a push never replaces a
 * record, so a late push of a node that lost etcd's race cannot displace
 * the winner; the winner's etcd event replaces a push that lost
 * (kvc_room_fail_mirror), and the same record arriving twice (push, then
 * etcd) changes nothing.
 */

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cluster_internal.h"
#include "log.h"

#define PUSH_TIMEOUT_MS 1000
#define PUSH_CONNECT_MS 500
#define PUSH_MAX 32
#define PUSH_QUEUE_MAX 4096

/* ---- the room waiter's side ---------------------------------------------- */

void cluster__push_wake(struct cluster *c)
{
    pthread_mutex_lock(&c->px.mu);
    c->px.scan = 1;
    pthread_mutex_unlock(&c->px.mu);
    curl_multi_wakeup(c->px.multi);
}

/* ---- the push thread ----------------------------------------------------- */

/* The URL of node's kvcoordd, from the nodes/<node> records (the figures'
 * copy); 0, or -1 when the node has none. */
static int node_url(struct cluster *c, const char *node, char *url, size_t cap)
{
    int rc = -1;
    pthread_mutex_lock(&c->fig.mu);
    for (size_t k = 0; k < c->fig.nnodes_copy; k++)
        if (!strcmp(c->fig.nodes_copy[k].name, node) && c->fig.nodes_copy[k].url[0]) {
            snprintf(url, cap, "%s", c->fig.nodes_copy[k].url);
            rc = 0;
        }
    pthread_mutex_unlock(&c->fig.mu);
    if (!rc && strncmp(url, "http://", 7) && strncmp(url, "https://", 8))
        rc = -1;
    return rc;
}

/* Queue one failure's pushes, one per follower. */
static void queue_failure(struct cluster *c, const kvc_failure_info *f)
{
    char nodes[16][CLUSTER_NAME_MAX + 1];
    size_t n = cluster__room_followers(c, f->room, nodes, 16);
    if (!n)
        return;
    struct pending_room p = {f->room, f->origin_rank, f->code, f->origin_pid, f->time_ns, ""};
    snprintf(p.reason, sizeof p.reason, "%s", f->reason);
    char *record = cluster__room_record(c, &p);
    for (size_t i = 0; record && i < n; i++) {
        char url[URL_MAX];
        if (node_url(c, nodes[i], url, sizeof url))
            continue;
        struct push_job *j = c->px.nqueued < PUSH_QUEUE_MAX ? calloc(1, sizeof *j) : NULL;
        if (!j || !(j->body = strdup(record))) {
            free(j);
            STAT_ADD(c, push_failures, 1);
            continue;
        }
        snprintf(j->node, sizeof j->node, "%s", nodes[i]);
        snprintf(j->url, sizeof j->url, "%s/cluster/room_failure", url);
        *c->px.tail = j;
        c->px.tail = &j->next;
        c->px.nqueued++;
    }
    free(record);
}

/* The failures recorded on this node since the last look, pushed. */
static void scan(struct cluster *c)
{
    size_t n;
    kvc_failure_info *f = cluster__failures_since(c, &c->px.seen, &n);
    if (!f)
        return;
    for (size_t i = n; i-- > 0;) /* oldest first */
        if (!f[i].from_another_node)
            queue_failure(c, &f[i]);
    free(f);
}

static size_t discard(char *data, size_t size, size_t nmemb, void *arg)
{
    (void)data, (void)arg;
    return size * nmemb;
}

static void free_job(struct push_job *j)
{
    free(j->body);
    free(j);
}

void cluster__push_free(struct push_job *j)
{
    while (j) {
        struct push_job *next = j->next;
        free_job(j);
        j = next;
    }
}

static int start_push(struct cluster *c, struct push_job *j)
{
    CURL *h = curl_easy_init();
    if (!h)
        return -1;
    curl_easy_setopt(h, CURLOPT_URL, j->url);
    curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, (long)PUSH_TIMEOUT_MS);
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, (long)PUSH_CONNECT_MS);
    curl_easy_setopt(h, CURLOPT_POSTFIELDS, j->body);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, c->px.headers);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, discard);
    curl_easy_setopt(h, CURLOPT_PRIVATE, j);
    curl_easy_setopt(h, CURLOPT_TCP_NODELAY, 1L);
    if (curl_multi_add_handle(c->px.multi, h) != CURLM_OK) {
        curl_easy_cleanup(h);
        return -1;
    }
    j->h = h;
    return 0;
}

static void finish_push(struct cluster *c, struct push_job *j, CURLcode cc)
{
    long status = 0;
    curl_easy_getinfo(j->h, CURLINFO_RESPONSE_CODE, &status);
    if (cc == CURLE_OK && status == 200) {
        STAT_ADD(c, pushes, 1);
    } else {
        STAT_ADD(c, push_failures, 1);
        /* One line per peer's trouble, not one per room: the first failure
         * after a success, then every 1000th. */
        if (c->px.failed_in_row++ % 1000 == 0)
            log_event(LOG_WARN, "room_push_failed",
                      "node=%s url=%s status=%ld err=\"%s\" note=\"the failure still crosses "
                      "through etcd\"",
                      j->node, j->url, status,
                      cc != CURLE_OK  ? curl_easy_strerror(cc)
                      : status == 401 ? "401: the nodes' HTTP tokens differ"
                                      : "not 200");
        return;
    }
    c->px.failed_in_row = 0;
}

void *cluster__push_main(void *arg)
{
    struct cluster *c = arg;
    CURLM *m = c->px.multi;
    struct push_job *active = NULL;
    size_t nactive = 0;
    kvc_segment_info si;
    if (kvc_segment_stat(c->cfg.seg, &si) == KVC_OK)
        c->px.seen = si.failures_total; /* the failures from now on */
    for (;;) {
        pthread_mutex_lock(&c->px.mu);
        int stop = c->px.stop, look = c->px.scan;
        c->px.scan = 0;
        pthread_mutex_unlock(&c->px.mu);
        if (stop)
            break;
        if (look)
            scan(c);
        while (c->px.queue && nactive < PUSH_MAX) {
            struct push_job *j = c->px.queue;
            c->px.queue = j->next;
            if (!c->px.queue)
                c->px.tail = &c->px.queue;
            c->px.nqueued--;
            j->next = NULL;
            if (start_push(c, j)) {
                STAT_ADD(c, push_failures, 1);
                free_job(j);
            } else {
                j->next = active;
                active = j;
                nactive++;
            }
        }
        int running = 0;
        curl_multi_perform(m, &running);
        int left;
        for (CURLMsg *msg; (msg = curl_multi_info_read(m, &left));) {
            if (msg->msg != CURLMSG_DONE)
                continue;
            struct push_job *j = NULL;
            curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, (char **)&j);
            finish_push(c, j, msg->data.result);
            for (struct push_job **pp = &active; *pp; pp = &(*pp)->next)
                if (*pp == j) {
                    *pp = j->next;
                    nactive--;
                    break;
                }
            curl_multi_remove_handle(m, j->h);
            curl_easy_cleanup(j->h);
            free_job(j);
        }
        curl_multi_poll(m, NULL, 0, 1000, NULL);
    }
    /* Stopping: what runs is dropped (etcd has the records); the queue is
     * freed with the cluster. */
    while (active) {
        struct push_job *j = active;
        active = j->next;
        curl_multi_remove_handle(m, j->h);
        curl_easy_cleanup(j->h);
        free_job(j);
    }
    return NULL;
}

/* ---- the receiving node -------------------------------------------------- */

int cluster_push_receive(struct cluster *c, const char *body, size_t len, uint64_t *room_out,
                         int *taken, char *err, size_t cap)
{
    *taken = 0;
    *room_out = 0;
    json_error_t je;
    json_t *o = json_loadb(body, len, 0, &je);
    if (!o) {
        snprintf(err, cap, "Invalid JSON at line %d, column %d: %s", je.line, je.column, je.text);
        return 400;
    }
    json_t *room = json_object_get(o, "room"), *rank = json_object_get(o, "origin_rank");
    json_t *code = json_object_get(o, "code"), *pid = json_object_get(o, "pid");
    json_t *t = json_object_get(o, "time_ns");
    const char *reason = json_string_value(json_object_get(o, "reason"));
    const char *node = json_string_value(json_object_get(o, "node"));
    int st = 400;
    if (!json_is_integer(room) || json_integer_value(room) < 0 ||
        (uint64_t)json_integer_value(room) > KVC_ROOM_ID_MAX)
        snprintf(err, cap, "Invalid field 'room': an integer in 0..%" PRIu64 " is needed",
                 (uint64_t)KVC_ROOM_ID_MAX);
    else if (!json_is_integer(rank) || json_integer_value(rank) < 0 ||
             json_integer_value(rank) > UINT32_MAX)
        snprintf(err, cap, "Invalid field 'origin_rank'");
    else if (!reason)
        snprintf(err, cap, "Invalid field 'reason': a string is needed");
    else if (!node || !cluster_name_ok(node))
        snprintf(err, cap, "Invalid field 'node': 1..%d bytes of [A-Za-z0-9._-]", CLUSTER_NAME_MAX);
    else if (!strcmp(node, c->cfg.node))
        st = 409, snprintf(err, cap, "A failure of this node (%s) is not taken from a peer", node);
    else if ((code && !json_is_integer(code)) || (pid && !json_is_integer(pid)) ||
             (t && !json_is_integer(t)) ||
             (code &&
              (json_integer_value(code) < INT32_MIN || json_integer_value(code) > INT32_MAX)) ||
             (pid && (json_integer_value(pid) < 0 || json_integer_value(pid) > INT32_MAX)) ||
             (t && json_integer_value(t) < 0))
        snprintf(err, cap, "Invalid field 'code', 'pid' or 'time_ns': integers are needed");
    else
        st = 200;
    if (st != 200) {
        json_decref(o);
        return st;
    }
    kvc_failure_info f;
    memset(&f, 0, sizeof f);
    f.room = (uint64_t)json_integer_value(room);
    f.origin_rank = (uint32_t)json_integer_value(rank);
    f.origin_pid = (int32_t)json_integer_value(pid);
    f.code = (int32_t)json_integer_value(code);
    f.time_ns = (uint64_t)json_integer_value(t);
    snprintf(f.reason, sizeof f.reason, "%s", reason);
    snprintf(f.origin_node, sizeof f.origin_node, "%s", node);
    *room_out = f.room;
    kvc_err e = kvc_room_fail_mirror_first(c->cfg.seg, &f, taken);
    if (e != KVC_OK) {
        snprintf(err, cap, "%s", kvc_last_error());
        json_decref(o);
        return e == KVC_E_INVAL ? 400 : e == KVC_E_FULL || e == KVC_E_BUSY ? 503 : 500;
    }
    STAT_ADD(c, pushes_received, 1);
    if (*taken) {
        STAT_ADD(c, pushes_taken, 1);
        log_event(LOG_INFO, "room_failure_pushed",
                  "room=%" PRIu64 " origin=%s origin_rank=%u origin_pid=%d reason=\"%s\"", f.room,
                  node, f.origin_rank, (int)f.origin_pid, f.reason);
    }
    json_decref(o);
    return 200;
}
