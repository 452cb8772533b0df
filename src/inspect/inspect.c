/*
 * inspect.c - looking inside a segment for kvcoord-diag (see inspect.h):
 * raw headers, lock state without locking, and the rebuild that repair
 * runs.  The invariant check (kvc__check) is in inspect_check.c,
 * inspect_ranks.c (with the seqlock peeks of rank descriptors) and
 * inspect_rooms.c, sharing inspect_internal.h.
 *
 * Lock rule: of the segment's locks only kvc__lock_cycle and kvc__rebuild
 * take one (the one they are given, then release it); the lock probes read
 * a mutex's words without locking, and kvc__header_read only tries a
 * shared flock of the file to see whether a creator is initialising it.
 * Called by kvcoord-diag, kvcoord-torture, kvcoordd's main() and tests.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
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

const char *kvc__severity_name(kvc_severity s)
{
    static const char *const names[] = {"ok", "info", "degraded", "broken"};
    return (unsigned)s < 4 ? names[s] : "unknown";
}

int kvc__pid_alive(int32_t pid, uint64_t start) { return kvc__proc_alive(pid, start); }

/* pid runs but is stopped: state T (SIGSTOP) or t (a tracer) in /proc. */
static int pid_stopped(int32_t pid)
{
    kvc_proc_stat st;
    return pid > 0 && kvc_proc_stat_read(pid, &st) == KVC_OK &&
           (st.state == 'T' || st.state == 't');
}

int32_t kvc__adopter(kvc_segment *seg, int32_t creator_pid)
{
    for (uint32_t i = 0; seg && seg->procs && i < seg->hdr->max_procs; i++) {
        const kvc_proc *p = &seg->procs[i];
        int32_t pid = atomic_load(&p->pid);
        if (pid <= 0 || p->role != KVC_ROLE_DAEMON ||
            kvc__proc_slot_state(seg, (int32_t)i, atomic_load(&p->gen)) == KVC__SLOT_DEAD)
            continue;
        int32_t shown = p->shown_pid > 0 ? p->shown_pid : pid;
        if (shown != creator_pid)
            return shown;
    }
    return 0;
}

int kvc__pid_stopped(int32_t pid, uint64_t start)
{
    return pid > 0 && kvc__proc_alive(pid, start) && pid_stopped(pid);
}

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
    o->creator_stopped = o->creator_alive && pid_stopped(o->creator_pid);
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
    /* The owning thread's state: a stopped process's threads are all 'T'. */
    if (out->owner_alive)
        out->owner_stopped = pid_stopped(tid ? tid : out->owner_pid);
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
        snprintf(buf, cap, "held by %s (%s)%s", who,
                 p->owner_stopped ? "stopped: state T, SIGSTOP or a debugger"
                 : p->owner_alive ? "alive"
                                  : "dead",
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
