/*
 * diag_ranks.c - `kvcoord-diag ranks`: the rank table - each rank's
 * session_id, the entries and bytes of its weights_info_dict, generation,
 * registration time and the registering process with its liveness; one
 * rank's whole info with --rank N --full.
 *
 * Metadata comes from kvc_rank_list() (the seqlock read path); the size of
 * the info and the registering process's start time, which the public API
 * does not give, from kvc__rank_peek() of the same generation.
 */
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "diag.h"

static const char ranks_help[] =
    "DESCRIPTION\n"
    "  Lists the rank table: for every rank that was ever registered, its state\n"
    "  (registered or withdrawn), session_id (verbatim), the number of top-level\n"
    "  entries and the bytes of its weights_info_dict JSON, its generation (bumped by\n"
    "  every change), when it was registered (or withdrawn), the pid of the process\n"
    "  that did it and whether that process is alive, stopped (SIGSTOP or a\n"
    "  debugger: alive but running nothing) or dead (pid + start time), and for a\n"
    "  withdrawn rank the note saying why.  WORKER marks ranks registered by an\n"
    "  attached worker, which are withdrawn when that worker dies.\n"
    "\n"
    "  Entries are read without locks through their seqlock (copy, re-check,\n"
    "  retry).  A counter that stays odd means a writer died while publishing; as\n"
    "  every reader does, ranks then takes the ranks lock, which recovers the entry\n"
    "  (the tool says so on stderr).\n"
    "\n"
    "OPTIONS\n"
    "  -r, --rank N        only rank N, with every field\n"
    "  -f, --full          with --rank: also print the whole weights_info_dict JSON\n"
    "  -S, --state STATE   only ranks in STATE: registered, withdrawn or all (default)\n"
    "\n"
    "OUTPUT\n"
    "  --json: {\"schema\", \"command\": \"ranks\", \"segment\", \"max_ranks\", \"count\",\n"
    "  \"ranks\": [{\"rank\", \"state\" (registered|withdrawn), \"session_id\", \"entries\",\n"
    "  \"info_bytes\", \"generation\", \"registered_ns\", \"registered_utc\", \"pid\",\n"
    "  \"pid_start\", \"pid_alive\", \"pid_stopped\", \"owned_by_worker\", \"note\"}],\n"
    "  \"recovered_lock\"}.\n"
    "  With --rank N: {..., \"rank\": {the same fields, and with --full\n"
    "  \"weights_info_dict\": {...}}}, or \"rank\": null and \"error\" when not registered.\n"
    "\n"
    "  Exit status 1 with --rank N when rank N is not registered (never registered,\n"
    "  withdrawn, or beyond the segment's max ranks).\n";

struct ranks_opts {
    int64_t rank; /* -1: all */
    int full;
    int state; /* -1 all, else kvc_rank_state */
    const diag *d;
};

static int ranks_opt(void *ctx, int opt, const char *arg)
{
    struct ranks_opts *o = ctx;
    uint64_t v;
    switch (opt) {
    case 'r':
        if (diag_parse_u64(o->d, &diag_cmd_ranks, "--rank", arg, KVC_RANK_MAX, &v) < 0)
            return -1;
        o->rank = (int64_t)v;
        return 0;
    case 'f': o->full = 1; return 0;
    case 'S':
        if (!strcasecmp(arg, "all"))
            o->state = -1;
        else if (!strcasecmp(arg, "registered"))
            o->state = KVC_RANK_REGISTERED;
        else if (!strcasecmp(arg, "withdrawn"))
            o->state = KVC_RANK_WITHDRAWN;
        else
            return diag_usage_error(o->d, &diag_cmd_ranks,
                                    "--state must be registered, "
                                    "withdrawn or all, not '%s'",
                                    arg);
        return 0;
    }
    return -1;
}

/* A rank with what the API gives and what the peek adds. */
typedef struct rank_row {
    kvc_rank_info ri;
    kvc_rank_peek pk;
} rank_row;

/* "alive", "stopped" (alive, state T or t in /proc: SIGSTOP, a debugger) or
 * "dead", for the process that registered a rank. */
