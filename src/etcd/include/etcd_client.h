/*
 * etcd_client.h - the etcd client unit (src/etcd/, CMake target
 * kvcoord_etcd): a small blocking client of etcd's v3 JSON gateway
 * (grpc-gateway, paths /v3/...; etcd 3.4 as Debian 12 ships it), over
 * libcurl, with jansson for the JSON.
 *
 * What kvcoordd's cluster view needs and nothing more: put (with a lease),
 * create-only put (a transaction comparing the key's create revision with
 * 0), range over a prefix, delete, lease grant / keep-alive / revoke, and a
 * watch stream on a prefix.  Keys and values are bytes; the gateway carries
 * them base64-encoded, which this module hides.
 *
 * Endpoints: a comma-separated list of client URLs.  A request that cannot
 * reach a member (connect error, timeout, or a server error that names a
 * lost leader or quorum) is tried on the next member, each at most once per
 * call; the member that answered last is tried first next time.
 *
 * Authentication: with a user, the password is read from a file (its first
 * line) and exchanged for a token at /v3/auth/authenticate; the token is
 * sent in the Authorization header and renewed once when etcd says it is
 * invalid.  TLS: CA file, client certificate and key go to libcurl.
 *
 * Threads: one etcd handle per thread (a handle owns two curl easy
 * handles); several handles may run at once.  Every call blocks for at
 * most timeout_ms per member tried and, with a deadline_ms, at most that in
 * all (the watch blocks until stopped).  Errors return -1 and leave a
 * message in etcd_error(); nothing is printed.
 */
#ifndef KVC_ETCD_CLIENT_H
#define KVC_ETCD_CLIENT_H

#include <stddef.h>
#include <stdint.h>

/* How to reach and authenticate to the cluster; strings are copied. */
struct etcd_conf {
    const char *endpoints;     /* "http://h:p[,http://h:p...]"; required */
    const char *user;          /* NULL: no authentication */
    const char *password_file; /* needed with user: first line is the password */
    const char *cacert;        /* PEM CA bundle for https endpoints, or NULL */
    const char *cert;          /* PEM client certificate, or NULL */
    const char *key;           /* PEM client key, or NULL */
    long timeout_ms;           /* per request and member; 0: 2000 */
    long deadline_ms;          /* per call, every member tried and authentication included; 0: none
                                  (then up to timeout_ms per member) */
    long watch_quiet_ms;       /* a watch stream this long without a message has its member
                                  probed (etcd_watch); 0: never */
};

typedef struct etcd etcd;

/* A key-value as etcd returns it.  key and value are malloc'd and
 * NUL-terminated (the NUL is not counted); free with etcd_kv_free(). */
typedef struct etcd_kv {
    char *key;
    size_t key_len;
    char *value;
    size_t value_len;
    int64_t create_rev;
    int64_t mod_rev;
    int64_t version;
    int64_t lease;
} etcd_kv;

/* One watch event: a put (value set) or a delete (value empty; mod_rev is
 * the delete's revision). */
typedef struct etcd_event {
    int is_delete;
    etcd_kv kv;
} etcd_event;

/* Create a handle (no network I/O: the first request connects, and
 * authenticates when a user is configured).  Returns 0, or -1 with a message
 * in err (cap bytes): no endpoint, unreadable password file, curl init. */
int etcd_open(const struct etcd_conf *conf, etcd **out, char *err, size_t cap);

/* Close the handle (NULL ignored). */
void etcd_close(etcd *c);

/* Change the handle's per-call deadline (etcd_conf.deadline_ms; 0: none)
 * for the calls that follow.  Only the handle's owner thread. */
void etcd_set_deadline(etcd *c, long deadline_ms);

/* Change how long a watch stream of the handle may stay without a message
 * before its member is probed (etcd_conf.watch_quiet_ms; 0: never), from
 * the stream's next turn on.  Only the handle's owner thread. */
void etcd_set_watch_quiet(etcd *c, long quiet_ms);

/* Message of the handle's last failed call ("" if none).  Owned by c. */
const char *etcd_error(const etcd *c);

/* The endpoint that answered the last successful request (owned by c). */
const char *etcd_endpoint(const etcd *c);

/* Free key and value of kv (the struct itself is the caller's). */
void etcd_kv_free(etcd_kv *kv);

/* Free an array of n kvs returned by etcd_range_prefix(). */
void etcd_kvs_free(etcd_kv *kvs, size_t n);

/* Put key = value (len bytes) attached to lease (0: none).  *rev (may be
 * NULL) receives the revision of the put.  An unknown lease is an error
 * ("requested lease not found"). */
