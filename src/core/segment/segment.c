/*
 * segment.c - create, attach, validate and remove the shared-memory segment.
 *
 * Creation: shm_open(O_EXCL) → flock(LOCK_EX) → fchmod → ftruncate → mmap →
 * initialise → store the magic last → unlock.  An attacher takes
 * flock(LOCK_SH), so it never sees a half-initialised segment while its
 * creator runs; a creator that died mid-way released its flock with its
 * last fd and left no magic, so the segment is seen as invalid and
 * recreated under the same name (the count of segments never grows).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "internal.h"

#define ALIGN_UP(x, a) (((x) + (uint64_t)(a)-1) / (uint64_t)(a) * (uint64_t)(a))

KVC_API void kvc_options_init(kvc_options *o)
{
    if (!o)
        return;
    memset(o, 0, sizeof *o);
    o->name = NULL;
    o->mode = KVC_OPEN_ATTACH;
    o->role = KVC_ROLE_CLIENT;
    o->rank = -1;
    o->max_ranks = 1024;
    o->max_info_bytes = 16ull << 20;
    o->arena_bytes = 1ull << 30;
    o->max_procs = 4096;
    o->world_size = 8;
    o->perm = 0600;
    o->lock_timeout_ms = 2000;
    o->max_rooms = 32768;
    o->room_ttl_ms = 300000; /* sglang's SGLANG_DISAGGREGATION_WAITING_TIMEOUT default */
}

KVC_API kvc_err kvc_name_for_port(uint16_t port, char *buf, size_t cap)
{
    KVC_ARG(buf);
    int n = snprintf(buf, cap, "kvcoord-%u", (unsigned)port);
    if (n < 0 || (size_t)n >= cap)
        return kvc__fail(KVC_E_INVAL, "kvc_name_for_port: buffer of %zu bytes too small", cap);
    return KVC_OK;
}

KVC_API kvc_err kvc_name_check(const char *name)
{
    if (!name)
        return kvc__fail(KVC_E_INVAL, "segment name is NULL");
    if (!*name)
        return kvc__fail(KVC_E_INVAL, "segment name is empty");
    size_t len = strlen(name);
    if (len > KVC_NAME_MAX)
        return kvc__fail(KVC_E_INVAL, "segment name is %zu bytes, the limit is %d", len,
                         KVC_NAME_MAX);
    if (!strcmp(name, ".") || !strcmp(name, ".."))
        return kvc__fail(KVC_E_INVAL, "segment name '%s' is not allowed", name);
    if (name[0] == '-') /* would read as an option to every tool that takes it */
        return kvc__fail(KVC_E_INVAL, "segment name '%s' starts with '-'", name);
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)name[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '_' || c == '-'))
            return kvc__fail(
                KVC_E_INVAL,
                "segment name has byte 0x%02x at offset %zu; allowed: A-Z a-z 0-9 . _ -", c, i);
    }
    return KVC_OK;
}

/* The layout computed from capacities: the creator stores it, an attacher
 * recomputes it and compares, so a header with inconsistent numbers is
 * refused rather than trusted. */
struct geometry {
    uint64_t ranks_off, procs_off, stripes_off, index_off, rooms_off, failures_off, coll_off,
        pd_off, bitmap_off, arena_off, arena_blocks, total;
    uint32_t room_slots, stripe_slots;
};

static struct geometry geometry_of(uint32_t max_ranks, uint32_t max_procs, uint32_t max_rooms,
                                   uint64_t arena_bytes)
{
    struct geometry g;
    g.arena_blocks = (arena_bytes + KVC_BLOCK - 1) / KVC_BLOCK;
    /* A stripe holds its share of max rooms with a quarter to spare, plus
     * room for a stripe that gets more than its share (up to 32 more, or
     * every room when max rooms is small), plus one slot that stays free. */
    uint64_t share = ((uint64_t)max_rooms * 5 / 4 + KVC_ROOM_STRIPES - 1) / KVC_ROOM_STRIPES;
    g.stripe_slots = (uint32_t)(share + (max_rooms < 32 ? max_rooms : 32) + 1);
    g.room_slots = g.stripe_slots * KVC_ROOM_STRIPES;
    g.ranks_off = ALIGN_UP(sizeof(kvc_header), KVC_ALIGN);
    g.procs_off = ALIGN_UP(
        g.ranks_off + (uint64_t)max_ranks * KVC_RANK_TABLES * sizeof(kvc_rank_entry), KVC_ALIGN);
    g.stripes_off = ALIGN_UP(g.procs_off + (uint64_t)max_procs * sizeof(kvc_proc), KVC_ALIGN);
    g.index_off =
        ALIGN_UP(g.stripes_off + (uint64_t)KVC_ROOM_STRIPES * sizeof(kvc_room_stripe), KVC_ALIGN);
    g.rooms_off = ALIGN_UP(g.index_off + (uint64_t)g.room_slots * sizeof(uint64_t), KVC_ALIGN);
    g.failures_off = ALIGN_UP(g.rooms_off + (uint64_t)g.room_slots * sizeof(kvc_room), KVC_ALIGN);
    g.coll_off =
        ALIGN_UP(g.failures_off + (uint64_t)KVC_FAILURE_RING * sizeof(kvc_failure_slot), KVC_ALIGN);
    g.pd_off = ALIGN_UP(g.coll_off + (uint64_t)KVC_COLL_GROUPS * sizeof(kvc_coll_group), KVC_ALIGN);
    g.bitmap_off = ALIGN_UP(g.pd_off + sizeof(kvc_pd_region), KVC_ALIGN);
    g.arena_off = ALIGN_UP(g.bitmap_off + (g.arena_blocks + 63) / 64 * 8, KVC_ALIGN);
    g.total = g.arena_off + g.arena_blocks * KVC_BLOCK;
    return g;
}

