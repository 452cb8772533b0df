/*
 * worker.c - kvcoord-worker: a stand-in TP worker.
 *
 * Does what one tensor-parallel rank of an sglang worker does with kvcoord on
 * its node: reads the rank's transfer-engine info (a rank-<N>.json file
 * written by tools/gen_model_info.py: the body sglang PUTs to
 * /register_transfer_engine_info), attaches to the node's segment through
 * libkvcoord, registers the rank, prints one line, and with --linger stays
 * attached like a live worker until SIGTERM or SIGINT.
 *
 * A worker may start before kvcoordd has created the segment, so attaching
 * retries with backoff up to --timeout-ms.
 */
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>
#include <sys/stat.h>

#include <jansson.h>

#include "clock.h"
#include "kvcoord/kvcoord.h"

#define EXIT_RUNTIME 1
#define EXIT_USAGE 2
#define DEFAULT_TIMEOUT_MS 10000u

static const char *prog = "kvcoord-worker";

typedef struct worker_args {
    const char *segment; /* NULL: kvc default (kvcoord-6789) */
    const char *info_path;
    long rank; /* -1: take "rank" from the info file */
    int linger;
    uint32_t timeout_ms;
    int has_room; /* --room given */
    uint64_t room;
    long room_state;            /* KVPoll state to set in the room */
    uint32_t room_participants; /* 0: the segment's world size */
    const char *fail_reason;    /* --fail REASON: record a failure of the room */
    long fail_code;
} worker_args;

typedef struct worker_info {
    char session_id[KVC_SESSION_ID_MAX + 1];
    char *dict_json; /* weights_info_dict, compact JSON (malloc'd by jansson) */
    size_t dict_len;
    size_t entries;
    long file_rank; /* "rank" (or "tp_rank") in the file, -1 if none */
} worker_info;

static void usage(FILE *out)
{
    fprintf(out,
            "Usage: %s --info FILE [--rank N] [--segment NAME] [--linger] [--timeout-ms N]\n"
            "\n"
            "A stand-in tensor-parallel (TP) worker: registers one rank's transfer-engine\n"
            "info in the node's kvcoord segment, as a co-located sglang worker would.\n"
            "\n"
            "Reads FILE (a rank-<N>.json written by tools/gen_model_info.py, i.e. the body\n"
            "of PUT /register_transfer_engine_info: {\"rank\": N, \"transfer_engine_info\":\n"
            "{\"session_id\": ..., \"weights_info_dict\": {...}}}), attaches to the segment\n"
            "as a worker for rank N, registers session_id and weights_info_dict, and\n"
            "prints one line:\n"
            "\n"
            "  kvcoord-worker: rank=N generation=G entries=E dict_bytes=B register_us=T\n"
            "  open_us=T segment=NAME session_id=S\n"
            "\n"
            "(on one line; dict_bytes is the size of the weights_info_dict JSON registered,\n"
            "not of the file nor of an HTTP answer).\n"
            "\n"
            "Options:\n"
            "  -i, --info FILE       rank info file to register (required)\n"
            "  -r, --rank N          rank to register as, 0..2147483647 (default: the\n"
            "                        file's \"rank\"); overrides the file's rank when both\n"
            "                        are given (a note on stderr says so when they differ)\n"
            "  -s, --segment NAME    segment to attach to (default: kvcoord-%d, the\n"
            "                        segment of a kvcoordd on port %d)\n"
            "  -l, --linger          stay attached after registering, like a live worker,\n"
            "                        until SIGTERM or SIGINT; then detach and exit 0.\n"
            "                        The rank lives as long as the worker: it is\n"
            "                        withdrawn when the worker exits (cleanly: by the\n"
            "                        library; killed: by kvcoordd, or by `kvcoord-diag\n"
            "                        repair` when no kvcoordd runs; until then a library\n"
            "                        lookup still answers with the dead worker's info).\n"
            "                        Without --linger the registration stays after exit\n"
            "  -t, --timeout-ms N    how long to keep retrying when the segment does not\n"
            "                        exist yet (kvcoordd not started), in milliseconds\n"
            "                        (default %u; 0: try once)\n"
            "      --room ID         after registering, open bootstrap room ID (a decimal\n"
            "                        63-bit id) as participant N (the rank) and set this\n"
            "                        rank's KVPoll state in it; prints room=ID state=S\n"
            "      --room-state S    the state to set: failed, bootstrapping,\n"
            "                        waitingforinput, transferring, success or 0..4\n"
            "                        (default transferring)\n"
            "      --room-participants N\n"
            "                        participant count of the room (default: the\n"
            "                        segment's world size)\n"
            "      --fail REASON     then record a failure of the room from this rank\n"
            "                        with REASON and --fail-code (default 0)\n"
            "      --fail-code N     status code of that failure (errno, WC status)\n"
            "  -h, --help            print this help and exit\n"
            "\n"
            "Exit status:\n"
            "  0  registered (and, with --linger, stopped by SIGTERM or SIGINT)\n"
            "  1  runtime error: unreadable or invalid info file, segment missing after\n"
            "     the timeout, registration refused; the message gives the cause\n"
            "  2  usage error\n"
            "\n"
            "Example:\n"
            "  tools/gen_model_info.py --model llama-3.1-8b --out build/run/llama-3.1-8b\n"
            "  build/kvcoord-worker --segment kvcoord-6789 --rank 0 \\\n"
            "      --info build/run/llama-3.1-8b/rank-0.json --linger\n",
            prog, KVC_DEFAULT_PORT, KVC_DEFAULT_PORT, DEFAULT_TIMEOUT_MS);
}

