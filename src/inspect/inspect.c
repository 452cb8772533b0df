/*
 * inspect.c - looking inside a segment for kvcoord-diag (see inspect.h):
 * raw headers, lock state without locking, seqlock peeks of rank
 * descriptors, the invariant check, and the rebuild that repair runs.
 *
 * The check reads each table under its lock when the lock's owner is
 * alive, so what it sees is consistent.  When the owner died holding the
 * lock, nothing can be writing, so the state is read as the dead owner left
 * it - that is what an operator needs to see - and the lock is left for
 * `repair` (or the next locker) to recover.  When a live owner keeps the
 * lock past the timeout, only what is safe to read without it is checked.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "inspect.h"
#include "internal.h"

_Static_assert(KVC__LOCKS == KVC_LOCK_COUNT && KVC__LOCK_ID_RANKS == KVC_LOCK_RANKS &&
                   KVC__LOCK_ID_PROCS == KVC_LOCK_PROCS && KVC__LOCK_ID_ROOMS == KVC_LOCK_ROOMS,
               "inspect.h's lock ids follow layout.h");

/* Problems of one kind reported one by one up to this many; then counted. */
#define MAX_REPORTS 20
/* Seqlock retries of a peek before an odd counter is called stuck. */
#define PEEK_SPINS 200

const char *kvc__severity_name(kvc_severity s)
{
    static const char *const names[] = {"ok", "info", "degraded", "broken"};
    return (unsigned)s < 4 ? names[s] : "unknown";
}

int kvc__pid_alive(int32_t pid, uint64_t start) { return kvc__proc_alive(pid, start); }

/* ---- header ----------------------------------------------------------- */

void kvc__magic_text(uint64_t magic, char buf[9])
{
    for (int i = 0; i < 8; i++) {
        unsigned char c = (unsigned char)(magic >> (8 * i));
        buf[i] = c >= 0x20 && c < 0x7f ? (char)c : '.';
    }
    buf[8] = '\0';
}

static void fill_full(kvc_raw_header *o, const kvc_header *h)
{
    o->full = 1;
    o->rank_entry_size = h->rank_entry_size;
    o->proc_size = h->proc_size;
    o->lock_size = h->lock_size;
    o->block_size = h->block_size;
    o->room_size = h->room_size;
    o->total_bytes = h->total_size;
    o->max_ranks = h->max_ranks;
    o->max_procs = h->max_procs;
    o->world_size = h->world_size;
    o->max_rooms = h->max_rooms;
    o->room_slots = h->room_slots;
    o->room_ttl_ms = h->room_ttl_ms;
    o->max_info_bytes = h->max_info_bytes;
    o->arena_bytes = h->arena_bytes;
    o->arena_blocks = h->arena_blocks;
    o->created_ns = h->created_ns;
    o->updated_ns = atomic_load(&h->updated_ns);
}

static void fill_prefix(kvc_raw_header *o, const unsigned char *p)
{
    o->has_prefix = 1;
    memcpy(&o->magic, p + offsetof(kvc_header, magic), sizeof o->magic);
    memcpy(&o->layout_version, p + offsetof(kvc_header, layout_version), 4);
    memcpy(&o->header_size, p + offsetof(kvc_header, header_size), 4);
    memcpy(&o->creator_pid, p + offsetof(kvc_header, creator_pid), 4);
    memcpy(&o->creator_start, p + offsetof(kvc_header, creator_start), 8);
    o->magic_ok = o->magic == KVC_MAGIC;
    /* Without the magic the other bytes mean nothing: no pid is looked up. */
    o->creator_alive =
        o->magic_ok && o->creator_pid > 0 && kvc__proc_alive(o->creator_pid, o->creator_start);
}

/* Whole header of this build's layout, read with pread (never mapped). */
static void read_full(int fd, kvc_raw_header *o)
{
    if (!o->magic_ok || o->layout_version != KVC_LAYOUT_VERSION ||
        o->file_bytes < sizeof(kvc_header))
        return;
    kvc_header *h = malloc(sizeof *h);
    if (h && pread(fd, h, sizeof *h, 0) == (ssize_t)sizeof *h)
        fill_full(o, h);
    free(h);
}

const char *kvc__file_type(unsigned mode)
{
    switch (mode & S_IFMT) {
    case S_IFREG: return "regular file";
    case S_IFDIR: return "directory";
    case S_IFIFO: return "FIFO";
    case S_IFSOCK: return "socket";
    case S_IFLNK: return "symlink";
    case S_IFCHR: return "character device";
    case S_IFBLK: return "block device";
    }
    return "special file";
}