_Static_assert(KVC_LIMIT_ARENA_MIN == KVC_BLOCK, "the smallest arena is one block");

static kvc_err check_options(const kvc_options *o)
{
    if (o->max_ranks < 1 || o->max_ranks > KVC_LIMIT_MAX_RANKS)
        return kvc__fail(KVC_E_INVAL, "max ranks %u out of range 1..%u", o->max_ranks,
                         KVC_LIMIT_MAX_RANKS);
    if (o->max_procs < 1 || o->max_procs > KVC_LIMIT_MAX_PROCS)
        return kvc__fail(KVC_E_INVAL, "max procs %u out of range 1..%u", o->max_procs,
                         KVC_LIMIT_MAX_PROCS);
    if (o->world_size < 1 || o->world_size > o->max_ranks)
        return kvc__fail(KVC_E_INVAL, "world size %u out of range 1..%u (max ranks)", o->world_size,
                         o->max_ranks);
    if (o->arena_bytes < KVC_LIMIT_ARENA_MIN || o->arena_bytes > KVC_LIMIT_ARENA_MAX)
        return kvc__fail(KVC_E_INVAL, "arena of %llu bytes out of range %llu..2^40",
                         (unsigned long long)o->arena_bytes, KVC_LIMIT_ARENA_MIN);
    if (o->max_info_bytes < KVC_LIMIT_INFO_MIN || o->max_info_bytes > o->arena_bytes / 2)
        return kvc__fail(KVC_E_INVAL,
                         "max info bytes %llu out of range %llu..%llu (half the arena: a "
                         "re-registration holds old and new info at once)",
                         (unsigned long long)o->max_info_bytes, KVC_LIMIT_INFO_MIN,
                         (unsigned long long)o->arena_bytes / 2);
    if (o->max_rooms < 1 || o->max_rooms > KVC_LIMIT_MAX_ROOMS)
        return kvc__fail(KVC_E_INVAL, "max rooms %u out of range 1..%u", o->max_rooms,
                         KVC_LIMIT_MAX_ROOMS);
    if (o->room_ttl_ms < 1)
        return kvc__fail(KVC_E_INVAL, "room TTL must be at least 1 ms");
    if (o->lock_timeout_ms < 1 || o->lock_timeout_ms > KVC_LIMIT_LOCK_TIMEOUT_MS)
        return kvc__fail(KVC_E_INVAL, "lock timeout %u ms out of range 1..%u ms",
                         o->lock_timeout_ms, (unsigned)KVC_LIMIT_LOCK_TIMEOUT_MS);
    return KVC_OK;
}

static kvc_err init_mutex(pthread_mutex_t *m)
{
    pthread_mutexattr_t a;
    int r = pthread_mutexattr_init(&a);
    if (!r)
        r = pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
    if (!r)
        r = pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST);
    if (!r)
        r = pthread_mutex_init(m, &a);
    pthread_mutexattr_destroy(&a);
    if (r)
        return kvc__fail(KVC_E_SYS, "pthread_mutex_init (robust, process-shared): %s", strerror(r));
    return KVC_OK;
}

/* Map [off, off+len) of the segment into this process now.  A failure's
 * path writes the stripe's undo record and a failure-ring slot, and a page
 * of either first touched there is a page fault inside kvc_room_fail(),
 * before the waiters are woken (13 of a fresh segment's first 50 failures
 * in bench_python.py's failure run).  These two tables are small (about 30
 * and 80 pages), so every handle maps them at once; the room table
 * (megabytes) is left to fault in as rooms are opened, off the failure
 * path.  The pages exist already
 * (kvc__reserve), so this allocates nothing; a kernel without
 * MADV_POPULATE_WRITE (before 5.14) gets a read of each page instead. */
