/* tu_proc.c - the C tests' child-process helpers (tu_proc.h). */
#include "tu_proc.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

int tu_wait_exit(pid_t pid)
{
    int status;
    if (waitpid(pid, &status, 0) != pid)
        return -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : TU_KILLED(WTERMSIG(status));
}

void tu_reap_ok(const pid_t *pids, int n)
{
    for (int i = 0; i < n; i++)
        assert_int_equal(tu_wait_exit(pids[i]), 0);
}

void tu_fork_gated(const char *name, uint32_t n, tu_gated_child child, pid_t *pids, int *ready,
                   int *go)
{
    int rep[2], g[2];
    assert_int_equal(pipe(rep), 0);
    assert_int_equal(pipe(g), 0);
    for (uint32_t r = 0; r < n; r++)
        if ((pids[r] = fork()) == 0) {
            close(g[1]);
            close(rep[0]);
            _exit(child(name, r, rep[1], g[0]));
        }
    close(rep[1]);
    close(g[0]);
    *ready = rep[0];
    *go = g[1];
}
