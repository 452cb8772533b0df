/*
 * liveness.c - whether an attached process is alive, whatever PID or time
 * namespace it runs in, and the namespace-free clock of the segment's
 * stamps.
 *
 * Liveness lock.  Each process-table slot in use is held by its process
 * through an open file description (OFD) lock (fcntl F_OFD_SETLK, a write
 * lock on the slot's first byte in the segment file) taken on a descriptor
 * of its own, the holder, opened for it alone.  The kernel owns that lock
 * on behalf of the open file description, not of a pid: it goes when the
 * last descriptor of the description closes, that is when the process
 * dies (however it dies), or when the process releases it (its last
 * handle's kvc_close).  Any process that maps the segment tests it with
 * F_OFD_GETLK on its own descriptor (one system call, no /proc, no pid),
 * so the test gives the same answer in every PID namespace, time
 * namespace or container sharing /dev/shm.  Why not a robust mutex held
 * for the attachment's lifetime: its owner is a thread, so a thread that
 * attached and then ended would look dead (Python threads do), and only
 * its next locker learns it (EOWNERDEAD), not a tester.
 *
 * fork(): the child shares the holder's description, so it would keep a
 * dead parent "alive".  The child closes its copy of every holder at once
 * (pthread_atfork child handler, in session.c, which knows the handles;
 * closing never releases the parent's lock: only the last close of the
 * description, or an explicit unlock, does, and the child never unlocks).
 * A fork that runs no atfork handler (a raw clone(2)) must exec or exit:
 * the holder is O_CLOEXEC.  A process that closes descriptors it did not
 * open (a blanket close of every fd above 2, without exec) drops its own
 * lock and is then taken for dead.
 *
 * Time namespaces (unshare -T) offset CLOCK_MONOTONIC and CLOCK_BOOTTIME
 * per namespace.  Every stamp the segment keeps on the monotonic clock
 * (room TTLs, the watcher's beat, liveness re-check times) is on the host's
 * clock: this process's own offset (/proc/self/timens_offsets) subtracted.
 * Process start times (/proc/PID/stat field 22) are likewise shown shifted
 * by the reader's boottime offset; kvc__boot_offset_ticks() undoes it.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "internal.h"

/* ---- time namespaces --------------------------------------------------- */

static _Atomic int offsets_read;   /* 0: not read yet (again after fork) */
static _Atomic int64_t mono_off;   /* ns */
static _Atomic int64_t boot_ticks; /* clock ticks */
static pthread_once_t offsets_once = PTHREAD_ONCE_INIT;

/* A fork child may be in another time namespace (its parent unshared one). */
static void offsets_forget(void) { atomic_store(&offsets_read, 0); }
static void offsets_init(void) { pthread_atfork(NULL, NULL, offsets_forget); }

static void offsets_load(void)
{
    pthread_once(&offsets_once, offsets_init);
    int64_t mono = 0, boot = 0;
    FILE *f = fopen("/proc/self/timens_offsets", "re");
    if (f) {
        char name[32];
        long long s, ns;
        while (fscanf(f, "%31s %lld %lld", name, &s, &ns) == 3) {
            int64_t v = (int64_t)s * 1000000000ll + ns;
            if (!strcmp(name, "monotonic"))
                mono = v;
            else if (!strcmp(name, "boottime"))
                boot = v;
        }
        fclose(f);
    }
    long hz = sysconf(_SC_CLK_TCK);
    if (hz <= 0)
        hz = 100;
    atomic_store(&mono_off, mono);
    atomic_store(&boot_ticks, boot / (1000000000ll / hz));
    atomic_store_explicit(&offsets_read, 1, memory_order_release);
}

int64_t kvc__mono_offset_ns(void)
{
    if (!atomic_load_explicit(&offsets_read, memory_order_acquire))
        offsets_load();
    return atomic_load_explicit(&mono_off, memory_order_relaxed);
}

int64_t kvc__boot_offset_ticks(void)
{
    if (!atomic_load_explicit(&offsets_read, memory_order_acquire))
        offsets_load();
    return atomic_load_explicit(&boot_ticks, memory_order_relaxed);
}

