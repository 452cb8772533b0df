/*
 * metrics.c - kvcoordd's counters and their Prometheus text exposition;
 * see metrics.h.  The segment's figures are read through the public kvc_*
 * API only, at render time.
 */
#include "metrics.h"

#include "clock.h"
#include "http_routes.h"
#include "kvcoord/pd.h"
#include "utf8.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define STATUS_MAX 600 /* statuses 100..599 are counted by code, others as 0 */

/* Latency bucket upper bounds: nanoseconds and the le label text. */
static const uint64_t bucket_ns[METRICS_BUCKETS] = {
    100000ull,     250000ull,     500000ull,      1000000ull,     2500000ull,   5000000ull,
    10000000ull,   25000000ull,   50000000ull,    100000000ull,   250000000ull, 500000000ull,
    1000000000ull, 2500000000ull, 10000000000ull, 60000000000ull,
};
static const char *const bucket_le[METRICS_BUCKETS] = {
    "0.0001", "0.00025", "0.0005", "0.001", "0.0025", "0.005", "0.01", "0.025",
    "0.05",   "0.1",     "0.25",   "0.5",   "1",      "2.5",   "10",   "60",
};

struct metrics {
    atomic_uint_fast64_t requests[MR_MAX][STATUS_MAX];
    atomic_uint_fast64_t buckets[MR_MAX][METRICS_BUCKETS + 1]; /* last: +Inf only */
    atomic_uint_fast64_t sum_ns[MR_MAX];
    atomic_int_fast64_t open_conns;
    atomic_uint_fast64_t conns_total, conns_refused;
    atomic_uint_fast64_t buffered, buffered_max; /* body budget (--max-buffered-bytes) */
    atomic_uint_fast64_t conns_evicted;
    atomic_uint_fast64_t answers, answers_max; /* answer budget (--max-answer-bytes) */
    atomic_uint_fast64_t dead_procs;
    atomic_uint_fast64_t reloads_ok, reloads_failed;
    /* The rooms and failure-record families, which need the rooms lock:
     * rendered off the loop and kept with the rooms epoch and failure count
     * they were read at (metrics_rooms_refresh). */
    pthread_mutex_t rooms_lock;
    atomic_int rooms_on;    /* the cache is in use (a refresh ran) */
    atomic_int rooms_valid; /* text matches (rooms_epoch, rooms_failures) */
    atomic_uint rooms_epoch;
    atomic_uint_fast64_t rooms_failures;
    uint64_t rooms_read_ms; /* CLOCK_MONOTONIC ms of the read */
    struct buf rooms_text;
};

struct metrics *metrics_create(void)
{
    struct metrics *m = calloc(1, sizeof *m);
    if (!m)
        return NULL;
    /* calloc's zero bytes are valid zero atomics on every target we build for */
    pthread_mutex_init(&m->rooms_lock, NULL);
    return m;
}

void metrics_destroy(struct metrics *m)
{
    if (!m)
        return;
    pthread_mutex_destroy(&m->rooms_lock);
    buf_free(&m->rooms_text);
    free(m);
}

/* ---- observing ---------------------------------------------------------- */

unsigned metrics_route_of(const char *path, size_t len) { return routes_label_of(path, len); }

const char *metrics_route_name(unsigned r) { return routes_label(r); }

void metrics_request(struct metrics *m, unsigned route, int status, uint64_t duration_ns)
{
    if (route >= routes_label_count())
        route = MR_OTHER;
    if (status < 100 || status >= STATUS_MAX)
        status = 0;
    atomic_fetch_add_explicit(&m->requests[route][status], 1, memory_order_relaxed);
    int b = 0;
    while (b < METRICS_BUCKETS && duration_ns > bucket_ns[b])
        b++;
    atomic_fetch_add_explicit(&m->buckets[route][b], 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&m->sum_ns[route], duration_ns, memory_order_relaxed);
}

void metrics_conn_open(struct metrics *m)
{
    atomic_fetch_add_explicit(&m->open_conns, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&m->conns_total, 1, memory_order_relaxed);
}

void metrics_conn_close(struct metrics *m)
{
    atomic_fetch_sub_explicit(&m->open_conns, 1, memory_order_relaxed);
}

void metrics_conn_refused(struct metrics *m)
{
    atomic_fetch_add_explicit(&m->conns_refused, 1, memory_order_relaxed);
}

void metrics_conn_evicted(struct metrics *m, uint64_t n)
{
    atomic_fetch_add_explicit(&m->conns_evicted, n, memory_order_relaxed);
}

