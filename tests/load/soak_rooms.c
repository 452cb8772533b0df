/*
 * soak_rooms.c - the room side of the soak test (test_soak.py): attaches to
 * kvcoordd's segment as TP workers do and, for SECONDS, runs rooms through
 * their life (kvcoordd serves no room routes yet, so rooms go through the
 * library):
 *   - most rooms: open (2 participants, ranks 0 and 1), Bootstrapping ->
 *     Transferring -> Success on both, read, release by both;
 *   - every 8th: a failure recorded by one rank (kvc_room_fail), read by
 *     the other (same record, is_from_another_rank), released;
 *   - every 64th: a forked worker attaches, opens a room as rank 1 and
 *     exits without releasing it: the room must fail naming that death
 *     (kvcoordd's pidfd watch, or the liveness check on read).
 * Prints one summary line; exits 1 on any unexpected answer.
 *
 *   soak_rooms SEGMENT SECONDS
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "kvcoord/kvcoord.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

#define CHECK(e, what)                                                                             \
    do {                                                                                           \
        kvc_err e_ = (e);                                                                          \
        if (e_) {                                                                                  \
            fprintf(stderr, "soak_rooms: %s: %s: %s\n", what, kvc_strerror(e_), kvc_last_error()); \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

static kvc_segment *attach(const char *name, int32_t rank)
{
    kvc_options o;
    kvc_options_init(&o);
    o.name = name;
    o.mode = KVC_OPEN_ATTACH;
    o.role = KVC_ROLE_WORKER;
    o.rank = rank;
    kvc_segment *s = NULL;
    CHECK(kvc_open(&o, &s), "kvc_open");
    return s;
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: %s SEGMENT SECONDS\n", argv[0]);
        return 2;
    }
    const char *name = argv[1];
    double end = now_s() + atof(argv[2]);
    kvc_segment *seg = attach(name, 0);
    uint64_t room = ((uint64_t)getpid() << 32) | 1;
    unsigned long ok = 0, failed = 0, died = 0;
    kvc_room_info ri;
    for (unsigned long i = 0; now_s() < end; i++, room++) {
        if (i % 64 == 63) {
            /* A participant dies holding the room. */
            pid_t pid = fork();
            if (pid == 0) {
                kvc_segment *c = attach(name, 1);
                CHECK(kvc_room_open(c, room, 2, 1, KVC_ROOM_ROLE_DECODE), "child room_open");
                CHECK(kvc_room_set_state(c, room, 1, KVC_POLL_TRANSFERRING), "child set_state");
                _exit(0); /* no release, no close */
            }
            int st;
            if (pid < 0 || waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st)) {
                fprintf(stderr, "soak_rooms: dying worker did not run\n");
                return 1;
            }
            CHECK(kvc_room_open(seg, room, 2, 0, KVC_ROOM_ROLE_PREFILL), "room_open");
            CHECK(kvc_room_wait(seg, room, 0, KVC_POLL_BOOTSTRAPPING, 10000, &ri), "room_wait");
            if (ri.state != KVC_POLL_FAILED) {
                fprintf(stderr, "soak_rooms: room %llu not failed after its worker died (%s)\n",
                        (unsigned long long)room, kvc_poll_name(ri.state));
                return 1;
            }
            CHECK(kvc_room_release(seg, room, 0), "release");
            died++;
            continue;
        }
        CHECK(kvc_room_open(seg, room, 2, 0, KVC_ROOM_ROLE_PREFILL), "room_open 0");
        CHECK(kvc_room_open(seg, room, 2, 1, KVC_ROOM_ROLE_DECODE), "room_open 1");
        if (i % 8 == 7) {
            int kept = 0;
            CHECK(kvc_room_fail(seg, room, 1, 110, "soak: transfer timed out", &kept), "fail");
            CHECK(kvc_room_get(seg, room, 0, &ri), "room_get");
            if (!kept || ri.state != KVC_POLL_FAILED || !ri.failure.is_from_another_rank ||
                ri.failure.origin_rank != 1) {
                fprintf(stderr, "soak_rooms: room %llu: failure record wrong\n",
                        (unsigned long long)room);
                return 1;
            }
            failed++;
        } else {
            for (uint32_t r = 0; r < 2; r++) {
                CHECK(kvc_room_set_state(seg, room, r, KVC_POLL_TRANSFERRING), "set_state");
                CHECK(kvc_room_set_state(seg, room, r, KVC_POLL_SUCCESS), "set_state");
            }
            CHECK(kvc_room_get(seg, room, 1, &ri), "room_get");
            if (ri.state != KVC_POLL_SUCCESS) {
                fprintf(stderr, "soak_rooms: room %llu: %s, expected Success\n",
                        (unsigned long long)room, kvc_poll_name(ri.state));
                return 1;
            }
            ok++;
        }
        CHECK(kvc_room_release(seg, room, 0), "release 0");
        CHECK(kvc_room_release(seg, room, 1), "release 1");
        if (i % 16 == 0)
            usleep(2000); /* rooms are not the point: leave CPU to the HTTP load */
    }
    kvc_close(seg);
    printf("soak_rooms: rooms succeeded=%lu failed=%lu worker_died=%lu\n", ok, failed, died);
    return 0;
}
