/*
 * diag.h - what the files of kvcoord-diag share: global options, the
 * command table, opening the segment, and output (aligned tables, JSON).
 *
 * Each command lives in its own diag_<command>.c and exports one
 * diag_cmd; diag.c parses the global options and dispatches.
 */
#ifndef KVC_DIAG_H
#define KVC_DIAG_H

#include <getopt.h>
#include <stdint.h>
#include <stdio.h>

#include <jansson.h>

#include "inspect.h"
#include "xfer_gid.h"
#include "kvcoord/kvcoord.h"

/* Exit status of every command (documented in `kvcoord-diag --help`). */
#define DIAG_EXIT_OK 0
#define DIAG_EXIT_DEGRADED 1 /* check/repair: degraded; ranks --rank: not registered */
#define DIAG_EXIT_BROKEN 2   /* broken or unreadable segment; an operation failed */
#define DIAG_EXIT_NO_RDMA 3  /* rdma --require: no usable RDMA device */
/* Usage error: 2, as for every program of the project (getopt tools, grep and
 * diff: 2 is trouble), not sysexits.h's 64; stdout stays empty. */
#define DIAG_EXIT_USAGE 2

/* Version of every --json document's layout ("schema" field).  Fields are
 * only ever added within one schema version. */
#define DIAG_JSON_SCHEMA 1

#define DIAG_DEFAULT_LOCK_TIMEOUT_MS 300u

typedef struct diag {
    const char *prog;
    char segment[KVC_NAME_MAX + 1];
    int json;
    uint32_t lock_timeout_ms;
    char seg_opt; /* 's' or 'p' once one named the segment, else 0 */
    int lock_timeout_given;
} diag;

typedef struct diag_cmd {
    const char *name;
    const char *summary;  /* one line for the command list */
    const char *synopsis; /* "ranks [--rank N [--full]] [--state STATE]" */
    const char *help;     /* DESCRIPTION, OPTIONS, OUTPUT, EXIT STATUS, EXAMPLES */
    int (*run)(diag *d, int argc, char **argv);
} diag_cmd;

extern const diag_cmd diag_cmd_status, diag_cmd_ranks, diag_cmd_rooms, diag_cmd_failures,
    diag_cmd_procs, diag_cmd_locks, diag_cmd_check, diag_cmd_repair, diag_cmd_unlink, diag_cmd_rdma,
    diag_cmd_watch, diag_cmd_cluster, diag_cmd_pd;

/* ---- options (diag.c) ---- */

/* Parse a command's options: its own (longopts/shortopts; on() is called
 * for each with ctx) plus the global ones (--segment, --port, --json,
 * --lock-timeout, --help), which may come before or after the command.
 * Returns the index of the first operand, DIAG_PARSED_HELP after printing
 * the command's help, or -1 after printing a usage error. */
#define DIAG_PARSED_HELP (-2)
typedef int (*diag_opt_fn)(void *ctx, int opt, const char *arg);
int diag_parse(diag *d, const diag_cmd *c, int argc, char **argv, const char *shortopts,
               const struct option *longopts, diag_opt_fn on, void *ctx);