static void fail(const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "%s: ", prog);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
}

/* A usage error: "kvcoord-worker: MESSAGE" and the hint line every program
 * of the project prints (kvcoordd, kvcoord-diag, kvcoord-bench); returns
 * EXIT_USAGE. */
static int usage_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int usage_fail(const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "%s: ", prog);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\nTry '%s --help' for more information.\n", prog);
    return EXIT_USAGE;
}

static int parse_long(const char *s, long min, long max, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end != '\0' || v < min || v > max)
        return -1;
    *out = v;
    return 0;
}

/* Fill *a from argv.  Returns 0, or EXIT_USAGE after printing why, or -1
 * when --help was printed (exit 0). */
static int parse_args(int argc, char **argv, worker_args *a)
{
    static const struct option opts[] = {
        {"info", required_argument, NULL, 'i'},
        {"rank", required_argument, NULL, 'r'},
        {"segment", required_argument, NULL, 's'},
        {"linger", no_argument, NULL, 'l'},
        {"timeout-ms", required_argument, NULL, 't'},
        {"help", no_argument, NULL, 'h'},
        {"room", required_argument, NULL, 'R'},
        {"room-state", required_argument, NULL, 'S'},
        {"room-participants", required_argument, NULL, 'P'},
        {"fail", required_argument, NULL, 'F'},
        {"fail-code", required_argument, NULL, 'C'},
        {NULL, 0, NULL, 0},
    };
    long v;
    int c, seen[sizeof opts / sizeof *opts] = {0};

    *a = (worker_args){
        .rank = -1, .timeout_ms = DEFAULT_TIMEOUT_MS, .room_state = KVC_POLL_TRANSFERRING};
    argv[0] = (char *)prog; /* getopt's own messages name the tool as the others do */
    while ((c = getopt_long(argc, argv, "i:r:s:lt:h", opts, NULL)) != -1) {
        /* An option with a value given twice is refused, not the last one
           taken silently. */
        for (size_t k = 0; opts[k].name; k++)
            if (opts[k].val == c && opts[k].has_arg == required_argument && seen[k]++)
                return usage_fail("option '--%s' is given more than once (again as '%s'): give "
                                  "it once",
                                  opts[k].name, optarg);
        switch (c) {
        case 'i': a->info_path = optarg; break;
        case 's': a->segment = optarg; break;
        case 'l': a->linger = 1; break;
        case 'h': usage(stdout); return -1;
        case 'r':
            if (parse_long(optarg, 0, INT32_MAX, &v))
                return usage_fail("--rank: '%s' is not an integer in 0..%ld", optarg,
                                  (long)INT32_MAX);
            a->rank = v;
            break;
        case 'R': {
            char *end;
            errno = 0;
            unsigned long long id = strtoull(optarg, &end, 10);
            if (errno || end == optarg || *end || optarg[0] == '-' || id > INT64_MAX)
                return usage_fail("--room: '%s' is not a room id (0..2^63-1)", optarg);
            a->has_room = 1;
            a->room = id;
            break;
        }
        case 'S':
            a->room_state = -1;
            for (long i = KVC_POLL_FAILED; i <= KVC_POLL_SUCCESS; i++)
                if (!strcasecmp(optarg, kvc_poll_name((kvc_poll)i)))
                    a->room_state = i;
            if (a->room_state < 0 && parse_long(optarg, 0, 4, &a->room_state))
                return usage_fail(
                    "--room-state: '%s' is not a KVPoll state (failed, bootstrapping, "
                    "waitingforinput, transferring, success or 0..4)",
                    optarg);
            break;
        case 'P':
            if (parse_long(optarg, 1, KVC_ROOM_MAX_PARTICIPANTS, &v))
                return usage_fail("--room-participants: '%s' is not in 1..%d", optarg,
                                  KVC_ROOM_MAX_PARTICIPANTS);
            a->room_participants = (uint32_t)v;
            break;
        case 'F': a->fail_reason = optarg; break;
        case 'C':
            if (parse_long(optarg, INT32_MIN, INT32_MAX, &v))
                return usage_fail("--fail-code: '%s' is not a 32-bit integer", optarg);
            a->fail_code = v;
            break;
        case 't':
            if (parse_long(optarg, 0, UINT32_MAX, &v))
                return usage_fail("--timeout-ms: '%s' is not a number of milliseconds in 0..%lu",
                                  optarg, (unsigned long)UINT32_MAX);
            a->timeout_ms = (uint32_t)v;
            break;
        default: /* getopt named the option */
            fprintf(stderr, "Try '%s --help' for more information.\n", prog);
            return EXIT_USAGE;
        }
    }
    if (optind < argc)
        return usage_fail("unexpected argument '%s'", argv[optind]);
    if (!a->info_path)
        return usage_fail(argc < 2 ? "no arguments: --info FILE is required"
                                   : "--info FILE is required");
    if ((a->fail_reason || a->room_participants) && !a->has_room) {
        /* name only the options given */
        if (a->fail_reason && a->room_participants)
            return usage_fail("--fail and --room-participants need --room ID");
        return usage_fail("%s needs --room ID", a->fail_reason ? "--fail" : "--room-participants");
    }
    if (a->segment && kvc_name_check(a->segment) != KVC_OK)
        return usage_fail("--segment: %s", kvc_last_error());
    return 0;
}

