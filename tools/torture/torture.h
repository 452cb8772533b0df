/* torture.h - kvcoord-torture: random worker operations in several
 * processes, SIGKILL at random moments (inside critical sections too),
 * invariants and durability checked after every round. */
#ifndef KVC_TORTURE_H
#define KVC_TORTURE_H

#include <stddef.h>
#include <stdint.h>

#include "kvcoord/kvcoord.h"

#define T_RANKS 16 /* ranks 0..15; worker w owns ranks r with r % workers == w */
#define T_ROOMS 48 /* room ids 1..48, shared by every worker */
#define T_MAX_WORKERS 8

struct torture_opts {
    const char *segment;
    unsigned rounds, workers, seed;
    unsigned max_delay_us; /* the kill comes 0..max_delay_us after the start */
    unsigned selfkill_per; /* a worker kills itself at an injection point with
                                probability 1/selfkill_per */
    int verbose, json;
};

/* torture_worker.c: run random operations until SIGUSR1, logging each
 * one to out_fd before ("A ...") and after it succeeded ("C ...").
 * Never returns. */
void torture_worker(const struct torture_opts *o, unsigned worker, unsigned round, int out_fd);

/* torture_model.c: what the workers' logs say must be in the segment. */
struct rank_model {
    int committed; /* 0 empty, 1 registered (value), 2 withdrawn */
    uint64_t value;
    size_t npending; /* operations started after the last commit */
    struct {
        int kind;
        uint64_t value;
    } pending[8];
};

struct model {
    struct rank_model ranks[T_RANKS];
    uint64_t kept_values[4096]; /* failure records a worker was told were kept */
    size_t nkept;
    size_t ops;
    size_t torn; /* room reads (lock-free) that were not one whole room */
};

/* Feed one log line of a worker into the model. */
void model_line(struct model *m, const char *line);
/* Compare the segment with the model; returns the number of losses and
 * describes each with fprintf(stderr). */
size_t model_check(struct model *m, kvc_segment *seg, unsigned round);

#endif