void metrics_answers(struct metrics *m, uint64_t now, uint64_t max)
{
    atomic_store_explicit(&m->answers, now, memory_order_relaxed);
    atomic_store_explicit(&m->answers_max, max, memory_order_relaxed);
}

void metrics_buffered(struct metrics *m, uint64_t now, uint64_t max)
{
    atomic_store_explicit(&m->buffered, now, memory_order_relaxed);
    atomic_store_explicit(&m->buffered_max, max, memory_order_relaxed);
}

void metrics_dead_processes(struct metrics *m, uint64_t n)
{
    atomic_fetch_add_explicit(&m->dead_procs, n, memory_order_relaxed);
}

void metrics_auth_reload(struct metrics *m, int ok)
{
    atomic_fetch_add_explicit(ok ? &m->reloads_ok : &m->reloads_failed, 1, memory_order_relaxed);
}

/* ---- text format helpers ------------------------------------------------ */

void metrics_label_escape(struct buf *out, const char *v, size_t len)
{
    const unsigned char *s = (const unsigned char *)v;
    size_t i = 0;
    while (i < len) {
        size_t run = i;
        /* copy runs of plain bytes at once */
        while (run < len && s[run] >= 0x20 && s[run] < 0x80 && s[run] != '\\' && s[run] != '"')
            run++;
        if (run > i) {
            buf_append(out, s + i, run - i);
            i = run;
            continue;
        }
        unsigned char c = s[i];
        if (c == '\\') {
            buf_puts(out, "\\\\");
            i++;
        } else if (c == '"') {
            buf_puts(out, "\\\"");
            i++;
        } else if (c == '\n') {
            buf_puts(out, "\\n");
            i++;
        } else if (c < 0x80) {
            buf_append(out, &c, 1); /* other control bytes are valid in a label value */
            i++;
        } else {
            size_t k = kvc__utf8_seq(s + i, len - i);
            if (k) {
                buf_append(out, s + i, k);
                i += k;
            } else {
                buf_puts(out, "\xef\xbf\xbd"); /* U+FFFD */
                i++;
            }
        }
    }
}

static void family(struct buf *out, const char *name, const char *type, const char *help)
{
    buf_puts(out, "# HELP ");
    buf_puts(out, name);
    buf_puts(out, " ");
    buf_puts(out, help);
    buf_puts(out, "\n# TYPE ");
    buf_puts(out, name);
    buf_puts(out, " ");
    buf_puts(out, type);
    buf_puts(out, "\n");
}

/* name value\n */
static void sample(struct buf *out, const char *name, uint64_t v)
{
    buf_puts(out, name);
    buf_puts(out, " ");
    buf_putu64(out, v);
    buf_puts(out, "\n");
}

/* name{key="value"} v\n, value escaped */
static void sample1(struct buf *out, const char *name, const char *key, const char *value,
                    uint64_t v)
{
    buf_puts(out, name);
    buf_puts(out, "{");
    buf_puts(out, key);
    buf_puts(out, "=\"");
    metrics_label_escape(out, value, strlen(value));
    buf_puts(out, "\"} ");
    buf_putu64(out, v);
    buf_puts(out, "\n");
}

static void sample1u(struct buf *out, const char *name, const char *key, uint64_t label, uint64_t v)
{
    char l[24];
    snprintf(l, sizeof l, "%llu", (unsigned long long)label);
    sample1(out, name, key, l, v);
}

/* A comment saying why a family has no samples now (one line). */
static void unavailable(struct buf *out, const char *what)
{
    buf_puts(out, "# kvcoord: ");
    buf_puts(out, what);
    buf_puts(out, " unavailable: ");
    const char *e = kvc_last_error();
    for (; *e; e++)
        buf_append(out, (unsigned char)*e < 0x20 ? " " : e, 1);
    buf_puts(out, "\n");
}

static uint64_t ld(const atomic_uint_fast64_t *a)
{
    return atomic_load_explicit(a, memory_order_relaxed);
}

/* ---- families ----------------------------------------------------------- */

static void render_build(struct buf *out)
{
    family(out, "kvcoord_build_info", "gauge",
           "Version of kvcoordd and the segment layout version it reads and writes (always 1).");
    char layout[16];
    snprintf(layout, sizeof layout, "%u", KVC_LAYOUT_VERSION);
    buf_puts(out, "kvcoord_build_info{version=\"" KVC_VERSION "\",layout_version=\"");
    buf_puts(out, layout);
    buf_puts(out, "\"} 1\n");
}

