/*
 * kvcoordd.c - the node coordinator daemon: parse flags, open the segment,
 * serve HTTP until SIGINT/SIGTERM.  The server itself is http_server.c.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
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
#include "kvcoordd_options.h"
#include "log.h"
#include "metrics.h"
#include "net.h"
#include "proc_sockets.h"
#include "query.h"
#include "seg_watch.h"

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
/* Grow this process's descriptor table to its full size now, while it
 * has one thread: the kernel grows the table by doublings as descriptors
 * are allocated, and once other threads share it each growth waits for an
 * RCU grace period (milliseconds on a busy machine).  A first burst of
 * connections, accepted into descriptors 64, 128, 256... would otherwise
 * wait behind five of them; nginx's single-threaded workers never do. */
static void reserve_fd_table(uint32_t max_conns)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) || rl.rlim_cur < 2)
        return;
    /* the connections, as many accepted ones queued, and a margin */
    rlim_t want = 2 * (rlim_t)max_conns + 256;
    rlim_t top = rl.rlim_cur - 1 < want ? rl.rlim_cur - 1 : want;
    int fd = dup2(STDERR_FILENO, (int)top);
    if (fd < 0)
        fd = fcntl(STDERR_FILENO, F_DUPFD_CLOEXEC, (int)top); /* stderr closed: any fd */
    if (fd >= 0)
        close(fd);
}

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
        int given;
        const char *flag;
        uint64_t want, have;
        const char *unit;
    } caps[] = {
        {OPTION_GIVEN(o, world_size), "--world-size", o->world_size, si->world_size, ""},
        {OPTION_GIVEN(o, max_ranks), "--max-ranks", o->max_ranks, si->max_ranks, ""},
        {OPTION_GIVEN(o, max_info_bytes), "--max-info-bytes", o->max_info_bytes, si->max_info_bytes,
         ""},
        {OPTION_GIVEN(o, arena_bytes), "--arena-bytes", o->arena_bytes, si->arena_bytes, ""},
        {OPTION_GIVEN(o, max_rooms), "--max-rooms", o->max_rooms, si->max_rooms, ""},
        {OPTION_GIVEN(o, max_procs), "--max-procs", o->max_procs, si->max_procs, ""},
        {OPTION_GIVEN(o, room_ttl_s), "--room-ttl", (uint64_t)o->room_ttl_s * 1000, si->room_ttl_ms,
         "ms"},
    };
    for (size_t i = 0; i < sizeof caps / sizeof caps[0]; i++) {
        if (!caps[i].given || caps[i].want == caps[i].have)
            continue;
        const char *unit = caps[i].unit;
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

/* Why EADDRINUSE, appended to err: who holds the port.  Returns whether a
 * wait can help by default: the port's socket is held by no process (that
 * of a daemon killed a moment ago, which the kernel closes a few tens of ms
 * after the process is gone), or no socket is listed at all. */
static bool port_taken(uint16_t port, char *err, size_t errcap, struct port_holder *h)
{
    char who[160];
    port_holder_find(port, h);
    port_holder_text(h, who, sizeof who);
    size_t n = strlen(err);
    if (n < errcap)
        snprintf(err + n, errcap - n, "; held by %s", who);
    return !h->socket || (!h->pid && h->saw_all);
}

/* The listening socket: the supervisor's (socket activation), else bound
 * to --listen.  When the port is taken (EADDRINUSE) the error names the
 * holder (proc_sockets.h) and start fails at once if a live process holds
 * it; binding is retried every 50 ms, with one log line, only while no
 * process holds the port's socket (the listening socket of a daemon killed
 * a moment ago lingers a few tens of ms: a restart right after SIGKILL, as
 * systemd's Restart= does, must bind) for up to 5 s, or whoever holds it
 * for --bind-retry seconds when that is given (0: never).  Returns the
 * socket, or -1 with err set. */
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
    bool given = OPTION_GIVEN(o, bind_retry_s);
    uint64_t deadline = kvc__mono_ms() + (uint64_t)o->bind_retry_s * 1000;
    unsigned tries = 0;
    for (;;) {
        fd = net_listen(o->listen, bound, boundcap, port, err, errcap);
        if (fd >= 0 || errno != EADDRINUSE)
            break;
        struct port_holder h;
        bool last = kvc__mono_ms() >= deadline, may_free = true;
        if (tries == 0 || last) /* named in the log line and in the error */
            may_free = port_taken(*port, err, errcap, &h);
        if (!given && !may_free) {
            size_t n = strlen(err);
            snprintf(err + n, errcap - n,
                     ": stop it, or choose another --listen (--bind-retry SECS waits for it "
                     "to let go)");
            break;
        }
        if (last)
            break;
        if (tries++ == 0)
            log_event(LOG_WARN, "listen_retry", "addr=%s err=\"%s\" retry_s=%u note=\"%s\"",
                      o->listen, err, o->bind_retry_s,
                      may_free ? "retrying while the socket of a process that just ended "
                                 "lingers (the kernel frees it shortly)"
                               : "retrying (--bind-retry) until its holder lets go");
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
                         const struct auth *auth, struct cluster **out)
{
    char node[64], url[300], err[512];
    /* The token goes with the failures pushed to peer nodes (cluster.h). */
    static char token[AUTH_TOKEN_MAX + 1];
    if (auth_enabled(auth) && auth->token_len)
        memcpy(token, auth->token, auth->token_len);
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
        .http_token = token[0] ? token : NULL,
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
    int rc = options_parse(argc, argv, &o);
    if (rc)
        return rc < 0 ? 0 : rc;
    log_set_level(o.log_level);
    int sfd = setup_signals();
    if (sfd < 0) {
        log_event(LOG_ERROR, "signal_setup_failed", "err=\"%s\"", strerror(errno));
        return 1;
    }
    raise_nofile(o.max_conns);
    reserve_fd_table(o.max_conns); /* before any thread starts */
    static struct auth auth;
    if (setup_auth(&auth, &o))
        return 1;
    struct metrics *metrics = metrics_create();
    if (!metrics) {
        log_event(LOG_ERROR, "metrics_failed", "err=\"out of memory\"");
        return 1;
    }
    char bound[128], err[512], name[KVC_NAME_MAX + 1];
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
    if (o.etcd && start_cluster(&o, seg, bound, &auth, &cluster)) {
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
        .pd_room_interval_ms = (uint64_t)o.pd_room_interval_s * 1000,
        /* Default: a quarter of the table per remote address, loopback
         * exempt; given, the number applies to every address. */
        .max_conns_per_peer =
            OPTION_GIVEN(&o, max_conns_per_peer) ? o.max_conns_per_peer : (o.max_conns + 3) / 4,
        .peer_cap_loopback = OPTION_GIVEN(&o, max_conns_per_peer),
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
