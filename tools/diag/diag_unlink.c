/*
 * diag_unlink.c - `kvcoord-diag unlink`: remove the segment from /dev/shm
 * after confirmation - also one that cannot be attached to (another layout
 * version, truncated).
 */
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "diag.h"

static const char unlink_help[] =
    "DESCRIPTION\n"
    "  Removes /dev/shm/NAME.  Every registration, room and failure record in it is\n"
    "  lost.  Processes attached keep their mapping until they exit, but no new\n"
    "  process can find it; kvcoordd creates a new, empty segment when it starts.\n"
    "  Works on segments that cannot be attached to (another layout version, a\n"
    "  truncated file), which is the usual reason to use it.\n"
    "\n"
    "  Before removing, unlink says what the segment holds (size, layout version,\n"
    "  creator and whether it runs, ranks registered and live processes attached)\n"
    "  and asks for confirmation on the terminal.  Without a terminal on stdin\n"
    "  (or with --json) it removes nothing unless --yes is given.\n"
    "\n"
    "  A segment whose kvcoordd is running - its creator, or the kvcoordd that\n"
    "  adopted it after the creator ended - is not removed unless\n"
    "  --force is given: that kvcoordd notices its file is gone and exits with\n"
    "  status 1 (no new worker could attach to it), and every worker attached must\n"
    "  be restarted with the next one.  Stop it first.\n"
    "\n"
    "OPTIONS\n"
    "  -y, --yes     do not ask (for scripts)\n"
    "  -f, --force   remove it even though its kvcoordd runs\n"
    "\n"
    "OUTPUT\n"
    "  --json: {\"schema\", \"command\": \"unlink\", \"segment\", \"removed\",\n"
    "  \"header\": {...as in status...}, \"ranks_registered\" (null if unreadable),\n"
    "  \"procs_alive\" (null if unreadable), \"error\" (when not removed)}.\n"
    "\n"
    "  Exit status: 0 removed; 1 not removed: not confirmed (answered no, no\n"
    "  terminal to ask on and no --yes, or --json without --yes) or its kvcoordd\n"
    "  runs and no --force; 2 no such segment or removal failed.\n";

struct unlink_opts {
    int yes, force;
};

static int unlink_opt(void *ctx, int opt, const char *arg)
{
    (void)arg;
    struct unlink_opts *o = ctx;
    if (opt == 'y')
        o->yes = 1;
    else if (opt == 'f')
        o->force = 1;
    else
        return -1;
    return 0;
}

/* Registered ranks, live processes and the running kvcoordd that adopted
 * the segment after its creator ended (0: none), when the segment can be
 * attached. */
static int contents(const diag *d, const kvc_raw_header *h, int64_t *ranks, int64_t *alive,
                    int32_t *adopter)
{
    kvc_options o;
    kvc_segment *seg = NULL;
    kvc_options_init(&o);
    o.name = d->segment;
    o.role = KVC_ROLE_NONE;
    o.lock_timeout_ms = d->lock_timeout_ms;
    *ranks = *alive = -1;
    *adopter = 0;
    if (kvc_open(&o, &seg) != KVC_OK)
        return -1;
    if (!h->creator_alive)
        *adopter = kvc__adopter(seg, h->creator_pid);
    kvc_segment_info si;
    kvc_segment_stat(seg, &si);
    *ranks = si.ranks_registered;
    size_t n = 0;
    kvc_proc_info *p = diag_procs_fetch(seg, &n);
    if (p) {
        *alive = 0;
        for (size_t i = 0; i < n; i++)
            *alive += p[i].alive != 0;
    }
    free(p);
    kvc__close_reader(seg);
    return 0;
}

static void describe(const diag *d, const kvc_raw_header *h, int64_t ranks, int64_t alive,
                     int32_t adopter)
{
    char b[32];
    printf("segment /dev/shm/%s: %s", d->segment, diag_bytes(h->file_bytes, b, sizeof b));
    if (h->has_prefix && h->magic_ok)
        printf(", layout version %u, creator pid %d (%s)", h->layout_version, (int)h->creator_pid,
               diag_alive(h->creator_alive));
    if (h->has_prefix && h->magic_ok && adopter > 0)
        printf(", adopted by kvcoordd pid %d (running)", (int)adopter);
    if (h->has_prefix && !h->magic_ok)
        printf(", not a kvcoord segment (no valid magic)");
    if (ranks >= 0)
        printf(", %lld %s registered, %lld live %s attached", (long long)ranks,
               diag_noun((unsigned long long)ranks, "rank", "ranks"), (long long)alive,
               diag_noun((unsigned long long)alive, "process", "processes"));
    else
        printf(" (cannot be attached to: %s)", kvc_last_error());
    printf("\n");
}