static long json_rank(const json_t *root)
{
    const json_t *r = json_object_get(root, "rank");
    if (!json_is_integer(r))
        r = json_object_get(root, "tp_rank");
    if (!json_is_integer(r) || json_integer_value(r) < 0 || json_integer_value(r) > INT32_MAX)
        return -1;
    return (long)json_integer_value(r);
}

/* Read path into *wi.  Returns 0, or -1 after printing why. */
static int load_info(const char *path, worker_info *wi)
{
    json_error_t jerr;
    struct stat st;
    /* jansson reads a directory as an empty file ("'[' or '{' expected near end
       of file"); other non-regular files (a pipe, <(...)) are read as they come */
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) {
        fail("%s: is a directory, not a rank info file (e.g. %s/rank-0.json)", path, path);
        return -1;
    }
    json_t *root = json_load_file(path, 0, &jerr);
    if (!root) {
        if (jerr.line > 0) /* a parse error; -1 when the file could not be read */
            fail("%s:%d:%d: %s", path, jerr.line, jerr.column, jerr.text);
        else
            fail("%s", jerr.text);
        return -1;
    }
    int rc = -1;
    const json_t *tei = json_object_get(root, "transfer_engine_info");
    const json_t *sid = json_object_get(tei, "session_id");
    const json_t *dict = json_object_get(tei, "weights_info_dict");
    if (!json_is_object(root)) /* without JSON_DECODE_ANY, an array */
        fail("%s: the top level is not a JSON object (expected {\"rank\": N, "
             "\"transfer_engine_info\": {...}})",
             path);
    else if (!json_is_object(tei))
        fail("%s: no \"transfer_engine_info\" object", path);
    else if (!json_is_string(sid) || json_string_length(sid) == 0 ||
             json_string_length(sid) > KVC_SESSION_ID_MAX ||
             strlen(json_string_value(sid)) != json_string_length(sid))
        fail("%s: transfer_engine_info.session_id must be a string of 1..%d bytes "
             "without NUL",
             path, KVC_SESSION_ID_MAX);
    else if (!json_is_object(dict))
        fail("%s: transfer_engine_info.weights_info_dict must be an object", path);
    else if (!(wi->dict_json = json_dumps(dict, JSON_COMPACT)))
        fail("%s: out of memory serialising weights_info_dict", path);
    else {
        memcpy(wi->session_id, json_string_value(sid), json_string_length(sid) + 1);
        wi->dict_len = strlen(wi->dict_json);
        wi->entries = json_object_size(dict);
        wi->file_rank = json_rank(root);
        rc = 0;
    }
    json_decref(root);
    return rc;
}

