/*
 * etcd_client.c - etcd v3 JSON gateway client; see etcd_client.h.
 *
 * Every unary call is one POST of a JSON body to /v3/<service>/<method> of
 * the current member; the answer is a JSON object, or {"error": ...,
 * "code": N, ...} (grpc status codes) on failure.  int64 fields arrive as
 * JSON strings (proto3 JSON mapping), and fields equal to their default
 * (0, false, PUT) are omitted, so every read goes through get_i64().
 */
#include "etcd_client.h"

#include <ctype.h>
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <curl/curl.h>
#include <jansson.h>

#define MAX_ENDPOINTS 16
#define ERR_CAP 512

struct etcd {
    CURL *curl;
    char *urls[MAX_ENDPOINTS];
    size_t nurls;
    size_t cur; /* member tried first */
    char *user;
    char *password;
    char *token; /* NULL until authenticated */
    char *cacert, *cert, *key;
    long timeout_ms;
    char err[ERR_CAP];
};

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static CURLcode curl_init_rc;

static void init_curl(void) { curl_init_rc = curl_global_init(CURL_GLOBAL_DEFAULT); }

static void set_err(etcd *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void set_err(etcd *c, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->err, sizeof c->err, fmt, ap);
    va_end(ap);
}

/* ---- base64 (RFC 4648, padded), as the gateway carries bytes ---------- */

static const char B64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

static char *b64_encode(const void *data, size_t len)
{
    const unsigned char *p = data;
    char *out = malloc((len + 2) / 3 * 4 + 1), *o = out;
    if (!out)
        return NULL;
    size_t i = 0;
    for (; i + 3 <= len; i += 3) {
        uint32_t v = (uint32_t)p[i] << 16 | (uint32_t)p[i + 1] << 8 | p[i + 2];
        *o++ = B64[v >> 18], *o++ = B64[(v >> 12) & 63], *o++ = B64[(v >> 6) & 63],
        *o++ = B64[v & 63];
    }
    if (len - i == 1) {
        uint32_t v = (uint32_t)p[i] << 16;
        *o++ = B64[v >> 18], *o++ = B64[(v >> 12) & 63], *o++ = '=', *o++ = '=';
    } else if (len - i == 2) {
        uint32_t v = (uint32_t)p[i] << 16 | (uint32_t)p[i + 1] << 8;
        *o++ = B64[v >> 18], *o++ = B64[(v >> 12) & 63], *o++ = B64[(v >> 6) & 63], *o++ = '=';
    }
    *o = '\0';
    return out;
}

static int b64_value(unsigned char ch)
{
    if (ch >= 'A' && ch <= 'Z')
        return ch - 'A';
    if (ch >= 'a' && ch <= 'z')
        return ch - 'a' + 26;
    if (ch >= '0' && ch <= '9')
        return ch - '0' + 52;
    if (ch == '+' || ch == '-')
        return 62;
    if (ch == '/' || ch == '_')
        return 63;
    return -1;
}

/* Decode into a malloc'd NUL-terminated buffer; NULL on bad input. */
static char *b64_decode(const char *s, size_t *out_len)
{
    size_t len = strlen(s);
    char *out = malloc(len / 4 * 3 + 4);
    if (!out)
        return NULL;
    size_t n = 0;
    uint32_t acc = 0;
    int bits = 0;
    for (size_t i = 0; i < len; i++) {
        if (s[i] == '=')
            break;
        int v = b64_value((unsigned char)s[i]);
        if (v < 0) {
            free(out);
            return NULL;
        }
        acc = acc << 6 | (uint32_t)v;
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            out[n++] = (char)((acc >> bits) & 0xff);
        }
    }
    out[n] = '\0';
    *out_len = n;
    return out;
}

/* ---- JSON helpers -------------------------------------------------------- */

/* An int64 field: a JSON string of digits, an integer, or absent (0). */
static int64_t get_i64(const json_t *obj, const char *name)
{
    json_t *v = json_object_get(obj, name);
    if (json_is_integer(v))
        return (int64_t)json_integer_value(v);
    if (json_is_string(v))
        return strtoll(json_string_value(v), NULL, 10);
    return 0;
}

