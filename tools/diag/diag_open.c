/*
 * diag_open.c - attaching to the segment as a diagnostic reader, and
 * explaining, from its raw header, a segment that cannot be attached to
 * (missing, another layout version, truncated, half-created).  Also the
 * findings collector shared by status, check, repair and watch.
 */
#include <stdio.h>
#include <string.h>

#include "diag.h"

const char *diag_alive(int alive) { return alive ? "alive" : "dead"; }

const char *diag_noun(unsigned long long n, const char *one, const char *many)
{
    return n == 1 ? one : many;
}

int diag_verdict_exit(kvc_severity s)
{
    return s >= KVC_SEV_BROKEN     ? DIAG_EXIT_BROKEN
           : s == KVC_SEV_DEGRADED ? DIAG_EXIT_DEGRADED
                                   : DIAG_EXIT_OK;
}

const char *diag_verdict_name(kvc_severity s)
{
    return s >= KVC_SEV_BROKEN ? "broken" : s == KVC_SEV_DEGRADED ? "degraded" : "healthy";
}

static const char *err_code_name(kvc_err e)
{
    static const char *const names[] = {"KVC_OK",
                                        "KVC_E_INVAL",
                                        "KVC_E_NOENT",
                                        "KVC_E_WITHDRAWN",
                                        "KVC_E_CAPACITY",
                                        "KVC_E_TOOBIG",
                                        "KVC_E_FULL",
                                        "KVC_E_VERSION",
                                        "KVC_E_CORRUPT",
                                        "KVC_E_SYS",
                                        "KVC_E_TIMEDOUT",
                                        "KVC_E_BUSY",
                                        "KVC_E_NOTRECOVERABLE",
                                        "KVC_E_EXISTS"};
    return (unsigned)e < sizeof names / sizeof *names ? names[e] : "KVC_E_UNKNOWN";
}

json_t *diag_raw_header_json(const kvc_raw_header *h)
{
    json_t *o = json_object();
    char magic[9], hex[24];
    if (h->has_stat) {
        json_object_set_new(o, "file_type", json_string(h->file_type ? h->file_type : "?"));
        json_object_set_new(o, "file_bytes", diag_jint((int64_t)h->file_bytes));
        json_object_set_new(o, "file_mode",
                            json_string((snprintf(hex, sizeof hex, "%04o", h->file_mode), hex)));
        json_object_set_new(o, "file_uid", diag_jint(h->file_uid));
    }
    json_object_set_new(o, "has_prefix", json_boolean(h->has_prefix));
    json_object_set_new(o, "being_created", json_boolean(h->creating));
    if (!h->has_prefix)
        return o;
    kvc__magic_text(h->magic, magic);
    snprintf(hex, sizeof hex, "0x%016llx", (unsigned long long)h->magic);
    json_object_set_new(o, "magic", json_string(hex));
    json_object_set_new(o, "magic_text", json_string(magic));
    json_object_set_new(o, "magic_ok", json_boolean(h->magic_ok));
    if (!h->magic_ok) /* the rest of the bytes mean nothing */
        return o;
    json_object_set_new(o, "layout_version", diag_jint(h->layout_version));
    json_object_set_new(o, "build_layout_version", diag_jint(KVC_LAYOUT_VERSION));
    json_object_set_new(o, "header_size", diag_jint(h->header_size));
    json_object_set_new(o, "creator_pid", diag_jint(h->creator_pid));
    json_object_set_new(o, "creator_start", diag_jint((int64_t)h->creator_start));
    json_object_set_new(o, "creator_alive", json_boolean(h->creator_alive));
    json_object_set_new(o, "creator_stopped", json_boolean(h->creator_stopped));
    json_object_set_new(o, "full", json_boolean(h->full));
    if (!h->full)
        return o;
    json_object_set_new(o, "total_bytes", diag_jint((int64_t)h->total_bytes));
    json_object_set_new(o, "rank_entry_size", diag_jint(h->rank_entry_size));
    json_object_set_new(o, "proc_size", diag_jint(h->proc_size));
    json_object_set_new(o, "lock_size", diag_jint(h->lock_size));
    json_object_set_new(o, "room_size", diag_jint(h->room_size));
    json_object_set_new(o, "block_size", diag_jint(h->block_size));
    diag_jtime(o, "created", h->created_ns);
    diag_jtime(o, "updated", h->updated_ns);
    return o;
}

