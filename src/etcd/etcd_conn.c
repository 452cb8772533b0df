/*
 * etcd_conn.c - the etcd client's handle and its requests (etcd_client.h):
 * one HTTP exchange with a member, authentication, and a call with
 * fail-over under its deadline.
 *
 * Every unary call is one POST of a JSON body to /v3/<service>/<method> of
 * the current member; the answer is a JSON object, or {"error": ...,
 * "code": N, ...} (gRPC status codes) on failure.  A call tries each member
 * at most once, starting with the one that answered last, and ends when
 * its deadline (etcd_conf.deadline_ms) passes, whatever is left to try:
 * each attempt gets timeout_ms cut to what remains.
 */
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "etcd_internal.h"

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static CURLcode curl_init_rc;

static void init_curl(void) { curl_init_rc = curl_global_init(CURL_GLOBAL_DEFAULT); }

void etcd__set_err(etcd *c, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->err, sizeof c->err, fmt, ap);
    va_end(ap);
}

/* ---- handle ---------------------------------------------------------- */

static char *read_first_line(const char *path, char *err, size_t cap)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        snprintf(err, cap, "etcd password file %s: %s", path, strerror(errno));
        return NULL;
    }
    char buf[1024];
    if (!fgets(buf, sizeof buf, f))
        buf[0] = '\0';
    fclose(f);
    buf[strcspn(buf, "\r\n")] = '\0';
    if (!buf[0]) {
        snprintf(err, cap, "etcd password file %s is empty", path);
        return NULL;
    }
    return strdup(buf);
}

static char *dup_or_null(const char *s) { return s && *s ? strdup(s) : NULL; }

int etcd_open(const struct etcd_conf *conf, etcd **out, char *err, size_t cap)
{
    pthread_once(&curl_once, init_curl);
    if (curl_init_rc != CURLE_OK) {
        snprintf(err, cap, "curl_global_init: %s", curl_easy_strerror(curl_init_rc));
        return -1;
    }
    if (!conf->endpoints || !*conf->endpoints) {
        snprintf(err, cap, "no etcd endpoint given");
        return -1;
    }
    etcd *c = calloc(1, sizeof *c);
    if (!c) {
        snprintf(err, cap, "out of memory");
        return -1;
    }
    char *list = strdup(conf->endpoints), *save = NULL;
    for (char *t = strtok_r(list, ",", &save); t && c->nurls < ETCD_MAX_ENDPOINTS;
         t = strtok_r(NULL, ",", &save)) {
        while (*t == ' ')
            t++;
        size_t n = strlen(t);
        while (n && (t[n - 1] == '/' || t[n - 1] == ' '))
            t[--n] = '\0';
        if (!n)
            continue;
        if (strncmp(t, "http://", 7) && strncmp(t, "https://", 8)) {
            snprintf(err, cap, "etcd endpoint '%s' must start with http:// or https://", t);
            free(list);
            etcd_close(c);
            return -1;
        }
        c->urls[c->nurls++] = strdup(t);
    }
    free(list);
    if (!c->nurls) {
        snprintf(err, cap, "no etcd endpoint in '%s'", conf->endpoints);
        etcd_close(c);
        return -1;
    }
    c->timeout_ms = conf->timeout_ms > 0 ? conf->timeout_ms : 2000;
    c->deadline_ms = conf->deadline_ms > 0 ? conf->deadline_ms : 0;
    c->watch_quiet_ms = conf->watch_quiet_ms > 0 ? conf->watch_quiet_ms : 0;
    c->cacert = dup_or_null(conf->cacert);
    c->cert = dup_or_null(conf->cert);
    c->key = dup_or_null(conf->key);
    if (conf->user && *conf->user) {
        if (!conf->password_file) {
            snprintf(err, cap, "etcd user '%s' given without a password file", conf->user);
            etcd_close(c);
            return -1;
        }
        c->user = strdup(conf->user);
        if (!(c->password = read_first_line(conf->password_file, err, cap))) {
            etcd_close(c);
            return -1;
        }
    }
    if (!(c->curl = curl_easy_init()) || !(c->probe = curl_easy_init())) {
        snprintf(err, cap, "curl_easy_init failed");
        etcd_close(c);
        return -1;
    }
    *out = c;
    return 0;
}

void etcd_close(etcd *c)
{
    if (!c)
        return;
    if (c->curl)
        curl_easy_cleanup(c->curl);
    if (c->probe)
        curl_easy_cleanup(c->probe);
    for (size_t i = 0; i < c->nurls; i++)
        free(c->urls[i]);
    free(c->user);
    if (c->password)
        memset(c->password, 0, strlen(c->password));
    free(c->password);
    free(c->token);
    free(c->cacert);
    free(c->cert);
    free(c->key);
    free(c);
}