kvc_err kvc__header_read(const char *name, kvc_raw_header *out)
{
    memset(out, 0, sizeof *out);
    kvc_err e = kvc_name_check(name);
    if (e)
        return e;
    /* Never blocks (a FIFO put there would block a plain open forever) and
     * never follows a symlink (it could point anywhere). */
    char path[sizeof "/dev/shm/" + KVC_NAME_MAX];
    snprintf(path, sizeof path, "/dev/shm/%s", name);
    struct stat st;
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) {
        int err = errno;
        struct stat ls;
        if (err == ENOENT)
            return kvc__fail(KVC_E_NOENT, "no segment %s in /dev/shm", name);
        if (lstat(path, &ls) == 0) {
            out->has_stat = 1;
            out->file_bytes = (uint64_t)ls.st_size;
            out->file_mode = (uint32_t)(ls.st_mode & 07777);
            out->file_uid = (uint32_t)ls.st_uid;
            out->file_type = kvc__file_type(ls.st_mode);
        }
        if ((err == ELOOP || err == EMLINK) && out->has_stat && S_ISLNK(ls.st_mode)) {
            char to[256] = "?";
            ssize_t n = readlink(path, to, sizeof to - 1);
            if (n >= 0)
                to[n] = '\0';
            return kvc__fail(KVC_E_CORRUPT,
                             "%s is a symlink (to %s), not a segment: it is not followed", path,
                             to);
        }
        if (err == EACCES || err == EPERM)
            return kvc__fail(KVC_E_SYS,
                             "permission denied opening %s (mode %04o, owner uid %u; this "
                             "process runs as uid %u): run as its owner or root",
                             path, out->file_mode, out->file_uid, (unsigned)geteuid());
        return kvc__fail(KVC_E_SYS, "open(%s): %s", path, strerror(err));
    }
    if (fstat(fd, &st) < 0) {
        e = kvc__fail(KVC_E_SYS, "fstat(%s): %s", path, strerror(errno));
        close(fd);
        return e;
    }
    out->has_stat = 1;
    out->file_bytes = (uint64_t)st.st_size;
    out->file_mode = (uint32_t)(st.st_mode & 07777);
    out->file_uid = (uint32_t)st.st_uid;
    out->file_type = kvc__file_type(st.st_mode);
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return kvc__fail(KVC_E_CORRUPT, "%s is a %s, not a segment (a regular file)", path,
                         out->file_type);
    }
    /* A creator holds LOCK_EX while it initialises (segment.c). */
    if (flock(fd, LOCK_SH | LOCK_NB) < 0)
        out->creating = errno == EWOULDBLOCK;
    else
        flock(fd, LOCK_UN);
    unsigned char prefix[offsetof(kvc_header, creator_start) + sizeof(uint64_t)];
    if (pread(fd, prefix, sizeof prefix, 0) == (ssize_t)sizeof prefix) {
        fill_prefix(out, prefix);
        read_full(fd, out);
    }
    close(fd);
    return KVC_OK;
}

void kvc__header_of(kvc_segment *seg, kvc_raw_header *out)
{
    memset(out, 0, sizeof *out);
    struct stat st;
    out->file_bytes = seg->size;
    if (fstat(seg->fd, &st) == 0) {
        out->has_stat = 1;
        out->file_type = kvc__file_type(st.st_mode);
        out->file_bytes = (uint64_t)st.st_size;
        out->file_mode = (uint32_t)(st.st_mode & 07777);
        out->file_uid = (uint32_t)st.st_uid;
    }
    fill_prefix(out, (const unsigned char *)seg->hdr);
    fill_full(out, seg->hdr);
}

void kvc__close_reader(kvc_segment *seg)
{
    if (!seg)
        return;
    if (seg->proc_slot >= 0) {
        kvc_close(seg);
        return;
    }
    kvc__segment_free(seg);
}

/* ---- locks -------------------------------------------------------------- */

/* glibc keeps a robust mutex's state in the futex word __data.__lock (the
 * owner's TID, FUTEX_WAITERS, and FUTEX_OWNER_DIED, which the kernel sets -
 * clearing the TID - when the owner exits holding it) and in __data.__owner
 * (the owner's TID; INT_MAX while a locker that got EOWNERDEAD has not yet
 * called pthread_mutex_consistent; INT_MAX - 1 once unrecoverable).  Reading
 * them is the only way to learn the state without taking the lock. */
#define GLIBC_MUTEX_INCONSISTENT INT_MAX
#define GLIBC_MUTEX_NOTRECOVERABLE (INT_MAX - 1)

void kvc__lock_probe(kvc_segment *seg, int id, kvc_lock_probe *out)
{
    memset(out, 0, sizeof *out);
    out->name = kvc__lock_name(id);
    if (id < 0 || id >= KVC_LOCK_COUNT)
        return;
    kvc_lock *l = kvc__lock_ptr(seg, id);
    unsigned word = (unsigned)__atomic_load_n(&l->mutex.__data.__lock, __ATOMIC_ACQUIRE);
    int owner = __atomic_load_n(&l->mutex.__data.__owner, __ATOMIC_ACQUIRE);
    int32_t adv_pid = atomic_load(&l->owner_pid);
    uint64_t adv_start = atomic_load(&l->owner_start);
    int32_t tid = (int32_t)(word & FUTEX_TID_MASK);
    out->recoveries = atomic_load(&l->recoveries);
    out->waiters = (word & FUTEX_WAITERS) != 0;
    out->recovering = owner == GLIBC_MUTEX_INCONSISTENT;
    if (owner == GLIBC_MUTEX_NOTRECOVERABLE)
        out->state = KVC_LOCKST_NOTRECOVERABLE;
    else if (tid)
        out->state = KVC_LOCKST_HELD;
    else if (word & FUTEX_OWNER_DIED)
        out->state = KVC_LOCKST_OWNER_DIED;
    else
        return; /* free */
    /* The advisory owner fields name the process (the futex word only a
     * thread); glibc's __owner still names a dead owner's thread. */
    if (adv_pid > 0) {
        out->owner_pid = adv_pid;
        out->owner_start = adv_start;
    } else if (tid) {
        out->owner_pid = tid;
    } else if (owner > 0 && owner < GLIBC_MUTEX_NOTRECOVERABLE) {
        out->owner_pid = owner;
    }
    if (out->state == KVC_LOCKST_HELD && out->owner_pid)
        out->owner_alive =
            kvc__proc_alive(out->owner_pid, out->owner_start) || (tid && kvc__proc_alive(tid, 0));
}

