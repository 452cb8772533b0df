/*
 * options_table.c - every option of kvcoordd, one row each (see
 * options_table.h): its name, value, field, range, default and help.
 * kvcoordd_options.c builds the getopt_long array, the parsing and --help
 * from these rows, so what --help says is what the parser accepts.
 * The rows are in --help's order.
 */
#include "options_table.h"

#include <stdlib.h>
#include <string.h>

#include "cluster.h"
#include "kvcoord/kvcoord.h"
#include "net.h"
#include "pd_upkeep.h"

#define XSTR(x) STR(x)
#define STR(x) #x
#define MAX_HEAD_LIMIT (80 * 1024) /* http-parser's own bound on a head */
#define MIN_HEAD_LIMIT 1024        /* smaller refuses real clients' requests */
#define UNBOUNDED (SIZE_MAX / 2)   /* what a size_t can count, with room to add */

/* The field at f, checked to be of type T at compile time (a negative
 * array size otherwise). */
#define FIELD(f, T)                                                    \
    (offsetof(struct options, f) +                                     \
     0 * sizeof(char[_Generic(((struct options *)0)->f, T : 1, default \
                              : -1)]))
#define U32(f) FIELD(f, uint32_t)
#define U64(f) FIELD(f, uint64_t)
#define TEXT(f) FIELD(f, const char *)

_Static_assert(KVC_ROOM_MAX_PARTICIPANTS == 32, "--world-size's message says 32");

/* The segment's defaults are the library's (kvc_options_init). */
#define LIB_DEFAULT(fn, expr) \
    static uint64_t fn(void)  \
    {                         \
        kvc_options l;        \
        kvc_options_init(&l); \
        return (expr);        \
    }
LIB_DEFAULT(lib_world_size, l.world_size)
LIB_DEFAULT(lib_max_ranks, l.max_ranks)
LIB_DEFAULT(lib_max_info_bytes, l.max_info_bytes)
LIB_DEFAULT(lib_arena_bytes, l.arena_bytes)
LIB_DEFAULT(lib_max_rooms, l.max_rooms)
LIB_DEFAULT(lib_max_procs, l.max_procs)
LIB_DEFAULT(lib_room_ttl_s, l.room_ttl_ms / 1000)
LIB_DEFAULT(lib_lock_timeout_ms, l.lock_timeout_ms)

/* --pd-room-interval's default: sglang's own setting when the environment
 * has it (a valid 1..86400), else its default. */
static uint64_t pd_interval_default(void)
{
    const char *v = getenv("SGLANG_DISAGGREGATION_BOOTSTRAP_ENTRY_CLEANUP_INTERVAL");
    char *end;
    unsigned long n = v ? strtoul(v, &end, 10) : 0;
    return v && *v && !*end && n >= 1 && n <= 86400 ? (uint32_t)n : PD_ROOM_INTERVAL_DEFAULT_S;
}

static int check_listen(void *field, const char *v, char *why, size_t cap)
{
    (void)field;
    char host[256], err[128];
    uint16_t port;
    if (!net_parse_addr(v, host, sizeof host, &port, err, sizeof err))
        return 0;
    snprintf(why, cap, ": %s", err);
    return -1;
}

static int check_segment(void *field, const char *v, char *why, size_t cap)
{
    (void)field;
    if (!kvc_name_check(v))
        return 0;
    snprintf(why, cap, ": %s", kvc_last_error());
    return -1;
}

static int check_etcd(void *field, const char *v, char *why, size_t cap)
{
    (void)field;
    if (!strncmp(v, "http://", 7) || !strncmp(v, "https://", 8))
        return 0;
    snprintf(why, cap, " (expected http://HOST:PORT[,...])");
    return -1;
}

static int check_name(void *field, const char *v, char *why, size_t cap)
{
    (void)field;
    if (cluster_name_ok(v))
        return 0;
    snprintf(why, cap, " (1..%d bytes of [A-Za-z0-9._-])", CLUSTER_NAME_MAX);
    return -1;
}

static int check_file(void *field, const char *v, char *why, size_t cap)
{
    (void)field;
    if (*v)
        return 0;
    snprintf(why, cap, " (expected a file name)");
    return -1;
}

static int set_log_level(void *field, const char *v, char *why, size_t cap)
{
    if (!log_parse_level(v, field))
        return 0;
    snprintf(why, cap, " (expected debug, info, warn or error)");
    return -1;
}