void etcd_set_deadline(etcd *c, long deadline_ms)
{
    c->deadline_ms = deadline_ms > 0 ? deadline_ms : 0;
}
void etcd_set_watch_quiet(etcd *c, long quiet_ms)
{
    c->watch_quiet_ms = quiet_ms > 0 ? quiet_ms : 0;
}
const char *etcd_error(const etcd *c) { return c->err; }
const char *etcd_endpoint(const etcd *c) { return c->urls[c->cur]; }
size_t etcd_endpoint_count(const etcd *c) { return c->nurls; }
const char *etcd_endpoint_at(const etcd *c, size_t i) { return i < c->nurls ? c->urls[i] : ""; }

/* ---- one HTTP exchange --------------------------------------------------- */

size_t etcd__on_data(char *ptr, size_t size, size_t nmemb, void *arg)
{
    struct etcd_body *b = arg;
    size_t n = size * nmemb;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->len + n + 1)
            cap *= 2;
        char *p = realloc(b->data, cap);
        if (!p)
            return 0; /* curl then fails with CURLE_WRITE_ERROR */
        b->data = p, b->cap = cap;
    }
    memcpy(b->data + b->len, ptr, n);
    b->len += n;
    b->data[b->len] = '\0';
    return n;
}

struct curl_slist *etcd__prepare(etcd *c, CURL *h, const char *url, const char *path,
                                 const char *body, long timeout_ms)
{
    char full[1024];
    snprintf(full, sizeof full, "%s%s", url, path);
    curl_easy_reset(h);
    curl_easy_setopt(h, CURLOPT_URL, full);
    curl_easy_setopt(h, CURLOPT_POSTFIELDS, body);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    long connect_ms = timeout_ms && timeout_ms < c->timeout_ms ? timeout_ms : c->timeout_ms;
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, connect_ms < 1000 ? connect_ms : 1000L);
    if (timeout_ms)
        curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, timeout_ms);
    curl_easy_setopt(h, CURLOPT_TCP_NODELAY, 1L);
    if (c->cacert)
        curl_easy_setopt(h, CURLOPT_CAINFO, c->cacert);
    if (c->cert)
        curl_easy_setopt(h, CURLOPT_SSLCERT, c->cert);
    if (c->key)
        curl_easy_setopt(h, CURLOPT_SSLKEY, c->key);
    struct curl_slist *hd = curl_slist_append(NULL, "Content-Type: application/json");
    hd = curl_slist_append(hd, "Expect:"); /* no 100-continue round trip */
    if (c->token) {
        char auth[1200];
        snprintf(auth, sizeof auth, "Authorization: %s", c->token);
        hd = curl_slist_append(hd, auth);
    }
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, hd);
    return hd;
}

/* A gateway error that another member may not have (lost leader, no
 * quorum, this member stopping). */
static bool member_trouble(const char *msg)
{
    return strstr(msg, "leader") || strstr(msg, "timed out") || strstr(msg, "stopped") ||
           strstr(msg, "unhealthy") || strstr(msg, "no route") || strstr(msg, "connection");
}

/* What to add to the error of a request to url that failed with rc (curl),
 * or answered HTTP status with gRPC code, when the cause is likely a TLS
 * set-up mistake; "" otherwise.  A static string. */
static const char *tls_hint(const etcd *c, const char *url, CURLcode rc, long status, int64_t code)
{
    if (strncmp(url, "https:", 6))
        return "";
    /* A TLS server that wants a client certificate and gets none ends the
     * handshake: curl reports a send or receive error. */
    if (!c->cert && (rc == CURLE_RECV_ERROR || rc == CURLE_SEND_ERROR ||
                     rc == CURLE_SSL_CONNECT_ERROR || rc == CURLE_GOT_NOTHING))
        return "; if etcd runs with --client-cert-auth, give a client certificate (--etcd-cert, "
               "--etcd-key)";
    if (rc == CURLE_PEER_FAILED_VERIFICATION)
        return "; etcd's certificate is not signed by a CA in --etcd-cacert (or the system's), "
               "or does not name this endpoint's host";
    /* etcd 3.4's JSON gateway reaches its own gRPC server over the client
     * URL presenting the server's certificate; with --client-cert-auth and
     * a certificate that does not allow client authentication, every
     * request answers 503 ("connection closed" or a broken pipe, gRPC code
     * 14: unavailable). */
    if (status == 503 && code == 14)
        return "; if etcd runs with --client-cert-auth, its server certificate must also allow "
               "clientAuth (extendedKeyUsage), which its gateway presents";
    return "";
}

long etcd__attempt_ms(const etcd *c)
{
    if (!c->call_deadline)
        return c->timeout_ms;
    uint64_t now = kvc__mono_ns();
    if (now >= c->call_deadline)
        return 0;
    uint64_t left = (c->call_deadline - now + 999999) / 1000000;
    return left < (uint64_t)c->timeout_ms ? (long)left : c->timeout_ms;
}