static void render_segment_header(struct buf *out, kvc_segment *seg, const kvc_segment_info *si)
{
    family(out, "kvcoord_segment_info", "gauge", "The served segment (always 1).");
    sample1(out, "kvcoord_segment_info", "segment", kvc_segment_name(seg), 1);
    family(out, "kvcoord_segment_size_bytes", "gauge", "Size of the segment file.");
    sample(out, "kvcoord_segment_size_bytes", si->total_bytes);
    family(out, "kvcoord_arena_size_bytes", "gauge",
           "Size of the info arena shared by all ranks (sparse: untouched pages cost nothing).");
    sample(out, "kvcoord_arena_size_bytes", si->arena_bytes);
    family(out, "kvcoord_arena_used_bytes", "gauge",
           "Bytes of the info arena in use by published rank info.");
    sample(out, "kvcoord_arena_used_bytes", si->arena_used);
    family(out, "kvcoord_world_size", "gauge", "TP group size recorded in the segment.");
    sample(out, "kvcoord_world_size", si->world_size);
    family(out, "kvcoord_ranks_max", "gauge", "Rank table entries (capacity).");
    sample(out, "kvcoord_ranks_max", si->max_ranks);
    family(out, "kvcoord_ranks_registered", "gauge", "Ranks registered now.");
    sample(out, "kvcoord_ranks_registered", si->ranks_registered);
    family(out, "kvcoord_rooms_max", "gauge", "Room table entries (capacity).");
    sample(out, "kvcoord_rooms_max", si->max_rooms);
    family(out, "kvcoord_lock_recoveries_total", "counter",
           "Locks of the segment recovered from a dead owner (EOWNERDEAD) since its creation.");
    sample(out, "kvcoord_lock_recoveries_total", si->lock_recoveries);
    family(out, "kvcoord_failures_total", "counter",
           "Room failure records kept since the segment's creation.");
    sample(out, "kvcoord_failures_total", si->failures_total);
    family(out, "kvcoord_rooms_evicted_total", "counter",
           "Failed rooms no participant joined, evicted from a full room table for a new room.");
    sample(out, "kvcoord_rooms_evicted_total", si->rooms_evicted);
}

static void render_ranks(struct buf *out, kvc_segment *seg)
{
    size_t count = 0, n = 0;
    kvc_rank_info *list = NULL;
    kvc_err e = kvc_rank_list(seg, NULL, 0, &count, 1);
    if (!e && count) {
        list = calloc(count, sizeof *list);
        if (!list) {
            out->oom = 1;
            return;
        }
        e = kvc_rank_list(seg, list, count, &n, 1);
        if (n > count)
            n = count; /* more appeared meanwhile: the next scrape shows them */
    }
    family(out, "kvcoord_ranks_withdrawn", "gauge",
           "Ranks withdrawn (by a call or because their process died) and not registered again.");
    if (!e) {
        uint64_t withdrawn = 0;
        for (size_t i = 0; i < n; i++)
            withdrawn += list[i].state == KVC_RANK_WITHDRAWN;
        sample(out, "kvcoord_ranks_withdrawn", withdrawn);
    }
    family(out, "kvcoord_rank_generation", "gauge",
           "Generation of each rank's entry (bumped by every registration and withdrawal).");
    if (e)
        unavailable(out, "ranks");
    for (size_t i = 0; !e && i < n; i++)
        sample1u(out, "kvcoord_rank_generation", "rank", list[i].rank, list[i].generation);
    free(list);
}

/* Returns 0, or -1 when the rooms could not be read (a comment says why). */
static int render_rooms(struct buf *out, kvc_segment *seg)
{
    static const kvc_poll states[] = {KVC_POLL_FAILED, KVC_POLL_BOOTSTRAPPING,
                                      KVC_POLL_WAITING_FOR_INPUT, KVC_POLL_TRANSFERRING,
                                      KVC_POLL_SUCCESS};
    size_t counts[5];
    for (int i = 0; i < 5; i++) {
        if (kvc_room_list(seg, (int)states[i], NULL, 0, &counts[i])) {
            family(out, "kvcoord_rooms", "gauge", "Rooms in the room table, by KVPoll state.");
            unavailable(out, "rooms");
            return -1;
        }
    }
    family(out, "kvcoord_rooms", "gauge", "Rooms in the room table, by KVPoll state.");
    for (int i = 0; i < 5; i++)
        sample1(out, "kvcoord_rooms", "state", kvc_poll_name(states[i]), counts[i]);
    return 0;
}