const struct opt_row opt_rows[] = {
    {.name = "listen",
     .kind = OPT_TEXT,
     .arg = "ADDR:PORT",
     .off = TEXT(listen),
     .def_str = "127.0.0.1:" XSTR(KVC_DEFAULT_PORT),
     .fn = check_listen,
     .help = "address to listen on; IPv6 in brackets: [::1]:6789, and an IPv6 address "
             "listens for IPv6 only ([::]:6789 takes no IPv4 connection: use 0.0.0.0:6789 "
             "for IPv4); port 0 picks a free one"},
    {.name = "segment",
     .kind = OPT_TEXT,
     .arg = "NAME",
     .off = TEXT(segment),
     .def_text = "kvcoord-PORT, from the listening port",
     .fn = check_segment,
     .help = "the shared-memory segment /dev/shm/NAME, NAME of [A-Za-z0-9._-]"},
    {.name = "fresh",
     .kind = OPT_FLAG,
     .off = FIELD(fresh, int),
     .min = 1,
     .help = "discard an existing segment of that name and start empty (default: reuse a "
             "valid one, so registrations survive a restart of the daemon); refused while "
             "other processes are attached to it (named)"},
    {.name = "force-fresh",
     .kind = OPT_FLAG,
     .off = FIELD(fresh, int),
     .min = 2,
     .help = "--fresh even with processes attached: their next call on the discarded "
             "segment fails"},
    {.name = "world-size",
     .kind = OPT_COUNT,
     .arg = "N",
     .off = U32(world_size),
     .min = 1,
     .max = KVC_ROOM_MAX_PARTICIPANTS,
     .def_fn = lib_world_size,
     .why = ": a bootstrap room holds at most 32 participants, and rooms of the whole TP "
            "group must open",
     .help = "TP group size on this node, recorded in a new segment; no more than a "
             "bootstrap room's participants, nor --max-ranks"},
    /* The segment's own limits (kvcoord.h: kvc_open refuses more). */
    {.name = "max-ranks",
     .kind = OPT_COUNT,
     .arg = "N",
     .off = U32(max_ranks),
     .min = 1,
     .max = KVC_LIMIT_MAX_RANKS,
     .def_fn = lib_max_ranks,
     .help = "rank table entries of a new segment"},
    {.name = "max-info-bytes",
     .kind = OPT_SIZE,
     .arg = "SIZE",
     .off = U64(max_info_bytes),
     .min = KVC_LIMIT_INFO_MIN,
     .max = KVC_LIMIT_ARENA_MAX / 2,
     .def_fn = lib_max_info_bytes,
     .why = ", and at most half of --arena-bytes",
     .help = "largest session_id + weights_info_dict per rank in a new segment; at most "
             "half of --arena-bytes"},
    {.name = "arena-bytes",
     .kind = OPT_SIZE,
     .arg = "SIZE",
     .off = U64(arena_bytes),
     .min = KVC_LIMIT_ARENA_MIN,
     .max = KVC_LIMIT_ARENA_MAX,
     .def_fn = lib_arena_bytes,
     .help = "info arena shared by all ranks of a new segment; sparse, untouched pages cost "
             "nothing"},
    {.name = "max-rooms",
     .kind = OPT_COUNT,
     .arg = "N",
     .off = U32(max_rooms),
     .min = 1,
     .max = KVC_LIMIT_MAX_ROOMS,
     .def_fn = lib_max_rooms,
     .help = "bootstrap rooms active at once in a new segment; about 1.7 KiB of /dev/shm "
             "each"},
    {.name = "max-procs",
     .kind = OPT_COUNT,
     .arg = "N",
     .off = U32(max_procs),
     .min = 1,
     .max = KVC_LIMIT_MAX_PROCS,
     .def_fn = lib_max_procs,
     .help = "attached processes of a new segment"},
    {.name = "room-ttl",
     .kind = OPT_COUNT,
     .arg = "SECS",
     .off = U32(room_ttl_s),
     .min = 1,
     .max = 4000000,
     .def_fn = lib_room_ttl_s,
     .help = "a room idle this long fails and is reclaimed; for a new segment"},
    {.name = "max-body-bytes",
     .kind = OPT_SIZE,
     .arg = "SIZE",
     .off = U64(max_body),
     .min = 1,
     .max = UNBOUNDED,
     .def = 64ull << 20,
     .help = "largest request body; more gets 413"},
    {.name = "max-header-bytes",
     .kind = OPT_SIZE,
     .arg = "SIZE",
     .off = U64(max_head),
     .min = MIN_HEAD_LIMIT,
     .max = MAX_HEAD_LIMIT,
     .def = 64 << 10,
     .why = ": less is too small for any request real clients send, more is past "
            "http-parser's bound on a head",
     .help = "largest request line + headers; more gets 431"},
    {.name = "max-conns",
     .kind = OPT_COUNT,
     .arg = "N",
     .off = U32(max_conns),
     .min = 1,
     .max = 65536,
     .def = 4096,
     .help = "connections served at once; at the cap, connections that waited 250 ms or "
             "more for a request are closed to make room, and with none to close a new one "
             "is answered 503"},
    {.name = "max-conns-per-peer",
     .kind = OPT_COUNT,
     .arg = "N",
     .off = U32(max_conns_per_peer),
     .min = 0,
     .max = 65536,
     .noun = "",
     .def_text = "a quarter of --max-conns, for every address but loopback's, which every "
                 "rank of the node shares",
     .help = "connections one client address may hold at once, waiting for a slot "
             "included; more are answered 503 and closed; given, N applies to every "
             "address, loopback included, and may not exceed --max-conns; 0: no cap"},
    {.name = "header-timeout",
     .kind = OPT_COUNT,
     .arg = "SECS",
     .off = U32(header_timeout_s),
     .min = 1,
     .max = 86400,
     .def = 10,
     .help = "time to receive a request head, and a new connection's first request"},
    {.name = "idle-timeout",
     .kind = OPT_COUNT,
     .arg = "SECS",
     .off = U32(idle_timeout_s),
     .min = 1,
     .max = 86400,
     .def = 60,
     .help = "keep-alive idle time, and the longest stall while a body arrives or an answer "
             "leaves"},
    {.name = "auth-token-file",
     .kind = OPT_TEXT,
     .arg = "FILE",
     .off = TEXT(auth_file),
     .fn = check_file,
     .help = "mutating requests (registrations, PD bootstrap included; withdrawal; room "
             "failures) need "
             "'Authorization: Bearer TOKEN', TOKEN being FILE's contents less one trailing "
             "newline; FILE must not be accessible by others (chmod o-rwx).  Without it the "
             "token comes from the environment variable KVCOORD_AUTH_TOKEN; with neither, "
             "every request is allowed.  An empty token refuses all mutating requests.  Read "
             "routes stay open."},
    {.name = "max-buffered-bytes",
     .kind = OPT_SIZE,
     .arg = "SIZE",
     .off = U64(max_buffered),
     .min = 1,
     .max = UNBOUNDED,
     .def = 256ull << 20,
     .help = "request bodies all connections together may hold while they arrive; a body "
             "that does not fit is answered 503 (Retry-After) from its headers and not read; "
             "at least --max-body-bytes"},
    {.name = "body-timeout",
     .kind = OPT_COUNT,
     .arg = "SECS",
     .off = U32(body_timeout_s),
     .min = 1,
     .max = 86400,
     .def = 60,
     .help = "a request body must arrive whole within SECS of its headers, however it "
             "trickles"},
    {.name = "max-answer-bytes",
     .kind = OPT_SIZE,
     .arg = "SIZE",
     .off = U64(max_answer),
     .min = 1 << 20,
     .max = UNBOUNDED,
     .def = 256ull << 20,
     .help = "answer bytes all connections together may hold unsent (clients that do not "
             "read); past it an answer over 64K is answered 503 (Retry-After) and a "
             "connection with unsent bytes is not read; /health and small answers go on"},
    {.name = "lock-timeout",
     .kind = OPT_COUNT,
     .arg = "MS",
     .off = U32(lock_timeout_ms),
     .min = 1,
     .max = KVC_LIMIT_LOCK_TIMEOUT_MS,
     .def_fn = lib_lock_timeout_ms,
     .help = "longest wait for a segment lock; a lock held longer (by a stopped process) "
             "answers the request 503 with Retry-After, naming the lock and its holder; for "
             "this daemon's own calls"},
    {.name = "bind-retry",
     .kind = OPT_COUNT,
     .arg = "SECS",
     .off = U32(bind_retry_s),
     .min = 0,
     .max = 3600,
     .def = 5,
     .noun = "seconds",
     .help = "a port held by a live process fails the start at once, naming it; with SECS, "
             "binding is retried for up to SECS whoever holds the port (a supervisor that "
             "starts the new daemon while the old one still stops); 0: never retried.  "
             "Without it only a socket no process holds (a daemon killed a moment ago: its "
             "socket lingers a few tens of ms) is waited for, up to the default SECS"},
    {.name = "pd-room-interval",
     .kind = OPT_COUNT,
     .arg = "SECS",
     .off = U32(pd_room_interval_s),
     .min = 1,
     .max = 86400,
     .def_fn = pd_interval_default,
     .help = "sglang's PD bootstrap routes (PUT/GET /route, POST /register_dp_rank, "
             "/query_dp_ranks) forget a room's DP rank after one to two intervals, as "
             "sglang's server does; the default is sglang's own, the environment variable "
             "SGLANG_DISAGGREGATION_BOOTSTRAP_ENTRY_CLEANUP_INTERVAL when it holds a valid "
             "value"},
    {.name = "etcd",
     .kind = OPT_TEXT,
     .arg = "URL[,URL...]",
     .off = TEXT(etcd),
     .def_text = "off, this node alone",
     .fn = check_etcd,
     .help = "publish this node's ranks and room failures in etcd (v3 JSON gateway; every "
             "member's client URL) and mirror the other nodes' into the segment, so a lookup "
             "of any node's rank is local; etcd unreachable, this node serves its own, "
             "retrying in the background"},
    {.name = "cluster",
     .kind = OPT_TEXT,
     .arg = "NAME",
     .off = TEXT(cluster),
     .def_str = "kvcoord",
     .fn = check_name,
     .help = "keys live under /kvcoord/NAME/; NAME is 1.." XSTR(
         CLUSTER_NAME_MAX) " bytes of [A-Za-z0-9._-]"},
    {.name = "node",
     .kind = OPT_TEXT,
     .arg = "NAME",
     .off = TEXT(node),
     .def_text = "the host name",
     .fn = check_name,
     .help = "this node's name in the cluster, as --cluster's NAME"},
    {.name = "etcd-ttl",
     .kind = OPT_COUNT,
     .arg = "SECS",
     .off = U32(etcd_ttl_s),
     .min = 1,
     .max = 3600,
     .def = 10,
     .help = "lease TTL: a killed or frozen node's entries vanish from the others this long "
             "after"},
    {.name = "advertise-url",
     .kind = OPT_TEXT,
     .arg = "URL",
     .off = TEXT(advertise),
     .def_text = "http://ADDR:PORT of --listen, the host name for a wildcard address",
     .help = "how other nodes reach this kvcoordd, to fetch rank info too large for etcd"},
    {.name = "etcd-user",
     .kind = OPT_TEXT,
     .arg = "USER",
     .off = TEXT(etcd_user),
     .help = "authenticate to etcd as USER, with the password of --etcd-password-file"},
    {.name = "etcd-password-file",
     .kind = OPT_TEXT,
     .arg = "FILE",
     .off = TEXT(etcd_password_file),
     .help = "--etcd-user's password: FILE's first line"},
    {.name = "etcd-cacert",
     .kind = OPT_TEXT,
     .arg = "FILE",
     .off = TEXT(etcd_cacert),
     .help = "CA bundle for https:// etcd endpoints"},
    {.name = "etcd-cert",
     .kind = OPT_TEXT,
     .arg = "FILE",
     .off = TEXT(etcd_cert),
     .help = "client certificate (PEM) for etcd"},
    {.name = "etcd-key",
     .kind = OPT_TEXT,
     .arg = "FILE",
     .off = TEXT(etcd_key),
     .help = "the key of --etcd-cert (PEM)"},
    {.name = "log-level",
     .kind = OPT_SET,
     .arg = "LEVEL",
     .off = FIELD(log_level, enum log_level),
     .def_str = "info",
     .fn = set_log_level,
     .help = "debug, info, warn or error"},
    {.name = "version",
     .letter = 'V',
     .kind = OPT_VERSION,
     .help = "print the version and the segment layout version"},
    {.name = "help", .letter = 'h', .kind = OPT_HELP, .help = "print this help"},
};
const size_t opt_nrows = sizeof opt_rows / sizeof opt_rows[0];
_Static_assert(sizeof opt_rows / sizeof opt_rows[0] <= 64, "struct options' given has 64 bits");