/* 1 when the operator typed yes. */
static int confirm(const diag *d)
{
    char line[32];
    printf("Remove it? Its registrations, rooms and failure records are lost. [y/N] ");
    fflush(stdout);
    if (!fgets(line, sizeof line, stdin))
        return 0;
    line[strcspn(line, "\r\n")] = '\0';
    (void)d;
    return !strcasecmp(line, "y") || !strcasecmp(line, "yes");
}

static int finish(const diag *d, const kvc_raw_header *h, int64_t ranks, int64_t alive, int removed,
                  const char *err, int rc)
{
    if (d->json) {
        json_t *doc = diag_jdoc(d, "unlink");
        json_object_set_new(doc, "removed", json_boolean(removed));
        json_object_set_new(doc, "header", diag_raw_header_json(h));
        json_object_set_new(doc, "ranks_registered", ranks >= 0 ? diag_jint(ranks) : json_null());
        json_object_set_new(doc, "procs_alive", alive >= 0 ? diag_jint(alive) : json_null());
        if (err)
            json_object_set_new(doc, "error", diag_jstr(err));
        diag_jprint(doc);
    } else if (removed) {
        printf("removed /dev/shm/%s\n", d->segment);
    } else if (err) {
        fprintf(stderr, "%s unlink: %s\n", d->prog, err);
    }
    return rc;
}

static int run_unlink(diag *d, int argc, char **argv)
{
    static const struct option longopts[] = {
        {"yes", no_argument, NULL, 'y'}, {"force", no_argument, NULL, 'f'}, {0}};
    struct unlink_opts o = {0};
    int rc = diag_parse_exit(
        diag_parse(d, &diag_cmd_unlink, argc, argv, "yf", longopts, unlink_opt, &o));
    if (rc >= 0)
        return rc;
    if (optind < argc) {
        diag_usage_error(d, &diag_cmd_unlink, "unexpected argument '%s'", argv[optind]);
        return DIAG_EXIT_USAGE;
    }
    kvc_raw_header h;
    int64_t ranks, alive;
    int32_t adopter = 0;
    kvc_err he = kvc__header_read(d->segment, &h);
    if (he == KVC_E_NOENT || he == KVC_E_INVAL)
        return finish(d, &h, -1, -1, 0, kvc_last_error(), DIAG_EXIT_BROKEN);
    ranks = alive = -1;
    if (he == KVC_OK && !h.creating) /* attaching would wait on its creator's flock */
        contents(d, &h, &ranks, &alive, &adopter);
    if (!d->json)
        describe(d, &h, ranks, alive, adopter);
    char why[320];
    /* Its kvcoordd: the creator, or the one that adopted it after the
     * creator ended; removing the file under it makes it exit. */
    int32_t running = 0;
    const char *who = "its creator";
    if (h.magic_ok && h.creator_alive && h.creator_pid != (int32_t)getpid())
        running = h.creator_pid;
    else if (h.magic_ok && adopter > 0 && adopter != (int32_t)getpid())
        running = adopter, who = "the kvcoordd that adopted it after its creator ended";
    if (running && !o.force) {
        snprintf(why, sizeof why,
                 "not removed: %s, pid %d, is running (a kvcoordd whose segment is removed "
                 "exits with status 1, and its workers must be restarted); stop it first, or "
                 "pass --force",
                 who, (int)running);
        return finish(d, &h, ranks, alive, 0, why, DIAG_EXIT_DEGRADED);
    }
    if (!o.yes && (d->json || !isatty(STDIN_FILENO))) {
        snprintf(why, sizeof why, "not removed: not confirmed (%s); pass --yes",
                 d->json ? "--json cannot ask" : "stdin is not a terminal");
        return finish(d, &h, ranks, alive, 0, why, DIAG_EXIT_DEGRADED);
    }
    if (h.magic_ok && adopter > 0 && adopter != (int32_t)getpid() && !o.force) {
        snprintf(why, sizeof why,
                 "not removed: the kvcoordd that adopted it after its creator ended, pid %d, "
                 "is running (a kvcoordd whose segment is removed exits with status 1, and its "
                 "workers must be restarted); stop it first, or pass --force",
                 (int)adopter);
        return finish(d, &h, ranks, alive, 0, why, DIAG_EXIT_DEGRADED);
    }
    if (!o.yes && !confirm(d)) {
        printf("not removed\n");
        return DIAG_EXIT_DEGRADED;
    }
    kvc_err e = kvc_unlink(d->segment);
    return finish(d, &h, ranks, alive, e == KVC_OK, e ? kvc_last_error() : NULL,
                  e == KVC_OK ? DIAG_EXIT_OK : DIAG_EXIT_BROKEN);
}

const diag_cmd diag_cmd_unlink = {
    "unlink",
    "remove the segment from /dev/shm (asks first; --yes for scripts)",
    "unlink [--yes] [--force]",
    unlink_help,
    run_unlink,
};