uint64_t kvc__seg_mono_ns(void) { return kvc__mono_ns() - (uint64_t)kvc__mono_offset_ns(); }
uint64_t kvc__seg_mono_coarse_ns(void)
{
    return kvc__mono_coarse_ns() - (uint64_t)kvc__mono_offset_ns();
}

/* ---- identity ------------------------------------------------------------ */

static uint64_t ns_inode(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 ? (uint64_t)st.st_ino : 0;
}

void kvc__self_identity(int32_t *shown_pid, uint64_t *pid_ns, uint64_t *time_ns)
{
    *shown_pid = (int32_t)getpid();
    *pid_ns = ns_inode("/proc/self/ns/pid");
    *time_ns = ns_inode("/proc/self/ns/time");
    /* NSpid: the pid in every namespace from /proc's down to its own; the
     * first is what a process using this /proc (the host's, when shared)
     * calls it. */
    FILE *f = fopen("/proc/self/status", "re");
    if (!f)
        return;
    char line[256];
    while (fgets(line, sizeof line, f)) {
        int v;
        if (!strncmp(line, "NSpid:", 6) && sscanf(line + 6, "%d", &v) == 1 && v > 0) {
            *shown_pid = v;
            break;
        }
    }
    fclose(f);
}

/* ---- the liveness lock ----------------------------------------------------- */

static off_t slot_byte(const kvc_segment *seg, int32_t slot)
{
    return (off_t)(seg->hdr->procs_off + (uint64_t)slot * sizeof(kvc_proc));
}

/* A new open file description of the segment's file (not a dup: a dup
 * shares seg->fd's description, which fork children and kvc_close of this
 * handle would then hold or drop). */
static int open_holder(kvc_segment *seg)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/self/fd/%d", seg->fd);
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0)
        fd = shm_open(seg->name, O_RDWR | O_CLOEXEC | O_NONBLOCK, 0);
    if (fd < 0)
        return -1;
    struct stat a, b;
    if (fstat(fd, &a) || fstat(seg->fd, &b) || a.st_ino != b.st_ino || a.st_dev != b.st_dev) {
        close(fd);
        errno = ESTALE; /* the name now holds another file */
        return -1;
    }
    return fd;
}

kvc_err kvc__liveness_hold(kvc_segment *seg, int32_t slot, int *holder)
{
    int fd = open_holder(seg);
    if (fd < 0)
        return kvc__fail(KVC_E_SYS, "segment %s: cannot open its file for the liveness lock: %s",
                         seg->name, strerror(errno));
    struct flock fl = {
        .l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = slot_byte(seg, slot), .l_len = 1};
    if (fcntl(fd, F_OFD_SETLK, &fl) < 0) {
        int err = errno;
        close(fd);
        if (err == EAGAIN || err == EACCES)
            return KVC_E_BUSY; /* held by another description: not a free slot */
        return kvc__fail(KVC_E_SYS, "segment %s: fcntl(F_OFD_SETLK) of process slot %d: %s",
                         seg->name, (int)slot, strerror(err));
    }
    *holder = fd;
    return KVC_OK;
}

/* Whether fd is a descriptor of seg's file. */
static bool of_segment(const kvc_segment *seg, int fd)
{
    struct stat a;
    return fd >= 0 && fstat(fd, &a) == 0 && (uint64_t)a.st_ino == seg->file_ino &&
           (uint64_t)a.st_dev == seg->file_dev;
}

void kvc__liveness_release(kvc_segment *seg, int32_t slot, int holder)
{
    /* Only a descriptor of this same file is ours to unlock and close. */
    if (!of_segment(seg, holder))
        return;
    struct flock fl = {
        .l_type = F_UNLCK, .l_whence = SEEK_SET, .l_start = slot_byte(seg, slot), .l_len = 1};
    fcntl(holder, F_OFD_SETLK, &fl); /* a fork child's copy must not keep it */
    close(holder);
}