static const char *pid_word(int32_t pid, uint64_t start)
{
    if (!kvc__pid_alive(pid, start))
        return diag_alive(0);
    return kvc__pid_stopped(pid, start) ? "stopped" : diag_alive(1);
}

static const char *state_name(kvc_rank_state s)
{
    return s == KVC_RANK_REGISTERED  ? "registered"
           : s == KVC_RANK_WITHDRAWN ? "withdrawn"
                                     : "empty";
}

/* Peek rank r's descriptor of generation gen (a re-registration between the
 * two reads is retried a few times; then the peek's newer values are kept). */
static void peek_same(kvc_segment *seg, uint32_t r, uint64_t gen, kvc_rank_peek *pk)
{
    for (int i = 0; i < 3; i++)
        if (kvc__rank_peek(seg, r, pk) == KVC_OK && pk->generation == gen)
            return;
}

static uint64_t recoveries(kvc_segment *seg)
{
    kvc_segment_info si;
    kvc_segment_stat(seg, &si);
    return si.lock_recoveries;
}

/* kvc_rank_list() of every entry ever registered, sized by a first count. */
static kvc_rank_info *list_all(kvc_segment *seg, size_t *n)
{
    size_t count = 0;
    for (int tries = 0; tries < 5; tries++) {
        if (kvc_rank_list(seg, NULL, 0, &count, 1) != KVC_OK)
            return NULL;
        size_t cap = count + 16;
        kvc_rank_info *all = calloc(cap, sizeof *all);
        if (!all)
            return NULL;
        if (kvc_rank_list(seg, all, cap, &count, 1) == KVC_OK && count <= cap) {
            *n = count;
            return all;
        }
        free(all); /* registered meanwhile: count again */
    }
    return NULL;
}

/* All ranks in state (-1 all); *n rows.  NULL on error (message printed). */
static rank_row *list_rows(const diag *d, kvc_segment *seg, int state, size_t *n)
{
    size_t count = 0;
    kvc_rank_info *all = list_all(seg, &count);
    rank_row *rows = all ? calloc(count + 1, sizeof *rows) : NULL;
    if (!rows) {
        fprintf(stderr, "%s ranks: %s\n", d->prog, all ? "out of memory" : kvc_last_error());
        free(all);
        return NULL;
    }
    *n = 0;
    for (size_t i = 0; i < count; i++) {
        if (state >= 0 && (int)all[i].state != state)
            continue;
        rows[*n].ri = all[i];
        peek_same(seg, all[i].rank, all[i].generation, &rows[*n].pk);
        (*n)++;
    }
    free(all);
    return rows;
}

static json_t *row_json(const rank_row *w)
{
    json_t *o = json_object();
    json_object_set_new(o, "rank", diag_jint(w->ri.rank));
    json_object_set_new(o, "state", json_string(state_name(w->ri.state)));
    json_object_set_new(o, "session_id", diag_jstr(w->ri.session_id));
    json_object_set_new(o, "entries", diag_jint(w->ri.entries));
    json_object_set_new(o, "info_bytes", diag_jint((int64_t)w->pk.info_len));
    json_object_set_new(o, "generation", diag_jint((int64_t)w->ri.generation));
    diag_jtime(o, "registered", w->ri.registered_ns);
    json_object_set_new(o, "pid", diag_jint(w->ri.pid));
    json_object_set_new(o, "pid_start", diag_jint((int64_t)w->pk.pid_start));
    json_object_set_new(o, "pid_alive", json_boolean(kvc__pid_alive(w->ri.pid, w->pk.pid_start)));
    json_object_set_new(o, "pid_stopped",
                        json_boolean(kvc__pid_stopped(w->ri.pid, w->pk.pid_start)));
    json_object_set_new(o, "owned_by_worker", json_boolean(w->pk.owned));
    json_object_set_new(o, "note", diag_jstr(w->ri.note));
    return o;
}