static void prefault(kvc_segment *seg, uint64_t off, uint64_t len)
{
    uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);
    uint64_t lo = off / page * page, hi = ALIGN_UP(off + len, page);
    if (hi > seg->size)
        hi = seg->size / page * page;
    if (lo >= hi)
        return;
#ifdef MADV_POPULATE_WRITE
    if (madvise(seg->base + lo, hi - lo, MADV_POPULATE_WRITE) == 0)
        return;
#endif
    for (uint64_t o = lo; o < hi; o += page)
        (void)*(volatile const unsigned char *)(seg->base + o);
}

static void bind_regions(kvc_segment *seg)
{
    kvc_header *h = seg->hdr;
    seg->max_procs = h->max_procs;
    struct stat st;
    if (fstat(seg->fd, &st) == 0) {
        seg->file_ino = (uint64_t)st.st_ino;
        seg->file_dev = (uint64_t)st.st_dev;
    }
    seg->ranks = (kvc_rank_entry *)(seg->base + h->ranks_off);
    seg->procs = (kvc_proc *)(seg->base + h->procs_off);
    seg->stripes = (kvc_room_stripe *)(seg->base + h->stripes_off);
    seg->rooms = (kvc_room *)(seg->base + h->rooms_off);
    seg->room_index = (_Atomic uint64_t *)(seg->base + h->index_off);
    seg->failures = (kvc_failure_slot *)(seg->base + h->failures_off);
    seg->coll = (kvc_coll_group *)(seg->base + h->coll_off);
    seg->pd = (kvc_pd_region *)(seg->base + h->pd_off);
    seg->bitmap = (_Atomic uint64_t *)(seg->base + h->bitmap_off);
    seg->arena = seg->base + h->arena_off;
    prefault(seg, h->stripes_off, (uint64_t)KVC_ROOM_STRIPES * sizeof(kvc_room_stripe));
    prefault(seg, h->failures_off, (uint64_t)KVC_FAILURE_RING * sizeof(kvc_failure_slot));
}

static kvc_err map_fd(kvc_segment *seg, size_t size)
{
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, seg->fd, 0);
    if (p == MAP_FAILED)
        return kvc__fail(KVC_E_SYS, "mmap of segment %s (%zu bytes): %s", seg->name, size,
                         strerror(errno));
    seg->base = p;
    seg->size = size;
    seg->hdr = p;
    return KVC_OK;
}

static void unmap(kvc_segment *seg)
{
    if (seg->base)
        munmap(seg->base, seg->size);
    seg->base = NULL;
    seg->hdr = NULL;
    if (seg->fd >= 0)
        close(seg->fd);
    seg->fd = -1;
}

static kvc_err init_header(kvc_segment *seg, const kvc_options *o, const struct geometry *g)
{
    kvc_header *h = seg->hdr;
    h->layout_version = KVC_LAYOUT_VERSION;
    h->header_size = sizeof(kvc_header);
    h->creator_pid = seg->pid;
    h->creator_start = seg->start;
    h->rank_entry_size = sizeof(kvc_rank_entry);
    h->proc_size = sizeof(kvc_proc);
    h->lock_size = sizeof(kvc_lock);
    h->block_size = KVC_BLOCK;
    h->room_size = sizeof(kvc_room);
    h->stripe_size = sizeof(kvc_room_stripe);
    h->max_rooms = o->max_rooms;
    h->room_slots = g->room_slots;
    h->stripe_slots = g->stripe_slots;
    h->stripes_off = g->stripes_off;
    h->room_ttl_ms = o->room_ttl_ms;
    h->rooms_off = g->rooms_off;
    h->index_off = g->index_off;
    h->failures_off = g->failures_off;
    h->coll_off = g->coll_off;
    h->coll_group_size = sizeof(kvc_coll_group);
    h->pd_off = g->pd_off;
    h->pd_size = sizeof(kvc_pd_region);
    h->total_size = g->total;
    h->max_ranks = o->max_ranks;
    h->max_procs = o->max_procs;
    h->world_size = o->world_size;
    h->max_info_bytes = o->max_info_bytes;
    h->arena_blocks = g->arena_blocks;
    h->arena_bytes = g->arena_blocks * KVC_BLOCK;
    h->ranks_off = g->ranks_off;
    h->procs_off = g->procs_off;
    h->bitmap_off = g->bitmap_off;
    h->arena_off = g->arena_off;
    h->created_ns = kvc__now_ns();
    atomic_store(&h->updated_ns, h->created_ns);
    snprintf(h->role_names[0], sizeof h->role_names[0], "%s", KVC_DEFAULT_ROLE);
    atomic_store(&h->roles_used, 1);
    for (int i = 0; i < KVC_LOCK_COUNT; i++) {
        kvc_err e = init_mutex(&kvc__lock_ptr(seg, i)->mutex);
        if (e)
            return e;
    }
    /* The file was zero-filled by ftruncate: every rank entry is EMPTY with
     * an even sequence, every process slot free, the bitmap clear. */
    atomic_store_explicit(&h->magic, KVC_MAGIC, memory_order_release);
    return KVC_OK;
}