/* Print "PROG CMD: message" and a pointer to the help on stderr; returns -1. */
int diag_usage_error(const diag *d, const diag_cmd *c, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Parse a decimal integer operand/option in min..max into *out; else the
 * usage error "NAME must be an integer in MIN..MAX, not 'S'" (one message,
 * one range, whatever was wrong) and -1. */
int diag_parse_range(const diag *d, const diag_cmd *c, const char *name, const char *s,
                     uint64_t min, uint64_t max, uint64_t *out);
/* diag_parse_range() with min 0. */
int diag_parse_u64(const diag *d, const diag_cmd *c, const char *name, const char *s, uint64_t max,
                   uint64_t *out);
/* The exit status a command's diag_parse() result means, or -1 to go on. */
int diag_parse_exit(int parsed);
/* A KVPoll state by name (case-insensitive) or number; -1 if neither. */
int diag_poll_state(const char *s);
/* Print a command's full help (man-page style) to out. */
void diag_cmd_help(const diag *d, const diag_cmd *c, FILE *out);

/* ---- opening the segment (diag_open.c) ---- */

/* Attach to d->segment as a diagnostic reader (role none, d's lock
 * timeout).  On failure prints why - with the raw header when the file
 * exists but cannot be used (another layout version, truncated) - as text
 * or as a JSON document, and returns NULL with *rc the exit status. */
kvc_segment *diag_open(const diag *d, const char *command, int *rc);
/* The JSON object describing a raw header (also used by status). */
json_t *diag_raw_header_json(const kvc_raw_header *h);
/* Liveness word: "alive" / "dead". */
const char *diag_alive(int alive);
/* The noun that agrees with count n: one ("rank") for 1, else many
 * ("ranks"), for "%llu %s" in a printed message. */
const char *diag_noun(unsigned long long n, const char *one, const char *many);
/* Exit status for a verdict severity. */
int diag_verdict_exit(kvc_severity s);
/* "healthy", "degraded", "broken". */
const char *diag_verdict_name(kvc_severity s);

/* ---- output (diag_out.c) ---- */

/* An aligned text table.  Columns: align[i] is 'l' or 'r'.  Cells are
 * copied; control characters and invalid UTF-8 are escaped (\xNN) so a
 * session_id or reason cannot drive the terminal.  The last column is
 * never padded. */
typedef struct diag_table diag_table;
diag_table *diag_table_new(int ncols, const char *const *head, const char *align);
void diag_table_add(diag_table *t, const char *const *cells);
/* As diag_table_add with printf-formatted cells separated by '\t'. */
void diag_table_addf(diag_table *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Print (with the header row unless head was NULL), indented by indent
 * spaces, and free the table. */
void diag_table_print(diag_table *t, FILE *out, int indent);
/* Free without printing (NULL is ignored). */
void diag_table_free(diag_table *t);

/* Escape s for a terminal into buf (see diag_table). */
char *diag_sanitize(const char *s, char *buf, size_t cap);

/* Local time "2025-01-31 12:34:56.789" (or "-" for 0). */
char *diag_time(uint64_t ns, char *buf, size_t cap);
/* UTC RFC 3339 "2025-01-31T12:34:56.789Z" (or "" for 0). */
char *diag_time_utc(uint64_t ns, char *buf, size_t cap);
/* "1.5 GiB", "512 B". */
char *diag_bytes(uint64_t n, char *buf, size_t cap);
/* Age of ns relative to now: "3.2s", "5m12s", "2h03m", "4d02h" ("-" for 0). */
char *diag_age(uint64_t ns, char *buf, size_t cap);
uint64_t diag_now_ns(void);
/* Start time of a process (ticks since boot) as wall-clock ns (0 if unknown). */
uint64_t diag_ticks_to_ns(uint64_t ticks);

/* JSON: a string (invalid UTF-8 replaced by U+FFFD), never NULL. */
json_t *diag_jstr(const char *s);
json_t *diag_jint(int64_t v);
/* A room id as JSON: an integer in 0..KVC_ROOM_ID_MAX (the one range of
 * room ids, as the library and HTTP API have it); an id beyond it, which
 * only a tampered segment can hold, as its decimal text (never negative). */
json_t *diag_jroom(uint64_t room);
/* {"ns": n, "utc": "..."} is not used: times are two fields, *_ns and *_utc. */
void diag_jtime(json_t *obj, const char *key, uint64_t ns);
/* A new document {"schema": 1, "command": command, "segment": name}. */
json_t *diag_jdoc(const diag *d, const char *command);
/* --json's promise, exactly one document on stdout for every run that got
 * past its arguments: diag_jprint*() set diag_json_printed; a usage error
 * or a help text sets diag_json_none (stdout then holds the help, or
 * nothing); main() prints an error document when a command returns
 * without either (a failure it reported on stderr only). */
extern int diag_json_printed, diag_json_none;

/* Print doc (2-space indent, fields in insertion order) and a newline, then
 * free it. */
void diag_jprint(json_t *doc);
/* The same, with the value of the last member whose value is the string
 * placeholder replaced by raw[0..len), printed as it is: for JSON text
 * the library validated and stores as sent (a weights_info_dict), which a
 * jansson tree would change (integers past 2^63, reals past a double).
 * Without the placeholder in doc, the same as diag_jprint(). */
void diag_jprint_raw(json_t *doc, const char *placeholder, const char *raw, size_t len);

/* ---- shared readers ---- */

/* Run the invariant check: findings appended to a JSON array (when arr)
 * and/or printed as a table (when tab, problems only if quiet). */
typedef struct diag_findings {
    json_t *arr;
    diag_table *tab;
    int quiet;
    unsigned count[4]; /* by severity */
    kvc_severity worst;
    char worst_id[32]; /* the first finding of the worst severity */
    char worst_msg[512];
} diag_findings;
void diag_findings_cb(void *ctx, kvc_severity sev, const char *id, const char *msg);
void diag_findings_init(diag_findings *f, int want_json, int want_table, int quiet);

/* One-line summary of the worst findings: "2 broken, 1 degraded". */
char *diag_findings_summary(const diag_findings *f, char *buf, size_t cap);

/* Status body shared with watch: prints the header/counts section. */
void diag_status_text(const diag *d, kvc_segment *seg, const kvc_check_stats *st,
                      kvc_severity verdict, const diag_findings *f, FILE *out);
/* A lock's state as JSON {"name", "state", "owner_pid", "owner_alive", ...}
 * and as a word ("free", "held", "owner_died", "not_recoverable"). */
json_t *diag_lock_json(const kvc_lock_probe *p);
const char *diag_lock_state_name(kvc_lock_state s);
/* The process table (kvc_proc_list, sized by a first count); NULL with
 * *n = 0 on error (kvc_last_error says why).  free() the result. */
kvc_proc_info *diag_procs_fetch(kvc_segment *seg, size_t *n);
/* Ranks and rooms tables shared with watch. */
int diag_ranks_table(kvc_segment *seg, FILE *out, int limit);
int diag_rooms_table(kvc_segment *seg, int state, size_t limit, FILE *out);

/* ---- GIDs (diag_gid.c; no device needed, unit-tested) ---- */

/* Set port's "gids" (the table t[0..n-1] as [{index, type, gid, netdev}]),
 * "chosen_gid_index" (-1: none) and "chosen_reason": the GID the transfer
 * engine uses on that port, by its own rule (kvt__gid_choose, no override).
 * Returns the chosen index. */
int diag_gid_port(json_t *port, const kvt__gid_entry *t, size_t n, int infiniband);

#endif /* KVC_DIAG_H */
