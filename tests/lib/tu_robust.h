/*
 * tu_robust.h - where the kernel keeps no robust futex lists (qemu-user:
 * tu_probe_robust() says so), a crash test stands in for the kernel's walk
 * of a dead process's list, so the library's recovery (EOWNERDEAD, repair,
 * pthread_mutex_consistent) still runs under it.
 *
 * What Linux does for each robust mutex on the list of a thread that exits
 * or is killed (kernel/futex/core.c, handle_futex_death; the futex word
 * layout is include/uapi/linux/futex.h): if the word's owner TID is the
 * dead thread's, it atomically becomes FUTEX_OWNER_DIED plus the word's
 * FUTEX_WAITERS bit, and one waiter is woken if that bit was set.  glibc's
 * next lock or trylock of the mutex then sees FUTEX_OWNER_DIED, takes it
 * and returns EOWNERDEAD.  tu_owner_died() does exactly that to every
 * segment lock whose word names the dead process (a test's victims are
 * single-threaded: their TID is their pid), after it was reaped.
 */
#ifndef KVC_TU_ROBUST_H
#define KVC_TU_ROBUST_H

#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "internal.h"
#include "tu_probe.h"

/* Mark the segment locks the reaped process dead held as their owner's
 * death leaves them on a kernel with robust futex lists; returns how many.
 * Does nothing (0) where the kernel does it itself. */
static inline int tu_owner_died(kvc_segment *s, pid_t dead)
{
    static int said;
    const char *why = tu_probe_robust();
    if (!why)
        return 0;
    if (!said++)
        print_message("# %s: the test marks a dead process's locks FUTEX_OWNER_DIED itself, "
                      "as the kernel does at its exit (tests/lib/tu_robust.h)\n",
                      why);
    int marked = 0;
    for (int id = 0; id < KVC_LOCK_COUNT; id++) {
        /* glibc's futex word of the mutex */
        unsigned *word = (unsigned *)&kvc__lock_ptr(s, id)->mutex.__data.__lock;
        unsigned v = __atomic_load_n(word, __ATOMIC_SEQ_CST);
        while ((v & FUTEX_TID_MASK) == (unsigned)dead) {
            unsigned nv = (v & FUTEX_WAITERS) | FUTEX_OWNER_DIED;
            if (__atomic_compare_exchange_n(word, &v, nv, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {
                if (v & FUTEX_WAITERS)
                    syscall(SYS_futex, word, FUTEX_WAKE, 1, NULL, NULL, 0);
                marked++;
                break;
            }
        }
    }
    return marked;
}

#endif
