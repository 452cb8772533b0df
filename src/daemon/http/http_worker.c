/*
 * http_worker.c - the helper threads for requests the event loop must not
 * run; see http_worker.h.
 */
#include "http_worker.h"
#include "wake.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <sys/eventfd.h>
#include <unistd.h>

struct http_worker;

struct worker_thread {
    struct http_worker *w;
    struct routes *routes; /* this thread's own (its scratch buffers) */
    pthread_t thread;
    int started;
};

struct http_worker {
    int efd;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct worker_job *queue_head, *queue_tail; /* submitted, first in first out */
    struct worker_job *done;                    /* finished, any order */
    int stop;
    unsigned nthreads;
    struct worker_thread *threads;
};

static void *worker_main(void *arg)
{
    struct worker_thread *t = arg;
    struct http_worker *w = t->w;
    pthread_mutex_lock(&w->mu);
    for (;;) {
        while (!w->stop && !w->queue_head)
            pthread_cond_wait(&w->cv, &w->mu);
        if (w->stop)
            break;
        struct worker_job *job = w->queue_head;
        job->started = 1;
        w->queue_head = job->next;
        if (!w->queue_head)
            w->queue_tail = NULL;
        pthread_mutex_unlock(&w->mu);

        routes_deferred(t->routes, job->req, &job->out);

        pthread_mutex_lock(&w->mu);
        job->next = w->done;
        w->done = job;
        wake_loop(w->efd);
    }
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

int worker_start(struct http_worker **out, struct routes *r, unsigned nthreads, int *efd)
{
    struct http_worker *w = calloc(1, sizeof *w);
    if (!w)
        return -1;
    if (nthreads < 1)
        nthreads = 1;
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
    w->threads = calloc(nthreads, sizeof *w->threads);
    w->efd = eventfd(0, EFD_CLOEXEC);
    int err = !w->threads || w->efd < 0 ? (errno ? errno : ENOMEM) : 0;
    for (unsigned i = 0; !err && i < nthreads; i++) {
        struct worker_thread *t = &w->threads[i];
        t->w = w;
        if (routes_clone(r, &t->routes)) {
            err = ENOMEM;
            break;
        }
        w->nthreads = i + 1;
        if ((err = pthread_create(&t->thread, NULL, worker_main, t)) == 0)
            t->started = 1;
    }
    if (err) {
        worker_stop(w);
        errno = err;
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
    job->started = 0;
    if (w->queue_tail)
        w->queue_tail->next = job;
    else
        w->queue_head = job;
    w->queue_tail = job;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

int worker_job_started(struct http_worker *w, const struct worker_job *job)
{
    pthread_mutex_lock(&w->mu);
    int started = job->started;
    pthread_mutex_unlock(&w->mu);
    return started;
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
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
    for (unsigned i = 0; i < w->nthreads; i++) {
        if (w->threads[i].started)
            pthread_join(w->threads[i].thread, NULL);
        routes_destroy(w->threads[i].routes);
    }
    free(w->threads);
    pthread_cond_destroy(&w->cv);
    pthread_mutex_destroy(&w->mu);
    if (w->efd >= 0)
        close(w->efd);
    free(w);
}
