/*
 * diag_locks.c - `kvcoord-diag locks`: each robust mutex of the segment,
 * whether it is held, by which pid, and whether that pid is alive - read
 * from the mutex itself without taking it.
 */
#include <string.h>

#include "diag.h"

static const char locks_help[] =
    "DESCRIPTION\n"
    "  Lists the segment's robust process-shared mutexes (ranks: the rank table and\n"
    "  info arena; procs: the process table; rooms: bootstrap rooms and failure\n"
    "  records; pd: the PD bootstrap tables) with their state, read from the mutex\n"
    "  without taking it, so locks\n"
    "  never waits and never changes anything:\n"
    "    free             nobody holds it\n"
    "    held             held by OWNER; ALIVE says whether that process runs (held by\n"
    "                     a dead process that the kernel did not mark is broken), or\n"
    "                     \"stopped\" (state T: SIGSTOP or a debugger; stuck until\n"
    "                     continued, reported by check and status at once)\n"
    "    owner_died       its owner died holding it; the next locker gets EOWNERDEAD,\n"
    "                     repairs the state under it and marks it consistent -\n"
    "                     `kvcoord-diag repair` does that now\n"
    "    not_recoverable  released without being made consistent (a bug): every\n"
    "                     locker fails; the segment must be recreated\n"
    "  RECOVERIES counts the EOWNERDEAD recoveries of each lock since creation.\n"
    "  A lock held by a live process only for a moment is normal; `check` tells a\n"
    "  stuck one (held past --lock-timeout) apart.\n"
    "\n"
    "OPTIONS\n"
    "  The global options only.\n"
    "\n"
    "OUTPUT\n"
    "  --json: {\"schema\", \"command\": \"locks\", \"segment\", \"locks\": [{\"name\",\n"
    "  \"state\" (free|held|owner_died|not_recoverable), \"owner_pid\" (0: none or\n"
    "  unknown), \"owner_alive\", \"owner_stopped\" (alive but stopped: state T in /proc,\n"
    "  SIGSTOP or a debugger; it holds the lock until continued), \"waiters\",\n"
    "  \"recovering\", \"recoveries\"}]}.\n";

const char *diag_lock_state_name(kvc_lock_state s)
{
    static const char *const names[] = {"free", "held", "owner_died", "not_recoverable"};
    return (unsigned)s < 4 ? names[s] : "unknown";
}

json_t *diag_lock_json(const kvc_lock_probe *p)
{
    json_t *o = json_object();
    json_object_set_new(o, "name", json_string(p->name));
    json_object_set_new(o, "state", json_string(diag_lock_state_name(p->state)));
    json_object_set_new(o, "owner_pid", diag_jint(p->owner_pid));
    json_object_set_new(o, "owner_alive", json_boolean(p->owner_alive));
    json_object_set_new(o, "owner_stopped", json_boolean(p->owner_stopped));
    json_object_set_new(o, "waiters", json_boolean(p->waiters));
    json_object_set_new(o, "recovering", json_boolean(p->recovering));
    json_object_set_new(o, "recoveries", diag_jint((int64_t)p->recoveries));
    return o;
}

static void locks_text(kvc_lock_probe *p, int n)
{
    static const char *const head[] = {"LOCK",    "STATE",      "OWNER", "ALIVE",
                                       "WAITERS", "RECOVERIES", "DETAIL"};
    diag_table *t = diag_table_new(7, head, "llrllrl");
    char detail[160], owner[24];
    for (int i = 0; i < n; i++) {
        snprintf(owner, sizeof owner, "%d", (int)p[i].owner_pid);
        diag_table_addf(t, "%s\t%s\t%s\t%s\t%s\t%llu\t%s", p[i].name,
                        diag_lock_state_name(p[i].state), p[i].owner_pid ? owner : "-",
                        p[i].state == KVC_LOCKST_FREE ? "-"
                        : p[i].state == KVC_LOCKST_HELD
                            ? (p[i].owner_stopped ? "stopped" : diag_alive(p[i].owner_alive))
                            : "dead",
                        p[i].waiters ? "yes" : "no", (unsigned long long)p[i].recoveries,
                        kvc__lock_text(&p[i], detail, sizeof detail));
    }
    diag_table_print(t, stdout, 0);
}

static int run_locks(diag *d, int argc, char **argv)
{
    int rc = diag_parse_exit(diag_parse(d, &diag_cmd_locks, argc, argv, "", NULL, NULL, NULL));
    if (rc >= 0)
        return rc;
    if (optind < argc) {
        diag_usage_error(d, &diag_cmd_locks, "unexpected argument '%s'", argv[optind]);
        return DIAG_EXIT_USAGE;
    }
    kvc_segment *seg = diag_open(d, "locks", &rc);
    if (!seg)
        return rc;
    kvc_lock_probe p[KVC__LOCKS];
    for (int i = 0; i < KVC__LOCKS; i++)
        kvc__lock_probe(seg, i, &p[i]);
    if (d->json) {
        json_t *doc = diag_jdoc(d, "locks"), *arr = json_array();
        for (int i = 0; i < KVC__LOCKS; i++)
            json_array_append_new(arr, diag_lock_json(&p[i]));
        json_object_set_new(doc, "locks", arr);
        diag_jprint(doc);
    } else {
        locks_text(p, KVC__LOCKS);
    }
    kvc__close_reader(seg);
    return DIAG_EXIT_OK;
}

const diag_cmd diag_cmd_locks = {
    "locks", "each lock: free or held, by which pid, alive or dead", "locks", locks_help, run_locks,
};
