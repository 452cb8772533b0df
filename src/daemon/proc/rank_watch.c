/*
 * rank_watch.c - the long-poll helper thread; see rank_watch.h.
 */
#include "rank_watch.h"
#include "wake.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>

/* Bound on one futex sleep, so a stop request is seen within it
 * (kvc_close must not race the thread's calls). */
#define WATCH_SLICE_MS 250

struct rank_watch {
    kvc_segment *seg;
    int efd;
    pthread_t thread;
    pthread_mutex_t mu; /* guards stop */
    int stop;
};

static void notify(struct rank_watch *w) { wake_loop(w->efd); }

/* Always waiting (the daemon logs every change of the rank table, not only
 * those a parked lookup waits for).  seen starts at the epoch when the
 * thread starts; a lookup parked later read an epoch at least as new, and
 * every change after it is followed by a write of the eventfd. */
static void *watch_main(void *arg)
{
    struct rank_watch *w = arg;
    uint32_t seen = kvc_rank_epoch(w->seg);
    pthread_mutex_lock(&w->mu);
    while (!w->stop) {
        pthread_mutex_unlock(&w->mu);
        kvc_err e = kvc_rank_wait_change(w->seg, seen, WATCH_SLICE_MS);
        if (e == KVC_OK) {
            seen = kvc_rank_epoch(w->seg); /* before notify: see rank_watch.h */
            notify(w);
        }
        pthread_mutex_lock(&w->mu);
    }
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

int rank_watch_start(struct rank_watch **out, kvc_segment *seg, int *efd)
{
    struct rank_watch *w = calloc(1, sizeof *w);
    if (!w)
        return -1;
    w->seg = seg;
    pthread_mutex_init(&w->mu, NULL);
    if (wake_thread_start(&w->efd, &w->thread, watch_main, w)) {
        pthread_mutex_destroy(&w->mu);
        free(w);
        return -1;
    }
    *efd = w->efd;
    *out = w;
    return 0;
}

void rank_watch_stop(struct rank_watch *w)
{
    if (!w)
        return;
    pthread_mutex_lock(&w->mu);
    w->stop = 1;
    pthread_mutex_unlock(&w->mu);
    pthread_join(w->thread, NULL);
    pthread_mutex_destroy(&w->mu);
    close(w->efd);
    free(w);
}