char *kvc__lock_text(const kvc_lock_probe *p, char *buf, size_t cap)
{
    char who[48];
    if (p->owner_pid)
        snprintf(who, sizeof who, "pid %d", (int)p->owner_pid);
    else
        snprintf(who, sizeof who, "an unrecorded pid");
    switch (p->state) {
    case KVC_LOCKST_FREE: snprintf(buf, cap, "free"); break;
    case KVC_LOCKST_HELD:
        snprintf(buf, cap, "held by %s (%s)%s", who, p->owner_alive ? "alive" : "dead",
                 p->recovering ? ", recovering a dead owner's state" : "");
        break;
    case KVC_LOCKST_OWNER_DIED:
        snprintf(buf, cap, "owner %s died holding it; not recovered yet", who);
        break;
    case KVC_LOCKST_NOTRECOVERABLE:
        snprintf(buf, cap, "not recoverable (released without being made consistent)");
        break;
    }
    return buf;
}

kvc_err kvc__lock_cycle(kvc_segment *seg, int id, int *recovered)
{
    uint64_t before = atomic_load(&kvc__lock_ptr(seg, id)->recoveries);
    kvc_err e = kvc__lock(seg, id);
    if (e)
        return e;
    uint64_t after = atomic_load(&kvc__lock_ptr(seg, id)->recoveries);
    kvc__unlock(seg, id);
    if (recovered)
        *recovered = after != before;
    return KVC_OK;
}

kvc_err kvc__rebuild(kvc_segment *seg, int id, int *recovered)
{
    uint64_t before = atomic_load(&kvc__lock_ptr(seg, id)->recoveries);
    kvc_err e = kvc__lock(seg, id);
    if (e)
        return e;
    if (recovered)
        *recovered = atomic_load(&kvc__lock_ptr(seg, id)->recoveries) != before;
    /* Safe at any time under the lock: no writer is inside, so each
     * recovery function only recomputes what is derived. */
    kvc__lock_recover(seg, id);
    kvc__unlock(seg, id);
    return KVC_OK;
}

/* ---- rank descriptors --------------------------------------------------- */

static void peek_fill(kvc_rank_peek *o, uint64_t seq, uint32_t active, const kvc_rank_slot *sl)
{
    memset(o, 0, sizeof *o);
    o->seq = seq;
    o->active = active;
    o->state = sl->state;
    o->entries = sl->entries;
    o->generation = sl->generation;
    o->changed_ns = sl->changed_ns;
    o->pid = sl->pid;
    o->pid_start = sl->pid_start;
    o->session_len = sl->session_len;
    o->info_len = sl->info_len;
    o->blob_off = sl->blob_off;
    o->blob_blocks = sl->blob_blocks;
    o->owned = sl->owned;
}

/* The core's seqlock read, with at most spins retries of an odd counter. */
static kvc_err peek_entry(kvc_rank_entry *e, uint32_t rank, kvc_rank_peek *out, int spins)
{
    for (int tries = 0;; tries++) {
        kvc_rank_slot sl;
        uint64_t seq;
        uint32_t a;
        int r = kvc__rank_snapshot(e, &sl, &seq, &a);
        if (r == 0) {
            peek_fill(out, seq, a, &sl);
            return KVC_OK;
        }
        if (tries >= spins) {
            peek_fill(out, seq, a, &sl);
            return kvc__fail(KVC_E_BUSY, "rank %u: sequence counter stays odd (%llu)", rank,
                             (unsigned long long)seq);
        }
        sched_yield();
    }
}

static kvc_err peek(kvc_segment *seg, uint32_t rank, kvc_rank_peek *out, int spins)
{
    return peek_entry(&seg->ranks[rank], rank, out, spins);
}

kvc_err kvc__rank_peek(kvc_segment *seg, uint32_t rank, kvc_rank_peek *out)
{
    if (!seg || !out)
        return kvc__fail(KVC_E_INVAL, "kvc__rank_peek: NULL argument");
    if (rank >= seg->hdr->max_ranks)
        return kvc__fail(KVC_E_CAPACITY, "rank %u exceeds the segment's max ranks (%u)", rank,
                         seg->hdr->max_ranks);
    return peek(seg, rank, out, PEEK_SPINS);
}

/* ---- the check: reporting ----------------------------------------------- */

typedef struct check {
    kvc_segment *seg;
    kvc_check_fn fn;
    void *ctx;
    kvc_check_stats *st;
    kvc_severity worst;
} check;

/* Problems of one invariant: the first MAX_REPORTS are reported, the rest
 * counted; none at all gives one "ok" finding. */
typedef struct tally {
    const char *id;
    unsigned n;
    kvc_severity sev;
} tally;

static void emit(check *ck, kvc_severity sev, const char *id, const char *msg)
{
    if (sev > ck->worst)
        ck->worst = sev;
    if (ck->fn)
        ck->fn(ck->ctx, sev, id, msg);
}

__attribute__((format(printf, 4, 5))) static void say(check *ck, kvc_severity sev, const char *id,
                                                      const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    emit(ck, sev, id, msg);
}

__attribute__((format(printf, 4, 5))) static void problem(check *ck, tally *t, kvc_severity sev,
                                                          const char *fmt, ...)
{
    if (sev > t->sev)
        t->sev = sev;
    if (t->n++ >= MAX_REPORTS)
        return;
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    emit(ck, sev, t->id, msg);
}

/* Close a tally: "ok" with ok_msg when nothing was found. */
__attribute__((format(printf, 3, 4))) static void settle(check *ck, tally *t, const char *fmt, ...)
{
    char msg[512];
    if (t->n == 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof msg, fmt, ap);
        va_end(ap);
        emit(ck, KVC_SEV_OK, t->id, msg);
    } else if (t->n > MAX_REPORTS) {
        snprintf(msg, sizeof msg, "%u more problems of this kind not listed", t->n - MAX_REPORTS);
        emit(ck, t->sev, t->id, msg);
    }
}

