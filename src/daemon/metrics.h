/*
 * metrics.h - kvcoordd's counters and the Prometheus text exposition of
 * GET /metrics.
 *
 * Two kinds of figures:
 *  - the daemon's own, kept in struct metrics (HTTP requests by route and
 *    status, request latency histogram, connections, dead processes
 *    detected, token reloads, transfer bytes and errors by backend and
 *    peer): updated with the metrics_*() calls below, from any thread
 *    (relaxed atomics; the transfer table takes a mutex);
 *  - the segment's, read at render time through the public kvc_* API only
 *    (ranks, generations, rooms by state, failure records, lock recoveries,
 *    arena bytes, attached processes).
 *
 * metrics_render() writes text format 0.0.4 (HELP and TYPE for every
 * family, names prefixed kvcoord_, counters ending _total, durations in
 * _seconds, sizes in _bytes, label values escaped).  Every metric name,
 * type and label is listed in docs/operations.md.
 */
#ifndef KVC_METRICS_H
#define KVC_METRICS_H

#include <stddef.h>
#include <stdint.h>

#include "buf.h"
#include "kvcoord/kvcoord.h"

/* Content-Type of a GET /metrics answer. */
#define METRICS_CONTENT_TYPE "text/plain; version=0.0.4; charset=utf-8"

/* Route labels: index MR_OTHER ("other": any path the route table does
 * not know, 404s, and errors before routing), then one per path of the
 * route table, its label taken from the table's row (http_routes.h,
 * routes_label()).  A fixed set, so a client sending random paths cannot
 * grow the number of series.  metrics_route_of() maps a request path. */
enum metrics_route { MR_OTHER = 0 };
#define MR_MAX 32 /* labels the counters hold (http_routes.c asserts the table fits) */

/* Latency histogram upper bounds, seconds (long-polls wait up to 60 s). */
#define METRICS_BUCKETS 16

struct metrics;

/* Allocate zeroed counters.  Returns NULL when out of memory. */
struct metrics *metrics_create(void);
void metrics_destroy(struct metrics *m);

/* The route label index of path[0..len) (not NUL-terminated). */
unsigned metrics_route_of(const char *path, size_t len);

/* The label text of a route index ("/health", ..., "other"). */
const char *metrics_route_name(unsigned r);

/* One request answered: its route, HTTP status (100..599; others count as
 * 0) and time from its first byte to its answer being queued, nanoseconds. */
void metrics_request(struct metrics *m, unsigned route, int status, uint64_t duration_ns);

/* A connection accepted / closed (kvcoord_http_open_connections). */
void metrics_conn_open(struct metrics *m);
void metrics_conn_close(struct metrics *m);

/* A connection refused (the 503): max-conns were open, or its address held
 * max-conns-per-peer already. */
void metrics_conn_refused(struct metrics *m);

/* The request body bytes reserved now by all connections, and the budget
 * (kvcoord_http_buffered_bytes, _max). */
void metrics_buffered(struct metrics *m, uint64_t now, uint64_t max);

/* n connections closed at the cap to make room: they had waited long for
 * a request (kvcoord_http_connections_evicted_total). */
void metrics_conn_evicted(struct metrics *m, uint64_t n);

/* The answer bytes all connections hold now, not all sent, and their
 * budget (kvcoord_http_answer_bytes, _max; --max-answer-bytes). */
void metrics_answers(struct metrics *m, uint64_t now, uint64_t max);

/* An attached process found dead (pidfd fired / reaped), n of them
 * (UINT64_MAX takes one back: its reap failed and will be retried). */
void metrics_dead_processes(struct metrics *m, uint64_t n);

/* A SIGHUP token reload: ok 1 re-read, 0 failed (old token kept). */
void metrics_auth_reload(struct metrics *m, int ok);

/* The rooms and failure-record families need the segment's rooms lock.
 * metrics_rooms_refresh() reads them (waiting for the lock up to the
 * segment's lock timeout: call it from a thread that may wait, never the
 * event loop) and caches the text with the rooms epoch and failure count
 * it was read at; from the first call on, metrics_render() takes them from
 * the cache while it is current (no lock), and metrics_rooms_fresh() says
 * whether it is (lock-free: the loop may render /metrics itself then). */
void metrics_rooms_refresh(struct metrics *m, kvc_segment *seg);
int metrics_rooms_fresh(struct metrics *m, kvc_segment *seg);

/* Render every family into out (appended).  seg may be NULL: only the
 * daemon's own figures then.  A family the segment cannot give now (a lock
 * busy) is left out with a "# kvcoord: ..." comment line naming why (the
 * rooms families: the last ones read follow that line, see above).
 * Returns 0, or -1 when out ran out of memory (out->oom). */
int metrics_render(struct buf *out, kvc_segment *seg, const struct metrics *m);

/* Append v to out as a Prometheus label value, escaped: backslash, double
 * quote and newline as \\, \" and \n; bytes that are not valid UTF-8
 * become U+FFFD.  Without the surrounding quotes. */
void metrics_label_escape(struct buf *out, const char *v, size_t len);

#endif /* KVC_METRICS_H */
