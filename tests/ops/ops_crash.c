/*
 * ops_crash.c - a worker that dies for kvcoordd's tests, then is reaped by
 * this process at once (as a TP worker's parent would).
 *
 *   ops_crash SEGMENT lock RANK   the worker attaches and re-registers RANK;
 *                                 it is SIGKILLed inside the rank lock
 *                                 (publish window): the next locker recovers
 *   ops_crash SEGMENT kill RANK   the worker attaches, registers RANK and
 *                                 SIGKILLs itself right after
 *
 * Prints "pid PID" of the dead worker.  Exit 0 when the worker died by
 * SIGKILL, 1 otherwise.  Only the worker attaches: the lock is left to the
 * daemon (or the next request) to recover.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "internal.h"
#include "kvcoord/kvcoord.h"

static void die_at(const char *point)
{
    if (!strcmp(point, "reg.seq_odd"))
        raise(SIGKILL);
}

static void worker(const char *segment, int in_lock, uint32_t rank)
{
    kvc_options o;
    kvc_options_init(&o);
    o.name = segment;
    o.mode = KVC_OPEN_ATTACH;
    o.role = KVC_ROLE_WORKER;
    kvc_segment *seg = NULL;
    if (kvc_open(&o, &seg)) {
        fprintf(stderr, "ops_crash: %s\n", kvc_last_error());
        _exit(2);
    }
    static const char info[] = "{\"w\":[140000000000,1024,2]}";
    if (in_lock) /* a first registration, so the crash is in a re-registration */
        kvc_rank_register(seg, rank, "10.0.0.9:1", info, sizeof info - 1, NULL);
    if (in_lock)
        kvc__test_set_inject(die_at);
    kvc_rank_register(seg, rank, in_lock ? "10.0.0.9:2" : "10.0.0.9:1", info, sizeof info - 1,
                      NULL);
    raise(SIGKILL);
    _exit(3);
}

int main(int argc, char **argv)
{
    if (argc != 4 || (strcmp(argv[2], "lock") && strcmp(argv[2], "kill"))) {
        fprintf(stderr, "usage: ops_crash SEGMENT lock|kill RANK\n");
        return 2;
    }
    uint32_t rank = (uint32_t)strtoul(argv[3], NULL, 10);
    pid_t pid = fork();
    if (pid < 0)
        return 1;
    if (pid == 0)
        worker(argv[1], !strcmp(argv[2], "lock"), rank);
    int status;
    if (waitpid(pid, &status, 0) != pid)
        return 1;
    printf("pid %d\n", (int)pid);
    return WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL ? 0 : 1;
}
