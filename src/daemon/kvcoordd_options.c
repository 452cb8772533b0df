/*
 * kvcoordd_options.c - kvcoordd's command line; see kvcoordd_options.h.
 * Every wrong value gets one message naming the range accepted (and where
 * a range comes from), and options that cannot work together are refused
 * with the reason, rather than failing every request later.
 */
#include "kvcoordd_options.h"

#include <getopt.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "cluster.h"
#include "kvcoord/kvcoord.h"
#include "net.h"
#include "pd_upkeep.h"
#include "query.h"

#define DEFAULT_LISTEN "127.0.0.1:6789"
#define MAX_HEAD_LIMIT (80 * 1024) /* http-parser's own bound on a head */
#define MIN_HEAD_LIMIT 1024        /* smaller refuses real clients' requests */

/* --pd-room-interval's default: sglang's own setting when the environment
 * has it (a valid 1..86400), else its default. */
static uint32_t pd_interval_default(void)
{
    const char *v = getenv("SGLANG_DISAGGREGATION_BOOTSTRAP_ENTRY_CLEANUP_INTERVAL");
    char *end;
    unsigned long n = v ? strtoul(v, &end, 10) : 0;
    return v && *v && !*end && n >= 1 && n <= 86400 ? (uint32_t)n : PD_ROOM_INTERVAL_DEFAULT_S;
}