/* Give [off, off+len) of the segment file real pages now, so that touching
 * them later can never SIGBUS when /dev/shm is full: tmpfs files are sparse,
 * and a page that cannot be had at first touch kills the process. */
kvc_err kvc__reserve(kvc_segment *seg, uint64_t off, uint64_t len, const char *what)
{
    int r = posix_fallocate(seg->fd, (off_t)off, (off_t)len);
    if (r == 0)
        return KVC_OK;
    struct statvfs vfs;
    unsigned long long avail = 0;
    if (fstatvfs(seg->fd, &vfs) == 0)
        avail = (unsigned long long)vfs.f_bavail * vfs.f_frsize;
    return kvc__fail(r == ENOSPC ? KVC_E_FULL : KVC_E_SYS,
                     "no room in /dev/shm for %llu bytes of segment %s for %s: %s (%llu bytes "
                     "free there)",
                     (unsigned long long)len, seg->name, what, strerror(r), avail);
}

/* Create a new segment; KVC_E_EXISTS (no message) when the name is taken. */
static kvc_err create_new(kvc_segment *seg, const kvc_options *o)
{
    struct geometry g = geometry_of(o->max_ranks, o->max_procs, o->max_rooms, o->arena_bytes);
    seg->fd = shm_open(seg->name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, o->perm);
    if (seg->fd < 0) {
        if (errno == EEXIST)
            return KVC_E_EXISTS;
        return kvc__fail(KVC_E_SYS, "shm_open(%s, O_CREAT|O_EXCL): %s", seg->name, strerror(errno));
    }
    kvc_err e = KVC_OK;
    if (flock(seg->fd, LOCK_EX) < 0)
        e = kvc__fail(KVC_E_SYS, "flock(%s): %s", seg->name, strerror(errno));
    else if (fchmod(seg->fd, o->perm) < 0) /* exact mode, whatever the umask */
        e = kvc__fail(KVC_E_SYS, "fchmod(%s, %o): %s", seg->name, (unsigned)o->perm,
                      strerror(errno));
    else if (ftruncate(seg->fd, (off_t)g.total) < 0)
        e = kvc__fail(KVC_E_SYS, "ftruncate(%s, %llu bytes): %s", seg->name,
                      (unsigned long long)g.total, strerror(errno));
    else
        e = kvc__reserve(seg, 0, g.arena_off, "its tables (lower max rooms or max procs)");
    if (!e)
        e = map_fd(seg, g.total);
    if (!e) {
        seg->stripes = (kvc_room_stripe *)(seg->base + g.stripes_off);
        seg->pd = (kvc_pd_region *)(seg->base + g.pd_off);
        e = init_header(seg, o, &g);
    }
    if (e) {
        shm_unlink(seg->name);
        unmap(seg);
        return e;
    }
    flock(seg->fd, LOCK_UN);
    bind_regions(seg);
    return KVC_OK;
}

