/* torture.c - kvcoord-torture: crash torture of the segment.
 *
 * Each round forks several workers doing random operations (registrations,
 * withdrawals, room updates, failure records), SIGKILLs one at a random
 * moment while others may kill themselves at random crash-injection points
 * inside critical sections, stops the rest, then reaps the dead as kvcoordd
 * would and checks every invariant (as `kvcoord-diag check`) and that no
 * committed registration or failure record was lost. */
#include <errno.h>
#include <getopt.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "inspect.h"
#include "torture.h"

static const char usage[] =
    "Usage: kvcoord-torture [OPTIONS]\n"
    "\n"
    "Crash torture of a kvcoord segment.  Every round forks --workers processes\n"
    "that register, withdraw and update rooms at random; one is SIGKILLed at a\n"
    "random moment and others kill themselves at random crash-injection points\n"
    "inside critical sections.  After each round the dead are reaped, every\n"
    "invariant is checked (as kvcoord-diag check does), and every registration and\n"
    "failure record a worker was told was committed must still be there.\n"
    "\n"
    "Options:\n"
    "  -r, --rounds N        rounds to run (default 300; the documented long run is\n"
    "                        10000)\n"
    "  -w, --workers N       worker processes per round, 2..8 (default 4)\n"
    "  -s, --seed N          random seed (default 1); runs are repeatable up to timing\n"
    "  -d, --max-delay-us N  the kill comes 0..N microseconds into a round (default 3000)\n"
    "  -k, --selfkill N      a worker dies at an injection point with probability 1/N\n"
    "                        per point (default 400; 0 disables)\n"
    "  -S, --segment NAME    segment to use (default kvcoord-torture-<pid>; created\n"
    "                        fresh and removed at the end)\n"
    "  -v, --verbose         one line per round\n"
    "  -h, --help            this text\n"
    "\n"
    "Output: one summary line: rounds, kills, self-kills, lock recoveries,\n"
    "operations, invariant violations and lost (committed data not found).\n"
    "\n"
    "Exit status: 0 when nothing was lost and every invariant held, 1 otherwise,\n"
    "2 on a usage error.\n";

static int parse(int argc, char **argv, struct torture_opts *o)
{
    static const struct option longs[] = {{"rounds", required_argument, 0, 'r'},
                                          {"workers", required_argument, 0, 'w'},
                                          {"seed", required_argument, 0, 's'},
                                          {"max-delay-us", required_argument, 0, 'd'},
                                          {"selfkill", required_argument, 0, 'k'},
                                          {"segment", required_argument, 0, 'S'},
                                          {"verbose", no_argument, 0, 'v'},
                                          {"help", no_argument, 0, 'h'},
                                          {0, 0, 0, 0}};
    int c;
    while ((c = getopt_long(argc, argv, "r:w:s:d:k:S:vh", longs, NULL)) != -1) {
        char *end = NULL;
        unsigned long v = optarg ? strtoul(optarg, &end, 10) : 0;
        if (optarg && (*end || end == optarg)) {
            fprintf(stderr, "kvcoord-torture: '%s' is not a number\n", optarg);
            return 2;
        }
        switch (c) {
        case 'r': o->rounds = (unsigned)v; break;
        case 'w': o->workers = (unsigned)v; break;
        case 's': o->seed = (unsigned)v; break;
        case 'd': o->max_delay_us = (unsigned)v; break;
        case 'k': o->selfkill_per = (unsigned)v; break;
        case 'S': o->segment = optarg; break;
        case 'v': o->verbose = 1; break;
        case 'h': fputs(usage, stdout); exit(0);
        default: fputs(usage, stderr); return 2;
        }
    }
    if (optind < argc || o->workers < 2 || o->workers > T_MAX_WORKERS) {
        fprintf(stderr, "kvcoord-torture: --workers must be 2..%d and no operands are taken\n",
                T_MAX_WORKERS);
        return 2;
    }
    return 0;
}

struct stats {
    unsigned kills, selfkills;
    size_t lost, violations;
};

/* Read every worker's log until all closed it; feed the model. */
static void drain(int *fds, unsigned n, struct model *m)
{
    char buf[n][256];
    size_t have[T_MAX_WORKERS] = {0};
    unsigned open = n;
    while (open) {
        struct pollfd p[T_MAX_WORKERS];
        for (unsigned i = 0; i < n; i++)
            p[i] = (struct pollfd){.fd = fds[i], .events = POLLIN};
        if (poll(p, n, -1) < 0 && errno != EINTR)
            break;
        for (unsigned i = 0; i < n; i++) {
            if (fds[i] < 0 || !(p[i].revents & (POLLIN | POLLHUP)))
                continue;
            ssize_t r = read(fds[i], buf[i] + have[i], sizeof buf[i] - 1 - have[i]);
            if (r <= 0) {
                close(fds[i]);
                fds[i] = -1;
                open--;
                continue;
            }
            have[i] += (size_t)r;
            buf[i][have[i]] = '\0';
            char *nl, *line = buf[i];
            while ((nl = strchr(line, '\n'))) {
                *nl = '\0';
                model_line(m, line);
                line = nl + 1;
            }
            have[i] = strlen(line);
            memmove(buf[i], line, have[i] + 1);
        }
    }
}