/* ---- the check: header -------------------------------------------------- */

/* False when the file is shorter than the mapping: reading on would SIGBUS. */
static bool check_header(check *ck)
{
    kvc_raw_header h;
    kvc__header_of(ck->seg, &h);
    char magic[9];
    kvc__magic_text(h.magic, magic);
    say(ck, KVC_SEV_OK, "header.magic", "magic %s", magic);
    say(ck, KVC_SEV_OK, "header.version", "layout version %u, as this build", h.layout_version);
    say(ck, KVC_SEV_OK, "header.sizes",
        "structure sizes match this build (header %u, rank entry %u, proc %u, lock %u, room %u, "
        "block %u bytes) and the region offsets match the capacities",
        h.header_size, h.rank_entry_size, h.proc_size, h.lock_size, h.room_size, h.block_size);
    if (h.file_bytes < h.total_bytes) {
        say(ck, KVC_SEV_BROKEN, "header.file",
            "the file is %llu bytes but the header says %llu: truncated while attached; "
            "nothing more is read",
            (unsigned long long)h.file_bytes, (unsigned long long)h.total_bytes);
        return false;
    }
    if (h.file_bytes > h.total_bytes)
        say(ck, KVC_SEV_DEGRADED, "header.file",
            "the file is %llu bytes, more than the %llu the "
            "header says (extended by something else)",
            (unsigned long long)h.file_bytes, (unsigned long long)h.total_bytes);
    else
        say(ck, KVC_SEV_OK, "header.file", "file is %llu bytes, as the header says",
            (unsigned long long)h.file_bytes);
    if (h.creator_alive)
        say(ck, KVC_SEV_OK, "header.creator", "creator pid %d is running", (int)h.creator_pid);
    else
        say(ck, KVC_SEV_INFO, "header.creator",
            "creator pid %d is not running (the segment "
            "outlives it; a restarted kvcoordd reuses it)",
            (int)h.creator_pid);
    if (h.updated_ns < h.created_ns)
        say(ck, KVC_SEV_INFO, "header.times",
            "updated time is before the creation time "
            "(the clock was set back)");
    return true;
}

/* ---- the check: locks ----------------------------------------------------- */

enum access { LOCKED, UNLOCKED_DEAD, UNLOCKED_BUSY };

/* Decide how to read the table under lock id, report the lock, and take it
 * when its owner is not dead. */
static enum access take_q(check *ck, int id, int quiet);

static enum access take(check *ck, int id) { return take_q(ck, id, 0); }

/* quiet: no finding when the lock is fine (the room stripes: one summary). */
static enum access take_q(check *ck, int id, int quiet)
{
    char id_s[32], text[160];
    /* The room stripes report under one id, "locks.rooms". */
    snprintf(id_s, sizeof id_s, "locks.%s", id >= KVC_LOCK_ROOMS ? "rooms" : kvc__lock_name(id));
    kvc_lock_probe *p = &ck->st->locks[id];
    kvc__lock_probe(ck->seg, id, p);
    /* Held by a process that is gone: look again, in case it released the
     * lock and exited between our reads of the mutex and of its owner. */
    if (p->state == KVC_LOCKST_HELD && !p->owner_alive)
        kvc__lock_probe(ck->seg, id, p);
    kvc__lock_text(p, text, sizeof text);
    if (p->state == KVC_LOCKST_OWNER_DIED) {
        say(ck, KVC_SEV_BROKEN, id_s,
            "%s lock: %s; the state under it is read as left "
            "(the next locker, or `repair`, recovers it)",
            kvc__lock_name(id), text);
        return UNLOCKED_DEAD;
    }
    if (p->state == KVC_LOCKST_NOTRECOVERABLE ||
        (p->state == KVC_LOCKST_HELD && !p->owner_alive && !p->recovering)) {
        say(ck, KVC_SEV_BROKEN, id_s, "%s lock: %s", kvc__lock_name(id), text);
        return UNLOCKED_DEAD;
    }
    uint64_t before = p->recoveries;
    kvc_err e = kvc__lock(ck->seg, id);
    if (e == KVC_E_BUSY) {
        kvc__lock_probe(ck->seg, id, p);
        kvc__lock_text(p, text, sizeof text);
        say(ck, KVC_SEV_DEGRADED, id_s,
            "%s lock: %s for over %u ms (stuck?); what needs the "
            "lock was not checked",
            kvc__lock_name(id), text, ck->seg->lock_timeout_ms);
        return UNLOCKED_BUSY;
    }
    if (e) {
        say(ck, KVC_SEV_BROKEN, id_s, "%s lock: %s", kvc__lock_name(id), kvc_last_error());
        return UNLOCKED_DEAD;
    }
    if (atomic_load(&kvc__lock_ptr(ck->seg, id)->recoveries) != before) {
        ck->st->recovered_while_checking = 1;
        say(ck, KVC_SEV_INFO, id_s, "%s lock: its owner died while being checked; recovered",
            kvc__lock_name(id));
    } else if (!quiet) {
        say(ck, KVC_SEV_OK, id_s, "%s lock: %s (%llu recoveries since creation)",
            kvc__lock_name(id), p->state == KVC_LOCKST_FREE ? "free" : "taken and released",
            (unsigned long long)p->recoveries);
    }
    return LOCKED;
}

static void give(check *ck, int id, enum access a)
{
    if (a == LOCKED)
        kvc__unlock(ck->seg, id);
}

