/*
 * diag_watch.c - `kvcoord-diag watch`: status, ranks and rooms redrawn every
 * interval with a plain ANSI clear, until q, Ctrl-C or SIGTERM.
 *
 * Not a curses application: the terminal is only switched out of canonical
 * mode and echo (signals stay on, so Ctrl-C is SIGINT), keys are read with
 * ppoll() on stdin, and SIGINT/SIGTERM are blocked outside ppoll(), so a
 * signal either ends the wait or is taken by the next one - never lost
 * between a check of the flag and the wait.  Every way out restores the
 * terminal's settings.
 */
#include <errno.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"
#include "diag.h"

static const char watch_help[] =
    "DESCRIPTION\n"
    "  A live view of the segment: the status screen (header, capacities, contents,\n"
    "  verdict), then the ranks and the newest rooms, redrawn every --interval\n"
    "  seconds.  The segment is attached afresh for every frame, so a kvcoordd that\n"
    "  restarts and recreates it is followed, and a segment that disappears is said\n"
    "  to be missing until it is back.\n"
    "\n"
    "  Keys (when stdin is a terminal): q quits, r or space redraws now.  Ctrl-C\n"
    "  (SIGINT) and SIGTERM quit too.  Every way out restores the terminal settings\n"
    "  and exits 0.  When stdout is not a terminal, frames are separated by a line of\n"
    "  dashes instead of clearing the screen.\n"
    "\n"
    "  Like ranks and rooms, watch reads through the library, which recovers a lock\n"
    "  whose owner died when it meets one.\n"
    "\n"
    "OPTIONS\n"
    "  -i, --interval SECONDS   time between frames (default 1; 0.1 to 3600)\n"
    "  -c, --count N            stop after N frames (default 0: until quit)\n"
    "  -n, --limit N            at most N ranks and N rooms per frame (default 16)\n"
    "\n"
    "OUTPUT\n"
    "  Text only (--json is refused: run `status --json` in a loop instead).\n";

struct watch_opts {
    double interval;
    uint64_t count, limit;
    const diag *d;
};

static volatile sig_atomic_t quit_signal;

static void on_signal(int sig) { quit_signal = sig; }

static int watch_opt(void *ctx, int opt, const char *arg)
{
    struct watch_opts *o = ctx;
    char *end;
    switch (opt) {
    case 'i':
        o->interval = strtod(arg, &end);
        if (*end || !isfinite(o->interval) || o->interval < 0.1 || o->interval > 3600)
            return diag_usage_error(o->d, &diag_cmd_watch,
                                    "--interval must be 0.1 to 3600 "
                                    "seconds, not '%s'",
                                    arg);
        return 0;
    case 'c': return diag_parse_u64(o->d, &diag_cmd_watch, "--count", arg, 1u << 30, &o->count);
    case 'n': return diag_parse_u64(o->d, &diag_cmd_watch, "--limit", arg, 1u << 20, &o->limit);
    }
    return -1;
}

/* ---- terminal ---------------------------------------------------------------- */

typedef struct term {
    int raw; /* settings changed: restore them */
    struct termios saved;
    sigset_t waitmask; /* the mask ppoll() waits with */
    sigset_t oldmask;
    struct sigaction old_int, old_term;
} term;

static void term_enter(term *t)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &t->old_int);
    sigaction(SIGTERM, &sa, &t->old_term);
    sigset_t block;
    sigemptyset(&block);
    sigaddset(&block, SIGINT);
    sigaddset(&block, SIGTERM);
    sigprocmask(SIG_BLOCK, &block, &t->oldmask);
    t->waitmask = t->oldmask;
    sigdelset(&t->waitmask, SIGINT);
    sigdelset(&t->waitmask, SIGTERM);
    if (!isatty(STDIN_FILENO) || tcgetattr(STDIN_FILENO, &t->saved) < 0)
        return;
    struct termios raw = t->saved;
    raw.c_lflag &= ~(tcflag_t)(ICANON | ECHO);
    raw.c_cc[VMIN] = 0;
    raw.c_cc[VTIME] = 0;
    t->raw = tcsetattr(STDIN_FILENO, TCSANOW, &raw) == 0;
}

static void term_leave(term *t)
{
    if (t->raw)
        tcsetattr(STDIN_FILENO, TCSANOW, &t->saved);
    t->raw = 0;
    sigaction(SIGINT, &t->old_int, NULL);
    sigaction(SIGTERM, &t->old_term, NULL);
    sigprocmask(SIG_SETMASK, &t->oldmask, NULL);
}

