/*
 * cluster_keys.c - the cluster view's names and keys in etcd, and what it
 * accepts from them: valid cluster and node names, the key of each entry,
 * the parsing of a key read from etcd, the digest of an entry's bytes, and
 * the checks of a peer's record (a malformed one is counted, logged and
 * skipped).  The layout itself is described in cluster.h.
 */

#include <stdio.h>
#include <string.h>

#include <openssl/evp.h>

#include "cluster_internal.h"
#include "log.h"

int cluster_name_ok(const char *s)
{
    size_t n = strlen(s);
    if (n < 1 || n > CLUSTER_NAME_MAX)
        return 0;
    for (const char *p = s; *p; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
              *p == '.' || *p == '_' || *p == '-'))
            return 0;
    return 1;
}

void cluster__digest_of(const char *sid, const char *info, size_t info_len, char out[DIGEST_HEX])
{
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int n = 0;
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    EVP_DigestInit_ex(ctx, EVP_sha256(), NULL);
    EVP_DigestUpdate(ctx, sid, strlen(sid) + 1); /* with its NUL: a separator */
    EVP_DigestUpdate(ctx, info, info_len);
    EVP_DigestFinal_ex(ctx, md, &n);
    EVP_MD_CTX_free(ctx);
    for (unsigned i = 0; i < n && i < 32; i++)
        snprintf(out + 2 * i, 3, "%02x", md[i]);
    out[64] = '\0';
}

/* ---- keys ---------------------------------------------------------------- */

/* An entry's key: ranks/<node>/<rank> (the rank table), roles/<node>/<role>/<rank>
 * (transfer-engine info under another role), parallelism/<node>/<role>/<rank>. */
void cluster__key_entry(const struct cluster *c, unsigned ti, const char *node, uint32_t rank,
                        char *out, size_t cap)
{
    if (ti == 0)
        snprintf(out, cap, "%sranks/%s/%u", c->cfg.prefix, node, rank);
    else
        snprintf(out, cap, "%s%s/%s/%s/%u", c->cfg.prefix,
                 t_kind(ti) == EK_INFO ? "roles" : "parallelism", node, t_role(c, ti), rank);
}

void cluster__key_node(const struct cluster *c, char *out, size_t cap)
{
    snprintf(out, cap, "%snodes/%s", c->cfg.prefix, c->cfg.node);
}

/* Copy the path segment at *p (up to '/' or the end) into out[0..cap) and
 * step past it and its '/'; -1 when empty or too long. */
static int take_segment(const char **p, char *out, size_t cap)
{
    const char *end = strchr(*p, '/');
    size_t n = end ? (size_t)(end - *p) : strlen(*p);
    if (!n || n >= cap)
        return -1;
    memcpy(out, *p, n);
    out[n] = '\0';
    *p += n + (end ? 1 : 0);
    return end ? 1 : 0; /* 1: more follows */
}

/* A decimal number of at most 20 digits, nothing else; -1 otherwise. */
static int parse_decimal(const char *s, uint64_t max, uint64_t *out)
{
    uint64_t v = 0;
    if (!*s || strlen(s) > 20)
        return -1;
    for (; *s; s++) {
        if (*s < '0' || *s > '9' || v > (max - (uint64_t)(*s - '0')) / 10)
            return -1;
        v = v * 10 + (uint64_t)(*s - '0');
    }
    *out = v;
    return 0;
}

/* Split a key under the prefix: nodes/<n>, ranks/<n>/<rank>,
 * roles/<n>/<role>/<rank>, parallelism/<n>/<role>/<rank>, rooms/<id>,
 * pd/<n>, follows/<n>/<room>.
 * *why: what is wrong with a K_BAD key. */
enum key_kind cluster__parse_key(const struct cluster *c, const char *key, struct keyref *k,
                                 const char **why)
{
    size_t pl = strlen(c->cfg.prefix);
    *why = "";
    if (strncmp(key, c->cfg.prefix, pl))
        return K_OTHER;
    const char *p = key + pl;
    char num[32];
    if (!strncmp(p, "nodes/", 6)) {
        if (!cluster_name_ok(p + 6))
            return K_OTHER;
        snprintf(k->node, sizeof k->node, "%s", p + 6);
        return K_NODE;
    }
    if (!strncmp(p, "rooms/", 6))
        return parse_decimal(p + 6, UINT64_MAX, &k->num) ? K_OTHER : K_ROOM;
    if (!strncmp(p, "follows/", 8)) {
        p += 8;
        if (take_segment(&p, k->node, sizeof k->node) != 1 || !cluster_name_ok(k->node) ||
            parse_decimal(p, KVC_ROOM_ID_MAX, &k->num))
            return K_OTHER;
        return K_FOLLOW;
    }
    if (!strncmp(p, "pd/", 3)) {
        if (!cluster_name_ok(p + 3)) {
            *why = "bad node name in the key";
            return K_BAD;
        }
        snprintf(k->node, sizeof k->node, "%s", p + 3);
        return K_PD;
    }
    int with_role;
    if (!strncmp(p, "ranks/", 6)) {
        p += 6, with_role = 0, k->kind = EK_INFO;
    } else if (!strncmp(p, "roles/", 6)) {
        p += 6, with_role = 1, k->kind = EK_INFO;
    } else if (!strncmp(p, "parallelism/", 12)) {
        p += 12, with_role = 1, k->kind = EK_PCFG;
    } else {
        return K_OTHER;
    }
    snprintf(k->role, sizeof k->role, "%s", KVC_DEFAULT_ROLE);
    if (take_segment(&p, k->node, sizeof k->node) != 1 || !cluster_name_ok(k->node)) {
        *why = "bad node name in the key";
        return K_BAD;
    }
    if (with_role &&
        (take_segment(&p, k->role, sizeof k->role) != 1 || kvc_role_check(k->role) != KVC_OK)) {
        *why = "bad role name in the key (1..31 bytes of [A-Za-z0-9._-])";
        return K_BAD;
    }
    if (with_role && k->kind == EK_INFO && !strcmp(k->role, KVC_DEFAULT_ROLE)) {
        *why = "the default role's ranks live under ranks/, not roles/";
        return K_BAD;
    }
    if (take_segment(&p, num, sizeof num) != 0 || parse_decimal(num, UINT32_MAX, &k->num)) {
        *why = "bad rank in the key";
        return K_BAD;
    }
    return K_ENTRY;
}