/* ---- the check: ranks and the arena -------------------------------------- */

typedef struct blob {
    uint64_t first, blocks; /* in blocks */
    uint32_t rank;
} blob;

static int blob_cmp(const void *a, const void *b)
{
    const blob *x = a, *y = b;
    return x->first < y->first ? -1 : x->first > y->first;
}

/* Why a published registered descriptor is unusable, or NULL. */
static const char *slot_problem(const kvc_segment *seg, const kvc_rank_peek *p)
{
    if (p->active > 1)
        return "active index is neither 0 nor 1";
    if (p->state > KVC_RANK_WITHDRAWN)
        return "state is not empty, registered or withdrawn";
    if (p->state != KVC_RANK_REGISTERED)
        return NULL;
    /* 0: a parallelism config (kept in the other rank tables) */
    if (p->session_len > KVC_SESSION_ID_MAX)
        return "session_id length out of range";
    if (p->blob_blocks == 0 || !kvc__arena_range_ok(seg, p->blob_off, p->blob_blocks))
        return "info blob outside the arena";
    if (p->info_len > seg->hdr->max_info_bytes)
        return "info longer than max info bytes";
    if (p->session_len + p->info_len > p->blob_blocks * KVC_BLOCK)
        return "info longer than its blob";
    return NULL;
}

typedef struct rank_scan {
    tally seq, slot, owner;
    blob *blobs;
    uint32_t nblobs;
} rank_scan;

static void scan_rank(check *ck, rank_scan *rs, uint32_t r, enum access a)
{
    kvc_rank_peek p;
    /* Under the lock (or a dead owner's) nothing moves: one read is exact. */
    peek(ck->seg, r, &p, a == UNLOCKED_BUSY ? PEEK_SPINS : 0);
    if (p.seq & 1) {
        ck->st->ranks_odd++;
        problem(ck, &rs->seq, KVC_SEV_BROKEN,
                "rank %u: sequence counter is odd (%llu): a writer "
                "died inside the publish window; readers wait, then recover it by taking the lock",
                r, (unsigned long long)p.seq);
    }
    const char *why = slot_problem(ck->seg, &p);
    if (why) {
        problem(ck, &rs->slot, KVC_SEV_BROKEN, "rank %u: published descriptor invalid: %s", r, why);
        return;
    }
    if (p.state == KVC_RANK_WITHDRAWN)
        ck->st->ranks_withdrawn++;
    if (p.state != KVC_RANK_REGISTERED)
        return;
    ck->st->ranks_registered++;
    rs->blobs[rs->nblobs++] = (blob){p.blob_off / KVC_BLOCK, p.blob_blocks, r};
    if (p.owned && !kvc__pid_alive_in(ck->seg, p.pid, p.pid_start))
        problem(ck, &rs->owner, KVC_SEV_DEGRADED,
                "rank %u is registered by worker pid %d, which "
                "is not running: lookups hand out a dead session until it is reaped (by kvcoordd "
                "or `repair`)",
                r, (int)p.pid);
}

/* The role and parallelism tables (layout.h): their blobs share the arena,
 * so they count as published info; their descriptors must be valid too. */
static void scan_other_tables(check *ck, rank_scan *rs, enum access a)
{
    uint32_t max = ck->seg->hdr->max_ranks;
    for (unsigned t = 1; t < KVC_RANK_TABLES; t++) {
        for (uint32_t r = 0; r < max; r++) {
            kvc_rank_peek p;
            peek_entry(&ck->seg->ranks[(uint64_t)t * max + r], r, &p,
                       a == UNLOCKED_BUSY ? PEEK_SPINS : 0);
            const char *why = slot_problem(ck->seg, &p);
            if (why)
                problem(ck, &rs->slot, KVC_SEV_BROKEN,
                        "rank %u of rank table %u: published descriptor invalid: %s", r, t, why);
            else if (p.state == KVC_RANK_REGISTERED)
                rs->blobs[rs->nblobs++] = (blob){p.blob_off / KVC_BLOCK, p.blob_blocks, r};
        }
    }
}

static void check_overlap(check *ck, rank_scan *rs)
{
    tally t = {"ranks.overlap", 0, KVC_SEV_OK};
    qsort(rs->blobs, rs->nblobs, sizeof *rs->blobs, blob_cmp);
    for (uint32_t i = 1; i < rs->nblobs; i++) {
        const blob *x = &rs->blobs[i - 1], *y = &rs->blobs[i];
        if (x->first + x->blocks > y->first)
            problem(ck, &t, KVC_SEV_BROKEN, "ranks %u and %u share arena blocks from %llu", x->rank,
                    y->rank, (unsigned long long)y->first);
    }
    settle(ck, &t, "the info of the %u registered ranks occupies disjoint arena blocks",
           rs->nblobs);
}

/* Bits of word w that the published blobs cover (blobs sorted; *k advances). */
static uint64_t expected_word(const rank_scan *rs, uint32_t *k, uint64_t w)
{
    uint64_t lo = w * 64, hi = lo + 64, mask = 0;
    while (*k < rs->nblobs && rs->blobs[*k].first + rs->blobs[*k].blocks <= lo)
        (*k)++;
    for (uint32_t j = *k; j < rs->nblobs && rs->blobs[j].first < hi; j++) {
        uint64_t a = rs->blobs[j].first > lo ? rs->blobs[j].first : lo;
        uint64_t b = rs->blobs[j].first + rs->blobs[j].blocks;
        if (b > hi)
            b = hi;
        for (uint64_t i = a; i < b; i++)
            mask |= 1ull << (i - lo);
    }
    return mask;
}

