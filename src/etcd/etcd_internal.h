/*
 * etcd_internal.h - what the files of the etcd client unit (etcd_client.h)
 * share, and nothing else includes: the handle, one HTTP exchange with a
 * member, the fail-over call, and the codec of etcd's JSON gateway.
 * Functions are named etcd__*.
 *
 * The files, one concern each:
 *   etcd_conn.c   the handle, one exchange with a member, authentication,
 *                 a call with fail-over under its deadline
 *   etcd_codec.c  base64, int64 fields, key-values, range requests
 *   etcd_kv.c     put, create-only put, transactions, range, delete,
 *                 leases, a member's status
 *   etcd_watch.c  the watch stream, its progress and its probe
 *
 * A handle belongs to one thread at a time (etcd_client.h), so nothing
 * here locks.
 */
#ifndef KVC_ETCD_INTERNAL_H
#define KVC_ETCD_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include <curl/curl.h>
#include <jansson.h>

#include "etcd_client.h"

#define ETCD_MAX_ENDPOINTS 16
#define ETCD_ERR_CAP 512

struct etcd {
    CURL *curl;  /* unary calls and the watch stream */
    CURL *probe; /* the watch's probe of its member, while curl holds the stream */
    char *urls[ETCD_MAX_ENDPOINTS];
    size_t nurls;
    size_t cur; /* member tried first */
    char *user;
    char *password;
    char *token; /* NULL until authenticated */
    char *cacert, *cert, *key;
    long timeout_ms;        /* per member tried */
    long deadline_ms;       /* per call, every member and authentication included; 0: none */
    long watch_quiet_ms;    /* a stream this long without a message is probed; 0: never */
    uint64_t call_deadline; /* monotonic ns: the running call's end; 0: none */
    char err[ETCD_ERR_CAP];
};

/* What one exchange with a member came to. */
enum { X_OK = 0, X_UNREACHABLE = 1, X_ERROR = 2, X_AUTH = 3 };

/* A growing answer body (NUL-terminated). */
struct etcd_body {
    char *data;
    size_t len, cap;
};

void etcd__set_err(etcd *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* ---- etcd_conn.c --------------------------------------------------------- */

/* curl write callback appending to a struct etcd_body. */
size_t etcd__on_data(char *ptr, size_t size, size_t nmemb, void *arg);
/* Configure easy handle h for a POST of body to url + path, with the
 * handle's TLS files and token, at most timeout_ms (0: no limit, a
 * stream).  Returns the header list to free after the transfer. */
struct curl_slist *etcd__prepare(etcd *c, CURL *h, const char *url, const char *path,
                                 const char *body, long timeout_ms);
/* The time a request may take now: timeout_ms, cut to what is left of the
 * running call's deadline (at least 1 ms; 0 when it has passed). */
long etcd__attempt_ms(const etcd *c);
/* POST body to url + path on h within timeout_ms; *resp receives the
 * parsed answer on X_OK.  X_UNREACHABLE: no answer, or one that another
 * member may not give (lost leader, no quorum); X_AUTH: the token was
 * refused; X_ERROR: any other refusal (message in c->err). */
int etcd__exchange(etcd *c, CURL *h, const char *url, const char *path, const char *body,
                   long timeout_ms, json_t **resp);
/* Exchange the password for a token at url. */
int etcd__authenticate(etcd *c, const char *url);
/* One request (req is consumed) with fail-over: each member at most once,
 * all within the handle's deadline; 0 with *resp, or -1. */
int etcd__call(etcd *c, const char *path, json_t *req, json_t **resp);

/* ---- etcd_codec.c -------------------------------------------------------- */

/* An int64 / uint64 field: a JSON string of digits, an integer, or absent (0). */
int64_t etcd__get_i64(const json_t *obj, const char *name);
uint64_t etcd__get_u64(const json_t *obj, const char *name);
/* Bytes as the gateway's base64 string, an int64 as its decimal string. */
json_t *etcd__b64_json(const void *data, size_t len);
json_t *etcd__i64_json(int64_t v);
/* A key-value of an answer into *kv (malloc'd); 0, or -1 (undecodable). */
int etcd__parse_kv(const json_t *j, etcd_kv *kv);
/* {"key": prefix, "range_end": the key just past every key under it}. */
json_t *etcd__range_req(const char *prefix);

#endif /* KVC_ETCD_INTERNAL_H */