/* Sleep ms milliseconds unless a stop signal (blocked since main) arrives
 * first.  Returns the signal number, or 0 when the time ran out. */
static int sleep_ms(uint32_t ms, const sigset_t *stop)
{
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L};
    int sig;
    while ((sig = sigtimedwait(stop, NULL, &ts)) == -1 && errno == EINTR)
        ;
    return sig > 0 ? sig : 0;
}

/* Attach as a worker for rank, retrying while the segment does not exist
 * yet (or is still being created) until timeout_ms has passed or a stop
 * signal arrives.  Returns the last kvc_open() result, or KVC_E_TIMEDOUT
 * when stopped (*stopped_by then holds the signal). */
static kvc_err attach(const worker_args *a, uint32_t rank, const sigset_t *stop, kvc_segment **seg,
                      int *stopped_by)
{
    kvc_options o;
    kvc_options_init(&o);
    o.name = a->segment;
    o.mode = KVC_OPEN_ATTACH;
    /* A lingering worker serves its rank: the rank lives as long as it does
     * (withdrawn when it exits, cleanly or not).  A one-shot registration
     * is made on behalf of a server elsewhere and stays. */
    o.role = a->linger ? KVC_ROLE_WORKER : KVC_ROLE_CLIENT;
    o.rank = (int32_t)rank;

    uint64_t deadline = kvc__mono_us() + (uint64_t)a->timeout_ms * 1000u;
    uint32_t backoff_ms = 5;
    for (;;) {
        kvc_err e = kvc_open(&o, seg);
        if (e != KVC_E_NOENT && e != KVC_E_CORRUPT)
            return e;
        uint64_t now = kvc__mono_us();
        if (now >= deadline)
            return e;
        uint64_t left_ms = (deadline - now) / 1000u + 1;
        *stopped_by = sleep_ms(backoff_ms < left_ms ? backoff_ms : (uint32_t)left_ms, stop);
        if (*stopped_by)
            return e;
        if (backoff_ms < 200)
            backoff_ms *= 2;
    }
}

/* Block until SIGTERM or SIGINT arrives.  The signals are blocked from the
 * start of main(), so one sent while we were registering is not lost. */
static void wait_for_stop(const sigset_t *stop)
{
    int sig;
    while (sigwait(stop, &sig) != 0)
        ;
}

static const char *segment_name(const worker_args *a)
{
    static char dflt[32];
    if (a->segment)
        return a->segment;
    if (kvc_name_for_port(KVC_DEFAULT_PORT, dflt, sizeof dflt) != KVC_OK)
        return "(default)";
    return dflt;
}

/* Open --room, set --room-state, record --fail; prints one line.  Returns
 * 0, or -1 after printing why. */
static int room_work(const worker_args *a, kvc_segment *seg, uint32_t rank)
{
    kvc_err e = kvc_room_open(seg, a->room, a->room_participants, rank, KVC_ROOM_ROLE_PREFILL);
    if (!e)
        e = kvc_room_set_state(seg, a->room, rank, (kvc_poll)a->room_state);
    int kept = 0;
    if (!e && a->fail_reason)
        e = kvc_room_fail(seg, a->room, rank, (int32_t)a->fail_code, a->fail_reason, &kept);
    if (e) {
        fail("room %llu: %s (%s)", (unsigned long long)a->room, kvc_last_error(), kvc_strerror(e));
        return -1;
    }
    printf("%s: room=%llu state=%s%s\n", prog, (unsigned long long)a->room,
           kvc_poll_name((kvc_poll)a->room_state),
           a->fail_reason ? (kept ? " failure=kept" : " failure=not_kept") : "");
    return 0;
}

/* Say so when another live process attached to the segment registered
 * the rank (the process table's record and liveness rule: pid and start
 * time, not a zombie): this registration replaces it, and that process is
 * not told.  kvcoordd's own registrations (HTTP) are not named. */