static void check_arena(check *ck, rank_scan *rs)
{
    const kvc_header *h = ck->seg->hdr;
    uint64_t words = (h->arena_blocks + 63) / 64, leaked = 0, unmarked = 0, marked = 0, pub = 0;
    uint32_t k = 0;
    for (uint64_t w = 0; w < words; w++) {
        uint64_t want = expected_word(rs, &k, w), got = atomic_load(&ck->seg->bitmap[w]);
        marked += (uint64_t)__builtin_popcountll(got);
        pub += (uint64_t)__builtin_popcountll(want);
        leaked += (uint64_t)__builtin_popcountll(got & ~want);
        unmarked += (uint64_t)__builtin_popcountll(want & ~got);
    }
    ck->st->arena_marked_blocks = marked;
    ck->st->arena_published_blocks = pub;
    if (unmarked)
        say(ck, KVC_SEV_BROKEN, "arena.bitmap",
            "%llu blocks of published rank info are free in "
            "the bitmap: the next registration may overwrite them",
            (unsigned long long)unmarked);
    if (leaked)
        say(ck, KVC_SEV_DEGRADED, "arena.bitmap",
            "%llu blocks are marked in use but hold no "
            "published info (leaked by a writer that died before publishing; recovery rebuilds "
            "the bitmap)",
            (unsigned long long)leaked);
    if (!unmarked && !leaked)
        say(ck, KVC_SEV_OK, "arena.bitmap",
            "the bitmap marks exactly the %llu blocks of "
            "published rank info",
            (unsigned long long)pub);
    uint64_t used = atomic_load(&h->arena_used_blocks);
    if (used != marked)
        say(ck, KVC_SEV_DEGRADED, "arena.used",
            "arena_used_blocks is %llu but %llu blocks are "
            "marked (derived count; recovery rebuilds it)",
            (unsigned long long)used, (unsigned long long)marked);
    else
        say(ck, KVC_SEV_OK, "arena.used", "arena_used_blocks (%llu) matches the bitmap",
            (unsigned long long)used);
}

static void check_ranks(check *ck)
{
    const kvc_header *h = ck->seg->hdr;
    enum access a = take(ck, KVC_LOCK_RANKS);
    rank_scan rs = {{"ranks.seq", 0, 0}, {"ranks.slot", 0, 0}, {"ranks.owner", 0, 0}, NULL, 0};
    rs.blobs = malloc((size_t)h->max_ranks * KVC_RANK_TABLES * sizeof *rs.blobs);
    if (!rs.blobs) {
        give(ck, KVC_LOCK_RANKS, a);
        say(ck, KVC_SEV_BROKEN, "ranks.seq", "out of memory checking %u ranks", h->max_ranks);
        return;
    }
    for (uint32_t r = 0; r < h->max_ranks; r++)
        scan_rank(ck, &rs, r, a);
    scan_other_tables(ck, &rs, a);
    settle(ck, &rs.seq, "sequence counters of all %u rank entries are even", h->max_ranks);
    settle(ck, &rs.slot, "published descriptors are valid (%u registered, %u withdrawn)",
           ck->st->ranks_registered, ck->st->ranks_withdrawn);
    settle(ck, &rs.owner, "no registered rank belongs to a dead worker");
    check_overlap(ck, &rs);
    if (a == UNLOCKED_BUSY) {
        say(ck, KVC_SEV_INFO, "arena.bitmap", "not checked: the ranks lock is busy");
    } else {
        uint32_t counted = atomic_load(&h->ranks_registered);
        if (counted != ck->st->ranks_registered)
            say(ck, KVC_SEV_BROKEN, "ranks.count",
                "ranks_registered is %u but %u entries are "
                "registered (derived count; recovery rebuilds it)",
                counted, ck->st->ranks_registered);
        else
            say(ck, KVC_SEV_OK, "ranks.count", "ranks_registered (%u) matches the entries",
                counted);
        check_arena(ck, &rs);
    }
    give(ck, KVC_LOCK_RANKS, a);
    free(rs.blobs);
}

/* ---- the check: processes ---------------------------------------------- */

static void check_procs(check *ck)
{
    const kvc_header *h = ck->seg->hdr;
    enum access a = take(ck, KVC_LOCK_PROCS);
    tally alive = {"procs.alive", 0, 0}, entry = {"procs.entry", 0, 0};
    for (uint32_t i = 0; i < h->max_procs; i++) {
        const kvc_proc *p = &ck->seg->procs[i];
        int32_t pid = atomic_load(&p->pid);
        if (pid == 0)
            continue;
        ck->st->procs_attached++;
        if (pid < 0 || p->role < 0 || p->role > KVC_ROLE_CLIENT || p->rank < -1)
            problem(ck, &entry, KVC_SEV_BROKEN,
                    "process entry %u is invalid (pid %d, role %d, "
                    "rank %d)",
                    i, (int)pid, (int)p->role, (int)p->rank);
        /* Its liveness lock (liveness.c), right in any PID namespace. */
        if (kvc__proc_slot_state(ck->seg, (int32_t)i, atomic_load(&p->gen)) != KVC__SLOT_DEAD) {
            ck->st->procs_alive++;
            continue;
        }
        ck->st->procs_dead++;
        problem(ck, &alive, KVC_SEV_DEGRADED,
                "pid %d (%s, rank %d) is not running but still "
                "attached; reaping it (kvcoordd, or `repair`) fails its rooms and withdraws its "
                "ranks",
                (int)pid, kvc_role_name((kvc_role)p->role), (int)p->rank);
    }
    give(ck, KVC_LOCK_PROCS, a);
    settle(ck, &entry, "%u process entries are well-formed", ck->st->procs_attached);
    settle(ck, &alive, "all %u attached processes are running", ck->st->procs_attached);
}