static void usage(FILE *f)
{
    fprintf(f, "Usage: kvcoordd [OPTION]...\n"
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
               "Options:\n"
               "  --listen ADDR:PORT     address to listen on (default " DEFAULT_LISTEN ");\n"
               "                         IPv6 in brackets: [::1]:6789; port 0 picks a free one\n"
               "  --segment NAME         shared-memory segment /dev/shm/NAME ([A-Za-z0-9._-];\n"
               "                         default kvcoord-PORT, from the listening port)\n"
               "  --fresh                discard an existing segment of that name and start\n"
               "                         empty (default: reuse a valid one, so registrations\n"
               "                         survive a restart of the daemon); refused while\n"
               "                         other processes are attached to it (named)\n"
               "  --force-fresh          --fresh even with processes attached: their next\n"
               "                         call on the discarded segment fails\n"
               "  --world-size N         TP group size on this node, recorded in a new\n"
               "                         segment (default 8; 1..32, the participants of a\n"
               "                         room, and at most --max-ranks)\n"
               "  --max-ranks N          rank table entries of a new segment (default 1024;\n"
               "                         1..1048576)\n"
               "  --max-info-bytes SIZE  largest session_id + weights_info_dict per rank in a\n"
               "                         new segment (default 16M; 64 bytes..half of\n"
               "                         --arena-bytes)\n"
               "  --arena-bytes SIZE     info arena shared by all ranks of a new segment;\n"
               "                         sparse, untouched pages cost nothing (default 1G;\n"
               "                         1K..1024G)\n"
               "  --max-rooms N          bootstrap rooms active at once in a new segment\n"
               "                         (default 32768, at most 4194304; about 1.7 KiB of\n"
               "                         /dev/shm each)\n"
               "  --max-procs N          attached processes of a new segment (default 4096;\n"
               "                         1..1048576)\n"
               "  --room-ttl SECS        a room idle this long fails and is reclaimed; for a\n"
               "                         new segment (default 300)\n"
               "  --max-body-bytes SIZE  largest request body; more gets 413 (default 64M)\n"
               "  --max-header-bytes SIZE\n"
               "                         largest request line + headers; more gets 431\n"
               "                         (default 64K; 1K..80K)\n"
               "  --max-conns N          connections served at once (default 4096, at most\n"
               "                         65536); at the cap, connections that waited 250 ms\n"
               "                         or more for a request are closed to make room, and\n"
               "                         with none to close a new one is answered 503\n"
               "  --max-conns-per-peer N connections one client address may hold at once,\n"
               "                         waiting for a slot included; more are answered 503\n"
               "                         and closed (default a quarter of --max-conns, for\n"
               "                         every address but loopback's, which every rank of\n"
               "                         the node shares; given, N applies to every address,\n"
               "                         loopback included; 0: no cap)\n"
               "  --header-timeout SECS  time to receive a request head, and a new\n"
               "                         connection's first request (default 10)\n"
               "  --idle-timeout SECS    keep-alive idle time, and the longest stall while a\n"
               "                         body arrives or an answer leaves (default 60)\n"
               "  --auth-token-file FILE mutating requests (registration, withdrawal, room\n"
               "                         failures) need 'Authorization: Bearer TOKEN', TOKEN\n"
               "                         being FILE's contents less one trailing newline;\n"
               "                         FILE must not be accessible by others (chmod o-rwx).\n"
               "                         Without it the token comes from the environment\n"
               "                         variable KVCOORD_AUTH_TOKEN; with neither, every\n"
               "                         request is allowed.  An empty token refuses all\n"
               "                         mutating requests.  Read routes stay open.\n"
               "  --max-buffered-bytes SIZE\n"
               "                         request bodies all connections together may hold\n"
               "                         while they arrive; a body that does not fit is\n"
               "                         answered 503 (Retry-After) from its headers and not\n"
               "                         read (default 256M; at least --max-body-bytes)\n"
               "  --body-timeout SECS    a request body must arrive whole within SECS of its\n"
               "                         headers, however it trickles (default 60)\n"
               "  --max-answer-bytes SIZE\n"
               "                         answer bytes all connections together may hold\n"
               "                         unsent (clients that do not read); past it an\n"
               "                         answer over 64K is answered 503 (Retry-After) and a\n"
               "                         connection with unsent bytes is not read; /health\n"
               "                         and small answers go on (default 256M; 1M..)\n"
               "  --lock-timeout MS      longest wait for a segment lock; a lock held longer\n"
               "                         (by a stopped process) answers the request 503 with\n"
               "                         Retry-After, naming the lock and its holder; for this\n"
               "                         daemon's own calls (default 2000)\n"
               "  --bind-retry SECS      a port held by a live process fails the start at once,\n"
               "                         naming it; with SECS, binding is retried for up to\n"
               "                         SECS whoever holds the port (a supervisor that\n"
               "                         starts the new daemon while the old one still\n"
               "                         stops); 0: never retried.  Without it only a socket\n"
               "                         no process holds (a daemon killed a moment ago: its\n"
               "                         socket lingers a few tens of ms) is waited for, up\n"
               "                         to 5 s\n"
               "  --pd-room-interval SECS\n"
               "                         sglang's PD bootstrap routes (PUT/GET /route, POST\n"
               "                         /register_dp_rank, /query_dp_ranks) forget a room's\n"
               "                         DP rank after one to two intervals, as sglang's\n"
               "                         server does (default: the environment variable\n"
               "                         SGLANG_DISAGGREGATION_BOOTSTRAP_ENTRY_CLEANUP_INTERVAL,\n"
               "                         else 120; 1..86400)\n"
               "  --etcd URL[,URL...]    publish this node's ranks and room failures in etcd\n"
               "                         (v3 JSON gateway; every member's client URL) and\n"
               "                         mirror the other nodes' into the segment, so a\n"
               "                         lookup of any node's rank is local (default: off,\n"
               "                         this node alone).  etcd unreachable: this node\n"
               "                         serves its own, retrying in the background\n"
               "  --cluster NAME         keys live under /kvcoord/NAME/ (default kvcoord)\n"
               "  --node NAME            this node's name in the cluster (default: the host\n"
               "                         name; [A-Za-z0-9._-], at most 63 bytes)\n"
               "  --etcd-ttl SECS        lease TTL: a killed or frozen node's entries vanish\n"
               "                         from the others this long after (default 10)\n"
               "  --advertise-url URL    how other nodes reach this kvcoordd, to fetch rank\n"
               "                         info too large for etcd (default http://ADDR:PORT\n"
               "                         of --listen, the host name for a wildcard address)\n"
               "  --etcd-user USER       authenticate to etcd as USER, with the password in\n"
               "  --etcd-password-file FILE  (its first line)\n"
               "  --etcd-cacert FILE     CA bundle for https:// etcd endpoints\n"
               "  --etcd-cert FILE       client certificate (PEM) for etcd\n"
               "  --etcd-key FILE        its key (PEM)\n"
               "  --log-level LEVEL      debug, info, warn or error (default info)\n"
               "  -V, --version          print the version and the segment layout version\n"
               "  -h, --help             print this help\n"
               "\n"
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
               "  2  usage error (unknown option, bad value, options that cannot work\n"
               "     together such as --world-size above the 32 participants of a room)\n"
               "\n"
               "Examples:\n"
               "  kvcoordd\n"
               "      serve segment kvcoord-6789 on 127.0.0.1:6789\n"
               "  kvcoordd --listen [::]:6789 --fresh --max-body-bytes 256M\n"
               "      every IPv6 address, a new empty segment, bodies up to 256 MiB\n"
               "  curl -s 'http://127.0.0.1:6789/get_transfer_engine_info?rank=0&wait_ms=5000'\n"
               "      look up rank 0, waiting up to 5 s for it to register\n");
}