/* ---- what a peer sends: logged and skipped when malformed ---------------- */

/* A record or key read from etcd that is not usable: counted and logged
 * (the log escapes what it prints), never mirrored. */
void cluster__record_skipped(struct cluster *c, const char *key, const char *why)
{
    STAT_ADD(c, records_skipped, 1);
    log_event(LOG_WARN, "cluster_record_skipped", "cluster=%s key=%.200s why=\"%s\"",
              c->cfg.cluster, key, why);
}

static int is_digest(const char *s)
{
    if (strlen(s) != DIGEST_HEX - 1)
        return 0;
    for (; *s; s++)
        if (!((*s >= '0' && *s <= '9') || (*s >= 'a' && *s <= 'f')))
            return 0;
    return 1;
}

/* A string field: its value when it is a string of 1..max bytes with no
 * NUL (and, if url, an http(s) URL of printable ASCII), else NULL. */
static const char *str_field(json_t *o, const char *name, size_t max, int url)
{
    json_t *v = json_object_get(o, name);
    const char *s = json_string_value(v);
    if (!s || !json_string_length(v) || json_string_length(v) > max ||
        strlen(s) != json_string_length(v))
        return NULL;
    if (url) {
        if (strncmp(s, "http://", 7) && strncmp(s, "https://", 8))
            return NULL;
        for (const char *p = s; *p; p++)
            if (*p <= 0x20 || *p >= 0x7f)
                return NULL;
    }
    return s;
}

/* Check record o of key k (table ti) into *out; NULL when usable, else why not. */
const char *cluster__check_record(const struct cluster *c, unsigned ti, const struct keyref *k,
                                  json_t *o, struct rec *out)
{
    memset(out, 0, sizeof *out);
    if (!json_is_object(o))
        return "not a JSON object";
    const char *node = json_string_value(json_object_get(o, "node"));
    if (!node || strcmp(node, k->node))
        return "its \"node\" is not the key's node";
    json_t *rank = json_object_get(o, "rank");
    if (!json_is_integer(rank) || json_integer_value(rank) != (json_int_t)k->num)
        return "its \"rank\" is not the key's rank";
    json_t *role = json_object_get(o, "role");
    if ((ti != 0 || role) &&
        (!json_string_value(role) || strcmp(json_string_value(role), t_role(c, ti))))
        return "its \"role\" is not the key's role";
    json_t *gen = json_object_get(o, "generation");
    if (!json_is_integer(gen) || json_integer_value(gen) < 1)
        return "its \"generation\" is not a positive integer";
    out->gen = (uint64_t)json_integer_value(gen);
    out->digest = str_field(o, "digest", DIGEST_HEX - 1, 0);
    if (!out->digest || !is_digest(out->digest))
        return "its \"digest\" is not 64 lowercase hex digits";
    if (t_kind(ti) == EK_INFO) {
        out->sid = str_field(o, "session_id", KVC_SESSION_ID_MAX, 0);
        if (!out->sid)
            return "its \"session_id\" is not a string of 1..255 bytes";
    } else {
        out->sid = "";
        if (json_object_get(o, "session_id"))
            return "a parallelism config has no \"session_id\"";
    }
    json_t *bytes = json_object_get(o, "bytes");
    if (bytes && (!json_is_integer(bytes) || json_integer_value(bytes) < 0 ||
                  (uint64_t)json_integer_value(bytes) > c->cfg.max_info_bytes))
        return "its \"bytes\" is not an integer within this segment's max info bytes";
    out->url = "";
    if (json_object_get(o, "url") && !(out->url = str_field(o, "url", URL_MAX - 1, 1)))
        return "its \"url\" is not an http(s) URL of at most 255 bytes";
    json_t *info = json_object_get(o, t_kind(ti) == EK_INFO ? "info" : "config");
    if (info) {
        out->info = json_string_value(info);
        out->info_len = json_string_length(info);
        if (!out->info || out->info_len > CLUSTER_INLINE_MAX || strlen(out->info) != out->info_len)
            return t_kind(ti) == EK_INFO ? "its \"info\" is not a string of at most 256 KiB"
                                         : "its \"config\" is not a string of at most 256 KiB";
    } else if (!out->url[0]) {
        return "neither the bytes inline nor a \"url\" to fetch them from";
    }
    return NULL;
}
