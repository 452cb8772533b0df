/* tu_proc.h - the C tests' one library of child-process helpers
 * (tests/testlib/, linked into every kvc_c_test): a forked child's exit
 * decoded, children reaped, ranks forked behind a ready/go gate.  A test
 * that needs one of these includes this header rather than writing its own.
 * Failures are cmocka failures of the calling test.  Not thread-safe (the
 * tests fork from one thread). */
#ifndef KVC_TU_PROC_H
#define KVC_TU_PROC_H

#include <stdint.h>
#include <sys/types.h>

/* What tu_wait_exit() returns for a child killed by signal sig: 128 + sig,
 * as a shell reports it (exit codes of the tests' children stay below 128). */
#define TU_KILLED(sig) (128 + (sig))

/* Wait for child pid: its exit code (0..255), TU_KILLED(sig) when a signal
 * ended it, -1 when waitpid() fails (not a child, already reaped). */
int tu_wait_exit(pid_t pid);

/* Wait for each of pids[0..n-1]; fails the test unless every one exited 0. */
void tu_reap_ok(const pid_t *pids, int n);

/* A child forked by tu_fork_gated(): writes a byte to ready_fd once it is
 * where the test wants it, then waits on go_fd (a byte or EOF, the parent
 * closing its end); returns its exit code. */
typedef int (*tu_gated_child)(const char *name, uint32_t rank, int ready_fd, int go_fd);

/* Fork ranks 0..n-1 running child(name, rank, ready, go) and exiting with
 * its result, into pids[].  The parent keeps *ready, the ready pipe's read
 * end (EOF once every child has exited: a child that dies before reporting
 * ends the read), and *go, the go pipe's write end (a byte written wakes one
 * waiting child; closing it lets them all go on).  The caller closes both. */
void tu_fork_gated(const char *name, uint32_t n, tu_gated_child child, pid_t *pids, int *ready,
                   int *go);

#endif