int etcd_put(etcd *c, const char *key, const void *value, size_t len, int64_t lease, int64_t *rev);

/* Create-only put: in one transaction, put key = value with lease only if
 * the key does not exist.  *created is 1 when this call created it; else 0
 * and *existing (may be NULL) receives the key's current value. *rev (may
 * be NULL) receives the transaction's revision. */
int etcd_put_create(etcd *c, const char *key, const void *value, size_t len, int64_t lease,
                    int *created, etcd_kv *existing, int64_t *rev);

/* One operation of etcd_txn_batch(): put key = value (len bytes) with the
 * lease given to the batch, or delete key. */
struct etcd_op {
    const char *key;
    const void *value;
    size_t len;
    int is_delete;
};

/* Apply n operations (at most etcd's --max-txn-ops, 128 by default, and
 * below its request size limit, 1.5 MiB by default) in one transaction:
 * all or none, one revision, one round trip.  *rev (may be NULL) receives
 * that revision.  Errors as etcd_put(). */
int etcd_txn_batch(etcd *c, const struct etcd_op *ops, size_t n, int64_t lease, int64_t *rev);

/* Every key starting with prefix (in key order), at one revision: *kvs
 * (malloc'd array of *n, free with etcd_kvs_free) and *rev (the store's
 * revision then, for a watch that starts right after it). */
int etcd_range_prefix(etcd *c, const char *prefix, etcd_kv **kvs, size_t *n, int64_t *rev);

/* Delete key (prefix 0) or every key starting with it (prefix 1).
 * *deleted (may be NULL) receives how many were. */
int etcd_delete(etcd *c, const char *key, int prefix, int64_t *deleted);

/* Grant a lease of ttl_s seconds; *id receives it. */
int etcd_lease_grant(etcd *c, int64_t ttl_s, int64_t *id);

/* Renew lease id once.  *ttl_left receives the seconds it now has; 0 means
 * the lease does not exist any more (expired or revoked). */
int etcd_lease_keepalive(etcd *c, int64_t id, int64_t *ttl_left);

/* Time left on lease id without renewing it: *ttl_left seconds (-1 when
 * the lease does not exist), *granted its TTL when granted. */
int etcd_lease_ttl(etcd *c, int64_t id, int64_t *ttl_left, int64_t *granted);

/* Revoke lease id (its keys are deleted).  A lease already gone is not an
 * error. */
int etcd_lease_revoke(etcd *c, int64_t id);

/* What a watch reports to its caller (events is required, the others may
 * be NULL); each is called on the watching thread.
 *   events:  the events of one watch response and its header's revision;
 *            non-zero ends the watch (etcd_watch then returns 0).
 *   idle:    about every 100 ms while the stream is open; non-zero ends
 *            the watch (etcd_watch returns 0).
 *   current: the stream is known current: a message arrived (created,
 *            events, a progress notification; rev its revision) or, after
 *            watch_quiet_ms without one, its member answered a probe (rev 0). */
typedef int (*etcd_watch_fn)(void *arg, const etcd_event *ev, size_t n, int64_t rev);
typedef int (*etcd_idle_fn)(void *arg);
typedef void (*etcd_current_fn)(void *arg, int64_t rev);
struct etcd_watch_cb {
    etcd_watch_fn events;
    etcd_idle_fn idle;
    etcd_current_fn current;
    void *arg;
};

/* Watch every key starting with prefix from revision start_rev on (> 0;
 * events from the past are delivered first), with progress notifications
 * asked for, reporting to cb until a callback ends it (returns 0) or the
 * stream ends or fails (returns -1: member gone, compacted past start_rev -
 * the message says "compacted" - canceled, or blind: no message for
 * watch_quiet_ms and its member did not answer a linearizable read within
 * timeout_ms; then the next call starts on the next member).  Blocking;
 * needs its own handle (a watch occupies it).  *last_rev (may be NULL)
 * receives the newest revision seen, so the caller can resume from
 * last_rev + 1. */
int etcd_watch(etcd *c, const char *prefix, int64_t start_rev, const struct etcd_watch_cb *cb,
               int64_t *last_rev);

/* Status of one member: its URL answered /v3/maintenance/status, giving
 * *leader (member id of the leader, 0 if none) and *revision.  Returns 0 or
 * -1 (unreachable).  Does not fail over. */
int etcd_member_status(etcd *c, const char *url, uint64_t *leader, int64_t *revision);

/* Number of endpoints configured, and the i-th (owned by c). */
size_t etcd_endpoint_count(const etcd *c);
const char *etcd_endpoint_at(const etcd *c, size_t i);

#endif /* KVC_ETCD_CLIENT_H */