static void rows_table(const rank_row *rows, size_t n, size_t limit, FILE *out)
{
    static const char *const head[] = {"RANK",  "STATE",  "SESSION_ID", "ENTRIES",
                                       "BYTES", "GEN",    "REGISTERED", "PID",
                                       "ALIVE", "WORKER", "NOTE"};
    diag_table *t = diag_table_new(11, head, "rllrrrlrlll");
    char when[40];
    for (size_t i = 0; i < n && (!limit || i < limit); i++) {
        const rank_row *w = &rows[i];
        diag_table_addf(
            t, "%u\t%s\t%s\t%u\t%llu\t%llu\t%s\t%d\t%s\t%s\t%s", w->ri.rank,
            state_name(w->ri.state), w->ri.session_id[0] ? w->ri.session_id : "-", w->ri.entries,
            (unsigned long long)w->pk.info_len, (unsigned long long)w->ri.generation,
            diag_time(w->ri.registered_ns, when, sizeof when), (int)w->ri.pid,
            pid_word(w->ri.pid, w->pk.pid_start), w->pk.owned ? "yes" : "no", w->ri.note);
    }
    diag_table_print(t, out, 0);
    if (limit && n > limit)
        fprintf(out, "(%zu more not shown)\n", n - limit);
}

int diag_ranks_table(kvc_segment *seg, FILE *out, int limit)
{
    diag d = {.prog = "kvcoord-diag"};
    size_t n = 0;
    rank_row *rows = list_rows(&d, seg, -1, &n);
    if (!rows)
        return -1;
    if (n == 0)
        fprintf(out, "no rank registered\n");
    else
        rows_table(rows, n, limit > 0 ? (size_t)limit : 0, out);
    free(rows);
    return (int)n;
}

static int list_ranks(const diag *d, kvc_segment *seg, int state)
{
    size_t n = 0;
    uint64_t before = recoveries(seg);
    rank_row *rows = list_rows(d, seg, state, &n);
    if (!rows)
        return DIAG_EXIT_BROKEN;
    int recovered = recoveries(seg) != before;
    if (recovered && !d->json)
        fprintf(stderr,
                "%s ranks: note: a writer had died inside the ranks lock; reading "
                "recovered it\n",
                d->prog);
    if (d->json) {
        kvc_segment_info si;
        kvc_segment_stat(seg, &si);
        json_t *doc = diag_jdoc(d, "ranks"), *arr = json_array();
        for (size_t i = 0; i < n; i++)
            json_array_append_new(arr, row_json(&rows[i]));
        json_object_set_new(doc, "max_ranks", diag_jint(si.max_ranks));
        json_object_set_new(doc, "count", diag_jint((int64_t)n));
        json_object_set_new(doc, "ranks", arr);
        json_object_set_new(doc, "recovered_lock", json_boolean(recovered));
        diag_jprint(doc);
    } else if (n == 0) {
        printf("no rank %s in segment %s\n",
               state == KVC_RANK_WITHDRAWN ? "withdrawn" : "registered", d->segment);
    } else {
        rows_table(rows, n, 0, stdout);
    }
    free(rows);
    return DIAG_EXIT_OK;
}

static void one_text(const rank_row *w, int full)
{
    char when[40], ago[32];
    diag_table *t = diag_table_new(2, NULL, "ll");
    diag_table_addf(t, "rank\t%u", w->ri.rank);
    diag_table_addf(t, "state\t%s", state_name(w->ri.state));
    diag_table_addf(t, "session_id\t%s", w->ri.session_id);
    diag_table_addf(t, "weights_info_dict\t%u %s, %llu bytes", w->ri.entries,
                    diag_noun(w->ri.entries, "entry", "entries"),
                    (unsigned long long)w->pk.info_len);
    diag_table_addf(t, "generation\t%llu", (unsigned long long)w->ri.generation);
    diag_table_addf(t, "registered\t%s  (%s ago)",
                    diag_time(w->ri.registered_ns, when, sizeof when),
                    diag_age(w->ri.registered_ns, ago, sizeof ago));
    diag_table_addf(t, "by\tpid %d (%s), start %llu%s", (int)w->ri.pid,
                    pid_word(w->ri.pid, w->pk.pid_start), (unsigned long long)w->pk.pid_start,
                    w->pk.owned ? "; a worker: withdrawn when it dies" : "");
    if (w->ri.note[0])
        diag_table_addf(t, "note\t%s", w->ri.note);
    diag_table_print(t, stdout, 0);
    if (full && w->ri.state == KVC_RANK_REGISTERED)
        printf("\nweights_info_dict:\n%.*s\n", (int)w->ri.info_len, w->ri.info);
}

