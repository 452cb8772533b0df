/* wake.c - see wake.h. */
#include <errno.h>
#include <stdint.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "wake.h"

int wake_thread_start(int *efd, pthread_t *thread, void *(*fn)(void *), void *arg)
{
    *efd = eventfd(0, EFD_CLOEXEC);
    if (*efd < 0)
        return -1;
    int err = pthread_create(thread, NULL, fn, arg);
    if (err) {
        close(*efd);
        *efd = -1;
        errno = err;
        return -1;
    }
    return 0;
}

void wake_loop(int efd)
{
    uint64_t one = 1;
    ssize_t n = write(efd, &one, sizeof one);
    (void)n;
}
