/*
 * bench_transfer.h - kvcoord-bench's transfer-engine subcommands (`transfer`
 * and `kv`, tools/bench/bench_transfer.c; `transfer --compare`,
 * tools/bench/bench_transfer_cmp.c), called from bench.c's dispatch.
 */
#ifndef KVC_BENCH_TRANSFER_H
#define KVC_BENCH_TRANSFER_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "kvcoord/transfer.h"

/* One measurement's parameters (the command line). */
typedef struct bt_args {
    int kv;
    kvt_backend backend;
    uint64_t block;
    uint32_t batch, conns, depth, wset;
    int pin_send, pin_recv; /* CPU of each process; -1: not pinned */
    int64_t splice_min;     /* kvt_options.tcp_splice_min; -1: the engine's default */
    double duration;
    const char *listen;
    int json;
    int compare;    /* --compare: iperf3, the engine, splice on and off, by rounds */
    int rounds;     /* --rounds (compare), default 5 */
    int wset_given; /* --working-set was given (compare defaults it to 1) */
    int conns_given;
    int block_given; /* --block was given (compare: that block only) */
    int read;        /* --read: this process pulls the blocks (kvt_submit_read)
                        from the forked one instead of writing them */
    int rw;          /* --rw: rounds of iperf3, engine write, engine read */
    int batch_given, depth_given;
    int same_host; /* --same-host: let the engines copy (xfer_cma.c); default:
                        force_socket, the TCP engine against iperf3 */
} bt_args;

/* What one measurement gave. */
typedef struct bt_result {
    double secs, gbs, cpu_s_per_gb, ops, lat_med_ms, lat_p99_ms;
    uint64_t rooms, failed, room_bytes, bytes, bytes_spliced;
    uint32_t slots; /* distinct blocks on each side */
    size_t nruns;
    kvt_backend backend;
} bt_result;

/* argv[1] is "transfer" or "kv"; options follow.  Returns the exit status
 * (0 measured, 1 runtime error or a failed room, 2 usage). */
int bench_transfer_main(int argc, char **argv);

/* One measurement: a forked receiver, this process's sender, for
 * a->duration seconds.  0, or 1 on a runtime error (message on stderr) or
 * a failed room (res filled as far as it got). */
int bench_transfer_run(const bt_args *a, bt_result *res);

/* --compare (bench_transfer_cmp.c): at a->block if a->block_given, else at
 * 1 MiB and 4 MiB, a->rounds rounds of iperf3 -c against an iperf3 -s it
 * starts, the send/recv loop at the block (bench_sock_run), the engine
 * with splice on (a->splice_min, or 256 KiB) and off; the engine's figure
 * is the one its default tcp_splice_min selects.  Prints each round and
 * the medians per block.  Exit status as bench_transfer_main's, or 77 when iperf3 is
 * missing (or its server did not start). */
int bench_transfer_compare(const bt_args *a);

/* --rw (bench_transfer_cmp.c): a->rounds rounds, each measuring in a
 * rotated order iperf3 -c -P1 -l 1 MiB, the engine writing and the engine
 * reading the same scattered blocks (default 64 KiB x 256 per room, every
 * block distinct, depth 1: one call at a time); prints each round and the
 * medians with the ratios read / iperf3, write / iperf3, read / write.
 * Exit status as bench_transfer_compare's. */
int bench_transfer_rw(const bt_args *a);

/* The same-block baseline of --compare (bench_sock.c): a plain blocking
 * send() loop of one a->block-sized buffer over one loopback TCP
 * connection to a forked receiver recv()ing into one such buffer, for
 * a->duration seconds (pinned as a->pin_send / pin_recv).  *gbs: bytes
 * received per second (1e9); *cpu_s_per_gb: CPU seconds of both
 * processes per GB.  0, or -1 (said why on stderr). */
int bench_sock_run(const bt_args *a, double *gbs, double *cpu_s_per_gb);

/* The two subcommands' synopsis lines, for kvcoord-bench --help. */
void bench_transfer_usage(FILE *out);

#endif