static int usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Print "kvcoordd: <message>" and the hint; returns exit status 2. */
static int usage_error(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "kvcoordd: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\nTry 'kvcoordd --help' for more information.\n");
    va_end(ap);
    return 2;
}

/* Bytes with an optional K/M/G (KiB/MiB/GiB) suffix. */
static int parse_size(const char *s, uint64_t *out)
{
    char digits[32];
    size_t n = strspn(s, "0123456789");
    if (n == 0 || n >= sizeof digits)
        return -1;
    memcpy(digits, s, n);
    digits[n] = '\0';
    uint64_t v, mult = 1;
    const char *suf = s + n;
    if (*suf) {
        switch (*suf) {
        case 'k':
        case 'K': mult = 1ull << 10; break;
        case 'm':
        case 'M': mult = 1ull << 20; break;
        case 'g':
        case 'G': mult = 1ull << 30; break;
        default: return -1;
        }
        suf++;
        if (*suf && strcasecmp(suf, "iB") != 0 && strcasecmp(suf, "B") != 0)
            return -1;
    }
    if (parse_uint(digits, UINT64_MAX / mult, &v))
        return -1;
    *out = v * mult;
    return 0;
}

static const struct option long_opts[] = {
    {"listen", required_argument, NULL, OPT_LISTEN},
    {"segment", required_argument, NULL, OPT_SEGMENT},
    {"fresh", no_argument, NULL, OPT_FRESH},
    {"force-fresh", no_argument, NULL, OPT_FORCE_FRESH},
    {"world-size", required_argument, NULL, OPT_WORLD},
    {"max-ranks", required_argument, NULL, OPT_RANKS},
    {"max-info-bytes", required_argument, NULL, OPT_INFO},
    {"arena-bytes", required_argument, NULL, OPT_ARENA},
    {"max-body-bytes", required_argument, NULL, OPT_BODY},
    {"max-header-bytes", required_argument, NULL, OPT_HEAD},
    {"max-conns", required_argument, NULL, OPT_CONNS},
    {"max-conns-per-peer", required_argument, NULL, OPT_CONNS_PER_PEER},
    {"header-timeout", required_argument, NULL, OPT_HTIMEOUT},
    {"idle-timeout", required_argument, NULL, OPT_ITIMEOUT},
    {"log-level", required_argument, NULL, OPT_LOG},
    {"auth-token-file", required_argument, NULL, OPT_AUTH},
    {"max-rooms", required_argument, NULL, OPT_ROOMS},
    {"max-procs", required_argument, NULL, OPT_PROCS},
    {"room-ttl", required_argument, NULL, OPT_TTL},
    {"bind-retry", required_argument, NULL, OPT_BIND_RETRY},
    {"lock-timeout", required_argument, NULL, OPT_LOCK_TIMEOUT},
    {"max-buffered-bytes", required_argument, NULL, OPT_MAX_BUFFERED},
    {"body-timeout", required_argument, NULL, OPT_BODY_TIMEOUT},
    {"max-answer-bytes", required_argument, NULL, OPT_MAX_ANSWER},
    {"pd-room-interval", required_argument, NULL, OPT_PD_INTERVAL},
    {"etcd", required_argument, NULL, OPT_ETCD},
    {"cluster", required_argument, NULL, OPT_CLUSTER},
    {"node", required_argument, NULL, OPT_NODE},
    {"etcd-ttl", required_argument, NULL, OPT_ETCD_TTL},
    {"advertise-url", required_argument, NULL, OPT_ADVERTISE},
    {"etcd-user", required_argument, NULL, OPT_ETCD_USER},
    {"etcd-password-file", required_argument, NULL, OPT_ETCD_PW},
    {"etcd-cacert", required_argument, NULL, OPT_ETCD_CA},
    {"etcd-cert", required_argument, NULL, OPT_ETCD_CERT},
    {"etcd-key", required_argument, NULL, OPT_ETCD_KEY},
    {"version", no_argument, NULL, 'V'},
    {"help", no_argument, NULL, 'h'},
    {NULL, 0, NULL, 0},
};