static uint64_t get_u64(const json_t *obj, const char *name)
{
    json_t *v = json_object_get(obj, name);
    if (json_is_integer(v))
        return (uint64_t)json_integer_value(v);
    if (json_is_string(v))
        return strtoull(json_string_value(v), NULL, 10);
    return 0;
}

static json_t *b64_json(const void *data, size_t len)
{
    char *s = b64_encode(data, len);
    json_t *j = s ? json_string(s) : NULL;
    free(s);
    return j;
}

static json_t *i64_json(int64_t v)
{
    char buf[32];
    snprintf(buf, sizeof buf, "%lld", (long long)v);
    return json_string(buf);
}

static int parse_kv(const json_t *j, etcd_kv *kv)
{
    memset(kv, 0, sizeof *kv);
    const char *k = json_string_value(json_object_get(j, "key"));
    const char *v = json_string_value(json_object_get(j, "value"));
    kv->key = b64_decode(k ? k : "", &kv->key_len);
    kv->value = b64_decode(v ? v : "", &kv->value_len);
    if (!kv->key || !kv->value) {
        etcd_kv_free(kv);
        return -1;
    }
    kv->create_rev = get_i64(j, "create_revision");
    kv->mod_rev = get_i64(j, "mod_revision");
    kv->version = get_i64(j, "version");
    kv->lease = get_i64(j, "lease");
    return 0;
}

void etcd_kv_free(etcd_kv *kv)
{
    if (!kv)
        return;
    free(kv->key);
    free(kv->value);
    kv->key = kv->value = NULL;
    kv->key_len = kv->value_len = 0;
}