/* ---- the check: rooms ---------------------------------------------------- */

/* Slot gi (global index) is the one its room's probe finds (the core's). */
static bool reachable(kvc_segment *seg, uint32_t gi)
{
    return kvc__room_find(seg, seg->rooms[gi].id) == &seg->rooms[gi];
}

typedef struct room_scan {
    tally slot, probe, fields, ranks, live, ttl, seq, undo, count, locks;
    uint32_t used, expired_done, stripes_checked, stripes_busy, stripe_used, lock_findings;
    uint64_t now; /* CLOCK_MONOTONIC: the TTL's clock */
} room_scan;

static const char *room_fields_problem(const kvc_room *r)
{
    if (r->terminal != -1 && r->terminal != KVC_POLL_FAILED && r->terminal != KVC_POLL_SUCCESS)
        return "terminal state is not -1, Failed or Success";
    if (r->has_failure > 1)
        return "has_failure is neither 0 nor 1";
    if (r->has_failure && r->terminal != KVC_POLL_FAILED)
        return "has a failure record but is not Failed";
    if (r->terminal == KVC_POLL_FAILED && !r->has_failure)
        return "is Failed without a failure record";
    for (uint32_t i = 0; i < r->participants && i < KVC_ROOM_MAX_PARTICIPANTS; i++)
        if (r->part[i].state < -1 || r->part[i].state > KVC_POLL_SUCCESS)
            return "a participant's KVPoll state is out of range";
    return NULL;
}

static void scan_live(check *ck, room_scan *rs, const kvc_room *r)
{
    uint64_t ttl_ns = (uint64_t)ck->seg->hdr->room_ttl_ms * 1000000ull;
    if (r->terminal >= 0) {
        if (rs->now > r->updated_mono + ttl_ns)
            rs->expired_done++;
        return;
    }
    for (uint32_t i = 0; i < r->participants; i++) {
        const kvc_room_part *p = &r->part[i];
        bool dead = p->proc_slot >= 0 ? kvc__proc_slot_state(ck->seg, p->proc_slot, p->proc_gen) !=
                                            KVC__SLOT_ALIVE
                                      : !kvc__proc_alive(p->pid, p->start);
        if (p->pid && !p->released && dead) {
            problem(ck, &rs->live, KVC_SEV_DEGRADED,
                    "room %llu: rank %u (pid %d) is not running "
                    "but the room is not failed yet (its next reader fails it; so does `repair`)",
                    (unsigned long long)r->id, i, (int)p->pid);
            return;
        }
    }
    if (rs->now > r->updated_mono + ttl_ns)
        problem(ck, &rs->ttl, KVC_SEV_DEGRADED,
                "room %llu (%s) is idle past its TTL of %u ms; "
                "the next sweep fails and reclaims it",
                (unsigned long long)r->id, kvc_poll_name(kvc__room_state(r)),
                ck->seg->hdr->room_ttl_ms);
}

static void scan_room(check *ck, room_scan *rs, uint32_t i, bool dead_owner)
{
    const kvc_room *r = &ck->seg->rooms[i];
    uint32_t q = atomic_load(&r->seq);
    if (q & 1)
        problem(ck, &rs->seq, dead_owner ? KVC_SEV_BROKEN : KVC_SEV_DEGRADED,
                "room slot %u: its sequence counter is odd (%u) with no writer inside: %s", i, q,
                dead_owner ? "its writer died; the stripe's recovery evens it"
                           : "readers take the stripe lock for it");
    if (r->slot > KVC_SLOT_TOMB) {
        problem(ck, &rs->slot, KVC_SEV_BROKEN,
                "room slot %u has state %u (not free, used or "
                "deleted)",
                i, r->slot);
        return;
    }
    if (r->slot != KVC_SLOT_USED)
        return;
    rs->used++;
    rs->stripe_used++;
    if (!reachable(ck->seg, i))
        problem(ck, &rs->probe, KVC_SEV_BROKEN,
                "room %llu in slot %u is not found by its probe "
                "sequence (or its id is duplicated)",
                (unsigned long long)r->id, i);
    if (r->participants < 1 || r->participants > KVC_ROOM_MAX_PARTICIPANTS ||
        r->participants > ck->seg->hdr->max_ranks) {
        problem(ck, &rs->ranks, KVC_SEV_BROKEN,
                "room %llu has %u participants: it references "
                "ranks outside 0..%u",
                (unsigned long long)r->id, r->participants,
                (ck->seg->hdr->max_ranks < KVC_ROOM_MAX_PARTICIPANTS ? ck->seg->hdr->max_ranks
                                                                     : KVC_ROOM_MAX_PARTICIPANTS) -
                    1);
        return;
    }
    const char *why = room_fields_problem(r);
    if (why) {
        problem(ck, &rs->fields, KVC_SEV_BROKEN, "room %llu: %s", (unsigned long long)r->id, why);
        return;
    }
    ck->st->rooms_by_state[kvc__room_state(r)]++;
    scan_live(ck, rs, r);
}