static kvc_err validate(kvc_segment *seg, uint64_t file_size)
{
    const kvc_header *h = seg->hdr;
    if (atomic_load_explicit(&h->magic, memory_order_acquire) != KVC_MAGIC)
        return kvc__fail(KVC_E_CORRUPT,
                         "segment %s has no valid magic (not a kvcoord segment, or "
                         "its creator died while initialising it)",
                         seg->name);
    if (h->layout_version != KVC_LAYOUT_VERSION)
        return kvc__fail(KVC_E_VERSION,
                         "segment %s has layout version %u; this build of kvcoord uses layout "
                         "version %u",
                         seg->name, h->layout_version, KVC_LAYOUT_VERSION);
    if (h->header_size != sizeof(kvc_header) || h->rank_entry_size != sizeof(kvc_rank_entry) ||
        h->proc_size != sizeof(kvc_proc) || h->lock_size != sizeof(kvc_lock) ||
        h->block_size != KVC_BLOCK || h->room_size != sizeof(kvc_room) ||
        h->stripe_size != sizeof(kvc_room_stripe) || h->coll_group_size != sizeof(kvc_coll_group) ||
        h->pd_size != sizeof(kvc_pd_region))
        return kvc__fail(KVC_E_VERSION,
                         "segment %s (layout version %u) was built with other structure sizes "
                         "(header %u, rank entry %u, proc %u, lock %u, block %u, room %u) than "
                         "this build (layout version %u: %zu, %zu, %zu, %zu, %u, %zu)",
                         seg->name, h->layout_version, h->header_size, h->rank_entry_size,
                         h->proc_size, h->lock_size, h->block_size, h->room_size,
                         KVC_LAYOUT_VERSION, sizeof(kvc_header), sizeof(kvc_rank_entry),
                         sizeof(kvc_proc), sizeof(kvc_lock), KVC_BLOCK, sizeof(kvc_room));
    /* Every field that sizes a table or indexes one is checked against
     * the limits a creator enforces (check_options) before the geometry
     * it implies is recomputed: a header written over after creation is
     * refused here, never read out of bounds later. */
    if (h->max_ranks < 1 || h->max_ranks > KVC_LIMIT_MAX_RANKS || h->max_procs < 1 ||
        h->max_procs > KVC_LIMIT_MAX_PROCS || h->max_rooms < 1 ||
        h->max_rooms > KVC_LIMIT_MAX_ROOMS || h->world_size < 1 || h->world_size > h->max_ranks ||
        h->arena_bytes < KVC_LIMIT_ARENA_MIN || h->arena_bytes > KVC_LIMIT_ARENA_MAX ||
        h->max_info_bytes < KVC_LIMIT_INFO_MIN || h->max_info_bytes > h->arena_bytes / 2 ||
        h->arena_bytes != h->arena_blocks * KVC_BLOCK || h->roles_used < 1 ||
        h->roles_used > KVC_RANK_ROLES)
        return kvc__fail(KVC_E_CORRUPT,
                         "segment %s has an inconsistent header (a capacity out of range: max "
                         "ranks %u, max procs %u, max rooms %u, world size %u, arena %llu bytes, "
                         "max info %llu bytes, roles %u)",
                         seg->name, h->max_ranks, h->max_procs, h->max_rooms, h->world_size,
                         (unsigned long long)h->arena_bytes, (unsigned long long)h->max_info_bytes,
                         (unsigned)h->roles_used);
    struct geometry g = geometry_of(h->max_ranks, h->max_procs, h->max_rooms, h->arena_bytes);
    if (g.total != h->total_size || g.ranks_off != h->ranks_off || g.procs_off != h->procs_off ||
        g.rooms_off != h->rooms_off || g.index_off != h->index_off ||
        g.failures_off != h->failures_off || g.coll_off != h->coll_off || g.pd_off != h->pd_off ||
        g.room_slots != h->room_slots || g.stripe_slots != h->stripe_slots ||
        g.stripes_off != h->stripes_off || h->room_ttl_ms < 1 || g.bitmap_off != h->bitmap_off ||
        g.arena_off != h->arena_off || g.arena_blocks != h->arena_blocks)
        return kvc__fail(KVC_E_CORRUPT,
                         "segment %s has an inconsistent header (capacities do "
                         "not match region offsets)",
                         seg->name);
    if (file_size != h->total_size)
        return kvc__fail(KVC_E_CORRUPT,
                         "segment %s is %llu bytes but its header says %llu "
                         "(truncated or extended)",
                         seg->name, (unsigned long long)file_size,
                         (unsigned long long)h->total_size);
    return KVC_OK;
}

static kvc_err flock_bounded(kvc_segment *seg, int how)
{
    uint64_t deadline = kvc__mono_ns() + (uint64_t)seg->lock_timeout_ms * 1000000ull;
    for (;;) {
        if (flock(seg->fd, how | LOCK_NB) == 0)
            return KVC_OK;
        if (errno != EWOULDBLOCK && errno != EINTR)
            return kvc__fail(KVC_E_SYS, "flock(%s): %s", seg->name, strerror(errno));
        if (kvc__mono_ns() >= deadline)
            return kvc__fail(KVC_E_BUSY,
                             "segment %s is still being created after %u ms (its "
                             "creator holds the creation lock; is it stopped?)",
                             seg->name, seg->lock_timeout_ms);
        usleep(1000);
    }
}

