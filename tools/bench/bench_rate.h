/* bench_rate.h - `kvcoord-bench rate`: HTTP GET latency at a fixed, open-loop
 * request rate (bench_rate.c). */
#ifndef KVC_BENCH_RATE_H
#define KVC_BENCH_RATE_H

#include <stdio.h>

/* argv[1] is "rate".  Returns the process exit status (0, 1 runtime, 2 usage). */
int bench_rate_main(int argc, char **argv);

/* The synopsis lines of the rate subcommand. */
void bench_rate_usage(FILE *out);

#endif