static void check_failure_ring(check *ck)
{
    const kvc_header *h = ck->seg->hdr;
    uint64_t total = atomic_load(&h->failures_total),
             kept = total < KVC_FAILURE_RING ? total : KVC_FAILURE_RING, claimed = 0;
    tally t = {"failures.ring", 0, 0};
    ck->st->failures_total = total;
    for (uint64_t k = 0; k < kept; k++) {
        const kvc_failure_slot *f = &ck->seg->failures[k];
        uint64_t c = atomic_load(&f->claim);
        if ((c >> 32) & 1) {
            claimed++;
            continue; /* being written (or its writer died: its stripe recovers it) */
        }
        if (!memchr(f->rec.reason, '\0', sizeof f->rec.reason))
            problem(ck, &t, KVC_SEV_BROKEN, "failure record %llu: reason not terminated",
                    (unsigned long long)k);
    }
    settle(ck, &t, "%llu failure records ever, the last %llu kept", (unsigned long long)total,
           (unsigned long long)kept);
    if (claimed)
        say(ck, KVC_SEV_INFO, "failures.ring",
            "%llu ring entries are being written (or await their stripe's recovery)",
            (unsigned long long)claimed);
}

/* Stripe s under its lock (or as its dead owner left it): slots, undo
 * record, count. */
static void check_stripe(check *ck, room_scan *rs, uint32_t s)
{
    const kvc_room_stripe *st = &ck->seg->stripes[s];
    int recovered_before = ck->st->recovered_while_checking;
    enum access a = take_q(ck, KVC_LOCK_ROOMS + (int)s, 1);
    if (a != LOCKED || ck->st->recovered_while_checking != recovered_before)
        rs->lock_findings++; /* take_q said so */
    if (a == UNLOCKED_BUSY) {
        rs->stripes_busy++;
        return;
    }
    rs->stripes_checked++;
    rs->stripe_used = 0;
    uint32_t n = ck->seg->hdr->stripe_slots;
    for (uint32_t i = 0; i < n; i++)
        scan_room(ck, rs, s * n + i, a == UNLOCKED_DEAD);
    if (atomic_load(&st->undo.valid))
        problem(ck, &rs->undo, KVC_SEV_BROKEN,
                "room stripe %u: the undo record is valid: a room update was "
                "interrupted by its writer's death; recovery rolls it back",
                s);
    if (st->rooms_live != rs->stripe_used)
        problem(ck, &rs->count, KVC_SEV_BROKEN,
                "room stripe %u: rooms_live is %u but %u slots are in use (recovery recounts it)",
                s, st->rooms_live, rs->stripe_used);
    give(ck, KVC_LOCK_ROOMS + (int)s, a);
}

static void check_rooms(check *ck)
{
    const kvc_header *h = ck->seg->hdr;
    room_scan rs = {.slot = {"rooms.slot", 0, 0},
                    .probe = {"rooms.probe", 0, 0},
                    .fields = {"rooms.fields", 0, 0},
                    .ranks = {"rooms.ranks", 0, 0},
                    .live = {"rooms.liveness", 0, 0},
                    .ttl = {"rooms.ttl", 0, 0},
                    .seq = {"rooms.seq", 0, 0},
                    .undo = {"rooms.undo", 0, 0},
                    .count = {"rooms.count", 0, 0},
                    .now = kvc__seg_mono_ns()};
    for (uint32_t s = 0; s < KVC_ROOM_STRIPES; s++)
        check_stripe(ck, &rs, s);
    if (rs.stripes_busy == KVC_ROOM_STRIPES) {
        say(ck, KVC_SEV_INFO, "rooms.slot", "rooms not checked: the rooms locks are busy");
        return;
    }
    ck->st->rooms_counted = rs.stripes_busy == 0;
    ck->st->rooms_live = rs.used;
    uint64_t recov = 0;
    for (uint32_t s = 0; s < KVC_ROOM_STRIPES; s++)
        recov += atomic_load(&ck->seg->stripes[s].lock.recoveries);
    if (!rs.lock_findings)
        say(ck, KVC_SEV_OK, "locks.rooms",
            "%u room stripe locks: free, or taken and released (%llu recoveries since "
            "creation)",
            KVC_ROOM_STRIPES, (unsigned long long)recov);
    if (rs.stripes_busy)
        say(ck, KVC_SEV_INFO, "rooms.slot",
            "%u of %u room stripes not checked: their locks are busy", rs.stripes_busy,
            KVC_ROOM_STRIPES);
    settle(ck, &rs.undo, "no interrupted room update (every stripe's undo record clear)");
    settle(ck, &rs.count, "every stripe's rooms_live matches its slots in use (%u in all)",
           rs.used);
    settle(ck, &rs.seq, "every room's sequence counter is even (no writer inside)");
    settle(ck, &rs.slot, "all %u room slots hold a valid slot state", h->room_slots);
    settle(ck, &rs.probe, "every room in use is found by its probe sequence");
    settle(ck, &rs.ranks, "every room's participants are ranks within the table");
    settle(ck, &rs.fields, "room states and failure records are consistent");
    settle(ck, &rs.live, "no active room waits on a dead participant");
    settle(ck, &rs.ttl, "no active room is idle past its TTL");
    if (rs.expired_done)
        say(ck, KVC_SEV_INFO, "rooms.ttl",
            "%u finished rooms are past their TTL (reclaimed by "
            "the next sweep)",
            rs.expired_done);
    check_failure_ring(ck);
}

kvc_severity kvc__check(kvc_segment *seg, kvc_check_fn fn, void *ctx, kvc_check_stats *stats)
{
    kvc_check_stats local;
    check ck = {seg, fn, ctx, stats ? stats : &local, KVC_SEV_OK};
    memset(ck.st, 0, sizeof *ck.st);
    for (int i = 0; i < KVC_LOCK_COUNT; i++)
        ck.st->locks[i].name = kvc__lock_name(i);
    if (!check_header(&ck))
        return ck.worst;
    check_ranks(&ck);
    check_procs(&ck);
    check_rooms(&ck);
    return ck.worst;
}
