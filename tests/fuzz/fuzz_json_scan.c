/*
 * fuzz_json_scan.c - fuzz target: the strict JSON scanner (src/common/
 * json_scan.h), differential against jansson.
 *
 * The input is any byte string.
 *   1. Validity: the scanner accepts it exactly when jansson
 *      (JSON_DECODE_ANY | JSON_ALLOW_NUL) does, except for the one rule
 *      where they differ on purpose: integers in 2^63..2^64-1 (jansson:
 *      "too big integer"), reals past a double's range (jansson: "real
 *      number overflow") and "\u0000" in a key (jansson: "NUL byte in
 *      object key not supported") are valid JSON the scanner accepts; a raw
 *      NUL byte, where jansson stops reading, is invalid to the scanner
 *      wherever it is.  A refusal names a position inside the input.
 *   2. Watches: for the members "a", "b" of the top-level object and "c"
 *      under "a", the type recorded is jansson's type of that member; the
 *      recorded bytes, parsed alone by jansson, equal jansson's member
 *      (json_equal); an array's element count equals jansson's, an
 *      object's member count is at least jansson's (duplicates are counted
 *      as written); a string decodes to jansson's bytes; an integer in the
 *      int64 range reads as jansson's value.
 */
#include <jansson.h>
#include <stdint.h>
#include <string.h>

#include "fuzz_common.h"
#include "json_scan.h"

static int tolerated(const char *jansson_error)
{
    return strstr(jansson_error, "too big integer") || strstr(jansson_error, "too big negative") ||
           strstr(jansson_error, "real number overflow") ||
           strstr(jansson_error, "NUL byte in object key");
}

static enum kvc_json_type type_of(const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT: return KVC_JSON_OBJECT;
    case JSON_ARRAY: return KVC_JSON_ARRAY;
    case JSON_STRING: return KVC_JSON_STRING;
    case JSON_INTEGER: return KVC_JSON_INTEGER;
    case JSON_REAL: return KVC_JSON_REAL;
    case JSON_TRUE: return KVC_JSON_TRUE;
    case JSON_FALSE: return KVC_JSON_FALSE;
    default: return KVC_JSON_NULL;
    }
}

static void check_watch(const char *text, const struct kvc_json_watch *w, json_t *want)
{
    if (!want) {
        FZ_CHECK(w->type == KVC_JSON_NONE, "watch '%s' found, jansson has no such member", w->key);
        return;
    }
    FZ_CHECK(w->type == type_of(want), "watch '%s': type %d, jansson %d", w->key, (int)w->type,
             (int)type_of(want));
    FZ_CHECK(w->start < w->end, "watch '%s': empty span", w->key);
    json_error_t je;
    json_t *alone =
        json_loadb(text + w->start, w->end - w->start, JSON_DECODE_ANY | JSON_ALLOW_NUL, &je);
    FZ_CHECK(alone, "watch '%s': its bytes do not parse alone: %s", w->key, je.text);
    FZ_CHECK(json_equal(alone, want), "watch '%s': its bytes differ from jansson's member", w->key);
    json_decref(alone);
    if (json_is_array(want))
        FZ_CHECK(w->members == json_array_size(want), "watch '%s': %zu elements, jansson %zu",
                 w->key, w->members, json_array_size(want));
    if (json_is_object(want))
        FZ_CHECK(w->members >= json_object_size(want), "watch '%s': %zu members, jansson %zu",
                 w->key, w->members, json_object_size(want));
    if (json_is_string(want)) {
        static char buf[1 << 16];
        int nul = 0;
        long n = kvc__json_string(text, w->start, w->end, buf, sizeof buf, &nul);
        if (json_string_length(want) < sizeof buf) {
            FZ_CHECK(n >= 0 && (size_t)n == json_string_length(want) &&
                         !memcmp(buf, json_string_value(want), (size_t)n),
                     "watch '%s': decoded string differs", w->key);
            FZ_CHECK(nul == (strlen(json_string_value(want)) != json_string_length(want)),
                     "watch '%s': NUL flag wrong", w->key);
        } else {
            FZ_CHECK(n < 0, "watch '%s': decoded past the buffer", w->key);
        }
    }
    if (json_is_integer(want)) {
        int neg;
        uint64_t mag;
        kvc__json_integer(text, w->start, w->end, &neg, &mag);
        json_int_t v = json_integer_value(want);
        uint64_t vm = v < 0 ? (uint64_t)0 - (uint64_t)v : (uint64_t)v;
        FZ_CHECK(neg == (v < 0) && mag == vm, "watch '%s': integer differs", w->key);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *text = (const char *)data;
    struct kvc_json_watch w[3] = {
        {.parent = -1, .key = "a"}, {.parent = -1, .key = "b"}, {.parent = 0, .key = "c"}};
    struct kvc_json_root root;
    struct kvc_json_error err;
    int rc = kvc__json_scan(text, size, w, 3, &root, &err);
    json_error_t je;
    json_t *j = json_loadb(text, size, JSON_DECODE_ANY | JSON_ALLOW_NUL, &je);
    if (rc) {
        FZ_CHECK(err.offset <= size, "error offset %zu past the input (%zu)", err.offset, size);
        FZ_CHECK(err.line >= 1 && err.column >= 1 && err.text[0], "bad error position or text");
        /* jansson stops reading at a NUL byte; to the scanner (RFC 8259)
         * one is invalid anywhere. */
        FZ_CHECK(!j || memchr(data, 0, size), "scanner refuses (%s at byte %zu), jansson accepts",
                 err.text, err.offset);
        json_decref(j);
        return 0;
    }
    if (!j) {
        FZ_CHECK(tolerated(je.text), "scanner accepts, jansson refuses: %s", je.text);
        return 0;
    }
    FZ_CHECK(root.type == type_of(j), "root type %d, jansson %d", (int)root.type, (int)type_of(j));
    if (json_is_object(j)) {
        FZ_CHECK(root.members >= json_object_size(j), "root members");
        json_t *a = json_object_get(j, "a");
        check_watch(text, &w[0], a);
        check_watch(text, &w[1], json_object_get(j, "b"));
        check_watch(text, &w[2], json_is_object(a) ? json_object_get(a, "c") : NULL);
    } else {
        for (int i = 0; i < 3; i++)
            FZ_CHECK(w[i].type == KVC_JSON_NONE, "watch found in a non-object");
        if (json_is_array(j))
            FZ_CHECK(root.members == json_array_size(j), "root elements");
    }
    json_decref(j);
    return 0;
}