static int cmp_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

/* Returns 0, or -1 when the records could not be read (a comment says why). */
static int render_failures(struct buf *out, kvc_segment *seg)
{
    int rc = 0;
    family(out, "kvcoord_failures_recent", "gauge",
           "Failure records among the most recent 1024 kept, by origin rank.");
    kvc_failure_info *f = malloc(KVC_FAILURE_RING * sizeof *f);
    uint32_t *origin = malloc(KVC_FAILURE_RING * sizeof *origin);
    size_t n = 0;
    if (!f || !origin) {
        out->oom = 1;
    } else if (kvc_failures_recent(seg, f, KVC_FAILURE_RING, &n)) {
        unavailable(out, "failure records");
        rc = -1;
    } else {
        for (size_t i = 0; i < n; i++)
            origin[i] = f[i].origin_rank;
        qsort(origin, n, sizeof *origin, cmp_u32);
        for (size_t i = 0; i < n;) {
            size_t j = i;
            while (j < n && origin[j] == origin[i])
                j++;
            sample1u(out, "kvcoord_failures_recent", "origin_rank", origin[i], j - i);
            i = j;
        }
    }
    free(f);
    free(origin);
    return rc;
}

/* The rooms and failure families read now (they take the rooms lock);
 * after a first failure the second is not tried (the lock is busy: one
 * wait of the lock timeout, not two).  Returns 0 or -1. */
static int render_rooms_live(struct buf *out, kvc_segment *seg)
{
    if (render_rooms(out, seg)) {
        family(out, "kvcoord_failures_recent", "gauge",
               "Failure records among the most recent 1024 kept, by origin rank.");
        return -1;
    }
    return render_failures(out, seg);
}

/* Do the cached rooms families match the segment now (lock-free reads)? */
static int rooms_cache_current(struct metrics *m, kvc_segment *seg)
{
    kvc_segment_info si;
    if (!atomic_load(&m->rooms_valid) || kvc_segment_stat(seg, &si))
        return 0;
    return atomic_load(&m->rooms_epoch) == kvc_room_epoch(seg) &&
           atomic_load(&m->rooms_failures) == si.failures_total;
}

int metrics_rooms_fresh(struct metrics *m, kvc_segment *seg)
{
    return m && seg && atomic_load(&m->rooms_on) && rooms_cache_current(m, seg);
}

void metrics_rooms_refresh(struct metrics *m, kvc_segment *seg)
{
    if (!m || !seg)
        return;
    atomic_store(&m->rooms_on, 1);
    if (rooms_cache_current(m, seg))
        return;
    /* The epoch and count are read before the families: a change after them
     * makes the next look re-read. */
    kvc_segment_info si;
    if (kvc_segment_stat(seg, &si))
        return;
    uint32_t epoch = kvc_room_epoch(seg);
    struct buf text = {0};
    if (render_rooms_live(&text, seg) || text.oom) {
        buf_free(&text);
        return; /* the old text stays, marked stale by the epoch */
    }
    pthread_mutex_lock(&m->rooms_lock);
    buf_free(&m->rooms_text);
    m->rooms_text = text;
    m->rooms_read_ms = kvc__mono_ms();
    atomic_store(&m->rooms_epoch, epoch);
    atomic_store(&m->rooms_failures, si.failures_total);
    atomic_store(&m->rooms_valid, 1);
    pthread_mutex_unlock(&m->rooms_lock);
}

/* The rooms families: the cached text when it is current; else read now
 * (on a thread that may wait) and cached; when they cannot be read (the
 * rooms lock stays busy), the last text read, after a comment saying how
 * old it is and why. */
static void render_rooms_part(struct buf *out, kvc_segment *seg, struct metrics *m)
{
    if (!m || !atomic_load(&m->rooms_on)) {
        render_rooms_live(out, seg);
        return;
    }
    if (!rooms_cache_current(m, seg))
        metrics_rooms_refresh(m, seg);
    pthread_mutex_lock(&m->rooms_lock);
    if (m->rooms_text.len && !rooms_cache_current(m, seg)) {
        char note[96];
        snprintf(note, sizeof note, "rooms figures below were read %llu ms ago; now",
                 (unsigned long long)(kvc__mono_ms() - m->rooms_read_ms));
        unavailable(out, note);
    }
    if (m->rooms_text.len)
        buf_append(out, m->rooms_text.p, m->rooms_text.len);
    pthread_mutex_unlock(&m->rooms_lock);
    if (!m->rooms_text.len)
        render_rooms_live(out, seg);
}

