/*
 * kvcoordd.c - the node coordinator daemon: parse flags, open the segment,
 * serve HTTP until SIGINT/SIGTERM.  The server itself is http_server.c.
 */
#include <dirent.h>
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"
#include "auth.h"
#include "cluster.h"
#include "http_server.h"
#include "inspect.h"
#include "kvcoord/kvcoord.h"
#include "log.h"
#include "metrics.h"
#include "net.h"
#include "query.h"
#include "seg_watch.h"

#define DEFAULT_LISTEN "127.0.0.1:6789"
#define MAX_HEAD_LIMIT (80 * 1024) /* http-parser's own bound on a head */
#define MIN_HEAD_LIMIT 1024        /* smaller refuses real clients' requests */

struct options {
    const char *listen;
    const char *segment;   /* NULL: kvcoord-<port> */
    const char *auth_file; /* --auth-token-file; NULL: KVCOORD_AUTH_TOKEN or none */
    int fresh;             /* 1 --fresh, 2 --force-fresh */
    uint32_t world_size, max_ranks, max_rooms, max_procs, room_ttl_s;
    uint64_t max_info_bytes, arena_bytes, max_body, max_head;
    uint32_t max_conns;
    uint32_t header_timeout_s, idle_timeout_s;
    uint32_t bind_retry_s; /* how long EADDRINUSE is retried at start */
    uint32_t lock_timeout_ms;
    uint64_t max_buffered;   /* request bytes buffered by all connections together */
    uint32_t body_timeout_s; /* a whole body must arrive within this */
    uint64_t max_answer;     /* answer bytes all connections together may hold unsent */
    uint64_t given;          /* bit (c - OPT_LISTEN) for each option given */
    enum log_level log_level;
    /* cluster view: off without --etcd */
    const char *etcd, *cluster, *node, *advertise;
    const char *etcd_user, *etcd_password_file, *etcd_cacert, *etcd_cert, *etcd_key;
    uint32_t etcd_ttl_s;
};