void opt_print_version(FILE *f)
{
    fprintf(f, "kvcoordd %s (segment layout version %u)\n", KVC_VERSION, KVC_LAYOUT_VERSION);
}

/* --help before the options (the usage line, what kvcoordd is) and after
 * them (what holds for several options, signals, exit status, examples). */
const char opt_usage_head[] =
    "Usage: kvcoordd [OPTION]...\n"
    "\n"
    "kvcoordd serves a node's kvcoord segment (the rank table of transfer-engine\n"
    "info) over HTTP with the API of sglang's engine-info bootstrap server:\n"
    "PUT /register_transfer_engine_info, GET /get_transfer_engine_info?rank=N,\n"
    "PUT /register_parallelism_config (a rank's parallelism config), GET /health,\n"
    "plus GET /ranks, DELETE /transfer_engine_info?rank=N, the wait_ms long-poll,\n"
    "GET /rooms/ROOM, PUT /rooms/ROOM/failure, GET /failures and GET /metrics\n"
    "(Prometheus).  It is also sglang's PD bootstrap server (the prefill rank\n"
    "table, docs/http-api.md's PD bootstrap):\n"
    "  PUT /route               a prefill rank registers\n"
    "  GET /route?prefill_dp_rank=D&prefill_cp_rank=C&target_tp_rank=T&\n"
    "                target_pp_rank=P  a decode worker reads the prefill topology\n"
    "                           (all four -1) or a rank's rank_ip:rank_port\n"
    "  POST /register_dp_rank   a bootstrap room's DP rank\n"
    "  POST /query_dp_ranks     the DP ranks of bootstrap rooms\n"
    "See docs/http-api.md and docs/operations.md.  Co-located TP workers attach\n"
    "to the same segment through libkvcoord; kvcoordd watches each attached\n"
    "process and, when one dies, fails its rooms and withdraws the ranks it\n"
    "registered.  It logs one line per event on stderr and says\n"
    "\"listening addr=... segment=...\" once it accepts connections.\n"
    "\n"
    "Options:\n";