_Static_assert(KVC_ROOM_MAX_PARTICIPANTS == 32, "--world-size's message says 32");

/* A positive integer flag value in [1, max]; why (NULL: none) is appended
 * to the message, to say where the range comes from.  Every wrong value
 * gets the same message, with the one range accepted. */
static int count_arg(const char *name, const char *v, uint64_t max, const char *why, uint32_t *out)
{
    uint64_t n;
    if (parse_uint(v, max, &n) || n == 0)
        return usage_error("invalid %s '%s' (expected an integer in 1..%llu%s)", name, v,
                           (unsigned long long)max, why ? why : "");
    *out = (uint32_t)n;
    return 0;
}

/* A size as the help writes it: "80K", "1024G" when it is a whole number of
 * KiB/MiB/GiB, else its bytes. */
static const char *size_text(uint64_t v, char *buf, size_t cap)
{
    static const char suffix[] = "GMK";
    for (int i = 0; i < 3; i++) {
        unsigned shift = 30 - 10 * (unsigned)i;
        if (v && v % (1ull << shift) == 0) {
            snprintf(buf, cap, "%llu%c", (unsigned long long)(v >> shift), suffix[i]);
            return buf;
        }
    }
    snprintf(buf, cap, "%llu", (unsigned long long)v);
    return buf;
}

/* A SIZE flag value in [min, max], with the same one-range message. */
static int size_arg(const char *name, const char *v, uint64_t min, uint64_t max, const char *why,
                    uint64_t *out)
{
    char lo[32], hi[32];
    if (parse_size(v, out) || *out < min || *out > max)
        return usage_error("invalid %s '%s' (expected a SIZE in %s..%s%s)", name, v,
                           size_text(min, lo, sizeof lo), size_text(max, hi, sizeof hi),
                           why ? why : "");
    return 0;
}