/* The PD bootstrap tables (kvcoord/pd.h): lock-free gauges. */
static void render_pd(struct buf *out, kvc_segment *seg)
{
    kvc_pd_gauges g;
    if (kvc_pd_gauges_get(seg, &g)) {
        unavailable(out, "PD bootstrap figures");
        return;
    }
    family(out, "kvcoord_pd_prefill_ranks", "gauge",
           "Entries of the PD prefill rank table (sglang's PUT /route), by state.");
    sample1(out, "kvcoord_pd_prefill_ranks", "state", "live", g.live);
    sample1(out, "kvcoord_pd_prefill_ranks", "state", "withdrawn", g.withdrawn);
    family(out, "kvcoord_pd_prefill_ranks_expected", "gauge",
           "Prefill ranks the PD table waits for (tp x cp x dp x pp; 0 before any registers).");
    sample(out, "kvcoord_pd_prefill_ranks_expected", g.expected);
    family(out, "kvcoord_pd_ready", "gauge",
           "1 when every expected prefill rank is registered (GET /route answers).");
    sample(out, "kvcoord_pd_ready", g.expected && g.live >= g.expected);
    family(out, "kvcoord_pd_rooms", "gauge",
           "Entries of the bootstrap room to DP rank map (POST /register_dp_rank).");
    sample(out, "kvcoord_pd_rooms", g.rooms);
}

static void render_procs(struct buf *out, kvc_segment *seg)
{
    size_t count = 0, n = 0;
    kvc_proc_info *p = NULL;
    kvc_err e = kvc_proc_list(seg, NULL, 0, &count);
    if (!e && count) {
        p = calloc(count, sizeof *p);
        if (!p) {
            out->oom = 1;
            return;
        }
        e = kvc_proc_list(seg, p, count, &n);
        if (n > count)
            n = count;
    }
    uint64_t by_role[4] = {0}, dead = 0;
    for (size_t i = 0; !e && i < n; i++) {
        unsigned r = (unsigned)p[i].role < 4 ? (unsigned)p[i].role : 0;
        by_role[r]++;
        dead += !p[i].alive;
    }
    free(p);
    family(out, "kvcoord_processes_attached", "gauge",
           "Processes in the segment's process table, by role.");
    if (e)
        unavailable(out, "processes");
    for (unsigned r = 0; !e && r < 4; r++)
        sample1(out, "kvcoord_processes_attached", "role", kvc_role_name((kvc_role)r), by_role[r]);
    family(out, "kvcoord_processes_dead", "gauge",
           "Processes in the segment's process table found dead and not reaped yet.");
    if (!e)
        sample(out, "kvcoord_processes_dead", dead);
}

