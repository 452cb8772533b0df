/*
 * lock_holder.c - a process that stops itself (SIGSTOP, as a debugger or a
 * cgroup freezer would) while it holds one of the segment's locks, for
 * test_stopped_lock.py.
 *
 *   lock_holder SEGMENT ranks   inside a registration of rank 999, after its
 *                               info was allocated (crash-injection point
 *                               reg.allocated: the ranks lock is held)
 *   lock_holder SEGMENT rooms   inside kvc_room_open of room 4242 (point
 *                               room.creating: the rooms lock is held)
 *   lock_holder SEGMENT procs   holding the procs lock (taken directly)
 *
 * Attaches as a client (so its death withdraws nothing), prints
 * "stopping PID LOCK" and stops.  After SIGCONT it finishes the call,
 * detaches and exits 0; killed instead, the next locker recovers the lock.
 */
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "internal.h"
#include "kvcoord/kvcoord.h"

static const char *stop_point;
static const char *lock_name;

static void stop_here(void)
{
    printf("stopping %d %s\n", (int)getpid(), lock_name);
    fflush(stdout);
    raise(SIGSTOP);
}

static void at_point(const char *point)
{
    if (stop_point && !strcmp(point, stop_point)) {
        stop_point = NULL; /* once */
        stop_here();
    }
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: lock_holder SEGMENT ranks|rooms|procs\n");
        return 2;
    }
    lock_name = argv[2];
    kvc_options o;
    kvc_options_init(&o);
    o.name = argv[1];
    o.mode = KVC_OPEN_ATTACH;
    o.role = KVC_ROLE_CLIENT;
    kvc_segment *seg = NULL;
    if (kvc_open(&o, &seg)) {
        fprintf(stderr, "lock_holder: %s\n", kvc_last_error());
        return 1;
    }
    kvc_err e = KVC_OK;
    if (!strcmp(lock_name, "ranks")) {
        static const char info[] = "{\"held.weight\":[140000000000,1024,2]}";
        stop_point = "reg.allocated";
        kvc__test_set_inject(at_point);
        e = kvc_rank_register(seg, 999, "10.0.0.99:1", info, sizeof info - 1, NULL);
    } else if (!strcmp(lock_name, "rooms")) {
        stop_point = "room.creating";
        kvc__test_set_inject(at_point);
        e = kvc_room_open(seg, 4242, 1, 0, KVC_ROOM_ROLE_PREFILL);
    } else if (!strcmp(lock_name, "procs")) {
        e = kvc__lock(seg, KVC_LOCK_PROCS);
        if (!e) {
            stop_here();
            kvc__unlock(seg, KVC_LOCK_PROCS);
        }
    } else {
        fprintf(stderr, "lock_holder: unknown lock '%s'\n", lock_name);
        return 2;
    }
    kvc__test_set_inject(NULL);
    if (e)
        fprintf(stderr, "lock_holder: %s\n", kvc_last_error());
    kvc_close(seg);
    return e ? 1 : 0;
}
