/*
 * install_prog.c - built by test_install.sh against an INSTALLED libkvcoord
 * with `pkg-config --cflags --libs kvcoord` (shared, then --static), in
 * strict C11: creates a segment, registers a rank, looks it up.
 *   install_prog SEGMENT-NAME
 */
#include <kvcoord/kvcoord.h>
#include <kvcoord/transfer.h>
#include <stdio.h>
#include <string.h>

static int die(const char *what, kvc_err e)
{
    fprintf(stderr, "install_prog: %s: %s: %s\n", what, kvc_strerror(e), kvc_last_error());
    return 1;
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: install_prog SEGMENT-NAME\n");
        return 2;
    }
    kvc_options o;
    kvc_options_init(&o);
    o.name = argv[1];
    o.mode = KVC_OPEN_FRESH;
    o.max_ranks = 16;
    o.arena_bytes = 1u << 20;
    o.max_info_bytes = 64u << 10;
    o.max_rooms = 16;
    kvc_segment *seg;
    kvc_err e = kvc_open(&o, &seg);
    if (e)
        return die("kvc_open", e);
    const char *info = "{\"lm_head.weight\":[139637976727552,65667072,2]}";
    uint64_t gen = 0;
    e = kvc_rank_register(seg, 3, "10.0.0.5:16003", info, strlen(info), &gen);
    if (e) {
        kvc_close(seg);
        kvc_unlink(argv[1]);
        return die("kvc_rank_register", e);
    }
    kvc_rank_info ri;
    memset(&ri, 0, sizeof ri);
    e = kvc_rank_lookup(seg, 3, &ri);
    int ok = e == KVC_OK && !strcmp(ri.session_id, "10.0.0.5:16003") &&
             ri.info_len == strlen(info) && !memcmp(ri.info, info, ri.info_len) &&
             ri.generation == gen;
    printf("install_prog: %s rank=3 session_id=%s generation=%llu version=%s layout=%u\n",
           ok ? "ok" : "MISMATCH", ri.session_id, (unsigned long long)ri.generation, KVC_VERSION,
           KVC_LAYOUT_VERSION);
    kvc_rank_info_free(&ri);
    kvc_close(seg);
    kvc_unlink(argv[1]);
    if (e)
        return die("kvc_rank_lookup", e);
    return ok ? 0 : 1;
}
