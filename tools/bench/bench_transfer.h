/*
 * bench_transfer.h - kvcoord-bench's transfer-engine subcommands (`transfer`
 * and `kv`, tools/bench_transfer.c), called from bench.c's dispatch.
 */
#ifndef KVC_BENCH_TRANSFER_H
#define KVC_BENCH_TRANSFER_H

#include <stdio.h>

/* argv[1] is "transfer" or "kv"; options follow.  Returns the exit status
 * (0 measured, 1 runtime error or a failed room, 2 usage). */
int bench_transfer_main(int argc, char **argv);

/* The two subcommands' synopsis lines, for kvcoord-bench --help. */
void bench_transfer_usage(FILE *out);

#endif