/* One option; returns 0, 2 (usage error) or -1 (exit 0: help/version done). */
static int apply_opt(struct options *o, int c, const char *v)
{
    switch (c) {
    case OPT_LISTEN: {
        char host[256], err[128];
        uint16_t port;
        if (net_parse_addr(v, host, sizeof host, &port, err, sizeof err))
            return usage_error("invalid --listen '%s': %s", v, err);
        o->listen = v;
        return 0;
    }
    case OPT_SEGMENT:
        if (kvc_name_check(v))
            return usage_error("invalid --segment '%s': %s", v, kvc_last_error());
        o->segment = v;
        return 0;
    case OPT_FRESH: o->fresh = 1; return 0;
    case OPT_FORCE_FRESH: o->fresh = 2; return 0;
    case OPT_WORLD:
        return count_arg("--world-size", v, KVC_ROOM_MAX_PARTICIPANTS,
                         ": a bootstrap room holds at most 32 participants, and rooms of the "
                         "whole TP group must open",
                         &o->world_size);
    /* The segment's own limits (kvcoord.h: kvc_open refuses more). */
    case OPT_RANKS: return count_arg("--max-ranks", v, KVC_LIMIT_MAX_RANKS, NULL, &o->max_ranks);
    case OPT_INFO:
        return size_arg("--max-info-bytes", v, KVC_LIMIT_INFO_MIN, KVC_LIMIT_ARENA_MAX / 2,
                        ", and at most half of --arena-bytes", &o->max_info_bytes);
    case OPT_ARENA:
        return size_arg("--arena-bytes", v, KVC_LIMIT_ARENA_MIN, KVC_LIMIT_ARENA_MAX, NULL,
                        &o->arena_bytes);
    case OPT_ROOMS: return count_arg("--max-rooms", v, KVC_LIMIT_MAX_ROOMS, NULL, &o->max_rooms);
    case OPT_PROCS: return count_arg("--max-procs", v, KVC_LIMIT_MAX_PROCS, NULL, &o->max_procs);
    case OPT_TTL: return count_arg("--room-ttl", v, 4000000, NULL, &o->room_ttl_s);
    case OPT_ETCD:
        if (strncmp(v, "http://", 7) && strncmp(v, "https://", 8))
            return usage_error("invalid --etcd '%s' (expected http://HOST:PORT[,...])", v);
        o->etcd = v;
        return 0;
    case OPT_CLUSTER:
    case OPT_NODE:
        if (!cluster_name_ok(v))
            return usage_error("invalid %s '%s' (1..%d bytes of [A-Za-z0-9._-])",
                               c == OPT_NODE ? "--node" : "--cluster", v, CLUSTER_NAME_MAX);
        *(c == OPT_NODE ? &o->node : &o->cluster) = v;
        return 0;
    case OPT_ETCD_TTL: return count_arg("--etcd-ttl", v, 3600, NULL, &o->etcd_ttl_s);
    case OPT_ADVERTISE: o->advertise = v; return 0;
    case OPT_ETCD_USER: o->etcd_user = v; return 0;
    case OPT_ETCD_PW: o->etcd_password_file = v; return 0;
    case OPT_ETCD_CA: o->etcd_cacert = v; return 0;
    case OPT_ETCD_CERT: o->etcd_cert = v; return 0;
    case OPT_ETCD_KEY: o->etcd_key = v; return 0;
    case OPT_BODY: return size_arg("--max-body-bytes", v, 1, SIZE_MAX / 2, NULL, &o->max_body);
    case OPT_HEAD:
        return size_arg("--max-header-bytes", v, MIN_HEAD_LIMIT, MAX_HEAD_LIMIT,
                        ": less is too small for any request real clients send, more is "
                        "past http-parser's bound on a head",
                        &o->max_head);
    case OPT_CONNS: return count_arg("--max-conns", v, 65536, NULL, &o->max_conns);
    case OPT_CONNS_PER_PEER: {
        uint64_t n;
        if (parse_uint(v, 65536, &n))
            return usage_error("invalid --max-conns-per-peer '%s' (expected 0..65536)", v);
        o->max_conns_per_peer = (uint32_t)n;
        return 0;
    }
    case OPT_HTIMEOUT: return count_arg("--header-timeout", v, 86400, NULL, &o->header_timeout_s);
    case OPT_ITIMEOUT: return count_arg("--idle-timeout", v, 86400, NULL, &o->idle_timeout_s);
    case OPT_LOCK_TIMEOUT:
        return count_arg("--lock-timeout", v, 3600000, NULL, &o->lock_timeout_ms);
    case OPT_MAX_BUFFERED:
        return size_arg("--max-buffered-bytes", v, 1, SIZE_MAX / 2, NULL, &o->max_buffered);
    case OPT_MAX_ANSWER:
        return size_arg("--max-answer-bytes", v, 1 << 20, SIZE_MAX / 2, NULL, &o->max_answer);
    case OPT_BODY_TIMEOUT: return count_arg("--body-timeout", v, 86400, NULL, &o->body_timeout_s);
    case OPT_PD_INTERVAL:
        return count_arg("--pd-room-interval", v, 86400, NULL, &o->pd_room_interval_s);
    case OPT_BIND_RETRY: {
        uint64_t n;
        if (parse_uint(v, 3600, &n))
            return usage_error("invalid --bind-retry '%s' (expected seconds in 0..3600)", v);
        o->bind_retry_s = (uint32_t)n;
        return 0;
    }
    case OPT_LOG:
        if (log_parse_level(v, &o->log_level))
            return usage_error("invalid --log-level '%s' (expected debug, info, warn or "
                               "error)",
                               v);
        return 0;
    case OPT_AUTH:
        if (!*v)
            return usage_error("invalid --auth-token-file '' (expected a file name)");
        o->auth_file = v;
        return 0;
    case 'V':
        printf("kvcoordd %s (segment layout version %u)\n", KVC_VERSION, KVC_LAYOUT_VERSION);
        return -1;
    case 'h': usage(stdout); return -1;
    default: return usage_error("unknown option");
    }
}

