/*
 * diag_procs.c - `kvcoord-diag procs`: the processes attached to the
 * segment, with role, rank, start time and liveness (its liveness lock).
 */
#include <stdlib.h>

#include "diag.h"

static const char procs_help[] =
    "DESCRIPTION\n"
    "  Lists the process table: every process attached to the segment with its\n"
    "  pid, role (worker: a TP worker, whose ranks are withdrawn when it dies;\n"
    "  daemon: kvcoordd; client: any other attached process), the rank it serves\n"
    "  (-1: none), its start time (clock ticks since boot, and as a time), when it\n"
    "  attached, and whether it is alive.  The pid is the one its own PID namespace\n"
    "  gives it (1 in a container's); alive means it holds its liveness lock, an OFD\n"
    "  lock on its entry that the kernel drops when it dies, in any namespace (not a\n"
    "  look at /proc by pid).  One entry per process, whatever number of handles it\n"
    "  has open.  A dead process still listed is reaped by kvcoordd, or by\n"
    "  `kvcoord-diag repair` (its rooms fail, its worker ranks are withdrawn).\n"
    "  kvcoord-diag itself attaches without an entry.  procs takes no lock.\n"
    "\n"
    "OPTIONS\n"
    "  The global options only.\n"
    "\n"
    "OUTPUT\n"
    "  --json: {\"schema\", \"command\": \"procs\", \"segment\", \"count\", \"alive\", \"dead\",\n"
    "  \"procs\": [{\"pid\", \"role\" (none|worker|daemon|client), \"rank\", \"start_ticks\",\n"
    "  \"started_ns\", \"started_utc\", \"attached_ns\", \"attached_utc\", \"alive\",\n"
    "  \"stopped\" (alive but state T in /proc: SIGSTOP or a debugger; ALIVE then\n"
    "  reads \"stopped\"), \"shown_pid\" (its pid as its /proc names it: the host's when it sees "
    "the\n"
    "  host's /proc), \"handles\" (its open handles on the segment)}]}.\n";

kvc_proc_info *diag_procs_fetch(kvc_segment *seg, size_t *n)
{
    size_t count = 0;
    *n = 0;
    for (int tries = 0; tries < 5; tries++) {
        if (kvc_proc_list(seg, NULL, 0, &count) != KVC_OK)
            return NULL;
        size_t cap = count + 16;
        kvc_proc_info *p = calloc(cap, sizeof *p);
        if (!p)
            return NULL;
        if (kvc_proc_list(seg, p, cap, &count) == KVC_OK && count <= cap) {
            *n = count;
            return p;
        }
        free(p); /* attached meanwhile: count again */
    }
    return NULL;
}

/* Alive and stopped (state T or t: SIGSTOP, a debugger), by the pid this
 * /proc names it when its start time matches. */
static int proc_stopped(const kvc_proc_info *p)
{
    return p->alive && kvc__pid_stopped(p->shown_pid > 0 ? p->shown_pid : p->pid, p->start);
}

static json_t *proc_json(const kvc_proc_info *p)
{
    json_t *o = json_object();
    json_object_set_new(o, "pid", diag_jint(p->pid));
    json_object_set_new(o, "role", json_string(kvc_role_name(p->role)));
    json_object_set_new(o, "rank", diag_jint(p->rank));
    json_object_set_new(o, "start_ticks", diag_jint((int64_t)p->start));
    diag_jtime(o, "started", diag_ticks_to_ns(p->start));
    diag_jtime(o, "attached", p->attached_ns);
    json_object_set_new(o, "alive", json_boolean(p->alive));
    json_object_set_new(o, "stopped", json_boolean(proc_stopped(p)));
    json_object_set_new(o, "shown_pid", diag_jint(p->shown_pid));
    json_object_set_new(o, "handles", diag_jint(p->handles));
    return o;
}

static void procs_text(const diag *d, const kvc_proc_info *p, size_t n)
{
    if (n == 0) {
        printf("no process attached to segment %s\n", d->segment);
        return;
    }
    static const char *const head[] = {"PID",         "ROLE",     "RANK", "STARTED",
                                       "START_TICKS", "ATTACHED", "ALIVE"};
    diag_table *t = diag_table_new(7, head, "rlrlrll");
    char started[40], attached[40];
    for (size_t i = 0; i < n; i++)
        diag_table_addf(
            t, "%d\t%s\t%d\t%s\t%llu\t%s\t%s", (int)p[i].pid, kvc_role_name(p[i].role),
            (int)p[i].rank, diag_time(diag_ticks_to_ns(p[i].start), started, sizeof started),
            (unsigned long long)p[i].start, diag_time(p[i].attached_ns, attached, sizeof attached),
            proc_stopped(&p[i]) ? "stopped" : diag_alive(p[i].alive));
    diag_table_print(t, stdout, 0);
}

static int run_procs(diag *d, int argc, char **argv)
{
    int rc = diag_parse_exit(diag_parse(d, &diag_cmd_procs, argc, argv, "", NULL, NULL, NULL));
    if (rc >= 0)
        return rc;
    if (optind < argc) {
        diag_usage_error(d, &diag_cmd_procs, "unexpected argument '%s'", argv[optind]);
        return DIAG_EXIT_USAGE;
    }
    kvc_segment *seg = diag_open(d, "procs", &rc);
    if (!seg)
        return rc;
    size_t n = 0, alive = 0;
    kvc_proc_info *p = diag_procs_fetch(seg, &n);
    if (!p) {
        fprintf(stderr, "%s procs: %s\n", d->prog, kvc_last_error());
        kvc__close_reader(seg);
        return DIAG_EXIT_BROKEN;
    }
    for (size_t i = 0; i < n; i++)
        alive += p[i].alive != 0;
    if (d->json) {
        json_t *doc = diag_jdoc(d, "procs"), *arr = json_array();
        for (size_t i = 0; i < n; i++)
            json_array_append_new(arr, proc_json(&p[i]));
        json_object_set_new(doc, "count", diag_jint((int64_t)n));
        json_object_set_new(doc, "alive", diag_jint((int64_t)alive));
        json_object_set_new(doc, "dead", diag_jint((int64_t)(n - alive)));
        json_object_set_new(doc, "procs", arr);
        diag_jprint(doc);
    } else {
        procs_text(d, p, n);
    }
    free(p);
    kvc__close_reader(seg);
    return DIAG_EXIT_OK;
}

const diag_cmd diag_cmd_procs = {
    "procs",   "attached processes: role, rank, pid, start time, alive or dead",
    "procs",   procs_help,
    run_procs,
};