static void usage(FILE *f)
{
    fprintf(f, "Usage: kvcoordd [OPTION]...\n"
               "\n"
               "kvcoordd serves a node's kvcoord segment (the rank table of transfer-engine\n"
               "info) over HTTP with the API of sglang's engine-info bootstrap server:\n"
               "PUT /register_transfer_engine_info, GET /get_transfer_engine_info?rank=N,\n"
               "GET /health, plus GET /ranks, DELETE /transfer_engine_info?rank=N, the\n"
               "wait_ms long-poll, GET /rooms/ROOM, PUT /rooms/ROOM/failure and GET /failures\n"
               "and GET /metrics (Prometheus; see docs/http-api.md and docs/operations.md).\n"
               "Co-located TP workers attach to the same segment\n"
               "through libkvcoord; kvcoordd watches each attached process and, when one\n"
               "dies, fails its rooms and withdraws the ranks it registered.  It logs one\n"
               "line per event on stderr and says \"listening addr=... segment=...\" once it\n"
               "accepts connections.\n"
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
               "                         new segment (default 600)\n"
               "  --max-body-bytes SIZE  largest request body; more gets 413 (default 64M)\n"
               "  --max-header-bytes SIZE\n"
               "                         largest request line + headers; more gets 431\n"
               "                         (default 64K; 1K..80K)\n"
               "  --max-conns N          connections served at once (default 4096, at most\n"
               "                         65536); at the cap, connections that waited 250 ms\n"
               "                         or more for a request are closed to make room, and\n"
               "                         with none to close a new one is answered 503\n"
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
               "  --bind-retry SECS      while the port is still taken (the listening socket of\n"
               "                         a daemon killed a moment ago lingers for a few tens\n"
               "                         of milliseconds), retry binding for up to SECS\n"
               "                         (default 5; 0: fail at once)\n"
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

enum {
    OPT_LISTEN = 256,
    OPT_SEGMENT,
    OPT_FRESH,
    OPT_FORCE_FRESH,
    OPT_WORLD,
    OPT_RANKS,
    OPT_INFO,
    OPT_ARENA,
    OPT_BODY,
    OPT_HEAD,
    OPT_CONNS,
    OPT_HTIMEOUT,
    OPT_ITIMEOUT,
    OPT_LOG,
    OPT_AUTH,
    OPT_ROOMS,
    OPT_PROCS,
    OPT_TTL,
    OPT_BIND_RETRY,
    OPT_LOCK_TIMEOUT,
    OPT_MAX_BUFFERED,
    OPT_BODY_TIMEOUT,
    OPT_ETCD,
    OPT_CLUSTER,
    OPT_NODE,
    OPT_ETCD_TTL,
    OPT_ADVERTISE,
    OPT_ETCD_USER,
    OPT_ETCD_PW,
    OPT_ETCD_CA,
    OPT_ETCD_CERT,
    OPT_ETCD_KEY,
    OPT_MAX_ANSWER
};

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
    case OPT_HTIMEOUT: return count_arg("--header-timeout", v, 86400, NULL, &o->header_timeout_s);
    case OPT_ITIMEOUT: return count_arg("--idle-timeout", v, 86400, NULL, &o->idle_timeout_s);
    case OPT_LOCK_TIMEOUT:
        return count_arg("--lock-timeout", v, 3600000, NULL, &o->lock_timeout_ms);
    case OPT_MAX_BUFFERED:
        return size_arg("--max-buffered-bytes", v, 1, SIZE_MAX / 2, NULL, &o->max_buffered);
    case OPT_MAX_ANSWER:
        return size_arg("--max-answer-bytes", v, 1 << 20, SIZE_MAX / 2, NULL, &o->max_answer);
    case OPT_BODY_TIMEOUT: return count_arg("--body-timeout", v, 86400, NULL, &o->body_timeout_s);
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

#define GIVEN(o, opt) (((o)->given >> ((opt)-OPT_LISTEN)) & 1)

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
static int parse_args(int argc, char **argv, struct options *o)
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

/* SIGINT/SIGTERM/SIGHUP are blocked in every thread and read from a
 * signalfd on the ring; SIGPIPE is ignored (a client closing early is an EPIPE, not a
 * death).  Returns the signalfd or -1. */
static int setup_signals(void)
{
    sigset_t mask;
    signal(SIGPIPE, SIG_IGN);
    sigemptyset(&mask);
    sigaddset(&mask, SIGINT);
    sigaddset(&mask, SIGTERM);
    sigaddset(&mask, SIGHUP);
    if (sigprocmask(SIG_BLOCK, &mask, NULL))
        return -1;
    return signalfd(-1, &mask, SFD_CLOEXEC);
}

/* Each connection is a descriptor: raise the soft limit toward the hard one. */
static void raise_nofile(uint32_t max_conns)
{
    struct rlimit rl;
    rlim_t want = (rlim_t)max_conns + 64;
    if (getrlimit(RLIMIT_NOFILE, &rl) || rl.rlim_cur >= want)
        return;
    rl.rlim_cur = rl.rlim_max == RLIM_INFINITY || rl.rlim_max >= want ? want : rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
    if (rl.rlim_cur < want)
        log_event(LOG_WARN, "nofile_limit",
                  "limit=%llu max_conns=%u "
                  "note=\"connections beyond the limit wait in the listen backlog\"",
                  (unsigned long long)rl.rlim_cur, max_conns);
}

/* pid of another live kvcoordd attached to seg, else 0: two daemons on one
 * segment would both reap, sweep and answer for it. */
static int32_t live_daemon(kvc_segment *seg)
{
    kvc_proc_info p[256];
    size_t n = 0;
    if (kvc_proc_list(seg, p, 256, &n) != KVC_OK)
        return 0;
    for (size_t i = 0; i < n && i < 256; i++)
        if (p[i].role == KVC_ROLE_DAEMON && p[i].alive && p[i].pid != (int32_t)getpid())
            return p[i].pid;
    return 0;
}

/* 1 if /proc/pid/comm says kvcoordd. */
static int is_kvcoordd(int32_t pid)
{
    char path[64], comm[32] = "";
    snprintf(path, sizeof path, "/proc/%d/comm", (int)pid);
    FILE *f = fopen(path, "re");
    if (!f)
        return 0;
    int yes = fgets(comm, sizeof comm, f) && !strcmp(comm, "kvcoordd\n");
    fclose(f);
    return yes;
}

/* pid of another kvcoordd that maps the file path (inode ino), else 0:
 * found from the process table (/proc/PID/maps), so that it works for a
 * segment of any layout version, whose own process table cannot be read. */
static int32_t daemon_mapping(const char *path, unsigned long long ino)
{
    DIR *d = opendir("/proc");
    if (!d)
        return 0;
    int32_t found = 0;
    struct dirent *de;
    while (!found && (de = readdir(d))) {
        char *end;
        long pid = strtol(de->d_name, &end, 10);
        if (*end || pid <= 0 || pid == (long)getpid() || !is_kvcoordd((int32_t)pid))
            continue;
        char maps[64], line[4096 + 128], file[4096];
        snprintf(maps, sizeof maps, "/proc/%ld/maps", pid);
        FILE *f = fopen(maps, "re");
        if (!f)
            continue;
        while (!found && fgets(line, sizeof line, f)) {
            unsigned long long inode;
            if (sscanf(line, "%*s %*s %*s %*s %llu %4095s", &inode, file) == 2 && inode == ino &&
                !strcmp(file, path))
                found = (int32_t)pid;
        }
        fclose(f);
    }
    closedir(d);
    return found;
}

/* A segment of another layout version is left alone while a live process
 * serves it: its creator (the header's stable prefix, the same in every
 * layout version, says who), or a kvcoordd that maps it.  Returns that
 * pid (logged at error), else 0. */
static int32_t other_version_served(const char *name, const char *path, const struct stat *st)
{
    kvc_raw_header h;
    int32_t pid = 0;
    const char *who = "another kvcoordd";
    if (kvc__header_read(name, &h) == KVC_OK && h.magic_ok && h.creator_alive) {
        pid = h.creator_pid;
        if (!is_kvcoordd(pid))
            who = "its creator";
    } else if (!(pid = daemon_mapping(path, (unsigned long long)st->st_ino))) {
        return 0;
    }
    log_event(LOG_ERROR, "segment_in_use",
              "segment=%s pid=%d layout_version=%u this_build=%u err=\"%s (pid %d) serves "
              "this segment, of another layout version: stop it first, or use another "
              "--segment\"",
              name, (int)pid, h.has_prefix ? h.layout_version : 0u, (unsigned)KVC_LAYOUT_VERSION,
              who, (int)pid);
    return pid;
}

/* A segment file that exists but is not a valid segment (truncated,
 * foreign, another layout version nobody serves any more...) would be
 * replaced by an empty one: move it aside instead, for kvcoord-diag, and
 * say so at error.  A missing or valid one is left alone.  Returns -1
 * (logged) when it is of another layout version and a live process serves
 * it: it must be neither moved nor replaced. */
static int move_aside_invalid(const char *name)
{
    kvc_options lib;
    kvc_options_init(&lib);
    lib.name = name;
    lib.mode = KVC_OPEN_ATTACH;
    lib.role = KVC_ROLE_CLIENT;
    kvc_segment *seg = NULL;
    kvc_err e = kvc_open(&lib, &seg);
    if (e == KVC_OK) {
        kvc_close(seg);
        return 0;
    }
    if (e != KVC_E_CORRUPT && e != KVC_E_VERSION)
        return 0; /* absent, or in use: kvc_open(CREATE) says what to do */
    char why[512], path[KVC_NAME_MAX + 16], aside[KVC_NAME_MAX + 64];
    snprintf(why, sizeof why, "%s", kvc_last_error());
    snprintf(path, sizeof path, "/dev/shm/%s", name);
    struct stat st;
    if (lstat(path, &st))
        return 0;
    if (e == KVC_E_VERSION && other_version_served(name, path, &st))
        return -1;
    time_t now = time(NULL);
    struct tm tm;
    gmtime_r(&now, &tm);
    char stamp[32];
    strftime(stamp, sizeof stamp, "%Y%m%dT%H%M%SZ", &tm);
    snprintf(aside, sizeof aside, "/dev/shm/%s.invalid-%s", name, stamp);
    if (rename(path, aside)) {
        log_event(LOG_ERROR, "segment_invalid",
                  "segment=%s bytes=%lld reason=\"%s\" err=\"could not move it aside to %s: "
                  "%s\" note=\"it will be replaced by an empty segment\"",
                  name, (long long)st.st_size, why, aside, strerror(errno));
        return 0;
    }
    log_event(
        LOG_ERROR, "segment_moved_aside",
        "segment=%s to=%s bytes=%lld mode=%04o reason=\"%s\" lost=\"every registration, "
        "room and failure record it held (read it with kvcoord-diag --segment %s.invalid-%s)\"",
        name, aside, (long long)st.st_size, (unsigned)(st.st_mode & 07777), why, name, stamp);
    return 0;
}

/* A reused segment keeps its own capacities: say so for each one given on
 * the command line that differs. */
static void warn_capacities(const struct options *o, const kvc_segment_info *si)
{
    struct {
        int opt;
        const char *flag;
        uint64_t want, have;
    } caps[] = {
        {OPT_WORLD, "--world-size", o->world_size, si->world_size},
        {OPT_RANKS, "--max-ranks", o->max_ranks, si->max_ranks},
        {OPT_INFO, "--max-info-bytes", o->max_info_bytes, si->max_info_bytes},
        {OPT_ARENA, "--arena-bytes", o->arena_bytes, si->arena_bytes},
        {OPT_ROOMS, "--max-rooms", o->max_rooms, si->max_rooms},
        {OPT_PROCS, "--max-procs", o->max_procs, si->max_procs},
        {OPT_TTL, "--room-ttl", (uint64_t)o->room_ttl_s * 1000, si->room_ttl_ms},
    };
    for (size_t i = 0; i < sizeof caps / sizeof caps[0]; i++) {
        if (!GIVEN(o, caps[i].opt) || caps[i].want == caps[i].have)
            continue;
        const char *unit = caps[i].opt == OPT_TTL ? "ms" : "";
        char given[32], have[32];
        snprintf(given, sizeof given, "%llu%s", (unsigned long long)caps[i].want, unit);
        snprintf(have, sizeof have, "%llu%s", (unsigned long long)caps[i].have, unit);
        log_event(LOG_WARN, "capacity_ignored",
                  "option=%s given=%s segment=%s note=\"the existing segment keeps its own; "
                  "--fresh discards it and applies the options\"",
                  caps[i].flag, given, have);
    }
}

static kvc_segment *open_segment(const struct options *o, const char *name)
{
    if (!o->fresh && move_aside_invalid(name))
        return NULL;
    kvc_options lib;
    kvc_options_init(&lib);
    lib.name = name;
    lib.mode = o->fresh == 2 ? KVC_OPEN_FRESH_FORCE : o->fresh ? KVC_OPEN_FRESH : KVC_OPEN_CREATE;
    lib.role = KVC_ROLE_DAEMON;
    lib.world_size = o->world_size;
    lib.max_ranks = o->max_ranks;
    lib.max_info_bytes = o->max_info_bytes;
    lib.arena_bytes = o->arena_bytes;
    lib.max_rooms = o->max_rooms;
    lib.max_procs = o->max_procs;
    lib.room_ttl_ms = o->room_ttl_s * 1000;
    lib.lock_timeout_ms = o->lock_timeout_ms;
    kvc_segment *seg = NULL;
    kvc_segment_info si;
    if (kvc_open(&lib, &seg)) {
        log_event(LOG_ERROR, "segment_open_failed", "segment=%s err=\"%s\"", name,
                  kvc_last_error());
        return NULL;
    }
    int32_t other = live_daemon(seg);
    if (other) {
        log_event(LOG_ERROR, "segment_in_use",
                  "segment=%s pid=%d err=\"another kvcoordd (pid "
                  "%d) serves this segment: stop it first, or use another --segment\"",
                  name, (int)other, (int)other);
        kvc_close(seg);
        return NULL;
    }
    if (kvc_segment_stat(seg, &si) == KVC_OK && si.creator_pid != (int32_t)getpid())
        warn_capacities(o, &si);
    if (kvc_segment_stat(seg, &si) == KVC_OK)
        log_event(LOG_INFO, "segment",
                  "name=%s layout_version=%u max_ranks=%u "
                  "world_size=%u max_info_bytes=%llu ranks_registered=%u "
                  "lock_recoveries=%llu failures_total=%llu fresh=%d",
                  name, si.layout_version, si.max_ranks, si.world_size,
                  (unsigned long long)si.max_info_bytes, si.ranks_registered,
                  (unsigned long long)si.lock_recoveries, (unsigned long long)si.failures_total,
                  o->fresh);
    return seg;
}

/* A listen address only this host can reach (no token needed there). */
static int is_loopback(const char *listen)
{
    char host[256], err[128];
    uint16_t port;
    if (net_parse_addr(listen, host, sizeof host, &port, err, sizeof err))
        return 0;
    return !strncmp(host, "127.", 4) || !strcmp(host, "::1") || !strcmp(host, "localhost");
}

/* The token (file, else environment); logs where it came from.  Returns 0
 * or -1 (logged). */
static int setup_auth(struct auth *auth, const struct options *o)
{
    char err[512];
    if (auth_init(auth, o->auth_file, getenv(AUTH_ENV), err, sizeof err)) {
        if (o->auth_file) /* the reason first: a long path cannot cut it off */
            log_event(LOG_ERROR, "auth_failed", "err=\"%s\" file=%s", err, o->auth_file);
        else
            log_event(LOG_ERROR, "auth_failed", "err=\"%s\"", err);
        return -1;
    }
    unsetenv(AUTH_ENV); /* out of /proc/PID/environ of anything started later */
    log_event(LOG_INFO, "auth", "source=%s", auth_source_name(auth->source));
    if (!auth_enabled(auth) && !is_loopback(o->listen))
        log_event(LOG_WARN, "auth_off",
                  "addr=%s note=\"mutating requests need no token; "
                  "give --auth-token-file\"",
                  o->listen);
    else if (auth_enabled(auth) && auth->token_len == 0)
        log_event(LOG_WARN, "auth_empty_token",
                  "note=\"every mutating request will be "
                  "refused\"");
    return 0;
}

/* ---- SIGBUS guard ----------------------------------------------------------
 * The segment's file truncated under the daemon makes the next access past
 * its new end raise SIGBUS.  The segment file watch (seg_watch.h) notices
 * within a second; an access before that lands here: one error line (made
 * with async-signal-safe calls only) and exit 1, never a silent death by
 * signal.  The daemon only: the library installs no handler. */

static char sigbus_line[512];
static size_t sigbus_prefix;

static size_t put_dec(char *p, uint64_t v, int width)
{
    char d[24];
    int n = 0;
    do
        d[n++] = (char)('0' + v % 10), v /= 10;
    while (v);
    while (n < width)
        d[n++] = '0';
    for (int i = 0; i < n; i++)
        p[i] = d[n - 1 - i];
    return (size_t)n;
}

static void on_sigbus(int sig, siginfo_t *si, void *ctx)
{
    (void)sig, (void)ctx;
    char line[700], *p = line;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    int64_t t = ts.tv_sec, days = t / 86400, rem = t % 86400;
    /* days since 1970-01-01 to a civil date (proleptic Gregorian) */
    int64_t z = days + 719468, era = z / 146097, doe = z - era * 146097;
    int64_t yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    int64_t doy = doe - (365 * yoe + yoe / 4 - yoe / 100), mp = (5 * doy + 2) / 153;
    int64_t day = doy - (153 * mp + 2) / 5 + 1, month = mp < 10 ? mp + 3 : mp - 9;
    int64_t year = yoe + era * 400 + (month <= 2);
    p += put_dec(p, (uint64_t)year, 4), *p++ = '-';
    p += put_dec(p, (uint64_t)month, 2), *p++ = '-';
    p += put_dec(p, (uint64_t)day, 2), *p++ = 'T';
    p += put_dec(p, (uint64_t)(rem / 3600), 2), *p++ = ':';
    p += put_dec(p, (uint64_t)(rem / 60 % 60), 2), *p++ = ':';
    p += put_dec(p, (uint64_t)(rem % 60), 2), *p++ = '.';
    p += put_dec(p, (uint64_t)(ts.tv_nsec / 1000000), 3), *p++ = 'Z';
    memcpy(p, sigbus_line, sigbus_prefix), p += sigbus_prefix;
    static const char hex[] = "0123456789abcdef";
    uintptr_t a = (uintptr_t)si->si_addr;
    *p++ = '0', *p++ = 'x';
    for (int i = (int)sizeof a * 2 - 1; i >= 0; i--)
        *p++ = hex[(a >> (i * 4)) & 15];
    static const char tail[] = " action=exit status=1\n";
    memcpy(p, tail, sizeof tail - 1), p += sizeof tail - 1;
    ssize_t n = write(STDERR_FILENO, line, (size_t)(p - line));
    (void)n;
    _exit(1);
}

static void install_sigbus_guard(const char *name)
{
    int n = snprintf(sigbus_line, sizeof sigbus_line,
                     " error segment_sigbus segment=%s err=\"the segment file /dev/shm/%s is "
                     "shorter than its mapping (truncated under the daemon); restart the workers "
                     "too\" addr=",
                     name, name);
    sigbus_prefix = n > 0 && (size_t)n < sizeof sigbus_line ? (size_t)n : 0;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_sigbus;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGBUS, &sa, NULL);
}

/* The listening socket: the supervisor's (socket activation), else bound
 * to --listen.  A port still held by the listening socket of a daemon that
 * was just killed (the kernel closes it a few tens of ms after the process
 * is gone) is retried every 50 ms for --bind-retry seconds, with one log
 * line.  Returns the socket, or -1 with err set. */
static int open_listener(const struct options *o, char *bound, size_t boundcap, uint16_t *port,
                         char *err, size_t errcap)
{
    int fd = net_inherited(bound, boundcap, port, err, errcap);
    if (fd >= 0) {
        log_event(LOG_INFO, "socket_activation", "addr=%s fd=%d", bound, fd);
        return fd;
    }
    if (fd == -2)
        return -1;
    uint64_t deadline = kvc__mono_ms() + (uint64_t)o->bind_retry_s * 1000;
    unsigned tries = 0;
    for (;;) {
        fd = net_listen(o->listen, bound, boundcap, port, err, errcap);
        if (fd >= 0 || errno != EADDRINUSE || kvc__mono_ms() >= deadline)
            break;
        if (tries++ == 0)
            log_event(LOG_WARN, "listen_retry",
                      "addr=%s err=\"%s\" retry_s=%u note=\"retrying while the port is "
                      "taken (a daemon killed a moment ago frees it shortly)\"",
                      o->listen, err, o->bind_retry_s);
        struct timespec pause = {0, 50 * 1000000L};
        nanosleep(&pause, NULL);
    }
    if (fd >= 0 && tries)
        log_event(LOG_INFO, "listen_bound", "addr=%s retries=%u", bound, tries);
    return fd;
}

/* The host name as a node name: the bytes [A-Za-z0-9._-] of it. */
static void default_node(char *out, size_t cap)
{
    char host[256] = "";
    gethostname(host, sizeof host - 1);
    size_t n = 0;
    for (const char *p = host; *p && n + 1 < cap && n < 63; p++)
        if ((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
            *p == '.' || *p == '_' || *p == '-')
            out[n++] = *p;
    out[n] = '\0';
    if (!n)
        snprintf(out, cap, "node");
}

/* Start the cluster view (--etcd).  Returns 0, or -1 (logged). */
static int start_cluster(const struct options *o, kvc_segment *seg, const char *bound,
                         struct cluster **out)
{
    char node[64], url[300], err[512];
    if (o->node)
        snprintf(node, sizeof node, "%s", o->node);
    else
        default_node(node, sizeof node);
    if (o->advertise) {
        snprintf(url, sizeof url, "%s", o->advertise);
    } else {
        char host[256], perr[128];
        uint16_t port = 0;
        net_parse_addr(bound, host, sizeof host, &port, perr, sizeof perr);
        if (!strcmp(host, "0.0.0.0") || !strcmp(host, "::")) {
            gethostname(host, sizeof host - 1);
            host[sizeof host - 1] = '\0';
        }
        snprintf(url, sizeof url, strchr(host, ':') ? "http://[%s]:%u" : "http://%s:%u", host,
                 (unsigned)port);
    }
    struct cluster_conf cc = {
        .endpoints = o->etcd,
        .cluster = o->cluster,
        .node = node,
        .url = url,
        .ttl_s = o->etcd_ttl_s,
        .user = o->etcd_user,
        .password_file = o->etcd_password_file,
        .cacert = o->etcd_cacert,
        .cert = o->etcd_cert,
        .key = o->etcd_key,
        .seg = seg,
    };
    if (cluster_start(&cc, out, err, sizeof err)) {
        log_event(LOG_ERROR, "cluster_failed", "err=\"%s\"", err);
        return -1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    struct options o;
    int rc = parse_args(argc, argv, &o);
    if (rc)
        return rc < 0 ? 0 : rc;
    log_set_level(o.log_level);
    int sfd = setup_signals();
    if (sfd < 0) {
        log_event(LOG_ERROR, "signal_setup_failed", "err=\"%s\"", strerror(errno));
        return 1;
    }
    raise_nofile(o.max_conns);
    static struct auth auth;
    if (setup_auth(&auth, &o))
        return 1;
    struct metrics *metrics = metrics_create();
    if (!metrics) {
        log_event(LOG_ERROR, "metrics_failed", "err=\"out of memory\"");
        return 1;
    }
    char bound[128], err[256], name[KVC_NAME_MAX + 1];
    uint16_t port;
    int lfd = open_listener(&o, bound, sizeof bound, &port, err, sizeof err);
    if (lfd < 0) {
        log_event(LOG_ERROR, "listen_failed", "addr=%s err=\"%s\"", o.listen, err);
        auth_clear(&auth);
        metrics_destroy(metrics);
        return 1;
    }
    if (o.segment)
        snprintf(name, sizeof name, "%s", o.segment);
    else
        kvc_name_for_port(port, name, sizeof name);
    kvc_segment *seg = open_segment(&o, name);
    if (!seg) {
        close(lfd);
        auth_clear(&auth);
        metrics_destroy(metrics);
        return 1;
    }
    struct seg_watch *file = NULL;
    if (seg_watch_open(&file, seg, name, err, sizeof err)) {
        log_event(LOG_ERROR, "segment_watch_failed", "segment=%s err=\"%s\"", name, err);
        kvc_close(seg);
        close(lfd);
        auth_clear(&auth);
        metrics_destroy(metrics);
        return 1;
    }
    install_sigbus_guard(name);
    struct cluster *cluster = NULL;
    if (o.etcd && start_cluster(&o, seg, bound, &cluster)) {
        seg_watch_close(file);
        kvc_close(seg);
        close(lfd);
        auth_clear(&auth);
        metrics_destroy(metrics);
        return 1;
    }
    struct server_config cfg = {
        .listen_fd = lfd,
        .listen_addr = bound,
        .segment_name = name,
        .signal_fd = sfd,
        .max_conns = o.max_conns,
        .max_head_bytes = o.max_head,
        .max_body_bytes = o.max_body,
        .header_timeout_ms = o.header_timeout_s * 1000,
        .idle_timeout_ms = o.idle_timeout_s * 1000,
        .auth = &auth,
        .metrics = metrics,
        .cluster = cluster,
        .segment_file = file,
        .max_buffered_bytes = o.max_buffered,
        .body_timeout_ms = o.body_timeout_s * 1000,
        .max_answer_bytes = o.max_answer,
    };
    rc = server_run(&cfg, seg);
    cluster_stop(cluster, 1); /* clean stop: this node's records go at once */
    auth_clear(&auth);
    metrics_destroy(metrics);
    seg_watch_close(file);
    kvc_close(seg);
    close(lfd);
    close(sfd);
    log_event(LOG_INFO, "stopped", "status=%d", rc); /* the last line, after cluster_left */
    return rc;
}
