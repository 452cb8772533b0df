/*
 * etcd_codec.c - what etcd's v3 JSON gateway carries, and how: bytes as
 * base64 (RFC 4648, padded; the URL-safe alphabet also read), int64 fields
 * as JSON strings (the proto3 JSON mapping; fields equal to their default
 * are omitted, so every read goes through etcd__get_i64), key-values, and
 * the range of every key under a prefix.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "etcd_internal.h"

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
int64_t etcd__get_i64(const json_t *obj, const char *name)
{
    json_t *v = json_object_get(obj, name);
    if (json_is_integer(v))
        return (int64_t)json_integer_value(v);
    if (json_is_string(v))
        return strtoll(json_string_value(v), NULL, 10);
    return 0;
}

uint64_t etcd__get_u64(const json_t *obj, const char *name)
{
    json_t *v = json_object_get(obj, name);
    if (json_is_integer(v))
        return (uint64_t)json_integer_value(v);
    if (json_is_string(v))
        return strtoull(json_string_value(v), NULL, 10);
    return 0;
}

json_t *etcd__b64_json(const void *data, size_t len)
{
    char *s = b64_encode(data, len);
    json_t *j = s ? json_string(s) : NULL;
    free(s);
    return j;
}

json_t *etcd__i64_json(int64_t v)
{
    char buf[32];
    snprintf(buf, sizeof buf, "%lld", (long long)v);
    return json_string(buf);
}

int etcd__parse_kv(const json_t *j, etcd_kv *kv)
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
    kv->create_rev = etcd__get_i64(j, "create_revision");
    kv->mod_rev = etcd__get_i64(j, "mod_revision");
    kv->version = etcd__get_i64(j, "version");
    kv->lease = etcd__get_i64(j, "lease");
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

json_t *etcd__range_req(const char *prefix)
{
    size_t elen;
    char *end = prefix_end(prefix, &elen);
    json_t *req = json_object();
    json_object_set_new(req, "key", etcd__b64_json(prefix, strlen(prefix)));
    json_object_set_new(req, "range_end",
                        elen ? etcd__b64_json(end, elen) : etcd__b64_json("\0", 1));
    free(end);
    return req;
}
