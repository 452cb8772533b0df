/*
 * http_worker.c - the helper thread for slow requests; see http_worker.h.
 */
#include "http_worker.h"
#include "wake.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>

struct http_worker {
    struct routes *routes;
    int efd;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct worker_job *queue_head, *queue_tail; /* submitted, first in first out */
    struct worker_job *done;                    /* finished, any order */
    int stop;
};

static void *worker_main(void *arg)
{
    struct http_worker *w = arg;
    pthread_mutex_lock(&w->mu);
    for (;;) {
        while (!w->stop && !w->queue_head)
            pthread_cond_wait(&w->cv, &w->mu);
        if (w->stop)
            break;
        struct worker_job *job = w->queue_head;
        w->queue_head = job->next;
        if (!w->queue_head)
            w->queue_tail = NULL;
        pthread_mutex_unlock(&w->mu);

        routes_deferred(w->routes, job->req, &job->out);

        pthread_mutex_lock(&w->mu);
        job->next = w->done;
        w->done = job;
        wake_loop(w->efd);
    }
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

int worker_start(struct http_worker **out, struct routes *r, int *efd)
{
    struct http_worker *w = calloc(1, sizeof *w);
    if (!w)
        return -1;
    w->routes = r;
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
    if (wake_thread_start(&w->efd, &w->thread, worker_main, w)) {
        free(w);
        return -1;
    }
    *efd = w->efd;
    *out = w;
    return 0;
}

void worker_submit(struct http_worker *w, struct worker_job *job)
{
    job->next = NULL;
    pthread_mutex_lock(&w->mu);
    if (w->queue_tail)
        w->queue_tail->next = job;
    else
        w->queue_head = job;
    w->queue_tail = job;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

struct worker_job *worker_take_done(struct http_worker *w)
{
    pthread_mutex_lock(&w->mu);
    struct worker_job *list = w->done;
    w->done = NULL;
    pthread_mutex_unlock(&w->mu);
    return list;
}

void worker_stop(struct http_worker *w)
{
    if (!w)
        return;
    pthread_mutex_lock(&w->mu);
    w->stop = 1;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
    pthread_join(w->thread, NULL);
    pthread_cond_destroy(&w->cv);
    pthread_mutex_destroy(&w->mu);
    close(w->efd);
    free(w);
}