const char opt_usage_tail[] =
    "\n"
    "Each option with a value is given once: a second --listen (or any other)\n"
    "is a usage error naming it, never a silent override.\n"
    "SIZE is a number of bytes with an optional K, M or G suffix (powers of\n"
    "1024; KiB, MiB and GiB are accepted too).  Capacities (--world-size,\n"
    "--max-ranks, --max-info-bytes, --arena-bytes, --max-rooms, --max-procs,\n"
    "--room-ttl) apply when the segment is created; a reused segment keeps its\n"
    "own.  A new segment's tables (about 59 MiB with the defaults, mostly rooms)\n"
    "get their pages in /dev/shm at once; rank info gets pages as it arrives.\n"
    "When /dev/shm is too small (a container's default 64 MiB, say), start is\n"
    "refused with a message saying so, and a registration that finds no space is\n"
    "answered 507; lower --max-rooms or enlarge /dev/shm.\n"
    "\n"
    "Socket activation: when started with LISTEN_PID (its own pid) and\n"
    "LISTEN_FDS=1 (systemd's protocol; tools/kvcoordd@.socket), kvcoordd serves\n"
    "the listening socket at descriptor 3 instead of binding --listen; the\n"
    "supervisor keeps it open across restarts, so connections that arrive while\n"
    "the daemon is down wait in its backlog and are answered by the next one.\n"
    "\n"
    "The event loop never waits for a segment lock: requests that may (every\n"
    "mutating one, the room routes, /failures) run on helper threads, and so do\n"
    "reaping, the room sweep and the event log.  A mutating request with a bad or\n"
    "missing token is answered 401 from its headers; its body is never read.\n"
    "\n"
    "The segment file is watched: re-moded or extended under the daemon, it is\n"
    "put back (logged at error); truncated, unlinked or replaced, the daemon logs\n"
    "an error naming the change and exits 1 (the attached workers must restart\n"
    "too).  A file found invalid at start is renamed NAME.invalid-TIME for\n"
    "kvcoord-diag (logged at error), never silently replaced.\n"
    "\n"
    "Signals: SIGINT and SIGTERM stop the daemon cleanly; the segment and its\n"
    "registrations stay in /dev/shm for the next start.  SIGHUP re-reads the\n"
    "token file (a bad file keeps the previous token).  Under systemd\n"
    "(Type=notify) READY=1 is sent once the socket listens.\n"
    "\n"
    "Exit status:\n"
    "  0  stopped by SIGINT or SIGTERM (or --help, --version)\n"
    "  1  could not listen, read the token, open the segment or run the server;\n"
    "     or the segment file was truncated, unlinked or replaced under it\n"
    "  2  usage error (unknown option, bad value, an option with a value given\n"
    "     twice, options that cannot work together such as --world-size above\n"
    "     the 32 participants of a room)\n"
    "\n"
    "Examples:\n"
    "  kvcoordd\n"
    "      serve segment kvcoord-6789 on 127.0.0.1:6789\n"
    "  kvcoordd --listen [::]:6789 --fresh --max-body-bytes 256M\n"
    "      every IPv6 address, a new empty segment, bodies up to 256 MiB\n"
    "  curl -s 'http://127.0.0.1:6789/get_transfer_engine_info?rank=0&wait_ms=5000'\n"
    "      look up rank 0, waiting up to 5 s for it to register\n";
