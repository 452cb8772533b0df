/*
 * bench_etcd.c - kvcoord-bench-etcd: the per-request alternative to the
 * cluster view's mirror, timed with the same client library as the mirror
 * lookup it is compared with.
 *
 *   kvcoord-bench-etcd --etcd URL --key KEY --url KVCOORDD_URL --rank N [--iters N]
 *
 * Times --iters gateway ranges of KEY (POST /v3/kv/range, base64 decoding
 * and the record's JSON parsed, as a client asking etcd per lookup would)
 * and --iters GET /get_transfer_engine_info?rank=N of a kvcoordd that
 * mirrors the rank, each over one keep-alive libcurl connection,
 * interleaved; prints one JSON line with medians and p99 in microseconds
 * and the ratio.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <curl/curl.h>
#include <jansson.h>

#include "clock.h"
#include "etcd_client.h"

static double now_us(void) { return (double)kvc__mono_ns() / 1e3; }

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static size_t sink(char *p, size_t size, size_t n, void *arg)
{
    (void)p;
    *(size_t *)arg += size * n;
    return size * n;
}

static void usage(FILE *out)
{
    fprintf(out, "usage: kvcoord-bench-etcd --etcd URL --key KEY --url KVCOORDD_URL "
                 "--rank N [--iters N]\n"
                 "Exit status: 0 measured, 1 runtime error (etcd or kvcoordd unreachable),\n"
                 "2 usage error.\n");
}

int main(int argc, char **argv)
{
    const char *etcd_url = NULL, *key = NULL, *url = NULL;
    long rank = 0, iters = 2000;
    for (int i = 1; i < argc; i += 2) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            usage(stdout);
            return 0;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "kvcoord-bench-etcd: '%s' needs a value\n", argv[i]);
            usage(stderr);
            return 2;
        }
        if (!strcmp(argv[i], "--etcd"))
            etcd_url = argv[i + 1];
        else if (!strcmp(argv[i], "--key"))
            key = argv[i + 1];
        else if (!strcmp(argv[i], "--url"))
            url = argv[i + 1];
        else if (!strcmp(argv[i], "--rank"))
            rank = strtol(argv[i + 1], NULL, 10);
        else if (!strcmp(argv[i], "--iters"))
            iters = strtol(argv[i + 1], NULL, 10);
        else {
            fprintf(stderr, "kvcoord-bench-etcd: unknown option '%s'\n", argv[i]);
            usage(stderr);
            return 2;
        }
    }
    if (!etcd_url || !key || !url || iters < 1) {
        usage(stderr);
        return 2;
    }
    struct etcd_conf conf = {.endpoints = etcd_url, .timeout_ms = 5000};
    char err[256];
    etcd *c;
    if (etcd_open(&conf, &c, err, sizeof err)) {
        fprintf(stderr, "kvcoord-bench-etcd: %s\n", err);
        return 1;
    }
    CURL *h = curl_easy_init();
    char get[512];
    snprintf(get, sizeof get, "%s/get_transfer_engine_info?rank=%ld", url, rank);
    double *te = calloc((size_t)iters, sizeof *te), *tk = calloc((size_t)iters, sizeof *tk);
    size_t got = 0, etcd_bytes = 0;
    for (long i = 0; i < iters; i++) {
        double t0 = now_us();
        etcd_kv *kvs;
        size_t n;
        if (etcd_range_prefix(c, key, &kvs, &n, NULL) || n < 1) {
            fprintf(stderr, "kvcoord-bench-etcd: range %s: %s\n", key,
                    n ? etcd_error(c) : "no such key");
            return 1;
        }
        json_error_t je;
        json_t *rec = json_loadb(kvs[0].value, kvs[0].value_len, 0, &je);
        json_t *info = json_loadb(json_string_value(json_object_get(rec, "info")),
                                  json_string_length(json_object_get(rec, "info")), 0, &je);
        etcd_bytes = kvs[0].value_len;
        json_decref(info);
        json_decref(rec);
        etcd_kvs_free(kvs, n);
        double t1 = now_us();
        got = 0;
        curl_easy_setopt(h, CURLOPT_URL, get);
        curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, sink);
        curl_easy_setopt(h, CURLOPT_WRITEDATA, &got);
        CURLcode cc = curl_easy_perform(h);
        double t2 = now_us();
        long status = 0;
        curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
        if (cc != CURLE_OK || status != 200) {
            fprintf(stderr, "kvcoord-bench-etcd: GET %s: %s %ld\n", get, curl_easy_strerror(cc),
                    status);
            return 1;
        }
        te[i] = t1 - t0;
        tk[i] = t2 - t1;
    }
    qsort(te, (size_t)iters, sizeof *te, cmp);
    qsort(tk, (size_t)iters, sizeof *tk, cmp);
    long p99 = (long)((double)(iters - 1) * 0.99);
    printf("{\"iters\": %ld, \"etcd_range_us\": {\"median\": %.1f, \"p99\": %.1f}, "
           "\"kvcoordd_http_us\": {\"median\": %.1f, \"p99\": %.1f}, \"etcd_value_bytes\": %zu, "
           "\"http_body_bytes\": %zu, \"ratio_etcd_over_mirror_median\": %.2f}\n",
           iters, te[iters / 2], te[p99], tk[iters / 2], tk[p99], etcd_bytes, got,
           te[iters / 2] / tk[iters / 2]);
    free(te);
    free(tk);
    curl_easy_cleanup(h);
    etcd_close(c);
    return 0;
}