/* What an operator can do about a segment that cannot be attached to. */
static const char *advice(kvc_err e, const kvc_raw_header *h, const char *name, char *buf,
                          size_t cap)
{
    /* kvcoordd (without --fresh) renames an invalid file before creating its segment */
    snprintf(buf, cap,
             "%skvcoordd%s, on start%s, moves it aside to /dev/shm/%s.invalid-<time> (readable "
             "with kvcoord-diag --segment) and starts an empty segment; or remove it with "
             "`kvcoord-diag unlink`",
             e == KVC_E_VERSION ? "its creator is dead: " : "",
             e == KVC_E_VERSION ? " of this build" : "",
             e == KVC_E_VERSION ? " (if no kvcoordd of another build serves it)" : "", name);
    if (e == KVC_E_NOENT)
        return "is kvcoordd running, with this segment name? (ls /dev/shm)";
    if (h->creating)
        return "its creator is initialising it right now: try again";
    if (e == KVC_E_VERSION && h->creator_alive)
        return "its creator still runs it: use the kvcoord-diag of that build";
    if (e == KVC_E_VERSION)
        return buf;
    if (h->has_stat && h->file_type && strcmp(h->file_type, "regular file"))
        return "something else sits under the segment's name: look at it (ls -l /dev/shm) and "
               "remove it by hand";
    if (e == KVC_E_SYS && h->has_stat)
        return "run as the file's owner or root";
    if (e == KVC_E_CORRUPT)
        return buf;
    return "check the file's owner and mode";
}

static void print_raw_text(const diag *d, kvc_err e, const char *msg, const kvc_raw_header *h)
{
    char b[64], m[9];
    printf("segment %s  (/dev/shm/%s) cannot be read:\n  %s\n\n", d->segment, d->segment, msg);
    diag_table *t = diag_table_new(2, NULL, "ll");
    int is_reg = h->has_stat && h->file_type && !strcmp(h->file_type, "regular file");
    if (h->has_stat) {
        diag_table_addf(t, "file\t/dev/shm/%s: %s, %llu bytes (%s), mode %04o, uid %u", d->segment,
                        h->file_type ? h->file_type : "?", (unsigned long long)h->file_bytes,
                        diag_bytes(h->file_bytes, b, sizeof b), h->file_mode, h->file_uid);
    }
    if (h->has_prefix && !h->magic_ok) {
        /* Without the magic, no other byte of the file means anything. */
        kvc__magic_text(h->magic, m);
        diag_table_addf(t, "magic\t%s (0x%016llx: NOT a kvcoord magic; no other field is shown)", m,
                        (unsigned long long)h->magic);
    } else if (h->has_prefix) {
        kvc__magic_text(h->magic, m);
        diag_table_addf(t, "magic\t%s (valid)", m);
        diag_table_addf(t, "layout version\t%u (this build reads %u)", h->layout_version,
                        KVC_LAYOUT_VERSION);
        diag_table_addf(t, "header size\t%u bytes", h->header_size);
        diag_table_addf(t, "creator\tpid %d (%s)", (int)h->creator_pid,
                        h->creator_stopped ? "stopped" : diag_alive(h->creator_alive));
    } else if (is_reg) {
        diag_table_addf(t, "header\tthe file is too short to hold a header prefix");
    }
    if (h->full)
        diag_table_addf(t, "size in header\t%llu bytes (the file has %llu)",
                        (unsigned long long)h->total_bytes, (unsigned long long)h->file_bytes);
    char ab[512];
    diag_table_addf(t, "advice\t%s", advice(e, h, d->segment, ab, sizeof ab));
    diag_table_print(t, stdout, 2);
    printf("verdict: broken (unreadable)\n");
}