void etcd_kvs_free(etcd_kv *kvs, size_t n)
{
    for (size_t i = 0; i < n; i++)
        etcd_kv_free(&kvs[i]);
    free(kvs);
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
    for (char *t = strtok_r(list, ",", &save); t && c->nurls < MAX_ENDPOINTS;
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
    if (!(c->curl = curl_easy_init())) {
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

const char *etcd_error(const etcd *c) { return c->err; }
const char *etcd_endpoint(const etcd *c) { return c->urls[c->cur]; }
size_t etcd_endpoint_count(const etcd *c) { return c->nurls; }
const char *etcd_endpoint_at(const etcd *c, size_t i) { return i < c->nurls ? c->urls[i] : ""; }

/* ---- one HTTP exchange --------------------------------------------------- */

struct body {
    char *data;
    size_t len, cap;
};

static size_t on_data(char *ptr, size_t size, size_t nmemb, void *arg)
{
    struct body *b = arg;
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

/* Configure c->curl for a POST of body to url + path. */
static struct curl_slist *prepare(etcd *c, const char *url, const char *path, const char *body,
                                  long timeout_ms)
{
    char full[1024];
    snprintf(full, sizeof full, "%s%s", url, path);
    CURL *h = c->curl;
    curl_easy_reset(h);
    curl_easy_setopt(h, CURLOPT_URL, full);
    curl_easy_setopt(h, CURLOPT_POSTFIELDS, body);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, c->timeout_ms < 1000 ? c->timeout_ms : 1000L);
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

enum { X_OK = 0, X_UNREACHABLE = 1, X_ERROR = 2, X_AUTH = 3 };

/* A gateway error that another member may not have (lost leader, no
 * quorum, this member stopping). */
static bool member_trouble(const char *msg)
{
    return strstr(msg, "leader") || strstr(msg, "timed out") || strstr(msg, "stopped") ||
           strstr(msg, "unhealthy") || strstr(msg, "no route") || strstr(msg, "connection");
}

/* POST body to path on url; *resp receives the parsed answer on X_OK. */
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

static int exchange(etcd *c, const char *url, const char *path, const char *body, json_t **resp)
{
    struct body b = {0};
    struct curl_slist *hd = prepare(c, url, path, body, c->timeout_ms);
    curl_easy_setopt(c->curl, CURLOPT_WRITEFUNCTION, on_data);
    curl_easy_setopt(c->curl, CURLOPT_WRITEDATA, &b);
    CURLcode rc = curl_easy_perform(c->curl);
    curl_slist_free_all(hd);
    if (rc != CURLE_OK) {
        set_err(c, "etcd %s%s: %s%s", url, path, curl_easy_strerror(rc),
                tls_hint(c, url, rc, 0, 0));
        free(b.data);
        return X_UNREACHABLE;
    }
    long status = 0;
    curl_easy_getinfo(c->curl, CURLINFO_RESPONSE_CODE, &status);
    json_error_t je;
    json_t *j = b.data ? json_loadb(b.data, b.len, 0, &je) : NULL;
    if (!json_is_object(j)) {
        set_err(c, "etcd %s%s: HTTP %ld, answer is not a JSON object: %.120s", url, path, status,
                b.data ? b.data : "");
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
        int64_t code = get_i64(j, "code");
        set_err(c, "etcd %s%s: %s (HTTP %ld, code %lld)%s", url, path, msg ? msg : "error", status,
                (long long)code, tls_hint(c, url, CURLE_OK, status, code));
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

static int authenticate(etcd *c, const char *url)
{
    json_t *req = json_pack("{s:s, s:s}", "name", c->user, "password", c->password);
    char *body = json_dumps(req, JSON_COMPACT);
    json_decref(req);
    free(c->token);
    c->token = NULL;
    json_t *resp = NULL;
    int k = exchange(c, url, "/v3/auth/authenticate", body, &resp);
    if (body)
        memset(body, 0, strlen(body));
    free(body);
    if (k != X_OK) {
        if (k == X_ERROR) {
            char why[ERR_CAP];
            snprintf(why, sizeof why, "%s", c->err);
            set_err(c, "etcd authentication of user '%s' failed: %s", c->user, why);
        }
        return k;
    }
    const char *tok = json_string_value(json_object_get(resp, "token"));
    if (tok)
        c->token = strdup(tok);
    json_decref(resp);
    if (!c->token) {
        set_err(c, "etcd authentication of user '%s': no token in the answer (is auth enabled?)",
                c->user);
        return X_ERROR;
    }
    return X_OK;
}

/* One request with fail-over: each member at most once, then once more on
 * the same member after re-authenticating when the token was refused. */
static int call(etcd *c, const char *path, json_t *req, json_t **resp)
{
    char *body = json_dumps(req, JSON_COMPACT);
    json_decref(req);
    if (!body) {
        set_err(c, "out of memory for an etcd request");
        return -1;
    }
    int k = X_UNREACHABLE;
    for (size_t t = 0; t < c->nurls; t++) {
        size_t i = (c->cur + t) % c->nurls;
        if (c->user && !c->token) {
            k = authenticate(c, c->urls[i]);
            if (k == X_UNREACHABLE)
                continue;
            if (k != X_OK)
                break;
        }
        k = exchange(c, c->urls[i], path, body, resp);
        if (k == X_AUTH && c->user) {
            free(c->token);
            c->token = NULL;
            if ((k = authenticate(c, c->urls[i])) == X_OK)
                k = exchange(c, c->urls[i], path, body, resp);
        }
        if (k != X_UNREACHABLE) {
            if (k == X_OK)
                c->cur = i;
            break;
        }
    }
    free(body);
    return k == X_OK ? 0 : -1;
}

/* ---- KV ------------------------------------------------------------------ */

int etcd_put(etcd *c, const char *key, const void *value, size_t len, int64_t lease, int64_t *rev)
{
    json_t *req = json_object();
    json_object_set_new(req, "key", b64_json(key, strlen(key)));
    json_object_set_new(req, "value", b64_json(value, len));
    if (lease)
        json_object_set_new(req, "lease", i64_json(lease));
    json_t *resp;
    if (call(c, "/v3/kv/put", req, &resp))
        return -1;
    if (rev)
        *rev = get_i64(json_object_get(resp, "header"), "revision");
    json_decref(resp);
    return 0;
}

int etcd_put_create(etcd *c, const char *key, const void *value, size_t len, int64_t lease,
                    int *created, etcd_kv *existing, int64_t *rev)
{
    json_t *k = b64_json(key, strlen(key));
    json_t *put = json_object();
    json_object_set(put, "key", k);
    json_object_set_new(put, "value", b64_json(value, len));
    if (lease)
        json_object_set_new(put, "lease", i64_json(lease));
    json_t *req = json_pack("{s:[{s:O, s:s, s:s, s:s}], s:[{s:o}], s:[{s:{s:O}}]}", "compare",
                            "key", k, "target", "CREATE", "result", "EQUAL", "create_revision", "0",
                            "success", "request_put", put, "failure", "request_range", "key", k);
    json_decref(k);
    if (!req) {
        set_err(c, "out of memory for an etcd transaction");
        return -1;
    }
    json_t *resp;
    if (call(c, "/v3/kv/txn", req, &resp))
        return -1;
    *created = json_is_true(json_object_get(resp, "succeeded"));
    if (rev)
        *rev = get_i64(json_object_get(resp, "header"), "revision");
    int rc = 0;
    if (!*created && existing) {
        json_t *r0 = json_array_get(json_object_get(resp, "responses"), 0);
        json_t *kv0 =
            json_array_get(json_object_get(json_object_get(r0, "response_range"), "kvs"), 0);
        if (!kv0) {
            /* Deleted between the compare and the range: cannot happen in
             * one transaction, but an empty record is still an answer. */
            memset(existing, 0, sizeof *existing);
        } else if (parse_kv(kv0, existing)) {
            set_err(c, "etcd txn: undecodable key or value in the answer");
            rc = -1;
        }
    }
    json_decref(resp);
    return rc;
}

int etcd_txn_batch(etcd *c, const struct etcd_op *ops, size_t n, int64_t lease, int64_t *rev)
{
    json_t *succ = json_array();
    for (size_t i = 0; i < n; i++) {
        json_t *op = json_object();
        json_object_set_new(op, "key", b64_json(ops[i].key, strlen(ops[i].key)));
        if (ops[i].is_delete) {
            json_array_append_new(succ, json_pack("{s:o}", "request_delete_range", op));
            continue;
        }
        json_object_set_new(op, "value", b64_json(ops[i].value, ops[i].len));
        if (lease)
            json_object_set_new(op, "lease", i64_json(lease));
        json_array_append_new(succ, json_pack("{s:o}", "request_put", op));
    }
    json_t *req = json_pack("{s:o}", "success", succ);
    if (!req) {
        set_err(c, "out of memory for an etcd transaction");
        return -1;
    }
    json_t *resp;
    if (call(c, "/v3/kv/txn", req, &resp))
        return -1;
    if (rev)
        *rev = get_i64(json_object_get(resp, "header"), "revision");
    json_decref(resp);
    return 0;
}

/* The key just past every key starting with prefix (prefix with its last
 * byte incremented, carrying). */
static char *prefix_end(const char *prefix, size_t *len)
{
    size_t n = strlen(prefix);
    char *e = malloc(n + 1);
    memcpy(e, prefix, n + 1);
    while (n && (unsigned char)e[n - 1] == 0xff)
        n--;
    if (n)
        e[n - 1] = (char)((unsigned char)e[n - 1] + 1);
    *len = n;
    return e;
}

static json_t *range_req(const char *prefix)
{
    size_t elen;
    char *end = prefix_end(prefix, &elen);
    json_t *req = json_object();
    json_object_set_new(req, "key", b64_json(prefix, strlen(prefix)));
    json_object_set_new(req, "range_end", elen ? b64_json(end, elen) : b64_json("\0", 1));
    free(end);
    return req;
}

int etcd_range_prefix(etcd *c, const char *prefix, etcd_kv **kvs, size_t *n, int64_t *rev)
{
    json_t *resp;
    if (call(c, "/v3/kv/range", range_req(prefix), &resp))
        return -1;
    json_t *arr = json_object_get(resp, "kvs");
    size_t cnt = json_array_size(arr);
    etcd_kv *out = calloc(cnt ? cnt : 1, sizeof *out);
    if (!out) {
        json_decref(resp);
        set_err(c, "out of memory for %zu etcd keys", cnt);
        return -1;
    }
    for (size_t i = 0; i < cnt; i++) {
        if (parse_kv(json_array_get(arr, i), &out[i])) {
            etcd_kvs_free(out, i);
            json_decref(resp);
            set_err(c, "etcd range: undecodable key or value in the answer");
            return -1;
        }
    }
    if (rev)
        *rev = get_i64(json_object_get(resp, "header"), "revision");
    json_decref(resp);
    *kvs = out;
    *n = cnt;
    return 0;
}

int etcd_delete(etcd *c, const char *key, int prefix, int64_t *deleted)
{
    json_t *req;
    if (prefix) {
        req = range_req(key);
    } else {
        req = json_object();
        json_object_set_new(req, "key", b64_json(key, strlen(key)));
    }
    json_t *resp;
    if (call(c, "/v3/kv/deleterange", req, &resp))
        return -1;
    if (deleted)
        *deleted = get_i64(resp, "deleted");
    json_decref(resp);
    return 0;
}

/* ---- leases -------------------------------------------------------------- */

int etcd_lease_grant(etcd *c, int64_t ttl_s, int64_t *id)
{
    json_t *req = json_object();
    json_object_set_new(req, "TTL", i64_json(ttl_s));
    json_t *resp;
    if (call(c, "/v3/lease/grant", req, &resp))
        return -1;
    *id = get_i64(resp, "ID");
    const char *e = json_string_value(json_object_get(resp, "error"));
    json_decref(resp);
    if (!*id) {
        set_err(c, "etcd lease grant: no lease ID in the answer%s%s", e ? ": " : "", e ? e : "");
        return -1;
    }
    return 0;
}

int etcd_lease_keepalive(etcd *c, int64_t id, int64_t *ttl_left)
{
    json_t *req = json_object();
    json_object_set_new(req, "ID", i64_json(id));
    json_t *resp;
    if (call(c, "/v3/lease/keepalive", req, &resp))
        return -1;
    /* A streaming method: the answer is {"result": {...}}; a lease that no
     * longer exists comes back with no TTL (0). */
    json_t *r = json_object_get(resp, "result");
    *ttl_left = get_i64(r ? r : resp, "TTL");
    json_decref(resp);
    return 0;
}

int etcd_lease_ttl(etcd *c, int64_t id, int64_t *ttl_left, int64_t *granted)
{
    json_t *req = json_object();
    json_object_set_new(req, "ID", i64_json(id));
    json_t *resp;
    if (call(c, "/v3/lease/timetolive", req, &resp))
        return -1;
    /* An expired lease answers TTL -1 (as a string or a number). */
    *ttl_left = get_i64(resp, "TTL");
    *granted = get_i64(resp, "grantedTTL");
    json_decref(resp);
    return 0;
}

int etcd_lease_revoke(etcd *c, int64_t id)
{
    json_t *req = json_object();
    json_object_set_new(req, "ID", i64_json(id));
    json_t *resp;
    if (call(c, "/v3/lease/revoke", req, &resp)) {
        if (strstr(c->err, "lease not found"))
            return 0;
        return -1;
    }
    json_decref(resp);
    return 0;
}

int etcd_member_status(etcd *c, const char *url, uint64_t *leader, int64_t *revision)
{
    json_t *resp = NULL;
    char *token = c->token;
    if (c->user && !token && authenticate(c, url) != X_OK)
        return -1;
    int k = exchange(c, url, "/v3/maintenance/status", "{}", &resp);
    if (k != X_OK)
        return -1;
    *leader = get_u64(resp, "leader");
    *revision = get_i64(json_object_get(resp, "header"), "revision");
    json_decref(resp);
    return 0;
}

/* ---- watch ------------------------------------------------------------- */

struct watch_ctx {
    etcd *c;
    struct body buf; /* bytes of the stream not yet parsed */
    etcd_watch_fn fn;
    etcd_idle_fn idle;
    void *arg;
    int64_t last_rev;
    int stop;    /* a callback asked to end */
    int failed;  /* the stream said canceled / compacted / error */
    int created; /* the watch was acknowledged */
};

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
        set_err(w->c, "etcd watch: %s",
                json_is_string(msg) ? json_string_value(msg) : "stream error");
        w->failed = 1;
        json_decref(j);
        return;
    }
    int64_t rev = get_i64(json_object_get(r, "header"), "revision");
    if (json_is_true(json_object_get(r, "created")))
        w->created = 1;
    int64_t compact = get_i64(r, "compact_revision");
    if (compact || json_is_true(json_object_get(r, "canceled"))) {
        const char *why = json_string_value(json_object_get(r, "cancel_reason"));
        if (compact)
            set_err(w->c, "etcd watch: compacted (oldest revision kept %lld)", (long long)compact);
        else
            set_err(w->c, "etcd watch canceled: %s", why ? why : "no reason given");
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
            if (parse_kv(json_object_get(e, "kv"), &ev[k].kv))
                continue;
            ev[k].is_delete = type && !strcmp(type, "DELETE");
            if (ev[k].kv.mod_rev > w->last_rev)
                w->last_rev = ev[k].kv.mod_rev;
            k++;
        }
        if (ev && k && w->fn(w->arg, ev, k, rev))
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
    if (on_data(ptr, 1, n, &w->buf) != n)
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

static int on_watch_progress(void *arg, curl_off_t a, curl_off_t b, curl_off_t c_, curl_off_t d)
{
    (void)a, (void)b, (void)c_, (void)d;
    struct watch_ctx *w = arg;
    if (w->idle && w->idle(w->arg))
        w->stop = 1;
    return w->stop;
}

int etcd_watch(etcd *c, const char *prefix, int64_t start_rev, etcd_watch_fn fn, etcd_idle_fn idle,
               void *arg, int64_t *last_rev)
{
    json_t *cr = range_req(prefix);
    json_object_set_new(cr, "start_revision", i64_json(start_rev));
    json_t *req = json_pack("{s:o}", "create_request", cr);
    char *body = json_dumps(req, JSON_COMPACT);
    json_decref(req);
    struct watch_ctx w = {.c = c, .fn = fn, .idle = idle, .arg = arg, .last_rev = start_rev - 1};
    int rc = -1;
    for (size_t t = 0; t < c->nurls && body; t++) {
        size_t i = (c->cur + t) % c->nurls;
        if (c->user && !c->token) {
            int k = authenticate(c, c->urls[i]);
            if (k == X_UNREACHABLE)
                continue;
            if (k != X_OK)
                break;
        }
        struct curl_slist *hd = prepare(c, c->urls[i], "/v3/watch", body, 0);
        curl_easy_setopt(c->curl, CURLOPT_WRITEFUNCTION, on_watch_data);
        curl_easy_setopt(c->curl, CURLOPT_WRITEDATA, &w);
        curl_easy_setopt(c->curl, CURLOPT_NOPROGRESS, 0L);
        curl_easy_setopt(c->curl, CURLOPT_XFERINFOFUNCTION, on_watch_progress);
        curl_easy_setopt(c->curl, CURLOPT_XFERINFODATA, &w);
        /* A member that vanishes without closing the connection: TCP
         * keep-alive probes end the stream within a few seconds. */
        curl_easy_setopt(c->curl, CURLOPT_TCP_KEEPALIVE, 1L);
        curl_easy_setopt(c->curl, CURLOPT_TCP_KEEPIDLE, 2L);
        curl_easy_setopt(c->curl, CURLOPT_TCP_KEEPINTVL, 1L);
        CURLcode cc = curl_easy_perform(c->curl);
        curl_slist_free_all(hd);
        w.buf.len = 0;
        if (w.stop) {
            rc = 0;
            c->cur = i;
            break;
        }
        if (w.failed)
            break;
        if (cc != CURLE_OK)
            set_err(c, "etcd watch on %s: %s", c->urls[i], curl_easy_strerror(cc));
        else
            set_err(c, "etcd watch on %s: the stream ended", c->urls[i]);
        if (w.created) {
            c->cur = (i + 1) % c->nurls; /* it worked, then the member went */
            break;
        }
    }
    free(w.buf.data);
    free(body);
    if (last_rev)
        *last_rev = w.last_rev;
    return rc;
}