/* Attach to an existing segment.  KVC_E_NOENT (with message) if missing. */
static kvc_err attach(kvc_segment *seg)
{
    /* O_NONBLOCK: a FIFO under the segment's name must not block the open
     * (shm_open adds O_NOFOLLOW: a symlink is refused with ELOOP). */
    seg->fd = shm_open(seg->name, O_RDWR | O_CLOEXEC | O_NONBLOCK, 0);
    if (seg->fd < 0) {
        if (errno == ENOENT)
            return kvc__fail(KVC_E_NOENT, "no segment %s in /dev/shm (is kvcoordd running?)",
                             seg->name);
        if (errno == ELOOP)
            return kvc__fail(KVC_E_CORRUPT, "/dev/shm/%s is a symlink, not a segment", seg->name);
        int open_errno = errno;
        struct stat dst;
        char dpath[sizeof seg->name + 16];
        snprintf(dpath, sizeof dpath, "/dev/shm/%s", seg->name);
        if ((open_errno == EISDIR || open_errno == EINVAL) && lstat(dpath, &dst) == 0 &&
            S_ISDIR(dst.st_mode)) /* shm_open(O_RDWR) of a directory fails with EINVAL */
            return kvc__fail(KVC_E_CORRUPT, "/dev/shm/%s is a directory, not a segment", seg->name);
        if (open_errno == EACCES)
            return kvc__fail(KVC_E_SYS,
                             "/dev/shm/%s: permission denied (the segment is mode "
                             "0600: run as its owner)",
                             seg->name);
        return kvc__fail(KVC_E_SYS, "shm_open(%s): %s", seg->name, strerror(open_errno));
    }
    struct stat st;
    if (fstat(seg->fd, &st) == 0 && !S_ISREG(st.st_mode)) {
        unmap(seg);
        return kvc__fail(KVC_E_CORRUPT, "/dev/shm/%s is not a regular file (mode 0%o)", seg->name,
                         (unsigned)st.st_mode);
    }
    /* Waits only while a live creator initialises (a dead one's flock is
     * gone), and at most the lock timeout: a stopped creator is reported. */
    kvc_err fe = flock_bounded(seg, LOCK_SH);
    if (fe) {
        unmap(seg);
        return fe;
    }
    kvc_err e = KVC_OK;
    /* A size of 0 is a creator between shm_open(O_EXCL) and its flock: give
     * it the lock timeout to take the lock before calling the file invalid. */
    for (uint32_t waited = 0;; waited++) {
        if (fstat(seg->fd, &st) < 0 || st.st_size != 0 || waited >= seg->lock_timeout_ms)
            break;
        flock(seg->fd, LOCK_UN);
        usleep(1000);
        if (flock_bounded(seg, LOCK_SH))
            break;
    }
    if (fstat(seg->fd, &st) < 0)
        e = kvc__fail(KVC_E_SYS, "fstat(%s): %s", seg->name, strerror(errno));
    else if ((uint64_t)st.st_size < sizeof(kvc_header))
        e = kvc__fail(KVC_E_CORRUPT, "segment %s is %lld bytes, shorter than a header (%zu)",
                      seg->name, (long long)st.st_size, sizeof(kvc_header));
    if (!e)
        e = map_fd(seg, (size_t)st.st_size);
    if (!e)
        e = validate(seg, (uint64_t)st.st_size);
    if (e) {
        unmap(seg);
        return e;
    }
    flock(seg->fd, LOCK_UN);
    bind_regions(seg);
    return KVC_OK;
}

/* Read the stable header prefix of an existing segment: whether its
 * creator is alive.  False when unreadable. */
static bool creator_alive(const char *name)
{
    int fd = shm_open(name, O_RDONLY | O_CLOEXEC | O_NONBLOCK, 0); /* a FIFO must not block */
    if (fd < 0)
        return false;
    kvc_header h;
    bool alive = false;
    if (pread(fd, &h, offsetof(kvc_header, creator_start) + sizeof h.creator_start, 0) > 0)
        alive = kvc__proc_alive(h.creator_pid, h.creator_start);
    close(fd);
    return alive;
}

/* Refuse to discard a segment another live process created (its daemon):
 * replacing it under a running coordinator splits the node in two. */
static kvc_err check_not_live(const char *name)
{
    int fd = shm_open(name, O_RDONLY | O_CLOEXEC | O_NONBLOCK, 0); /* a FIFO must not block */
    if (fd < 0)
        return KVC_OK;
    kvc_header h;
    kvc_err e = KVC_OK;
    if (pread(fd, &h, offsetof(kvc_header, creator_start) + sizeof h.creator_start, 0) > 0 &&
        h.creator_pid != (int32_t)getpid() && kvc__proc_alive(h.creator_pid, h.creator_start))
        e = kvc__fail(KVC_E_EXISTS,
                      "segment %s is in use: its creator, pid %d, is running (stop "
                      "it first, or use another segment name)",
                      name, (int)h.creator_pid);
    close(fd);
    return e;
}