static void print_raw_json(const diag *d, const char *command, kvc_err e, const char *msg,
                           const kvc_raw_header *h)
{
    json_t *doc = diag_jdoc(d, command), *err = json_object();
    json_object_set_new(doc, "readable", json_false());
    json_object_set_new(err, "code", json_string(err_code_name(e)));
    json_object_set_new(err, "message", diag_jstr(msg));
    char ab[512];
    json_object_set_new(err, "advice", json_string(advice(e, h, d->segment, ab, sizeof ab)));
    json_object_set_new(doc, "error", err);
    json_object_set_new(doc, "exists", json_boolean(e != KVC_E_NOENT));
    json_object_set_new(doc, "header", diag_raw_header_json(h));
    json_object_set_new(doc, "verdict", json_string("broken"));
    json_object_set_new(doc, "exit_code", json_integer(DIAG_EXIT_BROKEN));
    diag_jprint(doc);
}

kvc_segment *diag_open(const diag *d, const char *command, int *rc)
{
    kvc_raw_header h;
    *rc = DIAG_EXIT_BROKEN;
    kvc_err e = kvc__header_read(d->segment, &h);
    /* A creator holding its creation lock would make kvc_open wait on flock
     * without a bound: report it instead. */
    if (e == KVC_OK && h.creating)
        e = KVC_E_BUSY;
    kvc_segment *seg = NULL;
    if (e == KVC_OK) {
        kvc_options o;
        kvc_options_init(&o);
        o.name = d->segment;
        o.mode = KVC_OPEN_ATTACH;
        o.role = KVC_ROLE_NONE;
        o.lock_timeout_ms = d->lock_timeout_ms;
        e = kvc_open(&o, &seg);
    }
    if (e == KVC_OK)
        return seg;
    char msg[512];
    if (e == KVC_E_BUSY)
        snprintf(msg, sizeof msg,
                 "segment %s is being created (its creator holds the creation "
                 "lock)",
                 d->segment);
    else
        snprintf(msg, sizeof msg, "%s", kvc_last_error());
    if (d->json) {
        print_raw_json(d, command, e, msg, &h);
    } else {
        fprintf(stderr, "%s: cannot read segment %s: %s\n", d->prog, d->segment, msg);
        print_raw_text(d, e, msg, &h);
    }
    return NULL;
}

/* ---- findings ------------------------------------------------------------- */

void diag_findings_init(diag_findings *f, int want_json, int want_table, int quiet)
{
    memset(f, 0, sizeof *f);
    f->quiet = quiet;
    if (want_json)
        f->arr = json_array();
    if (want_table) {
        static const char *const head[] = {"SEVERITY", "CHECK", "FINDING"};
        f->tab = diag_table_new(3, head, "lll");
    }
}

void diag_findings_cb(void *ctx, kvc_severity sev, const char *id, const char *msg)
{
    diag_findings *f = ctx;
    f->count[sev & 3]++;
    if (sev > f->worst) {
        f->worst = sev;
        snprintf(f->worst_id, sizeof f->worst_id, "%s", id);
        snprintf(f->worst_msg, sizeof f->worst_msg, "%s", msg);
    }
    if (f->arr) {
        json_t *o = json_object();
        json_object_set_new(o, "check", json_string(id));
        json_object_set_new(o, "severity", json_string(kvc__severity_name(sev)));
        json_object_set_new(o, "message", diag_jstr(msg));
        json_array_append_new(f->arr, o);
    }
    if (f->tab && !(f->quiet && sev <= KVC_SEV_INFO)) {
        const char *cells[3] = {sev >= KVC_SEV_DEGRADED
                                    ? (sev == KVC_SEV_BROKEN ? "BROKEN" : "DEGRADED")
                                    : kvc__severity_name(sev),
                                id, msg};
        diag_table_add(f->tab, cells);
    }
}

char *diag_findings_summary(const diag_findings *f, char *buf, size_t cap)
{
    snprintf(buf, cap, "%u broken, %u degraded, %u info, %u ok", f->count[KVC_SEV_BROKEN],
             f->count[KVC_SEV_DEGRADED], f->count[KVC_SEV_INFO], f->count[KVC_SEV_OK]);
    return buf;
}