static void note_live_holder(kvc_segment *seg, uint32_t rank)
{
    kvc_segment_info si;
    size_t n = 0;
    kvc_proc_info *procs = NULL;
    if (kvc_segment_stat(seg, &si) != KVC_OK || !si.max_procs ||
        !(procs = calloc(si.max_procs, sizeof *procs)) ||
        kvc_proc_list(seg, procs, si.max_procs, &n) != KVC_OK)
        n = 0;
    for (size_t i = 0; i < n && i < si.max_procs; i++)
        if (procs[i].rank == (int32_t)rank && procs[i].alive && procs[i].pid != getpid() &&
            procs[i].role != KVC_ROLE_DAEMON)
            fprintf(stderr,
                    "%s: note: rank %u was registered by pid %d, which still runs; this "
                    "registration replaces it\n",
                    prog, rank, (int)procs[i].pid);
    free(procs);
}

static int run(const worker_args *a, const sigset_t *stop)
{
    worker_info wi = {.file_rank = -1};
    kvc_segment *seg = NULL;
    uint64_t gen = 0;
    int rc = EXIT_RUNTIME;

    if (load_info(a->info_path, &wi) != 0)
        return EXIT_RUNTIME;
    long rank = a->rank >= 0 ? a->rank : wi.file_rank;
    if (a->rank >= 0 && wi.file_rank >= 0 && a->rank != wi.file_rank)
        fprintf(stderr, "%s: note: registering as rank %ld (--rank), not the rank %ld of %s\n",
                prog, a->rank, wi.file_rank, a->info_path);
    if (rank < 0) {
        fail("%s has no valid \"rank\"; give --rank N", a->info_path);
        goto out;
    }
    if (a->has_room && a->room_participants && (uint64_t)rank >= a->room_participants) {
        /* Before registering: a rank that cannot join the room is a
         * mistake in the options, not a registration to undo. */
        rc = usage_fail("rank %ld cannot join room %llu of --room-participants %u (ranks 0..%u)",
                        rank, (unsigned long long)a->room, a->room_participants,
                        a->room_participants - 1);
        goto out;
    }

    uint64_t t0 = kvc__mono_us();
    int stopped_by = 0;
    kvc_err e = attach(a, (uint32_t)rank, stop, &seg, &stopped_by);
    uint64_t t1 = kvc__mono_us();
    if (stopped_by) {
        fail("stopped by %s while waiting for segment %s", strsignal(stopped_by), segment_name(a));
        goto out;
    }
    if (e != KVC_OK) {
        fail("cannot attach to segment %s: %s (%s)", segment_name(a), kvc_last_error(),
             kvc_strerror(e));
        goto out;
    }
    note_live_holder(seg, (uint32_t)rank);
    e = kvc_rank_register(seg, (uint32_t)rank, wi.session_id, wi.dict_json, wi.dict_len, &gen);
    uint64_t t2 = kvc__mono_us();
    if (e != KVC_OK) {
        fail("registering rank %ld: %s (%s)", rank, kvc_last_error(), kvc_strerror(e));
        goto out;
    }
    printf("%s: rank=%ld generation=%llu entries=%zu dict_bytes=%zu register_us=%llu "
           "open_us=%llu segment=%s session_id=%s\n",
           prog, rank, (unsigned long long)gen, wi.entries, wi.dict_len,
           (unsigned long long)(t2 - t1), (unsigned long long)(t1 - t0), kvc_segment_name(seg),
           wi.session_id);
    if (a->has_room && room_work(a, seg, (uint32_t)rank) != 0)
        goto out;
    fflush(stdout);
    if (a->linger)
        wait_for_stop(stop);
    rc = 0;
out:
    kvc_close(seg);
    free(wi.dict_json);
    return rc;
}

int main(int argc, char **argv)
{
    worker_args a;
    sigset_t stop;

    int prc = parse_args(argc, argv, &a);
    if (prc != 0)
        return prc < 0 ? 0 : prc;

    sigemptyset(&stop);
    sigaddset(&stop, SIGTERM);
    sigaddset(&stop, SIGINT);
    /* Blocked in the whole process: taken with sigtimedwait() while waiting
     * for the segment and with sigwait() while lingering.  Without --linger
     * a signal that arrives after registration is simply discarded at exit. */
    sigprocmask(SIG_BLOCK, &stop, NULL);
    return run(&a, &stop);
}
