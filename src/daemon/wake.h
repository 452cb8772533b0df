/*
 * wake.h - kvcoordd's helper threads (large registrations, the rank-table
 * watch, the process watch) wake the io_uring loop through an eventfd the
 * loop reads; this is the one place that creates it and starts the thread.
 */
#ifndef KVC_WAKE_H
#define KVC_WAKE_H

#include <pthread.h>

/* Create the eventfd into *efd, then start fn(arg) in *thread.  Returns 0;
 * -1 with errno set and nothing left open (*efd = -1) on failure. */
int wake_thread_start(int *efd, pthread_t *thread, void *(*fn)(void *), void *arg);

/* Wake the loop: add 1 to efd's counter (blocks only at 2^64 - 2 unread
 * wake-ups, which the loop never lets happen). */
void wake_loop(int efd);

#endif