int etcd__exchange(etcd *c, CURL *h, const char *url, const char *path, const char *body,
                   long timeout_ms, json_t **resp)
{
    if (timeout_ms <= 0) {
        etcd__set_err(c,
                      "etcd %s%s: the call's deadline (%ld ms) passed before this member was "
                      "tried",
                      url, path, c->deadline_ms);
        return X_UNREACHABLE;
    }
    struct etcd_body b = {0};
    struct curl_slist *hd = etcd__prepare(c, h, url, path, body, timeout_ms);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, etcd__on_data);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &b);
    CURLcode rc = curl_easy_perform(h);
    curl_slist_free_all(hd);
    if (rc != CURLE_OK) {
        etcd__set_err(c, "etcd %s%s: %s%s", url, path, curl_easy_strerror(rc),
                      tls_hint(c, url, rc, 0, 0));
        free(b.data);
        return X_UNREACHABLE;
    }
    long status = 0;
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
    json_error_t je;
    json_t *j = b.data ? json_loadb(b.data, b.len, 0, &je) : NULL;
    if (!json_is_object(j)) {
        etcd__set_err(c, "etcd %s%s: HTTP %ld, answer is not a JSON object: %.120s", url, path,
                      status, b.data ? b.data : "");
        free(b.data);
        json_decref(j);
        return status >= 500 ? X_UNREACHABLE : X_ERROR;
    }
    free(b.data);
    json_t *e = json_object_get(j, "error");
    if (e || status != 200) {
        const char *msg = json_string_value(e);
        if (!msg)
            msg = json_string_value(json_object_get(j, "message"));
        int64_t code = etcd__get_i64(j, "code");
        etcd__set_err(c, "etcd %s%s: %s (HTTP %ld, code %lld)%s", url, path, msg ? msg : "error",
                      status, (long long)code, tls_hint(c, url, CURLE_OK, status, code));
        int kind = X_ERROR;
        if (msg && (strstr(msg, "invalid auth token") || strstr(msg, "user name is empty")))
            kind = X_AUTH;
        else if (msg && member_trouble(msg))
            kind = X_UNREACHABLE;
        json_decref(j);
        return kind;
    }
    *resp = j;
    return X_OK;
}

int etcd__authenticate(etcd *c, const char *url)
{
    json_t *req = json_pack("{s:s, s:s}", "name", c->user, "password", c->password);
    char *body = json_dumps(req, JSON_COMPACT);
    json_decref(req);
    free(c->token);
    c->token = NULL;
    json_t *resp = NULL;
    int k =
        etcd__exchange(c, c->curl, url, "/v3/auth/authenticate", body, etcd__attempt_ms(c), &resp);
    if (body)
        memset(body, 0, strlen(body));
    free(body);
    if (k != X_OK) {
        if (k == X_ERROR) {
            char why[ETCD_ERR_CAP];
            snprintf(why, sizeof why, "%s", c->err);
            etcd__set_err(c, "etcd authentication of user '%s' failed: %s", c->user, why);
        }
        return k;
    }
    const char *tok = json_string_value(json_object_get(resp, "token"));
    if (tok)
        c->token = strdup(tok);
    json_decref(resp);
    if (!c->token) {
        etcd__set_err(c,
                      "etcd authentication of user '%s': no token in the answer (is auth enabled?)",
                      c->user);
        return X_ERROR;
    }
    return X_OK;
}

/* One request with fail-over: each member at most once, then once more on
 * the same member after re-authenticating when the token was refused; all
 * of it within the handle's deadline. */
int etcd__call(etcd *c, const char *path, json_t *req, json_t **resp)
{
    char *body = json_dumps(req, JSON_COMPACT);
    json_decref(req);
    if (!body) {
        etcd__set_err(c, "out of memory for an etcd request");
        return -1;
    }
    int k = X_UNREACHABLE;
    c->call_deadline = c->deadline_ms ? kvc__mono_ns() + (uint64_t)c->deadline_ms * 1000000ull : 0;
    for (size_t t = 0; t < c->nurls && etcd__attempt_ms(c) > 0; t++) {
        size_t i = (c->cur + t) % c->nurls;
        if (c->user && !c->token) {
            k = etcd__authenticate(c, c->urls[i]);
            if (k == X_UNREACHABLE)
                continue;
            if (k != X_OK)
                break;
        }
        k = etcd__exchange(c, c->curl, c->urls[i], path, body, etcd__attempt_ms(c), resp);
        if (k == X_AUTH && c->user) {
            free(c->token);
            c->token = NULL;
            if ((k = etcd__authenticate(c, c->urls[i])) == X_OK)
                k = etcd__exchange(c, c->curl, c->urls[i], path, body, etcd__attempt_ms(c), resp);
        }
        if (k != X_UNREACHABLE) {
            if (k == X_OK)
                c->cur = i;
            break;
        }
    }
    c->call_deadline = 0;
    free(body);
    return k == X_OK ? 0 : -1;
}
