/*
 * http_worker.h - a helper thread for request work too slow for the event
 * loop: a registration of a multi-megabyte weights_info_dict is parsed,
 * validated and stored here (hundreds of milliseconds), so lookups on other
 * connections are answered meanwhile.
 *
 * The loop submits a job (its request stays untouched until the job is
 * done); the thread runs routes_deferred(), writes the answer into the
 * job's own buffer and signals an eventfd that the loop reads on its ring;
 * the loop then takes the finished jobs.
 */
#ifndef KVC_HTTP_WORKER_H
#define KVC_HTTP_WORKER_H

#include "buf.h"
#include "http_req.h"
#include "http_routes.h"

struct http_worker;

struct worker_job {
    const struct http_req *req; /* read by the worker until the job is done */
    struct buf out;             /* the answer, written by the worker */
    struct worker_job *next;
};

/* Start the thread.  *efd receives the eventfd to read (owned by the
 * worker).  Returns 0, or -1 with errno set. */
int worker_start(struct http_worker **out, struct routes *r, int *efd);

/* Queue a job (the loop thread only). */
void worker_submit(struct http_worker *w, struct worker_job *job);

/* Take every finished job, as a list linked by next (NULL if none). */
struct worker_job *worker_take_done(struct http_worker *w);

/* Finish the job being run, drop the queued ones, join the thread, close the
 * eventfd and free w (NULL ignored). */
void worker_stop(struct http_worker *w);

#endif /* KVC_HTTP_WORKER_H */
