/*
 * http_worker.h - helper threads for request work the event loop must not
 * do: everything that may wait for a segment lock (registrations,
 * withdrawals, the room routes, failure records, /metrics when its rooms
 * figures must be read), and parsing a multi-megabyte weights_info_dict
 * (hundreds of milliseconds).  A lock held by a stopped process makes a
 * request wait up to the segment's lock timeout here, never on the loop, so
 * /health and lookups on other connections are answered meanwhile.
 *
 * The loop submits a job (its request stays untouched until the job is
 * done); one of the threads runs routes_deferred() with routes of its own
 * (routes_clone: separate scratch buffers), writes the answer into the
 * job's own buffer and signals an eventfd that the loop reads on its ring;
 * the loop then takes the finished jobs.  Jobs start in submission order.
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
    int started; /* a thread took it (under the worker's lock) */
};

/* Number of threads kvcoordd starts: so many requests may wait for a busy
 * lock at once while others still run. */
#define WORKER_THREADS 4

/* Start nthreads threads (at least 1), each with a clone of r.  *efd
 * receives the eventfd to read (owned by the worker).  Returns 0, or -1
 * with errno set (nothing left running). */
int worker_start(struct http_worker **out, struct routes *r, unsigned nthreads, int *efd);

/* Queue a job (the loop thread only). */
void worker_submit(struct http_worker *w, struct worker_job *job);

/* Has a thread begun job (submitted by the loop, not yet taken back)?
 * Until it has, a request identical to job's that arrives may share its
 * answer: the state is read after both arrived (the loop thread only). */
int worker_job_started(struct http_worker *w, const struct worker_job *job);

/* Take every finished job, as a list linked by next (NULL if none). */
struct worker_job *worker_take_done(struct http_worker *w);

/* Finish the jobs being run, drop the queued ones, join the threads, close
 * the eventfd and free w (NULL ignored). */
void worker_stop(struct http_worker *w);

#endif /* KVC_HTTP_WORKER_H */
