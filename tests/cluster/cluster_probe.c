/*
 * cluster_probe.c - what a co-located process sees through libkvcoord, for
 * the cluster tests: a rank's entry (including a mirrored one's origin) as
 * one JSON line, optionally after waiting for it.
 *
 *   cluster_probe SEGMENT RANK [WAIT_MS]
 *
 * Prints {"rc": "...", "rank": N, "origin": "...", "origin_generation": G,
 * "generation": G, "session_id": "...", "note": "...", "info_len": N,
 * "wait_us": T} and then, on its own line, the weights_info_dict bytes
 * (when registered).  Exit 0 when registered, 3 when not, 1 on error.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <jansson.h>

#include "kvcoord/kvcoord.h"

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: cluster_probe SEGMENT RANK [WAIT_MS]\n");
        return 2;
    }
    kvc_options o;
    kvc_options_init(&o);
    o.name = argv[1];
    o.role = KVC_ROLE_NONE;
    kvc_segment *seg;
    if (kvc_open(&o, &seg)) {
        fprintf(stderr, "cluster_probe: %s\n", kvc_last_error());
        return 1;
    }
    uint32_t rank = (uint32_t)strtoul(argv[2], NULL, 10);
    uint32_t wait_ms = argc > 3 ? (uint32_t)strtoul(argv[3], NULL, 10) : 0;
    kvc_rank_info ri = {0};
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    kvc_err e = wait_ms ? kvc_rank_wait(seg, rank, wait_ms, &ri) : kvc_rank_lookup(seg, rank, &ri);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    json_t *j = json_pack(
        "{s:s, s:I, s:s, s:I, s:I, s:s, s:s, s:I, s:I}", "rc", kvc_strerror(e), "rank",
        (json_int_t)rank, "origin", ri.origin, "origin_generation",
        (json_int_t)ri.origin_generation, "generation", (json_int_t)ri.generation, "session_id",
        ri.session_id, "note", ri.note, "info_len", (json_int_t)(e == KVC_OK ? ri.info_len : 0),
        "wait_us",
        (json_int_t)((t1.tv_sec - t0.tv_sec) * 1000000 + (t1.tv_nsec - t0.tv_nsec) / 1000));
    char *line = json_dumps(j, JSON_COMPACT);
    printf("%s\n", line);
    free(line);
    json_decref(j);
    if (e == KVC_OK)
        fwrite(ri.info, 1, ri.info_len, stdout);
    kvc_rank_info_free(&ri);
    kvc_close(seg);
    return e == KVC_OK                                                         ? 0
           : (e == KVC_E_NOENT || e == KVC_E_WITHDRAWN || e == KVC_E_TIMEDOUT) ? 3
                                                                               : 1;
}