/* Options each valid alone that cannot work: refused with the reason
 * (exit 2) rather than accepted and failing every request later. */
static int check_options(const struct options *o)
{
    if (o->world_size > o->max_ranks)
        return usage_error("--world-size %u is above --max-ranks %u", o->world_size, o->max_ranks);
    if (o->max_buffered < o->max_body)
        return usage_error("--max-buffered-bytes %llu is below --max-body-bytes %llu: a body "
                           "of the largest size allowed could never be received",
                           (unsigned long long)o->max_buffered, (unsigned long long)o->max_body);
    if (o->max_info_bytes > o->arena_bytes / 2)
        return usage_error("--max-info-bytes %llu is above half of --arena-bytes %llu: a "
                           "re-registration holds a rank's old and new info at once",
                           (unsigned long long)o->max_info_bytes,
                           (unsigned long long)o->arena_bytes);
    return 0;
}

/* Returns 0 to run, else the exit status. */
int options_parse(int argc, char **argv, struct options *o)
{
    kvc_options lib;
    kvc_options_init(&lib);
    *o = (struct options){.listen = DEFAULT_LISTEN,
                          .world_size = lib.world_size,
                          .max_ranks = lib.max_ranks,
                          .max_info_bytes = lib.max_info_bytes,
                          .arena_bytes = lib.arena_bytes,
                          .max_rooms = lib.max_rooms,
                          .max_procs = lib.max_procs,
                          .room_ttl_s = lib.room_ttl_ms / 1000,
                          .cluster = "kvcoord",
                          .etcd_ttl_s = 10,
                          .max_body = 64ull << 20,
                          .max_head = 64 << 10,
                          .max_conns = 4096,
                          .header_timeout_s = 10,
                          .idle_timeout_s = 60,
                          .bind_retry_s = 5,
                          .lock_timeout_ms = lib.lock_timeout_ms,
                          .max_buffered = 256ull << 20,
                          .max_answer = 256ull << 20,
                          .body_timeout_s = 60,
                          .pd_room_interval_s = pd_interval_default(),
                          .log_level = LOG_INFO};
    opterr = 0; /* our own messages */
    int c, li = -1;
    while ((c = getopt_long(argc, argv, ":Vh", long_opts, &li)) != -1) {
        if (c == ':')
            return usage_error("option '%s' needs a value", argv[optind - 1]);
        if (c == '?')
            return usage_error("unknown option '%s'", argv[optind - 1]);
        /* "--listen --segment x": getopt takes the next option as the value;
           a value starting with "--" in a separate argument is a missing value
           ("--listen=--x" still passes it) */
        if (optarg && optarg == argv[optind - 1] && !strncmp(optarg, "--", 2) && li >= 0)
            return usage_error("option '--%s' needs a value ('%s' follows it)", long_opts[li].name,
                               optarg);
        li = -1;
        int rc = apply_opt(o, c, optarg);
        if (rc)
            return rc < 0 ? -1 : rc;
        if (c >= OPT_LISTEN && c - OPT_LISTEN < 64)
            o->given |= 1ull << (c - OPT_LISTEN);
    }
    if (optind < argc)
        return usage_error("unexpected argument '%s'", argv[optind]);
    return check_options(o);
}
