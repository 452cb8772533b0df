/* bench_rooms.h - `kvcoord-bench rooms`: failure propagation latency across
 * processes and room operations per second with 1, 2 and 8 processes. */
#ifndef KVC_BENCH_ROOMS_H
#define KVC_BENCH_ROOMS_H

#include <stdio.h>
#include <stdlib.h>

#include "kvcoord/kvcoord.h"

/* argv[1] is "rooms".  Returns the process exit status. */
int bench_rooms_main(int argc, char **argv);

/* The synopsis lines of the rooms subcommand. */
void bench_rooms_usage(FILE *out);

/* Open (mode) segment `name` with the room benchmarks' capacities (4,096
 * rooms, 16 ranks), as a client; on failure prints "PROG: reason" and
 * exits 1 (a benchmark's child has nothing to clean).  Shared by
 * kvcoord-bench rooms and kvcoord-probe-rooms, so both measure one
 * layout. */
static inline kvc_segment *bench_rooms_open(const char *name, kvc_open_mode mode, const char *prog)
{
    kvc_options o;
    kvc_options_init(&o);
    o.name = name;
    o.mode = mode;
    o.role = KVC_ROLE_CLIENT;
    o.max_ranks = 16;
    o.arena_bytes = 1 << 20;
    o.max_info_bytes = 1 << 16;
    o.max_rooms = 4096;
    kvc_segment *s = NULL;
    if (kvc_open(&o, &s) != KVC_OK) {
        fprintf(stderr, "%s: %s\n", prog, kvc_last_error());
        exit(1);
    }
    return s;
}

#endif
