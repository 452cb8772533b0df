/* bench_rooms.h - `kvcoord-bench rooms`: failure propagation latency across
 * processes and room operations per second with 1, 2 and 8 processes. */
#ifndef KVC_BENCH_ROOMS_H
#define KVC_BENCH_ROOMS_H

#include <stdio.h>

/* argv[1] is "rooms".  Returns the process exit status. */
int bench_rooms_main(int argc, char **argv);

/* The synopsis lines of the rooms subcommand. */
void bench_rooms_usage(FILE *out);

#endif