/* FRESH over an existing segment: refuse (KVC_E_EXISTS, naming them)
 * while other processes are attached to it, unless force; a forced one,
 * or one with nobody attached, is marked discarded before it is unlinked,
 * so any process still attached (or attaching meanwhile) gets KVC_E_STALE
 * at its next call instead of writing where nobody serves. */
static kvc_err discard_old(kvc_segment *seg, bool force)
{
    kvc_segment old;
    memset(&old, 0, sizeof old);
    snprintf(old.name, sizeof old.name, "%s", seg->name);
    old.fd = -1;
    old.proc_slot = -1;
    old.pid = seg->pid;
    old.lock_timeout_ms = seg->lock_timeout_ms;
    if (attach(&old) != KVC_OK)
        return KVC_OK; /* none, or not a valid segment: nothing attached to warn */
    char names[400] = "";
    size_t len = 0, others = 0;
    for (uint32_t i = 0; i < old.max_procs; i++) {
        kvc_proc *p = &old.procs[i];
        int32_t pid = atomic_load(&p->pid);
        if (!pid || (pid == seg->pid && p->start == seg->start && p->pid_ns == seg->pid_ns) ||
            kvc__proc_slot_state(&old, (int32_t)i, atomic_load(&p->gen)) != KVC__SLOT_ALIVE)
            continue;
        others++;
        if (len < sizeof names - 64) {
            int n = snprintf(names + len, sizeof names - len, "%spid %d (%s", len ? ", " : "",
                             (int)(p->shown_pid ? p->shown_pid : pid),
                             kvc_role_name((kvc_role)p->role));
            if (n > 0)
                len += (size_t)n;
            n = p->rank >= 0 ? snprintf(names + len, sizeof names - len, ", rank %d)", p->rank)
                             : snprintf(names + len, sizeof names - len, ")");
            if (n > 0)
                len += (size_t)n;
        }
    }
    kvc_err e = KVC_OK;
    if (others && !force)
        e = kvc__fail(KVC_E_EXISTS,
                      "segment %s has %zu other attached process%s: %s%s; stop %s first, or "
                      "discard the segment under %s (kvcoordd --force-fresh, "
                      "KVC_OPEN_FRESH_FORCE): %s next call then fails",
                      seg->name, others, others == 1 ? "" : "es", names,
                      len >= sizeof names - 64 ? ", ..." : "", others == 1 ? "it" : "them",
                      others == 1 ? "it" : "them", others == 1 ? "its" : "their");
    else
        atomic_store(&old.hdr->discarded, 1);
    unmap(&old);
    return e;
}

static kvc_err open_create(kvc_segment *seg, const kvc_options *o)
{
    for (int attempt = 0; attempt < 3; attempt++) {
        kvc_err e = create_new(seg, o);
        if (e != KVC_E_EXISTS)
            return e;
        e = attach(seg);
        if (e == KVC_OK || e == KVC_E_SYS || e == KVC_E_BUSY)
            return e;
        if (e == KVC_E_NOENT)
            continue; /* removed under us: create again */
        if (e == KVC_E_VERSION && creator_alive(seg->name))
            return kvc__fail(KVC_E_EXISTS,
                             "%s; its creator is still running, so it is left "
                             "alone (stop it, or remove the segment with kvcoord-diag unlink)",
                             kvc_last_error());
        /* Invalid, or another layout version whose creator is dead: replace
         * it under the same name. */
        shm_unlink(seg->name);
    }
    return kvc__fail(KVC_E_SYS, "could not create segment %s: it kept being replaced", seg->name);
}

/* Map seg (its name, pid, start and lock timeout set by the caller) as
 * opts->mode says. */
kvc_err kvc__segment_map(kvc_segment *seg, const kvc_options *opts)
{
    kvc_err e;
    switch (opts->mode) {
    case KVC_OPEN_ATTACH: return attach(seg);
    case KVC_OPEN_CREATE:
        /* Capacities only matter when the segment is made: a valid one is
         * reused whatever they say. */
        if (check_options(opts) == KVC_OK)
            return open_create(seg, opts);
        if ((e = attach(seg)) != KVC_OK)
            e = check_options(opts); /* it had to be created: say why it cannot be */
        return e;
    case KVC_OPEN_FRESH:
    case KVC_OPEN_FRESH_FORCE:
        if ((e = check_options(opts)) || (e = check_not_live(seg->name)) ||
            (e = discard_old(seg, opts->mode == KVC_OPEN_FRESH_FORCE)))
            return e;
        shm_unlink(seg->name);
        e = create_new(seg, opts);
        if (e == KVC_E_EXISTS)
            e = kvc__fail(KVC_E_SYS, "segment %s was created by another process meanwhile",
                          seg->name);
        return e;
    }
    return kvc__fail(KVC_E_INVAL, "kvc_open: unknown mode %d", (int)opts->mode);
}