static void one_json(const diag *d, const rank_row *w, kvc_err e, int full)
{
    /* The dict goes out as the bytes stored (validated when registered),
     * not through a jansson tree: numbers stay as sent. */
    static const char placeholder[] = "kvcoord-diag:weights_info_dict";
    json_t *doc = diag_jdoc(d, "ranks");
    int raw = 0;
    if (e == KVC_OK || e == KVC_E_WITHDRAWN) {
        json_t *o = row_json(w);
        if (full && e == KVC_OK) {
            json_object_set_new(o, "weights_info_dict", json_string(placeholder));
            raw = 1;
        }
        json_object_set_new(doc, "rank", o);
    } else {
        json_object_set_new(doc, "rank", json_null());
    }
    if (e)
        json_object_set_new(doc, "error", diag_jstr(kvc_last_error()));
    if (raw)
        diag_jprint_raw(doc, placeholder, w->ri.info, w->ri.info_len);
    else
        diag_jprint(doc);
}

static int one_rank(const diag *d, kvc_segment *seg, uint32_t rank, int full)
{
    rank_row w;
    memset(&w, 0, sizeof w);
    kvc_err e = kvc_rank_lookup(seg, rank, &w.ri);
    char msg[512];
    snprintf(msg, sizeof msg, "%s", kvc_last_error());
    if (e == KVC_OK || e == KVC_E_WITHDRAWN)
        peek_same(seg, rank, w.ri.generation, &w.pk);
    if (d->json)
        one_json(d, &w, e, full);
    else if (e == KVC_OK || e == KVC_E_WITHDRAWN)
        one_text(&w, full);
    if (e && !d->json)
        fprintf(stderr, "%s ranks: %s\n", d->prog, msg);
    kvc_rank_info_free(&w.ri);
    if (e == KVC_OK)
        return DIAG_EXIT_OK;
    if (e == KVC_E_WITHDRAWN || e == KVC_E_NOENT || e == KVC_E_CAPACITY)
        return DIAG_EXIT_DEGRADED;
    return DIAG_EXIT_BROKEN;
}

static int run_ranks(diag *d, int argc, char **argv)
{
    static const struct option longopts[] = {{"rank", required_argument, NULL, 'r'},
                                             {"full", no_argument, NULL, 'f'},
                                             {"state", required_argument, NULL, 'S'},
                                             {0}};
    struct ranks_opts o = {.rank = -1, .state = -1, .d = d};
    int rc = diag_parse_exit(
        diag_parse(d, &diag_cmd_ranks, argc, argv, "r:fS:", longopts, ranks_opt, &o));
    if (rc >= 0)
        return rc;
    if (optind < argc) {
        diag_usage_error(d, &diag_cmd_ranks, "unexpected argument '%s'", argv[optind]);
        return DIAG_EXIT_USAGE;
    }
    if (o.full && o.rank < 0) {
        diag_usage_error(d, &diag_cmd_ranks, "--full needs --rank N");
        return DIAG_EXIT_USAGE;
    }
    kvc_segment *seg = diag_open(d, "ranks", &rc);
    if (!seg)
        return rc;
    rc = o.rank >= 0 ? one_rank(d, seg, (uint32_t)o.rank, o.full) : list_ranks(d, seg, o.state);
    kvc__close_reader(seg);
    return rc;
}

const diag_cmd diag_cmd_ranks = {
    "ranks",
    "the rank table: session_id, info size, generation, registering pid",
    "ranks [--state registered|withdrawn|all]\nranks --rank N [--full]",
    ranks_help,
    run_ranks,
};