static void check_cb(void *ctx, kvc_severity sev, const char *id, const char *msg)
{
    unsigned *round = ctx;
    if (sev >= KVC_SEV_DEGRADED)
        fprintf(stderr, "round %u: invariant %s: %s: %s\n", *round, id, kvc__severity_name(sev),
                msg);
}

static void round_once(const struct torture_opts *o, unsigned round, kvc_segment *seg,
                       struct model *m, struct stats *st)
{
    pid_t pids[T_MAX_WORKERS];
    int fds[T_MAX_WORKERS];
    for (unsigned w = 0; w < o->workers; w++) {
        int p[2];
        if (pipe(p) < 0) {
            perror("pipe");
            exit(1);
        }
        if ((pids[w] = fork()) == 0) {
            close(p[0]);
            torture_worker(o, w, round, p[1]);
        }
        close(p[1]);
        fds[w] = p[0];
    }
    unsigned seed = o->seed + round;
    usleep(o->max_delay_us ? (useconds_t)(rand_r(&seed) % o->max_delay_us) : 0);
    unsigned victim = (unsigned)rand_r(&seed) % o->workers;
    kill(pids[victim], SIGKILL);
    for (unsigned w = 0; w < o->workers; w++)
        if (w != victim)
            kill(pids[w], SIGUSR1);
    drain(fds, o->workers, m);
    for (unsigned w = 0; w < o->workers; w++) {
        int status = 0;
        waitpid(pids[w], &status, 0);
        if (WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL)
            w == victim ? st->kills++ : st->selfkills++;
        else if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
            fprintf(stderr, "round %u: worker %u ended with status 0x%x\n", round, w, status);
    }
    /* As kvcoordd would: reap the dead (taking each lock recovers it). */
    size_t reaped = 0;
    if (kvc_proc_reap_dead(seg, &reaped) != KVC_OK)
        fprintf(stderr, "round %u: reap: %s\n", round, kvc_last_error());
    if (kvc__check(seg, check_cb, &round, NULL) >= KVC_SEV_DEGRADED)
        st->violations++;
    st->lost += model_check(m, seg, round);
    if (o->verbose)
        printf("round %u: victim %u, reaped %zu, ops so far %zu\n", round, victim, reaped, m->ops);
}

int main(int argc, char **argv)
{
    struct torture_opts o = {
        .rounds = 300, .workers = 4, .seed = 1, .max_delay_us = 3000, .selfkill_per = 400};
    int rc = parse(argc, argv, &o);
    if (rc)
        return rc;
    char name[64];
    if (!o.segment) {
        snprintf(name, sizeof name, "kvcoord-torture-%d", (int)getpid());
        o.segment = name;
    }
    kvc_options opts;
    kvc_options_init(&opts);
    opts.name = o.segment;
    opts.mode = KVC_OPEN_FRESH;
    opts.role = KVC_ROLE_NONE;
    opts.max_ranks = 64;
    opts.arena_bytes = 64ull << 20;
    opts.max_rooms = 256;
    kvc_segment *seg;
    if (kvc_open(&opts, &seg) != KVC_OK) {
        fprintf(stderr, "kvcoord-torture: %s\n", kvc_last_error());
        return 1;
    }
    static struct model m;
    struct stats st = {0};
    sigset_t set; /* workers unblock SIGUSR1 once their handler is set */
    sigemptyset(&set);
    sigaddset(&set, SIGUSR1);
    sigprocmask(SIG_BLOCK, &set, NULL);
    for (unsigned r = 0; r < o.rounds; r++)
        round_once(&o, r, seg, &m, &st);
    st.violations += m.torn; /* lock-free room reads that were not one whole room */
    kvc_segment_info si;
    kvc_segment_stat(seg, &si);
    printf("rounds %u, workers %u, kills %u, self-kills %u, lock recoveries %llu, operations %zu, "
           "invariant violations %zu, lost %zu\n",
           o.rounds, o.workers, st.kills, st.selfkills, (unsigned long long)si.lock_recoveries,
           m.ops, st.violations, st.lost);
    kvc_close(seg);
    kvc_unlink(o.segment);
    return st.lost || st.violations ? 1 : 0;
}