void kvc__segment_free(kvc_segment *seg)
{
    if (!seg)
        return;
    unmap(seg);
    free(seg);
}

kvc_err kvc__seg_current(kvc_segment *seg, uint32_t every_ms)
{
    if (atomic_load_explicit(&seg->hdr->discarded, memory_order_relaxed))
        return kvc__fail(
            KVC_E_STALE,
            "segment %s was discarded (kvcoordd --fresh or --force-fresh, or kvc_unlink): this "
            "handle is on a segment nobody serves; close it and open the segment again",
            seg->name);
    if (!atomic_load_explicit(&seg->stale, memory_order_relaxed)) {
        if (every_ms) {
            uint64_t now = kvc__mono_coarse_ns() / 1000000u,
                     last = atomic_load_explicit(&seg->file_checked_ms, memory_order_relaxed);
            if (now - last < every_ms ||
                !atomic_compare_exchange_strong(&seg->file_checked_ms, &last, now))
                return KVC_OK;
        }
        struct stat st;
        if (fstat(seg->fd, &st) != 0 || st.st_nlink != 0)
            return KVC_OK;
        atomic_store(&seg->stale, true); /* for good: every later call fails at once */
    }
    return kvc__fail(KVC_E_STALE,
                     "segment %s was removed from /dev/shm (unlinked, or replaced by another "
                     "file of that name): this handle is on a segment nobody serves; close "
                     "it and open the segment again",
                     seg->name);
}

KVC_API kvc_err kvc_segment_verify(kvc_segment *seg)
{
    KVC_ARG(seg);
    return kvc__seg_current(seg, 0);
}

/* Mark the segment under name discarded (it is about to be unlinked). */
static void mark_discarded(const char *name)
{
    int fd = shm_open(name, O_RDWR | O_CLOEXEC | O_NONBLOCK, 0);
    if (fd < 0)
        return;
    struct stat st;
    if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && (uint64_t)st.st_size >= sizeof(kvc_header)) {
        kvc_header *h = mmap(NULL, sizeof *h, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (h != MAP_FAILED) {
            if (atomic_load(&h->magic) == KVC_MAGIC && h->layout_version == KVC_LAYOUT_VERSION)
                atomic_store(&h->discarded, 1);
            munmap(h, sizeof *h);
        }
    }
    close(fd);
}

KVC_API kvc_err kvc_unlink(const char *name)
{
    kvc_err e = kvc_name_check(name);
    if (e)
        return e;
    mark_discarded(name);
    if (shm_unlink(name) < 0) {
        if (errno == ENOENT)
            return kvc__fail(KVC_E_NOENT, "no segment %s in /dev/shm", name);
        return kvc__fail(KVC_E_SYS, "shm_unlink(%s): %s", name, strerror(errno));
    }
    return KVC_OK;
}

KVC_API const char *kvc_segment_name(const kvc_segment *seg) { return seg ? seg->name : ""; }

KVC_API kvc_err kvc_segment_stat(kvc_segment *seg, kvc_segment_info *out)
{
    KVC_ARG(seg);
    KVC_ARG(out);
    const kvc_header *h = seg->hdr;
    memset(out, 0, sizeof *out);
    out->layout_version = h->layout_version;
    out->max_ranks = h->max_ranks;
    out->max_procs = h->max_procs;
    out->world_size = h->world_size;
    out->max_info_bytes = h->max_info_bytes;
    out->arena_bytes = h->arena_bytes;
    out->arena_used = atomic_load(&h->arena_used_blocks) * KVC_BLOCK;
    out->total_bytes = h->total_size;
    out->creator_pid = h->creator_pid;
    out->created_ns = h->created_ns;
    out->updated_ns = atomic_load(&h->updated_ns);
    for (int i = 0; i < KVC_LOCK_COUNT; i++)
        out->lock_recoveries += atomic_load(&kvc__lock_ptr(seg, i)->recoveries);
    out->ranks_registered = atomic_load(&h->ranks_registered);
    out->max_rooms = h->max_rooms;
    for (uint32_t s = 0; s < KVC_ROOM_STRIPES; s++) /* each read without its lock */
        out->rooms_live += __atomic_load_n(&seg->stripes[s].rooms_live, __ATOMIC_RELAXED);
    for (uint32_t s = 0; s < KVC_ROOM_STRIPES; s++)
        out->rooms_evicted += atomic_load_explicit(&seg->stripes[s].evicted, memory_order_relaxed);
    out->room_ttl_ms = h->room_ttl_ms;
    out->failures_total = atomic_load(&h->failures_total);
    return KVC_OK;
}