void kvc__liveness_forget_child(kvc_segment *seg, int32_t slot, int32_t parent)
{
    /* Only the entry of the process that forked: a handle it inherited
     * itself names its own parent's entry, whose holder number means
     * nothing here (its own fork handler closed that descriptor). */
    if (!seg->hdr || seg->pid != parent || slot < 0 || (uint32_t)slot >= seg->max_procs)
        return;
    kvc_proc *p = &seg->procs[slot];
    int holder = p->holder_fd;
    /* Close only: the lock stays the parent's. */
    if (atomic_load(&p->pid) == parent && holder != seg->fd && of_segment(seg, holder))
        close(holder);
}

bool kvc__liveness_held(kvc_segment *seg, int32_t slot)
{
    struct flock fl = {
        .l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = slot_byte(seg, slot), .l_len = 1};
    if (fcntl(seg->fd, F_OFD_GETLK, &fl) < 0)
        return true; /* cannot tell: never call a process dead on a failed test */
    return fl.l_type != F_UNLCK;
}

/* seen_alive[slot % KVC__SEEN_ALIVE_SLOTS]: the slot's high bits (12:
 * slots below 2^20, KVC_LIMIT_MAX_PROCS), the gen's low 20 bits (a slot is
 * not re-taken 2^20 times within the period an entry is trusted) and the
 * ms of the test (kvc__seg_mono_coarse_ns, as the room readers'), in one word. */
static uint64_t seen_key(int32_t slot, uint32_t gen)
{
    return ((uint64_t)((uint32_t)slot / KVC__SEEN_ALIVE_SLOTS) & 0xfff) << 52 |
           (uint64_t)(gen & 0xfffff) << 32;
}

static void note_alive(kvc_segment *seg, int32_t slot, uint32_t gen)
{
    uint32_t ms = (uint32_t)(kvc__seg_mono_coarse_ns() / 1000000); /* the room readers' clock */
    atomic_store_explicit(&seg->seen_alive[(uint32_t)slot % KVC__SEEN_ALIVE_SLOTS],
                          seen_key(slot, gen) | ms, memory_order_relaxed);
}

bool kvc__proc_seen_alive(kvc_segment *seg, int32_t slot, uint32_t gen, uint32_t now_ms)
{
    if (slot < 0 || (uint32_t)slot >= seg->max_procs)
        return false;
    uint64_t w = atomic_load_explicit(&seg->seen_alive[(uint32_t)slot % KVC__SEEN_ALIVE_SLOTS],
                                      memory_order_relaxed);
    return w && (w & ~0xffffffffull) == seen_key(slot, gen) &&
           (uint32_t)(now_ms - (uint32_t)w) < KVC__LIVENESS_RECHECK_MS;
}

kvc_slot_state kvc__proc_slot_state(kvc_segment *seg, int32_t slot, uint32_t gen)
{
    if (slot < 0 || (uint32_t)slot >= seg->max_procs)
        return KVC__SLOT_GONE;
    kvc_proc *p = &seg->procs[slot];
    uint32_t g = atomic_load_explicit(&p->gen, memory_order_acquire);
    int32_t pid = atomic_load_explicit(&p->pid, memory_order_acquire);
    if (pid == 0 || g != gen)
        return KVC__SLOT_GONE;
    if (kvc__liveness_held(seg, slot)) {
        note_alive(seg, slot, gen);
        return KVC__SLOT_ALIVE;
    }
    /* The lock was free.  Its owner unpublishes the entry (pid 0) before
     * it unlocks, so an entry still published with the same gen after the
     * test is a process that died. */
    if (atomic_load_explicit(&p->pid, memory_order_acquire) != pid ||
        atomic_load_explicit(&p->gen, memory_order_acquire) != g)
        return KVC__SLOT_GONE;
    return KVC__SLOT_DEAD;
}

bool kvc__pid_alive_in(kvc_segment *seg, int32_t pid, uint64_t start)
{
    for (uint32_t i = 0; i < seg->max_procs; i++) {
        kvc_proc *p = &seg->procs[i];
        if (atomic_load_explicit(&p->pid, memory_order_acquire) == pid && p->start == start)
            return kvc__proc_slot_state(seg, (int32_t)i, atomic_load(&p->gen)) != KVC__SLOT_DEAD;
    }
    return kvc__proc_alive(pid, start);
}