enum key { KEY_NONE, KEY_QUIT, KEY_REDRAW };

/* Wait up to ms for a key or a signal. */
static enum key wait_key(term *t, long ms, int *stdin_open)
{
    struct pollfd pfd = {STDIN_FILENO, POLLIN, 0};
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    int r = ppoll(&pfd, *stdin_open ? 1 : 0, &ts, &t->waitmask);
    if (quit_signal)
        return KEY_QUIT;
    if (r <= 0)
        return KEY_NONE;
    char buf[64];
    ssize_t n = read(STDIN_FILENO, buf, sizeof buf);
    if (n <= 0) {
        *stdin_open = 0; /* EOF (not a terminal): stop watching stdin */
        return KEY_NONE;
    }
    for (ssize_t i = 0; i < n; i++) {
        if (buf[i] == 'q' || buf[i] == 'Q' || buf[i] == 3 /* ^C without ISIG */)
            return KEY_QUIT;
        if (buf[i] == 'r' || buf[i] == ' ')
            return KEY_REDRAW;
    }
    return KEY_NONE;
}

/* ---- frames ------------------------------------------------------------------- */

static void frame(const diag *d, const struct watch_opts *o, int tty, uint64_t n)
{
    char now[40];
    if (tty)
        fputs("\033[H\033[2J", stdout);
    else if (n > 0)
        fputs("----------------------------------------------------------------------\n", stdout);
    printf("kvcoord-diag watch - %s - every %.1fs - q quits, r redraws\n\n",
           diag_time(diag_now_ns(), now, sizeof now), o->interval);
    int rc;
    kvc_segment *seg = diag_open(d, "watch", &rc);
    if (!seg) {
        fflush(stdout);
        return;
    }
    diag_findings f;
    kvc_check_stats st;
    diag_findings_init(&f, 0, 0, 0);
    kvc_severity v = kvc__check(seg, diag_findings_cb, &f, &st);
    diag_status_text(d, seg, &st, v, &f, stdout);
    printf("\nranks\n");
    diag_ranks_table(seg, stdout, (int)o->limit);
    printf("\nrooms (newest first)\n");
    diag_rooms_table(seg, -1, o->limit, stdout);
    kvc__close_reader(seg);
    fflush(stdout);
}

static int watch_loop(const diag *d, const struct watch_opts *o)
{
    term t = {0};
    int tty = isatty(STDOUT_FILENO), stdin_open = 1;
    long ms = (long)(o->interval * 1000 + 0.5);
    term_enter(&t);
    for (uint64_t n = 0; !quit_signal; n++) {
        frame(d, o, tty, n);
        if (o->count && n + 1 >= o->count)
            break;
        enum key k = KEY_NONE;
        /* The interval is a deadline: CLOCK_MONOTONIC, not the clock shown. */
        uint64_t until = kvc__mono_ns() + (uint64_t)ms * 1000000ull;
        while (k == KEY_NONE) {
            uint64_t now = kvc__mono_ns();
            if (now >= until)
                break;
            k = wait_key(&t, (long)((until - now) / 1000000ull) + 1, &stdin_open);
        }
        if (k == KEY_QUIT)
            break;
    }
    term_leave(&t);
    if (tty)
        fputc('\n', stdout);
    return DIAG_EXIT_OK;
}

static int run_watch(diag *d, int argc, char **argv)
{
    static const struct option longopts[] = {{"interval", required_argument, NULL, 'i'},
                                             {"count", required_argument, NULL, 'c'},
                                             {"limit", required_argument, NULL, 'n'},
                                             {0}};
    struct watch_opts o = {.interval = 1.0, .limit = 16, .d = d};
    int rc = diag_parse_exit(
        diag_parse(d, &diag_cmd_watch, argc, argv, "i:c:n:", longopts, watch_opt, &o));
    if (rc >= 0)
        return rc;
    if (optind < argc) {
        diag_usage_error(d, &diag_cmd_watch, "unexpected argument '%s'", argv[optind]);
        return DIAG_EXIT_USAGE;
    }
    if (d->json) {
        diag_usage_error(d, &diag_cmd_watch,
                         "watch has no --json output; run `status --json` "
                         "in a loop instead");
        return DIAG_EXIT_USAGE;
    }
    return watch_loop(d, &o);
}

const diag_cmd diag_cmd_watch = {
    "watch",
    "a refreshing view of status, ranks and rooms (q or Ctrl-C quits)",
    "watch [--interval SECONDS] [--count N] [--limit N]",
    watch_help,
    run_watch,
};