static void render_http(struct buf *out, const struct metrics *m)
{
    family(out, "kvcoord_http_requests_total", "counter",
           "HTTP requests answered, by route and status code (0: none, the connection was "
           "closed).");
    unsigned nroutes = routes_label_count();
    for (unsigned r = 0; r < nroutes; r++) {
        const char *label = routes_label(r);
        for (int st = 0; st < STATUS_MAX; st++) {
            uint64_t v = ld(&m->requests[r][st]);
            if (!v)
                continue;
            buf_puts(out, "kvcoord_http_requests_total{route=\"");
            metrics_label_escape(out, label, strlen(label));
            buf_puts(out, "\",status=\"");
            buf_putu64(out, (uint64_t)st);
            buf_puts(out, "\"} ");
            buf_putu64(out, v);
            buf_puts(out, "\n");
        }
    }
    family(out, "kvcoord_http_request_duration_seconds", "histogram",
           "Time from a request's first byte to its answer being queued, by route (long-polls "
           "included).");
    for (unsigned r = 0; r < nroutes; r++) {
        const char *label = routes_label(r);
        uint64_t cum = 0;
        for (int b = 0; b <= METRICS_BUCKETS; b++) {
            cum += ld(&m->buckets[r][b]);
            buf_puts(out, "kvcoord_http_request_duration_seconds_bucket{route=\"");
            buf_puts(out, label);
            buf_puts(out, "\",le=\"");
            buf_puts(out, b < METRICS_BUCKETS ? bucket_le[b] : "+Inf");
            buf_puts(out, "\"} ");
            buf_putu64(out, cum);
            buf_puts(out, "\n");
        }
        uint64_t ns = ld(&m->sum_ns[r]);
        char sum[48];
        snprintf(sum, sizeof sum, "%llu.%09llu", (unsigned long long)(ns / 1000000000ull),
                 (unsigned long long)(ns % 1000000000ull));
        buf_puts(out, "kvcoord_http_request_duration_seconds_sum{route=\"");
        buf_puts(out, label);
        buf_puts(out, "\"} ");
        buf_puts(out, sum);
        buf_puts(out, "\nkvcoord_http_request_duration_seconds_count{route=\"");
        buf_puts(out, label);
        buf_puts(out, "\"} ");
        buf_putu64(out, cum); /* the +Inf bucket: consistent with the buckets read */
        buf_puts(out, "\n");
    }
    int64_t open = atomic_load_explicit(&m->open_conns, memory_order_relaxed);
    family(out, "kvcoord_http_open_connections", "gauge", "HTTP connections open now.");
    sample(out, "kvcoord_http_open_connections", open > 0 ? (uint64_t)open : 0);
    family(out, "kvcoord_http_connections_total", "counter", "HTTP connections accepted.");
    sample(out, "kvcoord_http_connections_total", ld(&m->conns_total));
    family(out, "kvcoord_http_buffered_bytes", "gauge",
           "Request body bytes reserved now by connections receiving them (bodies that do not "
           "fit the budget are answered 503).");
    sample(out, "kvcoord_http_buffered_bytes", ld(&m->buffered));
    family(out, "kvcoord_http_buffered_bytes_max", "gauge",
           "The daemon-wide budget of request body bytes (--max-buffered-bytes; 0: none).");
    sample(out, "kvcoord_http_buffered_bytes_max", ld(&m->buffered_max));
    family(out, "kvcoord_http_connections_refused_total", "counter",
           "HTTP connections answered 503 and closed: max-conns were open, or the client's "
           "address held max-conns-per-peer connections already.");
    sample(out, "kvcoord_http_connections_refused_total", ld(&m->conns_refused));
    family(out, "kvcoord_http_connections_evicted_total", "counter",
           "HTTP connections closed at max-conns to make room for new ones (they had waited "
           "250 ms or more for a request).");
    sample(out, "kvcoord_http_connections_evicted_total", ld(&m->conns_evicted));
    family(out, "kvcoord_http_answer_bytes", "gauge",
           "Answer bytes connections hold now, not all sent (large answers past the budget are "
           "answered 503).");
    sample(out, "kvcoord_http_answer_bytes", ld(&m->answers));
    family(out, "kvcoord_http_answer_bytes_max", "gauge",
           "The daemon-wide budget of answer bytes held for clients (--max-answer-bytes; 0: "
           "none).");
    sample(out, "kvcoord_http_answer_bytes_max", ld(&m->answers_max));
    family(out, "kvcoord_http_answer_renders_total", "counter",
           "Answer bodies rendered into a shared buffer (a rank's answer once per change of "
           "the rank table; /metrics and /cluster once per batch of the event loop; a helper "
           "thread's answer once, for every identical request that joined it).");
    sample(out, "kvcoord_http_answer_renders_total", shared_body_renders());
    family(out, "kvcoord_http_answer_shared_sends_total", "counter",
           "Answers queued from a shared buffer, by reference (no copy of the body).");
    sample(out, "kvcoord_http_answer_shared_sends_total", shared_body_sends());
}

static void render_daemon(struct buf *out, const struct metrics *m)
{
    family(out, "kvcoord_dead_processes_total", "counter",
           "Attached processes kvcoordd found dead (their rooms failed, their ranks withdrawn).");
    sample(out, "kvcoord_dead_processes_total", ld(&m->dead_procs));
    family(out, "kvcoord_auth_reloads_total", "counter",
           "Token file re-reads on SIGHUP, by result (error: the previous token stays).");
    sample1(out, "kvcoord_auth_reloads_total", "result", "ok", ld(&m->reloads_ok));
    sample1(out, "kvcoord_auth_reloads_total", "result", "error", ld(&m->reloads_failed));
}

int metrics_render(struct buf *out, kvc_segment *seg, const struct metrics *m)
{
    render_build(out);
    if (seg) {
        kvc_segment_info si;
        if (kvc_segment_stat(seg, &si) == KVC_OK)
            render_segment_header(out, seg, &si);
        else
            unavailable(out, "segment header");
        render_ranks(out, seg);
        render_rooms_part(out, seg, (struct metrics *)m);
        render_procs(out, seg);
        render_pd(out, seg);
    }
    if (m) {
        render_daemon(out, m);
        render_http(out, m);
    }
    return out->oom ? -1 : 0;
}
